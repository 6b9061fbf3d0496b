/* SPDX-License-Identifier: MIT */
/* check_it_intake.c - the intake against a real broker and PostgreSQL:
 * hostile input to the DLQ unchanged, valid jobs upserted once, offsets
 * committed to the high watermark, restart from committed offsets,
 * PostgreSQL outages and back-pressure. Needs scripts/services.sh start
 * and its env (CODERQ_PG_DSN, CODERQ_KAFKA_BROKERS, the port variables). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "check_support.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/util.h"
#include "support/kafka_test.h"

#define NPARTS               2
#define APIKEY_OFFSET_COMMIT 8 /* Kafka protocol ApiKey */

typedef struct runner {
        cq_intake_t *intake;
        atomic_int stop;
        int rc;
        pthread_t thread;
} runner_t;

static void *run_intake(void *arg)
{
        runner_t *r = arg;

        r->rc = cq_intake_run(r->intake, &r->stop);
        return NULL;
}

typedef struct fixture {
        char topic[160], dlq[160], group[160], results[160], prefix[96];
        const char *dsn, *brokers;
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
} fixture_t;

/* Store and Kafka options for the fixture's names, and its producer. */
static void fixture_opts(fixture_t *fx)
{
        char errstr[512];

        cq_store_opts_init(&fx->sopts);
        fx->sopts.dsn = fx->dsn;
        cq_kafka_opts_init(&fx->kopts);
        fx->kopts.brokers = fx->brokers;
        fx->kopts.store = &fx->sopts;
        fx->kopts.topic_jobs = fx->topic;
        fx->kopts.topic_dlq = fx->dlq;
        fx->kopts.topic_results = fx->results;
        fx->kopts.group = fx->group;
        fx->kopts.job_max = 8192;
        fx->kopts.backlog_max = 0;
        fx->kopts.session_timeout_ms = 10000;
        fx->prod = cq_producer_new(&fx->kopts, errstr, sizeof(errstr));
        ck_assert_msg(fx->prod, "%s", errstr);
}

static void fixture_init(fixture_t *fx, const char *name)
{
        fx->dsn = cq_check_env("CODERQ_PG_DSN");
        fx->brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        /* A failed outage test may have left PostgreSQL stopped: start it
         * (a no-op when it runs). */
        kt_services("start-pg");
        kt_migrate(fx->dsn);
        kt_unique(name, fx->prefix, sizeof(fx->prefix));
        snprintf(fx->topic, sizeof(fx->topic), "%s.jobs", fx->prefix);
        snprintf(fx->dlq, sizeof(fx->dlq), "%s.dlq", fx->prefix);
        snprintf(fx->group, sizeof(fx->group), "%s.group", fx->prefix);
        snprintf(fx->results, sizeof(fx->results), "%s.results", fx->prefix);
        kt_create_topic(fx->brokers, fx->topic, NPARTS);
        kt_create_topic(fx->brokers, fx->dlq, 1);
        kt_create_topic(fx->brokers, fx->results, 1);
        fixture_opts(fx);
}

static void fixture_release(fixture_t *fx) { cq_producer_destroy(&fx->prod); }

static void runner_start(runner_t *r, fixture_t *fx)
{
        char errstr[512];

        memset(r, 0, sizeof(*r));
        r->intake = cq_intake_new(&fx->kopts, fx->prod, errstr, sizeof(errstr));
        ck_assert_msg(r->intake, "%s", errstr);
        ck_assert_int_eq(pthread_create(&r->thread, NULL, run_intake, r), 0);
}

/* Stop, check the final commit succeeded, return the final stats. */
static void runner_stop(runner_t *r, cq_intake_stats_t *st)
{
        atomic_store(&r->stop, 1);
        pthread_join(r->thread, NULL);
        ck_assert_msg(r->rc == 0, "intake failed: %s",
                      cq_intake_errmsg(r->intake));
        cq_intake_stats(r->intake, st);
        cq_intake_destroy(&r->intake);
}

/* Waiting on the group's committed offsets (auto-commit runs each
 * second): \p want, or the end of the topic when it is -1. */
typedef struct commit_wait {
        const fixture_t *fx;
        int64_t want;
} commit_wait_t;

static bool committed_reached(void *arg)
{
        const commit_wait_t *c = arg;
        int64_t want = c->want >= 0
                           ? c->want
                           : kt_high_sum(c->fx->brokers, c->fx->topic, NPARTS);

        return kt_committed_sum(c->fx->brokers, c->fx->group, c->fx->topic,
                                NPARTS) == want;
}

static void wait_committed(const fixture_t *fx, int64_t want)
{
        commit_wait_t c = {fx, want};

        ck_assert_msg(cq_check_wait_until(committed_reached, &c, 30000),
                      "committed offsets %lld, waiting for %lld",
                      (long long)kt_committed_sum(fx->brokers, fx->group,
                                                  fx->topic, NPARTS),
                      (long long)want);
}

