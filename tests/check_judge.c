/* SPDX-License-Identifier: MIT */
/* check_judge.c - the judging interpreter (agent/judge.py) driven by
 * agent/judge.c against a code under test played by the test itself: the
 * tagged values and their bounds, what a test sees of returned values,
 * raised exceptions, timeouts, lost interpreters and non-plain results,
 * looked-up values, arguments copied back, and the faults that are ours.
 * The judge runs as a plain /usr/bin/python3 here; the worker starts it
 * in a sandbox. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/agent/judge.h"
#include "coderq/common/util.h"
#include "support/judge_proc.h"

/* ------------------------------------------ the code under test, played */

/* What the played candidate answers: per function name a fixed answer
 * (JSON text) or a computed one. */
typedef struct played {
        const char *name;   /* a function of the candidate */
        const char *answer; /* its answer to every call, JSON text */
        const char *value;  /* a looked-up value (JSON text) instead */
        int64_t time_ms;    /* how long each call "took" */
        int calls;
        int fault_at; /* >0: the Nth call fails on our side */
        bool waits;   /* a call past its limit takes the limit, really */
} played_t;

static played_t *g_played;
static size_t g_nplayed;

static played_t *find(const char *name)
{
        size_t i;

        for (i = 0; i < g_nplayed; i++)
                if (strcmp(g_played[i].name, name) == 0)
                        return &g_played[i];
        return NULL;
}

static int play_call(void *opaque,
                     const json_t *request,
                     int64_t limit_ms,
                     json_t **answerp,
                     int64_t *elapsed_ms)
{
        played_t *p = find(json_string_value(json_object_get(request, "name")));

        (void)opaque;
        *elapsed_ms = 0;
        if (!p) {
                *answerp = json_pack("{s:s, s:s, s:s}", "op", "raise", "type",
                                     "NameError", "message", "not defined");
                return 0;
        }
        p->calls++;
        if (p->fault_at && p->calls == p->fault_at)
                return -1;
        if (p->time_ms > limit_ms) {
                if (p->waits)
                        cq_nap_ms(limit_ms, NULL);
                *elapsed_ms = limit_ms;
                *answerp = json_pack("{s:s, s:s, s:s}", "op", "fail", "kind",
                                     "timeout", "why", "ran past its limit");
                return 0;
        }
        *elapsed_ms = p->time_ms;
        *answerp = json_loads(p->answer, 0, NULL);
        ck_assert_msg(*answerp != NULL, "bad played answer %s", p->answer);
        return 0;
}

static int play_lookup(void *opaque, const char *name, json_t **answerp)
{
        played_t *p = find(name);

        (void)opaque;
        if (!p)
                *answerp = json_pack("{s:s}", "op", "missing");
        else if (p->value)
                *answerp = json_pack("{s:s, s:o}", "op", "value", "value",
                                     json_loads(p->value, 0, NULL));
        else
                *answerp = json_pack("{s:s}", "op", "function");
        return 0;
}

/* Judge \p code against \p played; jr filled. */
static void judge(const char *code,
                  bool mutates,
                  played_t *played,
                  size_t n,
                  int64_t run_ms,
                  cq_judge_result_t *jr)
{
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        char errstr[128];
        cq_judge_proc_t *proc = cq_check_judge_start(NULL, cq_judge_program(),
                                                     errstr, sizeof(errstr));

        ck_assert_msg(proc != NULL, "%s", errstr);

        g_played = played;
        g_nplayed = n;
        limits.deadline_ms = cq_now_ms() + run_ms;
        limits.call_ms = 1000;
        ck_assert_int_eq(cq_judge_run(proc, code, mutates, &cand, &limits, jr),
                         0);
        proc->destroy(proc);
}

static const char *origin(const cq_judge_result_t *jr)
{
        return json_string_value(json_object_get(jr->error, "origin"));
}

/* -------------------------------------------------------------- tests */

