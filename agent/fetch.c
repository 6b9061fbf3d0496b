/* SPDX-License-Identifier: MIT */
/* fetch.c - a capped HTTP GET for job input files, over the HTTP client
 * (http.c). The worker runs it outside any sandbox, next to PostgreSQL,
 * Kafka and the metrics port, so its policy is the address filter: each
 * connection is checked on the resolved address curl is about to connect
 * to (which also defeats DNS rebinding), and redirects are followed here,
 * one checked hop at a time, rather than by curl. */
#include "coderq/agent/fetch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "coderq/common/util.h"
#include "coderq/http/http.h"

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

static bool allowed(const allowlist_t *list, const struct sockaddr *sa)
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
} guard_t;

/* The HTTP client asks this with each resolved address before it
 * connects, for the first request and every redirect alike. */
static bool allow_addr(void *opaque, const struct sockaddr *sa)
{
        const guard_t *guard = opaque;

        return guard->host_allowed || cq_fetch_addr_is_public(sa) ||
               allowed(guard->allow, sa);
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
        static const cq_http_conf_t conf = {0}; /* no User-Agent, as ever */
        cq_http_t *http = NULL;
        cq_http_res_t res;
        allowlist_t *list = NULL;
        guard_t guard = {0};
        char cur[URL_MAX], host[HOST_MAX];
        cq_http_req_t req = {.url = cur,
                             .max = max,
                             .deadline_ms = deadline_ms,
                             .cancel = cancel,
                             .allow_addr = allow_addr,
                             .opaque = &guard};
        int hop;
        cq_err_t err = CQ_ERR_FATAL;

        cq_http_res_init(&res);
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
        http = cq_http_new(&conf, NULL, 0);
        if (!list || !http) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: out of memory");
                goto out;
        }
        if (allow_parse(allow, list, errstr, errstr_size) != 0)
                goto out;
        guard.allow = list;
        for (hop = 0;; hop++) {
                if (url_host(cur, host, sizeof(host)) != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: malformed URL");
                        goto out;
                }
                guard.host_allowed = allow_host(list, host);
                switch (cq_http_perform(http, &req, &res)) {
                case CQ_HTTP_OK:
                        break;
                case CQ_HTTP_CANCELLED:
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: cancelled");
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                case CQ_HTTP_DEADLINE:
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: its deadline "
                                      "passed");
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                case CQ_HTTP_REFUSED:
                        cq_errstr_set(
                            errstr, errstr_size,
                            "could not fetch file: host \"%s\" has the "
                            "non-public address %s (CODERQ_FETCH_ALLOW "
                            "can allow it)",
                            host, res.refused_addr);
                        err = CQ_ERR_FATAL;
                        goto out;
                case CQ_HTTP_TOO_LARGE:
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: larger than %zu "
                                      "bytes",
                                      max);
                        err = CQ_ERR_TOO_LARGE;
                        goto out;
                case CQ_HTTP_NETWORK:
                case CQ_HTTP_ABORTED: /* no sink or tick here */
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: %s", res.error);
                        err = (res.code == CURLE_UNSUPPORTED_PROTOCOL ||
                               res.code == CURLE_URL_MALFORMAT)
                                  ? CQ_ERR_FATAL
                                  : CQ_ERR_RETRIABLE;
                        goto out;
                }
                if (res.status < 300 || res.status > 399 || !res.redirect_url)
                        break;
                if (hop == MAX_REDIRS) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: more than %d "
                                      "redirects",
                                      MAX_REDIRS);
                        goto out;
                }
                if (!is_http(res.redirect_url) ||
                    strlen(res.redirect_url) >= sizeof(cur)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not fetch file: redirect to a "
                                      "non-http(s) or over-long URL");
                        goto out;
                }
                snprintf(cur, sizeof(cur), "%s", res.redirect_url);
        }
        if (res.status < 200 || res.status > 299) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: HTTP status %ld",
                              res.status);
                err = (res.status == 429 || res.status >= 500)
                          ? CQ_ERR_RETRIABLE
                          : CQ_ERR_FATAL;
                goto out;
        }
        *datap = (unsigned char *)cq_buf_take(&res.body, lenp);
        if (!*datap) {
                cq_errstr_set(errstr, errstr_size,
                              "could not fetch file: out of "
                              "memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        err = CQ_OK;
out:
        cq_http_res_release(&res);
        cq_http_destroy(&http);
        free(list);
        return err;
}
