/* SPDX-License-Identifier: MIT */
/* e2b_http.c - one E2B request over libcurl with its retry policy:
 * network errors, 429 and 5xx are retried with capped, jittered backoff
 * (Retry-After and Should-Retry honoured), other 4xx fail at once, a 502
 * from the sandbox proxy means the sandbox is gone. Replies land in a
 * capped buffer. */
#include "coderq/e2b/e2b.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "e2b_int.h"

struct body_sink {
        cq_buf_t *buf;
        bool overflow;
};

static size_t sink_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
        struct body_sink *sink = ud;
        size_t n = size * nmemb;

        if (cq_buf_append(sink->buf, ptr, n) != CQ_OK) {
                sink->overflow = true;
                return 0;
        }
        return n;
}

struct hdr_sink {
        long retry_after_s;
        int should_retry; /* Should-Retry: -1 absent, 0 false, 1 true */
        char next_token[256];
};

/* Copy a header's value, trimmed, into \p out. */
static void header_value(const char *p, size_t n, char *out, size_t size)
{
        while (n > 0 && (*p == ' ' || *p == '\t')) {
                p++;
                n--;
        }
        while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == '\n' ||
                         p[n - 1] == ' ' || p[n - 1] == '\t'))
                n--;
        if (n >= size)
                n = size - 1;
        memcpy(out, p, n);
        out[n] = '\0';
}

static size_t header_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
        struct hdr_sink *hdr = ud;
        size_t n = size * nmemb;
        static const char name[] = "retry-after:";
        static const char should[] = "should-retry:";
        static const char next[] = "x-next-token:";
        char tmp[32];

        if (n > sizeof(should) - 1 &&
            strncasecmp(ptr, should, sizeof(should) - 1) == 0) {
                header_value(ptr + sizeof(should) - 1, n - (sizeof(should) - 1),
                             tmp, sizeof(tmp));
                hdr->should_retry = strcasecmp(tmp, "true") == 0 ? 1 : 0;
                return n;
        }
        if (n > sizeof(next) - 1 &&
            strncasecmp(ptr, next, sizeof(next) - 1) == 0) {
                header_value(ptr + sizeof(next) - 1, n - (sizeof(next) - 1),
                             hdr->next_token, sizeof(hdr->next_token));
                return n;
        }
        if (n > sizeof(name) - 1 &&
            strncasecmp(ptr, name, sizeof(name) - 1) == 0) {
                size_t len = n - (sizeof(name) - 1);
                char *end;
                long v;

                if (len >= sizeof(tmp))
                        len = sizeof(tmp) - 1;
                memcpy(tmp, ptr + sizeof(name) - 1, len);
                tmp[len] = '\0';
                v = strtol(tmp, &end, 10);
                if (end != tmp && v >= 0)
                        hdr->retry_after_s = v;
        }
        return n;
}

int cq_e2b_data_url(const char *sandbox_url,
                    const char *domain,
                    const char *sandbox_id,
                    int port,
                    char *out,
                    size_t size)
{
        static const char *const shared[] = {"e2b.app", "e2b.dev", "e2b.pro",
                                             "e2b-staging.dev"};
        size_t i;
        int n;

        if (sandbox_url && *sandbox_url) {
                n = snprintf(out, size, "%s", sandbox_url);
                if (n > 0 && (size_t)n < size && out[n - 1] == '/')
                        out[n - 1] = '\0';
                return n > 0 && (size_t)n < size ? 0 : -1;
        }
        if (!domain || !*domain)
                domain = DEF_DOMAIN;
        if (port == ENVD_PORT)
                for (i = 0; i < CQ_ARRAY_SIZE(shared); i++)
                        if (strcmp(domain, shared[i]) == 0) {
                                n = snprintf(out, size, "https://sandbox.%s",
                                             domain);
                                return n > 0 && (size_t)n < size ? 0 : -1;
                        }
        n = snprintf(out, size, "https://%d-%s.%s", port, sandbox_id, domain);
        return n > 0 && (size_t)n < size ? 0 : -1;
}

/* The base URL of the data plane for \p port, without a trailing slash. */
int e2b_dp_base(cq_e2b_t *e2b, int port, char *out, size_t size)
{
        return cq_e2b_data_url(e2b->sandbox_url,
                               e2b->sandbox_domain ? e2b->sandbox_domain
                                                   : e2b->domain,
                               e2b->sandbox_id, port, out, size);
}

