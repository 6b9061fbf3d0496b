/* SPDX-License-Identifier: MIT */
/* common.h - attributes and the error type shared by every module. Each
 * public header includes this first. */
#ifndef CODERQ_COMMON_H
#define CODERQ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#if defined(__GNUC__) || defined(__clang__)
#define CQ_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define CQ_NODISCARD         __attribute__((warn_unused_result))
#define CQ_UNUSED            __attribute__((unused))
#else
#define CQ_PRINTF(fmt, args)
#define CQ_NODISCARD
#define CQ_UNUSED
#endif

#define CQ_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/**
 * @brief The outcome of a fallible call where the caller must choose between
 *        retrying and giving up. Retries branch on this, never on text.
 */
typedef enum cq_err {
        CQ_OK = 0,
        CQ_ERR_RETRIABLE = -1, /* timeout, HTTP 5xx/429, kernel died */
        CQ_ERR_FATAL = -2,     /* bad input, HTTP 4xx, unparsable reply */
        CQ_ERR_TOO_LARGE = -3, /* a configured size cap was hit */
} cq_err_t;

/** @brief A static English name for \p err ("ok", "retriable", ...). */
const char *cq_err_name(cq_err_t err);

/**
 * @brief Fill a caller's error buffer: vsnprintf() into \p errstr, which
 *        may be NULL (or \p errstr_size 0: nothing is written), as every
 *        function taking "char *errstr, size_t errstr_size" allows.
 */
void cq_errstr_set(char *errstr, size_t errstr_size, const char *fmt, ...)
    CQ_PRINTF(3, 4);

#endif
