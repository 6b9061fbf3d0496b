/* SPDX-License-Identifier: MIT */
/* gate.c - first come, first served admission (see gate.h). Tickets are
 * handed out in arrival order; the head of the queue gets in once fewer
 * than `width` holders are younger than hold_ms. */
#include "coderq/common/gate.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

typedef struct holder {
        uint64_t ticket;
        int64_t since_ms;
        bool used;
} holder_t;

/* Waiters sleep on the condition variable of their ticket's ring slot,
 * so an admission wakes the next in line, not every waiter. */
#define GATE_RING 64

struct cq_gate {
        pthread_mutex_t lock;
        pthread_cond_t ring[GATE_RING]; /* CLOCK_MONOTONIC */
        unsigned width;
        int64_t hold_ms;
        uint64_t next;    /* ticket of the next arrival */
        uint64_t serving; /* ticket allowed in next */
        holder_t *holders;
        cq_gate_stats_t st;
};

static int64_t mono_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

cq_gate_t *cq_gate_new(unsigned width, int64_t hold_ms)
{
        cq_gate_t *gate;
        pthread_condattr_t attr;
        size_t i;

        if (width == 0)
                return NULL;
        gate = calloc(1, sizeof(*gate));
        if (!gate)
                return NULL;
        gate->holders = calloc(width, sizeof(*gate->holders));
        if (!gate->holders) {
                free(gate);
                return NULL;
        }
        gate->width = width;
        gate->hold_ms = hold_ms > 0 ? hold_ms : 1;
        gate->st.width = width;
        gate->st.hold_ms = gate->hold_ms;
        pthread_mutex_init(&gate->lock, NULL);
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        for (i = 0; i < GATE_RING; i++)
                pthread_cond_init(&gate->ring[i], &attr);
        pthread_condattr_destroy(&attr);
        return gate;
}

void cq_gate_destroy(cq_gate_t **gatep)
{
        cq_gate_t *gate = *gatep;
        size_t i;

        if (!gate)
                return;
        for (i = 0; i < GATE_RING; i++)
                pthread_cond_destroy(&gate->ring[i]);
        pthread_mutex_destroy(&gate->lock);
        free(gate->holders);
        free(gate);
        *gatep = NULL;
}

/* A free holder entry after expiring the old ones, or NULL; *soonestp
 * gets when the oldest holder expires. Under the lock. */
static holder_t *free_entry(cq_gate_t *gate, int64_t now, int64_t *soonestp)
{
        holder_t *slot = NULL;
        unsigned i;

        *soonestp = INT64_MAX;
        for (i = 0; i < gate->width; i++) {
                holder_t *h = &gate->holders[i];

                if (h->used && now - h->since_ms >= gate->hold_ms) {
                        h->used = false;
                        gate->st.expired++;
                }
                if (!h->used) {
                        if (!slot)
                                slot = h;
                } else if (h->since_ms + gate->hold_ms < *soonestp) {
                        *soonestp = h->since_ms + gate->hold_ms;
                }
        }
        return slot;
}

uint64_t cq_gate_enter(cq_gate_t *gate)
{
        uint64_t ticket;
        int64_t arrived = mono_ms(), now = arrived, waited;
        holder_t *slot = NULL;

        pthread_mutex_lock(&gate->lock);
        ticket = gate->next++;
        for (;;) {
                int64_t soonest = INT64_MAX;

                if (ticket == gate->serving) {
                        slot = free_entry(gate, now, &soonest);
                        if (slot)
                                break;
                }
                if (soonest != INT64_MAX) {
                        struct timespec ts = {(time_t)(soonest / 1000),
                                              (long)(soonest % 1000) *
                                                  1000000L};

                        pthread_cond_timedwait(&gate->ring[ticket % GATE_RING],
                                               &gate->lock, &ts);
                } else {
                        pthread_cond_wait(&gate->ring[ticket % GATE_RING],
                                          &gate->lock);
                }
                now = mono_ms();
        }
        slot->used = true;
        slot->ticket = ticket;
        slot->since_ms = now;
        gate->serving++;
        gate->st.entered++;
        waited = now - arrived;
        if (waited > 0)
                gate->st.waited++;
        if (waited > gate->st.max_wait_ms)
                gate->st.max_wait_ms = waited;
        /* the next in line may find room too (tickets a ring apart
         * share a slot: broadcast, and they look at their turn) */
        pthread_cond_broadcast(&gate->ring[gate->serving % GATE_RING]);
        pthread_mutex_unlock(&gate->lock);
        return ticket;
}

void cq_gate_leave(cq_gate_t *gate, uint64_t ticket)
{
        unsigned i;

        pthread_mutex_lock(&gate->lock);
        for (i = 0; i < gate->width; i++) {
                holder_t *h = &gate->holders[i];

                if (h->used && h->ticket == ticket) {
                        h->used = false;
                        pthread_cond_broadcast(
                            &gate->ring[gate->serving % GATE_RING]);
                        break;
                }
        }
        pthread_mutex_unlock(&gate->lock);
}

void cq_gate_stats(cq_gate_t *gate, cq_gate_stats_t *stats)
{
        pthread_mutex_lock(&gate->lock);
        *stats = gate->st;
        stats->arrived = gate->next;
        pthread_mutex_unlock(&gate->lock);
}
