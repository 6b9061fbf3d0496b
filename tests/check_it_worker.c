/* SPDX-License-Identifier: MIT */
/* check_it_worker.c - the worker daemon end to end: real Kafka, real
 * PostgreSQL (a database of its own), real kernels, the fake LLM. Workers
 * are `coderq worker` processes started and killed by the tests; jobs go in
 * through the jobs topic and come out as rows and completion events. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "support/pgtest.h"
#include "coderq/common.h"
#include "coderq/store.h"
#include "coderq/util.h"
#include "support/fake_e2b.h"
#include "support/fake_llm.h"
#include "support/kafka_test.h"

#define WAIT_MS 240000

static cq_fake_llm_t *fake;
static char dsn[2048]; /* the suite's own database */
static char dbname[96];
static char prefix[128]; /* unique topic, group and job-id prefix */
static char logdir[] = "/tmp/cq-it-worker-XXXXXX";
static const char *brokers;

typedef struct worker {
        pid_t pid;
        char name[32];
} worker_t;

/* Every worker started, so a failed test cannot leave one running into
 * the next test (with CK_FORK=no nothing else would stop it). */
static pid_t started[16];
static size_t nstarted;

static void kill_leftovers(void)
{
        size_t i;

        for (i = 0; i < nstarted; i++) {
                if (started[i] > 0 && kill(started[i], SIGKILL) == 0)
                        waitpid(started[i], NULL, 0);
                started[i] = 0;
        }
        nstarted = 0;
}

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        fake = cq_fake_llm_start(NULL);
        ck_assert_ptr_nonnull(fake);
        ck_assert_ptr_nonnull(mkdtemp(logdir));
        /* A database of our own: workers claim any queued job, so other
         * suites' jobs must not be in reach. */
        cq_pgtest_sweep("cqw");
        cq_pgtest_create("cqw", true, dsn, sizeof(dsn), dbname, sizeof(dbname));
}

static void teardown(void)
{
        char sql[256];

        cq_fake_llm_stop(&fake);
        cq_pgtest_drop(dbname);
        /* CQ_KEEP_LOGS=1 keeps the workers' logs for a post-mortem */
        snprintf(sql, sizeof(sql), "rm -rf %s", logdir);
        if (getenv("CQ_KEEP_LOGS"))
                fprintf(stderr, "worker logs kept in %s\n", logdir);
        else if (system(sql) != 0)
                fprintf(stderr, "could not remove %s\n", logdir);
        curl_global_cleanup();
}

/* Fresh names for one test; empties the queue of earlier tests. */
static void fresh(const char *test)
{
        char topic[256];

        kt_unique(test, prefix, sizeof(prefix));
        kt_pg_exec(dsn, "TRUNCATE jobs, solutions CASCADE", NULL);
        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        kt_create_topic(brokers, topic, 3);
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        kt_create_topic(brokers, topic, 1);
        snprintf(topic, sizeof(topic), "%s.dlq", prefix);
        kt_create_topic(brokers, topic, 1);
}

static const char *job_max_bytes = "1M";

/* Idle slots' poll and the relay's interval of the next worker started. */
static const char *child_poll_ms = "100";
static const char *child_relay_ms = "200";
static const char *child_slots = "2";

