/* SPDX-License-Identifier: MIT */
/* check_it_cluster.c - coderq through a replicated Kafka: three KRaft
 * brokers (scripts/services.sh start --cluster), topics of three replicas
 * that take a write with two in sync, two `coderq worker` processes on the
 * fake LLM, and jobs sent by `coderq submit` while the broker leading a
 * partition of the jobs topic, then the one leading the results topic,
 * is killed with SIGKILL and started again. Nothing may be lost, run
 * twice or announced twice. The suite starts and stops the cluster; the
 * single broker and PostgreSQL stay as they are. */
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "support/fake_llm.h"
#include "support/itworker.h"
#include "support/kafka_test.h"
#include "support/pgtest.h"
#include "support/proc.h"

#define NJOBS    200
#define BATCH    10   /* jobs per coderq submit */
#define PACE_MS  4000 /* between submits, unless hurried */
#define PHASE_MS 8000 /* measured before and after each kill */
#define DEAD_MS  5000 /* a broker stays dead this long */
#define NPARTS   3

static cq_itw_fleet_t fleet;
static char *brokers; /* the cluster's */
static char prefix[128];

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        kt_services("start --cluster");
        brokers = kt_services_env("--cluster", "CODERQ_KAFKA_BROKERS");
        cq_itw_fleet_setup(&fleet, "cluster", "cqk");
}

static void teardown(void)
{
        cq_itw_fleet_teardown(&fleet);
        kt_services("stop --cluster");
        free(brokers);
        brokers = NULL;
        curl_global_cleanup();
}

/* After each test, pass or fail: no worker left. */
static void kill_workers(void) { cq_itw_fleet_kill(&fleet); }

/* coderq submit of NJOBS jobs, BATCH at a time every PACE_MS (at once
 * once hurried), from a thread of its own: jobs arrive while brokers
 * die, and after the last one is back. Failures are kept for the test's
 * thread to report. */
typedef struct submitter {
        pthread_t thread;
        const cq_itw_env_t *env;
        atomic_bool hurry;
        atomic_long delivered; /* job ids coderq submit printed */
        int failed_batch;      /* -1, or the batch that failed */
        int status;
        char why[1024];
} submitter_t;

static void *submit_main(void *arg)
{
        submitter_t *sub = arg;
        int64_t t0 = cq_now_ms();
        int b, i;

        for (b = 0; b < NJOBS / BATCH; b++) {
                const char *args[] = {"submit", NULL, NULL};
                char path[600];
                cq_check_proc_t proc;
                FILE *fp;
                int64_t next;

                snprintf(path, sizeof(path), "%s/batch-%02d.jsonl",
                         fleet.logdir, b);
                fp = fopen(path, "w");
                if (!fp) {
                        sub->failed_batch = b;
                        snprintf(sub->why, sizeof(sub->why),
                                 "could not write %s", path);
                        return NULL;
                }
                for (i = b * BATCH; i < (b + 1) * BATCH; i++)
                        fprintf(fp,
                                "{\"job_id\":\"%s-%03d\",\"run_id\":\"%s\","
                                "\"model\":\"script:paced\",\"prompt\":"
                                "\"Job %s-%03d: compute.\"}\n",
                                prefix, i, prefix, prefix, i);
                fclose(fp);
                args[1] = path;
                if (cq_check_coderq(args, sub->env->v, 120000, &proc) != 0) {
                        sub->failed_batch = b;
                        snprintf(sub->why, sizeof(sub->why),
                                 "could not run coderq submit");
                        return NULL;
                }
                atomic_fetch_add(&sub->delivered,
                                 (long)cq_check_count_lines(proc.out));
                if (proc.status != 0) {
                        sub->failed_batch = b;
                        sub->status = proc.status;
                        snprintf(sub->why, sizeof(sub->why), "%.1000s",
                                 proc.err);
                        cq_check_proc_release(&proc);
                        return NULL;
                }
                cq_check_proc_release(&proc);
                next = t0 + (int64_t)(b + 1) * PACE_MS;
                while (!atomic_load(&sub->hurry) && cq_now_ms() < next)
                        kt_sleep_ms(100);
        }
        return NULL;
}

static long finished(void) { return cq_itw_fleet_finished(&fleet); }

static bool all_finished(void *arg)
{
        (void)arg;
        return finished() >= NJOBS;
}

/* Jobs finished per second since the last mark, printed. */
typedef struct rate {
        int64_t at;
        long done;
} rate_t;

static void rate_mark(rate_t *r)
{
        r->at = cq_now_ms();
        r->done = finished();
}

static void rate_print(rate_t *r, const char *what)
{
        int64_t now = cq_now_ms();
        long done = finished();
        double s = (double)(now - r->at) / 1000.0;

        printf("cluster: %-40s %5.1f jobs/s (%ld jobs in %.1f s; %ld of "
               "%d finished)\n",
               what, s > 0 ? (double)(done - r->done) / s : 0.0, done - r->done,
               s, done, NJOBS);
        fflush(stdout);
        r->at = now;
        r->done = done;
}

/* Kill the node leading partition 0 of \p topic, keep it dead DEAD_MS,
 * start it again (services.sh waits until it is back in every ISR), then
 * set \p back (may be NULL); the rate during and after. */
