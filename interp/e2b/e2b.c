/* SPDX-License-Identifier: MIT */
/* e2b.c - the E2B interpreter backend over libcurl + jansson: sandbox
 * lifecycle on the control plane, files over envd, cells over the code
 * interpreter's NDJSON /execute stream (parsed incrementally with a bounded
 * line). Recovery rules are in e2b.h; the wire facts in docs/protocols/e2b.md.
 */
#include "coderq/e2b.h"

#include <curl/curl.h>
#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "coderq/buf.h"
#include "coderq/collect.h"
#include "coderq/log.h"
#include "coderq/util.h"

#define HOME_DIR      "/home/user"
#define ENVD_PORT     49983
#define CI_PORT       49999
#define LIST_DEPTH    32
#define MAX_ENTRIES   20000
#define MAX_ERR_BODY  2048
#define ID_MAX        64
#define TOKEN_MAX     256
#define USER_AGENT    "coderq/" CQ_VERSION
#define DEF_TEMPLATE  "code-interpreter-v1"
#define DEF_DOMAIN    "e2b.app"
#define DEF_CREATE    "/v2/sandboxes"
#define CONNECT_MS    10000L
#define KILL_ATTEMPTS 3
#define NONCE_LEN     16
#define LIST_PAGES    20
#define TAG_CREATE    "coderq_create"
#define TAG_WORKER    "coderq_worker"
#define TAG_JOB       "coderq_job"
#define TAG_ATTEMPT   "coderq_attempt"

enum plane { PLANE_API, PLANE_ENVD, PLANE_CI, PLANE_CI_NOTOKEN };

struct input_file {
        char *name;
        unsigned char *data;
        size_t len;
};

typedef struct cq_e2b {
        cq_interp_t base; /* first: cq_interp_t * casts to cq_e2b_t * */
        /* settings, copied */
        char *api_key, *domain, *api_url, *sandbox_url, *template_id,
            *create_path;
        int ttl_s, max_attempts, retry_base_ms, retry_max_ms,
            request_timeout_ms, probe_timeout_ms;
        size_t max_line, max_output, max_body, max_file;
        /* the sandbox; written by the owner thread under lock, read by
         * cq_e2b_keepalive() under lock */
        pthread_mutex_t lock;
        char sandbox_id[ID_MAX];
        char envd_token[TOKEN_MAX];
        char traffic_token[TOKEN_MAX];
        char *sandbox_domain; /* from the Sandbox body, or NULL */
        char context_id[ID_MAX];
        int64_t expires_ms;         /* our view of the TTL end, monotonic */
        int64_t next_extend_try_ms; /* owner thread only */
        /* owner thread only */
        CURL *curl;
        CURL *aux;        /* lifetime extensions while curl streams a cell */
        json_t *snapshot; /* {relpath: "size|mtime"} at sandbox start */
        struct input_file *inputs;
        size_t ninputs;
        bool lost;       /* a data-plane 502 said the sandbox is gone */
        json_t *env;     /* cq_interp_env(), once probed */
        bool env_probed; /* probed, whatever came of it */
        unsigned int rng;
        atomic_int interrupt;
        char errbuf[1024];
        /* metadata tags of our sandboxes, so strays can be found */
        char *tag_job, *tag_worker;
        int tag_attempt, max_timeout_s;
        /* coderq_create tag of the adopted sandbox and of the one being
         * created; under lock (the fleet reads them) */
        char nonce[NONCE_LEN + 1];
        char pending[NONCE_LEN + 1];
        /* membership of a fleet; under fleet->lock */
        struct cq_e2b_fleet *fleet;
        struct cq_e2b *fleet_next;
        int fleet_refs;
} cq_e2b_t;

struct cq_e2b_fleet {
        pthread_mutex_t lock;
        pthread_cond_t cond; /* a member's fleet_refs dropped */
        cq_e2b_t *members;
        cq_e2b_t *api; /* no sandbox: list and kill; housekeeping only */
};

/* ---------------------------------------------------------------- errors */

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

static void redact_all(const cq_e2b_t *e2b, char *s)
{
        redact(s, e2b->api_key);
        redact(s, e2b->envd_token);
        redact(s, e2b->traffic_token);
}

CQ_PRINTF(2, 3) static void set_error(cq_e2b_t *e2b, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(e2b->errbuf, sizeof(e2b->errbuf), fmt, ap);
        va_end(ap);
        redact_all(e2b, e2b->errbuf);
}

static const char *e2b_errmsg(const cq_interp_t *interp)
{
        return ((const cq_e2b_t *)interp)->errbuf;
}

/* ------------------------------------------------------------------ HTTP */

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
static int dp_base(cq_e2b_t *e2b, int port, char *out, size_t size)
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
static struct curl_slist *
make_headers(cq_e2b_t *e2b, enum plane plane, const char *ctype)
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

static void curl_common(CURL *curl, long timeout_ms)
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

struct call {
        const char *what; /* "create E2B sandbox" for messages */
        enum plane plane;
        const char *method; /* GET, POST, DELETE */
        const char *url;
        const char *ctype; /* request Content-Type, or NULL */
        const void *body;
        size_t body_len;
        curl_mime *mime;  /* borrowed, or NULL */
        const long *ok;   /* accepted statuses, 0-terminated */
        size_t max_reply; /* 0: e2b->max_body */
        int attempts;     /* 0: e2b->max_attempts */
        /* Where errors go and the jitter seed, when not the handle's own
         * (cq_e2b_keepalive() runs beside the owner thread). */
        char *errbuf;
        size_t errbuf_size;
        unsigned int *rng;
        /* out */
        long status;
        cq_buf_t reply;
        CURLcode curl_rc;     /* of the last attempt */
        int should_retry;     /* Should-Retry of the last reply, or -1 */
        long retry_after_s;   /* Retry-After of the last reply, or 0 */
        char next_token[256]; /* X-Next-Token of the last reply */
};

