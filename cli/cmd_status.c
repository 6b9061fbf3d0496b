/* SPDX-License-Identifier: MIT */
/* cmd_status.c - `coderq status JOB`: one job's job_overview row and the
 * state of its completion event as aligned "key: value" lines, or as a
 * JSON object with --json; `coderq status --outbox`: the outbox counts
 * and its failed rows; `coderq status` without a job (or --queue-depth):
 * the depth of every queue (queued, waiting, running) as a table or a
 * JSON array. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/outbox.h"
#include "coderq/storage/queries.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/clifmt.h"
#include "coderq/cli/summary.h"

/* One "key: value" line; the value is escaped (cq_fmt_untrusted()) so
 * every key stays on one line and the terminal obeys nothing in it. */
static cq_err_t status_line(cq_buf_t *buf,
                            const char *key,
                            size_t key_width,
                            const json_t *value)
{
        cq_buf_t text;
        size_t i;
        cq_err_t err;

        if (cq_buf_printf(buf, "%s:", key) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        for (i = strlen(key); i < key_width + 1; i++)
                if (cq_buf_append(buf, " ", 1) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        if (json_is_null(value))
                return cq_buf_append_str(buf, "-\n");
        cq_buf_init(&text, SIZE_MAX);
        err = cq_fmt_scalar(&text, value);
        if (err == CQ_OK) /* data is NUL-terminated, or NULL when empty */
                err = cq_fmt_untrusted(buf, text.data, 0);
        if (err == CQ_OK)
                err = cq_buf_append(buf, "\n", 1);
        cq_buf_release(&text);
        return err;
}

/* The job's first completion event as flat keys (event, event_attempts,
 * event_error); every event under "events" in JSON. */
static cq_err_t add_events(json_t *row, json_t *events, bool as_json)
{
        json_t *first = json_array_get(events, 0);
        int rc = 0;

        if (as_json)
                return json_object_set(row, "events", events) ? CQ_ERR_FATAL
                                                              : CQ_OK;
        if (!first)
                return json_object_set_new(row, "event", json_null())
                           ? CQ_ERR_FATAL
                           : CQ_OK;
        rc |= json_object_set(row, "event", json_object_get(first, "state"));
        rc |= json_object_set(row, "event_attempts",
                              json_object_get(first, "attempts"));
        if (json_is_string(json_object_get(first, "error")))
                rc |= json_object_set(row, "event_error",
                                      json_object_get(first, "error"));
        return rc ? CQ_ERR_FATAL : CQ_OK;
}

/* `coderq status --outbox`. */
static int outbox_status(cq_store_t *store, bool as_json)
{
        json_t *sum = NULL, *rows, *row;
        char *text = NULL;
        cq_buf_t buf;
        cq_err_t err;
        size_t i;
        int rc = CQ_EXIT_INTERNAL;

        cq_buf_init(&buf, SIZE_MAX);
        err = cq_store_outbox_summary(store, 20, &sum);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                return cq_cli_store_exit(err);
        }
        if (as_json) {
                text = json_dumps(sum, JSON_INDENT(2));
                if (!text) {
                        cq_cli_error("could not format the outbox: out of "
                                     "memory");
                        goto out;
                }
                printf("%s\n", text);
                rc = CQ_EXIT_OK;
                goto out;
        }
        rows = json_object_get(sum, "failed_rows");
        if (status_line(&buf, "pending", 14, json_object_get(sum, "pending")) ||
            status_line(&buf, "claimed", 14, json_object_get(sum, "claimed")) ||
            status_line(&buf, "sent", 14, json_object_get(sum, "sent")) ||
            status_line(&buf, "failed", 14, json_object_get(sum, "failed")) ||
            status_line(&buf, "oldest_pending", 14,
                        json_object_get(sum, "oldest_pending")))
                goto oom;
        json_array_foreach(rows, i, row)
        {
                json_t *line = json_sprintf(
                    "job %s event %s (%s, %lld attempts) failed at %s: %s",
                    json_string_value(json_object_get(row, "job_id")),
                    json_string_value(json_object_get(row, "event_id")),
                    json_string_value(json_object_get(row, "topic")),
                    (long long)json_integer_value(
                        json_object_get(row, "attempts")),
                    json_string_value(json_object_get(row, "failed_at")),
                    json_is_string(json_object_get(row, "error"))
                        ? json_string_value(json_object_get(row, "error"))
                        : "-");
                cq_err_t lerr;

                if (!line)
                        goto oom;
                lerr = status_line(&buf, "failed_row", 14, line);
                json_decref(line);
                if (lerr != CQ_OK)
                        goto oom;
        }
        fwrite(buf.data, 1, buf.len, stdout);
        rc = CQ_EXIT_OK;
        goto out;
oom:
        cq_cli_error("could not format the outbox: out of memory");
out:
        free(text);
        cq_buf_release(&buf);
        json_decref(sum);
        return rc;
}

/* `coderq status` without a job, or with --queue-depth. */
static int queues_status(cq_store_t *store, bool as_json)
{
        json_t *queues = NULL;
        char *text = NULL;
        cq_buf_t buf;
        cq_err_t err;

        err = cq_store_queue_depth(store, NULL, &queues);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                return cq_cli_store_exit(err);
        }
        cq_buf_init(&buf, SIZE_MAX);
        if (as_json) {
                text = json_dumps(queues, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                err = text && cq_buf_append_str(&buf, text) == CQ_OK &&
                              cq_buf_append(&buf, "\n", 1) == CQ_OK
                          ? CQ_OK
                          : CQ_ERR_TOO_LARGE;
        } else {
                err = cq_summary_queues(queues, &buf);
        }
        if (err == CQ_OK)
                fwrite(buf.data, 1, buf.len, stdout);
        else
                cq_cli_error("could not format the queues: out of memory");
        free(text);
        cq_buf_release(&buf);
        json_decref(queues);
        return err == CQ_OK ? CQ_EXIT_OK : CQ_EXIT_INTERNAL;
}

int cq_cmd_status(const cq_config_t *cfg, int argc, char **argv)
{
        int rc = CQ_EXIT_INTERNAL, i;
        const char *job_id = NULL;
        bool as_json = false;
        cq_store_t *store = NULL;
        json_t *row = NULL, *events = NULL;
        bool outbox = false, depth = false;
        const char *key;
        json_t *value;
        size_t key_width = 0;
        char *text = NULL;
        cq_buf_t buf;
        cq_err_t err;

        cq_buf_init(&buf, SIZE_MAX);
        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--json") == 0) {
                        as_json = true;
                } else if (strcmp(argv[i], "--outbox") == 0) {
                        outbox = true;
                } else if (strcmp(argv[i], "--queue-depth") == 0) {
                        /* not --queues: that is CODERQ_QUEUES's flag */
                        depth = true;
                } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
                        cq_cli_error("unknown option \"%s\" for status; see "
                                     "coderq status --help",
                                     argv[i]);
                        rc = CQ_EXIT_USAGE;
                        goto out;
                } else if (!job_id) {
                        job_id = argv[i];
                } else {
                        cq_cli_error("status takes one job id");
                        rc = CQ_EXIT_USAGE;
                        goto out;
                }
        }
        if ((job_id != NULL) + outbox + depth > 1) {
                cq_cli_error("status takes one of a job id, --outbox and "
                             "--queue-depth");
                rc = CQ_EXIT_USAGE;
                goto out;
        }
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                goto out;
        if (outbox) {
                rc = outbox_status(store, as_json);
                goto out;
        }
        if (!job_id) {
                rc = queues_status(store, as_json);
                goto out;
        }
        err = cq_store_job_status(store, job_id, &row);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        if (!row) {
                cq_cli_error("no job \"%s\"", job_id);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        err = cq_store_outbox_job(store, job_id, &events);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        if (add_events(row, events, as_json) != CQ_OK) {
                cq_cli_error("could not format job \"%s\": out of memory",
                             job_id);
                goto out;
        }
        if (as_json) {
                text = json_dumps(row, JSON_INDENT(2));
                if (!text) {
                        cq_cli_error("could not format job \"%s\": out of "
                                     "memory",
                                     job_id);
                        goto out;
                }
                printf("%s\n", text);
                rc = CQ_EXIT_OK;
                goto out;
        }
        json_object_foreach(row, key, value) if (strlen(key) > key_width)
            key_width = strlen(key);
        json_object_foreach(row, key, value)
        {
                if (status_line(&buf, key, key_width, value) != CQ_OK) {
                        cq_cli_error("could not format job \"%s\": out of "
                                     "memory",
                                     job_id);
                        goto out;
                }
        }
        if (buf.len > 0)
                fwrite(buf.data, 1, buf.len, stdout);
        rc = CQ_EXIT_OK;
out:
        free(text);
        cq_buf_release(&buf);
        json_decref(row);
        json_decref(events);
        cq_store_destroy(&store);
        return rc;
}
