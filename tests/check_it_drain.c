/* SPDX-License-Identifier: MIT */
/* check_it_drain.c - a drained scale-in: one `coderq worker` with 64 busy
 * slots is given SIGTERM, as a scheduler scaling in does. Within
 * CODERQ_DRAIN_S it must stop claiming, let the LLM calls and cells that
 * end in time end, interrupt the rest, give every unfinished job back from
 * its last checkpoint, send its completion events and exit 0. A second
 * worker, started as the first drains, takes the jobs up: none may ask the
 * LLM a turn again, run a cell twice or count a failed attempt, and every
 * job ends with one completion event. Real Kafka and PostgreSQL (a
 * database of its own), real kernels, the fake LLM. */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "support/fake_llm.h"
#include "support/itworker.h"
#include "support/kafka_test.h"

#define SLOTS   64
#define NFIN    16 /* in their last LLM call at the signal: they finish */
#define NENDS   24 /* in a cell that ends in time: released after it */
#define NPAST   24 /* in a cell that outlasts the drain: interrupted */
#define NJOBS   (NFIN + NENDS + NPAST)
#define STEPS   2 /* each job: one cell, then the answer */
#define DRAIN_S 20
#define WAIT_MS 120000

static cq_itw_fleet_t fleet;
static const char *brokers;
static char prefix[128];

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        cq_itw_fleet_setup(&fleet, "drain", "cqd");
}

static void teardown(void)
{
        cq_itw_fleet_teardown(&fleet);
        curl_global_cleanup();
}

/* After each test, pass or fail: no worker left. */
static void kill_workers(void) { cq_itw_fleet_kill(&fleet); }

/* The jobs' cells wait for a gate, a file the test makes: each kind of
 * job is where the test wants it when the signal comes. */
static void gate_path(const char *name, char *out, size_t size)
{
        snprintf(out, size, "%s/gate-%s", fleet.logdir, name);
}

static void gate_open(const char *name)
{
        char path[256];

        gate_path(name, path, sizeof(path));
        cq_check_spit(path, "", 0);
}

/* Script \p name: a cell that waits for gate \p gate and prints its
 * name, then the answer, after \p delay_ms. */
static void add_script(const char *name, const char *gate, int delay_ms)
{
        char path[256], code[512];
        json_t *script;

        gate_path(gate, path, sizeof(path));
        snprintf(code, sizeof(code),
                 "import os, time\n"
                 "while not os.path.exists('%s'):\n"
                 "    time.sleep(0.05)\n"
                 "print('passed %s')",
                 path, gate);
        script = json_pack("[{s:[{s:s}]}, {s:i, s:s}]", "tool_calls", "code",
                           code, "delay_ms", delay_ms, "content", "done");
        ck_assert_ptr_nonnull(script);
        ck_assert_int_eq(cq_fake_llm_add_script(fleet.fake, name, script), 0);
        json_decref(script);
}

/* Which script job \p j runs. */
static const char *script_of(int j)
{
        return j < NFIN ? "fin" : j < NFIN + NENDS ? "ends" : "past";
}

static void submit_all(void)
{
        rd_kafka_t *rk = kt_producer(brokers);
        char topic[256], id[192], value[1024];
        int j;

        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        for (j = 0; j < NJOBS; j++) {
                snprintf(id, sizeof(id), "%s-%03d", prefix, j);
                snprintf(value, sizeof(value),
                         "{\"job_id\":\"%s\",\"run_id\":\"%s\",\"model\":"
                         "\"script:%s\",\"prompt\":\"Job %s: compute.\"}",
                         id, prefix, script_of(j), id);
                kt_produce(rk, topic, RD_KAFKA_PARTITION_UA, id, strlen(id),
                           value, strlen(value), NULL);
        }
        kt_flush(rk);
        kt_producer_destroy(rk);
}

/* A count from the fleet's database reaching \p want. */
typedef struct sql_wait {
        const char *sql;
        long want;
} sql_wait_t;

static bool sql_reached(void *arg)
{
        const sql_wait_t *w = arg;

        return kt_pg_long(fleet.dsn, w->sql, NULL) >= w->want;
}

static void wait_sql(const char *sql, long want, const char *what)
{
        sql_wait_t w = {sql, want};

        ck_assert_msg(cq_check_wait_until(sql_reached, &w, WAIT_MS),
                      "%s within %d ms (%ld of %ld)", what, WAIT_MS,
                      kt_pg_long(fleet.dsn, sql, NULL), want);
}

