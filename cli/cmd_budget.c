/* SPDX-License-Identifier: MIT */
/* cmd_budget.c - `coderq budget`: set, remove or show the budget of a run
 * in USD. Workers hold each LLM call's estimated cost against it
 * (cq_store_budget_reserve()), so a run never spends past it; a job whose
 * next call would cross it fails with reason code "budget". */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest budget accepted, USD. */
#define BUDGET_MAX 1e9

static int parse_usd(const char *text, double *usdp)
{
        char *end;
        double v;

        errno = 0;
        v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v) || v < 0 ||
            v > BUDGET_MAX) {
                cq_cli_error("invalid value \"%s\" for --usd: expected an "
                             "amount of USD from 0 to %.0f",
                             text, BUDGET_MAX);
                return -1;
        }
        *usdp = v;
        return 0;
}

static int print_budget(const json_t *doc, bool as_json)
{
        const json_t *b = json_object_get(doc, "budget_usd");
        double spent = json_number_value(json_object_get(doc, "spent_usd"));
        double held = json_number_value(json_object_get(doc, "held_usd"));
        char *text;

        if (as_json) {
                text = json_dumps(doc, JSON_INDENT(2));
                if (!text) {
                        cq_cli_error("could not format the budget: out of "
                                     "memory");
                        return CQ_EXIT_INTERNAL;
                }
                printf("%s\n", text);
                free(text);
                return CQ_EXIT_OK;
        }
        printf("run:          %s\n",
               json_string_value(json_object_get(doc, "run_id")));
        if (json_is_number(b))
                printf("budget_usd:   %.6f\n", json_number_value(b));
        else
                printf("budget_usd:   - (none)\n");
        printf("spent_usd:    %.6f\n", spent);
        printf("held_usd:     %.6f\n", held);
        if (json_is_number(b))
                printf("left_usd:     %.6f\n",
                       json_number_value(b) - spent - held);
        printf("cost_unknown: %" JSON_INTEGER_FORMAT "\n",
               json_integer_value(json_object_get(doc, "cost_unknown")));
        printf("jobs:         %" JSON_INTEGER_FORMAT "\n",
               json_integer_value(json_object_get(doc, "jobs")));
        return CQ_EXIT_OK;
}

int cq_cmd_budget(const cq_config_t *cfg, int argc, char **argv)
{
        const char *run = NULL, *usd_text = NULL;
        bool clear = false, as_json = false;
        cq_store_t *store = NULL;
        json_t *doc = NULL;
        double usd = -1;
        cq_err_t err;
        int rc = CQ_EXIT_USAGE, i, m;

        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--clear") == 0) {
                        clear = true;
                        continue;
                }
                if (strcmp(argv[i], "--json") == 0) {
                        as_json = true;
                        continue;
                }
                if ((m = cq_cli_opt(argc, argv, &i, "--run", &run)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--usd", &usd_text)) != 0) {
                        if (m < 0)
                                return CQ_EXIT_USAGE;
                        continue;
                }
                cq_cli_error("unexpected argument \"%s\" for budget; see "
                             "coderq budget --help",
                             argv[i]);
                return CQ_EXIT_USAGE;
        }
        if (!run) {
                cq_cli_error("budget needs --run RUN");
                return CQ_EXIT_USAGE;
        }
        if (clear && usd_text) {
                cq_cli_error("--usd and --clear cannot be combined");
                return CQ_EXIT_USAGE;
        }
        if (usd_text && parse_usd(usd_text, &usd))
                return CQ_EXIT_USAGE;
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                return rc;
        err = CQ_OK;
        if (usd_text || clear)
                err = cq_store_set_run_budget(store, run, clear ? -1 : usd);
        if (err == CQ_OK)
                err = cq_store_run_budget(store, run, &doc);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        if (!usd_text && !clear &&
            !json_is_number(json_object_get(doc, "budget_usd")) &&
            json_integer_value(json_object_get(doc, "jobs")) == 0) {
                cq_cli_error("no run \"%s\": it has no jobs and no budget",
                             run);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        rc = print_budget(doc, as_json);
out:
        json_decref(doc);
        cq_store_destroy(&store);
        return rc;
}
