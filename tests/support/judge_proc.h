/* SPDX-License-Identifier: MIT */
/* judge_proc.h - the judging interpreter as a plain /usr/bin/python3 for
 * the suites (a cq_judge_start_fn): no sandbox, which the backend's own
 * starter adds and its suite tests. */
#ifndef CODERQ_CHECK_JUDGE_PROC_H
#define CODERQ_CHECK_JUDGE_PROC_H

#include <stddef.h>
#include <sys/types.h>

#include "coderq/agent/judge.h"

/** @brief Start \p program with requests on its stdin and answers on its
 *         fd 3; \p opaque, when not NULL, is an int counting the starts. */
cq_judge_proc_t *cq_check_judge_start(void *opaque,
                                      const char *program,
                                      char *errstr,
                                      size_t errstr_size);

/** @brief The process id of \p proc, from cq_check_judge_start(). */
pid_t cq_check_judge_pid(const cq_judge_proc_t *proc);

#endif
