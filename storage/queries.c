/* SPDX-License-Identifier: MIT */
/* queries.c - the read side for people and the CLI: one job's status,
 * the results, attempts and summary of a run, the latest run, the depth
 * of the queues, what a retry picks, run budgets, and everything to
 * export a job. */
#include "coderq/storage/queries.h"
#include "coderq/storage/artifacts.h"

#include <stdlib.h>
#include <string.h>

#include "store_int.h"

/* What a finished job recorded of how it ran (the "repro" object of its
 * result's report, docs/EVALUATION.md#reproducibility), as columns. */
#define SQL_REPRO_OF(r)                                                        \
        r ".report->'repro'->>'provider' AS provider, " r                      \
          ".report->'repro'->'temperature' AS temperature, " r                 \
          ".report->'repro'->'top_p' AS top_p, " r                             \
          ".report->'repro'->'seed' AS seed, " r                               \
          ".report->'repro'->'max_tokens' AS max_tokens, " r                   \
          ".report->'repro'->>'system_prompt_sha256' AS "                      \
          "system_prompt_sha256, " r                                           \
          ".report->'repro'->>'coderq_version' AS coderq_version, " r          \
          ".report->'repro'->>'backend' AS backend, " r                        \
          ".report->'repro'->>'python' AS python, " r                          \
          ".report->'repro'->'packages' AS packages"

static const char SQL_STATUS[] =
    "SELECT row_to_json(x)::text FROM (SELECT o.*,"
    " r.report->>'sandbox' AS sandbox, " SQL_REPRO_OF(
        "r") " FROM job_overview o LEFT JOIN results r ON r.job_id = o.job_id"
             " WHERE o.job_id = $1) x";

/* The jobs of a run with, per original job (the job a retry names in
 * retry_of), which attempt is the latest; row_to_json keeps the column
 * order, so every row has the same keys in the same order. $2: every
 * attempt, not only the latest. */
static const char SQL_RUN_RESULTS[] =
    "WITH a AS (SELECT j.job_id, j.title, j.status,"
    "  COALESCE(j.reason, j.error) AS reason, j.reason_code, j.attempts,"
    "  j.turns, j.retries, r.tests_passed, r.tests_total, j.prompt_tokens,"
    "  j.completion_tokens, j.cache_read_tokens, j.cache_creation_tokens,"
    "  j.cost_usd, j.created_at, j.started_at, j.finished_at,"
    "  r.from_memory, r.memory_source_job, r.report, j.retry_of,"
    "  j.run_attempt, COALESCE(r.model, j.spec->>'model') AS model,"
    "  COALESCE(j.retry_of, j.job_id) AS root,"
    "  j.run_attempt = max(j.run_attempt) OVER w AS latest,"
    "  min(j.created_at) OVER w AS root_created"
    " FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id"
    " WHERE j.run_id = $1"
    " WINDOW w AS (PARTITION BY COALESCE(j.retry_of, j.job_id)))"
    " SELECT COALESCE(json_agg(row_to_json(x) ORDER BY a.root_created,"
    "  a.root, a.run_attempt), '[]')::text"
    " FROM a CROSS JOIN LATERAL (SELECT a.job_id, a.title, a.status,"
    "  a.reason, a.reason_code, a.attempts, a.turns, a.retries,"
    "  a.tests_passed, a.tests_total, a.prompt_tokens, a.completion_tokens,"
    "  a.cache_read_tokens, a.cache_creation_tokens,"
    "  a.prompt_tokens + a.completion_tokens AS total_tokens, a.cost_usd,"
    "  (extract(epoch FROM (a.finished_at - a.started_at)) * 1000)::bigint"
    "   AS duration_ms,"
    "  a.from_memory, a.memory_source_job, a.report->>'sandbox' AS sandbox,"
    "  a.retry_of, a.run_attempt, a.latest, a.created_at, a.started_at,"
    "  a.finished_at, a.model, " SQL_REPRO_OF("a") ") x"
                                                   " WHERE $2::boolean OR "
                                                   "a.latest";

