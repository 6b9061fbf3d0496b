/* SPDX-License-Identifier: MIT */
/* producer.c - the process's one idempotent producer, shared by the intake
 * (DLQ), the relay and the events. A private thread serves delivery
 * reports and replaces the client after a fatal error; tracked messages
 * carry a reference-counted record so callers can wait or walk away. */
#include "coderq/consumer/kafka.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "kafka_int.h"

struct cq_dr {
        int refs;
        bool done;
        rd_kafka_resp_err_t err;
        rd_kafka_msg_status_t status;
        struct cq_dr *prev, *next; /* outstanding list, while in flight */
        bool listed;
};

struct cq_producer {
        cq_kafka_opts_t opts;  /* strings borrowed from the caller */
        pthread_rwlock_t lock; /* rk: read to use, write to replace */
        rd_kafka_t *rk;
        pthread_mutex_t mtx; /* dr records, cond, outstanding list */
        pthread_cond_t cond;
        struct cq_dr *outstanding;
        pthread_t thread;
        bool thread_started;
        atomic_int stop;
        atomic_long be_inflight;
        atomic_ullong be_failed;
        atomic_uint recreated;
        atomic_bool auth_failed; /* an authentication or TLS failure */
        char auth_why[512];      /* its reason; under mtx */
        atomic_llong flush_by;   /* cq_producer_flush_by(); 0: none */
};

/* Called with prod->mtx held. */
static void dr_unref_locked(cq_producer_t *prod, struct cq_dr *dr)
{
        if (--dr->refs > 0)
                return;
        if (dr->listed) {
                if (dr->prev)
                        dr->prev->next = dr->next;
                else
                        prod->outstanding = dr->next;
                if (dr->next)
                        dr->next->prev = dr->prev;
        }
        free(dr);
}

/* The message's reference ends here: record the outcome. mtx held. */
static void dr_complete_locked(cq_producer_t *prod,
                               struct cq_dr *dr,
                               rd_kafka_resp_err_t err,
                               rd_kafka_msg_status_t status)
{
        dr->done = true;
        dr->err = err;
        dr->status = status;
        if (dr->listed) {
                if (dr->prev)
                        dr->prev->next = dr->next;
                else
                        prod->outstanding = dr->next;
                if (dr->next)
                        dr->next->prev = dr->prev;
                dr->listed = false;
                dr->prev = dr->next = NULL;
        }
        dr_unref_locked(prod, dr);
}

cq_dr_t *cq_dr_new(cq_producer_t *prod)
{
        struct cq_dr *dr = calloc(1, sizeof(*dr));

        (void)prod;
        if (dr)
                dr->refs = 1;
        return dr;
}

void cq_dr_put(cq_producer_t *prod, cq_dr_t **drp)
{
        if (!*drp)
                return;
        pthread_mutex_lock(&prod->mtx);
        dr_unref_locked(prod, *drp);
        pthread_mutex_unlock(&prod->mtx);
        *drp = NULL;
}

bool cq_dr_done(cq_producer_t *prod,
                cq_dr_t *dr,
                rd_kafka_resp_err_t *errp,
                rd_kafka_msg_status_t *statusp)
{
        bool done;

        pthread_mutex_lock(&prod->mtx);
        done = dr->done;
        if (done) {
                *errp = dr->err;
                *statusp = dr->status;
        }
        pthread_mutex_unlock(&prod->mtx);
        return done;
}

/* Runs in the producer thread (rd_kafka_poll/flush). */
static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
        cq_producer_t *prod = opaque;
        struct cq_dr *dr = msg->_private;

        if (!dr) {
                atomic_fetch_sub(&prod->be_inflight, 1);
                if (msg->err)
                        atomic_fetch_add(&prod->be_failed, 1);
                return;
        }
        pthread_mutex_lock(&prod->mtx);
        dr_complete_locked(prod, dr, msg->err, rd_kafka_message_status(msg));
        pthread_cond_broadcast(&prod->cond);
        pthread_mutex_unlock(&prod->mtx);
        (void)rk;
}

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
        cq_producer_t *prod = opaque;

        (void)rk;
        if (cq_kafka_err_is_auth(err)) {
                /* Waiting cannot fix credentials or a CA: the owner stops
                 * (cq_producer_auth_failed()). The first reason wins. */
                pthread_mutex_lock(&prod->mtx);
                if (!prod->auth_why[0])
                        snprintf(prod->auth_why, sizeof(prod->auth_why), "%s",
                                 reason);
                atomic_store(&prod->auth_failed, true);
                pthread_cond_broadcast(&prod->cond);
                pthread_mutex_unlock(&prod->mtx);
        }
        /* Broker transport errors are routine during outages: the client
         * reconnects by itself. */
        cq_log_kv(err == RD_KAFKA_RESP_ERR__FATAL ? CQ_LOG_ERROR : CQ_LOG_WARN,
                  "kafka producer error", "error",
                  rd_kafka_err2name((rd_kafka_resp_err_t)err), "reason", reason,
                  NULL);
}

