/* SPDX-License-Identifier: MIT */
/* worker.c - the worker daemon. Threads: intake, relay, housekeeping and N
 * slots; the main thread waits for a signal and runs the shutdown. Each
 * slot owns its PostgreSQL connection, its LLM client and, while a job
 * runs, its interpreter; the producer and the kernel pool are shared.
 * Flags between threads are atomics; the only lock guards a slot's
 * current job id, which housekeeping reads. */
#include "coderq/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coderq/agent.h"
#include "coderq/backend.h"
#include "coderq/kafka.h"
#include "coderq/llm.h"
#include "coderq/log.h"
#include "coderq/notebook.h"
#include "coderq/prices.h"
#include "coderq/store.h"
#include "coderq/util.h"

#define SESSION_DEPTH_MAX 32
#define WRITE_ATTEMPTS    6

typedef struct slot {
        struct cq_worker *w;
        int index;
        pthread_t thread;
        bool started;
        pthread_mutex_t lock; /* guards job_id and busy */
        char job_id[CQ_JOB_ID_MAX + 1];
        bool busy;
        atomic_int cancel;      /* interrupt the running job */
        atomic_int user_cancel; /* ... because a cancel was requested */
        atomic_int lost;        /* ... because the lease is gone */
        cq_store_t *store;
        cq_llm_t *llm;
        unsigned int rng; /* rand_r() state: jitter of retry waits */
} slot_t;

struct cq_worker {
        const cq_config_t *cfg;
        cq_worker_opts_t opts;
        char id[192];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_llm_conf_t lconf;
        cq_llm_limiter_t *limiter; /* shared by the slots' LLM clients */
        cq_prices_t *prices;       /* CODERQ_PRICES_FILE; NULL: none */
        cq_backend_t *backend;
        cq_producer_t *prod;
        cq_intake_t *intake;
        cq_relay_t *relay;
        cq_events_t *events;
        pthread_t intake_thr, relay_thr, hk_thr, listen_thr;
        bool intake_started, relay_started, hk_started, listen_started;
        int intake_rc;
        atomic_bool intake_auth; /* the intake stopped: Kafka refused it */
        char errmsg[640];        /* why cq_worker_run() returned 1 */
        atomic_int stop_intake, stop_relay, stop_claims, stop_jobs, stop_hk;
        slot_t *slots;
        /* Idle slots wait here between claims. The listener adds a token
         * per claimable job PostgreSQL announces and wakes that many; it
         * also keeps the fallback poll, one look per CODERQ_POLL_MS for
         * the whole worker (a poll token), which a slot that finds a job
         * with it passes on. Without a listener thread, idle slots poll
         * by themselves. */
        pthread_mutex_t idle_lock;
        pthread_cond_t idle_cond;
        long idle_tokens, poll_tokens, idle_waiting;
        bool poll_pending;     /* the poll found tokens: the next is its */
        atomic_bool listening; /* listener up: it polls, slots need not */
        atomic_ullong wakeups; /* jobs announced to this worker */
        atomic_ullong claims, claims_empty;
};

void cq_worker_opts_from_config(cq_worker_opts_t *opts, const cq_config_t *cfg)
{
        memset(opts, 0, sizeof(*opts));
        opts->intake = true;
        opts->relay = true;
        opts->events = true;
        opts->slots = cfg->slots;
        opts->shutdown_s = cfg->shutdown_s;
}

/* Sleep up to \p ms, waking early when *flag is raised. */
static void nap(int64_t ms, const atomic_int *flag)
{
        int64_t end = cq_now_ms() + ms;

        while (!(flag && atomic_load(flag))) {
                int64_t left = end - cq_now_ms();
                struct timespec ts;

                if (left <= 0)
                        return;
                if (left > 50)
                        left = 50;
                ts.tv_sec = 0;
                ts.tv_nsec = (long)left * 1000000L;
                nanosleep(&ts, NULL);
        }
}

/* A store for the calling thread, retrying until it connects or \p stop. */
static cq_store_t *
connect_store(cq_worker_t *w, const atomic_int *stop, const char *who)
{
        int64_t backoff = 200;

        while (!atomic_load(stop)) {
                char errstr[512];
                cq_store_t *store =
                    cq_store_new(&w->sopts, errstr, sizeof(errstr));

                if (store)
                        return store;
                cq_log_kv(CQ_LOG_WARN, "could not connect to PostgreSQL",
                          "thread", who, "error", errstr, NULL);
                nap(backoff, stop);
                if (backoff < 5000)
                        backoff *= 2;
        }
        return NULL;
}

/* ------------------------------------------------------------ one job */

typedef struct job_ctx {
        slot_t *slot;
        const cq_job_t *job;
        cq_nb_t *nb;
        int next_cell_seq; /* seq of the next cell checkpoint */
        /* The first checkpoint write that failed: CQ_ERR_RETRIABLE gives
         * the job back to the queue; anything else (the store refused the
         * data) fails the job, since running it again would fail the
         * same way. */
        cq_err_t ckpt_err;
        char ckpt_errmsg[1024];
} job_ctx_t;

/* Bounded retries of a checkpoint write whose failure is transient (the
 * store reconnects underneath; every write is idempotent, so one whose
 * commit landed unseen is not stored twice): up to WRITE_ATTEMPTS, 100 ms
 * apart doubling. */
typedef struct write_retry {
        int attempts;
        int64_t backoff_ms;
} write_retry_t;

static void write_retry_init(write_retry_t *r)
{
        r->attempts = 0;
        r->backoff_ms = 100;
}

/* Whether to try again after a write that returned \p err; naps first. */
static bool write_again(write_retry_t *r, cq_err_t err)
{
        if (err != CQ_ERR_RETRIABLE || ++r->attempts >= WRITE_ATTEMPTS)
                return false;
        nap(r->backoff_ms, NULL);
        r->backoff_ms *= 2;
        return true;
}

/* An observer's verdict on a checkpoint write: 0 to go on; -1 stops the
 * job (the write failed, or the lease is gone and the slot says so). */
static int
checkpointed(job_ctx_t *ctx, cq_err_t err, bool lost, const char *what)
{
        if (err != CQ_OK) {
                cq_log_kv(CQ_LOG_ERROR, what, "job_id", ctx->job->job_id,
                          "error", cq_store_errmsg(ctx->slot->store), NULL);
                if (ctx->ckpt_err == CQ_OK) {
                        const char *msg = cq_store_errmsg(ctx->slot->store);

                        /* The first line: PostgreSQL's DETAIL may quote
                         * the whole refused row. */
                        ctx->ckpt_err = err;
                        snprintf(ctx->ckpt_errmsg, sizeof(ctx->ckpt_errmsg),
                                 "%s: %.*s", what, (int)strcspn(msg, "\n"),
                                 msg);
                }
                return -1;
        }
        if (lost) {
                atomic_store(&ctx->slot->lost, 1);
                return -1;
        }
        return 0;
}

