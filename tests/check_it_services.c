/* SPDX-License-Identifier: MIT */
/* check_it_services.c - the local services are real: librdkafka 2.0.2
 * against the Kafka broker from scripts/services.sh (Admin API, idempotent
 * producer, a consumer group with stored and synchronously committed
 * offsets, across a broker restart), and a libpq round trip. Needs the
 * services running and their env (scripts/services.sh env). */
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "support/proc.h"

#define N_MESSAGES       1000
#define N_PARTITIONS     3
#define N_PHASE1         400 /* messages processed before the restart */
#define COMMIT_EVERY     100
#define KAFKA_TIMEOUT_MS 30000

/* ---- Kafka helpers ---------------------------------------------------- */

struct delivery {
        int ok;
        int failed;
        rd_kafka_resp_err_t first_err;
};

/* librdkafka logs transient connection errors while the broker restarts;
 * the assertions decide what matters, so its log lines go to stderr only
 * when CQ_CHECK_VERBOSE is set. */
static void
kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        (void)rk;
        if (getenv("CQ_CHECK_VERBOSE"))
                fprintf(stderr, "librdkafka %d %s: %s\n", level, fac, buf);
}

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *rkm, void *opaque)
{
        struct delivery *dr = opaque;

        (void)rk;
        if (rkm->err) {
                if (!dr->failed)
                        dr->first_err = rkm->err;
                dr->failed++;
        } else {
                dr->ok++;
        }
}

static rd_kafka_conf_t *kafka_conf(const char *const *kv)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char errstr[512];
        size_t i;

        ck_assert_ptr_nonnull(conf);
        rd_kafka_conf_set_log_cb(conf, kafka_log);
        ck_assert_int_eq(rd_kafka_conf_set(conf, "bootstrap.servers",
                                           cq_check_env("CODERQ_KAFKA_BROKERS"),
                                           errstr, sizeof(errstr)),
                         RD_KAFKA_CONF_OK);
        for (i = 0; kv[i]; i += 2)
                ck_assert_msg(rd_kafka_conf_set(conf, kv[i], kv[i + 1], errstr,
                                                sizeof(errstr)) ==
                                  RD_KAFKA_CONF_OK,
                              "could not set %s: %s", kv[i], errstr);
        return conf;
}

static rd_kafka_t *kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *conf)
{
        char errstr[512];
        rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof(errstr));

        ck_assert_msg(rk != NULL, "could not create client: %s", errstr);
        return rk;
}

