/* SPDX-License-Identifier: MIT */
/* check_it_cli.c - the coderq executable against the running services:
 * doctor sees PostgreSQL and Kafka, and gives a worker's sandbox verdict. Needs
 * scripts/services.sh start and its env. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/cli/cli.h"
#include "coderq/local/sandbox.h"
#include "support/proc.h"

START_TEST(doctor_sees_the_services)
{
        char path[4096];
        const char *dir = getenv("CQ_BINARY_DIR");
        const char *argv[] = {path, "doctor", NULL};
        cq_check_proc_t proc;
        char want[256];

        /* fail early, with a clear message, when the env is missing */
        cq_check_env("CODERQ_PG_DSN");
        snprintf(want, sizeof(want), "1 broker, bootstrap %s\n",
                 cq_check_env("CODERQ_KAFKA_BROKERS"));
        snprintf(path, sizeof(path), "%s/coderq", dir ? dir : CQ_BINARY_DIR);
        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 60000, &proc), 0);
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
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 5);
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
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 5); /* with kserver */
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
        const char *on_nope[] = {sandbox_env, "CODERQ_WORK_ROOT=/proc/nope/cq",
                                 NULL};
        const char *off_link[] = {"CODERQ_SANDBOX=off", link_env, NULL};
        const char *dflt[] = {sandbox_env, "CODERQ_SANDBOX_UIDS", root_env,
                              NULL};
        const char *one_uid[] = {sandbox_env, "CODERQ_SANDBOX_UIDS=off",
                                 root_env, NULL};
        const char *off[] = {"CODERQ_SANDBOX=off", root_env, NULL};
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

static Suite *it_cli_suite(void)
{
        Suite *s = suite_create("it_cli");
        TCase *tc = tcase_create("doctor");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, doctor_sees_the_services);
        tcase_add_test(tc, doctor_gives_the_workers_sandbox_verdict);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_cli_suite)
