/* SPDX-License-Identifier: MIT */
/* worker.c - the worker daemon's threads. Threads: intake, relay,
 * housekeeping, the listener and N slots; the main thread waits for a
 * signal and runs the shutdown. Each slot owns its PostgreSQL connection,
 * its LLM client and, while a job runs, its interpreter; the producer and
 * the kernel pool are shared. Flags between threads are atomics; the only
 * lock guards a slot's current job id, which housekeeping reads. What a
 * slot does with one claimed job is worker_job.c's. */
#include "coderq/worker/worker.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coderq/backend/backend.h"
#include "coderq/consumer/kafka.h"
#include "coderq/agent/llm.h"
#include "coderq/agent/testrun.h"
#include "coderq/common/log.h"
#include "coderq/interp/interp.h"
#include "coderq/common/prices.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/listen.h"
#include "coderq/common/util.h"
#include "worker_int.h"

void cq_worker_opts_from_config(cq_worker_opts_t *opts, const cq_config_t *cfg)
{
        memset(opts, 0, sizeof(*opts));
        opts->intake = true;
        opts->relay = true;
        opts->events = true;
        opts->slots = cfg->slots;
        opts->drain_s = cfg->drain_s;
}

/* Remember why PostgreSQL refused the worker before it ever connected;
 * the first such reason wins, and the main thread stops the worker. */
static void pg_refuse(cq_worker_t *w, const char *why)
{
        if (atomic_exchange(&w->pg_claimed, true))
                return;
        snprintf(w->pg_why, sizeof(w->pg_why), "%s", why);
        atomic_store(&w->pg_refused, true);
}

/* A store for the calling thread, retrying until it connects or \p stop:
 * 200 ms apart, doubling to 6.4 s. Each thread waits on its own, so no
 * jitter. A failure waiting cannot fix (no such database, credentials,
 * TLS) before any connection of the worker worked ends the worker: NULL,
 * and the main thread stops it. After one worked, it is logged as an
 * error and retried (a password being rotated, a database restored). */
static cq_store_t *
connect_store(cq_worker_t *w, const atomic_int *stop, const char *who)
{
        int failures = 0;

        while (!atomic_load(stop)) {
                char errstr[640];
                cq_store_t *store = NULL;
                cq_err_t err =
                    cq_store_connect(&w->sopts, &store, errstr, sizeof(errstr));

                if (err == CQ_OK) {
                        atomic_store(&w->pg_seen, true);
                        return store;
                }
                if (err == CQ_ERR_FATAL && !atomic_load(&w->pg_seen)) {
                        pg_refuse(w, errstr);
                        return NULL;
                }
                cq_log_kv(err == CQ_ERR_FATAL ? CQ_LOG_ERROR : CQ_LOG_WARN,
                          "could not connect to PostgreSQL", "thread", who,
                          "error", errstr, NULL);
                cq_nap_ms(cq_backoff_ms(++failures, 200, 6400, CQ_JITTER_NONE),
                          stop);
        }
        return NULL;
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
                        cq_nap_ms(1000, &w->stop_claims);
                        continue;
                }
                if (!found) {
                        atomic_fetch_add(&w->claims_empty, 1);
                        cq_claim_release(&claim);
                        polled = idle_wait(w);
                        continue;
                }
                atomic_fetch_add(&w->claims, 1);
                cq_series_add(w->m.claimed, 1);
                /* The poll found work nobody announced (a lost
                 * notification, a retry whose backoff ran out): there may
                 * be more, so another idle slot looks too. */
                if (polled)
                        wake_poll(w);
                polled = false;
                worker_run_job(slot, &claim);
                cq_claim_release(&claim);
        }
        cq_store_destroy(&slot->store);
        cq_llm_destroy(&slot->llm);
        return NULL;
}

/* -------------------------------------------------------- housekeeping */

/* What housekeeping read about the jobs of its snapshot may come after a
 * slot finished one and claimed the next, which must not pay for it: a
 * job marked lost is left unfinished until its lease runs out, a
 * cancelled one fails. */
