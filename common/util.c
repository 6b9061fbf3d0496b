/* SPDX-License-Identifier: MIT */
/* util.c - clocks, ANSI stripping, UTF-8 repair, base64, SHA-256, safe
 * relative paths. The text functions run on untrusted kernel and model
 * output, so every read is bounded by the given length, never by a NUL. */
#include "coderq/common/util.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>

int64_t cq_now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cq_nap_ms(int64_t ms, const atomic_int *flag)
{
        int64_t end = cq_now_ms() + ms;

        while (!(flag && atomic_load(flag))) {
                int64_t left = end - cq_now_ms();
                struct timespec ts;

                if (left <= 0)
                        return;
                if (left > 50)
                        left = 50;
                ts.tv_sec = 0;
                ts.tv_nsec = (long)left * 1000000L;
                nanosleep(&ts, NULL);
        }
}

int64_t
cq_backoff_ms(int n, int64_t first_ms, int64_t max_ms, cq_jitter_t jitter)
{
        int64_t ceiling = first_ms > 0 ? first_ms : 0;

        if (max_ms < 0)
                max_ms = 0;
        for (; n > 1 && ceiling < max_ms && ceiling <= INT64_MAX / 2; n--)
                ceiling *= 2;
        if (ceiling > max_ms)
                ceiling = max_ms;
        switch (jitter) {
        case CQ_JITTER_FULL:
                return (int64_t)cq_rand_below((uint64_t)ceiling + 1);
        case CQ_JITTER_EQUAL:
                return ceiling - ceiling / 2 +
                       (int64_t)cq_rand_below((uint64_t)(ceiling / 2) + 1);
        case CQ_JITTER_NONE:
                break;
        }
        return ceiling;
}

void cq_abstime_in(struct timespec *ts, int64_t ms)
{
        clock_gettime(CLOCK_REALTIME, ts);
        ts->tv_sec += (time_t)(ms / 1000);
        ts->tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts->tv_nsec >= 1000000000L) {
                ts->tv_sec++;
                ts->tv_nsec -= 1000000000L;
        }
}

uint64_t cq_rand64(void)
{
        static _Thread_local uint64_t state;

        if (state == 0) {
                uint64_t seed = 0;
                struct timespec ts;

                if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) !=
                    (ssize_t)sizeof(seed)) {
                        clock_gettime(CLOCK_REALTIME, &ts);
                        seed = (uint64_t)ts.tv_sec * 1000000000u +
                               (uint64_t)ts.tv_nsec;
                        seed ^= (uint64_t)(uintptr_t)&state << 16;
                }
                state = seed ? seed : 0x9e3779b97f4a7c15u;
        }
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return state * 0x2545f4914f6cdd1du;
}

uint64_t cq_rand_below(uint64_t n) { return n ? cq_rand64() % n : 0; }

void cq_iso8601_now(char *out, size_t size)
{
        struct timespec ts;
        struct tm tm;
        char base[32];

        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(out, size, "%s.%06ldZ", base, ts.tv_nsec / 1000L);
}

