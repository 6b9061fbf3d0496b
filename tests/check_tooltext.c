/* SPDX-License-Identifier: MIT */
/* check_tooltext.c - the text the LLM gets about cells, failures and
 * tests: golden cases under tests/data/tooltext/<case>/{input.json,expected}
 * and edge cases (1 MB line, many items over the total cap, multibyte text
 * at every cut point, random results). Set CQ_GOLDEN_UPDATE=1 to rewrite
 * the expected files (then review the diff).
 *
 * input.json: {"kind": "format"|"reflection"|"feedback", "opts": {field:
 * n}?, "result": {"status", "execution_count", "outputs", "duration_ms"?,
 * "truncated"?, "state_lost"?}, "code": "..."?, "function"?, "passed"?,
 * "total"?, "failures": [{"index", "call"?, "expected"?, "got"?,
 * "error"?}]?} */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/agent/tooltext.h"
#include "coderq/common/util.h"

static cq_cell_status_t status_from_name(const char *name)
{
        static const cq_cell_status_t all[] = {CQ_CELL_OK, CQ_CELL_ERROR,
                                               CQ_CELL_TIMEOUT, CQ_CELL_DIED,
                                               CQ_CELL_CANCELLED};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(all); i++)
                if (strcmp(cq_cell_status_name(all[i]), name) == 0)
                        return all[i];
        ck_abort_msg("unknown status %s", name);
        return CQ_CELL_OK;
}

static void result_from_json(const json_t *in, cq_cell_result_t *res)
{
        cq_cell_result_init(res);
        if (!in)
                return;
        res->status =
            status_from_name(json_string_value(json_object_get(in, "status")));
        res->execution_count =
            (int)json_integer_value(json_object_get(in, "execution_count"));
        res->outputs = json_deep_copy(json_object_get(in, "outputs"));
        res->duration_ms =
            json_integer_value(json_object_get(in, "duration_ms"));
        res->truncated = json_is_true(json_object_get(in, "truncated"));
        res->state_lost = json_is_true(json_object_get(in, "state_lost"));
}

static void opts_from_json(const json_t *in, cq_tooltext_opts_t *opts)
{
        static const struct {
                const char *name;
                size_t offset;
        } fields[] = {
            {"item_head", offsetof(cq_tooltext_opts_t, item_head)},
            {"item_tail", offsetof(cq_tooltext_opts_t, item_tail)},
            {"error_head", offsetof(cq_tooltext_opts_t, error_head)},
            {"error_tail", offsetof(cq_tooltext_opts_t, error_tail)},
            {"total_head", offsetof(cq_tooltext_opts_t, total_head)},
            {"total_tail", offsetof(cq_tooltext_opts_t, total_tail)},
            {"code_head", offsetof(cq_tooltext_opts_t, code_head)},
            {"code_tail", offsetof(cq_tooltext_opts_t, code_tail)},
            {"max_failures", offsetof(cq_tooltext_opts_t, max_failures)},
        };
        size_t i;

        cq_tooltext_opts_init(opts);
        for (i = 0; i < CQ_ARRAY_SIZE(fields); i++) {
                const json_t *v = json_object_get(in, fields[i].name);

                if (v)
                        *(size_t *)((char *)opts + fields[i].offset) =
                            (size_t)json_integer_value(v);
        }
}

static const char *opt_str(const json_t *obj, const char *key)
{
        return json_string_value(json_object_get(obj, key));
}

static char *run_case(const json_t *input, size_t *lenp)
{
        const char *kind = opt_str(input, "kind");
        cq_tooltext_opts_t opts;
        cq_cell_result_t res;
        char *text = NULL;

        opts_from_json(json_object_get(input, "opts"), &opts);
        result_from_json(json_object_get(input, "result"), &res);
        if (strcmp(kind, "format") == 0) {
                text = cq_tooltext_format(&res, &opts, lenp);
        } else if (strcmp(kind, "reflection") == 0) {
                text = cq_tooltext_reflection(&res, opt_str(input, "code"),
                                              &opts, lenp);
        } else if (strcmp(kind, "feedback") == 0) {
                const json_t *arr = json_object_get(input, "failures");
                cq_test_failure_t failures[16];
                size_t i, n = json_array_size(arr);

                ck_assert_uint_le(n, CQ_ARRAY_SIZE(failures));
                for (i = 0; i < n; i++) {
                        const json_t *f = json_array_get(arr, i);

                        failures[i].index = (size_t)json_integer_value(
                            json_object_get(f, "index"));
                        failures[i].call = opt_str(f, "call");
                        failures[i].expected = opt_str(f, "expected");
                        failures[i].got = opt_str(f, "got");
                        failures[i].error = opt_str(f, "error");
                }
                text = cq_tooltext_test_feedback(
                    opt_str(input, "function"),
                    (size_t)json_integer_value(
                        json_object_get(input, "passed")),
                    (size_t)json_integer_value(json_object_get(input, "total")),
                    failures, n, &opts, lenp);
        } else {
                ck_abort_msg("unknown kind %s", kind);
        }
        cq_cell_result_release(&res);
        ck_assert_ptr_nonnull(text);
        ck_assert(cq_utf8_valid(text, *lenp));
        ck_assert_uint_eq(strlen(text), *lenp);
        return text;
}

