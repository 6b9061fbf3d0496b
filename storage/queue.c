/* SPDX-License-Identifier: MIT */
/* queue.c - the job queue: idempotent upsert from the intake, claim with
 * FOR UPDATE SKIP LOCKED under a lease, heartbeat, the reaper that
 * requeues expired leases, release on shutdown, finishing in one
 * transaction with the outbox row, and cancel. No lock or transaction is
 * ever held while a job runs: only the lease columns. */
#include "coderq/storage/queue.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_int.h"

static const char SQL_UPSERT[] =
    "INSERT INTO jobs (job_id, prompt, title, task_id, run_id,"
    " parent_job_id, priority, spec, max_attempts, source_topic,"
    " source_partition, source_offset, retry_of, run_attempt, queue,"
    " problem_id, sample_index)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12,"
    " $13, $14, COALESCE($15, 'default'), $16, $17)"
    " ON CONFLICT (job_id) DO NOTHING RETURNING 1";

/* The batch form: one JSON array of jobs, rows in array order, each with
 * its own clock_timestamp() so the queue keeps that order. */
static const char SQL_UPSERT_MANY[] =
    "INSERT INTO jobs (job_id, prompt, title, task_id, run_id,"
    " parent_job_id, priority, spec, max_attempts, source_topic,"
    " source_partition, source_offset, created_at, retry_of, run_attempt,"
    " queue, problem_id, sample_index)"
    " SELECT r.job_id, r.prompt, r.title, r.task_id, r.run_id,"
    "  r.parent_job_id, r.priority, r.spec, $2, r.source_topic,"
    "  r.source_partition, r.source_offset, clock_timestamp(), r.retry_of,"
    "  r.run_attempt, COALESCE(r.queue, 'default'), r.problem_id,"
    "  r.sample_index"
    " FROM jsonb_to_recordset($1::jsonb) AS r (job_id text, prompt text,"
    "  title text, task_id text, run_id text, parent_job_id text,"
    "  priority int, spec jsonb, source_topic text, source_partition int,"
    "  source_offset bigint, retry_of text, run_attempt int, queue text,"
    "  problem_id text, sample_index int)"
    " ON CONFLICT (job_id) DO NOTHING RETURNING job_id";

/* The parent check is inside the locked subquery, so a child becomes
 * claimable in the same statement that sees its parent succeeded. It is a
 * scalar subquery on purpose: an EXISTS under OR is planned as a hashed
 * subplan that scans every succeeded job, where this is one index probe.
 * One locked subquery per queue, each reading jobs_claim_idx in order and
 * stopping at its first free job, and the best of those wins: given the
 * array whole (queue = ANY), PostgreSQL cannot read that index in order
 * and sorts every queued job instead. A worker of several queues locks
 * the head of each of them for the instant of the claim; a claim running
 * beside it skips those as it skips any job being claimed. */
static const char SQL_CLAIM[] =
    "WITH next AS ("
    " SELECT c.job_id FROM unnest($3::text[]) AS q (name)"
    " CROSS JOIN LATERAL ("
    "  SELECT j.job_id, j.priority, j.created_at FROM jobs j"
    "  WHERE j.status = 'queued' AND j.queue = q.name"
    "   AND j.run_after <= now() AND j.attempts < j.max_attempts"
    "   AND (j.parent_job_id IS NULL OR (SELECT p.status FROM jobs p"
    "        WHERE p.job_id = j.parent_job_id) = 'succeeded')"
    "  ORDER BY j.priority DESC, j.created_at, j.job_id"
    "  LIMIT 1 FOR UPDATE OF j SKIP LOCKED) AS c"
    " ORDER BY c.priority DESC, c.created_at, c.job_id"
    " LIMIT 1)"
    " UPDATE jobs SET status = 'running', lease_owner = $1,"
    "  lease_until = now() + make_interval(secs => $2::int),"
    "  heartbeat_at = now(), attempts = jobs.attempts + 1,"
    "  started_at = COALESCE(jobs.started_at, now()), updated_at = now()"
    " FROM next WHERE jobs.job_id = next.job_id"
    " RETURNING jobs.job_id, jobs.spec::text, jobs.attempts,"
    "  EXISTS (SELECT 1 FROM job_messages m WHERE m.job_id = jobs.job_id)"
    "  OR EXISTS (SELECT 1 FROM cells c WHERE c.job_id = jobs.job_id),"
    "  jobs.max_attempts, jobs.retries, jobs.run_ms, jobs.prompt_tokens,"
    "  jobs.completion_tokens, jobs.cache_read_tokens,"
    "  jobs.cache_creation_tokens, jobs.cost_usd::float8,"
    "  EXISTS (SELECT 1 FROM runs r WHERE r.run_id = jobs.run_id"
    "   AND r.budget_usd IS NOT NULL)";

