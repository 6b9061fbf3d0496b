/* SPDX-License-Identifier: MIT */
/* gauges.c - the queue's sizes for the worker's metrics, in one statement
 * that reads only the partial indexes of queued jobs and of pending and
 * failed outbox rows, so it stays cheap however many jobs are done. */
#include "coderq/storage/gauges.h"

#include <libpq-fe.h>
#include <stdio.h>

#include "store_int.h"

/* Counts stop at $1: a count is an index scan, and past a million rows
 * the number only says "very many". */
static const char SQL_GAUGES[] =
    "SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE status = "
    "'queued' LIMIT $1::bigint) q),"
    " (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE sent_at IS NULL AND"
    " failed_at IS NULL LIMIT $1::bigint) p),"
    " (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE failed_at IS NOT"
    " NULL LIMIT $1::bigint) f)";

cq_err_t cq_store_gauges(cq_store_t *store, cq_store_gauges_t *gauges)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;

        sp_init(&sp);
        sp_long(&sp, CQ_STORE_GAUGE_MAX);
        err = store_exec(store, "count the queue", SQL_GAUGES, &sp, 0, true,
                         &res);
        if (err != CQ_OK)
                return err;
        if (PQntuples(res) != 1 || PQnfields(res) != 3) {
                store_set_error(store, "could not count the queue: no reply");
                PQclear(res);
                return CQ_ERR_FATAL;
        }
        gauges->queued = store_long_value(res, 0, 0);
        gauges->outbox_pending = store_long_value(res, 0, 1);
        gauges->outbox_failed = store_long_value(res, 0, 2);
        PQclear(res);
        return CQ_OK;
}
