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

/* The harness, one Python program for both kinds. It runs by exec() in a
 * namespace of its own whose builtins are the real ones, so a variable the
 * model named len, type or print cannot change it, and it leaves no name
 * behind. It reads _ARGS: the user namespace, the kind, the cases (base64
 * JSON) or the test code (base64), the function name (base64) and the
 * marker.
 *
 * A result is compared only after _plain() turned it into plain data,
 * without calling any method of an object the model's code made: exact
 * types are checked with `type(v) is int` (a subclass of int, str, list or
 * dict may override __eq__, __iter__ or __float__), exact lists, tuples
 * and dicts are walked with the built-in methods, numpy arrays of
 * bool/int/uint/float/str dtype and numpy's own scalar types are turned
 * into Python values with tolist()/item() and checked again. Anything else
 * fails the case with a message naming its type. Depth and size are
 * bounded. While the model's function (or the test code) runs, stdout and
 * stderr go to a sink, so a flood of output cannot bury the report, which
 * is written to the stream the cell started with. Catches Exception and
 * SystemExit, not KeyboardInterrupt, so that an interrupt from a timeout
 * still stops it. */
static const char harness_plain[] =
    "import base64, json, math, sys, traceback\n"
    "_ns, _kind, _data, _fname, _marker = _ARGS\n"
    "_out = sys.stdout\n"
    "_MAX_DEPTH = 100\n"
    "_MAX_ITEMS = 1000000\n"
    "_qualname = type.__dict__['__qualname__'].__get__\n"
    "_mro = type.__dict__['__mro__'].__get__\n"
    "_BASES = (bool, int, float, str, list, tuple, dict)\n"
    "_np_array = None\n"
    "_np_scalars = ()\n"
    "_np = sys.modules.get('numpy')\n"
    "if _np is not None:\n"
    "    try:\n"
    "        _np_array = _np.ndarray\n"
    "        _np_scalars = tuple([_np.dtype(c).type for c in "
    "'?bhilqpBHILQPefd'] +\n"
    "                            [_np.str_])\n"
    "    except Exception:\n"
    "        _np_array = None\n"
    "        _np_scalars = ()\n"
    "class _NotPlain(Exception):\n"
    "    pass\n"
    "class _Sink:\n"
    "    def write(self, s):\n"
    "        pass\n"
    "    def flush(self):\n"
    "        pass\n"
    "    def isatty(self):\n"
    "        return False\n"
    "_SINK = _Sink()\n"
    "def _is(t, types):\n"
    "    for x in types:\n"
    "        if x is t:\n"
    "            return True\n"
    "    return False\n"
    "def _describe(t):\n"
    "    try:\n"
    "        name = _qualname(t)\n"
    "        mro = _mro(t)\n"
    "    except Exception:\n"
    "        return 'an object of unknown type'\n"
    "    for b in _BASES:\n"
    "        if b is not t and _is(b, mro):\n"
    "            return '%s (a subclass of %s)' % (name, b.__name__)\n"
    "    return name\n"
    "def _plain(v, budget, depth):\n"
    "    t = type(v)\n"
    "    budget[0] += 1\n"
    "    if budget[0] > _MAX_ITEMS:\n"
    "        raise _NotPlain('more than %d values' % _MAX_ITEMS)\n"
    "    if v is None or t is bool or t is int or t is float or t is str:\n"
    "        return v\n"
    "    if depth >= _MAX_DEPTH:\n"
    "        raise _NotPlain('values nested deeper than %d levels' % "
    "_MAX_DEPTH)\n"
    "    if t is list or t is tuple:\n"
    "        return [_plain(x, budget, depth + 1) for x in v]\n"
    "    if t is dict:\n"
    "        d = {}\n"
    "        for k, x in dict.items(v):\n"
    "            if type(k) is not str:\n"
    "                raise _NotPlain('a dict key of type %s (keys must be "
    "str)' %\n"
    "                                _describe(type(k)))\n"
    "            d[k] = _plain(x, budget, depth + 1)\n"
    "        return d\n"
    "    if _np_array is not None:\n"
    "        if t is _np_array:\n"
    "            if v.dtype.kind not in 'biufU':\n"
    "                raise _NotPlain('a numpy array of dtype %s' % "
    "v.dtype.str)\n"
    "            if v.size > _MAX_ITEMS:\n"
    "                raise _NotPlain('more than %d values' % _MAX_ITEMS)\n"
    "            return _plain(v.tolist(), budget, depth)\n"
    "        if _is(t, _np_scalars):\n"
    "            return _plain(v.item(), budget, depth)\n"
    "    raise _NotPlain('a value of type %s' % _describe(t))\n";