bool worker_slot_mark(slot_t *slot, const char *job_id, bool lost)
{
        bool same;

        pthread_mutex_lock(&slot->lock);
        same = slot->busy && strcmp(slot->job_id, job_id) == 0;
        if (same) {
                int none = 0;

                if (lost)
                        atomic_store(&slot->lost, 1);
                else
                        same = !atomic_exchange(&slot->user_cancel, 1);
                /* a drain's abandon stays one */
                atomic_compare_exchange_strong(&slot->cancel, &none, 1);
        }
        pthread_mutex_unlock(&slot->lock);
        return same;
}

static void *hk_main(void *arg)
{
        cq_worker_t *w = arg;
        cq_store_t *store = connect_store(w, &w->stop_hk, "housekeeping");
        int64_t last_hb = 0, last_requeue = 0, last_cancel = 0;
        int64_t last_trim = cq_now_ms();
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
                                        if (!lost[i] ||
                                            !worker_slot_mark(
                                                &w->slots[slot_of[i]], ids[i],
                                                true))
                                                continue;
                                        cq_log_kv(CQ_LOG_WARN, "lease lost",
                                                  "job_id", ids[i], NULL);
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
                                if (requested[i] &&
                                    worker_slot_mark(&w->slots[slot_of[i]],
                                                     ids[i], false))
                                        cq_log_kv(CQ_LOG_INFO, "cancelling job",
                                                  "job_id", ids[i], NULL);
                        }
                }
                /* E2B sandboxes outlive an LLM turn longer than their
                 * TTL only if extended; strays of lost creates die here */
                cq_backend_housekeep(w->backend);
                worker_metrics_housekeep(w, store, now);
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
                        /* their completion events are in the outbox:
                         * this worker's relay sends them now, whatever
                         * its idle pause */
                        if (failed && w->relay)
                                cq_relay_kick(w->relay);
                }
                /* Each slot thread and each librdkafka thread mallocs in
                 * an arena of its own, and glibc gives back only the
                 * free space at an arena's top: a burst (a reconnect's
                 * buffers, a large answer) would stay in RSS for the
                 * worker's life and a long run's RSS creep up. Freed
                 * pages go back to the kernel every 30 s. */
#ifdef __GLIBC__
                if (now - last_trim >= 30000) {
                        last_trim = now;
                        malloc_trim(0);
                }
#endif
                cq_nap_ms(250, &w->stop_hk);
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
                long n;

                atomic_store(&w->m.beat_listen, cq_now_ms());
                n = cq_listener_wait(l,
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
        atomic_store(&w->m.intake_done, true);
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

/* The worker's first connection, before anything else starts: a setting
 * waiting cannot fix (no such database, credentials, TLS) fails the
 * start with its one line; a server that cannot be reached yet is waited
 * for by every thread while the worker runs, not ready meanwhile. */
static int first_connect(cq_worker_t *w, char *errstr, size_t errstr_size)
{
        cq_store_t *store = NULL;
        char why[640];

        switch (cq_store_connect(&w->sopts, &store, why, sizeof(why))) {
        case CQ_OK:
                atomic_store(&w->pg_seen, true);
                cq_store_destroy(&store);
                return 0;
        case CQ_ERR_FATAL:
                cq_errstr_set(errstr, errstr_size, "%s", why);
                return -1;
        default:
                cq_log_kv(CQ_LOG_WARN,
                          "PostgreSQL is not reachable yet: waiting for it, "
                          "not ready meanwhile",
                          "error", why, NULL);
                return 0;
        }
}

cq_worker_t *cq_worker_new(const cq_config_t *cfg,
                           const cq_worker_opts_t *opts,
                           char *errstr,
                           size_t errstr_size)
{
        cq_worker_t *w = calloc(1, sizeof(*w));
        long i;

        if (!w) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
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
        if (first_connect(w, errstr, errstr_size) != 0)
                goto fail;
        if (worker_metrics_init(w, errstr, errstr_size) != 0)
                goto fail;
        w->limiter = cq_llm_limiter_new((double)cfg->llm_rate_max);
        if (!w->limiter) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
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
                cq_errstr_set(errstr, errstr_size, "out of memory");
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
                /* forked runners start with the test harness compiled */
                cq_backend_set_runner_preload(w->backend, cq_testrun_harness());
                cq_log_kv(CQ_LOG_INFO, "interpreters ready", "backend",
                          cq_backend_describe(w->backend), NULL);
        }
        if (opts->intake || opts->relay) {
                w->prod = cq_producer_new(&w->kopts, errstr, errstr_size);
                if (!w->prod)
                        goto fail;
        }
        if (opts->events) {
                /* Progress events have a producer of their own, so they
                 * wait to be sent together (one produce request for many
                 * events, compressed) while completion events and the
                 * DLQ keep the shared producer's short linger. */
                cq_kafka_opts_t eopts = w->kopts;

                eopts.linger_ms = w->kopts.events_linger_ms;
                eopts.compression = "lz4";
                w->eprod = cq_producer_new(&eopts, errstr, errstr_size);
                if (!w->eprod)
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
                    cq_events_new(&w->kopts, w->eprod, errstr, errstr_size);
                if (!w->events)
                        goto fail;
        }
        if (worker_metrics_serve(w, errstr, errstr_size) != 0)
                goto fail;
        return w;
fail:
        cq_worker_destroy(&w);
        return NULL;
}

