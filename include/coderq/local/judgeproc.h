/* SPDX-License-Identifier: MIT */
/* judgeproc.h - the judging interpreter's process (agent/judge.h's
 * cq_judge_proc_t): the judge's program, `python3 -I -c PROGRAM 3` or a
 * fork of the kernel server that runs it so, confined exactly as a local
 * kernel (the sandbox, a uid of the kernels' range, the scrubbed
 * environment, the rlimits, a fresh work dir removed with it). Its stdin
 * is a pipe of requests, its fd 3 a pipe of answers, its stdout and
 * stderr /dev/null. */
#ifndef CODERQ_JUDGEPROC_H
#define CODERQ_JUDGEPROC_H

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"
#include "coderq/local/interp_local.h"
#include "coderq/local/kserver.h"
#include "coderq/local/sandbox.h"

typedef struct cq_judgeproc_opts {
        const char *python;          /* NULL: /usr/bin/python3 */
        const cq_sandbox_t *sandbox; /* borrowed; NULL: no sandbox/rlimits */
        cq_kserver_t *kserver;       /* borrowed; NULL: always cold */
        const char *work_root;       /* NULL: $TMPDIR/coderq or /tmp/coderq */
        /* NULL, or hooks whose defer takes destroy's reaping and clean-up
         * off the destroying thread (cq_kpool_hooks()); copied */
        const cq_local_hooks_t *hooks;
} cq_judgeproc_opts_t;

/**
 * @brief Start the judge's \p program (agent/judge.py's text, as
 *        cq_judge_program() gives it) with "3" as its argument.
 * @param opts, program Borrowed; copied.
 * @returns Caller owns the returned value: to_fd and from_fd are ours,
 *          non-blocking; its destroy kills it, waits until its sandbox is
 *          gone, gives its uid back, removes its work dir, closes both and
 *          frees it (or has opts->hooks' defer do all but the kill). NULL
 *          with \p errstr filled (nothing left behind).
 * @locality Any thread; the process dies when that thread exits
 *           (PR_SET_PDEATHSIG is per thread) or with the worker.
 */
cq_interp_proc_t *cq_judgeproc_start(const cq_judgeproc_opts_t *opts,
                                     const char *program,
                                     char *errstr,
                                     size_t errstr_size);

/** @brief Whether \p proc (from cq_judgeproc_start()) was forked by the
 *         kernel server (false: started cold). */
bool cq_judgeproc_forked(const cq_interp_proc_t *proc);

/** @brief Its work dir; borrowed, valid until destroy. */
const char *cq_judgeproc_work_dir(const cq_interp_proc_t *proc);

#endif
