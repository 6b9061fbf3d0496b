/* SPDX-License-Identifier: MIT */
/* log.c - JSON-lines logger. The level and the output descriptor are the
 * only process-wide state; both are atomics set once by main(). A line is
 * built in memory and written with one write(2) so threads never interleave
 * within a line; a failed or short write is dropped, never retried forever. */
#include "coderq/common/log.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = CQ_LOG_INFO;
static atomic_int log_fd = 2;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int cq_log_level_parse(const char *s, cq_log_level_t *levelp)
{
        size_t i;

        if (!s)
                return -1;
        for (i = 0; i < CQ_ARRAY_SIZE(level_names); i++) {
                if (strcasecmp(s, level_names[i]) == 0) {
                        *levelp = (cq_log_level_t)i;
                        return 0;
                }
        }
        if (strcasecmp(s, "warning") == 0) {
                *levelp = CQ_LOG_WARN;
                return 0;
        }
        return -1;
}

const char *cq_log_level_name(cq_log_level_t level)
{
        if ((int)level < 0 || (size_t)level >= CQ_ARRAY_SIZE(level_names))
                return "unknown";
        return level_names[level];
}

void cq_log_set_level(cq_log_level_t level)
{
        atomic_store(&log_level, (int)level);
}

cq_log_level_t cq_log_get_level(void)
{
        return (cq_log_level_t)atomic_load(&log_level);
}

void cq_log_set_fd(int fd) { atomic_store(&log_fd, fd); }

static void format_ts(char *out, size_t size)
{
        struct timespec ts;
        struct tm tm;
        char base[32];

        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(out, size, "%s.%03ldZ", base, ts.tv_nsec / 1000000L);
}

/* The message may hold bytes that are not UTF-8 (kernel output, file
 * names); jansson refuses such strings, so replace
 * those bytes with '?' to keep every line valid JSON and every message. */
static void sanitize_utf8(char *s)
{
        unsigned char *p = (unsigned char *)s;

        while (*p) {
                size_t n, i;
                unsigned c = *p;

                if (c < 0x80) {
                        p++;
                        continue;
                }
                n = (c & 0xe0) == 0xc0   ? 2
                    : (c & 0xf0) == 0xe0 ? 3
                    : (c & 0xf8) == 0xf0 ? 4
                                         : 0;
                for (i = 1; n && i < n; i++)
                        if ((p[i] & 0xc0) != 0x80)
                                n = 0;
                if (!n) {
                        *p++ = '?';
                        continue;
                }
                p += n;
        }
}

static json_t *safe_string(const char *s)
{
        char *copy = strdup(s);
        json_t *str;

        if (!copy)
                return NULL;
        sanitize_utf8(copy);
        str = json_string(copy);
        if (!str) { /* overlong forms, surrogates: keep the ASCII */
                unsigned char *q;

                for (q = (unsigned char *)copy; *q; q++)
                        if (*q >= 0x80)
                                *q = '?';
                str = json_string(copy);
        }
        free(copy);
        return str;
}

static void emit(cq_log_level_t level, json_t *line, const char *msg)
{
        char ts[48];
        char *text = NULL;
        size_t len;
        ssize_t w;

        format_ts(ts, sizeof(ts));
        /* Reserved keys are set last so they win over caller fields. */
        if (json_object_set_new(line, "ts", json_string(ts)) ||
            json_object_set_new(line, "level",
                                json_string(cq_log_level_name(level))) ||
            json_object_set_new(line, "msg", safe_string(msg)))
                return;
        text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!text)
                return;
        len = strlen(text);
        text[len] = '\n'; /* replaces the NUL: written by length below */
        do {
                w = write(atomic_load(&log_fd), text, len + 1);
        } while (w < 0 && errno == EINTR);
        free(text);
}

CQ_PRINTF(3, 0)
static void
log_v(cq_log_level_t level, json_t *line, const char *fmt, va_list ap)
{
        char small[512];
        char *msg = small;
        va_list ap2;
        int n;

        va_copy(ap2, ap);
        n = vsnprintf(small, sizeof(small), fmt, ap);
        if (n >= (int)sizeof(small)) {
                msg = malloc((size_t)n + 1);
                if (msg)
                        vsnprintf(msg, (size_t)n + 1, fmt, ap2);
                else
                        msg = small; /* truncated beats nothing */
        }
        va_end(ap2);
        if (n < 0)
                snprintf(small, sizeof(small), "(unformattable message)");
        emit(level, line, msg);
        if (msg != small)
                free(msg);
}

void cq_log_json(cq_log_level_t level, const void *fields, const char *fmt, ...)
{
        va_list ap;
        json_t *line;

        if ((int)level < atomic_load(&log_level))
                return;
        line = fields ? json_deep_copy((const json_t *)fields) : json_object();
        if (!line)
                return;
        if (!json_is_object(line)) {
                json_decref(line);
                line = json_object();
                if (!line)
                        return;
        }
        va_start(ap, fmt);
        log_v(level, line, fmt, ap);
        va_end(ap);
        json_decref(line);
}

void cq_log_kv(cq_log_level_t level, const char *msg, ...)
{
        va_list ap;
        json_t *line;
        const char *key, *value;

        if ((int)level < atomic_load(&log_level))
                return;
        line = json_object();
        if (!line)
                return;
        va_start(ap, msg);
        while ((key = va_arg(ap, const char *)) != NULL) {
                value = va_arg(ap, const char *);
                json_object_set_new(line, key,
                                    value ? safe_string(value) : json_null());
        }
        va_end(ap);
        emit(level, line, msg);
        json_decref(line);
}
