/* SPDX-License-Identifier: MIT */
/* check_it_secure.c - coderq against a secured Kafka and PostgreSQL, as
 * managed services are run: the suite switches the local services to
 * secure mode itself (scripts/services.sh start --secure: a test CA, an
 * SSL and a SASL_SSL listener with SCRAM-SHA-512, TLS on PostgreSQL) and
 * takes its client settings from services.sh env --secure. The whole path
 * (submit, intake, DLQ, relay, progress events) runs over SASL_SSL with
 * PostgreSQL over verify-full TLS; a wrong password and an unknown CA stop
 * submit, doctor and worker at once with exit 4 and one line; no secret
 * reaches a log line or coderq config. The captured completion and
 * progress events are validated against schemas/ (python3-jsonschema).
 * The Python upstream writer (examples/upstream/) runs a session through
 * the same services. */
#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "support/fake_llm.h"
#include "support/kafka_test.h"
#include "support/pgtest.h"
#include "support/proc.h"

#define WAIT_MS 180000

/* What services.sh env --secure printed. */
static struct {
        char dsn[1024];     /* CODERQ_PG_DSN: verify-full with the test CA */
        char brokers[64];   /* CODERQ_KAFKA_BROKERS: the SASL_SSL listener */
        char protocol[32];  /* CODERQ_KAFKA_PROP_SECURITY_PROTOCOL */
        char mechanism[32]; /* CODERQ_KAFKA_PROP_SASL_MECHANISM */
        char username[64];  /* CODERQ_KAFKA_PROP_SASL_USERNAME */
        char password[128]; /* CODERQ_KAFKA_PROP_SASL_PASSWORD */
        char ca[512];       /* CODERQ_KAFKA_PROP_SSL_CA_LOCATION */
        char ssl_port[16];  /* CODERQ_KAFKA_SSL_PORT */
        char other_ca[512]; /* a CA that signed nothing, beside ca */
        char props_file[512];
} sec;

/* librdkafka settings of the test's own clients (kt_client_props()). */
static const char *client_kv[11];

static cq_fake_llm_t *fake;
static char dbdsn[2048]; /* the suite's database, over verify-full TLS */
static char dbname[96];
static char prefix[128];
#define LOGDIR_TEMPLATE "/tmp/cq-it-secure-XXXXXX"
static char logdir[] = LOGDIR_TEMPLATE;

/* Copy the value of "export NAME='value'" lines. */
static void take(const char *line, const char *name, char *out, size_t size)
{
        char head[96];
        size_t n;

        snprintf(head, sizeof(head), "export %s='", name);
        if (strncmp(line, head, strlen(head)) != 0)
                return;
        line += strlen(head);
        n = strcspn(line, "'");
        ck_assert_msg(n < size, "%s too long", name);
        memcpy(out, line, n);
        out[n] = '\0';
}

