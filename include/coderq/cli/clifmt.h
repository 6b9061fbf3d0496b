/* SPDX-License-Identifier: MIT */
/* clifmt.h - pure text formatting for the CLI: CSV fields (RFC 4180),
 * terminal display width of UTF-8 text, text others control escaped so
 * that a terminal obeys nothing in it, aligned tables, the progress bar
 * of `coderq submit --wait` and short durations. Nothing here does I/O,
 * so everything is unit-testable. */
#ifndef CODERQ_CLIFMT_H
#define CODERQ_CLIFMT_H

#include <jansson.h>
#include <stdio.h>

#include "coderq/common/buf.h"
#include "coderq/common/common.h"

/**
 * @brief Append \p s (NULL: empty) to \p buf as one RFC 4180 field: quoted
 *        when it holds a comma, a double quote, CR or LF (or starts or
 *        ends with a space), with every double quote doubled.
 * @returns CQ_OK or CQ_ERR_TOO_LARGE (buffer cap or out of memory).
 */
CQ_NODISCARD cq_err_t cq_fmt_csv_field(cq_buf_t *buf, const char *s);

/**
 * @brief Columns \p s takes on a terminal: one per code point, two for
 *        East Asian wide and emoji code points, none for combining marks
 *        and control characters. Invalid UTF-8 bytes count one each.
 */
size_t cq_fmt_width(const char *s);

/**
 * @brief Copy \p s into \p buf as one table cell: C0 control characters
 *        and DEL (newlines, tabs, ESC) become spaces; C1 controls
 *        (U+0080-U+009F), bidi controls (U+061C, U+200E, U+200F,
 *        U+202A-U+202E, U+2066-U+2069) and bytes that are not UTF-8
 *        become U+FFFD, one column each. Text wider than \p max_width
 *        columns (0: no limit) is cut at a code point boundary and ends
 *        with "...".
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_fmt_cell(cq_buf_t *buf,
                                  const char *s,
                                  size_t max_width);

/**
 * @brief Append text someone else controls (a model's answer, a kernel's
 *        error, a job's fields) to \p buf so that a terminal shows it as
 *        it is, on one line: "\n", "\r" and "\t" as those two
 *        characters; other C0 controls, DEL and bytes that are not UTF-8
 *        as "\xHH"; C1 controls as "\u00HH"; the bidi controls of
 *        cq_fmt_cell() as "\uHHHH" (hex in lower case). Everything else,
 *        backslashes included, is copied. Text wider than \p max_width
 *        columns once escaped (0: no limit) is cut at a code point
 *        boundary, never inside an escape, and ends with "...".
 * @param s Borrowed; NULL appends nothing.
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_fmt_untrusted(cq_buf_t *buf,
                                       const char *s,
                                       size_t max_width);

/**
 * @brief cq_fmt_untrusted() into a new string.
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory. \p s NULL gives "".
 */
char *cq_fmt_untrusted_dup(const char *s, size_t max_width);

/** @brief An aligned text table. Opaque; build with cq_table_new(). */
typedef struct cq_table cq_table_t;

/** @brief Column alignment flags for cq_table_new(). */
enum cq_table_align {
        CQ_TABLE_LEFT = 0,
        CQ_TABLE_RIGHT = 1,
};

/**
 * @brief A table with \p ncols columns named by \p headers (borrowed;
 *        copied) aligned per \p align (NULL: all left). Cells wider than
 *        \p max_width columns (0: no limit) are cut with "...".
 * @returns Caller owns the returned value; free with cq_table_destroy().
 *          NULL when out of memory.
 */
cq_table_t *cq_table_new(size_t ncols,
                         const char *const *headers,
                         const int *align,
                         size_t max_width);

void cq_table_destroy(cq_table_t **tablep);

/**
 * @brief Add a row of ncols cells (borrowed; copied; NULL prints as "-").
 * @returns 0, or -1 when out of memory.
 */
CQ_NODISCARD int cq_table_add(cq_table_t *table, const char *const *cells);

/**
 * @brief Render the table: header, then rows, columns separated by two
 *        spaces, padded by display width, no trailing spaces, "\n" after
 *        every line.
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_table_render(const cq_table_t *table, cq_buf_t *buf);

/** @brief Counts of a batch of jobs for the progress bar. */
typedef struct cq_progress {
        size_t total;
        size_t succeeded, failed, cancelled; /* finished */
        size_t running;
        size_t queued; /* includes jobs not yet in PostgreSQL */
} cq_progress_t;

/**
 * @brief Render one progress line without a newline:
 *        "[#########.......] 9/16 done  7 ok 2 failed  3 running  4 queued"
 *        with \p bar_width cells in the bar ("#" per finished share,
 *        rounded down; full only when all are done). " N cancelled" follows
 *        "failed" only when some were cancelled.
 */
void cq_fmt_progress(char *out,
                     size_t size,
                     const cq_progress_t *progress,
                     size_t bar_width);

/**
 * @brief Append a JSON scalar as plain text: a string as is, null as
 *        nothing, integers in decimal, reals with up to 15 significant
 *        digits ("0.875"), true/false; arrays and objects as compact JSON.
 * @param value Borrowed; NULL appends nothing.
 * @returns CQ_OK or CQ_ERR_TOO_LARGE.
 */
CQ_NODISCARD cq_err_t cq_fmt_scalar(cq_buf_t *buf, const json_t *value);

/**
 * @brief A safe file name for an image: the last component of \p name
 *        (after any '/' or '\\'), control characters and ':' replaced by
 *        '_', leading dots dropped, at most 100 bytes (cut at a UTF-8
 *        boundary, extension kept). An empty result becomes
 *        "image-<first 12 hex of sha256><ext of mime>".
 * @param name, mime, sha256 Borrowed; each may be NULL.
 * @param out Receives the name; \p size >= 128.
 */
void cq_fmt_image_name(const char *name,
                       const char *mime,
                       const char *sha256,
                       char *out,
                       size_t size);

/**
 * @brief The \p n-th variant of \p name for a collision: "plot.png", 2 ->
 *        "plot-2.png"; "data" -> "data-2". \p size >= strlen(name) + 24.
 */
void cq_fmt_name_variant(const char *name, int n, char *out, size_t size);

/**
 * @brief Format a duration in milliseconds for people: "850ms", "12.3s",
 *        "4m05s", "2h03m"; negative values print as "-".
 */
void cq_fmt_duration(char *out, size_t size, long long ms);

#endif
