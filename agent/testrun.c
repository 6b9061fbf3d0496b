/* SPDX-License-Identifier: MIT */
/* testrun.c - job tests as one Python cell and the parser of its report.
 * Everything from the job (cases, function name, code) reaches Python as
 * base64, so no quoting of untrusted text into source code is needed. */
#include "coderq/testrun.h"

#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/buf.h"
#include "coderq/util.h"

#define TESTRUN_CODE_MAX ((size_t)64 << 20)

/* The harness for "cases", followed by a call line holding the cases
 * (base64 JSON), the function name (base64) and the marker. Catches
 * Exception, not BaseException, so that an interrupt from a
 * timeout still stops it. */
static const char cases_harness[] =
    "def __coderq_tests(__cases, __fname, __marker):\n"
    "    import json, math, traceback\n"
    "    def norm(v):\n"
    "        try:\n"
    "            import numpy as np\n"
    "            if isinstance(v, np.ndarray):\n"
    "                return v.tolist()\n"
    "            if isinstance(v, np.generic):\n"
    "                return v.item()\n"
    "        except ImportError:\n"
    "            pass\n"
    "        if isinstance(v, (list, tuple)):\n"
    "            return [norm(x) for x in v]\n"
    "        if isinstance(v, dict):\n"
    "            return {str(k): norm(x) for k, x in v.items()}\n"
    "        return v\n"
    "    def eq(a, b):\n"
    "        if isinstance(a, bool) or isinstance(b, bool):\n"
    "            return type(a) is type(b) and a == b\n"
    "        if isinstance(a, (int, float)) and isinstance(b, (int, float)):\n"
    "            if a != a and b != b:\n"
    "                return True\n"
    "            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)\n"
    "        if isinstance(a, list) and isinstance(b, list):\n"
    "            return len(a) == len(b) and all(eq(x, y) for x, y in "
    "zip(a, b))\n"
    "        if isinstance(a, dict) and isinstance(b, dict):\n"
    "            return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in "
    "a)\n"
    "        return a == b\n"
    "    def short(v):\n"
    "        try:\n"
    "            r = repr(v)\n"
    "        except Exception as e:\n"
    "            r = '<unrepresentable: %s>' % e\n"
    "        return r if len(r) <= 300 else r[:300] + '...'\n"
    "    out = []\n"
    "    fn = globals().get(__fname)\n"
    "    for i, c in enumerate(__cases):\n"
    "        args = c.get('args', [])\n"
    "        rec = {'case': i + 1, 'args': short(args),\n"
    "               'call': '%s(%s)' % (__fname, ', '.join(short(a) for a "
    "in args)),\n"
    "               'expected': short(c.get('expected'))}\n"
    "        if not callable(fn):\n"
    "            rec['ok'] = False\n"
    "            rec['error'] = 'NameError: function %r is not defined' % "
    "__fname\n"
    "        else:\n"
    "            try:\n"
    "                got = fn(*args)\n"
    "                rec['got'] = short(got)\n"
    "                rec['ok'] = bool(eq(norm(got), norm(c.get('expected'))))\n"
    "            except Exception as e:\n"
    "                rec['ok'] = False\n"
    "                rec['error'] = '%s: %s' % (type(e).__name__, e)\n"
    "                rec['traceback'] = traceback.format_exc(limit=5)[-2000:]\n"
    "        out.append(rec)\n"
    "    print(__marker + json.dumps({'cases': out}), flush=True)\n";

static const char cases_call[] =
    "__coderq_tests(__import__('json').loads(__import__('base64')."
    "b64decode('%s')),\n"
    "               __import__('base64').b64decode('%s').decode(), '%s')\n"
    "del __coderq_tests\n";

/* The harness for "code": run it in the user namespace; an exception
 * (assertion or other) fails the single test. */
static const char code_harness[] =
    "def __coderq_tests(__src, __marker):\n"
    "    import json, traceback\n"
    "    rec = {'case': 0}\n"
    "    try:\n"
    "        exec(compile(__src, '<tests>', 'exec'), globals())\n"
    "        rec['ok'] = True\n"
    "    except Exception as e:\n"
    "        rec['ok'] = False\n"
    "        rec['error'] = '%s: %s' % (type(e).__name__, e)\n"
    "        rec['traceback'] = traceback.format_exc(limit=5)[-2000:]\n"
    "    print(__marker + json.dumps({'cases': [rec]}), flush=True)\n";

