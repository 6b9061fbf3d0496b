/* SPDX-License-Identifier: MIT */
/* html.c - what both pages of the run report use: escaping, page names,
 * the page being written (html_int.h), its head with the policy, and JSON
 * values formatted for people. The index is html_index.c, a job's page
 * html_job.c. Every string from a job goes through cq_html_escape(). */
#include "coderq/cli/html.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/clifmt.h"
#include "coderq/common/util.h"
#include "html_int.h"

/* ------------------------------------------------------------ escaping */

/* Length of the valid UTF-8 sequence at p (2..4 bytes), or 0. */
static size_t utf8_len(const unsigned char *p, size_t avail)
{
        unsigned c = p[0];
        unsigned lo = 0x80, hi = 0xbf;
        size_t n, i;

        if (c >= 0xc2 && c <= 0xdf)
                n = 2;
        else if (c >= 0xe0 && c <= 0xef)
                n = 3;
        else if (c >= 0xf0 && c <= 0xf4)
                n = 4;
        else
                return 0;
        if (n > avail)
                return 0;
        /* The second byte's range rules out overlongs, surrogates and
         * code points above U+10FFFF. */
        if (c == 0xe0)
                lo = 0xa0;
        else if (c == 0xed)
                hi = 0x9f;
        else if (c == 0xf0)
                lo = 0x90;
        else if (c == 0xf4)
                hi = 0x8f;
        if (p[1] < lo || p[1] > hi)
                return 0;
        for (i = 2; i < n; i++)
                if (p[i] < 0x80 || p[i] > 0xbf)
                        return 0;
        return n;
}

cq_err_t cq_html_escape(cq_buf_t *buf, const char *s, size_t len)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t i = 0, start = 0;
        cq_err_t err = CQ_OK;

        if (!s)
                return CQ_OK;
        while (i < len && err == CQ_OK) {
                unsigned c = p[i];
                char pic[4];
                const char *rep;
                size_t n = 1;

                if (c >= 0x80) {
                        n = utf8_len(p + i, len - i);
                        if (n) {
                                i += n;
                                continue;
                        }
                        n = 1;
                        rep = "\xef\xbf\xbd";
                } else if (c == '&') {
                        rep = "&amp;";
                } else if (c == '<') {
                        rep = "&lt;";
                } else if (c == '>') {
                        rep = "&gt;";
                } else if (c == '"') {
                        rep = "&quot;";
                } else if (c == '\'') {
                        rep = "&#39;";
                } else if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') ||
                           c == 0x7f) {
                        /* U+2400 + c, and U+2421 for DEL */
                        pic[0] = (char)0xe2;
                        pic[1] = (char)0x90;
                        pic[2] = (char)(c == 0x7f ? 0xa1 : 0x80 + c);
                        pic[3] = '\0';
                        rep = pic;
                } else {
                        i++;
                        continue;
                }
                if (i > start)
                        err = cq_buf_append(buf, s + start, i - start);
                if (err == CQ_OK)
                        err = cq_buf_append_str(buf, rep);
                i += n;
                start = i;
        }
        if (err == CQ_OK && i > start)
                err = cq_buf_append(buf, s + start, i - start);
        return err;
}

cq_err_t cq_html_term(cq_buf_t *buf, const char *s, size_t len)
{
        char *plain;
        size_t n = 0;
        cq_err_t err;

        if (!s)
                return CQ_OK;
        plain = cq_ansi_strip(s, len, &n);
        if (!plain)
                return CQ_ERR_FATAL;
        err = cq_html_escape(buf, plain, n);
        free(plain);
        return err;
}

/* ---------------------------------------------------------- page names */

