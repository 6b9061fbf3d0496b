/* SPDX-License-Identifier: MIT */
/* http.c - one HTTP request over libcurl: an easy handle driven through a
 * private multi handle, polled every 100 ms so that a cancel flag or a
 * deadline ends even a silent transfer; the body into a capped buffer or
 * a caller's sink; Retry-After read from the headers; every message
 * cleaned of the configured secrets. Which statuses to retry is the
 * callers' (agent/llm.c, interp/e2b/e2b_http.c, agent/fetch.c). */
#include "coderq/http/http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "coderq/common/util.h"

#define POLL_MS            100
#define CONNECT_TIMEOUT_MS 10000L
#define HEADER_NAME_MAX    64
#define HEADER_VALUE_MAX   2048
#define RETRY_AFTER_MAX_S  (86400LL * 365)

struct cq_http {
        CURL *curl;
        CURLM *multi;
        cq_http_conf_t conf; /* user_agent points at the copy below */
        char *user_agent;
        /* The request under way. */
        const cq_http_req_t *req;
        cq_http_res_t *res;
        cq_http_outcome_t stop; /* why a check stopped it; CQ_HTTP_OK: no */
        bool overflow;          /* the body passed req->max */
        bool out_of_memory;
        bool sink_stopped;
        bool refused;
        bool ms_header; /* Retry-After-Ms seen: it wins */
        char curl_err[CURL_ERROR_SIZE];
};