static const char SQL_HEARTBEAT[] =
    "UPDATE jobs SET lease_until = now() + make_interval(secs => $2::int),"
    " heartbeat_at = now()"
    " WHERE status = 'running' AND lease_owner = $1"
    "  AND job_id = ANY ($3::text[])"
    " RETURNING job_id";

static const char SQL_REQUEUE[] =
    "WITH expired AS ("
    " SELECT job_id FROM jobs WHERE status = 'running' AND lease_until < now()"
    " FOR UPDATE SKIP LOCKED)"
    " UPDATE jobs j SET"
    "  status = CASE WHEN j.cancel_requested THEN 'cancelled'"
    "           WHEN j.attempts >= j.max_attempts THEN 'failed'"
    "           ELSE 'queued' END,"
    "  finished_at = CASE WHEN j.cancel_requested"
    "                OR j.attempts >= j.max_attempts THEN now() END,"
    "  finished_by = CASE WHEN j.cancel_requested"
    "                OR j.attempts >= j.max_attempts THEN j.lease_owner END,"
    "  reason = CASE WHEN j.cancel_requested"
    "           THEN 'cancelled; its worker lost the lease'"
    "           WHEN j.attempts >= j.max_attempts"
    "           THEN format('lease expired after %s attempts (last worker %s)',"
    "                       j.attempts, j.lease_owner)"
    "           ELSE j.reason END,"
    "  reason_code = CASE WHEN j.cancel_requested THEN 'cancelled'"
    "                WHEN j.attempts >= j.max_attempts THEN 'attempts'"
    "                ELSE j.reason_code END,"
    /* workers that died with it: never the model's doing */
    "  verdict = CASE WHEN NOT j.cancel_requested"
    "            AND j.attempts >= j.max_attempts THEN 'infra_error' END,"
    "  error = format('lease of worker %s expired at %s', j.lease_owner,"
    "                 j.lease_until),"
    "  lease_owner = NULL, lease_until = NULL, run_after = now(),"
    "  updated_at = now()"
    " FROM expired WHERE j.job_id = expired.job_id"
    " RETURNING j.job_id, j.status";

static const char SQL_ORPHANS[] =
    "UPDATE jobs c SET status = 'failed', finished_at = now(),"
    " updated_at = now(),"
    " reason = format('parent job %s %s', p.job_id, p.status),"
    " reason_code = 'parent', verdict = 'infra_error'"
    " FROM jobs p"
    " WHERE c.status = 'queued' AND c.parent_job_id = p.job_id"
    "  AND p.status IN ('failed', 'cancelled')"
    " RETURNING c.job_id";

/* A child whose parent never arrived: the parent's message may come after
 * the child's (another partition), but not forever. Like an orphan, it
 * never ran: not the model's doing, so out of the scores. */
static const char SQL_NO_PARENT[] =
    "UPDATE jobs c SET status = 'failed', finished_at = now(),"
    " updated_at = now(),"
    " reason = format('parent job %s does not exist after %s s',"
    "                 c.parent_job_id, $1::int), reason_code = 'parent',"
    " verdict = 'infra_error'"
    " WHERE c.status = 'queued' AND c.parent_job_id IS NOT NULL"
    "  AND c.created_at < now() - make_interval(secs => $1::int)"
    "  AND NOT EXISTS (SELECT 1 FROM jobs p WHERE p.job_id = c.parent_job_id)"
    " RETURNING c.job_id";

static const char SQL_EVENTS[] =
    "INSERT INTO outbox (job_id, topic, key, payload)"
    " SELECT id, $1, id, coderq_completion_event(id)"
    " FROM unnest($2::text[]) AS t (id)"
    " ON CONFLICT (job_id, topic) DO NOTHING";

static const char SQL_RELEASE[] =
    "UPDATE jobs SET status = 'queued', lease_owner = NULL,"
    " lease_until = NULL, attempts = GREATEST(attempts - 1, 0),"
    " run_after = now(), updated_at = now()"
    " WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'"
    " RETURNING 1";

/* The attempt counts: this is a failed try, not a shutdown. */
static const char SQL_RETRY_LATER[] =
    "UPDATE jobs SET status = 'queued', lease_owner = NULL,"
    " lease_until = NULL, error = $3,"
    " run_after = now() + make_interval(secs => $4::double precision / 1000),"
    " updated_at = now()"
    " WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'"
    "  AND attempts < max_attempts"
    " RETURNING 1";

static const char SQL_SET_RETRIES[] =
    "UPDATE jobs SET retries = $3"
    " WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'"
    " RETURNING 1";

