/* SPDX-License-Identifier: MIT */
/* cmd_retry.c - `coderq retry`: queue chosen jobs of a run again as new
 * jobs linked to their originals. The latest attempt of each original job
 * is chosen (by status and reason), and its message goes back through
 * Kafka, as `coderq submit` sends jobs, with job_id ORIGINAL~rN,
 * "retry_of": ORIGINAL and "run_attempt": N (cq_job_retry_id()). The ids
 * depend only on what PostgreSQL holds, so a retry sent twice before the
 * intake stored it is one job (the intake keeps the first). Old results
 * are left as they are. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/job.h"

typedef struct retry_opts {
        const char *run;
        cq_retry_filter_t filter;
        bool wait, dry_run;
        long timeout_s;
} retry_opts_t;

static int parse_args(int argc, char **argv, retry_opts_t *opts)
{
        const char *timeout = NULL;
        int i, m;

        memset(opts, 0, sizeof(*opts));
        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--failed") == 0) {
                        opts->filter.failed = true;
                        continue;
                }
                if (strcmp(argv[i], "--all") == 0) {
                        opts->filter.all = true;
                        continue;
                }
                if (strcmp(argv[i], "--wait") == 0) {
                        opts->wait = true;
                        continue;
                }
                if (strcmp(argv[i], "--dry-run") == 0) {
                        opts->dry_run = true;
                        continue;
                }
                if ((m = cq_cli_opt(argc, argv, &i, "--run", &opts->run)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--reason",
                                    &opts->filter.pattern)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--timeout", &timeout)) !=
                        0) {
                        if (m < 0)
                                return -1;
                        continue;
                }
                cq_cli_error("unexpected argument \"%s\" for retry; see "
                             "coderq retry --help",
                             argv[i]);
                return -1;
        }
        if (!opts->run) {
                cq_cli_error("retry needs --run RUN");
                return -1;
        }
        if (!opts->filter.failed && !opts->filter.pattern &&
            !opts->filter.all) {
                cq_cli_error("retry needs --failed, --reason PATTERN or --all "
                             "(to try every finished job again)");
                return -1;
        }
        if (opts->filter.all && (opts->filter.failed || opts->filter.pattern)) {
                cq_cli_error("--all cannot be combined with --failed or "
                             "--reason");
                return -1;
        }
        if (timeout && cq_cli_parse_long("--timeout", timeout, 0, 31536000,
                                         &opts->timeout_s))
                return -1;
        if (timeout && !opts->wait) {
                cq_cli_error("--timeout only applies with --wait");
                return -1;
        }
        if (opts->wait && opts->dry_run) {
                cq_cli_error("--wait cannot be combined with --dry-run");
                return -1;
        }
        return 0;
}

/* The retry message of \p row (a cq_store_retry_select() row): its spec
 * with the new id and the link to the original. Caller frees *valuep.
 * Returns 0, or -1 after printing an error line. */
static int
build_retry(const json_t *row, char *id, size_t id_size, char **valuep)
{
        const char *root =
            json_string_value(json_object_get(row, "root_job_id"));
        json_int_t n =
            json_integer_value(json_object_get(row, "run_attempt")) + 1;
        json_t *msg = json_deep_copy(json_object_get(row, "spec"));
        char errstr[512];
        cq_job_t job;
        int rc = -1;

        *valuep = NULL;
        cq_job_init(&job);
        if (!root || !json_is_object(msg)) {
                cq_cli_error("could not retry job \"%s\": its stored message "
                             "is not an object",
                             json_string_value(json_object_get(row, "job_id")));
                goto out;
        }
        if (cq_job_retry_id(root, (long)n, id, id_size) != 0) {
                cq_cli_error("could not retry job \"%s\": it has been tried "
                             "%" JSON_INTEGER_FORMAT " times, the most there "
                             "may be",
                             root, n - 1);
                goto out;
        }
        if (json_object_set_new(msg, "job_id", json_string(id)) ||
            json_object_set_new(msg, "retry_of", json_string(root)) ||
            json_object_set_new(msg, "run_attempt", json_integer(n))) {
                cq_cli_error("could not retry job \"%s\": out of memory", root);
                goto out;
        }
        *valuep = json_dumps(msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!*valuep) {
                cq_cli_error("could not retry job \"%s\": out of memory", root);
                goto out;
        }
        /* The intake would refuse what does not validate: say it here. */
        if (cq_job_parse(*valuep, strlen(*valuep), 0, &job, errstr,
                         sizeof(errstr)) != CQ_OK) {
                cq_cli_error("could not retry job \"%s\": %s", root, errstr);
                free(*valuep);
                *valuep = NULL;
                goto out;
        }
        rc = 0;
out:
        cq_job_release(&job);
        json_decref(msg);
        return rc;
}

