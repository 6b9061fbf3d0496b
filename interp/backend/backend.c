/* SPDX-License-Identifier: MIT */
/* backend.c - the sandbox, the kernel pool and the backend choice: a
 * job's "backend" field (never less isolated than CODERQ_BACKEND), else
 * CODERQ_BACKEND; a runner for a local job judged with no LLM; the
 * judging interpreters, always local. An E2B sandbox is created per job
 * (a microVM: nothing to pre-start), and with CODERQ_BACKEND=e2b no
 * local kernel is started. */
#include "coderq/backend/backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coderq/backend/judges.h"
#include "coderq/e2b/e2b.h"
#include "coderq/local/interp_local.h"
#include "coderq/local/judgeproc.h"
#include "coderq/local/kpool.h"
#include "coderq/local/kserver.h"
#include "coderq/common/log.h"
#include "coderq/local/runner.h"
#include "coderq/local/sandbox.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"

/* How often housekeeping looks for stray E2B sandboxes of this worker. */
#define RECONCILE_MS 60000
/* Runner servers at most: one serves one start at a time (the sandbox's
 * pid 1 builds its filesystem meanwhile), so starts from several slots
 * queue at one; one per CPU, up to this. */
#define LIGHT_MAX 4
/* A judge kept for the next run of its test code ends after this long
 * without one, or after this many runs (docs/EVALUATION.md, "The
 * judge"). At most as many wait as the worker has slots. */
#define JUDGE_IDLE_MS  30000
#define JUDGE_RUNS_MAX 100

struct cq_backend {
        const cq_config_t *cfg;
        cq_sandbox_t *sandbox;
        cq_kpool_t *pool; /* NULL with CODERQ_BACKEND=e2b */
        /* The servers runners and judges are forked from, taken in turn:
         * their own, which import no kernel's modules, so that a fork
         * copies little (CODERQ_KERNEL_SERVER; none when off). */
        cq_kserver_t *light[LIGHT_MAX];
        size_t nlight;
        atomic_uint next_light;
        size_t pool_size;
        cq_e2b_fleet_t *fleet; /* NULL: not tracked (no E2B, or no id) */
        char worker_id[192];
        int64_t next_reconcile; /* housekeeping thread only */
        char describe[384];
        /* What the first runner reported of its Python, which every
         * runner of this python shares (NULL: none reported yet). */
        pthread_mutex_t lock; /* guards runner_env and runner_preload */
        json_t *runner_env;
        const char *runner_preload; /* borrowed; NULL: none */
        cq_judges_t *judges;        /* judges kept for their test code */
};

/* The configured backend: CODERQ_BACKEND, else local kernels. */
static const char *configured(const cq_backend_t *backend)
{
        return backend->cfg->backend && *backend->cfg->backend
                   ? backend->cfg->backend
                   : "local";
}

/* Say once how judging interpreters run: in the local sandbox, or, where
 * it is off, as plain processes, at warn. */
static void log_judges(const cq_backend_t *backend)
{
        bool boxed = cq_sandbox_enabled(backend->sandbox);
        cq_kserver_t *ks = backend->light[0];

        cq_log_kv(boxed ? CQ_LOG_INFO : CQ_LOG_WARN, "judging interpreters",
                  "mode", cq_sandbox_mode_name(backend->sandbox), "detail",
                  !boxed ? "UNSANDBOXED: plain processes as the worker's user, "
                           "with the rlimits and a scrubbed environment"
                  : cq_sandbox_uid_per_kernel(backend->sandbox)
                      ? "sandboxed with bubblewrap as kernels are, a uid per "
                        "process"
                      : "sandboxed with bubblewrap as kernels are",
                  "start",
                  cq_kserver_enabled(ks) ? "forked by the runner servers"
                                         : "cold",
                  NULL);
}

