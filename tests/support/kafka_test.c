/* SPDX-License-Identifier: MIT */
/* kafka_test.c - helpers for the Kafka integration suites. */
#include "kafka_test.h"

#include <check.h>
#include <errno.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/storage/migrate.h"
#include "coderq/common/util.h"

void kt_sleep_ms(int ms)
{
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
}

void kt_unique(const char *prefix, char *out, size_t size)
{
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(out, size, "%s-%ld-%lld%03ld", prefix, (long)getpid(),
                 (long long)ts.tv_sec, ts.tv_nsec / 1000000L);
}

/* Properties of every helper's client (kt_client_props()). */
static const char *const *client_props;

void kt_client_props(const char *const *kv) { client_props = kv; }

static rd_kafka_conf_t *conf_new(const char *brokers)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        const char *const *kv;
        char errstr[256];

        ck_assert_int_eq(rd_kafka_conf_set(conf, "bootstrap.servers", brokers,
                                           errstr, sizeof(errstr)),
                         RD_KAFKA_CONF_OK);
        for (kv = client_props; kv && kv[0] && kv[1]; kv += 2)
                ck_assert_msg(rd_kafka_conf_set(conf, kv[0], kv[1], errstr,
                                                sizeof(errstr)) ==
                                  RD_KAFKA_CONF_OK,
                              "%s", errstr);
        return conf;
}

void kt_create_topic(const char *brokers, const char *topic, int partitions)
{
        kt_create_topic_rf(brokers, topic, partitions, 1, 0);
}

void kt_create_topic_rf(const char *brokers,
                        const char *topic,
                        int partitions,
                        int replicas,
                        int min_isr)
{
        rd_kafka_conf_t *conf = conf_new(brokers);
        char errstr[256];
        rd_kafka_t *rk;
        rd_kafka_NewTopic_t *nt;
        rd_kafka_queue_t *q;
        rd_kafka_event_t *ev;
        const rd_kafka_CreateTopics_result_t *res;
        const rd_kafka_topic_result_t **tres;
        size_t n;

        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk, "%s", errstr);
        nt = rd_kafka_NewTopic_new(topic, partitions, replicas, errstr,
                                   sizeof(errstr));
        ck_assert_msg(nt, "%s", errstr);
        if (min_isr > 0) {
                char isr[16];

                snprintf(isr, sizeof(isr), "%d", min_isr);
                ck_assert_int_eq(rd_kafka_NewTopic_set_config(
                                     nt, "min.insync.replicas", isr),
                                 0);
        }
        q = rd_kafka_queue_new(rk);
        rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
        ev = rd_kafka_queue_poll(q, 30000);
        ck_assert_msg(ev, "no CreateTopics result");
        res = rd_kafka_event_CreateTopics_result(ev);
        ck_assert_ptr_nonnull(res);
        tres = rd_kafka_CreateTopics_result_topics(res, &n);
        ck_assert_uint_eq(n, 1);
        ck_assert_msg(rd_kafka_topic_result_error(tres[0]) == 0 ||
                          rd_kafka_topic_result_error(tres[0]) ==
                              RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS,
                      "could not create topic %s: %s", topic,
                      rd_kafka_err2str(rd_kafka_topic_result_error(tres[0])));
        rd_kafka_event_destroy(ev);
        rd_kafka_queue_destroy(q);
        rd_kafka_NewTopic_destroy(nt);
        rd_kafka_destroy(rk);
}

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
        int *failed = opaque;

        (void)rk;
        if (msg->err)
                (*failed)++;
}

rd_kafka_t *kt_producer(const char *brokers)
{
        rd_kafka_conf_t *conf = conf_new(brokers);
        char errstr[256];
        rd_kafka_t *rk;
        int *failed = calloc(1, sizeof(int));

        ck_assert_ptr_nonnull(failed);
        ck_assert_int_eq(
            rd_kafka_conf_set(conf, "acks", "all", errstr, sizeof(errstr)),
            RD_KAFKA_CONF_OK);
        ck_assert_int_eq(
            rd_kafka_conf_set(conf, "linger.ms", "2", errstr, sizeof(errstr)),
            RD_KAFKA_CONF_OK);
        rd_kafka_conf_set_dr_msg_cb(conf, on_dr);
        rd_kafka_conf_set_opaque(conf, failed);
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk, "%s", errstr);
        return rk;
}