int cq_http_global_init(void)
{
        return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void cq_http_global_cleanup(void) { curl_global_cleanup(); }

cq_http_t *
cq_http_new(const cq_http_conf_t *conf, char *errstr, size_t errstr_size)
{
        cq_http_t *http = calloc(1, sizeof(*http));

        if (!http)
                goto fail;
        http->conf = *conf;
        if (conf->user_agent) {
                http->user_agent = strdup(conf->user_agent);
                if (!http->user_agent)
                        goto fail;
        }
        http->conf.user_agent = http->user_agent;
        if (http->conf.connect_timeout_ms <= 0)
                http->conf.connect_timeout_ms = CONNECT_TIMEOUT_MS;
        http->curl = curl_easy_init();
        http->multi = curl_multi_init();
        if (!http->curl || !http->multi)
                goto fail;
        return http;
fail:
        cq_errstr_set(errstr, errstr_size,
                      "could not create an HTTP client: out of memory or "
                      "libcurl setup failed");
        cq_http_destroy(&http);
        return NULL;
}

void cq_http_destroy(cq_http_t **httpp)
{
        cq_http_t *http = *httpp;

        if (!http)
                return;
        if (http->multi)
                curl_multi_cleanup(http->multi);
        if (http->curl)
                curl_easy_cleanup(http->curl);
        free(http->user_agent);
        free(http);
        *httpp = NULL;
}

void cq_http_res_init(cq_http_res_t *res)
{
        memset(res, 0, sizeof(*res));
        cq_buf_init(&res->body, 0);
        res->retry_after_ms = -1;
}

void cq_http_res_release(cq_http_res_t *res)
{
        cq_buf_release(&res->body);
        free(res->redirect_url);
        cq_http_res_init(res);
}

/* --- messages ------------------------------------------------------- */

/* Replace each occurrence of \p secret in \p s (of \p size bytes). */
static void redact_one(char *s, size_t size, const char *secret)
{
        static const char mark[] = CQ_HTTP_REDACTED;
        size_t slen = secret ? strlen(secret) : 0;
        char *p = s;

        if (slen < 4)
                return;
        while ((p = strstr(p, secret)) != NULL) {
                size_t room = size - 1 - (size_t)(p - s); /* before the NUL */
                size_t m = sizeof(mark) - 1 < room ? sizeof(mark) - 1 : room;
                size_t tail = strlen(p + slen);

                if (tail > room - m)
                        tail = room - m;
                memmove(p + m, p + slen, tail);
                memcpy(p, mark, m);
                p[m + tail] = '\0';
                p += m;
        }
}

void cq_http_redact(const cq_http_t *http, char *s, size_t size)
{
        size_t i;

        if (!size)
                return;
        for (i = 0; i < http->conf.nsecrets; i++)
                redact_one(s, size, http->conf.secrets[i]);
}

static void res_error(cq_http_t *http, const char *fmt, ...) CQ_PRINTF(2, 3);

static void res_error(cq_http_t *http, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(http->res->error, sizeof(http->res->error), fmt, ap);
        va_end(ap);
        cq_http_redact(http, http->res->error, sizeof(http->res->error));
}

char *cq_http_url_shown(const char *url)
{
        const char *sep = strstr(url, "://");
        const char *host = sep ? sep + 3 : url;
        const char *at, *slash, *query;
        size_t scheme_len = sep ? (size_t)(sep + 3 - url) : 0, rest_len;
        char *out;

        slash = strchr(host, '/');
        at = strchr(host, '@');
        if (at && (!slash || at < slash))
                host = at + 1;
        query = strchr(host, '?');
        rest_len = query ? (size_t)(query - host) : strlen(host);
        out = malloc(scheme_len + rest_len + 1);
        if (!out)
                return NULL;
        memcpy(out, url, scheme_len);
        memcpy(out + scheme_len, host, rest_len);
        out[scheme_len + rest_len] = '\0';
        return out;
}

int64_t cq_http_parse_retry_after(const char *value, int64_t now)
{
        const char *p = value;
        char *end;
        double secs;
        time_t t;

        if (!value)
                return -1;
        while (isspace((unsigned char)*p))
                p++;
        if (isdigit((unsigned char)*p)) {
                errno = 0;
                secs = strtod(p, &end);
                while (isspace((unsigned char)*end))
                        end++;
                if (!errno && !*end && secs >= 0) {
                        if (secs > (double)RETRY_AFTER_MAX_S)
                                secs = (double)RETRY_AFTER_MAX_S;
                        return (int64_t)(secs * 1000.0);
                }
                /* Not a number: perhaps a date that starts with one. */
        }
        t = curl_getdate(p, NULL);
        if (t == (time_t)-1)
                return -1;
        if ((int64_t)t <= now)
                return 0;
        if ((int64_t)t - now > RETRY_AFTER_MAX_S)
                return RETRY_AFTER_MAX_S * 1000;
        return ((int64_t)t - now) * 1000;
}

char *cq_http_escape(cq_http_t *http, const char *s)
{
        char *tmp = curl_easy_escape(http->curl, s, 0);
        char *out = tmp ? strdup(tmp) : NULL;

        curl_free(tmp);
        return out;
}

curl_mime *cq_http_mime_new(cq_http_t *http)
{
        return curl_mime_init(http->curl);
}

/* --- callbacks ------------------------------------------------------ */

/* The cancel flag, the deadline, then the caller's tick: the first that
 * says stop is remembered. */
static bool must_stop(cq_http_t *http)
{
        const cq_http_req_t *req = http->req;

        if (http->stop != CQ_HTTP_OK)
                return true;
        if (req->cancel && atomic_load(req->cancel) != 0)
                http->stop = CQ_HTTP_CANCELLED;
        else if (req->deadline_ms > 0 && cq_now_ms() >= req->deadline_ms)
                http->stop = CQ_HTTP_DEADLINE;
        else if (req->tick && req->tick(req->opaque) != 0)
                http->stop = CQ_HTTP_ABORTED;
        return http->stop != CQ_HTTP_OK;
}

static int on_progress(void *opaque,
                       curl_off_t dltotal,
                       curl_off_t dlnow,
                       curl_off_t ultotal,
                       curl_off_t ulnow)
{
        (void)dltotal;
        (void)dlnow;
        (void)ultotal;
        (void)ulnow;
        return must_stop(opaque) ? 1 : 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *opaque)
{
        cq_http_t *http = opaque;
        const cq_http_req_t *req = http->req;
        size_t len = size * n;
        cq_err_t err;

        if (req->sink) {
                long status = 0;

                curl_easy_getinfo(http->curl, CURLINFO_RESPONSE_CODE, &status);
                if (req->sink(req->opaque, status, p, len) != 0) {
                        http->sink_stopped = true;
                        return 0;
                }
                return len;
        }
        err = cq_buf_append(&http->res->body, p, len);
        if (err != CQ_OK) {
                /* A short count makes curl fail with CURLE_WRITE_ERROR. */
                if (err == CQ_ERR_TOO_LARGE)
                        http->overflow = true;
                else
                        http->out_of_memory = true;
                return 0;
        }
        return len;
}

/* Copy \p n bytes at \p p, blanks at both ends removed, into \p out. */
static void copy_trimmed(const char *p, size_t n, char *out, size_t size)
{
        while (n && isspace((unsigned char)*p)) {
                p++;
                n--;
        }
        while (n && isspace((unsigned char)p[n - 1]))
                n--;
        if (n >= size)
                n = size - 1;
        memcpy(out, p, n);
        out[n] = '\0';
}

static void retry_after(cq_http_t *http, const char *name, const char *value)
{
        cq_http_res_t *res = http->res;

        if (strcasecmp(name, "retry-after-ms") == 0) {
                char *end;
                double v;

                errno = 0;
                v = strtod(value, &end);
                if (!errno && end != value && !*end && v >= 0 && v < 86400e3) {
                        /* the finer header wins over Retry-After */
                        res->retry_after_ms = (int64_t)v;
                        http->ms_header = true;
                }
        } else if (strcasecmp(name, "retry-after") == 0) {
                int64_t ms =
                    cq_http_parse_retry_after(value, (int64_t)time(NULL));

                if (ms >= 0 && !http->ms_header)
                        res->retry_after_ms = ms;
        }
}

static size_t on_header(char *p, size_t size, size_t n, void *opaque)
{
        cq_http_t *http = opaque;
        const cq_http_req_t *req = http->req;
        size_t len = size * n;
        const char *colon = memchr(p, ':', len);
        char name[HEADER_NAME_MAX], value[HEADER_VALUE_MAX];
        size_t name_len;

        if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
                /* a new response begins (after a 100 or a redirect) */
                http->res->retry_after_ms = -1;
                http->ms_header = false;
                return len;
        }
        if (!colon)
                return len;
        name_len = (size_t)(colon - p);
        if (name_len >= sizeof(name))
                return len;
        copy_trimmed(p, name_len, name, sizeof(name));
        copy_trimmed(colon + 1, len - name_len - 1, value, sizeof(value));
        retry_after(http, name, value);
        if (req->on_header)
                req->on_header(req->opaque, name, value);
        return len;
}

