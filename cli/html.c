/* SPDX-License-Identifier: MIT */
/* html.c - the pages of the run report: escaping, page names, the index
 * (summary, sortable and filterable table of jobs) and one page per job
 * (overview, answer, tests, transcript, notebook, images). Every string
 * from a job goes through cq_html_escape(); the script reads the table
 * from the DOM and never holds job text as code. */
#include "coderq/cli/html.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/clifmt.h"
#include "coderq/common/util.h"
#include "html_int.h"

/* Nested objects and arrays deeper than this print as compact JSON. */
#define MAX_DEPTH 4
/* Columns made for keys of the rows that the index does not know. */
#define MAX_EXTRA_COLS 16
/* The job message is shown up to this many bytes of its JSON. */
#define SPEC_SHOW_MAX (64 * 1024)

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

/* The page being written: the first error sticks and later writes are
 * skipped, so a renderer checks once at the end. */
typedef struct out {
        cq_buf_t *buf;
        cq_err_t err;
} out_t;

static void put(out_t *o, const char *markup)
{
        if (o->err == CQ_OK)
                o->err = cq_buf_append_str(o->buf, markup);
}

static void putf(out_t *o, const char *fmt, ...) CQ_PRINTF(2, 3);
static void putf(out_t *o, const char *fmt, ...)
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

static void escn(out_t *o, const char *s, size_t len)
{
        if (o->err == CQ_OK)
                o->err = cq_html_escape(o->buf, s, len);
}

static void esc(out_t *o, const char *s)
{
        if (s)
                escn(o, s, strlen(s));
}

/* A JSON string's text, NUL bytes included. */
static void esc_json(out_t *o, const json_t *str)
{
        if (json_is_string(str))
                escn(o, json_string_value(str), json_string_length(str));
}

static void termn(out_t *o, const char *s, size_t len)
{
        if (o->err == CQ_OK)
                o->err = cq_html_term(o->buf, s, len);
}

static void oom(out_t *o)
{
        if (o->err == CQ_OK)
                o->err = CQ_ERR_FATAL;
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
static void put_text(out_t *o, const json_t *v, bool terminal)
{
        bool failed = false;
        size_t len;
        char *text = join_text(v, &len, &failed);

        if (failed)
                oom(o);
        if (!text)
                return;
        if (terminal)
                termn(o, text, len);
        else
                escn(o, text, len);
        free(text);
}

/* Compact JSON of \p v, escaped, cut after \p max bytes (0: no limit). */
static void put_json(out_t *o, const json_t *v, size_t flags, size_t max)
{
        char *text = json_dumps(v, flags | JSON_ENCODE_ANY);
        size_t len;

        if (!text) {
                oom(o);
                return;
        }
        len = strlen(text);
        if (max && len > max) {
                escn(o, text, max);
                putf(o, "\n[... %zu more bytes not shown ...]", len - max);
        } else {
                escn(o, text, len);
        }
        free(text);
}

/* ----------------------------------------------------- style and script */

/* The stylesheet is report.css and the index's script report.js, both
 * built in (html_int.h). The script sorts and filters the index. It reads
 * the table from the DOM (cells' text and data-v numbers), compares what
 * the fragment names only to column keys and option values, and writes
 * only text and attributes: no job text is ever code there.
 * data-report="ready" on <html> says it ran and the stylesheet applied
 * (tests read it). */

/* 'sha256-<base64>' of \p text for the Content-Security-Policy. */
static void put_csp_hash(out_t *o, const char *text)
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
                oom(o);
                return;
        }
        putf(o, "'sha256-%s'", b64);
        free(b64);
}

/* <!DOCTYPE> .. <body><header>: \p title (escaped) and the policy: no
 * network, no plugins, no forms; style and (index only) script by hash. */
static void page_start(out_t *o, const char *title, bool script)
{
        put(o, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n"
               "<meta charset=\"utf-8\">\n"
               "<meta http-equiv=\"Content-Security-Policy\" "
               "content=\"default-src 'none'; img-src data:; style-src ");
        put_csp_hash(o, cq_html_report_css);
        put(o, "; script-src ");
        if (script)
                put_csp_hash(o, cq_html_report_js);
        else
                put(o, "'none'");
        put(o, "; base-uri 'none'; form-action 'none'\">\n"
               "<meta name=\"referrer\" content=\"no-referrer\">\n"
               "<meta name=\"viewport\" content=\"width=device-width, "
               "initial-scale=1\">\n"
               "<link rel=\"icon\" href=\"data:,\">\n<title>");
        esc(o, title);
        put(o, "</title>\n<style>");
        put(o, cq_html_report_css);
        put(o, "</style>\n</head>\n<body>\n");
}

static void page_end(out_t *o, bool script)
{
        put(o, "</main>\n");
        if (script) {
                put(o, "<script>");
                put(o, cq_html_report_js);
                put(o, "</script>\n");
        }
        put(o, "</body>\n</html>\n");
}

