/* SPDX-License-Identifier: MIT */
/* report.c - the reads behind `coderq report`: a run's attempts and
 * figures for its index, and everything one job's page shows (its
 * overview, message, conversation, cells, notebook, answer, result report
 * and images), each from one read-only snapshot. The pages themselves are
 * rendered in cli/html_index.c and cli/html_job.c. */
#include "coderq/storage/report.h"
#include "coderq/storage/artifacts.h"
#include "coderq/storage/queries.h"

#include <stdlib.h>
#include <string.h>

#include "store_int.h"

/* One row: the conversation, the cells (with their outputs, escaped as
 * documents), the notebook, the answer, the result report and the job
 * message. A job without a row of its own in one of those tables gets an
 * empty array or a NULL. */
static const char SQL_REPORT_JOB[] =
    "SELECT (SELECT COALESCE(json_agg(m.message ORDER BY m.seq), '[]')"
    "        FROM job_messages m WHERE m.job_id = $1)::text,"
    " (SELECT COALESCE(json_agg(json_build_object('seq', c.seq,"
    "   'code', c.code, 'status', c.status,"
    "   'execution_count', c.execution_count,"
    "   'duration_ms', c.duration_ms, 'truncated', c.truncated,"
    "   'outputs', c.outputs) ORDER BY c.seq), '[]')"
    "  FROM cells c WHERE c.job_id = $1)::text,"
    " (SELECT n.doc::text FROM notebooks n WHERE n.job_id = $1),"
    " (SELECT r.answer FROM results r WHERE r.job_id = $1),"
    " (SELECT r.report::text FROM results r WHERE r.job_id = $1),"
    " (SELECT j.spec::text FROM jobs j WHERE j.job_id = $1)";

/* The fields of the evaluation of each job of run $1 (not among the rows
 * of cq_store_run_attempts()), by job id. */
static const char SQL_REPORT_RUN[] =
    "SELECT COALESCE(json_object_agg(j.job_id, json_build_object("
    "  'verdict', j.verdict, 'judge', r.judge,"
    "  'hidden_passed', r.hidden_passed, 'hidden_total', r.hidden_total,"
    "  'problem_id', j.problem_id, 'sample_index', j.sample_index,"
    "  'queue', j.queue)), '{}')::text"
    " FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id"
    " WHERE j.run_id = $1";

/* The keys SQL_REPORT_RUN adds to each row, in their order. */
static const char *const EVAL_KEYS[] = {
    "verdict",    "judge",        "hidden_passed", "hidden_total",
    "problem_id", "sample_index", "queue"};

void cq_report_job_init(cq_report_job_t *rj)
{
        memset(rj, 0, sizeof(*rj));
        cq_images_init(&rj->images);
}

void cq_report_job_release(cq_report_job_t *rj)
{
        json_decref(rj->doc);
        cq_images_release(&rj->images);
        cq_report_job_init(rj);
}

/* Set doc[key] to the JSON document of column \p col (a NULL column sets
 * JSON null); \p escaped: a stored document whose strings carry the
 * U+0000 escape. Returns 0 or -1 with the error set. */
static int set_column(cq_store_t *store,
                      json_t *doc,
                      const char *key,
                      const PGresult *res,
                      int col,
                      bool escaped)
{
        json_t *value;

        if (PQgetisnull(res, 0, col))
                value = json_null();
        else if (escaped)
                value = store_doc_value(store, res, 0, col, key);
        else
                value = store_json_value(store, res, 0, col, key);
        if (!value)
                return -1;
        if (json_object_set_new(doc, key, value) != 0) {
                store_set_error(store, "could not read %s: out of memory", key);
                return -1;
        }
        return 0;
}

