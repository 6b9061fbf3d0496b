/* SPDX-License-Identifier: MIT */
/* checkpoint.c - how a run's history grows and reaches the observer:
 * agent_append() checkpoints each message, agent_hold() keeps a reply back to
 * go with the turn that answers it, agent_append_turn() reports a cell with its
 * messages in one call, and each failed attempt is counted where a
 * resumed job finds it. */
#include "coderq/agent/agent.h"

#include "agent_int.h"

/* One more failed cell or test run (\p from_tests: a test run). The
 * observer records the count, so a resumed job goes on from it:
 * max_retries holds over the whole job. */
void agent_count_retry(run_t *run, bool from_tests)
{
        run->tests_failed_last = from_tests;
        run->result->retries++;
        if (run->trying_memory || !run->obs || !run->obs->on_retry)
                return;
        if (run->obs->on_retry(run->obs->opaque, run->result->retries) != 0)
                agent_refuse(run);
}

/* Append \p msg (takes ownership) to the history and checkpoint it (with
 * a held reply before it, if any). */
int agent_append(run_t *run, json_t *msg)
{
        size_t index = json_array_size(run->history);

        if (run->holding)
                return agent_append_turn(run, NULL, NULL,
                                         agent_one_message(msg));
        if (!msg || json_array_append_new(run->history, msg) != 0) {
                run->oom = true;
                return -1;
        }
        if (run->refused)
                return -1;
        if (run->obs && run->obs->on_message &&
            run->obs->on_message(run->obs->opaque, index, msg) != 0) {
                agent_refuse(run);
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
 * longer than HOLD_REPLY_MS checkpoints it alone first (agent_flush_held()),
 * and so does a run that ends before the answer: a reply is lost only
 * to a worker killed within that time, as one killed during the call
 * loses it. Only with on_turn; otherwise as agent_append(). */
int agent_hold(run_t *run, json_t *msg)
{
        size_t index = json_array_size(run->history);

        if (!turns_reported(run) || run->holding)
                return agent_append(run, msg);
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
void agent_flush_held(void *opaque)
{
        run_t *run = opaque;
        json_t *msgs;

        if (!run->holding || run->refused)
                return;
        run->holding = false;
        msgs = agent_one_message(
            json_incref(json_array_get(run->history, run->held)));
        if (!msgs) {
                run->oom = true;
                return;
        }
        if (run->obs->on_turn(run->obs->opaque, NULL, NULL, run->held, msgs) !=
            0)
                agent_refuse(run);
        json_decref(msgs);
}

/* Report a cell that just ran (on_cell). */
void agent_report_cell(run_t *run,
                       const char *code,
                       const cq_cell_result_t *res)
{
        if (run->obs && run->obs->on_cell &&
            run->obs->on_cell(run->obs->opaque, code, res) != 0)
                agent_refuse(run);
}

/* Append the messages of \p msgs (takes ownership; an array) to the
 * history and checkpoint them with the cell \p code (NULL: none) that
 * came before them: one on_turn, else on_cell and an on_message each. */
int agent_append_turn(run_t *run,
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
                        agent_refuse(run);
                        goto out;
                }
        } else {
                if (code)
                        agent_report_cell(run, code, res);
                for (i = 0; !run->aborted && i < json_array_size(msgs); i++)
                        if (run->obs && run->obs->on_message &&
                            run->obs->on_message(run->obs->opaque, index + i,
                                                 json_array_get(msgs, i)) != 0)
                                agent_refuse(run);
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
json_t *agent_one_message(json_t *msg)
{
        json_t *msgs = msg ? json_array() : NULL;

        if (msgs && json_array_append_new(msgs, msg) == 0)
                return msgs;
        json_decref(msgs);
        json_decref(msg);
        return NULL;
}

json_t *agent_text_message(const char *role, const char *content)
{
        return json_pack("{s:s, s:s}", "role", role, "content", content);
}
