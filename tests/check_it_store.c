/* SPDX-License-Identifier: MIT */
/* check_it_store.c - storage against a real PostgreSQL (CODERQ_PG_DSN):
 * every test runs in a fresh database, migrated from migrations/, and
 * drops it afterwards, so tests are independent and re-runnable. */
#include <dirent.h>
#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "support/pgproxy.h"
#include "support/pgtest.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/outbox.h"
#include "coderq/storage/artifacts.h"
#include "coderq/storage/memory.h"
#include "coderq/storage/queries.h"
#include "coderq/storage/report.h"
#include "coderq/storage/listen.h"
#include "coderq/storage/probe.h"
#include "coderq/storage/migrate.h"
#include "coderq/common/util.h"
#include "../storage/store_int.h"

static char g_dsn[2048]; /* the test's own database */
static char g_dbname[64];

/* ------------------------------------------------------------ helpers */

/* The first value of a query with up to one parameter, on a fresh
 * connection to the test database; caller frees; NULL for no row/NULL. */
static char *q1(const char *sql, const char *param)
{
        PGconn *conn = cq_pgtest_connect(g_dsn);
        PGresult *res =
            PQexecParams(conn, sql, param ? 1 : 0, NULL, &param, NULL, NULL, 0);
        char *out = NULL;

        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s: %s", sql,
                      PQerrorMessage(conn));
        if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
                out = strdup(PQgetvalue(res, 0, 0));
        PQclear(res);
        PQfinish(conn);
        return out;
}

static long qn(const char *sql, const char *param)
{
        char *s = q1(sql, param);
        long v;

        ck_assert_msg(s != NULL, "%s: no value", sql);
        v = strtol(s, NULL, 10);
        free(s);
        return v;
}

static void qexec(const char *sql)
{
        PGconn *conn = cq_pgtest_connect(g_dsn);

        cq_pgtest_exec(conn, sql);
        PQfinish(conn);
}