static int name_cmp(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(tooltext_golden_cases)
{
        char dirpath[4096];
        DIR *dir;
        struct dirent *de;
        char *names[128];
        size_t n = 0, i, failed = 0;
        bool update = getenv("CQ_GOLDEN_UPDATE") != NULL;

        snprintf(dirpath, sizeof(dirpath), "%s",
                 cq_check_srcpath("tests/data/tooltext"));
        dir = opendir(dirpath);
        ck_assert_msg(dir != NULL, "cannot open %s", dirpath);
        while ((de = readdir(dir)) != NULL) {
                if (de->d_name[0] == '.')
                        continue;
                ck_assert_uint_lt(n, CQ_ARRAY_SIZE(names));
                names[n] = strdup(de->d_name);
                ck_assert_ptr_nonnull(names[n]);
                n++;
        }
        closedir(dir);
        qsort(names, n, sizeof(names[0]), name_cmp);
        ck_assert_uint_ge(n, 18);
        for (i = 0; i < n; i++) {
                char path[4600];
                json_error_t jerr;
                json_t *input;
                char *got, *expected;
                size_t len, elen;

                snprintf(path, sizeof(path), "%s/%s/input.json", dirpath,
                         names[i]);
                input = json_load_file(path, JSON_ALLOW_NUL, &jerr);
                ck_assert_msg(input != NULL, "%s: %s", path, jerr.text);
                got = run_case(input, &len);
                snprintf(path, sizeof(path), "%s/%s/expected", dirpath,
                         names[i]);
                if (update) {
                        cq_check_spit(path, got, len);
                } else {
                        expected = cq_check_slurp(path, &elen);
                        if (elen != len || memcmp(expected, got, len) != 0) {
                                fprintf(stderr,
                                        "tooltext case %s:\n--- expected\n%s"
                                        "--- got\n%s",
                                        names[i], expected, got);
                                failed++;
                        }
                        free(expected);
                }
                free(got);
                json_decref(input);
                free(names[i]);
        }
        ck_assert_uint_eq(failed, 0);
}
END_TEST

static size_t count_substr(const char *s, const char *sub)
{
        size_t n = 0;

        while ((s = strstr(s, sub)) != NULL) {
                n++;
                s += strlen(sub);
        }
        return n;
}

START_TEST(tooltext_one_megabyte_line)
{
        size_t big = 1 << 20, len;
        char *line = malloc(big + 1);
        cq_cell_result_t res;
        cq_tooltext_opts_t opts;
        char *text, *marker;

        ck_assert_ptr_nonnull(line);
        memset(line, 'x', big);
        line[0] = 'A';
        line[big - 1] = 'Z';
        line[big] = '\0';
        cq_cell_result_init(&res);
        res.outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                                "name", "stdout", "text", line);
        ck_assert_ptr_nonnull(res.outputs);
        cq_tooltext_opts_init(&opts);
        text = cq_tooltext_format(&res, &opts, &len);
        ck_assert_ptr_nonnull(text);
        /* label + head + marker + tail, far below the total cap */
        ck_assert_uint_le(len, opts.item_head + opts.item_tail + 100);
        ck_assert_int_eq(strncmp(text, "[stdout]\nAxxx", 13), 0);
        ck_assert_int_eq(text[len - 2], 'Z');
        marker = strstr(text, "[... ");
        ck_assert_ptr_nonnull(marker);
        ck_assert_int_eq(
            strncmp(marker, "[... 1045576 characters omitted ...]", 36), 0);
        ck_assert_uint_eq(1045576, big - opts.item_head - opts.item_tail);
        free(text);
        cq_cell_result_release(&res);
        free(line);
}
END_TEST

