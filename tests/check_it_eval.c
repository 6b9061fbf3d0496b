/* SPDX-License-Identifier: MIT */
/* check_it_eval.c - evaluation runs against a real PostgreSQL (a fresh
 * database per test, migrated from migrations/) and Kafka: the figures of
 * a crafted run (two models and one unknown, memory, a retry, known and
 * unknown costs, durations pinned so p50/p95 are exact), which attempts
 * results and the summary show, what a retry picks and the ids it gives,
 * retries sent through the jobs topic and stored as the intake stores
 * them, run budget holds between two workers, the figures a finished
 * job records, and the SQL of the docs, which counts what the summary
 * counts. The CLI runs as the built coderq binary. */
#include <glob.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "support/kafka_test.h"
#include "support/pgtest.h"
#include "support/proc.h"
#include "coderq/common/job.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/queries.h"

static char g_dsn[2048];
static char g_dbname[64];
static char g_topic[160];

static void setup(void)
{
        cq_pgtest_create("cqeval", true, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
        kt_unique("cqt.eval", g_topic, sizeof(g_topic));
}

static void teardown(void) { cq_pgtest_drop(g_dbname); }

static cq_store_t *store_for(const char *owner)
{
        cq_store_opts_t opts;
        char errstr[512];
        cq_store_t *store;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = owner;
        opts.lease_s = 600;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        return store;
}

/* `coderq ARGS...` with this test's database and topic. */
static void run_cli(const char *const *args, cq_check_proc_t *proc)
{
        ck_assert_int_eq(cq_check_coderq_at(g_dsn, g_topic, args, 120000, proc),
                         0);
}

/* One crafted job: its row as a finished (or queued) job would have it,
 * created N seconds after a fixed time so the order is known, and its
 * result when it finished. */
typedef struct crafted {
        const char *id, *status, *spec_model, *model; /* model: recorded */
        const char *reason_code, *retry_of;
        int run_attempt;
        long duration_ms; /* < 0: never started */
        const char *cost; /* a number, or NULL: unknown */
        int turns, ptok, ctok;
        bool from_memory;
} crafted_t;

static void
exec_params(PGconn *conn, const char *sql, int n, const char *const *params)
{
        PGresult *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);

        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK, "%s: %s", sql,
                      PQerrorMessage(conn));
        PQclear(res);
}

static void craft(const char *run, int n, const crafted_t *c)
{
        static const char job_sql[] =
            "INSERT INTO jobs (job_id, prompt, run_id, spec, status,"
            " created_at, started_at, finished_at, reason, reason_code,"
            " retry_of, run_attempt, cost_usd, turns, prompt_tokens,"
            " completion_tokens, verdict)"
            " VALUES ($1, $2, $3, $4::jsonb, $5,"
            " '2025-03-01 10:00:00+00'::timestamptz"
            "  + make_interval(secs => $6::int),"
            " CASE WHEN $5 <> 'queued' AND $7::bigint >= 0"
            "  THEN '2025-03-01 11:00:00+00'::timestamptz END,"
            " CASE WHEN $5 <> 'queued' THEN '2025-03-01 11:00:00+00'"
            "  ::timestamptz + make_interval(secs => GREATEST($7::bigint, 0)"
            "  / 1000.0) END,"
            " CASE WHEN $8::text IS NOT NULL THEN 'some reason' END, $8, $9,"
            " $10::int, $11::numeric, $12::int, $13::int, $14::int,"
            /* the verdict coderq_finish() derives for such a finish */
            " CASE $5 WHEN 'succeeded' THEN 'passed' WHEN 'failed' THEN"
            "  CASE WHEN $8 = 'tests' THEN 'wrong_answer' ELSE 'no_answer'"
            "  END END)";
        static const char result_sql[] =
            "INSERT INTO results (job_id, status, report) VALUES ($1, $2,"
            " jsonb_build_object('from_memory', $3::boolean, 'repro',"
            "  jsonb_build_object('model', $4::text, 'provider', 'openai',"
            "  'temperature', 0.5, 'seed', 7, 'python', '3.11.2', 'packages',"
            "  jsonb_build_object('numpy', '1.24.2'))))";
        PGconn *conn = cq_pgtest_connect(g_dsn);
        char spec[256], prompt[32], num[16], dur[32], attempt[16], turns[16];
        char ptok[16], ctok[16];
        const char *p[14];

        snprintf(prompt, sizeof(prompt), "Problem %d", n);
        if (c->spec_model)
                snprintf(spec, sizeof(spec),
                         "{\"job_id\":\"%s\",\"prompt\":\"%s\",\"run_id\":"
                         "\"%s\",\"model\":\"%s\"}",
                         c->id, prompt, run, c->spec_model);
        else
                snprintf(spec, sizeof(spec),
                         "{\"job_id\":\"%s\",\"prompt\":\"%s\",\"run_id\":"
                         "\"%s\"}",
                         c->id, prompt, run);
        snprintf(num, sizeof(num), "%d", n);
        snprintf(dur, sizeof(dur), "%ld", c->duration_ms);
        snprintf(attempt, sizeof(attempt), "%d", c->run_attempt);
        snprintf(turns, sizeof(turns), "%d", c->turns);
        snprintf(ptok, sizeof(ptok), "%d", c->ptok);
        snprintf(ctok, sizeof(ctok), "%d", c->ctok);
        p[0] = c->id;
        p[1] = prompt;
        p[2] = run;
        p[3] = spec;
        p[4] = c->status;
        p[5] = num;
        p[6] = dur;
        p[7] = c->reason_code;
        p[8] = c->retry_of;
        p[9] = attempt;
        p[10] = c->cost;
        p[11] = turns;
        p[12] = ptok;
        p[13] = ctok;
        exec_params(conn, job_sql, 14, p);
        if (strcmp(c->status, "queued") != 0) {
                p[1] = c->status;
                p[2] = c->from_memory ? "true" : "false";
                p[3] = c->model;
                exec_params(conn, result_sql, 4, p);
        }
        PQfinish(conn);
}

/* Run r1: models m1 and m2 and a queued job naming none. j2 failed and
 * its retry j2~r2 succeeded; j3 recorded m1 although its message named
 * mX; its cost is unknown. */
