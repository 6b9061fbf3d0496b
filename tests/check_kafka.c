/* SPDX-License-Identifier: MIT */
/* check_kafka.c - the Kafka modules without a broker or PostgreSQL:
 * librdkafka's mock cluster for fault injection (a failed final commit
 * must be reported; a refused DLQ delivery must keep the offset unstored),
 * events dropping when their queue is full, the settings rows, the
 * completion event cap and which produce errors are permanent. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "check_support.h"
#include "coderq/common/config.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/util.h"
#include "support/kafka_test.h"
#include "../consumer/kafka_int.h"

#define OFFSET_COMMIT 8
#define PRODUCE       0

typedef struct mock {
        rd_kafka_t *rk; /* owns the cluster */
        rd_kafka_mock_cluster_t *mc;
        const char *brokers;
        char topic[80], dlq[96], group[96];
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_intake_t *intake;
        atomic_int stop;
        int rc;
        pthread_t thread;
} mock_t;

static void *run_intake(void *arg)
{
        mock_t *m = arg;

        m->rc = cq_intake_run(m->intake, &m->stop);
        return NULL;
}

static void mock_setup(mock_t *m, int nbad)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char errstr[512];
        rd_kafka_t *prk;
        int i;

        memset(m, 0, sizeof(*m));
        m->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        ck_assert_msg(m->rk, "%s", errstr);
        m->mc = rd_kafka_mock_cluster_new(m->rk, 1);
        ck_assert_ptr_nonnull(m->mc);
        m->brokers = rd_kafka_mock_cluster_bootstraps(m->mc);
        kt_unique("mock", m->topic, sizeof(m->topic));
        snprintf(m->dlq, sizeof(m->dlq), "%s-dlq", m->topic);
        snprintf(m->group, sizeof(m->group), "%s-group", m->topic);
        ck_assert_int_eq(rd_kafka_mock_topic_create(m->mc, m->topic, 1, 1), 0);
        ck_assert_int_eq(rd_kafka_mock_topic_create(m->mc, m->dlq, 1, 1), 0);
        prk = kt_producer(m->brokers);
        for (i = 0; i < nbad; i++) {
                char value[64];
                int n = snprintf(value, sizeof(value), "not json %d", i);

                kt_produce(prk, m->topic, 0, NULL, 0, value, (size_t)n, NULL);
        }
        kt_flush(prk);
        kt_producer_destroy(prk);

        cq_kafka_opts_init(&m->kopts);
        m->kopts.brokers = m->brokers;
        m->kopts.topic_jobs = m->topic;
        m->kopts.topic_dlq = m->dlq;
        m->kopts.group = m->group;
        m->kopts.backlog_max = 0; /* no PostgreSQL here */
        m->kopts.session_timeout_ms = 6000;
        /* Only the final commit commits: auto-commit would race it. */
        m->kopts.commit_interval_ms = 600000;
        m->kopts.flush_timeout_ms = 2000;
}

static void mock_run(mock_t *m)
{
        char errstr[512];

        m->prod = cq_producer_new(&m->kopts, errstr, sizeof(errstr));
        ck_assert_msg(m->prod, "%s", errstr);
        m->intake = cq_intake_new(&m->kopts, m->prod, errstr, sizeof(errstr));
        ck_assert_msg(m->intake, "%s", errstr);
        ck_assert_int_eq(pthread_create(&m->thread, NULL, run_intake, m), 0);
}

static void mock_stop(mock_t *m)
{
        atomic_store(&m->stop, 1);
        pthread_join(m->thread, NULL);
}

static void mock_release(mock_t *m)
{
        cq_intake_destroy(&m->intake);
        cq_producer_destroy(&m->prod);
        rd_kafka_mock_cluster_destroy(m->mc);
        rd_kafka_destroy(m->rk);
}

