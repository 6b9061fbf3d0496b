/* SPDX-License-Identifier: MIT */
/* tooltext.c - bounded text for the LLM about executed cells, their
 * failures and failed tests. Upstream sent only the error when a cell
 * failed (losing stdout), dropped stderr, ignored HTML, had no total cap
 * and promised an image placeholder it never sent; here every item is
 * shown in order, bounded head + tail with a visible marker, and images
 * are described by CQ_TOOLTEXT_IMAGE_FORMAT. */
#include "coderq/agent/tooltext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coderq/common/buf.h"
#include "coderq/common/util.h"

/* Intermediate renderings hold at most what the cell result already holds,
 * a few times over; the cap only guards against arithmetic surprises. */
#define TT_BUF_MAX ((size_t)1 << 30)

void cq_tooltext_opts_init(cq_tooltext_opts_t *opts)
{
        opts->item_head = 1500;
        opts->item_tail = 1500;
        opts->error_head = 1000;
        opts->error_tail = 2000;
        opts->total_head = 6000;
        opts->total_tail = 6000;
        opts->code_head = 3000;
        opts->code_tail = 2000;
        opts->max_failures = 5;
}

static const cq_tooltext_opts_t *opts_or_default(const cq_tooltext_opts_t *opts,
                                                 cq_tooltext_opts_t *defaults)
{
        if (opts)
                return opts;
        cq_tooltext_opts_init(defaults);
        return defaults;
}

/* Characters (code points) in s[0..n): bytes that do not continue a UTF-8
 * sequence. */
static size_t count_chars(const char *s, size_t n)
{
        size_t i, count = 0;

        for (i = 0; i < n; i++)
                if (((unsigned char)s[i] & 0xc0) != 0x80)
                        count++;
        return count;
}

/* Append s, keeping at most head bytes from the start and tail bytes from
 * the end around a marker. Cuts move to UTF-8 sequence boundaries (the head
 * shrinks, the tail starts later), so nothing is ever split. */
static int append_bounded(cq_buf_t *out,
                          const char *s,
                          size_t len,
                          size_t head,
                          size_t tail,
                          const char *where)
{
        size_t h, t, k;

        if (len <= head || len - head <= tail)
                return cq_buf_append(out, s, len) == CQ_OK ? 0 : -1;
        h = head;
        while (h > 0 && ((unsigned char)s[h] & 0xc0) == 0x80)
                h--;
        t = len - tail;
        while (t < len && ((unsigned char)s[t] & 0xc0) == 0x80)
                t++;
        /* Whole lines read better: end the head after a line break in its
         * last quarter, start the tail after one in its first quarter. */
        for (k = h; k > h - h / 4; k--)
                if (s[k - 1] == '\n') {
                        h = k;
                        break;
                }
        for (k = t; k < t + (len - t) / 4; k++)
                if (s[k] == '\n') {
                        t = k + 1;
                        break;
                }
        if (cq_buf_append(out, s, h))
                return -1;
        if (h > 0 && s[h - 1] != '\n' && cq_buf_append_str(out, "\n"))
                return -1;
        if (cq_buf_printf(out, "[... %zu characters omitted%s ...]\n",
                          count_chars(s + h, t - h), where))
                return -1;
        return cq_buf_append(out, s + t, len - t) == CQ_OK ? 0 : -1;
}

/* Text as the model should read it: ANSI escapes removed, carriage-return
 * redraws (progress bars) resolved to what a terminal would finally show,
 * NUL bytes spelled "\x00". */