static int obs_message(void *opaque, size_t index, const json_t *msg)
{
        job_ctx_t *ctx = opaque;
        slot_t *slot = ctx->slot;
        write_retry_t retry;
        bool lost = false;
        cq_err_t err;

        /* The history is the job's stored conversation plus what follows:
         * the message at index i is seq i + 1. */
        write_retry_init(&retry);
        do {
                err = cq_store_append_message(slot->store, ctx->job->job_id,
                                              (int)index + 1, msg, &lost);
        } while (write_again(&retry, err));
        return checkpointed(ctx, err, lost, "could not checkpoint a message");
}

static int obs_cell(void *opaque, const char *code, const cq_cell_result_t *res)
{
        job_ctx_t *ctx = opaque;
        slot_t *slot = ctx->slot;
        const json_t *doc = ctx->nb ? cq_nb_json(ctx->nb) : NULL;
        write_retry_t retry;
        bool lost = false;
        cq_err_t err;

        write_retry_init(&retry);
        do {
                err = cq_store_record_cell(slot->store, ctx->job->job_id,
                                           ctx->next_cell_seq, code, res, doc,
                                           &lost);
        } while (write_again(&retry, err));
        if (err == CQ_ERR_TOO_LARGE) {
                /* The cell matters more than the notebook snapshot: the
                 * final notebook is checked against the cap again. */
                cq_log_kv(CQ_LOG_WARN,
                          "notebook over the cap; cell stored without it",
                          "job_id", ctx->job->job_id, NULL);
                write_retry_init(&retry);
                do {
                        err = cq_store_record_cell(
                            slot->store, ctx->job->job_id, ctx->next_cell_seq,
                            code, res, NULL, &lost);
                } while (write_again(&retry, err));
        }
        if (err == CQ_OK && !lost)
                ctx->next_cell_seq++;
        return checkpointed(ctx, err, lost, "could not checkpoint a cell");
}

/* The count is what a resumed job starts from. A failed write leaves the
 * stored count behind until the next one (it matters only if the job is
 * resumed before that), so it does not stop the job; a lost lease does. */
static int obs_retry(void *opaque, long retries)
{
        job_ctx_t *ctx = opaque;
        bool lost = false;

        if (cq_store_set_retries(ctx->slot->store, ctx->job->job_id, retries,
                                 &lost) != CQ_OK) {
                cq_log_kv(CQ_LOG_WARN, "could not record the retry count",
                          "job_id", ctx->job->job_id, "error",
                          cq_store_errmsg(ctx->slot->store), NULL);
                return 0;
        }
        return checkpointed(ctx, CQ_OK, lost,
                            "could not record the retry "
                            "count");
}

static void obs_event(void *opaque, const char *type, const json_t *data)
{
        job_ctx_t *ctx = opaque;

        if (ctx->slot->w->events)
                (void)cq_events_publish(ctx->slot->w->events, ctx->job->job_id,
                                        type, data);
}

/* The memory scope of \p job: its own, else the worker's default; NULL
 * when it has none (then it neither recalls nor is remembered). */
static const char *memory_scope(const cq_worker_t *w, const cq_job_t *job)
{
        if (job->memory.scope)
                return job->memory.scope;
        if (w->cfg->memory_scope && *w->cfg->memory_scope)
                return w->cfg->memory_scope;
        return NULL;
}

/* The model that answers \p job. */
static const char *job_model(const cq_worker_t *w, const cq_job_t *job)
{
        return job->model ? job->model : w->cfg->llm_model;
}

/* The job's usage after each LLM call: limits and the run's budget read
 * it, so it is written like a checkpoint (a failed write stops the job,
 * which goes back to the queue). */
static int obs_usage(void *opaque, const cq_usage_t *total, double cost_usd)
{
        job_ctx_t *ctx = opaque;
        write_retry_t retry;
        bool lost = false;
        cq_err_t err;

        write_retry_init(&retry);
        do {
                err = cq_store_record_usage(ctx->slot->store, ctx->job->job_id,
                                            total, cost_usd, &lost);
        } while (write_again(&retry, err));
        return checkpointed(ctx, err, lost, "could not record the LLM usage");
}

/* Hold the next call's estimate against the run's budget. */
static int
obs_reserve(void *opaque, double estimate_usd, char *why, size_t why_size)
{
        job_ctx_t *ctx = opaque;
        cq_budget_t b;
        cq_err_t err;

        /* a job of no run has no run budget: no round trip */
        if (!ctx->job->run_id)
                return 0;
        err = cq_store_budget_reserve(ctx->slot->store, ctx->job->job_id,
                                      estimate_usd, &b);
        if (err != CQ_OK)
                return checkpointed(ctx, err, false,
                                    "could not hold the run's budget");
        switch (b.outcome) {
        case CQ_BUDGET_NONE:
        case CQ_BUDGET_HELD:
                return 0;
        case CQ_BUDGET_LOST:
                return checkpointed(ctx, CQ_OK, true, "");
        case CQ_BUDGET_UNKNOWN:
                if (estimate_usd < 0)
                        snprintf(why, why_size,
                                 "run \"%s\" has a budget of $%g but the cost "
                                 "of this job's calls is unknown (model %s "
                                 "has no price%s)",
                                 ctx->job->run_id, b.budget_usd,
                                 job_model(ctx->slot->w, ctx->job),
                                 ctx->slot->w->prices
                                     ? " in CODERQ_PRICES_FILE"
                                     : ": CODERQ_PRICES_FILE is unset");
                else
                        snprintf(why, why_size,
                                 "run \"%s\" has a budget of $%g but the "
                                 "cost of some of its jobs is unknown, so "
                                 "what it spent cannot be known",
                                 ctx->job->run_id, b.budget_usd);
                return 1;
        case CQ_BUDGET_OVER:
                snprintf(why, why_size,
                         "the next LLM call could cost up to $%.6f, which "
                         "would cross the budget of run \"%s\", $%g ($%.6f "
                         "spent, $%.6f held by calls in flight)",
                         estimate_usd, ctx->job->run_id, b.budget_usd,
                         b.spent_usd, b.held_usd);
                return 1;
        }
        return 1;
}

static int
mem_lookup(void *opaque, const char *prompt, cq_agent_recall_t *recall)
{
        job_ctx_t *ctx = opaque;
        const cq_worker_t *w = ctx->slot->w;
        const char *scope = memory_scope(w, ctx->job);
        cq_solution_t sol;
        bool found = false;
        int rc = -1;

        if (!scope)
                return 0;
        cq_solution_init(&sol);
        if (cq_store_recall(
                ctx->slot->store, scope,
                ctx->job->memory.cross_model ? NULL : job_model(w, ctx->job),
                prompt, -1, &sol, &found) != CQ_OK)
                goto out;
        rc = 0;
        if (!found || !sol.code)
                goto out;
        cq_log_kv(CQ_LOG_INFO, "recalled a similar solved problem", "job_id",
                  ctx->job->job_id, "from", sol.job_id, "scope", scope, NULL);
        recall->code = sol.code;
        recall->source_job = sol.job_id;
        recall->model = sol.model;
        recall->similarity = sol.similarity;
        recall->scope = strdup(scope);
        sol.code = sol.job_id = sol.model = NULL; /* recall owns them now */
        if (!recall->scope)
                rc = -1;
out:
        cq_solution_release(&sol);
        return rc;
}