static void child_env(const char *name, const char *lease_s)
{
        char v[512];

        setenv("CODERQ_JOB_MAX_BYTES", job_max_bytes, 1);
        setenv("CODERQ_PG_DSN", dsn, 1);
        setenv("CODERQ_KAFKA_BROKERS", brokers, 1);
        snprintf(v, sizeof(v), "%s.jobs", prefix);
        setenv("CODERQ_TOPIC_JOBS", v, 1);
        snprintf(v, sizeof(v), "%s.dlq", prefix);
        setenv("CODERQ_TOPIC_DLQ", v, 1);
        snprintf(v, sizeof(v), "%s.results", prefix);
        setenv("CODERQ_TOPIC_RESULTS", v, 1);
        snprintf(v, sizeof(v), "%s.events", prefix);
        setenv("CODERQ_TOPIC_EVENTS", v, 1);
        setenv("CODERQ_KAFKA_GROUP", prefix, 1);
        setenv("CODERQ_LLM_BASE_URL", cq_fake_llm_base_url(fake), 1);
        unsetenv("CODERQ_LLM_API_KEY");
        unsetenv("OPENAI_API_KEY");
        setenv("CODERQ_LLM_MAX_WAIT_S", "5", 1);
        setenv("CODERQ_SLOTS", child_slots, 1);
        setenv("CODERQ_KPOOL_SIZE", "2", 1);
        setenv("CODERQ_LEASE_S", lease_s, 1);
        setenv("CODERQ_POLL_MS", child_poll_ms, 1);
        setenv("CODERQ_RELAY_INTERVAL_MS", child_relay_ms, 1);
        setenv("CODERQ_SHUTDOWN_S", "20", 1);
        setenv("CODERQ_SANDBOX", "off", 1);
        setenv("CODERQ_LOG_LEVEL", "info", 1);
        setenv("CODERQ_WORKER_ID", name, 1);
}

static void start_worker(worker_t *w, const char *name, const char *lease_s)
{
        char log[512];
        pid_t pid;

        snprintf(w->name, sizeof(w->name), "%s", name);
        snprintf(log, sizeof(log), "%s/%s-%s.log", logdir, prefix, name);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                        close(fd);
                }
                child_env(name, lease_s);
                execl(CQ_BINARY_DIR "/coderq", "coderq", "worker",
                      (char *)NULL);
                _exit(127);
        }
        w->pid = pid;
        if (nstarted < CQ_ARRAY_SIZE(started))
                started[nstarted++] = pid;
}

/* The last warnings and errors of a worker's log on stderr: the logs are
 * removed after the run, and a failure on CI must say why. */
static void dump_log(const worker_t *w)
{
        char path[512], line[1024], *ring[40] = {0};
        size_t n = 0, i;
        FILE *fp;

        snprintf(path, sizeof(path), "%s/%s-%s.log", logdir, prefix, w->name);
        fp = fopen(path, "r");
        if (!fp)
                return;
        while (fgets(line, sizeof(line), fp)) {
                if (strstr(line, "\"level\":\"debug\"") ||
                    strstr(line, "\"level\":\"info\""))
                        continue;
                free(ring[n % CQ_ARRAY_SIZE(ring)]);
                ring[n % CQ_ARRAY_SIZE(ring)] = strdup(line);
                n++;
        }
        fclose(fp);
        fprintf(stderr, "--- last warnings of worker %s (%s) ---\n", w->name,
                path);
        for (i = n > CQ_ARRAY_SIZE(ring) ? n - CQ_ARRAY_SIZE(ring) : 0; i < n;
             i++)
                fputs(ring[i % CQ_ARRAY_SIZE(ring)]
                          ? ring[i % CQ_ARRAY_SIZE(ring)]
                          : "",
                      stderr);
        for (i = 0; i < CQ_ARRAY_SIZE(ring); i++)
                free(ring[i]);
}

/* The sum over \p w's log lines with message \p msg of their integer
 * field \p key; -1 when no such line exists. */
static long long log_sum(const worker_t *w, const char *msg, const char *key)
{
        char path[512], line[4096];
        long long sum = -1;
        FILE *fp;

        snprintf(path, sizeof(path), "%s/%s-%s.log", logdir, prefix, w->name);
        fp = fopen(path, "r");
        if (!fp)
                return -1;
        while (fgets(line, sizeof(line), fp)) {
                json_t *doc = json_loads(line, 0, NULL);
                const char *m = json_string_value(json_object_get(doc, "msg"));
                json_t *v = json_object_get(doc, key);

                if (m && json_is_integer(v) && strcmp(m, msg) == 0)
                        sum = (sum < 0 ? 0 : sum) + json_integer_value(v);
                json_decref(doc);
        }
        fclose(fp);
        return sum;
}

/* Signal the worker and wait for it; returns its exit status (or 128+sig)
 * or -1 when it did not exit within \p timeout_ms. A failure prints the
 * end of the worker's log. */
