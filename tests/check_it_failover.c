/* SPDX-License-Identifier: MIT */
/* check_it_failover.c - coderq through a PostgreSQL failover: a primary
 * and its synchronous standby (scripts/services.sh start --pg-standby),
 * reached through one DSN that lists both hosts with
 * target_session_attrs=read-write, two `coderq worker` processes, the
 * single Kafka broker and the fake LLM. In the middle of a run the
 * primary is stopped with -m immediate and the standby promoted
 * (services.sh pg-failover). What was committed before must be on the new
 * primary; no job may run in two places at once or repeat more than one
 * LLM turn; every job ends with one completion event. The suite starts
 * and stops the pair; the main server and the broker stay as they are. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "coderq/storage/listen.h"
#include "support/fake_llm.h"
#include "support/itworker.h"
#include "support/kafka_test.h"
#include "support/loopback.h"
#include "support/pgtest.h"
#include "../storage/store_int.h"

#define NJOBS   24
#define STEPS   4    /* LLM turns of a job */
#define TURN_MS 1000 /* the fake's delay before each reply */

static cq_itw_fleet_t fleet;
static char *pair; /* the pair's DSN */
static const char *brokers;
static char prefix[128];

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        kt_services("start --pg-standby");
        pair = kt_services_env("--pg-standby", "CODERQ_PG_DSN");
        /* the server of cq_pgtest_*(): the pair, not the main one */
        setenv("CODERQ_PG_DSN", pair, 1);
        cq_itw_fleet_setup(&fleet, "failover", "cqf");
}

static void teardown(void)
{
        cq_itw_fleet_teardown(&fleet);
        kt_services("stop --pg-standby");
        free(pair);
        pair = NULL;
        curl_global_cleanup();
}

/* After each test, pass or fail: no worker left. */
static void kill_workers(void) { cq_itw_fleet_kill(&fleet); }

static long finished(void) { return cq_itw_fleet_finished(&fleet); }

/* A third of the jobs finished and more than that running: mid-run. */
static bool mid_run(void *arg)
{
        (void)arg;
        return finished() >= NJOBS / 3 &&
               kt_pg_long(fleet.dsn,
                          "SELECT count(DISTINCT m.job_id) FROM job_messages "
                          "m JOIN jobs j USING (job_id) WHERE j.status = "
                          "'running' AND m.role = 'assistant'",
                          NULL) >= 4;
}

static bool all_finished(void *arg)
{
        (void)arg;
        return finished() >= NJOBS;
}

/* Both workers listen again: their LISTEN connections are on the server
 * the DSN now reaches. */
static bool listening_again(void *arg)
{
        (void)arg;
        return kt_pg_long(fleet.dsn,
                          "SELECT count(*) FROM pg_stat_activity WHERE "
                          "datname = current_database() AND application_name "
                          "= 'coderq-listen' AND query LIKE 'LISTEN %'",
                          NULL) >= 2;
}

/* What the server committed, as one text[] per kind of row: a key and
 * a digest of what must not change once written (notebooks are
 * rewritten at every cell, so they are not among them). */
static const struct committed {
        const char *what;
        const char *expr; /* over the table, one text per row */
        const char *table;
} kinds[] = {
    {"conversation messages",
     "job_id || '/' || seq || '/' || md5(message::text)", "job_messages"},
    {"cells",
     "job_id || '/' || seq || '/' || md5(code || status || outputs::text)",
     "cells"},
    {"results", "job_id || '/' || status || '/' || md5(coalesce(answer, ''))",
     "results"},
    {"outbox rows", "event_id::text || '/' || job_id", "outbox"},
};

static char *snapshot(const struct committed *k)
{
        char sql[512], *arr;

        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(array_agg(%s), '{}') FROM %s", k->expr,
                 k->table);
        arr = kt_pg_text(fleet.dsn, sql, NULL);
        ck_assert_ptr_nonnull(arr);
        return arr;
}

static long missing(const struct committed *k, const char *arr)
{
        char sql[512];

        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM unnest($1::text[]) AS c (key) WHERE "
                 "key NOT IN (SELECT %s FROM %s)",
                 k->expr, k->table);
        return kt_pg_long(fleet.dsn, sql, arr);
}

/* From the fake's log: for each job, how often each step was answered,
 * and whether two of its requests were in flight at once (a request
 * within TURN_MS of the one before it: a runner waits for each reply). */