static const char code_call[] =
    "__coderq_tests(__import__('base64').b64decode('%s').decode(), '%s')\n"
    "del __coderq_tests\n";

void cq_testrun_init(cq_testrun_t *tr) { memset(tr, 0, sizeof(*tr)); }

void cq_testrun_release(cq_testrun_t *tr)
{
        free(tr->error);
        json_decref(tr->report);
        cq_testrun_init(tr);
}

static int make_marker(char *marker, size_t size)
{
        unsigned char rnd[12];
        size_t i;

        if (size < 33 || RAND_bytes(rnd, sizeof(rnd)) != 1)
                return -1;
        memcpy(marker, "@@CQTEST", 8);
        for (i = 0; i < sizeof(rnd); i++)
                snprintf(marker + 8 + 2 * i, 3, "%02x", rnd[i]);
        marker[32] = '\0';
        return 0;
}

char *cq_testrun_code(const json_t *tests,
                      char *marker,
                      size_t marker_size,
                      char *errstr,
                      size_t errstr_size)
{
        const char *kind = json_string_value(json_object_get(tests, "kind"));
        char *json = NULL, *b64a = NULL, *b64b = NULL, *code = NULL;
        cq_buf_t buf;
        cq_err_t err;

        cq_buf_init(&buf, TESTRUN_CODE_MAX);
        if (make_marker(marker, marker_size) != 0) {
                snprintf(errstr, errstr_size, "could not make a test marker");
                goto out;
        }
        if (kind && strcmp(kind, "cases") == 0) {
                const json_t *cases = json_object_get(tests, "cases");
                const char *fname =
                    json_string_value(json_object_get(tests, "function"));

                if (!json_is_array(cases) || !fname) {
                        snprintf(errstr, errstr_size,
                                 "tests of kind \"cases\" need \"function\" "
                                 "and \"cases\"");
                        goto out;
                }
                json = json_dumps(cases, JSON_COMPACT);
                if (!json)
                        goto oom;
                b64a = cq_b64_encode(json, strlen(json), NULL);
                b64b = cq_b64_encode(fname, strlen(fname), NULL);
                if (!b64a || !b64b)
                        goto oom;
                err = cq_buf_append_str(&buf, cases_harness);
                if (err == CQ_OK)
                        err =
                            cq_buf_printf(&buf, cases_call, b64a, b64b, marker);
        } else if (kind && strcmp(kind, "code") == 0) {
                const json_t *src = json_object_get(tests, "code");

                if (!json_is_string(src)) {
                        snprintf(errstr, errstr_size,
                                 "tests of kind \"code\" need \"code\"");
                        goto out;
                }
                b64a = cq_b64_encode(json_string_value(src),
                                     json_string_length(src), NULL);
                if (!b64a)
                        goto oom;
                err = cq_buf_append_str(&buf, code_harness);
                if (err == CQ_OK)
                        err = cq_buf_printf(&buf, code_call, b64a, marker);
        } else {
                snprintf(errstr, errstr_size,
                         "tests \"kind\" must be \"cases\" or \"code\"");
                goto out;
        }
        if (err != CQ_OK) {
                snprintf(errstr, errstr_size,
                         "could not build the test cell: "
                         "tests too large");
                goto out;
        }
        code = cq_buf_take(&buf, NULL);
        if (!code)
                goto oom;
        goto out;
oom:
        snprintf(errstr, errstr_size,
                 "could not build the test cell: out of "
                 "memory");
out:
        free(json);
        free(b64a);
        free(b64b);
        cq_buf_release(&buf);
        return code;
}

/* The last stdout line that starts with the marker, parsed. The output
 * may hold NULs (the code under test printed them): lengths, not C
 * strings, and a report may carry "\u0000" in its values. */
