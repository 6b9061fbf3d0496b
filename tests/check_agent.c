/* SPDX-License-Identifier: MIT */
/* check_agent.c - the reflection loop end to end with the fake LLM server
 * (tests/fakes/fake_llm.py, scripts registered per test), run twice: on a
 * real local ipykernel and on the E2B backend against its double
 * (tests/fakes/fake_e2b.py, itself backed by real kernels). Each test
 * asserts on the loop's result, the history it built and the requests
 * the fake recorded. */
#include <curl/curl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/agent/agent.h"
#include "coderq/local/kpool.h"
#include "coderq/agent/llm.h"
#include "coderq/agent/notebook.h"
#include "coderq/common/prices.h"
#include "coderq/common/util.h"
#include "support/cells.h"
#include "support/fake_e2b.h"
#include "support/fake_llm.h"

static cq_fake_llm_t *fake;
static cq_fake_e2b_t e2b;
static bool on_e2b; /* the loop index of each test: 0 local, 1 e2b */

static const char *const backends[] = {"local", "e2b"};

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        fake = cq_fake_llm_start(NULL);
        ck_assert_msg(fake != NULL, "could not start the fake LLM");
        ck_assert_msg(cq_fake_e2b_start(&e2b, 1.0) == 0,
                      "could not start the E2B double");
}

static void teardown(void)
{
        /* Every sandbox was killed on every exit path. */
        long live = cq_fake_e2b_stat(&e2b, "live");

        cq_fake_e2b_stop(&e2b);
        cq_fake_llm_stop(&fake);
        curl_global_cleanup();
        ck_assert_int_eq(live, 0);
}

static void use_backend(int i) { on_e2b = i == 1; }

/* Everything one run needs. */
typedef struct fixture {
        cq_job_t job;
        cq_interp_t *interp;
        cq_llm_t *llm;
        cq_nb_t *nb;
        cq_agent_opts_t opts;
        cq_agent_result_t result;
        int fresh_made; /* interpreters made for fresh tests */
        char model[128];
        char script[96]; /* the test's script name, per backend */
} fixture_t;

/* An interpreter of the test's backend. */
static cq_interp_t *new_interp(void)
{
        return cq_check_agent_interp(on_e2b ? &e2b : NULL);
}

/* Fresh interpreters for tests.isolation "fresh", on the test's backend. */
static cq_interp_t *fixture_new_interp(void *opaque,
                                       const char *backend,
                                       char *errstr,
                                       size_t errstr_size)
{
        int *made = opaque;

        (void)backend;
        (void)errstr;
        (void)errstr_size;
        ++*made;
        return new_interp();
}

/* Register \p steps (a JSON text) as script \p name and prepare a job. */
static void fixture_init(fixture_t *fx, const char *name, const char *steps)
{
        json_t *script = json_loads(steps, 0, NULL);
        cq_llm_conf_t conf;
        char err[256] = "";

        ck_assert_msg(script != NULL, "bad script JSON for %s", name);
        memset(fx, 0, sizeof(*fx));
        /* Fault counters are per script: one script per backend run. */
        snprintf(fx->script, sizeof(fx->script), "%s-%s", name,
                 backends[on_e2b]);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, fx->script, script), 0);
        json_decref(script);
        snprintf(fx->model, sizeof(fx->model), "script:%s", fx->script);
        cq_job_init(&fx->job);
        fx->job.job_id = strdup(name);
        fx->job.prompt = strdup("Compute things for the test.");
        fx->job.title = strdup("Test section");
        fx->job.model = strdup(fx->model);
        cq_llm_conf_init(&conf);
        conf.base_url = cq_fake_llm_base_url(fake);
        conf.model = "unused-default";
        conf.api_key = "sk-test-secret-key";
        conf.max_attempts = 3;
        conf.backoff_base_ms = 10;
        conf.backoff_max_ms = 50;
        conf.max_wait_s = 10;
        fx->llm = cq_llm_new(&conf, err, sizeof(err));
        ck_assert_msg(fx->llm != NULL, "%s", err);
        fx->interp = new_interp();
        fx->nb = cq_nb_new(NULL);
        ck_assert_ptr_nonnull(fx->nb);
        cq_agent_opts_init(&fx->opts);
        fx->opts.cell_timeout_s = 20;
        fx->opts.job_timeout_s = 120;
        fx->opts.new_interp = fixture_new_interp;
        fx->opts.new_interp_opaque = &fx->fresh_made;
        cq_agent_result_init(&fx->result);
}

static void fixture_run(fixture_t *fx,
                        const cq_agent_observer_t *obs,
                        const cq_agent_memory_t *mem,
                        const cq_agent_start_t *start)
{
        ck_assert_int_eq(cq_agent_run(&fx->job, fx->interp, fx->llm, &fx->opts,
                                      obs, mem, start, fx->nb, &fx->result),
                         CQ_OK);
}

static void fixture_release(fixture_t *fx)
{
        cq_agent_result_release(&fx->result);
        cq_interp_destroy(&fx->interp);
        cq_llm_destroy(&fx->llm);
        cq_nb_destroy(&fx->nb);
        cq_job_release(&fx->job);
}

/* The requests the fake recorded for script \p name. */
static json_t *requests_for(const char *name)
{
        json_t *all = cq_fake_llm_requests(fake), *mine = json_array(), *req;
        size_t i;

        ck_assert_ptr_nonnull(all);
        json_array_foreach(all, i, req)
        {
                const char *script =
                    json_string_value(json_object_get(req, "script"));

                if (script && strcmp(script, name) == 0)
                        json_array_append(mine, req);
        }
        json_decref(all);
        return mine;
}

static const char *msg_role(const json_t *history, size_t i)
{
        return json_string_value(
            json_object_get(json_array_get(history, i), "role"));
}

static const char *msg_content(const json_t *history, size_t i)
{
        return json_string_value(
            json_object_get(json_array_get(history, i), "content"));
}

/* Whether any message of \p role in \p history contains \p needle. */
static bool
history_has(const json_t *history, const char *role, const char *needle)
{
        size_t i;

        for (i = 0; i < json_array_size(history); i++) {
                const char *c = msg_content(history, i);

                if (c && strcmp(msg_role(history, i), role) == 0 &&
                    strstr(c, needle))
                        return true;
        }
        return false;
}

START_TEST(success_first_try)
{
        fixture_t fx;
        json_t *reqs;
        const json_t *h;

        use_backend(_i);
        fixture_init(&fx, "first_try",
                     "[{\"tool_calls\":[{\"code\":\"x = 6 * 7\\nprint(x)\"}]},"
                     "{\"content\":\"The answer is 42.\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_str_eq(fx.result.answer, "The answer is 42.");
        ck_assert_int_eq(fx.result.turns, 2);
        ck_assert_int_eq(fx.result.retries, 0);
        ck_assert_int_eq(fx.result.cells, 1);
        ck_assert_int_eq(fx.result.tests_total, -1);
        ck_assert_ptr_null(fx.result.reason);
        h = fx.result.history;
        ck_assert_uint_eq(json_array_size(h), 6);
        ck_assert_str_eq(msg_role(h, 0), "system");
        ck_assert_str_eq(msg_role(h, 1), "user");
        ck_assert_msg(strstr(msg_content(h, 1), "no input files"), "%s",
                      msg_content(h, 1));
        ck_assert_str_eq(msg_role(h, 2), "user");
        ck_assert_msg(strstr(msg_content(h, 2), "Compute things"), "%s",
                      msg_content(h, 2));
        ck_assert_str_eq(msg_role(h, 3), "assistant");
        ck_assert_str_eq(msg_role(h, 4), "tool");
        ck_assert_msg(strstr(msg_content(h, 4), "42"), "%s", msg_content(h, 4));
        ck_assert_str_eq(
            json_string_value(
                json_object_get(json_array_get(h, 4), "tool_call_id")),
            json_string_value(json_object_get(
                json_array_get(
                    json_object_get(json_array_get(h, 3), "tool_calls"), 0),
                "id")));
        ck_assert_str_eq(msg_role(h, 5), "assistant");
        ck_assert_ptr_nonnull(strstr(fx.result.solution, "x = 6 * 7"));
        /* heading, the cell, the answer */
        ck_assert_uint_eq(cq_nb_ncells(fx.nb), 3);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 2);
        json_decref(reqs);
        ck_assert_int_gt(fx.result.prompt_tokens, 0);
        fixture_release(&fx);
}
END_TEST

START_TEST(error_then_reflection_then_fixed)
{
        fixture_t fx;
        json_t *reqs, *body;

        use_backend(_i);
        fixture_init(&fx, "reflect",
                     "[{\"tool_calls\":[{\"code\":\"print('before')\\n"
                     "print(undefined_name)\"}]},"
                     "{\"tool_calls\":[{\"code\":\"undefined_name = 3\\n"
                     "print(undefined_name)\"}]},"
                     "{\"content\":\"Fixed.\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.retries, 1);
        ck_assert_int_eq(fx.result.turns, 3);
        /* the tool result kept the stdout printed before the error */
        ck_assert(history_has(fx.result.history, "tool", "before"));
        ck_assert(history_has(fx.result.history, "tool", "NameError"));
        /* the reflection prompt names the error and the failing code */
        ck_assert(history_has(fx.result.history, "user", "NameError"));
        ck_assert(
            history_has(fx.result.history, "user", "print(undefined_name)"));
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 3);
        body = json_object_get(json_array_get(reqs, 1), "body");
        ck_assert(history_has(json_object_get(body, "messages"), "user",
                              "NameError"));
        json_decref(reqs);
        fixture_release(&fx);
}
END_TEST