void cq_html_page_name(const char *job_id, char out[CQ_HTML_NAME_MAX])
{
        char hex[65], safe[49];
        size_t i, n = 0;

        cq_sha256_hex(job_id, strlen(job_id), hex);
        for (i = 0; job_id[i] && n < sizeof(safe) - 1; i++) {
                unsigned char c = (unsigned char)job_id[i];

                safe[n++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                    (c >= '0' && c <= '9') || c == '-' ||
                                    c == '_'
                                ? (char)c
                                : '_';
        }
        safe[n] = '\0';
        snprintf(out, CQ_HTML_NAME_MAX, "job-%s-%.12s.html", safe, hex);
}

static int cmp_name(const void *a, const void *b)
{
        const char *const *x = a, *const *y = b;
        int c = strcmp(*x, *y);

        /* ties in input order, so the first id keeps the plain name */
        return c ? c : (*x < *y ? -1 : *x > *y);
}

int cq_html_page_names(const char *const *job_ids,
                       size_t n,
                       char (*names)[CQ_HTML_NAME_MAX])
{
        char **order;
        size_t i, run = 0;

        for (i = 0; i < n; i++)
                cq_html_page_name(job_ids[i], names[i]);
        if (n < 2)
                return 0;
        order = malloc(n * sizeof(*order));
        if (!order)
                return -1;
        for (i = 0; i < n; i++)
                order[i] = names[i];
        qsort(order, n, sizeof(*order), cmp_name);
        /* A variant ends in "-<k>.html", whose last dash-separated part is
         * not 12 hex digits: it can equal no plain name, and variants of
         * different plain names differ. */
        for (i = 1; i < n; i++) {
                /* a plain name is at most "job-" + 48 + "-" + 12 +
                 * ".html": its stem fits 65 bytes */
                char stem[66];
                size_t len;

                if (strcmp(order[i], order[i - 1 - run]) != 0) {
                        run = 0;
                        continue;
                }
                run++;
                len = strlen(order[i]) - 5; /* ".html" */
                if (len >= sizeof(stem))
                        len = sizeof(stem) - 1;
                memcpy(stem, order[i], len);
                stem[len] = '\0';
                snprintf(order[i], CQ_HTML_NAME_MAX, "%s-%zu.html", stem,
                         run + 1);
        }
        free(order);
        return 0;
}

/* -------------------------------------------------------------- output */

void html_put(html_out_t *o, const char *markup)
{
        if (o->err == CQ_OK)
                o->err = cq_buf_append_str(o->buf, markup);
}

void html_putf(html_out_t *o, const char *fmt, ...)
{
        char text[512];
        va_list ap;
        int n;

        if (o->err != CQ_OK)
                return;
        va_start(ap, fmt);
        n = vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n >= sizeof(text)) {
                o->err = CQ_ERR_FATAL; /* our own markup: a bug */
                return;
        }
        o->err = cq_buf_append(o->buf, text, (size_t)n);
}

void html_escn(html_out_t *o, const char *s, size_t len)
{
        if (o->err == CQ_OK)
                o->err = cq_html_escape(o->buf, s, len);
}

void html_esc(html_out_t *o, const char *s)
{
        if (s)
                html_escn(o, s, strlen(s));
}

void html_esc_json(html_out_t *o, const json_t *str)
{
        if (json_is_string(str))
                html_escn(o, json_string_value(str), json_string_length(str));
}

void html_oom(html_out_t *o)
{
        if (o->err == CQ_OK)
                o->err = CQ_ERR_FATAL;
}

void html_put_json(html_out_t *o, const json_t *v, size_t flags, size_t max)
{
        char *text = json_dumps(v, flags | JSON_ENCODE_ANY);
        size_t len;

        if (!text) {
                html_oom(o);
                return;
        }
        len = strlen(text);
        if (max && len > max) {
                html_escn(o, text, max);
                html_putf(o, "\n[... %zu more bytes not shown ...]", len - max);
        } else {
                html_escn(o, text, len);
        }
        free(text);
}

/* ----------------------------------------------------- style and script */

/* The stylesheet is report.css and the index's script report.js, both
 * built in (html_int.h). The script sorts and filters the index's table
 * and shows the columns chosen. It reads the table from the DOM (cells'
 * text, data-s text and data-v numbers), compares what the fragment
 * names only to column keys and option values, and writes only text and
 * attributes (hidden, aria-sort): no job text is ever code there.
 * data-report="ready" on <html> says it ran and the stylesheet applied
 * (tests read it). */

