/* SPDX-License-Identifier: MIT */
/* check_support.h - what every check runner shares: the main() that runs
 * one suite (CK_RUN_SUITE / CK_RUN_CASE select as usual), paths of the
 * source tree, and helpers for integration suites. */
#ifndef CODERQ_CHECK_SUPPORT_H
#define CODERQ_CHECK_SUPPORT_H

#include <check.h>
#include <stddef.h>

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

/**
 * @brief The whole file at \p path, NUL-terminated; fails the test when it
 *        cannot be read. Caller owns the returned value (free()).
 * @param lenp (out, optional) Its length.
 */
char *cq_check_slurp(const char *path, size_t *lenp);

/** @brief Write \p len bytes to \p path; fails the test on an error. */
void cq_check_spit(const char *path, const void *data, size_t len);

#define CQ_CHECK_MAIN(suite_fn)                                                \
        int main(void) { return cq_check_run(suite_fn()); }

#endif
