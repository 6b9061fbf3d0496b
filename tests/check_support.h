/* SPDX-License-Identifier: MIT */
/* check_support.h - what every check runner shares: the main() that runs
 * one suite (CK_RUN_SUITE / CK_RUN_CASE select as usual), skips that show
 * as skipped, paths of the source tree, and helpers for integration
 * suites. */
#ifndef CODERQ_CHECK_SUPPORT_H
#define CODERQ_CHECK_SUPPORT_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Exit status of a runner none of whose tests failed but at least one of
 *  which skipped; CTest's SKIP_RETURN_CODE for every suite. */
#define CQ_CHECK_SKIPPED 77

/**
 * @brief Run \p suite and return the process exit status: 0 when every test
 *        passed, CQ_CHECK_SKIPPED when none failed and some skipped, else
 *        EXIT_FAILURE. With CQ_CHECK_CASE set, only the case of that name
 *        runs (tests/CMakeLists.txt gives each case of a suite of several
 *        a CTest entry of its own); a name the suite has not fails.
 */
int cq_check_run(Suite *suite);

/**
 * @brief Record that the current test cannot run here because \p need (one
 *        word naming the missing prerequisite, e.g. "node" or "bwrap") is
 *        absent, and print "SKIP <case>: needs <need>: <why>" on stderr.
 *        When the environment variable CQ_REQUIRE (a comma-separated list;
 *        "all" for every prerequisite) names \p need, the machine is known
 *        to have it and the test fails instead. Use CQ_CHECK_SKIP(), which
 *        also returns from the test.
 */
void cq_check_skip(const char *need, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define CQ_CHECK_SKIP(need, ...)                                               \
        do {                                                                   \
                cq_check_skip(need, __VA_ARGS__);                              \
                return;                                                        \
        } while (0)

/**
 * @brief For a runner that cannot run at all here (checked in main(),
 *        before any test): print "SKIP <suite>: needs <need>: <why>" and
 *        return CQ_CHECK_SKIPPED, or, when CQ_REQUIRE names \p need (see
 *        cq_check_skip()), say that it cannot skip and return
 *        EXIT_FAILURE. main() returns what this returns.
 */
int cq_check_skip_suite(const char *suite,
                        const char *need,
                        const char *fmt,
                        ...) __attribute__((format(printf, 3, 4)));

/** How often cq_check_wait_until() asks its predicate again. */
#define CQ_CHECK_WAIT_STEP_MS 20

/**
 * @brief Wait on a condition, not on time: call \p pred(\p arg) at once
 *        and then every CQ_CHECK_WAIT_STEP_MS until it returns true or
 *        \p timeout_ms have passed (it is asked once more at the
 *        deadline, so a condition that holds by then counts).
 * @returns Whether \p pred held. The caller asserts on it, with a
 *          message saying what did not happen.
 * @locality Any thread (it never fails the test itself).
 */
bool cq_check_wait_until(bool (*pred)(void *arg),
                         void *arg,
                         int64_t timeout_ms);

/** @brief The value of the environment variable \p name; when it is unset,
 *         fail the current test with a message naming it. */
const char *cq_check_env(const char *name);

/** @brief Path of \p rel under the source tree, in a static buffer. */
const char *cq_check_srcpath(const char *rel);

/**
 * @brief The whole file at \p path, NUL-terminated; fails the test when it
 *        cannot be read. Caller owns the returned value (free()).
 * @param lenp (out, optional) Its length.
 */
char *cq_check_slurp(const char *path, size_t *lenp);

/** @brief Write \p len bytes to \p path; fails the test on an error. */
void cq_check_spit(const char *path, const void *data, size_t len);

/**
 * @brief The golden cases of \p rel (a folder under the source tree): the
 *        names of its entries not starting with '.', sorted; fails the
 *        test when it cannot be read or holds more than \p max.
 * @param names (out) \p max slots; each name is owned by the caller
 *        (free()).
 * @returns How many.
 */
size_t cq_check_cases(const char *rel, char **names, size_t max);

/**
 * @brief Compare \p got with the golden file \p path; with
 *        CQ_GOLDEN_UPDATE set, write it there instead.
 * @returns 0 when they agree (or it was written), 1 after printing both
 *          under \p label on stderr.
 */
int cq_check_golden(const char *path, const char *got, const char *label);

#define CQ_CHECK_MAIN(suite_fn)                                                \
        int main(void) { return cq_check_run(suite_fn()); }

#endif