/* Whether the fake has been asked step 1 of every "fin" job. */
static bool fin_calls_in_flight(void *arg)
{
        int counts[NJOBS * STEPS], j;

        (void)arg;
        if (cq_fake_llm_count_steps(fleet.fake, prefix, NJOBS, STEPS, counts) !=
            0)
                return false;
        for (j = 0; j < NFIN; j++)
                if (counts[j * STEPS + 1] == 0)
                        return false;
        return true;
}

/* The integer field \p key of the worker's last log line with message
 * \p msg; -1 when there is none. */
static long long log_field(const cq_itw_t *w, const char *msg, const char *key)
{
        char line[4096];
        long long v = -1;
        FILE *fp = fopen(w->log, "r");

        ck_assert_ptr_nonnull(fp);
        while (fgets(line, sizeof(line), fp)) {
                json_t *doc = json_loads(line, 0, NULL);
                const char *m = json_string_value(json_object_get(doc, "msg"));

                if (m && strcmp(m, msg) == 0 &&
                    json_is_integer(json_object_get(doc, key)))
                        v = json_integer_value(json_object_get(doc, key));
                json_decref(doc);
        }
        fclose(fp);
        return v;
}

/* Whether the worker \p arg logged the start of its drain. */
static bool draining(void *arg)
{
        const cq_itw_t *w = arg;
        char line[4096];
        bool found = false;
        FILE *fp = fopen(w->log, "r");

        while (fp && !found && fgets(line, sizeof(line), fp))
                found = strstr(line, "\"msg\":\"shutting down: stopping "
                                     "intake and claims\"") != NULL;
        if (fp)
                fclose(fp);
        return found;
}

/* How many of the worker's log lines have message \p msg. */
static long log_count(const cq_itw_t *w, const char *msg)
{
        char line[4096];
        long n = 0;
        FILE *fp = fopen(w->log, "r");

        ck_assert_ptr_nonnull(fp);
        while (fgets(line, sizeof(line), fp)) {
                json_t *doc = json_loads(line, 0, NULL);
                const char *m = json_string_value(json_object_get(doc, "msg"));

                n += m && strcmp(m, msg) == 0;
                json_decref(doc);
        }
        fclose(fp);
        return n;
}

