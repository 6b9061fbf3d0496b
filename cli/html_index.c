/* SPDX-License-Identifier: MIT */
/* html_index.c - the index of the run report: the run's figures, its
 * models side by side, the table of its jobs (the latest attempt of each
 * original job; sorted, filtered and its columns chosen by report.js)
 * and, when the run has samples, a grid of its problems by samples.
 * Every string from a job goes through cq_html_escape(); the script
 * reads the table from the DOM and never holds job text as code. */
#include "coderq/cli/html.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "html_int.h"

/* Ids and problems longer than this many characters are shortened in the
 * table and the grid: in full on hover and on the page they link to. */
#define ID_SHOW_MAX 28
/* Text longer than this many bytes gets itself on hover too: the table
 * cuts a long value to its column's width. */
#define HOVER_MIN 20

/* Whether \p row is the latest attempt of its original job: a row of the
 * table (rows without "latest" are). */
static bool is_latest(const json_t *row)
{
        return !json_is_false(json_object_get(row, "latest"));
}

/* The original job of \p row: the one a retry names, else itself. */
static const char *root_of(const json_t *row)
{
        const char *root = json_string_value(json_object_get(row, "retry_of"));

        if (!root)
                root = json_string_value(json_object_get(row, "job_id"));
        return root ? root : "";
}

void cq_html_attempts(const json_t *rows,
                      const char (*names)[CQ_HTML_NAME_MAX],
                      size_t i,
                      cq_html_attempts_t *att)
{
        const char *root = root_of(json_array_get(rows, i));
        size_t first = i, end = i + 1, n = json_array_size(rows);

        while (first > 0 &&
               strcmp(root_of(json_array_get(rows, first - 1)), root) == 0)
                first--;
        while (end < n && strcmp(root_of(json_array_get(rows, end)), root) == 0)
                end++;
        att->rows = rows;
        att->names = names;
        att->first = i < n ? first : 0;
        att->n = i < n ? end - first : 0;
}

/* Whether some latest row is a sample of a problem. */
static bool has_samples(const json_t *rows)
{
        const json_t *row;
        size_t i;

        json_array_foreach(rows, i, row)
        {
                if (is_latest(row) &&
                    json_is_string(json_object_get(row, "problem_id")))
                        return true;
        }
        return false;
}

/* Text that a cell may cut: the whole of it on hover. */
static void put_clipped(html_out_t *o, const json_t *str)
{
        html_put(o, "<span class=\"clip\"");
        if (json_string_length(str) > HOVER_MIN) {
                html_put(o, " title=\"");
                html_esc_json(o, str);
                html_put(o, "\"");
        }
        html_put(o, ">");
        html_esc_json(o, str);
        html_put(o, "</span>");
}

/* ------------------------------------------------------------- figures */

static void put_figures(html_out_t *o, const json_t *figures, bool samples)
{
        static const struct {
                const char *key, *label;
                bool samples; /* only for a run with samples */
                bool nonzero; /* only when not 0 */
        } cards[] = {
            {"jobs", "jobs", false, false},
            {"succeeded", "succeeded", false, false},
            {"failed", "failed", false, false},
            {"cancelled", "cancelled", false, false},
            {"pending", "pending", false, false},
            {"pass_rate", "pass rate", false, false},
            {"pass_at_1", "pass@1", true, false},
            {"pass_at_10", "pass@10", true, false},
            {"pass_at_100", "pass@100", true, false},
            {"problems", "problems", true, false},
            {"samples", "samples", true, false},
            {"infra_errors", "infra errors", false, true},
            {"bendable", "bendable verdicts", false, true},
            {"from_memory", "from memory", false, false},
            {"retried", "retried", false, false},
            {"total_tokens", "tokens", false, false},
            {"cost_usd", "cost", false, false},
            {"p50_duration_ms", "p50 duration", false, false},
            {"p95_duration_ms", "p95 duration", false, false},
        };
        static const char *const skip[] = {"run_id", "models", "total", NULL};
        const json_t *total = json_object_get(figures, "total");
        const json_t *budget = json_object_get(figures, "budget_usd");
        size_t i;

        html_put(o, "<section id=\"figures\">\n<h2>Figures</h2>\n");
        if (!json_is_object(total)) {
                html_put(o, "<p class=\"muted\">No figures.</p>\n</section>\n");
                return;
        }
        html_put(o, "<div class=\"cards\">\n");
        for (i = 0; i < CQ_ARRAY_SIZE(cards); i++) {
                const json_t *v = json_object_get(total, cards[i].key);

                if (!v || !(json_is_number(v) || json_is_string(v)) ||
                    (cards[i].samples && !samples) ||
                    (cards[i].nonzero && json_number_value(v) == 0))
                        continue;
                html_put_card(o, cards[i].label, cards[i].key, v);
        }
        if (json_is_number(budget))
                html_put_card(o, "budget", "budget_usd", budget);
        html_put(o, "</div>\n<details><summary>All figures</summary>\n");
        html_put_kv(o, total, NULL, 0);
        html_put_kv(o, figures, skip, 0);
        html_put(o, "</details>\n</section>\n");
}

