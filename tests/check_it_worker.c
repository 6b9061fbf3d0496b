/* SPDX-License-Identifier: MIT */
/* check_it_worker.c - the worker daemon end to end: real Kafka, real
 * PostgreSQL (a database of its own), real kernels, the fake LLM. Workers
 * are `coderq worker` processes started and killed by the tests; jobs go in
 * through the jobs topic and come out as rows and completion events. */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "support/pgtest.h"
#include "coderq/agent/agent.h"
#include "coderq/cli/cli.h"
#include "coderq/common/buf.h"
#include "coderq/common/common.h"
#include "coderq/agent/notebook.h"
#include "coderq/local/sandbox.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/artifacts.h"
#include "coderq/storage/queries.h"
#include "coderq/common/util.h"
#include "support/fake_e2b.h"
#include "support/fake_llm.h"
#include "support/kafka_test.h"
#include "support/pgproxy.h"
#include "support/proc.h"

#define WAIT_MS 240000

static cq_fake_llm_t *fake;
static char dsn[2048]; /* the suite's own database */
static char dbname[96];
static char prefix[128]; /* unique topic, group and job-id prefix */
#define LOGDIR_TEMPLATE "/tmp/cq-it-worker-XXXXXX"
static char logdir[] = LOGDIR_TEMPLATE;
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
        /* every test case runs this setup: a fresh template each time */
        snprintf(logdir, sizeof(logdir), "%s", LOGDIR_TEMPLATE);
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
/* More settings of the next worker started ("NAME=VALUE"; "NAME=" unsets
 * NAME), or NULL. */
static const char *const *child_extra;

static void child_env(const char *name, const char *lease_s)
{
        char v[512];
        const char *const *extra;

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
        unsetenv("E2B_API_KEY");
        for (extra = child_extra; extra && *extra; extra++) {
                const char *eq = strchr(*extra, '=');
                char key[128];

                if (!eq || (size_t)(eq - *extra) >= sizeof(key))
                        continue;
                snprintf(key, sizeof(key), "%.*s", (int)(eq - *extra), *extra);
                if (eq[1])
                        setenv(key, eq + 1, 1);
                else
                        unsetenv(key);
        }
}

/* In a forked child: stdout and stderr to \p log, killed with the
 * suite. */
static void child_output_to(const char *log)
{
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
        }
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
                child_output_to(log);
                child_env(name, lease_s);
                execl(CQ_BINARY_DIR "/coderq", "coderq", "worker",
                      (char *)NULL);
                _exit(127);
        }
        w->pid = pid;
        if (nstarted < CQ_ARRAY_SIZE(started))
                started[nstarted++] = pid;
}

/* The last warnings and errors of a worker's log on stderr (every level
 * when \p all): the logs are removed after the run, and a failure on CI
 * must say why. */
static void dump_log_lines(const worker_t *w, bool all)
{
        char path[512], line[1024], *ring[40] = {0};
        size_t n = 0, i;
        FILE *fp;

        snprintf(path, sizeof(path), "%s/%s-%s.log", logdir, prefix, w->name);
        fp = fopen(path, "r");
        if (!fp)
                return;
        while (fgets(line, sizeof(line), fp)) {
                if (!all && (strstr(line, "\"level\":\"debug\"") ||
                             strstr(line, "\"level\":\"info\"")))
                        continue;
                free(ring[n % CQ_ARRAY_SIZE(ring)]);
                ring[n % CQ_ARRAY_SIZE(ring)] = strdup(line);
                n++;
        }
        fclose(fp);
        fprintf(stderr, "--- last %s of worker %s (%s) ---\n",
                all ? "lines" : "warnings", w->name, path);
        for (i = n > CQ_ARRAY_SIZE(ring) ? n - CQ_ARRAY_SIZE(ring) : 0; i < n;
             i++)
                fputs(ring[i % CQ_ARRAY_SIZE(ring)]
                          ? ring[i % CQ_ARRAY_SIZE(ring)]
                          : "",
                      stderr);
        for (i = 0; i < CQ_ARRAY_SIZE(ring); i++)
                free(ring[i]);
}

static void dump_log(const worker_t *w) { dump_log_lines(w, false); }

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

/* How many of \p w's log lines have message \p msg at \p level. */
static long log_count(const worker_t *w, const char *msg, const char *level)
{
        char path[512], line[4096];
        long n = 0;
        FILE *fp;

        snprintf(path, sizeof(path), "%s/%s-%s.log", logdir, prefix, w->name);
        fp = fopen(path, "r");
        if (!fp)
                return -1;
        while (fgets(line, sizeof(line), fp)) {
                json_t *doc = json_loads(line, 0, NULL);
                const char *m = json_string_value(json_object_get(doc, "msg"));
                const char *l =
                    json_string_value(json_object_get(doc, "level"));

                if (m && l && strcmp(m, msg) == 0 && strcmp(l, level) == 0)
                        n++;
                json_decref(doc);
        }
        fclose(fp);
        return n;
}

/* Signal the worker (\p sig 0: it was signalled already) and wait for it;
 * returns its exit status (or 128+sig) or -1 when it did not exit within
 * \p timeout_ms. A failure prints the end of the worker's log. */
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
        /* Still running: say where it waits before killing it. */
        fprintf(stderr,
                "--- worker %s did not exit within %d ms of signal "
                "%d ---\n",
                w->name, timeout_ms, sig);
        dump_log_lines(w, true);
        cq_check_proc_backtrace(w->pid);
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &st, 0);
        w->pid = 0;
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

/* A count from the suite's database, \p sql with one parameter (or
 * none), reaching \p want: what wait_sql() waits for. */
typedef struct sql_wait {
        const char *sql;
        const char *param;
        long want;
} sql_wait_t;

static bool sql_reached(void *arg)
{
        const sql_wait_t *w = arg;

        return kt_pg_long(dsn, w->sql, w->param) >= w->want;
}

/* Wait until \p sql counts at least \p want; fails the test after \p ms,
 * saying \p what did not happen. */
static void wait_sql(
    const char *sql, const char *param, long want, int ms, const char *what)
{
        sql_wait_t w = {sql, param, want};

        ck_assert_msg(cq_check_wait_until(sql_reached, &w, ms),
                      "%s within %d ms (%ld of %ld)", what, ms,
                      kt_pg_long(dsn, sql, param), want);
}

/* Whether this suite's worker listens for job announcements: PostgreSQL
 * shows its listener's connection, whose last statement was LISTEN. */
static bool listening(void *arg)
{
        (void)arg;
        return kt_pg_long(dsn,
                          "SELECT count(*) FROM pg_stat_activity WHERE "
                          "datname = current_database() AND application_name "
                          "= 'coderq-listen' AND query LIKE 'LISTEN %'",
                          NULL) >= 1;
}

static bool finished_n(void *arg) { return finished() >= *(const long *)arg; }

/* Whether every outbox row was sent. */
static bool outbox_sent(void *arg)
{
        (void)arg;
        return kt_pg_long(dsn,
                          "SELECT count(*) FROM outbox WHERE sent_at IS NULL",
                          NULL) == 0;
}

/* Wait until \p n jobs finished; fails the test after \p ms. */
static void wait_finished(long n, int ms)
{
        if (cq_check_wait_until(finished_n, &n, ms))
                return;
        ck_abort_msg("only %ld of %ld jobs finished in %d ms", finished(), n,
                     ms);
}

/* Distinct job ids among the completion events, read until \p expected
 * distinct ones arrived or \p ms passed. */
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

/* Every completion event on the results topic, once the outbox is all
 * sent (waited for at most \p ms): the relays claim rows, so a fleet
 * sends one event per job; only a relay killed between a delivery and
 * its marking sends one again. */
static long all_events(int ms)
{
        char topic[256];

        (void)cq_check_wait_until(outbox_sent, NULL, ms);
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        return (long)kt_high_sum(brokers, topic, 1);
}

static const char two_cells[] =
    "[{\"tool_calls\":[{\"code\":\"import math\\nx = math.factorial(10)\\n"
    "print(x)\"}]},"
    "{\"tool_calls\":[{\"code\":\"import matplotlib.pyplot as plt\\n"
    "plt.plot([1, 2, 3], [x % 7, 2, 1])\\nplt.savefig('fig.png')\\n"
    "plt.show()\"}]},"
    "{\"content\":\"done\"}]";

/* The heartbeat's list of running jobs is taken before its statement: a
 * job that finished meanwhile is reported not running, and the flag it
 * raises must not reach the job its slot claimed next (which then stopped
 * as "lost" and waited out its own lease to run a second time). A 5 s
 * lease beats every 1.7 s while 4 slots finish a job every ~100 ms, so
 * many beats race a finish. */
static const char quick_cell[] =
    "[{\"tool_calls\":[{\"code\":\"print(6 * 7)\"}]},{\"content\":\"42\"}]";

START_TEST(heartbeat_never_flags_the_next_job)
{
        worker_t a;
        rd_kafka_t *rk;
        int i;

        fresh("beat");
        register_script("quick_cell", quick_cell);
        child_slots = "4";
        start_worker(&a, "wh", "5");
        child_slots = "2";
        rk = kt_producer(brokers);
        for (i = 0; i < 120; i++)
                submit(rk, i, "quick_cell", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished(120, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 120);
        ck_assert_int_eq(
            kt_pg_long(dsn, "SELECT count(*) FROM jobs WHERE attempts <> 1",
                       NULL),
            0);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
}
END_TEST

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
        /* these workers run with CODERQ_SANDBOX=off: every result records
         * it, and they warn at start and with every job */
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM results WHERE "
                                    "report->>'sandbox' = 'off'",
                                    NULL),
                         50);
        ck_assert_uint_eq(completion_events(50, 60000), 50);
        /* no duplicates: each row was sent by one relay */
        ck_assert_int_eq(all_events(60000), 50);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
        ck_assert_int_eq(log_count(&a, "sandbox", "warn"), 1);
        ck_assert_int_eq(log_count(&b, "sandbox", "warn"), 1);
        ck_assert_int_eq(
            log_count(&a, "job runs UNSANDBOXED, as the worker's user",
                      "warn") +
                log_count(&b, "job runs UNSANDBOXED, as the worker's user",
                          "warn"),
            50);
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

/* ------------------------------------------------------------ metrics */

/* The string field \p key of \p w's first log line with message \p msg,
 * waited for up to \p ms; caller frees it. */
static char *
log_field(const worker_t *w, const char *msg, const char *key, int ms)
{
        char path[512], line[4096];
        int waited;

        snprintf(path, sizeof(path), "%s/%s-%s.log", logdir, prefix, w->name);
        for (waited = 0; waited < ms; waited += 100) {
                FILE *fp = fopen(path, "r");
                char *found = NULL;

                while (fp && !found && fgets(line, sizeof(line), fp)) {
                        json_t *doc = json_loads(line, 0, NULL);
                        const char *m =
                            json_string_value(json_object_get(doc, "msg"));
                        const char *v =
                            json_string_value(json_object_get(doc, key));

                        if (m && v && strcmp(m, msg) == 0)
                                found = strdup(v);
                        json_decref(doc);
                }
                if (fp)
                        fclose(fp);
                if (found)
                        return found;
                kt_sleep_ms(100);
        }
        ck_abort_msg("worker %s never logged \"%s\"", w->name, msg);
        return NULL;
}

static size_t http_collect(char *p, size_t size, size_t n, void *opaque)
{
        cq_buf_t *buf = opaque;

        return cq_buf_append(buf, p, size * n) == CQ_OK ? size * n : 0;
}

/* GET \p url; its status (0: no answer) and *bodyp (caller frees). */
static long http_get(const char *url, char **bodyp)
{
        CURL *curl = curl_easy_init();
        cq_buf_t buf;
        long status = 0;

        ck_assert_ptr_nonnull(curl);
        cq_buf_init(&buf, 8 << 20);
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, http_collect);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buf);
        if (curl_easy_perform(curl) == CURLE_OK)
                curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(curl);
        *bodyp = cq_buf_take(&buf, NULL);
        if (!*bodyp)
                *bodyp = strdup("");
        return status;
}

/* Wait until \p path of the worker's server answers \p status. */
static void wait_http(int port, const char *path, long status, int ms)
{
        char url[128], *body = NULL;
        long got = 0;
        int waited;

        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
        for (waited = 0; waited < ms; waited += 200) {
                free(body);
                got = http_get(url, &body);
                if (got == status)
                        break;
                kt_sleep_ms(200);
        }
        ck_assert_msg(got == status, "%s answered %ld, not %ld: %s", path, got,
                      status, body);
        free(body);
}

/* The value of the sample \p name (with its labels) in \p text; -1 when
 * it is absent. */
static double sample(const char *text, const char *name)
{
        size_t n = strlen(name);
        const char *p = text;

        while ((p = strstr(p, name))) {
                if ((p == text || p[-1] == '\n') && p[n] == ' ')
                        return strtod(p + n + 1, NULL);
                p += n;
        }
        return -1;
}