/* The servers for runners and judges, one per CPU up to LIGHT_MAX, in
 * CODERQ_KERNEL_SERVER's mode (auto: off, and said, when the first's
 * probe fails; on: the backend fails with it), with the imports of their
 * own. -1 with \p errstr filled. */
static int start_light(cq_backend_t *backend, char *errstr, size_t errstr_size)
{
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        size_t n = cpus > 1 ? (size_t)cpus : 1;
        cq_kserver_opts_t ko;

        /* the configuration accepts only auto, on and off */
        if (cq_kserver_opts_from_config(&ko, backend->cfg, backend->sandbox) ||
            ko.mode == CQ_KSERVER_OFF)
                return 0;
        ko.light = true;
        ko.preload = NULL;
        for (backend->nlight = 0;
             backend->nlight < n && backend->nlight < LIGHT_MAX;
             backend->nlight++) {
                cq_kserver_t *ks = cq_kserver_new(&ko, errstr, errstr_size);

                if (!ks)
                        return -1;
                backend->light[backend->nlight] = ks;
                /* one that could not work here: none would */
                if (!cq_kserver_enabled(ks)) {
                        backend->nlight++;
                        break;
                }
        }
        return 0;
}

/* The runner server whose turn it is; NULL when there is none. */
static cq_kserver_t *light_server(cq_backend_t *backend)
{
        if (backend->nlight == 0)
                return NULL;
        return backend->light[atomic_fetch_add(&backend->next_light, 1) %
                              backend->nlight];
}

cq_backend_t *cq_backend_new(const cq_config_t *cfg,
                             size_t pool_size,
                             char *errstr,
                             size_t errstr_size)
{
        cq_backend_t *backend = calloc(1, sizeof(*backend));
        cq_sandbox_opts_t so;
        cq_kpool_opts_t po;
        char root[512];
        int swept;

        if (!backend) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return NULL;
        }
        backend->cfg = cfg;
        pthread_mutex_init(&backend->lock, NULL);
        atomic_init(&backend->next_light, 0);
        /* Before any kernel exists: code of our uid (a kernel with the
         * sandbox off, or sharing our uid) must not read our environment
         * (API keys, the database DSN) from /proc, nor ptrace us. */
        if (cq_sandbox_protect_self() != 0)
                cq_log_kv(CQ_LOG_WARN,
                          "could not make the process non-dumpable", "error",
                          strerror(errno), NULL);
        if (cq_sandbox_opts_from_config(&so, cfg) != 0) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "invalid CODERQ_SANDBOX \"%s\" or CODERQ_SANDBOX_UIDS "
                    "\"%s\"",
                    cfg->sandbox ? cfg->sandbox : "",
                    cfg->sandbox_uids ? cfg->sandbox_uids : "");
                goto fail;
        }
        if (!cfg->work_root) {
                cq_work_root_default(root, sizeof(root));
                so.probe_dir = root;
        }
        backend->sandbox = cq_sandbox_new(&so, errstr, errstr_size);
        if (!backend->sandbox)
                goto fail;
        /* Whatever the sandbox mode, kernels make their work dirs there: a
         * root that is a symlink, another uid's or writable by others
         * would fail every kernel, so the process does not start. */
        if (cq_work_root_prepare(so.probe_dir, errstr, errstr_size) != 0)
                goto fail;
        snprintf(backend->describe, sizeof(backend->describe),
                 "local kernels %s%s%s",
                 cq_sandbox_uid_per_kernel(backend->sandbox)
                     ? "sandboxed with bubblewrap, a uid per kernel"
                 : cq_sandbox_enabled(backend->sandbox)
                     ? "sandboxed with bubblewrap"
                     : "UNSANDBOXED, as the worker's user",
                 *cq_sandbox_reason(backend->sandbox) ? ": " : "",
                 cq_sandbox_reason(backend->sandbox));
        /* An operator who chose less isolation hears of it at warn. */
        cq_log_kv(cq_sandbox_uid_per_kernel(backend->sandbox) ? CQ_LOG_INFO
                                                              : CQ_LOG_WARN,
                  "sandbox", "mode", cq_sandbox_mode_name(backend->sandbox),
                  "detail", backend->describe, NULL);
        swept = cq_work_root_sweep(cfg->work_root);
        if (swept > 0)
                cq_log_json(CQ_LOG_INFO, NULL,
                            "removed %d work dirs of workers that are gone",
                            swept);
        /* E2B's jobs never run in a local kernel: no pool, no kernel
         * server */
        if (strcmp(configured(backend), "e2b") != 0) {
                cq_kpool_opts_from_config(&po, cfg, backend->sandbox);
                po.size = pool_size;
                backend->pool_size = pool_size;
                backend->pool = cq_kpool_new(&po, errstr, errstr_size);
                if (!backend->pool)
                        goto fail;
        }
        if (start_light(backend, errstr, errstr_size))
                goto fail;
        backend->judges = cq_judges_new(cfg->slots > 0 ? (size_t)cfg->slots : 1,
                                        JUDGE_IDLE_MS, JUDGE_RUNS_MAX);
        if (!backend->judges) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                goto fail;
        }
        log_judges(backend);
        return backend;
