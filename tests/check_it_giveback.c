/* SPDX-License-Identifier: MIT */
/* check_it_giveback.c - a claimed job that cannot start its agent loop:
 * its checkpoint cannot be loaded, its parent session cannot be loaded,
 * or the agent cannot run. consumer/worker.c's cannot_run() decides: an
 * error retrying cannot fix fails the job at once, naming it; a passing
 * one puts the job back with a growing delay, each try an attempt, and
 * fails it at the last attempt, naming the error. A worker runs in this
 * process with one slot and neither intake nor relay (jobs go straight
 * into a PostgreSQL database of its own); cq_agent_run is wrapped at link
 * time (-Wl,--wrap, see tests/CMakeLists.txt) so that a job can meet an
 * agent that cannot run, which happens only when memory runs out. */
#include <fcntl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/agent/agent.h"
#include "coderq/common/config.h"
#include "coderq/common/job.h"
#include "coderq/common/log.h"
#include "coderq/storage/queue.h"
#include "coderq/common/util.h"
#include "coderq/worker/worker.h"
#include "support/pgtest.h"

/* cq_agent_run()'s parameters (agent/include/coderq/agent.h), for the wrapper
 * and the real function it calls. */
#define AGENT_RUN_PARAMS                                                       \
        (const cq_job_t *job, cq_interp_t *interp, cq_llm_t *llm,              \
         const cq_agent_opts_t *opts, const cq_agent_observer_t *obs,          \
         const cq_agent_memory_t *mem, const cq_agent_start_t *start,          \
         cq_nb_t *nb, cq_agent_result_t *result)

cq_err_t __real_cq_agent_run AGENT_RUN_PARAMS;
cq_err_t __wrap_cq_agent_run AGENT_RUN_PARAMS;

/* A prompt with this in it meets an agent that cannot run. */
#define NO_AGENT "[the agent cannot run]"

static atomic_int agent_calls, agent_refusals;

/* What cq_agent_run() does when out of memory: CQ_ERR_FATAL, the result
 * initialised and empty. Any other job runs the real one. */
cq_err_t __wrap_cq_agent_run AGENT_RUN_PARAMS
{
        atomic_fetch_add(&agent_calls, 1);
        if (job->prompt && strstr(job->prompt, NO_AGENT)) {
                atomic_fetch_add(&agent_refusals, 1);
                cq_agent_result_init(result);
                return CQ_ERR_FATAL;
        }
        return __real_cq_agent_run(job, interp, llm, opts, obs, mem, start, nb,
                                   result);
}

static char dsn[2048], dbname[96], work_root[128];

static void setup(void)
{
        cq_pgtest_sweep("cqg");
        cq_pgtest_create("cqg", true, dsn, sizeof(dsn), dbname, sizeof(dbname));
        snprintf(work_root, sizeof(work_root), "/tmp/cq-it-giveback-%ld",
                 (long)getpid());
}

static void teardown(void)
{
        char cmd[256];

        cq_pgtest_drop(dbname);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", work_root);
        if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", work_root);
}

/* Run \p sql with up to one parameter on a connection of its own. */
static void pg(const char *sql, const char *param)
{
        PGconn *conn = cq_pgtest_connect(dsn);
        PGresult *res =
            PQexecParams(conn, sql, param ? 1 : 0, NULL, &param, NULL, NULL, 0);

        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK ||
                          PQresultStatus(res) == PGRES_TUPLES_OK,
                      "%s: %s", sql, PQerrorMessage(conn));
        PQclear(res);
        PQfinish(conn);
}

/* "status|attempts|reason" of job \p id. */
static char *job_row(const char *id)
{
        PGconn *conn = cq_pgtest_connect(dsn);
        const char *params[1] = {id};
        PGresult *res = PQexecParams(conn,
                                     "SELECT concat_ws('|', status, attempts, "
                                     "reason) FROM jobs WHERE job_id = $1",
                                     1, NULL, params, NULL, NULL, 0);
        char *out;

        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK &&
                          PQntuples(res) == 1,
                      "job %s: %s", id, PQerrorMessage(conn));
        out = strdup(PQgetvalue(res, 0, 0));
        PQclear(res);
        PQfinish(conn);
        return out;
}

