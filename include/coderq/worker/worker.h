/* SPDX-License-Identifier: MIT */
/* worker.h - the worker daemon: intake (Kafka -> PostgreSQL), N slots
 * (claim -> agent loop -> finish), the outbox relay, progress events and
 * housekeeping (lease heartbeat, requeue of expired leases, cancel
 * requests). PostgreSQL is the queue: a slot owns its job through a lease
 * and checkpoints every message and cell, so another worker resumes a job
 * whose worker died. */
#ifndef CODERQ_WORKER_H
#define CODERQ_WORKER_H

#include <signal.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"

typedef struct cq_worker cq_worker_t;

/** @brief What a worker runs. */
typedef struct cq_worker_opts {
        bool intake;  /* consume the jobs topic */
        bool relay;   /* publish completion events */
        bool events;  /* publish progress events */
        long slots;   /* job threads; 0 runs only intake and relay */
        long drain_s; /* deadline to bring jobs to a checkpoint */
} cq_worker_opts_t;

void cq_worker_opts_from_config(cq_worker_opts_t *opts, const cq_config_t *cfg);

/**
 * @brief Build every part (stores connect lazily; kernels start warming).
 * @param cfg Borrowed; must outlive the worker.
 * @returns Caller owns the returned value; free with cq_worker_destroy().
 *          NULL with \p errstr filled.
 * @locality The main thread.
 */
cq_worker_t *cq_worker_new(const cq_config_t *cfg,
                           const cq_worker_opts_t *opts,
                           char *errstr,
                           size_t errstr_size);

/**
 * @brief Run until *\p signals becomes non-zero (a signal handler counts
 *        SIGTERM/SIGINT there), then shut down gracefully: stop intake and
 *        claims, let each job reach a checkpoint within the deadline and
 *        give it back to the queue, flush the producer, commit, close.
 *        It also stops, the same way, when Kafka refuses its credentials
 *        or TLS (cq_kafka_err_is_auth(): waiting cannot fix that).
 * @returns 0 after a clean shutdown, -1 when a part failed to stop cleanly
 *          (the final commit, a thread), 1 when it stopped because Kafka
 *          refused it (see cq_worker_errmsg()).
 * @locality The main thread.
 */
CQ_NODISCARD int cq_worker_run(cq_worker_t *worker,
                               volatile sig_atomic_t *signals);

/** @brief Why cq_worker_run() returned 1: "could not connect to Kafka at
 *         BROKERS: reason". Borrowed; valid until the worker is
 *         destroyed. */
const char *cq_worker_errmsg(const cq_worker_t *worker);

void cq_worker_destroy(cq_worker_t **workerp);

#endif