fail:
        cq_backend_destroy(&backend);
        return NULL;
}

int cq_backend_track_e2b(cq_backend_t *backend,
                         const char *worker_id,
                         char *errstr,
                         size_t errstr_size)
{
        cq_e2b_opts_t eo;

        if (!backend->cfg->e2b_api_key || !*backend->cfg->e2b_api_key)
                return 0;
        snprintf(backend->worker_id, sizeof(backend->worker_id), "%s",
                 worker_id);
        cq_e2b_opts_from_config(&eo, backend->cfg);
        eo.worker_id = backend->worker_id;
        backend->fleet = cq_e2b_fleet_new(&eo, errstr, errstr_size);
        return backend->fleet ? 0 : -1;
}

void cq_backend_housekeep(cq_backend_t *backend)
{
        char errstr[512];
        size_t i;
        int n;

        if (!backend)
                return;
        (void)cq_judges_expire(backend->judges, cq_now_ms());
        /* down, not yet due or still importing: -1, and nothing waited */
        if (backend->pool)
                (void)cq_kserver_wait(cq_kpool_kserver(backend->pool), 0);
        for (i = 0; i < backend->nlight; i++)
                (void)cq_kserver_wait(backend->light[i], 0);
        if (!backend->fleet)
                return;
        (void)cq_e2b_fleet_keepalive(backend->fleet, false);
        if (cq_now_ms() < backend->next_reconcile)
                return;
        backend->next_reconcile = cq_now_ms() + RECONCILE_MS;
        n = cq_e2b_fleet_reconcile(backend->fleet, errstr, sizeof(errstr));
        if (n < 0)
                cq_log_kv(CQ_LOG_WARN, "could not look for stray E2B sandboxes",
                          "error", errstr, NULL);
        else if (n > 0)
                cq_log_json(CQ_LOG_INFO, NULL,
                            "killed %d stray E2B sandboxes of this worker", n);
}

/* The backend a job gets: its own "backend" field, else the configured
 * one. A job may ask for more isolation than the configuration gives
 * (an E2B sandbox where local kernels are the default), never for less:
 * a job naming local kernels where CODERQ_BACKEND is e2b gets NULL, and
 * \p errstr says why. The job's content is not the operator's choice. */
static const char *backend_name(const cq_backend_t *backend,
                                const char *which,
                                char *errstr,
                                size_t errstr_size)
{
        const char *cfg = configured(backend);

        if (!which)
                return cfg;
        if (strcmp(which, "local") == 0 && strcmp(cfg, "e2b") == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "the job asks for backend \"local\", less "
                              "isolated than this worker's CODERQ_BACKEND=e2b: "
                              "refused");
                return NULL;
        }
        return which;
}

