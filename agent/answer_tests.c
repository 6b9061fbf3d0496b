/* SPDX-License-Identifier: MIT */
/* answer_tests.c - the job's tests, run on a final answer: in the job's
 * kernel or, for tests.isolation "fresh", in a new interpreter after the
 * solution's cells; their report and notebook line, and the feedback the
 * model gets when they fail. The test code and its report are testrun.c's. */
#include "coderq/agent/agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/agent/testrun.h"
#include "coderq/agent/tooltext.h"
#include "agent_int.h"

/* The deadline of one test run: the test timeout, within the job's. */
static int64_t test_timeout_ms(const run_t *run)
{
        int64_t ms = run->test_timeout_s * 1000, left = agent_remaining_ms(run);

        if (left < ms)
                ms = left > 1000 ? left : 1000;
        return ms;
}

/* Why a test cell that did not run to its end failed: the limit it hit,
 * and whether the job's kernel lost its state. */
static void explain_cell_end(const run_t *run,
                             const cq_cell_result_t *res,
                             bool fresh,
                             char *why,
                             size_t size)
{
        const char *where =
            fresh ? "in a fresh interpreter" : "in the job's kernel";
        const char *lost =
            !fresh && res->state_lost
                ? "; the kernel was replaced, so its variables are gone: "
                  "run your code again before answering"
                : "";

        switch (res->status) {
        case CQ_CELL_TIMEOUT:
                snprintf(why, size,
                         "the tests did not finish within %ld s "
                         "(limits.test_timeout_s) %s%s",
                         run->test_timeout_s, where, lost);
                break;
        case CQ_CELL_DIED:
                snprintf(why, size, "the kernel died while the tests ran %s%s",
                         where, lost);
                break;
        case CQ_CELL_CANCELLED:
                snprintf(why, size, "the tests were cancelled");
                break;
        default:
                why[0] = '\0';
                break;
        }
}

/* One run of the job's tests on a final answer. */
typedef struct trial {
        bool fresh;           /* tests.isolation "fresh" */
        char *code;           /* the test cell */
        char marker[40];      /* of the report line in its output */
        cq_cell_result_t res; /* the test cell's */
        cq_testrun_t tr;      /* its report */
        char why[1024];  /* why the tests did not run to their end, or "" */
        char note[1024]; /* the first solution cell that failed in the
                            fresh interpreter, or "" */
} trial_t;

/* Run the test cell \p code in \p interp, within the test timeout. */
static cq_err_t exec_test_cell(const run_t *run,
                               cq_interp_t *interp,
                               const char *code,
                               cq_cell_result_t *res)
{
        cq_exec_opts_t xo = {0};

        xo.timeout_ms = test_timeout_ms(run);
        xo.cancel = run->opts->cancel;
        return cq_interp_execute(interp, code, &xo, res);
}

/* A new interpreter for tests.isolation "fresh" in *\p freshp. Returns 0;
 * 1 when the solution cannot be replayed there (trial->why says why); -1
 * when the run must stop (result set). */
static int new_fresh(run_t *run, trial_t *trial, cq_interp_t **freshp)
{
        char errstr[512];

        if (!run->opts->new_interp) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "tests.isolation \"fresh\" is not available here: "
                           "no way to start a new interpreter");
                return -1;
        }
        if (run->solution_over) {
                snprintf(trial->why, sizeof(trial->why),
                         "the solution's cells exceed %zu bytes or could "
                         "not be kept: tests.isolation \"fresh\" cannot run "
                         "them",
                         SOLUTION_MAX);
                return 1;
        }
        *freshp =
            run->opts->new_interp(run->opts->new_interp_opaque,
                                  run->job->backend, errstr, sizeof(errstr));
        if (!*freshp) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "could not start a fresh interpreter for the "
                           "tests: %s",
                           errstr);
                return -1;
        }
        return 0;
}

/* Note in trial->note that cell \p i of the solution's \p n failed in the
 * fresh interpreter with \p cell. */
