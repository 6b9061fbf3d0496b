/* SPDX-License-Identifier: MIT */
/* e2b_files.c - files of the sandbox over envd: upload, download, the
 * recursive listing behind the snapshot, and the files a job created. */
#include "coderq/e2b/e2b.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "e2b_int.h"

#define PATH_BUF 512 /* a home dir path; job file names are shorter */

/* The envd URL of the file \p name in the home dir into \p url, its path
 * into \p path (PATH_BUF bytes). 0, or -1 when out of memory. */
static int
file_url(cq_e2b_t *e2b, const char *name, char *path, char *url, size_t size)
{
        char base[512];
        char *q;

        snprintf(path, PATH_BUF, HOME_DIR "/%s", name);
        q = cq_http_escape(e2b->http, path);
        if (!q || e2b_dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0) {
                free(q);
                return -1;
        }
        snprintf(url, size, "%s/files?path=%s", base, q);
        free(q);
        return 0;
}

cq_err_t
e2b_upload(cq_e2b_t *e2b, const char *name, const void *data, size_t len)
{
        struct call call = {0};
        char url[2048], path[PATH_BUF], what[PATH_BUF + 32];
        curl_mime *mime = NULL;
        curl_mimepart *part;
        cq_err_t err = CQ_ERR_RETRIABLE;

        snprintf(what, sizeof(what), "upload \"%s\" to E2B sandbox", name);
        mime = cq_http_mime_new(e2b->http);
        part = mime ? curl_mime_addpart(mime) : NULL;
        if (file_url(e2b, name, path, url, sizeof(url)) != 0 || !part ||
            curl_mime_name(part, "file") != CURLE_OK ||
            curl_mime_filename(part, path) != CURLE_OK ||
            curl_mime_type(part, "application/octet-stream") != CURLE_OK ||
            curl_mime_data(part, data ? data : "", len) != CURLE_OK) {
                e2b_set_error(e2b, "could not %s: out of memory", what);
                err = CQ_ERR_FATAL;
                goto out;
        }
        e2b_call_init(&call, what, PLANE_ENVD, "POST", url, e2b_ok_200);
        call.mime = mime;
        err = e2b_call_run(e2b, e2b->http, &call);
out:
        cq_buf_release(&call.reply);
        curl_mime_free(mime);
        return err;
}

cq_err_t e2b_put_file(cq_interp_t *interp,
                      const char *name,
                      const void *data,
                      size_t len)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        struct input_file *in = NULL, *grown;
        unsigned char *copy;
        size_t i;
        cq_err_t err;

        err = e2b_upload(e2b, name, data, len);
        if (err != CQ_OK)
                return err;
        /* keep a copy: a replacement sandbox gets it again, and
         * created_files() leaves inputs out */
        copy = malloc(len ? len : 1);
        if (!copy) {
                e2b_set_error(e2b, "could not keep \"%s\": out of memory",
                              name);
                return CQ_ERR_FATAL;
        }
        if (len)
                memcpy(copy, data, len);
        for (i = 0; i < e2b->ninputs; i++)
                if (strcmp(e2b->inputs[i].name, name) == 0)
                        in = &e2b->inputs[i];
        if (!in) {
                grown =
                    realloc(e2b->inputs, (e2b->ninputs + 1) * sizeof(*grown));
                if (!grown || !(grown[e2b->ninputs].name = strdup(name))) {
                        if (grown)
                                e2b->inputs = grown;
                        free(copy);
                        e2b_set_error(
                            e2b, "could not keep \"%s\": out of memory", name);
                        return CQ_ERR_FATAL;
                }
                e2b->inputs = grown;
                in = &e2b->inputs[e2b->ninputs++];
                in->data = NULL;
        }
        free(in->data);
        in->data = copy;
        in->len = len;
        return CQ_OK;
}

