/* SPDX-License-Identifier: MIT */
/* opening.c - the start of a run: the job's input files put in the work
 * dir (fetched when the job gives a URL), then a new conversation (system
 * prompt, files and task messages, a remembered solution tried before the
 * first LLM call) or a saved one taken up (resume.c). */
#include "coderq/agent/agent.h"

#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/agent/fetch.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "agent_int.h"

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

int agent_put_input_file(run_t *run,
                         cq_interp_t *interp,
                         const cq_job_file_t *file)
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
                        if (!agent_must_stop(run))
                                agent_fail(run, CQ_AGENT_FAILED, "input",
                                           "could not get input file %s: %s",
                                           file->name, errstr);
                        return -1;
                }
                data = fetched;
        }
        if (cq_interp_put_file(interp, file->name,
                               data ? (const void *)data : "", len) != CQ_OK) {
                agent_fail(run, CQ_AGENT_FAILED, "input",
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
int agent_begin(run_t *run,
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
                if (agent_put_input_file(run, run->interp, &job->files[i]) != 0)
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
                        } else if (agent_append(run, msg) != 0) {
                                return -1;
                        }
                }
                if (agent_replay(run, start->cells) != 0)
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
                rc = agent_append(run, agent_text_message("user", task));
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
        opening = agent_one_message(agent_text_message(
            "system", job->system_prompt ? job->system_prompt
                                         : (run->opts->system_prompt
                                                ? run->opts->system_prompt
                                                : default_system_prompt)));
        if (!opening || json_array_append_new(
                            opening, agent_text_message("user", files)) != 0)
                goto oom;
        if (hint->code && job->tests) {
                json_t *first = opening;

                opening = NULL;
                if (agent_append_turn(run, NULL, NULL, first) != 0)
                        goto out;
                if (agent_try_memory(run, hint, &tried) == 1) {
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
        if (!opening || json_array_append_new(
                            opening, agent_text_message("user", task)) != 0)
                goto oom;
        rc = agent_append_turn(run, NULL, NULL, opening);
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
