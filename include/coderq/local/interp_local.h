/* SPDX-License-Identifier: MIT */
/* interp_local.h - the "local" interpreter: one kernel (kernel.h) in its
 * own work dir (workdir.h) behind cq_interp_t, standalone or handed out by
 * the kernel pool (kpool.h), which wraps its kernels with
 * cq_local_interp_wrap() and takes their teardown through a hook, so this
 * module knows nothing of the pool. */
#ifndef CODERQ_INTERP_LOCAL_H
#define CODERQ_INTERP_LOCAL_H

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/common/gate.h"
#include "coderq/interp/interp.h"
#include "coderq/local/kernel.h"
#include "coderq/local/sandbox.h"

typedef struct cq_local_opts {
        /* work_dir NULL: a new empty dir under work_root, removed on
         * destroy; otherwise that dir, kept. */
        cq_kernel_opts_t kernel;
        const char *work_root; /* NULL: $TMPDIR/coderq or /tmp/coderq */
} cq_local_opts_t;

/**
 * @brief Fill \p opts from \p cfg (python, timeouts, output cap).
 *        \p sandbox is borrowed and stored in the options.
 */
void cq_local_opts_from_config(cq_local_opts_t *opts,
                               const cq_config_t *cfg,
                               const cq_sandbox_t *sandbox);

/**
 * @brief Start a standalone local interpreter (one kernel).
 * @param opts Borrowed.
 * @returns Caller owns the returned value; free with cq_interp_destroy().
 *          NULL on failure with \p errstr filled.
 * @locality Any thread; then the calling thread owns it.
 */
cq_interp_t *cq_local_interp_new(const cq_local_opts_t *opts,
                                 char *errstr,
                                 size_t errstr_size);

/** @brief The kernel behind a local interpreter; borrowed. NULL when
 *         \p interp is not a local one. */
cq_kernel_t *cq_local_interp_kernel(cq_interp_t *interp);

/**
 * @brief Hand a teardown to someone else: run \p teardown(\p arg) later,
 *        on another thread.
 * @returns 0 when taken (\p arg now belongs to the callee, which must run
 *          it); -1 when not: the caller runs it itself, now.
 * @locality Any thread.
 */
typedef int(cq_local_defer_fn_t)(void *opaque,
                                 void (*teardown)(void *),
                                 void *arg);

/** @brief What a pool adds to the interpreters of its kernels. */
typedef struct cq_local_hooks {
        /* Called when an interpreter with a work dir of its own is
         * destroyed: the kernel is killed at once and its reaping and the
         * dir's removal go to defer (NULL: done by the destroying thread). */
        cq_local_defer_fn_t *defer;
        void *opaque; /* for defer; borrowed, outlives the interpreter */
        /* Each cell takes a turn here (see gate.h); NULL: none. Borrowed,
         * outlives the interpreter. */
        cq_gate_t *gate;
} cq_local_hooks_t;

/**
 * @brief Wrap a started kernel as a local interpreter.
 * @param kernelp Takes ownership, even on failure.
 * @param sandbox Borrowed; outlives the interpreter.
 * @param own_dir Remove the kernel's work dir on destroy (and on failure).
 * @param hooks Copied; NULL: none (a standalone interpreter).
 * @returns Caller owns the returned value; free with cq_interp_destroy().
 *          NULL with \p errstr filled.
 * @locality Any thread; then the calling thread owns it.
 */
cq_interp_t *cq_local_interp_wrap(cq_kernel_t **kernelp,
                                  const cq_sandbox_t *sandbox,
                                  bool own_dir,
                                  const cq_local_hooks_t *hooks,
                                  char *errstr,
                                  size_t errstr_size);

#endif
