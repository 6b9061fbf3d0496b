/* SPDX-License-Identifier: MIT */
/* kpool.c - a pool of pre-started kernels: `starts` refill threads keep
 * `size` kernels ready or starting (starting ones count toward the
 * limit), each in a new empty work dir; acquire hands one out once. A
 * kernel moves between threads only whole and under the pool mutex. */
#include "coderq/kpool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/log.h"
#include "coderq/util.h"
#include "kpool_int.h"

/* How long acquire waits for a niced pool before it starts a kernel of
 * its own at the job's priority. */
#define KPOOL_GRACE_MS 1500

struct cq_kpool {
        pthread_mutex_t lock; /* guards everything below it */
        pthread_cond_t cond;  /* ready list changed, or stop */
        cq_kernel_t **ready;
        size_t nready;
        size_t starting;
        size_t peak_starting;
        uint64_t started, failed, own_starts;
        bool stop;
        char errmsg[512];
        /* read-only after cq_kpool_new() */
        size_t size;
        int start_nice, run_nice;
        cq_local_opts_t local;
        char *python, *preload, *work_root;
        pthread_t *threads;
        size_t nthreads; /* started */
};

/* A kernel in a new work dir, started at niceness \p nice; NULL with
 * \p errstr filled on failure. */
static cq_kernel_t *
start_kernel(cq_kpool_t *pool, int nice, char *errstr, size_t errstr_size)
{
        cq_kernel_opts_t kopts = pool->local.kernel;
        cq_kernel_t *kernel = NULL;
        char dir[PATH_MAX];

        kopts.nice = nice;
        if (cq_work_dir_new(pool->work_root, kopts.sandbox, dir, sizeof(dir),
                            errstr, errstr_size) == 0) {
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
        while (!pool->stop) {
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
                if (kernel) {
                        pool->ready[pool->nready++] = kernel;
                        pool->started++;
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
        pool->size = opts->size;
        pool->local = *lo;
        pool->run_nice = lo->kernel.nice;
        pool->start_nice = lo->kernel.nice;
        if (opts->start_nice > lo->kernel.nice && opts->start_nice < 20) {
                if (can_renice(opts->start_nice, lo->kernel.nice))
                        pool->start_nice = opts->start_nice;
                else
                        cq_log_info("kernel pool: niceness cannot be lowered "
                                    "here (no CAP_SYS_NICE or RLIMIT_NICE); "
                                    "kernels start at normal priority");
        }
        pool->python = lo->kernel.python ? strdup(lo->kernel.python) : NULL;
        pool->preload =
            strdup(lo->kernel.preload ? lo->kernel.preload : CQ_KPOOL_PRELOAD);
        pool->work_root = lo->work_root ? strdup(lo->work_root) : NULL;
        pool->ready = calloc(opts->size ? opts->size : 1, sizeof(*pool->ready));
        pool->threads = calloc(nthreads, sizeof(*pool->threads));
        if ((lo->kernel.python && !pool->python) || !pool->preload ||
            (lo->work_root && !pool->work_root) || !pool->ready ||
            !pool->threads)
                goto oom;
        pool->local.kernel.python = pool->python;
        pool->local.kernel.preload = pool->preload;
        pool->local.kernel.work_dir = NULL;
        pool->local.work_root = pool->work_root;
        for (i = 0; i < nthreads; i++) {
                int rc =
                    pthread_create(&pool->threads[i], NULL, refill_main, pool);

                if (rc) {
                        if (errstr)
                                snprintf(errstr, errstr_size,
                                         "could not start kernel pool "
                                         "thread: %s",
                                         strerror(rc));
                        cq_kpool_destroy(&pool);
                        return NULL;
                }
                pool->nthreads++;
        }
        return pool;
oom:
        if (errstr)
                snprintf(errstr, errstr_size,
                         "could not create kernel pool: out of memory");
        cq_kpool_destroy(&pool);
        return NULL;
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
        while (!pool->stop && pool->nready == 0 && wait > 0) {
                if (pthread_cond_timedwait(&pool->cond, &pool->lock, &ts) ==
                    ETIMEDOUT)
                        break;
        }
        if (!pool->stop && pool->nready > 0) {
                kernel = pool->ready[--pool->nready];
                pool->ready[pool->nready] = NULL;
                pthread_cond_broadcast(&pool->cond); /* refill */
        } else if (!pool->stop && own) {
                pthread_mutex_unlock(&pool->lock);
                kernel =
                    start_kernel(pool, pool->run_nice, errstr, errstr_size);
                pthread_mutex_lock(&pool->lock);
                if (kernel)
                        pool->own_starts++;
                pthread_mutex_unlock(&pool->lock);
                return kernel ? cq_local_interp_wrap(&kernel,
                                                     pool->local.kernel.sandbox,
                                                     true, errstr, errstr_size)
                              : NULL;
        } else if (errstr) {
                snprintf(errstr, errstr_size,
                         "could not acquire a kernel: %s%s%s",
                         pool->stop ? "pool is stopping" : "none ready in time",
                         pool->errmsg[0] ? "; last start error: " : "",
                         pool->errmsg);
        }
        pthread_mutex_unlock(&pool->lock);
        if (!kernel)
                return NULL;
        if (pool->start_nice != pool->run_nice &&
            cq_kernel_renice(kernel, pool->run_nice) != 0)
                cq_log_kv(CQ_LOG_WARN,
                          "could not restore a pooled kernel's priority",
                          "error", strerror(errno), NULL);
        return cq_local_interp_wrap(&kernel, pool->local.kernel.sandbox, true,
                                    errstr, errstr_size);
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
        pthread_mutex_unlock(&pool->lock);
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
        for (i = 0; pool->ready && i < pool->nready; i++) {
                char dir[PATH_MAX];

                snprintf(dir, sizeof(dir), "%s",
                         cq_kernel_work_dir(pool->ready[i]));
                cq_kernel_discard(&pool->ready[i]); /* never used */
                cq_work_dir_remove(dir);
        }
        free(pool->ready);
        free(pool->threads);
        free(pool->python);
        free(pool->preload);
        free(pool->work_root);
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
        cq_local_opts_from_config(&opts->local, cfg, sandbox);
}