/* ---------------------------------------------------------- formatting */

static bool ends_with(const char *s, const char *tail)
{
        size_t n = strlen(s), m = strlen(tail);

        return n >= m && strcmp(s + n - m, tail) == 0;
}

static const char *const STATUSES[] = {"succeeded", "failed", "cancelled",
                                       "running", "queued"};

/* The class of a status badge: only known statuses name a class. */
static const char *status_class(const char *status)
{
        size_t i;

        for (i = 0; status && i < CQ_ARRAY_SIZE(STATUSES); i++)
                if (strcmp(status, STATUSES[i]) == 0)
                        return STATUSES[i];
        return "other";
}

static void put_status(out_t *o, const char *status)
{
        putf(o, "<span class=\"badge s-%s\">", status_class(status));
        esc(o, status ? status : "unknown");
        put(o, "</span>");
}

static void put_none(out_t *o) { put(o, "<span class=\"muted\">-</span>"); }

/* A number named \p key for people: durations (keys ending in _ms),
 * rates (0..1, as percentages), costs, percentages, plain numbers. */
static void put_number(out_t *o, const char *key, const json_t *v)
{
        double x = json_number_value(v);
        char text[64];
        cq_buf_t tmp;

        if (ends_with(key, "_ms")) {
                cq_fmt_duration(text, sizeof(text), (long long)x);
                esc(o, text);
        } else if (ends_with(key, "_rate")) {
                putf(o, "%.1f%%", x * 100.0);
        } else if (ends_with(key, "_pct")) {
                putf(o, "%.1f%%", x);
        } else if (ends_with(key, "_usd") || strcmp(key, "cost") == 0) {
                putf(o, "$%.4f", x);
        } else {
                cq_buf_init(&tmp, 128);
                if (cq_fmt_scalar(&tmp, v) != CQ_OK)
                        oom(o);
                else
                        esc(o, tmp.data ? tmp.data : "");
                cq_buf_release(&tmp);
        }
}

static void put_label(out_t *o, const char *key)
{
        size_t i;
        char c[2] = {0, 0};

        for (i = 0; key[i] && o->err == CQ_OK; i++) {
                c[0] = key[i] == '_' ? ' ' : key[i];
                escn(o, c, 1);
        }
}

static void put_value(out_t *o, const char *key, const json_t *v, int depth);

/* An object as a key/value list; \p skip (may be NULL) names keys left
 * out. */
static void
put_kv(out_t *o, const json_t *obj, const char *const *skip, int depth)
{
        const char *key;
        const json_t *v;
        size_t i;

        put(o, "<dl class=\"kv\">\n");
        json_object_foreach((json_t *)(uintptr_t)obj, key, v)
        {
                bool skipped = false;

                for (i = 0; skip && skip[i]; i++)
                        skipped = skipped || strcmp(skip[i], key) == 0;
                if (skipped)
                        continue;
                put(o, "<dt>");
                put_label(o, key);
                put(o, "</dt><dd>");
                put_value(o, key, v, depth + 1);
                put(o, "</dd>\n");
        }
        put(o, "</dl>\n");
}

/* An array of objects as a table whose columns are the union of their
 * keys (in first-seen order). */
static void put_object_table(out_t *o, const json_t *arr, int depth)
{
        json_t *keys = json_object(); /* key -> true, in first-seen order */
        const json_t *row, *v;
        const char *key;
        size_t i;

        if (!keys) {
                oom(o);
                return;
        }
        json_array_foreach(arr, i, row)
        {
                json_object_foreach((json_t *)(uintptr_t)row, key, v)
                {
                        if (!json_object_get(keys, key) &&
                            json_object_set_new(keys, key, json_true()))
                                oom(o);
                }
        }
        put(o, "<table>\n<thead><tr>");
        json_object_foreach(keys, key, v)
        {
                put(o, "<th>");
                put_label(o, key);
                put(o, "</th>");
        }
        put(o, "</tr></thead>\n<tbody>\n");
        json_array_foreach(arr, i, row)
        {
                const char *k;
                const json_t *unused;

                put(o, "<tr>");
                json_object_foreach(keys, k, unused)
                {
                        put(o, "<td>");
                        put_value(o, k, json_object_get(row, k), depth + 1);
                        put(o, "</td>");
                }
                put(o, "</tr>\n");
        }
        put(o, "</tbody>\n</table>\n");
        json_decref(keys);
}

static bool all_objects(const json_t *arr)
{
        const json_t *v;
        size_t i;

        json_array_foreach(arr, i, v) if (!json_is_object(v)) return false;
        return json_array_size(arr) > 0;
}

