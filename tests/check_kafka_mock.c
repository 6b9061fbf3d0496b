/* SPDX-License-Identifier: MIT */
/* check_kafka_mock.c - the consumer discipline of
 * docs/internals/protocols/kafka-postgres.md against librdkafka's mock cluster
 * (no broker needed): store offset + 1 after processing, and a checked
 * synchronous commit before close, which fails visibly when the broker rejects
 * the OffsetCommit (close() alone would hide it). */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/util.h"

#define TOPIC                "cq-mock"
#define N_PARTITIONS         2
#define N_MESSAGES           20
#define APIKEY_OFFSET_COMMIT 8

static void
quiet_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        (void)rk;
        (void)level;
        (void)fac;
        (void)buf;
}

static rd_kafka_t *client(rd_kafka_type_t type, const char *const *kv)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char errstr[512];
        rd_kafka_t *rk;
        size_t i;

        rd_kafka_conf_set_log_cb(conf, quiet_log);
        for (i = 0; kv[i]; i += 2)
                ck_assert_msg(rd_kafka_conf_set(conf, kv[i], kv[i + 1], errstr,
                                                sizeof(errstr)) ==
                                  RD_KAFKA_CONF_OK,
                              "could not set %s: %s", kv[i], errstr);
        rk = rd_kafka_new(type, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk != NULL, "could not create client: %s", errstr);
        return rk; /* rd_kafka_t owns conf now */
}

static int delivered_ok;

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque)
{
        (void)rk;
        (void)opaque;
        ck_assert_msg(!rkm->err, "delivery failed: %s",
                      rd_kafka_err2str(rkm->err));
        delivered_ok++;
}

START_TEST(failed_offset_commit_is_reported_by_sync_commit)
{
        rd_kafka_conf_t *pconf;
        rd_kafka_t *producer, *consumer;
        rd_kafka_mock_cluster_t *mc;
        rd_kafka_topic_partition_list_t *list;
        const char *bootstraps;
        char errstr[512];
        int64_t deadline;
        int i, processed = 0, total = 0;
        rd_kafka_resp_err_t err;

        pconf = rd_kafka_conf_new();
        rd_kafka_conf_set_log_cb(pconf, quiet_log);
        rd_kafka_conf_set_dr_msg_cb(pconf, on_delivery);
        ck_assert_int_eq(rd_kafka_conf_set(pconf, "test.mock.num.brokers", "1",
                                           errstr, sizeof(errstr)),
                         RD_KAFKA_CONF_OK);
        ck_assert_int_eq(rd_kafka_conf_set(pconf, "enable.idempotence", "true",
                                           errstr, sizeof(errstr)),
                         RD_KAFKA_CONF_OK);
        producer =
            rd_kafka_new(RD_KAFKA_PRODUCER, pconf, errstr, sizeof(errstr));
        ck_assert_msg(producer != NULL, "%s", errstr);
        mc = rd_kafka_handle_mock_cluster(producer);
        ck_assert_ptr_nonnull(mc);
        ck_assert_int_eq(rd_kafka_mock_topic_create(mc, TOPIC, N_PARTITIONS, 1),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        bootstraps = rd_kafka_mock_cluster_bootstraps(mc);

        delivered_ok = 0;
        for (i = 0; i < N_MESSAGES; i++) {
                char key[16];

                snprintf(key, sizeof(key), "k%d", i);
                ck_assert_int_eq(
                    rd_kafka_producev(producer, RD_KAFKA_V_TOPIC(TOPIC),
                                      RD_KAFKA_V_KEY(key, strlen(key)),
                                      RD_KAFKA_V_VALUE(key, strlen(key)),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_END),
                    RD_KAFKA_RESP_ERR_NO_ERROR);
        }
        ck_assert_int_eq(rd_kafka_flush(producer, 30000),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        ck_assert_int_eq(delivered_ok, N_MESSAGES);

        {
                const char *const ckv[] = {"bootstrap.servers",
                                           bootstraps,
                                           "group.id",
                                           "cq-mock-group",
                                           "partition.assignment.strategy",
                                           "range",
                                           "enable.auto.offset.store",
                                           "false",
                                           "enable.auto.commit",
                                           "false",
                                           "auto.offset.reset",
                                           "earliest",
                                           NULL};
                consumer = client(RD_KAFKA_CONSUMER, ckv);
        }
        ck_assert_int_eq(rd_kafka_poll_set_consumer(consumer), 0);
        /* An explicit assignment commits through the same group
         * coordinator as a subscription, without the mock's slow join. */
        list = rd_kafka_topic_partition_list_new(N_PARTITIONS);
        for (i = 0; i < N_PARTITIONS; i++)
                rd_kafka_topic_partition_list_add(list, TOPIC, i);
        ck_assert_int_eq(rd_kafka_assign(consumer, list), 0);
        rd_kafka_topic_partition_list_destroy(list);

        deadline = cq_now_ms() + 60000;
        while (processed < N_MESSAGES) {
                rd_kafka_message_t *rkm;

                ck_assert_msg(cq_now_ms() < deadline, "only %d of %d consumed",
                              processed, N_MESSAGES);
                rkm = rd_kafka_consumer_poll(consumer, 100);
                if (!rkm)
                        continue;
                if (!rkm->err) {
                        list = rd_kafka_topic_partition_list_new(1);
                        rd_kafka_topic_partition_list_add(list, TOPIC,
                                                          rkm->partition)
                            ->offset = rkm->offset + 1;
                        ck_assert_int_eq(rd_kafka_offsets_store(consumer, list),
                                         0);
                        rd_kafka_topic_partition_list_destroy(list);
                        processed++;
                }
                rd_kafka_message_destroy(rkm);
        }

        /* The broker rejects the next OffsetCommit: the synchronous commit
         * must say so. */
        rd_kafka_mock_push_request_errors(
            mc, APIKEY_OFFSET_COMMIT, 1,
            RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED);
        err = rd_kafka_commit(consumer, NULL, 0);
        ck_assert_msg(err != RD_KAFKA_RESP_ERR_NO_ERROR,
                      "a rejected OffsetCommit was reported as success");

        /* The stored offsets are still there: a retry commits them. */
        err = rd_kafka_commit(consumer, NULL, 0);
        ck_assert_msg(!err, "could not commit: %s", rd_kafka_err2str(err));

        list = rd_kafka_topic_partition_list_new(N_PARTITIONS);
        for (i = 0; i < N_PARTITIONS; i++)
                rd_kafka_topic_partition_list_add(list, TOPIC, i);
        ck_assert_int_eq(rd_kafka_committed(consumer, list, 10000), 0);
        for (i = 0; i < N_PARTITIONS; i++) {
                ck_assert_int_eq(list->elems[i].err, 0);
                ck_assert_int_ge(list->elems[i].offset, 0);
                total += (int)list->elems[i].offset;
        }
        ck_assert_int_eq(total, N_MESSAGES);
        rd_kafka_topic_partition_list_destroy(list);

        ck_assert_int_eq(rd_kafka_assign(consumer, NULL), 0);
        ck_assert_int_eq(rd_kafka_consumer_close(consumer), 0);
        rd_kafka_destroy(consumer);
        rd_kafka_destroy(producer);
}
END_TEST

static Suite *kafka_mock_suite(void)
{
        Suite *s = suite_create("kafka_mock");
        TCase *tc = tcase_create("commit");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, failed_offset_commit_is_reported_by_sync_commit);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(kafka_mock_suite)