/* -------------------------------------------------------------- models */

static void
put_chip(html_out_t *o, const char *cls, const char *code, const json_t *n)
{
        html_putf(o, "<span class=\"chip%s%s\">", *cls ? " " : "", cls);
        html_esc(o, code);
        html_put(o, " <span class=\"n\">");
        html_put_value(o, code, n, HTML_MAX_DEPTH);
        html_put(o, "</span></span>");
}

/* Counts by code ({"passed": 3, ...}) as chips; verdicts in their order
 * and colours, then any other code. */
static void put_counts(html_out_t *o, const json_t *counts, bool verdicts)
{
        char cls[32];
        const char *key;
        const json_t *n;
        size_t i;

        if (!json_is_object(counts) || json_object_size(counts) == 0) {
                html_put_none(o);
                return;
        }
        for (i = 0; verdicts && i < CQ_ARRAY_SIZE(html_verdicts); i++) {
                n = json_object_get(counts, html_verdicts[i]);
                snprintf(cls, sizeof(cls), "v-%s", html_verdicts[i]);
                if (n)
                        put_chip(o, cls, html_verdicts[i], n);
        }
        json_object_foreach((json_t *)(uintptr_t)counts, key, n)
        {
                if (!verdicts || strcmp(html_verdict_class(key), "none") == 0)
                        put_chip(o, "", key, n);
        }
}

/* The pass@k the comparison shows: where a run has samples and some model
 * has enough of them for it. */
static const char *const PASS_AT[] = {"pass_at_1", "pass_at_10", "pass_at_100"};
static const char *const PASS_AT_LABEL[] = {"pass@1", "pass@10", "pass@100"};

static void put_model_row(html_out_t *o,
                          const json_t *m,
                          const char *label,
                          const bool *pass_at)
{
        static const char *const nums[] = {
            "total_tokens", "cost_usd", "p50_duration_ms", "p95_duration_ms"};
        const json_t *model = json_object_get(m, "model");
        const json_t *unknown = json_object_get(m, "cost_unknown");
        size_t i;

        html_put(o, label ? "<tr class=\"total\"><td>" : "<tr><td>");
        if (label)
                html_esc(o, label);
        else if (json_is_string(model))
                put_clipped(o, model);
        else
                html_put(o, "<span class=\"muted\">unknown</span>");
        html_put(o, "</td><td class=\"num\">");
        html_put_value(o, "jobs", json_object_get(m, "jobs"), HTML_MAX_DEPTH);
        html_put(o, "</td><td class=\"num rate\">");
        html_put_value(o, "pass_rate", json_object_get(m, "pass_rate"),
                       HTML_MAX_DEPTH);
        html_put(o, "</td>");
        for (i = 0; i < CQ_ARRAY_SIZE(PASS_AT); i++) {
                if (!pass_at[i])
                        continue;
                html_put(o, "<td class=\"num\">");
                html_put_value(o, PASS_AT[i], json_object_get(m, PASS_AT[i]),
                               HTML_MAX_DEPTH);
                html_put(o, "</td>");
        }
        html_put(o, "<td class=\"counts verdicts\">");
        put_counts(o, json_object_get(m, "verdicts"), true);
        html_put(o, "</td><td class=\"counts\">");
        put_counts(o, json_object_get(m, "reasons"), false);
        html_put(o, "</td>");
        for (i = 0; i < CQ_ARRAY_SIZE(nums); i++) {
                html_put(o, "<td class=\"num\">");
                html_put_value(o, nums[i], json_object_get(m, nums[i]),
                               HTML_MAX_DEPTH);
                if (strcmp(nums[i], "cost_usd") == 0 &&
                    json_integer_value(unknown) > 0)
                        html_putf(o,
                                  " <span class=\"muted\" title=\"and "
                                  "%" JSON_INTEGER_FORMAT
                                  " jobs of unknown cost\">+?</span>",
                                  json_integer_value(unknown));
                html_put(o, "</td>");
        }
        html_put(o, "</tr>\n");
}