/* curl calls this with each resolved address before it connects, for
 * every connection of the request. */
static curl_socket_t
open_socket(void *opaque, curlsocktype purpose, struct curl_sockaddr *address)
{
        cq_http_t *http = opaque;
        const struct sockaddr *sa = &address->addr;
        int fd;

        (void)purpose;
        if (!http->req->allow_addr(http->req->opaque, sa)) {
                const void *bytes =
                    sa->sa_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)sa)
                              ->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)sa)
                              ->sin6_addr;
                char *text = http->res->refused_addr;

                http->refused = true;
                if (!inet_ntop(sa->sa_family, bytes, text,
                               sizeof(http->res->refused_addr)))
                        snprintf(text, sizeof(http->res->refused_addr), "?");
                return CURL_SOCKET_BAD;
        }
        fd = socket(address->family, address->socktype | SOCK_CLOEXEC,
                    address->protocol);
        return fd < 0 ? CURL_SOCKET_BAD : fd;
}

/* --- the request ---------------------------------------------------- */

/* Every option of one request, from a reset handle. Returns CURLE_OK or
 * the first option libcurl refused. */
static CURLcode setup(cq_http_t *http, const cq_http_req_t *req)
{
        CURL *curl = http->curl;
        const cq_http_conf_t *conf = &http->conf;
        CURLcode rc = CURLE_OK;

        /* the connections and caches survive a reset */
        curl_easy_reset(curl);
#define SET(opt, val)                                                          \
        do {                                                                   \
                if (rc == CURLE_OK)                                            \
                        rc = curl_easy_setopt(curl, opt, val);                 \
        } while (0)
        SET(CURLOPT_NOSIGNAL, 1L);
        SET(CURLOPT_URL, req->url);
        SET(CURLOPT_PROTOCOLS_STR, "http,https");
        SET(CURLOPT_CONNECTTIMEOUT_MS, conf->connect_timeout_ms);
        /* The deadline is not made a timeout: libcurl's clock is not
         * cq_now_ms()'s, so drive() watches it instead. */
        SET(CURLOPT_TIMEOUT_MS, req->timeout_ms > 0 ? req->timeout_ms : 0L);
        SET(CURLOPT_ERRORBUFFER, http->curl_err);
        SET(CURLOPT_WRITEFUNCTION, on_body);
        SET(CURLOPT_WRITEDATA, http);
        SET(CURLOPT_HEADERFUNCTION, on_header);
        SET(CURLOPT_HEADERDATA, http);
        SET(CURLOPT_NOPROGRESS, 0L);
        SET(CURLOPT_XFERINFOFUNCTION, on_progress);
        SET(CURLOPT_XFERINFODATA, http);
        /* a body announced too long fails before it is read */
        if (!req->sink && req->max && req->max <= (size_t)INT64_MAX)
                SET(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)req->max);
        if (conf->user_agent)
                SET(CURLOPT_USERAGENT, conf->user_agent);
        if (conf->http1)
                SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
        if (conf->compressed)
                SET(CURLOPT_ACCEPT_ENCODING, "");
        if (conf->tcp_keepalive)
                SET(CURLOPT_TCP_KEEPALIVE, 1L);
        if (req->headers)
                SET(CURLOPT_HTTPHEADER, req->headers);
        if (req->allow_addr) {
                SET(CURLOPT_PROXY, "");
                SET(CURLOPT_OPENSOCKETFUNCTION, open_socket);
                SET(CURLOPT_OPENSOCKETDATA, http);
        }
        if (req->mime) {
                SET(CURLOPT_MIMEPOST, req->mime);
        } else if (req->method && strcmp(req->method, "POST") == 0) {
                SET(CURLOPT_POSTFIELDS, req->body ? req->body : "");
                SET(CURLOPT_POSTFIELDSIZE_LARGE,
                    (curl_off_t)(req->body ? req->body_len : 0));
        } else if (req->method && strcmp(req->method, "GET") != 0) {
                SET(CURLOPT_CUSTOMREQUEST, req->method);
        }
