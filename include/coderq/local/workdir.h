/* SPDX-License-Identifier: MIT */
/* workdir.h - the work root and a kernel's work dir under it. A work dir
 * is the kernel's current directory and HOME, where a job's input files
 * go and its created files are found; its name carries the creating
 * worker's pid so that the dirs of workers that are gone can be swept. */
#ifndef CODERQ_WORKDIR_H
#define CODERQ_WORKDIR_H

#include "coderq/common/common.h"

/**
 * @brief Create the work root \p root if missing (mode 0711, missing
 *        parents 0755) and check it: a directory (not a symlink) of this
 *        process's uid that nobody else may write.
 * @returns 0, or -1 with \p errstr filled.
 */
CQ_NODISCARD int
cq_work_root_prepare(const char *root, char *errstr, size_t errstr_size);

/**
 * @brief Create a new empty 0700 work dir under \p root (NULL: the
 *        default), prepared first with cq_work_root_prepare(). The kernel
 *        started in it gives it to the uid it runs as.
 * @param out (out) Its path.
 * @returns 0, or -1 with \p errstr filled.
 */
CQ_NODISCARD int cq_work_dir_new(const char *root,
                                 char *out,
                                 size_t out_size,
                                 char *errstr,
                                 size_t errstr_size);

/**
 * @brief Remove \p path and everything under it (no symlinks followed),
 *        holding two descriptors and no recursion whatever its depth;
 *        what cannot be removed is left, and logged at warn.
 */
void cq_work_dir_remove(const char *path);

/** @brief The default work root: $TMPDIR/coderq, or /tmp/coderq. */
void cq_work_root_default(char *out, size_t size);

/**
 * @brief Remove the work dirs under \p root (NULL: the default) left by
 *        workers that no longer run (killed with SIGKILL, or a crash):
 *        work dir names carry the creating process's pid. A work root
 *        shared between pid namespaces (containers) must not be swept.
 * @returns How many were removed, or -1 when \p root cannot be read.
 */
int cq_work_root_sweep(const char *root);

#endif