CQ_PRINTF(3, 4)
static void call_error(cq_e2b_t *e2b, struct call *call, const char *fmt, ...)
{
        char *buf = call->errbuf ? call->errbuf : e2b->errbuf;
        size_t size = call->errbuf ? call->errbuf_size : sizeof(e2b->errbuf);
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(buf, size, fmt, ap);
        va_end(ap);
        redact_all(e2b, buf);
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
static void reply_reason(const cq_buf_t *reply, char *out, size_t size)
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

static void
backoff_sleep(cq_e2b_t *e2b, unsigned int *rng, int attempt, long retry_after_s)
{
        long ms = (long)e2b->retry_base_ms << (attempt < 16 ? attempt : 16);
        struct timespec ts;

        if (ms > e2b->retry_max_ms)
                ms = e2b->retry_max_ms;
        /* full jitter in [ms/2, ms] so a fleet does not retry in step */
        ms = ms / 2 + (long)(rand_r(rng) % (unsigned int)(ms / 2 + 1));
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
static cq_err_t call_run(cq_e2b_t *e2b, CURL *curl, struct call *call)
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
                headers = make_headers(e2b, call->plane, call->ctype);
                if (!headers) {
                        call_error(e2b, call, "could not %s: out of memory",
                                   call->what);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                curl_common(curl, e2b->request_timeout_ms);
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
                        call_error(e2b, call,
                                   "could not %s: reply exceeds %zu bytes",
                                   call->what, call->reply.max);
                        err = CQ_ERR_TOO_LARGE;
                        goto out;
                }
                if (rc != CURLE_OK) {
                        call_error(e2b, call, "could not %s: %s", call->what,
                                   curl_easy_strerror(rc));
                        cq_log_warn("e2b: %s (attempt %d of %d)", errbuf,
                                    attempt + 1, attempts);
                        if (!last)
                                backoff_sleep(e2b,
                                              call->rng ? call->rng : &e2b->rng,
                                              attempt, 0);
                        continue;
                }
                curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &call->status);
                if (status_in(call->status, call->ok)) {
                        err = CQ_OK;
                        goto out;
                }
                reply_reason(&call->reply, reason, sizeof(reason));
                call_error(e2b, call, "could not %s: HTTP %ld: %s", call->what,
                           call->status, reason);
                if (call->status == 401 || call->status == 403) {
                        call_error(e2b, call,
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
                        backoff_sleep(e2b, call->rng ? call->rng : &e2b->rng,
                                      attempt, hdr.retry_after_s);
        }
        err = CQ_ERR_RETRIABLE;
out:
        curl_slist_free_all(headers);
        return err;
}

/* ------------------------------------------------------------- lifecycle */

static const long OK_201[] = {201, 0};
static const long OK_200[] = {200, 0};
static const long OK_204[] = {204, 0};
static const long OK_KILL[] = {200, 204, 404, 0};

static bool id_is_safe(const char *s, size_t max)
{
        size_t n = strlen(s);

        if (n == 0 || n >= max)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9')))
                        return false;
        return true;
}

/* Header-safe token: printable ASCII without spaces. */
static bool token_is_safe(const char *s, size_t max)
{
        if (strlen(s) >= max)
                return false;
        for (; *s; s++)
                if (*s <= 0x20 || *s >= 0x7f)
                        return false;
        return true;
}

static cq_err_t kill_sandbox(cq_e2b_t *e2b, const char *id)
{
        struct call call = {0};
        char url[1024];
        cq_err_t err;

        snprintf(url, sizeof(url), "%s/sandboxes/%s", e2b->api_url, id);
        call.what = "kill E2B sandbox";
        call.plane = PLANE_API;
        call.method = "DELETE";
        call.url = url;
        call.ok = OK_KILL;
        call.attempts = e2b->max_attempts > KILL_ATTEMPTS ? KILL_ATTEMPTS
                                                          : e2b->max_attempts;
        err = call_run(e2b, e2b->curl, &call);
        cq_buf_release(&call.reply);
        if (err != CQ_OK)
                cq_log_warn("e2b: %s (sandbox %s may live until its TTL ends)",
                            e2b->errbuf, id);
        return err;
}

/* Parse the Sandbox body of a 201 and adopt it. */
static cq_err_t adopt_sandbox(cq_e2b_t *e2b, const cq_buf_t *reply)
{
        json_t *doc =
            json_loadb(reply->data ? reply->data : "", reply->len, 0, NULL);
        const char *id, *tok, *traffic, *dom, *envd;
        bool bad = false;
        cq_err_t err = CQ_ERR_FATAL;

        if (!json_is_object(doc)) {
                set_error(e2b, "could not create E2B sandbox: reply is not a "
                               "JSON object");
                goto out;
        }
        id = json_string_value(json_object_get(doc, "sandboxID"));
        envd = json_string_value(json_object_get(doc, "envdVersion"));
        tok = json_string_value(json_object_get(doc, "envdAccessToken"));
        traffic = json_string_value(json_object_get(doc, "trafficAccessToken"));
        dom = json_string_value(json_object_get(doc, "domain"));
        if (!id || !id_is_safe(id, ID_MAX) || !envd) {
                set_error(e2b, "could not create E2B sandbox: reply lacks a "
                               "valid sandboxID or envdVersion");
                goto out;
        }
        if ((tok && !token_is_safe(tok, TOKEN_MAX)) ||
            (traffic && !token_is_safe(traffic, TOKEN_MAX)) ||
            (dom && (!token_is_safe(dom, 256) || strchr(dom, '/')))) {
                set_error(e2b, "could not create E2B sandbox: reply has an "
                               "invalid token or domain");
                /* still adopt the id so the caller can kill it */
                bad = true;
        }
        pthread_mutex_lock(&e2b->lock);
        snprintf(e2b->sandbox_id, sizeof(e2b->sandbox_id), "%s", id);
        snprintf(e2b->envd_token, sizeof(e2b->envd_token), "%s",
                 tok && token_is_safe(tok, TOKEN_MAX) ? tok : "");
        snprintf(e2b->traffic_token, sizeof(e2b->traffic_token), "%s",
                 traffic && token_is_safe(traffic, TOKEN_MAX) ? traffic : "");
        free(e2b->sandbox_domain);
        e2b->sandbox_domain = dom ? strdup(dom) : NULL;
        e2b->expires_ms = cq_now_ms() + (int64_t)e2b->ttl_s * 1000;
        e2b->context_id[0] = '\0';
        pthread_mutex_unlock(&e2b->lock);
        err = bad ? CQ_ERR_FATAL : CQ_OK;
out:
        json_decref(doc);
        return err;
}

static void make_nonce(cq_e2b_t *e2b, char *out)
{
        unsigned char b[NONCE_LEN / 2];
        size_t i;

        if (getrandom(b, sizeof(b), GRND_NONBLOCK) != (ssize_t)sizeof(b))
                for (i = 0; i < sizeof(b); i++)
                        b[i] = (unsigned char)rand_r(&e2b->rng);
        for (i = 0; i < sizeof(b); i++)
                snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* GET /v2/sandboxes whose metadata has \p key = \p value, every page.
 * On CQ_OK *idsp is a JSON array of sandbox ids. */
static cq_err_t
list_tagged(cq_e2b_t *e2b, const char *key, const char *value, json_t **idsp)
{
        static const long ok[] = {200, 0};
        char filter[512], url[2048], token[256] = "";
        char *meta = NULL, *tok = NULL;
        json_t *ids = json_array();
        cq_err_t err = CQ_ERR_FATAL;
        int page;

        snprintf(filter, sizeof(filter), "%s=%s", key, value);
        meta = curl_easy_escape(e2b->curl, filter, 0);
        if (!ids || !meta) {
                set_error(e2b, "could not list E2B sandboxes: out of memory");
                goto out;
        }
        for (page = 0; page < LIST_PAGES; page++) {
                struct call call = {0};
                json_t *doc;
                size_t i;

                curl_free(tok);
                tok = token[0] ? curl_easy_escape(e2b->curl, token, 0) : NULL;
                snprintf(url, sizeof(url),
                         "%s/v2/sandboxes?metadata=%s&state=running%%2Cpaused"
                         "&limit=100%s%s",
                         e2b->api_url, meta, tok ? "&nextToken=" : "",
                         tok ? tok : "");
                call.what = "list E2B sandboxes";
                call.plane = PLANE_API;
                call.method = "GET";
                call.url = url;
                call.ok = ok;
                err = call_run(e2b, e2b->curl, &call);
                if (err != CQ_OK) {
                        cq_buf_release(&call.reply);
                        goto out;
                }
                doc = json_loadb(call.reply.data ? call.reply.data : "",
                                 call.reply.len, 0, NULL);
                snprintf(token, sizeof(token), "%s", call.next_token);
                cq_buf_release(&call.reply);
                if (!json_is_array(doc)) {
                        json_decref(doc);
                        set_error(e2b, "could not list E2B sandboxes: reply "
                                       "is not a JSON array");
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                for (i = 0; i < json_array_size(doc); i++) {
                        const char *id = json_string_value(json_object_get(
                            json_array_get(doc, i), "sandboxID"));

                        if (id && id_is_safe(id, ID_MAX) &&
                            json_array_append_new(ids, json_string(id))) {
                                json_decref(doc);
                                set_error(e2b, "could not list E2B "
                                               "sandboxes: out of memory");
                                err = CQ_ERR_FATAL;
                                goto out;
                        }
                }
                json_decref(doc);
                if (!token[0])
                        break;
        }
        *idsp = ids;
        ids = NULL;
        err = CQ_OK;
out:
        curl_free(tok);
        curl_free(meta);
        json_decref(ids);
        return err;
}

/* Kill every sandbox tagged coderq_create = \p nonce: what a create whose
 * reply was lost may have made. Returns how many, or -1 when the list
 * failed (the error is in e2b->errbuf). */
static int reap_created(cq_e2b_t *e2b, const char *nonce)
{
        json_t *ids = NULL;
        size_t i;
        int n = 0;

        if (list_tagged(e2b, TAG_CREATE, nonce, &ids) != CQ_OK)
                return -1;
        for (i = 0; i < json_array_size(ids); i++) {
                const char *id = json_string_value(json_array_get(ids, i));

                cq_log_warn("e2b: killing sandbox %s, made by a create whose "
                            "reply was lost",
                            id);
                if (kill_sandbox(e2b, id) == CQ_OK)
                        n++;
        }
        json_decref(ids);
        return n;
}

static json_t *create_request(cq_e2b_t *e2b, const char *nonce)
{
        char attempt[24];
        json_t *meta = json_pack("{s:s}", TAG_CREATE, nonce);
        json_t *req;

        snprintf(attempt, sizeof(attempt), "%d", e2b->tag_attempt);
        if (meta && e2b->tag_worker &&
            json_object_set_new(meta, TAG_WORKER, json_string(e2b->tag_worker)))
                goto fail;
        if (meta && e2b->tag_job &&
            (json_object_set_new(meta, TAG_JOB, json_string(e2b->tag_job)) ||
             json_object_set_new(meta, TAG_ATTEMPT, json_string(attempt))))
                goto fail;
        if (!meta)
                return NULL;
        req =
            json_pack("{s:s, s:i, s:b, s:o, s:{}}", "templateID",
                      e2b->template_id, "timeout", e2b->ttl_s,
                      "allow_internet_access", 1, "metadata", meta, "envVars");
        if (req && strcmp(e2b->create_path, "/sandboxes") == 0 &&
            json_object_set_new(req, "secure", json_true())) {
                json_decref(req);
                return NULL;
        }
        return req;
fail:
        json_decref(meta);
        return NULL;
}

/* Did a failed create possibly make a sandbox? Only a refusal (4xx) or a
 * connection that never opened proves it did not. */
static bool maybe_created(const struct call *call, cq_err_t err)
{
        if (err == CQ_ERR_TOO_LARGE)
                return true;
        if (call->status == 0)
                return call->curl_rc != CURLE_COULDNT_CONNECT &&
                       call->curl_rc != CURLE_COULDNT_RESOLVE_HOST &&
                       call->curl_rc != CURLE_COULDNT_RESOLVE_PROXY &&
                       call->curl_rc != CURLE_OUT_OF_MEMORY;
        return call->status < 400 || call->status >= 500;
}

/* E2B bills every sandbox it makes, so a create is repeated only when the
 * reply says it may be (429, 502, 503, 504, or Should-Retry: true), or
 * when no request went out; and whenever a sandbox may have been made
 * (a lost reply, a 5xx), the sandboxes tagged with that create's nonce
 * are killed first. When that cannot be checked, no second create. */
static cq_err_t create_sandbox(cq_e2b_t *e2b)
{
        char nonce[NONCE_LEN + 1];
        cq_err_t err = CQ_ERR_FATAL;
        int attempt;

        e2b->errbuf[0] = '\0';
        for (attempt = 0; attempt < e2b->max_attempts; attempt++) {
                struct call call = {0};
                char url[1024];
                char *body = NULL;
                json_t *req;
                bool retry, last = attempt + 1 == e2b->max_attempts;

                make_nonce(e2b, nonce);
                pthread_mutex_lock(&e2b->lock);
                snprintf(e2b->pending, sizeof(e2b->pending), "%s", nonce);
                pthread_mutex_unlock(&e2b->lock);
                req = create_request(e2b, nonce);
                body = req ? json_dumps(req, JSON_COMPACT) : NULL;
                json_decref(req);
                if (!body) {
                        set_error(
                            e2b, "could not create E2B sandbox: out of memory");
                        err = CQ_ERR_FATAL;
                        break;
                }
                snprintf(url, sizeof(url), "%s%s", e2b->api_url,
                         e2b->create_path);
                call.what = "create E2B sandbox";
                call.plane = PLANE_API;
                call.method = "POST";
                call.url = url;
                call.ctype = "application/json";
                call.body = body;
                call.body_len = strlen(body);
                call.ok = OK_201;
                call.attempts = 1;
                err = call_run(e2b, e2b->curl, &call);
                free(body);
                if (err == CQ_OK) {
                        e2b->lost = false;
                        err = adopt_sandbox(e2b, &call.reply);
                        cq_buf_release(&call.reply);
                        if (err != CQ_OK && e2b->sandbox_id[0]) {
                                char saved[sizeof(e2b->errbuf)];

                                memcpy(saved, e2b->errbuf, sizeof(saved));
                                (void)kill_sandbox(e2b, e2b->sandbox_id);
                                memcpy(e2b->errbuf, saved, sizeof(saved));
                                pthread_mutex_lock(&e2b->lock);
                                e2b->sandbox_id[0] = '\0';
                                pthread_mutex_unlock(&e2b->lock);
                        } else if (err == CQ_OK) {
                                pthread_mutex_lock(&e2b->lock);
                                snprintf(e2b->nonce, sizeof(e2b->nonce), "%s",
                                         nonce);
                                pthread_mutex_unlock(&e2b->lock);
                        }
                        break;
                }
                cq_buf_release(&call.reply);
                retry = err == CQ_ERR_RETRIABLE && call.should_retry != 0 &&
                        (call.status == 0 || call.status == 429 ||
                         call.status == 502 || call.status == 503 ||
                         call.status == 504 || call.should_retry == 1);
                if (maybe_created(&call, err)) {
                        char saved[sizeof(e2b->errbuf)];
                        int reaped;

                        memcpy(saved, e2b->errbuf, sizeof(saved));
                        reaped = reap_created(e2b, nonce);
                        if (reaped < 0) {
                                cq_log_error("e2b: %s; not creating another "
                                             "sandbox, the lost one may live "
                                             "until its TTL ends",
                                             e2b->errbuf);
                                retry = false;
                        }
                        memcpy(e2b->errbuf, saved, sizeof(saved));
                }
                if (!retry || last)
                        break;
                cq_log_warn("e2b: %s (attempt %d of %d)", e2b->errbuf,
                            attempt + 1, e2b->max_attempts);
                backoff_sleep(e2b, &e2b->rng, attempt, call.retry_after_s);
        }
        pthread_mutex_lock(&e2b->lock);
        e2b->pending[0] = '\0';
        pthread_mutex_unlock(&e2b->lock);
        return err;
}

/* Called with e2b->lock held. \p other: from cq_e2b_keepalive(), which
 * must not touch the owner's error buffer or jitter seed. */
static cq_err_t set_timeout_on(cq_e2b_t *e2b,
                               CURL *curl,
                               int timeout_s,
                               long *statusp,
                               char *errbuf,
                               size_t errbuf_size,
                               unsigned int *rng,
                               int attempts)
{
        struct call call = {0};
        char url[1024], body[64];
        cq_err_t err;

        snprintf(url, sizeof(url), "%s/sandboxes/%s/timeout", e2b->api_url,
                 e2b->sandbox_id);
        snprintf(body, sizeof(body), "{\"timeout\":%d}", timeout_s);
        call.what = "extend E2B sandbox lifetime";
        call.plane = PLANE_API;
        call.method = "POST";
        call.url = url;
        call.ctype = "application/json";
        call.body = body;
        call.body_len = strlen(body);
        call.ok = OK_204;
        call.errbuf = errbuf;
        call.errbuf_size = errbuf_size;
        call.rng = rng;
        call.attempts = attempts;
        if (!e2b->sandbox_id[0]) {
                call_error(e2b, &call, "could not %s: no sandbox", call.what);
                *statusp = 0;
                return CQ_ERR_RETRIABLE;
        }
        err = call_run(e2b, curl, &call);
        if (err == CQ_OK)
                e2b->expires_ms = cq_now_ms() + (int64_t)timeout_s * 1000;
        *statusp = call.status;
        cq_buf_release(&call.reply);
        return err;
}

/* Extend the TTL when a third of it has passed, or when the next cell's
 * deadline would outlast it. */
static cq_err_t maybe_extend(cq_e2b_t *e2b, int64_t cell_timeout_ms)
{
        int64_t ttl_ms = (int64_t)e2b->ttl_s * 1000;
        int64_t want_ms = ttl_ms + (cell_timeout_ms > 0 ? cell_timeout_ms : 0);
        int64_t left;
        long status = 0;
        cq_err_t err;

        pthread_mutex_lock(&e2b->lock);
        left = e2b->expires_ms - cq_now_ms();
        pthread_mutex_unlock(&e2b->lock);
        if (left >= want_ms - ttl_ms / 3)
                return CQ_OK;
        if (want_ms > (int64_t)e2b->max_timeout_s * 1000)
                want_ms = (int64_t)e2b->max_timeout_s * 1000;
        pthread_mutex_lock(&e2b->lock);
        err = set_timeout_on(e2b, e2b->curl, (int)((want_ms + 999) / 1000),
                             &status, NULL, 0, NULL, 0);
        pthread_mutex_unlock(&e2b->lock);
        if (status == 404) /* it expired: the caller starts another */
                e2b->lost = true;
        if (err != CQ_OK && status != 401 && status != 403 && !e2b->lost) {
                /* a failed extension is not a failed cell: the sandbox
                 * still has time left and the next cell tries again */
                cq_log_warn("e2b: %s; running the cell anyway", e2b->errbuf);
                e2b->errbuf[0] = '\0';
                return CQ_OK;
        }
        return err;
}

static cq_err_t
keepalive(cq_e2b_t *e2b, int attempts, char *errstr, size_t errstr_size)
{
        int64_t left_s;
        int timeout_s;
        cq_err_t err;
        CURL *curl = curl_easy_init();
        char buf[512] = "";
        long status = 0;
        unsigned int rng = (unsigned int)cq_now_ms();

        if (!curl) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not extend E2B sandbox lifetime: "
                                 "out of memory");
                return CQ_ERR_RETRIABLE;
        }
        /* the lock keeps the sandbox id and tokens stable against the owner
         * thread's recovery */
        pthread_mutex_lock(&e2b->lock);
        /* E2B sets the end to now + timeout, shortening too: never cut
         * what a running cell's deadline asked for */
        left_s = (e2b->expires_ms - cq_now_ms() + 999) / 1000;
        timeout_s = left_s > e2b->ttl_s ? (int)left_s : e2b->ttl_s;
        if (timeout_s > e2b->max_timeout_s)
                timeout_s = e2b->max_timeout_s;
        err = set_timeout_on(e2b, curl, timeout_s, &status, buf, sizeof(buf),
                             &rng, attempts);
        pthread_mutex_unlock(&e2b->lock);
        if (err != CQ_OK && errstr)
                snprintf(errstr, errstr_size, "%s", buf);
        curl_easy_cleanup(curl);
        return err;
}

cq_err_t cq_e2b_keepalive(cq_interp_t *interp, char *errstr, size_t errstr_size)
{
        return keepalive((cq_e2b_t *)interp, 0, errstr, errstr_size);
}

void cq_e2b_sandbox_id(cq_interp_t *interp, char *out, size_t out_size)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;

        pthread_mutex_lock(&e2b->lock);
        snprintf(out, out_size, "%s", e2b->sandbox_id);
        pthread_mutex_unlock(&e2b->lock);
}

