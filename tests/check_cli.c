/* SPDX-License-Identifier: MIT */
/* check_cli.c - the coderq executable as a user meets it, run as a
 * subprocess: help, version, usage and configuration errors, per-command
 * help, and doctor against services that are certainly not there. Needs
 * nothing running. */
#include <ctype.h>
#include <stdbool.h>
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

/* The next --flag in \p text at or after *atp (a flag starts a word:
 * not "a--b"), copied into \p flag; false when there is none. */
static bool
next_flag(const char *text, const char **atp, char *flag, size_t size)
{
        const char *p = *atp;

        while ((p = strstr(p, "--")) != NULL) {
                size_t n = 2;
                bool starts = p == text || !(isalnum((unsigned char)p[-1]) ||
                                             p[-1] == '-' || p[-1] == '*');

                if (starts && islower((unsigned char)p[2])) {
                        while (islower((unsigned char)p[n]) ||
                               isdigit((unsigned char)p[n]) || p[n] == '-')
                                n++;
                        ck_assert_uint_lt(n, size);
                        memcpy(flag, p, n);
                        flag[n] = '\0';
                        *atp = p + n;
                        return true;
                }
                p += 2;
        }
        return false;
}

/* Whether \p text names the flag \p flag as a whole word. */
static bool has_flag(const char *text, const char *flag)
{
        const char *at = text;
        char found[64];

        while (next_flag(text, &at, found, sizeof(found)))
                if (strcmp(found, flag) == 0)
                        return true;
        return false;
}

/* The string literals of the C source \p src, joined by newlines, comments
 * and character constants left out; caller frees. */
static char *string_literals(const char *src)
{
        char *out = malloc(strlen(src) + 1), *o = out;
        const char *p = src;

        ck_assert_ptr_nonnull(out);
        while (*p) {
                if (p[0] == '/' && p[1] == '*') {
                        p = strstr(p + 2, "*/");
                        ck_assert_ptr_nonnull(p);
                        p += 2;
                } else if (*p == '\'' || *p == '"') {
                        char quote = *p++;

                        while (*p && *p != quote) {
                                if (*p == '\\' && p[1])
                                        p++;
                                if (quote == '"')
                                        *o++ = *p;
                                p++;
                        }
                        if (*p)
                                p++;
                        if (quote == '"')
                                *o++ = '\n';
                } else {
                        p++;
                }
        }
        *o = '\0';
        return out;
}

/* The section of docs/CLI.md on `coderq NAME`, up to the next heading;
 * caller frees. */
static char *doc_section(const char *doc, const char *name)
{
        char head[64];
        const char *start, *end, *h3, *h2;

        snprintf(head, sizeof(head), "\n### `coderq %s`\n", name);
        start = strstr(doc, head);
        ck_assert_msg(start != NULL, "docs/CLI.md has no section %s", head + 1);
        start += strlen(head);
        h3 = strstr(start, "\n### ");
        h2 = strstr(start, "\n## ");
        end = h3 && (!h2 || h3 < h2) ? h3 : h2;
        if (!end)
                end = start + strlen(start);
        return strndup(start, (size_t)(end - start));
}

/* Every flag a command's source takes is in its --help and in its section
 * of docs/CLI.md, and every flag of its --help is in that section. */
