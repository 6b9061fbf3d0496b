/* SPDX-License-Identifier: MIT */
/* store.h - PostgreSQL storage: the job queue (upsert, claim, lease,
 * heartbeat, requeue, finish), checkpoints (conversation, cells, notebook),
 * images, results, the transactional outbox, episodic memory and the
 * queries behind the CLI; plus the migration runner, the wake-up listener,
 * the intake's backlog count and coderq doctor's probe. Every SQL
 * statement of coderq is behind this header.
 *
 * One cq_store_t owns one PGconn and is used by one thread at a time (each
 * worker slot, the heartbeat, the relay and the intake own their own).
 * Every statement is parameterised; bytea travels in binary format. A lost
 * connection is re-established with bounded backoff; a statement is retried
 * after a reconnect only when running it twice is harmless (reads and
 * idempotent writes, including cq_store_finish()). A multi-statement
 * transaction is never retried here: it lands whole or not at all, and the
 * call returns CQ_ERR_RETRIABLE so the caller can run it again.
 *
 * @locality Every cq_store_* call on a handle: the one thread that owns
 * it (a PGconn is not thread-safe). Handles are independent: one per
 * slot, heartbeat, relay and intake thread.
 *
 * Errors: calls return CQ_OK; CQ_ERR_RETRIABLE when PostgreSQL could not be
 * reached or the connection broke (try again later); CQ_ERR_TOO_LARGE when
 * a configured cap was hit (nothing was written); CQ_ERR_FATAL for
 * anything else (a constraint, a bug). The reason is in
 * cq_store_errmsg(). */
#ifndef CODERQ_STORE_H
#define CODERQ_STORE_H

#include <jansson.h>

#include "coderq/common/cell.h"
#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/common/job.h"
#include "coderq/common/prices.h"

typedef struct cq_store cq_store_t;

/** @brief Settings of one store handle; strings are borrowed. */
typedef struct cq_store_opts {
        const char *dsn;           /* libpq conninfo or URI; NULL: libpq PG* */
        const char *owner;         /* this worker's name in leases */
        int lease_s;               /* lease length (CODERQ_LEASE_S) */
        int max_attempts;          /* for new jobs (CODERQ_MAX_ATTEMPTS) */
        size_t notebook_max;       /* serialized notebook cap, bytes */
        size_t image_max;          /* one image, bytes */
        double memory_threshold;   /* 0..1 trigram similarity for recall */
        int reconnect_ms;          /* give up reconnecting after this long */
        const char *results_topic; /* outbox topic of completion events */
        bool prepare;              /* prepared statements (CODERQ_PG_PREPARE) */
        int parent_wait_s;         /* a missing parent fails its child after
                                      this long (CODERQ_PARENT_WAIT_S) */
} cq_store_opts_t;

#define CQ_STORE_RESULTS_TOPIC "coderq.results"

/** @brief Defaults: lease 120 s, 3 attempts, notebook 64 MiB, image 32 MiB,
 *         threshold 0.3, reconnect 30 s, owner "coderq", prepared
 *         statements on, parent wait 3600 s. */
void cq_store_opts_init(cq_store_opts_t *opts);

/** @brief Fill \p opts from \p cfg (borrowed: it must outlive the store). */
void cq_store_opts_from_config(cq_store_opts_t *opts, const cq_config_t *cfg);

/**
 * @brief Connect. The options are copied.
 * @returns Caller owns the returned value; free with cq_store_destroy().
 *          NULL with \p errstr filled when the first connection fails (the
 *          server is down: the caller may retry) or out of memory.
 * @locality Any thread; the handle then belongs to that thread.
 */
cq_store_t *
cq_store_new(const cq_store_opts_t *opts, char *errstr, size_t errstr_size);

void cq_store_destroy(cq_store_t **storep);

/** @brief The last error. Borrowed; valid until the next call. */
const char *cq_store_errmsg(const cq_store_t *store);

/** @brief The server process id of the current connection (tests). */
int cq_store_backend_pid(const cq_store_t *store);

/** @brief How many times the handle re-established its connection. */
unsigned cq_store_reconnects(const cq_store_t *store);

/* ---------------------------------------------------------------- queue */

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

/** @brief One outbox row. Release with cq_outbox_release(). */
typedef struct cq_outbox_row {
        char event_id[37]; /* uuid text */
        char *topic;
        char *key;
        char *payload; /* JSON text */
        int attempts;  /* claims so far, this one included */
} cq_outbox_row_t;

