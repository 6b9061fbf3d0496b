/* SPDX-License-Identifier: MIT */
/* store.h - a PostgreSQL storage handle: its settings, connection and
 * errors. Every SQL statement of coderq is behind the headers of
 * coderq/storage/, one per source file: queue.h (the job queue), outbox.h,
 * artifacts.h (checkpoints and images), memory.h, queries.h (what the
 * command line reads), report.h, gauges.h, listen.h, probe.h, migrate.h.
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
        const char *queues;        /* the queues cq_store_claim() takes jobs
                                      from, comma-separated (CODERQ_QUEUES;
                                      NULL: "default") */
} cq_store_opts_t;

#define CQ_STORE_RESULTS_TOPIC "coderq.results"

/** @brief Defaults: lease 120 s, 3 attempts, notebook 64 MiB, image 32 MiB,
 *         threshold 0.3, reconnect 30 s, owner "coderq", prepared
 *         statements on, parent wait 3600 s, queue "default". */
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

/**
 * @brief cq_store_new() that says whether trying again can help.
 * @param storep (out) On CQ_OK the handle; caller owns it, free with
 *        cq_store_destroy(). NULL on error.
 * @returns CQ_OK; CQ_ERR_FATAL when waiting cannot help (no such
 *          database, refused credentials or TLS, an invalid DSN or
 *          queue list: see cq_pgconn_classify()); CQ_ERR_RETRIABLE when
 *          the server could not be reached (or out of memory). \p errstr
 *          is then "could not connect to PostgreSQL (CODERQ_PG_DSN: host=..
 *          port=.. dbname=.. user=..): reason".
 * @locality Any thread; the handle then belongs to that thread.
 */
CQ_NODISCARD cq_err_t cq_store_connect(const cq_store_opts_t *opts,
                                       cq_store_t **storep,
                                       char *errstr,
                                       size_t errstr_size);

void cq_store_destroy(cq_store_t **storep);

/** @brief The last error. Borrowed; valid until the next call. */
const char *cq_store_errmsg(const cq_store_t *store);

/** @brief The server process id of the current connection (tests). */
int cq_store_backend_pid(const cq_store_t *store);

/** @brief How many times the handle re-established its connection. */
unsigned cq_store_reconnects(const cq_store_t *store);

#endif