static const char SQL_NOTEBOOK[] =
    "INSERT INTO notebooks (job_id, doc, bytes, ncells)"
    " VALUES ($1, $2::jsonb, $3, $4)"
    " ON CONFLICT (job_id) DO UPDATE SET doc = EXCLUDED.doc,"
    " bytes = EXCLUDED.bytes, ncells = EXCLUDED.ncells, updated_at = now()";

/* One statement: see coderq_finish() in migrations/0007_evaluation.sql. */
static const char SQL_FINISH[] =
    "SELECT coderq_finish($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,"
    " $12::numeric, $13, $14, $15, $16::jsonb, $17::jsonb, $18, $19, $20,"
    " $21, $22, $23)";

/* After each LLM call: the job's usage so far, its cost (NULL: unknown),
 * and the run budget it held for the call released. */
static const char SQL_USAGE[] =
    "UPDATE jobs SET prompt_tokens = $3, completion_tokens = $4,"
    " cache_read_tokens = $5, cache_creation_tokens = $6,"
    " cost_usd = $7::numeric, budget_hold_usd = 0, updated_at = now()"
    " WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'"
    " RETURNING 1";

/* See coderq_budget_reserve() in migrations/0006_eval_runs.sql. */
static const char SQL_RESERVE[] =
    "SELECT outcome, budget_usd::float8, spent_usd::float8, held_usd::float8"
    " FROM coderq_budget_reserve($1, $2, $3::numeric)";

static const char SQL_CANCEL_LOCK[] =
    "SELECT status FROM jobs WHERE job_id = $1 FOR UPDATE";

static const char SQL_CANCEL_QUEUED[] =
    "UPDATE jobs SET status = 'cancelled', cancel_requested = true,"
    " finished_at = now(), updated_at = now(),"
    " reason = 'cancelled before it started', reason_code = 'cancelled'"
    " WHERE job_id = $1";

static const char SQL_CANCEL_RUNNING[] =
    "UPDATE jobs SET cancel_requested = true, updated_at = now()"
    " WHERE job_id = $1";

static const char SQL_CANCEL_POLL[] =
    "SELECT job_id FROM jobs"
    " WHERE job_id = ANY ($1::text[]) AND lease_owner = $2"
    "  AND status = 'running' AND cancel_requested";

static int clamp_int(long long v)
{
        if (v > INT_MAX)
                return INT_MAX;
        if (v < INT_MIN)
                return INT_MIN;
        return (int)v;
}

cq_err_t cq_store_upsert_job(cq_store_t *store,
                             const cq_job_t *job,
                             const cq_job_src_t *src,
                             bool *createdp)
{
        store_params_t sp;
        PGresult *res = NULL;
        char *spec = NULL;
        cq_err_t err;

        if (createdp)
                *createdp = false;
        if (!job->job_id || !job->prompt || !job->spec) {
                store_set_error(store, "could not store job: job_id, prompt "
                                       "and spec are required");
                return CQ_ERR_FATAL;
        }
        spec = store_dump(store, job->spec, NULL);
        if (!spec)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, job->job_id);
        sp_text(&sp, job->prompt);
        sp_text(&sp, job->title);
        sp_text(&sp, job->task_id);
        sp_text(&sp, job->run_id);
        sp_text(&sp, job->parent_job_id);
        sp_long(&sp, clamp_int(job->priority));
        sp_text(&sp, spec);
        sp_long(&sp, store->opts.max_attempts);
        if (src && src->topic) {
                sp_text(&sp, src->topic);
                sp_long(&sp, src->partition);
                sp_long(&sp, src->offset);
        } else {
                sp_text(&sp, NULL);
                sp_text(&sp, NULL);
                sp_text(&sp, NULL);
        }
        sp_text(&sp, job->retry_of);
        sp_long(&sp, job->run_attempt > 1 ? job->run_attempt : 1);
        sp_text(&sp, job->queue);
        sp_text(&sp, job->problem_id);
        if (job->problem_id)
                sp_long(&sp, job->sample_index);
        else
                sp_text(&sp, NULL);
        err = store_exec(store, "store job", SQL_UPSERT, &sp, 0, true, &res);
        if (err == CQ_OK && createdp)
                *createdp = PQntuples(res) == 1;
        PQclear(res);
        free(spec);
        return err;
}

static const char SQL_JOB_DIFFERS[] =
    "SELECT spec <> $2::jsonb FROM jobs WHERE job_id = $1";

