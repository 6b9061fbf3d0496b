/* SPDX-License-Identifier: MIT */
/* pgtest.h - databases of their own for the integration suites: each
 * suite (or test) works in a fresh database on the server named by
 * CODERQ_PG_DSN, so suites never see each other's jobs, and drops it
 * afterwards. Every helper fails the current test on an error. */
#ifndef CODERQ_CHECK_PGTEST_H
#define CODERQ_CHECK_PGTEST_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

/** @brief \p base (a conninfo or URI) with its dbname replaced, written as
 *         a keyword='value' conninfo into \p out. */
void cq_pgtest_dsn_for(const char *base,
                       const char *dbname,
                       char *out,
                       size_t size);

/** @brief Connect to \p dsn; fails the test when it cannot. */
PGconn *cq_pgtest_connect(const char *dsn);

/** @brief Run \p sql on \p conn; fails the test on an error. */
void cq_pgtest_exec(PGconn *conn, const char *sql);

/**
 * @brief Create an empty database "<prefix>_<pid>_<n>_<ms>" and, when
 *        \p migrate, apply the project's migrations to it.
 * @param dsn (out) Its conninfo. @param name (out) Its name.
 */
void cq_pgtest_create(const char *prefix,
                      bool migrate,
                      char *dsn,
                      size_t dsn_size,
                      char *name,
                      size_t name_size);

/** @brief Drop database \p name (connections are closed); errors ignored. */
void cq_pgtest_drop(const char *name);

/** @brief Drop the "<prefix>_<pid>_..." databases of processes that are
 *         gone (a failed test exits before its teardown). */
void cq_pgtest_sweep(const char *prefix);

#endif