/* The sum of coderq_queue_jobs{state=\p state} in \p text, and in
 * *\p nqueuesp how many queues have that state's series. */
static double queue_jobs(const char *text, const char *state, int *nqueuesp)
{
        const char *head = "coderq_queue_jobs{queue=\"";
        const char *p = text;
        char want[64];
        double sum = 0;

        snprintf(want, sizeof(want), "\",state=\"%s\"} ", state);
        *nqueuesp = 0;
        while ((p = strstr(p, head))) {
                const char *end = strchr(p, '\n'), *at = strstr(p, want);

                if ((p == text || p[-1] == '\n') && at && (!end || at < end)) {
                        sum += strtod(at + strlen(want), NULL);
                        ++*nqueuesp;
                }
                p += strlen(head);
        }
        return sum;
}

/* A TCP port nobody listens on now. */
static int free_port(void)
{
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = socket(AF_INET, SOCK_STREAM, 0), port;

        ck_assert_int_ge(fd, 0);
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
        port = ntohs(sa.sin_port);
        close(fd);
        return port;
}

/* The sum of the values of a Prometheus instant query's result; -1
 * before it has any. */
static double prom_query(int port, const char *query)
{
        char url[512], *body = NULL;
        json_t *doc, *result, *row;
        double sum = -1;
        size_t i;

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/api/v1/query?query=%s",
                 port, query);
        if (http_get(url, &body) != 200) {
                free(body);
                return -1;
        }
        doc = json_loads(body, 0, NULL);
        result = json_object_get(json_object_get(doc, "data"), "result");
        json_array_foreach(result, i, row)
        {
                const char *v = json_string_value(
                    json_array_get(json_object_get(row, "value"), 1));

                if (v)
                        sum = (sum < 0 ? 0 : sum) + strtod(v, NULL);
        }
        json_decref(doc);
        free(body);
        return sum;
}

/* The first bytes of /proc/PID/NAME, NUL-terminated; their count, or -1
 * when the process is gone. */
static long proc_read(long pid, const char *name, char *buf, size_t size)
{
        char path[64];
        size_t n;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%ld/%s", pid, name);
        fp = fopen(path, "r");
        if (!fp)
                return -1;
        n = fread(buf, 1, size - 1, fp);
        fclose(fp);
        buf[n] = '\0';
        return (long)n;
}

/* The kernel server of worker \p worker: its child "PYTHON -c PROGRAM 3
 * ..." (kserver.c server_start()); -1 when it has none. */
static pid_t kserver_of(pid_t worker)
{
        char buf[512];
        struct dirent *de;
        pid_t found = -1;
        DIR *dir = opendir("/proc");

        ck_assert_ptr_nonnull(dir);
        while (found < 0 && (de = readdir(dir))) {
                long pid = strtol(de->d_name, NULL, 10), ppid = 0, n;
                const char *arg;

                if (pid <= 1 || proc_read(pid, "stat", buf, sizeof(buf)) < 0)
                        continue;
                arg = strrchr(buf, ')');
                if (!arg || sscanf(arg + 2, "%*c %ld", &ppid) != 1 ||
                    ppid != (long)worker)
                        continue;
                n = proc_read(pid, "cmdline", buf, sizeof(buf));
                /* argv[1] "-s", argv[2] "-c", then the program */
                arg = buf + strlen(buf) + 1;
                if (n > 0 && arg < buf + n && strcmp(arg, "-s") == 0)
                        arg += strlen(arg) + 1;
                if (n > 0 && arg < buf + n && strcmp(arg, "-c") == 0)
                        found = (pid_t)pid;
        }
        closedir(dir);
        return found;
}

/* \p port's /metrics into *bodyp (freed first) until \p name reads
 * \p want, for up to \p ms; the value it read last. */
static double
metric_until(int port, char **bodyp, const char *name, double want, int ms)
{
        char url[128];
        double v = -1;
        int waited;

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", port);
        for (waited = 0; waited <= ms; waited += 200) {
                free(*bodyp);
                *bodyp = NULL;
                ck_assert_int_eq(http_get(url, bodyp), 200);
                v = sample(*bodyp, name);
                if (v == want)
                        break;
                kt_sleep_ms(200);
        }
        return v;
}

/* After the metrics test, pass or fail: no worker or Prometheus left,
 * and PostgreSQL running again (a no-op when it is). */
static void metrics_cleanup(void)
{
        child_extra = NULL;
        kill_leftovers();
        kt_services("start-pg");
}

START_TEST(metrics_health_and_a_real_prometheus)
{
        static const char *const extra[] = {"CODERQ_METRICS_ADDR=127.0.0.1:0",
                                            NULL};
        worker_t a;
        rd_kafka_t *rk;
        char url[128], path[600], cmd[1400], *port_text, *body = NULL;
        cq_check_proc_t proc;
        const char *sh[] = {"/bin/sh", "-c", cmd, NULL};
        int port, pport, i, waited, jobs = 3, nqueues = 0;
        double v = -1, forked;
        pid_t prom;
        FILE *fp;

        fresh("metrics");
        register_script("two_cells", two_cells);
        child_extra = extra;
        start_worker(&a, "wm", "30");
        port_text = log_field(&a, "serving metrics", "port", 60000);
        port = (int)strtol(port_text, NULL, 10);
        ck_assert_int_gt(port, 0);
        free(port_text);
        wait_http(port, "/readyz", 200, 60000);
        wait_http(port, "/healthz", 200, 1000);
        wait_http(port, "/nothing", 404, 1000);
        rk = kt_producer(brokers);
        for (i = 0; i < 3; i++)
                submit(rk, i, "two_cells", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished(3, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 3);

        /* what the worker counted; the queue depth is read every 2 s */
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", port);
        for (waited = 0; waited < 30000; waited += 200) {
                free(body);
                ck_assert_int_eq(http_get(url, &body), 200);
                if (sample(body, "coderq_jobs_finished_total{status="
                                 "\"succeeded\",reason=\"none\"}") == 3 &&
                    sample(body, "coderq_queue_depth") == 0 &&
                    sample(body, "coderq_outbox_pending") == 0)
                        break;
                kt_sleep_ms(200);
        }
        ck_assert_msg(sample(body, "coderq_jobs_finished_total{status="
                                   "\"succeeded\",reason=\"none\"}") == 3,
                      "%s", body);
        ck_assert(sample(body, "coderq_jobs_claimed_total") == 3);
        ck_assert(sample(body, "coderq_jobs_running") == 0);
        ck_assert(sample(body, "coderq_slots") == 2);
        ck_assert(sample(body, "coderq_queue_depth") == 0);
        ck_assert(sample(body, "coderq_outbox_pending") == 0);
        ck_assert(sample(body, "coderq_outbox_failed") == 0);
        /* the three events went out through this worker's claims */
        ck_assert(sample(body, "coderq_outbox_empty_claims_total") >= 0);
        ck_assert(sample(body, "coderq_outbox_claims_total") -
                      sample(body, "coderq_outbox_empty_claims_total") >=
                  1);
        /* three turns per job, two cells per job */
        ck_assert(sample(body, "coderq_llm_calls_total{model=\"script:two_"
                               "cells\",outcome=\"ok\"}") == 9);
        ck_assert(sample(body, "coderq_llm_call_duration_seconds_count{model="
                               "\"script:two_cells\"}") == 9);
        ck_assert(sample(body, "coderq_cell_duration_seconds_count{status="
                               "\"ok\"}") == 6);
        ck_assert(sample(body, "coderq_llm_tokens_total{model=\"script:two_"
                               "cells\",kind=\"prompt\"}") > 0);
        ck_assert(sample(body, "coderq_kernel_pool_size") == 2);
        ck_assert(sample(body, "coderq_kernels_started_total{kind=\"cold\"}") +
                      sample(body, "coderq_kernels_started_total{kind="
                                   "\"forked\"}") >=
                  3);
        ck_assert(sample(body, "coderq_intake_messages_total") == 3);
        ck_assert(sample(body, "coderq_dlq_messages_total") == 0);
        ck_assert(sample(body, "coderq_progress_events_dropped_total") == 0);
        ck_assert_ptr_nonnull(strstr(body, "# TYPE coderq_intake_lag gauge"));
        ck_assert_ptr_nonnull(strstr(body, "# TYPE coderq_queue_jobs gauge"));

        /* The kernel server: up while it forks the pool's kernels, never
         * started again, every cold start one it missed. Killed, it is
         * down at once, and housekeeping starts it again after its
         * backoff without a kernel start asking for it; the next job's
         * kernel is forked by the new one. */
        ck_assert(sample(body, "coderq_kernel_server_restarts_total") == 0);
        forked = sample(body, "coderq_kernels_started_total{kind=\"forked\"}");
        if (forked > 0) {
                pid_t server = kserver_of(a.pid);

                ck_assert(sample(body, "coderq_kernel_server_up") == 1);
                ck_assert(
                    sample(body, "coderq_kernel_server_misses_total") >=
                    sample(body,
                           "coderq_kernels_started_total{kind=\"cold\"}"));
                ck_assert_int_gt(server, 1);
                ck_assert_int_eq(kill(server, SIGKILL), 0);
                ck_assert(metric_until(port, &body, "coderq_kernel_server_up",
                                       0, 10000) == 0);
                ck_assert_msg(
                    metric_until(port, &body, "coderq_kernel_server_up", 1,
                                 90000) == 1,
                    "the kernel server never came back (restarts %g)",
                    sample(body, "coderq_kernel_server_restarts_total"));
                ck_assert(sample(body, "coderq_kernel_server_restarts_total") ==
                          1);
                ck_assert_int_ne(kserver_of(a.pid), server);
                rk = kt_producer(brokers);
                submit(rk, jobs, "two_cells", NULL);
                kt_flush(rk);
                kt_producer_destroy(rk);
                wait_finished(++jobs, WAIT_MS);
                ck_assert(metric_until(port, &body,
                                       "coderq_kernels_started_total{kind="
                                       "\"forked\"}",
                                       forked + 1, 10000) == forked + 1);
        } else {
                ck_assert(sample(body, "coderq_kernel_server_up") == 0);
        }
        ck_assert_int_eq(count_status("succeeded"), jobs);

        /* PostgreSQL stopped: alive, not ready; back: ready again */
        kt_services("stop-pg");
        wait_http(port, "/readyz", 503, 30000);
        wait_http(port, "/healthz", 200, 1000);
        kt_services("start-pg");
        wait_http(port, "/readyz", 200, 60000);
        wait_http(port, "/healthz", 200, 1000);

        /* Each named queue's jobs by state, from the view queue_depth: 2
         * queued and 1 held back in a queue no worker serves, and one job
         * in each of 70 more queues, of which 63 at most get series of
         * their own beside idle's and default's; the rest count as
         * "other" */
        kt_pg_exec(
            dsn,
            "INSERT INTO jobs (job_id, spec, prompt, queue, run_after)"
            " SELECT 'idle-' || g, '{}'::jsonb, 'p', 'idle', now() +"
            " CASE WHEN g = 3 THEN interval '1 hour' ELSE '0' END"
            " FROM generate_series(1, 3) g UNION ALL"
            " SELECT 'many-' || g, '{}'::jsonb, 'p', 'q' || lpad(g::text, 2,"
            " '0'), now() FROM generate_series(0, 69) g",
            NULL);
        ck_assert_msg(metric_until(port, &body,
                                   "coderq_queue_jobs{queue=\"idle\","
                                   "state=\"queued\"}",
                                   2, 30000) == 2,
                      "%s", body);
        ck_assert(sample(body, "coderq_queue_jobs{queue=\"idle\",state="
                               "\"waiting\"}") == 1);
        ck_assert(sample(body, "coderq_queue_jobs{queue=\"idle\",state="
                               "\"running\"}") == 0);
        ck_assert(queue_jobs(body, "queued", &nqueues) == 72);
        ck_assert(queue_jobs(body, "waiting", &nqueues) == 1);
        ck_assert(queue_jobs(body, "running", &nqueues) == 0);
        ck_assert_msg(nqueues == 65, "%d queues have series", nqueues);
        ck_assert(sample(body, "coderq_queue_jobs{queue=\"other\",state="
                               "\"queued\"}") >= 7);
        ck_assert(sample(body, "coderq_queue_jobs{queue=\"q00\",state="
                               "\"queued\"}") == 1);
        ck_assert(sample(body, "coderq_queue_jobs{queue=\"q69\",state="
                               "\"queued\"}") == -1);

        if (access("/usr/bin/promtool", X_OK) != 0 ||
            access("/usr/bin/prometheus", X_OK) != 0) {
                free(body);
                CQ_CHECK_SKIP("prometheus",
                              "/usr/bin/promtool or /usr/bin/prometheus is "
                              "absent (Debian's prometheus package)");
        }
        /* Prometheus's own linter */
        snprintf(path, sizeof(path), "%s/metrics.txt", logdir);
        fp = fopen(path, "w");
        ck_assert_ptr_nonnull(fp);
        fputs(body, fp);
        fclose(fp);
        free(body);
        snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < %s 2>&1",
                 path);
        ck_assert_int_eq(cq_check_proc_run(sh, NULL, 60000, &proc), 0);
        ck_assert_msg(proc.status == 0, "promtool: %s", proc.out);
        cq_check_proc_release(&proc);

        /* a real Prometheus scrapes it every second */
        pport = free_port();
        snprintf(path, sizeof(path), "%s/prometheus.yml", logdir);
        fp = fopen(path, "w");
        ck_assert_ptr_nonnull(fp);
        fprintf(fp,
                "global:\n  scrape_interval: 1s\n"
                "scrape_configs:\n  - job_name: coderq\n"
                "    static_configs:\n      - targets: ['127.0.0.1:%d']\n",
                port);
        fclose(fp);
        prom = fork();
        ck_assert_int_ge(prom, 0);
        if (prom == 0) {
                char conf[640], tsdb[600], listen[64], log[600];

                snprintf(conf, sizeof(conf), "--config.file=%s", path);
                snprintf(tsdb, sizeof(tsdb), "--storage.tsdb.path=%s/tsdb",
                         logdir);
                snprintf(listen, sizeof(listen),
                         "--web.listen-address=127.0.0.1:%d", pport);
                snprintf(log, sizeof(log), "%s/prometheus.log", logdir);
                child_output_to(log);
                execl("/usr/bin/prometheus", "prometheus", conf, tsdb, listen,
                      (char *)NULL);
                _exit(127);
        }
        if (nstarted < CQ_ARRAY_SIZE(started))
                started[nstarted++] = prom;
        for (waited = 0; waited < 90000; waited += 500) {
                v = prom_query(pport, "coderq_jobs_finished_total");
                if (v == jobs)
                        break;
                kt_sleep_ms(500);
        }
        ck_assert_msg(v == jobs,
                      "Prometheus reports %g jobs finished, not %d (its log: "
                      "%s/prometheus.log)",
                      v, jobs, logdir);
        ck_assert(prom_query(pport, "coderq_jobs_claimed_total") == jobs);
        kill(prom, SIGTERM);
        waitpid(prom, NULL, 0);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
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
        wait_sql("SELECT count(DISTINCT job_id) FROM job_messages WHERE "
                 "message->>'role' = 'assistant'",
                 NULL, 2, 60000, "two jobs with a turn done");
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
        /* a cell and the tool message answering it are one checkpoint:
         * a kill leaves no cell without its message (the resumed job ran
         * such a cell again, under a seq of its own) */
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM cells", NULL),
                         kt_pg_long(dsn,
                                    "SELECT count(*) FROM job_messages "
                                    "WHERE role = 'tool'",
                                    NULL));
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM cells", NULL),
                         12);
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
        /* at most one duplicate for the one killed worker */
        ck_assert_int_le(all_events(120000), 4 + 1);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
}
END_TEST

