/* SPDX-License-Identifier: MIT */
/* kpool.c - a pool of pre-started kernels: `starts` refill threads keep
 * `size` kernels ready or starting (starting ones count toward the
 * limit), each in a new empty work dir; acquire hands one out once. A
 * kernel moves between threads only whole and under the pool mutex. */
#include "coderq/local/kpool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/local/interp_local.h"
#include "coderq/common/log.h"
#include "coderq/common/pylit.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"
#include "py_int.h"

/* How long acquire waits for a niced pool before it starts a kernel of
 * its own at the job's priority. */
#define KPOOL_GRACE_MS 1500

/* Used kernels waiting for the reaper beyond the pool's size, before
 * callers tear theirs down themselves. */
#define KPOOL_REAP_MAX 16

struct cq_kpool {
        pthread_mutex_t lock; /* guards everything below it */
        pthread_cond_t cond;  /* ready list changed, or stop */
        cq_kernel_t **ready;
        size_t nready;
        size_t starting;
        size_t peak_starting;
        uint64_t started, failed, own_starts;
        uint64_t forked; /* of the started and own_starts */
        bool stop;
        /* cq_kpool_drain(): no more starts; the ready kernels, killed,
         * wait in spent for destroy to reap them */
        bool draining;
        cq_kernel_t **spent;
        size_t nspent;
        char errmsg[512];
        /* read-only after cq_kpool_new() */
        size_t size;
        int start_nice, run_nice;
        cq_local_opts_t local;
        char *python, *preload, *work_root;
        cq_gate_t *gate; /* cell starts of the pool's kernels; NULL: none */
        cq_kserver_t *kserver; /* NULL: kernels start cold */
        pthread_t *threads;
        size_t nthreads; /* started */
        /* The reaper: teardowns of used kernels, under lock. */
        pthread_t reaper;
        bool reaper_started, reaper_stop;
        pthread_cond_t reaper_cond; /* queue not empty, or stop */
        struct deferred *dq_head, *dq_tail;
        size_t discarding;
        uint64_t discarded;
};

typedef struct deferred {
        void (*fn)(void *);
        void *arg;
        struct deferred *next;
} deferred_t;

/* A kernel in a new work dir, started at niceness \p nice; NULL with
 * \p errstr filled on failure. */
static cq_kernel_t *
start_kernel(cq_kpool_t *pool, int nice, char *errstr, size_t errstr_size)
{
        cq_kernel_opts_t kopts = pool->local.kernel;
        cq_kernel_t *kernel = NULL;
        char dir[PATH_MAX];

        kopts.nice = nice;
        if (cq_work_dir_new(pool->work_root, dir, sizeof(dir), errstr,
                            errstr_size) == 0) {
                kopts.work_dir = dir;
                kernel = cq_kernel_new(&kopts, errstr, errstr_size);
                if (!kernel)
                        cq_work_dir_remove(dir);
        }
        return kernel;
}

static void *refill_main(void *arg)
{
        cq_kpool_t *pool = arg;
        char errstr[512];

        pthread_mutex_lock(&pool->lock);
        while (!pool->stop && !pool->draining) {
                cq_kernel_t *kernel;
                bool failed;

                if (pool->nready + pool->starting >= pool->size) {
                        pthread_cond_wait(&pool->cond, &pool->lock);
                        continue;
                }
                pool->starting++;
                if (pool->starting > pool->peak_starting)
                        pool->peak_starting = pool->starting;
                pthread_mutex_unlock(&pool->lock);

                kernel = start_kernel(pool, pool->start_nice, errstr,
                                      sizeof(errstr));
                failed = kernel == NULL;
                if (failed)
                        cq_log_kv(CQ_LOG_WARN, "could not start pool kernel",
                                  "error", errstr, NULL);

                pthread_mutex_lock(&pool->lock);
                pool->starting--;
                if (kernel && pool->draining) {
                        /* nready + starting <= size: spent has room */
                        cq_kernel_kill(kernel);
                        pool->spent[pool->nspent++] = kernel;
                        pool->started++;
                } else if (kernel) {
                        pool->ready[pool->nready++] = kernel;
                        pool->started++;
                        pool->forked += cq_kernel_forked(kernel);
                        pthread_cond_broadcast(&pool->cond);
                } else {
                        struct timespec ts;

                        pool->failed++;
                        snprintf(pool->errmsg, sizeof(pool->errmsg), "%s",
                                 errstr);
                        /* Back off so a broken setup does not spin. */
                        cq_abstime_in(&ts, 1000);
                        if (!pool->stop)
                                pthread_cond_timedwait(&pool->cond, &pool->lock,
                                                       &ts);
                }
        }
        pthread_mutex_unlock(&pool->lock);
        return NULL;
}

