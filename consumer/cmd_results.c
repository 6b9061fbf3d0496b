/* SPDX-License-Identifier: MIT */
/* cmd_results.c - `coderq results`: the jobs of one run as an aligned
 * table with a summary line, a JSON array, or RFC 4180 CSV. Without
 * --run it shows the most recent run: the run of the newest job that has
 * a run_id. */
#include "coderq/cmd_cli.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/clifmt.h"

/* The store has no call for "the newest run", so this one read goes
 * straight to PostgreSQL. */
static const char SQL_LATEST_RUN[] =
    "SELECT run_id FROM jobs WHERE run_id IS NOT NULL"
    " ORDER BY created_at DESC, job_id DESC LIMIT 1";

/* Sets *runp (caller frees) to the newest run, or NULL when no job has a
 * run_id. Returns an exit code. */
static int latest_run(const cq_config_t *cfg, char **runp)
{
        PGconn *conn = NULL;
        PGresult *res = NULL;
        int rc = CQ_EXIT_UNAVAILABLE;

        *runp = NULL;
        conn = PQconnectdb(cfg->pg_dsn ? cfg->pg_dsn : "");
        if (PQstatus(conn) != CONNECTION_OK) {
                const char *msg = conn ? PQerrorMessage(conn) : "out of memory";

                cq_cli_error("could not connect to PostgreSQL: %.*s",
                             (int)strcspn(msg, "\n"), msg);
                goto out;
        }
        res = PQexecParams(conn, SQL_LATEST_RUN, 0, NULL, NULL, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                const char *msg = PQerrorMessage(conn);

                cq_cli_error("could not find the most recent run: %.*s",
                             (int)strcspn(msg, "\n"), msg);
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        rc = CQ_EXIT_OK;
        if (PQntuples(res) == 1) {
                *runp = strdup(PQgetvalue(res, 0, 0));
                if (!*runp) {
                        cq_cli_error("could not find the most recent run: "
                                     "out of memory");
                        rc = CQ_EXIT_INTERNAL;
                }
        }
out:
        PQclear(res);
        PQfinish(conn);
        return rc;
}

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

static double num(const json_t *row, const char *key)
{
        return json_number_value(json_object_get(row, key));
}

static cq_err_t render_summary(const json_t *sum, cq_buf_t *buf)
{
        const json_t *rate = json_object_get(sum, "pass_rate");
        const json_t *p50 = json_object_get(sum, "p50_duration_ms");
        const json_t *p95 = json_object_get(sum, "p95_duration_ms");
        char rate_s[32], p50_s[32], p95_s[32];

        if (json_is_number(rate))
                snprintf(rate_s, sizeof(rate_s), "%.1f%%",
                         json_number_value(rate) * 100.0);
        else
                snprintf(rate_s, sizeof(rate_s), "-");
        cq_fmt_duration(p50_s, sizeof(p50_s),
                        json_is_number(p50)
                            ? (long long)(json_number_value(p50) + 0.5)
                            : -1);
        cq_fmt_duration(p95_s, sizeof(p95_s),
                        json_is_number(p95)
                            ? (long long)(json_number_value(p95) + 0.5)
                            : -1);
        return cq_buf_printf(
            buf,
            "%.0f jobs: %.0f succeeded (%.0f from memory), %.0f failed, %.0f "
            "cancelled, %.0f pending; pass rate %s; mean %.2f turns, %.2f "
            "retries; %.0f tokens; duration p50 %s, p95 %s\n",
            num(sum, "jobs"), num(sum, "succeeded"), num(sum, "from_memory"),
            num(sum, "failed"), num(sum, "cancelled"), num(sum, "pending"),
            rate_s, num(sum, "mean_turns"), num(sum, "mean_retries"),
            num(sum, "prompt_tokens") + num(sum, "completion_tokens"), p50_s,
            p95_s);
}

static cq_err_t
render_table(const json_t *rows, const json_t *sum, cq_buf_t *buf)
{
        static const char *const headers[] = {
            "JOB",    "STATUS",   "TESTS",  "TURNS", "RETRIES",
            "TOKENS", "DURATION", "MEMORY", "TITLE", "REASON"};
        static const int align[] = {
            CQ_TABLE_LEFT,  CQ_TABLE_LEFT,  CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
            CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_LEFT,
            CQ_TABLE_LEFT,  CQ_TABLE_LEFT};
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
                char memory[200];
                const char *cells[10];

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
                /* "from JOB": finished with JOB's remembered solution, no
                 * LLM; "hint JOB": the model was given it as a hint. */
                if (json_is_true(json_object_get(row, "from_memory")))
                        snprintf(memory, sizeof(memory), "from %s",
                                 source ? source : "?");
                else if (source)
                        snprintf(memory, sizeof(memory), "hint %s", source);
                else
                        snprintf(memory, sizeof(memory), "-");
                cells[6] = dur_s;
                cells[7] = memory;
                cells[8] = json_string_value(json_object_get(row, "title"));
                cells[9] = json_string_value(json_object_get(row, "reason"));
                if (cq_table_add(table, cells))
                        goto out;
        }
        err = cq_table_render(table, buf);
        if (err == CQ_OK && sum)
                err = render_summary(sum, buf);
out:
        cq_table_destroy(&table);
        return err;
}

int cq_cmd_results(const cq_config_t *cfg, int argc, char **argv)
{
        const char *run = NULL, *format = "table";
        char *latest = NULL, *text = NULL;
        cq_store_t *store = NULL;
        json_t *rows = NULL, *sum = NULL;
        cq_buf_t buf;
        cq_err_t err;
        int rc = CQ_EXIT_USAGE, i, m;

        cq_buf_init(&buf, SIZE_MAX);
        for (i = 1; i < argc; i++) {
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
        if (strcmp(format, "table") != 0 && strcmp(format, "json") != 0 &&
            strcmp(format, "csv") != 0) {
                cq_cli_error("invalid value \"%s\" for --format: expected "
                             "table, json or csv",
                             format);
                goto out;
        }
        if (!run) {
                rc = latest_run(cfg, &latest);
                if (rc != CQ_EXIT_OK)
                        goto out;
                if (!latest) {
                        cq_cli_error("no runs yet: no job has a run_id");
                        rc = CQ_EXIT_NOT_FOUND;
                        goto out;
                }
                run = latest;
        }
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                goto out;
        err = cq_store_run_results(store, run, &rows);
        if (err == CQ_OK && strcmp(format, "table") == 0)
                err = cq_store_run_summary(store, run, &sum);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        if (json_array_size(rows) == 0) {
                cq_cli_error("no jobs in run \"%s\"", run);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        if (strcmp(format, "json") == 0) {
                text = json_dumps(rows, JSON_INDENT(2));
                err = text && cq_buf_append_str(&buf, text) == CQ_OK &&
                              cq_buf_append(&buf, "\n", 1) == CQ_OK
                          ? CQ_OK
                          : CQ_ERR_TOO_LARGE;
        } else if (strcmp(format, "csv") == 0) {
                err = render_csv(rows, &buf);
        } else {
                err = cq_buf_printf(&buf, "run %s\n", run);
                if (err == CQ_OK)
                        err = render_table(rows, sum, &buf);
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
        json_decref(sum);
        cq_store_destroy(&store);
        return rc;
}
