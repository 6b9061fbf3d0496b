/* SPDX-License-Identifier: MIT */
/* worker_int.h - what worker.c (the threads) and worker_job.c (one job)
 * share: the worker and its slots, and the functions one calls in the
 * other. Not a public header. */
#ifndef CODERQ_WORKER_INT_H
#define CODERQ_WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "coderq/agent/agent.h"
#include "coderq/backend/backend.h"
#include "coderq/worker/httpd.h"
#include "coderq/common/job.h"
#include "coderq/consumer/kafka.h"
#include "coderq/agent/llm.h"
#include "coderq/common/metrics.h"
#include "coderq/common/prices.h"
#include "coderq/storage/queue.h"
#include "coderq/worker/worker.h"

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
} slot_t;

/* The metrics and the HTTP server (worker_metrics.c). Everything is NULL
 * without CODERQ_METRICS_ADDR, and updating it then does nothing. */
typedef struct worker_metrics {
        cq_metrics_t *reg;
        cq_httpd_t *httpd;
        cq_agent_metrics_t agent; /* the agent loop's families */
        cq_metric_t *finished, *kernels, *lag, *queue_jobs;
        cq_series_t *claimed, *running, *slots, *queued, *outbox_pending,
            *outbox_failed, *pool_size, *pool_ready, *pool_starting,
            *judges_idle, *judges_kept, *judges_taken, *kernel_failures,
            *intake_msgs, *dlq, *events_dropped, *events_sent, *outbox_claims,
            *outbox_empty, *server_up, *server_restarts, *server_refused;
        int64_t started_ms;
        int64_t next_queue;          /* housekeeping thread only */
        struct worker_queue *queues; /* coderq_queue_jobs' queues: the
                                        housekeeping thread's */
        size_t nqueues;
        atomic_llong beat_hk;     /* its loop's last round */
        atomic_llong beat_listen; /* the listener's */
        atomic_bool pg_ok;        /* the last count of the queue worked */
        atomic_bool intake_done;  /* the intake thread returned */
        atomic_bool running_loop; /* between start-up and shutdown */
        /* the threads /healthz and /readyz watch, set once they started
         * (the server's thread must not read the *_started flags) */
        atomic_bool watch_hk, watch_listen, watch_intake, watch_relay;
} worker_metrics_t;

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
        cq_producer_t *prod;  /* the intake's DLQ and the relay's */
        cq_producer_t *eprod; /* the progress events' (longer linger) */
        cq_intake_t *intake;
        cq_relay_t *relay;
        cq_events_t *events;
        pthread_t intake_thr, relay_thr, hk_thr, listen_thr;
        bool intake_started, relay_started, hk_started, listen_started;
        int intake_rc;
        atomic_bool intake_auth; /* the intake stopped: Kafka refused it */
        char errmsg[640];        /* why cq_worker_run() returned 1 */
        /* Until one connection to PostgreSQL worked, a failure waiting
         * cannot fix (cq_pgconn_classify()) stops the worker: the first
         * thread to see one claims pg_why, writes it, then raises
         * pg_refused. */
        atomic_bool pg_seen, pg_claimed, pg_refused;
        char pg_why[640];
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
        atomic_ullong finished, released; /* jobs finished, given back */
        worker_metrics_t m;
};

/* worker.c */

/* Interrupt the job \p job_id if \p slot still runs it, its lease lost
 * (\p lost) or its cancel requested (worker.c). Whether it does; for a
 * cancel, only the first time. */
bool worker_slot_mark(slot_t *slot, const char *job_id, bool lost);

/* worker_metrics.c */

/* Build the registry when CODERQ_METRICS_ADDR is set; 0 or -1. */
int worker_metrics_init(cq_worker_t *w, char *errstr, size_t errstr_size);
/* Listen and serve, once every part of the worker exists; 0 or -1. */
int worker_metrics_serve(cq_worker_t *w, char *errstr, size_t errstr_size);
/* Stop serving and free the registry. */
void worker_metrics_release(cq_worker_t *w);
/* A job finished with \p status and \p reason_code (NULL: none). */
void worker_metrics_finished(cq_worker_t *w,
                             const char *status,
                             const char *reason_code);
/* Housekeeping's round: its heartbeat, and every QUEUE_EVERY_MS the
 * queue's sizes over \p store. */
void worker_metrics_housekeep(cq_worker_t *w, cq_store_t *store, int64_t now);

/* worker_job.c */

void worker_run_job(slot_t *slot, cq_claim_t *claim);

#endif