int cq_cmd_retry(const cq_config_t *cfg, int argc, char **argv)
{
        retry_opts_t opts;
        cq_store_t *store = NULL;
        json_t *rows = NULL, *found = NULL, *row;
        char **ids = NULL, **values = NULL;
        size_t n = 0, i;
        bool bad_pattern = false;
        cq_err_t err;
        int rc = CQ_EXIT_USAGE;

        if (parse_args(argc, argv, &opts))
                return CQ_EXIT_USAGE;
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                return rc;
        err = cq_store_retry_select(store, opts.run, &opts.filter, &rows,
                                    &bad_pattern);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = bad_pattern ? CQ_EXIT_USAGE : cq_cli_store_exit(err);
                goto out;
        }
        n = json_array_size(rows);
        if (n == 0) {
                json_t *budget = NULL;

                /* No run at all is "not found"; a run with nothing to
                 * retry is fine. */
                err = cq_store_run_budget(store, opts.run, &budget);
                if (err != CQ_OK) {
                        cq_cli_error("%s", cq_store_errmsg(store));
                        rc = cq_cli_store_exit(err);
                        goto out;
                }
                rc = json_integer_value(json_object_get(budget, "jobs")) == 0
                         ? CQ_EXIT_NOT_FOUND
                         : CQ_EXIT_OK;
                json_decref(budget);
                if (rc == CQ_EXIT_NOT_FOUND)
                        cq_cli_error("no jobs in run \"%s\"", opts.run);
                else
                        cq_cli_error("nothing to retry in run \"%s\": no "
                                     "finished job matches",
                                     opts.run);
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        ids = calloc(n, sizeof(*ids));
        values = calloc(n, sizeof(*values));
        if (!ids || !values) {
                cq_cli_error("could not retry: out of memory");
                goto out;
        }
        json_array_foreach(rows, i, row)
        {
                char id[CQ_JOB_ID_MAX + 1];

                if (build_retry(row, id, sizeof(id), &values[i]) != 0) {
                        rc = CQ_EXIT_FAILED;
                        goto out;
                }
                ids[i] = strdup(id);
                if (!ids[i]) {
                        cq_cli_error("could not retry: out of memory");
                        goto out;
                }
        }
        /* A job with a retry's id that is not that retry (another run, or
         * a job named so by hand) would swallow it: refuse. */
        err = cq_store_jobs_exist(store, (const char *const *)ids, n, &found);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        if (json_array_size(found) > 0) {
                cq_cli_error("could not retry: job \"%s\" exists already and "
                             "is not the next attempt of its original in run "
                             "\"%s\"; nothing sent",
                             json_string_value(json_array_get(found, 0)),
                             opts.run);
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        cq_store_destroy(&store);
        if (opts.dry_run) {
                json_array_foreach(rows, i, row)
                    printf("%s retries %s (%s)\n", ids[i],
                           json_string_value(json_object_get(row, "job_id")),
                           json_string_value(json_object_get(row, "status")));
                rc = CQ_EXIT_OK;
                goto out;
        }
        rc = cq_cli_submit_jobs(cfg, (const char *const *)ids,
                                (const char *const *)values, n, opts.wait,
                                opts.timeout_s);
out:
        for (i = 0; i < n; i++) {
                if (ids)
                        free(ids[i]);
                if (values)
                        free(values[i]);
        }
        free(ids);
        free(values);
        json_decref(rows);
        json_decref(found);
        cq_store_destroy(&store);
        return rc;
}
