/* SPDX-License-Identifier: MIT */
/* check_testrun.c - job test cells: the generated Python runs under
 * Debian's python3 as a script (no kernel needed) and its stdout is fed
 * back through the report parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/agent/testrun.h"
#include "coderq/common/util.h"

/* Run \p prelude + \p code with /usr/bin/python3; returns its stdout. */
static char *run_python(const char *prelude, const char *code)
{
        char path[] = "/tmp/cq-testrun-XXXXXX";
        char cmd[256];
        int fd = mkstemp(path);
        FILE *fp;
        cq_buf_t buf;
        char chunk[4096];
        size_t n;
        char *out;

        ck_assert_int_ge(fd, 0);
        fp = fdopen(fd, "w");
        ck_assert_ptr_nonnull(fp);
        fputs(prelude, fp);
        fputs("\n", fp);
        fputs(code, fp);
        fclose(fp);
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s 2>/dev/null", path);
        fp = popen(cmd, "r");
        ck_assert_ptr_nonnull(fp);
        cq_buf_init(&buf, 1 << 20);
        while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
                ck_assert_int_eq(cq_buf_append(&buf, chunk, n), CQ_OK);
        pclose(fp);
        unlink(path);
        out = cq_buf_take(&buf, NULL);
        cq_buf_release(&buf);
        return out;
}

static void result_with_stdout(cq_cell_result_t *res, const char *text)
{
        cq_cell_result_init(res);
        res->outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                                 "name", "stdout", "text", text);
        ck_assert_ptr_nonnull(res->outputs);
}

static void
run_tests(const char *prelude, const char *tests_json, cq_testrun_t *tr)
{
        json_t *tests = json_loads(tests_json, 0, NULL);
        char marker[40], err[256] = "";
        char *code, *out;
        cq_cell_result_t res;

        ck_assert_ptr_nonnull(tests);
        code = cq_testrun_code(tests, marker, sizeof(marker), err, sizeof(err));
        ck_assert_msg(code != NULL, "%s", err);
        out = run_python(prelude, code);
        result_with_stdout(&res, out);
        ck_assert_int_eq(cq_testrun_parse(tests, marker, &res, tr), 0);
        cq_cell_result_release(&res);
        free(out);
        free(code);
        json_decref(tests);
}

START_TEST(cases_all_pass_with_tolerance_and_numpy)
{
        cq_testrun_t tr;

        run_tests("import numpy as np\n"
                  "def f(x, y):\n"
                  "    return np.array([x / 3, y]) if y else (x + 0.1 + 0.2)\n",
                  "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
                  "{\"args\":[1,2],\"expected\":[0.3333333333,2]},"
                  "{\"args\":[0.0,0],\"expected\":0.3}]}",
                  &tr);
        ck_assert_int_eq(tr.total, 2);
        ck_assert_int_eq(tr.passed, 2);
        ck_assert_ptr_null(tr.error);
        ck_assert_uint_eq(cq_testrun_failures(&tr, NULL, 0), 0);
        ck_assert_int_eq(
            json_integer_value(json_object_get(tr.report, "passed")), 2);
        cq_testrun_release(&tr);
}
END_TEST

/* The error of case \p i (from 1) of \p tr's report. */
static const char *case_error(const cq_testrun_t *tr, size_t i)
{
        return json_string_value(json_object_get(
            json_array_get(json_object_get(tr->report, "cases"), i - 1),
            "error"));
}

START_TEST(cases_never_call_methods_of_model_objects)
{
        /* what each case's value crosses as: a subclass of a plain type as
         * its base value, read without its overrides; anything else not */
        static const char *const got[] = {NULL, "7", "'x'", "[]", "{}", NULL};
        cq_testrun_t tr;
        size_t i;

        /* Each value would compare equal to the expected one through its
         * own methods; none may be called. */
        run_tests("class Always:\n"
                  "    def __eq__(self, other):\n"
                  "        return True\n"
                  "    __hash__ = None\n"
                  "class MyInt(int):\n"
                  "    def __eq__(self, other):\n"
                  "        return True\n"
                  "    def __int__(self):\n"
                  "        return 5\n"
                  "class MyStr(str):\n"
                  "    def __eq__(self, other):\n"
                  "        return True\n"
                  "    def __str__(self):\n"
                  "        return 'y'\n"
                  "class MyList(list):\n"
                  "    def __iter__(self):\n"
                  "        return iter([1, 2])\n"
                  "    def __len__(self):\n"
                  "        return 2\n"
                  "class MyDict(dict):\n"
                  "    def keys(self):\n"
                  "        return {'a': 1}.keys()\n"
                  "    def items(self):\n"
                  "        return {'a': 1}.items()\n"
                  "    def __getitem__(self, k):\n"
                  "        return 1\n"
                  "def f(k):\n"
                  "    return [Always(), MyInt(7), MyStr('x'), MyList(),\n"
                  "            MyDict(), [1, Always()]][k]\n",
                  "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
                  "{\"args\":[0],\"expected\":1},"
                  "{\"args\":[1],\"expected\":5},"
                  "{\"args\":[2],\"expected\":\"y\"},"
                  "{\"args\":[3],\"expected\":[1,2]},"
                  "{\"args\":[4],\"expected\":{\"a\":1}},"
                  "{\"args\":[5],\"expected\":[1,2]}]}",
                  &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.total, 6);
        ck_assert_int_eq(tr.passed, 0);
        for (i = 1; i <= 6; i++) {
                json_t *c =
                    json_array_get(json_object_get(tr.report, "cases"), i - 1);
                const char *err = case_error(&tr, i);
                const char *shown;

                if (!got[i - 1]) {
                        ck_assert_msg(err && strstr(err, "not plain data") &&
                                          strstr(err, "of type Always."),
                                      "case %zu: %s", i,
                                      err ? err : "(no error)");
                        continue;
                }
                /* in Python's repr */
                shown = json_string_value(json_object_get(c, "got"));
                ck_assert_msg(shown && strcmp(shown, got[i - 1]) == 0,
                              "case %zu: got %s, not %s (%s)", i,
                              shown ? shown : "nothing", got[i - 1],
                              err ? err : "no error");
        }
        cq_testrun_release(&tr);
}
END_TEST