/* A new interpreter for tests that run in a fresh one. */
static cq_interp_t *slot_new_interp(void *opaque,
                                    const char *backend,
                                    char *errstr,
                                    size_t errstr_size)
{
        slot_t *slot = opaque;
        cq_interp_t *interp = NULL;

        if (cq_backend_acquire(slot->w->backend, backend,
                               slot->w->cfg->kernel_startup_timeout_s * 1000,
                               &interp, errstr, errstr_size) != CQ_OK)
                return NULL;
        return interp;
}

static void
publish(slot_t *slot, const char *job_id, const char *type, json_t *data)
{
        if (slot->w->events && data)
                (void)cq_events_publish(slot->w->events, job_id, type, data);
        json_decref(data);
}

/* The successful cells of the session's ancestors, oldest first, and the
 * parent's conversation. On failure \p errstr says why. */
static cq_err_t load_session(slot_t *slot,
                             const cq_job_t *job,
                             json_t *cells,
                             json_t **historyp,
                             char *errstr,
                             size_t errstr_size)
{
        char id[CQ_JOB_ID_MAX + 1];
        json_t *chain = json_array();
        int depth;
        size_t i;
        cq_err_t err = CQ_ERR_RETRIABLE; /* out of memory may pass */

        snprintf(errstr, errstr_size, "out of memory");
        if (!chain)
                return CQ_ERR_RETRIABLE;
        snprintf(id, sizeof(id), "%s", job->parent_job_id);
        for (depth = 0; id[0] && depth < SESSION_DEPTH_MAX; depth++) {
                cq_checkpoint_t cp;
                json_t *row = NULL;
                const char *parent;

                cq_checkpoint_init(&cp);
                err = cq_store_load_checkpoint(slot->store, id, &cp);
                if (err != CQ_OK) {
                        snprintf(errstr, errstr_size, "%s",
                                 cq_store_errmsg(slot->store));
                        cq_checkpoint_release(&cp);
                        goto out;
                }
                if (depth == 0) {
                        *historyp = json_incref(cp.messages);
                }
                /* prepend: ancestors run first */
                if (json_array_insert(chain, 0, cp.cells) != 0) {
                        cq_checkpoint_release(&cp);
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                }
                cq_checkpoint_release(&cp);
                err = cq_store_job_status(slot->store, id, &row);
                if (err != CQ_OK) {
                        snprintf(errstr, errstr_size, "%s",
                                 cq_store_errmsg(slot->store));
                        goto out;
                }
                parent =
                    json_string_value(json_object_get(row, "parent_job_id"));
                snprintf(id, sizeof(id), "%s", parent ? parent : "");
                json_decref(row);
        }
        for (i = 0; i < json_array_size(chain); i++) {
                json_t *list = json_array_get(chain, i), *cell;
                size_t k;

                json_array_foreach(list, k, cell)
                {
                        json_t *code = json_object_get(cell, "code");

                        if (json_is_string(code) &&
                            json_array_append(cells, code) != 0) {
                                err = CQ_ERR_RETRIABLE;
                                goto out;
                        }
                }
        }
        err = CQ_OK;
out:
        json_decref(chain);
        return err;
}

static void append_codes(json_t *cells, const json_t *cp_cells)
{
        size_t i;
        json_t *cell;

        json_array_foreach(cp_cells, i, cell)
        {
                json_t *code = json_object_get(cell, "code");

                if (json_is_string(code))
                        json_array_append(cells, code);
        }
}

/* What the job ran with, for its result (README "Reproducibility"):
 * the agent's record, or, for a job that never reached the agent, what
 * is known without it. NULL when out of memory. */
static json_t *repro_record(const slot_t *slot,
                            const cq_job_t *job,
                            const cq_agent_result_t *res)
{
        const char *backend =
            job->backend ? job->backend : slot->w->cfg->backend;

        if (res->repro)
                return json_incref(res->repro);
        return json_pack("{s:s, s:s, s:s?}", "model", job_model(slot->w, job),
                         "coderq_version", CQ_VERSION, "backend", backend);
}

/* Store the images, then the result, notebook and outbox row. */
static void finish_job(slot_t *slot,
                       const cq_job_t *job,
                       int attempt,
                       const char *sandbox,
                       const cq_nb_t *nb,
                       const cq_agent_result_t *res)
{
        cq_finish_t fin;
        json_t *report, *repro;
        write_retry_t retry;
        bool lost = false;
        size_t i;
        cq_err_t err;
        const char *status = res->status == CQ_AGENT_SUCCEEDED   ? "succeeded"
                             : res->status == CQ_AGENT_CANCELLED ? "cancelled"
                                                                 : "failed";

        for (i = 0; i < res->images.n; i++) {
                const cq_file_t *img = &res->images.v[i];

                err = cq_store_put_image(slot->store, job->job_id, img->name,
                                         img->mime, img->data, img->len, 0,
                                         NULL, NULL);
                if (err != CQ_OK)
                        cq_log_kv(CQ_LOG_WARN, "could not store an image",
                                  "job_id", job->job_id, "image", img->name,
                                  "error", cq_store_errmsg(slot->store), NULL);
        }
        repro = repro_record(slot, job, res);
        report = json_pack(
            "{s:b, s:s?, s:s?, s:I, s:I, s:O?, s:s?, s:i, s:s?, s:o*}",
            "from_memory", res->from_memory, "memory_source_job",
            res->memory_source_job, "memory_scope",
            res->memory_source_job ? memory_scope(slot->w, job) : NULL, "cells",
            (json_int_t)res->cells, "duration_ms", (json_int_t)res->duration_ms,
            "tests", res->tests, "last_error", res->last_error, "attempt",
            attempt, "sandbox", sandbox, "repro", repro);
        memset(&fin, 0, sizeof(fin));
        fin.job_id = job->job_id;
        fin.status = status;
        fin.reason = res->reason;
        fin.reason_code = res->reason_code;
        fin.answer = res->answer;
        fin.tests_passed = res->tests_total >= 0 ? res->tests_passed : -1;
        fin.tests_total = res->tests_total >= 0 ? res->tests_total : 0;
        fin.turns = (int)res->turns;
        fin.retries = (int)res->retries;
        fin.prompt_tokens = res->prompt_tokens;
        fin.completion_tokens = res->completion_tokens;
        fin.cache_read_tokens = res->cache_read_tokens;
        fin.cache_creation_tokens = res->cache_creation_tokens;
        fin.cost_usd = res->cost_usd;
        fin.notebook = nb ? cq_nb_json(nb) : NULL;
        fin.report = report;
        write_retry_init(&retry);
        do {
                err = cq_store_finish(slot->store, &fin, &lost);
        } while (write_again(&retry, err));
        if ((err == CQ_ERR_TOO_LARGE || err == CQ_ERR_FATAL) && fin.notebook) {
                /* The notebook is the likeliest culprit and the least
                 * needed part: the cells are stored already. */
                cq_log_kv(CQ_LOG_WARN,
                          "final notebook refused; finishing without it",
                          "job_id", job->job_id, "error",
                          cq_store_errmsg(slot->store), NULL);
                fin.notebook = NULL;
                write_retry_init(&retry);
                do {
                        err = cq_store_finish(slot->store, &fin, &lost);
                } while (write_again(&retry, err));
        }
        json_decref(report);
        if (err != CQ_OK) {
                cq_log_kv(CQ_LOG_ERROR,
                          "could not finish job; its lease "
                          "will expire and it will run again",
                          "job_id", job->job_id, "error",
                          cq_store_errmsg(slot->store), NULL);
                return;
        }
        if (lost) {
                cq_log_kv(CQ_LOG_WARN,
                          "lease lost before finishing; "
                          "another worker owns the job",
                          "job_id", job->job_id, NULL);
                return;
        }
        cq_log_kv(CQ_LOG_INFO, "job finished", "job_id", job->job_id, "status",
                  status, "reason", res->reason, NULL);
        /* Its completion event is in the outbox: send it now. */
        if (slot->w->relay)
                cq_relay_kick(slot->w->relay);
        publish(
            slot, job->job_id, "job.finished",
            json_pack(
                "{s:s, s:s?, s:s?, s:I, s:I, s:b, s:s?, s:o}", "status", status,
                "reason", res->reason, "reason_code", res->reason_code, "turns",
                (json_int_t)res->turns, "duration_ms",
                (json_int_t)res->duration_ms, "from_memory", res->from_memory,
                "memory_source_job", res->memory_source_job, "cost_usd",
                res->cost_usd >= 0 ? json_real(res->cost_usd) : json_null()));
        if (res->status == CQ_AGENT_SUCCEEDED && !res->from_memory &&
            job->memory.remember && memory_scope(slot->w, job) &&
            res->solution && *res->solution &&
            cq_store_remember(slot->store, job->job_id,
                              memory_scope(slot->w, job),
                              job_model(slot->w, job), job->prompt,
                              res->solution, res->answer) != CQ_OK)
                cq_log_kv(CQ_LOG_WARN, "could not remember the solution",
                          "job_id", job->job_id, "error",
                          cq_store_errmsg(slot->store), NULL);
}