/* The models side by side, and all their figures below. */
static void put_models(html_out_t *o, const json_t *figures, bool samples)
{
        const json_t *models = json_object_get(figures, "models");
        const json_t *m;
        bool pass_at[CQ_ARRAY_SIZE(PASS_AT)];
        size_t i, k;

        if (json_array_size(models) == 0)
                return;
        for (k = 0; k < CQ_ARRAY_SIZE(PASS_AT); k++) {
                pass_at[k] = false;
                json_array_foreach(models, i, m)
                {
                        if (samples &&
                            json_is_number(json_object_get(m, PASS_AT[k])))
                                pass_at[k] = true;
                }
        }
        html_put(o, "<section id=\"models\">\n<h2>Models</h2>\n"
                    "<div class=\"scroll\"><table class=\"models\">\n"
                    "<thead><tr><th>model</th><th class=\"num\">jobs</th>"
                    "<th class=\"num\">pass rate</th>");
        for (k = 0; k < CQ_ARRAY_SIZE(PASS_AT); k++)
                if (pass_at[k])
                        html_putf(o, "<th class=\"num\">%s</th>",
                                  PASS_AT_LABEL[k]);
        html_put(o, "<th>verdicts</th><th>reasons</th>"
                    "<th class=\"num\">tokens</th><th class=\"num\">cost</th>"
                    "<th class=\"num\">p50</th><th class=\"num\">p95</th>"
                    "</tr></thead>\n<tbody>\n");
        json_array_foreach(models, i, m) put_model_row(o, m, NULL, pass_at);
        if (json_array_size(models) > 1)
                put_model_row(o, json_object_get(figures, "total"),
                              "all models", pass_at);
        html_put(o, "</tbody>\n</table></div>\n<details><summary>All figures "
                    "by model</summary>\n");
        html_put_value(o, "models", models, 0);
        html_put(o, "</details>\n</section>\n");
}

/* ------------------------------------------------------------ the table */

enum col_kind {
        COL_JOB,     /* the id, linking to its page, and its attempts */
        COL_STATUS,  /* a badge */
        COL_VERDICT, /* the verdict, else the reason code */
        COL_TESTS,   /* key passed of key2 in all */
        COL_MEMORY,  /* from_memory and memory_source_job */
        COL_VALUE,   /* html_put_value(): numbers formatted by their key */
};

typedef struct col {
        const char *key;  /* the row key that names the column */
        const char *key2; /* another key it shows, or NULL */
        const char *label;
        enum col_kind kind;
        bool shown; /* by default; a reader chooses the others */
        bool num;   /* sorted as numbers */
} col_t;

/* The columns the index formats, in order: the default ones, always
 * there, then ones a reader may choose, there when some row has a value.
 * Every other key of the rows follows as a column of its own. */