static json_t *find_report(const cq_cell_result_t *res, const char *marker)
{
        size_t i, mlen = strlen(marker);
        json_t *output, *report = NULL;

        json_array_foreach(res->outputs, i, output)
        {
                const json_t *tv = json_object_get(output, "text");
                const char *name, *text, *p, *end, *stop;

                name = json_string_value(json_object_get(output, "name"));
                text = json_string_value(tv);
                if (!name || strcmp(name, "stdout") != 0 || !text)
                        continue;
                stop = text + json_string_length(tv);
                for (p = text;
                     (p = memmem(p, (size_t)(stop - p), marker, mlen)) != NULL;
                     p = end) {
                        json_t *parsed;

                        end = memchr(p, '\n', (size_t)(stop - p));
                        if (!end)
                                end = stop;
                        if (p != text && p[-1] != '\n')
                                continue; /* must start a line */
                        parsed = json_loadb(p + mlen, (size_t)(end - p) - mlen,
                                            JSON_ALLOW_NUL, NULL);
                        if (json_is_object(parsed)) {
                                json_decref(report);
                                report = parsed;
                        } else {
                                json_decref(parsed);
                        }
                }
        }
        return report;
}

/* The error output of a cell, as "Name: value". */
static void cell_error(const cq_cell_result_t *res, char *out, size_t size)
{
        size_t i;
        json_t *output;

        snprintf(out, size, "the test cell ended with status %s",
                 cq_cell_status_name(res->status));
        json_array_foreach(res->outputs, i, output)
        {
                const char *type =
                    json_string_value(json_object_get(output, "output_type"));

                if (type && strcmp(type, "error") == 0)
                        snprintf(
                            out, size, "%s: %s",
                            json_string_value(json_object_get(output, "ename")),
                            json_string_value(
                                json_object_get(output, "evalue")));
        }
}

static int expected_total(const json_t *tests)
{
        const json_t *cases = json_object_get(tests, "cases");

        return json_is_array(cases) ? (int)json_array_size(cases) : 1;
}

int cq_testrun_parse(const json_t *tests,
                     const char *marker,
                     const cq_cell_result_t *res,
                     cq_testrun_t *tr)
{
        json_t *report = NULL, *cases, *rec;
        size_t i;
        int rc = -1;

        cq_testrun_init(tr);
        tr->total = expected_total(tests);
        if (res->status == CQ_CELL_OK)
                report = find_report(res, marker);
        cases = json_object_get(report, "cases");
        if (!json_is_array(cases) ||
            json_array_size(cases) != (size_t)tr->total) {
                char why[512];

                cell_error(res, why, sizeof(why));
                if (res->status == CQ_CELL_OK)
                        snprintf(why, sizeof(why),
                                 "the tests printed no report (did the code "
                                 "replace print or exit the interpreter?)");
                tr->error = strdup(why);
                tr->report = json_pack("{s:i, s:i, s:s}", "passed", 0, "total",
                                       tr->total, "error", why);
                rc = tr->error && tr->report ? 0 : -1;
                goto out;
        }
        json_array_foreach(cases, i, rec)
        {
                if (json_is_true(json_object_get(rec, "ok")))
                        tr->passed++;
        }
        tr->report = json_pack("{s:i, s:i, s:O}", "passed", tr->passed, "total",
                               tr->total, "cases", cases);
        rc = tr->report ? 0 : -1;
out:
        json_decref(report);
        if (rc != 0)
                cq_testrun_release(tr);
        return rc;
}

size_t
cq_testrun_failures(const cq_testrun_t *tr, cq_test_failure_t *out, size_t max)
{
        json_t *cases = json_object_get(tr->report, "cases"), *rec;
        size_t i, n = 0;

        if (tr->error) {
                if (max == 0)
                        return 0;
                memset(out, 0, sizeof(*out));
                out->error = tr->error;
                return 1;
        }
        json_array_foreach(cases, i, rec)
        {
                if (n >= max)
                        break;
                if (json_is_true(json_object_get(rec, "ok")))
                        continue;
                memset(&out[n], 0, sizeof(out[n]));
                out[n].index =
                    (size_t)json_integer_value(json_object_get(rec, "case"));
                out[n].call = json_string_value(json_object_get(rec, "call"));
                out[n].expected =
                    json_string_value(json_object_get(rec, "expected"));
                out[n].got = json_string_value(json_object_get(rec, "got"));
                out[n].error =
                    json_string_value(json_object_get(rec, "traceback"));
                if (!out[n].error)
                        out[n].error =
                            json_string_value(json_object_get(rec, "error"));
                n++;
        }
        return n;
}
