/* SPDX-License-Identifier: MIT */
/* check_summary.c - the figures of a run as `coderq results --summary`
 * prints them: golden files tests/data/summary/<case>/{input.json, table,
 * json, csv} for each format, the line under the results table, the
 * depth of the queues, and figures that lack what the renderer needs.
 * CQ_GOLDEN_UPDATE=1 rewrites the expected files (then review the diff). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/cli/summary.h"

static const struct {
        const char *file;
        cq_summary_format_t format;
} formats[] = {{"table", CQ_SUMMARY_TABLE},
               {"json", CQ_SUMMARY_JSON},
               {"csv", CQ_SUMMARY_CSV}};

START_TEST(summary_golden_cases)
{
        char dirpath[4096];
        char *names[64];
        size_t n = 0, i, k, failed = 0;

        snprintf(dirpath, sizeof(dirpath), "%s",
                 cq_check_srcpath("tests/data/summary"));
        n = cq_check_cases("tests/data/summary", names, CQ_ARRAY_SIZE(names));
        ck_assert_uint_ge(n, 3);
        for (i = 0; i < n; i++) {
                char path[4600];
                json_error_t jerr;
                json_t *figures;

                snprintf(path, sizeof(path), "%s/%s/input.json", dirpath,
                         names[i]);
                figures = json_load_file(path, 0, &jerr);
                ck_assert_msg(figures != NULL, "%s: %s", path, jerr.text);
                for (k = 0; k < CQ_ARRAY_SIZE(formats); k++) {
                        cq_buf_t buf;
                        char label[200];

                        cq_buf_init(&buf, 1 << 20);
                        ck_assert_int_eq(
                            cq_summary_render(figures, formats[k].format, &buf),
                            CQ_OK);
                        snprintf(path, sizeof(path), "%s/%s/%s", dirpath,
                                 names[i], formats[k].file);
                        snprintf(label, sizeof(label), "summary case %s, %s",
                                 names[i], formats[k].file);
                        failed +=
                            (size_t)cq_check_golden(path, buf.data, label);
                        cq_buf_release(&buf);
                }
                json_decref(figures);
                free(names[i]);
        }
        ck_assert_uint_eq(failed, 0);
}
END_TEST

/* The JSON output is the figures document itself. */
START_TEST(summary_json_is_the_document)
{
        json_t *figures = json_load_file(
            cq_check_srcpath("tests/data/summary/mixed_models/input.json"), 0,
            NULL);
        json_t *back;
        cq_buf_t buf;

        ck_assert_ptr_nonnull(figures);
        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_summary_render(figures, CQ_SUMMARY_JSON, &buf),
                         CQ_OK);
        back = json_loads(buf.data, 0, NULL);
        ck_assert_ptr_nonnull(back);
        ck_assert(json_equal(back, figures));
        json_decref(back);
        json_decref(figures);
        cq_buf_release(&buf);
}
END_TEST

START_TEST(summary_line_and_bad_input)
{
        json_t *total =
            json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, "
                      "s:i, s:f, s:i, s:f, s:f}",
                      "jobs", 3, "succeeded", 1, "from_memory", 1, "failed", 1,
                      "cancelled", 0, "pending", 1, "retried", 1, "pass_rate",
                      0.5, "mean_turns", 4.0, "mean_retries", 1.5,
                      "total_tokens", 450, "cost_usd", 0.0123, "cost_unknown",
                      1, "p50_duration_ms", 2000.0, "p95_duration_ms", 2400.0);
        json_t *empty = json_object();
        cq_summary_format_t f;
        cq_buf_t buf;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_summary_line(total, &buf), CQ_OK);
        ck_assert_str_eq(buf.data,
                         "3 jobs: 1 succeeded (1 from memory), 1 failed, 0 "
                         "cancelled, 1 pending; 1 retried; pass rate 50.0%; "
                         "mean 4.00 turns, 1.50 retries; 450 tokens; cost "
                         "$0.0123*; duration p50 2.0s, p95 2.4s\n");
        cq_buf_release(&buf);
        /* no "total": nothing to render */
        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_summary_render(empty, CQ_SUMMARY_TABLE, &buf),
                         CQ_ERR_FATAL);
        ck_assert_int_eq(cq_summary_render(NULL, CQ_SUMMARY_CSV, &buf),
                         CQ_ERR_FATAL);
        ck_assert_uint_eq(buf.len, 0);
        cq_buf_release(&buf);
        /* a cap too small for the table */
        cq_buf_init(&buf, 16);
        json_object_set_new(empty, "total", json_incref(total));
        json_object_set_new(empty, "run_id", json_string("r"));
        ck_assert_int_eq(cq_summary_render(empty, CQ_SUMMARY_TABLE, &buf),
                         CQ_ERR_TOO_LARGE);
        cq_buf_release(&buf);
        ck_assert_int_eq(cq_summary_format_parse("csv", &f), 0);
        ck_assert_int_eq(f, CQ_SUMMARY_CSV);
        ck_assert_int_eq(cq_summary_format_parse("table", &f), 0);
        ck_assert_int_eq(f, CQ_SUMMARY_TABLE);
        ck_assert_int_eq(cq_summary_format_parse("xml", &f), -1);
        json_decref(total);
        json_decref(empty);
}
END_TEST

/* The depth of the queues as `coderq status` prints it. */
START_TEST(summary_queues_table_or_none)
{
        json_t *queues = json_pack("[{s:s, s:i, s:i, s:i}, {s:s, s:i, s:i, "
                                   "s:i}]",
                                   "queue", "default", "queued", 12, "waiting",
                                   0, "running", 3, "queue", "a-long.queue_1",
                                   "queued", 0, "waiting", 1, "running", 0);
        json_t *none = json_array();
        cq_buf_t buf;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_summary_queues(queues, &buf), CQ_OK);
        ck_assert_str_eq(buf.data, "QUEUE           QUEUED  WAITING  RUNNING\n"
                                   "default             12        0        3\n"
                                   "a-long.queue_1       0        1        "
                                   "0\n");
        cq_buf_reset(&buf);
        ck_assert_int_eq(cq_summary_queues(none, &buf), CQ_OK);
        ck_assert_str_eq(buf.data, "no queue holds a queued or running job\n");
        cq_buf_release(&buf);
        /* a cap too small for the table */
        cq_buf_init(&buf, 16);
        ck_assert_int_eq(cq_summary_queues(queues, &buf), CQ_ERR_TOO_LARGE);
        cq_buf_release(&buf);
        json_decref(queues);
        json_decref(none);
}
END_TEST

static Suite *summary_suite(void)
{
        Suite *s = suite_create("summary");
        TCase *tc = tcase_create("summary");

        tcase_add_test(tc, summary_golden_cases);
        tcase_add_test(tc, summary_json_is_the_document);
        tcase_add_test(tc, summary_line_and_bad_input);
        tcase_add_test(tc, summary_queues_table_or_none);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(summary_suite)
