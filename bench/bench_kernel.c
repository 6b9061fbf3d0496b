/* SPDX-License-Identifier: MIT */
/* bench_kernel.c - the local kernel side by side with its anchors, in one
 * run on one machine: the median round trip of a trivial cell ("pass",
 * reply and idle) through coderq's client vs jupyter_client's blocking
 * client (bench/kernel_anchor.py, same kernel command and flags), and a
 * pool acquire of a ready kernel vs a cold kernel start. No sandbox, so
 * both clients drive the same process. Last line: one JSON object. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coderq/kpool.h"
#include "coderq/util.h"

static double now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
        qsort(v, n, sizeof(*v), cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int run_pass(cq_interp_t *interp)
{
        cq_cell_result_t res;
        cq_exec_opts_t opts = {0};
        int ok;

        opts.timeout_ms = 30000;
        cq_cell_result_init(&res);
        ok = cq_interp_execute(interp, "pass", &opts, &res) == CQ_OK &&
             res.status == CQ_CELL_OK;
        cq_cell_result_release(&res);
        return ok ? 0 : -1;
}

static void wait_ready(cq_kpool_t *pool)
{
        int i;

        for (i = 0; i < 1200 && cq_kpool_ready(pool) == 0; i++) {
                struct timespec ts = {0, 50 * 1000 * 1000};

                nanosleep(&ts, NULL);
        }
}

int main(int argc, char **argv)
{
        const char *anchor = argc > 1 ? argv[1] : "bench/kernel_anchor.py";
        size_t cells = argc > 2 ? strtoul(argv[2], NULL, 10) : 200;
        size_t starts = 5, i;
        double *rtt = calloc(cells ? cells : 1, sizeof(double));
        double cold[5], acq[5], t, rtt_med, anchor_rtt = -1, cold_med, acq_med;
        char errstr[512], cmd[4096], line[4096], root[512];
        cq_local_opts_t lopts;
        cq_kpool_opts_t popts;
        cq_interp_t *interp;
        cq_kpool_t *pool;
        FILE *fp;

        if (!rtt || cells == 0)
                return 2;
        snprintf(root, sizeof(root), "/tmp/cqbench-kernel-%ld", (long)getpid());
        memset(&lopts, 0, sizeof(lopts));
        lopts.work_root = root;

        /* coderq round trips */
        interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
        if (!interp) {
                fprintf(stderr, "bench_kernel: %s\n", errstr);
                return 1;
        }
        for (i = 0; i < 10; i++)
                run_pass(interp);
        for (i = 0; i < cells; i++) {
                t = now_ms();
                if (run_pass(interp)) {
                        fprintf(stderr, "bench_kernel: cell failed\n");
                        return 1;
                }
                rtt[i] = now_ms() - t;
        }
        cq_interp_destroy(&interp);
        rtt_med = median(rtt, cells);
        printf("coderq: pass round trip median %.3f ms over %zu cells\n",
               rtt_med, cells);
        fflush(stdout);

        /* anchor round trips */
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %zu 2>/dev/null",
                 anchor, cells);
        fp = popen(cmd, "r");
        while (fp && fgets(line, sizeof(line), fp)) {
                json_t *obj = json_loads(line, 0, NULL);

                if (json_is_object(obj))
                        anchor_rtt = json_number_value(
                            json_object_get(obj, "rtt_ms_median"));
                json_decref(obj);
        }
        if (!fp || pclose(fp) != 0 || anchor_rtt <= 0) {
                fprintf(stderr, "bench_kernel: anchor %s failed\n", anchor);
                return 1;
        }
        printf("jupyter_client: pass round trip median %.3f ms over %zu "
               "cells\n",
               anchor_rtt, cells);

        /* cold starts vs pool acquires */
        for (i = 0; i < starts; i++) {
                t = now_ms();
                interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
                cold[i] = now_ms() - t;
                if (!interp) {
                        fprintf(stderr, "bench_kernel: %s\n", errstr);
                        return 1;
                }
                cq_interp_destroy(&interp);
        }
        memset(&popts, 0, sizeof(popts));
        popts.size = 1;
        popts.local = lopts;
        pool = cq_kpool_new(&popts, errstr, sizeof(errstr));
        if (!pool) {
                fprintf(stderr, "bench_kernel: %s\n", errstr);
                return 1;
        }
        for (i = 0; i < starts; i++) {
                wait_ready(pool);
                t = now_ms();
                interp = cq_kpool_acquire(pool, 60000, errstr, sizeof(errstr));
                acq[i] = now_ms() - t;
                if (!interp) {
                        fprintf(stderr, "bench_kernel: %s\n", errstr);
                        return 1;
                }
                if (run_pass(interp)) {
                        fprintf(stderr, "bench_kernel: pooled cell failed\n");
                        return 1;
                }
                cq_interp_destroy(&interp);
        }
        cq_kpool_destroy(&pool);
        rmdir(root);
        cold_med = median(cold, starts);
        acq_med = median(acq, starts);
        printf("cold kernel start median %.1f ms, pool acquire median %.3f "
               "ms (%zu each)\n",
               cold_med, acq_med, starts);
        printf("{\"bench\":\"kernel\",\"rtt_ratio\":%.3f,"
               "\"acquire_ratio\":%.5f,\"coderq_rtt_ms\":%.3f,"
               "\"jupyter_client_rtt_ms\":%.3f,\"pool_acquire_ms\":%.3f,"
               "\"cold_start_ms\":%.1f,\"cells\":%zu,\"starts\":%zu}\n",
               rtt_med / anchor_rtt, acq_med / cold_med, rtt_med, anchor_rtt,
               acq_med, cold_med, cells, starts);
        free(rtt);
        return 0;
}
