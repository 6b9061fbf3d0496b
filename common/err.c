/* SPDX-License-Identifier: MIT */
/* err.c - names of cq_err_t values for logs and messages, and the one
 * helper that fills a caller's errstr. */
#include "coderq/common/common.h"

#include <stdarg.h>
#include <stdio.h>

const char *cq_err_name(cq_err_t err)
{
        switch (err) {
        case CQ_OK:
                return "ok";
        case CQ_ERR_RETRIABLE:
                return "retriable";
        case CQ_ERR_FATAL:
                return "fatal";
        case CQ_ERR_TOO_LARGE:
                return "too large";
        }
        return "unknown";
}

void cq_errstr_set(char *errstr, size_t errstr_size, const char *fmt, ...)
{
        va_list ap;

        if (!errstr || !errstr_size)
                return;
        va_start(ap, fmt);
        vsnprintf(errstr, errstr_size, fmt, ap);
        va_end(ap);
}
