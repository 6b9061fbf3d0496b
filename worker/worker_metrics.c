/* SPDX-License-Identifier: MIT */
/* worker_metrics.c - what `coderq worker` serves on CODERQ_METRICS_ADDR:
 * the registry of its metrics (docs/OPERATIONS.md#metrics), the values it
 * mirrors from the intake, relay, events and kernel pool at each scrape, the
 * queue sizes the housekeeping thread reads every QUEUE_EVERY_MS, and the
 * answers of /healthz (every thread's heartbeat is recent) and /readyz
 * (it can take jobs). The HTTP server is httpd.c's; it runs on a thread
 * of its own. */
#include "coderq/worker/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/worker/httpd.h"
#include "coderq/common/log.h"
#include "coderq/storage/gauges.h"
#include "coderq/common/metrics.h"
#include "coderq/common/util.h"
#include "worker_int.h"

/* How often housekeeping counts the queue (one statement) and reads the
 * depth of each named queue (another). */
#define QUEUE_EVERY_MS 2000

/* The named queues coderq_queue_jobs has series of at most; the jobs of
 * the others count under the queue "other", which has a slot of its own
 * beyond these. */
#define QUEUE_SERIES_MAX 64

/* The states of coderq_queue_jobs, as the view queue_depth counts them. */
static const char *const queue_states[] = {"queued", "waiting", "running"};

/* A queue coderq_queue_jobs has series of, and its jobs this round. */
struct worker_queue {
        char name[CQ_QUEUE_NAME_MAX + 1];
        cq_series_t *series[CQ_ARRAY_SIZE(queue_states)];
        long long jobs[CQ_ARRAY_SIZE(queue_states)];
};

/* Add a family; on failure *failed is set and NULL returned. */
static cq_metric_t *labelled(cq_worker_t *w,
                             cq_metric_type_t type,
                             const char *name,
                             const char *help,
                             const char *label1,
                             const char *label2,
                             size_t max_series,
                             char *errstr,
                             size_t errstr_size,
                             bool *failed)
{
        cq_metric_def_t def;
        cq_metric_t *m;

        memset(&def, 0, sizeof(def));
        def.type = type;
        def.name = name;
        def.help = help;
        def.labels[0] = label1;
        def.labels[1] = label2;
        def.max_series = max_series;
        m = cq_metrics_add(w->m.reg, &def, errstr, errstr_size);
        if (!m)
                *failed = true;
        return m;
}

/* A gauge or counter without labels: its one series. */
static cq_series_t *plain(cq_worker_t *w,
                          cq_metric_type_t type,
                          const char *name,
                          const char *help,
                          char *errstr,
                          size_t errstr_size,
                          bool *failed)
{
        return cq_metric_series(labelled(w, type, name, help, NULL, NULL, 0,
                                         errstr, errstr_size, failed),
                                NULL);
}