typedef struct cq_outbox {
        cq_outbox_row_t *v;
        size_t n;
} cq_outbox_t;

void cq_outbox_init(cq_outbox_t *box);
void cq_outbox_release(cq_outbox_t *box);

/** @brief Up to \p max rows neither sent nor failed, oldest first,
 *         claimed or not (a look, not a claim). \p box: initialised. */
CQ_NODISCARD cq_err_t cq_store_outbox_fetch(cq_store_t *store,
                                            size_t max,
                                            cq_outbox_t *box);

/**
 * @brief Claim up to \p max rows for relay \p relay_id, oldest first: rows
 *        neither sent nor failed whose claim is free or expired (and whose
 *        backoff has passed), locked with FOR UPDATE SKIP LOCKED so two
 *        relays never claim the same row. The claim lasts \p lease_ms and
 *        counts an attempt. \p box: initialised.
 */
CQ_NODISCARD cq_err_t cq_store_outbox_claim(cq_store_t *store,
                                            const char *relay_id,
                                            size_t max,
                                            long lease_ms,
                                            cq_outbox_t *box);

/** @brief Mark rows sent (after their successful delivery reports), in
 *         one statement, whoever holds their claim; ids already marked
 *         are left as they are. */
CQ_NODISCARD cq_err_t cq_store_outbox_mark_sent(cq_store_t *store,
                                                const char *const *event_ids,
                                                size_t n);

/**
 * @brief Give up \p relay_id's claim on rows whose delivery failed for a
 *        reason a retry can fix, recording \p error: they are claimable
 *        again after a backoff that doubles with each attempt, from
 *        \p backoff_ms up to \p backoff_max_ms.
 */
CQ_NODISCARD cq_err_t cq_store_outbox_release(cq_store_t *store,
                                              const char *relay_id,
                                              const char *const *event_ids,
                                              size_t n,
                                              const char *error,
                                              long backoff_ms,
                                              long backoff_max_ms);

/** @brief Mark an unsent row failed for good with \p error: no relay
 *         claims it again. */
CQ_NODISCARD cq_err_t cq_store_outbox_mark_failed(cq_store_t *store,
                                                  const char *event_id,
                                                  const char *error);

/**
 * @brief The outbox for people: *\p objp = {"pending", "claimed", "sent",
 *        "failed" counts, "oldest_pending" (timestamp or null), "failed_rows":
 *        [{event_id, job_id, topic, attempts, error, failed_at}] (the
 *        \p max_failed most recent)}.
 * @returns Caller owns *\p objp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_outbox_summary(cq_store_t *store,
                                              size_t max_failed,
                                              json_t **objp);

/**
 * @brief One job's completion events: *\p arrp = [{event_id, topic,
 *        state ("pending", "sent" or "failed"), attempts, error, sent_at,
 *        failed_at}], oldest first (empty when it has none).
 * @returns Caller owns *\p arrp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_outbox_job(cq_store_t *store,
                                          const char *job_id,
                                          json_t **arrp);

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

/* ----------------------------------------------------------- checkpoint */

/*
 * Checkpoint writes are idempotent: the caller names each message's and
 * cell's seq (its key with the job), so a write retried after a lost
 * connection (its commit may have landed) is stored once. Retrying the
 * same seq with the same content is CQ_OK; other content at a stored seq
 * is CQ_ERR_FATAL (nothing is overwritten). Strings in documents may hold
 * any character, U+0000 included (stored escaped, see store_int.h and the
 * README "Storage" section); readers here return them unescaped.
 */

/**
 * @brief Store one conversation message (an OpenAI chat message object
 *        with a "role") at \p seq of the job, guarded by the lease.
 *        Retried once after a reconnect (safe: \p seq is its key).
 * @param seq From 1: the message's position in the conversation.
 * @param message Borrowed.
 * @param lostp (out) true when this owner no longer holds the lease:
 *        nothing was written.
 */
CQ_NODISCARD cq_err_t cq_store_append_message(cq_store_t *store,
                                              const char *job_id,
                                              int seq,
                                              const json_t *message,
                                              bool *lostp);