static void read_secure_env(void)
{
        const struct {
                const char *name;
                char *out;
                size_t size;
        } vars[] = {
            {"CODERQ_PG_DSN", sec.dsn, sizeof(sec.dsn)},
            {"CODERQ_KAFKA_BROKERS", sec.brokers, sizeof(sec.brokers)},
            {"CODERQ_KAFKA_PROP_SECURITY_PROTOCOL", sec.protocol,
             sizeof(sec.protocol)},
            {"CODERQ_KAFKA_PROP_SASL_MECHANISM", sec.mechanism,
             sizeof(sec.mechanism)},
            {"CODERQ_KAFKA_PROP_SASL_USERNAME", sec.username,
             sizeof(sec.username)},
            {"CODERQ_KAFKA_PROP_SASL_PASSWORD", sec.password,
             sizeof(sec.password)},
            {"CODERQ_KAFKA_PROP_SSL_CA_LOCATION", sec.ca, sizeof(sec.ca)},
            {"CODERQ_KAFKA_SSL_PORT", sec.ssl_port, sizeof(sec.ssl_port)},
        };
        char cmd[1200], line[2048];
        size_t i;
        FILE *fp;

        snprintf(cmd, sizeof(cmd), "%s env --secure",
                 cq_check_srcpath("scripts/services.sh"));
        fp = popen(cmd, "r");
        ck_assert_ptr_nonnull(fp);
        while (fgets(line, sizeof(line), fp))
                for (i = 0; i < CQ_ARRAY_SIZE(vars); i++)
                        take(line, vars[i].name, vars[i].out, vars[i].size);
        ck_assert_int_eq(pclose(fp), 0);
        ck_assert_str_eq(sec.protocol, "SASL_SSL");
        ck_assert_str_eq(sec.mechanism, "SCRAM-SHA-512");
        ck_assert_int_ge(strlen(sec.password), 16);
        ck_assert_ptr_nonnull(strstr(sec.dsn, "sslmode=verify-full"));
        ck_assert_ptr_nonnull(strrchr(sec.ca, '/'));
        snprintf(sec.other_ca, sizeof(sec.other_ca), "%.*s/other-ca.pem",
                 (int)(strrchr(sec.ca, '/') - sec.ca), sec.ca);
        snprintf(sec.props_file, sizeof(sec.props_file),
                 "%.*s/client.properties", (int)(strrchr(sec.ca, '/') - sec.ca),
                 sec.ca);
        ck_assert_int_eq(access(sec.other_ca, R_OK), 0);
        ck_assert_int_eq(access(sec.props_file, R_OK), 0);
        client_kv[0] = "security.protocol";
        client_kv[1] = sec.protocol;
        client_kv[2] = "sasl.mechanism";
        client_kv[3] = sec.mechanism;
        client_kv[4] = "sasl.username";
        client_kv[5] = sec.username;
        client_kv[6] = "sasl.password";
        client_kv[7] = sec.password;
        client_kv[8] = "ssl.ca.location";
        client_kv[9] = sec.ca;
        client_kv[10] = NULL;
        kt_client_props(client_kv);
}

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        kt_services("start --secure");
        read_secure_env();
        fake = cq_fake_llm_start(NULL);
        ck_assert_ptr_nonnull(fake);
        snprintf(logdir, sizeof(logdir), "%s", LOGDIR_TEMPLATE);
        ck_assert_ptr_nonnull(mkdtemp(logdir));
        cq_pgtest_sweep("cqs");
        cq_pgtest_create("cqs", true, dbdsn, sizeof(dbdsn), dbname,
                         sizeof(dbname));
        /* The same database, but reached over TLS checked against the
         * test CA, as a managed database is. */
        ck_assert_int_lt(strlen(dbdsn) + strlen(sec.ca) + 64, sizeof(dbdsn));
        snprintf(dbdsn + strlen(dbdsn), sizeof(dbdsn) - strlen(dbdsn),
                 " sslmode='verify-full' sslrootcert='%s'", sec.ca);
}

static void teardown(void)
{
        char cmd[256];

        kt_client_props(NULL);
        cq_fake_llm_stop(&fake);
        cq_pgtest_drop(dbname);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", logdir);
        if (getenv("CQ_KEEP_LOGS"))
                fprintf(stderr, "logs kept in %s\n", logdir);
        else if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", logdir);
        curl_global_cleanup();
}

/* The environment of a coderq process against the secure services
 * ("NAME=value" entries; \p extra overrides, NULL-terminated). Static
 * buffers: one call's result is used before the next call. */