static void setup(void)
{
        char errstr[1024];
        int applied = 0;

        cq_pgtest_sweep("cqt");
        cq_pgtest_create("cqt", false, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
        ck_assert_msg(cq_migrate_run(g_dsn, cq_check_srcpath("migrations"),
                                     NULL, NULL, &applied, errstr,
                                     sizeof(errstr)) == CQ_OK,
                      "migrate: %s", errstr);
        ck_assert_int_ge(applied, 1);
}

static void teardown(void)
{
        if (g_dbname[0])
                cq_pgtest_drop(g_dbname);
}

static cq_store_t *store_for(const char *owner, int lease_s)
{
        cq_store_opts_t opts;
        char errstr[512];
        cq_store_t *store;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = owner;
        opts.lease_s = lease_s;
        opts.reconnect_ms = 60000;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        return store;
}

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

/* A job filled by hand (the parser lives elsewhere). */
static void job_fill(cq_job_t *job,
                     const char *id,
                     const char *prompt,
                     long priority,
                     const char *parent,
                     const char *run_id)
{
        memset(job, 0, sizeof(*job));
        job->job_id = xstrdup(id);
        job->prompt = xstrdup(prompt);
        job->parent_job_id = xstrdup(parent);
        job->run_id = xstrdup(run_id);
        job->title = xstrdup("A title");
        job->priority = priority;
        job->limits.max_turns = -1;
        job->limits.max_retries = -1;
        job->limits.cell_timeout_s = -1;
        job->limits.job_timeout_s = -1;
        job->spec = json_pack("{s:s, s:s, s:i}", "job_id", id, "prompt", prompt,
                              "priority", (int)priority);
        if (parent)
                json_object_set_new(job->spec, "parent_job_id",
                                    json_string(parent));
        if (run_id)
                json_object_set_new(job->spec, "run_id", json_string(run_id));
}

static void job_free(cq_job_t *job)
{
        free(job->job_id);
        free(job->prompt);
        free(job->parent_job_id);
        free(job->run_id);
        free(job->title);
        free(job->task_id);
        json_decref(job->spec);
        memset(job, 0, sizeof(*job));
}

static void add_job(cq_store_t *store,
                    const char *id,
                    long priority,
                    const char *parent,
                    const char *run_id)
{
        cq_job_t job;
        bool created = false;

        job_fill(&job, id, "compute something", priority, parent, run_id);
        ck_assert_msg(cq_store_upsert_job(store, &job, NULL, &created) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(created);
        job_free(&job);
}

/* Claim one job and return its id (caller frees), or NULL. */
static char *claim_id(cq_store_t *store)
{
        cq_claim_t claim;
        bool found;
        char *id;

        cq_claim_init(&claim);
        ck_assert_msg(cq_store_claim(store, &claim, &found) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        if (!found)
                return NULL;
        id = claim.job_id;
        claim.job_id = NULL;
        cq_claim_release(&claim);
        return id;
}

/* Claim one job and check that it is \p want. */
static void expect_claim(cq_store_t *store, const char *want)
{
        char *id = claim_id(store);

        ck_assert_msg(id && strcmp(id, want) == 0, "claimed %s, not %s",
                      id ? id : "nothing", want);
        free(id);
}

static void
finish(cq_store_t *store, const char *id, const char *status, const json_t *nb)
{
        cq_finish_t fin;
        bool lost = true;

        memset(&fin, 0, sizeof(fin));
        fin.job_id = id;
        fin.status = status;
        fin.answer = "42";
        fin.tests_passed = 2;
        fin.tests_total = 3;
        fin.turns = 4;
        fin.retries = 1;
        fin.prompt_tokens = 100;
        fin.completion_tokens = 50;
        fin.notebook = nb;
        fin.reason = strcmp(status, "failed") == 0 ? "tests failed" : NULL;
        ck_assert_msg(cq_store_finish(store, &fin, &lost) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        ck_assert_msg(!lost, "%s", cq_store_errmsg(store));
}

static json_t *notebook_doc(const char *text)
{
        return json_pack(
            "{s:i, s:i, s:{s:{s:s, s:s}}, s:[{s:s, s:{}, s:s}, "
            "{s:s, s:i, s:{}, s:s, s:[{s:s, s:s, s:s}, "
            "{s:s, s:{s:s, s:s}, s:{}}]}]}",
            "nbformat", 4, "nbformat_minor", 5, "metadata", "kernelspec",
            "name", "python3", "display_name", "Python 3", "cells", "cell_type",
            "markdown", "metadata", "source", text, "cell_type", "code",
            "execution_count", 1, "metadata", "source",
            "print('h\\u00e9')\nx = 1.5e-7", "outputs", "output_type", "stream",
            "name", "stdout", "text", "h\xc3\xa9\n", "output_type",
            "display_data", "data", "image/png", "iVBORw0KGgo=\n", "text/plain",
            "<Figure size 640x480 with 1 Axes>", "metadata");
}

/* --------------------------------------------------------- the tests */

struct claimer {
        int n;
        char **ids;
        int nids;
        cq_err_t err;
        char errmsg[512];
};

static void *claimer_main(void *arg)
{
        struct claimer *c = arg;
        cq_store_opts_t opts;
        cq_store_t *store;
        char owner[32];

        snprintf(owner, sizeof(owner), "worker-%d", c->n);
        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = owner;
        store = cq_store_new(&opts, c->errmsg, sizeof(c->errmsg));
        if (!store) {
                c->err = CQ_ERR_FATAL;
                return NULL;
        }
        for (;;) {
                cq_claim_t claim;
                bool found;

                cq_claim_init(&claim);
                c->err = cq_store_claim(store, &claim, &found);
                if (c->err != CQ_OK) {
                        snprintf(c->errmsg, sizeof(c->errmsg), "%s",
                                 cq_store_errmsg(store));
                        break;
                }
                if (!found)
                        break;
                c->ids[c->nids++] = claim.job_id;
                claim.job_id = NULL;
                cq_claim_release(&claim);
        }
        cq_store_destroy(&store);
        return NULL;
}

static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(claim_8_threads_1000_jobs_exactly_once)
{
        enum { NJOBS = 1000, NTHREADS = 8 };
        cq_store_t *store = store_for("intake", 120);
        struct claimer c[NTHREADS];
        pthread_t th[NTHREADS];
        char **all = calloc(NJOBS * 2, sizeof(*all));
        int i, j, total = 0;

        for (i = 0; i < NJOBS; i++) {
                char id[32];

                snprintf(id, sizeof(id), "job-%04d", i);
                add_job(store, id, i % 5, NULL, "r");
        }
        for (i = 0; i < NTHREADS; i++) {
                memset(&c[i], 0, sizeof(c[i]));
                c[i].n = i;
                c[i].ids = calloc(NJOBS + 1, sizeof(char *));
                ck_assert_int_eq(
                    pthread_create(&th[i], NULL, claimer_main, &c[i]), 0);
        }
        for (i = 0; i < NTHREADS; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(c[i].err == CQ_OK, "thread %d: %s", i,
                              c[i].errmsg);
                for (j = 0; j < c[i].nids; j++)
                        all[total++] = c[i].ids[j];
        }
        ck_assert_int_eq(total, NJOBS);
        qsort(all, (size_t)total, sizeof(*all), cmp_str);
        for (i = 1; i < total; i++)
                ck_assert_msg(strcmp(all[i - 1], all[i]) != 0,
                              "%s claimed twice", all[i]);
        /* Several threads took part, and the database agrees. */
        for (i = 0, j = 0; i < NTHREADS; i++)
                j += c[i].nids > 0;
        ck_assert_int_ge(j, 2);
        ck_assert_int_eq(qn("SELECT count(*) FROM jobs WHERE status = "
                            "'running' AND attempts = 1 AND lease_owner LIKE "
                            "'worker-%'",
                            NULL),
                         NJOBS);
        for (i = 0; i < total; i++)
                free(all[i]);
        for (i = 0; i < NTHREADS; i++)
                free(c[i].ids);
        free(all);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(claim_order_priority_then_age)
{
        cq_store_t *store = store_for("w", 120);

        add_job(store, "old-low", 0, NULL, NULL);
        add_job(store, "old-high", 5, NULL, NULL);
        add_job(store, "new-high", 5, NULL, NULL);
        add_job(store, "new-low", 0, NULL, NULL);
        qexec("UPDATE jobs SET created_at = now() - interval '1 hour'"
              " WHERE job_id LIKE 'old-%'");
        expect_claim(store, "old-high");
        expect_claim(store, "new-high");
        expect_claim(store, "old-low");
        expect_claim(store, "new-low");
        ck_assert_ptr_null(claim_id(store));
        cq_store_destroy(&store);
}
END_TEST

/* A store claims only jobs of the queues it serves (CODERQ_QUEUES), in
 * priority and age order among them; jobs naming no queue are in
 * "default"; a list that is not one is refused. */
START_TEST(claim_takes_only_its_queues)
{
        cq_store_opts_t opts;
        cq_store_t *plain = store_for("plain", 120), *gpu;
        char errstr[512];
        const char *const ids[] = {"d1", "g1", "t1", "g2", "o1"};
        const char *const queues[] = {NULL, "gpu", "team-a", "gpu", "other"};
        size_t i;
        char *s;

        for (i = 0; i < CQ_ARRAY_SIZE(ids); i++) {
                cq_job_t job;
                bool created = false;

                job_fill(&job, ids[i], "p", i == 3 ? 5 : 0, NULL, NULL);
                job.queue = xstrdup(queues[i]);
                ck_assert_int_eq(
                    cq_store_upsert_job(plain, &job, NULL, &created), CQ_OK);
                ck_assert(created);
                free(job.queue);
                job.queue = NULL;
                job_free(&job);
        }
        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = "gpu-worker";
        opts.queues = "gpu,team-a,gpu";
        gpu = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(gpu != NULL, "%s", errstr);
        expect_claim(gpu, "g2"); /* priority 5 first */
        expect_claim(gpu, "g1");
        expect_claim(gpu, "t1");
        ck_assert_ptr_null(claim_id(gpu));
        expect_claim(plain, "d1");
        ck_assert_ptr_null(claim_id(plain));
        s = q1("SELECT string_agg(job_id || ':' || queue || ':' || status, ' '"
               " ORDER BY job_id) FROM jobs",
               NULL);
        ck_assert_str_eq(s, "d1:default:running g1:gpu:running "
                            "g2:gpu:running o1:other:queued "
                            "t1:team-a:running");
        free(s);
        opts.queues = "gpu,GPU";
        ck_assert_ptr_null(cq_store_new(&opts, errstr, sizeof(errstr)));
        ck_assert_msg(strstr(errstr, "invalid CODERQ_QUEUES \"gpu,GPU\"") !=
                          NULL,
                      "%s", errstr);
        cq_store_destroy(&gpu);
        cq_store_destroy(&plain);
}
END_TEST

/* The plan of the claim statement \p name on \p store's own connection,
 * for a worker of the queues \p queues; caller frees. */
static char *claim_plan(cq_store_t *store, const char *name, const char *queues)
{
        char sql[256];
        PGresult *res;
        char *plan = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&plan, &len);
        int i;

        ck_assert_ptr_nonnull(f);
        snprintf(sql, sizeof(sql), "EXPLAIN EXECUTE %s('w', 60, '%s')", name,
                 queues);
        res = PQexec(store->conn, sql);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s: %s", sql,
                      PQerrorMessage(store->conn));
        for (i = 0; i < PQntuples(res); i++)
                fprintf(f, "%s\n", PQgetvalue(res, i, 0));
        PQclear(res);
        fclose(f);
        return plan;
}

/* A claim reads jobs_claim_idx in order for one queue and for several,
 * whatever the backlog: it never reads every queued job and sorts them
 * (20,000 queued made that 130 ms a claim), under a custom plan or the
 * generic one a prepared statement settles on. */
START_TEST(claim_reads_the_index_for_each_queue)
{
        cq_store_t *store = store_for("w", 120);
        const char *const lists[] = {"{default}", "{default,gpu}",
                                     "{gpu,team-a,default}"};
        char name[24] = "";
        size_t i;
        int m, k;

        add_job(store, "first", 0, NULL, NULL);
        expect_claim(store, "first");
        for (k = 0; k < store->nprep; k++)
                if (strstr(store->prep[k].sql, "UPDATE jobs SET status = "
                                               "'running'"))
                        snprintf(name, sizeof(name), "cq_%016llx",
                                 (unsigned long long)store->prep[k].hash);
        ck_assert_str_ne(name, "");
        qexec("INSERT INTO jobs (job_id, prompt, priority, spec, queue)"
              " SELECT 'bulk-' || g, 'p', g % 3, '{}',"
              "  CASE WHEN g % 100 = 0 THEN 'gpu' ELSE 'default' END"
              " FROM generate_series(1, 20000) g");
        qexec("ANALYZE jobs");
        for (m = 0; m < 2; m++) {
                if (m == 1) {
                        PGresult *res =
                            PQexec(store->conn,
                                   "SET plan_cache_mode = force_generic_plan");

                        ck_assert_int_eq(PQresultStatus(res), PGRES_COMMAND_OK);
                        PQclear(res);
                }
                for (i = 0; i < CQ_ARRAY_SIZE(lists); i++) {
                        char *plan = claim_plan(store, name, lists[i]);

                        ck_assert_msg(strstr(plan, "jobs_claim_idx") &&
                                          !strstr(plan, "Seq Scan on jobs"),
                                      "%s %s:\n%s", m ? "generic" : "custom",
                                      lists[i], plan);
                        free(plan);
                }
        }
        cq_store_destroy(&store);
}
END_TEST

/* A server that refuses writes as read-only (SQLSTATE 25006: a demoted
 * primary, a standby reached during a failover) is a wait, not a job's
 * end: the write is retriable, and the store's next connection, once the
 * server takes writes again, stores it. */
START_TEST(read_only_server_is_retriable)
{
        cq_store_t *store;
        char sql[256];
        cq_job_t job;
        bool created = false;

        snprintf(sql, sizeof(sql),
                 "ALTER DATABASE %s SET default_transaction_read_only = on",
                 g_dbname);
        qexec(sql);
        store = store_for("w", 120);
        job_fill(&job, "ro-1", "p", 0, NULL, NULL);
        ck_assert_int_eq(cq_store_upsert_job(store, &job, NULL, &created),
                         CQ_ERR_RETRIABLE);
        ck_assert_msg(strstr(cq_store_errmsg(store), "read-only") != NULL, "%s",
                      cq_store_errmsg(store));
        {
                PGconn *conn = cq_pgtest_connect(g_dsn);

                cq_pgtest_exec(conn, "SET default_transaction_read_only = off");
                snprintf(sql, sizeof(sql),
                         "ALTER DATABASE %s SET default_transaction_read_only "
                         "= off",
                         g_dbname);
                cq_pgtest_exec(conn, sql);
                PQfinish(conn);
        }
        ck_assert_msg(cq_store_upsert_job(store, &job, NULL, &created) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(created);
        job_free(&job);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(expired_leases_requeued_then_attempt_cap_fails)
{
        cq_store_t *w1 = store_for("w1", 120), *w2 = store_for("w2", 120);
        cq_store_t *reaper = store_for("reaper", 120);
        const char *ids[1] = {"j1"};
        bool lost[1] = {true};
        size_t nlost = 9;
        int requeued = -1, failed = -1;
        cq_claim_t claim;
        bool found;
        char *s;

        qexec("SELECT 1"); /* the database answers */
        add_job(w1, "j1", 0, NULL, NULL);
        qexec("UPDATE jobs SET max_attempts = 2");
        s = claim_id(w1);
        ck_assert_str_eq(s, "j1");
        free(s);
        /* A heartbeat renews the lease. */
        qexec("UPDATE jobs SET lease_until = now() + interval '1 second'");
        ck_assert_int_eq(cq_store_heartbeat(w1, ids, 1, lost, &nlost), CQ_OK);
        ck_assert(!lost[0]);
        ck_assert_uint_eq(nlost, 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM jobs WHERE lease_until > "
                            "now() + interval '100 seconds'",
                            NULL),
                         1);
        /* Nothing expired yet: the reaper leaves it alone. */
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(requeued, 0);
        ck_assert_int_eq(failed, 0);
        /* The lease expires: requeued, the next worker resumes it. */
        qexec("UPDATE jobs SET lease_until = now() - interval '1 second'");
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(requeued, 1);
        ck_assert_int_eq(failed, 0);
        s = q1("SELECT status FROM jobs WHERE job_id = 'j1'", NULL);
        ck_assert_str_eq(s, "queued");
        free(s);
        s = q1("SELECT error FROM jobs WHERE job_id = 'j1'", NULL);
        ck_assert_ptr_nonnull(strstr(s, "lease of worker w1 expired"));
        free(s);
        ck_assert_int_eq(cq_store_heartbeat(w1, ids, 1, lost, &nlost), CQ_OK);
        ck_assert(lost[0]);
        ck_assert_uint_eq(nlost, 1);
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w2, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert_str_eq(claim.job_id, "j1");
        ck_assert_int_eq(claim.attempt, 2);
        ck_assert_str_eq(
            json_string_value(json_object_get(claim.spec, "prompt")),
            "compute something");
        cq_claim_release(&claim);
        {
                /* The old owner cannot finish it any more. */
                cq_finish_t fin;
                bool was_lost = false;

                memset(&fin, 0, sizeof(fin));
                fin.job_id = "j1";
                fin.status = "succeeded";
                fin.tests_passed = fin.tests_total = -1;
                ck_assert_int_eq(cq_store_finish(w1, &fin, &was_lost), CQ_OK);
                ck_assert(was_lost);
                ck_assert_ptr_nonnull(
                    strstr(cq_store_errmsg(w1), "no longer holds its lease"));
        }
        /* Second expiry: the attempt cap fails the job with an event. */
        qexec("UPDATE jobs SET lease_until = now() - interval '1 second'");
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(requeued, 0);
        ck_assert_int_eq(failed, 1);
        s = q1("SELECT status || ' | ' || reason FROM jobs", NULL);
        ck_assert_str_eq(s, "failed | lease expired after 2 attempts (last "
                            "worker w2)");
        free(s);
        ck_assert_ptr_null(claim_id(w1));
        s = q1("SELECT payload->>'status' || ' ' || (payload->>'attempt') ||"
               " ' ' || (payload->>'worker') || ' ' || (payload->>'verdict')"
               " FROM outbox WHERE job_id = 'j1'",
               NULL);
        /* workers that died with it: ours, never the model's */
        ck_assert_str_eq(s, "failed 2 w2 infra_error");
        free(s);
        ck_assert_int_eq(qn("SELECT count(*) FROM results", NULL), 0);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
        cq_store_destroy(&reaper);
}
END_TEST

START_TEST(release_gives_the_job_back)
{
        cq_store_t *w1 = store_for("w1", 120), *w2 = store_for("w2", 120);
        char *s;

        add_job(w1, "r1", 0, NULL, NULL);
        s = claim_id(w1);
        free(s);
        ck_assert_int_eq(cq_store_release(w2, "r1"), CQ_ERR_FATAL);
        ck_assert_ptr_nonnull(
            strstr(cq_store_errmsg(w2), "does not hold its lease"));
        ck_assert_int_eq(cq_store_release(w1, "r1"), CQ_OK);
        s = q1("SELECT status || ' ' || attempts || ' ' ||"
               " (lease_owner IS NULL) FROM jobs",
               NULL);
        ck_assert_str_eq(s, "queued 0 true");
        free(s);
        s = claim_id(w2);
        ck_assert_str_eq(s, "r1");
        free(s);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
}
END_TEST

struct finisher {
        cq_store_t *store;
        const json_t *nb;
        cq_err_t err;
        bool lost;
};

static void *finisher_main(void *arg)
{
        struct finisher *f = arg;
        cq_finish_t fin;

        memset(&fin, 0, sizeof(fin));
        fin.job_id = "atomic";
        fin.status = "succeeded";
        fin.answer = "done";
        fin.tests_passed = fin.tests_total = -1;
        fin.notebook = f->nb;
        f->err = cq_store_finish(f->store, &fin, &f->lost);
        return NULL;
}

/* The pid of a backend of this database that waits for a lock inside
 * coderq_finish(), other than \p not_pid (a killed backend may still be
 * listed for a moment); 0 after 10 s. Read from pg_stat_activity, not from
 * the store, which another thread is using. */
static int wait_for_blocked_finish(PGconn *conn, int not_pid)
{
        char num[16];
        const char *param = num;
        int i, pid = 0;

        snprintf(num, sizeof(num), "%d", not_pid);
        for (i = 0; i < 400 && !pid; i++) {
                PGresult *res = PQexecParams(
                    conn,
                    "SELECT pid FROM pg_stat_activity WHERE datname ="
                    " current_database() AND pid <> $1 AND wait_event_type ="
                    " 'Lock' AND query LIKE '%coderq_finish%'",
                    1, NULL, &param, NULL, NULL, 0);

                ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
                if (PQntuples(res) == 1)
                        pid = (int)strtol(PQgetvalue(res, 0, 0), NULL, 10);
                PQclear(res);
                if (!pid)
                        usleep(25000);
        }
        return pid;
}

START_TEST(finish_is_atomic_when_the_backend_is_killed)
{
        cq_store_t *store = store_for("w1", 120);
        json_t *nb = notebook_doc("final");
        struct finisher f = {store, nb, CQ_OK, false};
        PGconn *locker = cq_pgtest_connect(g_dsn),
               *killer = cq_pgtest_connect(g_dsn);
        pthread_t th;
        char num[16], *s;
        const char *param = num;
        PGresult *res;
        int pid;

        add_job(store, "atomic", 0, NULL, NULL);
        s = claim_id(store);
        free(s);
        /* The finish will block on its last write, the outbox row. */
        cq_pgtest_exec(locker, "BEGIN");
        cq_pgtest_exec(locker, "LOCK TABLE outbox IN SHARE MODE");
        ck_assert_int_eq(pthread_create(&th, NULL, finisher_main, &f), 0);
        pid = wait_for_blocked_finish(killer, 0);
        ck_assert_msg(pid != 0, "the finish never blocked on the outbox");
        /* It already updated the job row (which it holds locked)... */
        res = PQexec(killer, "SELECT 1 FROM jobs WHERE job_id = 'atomic'"
                             " FOR UPDATE NOWAIT");
        ck_assert_str_eq(PQresultErrorField(res, PG_DIAG_SQLSTATE), "55P03");
        PQclear(res);
        /* ...when its backend dies. */
        snprintf(num, sizeof(num), "%d", pid);
        res = PQexecParams(killer, "SELECT pg_terminate_backend($1)", 1, NULL,
                           &param, NULL, NULL, 0);
        ck_assert_str_eq(PQgetvalue(res, 0, 0), "t");
        PQclear(res);
        /* The handle reconnects and retries; the retry blocks on the same
         * lock, so nothing can have committed since the kill: nothing
         * partial is visible. */
        pid = wait_for_blocked_finish(killer, pid);
        ck_assert_msg(pid != 0, "the finish was not retried");
        s = q1("SELECT status || ' ' || lease_owner FROM jobs", NULL);
        ck_assert_str_eq(s, "running w1");
        free(s);
        ck_assert_int_eq(qn("SELECT count(*) FROM results", NULL), 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM notebooks", NULL), 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox", NULL), 0);
        /* Released, the retry lands whole. */
        cq_pgtest_exec(locker, "ROLLBACK");
        pthread_join(th, NULL);
        ck_assert_msg(f.err == CQ_OK, "%s", cq_store_errmsg(store));
        ck_assert(!f.lost);
        ck_assert_uint_eq(cq_store_reconnects(store), 1);
        s = q1("SELECT j.status || ' ' || r.answer || ' ' || n.ncells || ' ' "
               "|| (o.payload->>'status') FROM jobs j JOIN results r USING "
               "(job_id) JOIN notebooks n USING (job_id) JOIN outbox o USING "
               "(job_id)",
               NULL);
        ck_assert_str_eq(s, "succeeded done 2 succeeded");
        free(s);
        /* A repeat (a COMMIT whose reply was lost) is harmless. */
        finisher_main(&f);
        ck_assert_int_eq(f.err, CQ_OK);
        ck_assert(!f.lost);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox", NULL), 1);
        ck_assert_int_eq(qn("SELECT count(*) FROM results", NULL), 1);
        PQfinish(locker);
        PQfinish(killer);
        json_decref(nb);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(child_waits_for_parent_success)
{
        cq_store_t *store = store_for("w", 120);
        cq_store_t *reaper = store_for("reaper", 120);
        char *s;
        int requeued, failed;

        /* The child arrives first; its parent is not even known yet. */
        add_job(store, "child", 9, "parent", NULL);
        ck_assert_ptr_null(claim_id(store));
        add_job(store, "parent", 0, NULL, NULL);
        expect_claim(store, "parent");
        /* Parent running: the child still waits. */
        ck_assert_ptr_null(claim_id(store));
        finish(store, "parent", "succeeded", NULL);
        expect_claim(store, "child");
        /* A parent that fails fails its waiting children. */
        add_job(store, "p2", 0, NULL, NULL);
        add_job(store, "c2", 5, "p2", NULL);
        expect_claim(store, "p2");
        finish(store, "p2", "failed", NULL);
        ck_assert_ptr_null(claim_id(store));
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(failed, 1);
        s = q1("SELECT status || ': ' || reason FROM jobs WHERE job_id = "
               "'c2'",
               NULL);
        ck_assert_str_eq(s, "failed: parent job p2 failed");
        free(s);
        ck_assert_int_eq(
            qn("SELECT count(*) FROM outbox WHERE job_id = 'c2'", NULL), 1);
        cq_store_destroy(&store);
        cq_store_destroy(&reaper);
}
END_TEST

/* A child whose parent never arrives fails after the parent wait, with an
 * event; a younger one, and one whose parent exists, go on waiting. */
START_TEST(child_without_parent_fails_after_the_wait)
{
        cq_store_t *store = store_for("w", 120);
        cq_store_opts_t opts;
        cq_store_t *reaper;
        char errstr[512], *s;
        int requeued = -1, failed = -1;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = "reaper";
        opts.parent_wait_s = 60;
        reaper = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(reaper != NULL, "%s", errstr);
        add_job(store, "orphan", 0, "ghost", NULL);
        add_job(store, "young", 0, "ghost", NULL);
        add_job(store, "waiting", 0, "slow-parent", NULL);
        add_job(store, "slow-parent", 0, NULL, NULL);
        expect_claim(store, "slow-parent");
        qexec("UPDATE jobs SET created_at = now() - interval '61 seconds'"
              " WHERE job_id IN ('orphan', 'waiting')");
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(requeued, 0);
        ck_assert_int_eq(failed, 1);
        s = q1("SELECT string_agg(job_id || ' ' || status || ' ' ||"
               " COALESCE(reason, '-'), '; ' ORDER BY job_id) FROM jobs"
               " WHERE parent_job_id IS NOT NULL",
               NULL);
        ck_assert_str_eq(s, "orphan failed parent job ghost does not exist "
                            "after 60 s; waiting queued -; young queued -");
        free(s);
        s = q1("SELECT payload->>'status' || ' ' || (payload->>'reason')"
               " FROM outbox WHERE job_id = 'orphan'",
               NULL);
        ck_assert_str_eq(s, "failed parent job ghost does not exist after "
                            "60 s");
        free(s);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox", NULL), 1);
        /* Again: nothing more to do. */
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(failed, 0);
        cq_store_destroy(&store);
        cq_store_destroy(&reaper);
}
END_TEST

/* A try put back for later counts its attempt, waits, keeps its error,
 * and cannot be put back once no attempt is left (it would never run). */
START_TEST(retry_later_counts_and_waits)
{
        cq_store_t *w1 = store_for("w1", 120), *w2 = store_for("w2", 120);
        cq_claim_t claim;
        bool found;
        char *s;

        add_job(w1, "t1", 0, NULL, NULL);
        qexec("UPDATE jobs SET max_attempts = 2");
        expect_claim(w1, "t1");
        ck_assert_int_eq(cq_store_retry_later(w2, "t1", "nope", 0),
                         CQ_ERR_FATAL);
        ck_assert_int_eq(cq_store_retry_later(w1, "t1",
                                              "could not get an interpreter: "
                                              "no kernel",
                                              60000),
                         CQ_OK);
        s = q1("SELECT status || ' ' || attempts || ' ' || error || ' ' ||"
               " (run_after > now() + interval '50 seconds') || ' ' ||"
               " (lease_owner IS NULL) FROM jobs",
               NULL);
        ck_assert_str_eq(s, "queued 1 could not get an interpreter: no kernel "
                            "true true");
        free(s);
        /* not before its time */
        ck_assert_ptr_null(claim_id(w2));
        qexec("UPDATE jobs SET run_after = now()");
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w2, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert_int_eq(claim.attempt, 2);
        ck_assert_int_eq(claim.max_attempts, 2);
        cq_claim_release(&claim);
        /* the last attempt: finish it instead */
        ck_assert_int_eq(cq_store_retry_later(w2, "t1", "again", 0),
                         CQ_ERR_FATAL);
        ck_assert_ptr_nonnull(
            strstr(cq_store_errmsg(w2), "it has no attempt left"));
        s = q1("SELECT status || ' ' || lease_owner FROM jobs", NULL);
        ck_assert_str_eq(s, "running w2");
        free(s);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
}
END_TEST

/* The running time of every attempt is summed (up to the last heartbeat
 * for an expired lease) and a claim returns it with the retries counted
 * so far: the limits of a resumed job are the job's. */
START_TEST(run_time_and_retries_carry_over_attempts)
{
        cq_store_t *w1 = store_for("w1", 120), *w2 = store_for("w2", 120);
        cq_store_t *reaper = store_for("reaper", 120);
        cq_claim_t claim;
        bool found, lost = true;
        long ms;
        int requeued, failed;
        char *s;

        add_job(w1, "r1", 0, NULL, NULL);
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w1, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert_int_eq(claim.retries, 0);
        ck_assert_int_eq(claim.run_ms, 0);
        cq_claim_release(&claim);
        ck_assert_int_eq(qn("SELECT count(*) FROM jobs WHERE claimed_at IS "
                            "NOT NULL",
                            NULL),
                         1);
        ck_assert_int_eq(cq_store_set_retries(w1, "r1", 2, &lost), CQ_OK);
        ck_assert(!lost);
        ck_assert_int_eq(cq_store_set_retries(w2, "r1", 9, &lost), CQ_OK);
        ck_assert(lost);
        /* this attempt started 300 ms earlier than it did */
        qexec("UPDATE jobs SET claimed_at = claimed_at - interval '300 ms'");
        ck_assert_int_eq(cq_store_release(w1, "r1"), CQ_OK);
        ms = qn("SELECT run_ms FROM jobs", NULL);
        ck_assert_int_ge(ms, 300);
        ck_assert_int_eq(qn("SELECT count(*) FROM jobs WHERE claimed_at IS "
                            "NULL",
                            NULL),
                         1);
        /* the next claim starts from there */
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w2, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert_int_eq(claim.retries, 2);
        ck_assert_int_eq(claim.run_ms, ms);
        cq_claim_release(&claim);
        /* a worker that died: counted up to its last heartbeat */
        qexec("UPDATE jobs SET claimed_at = now() - interval '10 s',"
              " heartbeat_at = now() - interval '4 s',"
              " lease_until = now() - interval '1 s'");
        ck_assert_int_eq(cq_store_requeue_expired(reaper, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(requeued, 1);
        ck_assert_int_eq(qn("SELECT run_ms FROM jobs", NULL), ms + 6000);
        /* a finished job's run_ms is its whole running time */
        expect_claim(w1, "r1");
        qexec("UPDATE jobs SET claimed_at = now() - interval '2 s'");
        finish(w1, "r1", "succeeded", NULL);
        s = q1("SELECT run_ms || ' ' || (claimed_at IS NULL) FROM jobs", NULL);
        ck_assert_int_ge(strtol(s, NULL, 10), ms + 8000);
        ck_assert_int_lt(strtol(s, NULL, 10), ms + 8000 + 60000);
        ck_assert_ptr_nonnull(strstr(s, " true"));
        free(s);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
        cq_store_destroy(&reaper);
}
END_TEST

/* A turn is one checkpoint: the cell, its notebook and the messages after
 * it are stored together, or, without the lease, none of them; retried
 * (a lost reply) it finds its own rows; a seq holding another message is
 * a conflict that writes nothing; the start's messages go in one turn
 * without a cell, and what a resumed job reads back is all of it. */
START_TEST(turn_is_one_checkpoint)
{
        cq_store_t *w1 = store_for("w1", 120), *w2 = store_for("w2", 120);
        cq_usage_t usage = {7, 3, 0, 0};
        json_t *start =
            json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]", "role", "system",
                      "content", "sys", "role", "user", "content", "files",
                      "role", "user", "content", "task");
        json_t *reply = json_pack("{s:s, s:s}", "role", "assistant", "content",
                                  "calls x = 1");
        json_t *tool = json_pack("[{s:s, s:s, s:s}]", "role", "tool",
                                 "tool_call_id", "c1", "content", "ok");
        json_t *other = json_pack("[{s:s, s:s, s:s}]", "role", "tool",
                                  "tool_call_id", "c1", "content", "other");
        json_t *nb = json_pack("{s:[{s:s}]}", "cells", "cell_type", "code");
        cq_cell_result_t res;
        cq_checkpoint_t cp;
        cq_claim_t claim;
        bool found, lost = false, budget = true;
        char *s;

        ck_assert_ptr_nonnull(start);
        ck_assert_ptr_nonnull(tool);
        add_job(w1, "t1", 0, NULL, "run-t");
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w1, &claim, &found), CQ_OK);
        ck_assert(found);
        cq_claim_release(&claim);
        memset(&res, 0, sizeof(res));
        res.status = CQ_CELL_OK;
        res.outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                                "name", "stdout", "text", "1\n");
        res.execution_count = 1;
        res.duration_ms = 5;

        /* the start: three messages, one statement */
        ck_assert_msg(cq_store_checkpoint_turn(w1, "t1", 0, NULL, NULL, NULL, 1,
                                               start, NULL, -1, &lost,
                                               &budget) == CQ_OK,
                      "%s", cq_store_errmsg(w1));
        ck_assert(!lost && !budget);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 3);
        ck_assert_int_eq(cq_store_append_message_usage(w1, "t1", 4, reply, NULL,
                                                       -1, &lost, NULL),
                         CQ_OK);
        /* another owner: neither the cell, the notebook nor the message */
        ck_assert_int_eq(cq_store_checkpoint_turn(w2, "t1", 1, "x = 1", &res,
                                                  nb, 5, tool, &usage, 0.5,
                                                  &lost, NULL),
                         CQ_OK);
        ck_assert(lost);
        ck_assert_int_eq(qn("SELECT count(*) FROM cells", NULL), 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM notebooks", NULL), 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 4);
        /* the owner: all of it, and the usage */
        ck_assert_int_eq(cq_store_checkpoint_turn(w1, "t1", 1, "x = 1", &res,
                                                  nb, 5, tool, &usage, 0.5,
                                                  &lost, NULL),
                         CQ_OK);
        ck_assert(!lost);
        s = q1("SELECT (SELECT count(*) FROM cells) || ' ' ||"
               " (SELECT ncells FROM notebooks) || ' ' ||"
               " (SELECT role FROM job_messages WHERE seq = 5) || ' ' ||"
               " prompt_tokens || ' ' || cost_usd FROM jobs",
               NULL);
        ck_assert_str_eq(s, "1 1 tool 7 0.5");
        free(s);
        /* retried: stored, nothing added */
        ck_assert_int_eq(cq_store_checkpoint_turn(w1, "t1", 1, "x = 1", &res,
                                                  nb, 5, tool, &usage, 0.5,
                                                  &lost, NULL),
                         CQ_OK);
        ck_assert(!lost);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 5);
        /* seq 5 holds another message: a conflict, and the next cell is
         * not written either */
        ck_assert_int_eq(cq_store_checkpoint_turn(w1, "t1", 2, "y = 2", &res,
                                                  nb, 5, other, NULL, -1, &lost,
                                                  NULL),
                         CQ_ERR_FATAL);
        ck_assert_int_eq(qn("SELECT count(*) FROM cells", NULL), 1);
        /* what a resume reads */
        cq_checkpoint_init(&cp);
        ck_assert_int_eq(cq_store_load_checkpoint(w1, "t1", &cp), CQ_OK);
        ck_assert_int_eq(cp.last_message_seq, 5);
        ck_assert_int_eq(cp.last_cell_seq, 1);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(cp.messages, 2), "content")),
                         "task");
        cq_checkpoint_release(&cp);
        /* malformed input is refused before any round trip */
        ck_assert_int_eq(cq_store_checkpoint_turn(w1, "t1", 2, "y", &res, nb, 6,
                                                  NULL, NULL, -1, &lost, NULL),
                         CQ_ERR_FATAL);
        json_decref(other);
        other = json_pack("[{s:s}]", "content", "no role");
        ck_assert_int_eq(cq_store_checkpoint_turn(w1, "t1", 0, NULL, NULL, NULL,
                                                  6, other, NULL, -1, &lost,
                                                  NULL),
                         CQ_ERR_FATAL);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 5);
        cq_cell_result_release(&res);
        json_decref(start);
        json_decref(reply);
        json_decref(tool);
        json_decref(other);
        json_decref(nb);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
}
END_TEST