/* One job running, its conversation past the task (a turn done). */
static bool running_past_its_first_turn(void *arg)
{
        (void)arg;
        return count_status("running") == 1 &&
               kt_pg_long(dsn, "SELECT count(*) FROM job_messages", NULL) > 2;
}

START_TEST(sigterm_releases_jobs_to_another_worker)
{
        worker_t a, b;
        rd_kafka_t *rk;
        int rc;
        int64_t t0;

        fresh("term");
        register_script("slow", slow_steps);
        start_worker(&a, "wt1", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "slow", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        ck_assert_msg(
            cq_check_wait_until(running_past_its_first_turn, NULL, 60000),
            "the job never ran past its first turn");
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
        /* its tool call is checkpointed before the cell runs: from then
         * on the job is inside its time.sleep(60) */
        wait_sql("SELECT count(*) FROM job_messages WHERE job_id = $1 AND "
                 "message->>'role' = 'assistant'",
                 id, 1, 60000, "the sleepy job's tool call");
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

/* A 1x1 PNG: the figure figures_keep_their_names shows and saves. */
#define PNG_B64                                                                \
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwAD" \
        "hgGAWjR9awAAAABJRU5ErkJggg=="

/* Register as \p name a script of \p nturns placeholder replies (the
 * turns of a parent's history, which the fake counts), then a tool call
 * with each of \p codes, then a final answer. */
static void register_cells(const char *name,
                           int nturns,
                           const char *const *codes,
                           size_t ncodes)
{
        json_t *script = json_array();
        char *text;
        size_t i;
        int k;

        for (k = 0; k < nturns; k++)
                json_array_append_new(
                    script, json_pack("{s:s}", "content", "(parent's turn)"));
        for (i = 0; i < ncodes; i++)
                json_array_append_new(
                    script,
                    json_pack("{s:[{s:s}]}", "tool_calls", "code", codes[i]));
        json_array_append_new(script, json_pack("{s:s}", "content", "done"));
        text = json_dumps(script, 0);
        register_script(name, text);
        free(text);
        json_decref(script);
}

/* The names of job \p n's images with their cells, "name:cell" by cell
 * then name, "-" for no known cell; caller frees. */
static char *image_names_of(int n)
{
        char id[192];

        snprintf(id, sizeof(id), "%s-%03d", prefix, n);
        return kt_pg_text(dsn,
                          "SELECT COALESCE(string_agg(n.name || ':' ||"
                          " COALESCE(n.cell_seq::text, '-'), ' '"
                          " ORDER BY n.cell_seq NULLS LAST, n.name), '')"
                          " FROM images i JOIN image_names n USING (image_id)"
                          " WHERE i.job_id = $1",
                          id);
}

/* The model saves a figure and shows it: both names are kept, with the
 * cell that made them, the bytes once. A session's child leaves its
 * parent's files to the parent and stores only what it made itself. */
START_TEST(figures_keep_their_names)
{
        static const char *const parent[] = {
            "import base64, os\n"
            "from IPython.display import Image, display\n"
            "PNG = base64.b64decode('" PNG_B64 "')\n"
            "x = 1",
            "display(Image(data=PNG))\n"
            "open('revenue_by_region.png', 'wb').write(PNG)\n"
            "os.makedirs('plots', exist_ok=True)\n"
            "open('plots/costs.png', 'wb').write(b'costs')",
        };
        static const char *const child[] = {
            "open('margin.png', 'wb').write(b'margin')",
        };
        worker_t a;
        rd_kafka_t *rk;
        char extra[192], *names;

        fresh("figures");
        register_cells("fig_parent", 0, parent, CQ_ARRAY_SIZE(parent));
        register_cells("fig_child", 3, child, CQ_ARRAY_SIZE(child));
        start_worker(&a, "wf", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "fig_parent", NULL);
        snprintf(extra, sizeof(extra), "\"parent_job_id\":\"%s-000\"", prefix);
        submit(rk, 1, "fig_child", extra);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished(2, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 2);
        names = image_names_of(0);
        ck_assert_str_eq(names, "cell2-1.png:2 plots/costs.png:2 "
                                "revenue_by_region.png:2");
        free(names);
        snprintf(extra, sizeof(extra), "%s-000", prefix);
        ck_assert_int_eq(
            kt_pg_long(dsn, "SELECT count(*) FROM images WHERE job_id = $1",
                       extra),
            2);
        /* the child's own file, after its first cell; not the parent's */
        names = image_names_of(1);
        ck_assert_str_eq(names, "margin.png:1");
        free(names);
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
        int i;

        fresh("wake");
        register_script("two_cells", two_cells);
        child_poll_ms = "60000";
        child_relay_ms = "60000";
        start_worker(&a, "ww", "30");
        child_poll_ms = "100";
        child_relay_ms = "200";
        /* past its first claims: slots now wait for announcements */
        ck_assert_msg(cq_check_wait_until(listening, NULL, 30000),
                      "the worker never listened for jobs");
        rk = kt_producer(brokers);
        for (i = 0; i < 3; i++)
                submit(rk, i, "two_cells", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        /* well before the first poll, 60 s after the start */
        wait_finished(3, 35000);
        ck_assert_int_eq(count_status("succeeded"), 3);
        (void)cq_check_wait_until(outbox_sent, NULL, 10000);
        unsent = kt_pg_long(
            dsn, "SELECT count(*) FROM outbox WHERE sent_at IS NULL", NULL);
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
        ck_assert_msg(cq_check_wait_until(listening, NULL, 30000),
                      "the worker never listened for jobs");
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
        /* Not a synchronisation: a second of idling, whose polls the
         * bound below counts. */
        kt_sleep_ms(1000);
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
        worker_t a, b;
        rd_kafka_t *rk;
        int i;

        fresh("outage");
        register_script("two_cells", two_cells);
        start_worker(&a, "wo", "30");
        start_worker(&b, "wo2", "30");
        rk = kt_producer(brokers);
        for (i = 0; i < 6; i++)
                submit(rk, i, "two_cells", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_sql("SELECT count(*) FROM jobs", NULL, 6, 60000,
                 "the intake took the six jobs");
        kt_services("stop-kafka");
        /* The subject, not a synchronisation: a 20 s broker outage, longer
         * than the relay's and the producer's timeouts. */
        kt_sleep_ms(20000);
        kt_services("start-kafka");
        kt_services("restart-pg");
        wait_finished(6, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 6);
        ck_assert_uint_eq(completion_events(6, 90000), 6);
        /* two relays through the outage: still one event per job */
        ck_assert_int_eq(all_events(90000), 6);
        ck_assert_msg(worker_alive(&a), "the worker died in the outage");
        ck_assert_msg(worker_alive(&b), "the worker died in the outage");
        /* After an outage the consumers may be rejoining their group, and
         * the final commit and close wait for it: the bound is the sum of
         * the worker's own (CODERQ_SHUTDOWN_S 20 s, the final commit's
         * 15 s, the relay's and producer's 10 s flushes), not the 30 s of
         * an idle worker's stop. Both stop at once, so neither waits on
         * the other to rejoin. */
        kill(a.pid, SIGTERM);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 60000), 0);
        ck_assert_int_eq(stop_worker(&a, 0, 60000), 0); /* signalled above */
}
END_TEST

/* A cell printing a NUL byte: the job succeeds with the exact bytes in
 * its stored cell, its stored notebook and the exported notebook. A cell
 * the store refuses for good (here a CHECK constraint the test adds)
 * fails its job with the reason, once, instead of going back to the
 * queue again and again. */
static const char nul_cell[] =
    "[{\"tool_calls\":[{\"code\":\"print('a\\\\x00b')\"}]},"
    "{\"content\":\"done\"}]";
static const char refused_cell[] =
    "[{\"tool_calls\":[{\"code\":\"print('refuse-me')\"}]},"
    "{\"content\":\"done\"}]";

/* The text of the first stream output of \p outputs, with its length. */
static const char *stream_text(const json_t *outputs, size_t *lenp)
{
        size_t i;
        const json_t *out;

        json_array_foreach(outputs, i, out)
        {
                const char *type =
                    json_string_value(json_object_get(out, "output_type"));
                const json_t *text = json_object_get(out, "text");

                if (type && strcmp(type, "stream") == 0 && json_is_array(text))
                        text = json_array_get(text, 0); /* nbformat lines */
                if (type && strcmp(type, "stream") == 0 &&
                    json_is_string(text)) {
                        *lenp = json_string_length(text);
                        return json_string_value(text);
                }
        }
        *lenp = 0;
        return NULL;
}

START_TEST(nul_output_kept_and_refused_checkpoint_fails_job)
{
        worker_t a;
        rd_kafka_t *rk;
        cq_store_opts_t opts;
        cq_store_t *store;
        cq_checkpoint_t cp;
        cq_export_t exp;
        cq_nb_t *nb;
        const json_t *cells, *cell;
        char errstr[512], nul_id[192], refused_id[192], *text;
        const char *got;
        size_t len, i;
        bool found = false, seen = false;

        fresh("nul");
        register_script("nul_cell", nul_cell);
        register_script("refused_cell", refused_cell);
        kt_pg_exec(dsn,
                   "ALTER TABLE cells ADD CONSTRAINT test_refuse_me CHECK "
                   "(code NOT LIKE '%refuse-me%') NOT VALID",
                   NULL);
        start_worker(&a, "wn", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "nul_cell", NULL);
        submit(rk, 1, "refused_cell", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        snprintf(nul_id, sizeof(nul_id), "%s-000", prefix);
        snprintf(refused_id, sizeof(refused_id), "%s-001", prefix);
        wait_finished(2, WAIT_MS);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        kt_pg_exec(dsn, "ALTER TABLE cells DROP CONSTRAINT test_refuse_me",
                   NULL);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id = "
                                    "$1 AND status = 'succeeded' AND "
                                    "attempts = 1",
                                    nul_id),
                         1);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE job_id = "
                                    "$1 AND status = 'failed' AND attempts = 1"
                                    " AND reason LIKE 'could not checkpoint a "
                                    "cell: %test_refuse_me%'",
                                    refused_id),
                         1);
        /* jsonb stays queryable: the NUL is stored escaped */
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM cells WHERE job_id = "
                                    "$1 AND outputs->0->>'text' = U&'a\\FFFF0b"
                                    "\\000a'",
                                    nul_id),
                         1);

        cq_store_opts_init(&opts);
        opts.dsn = dsn;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        /* the stored cell and the stored notebook */
        cq_checkpoint_init(&cp);
        ck_assert_int_eq(cq_store_load_checkpoint(store, nul_id, &cp), CQ_OK);
        ck_assert_uint_eq(json_array_size(cp.cells), 1);
        got = stream_text(
            json_object_get(json_array_get(cp.cells, 0), "outputs"), &len);
        ck_assert_ptr_nonnull(got);
        ck_assert_uint_eq(len, 4);
        ck_assert_mem_eq(got, "a\0b\n", 4);
        ck_assert_int_eq(cp.last_cell_seq, 1);
        cells = json_object_get(cp.notebook, "cells");
        json_array_foreach(cells, i, cell)
        {
                got = stream_text(json_object_get(cell, "outputs"), &len);
                if (got && len == 4 && memcmp(got, "a\0b\n", 4) == 0)
                        seen = true;
        }
        ck_assert_msg(seen, "the stored notebook lacks the cell's output");
        cq_checkpoint_release(&cp);
        /* the exported notebook.ipynb (what coderq export writes) */
        cq_export_init(&exp);
        ck_assert_int_eq(cq_store_export(store, nul_id, &exp, &found), CQ_OK);
        ck_assert(found);
        nb = cq_nb_from_json(exp.notebook, errstr, sizeof(errstr));
        ck_assert_msg(nb != NULL, "%s", errstr);
        text = cq_nb_dumps(nb, &len);
        ck_assert_ptr_nonnull(text);
        ck_assert_msg(strstr(text, "\"a\\u0000b\\n\"") != NULL,
                      "exported notebook lacks the NUL: %s", text);
        free(text);
        cq_nb_destroy(&nb);
        cq_export_release(&exp);
        cq_store_destroy(&store);
}
END_TEST