/* ------------------------------------------------------------- contexts */

static cq_err_t create_context(cq_e2b_t *e2b)
{
        static const char body[] =
            "{\"language\":\"python\",\"cwd\":\"" HOME_DIR "\"}";
        struct call call = {0};
        char base[512], url[1024];
        json_t *doc = NULL;
        const char *id;
        cq_err_t err = CQ_ERR_RETRIABLE;

        if (dp_base(e2b, CI_PORT, base, sizeof(base)) != 0) {
                set_error(e2b, "could not create kernel context: URL too "
                               "long");
                return CQ_ERR_FATAL;
        }
        snprintf(url, sizeof(url), "%s/contexts", base);
        call.what = "create kernel context in E2B sandbox";
        call.plane = PLANE_CI_NOTOKEN;
        call.method = "POST";
        call.url = url;
        call.ctype = "application/json";
        call.body = body;
        call.body_len = sizeof(body) - 1;
        call.ok = OK_200;
        err = call_run(e2b, e2b->curl, &call);
        if (err != CQ_OK)
                goto out;
        doc = json_loadb(call.reply.data ? call.reply.data : "", call.reply.len,
                         0, NULL);
        id = json_string_value(json_object_get(doc, "id"));
        if (!id || strlen(id) >= ID_MAX ||
            strspn(id, "0123456789abcdef-") != strlen(id) || !*id) {
                set_error(e2b, "could not create kernel context in E2B "
                               "sandbox: reply has no valid id");
                err = CQ_ERR_RETRIABLE;
                goto out;
        }
        pthread_mutex_lock(&e2b->lock);
        snprintf(e2b->context_id, sizeof(e2b->context_id), "%s", id);
        pthread_mutex_unlock(&e2b->lock);
out:
        json_decref(doc);
        cq_buf_release(&call.reply);
        return err;
}

static cq_err_t restart_context(cq_e2b_t *e2b)
{
        struct call call = {0};
        char base[512], url[1024];
        cq_err_t err;

        if (dp_base(e2b, CI_PORT, base, sizeof(base)) != 0)
                return CQ_ERR_FATAL;
        snprintf(url, sizeof(url), "%s/contexts/%s/restart", base,
                 e2b->context_id);
        call.what = "restart kernel context in E2B sandbox";
        call.plane = PLANE_CI_NOTOKEN;
        call.method = "POST";
        call.url = url;
        call.ok = OK_200;
        err = call_run(e2b, e2b->curl, &call);
        if (err == CQ_ERR_FATAL && call.status == 404)
                err = create_context(e2b);
        cq_buf_release(&call.reply);
        return err;
}

/* ---------------------------------------------------------------- files */

static char *escape(cq_e2b_t *e2b, const char *s)
{
        char *tmp = curl_easy_escape(e2b->curl, s, 0);
        char *out = tmp ? strdup(tmp) : NULL;

        curl_free(tmp);
        return out;
}

static cq_err_t
upload(cq_e2b_t *e2b, const char *name, const void *data, size_t len)
{
        struct call call = {0};
        char base[512], url[2048], path[512];
        char *q = NULL;
        curl_mime *mime = NULL;
        curl_mimepart *part;
        cq_err_t err = CQ_ERR_RETRIABLE;

        snprintf(path, sizeof(path), HOME_DIR "/%s", name);
        q = escape(e2b, path);
        mime = curl_mime_init(e2b->curl);
        part = mime ? curl_mime_addpart(mime) : NULL;
        if (!q || !part || dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0 ||
            curl_mime_name(part, "file") != CURLE_OK ||
            curl_mime_filename(part, path) != CURLE_OK ||
            curl_mime_type(part, "application/octet-stream") != CURLE_OK ||
            curl_mime_data(part, data ? data : "", len) != CURLE_OK) {
                set_error(e2b,
                          "could not upload \"%s\" to E2B sandbox: out "
                          "of memory",
                          name);
                err = CQ_ERR_FATAL;
                goto out;
        }
        snprintf(url, sizeof(url), "%s/files?path=%s", base, q);
        call.what = "upload a file to E2B sandbox";
        call.plane = PLANE_ENVD;
        call.method = "POST";
        call.url = url;
        call.mime = mime;
        call.ok = OK_200;
        err = call_run(e2b, e2b->curl, &call);
out:
        cq_buf_release(&call.reply);
        curl_mime_free(mime);
        free(q);
        return err;
}

