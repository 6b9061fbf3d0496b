/* SPDX-License-Identifier: MIT */
/* relay.c - the transactional outbox to Kafka. Rows are produced through
 * the shared idempotent producer and remembered while in flight (so a slow
 * broker is not flooded with copies); a row is marked sent only after a
 * delivery report with no error. Anything else leaves it unsent, and it is
 * produced again on a later round: delivery is at least once and consumers
 * dedupe on job_id / event_id. One relay per process; several relays in a
 * fleet only cause duplicates, never losses. */
#include "coderq/kafka.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/log.h"
#include "coderq/store.h"
#include "coderq/util.h"
#include "kafka_int.h"

typedef struct flight {
        char event_id[37];
        cq_dr_t *dr;
        bool delivered; /* acknowledged; marking it sent is pending */
} flight_t;

struct cq_relay {
        cq_kafka_opts_t opts;
        cq_store_opts_t store_opts;
        cq_producer_t *prod; /* borrowed */
        cq_store_t *store;   /* lazily connected */
        flight_t *v;
        size_t n, cap;
        bool pg_down;
        rd_kafka_resp_err_t last_err; /* log a refusal once, not per row */
        atomic_ullong produced, sent, failed;
        atomic_ullong inflight;
        atomic_bool st_pg_down;
        atomic_bool kicked; /* cq_relay_kick(): pump now */
};

cq_relay_t *cq_relay_new(const cq_kafka_opts_t *opts,
                         cq_producer_t *prod,
                         char *errstr,
                         size_t errstr_size)
{
        cq_relay_t *relay = calloc(1, sizeof(*relay));

        if (!relay) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not create relay: out of memory");
                return NULL;
        }
        relay->opts = *opts;
        if (relay->opts.relay_batch < 1)
                relay->opts.relay_batch = 1;
        if (relay->opts.relay_interval_ms < 1)
                relay->opts.relay_interval_ms = 1;
        if (opts->store)
                relay->store_opts = *opts->store;
        else
                cq_store_opts_init(&relay->store_opts);
        relay->store_opts.reconnect_ms = opts->pg_reconnect_ms;
        relay->prod = prod;
        return relay;
}

static void flight_remove(cq_relay_t *relay, size_t i)
{
        cq_dr_put(relay->prod, &relay->v[i].dr);
        relay->v[i] = relay->v[relay->n - 1];
        relay->n--;
        atomic_store(&relay->inflight, relay->n);
}

void cq_relay_destroy(cq_relay_t **relayp)
{
        cq_relay_t *relay = *relayp;

        if (!relay)
                return;
        while (relay->n > 0)
                flight_remove(relay, relay->n - 1);
        free(relay->v);
        cq_store_destroy(&relay->store);
        free(relay);
        *relayp = NULL;
}

void cq_relay_stats(cq_relay_t *relay, cq_relay_stats_t *stats)
{
        stats->produced = atomic_load(&relay->produced);
        stats->sent = atomic_load(&relay->sent);
        stats->failed = atomic_load(&relay->failed);
        stats->inflight = atomic_load(&relay->inflight);
        stats->pg_down = atomic_load(&relay->st_pg_down);
}

static void set_pg_down(cq_relay_t *relay, bool down)
{
        if (down != relay->pg_down)
                cq_log_json(down ? CQ_LOG_WARN : CQ_LOG_INFO, NULL,
                            down ? "relay: PostgreSQL unavailable"
                                 : "relay: PostgreSQL is back");
        relay->pg_down = down;
        atomic_store(&relay->st_pg_down, down);
}

static bool ensure_store(cq_relay_t *relay)
{
        char errstr[512];

        if (relay->store)
                return true;
        relay->store = cq_store_new(&relay->store_opts, errstr, sizeof(errstr));
        if (!relay->store) {
                if (!relay->pg_down)
                        cq_log_kv(CQ_LOG_WARN, "relay", "error", errstr, NULL);
                set_pg_down(relay, true);
                return false;
        }
        return true;
}

/* Look at every delivery in flight, then mark all the acknowledged rows
 * sent in one statement: one commit per round, not one per event, so a
 * burst of finished jobs does not hold the relay up. */
static void reap(cq_relay_t *relay)
{
        const char **ids;
        size_t i = 0, n = 0;
        cq_err_t serr;

        while (i < relay->n) {
                flight_t *f = &relay->v[i];
                rd_kafka_resp_err_t err;
                rd_kafka_msg_status_t status;

                if (!f->delivered) {
                        if (!cq_dr_done(relay->prod, f->dr, &err, &status)) {
                                i++;
                                continue;
                        }
                        if (err || status != RD_KAFKA_MSG_STATUS_PERSISTED) {
                                /* Includes POSSIBLY_PERSISTED: produced
                                 * again later; consumers dedupe. */
                                cq_log_kv(CQ_LOG_WARN,
                                          "relay: delivery failed, the event "
                                          "stays unsent",
                                          "event_id", f->event_id, "error",
                                          rd_kafka_err2str(err), NULL);
                                atomic_fetch_add(&relay->failed, 1);
                                flight_remove(relay, i);
                                continue;
                        }
                        f->delivered = true;
                        cq_dr_put(relay->prod, &f->dr);
                }
                n++;
                i++;
        }
        if (n == 0 || !ensure_store(relay))
                return; /* kept: marked once PostgreSQL is back */
        ids = calloc(n, sizeof(*ids));
        if (!ids)
                return; /* kept: marked on a later round */
        for (i = 0, n = 0; i < relay->n; i++)
                if (relay->v[i].delivered)
                        ids[n++] = relay->v[i].event_id;
        serr = cq_store_outbox_mark_sent(relay->store, ids, n);
        free(ids);
        if (serr == CQ_ERR_RETRIABLE) {
                set_pg_down(relay, true);
                return;
        }
        set_pg_down(relay, false);
        if (serr != CQ_OK)
                cq_log_kv(CQ_LOG_ERROR, "relay: could not mark events sent",
                          "error", cq_store_errmsg(relay->store), NULL);
        else
                atomic_fetch_add(&relay->sent, n);
        /* Marked, or refused for good: either way not ours to keep. */
        i = relay->n;
        while (i-- > 0)
                if (relay->v[i].delivered)
                        flight_remove(relay, i);
}