void kt_produce(rd_kafka_t *rk,
                const char *topic,
                int32_t partition,
                const void *key,
                size_t keylen,
                const void *value,
                size_t len,
                rd_kafka_headers_t *hdrs)
{
        rd_kafka_resp_err_t err;

        if (!hdrs)
                hdrs = rd_kafka_headers_new(0);
        err = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY | RD_KAFKA_MSG_F_BLOCK),
            RD_KAFKA_V_KEY((void *)(uintptr_t)key, key ? keylen : 0),
            RD_KAFKA_V_VALUE((void *)(uintptr_t)value, value ? len : 0),
            RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
        if (err)
                rd_kafka_headers_destroy(hdrs);
        ck_assert_msg(!err, "produce: %s", rd_kafka_err2str(err));
        rd_kafka_poll(rk, 0);
}

void kt_flush(rd_kafka_t *rk)
{
        int *failed = rd_kafka_opaque(rk);

        ck_assert_int_eq(rd_kafka_flush(rk, 60000), 0);
        ck_assert_int_eq(*failed, 0);
}

void kt_producer_destroy(rd_kafka_t *rk)
{
        int *failed = rd_kafka_opaque(rk);

        rd_kafka_flush(rk, 10000);
        rd_kafka_destroy(rk);
        free(failed);
}

static char *copy_bytes(const void *p, size_t n)
{
        char *s;

        if (!p)
                return NULL;
        s = malloc(n + 1);
        ck_assert_ptr_nonnull(s);
        memcpy(s, p, n);
        s[n] = '\0';
        return s;
}

size_t kt_consume(const char *brokers,
                  const char *topic,
                  int nparts,
                  size_t expected,
                  int timeout_ms,
                  kt_msg_t **msgsp)
{
        rd_kafka_conf_t *conf = conf_new(brokers);
        char errstr[256], group[128];
        rd_kafka_t *rk;
        rd_kafka_topic_partition_list_t *parts;
        kt_msg_t *msgs = calloc(expected + 1, sizeof(*msgs));
        size_t n = 0;
        int64_t deadline = cq_now_ms() + timeout_ms;
        int i;

        ck_assert_ptr_nonnull(msgs);
        kt_unique("kt-reader", group, sizeof(group));
        ck_assert_int_eq(
            rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr)),
            RD_KAFKA_CONF_OK);
        ck_assert_int_eq(rd_kafka_conf_set(conf, "enable.auto.commit", "false",
                                           errstr, sizeof(errstr)),
                         RD_KAFKA_CONF_OK);
        rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk, "%s", errstr);
        parts = rd_kafka_topic_partition_list_new(nparts);
        for (i = 0; i < nparts; i++)
                rd_kafka_topic_partition_list_add(parts, topic, i)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        ck_assert_int_eq(rd_kafka_assign(rk, parts), 0);
        rd_kafka_topic_partition_list_destroy(parts);
        while (n < expected && cq_now_ms() < deadline) {
                rd_kafka_message_t *msg = rd_kafka_consumer_poll(rk, 200);
                rd_kafka_headers_t *hdrs = NULL;

                if (!msg)
                        continue;
                if (msg->err) {
                        rd_kafka_message_destroy(msg);
                        continue;
                }
                msgs[n].key = copy_bytes(msg->key, msg->key_len);
                msgs[n].keylen = msg->key_len;
                msgs[n].value = copy_bytes(msg->payload, msg->len);
                msgs[n].len = msg->len;
                msgs[n].partition = msg->partition;
                msgs[n].offset = msg->offset;
                if (rd_kafka_message_headers(msg, &hdrs) == 0)
                        msgs[n].hdrs = rd_kafka_headers_copy(hdrs);
                n++;
                rd_kafka_message_destroy(msg);
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        *msgsp = msgs;
        return n;
}