START_TEST(retry_limit_fails_with_last_error)
{
        fixture_t fx;

        use_backend(_i);
        fixture_init(&fx, "retry_limit",
                     "[{\"tool_calls\":[{\"code\":\"1/0\"}]},"
                     "{\"tool_calls\":[{\"code\":\"[][1]\"}]},"
                     "{\"tool_calls\":[{\"code\":\"print('never')\"}]},"
                     "{\"content\":\"never reached\"}]");
        fx.job.limits.max_retries = 1;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "retry limit"), "%s",
                      fx.result.reason);
        ck_assert_msg(strstr(fx.result.reason, "IndexError"), "%s",
                      fx.result.reason);
        ck_assert_msg(strstr(fx.result.last_error, "IndexError"), "%s",
                      fx.result.last_error);
        ck_assert_int_eq(fx.result.retries, 2);
        ck_assert_int_eq(fx.result.turns, 2);
        ck_assert_ptr_null(fx.result.answer);
        fixture_release(&fx);
}
END_TEST

START_TEST(turn_limit_fails)
{
        fixture_t fx;

        use_backend(_i);
        fixture_init(&fx, "turn_limit",
                     "[{\"tool_calls\":[{\"code\":\"a = 1\"}]},"
                     "{\"tool_calls\":[{\"code\":\"b = 2\"}]},"
                     "{\"tool_calls\":[{\"code\":\"c = 3\"}]},"
                     "{\"content\":\"done\"}]");
        fx.job.limits.max_turns = 2;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "turn limit"), "%s",
                      fx.result.reason);
        ck_assert_int_eq(fx.result.turns, 2);
        fixture_release(&fx);
}
END_TEST

static void set_tests(fixture_t *fx)
{
        fx->job.tests =
            json_loads("{\"kind\":\"cases\",\"function\":\"sq\",\"cases\":["
                       "{\"args\":[3],\"expected\":9},"
                       "{\"args\":[-2],\"expected\":4}]}",
                       0, NULL);
        ck_assert_ptr_nonnull(fx->job.tests);
}

START_TEST(tests_fail_then_pass)
{
        fixture_t fx;

        use_backend(_i);
        fixture_init(&fx, "tests_then_pass",
                     "[{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                     "    return x * 2\"}]},"
                     "{\"content\":\"sq is defined.\"},"
                     "{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                     "    return x * x\"}]},"
                     "{\"content\":\"sq fixed.\"}]");
        set_tests(&fx);
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.tests_passed, 2);
        ck_assert_int_eq(fx.result.tests_total, 2);
        ck_assert_int_eq(fx.result.retries, 1);
        ck_assert_str_eq(fx.result.answer, "sq fixed.");
        /* the failure went back to the model with expected and got */
        ck_assert(
            history_has(fx.result.history, "user", "Case 1 failed: sq(3)"));
        ck_assert(history_has(fx.result.history, "user", "expected: 9"));
        ck_assert(history_has(fx.result.history, "user", "got:      6"));
        fixture_release(&fx);
}
END_TEST

START_TEST(tests_never_pass_fails)
{
        fixture_t fx;

        use_backend(_i);
        /* a new try each time: the retry limit ends it */
        fixture_init(&fx, "tests_never",
                     "[{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                     "    return 0\"}]},"
                     "{\"content\":\"done\"},"
                     "{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                     "    return 1\"}]},"
                     "{\"content\":\"still done\"},"
                     "{\"content\":\"really done\"}]");
        set_tests(&fx);
        fx.job.limits.max_retries = 1;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "retry limit"), "%s",
                      fx.result.reason);
        ck_assert_msg(strstr(fx.result.reason, "0 of 2 tests passed"), "%s",
                      fx.result.reason);
        ck_assert_int_eq(fx.result.tests_passed, 0);
        ck_assert_str_eq(fx.result.reason_code, "tests");
        ck_assert_str_eq(fx.result.verdict, "wrong_answer");
        fixture_release(&fx);
        /* the same answer again, with nothing changed: stuck, stopped */
        fixture_init(&fx, "tests_same",
                     "[{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                     "    return 0\"}]},"
                     "{\"content\":\"done\"},"
                     "{\"content\":\"still done\"},"
                     "{\"content\":\"really done\"}]");
        set_tests(&fx);
        fx.job.limits.max_retries = 5;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(fx.result.reason_code, "stuck");
        ck_assert_str_eq(fx.result.verdict, "stuck");
        ck_assert_int_eq(fx.result.turns, 3);
        fixture_release(&fx);
}
END_TEST

/* The isolation recorded in the last test report. */
static const char *report_isolation(const fixture_t *fx)
{
        return json_string_value(
            json_object_get(fx->result.tests, "isolation"));
}

START_TEST(fresh_tests_run_on_the_successful_cells_alone)
{
        fixture_t fx;

        /* k is set by a cell that then raises: not part of the solution.
         * The job's kernel has k, so kernel-isolated tests would pass; a
         * fresh interpreter replays only the successful cell, which needs
         * k and fails before defining sq. The fix stands alone and passes
         * although the old cell still fails in the replay. */
        use_backend(_i);
        fixture_init(&fx, "fresh_tests",
                     "[{\"tool_calls\":[{\"code\":\"k = 3\\n"
                     "raise RuntimeError('oops')\"}]},"
                     "{\"tool_calls\":[{\"code\":\"y = k * 2\\n"
                     "def sq(x):\\n    return x * x\"}]},"
                     "{\"content\":\"sq is defined.\"},"
                     "{\"tool_calls\":[{\"code\":\"k = 3\\ny = k * 2\\n"
                     "def sq(x):\\n    return x * x\"}]},"
                     "{\"content\":\"now it stands alone.\"}]");
        set_tests(&fx);
        fx.job.tests_fresh = true;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        /* one failed cell and one failed test run */
        ck_assert_int_eq(fx.result.retries, 2);
        ck_assert_int_eq(fx.result.turns, 5);
        ck_assert(history_has(fx.result.history, "user",
                              "in a fresh interpreter, cell 1 of the "
                              "solution's 1 failed (NameError: name 'k' is "
                              "not defined)"));
        ck_assert_int_eq(fx.result.tests_passed, 2);
        ck_assert_str_eq(report_isolation(&fx), "fresh");
        ck_assert_int_eq(fx.fresh_made, 2);
        fixture_release(&fx);

        /* The same conversation with tests in the job's kernel passes at
         * the first answer: the state the failed cell left counts. */
        fixture_init(&fx, "kernel_tests",
                     "[{\"tool_calls\":[{\"code\":\"k = 3\\n"
                     "raise RuntimeError('oops')\"}]},"
                     "{\"tool_calls\":[{\"code\":\"y = k * 2\\n"
                     "def sq(x):\\n    return x * x\"}]},"
                     "{\"content\":\"sq is defined.\"}]");
        set_tests(&fx);
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.retries, 1);
        ck_assert_str_eq(report_isolation(&fx), "kernel");
        ck_assert_int_eq(fx.fresh_made, 0);
        fixture_release(&fx);
}
END_TEST

/* A solution that reads the expected values from the harness's frames
 * (or anything else it can reach) finds none, in either isolation: they
 * never enter the interpreter. */
START_TEST(tests_cannot_read_their_expected_values)
{
        static const char steps[] =
            "[{\"tool_calls\":[{\"code\":\"import gc, sys\\n"
            "def sq(x):\\n"
            "    fr = sys._getframe(1)\\n"
            "    while fr is not None:\\n"
            "        c = fr.f_locals.get('c')\\n"
            "        if isinstance(c, dict) and 'expected' in c:\\n"
            "            return c['expected']\\n"
            "        fr = fr.f_back\\n"
            "    for o in gc.get_objects():\\n"
            "        if type(o) is dict and 'expected' in o:\\n"
            "            return o['expected']\\n"
            "    return -1\"}]},"
            "{\"content\":\"sq is defined.\"}]";
        fixture_t fx;
        int fresh;

        use_backend(_i);
        for (fresh = 0; fresh < 2; fresh++) {
                fixture_init(&fx, fresh ? "peek_fresh" : "peek_kernel", steps);
                set_tests(&fx);
                fx.job.tests_fresh = fresh;
                fx.job.limits.max_retries = 0;
                fixture_run(&fx, NULL, NULL, NULL);
                ck_assert_str_eq(cq_agent_status_name(fx.result.status),
                                 "failed");
                ck_assert_int_eq(fx.result.tests_total, 2);
                ck_assert_int_eq(fx.result.tests_passed, 0);
                ck_assert_str_eq(report_isolation(&fx),
                                 fresh ? "fresh" : "kernel");
                ck_assert_msg(
                    strstr(fx.result.last_error, "0 of 2 tests passed"), "%s",
                    fx.result.last_error);
                fixture_release(&fx);
        }
}
END_TEST

