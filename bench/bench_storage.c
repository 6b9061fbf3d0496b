/* SPDX-License-Identifier: MIT */
/* bench_storage.c - the PostgreSQL queue, in a throw-away database on the
 * server of CODERQ_PG_DSN:
 *   bench_storage [SECONDS]
 *     claim + heartbeat + finish cycles per second with 1 and with 8
 *     connections (one thread and one store each); the 8-connection run
 *     again with prepared statements off (CODERQ_PG_PREPARE) for their
 *     ratio (scripts/bench.sh storage);
 *   bench_storage --connections N[,N...] [SECONDS]
 *     the same cycles with N connections each, a fleet's slots racing for
 *     the same rows (FOR UPDATE SKIP LOCKED);
 *   bench_storage --listeners N[,N...] [SECONDS]
 *     wake-ups: N listeners on the jobs channel (a worker has one), jobs
 *     inserted one at a time: the time from the insert to each listener's
 *     wake-up, then the inserts per second with them listening
 *     (scripts/bench.sh capacity). */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coderq/storage/listen.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/migrate.h"
#include "coderq/common/util.h"

/* jobs queued before each cycles run; CQ_BENCH_QUEUED sets another
 * depth (every claim's plan depends on it: see docs/CAPACITY.md) */
#define NJOBS     200000
#define MAX_CONNS 1024
/* wake-ups timed per listener count, each waited for at most 1 s */
#define WAKE_ROUNDS 200

typedef struct bench_slot {
        const char *dsn;
        int n;
        bool prepare;
        /* set once every slot is connected: the connections are made one
         * after another, outside the measured time (256 at once time
         * out on a busy machine) */
        atomic_llong *deadline;
        atomic_int connected; /* 1 connected, -1 failed */
        long cycles;
        int64_t claim_us, heartbeat_us, finish_us;
        int failed;
        char errmsg[512];
} bench_slot_t;

static int exec_sql(PGconn *conn, const char *sql)
{
        PGresult *res = PQexec(conn, sql);
        ExecStatusType st = PQresultStatus(res);
        int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : -1;

        if (rc)
                fprintf(stderr, "bench_storage: could not run \"%.60s\": %s",
                        sql, PQerrorMessage(conn));
        PQclear(res);
        return rc;
}

/* \p base with dbname replaced, as keyword=value pairs. */
static int dsn_for(const char *base, const char *dbname, char *out, size_t size)
{
        PQconninfoOption *opts = PQconninfoParse(base, NULL), *o;
        size_t len = 0;

        if (!opts)
                return -1;
        out[0] = '\0';
        for (o = opts; o->keyword; o++) {
                const char *val =
                    strcmp(o->keyword, "dbname") == 0 ? dbname : o->val;

                if (!val || !*val || strchr(val, '\'') || strchr(val, '\\'))
                        continue;
                len += (size_t)snprintf(out + len, len < size ? size - len : 0,
                                        "%s='%s' ", o->keyword, val);
        }
        PQconninfoFree(opts);
        return len < size ? 0 : -1;
}