static void make_run(void)
{
        static const crafted_t jobs[] = {
            {"j1", "succeeded", "m1", "m1", NULL, NULL, 1, 1000, "0.1", 2, 100,
             10, true},
            {"j2", "failed", "m1", "m1", "tests", NULL, 1, 2000, "0.2", 5, 200,
             20, false},
            {"j3", "failed", "mX", "m1", "max_turns", NULL, 1, 4000, NULL, 9,
             300, 30, false},
            {"k1", "succeeded", "m2", "m2", NULL, NULL, 1, 10000, "1", 3, 400,
             40, false},
            {"k2", "cancelled", "m2", "m2", "cancelled", NULL, 1, -1, "0", 0, 0,
             0, false},
            {"k3", "queued", "m2", NULL, NULL, NULL, 1, -1, "0", 0, 0, 0,
             false},
            {"j4", "queued", NULL, NULL, NULL, NULL, 1, -1, "0", 0, 0, 0,
             false},
            {"j2~r2", "succeeded", "m1", "m1", NULL, "j2", 2, 3000, "0.05", 1,
             50, 5, false},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(jobs); i++)
                craft("r1", (int)i + 1, &jobs[i]);
}

static const json_t *group(const json_t *figures, const char *model)
{
        const json_t *g;
        size_t i;

        json_array_foreach(json_object_get(figures, "models"), i, g)
        {
                const char *m = json_string_value(json_object_get(g, "model"));

                if ((!model && !m) || (model && m && strcmp(m, model) == 0))
                        return g;
        }
        ck_abort_msg("no group for model %s", model ? model : "(null)");
        return NULL;
}

static double fig(const json_t *g, const char *key)
{
        const json_t *v = json_object_get(g, key);

        ck_assert_msg(json_is_number(v), "%s is not a number", key);
        return json_number_value(v);
}

static long reason(const json_t *g, const char *code)
{
        return (long)json_integer_value(
            json_object_get(json_object_get(g, "reasons"), code));
}

START_TEST(summary_figures_of_a_crafted_run)
{
        cq_store_t *store = store_for("reader");
        json_t *doc;
        const json_t *m1, *m2, *none, *total;
        char *text;

        make_run();
        ck_assert_int_eq(cq_store_set_run_budget(store, "r1", 2), CQ_OK);
        ck_assert_int_eq(cq_store_run_figures(store, "r1", false, &doc), CQ_OK);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "attempts")),
                         "latest");
        ck_assert_double_eq_tol(fig(doc, "budget_usd"), 2, 1e-12);
        /* spent counts every attempt: j2's failed try too */
        ck_assert_double_eq_tol(fig(doc, "spent_usd"), 1.35, 1e-12);
        ck_assert_uint_eq(json_array_size(json_object_get(doc, "models")), 3);
        /* by model name, the unknown model last */
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(doc, "models"), 0), "model")),
            "m1");

        /* m1: j1 (from memory), j2~r2 (the latest of j2), j3 */
        m1 = group(doc, "m1");
        ck_assert_double_eq(fig(m1, "jobs"), 3);
        ck_assert_double_eq(fig(m1, "succeeded"), 2);
        ck_assert_double_eq(fig(m1, "failed"), 1);
        ck_assert_double_eq(fig(m1, "from_memory"), 1);
        ck_assert_double_eq(fig(m1, "retried"), 1);
        ck_assert_double_eq_tol(fig(m1, "pass_rate"), 0.6667, 1e-9);
        ck_assert_double_eq(fig(m1, "turns"), 12);
        ck_assert_double_eq_tol(fig(m1, "mean_turns"), 4, 1e-9);
        ck_assert_double_eq(fig(m1, "total_tokens"), 495);
        ck_assert_double_eq_tol(fig(m1, "cost_usd"), 0.15, 1e-12);
        ck_assert_double_eq(fig(m1, "cost_unknown"), 1);
        /* 1000, 3000, 4000 ms: p95 at 1.9 of the way */
        ck_assert_double_eq(fig(m1, "p50_duration_ms"), 3000);
        ck_assert_double_eq(fig(m1, "p95_duration_ms"), 3900);
        ck_assert_double_eq(fig(m1, "max_duration_ms"), 4000);
        ck_assert_int_eq(reason(m1, "max_turns"), 1);
        ck_assert_int_eq(reason(m1, "tests"), 0);
        ck_assert_uint_eq(json_object_size(json_object_get(m1, "reasons")), 1);

        /* m2: one of each; the cancelled one never started */
        m2 = group(doc, "m2");
        ck_assert_double_eq(fig(m2, "jobs"), 3);
        ck_assert_double_eq(fig(m2, "succeeded"), 1);
        ck_assert_double_eq(fig(m2, "cancelled"), 1);
        ck_assert_double_eq(fig(m2, "queued"), 1);
        ck_assert_double_eq(fig(m2, "pending"), 1);
        ck_assert_double_eq_tol(fig(m2, "pass_rate"), 1, 1e-9);
        ck_assert_double_eq(fig(m2, "p50_duration_ms"), 10000);
        ck_assert_double_eq(fig(m2, "max_duration_ms"), 10000);
        ck_assert_int_eq(reason(m2, "cancelled"), 1);

        none = group(doc, NULL);
        ck_assert_double_eq(fig(none, "jobs"), 1);
        ck_assert_double_eq(fig(none, "queued"), 1);
        ck_assert(json_is_null(json_object_get(none, "pass_rate")));
        ck_assert(json_is_null(json_object_get(none, "p50_duration_ms")));

        total = json_object_get(doc, "total");
        ck_assert_ptr_null(json_object_get(total, "is_total"));
        ck_assert_double_eq(fig(total, "jobs"), 7);
        ck_assert_double_eq(fig(total, "succeeded"), 3);
        ck_assert_double_eq(fig(total, "pending"), 2);
        ck_assert_double_eq_tol(fig(total, "pass_rate"), 0.75, 1e-9);
        ck_assert_double_eq_tol(fig(total, "cost_usd"), 1.15, 1e-12);
        /* 1000, 3000, 4000, 10000 ms */
        ck_assert_double_eq(fig(total, "p50_duration_ms"), 3500);
        ck_assert_double_eq(fig(total, "p95_duration_ms"), 9100);
        ck_assert_int_eq(reason(total, "cancelled"), 1);
        ck_assert_int_eq(reason(total, "max_turns"), 1);
        json_decref(doc);

        /* every attempt: j2's failure counts, and its reason */
        ck_assert_int_eq(cq_store_run_figures(store, "r1", true, &doc), CQ_OK);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "attempts")),
                         "all");
        m1 = group(doc, "m1");
        ck_assert_double_eq(fig(m1, "jobs"), 4);
        ck_assert_double_eq(fig(m1, "failed"), 2);
        ck_assert_int_eq(reason(m1, "tests"), 1);
        ck_assert_double_eq_tol(fig(m1, "cost_usd"), 0.35, 1e-12);
        total = json_object_get(doc, "total");
        ck_assert_double_eq(fig(total, "jobs"), 8);
        ck_assert_double_eq(fig(total, "p50_duration_ms"), 3000);
        ck_assert_double_eq(fig(total, "p95_duration_ms"), 8800);
        json_decref(doc);

        /* the views for SQL users agree */
        text = kt_pg_text(g_dsn,
                          "SELECT concat_ws('|', jobs, succeeded, retried, "
                          "pass_rate, cost_usd, cost_unknown, p95_duration_ms, "
                          "reasons::text, budget_usd) FROM run_summary "
                          "WHERE run_id = $1",
                          "r1");
        ck_assert_str_eq(text, "7|3|1|0.7500|1.15|1|9100.0|{\"cancelled\": 1, "
                               "\"max_turns\": 1}|2");
        free(text);
        ck_assert_int_eq(kt_pg_long(g_dsn,
                                    "SELECT count(*) FROM run_model_summary "
                                    "WHERE run_id = $1",
                                    "r1"),
                         3);
        /* no such run: a total of nothing */
        ck_assert_int_eq(cq_store_run_figures(store, "nope", false, &doc),
                         CQ_OK);
        ck_assert_double_eq(fig(json_object_get(doc, "total"), "jobs"), 0);
        ck_assert_uint_eq(json_array_size(json_object_get(doc, "models")), 0);
        json_decref(doc);
        cq_store_destroy(&store);
}
END_TEST