static void wait_dlq(mock_t *m, uint64_t n, int timeout_ms)
{
        cq_intake_stats_t st;
        int64_t deadline = cq_now_ms() + timeout_ms;

        for (;;) {
                cq_intake_stats(m->intake, &st);
                if (st.dlq == n && st.stored == n)
                        return;
                ck_assert_msg(cq_now_ms() < deadline,
                              "dlq %llu stored %llu, waiting for %llu",
                              (unsigned long long)st.dlq,
                              (unsigned long long)st.stored,
                              (unsigned long long)n);
                kt_sleep_ms(50);
        }
}

START_TEST(final_commit_succeeds)
{
        mock_t m;

        mock_setup(&m, 3);
        mock_run(&m);
        wait_dlq(&m, 3, 60000);
        mock_stop(&m);
        ck_assert_msg(m.rc == 0, "%s", cq_intake_errmsg(m.intake));
        ck_assert_int_eq(kt_committed_sum(m.brokers, m.group, m.topic, 1), 3);
        mock_release(&m);
}
END_TEST

START_TEST(final_commit_failure_is_reported)
{
        mock_t m;

        mock_setup(&m, 3);
        mock_run(&m);
        wait_dlq(&m, 3, 60000);
        /* a refusal no retry fixes (a rebalance in progress is retried:
         * check_it_intake covers that) */
        rd_kafka_mock_push_request_errors(
            m.mc, OFFSET_COMMIT, 3,
            RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED,
            RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED,
            RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED);
        mock_stop(&m);
        ck_assert_int_eq(m.rc, -1);
        ck_assert_msg(strstr(cq_intake_errmsg(m.intake),
                             "could not commit offsets") != NULL,
                      "errmsg: %s", cq_intake_errmsg(m.intake));
        mock_release(&m);
}
END_TEST

START_TEST(refused_dlq_delivery_keeps_offset)
{
        mock_t m;
        cq_intake_stats_t st;
        rd_kafka_resp_err_t errs[20];
        int i;
        int64_t deadline;

        for (i = 0; i < 20; i++)
                errs[i] = RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
        mock_setup(&m, 1);
        /* The DLQ's Produce requests fail until the errors are cleared. */
        rd_kafka_mock_push_request_errors_array(m.mc, PRODUCE, 20, errs);
        mock_run(&m);
        deadline = cq_now_ms() + 60000;
        do {
                cq_intake_stats(m.intake, &st);
                ck_assert_msg(cq_now_ms() < deadline, "no DLQ failure seen");
                kt_sleep_ms(50);
        } while (st.dlq_retries < 1);
        ck_assert_uint_eq(st.stored, 0);
        ck_assert_uint_eq(st.dlq, 0);
        rd_kafka_mock_clear_request_errors(m.mc, PRODUCE);
        wait_dlq(&m, 1, 60000);
        mock_stop(&m);
        ck_assert_msg(m.rc == 0, "%s", cq_intake_errmsg(m.intake));
        ck_assert_int_eq(kt_committed_sum(m.brokers, m.group, m.topic, 1), 1);
        mock_release(&m);
}
END_TEST

/* A mock cluster of one broker (kept alive by *\p rkp) with a fresh
 * events topic of \p parts partitions, and \p kopts pointing at it. */
static rd_kafka_mock_cluster_t *mock_events(rd_kafka_t **rkp,
                                            const char *prefix,
                                            int parts,
                                            char *topic,
                                            size_t topic_size,
                                            cq_kafka_opts_t *kopts)
{
        char errstr[512];
        rd_kafka_mock_cluster_t *mc;

        *rkp = rd_kafka_new(RD_KAFKA_PRODUCER, rd_kafka_conf_new(), errstr,
                            sizeof(errstr));
        ck_assert_msg(*rkp, "%s", errstr);
        mc = rd_kafka_mock_cluster_new(*rkp, 1);
        ck_assert_ptr_nonnull(mc);
        kt_unique(prefix, topic, topic_size);
        ck_assert_int_eq(rd_kafka_mock_topic_create(mc, topic, parts, 1), 0);
        cq_kafka_opts_init(kopts);
        kopts->brokers = rd_kafka_mock_cluster_bootstraps(mc);
        kopts->topic_events = topic;
        return mc;
}