cq_err_t cq_backend_acquire(cq_backend_t *backend,
                            const char *which,
                            int64_t timeout_ms,
                            cq_interp_t **interpp,
                            char *errstr,
                            size_t errstr_size)
{
        return cq_backend_acquire_job(backend, which, timeout_ms, NULL, 0,
                                      interpp, errstr, errstr_size);
}

cq_err_t cq_backend_acquire_job(cq_backend_t *backend,
                                const char *which,
                                int64_t timeout_ms,
                                const char *job_id,
                                int attempt,
                                cq_interp_t **interpp,
                                char *errstr,
                                size_t errstr_size)
{
        *interpp = NULL;
        which = backend_name(backend, which, errstr, errstr_size);
        if (!which)
                return CQ_ERR_FATAL;
        if (strcmp(which, "local") == 0) {
                /* No kernel in time, or one that could not start: the
                 * pool may recover (a busy machine, a passing fault). */
                *interpp = cq_kpool_acquire(backend->pool, timeout_ms, errstr,
                                            errstr_size);
                return *interpp ? CQ_OK : CQ_ERR_RETRIABLE;
        }
        if (strcmp(which, "e2b") == 0) {
                cq_e2b_opts_t eo;
                cq_err_t err;

                cq_e2b_opts_from_config(&eo, backend->cfg);
                if (!eo.api_key || !*eo.api_key) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "backend \"e2b\": E2B_API_KEY is not set");
                        return CQ_ERR_FATAL;
                }
                eo.max_output = backend->cfg->output_max;
                eo.job_id = job_id;
                eo.attempt = attempt;
                if (backend->fleet) {
                        eo.fleet = backend->fleet;
                        eo.worker_id = backend->worker_id;
                }
                err = cq_e2b_create(&eo, interpp, errstr, errstr_size);
                return err == CQ_ERR_TOO_LARGE ? CQ_ERR_FATAL : err;
        }
        cq_errstr_set(errstr, errstr_size, "backend \"%s\" is not available",
                      which);
        return CQ_ERR_FATAL;
}

/* Whether a line of \p code is in IPython's own syntax: its first
 * character that is not blank is '%' (a magic) or '!' (a shell escape),
 * which no Python line starts with (a string's continuation line may:
 * then a kernel runs it, which only costs time). */
static bool ipython_syntax(const char *code)
{
        const char *p = code;

        while (*p) {
                p += strspn(p, " \t");
                if (*p == '%' || *p == '!')
                        return true;
                p += strcspn(p, "\n");
                if (*p)
                        p++;
        }
        return false;
}

bool cq_backend_job_runner(const cq_backend_t *backend, const cq_job_t *job)
{
        const char *which = backend_name(backend, job->backend, NULL, 0);

        return which && strcmp(which, "local") == 0 && job->solution &&
               job->nfiles == 0 && !ipython_syntax(job->solution);
}

void cq_backend_set_runner_preload(cq_backend_t *backend, const char *source)
{
        pthread_mutex_lock(&backend->lock);
        backend->runner_preload = source;
        pthread_mutex_unlock(&backend->lock);
}

/* A runner confined as the local kernels are, forked by the pool's
 * kernel server when it can; every runner after the first that reported
 * its environment reports the same (one python, one set of packages). */
static cq_interp_t *
start_runner(cq_backend_t *backend, char *errstr, size_t errstr_size)
{
        const cq_config_t *cfg = backend->cfg;
        cq_local_hooks_t hooks;
        cq_runner_opts_t ro;
        cq_interp_t *interp;
        json_t *env;

        memset(&ro, 0, sizeof(ro));
        pthread_mutex_lock(&backend->lock);
        env = json_deep_copy(backend->runner_env);
        ro.preload = backend->runner_preload;
        pthread_mutex_unlock(&backend->lock);
        ro.python = cfg->python;
        ro.sandbox = backend->sandbox;
        ro.kserver = light_server(backend);
        ro.work_root = cfg->work_root;
        ro.output_max = cfg->output_max;
        ro.start_timeout_ms = cfg->kernel_startup_timeout_s * 1000;
        ro.env = env;
        /* torn down on the pool's reaper thread, as its kernels are */
        if (backend->pool) {
                cq_kpool_hooks(backend->pool, &hooks);
                ro.hooks = &hooks;
        }
        interp = cq_runner_new(&ro, errstr, errstr_size);
        json_decref(env);
        if (interp && !env && cq_interp_env(interp)) {
                pthread_mutex_lock(&backend->lock);
                if (!backend->runner_env)
                        backend->runner_env =
                            json_deep_copy(cq_interp_env(interp));
                pthread_mutex_unlock(&backend->lock);
        }
        return interp;
}

