/* SPDX-License-Identifier: MIT */
/* kafka_int.h - what the Kafka modules of consumer/ share: setting one
 * client property (kafka_conf.c; the client configuration itself is
 * kafka_conf.h's, which coderq submit and coderq doctor use too) and
 * delivery tracking on the shared producer. Not a public header. */
#ifndef CODERQ_KAFKA_INT_H
#define CODERQ_KAFKA_INT_H

#include <librdkafka/rdkafka.h>

#include "coderq/consumer/kafka.h"
#include "coderq/consumer/kafka_conf.h"

/* Set one property; \p source (may be NULL: coderq itself) names where
 * it came from. On failure "could not set Kafka property K=V (from S):
 * reason", without the value or librdkafka's reason for a secret
 * (cq_kprops_is_secret()). */
CQ_NODISCARD int kafka_conf_set(rd_kafka_conf_t *conf,
                                const char *key,
                                const char *value,
                                const char *source,
                                char *errstr,
                                size_t errstr_size);

/* The outcome of one produced message. Reference counted: one reference
 * for the caller, one for the message in flight (dropped by the delivery
 * report, or by the producer when it gives up on its client), so a caller
 * may stop waiting at any time. Fields are read under the producer's
 * mutex, through cq_dr_done(). */
typedef struct cq_dr cq_dr_t;

/* A new record holding the caller's reference; NULL when out of memory. */
cq_dr_t *cq_dr_new(cq_producer_t *prod);

/* Drop the caller's reference; *drp becomes NULL. */
void cq_dr_put(cq_producer_t *prod, cq_dr_t **drp);

/* Whether the report arrived; then *errp and *statusp are set. */
bool cq_dr_done(cq_producer_t *prod,
                cq_dr_t *dr,
                rd_kafka_resp_err_t *errp,
                rd_kafka_msg_status_t *statusp);

/* Produce a copy of key and value to topic. *hdrsp (may point at NULL) is
 * taken, even on failure. dr: tracked (see above); NULL for best-effort
 * messages, counted in the producer's best-effort counters. Never blocks.
 * Returns RD_KAFKA_RESP_ERR_NO_ERROR or why the producer refused it (the
 * report will then never come: the in-flight reference is dropped). */
rd_kafka_resp_err_t cq_producer_send(cq_producer_t *prod,
                                     const char *topic,
                                     const void *key,
                                     size_t keylen,
                                     const void *value,
                                     size_t len,
                                     rd_kafka_headers_t **hdrsp,
                                     cq_dr_t *dr);

/* Wait until any delivery report arrives, timeout_ms passes, or *wake
 * (may be NULL) is or becomes true through cq_producer_wake(). */
void cq_producer_wait(cq_producer_t *prod,
                      int timeout_ms,
                      const atomic_bool *wake);
/* Set *flag and wake every thread in cq_producer_wait(). */
void cq_producer_wake(cq_producer_t *prod, atomic_bool *flag);

/* Best-effort messages in flight, and those whose report failed. */
long cq_producer_besteffort_inflight(cq_producer_t *prod);
uint64_t cq_producer_besteffort_failed(cq_producer_t *prod);

/* Raise a fabricated fatal error on the current client (tests: the
 * producer must then replace it). */
rd_kafka_resp_err_t cq_producer_test_fatal(cq_producer_t *prod);

#endif