/* Any JSON value named \p key, for people. */
static void put_value(out_t *o, const char *key, const json_t *v, int depth)
{
        const json_t *item;
        size_t i;

        if (!v || json_is_null(v)) {
                put_none(o);
        } else if (json_is_true(v)) {
                put(o, "yes");
        } else if (json_is_false(v)) {
                put(o, "no");
        } else if (json_is_number(v)) {
                put_number(o, key, v);
        } else if (json_is_string(v)) {
                if (strcmp(key, "status") == 0)
                        put_status(o, json_string_value(v));
                else
                        esc_json(o, v);
        } else if (depth >= MAX_DEPTH) {
                put(o, "<code>");
                put_json(o, v, JSON_COMPACT, 4096);
                put(o, "</code>");
        } else if (json_is_object(v)) {
                if (json_object_size(v) == 0)
                        put_none(o);
                else
                        put_kv(o, v, NULL, depth);
        } else if (all_objects(v)) {
                put_object_table(o, v, depth);
        } else if (json_array_size(v) == 0) {
                put_none(o);
        } else {
                json_array_foreach(v, i, item)
                {
                        if (i)
                                put(o, ", ");
                        put_value(o, key, item, depth + 1);
                }
        }
}

/* "3/4" with a pass or fail class, or "-" without tests. */
static void put_tests(out_t *o, const json_t *passed, const json_t *total)
{
        json_int_t p = json_integer_value(passed),
                   t = json_integer_value(total);

        if (!json_is_integer(passed) || !json_is_integer(total) || t <= 0) {
                put_none(o);
                return;
        }
        putf(o,
             "<span class=\"%s\">%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT
             "</span>",
             p == t ? "pass" : "fail", p, t);
}

/* "from JOB" (finished with JOB's remembered solution, no LLM call),
 * "hint JOB" (given to the model as a hint), or "-". */
static void put_memory(out_t *o, const json_t *row)
{
        const json_t *src = json_object_get(row, "memory_source_job");

        if (json_is_true(json_object_get(row, "from_memory"))) {
                put(o, "from ");
                if (json_is_string(src))
                        esc_json(o, src);
                else
                        put(o, "?");
        } else if (json_is_string(src)) {
                put(o, "hint ");
                esc_json(o, src);
        } else {
                put_none(o);
        }
}

/* A summary card: \p label over the value of \p v. */
static void put_card(out_t *o, const char *label, const char *key, json_t *v)
{
        put(o, "<div class=\"card\"><div class=\"v\">");
        put_value(o, key, v, MAX_DEPTH - 1);
        put(o, "</div><div class=\"k\">");
        esc(o, label);
        put(o, "</div></div>\n");
}

/* --------------------------------------------------------------- index */

enum col_kind {
        COL_JOB,    /* the id, linking to its page */
        COL_STATUS, /* a badge */
        COL_TESTS,  /* passed/total */
        COL_MEMORY, /* from_memory and memory_source_job */
        COL_VALUE,  /* put_value(): numbers formatted by their key */
};

typedef struct col {
        const char *key; /* the row key that names the column */
        const char *label;
        enum col_kind kind;
        bool optional; /* shown only when some row has a value */
        bool num;      /* sorted as numbers */
} col_t;

/* The known columns, in order; "reason" comes last, after the columns of
 * keys the index does not know. */
static const col_t KNOWN_COLS[] = {
    {"job_id", "job", COL_JOB, false, false},
    {"title", "title", COL_VALUE, false, false},
    {"status", "status", COL_STATUS, false, false},
    {"tests_passed", "tests", COL_TESTS, false, true},
    {"turns", "turns", COL_VALUE, false, true},
    {"retries", "retries", COL_VALUE, false, true},
    {"total_tokens", "tokens", COL_VALUE, false, true},
    {"cost_usd", "cost", COL_VALUE, true, true},
    {"duration_ms", "duration", COL_VALUE, false, true},
    {"from_memory", "memory", COL_MEMORY, false, false},
    {"model", "model", COL_VALUE, true, false},
};

static const col_t REASON_COL = {"reason", "reason", COL_VALUE, false, false};

/* Keys shown by a known column (some columns read two keys). */
static bool known_key(const char *key)
{
        static const char *const also[] = {"tests_total", "memory_source_job",
                                           "reason"};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(KNOWN_COLS); i++)
                if (strcmp(KNOWN_COLS[i].key, key) == 0)
                        return true;
        for (i = 0; i < CQ_ARRAY_SIZE(also); i++)
                if (strcmp(also[i], key) == 0)
                        return true;
        return false;
}

/* Whether some row has a value for \p key, and whether every value it
 * has is a number. */
static bool column_values(const json_t *rows, const char *key, bool *numericp)
{
        const json_t *row;
        bool any = false;
        size_t i;

        *numericp = true;
        json_array_foreach(rows, i, row)
        {
                const json_t *v = json_object_get(row, key);

                if (!v || json_is_null(v))
                        continue;
                any = true;
                if (!json_is_number(v))
                        *numericp = false;
        }
        return any;
}