/* Wait (bounded) until pred holds on the intake's stats. */
#define WAIT_STATS(r, st, timeout_ms, pred)                                    \
        do {                                                                   \
                int64_t deadline_ = cq_now_ms() + (timeout_ms);                \
                for (;;) {                                                     \
                        cq_intake_stats((r)->intake, &(st));                   \
                        if (pred)                                              \
                                break;                                         \
                        ck_assert_msg(cq_now_ms() < deadline_,                 \
                                      "timed out waiting for " #pred           \
                                      " (received %llu upserted %llu dup "     \
                                      "%llu dlq %llu)",                        \
                                      (unsigned long long)(st).received,       \
                                      (unsigned long long)(st).upserted,       \
                                      (unsigned long long)(st).duplicates,     \
                                      (unsigned long long)(st).dlq);           \
                        kt_sleep_ms(50);                                       \
                }                                                              \
        } while (0)

static void produce_good(
    rd_kafka_t *rk, const fixture_t *fx, const char *tag, int i, bool with_key)
{
        char id[200], value[512];
        int n;

        snprintf(id, sizeof(id), "%s-%s-%d", fx->prefix, tag, i);
        n = snprintf(value, sizeof(value),
                     "{\"job_id\":\"%s\",\"prompt\":\"compute %d squared\","
                     "\"title\":\"t%d\",\"version\":1}",
                     id, i, i);
        kt_produce(rk, fx->topic, -1, with_key ? id : NULL,
                   with_key ? strlen(id) : 0, value, (size_t)n, NULL);
}

/* One hostile message per kind; *lenp set, *keyp maybe changed. The
 * buffer is malloc()ed (NULL for a null value). */
#define BAD_KINDS 20
static char *make_bad(int kind, int i, const char *prefix, size_t *lenp)
{
        char *buf = NULL;
        size_t len = 0, cap = 20000, j;
        int n;

        buf = malloc(cap);
        ck_assert_ptr_nonnull(buf);
        switch (kind) {
        case 0: /* not JSON */
                n = snprintf(buf, cap, "hello %d, not json", i);
                len = (size_t)n;
                break;
        case 1: /* truncated */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"tr",
                             prefix, i);
                len = (size_t)n;
                break;
        case 2: /* wrong type for job_id */
                n = snprintf(buf, cap, "{\"job_id\":%d,\"prompt\":\"p\"}", i);
                len = (size_t)n;
                break;
        case 3: /* missing job_id */
                n = snprintf(buf, cap, "{\"prompt\":\"p%d\"}", i);
                len = (size_t)n;
                break;
        case 4: /* missing prompt */
                n = snprintf(buf, cap, "{\"job_id\":\"%s-bad-%d\"}", prefix, i);
                len = (size_t)n;
                break;
        case 5: /* oversize (cap 8192) but otherwise valid */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"", prefix,
                             i);
                len = (size_t)n;
                for (j = 0; j < 9000; j++)
                        buf[len++] = 'a';
                memcpy(buf + len, "\"}", 2);
                len += 2;
                break;
        case 6: /* unknown version */
                n = snprintf(buf, cap,
                             "{\"version\":2,\"job_id\":\"%s-bad-%d\","
                             "\"prompt\":\"p\"}",
                             prefix, i);
                len = (size_t)n;
                break;
        case 7: /* huge integer */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"p\","
                             "\"priority\":123456789012345678901234567890}",
                             prefix, i);
                len = (size_t)n;
                break;
        case 8: /* huge real */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"p\","
                             "\"priority\":1e999}",
                             prefix, i);
                len = (size_t)n;
                break;
        case 9: /* deep nesting */
                for (j = 0; j < 4000; j++)
                        buf[len++] = '[';
                for (j = 0; j < 4000; j++)
                        buf[len++] = ']';
                break;
        case 10: /* binary junk */
                len = 64 + (size_t)(i % 64);
                for (j = 0; j < len; j++)
                        buf[j] = (char)((j * 131 + (size_t)i * 7) % 256);
                break;
        case 11: /* empty value */
                len = 0;
                break;
        case 12: /* raw NUL bytes inside a string */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"a", prefix,
                             i);
                len = (size_t)n;
                buf[len++] = '\0';
                memcpy(buf + len, "b\"}", 3);
                len += 3;
                break;
        case 13: /* escaped NUL */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":"
                             "\"a\\u0000b\"}",
                             prefix, i);
                len = (size_t)n;
                break;
        case 14: /* not an object */
                n = snprintf(buf, cap, "[\"job\", %d]", i);
                len = (size_t)n;
                break;
        case 15: /* prompt of the wrong type */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":{\"x\":1}}",
                             prefix, i);
                len = (size_t)n;
                break;
        case 16: /* parent is itself */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"p\","
                             "\"parent_job_id\":\"%s-bad-%d\"}",
                             prefix, i, prefix, i);
                len = (size_t)n;
                break;
        case 17: /* null value (tombstone) */
                free(buf);
                *lenp = 0;
                return NULL;
        case 18: /* invalid UTF-8 */
                n = snprintf(buf, cap,
                             "{\"job_id\":\"%s-bad-%d\",\"prompt\":\"\xff\xfe"
                             "\"}",
                             prefix, i);
                len = (size_t)n;
                break;
        default: /* job_id too long */
                n = snprintf(buf, cap, "{\"job_id\":\"");
                len = (size_t)n;
                for (j = 0; j < 200; j++)
                        buf[len++] = 'x';
                n = snprintf(buf + len, cap - len, "%d\",\"prompt\":\"p\"}", i);
                len += (size_t)n;
                break;
        }
        *lenp = len;
        return buf;
}

