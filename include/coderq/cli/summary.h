/* SPDX-License-Identifier: MIT */
/* summary.h - the figures of an evaluation run (cq_store_run_figures())
 * for people and programs: `coderq results --summary` as an aligned table,
 * JSON or CSV, the one-line summary under the results table, and the
 * depth of the queues (`coderq status`). Pure formatting, no I/O, so
 * every output has a golden test. */
#ifndef CODERQ_SUMMARY_H
#define CODERQ_SUMMARY_H

#include <jansson.h>

#include "coderq/common/buf.h"
#include "coderq/common/common.h"

typedef enum cq_summary_format {
        CQ_SUMMARY_TABLE = 0,
        CQ_SUMMARY_JSON,
        CQ_SUMMARY_CSV,
} cq_summary_format_t;

/**
 * @brief Parse "table", "json" or "csv".
 * @returns 0, or -1 for another name.
 */
CQ_NODISCARD int cq_summary_format_parse(const char *name,
                                         cq_summary_format_t *formatp);

/**
 * @brief Append the figures of a run to \p buf.
 *   - table: a title line (run, which attempts), one row per model and a
 *     TOTAL row (jobs, ok, failed, cancelled, pending, pass rate, from
 *     memory, retried, mean turns, tokens, cost, p50/p95/max duration);
 *     when the run has scored samples, their problems, samples, fewest
 *     samples of a problem, pass@1/10/100, pass^1/10/100 (each "-" where
 *     the SQL gave none), infra errors and bendable verdicts by model,
 *     with footnotes on what those leave out; the finished jobs by verdict
 *     and model; the failed and cancelled jobs by reason code and model;
 *     the run's budget when it has one; and the depth of the queues
 *     when \p figures has "queues" (cq_summary_queues()). A cost with a
 *     '*' is a lower bound: some jobs' costs are unknown (a footnote says
 *     how many).
 *   - json: the figures document as it is, indented, with a newline.
 *   - csv: RFC 4180 with CRLF line ends: a header, one line per model and
 *     one "total" line; columns run_id, attempts, group ("model" or
 *     "total"), model, every figure (those of 0006, then problems ...
 *     hidden_total), then verdict_V for each verdict the run has (in the
 *     schema's order), reason_CODE for each reason code (sorted), and
 *     queue_Q_queued, queue_Q_waiting, queue_Q_running for each queue Q
 *     of "queues" (the same on every line).
 * @param figures Borrowed; as cq_store_run_figures() returns it, with
 *        "queues" (cq_store_queue_depth() of the run) or without.
 * @returns CQ_OK; CQ_ERR_FATAL when \p figures has no "total" object;
 *          CQ_ERR_TOO_LARGE when out of memory or over the buffer's cap.
 */
CQ_NODISCARD cq_err_t cq_summary_render(const json_t *figures,
                                        cq_summary_format_t format,
                                        cq_buf_t *buf);

/**
 * @brief The depth of the named queues as an aligned table: a row per
 *        queue of \p queues (QUEUE, QUEUED, WAITING, RUNNING), or one line
 *        saying no queue holds a queued or running job when it has none.
 * @param queues Borrowed; as cq_store_queue_depth() returns them.
 * @returns CQ_OK; CQ_ERR_TOO_LARGE when out of memory or over the
 *          buffer's cap.
 */
CQ_NODISCARD cq_err_t cq_summary_queues(const json_t *queues, cq_buf_t *buf);

/**
 * @brief The line under `coderq results`'s table, from a "total" object:
 *        "N jobs: N succeeded (N from memory), N failed, N cancelled, N
 *        pending; N retried; pass rate P; mean T turns, R retries; N
 *        tokens; cost C; duration p50 D, p95 D\n".
 */
CQ_NODISCARD cq_err_t cq_summary_line(const json_t *total, cq_buf_t *buf);

#endif