static const char SQL_RUN_SUMMARY[] =
    "SELECT row_to_json(s)::text FROM run_summary s WHERE s.run_id = $1";

/* See coderq_run_summary() in migrations/0006_eval_runs.sql. */
static const char SQL_RUN_FIGURES[] =
    "WITH s AS MATERIALIZED (SELECT * FROM coderq_run_summary($1,"
    " $2::boolean))"
    " SELECT json_build_object('run_id', $1::text,"
    " 'attempts', CASE WHEN $2::boolean THEN 'all' ELSE 'latest' END,"
    " 'budget_usd', (SELECT b.budget_usd FROM runs b WHERE b.run_id = $1),"
    " 'spent_usd', (SELECT COALESCE(sum(j.cost_usd), 0) FROM jobs j"
    "  WHERE j.run_id = $1),"
    " 'models', COALESCE((SELECT json_agg(row_to_json(s)"
    "  ORDER BY s.model NULLS LAST) FROM s WHERE NOT s.is_total), '[]'),"
    " 'total', (SELECT row_to_json(s) FROM s WHERE s.is_total))::text";

static const char SQL_LATEST_RUN[] =
    "SELECT run_id FROM jobs WHERE run_id IS NOT NULL"
    " ORDER BY created_at DESC, job_id DESC LIMIT 1";

/* PostgreSQL compiles the pattern: a bad one fails this, not a read. */
static const char SQL_CHECK_PATTERN[] = "SELECT '' ~ $1";

/* The latest attempt of each original job of run $1, finished; $2: only
 * failed ones; $3: a pattern its reason code or reason matches (jobs that
 * did not succeed); $4: every finished one. */
static const char SQL_RETRY_SELECT[] =
    "WITH a AS (SELECT j.job_id, COALESCE(j.retry_of, j.job_id) AS root,"
    "  j.run_attempt, j.status, j.reason_code, j.reason, j.spec,"
    "  max(j.run_attempt) OVER w AS last, min(j.created_at) OVER w AS first"
    " FROM jobs j WHERE j.run_id = $1"
    " WINDOW w AS (PARTITION BY COALESCE(j.retry_of, j.job_id)))"
    " SELECT COALESCE(json_agg(json_build_object('job_id', a.job_id,"
    "  'root_job_id', a.root, 'run_attempt', a.run_attempt,"
    "  'status', a.status, 'reason_code', a.reason_code, 'spec', a.spec)"
    "  ORDER BY a.first, a.root), '[]')::text"
    " FROM a WHERE a.run_attempt = a.last"
    "  AND a.status IN ('succeeded', 'failed', 'cancelled')"
    "  AND ($2::boolean OR $3::text IS NOT NULL OR $4::boolean)"
    "  AND (NOT $2::boolean OR a.status = 'failed')"
    "  AND ($3::text IS NULL OR (a.status <> 'succeeded'"
    "   AND (COALESCE(a.reason_code, '') ~ $3::text"
    "    OR COALESCE(a.reason, '') ~ $3::text)))";

static const char SQL_JOBS_EXIST[] =
    "SELECT COALESCE(json_agg(job_id ORDER BY job_id), '[]')::text"
    " FROM jobs WHERE job_id = ANY ($1::text[])";

static const char SQL_SET_BUDGET[] =
    "INSERT INTO runs (run_id, budget_usd) VALUES ($1, $2::numeric)"
    " ON CONFLICT (run_id) DO UPDATE SET budget_usd = EXCLUDED.budget_usd,"
    " updated_at = now()";

static const char SQL_CLEAR_BUDGET[] =
    "UPDATE runs SET budget_usd = NULL, updated_at = now()"
    " WHERE run_id = $1";