/* Append "Name: value" to \p list; on failure free it and return NULL. */
static struct curl_slist *
add_header(struct curl_slist *list, const char *name, const char *value)
{
        char line[512];
        struct curl_slist *next;

        snprintf(line, sizeof(line), "%s: %s", name, value);
        next = curl_slist_append(list, line);
        if (!next) {
                curl_slist_free_all(list);
                return NULL;
        }
        return next;
}

/* The headers of one call; NULL when out of memory. */
struct curl_slist *
e2b_make_headers(cq_e2b_t *e2b, enum plane plane, const char *ctype)
{
        struct curl_slist *h = curl_slist_append(NULL, "Expect:");

        if (ctype)
                h = add_header(h, "Content-Type", ctype);
        if (plane == PLANE_API) {
                if (h)
                        h = add_header(h, "X-API-KEY", e2b->api_key);
                return h;
        }
        if (h)
                h = add_header(h, "E2b-Sandbox-Id", e2b->sandbox_id);
        if (h)
                h = add_header(h, "E2b-Sandbox-Port",
                               plane == PLANE_ENVD ? "49983" : "49999");
        if (h && e2b->envd_token[0] && plane != PLANE_CI_NOTOKEN)
                h = add_header(h, "X-Access-Token", e2b->envd_token);
        if (h && e2b->traffic_token[0])
                h = add_header(h, "E2B-Traffic-Access-Token",
                               e2b->traffic_token);
        return h;
}

void e2b_curl_common(CURL *curl, long timeout_ms)
{
        curl_easy_reset(curl);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_USERAGENT, USER_AGENT);
        curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_MS);
        curl_easy_setopt(curl, CURLOPT_HTTP_VERSION,
                         (long)CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
        if (timeout_ms > 0)
                curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
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
        e2b_redact_all(e2b, buf);
}

static bool status_in(long status, const long *ok)
{
        for (; *ok; ok++)
                if (*ok == status)
                        return true;
        return false;
}

/* A short readable reason from an error body: its "message", else the
 * body itself, cut and made printable. */
void e2b_reply_reason(const cq_buf_t *reply, char *out, size_t size)
{
        json_t *doc = NULL;
        const char *msg = NULL;
        size_t i, n;

        out[0] = '\0';
        if (!reply->data)
                return;
        doc = json_loadb(reply->data, reply->len, 0, NULL);
        if (json_is_object(doc))
                msg = json_string_value(json_object_get(doc, "message"));
        if (!msg)
                msg = reply->data;
        snprintf(out, size, "%s", msg);
        n = strlen(out);
        for (i = 0; i < n; i++)
                if ((unsigned char)out[i] < 0x20)
                        out[i] = ' ';
        json_decref(doc);
}

void e2b_backoff_sleep(cq_e2b_t *e2b, int attempt, long retry_after_s)
{
        /* full jitter, so a fleet does not retry in step */
        long ms = (long)cq_backoff_ms(attempt + 1, e2b->retry_base_ms,
                                      e2b->retry_max_ms, CQ_JITTER_FULL);
        struct timespec ts;

        if (retry_after_s > 0) {
                long ra = retry_after_s * 1000;

                ms = ra > e2b->retry_max_ms ? e2b->retry_max_ms : ra;
        }
        ts.tv_sec = ms / 1000;
        ts.tv_nsec = (ms % 1000) * 1000000L;
        while (nanosleep(&ts, &ts) != 0)
                ;
}

/**
 * Run one request with retries for network errors, 429 and 5xx (502 only
 * on the API: from the sandbox proxy it means the sandbox is gone).
 * @returns CQ_OK with call->status in call->ok; CQ_ERR_FATAL for other
 *          4xx (401/403 at once); CQ_ERR_TOO_LARGE for an over-long reply;
 *          else CQ_ERR_RETRIABLE. The error is in e2b->errbuf.
 */