static const col_t KNOWN_COLS[] = {
    {"job_id", NULL, "job", COL_JOB, true, false},
    {"title", NULL, "title", COL_VALUE, true, false},
    {"model", NULL, "model", COL_VALUE, true, false},
    {"status", NULL, "status", COL_STATUS, true, false},
    {"verdict", NULL, "verdict", COL_VERDICT, true, false},
    {"tests_passed", "tests_total", "tests", COL_TESTS, true, true},
    {"turns", NULL, "turns", COL_VALUE, true, true},
    {"cost_usd", NULL, "cost", COL_VALUE, true, true},
    {"duration_ms", NULL, "duration", COL_VALUE, true, true},
    {"reason", NULL, "reason", COL_VALUE, false, false},
    {"hidden_passed", "hidden_total", "hidden tests", COL_TESTS, false, true},
    {"total_tokens", NULL, "tokens", COL_VALUE, false, true},
    {"from_memory", "memory_source_job", "memory", COL_MEMORY, false, false},
    /* claims: a retry is an attempt, this is not */
    {"attempts", NULL, "claims", COL_VALUE, false, true},
};

typedef struct cols {
        col_t *v;
        size_t n, alloc;
} cols_t;

static int cols_add(cols_t *cols, const col_t *col)
{
        if (cols->n == cols->alloc) {
                size_t alloc = cols->alloc ? cols->alloc * 2 : 32;
                col_t *v = realloc(cols->v, alloc * sizeof(*v));

                if (!v)
                        return -1;
                cols->v = v;
                cols->alloc = alloc;
        }
        cols->v[cols->n++] = *col;
        return 0;
}

/* Whether a known column shows \p key. */
static bool known_key(const char *key)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(KNOWN_COLS); i++)
                if (strcmp(KNOWN_COLS[i].key, key) == 0 ||
                    (KNOWN_COLS[i].key2 &&
                     strcmp(KNOWN_COLS[i].key2, key) == 0))
                        return true;
        return false;
}

/* Whether some latest row has a value for \p key, and whether every value
 * it has is a number. */
static bool column_values(const json_t *rows, const char *key, bool *numericp)
{
        const json_t *row;
        bool any = false;
        size_t i;

        *numericp = true;
        json_array_foreach(rows, i, row)
        {
                const json_t *v = json_object_get(row, key);

                if (!is_latest(row) || !v || json_is_null(v))
                        continue;
                any = true;
                if (!json_is_number(v))
                        *numericp = false;
        }
        return any;
}

/* The columns of the table: the known ones, then one per other key that
 * some latest row (any of them, not only the first) has a value for, in
 * the order the rows have them. Returns 0, or -1 when out of memory. */
static int pick_columns(const json_t *rows, cols_t *cols)
{
        json_t *seen = json_object(); /* keys with a column */
        const json_t *row, *v;
        const char *key;
        bool numeric;
        size_t i;
        int rc = -1;

        if (!seen)
                return -1;
        for (i = 0; i < CQ_ARRAY_SIZE(KNOWN_COLS); i++)
                if ((KNOWN_COLS[i].shown ||
                     column_values(rows, KNOWN_COLS[i].key, &numeric)) &&
                    cols_add(cols, &KNOWN_COLS[i]) != 0)
                        goto out;
        json_array_foreach(rows, i, row)
        {
                if (!is_latest(row))
                        continue;
                json_object_foreach((json_t *)(uintptr_t)row, key, v)
                {
                        col_t col = {NULL, NULL, NULL, COL_VALUE, false, false};

                        if (json_is_null(v) || known_key(key) ||
                            json_object_get(seen, key))
                                continue;
                        if (json_object_set_new_nocheck(seen, key, json_true()))
                                goto out;
                        /* borrowed from the row, as the table is */
                        col.key = col.label = key;
                        (void)column_values(rows, key, &col.num);
                        if (cols_add(cols, &col) != 0)
                                goto out;
                }
        }
        rc = 0;
out:
        json_decref(seen);
        return rc;
}