static const char *row_id(const json_t *rows, size_t i)
{
        return json_string_value(
            json_object_get(json_array_get(rows, i), "job_id"));
}

/* results: the latest attempt of each original, in the originals' order;
 * every attempt on request, each retry after its original. */
START_TEST(results_show_the_latest_attempt)
{
        static const char *const latest_ids[] = {"j1", "j2~r2", "j3", "k1",
                                                 "k2", "k3",    "j4"};
        static const char *const all_ids[] = {"j1", "j2", "j2~r2", "j3",
                                              "k1", "k2", "k3",    "j4"};
        static const char *const first_keys[] = {
            "job_id",       "title",       "status",       "reason",
            "reason_code",  "attempts",    "turns",        "retries",
            "tests_passed", "tests_total", "prompt_tokens"};
        cq_store_t *store = store_for("reader");
        cq_check_proc_t proc;
        const char *csv_args[] = {"results",  "--run", "r1", "--summary",
                                  "--format", "csv",   NULL};
        const char *table_args[] = {"results", "--run", "r1", "--summary",
                                    NULL};
        const char *none_args[] = {"results", "--run", "nope", "--summary",
                                   NULL};
        json_t *rows;
        const json_t *row;
        const char *key;
        json_t *value;
        size_t i;

        make_run();
        ck_assert_int_eq(cq_store_run_results(store, "r1", &rows), CQ_OK);
        ck_assert_uint_eq(json_array_size(rows), CQ_ARRAY_SIZE(latest_ids));
        for (i = 0; i < CQ_ARRAY_SIZE(latest_ids); i++) {
                ck_assert_str_eq(row_id(rows, i), latest_ids[i]);
                ck_assert(json_is_true(
                    json_object_get(json_array_get(rows, i), "latest")));
        }
        /* the documented keys, in order, the figures of each attempt */
        row = json_array_get(rows, 1);
        i = 0;
        json_object_foreach((json_t *)(uintptr_t)row, key, value)
        {
                (void)value;
                if (i < CQ_ARRAY_SIZE(first_keys))
                        ck_assert_str_eq(key, first_keys[i]);
                i++;
        }
        ck_assert_uint_eq(i, 37);
        ck_assert_str_eq(json_string_value(json_object_get(row, "retry_of")),
                         "j2");
        ck_assert_int_eq(
            json_integer_value(json_object_get(row, "run_attempt")), 2);
        ck_assert_str_eq(json_string_value(json_object_get(row, "model")),
                         "m1");
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(row, "cost_usd")), 0.05, 1e-12);
        ck_assert_int_eq(
            json_integer_value(json_object_get(row, "duration_ms")), 3000);
        ck_assert_double_eq(
            json_real_value(json_object_get(row, "temperature")), 0.5);
        ck_assert_int_eq(json_integer_value(json_object_get(row, "seed")), 7);
        ck_assert_str_eq(json_string_value(json_object_get(row, "python")),
                         "3.11.2");
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(row, "packages"), "numpy")),
                         "1.24.2");
        /* an unknown cost is null, never 0 */
        ck_assert(
            json_is_null(json_object_get(json_array_get(rows, 2), "cost_usd")));
        /* a queued job: its message's model, nothing recorded yet */
        row = json_array_get(rows, 5);
        ck_assert_str_eq(json_string_value(json_object_get(row, "model")),
                         "m2");
        ck_assert(json_is_null(json_object_get(row, "python")));
        json_decref(rows);

        ck_assert_int_eq(cq_store_run_attempts(store, "r1", &rows), CQ_OK);
        ck_assert_uint_eq(json_array_size(rows), CQ_ARRAY_SIZE(all_ids));
        for (i = 0; i < CQ_ARRAY_SIZE(all_ids); i++)
                ck_assert_str_eq(row_id(rows, i), all_ids[i]);
        ck_assert(
            json_is_false(json_object_get(json_array_get(rows, 1), "latest")));
        ck_assert(
            json_is_true(json_object_get(json_array_get(rows, 2), "latest")));
        json_decref(rows);

        /* the command: CSV has a line per model and the total */
        run_cli(csv_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(
            strncmp(proc.out, "run_id,attempts,group,model,jobs,", 33) == 0,
            "%s", proc.out);
        /* then the depth of its jobs' queue, the same on every line */
        ck_assert_msg(strstr(proc.out, ",reason_cancelled,reason_max_turns,"
                                       "queue_default_queued,"
                                       "queue_default_waiting,"
                                       "queue_default_running\r\n"
                                       "r1,latest,model,m1,3,2,1,0,0,0,0,"),
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, "\r\nr1,latest,total,,7,3,1,1,2,0,2,"),
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, ",1,1,1,2,0,0\r\n"), "%s", proc.out);
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 5);
        cq_check_proc_release(&proc);
        run_cli(table_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(strstr(proc.out, "run r1: the latest attempt of each "
                                       "original job (7 original jobs)\n"),
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, "\nTOTAL ") &&
                          strstr(proc.out, "$1.1500*") &&
                          strstr(proc.out, "failed and cancelled jobs by "
                                           "reason:\n"),
                      "%s", proc.out);
        cq_check_proc_release(&proc);
        run_cli(none_args, &proc);
        ck_assert_int_eq(proc.status, 5);
        ck_assert_str_eq(proc.err, "coderq: no jobs in run \"nope\"\n");
        cq_check_proc_release(&proc);
        cq_store_destroy(&store);
}
END_TEST

