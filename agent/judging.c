/* SPDX-License-Identifier: MIT */
/* judging.c - the ways a test set is judged on an answer, beside the
 * harness cell of testrun.c: "code" tests in the judging interpreter
 * (judge.h), the model's interpreter answering each of its calls in a
 * cell of its own; "cases" one cell per case when each case has a limit
 * of its own; each case's limit, calibrated on the job's reference
 * solution when it has one; and the verdict of what happened. */
#include "coderq/agent/agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/agent/judge.h"
#include "coderq/agent/testrun.h"
#include "coderq/common/util.h"
#include "agent_int.h"

/* A lookup answers at once or not at all. */
#define LOOKUP_MS 10000

/* -------------------------------------------------------- the candidate */

typedef struct cand {
        run_t *run;
        cq_interp_t *interp; /* where the code under test runs */
        bool loaded;         /* a call's cell loaded the harness in interp */
} cand_t;

/* One request of the judge's as a cell in the candidate's interpreter:
 * its answer, or -1 when the interpreter itself failed (not the code).
 * The first call sends the whole harness, which stays loaded; later
 * calls send a stub that runs it, and the whole harness again only when
 * the stub finds none (the interpreter was replaced or restarted). */
static int cand_exec(cand_t *cd,
                     const char *kind,
                     const json_t *request,
                     int64_t limit_ms,
                     json_t **answerp,
                     int64_t *elapsed)
{
        char marker[40], errstr[256];
        char *code = NULL;
        cq_cell_result_t res;
        cq_exec_opts_t xo = {0};
        bool loaded;
        int64_t t0;
        int rc = 1;

        *answerp = NULL;
        cq_cell_result_init(&res);
        xo.timeout_ms = limit_ms > 0 ? limit_ms : 1;
        xo.cancel = cd->run->opts->cancel;
        while (rc == 1) {
                loaded = cd->loaded;
                rc = -1;
                code = cq_testrun_judge_code(kind, request, loaded, marker,
                                             sizeof(marker), errstr,
                                             sizeof(errstr));
                if (!code)
                        break;
                cq_cell_result_release(&res);
                cq_cell_result_init(&res);
                t0 = cq_now_ms();
                if (cq_interp_execute(cd->interp, code, &xo, &res) != CQ_OK)
                        break;
                if (elapsed)
                        *elapsed = cq_now_ms() - t0;
                cd->loaded = true;
                rc = cq_testrun_judge_answer(kind, loaded, marker, &res,
                                             answerp);
                if (rc == 1)
                        cd->loaded = false; /* resent whole, once */
                free(code);
                code = NULL;
        }
        cq_cell_result_release(&res);
        free(code);
        return rc;
}

static int cand_call(void *opaque,
                     const json_t *request,
                     int64_t limit_ms,
                     json_t **answerp,
                     int64_t *elapsed_ms)
{
        return cand_exec(opaque, "call", request, limit_ms, answerp,
                         elapsed_ms);
}

static int cand_lookup(void *opaque, const char *name, json_t **answerp)
{
        json_t *req = json_pack("{s:s}", "name", name);
        int rc;

        if (!req)
                return -1;
        rc = cand_exec(opaque, "lookup", req, LOOKUP_MS, answerp, NULL);
        json_decref(req);
        return rc;
}

/* ---------------------------------------------------------- verdicts */

/* The verdict of a judged run that did not pass. */
static const char *judged_verdict(const cq_judge_result_t *jr)
{
        const char *origin =
            json_string_value(json_object_get(jr->error, "origin"));

        if (jr->timed_out || (origin && strcmp(origin, "timeout") == 0))
                return "timeout";
        if (origin &&
            (strcmp(origin, "died") == 0 || strcmp(origin, "candidate") == 0))
                return "runtime_error";
        return "wrong_answer";
}