/* An LLM reply and its call's usage are one statement: stored together
 * (the call's budget hold released), or, without the lease, neither; a
 * claim, and every message checkpoint, says whether the job's run has a
 * budget (now). */
START_TEST(reply_and_usage_are_one_checkpoint)
{
        cq_store_t *w1 = store_for("w1", 120), *w2 = store_for("w2", 120);
        cq_usage_t usage = {1000, 500, 20, 10};
        json_t *msg =
            json_pack("{s:s, s:s}", "role", "assistant", "content", "42");
        cq_claim_t claim;
        bool found, lost = true, budget = true;
        char *s;

        add_job(w1, "u1", 0, NULL, "run-free");
        add_job(w1, "u2", 0, NULL, "run-held");
        ck_assert_int_eq(cq_store_set_run_budget(w1, "run-held", 5.0), CQ_OK);
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w1, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert_str_eq(claim.job_id, "u1");
        ck_assert(!claim.run_budget);
        cq_claim_release(&claim);
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(w1, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert_str_eq(claim.job_id, "u2");
        ck_assert(claim.run_budget);
        cq_claim_release(&claim);

        qexec("UPDATE jobs SET budget_hold_usd = 0.5");
        /* another owner: nothing of either is written */
        ck_assert_int_eq(cq_store_append_message_usage(w2, "u1", 1, msg, &usage,
                                                       0.25, &lost, NULL),
                         CQ_OK);
        ck_assert(lost);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 0);
        s = q1("SELECT prompt_tokens || ' ' || budget_hold_usd FROM jobs "
               "WHERE job_id = 'u1'",
               NULL);
        ck_assert_str_eq(s, "0 0.5");
        free(s);
        /* the owner: both, in one statement, which says the run has no
         * budget */
        ck_assert_int_eq(cq_store_append_message_usage(w1, "u1", 1, msg, &usage,
                                                       0.25, &lost, &budget),
                         CQ_OK);
        ck_assert(!lost);
        ck_assert(!budget);
        s = q1("SELECT prompt_tokens || ' ' || completion_tokens || ' ' ||"
               " cache_read_tokens || ' ' || cache_creation_tokens || ' ' ||"
               " cost_usd || ' ' || budget_hold_usd || ' ' ||"
               " (SELECT count(*) FROM job_messages m WHERE m.job_id ="
               " 'u1') FROM jobs WHERE job_id = 'u1'",
               NULL);
        ck_assert_str_eq(s, "1000 500 20 10 0.25 0 1");
        free(s);
        /* retried (a lost reply): the same row, the same totals */
        ck_assert_int_eq(cq_store_append_message_usage(w1, "u1", 1, msg, &usage,
                                                       0.25, &lost, NULL),
                         CQ_OK);
        ck_assert(!lost);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 1);
        /* a budget set on the running job's run: the next message says so;
         * another owner's write says nothing */
        ck_assert_int_eq(cq_store_set_run_budget(w1, "run-free", 0.1), CQ_OK);
        ck_assert_int_eq(cq_store_append_message_usage(w2, "u1", 2, msg, NULL,
                                                       -1, &lost, &budget),
                         CQ_OK);
        ck_assert(lost && !budget);
        ck_assert_int_eq(cq_store_append_message_usage(w1, "u1", 2, msg, NULL,
                                                       -1, &lost, &budget),
                         CQ_OK);
        ck_assert(!lost && budget);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 2);
        /* a message alone leaves the usage and the other job's hold */
        ck_assert_int_eq(cq_store_append_message(w1, "u2", 1, msg, &lost),
                         CQ_OK);
        ck_assert(!lost);
        s = q1("SELECT prompt_tokens || ' ' || budget_hold_usd FROM jobs "
               "WHERE job_id = 'u2'",
               NULL);
        ck_assert_str_eq(s, "0 0.5");
        free(s);
        json_decref(msg);
        cq_store_destroy(&w1);
        cq_store_destroy(&w2);
}
END_TEST