static int clean_text(cq_buf_t *out, const char *s, size_t len)
{
        char *plain;
        size_t plen, i, run, stop, line = 0;
        int rc = -1;

        plain = cq_ansi_strip(s, len, &plen);
        if (!plain)
                return -1;
        while (line < plen) {
                size_t end = line, start = line;

                while (end < plen && plain[end] != '\n')
                        end++;
                /* Keep what follows the last lone \r of the line. */
                for (i = line; i < end; i++)
                        if (plain[i] == '\r' && i + 1 < end)
                                start = i + 1;
                stop = end;
                if (stop > start && plain[stop - 1] == '\r')
                        stop--; /* \r\n, or a \r ending the text */
                /* Copy runs between NUL bytes in one go. */
                for (i = start; i < stop; i = run + 1) {
                        run = i;
                        while (run < stop && plain[run] != '\0')
                                run++;
                        if (cq_buf_append(out, plain + i, run - i) ||
                            (run < stop && cq_buf_append_str(out, "\\x00")))
                                goto out;
                }
                if (end < plen && cq_buf_append_str(out, "\n"))
                        goto out;
                line = end + 1;
        }
        rc = 0;
out:
        free(plain);
        return rc;
}

/* Append a labelled block: "[label]\n" + cleaned, bounded text + "\n". */
static int append_block(cq_buf_t *out,
                        const char *label,
                        const char *s,
                        size_t len,
                        size_t head,
                        size_t tail)
{
        cq_buf_t clean;
        int rc = -1;

        cq_buf_init(&clean, TT_BUF_MAX);
        if (clean_text(&clean, s, len))
                goto out;
        if (label && cq_buf_printf(out, "[%s]\n", label))
                goto out;
        if (clean.len == 0) {
                rc = cq_buf_append_str(out, "(empty)\n") == CQ_OK ? 0 : -1;
                goto out;
        }
        if (append_bounded(out, clean.data, clean.len, head, tail, ""))
                goto out;
        if (out->len && out->data[out->len - 1] != '\n' &&
            cq_buf_append_str(out, "\n"))
                goto out;
        rc = 0;
out:
        cq_buf_release(&clean);
        return rc;
}

static void format_size(char *out, size_t size, size_t bytes)
{
        if (bytes < 1024)
                snprintf(out, size, "%zu B", bytes);
        else if (bytes < (size_t)1024 * 1024)
                snprintf(out, size, "%.1f KB", (double)bytes / 1024.0);
        else
                snprintf(out, size, "%.1f MB",
                         (double)bytes / (1024.0 * 1024.0));
}

static unsigned be16(const unsigned char *p)
{
        return (unsigned)p[0] << 8 | p[1];
}

static unsigned long be32(const unsigned char *p)
{
        return (unsigned long)p[0] << 24 | (unsigned long)p[1] << 16 |
               (unsigned long)p[2] << 8 | p[3];
}

/* Width and height from a PNG, GIF or JPEG header; false when unknown. */
static bool image_dims(const unsigned char *p,
                       size_t n,
                       unsigned long *wp,
                       unsigned long *hp)
{
        size_t i;

        if (n >= 24 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 &&
            memcmp(p + 12, "IHDR", 4) == 0) {
                *wp = be32(p + 16);
                *hp = be32(p + 20);
                return true;
        }
        if (n >= 10 &&
            (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0)) {
                *wp = (unsigned long)p[6] | (unsigned long)p[7] << 8;
                *hp = (unsigned long)p[8] | (unsigned long)p[9] << 8;
                return true;
        }
        if (n < 4 || p[0] != 0xff || p[1] != 0xd8)
                return false;
        /* JPEG: walk the marker segments up to a start-of-frame. */
        i = 2;
        while (i + 4 <= n) {
                unsigned marker, seglen;

                if (p[i] != 0xff)
                        return false;
                marker = p[i + 1];
                if (marker == 0xff) {
                        i++;
                        continue;
                }
                if (marker == 0xd8 || marker == 0x01 ||
                    (marker >= 0xd0 && marker <= 0xd7)) {
                        i += 2;
                        continue;
                }
                seglen = be16(p + i + 2);
                if (marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 &&
                    marker != 0xc8 && marker != 0xcc) {
                        if (i + 9 > n)
                                return false;
                        *hp = be16(p + i + 5);
                        *wp = be16(p + i + 7);
                        return true;
                }
                if (seglen < 2)
                        return false;
                i += 2 + seglen;
        }
        return false;
}

