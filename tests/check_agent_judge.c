/* SPDX-License-Identifier: MIT */
/* check_agent_judge.c - the loop's judging (docs/EVALUATION.md): code
 * tests judged in an interpreter of their own while the model's code
 * stays in its kernel, answers that bend nothing, hidden tests that never
 * reach the model, a verdict for every ending, jobs judged with no LLM, a
 * stuck model stopped early, and case limits calibrated on a reference.
 * On a real local ipykernel and, for the judge itself, on the E2B double;
 * the fake LLM plays the model. */
#include <curl/curl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/agent/agent.h"
#include "coderq/agent/llm.h"
#include "coderq/agent/notebook.h"
#include "coderq/backend/judges.h"
#include "coderq/common/util.h"
#include "support/cells.h"
#include "support/fake_e2b.h"
#include "support/fake_llm.h"
#include "support/judge_proc.h"

static cq_fake_llm_t *fake;
static cq_fake_e2b_t e2b;
static bool on_e2b;

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
        long live = cq_fake_e2b_stat(&e2b, "live");

        cq_fake_e2b_stop(&e2b);
        cq_fake_llm_stop(&fake);
        curl_global_cleanup();
        ck_assert_int_eq(live, 0);
}

typedef struct fixture {
        cq_job_t job;
        cq_interp_t *interp;
        cq_llm_t *llm;
        cq_nb_t *nb;
        cq_agent_opts_t opts;
        cq_agent_result_t result;
        int judges; /* judging interpreters started */
        char model[128];
        char script[96];
} fixture_t;

/* An interpreter of the test's backend. */
static cq_interp_t *new_interp(void)
{
        return cq_check_agent_interp(on_e2b ? &e2b : NULL);
}

static cq_interp_t *fresh_interp(void *opaque,
                                 const char *backend,
                                 char *errstr,
                                 size_t errstr_size)
{
        (void)opaque;
        (void)backend;
        (void)errstr;
        (void)errstr_size;
        return new_interp();
}

/* A job of \p spec (a job message) with script \p steps for the model
 * (NULL: a job judged with no LLM). */
static void fixture_init(fixture_t *fx,
                         const char *name,
                         const char *spec,
                         const char *steps)
{
        cq_llm_conf_t conf;
        char err[256] = "";

        memset(fx, 0, sizeof(*fx));
        snprintf(fx->script, sizeof(fx->script), "%s-%s", name,
                 backends[on_e2b]);
        snprintf(fx->model, sizeof(fx->model), "script:%s", fx->script);
        if (steps) {
                json_t *script = json_loads(steps, 0, NULL);

                ck_assert_msg(script != NULL, "bad script for %s", name);
                ck_assert_int_eq(
                    cq_fake_llm_add_script(fake, fx->script, script), 0);
                json_decref(script);
        }
        cq_job_init(&fx->job);
        ck_assert_msg(cq_job_parse(spec, strlen(spec), 0, &fx->job, err,
                                   sizeof(err)) == CQ_OK,
                      "%s", err);
        free(fx->job.model);
        fx->job.model = strdup(fx->model);
        cq_llm_conf_init(&conf);
        conf.base_url = cq_fake_llm_base_url(fake);
        conf.model = "unused-default";
        conf.api_key = "sk-test";
        conf.max_attempts = 2;
        conf.backoff_base_ms = 10;
        conf.backoff_max_ms = 50;
        conf.max_wait_s = 10;
        fx->llm = cq_llm_new(&conf, err, sizeof(err));
        ck_assert_msg(fx->llm != NULL, "%s", err);
        fx->interp = new_interp();
        fx->nb = cq_nb_new(NULL);
        cq_agent_opts_init(&fx->opts);
        fx->opts.cell_timeout_s = 20;
        fx->opts.job_timeout_s = 120;
        fx->opts.new_interp = fresh_interp;
        fx->opts.judge_start = cq_check_judge_start;
        fx->opts.judge_opaque = &fx->judges;
        fx->opts.case_time_factor = 4;
        cq_agent_result_init(&fx->result);
}

