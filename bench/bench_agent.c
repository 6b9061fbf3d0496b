/* SPDX-License-Identifier: MIT */
/* bench_agent.c - the per-turn cost of the agent loop itself. N jobs of T
 * tool-call turns (each cell "pass") plus a final answer run through
 * cq_agent_run() against the fake LLM (no latency) with one real local
 * kernel; the anchor, in the same run and interleaved job by job, is the
 * same work without the loop, in the same order: cq_llm_chat() on the
 * very histories the loop sent (every prefix of the job's conversation
 * that ends before an assistant message), each followed by
 * cq_interp_execute("pass") on the same kernel per tool call.
 * loop - raw LLM - raw kernel is what the loop adds (prompts, tool text,
 * notebook, history, images scan). Wall time and this process's CPU time
 * are both reported. Run by scripts/bench/agent.sh; last line: JSON. */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coderq/agent/agent.h"
#include "coderq/local/interp_local.h"
#include "coderq/common/job.h"
#include "coderq/local/kpool.h"
#include "coderq/agent/llm.h"
#include "coderq/common/log.h"
#include "coderq/agent/notebook.h"
#include "benchstat.h"

typedef struct clocks {
        double wall_ms;
        double cpu_ms; /* this process: the loop's and the clients' code */
} clocks_t;