static void put_cell(html_out_t *o,
                     const col_t *col,
                     const json_t *row,
                     const char *page,
                     json_int_t tries)
{
        const json_t *v = json_object_get(row, col->key);

        html_put(o, col->shown ? "<td" : "<td hidden");
        switch (col->kind) {
        case COL_JOB:
                html_put(o, " data-s=\"");
                html_esc_json(o, v);
                html_put(o, "\"><a href=\"jobs/");
                html_esc(o, page);
                html_put(o, "\" title=\"");
                html_esc_json(o, v);
                html_put(o, "\">");
                html_put_short(o, json_string_value(v), ID_SHOW_MAX);
                html_put(o, "</a>");
                if (tries > 1)
                        html_putf(
                            o,
                            " <span class=\"tries\" title=\"the latest "
                            "of %" JSON_INTEGER_FORMAT " attempts; each has a "
                            "page\">&times;%" JSON_INTEGER_FORMAT "</span>",
                            tries, tries);
                html_put(o, "</td>");
                return;
        case COL_STATUS:
                html_put(o, ">");
                html_put_status(o, json_string_value(v));
                html_put(o, "</td>");
                return;
        case COL_VERDICT:
                html_put(o, ">");
                html_put_verdict(o, row);
                html_put(o, "</td>");
                return;
        case COL_TESTS: {
                const json_t *total = json_object_get(row, col->key2);
                double t = json_number_value(total);

                if (json_is_integer(v) && t > 0)
                        html_putf(o, " class=\"num\" data-v=\"%.6f\">",
                                  json_number_value(v) / t);
                else
                        html_put(o, " class=\"num\" data-v=\"-1\">");
                html_put_tests(o, v, total);
                html_put(o, "</td>");
                return;
        }
        case COL_MEMORY:
                html_put(o, ">");
                html_put_memory(o, row);
                html_put(o, "</td>");
                return;
        default:
                break;
        }
        if (col->num && json_is_number(v))
                html_putf(o, " class=\"num\" data-v=\"%.17g\">",
                          json_number_value(v));
        else
                html_put(o, col->num ? " class=\"num\">" : ">");
        if (json_is_string(v)) {
                put_clipped(o, v);
        } else if (json_is_object(v) || json_is_array(v)) {
                /* one line in a table: JSON, whole on hover */
                html_put(o, "<code class=\"clip\" title=\"");
                html_put_json(o, v, JSON_COMPACT, 4096);
                html_put(o, "\">");
                html_put_json(o, v, JSON_COMPACT, 4096);
                html_put(o, "</code>");
        } else {
                /* durations and costs are formatted by their key's suffix */
                html_put_value(o, col->key, v, HTML_MAX_DEPTH - 1);
        }
        html_put(o, "</td>");
}

/* The filter, the status menu, the column chooser and the count. */
static void put_controls(html_out_t *o, const json_t *rows, const cols_t *cols)
{
        size_t i, k, shown = 0;
        const json_t *row;

        html_put(o, "<div class=\"controls\">\n"
                    "<input id=\"q\" type=\"search\" placeholder=\"Filter: "
                    "job, title, verdict, reason...\" aria-label=\"Filter "
                    "jobs\">\n<select id=\"status\" aria-label=\"Status\">"
                    "<option value=\"\">all statuses</option>");
        for (k = 0; k < CQ_ARRAY_SIZE(html_statuses); k++) {
                size_t count = 0;

                json_array_foreach(rows, i, row)
                {
                        const char *s =
                            json_string_value(json_object_get(row, "status"));

                        count += is_latest(row) && s &&
                                 strcmp(s, html_statuses[k]) == 0;
                }
                if (count)
                        html_putf(o, "<option value=\"%s\">%s (%zu)</option>",
                                  html_statuses[k], html_statuses[k], count);
        }
        html_put(o, "</select>\n<details id=\"cols\" class=\"chooser\">"
                    "<summary>Columns</summary><div class=\"menu\">\n");
        for (i = 0; i < cols->n; i++) {
                html_put(o, "<label><input type=\"checkbox\" value=\"");
                html_esc(o, cols->v[i].key);
                html_put(o, "\"");
                if (cols->v[i].shown)
                        html_put(o, " checked");
                if (cols->v[i].kind == COL_JOB)
                        html_put(o, " disabled");
                html_put(o, "> ");
                html_put_label(o, cols->v[i].label);
                html_put(o, "</label>\n");
        }
        html_put(o, "<button type=\"button\" id=\"cols-default\">Default "
                    "columns</button></div></details>\n");
        json_array_foreach(rows, i, row) shown += is_latest(row);
        html_putf(o,
                  "<span class=\"muted\"><span id=\"shown\">%zu</span> of "
                  "%zu jobs shown</span>\n</div>\n",
                  shown, shown);
}