START_TEST(tagged_values_are_checked_with_bounds)
{
        static const char *const good[] = {
            "null",
            "true",
            "12",
            "-3.5",
            "\"sabc\"",
            "\"s\"",
            "\"i123456789012345678901234567890\"",
            "\"i-5\"",
            "\"finf\"",
            "\"f-inf\"",
            "\"fnan\"",
            "\"bYWI=\"",
            "\"b\"",
            "[1, [\"sx\"]]",
            "{\"t\":\"tuple\",\"v\":[1]}",
            "{\"t\":\"set\",\"v\":[]}",
            "{\"t\":\"frozenset\",\"v\":[\"s\"]}",
            "{\"t\":\"dict\",\"v\":[[1,\"sa\"],[{\"t\":\"tuple\",\"v\":[]},2]]"
            "}",
            "{\"t\":\"complex\",\"v\":[1.0,\"f-inf\"]}"};
        static const char *const bad[] = {
            "\"abc\"",
            "\"\"",
            "\"i\"",
            "\"i12a\"",
            "\"fhuge\"",
            "\"b!!\"",
            "\"bYWI\"",
            "\"b=AAA\"",
            "{\"t\":\"tuple\"}",
            "{\"v\":[]}",
            "{\"t\":\"list\",\"v\":[]}",
            "{\"t\":\"dict\",\"v\":[[1]]}",
            "{\"t\":\"dict\",\"v\":[1]}",
            "{\"t\":\"complex\",\"v\":[1,2,3]}",
            "{\"t\":\"complex\",\"v\":[\"sx\",1]}",
            "{\"t\":\"tuple\",\"v\":[],\"x\":1}",
            "[\"x\"]"};
        char why[128];
        json_t *v;
        size_t i;
        int d;

        for (i = 0; i < CQ_ARRAY_SIZE(good); i++) {
                v = json_loads(good[i], JSON_DECODE_ANY, NULL);
                ck_assert_msg(v && cq_judge_value_check(v, why, sizeof(why)),
                              "%s: %s", good[i], why);
                json_decref(v);
        }
        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                v = json_loads(bad[i], JSON_DECODE_ANY, NULL);
                ck_assert_msg(v && !cq_judge_value_check(v, NULL, 0),
                              "%s passed", bad[i]);
                json_decref(v);
        }
        /* nested deeper than the bound */
        v = json_integer(1);
        for (d = 0; d < CQ_JUDGE_DEPTH_MAX; d++)
                v = json_pack("[o]", v);
        ck_assert(!cq_judge_value_check(v, why, sizeof(why)));
        ck_assert_str_eq(why, "values nested too deep");
        json_decref(v);
}
END_TEST

START_TEST(values_are_shown_as_python_does)
{
        static const struct {
                const char *json, *repr;
        } cases[] = {
            {"[1, \"sa'b\", null, true]", "[1, 'a\\'b', None, True]"},
            {"{\"t\":\"tuple\",\"v\":[1]}", "(1,)"},
            {"{\"t\":\"set\",\"v\":[]}", "set()"},
            {"{\"t\":\"dict\",\"v\":[[\"sk\",\"i99999999999999999999\"]]}",
             "{'k': 99999999999999999999}"},
            {"\"x\"", "?"},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
                char *r = cq_judge_value_repr(v, 100);

                ck_assert_str_eq(r, cases[i].repr);
                free(r);
                json_decref(v);
        }
}
END_TEST

/* HumanEval's shape: check(candidate) with asserts on returned values. */
static const char sum_test[] = "def check(candidate):\n"
                               "    assert candidate([1, 2]) == 3\n"
                               "    assert candidate([]) == 0\n"
                               "check(total)\n";

START_TEST(a_right_answer_passes_a_wrong_one_fails)
{
        played_t right[] = {
            {.name = "total", .answer = "{\"op\":\"return\",\"value\":3}"}};
        played_t wrong[] = {
            {.name = "total", .answer = "{\"op\":\"return\",\"value\":4}"}};
        cq_judge_result_t jr;

        /* 3 for [1, 2] and, wrongly for [], 3 again */
        judge(sum_test, false, right, 1, 30000, &jr);
        ck_assert(!jr.ok);
        ck_assert_int_eq(jr.calls, 2);
        ck_assert_str_eq(origin(&jr), "test");
        ck_assert_str_eq(json_string_value(json_object_get(jr.error, "type")),
                         "AssertionError");
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(jr.calls_report, 1), "call")),
                         "total([])");
        cq_judge_result_release(&jr);

        judge(sum_test, false, wrong, 1, 30000, &jr);
        ck_assert(!jr.ok);
        ck_assert_int_eq(jr.calls, 1);
        ck_assert_ptr_null(jr.fault);
        cq_judge_result_release(&jr);
}
END_TEST

