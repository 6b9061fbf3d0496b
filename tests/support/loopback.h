/* SPDX-License-Identifier: MIT */
/* loopback.h - pieces of the tests' own tiny HTTP servers on 127.0.0.1:
 * a port nothing listens on, one request accepted and read, and a cancel
 * flag raised from another thread while a request waits. */
#ifndef CODERQ_TEST_LOOPBACK_H
#define CODERQ_TEST_LOOPBACK_H

#include <stddef.h>

/**
 * @brief A socket listening on an ephemeral port of the IPv4 address
 *        \p ip ("127.0.0.1", "127.0.0.2"); fails the test when it cannot.
 * @param portp (out) Its port.
 * @returns The socket (close() it).
 */
int cq_loopback_listen(const char *ip, int *portp);

/** @brief A loopback port nothing listens on (bound once, then closed);
 *         fails the test when it cannot find one. */
int cq_loopback_dead_port(void);

/**
 * @brief Accept a connection on the listening socket \p fd, waiting at
 *        most \p poll_ms, and read its request head (up to the blank line
 *        or \p size - 1 bytes) into \p req, NUL-terminated.
 * @returns The connection (close() it), or -1 when none came.
 */
int cq_loopback_accept(int fd, int poll_ms, char *req, size_t size);

/** @brief A pthread start routine: after 300 ms, store 1 in the
 *         atomic_int \p flag points at. */
void *cq_loopback_raise_later(void *flag);

#endif