START_TEST(tooltext_many_items_hit_total_cap)
{
        cq_cell_result_t res;
        cq_tooltext_opts_t opts;
        char *text;
        size_t i, len;

        cq_cell_result_init(&res);
        res.status = CQ_CELL_ERROR;
        res.outputs = json_array();
        for (i = 0; i < 5000; i++) {
                char line[64];

                snprintf(line, sizeof(line), "row %zu of the table\n", i);
                ck_assert_int_eq(
                    json_array_append_new(
                        res.outputs,
                        json_pack("{s:s, s:s, s:s}", "output_type", "stream",
                                  "name", i % 3 ? "stdout" : "stderr", "text",
                                  line)),
                    0);
        }
        ck_assert_int_eq(
            json_array_append_new(res.outputs,
                                  json_pack("{s:s, s:s, s:s, s:[s]}",
                                            "output_type", "error", "ename",
                                            "RuntimeError", "evalue", "boom",
                                            "traceback", "RuntimeError: boom")),
            0);
        cq_tooltext_opts_init(&opts);
        text = cq_tooltext_format(&res, &opts, &len);
        ck_assert_ptr_nonnull(text);
        ck_assert_uint_le(len, opts.total_head + opts.total_tail + 100);
        /* The head, the marker, and the error at the end all survive. */
        ck_assert_int_eq(strncmp(text, "[stderr]\nrow 0 of the table\n", 28),
                         0);
        ck_assert_uint_eq(
            count_substr(text, "characters omitted from the middle of this "
                               "cell's output ...]"),
            1);
        ck_assert_ptr_nonnull(strstr(text, "[error]\nRuntimeError: boom\n"));
        ck_assert_ptr_nonnull(strstr(text, "row 4999 of the table\n"));
        free(text);
        cq_cell_result_release(&res);
}
END_TEST

/* Multibyte text cut at every possible point: never split, always valid,
 * and the omitted count adds up. */
START_TEST(tooltext_multibyte_at_every_cut)
{
        /* 1-, 2-, 3- and 4-byte characters mixed. */
        static const char unit[] = "a\xc3\xa9\xe4\xbb\xb7\xf0\x9f\x98\x80";
        char text[sizeof(unit) * 8];
        size_t head, tail, i;

        text[0] = '\0';
        for (i = 0; i < 8; i++)
                memcpy(text + i * (sizeof(unit) - 1), unit, sizeof(unit));
        for (head = 0; head < 40; head++) {
                for (tail = 0; tail < 40; tail++) {
                        cq_cell_result_t res;
                        cq_tooltext_opts_t opts;
                        char *out, *marker;
                        size_t len, omitted = 0, kept;

                        cq_cell_result_init(&res);
                        res.outputs =
                            json_pack("[{s:s, s:s, s:s}]", "output_type",
                                      "stream", "name", "stdout", "text", text);
                        cq_tooltext_opts_init(&opts);
                        opts.item_head = head;
                        opts.item_tail = tail;
                        out = cq_tooltext_format(&res, &opts, &len);
                        ck_assert_ptr_nonnull(out);
                        ck_assert_msg(cq_utf8_valid(out, len),
                                      "head %zu tail %zu split a character",
                                      head, tail);
                        marker = strstr(out, "[... ");
                        if (head + tail >= strlen(text)) {
                                ck_assert_ptr_null(marker);
                        } else {
                                ck_assert_ptr_nonnull(marker);
                                ck_assert_int_eq(
                                    sscanf(marker, "[... %zu", &omitted), 1);
                                /* 32 characters in all: kept + omitted. */
                                kept = 0;
                                for (i = strlen("[stdout]\n"); out + i < marker;
                                     i++)
                                        kept += ((unsigned char)out[i] &
                                                 0xc0) != 0x80 &&
                                                out[i] != '\n';
                                for (i = (size_t)(strchr(marker, '\n') - out) +
                                         1;
                                     i < len; i++)
                                        kept += ((unsigned char)out[i] &
                                                 0xc0) != 0x80 &&
                                                out[i] != '\n';
                                ck_assert_uint_eq(kept + omitted, 32);
                        }
                        free(out);
                        cq_cell_result_release(&res);
                }
        }
}
END_TEST

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;

static uint64_t rng(void)
{
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dULL;
}

/* Random results of every shape: valid UTF-8 out, no NUL inside, and
 * bounded by the caps plus the fixed-size markers and notes. */
