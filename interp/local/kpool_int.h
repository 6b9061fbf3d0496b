/* SPDX-License-Identifier: MIT */
/* kpool_int.h - shared by interp_local.c and kpool.c only. */
#ifndef CODERQ_KPOOL_INT_H
#define CODERQ_KPOOL_INT_H

#include "coderq/gate.h"
#include "coderq/kpool.h"

/**
 * @brief Wrap a started kernel as a local interpreter.
 * @param kernelp Takes ownership, even on failure.
 * @param own_dir Remove the kernel's work dir on destroy (and on failure).
 * @returns Caller owns the returned value; NULL with \p errstr filled.
 */
cq_interp_t *cq_local_interp_wrap(cq_kernel_t **kernelp,
                                  const cq_sandbox_t *sandbox,
                                  bool own_dir,
                                  char *errstr,
                                  size_t errstr_size);

/** @brief Tie \p interp to \p pool (borrowed; it outlives the
 *         interpreter): each cell takes a turn at \p gate (NULL: none),
 *         and destroying the interpreter hands the kernel's teardown to
 *         the pool's reaper (cq_kpool_defer()). */
void cq_local_interp_attach(cq_interp_t *interp,
                            cq_kpool_t *pool,
                            cq_gate_t *gate);

/**
 * @brief Run \p fn(\p arg) on the pool's reaper thread, which runs at
 *        niceness 19 (a kernel's teardown is CPU spent after its job
 *        finished: killing, reaping, removing its work dir).
 * @returns 0 when queued (\p arg now belongs to the reaper); -1 when the
 *          pool is stopping or out of memory: run it yourself.
 * @locality Any thread.
 */
int cq_kpool_defer(cq_kpool_t *pool, void (*fn)(void *), void *arg);

#endif
