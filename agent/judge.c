/* SPDX-License-Identifier: MIT */
/* judge.c - the worker's side of the judging interpreter (judge.h): the
 * line protocol with agent/judge.py, the checks on every value that
 * crosses from the model's interpreter, and the record of each call.
 * Every wait has the run's deadline; every line and value is bounded. */
#include "coderq/agent/judge.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/common/util.h"
#include "judge_int.h"

#define CALL_SHOWN_MAX 300 /* bytes of a call as the report shows it */
#define OUTPUT_MAX     (64 * 1024)

/* ------------------------------------------------------------ values */

typedef struct vcheck {
        size_t items;
        char *why;
        size_t why_size;
} vcheck_t;

static bool vfail(vcheck_t *vc, const char *what)
{
        if (vc->why)
                snprintf(vc->why, vc->why_size, "%s", what);
        return false;
}

static bool all_digits(const char *s, size_t len)
{
        size_t i = (len > 0 && s[0] == '-') ? 1 : 0;

        if (i == len || len - i > CQ_JUDGE_DIGITS_MAX)
                return false;
        for (; i < len; i++)
                if (s[i] < '0' || s[i] > '9')
                        return false;
        return true;
}

static bool is_b64(const char *s, size_t len)
{
        size_t i;

        if (len % 4 != 0)
                return false;
        for (i = 0; i < len; i++) {
                char c = s[i];

                if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                    (c >= '0' && c <= '9') || c == '+' || c == '/')
                        continue;
                /* padding only at the end, at most two */
                if (c == '=' && i >= len - 2 &&
                    (i == len - 1 || s[len - 1] == '='))
                        continue;
                return false;
        }
        return true;
}

static bool tagged_string(vcheck_t *vc, const json_t *v)
{
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);

        if (len == 0)
                return vfail(vc, "an untagged string");
        switch (s[0]) {
        case 's':
                return true;
        case 'i':
                return all_digits(s + 1, len - 1)
                           ? true
                           : vfail(vc, "an int tag without digits");
        case 'f':
                if (strcmp(s, "finf") == 0 || strcmp(s, "f-inf") == 0 ||
                    strcmp(s, "fnan") == 0)
                        return true;
                return vfail(vc, "a float tag other than inf, -inf or nan");
        case 'b':
                return is_b64(s + 1, len - 1)
                           ? true
                           : vfail(vc, "a bytes tag without base64");
        default:
                return vfail(vc, "a string of an unknown tag");
        }
}

static bool check_value(vcheck_t *vc, const json_t *v, int depth);

static bool check_items(vcheck_t *vc, const json_t *arr, int depth)
{
        size_t i;
        const json_t *x;

        json_array_foreach(arr, i, x)
        {
                if (!check_value(vc, x, depth + 1))
                        return false;
        }
        return true;
}

static bool check_tagged_object(vcheck_t *vc, const json_t *v, int depth)
{
        const json_t *t = json_object_get(v, "t");
        const json_t *items = json_object_get(v, "v");
        const char *tag = json_string_value(t);
        size_t i;
        const json_t *x;

        if (json_object_size(v) != 2 || !tag || !json_is_array(items))
                return vfail(vc, "an object that is no tagged value");
        if (strcmp(tag, "tuple") == 0 || strcmp(tag, "set") == 0 ||
            strcmp(tag, "frozenset") == 0)
                return check_items(vc, items, depth);
        if (strcmp(tag, "complex") == 0) {
                if (json_array_size(items) != 2)
                        return vfail(vc, "a complex without two parts");
                json_array_foreach(items, i, x)
                {
                        if (!(json_is_real(x) || json_is_integer(x) ||
                              (json_is_string(x) &&
                               json_string_value(x)[0] == 'f' &&
                               tagged_string(vc, x))))
                                return vfail(vc, "a complex part that is "
                                                 "not a float");
                }
                vc->items += 2;
                return true;
        }
        if (strcmp(tag, "dict") == 0) {
                json_array_foreach(items, i, x)
                {
                        if (!json_is_array(x) || json_array_size(x) != 2)
                                return vfail(vc, "a dict entry that is no "
                                                 "key and value");
                        if (!check_items(vc, x, depth))
                                return false;
                }
                return true;
        }
        return vfail(vc, "an object of an unknown tag");
}