char *cq_ansi_strip(const char *in, size_t len, size_t *outlenp)
{
        const unsigned char *p = (const unsigned char *)in;
        char *out = malloc(len + 1);
        size_t i = 0, o = 0;

        if (!out)
                return NULL;
        while (i < len) {
                unsigned char c = p[i];

                if (c == 0x1b && i + 1 < len && p[i + 1] == '[') {
                        /* CSI: parameters 0x30-0x3f, intermediates 0x20-0x2f,
                         * one final byte 0x40-0x7e. */
                        i += 2;
                        while (i < len && p[i] >= 0x30 && p[i] <= 0x3f)
                                i++;
                        while (i < len && p[i] >= 0x20 && p[i] <= 0x2f)
                                i++;
                        if (i < len && p[i] >= 0x40 && p[i] <= 0x7e)
                                i++;
                        continue;
                }
                if (c == 0x1b && i + 1 < len && p[i + 1] == ']') {
                        /* OSC, ended by BEL or ST (ESC \). */
                        i += 2;
                        while (
                            i < len && p[i] != 0x07 &&
                            !(p[i] == 0x1b && i + 1 < len && p[i + 1] == '\\'))
                                i++;
                        if (i < len)
                                i += p[i] == 0x07 ? 1 : 2;
                        continue;
                }
                if (c == 0x1b && i + 1 < len && p[i + 1] >= 0x40 &&
                    p[i + 1] <= 0x5f) {
                        i += 2; /* other two-byte escapes */
                        continue;
                }
                if (c == 0x1b) {
                        i++;
                        continue;
                }
                out[o++] = (char)c;
                i++;
        }
        out[o] = '\0';
        if (outlenp)
                *outlenp = o;
        return out;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t avail)
{
        unsigned c = p[0];
        size_t n, i;
        unsigned cp;

        if (c < 0x80)
                return 1;
        if (c >= 0xc2 && c <= 0xdf) {
                n = 2;
                cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
                n = 3;
                cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
                n = 4;
                cp = c & 0x07;
        } else {
                return 0;
        }
        if (avail < n)
                return 0;
        for (i = 1; i < n; i++) {
                if ((p[i] & 0xc0) != 0x80)
                        return 0;
                cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return 0;
        return n;
}

bool cq_utf8_valid(const char *in, size_t len)
{
        const unsigned char *p = (const unsigned char *)in;
        size_t i = 0;

        while (i < len) {
                size_t n = utf8_seq(p + i, len - i);

                if (!n)
                        return false;
                i += n;
        }
        return true;
}

char *cq_utf8_repair(const char *in, size_t len, size_t *outlenp)
{
        const unsigned char *p = (const unsigned char *)in;
        size_t i = 0, o = 0;
        char *out;

        if (len > (SIZE_MAX - 1) / 3)
                return NULL;
        out = malloc(len * 3 + 1); /* each bad byte may become 3 bytes */
        if (!out)
                return NULL;
        while (i < len) {
                size_t n = utf8_seq(p + i, len - i);

                if (n) {
                        memcpy(out + o, p + i, n);
                        o += n;
                        i += n;
                } else {
                        out[o++] = (char)0xef;
                        out[o++] = (char)0xbf;
                        out[o++] = (char)0xbd;
                        i++;
                }
        }
        out[o] = '\0';
        if (outlenp)
                *outlenp = o;
        return out;
}

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *cq_b64_encode(const void *data, size_t len, size_t *outlenp)
{
        const unsigned char *p = data;
        size_t olen, i, o = 0;
        char *out;

        if (len > (SIZE_MAX - 4) / 4 * 3)
                return NULL;
        olen = (len + 2) / 3 * 4;
        out = malloc(olen + 1);
        if (!out)
                return NULL;
        for (i = 0; i + 2 < len; i += 3) {
                unsigned v =
                    (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];

                out[o++] = b64_chars[v >> 18 & 63];
                out[o++] = b64_chars[v >> 12 & 63];
                out[o++] = b64_chars[v >> 6 & 63];
                out[o++] = b64_chars[v & 63];
        }
        if (i < len) {
                unsigned v = (unsigned)p[i] << 16;

                if (i + 1 < len)
                        v |= (unsigned)p[i + 1] << 8;
                out[o++] = b64_chars[v >> 18 & 63];
                out[o++] = b64_chars[v >> 12 & 63];
                out[o++] = i + 1 < len ? b64_chars[v >> 6 & 63] : '=';
                out[o++] = '=';
        }
        out[o] = '\0';
        if (outlenp)
                *outlenp = o;
        return out;
}

static int b64_value(unsigned char c)
{
        if (c >= 'A' && c <= 'Z')
                return c - 'A';
        if (c >= 'a' && c <= 'z')
                return c - 'a' + 26;
        if (c >= '0' && c <= '9')
                return c - '0' + 52;
        if (c == '+')
                return 62;
        if (c == '/')
                return 63;
        return -1;
}

unsigned char *cq_b64_decode(const char *in, size_t len, size_t *outlenp)
{
        const unsigned char *p = (const unsigned char *)in;
        unsigned char *out = malloc(len / 4 * 3 + 3);
        unsigned acc = 0;
        size_t i, o = 0, pad = 0;
        int bits = 0;

        if (!out)
                return NULL;
        for (i = 0; i < len; i++) {
                int v;

                if (p[i] == ' ' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t')
                        continue;
                if (p[i] == '=') {
                        pad++;
                        continue;
                }
                v = b64_value(p[i]);
                if (v < 0 || pad)
                        goto bad; /* a bad byte, or data after padding */
                acc = (acc << 6) | (unsigned)v;
                bits += 6;
                if (bits >= 8) {
                        bits -= 8;
                        out[o++] = (unsigned char)(acc >> bits & 0xff);
                }
        }
        /* 6 leftover bits can never come from whole bytes; padding, when
         * present, must complete the last quantum. */
        if (bits >= 6 || pad > 2 || (pad && (size_t)(bits / 2) != pad))
                goto bad;
        if (outlenp)
                *outlenp = o;
        return out;
bad:
        free(out);
        return NULL;
}

void cq_sha256_hex(const void *data, size_t len, char hex[65])
{
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0, i;

        if (!EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL)) {
                hex[0] = '\0';
                return;
        }
        for (i = 0; i < mdlen && i < 32; i++)
                snprintf(hex + 2 * i, 3, "%02x", md[i]);
        hex[64] = '\0';
}

bool cq_relpath_is_safe(const char *name)
{
        const char *p = name, *comp = name;
        size_t len;

        if (!name || !*name || *name == '/')
                return false;
        len = strlen(name);
        if (len > 255)
                return false;
        for (;; p++) {
                if (*p == '/' || *p == '\0') {
                        size_t clen = (size_t)(p - comp);

                        if (clen == 0 || (clen == 1 && comp[0] == '.') ||
                            (clen == 2 && comp[0] == '.' && comp[1] == '.'))
                                return false;
                        if (*p == '\0')
                                return true;
                        comp = p + 1;
                        continue;
                }
                if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\')
                        return false;
        }
}

int cq_nofile_raise(unsigned long long *was, unsigned long long *now)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
                return -1;
        if (was)
                *was = (unsigned long long)rl.rlim_cur;
        if (rl.rlim_cur != rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                        return -1;
        }
        if (now)
                *now = (unsigned long long)rl.rlim_cur;
        return 0;
}