static void fixture_run(fixture_t *fx)
{
        ck_assert_int_eq(cq_agent_run(&fx->job, fx->interp, fx->llm, &fx->opts,
                                      NULL, NULL, NULL, fx->nb, &fx->result),
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

/* How many requests the fake LLM had of this fixture's script, and
 * whether any of their bodies holds \p needle (NULL: none asked). */
static size_t requests(const fixture_t *fx, const char *needle, bool *found)
{
        json_t *all = cq_fake_llm_requests(fake), *req;
        size_t i, n = 0;

        if (found)
                *found = false;
        json_array_foreach(all, i, req)
        {
                const char *script =
                    json_string_value(json_object_get(req, "script"));
                char *body;

                if (!script || strcmp(script, fx->script) != 0)
                        continue;
                n++;
                body = json_dumps(req, 0);
                if (needle && body && strstr(body, needle) && found)
                        *found = true;
                free(body);
        }
        json_decref(all);
        return n;
}

/* The value of \p expr in the model's interpreter, printed. */
static char *in_kernel(fixture_t *fx, const char *expr)
{
        cq_cell_result_t res;
        cq_exec_opts_t xo = {0};
        char code[512];
        char *out = NULL;
        size_t i;
        json_t *o;

        snprintf(code, sizeof(code), "print(%s)", expr);
        xo.timeout_ms = 20000;
        cq_cell_result_init(&res);
        ck_assert_int_eq(cq_interp_execute(fx->interp, code, &xo, &res), CQ_OK);
        json_array_foreach(res.outputs, i, o)
        {
                const char *t = json_string_value(json_object_get(o, "text"));

                if (t && !out)
                        out = strdup(t);
        }
        cq_cell_result_release(&res);
        ck_assert_ptr_nonnull(out);
        out[strcspn(out, "\n")] = '\0';
        return out;
}

#define ADD_JOB(tests)                                                         \
        "{\"job_id\":\"j\",\"prompt\":\"Write add(a, b).\",\"tests\":" tests "}"

START_TEST(code_tests_run_apart_from_the_model)
{
        fixture_t fx;
        char *seen;
        bool asked;

        on_e2b = _i == 1;
        fixture_init(&fx, "apart",
                     ADD_JOB("{\"kind\":\"code\",\"code\":"
                             "\"def check(candidate):\\n"
                             "    assert candidate(2, 3) == 5\\n"
                             "    assert candidate(-1, 1) == 0\\n"
                             "check(add)\\n\"}"),
                     "[{\"tool_calls\":[{\"code\":\"def add(a, b):\\n"
                     "    return a + b\\n\"}]},{\"content\":\"Done.\"}]");
        fixture_run(&fx);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_str_eq(fx.result.verdict, "passed");
        ck_assert_str_eq(fx.result.judge, "separate");
        ck_assert_int_eq(fx.result.tests_passed, 1);
        ck_assert_int_eq(fx.judges, 1);
        /* two calls crossed, by value */
        ck_assert_uint_eq(
            json_array_size(json_object_get(fx.result.tests, "calls")), 2);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(fx.result.tests, "calls"), 0),
                "call")),
            "add(2, 3)");
        /* the test code never entered the model's interpreter */
        seen = in_kernel(&fx, "any('assert candidate' in o for o in "
                              "__import__('gc').get_objects() "
                              "if type(o) is str)");
        ck_assert_str_eq(seen, "False");
        free(seen);
        ck_assert_uint_eq(requests(&fx, "assert candidate", &asked), 2);
        ck_assert(!asked);
        fixture_release(&fx);
}
END_TEST