START_TEST(help_and_docs_name_every_flag_of_each_command)
{
        const cq_cmd_t *cmds;
        char *doc = slurp("docs/CLI.md");
        size_t n, i;

        cmds = cq_cli_commands(&n);
        for (i = 0; i < n; i++) {
                char path[64], flag[64];
                char *section = doc_section(doc, cmds[i].name);
                const char *at = cmds[i].usage;
                FILE *fp;

                while (next_flag(cmds[i].usage, &at, flag, sizeof(flag)))
                        ck_assert_msg(has_flag(section, flag),
                                      "docs/CLI.md on coderq %s lacks %s "
                                      "of its --help",
                                      cmds[i].name, flag);
                snprintf(path, sizeof(path), "cli/cmd_%s.c", cmds[i].name);
                fp = fopen(cq_check_srcpath(path), "r");
                if (fp) {
                        char *src = NULL, *lits;
                        size_t len = 0;

                        ck_assert_int_gt(getdelim(&src, &len, '\0', fp), 0);
                        fclose(fp);
                        lits = string_literals(src);
                        at = lits;
                        while (next_flag(lits, &at, flag, sizeof(flag))) {
                                if (strcmp(flag, "--help") == 0)
                                        continue;
                                ck_assert_msg(has_flag(cmds[i].usage, flag),
                                              "coderq %s --help lacks %s",
                                              cmds[i].name, flag);
                                ck_assert_msg(has_flag(section, flag),
                                              "docs/CLI.md on coderq %s "
                                              "lacks %s",
                                              cmds[i].name, flag);
                        }
                        free(lits);
                        free(src);
                }
                free(section);
        }
        free(doc);
}
END_TEST

/* The help of submit, status and results says what docs/CLI.md says:
 * the three forms of a jobs file and --problems; the queues' depth. */
START_TEST(help_says_what_the_docs_say)
{
        const cq_cmd_t *cmds;
        size_t n, i;
        bool seen[3] = {false, false, false};

        cmds = cq_cli_commands(&n);
        for (i = 0; i < n; i++) {
                const char *u = cmds[i].usage;

                if (strcmp(cmds[i].name, "submit") == 0) {
                        ck_assert_msg(strstr(u, "JSON Lines") &&
                                          strstr(u, "a JSON array of jobs") &&
                                          strstr(u, "one JSON object") &&
                                          strstr(u, "--problems FILE"),
                                      "%s", u);
                        seen[0] = true;
                } else if (strcmp(cmds[i].name, "status") == 0) {
                        ck_assert_msg(strstr(u, "[--queue-depth]") &&
                                          strstr(u, "depth of every queue") &&
                                          strstr(cmds[i].summary, "queues"),
                                      "%s", u);
                        seen[1] = true;
                } else if (strcmp(cmds[i].name, "results") == 0) {
                        ck_assert_msg(strstr(u, "depth of the queues"), "%s",
                                      u);
                        seen[2] = true;
                }
        }
        ck_assert(seen[0] && seen[1] && seen[2]);
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

/* --wait looks at its jobs at 250 ms, then 500 ms, then every second,
 * and every 100 ms once the jobs left would finish within a look. */
START_TEST(waits_look_often_near_the_end)
{
        long i = cq_cli_follow_interval(0, 100, 0);

        ck_assert_int_eq(i, 250);
        ck_assert_int_eq(i = cq_cli_follow_interval(i, 100, 3), 500);
        ck_assert_int_eq(i = cq_cli_follow_interval(i, 100, 3), 1000);
        ck_assert_int_eq(i = cq_cli_follow_interval(i, 100, 30), 1000);
        ck_assert_int_eq(i = cq_cli_follow_interval(i, 30, 30), 100);
        ck_assert_int_eq(i = cq_cli_follow_interval(i, 2, 1), 250);
        ck_assert_int_eq(i = cq_cli_follow_interval(i, 1, 1), 100);
        ck_assert_int_eq(cq_cli_follow_interval(1000, 5, 0), 1000);
}
END_TEST

static Suite *cli_suite(void)
{
        Suite *s = suite_create("cli");
        TCase *tc = tcase_create("cli");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, waits_look_often_near_the_end);
        tcase_add_test(tc, help_lists_every_variable_and_command);
        tcase_add_test(tc, no_arguments_is_a_usage_error_with_help_on_stderr);
        tcase_add_test(tc, version_prints_the_project_version);
        tcase_add_test(tc, submit_leaves_a_quiet_log_off);
        tcase_add_test(tc, help_and_docs_name_every_flag_of_each_command);
        tcase_add_test(tc, help_says_what_the_docs_say);
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
