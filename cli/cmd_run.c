/* SPDX-License-Identifier: MIT */
/* cmd_run.c - `coderq run JOB.json --out DIR`: one job through the agent
 * loop with the local kernel pool, no Kafka and no PostgreSQL. Progress
 * goes to stdout as it happens; the notebook, the images and a result
 * summary go to DIR. Exit code 0 only when the job succeeded. */
#include "coderq/cli/cmd_cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coderq/agent/agent.h"
#include "coderq/backend/backend.h"
#include "coderq/cli/cli.h"
#include "coderq/cli/clifmt.h"
#include "coderq/common/log.h"
#include "coderq/agent/notebook.h"
#include "coderq/common/prices.h"

static atomic_int run_cancel;

static void on_signal(int sig)
{
        (void)sig;
        atomic_store(&run_cancel, 1);
}

/* Print text the model, the kernel or the job controls escaped on one
 * line (cq_fmt_untrusted()): it must not move the cursor, recolour or
 * reorder what the terminal shows. At most \p max_width columns (0: all). */
static void put_untrusted(const char *s, size_t max_width)
{
        char *text = cq_fmt_untrusted_dup(s, max_width);

        fputs(text ? text : "(out of memory)", stdout);
        free(text);
}

/* Progress lines for a person watching the run. */
static void print_event(void *opaque, const char *type, const json_t *data)
{
        long *turn = opaque;

        if (strcmp(type, "llm.reply") == 0) {
                const char *text =
                    json_string_value(json_object_get(data, "text"));
                size_t ncode = json_array_size(json_object_get(data, "code"));

                ++*turn;
                if (ncode)
                        printf("[turn %ld] the model wrote %zu code cell%s\n",
                               *turn, ncode, ncode == 1 ? "" : "s");
                else
                        printf("[turn %ld] the model gave its final answer\n",
                               *turn);
                if (text && *text) {
                        fputs("           ", stdout);
                        put_untrusted(text, 200);
                        putchar('\n');
                }
        } else if (strcmp(type, "cell.finished") == 0) {
                printf("[cell] %s in %lld ms\n",
                       json_string_value(json_object_get(data, "status")),
                       (long long)json_integer_value(
                           json_object_get(data, "duration_ms")));
        } else if (strcmp(type, "reflection") == 0) {
                fputs("[reflection] ", stdout);
                put_untrusted(json_string_value(json_object_get(data, "error")),
                              0);
                putchar('\n');
        } else if (strcmp(type, "tests.result") == 0) {
                printf("[tests] %lld of %lld passed\n",
                       (long long)json_integer_value(
                           json_object_get(data, "passed")),
                       (long long)json_integer_value(
                           json_object_get(data, "total")));
        }
        fflush(stdout);
}

static int make_dir(const char *path)
{
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                cq_cli_error("could not create directory %s: %s", path,
                             strerror(errno));
                return -1;
        }
        return 0;
}

static int write_bytes(const char *path, const void *data, size_t len)
{
        FILE *fp = fopen(path, "wb");
        int rc = 0;

        if (!fp) {
                cq_cli_error("could not write %s: %s", path, strerror(errno));
                return -1;
        }
        if (len && fwrite(data, 1, len, fp) != len)
                rc = -1;
        if (fclose(fp) != 0)
                rc = -1;
        if (rc)
                cq_cli_error("could not write %s: %s", path, strerror(errno));
        return rc;
}