static rd_kafka_t *
client_new(cq_producer_t *prod, char *errstr, size_t errstr_size)
{
        rd_kafka_conf_t *conf = NULL;
        rd_kafka_t *rk = NULL;
        char reason[512];

        conf = cq_kafka_producer_conf_new(&prod->opts, errstr, errstr_size);
        if (!conf)
                goto out;
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_conf_set_error_cb(conf, on_error);
        rd_kafka_conf_set_opaque(conf, prod);
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, reason, sizeof(reason));
        if (!rk) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create Kafka producer: %s", reason);
                goto out;
        }
        conf = NULL; /* rd_kafka_t owns it now */
        /* Make the topics known now: creating a handle starts the
         * metadata lookup in the background, which the first message to
         * a new topic would otherwise wait for (half a second measured
         * for the first completion events after a start). */
        {
                const char *topics[] = {prod->opts.topic_results,
                                        prod->opts.topic_events,
                                        prod->opts.topic_dlq};
                size_t i;

                for (i = 0; i < CQ_ARRAY_SIZE(topics); i++) {
                        rd_kafka_topic_t *rkt;

                        if (!topics[i] || !*topics[i])
                                continue;
                        rkt = rd_kafka_topic_new(rk, topics[i], NULL);
                        if (rkt)
                                rd_kafka_topic_destroy(rkt);
                }
        }
out:
        if (conf)
                rd_kafka_conf_destroy(conf);
        return rk;
}

/* Purge and destroy a client; every tracked message still outstanding
 * fails with \p err (its report can no longer come). */
static void client_destroy(cq_producer_t *prod, rd_kafka_t *rk, int flush_ms)
{
        if (!rk)
                return;
        if (flush_ms > 0)
                rd_kafka_flush(rk, flush_ms);
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        /* Serve the purge reports (ERR__PURGE_*) before destroying. */
        rd_kafka_flush(rk, 1000);
        rd_kafka_destroy(rk);
        pthread_mutex_lock(&prod->mtx);
        while (prod->outstanding)
                dr_complete_locked(prod, prod->outstanding,
                                   RD_KAFKA_RESP_ERR__DESTROY,
                                   RD_KAFKA_MSG_STATUS_NOT_PERSISTED);
        pthread_cond_broadcast(&prod->cond);
        pthread_mutex_unlock(&prod->mtx);
}

static void *producer_thread(void *arg)
{
        cq_producer_t *prod = arg;

        while (!atomic_load(&prod->stop)) {
                char reason[512];
                rd_kafka_resp_err_t fatal;
                rd_kafka_t *fresh;

                pthread_rwlock_rdlock(&prod->lock);
                rd_kafka_poll(prod->rk, 100);
                fatal = rd_kafka_fatal_error(prod->rk, reason, sizeof(reason));
                pthread_rwlock_unlock(&prod->lock);
                if (!fatal)
                        continue;
                cq_log_kv(CQ_LOG_ERROR,
                          "kafka producer hit a fatal error: "
                          "recreating it",
                          "error", rd_kafka_err2name(fatal), "reason", reason,
                          NULL);
                fresh = client_new(prod, reason, sizeof(reason));
                if (!fresh) {
                        struct timespec ts = {1, 0};

                        cq_log_kv(CQ_LOG_ERROR,
                                  "could not recreate the kafka producer",
                                  "reason", reason, NULL);
                        nanosleep(&ts, NULL);
                        continue;
                }
                pthread_rwlock_wrlock(&prod->lock);
                client_destroy(prod, prod->rk, 0);
                prod->rk = fresh;
                pthread_rwlock_unlock(&prod->lock);
                atomic_fetch_add(&prod->recreated, 1);
        }
        return NULL;
}

cq_producer_t *
cq_producer_new(const cq_kafka_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_producer_t *prod = calloc(1, sizeof(*prod));
        int err;

        if (!prod) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create producer: out of memory");
                return NULL;
        }
        prod->opts = *opts;
        pthread_rwlock_init(&prod->lock, NULL);
        pthread_mutex_init(&prod->mtx, NULL);
        pthread_cond_init(&prod->cond, NULL);
        prod->rk = client_new(prod, errstr, errstr_size);
        if (!prod->rk)
                goto fail;
        if ((err = pthread_create(&prod->thread, NULL, producer_thread,
                                  prod)) != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start producer thread: %s",
                              strerror(err));
                goto fail;
        }
        prod->thread_started = true;
        return prod;