static int stop_worker(worker_t *w, int sig, int timeout_ms)
{
        int st, waited, rc;

        if (w->pid <= 0)
                return 0;
        kill(w->pid, sig);
        for (waited = 0; waited < timeout_ms; waited += 50) {
                pid_t r = waitpid(w->pid, &st, WNOHANG);

                if (r == w->pid) {
                        w->pid = 0;
                        rc = WIFEXITED(st) ? WEXITSTATUS(st)
                                           : 128 + WTERMSIG(st);
                        if (rc != 0 && rc != 128 + SIGKILL)
                                dump_log(w);
                        return rc;
                }
                kt_sleep_ms(50);
        }
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &st, 0);
        w->pid = 0;
        dump_log(w);
        return -1;
}

static bool worker_alive(const worker_t *w)
{
        return w->pid > 0 && waitpid(w->pid, NULL, WNOHANG) == 0;
}

static void register_script(const char *name, const char *steps)
{
        json_t *script = json_loads(steps, 0, NULL);

        ck_assert_msg(script != NULL, "bad script %s", name);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, name, script), 0);
        json_decref(script);
}

/* Produce job \p n of this test with \p extra fields (JSON members). */
static void submit(rd_kafka_t *rk, int n, const char *script, const char *extra)
{
        char id[192], value[4096], topic[256];

        snprintf(id, sizeof(id), "%s-%03d", prefix, n);
        snprintf(value, sizeof(value),
                 "{\"job_id\":\"%s\",\"run_id\":\"%s\",\"model\":"
                 "\"script:%s\",\"prompt\":\"Job %s: compute.\"%s%s}",
                 id, prefix, script, id, extra ? "," : "", extra ? extra : "");
        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        kt_produce(rk, topic, RD_KAFKA_PARTITION_UA, id, strlen(id), value,
                   strlen(value), NULL);
}

static long count_status(const char *status)
{
        return kt_pg_long(dsn, "SELECT count(*) FROM jobs WHERE status = $1",
                          status);
}

static long finished(void)
{
        return kt_pg_long(dsn,
                          "SELECT count(*) FROM jobs WHERE status IN "
                          "('succeeded', 'failed', 'cancelled')",
                          NULL);
}

/* Wait until \p n jobs finished; fails the test after \p ms. */
static void wait_finished(long n, int ms)
{
        int waited;

        for (waited = 0; waited < ms; waited += 250) {
                if (finished() >= n)
                        return;
                kt_sleep_ms(250);
        }
        ck_abort_msg("only %ld of %ld jobs finished in %d ms", finished(), n,
                     ms);
}

/* Distinct job ids among the completion events, read until \p expected
 * distinct ones arrived or \p ms passed. With two workers, two relays
 * may both publish a row (at least once): duplicates are expected. */
static size_t completion_events(size_t expected, int ms)
{
        char topic[256];
        size_t distinct = 0;
        int waited;

        snprintf(topic, sizeof(topic), "%s.results", prefix);
        for (waited = 0; waited < ms && distinct < expected; waited += 2000) {
                kt_msg_t *msgs = NULL;
                size_t n, i, k;

                n = kt_consume(brokers, topic, 1, expected * 4, 2000, &msgs);
                distinct = 0;
                for (i = 0; i < n; i++) {
                        bool seen = false;

                        ck_assert_ptr_nonnull(msgs[i].key);
                        ck_assert_ptr_nonnull(kt_header(&msgs[i], "event_id"));
                        for (k = 0; k < i && !seen; k++)
                                seen = strcmp(msgs[k].key, msgs[i].key) == 0;
                        if (!seen)
                                distinct++;
                }
                kt_msgs_free(msgs, n);
        }
        if (distinct < expected)
                fprintf(stderr,
                        "completion events: %zu of %zu jobs, %ld outbox "
                        "rows unsent\n",
                        distinct, expected,
                        kt_pg_long(dsn,
                                   "SELECT count(*) FROM outbox WHERE "
                                   "sent_at IS NULL",
                                   NULL));
        return distinct;
}

static const char two_cells[] =
    "[{\"tool_calls\":[{\"code\":\"import math\\nx = math.factorial(10)\\n"
    "print(x)\"}]},"
    "{\"tool_calls\":[{\"code\":\"import matplotlib.pyplot as plt\\n"
    "plt.plot([1, 2, 3], [x % 7, 2, 1])\\nplt.savefig('fig.png')\\n"
    "plt.show()\"}]},"
    "{\"content\":\"done\"}]";

