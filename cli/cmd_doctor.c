/* SPDX-License-Identifier: MIT */
/* cmd_doctor.c - "coderq doctor": one line per check of what a worker needs
 * (PostgreSQL, Kafka, Debian's Python kernel, the sandbox: the very probe
 * a worker runs at start), each bounded by a short timeout so a dead
 * service never hangs the command. */
#include "coderq/cli/cmd_cli.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coderq/agent/llm.h"
#include "coderq/consumer/kafka.h"
#include "coderq/consumer/kafka_conf.h"
#include "coderq/local/kpool.h"
#include "coderq/local/kserver.h"
#include "coderq/common/log.h"
#include "coderq/local/sandbox.h"
#include "coderq/storage/probe.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"

extern char **environ;

#define DOCTOR_SERVICE_TIMEOUT_MS 3000
/* How long to wait for the reason behind "all brokers down". */
#define DOCTOR_REASON_WAIT_MS  1000
#define DOCTOR_TOOL_TIMEOUT_MS 5000
#define DOCTOR_PYTHON          "/usr/bin/python3"

const char cq_cmd_doctor_usage[] =
    "usage: coderq doctor\n"
    "Checks, each within a few seconds, and prints one line per check:\n"
    "  postgresql  a query on CODERQ_PG_DSN (server version; whether the\n"
    "              connection is encrypted, with its TLS protocol and cipher)\n"
    "  kafka       a metadata request to CODERQ_KAFKA_BROKERS, with the\n"
    "              Kafka properties (broker count); refused credentials or\n"
    "              TLS fail at once\n"
    "  python      " DOCTOR_PYTHON " -c 'import ipykernel' (local "
    "kernels)\n"
    "  sandbox     the worker's own start-up probe with the configured\n"
    "              CODERQ_SANDBOX, CODERQ_SANDBOX_UIDS and CODERQ_WORK_ROOT\n"
    "              (creates the work root); prints the sandbox mode kernels\n"
    "              would run in: bwrap+uid-per-kernel (ok), bwrap (a warning:\n"
    "              kernels share one uid) or off (a warning: unsandboxed); a\n"
    "              failure means a worker would refuse to start\n"
    "  kserver     the kernel server a worker would start (CODERQ_KERNEL_\n"
    "              SERVER, CODERQ_KERNEL_PRELOAD) with its probe under that\n"
    "              sandbox: ok with its import time, or a warning that\n"
    "              kernels would start cold\n"
    "  llm         the API key of CODERQ_LLM_PROVIDER, tried with one GET of\n"
    "              the provider's list of models (never shown): ok, or a\n"
    "              failure with the HTTP status (401, 403); a missing key\n"
    "              fails as a worker would refuse it; none: no LLM\n"
    "Exit status: 0 all required checks passed, 4 PostgreSQL, Kafka or the\n"
    "LLM API is unreachable, 1 python cannot import ipykernel, the sandbox\n"
    "fails, or the LLM API key is missing or refused.\n";

enum check_state { CHECK_OK, CHECK_WARN, CHECK_FAIL };

static void report(const char *name, enum check_state state, const char *what)
{
        static const char *const words[] = {"ok", "WARN", "FAIL"};

        printf("%-11s %-5s %s\n", name, words[state], what);
        fflush(stdout);
}

/* libpq and bwrap messages may span lines; a report is one line. */
static void one_line(char *s)
{
        char *end = s;

        for (; *end; end++)
                if (*end == '\n' || *end == '\r' || *end == '\t')
                        *end = ' ';
        while (end > s && end[-1] == ' ')
                *--end = '\0';
}

static int check_postgres(const cq_config_t *cfg)
{
        cq_store_probe_t probe;
        char what[512], tls[192];

        if (cq_store_probe(cfg->pg_dsn, DOCTOR_SERVICE_TIMEOUT_MS / 1000,
                           DOCTOR_SERVICE_TIMEOUT_MS, "coderq-doctor", &probe,
                           what, sizeof(what)) != 0) {
                one_line(what);
                report("postgresql", CHECK_FAIL, what);
                return -1;
        }
        if (probe.tls)
                snprintf(tls, sizeof(tls), "encrypted (%s, %s)",
                         probe.tls_protocol[0] ? probe.tls_protocol : "TLS",
                         probe.tls_cipher[0] ? probe.tls_cipher
                                             : "unknown cipher");
        else
                snprintf(tls, sizeof(tls), "not encrypted");
        snprintf(what, sizeof(what), "PostgreSQL %s, database \"%s\", %s",
                 probe.version, probe.database, tls);
        report("postgresql", CHECK_OK, what);
        return 0;
}

