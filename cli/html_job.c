/* SPDX-License-Identifier: MIT */
/* html_job.c - a job's page of the run report: overview, answer, tests,
 * transcript, notebook and images. Every string from a job goes through
 * cq_html_escape(); images only as data: URIs of bytes encoded here. Job
 * pages carry no script. */
#include "coderq/cli/html.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/clifmt.h"
#include "coderq/common/util.h"
#include "html_int.h"

/* The job message is shown up to this many bytes of its JSON. */
#define SPEC_SHOW_MAX (64 * 1024)

static void termn(html_out_t *o, const char *s, size_t len)
{
        if (o->err == CQ_OK)
                o->err = cq_html_term(o->buf, s, len);
}

/* nbformat's multiline text: a string, or an array of strings joined.
 * Caller owns the returned value (free()); NULL when \p v is neither or
 * out of memory (*oomp then set). */
static char *join_text(const json_t *v, size_t *lenp, bool *oomp)
{
        cq_buf_t tmp;
        const json_t *line;
        size_t i;
        char *text;

        *lenp = 0;
        if (!json_is_string(v) && !json_is_array(v))
                return NULL;
        cq_buf_init(&tmp, SIZE_MAX);
        if (json_is_string(v)) {
                if (cq_buf_append(&tmp, json_string_value(v),
                                  json_string_length(v)) != CQ_OK)
                        goto fail;
        } else {
                json_array_foreach(v, i, line)
                {
                        if (json_is_string(line) &&
                            cq_buf_append(&tmp, json_string_value(line),
                                          json_string_length(line)) != CQ_OK)
                                goto fail;
                }
        }
        text = cq_buf_take(&tmp, lenp);
        if (!text)
                *oomp = true;
        return text;
fail:
        cq_buf_release(&tmp);
        *oomp = true;
        return NULL;
}

/* Escaped multiline text; \p terminal strips ANSI escapes first. */
static void put_text(html_out_t *o, const json_t *v, bool terminal)
{
        bool failed = false;
        size_t len;
        char *text = join_text(v, &len, &failed);

        if (failed)
                html_oom(o);
        if (!text)
                return;
        if (terminal)
                termn(o, text, len);
        else
                html_escn(o, text, len);
        free(text);
}

/* Digests of the images already drawn on the page, so the job's stored
 * images are not drawn twice. */
typedef struct seen {
        char (*v)[65];
        size_t n, alloc;
} seen_t;

static bool seen_has(const seen_t *seen, const char *hex)
{
        size_t i;

        for (i = 0; i < seen->n; i++)
                if (strcmp(seen->v[i], hex) == 0)
                        return true;
        return false;
}

static int seen_add(seen_t *seen, const char *hex)
{
        if (seen_has(seen, hex))
                return 0;
        if (seen->n == seen->alloc) {
                size_t alloc = seen->alloc ? seen->alloc * 2 : 8;
                char(*v)[65] = realloc(seen->v, alloc * sizeof(*v));

                if (!v)
                        return -1;
                seen->v = v;
                seen->alloc = alloc;
        }
        memcpy(seen->v[seen->n++], hex, 65);
        return 0;
}

/* The image types drawn; anything else is named, not drawn. */
static bool drawable(const char *mime)
{
        return mime && (strcmp(mime, "image/png") == 0 ||
                        strcmp(mime, "image/jpeg") == 0 ||
                        strcmp(mime, "image/gif") == 0 ||
                        strcmp(mime, "image/svg+xml") == 0);
}

/* An <img> of \p len bytes: a data: URI of the bytes encoded here (never
 * the stored text), so nothing but base64 reaches the attribute. */
static void put_img(html_out_t *o,
                    const char *mime,
                    const unsigned char *data,
                    size_t len,
                    const char *alt,
                    seen_t *seen)
{
        char hex[65];
        char *b64 = cq_b64_encode(data, len, NULL);

        if (!b64) {
                html_oom(o);
                return;
        }
        cq_sha256_hex(data, len, hex);
        if (seen_add(seen, hex) != 0)
                html_oom(o);
        html_putf(o, "<img src=\"data:%s;base64,", mime);
        html_put(o, b64);
        html_put(o, "\" alt=\"");
        html_esc(o, alt);
        html_put(o, "\">");
        free(b64);
}