static void create_topic(rd_kafka_t *rk, const char *topic)
{
        char errstr[512];
        rd_kafka_NewTopic_t *nt;
        rd_kafka_AdminOptions_t *opts;
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_event_t *ev;
        const rd_kafka_CreateTopics_result_t *res;
        const rd_kafka_topic_result_t **results;
        size_t n;

        nt = rd_kafka_NewTopic_new(topic, N_PARTITIONS, 1, errstr,
                                   sizeof(errstr));
        ck_assert_msg(nt != NULL, "could not describe topic: %s", errstr);
        opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
        ck_assert_int_eq(rd_kafka_AdminOptions_set_operation_timeout(
                             opts, KAFKA_TIMEOUT_MS, errstr, sizeof(errstr)),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        rd_kafka_CreateTopics(rk, &nt, 1, opts, q);
        ev = rd_kafka_queue_poll(q, KAFKA_TIMEOUT_MS + 5000);
        ck_assert_msg(ev != NULL, "CreateTopics gave no result");
        ck_assert_msg(!rd_kafka_event_error(ev), "CreateTopics failed: %s",
                      rd_kafka_event_error_string(ev));
        res = rd_kafka_event_CreateTopics_result(ev);
        ck_assert_ptr_nonnull(res);
        results = rd_kafka_CreateTopics_result_topics(res, &n);
        ck_assert_uint_eq(n, 1);
        ck_assert_str_eq(rd_kafka_topic_result_name(results[0]), topic);
        ck_assert_msg(!rd_kafka_topic_result_error(results[0]),
                      "could not create topic %s: %s", topic,
                      rd_kafka_topic_result_error_string(results[0]));
        rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(opts);
        rd_kafka_NewTopic_destroy(nt);
        rd_kafka_queue_destroy(q);
}

static void produce_all(const char *topic)
{
        static const char *const kv[] = {"enable.idempotence", "true",
                                         "linger.ms", "5", NULL};
        struct delivery dr = {0, 0, RD_KAFKA_RESP_ERR_NO_ERROR};
        rd_kafka_conf_t *conf = kafka_conf(kv);
        rd_kafka_t *rk;
        int i;

        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_conf_set_opaque(conf, &dr);
        rk = kafka_new(RD_KAFKA_PRODUCER, conf);
        conf = NULL; /* rd_kafka_t owns it now */
        create_topic(rk, topic);
        for (i = 0; i < N_MESSAGES; i++) {
                char key[32], value[64];
                rd_kafka_resp_err_t err;

                snprintf(key, sizeof(key), "key-%04d", i);
                snprintf(value, sizeof(value), "value of %s: it's \"%d\"", key,
                         i);
                do {
                        err = rd_kafka_producev(
                            rk, RD_KAFKA_V_TOPIC(topic),
                            RD_KAFKA_V_KEY(key, strlen(key)),
                            RD_KAFKA_V_VALUE(value, strlen(value)),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_END);
                        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                                rd_kafka_poll(rk, 100);
                } while (err == RD_KAFKA_RESP_ERR__QUEUE_FULL);
                ck_assert_msg(!err, "could not produce %s: %s", key,
                              rd_kafka_err2str(err));
                rd_kafka_poll(rk, 0);
        }
        ck_assert_int_eq(rd_kafka_flush(rk, 60000), RD_KAFKA_RESP_ERR_NO_ERROR);
        ck_assert_int_eq(rd_kafka_outq_len(rk), 0);
        ck_assert_msg(dr.failed == 0, "%d deliveries failed, first: %s",
                      dr.failed, rd_kafka_err2str(dr.first_err));
        ck_assert_int_eq(dr.ok, N_MESSAGES);
        ck_assert_int_eq(rd_kafka_fatal_error(rk, NULL, 0),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        rd_kafka_destroy(rk);
}

static rd_kafka_t *consumer_new(const char *group, const char *topic)
{
        const char *const kv[] = {"group.id",
                                  group,
                                  "partition.assignment.strategy",
                                  "range",
                                  "enable.auto.offset.store",
                                  "false",
                                  "enable.auto.commit",
                                  "false",
                                  "auto.offset.reset",
                                  "earliest",
                                  "session.timeout.ms",
                                  "10000",
                                  "heartbeat.interval.ms",
                                  "1000",
                                  NULL};
        rd_kafka_conf_t *conf = kafka_conf(kv);
        rd_kafka_t *rk = kafka_new(RD_KAFKA_CONSUMER, conf);
        rd_kafka_topic_partition_list_t *topics;

        /* rd_kafka_t owns conf now */
        ck_assert_int_eq(rd_kafka_poll_set_consumer(rk),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, topic, RD_KAFKA_PARTITION_UA);
        ck_assert_int_eq(rd_kafka_subscribe(rk, topics),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        rd_kafka_topic_partition_list_destroy(topics);
        return rk;
}

/* A synchronous commit of the stored offsets. __NO_OFFSET means nothing
 * was stored since the last commit: there is nothing to lose. */
static void commit_sync(rd_kafka_t *rk)
{
        rd_kafka_resp_err_t err = rd_kafka_commit(rk, NULL, 0);

        ck_assert_msg(!err || err == RD_KAFKA_RESP_ERR__NO_OFFSET,
                      "could not commit offsets: %s", rd_kafka_err2str(err));
}

struct seen {
        int count[N_MESSAGES];
        int distinct;
        int duplicates;
        int processed;
};

static int key_index(const rd_kafka_message_t *rkm)
{
        char key[16];
        char *end;
        long v;

        ck_assert_msg(rkm->key_len > 4 && rkm->key_len < sizeof(key),
                      "unexpected key length %zu", rkm->key_len);
        memcpy(key, rkm->key, rkm->key_len);
        key[rkm->key_len] = '\0';
        ck_assert_msg(strncmp(key, "key-", 4) == 0, "unexpected key %s", key);
        v = strtol(key + 4, &end, 10);
        ck_assert_msg(*end == '\0' && v >= 0 && v < N_MESSAGES,
                      "unexpected key %s", key);
        return (int)v;
}

/*
 * Consume until \p stop_after messages were processed in this call (or
 * every key was seen), storing offset + 1 after each one and committing
 * synchronously every COMMIT_EVERY messages and at the end. Returns with
 * the consumer closed and destroyed.
 */
static void
consume(rd_kafka_t *rk, struct seen *seen, int stop_after, int64_t budget_ms)
{
        int64_t deadline = cq_now_ms() + budget_ms;
        int done = 0;

        while (done < stop_after && seen->distinct < N_MESSAGES) {
                rd_kafka_message_t *rkm;
                rd_kafka_topic_partition_list_t *offsets;
                rd_kafka_resp_err_t err;
                int k;

                ck_assert_msg(cq_now_ms() < deadline,
                              "only %d of %d keys seen within %lld ms",
                              seen->distinct, N_MESSAGES, (long long)budget_ms);
                rkm = rd_kafka_consumer_poll(rk, 200);
                if (!rkm)
                        continue;
                if (rkm->err) {
                        /* Transient errors (a broker just restarted) are
                         * retried by librdkafka; a fatal one ends the test. */
                        ck_assert_msg(!rd_kafka_fatal_error(rk, NULL, 0),
                                      "fatal consumer error: %s",
                                      rd_kafka_message_errstr(rkm));
                        rd_kafka_message_destroy(rkm);
                        continue;
                }
                /* "processing" */
                k = key_index(rkm);
                if (seen->count[k]++)
                        seen->duplicates++;
                else
                        seen->distinct++;
                seen->processed++;
                done++;
                /* processed: only now may its offset be committed */
                offsets = rd_kafka_topic_partition_list_new(1);
                rd_kafka_topic_partition_list_add(
                    offsets, rd_kafka_topic_name(rkm->rkt), rkm->partition)
                    ->offset = rkm->offset + 1;
                err = rd_kafka_offsets_store(rk, offsets);
                ck_assert_msg(!err, "could not store offset: %s",
                              rd_kafka_err2str(err));
                rd_kafka_topic_partition_list_destroy(offsets);
                rd_kafka_message_destroy(rkm);
                if (done % COMMIT_EVERY == 0)
                        commit_sync(rk);
        }
        commit_sync(rk); /* consumer_close() hides a failed final commit */
        ck_assert_int_eq(rd_kafka_consumer_close(rk),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        rd_kafka_destroy(rk);
}

/* Committed offsets of the group equal the high watermarks: everything
 * that was produced was processed and committed. */
static void assert_committed_at_end(const char *group, const char *topic)
{
        const char *const kv[] = {"group.id", group, NULL};
        rd_kafka_t *rk;
        rd_kafka_topic_partition_list_t *parts;
        int64_t total = 0;
        int p;

        rk = kafka_new(RD_KAFKA_CONSUMER, kafka_conf(kv));
        parts = rd_kafka_topic_partition_list_new(N_PARTITIONS);
        for (p = 0; p < N_PARTITIONS; p++)
                rd_kafka_topic_partition_list_add(parts, topic, p);
        ck_assert_int_eq(rd_kafka_committed(rk, parts, KAFKA_TIMEOUT_MS),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        for (p = 0; p < N_PARTITIONS; p++) {
                int64_t lo = -1, hi = -1;

                ck_assert_int_eq(rd_kafka_query_watermark_offsets(
                                     rk, topic, p, &lo, &hi, KAFKA_TIMEOUT_MS),
                                 RD_KAFKA_RESP_ERR_NO_ERROR);
                ck_assert_int_eq(parts->elems[p].err,
                                 RD_KAFKA_RESP_ERR_NO_ERROR);
                /* the default partitioner spreads 1000 keys over all three */
                ck_assert_int_gt(hi, 0);
                ck_assert_int_eq(lo, 0);
                ck_assert_int_eq(parts->elems[p].offset, hi);
                total += hi;
        }
        ck_assert_int_eq(total, N_MESSAGES);
        rd_kafka_topic_partition_list_destroy(parts);
        ck_assert_int_eq(rd_kafka_consumer_close(rk),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        rd_kafka_destroy(rk);
}

/* The broker's port is the part of CODERQ_KAFKA_BROKERS after the last
 * ':'; services.sh needs it to restart the broker that this test uses. */
static void restart_broker(void)
{
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        const char *colon = strrchr(brokers, ':');
        char script[4096], port_env[64];
        const char *argv[] = {"/bin/bash", script, "restart-kafka", NULL};
        const char *env[] = {port_env, NULL};
        cq_check_proc_t proc;

        ck_assert_msg(colon && !strchr(brokers, ','),
                      "CODERQ_KAFKA_BROKERS must name the one local broker");
        snprintf(script, sizeof(script), "%s",
                 cq_check_srcpath("scripts/services.sh"));
        snprintf(port_env, sizeof(port_env), "CODERQ_KAFKA_PORT=%s", colon + 1);
        ck_assert_int_eq(cq_check_proc_run(argv, env, 180000, &proc), 0);
        ck_assert_msg(proc.status == 0, "services.sh restart-kafka: %d: %s",
                      proc.status, proc.err);
        cq_check_proc_release(&proc);
}

START_TEST(kafka_group_survives_broker_restart)
{
        char topic[96], group[128];
        struct seen *seen = calloc(1, sizeof(*seen));
        int i, phase1;

        ck_assert_ptr_nonnull(seen);
        snprintf(topic, sizeof(topic), "cq-it-services-%ld-%d",
                 (long)time(NULL), (int)getpid());
        snprintf(group, sizeof(group), "%s-group", topic);
        produce_all(topic);

        consume(consumer_new(group, topic), seen, N_PHASE1, 60000);
        ck_assert_int_eq(seen->processed, N_PHASE1);
        phase1 = seen->distinct;

        restart_broker();

        /* A new member of the same group resumes from the commits. */
        consume(consumer_new(group, topic), seen, N_MESSAGES, 120000);
        for (i = 0; i < N_MESSAGES; i++)
                ck_assert_msg(seen->count[i] >= 1, "key-%04d was lost", i);
        ck_assert_int_eq(seen->distinct, N_MESSAGES);
        /* Every processed message was committed synchronously before the
         * first consumer closed, so the second one starts exactly there. */
        ck_assert_int_eq(phase1, N_PHASE1);
        ck_assert_int_eq(seen->duplicates, 0);
        ck_assert_int_eq(seen->processed, N_MESSAGES);
        assert_committed_at_end(group, topic);
        free(seen);
}
END_TEST

/* ---- PostgreSQL ------------------------------------------------------- */

START_TEST(pg_round_trip_text_and_binary)
{
        static const char text[] = "it's a \"quote\", a \\ backslash, "
                                   "\\x00 and E'\\n' -- not SQL; caf\xc3\xa9";
        unsigned char bin[300];
        const char *values[3];
        int lengths[3], formats[3];
        PGconn *conn;
        PGresult *res;
        unsigned char *unescaped;
        size_t unescaped_len;
        int i;

        for (i = 0; i < (int)sizeof(bin); i++)
                bin[i] = (unsigned char)(i * 7); /* every byte incl. 0, ', \ */
        bin[0] = '\'';
        bin[1] = '\\';
        bin[2] = '\0';
        conn = PQconnectdb(cq_check_env("CODERQ_PG_DSN"));
        ck_assert_msg(PQstatus(conn) == CONNECTION_OK, "could not connect: %s",
                      PQerrorMessage(conn));
        ck_assert_int_ge(PQserverVersion(conn), 150000);
        res = PQexec(conn, "CREATE TEMP TABLE rt (id int PRIMARY KEY, "
                           "txt text NOT NULL, bin bytea NOT NULL)");
        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK, "%s",
                      PQerrorMessage(conn));
        PQclear(res);

        values[0] = "42";
        values[1] = text;
        values[2] = (const char *)bin;
        lengths[0] = lengths[1] = 0;
        lengths[2] = (int)sizeof(bin);
        formats[0] = formats[1] = 0;
        formats[2] = 1;
        res = PQexecParams(conn,
                           "INSERT INTO rt (id, txt, bin) VALUES ($1, $2, $3)",
                           3, NULL, values, lengths, formats, 0);
        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK, "%s",
                      PQerrorMessage(conn));
        ck_assert_str_eq(PQcmdTuples(res), "1");
        PQclear(res);

        /* binary results: the bytes exactly as sent */
        res = PQexecParams(conn, "SELECT txt, bin FROM rt WHERE id = $1", 1,
                           NULL, values, NULL, NULL, 1);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s",
                      PQerrorMessage(conn));
        ck_assert_int_eq(PQntuples(res), 1);
        ck_assert_int_eq(PQgetlength(res, 0, 0), (int)strlen(text));
        ck_assert_mem_eq(PQgetvalue(res, 0, 0), text, strlen(text));
        ck_assert_int_eq(PQgetlength(res, 0, 1), (int)sizeof(bin));
        ck_assert_mem_eq(PQgetvalue(res, 0, 1), bin, sizeof(bin));
        PQclear(res);

        /* text results: bytea comes back hex-escaped */
        res = PQexecParams(conn,
                           "SELECT txt, bin, length(bin) FROM rt WHERE id = $1",
                           1, NULL, values, NULL, NULL, 0);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s",
                      PQerrorMessage(conn));
        ck_assert_str_eq(PQgetvalue(res, 0, 0), text);
        ck_assert_str_eq(PQgetvalue(res, 0, 2), "300");
        unescaped = PQunescapeBytea(
            (const unsigned char *)PQgetvalue(res, 0, 1), &unescaped_len);
        ck_assert_ptr_nonnull(unescaped);
        ck_assert_uint_eq(unescaped_len, sizeof(bin));
        ck_assert_mem_eq(unescaped, bin, sizeof(bin));
        PQfreemem(unescaped);
        PQclear(res);
        PQfinish(conn);
}
END_TEST

static Suite *it_services_suite(void)
{
        Suite *s = suite_create("it_services");
        TCase *tc = tcase_create("kafka");

        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, kafka_group_survives_broker_restart);
        suite_add_tcase(s, tc);
        tc = tcase_create("postgresql");
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, pg_round_trip_text_and_binary);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_services_suite)