/* Everything but the images, inside the caller's snapshot. */
static cq_err_t
read_doc(cq_store_t *store, const char *job_id, json_t *doc, bool *foundp)
{
        store_params_t sp;
        PGresult *res = NULL;
        json_t *status = NULL;
        char *answer = NULL;
        bool oom = false;
        cq_err_t err;

        err = cq_store_job_status(store, job_id, &status);
        if (err != CQ_OK || !status)
                goto out;
        sp_init(&sp);
        sp_text(&sp, job_id);
        err = store_exec(store, "read a job for the report", SQL_REPORT_JOB,
                         &sp, 0, false, &res);
        if (err != CQ_OK)
                goto out;
        err = CQ_ERR_FATAL;
        if (json_object_set_new(doc, "status", status) != 0) {
                status = NULL;
                oom = true;
                goto out;
        }
        status = NULL; /* doc owns it now */
        if (set_column(store, doc, "messages", res, 0, true) ||
            set_column(store, doc, "cells", res, 1, false) ||
            set_column(store, doc, "notebook", res, 2, true) ||
            set_column(store, doc, "report", res, 4, true) ||
            set_column(store, doc, "spec", res, 5, false) ||
            store_decode_outputs(store, res, 1, json_object_get(doc, "cells")))
                goto out;
        answer = store_strdup_value(res, 0, 3, &oom);
        if (oom || json_object_set_new(doc, "answer",
                                       answer ? json_string(answer)
                                              : json_null()) != 0) {
                oom = true;
                goto out;
        }
        *foundp = true;
        err = CQ_OK;
out:
        if (oom)
                store_set_error(store,
                                "could not read job \"%s\" for the report: "
                                "out of memory",
                                job_id);
        free(answer);
        json_decref(status);
        PQclear(res);
        return err;
}

cq_err_t cq_store_report_job(cq_store_t *store,
                             const char *job_id,
                             cq_report_job_t *rj,
                             bool *foundp)
{
        cq_err_t err;

        *foundp = false;
        rj->doc = json_object();
        if (!rj->doc) {
                store_set_error(store,
                                "could not read job \"%s\" for the "
                                "report: out of memory",
                                job_id);
                return CQ_ERR_FATAL;
        }
        /* One snapshot: the page never mixes two states of the job. */
        err = store_begin_snapshot(store, "read a job for the report");
        if (err != CQ_OK)
                goto out;
        err = read_doc(store, job_id, rj->doc, foundp);
        if (err == CQ_OK && *foundp)
                err = cq_store_get_images(store, job_id, &rj->images);
        if (err == CQ_OK)
                err = store_commit(store, "read a job for the report");
out:
        store_rollback(store);
        if (err != CQ_OK)
                *foundp = false;
        if (!*foundp)
                cq_report_job_release(rj);
        return err;
}

/* Append EVAL_KEYS to each row of \p rows from \p eval (by job id; a job
 * it lacks gets nulls), so that every row keeps the same keys in the same
 * order. Returns 0, or -1 when out of memory. */
static int add_eval(json_t *rows, const json_t *eval)
{
        json_t *row;
        size_t i, k;

        json_array_foreach(rows, i, row)
        {
                const json_t *e = json_object_get(
                    eval, json_string_value(json_object_get(row, "job_id")));

                for (k = 0; k < CQ_ARRAY_SIZE(EVAL_KEYS); k++) {
                        json_t *v = json_object_get(e, EVAL_KEYS[k]);

                        if (json_object_set_new(row, EVAL_KEYS[k],
                                                v ? json_incref(v)
                                                  : json_null()) != 0)
                                return -1;
                }
        }
        return 0;
}

cq_err_t cq_store_report_run(cq_store_t *store,
                             const char *run_id,
                             json_t **rowsp,
                             json_t **figuresp)
{
        static const char what[] = "read a run for the report";
        store_params_t sp;
        PGresult *res = NULL;
        json_t *rows = NULL, *figures = NULL, *eval = NULL;
        cq_err_t err;

        *rowsp = NULL;
        *figuresp = NULL;
        /* One snapshot: the figures count the rows the table shows. */
        err = store_begin_snapshot(store, what);
        if (err != CQ_OK)
                return err;
        err = cq_store_run_attempts(store, run_id, &rows);
        if (err == CQ_OK)
                err = cq_store_run_figures(store, run_id, false, &figures);
        if (err != CQ_OK)
                goto out;
        sp_init(&sp);
        sp_text(&sp, run_id);
        err = store_exec(store, what, SQL_REPORT_RUN, &sp, 0, false, &res);
        if (err != CQ_OK)
                goto out;
        err = CQ_ERR_FATAL;
        eval = store_json_value(store, res, 0, 0, what);
        if (!eval)
                goto out;
        if (!rows) {
                store_set_error(store, "could not %s \"%s\": no reply", what,
                                run_id);
                goto out;
        }
        if (add_eval(rows, eval) != 0) {
                store_set_error(store, "could not %s \"%s\": out of memory",
                                what, run_id);
                goto out;
        }
        err = store_commit(store, what);
        if (err != CQ_OK)
                goto out;
        *rowsp = rows;
        *figuresp = figures;
        rows = figures = NULL;
out:
        store_rollback(store);
        PQclear(res);
        json_decref(eval);
        json_decref(rows);
        json_decref(figures);
        return err;
}