static int add_families(cq_worker_t *w, char *errstr, size_t errstr_size)
{
        worker_metrics_t *m = &w->m;
        bool failed = false;
        const cq_metric_type_t C = CQ_METRIC_COUNTER, G = CQ_METRIC_GAUGE;

        m->claimed = plain(w, C, "coderq_jobs_claimed_total",
                           "Jobs this worker's slots claimed", errstr,
                           errstr_size, &failed);
        /* statuses x reason codes: a few dozen; the bound is a guard */
        m->finished =
            labelled(w, C, "coderq_jobs_finished_total",
                     "Jobs this worker finished, by status and "
                     "reason code (none: no code)",
                     "status", "reason", 96, errstr, errstr_size, &failed);
        m->running = plain(w, G, "coderq_jobs_running",
                           "Jobs running in this worker's slots now", errstr,
                           errstr_size, &failed);
        m->slots = plain(w, G, "coderq_slots", "Job slots of this worker",
                         errstr, errstr_size, &failed);
        m->queued = plain(w, G, "coderq_queue_depth",
                          "Jobs queued in PostgreSQL (all workers'), read "
                          "every 2 s",
                          errstr, errstr_size, &failed);
        /* every state of the named queues and of "other", and the
         * series the registry keeps for a combination past its bound,
         * which queue_of() never lets it reach */
        m->queue_jobs =
            labelled(w, G, "coderq_queue_jobs",
                     "Jobs of each named queue by state (queued: claimable "
                     "now, waiting: held back, running), from the view "
                     "queue_depth, read every 2 s",
                     "queue", "state",
                     CQ_ARRAY_SIZE(queue_states) * (QUEUE_SERIES_MAX + 1) + 1,
                     errstr, errstr_size, &failed);
        m->outbox_pending = plain(w, G, "coderq_outbox_pending",
                                  "Completion events in the outbox not sent "
                                  "yet, read every 2 s",
                                  errstr, errstr_size, &failed);
        m->outbox_failed = plain(w, G, "coderq_outbox_failed",
                                 "Outbox rows whose event failed for good, "
                                 "read every 2 s",
                                 errstr, errstr_size, &failed);
        m->pool_size = plain(w, G, "coderq_kernel_pool_size",
                             "Local kernels the pool keeps ready "
                             "(CODERQ_KPOOL_SIZE)",
                             errstr, errstr_size, &failed);
        m->pool_ready =
            plain(w, G, "coderq_kernel_pool_ready", "Local kernels ready now",
                  errstr, errstr_size, &failed);
        m->pool_starting =
            plain(w, G, "coderq_kernel_pool_starting",
                  "Local kernels starting now", errstr, errstr_size, &failed);
        m->judges_idle = plain(w, G, "coderq_judges_idle",
                               "Judging interpreters kept, waiting for a "
                               "run of the test code they ran",
                               errstr, errstr_size, &failed);
        m->judges_kept = plain(w, C, "coderq_judges_kept_total",
                               "Judging interpreters kept after a run that "
                               "ended cleanly",
                               errstr, errstr_size, &failed);
        m->judges_taken = plain(w, C, "coderq_judges_taken_total",
                                "Runs of code tests that took a kept judging "
                                "interpreter instead of starting one",
                                errstr, errstr_size, &failed);
        m->kernels = labelled(w, C, "coderq_kernels_started_total",
                              "Local kernels started, by kind (cold: a new "
                              "process, forked: by the kernel server)",
                              "kind", NULL, 3, errstr, errstr_size, &failed);
        m->kernel_failures = plain(w, C, "coderq_kernel_start_failures_total",
                                   "Local kernel starts that failed", errstr,
                                   errstr_size, &failed);
        m->server_up = plain(w, G, "coderq_kernel_server_up",
                             "1 while the kernel server is ready to fork "
                             "kernels; 0 while it is down or restarting, "
                             "or off (every kernel starts cold)",
                             errstr, errstr_size, &failed);
        m->server_restarts =
            plain(w, C, "coderq_kernel_server_restarts_total",
                  "Kernel server processes started again after one died "
                  "or failed",
                  errstr, errstr_size, &failed);
        m->server_refused =
            plain(w, C, "coderq_kernel_server_misses_total",
                  "Kernel starts the kernel server did not serve (down, "
                  "restarting or refused), each started cold instead",
                  errstr, errstr_size, &failed);
        m->intake_msgs = plain(w, C, "coderq_intake_messages_total",
                               "Messages the intake consumed from the jobs "
                               "topic",
                               errstr, errstr_size, &failed);
        m->lag = labelled(w, G, "coderq_intake_lag",
                          "Consumer lag of each partition assigned to this "
                          "worker: high watermark minus position",
                          "partition", NULL, CQ_INTAKE_LAG_MAX + 1, errstr,
                          errstr_size, &failed);
        m->dlq = plain(w, C, "coderq_dlq_messages_total",
                       "Messages the intake sent to the dead-letter topic",
                       errstr, errstr_size, &failed);
        m->events_dropped = plain(w, C, "coderq_progress_events_dropped_total",
                                  "Progress events dropped (queue full or "
                                  "producer refused)",
                                  errstr, errstr_size, &failed);
        m->events_sent = plain(w, C, "coderq_completion_events_sent_total",
                               "Completion events the relay published and "
                               "marked sent",
                               errstr, errstr_size, &failed);
        m->outbox_claims = plain(w, C, "coderq_outbox_claims_total",
                                 "Outbox claims the relay made (kicked by a "
                                 "finish or polled)",
                                 errstr, errstr_size, &failed);
        m->outbox_empty = plain(w, C, "coderq_outbox_empty_claims_total",
                                "Outbox claims that found no row", errstr,
                                errstr_size, &failed);
        if (failed)
                return -1;
        return cq_agent_metrics_add(&m->agent, m->reg, errstr, errstr_size);
}