static const char SQL_RUN_BUDGET[] =
    "SELECT json_build_object('run_id', $1::text,"
    " 'budget_usd', (SELECT b.budget_usd FROM runs b WHERE b.run_id = $1),"
    " 'spent_usd', COALESCE(sum(j.cost_usd), 0),"
    " 'held_usd', COALESCE(sum(j.budget_hold_usd)"
    "  FILTER (WHERE j.status = 'running'), 0),"
    " 'cost_unknown', count(*) FILTER (WHERE j.cost_usd IS NULL),"
    " 'jobs', count(*))::text FROM jobs j WHERE j.run_id = $1";

/* What an evaluation reads of each sample (docs/EVALUATION.md): its
 * verdict, its test report and the code judged, its message's solution or
 * else the code of its cells that succeeded, in the order they ran. */
#define SQL_SAMPLE_ROW(j, r)                                                   \
        "json_build_object('job_id', " j ".job_id, 'status', " j ".status,"    \
        " 'verdict', " j ".verdict, 'reason', COALESCE(" j ".reason, " j       \
        ".error), 'problem_id', " j ".problem_id, 'sample_index', " j          \
        ".sample_index, 'task_id', " j ".spec->'metadata'->'task_id',"         \
        " 'prompt', " j ".spec->>'prompt', 'code', COALESCE(" j                \
        ".spec->>'solution', (SELECT string_agg(c.code, E'\\n\\n'"             \
        " ORDER BY c.seq) FROM cells c WHERE c.job_id = " j ".job_id"          \
        " AND c.status = 'ok')), 'tests', " r ".report->'tests')"

static const char SQL_SAMPLES[] = "SELECT COALESCE(json_agg(" SQL_SAMPLE_ROW(
    "j", "r") "), '[]')::text"
              " FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id"
              " WHERE j.job_id = ANY ($1::text[])";

/* The latest attempt of each original job of run $1, by problem (in the
 * order the problems first appear), sample index and original. */
static const char SQL_RUN_SAMPLES[] =
    "WITH a AS (SELECT j.job_id, COALESCE(j.retry_of, j.job_id) AS root,"
    "  j.run_attempt = max(j.run_attempt) OVER w AS latest,"
    "  min(j.created_at) OVER w AS root_created"
    " FROM jobs j WHERE j.run_id = $1"
    " WINDOW w AS (PARTITION BY COALESCE(j.retry_of, j.job_id))),"
    " b AS (SELECT j.*, a.root,"
    "  min(a.root_created) OVER (PARTITION BY COALESCE(j.problem_id,"
    "   a.root)) AS problem_created"
    " FROM a JOIN jobs j ON j.job_id = a.job_id WHERE a.latest)"
    " SELECT COALESCE(json_agg(" SQL_SAMPLE_ROW(
        "b", "r") " ORDER BY"
                  "  b.problem_created, COALESCE(b.problem_id, b.root), "
                  "b.sample_index,"
                  "  b.root), '[]')::text"
                  " FROM b LEFT JOIN results r ON r.job_id = b.job_id";

/* Jobs of $1 by status; ids not stored yet are not counted. */
static const char SQL_JOBS_PROGRESS[] =
    "SELECT json_build_object("
    " 'running', count(*) FILTER (WHERE status = 'running'),"
    " 'succeeded', count(*) FILTER (WHERE status = 'succeeded'),"
    " 'failed', count(*) FILTER (WHERE status = 'failed'),"
    " 'cancelled', count(*) FILTER (WHERE status = 'cancelled'))::text"
    " FROM jobs WHERE job_id = ANY ($1::text[])";

/* Queue depth rows of the view queue_depth \p d for the queues \p q, by
 * name; a queue without queued or running jobs reads 0. */
#define SQL_DEPTH_ROWS(q, d)                                                   \
        "COALESCE(json_agg(json_build_object('queue', " q ".queue,"            \
        " 'queued', COALESCE(" d ".queued, 0),"                                \
        " 'waiting', COALESCE(" d ".waiting, 0),"                              \
        " 'running', COALESCE(" d ".running, 0)) ORDER BY " q ".queue),"       \
        " '[]')::text"

