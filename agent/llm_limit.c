/* SPDX-License-Identifier: MIT */
/* llm_limit.c - the request rate every LLM client of a worker shares, per
 * provider and model: a token bucket whose rate is cut on 429/529 and
 * grows back slowly on success (AIMD), with Retry-After holding every
 * slot of the model. One mutex and one condition variable guard it all;
 * waits are bounded by the caller's deadline and see its cancel flag. */
#include "coderq/agent/llm.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coderq/common/util.h"
#include "llm_int.h"

#define MAX_MODELS    256  /* further models go unlimited */
#define CUT           0.95 /* the rate after a 429, times the measured */
#define GROWTH        0.02 /* per success: rate += GROWTH, i.e. 2%/s */
#define MIN_RATE      1.0  /* requests/s */
#define WINDOW_MS     1000 /* success-rate measurement window */
#define RING          4096 /* successes remembered per model */
#define WAIT_SLICE_MS 100  /* re-check the cancel flag this often */

typedef struct model {
        char *key;
        double rate;     /* requests/s; 0: unlimited */
        double tokens;   /* bucket level, at most burst() */
        int64_t fill_ms; /* when tokens were last topped up */
        int64_t paused_until_ms;
        int64_t last_cut_ms; /* replies to requests sent before: no cut */
        bool probing;        /* no measure yet: grow fast */
        int64_t *ring;       /* times of the last successes, RING of them */
        size_t ring_next;
} model_t;

struct cq_llm_limiter {
        pthread_mutex_t lock;
        pthread_cond_t cond;
        double rate_max;
        model_t models[MAX_MODELS];
        size_t nmodels;
        int64_t cuts;
        int64_t waited_ms;
};

cq_llm_limiter_t *cq_llm_limiter_new(double rate_max)
{
        cq_llm_limiter_t *lim = calloc(1, sizeof(*lim));
        pthread_condattr_t attr;

        if (!lim)
                return NULL;
        lim->rate_max = rate_max > 0 ? rate_max : 0;
        if (pthread_condattr_init(&attr) != 0) {
                free(lim);
                return NULL;
        }
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (pthread_cond_init(&lim->cond, &attr) != 0) {
                pthread_condattr_destroy(&attr);
                free(lim);
                return NULL;
        }
        pthread_condattr_destroy(&attr);
        pthread_mutex_init(&lim->lock, NULL);
        return lim;
}

void cq_llm_limiter_destroy(cq_llm_limiter_t **limp)
{
        cq_llm_limiter_t *lim = *limp;
        size_t i;

        if (!lim)
                return;
        for (i = 0; i < lim->nmodels; i++) {
                free(lim->models[i].key);
                free(lim->models[i].ring);
        }
        pthread_cond_destroy(&lim->cond);
        pthread_mutex_destroy(&lim->lock);
        free(lim);
        *limp = NULL;
}

void cq_llm_limiter_stats(cq_llm_limiter_t *lim,
                          int64_t *cutsp,
                          int64_t *waited_msp)
{
        pthread_mutex_lock(&lim->lock);
        if (cutsp)
                *cutsp = lim->cuts;
        if (waited_msp)
                *waited_msp = lim->waited_ms;
        pthread_mutex_unlock(&lim->lock);
}

/* The model's state, created on first use; NULL when the table is full
 * or out of memory (that model then goes unlimited). Under the lock. */
static model_t *find(cq_llm_limiter_t *lim, const char *key, bool create)
{
        size_t i;
        model_t *m;

        for (i = 0; i < lim->nmodels; i++)
                if (strcmp(lim->models[i].key, key) == 0)
                        return &lim->models[i];
        if (!create || lim->nmodels == MAX_MODELS)
                return NULL;
        m = &lim->models[lim->nmodels];
        memset(m, 0, sizeof(*m));
        m->key = strdup(key);
        m->ring = calloc(RING, sizeof(*m->ring));
        if (!m->key || !m->ring) {
                free(m->key);
                free(m->ring);
                return NULL;
        }
        m->rate = lim->rate_max;
        m->tokens = 1;
        m->fill_ms = cq_now_ms();
        lim->nmodels++;
        return m;
}

double cq_llm_limiter_rate(cq_llm_limiter_t *lim, const char *key)
{
        model_t *m;
        double rate = 0;

        pthread_mutex_lock(&lim->lock);
        m = find(lim, key, false);
        if (m)
                rate = m->rate;
        pthread_mutex_unlock(&lim->lock);
        return rate;
}