/* At each scrape: what other parts count, and the slots' state. */
static void collect(void *opaque)
{
        cq_worker_t *w = opaque;
        worker_metrics_t *m = &w->m;
        cq_backend_pool_t pool;
        cq_judges_stats_t judges;
        long i, busy = 0;

        for (i = 0; i < w->opts.slots; i++) {
                pthread_mutex_lock(&w->slots[i].lock);
                busy += w->slots[i].busy;
                pthread_mutex_unlock(&w->slots[i].lock);
        }
        cq_series_set(m->running, (double)busy);
        cq_series_set(m->slots, (double)w->opts.slots);
        cq_backend_judges(w->backend, &judges);
        cq_series_set(m->judges_idle, (double)judges.idle);
        cq_series_set(m->judges_kept, (double)judges.kept);
        cq_series_set(m->judges_taken, (double)judges.taken);
        if (cq_backend_pool(w->backend, &pool)) {
                cq_series_set(m->pool_size, (double)pool.size);
                cq_series_set(m->pool_ready, (double)pool.ready);
                cq_series_set(m->pool_starting, (double)pool.starting);
                cq_series_set(
                    cq_metric_series(m->kernels, (const char *[]){"cold"}),
                    (double)(pool.started - pool.forked));
                cq_series_set(
                    cq_metric_series(m->kernels, (const char *[]){"forked"}),
                    (double)pool.forked);
                cq_series_set(m->kernel_failures, (double)pool.failed);
                cq_series_set(m->server_up, pool.server_up ? 1.0 : 0.0);
                cq_series_set(m->server_restarts, (double)pool.server_restarts);
                cq_series_set(m->server_refused, (double)pool.server_refused);
        }
        if (w->intake) {
                cq_intake_stats_t st;
                cq_intake_lag_t lag[CQ_INTAKE_LAG_MAX];
                size_t n, k;

                cq_intake_stats(w->intake, &st);
                cq_series_set(m->intake_msgs, (double)st.received);
                cq_series_set(m->dlq, (double)st.dlq);
                n = cq_intake_lag(w->intake, lag, CQ_ARRAY_SIZE(lag));
                /* partitions no longer assigned read 0, not their last */
                cq_metric_zero(m->lag);
                for (k = 0; k < n; k++) {
                        char part[16];

                        snprintf(part, sizeof(part), "%d",
                                 (int)lag[k].partition);
                        cq_series_set(
                            cq_metric_series(m->lag, (const char *[]){part}),
                            (double)lag[k].lag);
                }
        }
        if (w->events) {
                cq_events_stats_t st;

                cq_events_stats(w->events, &st);
                cq_series_set(m->events_dropped, (double)st.dropped);
        }
        if (w->relay) {
                cq_relay_stats_t st;

                cq_relay_stats(w->relay, &st);
                cq_series_set(m->events_sent, (double)st.sent);
                cq_series_set(m->outbox_claims, (double)st.claims);
                cq_series_set(m->outbox_empty, (double)st.empty);
        }
}

/* Whether a thread whose loop last went round at \p beat is wedged; a
 * thread that has not gone round yet counts from the worker's start. */
static bool stalled(const cq_worker_t *w, int64_t beat, int64_t now)
{
        if (beat < w->m.started_ms)
                beat = w->m.started_ms;
        return now - beat > (int64_t)w->cfg->health_stall_s * 1000;
}

/* /healthz: "ok", or the first wedged thread. */
static bool healthy(cq_worker_t *w, cq_buf_t *body)
{
        int64_t now = cq_now_ms();
        const char *bad = NULL;

        /* starting or stopping, threads are not expected to go round */
        if (!atomic_load(&w->m.running_loop))
                ;
        else if (atomic_load(&w->m.watch_hk) &&
                 stalled(w, atomic_load(&w->m.beat_hk), now))
                bad = "housekeeping";
        else if (atomic_load(&w->m.watch_listen) &&
                 stalled(w, atomic_load(&w->m.beat_listen), now))
                bad = "listener";
        else if (atomic_load(&w->m.watch_intake) &&
                 !atomic_load(&w->m.intake_done)) {
                cq_intake_stats_t st;

                cq_intake_stats(w->intake, &st);
                if (stalled(w, st.beat_ms, now))
                        bad = "intake";
        }
        if (!bad && atomic_load(&w->m.running_loop) &&
            atomic_load(&w->m.watch_relay)) {
                cq_relay_stats_t st;

                cq_relay_stats(w->relay, &st);
                if (stalled(w, st.beat_ms, now))
                        bad = "relay";
        }
        if (bad) {
                if (cq_buf_printf(body,
                                  "unhealthy: the %s thread has not gone "
                                  "round for over %ld s\n",
                                  bad, w->cfg->health_stall_s) != CQ_OK)
                        cq_buf_reset(body);
                return false;
        }
        if (cq_buf_append_str(body, "ok\n") != CQ_OK)
                cq_buf_reset(body);
        return true;
}