/* Connection failures are the expected outcome of a check against a dead
 * broker; keep librdkafka's own log lines out of the report. */
static void
kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        (void)rk;
        (void)level;
        cq_log_kv(CQ_LOG_DEBUG, "librdkafka", "facility", fac, "message", buf,
                  NULL);
}

/* What the error callback saw; final outcomes end the wait early. */
typedef struct kafka_probe {
        char down[256];    /* every broker refused the connection */
        char refused[512]; /* credentials or TLS refused */
} kafka_probe_t;

/* Served by rd_kafka_poll() on our thread. A refused connection to every
 * broker is final for a health check, and so is an authentication or TLS
 * failure: no need to wait out the timeout. */
static void
kafka_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
        kafka_probe_t *probe = opaque;

        (void)rk;
        if (cq_kafka_err_is_auth(err) && !probe->refused[0])
                snprintf(probe->refused, sizeof(probe->refused), "%s", reason);
        else if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && !probe->down[0])
                snprintf(probe->down, sizeof(probe->down), "%s", reason);
}

static int check_kafka(const cq_config_t *cfg)
{
        kafka_probe_t probe = {"", ""};
        int64_t deadline = cq_now_ms() + DOCTOR_SERVICE_TIMEOUT_MS;
        char errstr[512], what[800], timeout[16];
        cq_kafka_opts_t kopts;
        const char *const defaults[] = {"socket.connection.setup.timeout.ms",
                                        timeout, NULL};
        rd_kafka_conf_t *conf = NULL;
        rd_kafka_t *rk = NULL;
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t err;
        int rc = -1;

        snprintf(timeout, sizeof(timeout), "%d", DOCTOR_SERVICE_TIMEOUT_MS);
        if (!cfg->kafka_brokers || !*cfg->kafka_brokers) {
                report("kafka", CHECK_FAIL, "CODERQ_KAFKA_BROKERS is empty");
                goto out;
        }
        cq_kafka_opts_from_config(&kopts, cfg);
        kopts.client_id = "coderq-doctor";
        conf =
            cq_kafka_conf_new(&kopts, defaults, NULL, errstr, sizeof(errstr));
        if (!conf) {
                snprintf(what, sizeof(what), "could not configure client: %s",
                         errstr);
                report("kafka", CHECK_FAIL, what);
                goto out;
        }
        rd_kafka_conf_set_log_cb(conf, kafka_log);
        rd_kafka_conf_set_error_cb(conf, kafka_error);
        rd_kafka_conf_set_opaque(conf, &probe);
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        if (!rk) {
                snprintf(what, sizeof(what), "could not create client: %s",
                         errstr);
                report("kafka", CHECK_FAIL, what);
                goto out;
        }
        conf = NULL; /* rd_kafka_t owns it now */
        /* Short slices, so that an "all brokers down" error between them
         * ends the wait early. */
        for (;;) {
                int64_t left = deadline - cq_now_ms();
                int slice = left < 1 ? 1 : left < 250 ? (int)left : 250;

                err = rd_kafka_metadata(rk, 0, NULL, &md, slice);
                if (!err || left <= 250)
                        break;
                rd_kafka_poll(rk, 0);
                if (probe.down[0] || probe.refused[0])
                        break;
        }
        /* librdkafka may queue "all brokers down" before the TLS or
         * SASL error that took the broker down: give that reason a
         * moment to arrive, since it is the one the user can act on. */
        if (err && probe.down[0]) {
                int64_t until = cq_now_ms() + DOCTOR_REASON_WAIT_MS;

                while (!probe.refused[0] && cq_now_ms() < until)
                        rd_kafka_poll(rk, 100);
        }
        if (err && probe.refused[0]) {
                snprintf(what, sizeof(what), "could not connect to %s: %s",
                         cfg->kafka_brokers, probe.refused);
                report("kafka", CHECK_FAIL, what);
                goto out;
        }
        if (err && probe.down[0]) {
                snprintf(what, sizeof(what),
                         "could not connect to any broker of %s: %s",
                         cfg->kafka_brokers, probe.down);
                report("kafka", CHECK_FAIL, what);
                goto out;
        }
        if (err) {
                snprintf(what, sizeof(what),
                         "could not get metadata from %s: %s",
                         cfg->kafka_brokers, rd_kafka_err2str(err));
                report("kafka", CHECK_FAIL, what);
                goto out;
        }
        if (md->broker_cnt < 1) {
                snprintf(what, sizeof(what), "metadata from %s lists no broker",
                         cfg->kafka_brokers);
                report("kafka", CHECK_FAIL, what);
                goto out;
        }
        snprintf(what, sizeof(what), "%d broker%s, bootstrap %s",
                 md->broker_cnt, md->broker_cnt == 1 ? "" : "s",
                 cfg->kafka_brokers);
        report("kafka", CHECK_OK, what);
        rc = 0;
out:
        if (md)
                rd_kafka_metadata_destroy(md);
        if (rk)
                rd_kafka_destroy(rk);
        if (conf)
                rd_kafka_conf_destroy(conf);
        return rc;
}