/* Give the job back to the queue (shutdown) or leave it (lease lost). */
static void give_back(slot_t *slot, const char *job_id)
{
        if (atomic_load(&slot->lost)) {
                cq_log_kv(CQ_LOG_WARN, "lease lost; job left to its new owner",
                          "job_id", job_id, NULL);
                return;
        }
        if (cq_store_release(slot->store, job_id) != CQ_OK)
                cq_log_kv(CQ_LOG_WARN,
                          "could not release job; its lease will expire",
                          "job_id", job_id, "error",
                          cq_store_errmsg(slot->store), NULL);
        else
                cq_log_kv(CQ_LOG_INFO, "job released at a checkpoint", "job_id",
                          job_id, NULL);
}

static void cannot_run(slot_t *slot,
                       const cq_claim_t *claim,
                       const cq_job_t *job,
                       cq_err_t err,
                       const char *code,
                       const char *fmt,
                       ...) CQ_PRINTF(6, 7);

/* The job cannot run on this claim. An error that trying again cannot fix
 * fails it now with the reason. A passing one puts it back in the queue:
 * the attempt counts, and it waits CODERQ_REQUEUE_DELAY_MS doubled with
 * each attempt (capped, jittered) before it is claimed again; at its last
 * attempt it fails, naming the last error. A release that counted nothing
 * and waited for nothing would be claimed again at once, forever.
 * \p code is the reason code of a failure now ("attempts" when the last
 * attempt gives up). */