/**
 * @brief cq_store_append_message() and, in the same statement, what
 *        cq_store_record_usage() writes (\p usage: the job's totals, NULL:
 *        none), so an LLM reply and the usage of the call that made it are
 *        one checkpoint: stored together or not at all.
 * @param usage Borrowed; NULL writes the message alone.
 * @param cost_usd The job's cost so far; < 0: unknown.
 * @param run_budgetp (out, may be NULL) whether the job's run has a budget
 *        now, read in the same statement; false when the lease was lost or
 *        on error.
 */
CQ_NODISCARD cq_err_t cq_store_append_message_usage(cq_store_t *store,
                                                    const char *job_id,
                                                    int seq,
                                                    const json_t *message,
                                                    const cq_usage_t *usage,
                                                    double cost_usd,
                                                    bool *lostp,
                                                    bool *run_budgetp);

/**
 * @brief Record an executed cell at \p seq and rewrite the job's notebook,
 *        in one transaction guarded by the lease. Not retried here (a
 *        transaction): on CQ_ERR_RETRIABLE call it again with the same
 *        arguments.
 * @param seq From 1: the cell's position among the job's cells.
 * @param code, res, notebook Borrowed. \p notebook may be NULL.
 * @returns CQ_ERR_TOO_LARGE when the notebook exceeds the cap.
 */
CQ_NODISCARD cq_err_t cq_store_record_cell(cq_store_t *store,
                                           const char *job_id,
                                           int seq,
                                           const char *code,
                                           const cq_cell_result_t *res,
                                           const json_t *notebook,
                                           bool *lostp);

/**
 * @brief One turn's checkpoint in one statement (one round trip, one
 *        transaction): the cell that just ran with the notebook snapshot,
 *        as cq_store_record_cell() writes them (\p code NULL: no cell),
 *        then the messages of \p messages at seq \p first_seq onwards,
 *        and the usage as cq_store_append_message_usage() writes it:
 *        stored all together or not at all, so a turn killed half way
 *        leaves no cell without its tool message. Retry-safe like those:
 *        on CQ_ERR_RETRIABLE call it again with the same arguments.
 * @param cell_seq From 1, with \p code; ignored without it.
 * @param code, res, notebook Borrowed; \p notebook may be NULL.
 * @param messages Borrowed; an array of message objects, each with a
 *        "role" string, at least one.
 * @param usage Borrowed; NULL: none.
 * @param cost_usd The job's cost so far; < 0: unknown.
 * @param lostp (out) true when this owner no longer holds the lease:
 *        nothing was written.
 * @param run_budgetp (out, may be NULL) as for
 *        cq_store_append_message_usage().
 * @returns CQ_ERR_TOO_LARGE when the notebook exceeds the cap (nothing
 *          written).
 */
CQ_NODISCARD cq_err_t cq_store_checkpoint_turn(cq_store_t *store,
                                               const char *job_id,
                                               int cell_seq,
                                               const char *code,
                                               const cq_cell_result_t *res,
                                               const json_t *notebook,
                                               int first_seq,
                                               const json_t *messages,
                                               const cq_usage_t *usage,
                                               double cost_usd,
                                               bool *lostp,
                                               bool *run_budgetp);

/** @brief What a resumed job starts from. Release with
 *         cq_checkpoint_release(). */
typedef struct cq_checkpoint {
        json_t *messages;     /* array of message objects in seq order */
        json_t *cells;        /* array of {"seq","code","status",
                                 "execution_count","outputs"} of the cells
                                 that ran to the end (status ok or error: a
                                 failed cell may have set state), in seq
                                 order */
        json_t *notebook;     /* the last notebook, or NULL */
        int last_message_seq; /* highest stored seq, 0 for none */
        int last_cell_seq;    /* highest stored cell seq (all statuses) */
} cq_checkpoint_t;

void cq_checkpoint_init(cq_checkpoint_t *cp);
void cq_checkpoint_release(cq_checkpoint_t *cp);

/** @brief Load a job's checkpoint (empty arrays when it has none). */
CQ_NODISCARD cq_err_t cq_store_load_checkpoint(cq_store_t *store,
                                               const char *job_id,
                                               cq_checkpoint_t *cp);

/* ------------------------------------------------------------ artefacts */

/** @brief One stored image. Release with cq_image_release(). */
typedef struct cq_image {
        char sha256[65];
        char *name;
        char *mime;
        int cell_seq; /* 0 when not from a cell */
        unsigned char *data;
        size_t len;
} cq_image_t;

typedef struct cq_images {
        cq_image_t *v;
        size_t n;
} cq_images_t;

