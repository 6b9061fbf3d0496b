/* SPDX-License-Identifier: MIT */
/* testrun.c - job tests as one Python cell and the parser of its report.
 * Everything from the job (cases, function name, code) reaches Python as
 * base64, so no quoting of untrusted text into source code is needed. */
#include "coderq/agent/testrun.h"

#include <math.h>
#include <stdint.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/common/pylit.h"
#include "coderq/common/util.h"
#include "testrun_int.h"

#define TESTRUN_CODE_MAX ((size_t)64 << 20)

/* The harness (testrun_harness.py, built in as cq_testrun_harness_py),
 * one Python program for both kinds. It runs by exec() in a namespace of
 * its own whose builtins are the real module, so a variable the model
 * named len, type or print cannot change it, and it leaves no name in
 * the user namespace; it keeps itself in sys.modules, where a judge
 * call's stub (harness_stub_py) finds it. It reads _ARGS: the user
 * namespace, the kind, the calls (base64 JSON: one list of arguments per
 * case) or the test code (base64), the function name (base64) and the
 * marker.
 *
 * It never sees an expected value: it calls the function once per case
 * and writes what came back, as plain data, into its report; C compares
 * (cq_testrun_parse()). Everything in this interpreter ran the model's
 * code first, so the harness cannot be trusted and is not: a forged or
 * garbled report can claim any result, which the model could as well have
 * returned, and a result that does not parse fails its case. Within that,
 * it is written not to depend on what the model may have replaced: the
 * types and the methods it calls come from literals (().__class__ is
 * tuple whatever builtins.type has become), it serialises by hand with
 * str.translate instead of the json module, and numpy types count only
 * when they are numpy's own C types (a model class named ndarray in a
 * fake sys.modules['numpy'] is a heap type). No method of an object the
 * model's code made is called: exact types only (a subclass of int, str,
 * list or dict may override __eq__, __iter__ or __float__). While the
 * function (or the test code) runs, stdout and stderr go to a sink, so a
 * flood of output cannot bury the report, which is written to the stream
 * the cell started with. Catches Exception and SystemExit, not
 * KeyboardInterrupt, so that an interrupt from a timeout still stops it.
 *
 * A value is written as JSON, tagged where JSON has no form for it or
 * could confuse it: a str is "s" + the text; an int outside int64 is
 * "i" + its digits; NaN and the infinities are "fnan", "finf", "f-inf";
 * ints, floats (repr), None, True and False are JSON's own; lists and
 * tuples arrays; dicts objects (str keys, untagged). One entry per case:
 *   {"case":N,"value":V}
 *   {"case":N,"not_plain":"why","type":"T"}
 *   {"case":N,"error":"E","traceback":"TB"}   (traceback optional)
 * and for code tests {"case":0,"ok":true} or {"case":0,"error":...}. */

/* The stub a call sends once the harness is loaded in the interpreter: it
 * runs the harness kept there (under the name the harness registers at
 * its end) with its _ARGS, or, when there is none (the interpreter was
 * replaced or restarted since), writes the report {"harness":"missing"}
 * and the caller sends the whole harness. */
static const char harness_stub_py[] =
    "import sys\n"
    "_h = sys.modules.get('_coderq_testrun')\n"
    "if _h is None:\n"
    "    sys.stdout.write('\\n' + _ARGS[4] + '{\"harness\":\"missing\"}\\n')\n"
    "    sys.stdout.flush()\n"
    "else:\n"
    "    _h.run(_ARGS)\n";

/* The cell of a judge's first call or of a run of "cases": it runs the
 * harness kept in the interpreter (a forked runner has it from its
 * start, cq_testrun_harness()), or, where there is none, the whole
 * harness, which its _HARNESS carries (base64) and which then stays. A
 * forked runner so compiles none of its 15 KB per job (about 3 ms of
 * CPU). */
static const char harness_load_py[] =
    "import sys\n"
    "_h = sys.modules.get('_coderq_testrun')\n"
    "if _h is None:\n"
    "    exec(__import__('base64').b64decode(_HARNESS).decode(),\n"
    "         {'__builtins__': __import__('builtins'), '_ARGS': _ARGS})\n"
    "else:\n"
    "    _h.run(_ARGS)\n";

const char *cq_testrun_harness(void) { return cq_testrun_harness_py; }

/* The cell: one line that runs \p b64h, as base64 so that the line
 * holds no quote or newline of its own, by exec() in a namespace of its
 * own whose _ARGS are the user namespace and \p args (kind, data,
 * function name, marker) as Python literals, and whose _HARNESS is
 * \p harness (base64) unless NULL. */