static int64_t now_us(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void *slot_main(void *arg)
{
        bench_slot_t *slot = arg;
        cq_store_opts_t opts;
        cq_store_t *store;
        char owner[32];

        snprintf(owner, sizeof(owner), "bench-%d", slot->n);
        cq_store_opts_init(&opts);
        opts.dsn = slot->dsn;
        opts.owner = owner;
        opts.prepare = slot->prepare;
        store = cq_store_new(&opts, slot->errmsg, sizeof(slot->errmsg));
        if (!store) {
                slot->failed = 1;
                atomic_store(&slot->connected, -1);
                return NULL;
        }
        atomic_store(&slot->connected, 1);
        while (atomic_load(slot->deadline) == 0)
                cq_nap_ms(1, NULL);
        while (cq_now_ms() < atomic_load(slot->deadline)) {
                cq_claim_t claim;
                cq_finish_t fin;
                const char *ids[1];
                bool found, lost[1], was_lost;

                int64_t t0 = now_us(), t1, t2;

                cq_claim_init(&claim);
                if (cq_store_claim(store, &claim, &found) != CQ_OK)
                        goto fail;
                t1 = now_us();
                slot->claim_us += t1 - t0;
                if (!found)
                        break; /* out of jobs: the figure still holds */
                ids[0] = claim.job_id;
                if (cq_store_heartbeat(store, ids, 1, lost, NULL) != CQ_OK) {
                        cq_claim_release(&claim);
                        goto fail;
                }
                t2 = now_us();
                slot->heartbeat_us += t2 - t1;
                memset(&fin, 0, sizeof(fin));
                fin.job_id = claim.job_id;
                fin.status = "succeeded";
                fin.answer = "42";
                fin.tests_passed = fin.tests_total = -1;
                fin.turns = 1;
                if (cq_store_finish(store, &fin, &was_lost) != CQ_OK ||
                    was_lost) {
                        cq_claim_release(&claim);
                        goto fail;
                }
                cq_claim_release(&claim);
                slot->finish_us += now_us() - t2;
                slot->cycles++;
        }
        cq_store_destroy(&store);
        return NULL;
fail:
        snprintf(slot->errmsg, sizeof(slot->errmsg), "%s",
                 cq_store_errmsg(store));
        slot->failed = 1;
        cq_store_destroy(&store);
        return NULL;
}

/* One measurement with \p n connections; returns cycles per second. */
static long queued_jobs(void)
{
        const char *v = getenv("CQ_BENCH_QUEUED");
        long n = v && *v ? strtol(v, NULL, 10) : NJOBS;

        return n > 0 ? n : NJOBS;
}

static double
run(const char *dsn, PGconn *conn, int n, int seconds, bool prepare)
{
        bench_slot_t *slots = calloc((size_t)n, sizeof(*slots));
        pthread_t *th = calloc((size_t)n, sizeof(*th));
        int64_t start, end;
        atomic_llong deadline = 0;
        long total = 0;
        int64_t claim_us = 0, heartbeat_us = 0, finish_us = 0;
        int i, started = 0;
        double rate = -1;
        char sql[256];

        if (!slots || !th || exec_sql(conn, "TRUNCATE jobs CASCADE"))
                goto out;
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jobs (job_id, prompt, spec)"
                 " SELECT 'bench-' || i, 'p', jsonb_build_object('job_id',"
                 " 'bench-' || i, 'prompt', 'p')"
                 " FROM generate_series(1, %ld) AS i",
                 queued_jobs());
        if (exec_sql(conn, sql) || exec_sql(conn, "VACUUM ANALYZE jobs"))
                goto out;
        for (i = 0; i < n; i++) {
                slots[i].dsn = dsn;
                slots[i].n = i;
                slots[i].prepare = prepare;
                slots[i].deadline = &deadline;
                if (pthread_create(&th[i], NULL, slot_main, &slots[i]))
                        break;
                started++;
                while (atomic_load(&slots[i].connected) == 0)
                        cq_nap_ms(1, NULL);
                if (atomic_load(&slots[i].connected) < 0)
                        break;
        }
        start = cq_now_ms();
        /* a failed slot ends the run at once */
        atomic_store(&deadline, started < n || (n > 0 && slots[n - 1].failed)
                                    ? start
                                    : start + (int64_t)seconds * 1000);
        for (i = 0; i < started; i++)
                pthread_join(th[i], NULL);
        end = cq_now_ms();
        for (i = 0; i < started; i++) {
                if (slots[i].failed) {
                        fprintf(stderr, "bench_storage: slot %d: %s\n", i,
                                slots[i].errmsg);
                        goto out;
                }
                total += slots[i].cycles;
                if (i == started - 1 && started < n) {
                        fprintf(stderr,
                                "bench_storage: could not start %d threads\n",
                                n);
                        goto out;
                }
                claim_us += slots[i].claim_us;
                heartbeat_us += slots[i].heartbeat_us;
                finish_us += slots[i].finish_us;
        }
        if (total > 0)
                printf("connections=%d%s mean_ms claim=%.2f heartbeat=%.2f "
                       "finish=%.2f\n",
                       n, prepare ? "" : " unprepared",
                       (double)claim_us / 1000.0 / (double)total,
                       (double)heartbeat_us / 1000.0 / (double)total,
                       (double)finish_us / 1000.0 / (double)total);
        rate = (double)total * 1000.0 / (double)(end - start);
        printf("connections=%d%s queued=%ld cycles=%ld seconds=%.2f "
               "cycles_per_s=%.1f\n",
               n, prepare ? "" : " unprepared", queued_jobs(), total,
               (double)(end - start) / 1000.0, rate);
out:
        free(slots);
        free(th);
        return rate;
}

/* ------------------------------------------------------------ wake-ups */

/* What the listeners share with the inserting thread. */
typedef struct wakes {
        const char *dsn;
        atomic_int stop;
        atomic_llong sent_us; /* when the round's insert was sent */
        atomic_int woke;      /* listeners woken in this round */
        atomic_int ready;     /* listeners connected */
} wakes_t;

