/* SPDX-License-Identifier: MIT */
/* check_it_relay.c - the outbox relay and progress events against a real
 * broker and PostgreSQL: rows reach their topic with key and event_id and
 * are marked sent; with the broker stopped they stay unsent and go out
 * after it is back; failed Produce requests (librdkafka's mock cluster)
 * leave rows unsent; a 3 MB answer goes out cut under the event cap; a
 * row the broker refuses is marked failed without holding the others
 * back; a fleet of relays sends each row once, and a dead relay's rows
 * once more; events arrive with increasing seq per job. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "check_support.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/util.h"
#include "support/kafka_test.h"
#include "../consumer/kafka_int.h"

typedef struct runner {
        cq_relay_t *relay;
        atomic_int stop;
        pthread_t thread;
} runner_t;

static void *run_relay(void *arg)
{
        runner_t *r = arg;

        (void)cq_relay_run(r->relay, &r->stop);
        return NULL;
}

static void
runner_start(runner_t *r, const cq_kafka_opts_t *kopts, cq_producer_t *prod)
{
        char errstr[512];

        memset(r, 0, sizeof(*r));
        r->relay = cq_relay_new(kopts, prod, errstr, sizeof(errstr));
        ck_assert_msg(r->relay, "%s", errstr);
        ck_assert_int_eq(pthread_create(&r->thread, NULL, run_relay, r), 0);
}

static void runner_stop(runner_t *r)
{
        atomic_store(&r->stop, 1);
        pthread_join(r->thread, NULL);
        cq_relay_destroy(&r->relay);
}

/* n finished jobs "<prefix>-<from..from+n-1>", each with an outbox row for
 * topic "<prefix>.results". */
static void add_rows(const char *dsn, const char *prefix, int from, int n)
{
        char sql[1024];

        snprintf(sql, sizeof(sql),
                 "INSERT INTO jobs (job_id, prompt, spec, status, finished_at)"
                 " SELECT $1 || '-' || g, 'p', '{}'::jsonb, 'succeeded', now()"
                 " FROM generate_series(%d, %d) g",
                 from, from + n - 1);
        kt_pg_exec(dsn, sql, prefix);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO outbox (job_id, topic, key, payload)"
                 " SELECT $1 || '-' || g, $1 || '.results', $1 || '-' || g,"
                 " jsonb_build_object('job_id', $1 || '-' || g, 'status',"
                 " 'succeeded', 'n', g)"
                 " FROM generate_series(%d, %d) g",
                 from, from + n - 1);
        kt_pg_exec(dsn, sql, prefix);
}

static long unsent(const char *dsn, const char *prefix)
{
        char like[200];

        snprintf(like, sizeof(like), "%s-%%", prefix);
        return kt_pg_long(dsn,
                          "SELECT count(*) FROM outbox WHERE job_id LIKE $1 "
                          "AND sent_at IS NULL",
                          like);
}

static void
wait_unsent(const char *dsn, const char *prefix, long want, int timeout_ms)
{
        int64_t deadline = cq_now_ms() + timeout_ms;
        long n;

        while ((n = unsent(dsn, prefix)) != want) {
                ck_assert_msg(cq_now_ms() < deadline,
                              "%ld rows unsent, waiting for %ld", n, want);
                kt_sleep_ms(100);
        }
}

static bool three_in_flight(void *arg)
{
        cq_relay_stats_t st;

        cq_relay_stats(arg, &st);
        return st.inflight >= 3;
}

/* Check the results topic holds every job from..to-1 (duplicates are
 * allowed) with the row's event_id and a payload naming the job. */
