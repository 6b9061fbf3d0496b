/* SPDX-License-Identifier: MIT */
/* cli.c - command dispatch, global help and version. Configuration is read
 * from the environment, then from flags anywhere on the command line, before
 * a command runs, so every command sees the same validated settings. */
#include "coderq/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "coderq/log.h"

static cq_cmd_fn_t cmd_config;
cq_cmd_fn_t cq_cmd_migrate;

/* One row per command; commands live in consumer/cmd_<name>.c. */
static const cq_cmd_t commands[] = {
    {"config", "print the effective configuration",
     "usage: coderq config\n"
     "Prints every setting with its current value (secrets as set/unset).\n",
     cmd_config},
    {"migrate", "apply pending PostgreSQL schema migrations",
     "usage: coderq migrate\n"
     "Applies the pending NNNN_name.sql files of CODERQ_MIGRATIONS_DIR in\n"
     "order, each in one transaction, and prints each one applied. Safe to\n"
     "run concurrently. Exit 4 when PostgreSQL is unreachable, 1 when a\n"
     "migration fails or an applied one was changed.\n",
     cq_cmd_migrate},
};

const cq_cmd_t *cq_cli_commands(size_t *np)
{
        *np = CQ_ARRAY_SIZE(commands);
        return commands;
}

void cq_cli_error(const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "coderq: %s\n", msg);
}

static void print_help(FILE *fp)
{
        size_t i;

        fprintf(fp, "usage: coderq [--FLAG=VALUE ...] <command> [args]\n"
                    "       coderq --help | --version\n"
                    "       coderq <command> --help\n\n"
                    "Commands:\n");
        for (i = 0; i < CQ_ARRAY_SIZE(commands); i++)
                fprintf(fp, "  %-10s %s\n", commands[i].name,
                        commands[i].summary);
        fprintf(fp, "\n");
        cq_config_print_help(fp);
        fprintf(fp, "\nExit codes: 0 ok, 1 failed, 2 usage, 3 configuration, "
                    "4 service unavailable, 5 not found, 70 internal "
                    "error.\n");
}

static int cmd_config(const cq_config_t *cfg, int argc, char **argv)
{
        const cq_cfg_entry_t *entries;
        size_t n, i;
        char value[512];

        (void)argv;
        if (argc > 1) {
                cq_cli_error("config takes no arguments");
                return CQ_EXIT_USAGE;
        }
        entries = cq_config_entries(&n);
        for (i = 0; i < n; i++) {
                cq_config_describe(cfg, &entries[i], value, sizeof(value));
                printf("%s=%s\n", entries[i].env, value);
        }
        return CQ_EXIT_OK;
}

static const cq_cmd_t *find_command(const char *name)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(commands); i++)
                if (strcmp(commands[i].name, name) == 0)
                        return &commands[i];
        return NULL;
}

static bool wants_help(int argc, char **argv)
{
        int i;

        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--") == 0)
                        return false;
                if (strcmp(argv[i], "--help") == 0 ||
                    strcmp(argv[i], "-h") == 0)
                        return true;
        }
        return false;
}

int cq_cli_main(int argc, char **argv)
{
        cq_config_t cfg;
        char errstr[512];
        const cq_cmd_t *cmd;
        int rc;

        if (argc >= 2 &&
            (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
                printf("coderq %s\n", CQ_VERSION);
                return CQ_EXIT_OK;
        }
        if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
            strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
                print_help(argc < 2 ? stderr : stdout);
                return argc < 2 ? CQ_EXIT_USAGE : CQ_EXIT_OK;
        }
        if (cq_config_init(&cfg) != 0) {
                cq_cli_error("out of memory");
                return CQ_EXIT_INTERNAL;
        }
        if (cq_config_load_env(&cfg, errstr, sizeof(errstr)) != 0 ||
            cq_config_parse_args(&cfg, &argc, argv, errstr, sizeof(errstr))) {
                cq_cli_error("%s", errstr);
                cq_config_release(&cfg);
                return CQ_EXIT_CONFIG;
        }
        cq_log_set_level(cfg.log_level);
        if (argc < 2) {
                cq_cli_error("no command given; see coderq --help");
                cq_config_release(&cfg);
                return CQ_EXIT_USAGE;
        }
        cmd = find_command(argv[1]);
        if (!cmd) {
                cq_cli_error("unknown command \"%s\"; see coderq --help",
                             argv[1]);
                cq_config_release(&cfg);
                return CQ_EXIT_USAGE;
        }
        if (wants_help(argc - 1, argv + 1)) {
                fputs(cmd->usage, stdout);
                cq_config_release(&cfg);
                return CQ_EXIT_OK;
        }
        rc = cmd->run(&cfg, argc - 1, argv + 1);
        cq_config_release(&cfg);
        return rc;
}