cq_err_t
cq_store_job_differs(cq_store_t *store, const cq_job_t *job, bool *differsp)
{
        store_params_t sp;
        PGresult *res = NULL;
        char *spec;
        cq_err_t err;

        *differsp = false;
        if (!job->job_id || !job->spec) {
                store_set_error(store, "could not compare job: job_id and "
                                       "spec are required");
                return CQ_ERR_FATAL;
        }
        spec = store_dump(store, job->spec, NULL);
        if (!spec)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, job->job_id);
        sp_text(&sp, spec);
        err = store_exec(store, "compare job", SQL_JOB_DIFFERS, &sp, 0, true,
                         &res);
        if (err == CQ_OK && PQntuples(res) == 1)
                *differsp = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        PQclear(res);
        free(spec);
        return err;
}

/* The batch as the JSON array SQL_UPSERT_MANY reads; NULL when out of
 * memory. Absent optional fields are JSON nulls, i.e. SQL NULLs. */
static json_t *upsert_rows(const cq_job_upsert_t *v, size_t n)
{
        json_t *rows = json_array();
        size_t i;

        for (i = 0; rows && i < n; i++) {
                const cq_job_t *job = v[i].job;
                const cq_job_src_t *src = v[i].src;
                json_t *row = json_pack(
                    "{s:s, s:s, s:s?, s:s?, s:s?, s:s?, s:I, s:O, s:s?, s:I,"
                    " s:s?, s:s?}",
                    "job_id", job->job_id, "prompt", job->prompt, "title",
                    job->title, "task_id", job->task_id, "run_id", job->run_id,
                    "parent_job_id", job->parent_job_id, "priority",
                    (json_int_t)clamp_int(job->priority), "spec", job->spec,
                    "retry_of", job->retry_of, "run_attempt",
                    (json_int_t)(job->run_attempt > 1 ? job->run_attempt : 1),
                    "queue", job->queue, "problem_id", job->problem_id);

                if (row && job->problem_id &&
                    json_object_set_new(row, "sample_index",
                                        json_integer(job->sample_index))) {
                        json_decref(row);
                        row = NULL;
                }

                if (row && src && src->topic &&
                    (json_object_set_new(row, "source_topic",
                                         json_string(src->topic)) ||
                     json_object_set_new(row, "source_partition",
                                         json_integer(src->partition)) ||
                     json_object_set_new(row, "source_offset",
                                         json_integer(src->offset)))) {
                        json_decref(row);
                        row = NULL;
                }
                if (!row || json_array_append_new(rows, row)) {
                        json_decref(rows);
                        rows = NULL;
                }
        }
        return rows;
}

cq_err_t cq_store_upsert_jobs(cq_store_t *store, cq_job_upsert_t *v, size_t n)
{
        store_params_t sp;
        PGresult *res = NULL;
        json_t *rows;
        char *text = NULL;
        cq_err_t err;
        size_t i;
        int r;

        for (i = 0; i < n; i++) {
                v[i].created = false;
                if (!v[i].job->job_id || !v[i].job->prompt || !v[i].job->spec) {
                        store_set_error(store, "could not store jobs: job_id, "
                                               "prompt and spec are required");
                        return CQ_ERR_FATAL;
                }
        }
        if (n == 0)
                return CQ_OK;
        rows = upsert_rows(v, n);
        text = rows ? store_dump(store, rows, NULL) : NULL;
        json_decref(rows);
        if (!text) {
                store_set_error(store, "could not store jobs: out of memory");
                return CQ_ERR_FATAL;
        }
        sp_init(&sp);
        sp_text(&sp, text);
        sp_long(&sp, store->opts.max_attempts);
        err = store_exec(store, "store jobs", SQL_UPSERT_MANY, &sp, 0, true,
                         &res);
        free(text);
        if (err != CQ_OK)
                return err;
        /* Which ones were created: each returned id marks the first job
         * with that id (a repeated id in the batch is a duplicate). */
        for (r = 0; r < PQntuples(res); r++) {
                const char *id = PQgetvalue(res, r, 0);

                for (i = 0; i < n; i++) {
                        if (!v[i].created &&
                            strcmp(v[i].job->job_id, id) == 0) {
                                v[i].created = true;
                                break;
                        }
                }
        }
        PQclear(res);
        return CQ_OK;
}

void cq_claim_init(cq_claim_t *claim) { memset(claim, 0, sizeof(*claim)); }

void cq_claim_release(cq_claim_t *claim)
{
        free(claim->job_id);
        json_decref(claim->spec);
        cq_claim_init(claim);
}

