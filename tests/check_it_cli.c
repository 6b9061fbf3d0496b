/* SPDX-License-Identifier: MIT */
/* check_it_cli.c - the coderq executable against the running services:
 * doctor sees PostgreSQL and Kafka, gives a worker's sandbox verdict, and
 * tries the LLM key against the fake LLM. Needs scripts/services.sh start
 * and its env. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "check_support.h"
#include "coderq/cli/cli.h"
#include "coderq/local/sandbox.h"
#include "support/fake_llm.h"
#include "support/proc.h"

#define LLM_KEY "sk-doctor-SECRET-7c1e"

static cq_fake_llm_t *fake;
static char llm_url[160]; /* CODERQ_LLM_BASE_URL=the fake's */

/* The fake LLM, taking LLM_KEY only. */
static void setup(void)
{
        const char *args[] = {"--require-key", LLM_KEY, NULL};

        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        fake = cq_fake_llm_start(args);
        ck_assert_ptr_nonnull(fake);
        snprintf(llm_url, sizeof(llm_url), "CODERQ_LLM_BASE_URL=%s",
                 cq_fake_llm_base_url(fake));
}

static void teardown(void)
{
        cq_fake_llm_stop(&fake);
        curl_global_cleanup();
}

START_TEST(doctor_sees_the_services)
{
        char path[4096];
        const char *dir = getenv("CQ_BINARY_DIR");
        const char *argv[] = {path, "doctor", NULL};
        const char *env[] = {llm_url, "CODERQ_LLM_PROVIDER=openai",
                             "CODERQ_LLM_API_KEY=" LLM_KEY, NULL};
        cq_check_proc_t proc;
        char want[256], llm[256];

        /* fail early, with a clear message, when the env is missing */
        cq_check_env("CODERQ_PG_DSN");
        snprintf(want, sizeof(want), "1 broker, bootstrap %s\n",
                 cq_check_env("CODERQ_KAFKA_BROKERS"));
        snprintf(llm, sizeof(llm),
                 "\nllm         ok    openai: the API key works (GET "
                 "%s/models: HTTP 200)\n",
                 cq_fake_llm_base_url(fake));
        snprintf(path, sizeof(path), "%s/coderq", dir ? dir : CQ_BINARY_DIR);
        ck_assert_int_eq(cq_check_proc_run(argv, env, 60000, &proc), 0);
        ck_assert_msg(proc.status == CQ_EXIT_OK, "doctor exited %d:\n%s%s",
                      proc.status, proc.out, proc.err);
        ck_assert_msg(
            strncmp(proc.out, "postgresql  ok    PostgreSQL 15.", 32) == 0,
            "%s", proc.out);
        /* Plaintext, or TLS when the services run in secure mode (libpq
         * prefers TLS where the server offers it). */
        ck_assert_msg(
            strstr(proc.out, "database \"coderq\", not encrypted\n") ||
                strstr(proc.out, "database \"coderq\", encrypted (TLSv1."),
            "%s", proc.out);
        ck_assert_msg(strstr(proc.out, "\nkafka       ok    ") != NULL, "%s",
                      proc.out);
        ck_assert_msg(strstr(proc.out, want) != NULL, "%s", proc.out);
        ck_assert_ptr_nonnull(strstr(proc.out, "\npython      ok    "));
        ck_assert_ptr_nonnull(strstr(proc.out, "\nkserver     "));
        ck_assert_msg(strstr(proc.out, llm), "%s", proc.out);
        ck_assert_ptr_null(strstr(proc.out, "SECRET"));
        /* its own lines only: no log line of the kernel server it tried */
        ck_assert_msg(!strstr(proc.err, "\"level\":"), "%s", proc.err);
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 6);
        cq_check_proc_release(&proc);
}
END_TEST

static const char *coderq(void)
{
        static char path[4096];
        const char *dir = getenv("CQ_BINARY_DIR");

        snprintf(path, sizeof(path), "%s/coderq", dir ? dir : CQ_BINARY_DIR);
        return path;
}

#define NO_LLM "CODERQ_LLM_PROVIDER=none"

/* `coderq doctor` with \p env added; fails the test unless it exits with
 * \p status and its sandbox line starts with \p line. */