/* 'sha256-<base64>' of \p text for the Content-Security-Policy. */
static void put_csp_hash(html_out_t *o, const char *text)
{
        char hex[65];
        unsigned char raw[32];
        char *b64;
        size_t i;

        cq_sha256_hex(text, strlen(text), hex);
        for (i = 0; i < sizeof(raw); i++) {
                unsigned hi =
                    (unsigned)(hex[2 * i] <= '9' ? hex[2 * i] - '0'
                                                 : hex[2 * i] - 'a' + 10);
                unsigned lo = (unsigned)(hex[2 * i + 1] <= '9'
                                             ? hex[2 * i + 1] - '0'
                                             : hex[2 * i + 1] - 'a' + 10);

                raw[i] = (unsigned char)(hi << 4 | lo);
        }
        b64 = cq_b64_encode(raw, sizeof(raw), NULL);
        if (!b64) {
                html_oom(o);
                return;
        }
        html_putf(o, "'sha256-%s'", b64);
        free(b64);
}

void html_page_start(html_out_t *o, const char *title, bool script)
{
        html_put(o, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n"
                    "<meta charset=\"utf-8\">\n"
                    "<meta http-equiv=\"Content-Security-Policy\" "
                    "content=\"default-src 'none'; img-src data:; style-src ");
        put_csp_hash(o, cq_html_report_css);
        html_put(o, "; script-src ");
        if (script)
                put_csp_hash(o, cq_html_report_js);
        else
                html_put(o, "'none'");
        html_put(o, "; base-uri 'none'; form-action 'none'\">\n"
                    "<meta name=\"referrer\" content=\"no-referrer\">\n"
                    "<meta name=\"viewport\" content=\"width=device-width, "
                    "initial-scale=1\">\n"
                    "<link rel=\"icon\" href=\"data:,\">\n<title>");
        html_esc(o, title);
        html_put(o, "</title>\n<style>");
        html_put(o, cq_html_report_css);
        html_put(o, "</style>\n</head>\n<body>\n");
}

void html_page_end(html_out_t *o, bool script)
{
        html_put(o, "</main>\n");
        if (script) {
                html_put(o, "<script>");
                html_put(o, cq_html_report_js);
                html_put(o, "</script>\n");
        }
        html_put(o, "</body>\n</html>\n");
}

/* ---------------------------------------------------------- formatting */

static bool ends_with(const char *s, const char *tail)
{
        size_t n = strlen(s), m = strlen(tail);

        return n >= m && strcmp(s + n - m, tail) == 0;
}

const char *const html_statuses[5] = {"succeeded", "failed", "cancelled",
                                      "running", "queued"};

/* The class a code names: itself when \p known (n of them) has it, so
 * that only known codes name classes, else \p other. */
static const char *
code_class(const char *const *known, size_t n, const char *s, const char *other)
{
        size_t i;

        for (i = 0; s && i < n; i++)
                if (strcmp(s, known[i]) == 0)
                        return known[i];
        return other;
}

void html_put_status(html_out_t *o, const char *status)
{
        html_putf(o, "<span class=\"badge s-%s\">",
                  code_class(html_statuses, CQ_ARRAY_SIZE(html_statuses),
                             status, "other"));
        html_esc(o, status ? status : "unknown");
        html_put(o, "</span>");
}

void html_put_none(html_out_t *o)
{
        html_put(o, "<span class=\"muted\">-</span>");
}

const char *const html_verdicts[8] = {
    "passed",       "wrong_answer", "runtime_error", "timeout",
    "syntax_error", "no_answer",    "stuck",         "infra_error"};

const char *html_verdict_class(const char *verdict)
{
        return code_class(html_verdicts, CQ_ARRAY_SIZE(html_verdicts), verdict,
                          "none");
}

void html_put_verdict(html_out_t *o, const json_t *row)
{
        const char *verdict =
            json_string_value(json_object_get(row, "verdict"));
        const char *code =
            json_string_value(json_object_get(row, "reason_code"));
        const json_t *reason = json_object_get(row, "reason");

        if (!verdict && !code) {
                html_put_none(o);
                return;
        }
        html_putf(o, "<span class=\"verdict v-%s\"",
                  html_verdict_class(verdict));
        if (json_is_string(reason)) {
                html_put(o, " title=\"");
                html_esc_json(o, reason);
                html_put(o, "\"");
        }
        html_put(o, ">");
        html_esc(o, verdict ? verdict : code);
        html_put(o, "</span>");
}

