/* SPDX-License-Identifier: MIT */
/* notebook.c - builds nbformat 4.5 documents from executed cells, in the
 * stored shapes nbformat's own writer produces (rwbase.py split_lines, the
 * v4.5 schema), serialised byte for byte as nbformat.writes() does.
 *
 * Cell ids are derived from the cell's position, type and source (8 hex
 * digits of a SHA-256, re-hashed on a collision), so the same cells give the
 * same notebook: stable ids across rewrites and reproducible golden files.
 * Limits: floats inside application/json outputs are printed with 17
 * significant digits (jansson) where Python prints the shortest form. */
#include "coderq/agent/notebook.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/common/util.h"

#define NB_ID_LEN 8

struct cq_nb {
        json_t *doc;   /* the notebook, in stored shape; owned */
        json_t *cells; /* borrowed from doc */
        json_t *ids;   /* set of cell ids in use: {id: true}; owned */
};

static json_t *default_language_info(void)
{
        return json_pack(
            "{s:s, s:s, s:s, s:{s:s, s:i}, s:s, s:s, s:s}", "name", "python",
            "version", "3.11.2", "mimetype", "text/x-python", "codemirror_mode",
            "name", "ipython", "version", 3, "pygments_lexer", "ipython3",
            "nbconvert_exporter", "python", "file_extension", ".py");
}

static json_t *default_kernelspec(void)
{
        return json_pack("{s:s, s:s, s:s}", "name", "python3", "display_name",
                         "Python 3 (ipykernel)", "language", "python");
}

/* Length of the line break at p (0 when none), as Python's str.splitlines
 * sees them: \n, \r, \r\n, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029. */
static size_t line_break_len(const unsigned char *p, size_t avail)
{
        switch (p[0]) {
        case '\r':
                return avail > 1 && p[1] == '\n' ? 2 : 1;
        case '\n':
        case 0x0b:
        case 0x0c:
        case 0x1c:
        case 0x1d:
        case 0x1e:
                return 1;
        case 0xc2:
                return avail > 1 && p[1] == 0x85 ? 2 : 0;
        case 0xe2:
                return avail > 2 && p[1] == 0x80 &&
                               (p[2] == 0xa8 || p[2] == 0xa9)
                           ? 3
                           : 0;
        default:
                return 0;
        }
}

/* str.splitlines(True): a new array of lines keeping their endings; "" gives
 * []. \p s must be valid UTF-8 (it came out of a json string or was
 * repaired). */
static json_t *split_lines(const char *s, size_t len)
{
        const unsigned char *p = (const unsigned char *)s;
        json_t *lines = json_array();
        size_t start = 0, i = 0;

        if (!lines)
                return NULL;
        while (i < len) {
                size_t n = line_break_len(p + i, len - i);

                if (!n) {
                        i++;
                        continue;
                }
                i += n;
                if (json_array_append_new(lines,
                                          json_stringn(s + start, i - start)))
                        goto fail;
                start = i;
        }
        if (start < len &&
            json_array_append_new(lines, json_stringn(s + start, len - start)))
                goto fail;
        return lines;
fail:
        json_decref(lines);
        return NULL;
}

static json_t *split_value(const json_t *value)
{
        return split_lines(json_string_value(value), json_string_length(value));
}

/* A multiline string from caller text that may be invalid UTF-8. */
static json_t *split_text(const char *s)
{
        size_t len = s ? strlen(s) : 0;
        char *fixed;
        json_t *lines;

        if (cq_utf8_valid(s ? s : "", len))
                return split_lines(s ? s : "", len);
        fixed = cq_utf8_repair(s, len, &len);
        if (!fixed)
                return NULL;
        lines = split_lines(fixed, len);
        free(fixed);
        return lines;
}

static bool id_is_valid(const char *id)
{
        size_t i;

        for (i = 0; id[i]; i++) {
                char c = id[i];

                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '-' || c == '_'))
                        return false;
        }
        return i >= 1 && i <= 64;
}