static cq_err_t e2b_put_file(cq_interp_t *interp,
                             const char *name,
                             const void *data,
                             size_t len)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        struct input_file *in = NULL, *grown;
        unsigned char *copy;
        size_t i;
        cq_err_t err;

        err = upload(e2b, name, data, len);
        if (err != CQ_OK)
                return err;
        /* keep a copy: a replacement sandbox gets it again, and
         * created_files() leaves inputs out */
        copy = malloc(len ? len : 1);
        if (!copy) {
                set_error(e2b, "could not keep \"%s\": out of memory", name);
                return CQ_ERR_FATAL;
        }
        if (len)
                memcpy(copy, data, len);
        for (i = 0; i < e2b->ninputs; i++)
                if (strcmp(e2b->inputs[i].name, name) == 0)
                        in = &e2b->inputs[i];
        if (!in) {
                grown =
                    realloc(e2b->inputs, (e2b->ninputs + 1) * sizeof(*grown));
                if (!grown || !(grown[e2b->ninputs].name = strdup(name))) {
                        if (grown)
                                e2b->inputs = grown;
                        free(copy);
                        set_error(e2b, "could not keep \"%s\": out of memory",
                                  name);
                        return CQ_ERR_FATAL;
                }
                e2b->inputs = grown;
                in = &e2b->inputs[e2b->ninputs++];
                in->data = NULL;
        }
        free(in->data);
        in->data = copy;
        in->len = len;
        return CQ_OK;
}

/* GET /files?path=HOME/name into \p buf (capped by its max). */
static cq_err_t
download(cq_e2b_t *e2b, const char *name, size_t max, cq_buf_t *out)
{
        static const long ok[] = {200, 0};
        struct call call = {0};
        char base[512], url[2048], path[512];
        char *q = NULL;
        cq_err_t err = CQ_ERR_FATAL;

        snprintf(path, sizeof(path), HOME_DIR "/%s", name);
        q = escape(e2b, path);
        if (!q || dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0) {
                set_error(e2b, "could not read \"%s\": out of memory", name);
                goto out;
        }
        snprintf(url, sizeof(url), "%s/files?path=%s", base, q);
        call.what = "read a file from E2B sandbox";
        call.plane = PLANE_ENVD;
        call.method = "GET";
        call.url = url;
        call.ok = ok;
        call.max_reply = max ? max : 1;
        err = call_run(e2b, e2b->curl, &call);
        if (err == CQ_ERR_TOO_LARGE)
                set_error(e2b, "could not read \"%s\": larger than %zu bytes",
                          name, max);
        else if (err == CQ_ERR_FATAL && call.status == 404)
                set_error(e2b, "could not read \"%s\": no such file", name);
        if (err == CQ_OK) {
                *out = call.reply;
                cq_buf_init(&call.reply, 0);
        }
out:
        cq_buf_release(&call.reply);
        free(q);
        return err;
}

static cq_err_t
e2b_get_file(cq_interp_t *interp, const char *name, size_t max, cq_file_t *file)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        cq_buf_t buf;
        cq_err_t err;

        memset(file, 0, sizeof(*file));
        cq_buf_init(&buf, 0);
        err = download(e2b, name, max, &buf);
        if (err != CQ_OK)
                return err;
        file->name = strdup(name);
        file->mime = strdup(cq_mime_from_name(name));
        file->data = (unsigned char *)cq_buf_take(&buf, &file->len);
        cq_buf_release(&buf);
        if (!file->name || !file->mime || !file->data) {
                free(file->name);
                free(file->mime);
                free(file->data);
                memset(file, 0, sizeof(*file));
                set_error(e2b, "could not read \"%s\": out of memory", name);
                return CQ_ERR_FATAL;
        }
        return CQ_OK;
}

/* Whether a listed path is ours to report: not hidden, not a cache. */
static bool rel_is_reported(const char *rel)
{
        const char *p = rel;

        if (!cq_relpath_is_safe(rel))
                return false;
        for (;;) {
                if (*p == '.' || strncmp(p, "__pycache__", 11) == 0)
                        return false;
                p = strchr(p, '/');
                if (!p)
                        return true;
                p++;
        }
}

/* ListDir HOME recursively into {relpath: "size|mtime"} (files only). */
static cq_err_t list_files(cq_e2b_t *e2b, json_t **listp)
{
        static const char body[] = "{\"path\":\"" HOME_DIR "\",\"depth\":32}";
        struct call call = {0};
        char base[512], url[1024];
        json_t *doc = NULL, *entries, *entry, *list = NULL;
        size_t i;
        cq_err_t err = CQ_ERR_RETRIABLE;

        if (dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0)
                return CQ_ERR_FATAL;
        snprintf(url, sizeof(url), "%s/filesystem.Filesystem/ListDir", base);
        call.what = "list files of E2B sandbox";
        call.plane = PLANE_ENVD;
        call.method = "POST";
        call.url = url;
        call.ctype = "application/json";
        call.body = body;
        call.body_len = sizeof(body) - 1;
        call.ok = OK_200;
        err = call_run(e2b, e2b->curl, &call);
        if (err != CQ_OK)
                goto out;
        err = CQ_ERR_FATAL;
        doc = json_loadb(call.reply.data ? call.reply.data : "", call.reply.len,
                         0, NULL);
        entries = json_object_get(doc, "entries");
        list = json_object();
        if (!list ||
            (!json_is_array(entries) && doc && json_object_size(doc) != 0)) {
                set_error(e2b, "could not list files of E2B sandbox: reply "
                               "has no entries array");
                goto out;
        }
        if (json_array_size(entries) > MAX_ENTRIES) {
                set_error(e2b,
                          "could not list files of E2B sandbox: more "
                          "than %d entries",
                          MAX_ENTRIES);
                goto out;
        }
        json_array_foreach(entries, i, entry)
        {
                const char *type =
                    json_string_value(json_object_get(entry, "type"));
                const char *path =
                    json_string_value(json_object_get(entry, "path"));
                const char *size =
                    json_string_value(json_object_get(entry, "size"));
                const char *mtime =
                    json_string_value(json_object_get(entry, "modifiedTime"));
                char sig[128];

                if (!type || !path || strcmp(type, "FILE_TYPE_FILE") != 0)
                        continue;
                if (strncmp(path, HOME_DIR "/", sizeof(HOME_DIR)) != 0)
                        continue;
                snprintf(sig, sizeof(sig), "%s|%s", size ? size : "?",
                         mtime ? mtime : "?");
                if (json_object_set_new(list, path + sizeof(HOME_DIR),
                                        json_string(sig)))
                        goto out;
        }
        *listp = list;
        list = NULL;
        err = CQ_OK;
out:
        json_decref(list);
        json_decref(doc);
        cq_buf_release(&call.reply);
        return err;
}

static bool is_input(const cq_e2b_t *e2b, const char *rel)
{
        size_t i;

        for (i = 0; i < e2b->ninputs; i++)
                if (strcmp(e2b->inputs[i].name, rel) == 0)
                        return true;
        return false;
}

static int cmp_file(const void *a, const void *b)
{
        return strcmp(((const cq_file_t *)a)->name,
                      ((const cq_file_t *)b)->name);
}

static cq_err_t
e2b_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        json_t *now = NULL, *sig;
        const char *rel;
        cq_files_t out = {NULL, 0};
        cq_err_t err;

        files->v = NULL;
        files->n = 0;
        err = list_files(e2b, &now);
        if (err != CQ_OK)
                goto out;
        out.v = calloc(json_object_size(now) + 1, sizeof(*out.v));
        if (!out.v) {
                err = CQ_ERR_FATAL;
                set_error(e2b, "could not list created files: out of memory");
                goto out;
        }
        json_object_foreach(now, rel, sig)
        {
                json_t *old = json_object_get(e2b->snapshot, rel);
                cq_file_t *file = &out.v[out.n];

                if (!rel_is_reported(rel) || is_input(e2b, rel) ||
                    (old && json_equal(old, sig)))
                        continue;
                file->name = strdup(rel);
                file->mime = strdup(cq_mime_from_name(rel));
                out.n++;
                if (!file->name || !file->mime) {
                        err = CQ_ERR_FATAL;
                        set_error(e2b, "could not list created files: out of "
                                       "memory");
                        goto out;
                }
                if (with_data) {
                        cq_buf_t buf;

                        cq_buf_init(&buf, 0);
                        err = download(e2b, rel, e2b->max_file, &buf);
                        if (err == CQ_ERR_TOO_LARGE) {
                                /* listed without data: too large to fetch */
                                cq_log_warn("e2b: %s", e2b->errbuf);
                                continue;
                        }
                        if (err != CQ_OK)
                                goto out;
                        file->data =
                            (unsigned char *)cq_buf_take(&buf, &file->len);
                        cq_buf_release(&buf);
                }
        }
        qsort(out.v, out.n, sizeof(*out.v), cmp_file);
        *files = out;
        out.v = NULL;
        out.n = 0;
        err = CQ_OK;
out:
        cq_files_release(&out);
        json_decref(now);
        return err;
}

/* --------------------------------------------------------- NDJSON lines */

static const struct {
        const char *field, *mime;
} mime_fields[] = {
    {"text", "text/plain"},        {"html", "text/html"},
    {"markdown", "text/markdown"}, {"svg", "image/svg+xml"},
    {"png", "image/png"},          {"jpeg", "image/jpeg"},
    {"pdf", "application/pdf"},    {"latex", "text/latex"},
    {"json", "application/json"},  {"javascript", "application/javascript"},
    {"data", "e2b/data"},          {"chart", "e2b/chart"},
};

CQ_PRINTF(3, 4)
static cq_err_t
line_error(char *errstr, size_t errstr_size, const char *fmt, ...)
{
        va_list ap;

        if (errstr && errstr_size) {
                va_start(ap, fmt);
                vsnprintf(errstr, errstr_size, fmt, ap);
                va_end(ap);
        }
        return CQ_ERR_FATAL;
}

/* \p tb (\p len bytes, NULs included) without colour codes, one string
 * per line. */
static json_t *split_traceback(const char *tb, size_t len)
{
        json_t *lines = json_array();
        char *clean;
        size_t clen, start = 0, i;

        if (!lines)
                return NULL;
        clean = cq_ansi_strip(tb, len, &clen);
        if (!clean) {
                json_decref(lines);
                return NULL;
        }
        for (i = 0; i <= clen; i++) {
                if (i < clen && clean[i] != '\n')
                        continue;
                if (i == clen && start == clen)
                        break; /* nothing after the last newline */
                if (json_array_append_new(
                        lines, json_stringn(clean + start, i - start))) {
                        json_decref(lines);
                        lines = NULL;
                        break;
                }
                start = i + 1;
        }
        free(clean);
        return lines;
}