static bool is_json_mime(const char *mime)
{
        size_t len = strlen(mime);

        return strcmp(mime, "application/json") == 0 ||
               (len > 5 && strcmp(mime + len - 5, "+json") == 0);
}

/* Describe a non-text output: an image placeholder or a "not shown" line. */
static int append_binary(cq_buf_t *out,
                         size_t index,
                         const char *mime,
                         const json_t *value)
{
        const char *s = json_string_value(value);
        size_t len = json_string_length(value), bytes = len;
        unsigned char *raw = NULL;
        unsigned long w = 0, h = 0;
        bool dims = false, image = strncmp(mime, "image/", 6) == 0;
        char size[32], dimtext[48] = "";
        int rc;

        if (s && strcmp(mime, "image/svg+xml") != 0) {
                /* Base64: report the decoded size, read the header. */
                raw = cq_b64_decode(s, len, &bytes);
                if (raw)
                        dims = image_dims(raw, bytes, &w, &h);
                else
                        bytes = len / 4 * 3;
                free(raw);
        }
        format_size(size, sizeof(size), bytes);
        if (dims)
                snprintf(dimtext, sizeof(dimtext), "%lux%lu, ", w, h);
        if (image)
                rc = cq_buf_printf(out,
                                   "[image output %zu: %.100s, %s%s; shown to "
                                   "the user, you cannot see it]\n",
                                   index, mime, dimtext, size);
        else
                rc = cq_buf_printf(out, "[output %zu: %.100s, %s; not shown]\n",
                                   index, mime, size);
        return rc == CQ_OK ? 0 : -1;
}

/* text/html reduced to text: tags dropped (script and style with their
 * content), block ends as line breaks, table cells separated by tabs, the
 * common entities decoded, runs of blanks collapsed. */
static int html_to_text(cq_buf_t *out, const char *s, size_t len)
{
        static const struct {
                const char *name, *text;
        } entities[] = {{"&lt;", "<"},    {"&gt;", ">"},  {"&amp;", "&"},
                        {"&quot;", "\""}, {"&#39;", "'"}, {"&#x27;", "'"},
                        {"&nbsp;", " "}};
        size_t i = 0, k;
        char sep = 0; /* separator owed before the next text: ' ', \t, \n */

        while (i < len) {
                if (s[i] == '<') {
                        size_t end = i + 1;
                        const char *tag = s + i + 1;
                        bool closing = *tag == '/';

                        while (end < len && s[end] != '>')
                                end++;
                        if (closing)
                                tag++;
                        if (!closing && (strncasecmp(tag, "script", 6) == 0 ||
                                         strncasecmp(tag, "style", 5) == 0)) {
                                const char *close =
                                    strncasecmp(tag, "script", 6) == 0
                                        ? "</script"
                                        : "</style";
                                size_t clen = strlen(close);

                                while (
                                    end < len &&
                                    !(end + clen <= len &&
                                      strncasecmp(s + end, close, clen) == 0))
                                        end++;
                                while (end < len && s[end] != '>')
                                        end++;
                        }
                        if (strncasecmp(tag, "br", 2) == 0 ||
                            (closing && (strncasecmp(tag, "p", 1) == 0 ||
                                         strncasecmp(tag, "div", 3) == 0 ||
                                         strncasecmp(tag, "tr", 2) == 0 ||
                                         strncasecmp(tag, "li", 2) == 0 ||
                                         strncasecmp(tag, "table", 5) == 0 ||
                                         ((tag[0] == 'h' || tag[0] == 'H') &&
                                          tag[1] >= '1' && tag[1] <= '6'))))
                                sep = '\n';
                        else if (closing && sep != '\n' &&
                                 (strncasecmp(tag, "td", 2) == 0 ||
                                  strncasecmp(tag, "th", 2) == 0))
                                sep = '\t';
                        i = end < len ? end + 1 : len;
                        continue;
                }
                if (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' ||
                    s[i] == '\r') {
                        if (!sep)
                                sep = ' ';
                        i++;
                        continue;
                }
                if (sep && out->len && cq_buf_append(out, &sep, 1))
                        return -1;
                sep = 0;
                if (s[i] == '&') {
                        for (k = 0; k < CQ_ARRAY_SIZE(entities); k++) {
                                size_t elen = strlen(entities[k].name);

                                if (i + elen <= len &&
                                    memcmp(s + i, entities[k].name, elen) == 0)
                                        break;
                        }
                        if (k < CQ_ARRAY_SIZE(entities)) {
                                if (cq_buf_append_str(out, entities[k].text))
                                        return -1;
                                i += strlen(entities[k].name);
                                continue;
                        }
                }
                if (cq_buf_append(out, s + i, 1))
                        return -1;
                i++;
        }
        return 0;
}