static const char *const *secure_env(const char *const *extra)
{
        static char v[24][2400];
        static const char *env[40];
        size_t n = 0, i;

#define SET(...)                                                               \
        do {                                                                   \
                snprintf(v[n], sizeof(v[n]), __VA_ARGS__);                     \
                env[n] = v[n];                                                 \
                n++;                                                           \
        } while (0)
        SET("CODERQ_PG_DSN=%s", dbdsn);
        SET("CODERQ_KAFKA_BROKERS=%s", sec.brokers);
        SET("CODERQ_KAFKA_PROP_SECURITY_PROTOCOL=%s", sec.protocol);
        SET("CODERQ_KAFKA_PROP_SASL_MECHANISM=%s", sec.mechanism);
        SET("CODERQ_KAFKA_PROP_SASL_USERNAME=%s", sec.username);
        SET("CODERQ_KAFKA_PROP_SASL_PASSWORD=%s", sec.password);
        SET("CODERQ_KAFKA_PROP_SSL_CA_LOCATION=%s", sec.ca);
        SET("CODERQ_TOPIC_JOBS=%s.jobs", prefix);
        SET("CODERQ_TOPIC_DLQ=%s.dlq", prefix);
        SET("CODERQ_TOPIC_RESULTS=%s.results", prefix);
        SET("CODERQ_TOPIC_EVENTS=%s.events", prefix);
        SET("CODERQ_KAFKA_GROUP=%s", prefix);
        SET("CODERQ_LLM_BASE_URL=%s", cq_fake_llm_base_url(fake));
#undef SET
        env[n++] = "CODERQ_KAFKA_PROPERTIES";
        env[n++] = "CODERQ_LLM_API_KEY";
        env[n++] = "OPENAI_API_KEY";
        env[n++] = "CODERQ_SANDBOX=off";
        env[n++] = "CODERQ_SLOTS=1";
        env[n++] = "CODERQ_KPOOL_SIZE=1";
        env[n++] = "CODERQ_POLL_MS=100";
        env[n++] = "CODERQ_RELAY_INTERVAL_MS=200";
        env[n++] = "CODERQ_SHUTDOWN_S=20";
        env[n++] = "CODERQ_WORKER_ID=secure-worker";
        for (i = 0; extra && extra[i] && n + 1 < CQ_ARRAY_SIZE(env); i++)
                env[n++] = extra[i];
        env[n] = NULL;
        return env;
}

/* Apply env (as cq_check_proc_run() reads it) to this process. */
static void apply_env(const char *const *env)
{
        for (; *env; env++) {
                const char *eq = strchr(*env, '=');
                char name[128];

                if (!eq) {
                        unsetenv(*env);
                        continue;
                }
                snprintf(name, sizeof(name), "%.*s", (int)(eq - *env), *env);
                setenv(name, eq + 1, 1);
        }
}

static void fresh(const char *test)
{
        char topic[256];

        kt_unique(test, prefix, sizeof(prefix));
        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        kt_create_topic(sec.brokers, topic, 1);
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        kt_create_topic(sec.brokers, topic, 1);
        snprintf(topic, sizeof(topic), "%s.dlq", prefix);
        kt_create_topic(sec.brokers, topic, 1);
        snprintf(topic, sizeof(topic), "%s.events", prefix);
        kt_create_topic(sec.brokers, topic, 1);
}

static pid_t start_worker(const char *log, const char *const *env)
{
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                        close(fd);
                }
                apply_env(env);
                execl(CQ_BINARY_DIR "/coderq", "coderq", "worker",
                      (char *)NULL);
                _exit(127);
        }
        return pid;
}

static int stop_worker(pid_t pid)
{
        int st, waited;

        kill(pid, SIGTERM);
        for (waited = 0; waited < 60000; waited += 50) {
                if (waitpid(pid, &st, WNOHANG) == pid)
                        return WIFEXITED(st) ? WEXITSTATUS(st)
                                             : 128 + WTERMSIG(st);
                kt_sleep_ms(50);
        }
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        return -1;
}

/* Write \p n messages' values, one per line, to \p path. */
static void write_values(const char *path, const kt_msg_t *msgs, size_t n)
{
        FILE *fp = fopen(path, "w");
        size_t i;

        ck_assert_ptr_nonnull(fp);
        for (i = 0; i < n; i++)
                fprintf(fp, "%s\n", msgs[i].value ? msgs[i].value : "null");
        ck_assert_int_eq(fclose(fp), 0);
}

static const char two_cells[] =
    "[{\"tool_calls\":[{\"code\":\"import math\\nx = math.factorial(10)\\n"
    "print(x)\"}]},"
    "{\"tool_calls\":[{\"code\":\"import matplotlib.pyplot as plt\\n"
    "plt.plot([1, 2, 3], [x % 7, 2, 1])\\nplt.savefig('fig.png')\\n"
    "plt.show()\"}]},"
    "{\"content\":\"done\"}]";

