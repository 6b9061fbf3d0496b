/* SPDX-License-Identifier: MIT */
/* queue.h - the job queue: upsert from the intake, claim with
 * SKIP LOCKED, lease heartbeat and requeue, give back and retry later,
 * usage and the run budget, the finishing transaction, cancel.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_QUEUE_H
#define CODERQ_STORAGE_QUEUE_H

#include "coderq/storage/store.h"

/** @brief Where a job message came from (Kafka provenance). */
typedef struct cq_job_src {
        const char *topic; /* borrowed; NULL when not from Kafka */
        int32_t partition;
        int64_t offset;
} cq_job_src_t;

/**
 * @brief Insert a job from its validated message unless its job_id exists
 *        (INSERT ... ON CONFLICT (job_id) DO NOTHING).
 * @param job Borrowed; job_id, prompt, title, task_id, run_id,
 *            parent_job_id, priority and spec are stored.
 * @param src Borrowed; may be NULL.
 * @param createdp (out, optional) Whether this call created the row. After
 *            a reconnect-and-retry a row created by the lost attempt reads
 *            as not created; either way the job exists exactly once.
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_upsert_job(cq_store_t *store,
                                          const cq_job_t *job,
                                          const cq_job_src_t *src,
                                          bool *createdp);

/**
 * @brief Whether a stored job of \p job's job_id has other content (its
 *        spec, compared as jsonb) than \p job: a message that is not the
 *        redelivery of the one that created it. False when none is stored.
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_job_differs(cq_store_t *store,
                                           const cq_job_t *job,
                                           bool *differsp);

/** @brief One job of a batch upsert. */
typedef struct cq_job_upsert {
        const cq_job_t *job;     /* borrowed; as for cq_store_upsert_job() */
        const cq_job_src_t *src; /* borrowed; may be NULL */
        bool created;            /* (out) this call created the row */
} cq_job_upsert_t;

/**
 * @brief cq_store_upsert_job() for \p n jobs in one statement and one
 *        transaction: all land or none does. A job_id given twice is one
 *        job (the first is the one created). Queue order among them is
 *        their order in \p v.
 * @returns CQ_OK; CQ_ERR_RETRIABLE when PostgreSQL is unreachable;
 *          CQ_ERR_FATAL when it refused the batch (one bad job refuses
 *          all: upsert them one by one to find it).
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_upsert_jobs(cq_store_t *store,
                                           cq_job_upsert_t *v,
                                           size_t n);

/** @brief A claimed job. Release with cq_claim_release(). */
typedef struct cq_claim {
        char *job_id;
        json_t *spec;        /* the job message; owned */
        int attempt;         /* 1 for the first run */
        int max_attempts;    /* the job's bound on attempts */
        bool has_checkpoint; /* messages or cells from an earlier attempt */
        int retries;         /* failed cells and test runs counted so far */
        int64_t run_ms;      /* running time of the earlier attempts */
        cq_usage_t usage;    /* LLM tokens of the earlier attempts */
        double cost_usd;     /* their cost; < 0: unknown */
        bool run_budget;     /* the job's run had a budget when claimed */
} cq_claim_t;

void cq_claim_init(cq_claim_t *claim);
void cq_claim_release(cq_claim_t *claim);

/**
 * @brief Claim the next runnable job: queued, run_after reached, parent
 *        (if any) succeeded; highest priority first, then oldest. Sets the
 *        lease (owner, expiry now + lease_s) and counts the attempt.
 *        A job whose attempts reached max_attempts is never claimed.
 * @param claim (out) Initialised by the caller; filled when *foundp.
 * @param foundp (out) false when nothing is runnable.
 * @remark Never retried after a reconnect: a lost reply may have claimed a
 *         job, whose lease then expires and is requeued.
 */
CQ_NODISCARD cq_err_t cq_store_claim(cq_store_t *store,
                                     cq_claim_t *claim,
                                     bool *foundp);

