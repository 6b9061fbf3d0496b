/* SPDX-License-Identifier: MIT */
/* check_cli.c - the coderq executable as a user meets it, run as a
 * subprocess: help, version, usage and configuration errors, per-command
 * help, and doctor against services that are certainly not there. Needs
 * nothing running. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/cli/cli.h"
#include "coderq/cli/cmd_cli.h"
#include "coderq/common/log.h"
#include "coderq/common/config.h"
#include "support/proc.h"

static const char *coderq_path(void)
{
        static char path[4096];
        const char *dir = getenv("CQ_BINARY_DIR");

        snprintf(path, sizeof(path), "%s/coderq", dir ? dir : CQ_BINARY_DIR);
        return path;
}

/* Run coderq with up to four arguments (NULL-terminated) and \p env. */
static void run(cq_check_proc_t *proc,
                const char *const *env,
                const char *a1,
                const char *a2,
                const char *a3)
{
        const char *argv[] = {coderq_path(), a1, a2, a3, NULL};

        ck_assert_int_eq(cq_check_proc_run(argv, env, 60000, proc), 0);
        ck_assert_msg(!proc->timed_out, "coderq did not finish");
}

START_TEST(help_lists_every_variable_and_command)
{
        cq_check_proc_t proc;
        const cq_cfg_entry_t *entries;
        const cq_cmd_t *cmds;
        size_t n, i;

        run(&proc, NULL, "--help", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_OK);
        entries = cq_config_entries(&n);
        ck_assert_uint_gt(n, 3);
        for (i = 0; i < n; i++) {
                char flag[128];

                ck_assert_msg(strstr(proc.out, entries[i].env) != NULL,
                              "--help does not list %s", entries[i].env);
                snprintf(flag, sizeof(flag), "--%s", entries[i].flag);
                ck_assert_msg(strstr(proc.out, flag) != NULL,
                              "--help does not list %s", flag);
        }
        cmds = cq_cli_commands(&n);
        ck_assert_uint_ge(n, 2);
        for (i = 0; i < n; i++) {
                char line[128];

                snprintf(line, sizeof(line), "\n  %s ", cmds[i].name);
                ck_assert_msg(strstr(proc.out, line) != NULL,
                              "--help does not list command %s", cmds[i].name);
        }
        ck_assert_ptr_nonnull(strstr(proc.out, "\n  doctor "));
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(no_arguments_is_a_usage_error_with_help_on_stderr)
{
        cq_check_proc_t proc;

        run(&proc, NULL, NULL, NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_USAGE);
        ck_assert_str_eq(proc.out, "");
        ck_assert_ptr_nonnull(strstr(proc.err, "usage: coderq"));
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(version_prints_the_project_version)
{
        cq_check_proc_t proc;

        run(&proc, NULL, "--version", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_OK);
        ck_assert_str_eq(proc.out, "coderq " CQ_VERSION "\n");
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(unknown_command_exits_2)
{
        cq_check_proc_t proc;

        run(&proc, NULL, "frobnicate", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_USAGE);
        ck_assert_ptr_nonnull(
            strstr(proc.err, "unknown command \"frobnicate\""));
        ck_assert_uint_eq(cq_check_count_lines(proc.err), 1);
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(invalid_log_level_exits_3_naming_the_variable)
{
        static const char *const env[] = {"CODERQ_LOG_LEVEL=loud", NULL};
        cq_check_proc_t proc;

        run(&proc, env, "config", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_CONFIG);
        ck_assert_uint_eq(cq_check_count_lines(proc.err), 1);
        ck_assert_msg(strstr(proc.err, "CODERQ_LOG_LEVEL") != NULL,
                      "stderr does not name the variable: %s", proc.err);
        ck_assert_ptr_nonnull(strstr(proc.err, "loud"));
        ck_assert_str_eq(proc.out, "");
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(invalid_flag_value_exits_3_naming_the_flag)
{
        cq_check_proc_t proc;

        run(&proc, NULL, "--log-level=loud", "config", NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_CONFIG);
        ck_assert_uint_eq(cq_check_count_lines(proc.err), 1);
        ck_assert_ptr_nonnull(strstr(proc.err, "log-level"));
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(every_command_has_help)
{
        const cq_cmd_t *cmds;
        size_t n, i;

        cmds = cq_cli_commands(&n);
        for (i = 0; i < n; i++) {
                cq_check_proc_t proc;
                char want[128];

                run(&proc, NULL, cmds[i].name, "--help", NULL);
                ck_assert_msg(proc.status == CQ_EXIT_OK,
                              "coderq %s --help exited %d", cmds[i].name,
                              proc.status);
                snprintf(want, sizeof(want), "usage: coderq %s", cmds[i].name);
                ck_assert_msg(strncmp(proc.out, want, strlen(want)) == 0,
                              "coderq %s --help printed: %s", cmds[i].name,
                              proc.out);
                cq_check_proc_release(&proc);
        }
}
END_TEST

START_TEST(config_prints_every_variable_and_hides_secrets)
{
        static const char *const env[] = {
            "CODERQ_PG_DSN=postgresql://u:hunter2@db/x",
            "CODERQ_KAFKA_BROKERS=kafka.example:9092,u:hunter2@k2:9093",
            "CODERQ_LLM_BASE_URL=https://u:hunter2@gw.example/v1?api-"
            "version=1&key=hunter2",
            "PGHOST",
            "PGHOSTADDR",
            "PGPORT",
            "PGDATABASE",
            "PGUSER",
            "PGSERVICE",
            "PGSSLMODE",
            "PGPASSWORD",
            NULL};
        cq_check_proc_t proc;
        const cq_cfg_entry_t *entries;
        size_t n, i;

        run(&proc, env, "config", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_OK);
        entries = cq_config_entries(&n);
        for (i = 0; i < n; i++) {
                char line[128];

                snprintf(line, sizeof(line), "%s=", entries[i].env);
                ck_assert_msg(strstr(proc.out, line) != NULL, "no %s", line);
        }
        /* the DSN's target, the servers and the URL, their secrets not */
        ck_assert_ptr_nonnull(strstr(proc.out, "\nCODERQ_PG_DSN=host=db "
                                               "dbname=x user=u "
                                               "password=(set)\n"));
        ck_assert_ptr_nonnull(
            strstr(proc.out, "\nCODERQ_KAFKA_BROKERS=kafka.example:9092,"
                             "(redacted)@k2:9093\n"));
        ck_assert_ptr_nonnull(
            strstr(proc.out, "\nCODERQ_LLM_BASE_URL=https://(redacted)@"
                             "gw.example/v1?api-version=1&key=(redacted)\n"));
        ck_assert_ptr_null(strstr(proc.out, "hunter2"));
        cq_check_proc_release(&proc);
}
END_TEST

/* Port 1 on loopback refuses at once: both checks fail quickly, and the
 * exit status says "a service is unavailable". */
START_TEST(doctor_exits_4_when_services_are_unreachable)
{
        static const char *const env[] = {
            "CODERQ_PG_DSN=postgresql://nobody@127.0.0.1:1/nothing",
            "CODERQ_KAFKA_BROKERS=127.0.0.1:1",
            "CODERQ_LLM_BASE_URL=http://127.0.0.1:1/v1",
            "CODERQ_LLM_API_KEY=sk-doctor-SECRET", NULL};
        cq_check_proc_t proc;

        run(&proc, env, "doctor", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_UNAVAILABLE);
        ck_assert_msg(strstr(proc.out, "postgresql  FAIL  could not connect") !=
                          NULL,
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, "kafka       FAIL  could not ") != NULL,
                      "%s", proc.out);
        ck_assert_msg(strstr(proc.out, " 127.0.0.1:1") != NULL, "%s", proc.out);
        ck_assert_ptr_nonnull(strstr(proc.out, "\npython "));
        ck_assert_ptr_nonnull(strstr(proc.out, "\nsandbox "));
        ck_assert_ptr_nonnull(strstr(proc.out, "\nkserver "));
        /* the LLM API too, its key never shown */
        ck_assert_msg(strstr(proc.out, "\nllm         FAIL  openai: the API "
                                       "did not answer (GET "
                                       "http://127.0.0.1:1/v1/models: "),
                      "%s", proc.out);
        ck_assert_ptr_null(strstr(proc.out, "SECRET"));
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 6);
        cq_check_proc_release(&proc);
}
END_TEST

static char *slurp(const char *rel)
{
        char *text = NULL;
        size_t len = 0;
        FILE *fp = fopen(cq_check_srcpath(rel), "r");

        ck_assert_msg(fp != NULL, "cannot open %s", rel);
        ck_assert_int_gt(getdelim(&text, &len, '\0', fp), 0);
        fclose(fp);
        return text;
}

/* The docs document every variable with its flag, and every command. */
START_TEST(docs_document_every_setting_and_command)
{
        const cq_cfg_entry_t *entries;
        const cq_cmd_t *cmds;
        size_t n, i;
        char *conf = slurp("docs/CONFIGURATION.md"),
             *cli = slurp("docs/CLI.md");
        char needle[128];

        entries = cq_config_entries(&n);
        for (i = 0; i < n; i++) {
                snprintf(needle, sizeof(needle), "`%s`", entries[i].env);
                ck_assert_msg(strstr(conf, needle),
                              "docs/CONFIGURATION.md lacks %s", entries[i].env);
                snprintf(needle, sizeof(needle), "`--%s`", entries[i].flag);
                ck_assert_msg(strstr(conf, needle),
                              "docs/CONFIGURATION.md lacks --%s",
                              entries[i].flag);
        }
        cmds = cq_cli_commands(&n);
        for (i = 0; i < n; i++) {
                snprintf(needle, sizeof(needle), "`coderq %s", cmds[i].name);
                ck_assert_msg(strstr(cli, needle),
                              "docs/CLI.md does not describe coderq %s",
                              cmds[i].name);
        }
        free(conf);
        free(cli);
}
END_TEST

/* docs/CONFIGURATION.md is generated from the settings table: the file
 * in the tree is exactly what the built coderq prints for it. */
START_TEST(configuration_doc_is_what_the_table_generates)
{
        cq_check_proc_t proc;
        char *doc = slurp("docs/CONFIGURATION.md");

        run(&proc, NULL, "config", "--markdown", NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_OK);
        ck_assert_str_eq(proc.err, "");
        ck_assert_msg(strncmp(proc.out, "# Configuration\n", 16) == 0, "%s",
                      proc.out);
        ck_assert_msg(strcmp(proc.out, doc) == 0,
                      "docs/CONFIGURATION.md is not what common/config.c "
                      "generates: run scripts/gen-docs.sh");
        cq_check_proc_release(&proc);
        free(doc);
}
END_TEST

START_TEST(config_refuses_other_arguments)
{
        cq_check_proc_t proc;

        run(&proc, NULL, "config", "--html", NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_USAGE);
        ck_assert_str_eq(proc.out, "");
        ck_assert_ptr_nonnull(strstr(proc.err, "--markdown"));
        cq_check_proc_release(&proc);
}
END_TEST

/* The image's worker fails closed: sandbox on unless told otherwise, run
 * as root in the container so each kernel gets a uid of its own (kernels
 * never run as root), and compose grants what bubblewrap needs. */
START_TEST(docker_files_keep_the_sandbox_on)
{
        char *docker = slurp("Dockerfile"),
             *compose = slurp("docker-compose.yml");

        ck_assert_ptr_nonnull(strstr(docker, "\nENV CODERQ_SANDBOX=on "));
        ck_assert_ptr_null(strstr(docker, "\nUSER "));
        ck_assert_ptr_null(strstr(docker, "CODERQ_SANDBOX=auto"));
        ck_assert_ptr_null(strstr(docker, "CODERQ_SANDBOX=off"));
        ck_assert_ptr_nonnull(
            strstr(compose, "CODERQ_SANDBOX: ${CODERQ_SANDBOX:-on}\n"));
        ck_assert_ptr_nonnull(strstr(compose, "- seccomp=unconfined\n"));
        ck_assert_ptr_nonnull(strstr(compose, "- apparmor=unconfined\n"));
        ck_assert_ptr_nonnull(strstr(compose, "- systempaths=unconfined\n"));
        /* replicas lease kernel uids from one table */
        ck_assert_ptr_nonnull(
            strstr(compose, "\n      - coderq-uids:/run/coderq\n"));
        ck_assert_ptr_nonnull(strstr(compose, "\n  coderq-uids:\n"));
        free(docker);
        free(compose);
}
END_TEST

/* With CODERQ_PG_DSN unset, a command that needs PostgreSQL says so in
 * its one line, and which PG* variables libpq used instead: here a socket
 * folder that does not exist, so nothing can answer. */
START_TEST(commands_say_that_the_dsn_is_not_set)
{
        static const char *const env[] = {"CODERQ_PG_DSN",
                                          "PGHOST=/nonexistent/coderq",
                                          "PGPORT=1",
                                          "PGHOSTADDR",
                                          "PGDATABASE",
                                          "PGUSER",
                                          "PGSERVICE",
                                          "PGSSLMODE",
                                          "PGPASSWORD",
                                          "CODERQ_KAFKA_BROKERS=127.0.0.1:1",
                                          "CODERQ_KERNEL_SERVER=off",
                                          NULL};
        static const char want[] =
            "could not connect to PostgreSQL (CODERQ_PG_DSN not set; libpq's "
            "PG* variables apply: PGHOST=/nonexistent/coderq PGPORT=1): "
            "connection to server on socket \"/nonexistent/coderq/.s.PGSQL.1\" "
            "failed: No such file or directory\n";
        static const char *const cmds[][2] = {
            {"status", "job-1"}, {"results", NULL}, {"migrate", NULL}};
        cq_check_proc_t proc;
        const char *line;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cmds); i++) {
                run(&proc, env, cmds[i][0], cmds[i][1], NULL);
                ck_assert_int_eq(proc.status, CQ_EXIT_UNAVAILABLE);
                ck_assert_msg(strncmp(proc.err, "coderq: ", 8) == 0 &&
                                  strcmp(proc.err + 8, want) == 0,
                              "%s: %s", cmds[i][0], proc.err);
                cq_check_proc_release(&proc);
        }
        run(&proc, env, "doctor", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_UNAVAILABLE);
        line = strstr(proc.out, "postgresql  FAIL  could not connect "
                                "(CODERQ_PG_DSN not set; libpq's PG* "
                                "variables apply: PGHOST=/nonexistent/coderq "
                                "PGPORT=1): connection to server on socket ");
        ck_assert_msg(line == proc.out, "%s", proc.out);
        cq_check_proc_release(&proc);
}
END_TEST

/* submit mutes its Kafka producer's warnings: below error they show
 * only at debug, and a log that is off (the quiet default) stays off
 * rather than coming back on at error. */
START_TEST(submit_leaves_a_quiet_log_off)
{
        static const struct {
                cq_log_level_t level, want;
        } cases[] = {{CQ_LOG_OFF, CQ_LOG_OFF},
                     {CQ_LOG_DEBUG, CQ_LOG_DEBUG},
                     {CQ_LOG_INFO, CQ_LOG_ERROR},
                     {CQ_LOG_WARN, CQ_LOG_ERROR},
                     {CQ_LOG_ERROR, CQ_LOG_ERROR}};
        cq_log_level_t before = cq_log_get_level();
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                cq_log_set_level(cases[i].level);
                cq_cli_quiet_clients();
                ck_assert_msg(cq_log_get_level() == cases[i].want,
                              "from %s: %s", cq_log_level_name(cases[i].level),
                              cq_log_level_name(cq_log_get_level()));
        }
        cq_log_set_level(before);
}
END_TEST

/* A worker whose provider needs a key and has none refuses to start,
 * naming the variables that hold it, before it connects to anything. */
START_TEST(worker_without_an_llm_key_refuses_to_start)
{
        static const char *const openai[] = {
            "CODERQ_PG_DSN=host=127.0.0.1 port=1",
            "CODERQ_LLM_PROVIDER=openai",
            "CODERQ_LLM_BASE_URL",
            "CODERQ_LLM_API_KEY",
            "OPENAI_API_KEY",
            "CODERQ_LLM_ANTHROPIC_API_KEY",
            "ANTHROPIC_API_KEY",
            NULL};
        static const char *const anthropic[] = {
            "CODERQ_PG_DSN=host=127.0.0.1 port=1",
            "CODERQ_LLM_PROVIDER=anthropic",
            "CODERQ_LLM_BASE_URL=https://llm.example.com:8443?key=k",
            "CODERQ_LLM_API_KEY",
            "OPENAI_API_KEY",
            "CODERQ_LLM_ANTHROPIC_API_KEY",
            "ANTHROPIC_API_KEY",
            NULL};
        cq_check_proc_t proc;

        run(&proc, openai, "worker", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_CONFIG);
        ck_assert_str_eq(proc.err,
                         "coderq: worker: CODERQ_LLM_PROVIDER=openai needs an "
                         "API key: set CODERQ_LLM_API_KEY (or "
                         "OPENAI_API_KEY)\n");
        cq_check_proc_release(&proc);
        run(&proc, anthropic, "worker", NULL, NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_CONFIG);
        ck_assert_str_eq(proc.err,
                         "coderq: worker: CODERQ_LLM_PROVIDER=anthropic needs "
                         "an API key: set CODERQ_LLM_ANTHROPIC_API_KEY (or "
                         "ANTHROPIC_API_KEY, or CODERQ_LLM_API_KEY) "
                         "(CODERQ_LLM_BASE_URL "
                         "https://llm.example.com:8443?key=(redacted) is not "
                         "local)\n");
        cq_check_proc_release(&proc);
}
END_TEST

START_TEST(doctor_rejects_arguments)
{
        cq_check_proc_t proc;

        run(&proc, NULL, "doctor", "now", NULL);
        ck_assert_int_eq(proc.status, CQ_EXIT_USAGE);
        ck_assert_str_eq(proc.out, "");
        cq_check_proc_release(&proc);
}
END_TEST

static Suite *cli_suite(void)
{
        Suite *s = suite_create("cli");
        TCase *tc = tcase_create("cli");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, help_lists_every_variable_and_command);
        tcase_add_test(tc, no_arguments_is_a_usage_error_with_help_on_stderr);
        tcase_add_test(tc, version_prints_the_project_version);
        tcase_add_test(tc, submit_leaves_a_quiet_log_off);
        tcase_add_test(tc, unknown_command_exits_2);
        tcase_add_test(tc, invalid_log_level_exits_3_naming_the_variable);
        tcase_add_test(tc, invalid_flag_value_exits_3_naming_the_flag);
        tcase_add_test(tc, every_command_has_help);
        tcase_add_test(tc, config_prints_every_variable_and_hides_secrets);
        tcase_add_test(tc, doctor_exits_4_when_services_are_unreachable);
        tcase_add_test(tc, doctor_rejects_arguments);
        tcase_add_test(tc, commands_say_that_the_dsn_is_not_set);
        tcase_add_test(tc, worker_without_an_llm_key_refuses_to_start);
        tcase_add_test(tc, docker_files_keep_the_sandbox_on);
        tcase_add_test(tc, docs_document_every_setting_and_command);
        tcase_add_test(tc, configuration_doc_is_what_the_table_generates);
        tcase_add_test(tc, config_refuses_other_arguments);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cli_suite)