START_TEST(hanging_or_killing_tests_fail_with_a_reason)
{
        fixture_t fx;

        use_backend(_i);
        fixture_init(&fx, "tests_hang",
                     "[{\"tool_calls\":[{\"code\":\"def sq(x):\\n"
                     "    while True:\\n        pass\"}]},"
                     "{\"content\":\"done\"}]");
        set_tests(&fx);
        fx.job.limits.test_timeout_s = 2;
        fx.job.limits.max_retries = 0;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason,
                             "the tests did not finish within 2 s "
                             "(limits.test_timeout_s)"),
                      "%s", fx.result.reason);
        ck_assert_int_eq(fx.result.tests_passed, 0);
        fixture_release(&fx);

        fixture_init(&fx, "tests_kill",
                     "[{\"tool_calls\":[{\"code\":\"import os\\n"
                     "def sq(x):\\n    os._exit(3)\"}]},"
                     "{\"content\":\"done\"}]");
        set_tests(&fx);
        fx.job.tests_fresh = true;
        fx.job.limits.max_retries = 0;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        /* E2B reports a lost sandbox as the cell's error, not a death. */
        ck_assert_msg(strstr(fx.result.reason,
                             on_e2b ? "connections was lost"
                                    : "the kernel died while the tests ran "
                                      "in a fresh interpreter"),
                      "%s", fx.result.reason);
        fixture_release(&fx);
}
END_TEST

START_TEST(two_tool_calls_both_answered_in_order)
{
        fixture_t fx;
        const json_t *h;
        json_t *calls;

        use_backend(_i);
        fixture_init(&fx, "two_calls",
                     "[{\"tool_calls\":[{\"code\":\"v = 20\"},"
                     "{\"code\":\"print(v + 1)\"}]},"
                     "{\"content\":\"ok\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.cells, 2);
        h = fx.result.history;
        calls = json_object_get(json_array_get(h, 3), "tool_calls");
        ck_assert_uint_eq(json_array_size(calls), 2);
        ck_assert_str_eq(msg_role(h, 4), "tool");
        ck_assert_str_eq(msg_role(h, 5), "tool");
        ck_assert_str_eq(
            json_string_value(
                json_object_get(json_array_get(h, 4), "tool_call_id")),
            json_string_value(json_object_get(json_array_get(calls, 0), "id")));
        ck_assert_str_eq(
            json_string_value(
                json_object_get(json_array_get(h, 5), "tool_call_id")),
            json_string_value(json_object_get(json_array_get(calls, 1), "id")));
        ck_assert_msg(strstr(msg_content(h, 5), "21"), "%s", msg_content(h, 5));
        fixture_release(&fx);
}
END_TEST

/* A job's "provider" sends this job through the Messages API while the
 * history keeps the Chat Completions shape; the handle goes back to its
 * configured provider afterwards. */
START_TEST(job_provider_anthropic)
{
        fixture_t fx;
        const json_t *h;
        json_t *reqs, *req;
        size_t i;

        use_backend(_i);
        fixture_init(&fx, "anthropic_job",
                     "[{\"tool_calls\":[{\"code\":\"v = 20\"},"
                     "{\"code\":\"print(v + 1)\"}]},"
                     "{\"content\":\"ok\",\"anthropic_usage\":{"
                     "\"input_tokens\":7,\"output_tokens\":3,"
                     "\"cache_read_input_tokens\":100,"
                     "\"cache_creation_input_tokens\":11}}]");
        fx.job.provider = strdup("anthropic");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.cells, 2);
        h = fx.result.history;
        ck_assert_str_eq(msg_role(h, 4), "tool");
        ck_assert_str_eq(msg_role(h, 5), "tool");
        ck_assert_msg(strstr(msg_content(h, 5), "21"), "%s", msg_content(h, 5));
        ck_assert_int_eq(fx.result.cache_read_tokens, 100);
        ck_assert_int_eq(fx.result.cache_creation_tokens, 11);
        ck_assert_int_ge(fx.result.prompt_tokens, 118);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 2);
        json_array_foreach(reqs, i, req)
        {
                ck_assert_str_eq(json_string_value(json_object_get(req, "api")),
                                 "anthropic");
                ck_assert_msg(json_is_true(json_object_get(req, "valid")), "%s",
                              json_string_value(json_object_get(req, "error")));
        }
        json_decref(reqs);
        ck_assert_int_eq(cq_llm_provider(fx.llm), CQ_LLM_OPENAI);
        fixture_release(&fx);
}
END_TEST

