/* SPDX-License-Identifier: MIT */
/* agent.c - the reflection loop: cq_agent_run() and its turns, each an
 * LLM call whose tool calls run as cells, until a final answer (passing
 * the job's tests, when it has some) or a limit ends the run. The history
 * grows only through checkpoint.c, so that a later run can continue it;
 * the loop's other concerns have the files agent_int.h names. */
#include "coderq/agent/agent.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/log.h"
#include "coderq/agent/tooltext.h"
#include "coderq/common/util.h"
#include "agent_int.h"

#define KEEP_RECENT_MESSAGES 6   /* never elided */
#define ELIDE_MIN_CHARS      200 /* shorter tool outputs are not worth it */
#define EVENT_TEXT_MAX       4096
/* A reply with calls waits this long for its cell (and the cell's tool
 * message) to be checkpointed with it in one statement (agent_hold()). */
#define HOLD_REPLY_MS 250

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
        opts->case_time_factor = (double)cfg->case_time_factor;
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
        json_decref(result->hidden);
        json_decref(result->repro);
        json_decref(result->history);
        agent_images_release(&result->images);
        cq_agent_result_init(result);
}

void agent_set_str(char **dst, const char *fmt, ...)
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

void agent_refuse(run_t *run)
{
        run->refused = true;
        run->aborted = true;
}

bool agent_cancelled(const run_t *run)
{
        return run->opts->cancel && atomic_load(run->opts->cancel) != 0;
}

void agent_event(run_t *run, const char *type, json_t *data)
{
        if (data && run->obs && run->obs->on_event)
                run->obs->on_event(run->obs->opaque, type, data);
        json_decref(data);
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
        agent_event(run, "cell.output", data);
}

int64_t agent_remaining_ms(const run_t *run)
{
        return run->deadline_ms - cq_now_ms();
}

/* A cell that succeeded becomes part of the job's solution. */
void agent_add_solution_cell(run_t *run, const char *code)
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

/* Run one cell and record it everywhere; with \p deferred the caller
 * reports it (agent_append_turn(), with the tool message that answers it). */
cq_err_t agent_run_cell(run_t *run,
                        const char *code,
                        cq_cell_result_t *res,
                        bool deferred)
{
        cq_exec_opts_t xo = {0};
        int64_t left = agent_remaining_ms(run);
        cq_err_t err;

        xo.timeout_ms = run->cell_timeout_s * 1000;
        if (left < xo.timeout_ms)
                xo.timeout_ms = left > 1000 ? left : 1000;
        xo.on_output = on_output;
        xo.opaque = run;
        xo.cancel = run->opts->cancel;
        if (run->holding) {
                xo.on_slow = agent_flush_held;
                xo.slow_ms = HOLD_REPLY_MS;
        }
        agent_event(run, "cell.started", json_pack("{s:s}", "code", code));
        err = cq_interp_execute(run->interp, code, &xo, res);
        if (err != CQ_OK)
                return err;
        if (res->status == CQ_CELL_CANCELLED && run->opts->stop &&
            atomic_load(run->opts->stop) != 0) {
                /* A draining worker interrupted it: not the code's doing,
                 * so it is no cell of the job's. Nothing of it is
                 * recorded; the run ends aborted, a reply whose call it
                 * answered kept, and the resumed job runs it again. */
                run->aborted = true;
                return CQ_OK;
        }
        run->result->cells++;
        if (run->opts->metrics)
                cq_series_observe(
                    cq_metric_series(
                        run->opts->metrics->cells,
                        (const char *[]){cq_cell_status_name(res->status)}),
                    (double)res->duration_ms / 1000.0);
        agent_event(run, "cell.finished",
                    json_pack("{s:s, s:I, s:i}", "status",
                              cq_cell_status_name(res->status), "duration_ms",
                              (json_int_t)res->duration_ms, "execution_count",
                              res->execution_count));
        if (run->nb && cq_nb_add_code(run->nb, code, res) != 0)
                run->oom = true;
        run->cells_since_tests++;
        agent_collect_output_images(run, res);
        agent_note_created_files(run, false);
        if (res->status == CQ_CELL_OK) {
                agent_add_solution_cell(run, code);
                run->fail_sig[0] = '\0';
        }
        if (!deferred)
                agent_report_cell(run, code, res);
        return CQ_OK;
}