/**
 * @brief Renew every lease this owner holds; report which of \p job_ids
 *        are no longer held (finished elsewhere, expired and requeued).
 * @param job_ids Borrowed.
 * @param lost (out) n flags; lost[i] is true when job_ids[i] was lost.
 * @param nlostp (out, optional) How many were lost.
 */
CQ_NODISCARD cq_err_t cq_store_heartbeat(cq_store_t *store,
                                         const char *const *job_ids,
                                         size_t n,
                                         bool *lost,
                                         size_t *nlostp);

/**
 * @brief Requeue running jobs whose lease expired; a job that used all its
 *        attempts fails instead, with the reason "lease expired after N
 *        attempts" and a completion event in the outbox; one whose cancel
 *        was requested is cancelled. Queued jobs whose parent failed or
 *        was cancelled fail too ("parent job X failed"), and so do queued
 *        jobs whose parent does not exist parent_wait_s after they were
 *        created ("parent job X does not exist after N s").
 * @param requeuedp, failedp (out, optional) Counts; failedp counts every
 *        job this call finished (failed or cancelled).
 */
CQ_NODISCARD cq_err_t cq_store_requeue_expired(cq_store_t *store,
                                               int *requeuedp,
                                               int *failedp);

/**
 * @brief Give a job back to the queue (graceful shutdown): running ->
 *        queued, lease cleared, the attempt not counted.
 * @returns CQ_OK; CQ_ERR_FATAL when this owner does not hold the lease.
 */
CQ_NODISCARD cq_err_t cq_store_release(cq_store_t *store, const char *job_id);

/**
 * @brief Give a job back after a failure that a later try may not meet (no
 *        interpreter, PostgreSQL trouble): running -> queued, lease
 *        cleared, the attempt counted, claimable again \p delay_ms from
 *        now; \p error is kept in the job's error column.
 * @param error Borrowed; may be NULL.
 * @returns CQ_OK; CQ_ERR_FATAL when this owner does not hold the lease or
 *          the job has no attempt left (finish it as failed instead: a
 *          queued job with no attempt left would never run).
 */
CQ_NODISCARD cq_err_t cq_store_retry_later(cq_store_t *store,
                                           const char *job_id,
                                           const char *error,
                                           int64_t delay_ms);

/**
 * @brief Record how many failed cells and test runs a running job has had
 *        (the retries column), so a resumed job goes on counting from
 *        there: max_retries holds over the whole job.
 * @param lostp (out) true when this owner no longer holds the lease:
 *        nothing was written.
 */
CQ_NODISCARD cq_err_t cq_store_set_retries(cq_store_t *store,
                                           const char *job_id,
                                           long retries,
                                           bool *lostp);

/**
 * @brief Record a running job's LLM usage and cost so far (its totals,
 *        earlier attempts included; \p cost_usd < 0: unknown), releasing
 *        the run budget it held for the call. Limits and budgets read
 *        these totals, so a resumed job counts what it spent before.
 * @param lostp (out) true when this owner no longer holds the lease:
 *        nothing was written.
 */
CQ_NODISCARD cq_err_t cq_store_record_usage(cq_store_t *store,
                                            const char *job_id,
                                            const cq_usage_t *usage,
                                            double cost_usd,
                                            bool *lostp);

typedef enum cq_budget_outcome {
        CQ_BUDGET_NONE = 0, /* the job's run has no budget */
        CQ_BUDGET_HELD,     /* within the budget: the estimate is held */
        CQ_BUDGET_OVER,     /* the call would cross the budget */
        CQ_BUDGET_UNKNOWN,  /* the call's or the run's cost is unknown */
        CQ_BUDGET_LOST,     /* this owner does not hold the job's lease */
} cq_budget_outcome_t;

/** @brief What cq_store_budget_reserve() found; amounts in USD, -1 when
 *         not known. */