static void doctor_says(const char *const *env, int status, const char *line)
{
        const char *argv[] = {coderq(), "doctor", NULL};
        cq_check_proc_t proc;
        const char *got;

        ck_assert_int_eq(cq_check_proc_run(argv, env, 60000, &proc), 0);
        got = strstr(proc.out, "\nsandbox ");
        ck_assert_msg(got && strncmp(got + 1, line, strlen(line)) == 0,
                      "want \"%s\" in:\n%s%s", line, proc.out, proc.err);
        ck_assert_msg(proc.status == status, "doctor exited %d, not %d:\n%s",
                      proc.status, status, proc.out);
        /* with kserver and llm */
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 6);
        cq_check_proc_release(&proc);
}

/* doctor's sandbox line is the verdict of the probe a worker runs, and
 * its exit status says whether a worker could start: FAIL (exit 1) for a
 * root a worker refuses, in any mode, with the reason a worker gives;
 * as root with working bubblewrap, ok for the default (a uid per kernel),
 * WARN for one uid or none. */
START_TEST(doctor_gives_the_workers_sandbox_verdict)
{
        char top[256], link[300], root_env[320], link_env[320], want[512];
        char sandbox_env[] = "CODERQ_SANDBOX";
        /* no LLM: its check is another test's */
        const char *on_nope[] = {sandbox_env, "CODERQ_WORK_ROOT=/proc/nope/cq",
                                 NO_LLM, NULL};
        const char *off_link[] = {"CODERQ_SANDBOX=off", link_env, NO_LLM, NULL};
        const char *dflt[] = {sandbox_env, "CODERQ_SANDBOX_UIDS", root_env,
                              NO_LLM, NULL};
        const char *one_uid[] = {sandbox_env, "CODERQ_SANDBOX_UIDS=off",
                                 root_env, NO_LLM, NULL};
        const char *off[] = {"CODERQ_SANDBOX=off", root_env, NO_LLM, NULL};
        const char *wargv[] = {coderq(), "worker", NULL};
        cq_sandbox_opts_t so = {0};
        cq_sandbox_t *sandbox;
        cq_check_proc_t proc;
        char errstr[512];
        bool works;

        cq_check_env("CODERQ_PG_DSN");
        snprintf(top, sizeof(top), "/tmp/cq-it-cli-%ld", (long)getpid());
        snprintf(root_env, sizeof(root_env), "CODERQ_WORK_ROOT=%s/root", top);
        snprintf(link, sizeof(link), "%s/link", top);
        snprintf(link_env, sizeof(link_env), "CODERQ_WORK_ROOT=%s", link);
        ck_assert_int_eq(mkdir(top, 0711), 0);

        /* Refused roots (no bubblewrap needed): doctor and the worker
         * agree, word for word. */
        doctor_says(on_nope, CQ_EXIT_FAILED,
                    "sandbox     FAIL  could not enable the sandbox "
                    "(CODERQ_SANDBOX=on): could not create \"/proc/nope\"");
        ck_assert_int_eq(symlink("/tmp", link), 0);
        snprintf(want, sizeof(want),
                 "sandbox     FAIL  work root \"%s\" is a symbolic link", link);
        doctor_says(off_link, CQ_EXIT_FAILED, want);
        ck_assert_int_eq(cq_check_proc_run(wargv, off_link, 60000, &proc), 0);
        ck_assert_int_ne(proc.status, 0);
        ck_assert_msg(strstr(proc.err, want + strlen("sandbox     FAIL  ")),
                      "worker: %s", proc.err);
        cq_check_proc_release(&proc);
        unlink(link);

        /* The working modes need bubblewrap, and a uid per kernel root. */
        so.mode = CQ_SANDBOX_AUTO;
        so.probe_dir = top;
        sandbox = cq_sandbox_new(&so, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        works = cq_sandbox_enabled(sandbox);
        snprintf(errstr, sizeof(errstr), "%s", cq_sandbox_reason(sandbox));
        cq_sandbox_destroy(&sandbox);
        if (!works) {
                rmdir(top);
                CQ_CHECK_SKIP("bwrap", "bubblewrap does not work here: %s",
                              errstr);
        }
        if (geteuid() != 0) {
                rmdir(top);
                CQ_CHECK_SKIP("root", "kernel uids are switched by root only");
        }
        snprintf(want, sizeof(want),
                 "sandbox     ok    bwrap+uid-per-kernel: bubblewrap works, a "
                 "uid per kernel from %d-%d, work root %s/root\n",
                 CQ_SANDBOX_UIDS_FIRST, CQ_SANDBOX_UIDS_LAST, top);
        doctor_says(dflt, CQ_EXIT_OK, want);
        doctor_says(one_uid, CQ_EXIT_OK,
                    "sandbox     WARN  bwrap: bubblewrap works, work root ");
        doctor_says(off, CQ_EXIT_OK,
                    "sandbox     WARN  off: kernels would run UNSANDBOXED, as "
                    "uid 0");
        snprintf(errstr, sizeof(errstr), "rm -rf %s", top);
        ck_assert_int_eq(system(errstr), 0);
}
END_TEST

/* doctor's llm line: the key tried with GET .../models, as each provider
 * sends it, ok or FAIL with the status and never the key; no key at all
 * fails as a worker would refuse it; none calls nothing. */
START_TEST(doctor_tries_the_llm_key)
{
        static const struct {
                const char *provider, *key, *base;
                int status;
                const char *line;
        } cases[] = {
            {"openai", "CODERQ_LLM_API_KEY=" LLM_KEY, NULL, CQ_EXIT_OK,
             "ok    openai: the API key works (GET {base}/models: HTTP 200)"},
            {"anthropic", "CODERQ_LLM_ANTHROPIC_API_KEY=" LLM_KEY, NULL,
             CQ_EXIT_OK,
             "ok    anthropic: the API key works (GET {base}/models: HTTP "
             "200)"},
            {"openai", "CODERQ_LLM_API_KEY=sk-wrong-SECRET", NULL,
             CQ_EXIT_FAILED,
             "FAIL  openai: the API key was refused (GET {base}/models: HTTP "
             "401)"},
            {"anthropic", "ANTHROPIC_API_KEY=sk-wrong-SECRET", NULL,
             CQ_EXIT_FAILED,
             "FAIL  anthropic: the API key was refused (GET {base}/models: "
             "HTTP "
             "401)"},
            {"openai", NULL, NULL, CQ_EXIT_FAILED,
             "FAIL  openai: no API key, and the server wants one (GET "
             "{base}/models: HTTP 401)"},
            {"openai", NULL, "CODERQ_LLM_BASE_URL=https://api.example.com/v1",
             CQ_EXIT_FAILED,
             "FAIL  openai: CODERQ_LLM_PROVIDER=openai needs an API key: set "
             "CODERQ_LLM_API_KEY (or OPENAI_API_KEY) (CODERQ_LLM_BASE_URL "
             "https://api.example.com/v1 is not local)"},
            {"none", NULL, NULL, CQ_EXIT_OK,
             "ok    none (CODERQ_LLM_PROVIDER=none): no LLM is called, only "
             "jobs with a solution run"},
        };
        const char *argv[] = {coderq(), "doctor", NULL};
        char provider[64], want[512], *url;
        cq_check_proc_t proc;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                const char *env[] = {provider,
                                     cases[i].base ? cases[i].base : llm_url,
                                     "CODERQ_LLM_API_KEY",
                                     "OPENAI_API_KEY",
                                     "CODERQ_LLM_ANTHROPIC_API_KEY",
                                     "ANTHROPIC_API_KEY",
                                     "CODERQ_KERNEL_SERVER=off",
                                     cases[i].key,
                                     NULL};
                const char *line = cases[i].line;

                snprintf(provider, sizeof(provider), "CODERQ_LLM_PROVIDER=%s",
                         cases[i].provider);
                url = strstr(line, "{base}");
                snprintf(want, sizeof(want), "\nllm         %.*s%s%s\n",
                         url ? (int)(url - line) : (int)strlen(line), line,
                         url ? cq_fake_llm_base_url(fake) : "",
                         url ? url + 6 : "");
                ck_assert_int_eq(cq_check_proc_run(argv, env, 60000, &proc), 0);
                ck_assert_msg(strstr(proc.out, want) &&
                                  proc.status == cases[i].status,
                              "case %zu: exit %d, want \"%s\" in:\n%s%s", i,
                              proc.status, want + 1, proc.out, proc.err);
                ck_assert_ptr_null(strstr(proc.out, "SECRET"));
                ck_assert_ptr_null(strstr(proc.err, "SECRET"));
                cq_check_proc_release(&proc);
        }
}
END_TEST

static Suite *it_cli_suite(void)
{
        Suite *s = suite_create("it_cli");
        TCase *tc = tcase_create("doctor");

        tcase_set_timeout(tc, 120);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, doctor_sees_the_services);
        tcase_add_test(tc, doctor_gives_the_workers_sandbox_verdict);
        tcase_add_test(tc, doctor_tries_the_llm_key);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_cli_suite)