/* One execute_result or display_data bundle. Text is preferred (plain,
 * then HTML reduced, then JSON, then other text types); images are described,
 * never sent. */
static int append_bundle(cq_buf_t *out,
                         const char *label,
                         size_t index,
                         const json_t *data,
                         const cq_tooltext_opts_t *opts)
{
        static const char *const text_pref[] = {"text/plain", "text/markdown",
                                                "text/latex"};
        const json_t *value;
        const char *mime;
        cq_buf_t tmp;
        size_t i;
        int rc = -1;
        bool any_image = false;

        cq_buf_init(&tmp, TT_BUF_MAX);
        json_object_foreach((json_t *)(uintptr_t)data, mime, value)
        {
                if (strncmp(mime, "image/", 6) == 0) {
                        if (append_binary(out, index, mime, value))
                                goto out;
                        any_image = true;
                }
        }
        if (any_image) {
                rc = 0; /* the text/plain of a figure is only its repr */
                goto out;
        }
        value = json_object_get(data, "text/plain");
        if (json_is_string(value)) {
                rc = append_block(out, label, json_string_value(value),
                                  json_string_length(value), opts->item_head,
                                  opts->item_tail);
                goto out;
        }
        value = json_object_get(data, "text/html");
        if (json_is_string(value)) {
                if (html_to_text(&tmp, json_string_value(value),
                                 json_string_length(value)))
                        goto out;
                rc = append_block(out, label, tmp.data ? tmp.data : "", tmp.len,
                                  opts->item_head, opts->item_tail);
                goto out;
        }
        json_object_foreach((json_t *)(uintptr_t)data, mime, value)
        {
                char *text;

                if (!is_json_mime(mime))
                        continue;
                text = json_dumps(value, JSON_ENCODE_ANY);
                if (!text)
                        goto out;
                rc = append_block(out, label, text, strlen(text),
                                  opts->item_head, opts->item_tail);
                free(text);
                goto out;
        }
        for (i = 0; i < CQ_ARRAY_SIZE(text_pref); i++) {
                value = json_object_get(data, text_pref[i]);
                if (json_is_string(value)) {
                        rc = append_block(out, label, json_string_value(value),
                                          json_string_length(value),
                                          opts->item_head, opts->item_tail);
                        goto out;
                }
        }
        json_object_foreach((json_t *)(uintptr_t)data, mime, value)
        {
                if (strncmp(mime, "text/", 5) == 0 && json_is_string(value)) {
                        rc = append_block(out, label, json_string_value(value),
                                          json_string_length(value),
                                          opts->item_head, opts->item_tail);
                        goto out;
                }
        }
        /* Nothing readable: name what there was. */
        json_object_foreach((json_t *)(uintptr_t)data, mime, value)
        {
                if (append_binary(out, index, mime, value))
                        goto out;
        }
        rc = 0;
out:
        cq_buf_release(&tmp);
        return rc;
}