/* The columns of this table: known ones (optional ones when some row has
 * a value), then one per unknown key that some row has a value for, then
 * the reason. Returns how many were written to \p cols. */
static size_t pick_columns(const json_t *rows, col_t *cols, size_t max)
{
        const json_t *row, *v;
        const char *key;
        size_t i, j, n = 0;
        bool numeric;

        for (i = 0; i < CQ_ARRAY_SIZE(KNOWN_COLS) && n < max; i++)
                if (!KNOWN_COLS[i].optional ||
                    column_values(rows, KNOWN_COLS[i].key, &numeric))
                        cols[n++] = KNOWN_COLS[i];
        json_array_foreach(rows, i, row)
        {
                json_object_foreach((json_t *)(uintptr_t)row, key, v)
                {
                        bool seen = false;

                        if (known_key(key) || json_is_null(v))
                                continue;
                        for (j = 0; j < n; j++)
                                seen = seen || strcmp(cols[j].key, key) == 0;
                        if (seen || n + 1 >= max)
                                continue;
                        cols[n].key = key;
                        cols[n].label = key;
                        cols[n].kind = COL_VALUE;
                        cols[n].optional = true;
                        (void)column_values(rows, key, &numeric);
                        cols[n].num = numeric;
                        n++;
                }
        }
        if (n < max)
                cols[n++] = REASON_COL;
        return n;
}

static void
put_cell(out_t *o, const col_t *col, const json_t *row, const char *page)
{
        const json_t *v = json_object_get(row, col->key);

        switch (col->kind) {
        case COL_JOB:
                put(o, "<td><a href=\"jobs/");
                esc(o, page);
                put(o, "\">");
                esc_json(o, v);
                put(o, "</a></td>");
                return;
        case COL_STATUS:
                put(o, "<td>");
                put_status(o, json_string_value(v));
                put(o, "</td>");
                return;
        case COL_TESTS: {
                const json_t *total = json_object_get(row, "tests_total");
                double t = json_number_value(total);

                if (json_is_integer(v) && t > 0)
                        putf(o, "<td class=\"num\" data-v=\"%.6f\">",
                             json_number_value(v) / t);
                else
                        put(o, "<td class=\"num\" data-v=\"-1\">");
                put_tests(o, v, total);
                put(o, "</td>");
                return;
        }
        case COL_MEMORY:
                put(o, "<td>");
                put_memory(o, row);
                put(o, "</td>");
                return;
        default:
                break;
        }
        if (col->num && json_is_number(v))
                putf(o, "<td class=\"num\" data-v=\"%.17g\">",
                     json_number_value(v));
        else
                put(o, col->num ? "<td class=\"num\">" : "<td>");
        /* durations and costs are formatted by their key's suffix */
        put_value(o, col->key, v, MAX_DEPTH - 1);
        put(o, "</td>");
}

static void put_summary(out_t *o, const json_t *summary)
{
        static const struct {
                const char *key, *label;
        } cards[] = {
            {"jobs", "jobs"},
            {"succeeded", "succeeded"},
            {"failed", "failed"},
            {"cancelled", "cancelled"},
            {"pending", "pending"},
            {"pass_rate", "pass rate"},
            {"from_memory", "from memory"},
            {"retried", "retried"},
            {"cost_usd", "cost"},
            {"p50_duration_ms", "p50 duration"},
            {"p95_duration_ms", "p95 duration"},
        };
        static const char *const skip[] = {"run_id", NULL};
        size_t i;

        put(o, "<section id=\"summary\">\n<h2>Summary</h2>\n");
        if (!json_is_object(summary)) {
                put(o, "<p class=\"muted\">No summary.</p>\n</section>\n");
                return;
        }
        put(o, "<div class=\"cards\">\n");
        for (i = 0; i < CQ_ARRAY_SIZE(cards); i++) {
                json_t *v = json_object_get(summary, cards[i].key);

                if (v && (json_is_number(v) || json_is_string(v)))
                        put_card(o, cards[i].label, cards[i].key, v);
        }
        put(o, "</div>\n<details><summary>All figures</summary>\n");
        put_kv(o, summary, skip, 0);
        put(o, "</details>\n</section>\n");
}