static void check_results(const char *dsn,
                          const char *brokers,
                          const char *prefix,
                          int total,
                          size_t at_least)
{
        char topic[200], id[200];
        kt_msg_t *msgs = NULL;
        size_t n, i;
        int j;
        bool *seen = calloc((size_t)total + 1, sizeof(bool));

        ck_assert_ptr_nonnull(seen);
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        n = kt_consume(brokers, topic, 1, at_least, 60000, &msgs);
        ck_assert_uint_ge(n, at_least);
        for (i = 0; i < n; i++) {
                json_t *doc;
                json_error_t jerr;
                const char *event_id;
                int k;
                char expect[64];

                ck_assert_ptr_nonnull(msgs[i].key);
                ck_assert(strncmp(msgs[i].key, prefix, strlen(prefix)) == 0);
                k = (int)strtol(msgs[i].key + strlen(prefix) + 1, NULL, 10);
                ck_assert(k >= 1 && k <= total);
                seen[k] = true;
                doc = json_loadb(msgs[i].value, msgs[i].len, 0, &jerr);
                ck_assert_msg(doc, "payload: %s", jerr.text);
                ck_assert_str_eq(
                    json_string_value(json_object_get(doc, "job_id")),
                    msgs[i].key);
                ck_assert_int_eq(json_integer_value(json_object_get(doc, "n")),
                                 k);
                json_decref(doc);
                event_id = kt_header(&msgs[i], "event_id");
                ck_assert_ptr_nonnull(event_id);
                snprintf(expect, sizeof(expect), "%s", event_id);
                ck_assert_int_eq(kt_pg_long(dsn,
                                            "SELECT count(*) FROM outbox "
                                            "WHERE event_id::text = $1 AND "
                                            "sent_at IS NOT NULL",
                                            expect),
                                 1);
        }
        for (j = 1; j <= total; j++) {
                snprintf(id, sizeof(id), "%s-%d", prefix, j);
                ck_assert_msg(seen[j], "%s never reached the topic", id);
        }
        kt_msgs_free(msgs, n);
        free(seen);
}

/* A relay test's own prefix and results topic (made), and the options
 * of a relay on the shared PostgreSQL and broker. */
static void relay_fixture(const char *tag,
                          char *prefix,
                          size_t prefix_size,
                          cq_store_opts_t *sopts,
                          cq_kafka_opts_t *kopts)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char topic[160];

        kt_migrate(dsn);
        kt_unique(tag, prefix, prefix_size);
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        kt_create_topic(brokers, topic, 1);
        cq_store_opts_init(sopts);
        sopts->dsn = dsn;
        cq_kafka_opts_init(kopts);
        kopts->brokers = brokers;
        kopts->store = sopts;
}

START_TEST(relay_marks_sent_and_survives_broker_outage)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], errstr[512];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_relay_stats_t st;
        runner_t r;

        kt_services("start-kafka"); /* a no-op unless a failed run left it
                                       stopped */
        relay_fixture("it-relay", prefix, sizeof(prefix), &sopts, &kopts);
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);

        add_rows(dsn, prefix, 1, 5);
        runner_start(&r, &kopts, prod);
        wait_unsent(dsn, prefix, 0, 60000);
        check_results(dsn, brokers, prefix, 5, 5);

        /* Broker down: new rows stay unsent, then go out once it is
         * back. */
        kt_services("stop-kafka");
        add_rows(dsn, prefix, 6, 3);
        /* The relay claimed and produced them, and they wait in the
         * producer for the broker, unsent. */
        ck_assert_msg(cq_check_wait_until(three_in_flight, r.relay, 30000),
                      "the new rows never went in flight");
        ck_assert_int_eq(unsent(dsn, prefix), 3);
        cq_relay_stats(r.relay, &st);
        ck_assert_uint_ge(st.inflight, 3);
        kt_services("start-kafka");
        wait_unsent(dsn, prefix, 0, 120000);
        runner_stop(&r);
        check_results(dsn, brokers, prefix, 8, 8);
        cq_producer_destroy(&prod);
}
END_TEST