/* ---------------------------------------------- memory and test rules */

static const char sq_tests[] =
    "\"tests\":{\"kind\":\"cases\",\"function\":\"sq\",\"cases\":["
    "{\"args\":[3],\"expected\":9},{\"args\":[-2],\"expected\":4}]}";

static const char sq_steps[] =
    "[{\"tool_calls\":[{\"code\":\"def sq(x):\\n    return x * x\"}]},"
    "{\"content\":\"sq is defined.\"}]";

/* Job id \p n of this test. */
static void job_id(int n, char *out, size_t size)
{
        snprintf(out, size, "%s-%03d", prefix, n);
}

/* Submit job \p n and wait until \p total jobs finished. */
static void submit_wait(
    rd_kafka_t *rk, int n, const char *script, const char *extra, long total)
{
        submit(rk, n, script, extra);
        rd_kafka_flush(rk, 10000);
        wait_finished(total, WAIT_MS);
}

/* A long from SQL about job \p n (the job id is the parameter). */
static long job_long(int n, const char *sql)
{
        char id[192];

        job_id(n, id, sizeof(id));
        return kt_pg_long(dsn, sql, id);
}

/* Whether job \p n succeeded from the memory of job \p from, as the
 * results table, the job_overview view and run_summary say. */
static bool from_memory_of(int n, int from)
{
        char sql[512], src[192];

        job_id(from, src, sizeof(src));
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM job_overview o JOIN results r USING "
                 "(job_id) WHERE o.job_id = $1 AND o.status = 'succeeded' "
                 "AND o.from_memory AND r.from_memory AND o.turns = 0 AND "
                 "o.memory_source_job = '%s'",
                 src);
        return job_long(n, sql) == 1;
}

static long llm_calls_of(const char *script)
{
        json_t *all = cq_fake_llm_requests(fake), *req;
        size_t i;
        long n = 0;

        json_array_foreach(all, i, req)
        {
                const char *name =
                    json_string_value(json_object_get(req, "script"));

                if (name && strcmp(name, script) == 0)
                        n++;
        }
        json_decref(all);
        return n;
}

/* The completion event of job \p id, read from the results topic. */
static json_t *completion_event_of(const char *id)
{
        char topic[256];
        json_t *event = NULL;
        int waited;

        snprintf(topic, sizeof(topic), "%s.results", prefix);
        for (waited = 0; waited < 60000 && !event; waited += 2000) {
                kt_msg_t *msgs = NULL;
                size_t got, i;

                got = kt_consume(brokers, topic, 1, 64, 2000, &msgs);
                for (i = 0; i < got && !event; i++)
                        if (msgs[i].key && strcmp(msgs[i].key, id) == 0)
                                event = json_loads(msgs[i].value, 0, NULL);
                kt_msgs_free(msgs, got);
        }
        ck_assert_msg(event != NULL, "no completion event for %s", id);
        return event;
}

/* The completion event of job \p n. */
static json_t *completion_event(int n)
{
        char id[192];

        job_id(n, id, sizeof(id));
        return completion_event_of(id);
}

START_TEST(memory_only_inside_a_named_scope_and_model)
{
        worker_t w;
        rd_kafka_t *rk;
        char extra[1024], src[192];
        json_t *event;
        int n = 0;

        fresh("memscope");
        register_script("mem-a", sq_steps);
        register_script("mem-b", sq_steps);
        rk = kt_producer(brokers);
        child_slots = "1";
        start_worker(&w, "m1", "30");

        /* No scope: the second job of the same task gets no memory. */
        snprintf(extra, sizeof(extra), "%s", sq_tests);
        submit_wait(rk, ++n, "mem-a", extra, 1);
        submit_wait(rk, ++n, "mem-a", extra, 2);
        ck_assert_int_eq(count_status("succeeded"), 2);
        ck_assert_int_eq(
            job_long(2, "SELECT count(*) FROM job_overview WHERE job_id = $1 "
                        "AND NOT from_memory AND memory_source_job IS NULL "
                        "AND turns = 2"),
            1);
        ck_assert_int_eq(
            kt_pg_long(dsn, "SELECT count(*) FROM solutions", NULL), 0);
        ck_assert_int_eq(llm_calls_of("mem-a"), 4);

        /* A scope, same model: recalled and finished with no LLM call. */
        snprintf(extra, sizeof(extra), "%s,\"memory\":{\"scope\":\"team\"}",
                 sq_tests);
        submit_wait(rk, ++n, "mem-a", extra, 3);
        ck_assert_int_eq(
            kt_pg_long(dsn,
                       "SELECT count(*) FROM solutions WHERE scope = 'team' "
                       "AND model = 'script:mem-a'",
                       NULL),
            1);
        submit_wait(rk, ++n, "mem-a", extra, 4);
        ck_assert_msg(from_memory_of(4, 3), "job 4 not from the memory of 3");
        ck_assert_int_eq(llm_calls_of("mem-a"), 6);
        event = completion_event(4);
        job_id(3, src, sizeof(src));
        ck_assert(json_is_true(json_object_get(event, "from_memory")));
        ck_assert_str_eq(
            json_string_value(json_object_get(event, "memory_source_job")),
            src);
        json_decref(event);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT from_memory FROM run_summary "
                                    "WHERE run_id = $1",
                                    prefix),
                         1);

        /* Another model in the scope: no recall and no hint ... */
        submit_wait(rk, ++n, "mem-b", extra, 5);
        ck_assert_int_eq(
            job_long(5, "SELECT count(*) FROM job_overview WHERE job_id = $1 "
                        "AND status = 'succeeded' AND NOT from_memory AND "
                        "memory_source_job IS NULL AND turns = 2"),
            1);
        ck_assert_int_eq(
            job_long(5, "SELECT count(*) FROM job_messages WHERE job_id = $1 "
                        "AND message->>'content' LIKE '%episodic memory%'"),
            0);
        /* ... unless the job allows cross-model recall. */
        snprintf(extra, sizeof(extra),
                 "%s,\"memory\":{\"scope\":\"team\",\"cross_model\":true}",
                 sq_tests);
        submit_wait(rk, ++n, "mem-b", extra, 6);
        ck_assert_int_eq(job_long(6, "SELECT count(*) FROM job_overview "
                                     "WHERE job_id = $1 AND from_memory"),
                         1);
        ck_assert_int_eq(llm_calls_of("mem-b"), 2);
        /* Another scope sees none of it. */
        snprintf(extra, sizeof(extra), "%s,\"memory\":{\"scope\":\"other\"}",
                 sq_tests);
        submit_wait(rk, ++n, "mem-a", extra, 7);
        ck_assert_int_eq(job_long(7, "SELECT count(*) FROM job_overview "
                                     "WHERE job_id = $1 AND NOT from_memory "
                                     "AND memory_source_job IS NULL"),
                         1);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
        child_slots = "2";
        kt_producer_destroy(rk);
}
END_TEST

START_TEST(fresh_tests_and_test_deadlines)
{
        worker_t w;
        rd_kafka_t *rk;
        char extra[1024];

        fresh("testrules");
        /* sq needs k, which only a failed cell set: in the job's kernel
         * the tests pass, in a fresh interpreter they cannot. */
        register_script(
            "state-outside",
            "[{\"tool_calls\":[{\"code\":\"k = 3\\nraise RuntimeError("
            "'later')\"}]},"
            "{\"tool_calls\":[{\"code\":\"y = k\\ndef sq(x):\\n"
            "    return x * x\"}]},"
            "{\"content\":\"sq is defined.\"}]");
        register_script("hangs", "[{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                                 "    while True:\\n        pass\"}]},"
                                 "{\"content\":\"sq is defined.\"}]");
        rk = kt_producer(brokers);
        start_worker(&w, "t1", "30");
        snprintf(extra, sizeof(extra),
                 "%.*s,\"isolation\":\"fresh\"},\"limits\":{\"max_retries\":1}",
                 (int)strlen(sq_tests) - 1, sq_tests);
        submit(rk, 1, "state-outside", extra);
        snprintf(extra, sizeof(extra), "%.*s},\"limits\":{\"max_retries\":1}",
                 (int)strlen(sq_tests) - 1, sq_tests);
        submit(rk, 2, "state-outside", extra);
        snprintf(extra, sizeof(extra),
                 "%s,\"limits\":{\"test_timeout_s\":2,\"max_retries\":0}",
                 sq_tests);
        submit(rk, 3, "hangs", extra);
        rd_kafka_flush(rk, 10000);
        wait_finished(3, WAIT_MS);

        ck_assert_int_eq(
            job_long(1, "SELECT count(*) FROM jobs j JOIN results r USING "
                        "(job_id) WHERE j.job_id = $1 AND j.status = "
                        "'failed' AND j.reason LIKE '%in a fresh interpreter, "
                        "cell 1 of the solution''s 1 failed (NameError: name "
                        "''k'' is not defined)%' AND "
                        "r.report->'tests'->>'isolation' = 'fresh'"),
            1);
        ck_assert_int_eq(
            job_long(2, "SELECT count(*) FROM jobs j JOIN results r USING "
                        "(job_id) WHERE j.job_id = $1 AND j.status = "
                        "'succeeded' AND r.report->'tests'->>'isolation' = "
                        "'kernel'"),
            1);
        ck_assert_int_eq(
            job_long(3, "SELECT count(*) FROM jobs WHERE job_id = $1 AND "
                        "status = 'failed' AND reason LIKE '%the tests did "
                        "not finish within 2 s (limits.test_timeout_s)%'"),
            1);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
        kt_producer_destroy(rk);
}
END_TEST

/* The first value of \p sql with one parameter; caller frees; NULL for no
 * row or NULL. */
static char *pg_text(const char *sql, const char *param)
{
        PGconn *conn = cq_pgtest_connect(dsn);
        PGresult *res =
            PQexecParams(conn, sql, param ? 1 : 0, NULL, &param, NULL, NULL, 0);
        char *out = NULL;

        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s: %s", sql,
                      PQerrorMessage(conn));
        if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
                out = strdup(PQgetvalue(res, 0, 0));
        PQclear(res);
        PQfinish(conn);
        return out;
}

/* The job \p n of this test: "<column>|<column>|..." of \p cols (SQL). */
static char *job_row(int n, const char *cols)
{
        char sql[1024], id[192];
        char *out;

        snprintf(id, sizeof(id), "%s-%03d", prefix, n);
        snprintf(sql, sizeof(sql),
                 "SELECT concat_ws('|', %s) FROM jobs"
                 " WHERE job_id = $1",
                 cols);
        out = pg_text(sql, id);
        ck_assert_msg(out != NULL, "no job %s", id);
        return out;
}