START_TEST(cases_take_numpy_values_and_survive_shadowed_builtins)
{
        cq_testrun_t tr;

        /* Globals named like builtins, a flood of output and numpy scalars
         * and arrays: the harness neither breaks nor loses its report. */
        run_tests("import numpy as np\n"
                  "len = type = print = isinstance = repr = None\n"
                  "import sys\n"
                  "def g(k):\n"
                  "    sys.stdout.write('x' * 3000000)\n"
                  "    if k == 0:\n"
                  "        return np.float64(0.1) + np.float64(0.2)\n"
                  "    if k == 1:\n"
                  "        return {'n': np.int32(3), 'v': np.array([1.0, "
                  "2.0000000001])}\n"
                  "    if k == 2:\n"
                  "        return np.bool_(True)\n"
                  "    if k == 3:\n"
                  "        return np.array(['a', 'b'])\n"
                  "    if k == 4:\n"
                  "        return np.array([1, None], dtype=object)\n"
                  "    return {1: 2}\n",
                  "{\"kind\":\"cases\",\"function\":\"g\",\"cases\":["
                  "{\"args\":[0],\"expected\":0.3},"
                  "{\"args\":[1],\"expected\":{\"n\":3,\"v\":[1,2]}},"
                  "{\"args\":[2],\"expected\":true},"
                  "{\"args\":[3],\"expected\":[\"a\",\"b\"]},"
                  "{\"args\":[4],\"expected\":[1,null]},"
                  "{\"args\":[5],\"expected\":{\"1\":2}}]}",
                  &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.total, 6);
        ck_assert_int_eq(tr.passed, 4);
        ck_assert_msg(strstr(case_error(&tr, 5), "numpy array of dtype |O"),
                      "%s", case_error(&tr, 5));
        ck_assert_msg(strstr(case_error(&tr, 6), "a dict key of type int"),
                      "%s", case_error(&tr, 6));
        cq_testrun_release(&tr);
}
END_TEST

START_TEST(cases_failures_say_which_expected_and_got)
{
        cq_testrun_t tr;
        cq_test_failure_t f[8];
        size_t n;

        run_tests("def g(n):\n"
                  "    if n < 0:\n"
                  "        raise ValueError('negative')\n"
                  "    return n * 2\n",
                  "{\"kind\":\"cases\",\"function\":\"g\",\"cases\":["
                  "{\"args\":[2],\"expected\":4},"
                  "{\"args\":[3],\"expected\":7},"
                  "{\"args\":[-1],\"expected\":0},"
                  "{\"args\":[1],\"expected\":true}]}",
                  &tr);
        ck_assert_int_eq(tr.total, 4);
        ck_assert_int_eq(tr.passed, 1);
        ck_assert_ptr_null(tr.error);
        n = cq_testrun_failures(&tr, f, 8);
        ck_assert_uint_eq(n, 3);
        ck_assert_uint_eq(f[0].index, 2);
        ck_assert_str_eq(f[0].call, "g(3)");
        ck_assert_str_eq(f[0].expected, "7");
        ck_assert_str_eq(f[0].got, "6");
        ck_assert_uint_eq(f[1].index, 3);
        ck_assert_ptr_null(f[1].got);
        ck_assert_msg(strstr(f[1].error, "ValueError: negative"), "%s",
                      f[1].error);
        /* true is not 2: booleans only equal booleans */
        ck_assert_str_eq(f[2].call, "g(1)");
        ck_assert_str_eq(f[2].expected, "True");
        ck_assert_str_eq(f[2].got, "2");
        ck_assert_uint_eq(cq_testrun_failures(&tr, f, 1), 1);
        cq_testrun_release(&tr);
}
END_TEST

START_TEST(cases_missing_function_fails_every_case)
{
        cq_testrun_t tr;

        run_tests("",
                  "{\"kind\":\"cases\",\"function\":\"nope\",\"cases\":["
                  "{\"args\":[],\"expected\":1}]}",
                  &tr);
        ck_assert_int_eq(tr.passed, 0);
        ck_assert_int_eq(tr.total, 1);
        ck_assert_msg(
            strstr(json_string_value(json_object_get(
                       json_array_get(json_object_get(tr.report, "cases"), 0),
                       "error")),
                   "NameError"),
            "no NameError in the report");
        cq_testrun_release(&tr);
}
END_TEST