START_TEST(relay_waits_for_postgres)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], topic[160], errstr[512];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_relay_stats_t st;
        runner_t r;
        int64_t deadline;

        kt_services("start-pg");
        kt_migrate(dsn);
        kt_unique("it-relaypg", prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        kt_create_topic(brokers, topic, 1);
        add_rows(dsn, prefix, 1, 4);
        kt_services("stop-pg");
        cq_store_opts_init(&sopts);
        sopts.dsn = dsn;
        cq_kafka_opts_init(&kopts);
        kopts.brokers = brokers;
        kopts.store = &sopts;
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        /* Started without PostgreSQL: it waits, then relays. */
        runner_start(&r, &kopts, prod);
        deadline = cq_now_ms() + 30000;
        do {
                ck_assert_msg(cq_now_ms() < deadline, "pg_down not reported");
                kt_sleep_ms(100);
                cq_relay_stats(r.relay, &st);
        } while (!st.pg_down);
        ck_assert_uint_eq(st.produced, 0);
        kt_services("start-pg");
        wait_unsent(dsn, prefix, 0, 90000);
        cq_relay_stats(r.relay, &st);
        ck_assert(!st.pg_down);
        runner_stop(&r);
        check_results(dsn, brokers, prefix, 4, 4);
        cq_producer_destroy(&prod);
}
END_TEST

START_TEST(relay_keeps_rows_when_produce_fails)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        char prefix[96], errstr[512];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_relay_stats_t st;
        rd_kafka_t *mrk;
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_mock_cluster_t *mc;
        runner_t r;
        int i;
        int64_t deadline;

        kt_migrate(dsn);
        /* Only this test's rows in the outbox. */
        kt_pg_exec(dsn,
                   "UPDATE outbox SET sent_at = now() WHERE sent_at IS "
                   "NULL AND failed_at IS NULL",
                   NULL);
        kt_unique("it-relaymock", prefix, sizeof(prefix));
        mrk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        ck_assert_msg(mrk, "%s", errstr);
        mc = rd_kafka_mock_cluster_new(mrk, 1);
        ck_assert_ptr_nonnull(mc);
        cq_store_opts_init(&sopts);
        sopts.dsn = dsn;
        cq_kafka_opts_init(&kopts);
        kopts.brokers = rd_kafka_mock_cluster_bootstraps(mc);
        kopts.store = &sopts;
        kopts.relay_interval_ms = 100;
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);

        /* Every Produce request fails with an error a retry can fix,
         * until the messages time out. */
        kopts.message_timeout_ms = 2000;
        cq_producer_destroy(&prod);
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        {
                rd_kafka_resp_err_t errs[200];

                for (i = 0; i < 200; i++)
                        errs[i] = RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS;
                rd_kafka_mock_push_request_errors_array(mc, 0, 200, errs);
        }
        add_rows(dsn, prefix, 1, 2);
        runner_start(&r, &kopts, prod);
        deadline = cq_now_ms() + 30000;
        do {
                cq_relay_stats(r.relay, &st);
                ck_assert_msg(cq_now_ms() < deadline,
                              "no failed delivery reported");
                kt_sleep_ms(50);
        } while (st.failed < 2);
        ck_assert_int_eq(unsent(dsn, prefix), 2);
        ck_assert_uint_eq(st.sent, 0);
        ck_assert_uint_eq(st.rejected, 0);
        /* Once Produce works again the rows go out. */
        rd_kafka_mock_clear_request_errors(mc, 0);
        wait_unsent(dsn, prefix, 0, 120000);
        runner_stop(&r);
        cq_producer_destroy(&prod);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(mrk);
}
END_TEST

static cq_producer_t *test_producer(const cq_kafka_opts_t *kopts)
{
        char errstr[512];
        cq_producer_t *prod = cq_producer_new(kopts, errstr, sizeof(errstr));

        ck_assert_msg(prod, "%s", errstr);
        return prod;
}

/* Wait until the row of job \p job_id has \p column set. */
static void wait_column(const char *dsn,
                        const char *job_id,
                        const char *column,
                        int timeout_ms)
{
        int64_t deadline = cq_now_ms() + timeout_ms;
        char sql[256];

        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM outbox WHERE job_id = $1 AND %s IS "
                 "NOT NULL",
                 column);
        while (kt_pg_long(dsn, sql, job_id) != 1) {
                ck_assert_msg(cq_now_ms() < deadline, "%s of %s never set",
                              column, job_id);
                kt_sleep_ms(100);
        }
}

/* A job whose answer is 3 MB: its completion event, built by the schema,
 * is over what the broker accepts. The relay delivers it cut under the
 * cap, saying so; the full answer stays in PostgreSQL. */