void kt_msgs_free(kt_msg_t *msgs, size_t n)
{
        size_t i;

        for (i = 0; i < n; i++) {
                free(msgs[i].key);
                free(msgs[i].value);
                if (msgs[i].hdrs)
                        rd_kafka_headers_destroy(msgs[i].hdrs);
        }
        free(msgs);
}

const char *kt_header(const kt_msg_t *msg, const char *name)
{
        static char buf[4096];
        const void *v;
        size_t n;

        if (!msg->hdrs ||
            rd_kafka_header_get_last(msg->hdrs, name, &v, &n) != 0 || !v)
                return NULL;
        if (n >= sizeof(buf))
                n = sizeof(buf) - 1;
        memcpy(buf, v, n);
        buf[n] = '\0';
        return buf;
}

int64_t kt_committed_sum(const char *brokers,
                         const char *group,
                         const char *topic,
                         int nparts)
{
        rd_kafka_conf_t *conf = conf_new(brokers);
        char errstr[256];
        rd_kafka_t *rk;
        rd_kafka_topic_partition_list_t *parts;
        int64_t sum = 0;
        int i;

        ck_assert_int_eq(
            rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr)),
            RD_KAFKA_CONF_OK);
        rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk, "%s", errstr);
        parts = rd_kafka_topic_partition_list_new(nparts);
        for (i = 0; i < nparts; i++)
                rd_kafka_topic_partition_list_add(parts, topic, i);
        ck_assert_int_eq(rd_kafka_committed(rk, parts, 30000), 0);
        for (i = 0; i < parts->cnt; i++)
                if (parts->elems[i].offset >= 0)
                        sum += parts->elems[i].offset;
        rd_kafka_topic_partition_list_destroy(parts);
        rd_kafka_destroy(rk);
        return sum;
}

int64_t kt_high_sum(const char *brokers, const char *topic, int nparts)
{
        rd_kafka_conf_t *conf = conf_new(brokers);
        char errstr[256];
        rd_kafka_t *rk;
        int64_t sum = 0, lo, hi;
        int i;

        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk, "%s", errstr);
        for (i = 0; i < nparts; i++) {
                ck_assert_int_eq(rd_kafka_query_watermark_offsets(
                                     rk, topic, i, &lo, &hi, 30000),
                                 0);
                sum += hi;
        }
        rd_kafka_destroy(rk);
        return sum;
}

static PGresult *pg_run(const char *dsn, const char *sql, const char *param)
{
        PGconn *conn = PQconnectdb(dsn);
        PGresult *res;
        const char *params[1] = {param};

        ck_assert_msg(PQstatus(conn) == CONNECTION_OK, "%s",
                      PQerrorMessage(conn));
        /* the harness's TRUNCATE ... CASCADE notices would bury a
         * failure's output on CI; warnings still show */
        PQclear(PQexec(conn, "SET client_min_messages TO warning"));
        res =
            PQexecParams(conn, sql, param ? 1 : 0, NULL, params, NULL, NULL, 0);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK ||
                          PQresultStatus(res) == PGRES_COMMAND_OK,
                      "%s: %s", sql, PQerrorMessage(conn));
        PQfinish(conn);
        return res;
}

long kt_pg_long(const char *dsn, const char *sql, const char *param)
{
        PGresult *res = pg_run(dsn, sql, param);
        long v;

        ck_assert_int_eq(PQntuples(res), 1);
        v = strtol(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return v;
}

char *kt_pg_text(const char *dsn, const char *sql, const char *param)
{
        PGresult *res = pg_run(dsn, sql, param);
        char *out = NULL;

        ck_assert_int_le(PQntuples(res), 1);
        if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
                out = strdup(PQgetvalue(res, 0, 0));
                ck_assert_ptr_nonnull(out);
        }
        PQclear(res);
        return out;
}

void kt_pg_exec(const char *dsn, const char *sql, const char *param)
{
        PQclear(pg_run(dsn, sql, param));
}

