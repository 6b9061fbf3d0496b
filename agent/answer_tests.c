/* SPDX-License-Identifier: MIT */
/* answer_tests.c - the job's tests, run on a final answer: the visible
 * ones after each final answer, with feedback for the model when they
 * fail, and the hidden ones once, on the answer the run ended with, never
 * shown to the model. Where the code under test runs: the job's kernel or,
 * for tests.isolation "fresh", a new interpreter after the solution's
 * cells. How a set is judged: "code" tests in the judging interpreter
 * (judging.c), unless "judge": "model"; "cases" one cell per case when
 * cases have limits of their own (judging.c), else in one harness cell
 * (testrun.c). Their report, notebook line and verdict. */
#include "coderq/agent/agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/agent/testrun.h"
#include "coderq/agent/tooltext.h"
#include "coderq/common/util.h"
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

/* One run of a test set on a final answer. */
typedef struct trial {
        const cq_job_tests_t *set; /* job->visible or job->hidden */
        bool hidden;
        bool fresh;           /* tests.isolation "fresh" */
        const char *verdict;  /* of this run, once it ran */
        const char *judge;    /* "separate" or "model" */
        char *code;           /* the test cell (a harness run) */
        char marker[40];      /* of the report line in its output */
        cq_cell_result_t res; /* the test cell's */
        cq_testrun_t tr;      /* its report */
        char why[1024];  /* why the tests did not run to their end, or "" */
        char note[1024]; /* the first solution cell that failed in the
                            fresh interpreter, or "" */
} trial_t;

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

/* The limit of one test run: the test timeout, within the job's time
 * (the hidden tests run after it with their own). */
static int64_t run_limit_ms(const run_t *run, const trial_t *trial)
{
        return trial->hidden ? run->test_timeout_s * 1000
                             : test_timeout_ms(run);
}

/* The set's test code as one harness cell in \p interp, into trial->tr.
 * 0, or -1 when the run must stop. */
static int harness_tests(run_t *run, trial_t *trial, cq_interp_t *interp)
{
        char errstr[256];
        cq_exec_opts_t xo = {0};

        trial->code =
            cq_testrun_code(trial->set->spec, trial->marker,
                            sizeof(trial->marker), errstr, sizeof(errstr));
        if (!trial->code) {
                agent_fail(run, CQ_AGENT_FAILED, "internal",
                           "could not run the tests: %s", errstr);
                return -1;
        }
        xo.timeout_ms = run_limit_ms(run, trial);
        xo.cancel = run->opts->cancel;
        if (cq_interp_execute(interp, trial->code, &xo, &trial->res) != CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "the interpreter failed: %s",
                           cq_interp_errmsg(interp));
                return -1;
        }
        explain_cell_end(run, &trial->res, trial->fresh, trial->why,
                         sizeof(trial->why));
        if ((trial->why[0]
                 ? cq_testrun_fail(trial->set->spec, trial->why, &trial->tr)
                 : cq_testrun_parse(trial->set->spec, trial->marker,
                                    &trial->res, &trial->tr)) != 0) {
                run->oom = true;
                return -1;
        }
        trial->verdict = agent_harness_verdict(&trial->tr, &trial->res);
        return 0;
}

/* Judge the set against the code in \p interp, as the set says. 0, or
 * -1 when the run must stop. */
static int judge_set(run_t *run, trial_t *trial, cq_interp_t *interp)
{
        const char *kind =
            json_string_value(json_object_get(trial->set->spec, "kind"));
        bool code = kind && strcmp(kind, "code") == 0;
        int64_t run_ms = run_limit_ms(run, trial);

        trial->judge =
            code && trial->set->judge == CQ_JUDGE_MODEL ? "model" : "separate";
        if (agent_case_limits(run) &&
            agent_calibrate(run, trial->set, run_ms) != 0)
                return -1;
        if (code && trial->set->judge == CQ_JUDGE_SEPARATE)
                return agent_judge_code(run, trial->set, interp, run_ms,
                                        &trial->tr, &trial->verdict, NULL)
                           ? -1
                           : 0;
        if (!code && agent_case_limits(run)) {
                if (agent_cases_each(run, trial->set, interp, run_ms,
                                     &trial->tr, NULL) != 0)
                        return -1;
                trial->verdict = agent_harness_verdict(&trial->tr, NULL);
                return 0;
        }
        return harness_tests(run, trial, interp);
}

/* Run the trial's tests where tests.isolation says, into trial->tr and
 * trial->verdict. 0, or -1 when the run must stop. */
static int exec_tests(run_t *run, trial_t *trial)
{
        cq_interp_t *fresh = NULL;
        int rc = -1, f;

        if (!trial->fresh)
                return judge_set(run, trial, run->interp);
        f = new_fresh(run, trial, &fresh);
        if (f < 0)
                return -1;
        if (f == 1) {
                /* the solution cannot be replayed: the tests fail */
                if (cq_testrun_fail(trial->set->spec, trial->why, &trial->tr) !=
                    0) {
                        run->oom = true;
                        return -1;
                }
                trial->verdict = "wrong_answer";
                trial->judge = "separate";
                return 0;
        }
        if (agent_put_input_files(run, fresh) == 0 &&
            replay_solution(run, fresh, trial) == 0)
                rc = judge_set(run, trial, fresh);
        cq_interp_destroy(&fresh);
        return rc;
}