START_TEST(relay_caps_a_large_answer)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], topic[160], job[160];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_relay_stats_t st;
        kt_msg_t *msgs = NULL;
        json_t *doc;
        runner_t r;
        size_t n;

        kt_services("start-kafka");
        kt_migrate(dsn);
        kt_unique("it-relaybig", prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        snprintf(job, sizeof(job), "%s-1", prefix);
        kt_create_topic(brokers, topic, 1);
        kt_pg_exec(dsn,
                   "INSERT INTO jobs (job_id, prompt, spec, status,"
                   " started_at, finished_at)"
                   " VALUES ($1, 'p', '{}'::jsonb, 'succeeded', now(), now())",
                   job);
        kt_pg_exec(dsn,
                   "INSERT INTO results (job_id, status, answer)"
                   " VALUES ($1, 'succeeded', repeat('0123456789', 314573)"
                   " || 'é')",
                   job);
        kt_pg_exec(dsn,
                   "INSERT INTO outbox (job_id, topic, key, payload)"
                   " VALUES ($1 || '-1', $1 || '.results', $1 || '-1',"
                   " coderq_completion_event($1 || '-1'))",
                   prefix);
        ck_assert_int_gt(kt_pg_long(dsn,
                                    "SELECT length(payload::text) FROM outbox"
                                    " WHERE job_id = $1",
                                    job),
                         3000000);
        cq_store_opts_init(&sopts);
        sopts.dsn = dsn;
        cq_kafka_opts_init(&kopts);
        kopts.brokers = brokers;
        kopts.store = &sopts;
        prod = test_producer(&kopts);
        runner_start(&r, &kopts, prod);
        wait_column(dsn, job, "sent_at", 60000);
        cq_relay_stats(r.relay, &st);
        ck_assert_uint_ge(st.truncated, 1);
        runner_stop(&r);
        n = kt_consume(brokers, topic, 1, 1, 60000, &msgs);
        ck_assert_uint_eq(n, 1);
        ck_assert_uint_le(msgs[0].len, kopts.event_max_bytes);
        doc = json_loadb(msgs[0].value, msgs[0].len, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "job_id")),
                         job);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "status")),
                         "succeeded");
        ck_assert(json_is_true(json_object_get(doc, "answer_truncated")));
        ck_assert_int_eq(
            json_integer_value(json_object_get(doc, "answer_bytes")),
            kt_pg_long(dsn,
                       "SELECT octet_length(answer) FROM results"
                       " WHERE job_id = $1",
                       job));
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(doc, "answer_ref"), "job_id")),
                         job);
        ck_assert_uint_gt(json_string_length(json_object_get(doc, "answer")),
                          200000);
        json_decref(doc);
        kt_msgs_free(msgs, n);
        cq_producer_destroy(&prod);
}
END_TEST

/* With a cap above what the broker accepts, the 3 MB event is refused for
 * good: its row is marked failed with the error and counted, and the rows
 * behind it are still delivered. */
