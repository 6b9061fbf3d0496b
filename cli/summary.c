/* SPDX-License-Identifier: MIT */
/* summary.c - the figures of an evaluation run as a table, JSON or CSV,
 * the one-line summary of `coderq results`, and the depth of the queues
 * as a table. The figures come from
 * PostgreSQL (coderq_run_summary()), pass@k and pass^k included: nothing
 * is computed here but their formatting. Numbers arrive as JSON integers
 * or reals depending on their SQL type, so every figure is read with
 * json_number_value() and a missing or null one prints as "-". */
#include "coderq/cli/summary.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/cli/clifmt.h"

/* The figures of one group, in table and CSV order. */
static const char *const figure_keys[] = {"jobs",
                                          "succeeded",
                                          "failed",
                                          "cancelled",
                                          "queued",
                                          "running",
                                          "pending",
                                          "pass_rate",
                                          "from_memory",
                                          "retried",
                                          "tests_passed",
                                          "tests_total",
                                          "turns",
                                          "mean_turns",
                                          "retries",
                                          "mean_retries",
                                          "prompt_tokens",
                                          "completion_tokens",
                                          "cache_read_tokens",
                                          "cache_creation_tokens",
                                          "total_tokens",
                                          "cost_usd",
                                          "cost_unknown",
                                          "p50_duration_ms",
                                          "p95_duration_ms",
                                          "max_duration_ms",
                                          "problems",
                                          "samples",
                                          "min_samples",
                                          "pass_at_1",
                                          "pass_at_10",
                                          "pass_at_100",
                                          "pass_hat_1",
                                          "pass_hat_10",
                                          "pass_hat_100",
                                          "infra_errors",
                                          "bendable",
                                          "hidden_passed",
                                          "hidden_total"};

/* The verdicts of migrations/0007_evaluation.sql, in the order they are
 * shown: passed first, ours (infra_error) last. */
static const char *const verdict_order[] = {
    "passed",       "wrong_answer", "runtime_error", "timeout",
    "syntax_error", "no_answer",    "stuck",         "infra_error"};

/* pass@k and pass^k columns of the table: key and header */
static const char *const passk_keys[] = {"pass_at_1",   "pass_at_10",
                                         "pass_at_100", "pass_hat_1",
                                         "pass_hat_10", "pass_hat_100"};

/* What the depth of a queue counts, in table and CSV order. */
static const char *const queue_keys[] = {"queued", "waiting", "running"};

int cq_summary_format_parse(const char *name, cq_summary_format_t *formatp)
{
        if (strcmp(name, "table") == 0)
                *formatp = CQ_SUMMARY_TABLE;
        else if (strcmp(name, "json") == 0)
                *formatp = CQ_SUMMARY_JSON;
        else if (strcmp(name, "csv") == 0)
                *formatp = CQ_SUMMARY_CSV;
        else
                return -1;
        return 0;
}

static bool has_num(const json_t *obj, const char *key)
{
        return json_is_number(json_object_get(obj, key));
}

static double num(const json_t *obj, const char *key)
{
        return json_number_value(json_object_get(obj, key));
}

/* A count, "-" when absent. */
static void count_text(const json_t *obj, const char *key, char *out, size_t n)
{
        if (has_num(obj, key))
                snprintf(out, n, "%.0f", num(obj, key));
        else
                snprintf(out, n, "-");
}

static void fmt_usd(char *out, size_t n, double usd)
{
        if (usd == 0)
                snprintf(out, n, "$0");
        else if (usd < 0.01)
                snprintf(out, n, "$%.6f", usd);
        else
                snprintf(out, n, "$%.4f", usd);
}

/* "$0.0123", with '*' when some costs are unknown (a lower bound). */
static void cost_text(const json_t *g, char *out, size_t n)
{
        size_t len;

        if (!has_num(g, "cost_usd")) {
                snprintf(out, n, "-");
                return;
        }
        fmt_usd(out, n, num(g, "cost_usd"));
        len = strlen(out);
        if (num(g, "cost_unknown") > 0 && len + 1 < n) {
                out[len] = '*';
                out[len + 1] = '\0';
        }
}