/* A fresh id for a cell with this type and source, recorded in nb->ids. */
static json_t *new_cell_id(cq_nb_t *nb, const char *type, const json_t *source)
{
        char hex[65];
        cq_buf_t buf;
        unsigned attempt;
        size_t i;
        json_t *id = NULL;

        cq_buf_init(&buf, SIZE_MAX);
        for (attempt = 0; attempt < 1000 && !id; attempt++) {
                cq_buf_reset(&buf);
                if (cq_buf_printf(&buf, "%zu\n%u\n%s\n",
                                  json_array_size(nb->cells), attempt, type))
                        goto out;
                for (i = 0; i < json_array_size(source); i++) {
                        const json_t *line = json_array_get(source, i);

                        if (cq_buf_append(&buf, json_string_value(line),
                                          json_string_length(line)))
                                goto out;
                }
                cq_sha256_hex(buf.data, buf.len, hex);
                hex[NB_ID_LEN] = '\0';
                if (json_object_get(nb->ids, hex))
                        continue;
                if (json_object_set_new(nb->ids, hex, json_true()))
                        goto out;
                id = json_string(hex);
        }
out:
        cq_buf_release(&buf);
        return id;
}

cq_nb_t *cq_nb_new(const json_t *language_info)
{
        cq_nb_t *nb = calloc(1, sizeof(*nb));
        json_t *info;

        if (!nb)
                return NULL;
        if (json_is_object(language_info) &&
            json_is_string(json_object_get(language_info, "name")))
                info = json_deep_copy(language_info);
        else
                info = default_language_info();
        nb->doc = json_pack("{s:{s:o, s:o*}, s:i, s:i, s:[]}", "metadata",
                            "kernelspec", default_kernelspec(), "language_info",
                            info, "nbformat", 4, "nbformat_minor", 5, "cells");
        nb->ids = json_object();
        if (!nb->doc || !nb->ids || !info) {
                cq_nb_destroy(&nb);
                return NULL;
        }
        nb->cells = json_object_get(nb->doc, "cells");
        return nb;
}

void cq_nb_destroy(cq_nb_t **nbp)
{
        cq_nb_t *nb = *nbp;

        if (!nb)
                return;
        *nbp = NULL;
        json_decref(nb->doc);
        json_decref(nb->ids);
        free(nb);
}

static bool is_multiline_string(const json_t *value)
{
        size_t i;

        if (json_is_string(value))
                return true;
        if (!json_is_array(value))
                return false;
        for (i = 0; i < json_array_size(value); i++)
                if (!json_is_string(json_array_get(value, i)))
                        return false;
        return true;
}

/* Bring a multiline member to the stored line-list shape, in place. */
static int split_member(json_t *obj, const char *key)
{
        json_t *value = json_object_get(obj, key);

        if (!json_is_string(value))
                return 0;
        return json_object_set_new(obj, key, split_value(value));
}

static bool is_json_mime(const char *mime)
{
        size_t len = strlen(mime);

        return strcmp(mime, "application/json") == 0 ||
               (strncmp(mime, "application/", 12) == 0 && len > 17 &&
                strcmp(mime + len - 5, "+json") == 0);
}

static bool is_split_mime(const char *mime)
{
        return strncmp(mime, "text/", 5) == 0 ||
               strcmp(mime, "image/svg+xml") == 0 ||
               strcmp(mime, "application/javascript") == 0;
}

static int check_cell(
    const json_t *cell, size_t i, int minor, char *errstr, size_t errstr_size)
{
        const char *type =
            json_string_value(json_object_get(cell, "cell_type"));
        const json_t *id = json_object_get(cell, "id");
        const json_t *count;

        if (!json_is_object(cell) || !type ||
            (strcmp(type, "code") != 0 && strcmp(type, "markdown") != 0 &&
             strcmp(type, "raw") != 0)) {
                cq_errstr_set(errstr, errstr_size,
                              "cell %zu is not a code, markdown or raw cell",
                              i);
                return -1;
        }
        if (!is_multiline_string(json_object_get(cell, "source")) ||
            !json_is_object(json_object_get(cell, "metadata"))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "cell %zu needs a text \"source\" and a \"metadata\" "
                    "object",
                    i);
                return -1;
        }
        if (minor >= 5 &&
            (!json_is_string(id) || !id_is_valid(json_string_value(id)))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "cell %zu has no valid \"id\" (required in nbformat "
                    "4.5)",
                    i);
                return -1;
        }
        if (strcmp(type, "code") != 0)
                return 0;
        count = json_object_get(cell, "execution_count");
        if (!json_is_array(json_object_get(cell, "outputs")) ||
            !(json_is_null(count) ||
              (json_is_integer(count) && json_integer_value(count) >= 0))) {
                cq_errstr_set(errstr, errstr_size,
                              "code cell %zu needs an \"outputs\" array and an "
                              "\"execution_count\" that is null or >= 0",
                              i);
                return -1;
        }
        return 0;
}