START_TEST(code_tests_pass_and_fail)
{
        cq_testrun_t tr;

        run_tests("x = 41\n",
                  "{\"kind\":\"code\",\"code\":\"assert x + 1 == 42\"}", &tr);
        ck_assert_int_eq(tr.passed, 1);
        ck_assert_int_eq(tr.total, 1);
        ck_assert_ptr_null(tr.error);
        cq_testrun_release(&tr);

        run_tests("x = 40\n",
                  "{\"kind\":\"code\",\"code\":\"assert x == 42, "
                  "'x is %d' % x\"}",
                  &tr);
        ck_assert_int_eq(tr.passed, 0);
        {
                cq_test_failure_t f;

                ck_assert_uint_eq(cq_testrun_failures(&tr, &f, 1), 1);
                ck_assert_uint_eq(f.index, 0);
                ck_assert_ptr_null(f.call);
                ck_assert_msg(strstr(f.error, "AssertionError: x is 40"), "%s",
                              f.error);
        }
        cq_testrun_release(&tr);
}
END_TEST

START_TEST(report_must_carry_the_marker)
{
        json_t *tests =
            json_loads("{\"kind\":\"code\",\"code\":\"pass\"}", 0, NULL);
        char marker[40], err[128];
        char *code =
            cq_testrun_code(tests, marker, sizeof(marker), err, sizeof(err));
        cq_cell_result_t res;
        cq_testrun_t tr;

        ck_assert_ptr_nonnull(code);
        /* A forged report with another marker is not taken. */
        result_with_stdout(&res, "@@CQTEST000000000000000000000000{\"cases\":"
                                 "[{\"ok\":true}]}\n");
        ck_assert_int_eq(cq_testrun_parse(tests, marker, &res, &tr), 0);
        ck_assert_int_eq(tr.passed, 0);
        ck_assert_msg(strstr(tr.error, "printed no report"), "%s", tr.error);
        cq_testrun_release(&tr);
        cq_cell_result_release(&res);

        /* A cell that timed out fails with that reason. */
        result_with_stdout(&res, "");
        res.status = CQ_CELL_TIMEOUT;
        ck_assert_int_eq(cq_testrun_parse(tests, marker, &res, &tr), 0);
        ck_assert_int_eq(tr.passed, 0);
        ck_assert_msg(strstr(tr.error, "status timeout"), "%s", tr.error);
        {
                cq_test_failure_t f;

                ck_assert_uint_eq(cq_testrun_failures(&tr, &f, 1), 1);
                ck_assert_str_eq(f.error, tr.error);
        }
        cq_testrun_release(&tr);
        cq_cell_result_release(&res);
        free(code);
        json_decref(tests);
}
END_TEST

START_TEST(invalid_tests_objects_are_rejected)
{
        static const char *const bad[] = {"{}",
                                          "{\"kind\":\"cases\"}",
                                          "{\"kind\":\"cases\",\"function\":1}",
                                          "{\"kind\":\"code\",\"code\":5}",
                                          "{\"kind\":\"other\"}",
                                          "[]"};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                json_t *tests = json_loads(bad[i], 0, NULL);
                char marker[40], err[128] = "";

                ck_assert_ptr_null(cq_testrun_code(
                    tests, marker, sizeof(marker), err, sizeof(err)));
                ck_assert_msg(err[0] != '\0', "no error for %s", bad[i]);
                json_decref(tests);
        }
}
END_TEST

/* ------------------------------------------- code that tries to cheat */

/* Each attack below would have passed a harness holding the expected
 * values or comparing in the interpreter; the expected values never enter
 * it now, and C compares. */

/* Two cases of f, answered right by 5 and [1, 2]. */
static const char f_cases[] =
    "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
    "{\"args\":[2],\"expected\":5},"
    "{\"args\":[3],\"expected\":[1,2]}]}";

/* The model's code searches everything it can reach (every container the
 * garbage collector tracks, every frame) for the expected value. */
START_TEST(cases_expected_values_never_reach_the_interpreter)
{
        json_t *tests;
        char marker[40], err[256] = "";
        char *code;
        cq_testrun_t tr;

        run_tests("import gc, sys\n"
                  "PREFIX = 'SEC' + 'RET-'\n"
                  "def found(v):\n"
                  "    return (type(v) is str and v.startswith(PREFIX) and\n"
                  "            v != PREFIX)\n"
                  "def f(x):\n"
                  "    for o in gc.get_objects():\n"
                  "        if type(o) is dict:\n"
                  "            items = list(o.values())\n"
                  "        elif type(o) in (list, tuple):\n"
                  "            items = list(o)\n"
                  "        else:\n"
                  "            continue\n"
                  "        for v in items:\n"
                  "            if found(v):\n"
                  "                return v\n"
                  "    fr = sys._getframe()\n"
                  "    while fr is not None:\n"
                  "        for v in list(fr.f_locals.values()):\n"
                  "            if found(v):\n"
                  "                return v\n"
                  "        fr = fr.f_back\n"
                  "    return None\n",
                  "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
                  "{\"args\":[1],\"expected\":\"SECRET-7f3a\"},"
                  "{\"args\":[2],\"expected\":[\"SECRET-0c1d\"]}]}",
                  &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.total, 2);
        ck_assert_int_eq(tr.passed, 0);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(tr.report, "cases"), 0), "got")),
            "None");
        cq_testrun_release(&tr);
        /* nor are they anywhere in the cell's text */
        tests = json_loads("{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
                           "{\"args\":[1],\"expected\":\"SECRET-7f3a\"}]}",
                           0, NULL);
        code = cq_testrun_code(tests, marker, sizeof(marker), err, sizeof(err));
        ck_assert_msg(code != NULL, "%s", err);
        {
                /* the cell is exec(b64decode('HARNESS'), ... 'CALLS' ...) */
                char *p = code, *q;
                size_t n;

                while ((p = strchr(p, '\'')) != NULL &&
                       (q = strchr(p + 1, '\'')) != NULL) {
                        unsigned char *dec =
                            cq_b64_decode(p + 1, (size_t)(q - p - 1), &n);

                        if (dec) {
                                ck_assert_ptr_null(memmem(dec, n, "SECRET", 6));
                                free(dec);
                        }
                        p = q + 1;
                }
                ck_assert_ptr_null(strstr(code, "SECRET"));
        }
        free(code);
        json_decref(tests);
}
END_TEST

