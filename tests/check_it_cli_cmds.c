/* SPDX-License-Identifier: MIT */
/* check_it_cli_cmds.c - the user-facing commands (submit, status, results,
 * export, cancel) run as the built `coderq` binary against a real
 * PostgreSQL (CODERQ_PG_DSN; a fresh database per test, migrated from
 * migrations/) and a real Kafka (CODERQ_KAFKA_BROKERS; a fresh topic per
 * test). Rows are made through the store API, as a worker would. */
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "support/pgtest.h"
#include "coderq/common/buf.h"
#include "coderq/agent/notebook.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/artifacts.h"
#include "coderq/storage/queries.h"
#include "coderq/common/util.h"

static char g_dsn[2048]; /* the test's own database */
static char g_dbname[64];
static char g_topic[96]; /* the test's own jobs topic */
static char g_tmpdir[256];

/* ------------------------------------------------------------ postgres */

static void qexec(const char *sql, const char *param)
{
        PGconn *conn = cq_pgtest_connect(g_dsn);
        PGresult *res = PQexecParams(conn, sql, param ? 1 : 0, NULL,
                                     param ? &param : NULL, NULL, NULL, 0);

        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK ||
                          PQresultStatus(res) == PGRES_TUPLES_OK,
                      "%s: %s", sql, PQerrorMessage(conn));
        PQclear(res);
        PQfinish(conn);
}

static void setup(void)
{
        static unsigned counter;

        (void)cq_check_env("CODERQ_KAFKA_BROKERS");
        cq_pgtest_create("cqcli", true, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
        snprintf(g_topic, sizeof(g_topic), "cqt.cli.%ld.%u.%ld", (long)getpid(),
                 counter++, (long)(cq_now_ms() % 1000000));
        snprintf(g_tmpdir, sizeof(g_tmpdir), "/tmp/cqt_cli_XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(g_tmpdir));
        /* The binary reads its settings from the environment. */
        setenv("CODERQ_PG_DSN", g_dsn, 1);
        setenv("CODERQ_TOPIC_JOBS", g_topic, 1);
        setenv("CODERQ_LOG_LEVEL", "error", 1);
        /* timestamps in JSON and CSV in UTC, whatever the server's zone */
        setenv("PGTZ", "UTC", 1);
}

static void teardown(void)
{
        char cmd[400];

        cq_pgtest_drop(g_dbname);
        if (g_tmpdir[0] && strncmp(g_tmpdir, "/tmp/cqt_cli_", 13) == 0) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmpdir);
                if (system(cmd) != 0)
                        fprintf(stderr, "could not remove %s\n", g_tmpdir);
        }
}

static cq_store_t *store_for(const char *owner)
{
        cq_store_opts_t opts;
        char errstr[512];
        cq_store_t *store;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = owner;
        opts.lease_s = 600;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        return store;
}

/* Insert a job as the intake would, from its message text. */
static void add_job(cq_store_t *store, const char *message)
{
        cq_job_t job;
        char errstr[256];
        bool created = false;

        cq_job_init(&job);
        ck_assert_msg(cq_job_parse(message, strlen(message), 0, &job, errstr,
                                   sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
        ck_assert_msg(cq_store_upsert_job(store, &job, NULL, &created) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(created);
        cq_job_release(&job);
}

/* Claim the next job and check it is \p want. */
static void claim(cq_store_t *store, const char *want)
{
        cq_claim_t c;
        bool found = false;

        cq_claim_init(&c);
        ck_assert_msg(cq_store_claim(store, &c, &found) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        ck_assert(found);
        ck_assert_str_eq(c.job_id, want);
        cq_claim_release(&c);
}

typedef struct fin_args {
        const char *status, *reason, *answer;
        int passed, total, turns, retries;
        int64_t ptok, ctok;
        const json_t *nb;
        long duration_ms;    /* > 0: pin started_at to finished_at - this */
        const char *sandbox; /* the report's sandbox mode, or NULL */
} fin_args_t;

static void finish(cq_store_t *store, const char *id, const fin_args_t *a)
{
        cq_finish_t fin;
        bool lost = true;
        char sql[200];
        json_t *report =
            a->sandbox ? json_pack("{s:s}", "sandbox", a->sandbox) : NULL;

        memset(&fin, 0, sizeof(fin));
        fin.job_id = id;
        fin.status = a->status;
        fin.reason = a->reason;
        fin.answer = a->answer;
        fin.tests_passed = a->passed;
        fin.tests_total = a->total;
        fin.turns = a->turns;
        fin.retries = a->retries;
        fin.prompt_tokens = a->ptok;
        fin.completion_tokens = a->ctok;
        fin.notebook = a->nb;
        fin.report = report;
        ck_assert_msg(cq_store_finish(store, &fin, &lost) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        json_decref(report);
        ck_assert(!lost);
        if (a->duration_ms > 0) {
                snprintf(sql, sizeof(sql),
                         "UPDATE jobs SET started_at = finished_at - "
                         "interval '%ld milliseconds' WHERE job_id = $1",
                         a->duration_ms);
                qexec(sql, id);
        }
}

/* --------------------------------------------------------- the binary */

typedef struct cli_run {
        pid_t pid;
        char out_path[300], err_path[300];
        int code; /* exit status, or -1 when it did not exit normally */
        char *out, *err;
} cli_run_t;

/* Start `coderq ARGS...` (NULL-terminated) with \p in_path as stdin (NULL:
 * /dev/null); stdout and stderr go to files. */
static void cli_start(cli_run_t *run, const char *in_path, const char **args)
{
        static unsigned n;
        char bin[512];
        const char *argv[32];
        size_t i;

        memset(run, 0, sizeof(*run));
        snprintf(bin, sizeof(bin), "%s/coderq", cq_check_env("CQ_BINARY_DIR"));
        snprintf(run->out_path, sizeof(run->out_path), "%s/out.%u", g_tmpdir,
                 n);
        snprintf(run->err_path, sizeof(run->err_path), "%s/err.%u", g_tmpdir,
                 n++);
        argv[0] = "coderq";
        for (i = 0; args[i] && i + 2 < CQ_ARRAY_SIZE(argv); i++)
                argv[i + 1] = args[i];
        argv[i + 1] = NULL;
        fflush(NULL);
        run->pid = fork();
        ck_assert_int_ge(run->pid, 0);
        if (run->pid == 0) {
                int in = open(in_path ? in_path : "/dev/null", O_RDONLY);
                int out =
                    open(run->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
                int err =
                    open(run->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

                if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 ||
                    dup2(out, 1) < 0 || dup2(err, 2) < 0)
                        _exit(127);
                execv(bin, (char *const *)(uintptr_t)argv);
                _exit(127);
        }
}

static void cli_finish(cli_run_t *run)
{
        int status = 0;

        ck_assert_int_eq(waitpid(run->pid, &status, 0), run->pid);
        run->code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        run->out = cq_check_slurp(run->out_path, NULL);
        run->err = cq_check_slurp(run->err_path, NULL);
}

static void cli_release(cli_run_t *run)
{
        free(run->out);
        free(run->err);
        run->out = run->err = NULL;
}

/* Run to completion. */
static void cli(cli_run_t *run, const char *in_path, const char **args)
{
        cli_start(run, in_path, args);
        cli_finish(run);
}

static const char *tmp_path(const char *name)
{
        static char path[16][400];
        static int i;

        i = (i + 1) % 16;
        snprintf(path[i], sizeof(path[i]), "%s/%s", g_tmpdir, name);
        return path[i];
}

/* ---------------------------------------------------------------- kafka */

typedef struct kmsg {
        char *key;
        char *value;
        size_t len;
} kmsg_t;

static void
quiet_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        (void)rk;
        (void)level;
        (void)fac;
        (void)buf;
}

static rd_kafka_t *consumer_new(void)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char errstr[512];
        rd_kafka_t *rk;

        ck_assert(rd_kafka_conf_set(conf, "bootstrap.servers",
                                    cq_check_env("CODERQ_KAFKA_BROKERS"),
                                    errstr,
                                    sizeof(errstr)) == RD_KAFKA_CONF_OK);
        ck_assert(rd_kafka_conf_set(conf, "group.id", "cqt-cli-reader", errstr,
                                    sizeof(errstr)) == RD_KAFKA_CONF_OK);
        ck_assert(rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr,
                                    sizeof(errstr)) == RD_KAFKA_CONF_OK);
        rd_kafka_conf_set_log_cb(conf, quiet_log);
        rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
        ck_assert_msg(rk != NULL, "%s", errstr);
        return rk;
}

/* How many messages the test topic holds (0 when it does not exist). */
static long topic_count(void)
{
        rd_kafka_t *rk = consumer_new();
        const struct rd_kafka_metadata *md = NULL;
        long total = 0;
        int i, p;

        ck_assert_int_eq(rd_kafka_metadata(rk, 1, NULL, &md, 10000),
                         RD_KAFKA_RESP_ERR_NO_ERROR);
        for (i = 0; i < md->topic_cnt; i++) {
                if (strcmp(md->topics[i].topic, g_topic) != 0)
                        continue;
                for (p = 0; p < md->topics[i].partition_cnt; p++) {
                        int64_t lo = 0, hi = 0;

                        ck_assert_int_eq(rd_kafka_query_watermark_offsets(
                                             rk, g_topic,
                                             md->topics[i].partitions[p].id,
                                             &lo, &hi, 10000),
                                         RD_KAFKA_RESP_ERR_NO_ERROR);
                        total += (long)(hi - lo);
                }
        }
        rd_kafka_metadata_destroy(md);
        rd_kafka_destroy(rk);
        return total;
}

/* Read \p want messages of the test topic from the start, in order
 * (the topic has one partition, as the local broker creates it). */
static void topic_read(kmsg_t *msgs, int want)
{
        rd_kafka_t *rk = consumer_new();
        rd_kafka_topic_partition_list_t *parts;
        int64_t deadline = cq_now_ms() + 30000;
        int got = 0;

        parts = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(parts, g_topic, 0)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
        ck_assert_int_eq(rd_kafka_assign(rk, parts), 0);
        rd_kafka_topic_partition_list_destroy(parts);
        while (got < want && cq_now_ms() < deadline) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);

                if (!m)
                        continue;
                if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
                        msgs[got].key = strndup(m->key, m->key_len);
                        msgs[got].value = malloc(m->len + 1);
                        ck_assert_ptr_nonnull(msgs[got].value);
                        memcpy(msgs[got].value, m->payload, m->len);
                        msgs[got].value[m->len] = '\0';
                        msgs[got].len = m->len;
                        got++;
                }
                rd_kafka_message_destroy(m);
        }
        ck_assert_int_eq(got, want);
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
}