/* An image output of the notebook: base64 text (png, jpeg, gif) or the
 * SVG document itself. */
static void
put_output_image(html_out_t *o, const char *mime, const json_t *v, seen_t *seen)
{
        bool failed = false;
        size_t len = 0, n = 0;
        char *text = join_text(v, &len, &failed);
        unsigned char *bytes = NULL;

        if (failed)
                html_oom(o);
        if (!text)
                return;
        if (strcmp(mime, "image/svg+xml") == 0) {
                html_put(o, "<figure>");
                put_img(o, mime, (const unsigned char *)text, len, mime, seen);
                html_put(o, "</figure>\n");
                free(text);
                return;
        }
        bytes = cq_b64_decode(text, len, &n);
        if (bytes) {
                html_put(o, "<figure>");
                put_img(o, mime, bytes, n, mime, seen);
                html_put(o, "</figure>\n");
        } else {
                html_putf(o,
                          "<p class=\"muted\">[%s output not shown: not valid "
                          "base64]</p>\n",
                          mime);
        }
        free(bytes);
        free(text);
}

/* execute_result and display_data: the images, else the plain text, else
 * the first other representation shown as text (never as markup). */
static void put_rich(html_out_t *o, const json_t *data, seen_t *seen)
{
        static const char *const images[] = {"image/png", "image/jpeg",
                                             "image/gif", "image/svg+xml"};
        const char *mime;
        const json_t *v;
        bool shown = false;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(images); i++) {
                v = json_object_get(data, images[i]);
                if (v) {
                        put_output_image(o, images[i], v, seen);
                        shown = true;
                }
        }
        if (shown)
                return;
        v = json_object_get(data, "text/plain");
        if (v) {
                html_put(o, "<pre class=\"result\">");
                put_text(o, v, true);
                html_put(o, "</pre>\n");
                return;
        }
        json_object_foreach((json_t *)(uintptr_t)data, mime, v)
        {
                html_put(o, "<div class=\"muted\">");
                html_esc(o, mime);
                html_put(o, " (shown as text)</div><pre class=\"result\">");
                if (json_is_string(v) || json_is_array(v))
                        put_text(o, v, false);
                else
                        html_put_json(o, v, JSON_INDENT(1), 65536);
                html_put(o, "</pre>\n");
                return;
        }
}

static void put_outputs(html_out_t *o, const json_t *outputs, seen_t *seen)
{
        const json_t *out;
        size_t i;

        json_array_foreach(outputs, i, out)
        {
                const char *type =
                    json_string_value(json_object_get(out, "output_type"));

                if (type && strcmp(type, "stream") == 0) {
                        const char *name =
                            json_string_value(json_object_get(out, "name"));
                        bool err = name && strcmp(name, "stderr") == 0;

                        html_put(o, err ? "<pre class=\"stderr\">"
                                        : "<pre class=\"stdout\">");
                        put_text(o, json_object_get(out, "text"), true);
                        html_put(o, "</pre>\n");
                } else if (type && strcmp(type, "error") == 0) {
                        const json_t *tb = json_object_get(out, "traceback");
                        const json_t *line;
                        size_t j;

                        html_put(o, "<pre class=\"err\">");
                        put_text(o, json_object_get(out, "ename"), true);
                        html_put(o, ": ");
                        put_text(o, json_object_get(out, "evalue"), true);
                        json_array_foreach(tb, j, line)
                        {
                                html_put(o, "\n");
                                put_text(o, line, true);
                        }
                        html_put(o, "</pre>\n");
                } else if (type && (strcmp(type, "execute_result") == 0 ||
                                    strcmp(type, "display_data") == 0)) {
                        put_rich(o, json_object_get(out, "data"), seen);
                } else {
                        html_put(o, "<pre>");
                        html_put_json(o, out, JSON_INDENT(1), 65536);
                        html_put(o, "</pre>\n");
                }
        }
}