START_TEST(hostile_input_and_offsets)
{
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        rd_kafka_t *rk;
        char *bad[200];
        size_t badlen[200], n, i;
        kt_msg_t *msgs = NULL;
        int ngood = 0, g = 0, b;
        char like[200], clash[200];

        fixture_init(&fx, "it-intake");
        rk = kt_producer(fx.brokers);
        /* 200 bad messages, each keyed "bad-<i>", 100 good ones between
         * them (every fourth without a key), and one good one twice. */
        for (b = 0; b < 200; b++) {
                char key[32];

                bad[b] = make_bad(b % BAD_KINDS, b, fx.prefix, &badlen[b]);
                snprintf(key, sizeof(key), "bad-%d", b);
                kt_produce(rk, fx.topic, b % NPARTS, key, strlen(key), bad[b],
                           badlen[b], NULL);
                if (b % 2 == 0) {
                        produce_good(rk, &fx, "good", g, g % 4 != 0);
                        g++;
                        ngood++;
                }
        }
        produce_good(rk, &fx, "good", 0, true); /* the same message again */
        {
                /* Other content under good-0's job_id, after it on its
                 * partition: not a redelivery, so not a duplicate. */
                char value[256];
                int vn;

                snprintf(clash, sizeof(clash), "%s-good-0", fx.prefix);
                vn = snprintf(value, sizeof(value),
                              "{\"job_id\":\"%s\",\"prompt\":\"something "
                              "else\"}",
                              clash);
                kt_produce(rk, fx.topic, -1, clash, strlen(clash), value,
                           (size_t)vn, NULL);
        }
        {
                /* A valid job whose key disagrees with its job_id. */
                char value[256];
                int vn = snprintf(value, sizeof(value),
                                  "{\"job_id\":\"%s-keyed\",\"prompt\":\"p\"}",
                                  fx.prefix);

                kt_produce(rk, fx.topic, 0, "other", 5, value, (size_t)vn,
                           NULL);
        }
        kt_flush(rk);

        runner_start(&r, &fx);
        WAIT_STATS(&r, st, 120000,
                   st.dlq == 202 && st.upserted == (uint64_t)ngood &&
                       st.duplicates == 1);
        runner_stop(&r, &st);
        ck_assert_uint_eq(st.received, 200 + ngood + 3);
        ck_assert_uint_eq(st.stored, st.received);
        /* a burst is upserted in batches, never more than it holds */
        ck_assert_uint_ge(st.batches, 1);
        ck_assert_uint_ge(st.batched, 2 * st.batches);
        ck_assert_uint_le(st.batched, st.upserted + st.duplicates);

        /* Every valid job exactly once, with its provenance. */
        snprintf(like, sizeof(like), "%s-good-%%", fx.prefix);
        ck_assert_int_eq(kt_pg_long(fx.dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id "
                                    "LIKE $1 AND source_topic IS NOT NULL "
                                    "AND source_offset >= 0",
                                    like),
                         ngood);
        snprintf(like, sizeof(like), "%s-%%", fx.prefix);
        ck_assert_int_eq(kt_pg_long(fx.dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id "
                                    "LIKE $1",
                                    like),
                         ngood);

        /* the first content of good-0 stands */
        ck_assert_int_eq(kt_pg_long(fx.dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id "
                                    "= $1 AND prompt = 'compute 0 squared'",
                                    clash),
                         1);

        /* Every bad message in the DLQ, unchanged, with its reasons. */
        n = kt_consume(fx.brokers, fx.dlq, 1, 202, 60000, &msgs);
        ck_assert_uint_eq(n, 202);
        for (i = 0; i < n; i++) {
                const char *h;
                int idx;
                char *end;

                h = kt_header(&msgs[i], "error");
                ck_assert_msg(h && strlen(h) > 5, "no error header");
                ck_assert_str_eq(kt_header(&msgs[i], "source_topic"), fx.topic);
                h = kt_header(&msgs[i], "source_partition");
                ck_assert_ptr_nonnull(h);
                ck_assert(strcmp(h, "0") == 0 || strcmp(h, "1") == 0);
                h = kt_header(&msgs[i], "source_offset");
                ck_assert_ptr_nonnull(h);
                ck_assert(strtoll(h, &end, 10) >= 0 && *end == '\0');
                ck_assert_ptr_nonnull(msgs[i].key);
                if (strcmp(msgs[i].key, clash) == 0) {
                        ck_assert_ptr_nonnull(
                            strstr(kt_header(&msgs[i], "error"),
                                   "names a job already stored with other "
                                   "content"));
                        ck_assert_ptr_nonnull(memmem(msgs[i].value, msgs[i].len,
                                                     "something else", 14));
                        continue;
                }
                if (strcmp(msgs[i].key, "other") == 0) {
                        ck_assert_ptr_nonnull(strstr(
                            kt_header(&msgs[i], "error"), "does not match"));
                        continue;
                }
                ck_assert(strncmp(msgs[i].key, "bad-", 4) == 0);
                idx = (int)strtol(msgs[i].key + 4, NULL, 10);
                ck_assert(idx >= 0 && idx < 200);
                ck_assert_uint_eq(msgs[i].len, badlen[idx]);
                if (!bad[idx])
                        ck_assert_ptr_null(msgs[i].value);
                else if (badlen[idx] > 0)
                        ck_assert(
                            memcmp(msgs[i].value, bad[idx], badlen[idx]) == 0);
                if (idx % BAD_KINDS == 5)
                        ck_assert_ptr_nonnull(
                            strstr(kt_header(&msgs[i], "error"), "limit"));
                if (idx % BAD_KINDS == 0)
                        ck_assert_ptr_nonnull(strstr(
                            kt_header(&msgs[i], "error"), "not valid JSON"));
                badlen[idx] = (size_t)-1; /* seen once */
        }
        for (b = 0; b < 200; b++)
                ck_assert_msg(badlen[b] == (size_t)-1,
                              "bad message %d missing from the DLQ", b);
        kt_msgs_free(msgs, n);

        /* Committed offsets reached the end of the topic. */
        ck_assert_int_eq(
            kt_committed_sum(fx.brokers, fx.group, fx.topic, NPARTS),
            kt_high_sum(fx.brokers, fx.topic, NPARTS));

        /* A restart resumes after the committed offsets. */
        for (b = 0; b < 5; b++)
                produce_good(rk, &fx, "later", b, true);
        kt_flush(rk);
        runner_start(&r, &fx);
        WAIT_STATS(&r, st, 60000, st.upserted == 5);
        wait_committed(&fx, -1);
        runner_stop(&r, &st);
        ck_assert_uint_eq(st.received, 5);
        ck_assert_uint_eq(st.duplicates, 0);
        ck_assert_uint_eq(st.dlq, 0);
        ck_assert_int_eq(
            kt_committed_sum(fx.brokers, fx.group, fx.topic, NPARTS),
            kt_high_sum(fx.brokers, fx.topic, NPARTS));

        for (b = 0; b < 200; b++)
                free(bad[b]);
        kt_producer_destroy(rk);
        fixture_release(&fx);
}
END_TEST