/* Attempts of each original job: root -> count (ids as keys as they are:
 * a key need not be valid UTF-8 to be found). NULL when out of memory. */
static json_t *count_attempts(const json_t *rows)
{
        json_t *tries = json_object();
        const json_t *row;
        size_t i;

        json_array_foreach(rows, i, row)
        {
                const char *root = root_of(row);
                json_int_t n = json_integer_value(json_object_get(tries, root));

                if (tries && json_object_set_new_nocheck(
                                 tries, root, json_integer(n + 1)) != 0) {
                        json_decref(tries);
                        tries = NULL;
                }
        }
        return tries;
}

static void put_jobs(html_out_t *o,
                     const json_t *rows,
                     const char (*names)[CQ_HTML_NAME_MAX])
{
        cols_t cols = {NULL, 0, 0};
        json_t *tries = count_attempts(rows);
        const json_t *row;
        size_t i, j;

        if (!tries || pick_columns(rows, &cols) != 0) {
                html_oom(o);
                goto out;
        }
        html_put(o, "<section id=\"jobs-section\">\n<h2>Jobs</h2>\n");
        put_controls(o, rows, &cols);
        html_put(o, "<div class=\"scroll\"><table id=\"jobs\">\n<thead><tr>");
        for (j = 0; j < cols.n; j++) {
                /* hidden first: the script's aria-sort goes last */
                html_put(o, cols.v[j].shown ? "<th data-key=\""
                                            : "<th hidden data-key=\"");
                html_esc(o, cols.v[j].key);
                html_put(o, cols.v[j].num
                                ? "\" data-type=\"num\" class=\"num\">"
                                : "\" data-type=\"text\">");
                html_put(o, "<button type=\"button\">");
                html_put_label(o, cols.v[j].label);
                html_put(o, "</button></th>");
        }
        html_put(o, "</tr></thead>\n<tbody>\n");
        json_array_foreach(rows, i, row)
        {
                json_int_t n =
                    json_integer_value(json_object_get(tries, root_of(row)));

                if (!is_latest(row))
                        continue;
                html_put(o, "<tr data-status=\"");
                html_esc(o, json_string_value(json_object_get(row, "status")));
                html_put(o, "\" data-id=\"");
                html_esc_json(o, json_object_get(row, "job_id"));
                html_put(o, "\">");
                for (j = 0; j < cols.n; j++)
                        put_cell(o, &cols.v[j], row, names[i], n);
                html_put(o, "</tr>\n");
        }
        html_put(o, "</tbody>\n</table></div>\n</section>\n");
out:
        free(cols.v);
        json_decref(tries);
}

/* ------------------------------------------------------------ the grid */

/* A sample in the grid: its row, the row of its problem (and model), and
 * its index. */
typedef struct sample {
        size_t row;
        json_int_t group, index;
} sample_t;

static int cmp_sample(const void *a, const void *b)
{
        const sample_t *x = a, *y = b;

        if (x->group != y->group)
                return x->group < y->group ? -1 : 1;
        if (x->index != y->index)
                return x->index < y->index ? -1 : 1;
        return x->row < y->row ? -1 : x->row > y->row;
}

/* The ordinal of \p problem asked of \p model in \p groups ({problem:
 * {model: ordinal}}), given the next one when new; -1 when out of
 * memory. */
static json_int_t group_of(json_t *groups,
                           const char *problem,
                           const char *model,
                           json_int_t *nextp)
{
        json_t *by_model = json_object_get(groups, problem);
        const json_t *g;

        if (!by_model) {
                by_model = json_object();
                if (json_object_set_new_nocheck(groups, problem, by_model) != 0)
                        return -1;
        }
        g = json_object_get(by_model, model);
        if (g)
                return json_integer_value(g);
        if (json_object_set_new_nocheck(by_model, model,
                                        json_integer(*nextp)) != 0)
                return -1;
        return (*nextp)++;
}

