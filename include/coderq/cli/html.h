/* SPDX-License-Identifier: MIT */
/* html.h - the static run report of `coderq report`: HTML escaping of
 * untrusted text, safe and unique page names for job ids, and the pages
 * (the run's index and one page per job) rendered from the JSON the store
 * returns. Pure: nothing here does I/O, so all of it is unit-testable.
 *
 * Everything that came from a model, a job or its code is untrusted and
 * reaches a page only through cq_html_escape() (or as a data: URI of
 * bytes that were decoded and encoded again), which is safe both in
 * element content and inside a quoted attribute value. Pages load nothing:
 * their Content-Security-Policy allows only the page's own inline style
 * and script (by hash) and data: images; job pages carry no script. */
#ifndef CODERQ_HTML_H
#define CODERQ_HTML_H

#include <jansson.h>

#include "coderq/common/buf.h"
#include "coderq/common/common.h"
#include "coderq/storage/artifacts.h"
#include "coderq/storage/queries.h"
#include "coderq/storage/report.h"

/** @brief Size of a page name buffer, NUL included. */
#define CQ_HTML_NAME_MAX 96

/**
 * @brief Append \p len bytes of \p s as HTML text: & < > " ' become
 *        character references; each invalid UTF-8 byte (overlongs,
 *        surrogates and truncated sequences included) becomes U+FFFD;
 *        control characters other than tab, LF and CR (U+0000 included)
 *        and DEL become their visible Unicode control pictures (U+2400..
 *        U+2421). The result is valid UTF-8 and safe in element content
 *        and in single- or double-quoted attribute values.
 * @param s Borrowed; may hold NUL bytes. NULL appends nothing.
 * @returns CQ_OK or CQ_ERR_TOO_LARGE / CQ_ERR_FATAL as cq_buf_append();
 *          on error the buffer holds a prefix of the escaped text.
 */
CQ_NODISCARD cq_err_t cq_html_escape(cq_buf_t *buf, const char *s, size_t len);

/**
 * @brief cq_html_escape() of terminal output: ANSI escape sequences
 *        (colours in tracebacks, cursor moves) are removed first.
 */
CQ_NODISCARD cq_err_t cq_html_term(cq_buf_t *buf, const char *s, size_t len);

/**
 * @brief The page name of a job: "job-" + up to 48 bytes of the id with
 *        every byte other than ASCII letters, digits, '-' and '_'
 *        replaced by '_' + "-" + the first 12 hex digits of the id's
 *        SHA-256 + ".html". Two ids that differ only in replaced bytes or
 *        in letter case get different names.
 * @param job_id Borrowed; any bytes.
 * @param out Receives the name (at most CQ_HTML_NAME_MAX bytes).
 */
void cq_html_page_name(const char *job_id, char out[CQ_HTML_NAME_MAX]);

/**
 * @brief cq_html_page_name() of \p n ids, made unique: a name given to an
 *        earlier id (the same id twice, or a digest prefix clash) gets
 *        "-2", "-3"... before ".html".
 * @param names (out) n names.
 * @returns 0, or -1 when out of memory.
 */
CQ_NODISCARD int cq_html_page_names(const char *const *job_ids,
                                    size_t n,
                                    char (*names)[CQ_HTML_NAME_MAX]);

/** @brief What every page says about its report; strings borrowed. */
typedef struct cq_html_meta {
        const char *run_id;
        const char *generated_at; /* ISO 8601 time of the report */
        const char *version;      /* coderq's version */
} cq_html_meta_t;

/**
 * @brief The index page: the run's figures (cards, and every figure under
 *        "All figures"); its models side by side (pass rate, pass@k when
 *        the run has samples, verdicts and reasons counted, tokens, cost,
 *        p50 and p95 duration); the table of its jobs; and, when some job
 *        is a sample of a problem, a grid of problems by samples coloured
 *        by verdict, each linking to its sample's page.
 *
 *        The table has a row per original job, its latest attempt (with
 *        how many there were), and by default the columns job, title,
 *        model, status, verdict (else the reason code), tests, turns,
 *        cost and duration; every other key that some row has a value
 *        for is a column too, hidden until chosen, so fields added to the
 *        rows later show up as they are. Long ids are shortened, whole on
 *        hover and in the page they link to. The inline script sorts
 *        (click a header), filters (text box, status select) and chooses
 *        columns; the page's URL fragment carries and restores the view:
 *        #q=TEXT&status=S&sort=KEY&dir=asc|desc&cols=KEY,KEY...
 * @param figures Borrowed; cq_store_report_run()'s figures (or NULL).
 *        Every key is shown; nested objects and arrays of objects as
 *        nested lists and tables.
 * @param rows Borrowed; an array of flat objects, every attempt of the
 *        run grouped by original job (cq_store_report_run()); one whose
 *        "latest" is false is an earlier attempt, with a page of its own
 *        but no row in the table.
 * @param names Borrowed; the page name of each row, in order.
 * @returns CQ_OK or CQ_ERR_TOO_LARGE / CQ_ERR_FATAL (out of memory).
 */
CQ_NODISCARD cq_err_t cq_html_index(cq_buf_t *buf,
                                    const cq_html_meta_t *meta,
                                    const json_t *figures,
                                    const json_t *rows,
                                    const char (*names)[CQ_HTML_NAME_MAX]);

/** @brief The attempts of one original job: \p n rows from \p first of
 *         cq_html_index()'s \p rows (the original, then its retries) and
 *         the page names of those rows; all borrowed. */
typedef struct cq_html_attempts {
        const json_t *rows;
        const char (*names)[CQ_HTML_NAME_MAX];
        size_t first, n;
} cq_html_attempts_t;

/**
 * @brief The attempts of the original job of row \p i of \p rows (grouped
 *        by original job, as cq_html_index() takes them): the rows around
 *        \p i with the same original.
 * @param names Borrowed; the page name of each row.
 * @param att (out) Borrows \p rows and \p names.
 */
void cq_html_attempts(const json_t *rows,
                      const char (*names)[CQ_HTML_NAME_MAX],
                      size_t i,
                      cq_html_attempts_t *att);

/**
 * @brief A job's page, linking back to ../index.html: its overview, the
 *        answer, the test report, the transcript (every message; tool
 *        calls with their code), the notebook (code, stdout, stderr,
 *        results, errors with tracebacks, images inline) and the images
 *        the notebook does not already show. Only image/png, image/jpeg,
 *        image/gif and image/svg+xml are drawn, each as a data: URI of
 *        its decoded bytes in an <img> (in which an SVG's scripts never
 *        run); other types are named, not drawn. A job tried more than
 *        once lists its attempts, each linking to its page: a retry links
 *        to its original and the original to its retries.
 * @param doc Borrowed; cq_report_job_t.doc.
 * @param images Borrowed; may be NULL.
 * @param attempts Borrowed; the attempts of the job's original job
 *        (cq_html_attempts()), or NULL.
 */
CQ_NODISCARD cq_err_t cq_html_job(cq_buf_t *buf,
                                  const cq_html_meta_t *meta,
                                  const json_t *doc,
                                  const cq_images_t *images,
                                  const cq_html_attempts_t *attempts);

#endif