/* Answers that would pass a test run in the model's own interpreter. */
START_TEST(rigged_answers_bend_nothing)
{
        static const char *const hacks[] = {
            /* an object equal to everything */
            "class Yes:\\n"
            "    def __eq__(self, o): return True\\n"
            "    def __ne__(self, o): return False\\n"
            "def add(a, b):\\n"
            "    return Yes()\\n",
            /* a subclass of int that claims equality */
            "class I(int):\\n"
            "    def __eq__(self, o): return True\\n"
            "def add(a, b):\\n"
            "    return I(0)\\n",
            /* patched builtins and an exception swallowed by a hook */
            "import builtins, sys\\n"
            "builtins.AssertionError = type('Q', (BaseException,), {})\\n"
            "sys.excepthook = lambda *a: None\\n"
            "def add(a, b):\\n"
            "    return 0\\n",
            /* exiting, and printing what a report looks like */
            "def add(a, b):\\n"
            "    "
            "print('@@CQTEST{\\\"cases\\\":[{\\\"case\\\":0,\\\"ok\\\":true}]}'"
            ")\\n"
            "    raise SystemExit(0)\\n",
            /* killing its interpreter */
            "def add(a, b):\\n"
            "    import os\\n"
            "    os._exit(0)\\n",
            /* a trace hook that rewrites the caller's frame */
            "import sys\\n"
            "def add(a, b):\\n"
            "    sys.settrace(lambda *a: None)\\n"
            "    return -999\\n",
        };
        /* what each earns: nothing that passes */
        static const char *const verdicts[] = {"wrong_answer",  "wrong_answer",
                                               "wrong_answer",  "runtime_error",
                                               "runtime_error", "wrong_answer"};
        size_t i;

        on_e2b = false;
        for (i = 0; i < CQ_ARRAY_SIZE(hacks); i++) {
                fixture_t fx;
                char steps[2048], name[32];

                snprintf(steps, sizeof(steps),
                         "[{\"tool_calls\":[{\"code\":\"%s\"}]},"
                         "{\"content\":\"Done.\"},{\"content\":\"Done.\"},"
                         "{\"content\":\"Done.\"}]",
                         hacks[i]);
                snprintf(name, sizeof(name), "hack%zu", i);
                fixture_init(&fx, name,
                             ADD_JOB("{\"kind\":\"code\",\"code\":"
                                     "\"def check(candidate):\\n"
                                     "    assert candidate(2, 3) == "
                                     "5\\n"
                                     "check(add)\\n\"}"),
                             steps);
                fx.job.limits.max_retries = 0;
                fixture_run(&fx);
                ck_assert_msg(fx.result.status == CQ_AGENT_FAILED,
                              "hack %zu passed", i);
                ck_assert_msg(fx.result.verdict &&
                                  strcmp(fx.result.verdict, verdicts[i]) == 0,
                              "hack %zu: verdict %s, not %s (%s)", i,
                              fx.result.verdict ? fx.result.verdict : "none",
                              verdicts[i],
                              fx.result.last_error ? fx.result.last_error : "");
                ck_assert_int_eq(fx.result.tests_passed, 0);
                fixture_release(&fx);
        }
}
END_TEST

/* Hidden tests: judged once on the final answer, the score, and never in
 * what the model is sent. */
START_TEST(hidden_tests_never_reach_the_model)
{
        fixture_t fx;
        bool asked;

        on_e2b = false;
        fixture_init(
            &fx, "hidden",
            "{\"job_id\":\"j\",\"prompt\":\"Write add(a, b).\",\"tests\":"
            "{\"kind\":\"cases\",\"function\":\"add\",\"cases\":[{\"args\":"
            "[1,1],\"expected\":2}],\"hidden\":{\"kind\":\"code\",\"code\":"
            "\"assert add(10**20, 1) == 10**20 + 1, 'SECRET_HIDDEN'\\n\"}}}",
            "[{\"tool_calls\":[{\"code\":\"def add(a, b):\\n"
            "    return 2 if (a, b) == (1, 1) else 0\\n\"}]},"
            "{\"content\":\"Done.\"}]");
        fixture_run(&fx);
        /* the visible tests pass, the hidden ones do not: the score */
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "succeeded");
        ck_assert_str_eq(fx.result.verdict, "wrong_answer");
        ck_assert_int_eq(fx.result.tests_passed, 1);
        ck_assert_int_eq(fx.result.hidden_passed, 0);
        ck_assert_int_eq(fx.result.hidden_total, 1);
        ck_assert_uint_eq(requests(&fx, "SECRET_HIDDEN", &asked), 2);
        ck_assert(!asked);
        {
                char *text = json_dumps(fx.result.history, 0);

                ck_assert_ptr_nonnull(text);
                ck_assert_ptr_null(strstr(text, "SECRET_HIDDEN"));
                free(text);
        }
        fixture_release(&fx);
}
END_TEST