static double clock_ms(clockid_t id)
{
        struct timespec ts;

        clock_gettime(id, &ts);
        return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void tick(clocks_t *c)
{
        c->wall_ms = clock_ms(CLOCK_MONOTONIC);
        c->cpu_ms = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
}

static void tock(const clocks_t *start, clocks_t *sum)
{
        sum->wall_ms += clock_ms(CLOCK_MONOTONIC) - start->wall_ms;
        sum->cpu_ms += clock_ms(CLOCK_PROCESS_CPUTIME_ID) - start->cpu_ms;
}

/* One job through the loop; *historyp gets its conversation. */
static int run_loop(int n,
                    const char *model,
                    cq_interp_t *interp,
                    cq_llm_t *llm,
                    long *turnsp,
                    long *cellsp,
                    json_t **historyp,
                    clocks_t *sum)
{
        cq_agent_opts_t opts;
        cq_agent_result_t res;
        cq_job_t job;
        cq_nb_t *nb = NULL;
        json_t *spec;
        clocks_t t;
        char errstr[512], id[64];
        int rc = -1;

        cq_job_init(&job);
        cq_agent_result_init(&res);
        snprintf(id, sizeof(id), "bench-agent-%d", n);
        spec = json_pack("{s:s, s:s, s:s}", "job_id", id, "prompt",
                         "Compute nothing, several times, then answer.",
                         "model", model);
        if (!spec ||
            cq_job_from_json(spec, 0, &job, errstr, sizeof(errstr)) != CQ_OK) {
                fprintf(stderr, "bench_agent: bad job: %s\n", errstr);
                goto out;
        }
        cq_agent_opts_init(&opts);
        tick(&t);
        nb = cq_nb_new(cq_kernel_language_info(cq_local_interp_kernel(interp)));
        if (!nb || cq_agent_run(&job, interp, llm, &opts, NULL, NULL, NULL, nb,
                                &res) != CQ_OK) {
                fprintf(stderr, "bench_agent: the loop could not run\n");
                goto out;
        }
        cq_nb_destroy(&nb);
        tock(&t, sum);
        if (res.status != CQ_AGENT_SUCCEEDED) {
                fprintf(stderr, "bench_agent: job %s: %s\n",
                        cq_agent_status_name(res.status),
                        res.reason ? res.reason : "");
                goto out;
        }
        *turnsp += res.turns;
        *cellsp += res.cells;
        *historyp = json_incref(res.history);
        rc = 0;
out:
        cq_nb_destroy(&nb);
        cq_agent_result_release(&res);
        cq_job_release(&job);
        json_decref(spec);
        return rc;
}

static int raw_cell(cq_interp_t *interp, clocks_t *sum)
{
        cq_cell_result_t res;
        cq_exec_opts_t xo = {0};
        clocks_t t;
        int ok;

        xo.timeout_ms = 120000; /* as the loop's default */
        cq_cell_result_init(&res);
        tick(&t);
        ok = cq_interp_execute(interp, "pass", &xo, &res) == CQ_OK &&
             res.status == CQ_CELL_OK;
        cq_cell_result_release(&res);
        tock(&t, sum);
        if (!ok)
                fprintf(stderr, "bench_agent: raw cell failed\n");
        return ok ? 0 : -1;
}

/* The same work without the loop, in the loop's order: each chat request
 * the loop sent (every history prefix followed by an assistant message),
 * then one "pass" cell per tool call of that reply. Keeping the order
 * matters: a kernel that idled during an LLM call answers slower than one
 * hit back to back. */
static int raw_work(cq_llm_t *llm,
                    cq_interp_t *interp,
                    const char *model,
                    const json_t *history,
                    clocks_t *llm_sum,
                    clocks_t *kern_sum)
{
        cq_llm_reply_t reply;
        json_t *prefix = json_array();
        size_t i, k;
        clocks_t t;
        int rc = -1;

        cq_llm_reply_init(&reply);
        if (!prefix || cq_llm_set_model(llm, model) != 0)
                goto out;
        for (i = 0; i < json_array_size(history); i++) {
                json_t *msg = json_array_get(history, i);
                const char *role =
                    json_string_value(json_object_get(msg, "role"));

                if (role && strcmp(role, "assistant") == 0) {
                        tick(&t);
                        if (cq_llm_chat(llm, prefix, &reply) != CQ_OK) {
                                fprintf(stderr, "bench_agent: raw chat: %s\n",
                                        cq_llm_errmsg(llm));
                                goto out;
                        }
                        tock(&t, llm_sum);
                        for (k = 0; k < reply.ncalls; k++)
                                if (raw_cell(interp, kern_sum) != 0)
                                        goto out;
                        cq_llm_reply_release(&reply);
                }
                if (json_array_append(prefix, msg) != 0)
                        goto out;
        }
        rc = 0;
out:
        cq_llm_reply_release(&reply);
        json_decref(prefix);
        return rc;
}

int main(int argc, char **argv)
{
        cq_llm_conf_t conf;
        cq_local_opts_t lopts;
        cq_interp_t *interp = NULL;
        cq_llm_t *llm = NULL;
        clocks_t loop = {0}, llm_t = {0}, kern = {0};
        char errstr[512], root[256];
        const char *model;
        long jobs, warm = 3, turns = 0, cells = 0, j;
        double *ov = NULL, *ov_cpu = NULL;
        double lt, ll, lk, over, over_med, over_cpu;
        int rc = 1;

        if (argc != 4) {
                fprintf(stderr, "usage: %s BASE_URL MODEL JOBS\n", argv[0]);
                return 2;
        }
        model = argv[2];
        jobs = strtol(argv[3], NULL, 10);
        if (jobs <= 0 || jobs > 100000)
                return 2;
        ov = calloc((size_t)jobs, sizeof(*ov));
        ov_cpu = calloc((size_t)jobs, sizeof(*ov_cpu));
        if (!ov || !ov_cpu)
                return 1;
        cq_log_set_level(CQ_LOG_WARN);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        cq_llm_conf_init(&conf);
        conf.base_url = argv[1];
        conf.model = "unused";
        conf.max_tokens = 1024;
        llm = cq_llm_new(&conf, errstr, sizeof(errstr));
        if (!llm) {
                fprintf(stderr, "bench_agent: %s\n", errstr);
                goto out;
        }
        snprintf(root, sizeof(root), "/tmp/cqbench-agent-%ld", (long)getpid());
        memset(&lopts, 0, sizeof(lopts));
        lopts.work_root = root;
        lopts.kernel.preload = "pass";
        interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
        if (!interp) {
                fprintf(stderr, "bench_agent: %s\n", errstr);
                goto out;
        }
        /* warm-up (connections, caches), then the measured jobs, each
         * followed by its anchor so drift hits both sides alike; the
         * machine may be shared, so the per-job median is the headline */
        for (j = -warm; j < jobs; j++) {
                json_t *history = NULL;
                clocks_t a = {0}, b = {0}, c = {0};
                long t = 0, n = 0;

                if (run_loop((int)j, model, interp, llm, &t, &n, &history,
                             &a) ||
                    raw_work(llm, interp, model, history, &b, &c)) {
                        json_decref(history);
                        goto out;
                }
                json_decref(history);
                if (j < 0)
                        continue;
                turns += t;
                cells += n;
                loop.wall_ms += a.wall_ms;
                loop.cpu_ms += a.cpu_ms;
                llm_t.wall_ms += b.wall_ms;
                llm_t.cpu_ms += b.cpu_ms;
                kern.wall_ms += c.wall_ms;
                kern.cpu_ms += c.cpu_ms;
                ov[j] = (a.wall_ms - b.wall_ms - c.wall_ms) / (double)t;
                ov_cpu[j] = (a.cpu_ms - b.cpu_ms - c.cpu_ms) / (double)t;
        }
        lt = loop.wall_ms / (double)turns;
        ll = llm_t.wall_ms / (double)turns;
        lk = kern.wall_ms / (double)turns;
        over = lt - ll - lk;
        over_med = cq_bench_median(ov, (size_t)jobs);
        over_cpu = cq_bench_median(ov_cpu, (size_t)jobs);
        printf("jobs=%ld turns=%ld cells=%ld (per job: %ld LLM calls, %ld "
               "cells)\n",
               jobs, turns, cells, turns / jobs, cells / jobs);
        printf("loop:       %.3f ms/turn wall, %.3f ms/turn cpu (mean)\n", lt,
               loop.cpu_ms / (double)turns);
        printf("raw llm:    %.3f ms/turn wall, %.3f ms/turn cpu (mean)\n", ll,
               llm_t.cpu_ms / (double)turns);
        printf("raw kernel: %.3f ms/turn wall, %.3f ms/turn cpu (mean)\n", lk,
               kern.cpu_ms / (double)turns);
        printf("overhead:   %.3f ms/turn wall median over jobs (mean %.3f), "
               "%.1f%% of llm+kernel; %.3f ms/turn cpu median\n",
               over_med, over, 100.0 * over_med / (ll + lk), over_cpu);
        printf("{\"bench\":\"agent\",\"jobs\":%ld,\"turns\":%ld,"
               "\"loop_ms_per_turn\":%.3f,\"llm_ms_per_turn\":%.3f,"
               "\"kernel_ms_per_turn\":%.3f,\"overhead_ms_per_turn\":%.3f,"
               "\"overhead_ms_per_turn_mean\":%.3f,"
               "\"overhead_cpu_ms_per_turn\":%.3f,\"overhead_ratio\":%.3f}\n",
               jobs, turns, lt, ll, lk, over_med, over, over_cpu,
               over_med / (ll + lk));
        rc = 0;
out:
        cq_interp_destroy(&interp);
        cq_llm_destroy(&llm);
        rmdir(root);
        free(ov);
        free(ov_cpu);
        curl_global_cleanup();
        return rc;
}