START_TEST(fifty_jobs_two_workers)
{
        worker_t a, b;
        rd_kafka_t *rk;
        int i;

        fresh("fifty");
        register_script("two_cells", two_cells);
        start_worker(&a, "wa", "30");
        start_worker(&b, "wb", "30");
        rk = kt_producer(brokers);
        for (i = 0; i < 50; i++)
                submit(rk, i, "two_cells", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished(50, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 50);
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM results", NULL),
                         50);
        /* both workers took part */
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(DISTINCT finished_by) FROM "
                                    "jobs",
                                    NULL),
                         2);
        /* every job kept its notebook (3 cells: heading, 2 code, answer)
         * and the figure shown plus the file saved (same bytes: one) */
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM notebooks WHERE "
                                    "doc->>'nbformat' = '4' AND "
                                    "jsonb_array_length(doc->'cells') >= 3",
                                    NULL),
                         50);
        ck_assert_int_ge(kt_pg_long(dsn,
                                    "SELECT count(DISTINCT job_id) FROM "
                                    "images WHERE mime = 'image/png'",
                                    NULL),
                         50);
        ck_assert_uint_eq(completion_events(50, 60000), 50);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
        /* each worker's last words: its pool's reaper tore down every
         * job's kernel, and every cell took its turn at the gate */
        ck_assert_int_ge(log_sum(&a, "kernel pool", "discarded"), 1);
        ck_assert_int_ge(log_sum(&b, "kernel pool", "discarded"), 1);
        ck_assert_int_eq(log_sum(&a, "kernel pool", "discarded") +
                             log_sum(&b, "kernel pool", "discarded"),
                         50);
        ck_assert_int_ge(log_sum(&a, "kernel pool", "cells") +
                             log_sum(&b, "kernel pool", "cells"),
                         100);
        ck_assert_int_eq(log_sum(&a, "kernel pool", "failed") +
                             log_sum(&b, "kernel pool", "failed"),
                         0);
}
END_TEST

START_TEST(malformed_messages_go_to_the_dlq)
{
        worker_t a;
        rd_kafka_t *rk;
        char topic[256], big[70000];
        int i, good = 0, bad = 0;
        kt_msg_t *msgs = NULL;
        size_t n;
        static const char *const hostile[] = {
            "",
            "not json",
            "{",
            "[]",
            "{\"job_id\":42,\"prompt\":\"x\"}",
            "{\"prompt\":\"no id\"}",
            "{\"job_id\":\"only-id\"}",
            "{\"job_id\":\"v\",\"prompt\":\"x\",\"version\":99}",
            "{\"job_id\":\"t\",\"prompt\":\"x\",\"limits\":{\"max_turns\":"
            "-1}}",
            "{\"job_id\":\"\\u0000\",\"prompt\":\"x\"}",
            "{\"job_id\":\"f\",\"prompt\":\"x\",\"files\":[{\"name\":"
            "\"../etc/passwd\",\"content_b64\":\"AA==\"}]}",
            "{\"job_id\":\"n\",\"prompt\":\"x\",\"priority\":"
            "1e999999}",
            "\xff\xfe\x00garbage",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
        };

        fresh("dlq");
        register_script("quick", "[{\"content\":\"ok\"}]");
        job_max_bytes = "64k";
        start_worker(&a, "wdlq", "30");
        job_max_bytes = "1M";
        rk = kt_producer(brokers);
        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        for (i = 0; i < 220; i++) {
                if (i % 11 == 0) {
                        submit(rk, good++, "quick", NULL);
                        continue;
                }
                if (i % 37 == 5) {
                        /* oversize: past the worker's 64 KB cap, below
                         * the broker's message size limit */
                        size_t len = (size_t)200 << 10;
                        char *huge = malloc(len + 64);

                        ck_assert_ptr_nonnull(huge);
                        memset(huge, 'x', len + 63);
                        memcpy(huge, "{\"job_id\":\"big\",\"prompt\":\"", 26);
                        huge[len + 62] = '}';
                        kt_produce(rk, topic, RD_KAFKA_PARTITION_UA, "big", 3,
                                   huge, len + 63, NULL);
                        free(huge);
                } else {
                        const char *v = hostile[i % CQ_ARRAY_SIZE(hostile)];

                        kt_produce(
                            rk, topic, RD_KAFKA_PARTITION_UA, "bad", 3, v,
                            i % CQ_ARRAY_SIZE(hostile) == 12 ? 10 : strlen(v),
                            NULL);
                }
                bad++;
        }
        /* the same valid message twice: one job */
        submit(rk, 0, "quick", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished(good, WAIT_MS);
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM jobs", NULL),
                         good);
        snprintf(topic, sizeof(topic), "%s.dlq", prefix);
        n = kt_consume(brokers, topic, 1, (size_t)bad, 60000, &msgs);
        ck_assert_uint_eq(n, (size_t)bad);
        for (i = 0; i < (int)n; i++) {
                ck_assert_ptr_nonnull(kt_header(&msgs[i], "error"));
                ck_assert_ptr_nonnull(kt_header(&msgs[i], "source_offset"));
        }
        kt_msgs_free(msgs, n);
        ck_assert_msg(worker_alive(&a), "the worker stopped on bad input");
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
}
END_TEST