/* Waits until \p n jobs finished, or fails the test with the state of
 * the queue after \p ms. */
static void wait_finished_or_dump(long n, int ms)
{
        char *state;

        if (cq_check_wait_until(finished_n, &n, ms))
                return;
        state = pg_text("SELECT string_agg(job_id || ' ' || status ||"
                        " ' attempts ' || attempts, '; ') FROM jobs",
                        NULL);
        ck_abort_msg("only %ld of %ld jobs finished in %d ms; %s", finished(),
                     n, ms, state ? state : "no jobs");
}

/* A job that can never get an interpreter (e2b without a key) fails at
 * once with the reason instead of being claimed again forever; a child
 * whose parent never comes fails after CODERQ_PARENT_WAIT_S. */
START_TEST(jobs_that_cannot_run_fail_with_a_reason)
{
        static const char *const extra[] = {
            "CODERQ_PARENT_WAIT_S=1", "CODERQ_REQUEUE_DELAY_MS=100", NULL};
        worker_t a;
        rd_kafka_t *rk;
        char parent[256];
        char *row;
        long long claims;

        fresh("norun");
        register_script("quick", "[{\"content\":\"ok\"}]");
        child_slots = "1";
        child_extra = extra;
        start_worker(&a, "wn", "30");
        child_slots = "2";
        rk = kt_producer(brokers);
        submit(rk, 0, "quick", "\"backend\":\"e2b\"");
        snprintf(parent, sizeof(parent), "\"parent_job_id\":\"%s-ghost\"",
                 prefix);
        submit(rk, 1, "quick", parent);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(2, 60000);
        /* no model code ran: a fault of ours, out of the scores */
        row = job_row(0, "status, attempts, verdict, reason");
        ck_assert_str_eq(row, "failed|1|infra_error|could not get an "
                              "interpreter: backend \"e2b\": E2B_API_KEY "
                              "is not set");
        free(row);
        row = job_row(1, "status, attempts, verdict, reason");
        ck_assert_msg(strncmp(row, "failed|0|infra_error|parent job ", 32) ==
                              0 &&
                          strstr(row, "-ghost does not exist after 1 s"),
                      "%s", row);
        free(row);
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM outbox", NULL),
                         2);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        /* one claim, not thousands */
        claims = log_sum(&a, "worker stopped", "claims");
        ck_assert_msg(claims >= 1 && claims <= 3, "%lld claims", claims);
}
END_TEST

/* A kernel pool that cannot start kernels may recover: the job is tried
 * again after a growing wait, each try an attempt, and fails at the last
 * one naming the error. */
START_TEST(interpreter_failures_back_off_then_fail)
{
        static const char *const extra[] = {
            "CODERQ_PYTHON=/nonexistent/python3", "CODERQ_MAX_ATTEMPTS=3",
            "CODERQ_REQUEUE_DELAY_MS=200", "CODERQ_KPOOL_SIZE=1", NULL};
        worker_t a;
        rd_kafka_t *rk;
        char *row;
        long long claims, attempts, waits;

        fresh("backoff");
        register_script("quick", "[{\"content\":\"ok\"}]");
        child_slots = "1";
        child_extra = extra;
        start_worker(&a, "wb", "30");
        child_slots = "2";
        rk = kt_producer(brokers);
        submit(rk, 0, "quick", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(1, 120000);
        row = job_row(0, "status, attempts, max_attempts");
        ck_assert_str_eq(row, "failed|3|3");
        free(row);
        row = job_row(0, "reason");
        ck_assert_msg(strstr(row, "gave up after 3 attempts: could not get "
                                  "an interpreter: ") == row,
                      "%s", row);
        ck_assert_msg(strstr(row, "kernel"), "%s", row);
        free(row);
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        claims = log_sum(&a, "worker stopped", "claims");
        ck_assert_int_eq(claims, 3);
        /* put back twice (attempts 1 and 2), waiting 100-200 ms, then
         * 200-400 ms (the doubled delay, jittered over its upper half) */
        attempts = log_sum(&a, "job put back for later", "attempt");
        ck_assert_int_eq(attempts, 1 + 2);
        waits = log_sum(&a, "job put back for later", "retry_in_ms");
        ck_assert_msg(waits >= 300 && waits <= 600, "%lld ms", waits);
}
END_TEST

/* max_retries holds over the whole job: a job stopped after two failed
 * cells and resumed elsewhere fails at its third. */
START_TEST(resumed_job_keeps_its_retry_count)
{
        static const char steps[] =
            "[{\"tool_calls\":[{\"code\":\"1/0\"}]},"
            "{\"tool_calls\":[{\"code\":\"[][1]\"}]},"
            "{\"delay_ms\":3000,\"tool_calls\":[{\"code\":\"{}['x']\"}]},"
            "{\"content\":\"done\"}]";
        worker_t a, b;
        rd_kafka_t *rk;
        char *row;

        fresh("retries");
        register_script("fails", steps);
        child_slots = "1";
        start_worker(&a, "wr1", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "fails", "\"limits\":{\"max_retries\":2}");
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_sql("SELECT count(*) FROM cells WHERE status = 'error'", NULL, 2,
                 60000, "two failed cells");
        /* the third reply is 3 s away: stop while it is awaited */
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 30000), 0);
        start_worker(&b, "wr2", "30");
        child_slots = "2";
        wait_finished_or_dump(1, 60000);
        row = job_row(0, "status, retries");
        ck_assert_str_eq(row, "failed|3");
        free(row);
        row = job_row(0, "reason");
        ck_assert_msg(strstr(row, "retry limit reached: 3 failed cells or "
                                  "test runs (max_retries 2)") &&
                          strstr(row, "KeyError"),
                      "%s", row);
        free(row);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
}
END_TEST

/* job_timeout_s holds over the whole job: the running time of an attempt
 * stopped half-way counts when the job resumes. The first attempt runs a
 * cell, then awaits a 20 s reply, during which the worker is told to
 * stop; the job's limit (15 s) ends that call, and the stopping worker
 * gives the job back with its 15 s counted, so the resumed job fails at
 * once, where a fresh budget would let it finish in a few seconds. */
START_TEST(resumed_job_keeps_its_running_time)
{
        static const char steps[] =
            "[{\"tool_calls\":[{\"code\":\"x = 1\"}]},"
            "{\"delay_ms\":20000,\"tool_calls\":[{\"code\":\"y = x\"}]},"
            "{\"content\":\"done\"}]";
        static const char *const extra[] = {"CODERQ_SHUTDOWN_S=60", NULL};
        worker_t a, b;
        rd_kafka_t *rk;
        char *row;

        fresh("runtime");
        register_script("slow", steps);
        child_slots = "1";
        child_extra = extra;
        start_worker(&a, "wt1", "30");
        child_extra = NULL;
        rk = kt_producer(brokers);
        submit(rk, 0, "slow", "\"limits\":{\"job_timeout_s\":15}");
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_sql("SELECT count(*) FROM cells", NULL, 1, 60000, "a cell");
        /* the second reply is 20 s away: stop while it is awaited (the
         * job's limit ends the call, then the worker gives the job back) */
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 90000), 0);
        row = job_row(0, "status, attempts, reason");
        ck_assert_str_eq(row, "queued|0"); /* no reason */
        free(row);
        ck_assert_int_ge(kt_pg_long(dsn, "SELECT run_ms FROM jobs", NULL),
                         15000);
        start_worker(&b, "wt2", "30");
        child_slots = "2";
        wait_finished_or_dump(1, 60000);
        row = job_row(0, "status, reason");
        ck_assert_msg(
            strncmp(row, "failed|job time limit reached (15 s ", 36) == 0, "%s",
            row);
        free(row);
        /* it stopped before running the second call's cell */
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM cells", NULL),
                         1);
        ck_assert_int_eq(stop_worker(&b, SIGTERM, 30000), 0);
}
END_TEST

/* ------------------------------------------------------- evaluation runs */

/* A script whose first two calls report 1000 input and 500 output tokens
 * and whose final answer reports 1000 and 100: at $1 and $10 per million
 * (the prices file below) they cost $0.006, $0.006 and $0.002. */
static const char costly_steps[] =
    "[{\"tool_calls\":[{\"code\":\"x = 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"tool_calls\":[{\"code\":\"y = x + 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"content\":\"done\","
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":100}}]";

/* The settings of a worker with prices and replies of at most 1000
 * tokens: the most a call may cost is then its prompt estimate at $1 per
 * million plus $0.01. */
static const char *const *priced_worker(void)
{
        static char prices_env[600];
        static const char *extra[4];
        static const char doc[] =
            "{\"models\":{\"script:*\":{\"input\":1,\"output\":10}}}";
        char path[512];

        snprintf(path, sizeof(path), "%s/prices.json", logdir);
        cq_check_spit(path, doc, strlen(doc));
        snprintf(prices_env, sizeof(prices_env), "CODERQ_PRICES_FILE=%s", path);
        extra[0] = prices_env;
        extra[1] = "CODERQ_LLM_MAX_TOKENS=1000";
        extra[2] = NULL;
        return extra;
}

/* The request bodies the fake LLM got from script \p script. */
static json_t *bodies_of(const char *script)
{
        json_t *all = cq_fake_llm_requests(fake), *req, *out = json_array();
        size_t i;

        json_array_foreach(all, i, req)
        {
                const char *name =
                    json_string_value(json_object_get(req, "script"));

                if (name && strcmp(name, script) == 0)
                        json_array_append(out, json_object_get(req, "body"));
        }
        json_decref(all);
        return out;
}

static double job_cost(int n)
{
        char *text = job_row(n, "cost_usd");
        double v = strtod(text, NULL);

        ck_assert_msg(text[0] != '\0', "job %d has no cost", n);
        free(text);
        return v;
}

/* `coderq ARGS...` against this test's database and topics. */
static void run_cli(const char *const *args, cq_check_proc_t *proc)
{
        char env_dsn[2300], env_brokers[300], env_topic[300];
        const char *env[8];

        snprintf(env_dsn, sizeof(env_dsn), "CODERQ_PG_DSN=%s", dsn);
        snprintf(env_brokers, sizeof(env_brokers), "CODERQ_KAFKA_BROKERS=%s",
                 brokers);
        snprintf(env_topic, sizeof(env_topic), "CODERQ_TOPIC_JOBS=%s.jobs",
                 prefix);
        env[0] = env_dsn;
        env[1] = env_brokers;
        env[2] = env_topic;
        env[3] = "CODERQ_LOG_LEVEL=error";
        env[4] = "CODERQ_PRICES_FILE";
        env[5] = NULL;

        ck_assert_int_eq(cq_check_coderq(args, env, 240000, proc), 0);
}

/* Each job's own limits: the job fails with reason code budget before
 * the call that could cross max_cost_usd or max_tokens_total (the fake
 * LLM never gets it), its figures are those of the calls it made, and
 * the sampling parameters a job names reach the LLM in every request and
 * are recorded with what else the run used. */