/* Split the multiline strings of a loaded cell (nbformat readers accept
 * both shapes; we keep the one nbformat writes). */
static int normalise_cell(json_t *cell)
{
        json_t *outputs = json_object_get(cell, "outputs");
        size_t i;

        if (split_member(cell, "source"))
                return -1;
        for (i = 0; i < json_array_size(outputs); i++) {
                json_t *output = json_array_get(outputs, i);
                json_t *data = json_object_get(output, "data");
                const char *mime;
                json_t *value;

                if (json_is_object(output) &&
                    json_is_string(json_object_get(output, "text")) &&
                    split_member(output, "text"))
                        return -1;
                if (!json_is_object(data))
                        continue;
                json_object_foreach(data, mime, value)
                {
                        if (json_is_string(value) && is_split_mime(mime) &&
                            json_object_set_new(data, mime, split_value(value)))
                                return -1;
                }
        }
        return 0;
}

cq_nb_t *cq_nb_from_json(const json_t *doc, char *errstr, size_t errstr_size)
{
        cq_nb_t *nb = NULL;
        json_t *metadata, *cells;
        const json_t *major, *minor;
        json_int_t minor_v;
        size_t i;

        if (!json_is_object(doc)) {
                cq_errstr_set(errstr, errstr_size,
                              "notebook must be a JSON object");
                return NULL;
        }
        major = json_object_get(doc, "nbformat");
        minor = json_object_get(doc, "nbformat_minor");
        if (!json_is_integer(major) || json_integer_value(major) != 4 ||
            !json_is_integer(minor) || json_integer_value(minor) < 0 ||
            json_integer_value(minor) > 5) {
                cq_errstr_set(errstr, errstr_size,
                              "not an nbformat 4 notebook (nbformat 4, "
                              "nbformat_minor 0 to 5 expected)");
                return NULL;
        }
        minor_v = json_integer_value(minor);
        if (!json_is_object(json_object_get(doc, "metadata")) ||
            !json_is_array(json_object_get(doc, "cells"))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "notebook needs a \"metadata\" object and a \"cells\" "
                    "array");
                return NULL;
        }
        cells = json_object_get(doc, "cells");
        for (i = 0; i < json_array_size(cells); i++)
                if (check_cell(json_array_get(cells, i), i, (int)minor_v,
                               errstr, errstr_size))
                        return NULL;

        nb = calloc(1, sizeof(*nb));
        if (!nb)
                goto oom;
        nb->doc = json_deep_copy(doc);
        nb->ids = json_object();
        if (!nb->doc || !nb->ids)
                goto oom;
        nb->cells = json_object_get(nb->doc, "cells");
        metadata = json_object_get(nb->doc, "metadata");
        if (!json_object_get(metadata, "kernelspec") &&
            json_object_set_new(metadata, "kernelspec", default_kernelspec()))
                goto oom;
        if (!json_object_get(metadata, "language_info") &&
            json_object_set_new(metadata, "language_info",
                                default_language_info()))
                goto oom;
        for (i = 0; i < json_array_size(nb->cells); i++) {
                json_t *cell = json_array_get(nb->cells, i);
                const char *id = json_string_value(json_object_get(cell, "id"));

                if (normalise_cell(cell))
                        goto oom;
                if (minor_v < 5)
                        continue;
                if (json_object_get(nb->ids, id)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "cell %zu repeats the id \"%s\"", i, id);
                        cq_nb_destroy(&nb);
                        return NULL;
                }
                if (json_object_set_new(nb->ids, id, json_true()))
                        goto oom;
        }
        if (minor_v < 5) {
                /* 4.0-4.4 have no cell ids: upgrade as nbformat does. */
                for (i = 0; i < json_array_size(nb->cells); i++) {
                        json_t *cell = json_array_get(nb->cells, i);
                        json_t *id =
                            new_cell_id(nb,
                                        json_string_value(
                                            json_object_get(cell, "cell_type")),
                                        json_object_get(cell, "source"));

                        if (json_object_set_new(cell, "id", id))
                                goto oom;
                }
                if (json_object_set_new(nb->doc, "nbformat_minor",
                                        json_integer(5)))
                        goto oom;
        }
        return nb;
