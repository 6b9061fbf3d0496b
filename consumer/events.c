/* SPDX-License-Identifier: MIT */
/* events.c - best-effort progress events for UIs. A call never waits for
 * the network: the event is copied into the shared producer's queue, or
 * dropped and counted when too many are in flight. seq counts per job in
 * this process (a small table under a mutex, bounded: the least recently
 * used job is forgotten first), so a consumer can order a job's events
 * and see gaps. */
#include "coderq/consumer/kafka.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"
#include "kafka_int.h"

#define SEQ_TABLE_MAX 4096

typedef struct seq_entry {
        char *job_id;
        int64_t seq;
        uint64_t used; /* last use, for eviction */
} seq_entry_t;

struct cq_events {
        cq_kafka_opts_t opts;
        cq_producer_t *prod; /* borrowed */
        pthread_mutex_t mtx; /* the seq table */
        seq_entry_t *v;
        size_t n, cap;
        uint64_t clock;
        atomic_ullong published, dropped;
};

cq_events_t *cq_events_new(const cq_kafka_opts_t *opts,
                           cq_producer_t *prod,
                           char *errstr,
                           size_t errstr_size)
{
        cq_events_t *events = calloc(1, sizeof(*events));

        if (!events) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create events: out of memory");
                return NULL;
        }
        events->opts = *opts;
        events->prod = prod;
        pthread_mutex_init(&events->mtx, NULL);
        return events;
}

void cq_events_destroy(cq_events_t **eventsp)
{
        cq_events_t *events = *eventsp;
        size_t i;

        if (!events)
                return;
        for (i = 0; i < events->n; i++)
                free(events->v[i].job_id);
        free(events->v);
        pthread_mutex_destroy(&events->mtx);
        free(events);
        *eventsp = NULL;
}

void cq_events_stats(cq_events_t *events, cq_events_stats_t *stats)
{
        stats->published = atomic_load(&events->published);
        stats->dropped = atomic_load(&events->dropped);
        stats->failed = cq_producer_besteffort_failed(events->prod);
}

/* The next seq of \p job_id (from 1); 0 when out of memory. */
static int64_t next_seq(cq_events_t *events, const char *job_id, bool forget)
{
        size_t i, oldest = 0;
        int64_t seq = 0;

        pthread_mutex_lock(&events->mtx);
        events->clock++;
        for (i = 0; i < events->n; i++)
                if (strcmp(events->v[i].job_id, job_id) == 0)
                        break;
        if (i == events->n) {
                char *copy = strdup(job_id);

                if (!copy)
                        goto out;
                if (events->n == SEQ_TABLE_MAX) {
                        for (i = 1; i < events->n; i++)
                                if (events->v[i].used < events->v[oldest].used)
                                        oldest = i;
                        free(events->v[oldest].job_id);
                        events->v[oldest] = events->v[--events->n];
                }
                if (events->n == events->cap) {
                        size_t cap = events->cap ? events->cap * 2 : 16;
                        seq_entry_t *v = realloc(events->v, cap * sizeof(*v));

                        if (!v) {
                                free(copy);
                                goto out;
                        }
                        events->v = v;
                        events->cap = cap;
                }
                i = events->n++;
                events->v[i].job_id = copy;
                events->v[i].seq = 0;
        }
        events->v[i].used = events->clock;
        seq = ++events->v[i].seq;
        if (forget) {
                free(events->v[i].job_id);
                events->v[i] = events->v[--events->n];
        }
out:
        pthread_mutex_unlock(&events->mtx);
        return seq;
}

int cq_events_publish(cq_events_t *events,
                      const char *job_id,
                      const char *type,
                      const json_t *data)
{
        json_t *event = NULL;
        char *text = NULL, ts[40];
        rd_kafka_headers_t *hdrs = NULL;
        int64_t seq;
        int rc = -1;

        if (!job_id || !*job_id || !type || !*type)
                goto out;
        if (cq_producer_besteffort_inflight(events->prod) >=
            events->opts.events_queue_max)
                goto out;
        seq = next_seq(events, job_id, strcmp(type, "job.finished") == 0);
        if (seq == 0)
                goto out;
        cq_iso8601_now(ts, sizeof(ts));
        event = json_pack("{s:s, s:I, s:s, s:s}", "job_id", job_id, "seq",
                          (json_int_t)seq, "ts", ts, "type", type);
        if (!event)
                goto out;
        /* The caller's members never override the envelope. */
        if (json_is_object(data) &&
            json_object_update_missing(event, (json_t *)(uintptr_t)data))
                goto out;
        text = json_dumps(event, JSON_COMPACT);
        if (!text)
                goto out;
        if (cq_producer_send(events->prod, events->opts.topic_events, job_id,
                             strlen(job_id), text, strlen(text), &hdrs,
                             NULL) != RD_KAFKA_RESP_ERR_NO_ERROR)
                goto out;
        rc = 0;
out:
        if (rc == 0)
                atomic_fetch_add(&events->published, 1);
        else
                atomic_fetch_add(&events->dropped, 1);
        free(text);
        json_decref(event);
        return rc;
}
