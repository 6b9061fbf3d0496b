/* SPDX-License-Identifier: MIT */
/* check_pgconn.c - a failed PostgreSQL connection in one line: libpq's
 * messages of real failures (tests/data/pgconn/<case>/input, collected
 * from libpq 15 against PostgreSQL 15: a wrong database, password, role,
 * pg_hba.conf, TLS, DSN, and outages) classified as expected, and the
 * target a DSN names, never its password. No PostgreSQL needed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/storage/pgconn.h"

#define CASES_MAX 64

START_TEST(real_messages_are_classified)
{
        char *names[CASES_MAX];
        size_t n = cq_check_cases("tests/data/pgconn", names, CASES_MAX), i;
        int failed = 0;

        ck_assert_uint_ge(n, 20);
        for (i = 0; i < n; i++) {
                char path[512], why[512], got[600];
                char *input;
                cq_err_t err;

                snprintf(path, sizeof(path), "%s/%s/input",
                         cq_check_srcpath("tests/data/pgconn"), names[i]);
                input = cq_check_slurp(path, NULL);
                err = cq_pgconn_classify(input, why, sizeof(why));
                ck_assert(err == CQ_ERR_FATAL || err == CQ_ERR_RETRIABLE);
                snprintf(got, sizeof(got), "%s: %s\n",
                         err == CQ_ERR_FATAL ? "fatal" : "retriable", why);
                snprintf(path, sizeof(path), "%s/%s/expected",
                         cq_check_srcpath("tests/data/pgconn"), names[i]);
                failed += cq_check_golden(path, got, names[i]);
                free(input);
                free(names[i]);
        }
        ck_assert_int_eq(failed, 0);
}
END_TEST

/* Odd input: nothing, blank lines, a reason cut to the buffer. */
START_TEST(odd_messages)
{
        char why[16];

        ck_assert_int_eq(cq_pgconn_classify(NULL, why, sizeof(why)),
                         CQ_ERR_RETRIABLE);
        ck_assert_str_eq(why, "no reason given");
        ck_assert_int_eq(cq_pgconn_classify("\n\n", why, sizeof(why)),
                         CQ_ERR_RETRIABLE);
        ck_assert_str_eq(why, "no reason given");
        ck_assert_int_eq(
            cq_pgconn_classify("FATAL:  database \"a-very-long-name\" does "
                               "not exist\n",
                               why, sizeof(why)),
            CQ_ERR_FATAL);
        ck_assert_str_eq(why, "database \"a-ver");
        /* "does not exist" counts in the server's words only */
        ck_assert_int_eq(
            cq_pgconn_classify("could not open file: it does not exist\n", why,
                               sizeof(why)),
            CQ_ERR_RETRIABLE);
}
END_TEST

static void unset_pg_env(void)
{
        static const char *const vars[] = {
            "PGHOST", "PGHOSTADDR", "PGPORT",    "PGDATABASE",
            "PGUSER", "PGSERVICE",  "PGSSLMODE", "PGPASSWORD"};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(vars); i++)
                unsetenv(vars[i]);
}

START_TEST(describe_names_the_target_never_the_password)
{
        static const struct {
                const char *dsn;
                unsigned flags;
                const char *want;
        } cases[] = {
            {"host=db port=5432 dbname=coderq user=coderq password=hunter2",
             CQ_PGCONN_F_PASSWORD,
             "host=db port=5432 dbname=coderq user=coderq password=(set)"},
            {"host=db port=5432 dbname=coderq user=coderq password=hunter2", 0,
             "host=db port=5432 dbname=coderq user=coderq"},
            {"postgresql://coderq:hunter2@db.example.com:6543/jobs"
             "?sslmode=verify-full&application_name=x",
             CQ_PGCONN_F_PASSWORD,
             "host=db.example.com port=6543 dbname=jobs user=coderq "
             "sslmode=verify-full password=(set)"},
            {"postgresql://h1:5432,h2:5433/coderq?target_session_attrs="
             "read-write",
             CQ_PGCONN_F_PASSWORD, "host=h1,h2 port=5432,5433 dbname=coderq"},
            {"postgres://", CQ_PGCONN_F_PASSWORD, "libpq's defaults"},
            {"", 0, "libpq's defaults"},
            {"hostaddr=10.0.0.5 dbname='my db'", 0,
             "hostaddr=10.0.0.5 dbname=my db"},
            {"host=db password=hunter 2", CQ_PGCONN_F_PASSWORD,
             "not a valid connection string"},
            {"postgresql://u:hunter2@db/x?nope=1", CQ_PGCONN_F_PASSWORD,
             "not a valid connection string"},
        };
        char out[512];
        size_t i;

        unset_pg_env();
        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                cq_pgconn_describe(cases[i].dsn, cases[i].flags, out,
                                   sizeof(out));
                ck_assert_msg(strcmp(out, cases[i].want) == 0,
                              "%s: got \"%s\", want \"%s\"", cases[i].dsn, out,
                              cases[i].want);
                ck_assert_ptr_null(strstr(out, "hunter"));
        }
        cq_pgconn_describe("host=db", 0, out, 8);
        ck_assert_str_eq(out, "host=db");
        cq_pgconn_describe("host=db", 0, out, 5);
        ck_assert_str_eq(out, "host");
}
END_TEST

