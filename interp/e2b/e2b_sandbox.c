/* SPDX-License-Identifier: MIT */
/* e2b_sandbox.c - a sandbox's life on the control plane: create (tagged,
 * so that a create whose reply was lost can be found and killed), adopt,
 * extend, kill, list; its kernel context; and starting or replacing the
 * sandbox of a handle with its snapshot and input files. */
#include "coderq/e2b/e2b.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "e2b_int.h"

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

cq_err_t e2b_kill_sandbox(cq_e2b_t *e2b, const char *id)
{
        struct call call = {0};
        char url[1024];
        cq_err_t err;

        snprintf(url, sizeof(url), "%s/sandboxes/%s", e2b->api_url, id);
        e2b_call_init(&call, "kill E2B sandbox", PLANE_API, "DELETE", url,
                      e2b_ok_kill);
        call.attempts = e2b->max_attempts > KILL_ATTEMPTS ? KILL_ATTEMPTS
                                                          : e2b->max_attempts;
        /* a kill answers at once; one that hangs is left to the TTL */
        call.timeout_ms = KILL_MS;
        err = e2b_call_run(e2b, e2b->http, &call);
        cq_buf_release(&call.reply);
        if (err != CQ_OK)
                cq_log_warn("e2b: %s (sandbox %s may live until its TTL ends)",
                            e2b->errbuf, id);
        return err;
}

/* Kill the handle's sandbox, which failed to start, and forget it; the
 * error that made it fail stays the handle's. */
