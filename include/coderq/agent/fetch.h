/* SPDX-License-Identifier: MIT */
/* fetch.h - download one http(s) URL into memory with a size cap and
 * timeouts; used for job input files given by URL. The worker fetches
 * outside any sandbox, so only public addresses are reached unless an
 * operator allows more (CODERQ_FETCH_ALLOW). */
#ifndef CODERQ_FETCH_H
#define CODERQ_FETCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "coderq/common/common.h"

/**
 * @brief GET \p url following at most 5 redirects (http and https only).
 *        Every connection, the first and each redirect's, goes only to an
 *        address that is public (cq_fetch_addr_is_public()) or allowed by
 *        \p allow; the address is checked after name resolution, on the
 *        socket curl is about to connect. Proxies from the environment
 *        are not used.
 * @param max Refuse a body larger than this many bytes.
 * @param allow Borrowed, may be NULL: a comma-separated allowlist of
 *              addresses or CIDR blocks ("10.1.0.0/16", "::1") and host
 *              names ("files.internal", matched exactly, any address).
 * @param datap (out) On CQ_OK the body; caller owns it (free()).
 * @returns CQ_OK; CQ_ERR_TOO_LARGE over \p max; CQ_ERR_RETRIABLE for
 *          network errors, timeouts, 429 and 5xx; CQ_ERR_FATAL for other
 *          statuses, bad URLs, a bad \p allow and refused addresses.
 *          \p errstr says which.
 * @locality Any thread (uses its own curl handle).
 */
CQ_NODISCARD cq_err_t cq_fetch_url(const char *url,
                                   size_t max,
                                   long timeout_s,
                                   const char *allow,
                                   unsigned char **datap,
                                   size_t *lenp,
                                   char *errstr,
                                   size_t errstr_size);

/**
 * @brief cq_fetch_url() that ends by \p deadline_ms (cq_now_ms()'s
 *        clock, every redirect included: "its deadline passed") or when
 *        \p cancel rises ("cancelled"), both CQ_ERR_RETRIABLE.
 * @param cancel Borrowed, may be NULL.
 */
CQ_NODISCARD cq_err_t cq_fetch_url_until(const char *url,
                                         size_t max,
                                         int64_t deadline_ms,
                                         const atomic_int *cancel,
                                         const char *allow,
                                         unsigned char **datap,
                                         size_t *lenp,
                                         char *errstr,
                                         size_t errstr_size);

/**
 * @brief Is \p sa a public unicast address? False for loopback, private
 *        (RFC 1918, fc00::/7), link-local, CGNAT (100.64/10), multicast,
 *        reserved, documentation and unspecified ranges, including their
 *        IPv4-mapped, IPv4-compatible, 6to4 and NAT64 IPv6 forms.
 * @locality Any thread.
 */
bool cq_fetch_addr_is_public(const struct sockaddr *sa);

/**
 * @brief Check the syntax of an allowlist (see cq_fetch_url()).
 * @returns 0, or -1 with \p errstr naming the bad entry.
 * @locality Any thread.
 */
int cq_fetch_allow_check(const char *allow, char *errstr, size_t errstr_size);

#endif
