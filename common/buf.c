/* SPDX-License-Identifier: MIT */
/* buf.c - capped growable buffer. Growth doubles up to the cap; every size
 * computation is written so that it cannot wrap. */
#include "coderq/common/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cq_buf_init(cq_buf_t *buf, size_t max)
{
        buf->data = NULL;
        buf->len = 0;
        buf->alloc = 0;
        buf->max = max;
}

static cq_err_t buf_reserve(cq_buf_t *buf, size_t n)
{
        size_t need, alloc;
        char *data;

        if (n > buf->max - buf->len)
                return CQ_ERR_TOO_LARGE;
        need = buf->len + n + 1; /* cannot wrap: len + n <= max < SIZE_MAX */
        if (need <= buf->alloc)
                return CQ_OK;
        alloc = buf->alloc ? buf->alloc : 64;
        while (alloc < need)
                alloc = alloc > SIZE_MAX / 2 ? need : alloc * 2;
        if (alloc > buf->max + 1)
                alloc = buf->max + 1;
        if (alloc < need)
                alloc = need;
        data = realloc(buf->data, alloc);
        if (!data)
                return CQ_ERR_FATAL;
        buf->data = data;
        buf->alloc = alloc;
        return CQ_OK;
}

cq_err_t cq_buf_append(cq_buf_t *buf, const void *p, size_t n)
{
        cq_err_t err;

        if (buf->max == SIZE_MAX)
                buf->max = SIZE_MAX - 1; /* keep room for the NUL */
        err = buf_reserve(buf, n);
        if (err != CQ_OK)
                return err;
        if (n)
                memcpy(buf->data + buf->len, p, n);
        buf->len += n;
        buf->data[buf->len] = '\0';
        return CQ_OK;
}

cq_err_t cq_buf_append_str(cq_buf_t *buf, const char *s)
{
        return cq_buf_append(buf, s, strlen(s));
}

cq_err_t cq_buf_printf(cq_buf_t *buf, const char *fmt, ...)
{
        va_list ap;
        int n;
        cq_err_t err;

        va_start(ap, fmt);
        n = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (n < 0)
                return CQ_ERR_FATAL;
        err = buf_reserve(buf, (size_t)n);
        if (err != CQ_OK)
                return err;
        va_start(ap, fmt);
        vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
        buf->len += (size_t)n;
        return CQ_OK;
}

size_t cq_buf_room(const cq_buf_t *buf) { return buf->max - buf->len; }

void cq_buf_reset(cq_buf_t *buf)
{
        buf->len = 0;
        if (buf->data)
                buf->data[0] = '\0';
}

char *cq_buf_take(cq_buf_t *buf, size_t *lenp)
{
        char *data = buf->data;
        size_t len = buf->len;

        if (!data) {
                data = calloc(1, 1);
                if (!data)
                        return NULL;
        }
        if (lenp)
                *lenp = len;
        buf->data = NULL;
        buf->len = 0;
        buf->alloc = 0;
        return data;
}

void cq_buf_release(cq_buf_t *buf)
{
        free(buf->data);
        buf->data = NULL;
        buf->len = 0;
        buf->alloc = 0;
}