/* "NameError: name 'x' is not defined" for a failed cell. */
void agent_cell_error_summary(const cq_cell_result_t *res, char **dst)
{
        size_t i;
        json_t *output;

        agent_set_str(dst, "the cell ended with status %s",
                      cq_cell_status_name(res->status));
        json_array_foreach(res->outputs, i, output)
        {
                const char *type =
                    json_string_value(json_object_get(output, "output_type"));

                if (type && strcmp(type, "error") == 0)
                        agent_set_str(
                            dst, "%s: %s",
                            json_string_value(json_object_get(output, "ename")),
                            json_string_value(
                                json_object_get(output, "evalue")));
        }
}

/* End the run with \p status; \p code is the kind of reason
 * (docs/OPERATIONS.md#reason-codes), a static string. */
void agent_fail(run_t *run,
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
        /* an interpreter, the judge or our own side lost: another try may
         * not meet it (the LLM's outages say so where they happen) */
        run->result->transient =
            status == CQ_AGENT_FAILED &&
            (strcmp(code, "interpreter") == 0 || strcmp(code, "judge") == 0 ||
             strcmp(code, "internal") == 0 || strcmp(code, "storage") == 0);
}

/* Whether the run must stop now; sets the result when it must. */
bool agent_must_stop(run_t *run)
{
        if (run->opts->stop && atomic_load(run->opts->stop) != 0)
                run->aborted = true;
        if (run->aborted) {
                run->result->status = CQ_AGENT_ABORTED;
                return true;
        }
        if (run->oom) {
                agent_fail(run, CQ_AGENT_FAILED, "internal", "out of memory");
                return true;
        }
        if (agent_cancelled(run)) {
                agent_fail(run, CQ_AGENT_CANCELLED, "cancelled", "cancelled");
                return true;
        }
        if (agent_remaining_ms(run) <= 0) {
                agent_fail(run, CQ_AGENT_FAILED, "job_timeout",
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
        agent_fail(run, CQ_AGENT_FAILED,
                   run->tests_failed_last ? "tests" : "max_retries",
                   "retry limit reached: %ld failed cells or test runs "
                   "(max_retries %ld); last error: %s",
                   run->result->retries, run->max_retries,
                   run->result->last_error ? run->result->last_error : "none");
        return true;
}

/* A tool call with no code to run (unknown tool or unusable arguments):
 * a failed attempt. Its tool message's text in *\p textp. */
static void bad_call(run_t *run,
                     const cq_llm_tool_call_t *call,
                     char **textp,
                     char **reflectionp)
{
        agent_set_str(textp,
                      "Error: %s. Call execute_code with a JSON object "
                      "holding one string field \"code\".",
                      call->error ? call->error : "no code given");
        agent_set_str(&run->result->last_error, "%s",
                      call->error ? call->error : "no code given");
        agent_set_str(reflectionp,
                      "The tool call could not run: %s. Call the "
                      "execute_code tool again with arguments "
                      "{\"code\": \"<Python source>\"}.",
                      call->error ? call->error : "no code given");
}

/* Whether the cell \p code that just failed is the one that failed last,
 * with the same error: the model is stuck, and another turn would spend
 * tokens on the same failure. A cell that succeeds forgets it. */
static bool stuck_on_cell(run_t *run, const char *code)
{
        const char *error = run->result->last_error;
        size_t len = strlen(code);
        char *both = malloc(len + (error ? strlen(error) : 0) + 2);
        char sig[65];
        bool same;

        if (!both)
                return false;
        memcpy(both, code, len);
        both[len] = '\0';
        snprintf(both + len, strlen(error ? error : "") + 2, "\n%s",
                 error ? error : "");
        cq_sha256_hex(both, strlen(both), sig);
        free(both);
        same = strcmp(sig, run->fail_sig) == 0;
        memcpy(run->fail_sig, sig, sizeof(sig));
        return same;
}

/* Run the code of \p call into \p res, not reported yet; its tool
 * message's text in *\p textp. A failed cell is a failed attempt, with
 * its reflection prompt. 0, or -1 when the interpreter failed (result
 * set) or a drain interrupted the cell (the run is aborted). */
static int call_cell(run_t *run,
                     const cq_llm_tool_call_t *call,
                     cq_cell_result_t *res,
                     char **textp,
                     bool *failedp,
                     char **reflectionp)
{
        if (agent_run_cell(run, call->code, res, true) != CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "the interpreter failed: %s",
                           cq_interp_errmsg(run->interp));
                return -1;
        }
        if (run->aborted)
                return -1;
        *textp = cq_tooltext_format(res, &run->topts, NULL);
        if (res->status != CQ_CELL_OK) {
                agent_cell_error_summary(res, &run->result->last_error);
                if (stuck_on_cell(run, call->code)) {
                        run->stuck = true;
                        agent_fail(run, CQ_AGENT_FAILED, "stuck",
                                   "the same code failed with the same error "
                                   "twice in a row: %s",
                                   run->result->last_error
                                       ? run->result->last_error
                                       : "no detail");
                        *failedp = true;
                        return 0;
                }
                free(*reflectionp);
                *reflectionp =
                    cq_tooltext_reflection(res, call->code, &run->topts, NULL);
                if (!*reflectionp)
                        run->oom = true;
                *failedp = true;
        }
        return 0;
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
                bad_call(run, call, &text, reflectionp);
                *failedp = true;
        } else {
                if (call_cell(run, call, &res, &text, failedp, reflectionp) !=
                    0)
                        goto out;
                ran = true;
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
        if (agent_append_turn(run, call->code ? call->code : NULL,
                              call->code ? &res : NULL,
                              agent_one_message(msg)) != 0)
                goto out;
        rc = 0;
out:
        if (ran) /* its tool message could not be made: the cell alone */
                agent_report_cell(run, call->code, &res);
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
                 * answers them first (agent_finish_open_turn()). */
                if (agent_must_stop(run))
                        goto out;
                if (answer_call(run, &reply->calls[i], &failed, &reflection) !=
                    0)
                        goto out;
                if (failed)
                        agent_count_retry(run, false);
                if (run->stuck)
                        goto out; /* its turn is kept; the run ends */
        }
        if (reflection) {
                agent_event(
                    run, "reflection",
                    json_pack("{s:s?}", "error", run->result->last_error));
                if (agent_append(run, agent_text_message("user", reflection)) !=
                    0)
                        goto out;
        }
        rc = 0;
out:
        free(reflection);
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

/* Handle the assistant message at \p index: answer its open calls, or
 * treat it as the final answer. Returns 1 when the job is done (result
 * set), 0 to go on with the next LLM call, -1 to stop. */
int agent_handle_assistant(run_t *run,
                           size_t index,
                           const cq_llm_reply_t *reply)
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
        agent_set_str(&run->result->answer, "%s",
                      reply->content ? reply->content : "");
        if (run->job->tests) {
                rc = agent_run_tests(run);
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

/* Whether the run made its last LLM call; fails the run when it did. */
static bool over_turns(run_t *run)
{
        if (run->result->turns < run->max_turns)
                return false;
        agent_fail(run, CQ_AGENT_FAILED, "max_turns",
                   "turn limit reached: %ld LLM calls (max_turns %ld); "
                   "last error: %s",
                   run->result->turns, run->max_turns,
                   run->result->last_error ? run->result->last_error : "none");
        return true;
}

/* Call the LLM with the history and count the call into the job's usage.
 * 0 with \p reply filled; -1 when the run must stop (result set, or
 * aborted by the usage observer). */
static int call_llm(run_t *run, cq_llm_reply_t *reply)
{
        int64_t estimate =
            cq_llm_estimate_tokens(run->history) + run->tools_tokens;
        int64_t t0;

        run->result->turns++;
        t0 = cq_now_ms();
        switch (cq_llm_chat(run->llm, run->history, reply)) {
        case CQ_OK:
                if (!reply->has_usage) {
                        json_t *one = json_pack("[O]", reply->message);

                        estimate += cq_llm_estimate_tokens(one);
                        json_decref(one);
                }
                agent_account(run, reply, estimate, cq_now_ms() - t0);
                return run->aborted ? -1 : 0;
        case CQ_ERR_RETRIABLE:
                agent_count_call(run, "unavailable", cq_now_ms() - t0, NULL,
                                 -1);
                if (agent_cancelled(run))
                        agent_fail(run, CQ_AGENT_CANCELLED, "cancelled",
                                   "cancelled");
                else if (agent_remaining_ms(run) <= 0)
                        (void)agent_must_stop(run); /* the job's time is up */
                else {
                        agent_fail(run, CQ_AGENT_FAILED, "llm",
                                   "the LLM stayed unavailable: %s",
                                   cq_llm_errmsg(run->llm));
                        run->result->transient = true;
                }
                return -1;
        default:
                agent_count_call(run, "error", cq_now_ms() - t0, NULL, -1);
                agent_fail(run, CQ_AGENT_FAILED, "llm",
                           "the LLM request failed: %s",
                           cq_llm_errmsg(run->llm));
                return -1;
        }
}

/* The "llm.reply" event: the reply's text and the code of each call
 * (null for a call without). */
static void reply_event(run_t *run, const cq_llm_reply_t *reply)
{
        json_t *codes = json_array();
        size_t i;

        for (i = 0; codes && i < reply->ncalls; i++)
                json_array_append_new(codes,
                                      reply->calls[i].code
                                          ? json_string(reply->calls[i].code)
                                          : json_null());
        agent_event(
            run, "llm.reply",
            json_pack("{s:s?, s:o*}", "text", reply->content, "code", codes));
}

/* One LLM call and what follows from it. Returns as
 * agent_handle_assistant(). */
static int turn(run_t *run)
{
        cq_llm_reply_t reply;
        size_t index;
        int rc = -1;

        if (over_turns(run))
                return -1;
        elide_context(run);
        if (!agent_within_budget(run))
                return -1;
        cq_llm_reply_init(&reply);
        if (call_llm(run, &reply) != 0)
                goto out;
        reply_event(run, &reply);
        index = json_array_size(run->history);
        if ((reply.ncalls > 0 ? agent_hold : agent_append)(
                run, json_incref(reply.message)) != 0)
                goto out;
        rc = agent_handle_assistant(run, index, &reply);
out:
        cq_llm_reply_release(&reply);
        return rc;
}

static long pick(long job_value, long opt_value)
{
        return job_value > 0 ? job_value : opt_value;
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

/* The run's limits (the job's, else the options') and deadline, and how
 * much of a cell's output the model sees. */
static void set_limits(run_t *run, const cq_agent_start_t *start, int64_t t0)
{
        const cq_job_limits_t *lim = &run->job->limits;
        const cq_agent_opts_t *opts = run->opts;

        run->max_turns = pick(lim->max_turns, opts->max_turns);
        run->max_retries =
            lim->max_retries >= 0 ? lim->max_retries : opts->max_retries;
        run->cell_timeout_s = pick(lim->cell_timeout_s, opts->cell_timeout_s);
        run->job_timeout_s = pick(lim->job_timeout_s, opts->job_timeout_s);
        run->test_timeout_s =
            pick(lim->test_timeout_s, opts->test_timeout_s > 0
                                          ? opts->test_timeout_s
                                          : run->cell_timeout_s);
        /* The time earlier attempts ran counts: the limit is the job's. */
        run->deadline_ms =
            t0 + run->job_timeout_s * 1000 -
            (start && start->elapsed_ms > 0 ? start->elapsed_ms : 0);
        cq_tooltext_opts_init(&run->topts);
        run->topts.item_head = run->topts.item_tail = opts->tool_item_max / 2;
        run->topts.total_head = run->topts.total_tail =
            opts->tool_total_max / 2;
}

/* Set the LLM client up for the job: its cancel flag and deadline, the
 * job's model, provider and sampling, and the usage of earlier attempts
 * (\p start). -1 when the tools schema cannot be measured or the job's
 * model or provider cannot be set (the configured model is restored). */
static int set_llm(run_t *run, const cq_agent_start_t *start)
{
        const cq_job_t *job = run->job;
        cq_llm_t *llm = run->llm;

        run->tools_tokens = agent_tools_tokens();
        if (start) {
                run->used = start->usage_done;
                run->cost_usd = start->cost_done_usd;
                run->limit_tokens =
                    run->used.prompt_tokens + run->used.completion_tokens;
        }
        cq_llm_usage_reset(llm);
        cq_llm_set_cancel(llm, run->opts->cancel);
        /* a call, its retries and their waits end with the job's time */
        cq_llm_set_deadline(llm, run->deadline_ms);
        if (run->tools_tokens < 0 || cq_llm_set_model(llm, job->model) != 0 ||
            cq_llm_set_provider(llm, job->provider) != 0) {
                if (cq_llm_set_model(llm, NULL) != 0)
                        cq_log_warn("could not restore the configured model");
                return -1;
        }
        run->price_known =
            cq_prices_find(run->opts->prices, cq_llm_model(llm), &run->price);
        run->bad_sampling =
            cq_llm_set_sampling(
                llm,
                job->sampling.has_temperature ? job->sampling.temperature : -1,
                job->sampling.has_top_p ? job->sampling.top_p : -1,
                job->sampling.has_seed ? &job->sampling.seed : NULL) != 0;
        return 0;
}

/* The verdict of a solution that did not run to its end. */
static const char *solution_verdict(const cq_cell_result_t *cell)
{
        size_t i;
        const json_t *output;

        if (cell->status == CQ_CELL_TIMEOUT)
                return "timeout";
        json_array_foreach(cell->outputs, i, output)
        {
                const char *ename =
                    json_string_value(json_object_get(output, "ename"));

                if (ename && (strcmp(ename, "SyntaxError") == 0 ||
                              strcmp(ename, "IndentationError") == 0 ||
                              strcmp(ename, "TabError") == 0))
                        return "syntax_error";
        }
        return "runtime_error";
}

/* A job judged with no LLM: its solution is the answer. The solution as
 * one cell, then the tests, with no feedback and no second try. */
static void judge_solution(run_t *run)
{
        cq_cell_result_t cell;
        int rc;

        cq_cell_result_init(&cell);
        if (run->job->nfiles > 0 &&
            agent_put_input_files(run, run->interp) != 0)
                goto out;
        if (agent_run_cell(run, run->job->solution, &cell, false) != CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                           "the interpreter failed: %s",
                           cq_interp_errmsg(run->interp));
                goto out;
        }
        if (agent_must_stop(run))
                goto out;
        if (cell.status != CQ_CELL_OK) {
                agent_cell_error_summary(&cell, &run->result->last_error);
                run->solution_verdict = solution_verdict(&cell);
                agent_fail(run, CQ_AGENT_FAILED, "tests",
                           "the solution did not run: %s",
                           run->result->last_error ? run->result->last_error
                                                   : "no detail");
                goto out;
        }
        run->answered = true;
        if (run->job->tests) {
                rc = agent_run_tests(run);
                if (rc < 0)
                        goto out;
                if (rc == 0) {
                        agent_fail(run, CQ_AGENT_FAILED, "tests", "%s",
                                   run->result->last_error
                                       ? run->result->last_error
                                       : "the tests failed");
                        goto out;
                }
        }
        run->result->status = CQ_AGENT_SUCCEEDED;
out:
        cq_cell_result_release(&cell);
}

/* The conversation, from its start (or where a saved one ended) to the
 * turn that ends the run; the result says how it ended. */
static void converse(run_t *run,
                     const cq_agent_start_t *start,
                     const cq_agent_memory_t *mem,
                     cq_agent_recall_t *hint)
{
        if (run->bad_sampling) {
                agent_fail(run, CQ_AGENT_FAILED, "invalid_job",
                           "field \"seed\": provider %s takes no seed (the "
                           "Messages API has none)",
                           cq_llm_provider_name(cq_llm_provider(run->llm)));
                return;
        }
        /* A job resumed past its time limit fails before replaying its
         * cells. */
        if (agent_must_stop(run))
                return;
        if (run->job->solution) {
                judge_solution(run);
                return;
        }
        if (cq_llm_provider(run->llm) == CQ_LLM_NONE) {
                agent_fail(run, CQ_AGENT_FAILED, "llm", "%s",
                           CQ_LLM_NONE_REASON);
                return;
        }
        if (agent_begin(run, start, mem, hint) != 0)
                return;
        if (run->result->from_memory)
                return;
        if (start && start->continue_job && agent_finish_open_turn(run) != 0)
                return;
        for (;;) {
                if (agent_must_stop(run))
                        return;
                if (turn(run) != 0)
                        return;
        }
}

/* Whether \p code (a reason code) is a fault of ours or of a service:
 * never the model's doing. */
static bool infra_code(const char *code)
{
        static const char *const codes[] = {
            "llm",   "interpreter", "judge",       "internal",
            "input", "storage",     "invalid_job", "attempts"};
        size_t i;

        for (i = 0; code && i < CQ_ARRAY_SIZE(codes); i++)
                if (strcmp(code, codes[i]) == 0)
                        return true;
        return false;
}

/* The run's verdict (docs/EVALUATION.md#verdicts): ours when the run
 * failed for a reason not the model's; else the hidden tests' when they
 * ran; else what the run shows. */
static void decide_verdict(run_t *run)
{
        cq_agent_result_t *result = run->result;

        result->verdict = NULL;
        result->judge =
            run->hidden_verdict ? run->hidden_judge : run->test_judge;
        if (result->status == CQ_AGENT_ABORTED ||
            result->status == CQ_AGENT_CANCELLED)
                return;
        if (result->status == CQ_AGENT_FAILED &&
            infra_code(result->reason_code))
                result->verdict = "infra_error";
        else if (result->status == CQ_AGENT_FAILED && result->reason_code &&
                 strcmp(result->reason_code, "stuck") == 0)
                result->verdict = "stuck";
        else if (run->hidden_verdict)
                result->verdict = run->hidden_verdict;
        else if (result->status == CQ_AGENT_SUCCEEDED)
                result->verdict = "passed";
        else if (run->solution_verdict)
                result->verdict = run->solution_verdict;
        else if (run->answered && run->test_verdict)
                result->verdict = run->test_verdict;
        else
                result->verdict = "no_answer";
}

/* The hidden tests, once, on the answer the run ended with: unless it
 * ended without one, was stopped or cancelled, or failed for a reason of
 * ours (it will be tried again). */
static void hidden_tests(run_t *run)
{
        const cq_agent_result_t *result = run->result;

        if (!run->job->hidden.spec || !run->answered || run->aborted ||
            run->oom || result->status == CQ_AGENT_ABORTED ||
            result->status == CQ_AGENT_CANCELLED ||
            (result->status == CQ_AGENT_FAILED &&
             infra_code(result->reason_code)))
                return;
        if (agent_run_hidden_tests(run) != 0 && run->oom)
                agent_fail(run, CQ_AGENT_FAILED, "internal", "out of memory");
}

/* The result of a run that ended: its final status and reason code, the
 * images, usage and cost, and what it ran with. */
static void conclude(run_t *run)
{
        cq_agent_result_t *result = run->result;

        agent_flush_held(run); /* a reply whose calls were not all answered */
        if (run->aborted)
                result->status = CQ_AGENT_ABORTED;
        else if (run->oom && result->status == CQ_AGENT_SUCCEEDED)
                agent_fail(run, CQ_AGENT_FAILED, "internal", "out of memory");
        hidden_tests(run);
        if (result->status != CQ_AGENT_ABORTED)
                agent_collect_created_images(run);
        result->prompt_tokens = run->used.prompt_tokens;
        result->completion_tokens = run->used.completion_tokens;
        result->cache_read_tokens = run->used.cache_read_tokens;
        result->cache_creation_tokens = run->used.cache_creation_tokens;
        result->cost_usd = run->cost_usd;
        /* an aborted run records nothing: no need to ask an E2B sandbox */
        if (result->status != CQ_AGENT_ABORTED)
                result->repro = repro_of(run);
        if (result->status == CQ_AGENT_SUCCEEDED)
                result->reason_code = NULL;
        else if (!result->reason_code)
                result->reason_code = "internal";
        decide_verdict(run);
}

/* Give the LLM client back its configured model, provider and sampling,
 * without the job's cancel flag and deadline. */
static void restore_llm(cq_llm_t *llm)
{
        cq_llm_reset_sampling(llm);
        cq_llm_set_cancel(llm, NULL);
        cq_llm_set_deadline(llm, 0);
        if (cq_llm_set_provider(llm, NULL) != 0)
                cq_log_warn("could not restore the configured provider");
        if (cq_llm_set_model(llm, NULL) != 0)
                cq_log_warn("could not restore the configured model");
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
        run.cells_done = start ? start->cells_done : 0;
        run.visible = job->visible;
        if (!run.visible.spec && job->tests) {
                run.visible.spec = job->tests;
                run.visible.fresh = job->tests_fresh;
        }
        set_limits(&run, start, t0);
        run.solution = json_array();
        run.history = json_array();
        if (!run.history || !run.solution)
                goto fatal;
        result->status = CQ_AGENT_FAILED;
        if (job->tests)
                result->tests_total = 0;
        if (set_llm(&run, start) != 0)
                goto fatal;
        if (start && start->history && start->continue_job) {
                result->turns = start->turns_done;
                result->retries = start->retries_done;
        }
        converse(&run, start, mem, &hint);
        conclude(&run);
        restore_llm(llm);
        result->solution = agent_solution_text(&run);
        result->history = run.history;
        result->duration_ms = cq_now_ms() - t0;
        json_decref(run.solution);
        free(run.ref_ms);
        agent_forget_files(&run);
        cq_agent_recall_release(&hint);
        return CQ_OK;
fatal:
        json_decref(run.history);
        json_decref(run.solution);
        return CQ_ERR_FATAL;
}