static void kill_leader(const char *topic, rate_t *r, atomic_bool *back)
{
        char verb[512], what[160], *node;

        snprintf(verb, sizeof(verb), "leader %s 0", topic);
        node = kt_services_output(verb);
        snprintf(verb, sizeof(verb), "kill-broker %s", node);
        kt_services(verb);
        snprintf(what, sizeof(what), "node %s (leads %s) dead", node, topic);
        kt_sleep_ms(DEAD_MS);
        rate_print(r, what);
        cq_itw_fleet_alive(&fleet, "while a broker was dead");
        snprintf(verb, sizeof(verb), "start-broker %s", node);
        kt_services(verb);
        snprintf(what, sizeof(what), "node %s restarting until in sync", node);
        rate_print(r, what);
        if (back)
                atomic_store(back, true);
        kt_sleep_ms(PHASE_MS);
        snprintf(what, sizeof(what), "node %s back", node);
        rate_print(r, what);
        cq_itw_fleet_alive(&fleet, "after a broker came back");
        free(node);
}

static const char paced[] =
    "[{\"delay_ms\":300,\"tool_calls\":[{\"code\":\"print(6 * 7)\"}]},"
    "{\"delay_ms\":300,\"content\":\"42\"}]";

START_TEST(leaders_die_and_nothing_is_lost_or_doubled)
{
        static const char *const names[] = {"jobs", "results", "dlq", "events"};
        submitter_t sub;
        cq_itw_env_t env;
        json_t *script = json_loads(paced, 0, NULL);
        char topic[256], jobs[256], results[256], dlq[256];
        rate_t r;
        size_t i;
        long copies;
        int64_t t0 = cq_now_ms();

        kt_unique("cl", prefix, sizeof(prefix));
        for (i = 0; i < CQ_ARRAY_SIZE(names); i++) {
                snprintf(topic, sizeof(topic), "%s.%s", prefix, names[i]);
                kt_create_topic_rf(brokers, topic,
                                   strcmp(names[i], "dlq") ? NPARTS : 1, 3, 2);
        }
        snprintf(jobs, sizeof(jobs), "%s.jobs", prefix);
        snprintf(results, sizeof(results), "%s.results", prefix);
        snprintf(dlq, sizeof(dlq), "%s.dlq", prefix);
        ck_assert_ptr_nonnull(script);
        ck_assert_int_eq(cq_fake_llm_add_script(fleet.fake, "paced", script),
                         0);
        json_decref(script);
        cq_itw_env_init(&env, fleet.dsn, brokers, prefix,
                        cq_fake_llm_base_url(fleet.fake));
        cq_itw_env_set(&env, "CODERQ_SLOTS", "4");
        cq_itw_env_set(&env, "CODERQ_KPOOL_SIZE", "4");
        cq_itw_fleet_start(&fleet, 0, &env, "kc1");
        cq_itw_fleet_start(&fleet, 1, &env, "kc2");

        memset(&sub, 0, sizeof(sub));
        atomic_init(&sub.hurry, false);
        atomic_init(&sub.delivered, 0);
        sub.env = &env;
        sub.failed_batch = -1;
        ck_assert_int_eq(pthread_create(&sub.thread, NULL, submit_main, &sub),
                         0);
        rate_mark(&r);
        kt_sleep_ms(PHASE_MS);
        rate_print(&r, "before any kill");
        kill_leader(jobs, &r, NULL);
        kill_leader(results, &r, &sub.hurry);
        ck_assert_int_eq(pthread_join(sub.thread, NULL), 0);
        ck_assert_msg(sub.failed_batch < 0,
                      "coderq submit of batch %d exited %d: %s",
                      sub.failed_batch, sub.status, sub.why);
        ck_assert_int_eq(atomic_load(&sub.delivered), NJOBS);

        ck_assert_msg(cq_check_wait_until(all_finished, NULL, 120000),
                      "only %ld of %d jobs finished", finished(), NJOBS);
        rate_print(&r, "until the last job finished");
        printf("cluster: %d jobs in %.1f s\n", NJOBS,
               (double)(cq_now_ms() - t0) / 1000.0);
        /* every job ran once and finished once */
        ck_assert_int_eq(kt_pg_long(fleet.dsn,
                                    "SELECT count(*) FROM jobs WHERE status "
                                    "= 'succeeded' AND attempts = 1",
                                    NULL),
                         NJOBS);
        ck_assert_int_eq(
            kt_pg_long(fleet.dsn, "SELECT count(*) FROM results", NULL), NJOBS);
        /* one completion event per job; a copy of one would be the same
         * outbox row sent again (the at-least-once rule), counted */
        copies =
            kt_events_once(brokers, results, NPARTS, fleet.dsn, NJOBS, 60000);
        printf("cluster: %d completion events, %ld sent again\n", NJOBS,
               copies);
        /* the DLQ got nothing */
        ck_assert_int_eq(kt_high_sum(brokers, dlq, 1), 0);
        /* the intake's committed offsets reach the end of the jobs log */
        ck_assert_int_eq(kt_high_sum(brokers, jobs, NPARTS), NJOBS);
        for (i = 0;
             i < 60 && kt_committed_sum(brokers, prefix, jobs, NPARTS) < NJOBS;
             i++)
                kt_sleep_ms(500);
        ck_assert_int_eq(kt_committed_sum(brokers, prefix, jobs, NPARTS),
                         NJOBS);
        cq_itw_fleet_alive(&fleet, "at the end");
        ck_assert_int_eq(cq_itw_stop(&fleet.workers[0], SIGTERM, 60000), 0);
        ck_assert_int_eq(cq_itw_stop(&fleet.workers[1], SIGTERM, 60000), 0);
        cq_itw_env_release(&env);
}
END_TEST

static Suite *cluster_suite(void)
{
        Suite *s = suite_create("cluster");
        TCase *tc = tcase_create("failover");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_workers);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, leaders_die_and_nothing_is_lost_or_doubled);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cluster_suite)