static void kmsgs_free(kmsg_t *msgs, int n)
{
        int i;

        for (i = 0; i < n; i++) {
                free(msgs[i].key);
                free(msgs[i].value);
        }
}

/* ---------------------------------------------------------------- tests */

START_TEST(submit_jsonl_messages_arrive_unchanged)
{
        /* Spacing, key order, unicode and escapes must survive byte for
         * byte: the value is the line as given, not a re-serialisation. */
        static const char *const lines[] = {
            "{\"job_id\":\"s1\",\"prompt\":\"add 1+1\",\"run_id\":\"r\"}",
            "{ \"prompt\" : \"caf\xc3\xa9 \\u00e9 \\\"q\\\"\",  \"job_id\": "
            "\"s2\", \"priority\": 7 }",
            "{\"job_id\":\"s3\",\"prompt\":\"\xe6\x97\xa5\xe6\x9c\xac\","
            "\"tests\":{\"kind\":\"code\",\"code\":\"assert True\"}}",
        };
        const char *file = tmp_path("jobs.jsonl");
        const char *args[] = {"submit", file, NULL};
        char text[1024];
        kmsg_t msgs[3];
        cli_run_t run;
        int i;

        /* a byte order mark, blank lines and a CRLF line end are not part
         * of any message */
        snprintf(text, sizeof(text), "\xef\xbb\xbf%s\n\n   \n%s\r\n%s",
                 lines[0], lines[1], lines[2]);
        cq_check_spit(file, text, strlen(text));
        cli(&run, NULL, args);
        ck_assert_msg(run.code == 0, "exit %d: %s", run.code, run.err);
        ck_assert_str_eq(run.out, "s1\ns2\ns3\n");
        ck_assert_str_eq(run.err, "read 3 jobs as JSON Lines\n");
        cli_release(&run);

        topic_read(msgs, 3);
        for (i = 0; i < 3; i++) {
                static const char *const keys[] = {"s1", "s2", "s3"};

                ck_assert_str_eq(msgs[i].key, keys[i]);
                ck_assert_uint_eq(msgs[i].len, strlen(lines[i]));
                ck_assert(memcmp(msgs[i].value, lines[i], msgs[i].len) == 0);
        }
        kmsgs_free(msgs, 3);
        ck_assert_int_eq(topic_count(), 3);

        /* the same through stdin */
        {
                const char *args2[] = {"submit", "-", NULL};
                const char *one = "{\"job_id\":\"s4\",\"prompt\":\"x\"}\n";

                cq_check_spit(tmp_path("one.jsonl"), one, strlen(one));
                cli(&run, tmp_path("one.jsonl"), args2);
                ck_assert_msg(run.code == 0, "%s", run.err);
                ck_assert_str_eq(run.out, "s4\n");
                ck_assert_str_eq(run.err, "read 1 job as JSON Lines\n");
                cli_release(&run);
                ck_assert_int_eq(topic_count(), 4);
        }
}
END_TEST

