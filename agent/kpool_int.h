/* SPDX-License-Identifier: MIT */
/* kpool_int.h - shared by interp_local.c and kpool.c only. */
#ifndef CODERQ_KPOOL_INT_H
#define CODERQ_KPOOL_INT_H

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

#endif