const char *agent_harness_verdict(const cq_testrun_t *tr,
                                  const cq_cell_result_t *res)
{
        const json_t *cases = json_object_get(tr->report, "cases"), *rec;
        size_t i;

        if (tr->total > 0 && tr->passed == tr->total && !tr->error &&
            (!res || res->status == CQ_CELL_OK))
                return "passed";
        if (res && res->status == CQ_CELL_TIMEOUT)
                return "timeout";
        if (res && res->status == CQ_CELL_DIED)
                return "runtime_error";
        /* the first failed case says what went wrong */
        json_array_foreach(cases, i, rec)
        {
                const char *error =
                    json_string_value(json_object_get(rec, "error"));

                if (json_is_true(json_object_get(rec, "ok")))
                        continue;
                if (json_is_true(json_object_get(rec, "timed_out")))
                        return "timeout";
                if (!error || json_object_get(rec, "got") ||
                    strncmp(error, "AssertionError", 14) == 0)
                        return "wrong_answer";
                return "runtime_error";
        }
        return "wrong_answer";
}

/* ------------------------------------------------------------- limits */

/* A case's floor: tests.case_timeout_s, else 1 s with a reference (so
 * a calibrated limit is never below it), else the whole run's limit. */
static int64_t case_floor_ms(const run_t *run, int64_t run_ms)
{
        if (run->job->case_timeout_s > 0)
                return (int64_t)(run->job->case_timeout_s * 1000.0 + 0.5);
        return run->job->reference ? 1000 : run_ms;
}

int64_t agent_case_limit_ms(const run_t *run, size_t i, int64_t run_ms)
{
        int64_t floor = case_floor_ms(run, run_ms), limit = floor;

        if (i < run->nref_ms) {
                int64_t factor = run->opts->case_time_factor > 0
                                     ? (int64_t)run->opts->case_time_factor
                                     : 4;
                int64_t calibrated = factor * run->ref_ms[i];

                if (calibrated > limit)
                        limit = calibrated;
        }
        return limit;
}

bool agent_case_limits(const run_t *run)
{
        return run->job->case_timeout_s > 0 || run->job->reference;
}

/* ------------------------------------------------------- code tests */

/* Build the harness-shaped report of a judged run into \p tr: one case
 * (0), ok or with the error and traceback, and beside it the judge and
 * each call with its limit. */
static int judged_report(const cq_judge_result_t *jr, cq_testrun_t *tr)
{
        json_t *rec = json_pack("{s:i, s:b}", "case", 0, "ok", jr->ok);
        const json_t *err = jr->error;

        if (!rec)
                return -1;
        if (!jr->ok) {
                char *text = NULL;

                if (jr->timed_out && !err)
                        agent_set_str(&text, "the tests ran past their time");
                else
                        agent_set_str(
                            &text, "%s: %s",
                            json_string_value(json_object_get(err, "type")),
                            json_is_string(json_object_get(err, "message"))
                                ? json_string_value(
                                      json_object_get(err, "message"))
                                : "");
                if (!text ||
                    json_object_set_new(rec, "error", json_string(text))) {
                        free(text);
                        json_decref(rec);
                        return -1;
                }
                free(text);
                if (json_is_string(json_object_get(err, "traceback")) &&
                    json_object_set(rec, "traceback",
                                    json_object_get(err, "traceback"))) {
                        json_decref(rec);
                        return -1;
                }
        }
        tr->passed = jr->ok ? 1 : 0;
        tr->total = 1;
        tr->report =
            json_pack("{s:i, s:i, s:[o], s:s, s:O, s:s?}", "passed", tr->passed,
                      "total", 1, "cases", rec, "judge", "separate", "calls",
                      jr->calls_report, "output", jr->output);
        return tr->report ? 0 : -1;
}

/* A judge for test code of \p key: one kept for it (\p keptp set)
 * unless \p fresh, else a new one; NULL with \p errstr filled. */
static cq_judge_proc_t *take_judge(run_t *run,
                                   const char *key,
                                   bool fresh,
                                   bool *keptp,
                                   char *errstr,
                                   size_t errstr_size)
{
        cq_judge_proc_t *proc = NULL;

        if (!fresh && run->opts->judge_take && key[0])
                proc = run->opts->judge_take(run->opts->judge_opaque, key);
        *keptp = proc != NULL;
        if (proc)
                return proc;
        return run->opts->judge_start(run->opts->judge_opaque,
                                      cq_judge_program(), errstr, errstr_size);
}

