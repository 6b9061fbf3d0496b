/* SPDX-License-Identifier: MIT */
/* workfiles.h - a job's files in a work dir whose tree the code running
 * there controls: its input files written, the files it created found
 * and read. Paths are opened one component at a time without following
 * a symlink, and only regular files: a FIFO, socket or device under a
 * file's name is refused, never blocking the caller. Shared by the local
 * interpreters over a kernel (interp_local.h) and over a runner
 * (runner.h). */
#ifndef CODERQ_WORKFILES_H
#define CODERQ_WORKFILES_H

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"
#include "coderq/local/sandbox.h"

/** @brief The files of one work dir: the regular files it held when this
 *         was made, and the input files written since. */
typedef struct cq_workfiles cq_workfiles_t;

/**
 * @brief Take note of the files under \p dir now (the kernel's run dir
 *        CQ_KERNEL_RUN_DIR excepted): none of them is the job's creation.
 *        At most 10000 files and 32 levels are walked, so a hostile tree
 *        cannot stall the caller.
 * @param dir Borrowed; copied.
 * @returns Caller owns the returned value; free with
 *          cq_workfiles_destroy(). NULL with \p errstr filled.
 * @locality Any thread; then the thread that owns the interpreter.
 */
cq_workfiles_t *
cq_workfiles_new(const char *dir, char *errstr, size_t errstr_size);

/**
 * @brief Write \p data as the input file \p name (a safe relative path,
 *        not in the run dir), making missing parent dirs; every dir made
 *        or passed below the work dir, and the file, go to the uid of
 *        \p own (NULL: nobody's), through the descriptors opened.
 * @returns CQ_OK; CQ_ERR_FATAL for a bad name, else CQ_ERR_RETRIABLE with
 *          \p errstr filled.
 */
CQ_NODISCARD cq_err_t cq_workfiles_put(cq_workfiles_t *wf,
                                       const char *name,
                                       const void *data,
                                       size_t len,
                                       const cq_sandbox_id_t *own,
                                       char *errstr,
                                       size_t errstr_size);

/**
 * @brief The files new or changed since cq_workfiles_new(), input files
 *        excepted (see cq_interp_created_files()); with \p with_data each
 *        one's bytes too, up to 64 MiB each (a larger one is listed
 *        without them).
 * @param files (out) Filled on CQ_OK; caller releases.
 */
CQ_NODISCARD cq_err_t cq_workfiles_created(cq_workfiles_t *wf,
                                           bool with_data,
                                           cq_files_t *files,
                                           char *errstr,
                                           size_t errstr_size);

/**
 * @brief Read the file \p name, refusing one larger than \p max
 *        (CQ_ERR_TOO_LARGE); CQ_ERR_FATAL when it does not exist or is
 *        not a regular file.
 * @param file (out) Filled on CQ_OK; caller releases its strings and
 *        data (free()).
 */
CQ_NODISCARD cq_err_t cq_workfiles_get(cq_workfiles_t *wf,
                                       const char *name,
                                       size_t max,
                                       cq_file_t *file,
                                       char *errstr,
                                       size_t errstr_size);

/** @brief The work dir; borrowed, valid until destroy. */
const char *cq_workfiles_dir(const cq_workfiles_t *wf);

/** @brief Free the notes (the files stay). Accepts *wfp == NULL. */
void cq_workfiles_destroy(cq_workfiles_t **wfp);

#endif
