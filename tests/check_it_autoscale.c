/* SPDX-License-Identifier: MIT */
/* check_it_autoscale.c - the query the Helm chart's KEDA postgresql trigger
 * runs (deploy/helm/coderq/files/queue-depth.sql, over the view queue_depth
 * of migrations/0007_evaluation.sql) against a real PostgreSQL, in a fresh
 * migrated database per test: jobs queued, held back, running and finished
 * in two queues give, per queue and for both, the queued + running count
 * the scaler divides by the slots per pod, never NULL; a job that starts
 * or is given back keeps its count, one that finishes drops it. The query
 * is read from the chart, its queue list bound as a parameter. */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "support/kafka_test.h"
#include "support/pgtest.h"
#include "coderq/common/common.h"

/* Where the chart puts the comma-separated queue names. */
#define QUEUES_MARKER "'@QUEUES@'"

static char g_dsn[2048];
static char g_dbname[64];

static void setup(void)
{
        cq_pgtest_create("cqscale", true, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
}

static void teardown(void) { cq_pgtest_drop(g_dbname); }

/* The chart's query with its marker made parameter $1. Caller frees. */
static char *scaler_query(void)
{
        char *text = cq_check_slurp(
            cq_check_srcpath("deploy/helm/coderq/files/queue-depth.sql"), NULL);
        char *at = strstr(text, QUEUES_MARKER), *sql;
        size_t head, tail, marker = strlen(QUEUES_MARKER);

        ck_assert_msg(at != NULL, "queue-depth.sql lacks %s", QUEUES_MARKER);
        ck_assert_msg(strstr(at + marker, QUEUES_MARKER) == NULL,
                      "queue-depth.sql has %s twice", QUEUES_MARKER);
        head = (size_t)(at - text);
        tail = strlen(at + marker);
        sql = malloc(head + 2 + tail + 1);
        ck_assert_ptr_nonnull(sql);
        memcpy(sql, text, head);
        memcpy(sql + head, "$1", 2);
        memcpy(sql + head + 2, at + marker, tail + 1);
        free(text);
        return sql;
}

/* What the scaler reads for \p queues (comma-separated), as text: a
 * NULL would be no number at all. */
static void assert_scaler_reads(const char *queues, const char *want)
{
        char *sql = scaler_query();
        char *got = kt_pg_text(g_dsn, sql, queues);

        ck_assert_msg(got != NULL, "the query gave NULL for \"%s\"", queues);
        ck_assert_msg(strcmp(got, want) == 0,
                      "the query gave %s for \"%s\", want %s", got, queues,
                      want);
        free(got);
        free(sql);
}

/* Job \p id in \p queue with \p status, as a worker would leave it; a
 * queued one is claimable after \p delay_s seconds (0: now, > 0: held
 * back as a retry's delay or a parent would hold it). */
static void
craft(const char *id, const char *queue, const char *status, int delay_s)
{
        static const char sql[] =
            "INSERT INTO jobs (job_id, prompt, spec, status, queue, run_after,"
            " lease_owner, lease_until, started_at, finished_at)"
            " VALUES ($1, 'p', jsonb_build_object('job_id', $1::text,"
            "  'prompt', 'p'), $2, $3,"
            " now() + make_interval(secs => $4::int),"
            " CASE WHEN $2 = 'running' THEN 'w1' END,"
            " CASE WHEN $2 = 'running' THEN now() + interval '10 minutes'"
            "  END,"
            " CASE WHEN $2 <> 'queued' THEN now() END,"
            " CASE WHEN $2 IN ('succeeded', 'failed', 'cancelled')"
            "  THEN now() END)";
        PGconn *conn = cq_pgtest_connect(g_dsn);
        char delay[16];
        const char *params[4];
        PGresult *res;

        snprintf(delay, sizeof(delay), "%d", delay_s);
        params[0] = id;
        params[1] = status;
        params[2] = queue;
        params[3] = delay;
        res = PQexecParams(conn, sql, 4, NULL, params, NULL, NULL, 0);
        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK,
                      "could not insert job %s: %s", id, PQerrorMessage(conn));
        PQclear(res);
        PQfinish(conn);
}