/* A job slow enough to be caught in flight: 4 turns of 1.5 s each. */
static const char slow_steps[] =
    "[{\"delay_ms\":1500,\"tool_calls\":[{\"code\":\"a = 20\"}]},"
    "{\"delay_ms\":1500,\"tool_calls\":[{\"code\":\"b = a + 1\"}]},"
    "{\"delay_ms\":1500,\"tool_calls\":[{\"code\":\"print(a + b)\"}]},"
    "{\"delay_ms\":1500,\"content\":\"41\"}]";

/* For each job, how often each step was requested (from the fake's log). */
static void steps_per_job(int njobs, int counts[][8])
{
        json_t *reqs = cq_fake_llm_requests(fake), *req;
        size_t i;
        int j;

        ck_assert_ptr_nonnull(reqs);
        memset(counts, 0, sizeof(int[8]) * (size_t)njobs);
        json_array_foreach(reqs, i, req)
        {
                char *body = json_dumps(json_object_get(req, "body"), 0);
                json_int_t step =
                    json_integer_value(json_object_get(req, "step"));

                for (j = 0; body && j < njobs; j++) {
                        char tag[200];

                        snprintf(tag, sizeof(tag), "Job %s-%03d:", prefix, j);
                        if (strstr(body, tag) && step >= 0 && step < 8 &&
                            json_integer_value(
                                json_object_get(req, "status")) == 200)
                                counts[j][step]++;
                }
                free(body);
        }
        json_decref(reqs);
}

START_TEST(killed_worker_jobs_are_resumed_once)
{
        worker_t a, b;
        rd_kafka_t *rk;
        int i, s, counts[4][8];
        int waited;

        fresh("kill9");
        register_script("slow", slow_steps);
        ck_assert_int_eq(cq_fake_llm_reset(fake), 0);
        start_worker(&a, "wk1", "5");
        rk = kt_producer(brokers);
        for (i = 0; i < 4; i++)
                submit(rk, i, "slow", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        /* wait until both slots are inside their jobs with a turn done */
        for (waited = 0; waited < 60000; waited += 100) {
                if (kt_pg_long(dsn,
                               "SELECT count(DISTINCT job_id) FROM "
                               "job_messages WHERE message->>'role' = "
                               "'assistant'",
                               NULL) >= 2)
                        break;
                kt_sleep_ms(100);
        }
        ck_assert_int_eq(stop_worker(&a, SIGKILL, 5000), 128 + SIGKILL);
        start_worker(&b, "wk2", "5");
        wait_finished(4, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 4);
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM results", NULL),
                         4);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE "
                                    "attempts = 2",
                                    NULL),
                         2);
        /* completed turns were not asked for again: at most the one turn
         * in flight at the kill is repeated */
        steps_per_job(4, counts);
        for (i = 0; i < 4; i++) {
                int repeated = 0;

                for (s = 0; s < 4; s++) {
                        ck_assert_msg(counts[i][s] >= 1,
                                      "job %d step %d never asked", i, s);
                        repeated += counts[i][s] - 1;
                }
                ck_assert_msg(repeated <= 1,
                              "job %d repeated %d completed turns", i,
                              repeated);
        }
        ck_assert_uint_eq(completion_events(4, 60000), 4);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
}
END_TEST

