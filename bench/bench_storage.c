/* SPDX-License-Identifier: MIT */
/* bench_storage.c - queue throughput: claim + heartbeat + finish cycles
 * per second with 1 and with 8 connections (one thread and one store
 * each), in a throw-away database on the server of CODERQ_PG_DSN; the
 * 8-connection run again with prepared statements off (CODERQ_PG_PREPARE)
 * for their ratio.
 * usage: bench_storage [seconds]   (run by scripts/bench.sh storage) */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coderq/storage/queue.h"
#include "coderq/storage/migrate.h"
#include "coderq/common/util.h"

#define NJOBS 200000

typedef struct bench_slot {
        const char *dsn;
        int n;
        bool prepare;
        int64_t deadline;
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
                return NULL;
        }
        while (cq_now_ms() < slot->deadline) {
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
static double
run(const char *dsn, PGconn *conn, int n, int seconds, bool prepare)
{
        bench_slot_t slots[8];
        pthread_t th[8];
        int64_t start, end;
        long total = 0;
        int64_t claim_us = 0, heartbeat_us = 0, finish_us = 0;
        int i;
        char sql[256];

        if (exec_sql(conn, "TRUNCATE jobs CASCADE"))
                return -1;
        snprintf(sql, sizeof(sql),
                 "INSERT INTO jobs (job_id, prompt, spec)"
                 " SELECT 'bench-' || i, 'p', jsonb_build_object('job_id',"
                 " 'bench-' || i, 'prompt', 'p')"
                 " FROM generate_series(1, %d) AS i",
                 NJOBS);
        if (exec_sql(conn, sql) || exec_sql(conn, "VACUUM ANALYZE jobs"))
                return -1;
        start = cq_now_ms();
        for (i = 0; i < n; i++) {
                memset(&slots[i], 0, sizeof(slots[i]));
                slots[i].dsn = dsn;
                slots[i].n = i;
                slots[i].prepare = prepare;
                slots[i].deadline = start + (int64_t)seconds * 1000;
                if (pthread_create(&th[i], NULL, slot_main, &slots[i]))
                        return -1;
        }
        for (i = 0; i < n; i++)
                pthread_join(th[i], NULL);
        end = cq_now_ms();
        for (i = 0; i < n; i++) {
                if (slots[i].failed) {
                        fprintf(stderr, "bench_storage: slot %d: %s\n", i,
                                slots[i].errmsg);
                        return -1;
                }
                total += slots[i].cycles;
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
        printf("connections=%d%s cycles=%ld seconds=%.2f cycles_per_s=%.1f\n",
               n, prepare ? "" : " unprepared", total,
               (double)(end - start) / 1000.0,
               (double)total * 1000.0 / (double)(end - start));
        return (double)total * 1000.0 / (double)(end - start);
}

int main(int argc, char **argv)
{
        const char *base = getenv("CODERQ_PG_DSN");
        int seconds = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 10;
        char name[64], dsn[2048], admin_dsn[2048], sql[128], errstr[1024];
        PGconn *admin = NULL, *conn = NULL;
        double c1, c8, u8;
        int rc = 1;

        if (!base || seconds < 1) {
                fprintf(stderr, "usage: CODERQ_PG_DSN=... bench_storage "
                                "[seconds]\n");
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
        c1 = run(dsn, conn, 1, seconds, true);
        c8 = c1 >= 0 ? run(dsn, conn, 8, seconds, true) : -1;
        u8 = c8 >= 0 ? run(dsn, conn, 8, seconds, false) : -1;
        if (c1 >= 0 && c8 >= 0 && u8 > 0) {
                printf("cycles_per_s_1=%.1f\ncycles_per_s_8=%.1f\n"
                       "cycles_per_s_8_unprepared=%.1f\n"
                       "prepared_ratio_8=%.3f\n",
                       c1, c8, u8, c8 / u8);
                rc = 0;
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