START_TEST(strings_and_bytes_stored_verbatim)
{
        cq_store_t *store = store_for("w'; DROP TABLE jobs; --", 120);
        static const char *const nasty[] = {
            "it's \"quoted\" and back\\slashed \\\\ \\n \\x00",
            "'); DROP TABLE jobs; --",
            "$1 $2 ? %s %n E'\\\\' $$dollar$$ /* c */ -- x",
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xe4\xb8\xad",
            "{\"a\",\"b\"} {} NULL null",
        };
        char ascii[128];
        unsigned char bin[512];
        cq_job_t job;
        cq_claim_t claim;
        cq_images_t images;
        cq_checkpoint_t cp;
        json_t *msg;
        bool found, created, lost;
        char *s;
        size_t i;

        for (i = 0; i < sizeof(ascii) - 1; i++)
                ascii[i] = (char)(i + 1); /* every ASCII byte but NUL */
        ascii[sizeof(ascii) - 1] = '\0';
        for (i = 0; i < sizeof(bin); i++)
                bin[i] = (unsigned char)(i * 7 + 3);
        for (i = 0; i < CQ_ARRAY_SIZE(nasty); i++) {
                char id[64];

                snprintf(id, sizeof(id), "id '%zu\" \\ --", i);
                job_fill(&job, id, nasty[i], 0, NULL, nasty[i]);
                free(job.title);
                job.title = strdup(ascii);
                ck_assert_int_eq(
                    cq_store_upsert_job(store, &job, NULL, &created), CQ_OK);
                ck_assert(created);
                s = q1("SELECT prompt FROM jobs WHERE job_id = $1", id);
                ck_assert_str_eq(s, nasty[i]);
                free(s);
                s = q1("SELECT run_id FROM jobs WHERE job_id = $1", id);
                ck_assert_str_eq(s, nasty[i]);
                free(s);
                s = q1("SELECT title FROM jobs WHERE job_id = $1", id);
                ck_assert_str_eq(s, ascii);
                free(s);
                cq_claim_init(&claim);
                ck_assert_int_eq(cq_store_claim(store, &claim, &found), CQ_OK);
                ck_assert(found);
                ck_assert_str_eq(claim.job_id, id);
                ck_assert(json_equal(claim.spec, job.spec));
                /* Conversation and bytes of the same job. */
                msg = json_pack("{s:s, s:s}", "role", "user", "content",
                                nasty[i]);
                ck_assert_int_eq(
                    cq_store_append_message(store, id, 1, msg, &lost), CQ_OK);
                ck_assert(!lost);
                ck_assert_int_eq(
                    cq_store_put_image(store, id, nasty[i], "image/png", bin,
                                       sizeof(bin), 0, NULL, &created),
                    CQ_OK);
                cq_images_init(&images);
                ck_assert_int_eq(cq_store_get_images(store, id, &images),
                                 CQ_OK);
                ck_assert_uint_eq(images.n, 1);
                ck_assert_str_eq(images.v[0].name, nasty[i]);
                ck_assert_uint_eq(images.v[0].len, sizeof(bin));
                ck_assert_mem_eq(images.v[0].data, bin, sizeof(bin));
                cq_images_release(&images);
                cq_checkpoint_init(&cp);
                ck_assert_int_eq(cq_store_load_checkpoint(store, id, &cp),
                                 CQ_OK);
                ck_assert_uint_eq(json_array_size(cp.messages), 1);
                ck_assert(json_equal(json_array_get(cp.messages, 0), msg));
                cq_checkpoint_release(&cp);
                json_decref(msg);
                cq_claim_release(&claim);
                job_free(&job);
        }
        ck_assert_int_eq(qn("SELECT count(*) FROM jobs", NULL), 5);
        s = q1("SELECT lease_owner FROM jobs LIMIT 1", NULL);
        ck_assert_str_eq(s, "w'; DROP TABLE jobs; --");
        free(s);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(image_20mb_round_trips_and_caps)
{
        cq_store_opts_t opts;
        cq_store_t *store, *small;
        const size_t len = (size_t)20 << 20;
        unsigned char *data = malloc(len);
        char sha[65], expect[65], errstr[256];
        cq_images_t images;
        uint64_t x = 88172645463325252ULL;
        bool created;
        size_t i;

        for (i = 0; i < len; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                data[i] = (unsigned char)x;
        }
        cq_sha256_hex(data, len, expect);
        store = store_for("w", 120);
        add_job(store, "img", 0, NULL, NULL);
        ck_assert_msg(cq_store_put_image(store, "img", "plot.png", "image/png",
                                         data, len, 3, sha, &created) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(created);
        ck_assert_str_eq(sha, expect);
        /* The same bytes under another name: stored once, both names
         * kept, each with its cell. */
        ck_assert_int_eq(cq_store_put_image(store, "img", "again.png",
                                            "image/png", data, len, 4, NULL,
                                            &created),
                         CQ_OK);
        ck_assert(!created);
        cq_images_init(&images);
        ck_assert_int_eq(cq_store_get_images(store, "img", &images), CQ_OK);
        ck_assert_uint_eq(images.n, 2);
        for (i = 0; i < images.n; i++) {
                ck_assert_uint_eq(images.v[i].len, len);
                ck_assert_int_eq(memcmp(images.v[i].data, data, len), 0);
                ck_assert_str_eq(images.v[i].sha256, expect);
                ck_assert_str_eq(images.v[i].mime, "image/png");
        }
        ck_assert_str_eq(images.v[0].name, "plot.png");
        ck_assert_int_eq(images.v[0].cell_seq, 3);
        ck_assert_str_eq(images.v[1].name, "again.png");
        ck_assert_int_eq(images.v[1].cell_seq, 4);
        cq_images_release(&images);
        ck_assert_int_eq(qn("SELECT count(*) FROM images", NULL), 1);
        ck_assert_int_eq(qn("SELECT octet_length(data) FROM images", NULL),
                         (long)len);
        {
                char *s =
                    q1("SELECT encode(sha256(data), 'hex') FROM images", NULL);

                ck_assert_str_eq(s, expect);
                free(s);
        }
        /* Over the cap: refused with a clear error, nothing written. */
        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.image_max = 1 << 20;
        small = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_ptr_nonnull(small);
        ck_assert_int_eq(cq_store_put_image(small, "img", "big.png",
                                            "image/png", data + 1,
                                            (1 << 20) + 1, 0, NULL, &created),
                         CQ_ERR_TOO_LARGE);
        ck_assert_ptr_nonnull(strstr(cq_store_errmsg(small),
                                     "exceeds the cap of 1048576 "
                                     "(CODERQ_IMAGE_MAX)"));
        ck_assert_int_eq(qn("SELECT count(*) FROM images", NULL), 1);
        cq_store_destroy(&small);
        cq_store_destroy(&store);
        free(data);
}
END_TEST

/* The figure a cell showed and the file the code saved of it are the same
 * bytes: stored once, under both names, each with its cell; every name
 * reaches the completion event and job_overview counts them. */
START_TEST(figure_keeps_every_name)
{
        static const struct {
                const char *name, *data;
                int cell;
        } stored[] = {
            {"cell3-1.png", "PNG-A", 3},
            {"revenue_by_region.png", "PNG-A", 3},
            {"revenue_by_region.png", "PNG-A", 3}, /* a retried write */
            {"costs.png", "PNG-B", 5},
            {"costs_again.png", "PNG-B", 0},
        };
        static const char *const want[] = {"cell3-1.png",
                                           "revenue_by_region.png", "costs.png",
                                           "costs_again.png"};
        static const int want_cell[] = {3, 3, 5, 0};
        cq_store_t *store = store_for("w", 120);
        cq_images_t images;
        cq_outbox_t box;
        json_t *payload, *list, *entry;
        char sha_a[65], sha_b[65], sha_c[65];
        bool created;
        size_t i;

        memset(sha_c, 'c', 64);
        sha_c[64] = '\0';
        cq_sha256_hex("PNG-A", 5, sha_a);
        cq_sha256_hex("PNG-B", 5, sha_b);
        add_job(store, "fig", 0, NULL, "run");
        free(claim_id(store));
        for (i = 0; i < CQ_ARRAY_SIZE(stored); i++) {
                ck_assert_msg(cq_store_put_image(store, "fig", stored[i].name,
                                                 "image/png", stored[i].data, 5,
                                                 stored[i].cell, NULL,
                                                 &created) == CQ_OK,
                              "%s", cq_store_errmsg(store));
                /* the bytes are new at their first name only */
                ck_assert(created == (i == 0 || i == 3));
        }
        ck_assert_int_eq(qn("SELECT count(*) FROM images", NULL), 2);
        ck_assert_int_eq(qn("SELECT count(*) FROM image_names", NULL), 4);
        /* an image's own cell is that of its first name */
        ck_assert_int_eq(
            qn("SELECT cell_seq FROM images WHERE sha256 = $1", sha_a), 3);
        cq_images_init(&images);
        ck_assert_int_eq(cq_store_get_images(store, "fig", &images), CQ_OK);
        ck_assert_uint_eq(images.n, CQ_ARRAY_SIZE(want));
        for (i = 0; i < images.n; i++) {
                ck_assert_str_eq(images.v[i].name, want[i]);
                ck_assert_int_eq(images.v[i].cell_seq, want_cell[i]);
                ck_assert_str_eq(images.v[i].sha256, i < 2 ? sha_a : sha_b);
                ck_assert_uint_eq(images.v[i].len, 5);
                ck_assert_mem_eq(images.v[i].data, i < 2 ? "PNG-A" : "PNG-B",
                                 5);
        }
        cq_images_release(&images);
        /* A worker not yet upgraded inserts into images alone: its name is
         * kept all the same. */
        qexec("INSERT INTO images (job_id, sha256, mime, name, bytes, data)"
              " VALUES ('fig', repeat('c', 64), 'image/svg+xml', 'old.svg',"
              " 3, 'SVG')");
        finish(store, "fig", "succeeded", NULL);
        ck_assert_int_eq(
            qn("SELECT images FROM job_overview WHERE job_id = 'fig'", NULL),
            5);
        cq_outbox_init(&box);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 1);
        payload = json_loads(box.v[0].payload, 0, NULL);
        ck_assert_ptr_nonnull(payload);
        list = json_object_get(payload, "images");
        ck_assert_uint_eq(json_array_size(list), 5);
        json_array_foreach(list, i, entry)
        {
                const json_t *cell = json_object_get(entry, "cell_seq");

                ck_assert_str_eq(
                    json_string_value(json_object_get(entry, "name")),
                    i < 4 ? want[i] : "old.svg");
                ck_assert_str_eq(
                    json_string_value(json_object_get(entry, "sha256")),
                    i < 2   ? sha_a
                    : i < 4 ? sha_b
                            : sha_c);
                if (i < 4 && want_cell[i])
                        ck_assert_int_eq(json_integer_value(cell),
                                         want_cell[i]);
                else
                        ck_assert(json_is_null(cell));
        }
        json_decref(payload);
        cq_outbox_release(&box);
        cq_store_destroy(&store);
}
END_TEST

static void record(cq_store_t *store,
                   const char *id,
                   const char *code,
                   cq_cell_status_t status,
                   const json_t *nb,
                   int expect_seq)
{
        cq_cell_result_t res;
        bool lost = true;

        memset(&res, 0, sizeof(res));
        res.status = status;
        res.outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                                "name", "stdout", "text", code);
        res.execution_count = expect_seq;
        res.duration_ms = 12;
        ck_assert_msg(cq_store_record_cell(store, id, expect_seq, code, &res,
                                           nb, &lost) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(!lost);
        json_decref(res.outputs);
}

START_TEST(notebook_jsonb_equals_what_was_written)
{
        cq_store_t *store = store_for("w", 120);
        json_t *nb = notebook_doc("# T\xc3\xadtulo \"q\" \\ '"), *big;
        cq_checkpoint_t cp;
        cq_export_t exp;
        cq_cell_result_t res;
        bool found, lost;
        char *pad, *s;
        cq_store_opts_t opts;
        cq_store_t *small;
        char errstr[256];

        add_job(store, "nb", 0, NULL, NULL);
        free(claim_id(store));
        json_object_set_new(nb, "x_float", json_real(0.1));
        json_object_set_new(nb, "x_big", json_integer(9007199254740993LL));
        json_object_set_new(nb, "x_null", json_null());
        record(store, "nb", "print(1)", CQ_CELL_OK, nb, 1);
        cq_checkpoint_init(&cp);
        ck_assert_int_eq(cq_store_load_checkpoint(store, "nb", &cp), CQ_OK);
        ck_assert_ptr_nonnull(cp.notebook);
        ck_assert_msg(json_equal(cp.notebook, nb), "notebook differs");
        cq_checkpoint_release(&cp);
        s = q1("SELECT doc->'metadata'->'kernelspec'->>'name' FROM notebooks",
               NULL);
        ck_assert_str_eq(s, "python3");
        free(s);
        /* The final notebook through finish and export. */
        json_object_set_new(nb, "x_final", json_true());
        finish(store, "nb", "succeeded", nb);
        cq_export_init(&exp);
        ck_assert_int_eq(cq_store_export(store, "nb", &exp, &found), CQ_OK);
        ck_assert(found);
        ck_assert(json_equal(exp.notebook, nb));
        ck_assert_str_eq(exp.answer, "42");
        ck_assert_str_eq(
            json_string_value(json_object_get(exp.status, "status")),
            "succeeded");
        cq_export_release(&exp);
        /* Over the notebook cap: refused, nothing written. */
        add_job(store, "nb2", 0, NULL, NULL);
        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = "w";
        opts.notebook_max = 8192;
        small = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_ptr_nonnull(small);
        free(claim_id(small));
        pad = malloc(10000);
        memset(pad, 'x', 9999);
        pad[9999] = '\0';
        big = json_deep_copy(nb);
        json_object_set_new(big, "pad", json_string(pad));
        memset(&res, 0, sizeof(res));
        res.status = CQ_CELL_OK;
        res.execution_count = -1;
        ck_assert_int_eq(
            cq_store_record_cell(small, "nb2", 1, "x", &res, big, &lost),
            CQ_ERR_TOO_LARGE);
        ck_assert_ptr_nonnull(
            strstr(cq_store_errmsg(small), "(CODERQ_NOTEBOOK_MAX)"));
        ck_assert_int_eq(
            qn("SELECT count(*) FROM cells WHERE job_id = 'nb2'", NULL), 0);
        ck_assert_int_eq(
            qn("SELECT count(*) FROM notebooks WHERE job_id = 'nb2'", NULL), 0);
        free(pad);
        json_decref(big);
        json_decref(nb);
        cq_store_destroy(&small);
        cq_store_destroy(&store);
}
END_TEST

struct migrator {
        const char *dsn;
        const char *dir;
        cq_err_t err;
        int applied;
        char errstr[512];
};

static void *migrator_main(void *arg)
{
        struct migrator *m = arg;

        m->err = cq_migrate_run(m->dsn, m->dir, NULL, NULL, &m->applied,
                                m->errstr, sizeof(m->errstr));
        return NULL;
}

START_TEST(migrations_twice_noop_and_concurrent_safe)
{
        enum { N = 6 };
        struct migrator m[N];
        pthread_t th[N];
        char dsn[2048], name[64], errstr[512], dir[4096];
        int applied = -1, total = 0, i;
        long files;

        /* The fixture migrated this database: again is a no-op. */
        ck_assert_int_eq(cq_migrate_run(g_dsn, cq_check_srcpath("migrations"),
                                        NULL, NULL, &applied, errstr,
                                        sizeof(errstr)),
                         CQ_OK);
        ck_assert_int_eq(applied, 0);
        files = qn("SELECT count(*) FROM schema_migrations", NULL);
        ck_assert_int_ge(files, 1);
        /* Concurrent runners on an empty database. cq_check_srcpath()
         * uses a static buffer: copy it before the threads start. */
        snprintf(dir, sizeof(dir), "%s", cq_check_srcpath("migrations"));
        cq_pgtest_create("cqt", false, dsn, sizeof(dsn), name, sizeof(name));
        for (i = 0; i < N; i++) {
                memset(&m[i], 0, sizeof(m[i]));
                m[i].dsn = dsn;
                m[i].dir = dir;
                ck_assert_int_eq(
                    pthread_create(&th[i], NULL, migrator_main, &m[i]), 0);
        }
        for (i = 0; i < N; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(m[i].err == CQ_OK, "runner %d: %s", i,
                              m[i].errstr);
                total += m[i].applied;
        }
        ck_assert_int_eq(total, files);
        {
                PGconn *conn = cq_pgtest_connect(dsn);
                PGresult *res =
                    PQexec(conn, "SELECT count(*) FROM schema_migrations");

                ck_assert_int_eq(strtol(PQgetvalue(res, 0, 0), NULL, 10),
                                 files);
                PQclear(res);
                PQfinish(conn);
        }
        cq_pgtest_drop(name);
}
END_TEST

static void copy_file(const char *from, const char *to, const char *extra)
{
        FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
        char buf[8192];
        size_t n;

        ck_assert_ptr_nonnull(in);
        ck_assert_ptr_nonnull(out);
        while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
                ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
        if (extra)
                fputs(extra, out);
        fclose(in);
        fclose(out);
}

static void write_file(const char *path, const char *text)
{
        FILE *fp = fopen(path, "w");

        ck_assert_ptr_nonnull(fp);
        fputs(text, fp);
        fclose(fp);
}

static int run_migrate_cli(const char *dsn, const char *dir)
{
        char cmd[8192];
        int rc;

        snprintf(cmd, sizeof(cmd),
                 "CODERQ_PG_DSN=\"%s\" CODERQ_MIGRATIONS_DIR='%s' "
                 "'%s/coderq' migrate >/dev/null 2>&1",
                 dsn, dir, CQ_BINARY_DIR);
        rc = system(cmd);
        ck_assert(WIFEXITED(rc));
        return WEXITSTATUS(rc);
}

/* Copy every migration of the source tree into \p dir; with \p remove,
 * delete those copies instead. Returns how many there are. */
static long each_migration(const char *dir, bool remove)
{
        DIR *d = opendir(cq_check_srcpath("migrations"));
        struct dirent *e;
        char from[512], to[512];
        long n = 0;

        ck_assert_ptr_nonnull(d);
        while ((e = readdir(d)) != NULL) {
                size_t len = strlen(e->d_name);

                if (len < 5 || strcmp(e->d_name + len - 4, ".sql") != 0)
                        continue;
                snprintf(from, sizeof(from), "migrations/%s", e->d_name);
                snprintf(to, sizeof(to), "%s/%s", dir, e->d_name);
                if (remove)
                        unlink(to);
                else
                        copy_file(cq_check_srcpath(from), to, NULL);
                n++;
        }
        closedir(d);
        return n;
}

START_TEST(changed_applied_migration_is_refused)
{
        char dir[] = "/tmp/cq-migrations-XXXXXX";
        char path[512], path2[512], errstr[1024];
        int applied = -1;
        long base;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/0001_schema.sql", dir);
        snprintf(path2, sizeof(path2), "%s/0900_more.sql", dir);
        base = qn("SELECT count(*) FROM schema_migrations", NULL);
        ck_assert_int_eq(base, each_migration(dir, false));
        ck_assert_int_eq(cq_migrate_run(g_dsn, dir, NULL, NULL, &applied,
                                        errstr, sizeof(errstr)),
                         CQ_OK);
        ck_assert_int_eq(applied, 0);
        ck_assert_int_eq(run_migrate_cli(g_dsn, dir), 0);
        /* A database that recorded 0001 before one of its comments was
         * reworded (storage/migrate.c, reworded) still migrates. */
        qexec(
            "UPDATE schema_migrations SET checksum = "
            "'33b226bcde50851682c81e0ada0143fac8fd9d4e54dd7d977fe89313ffcf247a'"
            " WHERE version = 1");
        ck_assert_int_eq(cq_migrate_run(g_dsn, dir, NULL, NULL, &applied,
                                        errstr, sizeof(errstr)),
                         CQ_OK);
        /* One changed byte (a comment) is refused. */
        copy_file(cq_check_srcpath("migrations/0001_schema.sql"), path,
                  "-- harmless?\n");
        ck_assert_int_eq(cq_migrate_run(g_dsn, dir, NULL, NULL, &applied,
                                        errstr, sizeof(errstr)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(errstr, "migration \"0001_schema.sql\" was "
                                     "changed after it was applied") != NULL,
                      "%s", errstr);
        ck_assert_int_eq(run_migrate_cli(g_dsn, dir), 1);
        copy_file(cq_check_srcpath("migrations/0001_schema.sql"), path, NULL);
        /* A failing migration rolls back whole and is not recorded. */
        write_file(path2, "CREATE TABLE half_done (x int);\n"
                          "SELECT no_such_function();\n");
        ck_assert_int_eq(cq_migrate_run(g_dsn, dir, NULL, NULL, &applied,
                                        errstr, sizeof(errstr)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(errstr, "could not apply migration "
                                     "\"0900_more.sql\"") != NULL,
                      "%s", errstr);
        ck_assert_int_eq(applied, 0);
        ck_assert_ptr_null(q1("SELECT to_regclass('half_done')::text", NULL));
        ck_assert_int_eq(qn("SELECT count(*) FROM schema_migrations", NULL),
                         base);
        /* Fixed, it applies once. */
        write_file(path2, "CREATE TABLE half_done (x int);\n");
        ck_assert_int_eq(cq_migrate_run(g_dsn, dir, NULL, NULL, &applied,
                                        errstr, sizeof(errstr)),
                         CQ_OK);
        ck_assert_int_eq(applied, 1);
        ck_assert_int_eq(run_migrate_cli(g_dsn, dir), 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM schema_migrations", NULL),
                         base + 1);
        /* An older folder that lacks an applied migration is refused. */
        unlink(path2);
        ck_assert_int_eq(cq_migrate_run(g_dsn, dir, NULL, NULL, &applied,
                                        errstr, sizeof(errstr)),
                         CQ_ERR_FATAL);
        ck_assert_ptr_nonnull(strstr(errstr, "has no file"));
        ck_assert_int_eq(
            run_migrate_cli("postgresql://nobody@127.0.0.1:1/none", dir), 4);
        each_migration(dir, true);
        rmdir(dir);
}
END_TEST

/* A database with images from before 0008: each keeps its name and cell. */
START_TEST(image_names_migrate_stored_images)
{
        char dir[] = "/tmp/cq-migrations-XXXXXX";
        char dsn[2048], dbname[64], path[512], errstr[1024];
        const char *name = "0008_image_names.sql";
        int applied = 0;
        PGconn *conn;
        PGresult *res;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        each_migration(dir, false);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        ck_assert_int_eq(unlink(path), 0);
        cq_pgtest_create("cqt", false, dsn, sizeof(dsn), dbname,
                         sizeof(dbname));
        ck_assert_msg(cq_migrate_run(dsn, dir, NULL, NULL, &applied, errstr,
                                     sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
        conn = cq_pgtest_connect(dsn);
        cq_pgtest_exec(conn,
                       "INSERT INTO jobs (job_id, prompt, spec) VALUES"
                       " ('old', 'p', '{}');"
                       "INSERT INTO images (job_id, sha256, mime, name,"
                       " cell_seq, bytes, data) VALUES"
                       " ('old', repeat('a', 64), 'image/png', 'cell1-1.png',"
                       "  1, 1, 'A'),"
                       " ('old', repeat('b', 64), 'image/png', 'plot.png',"
                       "  NULL, 1, 'B')");
        each_migration(dir, true);
        each_migration(dir, false);
        ck_assert_msg(cq_migrate_run(dsn, dir, NULL, NULL, &applied, errstr,
                                     sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
        ck_assert_int_eq(applied, 1);
        res = PQexec(conn, "SELECT string_agg(n.name || ':' ||"
                           " COALESCE(n.cell_seq::text, '-'), ',' ORDER BY"
                           " n.name_id) FROM image_names n JOIN images i"
                           " USING (image_id) WHERE i.job_id = 'old'");
        ck_assert_int_eq(PQresultStatus(res), PGRES_TUPLES_OK);
        ck_assert_str_eq(PQgetvalue(res, 0, 0), "cell1-1.png:1,plot.png:-");
        PQclear(res);
        PQfinish(conn);
        cq_pgtest_drop(dbname);
        each_migration(dir, true);
        rmdir(dir);
}
END_TEST

START_TEST(duplicate_upserts_give_one_job)
{
        cq_store_t *a = store_for("intake-a", 120);
        cq_store_t *b = store_for("intake-b", 120);
        cq_job_src_t src = {"coderq.jobs", 2, 41};
        cq_job_t job;
        bool created;
        int i, n = 0;
        char *s;

        job_fill(&job, "dup", "first", 0, NULL, NULL);
        for (i = 0; i < 6; i++) {
                ck_assert_int_eq(
                    cq_store_upsert_job(i % 2 ? a : b, &job, &src, &created),
                    CQ_OK);
                n += created;
                src.offset++;
                free(job.prompt);
                job.prompt = strdup("a later duplicate");
        }
        ck_assert_int_eq(n, 1);
        s = q1("SELECT count(*) || ' ' || min(prompt) || ' ' ||"
               " min(source_topic) || ':' || min(source_partition) || ':' ||"
               " min(source_offset) FROM jobs",
               NULL);
        ck_assert_str_eq(s, "1 first coderq.jobs:2:41");
        free(s);
        job_free(&job);
        cq_store_destroy(&a);
        cq_store_destroy(&b);
}
END_TEST

START_TEST(batch_upsert_is_one_atomic_statement)
{
        cq_store_t *store = store_for("intake", 120);
        cq_job_t jobs[5];
        cq_job_upsert_t v[5];
        cq_job_src_t src[5];
        const char *ids[5] = {"b-1", "b-2 \"quoted\\", "b-1", "old", "b-3"};
        char cname[64], sql[256], *s;
        int i;

        add_job(store, "old", 0, NULL, NULL);
        for (i = 0; i < 5; i++) {
                job_fill(&jobs[i], ids[i], i == 4 ? "it's {x}, \\n" : "p", 0,
                         NULL, "batch");
                src[i].topic = "coderq.jobs";
                src[i].partition = 1;
                src[i].offset = 100 + i;
                v[i].job = &jobs[i];
                v[i].src = i == 1 ? NULL : &src[i];
                v[i].created = true; /* must be reset */
        }
        ck_assert_msg(cq_store_upsert_jobs(store, v, 5) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        /* a repeated id is one job, the first; an existing one is kept */
        ck_assert(v[0].created && v[1].created && !v[2].created &&
                  !v[3].created && v[4].created);
        ck_assert_int_eq(
            qn("SELECT count(*) FROM jobs WHERE run_id = 'batch'", NULL), 3);
        s = q1("SELECT source_offset || ',' || COALESCE(source_topic, '-') "
               "FROM jobs WHERE job_id = $1",
               "b-1");
        ck_assert_str_eq(s, "100,coderq.jobs");
        free(s);
        s = q1("SELECT COALESCE(source_topic, 'none') FROM jobs WHERE "
               "job_id = $1",
               ids[1]);
        ck_assert_str_eq(s, "none");
        free(s);
        s = q1("SELECT prompt FROM jobs WHERE job_id = $1", "b-3");
        ck_assert_str_eq(s, "it's {x}, \\n");
        free(s);
        /* queue order is batch order (after the older job) */
        expect_claim(store, "old");
        expect_claim(store, "b-1");
        expect_claim(store, ids[1]);
        /* one refused job refuses the batch: nothing of it lands */
        snprintf(cname, sizeof(cname), "no_poison_%ld", (long)getpid());
        snprintf(sql, sizeof(sql),
                 "ALTER TABLE jobs ADD CONSTRAINT %s CHECK (prompt <> "
                 "'poison') NOT VALID",
                 cname);
        qexec(sql);
        for (i = 0; i < 5; i++)
                job_free(&jobs[i]);
        job_fill(&jobs[0], "c-1", "fine", 0, NULL, "batch2");
        job_fill(&jobs[1], "c-2", "poison", 0, NULL, "batch2");
        ck_assert_int_eq(cq_store_upsert_jobs(store, v, 2), CQ_ERR_FATAL);
        ck_assert_msg(strstr(cq_store_errmsg(store), cname) != NULL, "%s",
                      cq_store_errmsg(store));
        ck_assert_int_eq(
            qn("SELECT count(*) FROM jobs WHERE run_id = 'batch2'", NULL), 0);
        ck_assert_int_eq(cq_store_upsert_jobs(store, v, 0), CQ_OK);
        job_free(&jobs[0]);
        job_free(&jobs[1]);
        cq_store_destroy(&store);
}
END_TEST

/* Wait (bounded) for the listener to report at least \p want jobs. */
static long listen_sum(cq_listener_t *l, long want)
{
        long sum = 0;
        int i;

        for (i = 0; i < 100 && sum < want; i++) {
                bool reconnected;
                long n = cq_listener_wait(l, 100, &reconnected);

                if (n > 0)
                        sum += n;
        }
        return sum;
}

START_TEST(claimable_jobs_are_announced)
{
        cq_store_t *store = store_for("w", 120);
        cq_store_opts_t opts;
        cq_listener_t *l;
        cq_job_t jobs[4];
        cq_job_upsert_t v[4];
        bool reconnected = false;
        char *id;
        long n;
        int i;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        l = cq_listener_new(&opts, CQ_CHANNEL_JOBS, NULL, 0);
        ck_assert_ptr_nonnull(l);
        /* nothing yet */
        ck_assert_int_eq(cq_listener_wait(l, 50, &reconnected), 0);
        /* a batch of four new jobs: one notification saying 4 */
        for (i = 0; i < 4; i++) {
                char jid[16];

                snprintf(jid, sizeof(jid), "n%d", i);
                job_fill(&jobs[i], jid, "p", 0, i >= 2 ? "n0" : NULL, NULL);
                v[i].job = &jobs[i];
                v[i].src = NULL;
        }
        ck_assert_int_eq(cq_store_upsert_jobs(store, v, 4), CQ_OK);
        ck_assert_int_eq(listen_sum(l, 4), 4);
        /* a claim announces nothing; a job given back is claimable again */
        id = claim_id(store);
        ck_assert_str_eq(id, "n0");
        ck_assert_int_eq(cq_listener_wait(l, 100, &reconnected), 0);
        ck_assert_int_eq(cq_store_release(store, id), CQ_OK);
        ck_assert_int_eq(listen_sum(l, 1), 1);
        free(id);
        /* a parent that succeeds makes its two children claimable */
        id = claim_id(store);
        ck_assert_str_eq(id, "n0");
        finish(store, id, "succeeded", NULL);
        free(id);
        n = listen_sum(l, 2);
        ck_assert_int_eq(n, 2);
        /* a lost connection is re-established and said so */
        qexec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
              "WHERE application_name = 'coderq-listen' AND "
              "datname = current_database()");
        for (i = 0; i < 100 && !reconnected; i++)
                (void)cq_listener_wait(l, 100, &reconnected);
        ck_assert(reconnected);
        ck_assert_uint_ge(cq_listener_reconnects(l), 1);
        ck_assert_str_eq(cq_listener_errmsg(l), "");
        /* and hears again */
        id = claim_id(store);
        ck_assert_ptr_nonnull(id);
        ck_assert_int_eq(cq_store_release(store, id), CQ_OK);
        ck_assert_int_ge(listen_sum(l, 1), 1);
        free(id);
        cq_listener_destroy(&l);
        ck_assert_ptr_null(l);
        for (i = 0; i < 4; i++)
                job_free(&jobs[i]);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(outbox_rows_marked_sent_only_when_asked)
{
        cq_store_t *store = store_for("w", 120);
        cq_outbox_t box;
        json_t *payload;
        char sha[65];
        int i;

        for (i = 0; i < 3; i++) {
                char id[16];

                snprintf(id, sizeof(id), "o%d", i);
                add_job(store, id, 0, NULL, "run");
                free(claim_id(store));
                ck_assert_int_eq(cq_store_put_image(store, id, "a.png",
                                                    "image/png", "PNG", 3, 1,
                                                    NULL, NULL),
                                 CQ_OK);
                finish(store, id, i == 1 ? "failed" : "succeeded", NULL);
        }
        cq_outbox_init(&box);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 3);
        ck_assert_str_eq(box.v[0].key, "o0");
        ck_assert_str_eq(box.v[2].key, "o2");
        ck_assert_str_eq(box.v[1].topic, CQ_STORE_RESULTS_TOPIC);
        payload = json_loads(box.v[1].payload, 0, NULL);
        ck_assert_ptr_nonnull(payload);
        ck_assert_str_eq(json_string_value(json_object_get(payload, "status")),
                         "failed");
        ck_assert_str_eq(json_string_value(json_object_get(payload, "reason")),
                         "tests failed");
        ck_assert_str_eq(json_string_value(json_object_get(payload, "run_id")),
                         "run");
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(payload, "tests"), "passed")),
                         2);
        ck_assert_int_eq(
            json_integer_value(json_object_get(
                json_object_get(payload, "usage"), "prompt_tokens")),
            100);
        cq_sha256_hex("PNG", 3, sha);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(payload, "images"), 0),
                "sha256")),
            sha);
        json_decref(payload);
        /* Fetching again does not mark anything. */
        cq_outbox_release(&box);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 3);
        {
                const char *one[1] = {box.v[1].event_id};

                ck_assert_int_eq(cq_store_outbox_mark_sent(store, one, 1),
                                 CQ_OK);
                ck_assert_int_eq(cq_store_outbox_mark_sent(store, one, 1),
                                 CQ_OK);
                ck_assert_int_eq(cq_store_outbox_mark_sent(store, NULL, 0),
                                 CQ_OK);
        }
        cq_outbox_release(&box);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 1, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 1);
        ck_assert_str_eq(box.v[0].key, "o0");
        cq_outbox_release(&box);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 2);
        ck_assert_str_eq(box.v[1].key, "o2");
        cq_outbox_release(&box);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox WHERE sent_at IS "
                            "NOT NULL AND job_id = 'o1'",
                            NULL),
                         1);
        /* several at once, one of them already sent */
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 2);
        {
                char *sent = q1("SELECT event_id::text FROM outbox WHERE "
                                "job_id = 'o1'",
                                NULL);
                const char *ids[3] = {box.v[0].event_id, sent,
                                      box.v[1].event_id};

                ck_assert_int_eq(cq_store_outbox_mark_sent(store, ids, 3),
                                 CQ_OK);
                free(sent);
        }
        cq_outbox_release(&box);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &box), CQ_OK);
        ck_assert_uint_eq(box.n, 0);
        cq_outbox_release(&box);
        cq_store_destroy(&store);
}
END_TEST