START_TEST(fatal_producer_error_recreates_it)
{
        rd_kafka_t *rk;
        rd_kafka_mock_cluster_t *mc;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_events_t *events;
        char errstr[512], topic[80];
        kt_msg_t *msgs = NULL;
        size_t n;
        int64_t deadline;

        mc = mock_events(&rk, "mock-ev", 1, topic, sizeof(topic), &kopts);
        kopts.flush_timeout_ms = 2000;
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        events = cq_events_new(&kopts, prod, errstr, sizeof(errstr));
        ck_assert_msg(events, "%s", errstr);
        ck_assert_int_eq(cq_events_publish(events, "j", "job.claimed", NULL),
                         0);
        n = kt_consume(kopts.brokers, topic, 1, 1, 30000, &msgs);
        ck_assert_uint_eq(n, 1);
        kt_msgs_free(msgs, n);

        ck_assert_int_eq(cq_producer_test_fatal(prod), 0);
        deadline = cq_now_ms() + 30000;
        while (cq_producer_recreated(prod) < 1) {
                ck_assert_msg(cq_now_ms() < deadline, "not recreated");
                kt_sleep_ms(20);
        }
        /* The new client works: the next event arrives with seq 2. */
        ck_assert_int_eq(cq_events_publish(events, "j", "llm.reply", NULL), 0);
        n = kt_consume(kopts.brokers, topic, 1, 2, 30000, &msgs);
        ck_assert_uint_eq(n, 2);
        ck_assert_ptr_nonnull(strstr(msgs[1].value, "\"seq\":2"));
        kt_msgs_free(msgs, n);
        cq_events_destroy(&events);
        cq_producer_destroy(&prod);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
}
END_TEST

START_TEST(events_drop_when_queue_full)
{
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_events_t *events;
        cq_events_stats_t st;
        char errstr[512];
        int i, ok = 0;

        cq_kafka_opts_init(&kopts);
        kopts.brokers = "127.0.0.1:1"; /* nothing listens: all stay queued */
        kopts.events_queue_max = 3;
        kopts.flush_timeout_ms = 100;
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        events = cq_events_new(&kopts, prod, errstr, sizeof(errstr));
        ck_assert_msg(events, "%s", errstr);
        for (i = 0; i < 10; i++)
                if (cq_events_publish(events, "job-1", "cell.started", NULL) ==
                    0)
                        ok++;
        ck_assert_int_eq(ok, 3);
        ck_assert_int_eq(cq_events_publish(events, NULL, "x", NULL), -1);
        ck_assert_int_eq(cq_events_publish(events, "job-1", "", NULL), -1);
        cq_events_stats(events, &st);
        ck_assert_uint_eq(st.published, 3);
        ck_assert_uint_eq(st.dropped, 9);
        cq_events_destroy(&events);
        cq_producer_destroy(&prod);
}
END_TEST

/* The events' producer as the worker makes it (a long linger, lz4): the
 * events of jobs published interleaved arrive each job's in order with no
 * gap, and a producer destroyed right after publishing (a worker that
 * stops) still sends what it was holding back. */
