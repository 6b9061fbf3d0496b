/* SPDX-License-Identifier: MIT */
/* cmd_migrate.c - `coderq migrate`: apply the pending schema migrations
 * and say which. Safe to run from several processes at once. */
#include "coderq/cli/cmd_cli.h"

#include <stdio.h>

#include "coderq/cli/cli.h"
#include "coderq/storage/migrate.h"

static void print_applied(void *opaque, const char *name)
{
        (void)opaque;
        printf("applied %s\n", name);
        fflush(stdout);
}

int cq_cmd_migrate(const cq_config_t *cfg, int argc, char **argv)
{
        char errstr[1024];
        const char *dir;
        int applied = 0;
        cq_err_t err;

        (void)argv;
        if (argc > 1) {
                cq_cli_error("migrate takes no arguments");
                return CQ_EXIT_USAGE;
        }
        dir = cfg->migrations_dir ? cfg->migrations_dir
                                  : cq_migrate_default_dir();
        err = cq_migrate_run(cfg->pg_dsn, dir, print_applied, NULL, &applied,
                             errstr, sizeof(errstr));
        if (err == CQ_ERR_RETRIABLE) {
                cq_cli_error("%s", errstr);
                return CQ_EXIT_UNAVAILABLE;
        }
        if (err != CQ_OK) {
                cq_cli_error("%s", errstr);
                return CQ_EXIT_FAILED;
        }
        if (applied == 0)
                printf("schema is up to date (%s)\n", dir);
        else
                printf("%d migration%s applied\n", applied,
                       applied == 1 ? "" : "s");
        return CQ_EXIT_OK;
}