/*
 * Run argv (searched in PATH) with stdin and stdout on /dev/null, keep the
 * first line of its stderr in errbuf, and kill it after timeout_ms.
 * Returns its exit status, 128 + signal, or -1 when it could not start
 * (errbuf says why).
 */
static int
run_quiet(char *const argv[], int timeout_ms, char *errbuf, size_t errbuf_size)
{
        posix_spawn_file_actions_t fa;
        int pipefd[2] = {-1, -1};
        bool fa_ready = false;
        pid_t pid = -1;
        size_t used = 0;
        int64_t deadline = cq_now_ms() + timeout_ms;
        int status = 0, rc = -1, err;

        errbuf[0] = '\0';
        if (pipe2(pipefd, O_CLOEXEC) != 0) {
                snprintf(errbuf, errbuf_size, "could not create a pipe: %s",
                         strerror(errno));
                goto out;
        }
        if (posix_spawn_file_actions_init(&fa) != 0)
                goto out;
        fa_ready = true;
        if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY,
                                             0) ||
            posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY,
                                             0) ||
            posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2)) {
                snprintf(errbuf, errbuf_size, "could not prepare to run %s",
                         argv[0]);
                goto out;
        }
        err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
        if (err) {
                pid = -1;
                snprintf(errbuf, errbuf_size, "could not run %s: %s", argv[0],
                         strerror(err));
                goto out;
        }
        close(pipefd[1]);
        pipefd[1] = -1;
        for (;;) {
                struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
                int64_t left = deadline - cq_now_ms();
                char chunk[512];
                ssize_t got;

                if (left <= 0) {
                        snprintf(errbuf, errbuf_size,
                                 "%s did not finish within %d ms", argv[0],
                                 timeout_ms);
                        kill(pid, SIGKILL);
                        break;
                }
                if (poll(&pfd, 1, (int)left) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                if (!pfd.revents)
                        continue;
                got = read(pipefd[0], chunk, sizeof(chunk));
                if (got < 0 && errno == EINTR)
                        continue;
                if (got <= 0)
                        break;
                if (used + 1 < errbuf_size) {
                        size_t n = (size_t)got;

                        if (n > errbuf_size - 1 - used)
                                n = errbuf_size - 1 - used;
                        memcpy(errbuf + used, chunk, n);
                        used += n;
                        errbuf[used] = '\0';
                }
        }
        while (waitpid(pid, &status, 0) < 0) {
                if (errno != EINTR)
                        goto out;
        }
        pid = -1;
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
out:
        if (pid > 0) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
        }
        if (fa_ready)
                posix_spawn_file_actions_destroy(&fa);
        if (pipefd[0] >= 0)
                close(pipefd[0]);
        if (pipefd[1] >= 0)
                close(pipefd[1]);
        if (errbuf[0]) {
                char *nl = strchr(errbuf, '\n');

                if (nl && nl[1])
                        *nl = '\0'; /* keep the first line */
                one_line(errbuf);
        }
        return rc;
}

/* argv arrays are char *const[] for posix_spawn(); the strings are never
 * written. */
static int check_tool(const char *name,
                      char *const argv[],
                      const char *ok,
                      enum check_state on_failure)
{
        char errbuf[400], what[512];
        int status =
            run_quiet(argv, DOCTOR_TOOL_TIMEOUT_MS, errbuf, sizeof(errbuf));

