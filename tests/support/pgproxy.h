/* SPDX-License-Identifier: MIT */
/* pgproxy.h - a TCP proxy in front of PostgreSQL that can lose a reply:
 * armed with a marker, it forwards the client's request holding that
 * marker, keeps back everything the server answers, and closes the
 * client's connection when the server's side closes or the test says so.
 * The server has then run (and committed) what the client never hears
 * of: the connection loss a retried write must survive. One thread,
 * loopback only. */
#ifndef CODERQ_CHECK_PGPROXY_H
#define CODERQ_CHECK_PGPROXY_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cq_pgproxy cq_pgproxy_t;

/**
 * @brief Listen on an ephemeral loopback port, forwarding to the server of
 *        \p dsn (TCP host and port, or a Unix socket directory).
 * @returns Stop with cq_pgproxy_stop(); fails the test on an error.
 */
cq_pgproxy_t *cq_pgproxy_start(const char *dsn);

/** @brief cq_pgproxy_start() on loopback port \p port (0: an ephemeral
 *         one): a server that a test brings up where clients already
 *         knock. */
cq_pgproxy_t *cq_pgproxy_start_on(const char *dsn, int port);

/** @brief \p dsn routed through the proxy (no TLS), into \p out. */
void cq_pgproxy_dsn(const cq_pgproxy_t *proxy,
                    const char *dsn,
                    char *out,
                    size_t size);

/** @brief Hold the server's replies on the connection whose next client
 *         bytes contain \p marker (once; at most 31 bytes). */
void cq_pgproxy_hold_after(cq_pgproxy_t *proxy, const char *marker);

/** @brief Wait up to \p timeout_ms until a held connection got a complete
 *         ReadyForQuery from the server: its request was answered (and an
 *         implicit or explicit COMMIT done). */
bool cq_pgproxy_wait_held(cq_pgproxy_t *proxy, int timeout_ms);

/** @brief Close the held connections without forwarding their replies. */
void cq_pgproxy_drop_held(cq_pgproxy_t *proxy);

void cq_pgproxy_stop(cq_pgproxy_t **proxyp);

#endif