START_TEST(sigterm_releases_jobs_to_another_worker)
{
        worker_t a, b;
        rd_kafka_t *rk;
        int waited, rc;
        int64_t t0;

        fresh("term");
        register_script("slow", slow_steps);
        start_worker(&a, "wt1", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "slow", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        for (waited = 0; waited < 60000; waited += 100) {
                if (count_status("running") == 1 &&
                    kt_pg_long(dsn, "SELECT count(*) FROM job_messages", NULL) >
                        2)
                        break;
                kt_sleep_ms(100);
        }
        t0 = (int64_t)time(NULL);
        rc = stop_worker(&a, SIGTERM, 25000);
        ck_assert_msg(rc == 0, "worker exit status %d", rc);
        ck_assert_int_le((int64_t)time(NULL) - t0, 22);
        /* back in the queue, not failed */
        ck_assert_int_eq(count_status("queued"), 1);
        start_worker(&b, "wt2", "30");
        wait_finished(1, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 1);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
}
END_TEST

START_TEST(cancel_and_sessions)
{
        worker_t a;
        rd_kafka_t *rk;
        int waited;
        char id[192];

        fresh("cancel");
        register_script("sleepy",
                        "[{\"tool_calls\":[{\"code\":\"import time\\n"
                        "time.sleep(60)\"}]},{\"content\":\"late\"}]");
        register_script("parent",
                        "[{\"tool_calls\":[{\"code\":\"shared = 'kept'\"}]},"
                        "{\"content\":\"parent done\"}]");
        /* The child's conversation starts with the parent's two replies,
         * and the fake counts steps from the whole history. */
        register_script("child",
                        "[{\"content\":\"(parent's turn)\"},"
                        "{\"content\":\"(parent's turn)\"},"
                        "{\"tool_calls\":[{\"code\":\"print(shared)\"}]},"
                        "{\"content\":\"child done\"}]");
        start_worker(&a, "wc", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "sleepy", NULL);
        snprintf(id, sizeof(id), "\"parent_job_id\":\"%s-002\"", prefix);
        submit(rk, 3, "child", id); /* before its parent: it waits */
        submit(rk, 2, "parent", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        snprintf(id, sizeof(id), "%s-000", prefix);
        for (waited = 0; waited < 60000; waited += 100) {
                if (kt_pg_long(dsn,
                               "SELECT count(*) FROM jobs WHERE job_id = $1 "
                               "AND status = 'running'",
                               id) == 1)
                        break;
                kt_sleep_ms(100);
        }
        kt_sleep_ms(1500); /* inside time.sleep */
        {
                cq_store_opts_t so;
                cq_store_t *store;
                cq_cancel_outcome_t outcome;
                char errstr[256];

                cq_store_opts_init(&so);
                so.dsn = dsn;
                store = cq_store_new(&so, errstr, sizeof(errstr));
                ck_assert_msg(store != NULL, "%s", errstr);
                ck_assert_int_eq(cq_store_cancel(store, id, &outcome), CQ_OK);
                ck_assert_int_eq(outcome, CQ_CANCEL_REQUESTED);
                cq_store_destroy(&store);
        }
        wait_finished(3, WAIT_MS);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id = "
                                    "$1 AND status = 'cancelled'",
                                    id),
                         1);
        /* the child saw the parent's variable */
        snprintf(id, sizeof(id), "%s-003", prefix);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id = "
                                    "$1 AND status = 'succeeded'",
                                    id),
                         1);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM cells WHERE job_id "
                                    "= $1 AND outputs::text LIKE '%kept%'",
                                    id),
                         1);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
}
END_TEST

/* With a one-minute poll and relay interval, jobs submitted to an idle
 * worker must still be claimed and reported within seconds: PostgreSQL
 * announces them and a finished job kicks the relay. */