/* What a rigged object, an exception meant to pass, an exit or a lost
 * interpreter can make of a test: nothing that passes. */
START_TEST(what_crosses_cannot_pass_a_test)
{
        const char *code = "x = f(1)\n"
                           "try:\n"
                           "    y = f(2)\n"
                           "except Exception:\n"
                           "    y = 'caught'\n"
                           "assert x == 1\n";
        static const char *const answers[] = {
            "{\"op\":\"fail\",\"kind\":\"not_plain\",\"why\":\"rigged\"}",
            "{\"op\":\"fail\",\"kind\":\"timeout\",\"why\":\"slow\"}",
            "{\"op\":\"fail\",\"kind\":\"died\",\"why\":\"gone\"}",
            "{\"op\":\"return\",\"value\":{\"t\":\"rigged\",\"v\":[]}}",
            "{\"op\":\"return\",\"value\":\"sNaN\"}",
            "{\"op\":\"done\",\"ok\":true}",
            "{\"op\":\"raise\",\"type\":\"SystemExit\",\"message\":\"0\"}",
        };
        static const char *const origins[] = {
            "not_plain", "timeout",   "died",     "not_plain",
            "test",      "not_plain", "candidate"};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(answers); i++) {
                played_t played[] = {{.name = "f", .answer = answers[i]}};
                cq_judge_result_t jr;

                judge(code, false, played, 1, 30000, &jr);
                ck_assert_msg(!jr.ok, "answer %zu passed", i);
                ck_assert_ptr_null(jr.fault);
                ck_assert_msg(strcmp(origin(&jr), origins[i]) == 0,
                              "answer %zu: origin %s", i, origin(&jr));
                cq_judge_result_release(&jr);
        }
}
END_TEST

START_TEST(exceptions_cross_as_builtin_classes)
{
        played_t played[] = {{.name = "f",
                              .answer = "{\"op\":\"raise\",\"type\":"
                                        "\"ValueError\",\"message\":\"neg\"}"},
                             {.name = "g",
                              .answer = "{\"op\":\"raise\",\"type\":"
                                        "\"MyError\",\"message\":\"own\"}"}};
        const char *code = "try:\n"
                           "    f(-1)\n"
                           "except ValueError as e:\n"
                           "    assert str(e) == 'neg'\n"
                           "else:\n"
                           "    raise AssertionError('no raise')\n"
                           "g()\n";
        cq_judge_result_t jr;

        judge(code, false, played, 2, 30000, &jr);
        ck_assert(!jr.ok);
        ck_assert_str_eq(origin(&jr), "candidate");
        ck_assert_str_eq(json_string_value(json_object_get(jr.error, "type")),
                         "CandidateError");
        ck_assert_str_eq(
            json_string_value(json_object_get(jr.error, "message")),
            "MyError: own");
        cq_judge_result_release(&jr);
}
END_TEST

START_TEST(values_keep_their_python_types)
{
        played_t played[] = {
            {.name = "pair",
             .answer = "{\"op\":\"return\",\"value\":{\"t\":\"tuple\","
                       "\"v\":[1,\"b/w==\"]}}"},
            {.name = "lst", .answer = "{\"op\":\"return\",\"value\":[1,2]}"},
            {.name = "big",
             .answer =
                 "{\"op\":\"return\",\"value\":\"i123456789012345678901\"}"},
            {.name = "cx",
             .answer = "{\"op\":\"return\",\"value\":{\"t\":\"complex\","
                       "\"v\":[1.0,-2.0]}}"},
            {.name = "table",
             .value = "{\"t\":\"dict\",\"v\":[[{\"t\":\"tuple\",\"v\":"
                      "[1,2]},{\"t\":\"frozenset\",\"v\":[\"sa\"]}]]}"}};
        const char *code = "assert pair() == (1, b'\\xff')\n"
                           "assert lst() != (1, 2)\n"
                           "assert big() == 123456789012345678901\n"
                           "assert cx() == 1 - 2j\n"
                           "assert table == {(1, 2): frozenset({'a'})}\n";
        cq_judge_result_t jr;

        judge(code, false, played, CQ_ARRAY_SIZE(played), 30000, &jr);
        ck_assert_msg(jr.ok, "%s",
                      json_string_value(json_object_get(jr.error, "message")));
        ck_assert_int_eq(jr.calls, 4);
        cq_judge_result_release(&jr);
}
END_TEST

