/* SPDX-License-Identifier: MIT */
/* e2b.c - the E2B interpreter backend's handle: settings, create and
 * destroy, the cq_interp_t operations table and the fleet that
 * housekeeping extends and reconciles. Error messages are in e2b_err.c,
 * HTTP and its retries in e2b_http.c, the sandbox's life in
 * e2b_sandbox.c, files in e2b_files.c, the /execute stream's lines in
 * e2b_ndjson.c and cells in e2b_exec.c. Recovery rules are in e2b.h; the
 * wire facts in docs/internals/protocols/e2b.md. */
#include "coderq/e2b/e2b.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/interp/collect.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "e2b_int.h"

static const char *e2b_errmsg(const cq_interp_t *interp)
{
        return ((const cq_e2b_t *)interp)->errbuf;
}

static void fleet_leave(cq_e2b_t *e2b);

static void e2b_destroy(cq_interp_t *interp)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        size_t i;

        fleet_leave(e2b);
        if (e2b->sandbox_id[0] && e2b->http)
                (void)e2b_kill_sandbox(e2b, e2b->sandbox_id);
        cq_http_destroy(&e2b->http);
        cq_http_destroy(&e2b->aux);
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

/* A handle with the settings and HTTP clients, no sandbox yet; NULL with
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
                cq_errstr_set(errstr, errstr_size,
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
        e2b->secrets[0] = e2b->api_key;
        e2b->secrets[1] = e2b->envd_token;
        e2b->secrets[2] = e2b->traffic_token;
        e2b->http = e2b_http_new(e2b);
        e2b->aux = e2b_http_new(e2b);
        e2b->max_timeout_s =
            opts->max_timeout_s > 0 ? opts->max_timeout_s : 3600;
        if (e2b->ttl_s > e2b->max_timeout_s)
                e2b->ttl_s = e2b->max_timeout_s;
        e2b->tag_attempt = opts->attempt;
        e2b->tag_job = opts->job_id ? strdup(opts->job_id) : NULL;
        e2b->tag_worker = opts->worker_id ? strdup(opts->worker_id) : NULL;
        if (!e2b->http || !e2b->aux || (opts->job_id && !e2b->tag_job) ||
            (opts->worker_id && !e2b->tag_worker))
                goto oom_free;
        return e2b;
oom_free:
        e2b_destroy(&e2b->base);
oom:
        cq_errstr_set(errstr, errstr_size,
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
        err = e2b_start_sandbox(e2b);
        if (err != CQ_OK) {
                cq_errstr_set(errstr, errstr_size, "%s", e2b->errbuf);
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
                cq_errstr_set(errstr, errstr_size,
                              "could not track E2B sandboxes: no worker id");
                return NULL;
        }
        fleet = calloc(1, sizeof(*fleet));
        if (!fleet) {
                cq_errstr_set(errstr, errstr_size,
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
                if (e2b_keepalive(e2b, 1, errstr, sizeof(errstr)) == CQ_OK)
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

        if (e2b_list_tagged(api, TAG_WORKER, api->tag_worker, &ids) != CQ_OK) {
                cq_errstr_set(errstr, errstr_size, "%s", api->errbuf);
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
                if (e2b_kill_sandbox(api, id) == CQ_OK)
                        killed++;
        }
        json_decref(ids);
        return killed;
}
