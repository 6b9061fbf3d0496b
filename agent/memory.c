/* SPDX-License-Identifier: MIT */
/* memory.c - episodic memory in the loop: a remembered solution run
 * against the job's tests before any LLM call, and the job's own solution
 * as the text memory keeps. Looking up and storing are the caller's
 * (cq_agent_memory_t, the worker). */
#include "coderq/agent/agent.h"

#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "agent_int.h"

#define MEMORY_CODE_MAX ((size_t)4 << 20) /* kept in memory */

void cq_agent_recall_release(cq_agent_recall_t *recall)
{
        free(recall->code);
        free(recall->source_job);
        free(recall->scope);
        free(recall->model);
        memset(recall, 0, sizeof(*recall));
}

/* The remembered solution the job may start from, if any. */
void agent_recall(run_t *run,
                  const cq_agent_memory_t *mem,
                  cq_agent_recall_t *hint)
{
        if (mem && mem->lookup &&
            mem->lookup(mem->opaque, run->job->prompt, hint) != 0) {
                cq_log_kv(CQ_LOG_WARN, "memory lookup failed; going on",
                          "job_id", run->job->job_id, NULL);
                cq_agent_recall_release(hint);
        }
        if (hint->code) {
                free(run->result->memory_source_job);
                run->result->memory_source_job =
                    hint->source_job ? strdup(hint->source_job) : NULL;
        }
}

/* The solution as one text with "# %%" between cells, for memory; NULL
 * when over MEMORY_CODE_MAX or empty. */
char *agent_solution_text(const run_t *run)
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

/* The notebook's note that the remembered solution runs first. */
static void note_recall(run_t *run, const cq_agent_recall_t *recall)
{
        char *note = NULL;

        agent_set_str(&note,
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

/* The job's tests on the remembered solution, which ran: their failures
 * are not the model's. Returns as agent_try_memory(). */
static int
test_recall(run_t *run, const cq_agent_recall_t *recall, char **triedp)
{
        long retries = run->result->retries;
        int t;

        run->trying_memory = true;
        t = agent_run_tests(run);
        run->trying_memory = false;
        run->result->retries = retries; /* not the model's failure */
        if (t == 1) {
                run->result->from_memory = true;
                run->result->status = CQ_AGENT_SUCCEEDED;
                agent_set_str(
                    &run->result->answer,
                    "Solved from episodic memory with no LLM "
                    "call: the remembered solution of job %s "
                    "(scope %s, similarity %.2f) passed the job's "
                    "tests (%d of %d).",
                    recall->source_job ? recall->source_job : "unknown",
                    recall->scope ? recall->scope : "?", recall->similarity,
                    run->result->tests_passed, run->result->tests_total);
                return 1;
        }
        if (t == 0)
                agent_set_str(triedp,
                              " It was run in this kernel before you "
                              "started and did not pass the tests (%d of %d "
                              "passed), so what it defines is already "
                              "there.",
                              run->result->tests_passed,
                              run->result->tests_total);
        return 0;
}

/* A remembered solution run against the tests before any LLM call.
 * Returns 1 when it passed (done), 0 otherwise, with \p triedp saying so
 * for the task message. */
int agent_try_memory(run_t *run, const cq_agent_recall_t *recall, char **triedp)
{
        cq_cell_result_t res;
        int rc = 0;

        cq_cell_result_init(&res);
        if (run->nb)
                note_recall(run, recall);
        if (agent_run_cell(run, recall->code, &res, false) == CQ_OK &&
            res.status == CQ_CELL_OK && !run->aborted)
                rc = test_recall(run, recall, triedp);
        else if (!run->aborted)
                agent_set_str(triedp, " It was run in this kernel before you "
                                      "started and failed.");
        cq_cell_result_release(&res);
        return rc;
}