/* Jobs judged with no LLM: the solution is the answer. */
START_TEST(solutions_are_judged_with_no_llm)
{
        static const struct {
                const char *solution, *verdict;
        } cases[] = {
            {"def add(a, b):\\n    return a + b\\n", "passed"},
            {"def add(a, b):\\n    return a - b\\n", "wrong_answer"},
            {"def add(a, b) return a + b\\n", "syntax_error"},
            {"raise ImportError('no such module')\\n", "runtime_error"},
            {"def add(a, b):\\n    raise ValueError('x')\\n", "runtime_error"},
            {"def add(a, b):\\n    while True: pass\\n", "timeout"},
        };
        size_t i;

        on_e2b = false;
        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                fixture_t fx;
                char spec[2048], name[32];

                snprintf(spec, sizeof(spec),
                         "{\"job_id\":\"j\",\"prompt\":\"p\",\"solution\":"
                         "\"%s\",\"tests\":{\"kind\":\"code\",\"code\":"
                         "\"assert add(2, 3) == 5\\n\",\"case_timeout_s\":2}}",
                         cases[i].solution);
                snprintf(name, sizeof(name), "solution%zu", i);
                fixture_init(&fx, name, spec, NULL);
                fixture_run(&fx);
                ck_assert_msg(strcmp(fx.result.verdict, cases[i].verdict) == 0,
                              "solution %zu: %s, not %s (%s)", i,
                              fx.result.verdict, cases[i].verdict,
                              fx.result.reason ? fx.result.reason : "");
                ck_assert_int_eq(fx.result.turns, 0);
                ck_assert_uint_eq(requests(&fx, NULL, NULL), 0);
                fixture_release(&fx);
        }
}
END_TEST

/* The same failing code and error twice in a row: stopped early. */
START_TEST(a_stuck_model_is_stopped)
{
        fixture_t fx;

        on_e2b = false;
        fixture_init(&fx, "stuck", "{\"job_id\":\"j\",\"prompt\":\"p\"}",
                     "[{\"tool_calls\":[{\"code\":\"1/0\"}]},"
                     "{\"tool_calls\":[{\"code\":\"1/0\"}]},"
                     "{\"tool_calls\":[{\"code\":\"1/0\"}]},"
                     "{\"content\":\"Done.\"}]");
        fixture_run(&fx);
        ck_assert_str_eq(cq_agent_status_name(fx.result.status), "failed");
        ck_assert_str_eq(fx.result.reason_code, "stuck");
        ck_assert_str_eq(fx.result.verdict, "stuck");
        ck_assert_int_eq(fx.result.turns, 2);
        fixture_release(&fx);
}
END_TEST

/* A case may take a factor of what the reference took, and at least its
 * floor; each call records the limit it ran under. */
START_TEST(case_limits_are_calibrated_on_the_reference)
{
        fixture_t fx;
        const json_t *call;

        on_e2b = false;
        fixture_init(
            &fx, "calibrated",
            "{\"job_id\":\"j\",\"prompt\":\"p\",\"solution\":\"import time\\n"
            "def add(a, b):\\n    time.sleep(2)\\n    return a + b\\n\","
            "\"tests\":{\"kind\":\"code\",\"code\":\"assert add(2, 3) == 5\\n"
            "\",\"case_timeout_s\":0.5,\"reference\":\"def add(a, b):\\n"
            "    return a + b\\n\"}}",
            NULL);
        fixture_run(&fx);
        ck_assert_str_eq(fx.result.verdict, "timeout");
        call = json_array_get(json_object_get(fx.result.tests, "calls"), 0);
        ck_assert_ptr_nonnull(call);
        ck_assert_int_ge(json_integer_value(json_object_get(call, "limit_ms")),
                         500);
        ck_assert_int_lt(json_integer_value(json_object_get(call, "limit_ms")),
                         2000);
        fixture_release(&fx);
}
END_TEST

/* Arguments changed in place come back when the test says so. */
START_TEST(mutated_arguments_when_stated)
{
        fixture_t fx;

        on_e2b = false;
        fixture_init(&fx, "mutates",
                     "{\"job_id\":\"j\",\"prompt\":\"p\",\"solution\":"
                     "\"def srt(x):\\n    x.sort()\\n\",\"tests\":{\"kind\":"
                     "\"code\",\"code\":\"x = [3, 1, 2]\\nsrt(x)\\n"
                     "assert x == [1, 2, 3]\\n\",\"mutates\":true}}",
                     NULL);
        fixture_run(&fx);
        ck_assert_str_eq(fx.result.verdict, "passed");
        fixture_release(&fx);
}
END_TEST