        if (status == 0) {
                report(name, CHECK_OK, ok);
                return 0;
        }
        if (status < 0)
                snprintf(what, sizeof(what), "%s", errbuf);
        else
                snprintf(what, sizeof(what), "%s exited with status %d%s%s",
                         argv[0], status, errbuf[0] ? ": " : "", errbuf);
        report(name, on_failure, what);
        return -1;
}

/* The LLM a worker's slots would call: its key, tried with the cheapest
 * request that needs it (the list of models), never shown. A key that is
 * missing or refused fails as a worker would (1); an API that does not
 * answer fails as a service (4); an answer that says nothing about the
 * key (404: a server without the list) is a warning. */
static int check_llm(const cq_config_t *cfg)
{
        cq_llm_conf_t lconf;
        cq_llm_t *llm;
        const char *provider;
        char keyerr[512], what[1024];
        int key;
        bool keyless; /* no key, a local server */
        long status = 0;
        int rc = 0;

        cq_llm_conf_from_config(&lconf, cfg);
        provider = cq_llm_provider_name(lconf.provider);
        if (lconf.provider == CQ_LLM_NONE) {
                report("llm", CHECK_OK,
                       "none (CODERQ_LLM_PROVIDER=none): no LLM is called, "
                       "only jobs with a solution run");
                return 0;
        }
        key = cq_llm_conf_check_key(&lconf, keyerr, sizeof(keyerr));
        if (key < 0) {
                snprintf(what, sizeof(what), "%s: %s", provider, keyerr);
                report("llm", CHECK_FAIL, what);
                return -1;
        }
        keyless = key == 1;
        lconf.connect_timeout_s = DOCTOR_TOOL_TIMEOUT_MS / 1000;
        lconf.timeout_s = DOCTOR_TOOL_TIMEOUT_MS / 1000;
        llm = cq_llm_new(&lconf, what, sizeof(what));
        if (!llm) {
                report("llm", CHECK_FAIL, what);
                return -1;
        }
        switch (cq_llm_list_models(llm, &status)) {
        case CQ_OK:
                snprintf(what, sizeof(what), "%s: %s (%s)", provider,
                         keyless ? "no API key, and the local server asks "
                                   "for none"
                                 : "the API key works",
                         cq_llm_errmsg(llm));
                report("llm", CHECK_OK, what);
                break;
        case CQ_ERR_RETRIABLE:
                snprintf(what, sizeof(what), "%s: the API did not answer (%s)",
                         provider, cq_llm_errmsg(llm));
                report("llm", CHECK_FAIL, what);
                rc = -2;
                break;
        default:
                if (status == 401 || status == 403) {
                        snprintf(what, sizeof(what), "%s: %s (%s)", provider,
                                 keyless ? "no API key, and the server wants "
                                           "one"
                                         : "the API key was refused",
                                 cq_llm_errmsg(llm));
                        report("llm", CHECK_FAIL, what);
                        rc = -1;
                } else {
                        snprintf(what, sizeof(what),
                                 "%s: the API key could not be checked (%s)",
                                 provider, cq_llm_errmsg(llm));
                        report("llm", CHECK_WARN, what);
                }
                break;
        }
        cq_llm_destroy(&llm);
        return rc;
}

/* The kernel server a worker would start, with its probe, confined by
 * \p sandbox: forked kernels or cold starts (a speed, not a safety,
 * matter: a warning at most). */
static void check_kserver(const cq_config_t *cfg, const cq_sandbox_t *sandbox)
{
        cq_kserver_opts_t ko;
        cq_kserver_stats_t st;
        cq_kserver_t *ks;
        char errstr[768], what[1024];

        if (cq_kserver_opts_from_config(&ko, cfg, sandbox) != 0) {
                report("kserver", CHECK_FAIL, "invalid CODERQ_KERNEL_SERVER");
                return;
        }
        if (ko.mode == CQ_KSERVER_OFF) {
                report("kserver", CHECK_OK,
                       "off (CODERQ_KERNEL_SERVER=off): kernels start cold");
                return;
        }
        /* quiet: the report says it */
        ko.mode = CQ_KSERVER_ON;
        ks = cq_kserver_new(&ko, errstr, sizeof(errstr));
        if (!ks) {
                snprintf(what, sizeof(what),
                         "does not work here, kernels would start cold: %s",
                         errstr);
                one_line(what);
                report("kserver", CHECK_WARN, what);
                return;
        }
        cq_kserver_stats(ks, &st);
        snprintf(what, sizeof(what),
                 "works: kernels are forked from a server that imported %s "
                 "in %lld ms",
                 cfg->kernel_preload && *cfg->kernel_preload
                     ? cfg->kernel_preload
                     : "ipykernel only",
                 (long long)st.import_ms);
        report("kserver", CHECK_OK, what);
        cq_kserver_destroy(&ks);
}

