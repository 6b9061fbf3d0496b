/* SPDX-License-Identifier: MIT */
/* pgconn.h - what coderq says about a PostgreSQL connection it could not
 * make: where it went (the DSN's host, port, database and user, or the PG*
 * variables libpq used in its place, never a password) and whether the
 * failure is a setting to fix (no such database, credentials, TLS) or an
 * outage to wait out. libpq gives no SQLSTATE for a failed connection, so
 * its message is read. */
#ifndef CODERQ_STORAGE_PGCONN_H
#define CODERQ_STORAGE_PGCONN_H

#include <stddef.h>

#include "coderq/common/common.h"

/** @brief The setting that holds the DSN, as messages name it. */
#define CQ_PGCONN_SETTING "CODERQ_PG_DSN"

/**
 * @brief Classify libpq's message of a failed connection and say it in
 *        one line.
 *
 * Waiting cannot fix: a database that does not exist; credentials the
 * server refuses (a wrong or missing password, a role that does not exist
 * or may not log in or connect, a pg_hba.conf rejection or no entry); TLS
 * the client refuses (a server without SSL when SSL is required, a
 * certificate not verified, a host name it does not match, a root
 * certificate or key file that cannot be read); a connection string libpq
 * cannot parse. Everything else is an outage: a refused connection, a
 * timeout, a host name not resolved, too many clients, a server starting
 * up, shutting down or in recovery, and any message not recognised (a
 * server whose messages are translated, say). With several hosts, one
 * failure that waiting cannot fix decides.
 *
 * @param message libpq's PQerrorMessage() of the failed connection
 *                (borrowed; lines end in '\n').
 * @param why     (out) The line that decided (the first for an outage),
 *                without libpq's "connection to server at "H", port P
 *                failed: " and the server's "FATAL:  "; NUL-terminated,
 *                cut to \p why_size.
 * @returns CQ_ERR_FATAL when waiting cannot help, else CQ_ERR_RETRIABLE.
 * @remark Pure: reads nothing but its arguments.
 * @locality Any thread.
 */
cq_err_t cq_pgconn_classify(const char *message, char *why, size_t why_size);

/** @brief What cq_pgconn_describe() shows of a DSN. */
enum cq_pgconn_flags {
        CQ_PGCONN_F_PASSWORD = 1 << 0, /* "password=(set)" when it has one */
};

/**
 * @brief The DSN's host (or hostaddr), port, database and user, as
 *        "host=db port=5432 dbname=coderq user=coderq" (parsed by libpq:
 *        a URI or key=value pairs); a key it leaves out but a PG*
 *        variable sets follows as "PGHOST=db". Never its password: with
 *        CQ_PGCONN_F_PASSWORD, "password=(set)" when it holds one.
 * @param dsn Borrowed; NULL: unset, then "not set" and the PG* variables
 *            libpq uses instead, or that none is set.
 * @param out (out) NUL-terminated, cut to \p out_size. A DSN libpq cannot
 *            parse is "not a valid connection string" (libpq's reason may
 *            quote a piece of it, a password too).
 * @locality Any thread (reads the environment).
 */
void cq_pgconn_describe(const char *dsn,
                        unsigned flags,
                        char *out,
                        size_t out_size);

/**
 * @brief One line on a failed connection to \p dsn: "\p what
 *        (CODERQ_PG_DSN: TARGET): WHY", TARGET as cq_pgconn_describe()
 *        gives it and WHY as cq_pgconn_classify() does.
 * @param what    Borrowed: "could not connect to PostgreSQL", ...
 * @param message libpq's PQerrorMessage(), or NULL when out of memory.
 * @returns As cq_pgconn_classify().
 * @locality Any thread.
 */
cq_err_t cq_pgconn_error(const char *what,
                         const char *dsn,
                         const char *message,
                         char *errstr,
                         size_t errstr_size);

#endif
