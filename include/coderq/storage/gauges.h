/* SPDX-License-Identifier: MIT */
/* gauges.h - the queue's sizes for the metrics, in one statement.
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

#endif
