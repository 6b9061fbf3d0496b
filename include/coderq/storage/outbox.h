/* SPDX-License-Identifier: MIT */
/* outbox.h - the transactional outbox of completion events: the
 * relay's claim, sent and failed marks, and the status queries.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_OUTBOX_H
#define CODERQ_STORAGE_OUTBOX_H

#include "coderq/storage/store.h"

/** @brief One outbox row. Release with cq_outbox_release(). */
typedef struct cq_outbox_row {
        char event_id[37]; /* uuid text */
        char *topic;
        char *key;
        char *payload; /* JSON text */
        int attempts;  /* claims so far, this one included */
} cq_outbox_row_t;

typedef struct cq_outbox {
        cq_outbox_row_t *v;
        size_t n;
} cq_outbox_t;

void cq_outbox_init(cq_outbox_t *box);
void cq_outbox_release(cq_outbox_t *box);

/** @brief Up to \p max rows neither sent nor failed, oldest first,
 *         claimed or not (a look, not a claim). \p box: initialised. */
CQ_NODISCARD cq_err_t cq_store_outbox_fetch(cq_store_t *store,
                                            size_t max,
                                            cq_outbox_t *box);

/**
 * @brief Claim up to \p max rows for relay \p relay_id, oldest first: rows
 *        neither sent nor failed whose claim is free or expired (and whose
 *        backoff has passed), locked with FOR UPDATE SKIP LOCKED so two
 *        relays never claim the same row. The claim lasts \p lease_ms and
 *        counts an attempt. \p box: initialised.
 */
CQ_NODISCARD cq_err_t cq_store_outbox_claim(cq_store_t *store,
                                            const char *relay_id,
                                            size_t max,
                                            long lease_ms,
                                            cq_outbox_t *box);

/** @brief Mark rows sent (after their successful delivery reports), in
 *         one statement, whoever holds their claim; ids already marked
 *         are left as they are. */
CQ_NODISCARD cq_err_t cq_store_outbox_mark_sent(cq_store_t *store,
                                                const char *const *event_ids,
                                                size_t n);

/**
 * @brief Give up \p relay_id's claim on rows whose delivery failed for a
 *        reason a retry can fix, recording \p error: they are claimable
 *        again after a backoff that doubles with each attempt, from
 *        \p backoff_ms up to \p backoff_max_ms.
 */
CQ_NODISCARD cq_err_t cq_store_outbox_release(cq_store_t *store,
                                              const char *relay_id,
                                              const char *const *event_ids,
                                              size_t n,
                                              const char *error,
                                              long backoff_ms,
                                              long backoff_max_ms);

/** @brief Mark an unsent row failed for good with \p error: no relay
 *         claims it again. */
CQ_NODISCARD cq_err_t cq_store_outbox_mark_failed(cq_store_t *store,
                                                  const char *event_id,
                                                  const char *error);

/**
 * @brief The outbox for people: *\p objp = {"pending", "claimed", "sent",
 *        "failed" counts, "oldest_pending" (timestamp or null), "failed_rows":
 *        [{event_id, job_id, topic, attempts, error, failed_at}] (the
 *        \p max_failed most recent)}.
 * @returns Caller owns *\p objp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_outbox_summary(cq_store_t *store,
                                              size_t max_failed,
                                              json_t **objp);

/**
 * @brief One job's completion events: *\p arrp = [{event_id, topic,
 *        state ("pending", "sent" or "failed"), attempts, error, sent_at,
 *        failed_at}], oldest first (empty when it has none).
 * @returns Caller owns *\p arrp (json_decref).
 */
CQ_NODISCARD cq_err_t cq_store_outbox_job(cq_store_t *store,
                                          const char *job_id,
                                          json_t **arrp);

#endif
