/* SPDX-License-Identifier: MIT */
/* bench_kernel.c - the local kernel side by side with its anchors, in one
 * run on one machine: the median round trip of a trivial cell ("pass",
 * reply and idle) through coderq's client vs jupyter_client's blocking
 * client (bench/kernel_anchor.py, same kernel command and flags), and a
 * pool acquire of a ready kernel vs a cold kernel start; no sandbox, so
 * both clients drive the same process. Then a kernel forked by the kernel
 * server vs a cold start, both with the pool's imports and in the sandbox
 * when it works here: start time, CPU of every process per start until
 * ready (client, server, the kernel's processes), PSS and private memory
 * of idle kernels. Last line: one JSON object. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "coderq/local/interp_local.h"
#include "coderq/local/kpool.h"
#include "coderq/local/kserver.h"
#include "coderq/common/util.h"
#include "benchstat.h"

/* Kernels alive at once while PSS is read: shared pages are divided
 * among the processes that map them, so both sides get the same number. */
#define PSS_KERNELS 8

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

/* Fields 4 (ppid), 14 and 15 (utime, stime) of /proc/PID/stat; -1 when
 * the process is gone. */
static int proc_stat(pid_t pid, long *ppid, double *cpu_ms)
{
        char path[64], buf[1024], *p;
        unsigned long ut = 0, st = 0;
        size_t n;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
        fp = fopen(path, "r");
        if (!fp)
                return -1;
        n = fread(buf, 1, sizeof(buf) - 1, fp);
        fclose(fp);
        buf[n] = '\0';
        p = strrchr(buf, ')');
        if (!p ||
            sscanf(p + 2, "%*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                   ppid, &ut, &st) != 3)
                return -1;
        *cpu_ms = (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
        return 0;
}

/* Minor page faults of process \p pid so far (field 10 of its stat; all
 * its threads): copy-on-write copies of the server's pages are most of a
 * forked kernel's, and unlike CPU time they hardly vary from run to run.
 * 0 when it is gone. */
static double proc_minflt(pid_t pid)
{
        char path[64], buf[1024], *p;
        unsigned long flt = 0;
        size_t n;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
        fp = fopen(path, "r");
        if (!fp)
                return 0;
        n = fread(buf, 1, sizeof(buf) - 1, fp);
        fclose(fp);
        buf[n] = '\0';
        p = strrchr(buf, ')');
        if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %lu", &flt) != 1)
                return 0;
        return (double)flt;
}

/* CPU time of process \p pid (all its threads, those gone too) in ms; 0
 * when it is gone. Its CPU clock counts nanoseconds; /proc's utime and
 * stime count clock ticks (10 ms), more than a forked kernel's outer
 * process or pid 1 uses in all, so those would mostly count as 0. */
static double proc_cpu_ms(pid_t pid)
{
        struct timespec ts;
        clockid_t clk;
        double ms = 0;
        long ppid;

        if (clock_getcpuclockid(pid, &clk) == 0 && clock_gettime(clk, &ts) == 0)
                return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
        return proc_stat(pid, &ppid, &ms) ? 0 : ms;
}

static pid_t proc_ppid(pid_t pid)
{
        double ms;
        long ppid = -1;

        return proc_stat(pid, &ppid, &ms) ? -1 : (pid_t)ppid;
}

/* Process \p pid and its descendants (at most \p max in \p out). */
static size_t proc_tree(pid_t pid, pid_t *out, size_t n, size_t max)
{
        char path[96];
        long kid;
        FILE *fp;

        if (n >= max)
                return n;
        out[n++] = pid;
        snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", (long)pid,
                 (long)pid);
        fp = fopen(path, "r");
        if (!fp)
                return n;
        while (fscanf(fp, "%ld", &kid) == 1)
                n = proc_tree((pid_t)kid, out, n, max);
        fclose(fp);
        return n;
}

/* Pss and Private_Clean + Private_Dirty of process \p pid in kB, from
 * smaps_rollup. */
static void proc_mem_kb(pid_t pid, long *pss, long *priv)
{
        char path[64], line[256];
        long kb;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%ld/smaps_rollup", (long)pid);
        fp = fopen(path, "r");
        if (!fp)
                return;
        while (fgets(line, sizeof(line), fp)) {
                if (sscanf(line, "Pss: %ld kB", &kb) == 1)
                        *pss += kb;
                else if (sscanf(line, "Private_Clean: %ld kB", &kb) == 1 ||
                         sscanf(line, "Private_Dirty: %ld kB", &kb) == 1)
                        *priv += kb;
        }
        fclose(fp);
}

/* Every other process in the pid namespace of \p pid, when that is not
 * ours: a sandboxed forked kernel is the server's child, in its pid 1's
 * namespace. */
static size_t proc_ns_mates(pid_t pid, pid_t *out, size_t n, size_t max)
{
        char path[64], ns[64], mine[64], other[64];
        struct dirent *de;
        ssize_t len;
        DIR *dir;
        size_t i;

        snprintf(path, sizeof(path), "/proc/%ld/ns/pid", (long)pid);
        len = readlink(path, ns, sizeof(ns) - 1);
        if (len <= 0)
                return n;
        ns[len] = '\0';
        len = readlink("/proc/self/ns/pid", mine, sizeof(mine) - 1);
        if (len <= 0 || (mine[len] = '\0', strcmp(ns, mine) == 0))
                return n;
        dir = opendir("/proc");
        if (!dir)
                return n;
        while (n < max && (de = readdir(dir)) != NULL) {
                pid_t p = (pid_t)strtol(de->d_name, NULL, 10);
                bool seen = false;

                if (p <= 0)
                        continue;
                snprintf(path, sizeof(path), "/proc/%ld/ns/pid", (long)p);
                len = readlink(path, other, sizeof(other) - 1);
                if (len <= 0 || (other[len] = '\0', strcmp(other, ns) != 0))
                        continue;
                for (i = 0; i < n && !seen; i++)
                        seen = out[i] == p;
                if (!seen)
                        out[n++] = p;
        }
        closedir(dir);
        return n;
}

/* The processes of one kernel: cold, the process we started and its
 * descendants; forked, its outer process (the parent of the pid we
 * know), its descendants and, sandboxed, every process in its pid 1's
 * namespace (the kernel, which the server forked, among them). */
static size_t kernel_procs(cq_interp_t *interp, pid_t *out, size_t max)
{
        cq_kernel_t *kernel = cq_local_interp_kernel(interp);
        pid_t pid1 = cq_kernel_pid(kernel), top = pid1;
        size_t n;

        if (cq_kernel_forked(kernel))
                top = proc_ppid(top);
        n = top > 0 ? proc_tree(top, out, 0, max) : 0;
        return cq_kernel_forked(kernel) && pid1 > 0
                   ? proc_ns_mates(pid1, out, n, max)
                   : n;
}

static double self_cpu_ms(int who)
{
        struct rusage ru;

        getrusage(who, &ru);
        return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
               (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

typedef struct fork_figures {
        double fork_ms, cold_ms, cpu_ms, cold_cpu_ms;
        /* medians of the forked start's CPU by process: this client, the
         * server, the kernel (the busiest of its processes), the rest */
        double cpu_client, cpu_server, cpu_kernel, cpu_rest;
        /* median minor page faults of the kernel process */
        double faults_kernel;
        double fork_pss_kb, cold_pss_kb, fork_priv_kb, cold_priv_kb;
        const char *sandbox;
} fork_figures_t;

/* PSS and private memory per kernel of PSS_KERNELS idle kernels started
 * with \p lopts. */
static int
idle_pss(const cq_local_opts_t *lopts, double *pss_kb, double *priv_kb)
{
        cq_interp_t *k[PSS_KERNELS] = {NULL};
        char errstr[512];
        pid_t pids[64];
        long total = 0, priv = 0;
        size_t i, j, n;
        int rc = -1;

        for (i = 0; i < PSS_KERNELS; i++) {
                k[i] = cq_local_interp_new(lopts, errstr, sizeof(errstr));
                if (!k[i] || run_pass(k[i])) {
                        fprintf(stderr, "bench_kernel: %s\n",
                                k[i] ? "cell failed" : errstr);
                        goto out;
                }
        }
        for (i = 0; i < PSS_KERNELS; i++) {
                n = kernel_procs(k[i], pids, CQ_ARRAY_SIZE(pids));
                for (j = 0; j < n; j++)
                        proc_mem_kb(pids[j], &total, &priv);
        }
        *pss_kb = (double)total / PSS_KERNELS;
        *priv_kb = (double)priv / PSS_KERNELS;
        rc = 0;
out:
        for (i = 0; i < PSS_KERNELS; i++)
                cq_interp_destroy(&k[i]);
        return rc;
}

/* Forked vs cold, both with the pool's imports (CQ_KPOOL_PRELOAD, which a
 * forked kernel finds imported), in the sandbox when it works. */
static int
fork_vs_cold(const char *root, size_t starts, size_t colds, fork_figures_t *f)
{
        double *fork_ms = calloc(starts, sizeof(double));
        double *cold_ms = calloc(colds, sizeof(double));
        double *cpu = calloc(starts, sizeof(double));
        double *by = calloc(5 * starts, sizeof(double));
        double t, before, server_before, ms, top;
        cq_sandbox_opts_t so;
        cq_sandbox_t *sandbox = NULL;
        cq_kserver_opts_t ko;
        cq_kserver_t *ks = NULL;
        cq_local_opts_t lopts;
        cq_interp_t *interp;
        char errstr[700];
        pid_t pids[64];
        size_t i, j, n;
        int rc = -1;

        if (!fork_ms || !cold_ms || !cpu || !by)
                goto out;
        memset(&so, 0, sizeof(so));
        so.mode = CQ_SANDBOX_AUTO;
        so.probe_dir = root;
        so.mem = 4ul << 30;
        so.nproc = 512;
        so.fsize = 1ul << 30;
        so.uid_first = CQ_SANDBOX_UIDS_FIRST;
        so.uid_last = CQ_SANDBOX_UIDS_LAST;
        sandbox = cq_sandbox_new(&so, errstr, sizeof(errstr));
        if (!sandbox) {
                fprintf(stderr, "bench_kernel: %s\n", errstr);
                goto out;
        }
        f->sandbox = cq_sandbox_mode_name(sandbox);
        memset(&ko, 0, sizeof(ko));
        ko.mode = CQ_KSERVER_ON;
        ko.work_root = root;
        ko.sandbox = sandbox;
        ks = cq_kserver_new(&ko, errstr, sizeof(errstr));
        if (!ks) {
                fprintf(stderr, "bench_kernel: %s\n", errstr);
                goto out;
        }
        memset(&lopts, 0, sizeof(lopts));
        lopts.work_root = root;
        lopts.kernel.sandbox = sandbox;
        lopts.kernel.preload = CQ_KPOOL_PRELOAD;
        lopts.kernel.startup_timeout_ms = 120000;
        for (i = 0; i < colds; i++) {
                before = self_cpu_ms(RUSAGE_SELF);
                t = cq_bench_now_ms();
                interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
                cold_ms[i] = cq_bench_now_ms() - t;
                if (!interp) {
                        fprintf(stderr, "bench_kernel: %s\n", errstr);
                        goto out;
                }
                f->cold_cpu_ms += self_cpu_ms(RUSAGE_SELF) - before;
                n = kernel_procs(interp, pids, CQ_ARRAY_SIZE(pids));
                for (j = 0; j < n; j++)
                        f->cold_cpu_ms += proc_cpu_ms(pids[j]);
                cq_interp_destroy(&interp);
        }
        f->cold_cpu_ms /= (double)colds;
        lopts.kernel.kserver = ks;
        for (i = 0; i < starts; i++) {
                server_before = proc_cpu_ms(cq_kserver_pid(ks));
                before = self_cpu_ms(RUSAGE_SELF);
                t = cq_bench_now_ms();
                interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
                fork_ms[i] = cq_bench_now_ms() - t;
                if (!interp ||
                    !cq_kernel_forked(cq_local_interp_kernel(interp))) {
                        fprintf(stderr, "bench_kernel: no forked kernel: %s\n",
                                interp ? "it started cold" : errstr);
                        cq_interp_destroy(&interp);
                        goto out;
                }
                /* every process: us, the server, and the kernel's own
                 * (outer, pid 1, the kernel), all of which began at 0 */
                by[i] = self_cpu_ms(RUSAGE_SELF) - before;
                by[starts + i] =
                    proc_cpu_ms(cq_kserver_pid(ks)) - server_before;
                n = kernel_procs(interp, pids, CQ_ARRAY_SIZE(pids));
                for (j = 0, top = 0; j < n; j++) {
                        ms = proc_cpu_ms(pids[j]);
                        by[3 * starts + i] += ms;
                        if (ms > top)
                                by[4 * starts + i] = proc_minflt(pids[j]);
                        top = ms > top ? ms : top;
                }
                by[2 * starts + i] = top;
                by[3 * starts + i] -= top;
                cpu[i] = by[i] + by[starts + i] + by[2 * starts + i] +
                         by[3 * starts + i];
                cq_interp_destroy(&interp);
        }
        if (idle_pss(&lopts, &f->fork_pss_kb, &f->fork_priv_kb))
                goto out;
        lopts.kernel.kserver = NULL;
        if (idle_pss(&lopts, &f->cold_pss_kb, &f->cold_priv_kb))
                goto out;
        f->fork_ms = cq_bench_median(fork_ms, starts);
        f->cold_ms = cq_bench_median(cold_ms, colds);
        f->cpu_ms = cq_bench_median(cpu, starts);
        f->cpu_client = cq_bench_median(by, starts);
        f->cpu_server = cq_bench_median(by + starts, starts);
        f->cpu_kernel = cq_bench_median(by + 2 * starts, starts);
        f->cpu_rest = cq_bench_median(by + 3 * starts, starts);
        f->faults_kernel = cq_bench_median(by + 4 * starts, starts);
        rc = 0;
out:
        cq_kserver_destroy(&ks);
        cq_sandbox_destroy(&sandbox);
        free(fork_ms);
        free(cold_ms);
        free(cpu);
        free(by);
        return rc;
}

int main(int argc, char **argv)
{
        const char *anchor = argc > 1 ? argv[1] : "bench/kernel_anchor.py";
        size_t cells = argc > 2 ? strtoul(argv[2], NULL, 10) : 200;
        const char *fs = getenv("CQ_BENCH_FORK_STARTS");
        size_t starts = 5, fork_starts = 11, i;
        fork_figures_t ff;
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
        /* more forked starts, for comparisons within the noise */
        if (fs && *fs) {
                char *end;
                unsigned long v = strtoul(fs, &end, 10);

                if (*end || v < 1 || v > 1000) {
                        fprintf(stderr, "bench_kernel: CQ_BENCH_FORK_STARTS "
                                        "must be 1..1000\n");
                        return 2;
                }
                fork_starts = v;
        }
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
                t = cq_bench_now_ms();
                if (run_pass(interp)) {
                        fprintf(stderr, "bench_kernel: cell failed\n");
                        return 1;
                }
                rtt[i] = cq_bench_now_ms() - t;
        }
        cq_interp_destroy(&interp);
        rtt_med = cq_bench_median(rtt, cells);
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
                t = cq_bench_now_ms();
                interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
                cold[i] = cq_bench_now_ms() - t;
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
                t = cq_bench_now_ms();
                interp = cq_kpool_acquire(pool, 60000, errstr, sizeof(errstr));
                acq[i] = cq_bench_now_ms() - t;
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
        cold_med = cq_bench_median(cold, starts);
        acq_med = cq_bench_median(acq, starts);
        printf("cold kernel start median %.1f ms, pool acquire median %.3f "
               "ms (%zu each)\n",
               cold_med, acq_med, starts);
        fflush(stdout);
        memset(&ff, 0, sizeof(ff));
        if (fork_vs_cold(root, fork_starts, starts, &ff))
                return 1;
        rmdir(root);
        printf("sandbox %s, the pool's imports: forked start median %.1f ms, "
               "cold %.1f ms; CPU per start until ready %.1f ms forked, "
               "%.0f ms cold; per idle kernel (%d of each alive) PSS "
               "%.0f kB forked, %.0f kB cold, private %.0f kB forked, "
               "%.0f kB cold\n",
               ff.sandbox, ff.fork_ms, ff.cold_ms, ff.cpu_ms, ff.cold_cpu_ms,
               PSS_KERNELS, ff.fork_pss_kb, ff.cold_pss_kb, ff.fork_priv_kb,
               ff.cold_priv_kb);
        printf("forked start's CPU by process (medians): client %.1f ms, "
               "server %.1f ms, kernel %.1f ms, its other processes %.1f "
               "ms; the kernel's minor page faults %.0f\n",
               ff.cpu_client, ff.cpu_server, ff.cpu_kernel, ff.cpu_rest,
               ff.faults_kernel);
        printf("{\"bench\":\"kernel\",\"rtt_ratio\":%.3f,"
               "\"acquire_ratio\":%.5f,\"coderq_rtt_ms\":%.3f,"
               "\"jupyter_client_rtt_ms\":%.3f,\"pool_acquire_ms\":%.3f,"
               "\"cold_start_ms\":%.1f,\"cells\":%zu,\"starts\":%zu,"
               "\"fork_start_ratio\":%.4f,\"fork_cpu_ms\":%.1f,"
               "\"fork_cpu_ratio\":%.4f,\"fork_pss_ratio\":%.3f,"
               "\"fork_start_ms\":%.1f,"
               "\"cold_preload_start_ms\":%.1f,\"cold_cpu_ms\":%.0f,"
               "\"fork_pss_kb\":%.0f,\"cold_pss_kb\":%.0f,"
               "\"fork_private_ratio\":%.3f,\"pss_kernels\":%d,"
               "\"fork_sandbox\":\"%s\",\"fork_starts\":%zu,"
               "\"fork_cpu_client_ms\":%.1f,\"fork_cpu_server_ms\":%.1f,"
               "\"fork_cpu_kernel_ms\":%.1f,\"fork_cpu_rest_ms\":%.1f,"
               "\"fork_faults_kernel\":%.0f}\n",
               rtt_med / anchor_rtt, acq_med / cold_med, rtt_med, anchor_rtt,
               acq_med, cold_med, cells, starts, ff.fork_ms / ff.cold_ms,
               ff.cpu_ms, ff.cpu_ms / ff.cold_cpu_ms,
               ff.fork_pss_kb / ff.cold_pss_kb, ff.fork_ms, ff.cold_ms,
               ff.cold_cpu_ms, ff.fork_pss_kb, ff.cold_pss_kb,
               ff.fork_priv_kb / ff.cold_priv_kb, PSS_KERNELS, ff.sandbox,
               fork_starts, ff.cpu_client, ff.cpu_server, ff.cpu_kernel,
               ff.cpu_rest, ff.faults_kernel);
        free(rtt);
        return 0;
}