START_TEST(submit_invalid_line_sends_nothing)
{
        const char *text = "{\"job_id\":\"v1\",\"prompt\":\"ok\"}\n"
                           "{\"job_id\":\"v2\"}\n"
                           "not json at all\n"
                           "{\"job_id\":\"v1\",\"prompt\":\"again\"}\n"
                           "{\"job_id\":\"v3\",\"prompt\":\"ok too\"}\n";
        const char *file = tmp_path("bad.jsonl");
        const char *args[] = {"submit", file, NULL};
        const char *skip[] = {"submit", "--skip-invalid", file, NULL};
        cli_run_t run;

        cq_check_spit(file, text, strlen(text));
        cli(&run, NULL, args);
        ck_assert_int_eq(run.code, 1);
        ck_assert_str_eq(run.out, "");
        ck_assert_msg(strstr(run.err, " line 2: ") != NULL, "%s", run.err);
        ck_assert_msg(strstr(run.err, "\"prompt\"") != NULL, "%s", run.err);
        ck_assert_msg(strstr(run.err, " line 3: ") != NULL, "%s", run.err);
        ck_assert_msg(strstr(run.err, " line 4: duplicate job_id \"v1\" "
                                      "(first on line 1)") != NULL,
                      "%s", run.err);
        ck_assert_msg(strstr(run.err, "nothing sent: 3 invalid lines") != NULL,
                      "%s", run.err);
        ck_assert(strstr(run.err, " line 1:") == NULL);
        ck_assert(strstr(run.err, " line 5:") == NULL);
        cli_release(&run);
        ck_assert_int_eq(topic_count(), 0);

        /* --skip-invalid sends the good lines only */
        cli(&run, NULL, skip);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "v1\nv3\n");
        cli_release(&run);
        ck_assert_int_eq(topic_count(), 2);

        /* missing file and empty input */
        {
                const char *missing[] = {"submit", tmp_path("nope.jsonl"),
                                         NULL};
                const char *empty[] = {"submit", tmp_path("empty.jsonl"), NULL};

                cli(&run, NULL, missing);
                ck_assert_int_eq(run.code, 5);
                ck_assert_msg(strstr(run.err, "could not open") != NULL, "%s",
                              run.err);
                cli_release(&run);
                cq_check_spit(tmp_path("empty.jsonl"), "\n\n", 2);
                cli(&run, NULL, empty);
                ck_assert_int_eq(run.code, 1);
                ck_assert_msg(strstr(run.err, "no jobs in") != NULL, "%s",
                              run.err);
                cli_release(&run);
        }
}
END_TEST

/* A JSON array of jobs and one pretty-printed job (what coderq run
 * reads) are read as such, each job sent on one line with its strings and
 * numbers as written; a file of none of the three forms says where it
 * stops being one and what the forms are, and sends nothing. */
START_TEST(submit_reads_an_array_or_one_pretty_job)
{
        const char *array = "[\n"
                            "  {\"job_id\": \"a1\", \"prompt\": \"add  "
                            "two\", \"temperature\": 0.10},\n"
                            "  {\n"
                            "    \"job_id\": \"a2\",\n"
                            "    \"prompt\": \"say \\\"hi\\\"\\n\"\n"
                            "  }\n"
                            "]\n";
        const char *pretty = "{\n"
                             "  \"job_id\": \"o1\",\n"
                             "  \"prompt\": \"p\",\n"
                             "  \"limits\": {\n"
                             "    \"max_turns\": 3\n"
                             "  }\n"
                             "}\n";
        /* what `jq . jobs.jsonl` makes of two lines */
        const char *two = "{\n  \"job_id\": \"t1\",\n  \"prompt\": \"p\"\n}\n"
                          "{\n  \"job_id\": \"t2\",\n  \"prompt\": \"p\"\n}\n";
        const char *bad_item = "[{\"job_id\": \"b1\", \"prompt\": \"p\"},\n"
                               " {\"job_id\": \"b2\", \"promt\": \"p\"}]";
        const char *args[] = {"submit", tmp_path("array.json"), NULL};
        const char *obj_args[] = {"submit", tmp_path("job.json"), NULL};
        const char *two_args[] = {"submit", tmp_path("two.json"), NULL};
        const char *bad_args[] = {"submit", tmp_path("bad.json"), NULL};
        const char *skip_args[] = {"submit", "--skip-invalid",
                                   tmp_path("bad.json"), NULL};
        kmsg_t msgs[4];
        cli_run_t run;
        char want[512];

        cq_check_spit(tmp_path("array.json"), array, strlen(array));
        cq_check_spit(tmp_path("job.json"), pretty, strlen(pretty));
        cq_check_spit(tmp_path("two.json"), two, strlen(two));
        cq_check_spit(tmp_path("bad.json"), bad_item, strlen(bad_item));

        cli(&run, NULL, args);
        ck_assert_msg(run.code == 0, "exit %d: %s", run.code, run.err);
        ck_assert_str_eq(run.out, "a1\na2\n");
        ck_assert_str_eq(run.err, "read 2 jobs as a JSON array\n");
        cli_release(&run);
        cli(&run, NULL, obj_args);
        ck_assert_msg(run.code == 0, "exit %d: %s", run.code, run.err);
        ck_assert_str_eq(run.out, "o1\n");
        ck_assert_str_eq(run.err, "read 1 job (one JSON object)\n");
        cli_release(&run);
        topic_read(msgs, 3);
        ck_assert_str_eq(msgs[0].key, "a1");
        ck_assert_str_eq(msgs[0].value, "{\"job_id\":\"a1\",\"prompt\":\"add  "
                                        "two\",\"temperature\":0.10}");
        ck_assert_str_eq(msgs[1].key, "a2");
        ck_assert_str_eq(msgs[1].value, "{\"job_id\":\"a2\",\"prompt\":\"say "
                                        "\\\"hi\\\"\\n\"}");
        ck_assert_str_eq(msgs[2].key, "o1");
        ck_assert_str_eq(msgs[2].value, "{\"job_id\":\"o1\",\"prompt\":\"p\","
                                        "\"limits\":{\"max_turns\":3}}");
        kmsgs_free(msgs, 3);

        /* none of the three: one line, where and what is accepted */
        cli(&run, NULL, two_args);
        ck_assert_int_eq(run.code, 1);
        ck_assert_str_eq(run.out, "");
        snprintf(want, sizeof(want),
                 "coderq: %s line 5 column 1: end of file expected near "
                 "'{'; a jobs file is JSON Lines (a job per line), a JSON "
                 "array of jobs, or one job as one JSON object\n",
                 tmp_path("two.json"));
        ck_assert_str_eq(run.err, want);
        cli_release(&run);

        /* an invalid item: named by its line and place, nothing sent */
        cli(&run, NULL, bad_args);
        ck_assert_int_eq(run.code, 1);
        ck_assert_str_eq(run.out, "");
        ck_assert_msg(strstr(run.err, "read 2 jobs as a JSON array\n") ==
                          run.err,
                      "%s", run.err);
        snprintf(want, sizeof(want), "coderq: %s line 2, item 2: unknown ",
                 tmp_path("bad.json"));
        ck_assert_msg(strstr(run.err, want), "%s", run.err);
        ck_assert_msg(strstr(run.err, "nothing sent: 1 invalid item in "), "%s",
                      run.err);
        cli_release(&run);
        ck_assert_int_eq(topic_count(), 3);
        cli(&run, NULL, skip_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "b1\n");
        cli_release(&run);
        ck_assert_int_eq(topic_count(), 4);
}
END_TEST