START_TEST(batched_events_arrive_in_order)
{
        rd_kafka_t *rk;
        rd_kafka_mock_cluster_t *mc;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_events_t *events;
        cq_events_stats_t st;
        char errstr[512], topic[80], job[3][16];
        kt_msg_t *msgs = NULL;
        int64_t next[3] = {1, 1, 1};
        size_t n, i;
        int j, k;

        mc = mock_events(&rk, "mock-batch", 3, topic, sizeof(topic), &kopts);
        kopts.flush_timeout_ms = 10000;
        kopts.linger_ms = 1000; /* longer than the test's publishing */
        kopts.compression = "lz4";
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        ck_assert_msg(prod, "%s", errstr);
        events = cq_events_new(&kopts, prod, errstr, sizeof(errstr));
        ck_assert_msg(events, "%s", errstr);
        for (j = 0; j < 3; j++)
                snprintf(job[j], sizeof(job[j]), "job-%d", j);
        for (k = 0; k < 40; k++)
                for (j = 0; j < 3; j++) {
                        json_t *data = json_pack("{s:i}", "k", k);

                        ck_assert_ptr_nonnull(data);
                        ck_assert_int_eq(
                            cq_events_publish(
                                events, job[j],
                                k == 39 ? "job.finished" : "cell.output", data),
                            0);
                        json_decref(data);
                }
        cq_events_stats(events, &st);
        ck_assert_uint_eq(st.published, 120);
        cq_events_destroy(&events);
        cq_producer_destroy(&prod); /* flushes what lingers */

        n = kt_consume(kopts.brokers, topic, 3, 120, 30000, &msgs);
        ck_assert_uint_eq(n, 120);
        for (i = 0; i < n; i++) {
                json_t *ev = json_loadb(msgs[i].value, msgs[i].len, 0, NULL);
                const char *id;

                ck_assert_ptr_nonnull(ev);
                id = json_string_value(json_object_get(ev, "job_id"));
                ck_assert_ptr_nonnull(id);
                ck_assert_str_eq(msgs[i].key, id);
                j = id[4] - '0';
                ck_assert(j >= 0 && j < 3);
                /* kt_consume keeps each partition's order: a job's
                 * events in the order they were published */
                ck_assert_int_eq(json_integer_value(json_object_get(ev, "seq")),
                                 next[j]);
                ck_assert_int_eq(json_integer_value(json_object_get(ev, "k")),
                                 next[j] - 1);
                next[j]++;
                json_decref(ev);
        }
        for (j = 0; j < 3; j++)
                ck_assert_int_eq(next[j], 41);
        kt_msgs_free(msgs, n);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
}
END_TEST

START_TEST(settings_rows)
{
        cq_config_t cfg;
        cq_kafka_opts_t kopts;
        char errstr[256];

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_str_eq(cfg.topic_jobs, "coderq.jobs");
        ck_assert_str_eq(cfg.topic_dlq, "coderq.jobs.dlq");
        ck_assert_str_eq(cfg.topic_results, "coderq.results");
        ck_assert_str_eq(cfg.topic_events, "coderq.events");
        ck_assert_str_eq(cfg.kafka_group, "coderq-workers");
        ck_assert_uint_eq(cfg.job_max_bytes, (size_t)16 << 20);
        ck_assert_int_eq(cfg.backlog_max, 1000);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_BACKLOG_MAX", "-1", NULL,
                                       errstr, sizeof(errstr)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "job-max-bytes", "64k", NULL,
                                       errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "topic-jobs", "x.jobs", NULL,
                                       errstr, sizeof(errstr)),
                         0);
        cq_kafka_opts_from_config(&kopts, &cfg);
        ck_assert_str_eq(kopts.topic_jobs, "x.jobs");
        ck_assert_uint_eq(kopts.job_max, 65536);
        ck_assert_str_eq(kopts.group, "coderq-workers");
        ck_assert_int_eq(kopts.relay_interval_ms, 200);
        ck_assert_int_eq(kopts.linger_ms, 5);
        ck_assert_ptr_null(kopts.compression);
        ck_assert_int_eq(kopts.events_linger_ms, 100);
        ck_assert_int_eq(cq_config_set(&cfg, "events-linger-ms", "6000", NULL,
                                       errstr, sizeof(errstr)),
                         -1);
        ck_assert_uint_eq(kopts.event_max_bytes, 256u << 10);
        ck_assert_int_eq(cq_config_set(&cfg, "event-max-bytes", "1k", NULL,
                                       errstr, sizeof(errstr)),
                         -1);
        cq_config_release(&cfg);
}
END_TEST

/* A 3 MB answer: the event is cut under the cap, says so, says how big
 * the answer was and where it is; the rest of the event is kept. */