void cq_images_init(cq_images_t *images);
void cq_images_release(cq_images_t *images);

/**
 * @brief Store an image of a job; the same bytes twice in one job are kept
 *        once (unique sha256 per job).
 * @param data Borrowed, \p len bytes (any bytes, NUL included).
 * @param cell_seq The cell that produced it, or 0.
 * @param sha256 (out, optional) 65 bytes: the hex digest.
 * @param createdp (out, optional) false when it was already stored.
 * @returns CQ_ERR_TOO_LARGE over the image cap.
 */
CQ_NODISCARD cq_err_t cq_store_put_image(cq_store_t *store,
                                         const char *job_id,
                                         const char *name,
                                         const char *mime,
                                         const void *data,
                                         size_t len,
                                         int cell_seq,
                                         char *sha256,
                                         bool *createdp);

/** @brief All images of a job, in the order they were stored. */
CQ_NODISCARD cq_err_t cq_store_get_images(cq_store_t *store,
                                          const char *job_id,
                                          cq_images_t *images);

/* --------------------------------------------------------------- memory */

/**
 * @brief Remember a solved problem (once per job) in memory scope \p scope
 *        as solved by \p model. Only a job that named the scope may
 *        recall it (cq_store_recall()).
 * @param scope Required, 1..128 bytes.
 * @param model Required: the model whose conversation produced \p code.
 */
CQ_NODISCARD cq_err_t cq_store_remember(cq_store_t *store,
                                        const char *job_id,
                                        const char *scope,
                                        const char *model,
                                        const char *prompt,
                                        const char *code,
                                        const char *answer);

/** @brief A recalled solution. Release with cq_solution_release(). */
typedef struct cq_solution {
        char *job_id; /* may be NULL */
        char *prompt;
        char *code;
        char *answer; /* may be NULL */
        char *model;  /* the model that solved it; may be NULL */
        double similarity;
} cq_solution_t;

void cq_solution_init(cq_solution_t *sol);
void cq_solution_release(cq_solution_t *sol);

/**
 * @brief The most similar problem remembered in \p scope whose trigram
 *        similarity to \p prompt reaches the threshold.
 * @param scope Required: nothing outside it is ever returned.
 * @param model Only solutions of this model; NULL for any model.
 * @param threshold 0..1, or < 0 for the store's memory_threshold.
 * @param foundp (out) false when none is similar enough.
 */
CQ_NODISCARD cq_err_t cq_store_recall(cq_store_t *store,
                                      const char *scope,
                                      const char *model,
                                      const char *prompt,
                                      double threshold,
                                      cq_solution_t *sol,
                                      bool *foundp);

/* -------------------------------------------------------------- queries */

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

/* ----------------------------------------------------------- migrations */

/** @brief Called with each migration file name as it is applied. */
typedef void(cq_migrate_cb_t)(void *opaque, const char *name);

/**
 * @brief Apply the pending migrations of \p dir (NULL: CODERQ_MIGRATIONS_DIR
 *        default compiled in) to the database at \p dsn: NNNN_name.sql in
 *        version order, each in its own transaction, recorded with its
 *        SHA-256 in schema_migrations, serialised by an advisory lock. A
 *        file changed after it was applied is refused.
 * @param appliedp (out, optional) How many were applied now.
 * @returns CQ_OK; CQ_ERR_RETRIABLE when PostgreSQL is unreachable;
 *          CQ_ERR_FATAL for a refused or failed migration (\p errstr).
 * @locality Any thread; opens its own connection.
 */
CQ_NODISCARD cq_err_t cq_migrate_run(const char *dsn,
                                     const char *dir,
                                     cq_migrate_cb_t *cb,
                                     void *opaque,
                                     int *appliedp,
                                     char *errstr,
                                     size_t errstr_size);

/** @brief The compiled-in migrations directory. */
const char *cq_migrate_default_dir(void);

/* ------------------------------------------------------------ listener */

/** @brief The channel on which PostgreSQL announces claimable jobs; the
 *         payload is how many (migrations/0002_wakeups.sql). */
#define CQ_CHANNEL_JOBS "coderq_jobs"

/** @brief LISTEN on one channel over a connection of its own. */
typedef struct cq_listener cq_listener_t;