static void cannot_run(slot_t *slot,
                       const cq_claim_t *claim,
                       const cq_job_t *job,
                       cq_err_t err,
                       const char *code,
                       const char *fmt,
                       ...)
{
        const cq_config_t *cfg = slot->w->cfg;
        cq_agent_result_t res;
        char why[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        cq_log_kv(CQ_LOG_ERROR, "job cannot run", "job_id", job->job_id,
                  "error", why, NULL);
        if (atomic_load(&slot->lost)) {
                cq_log_kv(CQ_LOG_WARN, "lease lost; job left to its new owner",
                          "job_id", job->job_id, NULL);
                return;
        }
        if (err == CQ_ERR_RETRIABLE && claim->attempt < claim->max_attempts) {
                int64_t delay = cq_backoff_ms(
                    claim->attempt, cfg->requeue_delay_ms,
                    (int64_t)cfg->requeue_delay_max_s * 1000, &slot->rng);
                json_t *fields;

                if (cq_store_retry_later(slot->store, job->job_id, why,
                                         delay) != CQ_OK) {
                        cq_log_kv(CQ_LOG_WARN,
                                  "could not put the job back; its lease "
                                  "will expire",
                                  "job_id", job->job_id, "error",
                                  cq_store_errmsg(slot->store), NULL);
                        return;
                }
                fields = json_pack("{s:s, s:i, s:i, s:I}", "job_id",
                                   job->job_id, "attempt", claim->attempt,
                                   "max_attempts", claim->max_attempts,
                                   "retry_in_ms", (json_int_t)delay);
                cq_log_json(CQ_LOG_INFO, fields, "job put back for later");
                json_decref(fields);
                return;
        }
        cq_agent_result_init(&res);
        res.status = CQ_AGENT_FAILED;
        res.retries = claim->retries;
        res.last_error = strdup(why);
        /* What earlier attempts spent stays the job's. */
        res.prompt_tokens = claim->usage.prompt_tokens;
        res.completion_tokens = claim->usage.completion_tokens;
        res.cache_read_tokens = claim->usage.cache_read_tokens;
        res.cache_creation_tokens = claim->usage.cache_creation_tokens;
        res.cost_usd = claim->cost_usd;
        if (err == CQ_ERR_RETRIABLE) {
                res.reason_code = "attempts";
                if (asprintf(&res.reason, "gave up after %d attempts: %s",
                             claim->attempt, why) < 0)
                        res.reason = NULL;
        } else {
                res.reason_code = code;
                res.reason = strdup(why);
        }
        finish_job(slot, job, claim->attempt, NULL, NULL, &res);
        cq_agent_result_release(&res);
}

static long count_role(const json_t *history, const char *role)
{
        size_t i;
        long n = 0;

        for (i = 0; i < json_array_size(history); i++) {
                const char *r = json_string_value(
                    json_object_get(json_array_get(history, i), "role"));

                if (r && strcmp(r, role) == 0)
                        n++;
        }
        return n;
}

static void run_job(slot_t *slot, cq_claim_t *claim)
{
        cq_worker_t *w = slot->w;
        cq_job_t job;
        cq_checkpoint_t cp;
        cq_agent_start_t start = {0};
        cq_agent_opts_t opts;
        cq_agent_observer_t obs = {0};
        cq_agent_memory_t mem = {0};
        cq_agent_result_t res;
        cq_interp_t *interp = NULL;
        cq_nb_t *nb = NULL;
        json_t *cells = json_array(), *history = NULL;
        job_ctx_t ctx;
        const char *sandbox = NULL;
        char errstr[1024];
        int64_t claimed_ms = cq_now_ms();
        cq_err_t err;

        cq_job_init(&job);
        cq_checkpoint_init(&cp);
        cq_agent_result_init(&res);
        memset(&ctx, 0, sizeof(ctx));
        pthread_mutex_lock(&slot->lock);
        snprintf(slot->job_id, sizeof(slot->job_id), "%s", claim->job_id);
        slot->busy = true;
        pthread_mutex_unlock(&slot->lock);
        atomic_store(&slot->cancel, 0);
        atomic_store(&slot->user_cancel, 0);
        atomic_store(&slot->lost, 0);
        cq_log_kv(CQ_LOG_INFO, "job claimed", "job_id", claim->job_id, "worker",
                  w->id, NULL);
        publish(slot, claim->job_id, "job.claimed",
                json_pack("{s:s, s:i, s:b}", "worker", w->id, "attempt",
                          claim->attempt, "resumed", claim->has_checkpoint));
        if (cq_job_from_json(claim->spec, &job, errstr, sizeof(errstr)) !=
            CQ_OK) {
                /* The intake validated it; a spec that no longer parses
                 * (an older or newer schema) fails the job, clearly. */
                cq_job_t bare;

                cq_job_init(&bare);
                bare.job_id = claim->job_id;
                res.status = CQ_AGENT_FAILED;
                res.reason = strdup(errstr);
                res.reason_code = "invalid_job";
                res.prompt_tokens = claim->usage.prompt_tokens;
                res.completion_tokens = claim->usage.completion_tokens;
                res.cost_usd = claim->cost_usd;
                finish_job(slot, &bare, claim->attempt, NULL, NULL, &res);
                goto out;
        }
        if (!cells)
                goto out;
        memset(&ctx, 0, sizeof(ctx));
        if (claim->has_checkpoint) {
                err = cq_store_load_checkpoint(slot->store, job.job_id, &cp);
                if (err != CQ_OK) {
                        cannot_run(slot, claim, &job, err, "storage",
                                   "could not load its checkpoint: %s",
                                   cq_store_errmsg(slot->store));
                        goto out;
                }
        }
        if (job.parent_job_id) {
                err = load_session(slot, &job, cells, &history, errstr,
                                   sizeof(errstr));
                if (err != CQ_OK) {
                        cannot_run(slot, claim, &job, err, "storage",
                                   "could not load the parent session: %s",
                                   errstr);
                        goto out;
                }
        }
        if (claim->has_checkpoint && json_array_size(cp.messages) > 0) {
                append_codes(cells, cp.cells);
                start.history = cp.messages;
                start.cells = cells;
                start.continue_job = true;
                /* A session's history begins with the parent's turns. */
                start.turns_done = count_role(cp.messages, "assistant") -
                                   count_role(history, "assistant");
                start.retries_done = claim->retries;
        } else if (job.parent_job_id) {
                start.history = history;
                start.cells = cells;
        }
        err = cq_backend_acquire_job(
            w->backend, job.backend, w->cfg->kernel_startup_timeout_s * 1000,
            job.job_id, claim->attempt, &interp, errstr, sizeof(errstr));
        if (err != CQ_OK) {
                cannot_run(slot, claim, &job, err, "interpreter",
                           "could not get an interpreter: %s", errstr);
                goto out;
        }
        sandbox = cq_backend_sandbox_mode(w->backend, interp);
        if (cq_backend_unsandboxed(w->backend, interp))
                cq_log_kv(CQ_LOG_WARN,
                          "job runs UNSANDBOXED, as the worker's user",
                          "job_id", job.job_id, "sandbox", sandbox, NULL);
        if (cp.notebook)
                nb = cq_nb_from_json(cp.notebook, errstr, sizeof(errstr));
        if (!nb)
                nb = cq_nb_new(cq_interp_language_info(interp));
        ctx.slot = slot;
        ctx.job = &job;
        ctx.nb = nb;
        ctx.next_cell_seq = cp.last_cell_seq + 1;
        ctx.ckpt_err = CQ_OK;
        obs.on_message = obs_message;
        obs.on_cell = obs_cell;
        obs.on_event = obs_event;
        obs.on_retry = obs_retry;
        obs.on_usage = obs_usage;
        obs.reserve = obs_reserve;
        obs.opaque = &ctx;
        mem.lookup = mem_lookup;
        mem.opaque = &ctx;
        cq_agent_opts_from_config(&opts, w->cfg);
        opts.cancel = &slot->cancel;
        opts.stop = &w->stop_jobs;
        opts.new_interp = slot_new_interp;
        opts.new_interp_opaque = slot;
        opts.prices = w->prices;
        /* Limits hold over the whole job: what the earlier attempts
         * spent counts. */
        start.usage_done = claim->usage;
        start.cost_done_usd = claim->cost_usd;
        /* Limits hold over the whole job: this attempt so far, and the
         * running time of the earlier ones. */
        start.elapsed_ms = claim->run_ms + (cq_now_ms() - claimed_ms);
        /* Memory only inside a scope the job (or the worker) names. */
        if (cq_agent_run(&job, interp, slot->llm, &opts, &obs,
                         job.memory.recall && memory_scope(w, &job) ? &mem
                                                                    : NULL,
                         &start, nb, &res) != CQ_OK) {
                cannot_run(slot, claim, &job, CQ_ERR_RETRIABLE, "internal",
                           "the agent could not run: out of memory");
                goto out;
        }
        if (ctx.ckpt_err != CQ_OK && ctx.ckpt_err != CQ_ERR_RETRIABLE &&
            !atomic_load(&slot->lost)) {
                /* The store refused what the job produced: another run
                 * would produce and be refused the same, so the job fails
                 * saying why instead of going back to the queue. */
                res.status = CQ_AGENT_FAILED;
                free(res.reason);
                res.reason = strdup(ctx.ckpt_errmsg);
                res.reason_code = "storage";
                finish_job(slot, &job, claim->attempt, sandbox, nb, &res);
                goto out;
        }
        if (res.status == CQ_AGENT_ABORTED ||
            (res.status == CQ_AGENT_CANCELLED &&
             !atomic_load(&slot->user_cancel)) ||
            atomic_load(&slot->lost)) {
                /* A shutdown gives the job back as it is; a checkpoint
                 * that could not be written is a failed try. */
                if (ctx.ckpt_err != CQ_OK && !atomic_load(&slot->lost))
                        cannot_run(slot, claim, &job, CQ_ERR_RETRIABLE,
                                   "storage", "%s", ctx.ckpt_errmsg);
                else
                        give_back(slot, job.job_id);
                goto out;
        }
        if (res.status == CQ_AGENT_CANCELLED) {
                free(res.reason);
                res.reason = strdup("cancelled by request");
        }
        finish_job(slot, &job, claim->attempt, sandbox, nb, &res);
out:
        cq_interp_destroy(&interp);
        cq_nb_destroy(&nb);
        cq_agent_result_release(&res);
        cq_checkpoint_release(&cp);
        json_decref(cells);
        json_decref(history);
        cq_job_release(&job);
        pthread_mutex_lock(&slot->lock);
        slot->job_id[0] = '\0';
        slot->busy = false;
        pthread_mutex_unlock(&slot->lock);
}

/* Give up to \p n idle slots a reason to claim now. */
static void wake_slots(cq_worker_t *w, long n)
{
        pthread_mutex_lock(&w->idle_lock);
        w->idle_tokens = n >= w->opts.slots - w->idle_tokens
                             ? w->opts.slots
                             : w->idle_tokens + n;
        if (n >= w->opts.slots)
                pthread_cond_broadcast(&w->idle_cond);
        else
                while (n-- > 0)
                        pthread_cond_signal(&w->idle_cond);
        pthread_mutex_unlock(&w->idle_lock);
}

/* The fallback poll: one idle slot looks, unless one is about to anyway.
 * Polling per slot would cost an idle worker a claim transaction per slot
 * and CODERQ_POLL_MS (measured: ~400 a second for 64 idle slots at
 * 100 ms, each also running the jobs table's statement trigger). */
static void wake_poll(cq_worker_t *w)
{
        pthread_mutex_lock(&w->idle_lock);
        if (w->idle_tokens + w->poll_tokens > 0) {
                /* A slot is about to look anyway: that look counts as the
                 * poll's, and passes it on if it finds something. */
                w->poll_pending = true;
        } else if (w->idle_waiting > 0) {
                w->poll_tokens = 1;
                pthread_cond_signal(&w->idle_cond);
        }
        pthread_mutex_unlock(&w->idle_lock);
}

/* An idle slot's pause until a token or stop; while no listener is up
 * (none started, or its connection is down), at most CODERQ_POLL_MS
 * (jitter keeps such slots from polling in step). Returns true when the
 * token was the poll's. */
static bool idle_wait(cq_worker_t *w)
{
        struct timespec ts;
        bool poll = false;

        cq_abstime_in(&ts, w->cfg->poll_ms + (int64_t)cq_rand_below(100));
        pthread_mutex_lock(&w->idle_lock);
        w->idle_waiting++;
        while (w->idle_tokens + w->poll_tokens == 0 &&
               !atomic_load(&w->stop_claims)) {
                if (atomic_load(&w->listening))
                        pthread_cond_wait(&w->idle_cond, &w->idle_lock);
                else if (pthread_cond_timedwait(&w->idle_cond, &w->idle_lock,
                                                &ts) == ETIMEDOUT)
                        break;
        }
        if (w->idle_tokens > 0) {
                w->idle_tokens--;
                poll = w->poll_pending;
                w->poll_pending = false;
        } else if (w->poll_tokens > 0) {
                w->poll_tokens--;
                poll = true;
        }
        w->idle_waiting--;
        pthread_mutex_unlock(&w->idle_lock);
        return poll;
}

static void *slot_main(void *arg)
{
        slot_t *slot = arg;
        cq_worker_t *w = slot->w;
        char errstr[512], name[32];
        bool polled = false; /* whether this claim is the poll's */

        snprintf(name, sizeof(name), "slot-%d", slot->index);
        slot->rng = (unsigned int)cq_now_ms() ^ (unsigned int)getpid() << 10 ^
                    (unsigned int)slot->index * 2654435761u;
        slot->llm = cq_llm_new(&w->lconf, errstr, sizeof(errstr));
        if (!slot->llm) {
                cq_log_kv(CQ_LOG_ERROR, "could not create the LLM client",
                          "thread", name, "error", errstr, NULL);
                return NULL;
        }
        slot->store = connect_store(w, &w->stop_claims, name);
        while (slot->store && !atomic_load(&w->stop_claims)) {
                cq_claim_t claim;
                bool found = false;
                cq_err_t err;

                cq_claim_init(&claim);
                err = cq_store_claim(slot->store, &claim, &found);
                if (err != CQ_OK) {
                        cq_log_kv(CQ_LOG_WARN, "could not claim a job",
                                  "thread", name, "error",
                                  cq_store_errmsg(slot->store), NULL);
                        cq_claim_release(&claim);
                        nap(1000, &w->stop_claims);
                        continue;
                }
                if (!found) {
                        atomic_fetch_add(&w->claims_empty, 1);
                        cq_claim_release(&claim);
                        polled = idle_wait(w);
                        continue;
                }
                atomic_fetch_add(&w->claims, 1);
                /* The poll found work nobody announced (a lost
                 * notification, a retry whose backoff ran out): there may
                 * be more, so another idle slot looks too. */
                if (polled)
                        wake_poll(w);
                polled = false;
                run_job(slot, &claim);
                cq_claim_release(&claim);
        }
        cq_store_destroy(&slot->store);
        cq_llm_destroy(&slot->llm);
        return NULL;
}

/* -------------------------------------------------------- housekeeping */

static void *hk_main(void *arg)
{
        cq_worker_t *w = arg;
        cq_store_t *store = connect_store(w, &w->stop_hk, "housekeeping");
        int64_t last_hb = 0, last_requeue = 0, last_cancel = 0;
        int64_t hb_ms = (int64_t)w->sopts.lease_s * 1000 / 3;
        long n = w->opts.slots;
        const char **ids = calloc((size_t)n + 1, sizeof(*ids));
        char(*copies)[CQ_JOB_ID_MAX + 1] =
            calloc((size_t)n + 1, sizeof(*copies));
        bool *lost = calloc((size_t)n + 1, sizeof(*lost));
        bool *requested = calloc((size_t)n + 1, sizeof(*requested));
        int *slot_of = calloc((size_t)n + 1, sizeof(*slot_of));

        if (!ids || !copies || !lost || !requested || !slot_of) {
                cq_log_error("housekeeping: out of memory");
                goto out;
        }
        while (store && !atomic_load(&w->stop_hk)) {
                int64_t now = cq_now_ms();
                size_t k = 0, i;
                long s;

                for (s = 0; s < n; s++) {
                        slot_t *slot = &w->slots[s];

                        pthread_mutex_lock(&slot->lock);
                        if (slot->busy && slot->job_id[0]) {
                                snprintf(copies[k], sizeof(copies[k]), "%s",
                                         slot->job_id);
                                ids[k] = copies[k];
                                slot_of[k] = (int)s;
                                k++;
                        }
                        pthread_mutex_unlock(&slot->lock);
                }
                if (k && now - last_hb >= hb_ms) {
                        size_t nlost = 0;

                        if (cq_store_heartbeat(store, ids, k, lost, &nlost) ==
                            CQ_OK) {
                                last_hb = now;
                                for (i = 0; i < k && nlost; i++) {
                                        if (!lost[i])
                                                continue;
                                        cq_log_kv(CQ_LOG_WARN, "lease lost",
                                                  "job_id", ids[i], NULL);
                                        atomic_store(&w->slots[slot_of[i]].lost,
                                                     1);
                                        atomic_store(
                                            &w->slots[slot_of[i]].cancel, 1);
                                }
                        } else {
                                cq_log_kv(CQ_LOG_WARN, "heartbeat failed",
                                          "error", cq_store_errmsg(store),
                                          NULL);
                        }
                }
                /* One statement for all running jobs (it used to be one
                 * per job: 64 a second with 64 slots busy). */
                if (k && now - last_cancel >= 1000) {
                        last_cancel = now;
                        if (cq_store_cancel_requested(store, ids, k,
                                                      requested) != CQ_OK)
                                cq_log_kv(CQ_LOG_WARN, "cancel poll failed",
                                          "error", cq_store_errmsg(store),
                                          NULL);
                        for (i = 0; i < k; i++) {
                                if (requested[i]) {
                                        slot_t *slot = &w->slots[slot_of[i]];

                                        if (!atomic_exchange(&slot->user_cancel,
                                                             1))
                                                cq_log_kv(CQ_LOG_INFO,
                                                          "cancelling job",
                                                          "job_id", ids[i],
                                                          NULL);
                                        atomic_store(&slot->cancel, 1);
                                }
                        }
                }
                /* E2B sandboxes outlive an LLM turn longer than their
                 * TTL only if extended; strays of lost creates die here */
                cq_backend_housekeep(w->backend);
                if (now - last_requeue >= 5000) {
                        int requeued = 0, failed = 0;

                        last_requeue = now;
                        if (cq_store_requeue_expired(store, &requeued,
                                                     &failed) == CQ_OK &&
                            (requeued || failed))
                                cq_log_json(CQ_LOG_INFO, NULL,
                                            "expired leases: %d requeued, "
                                            "%d failed",
                                            requeued, failed);
                }
                nap(250, &w->stop_hk);
        }
out:
        free(ids);
        free(copies);
        free(lost);
        free(requested);
        free(slot_of);
        cq_store_destroy(&store);
        return NULL;
}

/* While the listener is up, idle slots wait for its tokens; while it is
 * not (connecting can take seconds), they poll by themselves again: wake
 * them to switch. */
static void set_listening(cq_worker_t *w, bool on)
{
        pthread_mutex_lock(&w->idle_lock);
        atomic_store(&w->listening, on);
        pthread_cond_broadcast(&w->idle_cond);
        pthread_mutex_unlock(&w->idle_lock);
}

/* Turn PostgreSQL's announcements of claimable jobs into wake-ups of
 * idle slots, and keep the fallback poll. After a reconnect every slot
 * looks once: what was announced meanwhile is lost. */
static void *listen_main(void *arg)
{
        cq_worker_t *w = arg;
        cq_listener_t *l = cq_listener_new(&w->sopts, CQ_CHANNEL_JOBS, NULL, 0);
        int64_t next_poll = cq_now_ms() + w->cfg->poll_ms;
        bool down = false;

        if (!l) {
                cq_log_warn("no job announcements (out of memory); slots "
                            "poll every CODERQ_POLL_MS");
                return NULL;
        }
        set_listening(w, true);
        while (!atomic_load(&w->stop_claims)) {
                bool reconnected = false;
                int64_t wait = next_poll - cq_now_ms();
                long n = cq_listener_wait(l,
                                          wait > 250 ? 250
                                          : wait < 0 ? 0
                                                     : (int)wait,
                                          &reconnected);

                if (n < 0 && !down)
                        cq_log_kv(CQ_LOG_WARN,
                                  "not listening for jobs; slots poll until "
                                  "it is back",
                                  "error", cq_listener_errmsg(l), NULL);
                if ((n < 0) != down)
                        set_listening(w, n >= 0);
                down = n < 0;
                if (reconnected) {
                        cq_log_info("listening for jobs again");
                        n = w->opts.slots;
                }
                if (n > 0) {
                        atomic_fetch_add(&w->wakeups, (unsigned long long)n);
                        wake_slots(w, n);
                }
                if (cq_now_ms() >= next_poll) {
                        next_poll = cq_now_ms() + w->cfg->poll_ms;
                        wake_poll(w);
                }
        }
        set_listening(w, false);
        cq_listener_destroy(&l);
        return NULL;
}

static void *intake_main(void *arg)
{
        cq_worker_t *w = arg;

        w->intake_rc = cq_intake_run(w->intake, &w->stop_intake);
        if (w->intake_rc != 0)
                cq_log_kv(CQ_LOG_ERROR, "intake stopped with an error", "error",
                          cq_intake_errmsg(w->intake), NULL);
        if (cq_intake_auth_failed(w->intake))
                atomic_store(&w->intake_auth, true);
        return NULL;
}

static void *relay_main(void *arg)
{
        cq_worker_t *w = arg;

        (void)cq_relay_run(w->relay, &w->stop_relay);
        return NULL;
}

/* ----------------------------------------------------------- lifecycle */

cq_worker_t *cq_worker_new(const cq_config_t *cfg,
                           const cq_worker_opts_t *opts,
                           char *errstr,
                           size_t errstr_size)
{
        cq_worker_t *w = calloc(1, sizeof(*w));
        long i;

        if (!w) {
                snprintf(errstr, errstr_size, "out of memory");
                return NULL;
        }
        w->cfg = cfg;
        w->opts = *opts;
        pthread_mutex_init(&w->idle_lock, NULL);
        pthread_cond_init(&w->idle_cond, NULL);
        if (cfg->worker_id) {
                snprintf(w->id, sizeof(w->id), "%s", cfg->worker_id);
        } else {
                char host[128] = "host";

                gethostname(host, sizeof(host) - 1);
                snprintf(w->id, sizeof(w->id), "%s-%ld", host, (long)getpid());
        }
        cq_store_opts_from_config(&w->sopts, cfg);
        w->sopts.owner = w->id;
        cq_kafka_opts_from_config(&w->kopts, cfg);
        w->kopts.client_id = w->id;
        w->kopts.store = &w->sopts;
        cq_llm_conf_from_config(&w->lconf, cfg);
        w->limiter = cq_llm_limiter_new((double)cfg->llm_rate_max);
        if (!w->limiter) {
                snprintf(errstr, errstr_size, "out of memory");
                goto fail;
        }
        w->lconf.limiter = w->limiter;
        if (cfg->prices_file && *cfg->prices_file) {
                w->prices =
                    cq_prices_load(cfg->prices_file, errstr, errstr_size);
                if (!w->prices)
                        goto fail;
                cq_log_kv(CQ_LOG_INFO, "prices loaded", "file",
                          cfg->prices_file, NULL);
        }
        w->slots = calloc((size_t)opts->slots + 1, sizeof(*w->slots));
        if (!w->slots) {
                snprintf(errstr, errstr_size, "out of memory");
                goto fail;
        }
        for (i = 0; i < opts->slots; i++) {
                w->slots[i].w = w;
                w->slots[i].index = (int)i;
                pthread_mutex_init(&w->slots[i].lock, NULL);
        }
        if (opts->slots > 0) {
                long pool = cfg->kpool_size > 0 ? cfg->kpool_size : 1;

                w->backend =
                    cq_backend_new(cfg, (size_t)pool, errstr, errstr_size);
                if (!w->backend ||
                    cq_backend_track_e2b(w->backend, w->id, errstr,
                                         errstr_size) != 0)
                        goto fail;
                cq_log_kv(CQ_LOG_INFO, "interpreters ready", "backend",
                          cq_backend_describe(w->backend), NULL);
        }
        if (opts->intake || opts->relay || opts->events) {
                w->prod = cq_producer_new(&w->kopts, errstr, errstr_size);
                if (!w->prod)
                        goto fail;
        }
        if (opts->intake) {
                w->intake =
                    cq_intake_new(&w->kopts, w->prod, errstr, errstr_size);
                if (!w->intake)
                        goto fail;
        }
        if (opts->relay) {
                w->relay =
                    cq_relay_new(&w->kopts, w->prod, errstr, errstr_size);
                if (!w->relay)
                        goto fail;
        }
        if (opts->events) {
                w->events =
                    cq_events_new(&w->kopts, w->prod, errstr, errstr_size);
                if (!w->events)
                        goto fail;
        }
        return w;
fail:
        cq_worker_destroy(&w);
        return NULL;
}

static bool any_busy(cq_worker_t *w)
{
        long i;
        bool busy = false;

        for (i = 0; i < w->opts.slots && !busy; i++) {
                pthread_mutex_lock(&w->slots[i].lock);
                busy = w->slots[i].busy;
                pthread_mutex_unlock(&w->slots[i].lock);
        }
        return busy;
}

/* The relay's counters, once it stopped: events sent, deliveries
 * retried, rows failed for good, events cut to the cap. */
static void log_relay(cq_worker_t *w)
{
        cq_relay_stats_t st;
        json_t *fields;

        cq_relay_stats(w->relay, &st);
        fields = json_pack("{s:I, s:I, s:I, s:I, s:I}", "produced",
                           (json_int_t)st.produced, "sent", (json_int_t)st.sent,
                           "retried", (json_int_t)st.failed, "rejected",
                           (json_int_t)st.rejected, "truncated",
                           (json_int_t)st.truncated);
        cq_log_json(st.rejected ? CQ_LOG_WARN : CQ_LOG_INFO, fields,
                    "outbox relay");
        json_decref(fields);
}

/* Start one of the worker's threads; a failure is logged and makes
 * cq_worker_run() shut down what did start and fail. */
static bool start_thread(cq_worker_t *w,
                         pthread_t *thr,
                         void *(*fn)(void *),
                         void *arg,
                         const char *what,
                         bool *startedp)
{
        int err = pthread_create(thr, NULL, fn, arg);

        if (err != 0) {
                cq_log_error("worker %s: could not start the %s thread: %s",
                             w->id, what, strerror(err));
                return false;
        }
        *startedp = true;
        return true;
}

/* Whether Kafka refused this worker's credentials or TLS (the producer or
 * the intake saw it); then w->errmsg says so. */
static bool kafka_refused(cq_worker_t *w)
{
        char why[512];

        if (atomic_load(&w->intake_auth))
                snprintf(why, sizeof(why), "%s", cq_intake_errmsg(w->intake));
        else if (!w->prod ||
                 !cq_producer_auth_failed(w->prod, why, sizeof(why)))
                return false;
        snprintf(w->errmsg, sizeof(w->errmsg),
                 "could not connect to Kafka at %s: %s", w->kopts.brokers, why);
        return true;
}

const char *cq_worker_errmsg(const cq_worker_t *worker)
{
        return worker->errmsg;
}

int cq_worker_run(cq_worker_t *w, volatile sig_atomic_t *signals)
{
        bool refused = false;
        long i;
        int64_t deadline;
        int rc = 0;
        bool up = true;

        if (w->intake)
                up = start_thread(w, &w->intake_thr, intake_main, w, "intake",
                                  &w->intake_started);
        if (up && w->relay)
                up = start_thread(w, &w->relay_thr, relay_main, w, "relay",
                                  &w->relay_started);
        if (up && w->opts.slots > 0)
                up = start_thread(w, &w->hk_thr, hk_main, w, "housekeeping",
                                  &w->hk_started);
        if (up && w->opts.slots > 0)
                up = start_thread(w, &w->listen_thr, listen_main, w, "listener",
                                  &w->listen_started);
        for (i = 0; up && i < w->opts.slots; i++)
                up = start_thread(w, &w->slots[i].thread, slot_main,
                                  &w->slots[i], "job slot",
                                  &w->slots[i].started);
        if (up) {
                cq_log_kv(CQ_LOG_INFO, "worker started", "worker", w->id, NULL);
                while (*signals == 0 && !(refused = kafka_refused(w)))
                        nap(200, NULL);
                if (refused)
                        cq_log_kv(CQ_LOG_ERROR, "stopping: Kafka refused us",
                                  "error", w->errmsg, NULL);
        } else {
                rc = -1;
        }

        cq_log_kv(CQ_LOG_INFO, "shutting down: stopping intake and claims",
                  "worker", w->id, NULL);
        atomic_store(&w->stop_intake, 1);
        atomic_store(&w->stop_claims, 1);
        atomic_store(&w->stop_jobs, 1);
        wake_slots(w, w->opts.slots); /* idle ones see the stop now */
        deadline = cq_now_ms() + w->opts.shutdown_s * 1000;
        while (any_busy(w) && cq_now_ms() < deadline)
                nap(100, NULL);
        if (any_busy(w)) {
                /* Past the deadline: interrupt the cells still running;
                 * the jobs go back to the queue from their last
                 * checkpoint. */
                cq_log_warn("shutdown deadline reached; interrupting jobs");
                for (i = 0; i < w->opts.slots; i++)
                        atomic_store(&w->slots[i].cancel, 1);
        }
        for (i = 0; i < w->opts.slots; i++)
                if (w->slots[i].started) {
                        pthread_join(w->slots[i].thread, NULL);
                        w->slots[i].started = false;
                }
        if (w->intake_started) {
                pthread_join(w->intake_thr, NULL);
                w->intake_started = false;
                if (w->intake_rc != 0)
                        rc = -1;
        }
        atomic_store(&w->stop_relay, 1);
        if (w->relay_started) {
                pthread_join(w->relay_thr, NULL);
                w->relay_started = false;
                log_relay(w);
        }
        if (w->listen_started) {
                pthread_join(w->listen_thr, NULL);
                w->listen_started = false;
        }
        atomic_store(&w->stop_hk, 1);
        if (w->hk_started) {
                pthread_join(w->hk_thr, NULL);
                w->hk_started = false;
        }
        {
                json_t *fields = json_pack(
                    "{s:s, s:I, s:I, s:I}", "worker", w->id, "jobs_announced",
                    (json_int_t)atomic_load(&w->wakeups), "claims",
                    (json_int_t)atomic_load(&w->claims), "claims_empty",
                    (json_int_t)atomic_load(&w->claims_empty));

                cq_log_json(CQ_LOG_INFO, fields, "worker stopped");
                json_decref(fields);
        }
        cq_backend_log_pool(w->backend);
        return refused ? 1 : rc;
}

void cq_worker_destroy(cq_worker_t **workerp)
{
        cq_worker_t *w = *workerp;
        long i;

        if (!w)
                return;
        *workerp = NULL;
        cq_events_destroy(&w->events);
        cq_relay_destroy(&w->relay);
        cq_intake_destroy(&w->intake);
        cq_producer_destroy(&w->prod);
        cq_backend_destroy(&w->backend);
        for (i = 0; w->slots && i < w->opts.slots; i++)
                pthread_mutex_destroy(&w->slots[i].lock);
        free(w->slots);
        cq_llm_limiter_destroy(&w->limiter);
        cq_prices_destroy(&w->prices);
        pthread_cond_destroy(&w->idle_cond);
        pthread_mutex_destroy(&w->idle_lock);
        free(w);
}