START_TEST(arguments_copy_back_only_when_stated)
{
        played_t played[] = {{.name = "sort_in_place",
                              .answer = "{\"op\":\"return\",\"value\":null,"
                                        "\"args\":[[1,2,3]]}"}};
        const char *code = "x = [3, 1, 2]\n"
                           "sort_in_place(x)\n"
                           "assert x == [1, 2, 3], x\n";
        cq_judge_result_t jr;

        judge(code, true, played, 1, 30000, &jr);
        ck_assert(jr.ok);
        cq_judge_result_release(&jr);
        judge(code, false, played, 1, 30000, &jr);
        ck_assert(!jr.ok);
        ck_assert_str_eq(origin(&jr), "test");
        cq_judge_result_release(&jr);
}
END_TEST

START_TEST(limits_and_faults)
{
        played_t slow[] = {{.name = "f",
                            .answer = "{\"op\":\"return\",\"value\":1}",
                            .time_ms = 5000}};
        played_t lost[] = {{.name = "f",
                            .answer = "{\"op\":\"return\",\"value\":1}",
                            .fault_at = 1}};
        cq_judge_result_t jr;

        /* a call past its limit (1 s): a timeout the test cannot catch */
        judge("try:\n    f()\nexcept Exception:\n    pass\n", false, slow, 1,
              30000, &jr);
        ck_assert(!jr.ok);
        ck_assert_str_eq(origin(&jr), "timeout");
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_array_get(jr.calls_report, 0), "limit_ms")),
                         1000);
        cq_judge_result_release(&jr);
        /* test code past the run's time */
        judge("while True:\n    pass\n", false, slow, 1, 1500, &jr);
        ck_assert(jr.timed_out);
        ck_assert_ptr_null(jr.fault);
        cq_judge_result_release(&jr);
        /* a call that takes what is left of the run's time: the tests'
         * time too, never a fault of ours (the answer then finds the
         * deadline gone) */
        slow[0].waits = true;
        judge("f()\n", false, slow, 1, 800, &jr);
        ck_assert_msg(jr.timed_out, "fault: %s", jr.fault ? jr.fault : "-");
        ck_assert_ptr_null(jr.fault);
        cq_judge_result_release(&jr);
        /* a call we could not make: ours, not the model's */
        judge("f()\n", false, lost, 1, 30000, &jr);
        ck_assert_ptr_nonnull(jr.fault);
        cq_judge_result_release(&jr);
        /* the judge gone */
        judge("import os\nos._exit(3)\n", false, lost, 1, 30000, &jr);
        ck_assert_str_eq(jr.fault, "the judge exited before it answered");
        cq_judge_result_release(&jr);
}
END_TEST

START_TEST(names_the_test_lacks)
{
        played_t played[] = {{.name = "result", .value = "[1, 2.5]"}};
        cq_judge_result_t jr;

        judge("assert result == [1, 2.5]\nassert len(result) == 2\n", false,
              played, 1, 30000, &jr);
        ck_assert(jr.ok);
        ck_assert_int_eq(jr.calls, 0);
        cq_judge_result_release(&jr);
        judge("undefined_thing()\n", false, played, 1, 30000, &jr);
        ck_assert(!jr.ok);
        ck_assert_str_eq(json_string_value(json_object_get(jr.error, "type")),
                         "NameError");
        cq_judge_result_release(&jr);
}
END_TEST

/* One judge, runs one after another: each in globals of its own, each
 * with its own count of calls; a clean end leaves it reusable, and a run
 * that did not end cleanly (past its time, something written after its
 * report) does not. */