typedef struct cq_budget {
        cq_budget_outcome_t outcome;
        double budget_usd; /* the run's budget */
        double spent_usd;  /* known costs of the run's jobs, all attempts */
        double held_usd;   /* held by the run's other calls in flight */
} cq_budget_t;

/**
 * @brief Before an LLM call of a running job whose run has a budget
 *        (`coderq budget`): hold \p estimate_usd (the most the call may
 *        cost; < 0: unknown, which is refused) against it, unless spent +
 *        held + estimate would cross it. Holds of one run are serialised,
 *        so two workers never both take the last of a budget; a hold is
 *        released by cq_store_record_usage() or when the job leaves
 *        'running'.
 * @param budget (out) The outcome and the figures it was decided on.
 * @remark Not retried after a reconnect.
 */
CQ_NODISCARD cq_err_t cq_store_budget_reserve(cq_store_t *store,
                                              const char *job_id,
                                              double estimate_usd,
                                              cq_budget_t *budget);

/** @brief The final state of a job, for cq_store_finish(). */
typedef struct cq_finish {
        const char *job_id; /* borrowed */
        const char *status; /* "succeeded", "failed" or "cancelled" */
        const char *reason; /* why it failed; may be NULL */
        const char *answer; /* the final answer; may be NULL */
        int tests_passed;   /* -1 when the job had no tests */
        int tests_total;
        const char *reason_code; /* the kind of reason ("budget", ...);
                                    NULL: "other" unless it succeeded */
        int turns, retries;
        int64_t prompt_tokens, completion_tokens; /* of the whole job */
        int64_t cache_read_tokens, cache_creation_tokens;
        double cost_usd;        /* of the whole job; < 0: unknown */
        const json_t *notebook; /* final nbformat document; may be NULL */
        const json_t *report;   /* extra result details (object); or NULL */
        /* The evaluation's outcome (docs/EVALUATION.md#verdicts); NULL:
         * what the status and the reason code say. Ignored when
         * cancelled. */
        const char *verdict;
        const char *judge; /* "separate", "model", or NULL: no tests */
        int hidden_passed; /* hidden_total 0 (or -1): no hidden tests */
        int hidden_total;
} cq_finish_t;

/**
 * @brief Finish a job in ONE transaction (one statement, coderq_finish()
 *        in the schema): job status and figures (guarded by lease_owner =
 *        this owner), the results row, the final notebook and an outbox
 *        row with the completion event built from the stored rows.
 *        Retried once after a reconnect, which is safe (see below).
 * @param lostp (out) true when the lease is no longer ours: nothing was
 *        written. A repeat call after this owner already finished the job
 *        with the same status (a commit whose reply was lost) is CQ_OK.
 * @returns CQ_ERR_TOO_LARGE for a notebook over the cap (nothing written).
 */
CQ_NODISCARD cq_err_t cq_store_finish(cq_store_t *store,
                                      const cq_finish_t *fin,
                                      bool *lostp);

typedef enum cq_cancel_outcome {
        CQ_CANCEL_NOT_FOUND = 0,
        CQ_CANCEL_DONE,      /* was queued: now cancelled, event queued */
        CQ_CANCEL_REQUESTED, /* running: the worker sees the flag */
        CQ_CANCEL_FINISHED,  /* already succeeded, failed or cancelled */
} cq_cancel_outcome_t;

/** @brief Cancel a job: a queued one at once, a running one by flag. */
CQ_NODISCARD cq_err_t cq_store_cancel(cq_store_t *store,
                                      const char *job_id,
                                      cq_cancel_outcome_t *outcomep);

/**
 * @brief Which of \p n jobs this owner runs have a cancel request, in one
 *        statement: requested[i] for job_ids[i] (false for a job that is
 *        not running under this owner).
 */
CQ_NODISCARD cq_err_t cq_store_cancel_requested(cq_store_t *store,
                                                const char *const *job_ids,
                                                size_t n,
                                                bool *requested);

#endif