cq_err_t cq_html_index(cq_buf_t *buf,
                       const cq_html_meta_t *meta,
                       const json_t *summary,
                       const json_t *rows,
                       const char (*names)[CQ_HTML_NAME_MAX])
{
        out_t o = {buf, CQ_OK};
        col_t cols[CQ_ARRAY_SIZE(KNOWN_COLS) + MAX_EXTRA_COLS + 1];
        size_t ncols, i, j, k, nrows = json_array_size(rows);
        const json_t *row;
        char title[300];

        snprintf(title, sizeof(title), "coderq run %s", meta->run_id);
        page_start(&o, title, true);
        put(&o, "<header><h1>Run ");
        esc(&o, meta->run_id);
        putf(&o, "</h1><div class=\"sub\">%zu jobs &middot; report written ",
             nrows);
        esc(&o, meta->generated_at);
        put(&o, " by coderq ");
        esc(&o, meta->version);
        put(&o, "</div></header>\n<main>\n");
        put_summary(&o, summary);

        ncols = pick_columns(rows, cols, CQ_ARRAY_SIZE(cols));
        put(&o, "<section id=\"jobs-section\">\n<h2>Jobs</h2>\n"
                "<div class=\"controls\">\n"
                "<input id=\"q\" type=\"search\" placeholder=\"Filter: job, "
                "title, reason...\" aria-label=\"Filter jobs\">\n"
                "<select id=\"status\" aria-label=\"Status\">"
                "<option value=\"\">all statuses</option>");
        for (k = 0; k < CQ_ARRAY_SIZE(STATUSES); k++) {
                size_t count = 0;

                json_array_foreach(rows, i, row)
                {
                        const char *s =
                            json_string_value(json_object_get(row, "status"));

                        count += s && strcmp(s, STATUSES[k]) == 0;
                }
                if (count)
                        putf(&o, "<option value=\"%s\">%s (%zu)</option>",
                             STATUSES[k], STATUSES[k], count);
        }
        putf(&o,
             "</select>\n<span class=\"muted\"><span id=\"shown\">%zu</span> "
             "of %zu jobs shown</span>\n</div>\n",
             nrows, nrows);
        put(&o, "<table id=\"jobs\">\n<thead><tr>");
        for (j = 0; j < ncols; j++) {
                put(&o, "<th data-key=\"");
                esc(&o, cols[j].key);
                put(&o, cols[j].num ? "\" data-type=\"num\" class=\"num\">"
                                    : "\" data-type=\"text\">");
                put(&o, "<button type=\"button\">");
                put_label(&o, cols[j].label);
                put(&o, "</button></th>");
        }
        put(&o, "</tr></thead>\n<tbody>\n");
        json_array_foreach(rows, i, row)
        {
                put(&o, "<tr data-status=\"");
                esc(&o, json_string_value(json_object_get(row, "status")));
                put(&o, "\">");
                for (j = 0; j < ncols; j++)
                        put_cell(&o, &cols[j], row, names[i]);
                put(&o, "</tr>\n");
        }
        put(&o, "</tbody>\n</table>\n</section>\n");
        page_end(&o, true);
        return o.err;
}

/* ------------------------------------------------------------ job page */

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
static void put_img(out_t *o,
                    const char *mime,
                    const unsigned char *data,
                    size_t len,
                    const char *alt,
                    seen_t *seen)
{
        char hex[65];
        char *b64 = cq_b64_encode(data, len, NULL);

        if (!b64) {
                oom(o);
                return;
        }
        cq_sha256_hex(data, len, hex);
        if (seen_add(seen, hex) != 0)
                oom(o);
        putf(o, "<img src=\"data:%s;base64,", mime);
        put(o, b64);
        put(o, "\" alt=\"");
        esc(o, alt);
        put(o, "\">");
        free(b64);
}

/* An image output of the notebook: base64 text (png, jpeg, gif) or the
 * SVG document itself. */
static void
put_output_image(out_t *o, const char *mime, const json_t *v, seen_t *seen)
{
        bool failed = false;
        size_t len = 0, n = 0;
        char *text = join_text(v, &len, &failed);
        unsigned char *bytes = NULL;

        if (failed)
                oom(o);
        if (!text)
                return;
        if (strcmp(mime, "image/svg+xml") == 0) {
                put(o, "<figure>");
                put_img(o, mime, (const unsigned char *)text, len, mime, seen);
                put(o, "</figure>\n");
                free(text);
                return;
        }
        bytes = cq_b64_decode(text, len, &n);
        if (bytes) {
                put(o, "<figure>");
                put_img(o, mime, bytes, n, mime, seen);
                put(o, "</figure>\n");
        } else {
                putf(o,
                     "<p class=\"muted\">[%s output not shown: not valid "
                     "base64]</p>\n",
                     mime);
        }
        free(bytes);
        free(text);
}

/* execute_result and display_data: the images, else the plain text, else
 * the first other representation shown as text (never as markup). */
static void put_rich(out_t *o, const json_t *data, seen_t *seen)
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
                put(o, "<pre class=\"result\">");
                put_text(o, v, true);
                put(o, "</pre>\n");
                return;
        }
        json_object_foreach((json_t *)(uintptr_t)data, mime, v)
        {
                put(o, "<div class=\"muted\">");
                esc(o, mime);
                put(o, " (shown as text)</div><pre class=\"result\">");
                if (json_is_string(v) || json_is_array(v))
                        put_text(o, v, false);
                else
                        put_json(o, v, JSON_INDENT(1), 65536);
                put(o, "</pre>\n");
                return;
        }
}