START_TEST(idle_worker_hears_of_new_jobs)
{
        worker_t a;
        rd_kafka_t *rk;
        long unsent = -1;
        int i, waited;

        fresh("wake");
        register_script("two_cells", two_cells);
        child_poll_ms = "60000";
        child_relay_ms = "60000";
        start_worker(&a, "ww", "30");
        child_poll_ms = "100";
        child_relay_ms = "200";
        kt_sleep_ms(3000); /* its first claims and relay round are done */
        rk = kt_producer(brokers);
        for (i = 0; i < 3; i++)
                submit(rk, i, "two_cells", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        /* well before the first poll, 60 s after the start */
        wait_finished(3, 35000);
        ck_assert_int_eq(count_status("succeeded"), 3);
        for (waited = 0; waited < 10000; waited += 100) {
                unsent = kt_pg_long(dsn,
                                    "SELECT count(*) FROM outbox WHERE "
                                    "sent_at IS NULL",
                                    NULL);
                if (unsent == 0)
                        break;
                kt_sleep_ms(100);
        }
        ck_assert_int_eq(unsent, 0);
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM outbox", NULL),
                         3);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
}
END_TEST

/* Idle slots cost one claim per CODERQ_POLL_MS for the whole worker, not
 * one per slot; and work that nobody announces (here: jobs whose
 * run_after passes while the worker is idle) is still found by that poll,
 * and all of it is taken, not one job per poll. */
START_TEST(idle_slots_poll_once_per_worker)
{
        worker_t a;
        char sql[2048];
        int64_t t0, elapsed;
        long long claims, empty;
        long spread;

        fresh("poll");
        /* Jobs longer than the poll interval: a slot that finished one
         * cannot pick up the next before the poll would. */
        register_script("slow_steps", slow_steps);
        child_slots = "8";
        child_poll_ms = "1000";
        t0 = cq_now_ms();
        start_worker(&a, "wp", "30");
        child_slots = "2";
        child_poll_ms = "100";
        kt_sleep_ms(3000);
        /* Announced on insert, but claimable only 2 s later: what wakes
         * the slots then is the poll. */
        snprintf(sql, sizeof(sql),
                 "WITH ins AS (INSERT INTO jobs (job_id, run_id, prompt, spec,"
                 " run_after) SELECT id, $1, 'Job ' || id || ': compute.',"
                 " jsonb_build_object('job_id', id, 'run_id', $1::text,"
                 " 'model', 'script:slow_steps', 'prompt', 'Job ' || id ||"
                 " ': compute.'), now() + interval '2 s' FROM (SELECT $1 ||"
                 " '-p' || g AS id FROM generate_series(1, 4) g) s"
                 " RETURNING 1) SELECT count(*) FROM ins");
        ck_assert_int_eq(kt_pg_long(dsn, sql, prefix), 4);
        wait_finished(4, 60000);
        ck_assert_int_eq(count_status("succeeded"), 4);
        /* One poll found them all: each find let another slot look at
         * once. One job per poll would spread the claims over 3 s (the
         * jobs take 6 s each). */
        spread = kt_pg_long(dsn,
                            "SELECT (1000 * extract(epoch FROM max(started_at)"
                            " - min(started_at)))::bigint FROM jobs",
                            NULL);
        ck_assert_msg(spread < 1000, "claims spread over %ld ms", spread);
        kt_sleep_ms(1000); /* idle again */
        elapsed = cq_now_ms() - t0;
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        claims = log_sum(&a, "worker stopped", "claims");
        empty = log_sum(&a, "worker stopped", "claims_empty");
        ck_assert_int_eq(claims, 4);
        /* Per worker: a first look and one more per slot before the
         * listener is up, the 4 announced, the poll's (one a second) and
         * a chained look per job found. Per-slot polling would make it 8
         * per 1.0-1.1 s: over 7 a second. */
        ck_assert_msg(empty >= 1 && empty <= 2 * 8 + 4 + 4 + 2 * elapsed / 1000,
                      "%lld empty claims in %lld ms by an 8-slot worker", empty,
                      (long long)elapsed);
}
END_TEST

