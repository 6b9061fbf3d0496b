/* SPDX-License-Identifier: MIT */
/* cli.h - the coderq command line: global options, the command table and
 * the exit codes every command uses. Each command lives in
 * cli/cmd_<name>.c. */
#ifndef CODERQ_CLI_H
#define CODERQ_CLI_H

#include "coderq/common/config.h"

/* Exit codes, documented in docs/CLI.md#exit-codes. */
enum cq_exit {
        CQ_EXIT_OK = 0,
        CQ_EXIT_FAILED = 1,      /* the job or operation failed */
        CQ_EXIT_USAGE = 2,       /* bad command line */
        CQ_EXIT_CONFIG = 3,      /* invalid configuration value */
        CQ_EXIT_UNAVAILABLE = 4, /* a service (PostgreSQL, Kafka) is down */
        CQ_EXIT_NOT_FOUND = 5,   /* no such job */
        CQ_EXIT_INTERNAL = 70,   /* a bug or out of memory */
};

/**
 * @brief A command: \p argv[0] is the command name; settings flags were
 *        already consumed into \p cfg.
 * @returns One of enum cq_exit.
 */
typedef int(cq_cmd_fn_t)(const cq_config_t *cfg, int argc, char **argv);

typedef struct cq_cmd {
        const char *name;
        const char *summary; /* one line for coderq --help */
        const char *usage;   /* for coderq <command> --help */
        cq_cmd_fn_t *run;
} cq_cmd_t;

/** @brief The command table, in --help order. */
const cq_cmd_t *cq_cli_commands(size_t *np);

/** @brief The whole command line; returns the process exit code. */
int cq_cli_main(int argc, char **argv);

/** @brief Print "coderq: <message>" as one line on stderr. */
void cq_cli_error(const char *fmt, ...) CQ_PRINTF(1, 2);

#endif