int agent_judge_code(run_t *run,
                     const cq_job_tests_t *set,
                     cq_interp_t *interp,
                     int64_t run_ms,
                     cq_testrun_t *tr,
                     const char **verdictp,
                     cq_judge_result_t *jrp)
{
        cand_t cd = {run, interp, false};
        cq_judge_candidate_t cand = {cand_call, cand_lookup, &cd};
        cq_judge_limits_t limits = {0};
        cq_judge_result_t jr;
        cq_judge_proc_t *proc = NULL;
        const char *code =
            json_string_value(json_object_get(set->spec, "code"));
        int64_t *per_call = NULL;
        char errstr[512], key[CQ_JUDGE_KEY_SIZE];
        bool kept, retried;
        size_t i;
        int rc = -1;

        cq_judge_result_init(&jr);
        if (!run->opts->judge_start) {
                agent_fail(run, CQ_AGENT_FAILED, "judge",
                           "code tests need a judging interpreter, and this "
                           "worker has none");
                return 1;
        }
        cq_judge_key(code, set->mutates, key);
        limits.call_ms = agent_case_limit_ms(run, (size_t)-1, run_ms);
        if (run->nref_ms > 0) {
                per_call = calloc(run->nref_ms, sizeof(*per_call));
                if (!per_call)
                        goto out;
                for (i = 0; i < run->nref_ms; i++)
                        per_call[i] = agent_case_limit_ms(run, i, run_ms);
                limits.call_ms_of = per_call;
                limits.ncall_ms = run->nref_ms;
        }
        /* At most twice: a kept judge that failed before the code under
         * test was called (it died while it waited) is replaced by a new
         * one, which runs the tests again. */
        for (retried = false;; retried = true) {
                proc = take_judge(run, key, retried, &kept, errstr,
                                  sizeof(errstr));
                if (!proc) {
                        agent_fail(run, CQ_AGENT_FAILED, "judge",
                                   "could not start the judging "
                                   "interpreter: %s",
                                   errstr);
                        rc = 1;
                        goto out;
                }
                limits.deadline_ms = cq_now_ms() + run_ms;
                if (cq_judge_run(proc, code, set->mutates, &cand, &limits,
                                 &jr) != 0)
                        goto out;
                if (!(jr.fault && kept && jr.calls == 0))
                        break;
                cq_log_kv(CQ_LOG_INFO, "a kept judge failed; starting one",
                          "job_id", run->job->job_id, "error", jr.fault, NULL);
                proc->destroy(proc);
                proc = NULL;
                cq_judge_result_release(&jr);
        }
        if (jr.fault) {
                agent_fail(run, CQ_AGENT_FAILED, "judge",
                           "the tests could not be judged: %s", jr.fault);
                rc = 1;
                goto out;
        }
        if (judged_report(&jr, tr) != 0)
                goto out;
        *verdictp = jr.ok ? "passed" : judged_verdict(&jr);
        if (jrp) {
                *jrp = jr;
                cq_judge_result_init(&jr);
        }
        rc = 0;
out:
        if (rc < 0)
                run->oom = true;
        if (proc &&
            !(rc == 0 && jr.reusable && run->opts->judge_keep && key[0] &&
              run->opts->judge_keep(run->opts->judge_opaque, key, proc)))
                proc->destroy(proc);
        free(per_call);
        cq_judge_result_release(&jr);
        return rc;
}

/* -------------------------------------------------- cases one by one */

/* The tests \p set with only case \p i. */
static json_t *one_case(const json_t *spec, size_t i)
{
        json_t *one = json_deep_copy(spec);
        json_t *c = json_array_get(json_object_get(spec, "cases"), i);

        if (!one || !c ||
            json_object_set_new(one, "cases", json_pack("[O]", c)) != 0) {
                json_decref(one);
                return NULL;
        }
        return one;
}

/* Case \p i's record, renumbered, with the limit it ran under; a case
 * past its limit says so. */
