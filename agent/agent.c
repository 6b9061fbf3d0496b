/* SPDX-License-Identifier: MIT */
/* agent.c - the reflection loop. One run owns a history (JSON array of Chat
 * Completions messages), appends to it only through append(), which is
 * also the checkpoint hook, and leaves it in a state a later run can
 * continue from: an assistant message whose tool calls are not all
 * answered is finished first, so a completed LLM turn is never repeated. */
#include "coderq/agent/agent.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/agent/fetch.h"
#include "coderq/common/log.h"
#include "coderq/agent/testrun.h"
#include "coderq/agent/tooltext.h"
#include "coderq/common/util.h"

#define KEEP_RECENT_MESSAGES 6   /* never elided */
#define ELIDE_MIN_CHARS      200 /* shorter tool outputs are not worth it */
#define EVENT_TEXT_MAX       4096
#define SOLUTION_MAX         ((size_t)64 << 20) /* fresh tests need it all */
#define MEMORY_CODE_MAX      ((size_t)4 << 20)  /* kept in memory */
/* A reply with calls waits this long for its cell (and the cell's tool
 * message) to be checkpointed with it in one statement (hold()). */
#define HOLD_REPLY_MS 250

static const char default_system_prompt[] =
    "You are a careful Python data-analysis and mathematical-modelling "
    "assistant working in a Jupyter kernel.\n"
    "- Run Python with the execute_code tool. The kernel keeps variables, "
    "imports and files between calls.\n"
    "- Input files are already in the current working directory: use "
    "relative paths and do not check that they exist. Read CSV files with "
    "an explicit encoding when utf-8 fails (then try latin-1).\n"
    "- numpy, pandas, matplotlib and scipy are available.\n"
    "- You cannot see images. After every figure, print the key numbers it "
    "shows. Save each figure to a file in the working directory "
    "(plt.savefig('name.png')) and show it with plt.show().\n"
    "- State where every parameter comes from. Avoid data leakage: fit "
    "scalers and models on training data only.\n"
    "- When code fails, read the error, fix its cause and run the corrected "
    "code. If it keeps failing, split it into smaller steps or simplify the "
    "approach.\n"
    "- Do not ask the user anything; work autonomously.\n"
    "- When the work is complete, reply without calling the tool: a concise "
    "summary of what you did and the results, with the key numbers.\n";

const char *cq_agent_default_system_prompt(void)
{
        return default_system_prompt;
}

const char *cq_agent_status_name(cq_agent_status_t status)
{
        switch (status) {
        case CQ_AGENT_SUCCEEDED:
                return "succeeded";
        case CQ_AGENT_FAILED:
                return "failed";
        case CQ_AGENT_CANCELLED:
                return "cancelled";
        case CQ_AGENT_ABORTED:
                return "aborted";
        }
        return "unknown";
}

void cq_agent_opts_init(cq_agent_opts_t *opts)
{
        memset(opts, 0, sizeof(*opts));
        opts->max_turns = 30;
        opts->max_retries = 5;
        opts->cell_timeout_s = 120;
        opts->job_timeout_s = 1800;
        opts->context_tokens = 128000;
        opts->tool_item_max = 2000;
        opts->tool_total_max = 8000;
        opts->file_max = (size_t)20 << 20;
}

void cq_agent_opts_from_config(cq_agent_opts_t *opts, const cq_config_t *cfg)
{
        cq_agent_opts_init(opts);
        opts->system_prompt = cfg->system_prompt;
        opts->max_turns = cfg->max_turns;
        opts->max_retries = cfg->max_retries;
        opts->cell_timeout_s = cfg->cell_timeout_s;
        opts->job_timeout_s = cfg->job_timeout_s;
        opts->test_timeout_s = 0;
        opts->context_tokens = (size_t)cfg->llm_context_window;
        opts->tool_item_max = cfg->tool_item_max;
        opts->tool_total_max = cfg->tool_total_max;
        opts->file_max = cfg->artifact_max;
        opts->fetch_allow = cfg->fetch_allow;
}

/* Bounds of the LLM call and cell histograms, in seconds: a call takes
 * from a second to minutes, a cell from milliseconds to its timeout. */
static const double llm_bounds[] = {0.25, 0.5, 1,  2.5, 5,  10,
                                    20,   30,  60, 120, 300};
static const double cell_bounds[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                     2.5,  5,    10,  30,   60,  120};