START_TEST(postgres_outage_loses_nothing)
{
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        rd_kafka_t *rk;
        char like[200];
        int i;

        fixture_init(&fx, "it-pgdown");
        rk = kt_producer(fx.brokers);
        runner_start(&r, &fx);
        for (i = 0; i < 40; i++)
                produce_good(rk, &fx, "job", i, true);
        kt_flush(rk);
        WAIT_STATS(&r, st, 60000, st.upserted == 40);
        /* Let auto-commit (1 s) catch up, then take PostgreSQL away. */
        wait_committed(&fx, 40);
        kt_services("stop-pg");
        for (i = 40; i < 80; i++)
                produce_good(rk, &fx, "job", i, true);
        kt_flush(rk);
        WAIT_STATS(&r, st, 30000, st.pg_down && st.paused);
        /* The subject of the test, not a synchronisation: time passes
         * during the outage (three auto-commit intervals) and nothing may
         * be upserted, stored or committed meanwhile. */
        kt_sleep_ms(3000);
        cq_intake_stats(r.intake, &st);
        ck_assert(st.pg_down);
        ck_assert_uint_eq(st.upserted, 40);
        ck_assert_uint_eq(st.stored, 40);
        /* Nothing past the rows PostgreSQL has was committed. */
        ck_assert_int_eq(
            kt_committed_sum(fx.brokers, fx.group, fx.topic, NPARTS), 40);
        kt_services("start-pg");
        WAIT_STATS(&r, st, 90000, st.upserted + st.duplicates == 80);
        ck_assert(!st.pg_down);
        runner_stop(&r, &st);
        ck_assert_uint_eq(st.dlq, 0);
        snprintf(like, sizeof(like), "%s-job-%%", fx.prefix);
        ck_assert_int_eq(kt_pg_long(fx.dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id "
                                    "LIKE $1",
                                    like),
                         80);
        ck_assert_int_eq(
            kt_committed_sum(fx.brokers, fx.group, fx.topic, NPARTS), 80);
        kt_producer_destroy(rk);
        fixture_release(&fx);
}
END_TEST

