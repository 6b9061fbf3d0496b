/* SPDX-License-Identifier: MIT */
/* cmd_report.c - `coderq report --run R --out DIR`: a static site of one
 * run that opens from file:// and loads nothing: DIR/index.html (the
 * run's figures, its models, a table of its jobs and a grid of its
 * samples) and one page per attempt of each job under DIR/jobs/. The
 * pages are rendered by html_index.c and html_job.c; the index's rows and
 * figures are read from one snapshot, each job from a snapshot of its
 * own, and the index is written last, so it links only to pages that
 * exist. */
#include "coderq/cli/cmd_cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/html.h"
#include "coderq/common/util.h"

static int write_page(const char *dir,
                      const char *sub,
                      const char *name,
                      const cq_buf_t *page)
{
        char path[PATH_MAX];
        int n = sub ? snprintf(path, sizeof(path), "%s/%s/%s", dir, sub, name)
                    : snprintf(path, sizeof(path), "%s/%s", dir, name);

        if (n < 0 || (size_t)n >= sizeof(path)) {
                cq_cli_error("could not write into \"%s\": path too long", dir);
                return -1;
        }
        return cq_cli_write_file(path, page->data, page->len);
}

/* The job ids of \p rows, borrowed from them. */
static const char **row_ids(const json_t *rows)
{
        size_t i, n = json_array_size(rows);
        const char **ids = calloc(n ? n : 1, sizeof(*ids));

        for (i = 0; ids && i < n; i++) {
                ids[i] = json_string_value(
                    json_object_get(json_array_get(rows, i), "job_id"));
                if (!ids[i])
                        ids[i] = "";
        }
        return ids;
}

/* Write the page of each attempt of \p rows; returns an exit code. */
static int write_jobs(cq_store_t *store,
                      const cq_html_meta_t *meta,
                      const char *dir,
                      const json_t *rows,
                      const char *const *ids,
                      const char (*names)[CQ_HTML_NAME_MAX])
{
        cq_html_attempts_t att;
        size_t n = json_array_size(rows);
        cq_report_job_t rj;
        cq_buf_t page;
        size_t i;
        int rc = CQ_EXIT_FAILED;

        cq_report_job_init(&rj);
        cq_buf_init(&page, SIZE_MAX);
        for (i = 0; i < n; i++) {
                bool found = false;
                cq_err_t err = cq_store_report_job(store, ids[i], &rj, &found);

                if (err != CQ_OK) {
                        cq_cli_error("%s", cq_store_errmsg(store));
                        rc = cq_cli_store_exit(err);
                        goto out;
                }
                /* a job deleted since the run was listed keeps its row
                 * in the index, so its page says so */
                if (!found)
                        rj.doc = json_pack("{s:{s:s, s:s}}", "status", "job_id",
                                           ids[i], "status", "deleted");
                cq_buf_reset(&page);
                cq_html_attempts(rows, names, i, &att);
                if (!rj.doc || cq_html_job(&page, meta, rj.doc, &rj.images,
                                           &att) != CQ_OK) {
                        rc = CQ_EXIT_INTERNAL;
                        cq_cli_error("could not render the page of job "
                                     "\"%s\": out of memory",
                                     ids[i]);
                        goto out;
                }
                cq_report_job_release(&rj);
                if (write_page(dir, "jobs", names[i], &page))
                        goto out;
        }
        rc = CQ_EXIT_OK;
out:
        cq_report_job_release(&rj);
        cq_buf_release(&page);
        return rc;
}

int cq_cmd_report(const cq_config_t *cfg, int argc, char **argv)
{
        const char *run = NULL, *dir = NULL;
        cq_store_t *store = NULL;
        json_t *rows = NULL, *figures = NULL;
        const char **ids = NULL;
        char(*names)[CQ_HTML_NAME_MAX] = NULL;
        char now[64], path[PATH_MAX];
        cq_html_meta_t meta;
        cq_buf_t page;
        size_t n = 0;
        cq_err_t err;
        int rc = CQ_EXIT_USAGE, i, m;

        cq_buf_init(&page, SIZE_MAX);
        for (i = 1; i < argc; i++) {
                if ((m = cq_cli_opt(argc, argv, &i, "--run", &run)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--out", &dir)) != 0) {
                        if (m < 0)
                                goto out;
                        continue;
                }
                cq_cli_error("unexpected argument \"%s\" for report; see "
                             "coderq report --help",
                             argv[i]);
                goto out;
        }
        if (!run || !*run || !dir || !*dir) {
                cq_cli_error("usage: coderq report --run RUN --out DIR");
                goto out;
        }
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                goto out;
        err = cq_store_report_run(store, run, &rows, &figures);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        n = json_array_size(rows);
        if (n == 0) {
                cq_cli_error("no jobs in run \"%s\"", run);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        ids = row_ids(rows);
        names = calloc(n, sizeof(*names));
        if (!ids || !names || cq_html_page_names(ids, n, names) != 0) {
                cq_cli_error("could not write the report: out of memory");
                goto out;
        }
        rc = CQ_EXIT_FAILED;
        if ((size_t)snprintf(path, sizeof(path), "%s/jobs", dir) >=
            sizeof(path)) {
                cq_cli_error("could not write into \"%s\": path too long", dir);
                goto out;
        }
        if (cq_cli_make_dir(dir) || cq_cli_make_dir(path))
                goto out;
        cq_iso8601_now(now, sizeof(now));
        meta.run_id = run;
        meta.generated_at = now;
        meta.version = CQ_VERSION;
        rc = write_jobs(store, &meta, dir, rows, ids,
                        (const char(*)[CQ_HTML_NAME_MAX])names);
        if (rc != CQ_EXIT_OK)
                goto out;
        if (cq_html_index(&page, &meta, figures, rows,
                          (const char(*)[CQ_HTML_NAME_MAX])names) != CQ_OK) {
                rc = CQ_EXIT_INTERNAL;
                cq_cli_error("could not render the index: out of memory");
                goto out;
        }
        rc = CQ_EXIT_FAILED;
        if (write_page(dir, NULL, "index.html", &page))
                goto out;
        printf("%s/index.html\n", dir);
        rc = CQ_EXIT_OK;
out:
        fflush(stdout);
        free(names);
        free(ids);
        cq_buf_release(&page);
        json_decref(rows);
        json_decref(figures);
        cq_store_destroy(&store);
        return rc;
}
