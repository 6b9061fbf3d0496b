/* SPDX-License-Identifier: MIT */
/* check_support.h - what every check runner shares: the main() that runs
 * one suite (CK_RUN_SUITE / CK_RUN_CASE select as usual), paths of the
 * source tree, and helpers for integration suites. */
#ifndef CODERQ_CHECK_SUPPORT_H
#define CODERQ_CHECK_SUPPORT_H

#include <check.h>

/**
 * @brief Run \p suite and return the process exit status: 0 when every test
 *        passed.
 */
int cq_check_run(Suite *suite);

/** @brief The value of the environment variable \p name; when it is unset,
 *         fail the current test with a message naming it. */
const char *cq_check_env(const char *name);

/** @brief Path of \p rel under the source tree, in a static buffer. */
const char *cq_check_srcpath(const char *rel);

#define CQ_CHECK_MAIN(suite_fn)                                                \
        int main(void) { return cq_check_run(suite_fn()); }

#endif