/* Unset, libpq connects with its PG* variables or its defaults: say
 * which; a DSN that leaves a key out names the variable that fills it. */
START_TEST(describe_says_which_pg_variables_apply)
{
        char out[512];

        unset_pg_env();
        cq_pgconn_describe(NULL, CQ_PGCONN_F_PASSWORD, out, sizeof(out));
        ck_assert_str_eq(out, "not set, nor is any PG* variable: libpq's "
                              "defaults apply");
        setenv("PGHOST", "db", 1);
        setenv("PGUSER", "bob", 1);
        setenv("PGPASSWORD", "hunter2", 1);
        cq_pgconn_describe(NULL, CQ_PGCONN_F_PASSWORD, out, sizeof(out));
        ck_assert_str_eq(out, "not set; libpq's PG* variables apply: "
                              "PGHOST=db PGUSER=bob PGPASSWORD=(set)");
        cq_pgconn_describe(NULL, 0, out, sizeof(out));
        ck_assert_str_eq(out, "not set; libpq's PG* variables apply: PGHOST=db "
                              "PGUSER=bob");
        cq_pgconn_describe("dbname=coderq user=alice", CQ_PGCONN_F_PASSWORD,
                           out, sizeof(out));
        ck_assert_str_eq(out, "dbname=coderq user=alice; libpq's PG* "
                              "variables: PGHOST=db PGPASSWORD=(set)");
        cq_pgconn_describe("host=h password=x", CQ_PGCONN_F_PASSWORD, out,
                           sizeof(out));
        ck_assert_str_eq(out, "host=h password=(set); libpq's PG* "
                              "variables: PGUSER=bob");
        unset_pg_env();
}
END_TEST

START_TEST(error_names_the_setting)
{
        char errstr[1024];

        unset_pg_env();
        ck_assert_int_eq(
            cq_pgconn_error("could not connect to PostgreSQL",
                            "host=db port=5432 dbname=x user=coderq "
                            "password=hunter2",
                            "connection to server at \"db\" (10.0.0.5), port "
                            "5432 failed: FATAL:  database \"x\" does not "
                            "exist\n",
                            errstr, sizeof(errstr)),
            CQ_ERR_FATAL);
        ck_assert_str_eq(errstr,
                         "could not connect to PostgreSQL (CODERQ_PG_DSN: "
                         "host=db port=5432 dbname=x user=coderq): database "
                         "\"x\" does not exist");
        ck_assert_int_eq(
            cq_pgconn_error("could not connect", NULL,
                            "connection to server on socket "
                            "\"/run/postgresql/.s.PGSQL.5432\" failed: No such "
                            "file or directory\n\tIs the server running "
                            "locally and accepting connections on that "
                            "socket?\n",
                            errstr, sizeof(errstr)),
            CQ_ERR_RETRIABLE);
        ck_assert_str_eq(errstr,
                         "could not connect (CODERQ_PG_DSN not set, nor is any "
                         "PG* variable: libpq's defaults apply): connection to "
                         "server on socket \"/run/postgresql/.s.PGSQL.5432\" "
                         "failed: No such file or directory");
        ck_assert_int_eq(cq_pgconn_error("could not connect", "host=db", NULL,
                                         errstr, sizeof(errstr)),
                         CQ_ERR_RETRIABLE);
        ck_assert_str_eq(errstr, "could not connect (CODERQ_PG_DSN: host=db): "
                                 "out of memory");
}
END_TEST

static Suite *pgconn_suite(void)
{
        Suite *s = suite_create("pgconn");
        TCase *tc = tcase_create("pure");

        tcase_add_test(tc, real_messages_are_classified);
        tcase_add_test(tc, odd_messages);
        tcase_add_test(tc, describe_names_the_target_never_the_password);
        tcase_add_test(tc, describe_says_which_pg_variables_apply);
        tcase_add_test(tc, error_names_the_setting);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(pgconn_suite)