START_TEST(submit_from_flags)
{
        const char *args[] = {"submit",   "--prompt",   "add, \"two\"",
                              "--job-id", "f1",         "--title=Adding",
                              "--run-id", "rf",         "--task-id",
                              "t9",       "--priority", "5",
                              "--model",  "m-1",        "--parent",
                              "p0",       NULL};
        const char *gen[] = {"submit", "--prompt", "hello", NULL};
        const char *bad[][8] = {
            {"submit", "--prompt", "x", "--priority", "high", NULL},
            {"submit", "--prompt", "x", "--job-id", "has space", NULL},
            {"submit", NULL},
            {"submit", "f.jsonl", "--prompt", "x", NULL},
            {"submit", "--prompt", NULL},
            {"submit", "--prompt", "x", "--timeout", "5", NULL},
            {"submit", "--bogus", NULL},
        };
        kmsg_t msgs[2];
        json_t *doc;
        cli_run_t run;
        size_t i;

        cli(&run, NULL, args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "f1\n");
        cli_release(&run);
        cli(&run, NULL, gen);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_uint_eq(strlen(run.out), 37); /* uuid + newline */
        ck_assert_int_eq(run.out[14], '4');
        ck_assert_int_eq(run.out[8], '-');

        topic_read(msgs, 2);
        ck_assert_str_eq(msgs[0].key, "f1");
        ck_assert_str_eq(msgs[0].value,
                         "{\"job_id\":\"f1\",\"prompt\":\"add, "
                         "\\\"two\\\"\",\"title\":\"Adding\",\"task_id\":"
                         "\"t9\",\"run_id\":\"rf\",\"parent_job_id\":\"p0\","
                         "\"model\":\"m-1\",\"priority\":5}");
        run.out[36] = '\0';
        ck_assert_str_eq(msgs[1].key, run.out);
        doc = json_loads(msgs[1].value, 0, NULL);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "job_id")),
                         run.out);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "prompt")),
                         "hello");
        json_decref(doc);
        kmsgs_free(msgs, 2);
        cli_release(&run);

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                cli(&run, NULL, bad[i]);
                ck_assert_msg(run.code == 2, "case %zu: exit %d", i, run.code);
                ck_assert_str_eq(run.out, "");
                /* one line, prefixed */
                ck_assert_msg(strncmp(run.err, "coderq: ", 8) == 0 &&
                                  strchr(run.err, '\n') ==
                                      run.err + strlen(run.err) - 1,
                              "case %zu: [%s]", i, run.err);
                cli_release(&run);
        }
        ck_assert_int_eq(topic_count(), 2);
}
END_TEST

/* Two jobs of run r1 finished, one queued, with pinned durations. */
static void make_run(cq_store_t *store)
{
        fin_args_t ok = {"succeeded", NULL, "two", 2,
                         2,           3,    1,     100,
                         50,          NULL, 1500,  "bwrap+uid-per-kernel"};
        fin_args_t bad = {"failed", "bad, \"quoted\" value",
                          NULL,     0,
                          2,        5,
                          2,        200,
                          100,      NULL,
                          2500,     "off"};

        add_job(store, "{\"job_id\":\"j1\",\"prompt\":\"p\",\"run_id\":\"r1\","
                       "\"title\":\"First\"}");
        add_job(store, "{\"job_id\":\"j2\",\"prompt\":\"p\",\"run_id\":\"r1\","
                       "\"title\":\"Second, \\\"quoted\\\"\"}");
        add_job(store,
                "{\"job_id\":\"j3\",\"prompt\":\"p\",\"run_id\":\"r1\"}");
        claim(store, "j1");
        claim(store, "j2");
        finish(store, "j1", &ok);
        finish(store, "j2", &bad);
        /* j1 was finished from memory; j2's model had a hint from j0 */
        qexec("UPDATE results SET report = report || '{\"from_memory\": true, "
              "\"memory_source_job\": \"j0\"}' WHERE job_id = $1",
              "j1");
        qexec("UPDATE results SET report = report || '{\"from_memory\": "
              "false, \"memory_source_job\": \"j0\"}' WHERE job_id = $1",
              "j2");
}

