/* SPDX-License-Identifier: MIT */
/* cmd_cancel.c - `coderq cancel JOB`: a queued job is cancelled at once;
 * a running one is flagged and its worker stops it at its next turn or
 * cell; a finished one is left alone. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"
#include "coderq/storage/queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cq_cmd_cancel(const cq_config_t *cfg, int argc, char **argv)
{
        int rc = CQ_EXIT_USAGE;
        cq_store_t *store = NULL;
        cq_cancel_outcome_t outcome = CQ_CANCEL_NOT_FOUND;
        json_t *row = NULL;
        const char *job_id;
        cq_err_t err;

        if (argc != 2 || (argv[1][0] == '-' && argv[1][1] != '\0')) {
                cq_cli_error(argc < 2 ? "cancel needs a job id: coderq cancel "
                                        "JOB"
                                      : "cancel takes one job id and no "
                                        "options");
                goto out;
        }
        job_id = argv[1];
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                goto out;
        err = cq_store_cancel(store, job_id, &outcome);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        switch (outcome) {
        case CQ_CANCEL_NOT_FOUND:
                cq_cli_error("no job \"%s\"", job_id);
                rc = CQ_EXIT_NOT_FOUND;
                break;
        case CQ_CANCEL_DONE:
                printf("%s: cancelled\n", job_id);
                rc = CQ_EXIT_OK;
                break;
        case CQ_CANCEL_REQUESTED:
                printf("%s: cancel requested; the worker will stop it at its "
                       "next turn or cell\n",
                       job_id);
                rc = CQ_EXIT_OK;
                break;
        case CQ_CANCEL_FINISHED:
                /* The status is only for the message; a failure to read it
                 * does not change what happened. */
                if (cq_store_job_status(store, job_id, &row) == CQ_OK &&
                    json_is_string(json_object_get(row, "status")))
                        printf(
                            "%s: already finished with status %s\n", job_id,
                            json_string_value(json_object_get(row, "status")));
                else
                        printf("%s: already finished\n", job_id);
                rc = CQ_EXIT_OK;
                break;
        }
out:
        json_decref(row);
        cq_store_destroy(&store);
        return rc;
}