/* text values may not hold invalid UTF-8 (jansson would refuse them) */
static json_t *result_output(json_t *doc, char *errstr, size_t errstr_size)
{
        json_t *data = json_object(), *out = NULL, *extra, *v;
        json_t *main_res = json_object_get(doc, "is_main_result");
        const char *key;
        size_t i;

        if (!data)
                goto fail;
        if (main_res && !json_is_boolean(main_res)) {
                line_error(errstr, errstr_size,
                           "result line: \"is_main_result\" is not a boolean");
                goto fail;
        }
        for (i = 0; i < CQ_ARRAY_SIZE(mime_fields); i++) {
                v = json_object_get(doc, mime_fields[i].field);
                if (!v || json_is_null(v))
                        continue;
                if (strcmp(mime_fields[i].field, "json") != 0 &&
                    strcmp(mime_fields[i].field, "data") != 0 &&
                    strcmp(mime_fields[i].field, "chart") != 0 &&
                    !json_is_string(v)) {
                        line_error(errstr, errstr_size,
                                   "result line: \"%s\" is not a string",
                                   mime_fields[i].field);
                        goto fail;
                }
                if (json_object_set(data, mime_fields[i].mime, v))
                        goto fail;
        }
        extra = json_object_get(doc, "extra");
        if (extra && !json_is_null(extra) && !json_is_object(extra)) {
                line_error(errstr, errstr_size,
                           "result line: \"extra\" is not an object");
                goto fail;
        }
        json_object_foreach(extra, key, v)
        {
                if (!json_object_get(data, key) &&
                    json_object_set(data, key, v))
                        goto fail;
        }
        out = json_pack("{s:s, s:o, s:{}}", "output_type",
                        json_is_true(main_res) ? "execute_result"
                                               : "display_data",
                        "data", data, "metadata");
        return out;
fail:
        if (errstr && errstr_size && !errstr[0])
                line_error(errstr, errstr_size, "out of memory");
        json_decref(data);
        return NULL;
}

cq_err_t cq_e2b_parse_line(const char *line,
                           size_t len,
                           cq_e2b_line_t *out,
                           char *errstr,
                           size_t errstr_size)
{
        json_error_t jerr;
        json_t *doc = NULL, *t;
        const char *type;
        cq_err_t err = CQ_ERR_FATAL;

        memset(out, 0, sizeof(*out));
        if (errstr && errstr_size)
                errstr[0] = '\0';
        /* Code may print any character, NUL included (a JSON "\u0000"):
         * it is output like any other. */
        doc = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                         &jerr);
        if (!doc) {
                line_error(errstr, errstr_size, "invalid JSON: %s", jerr.text);
                goto out;
        }
        if (!json_is_object(doc)) {
                line_error(errstr, errstr_size, "line is not a JSON object");
                goto out;
        }
        t = json_object_get(doc, "type");
        type = json_string_value(t);
        if (!type) {
                line_error(errstr, errstr_size,
                           "line has no string \"type\" field");
                goto out;
        }
        if (strcmp(type, "number_of_executions") == 0) {
                json_t *n = json_object_get(doc, "execution_count");

                if (!json_is_integer(n) || json_integer_value(n) < 0 ||
                    json_integer_value(n) > INT32_MAX) {
                        line_error(errstr, errstr_size,
                                   "number_of_executions line: "
                                   "\"execution_count\" is not a count");
                        goto out;
                }
                out->kind = CQ_E2B_LINE_COUNT;
                out->execution_count = (int)json_integer_value(n);
        } else if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
                json_t *text = json_object_get(doc, "text");

                if (!json_is_string(text)) {
                        line_error(errstr, errstr_size,
                                   "%s line: \"text\" is not a string", type);
                        goto out;
                }
                out->output = json_pack("{s:s, s:s, s:O}", "output_type",
                                        "stream", "name", type, "text", text);
                out->kind = CQ_E2B_LINE_OUTPUT;
        } else if (strcmp(type, "result") == 0) {
                out->output = result_output(doc, errstr, errstr_size);
                if (!out->output)
                        goto out;
                out->kind = CQ_E2B_LINE_OUTPUT;
        } else if (strcmp(type, "error") == 0) {
                json_t *name = json_object_get(doc, "name");
                json_t *value = json_object_get(doc, "value");
                json_t *tb = json_object_get(doc, "traceback");
                json_t *lines;

                if (!json_is_string(name) || !json_is_string(value) ||
                    (tb && !json_is_null(tb) && !json_is_string(tb))) {
                        line_error(errstr, errstr_size,
                                   "error line: \"name\", \"value\" or "
                                   "\"traceback\" is not a string");
                        goto out;
                }
                lines = split_traceback(
                    tb && json_is_string(tb) ? json_string_value(tb) : "",
                    tb && json_is_string(tb) ? json_string_length(tb) : 0);
                if (!lines)
                        goto oom;
                out->output = json_pack("{s:s, s:O, s:O, s:o}", "output_type",
                                        "error", "ename", name, "evalue", value,
                                        "traceback", lines);
                out->kind = CQ_E2B_LINE_OUTPUT;
        } else if (strcmp(type, "end_of_execution") == 0) {
                out->kind = CQ_E2B_LINE_END;
        } else {
                out->kind = CQ_E2B_LINE_IGNORED; /* keepalive and the new */
        }
        if (out->kind == CQ_E2B_LINE_OUTPUT && !out->output)
                goto oom;
        err = CQ_OK;
        goto out;
oom:
        line_error(errstr, errstr_size, "out of memory");
        memset(out, 0, sizeof(*out));
out:
        json_decref(doc);
        return err;
}

/* ------------------------------------------------------------- /execute */

enum outcome {
        OUT_END = 0,  /* end_of_execution seen */
        OUT_DEADLINE, /* client deadline */
        OUT_CANCEL,   /* cancel flag */
        OUT_INTERRUPT,
        OUT_TRUNCATED, /* the stream ended without end_of_execution */
        OUT_PROTOCOL,  /* malformed or over-long line */
        OUT_HTTP,      /* a non-200 status */
        OUT_NETWORK,   /* connection failed or reset */
};

struct exec {
        cq_e2b_t *e2b;
        const cq_exec_opts_t *opts;
        int64_t deadline_ms;
        cq_buf_t line;
        cq_buf_t errbody; /* non-200 reply */
        long status;
        bool end_seen;
        enum outcome outcome; /* set by the callbacks when they abort */
        bool aborted;
        char why[512];
        int execution_count;
        cq_collect_t col; /* outputs: head, tail, bytes dropped */
        bool col_ok;
        uint64_t skipped; /* bytes of the line over max_line being skipped */
        bool skipping;
        bool skipped_error;   /* that line is an "error" line */
        json_t *error;        /* the last error output */
        json_t *results;      /* execute_result outputs waiting for the count */
        bool default_context; /* run in the sandbox's default context */
};

static int exec_line(struct exec *x)
{
        cq_e2b_line_t line;
        char err[256];

        if (x->line.len == 0 || x->end_seen)
                return 0;
        if (cq_e2b_parse_line(x->line.data, x->line.len, &line, err,
                              sizeof(err)) != CQ_OK) {
                snprintf(x->why, sizeof(x->why),
                         "malformed line in the E2B /execute stream: %s", err);
                x->outcome = OUT_PROTOCOL;
                return -1;
        }
        switch (line.kind) {
        case CQ_E2B_LINE_COUNT:
                x->execution_count = line.execution_count;
                break;
        case CQ_E2B_LINE_END:
                x->end_seen = true;
                break;
        case CQ_E2B_LINE_IGNORED:
                break;
        case CQ_E2B_LINE_OUTPUT: {
                const char *t = json_string_value(
                    json_object_get(line.output, "output_type"));

                if (strcmp(t, "execute_result") == 0 && x->execution_count >= 0)
                        json_object_set_new(line.output, "execution_count",
                                            json_integer(x->execution_count));
                if (strcmp(t, "error") == 0) {
                        /* the last error wins; the caller reports it */
                        json_decref(x->error);
                        x->error = line.output;
                        return 0;
                }
                cq_collect_add(&x->col, &line.output);
                break;
        }
        }
        return 0;
}

static json_t *error_output(const char *ename, const char *evalue);

/* The end of a line that was over max_line: count it, and keep a trace of
 * an error line so the cell still fails. */
static void skip_done(struct exec *x)
{
        cq_log_warn("e2b: skipped a line of %llu bytes in the /execute "
                    "stream (over %zu)",
                    (unsigned long long)x->skipped, x->e2b->max_line);
        cq_collect_dropped(&x->col, x->skipped, false);
        if (x->skipped_error) {
                char evalue[256];

                snprintf(evalue, sizeof(evalue),
                         "the cell raised an exception whose report (%llu "
                         "bytes) exceeded the output cap and was dropped",
                         (unsigned long long)x->skipped);
                json_decref(x->error);
                x->error = error_output("OutputTooLarge", evalue);
        }
        x->skipping = x->skipped_error = false;
        x->skipped = 0;
}

static size_t exec_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
        struct exec *x = ud;
        size_t n = size * nmemb, off = 0;

        if (x->status == 0)
                curl_easy_getinfo(x->e2b->curl, CURLINFO_RESPONSE_CODE,
                                  &x->status);
        if (x->status != 200) {
                size_t room = cq_buf_room(&x->errbody);

                /* only the start of an error body is kept for messages */
                if (cq_buf_append(&x->errbody, ptr, n < room ? n : room) !=
                    CQ_OK)
                        return n;
                return n;
        }
        while (off < n) {
                const char *nl = memchr(ptr + off, '\n', n - off);
                size_t seg = nl ? (size_t)(nl - (ptr + off)) : n - off;

                /* A line over max_line (the output cap plus slack) holds an
                 * output that could not be kept whole: stop buffering it,
                 * count its bytes as dropped and go on with the cell. */
                if (!x->skipping &&
                    cq_buf_append(&x->line, ptr + off, seg) != CQ_OK) {
                        size_t head = x->line.len < 64 ? x->line.len : 64;

                        /* the server writes "type" first */
                        x->skipping = true;
                        x->skipped_error =
                            head &&
                            memmem(x->line.data, head, "\"error\"", 7) != NULL;
                        x->skipped = x->line.len;
                        cq_buf_reset(&x->line);
                }
                if (x->skipping)
                        x->skipped += seg;
                off += seg;
                if (!nl)
                        break;
                off++;
                if (x->skipping) {
                        skip_done(x);
                        continue;
                }
                if (exec_line(x) != 0) {
                        x->aborted = true;
                        return 0;
                }
                cq_buf_reset(&x->line);
        }
        return n;
}