static bool all_dashes(const char *s)
{
        if (!*s)
                return false;
        while (*s == '-')
                s++;
        return *s == '\0';
}

/* "[error]\nName: value\n" and the traceback, bounded (its tail matters
 * most), without IPython's ruler line and without repeating the last line
 * when it only restates "Name: value". */
static int append_error(cq_buf_t *out,
                        const json_t *output,
                        const cq_tooltext_opts_t *opts,
                        bool with_label)
{
        const char *ename = json_string_value(json_object_get(output, "ename"));
        const char *evalue =
            json_string_value(json_object_get(output, "evalue"));
        const json_t *tb = json_object_get(output, "traceback");
        cq_buf_t head, trace;
        size_t i, n = json_array_size(tb);
        int rc = -1;

        cq_buf_init(&head, TT_BUF_MAX);
        cq_buf_init(&trace, TT_BUF_MAX);
        if (cq_buf_printf(&head, "%s: %s", ename ? ename : "Error",
                          evalue ? evalue : ""))
                goto out;
        if (with_label && cq_buf_append_str(out, "[error]\n"))
                goto out;
        if (append_block(out, NULL, head.data, head.len, opts->item_head,
                         opts->item_tail))
                goto out;
        for (i = 0; i < n; i++) {
                const json_t *value = json_array_get(tb, i);
                size_t len;
                char *line;

                if (!json_is_string(value))
                        continue;
                line = cq_ansi_strip(json_string_value(value),
                                     json_string_length(value), &len);
                if (!line)
                        goto out;
                while (len > 0 && line[len - 1] == '\n')
                        line[--len] = '\0';
                if (all_dashes(line) ||
                    (i + 1 == n && strcmp(line, head.data) == 0)) {
                        free(line);
                        continue;
                }
                if ((trace.len && cq_buf_append_str(&trace, "\n")) ||
                    cq_buf_append(&trace, line, len)) {
                        free(line);
                        goto out;
                }
                free(line);
        }
        if (trace.len && append_block(out, NULL, trace.data, trace.len,
                                      opts->error_head, opts->error_tail))
                goto out;
        rc = 0;
out:
        cq_buf_release(&head);
        cq_buf_release(&trace);
        return rc;
}

static const char *stream_label(const char *name)
{
        return name ? name : "stream";
}

/* The outputs in order, each bounded. */
static int append_outputs(cq_buf_t *out,
                          const cq_cell_result_t *res,
                          const cq_tooltext_opts_t *opts)
{
        const json_t *outputs = res->outputs;
        size_t i = 0, n = json_array_size(outputs);
        cq_buf_t stream;
        int rc = -1;

        cq_buf_init(&stream, TT_BUF_MAX);
        while (i < n) {
                const json_t *output = json_array_get(outputs, i);
                const char *type =
                    json_string_value(json_object_get(output, "output_type"));

                if (!type) {
                        i++;
                        continue;
                }
                if (strcmp(type, "stream") == 0) {
                        const char *name =
                            json_string_value(json_object_get(output, "name"));
                        size_t j = i;

                        /* Merge a run of one stream's pieces. */
                        cq_buf_reset(&stream);
                        for (; j < n; j++) {
                                const json_t *o = json_array_get(outputs, j);
                                const char *t = json_string_value(
                                    json_object_get(o, "output_type"));
                                const char *nm = json_string_value(
                                    json_object_get(o, "name"));
                                const json_t *text = json_object_get(o, "text");

                                if (!t || strcmp(t, "stream") != 0 ||
                                    (nm != name &&
                                     (!nm || !name || strcmp(nm, name) != 0)))
                                        break;
                                if (json_is_string(text) &&
                                    cq_buf_append(&stream,
                                                  json_string_value(text),
                                                  json_string_length(text)))
                                        goto out;
                        }
                        if (append_block(out, stream_label(name),
                                         stream.data ? stream.data : "",
                                         stream.len, opts->item_head,
                                         opts->item_tail))
                                goto out;
                        i = j;
                        continue;
                }
                if (strcmp(type, "execute_result") == 0 ||
                    strcmp(type, "display_data") == 0) {
                        const json_t *data = json_object_get(output, "data");

                        if (json_is_object(data) &&
                            append_bundle(out,
                                          strcmp(type, "execute_result") == 0
                                              ? "result"
                                              : "display",
                                          i + 1, data, opts))
                                goto out;
                } else if (strcmp(type, "error") == 0) {
                        if (append_error(out, output, opts, true))
                                goto out;
                }
                i++;
        }
        rc = 0;
out:
        cq_buf_release(&stream);
        return rc;
}