static void drop_sandbox(cq_e2b_t *e2b)
{
        char saved[sizeof(e2b->errbuf)];

        memcpy(saved, e2b->errbuf, sizeof(saved));
        (void)e2b_kill_sandbox(e2b, e2b->sandbox_id);
        memcpy(e2b->errbuf, saved, sizeof(saved));
        pthread_mutex_lock(&e2b->lock);
        e2b->sandbox_id[0] = '\0';
        pthread_mutex_unlock(&e2b->lock);
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
                e2b_set_error(e2b,
                              "could not create E2B sandbox: reply is not a "
                              "JSON object");
                goto out;
        }
        id = json_string_value(json_object_get(doc, "sandboxID"));
        envd = json_string_value(json_object_get(doc, "envdVersion"));
        tok = json_string_value(json_object_get(doc, "envdAccessToken"));
        traffic = json_string_value(json_object_get(doc, "trafficAccessToken"));
        dom = json_string_value(json_object_get(doc, "domain"));
        if (!id || !id_is_safe(id, ID_MAX) || !envd) {
                e2b_set_error(e2b,
                              "could not create E2B sandbox: reply lacks a "
                              "valid sandboxID or envdVersion");
                goto out;
        }
        if ((tok && !token_is_safe(tok, TOKEN_MAX)) ||
            (traffic && !token_is_safe(traffic, TOKEN_MAX)) ||
            (dom && (!token_is_safe(dom, 256) || strchr(dom, '/')))) {
                e2b_set_error(e2b, "could not create E2B sandbox: reply has an "
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

void e2b_make_nonce(cq_e2b_t *e2b, char *out)
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
cq_err_t e2b_list_tagged(cq_e2b_t *e2b,
                         const char *key,
                         const char *value,
                         json_t **idsp)
{
        static const long ok[] = {200, 0};
        char filter[512], url[2048], token[256] = "";
        char *meta = NULL, *tok = NULL;
        json_t *ids = json_array();
        cq_err_t err = CQ_ERR_FATAL;
        int page;

        snprintf(filter, sizeof(filter), "%s=%s", key, value);
        meta = cq_http_escape(e2b->http, filter);
        if (!ids || !meta) {
                e2b_set_error(e2b,
                              "could not list E2B sandboxes: out of memory");
                goto out;
        }
        for (page = 0; page < LIST_PAGES; page++) {
                struct call call = {0};
                json_t *doc;
                size_t i;

                free(tok);
                tok = token[0] ? cq_http_escape(e2b->http, token) : NULL;
                snprintf(url, sizeof(url),
                         "%s/v2/sandboxes?metadata=%s&state=running%%2Cpaused"
                         "&limit=100%s%s",
                         e2b->api_url, meta, tok ? "&nextToken=" : "",
                         tok ? tok : "");
                e2b_call_init(&call, "list E2B sandboxes", PLANE_API, "GET",
                              url, ok);
                err = e2b_call_run(e2b, e2b->http, &call);
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
                        e2b_set_error(e2b,
                                      "could not list E2B sandboxes: reply "
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
                                e2b_set_error(e2b, "could not list E2B "
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
        free(tok);
        free(meta);
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

        if (e2b_list_tagged(e2b, TAG_CREATE, nonce, &ids) != CQ_OK)
                return -1;
        for (i = 0; i < json_array_size(ids); i++) {
                const char *id = json_string_value(json_array_get(ids, i));

                cq_log_warn("e2b: killing sandbox %s, made by a create whose "
                            "reply was lost",
                            id);
                if (e2b_kill_sandbox(e2b, id) == CQ_OK)
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

                e2b_make_nonce(e2b, nonce);
                pthread_mutex_lock(&e2b->lock);
                snprintf(e2b->pending, sizeof(e2b->pending), "%s", nonce);
                pthread_mutex_unlock(&e2b->lock);
                req = create_request(e2b, nonce);
                body = req ? json_dumps(req, JSON_COMPACT) : NULL;
                json_decref(req);
                if (!body) {
                        e2b_set_error(
                            e2b, "could not create E2B sandbox: out of memory");
                        err = CQ_ERR_FATAL;
                        break;
                }
                snprintf(url, sizeof(url), "%s%s", e2b->api_url,
                         e2b->create_path);
                e2b_call_init(&call, "create E2B sandbox", PLANE_API, "POST",
                              url, e2b_ok_201);
                e2b_call_json(&call, body);
                call.attempts = 1;
                err = e2b_call_run(e2b, e2b->http, &call);
                free(body);
                if (err == CQ_OK) {
                        e2b->lost = false;
                        err = adopt_sandbox(e2b, &call.reply);
                        cq_buf_release(&call.reply);
                        if (err != CQ_OK && e2b->sandbox_id[0]) {
                                drop_sandbox(e2b);
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
                e2b_backoff_sleep(e2b, attempt, call.retry_after_ms);
        }
        pthread_mutex_lock(&e2b->lock);
        e2b->pending[0] = '\0';
        pthread_mutex_unlock(&e2b->lock);
        return err;
}

/* Called with e2b->lock held. \p errbuf: from cq_e2b_keepalive(), which
 * must not touch the owner's error buffer. */
cq_err_t e2b_set_timeout_on(cq_e2b_t *e2b,
                            cq_http_t *http,
                            int timeout_s,
                            long *statusp,
                            char *errbuf,
                            size_t errbuf_size,
                            int attempts)
{
        struct call call = {0};
        char url[1024], body[64];
        cq_err_t err;

        snprintf(url, sizeof(url), "%s/sandboxes/%s/timeout", e2b->api_url,
                 e2b->sandbox_id);
        snprintf(body, sizeof(body), "{\"timeout\":%d}", timeout_s);
        e2b_call_init(&call, "extend E2B sandbox lifetime", PLANE_API, "POST",
                      url, e2b_ok_204);
        e2b_call_json(&call, body);
        call.errbuf = errbuf;
        call.errbuf_size = errbuf_size;
        call.attempts = attempts;
        if (!e2b->sandbox_id[0]) {
                e2b_call_error(e2b, &call, "could not %s: no sandbox",
                               call.what);
                *statusp = 0;
                return CQ_ERR_RETRIABLE;
        }
        err = e2b_call_run(e2b, http, &call);
        if (err == CQ_OK)
                e2b->expires_ms = cq_now_ms() + (int64_t)timeout_s * 1000;
        *statusp = call.status;
        cq_buf_release(&call.reply);
        return err;
}

/* Extend the TTL when a third of it has passed, or when the next cell's
 * deadline would outlast it. */
cq_err_t e2b_maybe_extend(cq_e2b_t *e2b, int64_t cell_timeout_ms)
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
        err = e2b_set_timeout_on(e2b, e2b->http, (int)((want_ms + 999) / 1000),
                                 &status, NULL, 0, 0);
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

cq_err_t
e2b_keepalive(cq_e2b_t *e2b, int attempts, char *errstr, size_t errstr_size)
{
        int64_t left_s;
        int timeout_s;
        cq_err_t err;
        cq_http_t *http = e2b_http_new(e2b);
        char buf[512] = "";
        long status = 0;

        if (!http) {
                cq_errstr_set(errstr, errstr_size,
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
        err = e2b_set_timeout_on(e2b, http, timeout_s, &status, buf,
                                 sizeof(buf), attempts);
        pthread_mutex_unlock(&e2b->lock);
        if (err != CQ_OK && errstr)
                cq_errstr_set(errstr, errstr_size, "%s", buf);
        cq_http_destroy(&http);
        return err;
}

cq_err_t cq_e2b_keepalive(cq_interp_t *interp, char *errstr, size_t errstr_size)
{
        return e2b_keepalive((cq_e2b_t *)interp, 0, errstr, errstr_size);
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

        if (e2b_dp_base(e2b, CI_PORT, base, sizeof(base)) != 0) {
                e2b_set_error(e2b, "could not create kernel context: URL too "
                                   "long");
                return CQ_ERR_FATAL;
        }
        snprintf(url, sizeof(url), "%s/contexts", base);
        e2b_call_init(&call, "create kernel context in E2B sandbox",
                      PLANE_CI_NOTOKEN, "POST", url, e2b_ok_200);
        e2b_call_json(&call, body);
        err = e2b_call_run(e2b, e2b->http, &call);
        if (err != CQ_OK)
                goto out;
        doc = json_loadb(call.reply.data ? call.reply.data : "", call.reply.len,
                         0, NULL);
        id = json_string_value(json_object_get(doc, "id"));
        if (!id || strlen(id) >= ID_MAX ||
            strspn(id, "0123456789abcdef-") != strlen(id) || !*id) {
                e2b_set_error(e2b, "could not create kernel context in E2B "
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

cq_err_t e2b_restart_context(cq_e2b_t *e2b)
{
        struct call call = {0};
        char base[512], url[1024];
        cq_err_t err;

        if (e2b_dp_base(e2b, CI_PORT, base, sizeof(base)) != 0)
                return CQ_ERR_FATAL;
        snprintf(url, sizeof(url), "%s/contexts/%s/restart", base,
                 e2b->context_id);
        e2b_call_init(&call, "restart kernel context in E2B sandbox",
                      PLANE_CI_NOTOKEN, "POST", url, e2b_ok_200);
        /* A restart answers in seconds or not at all: a kernel its code
         * wedged (its sockets written over, say) is left with its sandbox,
         * which the caller replaces, instead of waiting out every retry of
         * the default deadline. */
        call.attempts = RESTART_ATTEMPTS;
        call.timeout_ms = RESTART_MS;
        err = e2b_call_run(e2b, e2b->http, &call);
        if (err == CQ_ERR_FATAL && call.status == 404)
                err = create_context(e2b);
        cq_buf_release(&call.reply);
        return err;
}

/* Is the sandbox still there? envd /health answers 204 unless it is gone
 * (the proxy answers 502). */
bool e2b_sandbox_alive(cq_e2b_t *e2b)
{
        static const long ok[] = {200, 204, 0};
        struct call call = {0};
        char base[512], url[1024];
        cq_err_t err;

        if (e2b->lost)
                return false;
        if (e2b_dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0)
                return false;
        snprintf(url, sizeof(url), "%s/health", base);
        e2b_call_init(&call, "check E2B sandbox health", PLANE_ENVD, "GET", url,
                      ok);
        call.attempts = 2;
        err = e2b_call_run(e2b, e2b->http, &call);
        cq_buf_release(&call.reply);
        return err == CQ_OK;
}

static cq_err_t upload_inputs(cq_e2b_t *e2b)
{
        size_t i;
        cq_err_t err;

        for (i = 0; i < e2b->ninputs; i++) {
                err = e2b_upload(e2b, e2b->inputs[i].name, e2b->inputs[i].data,
                                 e2b->inputs[i].len);
                if (err != CQ_OK)
                        return err;
        }
        return CQ_OK;
}

/* A fresh sandbox with its context and snapshot. On failure no new sandbox
 * is left behind. */
cq_err_t e2b_start_sandbox(cq_e2b_t *e2b)
{
        cq_err_t err;
        json_t *snap = NULL;

        err = create_sandbox(e2b);
        if (err != CQ_OK)
                return err;
        err = create_context(e2b);
        if (err == CQ_OK)
                err = e2b_list_files(e2b, &snap);
        if (err != CQ_OK) {
                drop_sandbox(e2b);
                return err;
        }
        json_decref(e2b->snapshot);
        e2b->snapshot = snap;
        return CQ_OK;
}

/* Replace a lost or broken sandbox: kill it (best effort), start another,
 * upload the job files again. */
cq_err_t e2b_replace_sandbox(cq_e2b_t *e2b)
{
        cq_err_t err;

        if (e2b->sandbox_id[0]) {
                (void)e2b_kill_sandbox(e2b, e2b->sandbox_id);
                pthread_mutex_lock(&e2b->lock);
                e2b->sandbox_id[0] = '\0';
                pthread_mutex_unlock(&e2b->lock);
        }
        err = e2b_start_sandbox(e2b);
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
