/* SPDX-License-Identifier: MIT */
/* gauges.h - the queue's sizes for the metrics: the totals in one
 * statement, and the depth of each named queue from the view queue_depth.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_GAUGES_H
#define CODERQ_STORAGE_GAUGES_H

#include "coderq/storage/store.h"

/** @brief The queue's sizes (cq_store_gauges()). */
typedef struct cq_store_gauges {
        long long queued;         /* jobs queued */
        long long outbox_pending; /* completion events not sent yet */
        long long outbox_failed;  /* completion events failed for good */
} cq_store_gauges_t;

/** Where cq_store_gauges() stops counting. */
#define CQ_STORE_GAUGE_MAX 1000000

/**
 * @brief Count queued jobs and pending and failed outbox rows, each up to
 *        CQ_STORE_GAUGE_MAX, in one statement over partial indexes.
 * @param gauges (out) Filled on CQ_OK.
 * @returns CQ_OK, or an error with cq_store_errmsg().
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_gauges(cq_store_t *store,
                                      cq_store_gauges_t *gauges);

/** @brief The jobs of one named queue, as the view queue_depth counts
 *         them (cq_store_queue_depths()). */
typedef struct cq_store_queue_depth {
        char queue[CQ_QUEUE_NAME_MAX + 1]; /* "" for the queues summed */
        long long queued;  /* queued, a worker could claim them now */
        long long waiting; /* queued, held back (a parent not done, a
                              retry's delay) */
        long long running;
} cq_store_queue_depth_t;

/**
 * @brief The depth of at most \p max named queues, from the view
 *        queue_depth (a queue without queued or running jobs has no row):
 *        those with the most jobs, by name among equals; the jobs of the
 *        queues past \p max are summed in *\p restp.
 * @param depths (out) \p max slots; the first *\p np are filled on CQ_OK,
 *        the queues with the most jobs first.
 * @param restp (out) On CQ_OK the other queues' jobs, queue "" (all 0
 *        when there are none).
 * @returns CQ_OK, or an error with cq_store_errmsg().
 * @locality The thread that owns \p store.
 */
CQ_NODISCARD cq_err_t cq_store_queue_depths(cq_store_t *store,
                                            cq_store_queue_depth_t *depths,
                                            size_t max,
                                            size_t *np,
                                            cq_store_queue_depth_t *restp);

#endif