START_TEST(relay_marks_refused_rows_failed)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        static const char *const conf[] = {"message.max.bytes", "10000000",
                                           NULL};
        char prefix[96], topic[160], big[160];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_relay_stats_t st;
        cq_store_t *store;
        json_t *sum;
        char errstr[256];
        runner_t r;
        long failed;

        kt_services("start-kafka");
        kt_migrate(dsn);
        kt_unique("it-relayrefused", prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        snprintf(big, sizeof(big), "%s-0", prefix);
        kt_create_topic(brokers, topic, 1);
        failed = kt_pg_long(dsn,
                            "SELECT count(*) FROM outbox WHERE failed_at IS "
                            "NOT NULL",
                            NULL);
        kt_pg_exec(dsn,
                   "INSERT INTO jobs (job_id, prompt, spec, status,"
                   " finished_at)"
                   " VALUES ($1, 'p', '{}'::jsonb, 'succeeded', now())",
                   big);
        kt_pg_exec(dsn,
                   "INSERT INTO outbox (job_id, topic, key, payload)"
                   " VALUES ($1 || '-0', $1 || '.results', $1 || '-0',"
                   " jsonb_build_object('job_id', $1 || '-0', 'answer',"
                   " repeat('x', 3000000)))",
                   prefix);
        add_rows(dsn, prefix, 1, 3);
        cq_store_opts_init(&sopts);
        sopts.dsn = dsn;
        cq_kafka_opts_init(&kopts);
        kopts.brokers = brokers;
        kopts.store = &sopts;
        kopts.conf = conf;
        kopts.event_max_bytes = 8u << 20;
        kopts.relay_batch = 1; /* the refused row first, alone */
        prod = test_producer(&kopts);
        runner_start(&r, &kopts, prod);
        wait_column(dsn, big, "failed_at", 60000);
        wait_unsent(dsn, prefix, 1, 60000);
        cq_relay_stats(r.relay, &st);
        ck_assert_uint_eq(st.rejected, 1);
        runner_stop(&r);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM outbox WHERE"
                                    " job_id = $1 AND sent_at IS NULL AND"
                                    " error ILIKE '%too large%'",
                                    big),
                         1);
        check_results(dsn, brokers, prefix, 3, 3);
        store = cq_store_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(store, "%s", errstr);
        ck_assert_int_eq(cq_store_outbox_summary(store, 1, &sum), CQ_OK);
        ck_assert_int_eq(json_integer_value(json_object_get(sum, "failed")),
                         failed + 1);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(sum, "failed_rows"), 0),
                "job_id")),
            big);
        json_decref(sum);
        cq_store_destroy(&store);
        cq_producer_destroy(&prod);
}
END_TEST

typedef struct fleet {
        cq_producer_t *prod[4];
        runner_t r[4];
        int n;
} fleet_t;

static void fleet_start(fleet_t *f, int n, const cq_kafka_opts_t *kopts)
{
        int i;

        f->n = n;
        for (i = 0; i < n; i++) {
                f->prod[i] = test_producer(kopts);
                runner_start(&f->r[i], kopts, f->prod[i]);
        }
}

static void fleet_stop(fleet_t *f)
{
        int i;

        for (i = 0; i < f->n; i++) {
                runner_stop(&f->r[i]);
                cq_producer_destroy(&f->prod[i]);
        }
}

/* Four relays over one outbox, rows arriving while they run: each row is
 * produced once. */
START_TEST(relays_of_a_fleet_send_each_row_once)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], topic[160];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        fleet_t f;
        int k;

        kt_services("start-kafka");
        kt_migrate(dsn);
        kt_unique("it-relayfleet", prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        kt_create_topic(brokers, topic, 1);
        cq_store_opts_init(&sopts);
        sopts.dsn = dsn;
        cq_kafka_opts_init(&kopts);
        kopts.brokers = brokers;
        kopts.store = &sopts;
        kopts.relay_interval_ms = 5;
        kopts.relay_batch = 7;
        fleet_start(&f, 4, &kopts);
        for (k = 0; k < 20; k++) {
                add_rows(dsn, prefix, k * 10 + 1, 10);
                kt_sleep_ms(20); /* spread the arrivals, not a wait */
        }
        wait_unsent(dsn, prefix, 0, 120000);
        fleet_stop(&f);
        check_results(dsn, brokers, prefix, 200, 200);
        ck_assert_int_eq(kt_high_sum(brokers, topic, 1), 200);
}
END_TEST

/* A relay that dies after its delivery and before marking the row sent:
 * its claim expires and another relay sends the row again, once: one
 * duplicate for the dead relay, none for the other rows. */