/* --------------------------------------------------------------- drain */

/* What the drain keeps of CODERQ_DRAIN_S for what follows the interrupt
 * of the cells and LLM calls still running: the jobs' checkpoints and
 * releases, the last completion events, the producers' flush and the
 * kernels' teardown. A quarter of the drain, at most this: the cells get
 * the rest. (The cells are abandoned, not waited for: 24 of them were
 * given back within 0.6 s on two busy cores.) */
#define DRAIN_MARGIN_MAX_MS 5000

/* One drain: its clock (cq_now_ms()) and what it did, for its log line. */
typedef struct drain {
        int64_t start, interrupt_at, end;
        long running;     /* jobs in the slots at the start */
        long interrupted; /* ... still there at interrupt_at */
        unsigned long long finished, released; /* the counters at the start */
} drain_t;

static long count_busy(cq_worker_t *w)
{
        long i, n = 0;

        for (i = 0; i < w->opts.slots; i++) {
                pthread_mutex_lock(&w->slots[i].lock);
                n += w->slots[i].busy;
                pthread_mutex_unlock(&w->slots[i].lock);
        }
        return n;
}

/* Stop taking work: intake and claims at once, jobs at their next
 * checkpoint, the kernel pool's starts now; the flushes that end the
 * drain end by its end. */
static void drain_begin(cq_worker_t *w, drain_t *d)
{
        int64_t drain_ms = (int64_t)w->opts.drain_s * 1000;
        int64_t margin = drain_ms / 4 < DRAIN_MARGIN_MAX_MS
                             ? drain_ms / 4
                             : DRAIN_MARGIN_MAX_MS;

        d->start = cq_now_ms();
        d->end = d->start + drain_ms;
        d->interrupt_at = d->end - margin;
        d->finished = atomic_load(&w->finished);
        d->released = atomic_load(&w->released);
        d->interrupted = 0;
        cq_log_kv(CQ_LOG_INFO, "shutting down: stopping intake and claims",
                  "worker", w->id, NULL);
        atomic_store(&w->stop_intake, 1);
        atomic_store(&w->stop_claims, 1);
        atomic_store(&w->stop_jobs, 1);
        wake_slots(w, w->opts.slots); /* idle ones see the stop now */
        d->running = count_busy(w);
        cq_backend_drain(w->backend);
        if (w->relay)
                cq_relay_flush_by(w->relay, d->end);
        if (w->prod)
                cq_producer_flush_by(w->prod, d->end);
        if (w->eprod)
                cq_producer_flush_by(w->eprod, d->end);
}

