/* SPDX-License-Identifier: MIT */
/* relay.c - the transactional outbox to Kafka. A relay claims the rows it
 * produces (cq_store_outbox_claim(): FOR UPDATE SKIP LOCKED and a lease
 * that outlives the producer's message timeout), so the relays of a fleet
 * never produce the same row at once. Each event is capped at
 * event_max_bytes (cq_event_cap()), produced through the shared
 * idempotent producer and marked sent only after a delivery report with
 * no error. A delivery that failed for a reason a retry can fix releases
 * the row with a growing backoff; a permanent error marks it failed (and
 * logs it at error) so it no longer comes back; a retriable one is
 * retried for as long as it takes, each time after the capped backoff.
 * A duplicate remains possible when a relay dies, or loses PostgreSQL
 * past its lease, between a delivery and its marking, and when a
 * delivery times out after the broker may have written it (possibly
 * persisted): consumers dedupe on job_id / event_id. */
#include "coderq/consumer/kafka.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coderq/common/job.h"
#include "coderq/common/log.h"
#include "coderq/storage/outbox.h"
#include "coderq/common/util.h"
#include "kafka_int.h"

/* Margin of a claim over the producer's message timeout: the delivery
 * report, the reap and the marking all fit in it. */
#define RELAY_LEASE_MARGIN_MS 15000
/* Backoff of a released row: doubles per attempt up to the maximum. */
#define RELAY_BACKOFF_MS     1000
#define RELAY_BACKOFF_MAX_MS 60000
/* Rows one relay holds in flight at most (times relay_batch): the rest
 * is left to the other relays. */
#define RELAY_INFLIGHT_BATCHES 10
/* Strings kept in an event cut to its identity. */
#define EVENT_FIELD_MAX 1024

typedef struct flight {
        char event_id[37];
        char *key; /* the job, for logs */
        cq_dr_t *dr;
        bool delivered; /* acknowledged; marking it sent is pending */
        bool settled;   /* failed: released or marked failed */
        rd_kafka_resp_err_t err;
} flight_t;

struct cq_relay {
        cq_kafka_opts_t opts;
        cq_store_opts_t store_opts;
        cq_producer_t *prod; /* borrowed */
        cq_store_t *store;   /* lazily connected */
        char id[200];        /* claim token, unique per relay */
        long lease_ms;
        flight_t *v;
        size_t n, cap;
        bool pg_down;
        rd_kafka_resp_err_t last_err; /* log a refusal once, not per row */
        atomic_ullong produced, sent, failed, rejected, truncated;
        atomic_ullong claims, empty;
        atomic_ullong inflight;
        atomic_bool st_pg_down;
        atomic_bool kicked;      /* cq_relay_kick(): pump now */
        atomic_llong flush_by;   /* cq_relay_flush_by(); 0: none */
        atomic_llong st_beat_ms; /* the run loop's last round */
};

bool cq_kafka_err_permanent(int err)
{
        switch ((rd_kafka_resp_err_t)err) {
        case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_INVALID_MSG:
        case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
        case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
        case RD_KAFKA_RESP_ERR_INVALID_RECORD:
        case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
        case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
        case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
        case RD_KAFKA_RESP_ERR__BAD_MSG:
        case RD_KAFKA_RESP_ERR__INVALID_ARG:
                return true;
        default:
                return false;
        }
}

/* The largest prefix of s[0..len) of at most n bytes that ends on a UTF-8
 * character boundary. */
static size_t utf8_cut(const char *s, size_t len, size_t n)
{
        if (n >= len)
                return len;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
                n--;
        return n;
}

static char *dump_event(const json_t *doc, size_t *lenp)
{
        char *text = json_dumps(doc, JSON_COMPACT);

        if (text)
                *lenp = strlen(text);
        return text;
}

/* Where the full answer is: the results row of the job, and the command
 * that writes it to a file. */