static void put_prompt_count(html_out_t *o, const json_t *count)
{
        if (json_is_integer(count))
                html_putf(o, "In [%" JSON_INTEGER_FORMAT "]",
                          json_integer_value(count));
        else
                html_put(o, "In [ ]");
}

/* The notebook's cells; without a stored notebook, the job's cells. */
static void put_notebook(html_out_t *o, const json_t *doc, seen_t *seen)
{
        const json_t *nb = json_object_get(doc, "notebook");
        const json_t *cells = json_object_get(nb, "cells");
        const json_t *cell;
        bool from_nb = json_is_array(cells);
        size_t i;

        if (!from_nb)
                cells = json_object_get(doc, "cells");
        html_put(o, "<section id=\"notebook\">\n<h2>Notebook</h2>\n");
        if (json_array_size(cells) == 0)
                html_put(o, "<p class=\"muted\">No cells.</p>\n");
        else if (!from_nb)
                html_put(o,
                         "<p class=\"muted\">No notebook was stored; these are "
                         "the cells as they ran.</p>\n");
        json_array_foreach(cells, i, cell)
        {
                const char *type =
                    json_string_value(json_object_get(cell, "cell_type"));
                const char *status =
                    json_string_value(json_object_get(cell, "status"));

                html_put(o, "<div class=\"cell\">");
                if (from_nb && type && strcmp(type, "code") != 0) {
                        html_put(o, "<div class=\"prompt\">");
                        html_esc(o, type);
                        html_put(o, "</div><pre class=\"md\">");
                        put_text(o, json_object_get(cell, "source"), false);
                        html_put(o, "</pre></div>\n");
                        continue;
                }
                html_put(o, "<div class=\"prompt\">");
                put_prompt_count(o, json_object_get(cell, "execution_count"));
                if (status) {
                        html_put(o, " &middot; ");
                        html_esc(o, status);
                }
                if (json_is_integer(json_object_get(cell, "duration_ms"))) {
                        char d[32];

                        cq_fmt_duration(d, sizeof(d),
                                        json_integer_value(json_object_get(
                                            cell, "duration_ms")));
                        html_put(o, " &middot; ");
                        html_esc(o, d);
                }
                html_put(o, "</div><pre class=\"code\">");
                put_text(o, json_object_get(cell, from_nb ? "source" : "code"),
                         false);
                html_put(o, "</pre>\n");
                put_outputs(o, json_object_get(cell, "outputs"), seen);
                html_put(o, "</div>\n");
        }
        html_put(o, "</section>\n");
}

/* The code of an execute_code call, else its raw arguments. */
static void put_tool_call(html_out_t *o, const json_t *call)
{
        const json_t *fn = json_object_get(call, "function");
        const json_t *args = json_object_get(fn, "arguments");
        json_t *parsed = NULL;
        const json_t *code = NULL;

        html_put(o, "<div class=\"role\">tool call ");
        html_esc_json(o, json_object_get(fn, "name"));
        html_put(o, " <span class=\"muted\">");
        html_esc_json(o, json_object_get(call, "id"));
        html_put(o, "</span></div>");
        if (json_is_string(args)) {
                parsed = json_loadb(json_string_value(args),
                                    json_string_length(args), 0, NULL);
                code = json_object_get(parsed, "code");
        } else if (json_is_object(args)) {
                code = json_object_get(args, "code");
        }
        html_put(o, "<pre class=\"code\">");
        if (json_is_string(code))
                html_esc_json(o, code);
        else if (json_is_string(args))
                html_esc_json(o, args);
        else if (args)
                html_put_json(o, args, JSON_INDENT(1), 65536);
        html_put(o, "</pre>\n");
        json_decref(parsed);
}

/* A message's content: text, or an array of parts (their text).
 * \p terminal: a tool result, cell output as the model saw it. */