oom:
        cq_errstr_set(errstr, errstr_size,
                      "could not load notebook: out of memory");
        cq_nb_destroy(&nb);
        return NULL;
}

/* Append a cell built so far (type, source) with its id; takes cell. */
static int append_cell(cq_nb_t *nb, json_t *cell)
{
        json_t *id;

        if (!cell)
                return -1;
        id = new_cell_id(nb,
                         json_string_value(json_object_get(cell, "cell_type")),
                         json_object_get(cell, "source"));
        if (json_object_set_new(cell, "id", id) ||
            json_array_append_new(nb->cells, cell))
                return -1;
        return 0;
}

int cq_nb_add_markdown(cq_nb_t *nb, const char *source)
{
        json_t *lines = split_text(source);

        if (!lines)
                return -1;
        return append_cell(nb,
                           json_pack("{s:s, s:{}, s:o}", "cell_type",
                                     "markdown", "metadata", "source", lines));
}

int cq_nb_add_heading(cq_nb_t *nb, const char *title)
{
        cq_buf_t buf;
        size_t i, start;
        int rc = -1;

        cq_buf_init(&buf, SIZE_MAX);
        if (cq_buf_append_str(&buf, "## "))
                goto out;
        start = buf.len;
        if (cq_buf_append_str(&buf, title ? title : ""))
                goto out;
        /* A heading is one line: fold line breaks and tabs into spaces. */
        for (i = start; i < buf.len; i++)
                if (buf.data[i] == '\n' || buf.data[i] == '\r' ||
                    buf.data[i] == '\t')
                        buf.data[i] = ' ';
        rc = cq_nb_add_markdown(nb, buf.data);
out:
        cq_buf_release(&buf);
        return rc;
}

/* Convert a mime bundle to stored shape: split text-like strings, keep
 * base64 and JSON values as they are, drop values no schema accepts. */
static json_t *convert_bundle(const json_t *data)
{
        json_t *out = json_object();
        const char *mime;
        json_t *value;

        if (!out)
                return NULL;
        if (!json_is_object(data))
                return out;
        json_object_foreach((json_t *)(uintptr_t)data, mime, value)
        {
                json_t *stored;

                if (is_json_mime(mime))
                        stored = json_deep_copy(value);
                else if (json_is_string(value) && is_split_mime(mime))
                        stored = split_value(value);
                else if (is_multiline_string(value))
                        stored = json_deep_copy(value);
                else
                        continue;
                if (json_object_set_new(out, mime, stored)) {
                        json_decref(out);
                        return NULL;
                }
        }
        return out;
}

static json_t *output_metadata(const json_t *output)
{
        const json_t *metadata = json_object_get(output, "metadata");

        return json_is_object(metadata) ? json_deep_copy(metadata)
                                        : json_object();
}

static json_t *string_or_empty(const json_t *value)
{
        /* a copy with its length: an evalue may hold NULs */
        return json_is_string(value) ? json_stringn(json_string_value(value),
                                                    json_string_length(value))
                                     : json_string("");
}

/* One non-stream output in stored shape; NULL with *skipp set for output
 * types a notebook does not store. */
static json_t *
convert_output(const json_t *output, const cq_cell_result_t *res, bool *skipp)
{
        const char *type =
            json_string_value(json_object_get(output, "output_type"));
        json_t *count;

        *skipp = false;
        if (!type) {
                *skipp = true;
                return NULL;
        }
        if (strcmp(type, "display_data") == 0)
                return json_pack(
                    "{s:s, s:o, s:o}", "output_type", "display_data", "data",
                    convert_bundle(json_object_get(output, "data")), "metadata",
                    output_metadata(output));
        if (strcmp(type, "execute_result") == 0) {
                count = json_object_get(output, "execution_count");
                if (json_is_integer(count) && json_integer_value(count) >= 0)
                        count = json_integer(json_integer_value(count));
                else if (res->execution_count >= 0)
                        count = json_integer(res->execution_count);
                else
                        count = json_null();
                return json_pack(
                    "{s:s, s:o, s:o, s:o}", "output_type", "execute_result",
                    "data", convert_bundle(json_object_get(output, "data")),
                    "metadata", output_metadata(output), "execution_count",
                    count);
        }
        if (strcmp(type, "error") == 0) {
                const json_t *tb = json_object_get(output, "traceback");
                json_t *lines = json_array();
                size_t i;

                for (i = 0; lines && i < json_array_size(tb); i++) {
                        const json_t *line = json_array_get(tb, i);

                        if (json_is_string(line) &&
                            json_array_append_new(lines,
                                                  json_deep_copy(line))) {
                                json_decref(lines);
                                lines = NULL;
                        }
                }
                return json_pack(
                    "{s:s, s:o, s:o, s:o}", "output_type", "error", "ename",
                    string_or_empty(json_object_get(output, "ename")), "evalue",
                    string_or_empty(json_object_get(output, "evalue")),
                    "traceback", lines);
        }
        *skipp = true;
        return NULL;
}