/* A cell without a deadline (or a longer one than the TTL) must not
 * outlive its sandbox: extend on the side handle once two thirds of the
 * TTL have passed. One attempt; the next progress tick tries again. */
static void extend_during_cell(cq_e2b_t *e2b)
{
        int64_t now = cq_now_ms(), left;
        char buf[512];
        long status = 0;

        if (now < e2b->next_extend_try_ms)
                return;
        pthread_mutex_lock(&e2b->lock);
        left = e2b->expires_ms - now;
        if (left < (int64_t)e2b->ttl_s * 1000 / 3 && e2b->aux) {
                e2b->next_extend_try_ms = now + 1000;
                if (set_timeout_on(e2b, e2b->aux, e2b->ttl_s, &status, buf,
                                   sizeof(buf), &e2b->rng, 1) != CQ_OK)
                        cq_log_warn("e2b: %s", buf);
        }
        pthread_mutex_unlock(&e2b->lock);
}

static int exec_progress(
    void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
        struct exec *x = ud;

        (void)dt;
        (void)dn;
        (void)ut;
        (void)un;
        if (x->opts->cancel && atomic_load(x->opts->cancel)) {
                x->outcome = OUT_CANCEL;
                x->aborted = true;
                return 1;
        }
        if (atomic_exchange(&x->e2b->interrupt, 0)) {
                x->outcome = OUT_INTERRUPT;
                x->aborted = true;
                return 1;
        }
        if (x->deadline_ms > 0 && cq_now_ms() >= x->deadline_ms) {
                x->outcome = OUT_DEADLINE;
                x->aborted = true;
                return 1;
        }
        extend_during_cell(x->e2b);
        return 0;
}