static void put_content(html_out_t *o, const json_t *content, bool terminal)
{
        const json_t *part;
        size_t i;

        if (json_is_string(content)) {
                if (json_string_length(content) == 0)
                        return;
                html_put(o, "<pre>");
                put_text(o, content, terminal);
                html_put(o, "</pre>\n");
                return;
        }
        json_array_foreach(content, i, part)
        {
                const json_t *text = json_object_get(part, "text");

                html_put(o, "<pre>");
                if (json_is_string(text))
                        put_text(o, text, terminal);
                else
                        html_put_json(o, part, JSON_INDENT(1), 65536);
                html_put(o, "</pre>\n");
        }
}

static void put_transcript(html_out_t *o, const json_t *messages)
{
        static const char *const roles[] = {"system", "user", "assistant",
                                            "tool"};
        const json_t *msg, *call;
        size_t i, j;

        html_put(o, "<section id=\"transcript\">\n<h2>Transcript</h2>\n");
        if (json_array_size(messages) == 0)
                html_put(o, "<p class=\"muted\">No messages.</p>\n");
        json_array_foreach(messages, i, msg)
        {
                const char *role =
                    json_string_value(json_object_get(msg, "role"));
                const char *cls = "other";
                const json_t *reasoning =
                    json_object_get(msg, "reasoning_content");

                for (j = 0; role && j < CQ_ARRAY_SIZE(roles); j++)
                        if (strcmp(role, roles[j]) == 0)
                                cls = roles[j];
                html_putf(o, "<div class=\"msg %s\"><div class=\"role\">", cls);
                html_esc(o, role ? role : "message");
                if (json_is_string(json_object_get(msg, "tool_call_id"))) {
                        html_put(o, " <span class=\"muted\">result of ");
                        html_esc_json(o, json_object_get(msg, "tool_call_id"));
                        html_put(o, "</span>");
                }
                html_put(o, "</div>\n");
                if (json_is_string(reasoning) &&
                    json_string_length(reasoning) > 0) {
                        html_put(o,
                                 "<details><summary>reasoning</summary><pre>");
                        html_esc_json(o, reasoning);
                        html_put(o, "</pre></details>\n");
                }
                put_content(o, json_object_get(msg, "content"),
                            strcmp(cls, "tool") == 0);
                json_array_foreach(json_object_get(msg, "tool_calls"), j, call)
                    put_tool_call(o, call);
                html_put(o, "</div>\n");
        }
        html_put(o, "</section>\n");
}

static void put_test_report(html_out_t *o, const json_t *doc)
{
        static const char *const skip[] = {"passed", "total", "cases", "error",
                                           NULL};
        const json_t *tests =
            json_object_get(json_object_get(doc, "report"), "tests");
        const json_t *spec_tests =
            json_object_get(json_object_get(doc, "spec"), "tests");
        const json_t *cases = json_object_get(tests, "cases"), *c;
        const json_t *error = json_object_get(tests, "error");
        size_t i;

        if (!json_is_object(tests) && !spec_tests)
                return;
        html_put(o, "<section id=\"tests\">\n<h2>Tests</h2>\n");
        if (!json_is_object(tests)) {
                html_put(o, "<p class=\"muted\">The tests did not run.</p>\n"
                            "</section>\n");
                return;
        }
        html_put(o, "<div class=\"cards\">");
        html_put(o, "<div class=\"card\"><div class=\"v\">");
        html_put_tests(o, json_object_get(tests, "passed"),
                       json_object_get(tests, "total"));
        html_put(o, "</div><div class=\"k\">passed</div></div></div>\n");
        if (json_is_string(error)) {
                html_put(o, "<pre class=\"err\">");
                termn(o, json_string_value(error), json_string_length(error));
                html_put(o, "</pre>\n");
        }
        html_put_kv(o, tests, skip, 0);
        if (json_array_size(cases) > 0) {
                html_put(o,
                         "<h3>Cases</h3>\n<table class=\"cases\">\n<thead><tr>"
                         "<th>#</th><th>result</th><th>call</th><th>expected"
                         "</th><th>got</th><th>error</th></tr></thead>\n"
                         "<tbody>\n");
                json_array_foreach(cases, i, c)
                {
                        const json_t *tb = json_object_get(c, "traceback");
                        const json_t *err = json_object_get(c, "error");
                        bool ok = json_is_true(json_object_get(c, "ok"));

                        html_put(o, "<tr><td class=\"num\">");
                        html_put_value(o, "case", json_object_get(c, "case"),
                                       HTML_MAX_DEPTH - 1);
                        html_putf(o, "</td><td class=\"%s\">%s</td><td><code>",
                                  ok ? "pass" : "fail", ok ? "pass" : "fail");
                        html_esc_json(o, json_object_get(c, "call"));
                        html_put(o, "</code></td><td><code>");
                        html_esc_json(o, json_object_get(c, "expected"));
                        html_put(o, "</code></td><td><code>");
                        html_esc_json(o, json_object_get(c, "got"));
                        html_put(o, "</code></td><td>");
                        if (json_is_string(err) || json_is_string(tb)) {
                                html_put(o, "<pre class=\"err\">");
                                if (json_is_string(err))
                                        termn(o, json_string_value(err),
                                              json_string_length(err));
                                if (json_is_string(err) && json_is_string(tb))
                                        html_put(o, "\n");
                                if (json_is_string(tb))
                                        termn(o, json_string_value(tb),
                                              json_string_length(tb));
                                html_put(o, "</pre>");
                        }
                        html_put(o, "</td></tr>\n");
                }
                html_put(o, "</tbody>\n</table>\n");
        }
        html_put(o, "</section>\n");
}

