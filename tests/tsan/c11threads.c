/* SPDX-License-Identifier: MIT */
/* c11threads.c - linked into every executable of the Tsan build only.
 * librdkafka runs its threads and locks through glibc's C11 <threads.h>
 * calls, which reach glibc's pthread code directly and so bypass
 * ThreadSanitizer's interceptors: its threads then crash in TSan's
 * allocator (no thread state) and its locking is invisible. These
 * definitions preempt glibc's for the whole process and forward to the
 * pthread calls TSan intercepts; glibc's C11 types are its pthread types
 * (thrd_t is pthread_t, mtx_t and cnd_t wrap pthread_mutex_t and
 * pthread_cond_t, once_flag is pthread_once_t). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

struct start {
        thrd_start_t fn;
        void *arg;
};

static void *trampoline(void *p)
{
        struct start s = *(struct start *)p;

        free(p);
        return (void *)(intptr_t)s.fn(s.arg);
}

static int result(int err)
{
        switch (err) {
        case 0:
                return thrd_success;
        case ENOMEM:
                return thrd_nomem;
        case ETIMEDOUT:
                return thrd_timedout;
        case EBUSY:
                return thrd_busy;
        default:
                return thrd_error;
        }
}

int thrd_create(thrd_t *thr, thrd_start_t func, void *arg)
{
        struct start *s = malloc(sizeof(*s));
        int err;

        if (!s)
                return thrd_nomem;
        s->fn = func;
        s->arg = arg;
        err = pthread_create((pthread_t *)thr, NULL, trampoline, s);
        if (err)
                free(s);
        return result(err);
}

int thrd_join(thrd_t thr, int *res)
{
        void *v = NULL;
        int err = pthread_join((pthread_t)thr, &v);

        if (!err && res)
                *res = (int)(intptr_t)v;
        return result(err);
}

int thrd_detach(thrd_t thr) { return result(pthread_detach((pthread_t)thr)); }

int mtx_init(mtx_t *mtx, int type)
{
        pthread_mutexattr_t attr;
        int err;

        pthread_mutexattr_init(&attr);
        if (type & mtx_recursive)
                pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        err = pthread_mutex_init((pthread_mutex_t *)mtx, &attr);
        pthread_mutexattr_destroy(&attr);
        return result(err);
}

int mtx_lock(mtx_t *mtx)
{
        return result(pthread_mutex_lock((pthread_mutex_t *)mtx));
}

int mtx_trylock(mtx_t *mtx)
{
        return result(pthread_mutex_trylock((pthread_mutex_t *)mtx));
}

int mtx_timedlock(mtx_t *restrict mtx, const struct timespec *restrict ts)
{
        return result(pthread_mutex_timedlock((pthread_mutex_t *)mtx, ts));
}

int mtx_unlock(mtx_t *mtx)
{
        return result(pthread_mutex_unlock((pthread_mutex_t *)mtx));
}

void mtx_destroy(mtx_t *mtx) { pthread_mutex_destroy((pthread_mutex_t *)mtx); }

int cnd_init(cnd_t *cnd)
{
        return result(pthread_cond_init((pthread_cond_t *)cnd, NULL));
}

int cnd_signal(cnd_t *cnd)
{
        return result(pthread_cond_signal((pthread_cond_t *)cnd));
}

int cnd_broadcast(cnd_t *cnd)
{
        return result(pthread_cond_broadcast((pthread_cond_t *)cnd));
}

int cnd_wait(cnd_t *cnd, mtx_t *mtx)
{
        return result(
            pthread_cond_wait((pthread_cond_t *)cnd, (pthread_mutex_t *)mtx));
}

int cnd_timedwait(cnd_t *restrict cnd,
                  mtx_t *restrict mtx,
                  const struct timespec *restrict ts)
{
        return result(pthread_cond_timedwait((pthread_cond_t *)cnd,
                                             (pthread_mutex_t *)mtx, ts));
}

void cnd_destroy(cnd_t *cnd) { pthread_cond_destroy((pthread_cond_t *)cnd); }

void call_once(once_flag *flag, void (*func)(void))
{
        pthread_once((pthread_once_t *)flag, func);
}