static void llm_turns(int counts[NJOBS][STEPS + 1], bool overlapped[NJOBS])
{
        json_t *reqs = cq_fake_llm_requests(fleet.fake), *req;
        double last[NJOBS];
        char tag[160];
        size_t i;

        ck_assert_ptr_nonnull(reqs);
        memset(counts, 0, sizeof(int[STEPS + 1]) * NJOBS);
        for (i = 0; i < NJOBS; i++) {
                overlapped[i] = false;
                last[i] = -1;
        }
        snprintf(tag, sizeof(tag), "Job %s-", prefix);
        json_array_foreach(reqs, i, req)
        {
                char *body = json_dumps(json_object_get(req, "body"), 0);
                const char *at = body ? strstr(body, tag) : NULL;
                json_int_t step =
                    json_integer_value(json_object_get(req, "step"));
                double ts = json_number_value(json_object_get(req, "ts"));
                int job;

                if (at && sscanf(at + strlen(tag), "%3d", &job) == 1 &&
                    job >= 0 && job < NJOBS && step >= 0 && step <= STEPS &&
                    json_integer_value(json_object_get(req, "status")) == 200) {
                        counts[job][step]++;
                        if (last[job] >= 0 &&
                            ts - last[job] < TURN_MS / 1000.0 * 0.9)
                                overlapped[job] = true;
                        last[job] = ts;
                }
                free(body);
        }
        json_decref(reqs);
}

static const char turns[] =
    "[{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"a = 20\"}]},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"b = a + 1\"}]},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"print(a + b)\"}]},"
    "{\"delay_ms\":1000,\"content\":\"41\"}]";