static json_t *answer_ref(const char *job_id)
{
        json_t *ref =
            json_pack("{s:s, s:s}", "table", "results", "column", "answer");
        char cmd[CQ_JOB_ID_MAX * 2 + 64];

        if (ref && job_id && strlen(job_id) <= CQ_JOB_ID_MAX * 2) {
                snprintf(cmd, sizeof(cmd), "coderq export %s --out DIR",
                         job_id);
                if (json_object_set_new(ref, "job_id", json_string(job_id)) ||
                    json_object_set_new(ref, "command", json_string(cmd))) {
                        json_decref(ref);
                        return NULL;
                }
        }
        return ref;
}

/* Cut the answer of \p doc so the event fits in \p max: the answer is
 * replaced by its longest prefix that fits. Returns the text or NULL. */
static char *
cap_answer(json_t *doc, const char *full, size_t alen, size_t max, size_t *lenp)
{
        char *text;
        size_t base, n;
        int round;

        if (json_object_set_new(doc, "answer", json_string("")))
                return NULL;
        text = dump_event(doc, &base);
        if (!text)
                return NULL;
        free(text);
        if (base > max)
                return NULL;
        n = utf8_cut(full, alen, max - base);
        /* Escapes make the text longer than the bytes it holds: scale by
         * the answer's text per byte, then shrink by the excess (each
         * round removes at least that much). */
        for (round = 0; round < 8; round++) {
                size_t len;

                if (json_object_set_new(doc, "answer",
                                        json_stringn_nocheck(full, n)))
                        return NULL;
                text = dump_event(doc, &len);
                if (!text)
                        return NULL;
                if (len <= max) {
                        *lenp = len;
                        return text;
                }
                free(text);
                if (n == 0)
                        break;
                if (round == 0 && len > base)
                        /* The answer's text per byte so far, applied to
                         * the room there is. */
                        n = utf8_cut(full, alen,
                                     (size_t)((double)n * (double)(max - base) /
                                              (double)(len - base)));
                else
                        n = utf8_cut(full, alen,
                                     n > len - max ? n - (len - max) : 0);
        }
        return NULL;
}

/* Only the job's identity, status and figures; long strings cut. */
static char *
cap_identity(const json_t *doc, size_t event_bytes, size_t max, size_t *lenp)
{
        static const char *const keep[] = {"job_id",
                                           "task_id",
                                           "run_id",
                                           "status",
                                           "reason",
                                           "reason_code",
                                           "answer_truncated",
                                           "answer_bytes",
                                           "answer_ref",
                                           "tests",
                                           "turns",
                                           "retries",
                                           "attempt",
                                           "usage",
                                           "cost_usd",
                                           "model",
                                           "cells",
                                           "started_at",
                                           "finished_at",
                                           "duration_ms",
                                           "worker",
                                           "from_memory",
                                           "memory_source_job",
                                           "retry_of",
                                           "run_attempt"};
        json_t *small = json_object();
        char *text = NULL;
        size_t i;

        if (!small)
                return NULL;
        for (i = 0; i < CQ_ARRAY_SIZE(keep); i++) {
                json_t *v = json_object_get(doc, keep[i]);
                json_t *copy;

                if (!v)
                        continue;
                if (json_is_string(v) && strcmp(keep[i], "job_id") != 0 &&
                    json_string_length(v) > EVENT_FIELD_MAX) {
                        const char *s = json_string_value(v);

                        copy = json_stringn_nocheck(
                            s, utf8_cut(s, json_string_length(v),
                                        EVENT_FIELD_MAX));
                } else if (json_is_object(v) || json_is_array(v)) {
                        copy = json_dumpb(v, NULL, 0, JSON_COMPACT) <=
                                       EVENT_FIELD_MAX
                                   ? json_deep_copy(v)
                                   : NULL;
                        if (!copy)
                                continue;
                } else {
                        copy = json_copy(v);
                }
                if (!copy || json_object_set_new(small, keep[i], copy))
                        goto out;
        }
        if (json_object_set_new(small, "event_truncated", json_true()) ||
            json_object_set_new(small, "event_bytes",
                                json_integer((json_int_t)event_bytes)))
                goto out;
        text = dump_event(small, lenp);
        if (text && *lenp > max) {
                free(text);
                text = NULL;
        }
out:
        json_decref(small);
        return text;
}