cq_err_t cq_store_claim(cq_store_t *store, cq_claim_t *claim, bool *foundp)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;
        bool oom = false;

        *foundp = false;
        sp_init(&sp);
        sp_text(&sp, store->owner);
        sp_long(&sp, store->opts.lease_s);
        sp_text(&sp, store->queues);
        err = store_exec(store, "claim a job", SQL_CLAIM, &sp, 0, false, &res);
        if (err != CQ_OK || PQntuples(res) == 0)
                goto out;
        claim->job_id = store_strdup_value(res, 0, 0, &oom);
        claim->spec = store_json_value(store, res, 0, 1, "job spec");
        claim->attempt = (int)store_long_value(res, 0, 2);
        claim->has_checkpoint = PQgetvalue(res, 0, 3)[0] == 't';
        claim->max_attempts = (int)store_long_value(res, 0, 4);
        claim->retries = (int)store_long_value(res, 0, 5);
        claim->run_ms = (int64_t)store_long_value(res, 0, 6);
        claim->usage.prompt_tokens = (int64_t)store_long_value(res, 0, 7);
        claim->usage.completion_tokens = (int64_t)store_long_value(res, 0, 8);
        claim->usage.cache_read_tokens = (int64_t)store_long_value(res, 0, 9);
        claim->usage.cache_creation_tokens =
            (int64_t)store_long_value(res, 0, 10);
        claim->cost_usd =
            PQgetisnull(res, 0, 11) ? -1 : strtod(PQgetvalue(res, 0, 11), NULL);
        claim->run_budget = PQgetvalue(res, 0, 12)[0] == 't';
        if (oom || !claim->spec) {
                /* The lease stays and expires: the job is not lost. */
                if (oom)
                        store_set_error(store, "could not claim a job: out "
                                               "of memory");
                cq_claim_release(claim);
                err = CQ_ERR_FATAL;
                goto out;
        }
        *foundp = true;
out:
        PQclear(res);
        return err;
}

cq_err_t cq_store_heartbeat(cq_store_t *store,
                            const char *const *job_ids,
                            size_t n,
                            bool *lost,
                            size_t *nlostp)
{
        store_params_t sp;
        PGresult *res = NULL;
        char *ids = NULL;
        size_t i, nlost = 0;
        cq_err_t err = CQ_ERR_FATAL;
        int row;

        if (nlostp)
                *nlostp = 0;
        if (n == 0)
                return CQ_OK;
        ids = store_text_array(store, job_ids, n);
        if (!ids)
                goto out;
        sp_init(&sp);
        sp_text(&sp, store->owner);
        sp_long(&sp, store->opts.lease_s);
        sp_text(&sp, ids);
        err = store_exec(store, "renew leases", SQL_HEARTBEAT, &sp, 0, true,
                         &res);
        if (err != CQ_OK)
                goto out;
        for (i = 0; i < n; i++) {
                lost[i] = true;
                for (row = 0; row < PQntuples(res); row++) {
                        if (strcmp(PQgetvalue(res, row, 0), job_ids[i]) == 0) {
                                lost[i] = false;
                                break;
                        }
                }
                nlost += lost[i];
        }
        if (nlostp)
                *nlostp = nlost;
out:
        PQclear(res);
        free(ids);
        return err;
}

/* Queue the completion events of \p ids (inside the caller's
 * transaction). */
static cq_err_t
queue_events(cq_store_t *store, const char *const *ids, size_t n)
{
        store_params_t sp;
        char *arr;
        cq_err_t err;

        if (n == 0)
                return CQ_OK;
        arr = store_text_array(store, ids, n);
        if (!arr)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, store->topic);
        sp_text(&sp, arr);
        err = store_exec(store, "queue completion events", SQL_EVENTS, &sp, 0,
                         false, NULL);
        free(arr);
        return err;
}