static void note_failed_cell(trial_t *trial,
                             const cq_cell_result_t *cell,
                             size_t i,
                             size_t n)
{
        char *summary = NULL;

        agent_cell_error_summary(cell, &summary);
        snprintf(trial->note, sizeof(trial->note),
                 "in a fresh interpreter, cell %zu of the "
                 "solution's %zu failed (%s): the tests run "
                 "after the job's successful cells alone, "
                 "so state set by failed cells or changed "
                 "outside them is not there",
                 i + 1, n, summary ? summary : "no detail");
        free(summary);
}

/* The solution's cells, in order, in \p fresh. One that fails there is
 * noted in trial->note (the first one) and the others still run. 0, or
 * -1 when the run must stop (result set, or cancelled). */
static int replay_solution(run_t *run, cq_interp_t *fresh, trial_t *trial)
{
        size_t i, n = json_array_size(run->solution);

        for (i = 0; i < n; i++) {
                cq_cell_result_t cell;
                cq_exec_opts_t xo = {0};
                int64_t left = agent_remaining_ms(run);

                cq_cell_result_init(&cell);
                xo.timeout_ms = run->cell_timeout_s * 1000;
                if (left < xo.timeout_ms)
                        xo.timeout_ms = left > 1000 ? left : 1000;
                xo.cancel = run->opts->cancel;
                if (cq_interp_execute(
                        fresh,
                        json_string_value(json_array_get(run->solution, i)),
                        &xo, &cell) != CQ_OK) {
                        agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                                   "the fresh interpreter for the tests "
                                   "failed: %s",
                                   cq_interp_errmsg(fresh));
                        cq_cell_result_release(&cell);
                        return -1;
                }
                if (cell.status != CQ_CELL_OK && !trial->note[0])
                        note_failed_cell(trial, &cell, i, n);
                cq_cell_result_release(&cell);
                if (agent_cancelled(run))
                        return -1;
        }
        return 0;
}

/* The solution, then the test cell, in a new interpreter, into
 * trial->res. Returns 0; 1 when the tests could not run through the
 * solution's fault (trial->why says how); -1 when the run must stop
 * (result set). */
static int fresh_tests(run_t *run, trial_t *trial)
{
        cq_interp_t *fresh = NULL;
        int rc = new_fresh(run, trial, &fresh);

        if (rc != 0)
                return rc;
        rc = -1;
        if (agent_put_input_files(run, fresh) != 0 ||
            replay_solution(run, fresh, trial) != 0)
                goto out;
        if (exec_test_cell(run, fresh, trial->code, &trial->res) != CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "the fresh interpreter for the tests failed: %s",
                           cq_interp_errmsg(fresh));
                goto out;
        }
        rc = 0;
out:
        cq_interp_destroy(&fresh);
        return rc;
}

/* Run the trial's test cell where tests.isolation says and read its
 * report into trial->tr. 0, or -1 when the run must stop. */
static int exec_tests(run_t *run, trial_t *trial)
{
        if (trial->fresh) {
                int f = fresh_tests(run, trial);

                if (f < 0)
                        return -1;
                if (f == 1 && cq_testrun_fail(run->job->tests, trial->why,
                                              &trial->tr) != 0) {
                        run->oom = true;
                        return -1;
                }
        } else if (exec_test_cell(run, run->interp, trial->code, &trial->res) !=
                   CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "the interpreter failed: %s",
                           cq_interp_errmsg(run->interp));
                return -1;
        }
        if (!trial->why[0]) {
                explain_cell_end(run, &trial->res, trial->fresh, trial->why,
                                 sizeof(trial->why));
                if ((trial->why[0]
                         ? cq_testrun_fail(run->job->tests, trial->why,
                                           &trial->tr)
                         : cq_testrun_parse(run->job->tests, trial->marker,
                                            &trial->res, &trial->tr)) != 0) {
                        run->oom = true;
                        return -1;
                }
        }
        return 0;
}

/* Keep the trial's report: in the result, as the "tests.result" event and
 * in the notebook. 0, or -1 when out of memory. */