/* Claims keep relays apart: a claimed row is not claimed again until its
 * lease expires; a released row waits out its backoff; a failed row is
 * never claimed and shows in the summary and the job's events. */
START_TEST(outbox_claims_are_exclusive_and_failed_rows_skipped)
{
        cq_store_t *store = store_for("w", 120);
        cq_store_t *other = store_for("other", 120);
        cq_outbox_t a, b;
        json_t *sum, *ev;
        char o0[37], o1[37], o2[37];
        const char *ids[1];
        int i;

        for (i = 0; i < 3; i++) {
                char id[16];

                snprintf(id, sizeof(id), "o%d", i);
                add_job(store, id, 0, NULL, "run");
                free(claim_id(store));
                finish(store, id, "succeeded", NULL);
        }
        cq_outbox_init(&a);
        cq_outbox_init(&b);
        ck_assert_int_eq(cq_store_outbox_claim(store, "A", 2, 60000, &a),
                         CQ_OK);
        ck_assert_uint_eq(a.n, 2);
        ck_assert_str_eq(a.v[0].key, "o0");
        ck_assert_str_eq(a.v[1].key, "o1");
        ck_assert_int_eq(a.v[0].attempts, 1);
        snprintf(o0, sizeof(o0), "%s", a.v[0].event_id);
        snprintf(o1, sizeof(o1), "%s", a.v[1].event_id);
        ck_assert_int_eq(cq_store_outbox_claim(other, "B", 10, 60000, &b),
                         CQ_OK);
        ck_assert_uint_eq(b.n, 1);
        ck_assert_str_eq(b.v[0].key, "o2");
        snprintf(o2, sizeof(o2), "%s", b.v[0].event_id);
        cq_outbox_release(&a);
        cq_outbox_release(&b);
        ck_assert_int_eq(cq_store_outbox_claim(store, "A", 10, 60000, &a),
                         CQ_OK);
        ck_assert_uint_eq(a.n, 0);
        /* Released with a long backoff: nobody claims it meanwhile; only
         * its claimant can release it. */
        ids[0] = o2;
        ck_assert_int_eq(
            cq_store_outbox_release(store, "A", ids, 1, "nope", 100000, 100000),
            CQ_OK);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox WHERE job_id = 'o2'"
                            " AND claimed_by = 'B'",
                            NULL),
                         1);
        ck_assert_int_eq(
            cq_store_outbox_release(other, "B", ids, 1, "boom", 100000, 100000),
            CQ_OK);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox WHERE job_id = 'o2'"
                            " AND claimed_by IS NULL AND error = 'boom'"
                            " AND claimed_until > now() + interval '90 s'",
                            NULL),
                         1);
        ck_assert_int_eq(cq_store_outbox_claim(other, "B", 10, 60000, &b),
                         CQ_OK);
        ck_assert_uint_eq(b.n, 0);
        /* Failed for good: out of every claim and fetch. */
        ck_assert_int_eq(cq_store_outbox_mark_failed(store, o0, "too large"),
                         CQ_OK);
        qexec("UPDATE outbox SET claimed_until = now() - interval '1 s'");
        ck_assert_int_eq(cq_store_outbox_claim(other, "B", 10, 60000, &b),
                         CQ_OK);
        ck_assert_uint_eq(b.n, 2);
        ck_assert_str_eq(b.v[0].event_id, o1);
        ck_assert_int_eq(b.v[0].attempts, 2);
        ck_assert_str_eq(b.v[1].event_id, o2);
        cq_outbox_release(&b);
        ck_assert_int_eq(cq_store_outbox_fetch(store, 10, &b), CQ_OK);
        ck_assert_uint_eq(b.n, 2);
        cq_outbox_release(&b);
        ids[0] = o1;
        ck_assert_int_eq(cq_store_outbox_mark_sent(other, ids, 1), CQ_OK);
        ck_assert_int_eq(cq_store_outbox_summary(store, 5, &sum), CQ_OK);
        ck_assert_int_eq(json_integer_value(json_object_get(sum, "failed")), 1);
        ck_assert_int_eq(json_integer_value(json_object_get(sum, "sent")), 1);
        ck_assert_int_eq(json_integer_value(json_object_get(sum, "pending")),
                         1);
        ck_assert_int_eq(json_integer_value(json_object_get(sum, "claimed")),
                         1);
        ev = json_array_get(json_object_get(sum, "failed_rows"), 0);
        ck_assert_str_eq(json_string_value(json_object_get(ev, "job_id")),
                         "o0");
        ck_assert_str_eq(json_string_value(json_object_get(ev, "error")),
                         "too large");
        json_decref(sum);
        ck_assert_int_eq(cq_store_outbox_job(store, "o0", &ev), CQ_OK);
        ck_assert_uint_eq(json_array_size(ev), 1);
        ck_assert_str_eq(
            json_string_value(json_object_get(json_array_get(ev, 0), "state")),
            "failed");
        json_decref(ev);
        ck_assert_int_eq(cq_store_outbox_job(store, "o1", &ev), CQ_OK);
        ck_assert_str_eq(
            json_string_value(json_object_get(json_array_get(ev, 0), "state")),
            "sent");
        json_decref(ev);
        ck_assert_int_eq(cq_store_outbox_job(store, "nope", &ev), CQ_OK);
        ck_assert_uint_eq(json_array_size(ev), 0);
        json_decref(ev);
        cq_store_destroy(&other);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(cancel_queued_now_running_by_flag)
{
        cq_store_t *store = store_for("w", 120);
        cq_store_t *other = store_for("other", 120);
        cq_cancel_outcome_t out;
        bool requested = true;
        static const char *const ids[] = {"r"};
        int requeued = -1, failed = -1;
        char *s;

        add_job(store, "q", 0, NULL, NULL);
        add_job(store, "r", 0, NULL, NULL);
        qexec("UPDATE jobs SET priority = 1 WHERE job_id = 'r'");
        expect_claim(store, "r");
        ck_assert_int_eq(cq_store_cancel_requested(store, ids, 1, &requested),
                         CQ_OK);
        ck_assert(!requested);
        /* Queued: cancelled at once, with its event. */
        ck_assert_int_eq(cq_store_cancel(other, "q", &out), CQ_OK);
        ck_assert_int_eq(out, CQ_CANCEL_DONE);
        s = q1("SELECT status || ' ' || (finished_at IS NOT NULL) || ' ' ||"
               " (SELECT payload->>'status' FROM outbox o WHERE o.job_id ="
               " j.job_id) FROM jobs j WHERE job_id = 'q'",
               NULL);
        ck_assert_str_eq(s, "cancelled true cancelled");
        free(s);
        ck_assert_ptr_null(claim_id(store));
        /* Running: a flag the owner polls; the owner then finishes it. */
        ck_assert_int_eq(cq_store_cancel(other, "r", &out), CQ_OK);
        ck_assert_int_eq(out, CQ_CANCEL_REQUESTED);
        s = q1("SELECT status FROM jobs WHERE job_id = 'r'", NULL);
        ck_assert_str_eq(s, "running");
        free(s);
        ck_assert_int_eq(cq_store_cancel_requested(store, ids, 1, &requested),
                         CQ_OK);
        ck_assert(requested);
        ck_assert_int_eq(cq_store_cancel_requested(other, ids, 1, &requested),
                         CQ_OK);
        ck_assert(!requested); /* not its job */
        {
                /* Many at once: only the running one with the flag; an
                 * unknown id and a finished job are false. */
                static const char *const three[] = {"nope", "r", "q"};
                bool req[3] = {true, false, true};

                ck_assert_int_eq(
                    cq_store_cancel_requested(store, three, 3, req), CQ_OK);
                ck_assert(!req[0] && req[1] && !req[2]);
        }
        finish(store, "r", "cancelled", NULL);
        ck_assert_int_eq(cq_store_cancel(other, "r", &out), CQ_OK);
        ck_assert_int_eq(out, CQ_CANCEL_FINISHED);
        ck_assert_int_eq(cq_store_cancel(other, "nope", &out), CQ_OK);
        ck_assert_int_eq(out, CQ_CANCEL_NOT_FOUND);
        ck_assert_int_eq(qn("SELECT count(*) FROM outbox", NULL), 2);
        /* A cancelled job whose worker vanished is cancelled by the reaper,
         * not run again. */
        add_job(store, "gone", 0, NULL, NULL);
        expect_claim(store, "gone");
        ck_assert_int_eq(cq_store_cancel(other, "gone", &out), CQ_OK);
        ck_assert_int_eq(out, CQ_CANCEL_REQUESTED);
        qexec("UPDATE jobs SET lease_until = now() - interval '1 s'");
        ck_assert_int_eq(cq_store_requeue_expired(other, &requeued, &failed),
                         CQ_OK);
        ck_assert_int_eq(requeued, 0);
        ck_assert_int_eq(failed, 1);
        s = q1("SELECT status || ': ' || reason || ' ' || (SELECT"
               " payload->>'status' FROM outbox o WHERE o.job_id = j.job_id)"
               " FROM jobs j WHERE job_id = 'gone'",
               NULL);
        ck_assert_str_eq(s, "cancelled: cancelled; its worker lost the lease "
                            "cancelled");
        free(s);
        ck_assert_ptr_null(claim_id(store));
        cq_store_destroy(&store);
        cq_store_destroy(&other);
}
END_TEST