static int flush_stream(json_t *outputs, char **namep, cq_buf_t *text)
{
        json_t *lines;
        int rc = -1;

        if (!*namep)
                return 0;
        lines = split_lines(text->data ? text->data : "", text->len);
        if (lines &&
            json_array_append_new(
                outputs, json_pack("{s:s, s:s, s:o}", "output_type", "stream",
                                   "name", *namep, "text", lines)) == 0)
                rc = 0;
        free(*namep);
        *namep = NULL;
        cq_buf_reset(text);
        return rc;
}

static json_t *convert_outputs(const cq_cell_result_t *res)
{
        json_t *outputs = json_array();
        char *stream_name = NULL;
        cq_buf_t text;
        size_t i;

        cq_buf_init(&text, SIZE_MAX);
        if (!outputs)
                goto fail;
        for (i = 0; i < json_array_size(res->outputs); i++) {
                const json_t *output = json_array_get(res->outputs, i);
                const char *type =
                    json_string_value(json_object_get(output, "output_type"));
                const json_t *stext = json_object_get(output, "text");
                json_t *stored;
                bool skip;

                if (type && strcmp(type, "stream") == 0) {
                        const char *name =
                            json_string_value(json_object_get(output, "name"));

                        if (!name)
                                continue;
                        if (stream_name && strcmp(stream_name, name) != 0 &&
                            flush_stream(outputs, &stream_name, &text))
                                goto fail;
                        if (!stream_name && !(stream_name = strdup(name)))
                                goto fail;
                        if (json_is_string(stext) &&
                            cq_buf_append(&text, json_string_value(stext),
                                          json_string_length(stext)))
                                goto fail;
                        continue;
                }
                stored = convert_output(output, res, &skip);
                if (skip)
                        continue;
                if (flush_stream(outputs, &stream_name, &text) ||
                    json_array_append_new(outputs, stored))
                        goto fail;
        }
        if (flush_stream(outputs, &stream_name, &text))
                goto fail;
        cq_buf_release(&text);
        return outputs;
fail:
        free(stream_name);
        cq_buf_release(&text);
        json_decref(outputs);
        return NULL;
}

static json_t *code_metadata(const cq_cell_result_t *res)
{
        json_t *metadata = json_object();
        json_t *coderq = NULL;

        if (!metadata || !res)
                return metadata;
        if (json_is_object(res->timing) &&
            json_object_set_new(metadata, "execution",
                                json_deep_copy(res->timing)))
                goto fail;
        /* What nbformat cannot say on its own: a timeout, a dead kernel, a
         * cancel, truncated output. */
        if (res->status != CQ_CELL_OK || res->truncated || res->state_lost) {
                coderq = json_pack("{s:s}", "status",
                                   cq_cell_status_name(res->status));
                if (!coderq ||
                    (res->truncated &&
                     json_object_set_new(coderq, "truncated", json_true())) ||
                    (res->state_lost &&
                     json_object_set_new(coderq, "state_lost", json_true())))
                        goto fail;
                if (json_object_set_new(metadata, "coderq", coderq))
                        goto fail_set;
        }
        return metadata;
fail:
        json_decref(coderq);
fail_set:
        json_decref(metadata);
        return NULL;
}