/* alpha: 2 claimable, 1 held back, 1 running, 2 finished; beta: 1
 * claimable, 3 running, 1 cancelled; default: 1 claimable. */
static void make_queues(void)
{
        static const struct {
                const char *id, *queue, *status;
                int delay_s;
        } jobs[] = {
            {"a1", "alpha", "queued", 0},    {"a2", "alpha", "queued", 0},
            {"a3", "alpha", "queued", 3600}, {"a4", "alpha", "running", 0},
            {"a5", "alpha", "succeeded", 0}, {"a6", "alpha", "failed", 0},
            {"b1", "beta", "queued", 0},     {"b2", "beta", "running", 0},
            {"b3", "beta", "running", 0},    {"b4", "beta", "running", 0},
            {"b5", "beta", "cancelled", 0},  {"d1", "default", "queued", 0},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(jobs); i++)
                craft(jobs[i].id, jobs[i].queue, jobs[i].status,
                      jobs[i].delay_s);
}

START_TEST(query_counts_queued_and_running_per_queue)
{
        char *row;

        make_queues();
        /* the view it reads, as 0007 defines it */
        row = kt_pg_text(g_dsn,
                         "SELECT concat_ws('/', queued, waiting, running)"
                         " FROM queue_depth WHERE queue = $1",
                         "alpha");
        ck_assert_str_eq(row, "2/1/1");
        free(row);

        assert_scaler_reads("alpha", "3");
        assert_scaler_reads("beta", "4");
        assert_scaler_reads("default", "1");
        assert_scaler_reads("alpha,beta", "7");
        assert_scaler_reads("beta,default", "5");
        assert_scaler_reads("alpha,beta,default", "8");
        /* a queue with nothing in it, and one nobody named */
        assert_scaler_reads("gamma", "0");
        assert_scaler_reads("gamma,alpha", "3");
}
END_TEST

START_TEST(query_is_zero_on_an_empty_queue)
{
        assert_scaler_reads("default", "0");
        craft("x1", "default", "succeeded", 0);
        craft("x2", "default", "queued", 600);
        assert_scaler_reads("default", "0");
}
END_TEST

/* A claim moves a job from queued to running and a drain moves it back:
 * the scaler's count must not dip, or it would remove the pods that are
 * about to take those jobs. Only a finish lowers it. */
START_TEST(query_keeps_a_job_through_claim_and_release)
{
        make_queues();
        assert_scaler_reads("alpha", "3");
        kt_pg_exec(g_dsn,
                   "UPDATE jobs SET status = 'running', lease_owner = 'w2',"
                   " lease_until = now() + interval '10 minutes',"
                   " started_at = now() WHERE job_id = $1",
                   "a1");
        assert_scaler_reads("alpha", "3");
        kt_pg_exec(g_dsn,
                   "UPDATE jobs SET status = 'queued', lease_owner = NULL,"
                   " lease_until = NULL WHERE job_id = $1",
                   "a4");
        assert_scaler_reads("alpha", "3");
        kt_pg_exec(g_dsn,
                   "UPDATE jobs SET status = 'succeeded', lease_owner = NULL,"
                   " lease_until = NULL, finished_at = now()"
                   " WHERE job_id = $1",
                   "a1");
        assert_scaler_reads("alpha", "2");
}
END_TEST

static Suite *autoscale_suite(void)
{
        Suite *s = suite_create("autoscale");
        TCase *tc = tcase_create("autoscale");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, query_counts_queued_and_running_per_queue);
        tcase_add_test(tc, query_is_zero_on_an_empty_queue);
        tcase_add_test(tc, query_keeps_a_job_through_claim_and_release);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(autoscale_suite)