START_TEST(backlog_pauses_and_resumes)
{
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        rd_kafka_t *rk;
        char like[200];
        int i;
        uint64_t held;

        fixture_init(&fx, "it-backlog");
        /* Only this test's jobs count: finish whatever others queued. */
        kt_pg_exec(fx.dsn,
                   "UPDATE jobs SET status = 'cancelled', finished_at = now() "
                   "WHERE status = 'queued'",
                   NULL);
        fx.kopts.backlog_max = 10;
        fx.kopts.backlog_check_ms = 100;
        rk = kt_producer(fx.brokers);
        for (i = 0; i < 30; i++)
                produce_good(rk, &fx, "job", i, true);
        kt_flush(rk);
        runner_start(&r, &fx);
        WAIT_STATS(&r, st, 60000, st.backlog_pauses >= 1 && st.paused);
        /* The subject, not a synchronisation: while paused over its
         * backlog, the intake takes nothing more however long it waits
         * (fifteen backlog checks here). */
        kt_sleep_ms(1500);
        cq_intake_stats(r.intake, &st);
        ck_assert(st.paused);
        held = st.upserted;
        ck_assert_msg(held >= 10 && held <= 12,
                      "upserted %llu while over "
                      "the backlog of 10",
                      (unsigned long long)held);
        wait_committed(&fx, (int64_t)held);
        /* Work the queue off: the intake resumes and takes the rest. */
        snprintf(like, sizeof(like), "%s-job-%%", fx.prefix);
        for (i = 0; i < 600; i++) {
                cq_intake_stats(r.intake, &st);
                if (st.upserted == 30)
                        break;
                kt_pg_exec(fx.dsn,
                           "UPDATE jobs SET status = 'cancelled', "
                           "finished_at = now() WHERE status = 'queued' AND "
                           "job_id LIKE $1",
                           like);
                kt_sleep_ms(100);
        }
        ck_assert_uint_eq(st.upserted, 30);
        ck_assert_uint_ge(st.backlog_pauses, 2);
        kt_pg_exec(fx.dsn,
                   "UPDATE jobs SET status = 'cancelled', finished_at = now() "
                   "WHERE status = 'queued' AND job_id LIKE $1",
                   like);
        WAIT_STATS(&r, st, 10000, !st.paused);
        runner_stop(&r, &st);
        ck_assert_int_eq(
            kt_committed_sum(fx.brokers, fx.group, fx.topic, NPARTS), 30);
        kt_producer_destroy(rk);
        fixture_release(&fx);
}
END_TEST

START_TEST(two_intakes_share_and_hand_over)
{
        fixture_t fx;
        runner_t a, b;
        cq_intake_stats_t sa, sb;
        rd_kafka_t *rk;
        char like[200];
        int i;
        int64_t deadline;

        fixture_init(&fx, "it-group");
        rk = kt_producer(fx.brokers);
        runner_start(&a, &fx);
        runner_start(&b, &fx);
        /* Both members get one of the two partitions (range assignor). */
        deadline = cq_now_ms() + 60000;
        for (;;) {
                cq_intake_stats(a.intake, &sa);
                cq_intake_stats(b.intake, &sb);
                if (sa.assigned == 1 && sb.assigned == 1)
                        break;
                ck_assert_msg(cq_now_ms() < deadline,
                              "assignment %d/%d, expected 1/1", sa.assigned,
                              sb.assigned);
                kt_sleep_ms(100);
        }
        for (i = 0; i < 60; i++)
                produce_good(rk, &fx, "job", i, true);
        kt_flush(rk);
        deadline = cq_now_ms() + 60000;
        for (;;) {
                cq_intake_stats(a.intake, &sa);
                cq_intake_stats(b.intake, &sb);
                if (sa.upserted + sb.upserted == 60)
                        break;
                ck_assert_msg(cq_now_ms() < deadline, "upserted %llu + %llu",
                              (unsigned long long)sa.upserted,
                              (unsigned long long)sb.upserted);
                kt_sleep_ms(100);
        }
        ck_assert_uint_gt(sa.upserted, 0);
        ck_assert_uint_gt(sb.upserted, 0);
        /* One leaves: the other takes both partitions and the rest. */
        runner_stop(&b, &sb);
        WAIT_STATS(&a, sa, 60000, sa.assigned == 2);
        for (i = 60; i < 100; i++)
                produce_good(rk, &fx, "job", i, true);
        kt_flush(rk);
        WAIT_STATS(&a, sa, 60000, sa.upserted + sb.upserted >= 100);
        runner_stop(&a, &sa);
        ck_assert_uint_eq(sa.upserted + sb.upserted, 100);
        snprintf(like, sizeof(like), "%s-job-%%", fx.prefix);
        ck_assert_int_eq(kt_pg_long(fx.dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id "
                                    "LIKE $1",
                                    like),
                         100);
        ck_assert_int_eq(
            kt_committed_sum(fx.brokers, fx.group, fx.topic, NPARTS), 100);
        kt_producer_destroy(rk);
        fixture_release(&fx);
}
END_TEST

