/* SPDX-License-Identifier: MIT */
/* fetch.c - a capped HTTP GET for job input files. The worker runs it
 * outside any sandbox, next to PostgreSQL, Kafka and the metrics port, so
 * each connection is checked on the resolved address curl is about to
 * connect to (which also defeats DNS rebinding), and redirects are
 * followed here, one checked hop at a time, rather than by curl. */
#include "coderq/agent/fetch.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/common/util.h"

#define MAX_REDIRS 5
#define ALLOW_MAX  64
#define HOST_MAX   256
#define URL_MAX    8192

/* ------------------------------------------------------------ addresses */

static bool v4_public(const unsigned char *b)
{
        static const struct {
                uint32_t net;
                int len;
        } refused[] = {
            {0x00000000u, 8},  /* "this" network */
            {0x0a000000u, 8},  /* private */
            {0x64400000u, 10}, /* CGNAT */
            {0x7f000000u, 8},  /* loopback */
            {0xa9fe0000u, 16}, /* link-local, cloud metadata */
            {0xac100000u, 12}, /* private */
            {0xc0000000u, 24}, /* IETF protocol assignments */
            {0xc0000200u, 24}, /* documentation */
            {0xc0586300u, 24}, /* 6to4 relay anycast */
            {0xc0a80000u, 16}, /* private */
            {0xc6120000u, 15}, /* benchmarking */
            {0xc6336400u, 24}, /* documentation */
            {0xcb007100u, 24}, /* documentation */
            {0xe0000000u, 4},  /* multicast */
            {0xf0000000u, 4},  /* reserved and broadcast */
        };
        uint32_t a = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 |
                     (uint32_t)b[2] << 8 | (uint32_t)b[3];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(refused); i++) {
                uint32_t mask = 0xffffffffu << (32 - refused[i].len);

                if ((a & mask) == refused[i].net)
                        return false;
        }
        return true;
}

static bool all_zero(const unsigned char *b, size_t n)
{
        size_t i;

        for (i = 0; i < n; i++)
                if (b[i])
                        return false;
        return true;
}

static bool v6_public(const unsigned char *b)
{
        static const unsigned char nat64[12] = {0x00, 0x64, 0xff, 0x9b};

        /* IPv4-mapped ::ffff:a.b.c.d: the kernel connects to the IPv4 */
        if (all_zero(b, 10) && b[10] == 0xff && b[11] == 0xff)
                return v4_public(b + 12);
        /* ::, ::1 and the deprecated IPv4-compatible ::a.b.c.d */
        if (all_zero(b, 12))
                return false;
        /* NAT64 64:ff9b::/96 reaches the embedded IPv4 */
        if (memcmp(b, nat64, sizeof(nat64)) == 0)
                return v4_public(b + 12);
        /* only global unicast 2000::/3 is public */
        if ((b[0] & 0xe0) != 0x20)
                return false;
        /* 6to4 2002::/16 reaches the embedded IPv4 */
        if (b[0] == 0x20 && b[1] == 0x02)
                return v4_public(b + 2);
        /* 2001::/23 (Teredo, ORCHID, ...), 2001:db8::/32, 3fff::/20 */
        if (b[0] == 0x20 && b[1] == 0x01 && b[2] < 0x02)
                return false;
        if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8)
                return false;
        if (b[0] == 0x3f && b[1] == 0xff && (b[2] & 0xf0) == 0)
                return false;
        return true;
}

bool cq_fetch_addr_is_public(const struct sockaddr *sa)
{
        if (sa->sa_family == AF_INET)
                return v4_public(
                    (const unsigned char *)&((const struct sockaddr_in *)sa)
                        ->sin_addr);
        if (sa->sa_family == AF_INET6)
                return v6_public(
                    ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr);
        return false;
}

/* ------------------------------------------------------------ allowlist */

typedef struct allow_entry {
        int family; /* AF_INET, AF_INET6, or 0 for a host name */
        unsigned char addr[16];
        int prefix;
        char host[HOST_MAX];
} allow_entry_t;