/* The bytes of the character at p[0]: a valid UTF-8 sequence, else one
 * (an invalid byte prints as one U+FFFD). */
static size_t char_len(const unsigned char *p, size_t avail)
{
        size_t n = p[0] >= 0x80 ? utf8_len(p, avail) : 1;

        return n ? n : 1;
}

void html_put_short(html_out_t *o, const char *s, size_t max)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t len, i, n = 0, k = 0, head = 0, tail = 0, keep;

        if (!s)
                return;
        len = strlen(s);
        for (i = 0; i < len; i += char_len(p + i, len - i))
                n++;
        if (n <= max || max < 4) {
                html_escn(o, s, len);
                return;
        }
        /* a third of the end: it tells retries (~r2) and samples (~s3)
         * of one id apart */
        keep = (max - 1) / 3;
        for (i = 0; i < len; i += char_len(p + i, len - i), k++) {
                if (k == max - 1 - keep)
                        head = i;
                if (k == n - keep)
                        tail = i;
        }
        html_escn(o, s, head);
        html_put(o, "\xe2\x80\xa6"); /* U+2026 HORIZONTAL ELLIPSIS */
        html_escn(o, s + tail, len - tail);
}

/* A number named \p key for people: durations (keys ending in _ms),
 * rates (0..1, as percentages: _rate, pass@k and pass^k), costs,
 * percentages, plain numbers. */
static void put_number(html_out_t *o, const char *key, const json_t *v)
{
        double x = json_number_value(v);
        char text[64];
        cq_buf_t tmp;

        if (ends_with(key, "_ms")) {
                cq_fmt_duration(text, sizeof(text), (long long)x);
                html_esc(o, text);
        } else if (ends_with(key, "_rate") ||
                   strncmp(key, "pass_at_", 8) == 0 ||
                   strncmp(key, "pass_hat_", 9) == 0) {
                html_putf(o, "%.1f%%", x * 100.0);
        } else if (ends_with(key, "_pct")) {
                html_putf(o, "%.1f%%", x);
        } else if (ends_with(key, "_usd") || strcmp(key, "cost") == 0) {
                html_putf(o, "$%.4f", x);
        } else {
                cq_buf_init(&tmp, 128);
                if (cq_fmt_scalar(&tmp, v) != CQ_OK)
                        html_oom(o);
                else
                        html_esc(o, tmp.data ? tmp.data : "");
                cq_buf_release(&tmp);
        }
}

void html_put_label(html_out_t *o, const char *key)
{
        size_t i;
        char c[2] = {0, 0};

        for (i = 0; key[i] && o->err == CQ_OK; i++) {
                c[0] = key[i] == '_' ? ' ' : key[i];
                html_escn(o, c, 1);
        }
}

void html_put_kv(html_out_t *o,
                 const json_t *obj,
                 const char *const *skip,
                 int depth)
{
        const char *key;
        const json_t *v;
        size_t i;

        html_put(o, "<dl class=\"kv\">\n");
        json_object_foreach((json_t *)(uintptr_t)obj, key, v)
        {
                bool skipped = false;

                for (i = 0; skip && skip[i]; i++)
                        skipped = skipped || strcmp(skip[i], key) == 0;
                if (skipped)
                        continue;
                html_put(o, "<dt>");
                html_put_label(o, key);
                html_put(o, "</dt><dd>");
                html_put_value(o, key, v, depth + 1);
                html_put(o, "</dd>\n");
        }
        html_put(o, "</dl>\n");
}

/* An array of objects as a table whose columns are the union of their
 * keys (in first-seen order). */
