/* SPDX-License-Identifier: MIT */
/* outbox.c - the transactional outbox of completion events: rows are
 * written by the finishing transaction (queue.c); here the relay claims
 * them (one relay per row at a time), marks them sent, releases them with
 * a backoff or fails them for good, and the CLI reads their state. */
#include "coderq/storage/outbox.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_int.h"

static const char SQL_OUTBOX_FETCH[] =
    "SELECT event_id::text, topic, key, payload::text, attempts FROM outbox"
    " WHERE sent_at IS NULL AND failed_at IS NULL ORDER BY seq LIMIT $1";

/* A row belongs to one relay while its claim runs: SKIP LOCKED keeps two
 * relays claiming at once apart, claimed_until keeps a later claim off a
 * row whose delivery is still in flight. A released row's backoff is in
 * claimed_until too (with claimed_by NULL). */
static const char SQL_OUTBOX_CLAIM[] =
    "WITH next AS ("
    " SELECT event_id FROM outbox"
    " WHERE sent_at IS NULL AND failed_at IS NULL"
    "  AND (claimed_until IS NULL OR claimed_until < now())"
    " ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED),"
    " claimed AS ("
    " UPDATE outbox o SET claimed_by = $1,"
    "  claimed_until = now() + make_interval(secs => $3::float8 / 1000),"
    "  attempts = o.attempts + 1"
    " FROM next WHERE o.event_id = next.event_id"
    " RETURNING o.event_id, o.seq, o.topic, o.key, o.payload, o.attempts)"
    " SELECT event_id::text, topic, key, payload::text, attempts"
    " FROM claimed ORDER BY seq";

static const char SQL_OUTBOX_SENT[] =
    "UPDATE outbox SET sent_at = now(), failed_at = NULL, error = NULL,"
    " claimed_by = NULL, claimed_until = NULL"
    " WHERE event_id = ANY ($1::uuid[]) AND sent_at IS NULL";

static const char SQL_OUTBOX_RELEASE[] =
    "UPDATE outbox SET claimed_by = NULL, error = $3,"
    " claimed_until = now() + make_interval(secs => LEAST($5::float8,"
    "  $4::float8 * power(2, LEAST(GREATEST(attempts - 1, 0), 30))) / 1000)"
    " WHERE event_id = ANY ($2::uuid[]) AND claimed_by = $1"
    "  AND sent_at IS NULL AND failed_at IS NULL";

static const char SQL_OUTBOX_FAILED[] =
    "UPDATE outbox SET failed_at = now(), error = $2, claimed_by = NULL,"
    " claimed_until = NULL"
    " WHERE event_id = $1::uuid AND sent_at IS NULL AND failed_at IS NULL";

static const char SQL_OUTBOX_SUMMARY[] =
    "SELECT json_build_object("
    " 'pending', count(*) FILTER (WHERE sent_at IS NULL"
    "  AND failed_at IS NULL),"
    " 'claimed', count(*) FILTER (WHERE sent_at IS NULL AND failed_at IS NULL"
    "  AND claimed_by IS NOT NULL AND claimed_until >= now()),"
    " 'sent', count(*) FILTER (WHERE sent_at IS NOT NULL),"
    " 'failed', count(*) FILTER (WHERE failed_at IS NOT NULL),"
    " 'oldest_pending', min(created_at) FILTER (WHERE sent_at IS NULL"
    "  AND failed_at IS NULL),"
    " 'failed_rows', COALESCE((SELECT json_agg(f) FROM ("
    "   SELECT event_id, job_id, topic, attempts, error, failed_at"
    "   FROM outbox WHERE failed_at IS NOT NULL"
    "   ORDER BY failed_at DESC, seq DESC LIMIT $1) f), '[]'::json))::text"
    " FROM outbox";

static const char SQL_OUTBOX_JOB[] =
    "SELECT COALESCE(json_agg(json_build_object("
    " 'event_id', event_id, 'topic', topic,"
    " 'state', CASE WHEN sent_at IS NOT NULL THEN 'sent'"
    "          WHEN failed_at IS NOT NULL THEN 'failed' ELSE 'pending' END,"
    " 'attempts', attempts, 'error', error, 'sent_at', sent_at,"
    " 'failed_at', failed_at) ORDER BY seq), '[]'::json)::text"
    " FROM outbox WHERE job_id = $1";

void cq_outbox_init(cq_outbox_t *box) { memset(box, 0, sizeof(*box)); }

void cq_outbox_release(cq_outbox_t *box)
{
        size_t i;

        for (i = 0; i < box->n; i++) {
                free(box->v[i].topic);
                free(box->v[i].key);
                free(box->v[i].payload);
        }
        free(box->v);
        cq_outbox_init(box);
}

/* Read the rows of an outbox statement: event_id, topic, key, payload,
 * attempts. */