typedef struct listener {
        wakes_t *w;
        int64_t lat_us[WAKE_ROUNDS];
        int nlat;
        long wakeups;
        int failed;
} listener_t;

static void *listener_main(void *arg)
{
        listener_t *li = arg;
        cq_store_opts_t opts;
        cq_listener_t *l;
        bool ready = false;

        cq_store_opts_init(&opts);
        opts.dsn = li->w->dsn;
        l = cq_listener_new(&opts, CQ_CHANNEL_JOBS, NULL, 0);
        if (!l) {
                li->failed = 1;
                atomic_fetch_add(&li->w->ready, 1);
                return NULL;
        }
        while (!atomic_load(&li->w->stop)) {
                bool reconnected = false;
                long n = cq_listener_wait(l, 50, &reconnected);

                if (n >= 0 && !ready) {
                        ready = true;
                        atomic_fetch_add(&li->w->ready, 1);
                }
                if (n <= 0)
                        continue;
                li->wakeups++;
                if (li->nlat < WAKE_ROUNDS &&
                    atomic_load(&li->w->sent_us) > 0) {
                        li->lat_us[li->nlat++] =
                            now_us() - atomic_load(&li->w->sent_us);
                        atomic_fetch_add(&li->w->woke, 1);
                }
        }
        cq_listener_destroy(&l);
        return NULL;
}

static int cmp_ll(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

        return x < y ? -1 : x > y;
}

/* One insert of a queued job: its statement trigger announces it. */
static int insert_job(PGconn *conn, long k)
{
        char sql[256];

        snprintf(sql, sizeof(sql),
                 "INSERT INTO jobs (job_id, prompt, spec) VALUES ('wake-%ld',"
                 " 'p', '{\"job_id\": \"wake-%ld\", \"prompt\": \"p\"}')",
                 k, k);
        return exec_sql(conn, sql);
}

/* \p n listeners: the wake-up latency over WAKE_ROUNDS single inserts,
 * then single inserts per second for \p seconds. */
static int listen_run(const char *dsn, PGconn *conn, int n, int seconds)
{
        wakes_t w = {.dsn = dsn};
        listener_t *ls = calloc((size_t)(n > 0 ? n : 1), sizeof(*ls));
        pthread_t *th = calloc((size_t)(n > 0 ? n : 1), sizeof(*th));
        int64_t *all =
            calloc((size_t)(n > 0 ? n : 1) * WAKE_ROUNDS, sizeof(*all));
        int i, r, started = 0, rc = -1;
        long k = 0, inserts = 0, missed = 0, nall = 0, wakeups = 0;
        int64_t t0, deadline;

        if (!ls || !th || !all || exec_sql(conn, "TRUNCATE jobs CASCADE"))
                goto out;
        for (i = 0; i < n; i++) {
                ls[i].w = &w;
                if (pthread_create(&th[i], NULL, listener_main, &ls[i]))
                        break;
                started++;
        }
        deadline = cq_now_ms() + 60000;
        while (atomic_load(&w.ready) < started && cq_now_ms() < deadline)
                cq_nap_ms(10, NULL);
        for (r = 0; n > 0 && r < WAKE_ROUNDS; r++) {
                atomic_store(&w.woke, 0);
                atomic_store(&w.sent_us, now_us());
                if (insert_job(conn, k++))
                        goto stop;
                deadline = cq_now_ms() + 1000;
                while (atomic_load(&w.woke) < n && cq_now_ms() < deadline)
                        cq_nap_ms(1, NULL);
                missed += n - atomic_load(&w.woke);
        }
        atomic_store(&w.sent_us, 0);
        t0 = cq_now_ms();
        while (cq_now_ms() - t0 < (int64_t)seconds * 1000) {
                if (insert_job(conn, k++))
                        goto stop;
                inserts++;
        }
        printf("listeners=%d inserts_per_s=%.1f\n", n,
               (double)inserts * 1000.0 / (double)(cq_now_ms() - t0));
        rc = 0;
stop:
        cq_nap_ms(500, NULL); /* the last announcements arrive */
        atomic_store(&w.stop, 1);
        for (i = 0; i < started; i++) {
                pthread_join(th[i], NULL);
                if (ls[i].failed)
                        rc = -1;
                memcpy(all + nall, ls[i].lat_us,
                       (size_t)ls[i].nlat * sizeof(*all));
                nall += ls[i].nlat;
                wakeups += ls[i].wakeups;
        }
        if (rc == 0 && nall > 0) {
                qsort(all, (size_t)nall, sizeof(*all), cmp_ll);
                printf("listeners=%d wake_ms p50=%.2f p95=%.2f max=%.2f "
                       "missed=%ld wakeups_per_listener=%.1f\n",
                       n, (double)all[nall / 2] / 1000.0,
                       (double)all[nall * 95 / 100] / 1000.0,
                       (double)all[nall - 1] / 1000.0, missed,
                       (double)wakeups / n);
        }
out:
        free(ls);
        free(th);
        free(all);
        return rc;
}

