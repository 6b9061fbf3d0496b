/* SPDX-License-Identifier: MIT */
/* notebook.h - builds nbformat 4.5 notebooks from executed cells: cell ids,
 * kernelspec and language_info metadata, a markdown heading per section
 * title, code cells with execution counts and outputs in nbformat's shapes
 * (multiline strings split into lines, transient data dropped, consecutive
 * streams merged). The result passes nbformat's own validator. */
#ifndef CODERQ_NOTEBOOK_H
#define CODERQ_NOTEBOOK_H

#include <jansson.h>

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"

typedef struct cq_nb cq_nb_t;

/**
 * @brief A new empty notebook.
 * @param language_info Borrowed (copied); kernel_info_reply's language_info,
 *        or NULL for Debian's Python 3 defaults.
 * @returns Caller owns the returned value; free with cq_nb_destroy(). NULL
 *          when out of memory.
 */
cq_nb_t *cq_nb_new(const json_t *language_info);

/**
 * @brief Load a notebook written by cq_nb_dumps() (to continue it).
 * @returns Caller owns the returned value, or NULL with \p errstr filled when
 *          \p doc is not an nbformat 4 notebook.
 */
cq_nb_t *cq_nb_from_json(const json_t *doc, char *errstr, size_t errstr_size);

/** @brief Append a markdown cell with \p source. @returns 0 or -1 (OOM). */
CQ_NODISCARD int cq_nb_add_markdown(cq_nb_t *nb, const char *source);

/** @brief Append a section heading ("## title"). @returns 0 or -1. */
CQ_NODISCARD int cq_nb_add_heading(cq_nb_t *nb, const char *title);

/**
 * @brief Append a code cell.
 * @param res Borrowed; NULL for a cell that was not run (no outputs,
 *        execution_count null). Outputs are converted to nbformat's stored
 *        shapes; res->timing becomes metadata.execution.
 * @returns 0 or -1 (OOM).
 */
CQ_NODISCARD int
cq_nb_add_code(cq_nb_t *nb, const char *code, const cq_cell_result_t *res);

/** @brief Number of cells. */
size_t cq_nb_ncells(const cq_nb_t *nb);

/**
 * @brief Set a key under the notebook's metadata.coderq object.
 * @param value Takes ownership, even on failure.
 */
CQ_NODISCARD int cq_nb_set_meta(cq_nb_t *nb, const char *key, json_t *value);

/**
 * @brief The notebook document.
 * @returns Borrowed; valid until the next change or cq_nb_destroy().
 */
const json_t *cq_nb_json(const cq_nb_t *nb);

/**
 * @brief Serialise as nbformat does: indent 1, sorted keys, UTF-8 unescaped,
 *        trailing newline.
 * @returns Caller owns the returned value (free()); NULL when out of memory.
 */
char *cq_nb_dumps(const cq_nb_t *nb, size_t *lenp);

/** @brief Write cq_nb_dumps() to \p path atomically (temp file + rename). */
CQ_NODISCARD int cq_nb_write_file(const cq_nb_t *nb,
                                  const char *path,
                                  char *errstr,
                                  size_t errstr_size);

void cq_nb_destroy(cq_nb_t **nbp);

#endif