START_TEST(event_cap_cuts_the_answer)
{
        size_t alen = 3u << 20, max = 256u << 10, len, outlen;
        char *answer = malloc(alen + 1), *json, *out = NULL, errstr[256];
        json_t *doc, *ev;
        bool cut = false;
        size_t i;

        ck_assert_ptr_nonnull(answer);
        /* Multi-byte characters and escapes, so cuts and escaping count. */
        for (i = 0; i + 3 <= alen; i += 3)
                memcpy(answer + i, i % 2 ? "\xC3\xA9\n" : "a\"\t", 3);
        alen = i;
        answer[alen] = '\0';
        doc = json_pack("{s:s, s:s, s:s, s:i, s:s}", "job_id", "j-big",
                        "status", "succeeded", "answer", answer, "turns", 3,
                        "worker", "w1");
        ck_assert_ptr_nonnull(doc);
        json = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
        len = strlen(json);
        ck_assert_int_eq(cq_event_cap(json, len, max, &out, &outlen, &cut,
                                      errstr, sizeof(errstr)),
                         0);
        ck_assert(cut);
        ck_assert_uint_le(outlen, max);
        ck_assert_uint_gt(outlen, max - max / 100);
        ck_assert_uint_eq(strlen(out), outlen);
        ev = json_loads(out, 0, NULL);
        ck_assert_ptr_nonnull(ev);
        ck_assert(json_is_true(json_object_get(ev, "answer_truncated")));
        ck_assert_int_eq(
            json_integer_value(json_object_get(ev, "answer_bytes")),
            (json_int_t)alen);
        ck_assert_str_eq(json_string_value(json_object_get(ev, "job_id")),
                         "j-big");
        ck_assert_int_eq(json_integer_value(json_object_get(ev, "turns")), 3);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(ev, "answer_ref"), "table")),
                         "results");
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(ev, "answer_ref"), "command")),
                         "coderq export j-big --out DIR");
        /* A prefix of the answer, cut on a character boundary. */
        ck_assert_uint_gt(json_string_length(json_object_get(ev, "answer")), 0);
        ck_assert(
            memcmp(json_string_value(json_object_get(ev, "answer")), answer,
                   json_string_length(json_object_get(ev, "answer"))) == 0);
        json_decref(ev);
        free(out);
        /* Within the cap: copied as it is. */
        ck_assert_int_eq(cq_event_cap(json, len, len, &out, &outlen, &cut,
                                      errstr, sizeof(errstr)),
                         0);
        ck_assert(!cut);
        ck_assert_uint_eq(outlen, len);
        ck_assert_str_eq(out, json);
        free(out);
        free(json);
        free(answer);
}
END_TEST

/* Too large without an answer to cut: only the identity is kept; not an
 * object: refused. */