/* GET /files?path=HOME/name into \p buf (capped by its max). */
static cq_err_t
download(cq_e2b_t *e2b, const char *name, size_t max, cq_buf_t *out)
{
        static const long ok[] = {200, 0};
        struct call call = {0};
        char url[2048], path[PATH_BUF];
        cq_err_t err = CQ_ERR_FATAL;

        if (file_url(e2b, name, path, url, sizeof(url)) != 0) {
                e2b_set_error(e2b, "could not read \"%s\": out of memory",
                              name);
                goto out;
        }
        e2b_call_init(&call, "read a file from E2B sandbox", PLANE_ENVD, "GET",
                      url, ok);
        call.max_reply = max ? max : 1;
        err = e2b_call_run(e2b, e2b->http, &call);
        if (err == CQ_ERR_TOO_LARGE)
                e2b_set_error(e2b,
                              "could not read \"%s\": larger than %zu bytes",
                              name, max);
        else if (err == CQ_ERR_FATAL && call.status == 404)
                e2b_set_error(e2b, "could not read \"%s\": no such file", name);
        if (err == CQ_OK) {
                *out = call.reply;
                cq_buf_init(&call.reply, 0);
        }
out:
        cq_buf_release(&call.reply);
        return err;
}

cq_err_t
e2b_get_file(cq_interp_t *interp, const char *name, size_t max, cq_file_t *file)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        cq_buf_t buf;
        cq_err_t err;

        memset(file, 0, sizeof(*file));
        cq_buf_init(&buf, 0);
        err = download(e2b, name, max, &buf);
        if (err != CQ_OK)
                return err;
        file->name = strdup(name);
        file->mime = strdup(cq_mime_from_name(name));
        file->data = (unsigned char *)cq_buf_take(&buf, &file->len);
        cq_buf_release(&buf);
        if (!file->name || !file->mime || !file->data) {
                free(file->name);
                free(file->mime);
                free(file->data);
                memset(file, 0, sizeof(*file));
                e2b_set_error(e2b, "could not read \"%s\": out of memory",
                              name);
                return CQ_ERR_FATAL;
        }
        return CQ_OK;
}

/* Whether a listed path is ours to report: not hidden, not a cache. */
static bool rel_is_reported(const char *rel)
{
        const char *p = rel;

        if (!cq_relpath_is_safe(rel))
                return false;
        for (;;) {
                if (*p == '.' || strncmp(p, "__pycache__", 11) == 0)
                        return false;
                p = strchr(p, '/');
                if (!p)
                        return true;
                p++;
        }
}

/* ListDir HOME recursively into {relpath: "size|mtime"} (regular files
 * only). */
cq_err_t e2b_list_files(cq_e2b_t *e2b, json_t **listp)
{
        static const char body[] = "{\"path\":\"" HOME_DIR "\",\"depth\":32}";
        struct call call = {0};
        char base[512], url[1024];
        json_t *doc = NULL, *entries, *entry, *list = NULL;
        size_t i;
        cq_err_t err = CQ_ERR_RETRIABLE;

        if (e2b_dp_base(e2b, ENVD_PORT, base, sizeof(base)) != 0)
                return CQ_ERR_FATAL;
        snprintf(url, sizeof(url), "%s/filesystem.Filesystem/ListDir", base);
        e2b_call_init(&call, "list files of E2B sandbox", PLANE_ENVD, "POST",
                      url, e2b_ok_200);
        e2b_call_json(&call, body);
        err = e2b_call_run(e2b, e2b->http, &call);
        if (err != CQ_OK)
                goto out;
        err = CQ_ERR_FATAL;
        doc = json_loadb(call.reply.data ? call.reply.data : "", call.reply.len,
                         0, NULL);
        entries = json_object_get(doc, "entries");
        list = json_object();
        if (!list ||
            (!json_is_array(entries) && doc && json_object_size(doc) != 0)) {
                e2b_set_error(e2b, "could not list files of E2B sandbox: reply "
                                   "has no entries array");
                goto out;
        }
        if (json_array_size(entries) > MAX_ENTRIES) {
                e2b_set_error(e2b,
                              "could not list files of E2B sandbox: more "
                              "than %d entries",
                              MAX_ENTRIES);
                goto out;
        }
        json_array_foreach(entries, i, entry)
        {
                const char *type =
                    json_string_value(json_object_get(entry, "type"));
                const char *path =
                    json_string_value(json_object_get(entry, "path"));
                const char *size =
                    json_string_value(json_object_get(entry, "size"));
                const char *mtime =
                    json_string_value(json_object_get(entry, "modifiedTime"));
                char sig[128];

                /* envd gives a symlink its target's type: files only, as
                 * the local backend reports them, not links to them */
                if (!type || !path || strcmp(type, "FILE_TYPE_FILE") != 0 ||
                    json_object_get(entry, "symlinkTarget"))
                        continue;
                if (strncmp(path, HOME_DIR "/", sizeof(HOME_DIR)) != 0)
                        continue;
                snprintf(sig, sizeof(sig), "%s|%s", size ? size : "?",
                         mtime ? mtime : "?");
                if (json_object_set_new(list, path + sizeof(HOME_DIR),
                                        json_string(sig)))
                        goto out;
        }
        *listp = list;
        list = NULL;
        err = CQ_OK;
out:
        json_decref(list);
        json_decref(doc);
        cq_buf_release(&call.reply);
        return err;
}