/* The probe a worker runs at start (cq_backend_new()), with the same
 * settings: what it says is what a worker would do. */
static int check_sandbox(const cq_config_t *cfg)
{
        cq_sandbox_opts_t so;
        cq_sandbox_t *sandbox;
        char root[PATH_MAX], errstr[768], what[1024];
        const char *mode;

        if (cq_sandbox_opts_from_config(&so, cfg) != 0) {
                report("sandbox", CHECK_FAIL,
                       "invalid CODERQ_SANDBOX or CODERQ_SANDBOX_UIDS");
                report("kserver", CHECK_WARN,
                       "not checked: a worker would not start (sandbox)");
                return -1;
        }
        if (!so.probe_dir) {
                cq_work_root_default(root, sizeof(root));
                so.probe_dir = root;
        }
        sandbox = cq_sandbox_new(&so, errstr, sizeof(errstr));
        if (!sandbox ||
            cq_work_root_prepare(so.probe_dir, errstr, sizeof(errstr)) != 0) {
                /* a worker would not start (cq_backend_new()) */
                cq_sandbox_destroy(&sandbox);
                one_line(errstr);
                report("sandbox", CHECK_FAIL, errstr);
                /* one line per check, always */
                report("kserver", CHECK_WARN,
                       "not checked: a worker would not start (sandbox)");
                return -1;
        }
        mode = cq_sandbox_mode_name(sandbox);
        if (cq_sandbox_uid_per_kernel(sandbox)) {
                snprintf(what, sizeof(what),
                         "%s: bubblewrap works, a uid per kernel from "
                         "%ld-%ld, work root %s",
                         mode, so.uid_first, so.uid_last, so.probe_dir);
                report("sandbox", CHECK_OK, what);
        } else if (cq_sandbox_enabled(sandbox)) {
                snprintf(what, sizeof(what),
                         "%s: bubblewrap works, work root %s; %s", mode,
                         so.probe_dir, cq_sandbox_reason(sandbox));
                report("sandbox", CHECK_WARN, what);
        } else {
                snprintf(what, sizeof(what),
                         "%s: kernels would run UNSANDBOXED, as uid %ld: %s",
                         mode, (long)geteuid(), cq_sandbox_reason(sandbox));
                one_line(what);
                report("sandbox", CHECK_WARN, what);
        }
        check_kserver(cfg, sandbox);
        cq_sandbox_destroy(&sandbox);
        return 0;
}

int cq_cmd_doctor(const cq_config_t *cfg, int argc, char **argv)
{
        static char python[] = DOCTOR_PYTHON, dash_c[] = "-c",
                    import[] = "import ipykernel";
        char *const python_argv[] = {python, dash_c, import, NULL};
        bool services_ok = true, tools_ok = true;

        (void)argv;
        if (argc > 1) {
                cq_cli_error("doctor takes no arguments; see coderq doctor "
                             "--help");
                return CQ_EXIT_USAGE;
        }
        if (check_postgres(cfg) != 0)
                services_ok = false;
        if (check_kafka(cfg) != 0)
                services_ok = false;
        if (check_tool("python", python_argv,
                       DOCTOR_PYTHON " imports ipykernel", CHECK_FAIL) != 0)
                tools_ok = false;
        if (check_sandbox(cfg) != 0)
                tools_ok = false;
        switch (check_llm(cfg)) {
        case 0:
                break;
        case -2:
                services_ok = false;
                break;
        default:
                tools_ok = false;
                break;
        }
        if (!services_ok)
                return CQ_EXIT_UNAVAILABLE;
        return tools_ok ? CQ_EXIT_OK : CQ_EXIT_FAILED;
}