static bool in_flight(const cq_relay_t *relay, const char *event_id)
{
        size_t i;

        for (i = 0; i < relay->n; i++)
                if (strcmp(relay->v[i].event_id, event_id) == 0)
                        return true;
        return false;
}

static void produce_row(cq_relay_t *relay, const cq_outbox_row_t *row)
{
        const char *topic =
            row->topic && *row->topic ? row->topic : relay->opts.topic_results;
        rd_kafka_headers_t *hdrs;
        rd_kafka_resp_err_t err;
        flight_t *f;

        if (relay->n == relay->cap) {
                size_t cap = relay->cap ? relay->cap * 2 : 16;
                flight_t *v = realloc(relay->v, cap * sizeof(*v));

                if (!v)
                        return; /* produced on a later round */
                relay->v = v;
                relay->cap = cap;
        }
        f = &relay->v[relay->n];
        memset(f, 0, sizeof(*f));
        snprintf(f->event_id, sizeof(f->event_id), "%s", row->event_id);
        f->dr = cq_dr_new(relay->prod);
        if (!f->dr)
                return;
        hdrs = rd_kafka_headers_new(1);
        rd_kafka_header_add(hdrs, "event_id", -1, row->event_id, -1);
        err = cq_producer_send(relay->prod, topic, row->key,
                               row->key ? strlen(row->key) : 0, row->payload,
                               row->payload ? strlen(row->payload) : 0, &hdrs,
                               f->dr);
        if (err) {
                cq_dr_put(relay->prod, &f->dr);
                if (err != relay->last_err)
                        cq_log_kv(CQ_LOG_WARN,
                                  "relay: could not produce an event",
                                  "event_id", row->event_id, "error",
                                  rd_kafka_err2str(err), NULL);
                relay->last_err = err;
                atomic_fetch_add(&relay->failed, 1);
                return;
        }
        relay->last_err = RD_KAFKA_RESP_ERR_NO_ERROR;
        relay->n++;
        atomic_store(&relay->inflight, relay->n);
        atomic_fetch_add(&relay->produced, 1);
}

/* Fetch unsent rows and produce those not already in flight. */
static void pump(cq_relay_t *relay)
{
        cq_outbox_t box;
        cq_err_t err;
        size_t i;

        if (!ensure_store(relay))
                return;
        cq_outbox_init(&box);
        err = cq_store_outbox_fetch(
            relay->store, (size_t)relay->opts.relay_batch + relay->n, &box);
        if (err != CQ_OK) {
                if (err == CQ_ERR_RETRIABLE)
                        set_pg_down(relay, true);
                else
                        cq_log_kv(CQ_LOG_ERROR,
                                  "relay: could not read the "
                                  "outbox",
                                  "error", cq_store_errmsg(relay->store), NULL);
                return;
        }
        set_pg_down(relay, false);
        for (i = 0; i < box.n; i++)
                if (!in_flight(relay, box.v[i].event_id))
                        produce_row(relay, &box.v[i]);
        cq_outbox_release(&box);
}

void cq_relay_kick(cq_relay_t *relay)
{
        cq_producer_wake(relay->prod, &relay->kicked);
}

int cq_relay_run(cq_relay_t *relay, const atomic_int *stop)
{
        int64_t next = 0, deadline;

        while (!atomic_load(stop)) {
                int64_t now = cq_now_ms();
                int wait;

                reap(relay);
                if (atomic_exchange(&relay->kicked, false) || now >= next) {
                        pump(relay);
                        next = now + relay->opts.relay_interval_ms;
                }
                wait = (int)(next - cq_now_ms());
                if (wait > 0)
                        cq_producer_wait(relay->prod, wait > 100 ? 100 : wait,
                                         &relay->kicked);
        }
        /* Bounded flush: wait for the reports in flight, mark what
         * arrived; the rest stays unsent for the next run. */
        deadline = cq_now_ms() + relay->opts.flush_timeout_ms;
        for (;;) {
                reap(relay);
                if (relay->n == 0 || cq_now_ms() >= deadline)
                        break;
                cq_producer_wait(relay->prod, 50, NULL);
        }
        while (relay->n > 0)
                flight_remove(relay, relay->n - 1);
        return 0;
}