static bool is_input(const cq_e2b_t *e2b, const char *rel)
{
        size_t i;

        for (i = 0; i < e2b->ninputs; i++)
                if (strcmp(e2b->inputs[i].name, rel) == 0)
                        return true;
        return false;
}

static int cmp_file(const void *a, const void *b)
{
        return strcmp(((const cq_file_t *)a)->name,
                      ((const cq_file_t *)b)->name);
}

cq_err_t
e2b_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        json_t *now = NULL, *sig;
        const char *rel;
        cq_files_t out = {NULL, 0};
        cq_err_t err;

        files->v = NULL;
        files->n = 0;
        err = e2b_list_files(e2b, &now);
        if (err != CQ_OK)
                goto out;
        out.v = calloc(json_object_size(now) + 1, sizeof(*out.v));
        if (!out.v) {
                err = CQ_ERR_FATAL;
                e2b_set_error(e2b,
                              "could not list created files: out of memory");
                goto out;
        }
        json_object_foreach(now, rel, sig)
        {
                json_t *old = json_object_get(e2b->snapshot, rel);
                cq_file_t *file = &out.v[out.n];

                if (!rel_is_reported(rel) || is_input(e2b, rel) ||
                    (old && json_equal(old, sig)))
                        continue;
                file->name = strdup(rel);
                file->mime = strdup(cq_mime_from_name(rel));
                /* listed only, its size is known all the same, as a local
                 * kernel's listing gives it ("?" gives 0) */
                file->len = (size_t)strtoull(json_string_value(sig), NULL, 10);
                out.n++;
                if (!file->name || !file->mime) {
                        err = CQ_ERR_FATAL;
                        e2b_set_error(e2b,
                                      "could not list created files: out of "
                                      "memory");
                        goto out;
                }
                if (with_data) {
                        cq_buf_t buf;

                        cq_buf_init(&buf, 0);
                        err = download(e2b, rel, e2b->max_file, &buf);
                        if (err == CQ_ERR_TOO_LARGE) {
                                /* listed without data: too large to fetch */
                                cq_log_warn("e2b: %s", e2b->errbuf);
                                continue;
                        }
                        if (err != CQ_OK)
                                goto out;
                        file->data =
                            (unsigned char *)cq_buf_take(&buf, &file->len);
                        cq_buf_release(&buf);
                }
        }
        qsort(out.v, out.n, sizeof(*out.v), cmp_file);
        *files = out;
        out.v = NULL;
        out.n = 0;
        err = CQ_OK;
out:
        cq_files_release(&out);
        json_decref(now);
        return err;
}