/* The job's stored images the notebook did not already show. */
static void
put_images(html_out_t *o, const cq_images_t *images, const seen_t *seen_nb)
{
        seen_t seen = {0};
        size_t i, shown = 0;

        if (!images)
                return;
        for (i = 0; i < images->n; i++)
                shown += !seen_has(seen_nb, images->v[i].sha256);
        if (!shown)
                return;
        html_put(o,
                 "<section id=\"images\">\n<h2>Images</h2>\n"
                 "<p class=\"muted\">Images the job stored that the notebook "
                 "does not show.</p>\n");
        for (i = 0; i < images->n; i++) {
                const cq_image_t *img = &images->v[i];

                if (seen_has(seen_nb, img->sha256))
                        continue;
                html_put(o, "<figure>");
                if (drawable(img->mime))
                        put_img(o, img->mime, img->data, img->len, img->name,
                                &seen);
                html_put(o, "<figcaption>");
                html_esc(o, img->name);
                html_put(o, " &middot; ");
                html_esc(o, img->mime);
                html_putf(o, " &middot; %zu bytes", img->len);
                if (!drawable(img->mime))
                        html_put(o,
                                 " &middot; not drawn (only PNG, JPEG, GIF and "
                                 "SVG are)");
                html_put(o, "</figcaption></figure>\n");
        }
        html_put(o, "</section>\n");
        free(seen.v);
}

