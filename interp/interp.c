/* SPDX-License-Identifier: MIT */
/* interp.c - the backend-neutral half of the interpreter interface:
 * dispatch to the backend's ops, file lists and mime guessing shared by
 * the local and E2B backends (cell results live in common/cell.c, path
 * checks in util.c). */
#include "coderq/interp/interp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coderq/common/buf.h"
#include "coderq/common/pylit.h"
#include "interp_int.h"

void cq_files_release(cq_files_t *files)
{
        size_t i;

        for (i = 0; i < files->n; i++) {
                free(files->v[i].name);
                free(files->v[i].mime);
                free(files->v[i].data);
        }
        free(files->v);
        files->v = NULL;
        files->n = 0;
}

cq_err_t cq_interp_put_file(cq_interp_t *interp,
                            const char *name,
                            const void *data,
                            size_t len)
{
        if (!cq_relpath_is_safe(name))
                return CQ_ERR_FATAL;
        return interp->ops->put_file(interp, name, data, len);
}

cq_err_t cq_interp_execute(cq_interp_t *interp,
                           const char *code,
                           const cq_exec_opts_t *opts,
                           cq_cell_result_t *res)
{
        static const cq_exec_opts_t defaults = {0};

        return interp->ops->execute(interp, code, opts ? opts : &defaults, res);
}

int cq_interp_interrupt(cq_interp_t *interp)
{
        return interp->ops->interrupt(interp);
}

cq_err_t cq_interp_restart(cq_interp_t *interp)
{
        return interp->ops->restart(interp);
}

cq_err_t
cq_interp_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files)
{
        return interp->ops->created_files(interp, with_data, files);
}

cq_err_t cq_interp_get_file(cq_interp_t *interp,
                            const char *name,
                            size_t max,
                            cq_file_t *file)
{
        if (!cq_relpath_is_safe(name))
                return CQ_ERR_FATAL;
        return interp->ops->get_file(interp, name, max, file);
}

const char *cq_interp_errmsg(const cq_interp_t *interp)
{
        return interp->ops->errmsg(interp);
}

const char *cq_interp_backend(const cq_interp_t *interp)
{
        return interp->ops->name;
}

const json_t *cq_interp_env(cq_interp_t *interp)
{
        return interp->ops->env ? interp->ops->env(interp) : NULL;
}

/* The packages evaluators ask about; more would cost more at each start. */
const json_t *cq_interp_language_info(cq_interp_t *interp)
{
        return interp->ops->language_info ? interp->ops->language_info(interp)
                                          : NULL;
}

static const char *const env_packages[] = {"numpy", "pandas", "matplotlib",
                                           "scipy", NULL};

#define ENV_VERSION_MAX 32

/* The probe (env_probe.py, built in as cq_interp_env_probe_py) defines
 * _cq_env(marker); the cell calls it and deletes it, leaving no name in
 * the job's namespace. Packages imported already give their __version__;
 * the others are found by the name of their installed metadata (a
 * NAME-VERSION.dist-info or .egg-info directory) on sys.path:
 * importlib.metadata would cost ~30 ms. The working directory ('' or its
 * path on sys.path) is skipped: it holds the job's files and what its
 * code writes, not installs. */
char *cq_interp_env_probe(const char *marker)
{
        cq_buf_t buf;
        size_t i;

        for (i = 0; marker[i]; i++)
                if (!((marker[i] >= 'a' && marker[i] <= 'z') ||
                      (marker[i] >= 'A' && marker[i] <= 'Z') ||
                      (marker[i] >= '0' && marker[i] <= '9') ||
                      marker[i] == '-' || marker[i] == ' '))
                        return NULL;
        cq_buf_init(&buf, SIZE_MAX);
        if (cq_buf_append_str(&buf, cq_interp_env_probe_py) != CQ_OK ||
            cq_buf_append_str(&buf, "_cq_env(") != CQ_OK ||
            cq_pylit_append(&buf, marker, i) != CQ_OK ||
            cq_buf_append_str(&buf, ")\ndel _cq_env\n") != CQ_OK) {
                cq_buf_release(&buf);
                return NULL;
        }
        return cq_buf_take(&buf, NULL);
}

static bool version_is_safe(const json_t *v)
{
        const char *s = json_string_value(v);
        size_t i, n = json_string_length(v);

        if (!s || n == 0 || n > ENV_VERSION_MAX)
                return false;
        for (i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') ||
                      (s[i] >= 'A' && s[i] <= 'Z') ||
                      (s[i] >= '0' && s[i] <= '9') || s[i] == '.' ||
                      s[i] == '+' || s[i] == '!' || s[i] == '_' || s[i] == '-'))
                        return false;
        return true;
}

json_t *cq_interp_env_parse(const json_t *outputs, const char *marker)
{
        const json_t *out, *pk;
        json_t *doc = NULL, *env = NULL, *packages;
        const char *line = NULL, *text, *end;
        size_t i, k, mlen = strlen(marker);

        json_array_foreach(outputs, i, out)
        {
                const char *name =
                    json_string_value(json_object_get(out, "name"));
                const char *at;

                text = json_string_value(json_object_get(out, "text"));
                if (!text || !name || strcmp(name, "stdout") != 0)
                        continue;
                at = strstr(text, marker);
                if (at) {
                        line = at + mlen;
                        break;
                }
        }
        if (!line)
                return NULL;
        end = strchr(line, '\n');
        doc = json_loadb(line, end ? (size_t)(end - line) : strlen(line), 0,
                         NULL);
        if (!json_is_object(doc) ||
            !version_is_safe(json_object_get(doc, "python")))
                goto out;
        packages = json_object();
        env = json_pack("{s:O, s:o}", "python", json_object_get(doc, "python"),
                        "packages", packages);
        if (!env)
                goto out;
        pk = json_object_get(doc, "packages");
        for (k = 0; env_packages[k]; k++) {
                const json_t *v = json_object_get(pk, env_packages[k]);

                if (version_is_safe(v) &&
                    json_object_set(packages, env_packages[k],
                                    (json_t *)(uintptr_t)v)) {
                        json_decref(env);
                        env = NULL;
                        goto out;
                }
        }
out:
        json_decref(doc);
        return env;
}

void cq_interp_destroy(cq_interp_t **interpp)
{
        cq_interp_t *interp = *interpp;

        if (!interp)
                return;
        *interpp = NULL;
        interp->ops->destroy(interp);
}

const char *cq_mime_from_name(const char *name)
{
        static const struct {
                const char *ext, *mime;
        } types[] = {
            {".png", "image/png"},
            {".jpg", "image/jpeg"},
            {".jpeg", "image/jpeg"},
            {".svg", "image/svg+xml"},
            {".gif", "image/gif"},
            {".webp", "image/webp"},
            {".pdf", "application/pdf"},
            {".csv", "text/csv"},
            {".txt", "text/plain"},
            {".md", "text/markdown"},
            {".json", "application/json"},
            {".html", "text/html"},
            {".xlsx", "application/vnd.openxmlformats-officedocument."
                      "spreadsheetml.sheet"},
            {".py", "text/x-python"},
        };
        const char *dot = strrchr(name, '.');
        size_t i;

        if (!dot || strchr(dot, '/'))
                return "application/octet-stream";
        for (i = 0; i < CQ_ARRAY_SIZE(types); i++)
                if (strcasecmp(dot, types[i].ext) == 0)
                        return types[i].mime;
        return "application/octet-stream";
}