cq_err_t
cq_store_requeue_expired(cq_store_t *store, int *requeuedp, int *failedp)
{
        PGresult *res = NULL, *orphans = NULL, *unborn = NULL;
        store_params_t sp;
        const char **failed = NULL;
        size_t nfailed = 0;
        int requeued = 0, row;
        cq_err_t err;

        if (requeuedp)
                *requeuedp = 0;
        if (failedp)
                *failedp = 0;
        err = store_begin(store, "requeue expired leases");
        if (err != CQ_OK)
                return err;
        err = store_exec(store, "requeue expired leases", SQL_REQUEUE, NULL, 0,
                         false, &res);
        if (err == CQ_OK)
                err = store_exec(store, "fail jobs whose parent failed",
                                 SQL_ORPHANS, NULL, 0, false, &orphans);
        if (err == CQ_OK) {
                sp_init(&sp);
                sp_long(&sp, store->opts.parent_wait_s);
                err = store_exec(store, "fail jobs whose parent never came",
                                 SQL_NO_PARENT, &sp, 0, false, &unborn);
        }
        if (err != CQ_OK)
                goto out;
        failed = calloc((size_t)PQntuples(res) + (size_t)PQntuples(orphans) +
                            (size_t)PQntuples(unborn) + 1,
                        sizeof(*failed));
        if (!failed) {
                store_set_error(store, "could not requeue expired leases: "
                                       "out of memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        for (row = 0; row < PQntuples(res); row++) {
                if (strcmp(PQgetvalue(res, row, 1), "queued") != 0)
                        failed[nfailed++] = PQgetvalue(res, row, 0);
                else
                        requeued++;
        }
        for (row = 0; row < PQntuples(orphans); row++)
                failed[nfailed++] = PQgetvalue(orphans, row, 0);
        for (row = 0; row < PQntuples(unborn); row++)
                failed[nfailed++] = PQgetvalue(unborn, row, 0);
        err = queue_events(store, failed, nfailed);
        if (err == CQ_OK)
                err = store_commit(store, "requeue expired leases");
        if (err == CQ_OK) {
                if (requeuedp)
                        *requeuedp = requeued;
                if (failedp)
                        *failedp = (int)nfailed;
        }
out:
        if (err != CQ_OK)
                store_rollback(store);
        free(failed); /* its strings are borrowed from the results */
        PQclear(res);
        PQclear(orphans);
        PQclear(unborn);
        return err;
}

cq_err_t cq_store_release(cq_store_t *store, const char *job_id)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;

        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        err = store_exec(store, "release a lease", SQL_RELEASE, &sp, 0, true,
                         &res);
        if (err == CQ_OK && PQntuples(res) == 0) {
                store_set_error(store,
                                "could not release job \"%s\": worker \"%s\" "
                                "does not hold its lease",
                                job_id, store->owner);
                err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

cq_err_t cq_store_retry_later(cq_store_t *store,
                              const char *job_id,
                              const char *error,
                              int64_t delay_ms)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;

        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        sp_text(&sp, error);
        sp_long(&sp, delay_ms < 0 ? 0 : (long long)delay_ms);
        err = store_exec(store, "put a job back for later", SQL_RETRY_LATER,
                         &sp, 0, true, &res);
        if (err == CQ_OK && PQntuples(res) == 0) {
                store_set_error(store,
                                "could not put job \"%s\" back: worker \"%s\" "
                                "does not hold its lease, or it has no "
                                "attempt left",
                                job_id, store->owner);
                err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

/* Run \p sql, an UPDATE of job \p job_id guarded by this owner's lease
 * that returns a row when it wrote; *\p lostp when it wrote nothing.
 * Retry-safe: it sets values, it adds nothing. */
static cq_err_t leased_update(cq_store_t *store,
                              const char *what,
                              const char *sql,
                              const store_params_t *sp,
                              const char *job_id,
                              bool *lostp)
{
        PGresult *res = NULL;
        cq_err_t err;

        *lostp = false;
        err = store_exec(store, what, sql, sp, 0, true, &res);
        if (err == CQ_OK && PQntuples(res) == 0) {
                *lostp = true;
                store_set_error(store,
                                "could not %s of job \"%s\": worker \"%s\" "
                                "does not hold its lease",
                                what, job_id, store->owner);
        }
        PQclear(res);
        return err;
}

cq_err_t cq_store_set_retries(cq_store_t *store,
                              const char *job_id,
                              long retries,
                              bool *lostp)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        sp_long(&sp, retries < 0 ? 0 : clamp_int(retries));
        return leased_update(store, "count the retries", SQL_SET_RETRIES, &sp,
                             job_id, lostp);
}

cq_err_t cq_store_record_usage(cq_store_t *store,
                               const char *job_id,
                               const cq_usage_t *usage,
                               double cost_usd,
                               bool *lostp)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        sp_long(&sp, usage->prompt_tokens < 0 ? 0 : usage->prompt_tokens);
        sp_long(&sp,
                usage->completion_tokens < 0 ? 0 : usage->completion_tokens);
        sp_long(&sp,
                usage->cache_read_tokens < 0 ? 0 : usage->cache_read_tokens);
        sp_long(&sp, usage->cache_creation_tokens < 0
                         ? 0
                         : usage->cache_creation_tokens);
        sp_cost(&sp, cost_usd);
        return leased_update(store, "record the LLM usage", SQL_USAGE, &sp,
                             job_id, lostp);
}

cq_err_t cq_store_budget_reserve(cq_store_t *store,
                                 const char *job_id,
                                 double estimate_usd,
                                 cq_budget_t *budget)
{
        store_params_t sp;
        PGresult *res = NULL;
        const char *outcome;
        cq_err_t err;

        memset(budget, 0, sizeof(*budget));
        budget->outcome = CQ_BUDGET_NONE;
        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        sp_cost(&sp, estimate_usd);
        /* Not retried after a reconnect: a hold whose reply was lost is
         * replaced by the next one, or released with the job. */
        err = store_exec(store, "hold the run's budget", SQL_RESERVE, &sp, 0,
                         false, &res);
        if (err != CQ_OK)
                goto out;
        outcome = PQgetvalue(res, 0, 0);
        budget->budget_usd =
            PQgetisnull(res, 0, 1) ? -1 : strtod(PQgetvalue(res, 0, 1), NULL);
        budget->spent_usd =
            PQgetisnull(res, 0, 2) ? -1 : strtod(PQgetvalue(res, 0, 2), NULL);
        budget->held_usd =
            PQgetisnull(res, 0, 3) ? -1 : strtod(PQgetvalue(res, 0, 3), NULL);
        if (strcmp(outcome, "ok") == 0)
                budget->outcome = CQ_BUDGET_HELD;
        else if (strcmp(outcome, "over") == 0)
                budget->outcome = CQ_BUDGET_OVER;
        else if (strcmp(outcome, "unknown") == 0)
                budget->outcome = CQ_BUDGET_UNKNOWN;
        else if (strcmp(outcome, "lost") == 0)
                budget->outcome = CQ_BUDGET_LOST;
out:
        PQclear(res);
        return err;
}

static bool valid_final_status(const char *status)
{
        return status && (strcmp(status, "succeeded") == 0 ||
                          strcmp(status, "failed") == 0 ||
                          strcmp(status, "cancelled") == 0);
}

cq_err_t store_dump_notebook(cq_store_t *store,
                             const char *job_id,
                             const json_t *notebook,
                             char **textp,
                             size_t *lenp)
{
        *textp = NULL;
        if (!notebook)
                return CQ_OK;
        if (!json_is_object(notebook)) {
                store_set_error(store,
                                "could not store the notebook of job \"%s\": "
                                "not a JSON object",
                                job_id);
                return CQ_ERR_FATAL;
        }
        *textp = store_dump_doc(store, notebook, lenp);
        if (!*textp)
                return CQ_ERR_FATAL;
        if (*lenp > store->opts.notebook_max || *lenp > INT_MAX) {
                store_set_error(store,
                                "could not store the notebook of job \"%s\": "
                                "%zu bytes exceeds the cap of %zu "
                                "(CODERQ_NOTEBOOK_MAX)",
                                job_id, *lenp, store->opts.notebook_max);
                free(*textp);
                *textp = NULL;
                return CQ_ERR_TOO_LARGE;
        }
        return CQ_OK;
}

cq_err_t store_write_notebook(cq_store_t *store,
                              const char *job_id,
                              const json_t *notebook,
                              const char *text,
                              size_t len)
{
        store_params_t sp;

        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, text);
        sp_long(&sp, (long long)len);
        sp_long(&sp,
                (long long)json_array_size(json_object_get(notebook, "cells")));
        return store_exec(store, "store the notebook", SQL_NOTEBOOK, &sp, 0,
                          false, NULL);
}

