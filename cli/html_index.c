/* SPDX-License-Identifier: MIT */
/* html_index.c - the index of the run report: the run's summary and a
 * sortable, filterable table of its jobs (report.js). Every string from a
 * job goes through cq_html_escape(); the script reads the table from the
 * DOM and never holds job text as code. */
#include "coderq/cli/html.h"

#include <stdio.h>
#include <string.h>

#include "html_int.h"

/* Columns made for keys of the rows that the index does not know. */
#define MAX_EXTRA_COLS 16

enum col_kind {
        COL_JOB,    /* the id, linking to its page */
        COL_STATUS, /* a badge */
        COL_TESTS,  /* passed/total */
        COL_MEMORY, /* from_memory and memory_source_job */
        COL_VALUE,  /* html_put_value(): numbers formatted by their key */
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
put_cell(html_out_t *o, const col_t *col, const json_t *row, const char *page)
{
        const json_t *v = json_object_get(row, col->key);

        switch (col->kind) {
        case COL_JOB:
                html_put(o, "<td><a href=\"jobs/");
                html_esc(o, page);
                html_put(o, "\">");
                html_esc_json(o, v);
                html_put(o, "</a></td>");
                return;
        case COL_STATUS:
                html_put(o, "<td>");
                html_put_status(o, json_string_value(v));
                html_put(o, "</td>");
                return;
        case COL_TESTS: {
                const json_t *total = json_object_get(row, "tests_total");
                double t = json_number_value(total);

                if (json_is_integer(v) && t > 0)
                        html_putf(o, "<td class=\"num\" data-v=\"%.6f\">",
                                  json_number_value(v) / t);
                else
                        html_put(o, "<td class=\"num\" data-v=\"-1\">");
                html_put_tests(o, v, total);
                html_put(o, "</td>");
                return;
        }
        case COL_MEMORY:
                html_put(o, "<td>");
                html_put_memory(o, row);
                html_put(o, "</td>");
                return;
        default:
                break;
        }
        if (col->num && json_is_number(v))
                html_putf(o, "<td class=\"num\" data-v=\"%.17g\">",
                          json_number_value(v));
        else
                html_put(o, col->num ? "<td class=\"num\">" : "<td>");
        /* durations and costs are formatted by their key's suffix */
        html_put_value(o, col->key, v, HTML_MAX_DEPTH - 1);
        html_put(o, "</td>");
}

static void put_summary(html_out_t *o, const json_t *summary)
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

        html_put(o, "<section id=\"summary\">\n<h2>Summary</h2>\n");
        if (!json_is_object(summary)) {
                html_put(o, "<p class=\"muted\">No summary.</p>\n</section>\n");
                return;
        }
        html_put(o, "<div class=\"cards\">\n");
        for (i = 0; i < CQ_ARRAY_SIZE(cards); i++) {
                json_t *v = json_object_get(summary, cards[i].key);

                if (v && (json_is_number(v) || json_is_string(v)))
                        html_put_card(o, cards[i].label, cards[i].key, v);
        }
        html_put(o, "</div>\n<details><summary>All figures</summary>\n");
        html_put_kv(o, summary, skip, 0);
        html_put(o, "</details>\n</section>\n");
}

cq_err_t cq_html_index(cq_buf_t *buf,
                       const cq_html_meta_t *meta,
                       const json_t *summary,
                       const json_t *rows,
                       const char (*names)[CQ_HTML_NAME_MAX])
{
        html_out_t o = {buf, CQ_OK};
        col_t cols[CQ_ARRAY_SIZE(KNOWN_COLS) + MAX_EXTRA_COLS + 1];
        size_t ncols, i, j, k, nrows = json_array_size(rows);
        const json_t *row;
        char title[300];

        snprintf(title, sizeof(title), "coderq run %s", meta->run_id);
        html_page_start(&o, title, true);
        html_put(&o, "<header><h1>Run ");
        html_esc(&o, meta->run_id);
        html_putf(&o,
                  "</h1><div class=\"sub\">%zu jobs &middot; report written ",
                  nrows);
        html_esc(&o, meta->generated_at);
        html_put(&o, " by coderq ");
        html_esc(&o, meta->version);
        html_put(&o, "</div></header>\n<main>\n");
        put_summary(&o, summary);

        ncols = pick_columns(rows, cols, CQ_ARRAY_SIZE(cols));
        html_put(&o,
                 "<section id=\"jobs-section\">\n<h2>Jobs</h2>\n"
                 "<div class=\"controls\">\n"
                 "<input id=\"q\" type=\"search\" placeholder=\"Filter: job, "
                 "title, reason...\" aria-label=\"Filter jobs\">\n"
                 "<select id=\"status\" aria-label=\"Status\">"
                 "<option value=\"\">all statuses</option>");
        for (k = 0; k < CQ_ARRAY_SIZE(html_statuses); k++) {
                size_t count = 0;

                json_array_foreach(rows, i, row)
                {
                        const char *s =
                            json_string_value(json_object_get(row, "status"));

                        count += s && strcmp(s, html_statuses[k]) == 0;
                }
                if (count)
                        html_putf(&o, "<option value=\"%s\">%s (%zu)</option>",
                                  html_statuses[k], html_statuses[k], count);
        }
        html_putf(
            &o,
            "</select>\n<span class=\"muted\"><span id=\"shown\">%zu</span> "
            "of %zu jobs shown</span>\n</div>\n",
            nrows, nrows);
        html_put(&o, "<table id=\"jobs\">\n<thead><tr>");
        for (j = 0; j < ncols; j++) {
                html_put(&o, "<th data-key=\"");
                html_esc(&o, cols[j].key);
                html_put(&o, cols[j].num ? "\" data-type=\"num\" class=\"num\">"
                                         : "\" data-type=\"text\">");
                html_put(&o, "<button type=\"button\">");
                html_put_label(&o, cols[j].label);
                html_put(&o, "</button></th>");
        }
        html_put(&o, "</tr></thead>\n<tbody>\n");
        json_array_foreach(rows, i, row)
        {
                html_put(&o, "<tr data-status=\"");
                html_esc(&o, json_string_value(json_object_get(row, "status")));
                html_put(&o, "\">");
                for (j = 0; j < ncols; j++)
                        put_cell(&o, &cols[j], row, names[i]);
                html_put(&o, "</tr>\n");
        }
        html_put(&o, "</tbody>\n</table>\n</section>\n");
        html_page_end(&o, true);
        return o.err;
}