START_TEST(broker_and_database_outages_lose_nothing)
{
        worker_t a;
        rd_kafka_t *rk;
        int i;

        fresh("outage");
        register_script("two_cells", two_cells);
        start_worker(&a, "wo", "30");
        rk = kt_producer(brokers);
        for (i = 0; i < 6; i++)
                submit(rk, i, "two_cells", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        kt_sleep_ms(1500);
        kt_services("stop-kafka");
        kt_sleep_ms(20000);
        kt_services("start-kafka");
        kt_services("restart-pg");
        wait_finished(6, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 6);
        ck_assert_uint_eq(completion_events(6, 90000), 6);
        ck_assert_msg(worker_alive(&a), "the worker died in the outage");
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
}
END_TEST

/* An LLM turn longer than the E2B TTL must not lose the job's sandbox:
 * housekeeping extends it. The TTL is 30 s and the turn 40 s; the job's
 * cell deadline (1 s) is too short for the per-cell extension to cover
 * the turn. */
START_TEST(long_llm_turn_keeps_the_e2b_sandbox)
{
        cq_fake_e2b_t e2b;
        worker_t a;
        rd_kafka_t *rk;

        fresh("e2bkeep");
        ck_assert_int_eq(cq_fake_e2b_start(&e2b, 1.0), 0);
        register_script("slow_turn",
                        "[{\"tool_calls\":[{\"code\":\"x = 41\"}]},"
                        "{\"delay_ms\":40000,\"tool_calls\":[{\"code\":"
                        "\"print(x + 1)\"}]},"
                        "{\"content\":\"done\"}]");
        setenv("E2B_API_KEY", e2b.api_key, 1);
        setenv("E2B_API_URL", e2b.api_url, 1);
        setenv("E2B_SANDBOX_URL", e2b.sandbox_url, 1);
        setenv("CODERQ_E2B_TTL_S", "30", 1);
        start_worker(&a, "wk", "30");
        unsetenv("E2B_API_KEY");
        unsetenv("E2B_API_URL");
        unsetenv("E2B_SANDBOX_URL");
        unsetenv("CODERQ_E2B_TTL_S");
        rk = kt_producer(brokers);
        submit(rk, 0, "slow_turn",
               "\"backend\":\"e2b\",\"limits\":{\"cell_timeout_s\":1}");
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished(1, 150000);
        ck_assert_int_eq(count_status("succeeded"), 1);
        /* one sandbox, extended by housekeeping, never expired */
        ck_assert_int_eq(cq_fake_e2b_stat(&e2b, "created"), 1);
        ck_assert_int_eq(cq_fake_e2b_stat(&e2b, "expired"), 0);
        ck_assert_int_ge(cq_fake_e2b_stat(&e2b, "set_timeout"), 2);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        ck_assert_int_eq(cq_fake_e2b_stat(&e2b, "live"), 0);
        cq_fake_e2b_stop(&e2b);
}
END_TEST

static Suite *worker_suite(void)
{
        Suite *s = suite_create("worker");
        TCase *tc = tcase_create("e2e");
        TCase *e2b = tcase_create("e2b");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_leftovers);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, fifty_jobs_two_workers);
        tcase_add_test(tc, malformed_messages_go_to_the_dlq);
        tcase_add_test(tc, killed_worker_jobs_are_resumed_once);
        tcase_add_test(tc, sigterm_releases_jobs_to_another_worker);
        tcase_add_test(tc, cancel_and_sessions);
        tcase_add_test(tc, idle_worker_hears_of_new_jobs);
        tcase_add_test(tc, idle_slots_poll_once_per_worker);
        tcase_add_test(tc, broker_and_database_outages_lose_nothing);
        suite_add_tcase(s, tc);
        tcase_add_unchecked_fixture(e2b, setup, teardown);
        tcase_add_checked_fixture(e2b, NULL, kill_leftovers);
        tcase_set_timeout(e2b, 300);
        tcase_add_test(e2b, long_llm_turn_keeps_the_e2b_sandbox);
        suite_add_tcase(s, e2b);
        return s;
}

CQ_CHECK_MAIN(worker_suite)