/* The function walks the frames up to the
 * harness and returns the case's expected value. */
START_TEST(cases_frame_walking_finds_no_expected_value)
{
        cq_testrun_t tr;

        run_tests("import sys\n"
                  "def f(x):\n"
                  "    fr = sys._getframe(1)\n"
                  "    while fr is not None:\n"
                  "        c = fr.f_locals.get('c')\n"
                  "        if isinstance(c, dict) and 'expected' in c:\n"
                  "            return c['expected']\n"
                  "        for v in fr.f_locals.values():\n"
                  "            if isinstance(v, list) and v and "
                  "isinstance(v[0], dict) and 'expected' in v[0]:\n"
                  "                return v[0]['expected']\n"
                  "        fr = fr.f_back\n"
                  "    return None\n",
                  f_cases, &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.total, 2);
        ck_assert_int_eq(tr.passed, 0);
        cq_testrun_release(&tr);
}
END_TEST

/* A setup cell replaces the
 * comparison and the builtins and modules a harness would use. Wrong
 * answers still fail, and right ones still pass: the harness uses none of
 * them. */
START_TEST(cases_ignore_patched_comparisons_and_builtins)
{
        cq_testrun_t tr;

        run_tests("import builtins, json, math, base64, traceback\n"
                  "math.isclose = lambda *a, **k: True\n"
                  "builtins.all = lambda it: True\n"
                  "builtins.any = lambda it: True\n"
                  "builtins.repr = lambda *a: '5'\n"
                  "json.dumps = lambda *a, **k: '{\"cases\": []}'\n"
                  "def g(x):\n"
                  "    return 0 if x == 2 else x * 2\n",
                  "{\"kind\":\"cases\",\"function\":\"g\",\"cases\":["
                  "{\"args\":[2],\"expected\":5},"
                  "{\"args\":[3],\"expected\":6},"
                  "{\"args\":[4],\"expected\":8.0000001},"
                  "{\"args\":[5],\"expected\":true}]}",
                  &tr);
        ck_assert_msg(tr.error == NULL, "%s", tr.error);
        ck_assert_int_eq(tr.total, 4);
        ck_assert_int_eq(tr.passed, 2); /* cases 2 and 3 */
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(tr.report, "cases"), 0), "got")),
            "0");
        cq_testrun_release(&tr);

        /* builtins.type replaced: the harness takes its types from
         * literals */
        run_tests("import builtins, json, base64, traceback\n"
                  "builtins.type = lambda *a: int\n"
                  "def g(x):\n"
                  "    return [x, 'a', {'k': None}] if x else object()\n",
                  "{\"kind\":\"cases\",\"function\":\"g\",\"cases\":["
                  "{\"args\":[1],\"expected\":[1,\"a\",{\"k\":null}]},"
                  "{\"args\":[0],\"expected\":0}]}",
                  &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.passed, 1);
        ck_assert_msg(
            strstr(case_error(&tr, 2), "it holds a value of type object."),
            "%s", case_error(&tr, 2));
        cq_testrun_release(&tr);
}
END_TEST

/* A fake numpy whose ndarray.tolist() walks
 * the frames for the expected value. Its classes are not numpy's own C
 * types, so they are not plain data and none of their methods is
 * called. */
START_TEST(cases_ignore_a_fake_numpy)
{
        cq_testrun_t tr;

        run_tests("import sys, types\n"
                  "calls = []\n"
                  "class Arr:\n"
                  "    class dtype:\n"
                  "        kind = 'i'\n"
                  "    size = 1\n"
                  "    def tolist(self):\n"
                  "        calls.append(1)\n"
                  "        fr = sys._getframe(1)\n"
                  "        while fr is not None:\n"
                  "            c = fr.f_locals.get('c')\n"
                  "            if isinstance(c, dict):\n"
                  "                return c['expected']\n"
                  "            fr = fr.f_back\n"
                  "        return 5\n"
                  "    item = tolist\n"
                  "fake = types.ModuleType('numpy')\n"
                  "fake.ndarray = Arr\n"
                  "fake.dtype = lambda c: types.SimpleNamespace(type=Arr)\n"
                  "fake.str_ = Arr\n"
                  "sys.modules['numpy'] = fake\n"
                  "def f(x):\n"
                  "    if calls:\n"
                  "        raise RuntimeError('tolist was called')\n"
                  "    return Arr()\n",
                  f_cases, &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.total, 2);
        ck_assert_int_eq(tr.passed, 0);
        ck_assert_msg(strstr(case_error(&tr, 1),
                             "not plain data: it holds a value of type Arr."),
                      "%s", case_error(&tr, 1));
        ck_assert_msg(strstr(case_error(&tr, 2),
                             "not plain data: it holds a value of type Arr."),
                      "%s", case_error(&tr, 2));
        cq_testrun_release(&tr);
}
END_TEST

/* The function finds the marker (the harness is in the cell and its
 * globals in the frames) and prints a forged report: printed beside the
 * real one, the marker shows twice and nothing is trusted; with the real
 * one suppressed, the forgery is read like any report, and a report can
 * only claim results, which C compares with values it never saw. */