/* Submit (coderq submit), intake, DLQ, relay and events, all over
 * SASL_SSL; the jobs stored over verify-full TLS. librdkafka's debug log
 * (its configuration dump included) and coderq's own debug log carry no
 * secret. The events are valid against schemas/. */
START_TEST(whole_path_over_sasl_ssl)
{
        char jobs[512], log[512], id[192], line[1024], topic[256];
        char results_file[512], events_file[512], cmd[2048];
        const char *const debug[] = {"CODERQ_LOG_LEVEL=debug",
                                     "CODERQ_KAFKA_PROP_DEBUG=security,broker,"
                                     "conf,protocol",
                                     NULL};
        const char *argv[] = {CQ_BINARY_DIR "/coderq", "submit", jobs, NULL};
        const char *cfg_argv[] = {CQ_BINARY_DIR "/coderq", "config", NULL};
        cq_check_proc_t proc;
        kt_msg_t *msgs = NULL;
        rd_kafka_t *rk;
        char *text;
        size_t n, i;
        bool finished = false;
        json_t *ev;
        pid_t pid;
        int waited;

        fresh("sec");
        ev = json_loads(two_cells, 0, NULL);
        ck_assert_ptr_nonnull(ev);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, "two_cells", ev), 0);
        json_decref(ev);
        snprintf(id, sizeof(id), "%s-1", prefix);
        snprintf(jobs, sizeof(jobs), "%s/jobs.jsonl", logdir);
        snprintf(line, sizeof(line),
                 "{\"job_id\":\"%s\",\"run_id\":\"%s\",\"model\":"
                 "\"script:two_cells\",\"prompt\":\"Compute 10!.\"}\n",
                 id, prefix);
        cq_check_spit(jobs, line, strlen(line));

        /* coderq submit over SASL_SSL. */
        ck_assert_int_eq(
            cq_check_proc_run(argv, secure_env(NULL), 90000, &proc), 0);
        ck_assert_msg(proc.status == 0, "submit: %s", proc.err);
        ck_assert_int_eq(strncmp(proc.out, id, strlen(id)), 0);
        ck_assert_str_eq(proc.out + strlen(id), "\n");
        ck_assert_ptr_null(strstr(proc.err, sec.password));
        cq_check_proc_release(&proc);
        /* A message that is no job, for the DLQ. */
        rk = kt_producer(sec.brokers);
        snprintf(topic, sizeof(topic), "%s.jobs", prefix);
        kt_produce(rk, topic, 0, "bad", 3, "not json", 8, NULL);
        kt_flush(rk);
        kt_producer_destroy(rk);

        snprintf(log, sizeof(log), "%s/worker.log", logdir);
        pid = start_worker(log, secure_env(debug));
        for (waited = 0; waited < WAIT_MS && !finished; waited += 250) {
                finished = kt_pg_long(dbdsn,
                                      "SELECT count(*) FROM jobs WHERE job_id "
                                      "= $1 AND status = 'succeeded'",
                                      id) == 1;
                if (!finished)
                        kt_sleep_ms(250);
        }
        ck_assert_msg(finished, "the job did not succeed; see %s", log);
        /* The job came in over SASL_SSL: its source is recorded. */
        snprintf(line, sizeof(line), "%s.jobs", prefix);
        ck_assert_int_eq(kt_pg_long(dbdsn,
                                    "SELECT count(*) FROM jobs WHERE "
                                    "source_topic = $1",
                                    line),
                         1);

        /* DLQ, over SASL_SSL. */
        snprintf(topic, sizeof(topic), "%s.dlq", prefix);
        n = kt_consume(sec.brokers, topic, 1, 1, 60000, &msgs);
        ck_assert_uint_eq(n, 1);
        ck_assert_str_eq(msgs[0].value, "not json");
        ck_assert_ptr_nonnull(kt_header(&msgs[0], "error"));
        ck_assert_ptr_nonnull(strstr(kt_header(&msgs[0], "error"), "JSON"));
        kt_msgs_free(msgs, n);

        /* The completion event, over SASL_SSL, and the refused message's
         * answer (its key "bad" reads as a job id). */
        snprintf(topic, sizeof(topic), "%s.results", prefix);
        n = kt_consume(sec.brokers, topic, 1, 2, 60000, &msgs);
        ck_assert_uint_eq(n, 2);
        for (i = 0; i < n; i++) {
                ck_assert_ptr_nonnull(kt_header(&msgs[i], "event_id"));
                ev = json_loads(msgs[i].value, 0, NULL);
                ck_assert_ptr_nonnull(ev);
                if (strcmp(msgs[i].key, "bad") == 0) {
                        ck_assert_str_eq(
                            json_string_value(json_object_get(ev, "status")),
                            "rejected");
                        ck_assert_ptr_nonnull(strstr(
                            json_string_value(json_object_get(ev, "reason")),
                            "JSON"));
                } else {
                        ck_assert_str_eq(msgs[i].key, id);
                        ck_assert_str_eq(
                            json_string_value(json_object_get(ev, "status")),
                            "succeeded");
                        ck_assert_int_eq(
                            json_integer_value(json_object_get(ev, "cells")),
                            2);
                }
                json_decref(ev);
        }
        snprintf(results_file, sizeof(results_file), "%s/results.jsonl",
                 logdir);
        write_values(results_file, msgs, n);
        kt_msgs_free(msgs, n);

        /* Progress events, over SASL_SSL, through job.finished. */
        snprintf(topic, sizeof(topic), "%s.events", prefix);
        finished = false;
        for (waited = 0; waited < 60000 && !finished; waited += 2000) {
                n = kt_consume(sec.brokers, topic, 1, 64, 2000, &msgs);
                for (i = 0; i < n; i++)
                        if (strstr(msgs[i].value, "\"type\":\"job.finished\""))
                                finished = true;
                if (!finished)
                        kt_msgs_free(msgs, n);
        }
        ck_assert_msg(finished, "no job.finished event");
        ck_assert_ptr_nonnull(
            strstr(msgs[0].value, "\"type\":\"job.claimed\""));
        snprintf(events_file, sizeof(events_file), "%s/events.jsonl", logdir);
        write_values(events_file, msgs, n);
        kt_msgs_free(msgs, n);

        ck_assert_int_eq(stop_worker(pid), 0);

        /* The events are what schemas/ says. */
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 %s events %s %s >%s/schemas.log 2>&1",
                 cq_check_srcpath("tests/schemas/check_schemas.py"),
                 results_file, events_file, logdir);
        if (system(cmd) != 0) {
                snprintf(cmd, sizeof(cmd), "%s/schemas.log", logdir);
                text = cq_check_slurp(cmd, NULL);
                ck_abort_msg("events do not match schemas/: %s", text);
        }

        /* No secret in any log line, at debug level with librdkafka's
         * security and configuration debugging on. */
        text = cq_check_slurp(log, &n);
        ck_assert_msg(strstr(text, "sasl.password = [redacted]") ||
                          strstr(text, "sasl.password"),
                      "librdkafka's configuration dump is not in the log");
        ck_assert_msg(strstr(text, sec.password) == NULL,
                      "the SASL password is in the worker's log");
        free(text);

        /* Nor in coderq config, which says it is set. */
        ck_assert_int_eq(
            cq_check_proc_run(cfg_argv, secure_env(NULL), 30000, &proc), 0);
        ck_assert_int_eq(proc.status, 0);
        ck_assert_ptr_null(strstr(proc.out, sec.password));
        ck_assert_ptr_null(strstr(proc.err, sec.password));
        ck_assert_ptr_nonnull(strstr(proc.out,
                                     "\nkafka.sasl.password=(set)  "
                                     "(CODERQ_KAFKA_PROP_SASL_PASSWORD)\n"));
        /* the DSN's target, TLS mode included, no password */
        ck_assert_msg(strstr(proc.out, "\nCODERQ_PG_DSN=host=") &&
                          strstr(proc.out, " sslmode=verify-full\n"),
                      "%s", proc.out);
        cq_check_proc_release(&proc);
}
END_TEST