/* A small bucket: requests leave evenly spaced rather than in bursts a
 * server's own bucket would refuse. */
static double burst(const model_t *m)
{
        double b = m->rate * 0.05;

        return b < 1 ? 1 : b;
}

static void refill(model_t *m, int64_t now)
{
        if (m->rate > 0 && now > m->fill_ms) {
                m->tokens += m->rate * (double)(now - m->fill_ms) / 1000.0;
                if (m->tokens > burst(m))
                        m->tokens = burst(m);
        }
        m->fill_ms = now;
}

static void timed_wait(cq_llm_limiter_t *lim, int64_t ms)
{
        struct timespec ts;

        if (ms > WAIT_SLICE_MS)
                ms = WAIT_SLICE_MS;
        if (ms < 1)
                ms = 1;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&lim->cond, &lim->lock, &ts);
}

int llm_limiter_acquire(cq_llm_limiter_t *lim,
                        const char *key,
                        int64_t deadline_ms,
                        const atomic_int *cancel,
                        int64_t *needp)
{
        int64_t start = cq_now_ms(), now, need;
        model_t *m;
        int rc = 0;

        *needp = 0;
        pthread_mutex_lock(&lim->lock);
        for (;;) {
                m = find(lim, key, true);
                if (!m)
                        break;
                now = cq_now_ms();
                if (cancel && atomic_load(cancel)) {
                        rc = -1;
                        break;
                }
                if (now < m->paused_until_ms) {
                        need = m->paused_until_ms - now;
                } else {
                        refill(m, now);
                        if (m->rate <= 0)
                                break;
                        if (m->tokens >= 1) {
                                m->tokens -= 1;
                                break;
                        }
                        need =
                            (int64_t)((1 - m->tokens) * 1000.0 / m->rate) + 1;
                }
                if (now + need > deadline_ms) {
                        *needp = need;
                        rc = 1;
                        break;
                }
                timed_wait(lim, need);
        }
        lim->waited_ms += cq_now_ms() - start;
        pthread_mutex_unlock(&lim->lock);
        return rc;
}

/* Successes in the last second: what the server let through, the best
 * guess of its limit (a low one while the model is new). */
static double measured(const model_t *m, int64_t now)
{
        size_t i, n = 0;

        for (i = 0; i < RING; i++)
                if (m->ring[i] && now - m->ring[i] < WINDOW_MS)
                        n++;
        return (double)n * 1000.0 / WINDOW_MS;
}

void llm_limiter_report(cq_llm_limiter_t *lim,
                        const char *key,
                        int64_t sent_ms,
                        enum llm_outcome outcome,
                        int64_t retry_after_ms)
{
        int64_t now = cq_now_ms();
        model_t *m;

        if (outcome == LLM_OUTCOME_NEUTRAL)
                return;
        pthread_mutex_lock(&lim->lock);
        m = find(lim, key, true);
        if (!m)
                goto out;
        if (outcome == LLM_OUTCOME_OK) {
                m->ring[m->ring_next] = now;
                m->ring_next = (m->ring_next + 1) % RING;
                if (m->rate > 0) {
                        m->rate += m->probing ? 1.0 : GROWTH;
                        if (lim->rate_max > 0 && m->rate > lim->rate_max)
                                m->rate = lim->rate_max;
                }
                goto out;
        }
        /* 429 or 529 */
        if (retry_after_ms > 0 && now + retry_after_ms > m->paused_until_ms)
                m->paused_until_ms = now + retry_after_ms;
        if (sent_ms >= m->last_cut_ms) {
                double base = m->rate > 0 ? m->rate : measured(m, now);
                double got = measured(m, now);

                /* What got through is the better guess of the server's
                 * limit than a rate we never reached. */
                if (got > 0 && got < base)
                        base = got;
                m->probing = base <= 0;
                m->rate = base > 0 ? base * CUT : MIN_RATE;
                if (m->rate < MIN_RATE)
                        m->rate = MIN_RATE;
                if (lim->rate_max > 0 && m->rate > lim->rate_max)
                        m->rate = lim->rate_max;
                m->tokens = 0;
                m->fill_ms =
                    now > m->paused_until_ms ? now : m->paused_until_ms;
                m->last_cut_ms = now;
                lim->cuts++;
        }
out:
        pthread_cond_broadcast(&lim->cond);
        pthread_mutex_unlock(&lim->lock);
}
