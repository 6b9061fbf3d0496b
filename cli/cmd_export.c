/* SPDX-License-Identifier: MIT */
/* cmd_export.c - `coderq export JOB --out DIR`: the job's notebook
 * (written exactly as the notebook builder writes it), its images under
 * every name they were stored under, made safe and unique, and answer.md
 * with the final answer. Everything comes from one read-only snapshot of
 * PostgreSQL. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/cli/clifmt.h"
#include "coderq/agent/notebook.h"

static int
join(char *out, size_t size, const char *dir, const char *a, const char *b)
{
        int n = b ? snprintf(out, size, "%s/%s/%s", dir, a, b)
                  : snprintf(out, size, "%s/%s", dir, a);

        if (n < 0 || (size_t)n >= size) {
                cq_cli_error("could not write into \"%s\": path too long", dir);
                return -1;
        }
        return 0;
}

static int export_notebook(const cq_export_t *exp, const char *dir)
{
        char path[PATH_MAX], errstr[512];
        cq_nb_t *nb = NULL;
        char *text = NULL;
        size_t len = 0;
        int rc = -1;

        if (join(path, sizeof(path), dir, "notebook.ipynb", NULL))
                return -1;
        nb = cq_nb_from_json(exp->notebook, errstr, sizeof(errstr));
        if (!nb) {
                cq_cli_error("could not export the notebook: %s", errstr);
                goto out;
        }
        text = cq_nb_dumps(nb, &len);
        if (!text) {
                cq_cli_error("could not export the notebook: out of memory");
                goto out;
        }
        if (cq_cli_write_file(path, text, len))
                goto out;
        printf("%s\n", path);
        rc = 0;
out:
        free(text);
        cq_nb_destroy(&nb);
        return rc;
}

static int export_images(const cq_export_t *exp, const char *dir)
{
        char path[PATH_MAX], name[160], variant[200];
        char **used = NULL;
        size_t i, j, nused = 0;
        int rc = -1, k;

        if (join(path, sizeof(path), dir, "images", NULL) ||
            cq_cli_make_dir(path))
                return -1;
        used = calloc(exp->images.n ? exp->images.n : 1, sizeof(*used));
        if (!used) {
                cq_cli_error("could not export images: out of memory");
                return -1;
        }
        for (i = 0; i < exp->images.n; i++) {
                const cq_image_t *img = &exp->images.v[i];
                bool clash = true;

                cq_fmt_image_name(img->name, img->mime, img->sha256, name,
                                  sizeof(name));
                snprintf(variant, sizeof(variant), "%s", name);
                for (k = 2; clash; k++) {
                        clash = false;
                        for (j = 0; j < nused && !clash; j++)
                                clash = strcmp(used[j], variant) == 0;
                        if (clash)
                                cq_fmt_name_variant(name, k, variant,
                                                    sizeof(variant));
                }
                used[nused] = strdup(variant);
                if (!used[nused]) {
                        cq_cli_error("could not export images: out of "
                                     "memory");
                        goto out;
                }
                nused++;
                if (join(path, sizeof(path), dir, "images", variant) ||
                    cq_cli_write_file(path, img->data, img->len))
                        goto out;
                printf("%s\n", path);
        }
        rc = 0;
out:
        for (j = 0; j < nused; j++)
                free(used[j]);
        free(used);
        return rc;
}

/* One line of plain text for the markdown status line. */
static cq_err_t inline_text(cq_buf_t *buf, const char *s)
{
        return cq_fmt_cell(buf, s, 0);
}