static bool check_value(vcheck_t *vc, const json_t *v, int depth)
{
        if (depth >= CQ_JUDGE_DEPTH_MAX)
                return vfail(vc, "values nested too deep");
        if (++vc->items > CQ_JUDGE_ITEMS_MAX)
                return vfail(vc, "too many values");
        switch (json_typeof(v)) {
        case JSON_NULL:
        case JSON_TRUE:
        case JSON_FALSE:
        case JSON_INTEGER:
                return true;
        case JSON_REAL:
                return true; /* jansson reads only finite reals */
        case JSON_STRING:
                return tagged_string(vc, v);
        case JSON_ARRAY:
                return check_items(vc, v, depth);
        case JSON_OBJECT:
                return check_tagged_object(vc, v, depth);
        }
        return vfail(vc, "a value of no JSON type");
}

bool cq_judge_value_check(const json_t *v, char *why, size_t why_size)
{
        vcheck_t vc = {0, why, why_size};

        if (!v)
                return vfail(&vc, "no value");
        return check_value(&vc, v, 0);
}

/* ------------------------------------------------------------- repr */

static cq_err_t repr_value(cq_buf_t *buf, const json_t *v, int depth);

static cq_err_t repr_seq(cq_buf_t *buf,
                         const json_t *items,
                         const char *open,
                         const char *close,
                         bool one_tuple,
                         int depth)
{
        size_t i;
        const json_t *x;
        cq_err_t err = cq_buf_append_str(buf, open);

        json_array_foreach(items, i, x)
        {
                if (err == CQ_OK && i > 0)
                        err = cq_buf_append_str(buf, ", ");
                if (err == CQ_OK)
                        err = repr_value(buf, x, depth + 1);
        }
        if (err == CQ_OK && one_tuple && json_array_size(items) == 1)
                err = cq_buf_append_str(buf, ",");
        return err == CQ_OK ? cq_buf_append_str(buf, close) : err;
}

static cq_err_t repr_str(cq_buf_t *buf, const char *s, size_t len)
{
        cq_err_t err = cq_buf_append_str(buf, "'");
        size_t i;

        for (i = 0; i < len && err == CQ_OK; i++) {
                unsigned char c = (unsigned char)s[i];

                if (c == '\'' || c == '\\')
                        err = cq_buf_printf(buf, "\\%c", c);
                else if (c == '\n')
                        err = cq_buf_append_str(buf, "\\n");
                else if (c < 0x20 || c == 0x7f)
                        err = cq_buf_printf(buf, "\\x%02x", c);
                else
                        err = cq_buf_append(buf, s + i, 1);
        }
        return err == CQ_OK ? cq_buf_append_str(buf, "'") : err;
}

static cq_err_t repr_value(cq_buf_t *buf, const json_t *v, int depth)
{
        const char *s, *tag;

        if (depth > 20)
                return cq_buf_append_str(buf, "...");
        switch (json_typeof(v)) {
        case JSON_NULL:
                return cq_buf_append_str(buf, "None");
        case JSON_TRUE:
                return cq_buf_append_str(buf, "True");
        case JSON_FALSE:
                return cq_buf_append_str(buf, "False");
        case JSON_INTEGER:
                return cq_buf_printf(buf, "%" JSON_INTEGER_FORMAT,
                                     json_integer_value(v));
        case JSON_REAL:
                return cq_buf_printf(buf, "%.17g", json_real_value(v));
        case JSON_STRING:
                s = json_string_value(v);
                if (s[0] == 's')
                        return repr_str(buf, s + 1, json_string_length(v) - 1);
                if (s[0] == 'b') {
                        cq_err_t err = cq_buf_append_str(buf, "b64:");

                        return err == CQ_OK ? cq_buf_append_str(buf, s + 1)
                                            : err;
                }
                return cq_buf_append_str(buf, s + 1); /* i.., f.. */
        case JSON_ARRAY:
                return repr_seq(buf, v, "[", "]", false, depth);
        case JSON_OBJECT:
                tag = json_string_value(json_object_get(v, "t"));
                v = json_object_get(v, "v");
                if (!tag || !v)
                        return cq_buf_append_str(buf, "?");
                if (strcmp(tag, "tuple") == 0)
                        return repr_seq(buf, v, "(", ")", true, depth);
                if (strcmp(tag, "set") == 0)
                        return json_array_size(v)
                                   ? repr_seq(buf, v, "{", "}", false, depth)
                                   : cq_buf_append_str(buf, "set()");
                if (strcmp(tag, "frozenset") == 0)
                        return repr_seq(buf, v, "frozenset({", "})", false,
                                        depth);
                if (strcmp(tag, "complex") == 0)
                        return repr_seq(buf, v, "complex(", ")", false, depth);
                if (strcmp(tag, "dict") == 0) {
                        size_t i;
                        const json_t *kv;
                        cq_err_t err = cq_buf_append_str(buf, "{");

                        json_array_foreach(v, i, kv)
                        {
                                if (err == CQ_OK && i > 0)
                                        err = cq_buf_append_str(buf, ", ");
                                if (err == CQ_OK)
                                        err = repr_value(buf,
                                                         json_array_get(kv, 0),
                                                         depth + 1);
                                if (err == CQ_OK)
                                        err = cq_buf_append_str(buf, ": ");
                                if (err == CQ_OK)
                                        err = repr_value(buf,
                                                         json_array_get(kv, 1),
                                                         depth + 1);
                        }
                        return err == CQ_OK ? cq_buf_append_str(buf, "}") : err;
                }
                return cq_buf_append_str(buf, "?");
        }
        return cq_buf_append_str(buf, "?");
}