static cq_err_t outbox_rows(cq_store_t *store,
                            const char *what,
                            const char *sql,
                            const store_params_t *sp,
                            bool retry_safe,
                            cq_outbox_t *box)
{
        PGresult *res = NULL;
        cq_err_t err;
        bool oom = false;
        int row, n;

        err = store_exec(store, what, sql, sp, 0, retry_safe, &res);
        if (err != CQ_OK)
                goto out;
        n = PQntuples(res);
        if (n == 0)
                goto out;
        box->v = calloc((size_t)n, sizeof(*box->v));
        if (!box->v) {
                oom = true;
                goto out;
        }
        for (row = 0; row < n; row++) {
                cq_outbox_row_t *r = &box->v[row];

                snprintf(r->event_id, sizeof(r->event_id), "%s",
                         PQgetvalue(res, row, 0));
                r->topic = store_strdup_value(res, row, 1, &oom);
                r->key = store_strdup_value(res, row, 2, &oom);
                r->payload = store_strdup_value(res, row, 3, &oom);
                r->attempts = (int)store_long_value(res, row, 4);
                box->n++;
        }
out:
        if (oom) {
                store_set_error(store, "could not %s: out of memory", what);
                cq_outbox_release(box);
                err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

cq_err_t cq_store_outbox_fetch(cq_store_t *store, size_t max, cq_outbox_t *box)
{
        store_params_t sp;

        sp_init(&sp);
        sp_long(&sp, (long long)(max > INT_MAX ? INT_MAX : max));
        return outbox_rows(store, "read the outbox", SQL_OUTBOX_FETCH, &sp,
                           true, box);
}

cq_err_t cq_store_outbox_claim(cq_store_t *store,
                               const char *relay_id,
                               size_t max,
                               long lease_ms,
                               cq_outbox_t *box)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, relay_id);
        sp_long(&sp, (long long)(max > INT_MAX ? INT_MAX : max));
        sp_long(&sp, lease_ms);
        /* Not run again after a reconnect: a claim whose reply was lost
         * holds its rows until the lease expires. */
        return outbox_rows(store, "claim outbox rows", SQL_OUTBOX_CLAIM, &sp,
                           false, box);
}

cq_err_t cq_store_outbox_mark_sent(cq_store_t *store,
                                   const char *const *event_ids,
                                   size_t n)
{
        store_params_t sp;
        char *ids;
        cq_err_t err;

        if (n == 0)
                return CQ_OK;
        ids = store_text_array(store, event_ids, n);
        if (!ids)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, ids);
        err = store_exec(store, "mark outbox rows sent", SQL_OUTBOX_SENT, &sp,
                         0, true, NULL);
        free(ids);
        return err;
}

cq_err_t cq_store_outbox_release(cq_store_t *store,
                                 const char *relay_id,
                                 const char *const *event_ids,
                                 size_t n,
                                 const char *error,
                                 long backoff_ms,
                                 long backoff_max_ms)
{
        store_params_t sp;
        char *ids;
        cq_err_t err;

        if (n == 0)
                return CQ_OK;
        ids = store_text_array(store, event_ids, n);
        if (!ids)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, relay_id);
        sp_text(&sp, ids);
        sp_text(&sp, error);
        sp_long(&sp, backoff_ms);
        sp_long(&sp, backoff_max_ms);
        err = store_exec(store, "release outbox rows", SQL_OUTBOX_RELEASE, &sp,
                         0, true, NULL);
        free(ids);
        return err;
}

cq_err_t cq_store_outbox_mark_failed(cq_store_t *store,
                                     const char *event_id,
                                     const char *error)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, event_id);
        sp_text(&sp, error);
        return store_exec(store, "mark an outbox row failed", SQL_OUTBOX_FAILED,
                          &sp, 0, true, NULL);
}

/* One JSON text value from a statement with one row. */
static cq_err_t outbox_json(cq_store_t *store,
                            const char *what,
                            const char *sql,
                            const store_params_t *sp,
                            json_t **docp)
{
        PGresult *res = NULL;
        cq_err_t err;

        *docp = NULL;
        err = store_exec(store, what, sql, sp, 0, true, &res);
        if (err != CQ_OK)
                return err;
        if (PQntuples(res) == 1)
                *docp = store_json_value(store, res, 0, 0, what);
        if (!*docp) {
                if (PQntuples(res) != 1)
                        store_set_error(store, "could not %s: no reply", what);
                err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

cq_err_t
cq_store_outbox_summary(cq_store_t *store, size_t max_failed, json_t **objp)
{
        store_params_t sp;

        sp_init(&sp);
        sp_long(&sp, (long long)(max_failed > INT_MAX ? INT_MAX : max_failed));
        return outbox_json(store, "read the outbox summary", SQL_OUTBOX_SUMMARY,
                           &sp, objp);
}

cq_err_t
cq_store_outbox_job(cq_store_t *store, const char *job_id, json_t **arrp)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, job_id);
        return outbox_json(store, "read a job's completion events",
                           SQL_OUTBOX_JOB, &sp, arrp);
}