/* Append \p n bytes of \p s to \p out (\p size bytes, *\p usedp taken),
 * cutting at the end. */
static void put(char *out, size_t size, size_t *usedp, const char *s, size_t n)
{
        if (*usedp + 1 >= size)
                return;
        if (n > size - 1 - *usedp)
                n = size - 1 - *usedp;
        memcpy(out + *usedp, s, n);
        *usedp += n;
        out[*usedp] = '\0';
}

/* Query parameters whose value is shown: a version, never a key. */
static bool query_value_shown(const char *name, size_t len)
{
        return len == 11 && strncmp(name, "api-version", len) == 0;
}

void cq_url_redact(const char *url, char *out, size_t size)
{
        const char *scheme = strstr(url, "://");
        const char *auth = scheme ? scheme + 3 : url;
        size_t auth_len = strcspn(auth, "/?#"), used = 0;
        const char *at = NULL, *p, *rest;

        if (size == 0)
                return;
        out[0] = '\0';
        for (p = auth; p < auth + auth_len; p++)
                if (*p == '@')
                        at = p;
        put(out, size, &used, url, (size_t)(auth - url));
        if (at) {
                put(out, size, &used, CQ_URL_REDACTED "@",
                    sizeof(CQ_URL_REDACTED));
                auth_len -= (size_t)(at + 1 - auth);
                auth = at + 1;
        }
        rest = auth + auth_len + strcspn(auth + auth_len, "?#");
        put(out, size, &used, auth, (size_t)(rest - auth));
        if (*rest == '?') {
                const char *q = rest + 1;

                put(out, size, &used, "?", 1);
                for (;;) {
                        size_t len = strcspn(q, "&#");
                        const char *eq = memchr(q, '=', len);
                        size_t name_len = eq ? (size_t)(eq - q) : len;

                        if (eq && query_value_shown(q, name_len))
                                put(out, size, &used, q, len);
                        else if (eq)
                                put(out, size, &used, q, name_len + 1);
                        if (len > 0 && !(eq && query_value_shown(q, name_len)))
                                put(out, size, &used, CQ_URL_REDACTED,
                                    sizeof(CQ_URL_REDACTED) - 1);
                        q += len;
                        if (*q != '&')
                                break;
                        put(out, size, &used, "&", 1);
                        q++;
                }
                rest = q;
        }
        if (*rest == '#')
                put(out, size, &used, "#" CQ_URL_REDACTED,
                    sizeof(CQ_URL_REDACTED));
}