char *cq_judge_value_repr(const json_t *v, size_t max)
{
        cq_buf_t buf;
        cq_err_t err;

        if (max < 8)
                max = 8;
        cq_buf_init(&buf, (size_t)4 << 20);
        err = cq_judge_value_check(v, NULL, 0) ? repr_value(&buf, v, 0)
                                               : cq_buf_append_str(&buf, "?");
        if (err == CQ_ERR_TOO_LARGE)
                err = CQ_OK; /* cut below */
        if (err != CQ_OK) {
                cq_buf_release(&buf);
                return NULL;
        }
        if (!buf.data && cq_buf_append_str(&buf, "") != CQ_OK)
                return NULL;
        if (buf.len > max) {
                size_t cut = max - 3;

                /* not inside a UTF-8 sequence */
                while (cut > 0 && ((unsigned char)buf.data[cut] & 0xc0) == 0x80)
                        cut--;
                memcpy(buf.data + cut, "...", 4);
                buf.len = cut + 3;
        }
        return cq_buf_take(&buf, NULL);
}

/* ---------------------------------------------------------- protocol */

void cq_judge_result_init(cq_judge_result_t *jr) { memset(jr, 0, sizeof(*jr)); }

void cq_judge_result_release(cq_judge_result_t *jr)
{
        free(jr->output);
        json_decref(jr->error);
        json_decref(jr->calls_report);
        free(jr->fault);
        cq_judge_result_init(jr);
}

/* Write the whole line (and a newline) by \p deadline. 0, or -1 (set in
 * *whyp, static text). */
static int
send_line(int fd, const char *line, int64_t deadline, const char **whyp)
{
        size_t len = strlen(line), off = 0;

        while (off <= len) {
                const char *p = off < len ? line + off : "\n";
                size_t n = off < len ? len - off : 1;
                struct pollfd pfd = {fd, POLLOUT, 0};
                int64_t left = deadline - cq_now_ms();
                ssize_t w;

                if (left <= 0) {
                        /* the judge let its pipe fill while there was
                         * time: ours (a deadline used up by the code under
                         * test is caught before, in do_call()) */
                        *whyp = "the judge stopped reading";
                        return -1;
                }
                if (poll(&pfd, 1, (int)(left > 1000 ? 1000 : left)) < 0 &&
                    errno != EINTR) {
                        *whyp = "could not wait for the judge";
                        return -1;
                }
                if (!(pfd.revents & (POLLOUT | POLLERR | POLLHUP)))
                        continue;
                w = write(fd, p, n);
                if (w < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (w <= 0) {
                        *whyp = "the judge went away";
                        return -1;
                }
                off += (size_t)w;
                if (off > len)
                        break;
        }
        return 0;
}

static int send_json(int fd, json_t *msg, int64_t deadline, const char **whyp)
{
        char *text = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII);
        int rc;

        json_decref(msg);
        if (!text) {
                *whyp = "out of memory";
                return -1;
        }
        rc = send_line(fd, text, deadline, whyp);
        free(text);
        return rc;
}