fail:
        cq_producer_destroy(&prod);
        return NULL;
}

void cq_producer_flush_by(cq_producer_t *prod, int64_t deadline_ms)
{
        atomic_store(&prod->flush_by, deadline_ms);
}

/* The flush of cq_producer_destroy(): flush_timeout_ms, cut short by
 * cq_producer_flush_by(); none for a client the broker refuses, which
 * can deliver nothing. */
static int destroy_flush_ms(cq_producer_t *prod)
{
        int64_t by = atomic_load(&prod->flush_by), left;

        if (atomic_load(&prod->auth_failed))
                return 0;
        if (!by)
                return prod->opts.flush_timeout_ms;
        left = by - cq_now_ms();
        return left <= 0 ? 0
               : left < prod->opts.flush_timeout_ms
                   ? (int)left
                   : prod->opts.flush_timeout_ms;
}

void cq_producer_destroy(cq_producer_t **prodp)
{
        cq_producer_t *prod = *prodp;

        if (!prod)
                return;
        if (prod->thread_started) {
                atomic_store(&prod->stop, 1);
                pthread_join(prod->thread, NULL);
        }
        client_destroy(prod, prod->rk, destroy_flush_ms(prod));
        pthread_cond_destroy(&prod->cond);
        pthread_mutex_destroy(&prod->mtx);
        pthread_rwlock_destroy(&prod->lock);
        free(prod);
        *prodp = NULL;
}

bool cq_producer_auth_failed(cq_producer_t *prod, char *why, size_t why_size)
{
        bool failed = atomic_load(&prod->auth_failed);

        if (failed && why) {
                pthread_mutex_lock(&prod->mtx);
                snprintf(why, why_size, "%s", prod->auth_why);
                pthread_mutex_unlock(&prod->mtx);
        }
        return failed;
}

unsigned cq_producer_recreated(cq_producer_t *prod)
{
        return atomic_load(&prod->recreated);
}

rd_kafka_resp_err_t cq_producer_send(cq_producer_t *prod,
                                     const char *topic,
                                     const void *key,
                                     size_t keylen,
                                     const void *value,
                                     size_t len,
                                     rd_kafka_headers_t **hdrsp,
                                     cq_dr_t *dr)
{
        rd_kafka_headers_t *hdrs = *hdrsp;
        rd_kafka_resp_err_t err;

        *hdrsp = NULL;
        if (dr) {
                /* The in-flight reference, listed so that a client replaced
                 * or destroyed before the report still completes it. */
                pthread_mutex_lock(&prod->mtx);
                dr->refs++;
                dr->listed = true;
                dr->prev = NULL;
                dr->next = prod->outstanding;
                if (dr->next)
                        dr->next->prev = dr;
                prod->outstanding = dr;
                pthread_mutex_unlock(&prod->mtx);
        } else {
                atomic_fetch_add(&prod->be_inflight, 1);
        }
        pthread_rwlock_rdlock(&prod->lock);
        if (hdrs)
                err = rd_kafka_producev(
                    prod->rk, RD_KAFKA_V_TOPIC(topic),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_KEY((void *)(uintptr_t)key, keylen),
                    RD_KAFKA_V_VALUE((void *)(uintptr_t)value, len),
                    RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_OPAQUE(dr),
                    RD_KAFKA_V_END);
        else
                err = rd_kafka_producev(
                    prod->rk, RD_KAFKA_V_TOPIC(topic),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_KEY((void *)(uintptr_t)key, keylen),
                    RD_KAFKA_V_VALUE((void *)(uintptr_t)value, len),
                    RD_KAFKA_V_OPAQUE(dr), RD_KAFKA_V_END);
        pthread_rwlock_unlock(&prod->lock);
        if (!err)
                return err; /* the headers belong to the message now */
        if (hdrs)
                rd_kafka_headers_destroy(hdrs);
        if (dr) {
                pthread_mutex_lock(&prod->mtx);
                dr_complete_locked(prod, dr, err,
                                   RD_KAFKA_MSG_STATUS_NOT_PERSISTED);
                pthread_mutex_unlock(&prod->mtx);
        } else {
                atomic_fetch_sub(&prod->be_inflight, 1);
        }
        return err;
}

/* Produce one message of cq_producer_deliver(), waiting while the local
 * queue is full. */