/* Keep the trial's report: in the result, as an event and in the
 * notebook. The hidden tests' report goes where only people look: the
 * result's "hidden", never the history. 0, or -1 when out of memory. */
static int record_tests(run_t *run, const trial_t *trial)
{
        const cq_testrun_t *tr = &trial->tr;
        const char *isolation = trial->fresh ? "fresh" : "kernel";
        cq_agent_result_t *res = run->result;

        if (json_object_set_new(tr->report, "isolation",
                                json_string(isolation)) != 0 ||
            json_object_set_new(tr->report, "judge",
                                json_string(trial->judge)) != 0 ||
            json_object_set_new(tr->report, "verdict",
                                json_string(trial->verdict)) != 0 ||
            (trial->note[0] &&
             json_object_set_new(tr->report, "solution_error",
                                 json_string(trial->note)) != 0)) {
                run->oom = true;
                return -1;
        }
        if (trial->hidden) {
                res->hidden_passed = tr->passed;
                res->hidden_total = tr->total;
                json_decref(res->hidden);
                res->hidden = json_incref(tr->report);
        } else {
                res->tests_passed = tr->passed;
                res->tests_total = tr->total;
                json_decref(res->tests);
                res->tests = json_incref(tr->report);
        }
        agent_event(run, trial->hidden ? "tests.hidden" : "tests.result",
                    json_pack("{s:i, s:i, s:s, s:s, s:s?}", "passed",
                              tr->passed, "total", tr->total, "isolation",
                              isolation, "verdict", trial->verdict, "error",
                              trial->hidden ? NULL : tr->error));
        if (run->nb) {
                char line[1400];

                snprintf(line, sizeof(line), "**%s%s: %d of %d passed.**%s%s",
                         trial->hidden ? "Hidden tests" : "Tests",
                         trial->fresh ? " (fresh interpreter)" : "", tr->passed,
                         tr->total, tr->error && !trial->hidden ? " " : "",
                         tr->error && !trial->hidden ? tr->error : "");
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
            json_string_value(json_object_get(trial->set->spec, "function")),
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

/* Whether the model gave the same answer twice in a row: the tests
 * failed with the same feedback and no cell ran in between. */
static bool stuck_on(run_t *run, const char *feedback_text)
{
        char sig[65];
        bool same;

        cq_sha256_hex(feedback_text, strlen(feedback_text), sig);
        same = run->cells_since_tests == 0 && strcmp(sig, run->tests_sig) == 0;
        memcpy(run->tests_sig, sig, sizeof(sig));
        run->cells_since_tests = 0;
        return same;
}

/* Run \p set (hidden or not) on the answer into \p trial. 0, or -1 when
 * the run must stop. */
static int
run_set(run_t *run, const cq_job_tests_t *set, bool hidden, trial_t *trial)
{
        memset(trial, 0, sizeof(*trial));
        trial->set = set;
        trial->hidden = hidden;
        trial->fresh = set->fresh;
        cq_cell_result_init(&trial->res);
        cq_testrun_init(&trial->tr);
        if (exec_tests(run, trial) != 0 || record_tests(run, trial) != 0)
                return -1;
        return 0;
}

static void trial_release(trial_t *trial)
{
        cq_testrun_release(&trial->tr);
        cq_cell_result_release(&trial->res);
        free(trial->code);
}

/* The job's tests, after a final answer. Returns 1 when they passed, 0 when
 * they failed (feedback appended, unless the job has no model to tell),
 * -1 when the run must stop. */
int agent_run_tests(run_t *run)
{
        trial_t trial;
        int rc = -1;

        run->answered = true;
        if (run_set(run, &run->visible, false, &trial) != 0)
                goto out;
        run->test_verdict = trial.verdict;
        run->test_judge = trial.judge;
        if (strcmp(trial.verdict, "passed") == 0) {
                rc = 1;
                goto out;
        }
        if (run->job->solution) {
                /* judged with no LLM: nobody to give feedback to */
                agent_count_retry(run, true);
                rc = 0;
                goto out;
        }
        rc = tests_failed(run, &trial);
        if (rc == 0 && run->result->last_error &&
            stuck_on(run, run->result->last_error)) {
                agent_fail(run, CQ_AGENT_FAILED, "stuck",
                           "the same answer failed the same tests twice in a "
                           "row: %s",
                           run->result->last_error);
                rc = -1;
        }
out:
        trial_release(&trial);
        return rc;
}

int agent_run_hidden_tests(run_t *run)
{
        trial_t trial;
        int rc;

        if (!run->job->hidden.spec || !run->answered)
                return 0;
        rc = run_set(run, &run->job->hidden, true, &trial);
        if (rc == 0) {
                run->hidden_verdict = trial.verdict;
                run->hidden_judge = trial.judge;
        }
        trial_release(&trial);
        return rc;
}