START_TEST(a_judge_takes_runs_one_after_another)
{
        played_t played[] = {
            {.name = "f", .answer = "{\"op\":\"return\",\"value\":2}"}};
        static const char code[] = "assert 'seen' not in globals()\n"
                                   "seen = f(1)\n"
                                   "assert seen == 2\n";
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        cq_judge_result_t jr;
        char errstr[128];
        cq_judge_proc_t *proc = cq_check_judge_start(NULL, cq_judge_program(),
                                                     errstr, sizeof(errstr));
        int i;

        ck_assert_msg(proc != NULL, "%s", errstr);
        g_played = played;
        g_nplayed = 1;
        limits.call_ms = 1000;
        for (i = 0; i < 3; i++) {
                limits.deadline_ms = cq_now_ms() + 30000;
                ck_assert_int_eq(
                    cq_judge_run(proc, code, false, &cand, &limits, &jr), 0);
                ck_assert_msg(jr.ok, "run %d: %s", i,
                              jr.fault ? jr.fault
                                       : json_dumps(jr.error, JSON_COMPACT));
                ck_assert_int_eq(jr.calls, 1);
                ck_assert(jr.reusable);
                cq_judge_result_release(&jr);
        }
        /* other test code in the same process runs too (the keeper never
         * asks this; the judge does not depend on it) */
        limits.deadline_ms = cq_now_ms() + 30000;
        ck_assert_int_eq(cq_judge_run(proc, "assert f(0) == 3\n", false, &cand,
                                      &limits, &jr),
                         0);
        ck_assert(!jr.ok);
        ck_assert(jr.reusable);
        cq_judge_result_release(&jr);
        /* past the run's time: not reusable (it is still running) */
        limits.deadline_ms = cq_now_ms() + 500;
        ck_assert_int_eq(cq_judge_run(proc, "while True:\n    pass\n", false,
                                      &cand, &limits, &jr),
                         0);
        ck_assert(jr.timed_out);
        ck_assert(!jr.reusable);
        cq_judge_result_release(&jr);
        proc->destroy(proc);

        /* a line written after the report: not reusable. The test code
         * doubles the judge's report from its next run on (the call that
         * sends this run's report was bound before the test ran). */
        proc = cq_check_judge_start(NULL, cq_judge_program(), errstr,
                                    sizeof(errstr));
        ck_assert_msg(proc != NULL, "%s", errstr);
        for (i = 0; i < 2; i++) {
                limits.deadline_ms = cq_now_ms() + 30000;
                ck_assert_int_eq(
                    cq_judge_run(proc,
                                 "import json, sys\n"
                                 "C = sys.modules['__main__']._Channel\n"
                                 "def twice(self, msg, w=C.send):\n"
                                 "    if msg.get('op') != 'done':\n"
                                 "        return w(self, msg)\n"
                                 "    line = json.dumps(msg) + '\\n'\n"
                                 "    self.out.write(line + line)\n"
                                 "    self.out.flush()\n"
                                 "if C.send.__name__ != 'twice':\n"
                                 "    C.send = twice\n",
                                 false, &cand, &limits, &jr),
                    0);
                ck_assert(jr.ok);
                ck_assert(jr.reusable == (i == 0));
                cq_judge_result_release(&jr);
        }
        proc->destroy(proc);
}
END_TEST

static Suite *judge_suite(void)
{
        Suite *s = suite_create("judge");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, a_judge_takes_runs_one_after_another);
        tcase_add_test(tc, tagged_values_are_checked_with_bounds);
        tcase_add_test(tc, values_are_shown_as_python_does);
        tcase_add_test(tc, a_right_answer_passes_a_wrong_one_fails);
        tcase_add_test(tc, what_crosses_cannot_pass_a_test);
        tcase_add_test(tc, exceptions_cross_as_builtin_classes);
        tcase_add_test(tc, values_keep_their_python_types);
        tcase_add_test(tc, arguments_copy_back_only_when_stated);
        tcase_add_test(tc, limits_and_faults);
        tcase_add_test(tc, names_the_test_lacks);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(judge_suite)
