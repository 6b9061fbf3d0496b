/* SPDX-License-Identifier: MIT */
/* e2b_err.c - the E2B backend's error messages, with the secrets taken
 * out. Every other file of the backend calls these and they call none of
 * them, so the handle (e2b.c) and the files below it depend one way. */
#include "coderq/e2b/e2b.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "e2b_int.h"

/* Remove every occurrence of \p secret from \p s, in place. */
static void redact(char *s, const char *secret)
{
        size_t n;
        char *p;

        if (!secret || (n = strlen(secret)) < 4)
                return;
        while ((p = strstr(s, secret))) {
                memcpy(p, "***", 3);
                memmove(p + 3, p + n, strlen(p + n) + 1);
        }
}

void e2b_redact_all(const cq_e2b_t *e2b, char *s)
{
        redact(s, e2b->api_key);
        redact(s, e2b->envd_token);
        redact(s, e2b->traffic_token);
}

CQ_PRINTF(2, 3) void e2b_set_error(cq_e2b_t *e2b, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(e2b->errbuf, sizeof(e2b->errbuf), fmt, ap);
        va_end(ap);
        e2b_redact_all(e2b, e2b->errbuf);
}