static cq_err_t put_cell(cq_buf_t *buf,
                         const char *b64h,
                         const char *const *args,
                         const char *harness)
{
        cq_err_t err;
        size_t i;

        err = cq_buf_append_str(buf, "exec(__import__('base64').b64decode(");
        if (err == CQ_OK)
                err = cq_pylit_append(buf, b64h, strlen(b64h));
        if (err == CQ_OK)
                err = cq_buf_append_str(
                    buf, ").decode(), {'__builtins__': __import__('builtins'), "
                         "'_ARGS': (globals()");
        for (i = 0; i < 4 && err == CQ_OK; i++) {
                err = cq_buf_append_str(buf, ", ");
                if (err == CQ_OK)
                        err = cq_pylit_append(buf, args[i], strlen(args[i]));
        }
        if (err == CQ_OK)
                err = cq_buf_append_str(buf, ")");
        if (err == CQ_OK && harness) {
                err = cq_buf_append_str(buf, ", '_HARNESS': ");
                if (err == CQ_OK)
                        err = cq_pylit_append(buf, harness, strlen(harness));
        }
        if (err == CQ_OK)
                err = cq_buf_append_str(buf, "})\n");
        return err;
}

/* Shown values (expected, got, the call's arguments) are cut here, as
 * Python's repr would be by the feedback. */
#define SHOWN_MAX 300
/* The harness nests values at most 100 levels deep. */
#define DEPTH_MAX 101
/* What the report may carry per case, as text. */
#define ERROR_MAX      1200
#define TRACEBACK_MAX  2400
#define INT_DIGITS_MAX 5000
#define CALL_MAX       4096

static const char not_plain_fmt[] =
    "the result is not plain data: it holds %.*s. Tests compare only None, "
    "bool, int, float, str, list, tuple and dict with str keys (exact "
    "types, not subclasses) and numpy numbers, strings and arrays of them; "
    "return such values";

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

/* The arguments of every case, [[args of case 1], ...]: all the harness
 * gets of a case. The expected values never enter the interpreter. */
static char *calls_json(const json_t *cases)
{
        json_t *calls = json_array(), *c;
        char *text = NULL;
        size_t i;

        if (!calls)
                return NULL;
        json_array_foreach(cases, i, c)
        {
                json_t *args = json_object_get(c, "args");

                if (json_array_append_new(calls, args ? json_incref(args)
                                                      : json_array()) != 0)
                        goto out;
        }
        text = json_dumps(calls, JSON_COMPACT);
out:
        json_decref(calls);
        return text;
}

char *cq_testrun_code(const json_t *tests,
                      char *marker,
                      size_t marker_size,
                      char *errstr,
                      size_t errstr_size)
{
        const char *kind = json_string_value(json_object_get(tests, "kind"));
        char *json = NULL, *b64h = NULL, *b64a = NULL, *b64b = NULL;
        char *b64w = NULL, *code = NULL;
        const char *args[4];
        cq_buf_t buf;

        cq_buf_init(&buf, TESTRUN_CODE_MAX);
        if (make_marker(marker, marker_size) != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not make a test marker");
                goto out;
        }
        if (kind && strcmp(kind, "cases") == 0) {
                const json_t *cases = json_object_get(tests, "cases");
                const char *fname =
                    json_string_value(json_object_get(tests, "function"));

                if (!json_is_array(cases) || !fname) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "tests of kind \"cases\" need \"function\" "
                            "and \"cases\"");
                        goto out;
                }
                json = calls_json(cases);
                if (!json)
                        goto oom;
                b64a = cq_b64_encode(json, strlen(json), NULL);
                b64b = cq_b64_encode(fname, strlen(fname), NULL);
        } else if (kind && strcmp(kind, "code") == 0) {
                const json_t *src = json_object_get(tests, "code");

                if (!json_is_string(src)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "tests of kind \"code\" need \"code\"");
                        goto out;
                }
                b64a = cq_b64_encode(json_string_value(src),
                                     json_string_length(src), NULL);
                b64b = cq_b64_encode("", 0, NULL);
        } else {
                cq_errstr_set(errstr, errstr_size,
                              "tests \"kind\" must be \"cases\" or \"code\"");
                goto out;
        }
        /* "code" tests run here, in the model's interpreter, when the job
         * asks for that judge (what the verdict then records as
         * bendable): the harness runs them fresh from this cell, as it
         * always did, rather than a module the model's code could have
         * put in its place. "cases" send no expected value here, so the
         * harness kept in the interpreter is as good as a fresh one. */
        if (strcmp(kind, "code") == 0) {
                b64h = cq_b64_encode(cq_testrun_harness_py,
                                     strlen(cq_testrun_harness_py), NULL);
        } else {
                b64h = cq_b64_encode(harness_load_py,
                                     sizeof(harness_load_py) - 1, NULL);
                b64w = cq_b64_encode(cq_testrun_harness_py,
                                     strlen(cq_testrun_harness_py), NULL);
                if (!b64w)
                        goto oom;
        }
        if (!b64h || !b64a || !b64b)
                goto oom;
        args[0] = kind;
        args[1] = b64a;
        args[2] = b64b;
        args[3] = marker;
        if (put_cell(&buf, b64h, args, b64w) != CQ_OK) {
                cq_errstr_set(errstr, errstr_size,
                              "could not build the test cell: "
                              "tests too large");
                goto out;
        }
        code = cq_buf_take(&buf, NULL);
        if (!code)
                goto oom;
        goto out;
