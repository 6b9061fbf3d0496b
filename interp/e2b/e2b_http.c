/* SPDX-License-Identifier: MIT */
/* e2b_http.c - one E2B request over the HTTP client (http.c, which owns
 * the capped reply, Retry-After and the secrets' redaction) with E2B's
 * retry policy: network errors, 429 and 5xx are retried with capped,
 * fully jittered backoff (Retry-After and Should-Retry honoured), other
 * 4xx fail at once, a 502 from the sandbox proxy means the sandbox is
 * gone. E2B's headers are made here. */
#include "coderq/e2b/e2b.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "e2b_int.h"

/* E2B's own headers of a reply. */
struct hdr_sink {
        int should_retry; /* Should-Retry: -1 absent, 0 false, 1 true */
        char next_token[256];
};

static void on_header(void *opaque, const char *name, const char *value)
{
        struct hdr_sink *hdr = opaque;

        if (strcasecmp(name, "should-retry") == 0)
                hdr->should_retry = strcasecmp(value, "true") == 0 ? 1 : 0;
        else if (strcasecmp(name, "x-next-token") == 0)
                snprintf(hdr->next_token, sizeof(hdr->next_token), "%s", value);
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

/* A client for this handle's requests: E2B speaks HTTP/1.1 (its
 * /execute stream is a chunked response), and no message may show the
 * handle's key or tokens. NULL when out of memory. */
cq_http_t *e2b_http_new(cq_e2b_t *e2b)
{
        cq_http_conf_t conf = {0};

        conf.user_agent = USER_AGENT;
        conf.connect_timeout_ms = CONNECT_MS;
        conf.http1 = true;
        conf.secrets = e2b->secrets;
        conf.nsecrets = CQ_ARRAY_SIZE(e2b->secrets);
        return cq_http_new(&conf, NULL, 0);
}

/* Set \p call up, from zero, as a \p method of \p url on \p plane that
 * succeeds with a status of \p ok; every string is borrowed. */
void e2b_call_init(struct call *call,
                   const char *what,
                   enum plane plane,
                   const char *method,
                   const char *url,
                   const long *ok)
{
        memset(call, 0, sizeof(*call));
        call->what = what;
        call->plane = plane;
        call->method = method;
        call->url = url;
        call->ok = ok;
}

/* Give \p call, set up by e2b_call_init(), the JSON text \p body
 * (borrowed). */
void e2b_call_json(struct call *call, const char *body)
{
        call->ctype = "application/json";
        call->body = body;
        call->body_len = strlen(body);
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

void e2b_backoff_sleep(cq_e2b_t *e2b, int attempt, int64_t retry_after_ms)
{
        /* full jitter, so a fleet does not retry in step */
        int64_t ms = cq_backoff_ms(attempt + 1, e2b->retry_base_ms,
                                   e2b->retry_max_ms, CQ_JITTER_FULL);
        struct timespec ts;

        if (retry_after_ms > 0)
                ms = retry_after_ms > e2b->retry_max_ms ? e2b->retry_max_ms
                                                        : retry_after_ms;
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
cq_err_t e2b_call_run(cq_e2b_t *e2b, cq_http_t *http, struct call *call)
{
        cq_err_t err = CQ_ERR_RETRIABLE;
        struct curl_slist *headers = NULL;
        cq_http_req_t req = {0};
        cq_http_res_t res;
        char reason[512];
        int attempt,
            attempts = call->attempts ? call->attempts : e2b->max_attempts;
        const char *errbuf = call->errbuf ? call->errbuf : e2b->errbuf;

        cq_http_res_init(&res);
        call->should_retry = -1;
        req.method = call->method;
        req.url = call->url;
        req.body = call->body;
        req.body_len = call->body_len;
        req.mime = call->mime;
        req.max = call->max_reply ? call->max_reply : e2b->max_body;
        req.timeout_ms =
            call->timeout_ms > 0 ? call->timeout_ms : e2b->request_timeout_ms;
        req.on_header = on_header;
        for (attempt = 0; attempt < attempts; attempt++) {
                struct hdr_sink hdr = {-1, ""};
                cq_http_outcome_t outcome;
                bool last = attempt + 1 == attempts;

                curl_slist_free_all(headers);
                headers = e2b_make_headers(e2b, call->plane, call->ctype);
                if (!headers) {
                        e2b_call_error(e2b, call, "could not %s: out of memory",
                                       call->what);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                req.headers = headers;
                req.opaque = &hdr;
                outcome = cq_http_perform(http, &req, &res);
                call->status = outcome == CQ_HTTP_OK ? res.status : 0;
                call->curl_rc = res.code;
                call->should_retry = hdr.should_retry;
                call->retry_after_ms = res.retry_after_ms;
                snprintf(call->next_token, sizeof(call->next_token), "%s",
                         hdr.next_token);
                if (outcome == CQ_HTTP_TOO_LARGE) {
                        e2b_call_error(e2b, call,
                                       "could not %s: reply exceeds %zu bytes",
                                       call->what, req.max);
                        err = CQ_ERR_TOO_LARGE;
                        goto out;
                }
                if (outcome != CQ_HTTP_OK) {
                        e2b_call_error(e2b, call, "could not %s: %s",
                                       call->what, res.error);
                        cq_log_warn("e2b: %s (attempt %d of %d)", errbuf,
                                    attempt + 1, attempts);
                        if (!last)
                                e2b_backoff_sleep(e2b, attempt, -1);
                        continue;
                }
                if (status_in(call->status, call->ok)) {
                        err = CQ_OK;
                        goto out;
                }
                e2b_reply_reason(&res.body, reason, sizeof(reason));
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
                        e2b_backoff_sleep(e2b, attempt, res.retry_after_ms);
        }
        err = CQ_ERR_RETRIABLE;
out:
        curl_slist_free_all(headers);
        /* the last reply is the caller's */
        cq_buf_release(&call->reply);
        call->reply = res.body;
        cq_buf_init(&res.body, 0);
        cq_http_res_release(&res);
        return err;
}

/* The statuses calls accept (struct call.ok). */
const long e2b_ok_201[] = {201, 0};
const long e2b_ok_200[] = {200, 0};
const long e2b_ok_204[] = {204, 0};
const long e2b_ok_kill[] = {200, 204, 404, 0};
