/* SPDX-License-Identifier: MIT */
/* kafka_test.h - helpers for the Kafka integration suites: unique names,
 * topics, a plain producer and reader, committed offsets and watermarks,
 * one-value PostgreSQL queries, and the local services script. Every
 * helper fails the current test on an unexpected error. */
#ifndef CODERQ_KAFKA_TEST_H
#define CODERQ_KAFKA_TEST_H

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** @brief librdkafka "key", "value" pairs (NULL-terminated, borrowed:
 *         they must outlive their use; NULL: none) that every client of
 *         these helpers gets from now on, e.g. the security settings of a
 *         SASL_SSL listener. */
void kt_client_props(const char *const *kv);

/** @brief "<prefix>-<pid>-<ms>" into \p out. */
void kt_unique(const char *prefix, char *out, size_t size);

/** @brief Create \p topic with \p partitions (already existing is fine). */
void kt_create_topic(const char *brokers, const char *topic, int partitions);

/** @brief Create \p topic with \p partitions of \p replicas replicas
 *         each, a write needing \p min_isr of them in sync (0: the
 *         broker's default); already existing is fine. */
void kt_create_topic_rf(const char *brokers,
                        const char *topic,
                        int partitions,
                        int replicas,
                        int min_isr);

/** @brief A plain producer (acks=all). Destroy with kt_producer_destroy(). */
rd_kafka_t *kt_producer(const char *brokers);

/** @brief Produce one message; NULL key or value means a null one.
 *         \p hdrs (may be NULL) is taken. */
void kt_produce(rd_kafka_t *rk,
                const char *topic,
                int32_t partition,
                const void *key,
                size_t keylen,
                const void *value,
                size_t len,
                rd_kafka_headers_t *hdrs);

/** @brief Flush and assert that every message produced so far was
 *         delivered. */
void kt_flush(rd_kafka_t *rk);

void kt_producer_destroy(rd_kafka_t *rk);

/** @brief One consumed message (copies). */
typedef struct kt_msg {
        char *key; /* NULL for a null key; NUL-terminated copy */
        size_t keylen;
        char *value; /* NULL for a null value; NUL-terminated copy */
        size_t len;
        int32_t partition;
        int64_t offset;
        rd_kafka_headers_t *hdrs; /* owned copy, or NULL */
} kt_msg_t;

/**
 * @brief Read \p topic partitions 0..nparts-1 from the beginning until
 *        \p expected messages arrived or \p timeout_ms passed.
 * @returns The count; *msgsp holds them (free with kt_msgs_free()).
 */
size_t kt_consume(const char *brokers,
                  const char *topic,
                  int nparts,
                  size_t expected,
                  int timeout_ms,
                  kt_msg_t **msgsp);

void kt_msgs_free(kt_msg_t *msgs, size_t n);

/** @brief The value of header \p name as a NUL-terminated static copy, or
 *         NULL when absent. */
const char *kt_header(const kt_msg_t *msg, const char *name);

/** @brief Sum over partitions of the group's committed offsets (a
 *         partition without a commit counts 0). */
int64_t kt_committed_sum(const char *brokers,
                         const char *group,
                         const char *topic,
                         int nparts);

/** @brief Sum over partitions of the high watermarks. */
int64_t kt_high_sum(const char *brokers, const char *topic, int nparts);

/** @brief Run \p sql (one optional text parameter) and return the first
 *         column of its single row as an integer. */
long kt_pg_long(const char *dsn, const char *sql, const char *param);

/** @brief Run \p sql (one optional text parameter) and return the first
 *         column of its row (at most one) as text; NULL for no row or SQL
 *         NULL. Caller frees. */
char *kt_pg_text(const char *dsn, const char *sql, const char *param);

/** @brief Run \p sql (one optional text parameter), asserting success. */
void kt_pg_exec(const char *dsn, const char *sql, const char *param);

/** @brief scripts/services.sh \p verb; asserts exit status 0. */
void kt_services(const char *verb);

/** @brief What scripts/services.sh \p verb printed on stdout, without
 *         its last newline; asserts exit status 0. Caller frees. */
char *kt_services_output(const char *verb);

/** @brief The value of \p name in what `scripts/services.sh env \p flags`
 *         prints (export NAME='value'); fails the test when it is not
 *         there. Caller frees. */
char *kt_services_env(const char *flags, const char *name);

/**
 * @brief The completion events of \p topic (partitions 0..nparts-1),
 *        read once every outbox row of \p dsn is sent (waited for up to
 *        \p ms): asserts that they name \p njobs distinct jobs, each
 *        with one event_id however often it came. A second copy of an
 *        event is the same outbox row sent again: the at-least-once rule
 *        of docs/internals/protocols/kafka-postgres.md (a relay cut off
 *        between a delivery and its marking, a delivery that timed out
 *        after the broker may have written it).
 * @returns How many events were such copies.
 */
long kt_events_once(const char *brokers,
                    const char *topic,
                    int nparts,
                    const char *dsn,
                    long njobs,
                    int ms);

/** @brief Apply the migrations to \p dsn. */
void kt_migrate(const char *dsn);

/** @brief Sleep \p ms milliseconds. */
void kt_sleep_ms(int ms);

#endif
