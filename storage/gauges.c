/* SPDX-License-Identifier: MIT */
/* gauges.c - the queue's sizes for the worker's metrics: the totals in one
 * statement that reads only the partial indexes of queued jobs and of
 * pending and failed outbox rows, so it stays cheap however many jobs are
 * done; and each named queue's depth from the view queue_depth, which an
 * autoscaler reads too. */
#include "coderq/storage/gauges.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>

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

/* The queues with the most jobs, by name among equals; past $1 of them,
 * one row whose queue is NULL sums the others. */
static const char SQL_QUEUE_DEPTHS[] =
    "WITH d AS (SELECT queue, queued, waiting, running,"
    " row_number() OVER (ORDER BY queued + waiting + running DESC, queue)"
    " AS n FROM queue_depth)"
    " (SELECT queue, queued, waiting, running FROM d WHERE n <= $1::bigint"
    " ORDER BY n)"
    " UNION ALL SELECT NULL, sum(queued), sum(waiting), sum(running) FROM d"
    " WHERE n > $1::bigint HAVING count(*) > 0";

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

cq_err_t cq_store_queue_depths(cq_store_t *store,
                               cq_store_queue_depth_t *depths,
                               size_t max,
                               size_t *np,
                               cq_store_queue_depth_t *restp)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;
        int i;

        *np = 0;
        memset(restp, 0, sizeof(*restp));
        sp_init(&sp);
        sp_long(&sp, (long long)max);
        err = store_exec(store, "read the depth of the queues",
                         SQL_QUEUE_DEPTHS, &sp, 0, true, &res);
        if (err != CQ_OK)
                return err;
        if (PQnfields(res) != 4 || (size_t)PQntuples(res) > max + 1) {
                store_set_error(store, "could not read the depth of the "
                                       "queues: no reply");
                PQclear(res);
                return CQ_ERR_FATAL;
        }
        for (i = 0; i < PQntuples(res); i++) {
                cq_store_queue_depth_t *d = restp;

                if (!PQgetisnull(res, i, 0) && *np < max) {
                        d = &depths[(*np)++];
                        snprintf(d->queue, sizeof(d->queue), "%s",
                                 PQgetvalue(res, i, 0));
                        d->queued = d->waiting = d->running = 0;
                }
                d->queued += store_long_value(res, i, 1);
                d->waiting += store_long_value(res, i, 2);
                d->running += store_long_value(res, i, 3);
        }
        PQclear(res);
        return CQ_OK;
}