static int record_tests(run_t *run, const trial_t *trial)
{
        const cq_testrun_t *tr = &trial->tr;
        const char *isolation = trial->fresh ? "fresh" : "kernel";

        if (json_object_set_new(tr->report, "isolation",
                                json_string(isolation)) != 0 ||
            (trial->note[0] &&
             json_object_set_new(tr->report, "solution_error",
                                 json_string(trial->note)) != 0)) {
                run->oom = true;
                return -1;
        }
        run->result->tests_passed = tr->passed;
        run->result->tests_total = tr->total;
        json_decref(run->result->tests);
        run->result->tests = json_incref(tr->report);
        agent_event(run, "tests.result",
                    json_pack("{s:i, s:i, s:s, s:s?}", "passed", tr->passed,
                              "total", tr->total, "isolation", isolation,
                              "error", tr->error));
        if (run->nb) {
                char line[1400];

                snprintf(line, sizeof(line),
                         "**Tests%s: %d of %d passed.**%s%s",
                         trial->fresh ? " (fresh interpreter)" : "", tr->passed,
                         tr->total, tr->error ? " " : "",
                         tr->error ? tr->error : "");
                if (cq_nb_add_markdown(run->nb, line) != 0)
                        run->oom = true;
        }
        return 0;
}

/* What the model is told of tests that did not pass; NULL when out of
 * memory. Caller owns the returned value. */
static char *feedback(const run_t *run, const trial_t *trial)
{
        cq_test_failure_t failures[16];
        size_t n =
            cq_testrun_failures(&trial->tr, failures, CQ_ARRAY_SIZE(failures));
        char *text = cq_tooltext_test_feedback(
            json_string_value(json_object_get(run->job->tests, "function")),
            (size_t)trial->tr.passed, (size_t)trial->tr.total, failures, n,
            &run->topts, NULL);

        if (text && trial->note[0]) {
                char *both = NULL;

                agent_set_str(&both, "%s\n\nNote: %s.", text, trial->note);
                free(text);
                text = both;
        }
        return text;
}

/* Tests that did not pass: a failed attempt, and feedback for the model.
 * 0, or -1 when the run must stop. */
static int tests_failed(run_t *run, const trial_t *trial)
{
        const cq_testrun_t *tr = &trial->tr;
        char *text;

        agent_count_retry(run, true);
        if (tr->error)
                agent_set_str(&run->result->last_error, "%s", tr->error);
        else
                agent_set_str(&run->result->last_error,
                              "%d of %d tests passed%s%s", tr->passed,
                              tr->total, trial->note[0] ? "; " : "",
                              trial->note);
        text = feedback(run, trial);
        if (!text || agent_append(run, agent_text_message("user", text)) != 0) {
                if (!text)
                        run->oom = true;
                free(text);
                return -1;
        }
        free(text);
        return 0;
}

/* The job's tests, after a final answer. Returns 1 when they passed, 0 when
 * they failed (feedback appended), -1 when the run must stop. */
int agent_run_tests(run_t *run)
{
        trial_t trial;
        char errstr[256];
        int rc = -1;

        memset(&trial, 0, sizeof(trial));
        trial.fresh = run->job->tests_fresh;
        trial.code =
            cq_testrun_code(run->job->tests, trial.marker, sizeof(trial.marker),
                            errstr, sizeof(errstr));
        if (!trial.code) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "could not run the tests: %s", errstr);
                return -1;
        }
        cq_cell_result_init(&trial.res);
        cq_testrun_init(&trial.tr);
        if (exec_tests(run, &trial) != 0 || record_tests(run, &trial) != 0)
                goto out;
        if (trial.tr.passed == trial.tr.total &&
            trial.res.status == CQ_CELL_OK && !trial.tr.error) {
                rc = 1;
                goto out;
        }
        rc = tests_failed(run, &trial);
out:
        cq_testrun_release(&trial.tr);
        cq_cell_result_release(&trial.res);
        free(trial.code);
        return rc;
}