/* The latest attempt of each sample, by problem (and model: one problem
 * may be asked of several) in the order the run has them, then by index.
 * *\p nmodelsp: how many models the samples have. NULL when out of
 * memory. */
static sample_t *
collect_samples(const json_t *rows, size_t *np, size_t *nmodelsp)
{
        json_t *groups = json_object(), *models = json_object();
        sample_t *v = calloc(json_array_size(rows) + 1, sizeof(*v));
        const json_t *row;
        json_int_t next = 0;
        size_t i, n = 0;
        bool failed = !groups || !models || !v;

        json_array_foreach(rows, i, row)
        {
                const char *problem =
                    json_string_value(json_object_get(row, "problem_id"));
                const char *model =
                    json_string_value(json_object_get(row, "model"));
                const json_t *index = json_object_get(row, "sample_index");

                if (failed || !is_latest(row) || !problem ||
                    !json_is_integer(index))
                        continue;
                v[n].row = i;
                v[n].group =
                    group_of(groups, problem, model ? model : "", &next);
                v[n].index = json_integer_value(index);
                failed = v[n].group < 0 ||
                         json_object_set_new_nocheck(models, model ? model : "",
                                                     json_true()) != 0;
                n++;
        }
        *nmodelsp = json_object_size(models);
        json_decref(groups);
        json_decref(models);
        if (failed) {
                free(v);
                return NULL;
        }
        qsort(v, n, sizeof(*v), cmp_sample);
        *np = n;
        return v;
}

static void put_legend(html_out_t *o)
{
        size_t i;

        html_put(o, "<p class=\"legend\">");
        for (i = 0; i < CQ_ARRAY_SIZE(html_verdicts); i++)
                html_putf(o,
                          "<span class=\"key\"><span class=\"sq v-%s\">"
                          "</span>%s</span>",
                          html_verdicts[i], html_verdicts[i]);
        html_put(o, "<span class=\"key\"><span class=\"sq v-none\"></span>"
                    "no verdict yet</span></p>\n");
}

/* One problem's row: its samples from \p s (n of them), each a square
 * coloured by its verdict linking to its page, at its index. */
static void put_problem(html_out_t *o,
                        const json_t *rows,
                        const char (*names)[CQ_HTML_NAME_MAX],
                        const sample_t *s,
                        size_t n,
                        json_int_t columns,
                        bool models)
{
        const json_t *first = json_array_get(rows, s[0].row);
        const json_t *model = json_object_get(first, "model");
        size_t i, passed = 0, scored = 0;
        json_int_t at = 0;

        for (i = 0; i < n; i++) {
                const char *v = json_string_value(
                    json_object_get(json_array_get(rows, s[i].row), "verdict"));

                passed += v && strcmp(v, "passed") == 0;
                scored += v && strcmp(v, "infra_error") != 0;
        }
        html_put(o, "<tr><td><span class=\"clip\" title=\"");
        html_esc_json(o, json_object_get(first, "problem_id"));
        html_put(o, "\">");
        html_put_short(o,
                       json_string_value(json_object_get(first, "problem_id")),
                       ID_SHOW_MAX);
        html_put(o, "</span></td>");
        if (models) {
                html_put(o, "<td>");
                if (json_is_string(model))
                        put_clipped(o, model);
                else
                        html_put(o, "<span class=\"muted\">unknown</span>");
                html_put(o, "</td>");
        }
        html_putf(o, "<td class=\"num\">%zu/%zu</td>", passed, scored);
        for (i = 0; i < n; i++) {
                const json_t *row = json_array_get(rows, s[i].row);
                const char *verdict =
                    json_string_value(json_object_get(row, "verdict"));
                const char *status =
                    json_string_value(json_object_get(row, "status"));

                /* two attempts of one index (not made by coderq) share
                 * its cell's place: the first is drawn */
                if (s[i].index < at)
                        continue;
                for (; at < s[i].index; at++)
                        html_put(o, "<td></td>");
                html_putf(o, "<td><a class=\"sq v-%s\" href=\"jobs/",
                          html_verdict_class(verdict));
                html_esc(o, names[s[i].row]);
                html_put(o, "\" title=\"");
                html_esc_json(o, json_object_get(row, "job_id"));
                html_put(o, ": ");
                html_esc(o, verdict ? verdict : status ? status : "unknown");
                html_put(o, "\"></a></td>");
                at++;
        }
        for (; at < columns; at++)
                html_put(o, "<td></td>");
        html_put(o, "</tr>\n");
}

