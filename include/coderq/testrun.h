/* SPDX-License-Identifier: MIT */
/* testrun.h - a job's tests (README "Job messages"): turn them into one Python
 * cell that runs in the job's own kernel or, with "isolation": "fresh", in
 * a new interpreter after the job's solution (agent.c decides), and read
 * its report back.
 *
 *   {"kind":"cases","function":"f","cases":[{"args":[..],"expected":..}]}
 *   {"kind":"code","code":"assert f(2) == 4"}
 *
 * A case's result is first turned into plain data without calling any
 * method of an object the model's code made: exact None, bool, int, float,
 * str, list and tuple (as a list), dict with str keys; numpy arrays of
 * bool, integer, float or str dtype and numpy's own scalar types through
 * tolist()/item(); anything else (another class, a subclass of a built-in
 * type, an object array, a non-str dict key) fails the case with a message
 * naming its type. Plain values then compare with numeric tolerance
 * (math.isclose, rel 1e-6, abs 1e-9) element-wise; booleans only equal
 * booleans. The report is printed on one line behind a per-run random
 * marker, so ordinary output cannot be taken for it. */
#ifndef CODERQ_TESTRUN_H
#define CODERQ_TESTRUN_H

#include <jansson.h>

#include "coderq/common.h"
#include "coderq/interp.h"
#include "coderq/tooltext.h"

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
 *          report counts as every case failed, with the reason in
 *          tr->error), -1 when out of memory.
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

#endif