/* DIR/notebook.ipynb, DIR/images/, DIR/result.json */
static int write_outputs(const char *dir,
                         const cq_job_t *job,
                         const char *sandbox,
                         const cq_nb_t *nb,
                         const cq_agent_result_t *res)
{
        char path[4096], errstr[512];
        json_t *summary = NULL, *images;
        char *text = NULL;
        size_t i;
        int rc = -1;

        if (make_dir(dir) != 0)
                return -1;
        snprintf(path, sizeof(path), "%s/notebook.ipynb", dir);
        if (cq_nb_write_file(nb, path, errstr, sizeof(errstr)) != 0) {
                cq_cli_error("%s", errstr);
                return -1;
        }
        snprintf(path, sizeof(path), "%s/images", dir);
        if (make_dir(path) != 0)
                return -1;
        images = json_array();
        for (i = 0; images && i < res->images.n; i++) {
                const cq_agent_image_t *img = &res->images.v[i];
                const char *base = strrchr(img->name, '/');

                base = base ? base + 1 : img->name;
                snprintf(path, sizeof(path), "%s/images/%s", dir, base);
                if (write_bytes(path, img->data, img->len) != 0)
                        goto out;
                json_array_append_new(images,
                                      json_pack("{s:s, s:s, s:I}", "name",
                                                img->name, "mime", img->mime,
                                                "bytes", (json_int_t)img->len));
        }
        summary = json_pack(
            "{s:s, s:s, s:s?, s:s?, s:s?, s:s?, s:I, s:I, s:I, s:o?, s:b, "
            "s:{s:I, s:I, s:I, s:I}, s:o, s:o, s:I, s:s, s:O?}",
            "job_id", job->job_id, "status", cq_agent_status_name(res->status),
            "reason", res->reason, "reason_code", res->reason_code, "answer",
            res->answer, "last_error", res->last_error, "turns",
            (json_int_t)res->turns, "retries", (json_int_t)res->retries,
            "cells", (json_int_t)res->cells, "tests",
            res->tests ? json_incref(res->tests) : NULL, "from_memory",
            res->from_memory, "usage", "prompt_tokens",
            (json_int_t)res->prompt_tokens, "completion_tokens",
            (json_int_t)res->completion_tokens, "cache_read_tokens",
            (json_int_t)res->cache_read_tokens, "cache_creation_tokens",
            (json_int_t)res->cache_creation_tokens, "cost_usd",
            res->cost_usd >= 0 ? json_real(res->cost_usd) : json_null(),
            "images", images, "duration_ms", (json_int_t)res->duration_ms,
            "sandbox", sandbox, "repro", res->repro);
        images = NULL;
        if (!summary)
                goto out;
        text = json_dumps(summary, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (!text)
                goto out;
        snprintf(path, sizeof(path), "%s/result.json", dir);
        if (write_bytes(path, text, strlen(text)) != 0)
                goto out;
        rc = 0;
out:
        json_decref(images);
        json_decref(summary);
        free(text);
        return rc;
}

/* Where tests with isolation "fresh" get a new interpreter. */
typedef struct fresh_src {
        cq_backend_t *backend;
        int64_t startup_ms;
} fresh_src_t;

static cq_interp_t *run_new_interp(void *opaque,
                                   const char *backend_name,
                                   char *errstr,
                                   size_t errstr_size)
{
        fresh_src_t *src = opaque;
        cq_interp_t *interp = NULL;

        if (cq_backend_acquire(src->backend, backend_name, src->startup_ms,
                               &interp, errstr, errstr_size) != CQ_OK)
                return NULL;
        return interp;
}

int cq_cmd_run(const cq_config_t *cfg, int argc, char **argv)
{
        const char *job_path = NULL, *out_dir = NULL;
        cq_job_t job;
        cq_backend_t *backend = NULL;
        cq_config_t one;
        cq_interp_t *interp = NULL;
        cq_llm_t *llm = NULL;
        cq_nb_t *nb = NULL;
        cq_agent_opts_t opts;
        cq_agent_observer_t obs = {0};
        cq_agent_result_t result;
        fresh_src_t fresh;
        cq_llm_conf_t conf;
        cq_prices_t *prices = NULL;
        char *text = NULL, errstr[1024], where[512];
        size_t len = 0;
        long turn = 0;
        int i, rc = CQ_EXIT_FAILED;

        cq_job_init(&job);
        cq_agent_result_init(&result);
        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
                        out_dir = argv[++i];
                else if (strncmp(argv[i], "--out=", 6) == 0)
                        out_dir = argv[i] + 6;
                else if (argv[i][0] == '-' && argv[i][1]) {
                        cq_cli_error("run: unknown option %s", argv[i]);
                        return CQ_EXIT_USAGE;
                } else if (!job_path)
                        job_path = argv[i];
                else {
                        cq_cli_error("run: one job file only");
                        return CQ_EXIT_USAGE;
                }
        }
        if (!job_path || !out_dir) {
                cq_cli_error("run: usage: coderq run JOB.json --out DIR");
                return CQ_EXIT_USAGE;
        }
        if (cq_cmd_read_file(job_path, cfg->job_max_bytes, &text, &len) != 0)
                return CQ_EXIT_USAGE;
        if (cq_job_parse(text, len, cfg->job_max_bytes, &job, errstr,
                         sizeof(errstr)) != CQ_OK) {
                cq_cli_error("invalid job in %s: %s", job_path, errstr);
                rc = CQ_EXIT_USAGE;
                goto out;
        }
        cq_llm_conf_from_config(&conf, cfg);
        llm = cq_llm_new(&conf, errstr, sizeof(errstr));
        if (!llm) {
                cq_cli_error("could not set up the LLM client: %s", errstr);
                rc = CQ_EXIT_CONFIG;
                goto out;
        }
        /* One kernel, started on demand, nothing speculative: no pool
         * refill behind it, no server, no imports the job did not ask
         * for (cq_config_one_shot()). */
        cq_config_one_shot(&one, cfg);
        backend = cq_backend_new(&one, 0, errstr, sizeof(errstr));
        if (!backend) {
                cq_cli_error("could not set up kernels: %s", errstr);
                goto out;
        }
        fputs("coderq run: job ", stdout);
        put_untrusted(job.job_id, 0);
        fputs(" with model ", stdout);
        put_untrusted(job.model ? job.model : cq_llm_model(llm), 0);
        cq_backend_describe_job(backend, job.backend, where, sizeof(where));
        printf(" (%s)\n", where);
        fflush(stdout);
        /* A job judged with no LLM gets a runner, not a kernel. */
        if (cq_backend_acquire_for(backend, &job, 1,
                                   cfg->kernel_startup_timeout_s * 1000,
                                   &interp, errstr, sizeof(errstr)) != CQ_OK) {
                cq_cli_error("could not start an interpreter: %s", errstr);
                goto out;
        }
        nb = cq_nb_new(cq_interp_language_info(interp));
        if (!nb) {
                cq_cli_error("out of memory");
                rc = CQ_EXIT_INTERNAL;
                goto out;
        }
        cq_agent_opts_from_config(&opts, cfg);
        opts.cancel = &run_cancel;
        if (cfg->prices_file && *cfg->prices_file) {
                prices =
                    cq_prices_load(cfg->prices_file, errstr, sizeof(errstr));
                if (!prices) {
                        cq_cli_error("%s", errstr);
                        rc = CQ_EXIT_CONFIG;
                        goto out;
                }
        }
        opts.prices = prices;
        fresh.backend = backend;
        fresh.startup_ms = cfg->kernel_startup_timeout_s * 1000;
        opts.new_interp = run_new_interp;
        opts.new_interp_opaque = &fresh;
        opts.judge_start = cq_backend_judge_start;
        opts.judge_opaque = backend;
        obs.on_event = print_event;
        obs.opaque = &turn;
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        if (cq_agent_run(&job, interp, llm, &opts, &obs, NULL, NULL, nb,
                         &result) != CQ_OK) {
                cq_cli_error("the agent could not run: out of memory or no "
                             "usable interpreter");
                rc = CQ_EXIT_INTERNAL;
                goto out;
        }
        if (write_outputs(out_dir, &job,
                          cq_backend_sandbox_mode(backend, interp), nb,
                          &result) != 0)
                goto out;
        printf("coderq run: %s", cq_agent_status_name(result.status));
        if (result.reason) {
                fputs(": ", stdout);
                put_untrusted(result.reason, 0);
        }
        printf(" (%ld turns, %ld retries, %ld cells", result.turns,
               result.retries, result.cells);
        /* result.json's "tests" is null both when the job has none and
         * when they never ran (tests_total is then 0) */
        if (result.tests)
                printf(", tests %d/%d", result.tests_passed,
                       result.tests_total);
        else if (result.tests_total >= 0)
                printf(", tests not run");
        printf(")\ncoderq run: wrote %s/notebook.ipynb, %s/result.json and "
               "%zu image%s in %s/images\n",
               out_dir, out_dir, result.images.n,
               result.images.n == 1 ? "" : "s", out_dir);
        rc = result.status == CQ_AGENT_SUCCEEDED ? CQ_EXIT_OK : CQ_EXIT_FAILED;
out:
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        cq_agent_result_release(&result);
        cq_nb_destroy(&nb);
        cq_interp_destroy(&interp);
        cq_backend_destroy(&backend);
        cq_llm_destroy(&llm);
        cq_prices_destroy(&prices);
        cq_job_release(&job);
        free(text);
        return rc;
}