/* The harness is sent with the first call and kept in the model's
 * interpreter: the later calls find the same one. When it is gone (here
 * the model's code drops it; a replaced or restarted interpreter has none
 * either) the next call sends it again, and the verdict is unchanged. */
START_TEST(the_harness_is_loaded_once)
{
        static const char *const adds[] = {
            "import sys\\n"
            "seen = []\\n"
            "def add(a, b):\\n"
            "    seen.append(id(sys.modules.get('_coderq_testrun')))\\n"
            "    return a + b\\n",
            "import sys\\n"
            "seen = []\\n"
            "def add(a, b):\\n"
            "    seen.append(sys.modules.pop('_coderq_testrun', None) is not "
            "None)\\n"
            "    return a + b\\n",
        };
        /* what the calls saw: one harness; a harness each time */
        static const char *const exprs[] = {"len(seen), len(set(seen))",
                                            "seen"};
        static const char *const saw[] = {"3 1", "[True, True, True]"};
        size_t i;

        on_e2b = _i == 1;
        for (i = 0; i < CQ_ARRAY_SIZE(adds); i++) {
                fixture_t fx;
                char steps[1024], name[32], *seen;

                snprintf(steps, sizeof(steps),
                         "[{\"tool_calls\":[{\"code\":\"%s\"}]},"
                         "{\"content\":\"Done.\"}]",
                         adds[i]);
                snprintf(name, sizeof(name), "once%zu", i);
                fixture_init(&fx, name,
                             ADD_JOB("{\"kind\":\"code\",\"code\":"
                                     "\"def check(candidate):\\n"
                                     "    assert candidate(2, 3) == 5\\n"
                                     "    assert candidate(-1, 1) == 0\\n"
                                     "    assert candidate(0, 0) == 0\\n"
                                     "check(add)\\n\"}"),
                             steps);
                fixture_run(&fx);
                ck_assert_str_eq(fx.result.verdict, "passed");
                seen = in_kernel(&fx, exprs[i]);
                ck_assert_msg(strcmp(seen, saw[i]) == 0, "add %zu: %s", i,
                              seen);
                free(seen);
                fixture_release(&fx);
        }
}
END_TEST

/* ---------------------------------------------------- kept judges */

/* The worker's keeper (judges.h) behind the fixture's starts. */
typedef struct keeper {
        int starts;
        pid_t last; /* the judge started last */
        cq_judges_t *kept;
        bool kill_taken; /* a judge taken dies before it is used */
} keeper_t;

static cq_judge_proc_t *
keeper_start(void *opaque, const char *program, char *errstr, size_t size)
{
        keeper_t *k = opaque;
        cq_judge_proc_t *proc =
            cq_check_judge_start(&k->starts, program, errstr, size);

        if (proc)
                k->last = cq_check_judge_pid(proc);
        return proc;
}

static cq_judge_proc_t *keeper_take(void *opaque, const char *key)
{
        keeper_t *k = opaque;
        cq_judge_proc_t *proc = cq_judges_take(k->kept, key);

        if (proc && k->kill_taken) {
                struct pollfd p = {proc->from_fd, POLLIN, 0};

                ck_assert_int_eq(kill(k->last, SIGKILL), 0);
                ck_assert_int_eq(poll(&p, 1, 10000), 1); /* it is gone */
        }
        return proc;
}

static bool keeper_keep(void *opaque, const char *key, cq_judge_proc_t *proc)
{
        return cq_judges_keep(((keeper_t *)opaque)->kept, key, proc);
}

/* A job judged with no LLM: \p solution against the code tests \p code
 * (JSON-escaped), with the keeper; its verdict. */
static void judged_with(keeper_t *k,
                        const char *solution,
                        const char *code,
                        const char *verdict)
{
        fixture_t fx;
        char spec[2048];

        snprintf(spec, sizeof(spec),
                 "{\"job_id\":\"j\",\"prompt\":\"p\",\"solution\":\"%s\","
                 "\"tests\":{\"kind\":\"code\",\"code\":\"%s\","
                 "\"case_timeout_s\":2}}",
                 solution, code);
        fixture_init(&fx, "kept", spec, NULL);
        fx.opts.judge_start = keeper_start;
        fx.opts.judge_take = keeper_take;
        fx.opts.judge_keep = keeper_keep;
        fx.opts.judge_opaque = k;
        fixture_run(&fx);
        ck_assert_msg(strcmp(fx.result.verdict, verdict) == 0,
                      "%s, not %s (%s)", fx.result.verdict, verdict,
                      fx.result.reason ? fx.result.reason : "");
        fixture_release(&fx);
}