START_TEST(tooltext_random_results_stay_bounded)
{
        static const char *const pieces[] = {"x",
                                             "\n",
                                             "\r",
                                             "\x1b[31m",
                                             "\xe4\xbb\xb7",
                                             "<b>",
                                             "&amp;",
                                             "\xf0\x9f\x98\x80",
                                             "\t",
                                             "`"};
        static const char *const mimes[] = {
            "text/plain", "text/html",  "image/png",       "application/json",
            "image/jpeg", "text/latex", "application/pdf", "image/svg+xml"};
        static const char *const types[] = {"stream", "display_data",
                                            "execute_result", "error", "bogus"};
        size_t round;

        for (round = 0; round < 200; round++) {
                cq_cell_result_t res;
                cq_tooltext_opts_t opts;
                size_t nout = rng() % 12, i, len;
                char *text;

                cq_cell_result_init(&res);
                res.status = (cq_cell_status_t)(rng() % 5);
                res.truncated = rng() % 2;
                res.state_lost = rng() % 2;
                res.outputs = json_array();
                for (i = 0; i < nout; i++) {
                        cq_buf_t buf;
                        size_t k, n = rng() % 1500;
                        const char *type = types[rng() % 5];
                        json_t *s;

                        cq_buf_init(&buf, 1 << 20);
                        for (k = 0; k < n; k++)
                                ck_assert_int_eq(
                                    cq_buf_append_str(&buf, pieces[rng() % 10]),
                                    CQ_OK);
                        if (rng() % 4 == 0)
                                ck_assert_int_eq(cq_buf_append(&buf, "\0", 1),
                                                 CQ_OK);
                        s = json_stringn(buf.data ? buf.data : "", buf.len);
                        ck_assert_ptr_nonnull(s);
                        cq_buf_release(&buf);
                        if (strcmp(type, "stream") == 0)
                                json_array_append_new(
                                    res.outputs,
                                    json_pack("{s:s, s:s, s:o}", "output_type",
                                              type, "name",
                                              rng() % 2 ? "stdout" : "stderr",
                                              "text", s));
                        else if (strcmp(type, "error") == 0)
                                json_array_append_new(
                                    res.outputs,
                                    json_pack("{s:s, s:s, s:O, s:[o]}",
                                              "output_type", type, "ename", "E",
                                              "evalue", s, "traceback", s));
                        else
                                json_array_append_new(
                                    res.outputs,
                                    json_pack("{s:s, s:{s:o}, s:{}}",
                                              "output_type", type, "data",
                                              mimes[rng() % 8], s, "metadata"));
                }
                cq_tooltext_opts_init(&opts);
                opts.item_head = rng() % 500;
                opts.item_tail = rng() % 500;
                opts.error_head = rng() % 500;
                opts.error_tail = rng() % 500;
                opts.total_head = rng() % 2000;
                opts.total_tail = rng() % 2000;
                text = cq_tooltext_format(&res, &opts, &len);
                ck_assert_ptr_nonnull(text);
                ck_assert(cq_utf8_valid(text, len));
                ck_assert_uint_eq(strlen(text), len);
                /* total caps + its marker (< 100) + the notes (< 800) */
                ck_assert_uint_le(len, opts.total_head + opts.total_tail + 900);
                free(text);
                text = cq_tooltext_reflection(&res, "print(1)", &opts, &len);
                ck_assert_ptr_nonnull(text);
                ck_assert(cq_utf8_valid(text, len));
                free(text);
                cq_cell_result_release(&res);
        }
}
END_TEST

START_TEST(tooltext_defaults_and_constants)
{
        cq_cell_result_t res;
        char *a, *b;

        /* NULL opts means the defaults. */
        cq_cell_result_init(&res);
        res.outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                                "name", "stdout", "text", "hi\n");
        a = cq_tooltext_format(&res, NULL, NULL);
        ck_assert_str_eq(a, "[stdout]\nhi\n");
        free(a);
        cq_cell_result_release(&res);
        /* No outputs at all (NULL array) is a valid, empty result. */
        a = cq_tooltext_format(&res, NULL, NULL);
        ck_assert_str_eq(a, "[no output]\n");
        free(a);
        /* The placeholder the tool description quotes has the same
         * wording as the lines we produce. */
        ck_assert_ptr_nonnull(
            strstr(CQ_TOOLTEXT_IMAGE_ADVICE, CQ_TOOLTEXT_IMAGE_FORMAT));
        ck_assert_ptr_nonnull(strstr(CQ_TOOLTEXT_IMAGE_FORMAT,
                                     "; shown to the user, you cannot see "
                                     "it]"));
        /* Failures need not be itemised. */
        b = cq_tooltext_test_feedback("f", 2, 3, NULL, 0, NULL, NULL);
        ck_assert_str_eq(b, "Your final answer was checked against the job's "
                            "tests: 2 of 3 passed.\n\nFix `f` so that every "
                            "test passes: run the corrected definition with "
                            "execute_code, try it on the failing cases, then "
                            "give your final answer again.\n");
        free(b);
}
END_TEST

static Suite *cq_tooltext_suite(void)
{
        Suite *s = suite_create("tooltext");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, tooltext_golden_cases);
        tcase_add_test(tc, tooltext_one_megabyte_line);
        tcase_add_test(tc, tooltext_many_items_hit_total_cap);
        tcase_add_test(tc, tooltext_multibyte_at_every_cut);
        tcase_add_test(tc, tooltext_random_results_stay_bounded);
        tcase_add_test(tc, tooltext_defaults_and_constants);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_tooltext_suite)
