/* SPDX-License-Identifier: MIT */
/* util.h - small helpers shared by every folder: clocks, timestamps,
 * text repair (ANSI escapes, invalid UTF-8), base64 and SHA-256. All are
 * pure functions, safe from any thread. */
#ifndef CODERQ_UTIL_H
#define CODERQ_UTIL_H

#include "coderq/common/common.h"

#include <stdatomic.h>
#include <time.h>

/** @brief Monotonic milliseconds, for deadlines and durations. */
int64_t cq_now_ms(void);

/**
 * @brief The CLOCK_REALTIME instant \p ms from now, for
 *        pthread_cond_timedwait() (whose default clock that is).
 */
void cq_abstime_in(struct timespec *ts, int64_t ms);

/**
 * @brief Sleep up to \p ms, waking within 50 ms when *\p flag (may be
 *        NULL) is raised: a thread's nap that a shutdown can cut short.
 * @locality Any thread.
 */
void cq_nap_ms(int64_t ms, const atomic_int *flag);

/** @brief How cq_backoff_ms() spreads a wait below its ceiling. */
typedef enum cq_jitter {
        CQ_JITTER_NONE,  /* the ceiling itself: a lone waiter, such as one
                            thread reconnecting to PostgreSQL */
        CQ_JITTER_EQUAL, /* uniform in [ceiling / 2, ceiling]: waiters
                            spread out, and none comes back sooner than
                            half the ceiling (a requeued job) */
        CQ_JITTER_FULL,  /* uniform in [0, ceiling], AWS's "full jitter":
                            the least contention when many clients retry
                            one server (the LLM, E2B) */
} cq_jitter_t;

/**
 * @brief The wait before retry \p n (1 for the first) of every retry loop:
 *        the ceiling min(\p max_ms, \p first_ms * 2^(n - 1)), spread by
 *        \p jitter. The doubling stops at the cap, so no \p n overflows.
 * @returns 0 .. max_ms (0 when \p first_ms or \p max_ms is <= 0).
 * @locality Any thread: the jitter comes from cq_rand64().
 */
int64_t
cq_backoff_ms(int n, int64_t first_ms, int64_t max_ms, cq_jitter_t jitter);

/**
 * @brief UTC ISO 8601 with microseconds zero-padded to 6 digits and a 'Z':
 *        "2026-11-29T09:38:32.009516Z" (Jupyter's header.date form).
 * @param out At least 32 bytes.
 */
void cq_iso8601_now(char *out, size_t size);

/**
 * @brief A pseudo-random value from the calling thread's own generator
 *        (xorshift64*), seeded from getrandom() on the thread's first call
 *        (from the clock and the thread's address when that fails). For
 *        jitter, never for secrets; rand() and random() share one hidden
 *        state between threads and are not used.
 * @locality Any thread; no locks, no shared state.
 */
uint64_t cq_rand64(void);

/** @brief cq_rand64() reduced to [0, \p n); 0 when \p n is 0. */
uint64_t cq_rand_below(uint64_t n);

/**
 * @brief Copy \p in without ANSI escape sequences (CSI "ESC [ ... final",
 *        8-bit CSI 0x9b, OSC "ESC ] ... BEL|ESC \", and two-byte escapes).
 * @returns Caller owns the returned value (free()), NUL-terminated; NULL
 *          when out of memory. \p outlenp (optional) gets its length.
 */
char *cq_ansi_strip(const char *in, size_t len, size_t *outlenp);

/** @brief Whether \p in is valid UTF-8 (no overlongs, no surrogates). */
bool cq_utf8_valid(const char *in, size_t len);

/**
 * @brief Copy \p in replacing each invalid UTF-8 sequence (including encoded
 *        surrogates and overlong forms) with U+FFFD, as Python's
 *        decode("utf-8", "replace") does. NUL bytes are kept.
 * @returns Caller owns the returned value (free()); NULL when out of memory.
 */
char *cq_utf8_repair(const char *in, size_t len, size_t *outlenp);

/**
 * @brief Standard base64 with padding.
 * @returns Caller owns the returned value (free()); NULL when out of memory.
 */
char *cq_b64_encode(const void *data, size_t len, size_t *outlenp);

/**
 * @brief Decode standard base64; ASCII whitespace (as in the "\n" that
 *        IPython appends to PNG payloads) is skipped, padding is optional.
 * @returns Caller owns the returned value (free()); NULL on invalid input
 *          or when out of memory.
 */
unsigned char *cq_b64_decode(const char *in, size_t len, size_t *outlenp);

/** @brief Lower-case hex SHA-256 of \p data into \p hex (65 bytes). */
void cq_sha256_hex(const void *data, size_t len, char hex[65]);

/**
 * @brief Whether \p name is a safe relative path: non-empty, not absolute,
 *        no "..", "." or empty components, no NUL, control characters or
 *        backslashes, at most 255 bytes. Shared by the interpreters (work dir
 *        files) and the job parser (job files); interp.h re-declares it.
 */
bool cq_relpath_is_safe(const char *name);

/**
 * @brief Raise this process's soft limit of open files (RLIMIT_NOFILE) to
 *        its hard limit, as a daemon holding many descriptors does: a local
 *        kernel holds about twenty in the worker, so a few dozen slots pass
 *        the soft limit of 1024 that systemd and shells give. Nothing of
 *        ours uses select(), which such descriptors would break. The
 *        limits before and after go to \p was and \p now (either may be
 *        NULL). A process can raise its own soft limit to the hard one
 *        anyway: what a kernel may open is not changed.
 * @returns 0, or -1 with errno set (both limits then unchanged).
 */
int cq_nofile_raise(unsigned long long *was, unsigned long long *now);

/** @brief What cq_url_redact() puts in place of a secret. */
#define CQ_URL_REDACTED "(redacted)"

/**
 * @brief \p url as a listing may show it (coderq config): its userinfo
 *        ("user:password@"), the value of every query parameter but
 *        api-version (a key travels as "?key=" or "?api-key=" on some
 *        gateways) and a fragment replaced by CQ_URL_REDACTED, the rest
 *        as it is. Without "://" it is read as [userinfo@]host[:port], as
 *        a Kafka bootstrap server is written.
 * @param out NUL-terminated, cut to \p size.
 */
void cq_url_redact(const char *url, char *out, size_t size);

#endif