/* A share as a percentage, "-" when absent. */
static void percent_text(const json_t *g, const char *key, char *out, size_t n)
{
        if (has_num(g, key))
                snprintf(out, n, "%.1f%%", num(g, key) * 100.0);
        else
                snprintf(out, n, "-");
}

static void rate_text(const json_t *g, char *out, size_t n)
{
        percent_text(g, "pass_rate", out, n);
}

static void dur_text(const json_t *g, const char *key, char *out, size_t n)
{
        cq_fmt_duration(out, n,
                        has_num(g, key) ? (long long)(num(g, key) + 0.5) : -1);
}

static const char *model_label(const json_t *g)
{
        const char *m = json_string_value(json_object_get(g, "model"));

        return m ? m : "(default)";
}

/* The reason codes of \p reasons sorted (jsonb orders keys by length).
 * Returns a NULL-terminated array of borrowed keys (caller frees the
 * array), NULL when out of memory. */
static int cmp_str(const void *a, const void *b)
{
        return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Verdicts in verdict_order, any other after them by name. */
static size_t verdict_rank(const char *v)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(verdict_order); i++)
                if (strcmp(v, verdict_order[i]) == 0)
                        return i;
        return CQ_ARRAY_SIZE(verdict_order);
}

static int cmp_verdict(const void *a, const void *b)
{
        const char *x = *(const char *const *)a, *y = *(const char *const *)b;
        size_t rx = verdict_rank(x), ry = verdict_rank(y);

        if (rx != ry)
                return rx < ry ? -1 : 1;
        return strcmp(x, y);
}

static const char **ordered_keys(const json_t *obj,
                                 int (*cmp)(const void *, const void *),
                                 size_t *np)
{
        const char **v;
        const char *key;
        json_t *value;
        size_t n = 0;

        v = calloc(json_object_size(obj) + 1, sizeof(*v));
        if (!v)
                return NULL;
        json_object_foreach((json_t *)(uintptr_t)obj, key, value)
        {
                (void)value;
                v[n++] = key;
        }
        qsort(v, n, sizeof(*v), cmp);
        *np = n;
        return v;
}

static const char **sorted_codes(const json_t *reasons, size_t *np)
{
        return ordered_keys(reasons, cmp_str, np);
}

static const char **sorted_verdicts(const json_t *verdicts, size_t *np)
{
        return ordered_keys(verdicts, cmp_verdict, np);
}

static cq_err_t
add_group_row(cq_table_t *table, const json_t *g, const char *label)
{
        char jobs[32], ok[32], failed[32], cancelled[32], pending[32];
        char rate[32], memory[32], retried[32], turns[32], tokens[32];
        char cost[48], p50[32], p95[32], max[32];
        const char *cells[15];

        count_text(g, "jobs", jobs, sizeof(jobs));
        count_text(g, "succeeded", ok, sizeof(ok));
        count_text(g, "failed", failed, sizeof(failed));
        count_text(g, "cancelled", cancelled, sizeof(cancelled));
        count_text(g, "pending", pending, sizeof(pending));
        rate_text(g, rate, sizeof(rate));
        count_text(g, "from_memory", memory, sizeof(memory));
        count_text(g, "retried", retried, sizeof(retried));
        if (has_num(g, "mean_turns"))
                snprintf(turns, sizeof(turns), "%.2f", num(g, "mean_turns"));
        else
                snprintf(turns, sizeof(turns), "-");
        count_text(g, "total_tokens", tokens, sizeof(tokens));
        cost_text(g, cost, sizeof(cost));
        dur_text(g, "p50_duration_ms", p50, sizeof(p50));
        dur_text(g, "p95_duration_ms", p95, sizeof(p95));
        dur_text(g, "max_duration_ms", max, sizeof(max));
        cells[0] = label;
        cells[1] = jobs;
        cells[2] = ok;
        cells[3] = failed;
        cells[4] = cancelled;
        cells[5] = pending;
        cells[6] = rate;
        cells[7] = memory;
        cells[8] = retried;
        cells[9] = turns;
        cells[10] = tokens;
        cells[11] = cost;
        cells[12] = p50;
        cells[13] = p95;
        cells[14] = max;
        return cq_table_add(table, cells) ? CQ_ERR_TOO_LARGE : CQ_OK;
}