cq_err_t e2b_call_run(cq_e2b_t *e2b, CURL *curl, struct call *call)
{
        cq_err_t err = CQ_ERR_RETRIABLE;
        struct curl_slist *headers = NULL;
        char reason[512];
        int attempt,
            attempts = call->attempts ? call->attempts : e2b->max_attempts;
        const char *errbuf = call->errbuf ? call->errbuf : e2b->errbuf;

        cq_buf_init(&call->reply,
                    call->max_reply ? call->max_reply : e2b->max_body);
        call->should_retry = -1;
        for (attempt = 0; attempt < attempts; attempt++) {
                struct body_sink sink = {&call->reply, false};
                struct hdr_sink hdr = {0, -1, ""};
                CURLcode rc;
                bool last = attempt + 1 == attempts;

                cq_buf_reset(&call->reply);
                curl_slist_free_all(headers);
                headers = e2b_make_headers(e2b, call->plane, call->ctype);
                if (!headers) {
                        e2b_call_error(e2b, call, "could not %s: out of memory",
                                       call->what);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                e2b_curl_common(curl, e2b->request_timeout_ms);
                curl_easy_setopt(curl, CURLOPT_URL, call->url);
                curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
                curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, sink_write);
                curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
                curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, header_cb);
                curl_easy_setopt(curl, CURLOPT_HEADERDATA, &hdr);
                if (call->mime) {
                        curl_easy_setopt(curl, CURLOPT_MIMEPOST, call->mime);
                } else if (strcmp(call->method, "POST") == 0) {
                        curl_easy_setopt(curl, CURLOPT_POSTFIELDS,
                                         call->body ? call->body : "");
                        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                                         (curl_off_t)call->body_len);
                } else if (strcmp(call->method, "GET") != 0) {
                        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST,
                                         call->method);
                }
                rc = curl_easy_perform(curl);
                call->status = 0;
                call->curl_rc = rc;
                call->should_retry = hdr.should_retry;
                call->retry_after_s = hdr.retry_after_s;
                snprintf(call->next_token, sizeof(call->next_token), "%s",
                         hdr.next_token);
                if (rc == CURLE_WRITE_ERROR && sink.overflow) {
                        e2b_call_error(e2b, call,
                                       "could not %s: reply exceeds %zu bytes",
                                       call->what, call->reply.max);
                        err = CQ_ERR_TOO_LARGE;
                        goto out;
                }
                if (rc != CURLE_OK) {
                        e2b_call_error(e2b, call, "could not %s: %s",
                                       call->what, curl_easy_strerror(rc));
                        cq_log_warn("e2b: %s (attempt %d of %d)", errbuf,
                                    attempt + 1, attempts);
                        if (!last)
                                e2b_backoff_sleep(e2b, attempt, 0);
                        continue;
                }
                curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &call->status);
                if (status_in(call->status, call->ok)) {
                        err = CQ_OK;
                        goto out;
                }
                e2b_reply_reason(&call->reply, reason, sizeof(reason));
                e2b_call_error(e2b, call, "could not %s: HTTP %ld: %s",
                               call->what, call->status, reason);
                if (call->status == 401 || call->status == 403) {
                        e2b_call_error(e2b, call,
                                       "could not %s: HTTP %ld: %s (check "
                                       "E2B_API_KEY)",
                                       call->what, call->status, reason);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                if (call->status == 502 && call->plane != PLANE_API) {
                        e2b->lost = true;
                        err = CQ_ERR_RETRIABLE;
                        goto out;
                }
                /* the API says whether a retry can help */
                if (hdr.should_retry == 0) {
                        err = call->status == 429 || call->status >= 500
                                  ? CQ_ERR_RETRIABLE
                                  : CQ_ERR_FATAL;
                        goto out;
                }
                if (call->status != 429 && call->status < 500 &&
                    hdr.should_retry != 1) {
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                cq_log_warn("e2b: %s (attempt %d of %d)", errbuf, attempt + 1,
                            attempts);
                if (!last)
                        e2b_backoff_sleep(e2b, attempt, hdr.retry_after_s);
        }
        err = CQ_ERR_RETRIABLE;
out:
        curl_slist_free_all(headers);
        return err;
}

/* The statuses calls accept (struct call.ok). */
const long e2b_ok_201[] = {201, 0};
const long e2b_ok_200[] = {200, 0};
const long e2b_ok_204[] = {204, 0};
const long e2b_ok_kill[] = {200, 204, 404, 0};
