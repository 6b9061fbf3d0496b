/* SPDX-License-Identifier: MIT */
/* pylit.h - Python literals for the arguments C hands to the Python it
 * runs in kernels: the programs themselves are files of their own (built
 * in by cq_embed()), and C passes them data, never edits their text. */
#ifndef CODERQ_PYLIT_H
#define CODERQ_PYLIT_H

#include "coderq/common/buf.h"

/**
 * @brief Append \p s (\p n bytes, borrowed) to \p buf as a Python str
 *        literal in single quotes that evaluates to exactly \p s: the
 *        backslash and the quote escaped, control characters (NUL
 *        included) as \\xNN, everything else as it is, so text of
 *        letters, digits and punctuation reads the same inside.
 * @returns CQ_OK; CQ_ERR_FATAL when \p s is not valid UTF-8 (Python reads
 *          source as UTF-8) or out of memory, CQ_ERR_TOO_LARGE past the
 *          cap. All or nothing, as cq_buf_append().
 * @locality Any thread.
 */
CQ_NODISCARD cq_err_t cq_pylit_append(cq_buf_t *buf, const char *s, size_t n);

#endif