cq_err_t cq_store_finish(cq_store_t *store, const cq_finish_t *fin, bool *lostp)
{
        store_params_t sp;
        PGresult *res = NULL;
        char *nb = NULL, *report = NULL;
        size_t nblen = 0;
        const char *outcome;
        cq_err_t err;

        *lostp = false;
        if (!valid_final_status(fin->status)) {
                store_set_error(store,
                                "could not finish job \"%s\": invalid status "
                                "\"%s\"",
                                fin->job_id, fin->status ? fin->status : "");
                return CQ_ERR_FATAL;
        }
        if (fin->tests_passed > fin->tests_total) {
                store_set_error(store,
                                "could not finish job \"%s\": %d of %d tests "
                                "passed",
                                fin->job_id, fin->tests_passed,
                                fin->tests_total);
                return CQ_ERR_FATAL;
        }
        err =
            store_dump_notebook(store, fin->job_id, fin->notebook, &nb, &nblen);
        if (err != CQ_OK)
                return err;
        if (fin->report) {
                report = store_dump_doc(store, fin->report, NULL);
                if (!report) {
                        err = CQ_ERR_FATAL;
                        goto out;
                }
        }
        sp_init(&sp);
        sp_text(&sp, fin->job_id);
        sp_text(&sp, store->owner);
        sp_text(&sp, fin->status);
        sp_text(&sp, fin->reason);
        sp_text(&sp, fin->reason_code);
        sp_long(&sp, fin->turns < 0 ? 0 : fin->turns);
        sp_long(&sp, fin->retries < 0 ? 0 : fin->retries);
        sp_long(&sp, fin->prompt_tokens < 0 ? 0 : fin->prompt_tokens);
        sp_long(&sp, fin->completion_tokens < 0 ? 0 : fin->completion_tokens);
        sp_long(&sp, fin->cache_read_tokens < 0 ? 0 : fin->cache_read_tokens);
        sp_long(&sp, fin->cache_creation_tokens < 0
                         ? 0
                         : fin->cache_creation_tokens);
        sp_cost(&sp, fin->cost_usd);
        sp_text(&sp, fin->answer);
        if (fin->tests_total >= 0 && fin->tests_passed >= 0) {
                sp_long(&sp, fin->tests_passed);
                sp_long(&sp, fin->tests_total);
        } else {
                sp_text(&sp, NULL);
                sp_text(&sp, NULL);
        }
        sp_text(&sp, report);
        sp_text(&sp, nb);
        sp_long(&sp, (long long)nblen);
        sp_text(&sp, store->topic);
        sp_text(&sp, fin->verdict);
        sp_text(&sp, fin->judge);
        if (fin->hidden_total > 0 && fin->hidden_passed >= 0) {
                sp_long(&sp, fin->hidden_passed);
                sp_long(&sp, fin->hidden_total);
        } else {
                sp_text(&sp, NULL);
                sp_text(&sp, NULL);
        }
        /* Retry-safe: a second run after a lost reply answers 'done'. */
        err = store_exec(store, "finish a job", SQL_FINISH, &sp, 0, true, &res);
        if (err != CQ_OK)
                goto out;
        outcome = PQgetvalue(res, 0, 0);
        if (strcmp(outcome, "lost") == 0) {
                *lostp = true;
                store_set_error(store,
                                "could not finish job \"%s\": worker \"%s\" "
                                "no longer holds its lease",
                                fin->job_id, store->owner);
        }
out:
        PQclear(res);
        free(nb);
        free(report);
        return err;
}