START_TEST(rate_limited_then_success)
{
        fixture_t fx;
        json_t *reqs;

        use_backend(_i);
        fixture_init(&fx, "agent_429",
                     "[{\"faults\":[{\"kind\":\"http\",\"status\":429,"
                     "\"retry_after\":\"0\"}],"
                     "\"tool_calls\":[{\"code\":\"print(1)\"}]},"
                     "{\"content\":\"ok\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.turns, 2);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 3); /* 429, retry, final */
        json_decref(reqs);
        fixture_release(&fx);
}
END_TEST

START_TEST(unauthorized_fails_at_once)
{
        fixture_t fx;
        json_t *reqs;

        use_backend(_i);
        fixture_init(&fx, "agent_401",
                     "[{\"faults\":[{\"kind\":\"http\",\"status\":401,"
                     "\"times\":-1,\"message\":\"Incorrect API key "
                     "provided\"}],\"content\":\"never\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "Incorrect API key provided"),
                      "%s", fx.result.reason);
        ck_assert_msg(!strstr(fx.result.reason, "sk-test-secret-key"), "%s",
                      fx.result.reason);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        ck_assert_int_eq(fx.result.cells, 0);
        fixture_release(&fx);
}
END_TEST

START_TEST(invalid_json_reply_is_retried_then_fails_clearly)
{
        fixture_t fx;

        use_backend(_i);
        fixture_init(&fx, "agent_garbage_once",
                     "[{\"faults\":[{\"kind\":\"invalid_json\"}],"
                     "\"content\":\"recovered\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_str_eq(fx.result.answer, "recovered");
        fixture_release(&fx);

        fixture_init(&fx, "agent_garbage_always",
                     "[{\"faults\":[{\"kind\":\"invalid_json\","
                     "\"times\":-1}],\"content\":\"never\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "LLM"), "%s", fx.result.reason);
        fixture_release(&fx);
}
END_TEST

START_TEST(tool_output_is_bounded)
{
        fixture_t fx;
        const json_t *h;
        const char *tool;

        use_backend(_i);
        fixture_init(&fx, "flood",
                     "[{\"tool_calls\":[{\"code\":\"print('A' * 200000)\\n"
                     "print('the end')\"}]},"
                     "{\"content\":\"ok\"}]");
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        h = fx.result.history;
        tool = msg_content(h, 4);
        ck_assert_str_eq(msg_role(h, 4), "tool");
        ck_assert_msg(strlen(tool) <= fx.opts.tool_total_max + 512,
                      "tool text is %zu bytes", strlen(tool));
        ck_assert_msg(strstr(tool, "the end"), "tail lost");
        ck_assert_msg(strstr(tool, "omitted"), "no truncation marker");
        fixture_release(&fx);
}
END_TEST

START_TEST(old_tool_outputs_are_elided_near_the_window)
{
        fixture_t fx;
        json_t *reqs, *last, *messages;
        size_t i;
        bool elided = false;

        use_backend(_i);
        fixture_init(&fx, "elide",
                     "[{\"tool_calls\":[{\"code\":\"print('x' * 3000)\"}]},"
                     "{\"tool_calls\":[{\"code\":\"print('y' * 3000)\"}]},"
                     "{\"tool_calls\":[{\"code\":\"print('z' * 3000)\"}]},"
                     "{\"tool_calls\":[{\"code\":\"print('w' * 3000)\"}]},"
                     "{\"content\":\"done\"}]");
        fx.opts.context_tokens = 4000;
        fx.opts.tool_total_max = 4000;
        fx.opts.tool_item_max = 4000;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        reqs = requests_for(fx.script);
        last = json_array_get(reqs, json_array_size(reqs) - 1);
        messages = json_object_get(json_object_get(last, "body"), "messages");
        for (i = 0; i < json_array_size(messages); i++) {
                const char *c = msg_content(messages, i);

                if (c && strstr(c, "[output elided"))
                        elided = true;
        }
        ck_assert_msg(elided, "no tool output was elided");
        /* system prompt and task intact */
        ck_assert_str_eq(msg_role(messages, 0), "system");
        ck_assert_msg(strstr(msg_content(messages, 2), "Compute things"),
                      "task lost");
        /* the most recent tool output is intact */
        ck_assert_msg(
            strstr(msg_content(messages, json_array_size(messages) - 1),
                   "wwww"),
            "recent output elided");
        json_decref(reqs);
        fixture_release(&fx);
}
END_TEST

static int
memory_lookup(void *opaque, const char *prompt, cq_agent_recall_t *recall)
{
        (void)opaque;
        ck_assert_msg(strstr(prompt, "Compute things"), "%s", prompt);
        recall->code = strdup("def sq(x):\n    return x ** 2\n");
        recall->source_job = strdup("solved-before");
        recall->scope = strdup("team");
        recall->model = strdup("some-model");
        recall->similarity = 0.75;
        return 0;
}

START_TEST(memory_hit_skips_the_llm)
{
        fixture_t fx;
        cq_agent_memory_t mem = {memory_lookup, NULL};
        json_t *reqs;

        use_backend(_i);
        fixture_init(&fx, "memory", "[{\"content\":\"should not be asked\"}]");
        set_tests(&fx);
        fixture_run(&fx, NULL, &mem, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert(fx.result.from_memory);
        ck_assert_str_eq(fx.result.memory_source_job, "solved-before");
        ck_assert_msg(strstr(fx.result.answer, "job solved-before"), "%s",
                      fx.result.answer);
        ck_assert_int_eq(fx.result.turns, 0);
        ck_assert_int_eq(fx.result.tests_passed, 2);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        fixture_release(&fx);
}
END_TEST

/* Observer that logs the checkpoints it is given, as the worker makes
 * them: "t<code|->@<index>:<n>" per on_turn, "m<index>:<role>" per
 * on_message, "c<code>" per on_cell. */
static int log_on_message(void *opaque, size_t index, const json_t *msg)
{
        char line[64];

        snprintf(line, sizeof(line), "m%zu:%s", index,
                 json_string_value(json_object_get(msg, "role")));
        json_array_append_new(opaque, json_string(line));
        return 0;
}

static int
log_on_cell(void *opaque, const char *code, const cq_cell_result_t *res)
{
        char line[64];

        (void)res;
        snprintf(line, sizeof(line), "c%s", code);
        json_array_append_new(opaque, json_string(line));
        return 0;
}

static int log_on_turn(void *opaque,
                       const char *code,
                       const cq_cell_result_t *res,
                       size_t index,
                       const json_t *messages)
{
        char line[96];

        ck_assert((code == NULL) == (res == NULL));
        snprintf(line, sizeof(line), "t%s@%zu:%zu", code ? code : "-", index,
                 json_array_size(messages));
        json_array_append_new(opaque, json_string(line));
        return 0;
}

static char *log_text(json_t *log)
{
        char text[1024] = "";
        size_t i, used = 0;
        json_t *line;

        json_array_foreach(log, i, line)
        {
                int n = snprintf(text + used, sizeof(text) - used, "%s%s",
                                 i ? " " : "", json_string_value(line));

                ck_assert(n > 0 && (size_t)n < sizeof(text) - used);
                used += (size_t)n;
        }
        return strdup(text);
}

/* With on_turn, a turn is one checkpoint: the start's three messages in
 * one call, each cell with the tool message that answers it; without it,
 * the cell then its message, one call each, as before. */
START_TEST(turns_are_checkpointed_whole)
{
        static const char steps[] =
            "[{\"tool_calls\":[{\"code\":\"x = 6 * 7\"}]},"
            "{\"tool_calls\":[{\"code\":\"print(x)\"}]},"
            "{\"content\":\"42\"}]";
        fixture_t fx;
        cq_agent_observer_t obs = {0};
        json_t *log = json_array();
        char *text;

        use_backend(_i);
        fixture_init(&fx, "turns_whole", steps);
        obs.on_message = log_on_message;
        obs.on_cell = log_on_cell;
        obs.on_turn = log_on_turn;
        obs.opaque = log;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        text = log_text(log);
        ck_assert_str_eq(text, "t-@0:3 tx = 6 * 7@3:2 tprint(x)@5:2 "
                               "m7:assistant");
        free(text);
        ck_assert_uint_eq(json_array_size(fx.result.history), 8);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(fx.result.history, 4), "role")),
                         "tool");
        fixture_release(&fx);

        fixture_init(&fx, "turns_apart", steps);
        json_array_clear(log);
        obs.on_turn = NULL;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        text = log_text(log);
        ck_assert_str_eq(text, "m0:system m1:user m2:user m3:assistant "
                               "cx = 6 * 7 m4:tool m5:assistant cprint(x) "
                               "m6:tool m7:assistant");
        free(text);
        json_decref(log);
        fixture_release(&fx);
}
END_TEST

/* The observer of held_reply_*: logs as log_on_*, raises the stop flag
 * at the first reply when asked, refuses the checkpoint of a reply
 * alone when asked. */
typedef struct holder {
        json_t *log;
        atomic_int stop;
        atomic_int cancel;
        bool stop_at_reply;
        bool refuse_alone;
        bool drain_at_cell; /* stop and cancel as the first cell starts */
} holder_t;

static int holder_on_message(void *opaque, size_t index, const json_t *msg)
{
        return log_on_message(((holder_t *)opaque)->log, index, msg);
}

static int holder_on_turn(void *opaque,
                          const char *code,
                          const cq_cell_result_t *res,
                          size_t index,
                          const json_t *messages)
{
        holder_t *h = opaque;

        log_on_turn(h->log, code, res, index, messages);
        return h->refuse_alone && !code && index > 0 ? -1 : 0;
}

static void holder_on_event(void *opaque, const char *type, const json_t *data)
{
        holder_t *h = opaque;

        (void)data;
        if (h->stop_at_reply && strcmp(type, "llm.reply") == 0)
                atomic_store(&h->stop, 1);
        if (h->drain_at_cell && strcmp(type, "cell.started") == 0) {
                atomic_store(&h->stop, 1);
                atomic_store(&h->cancel, 1);
        }
}

/* No run under a holder counts a failed attempt. */
static int holder_on_retry(void *opaque, long retries)
{
        (void)opaque;
        ck_abort_msg("a failed attempt was counted (%ld)", retries);
        return 0;
}

/* Run \p steps under a holder observer (raising the stop flag at the
 * first reply, refusing a reply checkpointed alone, as asked) and check
 * the checkpoints it logged and whether the run was aborted. */
static void expect_holder(const char *name,
                          const char *steps,
                          bool stop_at_reply,
                          bool refuse_alone,
                          const char *want,
                          bool aborted)
{
        fixture_t fx;
        cq_agent_observer_t obs = {0};
        holder_t h = {0};
        char *text;

        fixture_init(&fx, name, steps);
        h.log = json_array();
        h.stop_at_reply = stop_at_reply;
        h.refuse_alone = refuse_alone;
        atomic_init(&h.stop, 0);
        fx.opts.stop = &h.stop;
        obs.on_message = holder_on_message;
        obs.on_turn = holder_on_turn;
        obs.on_event = holder_on_event;
        obs.opaque = &h;
        fixture_run(&fx, &obs, NULL, NULL);
        text = log_text(h.log);
        ck_assert_str_eq(text, want);
        ck_assert_msg((fx.result.status == CQ_AGENT_ABORTED) == aborted,
                      "status %s", cq_agent_status_name(fx.result.status));
        free(text);
        json_decref(h.log);
        fixture_release(&fx);
}

static const char slow_cell_steps[] =
    "[{\"tool_calls\":[{\"code\":\"import time; time.sleep(2)\"}]},"
    "{\"content\":\"done\"}]";

/* A reply with a call is held for its cell's checkpoint; a cell that runs
 * on checkpoints it alone first, so a worker killed during a long cell
 * does not lose it (nor its usage). */
START_TEST(held_reply_is_checkpointed_alone_when_its_cell_is_slow)
{
        use_backend(_i);
        expect_holder("held_slow", slow_cell_steps, false, false,
                      "t-@0:3 t-@3:1 timport time; time.sleep(2)@4:1 "
                      "m5:assistant",
                      false);
}
END_TEST

/* A run stopped (shutdown) between a reply and its cells keeps the reply:
 * the resumed job answers its calls without asking the LLM again. */
START_TEST(held_reply_is_kept_when_the_run_stops)
{
        use_backend(_i);
        expect_holder("held_stop",
                      "[{\"tool_calls\":[{\"code\":\"x = 1\"}]},"
                      "{\"content\":\"1\"}]",
                      true, false, "t-@0:3 t-@3:1", true);
}
END_TEST

/* Once a checkpoint is refused nothing more is written, not even the
 * cell's turn after it: it would follow a message that is not stored. */
START_TEST(held_reply_refused_stops_all_checkpoints)
{
        use_backend(_i);
        expect_holder("held_refused", slow_cell_steps, false, true,
                      "t-@0:3 t-@3:1", true);
}
END_TEST

/* A draining worker stops its jobs at their next checkpoint, then at its
 * deadline cancels the cells still running: such a cell is not the
 * code's doing and is no cell of the job's. Nothing of it is checkpointed
 * (no cell, no tool message, no failed attempt), the run is aborted with
 * the reply that called it kept, and the resumed job runs the cell again
 * instead of asking the LLM again. */
START_TEST(cell_a_drain_interrupts_is_not_recorded)
{
        static const char code[] = "import time; time.sleep(3); x = 7";
        fixture_t fx;
        cq_agent_observer_t obs = {0};
        cq_agent_start_t start = {0};
        holder_t h = {0};
        json_t *saved, *reqs, *cells = json_array();
        char steps[256], want[128], *text;
        size_t i;

        use_backend(_i);
        snprintf(steps, sizeof(steps),
                 "[{\"tool_calls\":[{\"code\":\"%s\"}]},"
                 "{\"content\":\"7\"}]",
                 code);
        fixture_init(&fx, "drained_cell", steps);
        h.log = json_array();
        h.drain_at_cell = true;
        atomic_init(&h.stop, 0);
        atomic_init(&h.cancel, 0);
        fx.opts.stop = &h.stop;
        fx.opts.cancel = &h.cancel;
        obs.on_message = holder_on_message;
        obs.on_turn = holder_on_turn;
        obs.on_event = holder_on_event;
        obs.on_retry = holder_on_retry;
        obs.opaque = &h;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "aborted");
        text = log_text(h.log);
        ck_assert_str_eq(text, "t-@0:3 t-@3:1");
        free(text);
        ck_assert_int_eq(fx.result.cells, 0);
        ck_assert_int_eq(fx.result.retries, 0);
        ck_assert_uint_eq(json_array_size(fx.result.history), 4);
        saved = json_deep_copy(fx.result.history);
        cq_agent_result_release(&fx.result);
        cq_interp_destroy(&fx.interp);

        /* Resumed: the reply's call is answered by running the cell, the
         * LLM is asked for the next step only. */
        fx.interp = new_interp();
        fx.opts.stop = NULL;
        fx.opts.cancel = NULL;
        json_array_clear(h.log);
        h.drain_at_cell = false;
        start.history = saved;
        start.cells = cells;
        start.continue_job = true;
        start.turns_done = 1;
        fixture_run(&fx, &obs, NULL, &start);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_str_eq(fx.result.answer, "7");
        ck_assert_int_eq(fx.result.cells, 1);
        ck_assert_int_eq(fx.result.retries, 0);
        text = log_text(h.log);
        snprintf(want, sizeof(want), "t%s@4:1 m5:assistant", code);
        ck_assert_str_eq(text, want);
        free(text);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 2);
        for (i = 0; i < 2; i++)
                ck_assert_int_eq(json_integer_value(json_object_get(
                                     json_array_get(reqs, i), "step")),
                                 (json_int_t)i);
        json_decref(reqs);
        json_decref(saved);
        json_decref(cells);
        json_decref(h.log);
        fixture_release(&fx);
}
END_TEST