oom:
        cq_errstr_set(errstr, errstr_size,
                      "could not build the test cell: out of "
                      "memory");
out:
        free(json);
        free(b64h);
        free(b64w);
        free(b64a);
        free(b64b);
        cq_buf_release(&buf);
        return code;
}

/* ------------------------------------------------------------ the report */

/* The report: the only stdout line that starts with the marker, parsed
 * strictly. The marker anywhere else in the output, or more than once,
 * means the code under test printed it (it can read the harness), and no
 * report is taken. The output may hold NULs (the code under test printed
 * them): lengths, not C strings. Returns NULL with \p why filled, or with
 * why[0] == '\0' when there is no marker at all. */
static json_t *find_report(const cq_cell_result_t *res,
                           const char *marker,
                           char *why,
                           size_t size)
{
        size_t i, mlen = strlen(marker), seen = 0;
        const char *line = NULL, *line_end = NULL;
        bool line_start = false;
        json_t *output, *report;
        json_error_t jerr;

        why[0] = '\0';
        json_array_foreach(res->outputs, i, output)
        {
                const json_t *tv = json_object_get(output, "text");
                const char *name, *text, *p, *stop;

                name = json_string_value(json_object_get(output, "name"));
                text = json_string_value(tv);
                if (!name || strcmp(name, "stdout") != 0 || !text)
                        continue;
                stop = text + json_string_length(tv);
                for (p = text;
                     (p = memmem(p, (size_t)(stop - p), marker, mlen)) != NULL;
                     p += mlen) {
                        seen++;
                        line = p + mlen;
                        line_end = memchr(line, '\n', (size_t)(stop - line));
                        if (!line_end)
                                line_end = stop;
                        line_start = p == text || p[-1] == '\n';
                }
        }
        if (seen == 0)
                return NULL;
        if (seen > 1) {
                snprintf(why, size,
                         "the tests' report marker appeared %zu times in the "
                         "output: the code under test printed it, so no "
                         "report is trusted",
                         seen);
                return NULL;
        }
        if (!line_start) {
                snprintf(why, size,
                         "the tests' report did not start a line: the code "
                         "under test printed its marker, so it is not "
                         "trusted");
                return NULL;
        }
        report = json_loadb(line, (size_t)(line_end - line),
                            JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
        if (!report)
                snprintf(why, size, "the tests' report could not be read: %s",
                         jerr.text);
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

int cq_testrun_fail(const json_t *tests, const char *why, cq_testrun_t *tr)
{
        cq_testrun_release(tr);
        tr->total = expected_total(tests);
        tr->error = strdup(why);
        tr->report = json_pack("{s:i, s:i, s:s}", "passed", 0, "total",
                               tr->total, "error", why);
        if (!tr->error || !tr->report) {
                cq_testrun_release(tr);
                return -1;
        }
        return 0;
}

/* ------------------------------------------------- values of the report */

/* Whether \p s (\p len bytes) is a tag of the harness: "s..." for a str,
 * "i" and decimal digits for a big int, "fnan", "finf", "f-inf". */
static bool valid_tag(const char *s, size_t len)
{
        size_t i = 1;

        if (len == 0)
                return false;
        if (s[0] == 's')
                return true;
        if (s[0] == 'f')
                return (len == 4 && memcmp(s, "fnan", 4) == 0) ||
                       (len == 4 && memcmp(s, "finf", 4) == 0) ||
                       (len == 5 && memcmp(s, "f-inf", 5) == 0);
        if (s[0] != 'i' || len > INT_DIGITS_MAX)
                return false;
        if (i < len && s[i] == '-')
                i++;
        if (i == len)
                return false;
        for (; i < len; i++)
                if (s[i] < '0' || s[i] > '9')
                        return false;
        return true;
}

/* Whether \p v is a value as the harness writes them (see the harness);
 * on false, \p why says what is wrong. */
static bool valid_value(const json_t *v, int depth, char *why, size_t size)
{
        const char *key;
        json_t *item;
        size_t i;

        if (depth > DEPTH_MAX) {
                snprintf(why, size, "values nested deeper than %d levels",
                         DEPTH_MAX);
                return false;
        }
        switch (json_typeof(v)) {
        case JSON_STRING:
                if (!valid_tag(json_string_value(v), json_string_length(v))) {
                        snprintf(why, size, "a string without a valid tag");
                        return false;
                }
                return true;
        case JSON_ARRAY:
                json_array_foreach(v, i, item)
                {
                        if (!valid_value(item, depth + 1, why, size))
                                return false;
                }
                return true;
        case JSON_OBJECT:
                json_object_foreach((json_t *)(uintptr_t)v, key, item)
                {
                        if (!valid_value(item, depth + 1, why, size))
                                return false;
                }
                return true;
        default:
                return true; /* null, true, false, integer, real */
        }
}

/* A number of the report as a double: 1, or 2 for an int beyond a
 * double's range (Python then compares exactly, and no expected value is
 * that large), 0 when \p v is no number. */
static int report_number(const json_t *v, double *d)
{
        const char *s;

        if (json_is_integer(v) || json_is_real(v)) {
                *d = json_number_value(v);
                return 1;
        }
        if (!json_is_string(v))
                return 0;
        s = json_string_value(v);
        if (strcmp(s, "fnan") == 0)
                *d = NAN;
        else if (strcmp(s, "finf") == 0)
                *d = INFINITY;
        else if (strcmp(s, "f-inf") == 0)
                *d = -INFINITY;
        else if (s[0] == 'i') {
                *d = strtod(s + 1, NULL); /* rounds as Python's int to float */
                return isinf(*d) ? 2 : 1;
        } else
                return 0;
        return 1;
}

/* math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), as CPython computes it,
 * and NaN equal to NaN. */
static bool close_enough(double a, double b)
{
        double diff;

        if (isnan(a) && isnan(b))
                return true;
        if (a == b)
                return true;
        if (isinf(a) || isinf(b))
                return false;
        diff = fabs(b - a);
        return diff <= fabs(1e-6 * b) || diff <= fabs(1e-6 * a) || diff <= 1e-9;
}

/* Whether the result \p got (a valid value of the report) equals the
 * job's \p expected (plain JSON): booleans only equal booleans, numbers
 * compare with tolerance, the rest exactly and element-wise. */
static bool same(const json_t *got, const json_t *expected)
{
        const char *key;
        json_t *item;
        double a;
        size_t i;

        if (json_is_boolean(got) || json_is_boolean(expected))
                return json_is_boolean(got) && json_is_boolean(expected) &&
                       json_is_true(got) == json_is_true(expected);
        switch (json_typeof(expected)) {
        case JSON_NULL:
                return json_is_null(got);
        case JSON_INTEGER:
        case JSON_REAL:
                return report_number(got, &a) == 1 &&
                       close_enough(a, json_number_value(expected));
        case JSON_STRING:
                return json_is_string(got) &&
                       json_string_value(got)[0] == 's' &&
                       json_string_length(got) - 1 ==
                           json_string_length(expected) &&
                       memcmp(json_string_value(got) + 1,
                              json_string_value(expected),
                              json_string_length(expected)) == 0;
        case JSON_ARRAY:
                if (!json_is_array(got) ||
                    json_array_size(got) != json_array_size(expected))
                        return false;
                json_array_foreach(expected, i, item)
                {
                        if (!same(json_array_get(got, i), item))
                                return false;
                }
                return true;
        case JSON_OBJECT:
                if (!json_is_object(got) ||
                    json_object_size(got) != json_object_size(expected))
                        return false;
                json_object_foreach((json_t *)(uintptr_t)expected, key, item)
                {
                        const json_t *g = json_object_get(got, key);

                        if (!g || !same(g, item))
                                return false;
                }
                return true;
        default:
                return false;
        }
}

/* Append at most what still fits below the shown length (and the cap). */
static void put(cq_buf_t *buf, const char *s, size_t n)
{
        size_t room = cq_buf_room(buf);

        if (buf->len > SHOWN_MAX)
                return;
        if (n > room)
                n = room;
        if (cq_buf_append(buf, s, n) != CQ_OK)
                return; /* out of memory: the shown text is shorter */
}

/* repr() of a float: the shortest digits that read back the same,
 * positional from 1e-4 to 1e16, else with an exponent. */
static void float_repr(double d, char *out, size_t size)
{
        char e[40];
        int prec, exp;

        if (isnan(d)) {
                snprintf(out, size, "nan");
                return;
        }
        if (isinf(d)) {
                snprintf(out, size, d < 0 ? "-inf" : "inf");
                return;
        }
        for (prec = 1; prec < 17; prec++) {
                snprintf(e, sizeof(e), "%.*e", prec - 1, d);
                if (strtod(e, NULL) == d)
                        break;
        }
        snprintf(e, sizeof(e), "%.*e", prec - 1, d);
        exp = (int)strtol(strchr(e, 'e') + 1, NULL, 10);
        if (exp < -4 || exp >= 16) {
                snprintf(out, size, "%s", e);
                return;
        }
        snprintf(out, size, "%.*f", prec - 1 - exp > 0 ? prec - 1 - exp : 0, d);
        if (!strpbrk(out, ".e"))
                snprintf(out + strlen(out), size - strlen(out), ".0");
}

/* repr() of a str: quoted as Python quotes it, control characters
 * escaped. */
static void str_repr(cq_buf_t *buf, const char *s, size_t n)
{
        bool dq = memchr(s, '\'', n) && !memchr(s, '"', n);
        char q = dq ? '"' : '\'', esc[8];
        size_t i;

        put(buf, &q, 1);
        for (i = 0; i < n && buf->len <= SHOWN_MAX; i++) {
                unsigned char c = (unsigned char)s[i];

                if (c == '\\' || c == (unsigned char)q) {
                        esc[0] = '\\';
                        esc[1] = (char)c;
                        put(buf, esc, 2);
                } else if (c == '\n') {
                        put(buf, "\\n", 2);
                } else if (c == '\r') {
                        put(buf, "\\r", 2);
                } else if (c == '\t') {
                        put(buf, "\\t", 2);
                } else if (c < 0x20 || c == 0x7f) {
                        snprintf(esc, sizeof(esc), "\\x%02x", c);
                        put(buf, esc, 4);
                } else if (c == 0xc2 && i + 1 < n &&
                           (unsigned char)s[i + 1] >= 0x80 &&
                           (unsigned char)s[i + 1] <= 0x9f) {
                        snprintf(esc, sizeof(esc), "\\x%02x",
                                 (unsigned char)s[++i]); /* C1 control */
                        put(buf, esc, 4);
                } else {
                        put(buf, s + i, 1);
                }
        }
        put(buf, &q, 1);
}

/* Python's repr() of \p v, a job value (plain JSON) or, when \p tagged, a
 * value of the report. */
static void repr(cq_buf_t *buf, const json_t *v, bool tagged)
{
        char num[64];
        const char *key, *s;
        json_t *item;
        size_t i, n = 0;

        if (buf->len > SHOWN_MAX)
                return;
        switch (json_typeof(v)) {
        case JSON_NULL:
                put(buf, "None", 4);
                break;
        case JSON_TRUE:
                put(buf, "True", 4);
                break;
        case JSON_FALSE:
                put(buf, "False", 5);
                break;
        case JSON_INTEGER:
                snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT,
                         json_integer_value(v));
                put(buf, num, strlen(num));
                break;
        case JSON_REAL:
                float_repr(json_real_value(v), num, sizeof(num));
                put(buf, num, strlen(num));
                break;
        case JSON_STRING:
                s = json_string_value(v);
                n = json_string_length(v);
                if (!tagged) {
                        str_repr(buf, s, n);
                } else if (s[0] == 's') {
                        str_repr(buf, s + 1, n - 1);
                } else if (s[0] == 'i') {
                        put(buf, s + 1, n - 1);
                } else {
                        double d = 0;

                        (void)report_number(v, &d);
                        float_repr(d, num, sizeof(num));
                        put(buf, num, strlen(num));
                }
                break;
        case JSON_ARRAY:
                put(buf, "[", 1);
                json_array_foreach(v, i, item)
                {
                        if (i)
                                put(buf, ", ", 2);
                        repr(buf, item, tagged);
                        if (buf->len > SHOWN_MAX)
                                break;
                }
                put(buf, "]", 1);
                break;
        case JSON_OBJECT:
                put(buf, "{", 1);
                json_object_foreach((json_t *)(uintptr_t)v, key, item)
                {
                        if (n++)
                                put(buf, ", ", 2);
                        str_repr(buf, key, strlen(key));
                        put(buf, ": ", 2);
                        repr(buf, item, tagged);
                        if (buf->len > SHOWN_MAX)
                                break;
                }
                put(buf, "}", 1);
                break;
        }
}

/* \p n bytes of valid UTF-8 at \p s, cut to at most \p max bytes on a
 * character boundary. */
static size_t utf8_cut(const char *s, size_t n, size_t max)
{
        if (n <= max)
                return n;
        while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
                max--;
        return max;
}

/* Set \p key of \p rec to \p buf's text, cut to SHOWN_MAX with "...". */
static int set_shown(json_t *rec, const char *key, const cq_buf_t *buf)
{
        char cut[SHOWN_MAX + 4];
        size_t n;

        if (!buf->data)
                return json_object_set_new(rec, key, json_string(""));
        n = utf8_cut(buf->data, buf->len, SHOWN_MAX);
        if (n == buf->len)
                return json_object_set_new(rec, key,
                                           json_stringn(buf->data, n));
        memcpy(cut, buf->data, n);
        memcpy(cut + n, "...", 3);
        return json_object_set_new(rec, key, json_stringn(cut, n + 3));
}

/* Set \p key of \p rec to the string \p v of the report, cut to \p max. */
static int set_text(json_t *rec, const char *key, const json_t *v, size_t max)
{
        const char *s = json_string_value(v);

        return json_object_set_new(
            rec, key, json_stringn(s, utf8_cut(s, json_string_length(v), max)));
}

/* Set \p key of \p rec to repr() of \p v (plain JSON), cut. */
static int set_repr(json_t *rec, const char *key, const json_t *v)
{
        cq_buf_t buf;
        int rc;

        cq_buf_init(&buf, SHOWN_MAX + 64);
        repr(&buf, v, false);
        rc = set_shown(rec, key, &buf);
        cq_buf_release(&buf);
        return rc;
}

/* The shown parts of case \p c of \p fname: its arguments, the call and
 * the expected value, from the job (not from the interpreter). */
static int case_shown(json_t *rec, const char *fname, const json_t *c)
{
        const json_t *args = json_object_get(c, "args"), *arg;
        cq_buf_t buf, call;
        size_t i;
        int rc = -1;

        cq_buf_init(&buf, SHOWN_MAX + 64);
        cq_buf_init(&call, CALL_MAX);
        if ((args ? set_repr(rec, "args", args)
                  : json_object_set_new(rec, "args", json_string("[]"))) != 0 ||
            set_repr(rec, "expected", json_object_get(c, "expected")) != 0 ||
            cq_buf_printf(&call, "%.128s(", fname) != CQ_OK)
                goto out;
        json_array_foreach(args, i, arg)
        {
                size_t n;

                cq_buf_reset(&buf);
                repr(&buf, arg, false);
                n = buf.data ? utf8_cut(buf.data, buf.len, SHOWN_MAX) : 0;
                /* a long call is cut, leaving room for "...)" */
                if (n + 9 > cq_buf_room(&call)) {
                        if (cq_buf_append_str(&call, i ? ", ..." : "...") !=
                            CQ_OK)
                                goto out;
                        break;
                }
                if (cq_buf_printf(&call, "%s%.*s%s", i ? ", " : "", (int)n,
                                  buf.data ? buf.data : "",
                                  n < buf.len ? "..." : "") != CQ_OK)
                        goto out;
        }
        if (cq_buf_append(&call, ")", 1) != CQ_OK)
                goto out;
        rc =
            json_object_set_new(rec, "call", json_stringn(call.data, call.len));
out:
        cq_buf_release(&buf);
        cq_buf_release(&call);
        return rc;
}

/* Whether entry \p e of the report has exactly the members \p keys (a
 * NULL-terminated list; "case" is checked by the caller), all strings but
 * "case", "value" and "ok". */
static bool has_exactly(const json_t *e, const char *const *keys)
{
        size_t n = 1; /* "case" */

        for (; *keys; keys++, n++) {
                const json_t *v = json_object_get(e, *keys);

                if (!v)
                        return false;
                if (strcmp(*keys, "value") != 0 && strcmp(*keys, "ok") != 0 &&
                    !json_is_string(v))
                        return false;
        }
        return json_object_size(e) == n;
}

/* Fill \p rec from entry \p e of the report for case \p c of the job
 * (NULL for code tests, whose one entry is case 0). Returns 1 when the
 * case passed, 0 when it failed, -1 when out of memory. */
static int read_entry(json_t *rec, const json_t *e, const json_t *c, size_t n)
{
        static const char *const k_value[] = {"value", NULL};
        static const char *const k_plain[] = {"not_plain", "type", NULL};
        static const char *const k_error[] = {"error", NULL};
        static const char *const k_trace[] = {"error", "traceback", NULL};
        static const char *const k_ok[] = {"ok", NULL};
        char why[256], *msg = NULL;
        const json_t *v;
        cq_buf_t buf;
        int rc = -1, ok = 0;

        cq_buf_init(&buf, SHOWN_MAX + 64);
        why[0] = '\0';
        v = json_object_get(e, "case");
        if (!json_is_object(e) || !json_is_integer(v) ||
            json_integer_value(v) != (json_int_t)n) {
                snprintf(why, sizeof(why), "entry %zu is not case %zu", n, n);
        } else if (c && has_exactly(e, k_value)) {
                v = json_object_get(e, "value");
                if (valid_value(v, 0, why, sizeof(why))) {
                        repr(&buf, v, true);
                        if (set_shown(rec, "got", &buf) != 0)
                                goto out;
                        ok = same(v, json_object_get(c, "expected"));
                }
        } else if (c && has_exactly(e, k_plain)) {
                const json_t *np = json_object_get(e, "not_plain");
                const json_t *type = json_object_get(e, "type");
                size_t tn = utf8_cut(json_string_value(type),
                                     json_string_length(type), SHOWN_MAX);

                if (asprintf(&msg, "<%.*s>", (int)tn, json_string_value(type)) <
                        0 ||
                    json_object_set_new(rec, "got", json_string(msg)) != 0)
                        goto out;
                free(msg);
                msg = NULL;
                if (asprintf(&msg, not_plain_fmt,
                             (int)utf8_cut(json_string_value(np),
                                           json_string_length(np), ERROR_MAX),
                             json_string_value(np)) < 0 ||
                    json_object_set_new(rec, "error", json_string(msg)) != 0)
                        goto out;
        } else if (has_exactly(e, k_error) || has_exactly(e, k_trace)) {
                if (set_text(rec, "error", json_object_get(e, "error"),
                             ERROR_MAX) != 0)
                        goto out;
                v = json_object_get(e, "traceback");
                if (v && set_text(rec, "traceback", v, TRACEBACK_MAX) != 0)
                        goto out;
        } else if (!c && has_exactly(e, k_ok) &&
                   json_is_true(json_object_get(e, "ok"))) {
                ok = 1;
        } else {
                snprintf(why, sizeof(why),
                         "entry %zu has members no harness writes", n);
        }
        if (why[0]) {
                if (asprintf(&msg,
                             "the test harness's report of this case could "
                             "not be read (%s); the case fails",
                             why) < 0 ||
                    json_object_set_new(rec, "error", json_string(msg)) != 0)
                        goto out;
        }
        if (json_object_set_new(rec, "ok", json_boolean(ok)) != 0)
                goto out;
        rc = ok;
out:
        free(msg);
        cq_buf_release(&buf);
        return rc;
}

int cq_testrun_parse(const json_t *tests,
                     const char *marker,
                     const cq_cell_result_t *res,
                     cq_testrun_t *tr)
{
        const json_t *cases = json_object_get(tests, "cases");
        const char *fname =
            json_string_value(json_object_get(tests, "function"));
        json_t *report = NULL, *entries, *recs = NULL;
        char why[512] = "";
        size_t i;
        int rc = -1;

        cq_testrun_init(tr);
        tr->total = expected_total(tests);
        if (!json_is_array(cases) || !fname)
                cases = NULL; /* code tests: one entry, case 0 */
        if (res->status != CQ_CELL_OK) {
                cell_error(res, why, sizeof(why));
                goto failed;
        }
        report = find_report(res, marker, why, sizeof(why));
        if (!report && !why[0]) {
                if (res->truncated)
                        snprintf(why, sizeof(why),
                                 "the tests' report was lost: the test "
                                 "cell's output passed the output cap "
                                 "(CODERQ_OUTPUT_MAX; the report carries "
                                 "every case's result whole)");
                else
                        snprintf(why, sizeof(why),
                                 "the tests printed no report (did the code "
                                 "replace print or exit the interpreter?)");
        }
        if (!report)
                goto failed;
        entries = json_object_get(report, "cases");
        if (json_object_size(report) != 1 || !json_is_array(entries) ||
            json_array_size(entries) != (size_t)tr->total) {
                snprintf(why, sizeof(why),
                         "the tests' report could not be read: it must hold "
                         "one entry for each of the %d cases",
                         tr->total);
                goto failed;
        }
        recs = json_array();
        if (!recs)
                goto out;
        for (i = 0; i < (size_t)tr->total; i++) {
                const json_t *c = cases ? json_array_get(cases, i) : NULL;
                json_t *rec =
                    json_pack("{s:I}", "case", (json_int_t)(cases ? i + 1 : 0));
                int ok;

                if (!rec || json_array_append_new(recs, rec) != 0)
                        goto out;
                if (c && case_shown(rec, fname, c) != 0)
                        goto out;
                ok = read_entry(rec, json_array_get(entries, i), c,
                                cases ? i + 1 : 0);
                if (ok < 0)
                        goto out;
                tr->passed += ok;
        }
        tr->report = json_pack("{s:i, s:i, s:O}", "passed", tr->passed, "total",
                               tr->total, "cases", recs);
        rc = tr->report ? 0 : -1;
        goto out;
failed:
        rc = cq_testrun_fail(tests, why, tr);
out:
        json_decref(report);
        json_decref(recs);
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

/* --------------------------------------------------- the judge's calls */

char *cq_testrun_judge_code(const char *kind,
                            const json_t *request,
                            bool loaded,
                            char *marker,
                            size_t marker_size,
                            char *errstr,
                            size_t errstr_size)
{
        const char *name = json_string_value(json_object_get(request, "name"));
        char *json = NULL, *b64h = NULL, *b64a = NULL, *b64b = NULL;
        char *b64w = NULL, *code = NULL;
        const char *args[4];
        cq_buf_t buf;

        cq_buf_init(&buf, TESTRUN_CODE_MAX);
        if (make_marker(marker, marker_size) != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not make a report marker");
                return NULL;
        }
        if (!name || (strcmp(kind, "call") != 0 && strcmp(kind, "lookup"))) {
                cq_errstr_set(errstr, errstr_size,
                              "a judge request needs a kind and a name");
                return NULL;
        }
        json = json_dumps(request, JSON_COMPACT);
        if (loaded) {
                b64h = cq_b64_encode(harness_stub_py,
                                     sizeof(harness_stub_py) - 1, NULL);
        } else {
                b64h = cq_b64_encode(harness_load_py,
                                     sizeof(harness_load_py) - 1, NULL);
                b64w = cq_b64_encode(cq_testrun_harness_py,
                                     strlen(cq_testrun_harness_py), NULL);
        }
        b64a = json ? cq_b64_encode(json, strlen(json), NULL) : NULL;
        b64b = cq_b64_encode(name, strlen(name), NULL);
        if (!b64h || !b64a || !b64b || (!loaded && !b64w)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                goto out;
        }
        args[0] = kind;
        args[1] = b64a;
        args[2] = b64b;
        args[3] = marker;
        if (put_cell(&buf, b64h, args, b64w) != CQ_OK) {
                cq_errstr_set(errstr, errstr_size,
                              "could not build the call: too large");
                goto out;
        }
        code = cq_buf_take(&buf, NULL);
        if (!code)
                cq_errstr_set(errstr, errstr_size, "out of memory");
out:
        free(json);
        free(b64h);
        free(b64w);
        free(b64a);
        free(b64b);
        cq_buf_release(&buf);
        return code;
}

static json_t *judge_fail(const char *kind, const char *why)
{
        return json_pack("{s:s, s:s, s:s}", "op", "fail", "kind", kind, "why",
                         why);
}

int cq_testrun_judge_answer(const char *kind,
                            bool loaded,
                            const char *marker,
                            const cq_cell_result_t *res,
                            json_t **answerp)
{
        char why[512];
        json_t *report = NULL, *entry, *x;
        const json_t *cases;

        *answerp = NULL;
        switch (res->status) {
        case CQ_CELL_TIMEOUT:
                *answerp = judge_fail("timeout", "the call ran past its limit");
                return *answerp ? 0 : -1;
        case CQ_CELL_DIED:
        case CQ_CELL_CANCELLED:
                *answerp = judge_fail("died", "the interpreter of the code "
                                              "under test was lost during "
                                              "the call");
                return *answerp ? 0 : -1;
        default:
                break;
        }
        report = find_report(res, marker, why, sizeof(why));
        if (loaded && json_object_size(report) == 1 &&
            json_is_string(json_object_get(report, "harness"))) {
                json_decref(report);
                return 1; /* the stub found no harness */
        }
        cases = json_object_get(report, "cases");
        entry = json_array_size(cases) == 1 ? json_array_get(cases, 0) : NULL;
        if (!report || !entry || !json_is_object(entry)) {
                if (!why[0])
                        snprintf(why, sizeof(why),
                                 "the call left no report: the code under "
                                 "test ended it");
                *answerp = judge_fail("not_plain", why);
        } else if ((x = json_object_get(entry, "value")) != NULL) {
                *answerp =
                    strcmp(kind, "lookup") == 0
                        ? json_pack("{s:s, s:O}", "op", "value", "value", x)
                        : json_pack("{s:s, s:O, s:O?}", "op", "return", "value",
                                    x, "args", json_object_get(entry, "args"));
        } else if ((x = json_object_get(entry, "raise")) != NULL &&
                   json_is_string(json_object_get(x, "type")) &&
                   json_is_string(json_object_get(x, "message"))) {
                *answerp = json_pack("{s:s, s:O, s:O}", "op", "raise", "type",
                                     json_object_get(x, "type"), "message",
                                     json_object_get(x, "message"));
        } else if (json_is_string(json_object_get(entry, "not_plain"))) {
                snprintf(
                    why, sizeof(why), "the result is not plain data: %.200s",
                    json_string_value(json_object_get(entry, "not_plain")));
                *answerp = judge_fail("not_plain", why);
        } else if (json_is_true(json_object_get(entry, "function"))) {
                *answerp = json_pack("{s:s}", "op", "function");
        } else if (json_is_true(json_object_get(entry, "missing"))) {
                *answerp = json_pack("{s:s}", "op", "missing");
        } else {
                *answerp = judge_fail("not_plain", "the call's report is "
                                                   "not in the harness's "
                                                   "form");
        }
        json_decref(report);
        return *answerp ? 0 : -1;
}