/* The next line from \p rd (buffered), as JSON, by \p deadline. */
static json_t *
recv_json(judge_reader_t *rd, int64_t deadline, const char **whyp)
{
        for (;;) {
                char *nl = rd->buf.data
                               ? memchr(rd->buf.data, '\n', rd->buf.len)
                               : NULL;
                char chunk[65536];
                struct pollfd pfd = {rd->fd, POLLIN, 0};
                int64_t left;
                ssize_t n;

                if (nl) {
                        size_t len = (size_t)(nl - rd->buf.data);
                        json_t *msg = json_loadb(rd->buf.data, len,
                                                 JSON_REJECT_DUPLICATES, NULL);

                        memmove(rd->buf.data, nl + 1, rd->buf.len - len - 1);
                        rd->buf.len -= len + 1;
                        rd->buf.data[rd->buf.len] = '\0';
                        if (!msg || !json_is_object(msg)) {
                                json_decref(msg);
                                *whyp = "the judge wrote a line that is not "
                                        "a JSON object";
                                return NULL;
                        }
                        return msg;
                }
                left = deadline - cq_now_ms();
                if (left <= 0) {
                        *whyp = NULL; /* the deadline: the caller says */
                        return NULL;
                }
                if (poll(&pfd, 1, (int)(left > 1000 ? 1000 : left)) < 0 &&
                    errno != EINTR) {
                        *whyp = "could not wait for the judge";
                        return NULL;
                }
                if (!(pfd.revents & (POLLIN | POLLERR | POLLHUP)))
                        continue;
                n = read(rd->fd, chunk, sizeof(chunk));
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (n <= 0) {
                        *whyp = "the judge exited before it answered";
                        return NULL;
                }
                if (cq_buf_append(&rd->buf, chunk, (size_t)n) != CQ_OK) {
                        *whyp = "the judge wrote a line over the limit";
                        return NULL;
                }
        }
}

/* A run stopped by \p why; NULL: the run's deadline passed (the code
 * under test, or the tests, took the time), which is the tests' time and
 * never a fault of ours. */
static int stop_run(cq_judge_result_t *jr, const char *why)
{
        if (!why) {
                jr->timed_out = true;
                why = "the tests ran past their time";
        }
        if (!jr->fault)
                jr->fault = strdup(why);
        return jr->fault ? 0 : -1;
}

/* "f(1, 'a', k=2)" for the report, cut to CALL_SHOWN_MAX. */
static char *call_text(const json_t *req)
{
        const char *name = json_string_value(json_object_get(req, "name"));
        json_t *args = json_object_get(req, "args");
        json_t *kwargs = json_object_get(req, "kwargs");
        cq_buf_t buf;
        size_t i;
        const json_t *x;
        cq_err_t err;
        char *out;

        cq_buf_init(&buf, (size_t)1 << 20);
        err = cq_buf_printf(&buf, "%.128s(", name ? name : "?");
        json_array_foreach(args, i, x)
        {
                char *r = cq_judge_value_repr(x, CALL_SHOWN_MAX);

                if (err == CQ_OK && i > 0)
                        err = cq_buf_append_str(&buf, ", ");
                if (err == CQ_OK)
                        err = cq_buf_append_str(&buf, r ? r : "?");
                free(r);
        }
        json_array_foreach(kwargs, i, x)
        {
                char *r =
                    cq_judge_value_repr(json_array_get(x, 1), CALL_SHOWN_MAX);

                if (err == CQ_OK && (i > 0 || json_array_size(args) > 0))
                        err = cq_buf_append_str(&buf, ", ");
                if (err == CQ_OK)
                        err = cq_buf_printf(
                            &buf, "%.64s=%s",
                            json_is_string(json_array_get(x, 0))
                                ? json_string_value(json_array_get(x, 0))
                                : "?",
                            r ? r : "?");
                free(r);
        }
        if (err == CQ_OK)
                err = cq_buf_append_str(&buf, ")");
        if (err != CQ_OK && err != CQ_ERR_TOO_LARGE) {
                cq_buf_release(&buf);
                return NULL;
        }
        out = cq_buf_take(&buf, NULL);
        if (out && strlen(out) > CALL_SHOWN_MAX)
                memcpy(out + CALL_SHOWN_MAX - 3, "...", 4);
        return out;
}

/* Whether \p req is a call request the judge may make: a name, plain
 * arguments, keyword names that are strings. */