START_TEST(results_table_json_csv)
{
        cq_store_t *store = store_for("w1");
        const char *csv_args[] = {"results",  "--run", "r1",
                                  "--format", "csv",   NULL};
        const char *json_args[] = {"results", "--run=r1", "--format=json",
                                   NULL};
        const char *table_args[] = {"results", NULL};
        const char *none[] = {"results", "--run", "nope", NULL};
        const char *badfmt[] = {"results", "--format", "xml", NULL};
        json_t *got, *want = NULL;
        cli_run_t run;

        cli(&run, NULL, table_args);
        ck_assert_int_eq(run.code, 5); /* no runs yet */
        ck_assert_str_eq(run.err, "coderq: no runs yet: no job has a run_id\n");
        cli_release(&run);

        make_run(store);
        /* times pinned, so every column is known */
        qexec("UPDATE jobs SET created_at = '2025-01-01 00:00:00+00'::"
              "timestamptz + make_interval(secs => right(job_id, 1)::int),"
              " finished_at = CASE WHEN finished_at IS NOT NULL THEN "
              "'2025-01-01 00:10:00+00'::timestamptz END,"
              " started_at = CASE WHEN finished_at IS NOT NULL THEN "
              "'2025-01-01 00:10:00+00'::timestamptz - (finished_at - "
              "started_at) END WHERE run_id = $1",
              "r1");
        cli(&run, NULL, csv_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(
            run.out,
            "job_id,title,status,reason,reason_code,attempts,turns,retries,"
            "tests_passed,tests_total,prompt_tokens,completion_tokens,"
            "cache_read_tokens,cache_creation_tokens,total_tokens,cost_usd,"
            "duration_ms,from_memory,memory_source_job,sandbox,retry_of,"
            "run_attempt,latest,created_at,started_at,finished_at,model,"
            "provider,temperature,top_p,seed,max_tokens,system_prompt_sha256,"
            "coderq_version,backend,python,packages\r\n"
            "j1,First,succeeded,,,1,3,1,2,2,100,50,0,0,150,0,1500,true,j0,"
            "bwrap+uid-per-kernel,,1,true,2025-01-01T00:00:01+00:00,"
            "2025-01-01T00:09:58.5+00:00,2025-01-01T00:10:00+00:00,,,,,,,,,,,"
            "\r\n"
            "j2,\"Second, \"\"quoted\"\"\",failed,\"bad, \"\"quoted\"\" "
            "value\",other,1,5,2,0,2,200,100,0,0,300,0,2500,false,j0,off,,1,"
            "true,2025-01-01T00:00:02+00:00,2025-01-01T00:09:57.5+00:00,"
            "2025-01-01T00:10:00+00:00,,,,,,,,,,,\r\n"
            "j3,,queued,,,0,0,0,,,0,0,0,0,0,0,,,,,,1,true,"
            "2025-01-01T00:00:03+00:00,,,,,,,,,,,,,\r\n");
        cli_release(&run);

        cli(&run, NULL, json_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        got = json_loads(run.out, 0, NULL);
        ck_assert_ptr_nonnull(got);
        ck_assert_int_eq(cq_store_run_results(store, "r1", &want), CQ_OK);
        ck_assert(json_is_array(got));
        ck_assert_uint_eq(json_array_size(got), 3);
        ck_assert(json_equal(got, want));
        ck_assert_str_eq(json_string_value(
                             json_object_get(json_array_get(got, 1), "reason")),
                         "bad, \"quoted\" value");
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(got, 0), "sandbox")),
                         "bwrap+uid-per-kernel");
        ck_assert(
            json_is_null(json_object_get(json_array_get(got, 2), "sandbox")));
        json_decref(got);
        json_decref(want);
        cli_release(&run);

        /* without --run: the newest run */
        cli(&run, NULL, table_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(
            run.out,
            "run r1\n"
            "JOB  STATUS     TESTS  TURNS  RETRIES  TOKENS  COST  DURATION  "
            "MEMORY   TITLE             REASON\n"
            "j1   succeeded    2/2      3        1     150    $0      1.5s  "
            "from j0  First             -\n"
            "j2   failed       0/2      5        2     300    $0      2.5s  "
            "hint j0  Second, \"quoted\"  bad, \"quoted\" value\n"
            "j3   queued         -      0        0       0    $0         -  "
            "-        -                 -\n"
            "3 jobs: 1 succeeded (1 from memory), 1 failed, 0 cancelled, 1 "
            "pending; 0 retried; pass rate 50.0%; mean 4.00 turns, 1.50 "
            "retries; 450 tokens; cost $0; duration p50 2.0s, p95 2.4s\n");
        cli_release(&run);

        /* a newer run becomes the default */
        add_job(store,
                "{\"job_id\":\"k1\",\"prompt\":\"p\",\"run_id\":\"r2\"}");
        cli(&run, NULL, table_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert(strncmp(run.out, "run r2\n", 7) == 0);
        ck_assert_ptr_null(strstr(run.out, "j1"));
        cli_release(&run);

        cli(&run, NULL, none);
        ck_assert_int_eq(run.code, 5);
        ck_assert_str_eq(run.err, "coderq: no jobs in run \"nope\"\n");
        cli_release(&run);
        cli(&run, NULL, badfmt);
        ck_assert_int_eq(run.code, 2);
        cli_release(&run);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(status_lines_and_json)
{
        cq_store_t *store = store_for("w1");
        const char *args[] = {"status", "j2", NULL};
        const char *json_args[] = {"status", "j2", "--json", NULL};
        const char *none[] = {"status", "nope", NULL};
        const char *outbox[] = {"status", "--outbox", NULL};
        const char *both[] = {"status", "j2", "--outbox", NULL};
        json_t *want = NULL, *got, *events;
        const char *key;
        json_t *value;
        char line[512];
        cli_run_t run;
        size_t width = 0;

        make_run(store);
        ck_assert_int_eq(cq_store_job_status(store, "j2", &want), CQ_OK);
        cli(&run, NULL, args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        json_object_foreach(want, key, value) if (strlen(key) > width) width =
            strlen(key);
        if (width < strlen("event_attempts"))
                width = strlen("event_attempts");
        /* every column, in view order, value aligned after the colon */
        {
                char *p = run.out;

                json_object_foreach(want, key, value)
                {
                        char *nl = strchr(p, '\n');
                        char val[256];

                        ck_assert_ptr_nonnull(nl);
                        if (json_is_null(value))
                                snprintf(val, sizeof(val), "-");
                        else if (json_is_string(value))
                                snprintf(val, sizeof(val), "%s",
                                         json_string_value(value));
                        else if (json_is_integer(value))
                                snprintf(val, sizeof(val),
                                         "%" JSON_INTEGER_FORMAT,
                                         json_integer_value(value));
                        else if (json_is_boolean(value))
                                snprintf(val, sizeof(val), "%s",
                                         json_is_true(value) ? "true"
                                                             : "false");
                        else
                                snprintf(val, sizeof(val), "%.15g",
                                         json_number_value(value));
                        snprintf(line, sizeof(line), "%s:%*s%s", key,
                                 (int)(width + 1 - strlen(key)), "", val);
                        ck_assert_msg(strncmp(p, line, strlen(line)) == 0 &&
                                          p + strlen(line) == nl,
                                      "got [%.*s] want [%s]", (int)(nl - p), p,
                                      line);
                        p = nl + 1;
                }
                /* then its completion event, not sent yet */
                snprintf(line, sizeof(line), "event:%*spending\n",
                         (int)(width + 1 - strlen("event")), "");
                ck_assert_msg(strncmp(p, line, strlen(line)) == 0, "got [%s]",
                              p);
                p += strlen(line);
                snprintf(line, sizeof(line), "event_attempts:%*s0\n",
                         (int)(width + 1 - strlen("event_attempts")), "");
                ck_assert_str_eq(p, line);
        }
        ck_assert_ptr_nonnull(strstr(run.out, "\nstatus:"));
        snprintf(line, sizeof(line), "\nreason:%*sbad, \"quoted\" value\n",
                 (int)(width + 1 - strlen("reason")), "");
        ck_assert_msg(strstr(run.out, line), "%s", run.out);
        /* the sandbox its code ran in, then what else it ran with, last
         * of the job's own lines, before its completion event */
        snprintf(line, sizeof(line), "\nsandbox:%*soff\nprovider:",
                 (int)(width + 1 - strlen("sandbox")), "");
        ck_assert_msg(strstr(run.out, line), "%s", run.out);
        snprintf(line, sizeof(line), "\npackages:%*s-\nevent:",
                 (int)(width + 1 - strlen("packages")), "");
        ck_assert_msg(strstr(run.out, line), "%s", run.out);
        cli_release(&run);

        cli(&run, NULL, json_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        got = json_loads(run.out, 0, NULL);
        events = json_object_get(got, "events");
        ck_assert_uint_eq(json_array_size(events), 1);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(events, 0), "state")),
                         "pending");
        ck_assert_int_eq(json_object_del(got, "events"), 0);
        ck_assert(json_equal(got, want));
        json_decref(got);
        cli_release(&run);
        json_decref(want);

        cli(&run, NULL, outbox);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert(strncmp(run.out, "pending:        ", 16) == 0);
        ck_assert_ptr_nonnull(strstr(run.out, "\nfailed:         0\n"));
        cli_release(&run);
        cli(&run, NULL, both);
        ck_assert_int_eq(run.code, 2);
        cli_release(&run);

        cli(&run, NULL, none);
        ck_assert_int_eq(run.code, 5);
        ck_assert_str_eq(run.out, "");
        ck_assert_str_eq(run.err, "coderq: no job \"nope\"\n");
        cli_release(&run);
        cq_store_destroy(&store);
}
END_TEST

static bool ends_with(const char *s, const char *end)
{
        size_t n = strlen(s), k = strlen(end);

        return n >= k && strcmp(s + n - k, end) == 0;
}

/* The depth of the queues: every queue in `coderq status` (no job, or
 * --queue-depth) as a table or JSON, the queues of a run's jobs in
 * `coderq results --summary` as a table, JSON or CSV columns. */
START_TEST(queue_depth_in_status_and_summary)
{
        cq_store_t *store = store_for("w1");
        const char *status[] = {"status", NULL};
        const char *depth_json[] = {"status", "--queue-depth", "--json", NULL};
        const char *bad[][4] = {{"status", "--queue-depth", "d1", NULL},
                                {"status", "--queue-depth", "--outbox", NULL}};
        const char *table_args[] = {"results", "--run", "r5", "--summary",
                                    NULL};
        const char *json_args[] = {"results",   "--run",         "r5",
                                   "--summary", "--format=json", NULL};
        const char *csv_args[] = {"results",  "--run", "r5", "--summary",
                                  "--format", "csv",   NULL};
        json_t *got, *want;
        cli_run_t run;
        size_t i;

        cli(&run, NULL, status);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "no queue holds a queued or running job\n");
        cli_release(&run);
        cli(&run, NULL, depth_json);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "[]\n");
        cli_release(&run);

        /* run r5: d1 running and d2 queued in default, g1 queued and g2
         * held back in gpu; x1, of no run, queued in other-team */
        add_job(store, "{\"job_id\":\"d1\",\"prompt\":\"p\",\"run_id\":"
                       "\"r5\"}");
        add_job(store, "{\"job_id\":\"d2\",\"prompt\":\"p\",\"run_id\":"
                       "\"r5\"}");
        add_job(store, "{\"job_id\":\"g1\",\"prompt\":\"p\",\"run_id\":"
                       "\"r5\",\"queue\":\"gpu\"}");
        add_job(store, "{\"job_id\":\"g2\",\"prompt\":\"p\",\"run_id\":"
                       "\"r5\",\"queue\":\"gpu\"}");
        add_job(store, "{\"job_id\":\"x1\",\"prompt\":\"p\",\"queue\":"
                       "\"other-team\"}");
        claim(store, "d1");
        qexec("UPDATE jobs SET run_after = now() + interval '1 hour'"
              " WHERE job_id = $1",
              "g2");

        cli(&run, NULL, status);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "QUEUE       QUEUED  WAITING  RUNNING\n"
                                  "default          1        0        1\n"
                                  "gpu              1        1        0\n"
                                  "other-team       1        0        0\n");
        cli_release(&run);
        want = json_pack("[{s:s, s:i, s:i, s:i}, {s:s, s:i, s:i, s:i},"
                         " {s:s, s:i, s:i, s:i}]",
                         "queue", "default", "queued", 1, "waiting", 0,
                         "running", 1, "queue", "gpu", "queued", 1, "waiting",
                         1, "running", 0, "queue", "other-team", "queued", 1,
                         "waiting", 0, "running", 0);
        cli(&run, NULL, depth_json);
        ck_assert_msg(run.code == 0, "%s", run.err);
        got = json_loads(run.out, 0, NULL);
        ck_assert_msg(json_equal(got, want), "%s", run.out);
        /* the keys in the documented order */
        ck_assert_ptr_nonnull(strstr(run.out, "\"queue\": \"gpu\",\n    "
                                              "\"queued\": 1,\n    "
                                              "\"waiting\": 1,\n    "
                                              "\"running\": 0\n"));
        json_decref(got);
        cli_release(&run);
        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                cli(&run, NULL, bad[i]);
                ck_assert_int_eq(run.code, 2);
                ck_assert_str_eq(run.out, "");
                ck_assert_str_eq(run.err, "coderq: status takes one of a job "
                                          "id, --outbox and --queue-depth\n");
                cli_release(&run);
        }

        /* the summary: the run's queues only (other-team is not one),
         * last */
        cli(&run, NULL, table_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_msg(ends_with(run.out, "\n\nthe queues of the run's jobs, "
                                         "with every job they hold:\n"
                                         "QUEUE    QUEUED  WAITING  RUNNING\n"
                                         "default       1        0        1\n"
                                         "gpu           1        1        "
                                         "0\n"),
                      "%s", run.out);
        cli_release(&run);
        cli(&run, NULL, json_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        got = json_loads(run.out, 0, NULL);
        ck_assert_int_eq(json_array_remove(want, 2), 0);
        ck_assert_msg(json_equal(json_object_get(got, "queues"), want), "%s",
                      run.out);
        ck_assert_double_eq(json_number_value(json_object_get(
                                json_object_get(got, "total"), "jobs")),
                            4);
        json_decref(got);
        cli_release(&run);
        cli(&run, NULL, csv_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_msg(strstr(run.out, ",hidden_total,queue_default_queued,"
                                      "queue_default_waiting,"
                                      "queue_default_running,"
                                      "queue_gpu_queued,queue_gpu_waiting,"
                                      "queue_gpu_running\r\nr5,latest,model,,"
                                      "4,"),
                      "%s", run.out);
        ck_assert_msg(strstr(run.out, ",1,0,1,1,1,0\r\nr5,latest,total,,4,"),
                      "%s", run.out);
        ck_assert_msg(ends_with(run.out, ",1,0,1,1,1,0\r\n"), "%s", run.out);
        cli_release(&run);
        json_decref(want);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(export_writes_notebook_images_answer)
{
        cq_store_t *store = store_for("w1");
        const char *out_dir = tmp_path("exp");
        const char *args[] = {"export", "e1", "--out", out_dir, NULL};
        const char *none[] = {"export", "nope", "--out", out_dir, NULL};
        static const unsigned char img_a[] = {0x89, 'P', 'N', 'G', 0,    0,
                                              1,    2,   0,   255, '\n', '\r'};
        static const unsigned char img_b[] = {0x89, 'P', 'N', 'G', 7, 0, 7};
        static const unsigned char img_c[] = {0, 0, 0, 'e', 'v', 'i', 'l'};
        static const unsigned char img_d[] = {'n', 'o', 'n', 'a', 'm', 'e'};
        struct {
                const char *name;
                const unsigned char *data;
                size_t len;
                const char *file;
        } imgs[] = {
            {"plot.png", img_a, sizeof(img_a), "plot.png"},
            {"plot.png", img_b, sizeof(img_b), "plot-2.png"},
            {"../../evil.png", img_c, sizeof(img_c), "evil.png"},
            {"..", img_d, sizeof(img_d), NULL},
            /* the bytes of the first under a name of their own: the file
             * the code saved of a figure it showed */
            {"revenue.png", img_a, sizeof(img_a), "revenue.png"},
        };
        fin_args_t ok = {
            "succeeded", NULL, "The answer is **42**.", 2, 2, 3, 0, 10, 5, NULL,
            1000,        NULL};
        cq_cell_result_t res;
        cq_nb_t *nb;
        char *want_nb, *got_nb, *want_paths = NULL, sha[65], name[160],
                                cmd[600], *answer;
        size_t want_len, got_len, i;
        cli_run_t run;

        add_job(store, "{\"job_id\":\"e1\",\"prompt\":\"plot\",\"title\":"
                       "\"Plot job\"}");
        claim(store, "e1");
        nb = cq_nb_new(NULL);
        ck_assert_ptr_nonnull(nb);
        ck_assert_int_eq(cq_nb_add_heading(nb, "Plot job"), 0);
        ck_assert_int_eq(cq_nb_add_markdown(nb, "caf\xc3\xa9 \xe6\x97\xa5 "
                                                "\x01 \"quotes\" \\ back"),
                         0);
        cq_cell_result_init(&res);
        res.execution_count = 1;
        res.outputs = json_pack(
            "[{s:s, s:s, s:s}, {s:s, s:{s:s, s:s}, s:{}}]", "output_type",
            "stream", "name", "stdout", "text", "h\xc3\xa9\nline2\n",
            "output_type", "display_data", "data", "image/png",
            "iVBORw0KGgo=\n", "text/plain", "<Figure>", "metadata");
        ck_assert_int_eq(cq_nb_add_code(nb, "print('h\xc3\xa9')", &res), 0);
        cq_cell_result_release(&res);
        for (i = 0; i < CQ_ARRAY_SIZE(imgs); i++)
                ck_assert_msg(cq_store_put_image(store, "e1", imgs[i].name,
                                                 "image/png", imgs[i].data,
                                                 imgs[i].len, 1, sha,
                                                 NULL) == CQ_OK,
                              "%s", cq_store_errmsg(store));
        /* a name with nothing safe left is named after its digest */
        cq_sha256_hex(img_d, sizeof(img_d), sha);
        snprintf(name, sizeof(name), "image-%.12s.png", sha);
        imgs[3].file = name;
        ok.nb = cq_nb_json(nb);
        finish(store, "e1", &ok);
        want_nb = cq_nb_dumps(nb, &want_len);

        cli(&run, NULL, args);
        ck_assert_msg(run.code == 0, "exit %d: %s", run.code, run.err);
        ck_assert_str_eq(run.err, "");
        /* every path written, one per line */
        {
                cq_buf_t buf;

                cq_buf_init(&buf, 1 << 20);
                ck_assert_int_eq(
                    cq_buf_printf(&buf, "%s/notebook.ipynb\n", out_dir), CQ_OK);
                for (i = 0; i < CQ_ARRAY_SIZE(imgs); i++)
                        ck_assert_int_eq(cq_buf_printf(&buf, "%s/images/%s\n",
                                                       out_dir, imgs[i].file),
                                         CQ_OK);
                ck_assert_int_eq(cq_buf_printf(&buf, "%s/answer.md\n", out_dir),
                                 CQ_OK);
                want_paths = cq_buf_take(&buf, NULL);
        }
        ck_assert_str_eq(run.out, want_paths);
        free(want_paths);
        cli_release(&run);

        got_nb = cq_check_slurp(tmp_path("exp/notebook.ipynb"), &got_len);
        ck_assert_uint_eq(got_len, want_len);
        ck_assert(memcmp(got_nb, want_nb, want_len) == 0);
        free(got_nb);
        free(want_nb);
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 -c 'import nbformat,sys; "
                 "nbformat.validate(nbformat.read(sys.argv[1], "
                 "as_version=4))' '%s/notebook.ipynb'",
                 out_dir);
        ck_assert_int_eq(system(cmd), 0);

        for (i = 0; i < CQ_ARRAY_SIZE(imgs); i++) {
                char path[400];
                size_t len;
                char *data;

                snprintf(path, sizeof(path), "%s/images/%s", out_dir,
                         imgs[i].file);
                data = cq_check_slurp(path, &len);
                ck_assert_uint_eq(len, imgs[i].len);
                ck_assert(memcmp(data, imgs[i].data, len) == 0);
                free(data);
        }
        ck_assert_int_ne(access(tmp_path("evil.png"), F_OK), 0);

        answer = cq_check_slurp(tmp_path("exp/answer.md"), NULL);
        ck_assert_str_eq(answer, "# Plot job\n\n"
                                 "**Job:** `e1` \xc2\xb7 **Status:** succeeded "
                                 "\xc2\xb7 **Tests:** 2/2 passed \xc2\xb7 "
                                 "**Reason:** none\n\n"
                                 "The answer is **42**.\n");
        free(answer);

        /* exporting again overwrites in place */
        cli(&run, NULL, args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        cli_release(&run);

        cli(&run, NULL, none);
        ck_assert_int_eq(run.code, 5);
        ck_assert_str_eq(run.err, "coderq: no job \"nope\"\n");
        cli_release(&run);
        cq_nb_destroy(&nb);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(cancel_queued_running_finished)
{
        cq_store_t *store = store_for("w1");
        const char *q[] = {"cancel", "cq", NULL};
        const char *r[] = {"cancel", "cr", NULL};
        const char *f[] = {"cancel", "cf", NULL};
        const char *none[] = {"cancel", "nope", NULL};
        fin_args_t ok = {"succeeded", NULL, "a", -1,   0, 1,
                         0,           1,    1,   NULL, 0, NULL};
        json_t *row = NULL;
        cli_run_t run;

        add_job(store, "{\"job_id\":\"cf\",\"prompt\":\"p\"}");
        add_job(store, "{\"job_id\":\"cr\",\"prompt\":\"p\"}");
        add_job(store, "{\"job_id\":\"cq\",\"prompt\":\"p\"}");
        claim(store, "cf");
        claim(store, "cr");
        finish(store, "cf", &ok);

        cli(&run, NULL, q);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "cq: cancelled\n");
        cli_release(&run);
        ck_assert_int_eq(cq_store_job_status(store, "cq", &row), CQ_OK);
        ck_assert_str_eq(json_string_value(json_object_get(row, "status")),
                         "cancelled");
        json_decref(row);

        cli(&run, NULL, r);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out, "cr: cancel requested; the worker will stop "
                                  "it at its next turn or cell\n");
        cli_release(&run);
        ck_assert_int_eq(cq_store_job_status(store, "cr", &row), CQ_OK);
        ck_assert_str_eq(json_string_value(json_object_get(row, "status")),
                         "running");
        ck_assert(json_is_true(json_object_get(row, "cancel_requested")));
        json_decref(row);

        cli(&run, NULL, f);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_str_eq(run.out,
                         "cf: already finished with status succeeded\n");
        cli_release(&run);

        cli(&run, NULL, none);
        ck_assert_int_eq(run.code, 5);
        ck_assert_str_eq(run.err, "coderq: no job \"nope\"\n");
        cli_release(&run);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(submit_wait_follows_jobs_to_the_end)
{
        cq_store_t *store = store_for("w1");
        const char *text = "{\"job_id\":\"w1\",\"prompt\":\"p\"}\n"
                           "{\"job_id\":\"w2\",\"prompt\":\"p\"}\n";
        const char *file = tmp_path("wait.jsonl");
        const char *args[] = {"submit",    file,  "--wait",
                              "--timeout", "120", NULL};
        fin_args_t ok = {"succeeded", NULL, "a", 1,    1, 2,
                         0,           1,    1,   NULL, 0, NULL};
        fin_args_t bad = {"failed", "boom", NULL, 0,    1, 4,
                          3,        1,      1,    NULL, 0, NULL};
        struct timespec ts = {1, 500000000L};
        cli_run_t run;

        cq_check_spit(file, text, strlen(text));
        /* w1 is already running, w2 not yet in PostgreSQL (pending) */
        add_job(store, "{\"job_id\":\"w1\",\"prompt\":\"p\"}");
        claim(store, "w1");
        cli_start(&run, NULL, args);
        nanosleep(&ts, NULL);
        ck_assert_int_eq(waitpid(run.pid, NULL, WNOHANG), 0); /* waiting */
        finish(store, "w1", &ok);
        add_job(store, "{\"job_id\":\"w2\",\"prompt\":\"p\"}");
        claim(store, "w2");
        nanosleep(&ts, NULL);
        ck_assert_int_eq(waitpid(run.pid, NULL, WNOHANG), 0); /* still */
        finish(store, "w2", &bad);
        cli_finish(&run);
        ck_assert_msg(run.code == 1, "exit %d: %s", run.code, run.err);
        ck_assert_msg(strncmp(run.out, "w1\nw2\nJOB ", 10) == 0, "%s", run.out);
        ck_assert_msg(strstr(run.out, "\nw1   succeeded    1/1      2") != NULL,
                      "%s", run.out);
        ck_assert_msg(strstr(run.out, "\nw2   failed       0/1      4") != NULL,
                      "%s", run.out);
        ck_assert_msg(strstr(run.out, "boom\n") != NULL, "%s", run.out);
        /* progress lines (stderr is no TTY: plain lines). Which
         * intermediate counts it shows depends on when its first poll
         * lands (the machine may be busy), so only the last is exact. */
        ck_assert_msg(strstr(run.err,
                             "[########################] 2/2 done  "
                             "1 ok 1 failed  0 running  0 queued\n") != NULL,
                      "%s", run.err);
        ck_assert_msg(strstr(run.err, "coderq: 1 of 2 jobs failed or were "
                                      "cancelled\n") != NULL,
                      "%s", run.err);
        ck_assert(strchr(run.err, '\r') == NULL);
        cli_release(&run);

        /* all succeeded: exit 0 */
        {
                const char *t2 = "{\"job_id\":\"w3\",\"prompt\":\"p\"}\n";
                const char *f2 = tmp_path("wait2.jsonl");
                const char *a2[] = {"submit", "--wait", f2, NULL};

                cq_check_spit(f2, t2, strlen(t2));
                add_job(store, "{\"job_id\":\"w3\",\"prompt\":\"p\"}");
                claim(store, "w3");
                finish(store, "w3", &ok);
                cli(&run, NULL, a2);
                ck_assert_msg(run.code == 0, "exit %d: %s", run.code, run.err);
                ck_assert(strncmp(run.out, "w3\nJOB ", 7) == 0);
                cli_release(&run);
        }
        /* nobody runs it: the timeout ends the wait with exit 1 */
        {
                const char *a3[] = {"submit",    "--prompt", "p",
                                    "--job-id",  "w4",       "--wait",
                                    "--timeout", "1",        NULL};

                cli(&run, NULL, a3);
                ck_assert_int_eq(run.code, 1);
                ck_assert_msg(strstr(run.out, "w4   not yet in PostgreSQL") !=
                                  NULL,
                              "%s", run.out);
                ck_assert_msg(strstr(run.err,
                                     "coderq: timed out after 1s: 1 "
                                     "of 1 jobs have not finished\n") != NULL,
                              "%s", run.err);
                cli_release(&run);
        }
        ck_assert_int_eq(topic_count(), 4);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(unreachable_services_exit_4)
{
        const char *st[] = {"status", "x", NULL};
        cli_run_t run;

        setenv("CODERQ_PG_DSN", "postgresql://nobody@127.0.0.1:1/none", 1);
        cli(&run, NULL, st);
        ck_assert_int_eq(run.code, 4);
        ck_assert_msg(strncmp(run.err, "coderq: ", 8) == 0 &&
                          strchr(run.err, '\n') ==
                              run.err + strlen(run.err) - 1,
                      "[%s]", run.err);
        cli_release(&run);
}
END_TEST

/* A reason a job's code controls (the last cell error) reaches the
 * terminal harmless: `status` escapes it on its line, the `results`
 * table shows C1 and bidi controls as U+FFFD and keeps its columns. */
START_TEST(status_and_results_escape_what_jobs_say)
{
        cq_store_t *store = store_for("w1");
        const char *status_args[] = {"status", "jx", NULL};
        const char *results_args[] = {"results", "--run", "rx", NULL};
        fin_args_t bad = {"failed",
                          "E: \x1b[2K\xc2\x9b"
                          "1A\xe2\x80\xae\nok",
                          NULL,
                          0,
                          0,
                          1,
                          0,
                          10,
                          5,
                          NULL,
                          100,
                          "off"};
        cli_run_t run;

        add_job(store,
                "{\"job_id\":\"jx\",\"prompt\":\"p\",\"run_id\":\"rx\"}");
        claim(store, "jx");
        finish(store, "jx", &bad);
        cli(&run, NULL, status_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_msg(strstr(run.out, " E: \\x1b[2K\\u009b1A\\u202e\\nok\n"),
                      "%s", run.out);
        ck_assert_ptr_null(strstr(run.out, "\xc2\x9b"));
        ck_assert_ptr_null(strstr(run.out, "\xe2\x80\xae"));
        cli_release(&run);
        cli(&run, NULL, results_args);
        ck_assert_msg(run.code == 0, "%s", run.err);
        ck_assert_msg(strstr(run.out, "E:  [2K\xef\xbf\xbd"
                                      "1A\xef\xbf\xbd ok"),
                      "%s", run.out);
        ck_assert_ptr_null(strchr(run.out, 0x1b));
        ck_assert_ptr_null(strstr(run.out, "\xc2\x9b"));
        ck_assert_ptr_null(strstr(run.out, "\xe2\x80\xae"));
        cli_release(&run);
        cq_store_destroy(&store);
}
END_TEST

static Suite *it_cli_cmds_suite(void)
{
        Suite *s = suite_create("it_cli_cmds");
        TCase *tc = tcase_create("core");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, submit_jsonl_messages_arrive_unchanged);
        tcase_add_test(tc, submit_invalid_line_sends_nothing);
        tcase_add_test(tc, submit_reads_an_array_or_one_pretty_job);
        tcase_add_test(tc, submit_from_flags);
        tcase_add_test(tc, results_table_json_csv);
        tcase_add_test(tc, status_lines_and_json);
        tcase_add_test(tc, status_and_results_escape_what_jobs_say);
        tcase_add_test(tc, queue_depth_in_status_and_summary);
        tcase_add_test(tc, export_writes_notebook_images_answer);
        tcase_add_test(tc, cancel_queued_running_finished);
        tcase_add_test(tc, submit_wait_follows_jobs_to_the_end);
        tcase_add_test(tc, unreachable_services_exit_4);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_cli_cmds_suite)