static void put_overview(html_out_t *o, const json_t *status)
{
        static const char *const plain[] = {"turns", "retries", "total_tokens",
                                            "cost_usd", "duration_ms"};
        static const char *const labels[] = {"turns", "retries", "tokens",
                                             "cost", "duration"};
        const json_t *reason = json_object_get(status, "reason");
        const json_t *model = json_object_get(status, "model");
        size_t i;

        html_put(
            o, "<section id=\"overview\">\n<h2>Overview</h2>\n"
               "<div class=\"cards\">\n<div class=\"card\"><div class=\"v\">");
        html_put_status(o,
                        json_string_value(json_object_get(status, "status")));
        html_put(o, "</div><div class=\"k\">status</div></div>\n");
        if (json_is_string(json_object_get(status, "verdict"))) {
                html_put(o, "<div class=\"card\"><div class=\"v\">");
                html_put_verdict(o, status);
                html_put(o, "</div><div class=\"k\">verdict</div></div>\n");
        }
        html_put(o, "<div class=\"card\"><div class=\"v\">");
        html_put_tests(o, json_object_get(status, "tests_passed"),
                       json_object_get(status, "tests_total"));
        html_put(o, "</div><div class=\"k\">tests</div></div>\n");
        if (json_is_integer(json_object_get(status, "hidden_total"))) {
                html_put(o, "<div class=\"card\"><div class=\"v\">");
                html_put_tests(o, json_object_get(status, "hidden_passed"),
                               json_object_get(status, "hidden_total"));
                html_put(o, "</div><div class=\"k\">hidden tests</div>"
                            "</div>\n");
        }
        if (json_is_string(model))
                html_put_card(o, "model", "model", model);
        for (i = 0; i < CQ_ARRAY_SIZE(plain); i++) {
                json_t *v = json_object_get(status, plain[i]);

                if (v)
                        html_put_card(o, labels[i], plain[i], v);
        }
        html_put(o, "<div class=\"card\"><div class=\"v\">");
        html_put_memory(o, status);
        html_put(o, "</div><div class=\"k\">memory</div></div>\n</div>\n");
        if (json_is_string(reason)) {
                html_put(o, "<pre class=\"err\">");
                termn(o, json_string_value(reason), json_string_length(reason));
                html_put(o, "</pre>\n");
        }
        html_put(o, "<details><summary>All fields</summary>\n");
        html_put_kv(o, status, NULL, 0);
        html_put(o, "</details>\n</section>\n");
}

/* The attempts of the job's original job, each linking to its page (the
 * pages are side by side) but this one. */
static void
put_attempts(html_out_t *o, const char *job_id, const cq_html_attempts_t *att)
{
        size_t i;

        if (!att || att->n < 2)
                return;
        html_putf(o,
                  "<section id=\"attempts\">\n<h2>Attempts</h2>\n"
                  "<p class=\"muted\">The original job and its %zu "
                  "retries, each a job of its own; the index counts the "
                  "latest.</p>\n<table class=\"attempts\">\n<thead><tr>"
                  "<th class=\"num\">attempt</th><th>job</th><th>status</th>"
                  "<th>verdict</th><th class=\"num\">tests</th>"
                  "<th class=\"num\">duration</th><th>created</th></tr>"
                  "</thead>\n<tbody>\n",
                  att->n - 1);
        for (i = att->first; i < att->first + att->n; i++) {
                const json_t *row = json_array_get(att->rows, i);
                const json_t *id = json_object_get(row, "job_id");
                bool self = json_is_string(id) &&
                            strcmp(json_string_value(id), job_id) == 0;

                html_put(o, self ? "<tr class=\"self\"><td class=\"num\">"
                                 : "<tr><td class=\"num\">");
                html_put_value(o, "run_attempt",
                               json_object_get(row, "run_attempt"),
                               HTML_MAX_DEPTH);
                html_put(o, "</td><td>");
                if (self) {
                        html_put(o, "<code>");
                        html_esc_json(o, id);
                        html_put(o, "</code> (this page)");
                } else {
                        html_put(o, "<a href=\"");
                        html_esc(o, att->names[i]);
                        html_put(o, "\"><code>");
                        html_esc_json(o, id);
                        html_put(o, "</code></a>");
                }
                html_put(o, "</td><td>");
                html_put_status(
                    o, json_string_value(json_object_get(row, "status")));
                html_put(o, "</td><td>");
                html_put_verdict(o, row);
                html_put(o, "</td><td class=\"num\">");
                html_put_tests(o, json_object_get(row, "tests_passed"),
                               json_object_get(row, "tests_total"));
                html_put(o, "</td><td class=\"num\">");
                html_put_value(o, "duration_ms",
                               json_object_get(row, "duration_ms"),
                               HTML_MAX_DEPTH);
                html_put(o, "</td><td>");
                html_put_value(o, "created_at",
                               json_object_get(row, "created_at"),
                               HTML_MAX_DEPTH);
                html_put(o, "</td></tr>\n");
        }
        html_put(o, "</tbody>\n</table>\n</section>\n");
}