static const char SQL_QUEUE_DEPTH[] =
    "SELECT " SQL_DEPTH_ROWS("d", "d") " FROM queue_depth d";

/* The queues the jobs of run $1 wait or waited in, with every job of
 * those queues, the run's or not. */
static const char SQL_RUN_QUEUES[] = "SELECT " SQL_DEPTH_ROWS(
    "q", "d") " FROM (SELECT DISTINCT j.queue"
              " FROM jobs j WHERE j.run_id = $1) q"
              " LEFT JOIN queue_depth d ON d.queue = q.queue";

static const char SQL_EXPORT[] =
    "SELECT (SELECT n.doc::text FROM notebooks n WHERE n.job_id = $1),"
    " (SELECT r.answer FROM results r WHERE r.job_id = $1)";

/* One JSON value from a one-row, one-column query of parameters \p sp;
 * NULL when no row. */
static cq_err_t query_json_sp(cq_store_t *store,
                              const char *what,
                              const char *sql,
                              const store_params_t *sp,
                              json_t **docp)
{
        PGresult *res = NULL;
        cq_err_t err;

        *docp = NULL;
        err = store_exec(store, what, sql, sp, 0, true, &res);
        if (err == CQ_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
                *docp = store_json_value(store, res, 0, 0, what);
                if (!*docp)
                        err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

/* query_json_sp() with one text parameter. */
static cq_err_t query_json(cq_store_t *store,
                           const char *what,
                           const char *sql,
                           const char *arg,
                           json_t **docp)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, arg);
        return query_json_sp(store, what, sql, &sp, docp);
}

cq_err_t
cq_store_job_status(cq_store_t *store, const char *job_id, json_t **rowp)
{
        return query_json(store, "read the status of a job", SQL_STATUS, job_id,
                          rowp);
}

static cq_err_t run_rows(cq_store_t *store,
                         const char *run_id,
                         bool all_attempts,
                         json_t **rowsp)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, run_id);
        sp_text(&sp, all_attempts ? "true" : "false");
        return query_json_sp(store, "read the results of a run",
                             SQL_RUN_RESULTS, &sp, rowsp);
}

cq_err_t
cq_store_run_results(cq_store_t *store, const char *run_id, json_t **rowsp)
{
        return run_rows(store, run_id, false, rowsp);
}

cq_err_t
cq_store_run_attempts(cq_store_t *store, const char *run_id, json_t **rowsp)
{
        return run_rows(store, run_id, true, rowsp);
}

cq_err_t cq_store_run_figures(cq_store_t *store,
                              const char *run_id,
                              bool all_attempts,
                              json_t **docp)
{
        store_params_t sp;
        json_t *models, *row;
        cq_err_t err;
        size_t i;

        sp_init(&sp);
        sp_text(&sp, run_id);
        sp_text(&sp, all_attempts ? "true" : "false");
        err = query_json_sp(store, "read the summary of a run", SQL_RUN_FIGURES,
                            &sp, docp);
        if (err != CQ_OK)
                return err;
        if (!*docp) {
                store_set_error(store, "could not read the summary of a run: "
                                       "no reply");
                return CQ_ERR_FATAL;
        }
        /* is_total says which row is which; the document's shape says it
         * already */
        models = json_object_get(*docp, "models");
        json_array_foreach(models, i, row) json_object_del(row, "is_total");
        json_object_del(json_object_get(*docp, "total"), "is_total");
        return CQ_OK;
}

cq_err_t
cq_store_queue_depth(cq_store_t *store, const char *run_id, json_t **rowsp)
{
        store_params_t sp;
        cq_err_t err;

        sp_init(&sp);
        if (run_id)
                sp_text(&sp, run_id);
        err = query_json_sp(store, "read the depth of the queues",
                            run_id ? SQL_RUN_QUEUES : SQL_QUEUE_DEPTH, &sp,
                            rowsp);
        if (err == CQ_OK && !json_is_array(*rowsp)) {
                store_set_error(store, "could not read the depth of the "
                                       "queues: no reply");
                json_decref(*rowsp);
                *rowsp = NULL;
                err = CQ_ERR_FATAL;
        }
        return err;
}

