/* SPDX-License-Identifier: MIT */
/* html_int.h - what the sources of the run report share: the sources
 * built from report.css and report.js (cq_embed() in cli/CMakeLists.txt),
 * and html.c's page being written, its head and JSON values formatted
 * for people, used by the index (html_index.c) and a job's page
 * (html_job.c). Every html_ writer escapes what it is given unless its
 * name says markup. */
#ifndef CODERQ_HTML_INT_H
#define CODERQ_HTML_INT_H

#include <jansson.h>
#include <stdbool.h>

#include "coderq/common/buf.h"
#include "coderq/common/common.h"

/* The run report's stylesheet and the index's script, NUL-terminated: put
 * in the pages as they are, and named by hash in their policy. */
extern const char cq_html_report_css[];
extern const char cq_html_report_js[];

/* Nested objects and arrays deeper than this print as compact JSON. */
#define HTML_MAX_DEPTH 4

/* The page being written: the first error sticks and later writes are
 * skipped, so a renderer checks once at the end. */
typedef struct html_out {
        cq_buf_t *buf;
        cq_err_t err;
} html_out_t;

/* Our own markup, as it is. */
void html_put(html_out_t *o, const char *markup);
/* Our own markup, formatted (at most 511 bytes; more is a bug and fails
 * the page). */
void html_putf(html_out_t *o, const char *fmt, ...) CQ_PRINTF(2, 3);
/* Text, escaped: \p len bytes; a C string (NULL: nothing); a JSON
 * string's text, NUL bytes included (anything else: nothing). */
void html_escn(html_out_t *o, const char *s, size_t len);
void html_esc(html_out_t *o, const char *s);
void html_esc_json(html_out_t *o, const json_t *str);
/* Fail the page: out of memory. */
void html_oom(html_out_t *o);
/* JSON of \p v, escaped, cut after \p max bytes (0: no limit). */
void html_put_json(html_out_t *o, const json_t *v, size_t flags, size_t max);

/* The statuses a job can have, in the order the report lists them. */
extern const char *const html_statuses[5];

/* <!DOCTYPE> .. <body>: \p title (escaped) and the policy: no network,
 * no plugins, no forms; style and (\p script: the index's) script by
 * hash. html_page_end() closes <main> and the page. */
void html_page_start(html_out_t *o, const char *title, bool script);
void html_page_end(html_out_t *o, bool script);

/* A status badge; only known statuses name a class. */
void html_put_status(html_out_t *o, const char *status);
/* "-", muted: no value. */
void html_put_none(html_out_t *o);
/* The verdicts a finished job can have (migrations/0007_evaluation.sql),
 * in the order the report lists them, and the class of one: itself when
 * known, else "none". Each has a colour in report.css (.v-<verdict>). */
extern const char *const html_verdicts[8];
const char *html_verdict_class(const char *verdict);
/* A row's or a job's verdict, else its reason code, coloured, with the
 * reason when it has one on hover; "-" without either. */
void html_put_verdict(html_out_t *o, const json_t *row);
/* \p s escaped, at most \p max characters: a longer one keeps its start
 * and its end around U+2026. */
void html_put_short(html_out_t *o, const char *s, size_t max);
/* A key for people: '_' as a space. */
void html_put_label(html_out_t *o, const char *key);
/* Any JSON value named \p key, for people: numbers by their key's suffix
 * (durations _ms, rates _rate, _pct, costs _usd), status badges, objects
 * as key/value lists (\p skip, NULL-terminated or NULL, names keys left
 * out) and arrays of objects as tables, down to HTML_MAX_DEPTH. */
void html_put_value(html_out_t *o, const char *key, const json_t *v, int depth);
void html_put_kv(html_out_t *o,
                 const json_t *obj,
                 const char *const *skip,
                 int depth);
/* "3/4" with a pass or fail class, or "-" without tests. */
void html_put_tests(html_out_t *o, const json_t *passed, const json_t *total);
/* Of a row or a job's status: "from JOB" (finished with JOB's remembered
 * solution, no LLM call), "hint JOB" (given to the model as a hint), or
 * "-". */
void html_put_memory(html_out_t *o, const json_t *row);
/* A card: \p label over the value of \p v named \p key. */
void html_put_card(html_out_t *o,
                   const char *label,
                   const char *key,
                   const json_t *v);

#endif