/* Observer that "crashes" the worker after the history reached a size. */
typedef struct crash {
        size_t stop_at; /* abort when a message lands at this index */
        json_t *cells;  /* successful cells seen, as a checkpoint keeps */
        long retries;   /* the last count on_retry reported */
        long nretry;    /* how often it was called */
} crash_t;

static int crash_on_message(void *opaque, size_t index, const json_t *msg)
{
        crash_t *c = opaque;

        (void)msg;
        return index >= c->stop_at ? -1 : 0;
}

static int
crash_on_cell(void *opaque, const char *code, const cq_cell_result_t *res)
{
        crash_t *c = opaque;

        if (res->status == CQ_CELL_OK)
                json_array_append_new(c->cells, json_string(code));
        return 0;
}

static int crash_on_retry(void *opaque, long retries)
{
        crash_t *c = opaque;

        c->retries = retries;
        c->nretry++;
        return 0;
}

/* Run \p fx as an attempt whose worker is gone once a message lands at
 * index \p stop_at: the cells it reported go to crash->cells (caller
 * decrefs). */
static void run_until_crash(fixture_t *fx, crash_t *crash, size_t stop_at)
{
        cq_agent_observer_t obs = {0};

        crash->stop_at = stop_at;
        crash->cells = json_array();
        obs.on_message = crash_on_message;
        obs.on_cell = crash_on_cell;
        obs.opaque = crash;
        fixture_run(fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx->result.status), "aborted");
}

/* The first \p n messages of an aborted attempt's history, as its
 * checkpoint kept them; the fixture is ready for the next attempt, on a
 * fresh interpreter as a resumed job gets. Caller decrefs. */
static json_t *next_attempt(fixture_t *fx, size_t n)
{
        json_t *saved = json_array();
        size_t i;

        for (i = 0; i < n; i++)
                json_array_append(saved, json_array_get(fx->result.history, i));
        cq_agent_result_release(&fx->result);
        cq_interp_destroy(&fx->interp);
        fx->interp = new_interp();
        return saved;
}

/* Limits are the job's, not the attempt's: the retries an earlier attempt
 * counted (reported as they were counted) and the time it ran count. */
START_TEST(resumed_job_keeps_counting_retries_and_time)
{
        static const char steps[] = "[{\"tool_calls\":[{\"code\":\"1/0\"}]},"
                                    "{\"tool_calls\":[{\"code\":\"[][1]\"}]},"
                                    "{\"tool_calls\":[{\"code\":\"{}['x']\"}]},"
                                    "{\"content\":\"done\"}]";
        fixture_t fx;
        crash_t crash = {0};
        cq_agent_observer_t obs = {0};
        cq_agent_start_t start = {0};
        json_t *saved, *reqs;
        size_t i;

        /* First attempt: two failed cells, then the worker is gone when
         * the second reflection is checkpointed (system, files, task, a1,
         * t1, r1, a2, t2, r2 -> index 8). */
        use_backend(_i);
        fixture_init(&fx, "resume_limits", steps);
        fx.job.limits.max_retries = 2;
        crash.stop_at = 8;
        crash.cells = json_array();
        obs.on_message = crash_on_message;
        obs.on_cell = crash_on_cell;
        obs.on_retry = crash_on_retry;
        obs.opaque = &crash;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "aborted");
        ck_assert_int_eq(crash.nretry, 2);
        ck_assert_int_eq(crash.retries, 2);
        saved = next_attempt(&fx, 8);

        /* Second attempt: one more failure is one too many for the job. */
        start.history = saved;
        start.cells = crash.cells;
        start.continue_job = true;
        start.turns_done = 2;
        start.retries_done = crash.retries;
        crash.stop_at = 1000;
        fixture_run(&fx, &obs, NULL, &start);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "retry limit reached: 3 "), "%s",
                      fx.result.reason);
        ck_assert_msg(strstr(fx.result.reason, "KeyError"), "%s",
                      fx.result.reason);
        ck_assert_int_eq(fx.result.retries, 3);
        ck_assert_int_eq(crash.retries, 3);
        cq_agent_result_release(&fx.result);
        cq_interp_destroy(&fx.interp);

        /* Third: earlier attempts ran for the whole job_timeout_s. It
         * fails before replaying a cell or asking the model anything. */
        fx.interp = new_interp();
        reqs = requests_for(fx.script);
        i = json_array_size(reqs);
        json_decref(reqs);
        start.retries_done = 0;
        start.elapsed_ms = fx.opts.job_timeout_s * 1000;
        fixture_run(&fx, &obs, NULL, &start);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_msg(strstr(fx.result.reason, "job time limit reached (120 s "
                                               "of running time, earlier "
                                               "attempts included)"),
                      "%s", fx.result.reason);
        ck_assert_int_eq(fx.result.cells, 0);
        ck_assert_int_eq(fx.result.turns, 2);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), i);
        json_decref(reqs);
        json_decref(saved);
        json_decref(crash.cells);
        fixture_release(&fx);
}
END_TEST

/* A job's time limit holds during an LLM call: a reply that would come
 * after it (here 20 s, of a 2 s limit) is not waited for. Before, the
 * call ran to its own timeout and the late reply was taken. */
START_TEST(job_time_limit_ends_a_slow_llm_call)
{
        fixture_t fx;
        json_t *reqs;

        use_backend(0);
        fixture_init(&fx, "slow-llm",
                     "[{\"delay_ms\":20000,\"content\":\"late answer\"}]");
        fx.opts.job_timeout_s = 2;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_str_eq(fx.result.reason_code, "job_timeout");
        ck_assert_msg(strstr(fx.result.reason, "job time limit reached (2 s "),
                      "%s", fx.result.reason);
        ck_assert_ptr_null(fx.result.answer);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        fixture_release(&fx);
}
END_TEST

START_TEST(resume_replays_cells_and_does_not_repeat_turns)
{
        static const char steps[] =
            "[{\"tool_calls\":[{\"code\":\"secret = 1234\"}]},"
            "{\"tool_calls\":[{\"code\":\"half = secret // 2\"}]},"
            "{\"tool_calls\":[{\"code\":\"print(secret + half)\"}]},"
            "{\"content\":\"1851\"}]";
        fixture_t fx;
        crash_t crash = {0};
        cq_agent_start_t start = {0};
        json_t *saved, *reqs, *req;
        size_t i;
        int steps_seen[8] = {0};

        /* First run: stops once the second tool result is checkpointed
         * (system, files, task, a1, t1, a2, t2 -> index 6). */
        use_backend(_i);
        fixture_init(&fx, "resume", steps);
        run_until_crash(&fx, &crash, 6);
        /* The checkpoint holds what was appended before the crash. */
        ck_assert_uint_eq(json_array_size(crash.cells), 2);
        saved = next_attempt(&fx, 6);

        /* Second run: a fresh kernel, the saved history and cells. */
        start.history = saved;
        start.cells = crash.cells;
        start.continue_job = true;
        start.turns_done = 2;
        fixture_run(&fx, NULL, NULL, &start);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.turns, 4);
        /* the replayed variables are there: 1234 + 617 */
        ck_assert(history_has(fx.result.history, "tool", "1851"));
        /* every step was asked for exactly once over both runs */
        reqs = requests_for(fx.script);
        json_array_foreach(reqs, i, req)
        {
                json_int_t step =
                    json_integer_value(json_object_get(req, "step"));

                ck_assert(step >= 0 && step < 8);
                steps_seen[step]++;
        }
        for (i = 0; i < 4; i++)
                ck_assert_msg(steps_seen[i] == 1, "step %zu asked %d times", i,
                              steps_seen[i]);
        json_decref(reqs);
        json_decref(saved);
        json_decref(crash.cells);
        fixture_release(&fx);
}
END_TEST

