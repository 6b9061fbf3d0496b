/* SPDX-License-Identifier: MIT */
/* bench_llm.c - cost of one cq_llm_chat() round trip against a local
 * OpenAI-compatible server (the fake, no latency) with a realistic
 * 24-message history, and of cq_llm_parse_reply() on a recorded reply.
 * Run by scripts/bench/llm.sh, which also runs the anchor. Prints one JSON
 * object.
 *
 * "bench_llm rate BASE_URL THREADS SECONDS LIMITER" is the rate-limit
 * phase: THREADS clients (the Messages API format) call a fake that
 * enforces a request rate, for SECONDS, sharing one limiter when LIMITER
 * is 1 or each on its own (today's per-call retry only) when 0. Prints
 * {"calls_ok", "calls_failed", "seconds", "limiter_cuts"}. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coderq/agent/llm.h"
#include "coderq/common/util.h"
#include "benchstat.h"

static double now_s(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* system, user, then 11 turns of assistant tool call + tool result. */
static json_t *history(void)
{
        json_t *msgs = json_array();
        char code[600], out[1500], id[32];
        int i;

        json_array_append_new(
            msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                            "You are a careful data analyst. Write Python."));
        json_array_append_new(
            msgs, json_pack("{s:s, s:s}", "role", "user", "content",
                            "Load data.csv, describe it, fit a regression."));
        memset(code, 'c', sizeof(code) - 1);
        code[sizeof(code) - 1] = '\0';
        memset(out, 'o', sizeof(out) - 1);
        out[sizeof(out) - 1] = '\0';
        for (i = 0; i < 11; i++) {
                json_t *args = json_pack("{s:s}", "code", code);
                char *args_text = json_dumps(args, JSON_COMPACT);

                snprintf(id, sizeof(id), "call_%d", i);
                json_array_append_new(
                    msgs,
                    json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}",
                              "role", "assistant", "content", "tool_calls",
                              "id", id, "type", "function", "function", "name",
                              "execute_code", "arguments", args_text));
                json_array_append_new(msgs, json_pack("{s:s, s:s, s:s}", "role",
                                                      "tool", "tool_call_id",
                                                      id, "content", out));
                free(args_text);
                json_decref(args);
        }
        return msgs;
}

/* --- the rate-limit phase ------------------------------------------ */

typedef struct rate_arg {
        cq_llm_conf_t conf;
        atomic_int *stop; /* raised at the end: waits and requests end */
        long ok, failed;
} rate_arg_t;

static void *rate_thread(void *opaque)
{
        rate_arg_t *arg = opaque;
        cq_llm_t *llm = cq_llm_new(&arg->conf, NULL, 0);
        json_t *msgs =
            json_pack("[{s:s, s:s}]", "role", "user", "content", "Say hello.");
        cq_llm_reply_t reply;

        cq_llm_reply_init(&reply);
        if (llm)
                cq_llm_set_cancel(llm, arg->stop);
        while (llm && msgs && !atomic_load(arg->stop)) {
                cq_err_t err = cq_llm_chat(llm, msgs, &reply);

                if (err == CQ_OK)
                        arg->ok++;
                else if (!atomic_load(arg->stop))
                        arg->failed++;
                cq_llm_reply_release(&reply);
        }
        if (!llm)
                arg->failed++;
        json_decref(msgs);
        cq_llm_destroy(&llm);
        return NULL;
}

