/* SPDX-License-Identifier: MIT */
/* probe.h - the intake's backlog count and coderq doctor's probe,
 * each on a connection of its own.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_PROBE_H
#define CODERQ_STORAGE_PROBE_H

#include "coderq/storage/store.h"

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
 * @returns 0, or -1 with \p errstr filled ("could not connect
 *          (CODERQ_PG_DSN: <target>): <reason>" in one line, as
 *          cq_pgconn_error() says it; "could not run a query: <libpq's
 *          reason>", which may span lines).
 * @locality Any thread.
 */
int cq_store_probe(const char *dsn,
                   int connect_timeout_s,
                   int statement_timeout_ms,
                   const char *application_name,
                   cq_store_probe_t *probe,
                   char *errstr,
                   size_t errstr_size);

#endif