START_TEST(event_cap_keeps_the_identity)
{
        json_t *doc = json_object(), *ev, *imgs = json_array();
        char *json, *out = NULL, errstr[256];
        size_t outlen;
        bool cut = false;
        int i;

        for (i = 0; i < 5000; i++)
                json_array_append_new(
                    imgs, json_pack("{s:s, s:i}", "name", "plot.png", "i", i));
        json_object_set_new(doc, "job_id", json_string("j-img"));
        json_object_set_new(doc, "status", json_string("failed"));
        json_object_set_new(doc, "images", imgs);
        /* what evaluators read off an event stays */
        json_object_set_new(doc, "reason_code", json_string("budget"));
        json_object_set_new(doc, "cost_usd", json_real(0.25));
        json_object_set_new(doc, "model", json_string("gpt-4o-mini"));
        json_object_set_new(doc, "from_memory", json_false());
        json_object_set_new(doc, "memory_source_job", json_string("j-0"));
        json_object_set_new(doc, "retry_of", json_string("j"));
        json_object_set_new(doc, "run_attempt", json_integer(2));
        json = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
        ck_assert_int_eq(cq_event_cap(json, strlen(json), 4096, &out, &outlen,
                                      &cut, errstr, sizeof(errstr)),
                         0);
        ck_assert(cut);
        ck_assert_uint_le(outlen, 4096);
        ev = json_loads(out, 0, NULL);
        ck_assert_ptr_nonnull(ev);
        ck_assert_str_eq(json_string_value(json_object_get(ev, "job_id")),
                         "j-img");
        ck_assert_str_eq(json_string_value(json_object_get(ev, "status")),
                         "failed");
        ck_assert(json_is_true(json_object_get(ev, "event_truncated")));
        ck_assert_int_eq(json_integer_value(json_object_get(ev, "event_bytes")),
                         (json_int_t)strlen(json));
        ck_assert_ptr_null(json_object_get(ev, "images"));
        ck_assert_str_eq(json_string_value(json_object_get(ev, "reason_code")),
                         "budget");
        ck_assert_double_eq(json_real_value(json_object_get(ev, "cost_usd")),
                            0.25);
        ck_assert_str_eq(json_string_value(json_object_get(ev, "model")),
                         "gpt-4o-mini");
        ck_assert(json_is_false(json_object_get(ev, "from_memory")));
        ck_assert_str_eq(
            json_string_value(json_object_get(ev, "memory_source_job")), "j-0");
        ck_assert_str_eq(json_string_value(json_object_get(ev, "retry_of")),
                         "j");
        ck_assert_int_eq(json_integer_value(json_object_get(ev, "run_attempt")),
                         2);
        json_decref(ev);
        free(out);
        free(json);
        ck_assert_int_eq(cq_event_cap("[1,2,3,4,5,6,7,8,9]", 19, 4, &out,
                                      &outlen, &cut, errstr, sizeof(errstr)),
                         -1);
        ck_assert_ptr_null(out);
        ck_assert_ptr_nonnull(strstr(errstr, "not a JSON object"));
}
END_TEST

START_TEST(permanent_produce_errors)
{
        ck_assert(cq_kafka_err_permanent(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
        ck_assert(cq_kafka_err_permanent(RD_KAFKA_RESP_ERR_INVALID_MSG));
        ck_assert(
            cq_kafka_err_permanent(RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE));
        ck_assert(cq_kafka_err_permanent(
            RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED));
        ck_assert(!cq_kafka_err_permanent(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT));
        ck_assert(!cq_kafka_err_permanent(RD_KAFKA_RESP_ERR__QUEUE_FULL));
        ck_assert(!cq_kafka_err_permanent(RD_KAFKA_RESP_ERR__TRANSPORT));
        ck_assert(!cq_kafka_err_permanent(RD_KAFKA_RESP_ERR__PURGE_QUEUE));
        ck_assert(!cq_kafka_err_permanent(RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
        ck_assert(!cq_kafka_err_permanent(
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION));
        ck_assert(!cq_kafka_err_permanent(RD_KAFKA_RESP_ERR_NO_ERROR));
}
END_TEST

static Suite *kafka_suite(void)
{
        Suite *s = suite_create("kafka");
        TCase *tc = tcase_create("mock");
        TCase *plain = tcase_create("plain");

        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, final_commit_succeeds);
        tcase_add_test(tc, final_commit_failure_is_reported);
        tcase_add_test(tc, refused_dlq_delivery_keeps_offset);
        tcase_add_test(tc, fatal_producer_error_recreates_it);
        tcase_add_test(tc, batched_events_arrive_in_order);
        suite_add_tcase(s, tc);
        tcase_set_timeout(plain, 60);
        tcase_add_test(plain, events_drop_when_queue_full);
        tcase_add_test(plain, settings_rows);
        tcase_add_test(plain, event_cap_cuts_the_answer);
        tcase_add_test(plain, event_cap_keeps_the_identity);
        tcase_add_test(plain, permanent_produce_errors);
        suite_add_tcase(s, plain);
        return s;
}

CQ_CHECK_MAIN(kafka_suite)