typedef struct allowlist {
        allow_entry_t v[ALLOW_MAX];
        size_t n;
} allowlist_t;

static bool host_name_ok(const char *s)
{
        if (!*s)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                      (*s >= '0' && *s <= '9') || *s == '.' || *s == '-'))
                        return false;
        return true;
}

/* Parse one entry (trimmed, NUL-terminated). */
static int parse_entry(char *s, allow_entry_t *e)
{
        char *slash = strchr(s, '/');
        int max;

        memset(e, 0, sizeof(*e));
        if (slash)
                *slash = '\0';
        if (inet_pton(AF_INET, s, e->addr) == 1) {
                e->family = AF_INET;
                max = 32;
        } else if (inet_pton(AF_INET6, s, e->addr) == 1) {
                e->family = AF_INET6;
                max = 128;
        } else {
                size_t n = strlen(s);

                if (slash || n >= sizeof(e->host) || !host_name_ok(s))
                        return -1;
                memcpy(e->host, s, n + 1);
                return 0;
        }
        e->prefix = max;
        if (slash) {
                char *end;
                long v = strtol(slash + 1, &end, 10);

                if (end == slash + 1 || *end || v < 0 || v > max)
                        return -1;
                e->prefix = (int)v;
        }
        return 0;
}

static int allow_parse(const char *text,
                       allowlist_t *list,
                       char *errstr,
                       size_t errstr_size)
{
        const char *p = text;

        list->n = 0;
        while (p && *p) {
                const char *comma = strchr(p, ',');
                size_t len = comma ? (size_t)(comma - p) : strlen(p);
                char item[HOST_MAX + 8];

                while (len > 0 && (*p == ' ' || *p == '\t')) {
                        p++;
                        len--;
                }
                while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
                        len--;
                if (len > 0) {
                        if (len >= sizeof(item) || list->n == ALLOW_MAX) {
                                cq_errstr_set(
                                    errstr, errstr_size,
                                    "invalid CODERQ_FETCH_ALLOW: more "
                                    "than %d entries or one too long",
                                    ALLOW_MAX);
                                return -1;
                        }
                        memcpy(item, p, len);
                        item[len] = '\0';
                        if (parse_entry(item, &list->v[list->n]) != 0) {
                                cq_errstr_set(
                                    errstr, errstr_size,
                                    "invalid CODERQ_FETCH_ALLOW entry "
                                    "\"%.*s\": expected an address, a "
                                    "CIDR block or a host name",
                                    (int)len, p);
                                return -1;
                        }
                        list->n++;
                }
                p = comma ? comma + 1 : NULL;
        }
        return 0;
}

int cq_fetch_allow_check(const char *allow, char *errstr, size_t errstr_size)
{
        allowlist_t *list = malloc(sizeof(*list));
        int rc;

        if (!list) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        rc = allow_parse(allow, list, errstr, errstr_size);
        free(list);
        return rc;
}

static bool
prefix_match(const unsigned char *a, const unsigned char *net, int prefix)
{
        int full = prefix / 8, rest = prefix % 8;

        if (memcmp(a, net, (size_t)full) != 0)
                return false;
        if (rest == 0)
                return true;
        return ((a[full] ^ net[full]) & (0xff << (8 - rest)) & 0xff) == 0;
}

static bool allow_addr(const allowlist_t *list, const struct sockaddr *sa)
{
        const unsigned char *v4 = NULL, *v6 = NULL;
        size_t i;

        if (sa->sa_family == AF_INET) {
                v4 = (const unsigned char *)&((const struct sockaddr_in *)sa)
                         ->sin_addr;
        } else if (sa->sa_family == AF_INET6) {
                v6 = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
                if (all_zero(v6, 10) && v6[10] == 0xff && v6[11] == 0xff)
                        v4 = v6 + 12; /* an IPv4 entry covers its mapping */
        }
        for (i = 0; i < list->n; i++) {
                const allow_entry_t *e = &list->v[i];

                if (e->family == AF_INET && v4 &&
                    prefix_match(v4, e->addr, e->prefix))
                        return true;
                if (e->family == AF_INET6 && v6 &&
                    prefix_match(v6, e->addr, e->prefix))
                        return true;
        }
        return false;
}