START_TEST(sigterm_drains_64_busy_slots_in_time)
{
        static const char *const names[] = {"jobs", "results", "dlq", "events"};
        cq_itw_env_t env;
        cq_itw_t *w1 = &fleet.workers[0], *w2 = &fleet.workers[1];
        char topic[256], drain_s[16], results[256];
        int counts[NJOBS * STEPS], j, s, status;
        int64_t t_term, exit_ms;
        long copies;
        size_t i;

        kt_unique("dr", prefix, sizeof(prefix));
        for (i = 0; i < CQ_ARRAY_SIZE(names); i++) {
                snprintf(topic, sizeof(topic), "%s.%s", prefix, names[i]);
                kt_create_topic(brokers, topic, i == 0 ? 3 : 1);
        }
        snprintf(results, sizeof(results), "%s.results", prefix);
        add_script("fin", "fin", 4000);
        add_script("ends", "ends", 0);
        add_script("past", "past", 0);
        snprintf(drain_s, sizeof(drain_s), "%d", DRAIN_S);
        cq_itw_env_init(&env, fleet.dsn, brokers, prefix,
                        cq_fake_llm_base_url(fleet.fake));
        cq_itw_env_set(&env, "CODERQ_SLOTS", "64");
        cq_itw_env_set(&env, "CODERQ_KPOOL_SIZE", "64");
        cq_itw_env_set(&env, "CODERQ_DRAIN_S", drain_s);
        cq_itw_fleet_start(&fleet, 0, &env, "dr1");
        submit_all();

        /* Every job in its cell (a reply held past 250 ms is stored
         * alone), then the "fin" jobs in their last LLM call. */
        wait_sql("SELECT count(DISTINCT job_id) FROM job_messages WHERE "
                 "role = 'assistant'",
                 NJOBS, "every job in its first cell");
        gate_open("fin");
        ck_assert_msg(cq_check_wait_until(fin_calls_in_flight, NULL, WAIT_MS),
                      "the fin jobs never asked for their answer");
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM jobs WHERE status "
                                    "= 'running'",
                                    NULL),
                         NJOBS);

        /* Scale in: the "ends" cells end during the drain, the "past" ones
         * only once the worker is gone. Another worker takes the jobs. */
        t_term = cq_now_ms();
        ck_assert_int_eq(kill(w1->pid, SIGTERM), 0);
        ck_assert_msg(cq_check_wait_until(draining, w1, WAIT_MS),
                      "the worker never began to drain");
        gate_open("ends");
        cq_itw_env_set(&env, "CODERQ_SLOTS", "16");
        cq_itw_env_set(&env, "CODERQ_KPOOL_SIZE", "16");
        cq_itw_start(w2, &env, fleet.logdir, "dr2");
        status = cq_itw_stop(w1, 0, 2 * DRAIN_S * 1000);
        exit_ms = cq_now_ms() - t_term;
        gate_open("past");
        printf("drain: worker exited %d after %lld ms (limit %d s); jobs "
               "running %lld, finished %lld, released %lld, interrupted "
               "%lld; the drain logged %lld ms\n",
               status, (long long)exit_ms, DRAIN_S,
               log_field(w1, "worker drained", "running"),
               log_field(w1, "worker drained", "finished"),
               log_field(w1, "worker drained", "released"),
               log_field(w1, "worker drained", "interrupted"),
               log_field(w1, "worker drained", "drain_ms"));
        fflush(stdout);
        ck_assert_int_eq(status, 0);
        ck_assert_msg(exit_ms < DRAIN_S * 1000, "exited after %lld ms",
                      (long long)exit_ms);
        ck_assert_int_eq(log_field(w1, "worker drained", "running"), NJOBS);
        ck_assert_int_eq(log_field(w1, "worker drained", "finished"), NFIN);
        ck_assert_int_eq(log_field(w1, "worker drained", "released"),
                         NENDS + NPAST);
        ck_assert_int_eq(log_field(w1, "worker drained", "interrupted"), NPAST);
        /* what it finished, it announced before it exited */
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM outbox o JOIN jobs "
                                    "j USING (job_id) WHERE j.lease_owner = "
                                    "'dr1' AND o.sent_at IS NULL",
                                    NULL),
                         0);

        cq_itw_wait_started(w2, WAIT_MS);
        wait_sql("SELECT count(*) FROM jobs WHERE status = 'succeeded'", NJOBS,
                 "every job succeeded");
        /* the second worker ran the jobs the first gave back, and a
         * give-back at a drain counts no attempt */
        ck_assert_int_eq(log_count(w2, "job claimed"), NENDS + NPAST);
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM jobs WHERE attempts "
                                    "= 1",
                                    NULL),
                         NJOBS);
        /* one cell per job, run to its end; no failed attempt counted */
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM cells WHERE status "
                                    "= 'ok'",
                                    NULL),
                         NJOBS);
        ck_assert_int_eq(
            kt_pg_long(fleet.dsn, "SELECT count(*) FROM cells", NULL), NJOBS);
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM jobs WHERE retries "
                                    "<> 0",
                                    NULL),
                         0);
        /* no LLM turn asked for twice: no call was in flight when the
         * cells were interrupted, and a reply that called a cell is kept */
        ck_assert_int_eq(
            cq_fake_llm_count_steps(fleet.fake, prefix, NJOBS, STEPS, counts),
            0);
        for (j = 0; j < NJOBS; j++)
                for (s = 0; s < STEPS; s++)
                        ck_assert_msg(counts[j * STEPS + s] == 1,
                                      "job %d (%s) asked step %d %d times", j,
                                      script_of(j), s, counts[j * STEPS + s]);
        /* one completion event per job, none sent twice */
        copies = kt_events_once(brokers, results, 1, fleet.dsn, NJOBS, 60000);
        ck_assert_int_eq(copies, 0);
        ck_assert_int_eq(cq_itw_stop(w2, SIGTERM, 2 * DRAIN_S * 1000), 0);
        cq_itw_env_release(&env);
}
END_TEST

static Suite *drain_suite(void)
{
        Suite *s = suite_create("drain");
        TCase *tc = tcase_create("scale_in");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_workers);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, sigterm_drains_64_busy_slots_in_time);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(drain_suite)
