/* SPDX-License-Identifier: MIT */
/* answer_tests.c - the job's tests, run on a final answer: in the job's
 * kernel or, for tests.isolation "fresh", in a new interpreter after the
 * solution's cells; their report and notebook line, and the feedback the
 * model gets when they fail. The test code and its report are testrun.c's. */
#include "coderq/agent/agent.h"

#include <stdio.h>
#include <stdlib.h>

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

/* The solution, then the test cell \p code, in a new interpreter. A
 * solution cell that fails there is noted in \p note (the first one) and
 * the others still run. Returns 0 with \p res the test cell's result; 1
 * when the tests could not run through the solution's fault (\p why says
 * how); -1 when the run must stop (result set). */
static int fresh_tests(run_t *run,
                       const char *code,
                       cq_cell_result_t *res,
                       char *why,
                       char *note,
                       size_t size)
{
        cq_interp_t *fresh = NULL;
        char errstr[512];
        size_t i, n = json_array_size(run->solution);
        int rc = -1;

        if (!run->opts->new_interp) {
                agent_fail(
                    run, CQ_AGENT_FAILED, "interpreter",
                    "tests.isolation \"fresh\" is not available here: no "
                    "way to start a new interpreter");
                return -1;
        }
        if (run->solution_over) {
                snprintf(why, size,
                         "the solution's cells exceed %zu bytes or could "
                         "not be kept: tests.isolation \"fresh\" cannot run "
                         "them",
                         SOLUTION_MAX);
                return 1;
        }
        fresh =
            run->opts->new_interp(run->opts->new_interp_opaque,
                                  run->job->backend, errstr, sizeof(errstr));
        if (!fresh) {
                agent_fail(
                    run, CQ_AGENT_FAILED, "interpreter",
                    "could not start a fresh interpreter for the tests: %s",
                    errstr);
                return -1;
        }
        for (i = 0; i < run->job->nfiles; i++)
                if (agent_put_input_file(run, fresh, &run->job->files[i]) != 0)
                        goto out;
        for (i = 0; i < n; i++) {
                cq_cell_result_t cell;
                cq_exec_opts_t xo = {0};
                char *summary = NULL;
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
                        agent_fail(
                            run, CQ_AGENT_FAILED, "interpreter",
                            "the fresh interpreter for the tests failed: %s",
                            cq_interp_errmsg(fresh));
                        cq_cell_result_release(&cell);
                        goto out;
                }
                if (cell.status != CQ_CELL_OK && !note[0]) {
                        agent_cell_error_summary(&cell, &summary);
                        snprintf(note, size,
                                 "in a fresh interpreter, cell %zu of the "
                                 "solution's %zu failed (%s): the tests run "
                                 "after the job's successful cells alone, "
                                 "so state set by failed cells or changed "
                                 "outside them is not there",
                                 i + 1, n, summary ? summary : "no detail");
                        free(summary);
                }
                cq_cell_result_release(&cell);
                if (agent_cancelled(run))
                        goto out;
        }
        {
                cq_exec_opts_t xo = {0};

                xo.timeout_ms = test_timeout_ms(run);
                xo.cancel = run->opts->cancel;
                if (cq_interp_execute(fresh, code, &xo, res) != CQ_OK) {
                        agent_fail(
                            run, CQ_AGENT_FAILED, "interpreter",
                            "the fresh interpreter for the tests failed: %s",
                            cq_interp_errmsg(fresh));
                        goto out;
                }
        }
        rc = 0;
out:
        cq_interp_destroy(&fresh);
        return rc;
}

/* The job's tests, after a final answer. Returns 1 when they passed, 0 when
 * they failed (feedback appended), -1 when the run must stop. */
int agent_run_tests(run_t *run)
{
        char marker[40], errstr[256], why[1024] = "", note[1024] = "";
        char *code;
        cq_cell_result_t res;
        cq_testrun_t tr;
        bool fresh = run->job->tests_fresh;
        const char *isolation = fresh ? "fresh" : "kernel";
        int rc = -1;

        code = cq_testrun_code(run->job->tests, marker, sizeof(marker), errstr,
                               sizeof(errstr));
        if (!code) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "could not run the tests: %s", errstr);
                return -1;
        }
        cq_cell_result_init(&res);
        cq_testrun_init(&tr);
        if (fresh) {
                int f = fresh_tests(run, code, &res, why, note, sizeof(why));

                if (f < 0)
                        goto out;
                if (f == 1 && cq_testrun_fail(run->job->tests, why, &tr) != 0) {
                        run->oom = true;
                        goto out;
                }
        } else {
                cq_exec_opts_t xo = {0};

                xo.timeout_ms = test_timeout_ms(run);
                xo.cancel = run->opts->cancel;
                if (cq_interp_execute(run->interp, code, &xo, &res) != CQ_OK) {
                        agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                                   "the interpreter failed: %s",
                                   cq_interp_errmsg(run->interp));
                        goto out;
                }
        }
        if (!why[0]) {
                explain_cell_end(run, &res, fresh, why, sizeof(why));
                if ((why[0] ? cq_testrun_fail(run->job->tests, why, &tr)
                            : cq_testrun_parse(run->job->tests, marker, &res,
                                               &tr)) != 0) {
                        run->oom = true;
                        goto out;
                }
        }
        if (json_object_set_new(tr.report, "isolation",
                                json_string(isolation)) != 0 ||
            (note[0] && json_object_set_new(tr.report, "solution_error",
                                            json_string(note)) != 0)) {
                run->oom = true;
                goto out;
        }
        run->result->tests_passed = tr.passed;
        run->result->tests_total = tr.total;
        json_decref(run->result->tests);
        run->result->tests = json_incref(tr.report);
        agent_event(run, "tests.result",
                    json_pack("{s:i, s:i, s:s, s:s?}", "passed", tr.passed,
                              "total", tr.total, "isolation", isolation,
                              "error", tr.error));
        if (run->nb) {
                char line[1400];

                snprintf(
                    line, sizeof(line), "**Tests%s: %d of %d passed.**%s%s",
                    fresh ? " (fresh interpreter)" : "", tr.passed, tr.total,
                    tr.error ? " " : "", tr.error ? tr.error : "");
                if (cq_nb_add_markdown(run->nb, line) != 0)
                        run->oom = true;
        }
        if (tr.passed == tr.total && res.status == CQ_CELL_OK && !tr.error) {
                rc = 1;
                goto out;
        }
        agent_count_retry(run, true);
        if (tr.error)
                agent_set_str(&run->result->last_error, "%s", tr.error);
        else
                agent_set_str(&run->result->last_error,
                              "%d of %d tests passed%s%s", tr.passed, tr.total,
                              note[0] ? "; " : "", note);
        {
                cq_test_failure_t failures[16];
                size_t n =
                    cq_testrun_failures(&tr, failures, CQ_ARRAY_SIZE(failures));
                char *text = cq_tooltext_test_feedback(
                    json_string_value(
                        json_object_get(run->job->tests, "function")),
                    (size_t)tr.passed, (size_t)tr.total, failures, n,
                    &run->topts, NULL);

                if (text && note[0]) {
                        char *both = NULL;

                        agent_set_str(&both, "%s\n\nNote: %s.", text, note);
                        free(text);
                        text = both;
                }
                if (!text ||
                    agent_append(run, agent_text_message("user", text)) != 0) {
                        if (!text)
                                run->oom = true;
                        free(text);
                        goto out;
                }
                free(text);
        }
        rc = 0;
out:
        cq_testrun_release(&tr);
        cq_cell_result_release(&res);
        free(code);
        return rc;
}