/* A 1x1 PNG, shown and saved by the cells of figures_keep_their_names. */
#define PNG_B64                                                                \
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwAD" \
        "hgGAWjR9awAAAABJRU5ErkJggg=="

static const cq_agent_image_t *image_named(const cq_agent_result_t *result,
                                           const char *name)
{
        size_t i;

        for (i = 0; i < result->images.n; i++)
                if (strcmp(result->images.v[i].name, name) == 0)
                        return &result->images.v[i];
        ck_abort_msg("no image named %s", name);
        return NULL;
}

/* A figure shown and saved keeps both names, each image knows the job's
 * cell that made it (numbered on from the cells of an earlier attempt),
 * and the images come by cell; a file replayed cells made has no known
 * cell until a cell changes it. */
START_TEST(figures_keep_their_names_and_cells)
{
        static const char *const codes[] = {
            "import base64, os\n"
            "from IPython.display import Image, display\n"
            "PNG = base64.b64decode('" PNG_B64 "')\n"
            "os.makedirs('plots', exist_ok=True)\n"
            "open('plots/early.png', 'wb').write(b'early')\n"
            "open('plots/kept.png', 'wb').write(b'kept')",
            "x = 2",
            "display(Image(data=PNG))\n"
            "open('revenue_by_region.png', 'wb').write(PNG)\n"
            "open('plots/early.png', 'wb').write(b'early, redrawn')",
            "open('late.png', 'wb').write(b'late')",
        };
        fixture_t fx;
        crash_t crash = {0};
        cq_agent_start_t start = {0};
        const cq_agent_image_t *shown, *saved_img, *img;
        json_t *script, *saved;
        char *steps;
        size_t i, len;
        unsigned char *png;

        script = json_array();
        for (i = 0; i < CQ_ARRAY_SIZE(codes); i++)
                json_array_append_new(
                    script,
                    json_pack("{s:[{s:s}]}", "tool_calls", "code", codes[i]));
        json_array_append_new(script, json_pack("{s:s}", "content", "done"));
        steps = json_dumps(script, 0);
        json_decref(script);

        /* First attempt: gone when the second reply is checkpointed
         * (system, files, task, a1, t1, a2 -> index 5), after one cell. */
        use_backend(_i);
        fixture_init(&fx, "figures", steps);
        run_until_crash(&fx, &crash, 5);
        ck_assert_uint_eq(json_array_size(crash.cells), 1);
        saved = next_attempt(&fx, 5);

        /* Second attempt: the job's cell 1 replayed, then cells 2 to 4. */
        start.history = saved;
        start.cells = crash.cells;
        start.continue_job = true;
        start.turns_done = 1;
        start.cells_done = 1;
        fixture_run(&fx, NULL, NULL, &start);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_int_eq(fx.result.cells, 3);
        ck_assert_uint_eq(fx.result.images.n, 5);
        png = cq_b64_decode(PNG_B64, strlen(PNG_B64), &len);
        ck_assert_ptr_nonnull(png);
        shown = image_named(&fx.result, "cell3-1.png");
        ck_assert_str_eq(shown->mime, "image/png");
        ck_assert_int_eq(shown->cell, 3);
        saved_img = image_named(&fx.result, "revenue_by_region.png");
        ck_assert_str_eq(saved_img->mime, "image/png");
        ck_assert_int_eq(saved_img->cell, 3);
        ck_assert_uint_eq(shown->len, len);
        ck_assert_uint_eq(saved_img->len, len);
        ck_assert_mem_eq(shown->data, png, len);
        ck_assert_mem_eq(saved_img->data, png, len);
        img = image_named(&fx.result, "plots/early.png");
        ck_assert_int_eq(img->cell, 3); /* rewritten by cell 3 */
        ck_assert_uint_eq(img->len, strlen("early, redrawn"));
        img = image_named(&fx.result, "late.png");
        ck_assert_int_eq(img->cell, 4);
        img = image_named(&fx.result, "plots/kept.png");
        ck_assert_int_eq(img->cell, 0); /* made by the replayed cell */
        /* by cell, a cell's shown figures before its files, those of no
         * known cell last */
        ck_assert_str_eq(fx.result.images.v[0].name, "cell3-1.png");
        ck_assert_str_eq(fx.result.images.v[4].name, "plots/kept.png");
        for (i = 1; i < 4; i++)
                ck_assert_int_le(fx.result.images.v[i - 1].cell,
                                 fx.result.images.v[i].cell);
        free(png);
        free(steps);
        json_decref(saved);
        json_decref(crash.cells);
        fixture_release(&fx);
}
END_TEST

/* A session's child replays its parent's cells: the files they make are
 * the parent's and stay out of the child's images, unless the child's own
 * cells change them. */
START_TEST(session_child_leaves_its_parents_files)
{
        static const char steps[] =
            "[{\"tool_calls\":[{\"code\":\"open('shared.png', 'wb')"
            ".write(b'parent')\\nopen('redrawn.png', 'wb')"
            ".write(b'parent')\"}]},"
            "{\"content\":\"parent done\"},"
            "{\"tool_calls\":[{\"code\":\"open('redrawn.png', 'wb')"
            ".write(b'child, redrawn')\\nopen('mine.png', 'wb')"
            ".write(b'mine')\"}]},"
            "{\"content\":\"child done\"}]";
        fixture_t fx;
        crash_t crash = {0};
        cq_agent_start_t start = {0};
        const cq_agent_image_t *img;
        json_t *history;

        /* The parent: its cell saves two figures, both its images. */
        use_backend(_i);
        fixture_init(&fx, "session_files", steps);
        crash.cells = json_array();
        {
                cq_agent_observer_t obs = {0};

                obs.on_cell = crash_on_cell;
                obs.opaque = &crash;
                fixture_run(&fx, &obs, NULL, NULL);
        }
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_uint_eq(fx.result.images.n, 2);
        history = json_incref(fx.result.history);
        ck_assert_uint_eq(json_array_size(crash.cells), 1);
        cq_agent_result_release(&fx.result);
        cq_interp_destroy(&fx.interp);
        fx.interp = new_interp();

        /* The child: the parent's cell replayed, then its own. */
        start.history = history;
        start.cells = crash.cells;
        start.parent_cells = 1;
        fixture_run(&fx, NULL, NULL, &start);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_str_eq(fx.result.answer, "child done");
        ck_assert_uint_eq(fx.result.images.n, 2);
        img = image_named(&fx.result, "mine.png");
        ck_assert_int_eq(img->cell, 1);
        img = image_named(&fx.result, "redrawn.png");
        ck_assert_int_eq(img->cell, 1);
        ck_assert_uint_eq(img->len, strlen("child, redrawn"));
        json_decref(history);
        json_decref(crash.cells);
        fixture_release(&fx);
}
END_TEST

START_TEST(input_files_by_content_and_by_url_reach_the_kernel)
{
        fixture_t fx;
        char url[256];

        use_backend(_i);
        fixture_init(&fx, "files",
                     "[{\"tool_calls\":[{\"code\":\"print(open('a.csv')"
                     ".read().strip(), open('sub/h.json').read())\"}]},"
                     "{\"content\":\"read both\"}]");
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/_fake/health",
                 cq_fake_llm_port(fake));
        fx.job.files = calloc(2, sizeof(*fx.job.files));
        ck_assert_ptr_nonnull(fx.job.files);
        fx.job.nfiles = 2;
        fx.job.files[0].name = strdup("a.csv");
        fx.job.files[0].data = (unsigned char *)strdup("x,y\n1,2\n");
        fx.job.files[0].len = 8;
        fx.job.files[1].name = strdup("sub/h.json");
        fx.job.files[1].url = strdup(url);
        /* the server is on loopback, which only an allowlist admits */
        fx.opts.fetch_allow = "127.0.0.1";
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        /* the file listing names both, the tool result shows both */
        ck_assert(history_has(fx.result.history, "user", "a.csv (8 bytes)"));
        ck_assert(history_has(fx.result.history, "user", "sub/h.json"));
        ck_assert(history_has(fx.result.history, "tool", "1,2"));
        ck_assert(history_has(fx.result.history, "tool", "\"ok\""));
        fixture_release(&fx);
}
END_TEST

/* ---------------------------------------------------- budgets and repro */

/* The script of the budget tests: two calls of 1000 input and 500 output
 * tokens ($0.006 each at the prices below), then a final answer. */
static const char budget_steps[] =
    "[{\"tool_calls\":[{\"code\":\"x = 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"tool_calls\":[{\"code\":\"y = x + 1\"}],"
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":500}},"
    "{\"content\":\"done\","
    "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":100}}]";

static cq_prices_t *test_prices(const char *doc)
{
        char errstr[256] = "";
        cq_prices_t *prices =
            cq_prices_parse(doc, strlen(doc), "test", errstr, sizeof(errstr));

        ck_assert_msg(prices != NULL, "%s", errstr);
        return prices;
}

