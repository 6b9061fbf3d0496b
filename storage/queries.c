/* SPDX-License-Identifier: MIT */
/* queries.c - the read side for people and the CLI: one job's status,
 * the results and summary of a run, and everything to export a job. */
#include "store_int.h"

#include <stdlib.h>
#include <string.h>

/* The sandbox a finished job's code ran in ("bwrap+uid-per-kernel",
 * "bwrap", "off" or "e2b") is in its result's report. */
#define SQL_SANDBOX_OF(o)                                                      \
        "(SELECT r.report->>'sandbox' FROM results r WHERE r.job_id = " o      \
        ".job_id)"

static const char SQL_STATUS[] =
    "SELECT row_to_json(x)::text FROM (SELECT o.*, " SQL_SANDBOX_OF(
        "o") " AS sandbox FROM job_overview o WHERE o.job_id = $1) x";

/* json_build_object keeps key order, so every row has the same columns. */
static const char SQL_RUN_RESULTS[] =
    "SELECT COALESCE(json_agg(json_build_object('job_id', o.job_id,"
    " 'title', o.title, 'status', o.status, 'reason', o.reason,"
    " 'attempts', o.attempts, 'turns', o.turns, 'retries', o.retries,"
    " 'tests_passed', o.tests_passed, 'tests_total', o.tests_total,"
    " 'total_tokens', o.total_tokens, 'duration_ms', o.duration_ms,"
    " 'from_memory', o.from_memory, 'memory_source_job', o.memory_source_job,"
    " 'sandbox', " SQL_SANDBOX_OF(
        "o") ")"
             " ORDER BY o.created_at, o.job_id), '[]')::text"
             " FROM job_overview o WHERE o.run_id = $1";

static const char SQL_RUN_SUMMARY[] =
    "SELECT row_to_json(s)::text FROM run_summary s WHERE s.run_id = $1";

static const char SQL_EXPORT[] =
    "SELECT (SELECT n.doc::text FROM notebooks n WHERE n.job_id = $1),"
    " (SELECT r.answer FROM results r WHERE r.job_id = $1)";

/* One JSON value from a one-row, one-column query; NULL when no row. */
static cq_err_t query_json(cq_store_t *store,
                           const char *what,
                           const char *sql,
                           const char *arg,
                           json_t **docp)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;

        *docp = NULL;
        sp_init(&sp);
        sp_text(&sp, arg);
        err = store_exec(store, what, sql, &sp, 0, true, &res);
        if (err == CQ_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
                *docp = store_json_value(store, res, 0, 0, what);
                if (!*docp)
                        err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

cq_err_t
cq_store_job_status(cq_store_t *store, const char *job_id, json_t **rowp)
{
        return query_json(store, "read the status of a job", SQL_STATUS, job_id,
                          rowp);
}

cq_err_t
cq_store_run_results(cq_store_t *store, const char *run_id, json_t **rowsp)
{
        return query_json(store, "read the results of a run", SQL_RUN_RESULTS,
                          run_id, rowsp);
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
        err = store_exec(store, "export a job",
                         "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                         NULL, 0, true, NULL);
        if (err != CQ_OK)
                return err;
        store->in_txn = true;
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
