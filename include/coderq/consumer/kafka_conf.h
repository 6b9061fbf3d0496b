/* SPDX-License-Identifier: MIT */
/* kafka_conf.h - the configuration of a Kafka client, the only way coderq
 * makes one: the worker's intake and producers, coderq submit and coderq
 * doctor. */
#ifndef CODERQ_KAFKA_CONF_H
#define CODERQ_KAFKA_CONF_H

#include <librdkafka/rdkafka.h>

#include "coderq/common/common.h"
#include "coderq/consumer/kafka.h"

/**
 * @brief A Kafka client's configuration. In precedence order, each later
 *        one winning: client.id (opts->client_id, else "coderq"),
 *        \p defaults (coderq's tunable defaults for this client),
 *        opts->props (the properties file, then the CODERQ_KAFKA_PROP_*
 *        variables), opts->conf, then bootstrap.servers (opts->brokers)
 *        and \p mandatory (what correctness depends on; kprops.h refuses
 *        those names from the operator). librdkafka's log goes to coderq's
 *        log (callers may set another callback).
 * @param defaults, mandatory Borrowed: NULL-terminated "key", "value"
 *        pairs, or NULL.
 * @returns Caller owns the returned value (rd_kafka_new() takes it, else
 *          rd_kafka_conf_destroy()); NULL with \p errstr filled.
 * @locality Any thread.
 */
rd_kafka_conf_t *cq_kafka_conf_new(const cq_kafka_opts_t *opts,
                                   const char *const *defaults,
                                   const char *const *mandatory,
                                   char *errstr,
                                   size_t errstr_size);

/**
 * @brief The configuration of every producer coderq makes (the worker's
 *        shared one, its progress events' one, coderq submit's):
 *        cq_kafka_conf_new() with linger.ms (opts->linger_ms) and
 *        compression.type (opts->compression, else none) as defaults,
 *        and as mandatory settings enable.idempotence=true, acks=all and
 *        message.timeout.ms (opts->message_timeout_ms). acks=all: a
 *        write is acknowledged once every in-sync replica has it, and the
 *        broker refuses it while fewer than the topic's
 *        min.insync.replicas are in sync; idempotence: the client's own
 *        retries (a leader that moved, a lost reply) neither duplicate nor
 *        reorder a partition's messages.
 * @returns As cq_kafka_conf_new().
 * @locality Any thread.
 */
rd_kafka_conf_t *cq_kafka_producer_conf_new(const cq_kafka_opts_t *opts,
                                            char *errstr,
                                            size_t errstr_size);

#endif