START_TEST(job_budgets_stop_before_the_crossing_call)
{
        worker_t w;
        rd_kafka_t *rk;
        json_t *bodies, *body, *event, *status;
        cq_check_proc_t proc;
        char *row, id[192], hex[65];
        const char *status_args[] = {"status", id, "--json", NULL};
        size_t i;

        fresh("jobbudget");
        register_script("cost-a", costly_steps);
        register_script("cost-b", costly_steps);
        register_script("cost-c", costly_steps);
        child_slots = "1";
        child_extra = priced_worker();
        start_worker(&w, "wb", "30");
        rk = kt_producer(brokers);
        /* before call 1: about $0.011 of $0.013; before call 2: $0.006
         * spent and $0.011 more would cross it */
        submit(rk, 0, "cost-a",
               "\"temperature\":0.3,\"top_p\":0.9,\"seed\":42,"
               "\"limits\":{\"max_cost_usd\":0.013}");
        /* before call 2: 1500 used, about 800 in and up to 1000 out */
        submit(rk, 1, "cost-b", "\"limits\":{\"max_tokens_total\":3000}");
        submit(rk, 2, "cost-c", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(3, WAIT_MS);

        row = job_row(0, "status, reason_code, prompt_tokens, "
                         "completion_tokens, turns");
        ck_assert_str_eq(row, "failed|budget|1000|500|1");
        free(row);
        row = job_row(0, "reason");
        ck_assert_msg(strstr(row, "cost budget: the next LLM call could cost "
                                  "up to $0.01") == row &&
                          strstr(row, "limits.max_cost_usd $0.013 ($0.006000 "
                                      "spent so far)"),
                      "%s", row);
        free(row);
        ck_assert_double_eq_tol(job_cost(0), 0.006, 1e-12);
        /* the crossing call was never made */
        ck_assert_int_eq(llm_calls_of("cost-a"), 1);
        bodies = bodies_of("cost-a");
        ck_assert_uint_eq(json_array_size(bodies), 1);
        body = json_array_get(bodies, 0);
        ck_assert_double_eq(
            json_real_value(json_object_get(body, "temperature")), 0.3);
        ck_assert_double_eq(json_real_value(json_object_get(body, "top_p")),
                            0.9);
        ck_assert_int_eq(json_integer_value(json_object_get(body, "seed")), 42);
        ck_assert_int_eq(
            json_integer_value(json_object_get(body, "max_tokens")), 1000);
        json_decref(bodies);

        row = job_row(1, "status, reason_code, prompt_tokens, "
                         "completion_tokens");
        ck_assert_str_eq(row, "failed|budget|1000|500");
        free(row);
        row = job_row(1, "reason");
        ck_assert_msg(strstr(row, "token budget: the next LLM call could use "
                                  "up to ") == row &&
                          strstr(row, "limits.max_tokens_total 3000 (1500 "
                                      "used so far)"),
                      "%s", row);
        free(row);
        ck_assert_int_eq(llm_calls_of("cost-b"), 1);

        /* no limits: every call, and the cost of all three */
        row = job_row(2, "status, coalesce(reason_code, '-'), prompt_tokens,"
                         " completion_tokens, turns");
        ck_assert_str_eq(row, "succeeded|-|3000|1100|3");
        free(row);
        ck_assert_double_eq_tol(job_cost(2), 0.014, 1e-12);
        bodies = bodies_of("cost-c");
        ck_assert_uint_eq(json_array_size(bodies), 3);
        json_array_foreach(bodies, i, body)
        {
                ck_assert_ptr_null(json_object_get(body, "temperature"));
                ck_assert_ptr_null(json_object_get(body, "top_p"));
                ck_assert_ptr_null(json_object_get(body, "seed"));
        }
        json_decref(bodies);

        /* what each job used, with its result */
        cq_sha256_hex(cq_agent_default_system_prompt(),
                      strlen(cq_agent_default_system_prompt()), hex);
        job_id(2, id, sizeof(id));
        row = pg_text("SELECT concat_ws('|', r.model, p->>'provider',"
                      " coalesce(p->>'temperature', '-'), p->>'max_tokens',"
                      " p->>'system_prompt_sha256', p->>'coderq_version',"
                      " p->>'backend') FROM results r,"
                      " LATERAL (SELECT r.report->'repro' AS p) x"
                      " WHERE r.job_id = $1",
                      id);
        {
                char want[512];

                snprintf(want, sizeof(want),
                         "script:cost-c|openai|-|1000|%s|%s|local", hex,
                         CQ_VERSION);
                ck_assert_str_eq(row, want);
        }
        free(row);
        row = pg_text("SELECT concat_ws('|', report->'repro'->>'python',"
                      " report->'repro'->'packages'->>'numpy')"
                      " FROM results WHERE job_id = $1",
                      id);
        ck_assert_msg(strncmp(row, "3.", 2) == 0 && strstr(row, "|1."), "%s",
                      row);
        free(row);

        /* coderq status shows them; the completion event says what it cost
         * and why it stopped */
        job_id(0, id, sizeof(id));
        run_cli(status_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        status = json_loads(proc.out, 0, NULL);
        ck_assert_ptr_nonnull(status);
        ck_assert_str_eq(json_string_value(json_object_get(status, "model")),
                         "script:cost-a");
        ck_assert_str_eq(
            json_string_value(json_object_get(status, "reason_code")),
            "budget");
        ck_assert_double_eq(
            json_real_value(json_object_get(status, "temperature")), 0.3);
        ck_assert_double_eq(json_real_value(json_object_get(status, "top_p")),
                            0.9);
        ck_assert_int_eq(json_integer_value(json_object_get(status, "seed")),
                         42);
        ck_assert_str_eq(json_string_value(json_object_get(status, "provider")),
                         "openai");
        ck_assert_str_eq(json_string_value(json_object_get(status, "backend")),
                         "local");
        ck_assert_ptr_nonnull(
            json_string_value(json_object_get(status, "python")));
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(status, "cost_usd")), 0.006,
            1e-12);
        json_decref(status);
        cq_check_proc_release(&proc);
        event = completion_event(0);
        ck_assert_str_eq(
            json_string_value(json_object_get(event, "reason_code")), "budget");
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(event, "cost_usd")), 0.006,
            1e-12);
        ck_assert_str_eq(json_string_value(json_object_get(event, "model")),
                         "script:cost-a");
        ck_assert(json_is_null(json_object_get(event, "retry_of")));
        json_decref(event);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
}
END_TEST

/* A run's budget holds across its jobs: with one slot the first job
 * spends $0.008 in two calls; the second makes its first call ($0.008 +
 * about $0.011 of $0.02) and fails before its second ($0.014 + $0.011). */