static bool call_ok(const json_t *req)
{
        const json_t *kwargs = json_object_get(req, "kwargs"), *kv;
        size_t i;

        if (!json_is_string(json_object_get(req, "name")) ||
            !json_is_array(json_object_get(req, "args")) ||
            !json_is_array(kwargs) ||
            !cq_judge_value_check(json_object_get(req, "args"), NULL, 0))
                return false;
        json_array_foreach(kwargs, i, kv)
        {
                if (!json_is_array(kv) || json_array_size(kv) != 2 ||
                    !json_is_string(json_array_get(kv, 0)) ||
                    !cq_judge_value_check(json_array_get(kv, 1), NULL, 0))
                        return false;
        }
        return true;
}

/* The answer of the model's side, checked: a value that is not plain (or
 * not in the tagged form) becomes a not_plain failure of the call. */
static json_t *checked_answer(json_t *answer)
{
        const char *op = json_string_value(json_object_get(answer, "op"));
        const json_t *args;
        char why[128];

        if (op && strcmp(op, "return") == 0) {
                args = json_object_get(answer, "args");
                if (cq_judge_value_check(json_object_get(answer, "value"), why,
                                         sizeof(why)) &&
                    (!args || json_is_null(args) ||
                     cq_judge_value_check(args, why, sizeof(why))))
                        return answer;
        } else if (op && (strcmp(op, "raise") == 0) &&
                   json_is_string(json_object_get(answer, "type")) &&
                   json_is_string(json_object_get(answer, "message"))) {
                return answer;
        } else if (op && strcmp(op, "fail") == 0 &&
                   json_is_string(json_object_get(answer, "kind")) &&
                   json_is_string(json_object_get(answer, "why"))) {
                return answer;
        } else if (op && (strcmp(op, "function") == 0 ||
                          strcmp(op, "missing") == 0)) {
                return answer;
        } else if (op && strcmp(op, "value") == 0 &&
                   cq_judge_value_check(json_object_get(answer, "value"), why,
                                        sizeof(why))) {
                return answer;
        } else {
                snprintf(why, sizeof(why), "an answer of no known form");
        }
        json_decref(answer);
        return json_pack("{s:s, s:s, s:s+}", "op", "fail", "kind", "not_plain",
                         "why", "the result is not plain data: ", why);
}

static int64_t limit_of(const cq_judge_limits_t *limits, size_t call)
{
        if (limits->call_ms_of && call < limits->ncall_ms)
                return limits->call_ms_of[call];
        return limits->call_ms;
}

/* One call of the judge's: made, recorded, answered. */
static int do_call(cq_judge_proc_t *proc,
                   const cq_judge_candidate_t *cand,
                   const cq_judge_limits_t *limits,
                   bool mutates,
                   json_t *req,
                   cq_judge_result_t *jr,
                   const char **whyp)
{
        int64_t limit = limit_of(limits, (size_t)jr->calls), elapsed = 0;
        int64_t left = limits->deadline_ms - cq_now_ms();
        json_t *answer = NULL, *entry;
        const char *op, *outcome;
        char *shown;

        if (!call_ok(req)) {
                *whyp = "the judge made a call of no known form";
                return 1;
        }
        /* the arguments come back only when the test says they change */
        if (json_object_set_new(req, "mutates", json_boolean(mutates)) ||
            json_object_del(req, "op"))
                return -1;
        if (limit > left)
                limit = left > 0 ? left : 1;
        if (cand->call(cand->opaque, req, limit, &answer, &elapsed) != 0) {
                json_decref(answer);
                *whyp = "the code under test could not be called";
                return 1;
        }
        if (cq_now_ms() >= limits->deadline_ms) {
                /* the call took what was left of the run's time: the
                 * tests' time, a timeout, and no answer is sent */
                json_decref(answer);
                *whyp = NULL;
                return 1;
        }
        answer = checked_answer(answer);
        if (!answer)
                return -1;
        op = json_string_value(json_object_get(answer, "op"));
        outcome = strcmp(op, "fail") == 0
                      ? json_string_value(json_object_get(answer, "kind"))
                      : op;
        shown = call_text(req);
        entry = json_pack("{s:s?, s:I, s:I, s:s}", "call", shown, "limit_ms",
                          (json_int_t)limit, "time_ms", (json_int_t)elapsed,
                          "outcome", outcome);
        free(shown);
        jr->calls++;
        if (!entry || json_array_append_new(jr->calls_report, entry)) {
                json_decref(answer);
                return -1;
        }
        return send_json(proc->to_fd, answer, limits->deadline_ms, whyp) ? 1
                                                                         : 0;
}