/**
 * @brief Connect and LISTEN on \p channel. An unreachable server is not
 *        an error here: cq_listener_wait() keeps trying.
 * @param opts Borrowed (dsn copied).
 * @returns Caller owns the returned value; free with
 *          cq_listener_destroy(). NULL only when out of memory.
 * @locality Then owned by one thread.
 */
cq_listener_t *cq_listener_new(const cq_store_opts_t *opts,
                               const char *channel,
                               char *errstr,
                               size_t errstr_size);

/**
 * @brief Wait up to \p timeout_ms for notifications.
 * @param reconnectedp (out) True when the connection was just
 *        re-established after a loss: notifications sent meanwhile are
 *        gone, so the caller should look for work at once.
 * @returns The sum of the payloads received (a payload that is not a
 *          positive number counts 1), 0 when none came, -1 while
 *          disconnected (reconnects with a backoff of 0.1 s doubling to
 *          5 s; the reason from cq_listener_errmsg()).
 */
long cq_listener_wait(cq_listener_t *l, int timeout_ms, bool *reconnectedp);

/** @brief Why the listener is disconnected ("" when connected). */
const char *cq_listener_errmsg(const cq_listener_t *l);

/** @brief Connections re-established so far. */
unsigned cq_listener_reconnects(const cq_listener_t *l);

void cq_listener_destroy(cq_listener_t **lp);

/* ---------------------------------------------------------------- probe */

/**
 * @brief The intake's count of queued jobs, over a connection of its own
 *        (application_name coderq-intake, a 2 s connect timeout), made on
 *        the first count and kept between counts. It never reconnects with
 *        backoff as a store handle does: a count that fails drops the
 *        connection and the next one connects again, so while PostgreSQL
 *        is down each check costs the intake's poll loop at most one
 *        connect timeout.
 */
typedef struct cq_backlog cq_backlog_t;

/**
 * @brief A counter for \p dsn (copied; NULL: libpq's PG* defaults); it
 *        does not connect yet.
 * @returns Caller owns the returned value; free with cq_backlog_destroy().
 *          NULL when out of memory.
 */
cq_backlog_t *cq_backlog_new(const char *dsn);

/**
 * @brief Count the queued jobs, at most \p limit (cheap with the queue's
 *        partial index: the count stops there).
 * @returns The count, or -1 when PostgreSQL could not be asked.
 * @locality The thread that owns \p bl.
 */
long cq_backlog_count(cq_backlog_t *bl, long limit);

void cq_backlog_destroy(cq_backlog_t **blp);

/** @brief The queue's sizes (cq_store_gauges()). */
typedef struct cq_store_gauges {
        long long queued;         /* jobs queued */
        long long outbox_pending; /* completion events not sent yet */
        long long outbox_failed;  /* completion events failed for good */
} cq_store_gauges_t;

/** Where cq_store_gauges() stops counting. */
#define CQ_STORE_GAUGE_MAX 1000000

/**
 * @brief Count queued jobs and pending and failed outbox rows, each up to
 *        CQ_STORE_GAUGE_MAX, in one statement over partial indexes.
 * @param gauges (out) Filled on CQ_OK.
 * @returns CQ_OK, or an error with cq_store_errmsg().
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_gauges(cq_store_t *store,
                                      cq_store_gauges_t *gauges);

/** @brief What cq_store_probe() learnt of the server. */
typedef struct cq_store_probe {
        char version[64];      /* server_version */
        char database[128];    /* current_database() */
        bool tls;              /* the connection is encrypted */
        char tls_protocol[32]; /* when tls; "" when libpq does not say */
        char tls_cipher[128];  /* when tls; "" when libpq does not say */
} cq_store_probe_t;

/**
 * @brief Connect once to \p dsn (NULL: libpq's PG* defaults) within
 *        \p connect_timeout_s seconds, with statement_timeout
 *        \p statement_timeout_ms and \p application_name (borrowed), ask
 *        the server's version and database, and disconnect: coderq
 *        doctor's check.
 * @param probe (out) Filled on success; zeroed first.
 * @returns 0, or -1 with \p errstr filled ("could not connect: <libpq's
 *          reason>", "could not run a query: <libpq's reason>"; libpq's
 *          reasons may span lines).
 * @locality Any thread.
 */
int cq_store_probe(const char *dsn,
                   int connect_timeout_s,
                   int statement_timeout_ms,
                   const char *application_name,
                   cq_store_probe_t *probe,
                   char *errstr,
                   size_t errstr_size);

/* --------------------------------------------------------------- report */

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

#endif