/* Store job \p id (with \p extra JSON members) as the intake would. */
static void add_job(const char *id, const char *prompt, const char *extra)
{
        char spec[1024], errstr[512];
        cq_store_opts_t so;
        cq_store_t *store;
        cq_job_t job;

        snprintf(spec, sizeof(spec),
                 "{\"job_id\":\"%s\",\"prompt\":\"%s\",\"model\":\"m\"%s%s}",
                 id, prompt, extra ? "," : "", extra ? extra : "");
        cq_job_init(&job);
        ck_assert_msg(cq_job_parse(spec, strlen(spec), 1 << 20, &job, errstr,
                                   sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
        cq_store_opts_init(&so);
        so.dsn = dsn;
        so.owner = "test";
        store = cq_store_new(&so, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        ck_assert_int_eq(cq_store_upsert_job(store, &job, NULL, NULL), CQ_OK);
        cq_store_destroy(&store);
        cq_job_release(&job);
}

/* A checkpointed first message for job \p id; \p n is a JSON number
 * stored in it. PostgreSQL keeps any numeric; past int64 the worker
 * cannot parse the document. */
static void add_message(const char *id, const char *n)
{
        char sql[512];

        snprintf(sql, sizeof(sql),
                 "INSERT INTO job_messages (job_id, seq, role, message, "
                 "attempt) VALUES ($1, 1, 'user', '{\"role\": \"user\", "
                 "\"content\": \"go\", \"n\": %s}', 1)",
                 n);
        pg(sql, id);
}

static volatile sig_atomic_t stop;
static long want_finished;

/* Raises the worker's stop flag once \p want_finished jobs finished, or
 * after two minutes (the test then fails on what did not finish). */
static void *watch(void *arg)
{
        PGconn *conn = cq_pgtest_connect(dsn);
        int64_t deadline = cq_now_ms() + 120000;

        (void)arg;
        while (cq_now_ms() < deadline) {
                PGresult *res = PQexec(conn, "SELECT count(*) FROM jobs WHERE "
                                             "status IN ('succeeded', "
                                             "'failed', 'cancelled')");
                long n = PQresultStatus(res) == PGRES_TUPLES_OK
                             ? strtol(PQgetvalue(res, 0, 0), NULL, 10)
                             : -1;

                PQclear(res);
                if (n >= want_finished)
                        break;
                usleep(100 * 1000);
        }
        PQfinish(conn);
        stop = 1;
        return NULL;
}

typedef struct log_stats {
        long put_back;      /* "job put back for later" lines */
        long long attempts; /* the sum of their attempt numbers */
        long long waits_ms; /* the sum of their delays */
} log_stats_t;

/* Run a worker until \p n jobs finished; what its log says of put-back
 * jobs goes to \p stats. */
static void run_worker(long n, log_stats_t *stats)
{
        static const char *const settings[][2] = {
            {"CODERQ_WORKER_ID", "giveback"},
            {"CODERQ_SANDBOX", "off"},
            {"CODERQ_KPOOL_SIZE", "1"},
            {"CODERQ_POLL_MS", "100"},
            {"CODERQ_LEASE_S", "30"},
            {"CODERQ_MAX_ATTEMPTS", "3"},
            {"CODERQ_REQUEUE_DELAY_MS", "100"},
            {"CODERQ_LLM_BASE_URL", "http://127.0.0.1:1/v1"},
        };
        cq_worker_opts_t opts = {.slots = 1, .drain_s = 10};
        char errstr[512], logpath[] = "/tmp/cq-giveback-log-XXXXXX", line[4096];
        cq_config_t cfg;
        cq_worker_t *w;
        pthread_t thr;
        FILE *fp;
        size_t i;
        int fd, rc;

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        for (i = 0; i < CQ_ARRAY_SIZE(settings); i++)
                ck_assert_msg(cq_config_set(&cfg, settings[i][0],
                                            settings[i][1], "test", errstr,
                                            sizeof(errstr)) == 0,
                              "%s", errstr);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_PG_DSN", dsn, "test",
                                       errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_WORK_ROOT", work_root,
                                       "test", errstr, sizeof(errstr)),
                         0);
        fd = mkstemp(logpath);
        ck_assert_int_ge(fd, 0);
        cq_log_set_level(CQ_LOG_INFO);
        cq_log_set_fd(fd);
        w = cq_worker_new(&cfg, &opts, errstr, sizeof(errstr));
        ck_assert_msg(w != NULL, "%s", errstr);
        stop = 0;
        want_finished = n;
        ck_assert_int_eq(pthread_create(&thr, NULL, watch, NULL), 0);
        rc = cq_worker_run(w, &stop);
        ck_assert_int_eq(pthread_join(thr, NULL), 0);
        cq_worker_destroy(&w);
        cq_log_set_fd(2);
        ck_assert_int_eq(rc, 0);
        cq_config_release(&cfg);

        memset(stats, 0, sizeof(*stats));
        fp = fdopen(fd, "r");
        ck_assert_ptr_nonnull(fp);
        rewind(fp);
        while (fgets(line, sizeof(line), fp)) {
                json_t *doc = json_loads(line, 0, NULL);
                const char *msg =
                    json_string_value(json_object_get(doc, "msg"));

                if (msg && strcmp(msg, "job put back for later") == 0) {
                        stats->put_back++;
                        stats->attempts +=
                            json_integer_value(json_object_get(doc, "attempt"));
                        stats->waits_ms += json_integer_value(
                            json_object_get(doc, "retry_in_ms"));
                }
                json_decref(doc);
        }
        fclose(fp);
        unlink(logpath);
}

/* A checkpoint, or a parent session, that is in the database but cannot
 * be read (a number past int64 in a stored message: no later try reads it
 * either) fails the job at its first claim, with the reason. */
START_TEST(unreadable_checkpoint_or_parent_fails_at_once)
{
        static const char big[] = "1e400";
        log_stats_t st;
        char *row;

        add_job("gb-ckpt", "resume me", NULL);
        add_message("gb-ckpt", big);
        add_job("gb-parent", "the parent", NULL);
        add_message("gb-parent", big);
        pg("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE "
           "job_id = $1",
           "gb-parent");
        add_job("gb-child", "the child", "\"parent_job_id\":\"gb-parent\"");
        run_worker(3, &st);

        row = job_row("gb-ckpt");
        ck_assert_msg(strncmp(row,
                              "failed|1|could not load its checkpoint: could "
                              "not parse messages: ",
                              65) == 0 &&
                          strstr(row, "too big integer"),
                      "%s", row);
        free(row);
        row = job_row("gb-child");
        ck_assert_msg(strncmp(row,
                              "failed|1|could not load the parent session: "
                              "could not parse messages: ",
                              70) == 0 &&
                          strstr(row, "too big integer"),
                      "%s", row);
        free(row);
        ck_assert_int_eq(st.put_back, 0);
        ck_assert_int_eq(atomic_load(&agent_calls), 0);
}
END_TEST

/* The same reads failing for a reason that may pass (a lock held past
 * lock_timeout): each job goes back with a growing delay, each try an
 * attempt, and fails at the last one naming the error. */
START_TEST(checkpoint_or_parent_that_cannot_be_read_now_backs_off)
{
        char sql[256], *row;
        log_stats_t st;
        PGconn *lock;

        add_job("gb-ckpt", "resume me", NULL);
        add_message("gb-ckpt", "1");
        add_job("gb-parent", "the parent", NULL);
        add_message("gb-parent", "1");
        pg("UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE "
           "job_id = $1",
           "gb-parent");
        add_job("gb-child", "the child", "\"parent_job_id\":\"gb-parent\"");
        /* Loading a checkpoint reads notebooks, which nothing else these
         * jobs do touches; the worker's connections wait 300 ms for it. */
        snprintf(sql, sizeof(sql),
                 "ALTER DATABASE \"%s\" SET lock_timeout = '300ms'", dbname);
        pg(sql, NULL);
        lock = cq_pgtest_connect(dsn);
        cq_pgtest_exec(lock, "BEGIN");
        cq_pgtest_exec(lock, "LOCK TABLE notebooks IN ACCESS EXCLUSIVE MODE");
        run_worker(2, &st);
        cq_pgtest_exec(lock, "ROLLBACK");
        PQfinish(lock);
        snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" RESET lock_timeout",
                 dbname);
        pg(sql, NULL);

        row = job_row("gb-ckpt");
        ck_assert_msg(strncmp(row,
                              "failed|3|gave up after 3 attempts: could not "
                              "load its checkpoint: ",
                              63) == 0 &&
                          strstr(row, "lock timeout"),
                      "%s", row);
        free(row);
        row = job_row("gb-child");
        ck_assert_msg(strncmp(row,
                              "failed|3|gave up after 3 attempts: could not "
                              "load the parent session: ",
                              68) == 0 &&
                          strstr(row, "lock timeout"),
                      "%s", row);
        free(row);
        /* each put back twice (attempts 1 and 2), after 50-100 ms, then
         * 100-200 ms (the doubled delay, jittered over its upper half) */
        ck_assert_int_eq(st.put_back, 4);
        ck_assert_int_eq(st.attempts, 2 * (1 + 2));
        ck_assert_msg(st.waits_ms >= 2 * 150 && st.waits_ms <= 2 * 300,
                      "%lld ms", st.waits_ms);
        ck_assert_int_eq(atomic_load(&agent_calls), 0);
}
END_TEST

