/* SPDX-License-Identifier: MIT */
/* budget.c - what a job's LLM calls may use and did use: the check of
 * tokens, cost and the run's budget before each call, the accounting of
 * usage and cost after it, and the metric families the loop counts
 * into. */
#include "coderq/agent/agent.h"

#include <stdlib.h>
#include <string.h>

#include "agent_int.h"

/* Bounds of the LLM call and cell histograms, in seconds: a call takes
 * from a second to minutes, a cell from milliseconds to its timeout. */
static const double llm_bounds[] = {0.25, 0.5, 1,  2.5, 5,  10,
                                    20,   30,  60, 120, 300};
static const double cell_bounds[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                     2.5,  5,    10,  30,   60,  120};

/* The families cq_agent_metrics_add() registers, in the order of its
 * slots. A worker meets a few models; past 16 they are "other". */
static const cq_metric_def_t metric_defs[] = {
    {CQ_METRIC_COUNTER,
     "coderq_llm_calls_total",
     "LLM calls by model and outcome (ok, unavailable: retries ran "
     "out, error: refused)",
     {"model", "outcome"},
     NULL,
     0,
     48},
    {CQ_METRIC_HISTOGRAM,
     "coderq_llm_call_duration_seconds",
     "Duration of one LLM call, its retries and backoff included",
     {"model"},
     llm_bounds,
     CQ_ARRAY_SIZE(llm_bounds),
     16},
    {CQ_METRIC_COUNTER,
     "coderq_llm_tokens_total",
     "Tokens the LLM reported by model and kind (prompt, completion, "
     "cached: prompt tokens read from a cache, cache_creation)",
     {"model", "kind"},
     NULL,
     0,
     64},
    {CQ_METRIC_COUNTER,
     "coderq_llm_cost_usd_total",
     "Cost in USD of the LLM calls whose price is known, by model",
     {"model"},
     NULL,
     0,
     16},
    {CQ_METRIC_HISTOGRAM,
     "coderq_cell_duration_seconds",
     "Duration of one executed cell by status (ok, error, timeout, "
     "...)",
     {"status"},
     cell_bounds,
     CQ_ARRAY_SIZE(cell_bounds),
     16},
};

int cq_agent_metrics_add(cq_agent_metrics_t *am,
                         cq_metrics_t *reg,
                         char *errstr,
                         size_t errstr_size)
{
        cq_metric_t **slots[] = {&am->llm_calls, &am->llm_seconds, &am->tokens,
                                 &am->cost, &am->cells};
        size_t i;

        memset(am, 0, sizeof(*am));
        if (!reg)
                return 0;
        for (i = 0; i < CQ_ARRAY_SIZE(metric_defs); i++) {
                *slots[i] =
                    cq_metrics_add(reg, &metric_defs[i], errstr, errstr_size);
                if (!*slots[i])
                        return -1;
        }
        return 0;
}

/* Tokens the request adds to the messages: the tools schema, one token
 * per 3 bytes as cq_llm_estimate_tokens() counts text. -1 when out of
 * memory. */
int64_t agent_tools_tokens(void)
{
        json_t *tools = cq_llm_tools_json();
        char *text = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
        int64_t n = text ? ((int64_t)strlen(text) + 2) / 3 : -1;

        free(text);
        json_decref(tools);
        return n;
}

/* Whether a call of up to \p prompt and \p out tokens could cross
 * limits.max_tokens_total; the run fails when it could. */
static bool over_tokens(run_t *run, int64_t prompt, int64_t out)
{
        const cq_job_limits_t *lim = &run->job->limits;

        if (lim->max_tokens_total <= 0 ||
            run->limit_tokens + prompt + out <= lim->max_tokens_total)
                return false;
        agent_fail(run, CQ_AGENT_FAILED, "budget",
                   "token budget: the next LLM call could use up to %lld "
                   "tokens (about %lld prompt and at most %lld output), "
                   "which would cross limits.max_tokens_total %lld (%lld "
                   "used so far)",
                   (long long)(prompt + out), (long long)prompt, (long long)out,
                   lim->max_tokens_total, (long long)run->limit_tokens);
        return true;
}

/* Whether a call of up to \p prompt and \p out tokens, which could cost
 * \p estimate (< 0: unknown), could cross limits.max_cost_usd or cannot
 * be bounded; the run fails when so. */
static bool over_cost(run_t *run, int64_t prompt, int64_t out, double estimate)
{
        const cq_job_limits_t *lim = &run->job->limits;

        if (lim->max_cost_usd <= 0)
                return false;
        if (!run->price_known) {
                agent_fail(run, CQ_AGENT_FAILED, "budget",
                           "cost budget: limits.max_cost_usd is set but "
                           "model %s has no price (%s), so the cost of a "
                           "call cannot be bounded",
                           cq_llm_model(run->llm),
                           run->opts->prices ? "not in CODERQ_PRICES_FILE"
                                             : "CODERQ_PRICES_FILE is unset");
                return true;
        }
        if (run->cost_usd < 0) {
                agent_fail(run, CQ_AGENT_FAILED, "budget",
                           "cost budget: the cost so far is unknown (an "
                           "LLM reply reported no usage), so "
                           "limits.max_cost_usd cannot be kept");
                return true;
        }
        if (run->cost_usd + estimate > lim->max_cost_usd) {
                agent_fail(run, CQ_AGENT_FAILED, "budget",
                           "cost budget: the next LLM call could cost up "
                           "to $%.6f (about %lld prompt and at most %lld "
                           "output tokens), which would cross "
                           "limits.max_cost_usd $%g ($%.6f spent so far)",
                           estimate, (long long)prompt, (long long)out,
                           lim->max_cost_usd, run->cost_usd);
                return true;
        }
        return false;
}