/* The line of \p out starting with \p head, or NULL. */
static const char *line_of(const char *out, const char *head)
{
        const char *p = out;

        while (p && *p) {
                if (strncmp(p, head, strlen(head)) == 0)
                        return p;
                p = strchr(p, '\n');
                if (p)
                        p++;
        }
        return NULL;
}

/* How many lines of \p s start with \p head. */
static size_t count_lines_with(const char *s, const char *head)
{
        size_t n = 0;
        const char *p = s;

        while ((p = line_of(p, head))) {
                n++;
                p += strlen(head);
        }
        return n;
}

/* submit, doctor and worker with \p bad ("NAME=value") exit 4 at once,
 * saying \p why on one line; none waits out librdkafka's reconnects (the
 * delivery timeout of submit alone is 30 s, the worker would run on). */
static void refused_fast(const char *bad, const char *why)
{
        const char *const extra[] = {bad, "CODERQ_SLOTS=0", NULL};
        const char *submit[] = {CQ_BINARY_DIR "/coderq", "submit", "--prompt",
                                "Compute 1+1.", NULL};
        const char *doctor[] = {CQ_BINARY_DIR "/coderq", "doctor", NULL};
        const char *worker[] = {CQ_BINARY_DIR "/coderq", "worker", NULL};
        cq_check_proc_t proc;
        const char *l;

        fresh("refused");
        ck_assert_int_eq(
            cq_check_proc_run(submit, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(!proc.timed_out, "submit waited for its timeout");
        ck_assert_int_eq(proc.status, 4);
        ck_assert_uint_eq(cq_check_count_lines(proc.err), 1);
        ck_assert_msg(strncmp(proc.err,
                              "coderq: could not connect to Kafka at ",
                              38) == 0 &&
                          strstr(proc.err, why),
                      "submit said: %s", proc.err);
        ck_assert_str_eq(proc.out, "");
        cq_check_proc_release(&proc);

        ck_assert_int_eq(
            cq_check_proc_run(doctor, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(!proc.timed_out, "doctor waited for its timeout");
        ck_assert_int_eq(proc.status, 4);
        l = line_of(proc.out, "kafka       FAIL  could not connect to ");
        ck_assert_msg(l && strstr(l, why), "doctor said: %s", proc.out);
        ck_assert_uint_eq(count_lines_with(proc.out, "kafka "), 1);
        ck_assert_ptr_nonnull(line_of(proc.out, "postgresql  ok "));
        cq_check_proc_release(&proc);

        ck_assert_int_eq(
            cq_check_proc_run(worker, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(!proc.timed_out, "worker kept running");
        ck_assert_int_eq(proc.status, 4);
        ck_assert_uint_eq(count_lines_with(proc.err, "coderq: "), 1);
        l = line_of(proc.err, "coderq: worker: could not connect to Kafka at ");
        ck_assert_msg(l && strstr(l, why), "worker said: %s", proc.err);
        ck_assert_ptr_null(strstr(proc.err, sec.password));
        cq_check_proc_release(&proc);
}

START_TEST(wrong_password_fails_fast)
{
        refused_fast("CODERQ_KAFKA_PROP_SASL_PASSWORD=not-the-password",
                     "SASL authentication error");
}
END_TEST

START_TEST(unknown_ca_fails_fast)
{
        char bad[600];

        snprintf(bad, sizeof(bad), "CODERQ_KAFKA_PROP_SSL_CA_LOCATION=%s",
                 sec.other_ca);
        refused_fast(bad, "certificate verify failed");
}
END_TEST

/* The same settings from the properties file services.sh writes, and the
 * SSL listener (TLS without SASL) through one. */
START_TEST(properties_file_and_ssl_listener)
{
        char file[600], ssl_props[512], ssl_brokers[96], text[700];
        const char *doctor[] = {CQ_BINARY_DIR "/coderq", "doctor", NULL};
        const char *extra[] = {file,
                               "CODERQ_KAFKA_PROP_SECURITY_PROTOCOL",
                               "CODERQ_KAFKA_PROP_SASL_MECHANISM",
                               "CODERQ_KAFKA_PROP_SASL_USERNAME",
                               "CODERQ_KAFKA_PROP_SASL_PASSWORD",
                               "CODERQ_KAFKA_PROP_SSL_CA_LOCATION",
                               ssl_brokers,
                               NULL};
        cq_check_proc_t proc;

        fresh("props");
        snprintf(file, sizeof(file), "CODERQ_KAFKA_PROPERTIES=%s",
                 sec.props_file);
        snprintf(ssl_brokers, sizeof(ssl_brokers), "CODERQ_KAFKA_BROKERS=%s",
                 sec.brokers);
        ck_assert_int_eq(
            cq_check_proc_run(doctor, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(proc.status == 0, "%s%s", proc.out, proc.err);
        ck_assert_ptr_nonnull(line_of(proc.out, "kafka       ok    1 broker"));
        cq_check_proc_release(&proc);

        snprintf(ssl_props, sizeof(ssl_props), "%s/ssl.properties", logdir);
        snprintf(text, sizeof(text),
                 "security.protocol = SSL\nssl.ca.location = %s\n", sec.ca);
        cq_check_spit(ssl_props, text, strlen(text));
        snprintf(file, sizeof(file), "CODERQ_KAFKA_PROPERTIES=%s", ssl_props);
        snprintf(ssl_brokers, sizeof(ssl_brokers),
                 "CODERQ_KAFKA_BROKERS=127.0.0.1:%s", sec.ssl_port);
        ck_assert_int_eq(
            cq_check_proc_run(doctor, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(proc.status == 0, "%s%s", proc.out, proc.err);
        ck_assert_ptr_nonnull(line_of(proc.out, "kafka       ok    1 broker"));
        cq_check_proc_release(&proc);
}
END_TEST

/* PostgreSQL: verify-full against the test CA works and doctor says the
 * connection is encrypted; a wrong CA fails with a clear error; a
 * plaintext connection still works and says so. */
START_TEST(postgres_tls)
{
        char dsn[3200];
        const char *doctor[] = {CQ_BINARY_DIR "/coderq", "doctor", NULL};
        const char *extra[] = {dsn, NULL};
        cq_check_proc_t proc;
        const char *l;

        fresh("pgtls");
        snprintf(dsn, sizeof(dsn), "CODERQ_PG_DSN=%s", sec.dsn);
        ck_assert_int_eq(
            cq_check_proc_run(doctor, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(proc.status == 0, "%s%s", proc.out, proc.err);
        l = line_of(proc.out, "postgresql  ok    PostgreSQL ");
        ck_assert_msg(l && strstr(l, ", encrypted (TLSv1."), "%s", proc.out);
        cq_check_proc_release(&proc);

        snprintf(dsn, sizeof(dsn), "CODERQ_PG_DSN=%s sslrootcert='%s'", dbdsn,
                 sec.other_ca);
        ck_assert_int_eq(
            cq_check_proc_run(doctor, secure_env(extra), 25000, &proc), 0);
        ck_assert_int_eq(proc.status, 4);
        l = line_of(proc.out, "postgresql  FAIL  could not connect "
                              "(CODERQ_PG_DSN: ");
        ck_assert_msg(l && strstr(l, "): SSL error: certificate verify "
                                     "failed\n"),
                      "%s", proc.out);
        cq_check_proc_release(&proc);

        snprintf(dsn, sizeof(dsn), "CODERQ_PG_DSN=%s sslmode='disable'", dbdsn);
        ck_assert_int_eq(
            cq_check_proc_run(doctor, secure_env(extra), 25000, &proc), 0);
        ck_assert_msg(proc.status == 0, "%s%s", proc.out, proc.err);
        l = line_of(proc.out, "postgresql  ok    PostgreSQL ");
        ck_assert_msg(l && strstr(l, ", not encrypted"), "%s", proc.out);
        cq_check_proc_release(&proc);
}
END_TEST

/* The Python upstream writer (examples/upstream/writer.py, Debian's
 * confluent-kafka and psycopg) against the same secured services and a
 * worker: an eda job and two questions continuing its kernel through
 * parent_job_id, answered by the example's scripted model; it waits for
 * the three completion events over SASL_SSL and reads the notebooks and
 * images over verify-full TLS. */
START_TEST(python_upstream_writer_session)
{
        const char *const extra[] = {"CODERQ_SLOTS=2", "CODERQ_KPOOL_SIZE=2",
                                     NULL};
        char scripts[4096], writer[4096], out[600], log[600], path[900];
        char session[160];
        const char *fake_args[] = {"--scripts", scripts, NULL};
        const char *argv[] = {
            "/usr/bin/python3", writer, "--session", session, "--out", out,
            "--timeout",        "150",  NULL};
        const char *ids[] = {"eda", "ques1", "ques2"};
        cq_check_proc_t proc;
        char *text;
        json_t *nb;
        size_t i;
        pid_t pid;

        fresh("up");
        snprintf(scripts, sizeof(scripts), "%s",
                 cq_check_srcpath("examples/upstream/model"));
        snprintf(writer, sizeof(writer), "%s",
                 cq_check_srcpath("examples/upstream/writer.py"));
        /* The example's scripted model answers by the phrases of its
         * prompts, whatever the model name. */
        cq_fake_llm_stop(&fake);
        fake = cq_fake_llm_start(fake_args);
        ck_assert_ptr_nonnull(fake);
        snprintf(session, sizeof(session), "%s-s", prefix);
        snprintf(out, sizeof(out), "%s/out", logdir);
        snprintf(log, sizeof(log), "%s/worker.log", logdir);
        pid = start_worker(log, secure_env(extra));
        ck_assert_int_eq(
            cq_check_proc_run(argv, secure_env(extra), 200000, &proc), 0);
        ck_assert_int_eq(stop_worker(pid), 0);
        ck_assert_msg(proc.status == 0, "writer.py exited %d:\n%s%s",
                      proc.status, proc.out, proc.err);
        for (i = 0; i < CQ_ARRAY_SIZE(ids); i++) {
                char want[300];

                snprintf(want, sizeof(want), "event  %s-%s: succeeded\n",
                         session, ids[i]);
                ck_assert_msg(strstr(proc.out, want), "%s", proc.out);
                snprintf(want, sizeof(want), "job    %s-%s: succeeded, ",
                         session, ids[i]);
                ck_assert_msg(strstr(proc.out, want), "%s", proc.out);
                snprintf(path, sizeof(path), "%s/%s-%s/notebook.ipynb", out,
                         session, ids[i]);
                nb = json_load_file(path, 0, NULL);
                ck_assert_msg(nb != NULL, "no notebook at %s", path);
                ck_assert_int_eq(
                    json_integer_value(json_object_get(nb, "nbformat")), 4);
                ck_assert_int_gt(json_array_size(json_object_get(nb, "cells")),
                                 0);
                json_decref(nb);
        }
        /* The questions ran their tests in the eda's kernel state. */
        snprintf(path, sizeof(path), "job    %s-ques2: succeeded, tests 1/1",
                 session);
        ck_assert_msg(strstr(proc.out, path), "%s", proc.out);
        /* The eda's figure came back from PostgreSQL as a PNG. */
        snprintf(path, sizeof(path), "%s/%s-eda/images/cell1-1.png", out,
                 session);
        text = cq_check_slurp(path, &i);
        ck_assert_uint_gt(i, 1000);
        ck_assert_int_eq(memcmp(text, "\x89PNG", 4), 0);
        free(text);
        cq_check_proc_release(&proc);
}
END_TEST

static Suite *it_secure_suite(void)
{
        Suite *s = suite_create("it_secure");
        TCase *tc = tcase_create("secure");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 400);
        tcase_add_test(tc, whole_path_over_sasl_ssl);
        tcase_add_test(tc, wrong_password_fails_fast);
        tcase_add_test(tc, unknown_ca_fails_fast);
        tcase_add_test(tc, properties_file_and_ssl_listener);
        tcase_add_test(tc, postgres_tls);
        tcase_add_test(tc, python_upstream_writer_session);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_secure_suite)