/* One POST /execute; fills x->outcome. */
static void exec_run(struct exec *x, const char *code)
{
        cq_e2b_t *e2b = x->e2b;
        char base[512], url[1024];
        struct curl_slist *headers = NULL;
        json_t *req = NULL;
        char *body = NULL;
        CURLcode rc;

        req = x->default_context ? json_pack("{s:s}", "code", code)
                                 : json_pack("{s:s, s:s}", "code", code,
                                             "context_id", e2b->context_id);
        body = req ? json_dumps(req, JSON_COMPACT) : NULL;
        headers = body ? make_headers(e2b, PLANE_CI, "application/json") : NULL;
        if (!headers || dp_base(e2b, CI_PORT, base, sizeof(base)) != 0) {
                snprintf(x->why, sizeof(x->why),
                         "could not build the /execute request (code not "
                         "UTF-8, or out of memory)");
                x->outcome = OUT_HTTP;
                x->status = 400;
                goto out;
        }
        snprintf(url, sizeof(url), "%s/execute", base);
        curl_common(e2b->curl, 0);
        curl_easy_setopt(e2b->curl, CURLOPT_URL, url);
        curl_easy_setopt(e2b->curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(e2b->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e2b->curl, CURLOPT_POSTFIELDSIZE_LARGE,
                         (curl_off_t)strlen(body));
        curl_easy_setopt(e2b->curl, CURLOPT_WRITEFUNCTION, exec_write);
        curl_easy_setopt(e2b->curl, CURLOPT_WRITEDATA, x);
        curl_easy_setopt(e2b->curl, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e2b->curl, CURLOPT_XFERINFOFUNCTION, exec_progress);
        curl_easy_setopt(e2b->curl, CURLOPT_XFERINFODATA, x);
        rc = curl_easy_perform(e2b->curl);
        if (x->aborted)
                goto out;
        if (rc != CURLE_OK && x->status == 0) {
                snprintf(x->why, sizeof(x->why),
                         "the /execute request failed: %s",
                         curl_easy_strerror(rc));
                x->outcome = OUT_NETWORK;
                goto out;
        }
        if (x->status == 0)
                curl_easy_getinfo(e2b->curl, CURLINFO_RESPONSE_CODE,
                                  &x->status);
        if (x->status != 200) {
                char reason[256];

                reply_reason(&x->errbody, reason, sizeof(reason));
                snprintf(x->why, sizeof(x->why),
                         "/execute returned HTTP %ld: %s", x->status, reason);
                x->outcome = OUT_HTTP;
                goto out;
        }
        /* a last line without '\n' */
        if (x->skipping)
                skip_done(x);
        if (!x->end_seen && x->line.len > 0 && exec_line(x) != 0)
                goto out;
        if (!x->end_seen) {
                snprintf(x->why, sizeof(x->why),
                         "the E2B /execute stream ended without "
                         "end_of_execution (%s)",
                         rc == CURLE_OK ? "connection closed"
                                        : curl_easy_strerror(rc));
                x->outcome = OUT_TRUNCATED;
                goto out;
        }
        x->outcome = OUT_END;
out:
        curl_slist_free_all(headers);
        json_decref(req);
        free(body);
}

static void exec_init(struct exec *x, cq_e2b_t *e2b, const cq_exec_opts_t *opts)
{
        memset(x, 0, sizeof(*x));
        x->e2b = e2b;
        x->opts = opts;
        x->execution_count = -1;
        cq_buf_init(&x->line, e2b->max_line);
        cq_buf_init(&x->errbody, MAX_ERR_BODY);
        x->col_ok = cq_collect_init(&x->col, e2b->max_output, opts->on_output,
                                    opts->opaque) == 0;
}

static void exec_release(struct exec *x)
{
        cq_buf_release(&x->line);
        cq_buf_release(&x->errbody);
        cq_collect_release(&x->col);
        json_decref(x->error);
}

/* Is the sandbox still there? envd /health answers 204 unless it is gone
 * (the proxy answers 502). */
static bool sandbox_alive(cq_e2b_t *e2b)
{
        static const long ok[] = {200, 204, 0};
        struct call call = {0};
        char base[512], url[1024];
        cq_err_t err;

        if (e2b->lost)
                return false;
        if (dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0)
                return false;
        snprintf(url, sizeof(url), "%s/health", base);
        call.what = "check E2B sandbox health";
        call.plane = PLANE_ENVD;
        call.method = "GET";
        call.url = url;
        call.ok = ok;
        call.attempts = 2;
        err = call_run(e2b, e2b->curl, &call);
        cq_buf_release(&call.reply);
        return err == CQ_OK;
}

static cq_err_t upload_inputs(cq_e2b_t *e2b)
{
        size_t i;
        cq_err_t err;

        for (i = 0; i < e2b->ninputs; i++) {
                err = upload(e2b, e2b->inputs[i].name, e2b->inputs[i].data,
                             e2b->inputs[i].len);
                if (err != CQ_OK)
                        return err;
        }
        return CQ_OK;
}

/* A fresh sandbox with its context and snapshot. On failure no new sandbox
 * is left behind. */
static cq_err_t start_sandbox(cq_e2b_t *e2b)
{
        cq_err_t err;
        json_t *snap = NULL;

        err = create_sandbox(e2b);
        if (err != CQ_OK)
                return err;
        err = create_context(e2b);
        if (err == CQ_OK)
                err = list_files(e2b, &snap);
        if (err != CQ_OK) {
                char saved[sizeof(e2b->errbuf)];

                memcpy(saved, e2b->errbuf, sizeof(saved));
                (void)kill_sandbox(e2b, e2b->sandbox_id);
                memcpy(e2b->errbuf, saved, sizeof(saved));
                pthread_mutex_lock(&e2b->lock);
                e2b->sandbox_id[0] = '\0';
                pthread_mutex_unlock(&e2b->lock);
                return err;
        }
        json_decref(e2b->snapshot);
        e2b->snapshot = snap;
        return CQ_OK;
}

/* Replace a lost or broken sandbox: kill it (best effort), start another,
 * upload the job files again. */
static cq_err_t replace_sandbox(cq_e2b_t *e2b)
{
        cq_err_t err;

        if (e2b->sandbox_id[0]) {
                (void)kill_sandbox(e2b, e2b->sandbox_id);
                pthread_mutex_lock(&e2b->lock);
                e2b->sandbox_id[0] = '\0';
                pthread_mutex_unlock(&e2b->lock);
        }
        err = start_sandbox(e2b);
        if (err == CQ_OK)
                err = upload_inputs(e2b);
        if (err != CQ_OK) {
                cq_log_error("e2b: could not replace the lost sandbox: %s",
                             e2b->errbuf);
                return err;
        }
        cq_log_warn("e2b: replaced the lost sandbox with %s", e2b->sandbox_id);
        return CQ_OK;
}

/* After a broken stream: restart the context when the sandbox lives,
 * else replace the sandbox. Sets *replacedp. */
static cq_err_t recover(cq_e2b_t *e2b, bool *replacedp)
{
        *replacedp = false;
        if (sandbox_alive(e2b) && restart_context(e2b) == CQ_OK)
                return CQ_OK;
        *replacedp = true;
        return replace_sandbox(e2b);
}

static json_t *error_output(const char *ename, const char *evalue)
{
        return json_pack("{s:s, s:s, s:s, s:[s]}", "output_type", "error",
                         "ename", ename, "evalue", evalue, "traceback", evalue);
}

/* Run "pass" with a short deadline: does the context answer after an
 * aborted cell? */
static bool context_answers(cq_e2b_t *e2b)
{
        static const cq_exec_opts_t probe_opts = {0};
        struct exec x;
        bool ok;

        exec_init(&x, e2b, &probe_opts);
        x.deadline_ms = cq_now_ms() + e2b->probe_timeout_ms;
        exec_run(&x, "pass");
        ok = x.outcome == OUT_END;
        exec_release(&x);
        return ok;
}

/* The server said ExecutionAborted and nothing else: the kernel refused
 * the request without running any of it. */
static bool never_ran(const struct exec *x)
{
        const char *ename =
            json_string_value(json_object_get(x->error, "ename"));

        return x->outcome == OUT_END && ename &&
               strcmp(ename, "ExecutionAborted") == 0 &&
               json_array_size(x->col.head) == 0 &&
               json_array_size(x->col.tail) == 0 && x->col.dropped == 0;
}

static cq_err_t e2b_execute(cq_interp_t *interp,
                            const char *code,
                            const cq_exec_opts_t *opts,
                            cq_cell_result_t *res)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        int64_t start = cq_now_ms();
        struct exec x;
        json_t *extra_err = NULL;
        cq_err_t err = CQ_OK;
        bool replaced = false;
        char evalue[768];

        exec_init(&x, e2b, opts);
        e2b->errbuf[0] = '\0';
        if (!x.col_ok) {
                set_error(e2b, "could not run cell: out of memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        if (!e2b->sandbox_id[0] || e2b->lost) {
                /* an earlier recovery failed, or a call saw a 502 */
                err = replace_sandbox(e2b);
                if (err != CQ_OK)
                        goto out;
                res->state_lost = true;
        }
        err = maybe_extend(e2b, opts->timeout_ms);
        if (err != CQ_OK && !e2b->lost) /* 401/403 */
                goto out;
        if (err != CQ_OK) {
                /* 404: the sandbox already expired; start again */
                err = replace_sandbox(e2b);
                if (err != CQ_OK)
                        goto out;
                res->state_lost = true;
        }
        if (res->state_lost) {
                /* tell the reader why earlier variables are missing */
                static const char note[] =
                    "[the E2B sandbox was lost before this cell and was "
                    "replaced with a fresh one holding the job files; "
                    "variables from earlier cells are gone]\n";
                json_t *o = json_pack("{s:s, s:s, s:s}", "output_type",
                                      "stream", "name", "stderr", "text", note);

                if (!o) {
                        set_error(e2b, "could not run cell: out of memory");
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                cq_collect_add(&x.col, &o);
        }
        if (opts->timeout_ms > 0)
                x.deadline_ms = start + opts->timeout_ms;
        atomic_store(&e2b->interrupt, 0);
        exec_run(&x, code);
        if (never_ran(&x)) {
                /* ipykernel aborts a request that arrives while it still
                 * unwinds the previous failed cell; the code did not run,
                 * so run it again once */
                struct timespec ts = {0, 200000000L};

                cq_log_info("e2b: execution aborted before it started; "
                            "running the cell again");
                nanosleep(&ts, NULL);
                exec_release(&x);
                exec_init(&x, e2b, opts);
                if (!x.col_ok) {
                        set_error(e2b, "could not run cell: out of memory");
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                if (opts->timeout_ms > 0)
                        x.deadline_ms = start + opts->timeout_ms;
                exec_run(&x, code);
        }
        res->status = x.error ? CQ_CELL_ERROR : CQ_CELL_OK;
        switch (x.outcome) {
        case OUT_END:
                break;
        case OUT_DEADLINE:
                res->status = CQ_CELL_TIMEOUT;
                snprintf(evalue, sizeof(evalue),
                         "the cell did not finish within %lld ms and was "
                         "interrupted",
                         (long long)opts->timeout_ms);
                if (!context_answers(e2b)) {
                        err = recover(e2b, &replaced);
                        if (err != CQ_OK)
                                goto out;
                        res->state_lost = true;
                        snprintf(evalue + strlen(evalue),
                                 sizeof(evalue) - strlen(evalue),
                                 "; the kernel did not answer afterwards and "
                                 "was restarted (variables are gone)");
                }
                extra_err = error_output("TimeoutError", evalue);
                break;
        case OUT_CANCEL:
                res->status = CQ_CELL_CANCELLED;
                break;
        case OUT_INTERRUPT:
                res->status = CQ_CELL_ERROR;
                extra_err = error_output("KeyboardInterrupt",
                                         "the cell was interrupted");
                break;
        case OUT_HTTP:
                if (x.status == 401 || x.status == 403) {
                        set_error(e2b, "could not run cell: %s", x.why);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                if (x.status != 502 && x.status != 404) {
                        set_error(e2b, "could not run cell: %s", x.why);
                        err = x.status == 400 || x.status == 422
                                  ? CQ_ERR_FATAL
                                  : CQ_ERR_RETRIABLE;
                        goto out;
                }
                if (x.status == 502)
                        e2b->lost = true;
                /* fall through - 502: sandbox lost, 404: context lost */
        case OUT_TRUNCATED:
        case OUT_PROTOCOL:
        case OUT_NETWORK:
                cq_log_warn("e2b: sandbox %s: %s", e2b->sandbox_id, x.why);
                err = recover(e2b, &replaced);
                if (err != CQ_OK) {
                        char saved[sizeof(e2b->errbuf)];

                        memcpy(saved, e2b->errbuf, sizeof(saved));
                        set_error(e2b,
                                  "could not run cell: %s; recovery "
                                  "failed: %s",
                                  x.why, saved);
                        goto out;
                }
                res->status = CQ_CELL_DIED;
                res->state_lost = true;
                snprintf(evalue, sizeof(evalue), "%s; %s", x.why,
                         replaced ? "the sandbox was lost and a fresh one "
                                    "was started with the job files "
                                    "(variables and files the code wrote "
                                    "are gone)"
                                  : "the kernel was restarted (variables "
                                    "are gone)");
                set_error(e2b, "%s", evalue);
                extra_err = error_output(
                    replaced ? "SandboxLost" : "KernelRestarted", evalue);
                break;
        }
        if (extra_err) {
                json_decref(x.error);
                x.error = extra_err;
                extra_err = NULL;
        }
        /* the error comes last, counted like any output */
        cq_collect_add(&x.col, &x.error);
        res->outputs = cq_collect_finish(&x.col);
        if (!res->outputs) {
                set_error(e2b, "could not collect cell outputs: out of "
                               "memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        res->truncated = cq_collect_truncated(&x.col);
        res->execution_count = x.execution_count;
        err = CQ_OK;
out:
        res->duration_ms = cq_now_ms() - start;
        json_decref(extra_err);
        exec_release(&x);
        return err;
}

static int e2b_interrupt(cq_interp_t *interp)
{
        atomic_store(&((cq_e2b_t *)interp)->interrupt, 1);
        return 0;
}

static cq_err_t e2b_restart(cq_interp_t *interp)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        bool replaced;

        if (!e2b->sandbox_id[0] || e2b->lost)
                return replace_sandbox(e2b);
        if (restart_context(e2b) == CQ_OK)
                return CQ_OK;
        return recover(e2b, &replaced);
}

static void fleet_leave(cq_e2b_t *e2b);

static void e2b_destroy(cq_interp_t *interp)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        size_t i;

        fleet_leave(e2b);
        if (e2b->sandbox_id[0] && e2b->curl)
                (void)kill_sandbox(e2b, e2b->sandbox_id);
        if (e2b->curl)
                curl_easy_cleanup(e2b->curl);
        if (e2b->aux)
                curl_easy_cleanup(e2b->aux);
        for (i = 0; i < e2b->ninputs; i++) {
                free(e2b->inputs[i].name);
                free(e2b->inputs[i].data);
        }
        free(e2b->inputs);
        json_decref(e2b->snapshot);
        json_decref(e2b->env);
        free(e2b->api_key);
        free(e2b->domain);
        free(e2b->api_url);
        free(e2b->sandbox_url);
        free(e2b->template_id);
        free(e2b->create_path);
        free(e2b->sandbox_domain);
        free(e2b->tag_job);
        free(e2b->tag_worker);
        pthread_mutex_destroy(&e2b->lock);
        free(e2b);
}

/* The environment, from the sandbox's default Python context: the job's
 * code runs in a context of its own, so it cannot change what this one
 * imported. Probed once, on the first call; a failure leaves it unknown. */
static const json_t *e2b_env(cq_interp_t *interp)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        cq_exec_opts_t eo = {0};
        struct exec x;
        json_t *outputs;
        char marker[64], nonce[NONCE_LEN + 1], *probe;

        if (e2b->env_probed || !e2b->sandbox_id[0] || e2b->lost)
                return e2b->env;
        e2b->env_probed = true;
        make_nonce(e2b, nonce);
        snprintf(marker, sizeof(marker), "coderq-env %s ", nonce);
        probe = cq_interp_env_probe(marker);
        if (!probe)
                return NULL;
        exec_init(&x, e2b, &eo);
        x.default_context = true;
        x.deadline_ms = cq_now_ms() + e2b->probe_timeout_ms;
        if (x.col_ok)
                exec_run(&x, probe);
        if (x.col_ok && x.outcome == OUT_END) {
                outputs = cq_collect_finish(&x.col);
                e2b->env = cq_interp_env_parse(outputs, marker);
                json_decref(outputs);
        }
        if (!e2b->env)
                cq_log_warn("e2b: sandbox %s did not report its Python "
                            "environment%s%s",
                            e2b->sandbox_id, x.why[0] ? ": " : "", x.why);
        exec_release(&x);
        free(probe);
        return e2b->env;
}

static const cq_interp_ops_t e2b_ops = {
    .name = "e2b",
    .put_file = e2b_put_file,
    .execute = e2b_execute,
    .interrupt = e2b_interrupt,
    .restart = e2b_restart,
    .created_files = e2b_created_files,
    .get_file = e2b_get_file,
    .errmsg = e2b_errmsg,
    .destroy = e2b_destroy,
    .env = e2b_env,
};

/* ------------------------------------------------------------ lifecycle */

void cq_e2b_opts_from_config(cq_e2b_opts_t *opts, const cq_config_t *cfg)
{
        memset(opts, 0, sizeof(*opts));
        opts->api_key = cfg->e2b_api_key;
        opts->domain = cfg->e2b_domain;
        opts->api_url = cfg->e2b_api_url;
        opts->sandbox_url = cfg->e2b_sandbox_url;
        opts->template_id = cfg->e2b_template;
        opts->create_path = cfg->e2b_create_path;
        opts->ttl_s = (int)cfg->e2b_ttl_s;
        opts->max_timeout_s = (int)cfg->e2b_max_timeout_s;
        opts->worker_id = cfg->worker_id;
}

static char *dup_or(const char *s, const char *def)
{
        return strdup(s && *s ? s : def);
}

/* A handle with the settings and curl handles, no sandbox yet; NULL with
 * *errp CQ_ERR_FATAL when the settings can never work, CQ_ERR_RETRIABLE
 * when out of memory. */
static cq_e2b_t *handle_new(const cq_e2b_opts_t *opts,
                            cq_err_t *errp,
                            char *errstr,
                            size_t errstr_size)
{
        cq_e2b_t *e2b = NULL;
        char api_url[512];
        size_t n;

        *errp = CQ_ERR_RETRIABLE;
        if (!opts->api_key || !*opts->api_key) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not create E2B sandbox: E2B_API_KEY "
                                 "is not set");
                *errp = CQ_ERR_FATAL;
                return NULL;
        }
        e2b = calloc(1, sizeof(*e2b));
        if (!e2b)
                goto oom;
        pthread_mutex_init(&e2b->lock, NULL);
        e2b->base.ops = &e2b_ops;
        e2b->api_key = strdup(opts->api_key);
        e2b->domain = dup_or(opts->domain, DEF_DOMAIN);
        if (!e2b->api_key || !e2b->domain)
                goto oom_free;
        snprintf(api_url, sizeof(api_url), "https://api.%s", e2b->domain);
        e2b->api_url = dup_or(opts->api_url, api_url);
        e2b->sandbox_url = opts->sandbox_url && *opts->sandbox_url
                               ? strdup(opts->sandbox_url)
                               : NULL;
        e2b->template_id = dup_or(opts->template_id, DEF_TEMPLATE);
        e2b->create_path = dup_or(opts->create_path, DEF_CREATE);
        if (!e2b->api_url || !e2b->template_id || !e2b->create_path ||
            (opts->sandbox_url && *opts->sandbox_url && !e2b->sandbox_url))
                goto oom_free;
        n = strlen(e2b->api_url);
        if (n > 0 && e2b->api_url[n - 1] == '/')
                e2b->api_url[n - 1] = '\0';
        e2b->ttl_s = opts->ttl_s > 0 ? opts->ttl_s : 300;
        e2b->max_output = opts->max_output ? opts->max_output : 1u << 20;
        e2b->max_line = opts->max_line ? opts->max_line
                                       : e2b->max_output + CQ_COLLECT_SLACK;
        e2b->max_body = opts->max_body ? opts->max_body : 16u << 20;
        e2b->max_file = opts->max_file ? opts->max_file : 64u << 20;
        e2b->max_attempts = opts->max_attempts > 0 ? opts->max_attempts : 5;
        e2b->retry_base_ms =
            opts->retry_base_ms > 0 ? opts->retry_base_ms : 250;
        e2b->retry_max_ms = opts->retry_max_ms > 0 ? opts->retry_max_ms : 10000;
        e2b->request_timeout_ms =
            opts->request_timeout_ms > 0 ? opts->request_timeout_ms : 60000;
        e2b->probe_timeout_ms =
            opts->probe_timeout_ms > 0 ? opts->probe_timeout_ms : 15000;
        e2b->rng = (unsigned int)cq_now_ms() ^ (unsigned int)(uintptr_t)e2b;
        atomic_init(&e2b->interrupt, 0);
        e2b->curl = curl_easy_init();
        e2b->aux = curl_easy_init();
        e2b->max_timeout_s =
            opts->max_timeout_s > 0 ? opts->max_timeout_s : 3600;
        if (e2b->ttl_s > e2b->max_timeout_s)
                e2b->ttl_s = e2b->max_timeout_s;
        e2b->tag_attempt = opts->attempt;
        e2b->tag_job = opts->job_id ? strdup(opts->job_id) : NULL;
        e2b->tag_worker = opts->worker_id ? strdup(opts->worker_id) : NULL;
        if (!e2b->curl || !e2b->aux || (opts->job_id && !e2b->tag_job) ||
            (opts->worker_id && !e2b->tag_worker))
                goto oom_free;
        return e2b;
oom_free:
        e2b_destroy(&e2b->base);
oom:
        if (errstr)
                snprintf(errstr, errstr_size,
                         "could not create E2B sandbox: out of memory");
        return NULL;
}

static void fleet_join(cq_e2b_fleet_t *fleet, cq_e2b_t *e2b)
{
        pthread_mutex_lock(&fleet->lock);
        e2b->fleet = fleet;
        e2b->fleet_next = fleet->members;
        fleet->members = e2b;
        pthread_mutex_unlock(&fleet->lock);
}

/* Leave the fleet once housekeeping is done with this handle. */
static void fleet_leave(cq_e2b_t *e2b)
{
        cq_e2b_fleet_t *fleet = e2b->fleet;
        cq_e2b_t **pp;

        if (!fleet)
                return;
        pthread_mutex_lock(&fleet->lock);
        while (e2b->fleet_refs > 0)
                pthread_cond_wait(&fleet->cond, &fleet->lock);
        for (pp = &fleet->members; *pp; pp = &(*pp)->fleet_next)
                if (*pp == e2b) {
                        *pp = e2b->fleet_next;
                        break;
                }
        e2b->fleet = NULL;
        pthread_mutex_unlock(&fleet->lock);
}

cq_err_t cq_e2b_create(const cq_e2b_opts_t *opts,
                       cq_interp_t **interpp,
                       char *errstr,
                       size_t errstr_size)
{
        cq_err_t err = CQ_ERR_RETRIABLE;
        cq_e2b_t *e2b = handle_new(opts, &err, errstr, errstr_size);

        *interpp = NULL;
        if (!e2b)
                return err;
        /* joined before the create goes out, so that housekeeping sees
         * the pending create's tag and leaves that sandbox alone */
        if (opts->fleet)
                fleet_join(opts->fleet, e2b);
        err = start_sandbox(e2b);
        if (err != CQ_OK) {
                if (errstr)
                        snprintf(errstr, errstr_size, "%s", e2b->errbuf);
                e2b_destroy(&e2b->base);
                return err;
        }
        cq_log_info("e2b: sandbox %s created from template %s", e2b->sandbox_id,
                    e2b->template_id);
        *interpp = &e2b->base;
        return CQ_OK;
}

cq_interp_t *
cq_e2b_new(const cq_e2b_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_interp_t *interp = NULL;

        if (cq_e2b_create(opts, &interp, errstr, errstr_size) != CQ_OK)
                return NULL;
        return interp;
}

/* ---------------------------------------------------------------- fleet */

cq_e2b_fleet_t *
cq_e2b_fleet_new(const cq_e2b_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_e2b_fleet_t *fleet;
        cq_err_t err;

        if (!opts->worker_id || !*opts->worker_id) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not track E2B sandboxes: no worker id");
                return NULL;
        }
        fleet = calloc(1, sizeof(*fleet));
        if (!fleet) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not track E2B sandboxes: out of "
                                 "memory");
                return NULL;
        }
        pthread_mutex_init(&fleet->lock, NULL);
        pthread_cond_init(&fleet->cond, NULL);
        fleet->api = handle_new(opts, &err, errstr, errstr_size);
        if (!fleet->api) {
                cq_e2b_fleet_destroy(&fleet);
                return NULL;
        }
        return fleet;
}