static rd_kafka_resp_err_t deliver_one(cq_producer_t *prod,
                                       const char *topic,
                                       cq_kafka_msg_t *msg,
                                       cq_dr_t *dr)
{
        rd_kafka_headers_t *hdrs = NULL;
        rd_kafka_resp_err_t err;

        for (;;) {
                err = cq_producer_send(prod, topic, msg->key, strlen(msg->key),
                                       msg->value, msg->len, &hdrs, dr);
                if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL ||
                    atomic_load(&prod->auth_failed))
                        return err;
                cq_producer_wait(prod, 100, NULL);
        }
}

int cq_producer_deliver(cq_producer_t *prod,
                        const char *topic,
                        cq_kafka_msg_t *msgs,
                        size_t n,
                        int64_t wait_ms,
                        char *errstr,
                        size_t errstr_size)
{
        cq_dr_t **drs = calloc(n ? n : 1, sizeof(*drs));
        size_t i, first;
        int64_t deadline;
        int rc = -1;

        if (!drs) {
                cq_errstr_set(errstr, errstr_size,
                              "could not produce: out of memory");
                return -1;
        }
        for (i = 0; i < n; i++)
                if (!(drs[i] = cq_dr_new(prod))) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not produce: out of memory");
                        goto out;
                }
        for (i = 0; i < n; i++) {
                msgs[i].err = RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
                if (!atomic_load(&prod->auth_failed))
                        msgs[i].err =
                            deliver_one(prod, topic, &msgs[i], drs[i]);
        }
        /* Reports come mostly in order: wait on the first message still
         * pending, so the whole wait is one pass over the batch. */
        deadline = cq_now_ms() + wait_ms;
        for (first = 0; first < n;) {
                rd_kafka_resp_err_t err;
                rd_kafka_msg_status_t status;

                if (cq_dr_done(prod, drs[first], &err, &status)) {
                        msgs[first].err = err;
                        cq_dr_put(prod, &drs[first]);
                        first++;
                        continue;
                }
                if (atomic_load(&prod->auth_failed) || cq_now_ms() >= deadline)
                        break;
                cq_producer_wait(prod, 500, NULL);
        }
        for (i = first; i < n; i++) {
                rd_kafka_resp_err_t err;
                rd_kafka_msg_status_t status;

                if (cq_dr_done(prod, drs[i], &err, &status)) {
                        msgs[i].err = err;
                        cq_dr_put(prod, &drs[i]);
                }
        }
        if (cq_producer_auth_failed(prod, errstr, errstr_size)) {
                for (i = 0; i < n; i++)
                        if (drs[i])
                                msgs[i].err = RD_KAFKA_RESP_ERR__AUTHENTICATION;
        } else {
                for (i = 0; i < n; i++)
                        if (drs[i])
                                msgs[i].err = RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
                rc = 0;
        }
out:
        for (i = 0; i < n; i++)
                cq_dr_put(prod, &drs[i]);
        free(drs);
        return rc;
}

const char *cq_kafka_err_str(int err)
{
        return rd_kafka_err2str((rd_kafka_resp_err_t)err);
}

void cq_producer_wait(cq_producer_t *prod,
                      int timeout_ms,
                      const atomic_bool *wake)
{
        struct timespec ts;

        cq_abstime_in(&ts, timeout_ms);
        /* The flag is read under the mutex that cq_producer_wake() takes
         * to broadcast: a wake-up cannot fall between check and wait. */
        pthread_mutex_lock(&prod->mtx);
        if (!wake || !atomic_load(wake))
                pthread_cond_timedwait(&prod->cond, &prod->mtx, &ts);
        pthread_mutex_unlock(&prod->mtx);
}

void cq_producer_wake(cq_producer_t *prod, atomic_bool *flag)
{
        pthread_mutex_lock(&prod->mtx);
        atomic_store(flag, true);
        pthread_cond_broadcast(&prod->cond);
        pthread_mutex_unlock(&prod->mtx);
}

long cq_producer_besteffort_inflight(cq_producer_t *prod)
{
        return atomic_load(&prod->be_inflight);
}

uint64_t cq_producer_besteffort_failed(cq_producer_t *prod)
{
        return atomic_load(&prod->be_failed);
}

rd_kafka_resp_err_t cq_producer_test_fatal(cq_producer_t *prod)
{
        rd_kafka_resp_err_t err;

        pthread_rwlock_rdlock(&prod->lock);
        err = rd_kafka_test_fatal_error(
            prod->rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
            "fabricated by a test");
        pthread_rwlock_unlock(&prod->lock);
        return err;
}
