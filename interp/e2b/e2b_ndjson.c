/* SPDX-License-Identifier: MIT */
/* e2b_ndjson.c - one line of the code interpreter's /execute NDJSON
 * stream into an nbformat output, a count or the end: untrusted input,
 * checked field by field (a fuzz target feeds it). */
#include "coderq/e2b/e2b.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"
#include "e2b_int.h"

static const struct {
        const char *field, *mime;
} mime_fields[] = {
    {"text", "text/plain"},        {"html", "text/html"},
    {"markdown", "text/markdown"}, {"svg", "image/svg+xml"},
    {"png", "image/png"},          {"jpeg", "image/jpeg"},
    {"pdf", "application/pdf"},    {"latex", "text/latex"},
    {"json", "application/json"},  {"javascript", "application/javascript"},
    {"data", "e2b/data"},          {"chart", "e2b/chart"},
};

/* \p tb (\p len bytes, NULs included) without colour codes, one string
 * per line. */
static json_t *split_traceback(const char *tb, size_t len)
{
        json_t *lines = json_array();
        char *clean;
        size_t clen, start = 0, i;

        if (!lines)
                return NULL;
        clean = cq_ansi_strip(tb, len, &clen);
        if (!clean) {
                json_decref(lines);
                return NULL;
        }
        for (i = 0; i <= clen; i++) {
                if (i < clen && clean[i] != '\n')
                        continue;
                if (i == clen && start == clen)
                        break; /* nothing after the last newline */
                if (json_array_append_new(
                        lines, json_stringn(clean + start, i - start))) {
                        json_decref(lines);
                        lines = NULL;
                        break;
                }
                start = i + 1;
        }
        free(clean);
        return lines;
}

/* text values may not hold invalid UTF-8 (jansson would refuse them) */
static json_t *result_output(json_t *doc, char *errstr, size_t errstr_size)
{
        json_t *data = json_object(), *out = NULL, *extra, *v;
        json_t *main_res = json_object_get(doc, "is_main_result");
        const char *key;
        size_t i;

        if (!data)
                goto fail;
        if (main_res && !json_is_boolean(main_res)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "result line: \"is_main_result\" is not a boolean");
                goto fail;
        }
        for (i = 0; i < CQ_ARRAY_SIZE(mime_fields); i++) {
                v = json_object_get(doc, mime_fields[i].field);
                if (!v || json_is_null(v))
                        continue;
                if (strcmp(mime_fields[i].field, "json") != 0 &&
                    strcmp(mime_fields[i].field, "data") != 0 &&
                    strcmp(mime_fields[i].field, "chart") != 0 &&
                    !json_is_string(v)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "result line: \"%s\" is not a string",
                                      mime_fields[i].field);
                        goto fail;
                }
                if (json_object_set(data, mime_fields[i].mime, v))
                        goto fail;
        }
        extra = json_object_get(doc, "extra");
        if (extra && !json_is_null(extra) && !json_is_object(extra)) {
                cq_errstr_set(errstr, errstr_size,
                              "result line: \"extra\" is not an object");
                goto fail;
        }
        json_object_foreach(extra, key, v)
        {
                if (!json_object_get(data, key) &&
                    json_object_set(data, key, v))
                        goto fail;
        }
        out = json_pack("{s:s, s:o, s:{}}", "output_type",
                        json_is_true(main_res) ? "execute_result"
                                               : "display_data",
                        "data", data, "metadata");
        return out;
fail:
        if (errstr && errstr_size && !errstr[0])
                cq_errstr_set(errstr, errstr_size, "out of memory");
        json_decref(data);
        return NULL;
}

cq_err_t cq_e2b_parse_line(const char *line,
                           size_t len,
                           cq_e2b_line_t *out,
                           char *errstr,
                           size_t errstr_size)
{
        json_error_t jerr;
        json_t *doc = NULL, *t;
        const char *type;
        cq_err_t err = CQ_ERR_FATAL;

        memset(out, 0, sizeof(*out));
        if (errstr && errstr_size)
                errstr[0] = '\0';
        /* Code may print any character, NUL included (a JSON "\u0000"):
         * it is output like any other. */
        doc = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                         &jerr);
        if (!doc) {
                cq_errstr_set(errstr, errstr_size, "invalid JSON: %s",
                              jerr.text);
                goto out;
        }
        if (!json_is_object(doc)) {
                cq_errstr_set(errstr, errstr_size, "line is not a JSON object");
                goto out;
        }
        t = json_object_get(doc, "type");
        type = json_string_value(t);
        if (!type) {
                cq_errstr_set(errstr, errstr_size,
                              "line has no string \"type\" field");
                goto out;
        }
        if (strcmp(type, "number_of_executions") == 0) {
                json_t *n = json_object_get(doc, "execution_count");

                if (!json_is_integer(n) || json_integer_value(n) < 0 ||
                    json_integer_value(n) > INT32_MAX) {
                        cq_errstr_set(errstr, errstr_size,
                                      "number_of_executions line: "
                                      "\"execution_count\" is not a count");
                        goto out;
                }
                out->kind = CQ_E2B_LINE_COUNT;
                out->execution_count = (int)json_integer_value(n);
        } else if (strcmp(type, "stdout") == 0 || strcmp(type, "stderr") == 0) {
                json_t *text = json_object_get(doc, "text");

                if (!json_is_string(text)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "%s line: \"text\" is not a string",
                                      type);
                        goto out;
                }
                out->output = json_pack("{s:s, s:s, s:O}", "output_type",
                                        "stream", "name", type, "text", text);
                out->kind = CQ_E2B_LINE_OUTPUT;
        } else if (strcmp(type, "result") == 0) {
                out->output = result_output(doc, errstr, errstr_size);
                if (!out->output)
                        goto out;
                out->kind = CQ_E2B_LINE_OUTPUT;
        } else if (strcmp(type, "error") == 0) {
                json_t *name = json_object_get(doc, "name");
                json_t *value = json_object_get(doc, "value");
                json_t *tb = json_object_get(doc, "traceback");
                json_t *lines;

                if (!json_is_string(name) || !json_is_string(value) ||
                    (tb && !json_is_null(tb) && !json_is_string(tb))) {
                        cq_errstr_set(errstr, errstr_size,
                                      "error line: \"name\", \"value\" or "
                                      "\"traceback\" is not a string");
                        goto out;
                }
                lines = split_traceback(
                    tb && json_is_string(tb) ? json_string_value(tb) : "",
                    tb && json_is_string(tb) ? json_string_length(tb) : 0);
                if (!lines)
                        goto oom;
                out->output = json_pack("{s:s, s:O, s:O, s:o}", "output_type",
                                        "error", "ename", name, "evalue", value,
                                        "traceback", lines);
                out->kind = CQ_E2B_LINE_OUTPUT;
        } else if (strcmp(type, "end_of_execution") == 0) {
                out->kind = CQ_E2B_LINE_END;
        } else {
                out->kind = CQ_E2B_LINE_IGNORED; /* e2b_keepalive and the new */
        }
        if (out->kind == CQ_E2B_LINE_OUTPUT && !out->output)
                goto oom;
        err = CQ_OK;
        goto out;
oom:
        cq_errstr_set(errstr, errstr_size, "out of memory");
        memset(out, 0, sizeof(*out));
out:
        json_decref(doc);
        return err;
}
