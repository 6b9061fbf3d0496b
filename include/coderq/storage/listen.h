/* SPDX-License-Identifier: MIT */
/* listen.h - the wake-up listener: LISTEN coderq_jobs on a
 * connection of its own.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_LISTEN_H
#define CODERQ_STORAGE_LISTEN_H

#include "coderq/storage/store.h"

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

#endif
