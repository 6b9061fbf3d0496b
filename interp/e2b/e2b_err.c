/* SPDX-License-Identifier: MIT */
/* e2b_err.c - the E2B backend's error messages, the handle's and a
 * request's, with the secrets taken out by the HTTP client's redaction.
 * Every other file of the backend calls these and they call none of
 * them, so the handle (e2b.c) and the files below it depend one way. */
#include "coderq/e2b/e2b.h"

#include <stdarg.h>
#include <stdio.h>

#include "e2b_int.h"

CQ_PRINTF(2, 3) void e2b_set_error(cq_e2b_t *e2b, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(e2b->errbuf, sizeof(e2b->errbuf), fmt, ap);
        va_end(ap);
        cq_http_redact(e2b->http, e2b->errbuf, sizeof(e2b->errbuf));
}

CQ_PRINTF(3, 4)
void e2b_call_error(cq_e2b_t *e2b, struct call *call, const char *fmt, ...)
{
        char *buf = call->errbuf ? call->errbuf : e2b->errbuf;
        size_t size = call->errbuf ? call->errbuf_size : sizeof(e2b->errbuf);
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, size, fmt, ap);
        va_end(ap);
        cq_http_redact(e2b->http, buf, size);
}