/* A fixture on a one-broker mock cluster (for fault injection) with its
 * jobs and DLQ topics of one partition; PostgreSQL is the real one. */
static rd_kafka_mock_cluster_t *
mock_fixture(fixture_t *fx, const char *name, rd_kafka_t **mrkp)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_mock_cluster_t *mc;
        char errstr[512];

        *mrkp = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        ck_assert_msg(*mrkp, "%s", errstr);
        mc = rd_kafka_mock_cluster_new(*mrkp, 1);
        ck_assert_ptr_nonnull(mc);
        memset(fx, 0, sizeof(*fx));
        fx->dsn = cq_check_env("CODERQ_PG_DSN");
        fx->brokers = rd_kafka_mock_cluster_bootstraps(mc);
        kt_migrate(fx->dsn);
        kt_unique(name, fx->prefix, sizeof(fx->prefix));
        snprintf(fx->topic, sizeof(fx->topic), "%s.jobs", fx->prefix);
        snprintf(fx->dlq, sizeof(fx->dlq), "%s.dlq", fx->prefix);
        snprintf(fx->group, sizeof(fx->group), "%s.group", fx->prefix);
        ck_assert_int_eq(rd_kafka_mock_topic_create(mc, fx->topic, 1, 1), 0);
        ck_assert_int_eq(rd_kafka_mock_topic_create(mc, fx->dlq, 1, 1), 0);
        fixture_opts(fx);
        fx->kopts.session_timeout_ms = 6000;
        fx->kopts.flush_timeout_ms = 2000;
        return mc;
}

START_TEST(offsets_wait_for_an_earlier_dlq_delivery)
{
        const char *dsn = cq_check_env("CODERQ_PG_DSN");
        rd_kafka_mock_cluster_t *mc;
        rd_kafka_resp_err_t errs[30];
        rd_kafka_t *mrk, *rk;
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        char like[200];
        int i;

        /* A mock cluster, so that the DLQ's Produce requests can fail. */
        mc = mock_fixture(&fx, "it-order", &mrk);
        rk = kt_producer(fx.brokers);
        kt_produce(rk, fx.topic, 0, NULL, 0, "junk", 4, NULL);
        produce_good(rk, &fx, "job", 0, true);
        produce_good(rk, &fx, "job", 1, true);
        kt_flush(rk);
        kt_producer_destroy(rk);
        for (i = 0; i < 30; i++)
                errs[i] = RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
        rd_kafka_mock_push_request_errors_array(mc, 0, 30, errs);
        runner_start(&r, &fx);
        /* The two jobs behind the junk reach PostgreSQL, but while the
         * junk is not in the DLQ no offset may be stored or committed. */
        WAIT_STATS(&r, st, 60000, st.upserted == 2 && st.dlq_retries >= 1);
        /* The subject, not a synchronisation: two auto-commit intervals
         * pass and no offset may be stored or committed. */
        kt_sleep_ms(2000);
        cq_intake_stats(r.intake, &st);
        ck_assert_uint_eq(st.stored, 0);
        ck_assert_uint_eq(st.dlq, 0);
        ck_assert_int_eq(kt_committed_sum(fx.brokers, fx.group, fx.topic, 1),
                         0);
        rd_kafka_mock_clear_request_errors(mc, 0);
        WAIT_STATS(&r, st, 60000, st.dlq == 1 && st.stored == 3);
        runner_stop(&r, &st);
        ck_assert_int_eq(kt_committed_sum(fx.brokers, fx.group, fx.topic, 1),
                         3);
        snprintf(like, sizeof(like), "%s-job-%%", fx.prefix);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id "
                                    "LIKE $1",
                                    like),
                         2);
        fixture_release(&fx);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(mrk);
}
END_TEST

/* The shutdown commit on a mock cluster whose OffsetCommit fails: a
 * rebalance under way is retried and the offsets land; a refusal that no
 * retry fixes fails the run with the reason. */