/* Counts by code (the object \p key of each group: reasons, verdicts)
 * under \p title: one row per code (\p order's), one column per model and
 * the total, headed \p first. Nothing when the total has none. */
static cq_err_t render_counts(const json_t *models,
                              const json_t *total,
                              const char *key,
                              const char *title,
                              const char *first,
                              const char **(*order)(const json_t *, size_t *),
                              cq_buf_t *buf)
{
        const json_t *reasons = json_object_get(total, key);
        size_t ncodes = 0, nmodels = json_array_size(models), ncols, i, k;
        const char **codes = NULL, **headers = NULL, **cells = NULL;
        char(*texts)[32] = NULL;
        int *align = NULL;
        cq_table_t *table = NULL;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (json_object_size(reasons) == 0)
                return CQ_OK;
        codes = order(reasons, &ncodes);
        ncols = nmodels + 2;
        headers = calloc(ncols, sizeof(*headers));
        cells = calloc(ncols, sizeof(*cells));
        align = calloc(ncols, sizeof(*align));
        texts = calloc(ncols, sizeof(*texts));
        if (!codes || !headers || !cells || !align || !texts)
                goto out;
        headers[0] = first;
        align[0] = CQ_TABLE_LEFT;
        for (k = 0; k < nmodels; k++) {
                headers[k + 1] = model_label(json_array_get(models, k));
                align[k + 1] = CQ_TABLE_RIGHT;
        }
        headers[ncols - 1] = "TOTAL";
        align[ncols - 1] = CQ_TABLE_RIGHT;
        table = cq_table_new(ncols, headers, align, 48);
        if (!table)
                goto out;
        for (i = 0; i < ncodes; i++) {
                cells[0] = codes[i];
                for (k = 0; k < nmodels; k++) {
                        const json_t *r =
                            json_object_get(json_array_get(models, k), key);

                        snprintf(texts[k + 1], sizeof(texts[k + 1]), "%.0f",
                                 num(r, codes[i]));
                        cells[k + 1] = texts[k + 1];
                }
                snprintf(texts[ncols - 1], sizeof(texts[ncols - 1]), "%.0f",
                         num(reasons, codes[i]));
                cells[ncols - 1] = texts[ncols - 1];
                if (cq_table_add(table, cells))
                        goto out;
        }
        if (cq_buf_printf(buf, "\n%s:\n", title) != CQ_OK)
                goto out;
        err = cq_table_render(table, buf);
out:
        cq_table_destroy(&table);
        free(codes);
        free(headers);
        free(cells);
        free(align);
        free(texts);
        return err;
}

static cq_err_t
add_passk_row(cq_table_t *table, const json_t *g, const char *label)
{
        char texts[11][32];
        const char *cells[12];
        size_t i;

        cells[0] = label;
        count_text(g, "problems", texts[0], sizeof(texts[0]));
        count_text(g, "samples", texts[1], sizeof(texts[1]));
        count_text(g, "min_samples", texts[2], sizeof(texts[2]));
        for (i = 0; i < CQ_ARRAY_SIZE(passk_keys); i++)
                percent_text(g, passk_keys[i], texts[3 + i], sizeof(texts[0]));
        count_text(g, "infra_errors", texts[9], sizeof(texts[9]));
        count_text(g, "bendable", texts[10], sizeof(texts[10]));
        for (i = 0; i < 11; i++)
                cells[i + 1] = texts[i];
        return cq_table_add(table, cells) ? CQ_ERR_TOO_LARGE : CQ_OK;
}