START_TEST(primary_dies_mid_run_and_nothing_committed_is_lost)
{
        static const char *const names[] = {"jobs", "results", "dlq", "events"};
        cq_itw_env_t env;
        json_t *script = json_loads(turns, 0, NULL);
        char topic[256], *before[CQ_ARRAY_SIZE(kinds)];
        int counts[NJOBS][STEPS + 1];
        bool overlapped[NJOBS];
        rd_kafka_t *rk;
        int64_t killed, promoted, wrote;
        long n0, copies;
        size_t i;
        int j, s;

        kt_unique("fo", prefix, sizeof(prefix));
        for (i = 0; i < CQ_ARRAY_SIZE(names); i++) {
                snprintf(topic, sizeof(topic), "%s.%s", prefix, names[i]);
                kt_create_topic(brokers, topic,
                                strcmp(names[i], "jobs") ? 1 : 3);
        }
        ck_assert_ptr_nonnull(script);
        ck_assert_int_eq(cq_fake_llm_add_script(fleet.fake, "turns", script),
                         0);
        json_decref(script);
        ck_assert_int_eq(cq_fake_llm_reset(fleet.fake), 0);
        cq_itw_env_init(&env, fleet.dsn, brokers, prefix,
                        cq_fake_llm_base_url(fleet.fake));
        cq_itw_env_set(&env, "CODERQ_SLOTS", "4");
        cq_itw_env_set(&env, "CODERQ_KPOOL_SIZE", "4");
        cq_itw_fleet_start(&fleet, 0, &env, "kf1");
        cq_itw_fleet_start(&fleet, 1, &env, "kf2");
        rk = kt_producer(brokers);
        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        for (j = 0; j < NJOBS; j++) {
                char id[192], value[1024];

                snprintf(id, sizeof(id), "%s-%03d", prefix, j);
                snprintf(value, sizeof(value),
                         "{\"job_id\":\"%s\",\"run_id\":\"%s\",\"model\":"
                         "\"script:turns\",\"prompt\":\"Job %s: compute.\"}",
                         id, prefix, id);
                kt_produce(rk, topic, RD_KAFKA_PARTITION_UA, id, strlen(id),
                           value, strlen(value), NULL);
        }
        kt_flush(rk);
        kt_producer_destroy(rk);
        ck_assert_msg(cq_check_wait_until(mid_run, NULL, 120000),
                      "the run never reached its middle (%ld finished)",
                      finished());

        /* What the primary has committed now (with a synchronous standby,
         * a commit is visible only once the standby has flushed it). */
        for (i = 0; i < CQ_ARRAY_SIZE(kinds); i++)
                before[i] = snapshot(&kinds[i]);
        killed = cq_now_ms();
        kt_services("pg-failover");
        promoted = cq_now_ms();
        n0 = kt_pg_long(fleet.dsn, "SELECT count(*) FROM job_messages", NULL);
        while (kt_pg_long(fleet.dsn, "SELECT count(*) FROM job_messages",
                          NULL) == n0 &&
               cq_now_ms() - killed < 60000)
                kt_sleep_ms(50);
        wrote = cq_now_ms();
        ck_assert_msg(wrote - killed < 60000, "no worker wrote in 60 s");
        printf("failover: promoted in %lld ms; coderq wrote again %lld ms "
               "after the primary died\n",
               (long long)(promoted - killed), (long long)(wrote - killed));
        fflush(stdout);
        for (i = 0; i < CQ_ARRAY_SIZE(kinds); i++) {
                ck_assert_msg(missing(&kinds[i], before[i]) == 0,
                              "%ld committed %s are not on the new primary",
                              missing(&kinds[i], before[i]), kinds[i].what);
                printf("failover: %ld %s committed before, all on the new "
                       "primary\n",
                       kt_pg_long(fleet.dsn, "SELECT cardinality($1::text[])",
                                  before[i]),
                       kinds[i].what);
                free(before[i]);
        }
        ck_assert_msg(cq_check_wait_until(listening_again, NULL, 30000),
                      "the workers do not listen on the new primary");

        ck_assert_msg(cq_check_wait_until(all_finished, NULL, 180000),
                      "only %ld of %d jobs finished", finished(), NJOBS);
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM jobs WHERE status "
                                    "= 'succeeded'",
                                    NULL),
                         NJOBS);
        ck_assert_int_eq(
            kt_pg_long(fleet.dsn, "SELECT count(*) FROM results", NULL), NJOBS);
        printf("failover: %ld of %d jobs ran more than once\n",
               kt_pg_long(fleet.dsn,
                          "SELECT count(*) FROM jobs WHERE attempts > 1", NULL),
               NJOBS);
        /* No job ran in two places at once: only its lease holder writes
         * its rows, so no row of an attempt follows one of a later
         * attempt, and no two of its LLM requests overlap. */
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM job_messages a JOIN "
                                    "job_messages b USING (job_id) WHERE "
                                    "a.seq < b.seq AND a.attempt > b.attempt",
                                    NULL),
                         0);
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM cells a JOIN cells b "
                                    "USING (job_id) WHERE a.seq < b.seq AND "
                                    "a.attempt > b.attempt",
                                    NULL),
                         0);
        llm_turns(counts, overlapped);
        for (j = 0; j < NJOBS; j++) {
                int repeated = 0;

                ck_assert_msg(!overlapped[j],
                              "job %d had two LLM requests at once", j);
                for (s = 0; s < STEPS; s++) {
                        ck_assert_msg(counts[j][s] >= 1,
                                      "job %d step %d never asked", j, s);
                        repeated += counts[j][s] - 1;
                }
                ck_assert_msg(repeated <= 1, "job %d repeated %d LLM turns", j,
                              repeated);
        }
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        copies = kt_events_once(brokers, topic, 1, fleet.dsn, NJOBS, 60000);
        printf("failover: %d completion events, %ld sent again\n", NJOBS,
               copies);
        cq_itw_fleet_alive(&fleet, "during the run");
        ck_assert_int_eq(cq_itw_stop(&fleet.workers[0], SIGTERM, 60000), 0);
        ck_assert_int_eq(cq_itw_stop(&fleet.workers[1], SIGTERM, 60000), 0);
        cq_itw_env_release(&env);
        /* the old primary comes back as the new one's standby */
        kt_services("pg-rebuild");
        ck_assert_int_eq(
            kt_pg_long(fleet.dsn, "SELECT count(*) FROM results", NULL), NJOBS);
}
END_TEST

/* The suite's DSN with a first host that never answers, on \p port. */
static void dsn_behind(int port, char *out, size_t size)
{
        PQconninfoOption *opts = PQconninfoParse(fleet.dsn, NULL), *o;
        const char *hosts = NULL, *ports = NULL;

        ck_assert_ptr_nonnull(opts);
        for (o = opts; o->keyword; o++) {
                if (strcmp(o->keyword, "host") == 0)
                        hosts = o->val;
                else if (strcmp(o->keyword, "port") == 0)
                        ports = o->val;
        }
        ck_assert_ptr_nonnull(hosts);
        ck_assert_ptr_nonnull(ports);
        snprintf(out, size,
                 "host=127.0.0.1,%s port=%d,%s dbname=%s user=coderq "
                 "target_session_attrs=read-write",
                 hosts, port, ports, fleet.dbname);
        PQconninfoFree(opts);
}