int cq_event_cap(const char *json,
                 size_t len,
                 size_t max,
                 char **outp,
                 size_t *outlenp,
                 bool *cutp,
                 char *errstr,
                 size_t errstr_size)
{
        json_error_t jerr;
        json_t *doc, *answer;
        char *full = NULL, *text = NULL;
        size_t alen = 0;

        *outp = NULL;
        if (cutp)
                *cutp = false;
        if (len <= max) {
                text = malloc(len + 1);
                if (!text)
                        goto oom;
                memcpy(text, json, len);
                text[len] = '\0';
                *outp = text;
                *outlenp = len;
                return 0;
        }
        doc = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
        if (!json_is_object(doc)) {
                json_decref(doc);
                cq_errstr_set(errstr, errstr_size,
                              "event of %zu bytes over the cap of %zu is "
                              "not a JSON object: %s",
                              len, max, doc ? "another type" : jerr.text);
                return -1;
        }
        answer = json_object_get(doc, "answer");
        if (json_is_string(answer)) {
                json_t *job = json_object_get(doc, "job_id");

                alen = json_string_length(answer);
                full = malloc(alen + 1);
                if (!full) {
                        json_decref(doc);
                        goto oom;
                }
                memcpy(full, json_string_value(answer), alen + 1);
                if (json_object_set_new(doc, "answer_truncated", json_true()) ||
                    json_object_set_new(doc, "answer_bytes",
                                        json_integer((json_int_t)alen)) ||
                    json_object_set_new(doc, "answer_ref",
                                        answer_ref(json_string_value(job))))
                        text = NULL;
                else
                        text = cap_answer(doc, full, alen, max, outlenp);
        }
        if (!text)
                text = cap_identity(doc, len, max, outlenp);
        free(full);
        json_decref(doc);
        if (!text) {
                cq_errstr_set(errstr, errstr_size,
                              "event of %zu bytes cannot be cut under "
                              "%zu bytes",
                              len, max);
                return -1;
        }
        *outp = text;
        if (cutp)
                *cutp = true;
        return 0;
oom:
        cq_errstr_set(errstr, errstr_size,
                      "could not cap an event: out of memory");
        return -1;
}

cq_relay_t *cq_relay_new(const cq_kafka_opts_t *opts,
                         cq_producer_t *prod,
                         char *errstr,
                         size_t errstr_size)
{
        cq_relay_t *relay = calloc(1, sizeof(*relay));

        if (!relay) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create relay: out of memory");
                return NULL;
        }
        relay->opts = *opts;
        if (relay->opts.relay_batch < 1)
                relay->opts.relay_batch = 1;
        if (relay->opts.relay_interval_ms < 1)
                relay->opts.relay_interval_ms = 1;
        if (relay->opts.relay_idle_ms < relay->opts.relay_interval_ms)
                relay->opts.relay_idle_ms = relay->opts.relay_interval_ms;
        if (relay->opts.event_max_bytes < 1024)
                relay->opts.event_max_bytes = 1024;
        relay->lease_ms =
            relay->opts.relay_lease_ms > 0
                ? relay->opts.relay_lease_ms
                : (long)relay->opts.message_timeout_ms + RELAY_LEASE_MARGIN_MS;
        if (opts->store)
                relay->store_opts = *opts->store;
        else
                cq_store_opts_init(&relay->store_opts);
        relay->store_opts.reconnect_ms = opts->pg_reconnect_ms;
        relay->prod = prod;
        /* Unique per relay, also across restarts under the same worker
         * name: a claim is never mistaken for another relay's. */
        snprintf(relay->id, sizeof(relay->id), "%.120s/%ld/%llx",
                 opts->client_id ? opts->client_id : "coderq", (long)getpid(),
                 (unsigned long long)((uint64_t)cq_now_ms() ^
                                      ((uint64_t)(uintptr_t)relay << 16)));
        return relay;
}