cq_err_t cq_store_latest_run(cq_store_t *store, char **runp)
{
        PGresult *res = NULL;
        cq_err_t err;
        bool oom = false;

        *runp = NULL;
        err = store_exec(store, "find the most recent run", SQL_LATEST_RUN,
                         NULL, 0, true, &res);
        if (err == CQ_OK && PQntuples(res) == 1) {
                *runp = store_strdup_value(res, 0, 0, &oom);
                if (oom) {
                        store_set_error(store, "could not find the most "
                                               "recent run: out of memory");
                        err = CQ_ERR_FATAL;
                }
        }
        PQclear(res);
        return err;
}

cq_err_t cq_store_retry_select(cq_store_t *store,
                               const char *run_id,
                               const cq_retry_filter_t *filter,
                               json_t **rowsp,
                               bool *bad_patternp)
{
        store_params_t sp;
        cq_err_t err;

        *rowsp = NULL;
        *bad_patternp = false;
        if (filter->pattern) {
                sp_init(&sp);
                sp_text(&sp, filter->pattern);
                err = store_exec(store, "use the reason pattern",
                                 SQL_CHECK_PATTERN, &sp, 0, true, NULL);
                if (err != CQ_OK) {
                        *bad_patternp = err == CQ_ERR_FATAL;
                        return err;
                }
        }
        sp_init(&sp);
        sp_text(&sp, run_id);
        sp_text(&sp, filter->failed ? "true" : "false");
        sp_text(&sp, filter->pattern);
        sp_text(&sp, filter->all ? "true" : "false");
        err = query_json_sp(store, "choose the jobs to retry", SQL_RETRY_SELECT,
                            &sp, rowsp);
        if (err == CQ_OK && !*rowsp) {
                store_set_error(store, "could not choose the jobs to retry: "
                                       "no reply");
                err = CQ_ERR_FATAL;
        }
        return err;
}

/* query_json_sp() of \p sql with the text[] of \p job_ids as $1, which
 * always has a reply. */
static cq_err_t query_ids(cq_store_t *store,
                          const char *what,
                          const char *sql,
                          const char *const *job_ids,
                          size_t n,
                          json_t **docp)
{
        store_params_t sp;
        char *ids;
        cq_err_t err;

        *docp = NULL;
        ids = store_text_array(store, job_ids, n);
        if (!ids)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, ids);
        err = query_json_sp(store, what, sql, &sp, docp);
        free(ids);
        if (err == CQ_OK && !*docp) {
                store_set_error(store, "could not %s: no reply", what);
                err = CQ_ERR_FATAL;
        }
        return err;
}

cq_err_t cq_store_jobs_exist(cq_store_t *store,
                             const char *const *job_ids,
                             size_t n,
                             json_t **foundp)
{
        return query_ids(store, "look up jobs", SQL_JOBS_EXIST, job_ids, n,
                         foundp);
}

cq_err_t cq_store_jobs_progress(cq_store_t *store,
                                const char *const *job_ids,
                                size_t n,
                                json_t **countsp)
{
        return query_ids(store, "follow jobs", SQL_JOBS_PROGRESS, job_ids, n,
                         countsp);
}

/* The test reports of \p rows as the worker wrote them: the escape of
 * U+0000 that jsonb needs undone. */
static cq_err_t decode_tests(cq_store_t *store, json_t *rows, const char *what)
{
        json_t *row, *tests;
        size_t i;

        json_array_foreach(rows, i, row)
        {
                tests = json_object_get(row, "tests");
                if (!tests || json_is_null(tests))
                        continue;
                if (json_object_set_new(row, "tests",
                                        store_doc_decode(tests)) != 0) {
                        store_set_error(store, "could not %s: out of memory",
                                        what);
                        return CQ_ERR_FATAL;
                }
        }
        return CQ_OK;
}