START_TEST(checkpoint_loads_in_order)
{
        cq_store_t *store = store_for("w", 120);
        cq_store_t *thief = store_for("thief", 120);
        static const char *const roles[] = {"system", "user", "assistant",
                                            "tool", "assistant"};
        cq_checkpoint_t cp;
        cq_claim_t claim;
        json_t *msg;
        bool lost, found;
        int i;

        add_job(store, "cp", 0, NULL, NULL);
        free(claim_id(store));
        for (i = 0; i < 5; i++) {
                msg = json_pack("{s:s, s:s, s:i}", "role", roles[i], "content",
                                roles[i], "n", i);
                ck_assert_int_eq(
                    cq_store_append_message(store, "cp", i + 1, msg, &lost),
                    CQ_OK);
                ck_assert(!lost);
                json_decref(msg);
                if (i < 3)
                        record(store, "cp",
                               i == 0   ? "x = 1"
                               : i == 1 ? "y = 2; 1/0"
                                        : "while True: pass",
                               i == 0   ? CQ_CELL_OK
                               : i == 1 ? CQ_CELL_ERROR
                                        : CQ_CELL_TIMEOUT,
                               NULL, i + 1);
        }
        record(store, "cp", "z = 3", CQ_CELL_OK, NULL, 4);
        /* Someone without the lease cannot append. */
        msg = json_pack("{s:s}", "role", "user");
        ck_assert_int_eq(cq_store_append_message(thief, "cp", 6, msg, &lost),
                         CQ_OK);
        ck_assert(lost);
        json_decref(msg);
        msg = json_pack("{s:i}", "role", 3);
        ck_assert_int_eq(cq_store_append_message(store, "cp", 6, msg, &lost),
                         CQ_ERR_FATAL);
        json_decref(msg);
        cq_checkpoint_init(&cp);
        ck_assert_int_eq(cq_store_load_checkpoint(store, "cp", &cp), CQ_OK);
        ck_assert_uint_eq(json_array_size(cp.messages), 5);
        for (i = 0; i < 5; i++)
                ck_assert_int_eq(
                    json_integer_value(json_object_get(
                        json_array_get(cp.messages, (size_t)i), "n")),
                    i);
        /* The cells that ran to the end, failed ones included (they may
         * have set state); the one that timed out is not replayed. */
        ck_assert_uint_eq(json_array_size(cp.cells), 3);
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_array_get(cp.cells, 0), "seq")),
                         1);
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_array_get(cp.cells, 1), "seq")),
                         2);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(cp.cells, 1), "status")),
                         "error");
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_array_get(cp.cells, 2), "seq")),
                         4);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(cp.cells, 2), "code")),
                         "z = 3");
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(
                    json_object_get(json_array_get(cp.cells, 2), "outputs"), 0),
                "text")),
            "z = 3");
        ck_assert_ptr_null(cp.notebook);
        cq_checkpoint_release(&cp);
        /* A resumed job says it has a checkpoint. */
        qexec("UPDATE jobs SET lease_until = now() - interval '1 s'");
        ck_assert_int_eq(cq_store_requeue_expired(thief, NULL, NULL), CQ_OK);
        cq_claim_init(&claim);
        ck_assert_int_eq(cq_store_claim(thief, &claim, &found), CQ_OK);
        ck_assert(found);
        ck_assert(claim.has_checkpoint);
        ck_assert_int_eq(claim.attempt, 2);
        cq_claim_release(&claim);
        cq_checkpoint_init(&cp);
        ck_assert_int_eq(cq_store_load_checkpoint(store, "none", &cp), CQ_OK);
        ck_assert_uint_eq(json_array_size(cp.messages), 0);
        ck_assert_uint_eq(json_array_size(cp.cells), 0);
        cq_checkpoint_release(&cp);
        cq_store_destroy(&store);
        cq_store_destroy(&thief);
}
END_TEST

START_TEST(memory_recalls_similar_not_unrelated)
{
        static const char fact_prompt[] = "Compute the factorial of a number "
                                          "n with a recursive function";
        cq_store_t *store = store_for("w", 120);
        cq_solution_t sol;
        bool found;

        add_job(store, "m1", 0, NULL, NULL);
        ck_assert_int_eq(
            cq_store_remember(store, "m1", "s1", "model-a",
                              "Write a function that computes the factorial "
                              "of a number n recursively",
                              "def fact(n):\n    return 1 if n < 2 else n * "
                              "fact(n - 1)",
                              "fact(5) = 120"),
            CQ_OK);
        ck_assert_int_eq(
            cq_store_remember(store, NULL, "s1", "model-a",
                              "Load the titanic CSV and plot a histogram of "
                              "passenger ages",
                              "df.age.hist()", NULL),
            CQ_OK);
        ck_assert_int_eq(
            cq_store_remember(store, NULL, "s1", "model-a",
                              "Solve the linear system Ax = b with numpy",
                              "np.linalg.solve(A, b)", NULL),
            CQ_OK);
        cq_solution_init(&sol);
        ck_assert_int_eq(cq_store_recall(store, "s1", "model-a", fact_prompt,
                                         -1, &sol, &found),
                         CQ_OK);
        ck_assert(found);
        ck_assert_str_eq(sol.job_id, "m1");
        ck_assert_str_eq(sol.model, "model-a");
        ck_assert_ptr_nonnull(strstr(sol.code, "def fact"));
        ck_assert_str_eq(sol.answer, "fact(5) = 120");
        ck_assert(sol.similarity >= 0.3 && sol.similarity <= 1.0);
        cq_solution_release(&sol);
        /* Any model (cross-model recall) finds it too. */
        ck_assert_int_eq(
            cq_store_recall(store, "s1", NULL, fact_prompt, -1, &sol, &found),
            CQ_OK);
        ck_assert(found);
        cq_solution_release(&sol);
        /* Another model in the same scope, or another scope: nothing. */
        ck_assert_int_eq(cq_store_recall(store, "s1", "model-b", fact_prompt,
                                         -1, &sol, &found),
                         CQ_OK);
        ck_assert(!found);
        ck_assert_int_eq(cq_store_recall(store, "s2", "model-a", fact_prompt,
                                         -1, &sol, &found),
                         CQ_OK);
        ck_assert(!found);
        ck_assert_int_eq(
            cq_store_recall(store, "s2", NULL, fact_prompt, -1, &sol, &found),
            CQ_OK);
        ck_assert(!found);
        /* Rows without a scope (remembered before scopes existed) are
         * never recalled. */
        /* A stricter threshold turns a near match away. */
        ck_assert_int_eq(cq_store_recall(store, "s1", "model-a", fact_prompt,
                                         0.99, &sol, &found),
                         CQ_OK);
        ck_assert(!found);
        qexec("UPDATE solutions SET scope = NULL");
        ck_assert_int_eq(
            cq_store_recall(store, "s1", NULL, fact_prompt, -1, &sol, &found),
            CQ_OK);
        ck_assert(!found);
        ck_assert_int_eq(cq_store_recall(store, "s1", "model-a",
                                         "Fetch the weather forecast for "
                                         "Paris from an HTTP API",
                                         -1, &sol, &found),
                         CQ_OK);
        ck_assert(!found);
        ck_assert_ptr_null(sol.prompt);
        ck_assert_int_eq(
            cq_store_recall(store, "s1", NULL, "x", 1.5, &sol, &found),
            CQ_ERR_FATAL);
        ck_assert_int_eq(
            cq_store_recall(store, NULL, NULL, "x", -1, &sol, &found),
            CQ_ERR_FATAL);
        ck_assert_int_eq(
            cq_store_remember(store, NULL, NULL, "model-a", "p", "c", NULL),
            CQ_ERR_FATAL);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(run_queries_for_people)
{
        cq_store_t *store = store_for("w", 120);
        json_t *rows, *row, *summary;
        cq_export_t exp;
        const char *key;
        json_t *value;
        bool found;
        /* the documented keys of cq_store_run_results(), in order */
        static const char *const keys[] = {"job_id",
                                           "title",
                                           "status",
                                           "reason",
                                           "reason_code",
                                           "attempts",
                                           "turns",
                                           "retries",
                                           "tests_passed",
                                           "tests_total",
                                           "prompt_tokens",
                                           "completion_tokens",
                                           "cache_read_tokens",
                                           "cache_creation_tokens",
                                           "total_tokens",
                                           "cost_usd",
                                           "duration_ms",
                                           "from_memory",
                                           "memory_source_job",
                                           "sandbox",
                                           "retry_of",
                                           "run_attempt",
                                           "latest",
                                           "created_at",
                                           "started_at",
                                           "finished_at",
                                           "model",
                                           "provider",
                                           "temperature",
                                           "top_p",
                                           "seed",
                                           "max_tokens",
                                           "system_prompt_sha256",
                                           "coderq_version",
                                           "backend",
                                           "python",
                                           "packages"};
        size_t i;

        add_job(store, "a", 3, NULL, "run1");
        add_job(store, "b", 2, NULL, "run1");
        add_job(store, "c", 1, NULL, "run1");
        add_job(store, "d", 0, NULL, "run1");
        add_job(store, "other", 0, NULL, "run2");
        free(claim_id(store));
        ck_assert_int_eq(cq_store_put_image(store, "a", "fig.png", "image/png",
                                            "\x89PNG\0\x01", 6, 1, NULL, NULL),
                         CQ_OK);
        finish(store, "a", "succeeded", NULL);
        free(claim_id(store));
        finish(store, "b", "succeeded", NULL);
        free(claim_id(store));
        finish(store, "c", "failed", NULL);
        qexec("UPDATE jobs SET started_at = finished_at - interval '1 second'"
              " WHERE job_id = 'a'");
        qexec("UPDATE jobs SET started_at = finished_at - interval '3 second'"
              " WHERE job_id = 'b'");
        ck_assert_int_eq(cq_store_run_summary(store, "run1", &summary), CQ_OK);
        ck_assert_ptr_nonnull(summary);
        ck_assert_int_eq(json_integer_value(json_object_get(summary, "jobs")),
                         4);
        ck_assert_int_eq(
            json_integer_value(json_object_get(summary, "succeeded")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(summary, "failed")),
                         1);
        ck_assert_int_eq(
            json_integer_value(json_object_get(summary, "pending")), 1);
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(summary, "pass_rate")), 0.6667,
            1e-9);
        ck_assert_double_eq_tol(
            json_number_value(json_object_get(summary, "mean_turns")), 4.0,
            1e-9);
        ck_assert_int_eq(
            json_integer_value(json_object_get(summary, "prompt_tokens")), 300);
        ck_assert(json_number_value(
                      json_object_get(summary, "p50_duration_ms")) >= 900);
        ck_assert(json_number_value(
                      json_object_get(summary, "p95_duration_ms")) >= 2500);
        json_decref(summary);
        ck_assert_int_eq(cq_store_run_summary(store, "none", &summary), CQ_OK);
        ck_assert_ptr_null(summary);
        ck_assert_int_eq(cq_store_run_results(store, "run1", &rows), CQ_OK);
        ck_assert_uint_eq(json_array_size(rows), 4);
        json_array_foreach(rows, i, row)
        {
                size_t k = 0;

                json_object_foreach(row, key, value)
                {
                        ck_assert_uint_lt(k, CQ_ARRAY_SIZE(keys));
                        ck_assert_str_eq(key, keys[k]);
                        k++;
                }
                ck_assert_uint_eq(k, CQ_ARRAY_SIZE(keys));
        }
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(rows, 2), "reason")),
                         "tests failed");
        json_decref(rows);
        /* the report's rows: the same keys, then the evaluation's */
        qexec("UPDATE jobs SET problem_id = 'p', sample_index = 2"
              " WHERE job_id = 'b'");
        ck_assert_int_eq(cq_store_report_run(store, "run1", &rows, &summary),
                         CQ_OK);
        ck_assert_uint_eq(json_array_size(rows), 4);
        json_array_foreach(rows, i, row)
        {
                static const char *const eval[] = {
                    "verdict",      "judge",      "hidden_passed",
                    "hidden_total", "problem_id", "sample_index",
                    "queue"};
                size_t k = 0;

                json_object_foreach(row, key, value)
                {
                        ck_assert_uint_lt(k, CQ_ARRAY_SIZE(keys) +
                                                 CQ_ARRAY_SIZE(eval));
                        ck_assert_str_eq(key,
                                         k < CQ_ARRAY_SIZE(keys)
                                             ? keys[k]
                                             : eval[k - CQ_ARRAY_SIZE(keys)]);
                        k++;
                }
                ck_assert_uint_eq(k, CQ_ARRAY_SIZE(keys) + CQ_ARRAY_SIZE(eval));
        }
        row = json_array_get(rows, 1);
        ck_assert_str_eq(json_string_value(json_object_get(row, "job_id")),
                         "b");
        ck_assert_str_eq(json_string_value(json_object_get(row, "verdict")),
                         "passed");
        ck_assert_str_eq(json_string_value(json_object_get(row, "problem_id")),
                         "p");
        ck_assert_int_eq(
            json_integer_value(json_object_get(row, "sample_index")), 2);
        ck_assert_str_eq(json_string_value(json_object_get(row, "queue")),
                         "default");
        ck_assert(
            json_is_null(json_object_get(json_array_get(rows, 3), "verdict")));
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(summary, "total"), "jobs")),
                         4);
        ck_assert_uint_eq(json_array_size(json_object_get(summary, "models")),
                          1);
        json_decref(rows);
        json_decref(summary);
        ck_assert_int_eq(cq_store_report_run(store, "none", &rows, &summary),
                         CQ_OK);
        ck_assert_uint_eq(json_array_size(rows), 0);
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(summary, "total"), "jobs")),
                         0);
        json_decref(rows);
        json_decref(summary);
        ck_assert_int_eq(cq_store_job_status(store, "c", &row), CQ_OK);
        ck_assert_str_eq(json_string_value(json_object_get(row, "status")),
                         "failed");
        ck_assert_int_eq(
            json_integer_value(json_object_get(row, "tests_total")), 3);
        json_decref(row);
        ck_assert_int_eq(cq_store_job_status(store, "zz", &row), CQ_OK);
        ck_assert_ptr_null(row);
        cq_export_init(&exp);
        ck_assert_int_eq(cq_store_export(store, "a", &exp, &found), CQ_OK);
        ck_assert(found);
        ck_assert_ptr_null(exp.notebook);
        ck_assert_str_eq(exp.answer, "42");
        ck_assert_uint_eq(exp.images.n, 1);
        ck_assert_uint_eq(exp.images.v[0].len, 6);
        ck_assert_mem_eq(exp.images.v[0].data, "\x89PNG\0\x01", 6);
        cq_export_release(&exp);
        ck_assert_int_eq(cq_store_export(store, "zz", &exp, &found), CQ_OK);
        ck_assert(!found);
        cq_store_destroy(&store);
}
END_TEST