int cq_nb_add_code(cq_nb_t *nb, const char *code, const cq_cell_result_t *res)
{
        json_t *source = split_text(code);
        json_t *outputs = res ? convert_outputs(res) : json_array();
        json_t *count = res && res->execution_count >= 0
                            ? json_integer(res->execution_count)
                            : json_null();
        json_t *metadata = code_metadata(res);

        if (!source || !outputs || !count || !metadata) {
                json_decref(source);
                json_decref(outputs);
                json_decref(count);
                json_decref(metadata);
                return -1;
        }
        return append_cell(nb, json_pack("{s:s, s:o, s:o, s:o, s:o}",
                                         "cell_type", "code", "execution_count",
                                         count, "metadata", metadata, "outputs",
                                         outputs, "source", source));
}

size_t cq_nb_ncells(const cq_nb_t *nb) { return json_array_size(nb->cells); }

int cq_nb_set_meta(cq_nb_t *nb, const char *key, json_t *value)
{
        json_t *metadata = json_object_get(nb->doc, "metadata");
        json_t *coderq = json_object_get(metadata, "coderq");

        if (!value)
                return -1;
        if (!json_is_object(coderq)) {
                coderq = json_object();
                if (json_object_set_new(metadata, "coderq", coderq)) {
                        json_decref(value);
                        return -1;
                }
        }
        return json_object_set_new(coderq, key, value) ? -1 : 0;
}

const json_t *cq_nb_json(const cq_nb_t *nb) { return nb->doc; }

char *cq_nb_dumps(const cq_nb_t *nb, size_t *lenp)
{
        size_t len, i;
        char *text, *out;

        text = json_dumps(nb->doc, JSON_INDENT(1) | JSON_SORT_KEYS);
        if (!text)
                return NULL;
        len = strlen(text);
        out = realloc(text, len + 2);
        if (!out) {
                free(text);
                return NULL;
        }
        /* Python's json writes \u escapes in lower case, jansson in upper
         * case. Every backslash in the output starts an escape inside a
         * string, so a linear scan finds them all. */
        for (i = 0; i < len; i++) {
                if (out[i] != '\\')
                        continue;
                if (out[i + 1] == 'u' && i + 5 < len) {
                        size_t k;

                        for (k = i + 2; k < i + 6; k++)
                                if (out[k] >= 'A' && out[k] <= 'F')
                                        out[k] = (char)(out[k] - 'A' + 'a');
                        i += 5;
                } else {
                        i++;
                }
        }
        out[len] = '\n';
        out[len + 1] = '\0';
        if (lenp)
                *lenp = len + 1;
        return out;
}

int cq_nb_write_file(const cq_nb_t *nb,
                     const char *path,
                     char *errstr,
                     size_t errstr_size)
{
        char *text = NULL, *tmp = NULL;
        size_t len, off = 0, tmplen;
        int fd = -1, rc = -1;

        text = cq_nb_dumps(nb, &len);
        if (!text) {
                cq_errstr_set(errstr, errstr_size,
                              "could not write notebook \"%s\": out of memory",
                              path);
                goto out;
        }
        tmplen = strlen(path) + sizeof(".tmp.XXXXXX");
        tmp = malloc(tmplen);
        if (!tmp) {
                cq_errstr_set(errstr, errstr_size,
                              "could not write notebook \"%s\": out of memory",
                              path);
                goto out;
        }
        snprintf(tmp, tmplen, "%s.tmp.XXXXXX", path);
        fd = mkstemp(tmp);
        if (fd < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create temporary file for \"%s\": %s",
                              path, strerror(errno));
                free(tmp);
                tmp = NULL;
                goto out;
        }
        while (off < len) {
                ssize_t n = write(fd, text + off, len - off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not write notebook \"%s\": %s",
                                      tmp, strerror(errno));
                        goto out;
                }
                off += (size_t)n;
        }
        /* mkstemp creates 0600; a notebook is an ordinary readable file. */
        if (fchmod(fd, 0644) || fsync(fd)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not write notebook \"%s\": %s", tmp,
                              strerror(errno));
                goto out;
        }
        if (close(fd)) {
                fd = -1;
                cq_errstr_set(errstr, errstr_size,
                              "could not write notebook \"%s\": %s", tmp,
                              strerror(errno));
                goto out;
        }
        fd = -1;
        if (rename(tmp, path)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not rename \"%s\" to \"%s\": %s", tmp,
                              path, strerror(errno));
                goto out;
        }
        rc = 0;
out:
        if (fd >= 0)
                close(fd);
        if (rc && tmp)
                unlink(tmp);
        free(tmp);
        free(text);
        return rc;
}
