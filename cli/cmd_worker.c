/* SPDX-License-Identifier: MIT */
/* cmd_worker.c - `coderq worker`: the daemon. SIGTERM or SIGINT starts a
 * graceful shutdown; a second one exits at once. */
#include "coderq/cli/cmd_cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coderq/agent/llm.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/worker/worker.h"

static volatile sig_atomic_t worker_signals;

static void on_signal(int sig)
{
        if (++worker_signals >= 2)
                _exit(128 + sig); /* the second signal: no cleanup */
}

/* Slots call the LLM: without the key its provider needs every job would
 * fail on a 401, so the worker does not start; a local base URL (a
 * self-hosted server) may need none, which is said once. */
static int check_llm_key(const cq_config_t *cfg)
{
        cq_llm_conf_t lconf;
        char errstr[512];

        cq_llm_conf_from_config(&lconf, cfg);
        switch (cq_llm_conf_check_key(&lconf, errstr, sizeof(errstr))) {
        case 0:
                return 0;
        case 1:
                cq_log_kv(CQ_LOG_WARN, errstr, NULL);
                return 0;
        default:
                cq_cli_error("worker: %s", errstr);
                return -1;
        }
}

int cq_cmd_worker(const cq_config_t *cfg, int argc, char **argv)
{
        cq_worker_opts_t opts;
        cq_worker_t *worker;
        struct sigaction sa;
        char errstr[1024], from[24], to[24];
        unsigned long long was, now;
        int i, rc;

        cq_worker_opts_from_config(&opts, cfg);
        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--no-intake") == 0)
                        opts.intake = false;
                else if (strcmp(argv[i], "--no-relay") == 0)
                        opts.relay = false;
                else if (strcmp(argv[i], "--no-events") == 0)
                        opts.events = false;
                else {
                        cq_cli_error("worker: unknown argument %s", argv[i]);
                        return CQ_EXIT_USAGE;
                }
        }
        if (!cfg->pg_dsn) {
                cq_cli_error("worker: CODERQ_PG_DSN is not set");
                return CQ_EXIT_CONFIG;
        }
        if (opts.slots > 0 && check_llm_key(cfg) != 0)
                return CQ_EXIT_CONFIG;
        if (cq_nofile_raise(&was, &now) != 0) {
                cq_log_kv(CQ_LOG_WARN, "could not raise the open-files limit",
                          "error", strerror(errno), NULL);
        } else if (now != was) {
                snprintf(from, sizeof(from), "%llu", was);
                snprintf(to, sizeof(to), "%llu", now);
                cq_log_kv(CQ_LOG_INFO, "open-files limit raised", "from", from,
                          "to", to, NULL);
        }
        worker = cq_worker_new(cfg, &opts, errstr, sizeof(errstr));
        if (!worker) {
                cq_cli_error("worker: %s", errstr);
                return CQ_EXIT_UNAVAILABLE;
        }
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        rc = cq_worker_run(worker, &worker_signals);
        if (rc == 1) {
                /* The one line that says why: Kafka or PostgreSQL
                 * refused us, which waiting cannot fix. */
                cq_cli_error("worker: %s", cq_worker_errmsg(worker));
                cq_worker_destroy(&worker);
                return CQ_EXIT_UNAVAILABLE;
        }
        cq_worker_destroy(&worker);
        return rc == 0 ? CQ_EXIT_OK : CQ_EXIT_FAILED;
}