/* The value of the connection option \p key of \p store's connection. */
static const char *conn_value(const cq_store_t *store, const char *key)
{
        static char value[64];
        PQconninfoOption *opts = PQconninfo(store->conn), *o;

        ck_assert_ptr_nonnull(opts);
        value[0] = '\0';
        for (o = opts; o->keyword; o++)
                if (strcmp(o->keyword, key) == 0 && o->val)
                        snprintf(value, sizeof(value), "%s", o->val);
        PQconninfoFree(opts);
        return value;
}

/* A host that does not answer at all (its machine died, a partition) is
 * given up after connect_timeout, and libpq goes on to the next host of
 * the DSN: when the store connects, when it reconnects, and for the
 * listener. Without a timeout a connect waits out the kernel's SYN
 * retries (over two minutes) on such a host. A listening socket whose
 * backlog of one is full drops every further SYN, as such a host does. */
START_TEST(unanswering_host_is_passed_over)
{
        struct sockaddr_in sa;
        int port, hole = cq_loopback_listen("127.0.0.1", &port);
        int filler = socket(AF_INET, SOCK_STREAM, 0);
        char behind[3072], own[3200], errstr[1024], pid[32];
        cq_store_opts_t opts;
        cq_store_t *store;
        cq_listener_t *l;
        bool reconnected;
        int64_t t0, took;

        /* a backlog of one, which the filler's connection fills */
        ck_assert_int_eq(listen(hole, 0), 0);
        ck_assert_int_ge(filler, 0);
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sa.sin_port = htons((uint16_t)port);
        ck_assert_int_eq(connect(filler, (struct sockaddr *)&sa, sizeof(sa)),
                         0);
        dsn_behind(port, behind, sizeof(behind));

        cq_store_opts_init(&opts);
        opts.dsn = behind;
        t0 = cq_now_ms();
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        took = cq_now_ms() - t0;
        ck_assert_msg(store, "%s", errstr);
        printf("failover: connected past a silent host in %lld ms\n",
               (long long)took);
        ck_assert_msg(took >= 4000 && took < 20000, "connecting took %lld ms",
                      (long long)took);
        ck_assert_str_eq(conn_value(store, "connect_timeout"), "5");
        ck_assert_str_eq(conn_value(store, "keepalives_idle"), "30");

        snprintf(pid, sizeof(pid), "%d", cq_store_backend_pid(store));
        kt_pg_exec(fleet.dsn, "SELECT pg_terminate_backend($1::int)", pid);
        t0 = cq_now_ms();
        ck_assert_int_eq(
            store_exec(store, "ask", "SELECT 1", NULL, 0, true, NULL), CQ_OK);
        took = cq_now_ms() - t0;
        ck_assert_uint_eq(cq_store_reconnects(store), 1);
        ck_assert_msg(took < 20000, "reconnecting took %lld ms",
                      (long long)took);
        cq_store_destroy(&store);
        /* defaults, not rules: the DSN's own settings win */
        snprintf(own, sizeof(own), "%s connect_timeout=2 keepalives_idle=7",
                 behind);
        opts.dsn = own;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store, "%s", errstr);
        ck_assert_str_eq(conn_value(store, "connect_timeout"), "2");
        ck_assert_str_eq(conn_value(store, "keepalives_idle"), "7");
        cq_store_destroy(&store);

        l = cq_listener_new(&opts, "coderq_failover_test", errstr,
                            sizeof(errstr));
        ck_assert_msg(l, "%s", errstr);
        ck_assert_int_ge(cq_listener_wait(l, 0, &reconnected), 0);
        cq_listener_destroy(&l);
        close(filler);
        close(hole);
}
END_TEST

static Suite *failover_suite(void)
{
        Suite *s = suite_create("failover");
        TCase *tc = tcase_create("pg");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_workers);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, primary_dies_mid_run_and_nothing_committed_is_lost);
        suite_add_tcase(s, tc);
        /* CK_RUN_CASE=silent: a host that never answers */
        tc = tcase_create("silent");
        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, unanswering_host_is_passed_over);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(failover_suite)