/* An agent that cannot run (out of memory) may run later: the job goes
 * back with a growing delay and fails at its last attempt, saying so. */
START_TEST(agent_that_cannot_run_backs_off_then_fails)
{
        log_stats_t st;
        char *row;

        add_job("gb-agent", "compute " NO_AGENT, NULL);
        run_worker(1, &st);
        row = job_row("gb-agent");
        ck_assert_str_eq(row, "failed|3|gave up after 3 attempts: the agent "
                              "could not run: out of memory");
        free(row);
        ck_assert_int_eq(atomic_load(&agent_refusals), 3);
        ck_assert_int_eq(st.put_back, 2);
        ck_assert_int_eq(st.attempts, 1 + 2);
        ck_assert_msg(st.waits_ms >= 150 && st.waits_ms <= 300, "%lld ms",
                      st.waits_ms);
}
END_TEST

static Suite *giveback_suite(void)
{
        Suite *s = suite_create("it_giveback");
        TCase *tc = tcase_create("giveback");

        /* a database per test: each starts from an empty queue */
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, unreadable_checkpoint_or_parent_fails_at_once);
        tcase_add_test(tc,
                       checkpoint_or_parent_that_cannot_be_read_now_backs_off);
        tcase_add_test(tc, agent_that_cannot_run_backs_off_then_fails);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(giveback_suite)