void cq_e2b_fleet_destroy(cq_e2b_fleet_t **fleetp)
{
        cq_e2b_fleet_t *fleet = *fleetp;

        if (!fleet)
                return;
        *fleetp = NULL;
        assert(!fleet->members);
        if (fleet->api)
                e2b_destroy(&fleet->api->base);
        pthread_cond_destroy(&fleet->cond);
        pthread_mutex_destroy(&fleet->lock);
        free(fleet);
}

/* The members, each with a reference so that none leaves meanwhile;
 * release with fleet_put(). */
static cq_e2b_t **fleet_get(cq_e2b_fleet_t *fleet, size_t *np)
{
        cq_e2b_t **v = NULL, *m;
        size_t n = 0, i = 0;

        pthread_mutex_lock(&fleet->lock);
        for (m = fleet->members; m; m = m->fleet_next)
                n++;
        v = calloc(n ? n : 1, sizeof(*v));
        for (m = fleet->members; v && m; m = m->fleet_next) {
                m->fleet_refs++;
                v[i++] = m;
        }
        pthread_mutex_unlock(&fleet->lock);
        *np = v ? n : 0;
        return v;
}

static void fleet_put(cq_e2b_fleet_t *fleet, cq_e2b_t **v, size_t n)
{
        size_t i;

        pthread_mutex_lock(&fleet->lock);
        for (i = 0; i < n; i++)
                v[i]->fleet_refs--;
        pthread_cond_broadcast(&fleet->cond);
        pthread_mutex_unlock(&fleet->lock);
        free(v);
}

int cq_e2b_fleet_keepalive(cq_e2b_fleet_t *fleet, bool force)
{
        size_t n = 0, i;
        cq_e2b_t **v = fleet_get(fleet, &n);
        int extended = 0;

        if (!v)
                return -1;
        for (i = 0; i < n; i++) {
                cq_e2b_t *e2b = v[i];
                char errstr[512];
                bool due;

                pthread_mutex_lock(&e2b->lock);
                due = e2b->sandbox_id[0] &&
                      (force || e2b->expires_ms - cq_now_ms() <
                                    (int64_t)e2b->ttl_s * 1000 * 2 / 3);
                pthread_mutex_unlock(&e2b->lock);
                if (!due)
                        continue;
                /* one attempt: housekeeping has other work, and comes back
                 * long before the TTL ends */
                if (keepalive(e2b, 1, errstr, sizeof(errstr)) == CQ_OK)
                        extended++;
                else
                        cq_log_warn("e2b: %s", errstr);
        }
        fleet_put(fleet, v, n);
        return extended;
}

/* Is \p id, or its create tag, one a member holds or is making? */
static bool fleet_owns(cq_e2b_fleet_t *fleet, const char *id)
{
        size_t n = 0, i;
        cq_e2b_t **v = fleet_get(fleet, &n);
        bool owned = !v; /* out of memory: kill nothing */

        for (i = 0; v && i < n && !owned; i++) {
                pthread_mutex_lock(&v[i]->lock);
                owned = strcmp(v[i]->sandbox_id, id) == 0 || v[i]->pending[0];
                pthread_mutex_unlock(&v[i]->lock);
        }
        if (v)
                fleet_put(fleet, v, n);
        return owned;
}

int cq_e2b_fleet_reconcile(cq_e2b_fleet_t *fleet,
                           char *errstr,
                           size_t errstr_size)
{
        cq_e2b_t *api = fleet->api;
        json_t *ids = NULL;
        size_t i;
        int killed = 0;

        if (list_tagged(api, TAG_WORKER, api->tag_worker, &ids) != CQ_OK) {
                if (errstr)
                        snprintf(errstr, errstr_size, "%s", api->errbuf);
                return -1;
        }
        for (i = 0; i < json_array_size(ids); i++) {
                const char *id = json_string_value(json_array_get(ids, i));

                /* While any member is creating, its sandbox may be listed
                 * before its reply arrives: leave everything to the next
                 * round rather than kill a sandbox being handed out. */
                if (fleet_owns(fleet, id))
                        continue;
                cq_log_warn("e2b: killing stray sandbox %s of this worker", id);
                if (kill_sandbox(api, id) == CQ_OK)
                        killed++;
        }
        json_decref(ids);
        return killed;
}