/* The comparison and the runners (split: C99 caps string literals). */
static const char harness_run[] =
    "def _eq(a, b):\n"
    "    ta, tb = type(a), type(b)\n"
    "    if ta is bool or tb is bool:\n"
    "        return ta is tb and a == b\n"
    "    if (ta is int or ta is float) and (tb is int or tb is float):\n"
    "        if a != a and b != b:\n"
    "            return True\n"
    "        try:\n"
    "            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)\n"
    "        except OverflowError:\n"
    "            return a == b\n"
    "    if ta is list and tb is list:\n"
    "        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))\n"
    "    if ta is dict and tb is dict:\n"
    "        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)\n"
    "    return ta is tb and a == b\n"
    "def _short(v):\n"
    "    r = repr(v)\n"
    "    return r if len(r) <= 300 else r[:300] + '...'\n"
    "def _call(f, *a):\n"
    "    so, se = sys.stdout, sys.stderr\n"
    "    sys.stdout = sys.stderr = _SINK\n"
    "    try:\n"
    "        return f(*a)\n"
    "    finally:\n"
    "        sys.stdout, sys.stderr = so, se\n"
    "def _failure(rec, e):\n"
    "    try:\n"
    "        msg = str(e)\n"
    "    except Exception:\n"
    "        msg = '<the exception could not be shown>'\n"
    "    rec['error'] = '%s: %s' % (_describe(type(e)), msg[:1000])\n"
    "    try:\n"
    "        rec['traceback'] = traceback.format_exc(limit=5)[-2000:]\n"
    "    except Exception:\n"
    "        pass\n"
    "_NOT_PLAIN = ('the result is not plain data: it holds %s. Tests compare "
    "'\n"
    "              'only None, bool, int, float, str, list, tuple and dict "
    "with '\n"
    "              'str keys (exact types, not subclasses) and numpy numbers, "
    "'\n"
    "              'strings and arrays of them; return such values')\n"
    "def _cases(cases, fname):\n"
    "    out = []\n"
    "    fn = _ns.get(fname) if type(_ns) is dict else None\n"
    "    for i, c in enumerate(cases):\n"
    "        args = c.get('args', [])\n"
    "        rec = {'case': i + 1, 'args': _short(args),\n"
    "               'call': '%s(%s)' % (fname, ', '.join(_short(a) for a in "
    "args)),\n"
    "               'expected': _short(c.get('expected')), 'ok': False}\n"
    "        if not callable(fn):\n"
    "            rec['error'] = 'NameError: function %r is not defined' % "
    "fname\n"
    "            out.append(rec)\n"
    "            continue\n"
    "        try:\n"
    "            got = _call(fn, *args)\n"
    "        except (Exception, SystemExit) as e:\n"
    "            _failure(rec, e)\n"
    "            out.append(rec)\n"
    "            continue\n"
    "        try:\n"
    "            value = _plain(got, [0], 0)\n"
    "        except _NotPlain as e:\n"
    "            rec['got'] = '<%s>' % _describe(type(got))\n"
    "            rec['error'] = _NOT_PLAIN % e.args[0]\n"
    "        else:\n"
    "            rec['got'] = _short(value)\n"
    "            rec['ok'] = _eq(value, _plain(c.get('expected'), [0], 0))\n"
    "        out.append(rec)\n"
    "    return out\n"
    "def _code(src):\n"
    "    rec = {'case': 0, 'ok': False}\n"
    "    try:\n"
    "        _call(exec, compile(src, '<tests>', 'exec'), _ns)\n"
    "        rec['ok'] = True\n"
    "    except (Exception, SystemExit) as e:\n"
    "        _failure(rec, e)\n"
    "    return [rec]\n"
    "if _kind == 'cases':\n"
    "    _report = _cases(json.loads(base64.b64decode(_data)),\n"
    "                     base64.b64decode(_fname).decode())\n"
    "else:\n"
    "    _report = _code(base64.b64decode(_data).decode())\n"
    "_out.write('\\n' + _marker + json.dumps({'cases': _report}) + '\\n')\n"
    "_out.flush()\n";

static const char harness_call[] =
    "exec(__import__('base64').b64decode('%s').decode(), "
    "{'__builtins__': __import__('builtins'), "
    "'_ARGS': (globals(), '%s', '%s', '%s', '%s')})\n";

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
        char *json = NULL, *b64h = NULL, *b64a = NULL, *b64b = NULL;
        char *code = NULL;
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
        } else if (kind && strcmp(kind, "code") == 0) {
                const json_t *src = json_object_get(tests, "code");

                if (!json_is_string(src)) {
                        snprintf(errstr, errstr_size,
                                 "tests of kind \"code\" need \"code\"");
                        goto out;
                }
                b64a = cq_b64_encode(json_string_value(src),
                                     json_string_length(src), NULL);
                b64b = cq_b64_encode("", 0, NULL);
        } else {
                snprintf(errstr, errstr_size,
                         "tests \"kind\" must be \"cases\" or \"code\"");
                goto out;
        }
        if (cq_buf_append_str(&buf, harness_plain) != CQ_OK ||
            cq_buf_append_str(&buf, harness_run) != CQ_OK)
                goto oom;
        b64h = cq_b64_encode(buf.data, buf.len, NULL);
        cq_buf_reset(&buf);
        if (!b64h || !b64a || !b64b)
                goto oom;
        err = cq_buf_printf(&buf, harness_call, b64h, kind, b64a, b64b, marker);
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
        free(b64h);
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
                if (res->status == CQ_CELL_OK && res->truncated)
                        snprintf(why, sizeof(why),
                                 "the tests' report was lost: the test "
                                 "cell's output passed the output cap");
                else if (res->status == CQ_CELL_OK)
                        snprintf(why, sizeof(why),
                                 "the tests printed no report (did the code "
                                 "replace print or exit the interpreter?)");
                rc = cq_testrun_fail(tests, why, tr);
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