static void flight_remove(cq_relay_t *relay, size_t i)
{
        cq_dr_put(relay->prod, &relay->v[i].dr);
        free(relay->v[i].key);
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
        stats->rejected = atomic_load(&relay->rejected);
        stats->truncated = atomic_load(&relay->truncated);
        stats->claims = atomic_load(&relay->claims);
        stats->empty = atomic_load(&relay->empty);
        stats->inflight = atomic_load(&relay->inflight);
        stats->pg_down = atomic_load(&relay->st_pg_down);
        stats->beat_ms = atomic_load(&relay->st_beat_ms);
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

/* Note the outcome of a store call; false when it failed. */
static bool store_ok(cq_relay_t *relay, cq_err_t err, const char *what)
{
        if (err == CQ_ERR_RETRIABLE) {
                set_pg_down(relay, true);
                return false;
        }
        set_pg_down(relay, false);
        if (err != CQ_OK) {
                cq_log_kv(CQ_LOG_ERROR, what, "error",
                          cq_store_errmsg(relay->store), NULL);
                return false;
        }
        return true;
}

/* A row that can never be delivered: failed for good, logged at error,
 * counted. Left claimed when PostgreSQL is away: once its claim expires
 * it is tried, and refused, again. */
static void reject(cq_relay_t *relay,
                   const char *event_id,
                   const char *key,
                   const char *error)
{
        atomic_fetch_add(&relay->rejected, 1);
        cq_log_kv(CQ_LOG_ERROR,
                  "relay: an event can never be delivered; its outbox row "
                  "is marked failed",
                  "event_id", event_id, "job_id", key, "error", error, NULL);
        if (ensure_store(relay))
                (void)store_ok(
                    relay,
                    cq_store_outbox_mark_failed(relay->store, event_id, error),
                    "relay: could not mark an event failed");
}

/* Release every settled flight that failed for a reason a retry can fix,
 * one statement per error, and drop the settled flights. A release that
 * cannot be written leaves the claim to expire. */
static void release_settled(cq_relay_t *relay)
{
        const char **ids;
        size_t i, n;

        ids = calloc(relay->n ? relay->n : 1, sizeof(*ids));
        for (;;) {
                rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
                bool any = false;

                for (i = 0, n = 0; i < relay->n; i++) {
                        flight_t *f = &relay->v[i];

                        if (!f->settled)
                                continue;
                        if (!any) {
                                err = f->err;
                                any = true;
                        }
                        if (f->err == err && ids)
                                ids[n++] = f->event_id;
                }
                if (!any)
                        break;
                if (n > 0 && ensure_store(relay))
                        (void)store_ok(relay,
                                       cq_store_outbox_release(
                                           relay->store, relay->id, ids, n,
                                           rd_kafka_err2str(err),
                                           RELAY_BACKOFF_MS,
                                           RELAY_BACKOFF_MAX_MS),
                                       "relay: could not release events");
                i = relay->n;
                while (i-- > 0)
                        if (relay->v[i].settled &&
                            (!ids || relay->v[i].err == err))
                                flight_remove(relay, i);
        }
        free(ids);
}

/* Look at every delivery in flight, then mark all the acknowledged rows
 * sent in one statement: one commit per round, not one per event, so a
 * burst of finished jobs does not hold the relay up. */
static void reap(cq_relay_t *relay)
{
        const char **ids;
        size_t i = 0, n = 0;
        bool settled = false;
        cq_err_t serr;

        while (i < relay->n) {
                flight_t *f = &relay->v[i];
                rd_kafka_resp_err_t err;
                rd_kafka_msg_status_t status;

                if (!f->delivered && !f->settled) {
                        if (!cq_dr_done(relay->prod, f->dr, &err, &status)) {
                                i++;
                                continue;
                        }
                        cq_dr_put(relay->prod, &f->dr);
                        if (err && cq_kafka_err_permanent(err)) {
                                reject(relay, f->event_id, f->key,
                                       rd_kafka_err2str(err));
                                flight_remove(relay, i);
                                continue;
                        }
                        if (err || status != RD_KAFKA_MSG_STATUS_PERSISTED) {
                                /* Includes POSSIBLY_PERSISTED: produced
                                 * again after the backoff; consumers
                                 * dedupe. */
                                cq_log_kv(CQ_LOG_WARN,
                                          "relay: delivery failed, the event "
                                          "is retried later",
                                          "event_id", f->event_id, "error",
                                          rd_kafka_err2str(err), NULL);
                                atomic_fetch_add(&relay->failed, 1);
                                f->settled = true;
                                f->err = err ? err : RD_KAFKA_RESP_ERR__FAIL;
                                settled = true;
                                i++;
                                continue;
                        }
                        f->delivered = true;
                }
                if (f->delivered)
                        n++;
                i++;
        }
        if (settled)
                release_settled(relay);
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

/* Produce one claimed row. A row that cannot be produced is rejected
 * (permanent) or kept as a settled flight, released by the caller. */
static void produce_row(cq_relay_t *relay, const cq_outbox_row_t *row)
{
        const char *topic =
            row->topic && *row->topic ? row->topic : relay->opts.topic_results;
        const char *payload = row->payload ? row->payload : "";
        rd_kafka_headers_t *hdrs;
        rd_kafka_resp_err_t err;
        char errstr[256], *capped = NULL;
        size_t len = strlen(payload);
        bool cut = false;
        flight_t *f;

        if (relay->n == relay->cap) {
                size_t cap = relay->cap ? relay->cap * 2 : 16;
                flight_t *v = realloc(relay->v, cap * sizeof(*v));

                if (!v)
                        return; /* produced once the claim expires */
                relay->v = v;
                relay->cap = cap;
        }
        if (len > relay->opts.event_max_bytes) {
                if (cq_event_cap(payload, len, relay->opts.event_max_bytes,
                                 &capped, &len, &cut, errstr,
                                 sizeof(errstr)) != 0) {
                        reject(relay, row->event_id, row->key, errstr);
                        return;
                }
                payload = capped;
                if (cut) {
                        atomic_fetch_add(&relay->truncated, 1);
                        cq_log_kv(CQ_LOG_INFO,
                                  "relay: event over the cap, answer cut",
                                  "event_id", row->event_id, "job_id", row->key,
                                  NULL);
                }
        }
        f = &relay->v[relay->n];
        memset(f, 0, sizeof(*f));
        snprintf(f->event_id, sizeof(f->event_id), "%s", row->event_id);
        f->key = row->key ? strdup(row->key) : NULL;
        f->dr = cq_dr_new(relay->prod);
        if (!f->dr || (row->key && !f->key)) {
                cq_dr_put(relay->prod, &f->dr);
                free(f->key);
                free(capped);
                return;
        }
        hdrs = rd_kafka_headers_new(1);
        rd_kafka_header_add(hdrs, "event_id", -1, row->event_id, -1);
        err = cq_producer_send(relay->prod, topic, row->key,
                               row->key ? strlen(row->key) : 0, payload, len,
                               &hdrs, f->dr);
        free(capped);
        relay->n++;
        atomic_store(&relay->inflight, relay->n);
        if (!err) {
                relay->last_err = RD_KAFKA_RESP_ERR_NO_ERROR;
                atomic_fetch_add(&relay->produced, 1);
                return;
        }
        cq_dr_put(relay->prod, &f->dr);
        if (cq_kafka_err_permanent(err)) {
                reject(relay, row->event_id, row->key, rd_kafka_err2str(err));
                flight_remove(relay, relay->n - 1);
                return;
        }
        if (err != relay->last_err)
                cq_log_kv(CQ_LOG_WARN, "relay: could not produce an event",
                          "event_id", row->event_id, "error",
                          rd_kafka_err2str(err), NULL);
        relay->last_err = err;
        atomic_fetch_add(&relay->failed, 1);
        f->settled = true;
        f->err = err;
}

/* Claim rows nobody else holds and produce them. Returns whether the
 * claim found a row (false too when it could not be made). */
static bool pump(cq_relay_t *relay)
{
        cq_outbox_t box;
        cq_err_t err;
        size_t i;
        bool settled = false, found;

        if (relay->n >=
                (size_t)relay->opts.relay_batch * RELAY_INFLIGHT_BATCHES ||
            !ensure_store(relay))
                return false;
        cq_outbox_init(&box);
        err = cq_store_outbox_claim(relay->store, relay->id,
                                    (size_t)relay->opts.relay_batch,
                                    relay->lease_ms, &box);
        atomic_fetch_add(&relay->claims, 1);
        if (!store_ok(relay, err, "relay: could not claim outbox rows"))
                return false;
        found = box.n > 0;
        if (!found)
                atomic_fetch_add(&relay->empty, 1);
        for (i = 0; i < box.n; i++)
                if (!in_flight(relay, box.v[i].event_id))
                        produce_row(relay, &box.v[i]);
        cq_outbox_release(&box);
        for (i = 0; i < relay->n; i++)
                settled = settled || relay->v[i].settled;
        if (settled)
                release_settled(relay);
        return found;
}

/* The next poll period after a poll or kick that found a row or not:
 * back to relay_interval_ms, or double, up to relay_idle_ms. A local
 * finish kicks the relay; what polls are for (rows whose finishing worker
 * died, rows written by a process with no relay, released rows whose
 * backoff ran out) is rare, and an idle fleet's relays would otherwise
 * claim five times a second each. */
static int64_t next_period(const cq_relay_t *relay, int64_t period, bool found)
{
        if (found)
                return relay->opts.relay_interval_ms;
        period *= 2;
        return period > relay->opts.relay_idle_ms ? relay->opts.relay_idle_ms
                                                  : period;
}

void cq_relay_kick(cq_relay_t *relay)
{
        cq_producer_wake(relay->prod, &relay->kicked);
}

void cq_relay_flush_by(cq_relay_t *relay, int64_t deadline_ms)
{
        atomic_store(&relay->flush_by, deadline_ms);
}

int cq_relay_run(cq_relay_t *relay, const atomic_int *stop)
{
        int64_t next = 0, deadline, by, period = relay->opts.relay_interval_ms;

        while (!atomic_load(stop)) {
                int64_t now = cq_now_ms();
                bool kicked, found;
                int wait;

                atomic_store(&relay->st_beat_ms, now);
                reap(relay);
                kicked = atomic_exchange(&relay->kicked, false);
                if (kicked || now >= next) {
                        found = pump(relay);
                        /* a kick that found nothing (its row went with
                         * an earlier claim) says nothing of the rest */
                        if (found || !kicked)
                                period = next_period(relay, period, found);
                        next = now + period;
                }
                wait = (int)(next - cq_now_ms());
                if (wait > 0)
                        cq_producer_wait(relay->prod, wait > 100 ? 100 : wait,
                                         &relay->kicked);
        }
        /* A job of this process that finished as the stop came has its
         * row sent by this relay, not left to another's next poll. */
        if (atomic_exchange(&relay->kicked, false))
                (void)pump(relay);
        /* Bounded flush: wait for the reports in flight, mark what
         * arrived; the rest keeps its claim until it expires (it may
         * still be delivered while the producer closes). */
        deadline = cq_now_ms() + relay->opts.flush_timeout_ms;
        by = atomic_load(&relay->flush_by);
        if (by && by < deadline)
                deadline = by;
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