cq_err_t cq_store_cancel(cq_store_t *store,
                         const char *job_id,
                         cq_cancel_outcome_t *outcomep)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;
        const char *status;
        const char *ids[1];

        *outcomep = CQ_CANCEL_NOT_FOUND;
        err = store_begin(store, "cancel a job");
        if (err != CQ_OK)
                return err;
        sp_init(&sp);
        sp_text(&sp, job_id);
        err = store_exec(store, "cancel a job", SQL_CANCEL_LOCK, &sp, 0, false,
                         &res);
        if (err != CQ_OK)
                goto out;
        if (PQntuples(res) == 0) {
                err = store_commit(store, "cancel a job");
                goto out;
        }
        status = PQgetvalue(res, 0, 0);
        if (strcmp(status, "queued") == 0) {
                err = store_exec(store, "cancel a queued job",
                                 SQL_CANCEL_QUEUED, &sp, 0, false, NULL);
                ids[0] = job_id;
                if (err == CQ_OK)
                        err = queue_events(store, ids, 1);
                if (err == CQ_OK)
                        *outcomep = CQ_CANCEL_DONE;
        } else if (strcmp(status, "running") == 0) {
                err = store_exec(store, "request cancellation",
                                 SQL_CANCEL_RUNNING, &sp, 0, false, NULL);
                if (err == CQ_OK)
                        *outcomep = CQ_CANCEL_REQUESTED;
        } else {
                *outcomep = CQ_CANCEL_FINISHED;
        }
        if (err == CQ_OK)
                err = store_commit(store, "cancel a job");
        if (err != CQ_OK)
                *outcomep = CQ_CANCEL_NOT_FOUND;
out:
        if (err != CQ_OK)
                store_rollback(store);
        PQclear(res);
        return err;
}

cq_err_t cq_store_cancel_requested(cq_store_t *store,
                                   const char *const *job_ids,
                                   size_t n,
                                   bool *requested)
{
        store_params_t sp;
        PGresult *res = NULL;
        char *ids;
        cq_err_t err;
        size_t i;
        int row;

        for (i = 0; i < n; i++)
                requested[i] = false;
        if (n == 0)
                return CQ_OK;
        ids = store_text_array(store, job_ids, n);
        if (!ids)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, ids);
        sp_text(&sp, store->owner);
        err = store_exec(store, "poll for cancellation", SQL_CANCEL_POLL, &sp,
                         0, true, &res);
        for (row = 0; err == CQ_OK && row < PQntuples(res); row++)
                for (i = 0; i < n; i++)
                        if (strcmp(PQgetvalue(res, row, 0), job_ids[i]) == 0)
                                requested[i] = true;
        PQclear(res);
        free(ids);
        return err;
}