cq_err_t cq_store_samples(cq_store_t *store,
                          const char *const *job_ids,
                          size_t n,
                          json_t **rowsp)
{
        cq_err_t err = query_ids(store, "read the samples", SQL_SAMPLES,
                                 job_ids, n, rowsp);

        if (err == CQ_OK)
                err = decode_tests(store, *rowsp, "read the samples");
        return err;
}

cq_err_t
cq_store_run_samples(cq_store_t *store, const char *run_id, json_t **rowsp)
{
        static const char what[] = "read the samples of a run";
        cq_err_t err = query_json(store, what, SQL_RUN_SAMPLES, run_id, rowsp);

        if (err == CQ_OK && !*rowsp) {
                store_set_error(store, "could not %s: no reply", what);
                err = CQ_ERR_FATAL;
        }
        if (err == CQ_OK)
                err = decode_tests(store, *rowsp, what);
        return err;
}

cq_err_t
cq_store_set_run_budget(cq_store_t *store, const char *run_id, double usd)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, run_id);
        if (usd < 0)
                return store_exec(store, "remove the budget of a run",
                                  SQL_CLEAR_BUDGET, &sp, 0, true, NULL);
        sp_cost(&sp, usd);
        return store_exec(store, "set the budget of a run", SQL_SET_BUDGET, &sp,
                          0, true, NULL);
}

cq_err_t
cq_store_run_budget(cq_store_t *store, const char *run_id, json_t **docp)
{
        cq_err_t err = query_json(store, "read the budget of a run",
                                  SQL_RUN_BUDGET, run_id, docp);

        if (err == CQ_OK && !*docp) {
                store_set_error(store,
                                "could not read the budget of a run: no reply");
                err = CQ_ERR_FATAL;
        }
        return err;
}

cq_err_t
cq_store_run_summary(cq_store_t *store, const char *run_id, json_t **rowp)
{
        return query_json(store, "read the summary of a run", SQL_RUN_SUMMARY,
                          run_id, rowp);
}

void cq_export_init(cq_export_t *exp)
{
        memset(exp, 0, sizeof(*exp));
        cq_images_init(&exp->images);
}

void cq_export_release(cq_export_t *exp)
{
        json_decref(exp->status);
        json_decref(exp->notebook);
        free(exp->answer);
        cq_images_release(&exp->images);
        cq_export_init(exp);
}

cq_err_t cq_store_export(cq_store_t *store,
                         const char *job_id,
                         cq_export_t *exp,
                         bool *foundp)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;
        bool oom = false;

        *foundp = false;
        /* One snapshot for all three reads. */
        err = store_begin_snapshot(store, "export a job");
        if (err != CQ_OK)
                return err;
        err = cq_store_job_status(store, job_id, &exp->status);
        if (err != CQ_OK || !exp->status)
                goto out;
        sp_init(&sp);
        sp_text(&sp, job_id);
        err =
            store_exec(store, "export a job", SQL_EXPORT, &sp, 0, false, &res);
        if (err != CQ_OK)
                goto out;
        if (!PQgetisnull(res, 0, 0)) {
                exp->notebook = store_doc_value(store, res, 0, 0, "notebook");
                if (!exp->notebook) {
                        err = CQ_ERR_FATAL;
                        goto out;
                }
        }
        exp->answer = store_strdup_value(res, 0, 1, &oom);
        if (oom) {
                store_set_error(store, "could not export a job: out of memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        err = cq_store_get_images(store, job_id, &exp->images);
        if (err == CQ_OK)
                err = store_commit(store, "export a job");
        if (err == CQ_OK)
                *foundp = true;
out:
        store_rollback(store);
        if (!*foundp)
                cq_export_release(exp);
        PQclear(res);
        return err;
}