/* Whether PostgreSQL answers, by every sign the worker has: the last
 * count of the queue (housekeeping's; during an outage its next attempt
 * may wait for CODERQ_PG_RECONNECT_S), the job listener's connection, and
 * what the intake and the relay saw last (the relay looks every
 * CODERQ_RELAY_INTERVAL_MS). */
static bool pg_reachable(cq_worker_t *w)
{
        cq_intake_stats_t ist;
        cq_relay_stats_t rst;

        if (atomic_load(&w->m.watch_hk) && !atomic_load(&w->m.pg_ok))
                return false;
        if (atomic_load(&w->m.watch_listen) && !atomic_load(&w->listening))
                return false;
        if (w->intake) {
                cq_intake_stats(w->intake, &ist);
                if (ist.pg_down)
                        return false;
        }
        if (w->relay) {
                cq_relay_stats(w->relay, &rst);
                if (rst.pg_down)
                        return false;
        }
        return true;
}

/* /readyz: it can take jobs. */
static bool ready(cq_worker_t *w, cq_buf_t *body)
{
        const char *why = NULL;

        if (!atomic_load(&w->m.running_loop) || atomic_load(&w->stop_claims) ||
            atomic_load(&w->stop_intake))
                why = "not running: starting or shutting down";
        else if (!pg_reachable(w))
                why = "PostgreSQL is not reachable";
        else if (w->intake) {
                cq_intake_stats_t st;

                cq_intake_stats(w->intake, &st);
                if (st.assigned <= 0)
                        why = "the intake has no partition assigned";
        }
        if (why) {
                if (cq_buf_printf(body, "not ready: %s\n", why) != CQ_OK)
                        cq_buf_reset(body);
                return false;
        }
        if (cq_buf_append_str(body, "ready\n") != CQ_OK)
                cq_buf_reset(body);
        return true;
}

static int handle(void *opaque,
                  const char *path,
                  cq_buf_t *body,
                  const char **content_typep)
{
        cq_worker_t *w = opaque;

        if (strcmp(path, "/metrics") == 0) {
                if (cq_metrics_render(w->m.reg, body) != CQ_OK) {
                        cq_buf_reset(body);
                        return 500;
                }
                *content_typep = CQ_METRICS_CONTENT_TYPE;
                return 200;
        }
        if (strcmp(path, "/healthz") == 0)
                return healthy(w, body) ? 200 : 503;
        if (strcmp(path, "/readyz") == 0)
                return ready(w, body) ? 200 : 503;
        if (cq_buf_append_str(body, "not found: try /metrics, /healthz or "
                                    "/readyz\n") != CQ_OK)
                cq_buf_reset(body);
        return 404;
}

int worker_metrics_init(cq_worker_t *w, char *errstr, size_t errstr_size)
{
        w->m.started_ms = cq_now_ms();
        if (!w->cfg->metrics_addr || !*w->cfg->metrics_addr)
                return 0;
        w->m.reg = cq_metrics_new();
        if (!w->m.reg) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        w->m.queues = calloc(QUEUE_SERIES_MAX + 1, sizeof(*w->m.queues));
        if (!w->m.queues) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        if (add_families(w, errstr, errstr_size) != 0)
                return -1;
        cq_metrics_on_collect(w->m.reg, collect, w);
        return 0;
}