START_TEST(run_budget_holds_across_jobs)
{
        worker_t w;
        rd_kafka_t *rk;
        cq_check_proc_t proc;
        const char *budget_args[] = {"budget", "--run",  prefix, "--usd",
                                     "0.02",   "--json", NULL};
        json_t *doc;
        char *row;
        int failed;

        fresh("runbudget");
        register_script("rb-0", "[{\"tool_calls\":[{\"code\":\"x = 1\"}],"
                                "\"usage\":{\"prompt_tokens\":1000,"
                                "\"completion_tokens\":500}},"
                                "{\"content\":\"done\",\"usage\":{"
                                "\"prompt_tokens\":1000,"
                                "\"completion_tokens\":100}}]");
        register_script("rb-1", "[{\"tool_calls\":[{\"code\":\"x = 1\"}],"
                                "\"usage\":{\"prompt_tokens\":1000,"
                                "\"completion_tokens\":500}},"
                                "{\"content\":\"done\",\"usage\":{"
                                "\"prompt_tokens\":1000,"
                                "\"completion_tokens\":100}}]");
        run_cli(budget_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        doc = json_loads(proc.out, 0, NULL);
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(doc, "budget_usd")), 0.02, 1e-12);
        ck_assert_int_eq(json_integer_value(json_object_get(doc, "jobs")), 0);
        json_decref(doc);
        cq_check_proc_release(&proc);
        child_slots = "1";
        child_extra = priced_worker();
        start_worker(&w, "wr", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "rb-0", NULL);
        submit(rk, 1, "rb-1", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(2, WAIT_MS);
        ck_assert_int_eq(count_status("succeeded"), 1);
        ck_assert_int_eq(count_status("failed"), 1);
        failed = (int)kt_pg_long(
            dsn,
            "SELECT right(job_id, 1)::int FROM jobs WHERE status = 'failed'",
            NULL);
        row = job_row(failed, "reason_code, turns, prompt_tokens");
        ck_assert_str_eq(row, "budget|1|1000");
        free(row);
        row = job_row(failed, "reason");
        ck_assert_msg(strstr(row, "run budget: the next LLM call could cost "
                                  "up to $0.01") == row &&
                          strstr(row, "would cross the budget of run") &&
                          strstr(row, "$0.014000 spent"),
                      "%s", row);
        free(row);
        /* the one who failed got one call, the other two */
        ck_assert_int_eq(llm_calls_of(failed == 0 ? "rb-0" : "rb-1"), 1);
        ck_assert_int_eq(llm_calls_of(failed == 0 ? "rb-1" : "rb-0"), 2);
        budget_args[3] = NULL; /* show it */
        run_cli(budget_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(strstr(proc.out, "spent_usd:    0.014000\n") &&
                          strstr(proc.out, "held_usd:     0.000000\n") &&
                          strstr(proc.out, "jobs:         2\n"),
                      "%s", proc.out);
        cq_check_proc_release(&proc);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
}
END_TEST

/* Seven calls of a job, each taking 1 s at the fake and costing $0.006
 * but the last ($0.002): long enough to set a budget while it runs. */
static const char late_budget_steps[] =
    "[{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"x = 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"x += 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"x += 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"x += 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"x += 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"delay_ms\":1000,\"tool_calls\":[{\"code\":\"x += 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"delay_ms\":1000,\"content\":\"done\","
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":100}}]";

/* A budget set on a run while one of its jobs runs (claimed without
 * one, so it made no holds) holds that job's calls too: below what the
 * job already spent, the job fails with reason budget, having made at
 * most one call after the budget was set. */
START_TEST(run_budget_set_while_a_job_runs_holds_it)
{
        worker_t w;
        rd_kafka_t *rk;
        cq_check_proc_t proc;
        const char *budget_args[] = {"budget", "--run", prefix,
                                     "--usd",  "0.001", NULL};
        char *row, id[192];
        long before;
        int waited;

        fresh("latebudget");
        register_script("late", late_budget_steps);
        child_slots = "1";
        child_extra = priced_worker();
        start_worker(&w, "wl", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "late", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        /* the first call's reply and usage are stored: $0.006 spent */
        job_id(0, id, sizeof(id));
        for (waited = 0; waited < WAIT_MS; waited += 50) {
                if (kt_pg_long(dsn,
                               "SELECT count(*) FROM jobs WHERE job_id = $1 "
                               "AND status = 'running' AND cost_usd > 0",
                               id) == 1)
                        break;
                kt_sleep_ms(50);
        }
        ck_assert_msg(waited < WAIT_MS, "the job never made its first call");
        run_cli(budget_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        cq_check_proc_release(&proc);
        /* every call asked for so far started before the budget was set or
         * during the CLI; the next one may start without a hold, the one
         * after it must be held */
        before = llm_calls_of("late");
        ck_assert_int_ge(before, 1);
        ck_assert_int_le(before, 5); /* else the job cannot show a hold */
        wait_finished_or_dump(1, WAIT_MS);
        row = job_row(0, "status, reason_code");
        ck_assert_str_eq(row, "failed|budget");
        free(row);
        row = job_row(0, "reason");
        ck_assert_msg(strstr(row, "run budget: ") == row &&
                          strstr(row, "would cross the budget of run"),
                      "%s", row);
        free(row);
        ck_assert_int_le(llm_calls_of("late"), before + 1);
        /* nothing stays held */
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM jobs WHERE "
                                    "budget_hold_usd <> 0",
                                    NULL),
                         0);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
}
END_TEST

/* A failure retried: the retry goes through Kafka and the intake as a
 * new job linked to its original, the old result stays, results and the
 * summary show the latest attempt unless asked for all of them, and a
 * second retry finds nothing to do. */
START_TEST(retry_queues_failures_as_linked_attempts)
{
        worker_t w;
        rd_kafka_t *rk;
        cq_check_proc_t proc;
        const char *retry_args[] = {"retry",  "--run",     prefix, "--failed",
                                    "--wait", "--timeout", "200",  NULL};
        const char *results_args[] = {"results", "--run", prefix, "--format",
                                      "json",    NULL,    NULL};
        const char *summary_args[] = {"results",  "--run", prefix, "--summary",
                                      "--format", "json",  NULL,   NULL};
        char orig[192], again[256];
        json_t *doc, *total, *event;
        char *row;

        fresh("retry");
        /* the first call is refused once (HTTP 400: the job fails), the
         * retry's is answered */
        register_script("flaky",
                        "[{\"faults\":[{\"kind\":\"http\",\"status\":400}],"
                        "\"tool_calls\":[{\"code\":\"x = 1\"}]},"
                        "{\"content\":\"done\"}]");
        start_worker(&w, "wy", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "flaky", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(1, WAIT_MS);
        row = job_row(0, "status, reason_code");
        ck_assert_str_eq(row, "failed|llm");
        free(row);

        job_id(0, orig, sizeof(orig));
        snprintf(again, sizeof(again), "%s~r2", orig);
        run_cli(retry_args, &proc);
        ck_assert_msg(proc.status == 0, "exit %d: %s", proc.status, proc.err);
        ck_assert_msg(strncmp(proc.out, again, strlen(again)) == 0 &&
                          proc.out[strlen(again)] == '\n',
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, " succeeded "), "%s", proc.out);
        cq_check_proc_release(&proc);
        row = pg_text("SELECT concat_ws('|', status, retry_of, run_attempt,"
                      " run_id) FROM jobs WHERE job_id = $1",
                      again);
        {
                char want[512];

                snprintf(want, sizeof(want), "succeeded|%s|2|%s", orig, prefix);
                ck_assert_str_eq(row, want);
        }
        free(row);
        /* the original and its result are kept */
        row = job_row(0, "status, reason_code");
        ck_assert_str_eq(row, "failed|llm");
        free(row);
        ck_assert_int_eq(kt_pg_long(dsn, "SELECT count(*) FROM results", NULL),
                         2);
        event = completion_event_of(again);
        ck_assert_str_eq(json_string_value(json_object_get(event, "retry_of")),
                         orig);
        ck_assert_int_eq(
            json_integer_value(json_object_get(event, "run_attempt")), 2);
        json_decref(event);

        /* the latest attempt by default, every one when asked */
        run_cli(results_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        doc = json_loads(proc.out, 0, NULL);
        ck_assert_uint_eq(json_array_size(doc), 1);
        ck_assert_str_eq(json_string_value(
                             json_object_get(json_array_get(doc, 0), "job_id")),
                         again);
        json_decref(doc);
        cq_check_proc_release(&proc);
        results_args[5] = "--all-attempts";
        run_cli(results_args, &proc);
        doc = json_loads(proc.out, 0, NULL);
        ck_assert_uint_eq(json_array_size(doc), 2);
        ck_assert_str_eq(json_string_value(
                             json_object_get(json_array_get(doc, 0), "job_id")),
                         orig);
        ck_assert(
            json_is_false(json_object_get(json_array_get(doc, 0), "latest")));
        json_decref(doc);
        cq_check_proc_release(&proc);

        run_cli(summary_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        doc = json_loads(proc.out, 0, NULL);
        total = json_object_get(doc, "total");
        ck_assert_int_eq(json_integer_value(json_object_get(total, "jobs")), 1);
        ck_assert_int_eq(
            json_integer_value(json_object_get(total, "succeeded")), 1);
        ck_assert_int_eq(json_integer_value(json_object_get(total, "retried")),
                         1);
        ck_assert_int_eq(json_object_size(json_object_get(total, "reasons")),
                         0);
        json_decref(doc);
        cq_check_proc_release(&proc);
        summary_args[6] = "--all-attempts";
        run_cli(summary_args, &proc);
        doc = json_loads(proc.out, 0, NULL);
        total = json_object_get(doc, "total");
        ck_assert_int_eq(json_integer_value(json_object_get(total, "jobs")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(total, "failed")),
                         1);
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(total, "reasons"), "llm")),
                         1);
        json_decref(doc);
        cq_check_proc_release(&proc);

        /* nothing failed any more */
        retry_args[4] = NULL;
        run_cli(retry_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(proc.out, "");
        ck_assert_msg(strstr(proc.err, "nothing to retry"), "%s", proc.err);
        cq_check_proc_release(&proc);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
}
END_TEST

static void no_extra(void)
{
        child_extra = NULL;
        child_slots = "2";
        kill_leftovers();
}

/* An LLM turn longer than the E2B TTL must not lose the job's sandbox:
 * housekeeping extends it. The TTL is 30 s and the turn 40 s; the job's
 * cell deadline (1 s) is too short for the per-cell extension to cover
 * the turn. */
START_TEST(long_llm_turn_keeps_the_e2b_sandbox)
{
        cq_fake_e2b_t e2b;
        worker_t a;
        rd_kafka_t *rk;
        char key[256], api[512], sbx[512];
        const char *extra[] = {NULL, NULL, NULL, "CODERQ_E2B_TTL_S=30", NULL};

        fresh("e2bkeep");
        ck_assert_int_eq(cq_fake_e2b_start(&e2b, 1.0), 0);
        register_script("slow_turn",
                        "[{\"tool_calls\":[{\"code\":\"x = 41\"}]},"
                        "{\"delay_ms\":40000,\"tool_calls\":[{\"code\":"
                        "\"print(x + 1)\"}]},"
                        "{\"content\":\"done\"}]");
        /* child_env() unsets E2B_API_KEY: the worker's settings go
         * through child_extra */
        snprintf(key, sizeof(key), "E2B_API_KEY=%s", e2b.api_key);
        snprintf(api, sizeof(api), "E2B_API_URL=%s", e2b.api_url);
        snprintf(sbx, sizeof(sbx), "E2B_SANDBOX_URL=%s", e2b.sandbox_url);
        extra[0] = key;
        extra[1] = api;
        extra[2] = sbx;
        child_extra = extra;
        start_worker(&a, "wk", "30");
        child_extra = NULL;
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

/* ------------------------------ the default sandbox and memory rules */

/* The worker daemon in its default sandbox mode (CODERQ_SANDBOX unset:
 * "on"), as root: a job's code runs as a kernel uid of its own, not as
 * the worker, and the result says so. */
START_TEST(default_sandbox_runs_job_code_as_another_uid)
{
        char root_env[128], top[96], errstr[512], *row, *out;
        const char *extra[] = {
            "CODERQ_SANDBOX=", "CODERQ_SANDBOX_UIDS=", root_env, NULL};
        cq_sandbox_opts_t so = {0};
        cq_sandbox_t *sandbox;
        worker_t w, a;
        rd_kafka_t *rk;
        long uid = -1, gid = -1;
        bool works;
        char id[192];

        /* A root of its own: kernel uids traverse it (the logs' dir is
         * 0700). */
        snprintf(top, sizeof(top), "/tmp/cq-it-worker-root-%ld",
                 (long)getpid());
        snprintf(root_env, sizeof(root_env), "CODERQ_WORK_ROOT=%s", top);
        so.mode = CQ_SANDBOX_AUTO;
        so.probe_dir = top;
        sandbox = cq_sandbox_new(&so, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        works = cq_sandbox_enabled(sandbox);
        snprintf(errstr, sizeof(errstr), "%s", cq_sandbox_reason(sandbox));
        cq_sandbox_destroy(&sandbox);
        if (!works) {
                rmdir(top);
                CQ_CHECK_SKIP("bwrap", "bubblewrap does not work here: %s",
                              errstr);
        }
        if (geteuid() != 0) {
                rmdir(top);
                CQ_CHECK_SKIP("root", "kernel uids are switched by root only");
        }
        fresh("defsandbox");
        register_script("whoami", "[{\"tool_calls\":[{\"code\":\"import os\\n"
                                  "print(os.getuid(), os.getgid())\"}]},"
                                  "{\"content\":\"done\"}]");
        child_slots = "1";
        child_extra = extra;
        start_worker(&w, "ws", "30");
        child_extra = NULL;
        child_slots = "2";
        rk = kt_producer(brokers);
        submit(rk, 0, "whoami", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(1, WAIT_MS);
        row = job_row(0, "status");
        ck_assert_str_eq(row, "succeeded");
        free(row);
        job_id(0, id, sizeof(id));
        out = pg_text("SELECT r.report->>'sandbox' FROM results r WHERE "
                      "r.job_id = $1",
                      id);
        ck_assert_str_eq(out, "bwrap+uid-per-kernel");
        free(out);
        out = pg_text("SELECT outputs->0->>'text' FROM cells WHERE job_id = $1 "
                      "AND status = 'ok'",
                      id);
        ck_assert_ptr_nonnull(out);
        ck_assert_int_eq(sscanf(out, "%ld %ld", &uid, &gid), 2);
        ck_assert_msg(uid != (long)geteuid() && uid >= CQ_SANDBOX_UIDS_FIRST &&
                          uid <= CQ_SANDBOX_UIDS_LAST && gid == uid,
                      "the job's code ran as uid %ld gid %ld (worker: %ld)",
                      uid, gid, (long)geteuid());
        free(out);
        ck_assert_int_eq(log_count(&w, "sandbox", "info"), 1);
        ck_assert_int_eq(log_count(&w, "sandbox", "warn"), 0);
        ck_assert_int_eq(log_count(&w,
                                   "job runs UNSANDBOXED, as the worker's "
                                   "user",
                                   "warn"),
                         0);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);

        /* A job begun by a worker without the sandbox and finished by one
         * with it carries outputs of code that ran unsandboxed: its
         * result reports the weaker mode, and each attempt's. */
        register_script("slow", slow_steps);
        start_worker(&a, "wa", "30"); /* CODERQ_SANDBOX=off */
        rk = kt_producer(brokers);
        submit(rk, 1, "slow", NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);
        job_id(1, id, sizeof(id));
        wait_sql("SELECT count(*) FROM cells WHERE job_id = $1", id, 1, 60000,
                 "a cell of the job run without the sandbox");
        ck_assert_int_eq(stop_worker(&a, SIGTERM, 25000), 0);
        ck_assert_int_eq(count_status("queued"), 1);
        child_slots = "1";
        child_extra = extra;
        start_worker(&w, "ws2", "30");
        child_extra = NULL;
        child_slots = "2";
        wait_finished_or_dump(2, WAIT_MS);
        row = job_row(1, "status");
        ck_assert_str_eq(row, "succeeded");
        free(row);
        out = pg_text("SELECT r.report->>'sandbox' || ' ' || "
                      "(SELECT string_agg(x->>'sandbox', ',' ORDER BY n) "
                      "FROM jsonb_array_elements(r.report->'runs') "
                      "WITH ORDINALITY AS t(x, n)) FROM results r "
                      "WHERE r.job_id = $1",
                      id);
        ck_assert_str_eq(out, "off off,bwrap+uid-per-kernel");
        free(out);
        /* the exported notebook says the same */
        out = pg_text("SELECT doc->'metadata'->'coderq'->>'sandbox' "
                      "FROM notebooks WHERE job_id = $1",
                      id);
        ck_assert_str_eq(out, "off");
        free(out);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
        snprintf(errstr, sizeof(errstr), "rm -rf %s", top);
        ck_assert_int_eq(system(errstr), 0);
}
END_TEST

/* The worker's default scope (CODERQ_MEMORY_SCOPE) serves jobs that name
 * none; recall:false never looks, remember:false never adds; a job
 * without tests gets the remembered code as a hint, kept in its
 * transcript with the job it came from. */
START_TEST(memory_default_scope_flags_and_hints)
{
        static const char *const extra[] = {"CODERQ_MEMORY_SCOPE=team2", NULL};
        worker_t w;
        rd_kafka_t *rk;
        char ex[1024], one[192], three[192], *src;

        fresh("memflags");
        register_script("mem-d", sq_steps);
        rk = kt_producer(brokers);
        child_slots = "1";
        child_extra = extra;
        start_worker(&w, "md", "30");
        child_extra = NULL;
        child_slots = "2";

        /* No memory field: the worker's scope. Solved, remembered there. */
        submit_wait(rk, 1, "mem-d", sq_tests, 1);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM solutions WHERE "
                                    "scope = 'team2'",
                                    NULL),
                         1);
        ck_assert_int_eq(llm_calls_of("mem-d"), 2);
        /* ... and recalled from it, with no LLM call. */
        submit_wait(rk, 2, "mem-d", sq_tests, 2);
        ck_assert_msg(from_memory_of(2, 1), "job 2 not from the memory of 1");
        ck_assert_int_eq(llm_calls_of("mem-d"), 2);

        /* recall:false: a match exists, yet the model solves it with no
         * hint; it is remembered (remember defaults to true). */
        snprintf(ex, sizeof(ex), "%s,\"memory\":{\"recall\":false}", sq_tests);
        submit_wait(rk, 3, "mem-d", ex, 3);
        ck_assert_int_eq(
            job_long(3, "SELECT count(*) FROM job_overview WHERE job_id = $1 "
                        "AND status = 'succeeded' AND NOT from_memory AND "
                        "memory_source_job IS NULL AND turns = 2"),
            1);
        ck_assert_int_eq(
            job_long(3, "SELECT count(*) FROM job_messages WHERE job_id = $1 "
                        "AND message->>'content' LIKE '%episodic memory%'"),
            0);
        ck_assert_int_eq(llm_calls_of("mem-d"), 4);
        ck_assert_int_eq(kt_pg_long(dsn,
                                    "SELECT count(*) FROM solutions WHERE "
                                    "scope = 'team2'",
                                    NULL),
                         2);

        /* remember:false, in a scope of its own: solved, not added. */
        snprintf(ex, sizeof(ex),
                 "%s,\"memory\":{\"scope\":\"solo\",\"remember\":false}",
                 sq_tests);
        submit_wait(rk, 4, "mem-d", ex, 4);
        ck_assert_int_eq(
            job_long(4, "SELECT count(*) FROM job_overview WHERE job_id = $1 "
                        "AND status = 'succeeded' AND NOT from_memory AND "
                        "turns = 2"),
            1);
        ck_assert_int_eq(
            kt_pg_long(dsn, "SELECT count(*) FROM solutions", NULL), 2);
        ck_assert_int_eq(llm_calls_of("mem-d"), 6);

        /* No tests: nothing to check a recall against, so the remembered
         * code is a hint in the task message, stored with the transcript
         * and naming the job it came from (memory_source_job). */
        submit_wait(rk, 5, "mem-d", NULL, 5);
        ck_assert_int_eq(llm_calls_of("mem-d"), 8);
        ck_assert_int_eq(
            job_long(5, "SELECT count(*) FROM job_overview o WHERE o.job_id = "
                        "$1 AND o.status = 'succeeded' AND NOT o.from_memory "
                        "AND o.memory_source_job IS NOT NULL AND EXISTS ("
                        "SELECT 1 FROM job_messages m WHERE m.job_id = "
                        "o.job_id AND m.role = 'user' AND "
                        "m.message->>'content' LIKE '%A hint from episodic "
                        "memory (scope \"team2\")%' AND "
                        "m.message->>'content' LIKE '%(job ' || "
                        "o.memory_source_job || ', model script:mem-d,%')"),
            1);
        job_id(1, one, sizeof(one));
        job_id(3, three, sizeof(three));
        job_id(5, ex, sizeof(ex));
        src = pg_text("SELECT memory_source_job FROM job_overview WHERE "
                      "job_id = $1",
                      ex);
        ck_assert_msg(src && (strcmp(src, one) == 0 || strcmp(src, three) == 0),
                      "hint from %s", src ? src : "(none)");
        free(src);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
        kt_producer_destroy(rk);
}
END_TEST

/* A test case of its own, run alone with CQ_CHECK_CASE=\p name: a fresh
 * database and fake LLM, \p cleanup after each test. */
static TCase *new_case(const char *name, void (*cleanup)(void))
{
        TCase *tc = tcase_create(name);

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, cleanup);
        tcase_set_timeout(tc, 600);
        return tc;
}

