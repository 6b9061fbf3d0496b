/* SPDX-License-Identifier: MIT */
/* judges.c - judging interpreters kept between runs of the same test
 * code (judges.h). A judge handed back is wrapped in a record of its
 * own (its runs and when it was kept), which stays with it while a run
 * uses it, so that the bound on its runs holds across takes. */
#include "coderq/backend/judges.h"

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"

/* a key's length at most, with its NUL (cq_judge_key()'s are 66) */
#define KEY_MAX 80

typedef struct kept {
        cq_interp_proc_t base; /* first: what takers see */
        cq_interp_proc_t *inner;
        unsigned runs;
} kept_t;

typedef struct idle {
        char key[KEY_MAX];
        kept_t *judge;
        int64_t since_ms;
} idle_t;

struct cq_judges {
        pthread_mutex_t lock;
        idle_t *idle; /* oldest first */
        size_t nidle, max;
        int64_t idle_ms;
        unsigned runs_max;
        cq_judges_stats_t st;
};

static void kept_destroy(cq_interp_proc_t *base)
{
        kept_t *k = (kept_t *)base;

        k->inner->destroy(k->inner);
        free(k);
}

cq_judges_t *cq_judges_new(size_t max, int64_t idle_ms, unsigned runs_max)
{
        cq_judges_t *j = calloc(1, sizeof(*j));

        if (!j)
                return NULL;
        if (max > 0) {
                j->idle = calloc(max, sizeof(*j->idle));
                if (!j->idle) {
                        free(j);
                        return NULL;
                }
        }
        pthread_mutex_init(&j->lock, NULL);
        j->max = max;
        j->idle_ms = idle_ms;
        j->runs_max = runs_max;
        return j;
}

/* Entry \p i out of the list (lock held); its judge is returned. */
static kept_t *unlist(cq_judges_t *j, size_t i)
{
        kept_t *k = j->idle[i].judge;

        memmove(&j->idle[i], &j->idle[i + 1],
                (j->nidle - i - 1) * sizeof(*j->idle));
        j->nidle--;
        return k;
}

/* Whether a waiting judge is as it was kept: nothing to read from it
 * (it writes only when asked), and both its pipes open. */
static bool waiting(const kept_t *k)
{
        struct pollfd p[2] = {{k->base.from_fd, POLLIN, 0},
                              {k->base.to_fd, 0, 0}};

        if (poll(p, 2, 0) < 0)
                return false;
        return p[0].revents == 0 && p[1].revents == 0;
}

cq_interp_proc_t *cq_judges_take(cq_judges_t *j, const char *key)
{
        kept_t *k = NULL;
        size_t i;

        if (!j || !key || !*key)
                return NULL;
        for (;;) {
                pthread_mutex_lock(&j->lock);
                k = NULL;
                for (i = j->nidle; i-- > 0;)
                        if (strcmp(j->idle[i].key, key) == 0) {
                                k = unlist(j, i);
                                break;
                        }
                if (k && waiting(k)) {
                        j->st.taken++;
                        pthread_mutex_unlock(&j->lock);
                        return &k->base;
                }
                if (k)
                        j->st.dropped++;
                pthread_mutex_unlock(&j->lock);
                if (!k)
                        return NULL;
                k->base.destroy(&k->base);
        }
}

bool cq_judges_keep(cq_judges_t *j, const char *key, cq_interp_proc_t *proc)
{
        kept_t *k, *evicted = NULL;
        size_t len = key ? strlen(key) : 0;

        if (!j || j->max == 0 || !proc || len == 0 || len >= KEY_MAX)
                return false;
        if (proc->destroy == kept_destroy) {
                k = (kept_t *)proc;
        } else {
                k = calloc(1, sizeof(*k));
                if (!k)
                        return false;
                k->inner = proc;
                k->base.to_fd = proc->to_fd;
                k->base.from_fd = proc->from_fd;
                k->base.destroy = kept_destroy;
        }
        if (++k->runs >= j->runs_max) {
                /* used up: the caller ends it, as what it handed us */
                if (k->inner == proc)
                        free(k);
                return false;
        }
        pthread_mutex_lock(&j->lock);
        if (j->nidle == j->max) {
                evicted = unlist(j, 0);
                j->st.dropped++;
        }
        memcpy(j->idle[j->nidle].key, key, len + 1);
        j->idle[j->nidle].judge = k;
        j->idle[j->nidle].since_ms = cq_now_ms();
        j->nidle++;
        j->st.kept++;
        pthread_mutex_unlock(&j->lock);
        if (evicted)
                evicted->base.destroy(&evicted->base);
        return true;
}

size_t cq_judges_expire(cq_judges_t *j, int64_t now_ms)
{
        kept_t *ended[16];
        size_t n = 0, total = 0, i;

        if (!j)
                return 0;
        do {
                pthread_mutex_lock(&j->lock);
                n = 0;
                for (i = 0; i < j->nidle && n < sizeof(ended) / sizeof(*ended);)
                        if (now_ms - j->idle[i].since_ms >= j->idle_ms)
                                ended[n++] = unlist(j, i);
                        else
                                i++;
                j->st.dropped += n;
                pthread_mutex_unlock(&j->lock);
                for (i = 0; i < n; i++)
                        ended[i]->base.destroy(&ended[i]->base);
                total += n;
        } while (n == sizeof(ended) / sizeof(*ended));
        return total;
}

void cq_judges_stats(cq_judges_t *j, cq_judges_stats_t *st)
{
        memset(st, 0, sizeof(*st));
        if (!j)
                return;
        pthread_mutex_lock(&j->lock);
        *st = j->st;
        st->idle = j->nidle;
        pthread_mutex_unlock(&j->lock);
}

void cq_judges_destroy(cq_judges_t **jp)
{
        cq_judges_t *j = *jp;

        if (!j)
                return;
        *jp = NULL;
        while (j->nidle > 0) {
                kept_t *k = unlist(j, j->nidle - 1);

                k->base.destroy(&k->base);
        }
        pthread_mutex_destroy(&j->lock);
        free(j->idle);
        free(j);
}