/* Plain-words notes on how the cell ended; they are never cut. */
static int append_notes(cq_buf_t *out, const cq_cell_result_t *res)
{
        if (res->truncated &&
            cq_buf_append_str(out, "[output truncated] This cell printed more "
                                   "than the output limit; the part beyond "
                                   "it was dropped before it reached you.\n"))
                return -1;
        switch (res->status) {
        case CQ_CELL_TIMEOUT:
                if (res->duration_ms > 0
                        ? cq_buf_printf(out,
                                        "[timeout] The cell was stopped after "
                                        "%.1f s because it exceeded the time "
                                        "limit for one cell.\n",
                                        (double)res->duration_ms / 1000.0)
                        : cq_buf_append_str(out,
                                            "[timeout] The cell was stopped "
                                            "because it exceeded the time "
                                            "limit for one cell.\n"))
                        return -1;
                break;
        case CQ_CELL_DIED:
                if (cq_buf_append_str(
                        out, "[kernel died] The Python process running the "
                             "cell died (for example os._exit(), a crash in "
                             "native code, or running out of memory).\n"))
                        return -1;
                break;
        case CQ_CELL_CANCELLED:
                if (cq_buf_append_str(out, "[cancelled] The job was cancelled "
                                           "while this cell was running, so "
                                           "the cell was interrupted.\n"))
                        return -1;
                break;
        case CQ_CELL_OK:
        case CQ_CELL_ERROR:
                break;
        }
        if (res->state_lost &&
            cq_buf_append_str(out,
                              "[kernel restarted] A fresh Python kernel was "
                              "started: all variables, imports and functions "
                              "defined by earlier cells are gone and must be "
                              "recomputed. Files written to the working "
                              "directory are still there.\n"))
                return -1;
        return 0;
}

/* Take a finished buffer, checking that it is valid UTF-8. */
static char *finish(cq_buf_t *out, size_t *lenp)
{
        size_t len;
        char *text = cq_buf_take(out, &len);
        char *fixed;

        cq_buf_release(out);
        if (!text)
                return NULL;
        if (!cq_utf8_valid(text, len)) {
                /* Unreachable with jansson strings; kept for safety. */
                fixed = cq_utf8_repair(text, len, &len);
                free(text);
                text = fixed;
        }
        if (text && lenp)
                *lenp = len;
        return text;
}

char *cq_tooltext_format(const cq_cell_result_t *res,
                         const cq_tooltext_opts_t *opts,
                         size_t *lenp)
{
        cq_tooltext_opts_t defaults;
        cq_buf_t body, out;

        opts = opts_or_default(opts, &defaults);
        cq_buf_init(&body, TT_BUF_MAX);
        cq_buf_init(&out, TT_BUF_MAX);
        if (append_outputs(&body, res, opts))
                goto fail;
        if (body.len == 0 && res->status == CQ_CELL_OK &&
            cq_buf_append_str(&body, "[no output]\n"))
                goto fail;
        if (append_bounded(&out, body.data ? body.data : "", body.len,
                           opts->total_head, opts->total_tail,
                           " from the middle of this cell's output") ||
            append_notes(&out, res))
                goto fail;
        cq_buf_release(&body);
        return finish(&out, lenp);
fail:
        cq_buf_release(&body);
        cq_buf_release(&out);
        return NULL;
}