/* The fixture's client again with replies of at most \p max_tokens. */
static void fixture_max_tokens(fixture_t *fx, long max_tokens)
{
        cq_llm_conf_t conf;
        char err[256] = "";

        cq_llm_destroy(&fx->llm);
        cq_llm_conf_init(&conf);
        conf.base_url = cq_fake_llm_base_url(fake);
        conf.model = "unused-default";
        conf.max_tokens = max_tokens;
        conf.max_attempts = 3;
        conf.backoff_base_ms = 10;
        conf.backoff_max_ms = 50;
        conf.max_wait_s = 10;
        fx->llm = cq_llm_new(&conf, err, sizeof(err));
        ck_assert_msg(fx->llm != NULL, "%s", err);
}

/* What the loop told the observer about money. */
typedef struct spend {
        int nusage, nreserve;
        cq_usage_t total;    /* the last total reported */
        double cost;         /* the last cost reported */
        double estimates[8]; /* what each reserve was asked to hold */
        int verdict;         /* what reserve answers */
} spend_t;

static int spend_on_usage(void *opaque, const cq_usage_t *total, double cost)
{
        spend_t *sp = opaque;

        sp->nusage++;
        sp->total = *total;
        sp->cost = cost;
        return 0;
}

static int spend_reserve(void *opaque, double estimate, char *why, size_t n)
{
        spend_t *sp = opaque;

        if (sp->nreserve < (int)CQ_ARRAY_SIZE(sp->estimates))
                sp->estimates[sp->nreserve] = estimate;
        sp->nreserve++;
        if (sp->verdict > 0)
                snprintf(why, n, "run R is out of money");
        return sp->verdict;
}

/* The prompt estimate of \p n messages of \p history, as the loop makes
 * it: cq_llm_estimate_tokens() plus the tools schema. */
static int64_t prompt_estimate(const json_t *history, size_t n)
{
        json_t *part = json_array(), *tools = cq_llm_tools_json();
        char *text = json_dumps(tools, JSON_COMPACT);
        int64_t est;
        size_t i;

        for (i = 0; i < n; i++)
                json_array_append(part, json_array_get(history, i));
        est = cq_llm_estimate_tokens(part) + ((int64_t)strlen(text) + 2) / 3;
        free(text);
        json_decref(tools);
        json_decref(part);
        return est;
}

START_TEST(budget_estimate_refuses_the_crossing_call)
{
        fixture_t fx;
        cq_prices_t *prices =
            test_prices("{\"models\":{\"script:*\":{\"input\":1,"
                        "\"output\":10}}}");
        cq_price_t price = {1, 10, 1, 1};
        cq_agent_observer_t obs = {0};
        spend_t sp = {0};
        int64_t first, last;
        json_t *reqs;
        char want[256];

        use_backend(0);
        fixture_init(&fx, "budget_cost", budget_steps);
        fixture_max_tokens(&fx, 1000);
        fx.opts.prices = prices;
        fx.job.limits.max_cost_usd = 0.013;
        obs.on_usage = spend_on_usage;
        obs.reserve = spend_reserve;
        obs.opaque = &sp;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_str_eq(fx.result.reason_code, "budget");
        /* one call made, the second refused before it was sent */
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        ck_assert_int_eq(fx.result.turns, 1);
        ck_assert_int_eq(sp.nusage, 1);
        ck_assert_int_eq(sp.total.prompt_tokens, 1000);
        ck_assert_int_eq(sp.total.completion_tokens, 500);
        ck_assert_double_eq_tol(sp.cost, 0.006, 1e-12);
        ck_assert_double_eq_tol(fx.result.cost_usd, 0.006, 1e-12);
        /* the run's budget was asked once, before the first call, for the
         * most that call could cost: its prompt as estimated, all at the
         * input price, and a whole reply at the output price */
        ck_assert_int_eq(sp.nreserve, 1);
        first = prompt_estimate(fx.result.history, 3);
        ck_assert_double_eq_tol(sp.estimates[0],
                                cq_price_estimate(&price, first, 1000), 1e-15);
        /* the refusal names the estimate of the call it refused */
        last = prompt_estimate(fx.result.history,
                               json_array_size(fx.result.history));
        snprintf(want, sizeof(want),
                 "cost budget: the next LLM call could cost up to $%.6f "
                 "(about %lld prompt and at most 1000 output tokens), which "
                 "would cross limits.max_cost_usd $0.013 ($0.006000 spent so "
                 "far)",
                 cq_price_estimate(&price, last, 1000), (long long)last);
        ck_assert_str_eq(fx.result.reason, want);
        fixture_release(&fx);

        /* max_tokens_total: 1500 used, then about `last` in and 1000 out */
        fixture_init(&fx, "budget_tokens", budget_steps);
        fixture_max_tokens(&fx, 1000);
        fx.job.limits.max_tokens_total = 3000;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(fx.result.reason_code, "budget");
        last = prompt_estimate(fx.result.history,
                               json_array_size(fx.result.history));
        snprintf(want, sizeof(want),
                 "token budget: the next LLM call could use up to %lld tokens "
                 "(about %lld prompt and at most 1000 output), which would "
                 "cross limits.max_tokens_total 3000 (1500 used so far)",
                 (long long)(last + 1000), (long long)last);
        ck_assert_str_eq(fx.result.reason, want);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        fixture_release(&fx);
        cq_prices_destroy(&prices);
}
END_TEST

START_TEST(budget_counts_earlier_attempts_and_unknown_costs)
{
        fixture_t fx;
        cq_prices_t *prices =
            test_prices("{\"models\":{\"script:*\":{\"input\":1,"
                        "\"output\":10}}}");
        cq_prices_t *other = test_prices(
            "{\"models\":{\"gpt-4o\":{\"input\":1,\"output\":10}}}");
        cq_agent_start_t start = {0};
        cq_agent_observer_t obs = {0};
        spend_t sp = {0};
        json_t *reqs;

        use_backend(0);
        /* an earlier attempt spent $0.006: the first call would cross */
        fixture_init(&fx, "budget_earlier", budget_steps);
        fixture_max_tokens(&fx, 1000);
        fx.opts.prices = prices;
        fx.job.limits.max_cost_usd = 0.013;
        start.usage_done.prompt_tokens = 1000;
        start.usage_done.completion_tokens = 500;
        start.cost_done_usd = 0.006;
        fixture_run(&fx, NULL, NULL, &start);
        ck_assert_str_eq(fx.result.reason_code, "budget");
        ck_assert_int_eq(fx.result.prompt_tokens, 1000);
        ck_assert_double_eq_tol(fx.result.cost_usd, 0.006, 1e-12);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        fixture_release(&fx);

        /* a model without a price cannot be held to a cost */
        fixture_init(&fx, "budget_noprice", budget_steps);
        fx.opts.prices = other;
        fx.job.limits.max_cost_usd = 5;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(fx.result.reason_code, "budget");
        ck_assert_msg(strstr(fx.result.reason,
                             "has no price (not in CODERQ_PRICES_FILE)"),
                      "%s", fx.result.reason);
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        fixture_release(&fx);
        fixture_init(&fx, "budget_nofile", budget_steps);
        fx.job.limits.max_cost_usd = 5;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_msg(strstr(fx.result.reason, "(CODERQ_PRICES_FILE is unset)"),
                      "%s", fx.result.reason);
        fixture_release(&fx);

        /* a reply without usage makes the cost unknown (never 0), and a
         * cost limit cannot be kept after it */
        fixture_init(&fx, "budget_nousage",
                     "[{\"tool_calls\":[{\"code\":\"x = 1\"}],"
                     "\"usage\":null},{\"content\":\"done\"}]");
        fixture_max_tokens(&fx, 1000);
        fx.opts.prices = prices;
        fx.job.limits.max_cost_usd = 1;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(fx.result.reason_code, "budget");
        ck_assert_msg(strstr(fx.result.reason, "the cost so far is "
                                               "unknown"),
                      "%s", fx.result.reason);
        ck_assert(fx.result.cost_usd < 0);
        fixture_release(&fx);
        /* without prices every call's cost is unknown */
        fixture_init(&fx, "budget_unpriced", budget_steps);
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_ptr_null(fx.result.reason_code);
        ck_assert(fx.result.cost_usd < 0);
        ck_assert_int_eq(fx.result.prompt_tokens, 3000);
        fixture_release(&fx);

        /* the run's budget says no: no call at all */
        fixture_init(&fx, "budget_run", budget_steps);
        fx.opts.prices = prices;
        sp.verdict = 1;
        obs.reserve = spend_reserve;
        obs.opaque = &sp;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(fx.result.reason_code, "budget");
        ck_assert_str_eq(fx.result.reason, "run budget: run R is out of money");
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        fixture_release(&fx);
        /* ... or cannot be asked: the job stops, to be resumed */
        fixture_init(&fx, "budget_run_down", budget_steps);
        sp.verdict = -1;
        fixture_run(&fx, &obs, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "aborted");
        fixture_release(&fx);
        cq_prices_destroy(&prices);
        cq_prices_destroy(&other);
}
END_TEST

/* A job's temperature, top_p and seed reach every request; the Messages
 * API gets temperature and top_p, and a seed it cannot take fails the
 * job before any call. What was sent is recorded, then the client is
 * back to its configuration. */
