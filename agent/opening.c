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
        else if (err == CQ_OK && kind && job->visible.judge == CQ_JUDGE_MODEL)
                err = cq_buf_append_str(
                    &buf, "\n\nYour work will be checked by test code run in "
                          "this kernel after your final answer.");
        else if (err == CQ_OK && kind)
                err = cq_buf_append_str(
                    &buf, "\n\nYour work will be checked after your final "
                          "answer by test code that calls the functions and "
                          "reads the values you define in this kernel, with "
                          "plain data (numbers, strings, lists, tuples, dicts, "
                          "sets, bytes), so define them before answering and "
                          "return plain values.");
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

/* Write one input file into \p interp's work dir, fetching it first when
 * the job gives a URL. */
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

/* Every input file of the job, in its order. */
int agent_put_input_files(run_t *run, cq_interp_t *interp)
{
        size_t i;

        for (i = 0; i < run->job->nfiles; i++)
                if (put_input_file(run, interp, &run->job->files[i]) != 0)
                        return -1;
        return 0;
}

/* A session: the parent's conversation (taken up), then this task. */
static int open_session(run_t *run)
{
        const cq_job_t *job = run->job;
        char *task;
        int rc;

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

/* The first two messages of a new conversation, the system prompt and
 * the list of input files, in a new array; NULL when out of memory. */
static json_t *first_messages(const run_t *run)
{
        const cq_job_t *job = run->job;
        char *files = files_message(job);
        json_t *opening;

        if (!files)
                return NULL;
        opening = agent_one_message(agent_text_message(
            "system", job->system_prompt ? job->system_prompt
                                         : (run->opts->system_prompt
                                                ? run->opts->system_prompt
                                                : default_system_prompt)));
        if (opening && json_array_append_new(
                           opening, agent_text_message("user", files)) != 0) {
                json_decref(opening);
                opening = NULL;
        }
        free(files);
        return opening;
}

/* A new conversation: the system prompt, the files and the task, with a
 * remembered solution (\p hint, from \p mem) tried first when the job has
 * tests. 0, or -1 when the run must stop. */
static int
open_new(run_t *run, const cq_agent_memory_t *mem, cq_agent_recall_t *hint)
{
        const cq_job_t *job = run->job;
        char *task = NULL, *tried = NULL;
        json_t *opening; /* the start's messages, one checkpoint */
        int rc = -1;

        if (run->nb && job->title && cq_nb_add_heading(run->nb, job->title))
                run->oom = true;
        agent_recall(run, mem, hint);
        /* The start's messages are one checkpoint; a remembered solution
         * tried first runs after the first two are stored. */
        opening = first_messages(run);
        if (!opening)
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
        free(task);
        free(tried);
        return rc;
}

/* Start a new conversation, or continue a saved one. Returns 0, or -1
 * when the run must stop. */
int agent_begin(run_t *run,
                const cq_agent_start_t *start,
                const cq_agent_memory_t *mem,
                cq_agent_recall_t *hint)
{
        if (agent_put_input_files(run, run->interp) != 0)
                return -1;
        if (!start || !start->history)
                return open_new(run, mem, hint);
        if (agent_take_up(run, start) != 0)
                return -1;
        if (start->continue_job)
                return 0;
        return open_session(run);
}