START_TEST(cases_printed_reports_cannot_pass_a_case)
{
        static const char find_harness[] =
            "import sys\n"
            "def harness():\n"
            "    fr = sys._getframe(1)\n"
            "    while fr is not None:\n"
            "        if '_marker' in fr.f_globals:\n"
            "            return fr.f_globals\n"
            "        fr = fr.f_back\n"
            "def forge(body, suppress):\n"
            "    g = harness()\n"
            "    if suppress:\n"
            "        g['_out'] = g['_SINK']\n"
            "    sys.__stdout__.write('\\n' + g['_marker'] + body + '\\n')\n"
            "    sys.__stdout__.flush()\n";
        static const struct {
                const char *f, *why;
        } attacks[] = {
            /* the old report's shape, beside the real report */
            {"def f(x):\n"
             "    forge('{\"cases\":[{\"case\":1,\"ok\":true},{\"case\":2,"
             "\"ok\":true}]}', False)\n",
             "marker appeared"},
            /* the same, alone */
            {"def f(x):\n"
             "    forge('{\"cases\":[{\"case\":1,\"ok\":true},{\"case\":2,"
             "\"ok\":true}]}', True)\n",
             NULL},
            /* results claimed, alone: only right values could pass */
            {"def f(x):\n"
             "    forge('{\"cases\":[{\"case\":1,\"value\":4,\"ok\":true},"
             "{\"case\":2,\"value\":[\"s1\",2]}]}', True)\n",
             NULL},
            /* a report written to the stream's file descriptor */
            {"import os\n"
             "def f(x):\n"
             "    g = harness()\n"
             "    os.write(1, ('\\n' + g['_marker'] + '{\"cases\":[]}\\n')"
             ".encode())\n",
             "marker appeared"},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(attacks); i++) {
                char prelude[2048];
                cq_testrun_t tr;

                snprintf(prelude, sizeof(prelude), "%s%s", find_harness,
                         attacks[i].f);
                run_tests(prelude, f_cases, &tr);
                ck_assert_int_eq(tr.total, 2);
                ck_assert_msg(tr.passed == 0, "attack %zu: %d passed", i,
                              tr.passed);
                if (attacks[i].why)
                        ck_assert_msg(tr.error &&
                                          strstr(tr.error, attacks[i].why),
                                      "attack %zu: %s", i,
                                      tr.error ? tr.error : "(no error)");
                cq_testrun_release(&tr);
        }
}
END_TEST

/* ----------------------------- the report as untrusted input, in C only */

/* Parse \p text (stdout of a test cell, \p len bytes; "%M" stands for the
 * marker) as the report of \p tests_json. */
static void parse_text(const char *tests_json,
                       const char *text,
                       size_t len,
                       cq_testrun_t *tr)
{
        json_t *tests = json_loads(tests_json, 0, NULL);
        char marker[40], err[256] = "";
        char *code;
        cq_cell_result_t res;
        cq_buf_t buf;
        size_t i;

        ck_assert_ptr_nonnull(tests);
        code = cq_testrun_code(tests, marker, sizeof(marker), err, sizeof(err));
        ck_assert_msg(code != NULL, "%s", err);
        cq_buf_init(&buf, 64 << 20);
        for (i = 0; i < len; i++) {
                if (text[i] == '%' && i + 1 < len && text[i + 1] == 'M') {
                        ck_assert_int_eq(cq_buf_append_str(&buf, marker),
                                         CQ_OK);
                        i++;
                } else {
                        ck_assert_int_eq(cq_buf_append(&buf, text + i, 1),
                                         CQ_OK);
                }
        }
        cq_cell_result_init(&res);
        res.outputs =
            json_pack("[{s:s, s:s, s:s%}]", "output_type", "stream", "name",
                      "stdout", "text", buf.data ? buf.data : "", buf.len);
        ck_assert_ptr_nonnull(res.outputs);
        ck_assert_int_eq(cq_testrun_parse(tests, marker, &res, tr), 0);
        cq_cell_result_release(&res);
        cq_buf_release(&buf);
        free(code);
        json_decref(tests);
}

static const char *case_str(const cq_testrun_t *tr, size_t i, const char *key)
{
        return json_string_value(json_object_get(
            json_array_get(json_object_get(tr->report, "cases"), i - 1), key));
}