static void put_samples(html_out_t *o,
                        const json_t *rows,
                        const char (*names)[CQ_HTML_NAME_MAX])
{
        size_t n = 0, nmodels = 0, i, start;
        sample_t *s = collect_samples(rows, &n, &nmodels);
        json_int_t columns = 0, k;

        if (!s) {
                html_oom(o);
                return;
        }
        for (i = 0; i < n; i++)
                if (s[i].index + 1 > columns)
                        columns = s[i].index + 1;
        html_put(o, "<section id=\"samples\">\n<h2>Samples</h2>\n"
                    "<p class=\"muted\">The latest attempt of each sample, "
                    "by problem; a square links to its page. Passed counts "
                    "the samples with a verdict other than "
                    "infra_error.</p>\n");
        put_legend(o);
        html_put(o, "<div class=\"scroll\"><table class=\"grid\">\n<thead>"
                    "<tr><th>problem</th>");
        if (nmodels > 1)
                html_put(o, "<th>model</th>");
        html_put(o, "<th class=\"num\">passed</th>");
        for (k = 0; k < columns; k++)
                html_putf(o, "<th class=\"ix\">%" JSON_INTEGER_FORMAT "</th>",
                          k);
        html_put(o, "</tr></thead>\n<tbody>\n");
        for (start = 0, i = 1; i <= n; i++) {
                if (i < n && s[i].group == s[start].group)
                        continue;
                put_problem(o, rows, names, s + start, i - start, columns,
                            nmodels > 1);
                start = i;
        }
        html_put(o, "</tbody>\n</table></div>\n</section>\n");
        free(s);
}

/* ------------------------------------------------------------ the page */

cq_err_t cq_html_index(cq_buf_t *buf,
                       const cq_html_meta_t *meta,
                       const json_t *figures,
                       const json_t *rows,
                       const char (*names)[CQ_HTML_NAME_MAX])
{
        html_out_t o = {buf, CQ_OK};
        size_t i, jobs = 0, nrows = json_array_size(rows);
        bool samples = has_samples(rows);
        const json_t *row;
        char title[300];

        json_array_foreach(rows, i, row) jobs += is_latest(row);
        snprintf(title, sizeof(title), "coderq run %s", meta->run_id);
        html_page_start(&o, title, true);
        html_put(&o, "<header><h1>Run ");
        html_esc(&o, meta->run_id);
        html_putf(&o, "</h1><div class=\"sub\">%zu jobs", jobs);
        if (nrows > jobs)
                html_putf(&o, " (%zu attempts)", nrows);
        html_put(&o, " &middot; report written ");
        html_esc(&o, meta->generated_at);
        html_put(&o, " by coderq ");
        html_esc(&o, meta->version);
        html_put(&o, " &middot; <a href=\"#figures\">figures</a>");
        if (json_array_size(json_object_get(figures, "models")) > 0)
                html_put(&o, " <a href=\"#models\">models</a>");
        html_put(&o, " <a href=\"#jobs-section\">jobs</a>");
        if (samples)
                html_put(&o, " <a href=\"#samples\">samples</a>");
        html_put(&o, "</div></header>\n<main>\n");
        put_figures(&o, figures, samples);
        put_models(&o, figures, samples);
        put_jobs(&o, rows, names);
        if (samples)
                put_samples(&o, rows, names);
        html_page_end(&o, true);
        return o.err;
}