static json_t *case_record(const cq_testrun_t *one,
                           const cq_cell_result_t *res,
                           size_t i,
                           int64_t limit_ms,
                           int64_t time_ms)
{
        json_t *rec = json_deep_copy(
            json_array_get(json_object_get(one->report, "cases"), 0));

        if (!rec)
                rec = json_pack("{s:b, s:s?}", "ok", 0, "error", one->error);
        if (!rec ||
            json_object_set_new(rec, "case", json_integer((json_int_t)i + 1)) ||
            json_object_set_new(rec, "limit_ms", json_integer(limit_ms)) ||
            json_object_set_new(rec, "time_ms", json_integer(time_ms)) ||
            (res->status == CQ_CELL_TIMEOUT &&
             (json_object_set_new(rec, "timed_out", json_true()) ||
              json_object_set_new(rec, "ok", json_false())))) {
                json_decref(rec);
                return NULL;
        }
        if (res->status == CQ_CELL_TIMEOUT) {
                char text[160];

                snprintf(text, sizeof(text),
                         "the case ran past its limit of %lld ms",
                         (long long)limit_ms);
                if (json_object_set_new(rec, "error", json_string(text))) {
                        json_decref(rec);
                        return NULL;
                }
        }
        return rec;
}

int agent_cases_each(run_t *run,
                     const cq_job_tests_t *set,
                     cq_interp_t *interp,
                     int64_t run_ms,
                     cq_testrun_t *tr,
                     int64_t **timesp)
{
        size_t i, n = json_array_size(json_object_get(set->spec, "cases"));
        int64_t deadline = cq_now_ms() + run_ms;
        json_t *recs = json_array();
        int64_t *times = timesp ? calloc(n ? n : 1, sizeof(*times)) : NULL;
        bool lost = false;
        int rc = -1;

        cq_testrun_init(tr);
        tr->total = (int)n;
        if (!recs || (timesp && !times))
                goto out;
        for (i = 0; i < n; i++) {
                json_t *spec = one_case(set->spec, i), *rec;
                char marker[40], errstr[256];
                char *code = spec
                                 ? cq_testrun_code(spec, marker, sizeof(marker),
                                                   errstr, sizeof(errstr))
                                 : NULL;
                cq_cell_result_t res;
                cq_testrun_t one;
                cq_exec_opts_t xo = {0};
                int64_t limit = agent_case_limit_ms(run, i, run_ms), t0;

                cq_cell_result_init(&res);
                cq_testrun_init(&one);
                if (limit > deadline - cq_now_ms())
                        limit = deadline - cq_now_ms();
                xo.timeout_ms = limit > 1 ? limit : 1;
                xo.cancel = run->opts->cancel;
                t0 = cq_now_ms();
                if (!code || (!lost && cq_interp_execute(interp, code, &xo,
                                                         &res) != CQ_OK)) {
                        if (code)
                                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                                           "the interpreter failed: %s",
                                           cq_interp_errmsg(interp));
                        free(code);
                        json_decref(spec);
                        cq_cell_result_release(&res);
                        rc = code ? 1 : -1;
                        goto out;
                }
                if (times)
                        times[i] = cq_now_ms() - t0;
                /* After a timeout the interpreter's state is gone: the
                 * cases left fail without running. */
                if (lost ? cq_testrun_fail(spec,
                                           "not run: an earlier case ran "
                                           "past its limit and the "
                                           "interpreter's state was lost",
                                           &one)
                         : cq_testrun_parse(spec, marker, &res, &one)) {
                        free(code);
                        json_decref(spec);
                        cq_cell_result_release(&res);
                        goto out;
                }
                rec = case_record(&one, &res, i, limit, cq_now_ms() - t0);
                if (res.status == CQ_CELL_TIMEOUT || res.status == CQ_CELL_DIED)
                        lost = true;
                tr->passed +=
                    one.passed == 1 && json_is_true(json_object_get(rec, "ok"));
                cq_testrun_release(&one);
                cq_cell_result_release(&res);
                free(code);
                json_decref(spec);
                if (!rec || json_array_append_new(recs, rec))
                        goto out;
        }
        tr->report = json_pack("{s:i, s:i, s:O}", "passed", tr->passed, "total",
                               tr->total, "cases", recs);
        if (!tr->report)
                goto out;
        if (timesp) {
                *timesp = times;
                times = NULL;
        }
        rc = 0;
