/* SPDX-License-Identifier: MIT */
/* testrun.h - a job's tests (docs/JOBS.md#tests): turn them into one Python
 * cell that runs in the job's own kernel or, with "isolation": "fresh", in
 * a new interpreter after the job's solution (answer_tests.c decides),
 * and read its report back; and the cells that answer the judging
 * interpreter's calls (judge.h) in the model's interpreter.
 *
 *   {"kind":"cases","function":"f","cases":[{"args":[..],"expected":..}]}
 *   {"kind":"code","code":"assert f(2) == 4"}
 *
 * The cell gets the function's name and the arguments of each case,
 * never the expected values: it calls the function and reports each
 * result as plain data (exact None, bool, int, float, str, list and tuple
 * as a list, dict with str keys; numpy's own arrays of bool, integer,
 * float or str dtype and its scalar types through tolist()/item();
 * anything else is reported as not plain, naming its type) on one line
 * behind a per-run random marker. cq_testrun_parse() reads that line as
 * untrusted input and compares in C, with numeric tolerance (as
 * math.isclose, rel 1e-6, abs 1e-9) element-wise; booleans only equal
 * booleans. Whatever the model's code did to the interpreter, a report
 * can only claim results, and a wrong one fails. */
#ifndef CODERQ_TESTRUN_H
#define CODERQ_TESTRUN_H

#include <jansson.h>

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"
#include "coderq/agent/tooltext.h"

/** @brief The outcome of one test run. Release with cq_testrun_release(). */
typedef struct cq_testrun {
        int passed;
        int total;
        char *error;    /* why the tests could not run at all, or NULL */
        json_t *report; /* {"passed","total","cases":[{"case","call",
                           "expected","got"|"error","traceback","ok"}]} */
} cq_testrun_t;

void cq_testrun_init(cq_testrun_t *tr);
void cq_testrun_release(cq_testrun_t *tr);

/**
 * @brief Build the Python cell that runs \p tests (a validated job "tests"
 *        object, borrowed).
 * @param marker (out) At least 33 bytes; the report line's marker.
 * @returns Caller owns the returned value (free()); NULL with \p errstr
 *          filled on an invalid tests object or out of memory.
 */
char *cq_testrun_code(const json_t *tests,
                      char *marker,
                      size_t marker_size,
                      char *errstr,
                      size_t errstr_size);

/**
 * @brief Read the report of a finished test cell.
 * @param tests Borrowed; the same object given to cq_testrun_code().
 * @param res Borrowed; the cell's result.
 * @returns 0 with \p tr filled (a cell that raised, timed out or printed no
 *          report, or whose report is forged or cannot be read, counts as
 *          every case failed, with the reason in tr->error; an entry that
 *          cannot be read fails its case), -1 when out of memory.
 * @remark The cell's output is untrusted (the model's code ran in that
 *         interpreter): it is parsed strictly and never trusted to judge
 *         a case.
 */
CQ_NODISCARD int cq_testrun_parse(const json_t *tests,
                                  const char *marker,
                                  const cq_cell_result_t *res,
                                  cq_testrun_t *tr);

/**
 * @brief Fill \p tr (released first) as a test run that could not run:
 *        every case failed, with \p why (borrowed) as tr->error.
 * @returns 0, or -1 when out of memory (\p tr left released).
 */
CQ_NODISCARD int
cq_testrun_fail(const json_t *tests, const char *why, cq_testrun_t *tr);

/**
 * @brief The failed cases of \p tr for cq_tooltext_test_feedback(); when
 *        the tests could not run, one entry carrying tr->error.
 * @param out Room for \p max entries; strings are borrowed from \p tr.
 * @returns How many entries were filled.
 */
size_t
cq_testrun_failures(const cq_testrun_t *tr, cq_test_failure_t *out, size_t max);

/**
 * @brief The test harness's Python source (testrun_harness.py): run with
 *        no _ARGS, it only registers itself in sys.modules, where the
 *        cells of cq_testrun_code() and cq_testrun_judge_code() find it
 *        and need not compile it. What a runner runs at its start
 *        (cq_backend_set_runner_preload()).
 * @returns A static string.
 */
const char *cq_testrun_harness(void);

/**
 * @brief The cell that answers one request of the judging interpreter in
 *        the model's interpreter (judge.h): \p kind "call" (\p request:
 *        {"name", "args", "kwargs", "mutates"}, tagged plain values) or
 *        "lookup" ({"name"}), through the harness behind a fresh marker.
 * @param loaded Whether an earlier cell of this function's has run in the
 *               interpreter: then the cell is a small stub that runs the
 *               harness kept there (about 15 KB less to send per call),
 *               else the cell carries the whole harness too, which it
 *               runs only where none is kept (a forked runner has it
 *               from its start: cq_testrun_harness()), and which then
 *               stays for the next calls.
 * @param marker (out) At least 33 bytes; the report line's marker.
 * @returns Caller owns the returned value (free()); NULL with \p errstr.
 */
char *cq_testrun_judge_code(const char *kind,
                            const json_t *request,
                            bool loaded,
                            char *marker,
                            size_t marker_size,
                            char *errstr,
                            size_t errstr_size);

/**
 * @brief The judge's answer (judge.h's candidate hooks) from such a
 *        cell's result: what the harness reported, or a failure of kind
 *        timeout, died (the cell's status) or not_plain (no report, a
 *        forged one, a value the harness would not write). The values it
 *        carries are checked by the judge's side (cq_judge_value_check()).
 * @param loaded The \p loaded given to cq_testrun_judge_code().
 * @param answerp (out) Caller owns the returned value.
 * @returns 0; 1 (\p answerp NULL) when \p loaded and the stub found no
 *          harness in the interpreter (it was replaced or restarted, or
 *          the model's code removed it): send the call again with the
 *          whole harness; -1 when out of memory.
 */
CQ_NODISCARD int cq_testrun_judge_answer(const char *kind,
                                         bool loaded,
                                         const char *marker,
                                         const cq_cell_result_t *res,
                                         json_t **answerp);

#endif
