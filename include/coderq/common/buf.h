/* SPDX-License-Identifier: MIT */
/* buf.h - a growable byte buffer with a mandatory hard cap, for data whose
 * size someone else controls (HTTP bodies, kernel output, NDJSON lines).
 *
 * Invariants: data is NULL while nothing was ever appended, otherwise it is
 * NUL-terminated at data[len]; len <= max. Past the cap or out of memory an
 * append copies nothing and the contents stay as they were. */
#ifndef CODERQ_BUF_H
#define CODERQ_BUF_H

#include "coderq/common/common.h"

typedef struct cq_buf {
        char *data;   /* NUL-terminated; NULL while empty; read-only */
        size_t len;   /* read-only */
        size_t alloc; /* private */
        size_t max;   /* private: hard cap */
} cq_buf_t;

/** @brief Start an empty buffer that never holds more than \p max bytes. */
void cq_buf_init(cq_buf_t *buf, size_t max);

/**
 * @brief Append \p n bytes from \p p.
 * @returns CQ_OK; CQ_ERR_TOO_LARGE past the cap; CQ_ERR_FATAL when out of
 *          memory. On error nothing was copied.
 */
CQ_NODISCARD cq_err_t cq_buf_append(cq_buf_t *buf, const void *p, size_t n);

/** @brief Append a NUL-terminated string; as cq_buf_append(). */
CQ_NODISCARD cq_err_t cq_buf_append_str(cq_buf_t *buf, const char *s);

/** @brief Append formatted text; all or nothing, as cq_buf_append(). */
CQ_NODISCARD cq_err_t cq_buf_printf(cq_buf_t *buf, const char *fmt, ...)
    CQ_PRINTF(2, 3);

/** @brief Bytes that can still be appended before the cap. */
size_t cq_buf_room(const cq_buf_t *buf);

/** @brief Forget the contents, keep the allocation and the cap. */
void cq_buf_reset(cq_buf_t *buf);

/**
 * @brief Take the contents.
 * @param lenp (out, optional) Length of the returned data.
 * @returns Caller owns the returned value (free()); never NULL: an empty
 *          buffer yields an allocated "" (NULL only when out of memory).
 *          The buffer is left empty and keeps its cap.
 */
char *cq_buf_take(cq_buf_t *buf, size_t *lenp);

/** @brief Free the contents, not the struct. */
void cq_buf_release(cq_buf_t *buf);

#endif