/* Let the jobs reach a checkpoint until the interrupt; then interrupt
 * what still runs (a cell, abandoned with its kernel, or an LLM call):
 * such a job goes back to the queue from its last checkpoint, its
 * interrupted cell not recorded, and runs that cell again elsewhere. */
static void drain_jobs(cq_worker_t *w, drain_t *d)
{
        long i;

        while (count_busy(w) > 0 && cq_now_ms() < d->interrupt_at)
                cq_nap_ms(50, NULL);
        d->interrupted = count_busy(w);
        if (d->interrupted == 0)
                return;
        cq_log_json(CQ_LOG_WARN, NULL,
                    "drain: interrupting %ld jobs still running, %lld ms "
                    "before its end",
                    d->interrupted, (long long)(d->end - cq_now_ms()));
        for (i = 0; i < w->opts.slots; i++)
                atomic_store(&w->slots[i].cancel, CQ_INTERP_CANCEL_ABANDON);
}

/* The drain's figures once every thread stopped: the jobs it found
 * running, those that finished and those given back meanwhile, those it
 * interrupted, and its time against CODERQ_DRAIN_S. */
static void drain_log(cq_worker_t *w, const drain_t *d)
{
        int64_t took = cq_now_ms() - d->start;
        json_t *fields = json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I}", "running", (json_int_t)d->running,
            "finished", (json_int_t)(atomic_load(&w->finished) - d->finished),
            "released", (json_int_t)(atomic_load(&w->released) - d->released),
            "interrupted", (json_int_t)d->interrupted, "drain_ms",
            (json_int_t)took, "limit_ms", (json_int_t)(d->end - d->start));

        cq_log_json(took > d->end - d->start ? CQ_LOG_WARN : CQ_LOG_INFO,
                    fields, "worker drained");
        json_decref(fields);
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
        else if ((!w->prod ||
                  !cq_producer_auth_failed(w->prod, why, sizeof(why))) &&
                 (!w->eprod ||
                  !cq_producer_auth_failed(w->eprod, why, sizeof(why))))
                return false;
        snprintf(w->errmsg, sizeof(w->errmsg),
                 "could not connect to Kafka at %s: %s", w->kopts.brokers, why);
        return true;
}

/* Whether waiting cannot help: PostgreSQL refused the worker before any
 * of its connections worked, or Kafka refused its credentials or TLS;
 * then w->errmsg says so. */
static bool waiting_cannot_help(cq_worker_t *w)
{
        if (atomic_load(&w->pg_refused)) {
                snprintf(w->errmsg, sizeof(w->errmsg), "%s", w->pg_why);
                return true;
        }
        return kafka_refused(w);
}

const char *cq_worker_errmsg(const cq_worker_t *worker)
{
        return worker->errmsg;
}

int cq_worker_run(cq_worker_t *w, volatile sig_atomic_t *signals)
{
        bool refused = false;
        drain_t drain;
        long i;
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
                atomic_store(&w->m.watch_hk, w->hk_started);
                atomic_store(&w->m.watch_listen, w->listen_started);
                atomic_store(&w->m.watch_intake, w->intake_started);
                atomic_store(&w->m.watch_relay, w->relay_started);
                atomic_store(&w->m.running_loop, true);
                while (*signals == 0 && !(refused = waiting_cannot_help(w)))
                        cq_nap_ms(200, NULL);
                if (refused)
                        cq_log_kv(CQ_LOG_ERROR,
                                  "stopping: waiting cannot fix this", "error",
                                  w->errmsg, NULL);
        } else {
                rc = -1;
        }

        atomic_store(&w->m.running_loop, false);
        drain_begin(w, &drain);
        drain_jobs(w, &drain);
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
        drain_log(w, &drain);
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
        /* first: its thread reads every other part */
        worker_metrics_release(w);
        cq_events_destroy(&w->events);
        cq_relay_destroy(&w->relay);
        cq_intake_destroy(&w->intake);
        cq_producer_destroy(&w->prod);
        cq_producer_destroy(&w->eprod);
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