static void put_outputs(out_t *o, const json_t *outputs, seen_t *seen)
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

                        put(o, err ? "<pre class=\"stderr\">"
                                   : "<pre class=\"stdout\">");
                        put_text(o, json_object_get(out, "text"), true);
                        put(o, "</pre>\n");
                } else if (type && strcmp(type, "error") == 0) {
                        const json_t *tb = json_object_get(out, "traceback");
                        const json_t *line;
                        size_t j;

                        put(o, "<pre class=\"err\">");
                        put_text(o, json_object_get(out, "ename"), true);
                        put(o, ": ");
                        put_text(o, json_object_get(out, "evalue"), true);
                        json_array_foreach(tb, j, line)
                        {
                                put(o, "\n");
                                put_text(o, line, true);
                        }
                        put(o, "</pre>\n");
                } else if (type && (strcmp(type, "execute_result") == 0 ||
                                    strcmp(type, "display_data") == 0)) {
                        put_rich(o, json_object_get(out, "data"), seen);
                } else {
                        put(o, "<pre>");
                        put_json(o, out, JSON_INDENT(1), 65536);
                        put(o, "</pre>\n");
                }
        }
}

static void put_prompt_count(out_t *o, const json_t *count)
{
        if (json_is_integer(count))
                putf(o, "In [%" JSON_INTEGER_FORMAT "]",
                     json_integer_value(count));
        else
                put(o, "In [ ]");
}

/* The notebook's cells; without a stored notebook, the job's cells. */
static void put_notebook(out_t *o, const json_t *doc, seen_t *seen)
{
        const json_t *nb = json_object_get(doc, "notebook");
        const json_t *cells = json_object_get(nb, "cells");
        const json_t *cell;
        bool from_nb = json_is_array(cells);
        size_t i;

        if (!from_nb)
                cells = json_object_get(doc, "cells");
        put(o, "<section id=\"notebook\">\n<h2>Notebook</h2>\n");
        if (json_array_size(cells) == 0)
                put(o, "<p class=\"muted\">No cells.</p>\n");
        else if (!from_nb)
                put(o, "<p class=\"muted\">No notebook was stored; these are "
                       "the cells as they ran.</p>\n");
        json_array_foreach(cells, i, cell)
        {
                const char *type =
                    json_string_value(json_object_get(cell, "cell_type"));
                const char *status =
                    json_string_value(json_object_get(cell, "status"));

                put(o, "<div class=\"cell\">");
                if (from_nb && type && strcmp(type, "code") != 0) {
                        put(o, "<div class=\"prompt\">");
                        esc(o, type);
                        put(o, "</div><pre class=\"md\">");
                        put_text(o, json_object_get(cell, "source"), false);
                        put(o, "</pre></div>\n");
                        continue;
                }
                put(o, "<div class=\"prompt\">");
                put_prompt_count(o, json_object_get(cell, "execution_count"));
                if (status) {
                        put(o, " &middot; ");
                        esc(o, status);
                }
                if (json_is_integer(json_object_get(cell, "duration_ms"))) {
                        char d[32];

                        cq_fmt_duration(d, sizeof(d),
                                        json_integer_value(json_object_get(
                                            cell, "duration_ms")));
                        put(o, " &middot; ");
                        esc(o, d);
                }
                put(o, "</div><pre class=\"code\">");
                put_text(o, json_object_get(cell, from_nb ? "source" : "code"),
                         false);
                put(o, "</pre>\n");
                put_outputs(o, json_object_get(cell, "outputs"), seen);
                put(o, "</div>\n");
        }
        put(o, "</section>\n");
}

/* The code of an execute_code call, else its raw arguments. */
static void put_tool_call(out_t *o, const json_t *call)
{
        const json_t *fn = json_object_get(call, "function");
        const json_t *args = json_object_get(fn, "arguments");
        json_t *parsed = NULL;
        const json_t *code = NULL;

        put(o, "<div class=\"role\">tool call ");
        esc_json(o, json_object_get(fn, "name"));
        put(o, " <span class=\"muted\">");
        esc_json(o, json_object_get(call, "id"));
        put(o, "</span></div>");
        if (json_is_string(args)) {
                parsed = json_loadb(json_string_value(args),
                                    json_string_length(args), 0, NULL);
                code = json_object_get(parsed, "code");
        } else if (json_is_object(args)) {
                code = json_object_get(args, "code");
        }
        put(o, "<pre class=\"code\">");
        if (json_is_string(code))
                esc_json(o, code);
        else if (json_is_string(args))
                esc_json(o, args);
        else if (args)
                put_json(o, args, JSON_INDENT(1), 65536);
        put(o, "</pre>\n");
        json_decref(parsed);
}