/* ------------------------------------------------------------ start-up */

/* The lines of \p w's log that start with "coderq: " (what it said on
 * stderr besides its JSON log), and how many there are. Caller frees. */
static char *said(const worker_t *w, int *np)
{
        char path[512], line[4096];
        cq_buf_t buf;
        char *text;
        FILE *fp;

        *np = 0;
        cq_buf_init(&buf, 1 << 20);
        snprintf(path, sizeof(path), "%s/%s-%s.log", logdir, prefix, w->name);
        fp = fopen(path, "r");
        ck_assert_ptr_nonnull(fp);
        while (fgets(line, sizeof(line), fp)) {
                if (strncmp(line, "coderq: ", 8) != 0)
                        continue;
                ck_assert_int_eq(cq_buf_append_str(&buf, line), CQ_OK);
                (*np)++;
        }
        fclose(fp);
        text = cq_buf_take(&buf, NULL);
        return text ? text : strdup("");
}

/* Whether /readyz of the worker at \p port answers \p status with \p text
 * in its body, within \p ms. */
static void wait_readyz(int port, long status, const char *text, int ms)
{
        char url[128], *body = NULL;
        long got = 0;
        int waited;

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz", port);
        for (waited = 0; waited < ms; waited += 200) {
                free(body);
                got = http_get(url, &body);
                if (got == status && strstr(body, text))
                        break;
                kt_sleep_ms(200);
        }
        ck_assert_msg(got == status && strstr(body, text),
                      "/readyz answered %ld \"%s\", not %ld \"%s\"", got, body,
                      status, text);
        free(body);
}

/* A worker exits 4 with \p w's one line, naming CODERQ_PG_DSN and where
 * it points, and \p why. */
static void
refused_with(worker_t *w, int ms, const char *target, const char *why)
{
        static const char head[] = "coderq: worker: could not connect to "
                                   "PostgreSQL (CODERQ_PG_DSN: host=127.0.0.1 ";
        char *text;
        int n;

        ck_assert_int_eq(stop_worker(w, 0, ms), CQ_EXIT_UNAVAILABLE);
        text = said(w, &n);
        ck_assert_msg(n == 1, "%d lines: %s", n, text);
        ck_assert_msg(strncmp(text, head, sizeof(head) - 1) == 0 &&
                          strstr(text, target) && strstr(text, why) &&
                          strstr(text, "): ") && text[strlen(text) - 1] == '\n',
                      "%s", text);
        free(text);
}

/* What waiting cannot fix stops a worker at once, before it starts a
 * kernel: no such database, no such role, TLS it cannot have. */
START_TEST(worker_refuses_what_waiting_cannot_fix)
{
        static char pg[2300];
        static const char *extra[] = {pg, NULL};
        char base[2048];
        worker_t w;

        fresh("refuse");
        cq_pgtest_dsn_for(dsn, "cqw_no_such_db", base, sizeof(base));
        switch (_i) {
        case 0:
                snprintf(pg, sizeof(pg), "CODERQ_PG_DSN=%s", base);
                break;
        case 1:
                snprintf(pg, sizeof(pg), "CODERQ_PG_DSN=%s user=cqw_no_role",
                         dsn);
                break;
        default:
                snprintf(pg, sizeof(pg),
                         "CODERQ_PG_DSN=%s sslmode=verify-full "
                         "sslrootcert=/nonexistent/ca.pem",
                         dsn);
                break;
        }
        child_extra = extra;
        start_worker(&w, "wr", "30");
        switch (_i) {
        case 0:
                refused_with(&w, 30000, " dbname=cqw_no_such_db user=",
                             "): database \"cqw_no_such_db\" does not exist\n");
                break;
        case 1:
                refused_with(&w, 30000, " user=cqw_no_role",
                             "): role \"cqw_no_role\" does not exist\n");
                break;
        default:
                /* the root certificate, or a server without TLS */
                refused_with(&w, 30000, " sslmode=verify-full", "): ");
                break;
        }
        ck_assert_int_eq(log_count(&w, "interpreters ready", "info"), 0);
}
END_TEST

/* A server that is not up yet is waited for while the worker runs, not
 * ready until it answers; one that then refuses the database stops it as
 * at start. */
START_TEST(worker_waits_for_postgres_that_is_not_up_yet)
{
        static char pg[2400], metrics[64];
        static const char *extra[] = {pg, metrics, NULL};
        char through[2300], nodb[2048], said_once[512];
        int port = free_port(), mport = free_port();
        cq_pgproxy_t *proxy;
        worker_t w;
        char *v;

        fresh("pgwait");
        if (_i == 0)
                snprintf(nodb, sizeof(nodb), "%s", dsn);
        else
                cq_pgtest_dsn_for(dsn, "cqw_no_such_db", nodb, sizeof(nodb));
        /* where the proxy will listen, and nothing listens yet */
        proxy = cq_pgproxy_start_on(dsn, port);
        cq_pgproxy_dsn(proxy, nodb, through, sizeof(through));
        cq_pgproxy_stop(&proxy);
        snprintf(pg, sizeof(pg), "CODERQ_PG_DSN=%s", through);
        snprintf(metrics, sizeof(metrics), "CODERQ_METRICS_ADDR=127.0.0.1:%d",
                 mport);
        child_extra = extra;
        start_worker(&w, "wp", "30");
        v = log_field(&w, "worker started", "worker", 60000);
        free(v);
        ck_assert_int_eq(log_count(&w,
                                   "PostgreSQL is not reachable yet: "
                                   "waiting for it, not ready meanwhile",
                                   "warn"),
                         1);
        /* the fake LLM is local and asks for no key: said once */
        snprintf(said_once, sizeof(said_once),
                 "no LLM API key: CODERQ_LLM_BASE_URL %s is local, so its "
                 "requests go without one (set CODERQ_LLM_API_KEY (or "
                 "OPENAI_API_KEY) if the server wants one)",
                 cq_fake_llm_base_url(fake));
        ck_assert_int_eq(log_count(&w, said_once, "warn"), 1);
        wait_readyz(mport, 503, "not ready: PostgreSQL is not reachable",
                    30000);
        ck_assert(worker_alive(&w));
        proxy = cq_pgproxy_start_on(dsn, port);
        if (_i == 0) {
                wait_readyz(mport, 200, "ready", 60000);
                ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
        } else {
                refused_with(&w, 60000, " dbname=cqw_no_such_db ",
                             "): database \"cqw_no_such_db\" does not exist\n");
        }
        cq_pgproxy_stop(&proxy);
}
END_TEST

/* A worker with no LLM (CODERQ_LLM_PROVIDER=none) judges jobs with a
 * solution; any other job fails at once, with reason code llm and a
 * reason naming the setting, tried once, no request sent. It needs no
 * key, so it says nothing of one. */
START_TEST(worker_without_an_llm_judges_solutions_only)
{
        static const char *const extra[] = {"CODERQ_LLM_PROVIDER=none", NULL};
        rd_kafka_t *rk;
        json_t *reqs;
        worker_t w;
        char *row;

        fresh("nollm");
        child_extra = extra;
        start_worker(&w, "wn", "30");
        rk = kt_producer(brokers);
        submit(rk, 0, "two_cells", NULL);
        submit(rk, 1, "two_cells", "\"solution\":\"x = 6 * 7\\nprint(x)\"");
        kt_flush(rk);
        kt_producer_destroy(rk);
        wait_finished_or_dump(2, WAIT_MS);
        row = job_row(0, "status, reason_code, attempts, reason");
        ck_assert_str_eq(row, "failed|llm|1|" CQ_LLM_NONE_REASON);
        free(row);
        row = job_row(1, "status, coalesce(reason_code, '-'), turns");
        ck_assert_str_eq(row, "succeeded|-|0");
        free(row);
        reqs = cq_fake_llm_requests(fake);
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        ck_assert_int_eq(stop_worker(&w, SIGTERM, 30000), 0);
        ck_assert_int_eq(log_count(&w, "job cannot run", "error"), 1);
}
END_TEST

static Suite *worker_suite(void)
{
        Suite *s = suite_create("worker");
        TCase *tc = tcase_create("e2e");
        TCase *limits = tcase_create("limits");
        TCase *e2b = tcase_create("e2b");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_leftovers);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, fifty_jobs_two_workers);
        tcase_add_test(tc, heartbeat_never_flags_the_next_job);
        tcase_add_test(tc, malformed_messages_go_to_the_dlq);
        tcase_add_test(tc, killed_worker_jobs_are_resumed_once);
        tcase_add_test(tc, sigterm_releases_jobs_to_another_worker);
        tcase_add_test(tc, cancel_and_sessions);
        tcase_add_test(tc, idle_worker_hears_of_new_jobs);
        tcase_add_test(tc, idle_slots_poll_once_per_worker);
        tcase_add_test(tc, nul_output_kept_and_refused_checkpoint_fails_job);
        suite_add_tcase(s, tc);
        /* It stops and restarts the shared services, so CTest runs this
         * case alone (RUN_SERIAL): CQ_CHECK_CASE=outage. */
        tc = new_case("outage", kill_leftovers);
        tcase_add_test(tc, broker_and_database_outages_lose_nothing);
        suite_add_tcase(s, tc);
        /* Figures and their names: CQ_CHECK_CASE=figures runs them alone. */
        tc = new_case("figures", kill_leftovers);
        tcase_add_test(tc, figures_keep_their_names);
        suite_add_tcase(s, tc);
        /* Evaluation rules: CQ_CHECK_CASE=eval runs them alone. */
        tc = new_case("eval", kill_leftovers);
        tcase_add_test(tc, memory_only_inside_a_named_scope_and_model);
        tcase_add_test(tc, fresh_tests_and_test_deadlines);
        suite_add_tcase(s, tc);
        tcase_add_unchecked_fixture(limits, setup, teardown);
        tcase_add_checked_fixture(limits, NULL, no_extra);
        tcase_set_timeout(limits, 600);
        tcase_add_test(limits, jobs_that_cannot_run_fail_with_a_reason);
        tcase_add_test(limits, interpreter_failures_back_off_then_fail);
        tcase_add_test(limits, resumed_job_keeps_its_retry_count);
        tcase_add_test(limits, resumed_job_keeps_its_running_time);
        suite_add_tcase(s, limits);
        /* The default sandbox and the memory rules: CQ_CHECK_CASE=trust. */
        tc = new_case("trust", no_extra);
        tcase_add_test(tc, default_sandbox_runs_job_code_as_another_uid);
        tcase_add_test(tc, memory_default_scope_flags_and_hints);
        suite_add_tcase(s, tc);
        /* Budgets, sampling and retries of evaluation runs:
         * CQ_CHECK_CASE=budget runs them alone. */
        tc = new_case("budget", no_extra);
        tcase_add_test(tc, job_budgets_stop_before_the_crossing_call);
        tcase_add_test(tc, run_budget_holds_across_jobs);
        tcase_add_test(tc, run_budget_set_while_a_job_runs_holds_it);
        tcase_add_test(tc, retry_queues_failures_as_linked_attempts);
        suite_add_tcase(s, tc);
        tcase_add_unchecked_fixture(e2b, setup, teardown);
        tcase_add_checked_fixture(e2b, NULL, kill_leftovers);
        tcase_set_timeout(e2b, 300);
        tcase_add_test(e2b, long_llm_turn_keeps_the_e2b_sandbox);
        suite_add_tcase(s, e2b);
        /* CQ_CHECK_CASE=startup: PostgreSQL refused or not up yet at start */
        tc = new_case("startup", no_extra);
        tcase_add_loop_test(tc, worker_refuses_what_waiting_cannot_fix, 0, 3);
        tcase_add_loop_test(tc, worker_waits_for_postgres_that_is_not_up_yet, 0,
                            2);
        tcase_add_test(tc, worker_without_an_llm_judges_solutions_only);
        suite_add_tcase(s, tc);
        /* CQ_CHECK_CASE=metrics: the metrics server and a real Prometheus */
        tc = new_case("metrics", metrics_cleanup);
        tcase_add_test(tc, metrics_health_and_a_real_prometheus);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(worker_suite)
