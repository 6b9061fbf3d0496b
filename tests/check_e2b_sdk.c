/* SPDX-License-Identifier: MIT */
/* check_e2b_sdk.c - the official E2B Python SDK (e2b-code-interpreter from
 * PyPI, pinned in scripts/requirements-tools.txt and installed by setup.sh
 * into the oracles' venv) is the second oracle of the E2B double, beside
 * the JS SDKs of check_e2b_conformance: tests/conformance/e2b/
 * sdk_oracle.py runs one check of E2B's behaviour per test case (envs of
 * one run, a gzip upload, a directory's entry, the user commands run as,
 * connect and the sandbox's life). Needs no services; skips only when the
 * venv lacks the SDK (CQ_REQUIRE "e2b-sdk" turns that into a failure). */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_support.h"
#include "support/fake_e2b.h"
#include "support/heval_oracle.h"
#include "support/proc.h"

static const char *g_python;
static cq_fake_e2b_t fake;

static void fake_up(void) { ck_assert_int_eq(cq_fake_e2b_start(&fake, 0), 0); }

static void fake_down(void) { cq_fake_e2b_stop(&fake); }

/* Run sdk_oracle.py \p name against the double; fail with its stderr
 * unless it passed. */
static void sdk_case(const char *name)
{
        char api[128], sbx[128], key[128];
        const char *argv[] = {
            g_python, cq_check_srcpath("tests/conformance/e2b/sdk_oracle.py"),
            name, NULL};
        /* the SDK reads these; E2B_DOMAIN and E2B_DEBUG of the caller's
         * environment would point it elsewhere */
        const char *env[] = {api, sbx, key, "E2B_DOMAIN", "E2B_DEBUG", NULL};
        cq_check_proc_t proc;

        snprintf(api, sizeof(api), "E2B_API_URL=%s", fake.api_url);
        snprintf(sbx, sizeof(sbx), "E2B_SANDBOX_URL=%s", fake.sandbox_url);
        snprintf(key, sizeof(key), "E2B_API_KEY=%s", fake.api_key);
        ck_assert_int_eq(cq_check_proc_run(argv, env, 150000, &proc), 0);
        if (proc.status != 0)
                /* whole, here: a message of check's is cut at 4 KiB */
                fprintf(stderr, "%s%s", proc.out, proc.err);
        ck_assert_msg(proc.status == 0,
                      "the E2B Python SDK saw the double differ from E2B in "
                      "%s (exit %d): %s",
                      name, proc.status,
                      proc.err_len > 1024 ? proc.err + proc.err_len - 1024
                                          : proc.err);
        cq_check_proc_release(&proc);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 0);
}

START_TEST(run_code_envs_hold_for_one_run)
{
        sdk_case("run_code_envs_hold_for_one_run");
}
END_TEST

START_TEST(files_write_gzip) { sdk_case("files_write_gzip"); }
END_TEST

START_TEST(files_list_directory_entry)
{
        sdk_case("files_list_directory_entry");
}
END_TEST

START_TEST(commands_run_as_user)
{
        json_t *stats = cq_fake_e2b_get(&fake, "/_fake/stats");
        bool users = json_is_true(json_object_get(stats, "users"));

        json_decref(stats);
        if (!users)
                CQ_CHECK_SKIP("bwrap", "bubblewrap cannot map uid 1000 here, "
                                       "so the double runs commands as its "
                                       "own user");
        sdk_case("commands_run_as_user");
}
END_TEST

START_TEST(connect_never_shortens) { sdk_case("connect_never_shortens"); }
END_TEST

int main(void)
{
        Suite *s = suite_create("e2b_sdk");
        TCase *tc = tcase_create("python_sdk");
        const char *argv[] = {NULL, "-c", "import e2b_code_interpreter", NULL};
        cq_check_proc_t proc;
        int status = -1;
        bool ok;

        g_python = argv[0] = cq_oracle_python(&ok);
        if (ok && cq_check_proc_run(argv, NULL, 60000, &proc) == 0) {
                status = proc.status;
                cq_check_proc_release(&proc);
        }
        if (status != 0)
                return cq_check_skip_suite(
                    "e2b_sdk", "e2b-sdk",
                    "%s cannot import e2b_code_interpreter (scripts/setup.sh "
                    "installs it from scripts/requirements-tools.txt)",
                    g_python);
        tcase_add_unchecked_fixture(tc, fake_up, fake_down);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, run_code_envs_hold_for_one_run);
        tcase_add_test(tc, files_write_gzip);
        tcase_add_test(tc, files_list_directory_entry);
        tcase_add_test(tc, commands_run_as_user);
        tcase_add_test(tc, connect_never_shortens);
        suite_add_tcase(s, tc);
        return cq_check_run(s);
}
