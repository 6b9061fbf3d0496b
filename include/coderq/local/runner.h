/* SPDX-License-Identifier: MIT */
/* runner.h - the light interpreter: cq_interp_t over one Python process
 * (interp/local/runner.py) that runs each cell's code in one persistent
 * namespace, a module __main__ as in a kernel, for jobs judged with no
 * LLM (a job's "solution"): no Jupyter, no displays, a fork of the kernel
 * server rather than an interpreter's start. It is confined exactly as a
 * local kernel (the same sandbox, uid lease, environment and rlimits, a
 * work dir of its own removed with it), forked by the kernel server when
 * that works, else started cold under bubblewrap. A cell that times out
 * or is cancelled beyond its grace kills it; later cells then die until
 * cq_interp_restart(). docs/internals/BACKENDS.md, "The runner". */
#ifndef CODERQ_RUNNER_H
#define CODERQ_RUNNER_H

#include <jansson.h>

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"
#include "coderq/local/interp_local.h"
#include "coderq/local/kserver.h"
#include "coderq/local/sandbox.h"

typedef struct cq_runner_opts {
        const char *python;          /* NULL: /usr/bin/python3 */
        const cq_sandbox_t *sandbox; /* borrowed; NULL: no sandbox/rlimits */
        /* borrowed: fork runners from this server, starting cold when it
         * gives none; NULL: always cold */
        cq_kserver_t *kserver;
        const char *work_root;      /* NULL: $TMPDIR/coderq or /tmp/coderq */
        size_t output_max;          /* per-cell output cap; 0: 1 MiB */
        int64_t start_timeout_ms;   /* <= 0: 60 s */
        int64_t interrupt_grace_ms; /* a cancelled cell's; <= 0: 2.5 s */
        /* The environment report (cq_interp_env()) of runners of this
         * python, when known: borrowed, referenced. NULL: the runner
         * reports its own, probed at its start before any job code. */
        const json_t *env;
        /* NULL, or hooks whose defer takes a destroy's reaping and
         * clean-up off the destroying thread (the kernel pool's reaper,
         * cq_kpool_hooks()); copied. Its gate is not used. */
        const cq_local_hooks_t *hooks;
        /* NULL, or Python source a forked runner runs at its start, in a
         * namespace of its own, before the first cell (the test harness,
         * cq_testrun_harness(), which registers itself in sys.modules so
         * that a judge's calls find it compiled); a cold start runs none,
         * and the harness then goes in with the first call */
        const char *preload;
} cq_runner_opts_t;

/**
 * @brief Start a runner in a new work dir under opts->work_root and wait
 *        until it is ready.
 * @param opts Borrowed; strings copied.
 * @returns Caller owns the returned value; free with cq_interp_destroy()
 *          (which kills it, waits until its sandbox is gone, gives its uid
 *          back and removes its work dir, or has opts->hooks' defer do all
 *          but the kill). NULL with \p errstr filled (no process or dir
 *          left behind).
 * @locality Any thread; the runner then belongs to that thread. It dies
 *           when that thread exits (PR_SET_PDEATHSIG is per thread).
 */
cq_interp_t *
cq_runner_new(const cq_runner_opts_t *opts, char *errstr, size_t errstr_size);

/** @brief Whether \p interp is a runner (its backend's name is "local"
 *         too). */
bool cq_runner_is(const cq_interp_t *interp);

/** @brief Whether the running runner was forked by the kernel server
 *         (false: started cold). */
bool cq_runner_forked(const cq_interp_t *interp);

/** @brief Its work dir; borrowed, valid until destroy. */
const char *cq_runner_work_dir(const cq_interp_t *interp);

/** @brief The identity it runs as (its uid lease, restarts included);
 *         borrowed, valid until destroy. */
const cq_sandbox_id_t *cq_runner_sandbox_id(const cq_interp_t *interp);

/** @brief The most bytes of one control line (a reply) of a runner whose
 *         cells' output cap is \p output_max. */
size_t cq_runner_line_max(size_t output_max);

/** A runner's reply to a cell, parsed. */
typedef struct cq_runner_reply {
        bool ok;        /* the cell raised nothing */
        int count;      /* its execution count; -1: none (silent) */
        json_t *result; /* an execute_result output (its last expression's
                           repr), or NULL; owned */
        json_t *error;  /* an error output when !ok, else NULL; owned */
} cq_runner_reply_t;

/**
 * @brief Parse one control line (untrusted: the cell's code can write
 *        anything there): "MARKER JSON" with JSON {"ok": bool, "count":
 *        N > 0 | null, "result": string | null} and, when not ok, the
 *        strings "ename" and "evalue" and "traceback", a list of strings;
 *        no other key, "result" only when ok, at most
 *        cq_runner_line_max() bytes in all (the caller's cap).
 * @param marker Borrowed: the cell's marker; a line that does not start
 *        with it and a space is not this cell's.
 * @param reply (out) On 0: caller releases with
 *        cq_runner_reply_release().
 * @returns 0 parsed; 1 not this cell's line (\p reply untouched); -1
 *          malformed, with \p errstr filled.
 * @locality Any thread.
 */
CQ_NODISCARD int cq_runner_reply_parse(const char *line,
                                       size_t len,
                                       const char *marker,
                                       cq_runner_reply_t *reply,
                                       char *errstr,
                                       size_t errstr_size);

/** @brief Free what a parsed reply holds. */
void cq_runner_reply_release(cq_runner_reply_t *reply);

#endif