/* One footnote of the pass@k table, when \p key of the total is not 0. */
static cq_err_t passk_note(cq_buf_t *buf,
                           const json_t *total,
                           const char *key,
                           const char *label,
                           const char *rest)
{
        if (num(total, key) <= 0)
                return CQ_OK;
        return cq_buf_printf(buf, "%s%.0f %s\n", label, num(total, key), rest);
}

/* pass@k and pass^k of the scored samples by model, when the run has
 * any, with what they leave out and what could have bent them. */
static cq_err_t
render_passk(const json_t *models, const json_t *total, cq_buf_t *buf)
{
        static const char *const headers[] = {
            "MODEL",   "PROBLEMS", "SAMPLES",  "MIN",
            "PASS@1",  "PASS@10",  "PASS@100", "PASS^1",
            "PASS^10", "PASS^100", "INFRA",    "BENDABLE"};
        int align[CQ_ARRAY_SIZE(headers)];
        cq_table_t *table;
        const json_t *g;
        size_t i;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (num(total, "problems") <= 0)
                return CQ_OK;
        for (i = 0; i < CQ_ARRAY_SIZE(headers); i++)
                align[i] = i ? CQ_TABLE_RIGHT : CQ_TABLE_LEFT;
        table = cq_table_new(CQ_ARRAY_SIZE(headers), headers, align, 48);
        if (!table)
                return CQ_ERR_TOO_LARGE;
        json_array_foreach(models, i, g)
        {
                if (add_passk_row(table, g, model_label(g)) != CQ_OK)
                        goto out;
        }
        if (add_passk_row(table, total, "TOTAL") != CQ_OK ||
            cq_buf_append_str(buf, "\npass@k and pass^k over the scored "
                                   "samples (MIN: the fewest of one "
                                   "problem; a k shows where MIN >= k):\n") !=
                CQ_OK ||
            cq_table_render(table, buf) != CQ_OK ||
            passk_note(buf, total, "infra_errors", "INFRA: ",
                       "infra errors (ours, not the model's), left out of "
                       "every score") != CQ_OK ||
            passk_note(buf, total, "bendable", "BENDABLE: ",
                       "scored verdicts came from test code run in the "
                       "model's own interpreter (judge \"model\"), which its "
                       "code could bend") != CQ_OK ||
            passk_note(buf, total, "from_memory", "MEMORY: ",
                       "jobs finished from memory, with a remembered "
                       "solution and no LLM call") != CQ_OK)
                goto out;
        err = CQ_OK;
out:
        cq_table_destroy(&table);
        return err;
}