/* "N[,N...]" into \p out (at most \p max, each 0..MAX_CONNS); the count,
 * or -1. */
static int parse_counts(const char *s, int *out, int max)
{
        int n = 0;

        while (*s && n < max) {
                char *end;
                long v = strtol(s, &end, 10);

                if (end == s || v < 0 || v > MAX_CONNS || (*end && *end != ','))
                        return -1;
                out[n++] = (int)v;
                s = *end ? end + 1 : end;
        }
        return *s ? -1 : n;
}

/* The default run: 1 and 8 connections, and 8 unprepared. */
static int run_default(const char *dsn, PGconn *conn, int seconds)
{
        double c1, c8, u8;

        c1 = run(dsn, conn, 1, seconds, true);
        c8 = c1 >= 0 ? run(dsn, conn, 8, seconds, true) : -1;
        u8 = c8 >= 0 ? run(dsn, conn, 8, seconds, false) : -1;
        if (c1 < 0 || c8 < 0 || u8 <= 0)
                return -1;
        printf("cycles_per_s_1=%.1f\ncycles_per_s_8=%.1f\n"
               "cycles_per_s_8_unprepared=%.1f\n"
               "prepared_ratio_8=%.3f\n",
               c1, c8, u8, c8 / u8);
        return 0;
}

int main(int argc, char **argv)
{
        const char *base = getenv("CODERQ_PG_DSN");
        const char *mode = NULL;
        int counts[16], ncounts = 0, seconds = 10, a = 1, i;
        char name[64], dsn[2048], admin_dsn[2048], sql[128], errstr[1024];
        PGconn *admin = NULL, *conn = NULL;
        int rc = 1;

        if (argc > 2 && (strcmp(argv[1], "--connections") == 0 ||
                         strcmp(argv[1], "--listeners") == 0)) {
                mode = argv[1];
                ncounts = parse_counts(argv[2], counts,
                                       (int)(sizeof(counts) / sizeof(*counts)));
                a = 3;
        }
        if (argc > a)
                seconds = (int)strtol(argv[a], NULL, 10);
        if (!base || seconds < 1 || ncounts < 0 || argc > a + 1) {
                fprintf(stderr,
                        "usage: CODERQ_PG_DSN=... bench_storage "
                        "[--connections|--listeners N[,N...]] [seconds]\n");
                return 2;
        }
        snprintf(name, sizeof(name), "cqbench_%ld", (long)getpid());
        if (dsn_for(base, name, dsn, sizeof(dsn)) ||
            dsn_for(base, "postgres", admin_dsn, sizeof(admin_dsn))) {
                fprintf(stderr, "bench_storage: invalid CODERQ_PG_DSN\n");
                return 2;
        }
        admin = PQconnectdb(admin_dsn);
        if (PQstatus(admin) != CONNECTION_OK) {
                fprintf(stderr, "bench_storage: %s", PQerrorMessage(admin));
                goto out;
        }
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
        if (exec_sql(admin, sql))
                goto out;
        if (cq_migrate_run(dsn, NULL, NULL, NULL, NULL, errstr,
                           sizeof(errstr)) != CQ_OK) {
                fprintf(stderr, "bench_storage: %s\n", errstr);
                goto drop;
        }
        conn = PQconnectdb(dsn);
        if (PQstatus(conn) != CONNECTION_OK)
                goto drop;
        if (!mode) {
                rc = run_default(dsn, conn, seconds) == 0 ? 0 : 1;
                goto drop;
        }
        for (i = 0, rc = 0; i < ncounts && rc == 0; i++) {
                if (strcmp(mode, "--listeners") == 0) {
                        rc = listen_run(dsn, conn, counts[i], seconds) ? 1 : 0;
                } else {
                        double c = run(dsn, conn, counts[i], seconds, true);

                        if (c < 0)
                                rc = 1;
                        else
                                printf("cycles_per_s_%d=%.1f\n", counts[i], c);
                }
        }
drop:
        PQfinish(conn);
        snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)",
                 name);
        (void)exec_sql(admin, sql);
out:
        PQfinish(admin);
        return rc;
}