/* A Markdown fence longer than any backtick run in code. */
static size_t fence_len(const char *code)
{
        size_t run = 0, best = 0;

        for (; *code; code++) {
                run = *code == '`' ? run + 1 : 0;
                if (run > best)
                        best = run;
        }
        return best < 3 ? 3 : best + 1;
}

static int append_fence(cq_buf_t *out, size_t n, const char *info)
{
        size_t i;

        for (i = 0; i < n; i++)
                if (cq_buf_append_str(out, "`"))
                        return -1;
        return cq_buf_printf(out, "%s\n", info) == CQ_OK ? 0 : -1;
}

char *cq_tooltext_reflection(const cq_cell_result_t *res,
                             const char *code,
                             const cq_tooltext_opts_t *opts,
                             size_t *lenp)
{
        cq_tooltext_opts_t defaults;
        cq_buf_t out, what;
        const char *checklist;
        size_t i, fence;

        opts = opts_or_default(opts, &defaults);
        code = code ? code : "";
        cq_buf_init(&out, TT_BUF_MAX);
        cq_buf_init(&what, TT_BUF_MAX);
        for (i = 0; i < json_array_size(res->outputs); i++) {
                const json_t *output = json_array_get(res->outputs, i);
                const char *type =
                    json_string_value(json_object_get(output, "output_type"));

                if (type && strcmp(type, "error") == 0 &&
                    append_error(&what, output, opts, false))
                        goto fail;
        }
        if (append_notes(&what, res))
                goto fail;
        switch (res->status) {
        case CQ_CELL_TIMEOUT:
                checklist = "Before you retry, check:\n"
                            "1. loops that never end or run far longer than "
                            "needed;\n"
                            "2. work that numpy or pandas can do vectorised, "
                            "or that can be tried on a sample of the data "
                            "first;\n"
                            "3. code that waits for input, a network "
                            "resource or a lock.\n";
                break;
        case CQ_CELL_DIED:
                checklist = "Before you retry, check:\n"
                            "1. memory use: load less data, use smaller "
                            "dtypes or process the data in chunks;\n"
                            "2. calls that end the process, such as "
                            "os._exit(), or native code that can crash.\n";
                break;
        case CQ_CELL_OK:
        case CQ_CELL_ERROR:
        case CQ_CELL_CANCELLED:
        default:
                checklist = "Before you retry, check:\n"
                            "1. syntax errors and typos;\n"
                            "2. missing imports;\n"
                            "3. wrong variable names, types or shapes;\n"
                            "4. file paths: the job's files are in the "
                            "current working directory, so use relative "
                            "paths;\n"
                            "5. anything else the error points to.\n";
                break;
        }
        if (cq_buf_append_str(&out, res->status == CQ_CELL_ERROR
                                        ? "The code failed with this error:\n\n"
                                        : "The code did not finish:\n\n") ||
            cq_buf_append(&out, what.data ? what.data : "", what.len) ||
            (what.len == 0 &&
             cq_buf_append_str(&out, "(no error message)\n")) ||
            cq_buf_append_str(&out, "\n") ||
            cq_buf_append_str(&out, checklist) ||
            cq_buf_append_str(
                &out, "If the same approach keeps failing, split the code "
                      "into smaller steps, simplify it or try a different "
                      "method. Do not ask the user for anything: fix the "
                      "problem yourself.\n\nThe code that failed:\n"))
                goto fail;
        fence = fence_len(code);
        if (append_fence(&out, fence, "python") ||
            append_bounded(&out, code, strlen(code), opts->code_head,
                           opts->code_tail, "") ||
            (out.data[out.len - 1] != '\n' && cq_buf_append_str(&out, "\n")) ||
            append_fence(&out, fence, "") ||
            cq_buf_append_str(&out, "\nCall execute_code again with the "
                                    "corrected code.\n"))
                goto fail;
        cq_buf_release(&what);
        return finish(&out, lenp);
fail:
        cq_buf_release(&what);
        cq_buf_release(&out);
        return NULL;
}

