/* SPDX-License-Identifier: MIT */
/* worker_job.c - one claimed job on a slot: resume from its checkpoint,
 * run the agent loop with the observers that checkpoint every message,
 * cell and LLM call (retrying transient write failures), hold the run's
 * budget, then finish it (images, result, notebook and outbox row in one
 * transaction), give it back or fail it. */
#include "coderq/worker/worker.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/agent/agent.h"
#include "coderq/backend/backend.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/log.h"
#include "coderq/agent/notebook.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/artifacts.h"
#include "coderq/storage/memory.h"
#include "coderq/storage/queries.h"
#include "coderq/common/util.h"
#include "worker_int.h"

#define SESSION_DEPTH_MAX 32
#define WRITE_ATTEMPTS    6
#define WRITE_BACKOFF_MS  100

typedef struct job_ctx {
        slot_t *slot;
        const cq_job_t *job;
        cq_nb_t *nb;
        int next_cell_seq; /* seq of the next cell checkpoint */
        /* The run had a budget at the claim or at the last message
         * checkpoint (which reads it in its own statement): hold. */
        bool run_budget;
        /* The usage after the last LLM call, written with the next
         * message (the call's reply) in one statement, or alone by
         * flush_usage() when no message follows. */
        bool usage_pending;
        cq_usage_t usage;
        double cost_usd;
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
 * apart doubling. One slot waits alone: no jitter. */
typedef struct write_retry {
        int attempts;
} write_retry_t;

static void write_retry_init(write_retry_t *r) { r->attempts = 0; }

/* Whether to try again after a write that returned \p err; naps first. */
static bool write_again(write_retry_t *r, cq_err_t err)
{
        if (err != CQ_ERR_RETRIABLE || ++r->attempts >= WRITE_ATTEMPTS)
                return false;
        cq_nap_ms(cq_backoff_ms(r->attempts, WRITE_BACKOFF_MS, INT64_MAX,
                                CQ_JITTER_NONE),
                  NULL);
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
        bool lost = false, run_budget = false;
        cq_err_t err;

        /* The history is the job's stored conversation plus what follows:
         * the message at index i is seq i + 1. */
        write_retry_init(&retry);
        do {
                err = cq_store_append_message_usage(
                    slot->store, ctx->job->job_id, (int)index + 1, msg,
                    ctx->usage_pending ? &ctx->usage : NULL, ctx->cost_usd,
                    &lost, &run_budget);
        } while (write_again(&retry, err));
        if (err == CQ_OK && !lost) {
                ctx->usage_pending = false;
                /* a budget set (or removed) since the claim holds (or stops
                 * holding) from the next call on */
                ctx->run_budget = run_budget;
        }
        return checkpointed(ctx, err, lost, "could not checkpoint a message");
}

/* Write the usage of the last LLM call when no message carried it. */
static int flush_usage(job_ctx_t *ctx)
{
        write_retry_t retry;
        bool lost = false;
        cq_err_t err;

        if (!ctx->usage_pending)
                return 0;
        write_retry_init(&retry);
        do {
                err = cq_store_record_usage(ctx->slot->store, ctx->job->job_id,
                                            &ctx->usage, ctx->cost_usd, &lost);
        } while (write_again(&retry, err));
        if (err == CQ_OK && !lost)
                ctx->usage_pending = false;
        return checkpointed(ctx, err, lost, "could not record the LLM usage");
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

/* A turn in one statement: the cell (if any) with its notebook, and the
 * messages that follow it, with the last call's usage if no message
 * carried it yet. */
static int obs_turn(void *opaque,
                    const char *code,
                    const cq_cell_result_t *res,
                    size_t index,
                    const json_t *messages)
{
        job_ctx_t *ctx = opaque;
        slot_t *slot = ctx->slot;
        const json_t *doc = code && ctx->nb ? cq_nb_json(ctx->nb) : NULL;
        write_retry_t retry;
        bool lost = false, run_budget = false;
        cq_err_t err;

        write_retry_init(&retry);
        do {
                err = cq_store_checkpoint_turn(
                    slot->store, ctx->job->job_id, ctx->next_cell_seq, code,
                    res, doc, (int)index + 1, messages,
                    ctx->usage_pending ? &ctx->usage : NULL, ctx->cost_usd,
                    &lost, &run_budget);
        } while (write_again(&retry, err));
        if (err == CQ_ERR_TOO_LARGE && doc) {
                /* as in obs_cell: the turn without the notebook */
                cq_log_kv(CQ_LOG_WARN,
                          "notebook over the cap; cell stored without it",
                          "job_id", ctx->job->job_id, NULL);
                write_retry_init(&retry);
                do {
                        err = cq_store_checkpoint_turn(
                            slot->store, ctx->job->job_id, ctx->next_cell_seq,
                            code, res, NULL, (int)index + 1, messages,
                            ctx->usage_pending ? &ctx->usage : NULL,
                            ctx->cost_usd, &lost, &run_budget);
                } while (write_again(&retry, err));
        }
        if (err == CQ_OK && !lost) {
                if (code)
                        ctx->next_cell_seq++;
                ctx->usage_pending = false;
                ctx->run_budget = run_budget;
        }
        return checkpointed(ctx, err, lost,
                            code ? "could not checkpoint a cell"
                                 : "could not checkpoint a message");
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

/* The most attempts a notebook's record of them keeps: the first ones
 * and the latest (the weakest sandbox of all is kept beside them). */
#define RUNS_MAX 32

/* Note this attempt in the notebook's record of the attempts that ran the
 * job (metadata.coderq.runs: attempt, worker, sandbox, model), which each
 * checkpoint stores with the notebook, and return the weakest sandbox any
 * of them had (also kept, as metadata.coderq.sandbox): what the result
 * reports, since a job resumed from another worker's checkpoint carries
 * the cells and outputs of code that ran there. Cells checkpointed
 * without a record (by a worker before it) count as "unknown", and so
 * does running out of memory here. */
static const char *note_run(cq_nb_t *nb,
                            bool earlier_cells,
                            const cq_worker_t *w,
                            const cq_job_t *job,
                            int attempt,
                            const char *sandbox)
{
        const json_t *meta = json_object_get(
            json_object_get(cq_nb_json(nb), "metadata"), "coderq");
        const json_t *old = json_object_get(meta, "runs");
        const json_t *kept = json_object_get(meta, "sandbox");
        const char *weakest = sandbox;
        json_t *runs, *run;
        size_t i;

        if (earlier_cells && !json_is_array(old))
                weakest =
                    cq_backend_weaker_sandbox(weakest, CQ_SANDBOX_MODE_UNKNOWN);
        if (kept)
                weakest = cq_backend_weaker_sandbox(
                    weakest, json_is_string(kept) ? json_string_value(kept)
                                                  : CQ_SANDBOX_MODE_UNKNOWN);
        for (i = 0; i < json_array_size(old); i++) {
                const char *m = json_string_value(
                    json_object_get(json_array_get(old, i), "sandbox"));

                weakest = cq_backend_weaker_sandbox(
                    weakest, m ? m : CQ_SANDBOX_MODE_UNKNOWN);
        }
        runs = json_is_array(old) ? json_deep_copy(old) : json_array();
        run = json_pack("{s:i, s:s, s:s, s:s?}", "attempt", attempt, "worker",
                        w->id, "sandbox", sandbox, "model", job_model(w, job));
        if (!runs || !run ||
            (json_array_size(runs) >= RUNS_MAX &&
             json_array_remove(runs, json_array_size(runs) - 1)))
                goto oom;
        if (json_array_append_new(runs, run)) {
                run = NULL;
                goto oom;
        }
        /* both take their value, failing or not */
        if (cq_nb_set_meta(nb, "runs", runs) ||
            cq_nb_set_meta(nb, "sandbox", json_string(weakest)))
                return CQ_SANDBOX_MODE_UNKNOWN;
        return weakest;
oom:
        json_decref(run);
        json_decref(runs);
        return CQ_SANDBOX_MODE_UNKNOWN;
}

/* The job's usage after each LLM call: limits and the run's budget read
 * it, so it is written like a checkpoint (a failed write stops the job,
 * which goes back to the queue), with the reply the call returned: the
 * next message, which follows at once. */
static int obs_usage(void *opaque, const cq_usage_t *total, double cost_usd)
{
        job_ctx_t *ctx = opaque;

        ctx->usage = *total;
        ctx->cost_usd = cost_usd;
        ctx->usage_pending = true;
        return 0;
}

/* Hold the next call's estimate against the run's budget. */
static int
obs_reserve(void *opaque, double estimate_usd, char *why, size_t why_size)
{
        job_ctx_t *ctx = opaque;
        cq_budget_t b;
        cq_err_t err;

        /* Spent and held are read under the run's lock: this call's usage
         * must be in first. */
        if (flush_usage(ctx) != 0)
                return -1;
        /* A job whose run had no budget at the claim or at its last
         * message checkpoint holds none: no round trip. Every LLM reply
         * is such a checkpoint, so a budget set while the job runs holds
         * its calls from the next-but-one at the latest. */
        if (!ctx->job->run_id || !ctx->run_budget)
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

        cq_errstr_set(errstr, errstr_size, "out of memory");
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
                        cq_errstr_set(errstr, errstr_size, "%s",
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
                        cq_errstr_set(errstr, errstr_size, "%s",
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

/* What the job ran with, for its result (docs/EVALUATION.md#reproducibility):
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
                const cq_agent_image_t *img = &res->images.v[i];

                err = cq_store_put_image(
                    slot->store, job->job_id, img->name, img->mime, img->data,
                    img->len, img->cell <= INT_MAX ? (int)img->cell : 0, NULL,
                    NULL);
                if (err != CQ_OK)
                        cq_log_kv(CQ_LOG_WARN, "could not store an image",
                                  "job_id", job->job_id, "image", img->name,
                                  "error", cq_store_errmsg(slot->store), NULL);
        }
        /* Remembered before the finish makes the result visible: a
         * writer that submits a similar job as soon as this one's
         * completion event arrives finds it in memory. (Keyed by job,
         * so a second owner after a lost lease writes the same row.) */
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
        repro = repro_record(slot, job, res);
        report = json_pack(
            "{s:b, s:s?, s:s?, s:I, s:I, s:O?, s:O*, s:s?, s:i, s:s?, s:o*,"
            " s:O*}",
            "from_memory", res->from_memory, "memory_source_job",
            res->memory_source_job, "memory_scope",
            res->memory_source_job ? memory_scope(slot->w, job) : NULL, "cells",
            (json_int_t)res->cells, "duration_ms", (json_int_t)res->duration_ms,
            "tests", res->tests, "hidden", res->hidden, "last_error",
            res->last_error, "attempt", attempt, "sandbox", sandbox, "repro",
            repro, "runs",
            nb ? json_object_get(
                     json_object_get(
                         json_object_get(cq_nb_json(nb), "metadata"), "coderq"),
                     "runs")
               : NULL);
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
        fin.verdict = res->verdict;
        fin.judge = res->judge;
        fin.hidden_passed = res->hidden_passed;
        fin.hidden_total = res->hidden_total;
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
        atomic_fetch_add(&slot->w->finished, 1);
        cq_log_kv(CQ_LOG_INFO, "job finished", "job_id", job->job_id, "status",
                  status, "reason", res->reason, NULL);
        worker_metrics_finished(slot->w, status, res->reason_code);
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
}

/* Give the job back to the queue (shutdown) or leave it (lease lost). */
static void give_back(slot_t *slot, const char *job_id)
{
        if (atomic_load(&slot->lost)) {
                cq_log_kv(CQ_LOG_WARN, "lease lost; job left to its new owner",
                          "job_id", job_id, NULL);
                return;
        }
        if (cq_store_release(slot->store, job_id) != CQ_OK) {
                cq_log_kv(CQ_LOG_WARN,
                          "could not release job; its lease will expire",
                          "job_id", job_id, "error",
                          cq_store_errmsg(slot->store), NULL);
        } else {
                atomic_fetch_add(&slot->w->released, 1);
                cq_log_kv(CQ_LOG_INFO, "job released at a checkpoint", "job_id",
                          job_id, NULL);
        }
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
                    (int64_t)cfg->requeue_delay_max_s * 1000, CQ_JITTER_EQUAL);
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
        /* the model's code never ran, or ran to no verdict by our fault:
         * left out of the scores (docs/EVALUATION.md#verdicts) */
        res.verdict = "infra_error";
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

/* Whether a run that failed did so by a fault of ours another try may
 * mend (the agent says which): the LLM down past its retries, an
 * interpreter or the judge lost, storage, our own. A refused request or
 * an invalid job or input fails the same way again: it keeps its
 * infra_error verdict and is not tried again. */
static bool retry_infra(const cq_agent_result_t *res)
{
        return res->status == CQ_AGENT_FAILED && res->transient &&
               res->verdict && strcmp(res->verdict, "infra_error") == 0;
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

/* The slot takes \p claim: busy, flags down, said and published. */
static void slot_take(slot_t *slot, const cq_claim_t *claim)
{
        cq_worker_t *w = slot->w;

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
}

static void slot_free(slot_t *slot)
{
        pthread_mutex_lock(&slot->lock);
        slot->job_id[0] = '\0';
        slot->busy = false;
        pthread_mutex_unlock(&slot->lock);
}

/* The intake validated the spec; one that no longer parses (an older or
 * newer schema) fails the job, clearly, with what it had spent. */
static void
fail_unparsable(slot_t *slot, const cq_claim_t *claim, const char *why)
{
        cq_agent_result_t res;
        cq_job_t bare;

        cq_agent_result_init(&res);
        cq_job_init(&bare);
        bare.job_id = claim->job_id;
        res.status = CQ_AGENT_FAILED;
        res.verdict = "infra_error"; /* not the model's doing */
        res.reason = strdup(why);
        res.reason_code = "invalid_job";
        res.prompt_tokens = claim->usage.prompt_tokens;
        res.completion_tokens = claim->usage.completion_tokens;
        res.cost_usd = claim->cost_usd;
        finish_job(slot, &bare, claim->attempt, NULL, NULL, &res);
        cq_agent_result_release(&res);
}

/* Where the job starts from: its checkpoint, its parent's session, or
 * nothing (\p start, \p cells and \p historyp filled). false after the
 * job was failed or given back for it. */
static bool load_start(slot_t *slot,
                       cq_claim_t *claim,
                       cq_job_t *job,
                       cq_checkpoint_t *cp,
                       json_t *cells,
                       json_t **historyp,
                       cq_agent_start_t *start)
{
        char errstr[1024];
        cq_err_t err;

        if (claim->has_checkpoint) {
                err = cq_store_load_checkpoint(slot->store, job->job_id, cp);
                if (err != CQ_OK) {
                        cannot_run(slot, claim, job, err, "storage",
                                   "could not load its checkpoint: %s",
                                   cq_store_errmsg(slot->store));
                        return false;
                }
        }
        if (job->parent_job_id) {
                err = load_session(slot, job, cells, historyp, errstr,
                                   sizeof(errstr));
                if (err != CQ_OK) {
                        cannot_run(slot, claim, job, err, "storage",
                                   "could not load the parent session: %s",
                                   errstr);
                        return false;
                }
                /* what these cells make is the parent's, stored with it */
                start->parent_cells = json_array_size(cells);
        }
        if (claim->has_checkpoint && json_array_size(cp->messages) > 0) {
                append_codes(cells, cp->cells);
                start->history = cp->messages;
                start->cells = cells;
                start->continue_job = true;
                /* A session's history begins with the parent's turns. */
                start->turns_done = count_role(cp->messages, "assistant") -
                                    count_role(*historyp, "assistant");
                start->retries_done = claim->retries;
        } else if (job->parent_job_id) {
                start->history = *historyp;
                start->cells = cells;
        }
        /* Limits hold over the whole job: what the earlier attempts spent
         * counts, and their running time. */
        start->usage_done = claim->usage;
        start->cost_done_usd = claim->cost_usd;
        /* This run's cells are stored after those: numbered on from them */
        start->cells_done = cp->last_cell_seq;
        return true;
}

/* The agent's options, observers and memory for \p ctx's job. */
static void wire_agent(job_ctx_t *ctx,
                       cq_agent_opts_t *opts,
                       cq_agent_observer_t *obs,
                       cq_agent_memory_t *mem)
{
        slot_t *slot = ctx->slot;
        cq_worker_t *w = slot->w;

        obs->on_message = obs_message;
        obs->on_cell = obs_cell;
        obs->on_turn = obs_turn;
        obs->on_event = obs_event;
        obs->on_retry = obs_retry;
        obs->on_usage = obs_usage;
        obs->reserve = obs_reserve;
        obs->opaque = ctx;
        mem->lookup = mem_lookup;
        mem->opaque = ctx;
        cq_agent_opts_from_config(opts, w->cfg);
        opts->cancel = &slot->cancel;
        opts->stop = &w->stop_jobs;
        opts->new_interp = slot_new_interp;
        opts->new_interp_opaque = slot;
        opts->judge_start = cq_backend_judge_start;
        opts->judge_take = cq_backend_judge_take;
        opts->judge_keep = cq_backend_judge_keep;
        opts->judge_opaque = w->backend;
        opts->prices = w->prices;
        opts->metrics = &w->m.agent;
}

/* What becomes of the job after the agent ran: finished, given back, or
 * tried again. */
static void settle(job_ctx_t *ctx,
                   cq_claim_t *claim,
                   cq_job_t *job,
                   const char *sandbox,
                   cq_agent_result_t *res)
{
        slot_t *slot = ctx->slot;

        /* The last call's usage, when no message carried it (the loop
         * ended right after the call): before the job finishes or goes
         * back. */
        if (ctx->ckpt_err == CQ_OK && !atomic_load(&slot->lost) &&
            flush_usage(ctx) != 0 && ctx->ckpt_err == CQ_ERR_RETRIABLE)
                res->status = CQ_AGENT_ABORTED; /* a failed try, as before */
        if (ctx->ckpt_err != CQ_OK && ctx->ckpt_err != CQ_ERR_RETRIABLE &&
            !atomic_load(&slot->lost)) {
                /* The store refused what the job produced: another run
                 * would produce and be refused the same, so the job fails
                 * saying why instead of going back to the queue. */
                res->status = CQ_AGENT_FAILED;
                free(res->reason);
                res->reason = strdup(ctx->ckpt_errmsg);
                res->reason_code = "storage";
                /* whatever the run earned, it was not kept */
                res->verdict = "infra_error";
                finish_job(slot, job, claim->attempt, sandbox, ctx->nb, res);
                return;
        }
        if (res->status == CQ_AGENT_ABORTED ||
            (res->status == CQ_AGENT_CANCELLED &&
             !atomic_load(&slot->user_cancel)) ||
            atomic_load(&slot->lost)) {
                /* A shutdown gives the job back as it is; a checkpoint
                 * that could not be written is a failed try. */
                if (ctx->ckpt_err != CQ_OK && !atomic_load(&slot->lost))
                        cannot_run(slot, claim, job, CQ_ERR_RETRIABLE,
                                   "storage", "%s", ctx->ckpt_errmsg);
                else
                        give_back(slot, job->job_id);
                return;
        }
        if (res->status == CQ_AGENT_CANCELLED) {
                free(res->reason);
                res->reason = strdup("cancelled by request");
        }
        if (retry_infra(res) && claim->attempt < claim->max_attempts) {
                /* Ours, not the model's (docs/EVALUATION.md#verdicts):
                 * tried again from its checkpoint while attempts last. */
                cannot_run(slot, claim, job, CQ_ERR_RETRIABLE, res->reason_code,
                           "%s",
                           res->reason ? res->reason : "infrastructure error");
                return;
        }
        finish_job(slot, job, claim->attempt, sandbox, ctx->nb, res);
}

void worker_run_job(slot_t *slot, cq_claim_t *claim)
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
        slot_take(slot, claim);
        if (cq_job_from_json(claim->spec, CQ_JOB_F_STORED, &job, errstr,
                             sizeof(errstr)) != CQ_OK) {
                fail_unparsable(slot, claim, errstr);
                goto out;
        }
        if (!job.solution && cq_llm_provider(slot->llm) == CQ_LLM_NONE) {
                /* no try on this worker can mend it: fail it before a
                 * kernel starts, not again and again */
                cannot_run(slot, claim, &job, CQ_ERR_FATAL, "llm", "%s",
                           CQ_LLM_NONE_REASON);
                goto out;
        }
        if (!cells)
                goto out;
        /* Claimed as the drain began: no kernel is started for a job
         * that would stop at its first checkpoint. */
        if (atomic_load(&w->stop_jobs)) {
                give_back(slot, job.job_id);
                goto out;
        }
        if (!load_start(slot, claim, &job, &cp, cells, &history, &start))
                goto out;
        /* A job judged with no LLM gets a runner, not a kernel. */
        err = cq_backend_acquire_for(w->backend, &job, claim->attempt,
                                     w->cfg->kernel_startup_timeout_s * 1000,
                                     &interp, errstr, sizeof(errstr));
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
        if (nb)
                sandbox = note_run(nb, cp.last_cell_seq > 0, w, &job,
                                   claim->attempt, sandbox);
        ctx.slot = slot;
        ctx.job = &job;
        ctx.nb = nb;
        ctx.next_cell_seq = cp.last_cell_seq + 1;
        ctx.run_budget = claim->run_budget;
        ctx.ckpt_err = CQ_OK;
        wire_agent(&ctx, &opts, &obs, &mem);
        /* the running time of the earlier attempts, and this one's */
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
        settle(&ctx, claim, &job, sandbox, &res);
out:
        cq_interp_destroy(&interp);
        cq_nb_destroy(&nb);
        cq_agent_result_release(&res);
        cq_checkpoint_release(&cp);
        json_decref(cells);
        json_decref(history);
        cq_job_release(&job);
        slot_free(slot);
}