/* The queues of the run's jobs, when the figures name them. */
static cq_err_t render_queues(const json_t *queues, cq_buf_t *buf)
{
        if (json_array_size(queues) == 0)
                return CQ_OK;
        if (cq_buf_append_str(buf, "\nthe queues of the run's jobs, with "
                                   "every job they hold:\n") != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        return cq_summary_queues(queues, buf);
}

static cq_err_t render_table(const json_t *figures, cq_buf_t *buf)
{
        static const char *const headers[] = {
            "MODEL",   "JOBS", "OK",     "FAILED",  "CANCELLED",
            "PENDING", "PASS", "MEMORY", "RETRIED", "TURNS",
            "TOKENS",  "COST", "P50",    "P95",     "MAX"};
        static const int align[] = {
            CQ_TABLE_LEFT,  CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
            CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
            CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
            CQ_TABLE_RIGHT, CQ_TABLE_RIGHT, CQ_TABLE_RIGHT};
        const json_t *models = json_object_get(figures, "models");
        const json_t *total = json_object_get(figures, "total");
        const char *attempts =
            json_string_value(json_object_get(figures, "attempts"));
        bool all = attempts && strcmp(attempts, "all") == 0;
        cq_table_t *table;
        const json_t *g;
        char money[48], spent[48];
        size_t i;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (cq_buf_printf(buf, "run %s: %s (%.0f %s)\n",
                          json_string_value(json_object_get(figures, "run_id")),
                          all ? "every attempt"
                              : "the latest attempt of each original job",
                          num(total, "jobs"),
                          all ? "jobs" : "original jobs") != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        table = cq_table_new(CQ_ARRAY_SIZE(headers), headers, align, 48);
        if (!table)
                return CQ_ERR_TOO_LARGE;
        json_array_foreach(models, i, g)
        {
                if (add_group_row(table, g, model_label(g)) != CQ_OK)
                        goto out;
        }
        if (add_group_row(table, total, "TOTAL") != CQ_OK ||
            cq_table_render(table, buf) != CQ_OK)
                goto out;
        if (num(total, "cost_unknown") > 0 &&
            cq_buf_printf(buf,
                          "* %.0f job%s with an unknown cost (a model without "
                          "a price, or a reply without usage): the cost "
                          "shown is a lower bound\n",
                          num(total, "cost_unknown"),
                          num(total, "cost_unknown") == 1 ? "" : "s") != CQ_OK)
                goto out;
        if (render_passk(models, total, buf) != CQ_OK ||
            render_counts(models, total, "verdicts", "finished jobs by verdict",
                          "VERDICT", sorted_verdicts, buf) != CQ_OK ||
            render_counts(models, total, "reasons",
                          "failed and cancelled jobs by reason", "REASON",
                          sorted_codes, buf) != CQ_OK)
                goto out;
        if (has_num(figures, "budget_usd")) {
                double b = num(figures, "budget_usd");
                double s = num(figures, "spent_usd");

                fmt_usd(money, sizeof(money), b);
                fmt_usd(spent, sizeof(spent), s);
                if (cq_buf_printf(buf,
                                  "\nbudget %s: %s spent by every attempt, "
                                  "%s\n",
                                  money, spent,
                                  s > b ? "over the budget" : "within it") !=
                    CQ_OK)
                        goto out;
        }
        if (render_queues(json_object_get(figures, "queues"), buf) != CQ_OK)
                goto out;
        err = CQ_OK;
out:
        cq_table_destroy(&table);
        return err;
}

static cq_err_t csv_value(cq_buf_t *buf, const json_t *value)
{
        cq_buf_t field;
        cq_err_t err;

        cq_buf_init(&field, SIZE_MAX);
        err = cq_fmt_scalar(&field, value);
        if (err == CQ_OK)
                err = cq_fmt_csv_field(buf, field.data);
        cq_buf_release(&field);
        return err;
}

/* ",N" for each code of \p codes in the object \p key of \p g (0 when
 * absent). */
static cq_err_t csv_counts(cq_buf_t *buf,
                           const json_t *g,
                           const char *key,
                           const char *const *codes,
                           size_t ncodes)
{
        const json_t *counts = json_object_get(g, key);
        size_t i;

        for (i = 0; i < ncodes; i++)
                if (cq_buf_printf(buf, ",%.0f", num(counts, codes[i])) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        return CQ_OK;
}

/* ",N" for each figure of each queue: the same on every line, as the
 * queues are not the model's. */
static cq_err_t csv_queues(cq_buf_t *buf, const json_t *queues)
{
        const json_t *q;
        size_t i, k;

        json_array_foreach(queues, i, q)
        {
                for (k = 0; k < CQ_ARRAY_SIZE(queue_keys); k++)
                        if (cq_buf_printf(buf, ",%.0f",
                                          num(q, queue_keys[k])) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
        }
        return CQ_OK;
}

/* Columns are the same for every line: the codes of the total. */
typedef struct csv_codes {
        const char **verdicts, **reasons;
        size_t nverdicts, nreasons;
} csv_codes_t;

static cq_err_t csv_row(cq_buf_t *buf,
                        const json_t *figures,
                        const char *group,
                        const json_t *g,
                        const csv_codes_t *codes)
{
        size_t i;

        if (cq_fmt_csv_field(buf, json_string_value(json_object_get(
                                      figures, "run_id"))) != CQ_OK ||
            cq_buf_append(buf, ",", 1) != CQ_OK ||
            cq_fmt_csv_field(buf, json_string_value(json_object_get(
                                      figures, "attempts"))) != CQ_OK ||
            cq_buf_printf(buf, ",%s,", group) != CQ_OK ||
            csv_value(buf, json_object_get(g, "model")) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        for (i = 0; i < CQ_ARRAY_SIZE(figure_keys); i++)
                if (cq_buf_append(buf, ",", 1) != CQ_OK ||
                    csv_value(buf, json_object_get(g, figure_keys[i])) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        if (csv_counts(buf, g, "verdicts", codes->verdicts, codes->nverdicts) !=
                CQ_OK ||
            csv_counts(buf, g, "reasons", codes->reasons, codes->nreasons) !=
                CQ_OK ||
            csv_queues(buf, json_object_get(figures, "queues")) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        return cq_buf_append(buf, "\r\n", 2) == CQ_OK ? CQ_OK
                                                      : CQ_ERR_TOO_LARGE;
}

/* ",PREFIXcode" for each code */
static cq_err_t csv_code_headers(cq_buf_t *buf,
                                 const char *prefix,
                                 const char *const *codes,
                                 size_t ncodes)
{
        size_t i;

        for (i = 0; i < ncodes; i++)
                if (cq_buf_printf(buf, ",%s", prefix) != CQ_OK ||
                    cq_fmt_csv_field(buf, codes[i]) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        return CQ_OK;
}

/* ",queue_Q_queued,queue_Q_waiting,queue_Q_running" for each queue Q */
static cq_err_t csv_queue_headers(cq_buf_t *buf, const json_t *queues)
{
        const json_t *q;
        size_t i, k;

        json_array_foreach(queues, i, q)
        {
                const char *name =
                    json_string_value(json_object_get(q, "queue"));
                char header[128];

                for (k = 0; k < CQ_ARRAY_SIZE(queue_keys); k++) {
                        snprintf(header, sizeof(header), "queue_%s_%s",
                                 name ? name : "", queue_keys[k]);
                        if (cq_buf_append(buf, ",", 1) != CQ_OK ||
                            cq_fmt_csv_field(buf, header) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                }
        }
        return CQ_OK;
}

static cq_err_t render_csv(const json_t *figures, cq_buf_t *buf)
{
        const json_t *models = json_object_get(figures, "models");
        const json_t *total = json_object_get(figures, "total");
        csv_codes_t codes;
        const json_t *g;
        size_t i;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        memset(&codes, 0, sizeof(codes));
        codes.verdicts = sorted_verdicts(json_object_get(total, "verdicts"),
                                         &codes.nverdicts);
        codes.reasons =
            sorted_codes(json_object_get(total, "reasons"), &codes.nreasons);
        if (!codes.verdicts || !codes.reasons)
                goto out;
        if (cq_buf_append_str(buf, "run_id,attempts,group,model") != CQ_OK)
                goto out;
        for (i = 0; i < CQ_ARRAY_SIZE(figure_keys); i++)
                if (cq_buf_printf(buf, ",%s", figure_keys[i]) != CQ_OK)
                        goto out;
        if (csv_code_headers(buf, "verdict_", codes.verdicts,
                             codes.nverdicts) != CQ_OK ||
            csv_code_headers(buf, "reason_", codes.reasons, codes.nreasons) !=
                CQ_OK ||
            csv_queue_headers(buf, json_object_get(figures, "queues")) !=
                CQ_OK ||
            cq_buf_append(buf, "\r\n", 2) != CQ_OK)
                goto out;
        json_array_foreach(models, i, g)
        {
                if (csv_row(buf, figures, "model", g, &codes) != CQ_OK)
                        goto out;
        }
        err = csv_row(buf, figures, "total", total, &codes);
out:
        free(codes.verdicts);
        free(codes.reasons);
        return err;
}

cq_err_t cq_summary_render(const json_t *figures,
                           cq_summary_format_t format,
                           cq_buf_t *buf)
{
        char *text;
        cq_err_t err;

        if (!json_is_object(json_object_get(figures, "total")))
                return CQ_ERR_FATAL;
        switch (format) {
        case CQ_SUMMARY_JSON:
                text =
                    json_dumps(figures, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                if (!text)
                        return CQ_ERR_TOO_LARGE;
                err = cq_buf_append_str(buf, text) == CQ_OK &&
                              cq_buf_append(buf, "\n", 1) == CQ_OK
                          ? CQ_OK
                          : CQ_ERR_TOO_LARGE;
                free(text);
                return err;
        case CQ_SUMMARY_CSV:
                return render_csv(figures, buf);
        case CQ_SUMMARY_TABLE:
        default:
                return render_table(figures, buf);
        }
}

cq_err_t cq_summary_queues(const json_t *queues, cq_buf_t *buf)
{
        static const char *const headers[] = {"QUEUE", "QUEUED", "WAITING",
                                              "RUNNING"};
        static const int align[] = {CQ_TABLE_LEFT, CQ_TABLE_RIGHT,
                                    CQ_TABLE_RIGHT, CQ_TABLE_RIGHT};
        cq_table_t *table;
        const json_t *q;
        size_t i, k;
        cq_err_t err = CQ_ERR_TOO_LARGE;

        if (json_array_size(queues) == 0)
                return cq_buf_append_str(buf, "no queue holds a queued or "
                                              "running job\n") == CQ_OK
                           ? CQ_OK
                           : CQ_ERR_TOO_LARGE;
        table = cq_table_new(CQ_ARRAY_SIZE(headers), headers, align, 0);
        if (!table)
                return CQ_ERR_TOO_LARGE;
        json_array_foreach(queues, i, q)
        {
                char texts[CQ_ARRAY_SIZE(queue_keys)][32];
                const char *cells[CQ_ARRAY_SIZE(headers)];

                cells[0] = json_string_value(json_object_get(q, "queue"));
                for (k = 0; k < CQ_ARRAY_SIZE(queue_keys); k++) {
                        count_text(q, queue_keys[k], texts[k],
                                   sizeof(texts[k]));
                        cells[k + 1] = texts[k];
                }
                if (cq_table_add(table, cells))
                        goto out;
        }
        err = cq_table_render(table, buf);
out:
        cq_table_destroy(&table);
        return err;
}

cq_err_t cq_summary_line(const json_t *total, cq_buf_t *buf)
{
        char rate[32], p50[32], p95[32], cost[48];

        rate_text(total, rate, sizeof(rate));
        dur_text(total, "p50_duration_ms", p50, sizeof(p50));
        dur_text(total, "p95_duration_ms", p95, sizeof(p95));
        cost_text(total, cost, sizeof(cost));
        return cq_buf_printf(
                   buf,
                   "%.0f jobs: %.0f succeeded (%.0f from memory), %.0f failed, "
                   "%.0f cancelled, %.0f pending; %.0f retried; pass rate %s; "
                   "mean %.2f turns, %.2f retries; %.0f tokens; cost %s; "
                   "duration p50 %s, p95 %s\n",
                   num(total, "jobs"), num(total, "succeeded"),
                   num(total, "from_memory"), num(total, "failed"),
                   num(total, "cancelled"), num(total, "pending"),
                   num(total, "retried"), rate, num(total, "mean_turns"),
                   num(total, "mean_retries"), num(total, "total_tokens"), cost,
                   p50, p95) == CQ_OK
                   ? CQ_OK
                   : CQ_ERR_TOO_LARGE;
}
