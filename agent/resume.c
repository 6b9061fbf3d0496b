/* SPDX-License-Identifier: MIT */
/* resume.c - taking up a saved conversation: its cells replayed into the
 * new kernel, and a turn it ended inside (a reply whose calls are not all
 * answered, or a final answer whose tests did not run) finished before
 * the next LLM call, so a completed LLM turn is never repeated. */
#include "coderq/agent/agent.h"

#include <stdlib.h>
#include <string.h>

#include "coderq/common/log.h"
#include "agent_int.h"

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

/* Replay saved cells \p from to \p to (excluded) into the fresh kernel;
 * they are not reported. */
static int replay(run_t *run, const json_t *cells, size_t from, size_t to)
{
        size_t i;

        for (i = from; i < to; i++) {
                const json_t *cell = json_array_get(cells, i);
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
                        agent_add_solution_cell(run, json_string_value(cell));
                cq_cell_result_release(&res);
                if (err != CQ_OK) {
                        agent_fail(run, CQ_AGENT_FAILED, "interpreter",
                                   "could not replay the session: %s",
                                   cq_interp_errmsg(run->interp));
                        return -1;
                }
                if (agent_cancelled(run))
                        return -1;
        }
        return 0;
}

/* Continue the conversation \p start saved: a resumed job's or, for a
 * session, its parent's. */
int agent_take_up(run_t *run, const cq_agent_start_t *start)
{
        size_t n = json_array_size(start->history), i, ncells, parent_cells;

        /* A session's copy of the parent's conversation is
         * checkpointed too, so the job resumes on its own. */
        for (i = 0; i < n; i++) {
                json_t *msg = json_deep_copy(json_array_get(start->history, i));

                if (start->continue_job) {
                        if (json_array_append_new(run->history, msg) != 0) {
                                run->oom = true;
                                return -1;
                        }
                } else if (agent_append(run, msg) != 0) {
                        return -1;
                }
        }
        ncells = json_array_size(start->cells);
        parent_cells =
            start->parent_cells < ncells ? start->parent_cells : ncells;
        if (replay(run, start->cells, 0, parent_cells) != 0)
                return -1;
        /* The files the parent's cells left are the parent's, stored
         * with it */
        if (parent_cells > 0)
                agent_note_parent_files(run);
        if (replay(run, start->cells, parent_cells, ncells) != 0)
                return -1;
        /* Files the replayed cells made: when they appeared is not known */
        if (ncells > 0)
                agent_note_created_files(run, true);
        if (start->continue_job) {
                run->result->turns = start->turns_done;
                run->result->retries = start->retries_done;
        }
        return 0;
}

/* If the history ends inside a turn (a reply whose calls are not all
 * answered, or a final answer whose tests did not run), finish it. */
int agent_finish_open_turn(run_t *run)
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
        rc = agent_handle_assistant(run, i - 1, &reply);
        cq_llm_reply_release(&reply);
        return rc;
}