/* A message's content: text, or an array of parts (their text).
 * \p terminal: a tool result, cell output as the model saw it. */
static void put_content(out_t *o, const json_t *content, bool terminal)
{
        const json_t *part;
        size_t i;

        if (json_is_string(content)) {
                if (json_string_length(content) == 0)
                        return;
                put(o, "<pre>");
                put_text(o, content, terminal);
                put(o, "</pre>\n");
                return;
        }
        json_array_foreach(content, i, part)
        {
                const json_t *text = json_object_get(part, "text");

                put(o, "<pre>");
                if (json_is_string(text))
                        put_text(o, text, terminal);
                else
                        put_json(o, part, JSON_INDENT(1), 65536);
                put(o, "</pre>\n");
        }
}

static void put_transcript(out_t *o, const json_t *messages)
{
        static const char *const roles[] = {"system", "user", "assistant",
                                            "tool"};
        const json_t *msg, *call;
        size_t i, j;

        put(o, "<section id=\"transcript\">\n<h2>Transcript</h2>\n");
        if (json_array_size(messages) == 0)
                put(o, "<p class=\"muted\">No messages.</p>\n");
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
                putf(o, "<div class=\"msg %s\"><div class=\"role\">", cls);
                esc(o, role ? role : "message");
                if (json_is_string(json_object_get(msg, "tool_call_id"))) {
                        put(o, " <span class=\"muted\">result of ");
                        esc_json(o, json_object_get(msg, "tool_call_id"));
                        put(o, "</span>");
                }
                put(o, "</div>\n");
                if (json_is_string(reasoning) &&
                    json_string_length(reasoning) > 0) {
                        put(o, "<details><summary>reasoning</summary><pre>");
                        esc_json(o, reasoning);
                        put(o, "</pre></details>\n");
                }
                put_content(o, json_object_get(msg, "content"),
                            strcmp(cls, "tool") == 0);
                json_array_foreach(json_object_get(msg, "tool_calls"), j, call)
                    put_tool_call(o, call);
                put(o, "</div>\n");
        }
        put(o, "</section>\n");
}

static void put_test_report(out_t *o, const json_t *doc)
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
        put(o, "<section id=\"tests\">\n<h2>Tests</h2>\n");
        if (!json_is_object(tests)) {
                put(o, "<p class=\"muted\">The tests did not run.</p>\n"
                       "</section>\n");
                return;
        }
        put(o, "<div class=\"cards\">");
        put(o, "<div class=\"card\"><div class=\"v\">");
        put_tests(o, json_object_get(tests, "passed"),
                  json_object_get(tests, "total"));
        put(o, "</div><div class=\"k\">passed</div></div></div>\n");
        if (json_is_string(error)) {
                put(o, "<pre class=\"err\">");
                termn(o, json_string_value(error), json_string_length(error));
                put(o, "</pre>\n");
        }
        put_kv(o, tests, skip, 0);
        if (json_array_size(cases) > 0) {
                put(o, "<h3>Cases</h3>\n<table class=\"cases\">\n<thead><tr>"
                       "<th>#</th><th>result</th><th>call</th><th>expected"
                       "</th><th>got</th><th>error</th></tr></thead>\n"
                       "<tbody>\n");
                json_array_foreach(cases, i, c)
                {
                        const json_t *tb = json_object_get(c, "traceback");
                        const json_t *err = json_object_get(c, "error");
                        bool ok = json_is_true(json_object_get(c, "ok"));

                        put(o, "<tr><td class=\"num\">");
                        put_value(o, "case", json_object_get(c, "case"),
                                  MAX_DEPTH - 1);
                        putf(o, "</td><td class=\"%s\">%s</td><td><code>",
                             ok ? "pass" : "fail", ok ? "pass" : "fail");
                        esc_json(o, json_object_get(c, "call"));
                        put(o, "</code></td><td><code>");
                        esc_json(o, json_object_get(c, "expected"));
                        put(o, "</code></td><td><code>");
                        esc_json(o, json_object_get(c, "got"));
                        put(o, "</code></td><td>");
                        if (json_is_string(err) || json_is_string(tb)) {
                                put(o, "<pre class=\"err\">");
                                if (json_is_string(err))
                                        termn(o, json_string_value(err),
                                              json_string_length(err));
                                if (json_is_string(err) && json_is_string(tb))
                                        put(o, "\n");
                                if (json_is_string(tb))
                                        termn(o, json_string_value(tb),
                                              json_string_length(tb));
                                put(o, "</pre>");
                        }
                        put(o, "</td></tr>\n");
                }
                put(o, "</tbody>\n</table>\n");
        }
        put(o, "</section>\n");
}