static int do_lookup(cq_judge_proc_t *proc,
                     const cq_judge_candidate_t *cand,
                     const cq_judge_limits_t *limits,
                     const json_t *req,
                     const char **whyp)
{
        const char *name = json_string_value(json_object_get(req, "name"));
        json_t *answer = NULL;

        if (!name) {
                *whyp = "the judge looked up no name";
                return 1;
        }
        if (cand->lookup(cand->opaque, name, &answer) != 0) {
                json_decref(answer);
                *whyp = "the model's interpreter could not be asked";
                return 1;
        }
        answer = checked_answer(answer);
        if (!answer)
                return -1;
        return send_json(proc->to_fd, answer, limits->deadline_ms, whyp) ? 1
                                                                         : 0;
}

/* The judge's last word. 0, 1 (not in the protocol's form), -1 (memory). */
static int take_done(const json_t *msg, cq_judge_result_t *jr)
{
        const json_t *ok = json_object_get(msg, "ok");
        const json_t *error = json_object_get(msg, "error");
        const char *output = json_string_value(json_object_get(msg, "output"));

        if (!json_is_boolean(ok) ||
            (!json_is_true(ok) &&
             (!json_is_object(error) ||
              !json_is_string(json_object_get(error, "type")) ||
              !json_is_string(json_object_get(error, "origin")))))
                return 1;
        jr->ok = json_is_true(ok);
        if (!jr->ok)
                jr->error = json_deep_copy(error);
        if (output && *output) {
                size_t len = strlen(output);

                jr->output =
                    strndup(output, len > OUTPUT_MAX ? OUTPUT_MAX : len);
                if (!jr->output)
                        return -1;
        }
        return !jr->ok && !jr->error ? -1 : 0;
}

int cq_judge_run(cq_judge_proc_t *proc,
                 const char *code,
                 bool mutates,
                 const cq_judge_candidate_t *cand,
                 const cq_judge_limits_t *limits,
                 cq_judge_result_t *jr)
{
        judge_reader_t rd;
        const char *why = NULL;
        json_t *msg;
        int rc = 0;

        cq_judge_result_init(jr);
        jr->calls_report = json_array();
        if (!jr->calls_report)
                return -1;
        rd.fd = proc->from_fd;
        cq_buf_init(&rd.buf,
                    limits->line_max ? limits->line_max : (size_t)16 << 20);
        msg = json_pack("{s:s, s:s, s:b}", "op", "run", "code", code, "mutates",
                        mutates);
        if (!msg || send_json(proc->to_fd, msg, limits->deadline_ms, &why)) {
                rc = !msg ? -1 : stop_run(jr, why);
                goto out;
        }
        for (;;) {
                const char *op;
                int r;

                msg = recv_json(&rd, limits->deadline_ms, &why);
                if (!msg) {
                        rc = stop_run(jr, why);
                        break;
                }
                op = json_string_value(json_object_get(msg, "op"));
                if (op && strcmp(op, "call") == 0)
                        r = do_call(proc, cand, limits, mutates, msg, jr, &why);
                else if (op && strcmp(op, "lookup") == 0)
                        r = do_lookup(proc, cand, limits, msg, &why);
                else if (op && strcmp(op, "done") == 0) {
                        r = take_done(msg, jr);
                        why = "the judge's report is not in its form";
                        json_decref(msg);
                        if (r > 0)
                                rc = stop_run(jr, why);
                        else
                                rc = r;
                        /* it said all, and nothing after its last word */
                        jr->reusable = r == 0 && rd.buf.len == 0;
                        break;
                } else {
                        why = "the judge wrote a message of no known kind";
                        r = 1;
                }
                json_decref(msg);
                if (r != 0) {
                        rc = r < 0 ? -1 : stop_run(jr, why);
                        break;
                }
        }
out:
        cq_buf_release(&rd.buf);
        /* A run past its deadline is the tests' time, not our fault:
         * the verdict is a timeout. */
        if (jr->timed_out) {
                free(jr->fault);
                jr->fault = NULL;
        }
        return rc;
}

void cq_judge_key(const char *code, bool mutates, char key[CQ_JUDGE_KEY_SIZE])
{
        key[0] = '\0'; /* no code, or no digest: none kept, none taken */
        if (!code)
                return;
        cq_sha256_hex(code, strlen(code), key);
        if (key[0]) {
                key[64] = mutates ? 'm' : '-';
                key[65] = '\0';
        }
}

const char *cq_judge_program(void) { return cq_judge_py; }