/* Where the job stands: its problem and sample, its attempt. */
static void
put_place(html_out_t *o, const json_t *status, const cq_html_attempts_t *att)
{
        const json_t *problem = json_object_get(status, "problem_id");
        const json_t *index = json_object_get(status, "sample_index");
        const json_t *attempt = json_object_get(status, "run_attempt");

        if (json_is_string(problem) && json_is_integer(index)) {
                html_put(o, " &middot; sample ");
                html_put_value(o, "sample_index", index, HTML_MAX_DEPTH);
                html_put(o, " of problem <code>");
                html_esc_json(o, problem);
                html_put(o, "</code>");
        }
        if (att && att->n > 1 && json_is_integer(attempt))
                html_putf(o,
                          " &middot; <a href=\"#attempts\">attempt "
                          "%" JSON_INTEGER_FORMAT " of %zu</a>",
                          json_integer_value(attempt), att->n);
}

cq_err_t cq_html_job(cq_buf_t *buf,
                     const cq_html_meta_t *meta,
                     const json_t *doc,
                     const cq_images_t *images,
                     const cq_html_attempts_t *attempts)
{
        static const char *const report_skip[] = {"tests", NULL};
        html_out_t o = {buf, CQ_OK};
        const json_t *status = json_object_get(doc, "status");
        const json_t *report = json_object_get(doc, "report");
        const json_t *answer = json_object_get(doc, "answer");
        const json_t *spec = json_object_get(doc, "spec");
        const char *job_id =
            json_string_value(json_object_get(status, "job_id"));
        const char *title = json_string_value(json_object_get(status, "title"));
        seen_t seen = {0};
        cq_buf_t head;

        if (!job_id)
                job_id = "?";
        cq_buf_init(&head, 4096);
        if (cq_buf_append_str(&head, title && *title ? title : job_id) !=
                CQ_OK ||
            cq_buf_append_str(&head, " - coderq run ") != CQ_OK ||
            cq_buf_append_str(&head, meta->run_id) != CQ_OK)
                cq_buf_reset(&head);
        html_page_start(&o, head.data ? head.data : job_id, false);
        cq_buf_release(&head);
        html_put(&o, "<header><h1>");
        html_esc(&o, title && *title ? title : job_id);
        html_put(&o, "</h1><div class=\"sub\">job <code>");
        html_esc(&o, job_id);
        html_put(&o, "</code>");
        put_place(&o, status, attempts);
        html_put(&o, " &middot; <a href=\"../index.html\">run ");
        html_esc(&o, meta->run_id);
        html_put(&o, "</a> &middot; report written ");
        html_esc(&o, meta->generated_at);
        html_put(&o, "</div></header>\n<main>\n");
        put_overview(&o, status);
        put_attempts(&o, job_id, attempts);

        html_put(&o, "<section id=\"answer\">\n<h2>Answer</h2>\n");
        if (json_is_string(answer) && json_string_length(answer) > 0) {
                html_put(&o, "<pre class=\"answer\">");
                html_esc_json(&o, answer);
                html_put(&o, "</pre>\n");
        } else {
                html_put(&o, "<p class=\"muted\">No final answer.</p>\n");
        }
        html_put(&o, "</section>\n");
        put_test_report(&o, doc);
        put_transcript(&o, json_object_get(doc, "messages"));
        put_notebook(&o, doc, &seen);
        put_images(&o, images, &seen);
        if (json_is_object(report)) {
                html_put(&o,
                         "<section id=\"result\">\n<h2>Result details</h2>\n");
                html_put_kv(&o, report, report_skip, 0);
                html_put(&o, "</section>\n");
        }
        if (spec) {
                html_put(&o, "<section id=\"job-message\">\n<details><summary>"
                             "Job message</summary>\n<pre>");
                html_put_json(&o, spec, JSON_INDENT(2), SPEC_SHOW_MAX);
                html_put(&o, "</pre>\n</details>\n</section>\n");
        }
        html_page_end(&o, false);
        free(seen.v);
        return o.err;
}