int worker_metrics_serve(cq_worker_t *w, char *errstr, size_t errstr_size)
{
        cq_httpd_opts_t opts;

        if (!w->m.reg)
                return 0;
        memset(&opts, 0, sizeof(opts));
        opts.addr = w->cfg->metrics_addr;
        opts.handler = handle;
        opts.opaque = w;
        w->m.httpd = cq_httpd_new(&opts, errstr, errstr_size);
        if (!w->m.httpd)
                return -1;
        {
                char port[16];

                snprintf(port, sizeof(port), "%d", cq_httpd_port(w->m.httpd));
                cq_log_kv(CQ_LOG_INFO, "serving metrics", "addr",
                          w->cfg->metrics_addr, "port", port, NULL);
        }
        return 0;
}

void worker_metrics_release(cq_worker_t *w)
{
        cq_httpd_destroy(&w->m.httpd);
        cq_metrics_destroy(&w->m.reg);
        free(w->m.queues);
        w->m.queues = NULL;
        w->m.nqueues = 0;
}

void worker_metrics_finished(cq_worker_t *w,
                             const char *status,
                             const char *reason_code)
{
        cq_series_add(
            cq_metric_series(
                w->m.finished,
                (const char *[]){status, reason_code ? reason_code : "none"}),
            1);
}

/* The queue \p name of coderq_queue_jobs: found, else given a slot while
 * there is one for a named queue, else "other" (whose slot is kept). */
static struct worker_queue *queue_of(worker_metrics_t *m, const char *name)
{
        struct worker_queue *q;
        size_t k;

        for (k = 0; k < m->nqueues; k++)
                if (strcmp(m->queues[k].name, name) == 0)
                        return &m->queues[k];
        if (m->nqueues >= QUEUE_SERIES_MAX &&
            strcmp(name, CQ_METRICS_OTHER) != 0)
                return queue_of(m, CQ_METRICS_OTHER);
        q = &m->queues[m->nqueues++];
        snprintf(q->name, sizeof(q->name), "%s", name);
        for (k = 0; k < CQ_ARRAY_SIZE(queue_states); k++)
                q->series[k] = cq_metric_series(
                    m->queue_jobs, (const char *[]){q->name, queue_states[k]});
        return q;
}

static void queue_add(struct worker_queue *q, const cq_store_queue_depth_t *d)
{
        q->jobs[0] += d->queued;
        q->jobs[1] += d->waiting;
        q->jobs[2] += d->running;
}

/* coderq_queue_jobs from the depth of the queues: a queue that has no
 * jobs left reads 0, not what it had. */
static void set_queue_jobs(worker_metrics_t *m,
                           const cq_store_queue_depth_t *depths,
                           size_t n,
                           const cq_store_queue_depth_t *rest)
{
        size_t i, k;

        for (i = 0; i < m->nqueues; i++)
                memset(m->queues[i].jobs, 0, sizeof(m->queues[i].jobs));
        for (i = 0; i < n; i++)
                queue_add(queue_of(m, depths[i].queue), &depths[i]);
        if (rest->queued + rest->waiting + rest->running > 0)
                queue_add(queue_of(m, CQ_METRICS_OTHER), rest);
        for (i = 0; i < m->nqueues; i++)
                for (k = 0; k < CQ_ARRAY_SIZE(queue_states); k++)
                        cq_series_set(m->queues[i].series[k],
                                      (double)m->queues[i].jobs[k]);
}

void worker_metrics_housekeep(cq_worker_t *w, cq_store_t *store, int64_t now)
{
        cq_store_queue_depth_t depths[QUEUE_SERIES_MAX], rest;
        cq_store_gauges_t g;
        size_t n = 0;

        atomic_store(&w->m.beat_hk, now);
        if (now < w->m.next_queue)
                return;
        w->m.next_queue = now + QUEUE_EVERY_MS;
        /* the depth of each queue only for the metrics that show it */
        if (cq_store_gauges(store, &g) != CQ_OK ||
            (w->m.queues &&
             cq_store_queue_depths(store, depths, CQ_ARRAY_SIZE(depths), &n,
                                   &rest) != CQ_OK)) {
                if (atomic_exchange(&w->m.pg_ok, false))
                        cq_log_kv(CQ_LOG_WARN, "could not count the queue",
                                  "error", cq_store_errmsg(store), NULL);
                return;
        }
        atomic_store(&w->m.pg_ok, true);
        cq_series_set(w->m.queued, (double)g.queued);
        cq_series_set(w->m.outbox_pending, (double)g.outbox_pending);
        cq_series_set(w->m.outbox_failed, (double)g.outbox_failed);
        if (w->m.queues)
                set_queue_jobs(&w->m, depths, n, &rest);
}