cq_err_t cq_backend_acquire_for(cq_backend_t *backend,
                                const cq_job_t *job,
                                int attempt,
                                int64_t timeout_ms,
                                cq_interp_t **interpp,
                                char *errstr,
                                size_t errstr_size)
{
        if (!cq_backend_job_runner(backend, job))
                return cq_backend_acquire_job(backend, job->backend, timeout_ms,
                                              job->job_id, attempt, interpp,
                                              errstr, errstr_size);
        *interpp = start_runner(backend, errstr, errstr_size);
        return *interpp ? CQ_OK : CQ_ERR_RETRIABLE;
}

cq_interp_proc_t *cq_backend_judge_start(void *opaque,
                                         const char *program,
                                         char *errstr,
                                         size_t errstr_size)
{
        cq_backend_t *backend = opaque;
        cq_judgeproc_opts_t jo;
        cq_local_hooks_t hooks;

        memset(&jo, 0, sizeof(jo));
        jo.python = backend->cfg->python;
        jo.sandbox = backend->sandbox;
        jo.kserver = light_server(backend);
        jo.work_root = backend->cfg->work_root;
        if (backend->pool) {
                cq_kpool_hooks(backend->pool, &hooks);
                jo.hooks = &hooks;
        }
        return cq_judgeproc_start(&jo, program, errstr, errstr_size);
}

cq_interp_proc_t *cq_backend_judge_take(void *opaque, const char *key)
{
        return cq_judges_take(((cq_backend_t *)opaque)->judges, key);
}

bool cq_backend_judge_keep(void *opaque,
                           const char *key,
                           cq_interp_proc_t *proc)
{
        return cq_judges_keep(((cq_backend_t *)opaque)->judges, key, proc);
}

void cq_backend_judges(cq_backend_t *backend, cq_judges_stats_t *st)
{
        cq_judges_stats(backend ? backend->judges : NULL, st);
}

const char *cq_backend_describe(const cq_backend_t *backend)
{
        return backend->describe;
}

/* \p s, or \p def when it is NULL or empty. */
static const char *or_default(const char *s, const char *def)
{
        return s && *s ? s : def;
}

void cq_backend_describe_job(const cq_backend_t *backend,
                             const char *which,
                             char *out,
                             size_t size)
{
        const cq_config_t *cfg = backend->cfg;
        const char *api_url = or_default(cfg->e2b_api_url, NULL);
        const char *name = backend_name(backend, which, NULL, 0);

        if (!name)
                snprintf(out, size,
                         "backend \"%s\", refused: this worker runs jobs on %s",
                         which, configured(backend));
        else if (strcmp(name, "e2b") == 0)
                snprintf(out, size, "an E2B sandbox, template %s, %s %s",
                         or_default(cfg->e2b_template, "code-interpreter-v1"),
                         api_url ? "API" : "domain",
                         api_url ? api_url
                                 : or_default(cfg->e2b_domain, "e2b.app"));
        else if (strcmp(name, "local") == 0)
                snprintf(out, size, "%s", backend->describe);
        else
                snprintf(out, size, "backend \"%s\", which is not available",
                         name);
}