START_TEST(shutdown_commit_retries_and_reports)
{
        rd_kafka_mock_cluster_t *mc;
        rd_kafka_t *mrk, *rk;
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        int round;

        mc = mock_fixture(&fx, "it-commit", &mrk);
        /* only the shutdown commit commits */
        fx.kopts.commit_interval_ms = 600000;

        for (round = 0; round < 2; round++) {
                rk = kt_producer(fx.brokers);
                produce_good(rk, &fx, round ? "late" : "job", 0, true);
                produce_good(rk, &fx, round ? "late" : "job", 1, true);
                kt_flush(rk);
                kt_producer_destroy(rk);
                runner_start(&r, &fx);
                WAIT_STATS(&r, st, 60000, st.stored == 2);
                if (round == 0) {
                        rd_kafka_mock_push_request_errors(
                            mc, APIKEY_OFFSET_COMMIT, 3,
                            RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                            RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                            RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
                        runner_stop(&r, &st);
                        ck_assert_int_eq(
                            kt_committed_sum(fx.brokers, fx.group, fx.topic, 1),
                            2);
                } else {
                        rd_kafka_resp_err_t errs[100];
                        size_t i;

                        for (i = 0; i < CQ_ARRAY_SIZE(errs); i++)
                                errs[i] =
                                    RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
                        rd_kafka_mock_push_request_errors_array(
                            mc, APIKEY_OFFSET_COMMIT, CQ_ARRAY_SIZE(errs),
                            errs);
                        atomic_store(&r.stop, 1);
                        pthread_join(r.thread, NULL);
                        ck_assert_int_eq(r.rc, -1);
                        ck_assert_msg(strstr(cq_intake_errmsg(r.intake),
                                             "could not commit offsets") !=
                                          NULL,
                                      "error: %s", cq_intake_errmsg(r.intake));
                        cq_intake_destroy(&r.intake);
                        rd_kafka_mock_clear_request_errors(
                            mc, APIKEY_OFFSET_COMMIT);
                        /* nothing moved past what the first run committed */
                        ck_assert_int_eq(
                            kt_committed_sum(fx.brokers, fx.group, fx.topic, 1),
                            2);
                }
        }
        fixture_release(&fx);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(mrk);
}
END_TEST

START_TEST(store_refusal_goes_to_dlq)
{
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        rd_kafka_t *rk;
        kt_msg_t *msgs = NULL;
        char cname[160], sql[512], prompt[160], value[512], id[160];
        size_t n;
        int vn;

        fixture_init(&fx, "it-refuse");
        /* PostgreSQL itself refuses one job (a constraint the parser does
         * not know): after a few tries it goes to the DLQ with the reason,
         * and the jobs around it are not held up. */
        snprintf(cname, sizeof(cname), "t_%ld", (long)getpid());
        snprintf(prompt, sizeof(prompt), "poison %s", fx.prefix);
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE jobs ADD CONSTRAINT %s CHECK (prompt <> '%s') "
                 "NOT VALID",
                 cname, prompt);
        kt_pg_exec(fx.dsn, sql, NULL);
        rk = kt_producer(fx.brokers);
        produce_good(rk, &fx, "job", 0, true);
        snprintf(id, sizeof(id), "%s-poison", fx.prefix);
        vn = snprintf(value, sizeof(value),
                      "{\"job_id\":\"%s\",\"prompt\":\"%s\"}", id, prompt);
        kt_produce(rk, fx.topic, 0, id, strlen(id), value, (size_t)vn, NULL);
        produce_good(rk, &fx, "job", 1, true);
        kt_flush(rk);
        runner_start(&r, &fx);
        WAIT_STATS(&r, st, 60000, st.upserted == 2 && st.dlq == 1);
        runner_stop(&r, &st);
        snprintf(sql, sizeof(sql), "ALTER TABLE jobs DROP CONSTRAINT %s",
                 cname);
        kt_pg_exec(fx.dsn, sql, NULL);
        ck_assert_uint_ge(st.pg_retries, 3);
        ck_assert_uint_eq(st.stored, 3);
        n = kt_consume(fx.brokers, fx.dlq, 1, 1, 60000, &msgs);
        ck_assert_uint_eq(n, 1);
        ck_assert_str_eq(msgs[0].key, id);
        ck_assert_uint_eq(msgs[0].len, (size_t)vn);
        ck_assert(memcmp(msgs[0].value, value, (size_t)vn) == 0);
        ck_assert_msg(strstr(kt_header(&msgs[0], "error"), cname) != NULL,
                      "error header: %s", kt_header(&msgs[0], "error"));
        kt_msgs_free(msgs, n);
        kt_producer_destroy(rk);
        fixture_release(&fx);
}
END_TEST

/* A problem with samples is stored as its samples, in one statement:
 * deterministic ids PROBLEM~sN, each linked to the problem, each with its
 * own seed; a redelivery creates nothing again, other content under the
 * problem's id and a misspelt field go to the DLQ with their reasons. */