START_TEST(sampling_parameters_reach_the_request)
{
        fixture_t fx;
        json_t *reqs, *req, *conf_sampling;
        size_t i;

        use_backend(0);
        fixture_init(&fx, "sampling_openai", budget_steps);
        fx.job.sampling.has_temperature = true;
        fx.job.sampling.temperature = 0.3;
        fx.job.sampling.has_top_p = true;
        fx.job.sampling.top_p = 0.9;
        fx.job.sampling.has_seed = true;
        fx.job.sampling.seed = 42;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 3);
        json_array_foreach(reqs, i, req)
        {
                const json_t *body = json_object_get(req, "body");

                ck_assert_double_eq(
                    json_real_value(json_object_get(body, "temperature")), 0.3);
                ck_assert_double_eq(
                    json_real_value(json_object_get(body, "top_p")), 0.9);
                ck_assert_int_eq(
                    json_integer_value(json_object_get(body, "seed")), 42);
        }
        json_decref(reqs);
        ck_assert_double_eq(
            json_real_value(json_object_get(fx.result.repro, "temperature")),
            0.3);
        ck_assert_int_eq(
            json_integer_value(json_object_get(fx.result.repro, "seed")), 42);
        ck_assert_str_eq(
            json_string_value(json_object_get(fx.result.repro, "provider")),
            "openai");
        conf_sampling = cq_llm_sampling_json(fx.llm);
        ck_assert(json_is_null(json_object_get(conf_sampling, "temperature")));
        ck_assert(json_is_null(json_object_get(conf_sampling, "seed")));
        json_decref(conf_sampling);
        fixture_release(&fx);

        fixture_init(&fx, "sampling_anthropic", budget_steps);
        fx.job.provider = strdup("anthropic");
        fx.job.sampling.has_temperature = true;
        fx.job.sampling.temperature = 0.25;
        fx.job.sampling.has_top_p = true;
        fx.job.sampling.top_p = 0.5;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 3);
        req = json_array_get(reqs, 0);
        ck_assert(json_is_true(json_object_get(req, "valid")));
        ck_assert_double_eq(json_real_value(json_object_get(
                                json_object_get(req, "body"), "temperature")),
                            0.25);
        ck_assert_double_eq(json_real_value(json_object_get(
                                json_object_get(req, "body"), "top_p")),
                            0.5);
        ck_assert_ptr_null(
            json_object_get(json_object_get(req, "body"), "seed"));
        json_decref(reqs);
        fixture_release(&fx);

        fixture_init(&fx, "sampling_anthropic_seed", budget_steps);
        fx.job.provider = strdup("anthropic");
        fx.job.sampling.has_seed = true;
        fx.job.sampling.seed = 1;
        fixture_run(&fx, NULL, NULL, NULL);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_str_eq(fx.result.reason_code, "invalid_job");
        ck_assert_str_eq(fx.result.reason,
                         "field \"seed\": provider anthropic takes no seed "
                         "(the Messages API has none)");
        reqs = requests_for(fx.script);
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        fixture_release(&fx);
}
END_TEST

/* What a run used, on both backends: the interpreter's Python and its
 * packages (numpy, pandas and matplotlib are installed here), the
 * backend, the coderq version and the hash of the system prompt sent. */
START_TEST(repro_records_what_the_run_used)
{
        fixture_t fx;
        const json_t *repro, *packages;
        char hex[65];

        use_backend(_i);
        fixture_init(&fx, "repro", budget_steps);
        fixture_run(&fx, NULL, NULL, NULL);
        repro = fx.result.repro;
        ck_assert_ptr_nonnull(repro);
        ck_assert_msg(
            strncmp(json_string_value(json_object_get(repro, "python")), "3.",
                    2) == 0,
            "python %s", json_string_value(json_object_get(repro, "python")));
        packages = json_object_get(repro, "packages");
        ck_assert_ptr_nonnull(
            json_string_value(json_object_get(packages, "numpy")));
        ck_assert_ptr_nonnull(
            json_string_value(json_object_get(packages, "pandas")));
        ck_assert_ptr_nonnull(
            json_string_value(json_object_get(packages, "matplotlib")));
        ck_assert_str_eq(json_string_value(json_object_get(repro, "backend")),
                         backends[_i]);
        ck_assert_str_eq(
            json_string_value(json_object_get(repro, "coderq_version")),
            CQ_VERSION);
        ck_assert_str_eq(json_string_value(json_object_get(repro, "model")),
                         fx.model);
        cq_sha256_hex(cq_agent_default_system_prompt(),
                      strlen(cq_agent_default_system_prompt()), hex);
        ck_assert_str_eq(
            json_string_value(json_object_get(repro, "system_prompt_sha256")),
            hex);
        ck_assert(json_is_null(json_object_get(repro, "temperature")));
        fixture_release(&fx);
        /* a job's own system prompt is the one hashed */
        fixture_init(&fx, "repro_prompt", budget_steps);
        fx.job.system_prompt = strdup("Be brief.");
        fixture_run(&fx, NULL, NULL, NULL);
        cq_sha256_hex("Be brief.", 9, hex);
        ck_assert_str_eq(json_string_value(json_object_get(
                             fx.result.repro, "system_prompt_sha256")),
                         hex);
        fixture_release(&fx);
}
END_TEST

/* A case of its own (a CTest entry of its own, tests/CMakeLists.txt),
 * with the suite's fixture. */
static TCase *agent_case(const char *name)
{
        TCase *tc = tcase_create(name);

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        return tc;
}

static Suite *agent_suite(void)
{
        Suite *s = suite_create("agent");
        TCase *tc = agent_case("loop");

        tcase_add_loop_test(tc, success_first_try, 0, 2);
        tcase_add_loop_test(tc, error_then_reflection_then_fixed, 0, 2);
        tcase_add_loop_test(tc, retry_limit_fails_with_last_error, 0, 2);
        tcase_add_loop_test(tc, resumed_job_keeps_counting_retries_and_time, 0,
                            2);
        tcase_add_loop_test(tc, turns_are_checkpointed_whole, 0, 2);
        tcase_add_loop_test(
            tc, held_reply_is_checkpointed_alone_when_its_cell_is_slow, 0, 2);
        tcase_add_loop_test(tc, held_reply_is_kept_when_the_run_stops, 0, 2);
        tcase_add_loop_test(tc, held_reply_refused_stops_all_checkpoints, 0, 2);
        tcase_add_loop_test(tc, cell_a_drain_interrupts_is_not_recorded, 0, 2);
        tcase_add_loop_test(tc, turn_limit_fails, 0, 2);
        suite_add_tcase(s, tc);
        /* Tests, and what the model may see of them: CQ_CHECK_CASE=tests. */
        tc = agent_case("tests");
        tcase_add_loop_test(tc, tests_fail_then_pass, 0, 2);
        tcase_add_loop_test(tc, tests_never_pass_fails, 0, 2);
        tcase_add_loop_test(tc, fresh_tests_run_on_the_successful_cells_alone,
                            0, 2);
        tcase_add_loop_test(tc, hanging_or_killing_tests_fail_with_a_reason, 0,
                            2);
        tcase_add_loop_test(tc, tests_cannot_read_their_expected_values, 0, 2);
        suite_add_tcase(s, tc);
        /* The LLM providers and their replies: CQ_CHECK_CASE=llm. */
        tc = agent_case("llm");
        tcase_add_loop_test(tc, two_tool_calls_both_answered_in_order, 0, 2);
        tcase_add_loop_test(tc, job_provider_anthropic, 0, 2);
        tcase_add_loop_test(tc, rate_limited_then_success, 0, 2);
        tcase_add_loop_test(tc, unauthorized_fails_at_once, 0, 2);
        tcase_add_loop_test(
            tc, invalid_json_reply_is_retried_then_fails_clearly, 0, 2);
        tcase_add_loop_test(tc, tool_output_is_bounded, 0, 2);
        tcase_add_loop_test(tc, old_tool_outputs_are_elided_near_the_window, 0,
                            2);
        suite_add_tcase(s, tc);
        /* Memory, inputs, resumes, figures and sessions: CQ_CHECK_CASE=resume.
         */
        tc = agent_case("resume");
        tcase_add_loop_test(tc, memory_hit_skips_the_llm, 0, 2);
        tcase_add_loop_test(
            tc, input_files_by_content_and_by_url_reach_the_kernel, 0, 2);
        tcase_add_loop_test(tc, resume_replays_cells_and_does_not_repeat_turns,
                            0, 2);
        tcase_add_loop_test(tc, figures_keep_their_names_and_cells, 0, 2);
        tcase_add_loop_test(tc, session_child_leaves_its_parents_files, 0, 2);
        tcase_add_test(tc, job_time_limit_ends_a_slow_llm_call);
        suite_add_tcase(s, tc);
        /* Limits of money and tokens, sampling, what a run used:
         * CQ_CHECK_CASE=budget runs them alone. */
        tc = agent_case("budget");
        tcase_add_test(tc, budget_estimate_refuses_the_crossing_call);
        tcase_add_test(tc, budget_counts_earlier_attempts_and_unknown_costs);
        tcase_add_test(tc, sampling_parameters_reach_the_request);
        tcase_add_loop_test(tc, repro_records_what_the_run_used, 0, 2);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(agent_suite)