/* The job's stored images the notebook did not already show. */
static void
put_images(out_t *o, const cq_images_t *images, const seen_t *seen_nb)
{
        seen_t seen = {0};
        size_t i, shown = 0;

        if (!images)
                return;
        for (i = 0; i < images->n; i++)
                shown += !seen_has(seen_nb, images->v[i].sha256);
        if (!shown)
                return;
        put(o, "<section id=\"images\">\n<h2>Images</h2>\n"
               "<p class=\"muted\">Images the job stored that the notebook "
               "does not show.</p>\n");
        for (i = 0; i < images->n; i++) {
                const cq_image_t *img = &images->v[i];

                if (seen_has(seen_nb, img->sha256))
                        continue;
                put(o, "<figure>");
                if (drawable(img->mime))
                        put_img(o, img->mime, img->data, img->len, img->name,
                                &seen);
                put(o, "<figcaption>");
                esc(o, img->name);
                put(o, " &middot; ");
                esc(o, img->mime);
                putf(o, " &middot; %zu bytes", img->len);
                if (!drawable(img->mime))
                        put(o, " &middot; not drawn (only PNG, JPEG, GIF and "
                               "SVG are)");
                put(o, "</figcaption></figure>\n");
        }
        put(o, "</section>\n");
        free(seen.v);
}

static void put_overview(out_t *o, const json_t *status)
{
        static const char *const plain[] = {"turns", "retries", "total_tokens",
                                            "cost_usd", "duration_ms"};
        static const char *const labels[] = {"turns", "retries", "tokens",
                                             "cost", "duration"};
        const json_t *reason = json_object_get(status, "reason");
        size_t i;

        put(o, "<section id=\"overview\">\n<h2>Overview</h2>\n"
               "<div class=\"cards\">\n<div class=\"card\"><div class=\"v\">");
        put_status(o, json_string_value(json_object_get(status, "status")));
        put(o, "</div><div class=\"k\">status</div></div>\n"
               "<div class=\"card\"><div class=\"v\">");
        put_tests(o, json_object_get(status, "tests_passed"),
                  json_object_get(status, "tests_total"));
        put(o, "</div><div class=\"k\">tests</div></div>\n");
        for (i = 0; i < CQ_ARRAY_SIZE(plain); i++) {
                json_t *v = json_object_get(status, plain[i]);

                if (v)
                        put_card(o, labels[i], plain[i], v);
        }
        put(o, "<div class=\"card\"><div class=\"v\">");
        put_memory(o, status);
        put(o, "</div><div class=\"k\">memory</div></div>\n</div>\n");
        if (json_is_string(reason)) {
                put(o, "<pre class=\"err\">");
                termn(o, json_string_value(reason), json_string_length(reason));
                put(o, "</pre>\n");
        }
        put(o, "<details><summary>All fields</summary>\n");
        put_kv(o, status, NULL, 0);
        put(o, "</details>\n</section>\n");
}

cq_err_t cq_html_job(cq_buf_t *buf,
                     const cq_html_meta_t *meta,
                     const json_t *doc,
                     const cq_images_t *images)
{
        static const char *const report_skip[] = {"tests", NULL};
        out_t o = {buf, CQ_OK};
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
        page_start(&o, head.data ? head.data : job_id, false);
        cq_buf_release(&head);
        put(&o, "<header><h1>");
        esc(&o, title && *title ? title : job_id);
        put(&o, "</h1><div class=\"sub\">job <code>");
        esc(&o, job_id);
        put(&o, "</code> &middot; <a href=\"../index.html\">run ");
        esc(&o, meta->run_id);
        put(&o, "</a> &middot; report written ");
        esc(&o, meta->generated_at);
        put(&o, "</div></header>\n<main>\n");
        put_overview(&o, status);

        put(&o, "<section id=\"answer\">\n<h2>Answer</h2>\n");
        if (json_is_string(answer) && json_string_length(answer) > 0) {
                put(&o, "<pre class=\"answer\">");
                esc_json(&o, answer);
                put(&o, "</pre>\n");
        } else {
                put(&o, "<p class=\"muted\">No final answer.</p>\n");
        }
        put(&o, "</section>\n");
        put_test_report(&o, doc);
        put_transcript(&o, json_object_get(doc, "messages"));
        put_notebook(&o, doc, &seen);
        put_images(&o, images, &seen);
        if (json_is_object(report)) {
                put(&o, "<section id=\"result\">\n<h2>Result details</h2>\n");
                put_kv(&o, report, report_skip, 0);
                put(&o, "</section>\n");
        }
        if (spec) {
                put(&o, "<section id=\"job-message\">\n<details><summary>"
                        "Job message</summary>\n<pre>");
                put_json(&o, spec, JSON_INDENT(2), SPEC_SHOW_MAX);
                put(&o, "</pre>\n</details>\n</section>\n");
        }
        page_end(&o, false);
        free(seen.v);
        return o.err;
}
