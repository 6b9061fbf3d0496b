/* SPDX-License-Identifier: MIT */
/* interp.c - the backend-neutral half of the interpreter interface:
 * dispatch to the backend's ops, cell results, file lists and mime guessing
 * shared by the local and E2B backends (path checks live in util.c). */
#include "coderq/interp.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *cq_cell_status_name(cq_cell_status_t status)
{
        switch (status) {
        case CQ_CELL_OK:
                return "ok";
        case CQ_CELL_ERROR:
                return "error";
        case CQ_CELL_TIMEOUT:
                return "timeout";
        case CQ_CELL_DIED:
                return "died";
        case CQ_CELL_CANCELLED:
                return "cancelled";
        }
        return "unknown";
}

void cq_cell_result_init(cq_cell_result_t *res)
{
        memset(res, 0, sizeof(*res));
        res->status = CQ_CELL_OK;
        res->execution_count = -1;
}

void cq_cell_result_release(cq_cell_result_t *res)
{
        json_decref(res->outputs);
        json_decref(res->timing);
        cq_cell_result_init(res);
}

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