struct runner {
        int total;       /* jobs to finish */
        atomic_int done; /* finished so far */
        int retriable;   /* transient errors seen and retried */
        unsigned reconnects;
        char errmsg[512];
        bool failed;
};

/* claim -> heartbeat -> finish until every job is finished, retrying
 * transient errors as a worker slot would; also upserts late jobs. */
static void *runner_main(void *arg)
{
        struct runner *r = arg;
        cq_store_t *store = store_for("survivor", 2);
        int64_t deadline = cq_now_ms() + 120000;
        int late = 0;

        while (atomic_load(&r->done) < r->total && cq_now_ms() < deadline) {
                cq_claim_t claim;
                bool found = false, lost = false, lostv[1];
                cq_finish_t fin;
                const char *ids[1];
                cq_err_t err;

                if (late < 20) {
                        cq_job_t job;
                        char id[32];

                        snprintf(id, sizeof(id), "late-%02d", late);
                        job_fill(&job, id, "late", 0, NULL, NULL);
                        err = cq_store_upsert_job(store, &job, NULL, NULL);
                        job_free(&job);
                        if (err == CQ_ERR_RETRIABLE) {
                                r->retriable++;
                                continue;
                        }
                        if (err != CQ_OK)
                                goto fail;
                        late++;
                }
                cq_claim_init(&claim);
                err = cq_store_claim(store, &claim, &found);
                if (err == CQ_ERR_RETRIABLE) {
                        r->retriable++;
                        continue;
                }
                if (err != CQ_OK)
                        goto fail;
                if (!found) {
                        /* A claim whose reply was lost: its lease expires. */
                        if (cq_store_requeue_expired(store, NULL, NULL) ==
                            CQ_ERR_FATAL)
                                goto fail;
                        usleep(100000);
                        continue;
                }
                ids[0] = claim.job_id;
                while ((err = cq_store_heartbeat(store, ids, 1, lostv, NULL)) ==
                       CQ_ERR_RETRIABLE)
                        r->retriable++;
                if (err != CQ_OK)
                        goto fail;
                memset(&fin, 0, sizeof(fin));
                fin.job_id = claim.job_id;
                fin.status = "succeeded";
                fin.tests_passed = fin.tests_total = -1;
                while ((err = cq_store_finish(store, &fin, &lost)) ==
                       CQ_ERR_RETRIABLE)
                        r->retriable++;
                cq_claim_release(&claim);
                if (err != CQ_OK)
                        goto fail;
                if (!lost)
                        atomic_fetch_add(&r->done, 1);
        }
        r->reconnects = cq_store_reconnects(store);
        cq_store_destroy(&store);
        return NULL;
fail:
        snprintf(r->errmsg, sizeof(r->errmsg), "%s", cq_store_errmsg(store));
        r->failed = true;
        cq_store_destroy(&store);
        return NULL;
}

/* The number of prepared statements of the store's own session. */
static long prepared_on(cq_store_t *store)
{
        PGresult *res = NULL;
        long n;

        ck_assert_int_eq(store_exec(store, "count prepared statements",
                                    "SELECT count(*) FROM "
                                    "pg_prepared_statements",
                                    NULL, 0, true, &res),
                         CQ_OK);
        n = strtol(PQgetvalue(res, 0, 0), NULL, 10);
        PQclear(res);
        return n;
}

static void append(cq_store_t *store, const char *job, int want_seq)
{
        json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", "x");
        bool lost = true;

        ck_assert_msg(
            cq_store_append_message(store, job, want_seq, msg, &lost) == CQ_OK,
            "%s", cq_store_errmsg(store));
        ck_assert(!lost);
        json_decref(msg);
}

/* Statements with parameters are prepared once per connection and reused;
 * after a reconnect they are prepared again; when the server loses them
 * (what a transaction-mode pooler does) the statement is retried
 * unprepared and the handle stops preparing; with prepare off, none. */
START_TEST(statements_prepared_once_per_connection)
{
        cq_store_t *store = store_for("w", 120), *plain;
        cq_store_opts_t opts;
        char errstr[512], *pid;
        int i;

        add_job(store, "pj", 0, NULL, NULL);
        free(claim_id(store));
        append(store, "pj", 1);
        ck_assert_int_eq(store->nprep, 3); /* upsert, claim, append */
        ck_assert_int_eq(prepared_on(store), 3);
        for (i = 2; i <= 5; i++)
                append(store, "pj", i);
        ck_assert_int_eq(store->nprep, 3); /* the same one, reused */
        ck_assert_int_eq(prepared_on(store), 3);

        /* A new session after the backend is gone. */
        pid = q1("SELECT pid::text FROM pg_stat_activity WHERE "
                 "datname = current_database() AND pid <> pg_backend_pid() "
                 "AND query LIKE '%pg_prepared_statements%'",
                 NULL);
        ck_assert_ptr_nonnull(pid);
        ck_assert_int_eq(qn("SELECT pg_terminate_backend($1::int)::int", pid),
                         1);
        free(pid);
        /* The append is retried after the reconnect (its seq is its key,
         * so a retry cannot store it twice) and prepared again. */
        append(store, "pj", 6);
        ck_assert_uint_eq(cq_store_reconnects(store), 1);
        ck_assert_int_eq(store->nprep, 1);
        ck_assert_int_eq(prepared_on(store), 1);

        /* Lost behind our back: outside a transaction the statement is run
         * again unprepared, and nothing is prepared from then on. */
        ck_assert_int_eq(store_exec(store, "deallocate", "DEALLOCATE ALL", NULL,
                                    0, true, NULL),
                         CQ_OK);
        append(store, "pj", 7);
        ck_assert(store->prep_off);
        ck_assert_int_eq(store->nprep, 0);
        append(store, "pj", 8);
        ck_assert_int_eq(prepared_on(store), 0);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages WHERE "
                            "job_id = $1",
                            "pj"),
                         8);

        /* Inside a transaction the transaction is lost: retriable. */
        cq_store_destroy(&store);
        store = store_for("w", 120);
        append(store, "pj", 9);
        ck_assert_int_eq(store_begin(store, "test"), CQ_OK);
        ck_assert_int_eq(store_exec(store, "deallocate", "DEALLOCATE ALL", NULL,
                                    0, true, NULL),
                         CQ_OK);
        {
                store_params_t sp;
                char *sql = strdup(store->prep[0].sql);

                ck_assert_ptr_nonnull(sql);
                sp_init(&sp);
                sp_text(&sp, "pj");
                sp_text(&sp, "w");
                sp_long(&sp, 10);
                sp_text(&sp, "user");
                sp_text(&sp, "{\"role\": \"user\"}");
                ck_assert_int_eq(store_exec(store, "append in a transaction",
                                            sql, &sp, 0, false, NULL),
                                 CQ_ERR_RETRIABLE);
                free(sql);
        }
        store_rollback(store);
        ck_assert(store->prep_off);
        append(store, "pj", 10);

        /* Already there under our name on a fresh handle's connection
         * (behind a pooler: prepared by another handle): 42P05, then as
         * above. The name is the same for every handle. */
        {
                cq_store_t *fresh_store = store_for("w", 120);
                PGresult *res = NULL;
                char sql[4096];

                ck_assert_int_eq(store_exec(store, "read prepared statements",
                                            "SELECT name, statement FROM "
                                            "pg_prepared_statements",
                                            NULL, 0, true, &res),
                                 CQ_OK);
                ck_assert_int_eq(PQntuples(res), 0); /* prep_off */
                PQclear(res);
                append(fresh_store, "pj", 11);
                ck_assert_int_eq(fresh_store->nprep, 1);
                ck_assert_int_eq(store_exec(fresh_store,
                                            "read prepared statements",
                                            "SELECT name, statement FROM "
                                            "pg_prepared_statements",
                                            NULL, 0, true, &res),
                                 CQ_OK);
                ck_assert_int_eq(PQntuples(res), 1);
                ck_assert_str_eq(PQgetvalue(res, 0, 1),
                                 fresh_store->prep[0].sql);
                snprintf(sql, sizeof(sql), "PREPARE %s AS %s",
                         PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1));
                PQclear(res);
                cq_store_destroy(&fresh_store);
                fresh_store = store_for("w", 120);
                ck_assert_int_eq(store_exec(fresh_store, "prepare by hand", sql,
                                            NULL, 0, true, NULL),
                                 CQ_OK);
                append(fresh_store, "pj", 12);
                ck_assert(fresh_store->prep_off);
                cq_store_destroy(&fresh_store);
        }

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = "w";
        opts.prepare = false;
        plain = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(plain != NULL, "%s", errstr);
        append(plain, "pj", 13);
        ck_assert_int_eq(plain->nprep, 0);
        ck_assert_int_eq(prepared_on(plain), 0);
        cq_store_destroy(&plain);
        cq_store_destroy(&store);
}
END_TEST

START_TEST(postgres_restart_loses_nothing)
{
        enum { NJOBS = 300 };
        cq_store_t *store = store_for("intake", 120);
        struct runner r;
        pthread_t th;
        PQconninfoOption *opts, *o;
        const char *port = getenv("CODERQ_PG_PORT");
        char cmd[4096], *s, dsn_port[16] = "";
        int i, rc;

        /* Restart only the server this test talks to: services.sh picks
         * the cluster by CODERQ_PG_PORT, so it must match the DSN. */
        opts = PQconninfoParse(g_dsn, NULL);
        for (o = opts; o->keyword; o++)
                if (strcmp(o->keyword, "port") == 0 && o->val)
                        snprintf(dsn_port, sizeof(dsn_port), "%s", o->val);
        PQconninfoFree(opts);
        ck_assert_msg(dsn_port[0], "CODERQ_PG_DSN names no port");
        if (port && *port)
                ck_assert_msg(strcmp(port, dsn_port) == 0,
                              "CODERQ_PG_DSN (port %s) is not on "
                              "CODERQ_PG_PORT %s",
                              dsn_port, port);
        else
                setenv("CODERQ_PG_PORT", dsn_port, 1);
        for (i = 0; i < NJOBS; i++) {
                char id[32];

                snprintf(id, sizeof(id), "job-%03d", i);
                add_job(store, id, 0, NULL, NULL);
        }
        memset(&r, 0, sizeof(r));
        r.total = NJOBS + 20;
        ck_assert_int_eq(pthread_create(&th, NULL, runner_main, &r), 0);
        while (atomic_load(&r.done) < 50 && !r.failed)
                usleep(10000);
        snprintf(cmd, sizeof(cmd), "'%s' restart-pg >/dev/null 2>&1",
                 cq_check_srcpath("scripts/services.sh"));
        rc = system(cmd);
        pthread_join(th, NULL);
        ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
                      "services.sh restart-pg failed");
        ck_assert_msg(!r.failed, "%s", r.errmsg);
        ck_assert_int_eq(atomic_load(&r.done), NJOBS + 20);
        ck_assert_uint_ge(r.reconnects, 1);
        /* Nothing lost, nothing doubled. */
        s = q1("SELECT count(*) || ' ' || count(*) FILTER (WHERE status ="
               " 'succeeded') || ' ' || (SELECT count(*) FROM outbox) || ' '"
               " || (SELECT count(*) FROM results) FROM jobs",
               NULL);
        ck_assert_str_eq(s, "320 320 320 320");
        free(s);
        /* The intake's handle reconnects too. */
        add_job(store, "after-restart", 0, NULL, NULL);
        ck_assert_uint_ge(cq_store_reconnects(store), 1);
        cq_store_destroy(&store);
}
END_TEST