out:
        if (rc < 0)
                run->oom = true;
        json_decref(recs);
        free(times);
        return rc;
}

/* --------------------------------------------------------- reference */

/* The reference's times into run->ref_ms, from a judged run (one per
 * call) or the cases (one per case). */
static int reference_times(run_t *run,
                           const cq_job_tests_t *set,
                           cq_interp_t *ref,
                           int64_t run_ms)
{
        const char *kind =
            json_string_value(json_object_get(set->spec, "kind"));
        cq_testrun_t tr;
        const char *verdict = NULL;
        int rc;

        cq_testrun_init(&tr);
        if (kind && strcmp(kind, "code") == 0 &&
            set->judge == CQ_JUDGE_SEPARATE) {
                cq_judge_result_t jr;
                size_t i;

                cq_judge_result_init(&jr);
                rc =
                    agent_judge_code(run, set, ref, run_ms, &tr, &verdict, &jr);
                if (rc == 0 && jr.ok) {
                        run->nref_ms = json_array_size(jr.calls_report);
                        run->ref_ms = calloc(run->nref_ms ? run->nref_ms : 1,
                                             sizeof(*run->ref_ms));
                        if (!run->ref_ms) {
                                run->oom = true;
                                rc = -1;
                        }
                        for (i = 0; rc == 0 && i < run->nref_ms; i++)
                                run->ref_ms[i] =
                                    json_integer_value(json_object_get(
                                        json_array_get(jr.calls_report, i),
                                        "time_ms"));
                }
                cq_judge_result_release(&jr);
        } else if (kind && strcmp(kind, "cases") == 0) {
                int64_t *times = NULL;

                rc = agent_cases_each(run, set, ref, run_ms, &tr, &times);
                if (rc == 0) {
                        run->ref_ms = times;
                        run->nref_ms = (size_t)tr.total;
                }
                verdict =
                    tr.total > 0 && tr.passed == tr.total ? "passed" : "failed";
        } else {
                rc = 0; /* the model's own interpreter judges: no calls */
                verdict = "passed";
        }
        if (rc == 0 && (!verdict || strcmp(verdict, "passed") != 0)) {
                agent_fail(run, CQ_AGENT_FAILED, "invalid_job",
                           "the job's reference solution does not pass its "
                           "own tests (%s), so no limit can be calibrated "
                           "on it",
                           tr.error ? tr.error : "a case failed");
                rc = 1;
        }
        cq_testrun_release(&tr);
        return rc;
}

int agent_calibrate(run_t *run, const cq_job_tests_t *set, int64_t run_ms)
{
        cq_interp_t *ref = NULL;
        cq_cell_result_t res;
        cq_exec_opts_t xo = {0};
        char errstr[512];
        int rc = -1;

        if (!run->job->reference || run->calibrated)
                return 0;
        run->calibrated = true;
        if (!run->opts->new_interp) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "tests.reference needs a new interpreter, and "
                           "none can be started here");
                return 1;
        }
        ref = run->opts->new_interp(run->opts->new_interp_opaque,
                                    run->job->backend, errstr, sizeof(errstr));
        if (!ref) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "could not start an interpreter for the "
                           "reference solution: %s",
                           errstr);
                return 1;
        }
        cq_cell_result_init(&res);
        xo.timeout_ms = run->cell_timeout_s * 1000;
        xo.cancel = run->opts->cancel;
        if (cq_interp_execute(ref, run->job->reference, &xo, &res) != CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "the reference's interpreter failed: %s",
                           cq_interp_errmsg(ref));
                rc = 1;
        } else if (res.status != CQ_CELL_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "invalid_job",
                           "the job's reference solution does not run (%s)",
                           cq_cell_status_name(res.status));
                rc = 1;
        } else {
                rc = reference_times(run, set, ref, run_ms);
        }
        cq_cell_result_release(&res);
        cq_interp_destroy(&ref);
        return rc;
}