int cq_agent_metrics_add(cq_agent_metrics_t *am,
                         cq_metrics_t *reg,
                         char *errstr,
                         size_t errstr_size)
{
        /* A worker meets a few models; past 16 they are "other". */
        const cq_metric_def_t defs[] = {
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
        cq_metric_t **slots[] = {&am->llm_calls, &am->llm_seconds, &am->tokens,
                                 &am->cost, &am->cells};
        size_t i;

        memset(am, 0, sizeof(*am));
        if (!reg)
                return 0;
        for (i = 0; i < CQ_ARRAY_SIZE(defs); i++) {
                *slots[i] = cq_metrics_add(reg, &defs[i], errstr, errstr_size);
                if (!*slots[i])
                        return -1;
        }
        return 0;
}

void cq_agent_recall_release(cq_agent_recall_t *recall)
{
        free(recall->code);
        free(recall->source_job);
        free(recall->scope);
        free(recall->model);
        memset(recall, 0, sizeof(*recall));
}

void cq_agent_result_init(cq_agent_result_t *result)
{
        memset(result, 0, sizeof(*result));
        result->tests_total = -1;
}

void cq_agent_result_release(cq_agent_result_t *result)
{
        free(result->reason);
        free(result->last_error);
        free(result->answer);
        free(result->solution);
        free(result->memory_source_job);
        json_decref(result->tests);
        json_decref(result->repro);
        json_decref(result->history);
        cq_files_release(&result->images);
        cq_agent_result_init(result);
}

/* The state of one run. */
typedef struct run {
        const cq_job_t *job;
        cq_interp_t *interp;
        cq_llm_t *llm;
        const cq_agent_opts_t *opts;
        const cq_agent_observer_t *obs;
        cq_nb_t *nb;
        cq_agent_result_t *result;
        json_t *history;
        json_t *solution;      /* code of the successful cells, in order */
        size_t solution_bytes; /* their total size */
        bool solution_over;    /* past SOLUTION_MAX: fresh tests cannot run */
        long max_turns, max_retries, cell_timeout_s, job_timeout_s;
        long test_timeout_s;
        int64_t deadline_ms; /* monotonic */
        long image_seq;
        cq_tooltext_opts_t topts;
        bool aborted;
        bool oom;
        bool trying_memory;     /* a remembered solution's failures are not
                                   the model's: they are not counted */
        bool tests_failed_last; /* the last retry counted was a test run */
        /* Usage and cost of the whole job (earlier attempts included). */
        cq_usage_t used;
        int64_t limit_tokens; /* used for max_tokens_total: reported
                                 tokens, or a call's estimate when its
                                 reply reported none */
        double cost_usd;      /* < 0: unknown */
        bool price_known;
        cq_price_t price;
        bool bad_sampling; /* the provider cannot send the job's seed */
        int64_t tools_tokens;
        /* The reply at history[held] is not checkpointed yet: it goes with
         * the turn that answers it (hold()). */
        bool holding;
        size_t held;
        /* An observer refused a checkpoint (failed write, lost lease): no
         * other is written, or the stored conversation would have a gap. A
         * stop (opts->stop) aborts without it: what ran is still kept. */
        bool refused;
} run_t;

static void set_str(char **dst, const char *fmt, ...) CQ_PRINTF(2, 3);

static void set_str(char **dst, const char *fmt, ...)
{
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        free(*dst);
        *dst = s;
}

static void refuse(run_t *run)
{
        run->refused = true;
        run->aborted = true;
}

static bool cancelled(const run_t *run)
{
        return run->opts->cancel && atomic_load(run->opts->cancel) != 0;
}

static void event(run_t *run, const char *type, json_t *data)
{
        if (data && run->obs && run->obs->on_event)
                run->obs->on_event(run->obs->opaque, type, data);
        json_decref(data);
}

/* One more failed cell or test run (\p from_tests: a test run). The
 * observer records the count, so a resumed job goes on from it:
 * max_retries holds over the whole job. */
static void count_retry(run_t *run, bool from_tests)
{
        run->tests_failed_last = from_tests;
        run->result->retries++;
        if (run->trying_memory || !run->obs || !run->obs->on_retry)
                return;
        if (run->obs->on_retry(run->obs->opaque, run->result->retries) != 0)
                refuse(run);
}

static int append_turn(run_t *run,
                       const char *code,
                       const cq_cell_result_t *res,
                       json_t *msgs);
static json_t *one_message(json_t *msg);

/* Append \p msg (takes ownership) to the history and checkpoint it (with
 * a held reply before it, if any). */
static int append(run_t *run, json_t *msg)
{
        size_t index = json_array_size(run->history);

        if (run->holding)
                return append_turn(run, NULL, NULL, one_message(msg));
        if (!msg || json_array_append_new(run->history, msg) != 0) {
                run->oom = true;
                return -1;
        }
        if (run->refused)
                return -1;
        if (run->obs && run->obs->on_message &&
            run->obs->on_message(run->obs->opaque, index, msg) != 0) {
                refuse(run);
                return -1;
        }
        return 0;
}

/* Whether the observer takes a turn's cell and messages in one call. */
static bool turns_reported(const run_t *run)
{
        return run->obs && run->obs->on_turn;
}

/* Append the reply \p msg (takes ownership) to the history without a
 * checkpoint of its own: the cell that answers it and its tool message
 * carry it, one statement per turn instead of two. A cell that runs
 * longer than HOLD_REPLY_MS checkpoints it alone first (flush_held()),
 * and so does a run that ends before the answer: a reply is lost only
 * to a worker killed within that time, as one killed during the call
 * loses it. Only with on_turn; otherwise as append(). */
static int hold(run_t *run, json_t *msg)
{
        size_t index = json_array_size(run->history);

        if (!turns_reported(run) || run->holding)
                return append(run, msg);
        if (!msg || json_array_append_new(run->history, msg) != 0) {
                run->oom = true;
                return -1;
        }
        run->holding = true;
        run->held = index;
        return 0;
}

/* Checkpoint the held reply alone (a cell outlasting HOLD_REPLY_MS, or
 * the end of the run). Also a cq_exec_opts_t on_slow callback. */
static void flush_held(void *opaque)
{
        run_t *run = opaque;
        json_t *msgs;

        if (!run->holding || run->refused)
                return;
        run->holding = false;
        msgs =
            one_message(json_incref(json_array_get(run->history, run->held)));
        if (!msgs) {
                run->oom = true;
                return;
        }
        if (run->obs->on_turn(run->obs->opaque, NULL, NULL, run->held, msgs) !=
            0)
                refuse(run);
        json_decref(msgs);
}

/* Report a cell that just ran (on_cell). */
static void
report_cell(run_t *run, const char *code, const cq_cell_result_t *res)
{
        if (run->obs && run->obs->on_cell &&
            run->obs->on_cell(run->obs->opaque, code, res) != 0)
                refuse(run);
}

/* Append the messages of \p msgs (takes ownership; an array) to the
 * history and checkpoint them with the cell \p code (NULL: none) that
 * came before them: one on_turn, else on_cell and an on_message each. */
static int append_turn(run_t *run,
                       const char *code,
                       const cq_cell_result_t *res,
                       json_t *msgs)
{
        size_t index = json_array_size(run->history), i;
        json_t *report = NULL;
        int rc = -1;

        if (!json_is_array(msgs) ||
            json_array_extend(run->history, msgs) != 0) {
                run->oom = true;
                goto out;
        }
        if (run->refused)
                goto out;
        if (turns_reported(run)) {
                /* the held reply first, in the same statement */
                if (run->holding) {
                        report = json_array();
                        if (!report ||
                            json_array_append(
                                report,
                                json_array_get(run->history, run->held)) != 0 ||
                            json_array_extend(report, msgs) != 0) {
                                run->oom = true;
                                goto out;
                        }
                        index = run->held;
                        run->holding = false;
                }
                if (run->obs->on_turn(run->obs->opaque, code, res, index,
                                      report ? report : msgs) != 0) {
                        refuse(run);
                        goto out;
                }
        } else {
                if (code)
                        report_cell(run, code, res);
                for (i = 0; !run->aborted && i < json_array_size(msgs); i++)
                        if (run->obs && run->obs->on_message &&
                            run->obs->on_message(run->obs->opaque, index + i,
                                                 json_array_get(msgs, i)) != 0)
                                refuse(run);
                if (run->aborted)
                        goto out;
        }
        rc = 0;
out:
        json_decref(report);
        json_decref(msgs);
        return rc;
}

/* A new array of \p msg (taken; NULL gives NULL). */
static json_t *one_message(json_t *msg)
{
        json_t *msgs = msg ? json_array() : NULL;

        if (msgs && json_array_append_new(msgs, msg) == 0)
                return msgs;
        json_decref(msgs);
        json_decref(msg);
        return NULL;
}

static json_t *text_message(const char *role, const char *content)
{
        return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* "Files in the working directory: data.csv (12,345 bytes), ..." */
static char *files_message(const cq_job_t *job)
{
        cq_buf_t buf;
        size_t i;

        cq_buf_init(&buf, 64 * 1024);
        if (job->nfiles == 0) {
                if (cq_buf_append_str(&buf, "The working directory has no "
                                            "input files.") != CQ_OK)
                        goto fail;
                return cq_buf_take(&buf, NULL);
        }
        if (cq_buf_append_str(&buf, "Files in the working directory:") != CQ_OK)
                goto fail;
        for (i = 0; i < job->nfiles; i++) {
                cq_err_t err;

                if (job->files[i].data)
                        err = cq_buf_printf(&buf, "%s %s (%zu bytes)",
                                            i ? "," : "", job->files[i].name,
                                            job->files[i].len);
                else
                        err = cq_buf_printf(&buf, "%s %s", i ? "," : "",
                                            job->files[i].name);
                if (err != CQ_OK)
                        break; /* a very long list is cut; the rest exist */
        }
        return cq_buf_take(&buf, NULL);
fail:
        cq_buf_release(&buf);
        return NULL;
}

/* The job's prompt, with what the model must know about its tests and a
 * remembered solution. */
static char *task_message(const cq_job_t *job,
                          const cq_agent_recall_t *hint,
                          const char *tried)
{
        cq_buf_t buf;
        const char *kind =
            json_string_value(json_object_get(job->tests, "kind"));
        cq_err_t err;

        cq_buf_init(&buf, (size_t)32 << 20);
        err = cq_buf_append_str(&buf, job->prompt);
        if (err == CQ_OK && kind && strcmp(kind, "cases") == 0)
                err = cq_buf_printf(
                    &buf,
                    "\n\nYour work will be checked by calling the function "
                    "`%s` with test arguments in this kernel, so define "
                    "`%s` before giving your final answer.",
                    json_string_value(json_object_get(job->tests, "function")),
                    json_string_value(json_object_get(job->tests, "function")));
        else if (err == CQ_OK && kind)
                err = cq_buf_append_str(
                    &buf, "\n\nYour work will be checked by test code run in "
                          "this kernel after your final answer.");
        if (err == CQ_OK && hint && hint->code)
                err = cq_buf_printf(
                    &buf,
                    "\n\nA hint from episodic memory (scope \"%s\"): a "
                    "similar problem (job %s, model %s, similarity %.2f) was "
                    "solved before with the code below.%s Reuse or adapt it "
                    "if it fits:\n```python\n%s\n```",
                    hint->scope ? hint->scope : "?",
                    hint->source_job ? hint->source_job : "unknown",
                    hint->model ? hint->model : "unknown", hint->similarity,
                    tried ? tried : "", hint->code);
        if (err != CQ_OK) {
                cq_buf_release(&buf);
                return NULL;
        }
        return cq_buf_take(&buf, NULL);
}

/* Images a cell showed, as files named cell<N>-<K>.<ext>. */
static void collect_output_images(run_t *run, const cq_cell_result_t *res)
{
        static const struct {
                const char *mime, *ext;
                bool base64;
        } kinds[] = {{"image/png", "png", true},
                     {"image/jpeg", "jpg", true},
                     {"image/svg+xml", "svg", false}};
        size_t i, k;
        json_t *output;

        json_array_foreach(res->outputs, i, output)
        {
                json_t *data = json_object_get(output, "data");

                for (k = 0; data && k < CQ_ARRAY_SIZE(kinds); k++) {
                        json_t *value = json_object_get(data, kinds[k].mime);
                        cq_files_t *images = &run->result->images;
                        cq_file_t *v, *file;
                        unsigned char *bytes;
                        size_t len;
                        char name[64];

                        if (!json_is_string(value))
                                continue;
                        if (kinds[k].base64) {
                                bytes = cq_b64_decode(json_string_value(value),
                                                      json_string_length(value),
                                                      &len);
                        } else {
                                len = json_string_length(value);
                                bytes = malloc(len + 1);
                                if (bytes)
                                        memcpy(bytes, json_string_value(value),
                                               len);
                        }
                        if (!bytes)
                                continue; /* undecodable: leave it be */
                        v = realloc(images->v,
                                    (images->n + 1) * sizeof(*images->v));
                        if (!v) {
                                free(bytes);
                                run->oom = true;
                                return;
                        }
                        images->v = v;
                        snprintf(name, sizeof(name), "cell%ld-%ld.%s",
                                 run->result->cells, ++run->image_seq,
                                 kinds[k].ext);
                        file = &images->v[images->n];
                        file->name = strdup(name);
                        file->mime = strdup(kinds[k].mime);
                        file->data = bytes;
                        file->len = len;
                        if (!file->name || !file->mime) {
                                free(file->name);
                                free(file->mime);
                                free(bytes);
                                run->oom = true;
                                return;
                        }
                        images->n++;
                }
        }
}

/* Image files the code saved anywhere under the work dir. */
static void collect_created_images(run_t *run)
{
        cq_files_t created = {0};
        cq_files_t *images = &run->result->images;
        size_t i;

        if (cq_interp_created_files(run->interp, false, &created) != CQ_OK) {
                cq_log_kv(CQ_LOG_WARN, "could not list created files", "job_id",
                          run->job->job_id, "error",
                          cq_interp_errmsg(run->interp), NULL);
                return;
        }
        for (i = 0; i < created.n; i++) {
                cq_file_t file = {0};
                cq_file_t *v;

                if (strncmp(created.v[i].mime, "image/", 6) != 0)
                        continue;
                if (cq_interp_get_file(run->interp, created.v[i].name,
                                       run->opts->file_max, &file) != CQ_OK) {
                        cq_log_kv(CQ_LOG_WARN, "could not read created image",
                                  "job_id", run->job->job_id, "file",
                                  created.v[i].name, "error",
                                  cq_interp_errmsg(run->interp), NULL);
                        continue;
                }
                v = realloc(images->v, (images->n + 1) * sizeof(*images->v));
                if (!v) {
                        cq_files_t one = {&file, 1};

                        cq_files_release(&one);
                        run->oom = true;
                        break;
                }
                images->v = v;
                images->v[images->n++] = file;
        }
        cq_files_release(&created);
}

static void on_output(void *opaque, const json_t *output)
{
        run_t *run = opaque;
        const char *type =
            json_string_value(json_object_get(output, "output_type"));
        json_t *data = NULL;

        if (!run->obs || !run->obs->on_event || !type)
                return;
        if (strcmp(type, "stream") == 0) {
                const char *text =
                    json_string_value(json_object_get(output, "text"));
                size_t len = text ? strlen(text) : 0;

                data = json_pack(
                    "{s:s, s:s, s:s%}", "kind", "stream", "name",
                    json_string_value(json_object_get(output, "name")), "text",
                    text ? text : "",
                    len > EVENT_TEXT_MAX ? EVENT_TEXT_MAX : len);
        } else if (strcmp(type, "error") == 0) {
                data = json_pack("{s:s, s:O?, s:O?}", "kind", "error", "ename",
                                 json_object_get(output, "ename"), "evalue",
                                 json_object_get(output, "evalue"));
        } else {
                /* A mime bundle: its types and sizes, not its content. */
                json_t *bundle = json_object_get(output, "data");
                json_t *sizes = json_object();
                const char *mime;
                json_t *value;

                json_object_foreach(bundle, mime, value)
                {
                        json_int_t size =
                            json_is_string(value)
                                ? (json_int_t)json_string_length(value)
                                : 0;

                        json_object_set_new(sizes, mime, json_integer(size));
                }
                data = json_pack("{s:s, s:o}", "kind", type, "mimes", sizes);
        }
        event(run, "cell.output", data);
}

static int64_t remaining_ms(const run_t *run)
{
        return run->deadline_ms - cq_now_ms();
}

/* A cell that succeeded becomes part of the job's solution. */
static void add_solution_cell(run_t *run, const char *code)
{
        size_t len = strlen(code);
        json_t *cell;

        if (run->solution_over || len > SOLUTION_MAX - run->solution_bytes) {
                run->solution_over = true;
                return;
        }
        /* NULL for code that is not UTF-8: it cannot be kept, and a fresh
         * test run says so rather than replay part of the solution. */
        cell = json_string(code);
        if (!cell || json_array_append_new(run->solution, cell) != 0) {
                run->solution_over = true;
                return;
        }
        run->solution_bytes += len;
}

/* The solution as one text with "# %%" between cells, for memory; NULL
 * when over MEMORY_CODE_MAX or empty. */
static char *solution_text(const run_t *run)
{
        cq_buf_t buf;
        size_t i;
        json_t *cell;

        if (run->solution_over || json_array_size(run->solution) == 0)
                return NULL;
        cq_buf_init(&buf, MEMORY_CODE_MAX);
        json_array_foreach(run->solution, i, cell)
        {
                if ((i > 0 && cq_buf_append_str(&buf, "\n\n# %%\n") != CQ_OK) ||
                    cq_buf_append_str(&buf, json_string_value(cell)) != CQ_OK) {
                        cq_buf_release(&buf);
                        return NULL;
                }
        }
        return cq_buf_take(&buf, NULL);
}

/* Run one cell and record it everywhere; with \p deferred the caller
 * reports it (append_turn(), with the tool message that answers it). */
static cq_err_t
run_cell(run_t *run, const char *code, cq_cell_result_t *res, bool deferred)
{
        cq_exec_opts_t xo = {0};
        int64_t left = remaining_ms(run);
        cq_err_t err;

        xo.timeout_ms = run->cell_timeout_s * 1000;
        if (left < xo.timeout_ms)
                xo.timeout_ms = left > 1000 ? left : 1000;
        xo.on_output = on_output;
        xo.opaque = run;
        xo.cancel = run->opts->cancel;
        if (run->holding) {
                xo.on_slow = flush_held;
                xo.slow_ms = HOLD_REPLY_MS;
        }
        event(run, "cell.started", json_pack("{s:s}", "code", code));
        err = cq_interp_execute(run->interp, code, &xo, res);
        if (err != CQ_OK)
                return err;
        run->result->cells++;
        if (run->opts->metrics)
                cq_series_observe(
                    cq_metric_series(
                        run->opts->metrics->cells,
                        (const char *[]){cq_cell_status_name(res->status)}),
                    (double)res->duration_ms / 1000.0);
        event(run, "cell.finished",
              json_pack("{s:s, s:I, s:i}", "status",
                        cq_cell_status_name(res->status), "duration_ms",
                        (json_int_t)res->duration_ms, "execution_count",
                        res->execution_count));
        if (run->nb && cq_nb_add_code(run->nb, code, res) != 0)
                run->oom = true;
        collect_output_images(run, res);
        if (res->status == CQ_CELL_OK)
                add_solution_cell(run, code);
        if (!deferred)
                report_cell(run, code, res);
        return CQ_OK;
}

/* "NameError: name 'x' is not defined" for a failed cell. */
static void cell_error_summary(const cq_cell_result_t *res, char **dst)
{
        size_t i;
        json_t *output;

        set_str(dst, "the cell ended with status %s",
                cq_cell_status_name(res->status));
        json_array_foreach(res->outputs, i, output)
        {
                const char *type =
                    json_string_value(json_object_get(output, "output_type"));

                if (type && strcmp(type, "error") == 0)
                        set_str(
                            dst, "%s: %s",
                            json_string_value(json_object_get(output, "ename")),
                            json_string_value(
                                json_object_get(output, "evalue")));
        }
}

static void fail(run_t *run,
                 cq_agent_status_t status,
                 const char *code,
                 const char *fmt,
                 ...) CQ_PRINTF(4, 5);

/* End the run with \p status; \p code is the kind of reason
 * (docs/OPERATIONS.md#reason-codes), a static string. */
static void fail(run_t *run,
                 cq_agent_status_t status,
                 const char *code,
                 const char *fmt,
                 ...)
{
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        free(run->result->reason);
        run->result->reason = s;
        run->result->reason_code = code;
        run->result->status = status;
}

/* Whether the run must stop now; sets the result when it must. */
static bool must_stop(run_t *run)
{
        if (run->opts->stop && atomic_load(run->opts->stop) != 0)
                run->aborted = true;
        if (run->aborted) {
                run->result->status = CQ_AGENT_ABORTED;
                return true;
        }
        if (run->oom) {
                fail(run, CQ_AGENT_FAILED, "internal", "out of memory");
                return true;
        }
        if (cancelled(run)) {
                fail(run, CQ_AGENT_CANCELLED, "cancelled", "cancelled");
                return true;
        }
        if (remaining_ms(run) <= 0) {
                fail(run, CQ_AGENT_FAILED, "job_timeout",
                     "job time limit reached (%ld s of running time, "
                     "earlier attempts included); last error: %s",
                     run->job_timeout_s,
                     run->result->last_error ? run->result->last_error
                                             : "none");
                return true;
        }
        return false;
}

static bool over_retries(run_t *run)
{
        if (run->result->retries <= run->max_retries)
                return false;
        /* "tests" when the failed test run was the one too many */
        fail(run, CQ_AGENT_FAILED,
             run->tests_failed_last ? "tests" : "max_retries",
             "retry limit reached: %ld failed cells or test runs "
             "(max_retries %ld); last error: %s",
             run->result->retries, run->max_retries,
             run->result->last_error ? run->result->last_error : "none");
        return true;
}

/* Answer one tool call: run its code, or explain why it could not run.
 * On failure *reflectionp gets the reflection prompt (the last one wins). */
static int answer_call(run_t *run,
                       const cq_llm_tool_call_t *call,
                       bool *failedp,
                       char **reflectionp)
{
        cq_cell_result_t res;
        char *text = NULL;
        json_t *msg;
        bool ran = false; /* a cell ran, not reported yet */
        int rc = -1;

        cq_cell_result_init(&res);
        if (!call->code) {
                /* Unknown tool or unusable arguments: a failed attempt. */
                set_str(&text,
                        "Error: %s. Call execute_code with a JSON object "
                        "holding one string field \"code\".",
                        call->error ? call->error : "no code given");
                set_str(&run->result->last_error, "%s",
                        call->error ? call->error : "no code given");
                set_str(reflectionp,
                        "The tool call could not run: %s. Call the "
                        "execute_code tool again with arguments "
                        "{\"code\": \"<Python source>\"}.",
                        call->error ? call->error : "no code given");
                *failedp = true;
        } else {
                cq_err_t err = run_cell(run, call->code, &res, true);

                ran = err == CQ_OK;
                if (err != CQ_OK) {
                        fail(run, CQ_AGENT_FAILED, "interpreter",
                             "the interpreter failed: %s",
                             cq_interp_errmsg(run->interp));
                        goto out;
                }
                text = cq_tooltext_format(&res, &run->topts, NULL);
                if (res.status != CQ_CELL_OK) {
                        cell_error_summary(&res, &run->result->last_error);
                        free(*reflectionp);
                        *reflectionp = cq_tooltext_reflection(
                            &res, call->code, &run->topts, NULL);
                        if (!*reflectionp)
                                run->oom = true;
                        *failedp = true;
                }
        }
        if (!text) {
                run->oom = true;
                goto out;
        }
        msg = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                        call->id, "content", text);
        if (!msg) {
                run->oom = true;
                goto out;
        }
        /* The cell and the tool message that answers it: one checkpoint */
        ran = false;
        if (append_turn(run, call->code ? call->code : NULL,
                        call->code ? &res : NULL, one_message(msg)) != 0)
                goto out;
        rc = 0;
out:
        if (ran) /* its tool message could not be made: the cell alone */
                report_cell(run, call->code, &res);
        free(text);
        cq_cell_result_release(&res);
        return rc;
}

static bool id_in(const json_t *ids, const char *id)
{
        size_t i;
        json_t *value;

        json_array_foreach(ids, i, value)
        {
                if (strcmp(json_string_value(value), id) == 0)
                        return true;
        }
        return false;
}

/* Answer the calls of \p reply not yet answered in the history (all of
 * them for a fresh reply), then reflect on any failure. */
static int
answer_calls(run_t *run, const cq_llm_reply_t *reply, const json_t *answered)
{
        size_t i;
        char *reflection = NULL;
        int rc = -1;

        for (i = 0; i < reply->ncalls; i++) {
                bool failed = false;

                if (id_in(answered, reply->calls[i].id))
                        continue;
                /* Stopping here leaves calls unanswered; a resumed run
                 * answers them first (finish_open_turn()). */
                if (must_stop(run))
                        goto out;
                if (answer_call(run, &reply->calls[i], &failed, &reflection) !=
                    0)
                        goto out;
                if (failed)
                        count_retry(run, false);
        }
        if (reflection) {
                event(run, "reflection",
                      json_pack("{s:s?}", "error", run->result->last_error));
                if (append(run, text_message("user", reflection)) != 0)
                        goto out;
        }
        rc = 0;
out:
        free(reflection);
        return rc;
}

/* The deadline of one test run: the test timeout, within the job's. */
static int64_t test_timeout_ms(const run_t *run)
{
        int64_t ms = run->test_timeout_s * 1000, left = remaining_ms(run);

        if (left < ms)
                ms = left > 1000 ? left : 1000;
        return ms;
}

/* Why a test cell that did not run to its end failed: the limit it hit,
 * and whether the job's kernel lost its state. */
static void explain_cell_end(const run_t *run,
                             const cq_cell_result_t *res,
                             bool fresh,
                             char *why,
                             size_t size)
{
        const char *where =
            fresh ? "in a fresh interpreter" : "in the job's kernel";
        const char *lost =
            !fresh && res->state_lost
                ? "; the kernel was replaced, so its variables are gone: "
                  "run your code again before answering"
                : "";

        switch (res->status) {
        case CQ_CELL_TIMEOUT:
                snprintf(why, size,
                         "the tests did not finish within %ld s "
                         "(limits.test_timeout_s) %s%s",
                         run->test_timeout_s, where, lost);
                break;
        case CQ_CELL_DIED:
                snprintf(why, size, "the kernel died while the tests ran %s%s",
                         where, lost);
                break;
        case CQ_CELL_CANCELLED:
                snprintf(why, size, "the tests were cancelled");
                break;
        default:
                why[0] = '\0';
                break;
        }
}

/* Write one input file into \p interp's work dir, fetching it first when
 * the job gives a URL. */
static int
put_input_file(run_t *run, cq_interp_t *interp, const cq_job_file_t *file);

/* The solution, then the test cell \p code, in a new interpreter. A
 * solution cell that fails there is noted in \p note (the first one) and
 * the others still run. Returns 0 with \p res the test cell's result; 1
 * when the tests could not run through the solution's fault (\p why says
 * how); -1 when the run must stop (result set). */
static int fresh_tests(run_t *run,
                       const char *code,
                       cq_cell_result_t *res,
                       char *why,
                       char *note,
                       size_t size)
{
        cq_interp_t *fresh = NULL;
        char errstr[512];
        size_t i, n = json_array_size(run->solution);
        int rc = -1;

        if (!run->opts->new_interp) {
                fail(run, CQ_AGENT_FAILED, "interpreter",
                     "tests.isolation \"fresh\" is not available here: no "
                     "way to start a new interpreter");
                return -1;
        }
        if (run->solution_over) {
                snprintf(why, size,
                         "the solution's cells exceed %zu bytes or could "
                         "not be kept: tests.isolation \"fresh\" cannot run "
                         "them",
                         SOLUTION_MAX);
                return 1;
        }
        fresh =
            run->opts->new_interp(run->opts->new_interp_opaque,
                                  run->job->backend, errstr, sizeof(errstr));
        if (!fresh) {
                fail(run, CQ_AGENT_FAILED, "interpreter",
                     "could not start a fresh interpreter for the tests: %s",
                     errstr);
                return -1;
        }
        for (i = 0; i < run->job->nfiles; i++)
                if (put_input_file(run, fresh, &run->job->files[i]) != 0)
                        goto out;
        for (i = 0; i < n; i++) {
                cq_cell_result_t cell;
                cq_exec_opts_t xo = {0};
                char *summary = NULL;
                int64_t left = remaining_ms(run);

                cq_cell_result_init(&cell);
                xo.timeout_ms = run->cell_timeout_s * 1000;
                if (left < xo.timeout_ms)
                        xo.timeout_ms = left > 1000 ? left : 1000;
                xo.cancel = run->opts->cancel;
                if (cq_interp_execute(
                        fresh,
                        json_string_value(json_array_get(run->solution, i)),
                        &xo, &cell) != CQ_OK) {
                        fail(run, CQ_AGENT_FAILED, "interpreter",
                             "the fresh interpreter for the tests failed: %s",
                             cq_interp_errmsg(fresh));
                        cq_cell_result_release(&cell);
                        goto out;
                }
                if (cell.status != CQ_CELL_OK && !note[0]) {
                        cell_error_summary(&cell, &summary);
                        snprintf(note, size,
                                 "in a fresh interpreter, cell %zu of the "
                                 "solution's %zu failed (%s): the tests run "
                                 "after the job's successful cells alone, "
                                 "so state set by failed cells or changed "
                                 "outside them is not there",
                                 i + 1, n, summary ? summary : "no detail");
                        free(summary);
                }
                cq_cell_result_release(&cell);
                if (cancelled(run))
                        goto out;
        }
        {
                cq_exec_opts_t xo = {0};

                xo.timeout_ms = test_timeout_ms(run);
                xo.cancel = run->opts->cancel;
                if (cq_interp_execute(fresh, code, &xo, res) != CQ_OK) {
                        fail(run, CQ_AGENT_FAILED, "interpreter",
                             "the fresh interpreter for the tests failed: %s",
                             cq_interp_errmsg(fresh));
                        goto out;
                }
        }
        rc = 0;
out:
        cq_interp_destroy(&fresh);
        return rc;
}

/* The job's tests, after a final answer. Returns 1 when they passed, 0 when
 * they failed (feedback appended), -1 when the run must stop. */
static int run_tests(run_t *run)
{
        char marker[40], errstr[256], why[1024] = "", note[1024] = "";
        char *code;
        cq_cell_result_t res;
        cq_testrun_t tr;
        bool fresh = run->job->tests_fresh;
        const char *isolation = fresh ? "fresh" : "kernel";
        int rc = -1;

        code = cq_testrun_code(run->job->tests, marker, sizeof(marker), errstr,
                               sizeof(errstr));
        if (!code) {
                fail(run, CQ_AGENT_FAILED, "interpreter",
                     "could not run the tests: %s", errstr);
                return -1;
        }
        cq_cell_result_init(&res);
        cq_testrun_init(&tr);
        if (fresh) {
                int f = fresh_tests(run, code, &res, why, note, sizeof(why));

                if (f < 0)
                        goto out;
                if (f == 1 && cq_testrun_fail(run->job->tests, why, &tr) != 0) {
                        run->oom = true;
                        goto out;
                }
        } else {
                cq_exec_opts_t xo = {0};

                xo.timeout_ms = test_timeout_ms(run);
                xo.cancel = run->opts->cancel;
                if (cq_interp_execute(run->interp, code, &xo, &res) != CQ_OK) {
                        fail(run, CQ_AGENT_FAILED, "interpreter",
                             "the interpreter failed: %s",
                             cq_interp_errmsg(run->interp));
                        goto out;
                }
        }
        if (!why[0]) {
                explain_cell_end(run, &res, fresh, why, sizeof(why));
                if ((why[0] ? cq_testrun_fail(run->job->tests, why, &tr)
                            : cq_testrun_parse(run->job->tests, marker, &res,
                                               &tr)) != 0) {
                        run->oom = true;
                        goto out;
                }
        }
        if (json_object_set_new(tr.report, "isolation",
                                json_string(isolation)) != 0 ||
            (note[0] && json_object_set_new(tr.report, "solution_error",
                                            json_string(note)) != 0)) {
                run->oom = true;
                goto out;
        }
        run->result->tests_passed = tr.passed;
        run->result->tests_total = tr.total;
        json_decref(run->result->tests);
        run->result->tests = json_incref(tr.report);
        event(run, "tests.result",
              json_pack("{s:i, s:i, s:s, s:s?}", "passed", tr.passed, "total",
                        tr.total, "isolation", isolation, "error", tr.error));
        if (run->nb) {
                char line[1400];

                snprintf(
                    line, sizeof(line), "**Tests%s: %d of %d passed.**%s%s",
                    fresh ? " (fresh interpreter)" : "", tr.passed, tr.total,
                    tr.error ? " " : "", tr.error ? tr.error : "");
                if (cq_nb_add_markdown(run->nb, line) != 0)
                        run->oom = true;
        }
        if (tr.passed == tr.total && res.status == CQ_CELL_OK && !tr.error) {
                rc = 1;
                goto out;
        }
        count_retry(run, true);
        if (tr.error)
                set_str(&run->result->last_error, "%s", tr.error);
        else
                set_str(&run->result->last_error, "%d of %d tests passed%s%s",
                        tr.passed, tr.total, note[0] ? "; " : "", note);
        {
                cq_test_failure_t failures[16];
                size_t n =
                    cq_testrun_failures(&tr, failures, CQ_ARRAY_SIZE(failures));
                char *text = cq_tooltext_test_feedback(
                    json_string_value(
                        json_object_get(run->job->tests, "function")),
                    (size_t)tr.passed, (size_t)tr.total, failures, n,
                    &run->topts, NULL);

                if (text && note[0]) {
                        char *both = NULL;

                        set_str(&both, "%s\n\nNote: %s.", text, note);
                        free(text);
                        text = both;
                }
                if (!text || append(run, text_message("user", text)) != 0) {
                        if (!text)
                                run->oom = true;
                        free(text);
                        goto out;
                }
                free(text);
        }
        rc = 0;
out:
        cq_testrun_release(&tr);
        cq_cell_result_release(&res);
        free(code);
        return rc;
}

/* Shrink old tool outputs until the history fits in 3/4 of the window;
 * the system prompt, the task and the recent turns stay intact. */
static void elide_context(run_t *run)
{
        int64_t limit = (int64_t)run->opts->context_tokens * 3 / 4;
        size_t i, n = json_array_size(run->history);

        if (run->opts->context_tokens == 0 ||
            cq_llm_estimate_tokens(run->history) <= limit)
                return;
        for (i = 0; i + KEEP_RECENT_MESSAGES < n; i++) {
                json_t *msg = json_array_get(run->history, i);
                const char *role =
                    json_string_value(json_object_get(msg, "role"));
                json_t *content = json_object_get(msg, "content");
                char note[160];

                if (!role || strcmp(role, "tool") != 0 ||
                    !json_is_string(content) ||
                    json_string_length(content) < ELIDE_MIN_CHARS)
                        continue;
                snprintf(note, sizeof(note),
                         "[output elided to fit the context window; it was "
                         "%zu characters]",
                         json_string_length(content));
                json_object_set_new(msg, "content", json_string(note));
                if (cq_llm_estimate_tokens(run->history) <= limit)
                        return;
        }
        cq_log_kv(CQ_LOG_WARN, "history still exceeds the context window",
                  "job_id", run->job->job_id, NULL);
}

/* Ids of the tool messages after the last assistant message. */
static json_t *answered_ids(const json_t *history, size_t from)
{
        json_t *ids = json_array();
        size_t i;

        for (i = from + 1; ids && i < json_array_size(history); i++) {
                json_t *msg = json_array_get(history, i);
                json_t *id = json_object_get(msg, "tool_call_id");

                if (json_is_string(id))
                        json_array_append(ids, id);
        }
        return ids;
}

/* Rebuild a parsed reply from a saved assistant message. */
static int reply_from_message(const json_t *msg, cq_llm_reply_t *reply)
{
        json_t *body = json_pack("{s:[{s:O}]}", "choices", "message", msg);
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        char errstr[256];
        int rc = -1;

        if (text)
                rc = cq_llm_parse_reply(text, strlen(text), reply, errstr,
                                        sizeof(errstr));
        free(text);
        json_decref(body);
        return rc;
}

/* Handle the assistant message at \p index: answer its open calls, or
 * treat it as the final answer. Returns 1 when the job is done (result
 * set), 0 to go on with the next LLM call, -1 to stop. */
static int
handle_assistant(run_t *run, size_t index, const cq_llm_reply_t *reply)
{
        json_t *answered;
        int rc;

        if (reply->ncalls > 0) {
                answered = answered_ids(run->history, index);
                if (!answered) {
                        run->oom = true;
                        return -1;
                }
                rc = answer_calls(run, reply, answered);
                json_decref(answered);
                if (rc != 0)
                        return -1;
                return over_retries(run) ? -1 : 0;
        }
        /* A final answer. */
        set_str(&run->result->answer, "%s",
                reply->content ? reply->content : "");
        if (run->job->tests) {
                rc = run_tests(run);
                if (rc < 0)
                        return -1;
                if (rc == 0)
                        return over_retries(run) ? -1 : 0;
        }
        if (run->nb && reply->content && *reply->content &&
            cq_nb_add_markdown(run->nb, reply->content) != 0)
                run->oom = true;
        run->result->status = CQ_AGENT_SUCCEEDED;
        return 1;
}

/* Tokens the request adds to the messages: the tools schema, one token
 * per 3 bytes as cq_llm_estimate_tokens() counts text. -1 when out of
 * memory. */
static int64_t tools_tokens(void)
{
        json_t *tools = cq_llm_tools_json();
        char *text = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
        int64_t n = text ? ((int64_t)strlen(text) + 2) / 3 : -1;

        free(text);
        json_decref(tools);
        return n;
}

/* Whether the next LLM call may go: its estimated tokens and cost within
 * the job's limits and the run's budget. When it may not, the job fails
 * with reason code "budget" (or stops, when the observer says so). The
 * estimate is the most the call may use: the prompt as
 * cq_llm_estimate_tokens() counts the history (plus the tools schema),
 * all at the uncached input price, and a reply of max_tokens. */
static bool within_budget(run_t *run)
{
        const cq_job_limits_t *lim = &run->job->limits;
        int64_t prompt =
            cq_llm_estimate_tokens(run->history) + run->tools_tokens;
        int64_t out = cq_llm_max_tokens(run->llm);
        double estimate;
        char why[512];
        int r;

        if (out <= 0) /* no max_tokens sent: the window bounds the reply */
                out = (int64_t)run->opts->context_tokens > prompt
                          ? (int64_t)run->opts->context_tokens - prompt
                          : 0;
        if (lim->max_tokens_total > 0 &&
            run->limit_tokens + prompt + out > lim->max_tokens_total) {
                fail(run, CQ_AGENT_FAILED, "budget",
                     "token budget: the next LLM call could use up to %lld "
                     "tokens (about %lld prompt and at most %lld output), "
                     "which would cross limits.max_tokens_total %lld (%lld "
                     "used so far)",
                     (long long)(prompt + out), (long long)prompt,
                     (long long)out, lim->max_tokens_total,
                     (long long)run->limit_tokens);
                return false;
        }
        estimate = run->price_known && run->cost_usd >= 0
                       ? cq_price_estimate(&run->price, prompt, out)
                       : -1;
        if (lim->max_cost_usd > 0) {
                if (!run->price_known) {
                        fail(run, CQ_AGENT_FAILED, "budget",
                             "cost budget: limits.max_cost_usd is set but "
                             "model %s has no price (%s), so the cost of a "
                             "call cannot be bounded",
                             cq_llm_model(run->llm),
                             run->opts->prices ? "not in CODERQ_PRICES_FILE"
                                               : "CODERQ_PRICES_FILE is unset");
                        return false;
                }
                if (run->cost_usd < 0) {
                        fail(run, CQ_AGENT_FAILED, "budget",
                             "cost budget: the cost so far is unknown (an "
                             "LLM reply reported no usage), so "
                             "limits.max_cost_usd cannot be kept");
                        return false;
                }
                if (run->cost_usd + estimate > lim->max_cost_usd) {
                        fail(run, CQ_AGENT_FAILED, "budget",
                             "cost budget: the next LLM call could cost up "
                             "to $%.6f (about %lld prompt and at most %lld "
                             "output tokens), which would cross "
                             "limits.max_cost_usd $%g ($%.6f spent so far)",
                             estimate, (long long)prompt, (long long)out,
                             lim->max_cost_usd, run->cost_usd);
                        return false;
                }
        }
        if (!run->obs || !run->obs->reserve)
                return true;
        why[0] = '\0';
        r = run->obs->reserve(run->obs->opaque, estimate, why, sizeof(why));
        if (r < 0) {
                refuse(run);
                return false;
        }
        if (r > 0) {
                fail(run, CQ_AGENT_FAILED, "budget", "run budget: %s",
                     why[0] ? why : "the run's budget would be crossed");
                return false;
        }
        return true;
}

/* Count one LLM call: its outcome and duration, and on success its
 * tokens and (when known) cost. */
static void count_call(run_t *run,
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
static void
account(run_t *run, const cq_llm_reply_t *reply, int64_t estimate, int64_t ms)
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
        count_call(run, "ok", ms, &call, cost);
        if (run->obs && run->obs->on_usage &&
            run->obs->on_usage(run->obs->opaque, &run->used, run->cost_usd) !=
                0)
                run->aborted = true;
}

/* One LLM call and what follows from it. Returns as handle_assistant(). */
static int turn(run_t *run)
{
        cq_llm_reply_t reply;
        size_t index;
        int64_t estimate, t0;
        int rc = -1;
        json_t *codes;
        size_t i;

        if (run->result->turns >= run->max_turns) {
                fail(run, CQ_AGENT_FAILED, "max_turns",
                     "turn limit reached: %ld LLM calls (max_turns %ld); "
                     "last error: %s",
                     run->result->turns, run->max_turns,
                     run->result->last_error ? run->result->last_error
                                             : "none");
                return -1;
        }
        elide_context(run);
        if (!within_budget(run))
                return -1;
        estimate = cq_llm_estimate_tokens(run->history) + run->tools_tokens;
        cq_llm_reply_init(&reply);
        run->result->turns++;
        t0 = cq_now_ms();
        switch (cq_llm_chat(run->llm, run->history, &reply)) {
        case CQ_OK:
                if (!reply.has_usage) {
                        json_t *one = json_pack("[O]", reply.message);

                        estimate += cq_llm_estimate_tokens(one);
                        json_decref(one);
                }
                account(run, &reply, estimate, cq_now_ms() - t0);
                if (run->aborted)
                        goto out;
                break;
        case CQ_ERR_RETRIABLE:
                count_call(run, "unavailable", cq_now_ms() - t0, NULL, -1);
                if (cancelled(run))
                        fail(run, CQ_AGENT_CANCELLED, "cancelled", "cancelled");
                else if (remaining_ms(run) <= 0)
                        (void)must_stop(run); /* the job's time is up */
                else
                        fail(run, CQ_AGENT_FAILED, "llm",
                             "the LLM stayed unavailable: %s",
                             cq_llm_errmsg(run->llm));
                goto out;
        default:
                count_call(run, "error", cq_now_ms() - t0, NULL, -1);
                fail(run, CQ_AGENT_FAILED, "llm", "the LLM request failed: %s",
                     cq_llm_errmsg(run->llm));
                goto out;
        }
        codes = json_array();
        for (i = 0; codes && i < reply.ncalls; i++)
                json_array_append_new(codes,
                                      reply.calls[i].code
                                          ? json_string(reply.calls[i].code)
                                          : json_null());
        event(run, "llm.reply",
              json_pack("{s:s?, s:o*}", "text", reply.content, "code", codes));
        index = json_array_size(run->history);
        if ((reply.ncalls > 0 ? hold : append)(run,
                                               json_incref(reply.message)) != 0)
                goto out;
        rc = handle_assistant(run, index, &reply);
out:
        cq_llm_reply_release(&reply);
        return rc;
}

/* Replay saved cells into the fresh kernel; they are not reported. */
static int replay(run_t *run, const json_t *cells)
{
        size_t i;
        json_t *cell;

        json_array_foreach(cells, i, cell)
        {
                cq_cell_result_t res;
                cq_exec_opts_t xo = {0};
                cq_err_t err;

                if (!json_is_string(cell))
                        continue;
                cq_cell_result_init(&res);
                xo.timeout_ms = run->cell_timeout_s * 1000;
                xo.cancel = run->opts->cancel;
                err = cq_interp_execute(run->interp, json_string_value(cell),
                                        &xo, &res);
                /* A cell that raised the first time raises again; only a
                 * change of outcome is worth a note. */
                if (err == CQ_OK && res.status != CQ_CELL_OK)
                        cq_log_kv(CQ_LOG_INFO, "replayed cell did not succeed",
                                  "job_id", run->job->job_id, "status",
                                  cq_cell_status_name(res.status), NULL);
                if (err == CQ_OK && res.status == CQ_CELL_OK)
                        add_solution_cell(run, json_string_value(cell));
                cq_cell_result_release(&res);
                if (err != CQ_OK) {
                        fail(run, CQ_AGENT_FAILED, "interpreter",
                             "could not replay the session: %s",
                             cq_interp_errmsg(run->interp));
                        return -1;
                }
                if (cancelled(run))
                        return -1;
        }
        return 0;
}

/* A remembered solution run against the tests before any LLM call.
 * Returns 1 when it passed (done), 0 otherwise, with \p triedp saying so
 * for the task message. */
static int
try_memory(run_t *run, const cq_agent_recall_t *recall, char **triedp)
{
        cq_cell_result_t res;
        int rc = 0;

        cq_cell_result_init(&res);
        if (run->nb) {
                char *note = NULL;

                set_str(&note,
                        "**From episodic memory** (scope `%s`): the solution "
                        "of job `%s` (model `%s`, similarity %.2f) runs "
                        "against the job's tests before any LLM call.",
                        recall->scope ? recall->scope : "?",
                        recall->source_job ? recall->source_job : "unknown",
                        recall->model ? recall->model : "unknown",
                        recall->similarity);
                if (!note || cq_nb_add_markdown(run->nb, note) != 0)
                        run->oom = true;
                free(note);
        }
        if (run_cell(run, recall->code, &res, false) == CQ_OK &&
            res.status == CQ_CELL_OK && !run->aborted) {
                long retries = run->result->retries;
                int t;

                run->trying_memory = true;
                t = run_tests(run);
                run->trying_memory = false;
                run->result->retries = retries; /* not the model's failure */
                if (t == 1) {
                        rc = 1;
                        run->result->from_memory = true;
                        run->result->status = CQ_AGENT_SUCCEEDED;
                        set_str(&run->result->answer,
                                "Solved from episodic memory with no LLM "
                                "call: the remembered solution of job %s "
                                "(scope %s, similarity %.2f) passed the job's "
                                "tests (%d of %d).",
                                recall->source_job ? recall->source_job
                                                   : "unknown",
                                recall->scope ? recall->scope : "?",
                                recall->similarity, run->result->tests_passed,
                                run->result->tests_total);
                } else if (t == 0) {
                        set_str(triedp,
                                " It was run in this kernel before you "
                                "started and did not pass the tests (%d of %d "
                                "passed), so what it defines is already "
                                "there.",
                                run->result->tests_passed,
                                run->result->tests_total);
                }
        } else if (!run->aborted) {
                set_str(triedp, " It was run in this kernel before you "
                                "started and failed.");
        }
        cq_cell_result_release(&res);
        return rc;
}

static long pick(long job_value, long opt_value)
{
        return job_value > 0 ? job_value : opt_value;
}

static int
put_input_file(run_t *run, cq_interp_t *interp, const cq_job_file_t *file)
{
        unsigned char *fetched = NULL;
        const unsigned char *data = file->data;
        size_t len = file->len;
        char errstr[512];
        int rc = -1;

        if (!data && file->url) {
                /* 120 s a file at most, within the job's time; a cancel
                 * ends it */
                int64_t until = cq_now_ms() + 120000;

                if (run->deadline_ms < until)
                        until = run->deadline_ms;
                if (cq_fetch_url_until(file->url, run->opts->file_max, until,
                                       run->opts->cancel,
                                       run->opts->fetch_allow, &fetched, &len,
                                       errstr, sizeof(errstr)) != CQ_OK) {
                        if (!must_stop(run))
                                fail(run, CQ_AGENT_FAILED, "input",
                                     "could not get input file %s: %s",
                                     file->name, errstr);
                        return -1;
                }
                data = fetched;
        }
        if (cq_interp_put_file(interp, file->name,
                               data ? (const void *)data : "", len) != CQ_OK) {
                fail(run, CQ_AGENT_FAILED, "input",
                     "could not write input file %s: %s", file->name,
                     cq_interp_errmsg(interp));
                goto out;
        }
        rc = 0;
out:
        free(fetched);
        return rc;
}

/* Start a new conversation, or continue a saved one. Returns 0, or -1
 * when the run must stop. */
static int begin(run_t *run,
                 const cq_agent_start_t *start,
                 const cq_agent_memory_t *mem,
                 cq_agent_recall_t *hint)
{
        const cq_job_t *job = run->job;
        char *files = NULL, *task = NULL, *tried = NULL;
        json_t *opening = NULL; /* the start's messages, one checkpoint */
        size_t i;
        int rc = -1;

        for (i = 0; i < job->nfiles; i++)
                if (put_input_file(run, run->interp, &job->files[i]) != 0)
                        return -1;
        if (start && start->history) {
                size_t n = json_array_size(start->history);

                /* A session's copy of the parent's conversation is
                 * checkpointed too, so the job resumes on its own. */
                for (i = 0; i < n; i++) {
                        json_t *msg =
                            json_deep_copy(json_array_get(start->history, i));

                        if (start->continue_job) {
                                if (json_array_append_new(run->history, msg) !=
                                    0) {
                                        run->oom = true;
                                        return -1;
                                }
                        } else if (append(run, msg) != 0) {
                                return -1;
                        }
                }
                if (replay(run, start->cells) != 0)
                        return -1;
                if (start->continue_job) {
                        run->result->turns = start->turns_done;
                        run->result->retries = start->retries_done;
                        return 0;
                }
                /* A session: the parent's conversation, then this task. */
                if (run->nb && job->title &&
                    cq_nb_add_heading(run->nb, job->title) != 0)
                        run->oom = true;
                task = task_message(job, NULL, NULL);
                if (!task) {
                        run->oom = true;
                        return -1;
                }
                rc = append(run, text_message("user", task));
                free(task);
                return rc;
        }
        if (run->nb && job->title && cq_nb_add_heading(run->nb, job->title))
                run->oom = true;
        if (mem && mem->lookup &&
            mem->lookup(mem->opaque, job->prompt, hint) != 0) {
                cq_log_kv(CQ_LOG_WARN, "memory lookup failed; going on",
                          "job_id", job->job_id, NULL);
                cq_agent_recall_release(hint);
        }
        if (hint->code) {
                free(run->result->memory_source_job);
                run->result->memory_source_job =
                    hint->source_job ? strdup(hint->source_job) : NULL;
        }
        files = files_message(job);
        if (!files)
                goto oom;
        /* The start's messages are one checkpoint; a remembered solution
         * tried first runs after the first two are stored. */
        opening = one_message(text_message(
            "system", job->system_prompt ? job->system_prompt
                                         : (run->opts->system_prompt
                                                ? run->opts->system_prompt
                                                : default_system_prompt)));
        if (!opening ||
            json_array_append_new(opening, text_message("user", files)) != 0)
                goto oom;
        if (hint->code && job->tests) {
                json_t *first = opening;

                opening = NULL;
                if (append_turn(run, NULL, NULL, first) != 0)
                        goto out;
                if (try_memory(run, hint, &tried) == 1) {
                        rc = 0;
                        goto out;
                }
        }
        if (run->aborted)
                goto out;
        task = task_message(job, hint->code ? hint : NULL, tried);
        if (!task)
                goto oom;
        if (!opening)
                opening = json_array();
        if (!opening ||
            json_array_append_new(opening, text_message("user", task)) != 0)
                goto oom;
        rc = append_turn(run, NULL, NULL, opening);
        opening = NULL;
        goto out;
oom:
        run->oom = true;
out:
        json_decref(opening);
        free(files);
        free(task);
        free(tried);
        return rc;
}

/* If the history ends inside a turn (a reply whose calls are not all
 * answered, or a final answer whose tests did not run), finish it. */
static int finish_open_turn(run_t *run)
{
        size_t n = json_array_size(run->history), i;
        cq_llm_reply_t reply;
        int rc;

        for (i = n; i > 0; i--) {
                const char *role = json_string_value(json_object_get(
                    json_array_get(run->history, i - 1), "role"));

                if (role && strcmp(role, "assistant") == 0)
                        break;
                if (role && strcmp(role, "tool") != 0)
                        return 0; /* a user message: the model's turn */
        }
        if (i == 0)
                return 0;
        cq_llm_reply_init(&reply);
        if (reply_from_message(json_array_get(run->history, i - 1), &reply) !=
            0) {
                cq_llm_reply_release(&reply);
                return 0; /* unreadable: ask the model again */
        }
        rc = handle_assistant(run, i - 1, &reply);
        cq_llm_reply_release(&reply);
        return rc;
}

/* What the run used, for its record: model, provider, sampling, the
 * SHA-256 of the system prompt the conversation starts with (the job's,
 * the configured or the built-in one; a session's is its parent's), the
 * coderq version, the backend and the interpreter's Python and main
 * packages. */
static json_t *repro_of(const run_t *run)
{
        json_t *repro = cq_llm_sampling_json(run->llm);
        const json_t *env = cq_interp_env(run->interp);
        const char *system = NULL;
        char hex[65];
        size_t i;

        if (!repro)
                return NULL;
        for (i = 0; i < json_array_size(run->history); i++) {
                const json_t *msg = json_array_get(run->history, i);
                const char *role =
                    json_string_value(json_object_get(msg, "role"));

                if (role && strcmp(role, "system") == 0) {
                        system =
                            json_string_value(json_object_get(msg, "content"));
                        break;
                }
        }
        if (system)
                cq_sha256_hex(system, strlen(system), hex);
        if (json_object_set_new(repro, "model",
                                json_string(cq_llm_model(run->llm))) ||
            json_object_set_new(
                repro, "provider",
                json_string(cq_llm_provider_name(cq_llm_provider(run->llm)))) ||
            json_object_set_new(repro, "system_prompt_sha256",
                                system ? json_string(hex) : json_null()) ||
            json_object_set_new(repro, "coderq_version",
                                json_string(CQ_VERSION)) ||
            json_object_set_new(repro, "backend",
                                json_string(cq_interp_backend(run->interp))) ||
            json_object_set(repro, "python",
                            env && json_object_get(env, "python")
                                ? json_object_get(env, "python")
                                : json_null()) ||
            json_object_set(repro, "packages",
                            env && json_object_get(env, "packages")
                                ? json_object_get(env, "packages")
                                : json_null())) {
                json_decref(repro);
                return NULL;
        }
        return repro;
}

cq_err_t cq_agent_run(const cq_job_t *job,
                      cq_interp_t *interp,
                      cq_llm_t *llm,
                      const cq_agent_opts_t *opts,
                      const cq_agent_observer_t *obs,
                      const cq_agent_memory_t *mem,
                      const cq_agent_start_t *start,
                      cq_nb_t *nb,
                      cq_agent_result_t *result)
{
        run_t run;
        cq_agent_recall_t hint;
        int64_t t0 = cq_now_ms();
        int rc = 0;

        memset(&run, 0, sizeof(run));
        memset(&hint, 0, sizeof(hint));
        cq_agent_result_init(result);
        run.job = job;
        run.interp = interp;
        run.llm = llm;
        run.opts = opts;
        run.obs = obs;
        run.nb = nb;
        run.result = result;
        run.max_turns = pick(job->limits.max_turns, opts->max_turns);
        run.max_retries = job->limits.max_retries >= 0 ? job->limits.max_retries
                                                       : opts->max_retries;
        run.cell_timeout_s =
            pick(job->limits.cell_timeout_s, opts->cell_timeout_s);
        run.job_timeout_s =
            pick(job->limits.job_timeout_s, opts->job_timeout_s);
        run.test_timeout_s =
            pick(job->limits.test_timeout_s, opts->test_timeout_s > 0
                                                 ? opts->test_timeout_s
                                                 : run.cell_timeout_s);
        /* The time earlier attempts ran counts: the limit is the job's. */
        run.deadline_ms =
            t0 + run.job_timeout_s * 1000 -
            (start && start->elapsed_ms > 0 ? start->elapsed_ms : 0);
        cq_tooltext_opts_init(&run.topts);
        run.topts.item_head = run.topts.item_tail = opts->tool_item_max / 2;
        run.topts.total_head = run.topts.total_tail = opts->tool_total_max / 2;
        run.solution = json_array();
        run.history = json_array();
        if (!run.history || !run.solution) {
                json_decref(run.history);
                json_decref(run.solution);
                return CQ_ERR_FATAL;
        }
        result->status = CQ_AGENT_FAILED;
        if (job->tests)
                result->tests_total = 0;
        run.tools_tokens = tools_tokens();
        if (start) {
                run.used = start->usage_done;
                run.cost_usd = start->cost_done_usd;
                run.limit_tokens =
                    run.used.prompt_tokens + run.used.completion_tokens;
        }
        cq_llm_usage_reset(llm);
        cq_llm_set_cancel(llm, opts->cancel);
        /* a call, its retries and their waits end with the job's time */
        cq_llm_set_deadline(llm, run.deadline_ms);
        if (run.tools_tokens < 0 || cq_llm_set_model(llm, job->model) != 0 ||
            cq_llm_set_provider(llm, job->provider) != 0) {
                if (cq_llm_set_model(llm, NULL) != 0)
                        cq_log_warn("could not restore the configured model");
                json_decref(run.history);
                json_decref(run.solution);
                return CQ_ERR_FATAL;
        }
        run.price_known =
            cq_prices_find(opts->prices, cq_llm_model(llm), &run.price);
        run.bad_sampling =
            cq_llm_set_sampling(
                llm,
                job->sampling.has_temperature ? job->sampling.temperature : -1,
                job->sampling.has_top_p ? job->sampling.top_p : -1,
                job->sampling.has_seed ? &job->sampling.seed : NULL) != 0;

        if (start && start->history && start->continue_job) {
                result->turns = start->turns_done;
                result->retries = start->retries_done;
        }
        if (run.bad_sampling) {
                fail(&run, CQ_AGENT_FAILED, "invalid_job",
                     "field \"seed\": provider %s takes no seed (the "
                     "Messages API has none)",
                     cq_llm_provider_name(cq_llm_provider(llm)));
                goto done;
        }
        /* A job resumed past its time limit fails before replaying its
         * cells. */
        if (must_stop(&run))
                goto done;
        if (begin(&run, start, mem, &hint) != 0)
                goto done;
        if (result->from_memory)
                goto done;
        if (start && start->continue_job) {
                rc = finish_open_turn(&run);
                if (rc != 0)
                        goto done;
        }
        for (;;) {
                if (must_stop(&run))
                        break;
                rc = turn(&run);
                if (rc != 0)
                        break;
        }
done:
        flush_held(&run); /* a reply whose calls were not all answered */
        if (run.aborted)
                result->status = CQ_AGENT_ABORTED;
        else if (run.oom && result->status == CQ_AGENT_SUCCEEDED)
                fail(&run, CQ_AGENT_FAILED, "internal", "out of memory");
        if (result->status != CQ_AGENT_ABORTED)
                collect_created_images(&run);
        result->prompt_tokens = run.used.prompt_tokens;
        result->completion_tokens = run.used.completion_tokens;
        result->cache_read_tokens = run.used.cache_read_tokens;
        result->cache_creation_tokens = run.used.cache_creation_tokens;
        result->cost_usd = run.cost_usd;
        /* an aborted run records nothing: no need to ask an E2B sandbox */
        if (result->status != CQ_AGENT_ABORTED)
                result->repro = repro_of(&run);
        if (result->status == CQ_AGENT_SUCCEEDED)
                result->reason_code = NULL;
        else if (!result->reason_code)
                result->reason_code = "internal";
        cq_llm_reset_sampling(llm);
        cq_llm_set_cancel(llm, NULL);
        cq_llm_set_deadline(llm, 0);
        if (cq_llm_set_provider(llm, NULL) != 0)
                cq_log_warn("could not restore the configured provider");
        if (cq_llm_set_model(llm, NULL) != 0)
                cq_log_warn("could not restore the configured model");
        result->solution = solution_text(&run);
        result->history = run.history;
        result->duration_ms = cq_now_ms() - t0;
        json_decref(run.solution);
        cq_agent_recall_release(&hint);
        return CQ_OK;
}