START_TEST(relay_takes_over_the_claims_of_a_dead_relay)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], topic[160], errstr[512];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_store_t *store;
        cq_outbox_t box;
        rd_kafka_headers_t *hdrs = NULL;
        cq_dr_t *dr;
        rd_kafka_resp_err_t err;
        rd_kafka_msg_status_t status;
        int64_t deadline;
        fleet_t f;
        size_t i, dead = 0;

        kt_services("start-kafka");
        kt_migrate(dsn);
        kt_unique("it-relaydead", prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        kt_create_topic(brokers, topic, 1);
        cq_store_opts_init(&sopts);
        sopts.dsn = dsn;
        cq_kafka_opts_init(&kopts);
        kopts.brokers = brokers;
        kopts.store = &sopts;
        kopts.relay_interval_ms = 20;
        add_rows(dsn, prefix, 1, 10);
        /* The dead relay: claims everything for 3 s, delivers its first
         * row of this test, never marks it. */
        store = cq_store_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(store, "%s", errstr);
        cq_outbox_init(&box);
        ck_assert_int_eq(
            cq_store_outbox_claim(store, "dead", 100000, 3000, &box), CQ_OK);
        prod = test_producer(&kopts);
        for (i = 0; i < box.n; i++)
                if (strcmp(box.v[i].topic, topic) == 0)
                        break;
        ck_assert_uint_lt(i, box.n);
        dead = i;
        dr = cq_dr_new(prod);
        ck_assert_ptr_nonnull(dr);
        hdrs = rd_kafka_headers_new(1);
        rd_kafka_header_add(hdrs, "event_id", -1, box.v[dead].event_id, -1);
        ck_assert_int_eq(
            cq_producer_send(prod, topic, box.v[dead].key,
                             strlen(box.v[dead].key), box.v[dead].payload,
                             strlen(box.v[dead].payload), &hdrs, dr),
            0);
        deadline = cq_now_ms() + 30000;
        while (!cq_dr_done(prod, dr, &err, &status)) {
                ck_assert_msg(cq_now_ms() < deadline, "no delivery report");
                kt_sleep_ms(20);
        }
        ck_assert_int_eq(err, 0);
        cq_dr_put(prod, &dr);
        cq_producer_destroy(&prod);
        cq_store_destroy(&store);
        /* Two live relays: nothing moves until the claims expire, then
         * every row goes out once more. */
        fleet_start(&f, 2, &kopts);
        wait_unsent(dsn, prefix, 0, 60000);
        fleet_stop(&f);
        check_results(dsn, brokers, prefix, 10, 11);
        ck_assert_int_eq(kt_high_sum(brokers, topic, 1), 11);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT attempts FROM outbox WHERE"
                                    " event_id::text = $1",
                                    box.v[dead].event_id),
                         2);
        cq_outbox_release(&box);
}
END_TEST

/* A relay with nothing to send looks less and less often: each empty
 * look doubles its pause, from relay_interval_ms up to relay_idle_ms;
 * a row written behind its back (no kick) still goes out at its next
 * look. Load on the machine can only make it look less. */
START_TEST(idle_relay_backs_off)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], errstr[512];
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_relay_stats_t st;
        runner_t r;

        relay_fixture("it-relayidle", prefix, sizeof(prefix), &sopts, &kopts);
        kt_pg_exec(dsn,
                   "UPDATE outbox SET sent_at = now() WHERE sent_at IS "
                   "NULL AND failed_at IS NULL",
                   NULL);
        kopts.relay_interval_ms = 20;
        kopts.relay_idle_ms = 640;
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        runner_start(&r, &kopts, prod);
        kt_sleep_ms(4000);
        cq_relay_stats(r.relay, &st);
        /* 20 + 40 + ... + 320 ms, then every 640 ms: 11 looks in 4 s
         * (a look every 20 ms would be 200) */
        ck_assert_uint_ge(st.claims, 1);
        ck_assert_uint_le(st.claims, 12);
        ck_assert_uint_eq(st.empty, st.claims);
        add_rows(dsn, prefix, 1, 1);
        wait_unsent(dsn, prefix, 0, 30000);
        cq_relay_stats(r.relay, &st);
        ck_assert_uint_eq(st.empty + 1, st.claims);
        runner_stop(&r);
        check_results(dsn, brokers, prefix, 1, 1);
        cq_producer_destroy(&prod);
}
END_TEST