static int export_answer(const cq_export_t *exp, const char *dir)
{
        const json_t *st = exp->status;
        const char *job_id = json_string_value(json_object_get(st, "job_id"));
        const char *title = json_string_value(json_object_get(st, "title"));
        const char *status = json_string_value(json_object_get(st, "status"));
        const char *reason = json_string_value(json_object_get(st, "reason"));
        const json_t *passed = json_object_get(st, "tests_passed");
        const json_t *total = json_object_get(st, "tests_total");
        char path[PATH_MAX];
        cq_buf_t buf;
        cq_err_t err;
        int rc = -1;

        if (join(path, sizeof(path), dir, "answer.md", NULL))
                return -1;
        cq_buf_init(&buf, SIZE_MAX);
        err = cq_buf_append_str(&buf, "# ");
        if (err == CQ_OK)
                err = inline_text(&buf, title && *title ? title : job_id);
        if (err == CQ_OK)
                err = cq_buf_append_str(&buf, "\n\n**Job:** `");
        if (err == CQ_OK)
                err = inline_text(&buf, job_id);
        if (err == CQ_OK)
                err = cq_buf_printf(&buf, "` · **Status:** %s · **Tests:** ",
                                    status ? status : "unknown");
        if (err == CQ_OK) {
                if (json_is_integer(passed) && json_is_integer(total) &&
                    json_integer_value(total) > 0)
                        err = cq_buf_printf(&buf,
                                            "%" JSON_INTEGER_FORMAT
                                            "/%" JSON_INTEGER_FORMAT " passed",
                                            json_integer_value(passed),
                                            json_integer_value(total));
                else
                        err = cq_buf_append_str(&buf, "none");
        }
        if (err == CQ_OK)
                err = cq_buf_append_str(&buf, " · **Reason:** ");
        if (err == CQ_OK)
                err = inline_text(&buf, reason && *reason ? reason : "none");
        if (err == CQ_OK)
                err = cq_buf_append_str(&buf, "\n\n");
        if (err == CQ_OK)
                err = cq_buf_append_str(&buf, exp->answer && *exp->answer
                                                  ? exp->answer
                                                  : "_No final answer._");
        if (err == CQ_OK && buf.data[buf.len - 1] != '\n')
                err = cq_buf_append(&buf, "\n", 1);
        if (err != CQ_OK) {
                cq_cli_error("could not write \"%s\": out of memory", path);
                goto out;
        }
        if (cq_cli_write_file(path, buf.data, buf.len))
                goto out;
        printf("%s\n", path);
        rc = 0;
out:
        cq_buf_release(&buf);
        return rc;
}

int cq_cmd_export(const cq_config_t *cfg, int argc, char **argv)
{
        const char *job_id = NULL, *dir = NULL;
        cq_store_t *store = NULL;
        cq_export_t exp;
        bool found = false;
        cq_err_t err;
        int rc = CQ_EXIT_USAGE, i, m;

        cq_export_init(&exp);
        for (i = 1; i < argc; i++) {
                if ((m = cq_cli_opt(argc, argv, &i, "--out", &dir)) != 0) {
                        if (m < 0)
                                goto out;
                        continue;
                }
                if ((argv[i][0] == '-' && argv[i][1] != '\0') || job_id) {
                        cq_cli_error("unexpected argument \"%s\" for export; "
                                     "see coderq export --help",
                                     argv[i]);
                        goto out;
                }
                job_id = argv[i];
        }
        if (!job_id || !dir || !*dir) {
                cq_cli_error("usage: coderq export JOB --out DIR");
                goto out;
        }
        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK)
                goto out;
        err = cq_store_export(store, job_id, &exp, &found);
        if (err != CQ_OK) {
                cq_cli_error("%s", cq_store_errmsg(store));
                rc = cq_cli_store_exit(err);
                goto out;
        }
        if (!found) {
                cq_cli_error("no job \"%s\"", job_id);
                rc = CQ_EXIT_NOT_FOUND;
                goto out;
        }
        rc = CQ_EXIT_FAILED;
        if (cq_cli_make_dir(dir))
                goto out;
        if (exp.notebook) {
                if (export_notebook(&exp, dir))
                        goto out;
        } else {
                cq_cli_error("job \"%s\" has no notebook yet; writing answer "
                             "and images only",
                             job_id);
        }
        if (export_images(&exp, dir) || export_answer(&exp, dir))
                goto out;
        rc = CQ_EXIT_OK;
out:
        fflush(stdout);
        cq_export_release(&exp);
        cq_store_destroy(&store);
        return rc;
}
