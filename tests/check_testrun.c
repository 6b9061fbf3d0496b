/* SPDX-License-Identifier: MIT */
/* check_testrun.c - job test cells: the generated Python runs under
 * Debian's python3 as a script (no kernel needed) and its stdout is fed
 * back through the report parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/buf.h"
#include "coderq/testrun.h"

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
        static const char *const types[] = {"Always",
                                            "MyInt (a subclass of int)",
                                            "MyStr (a subclass of str)",
                                            "MyList (a subclass of list)",
                                            "MyDict (a subclass of dict)",
                                            "Always"};
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
                  "class MyStr(str):\n"
                  "    def __eq__(self, other):\n"
                  "        return True\n"
                  "class MyList(list):\n"
                  "    def __iter__(self):\n"
                  "        return iter([1, 2])\n"
                  "    def __len__(self):\n"
                  "        return 2\n"
                  "class MyDict(dict):\n"
                  "    def keys(self):\n"
                  "        return {'a': 1}.keys()\n"
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
                const char *err = case_error(&tr, i);
                char want[128];

                snprintf(want, sizeof(want), "it holds a value of type %s.",
                         types[i - 1]);
                ck_assert_msg(err && strstr(err, "not plain data") &&
                                  strstr(err, want),
                              "case %zu: %s", i, err ? err : "(no error)");
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
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(testrun_suite)