static int rate_phase(const char *base, int threads, double secs, int use)
{
        cq_llm_limiter_t *lim = use ? cq_llm_limiter_new(0) : NULL;
        rate_arg_t *args = calloc((size_t)threads, sizeof(*args));
        pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
        double t0 = now_s(), t1;
        long ok = 0, failed = 0;
        int64_t cuts = 0;
        atomic_int stop = 0;
        struct timespec ts;
        int i;

        if (!args || !tids || (use && !lim))
                return 1;
        for (i = 0; i < threads; i++) {
                cq_llm_conf_init(&args[i].conf);
                args[i].conf.provider = CQ_LLM_ANTHROPIC;
                args[i].conf.base_url = base;
                args[i].conf.model = "claude-haiku-4-5";
                args[i].conf.max_tokens = 256;
                args[i].conf.limiter = lim;
                args[i].stop = &stop;
                if (pthread_create(&tids[i], NULL, rate_thread, &args[i]))
                        return 1;
        }
        ts.tv_sec = (time_t)secs;
        ts.tv_nsec = (long)((secs - (double)ts.tv_sec) * 1e9);
        while (nanosleep(&ts, &ts) != 0)
                ;
        atomic_store(&stop, 1);
        t1 = now_s();
        for (i = 0; i < threads; i++) {
                pthread_join(tids[i], NULL);
                ok += args[i].ok;
                failed += args[i].failed;
        }
        if (lim)
                cq_llm_limiter_stats(lim, &cuts, NULL);
        printf("{\"calls_ok\": %ld, \"calls_failed\": %ld, \"seconds\": "
               "%.3f, \"limiter_cuts\": %lld}\n",
               ok, failed, t1 - t0, (long long)cuts);
        cq_llm_limiter_destroy(&lim);
        free(args);
        free(tids);
        return 0;
}

int main(int argc, char **argv)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *msgs;
        char errstr[256];
        int n, i, parse_n = 20000;
        double *t, t0, total = 0;
        FILE *fp;
        char body[8192];
        size_t len;

        if (argc == 6 && strcmp(argv[1], "rate") == 0) {
                int rc;

                curl_global_init(CURL_GLOBAL_DEFAULT);
                rc = rate_phase(argv[2], (int)strtol(argv[3], NULL, 10),
                                strtod(argv[4], NULL),
                                (int)strtol(argv[5], NULL, 10));
                curl_global_cleanup();
                return rc;
        }
        if (argc != 4) {
                fprintf(stderr, "usage: %s BASE_URL CALLS REPLY.json\n",
                        argv[0]);
                return 2;
        }
        n = (int)strtol(argv[2], NULL, 10);
        if (n <= 0)
                return 2;
        curl_global_init(CURL_GLOBAL_DEFAULT);
        cq_llm_conf_init(&conf);
        conf.base_url = argv[1];
        conf.model = "gpt-4o-mini";
        conf.max_tokens = 1024;
        llm = cq_llm_new(&conf, errstr, sizeof(errstr));
        if (!llm) {
                fprintf(stderr, "%s\n", errstr);
                return 1;
        }
        msgs = history();
        t = calloc((size_t)n, sizeof(*t));
        cq_llm_reply_init(&reply);
        for (i = 0; i < n; i++) {
                t0 = now_s();
                if (cq_llm_chat(llm, msgs, &reply) != CQ_OK) {
                        fprintf(stderr, "%s\n", cq_llm_errmsg(llm));
                        return 1;
                }
                t[i] = (now_s() - t0) * 1e3;
                total += t[i];
        }
        qsort(t, (size_t)n, sizeof(*t), cq_bench_cmp_double);

        fp = fopen(argv[3], "rb");
        if (!fp)
                return 1;
        len = fread(body, 1, sizeof(body), fp);
        fclose(fp);
        t0 = now_s();
        for (i = 0; i < parse_n; i++) {
                if (cq_llm_parse_reply(body, len, &reply, NULL, 0) != 0)
                        return 1;
                cq_llm_reply_release(&reply);
        }
        printf("{\"calls\": %d, \"call_ms_mean\": %.3f, \"call_ms_p50\": "
               "%.3f, \"call_ms_p95\": %.3f, \"history_tokens_est\": %lld, "
               "\"parse_us\": %.2f, \"reply_bytes\": %zu}\n",
               n, total / n, t[n / 2], t[(n * 95) / 100],
               (long long)cq_llm_estimate_tokens(msgs),
               (now_s() - t0) * 1e6 / parse_n, len);
        free(t);
        json_decref(msgs);
        cq_llm_destroy(&llm);
        curl_global_cleanup();
        return 0;
}