static bool allow_host(const allowlist_t *list, const char *host)
{
        size_t i;

        for (i = 0; i < list->n; i++)
                if (list->v[i].family == 0 &&
                    strcasecmp(list->v[i].host, host) == 0)
                        return true;
        return false;
}

/* ------------------------------------------------------------ transfers */

typedef struct guard {
        const allowlist_t *allow;
        bool host_allowed; /* this hop's host is on the allowlist */
        bool refused;
        char refused_addr[INET6_ADDRSTRLEN];
} guard_t;

/* curl calls this with each resolved address before connecting, for the
 * first request and every redirect alike. */
static curl_socket_t
open_socket(void *opaque, curlsocktype purpose, struct curl_sockaddr *address)
{
        guard_t *guard = opaque;
        const struct sockaddr *sa = &address->addr;
        int fd;

        (void)purpose;
        if (!guard->host_allowed && !cq_fetch_addr_is_public(sa) &&
            !allow_addr(guard->allow, sa)) {
                const void *bytes =
                    sa->sa_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)sa)
                              ->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)sa)
                              ->sin6_addr;

                guard->refused = true;
                if (!inet_ntop(sa->sa_family, bytes, guard->refused_addr,
                               sizeof(guard->refused_addr)))
                        snprintf(guard->refused_addr,
                                 sizeof(guard->refused_addr), "?");
                return CURL_SOCKET_BAD;
        }
        fd = socket(address->family, address->socktype | SOCK_CLOEXEC,
                    address->protocol);
        return fd < 0 ? CURL_SOCKET_BAD : fd;
}

static size_t on_body(char *p, size_t size, size_t n, void *opaque)
{
        cq_buf_t *buf = opaque;

        if (cq_buf_append(buf, p, size * n) != CQ_OK)
                return 0; /* makes curl fail with CURLE_WRITE_ERROR */
        return size * n;
}

static bool is_http(const char *url)
{
        return strncasecmp(url, "http://", 7) == 0 ||
               strncasecmp(url, "https://", 8) == 0;
}

/* The host of \p url (brackets of an IPv6 literal removed), or -1. */
static int url_host(const char *url, char *out, size_t size)
{
        CURLU *u = curl_url();
        char *host = NULL;
        size_t n;
        int rc = -1;

        if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
            curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
                const char *h = host;

                n = strlen(h);
                if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
                        h++;
                        n -= 2;
                }
                if (n < size) {
                        memcpy(out, h, n);
                        out[n] = '\0';
                        rc = 0;
                }
        }
        curl_free(host);
        curl_url_cleanup(u);
        return rc;
}

/* A raised cancel flag ends the transfer (curl looks about once a
 * second while it waits, and at every chunk). */
static int on_progress(void *opaque,
                       curl_off_t dltotal,
                       curl_off_t dlnow,
                       curl_off_t ultotal,
                       curl_off_t ulnow)
{
        const atomic_int *cancel = opaque;

        (void)dltotal;
        (void)dlnow;
        (void)ultotal;
        (void)ulnow;
        return cancel && atomic_load(cancel) != 0;
}

cq_err_t cq_fetch_url(const char *url,
                      size_t max,
                      long timeout_s,
                      const char *allow,
                      unsigned char **datap,
                      size_t *lenp,
                      char *errstr,
                      size_t errstr_size)
{
        return cq_fetch_url_until(
            url, max, cq_now_ms() + (timeout_s > 0 ? timeout_s : 120) * 1000,
            NULL, allow, datap, lenp, errstr, errstr_size);
}