static void put_object_table(html_out_t *o, const json_t *arr, int depth)
{
        json_t *keys = json_object(); /* key -> true, in first-seen order */
        const json_t *row, *v;
        const char *key;
        size_t i;

        if (!keys) {
                html_oom(o);
                return;
        }
        json_array_foreach(arr, i, row)
        {
                json_object_foreach((json_t *)(uintptr_t)row, key, v)
                {
                        if (!json_object_get(keys, key) &&
                            json_object_set_new(keys, key, json_true()))
                                html_oom(o);
                }
        }
        html_put(o, "<table>\n<thead><tr>");
        json_object_foreach(keys, key, v)
        {
                html_put(o, "<th>");
                html_put_label(o, key);
                html_put(o, "</th>");
        }
        html_put(o, "</tr></thead>\n<tbody>\n");
        json_array_foreach(arr, i, row)
        {
                const char *k;
                const json_t *unused;

                html_put(o, "<tr>");
                json_object_foreach(keys, k, unused)
                {
                        html_put(o, "<td>");
                        html_put_value(o, k, json_object_get(row, k),
                                       depth + 1);
                        html_put(o, "</td>");
                }
                html_put(o, "</tr>\n");
        }
        html_put(o, "</tbody>\n</table>\n");
        json_decref(keys);
}

static bool all_objects(const json_t *arr)
{
        const json_t *v;
        size_t i;

        json_array_foreach(arr, i, v) if (!json_is_object(v)) return false;
        return json_array_size(arr) > 0;
}

void html_put_value(html_out_t *o, const char *key, const json_t *v, int depth)
{
        const json_t *item;
        size_t i;

        if (!v || json_is_null(v)) {
                html_put_none(o);
        } else if (json_is_true(v)) {
                html_put(o, "yes");
        } else if (json_is_false(v)) {
                html_put(o, "no");
        } else if (json_is_number(v)) {
                put_number(o, key, v);
        } else if (json_is_string(v) && strcmp(key, "status") == 0) {
                html_put_status(o, json_string_value(v));
        } else if (json_is_string(v) && strcmp(key, "verdict") == 0) {
                html_putf(o, "<span class=\"verdict v-%s\">",
                          html_verdict_class(json_string_value(v)));
                html_esc_json(o, v);
                html_put(o, "</span>");
        } else if (json_is_string(v)) {
                html_esc_json(o, v);
        } else if (depth >= HTML_MAX_DEPTH) {
                html_put(o, "<code>");
                html_put_json(o, v, JSON_COMPACT, 4096);
                html_put(o, "</code>");
        } else if (json_is_object(v)) {
                if (json_object_size(v) == 0)
                        html_put_none(o);
                else
                        html_put_kv(o, v, NULL, depth);
        } else if (all_objects(v)) {
                put_object_table(o, v, depth);
        } else if (json_array_size(v) == 0) {
                html_put_none(o);
        } else {
                json_array_foreach(v, i, item)
                {
                        if (i)
                                html_put(o, ", ");
                        html_put_value(o, key, item, depth + 1);
                }
        }
}

void html_put_tests(html_out_t *o, const json_t *passed, const json_t *total)
{
        json_int_t p = json_integer_value(passed),
                   t = json_integer_value(total);

        if (!json_is_integer(passed) || !json_is_integer(total) || t <= 0) {
                html_put_none(o);
                return;
        }
        html_putf(o,
                  "<span class=\"%s\">%" JSON_INTEGER_FORMAT
                  "/%" JSON_INTEGER_FORMAT "</span>",
                  p == t ? "pass" : "fail", p, t);
}

void html_put_memory(html_out_t *o, const json_t *row)
{
        const json_t *src = json_object_get(row, "memory_source_job");

        if (json_is_true(json_object_get(row, "from_memory"))) {
                html_put(o, "from ");
                if (json_is_string(src))
                        html_esc_json(o, src);
                else
                        html_put(o, "?");
        } else if (json_is_string(src)) {
                html_put(o, "hint ");
                html_esc_json(o, src);
        } else {
                html_put_none(o);
        }
}

void html_put_card(html_out_t *o,
                   const char *label,
                   const char *key,
                   const json_t *v)
{
        html_put(o, "<div class=\"card\"><div class=\"v\">");
        html_put_value(o, key, v, HTML_MAX_DEPTH - 1);
        html_put(o, "</div><div class=\"k\">");
        html_esc(o, label);
        html_put(o, "</div></div>\n");
}
