/* SPDX-License-Identifier: MIT */
/* report.h - a run and one job as the run report shows them, each from
 * one snapshot. Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_REPORT_H
#define CODERQ_STORAGE_REPORT_H

#include "coderq/storage/store.h"
#include "coderq/storage/artifacts.h"

/** @brief Everything a page of the run report shows of one job. Release
 *         with cq_report_job_release(). */
typedef struct cq_report_job {
        /* {"status": the job_overview row as cq_store_job_status() gives
         * it, "messages": [chat message objects in seq order], "cells":
         * [{seq, code, status, execution_count, duration_ms, truncated,
         * outputs}], "notebook": the nbformat document or null, "answer":
         * text or null, "report": the result report or null, "spec": the
         * job message}; documents unescaped (U+0000 restored). Owned. */
        json_t *doc;
        cq_images_t images; /* in the order they were stored */
} cq_report_job_t;

void cq_report_job_init(cq_report_job_t *rj);
void cq_report_job_release(cq_report_job_t *rj);

/**
 * @brief Read one job for the run report, from one read-only snapshot.
 * @param rj (out) Initialised by the caller; filled when *\p foundp.
 * @param foundp (out) false when there is no such job.
 * @returns CQ_OK; CQ_ERR_RETRIABLE when PostgreSQL is unreachable; else
 *          CQ_ERR_FATAL (see cq_store_errmsg()).
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_report_job(cq_store_t *store,
                                          const char *job_id,
                                          cq_report_job_t *rj,
                                          bool *foundp);

/**
 * @brief Read a run for the report's index, from one read-only snapshot.
 * @param rowsp (out) Every attempt of the run, as cq_store_run_attempts()
 *        gives them, each row followed by the fields of its evaluation:
 *        verdict, judge, hidden_passed, hidden_total, problem_id,
 *        sample_index, queue (null where the job has none); an empty
 *        array when the run has no jobs. Caller owns the returned value.
 * @param figuresp (out) cq_store_run_figures() of the run's latest
 *        attempts. Caller owns the returned value.
 * @returns CQ_OK; CQ_ERR_RETRIABLE when PostgreSQL is unreachable; else
 *          CQ_ERR_FATAL (see cq_store_errmsg()); on error both are
 *          NULL.
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_report_run(cq_store_t *store,
                                          const char *run_id,
                                          json_t **rowsp,
                                          json_t **figuresp);

#endif