/* The documented rules, applied in C to what the harness reported. */
START_TEST(cases_compare_in_c_by_the_documented_rules)
{
        static const struct {
                const char *expected, *value;
                bool ok;
        } rules[] = {
            {"0.3", "0.30000000000000004", true},
            {"1", "1.0000001", true}, /* rel 1e-6 */
            {"1", "1.00001", false},
            {"0", "1e-10", true}, /* abs 1e-9 */
            {"0", "1e-8", false},
            {"2", "2.0", true},
            {"true", "true", true},
            {"true", "1", false}, /* booleans only equal booleans */
            {"1", "true", false},
            {"false", "0", false},
            {"null", "null", true},
            {"null", "0", false},
            {"\"a\"", "\"sa\"", true},
            {"\"a\"", "\"sa\\u0000\"", false},
            {"\"\"", "\"s\"", true},
            {"\"5\"", "5", false},
            {"[1,[2,\"x\"]]", "[1,[2.0,\"sx\"]]", true},
            {"[1,2]", "[1]", false},
            {"[]", "{}", false},
            {"{\"a\":1,\"b\":[]}", "{\"b\":[],\"a\":1.0}", true},
            {"{\"a\":1}", "{\"b\":1}", false},
            {"{\"a\":1}", "{\"a\":1,\"b\":2}", false},
            /* ints beyond int64 come as digits: within a double's range
             * they compare as Python converts them, beyond it never */
            {"9223372036854775807", "\"i9223372036854775808\"", true},
            {"1e20", "\"i100000000000000000000\"", true},
            {"5",
             "\"i1" /* 400 zeros follow */
             "0000000000000000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000000000000000000"
             "0000000000000000000000000000000000000000000000000000\"",
             false},
            {"1e308", "\"finf\"", false},
            {"0", "\"fnan\"", false},
            {"-0.0", "0", true},
        };
        cq_buf_t tests, text;
        cq_testrun_t tr;
        size_t i;

        cq_buf_init(&tests, 1 << 20);
        cq_buf_init(&text, 1 << 20);
        ck_assert_int_eq(cq_buf_append_str(&tests, "{\"kind\":\"cases\","
                                                   "\"function\":\"f\","
                                                   "\"cases\":["),
                         CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&text, "noise\n%M{\"cases\":["),
                         CQ_OK);
        for (i = 0; i < CQ_ARRAY_SIZE(rules); i++) {
                ck_assert_int_eq(cq_buf_printf(&tests,
                                               "%s{\"args\":[],"
                                               "\"expected\":%s}",
                                               i ? "," : "", rules[i].expected),
                                 CQ_OK);
                ck_assert_int_eq(
                    cq_buf_printf(&text, "%s{\"case\":%zu,\"value\":%s}",
                                  i ? "," : "", i + 1, rules[i].value),
                    CQ_OK);
        }
        ck_assert_int_eq(cq_buf_append_str(&tests, "]}"), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&text, "]}\nmore noise\n"), CQ_OK);
        parse_text(tests.data, text.data, text.len, &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.total, (int)CQ_ARRAY_SIZE(rules));
        for (i = 0; i < CQ_ARRAY_SIZE(rules); i++) {
                json_t *rec =
                    json_array_get(json_object_get(tr.report, "cases"), i);

                ck_assert_msg(json_is_true(json_object_get(rec, "ok")) ==
                                  rules[i].ok,
                              "expected %s, reported %s: ok should be %d",
                              rules[i].expected, rules[i].value, rules[i].ok);
        }
        cq_testrun_release(&tr);
        cq_buf_release(&tests);
        cq_buf_release(&text);
}
END_TEST

/* What a report shows of a case comes from the job (call, expected) and
 * from the values C read (got), in Python's repr. */
START_TEST(cases_show_values_as_python_would)
{
        static const char tests[] =
            "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
            "{\"args\":[\"it's\",[1,2.5],{\"k\":null}],\"expected\":0},"
            "{\"args\":[],\"expected\":\"x\"}]}";
        /* Python: ["'q", nan, 123, 2.0, -0.0, 1e+16, 1e-05, 0.1,
         * {'k': '\n\x00\x85é'}, 1000000000000000.0, 123.456, 1.5e-07,
         * 0.30000000000000004, 'a"b', 'a\'b"c'] */
        static const char text[] =
            "%M{\"cases\":[{\"case\":1,\"value\":[\"s'q\",\"fnan\",\"i123\","
            "2.0,-0.0,1e+16,1e-05,0.1,{\"k\":\"s\\n\\u0000\\u0085\xc3\xa9\"},"
            "1e15,123.456,1.5e-07,0.30000000000000004,\"sa\\\"b\","
            "\"sa'b\\\"c\"]},{\"case\":2,\"value\":\"s"
            "0123456789012345678901234567890123456789012345678901234567890123"
            "0123456789012345678901234567890123456789012345678901234567890123"
            "0123456789012345678901234567890123456789012345678901234567890123"
            "0123456789012345678901234567890123456789012345678901234567890123"
            "0123456789012345678901234567890123456789012345678901234567890123"
            "\"}]}\n";
        cq_testrun_t tr;
        const char *got;

        parse_text(tests, text, strlen(text), &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.passed, 0);
        ck_assert_str_eq(case_str(&tr, 1, "call"),
                         "f(\"it's\", [1, 2.5], {'k': None})");
        ck_assert_str_eq(case_str(&tr, 1, "expected"), "0");
        ck_assert_str_eq(case_str(&tr, 1, "got"),
                         "[\"'q\", nan, 123, 2.0, -0.0, 1e+16, 1e-05, 0.1, "
                         "{'k': '\\n\\x00\\x85\xc3\xa9'}, "
                         "1000000000000000.0, 123.456, 1.5e-07, "
                         "0.30000000000000004, 'a\"b', 'a\\'b\"c']");
        ck_assert_str_eq(case_str(&tr, 2, "call"), "f()");
        ck_assert_str_eq(case_str(&tr, 2, "expected"), "'x'");
        got = case_str(&tr, 2, "got");
        ck_assert_uint_eq(strlen(got), 303);
        ck_assert_str_eq(got + 300, "...");
        cq_testrun_release(&tr);
}
END_TEST

/* Anything but a report as the harness writes it fails: the whole run
 * when the report cannot be found or read, the case when an entry is
 * wrong. Nothing here crashes or passes a case. */