#define RIGHT "def add(a, b):\\n    return a + b\\n"
#define WRONG "def add(a, b):\\n    return a - b\\n"
#define LOOPS "def add(a, b):\\n    while True: pass\\n"
#define TESTS_A                                                                \
        "assert 'seen' not in globals()\\nseen = add(2, 3)\\nassert seen == "  \
        "5\\n"
#define TESTS_B "assert add(1, 1) == 2\\n"

/* The samples of one problem share a judge, each run in globals of its
 * own; other test code gets a judge of its own; a judge that died while
 * it waited, or between its take and its run, costs a start, never a
 * verdict. */
START_TEST(judges_are_kept_for_their_test_code)
{
        keeper_t k = {0};
        cq_judges_stats_t st;

        on_e2b = false;
        signal(SIGPIPE, SIG_IGN);
        k.kept = cq_judges_new(2, 60000, 100);
        judged_with(&k, RIGHT, TESTS_A, "passed");
        judged_with(&k, WRONG, TESTS_A, "wrong_answer");
        judged_with(&k, RIGHT, TESTS_A, "passed");
        ck_assert_int_eq(k.starts, 1);
        /* a call past its limit is a verdict; the judge stays good */
        judged_with(&k, LOOPS, TESTS_A, "timeout");
        judged_with(&k, RIGHT, TESTS_A, "passed");
        ck_assert_int_eq(k.starts, 1);
        judged_with(&k, RIGHT, TESTS_B, "passed");
        ck_assert_int_eq(k.starts, 2);
        cq_judges_stats(k.kept, &st);
        ck_assert_uint_eq(st.taken, 4);
        ck_assert_uint_eq(st.idle, 2);

        /* died while it waited: found dead, a new one */
        ck_assert_int_eq(kill(k.last, SIGKILL), 0); /* B's */
        cq_nap_ms(200, NULL);
        judged_with(&k, WRONG, TESTS_B, "wrong_answer");
        ck_assert_int_eq(k.starts, 3);
        /* dies after its take: the run starts a judge and runs again */
        k.kill_taken = true;
        judged_with(&k, RIGHT, TESTS_B, "passed");
        ck_assert_int_eq(k.starts, 4);
        k.kill_taken = false;
        judged_with(&k, RIGHT, TESTS_B, "passed");
        ck_assert_int_eq(k.starts, 4);
        cq_judges_destroy(&k.kept);
}
END_TEST

/* No judging interpreter: ours to mend, never the model's verdict. */
START_TEST(no_judge_is_an_infrastructure_error)
{
        fixture_t fx;

        on_e2b = false;
        fixture_init(&fx, "nojudge",
                     "{\"job_id\":\"j\",\"prompt\":\"p\",\"solution\":"
                     "\"def add(a, b):\\n    return a + b\\n\",\"tests\":"
                     "{\"kind\":\"code\",\"code\":\"assert add(1, 1) == 2\"}}",
                     NULL);
        fx.opts.judge_start = NULL;
        fixture_run(&fx);
        ck_assert_str_eq(fx.result.reason_code, "judge");
        ck_assert_str_eq(fx.result.verdict, "infra_error");
        fixture_release(&fx);
}
END_TEST

static Suite *agent_judge_suite(void)
{
        Suite *s = suite_create("agent_judge");
        TCase *tc = tcase_create("judge");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 240);
        tcase_add_loop_test(tc, code_tests_run_apart_from_the_model, 0, 2);
        tcase_add_test(tc, rigged_answers_bend_nothing);
        tcase_add_test(tc, hidden_tests_never_reach_the_model);
        tcase_add_test(tc, solutions_are_judged_with_no_llm);
        tcase_add_test(tc, a_stuck_model_is_stopped);
        tcase_add_test(tc, case_limits_are_calibrated_on_the_reference);
        tcase_add_test(tc, mutated_arguments_when_stated);
        tcase_add_loop_test(tc, the_harness_is_loaded_once, 0, 2);
        tcase_add_test(tc, no_judge_is_an_infrastructure_error);
        tcase_add_test(tc, judges_are_kept_for_their_test_code);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(agent_judge_suite)
