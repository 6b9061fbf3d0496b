/* SPDX-License-Identifier: MIT */
/* check_it_cli.c - the coderq executable against the running services:
 * doctor sees PostgreSQL and Kafka. Needs scripts/services.sh start and its
 * env. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/cli.h"
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

static Suite *it_cli_suite(void)
{
        Suite *s = suite_create("it_cli");
        TCase *tc = tcase_create("doctor");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, doctor_sees_the_services);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_cli_suite)