START_TEST(malformed_reports_fail_and_never_pass)
{
        static const char tests[] =
            "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
            "{\"args\":[],\"expected\":5},{\"args\":[],\"expected\":\"a\"}]}";
        static const struct {
                const char *text;
                const char *run_error; /* NULL: the cases fail one by one */
                const char *case_error;
        } bad[] = {
            {"", "printed no report", NULL},
            {"%M", "could not be read", NULL},
            {"%Mnot json\n", "could not be read", NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":5}]}\n", "one entry for each",
             NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,\"value\":"
             "\"sa\"}],\"passed\":2}\n",
             "one entry for each", NULL},
            {"%M[]\n", "one entry for each", NULL},
            {"%M{\"cases\":{}}\n", "one entry for each", NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,\"value\":"
             "\"sa\",\"value\":\"sa\"}]}\n",
             "could not be read", NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,\"value\":"
             "\"sa\"}]}\n%M{\"cases\":[]}\n",
             "appeared 2 times", NULL},
            {"x%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,\"value\":"
             "\"sa\"}]}\n",
             "did not start a line", NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,\"value\":"
             "\"sa\"}]} %M\n",
             "appeared 2 times", NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":1" /* too big for int64 */
             "00000000000000000000},{\"case\":2,\"value\":\"sa\"}]}\n",
             "could not be read", NULL},
            {"%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,\"value\":"
             "\"sa\"}]}\x01\n",
             "could not be read", NULL},
            /* entries */
            {"%M{\"cases\":[{\"case\":2,\"value\":5},{\"case\":1,\"value\":"
             "\"sa\"}]}\n",
             NULL, "entry 1 is not case 1"},
            {"%M{\"cases\":[{\"case\":1,\"ok\":true},{\"case\":2,\"ok\":true}]"
             "}\n",
             NULL, "members no harness writes"},
            {"%M{\"cases\":[{\"case\":1,\"value\":5,\"ok\":true},{\"case\":2,"
             "\"value\":\"sa\",\"ok\":true}]}\n",
             NULL, "members no harness writes"},
            {"%M{\"cases\":[{\"case\":1,\"value\":\"5\"},{\"case\":2,\"value\":"
             "\"a\"}]}\n",
             NULL, "a string without a valid tag"},
            {"%M{\"cases\":[{\"case\":1,\"value\":\"i\"},{\"case\":2,\"value\":"
             "\"i5a\"}]}\n",
             NULL, "a string without a valid tag"},
            {"%M{\"cases\":[{\"case\":1,\"value\":\"f5\"},{\"case\":2,"
             "\"value\":[\"fnan \"]}]}\n",
             NULL, "a string without a valid tag"},
            {"%M{\"cases\":[{\"case\":1,\"value\":[{\"k\":\"\"}]},{\"case\":2,"
             "\"value\":\"\"}]}\n",
             NULL, "a string without a valid tag"},
            {"%M{\"cases\":[{\"case\":1,\"error\":5},{\"case\":2,"
             "\"traceback\":\"t\"}]}\n",
             NULL, "members no harness writes"},
            {"%M{\"cases\":[{\"case\":1,\"not_plain\":\"x\"},{\"case\":2,"
             "\"value\":\"sa\",\"error\":\"e\"}]}\n",
             NULL, "members no harness writes"},
            {"%M{\"cases\":[{\"case\":1.0,\"value\":5},{\"case\":\"2\","
             "\"value\":\"sa\"}]}\n",
             NULL, "is not case"},
            {"%M{\"cases\":[5,null]}\n", NULL, "is not case"},
        };
        cq_buf_t deep;
        cq_testrun_t tr;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                parse_text(tests, bad[i].text, strlen(bad[i].text), &tr);
                ck_assert_int_eq(tr.total, 2);
                ck_assert_msg(tr.passed == 0, "%s: %d passed", bad[i].text,
                              tr.passed);
                if (bad[i].run_error) {
                        ck_assert_msg(tr.error &&
                                          strstr(tr.error, bad[i].run_error),
                                      "%s: %s", bad[i].text,
                                      tr.error ? tr.error : "(no error)");
                } else {
                        ck_assert_ptr_null(tr.error);
                        ck_assert_msg(
                            strstr(case_error(&tr, 1), bad[i].case_error) &&
                                strstr(case_error(&tr, 2), "could not be read"),
                            "%s: %s / %s", bad[i].text, case_error(&tr, 1),
                            case_error(&tr, 2));
                }
                cq_testrun_release(&tr);
        }

        /* A NUL in the report line is a character like any other. */
        {
                static const char nul[] =
                    "%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,"
                    "\"value\":\"sa\"}]}\0\n";

                parse_text(tests, nul, sizeof(nul) - 1, &tr);
                ck_assert_int_eq(tr.passed, 0);
                ck_assert_msg(strstr(tr.error, "could not be read"), "%s",
                              tr.error);
                cq_testrun_release(&tr);
        }

        /* Nesting past the harness's 100 levels, and the right values:
         * only the nesting fails. */
        cq_buf_init(&deep, 1 << 20);
        ck_assert_int_eq(cq_buf_append_str(&deep, "%M{\"cases\":[{\"case\":1,"
                                                  "\"value\":"),
                         CQ_OK);
        for (i = 0; i < 200; i++)
                ck_assert_int_eq(cq_buf_append(&deep, "[", 1), CQ_OK);
        for (i = 0; i < 200; i++)
                ck_assert_int_eq(cq_buf_append(&deep, "]", 1), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&deep, "},{\"case\":2,\"value\":"
                                                  "\"sa\"}]}\n"),
                         CQ_OK);
        parse_text(tests, deep.data, deep.len, &tr);
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.passed, 1);
        ck_assert_msg(strstr(case_error(&tr, 1), "nested deeper"), "%s",
                      case_error(&tr, 1));
        cq_testrun_release(&tr);
        cq_buf_release(&deep);

        /* The right values, read and passed: the rules above are not
         * failing everything. */
        {
                static const char right[] =
                    "%M{\"cases\":[{\"case\":1,\"value\":5},{\"case\":2,"
                    "\"value\":\"sa\"}]}\n";

                parse_text(tests, right, strlen(right), &tr);
        }
        ck_assert_ptr_null(tr.error);
        ck_assert_int_eq(tr.passed, 2);
        cq_testrun_release(&tr);
}
END_TEST