void kt_services(const char *verb)
{
        char cmd[4200];

        int64_t deadline = cq_now_ms() + 120000;

        snprintf(cmd, sizeof(cmd), "%s %s >/dev/null 2>&1",
                 cq_check_srcpath("scripts/services.sh"), verb);
        /* A start can fail for a while when, with the server down, the
         * kernel lent its port to some client as an ephemeral port (the
         * ports lie in Linux's ephemeral range): retry. */
        while (system(cmd) != 0) {
                ck_assert_msg(strncmp(verb, "start", 5) == 0 &&
                                  cq_now_ms() < deadline,
                              "%s failed", cmd);
                kt_sleep_ms(3000);
        }
}

char *kt_services_output(const char *verb)
{
        char cmd[4200], *out;
        size_t len;
        FILE *fp;

        snprintf(cmd, sizeof(cmd), "%s %s 2>/dev/null",
                 cq_check_srcpath("scripts/services.sh"), verb);
        fp = popen(cmd, "r");
        ck_assert_ptr_nonnull(fp);
        out = calloc(1, 8192);
        ck_assert_ptr_nonnull(out);
        len = fread(out, 1, 8191, fp);
        ck_assert_msg(pclose(fp) == 0, "%s failed", cmd);
        while (len > 0 && out[len - 1] == '\n')
                out[--len] = '\0';
        return out;
}

char *kt_services_env(const char *flags, const char *name)
{
        char verb[256], head[128], *all, *line, *value = NULL;

        snprintf(verb, sizeof(verb), "env %s", flags);
        snprintf(head, sizeof(head), "export %s='", name);
        all = kt_services_output(verb);
        for (line = all; line && *line && !value;
             line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
                if (strncmp(line, head, strlen(head)) != 0)
                        continue;
                line += strlen(head);
                value = strndup(line, strcspn(line, "'"));
                ck_assert_ptr_nonnull(value);
        }
        free(all);
        ck_assert_msg(value, "services.sh %s prints no %s", verb, name);
        return value;
}

/* Whether every outbox row of the database \p arg was sent. */
static bool outbox_sent(void *arg)
{
        return kt_pg_long(arg,
                          "SELECT count(*) FROM outbox WHERE sent_at IS NULL",
                          NULL) == 0;
}

long kt_events_once(const char *brokers,
                    const char *topic,
                    int nparts,
                    const char *dsn,
                    long njobs,
                    int ms)
{
        kt_msg_t *msgs = NULL;
        size_t n, i, k;
        long jobs = 0, copies = 0;

        ck_assert_msg(
            cq_check_wait_until(outbox_sent, (void *)(uintptr_t)dsn, ms),
            "%ld outbox rows unsent after %d ms",
            kt_pg_long(dsn,
                       "SELECT count(*) FROM outbox WHERE sent_at "
                       "IS NULL",
                       NULL),
            ms);
        n = kt_consume(brokers, topic, nparts,
                       (size_t)kt_high_sum(brokers, topic, nparts), ms, &msgs);
        for (i = 0; i < n; i++) {
                const char *event = kt_header(&msgs[i], "event_id");
                char *id;

                ck_assert_ptr_nonnull(msgs[i].key);
                ck_assert_ptr_nonnull(event);
                id = strdup(event);
                ck_assert_ptr_nonnull(id);
                for (k = 0; k < i; k++) {
                        if (strcmp(msgs[k].key, msgs[i].key) != 0)
                                continue;
                        ck_assert_msg(
                            strcmp(kt_header(&msgs[k], "event_id"), id) == 0,
                            "job %s has two completion events", msgs[i].key);
                        break;
                }
                free(id);
                if (k < i)
                        copies++;
                else
                        jobs++;
        }
        kt_msgs_free(msgs, n);
        ck_assert_int_eq(jobs, njobs);
        return copies;
}

void kt_migrate(const char *dsn)
{
        char errstr[512];

        ck_assert_msg(cq_migrate_run(dsn, NULL, NULL, NULL, NULL, errstr,
                                     sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
}