const char *cq_backend_sandbox_mode(const cq_backend_t *backend,
                                    cq_interp_t *interp)
{
        if (interp && !cq_local_interp_kernel(interp) && !cq_runner_is(interp))
                return "e2b";
        return cq_sandbox_mode_name(backend->sandbox);
}

/* How isolated each sandbox mode is, weakest first. */
static const char *const sandbox_order[] = {
    CQ_SANDBOX_MODE_OFF, CQ_SANDBOX_MODE_BWRAP, CQ_SANDBOX_MODE_UIDS, "e2b"};

static int sandbox_rank(const char *mode)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(sandbox_order); i++)
                if (strcmp(mode, sandbox_order[i]) == 0)
                        return (int)i;
        return -1;
}

const char *cq_backend_weaker_sandbox(const char *a, const char *b)
{
        int ra, rb;

        if (!a || !b) {
                a = a ? a : b;
                if (!a)
                        return NULL;
                b = a;
        }
        ra = sandbox_rank(a);
        rb = sandbox_rank(b);
        if (ra < 0 || rb < 0)
                return CQ_SANDBOX_MODE_UNKNOWN;
        return sandbox_order[ra < rb ? ra : rb];
}

bool cq_backend_unsandboxed(const cq_backend_t *backend, cq_interp_t *interp)
{
        return strcmp(cq_backend_sandbox_mode(backend, interp),
                      CQ_SANDBOX_MODE_OFF) == 0;
}

bool cq_backend_pool(cq_backend_t *backend, cq_backend_pool_t *pool)
{
        cq_kserver_stats_t kst;
        cq_kpool_stats_t st;
        cq_kserver_t *ks;

        memset(pool, 0, sizeof(*pool));
        if (!backend || !backend->pool)
                return false;
        cq_kpool_stats(backend->pool, &st);
        pool->size = backend->pool_size;
        pool->ready = st.ready;
        pool->starting = st.starting;
        pool->started = st.started + st.own_starts;
        pool->forked = st.forked;
        pool->failed = st.failed;
        pool->discarding = st.discarding;
        ks = cq_kpool_kserver(backend->pool);
        if (cq_kserver_enabled(ks)) {
                cq_kserver_stats(ks, &kst);
                pool->server = true;
                pool->server_up = kst.up;
                pool->server_restarts = kst.restarts;
                pool->server_refused = kst.refused;
        }
        return true;
}

void cq_backend_log_pool(cq_backend_t *backend)
{
        cq_kpool_stats_t st;
        json_t *fields;

        if (!backend || !backend->pool)
                return;
        cq_kpool_stats(backend->pool, &st);
        fields = json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "started",
            (json_int_t)st.started, "failed", (json_int_t)st.failed,
            "own_starts", (json_int_t)st.own_starts, "discarded",
            (json_int_t)st.discarded, "cells", (json_int_t)st.gate.entered,
            "cells_waited", (json_int_t)st.gate.waited, "cell_wait_max_ms",
            (json_int_t)st.gate.max_wait_ms, "cells_long",
            (json_int_t)st.gate.expired);
        cq_log_json(CQ_LOG_INFO, fields, "kernel pool");
        json_decref(fields);
}

void cq_backend_drain(cq_backend_t *backend)
{
        if (backend && backend->pool)
                cq_kpool_drain(backend->pool);
}

void cq_backend_destroy(cq_backend_t **backendp)
{
        cq_backend_t *backend = *backendp;
        size_t i;

        if (!backend)
                return;
        *backendp = NULL;
        /* before the pool: a judge's teardown may be deferred to it */
        cq_judges_destroy(&backend->judges);
        cq_kpool_destroy(&backend->pool);
        for (i = 0; i < backend->nlight; i++)
                cq_kserver_destroy(&backend->light[i]);
        cq_e2b_fleet_destroy(&backend->fleet);
        cq_sandbox_destroy(&backend->sandbox);
        json_decref(backend->runner_env);
        pthread_mutex_destroy(&backend->lock);
        free(backend);
}