START_TEST(samples_fan_out_once)
{
        fixture_t fx;
        runner_t r;
        cq_intake_stats_t st;
        rd_kafka_t *rk;
        kt_msg_t *msgs = NULL;
        char id[160], value[512], other[512], typo[256], *text;
        size_t n, i;
        int vn, on, tn;

        fixture_init(&fx, "it-samples");
        rk = kt_producer(fx.brokers);
        snprintf(id, sizeof(id), "%s-P", fx.prefix);
        vn = snprintf(value, sizeof(value),
                      "{\"job_id\":\"%s\",\"prompt\":\"p\",\"samples\":5,"
                      "\"seed\":7,\"queue\":\"qa\",\"metadata\":{\"k\":1}}",
                      id);
        on = snprintf(other, sizeof(other),
                      "{\"job_id\":\"%s\",\"prompt\":\"q\",\"samples\":5}", id);
        tn = snprintf(typo, sizeof(typo),
                      "{\"job_id\":\"%s-T\",\"prompt\":\"hi\","
                      "\"modle\":\"gpt-4o\"}",
                      fx.prefix);
        kt_produce(rk, fx.topic, 0, id, strlen(id), value, (size_t)vn, NULL);
        kt_produce(rk, fx.topic, 0, id, strlen(id), value, (size_t)vn, NULL);
        kt_produce(rk, fx.topic, 0, id, strlen(id), other, (size_t)on, NULL);
        kt_produce(rk, fx.topic, 1, NULL, 0, typo, (size_t)tn, NULL);
        kt_flush(rk);
        runner_start(&r, &fx);
        WAIT_STATS(&r, st, 60000,
                   st.upserted == 5 && st.duplicates == 1 && st.dlq == 2);
        runner_stop(&r, &st);
        ck_assert_uint_eq(st.stored, 4);
        text = kt_pg_text(fx.dsn,
                          "SELECT string_agg(job_id || ' ' || problem_id || ' '"
                          " || sample_index || ' ' || (spec->>'seed') || ' ' ||"
                          " queue || ' ' || (spec ? 'samples'),"
                          " ',' ORDER BY sample_index)"
                          " FROM jobs WHERE problem_id = $1",
                          id);
        {
                char want[1024];
                size_t at = 0;

                for (i = 0; i < 5; i++)
                        at +=
                            (size_t)snprintf(want + at, sizeof(want) - at,
                                             "%s%s~s%zu %s %zu %zu qa false",
                                             i ? "," : "", id, i, id, i, 7 + i);
                ck_assert_str_eq(text, want);
        }
        free(text);
        ck_assert_int_eq(
            kt_pg_long(fx.dsn, "SELECT count(*) FROM jobs WHERE job_id = $1",
                       id),
            0);
        n = kt_consume(fx.brokers, fx.dlq, 1, 2, 60000, &msgs);
        ck_assert_uint_eq(n, 2);
        for (i = 0; i < n; i++) {
                const char *err = kt_header(&msgs[i], "error");

                if (msgs[i].len == (size_t)on)
                        ck_assert_msg(strstr(err, "samples are already "
                                                  "stored with other content"),
                                      "%s", err);
                else
                        ck_assert_str_eq(err, "unknown field \"modle\"; did "
                                              "you mean \"model\"?");
        }
        kt_msgs_free(msgs, n);
        /* Whoever waits for the refused job is answered; the problem's id
         * belongs to its stored samples, so its refused copy is not. */
        ck_assert_uint_eq(st.answered, 1);
        n = kt_consume(fx.brokers, fx.results, 1, 1, 60000, &msgs);
        ck_assert_uint_eq(n, 1);
        {
                char key[200];
                json_t *ev = json_loadb(msgs[0].value, msgs[0].len, 0, NULL);

                snprintf(key, sizeof(key), "%s-T", fx.prefix);
                ck_assert_str_eq(msgs[0].key, key);
                ck_assert_ptr_nonnull(ev);
                ck_assert_str_eq(
                    json_string_value(json_object_get(ev, "job_id")), key);
                ck_assert_str_eq(
                    json_string_value(json_object_get(ev, "status")),
                    "rejected");
                ck_assert_str_eq(
                    json_string_value(json_object_get(ev, "reason")),
                    "unknown field \"modle\"; did you mean \"model\"?");
                ck_assert_int_eq(
                    json_integer_value(json_object_get(
                        json_object_get(ev, "source"), "partition")),
                    1);
                ck_assert_uint_eq(strlen(kt_header(&msgs[0], "event_id")), 36);
                json_decref(ev);
        }
        kt_msgs_free(msgs, n);
        kt_producer_destroy(rk);
        fixture_release(&fx);
}
END_TEST

static Suite *intake_suite(void)
{
        Suite *s = suite_create("it_intake");
        TCase *tc = tcase_create("intake");

        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, hostile_input_and_offsets);
        tcase_add_test(tc, postgres_outage_loses_nothing);
        tcase_add_test(tc, backlog_pauses_and_resumes);
        tcase_add_test(tc, two_intakes_share_and_hand_over);
        tcase_add_test(tc, offsets_wait_for_an_earlier_dlq_delivery);
        tcase_add_test(tc, store_refusal_goes_to_dlq);
        tcase_add_test(tc, samples_fan_out_once);
        tcase_add_test(tc, shutdown_commit_retries_and_reports);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(intake_suite)