/* "  label value\n": the value cleaned, bounded, and its continuation lines
 * indented under the label. */
static int append_value(cq_buf_t *out,
                        const char *label,
                        const char *value,
                        size_t head,
                        size_t tail)
{
        cq_buf_t clean, bounded;
        size_t i;
        int rc = -1;

        cq_buf_init(&clean, TT_BUF_MAX);
        cq_buf_init(&bounded, TT_BUF_MAX);
        if (clean_text(&clean, value, strlen(value)) ||
            append_bounded(&bounded, clean.data ? clean.data : "", clean.len,
                           head, tail, "") ||
            cq_buf_printf(out, "  %s", label))
                goto out;
        for (i = 0; i < bounded.len; i++) {
                if (cq_buf_append(out, bounded.data + i, 1))
                        goto out;
                if (bounded.data[i] == '\n' && i + 1 < bounded.len &&
                    cq_buf_append_str(out, "    "))
                        goto out;
        }
        if (out->data[out->len - 1] != '\n' && cq_buf_append_str(out, "\n"))
                goto out;
        rc = 0;
out:
        cq_buf_release(&clean);
        cq_buf_release(&bounded);
        return rc;
}

char *cq_tooltext_test_feedback(const char *function,
                                size_t passed,
                                size_t total,
                                const cq_test_failure_t *failures,
                                size_t nfailures,
                                const cq_tooltext_opts_t *opts,
                                size_t *lenp)
{
        cq_tooltext_opts_t defaults;
        cq_buf_t body, out;
        size_t i, shown;

        opts = opts_or_default(opts, &defaults);
        cq_buf_init(&body, TT_BUF_MAX);
        cq_buf_init(&out, TT_BUF_MAX);
        shown = nfailures < opts->max_failures ? nfailures : opts->max_failures;
        if (cq_buf_printf(&body,
                          "Your final answer was checked against the job's "
                          "tests: %zu of %zu passed.\n%s",
                          passed, total, shown ? "\n" : ""))
                goto fail;
        for (i = 0; i < shown; i++) {
                const cq_test_failure_t *f = &failures[i];

                if (f->index == 0
                        ? cq_buf_append_str(&body, "The test code failed")
                        : cq_buf_printf(&body, "Case %zu failed", f->index))
                        goto fail;
                if (f->call && cq_buf_printf(&body, ": %s", f->call))
                        goto fail;
                if (cq_buf_append_str(&body, "\n") ||
                    (f->expected &&
                     append_value(&body, "expected: ", f->expected,
                                  opts->item_head, opts->item_tail)) ||
                    (f->got && append_value(&body, "got:      ", f->got,
                                            opts->item_head, opts->item_tail)))
                        goto fail;
                if (f->error &&
                    append_value(&body, "raised:\n    ", f->error,
                                 opts->error_head, opts->error_tail))
                        goto fail;
        }
        if (nfailures > shown &&
            cq_buf_printf(&body, "... and %zu more failed case%s.\n",
                          nfailures - shown, nfailures - shown == 1 ? "" : "s"))
                goto fail;
        if (append_bounded(&out, body.data, body.len, opts->total_head,
                           opts->total_tail, " from the test report"))
                goto fail;
        if (function
                ? cq_buf_printf(&out,
                                "\nFix `%.128s` so that every test passes: "
                                "run the corrected definition with "
                                "execute_code, try it on the failing cases, "
                                "then give your final answer again.\n",
                                function)
                : cq_buf_append_str(&out,
                                    "\nFix the code so that the test code "
                                    "passes: run the corrected code with "
                                    "execute_code, check it, then give your "
                                    "final answer again.\n"))
                goto fail;
        cq_buf_release(&body);
        return finish(&out, lenp);
fail:
        cq_buf_release(&body);
        cq_buf_release(&out);
        return NULL;
}