cq_err_t cq_fetch_url_until(const char *url,
                            size_t max,
                            int64_t deadline_ms,
                            const atomic_int *cancel,
                            const char *allow,
                            unsigned char **datap,
                            size_t *lenp,
                            char *errstr,
                            size_t errstr_size)
{
        CURL *curl = NULL;
        CURLcode cc;
        cq_buf_t buf;
        allowlist_t *list = NULL;
        guard_t guard;
        char cur[URL_MAX], host[HOST_MAX];
        long status = 0;
        int64_t left;
        int hop;
        cq_err_t err = CQ_ERR_FATAL;

        cq_buf_init(&buf, max);
        if (!is_http(url)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "could not fetch file: only http and https URLs are "
                    "allowed");
                goto out;
        }
        if (strlen(url) >= sizeof(cur)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: URL longer than %d bytes",
                              URL_MAX - 1);
                goto out;
        }
        snprintf(cur, sizeof(cur), "%s", url);
        list = malloc(sizeof(*list));
        curl = curl_easy_init();
        if (!list || !curl) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: out of memory");
                goto out;
        }
        if (allow_parse(allow, list, errstr, errstr_size) != 0)
                goto out;
        memset(&guard, 0, sizeof(guard));
        guard.allow = list;
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        /* a proxy would connect on our behalf to whatever it is asked */
        curl_easy_setopt(curl, CURLOPT_PROXY, "");
        curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, open_socket);
        curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, &guard);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#else
        curl_easy_setopt(curl, CURLOPT_PROTOCOLS,
                         (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
        curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
        curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(curl, CURLOPT_XFERINFODATA, (void *)(uintptr_t)cancel);
        curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buf);
        for (hop = 0;; hop++) {
                char *next = NULL;

                if (url_host(cur, host, sizeof(host)) != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: malformed URL");
                        goto out;
                }
                guard.host_allowed = allow_host(list, host);
                guard.refused = false;
                cq_buf_reset(&buf);
                /* what is left of the deadline, for each hop */
                left = deadline_ms - cq_now_ms();
                if (left <= 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: its deadline "
                                      "passed");
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                }
                curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)left);
                curl_easy_setopt(curl, CURLOPT_URL, cur);
                cc = curl_easy_perform(curl);
                if (cc == CURLE_ABORTED_BY_CALLBACK) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: cancelled");
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                }
                if (cc == CURLE_OPERATION_TIMEDOUT &&
                    cq_now_ms() >= deadline_ms) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: its deadline "
                                      "passed");
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                }
                if (cc != CURLE_OK && guard.refused) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "could not fetch file: host \"%s\" has the "
                            "non-public address %s (CODERQ_FETCH_ALLOW "
                            "can allow it)",
                            host, guard.refused_addr);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                if (cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: larger than %zu "
                                      "bytes",
                                      max);
                        err = CQ_ERR_TOO_LARGE;
                        goto out;
                }
                if (cc != CURLE_OK) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: %s",
                                      curl_easy_strerror(cc));
                        err = (cc == CURLE_UNSUPPORTED_PROTOCOL ||
                               cc == CURLE_URL_MALFORMAT)
                                  ? CQ_ERR_FATAL
                                  : CQ_ERR_RETRIABLE;
                        goto out;
                }
                curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
                if (status < 300 || status > 399 ||
                    curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &next) !=
                        CURLE_OK ||
                    !next)
                        break;
                if (hop == MAX_REDIRS) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: more than %d "
                                      "redirects",
                                      MAX_REDIRS);
                        goto out;
                }
                if (!is_http(next) || strlen(next) >= sizeof(cur)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: redirect to a "
                                      "non-http(s) or over-long URL");
                        goto out;
                }
                /* next points into curl's handle: copy before reuse */
                memmove(cur, next, strlen(next) + 1);
        }
        if (status < 200 || status > 299) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: HTTP status %ld", status);
                err = (status == 429 || status >= 500) ? CQ_ERR_RETRIABLE
                                                       : CQ_ERR_FATAL;
                goto out;
        }
        *datap = (unsigned char *)cq_buf_take(&buf, lenp);
        if (!*datap) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: out of "
                              "memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        err = CQ_OK;
out:
        cq_buf_release(&buf);
        curl_easy_cleanup(curl);
        free(list);
        return err;
}