/* Any character a kernel or E2B can print is stored and read back
 * exactly, U+0000 included (jsonb cannot hold it: documents are stored
 * escaped), and U+FFFF (the escape character) too; the columns stay
 * jsonb, queryable with ->>. */
static json_t *nul_doc(void)
{
        json_t *doc = json_pack(
            "{s:s, s:s%, s:[{s:s, s:s, s:s%}, {s:s, s:s, s:s%, s:[s%]}],"
            " s:s, s:s, s:s}",
            "role", "tool", "content", "a\0b", (size_t)3, "outputs",
            "output_type", "stream", "name", "stdout", "text", "a\0b\n",
            (size_t)4, "output_type", "error", "ename", "E", "evalue", "x\0\0y",
            (size_t)4, "traceback", "t\0", (size_t)2, "mark0",
            "\xef\xbf\xbf"
            "0",
            "mark2", "\xef\xbf\xbf\xef\xbf\xbf", "plain", "h\xc3\xa9");

        ck_assert_ptr_nonnull(doc);
        ck_assert_int_eq(json_object_setn_new(doc, "k\0ey", 4, json_true()), 0);
        return doc;
}

/* json_equal() looks keys up as C strings, so a key holding a NUL never
 * matches: compare the canonical texts (which escape it). */
static bool same_json(const json_t *a, const json_t *b)
{
        char *x =
            json_dumps(a, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        char *y =
            json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        bool same = x && y && strcmp(x, y) == 0;

        free(x);
        free(y);
        return same;
}

START_TEST(nul_bytes_stored_and_exported_exactly)
{
        cq_store_t *store = store_for("w", 120);
        json_t *msg = nul_doc(), *nb = notebook_doc("t"), *other;
        cq_cell_result_t res;
        cq_checkpoint_t cp;
        cq_export_t exp;
        bool lost = true, found = false;
        char *s;

        add_job(store, "nul", 0, NULL, NULL);
        free(claim_id(store));
        json_object_set(nb, "x_nul", msg);
        ck_assert_msg(cq_store_append_message(store, "nul", 1, msg, &lost) ==
                          CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(!lost);
        memset(&res, 0, sizeof(res));
        res.status = CQ_CELL_ERROR;
        res.execution_count = 1;
        res.outputs = json_incref(json_object_get(msg, "outputs"));
        ck_assert_msg(cq_store_record_cell(store, "nul", 1, "print(1)", &res,
                                           nb, &lost) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(!lost);
        /* The same write again (a retry) is one row; other content at a
         * stored seq is refused. */
        ck_assert_int_eq(cq_store_append_message(store, "nul", 1, msg, &lost),
                         CQ_OK);
        ck_assert_int_eq(
            cq_store_record_cell(store, "nul", 1, "print(1)", &res, nb, &lost),
            CQ_OK);
        other = json_pack("{s:s}", "role", "user");
        ck_assert_int_eq(cq_store_append_message(store, "nul", 1, other, &lost),
                         CQ_ERR_FATAL);
        ck_assert_ptr_nonnull(
            strstr(cq_store_errmsg(store), "already stored with other"));
        json_decref(other);
        ck_assert_int_eq(qn("SELECT count(*) FROM job_messages", NULL), 1);
        ck_assert_int_eq(qn("SELECT count(*) FROM cells", NULL), 1);
        /* Queryable as jsonb; the escaped form is what SQL sees. */
        s = q1("SELECT message->>'content' FROM job_messages", NULL);
        ck_assert_str_eq(s, "a\xef\xbf\xbf"
                            "0b");
        free(s);
        s = q1("SELECT message->>'mark2' || (outputs->1->>'evalue') FROM "
               "job_messages, cells",
               NULL);
        ck_assert_str_eq(s, "\xef\xbf\xbf\xef\xbf\xbf\xef\xbf\xbf\xef\xbf\xbf"
                            "x\xef\xbf\xbf"
                            "0\xef\xbf\xbf"
                            "0y");
        free(s);
        s = q1("SELECT doc->'metadata'->'kernelspec'->>'name' FROM notebooks",
               NULL);
        ck_assert_str_eq(s, "python3");
        free(s);
        /* Read back exactly. */
        cq_checkpoint_init(&cp);
        ck_assert_int_eq(cq_store_load_checkpoint(store, "nul", &cp), CQ_OK);
        ck_assert(same_json(json_array_get(cp.messages, 0), msg));
        ck_assert(
            same_json(json_object_get(json_array_get(cp.cells, 0), "outputs"),
                      res.outputs));
        ck_assert(same_json(cp.notebook, nb));
        ck_assert_int_eq(cp.last_message_seq, 1);
        ck_assert_int_eq(cp.last_cell_seq, 1);
        cq_checkpoint_release(&cp);
        /* The final notebook and a report through finish and export. */
        json_object_set_new(nb, "x_final", json_stringn("z\0", 2));
        finish(store, "nul", "succeeded", nb);
        cq_export_init(&exp);
        ck_assert_int_eq(cq_store_export(store, "nul", &exp, &found), CQ_OK);
        ck_assert(found);
        ck_assert(same_json(exp.notebook, nb));
        cq_export_release(&exp);
        json_decref(res.outputs);
        json_decref(msg);
        json_decref(nb);
        cq_store_destroy(&store);
}
END_TEST

struct cell_writer {
        cq_store_t *store;
        const json_t *nb;
        int seq;
        cq_err_t err;
        bool lost;
};

static void *cell_writer_main(void *arg)
{
        struct cell_writer *cw = arg;
        cq_cell_result_t res;

        memset(&res, 0, sizeof(res));
        res.status = CQ_CELL_OK;
        res.execution_count = cw->seq;
        res.outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                                "name", "stdout", "text", "once\n");
        cw->err = cq_store_record_cell(cw->store, "idem", cw->seq, "x = 1",
                                       &res, cw->nb, &cw->lost);
        json_decref(res.outputs);
        return NULL;
}

struct msg_writer {
        cq_store_t *store;
        int seq;
        cq_err_t err;
        bool lost;
};

static void *msg_writer_main(void *arg)
{
        struct msg_writer *mw = arg;
        json_t *msg = json_pack("{s:s, s:i}", "role", "user", "n", mw->seq);

        mw->err =
            cq_store_append_message(mw->store, "idem", mw->seq, msg, &mw->lost);
        json_decref(msg);
        return NULL;
}

/* A checkpoint write whose commit landed but whose reply was lost is
 * retried and stored once: a message and a cell with its notebook, each
 * one autocommit statement whose reply is dropped on the way (the store
 * retries it itself), and the cell written again as the worker does after
 * CQ_ERR_RETRIABLE. */
START_TEST(checkpoint_write_after_lost_commit_reply_stored_once)
{
        cq_pgproxy_t *proxy = cq_pgproxy_start(g_dsn);
        cq_store_opts_t opts;
        cq_store_t *store;
        struct msg_writer mw;
        struct cell_writer cw;
        json_t *nb = notebook_doc("idem");
        pthread_t th;
        char pdsn[2048], errstr[512], *s;

        cq_pgproxy_dsn(proxy, g_dsn, pdsn, sizeof(pdsn));
        cq_store_opts_init(&opts);
        opts.dsn = pdsn;
        opts.owner = "w";
        opts.reconnect_ms = 60000;
        /* Unprepared: every request carries its SQL text, the marker. */
        opts.prepare = false;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        add_job(store, "idem", 0, NULL, NULL);
        free(claim_id(store));
        mw = (struct msg_writer){store, 1, CQ_OK, false};
        msg_writer_main(&mw);
        ck_assert_int_eq(mw.err, CQ_OK);

        /* The message: its autocommit INSERT runs, its reply is lost. */
        cq_pgproxy_hold_after(proxy, "INSERT INTO job_messages");
        mw = (struct msg_writer){store, 2, CQ_ERR_FATAL, true};
        ck_assert_int_eq(pthread_create(&th, NULL, msg_writer_main, &mw), 0);
        ck_assert_msg(cq_pgproxy_wait_held(proxy, 30000),
                      "the INSERT was never answered");
        cq_pgproxy_drop_held(proxy);
        pthread_join(th, NULL);
        ck_assert_msg(mw.err == CQ_OK, "%s", cq_store_errmsg(store));
        ck_assert(!mw.lost);
        ck_assert_uint_eq(cq_store_reconnects(store), 1);
        s = q1("SELECT string_agg(seq::text, ',' ORDER BY seq) FROM "
               "job_messages",
               NULL);
        ck_assert_str_eq(s, "1,2");
        free(s);

        /* The cell and its notebook: one autocommit statement too, its
         * reply lost: the store retries it itself, and it lands once. */
        cw = (struct cell_writer){store, nb, 1, CQ_ERR_FATAL, true};
        cq_pgproxy_hold_after(proxy, "INSERT INTO cells");
        ck_assert_int_eq(pthread_create(&th, NULL, cell_writer_main, &cw), 0);
        ck_assert_msg(cq_pgproxy_wait_held(proxy, 30000),
                      "the cell's INSERT was never answered");
        ck_assert_int_eq(qn("SELECT count(*) FROM cells", NULL), 1);
        cq_pgproxy_drop_held(proxy);
        pthread_join(th, NULL);
        ck_assert_msg(cw.err == CQ_OK, "%s", cq_store_errmsg(store));
        ck_assert(!cw.lost);
        ck_assert_uint_eq(cq_store_reconnects(store), 2);
        /* What the worker does after a CQ_ERR_RETRIABLE (PostgreSQL gone
         * for longer than the store's one retry): the same write. */
        cw.err = CQ_ERR_FATAL;
        cell_writer_main(&cw);
        ck_assert_msg(cw.err == CQ_OK, "%s", cq_store_errmsg(store));
        ck_assert(!cw.lost);
        s = q1("SELECT string_agg(seq::text || ':' || code, ',' ORDER BY seq)"
               " || ' ' || (SELECT ncells FROM notebooks) FROM cells",
               NULL);
        ck_assert_str_eq(s, "1:x = 1 2");
        free(s);
        json_decref(nb);
        cq_store_destroy(&store);
        cq_pgproxy_stop(&proxy);
}
END_TEST

/* Whether a connection to \p dsn is encrypted, as the server sees it
 * (pg_stat_ssl): what the probe must report for the same dsn. The suites'
 * server is plain unless check_it_secure left it with TLS on, which the
 * default sslmode (prefer) then uses. */
static bool dsn_uses_tls(const char *dsn)
{
        PGconn *conn = PQconnectdb(dsn);
        PGresult *res;
        bool tls;

        ck_assert_msg(PQstatus(conn) == CONNECTION_OK, "%s",
                      PQerrorMessage(conn));
        res = PQexec(conn, "SELECT ssl FROM pg_stat_ssl WHERE pid = "
                           "pg_backend_pid()");
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK &&
                          PQntuples(res) == 1,
                      "%s", PQerrorMessage(conn));
        tls = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        PQclear(res);
        PQfinish(conn);
        return tls;
}

/* The intake's backlog count and the doctor's probe: connections of their
 * own, no store handle. */
START_TEST(backlog_counts_queued_jobs_and_probe_names_the_server)
{
        static const char nowhere[] =
            "host=127.0.0.1 port=1 dbname=none connect_timeout=2";
        cq_store_t *store = store_for("w1", 120);
        cq_backlog_t *bl = cq_backlog_new(g_dsn);
        cq_store_probe_t probe;
        char errstr[512], *s;

        ck_assert_ptr_nonnull(bl);
        ck_assert_int_eq(cq_backlog_count(bl, 10), 0);
        add_job(store, "b1", 0, NULL, NULL);
        add_job(store, "b2", 0, NULL, NULL);
        add_job(store, "b3", 0, NULL, NULL);
        ck_assert_int_eq(cq_backlog_count(bl, 10), 3);
        ck_assert_int_eq(cq_backlog_count(bl, 2), 2); /* stops at the limit */
        s = claim_id(store);
        free(s);
        ck_assert_int_eq(cq_backlog_count(bl, 10), 2); /* queued ones only */
        cq_backlog_destroy(&bl);
        ck_assert_ptr_null(bl);
        /* a server it cannot reach: unknown, again on the next count */
        bl = cq_backlog_new(nowhere);
        ck_assert_int_eq(cq_backlog_count(bl, 10), -1);
        ck_assert_int_eq(cq_backlog_count(bl, 10), -1);
        cq_backlog_destroy(&bl);

        ck_assert_int_eq(cq_store_probe(g_dsn, 3, 3000, "cqt-probe", &probe,
                                        errstr, sizeof(errstr)),
                         0);
        ck_assert_str_eq(probe.database, g_dbname);
        ck_assert_msg(probe.version[0] >= '1' && probe.version[0] <= '9',
                      "server version \"%s\"", probe.version);
        ck_assert_int_eq(probe.tls, dsn_uses_tls(g_dsn));
        ck_assert_int_eq(cq_store_probe(nowhere, 2, 3000, "cqt-probe", &probe,
                                        errstr, sizeof(errstr)),
                         -1);
        ck_assert_msg(strcmp(errstr, "could not connect (CODERQ_PG_DSN: "
                                     "host=127.0.0.1 port=1 dbname=none): "
                                     "Connection refused") == 0,
                      "%s", errstr);
        cq_store_destroy(&store);
}
END_TEST

static Suite *it_store_suite(void)
{
        Suite *s = suite_create("it_store");
        TCase *tc = tcase_create("postgres");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, claim_8_threads_1000_jobs_exactly_once);
        tcase_add_test(tc, claim_order_priority_then_age);
        tcase_add_test(tc, claim_takes_only_its_queues);
        tcase_add_test(tc, claim_reads_the_index_for_each_queue);
        tcase_add_test(tc, read_only_server_is_retriable);
        tcase_add_test(tc, expired_leases_requeued_then_attempt_cap_fails);
        tcase_add_test(tc, release_gives_the_job_back);
        tcase_add_test(tc,
                       backlog_counts_queued_jobs_and_probe_names_the_server);
        tcase_add_test(tc, finish_is_atomic_when_the_backend_is_killed);
        tcase_add_test(tc, child_waits_for_parent_success);
        tcase_add_test(tc, child_without_parent_fails_after_the_wait);
        tcase_add_test(tc, retry_later_counts_and_waits);
        tcase_add_test(tc, run_time_and_retries_carry_over_attempts);
        tcase_add_test(tc, reply_and_usage_are_one_checkpoint);
        tcase_add_test(tc, turn_is_one_checkpoint);
        tcase_add_test(tc, strings_and_bytes_stored_verbatim);
        tcase_add_test(tc, image_20mb_round_trips_and_caps);
        tcase_add_test(tc, figure_keeps_every_name);
        tcase_add_test(tc, image_names_migrate_stored_images);
        tcase_add_test(tc, notebook_jsonb_equals_what_was_written);
        tcase_add_test(tc, migrations_twice_noop_and_concurrent_safe);
        tcase_add_test(tc, changed_applied_migration_is_refused);
        tcase_add_test(tc, duplicate_upserts_give_one_job);
        tcase_add_test(tc, batch_upsert_is_one_atomic_statement);
        tcase_add_test(tc, claimable_jobs_are_announced);
        tcase_add_test(tc, outbox_rows_marked_sent_only_when_asked);
        tcase_add_test(tc, outbox_claims_are_exclusive_and_failed_rows_skipped);
        tcase_add_test(tc, cancel_queued_now_running_by_flag);
        tcase_add_test(tc, checkpoint_loads_in_order);
        tcase_add_test(tc, memory_recalls_similar_not_unrelated);
        tcase_add_test(tc, run_queries_for_people);
        tcase_add_test(tc, statements_prepared_once_per_connection);
        tcase_add_test(tc, postgres_restart_loses_nothing);
        tcase_add_test(tc, nul_bytes_stored_and_exported_exactly);
        tcase_add_test(tc,
                       checkpoint_write_after_lost_commit_reply_stored_once);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_store_suite)