/* A prelude that runs the harness as a forked runner does at its start
 * (cq_testrun_harness(), no _ARGS) and marks the module it kept. */
static char *preloaded_prelude(void)
{
        const char *src = cq_testrun_harness();
        char *b64 = cq_b64_encode(src, strlen(src), NULL), *text = NULL;

        ck_assert_ptr_nonnull(b64);
        ck_assert_int_ge(
            asprintf(&text,
                     "import sys\n"
                     "exec(__import__('base64').b64decode('%s').decode(), "
                     "{'__builtins__': __import__('builtins')})\n"
                     "sys.modules['_coderq_testrun'].kept = 'yes'\n"
                     "def add(a, b):\n    return a + b\n",
                     b64),
            0);
        free(b64);
        return text;
}

/* Where the interpreter already holds the harness (a forked runner),
 * the cases' cell runs that one and compiles no other; the preload
 * itself ran nothing (no _ARGS, no report). */
START_TEST(cases_run_the_harness_kept_in_the_interpreter)
{
        static const char tests_json[] =
            "{\"kind\":\"cases\",\"function\":\"add\",\"cases\":["
            "{\"args\":[1,2],\"expected\":3},"
            "{\"args\":[2,2],\"expected\":5}]}";
        json_t *tests = json_loads(tests_json, 0, NULL);
        char marker[40], err[256] = "", *prelude = preloaded_prelude();
        char *code, *with_check, *out;
        cq_cell_result_t res;
        cq_testrun_t tr;

        ck_assert_ptr_nonnull(tests);
        code = cq_testrun_code(tests, marker, sizeof(marker), err, sizeof(err));
        ck_assert_msg(code != NULL, "%s", err);
        ck_assert_int_ge(asprintf(&with_check,
                                  "%s\nprint('kept:', getattr(sys.modules"
                                  "['_coderq_testrun'], 'kept', 'no'))\n",
                                  code),
                         0);
        out = run_python(prelude, with_check);
        ck_assert_msg(strstr(out, "kept: yes\n"), "%s", out);
        result_with_stdout(&res, out);
        ck_assert_int_eq(cq_testrun_parse(tests, marker, &res, &tr), 0);
        ck_assert_int_eq(tr.passed, 1);
        ck_assert_int_eq(tr.total, 2);
        cq_testrun_release(&tr);
        cq_cell_result_release(&res);
        free(out);
        free(with_check);
        free(code);
        free(prelude);
        json_decref(tests);
}
END_TEST

/* "code" tests the model's interpreter runs (the bendable judge) run in
 * a harness fresh from their cell, never in a module the model's code
 * put where the harness keeps itself: a planted one that reports success
 * is not run, and the failing assertion fails. */
START_TEST(code_tests_ignore_a_planted_harness)
{
        cq_testrun_t tr;

        run_tests("import sys, types\n"
                  "x = 40\n"
                  "fake = types.ModuleType('_coderq_testrun')\n"
                  "def run(args):\n"
                  "    sys.stdout.write('\\n' + args[4] + "
                  "'{\"cases\":[{\"case\":0,\"ok\":true}]}\\n')\n"
                  "fake.run = run\n"
                  "sys.modules['_coderq_testrun'] = fake\n",
                  "{\"kind\":\"code\",\"code\":\"assert x == 42\"}", &tr);
        ck_assert_int_eq(tr.total, 1);
        ck_assert_int_eq(tr.passed, 0);
        cq_testrun_release(&tr);
}
END_TEST

static Suite *testrun_suite(void)
{
        Suite *s = suite_create("testrun");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases_all_pass_with_tolerance_and_numpy);
        tcase_add_test(tc, cases_never_call_methods_of_model_objects);
        tcase_add_test(tc,
                       cases_take_numpy_values_and_survive_shadowed_builtins);
        tcase_add_test(tc, cases_failures_say_which_expected_and_got);
        tcase_add_test(tc, cases_missing_function_fails_every_case);
        tcase_add_test(tc, code_tests_pass_and_fail);
        tcase_add_test(tc, report_must_carry_the_marker);
        tcase_add_test(tc, invalid_tests_objects_are_rejected);
        tcase_add_test(tc, cases_expected_values_never_reach_the_interpreter);
        tcase_add_test(tc, cases_frame_walking_finds_no_expected_value);
        tcase_add_test(tc, cases_ignore_patched_comparisons_and_builtins);
        tcase_add_test(tc, cases_ignore_a_fake_numpy);
        tcase_add_test(tc, cases_printed_reports_cannot_pass_a_case);
        tcase_add_test(tc, cases_compare_in_c_by_the_documented_rules);
        tcase_add_test(tc, cases_show_values_as_python_would);
        tcase_add_test(tc, malformed_reports_fail_and_never_pass);
        tcase_add_test(tc, cases_run_the_harness_kept_in_the_interpreter);
        tcase_add_test(tc, code_tests_ignore_a_planted_harness);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(testrun_suite)