/* Tears down used kernels at the lowest priority, in order. */
static void *reaper_main(void *arg)
{
        cq_kpool_t *pool = arg;

        /* This thread only: Linux niceness is per thread. */
        (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
        pthread_mutex_lock(&pool->lock);
        for (;;) {
                deferred_t *d;

                while (!pool->dq_head && !pool->reaper_stop)
                        pthread_cond_wait(&pool->reaper_cond, &pool->lock);
                d = pool->dq_head;
                if (!d)
                        break; /* stopping, and nothing left */
                pool->dq_head = d->next;
                if (!pool->dq_head)
                        pool->dq_tail = NULL;
                pthread_mutex_unlock(&pool->lock);
                d->fn(d->arg);
                free(d);
                pthread_mutex_lock(&pool->lock);
                pool->discarding--;
                pool->discarded++;
        }
        pthread_mutex_unlock(&pool->lock);
        return NULL;
}

/* Run fn(arg) on the reaper thread, which runs at niceness 19 (a
 * kernel's teardown is CPU spent after its job finished: killing,
 * reaping, removing its work dir): the interpreters' defer hook
 * (interp_local.h). 0 when queued (arg now belongs to the reaper); -1
 * when the pool is stopping, the queue is full or out of memory: the
 * caller runs it itself. */
static int defer(void *opaque, void (*fn)(void *), void *arg)
{
        cq_kpool_t *pool = opaque;
        deferred_t *d = malloc(sizeof(*d));
        int rc = -1;

        if (!d)
                return -1;
        d->fn = fn;
        d->arg = arg;
        d->next = NULL;
        pthread_mutex_lock(&pool->lock);
        /* Bounded: a reaper starved by a saturated machine makes the
         * callers reap again, rather than let dead kernels pile up. */
        if (pool->reaper_started && !pool->reaper_stop &&
            pool->discarding < KPOOL_REAP_MAX + pool->size) {
                if (pool->dq_tail)
                        pool->dq_tail->next = d;
                else
                        pool->dq_head = d;
                pool->dq_tail = d;
                pool->discarding++;
                pthread_cond_signal(&pool->reaper_cond);
                rc = 0;
        }
        pthread_mutex_unlock(&pool->lock);
        if (rc != 0)
                free(d);
        return rc;
}

/* Whether this process may lower a niceness of \p from back to \p to:
 * a child tries it on itself. */
static bool can_renice(int from, int to)
{
        pid_t pid = fork();
        int status = -1;

        if (pid < 0)
                return false;
        if (pid == 0) {
                if (setpriority(PRIO_PROCESS, 0, from) != 0 ||
                    setpriority(PRIO_PROCESS, 0, to) != 0)
                        _exit(1);
                _exit(0);
        }
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Whether \p list (comma-separated) names \p want. */
static bool has_token(const char *list, const char *want)
{
        size_t n = strlen(want);

        while (*list) {
                const char *end = strchr(list, ',');
                size_t len = end ? (size_t)(end - list) : strlen(list);

                if (len == n && strncmp(list, want, n) == 0)
                        return true;
                if (!end)
                        break;
                list = end + 1;
        }
        return false;
}

/* Whether the cgroup v2 group \p path (from /proc/self/cgroup) or one of
 * its ancestors below the root has the cpu controller: then our tasks
 * are in a task group of their own, not the root one. */
static bool v2_cpu_below_root(const char *path)
{
        char p[4096], file[4200], ctl[1024];

        snprintf(p, sizeof(p), "%s", path);
        while (strcmp(p, "/") != 0 && p[0] == '/') {
                FILE *f;
                char *slash;
                bool cpu = false;

                snprintf(file, sizeof(file),
                         "/sys/fs/cgroup%s/cgroup.controllers", p);
                f = fopen(file, "re");
                if (f) {
                        if (fgets(ctl, sizeof(ctl), f)) {
                                char *tok, *save = NULL;

                                ctl[strcspn(ctl, "\n")] = '\0';
                                for (tok = strtok_r(ctl, " ", &save); tok;
                                     tok = strtok_r(NULL, " ", &save))
                                        cpu = cpu || strcmp(tok, "cpu") == 0;
                        }
                        fclose(f);
                }
                if (cpu)
                        return true;
                slash = strrchr(p, '/');
                if (slash == p)
                        break;
                *slash = '\0';
        }
        return false;
}

/* Whether the scheduler weighs each session as one group (autogroup
 * scheduling: enabled, and this process in the root CPU task group, the
 * only place where autogroups apply). A cgroup namespace may show its
 * own cgroup as the root; then this says yes where it need not. */
static bool autogroups_active(void)
{
        char line[4096], v2path[4096] = "/";
        FILE *f = fopen("/proc/sys/kernel/sched_autogroup_enabled", "re");
        int c = f ? fgetc(f) : EOF;
        int v1 = -1;

        if (f)
                fclose(f);
        if (c != '1' || access("/proc/self/autogroup", F_OK) != 0)
                return false;
        f = fopen("/proc/self/cgroup", "re");
        if (!f)
                return true;
        while (fgets(line, sizeof(line), f)) {
                char *ctl = strchr(line, ':');
                char *path = ctl ? strchr(ctl + 1, ':') : NULL;

                if (!path)
                        continue;
                *ctl++ = '\0';
                *path++ = '\0';
                path[strcspn(path, "\n")] = '\0';
                if (has_token(ctl, "cpu"))
                        v1 = strcmp(path, "/") == 0;
                else if (!*ctl && strcmp(line, "0") == 0)
                        snprintf(v2path, sizeof(v2path), "%s", path);
        }
        fclose(f);
        return v1 >= 0 ? v1 == 1 : !v2_cpu_below_root(v2path);
}

/* Start one of the pool's threads; on failure \p errstr says which. */
static int start_thread(pthread_t *thr,
                        void *(*fn)(void *),
                        cq_kpool_t *pool,
                        const char *what,
                        char *errstr,
                        size_t errstr_size)
{
        int rc = pthread_create(thr, NULL, fn, pool);

        if (rc && errstr)
                cq_errstr_set(errstr, errstr_size,
                              "could not start kernel pool %s: %s", what,
                              strerror(rc));
        return rc;
}

/* The warm-up that imports \p list (comma-separated module names, as
 * CODERQ_KERNEL_PRELOAD), each failure ignored as in CQ_KPOOL_PRELOAD:
 * kpool_preload.py and a call of it with the names as string literals;
 * "" for an empty list. NULL when out of memory or a name is not a
 * dotted Python identifier (\p errstr says which). */
static char *preload_code(const char *list, char *errstr, size_t errstr_size)
{
        cq_buf_t code;
        const char *p, *end;
        char *out;

        cq_buf_init(&code, 64 * 1024);
        for (p = list; *p; p = *end ? end + 1 : end) {
                end = strchr(p, ',');
                if (!end)
                        end = p + strlen(p);
                if (end == p)
                        continue;
                if (strspn(
                        p,
                        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        "0123456789_.") < (size_t)(end - p)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid module name \"%.*s\" in "
                                      "CODERQ_KERNEL_PRELOAD",
                                      (int)(end - p > 100 ? 100 : end - p), p);
                        cq_buf_release(&code);
                        return NULL;
                }
                if ((code.len && cq_buf_append_str(&code, ", ")) ||
                    cq_pylit_append(&code, p, (size_t)(end - p)))
                        goto oom;
        }
        if (code.len == 0) {
                cq_buf_release(&code);
                return strdup("");
        }
        out = cq_buf_take(&code, NULL);
        if (cq_buf_append_str(&code, cq_kpool_preload_py) ||
            cq_buf_printf(&code, "_cq_preload((%s,))\ndel _cq_preload\n",
                          out)) {
                free(out);
                goto oom;
        }
        free(out);
        return cq_buf_take(&code, NULL);
oom:
        cq_buf_release(&code);
        cq_errstr_set(errstr, errstr_size,
                      "could not create kernel pool: out of memory");
        return NULL;
}

cq_kpool_t *
cq_kpool_new(const cq_kpool_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_kpool_t *pool = calloc(1, sizeof(*pool));
        const cq_local_opts_t *lo = &opts->local;
        size_t nthreads = opts->starts > 0 ? opts->starts : 1, i;

        if (!pool)
                goto oom;
        pthread_mutex_init(&pool->lock, NULL);
        pthread_cond_init(&pool->cond, NULL);
        pthread_cond_init(&pool->reaper_cond, NULL);
        pool->size = opts->size;
        pool->local = *lo;
        pool->run_nice = lo->kernel.nice;
        pool->start_nice = lo->kernel.nice;
        if (opts->start_nice > lo->kernel.nice && opts->start_nice < 20) {
                /* Unsandboxed kernels stay in our session (kernel.c);
                 * bubblewrap's --new-session gives each one a session of
                 * its own, which an autogroup scheduler weighs like all
                 * our running jobs together: niceness inside it would
                 * not make a start yield. */
                if (cq_sandbox_enabled(lo->kernel.sandbox) &&
                    autogroups_active())
                        cq_log_info("kernel pool: sandboxed kernels run in "
                                    "sessions of their own, which autogroup "
                                    "scheduling weighs as one each, so a "
                                    "niced start would not yield to jobs; "
                                    "kernels start at normal priority");
                else if (can_renice(opts->start_nice, lo->kernel.nice))
                        pool->start_nice = opts->start_nice;
                else
                        cq_log_info("kernel pool: niceness cannot be lowered "
                                    "here (no CAP_SYS_NICE or RLIMIT_NICE); "
                                    "kernels start at normal priority");
        }
        if (opts->cell_gate > 0) {
                pool->gate =
                    cq_gate_new(opts->cell_gate, CQ_KPOOL_GATE_HOLD_MS);
                if (!pool->gate)
                        goto oom;
        }
        pool->python = lo->kernel.python ? strdup(lo->kernel.python) : NULL;
        /* Kernels are warmed up with the server's imports (instant in a
         * forked kernel, the same modules in a cold one). */
        if (lo->kernel.preload)
                pool->preload = strdup(lo->kernel.preload);
        else if (opts->kserver.preload) {
                pool->preload =
                    preload_code(opts->kserver.preload, errstr, errstr_size);
                if (!pool->preload)
                        goto failed;
        } else
                pool->preload = strdup(CQ_KPOOL_PRELOAD);
        pool->work_root = lo->work_root ? strdup(lo->work_root) : NULL;
        pool->ready = calloc(opts->size ? opts->size : 1, sizeof(*pool->ready));
        pool->spent = calloc(opts->size ? opts->size : 1, sizeof(*pool->spent));
        pool->threads = calloc(nthreads, sizeof(*pool->threads));
        if ((lo->kernel.python && !pool->python) || !pool->preload ||
            (lo->work_root && !pool->work_root) || !pool->ready ||
            !pool->spent || !pool->threads)
                goto oom;
        pool->local.kernel.python = pool->python;
        pool->local.kernel.preload = pool->preload;
        if (opts->kserver.mode != CQ_KSERVER_OFF) {
                cq_kserver_opts_t ko = opts->kserver;

                ko.python = pool->python;
                ko.sandbox = lo->kernel.sandbox;
                ko.work_root = pool->work_root;
                pool->kserver = cq_kserver_new(&ko, errstr, errstr_size);
                if (!pool->kserver)
                        goto failed;
                pool->local.kernel.kserver = pool->kserver;
        }
        pool->local.kernel.work_dir = NULL;
        pool->local.work_root = pool->work_root;
        if (start_thread(&pool->reaper, reaper_main, pool, "reaper", errstr,
                         errstr_size))
                goto failed;
        pool->reaper_started = true;
        for (i = 0; i < nthreads; i++) {
                if (start_thread(&pool->threads[i], refill_main, pool,
                                 "refill thread", errstr, errstr_size))
                        goto failed;
                pool->nthreads++;
        }
        return pool;
failed:
        cq_kpool_destroy(&pool);
        return NULL;
oom:
        cq_errstr_set(errstr, errstr_size,
                      "could not create kernel pool: out of memory");
        cq_kpool_destroy(&pool);
        return NULL;
}

void cq_kpool_hooks(cq_kpool_t *pool, cq_local_hooks_t *hooks)
{
        hooks->defer = defer;
        hooks->opaque = pool;
        hooks->gate = pool->gate;
}

/* A pool kernel as an interpreter that takes turns at the pool's gate. */
static cq_interp_t *
wrap(cq_kpool_t *pool, cq_kernel_t **kernelp, char *errstr, size_t errstr_size)
{
        cq_local_hooks_t hooks;

        cq_kpool_hooks(pool, &hooks);
        return cq_local_interp_wrap(kernelp, pool->local.kernel.sandbox, true,
                                    &hooks, errstr, errstr_size);
}

cq_interp_t *cq_kpool_acquire(cq_kpool_t *pool,
                              int64_t timeout_ms,
                              char *errstr,
                              size_t errstr_size)
{
        cq_kernel_t *kernel = NULL;
        struct timespec ts;
        int64_t wait = timeout_ms > 0 ? timeout_ms : 0;
        bool own = false;

        /* A pool of niced starts may be slow to deliver on a busy
         * machine: past a grace period the caller starts its own kernel
         * at the job's priority. A pool of size 0 always does. */
        if (pool->size == 0)
                wait = 0;
        else if (pool->start_nice != pool->run_nice && wait > KPOOL_GRACE_MS)
                wait = KPOOL_GRACE_MS;
        own = timeout_ms > wait;
        cq_abstime_in(&ts, wait);
        pthread_mutex_lock(&pool->lock);
        while (!pool->stop && !pool->draining && pool->nready == 0 &&
               wait > 0) {
                if (pthread_cond_timedwait(&pool->cond, &pool->lock, &ts) ==
                    ETIMEDOUT)
                        break;
        }
        if (!pool->stop && pool->nready > 0) {
                kernel = pool->ready[--pool->nready];
                pool->ready[pool->nready] = NULL;
                pthread_cond_broadcast(&pool->cond); /* refill */
        } else if (!pool->stop && (own || pool->draining)) {
                /* a draining pool starts nothing more: waiting is vain */
                pthread_mutex_unlock(&pool->lock);
                kernel =
                    start_kernel(pool, pool->run_nice, errstr, errstr_size);
                pthread_mutex_lock(&pool->lock);
                if (kernel) {
                        pool->own_starts++;
                        pool->forked += cq_kernel_forked(kernel);
                }
                pthread_mutex_unlock(&pool->lock);
                return kernel ? wrap(pool, &kernel, errstr, errstr_size) : NULL;
        } else
                cq_errstr_set(
                    errstr, errstr_size, "could not acquire a kernel: %s%s%s",
                    pool->stop ? "pool is stopping" : "none ready in time",
                    pool->errmsg[0] ? "; last start error: " : "",
                    pool->errmsg);
        pthread_mutex_unlock(&pool->lock);
        if (!kernel)
                return NULL;
        if (pool->start_nice != pool->run_nice &&
            cq_kernel_renice(kernel, pool->run_nice) != 0)
                cq_log_kv(CQ_LOG_WARN,
                          "could not restore a pooled kernel's priority",
                          "error", strerror(errno), NULL);
        return wrap(pool, &kernel, errstr, errstr_size);
}

void cq_kpool_drain(cq_kpool_t *pool)
{
        size_t i, from;

        pthread_mutex_lock(&pool->lock);
        pool->draining = true;
        pthread_cond_broadcast(&pool->cond);
        from = pool->nspent;
        for (i = 0; i < pool->nready; i++) {
                pool->spent[pool->nspent++] = pool->ready[i];
                pool->ready[i] = NULL;
        }
        pool->nready = 0;
        /* they die now, in parallel, at niceness 19 */
        for (i = from; i < pool->nspent; i++)
                cq_kernel_kill(pool->spent[i]);
        pthread_mutex_unlock(&pool->lock);
}

/* Discard \p n kernels that were never used and remove their work dirs:
 * all are killed first, so they die together and each reap finds its
 * kernel gone (one by one, a pool of 64 took 3.6 s on a busy machine). */
static void discard_unused(cq_kernel_t **v, size_t n)
{
        size_t i;

        for (i = 0; i < n; i++)
                cq_kernel_kill(v[i]);
        for (i = 0; i < n; i++) {
                char dir[PATH_MAX];

                snprintf(dir, sizeof(dir), "%s", cq_kernel_work_dir(v[i]));
                cq_kernel_discard(&v[i]);
                cq_work_dir_remove(dir);
        }
}

size_t cq_kpool_ready(cq_kpool_t *pool)
{
        size_t n;

        pthread_mutex_lock(&pool->lock);
        n = pool->nready;
        pthread_mutex_unlock(&pool->lock);
        return n;
}

void cq_kpool_stats(cq_kpool_t *pool, cq_kpool_stats_t *stats)
{
        pthread_mutex_lock(&pool->lock);
        stats->ready = pool->nready;
        stats->starting = pool->starting;
        stats->peak_starting = pool->peak_starting;
        stats->started = pool->started;
        stats->failed = pool->failed;
        stats->start_nice = pool->start_nice;
        stats->own_starts = pool->own_starts;
        stats->forked = pool->forked;
        stats->discarding = pool->discarding;
        stats->discarded = pool->discarded;
        pthread_mutex_unlock(&pool->lock);
        if (pool->gate)
                cq_gate_stats(pool->gate, &stats->gate);
        else
                memset(&stats->gate, 0, sizeof(stats->gate));
}

void cq_kpool_destroy(cq_kpool_t **poolp)
{
        cq_kpool_t *pool = *poolp;
        size_t i;

        if (!pool)
                return;
        *poolp = NULL;
        if (pool->nthreads > 0) {
                pthread_mutex_lock(&pool->lock);
                pool->stop = true;
                pthread_cond_broadcast(&pool->cond);
                pthread_mutex_unlock(&pool->lock);
                for (i = 0; i < pool->nthreads; i++)
                        pthread_join(pool->threads[i], NULL);
        }
        /* The reaper finishes its queue first. */
        if (pool->reaper_started) {
                pthread_mutex_lock(&pool->lock);
                pool->reaper_stop = true;
                pthread_cond_broadcast(&pool->reaper_cond);
                pthread_mutex_unlock(&pool->lock);
                pthread_join(pool->reaper, NULL);
        }
        if (pool->ready)
                discard_unused(pool->ready, pool->nready);
        if (pool->spent)
                discard_unused(pool->spent, pool->nspent);
        cq_kserver_destroy(&pool->kserver);
        free(pool->ready);
        free(pool->spent);
        free(pool->threads);
        free(pool->python);
        free(pool->preload);
        free(pool->work_root);
        cq_gate_destroy(&pool->gate);
        pthread_cond_destroy(&pool->reaper_cond);
        pthread_cond_destroy(&pool->cond);
        pthread_mutex_destroy(&pool->lock);
        free(pool);
}

void cq_kpool_opts_from_config(cq_kpool_opts_t *opts,
                               const cq_config_t *cfg,
                               const cq_sandbox_t *sandbox)
{
        memset(opts, 0, sizeof(*opts));
        opts->size = cfg->kpool_size > 0 ? (size_t)cfg->kpool_size : 0;
        opts->starts = cfg->kpool_starts > 0 ? (size_t)cfg->kpool_starts : 1;
        opts->start_nice = (int)cfg->kpool_nice;
        opts->cell_gate = (unsigned)cfg->cell_gate;
        cq_local_opts_from_config(&opts->local, cfg, sandbox);
        /* The configuration accepts only auto, on and off. */
        if (cq_kserver_opts_from_config(&opts->kserver, cfg, sandbox))
                opts->kserver.mode = CQ_KSERVER_OFF;
}

cq_kserver_t *cq_kpool_kserver(cq_kpool_t *pool)
{
        return pool ? pool->kserver : NULL;
}