/* Whether the observer, if it keeps a run's budget, lets the call take
 * \p estimate of it; when not, the run fails or (the observer failed)
 * aborts. */
static bool reserved(run_t *run, double estimate)
{
        char why[512];
        int r;

        if (!run->obs || !run->obs->reserve)
                return true;
        why[0] = '\0';
        r = run->obs->reserve(run->obs->opaque, estimate, why, sizeof(why));
        if (r < 0) {
                agent_refuse(run);
                return false;
        }
        if (r > 0) {
                agent_fail(run, CQ_AGENT_FAILED, "budget", "run budget: %s",
                           why[0] ? why : "the run's budget would be crossed");
                return false;
        }
        return true;
}

/* Whether the next LLM call may go: its estimated tokens and cost within
 * the job's limits and the run's budget. When it may not, the job fails
 * with reason code "budget" (or stops, when the observer says so). The
 * estimate is the most the call may use: the prompt as
 * cq_llm_estimate_tokens() counts the history (plus the tools schema),
 * all at the uncached input price, and a reply of max_tokens. */
bool agent_within_budget(run_t *run)
{
        int64_t prompt =
            cq_llm_estimate_tokens(run->history) + run->tools_tokens;
        int64_t out = cq_llm_max_tokens(run->llm);
        double estimate;

        if (out <= 0) /* no max_tokens sent: the window bounds the reply */
                out = (int64_t)run->opts->context_tokens > prompt
                          ? (int64_t)run->opts->context_tokens - prompt
                          : 0;
        if (over_tokens(run, prompt, out))
                return false;
        estimate = run->price_known && run->cost_usd >= 0
                       ? cq_price_estimate(&run->price, prompt, out)
                       : -1;
        return !over_cost(run, prompt, out, estimate) &&
               reserved(run, estimate);
}

/* Count one LLM call: its outcome and duration, and on success its
 * tokens and (when known) cost. */
void agent_count_call(run_t *run,
                      const char *outcome,
                      int64_t ms,
                      const cq_usage_t *call,
                      double cost)
{
        const cq_agent_metrics_t *am = run->opts->metrics;
        const char *model = cq_llm_model(run->llm);
        static const char *const kinds[] = {"prompt", "completion", "cached",
                                            "cache_creation"};
        int64_t n[4];
        size_t i;

        if (!am)
                return;
        cq_series_add(
            cq_metric_series(am->llm_calls, (const char *[]){model, outcome}),
            1);
        cq_series_observe(
            cq_metric_series(am->llm_seconds, (const char *[]){model}),
            (double)ms / 1000.0);
        if (!call)
                return;
        n[0] = call->prompt_tokens;
        n[1] = call->completion_tokens;
        n[2] = call->cache_read_tokens;
        n[3] = call->cache_creation_tokens;
        for (i = 0; i < CQ_ARRAY_SIZE(kinds); i++)
                cq_series_add(
                    cq_metric_series(am->tokens,
                                     (const char *[]){model, kinds[i]}),
                    (double)n[i]);
        if (cost >= 0)
                cq_series_add(
                    cq_metric_series(am->cost, (const char *[]){model}), cost);
}

/* Count a call's usage and cost into the job's and report them. */
void agent_account(run_t *run,
                   const cq_llm_reply_t *reply,
                   int64_t estimate,
                   int64_t ms)
{
        cq_usage_t call;
        double cost = -1;

        call.prompt_tokens = reply->prompt_tokens;
        call.completion_tokens = reply->completion_tokens;
        call.cache_read_tokens = reply->cache_read_tokens;
        call.cache_creation_tokens = reply->cache_creation_tokens;
        run->used.prompt_tokens += call.prompt_tokens;
        run->used.completion_tokens += call.completion_tokens;
        run->used.cache_read_tokens += call.cache_read_tokens;
        run->used.cache_creation_tokens += call.cache_creation_tokens;
        if (reply->has_usage)
                run->limit_tokens +=
                    call.prompt_tokens + call.completion_tokens;
        else
                run->limit_tokens += estimate;
        if (reply->has_usage && run->price_known)
                cost = cq_price_cost(&run->price, &call);
        if (cost < 0)
                run->cost_usd = -1;
        else if (run->cost_usd >= 0)
                run->cost_usd += cost;
        agent_count_call(run, "ok", ms, &call, cost);
        if (run->obs && run->obs->on_usage &&
            run->obs->on_usage(run->obs->opaque, &run->used, run->cost_usd) !=
                0)
                run->aborted = true;
}