#undef SET
        return rc;
}

/* Run the transfer, looking at the cancel flag, the deadline and the
 * tick every POLL_MS even while the server is silent. */
static CURLcode drive(cq_http_t *http)
{
        CURLcode result = CURLE_OK;
        CURLMsg *msg;
        int running = 1, left;

        if (curl_multi_add_handle(http->multi, http->curl) != CURLM_OK)
                return CURLE_OUT_OF_MEMORY;
        for (;;) {
                if (curl_multi_perform(http->multi, &running) != CURLM_OK) {
                        result = CURLE_OUT_OF_MEMORY;
                        goto out;
                }
                if (!running)
                        break;
                if (must_stop(http)) {
                        result = CURLE_ABORTED_BY_CALLBACK;
                        goto out;
                }
                if (curl_multi_poll(http->multi, NULL, 0, POLL_MS, NULL) !=
                    CURLM_OK) {
                        result = CURLE_OUT_OF_MEMORY;
                        goto out;
                }
        }
        while ((msg = curl_multi_info_read(http->multi, &left)) != NULL)
                if (msg->msg == CURLMSG_DONE && msg->easy_handle == http->curl)
                        result = msg->data.result;
out:
        curl_multi_remove_handle(http->multi, http->curl);
        return result;
}

/* Name what ended the transfer. */
static cq_http_outcome_t classify(cq_http_t *http, CURLcode code)
{
        const cq_http_req_t *req = http->req;

        if (code == CURLE_OK)
                return CQ_HTTP_OK;
        if (http->stop != CQ_HTTP_OK)
                return http->stop;
        if (http->sink_stopped)
                return CQ_HTTP_ABORTED;
        if (http->refused)
                return CQ_HTTP_REFUSED;
        if (http->overflow || code == CURLE_FILESIZE_EXCEEDED) {
                res_error(http, "the reply exceeds %zu bytes", req->max);
                return CQ_HTTP_TOO_LARGE;
        }
        return CQ_HTTP_NETWORK;
}

cq_http_outcome_t
cq_http_perform(cq_http_t *http, const cq_http_req_t *req, cq_http_res_t *res)
{
        CURLcode code;
        char *location = NULL;

        cq_http_res_release(res);
        cq_buf_init(&res->body, req->max);
        http->req = req;
        http->res = res;
        http->stop = CQ_HTTP_OK;
        http->overflow = http->out_of_memory = http->sink_stopped = false;
        http->refused = http->ms_header = false;
        http->curl_err[0] = '\0';
        if (must_stop(http)) {
                res->outcome = http->stop;
                code = CURLE_ABORTED_BY_CALLBACK;
                goto out;
        }
        code = setup(http, req);
        if (code != CURLE_OK) {
                res->code = code;
                res->outcome = CQ_HTTP_NETWORK;
                res_error(http, "libcurl refused the request: %s",
                          curl_easy_strerror(code));
                goto done;
        }
        code = drive(http);
        if (http->out_of_memory && code == CURLE_WRITE_ERROR)
                code = CURLE_OUT_OF_MEMORY;
        curl_easy_getinfo(http->curl, CURLINFO_RESPONSE_CODE, &res->status);
        res->outcome = classify(http, code);
out:
        res->code = code;
        switch (res->outcome) {
        case CQ_HTTP_OK:
                if (res->status >= 300 && res->status <= 399 &&
                    curl_easy_getinfo(http->curl, CURLINFO_REDIRECT_URL,
                                      &location) == CURLE_OK &&
                    location)
                        res->redirect_url = strdup(location);
                break;
        case CQ_HTTP_NETWORK:
                res_error(http, "%s",
                          http->curl_err[0] ? http->curl_err
                                            : curl_easy_strerror(code));
                break;
        case CQ_HTTP_TOO_LARGE:
                break; /* classify() said it */
        case CQ_HTTP_CANCELLED:
                res_error(http, "request cancelled");
                break;
        case CQ_HTTP_DEADLINE:
                res_error(http, "the caller's deadline passed");
                break;
        case CQ_HTTP_REFUSED:
                res_error(http, "the address %s was refused",
                          res->refused_addr);
                break;
        case CQ_HTTP_ABORTED:
                res_error(http, "stopped by the caller");
                break;
        }
done:
        http->req = NULL;
        http->res = NULL;
        return res->outcome;
}