static json_t *
select_retry(cq_store_t *store, bool failed, const char *pattern, bool all)
{
        cq_retry_filter_t f = {failed, pattern, all};
        bool bad = true;
        json_t *rows = NULL;

        ck_assert_msg(cq_store_retry_select(store, "r1", &f, &rows, &bad) ==
                          CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(!bad);
        return rows;
}

/* The ids of \p rows as "a b c". */
static char *ids_of(const json_t *rows)
{
        static char out[512];
        size_t i, len = 0;

        out[0] = '\0';
        for (i = 0; i < json_array_size(rows); i++)
                len += (size_t)snprintf(out + len, sizeof(out) - len, "%s%s",
                                        i ? " " : "", row_id(rows, i));
        return out;
}

START_TEST(retry_picks_latest_finished_attempts)
{
        cq_store_t *store = store_for("reader");
        cq_retry_filter_t bad_filter = {false, "(", false};
        cq_check_proc_t proc;
        const char *dry[] = {"retry",    "--run",     "r1",
                             "--failed", "--dry-run", NULL};
        const char *all[] = {"retry", "--run",     "r1",
                             "--all", "--dry-run", NULL};
        const char *badre[] = {"retry", "--run", "r1", "--reason", "(", NULL};
        const char *nofilter[] = {"retry", "--run", "r1", NULL};
        const char *norun[] = {"retry", "--run", "nope", "--failed", NULL};
        json_t *rows;
        bool bad = false;

        make_run();
        /* j2 failed, but its latest attempt succeeded */
        rows = select_retry(store, true, NULL, false);
        ck_assert_str_eq(ids_of(rows), "j3");
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(rows, 0), "root_job_id")),
                         "j3");
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(json_array_get(rows, 0), "spec"), "model")),
            "mX");
        json_decref(rows);
        /* a POSIX regular expression on the reason code or the reason */
        rows = select_retry(store, false, "^max_turns$", false);
        ck_assert_str_eq(ids_of(rows), "j3");
        json_decref(rows);
        rows = select_retry(store, false, "cancel|turns", false);
        ck_assert_str_eq(ids_of(rows), "j3 k2");
        json_decref(rows);
        rows = select_retry(store, false, "^some reason$", false);
        ck_assert_str_eq(ids_of(rows), "j3 k2");
        json_decref(rows);
        rows = select_retry(store, false, "tests", false);
        ck_assert_str_eq(ids_of(rows), "");
        json_decref(rows);
        rows = select_retry(store, true, "cancel", false);
        ck_assert_str_eq(ids_of(rows), "");
        json_decref(rows);
        /* every finished one; queued ones are never taken again */
        rows = select_retry(store, false, NULL, true);
        ck_assert_str_eq(ids_of(rows), "j1 j2~r2 j3 k1 k2");
        json_decref(rows);
        /* no condition: nothing */
        rows = select_retry(store, false, NULL, false);
        ck_assert_str_eq(ids_of(rows), "");
        json_decref(rows);
        ck_assert_int_eq(
            cq_store_retry_select(store, "r1", &bad_filter, &rows, &bad),
            CQ_ERR_FATAL);
        ck_assert(bad);
        ck_assert_ptr_null(rows);
        ck_assert_msg(strstr(cq_store_errmsg(store), "regular expression"),
                      "%s", cq_store_errmsg(store));

        /* the ids: ORIGINAL~rN, a retry of a retry names the original */
        run_cli(dry, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(proc.out, "j3~r2 retries j3 (failed)\n");
        cq_check_proc_release(&proc);
        run_cli(all, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(proc.out, "j1~r2 retries j1 (succeeded)\n"
                                   "j2~r3 retries j2~r2 (succeeded)\n"
                                   "j3~r2 retries j3 (failed)\n"
                                   "k1~r2 retries k1 (succeeded)\n"
                                   "k2~r2 retries k2 (cancelled)\n");
        cq_check_proc_release(&proc);
        run_cli(badre, &proc);
        ck_assert_int_eq(proc.status, 2);
        ck_assert_msg(strstr(proc.err, "regular expression"), "%s", proc.err);
        cq_check_proc_release(&proc);
        run_cli(nofilter, &proc);
        ck_assert_int_eq(proc.status, 2);
        cq_check_proc_release(&proc);
        run_cli(norun, &proc);
        ck_assert_int_eq(proc.status, 5);
        cq_check_proc_release(&proc);
        /* an id taken by another job is refused, nothing is sent */
        kt_pg_exec(g_dsn,
                   "INSERT INTO jobs (job_id, prompt, run_id, spec) VALUES "
                   "('j3~r2', 'p', 'other', '{}')",
                   NULL);
        dry[4] = NULL;
        run_cli(dry, &proc);
        ck_assert_int_eq(proc.status, 1);
        ck_assert_msg(strstr(proc.err, "job \"j3~r2\" exists already"), "%s",
                      proc.err);
        ck_assert_str_eq(proc.out, "");
        cq_check_proc_release(&proc);
        cq_store_destroy(&store);
}
END_TEST

/* Retries go through the jobs topic like any job; sent twice before the
 * intake stores them, they are one job. */
START_TEST(retry_sends_linked_jobs_through_kafka)
{
        const char *args[] = {"retry",    "--run",  "r1",
                              "--reason", "cancel", NULL};
        cq_store_t *store = store_for("intake");
        cq_check_proc_t proc;
        kt_msg_t *msgs = NULL;
        json_t *rows;
        size_t n, i;
        int created = 0;

        make_run();
        kt_create_topic(cq_check_env("CODERQ_KAFKA_BROKERS"), g_topic, 1);
        for (i = 0; i < 2; i++) {
                run_cli(args, &proc);
                ck_assert_msg(proc.status == 0, "%s", proc.err);
                ck_assert_str_eq(proc.out, "k2~r2\n");
                cq_check_proc_release(&proc);
        }
        n = kt_consume(cq_check_env("CODERQ_KAFKA_BROKERS"), g_topic, 1, 2,
                       30000, &msgs);
        ck_assert_uint_eq(n, 2);
        for (i = 0; i < n; i++) {
                cq_job_t job;
                char errstr[256] = "";
                bool made = false;

                ck_assert_str_eq(msgs[i].key, "k2~r2");
                cq_job_init(&job);
                ck_assert_msg(cq_job_parse(msgs[i].value, msgs[i].len, 0, &job,
                                           errstr, sizeof(errstr)) == CQ_OK,
                              "%s", errstr);
                ck_assert_str_eq(job.retry_of, "k2");
                ck_assert_int_eq(job.run_attempt, 2);
                ck_assert_str_eq(job.run_id, "r1");
                ck_assert_str_eq(job.model, "m2");
                ck_assert_str_eq(job.prompt, "Problem 5");
                ck_assert_int_eq(cq_store_upsert_job(store, &job, NULL, &made),
                                 CQ_OK);
                created += made;
                cq_job_release(&job);
        }
        kt_msgs_free(msgs, n);
        ck_assert_int_eq(created, 1);
        ck_assert_int_eq(kt_pg_long(g_dsn,
                                    "SELECT count(*) FROM jobs WHERE "
                                    "retry_of = 'k2' AND run_attempt = 2 AND "
                                    "status = 'queued'",
                                    NULL),
                         1);
        /* the queued retry is the latest attempt now: shown, not taken
         * again */
        ck_assert_int_eq(cq_store_run_results(store, "r1", &rows), CQ_OK);
        ck_assert_str_eq(row_id(rows, 4), "k2~r2");
        json_decref(rows);
        run_cli(args, &proc);
        ck_assert_int_eq(proc.status, 0);
        ck_assert_str_eq(proc.out, "");
        ck_assert_msg(strstr(proc.err, "nothing to retry"), "%s", proc.err);
        cq_check_proc_release(&proc);
        cq_store_destroy(&store);
}
END_TEST

/* Claim job \p id for \p store's owner (the only queued job). */
static void claim(cq_store_t *store, const char *id)
{
        cq_claim_t c;
        bool found = false;

        cq_claim_init(&c);
        ck_assert_msg(cq_store_claim(store, &c, &found) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        ck_assert(found);
        ck_assert_str_eq(c.job_id, id);
        cq_claim_release(&c);
}

static void add_job(cq_store_t *store, const char *id, const char *run)
{
        char text[256], errstr[256] = "";
        cq_job_t job;

        snprintf(text, sizeof(text),
                 "{\"job_id\":\"%s\",\"prompt\":\"p\",\"run_id\":\"%s\"}", id,
                 run);
        cq_job_init(&job);
        ck_assert_msg(cq_job_parse(text, strlen(text), 0, &job, errstr,
                                   sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
        ck_assert_int_eq(cq_store_upsert_job(store, &job, NULL, NULL), CQ_OK);
        cq_job_release(&job);
}

static cq_budget_outcome_t
reserve(cq_store_t *store, const char *id, double usd, cq_budget_t *b)
{
        ck_assert_msg(cq_store_budget_reserve(store, id, usd, b) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        return b->outcome;
}

/* Two workers' jobs of one run hold their calls' estimates against its
 * budget: the second cannot take what the first holds, recorded usage
 * replaces the hold, and a job that leaves running holds nothing. */
START_TEST(run_budget_holds_between_workers)
{
        cq_store_t *w1 = store_for("w1"), *w2 = store_for("w2");
        cq_usage_t usage = {1000, 100, 0, 0};
        cq_check_proc_t proc;
        const char *show[] = {"budget", "--run", "rb", NULL};
        const char *clear[] = {"budget",  "--run",  "rb",
                               "--clear", "--json", NULL};
        const char *bad[] = {"budget", "--run", "rb", "--usd", "-1", NULL};
        cq_budget_t b;
        bool lost = true;
        char *text;

        add_job(w1, "a", "rb");
        add_job(w1, "b", "rb");
        add_job(w1, "c", "free");
        claim(w1, "a");
        claim(w2, "b");
        /* no budget yet: nothing held */
        ck_assert_int_eq(reserve(w1, "a", 0.6, &b), CQ_BUDGET_NONE);
        ck_assert_int_eq(cq_store_set_run_budget(w1, "rb", 1.0), CQ_OK);
        ck_assert_int_eq(reserve(w1, "a", 0.6, &b), CQ_BUDGET_HELD);
        ck_assert_int_eq(reserve(w2, "b", 0.6, &b), CQ_BUDGET_OVER);
        ck_assert_double_eq_tol(b.budget_usd, 1, 1e-12);
        ck_assert_double_eq_tol(b.held_usd, 0.6, 1e-12);
        ck_assert_double_eq_tol(b.spent_usd, 0, 1e-12);
        /* a's call cost 0.5: its hold is gone, its cost spent */
        ck_assert_int_eq(cq_store_record_usage(w1, "a", &usage, 0.5, &lost),
                         CQ_OK);
        ck_assert(!lost);
        ck_assert_int_eq(reserve(w2, "b", 0.4, &b), CQ_BUDGET_HELD);
        ck_assert_double_eq_tol(b.spent_usd, 0.5, 1e-12);
        /* a job's new hold replaces its own old one */
        ck_assert_int_eq(reserve(w2, "b", 0.5, &b), CQ_BUDGET_HELD);
        ck_assert_int_eq(reserve(w2, "b", 0.51, &b), CQ_BUDGET_OVER);
        ck_assert_int_eq(reserve(w1, "a", 0.01, &b), CQ_BUDGET_OVER);
        /* an unknown estimate is refused; so is another owner's job */
        ck_assert_int_eq(reserve(w1, "a", -1, &b), CQ_BUDGET_UNKNOWN);
        ck_assert_int_eq(reserve(w1, "b", 0.01, &b), CQ_BUDGET_LOST);
        ck_assert_int_eq(cq_store_record_usage(w1, "b", &usage, 0.1, &lost),
                         CQ_OK);
        ck_assert(lost);
        /* b is given back to the queue: its hold goes with it */
        ck_assert_int_eq(cq_store_release(w2, "b"), CQ_OK);
        ck_assert_int_eq(kt_pg_long(g_dsn,
                                    "SELECT (budget_hold_usd * 100)::int "
                                    "FROM jobs WHERE job_id = $1",
                                    "b"),
                         0);
        ck_assert_int_eq(reserve(w1, "a", 0.5, &b), CQ_BUDGET_HELD);
        /* a cost that became unknown stops the run's spending */
        ck_assert_int_eq(cq_store_record_usage(w1, "a", &usage, -1, &lost),
                         CQ_OK);
        ck_assert_int_eq(reserve(w1, "a", 0.01, &b), CQ_BUDGET_UNKNOWN);

        run_cli(show, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(proc.out, "run:          rb\n"
                                   "budget_usd:   1.000000\n"
                                   "spent_usd:    0.000000\n"
                                   "held_usd:     0.000000\n"
                                   "left_usd:     1.000000\n"
                                   "cost_unknown: 1\n"
                                   "jobs:         2\n");
        cq_check_proc_release(&proc);
        run_cli(clear, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(strstr(proc.out, "\"budget_usd\": null"), "%s", proc.out);
        cq_check_proc_release(&proc);
        ck_assert_int_eq(reserve(w1, "a", 5, &b), CQ_BUDGET_NONE);
        run_cli(bad, &proc);
        ck_assert_int_eq(proc.status, 2);
        cq_check_proc_release(&proc);
        show[2] = "nope";
        run_cli(show, &proc);
        ck_assert_int_eq(proc.status, 5);
        cq_check_proc_release(&proc);
        text = kt_pg_text(
            g_dsn, "SELECT budget_usd FROM runs WHERE run_id = $1", "rb");
        ck_assert_ptr_null(text);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
}
END_TEST

/* What finishing records: the reason code ("other" when none is given,
 * none for a success), cached tokens and the cost (NULL when unknown),
 * in the job, its completion event and job_overview; the signature of
 * 0001 still finishes a job (workers not yet upgraded). */
START_TEST(finish_records_reason_code_and_cost)
{
        cq_store_t *store = store_for("w1");
        cq_finish_t fin;
        bool lost = true;
        char *text;
        json_t *event;

        add_job(store, "f1", "rf");
        add_job(store, "f2", "rf");
        add_job(store, "f3", "rf");
        claim(store, "f1");
        memset(&fin, 0, sizeof(fin));
        fin.job_id = "f1";
        fin.status = "failed";
        fin.reason = "boom";
        fin.tests_passed = -1;
        fin.prompt_tokens = 100;
        fin.completion_tokens = 10;
        fin.cache_read_tokens = 40;
        fin.cost_usd = -1;
        ck_assert_int_eq(cq_store_finish(store, &fin, &lost), CQ_OK);
        ck_assert(!lost);
        text = kt_pg_text(g_dsn,
                          "SELECT concat_ws('|', reason_code, "
                          "coalesce(cost_usd::text, 'null'), "
                          "cache_read_tokens) FROM job_overview WHERE job_id "
                          "= $1",
                          "f1");
        ck_assert_str_eq(text, "other|null|40");
        free(text);
        text = kt_pg_text(g_dsn,
                          "SELECT payload::text FROM outbox WHERE "
                          "job_id = $1",
                          "f1");
        event = json_loads(text, 0, NULL);
        free(text);
        ck_assert_str_eq(
            json_string_value(json_object_get(event, "reason_code")), "other");
        ck_assert(json_is_null(json_object_get(event, "cost_usd")));
        ck_assert(json_is_null(json_object_get(event, "retry_of")));
        ck_assert_int_eq(
            json_integer_value(json_object_get(event, "run_attempt")), 1);
        ck_assert_int_eq(
            json_integer_value(json_object_get(json_object_get(event, "usage"),
                                               "cache_read_tokens")),
            40);
        json_decref(event);

        claim(store, "f2");
        fin.job_id = "f2";
        fin.status = "succeeded";
        fin.reason = NULL;
        fin.reason_code = "budget"; /* ignored: it succeeded */
        fin.cost_usd = 0.25;
        ck_assert_int_eq(cq_store_finish(store, &fin, &lost), CQ_OK);
        text = kt_pg_text(g_dsn,
                          "SELECT concat_ws('|', coalesce(reason_code, '-'), "
                          "cost_usd) FROM jobs WHERE job_id = $1",
                          "f2");
        ck_assert_str_eq(text, "-|0.25");
        free(text);

        claim(store, "f3");
        kt_pg_exec(g_dsn,
                   "SELECT coderq_finish('f3', 'w1', 'failed', 'old', 1, 0, "
                   "5, 5, NULL, NULL, NULL, NULL, NULL, 0, 'coderq.results')",
                   NULL);
        text = kt_pg_text(g_dsn,
                          "SELECT concat_ws('|', status, reason_code, "
                          "coalesce(cost_usd::text, 'null')) FROM jobs WHERE "
                          "job_id = $1",
                          "f3");
        ck_assert_str_eq(text, "failed|other|null");
        free(text);
        cq_store_destroy(&store);
}
END_TEST

/* Run eval-1, as the queries of the docs name it: problem p1 has three
 * samples (e1 failed, then passed on its retry; e2 failed twice; e3
 * passed), e4 lost its LLM (infra_error, left out of every score), e5
 * failed three times, e6 was cancelled and e7 waits. The summary counts
 * 7 jobs, 2 succeeded and 3 failed; 7 attempts failed. */
static void make_docs_run(void)
{
        static const crafted_t jobs[] = {
            {"e1", "failed", "m1", "m1", "tests", NULL, 1, 1000, "0.1", 2, 100,
             10, false},
            {"e2", "failed", "m1", "m1", "tests", NULL, 1, 2000, "0.1", 2, 100,
             10, false},
            {"e3", "succeeded", "m1", "m1", NULL, NULL, 1, 3000, "0.1", 1, 100,
             10, false},
            {"e4", "failed", "m2", "m2", "llm", NULL, 1, 500, NULL, 0, 0, 0,
             false},
            {"e5", "failed", "m2", "m2", "max_turns", NULL, 1, 4000, "0.2", 9,
             300, 30, false},
            {"e6", "cancelled", "m2", "m2", "cancelled", NULL, 1, -1, "0", 0, 0,
             0, false},
            {"e7", "queued", "m1", NULL, NULL, NULL, 1, -1, "0", 0, 0, 0,
             false},
            {"e1~r2", "succeeded", "m1", "m1", NULL, "e1", 2, 1500, "0.1", 1,
             100, 10, false},
            {"e2~r2", "failed", "m1", "m1", "tests", "e2", 2, 2500, "0.1", 3,
             100, 10, false},
            {"e5~r2", "failed", "m2", "m2", "max_turns", "e5", 2, 4000, "0.2",
             9, 300, 30, false},
            {"e5~r3", "failed", "m2", "m2", "max_turns", "e5", 3, 4000, "0.2",
             9, 300, 30, false},
        };
        PGconn *conn;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(jobs); i++)
                craft("eval-1", (int)i + 1, &jobs[i]);
        conn = cq_pgtest_connect(g_dsn);
        /* samples of p1, a retry keeping its sample's place */
        cq_pgtest_exec(conn, "UPDATE jobs SET problem_id = 'p1', sample_index"
                             " = CASE COALESCE(retry_of, job_id) WHEN 'e1'"
                             " THEN 0 WHEN 'e2' THEN 1 ELSE 2 END"
                             " WHERE COALESCE(retry_of, job_id)"
                             " IN ('e1', 'e2', 'e3')");
        cq_pgtest_exec(conn, "UPDATE jobs SET verdict = 'infra_error'"
                             " WHERE job_id = 'e4'");
        cq_pgtest_exec(conn, "UPDATE results r SET verdict = j.verdict"
                             " FROM jobs j WHERE j.job_id = r.job_id");
        PQfinish(conn);
}

/* One SQL statement of the docs, and where it is. */
typedef struct doc_sql {
        char *sql;
        char where[160];
} doc_sql_t;

/* The statements of every ```sql block of \p rel, appended to \p v. */
static size_t sql_of(const char *rel, doc_sql_t *v, size_t n, size_t max)
{
        char *text = cq_check_slurp(cq_check_srcpath(rel), NULL);
        char *line, *next, stmt[4096];
        size_t len = 0;
        int lineno = 0, first = 0;
        bool in = false;

        for (line = text; *line; line = next) {
                size_t l = strcspn(line, "\n");

                next = line + l + (line[l] != '\0');
                line[l] = '\0';
                lineno++;
                if (!in) {
                        in = strcmp(line, "```sql") == 0;
                        continue;
                }
                if (strncmp(line, "```", 3) == 0) {
                        ck_assert_msg(len == 0, "%s:%d: a statement with no ;",
                                      rel, first);
                        in = false;
                        continue;
                }
                if (len == 0)
                        first = lineno;
                ck_assert_msg(len + l + 2 < sizeof(stmt), "%s:%d: too long",
                              rel, first);
                memcpy(stmt + len, line, l);
                len += l;
                stmt[len++] = '\n';
                stmt[len] = '\0';
                if (l > 0 && line[l - 1] == ';') {
                        ck_assert_uint_lt(n, max);
                        v[n].sql = strdup(stmt);
                        snprintf(v[n].where, sizeof(v[n].where), "%s:%d", rel,
                                 first);
                        n++;
                        len = 0;
                }
        }
        free(text);
        return n;
}

/* The same statement with the tour's run named eval-1. */
static char *as_eval_1(const char *sql)
{
        const char *tour = strstr(sql, "'tour'");
        char *out;

        if (!tour)
                return strdup(sql);
        ck_assert_int_ge(asprintf(&out, "%.*s'eval-1'%s", (int)(tour - sql),
                                  sql, tour + strlen("'tour'")),
                         0);
        return out;
}

/* Numbers that agree: the value \p v of SQL (NULL: null) and the figure
 * \p key of \p g. */
static void
agree(const doc_sql_t *q, const json_t *g, const char *key, const char *v)
{
        const json_t *f = json_object_get(g, key);

        if (!v) {
                ck_assert_msg(json_is_null(f),
                              "%s: %s is null, not in the "
                              "summary",
                              q->where, key);
                return;
        }
        ck_assert_msg(json_is_number(f), "%s: %s is %s, not in the summary",
                      q->where, key, v);
        ck_assert_msg(fabs(strtod(v, NULL) - json_number_value(f)) < 1e-9,
                      "%s: %s is %s, the summary says %g", q->where, key, v,
                      json_number_value(f));
}

static const char *value_of(const PGresult *res, int row, int col)
{
        return PQgetisnull(res, row, col) ? NULL : PQgetvalue(res, row, col);
}

/* A summary row (it has jobs): each figure as the summary's, of the
 * same model or the total; over every attempt when it asks for them. */
static void check_figures(const doc_sql_t *q,
                          const PGresult *res,
                          const json_t *latest,
                          const json_t *all)
{
        static const char *const keys[] = {
            "jobs",    "succeeded",   "failed",       "cancelled",
            "queued",  "running",     "pending",      "pass_rate",
            "retried", "from_memory", "infra_errors", "problems",
            "samples"};
        const json_t *doc = strstr(q->sql, ", true)") ? all : latest;
        int model = PQfnumber(res, "model"), total = PQfnumber(res, "is_total");
        size_t rows = 0;
        int row, k;

        /* a row per model, and the total unless it is by model only */
        if (model >= 0)
                rows += json_array_size(json_object_get(doc, "models"));
        if (model < 0 || total >= 0)
                rows++;
        ck_assert_msg(PQntuples(res) == (int)rows, "%s: %d rows, not %zu",
                      q->where, PQntuples(res), rows);
        for (row = 0; row < PQntuples(res); row++) {
                const json_t *g;

                if (model < 0 ||
                    (total >= 0 &&
                     strcmp(PQgetvalue(res, row, total), "t") == 0))
                        g = json_object_get(doc, "total");
                else
                        g = group(doc, value_of(res, row, model));
                for (k = 0; k < (int)CQ_ARRAY_SIZE(keys); k++) {
                        int col = PQfnumber(res, keys[k]);

                        if (col >= 0)
                                agree(q, g, keys[k], value_of(res, row, col));
                }
        }
}

/* A list of jobs: a row for each job the summary counts, of the status
 * it filters; every attempt when it shows run_attempt. */
static void check_rows(const doc_sql_t *q,
                       const PGresult *res,
                       const json_t *latest,
                       const json_t *all)
{
        const json_t *doc = PQfnumber(res, "run_attempt") >= 0 ? all : latest;
        const char *status = strstr(q->sql, "status = '");
        char key[32] = "jobs";

        if (status)
                snprintf(key, sizeof(key), "%.*s",
                         (int)strcspn(status + 10, "'"), status + 10);
        ck_assert_msg(
            PQntuples(res) == (int)fig(json_object_get(doc, "total"), key),
            "%s: %d rows, the summary counts %g %s (%s attempts)", q->where,
            PQntuples(res), fig(json_object_get(doc, "total"), key), key,
            doc == all ? "all" : "latest");
}

/* `coderq results --run eval-1 --summary` as JSON, over \p args. */
static json_t *summary_of(const char *const *args)
{
        cq_check_proc_t proc;
        json_error_t jerr;
        json_t *doc;

        run_cli(args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        doc = json_loads(proc.out, 0, &jerr);
        ck_assert_msg(doc != NULL, "%s: %s", jerr.text, proc.out);
        cq_check_proc_release(&proc);
        return doc;
}

/* Every ```sql block of README.md and the docs runs, and what a query of
 * a run counts is what `coderq results --summary` counts: the latest
 * attempt of each original job (a retry replaces its original), every
 * attempt only where the query says so. */
START_TEST(docs_queries_count_what_the_summary_counts)
{
        static const char *const latest_args[] = {
            "results",  "--run", "eval-1", "--summary",
            "--format", "json",  NULL};
        static const char *const all_args[] = {
            "results",        "--run",    "eval-1", "--summary",
            "--all-attempts", "--format", "json",   NULL};
        doc_sql_t qs[64];
        size_t n, i, runs = 0;
        json_t *latest, *all;
        glob_t g;
        PGconn *conn;

        make_docs_run();
        latest = summary_of(latest_args);
        all = summary_of(all_args);
        /* the run as the queries should see it */
        ck_assert_double_eq(fig(json_object_get(latest, "total"), "jobs"), 7);
        ck_assert_double_eq(fig(json_object_get(latest, "total"), "failed"), 3);
        ck_assert_double_eq(
            fig(json_object_get(latest, "total"), "infra_errors"), 1);
        ck_assert_double_eq(fig(json_object_get(all, "total"), "failed"), 7);

        n = sql_of("README.md", qs, 0, CQ_ARRAY_SIZE(qs));
        ck_assert_int_eq(glob(cq_check_srcpath("docs/*.md"), 0, NULL, &g), 0);
        for (i = 0; i < g.gl_pathc; i++)
                n = sql_of(strstr(g.gl_pathv[i], "docs/"), qs, n,
                           CQ_ARRAY_SIZE(qs));
        globfree(&g);
        conn = cq_pgtest_connect(g_dsn);
        for (i = 0; i < n; i++) {
                char *sql = as_eval_1(qs[i].sql);
                PGresult *res = PQexec(conn, sql);

                ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s: %s",
                              qs[i].where, PQerrorMessage(conn));
                if (strstr(sql, "'eval-1'")) {
                        if (PQfnumber(res, "jobs") >= 0)
                                check_figures(&qs[i], res, latest, all);
                        else
                                check_rows(&qs[i], res, latest, all);
                        runs++;
                }
                PQclear(res);
                free(sql);
                free(qs[i].sql);
        }
        PQfinish(conn);
        /* the README's tour, JOBS.md's queries and DEPLOYING.md's */
        ck_assert_uint_ge(runs, 8);
        json_decref(latest);
        json_decref(all);
}
END_TEST

static Suite *eval_suite(void)
{
        Suite *s = suite_create("eval");
        TCase *tc = tcase_create("eval");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, summary_figures_of_a_crafted_run);
        tcase_add_test(tc, results_show_the_latest_attempt);
        tcase_add_test(tc, retry_picks_latest_finished_attempts);
        tcase_add_test(tc, retry_sends_linked_jobs_through_kafka);
        tcase_add_test(tc, run_budget_holds_between_workers);
        tcase_add_test(tc, finish_records_reason_code_and_cost);
        tcase_add_test(tc, docs_queries_count_what_the_summary_counts);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(eval_suite)