START_TEST(events_arrive_with_increasing_seq)
{
        const char *brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        char prefix[96], topic[160], errstr[512], job[2][160];
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_events_t *events;
        cq_events_stats_t st;
        kt_msg_t *msgs = NULL;
        int64_t last[2] = {0, 0};
        size_t n, i;
        int k, j;

        kt_unique("it-events", prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.events", prefix);
        kt_create_topic(brokers, topic, 1);
        cq_kafka_opts_init(&kopts);
        kopts.brokers = brokers;
        kopts.topic_events = topic;
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        events = cq_events_new(&kopts, prod, errstr, sizeof(errstr));
        ck_assert_msg(events, "%s", errstr);
        for (j = 0; j < 2; j++)
                snprintf(job[j], sizeof(job[j]), "%s-job%d", prefix, j);
        for (k = 0; k < 10; k++) {
                for (j = 0; j < 2; j++) {
                        /* "seq" and "type" in data must not win. */
                        json_t *data =
                            json_pack("{s:s, s:i, s:s, s:i}", "text", "hello",
                                      "seq", 999, "type", "bogus", "k", k);

                        ck_assert_int_eq(
                            cq_events_publish(
                                events, job[j],
                                k == 9 ? "job.finished" : "cell.output", data),
                            0);
                        json_decref(data);
                }
        }
        n = kt_consume(brokers, topic, 1, 20, 60000, &msgs);
        ck_assert_uint_eq(n, 20);
        for (i = 0; i < n; i++) {
                json_error_t jerr;
                json_t *doc = json_loadb(msgs[i].value, msgs[i].len, 0, &jerr);
                int64_t seq;

                ck_assert_msg(doc, "%s", jerr.text);
                j = strcmp(msgs[i].key, job[0]) == 0 ? 0 : 1;
                ck_assert_str_eq(msgs[i].key, job[j]);
                ck_assert_str_eq(
                    json_string_value(json_object_get(doc, "job_id")), job[j]);
                seq = json_integer_value(json_object_get(doc, "seq"));
                ck_assert_int_eq(seq, last[j] + 1);
                last[j] = seq;
                ck_assert_str_eq(
                    json_string_value(json_object_get(doc, "type")),
                    seq == 10 ? "job.finished" : "cell.output");
                ck_assert_str_eq(
                    json_string_value(json_object_get(doc, "text")), "hello");
                ck_assert_int_eq(json_integer_value(json_object_get(doc, "k")),
                                 seq - 1);
                ck_assert_ptr_nonnull(
                    json_string_value(json_object_get(doc, "ts")));
                json_decref(doc);
        }
        ck_assert_int_eq(last[0], 10);
        ck_assert_int_eq(last[1], 10);
        kt_msgs_free(msgs, n);
        /* job.finished forgot the counters: a new event starts at 1. */
        ck_assert_int_eq(cq_events_publish(events, job[0], "job.claimed", NULL),
                         0);
        cq_events_stats(events, &st);
        ck_assert_uint_eq(st.published, 21);
        ck_assert_uint_eq(st.dropped, 0);
        cq_events_destroy(&events);
        cq_producer_destroy(&prod);
        n = kt_consume(brokers, topic, 1, 21, 60000, &msgs);
        ck_assert_uint_eq(n, 21);
        {
                json_t *doc = json_loadb(msgs[20].value, msgs[20].len, 0, NULL);

                ck_assert_ptr_nonnull(doc);
                ck_assert_int_eq(
                    json_integer_value(json_object_get(doc, "seq")), 1);
                json_decref(doc);
        }
        kt_msgs_free(msgs, n);
}
END_TEST

static Suite *relay_suite(void)
{
        Suite *s = suite_create("it_relay");
        TCase *tc = tcase_create("relay");

        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, relay_marks_sent_and_survives_broker_outage);
        tcase_add_test(tc, relay_waits_for_postgres);
        tcase_add_test(tc, relay_keeps_rows_when_produce_fails);
        tcase_add_test(tc, relay_caps_a_large_answer);
        tcase_add_test(tc, relay_marks_refused_rows_failed);
        tcase_add_test(tc, relays_of_a_fleet_send_each_row_once);
        tcase_add_test(tc, relay_takes_over_the_claims_of_a_dead_relay);
        tcase_add_test(tc, events_arrive_with_increasing_seq);
        tcase_add_test(tc, idle_relay_backs_off);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(relay_suite)
