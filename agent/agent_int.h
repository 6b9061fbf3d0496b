/* SPDX-License-Identifier: MIT */
/* agent_int.h - what the files of the reflection loop share: the state of
 * one run and the functions one calls in another. agent.c runs the turns;
 * checkpoint.c, opening.c, resume.c, answer_tests.c, judging.c,
 * budget.c, images.c and memory.c hold one concern each. Not a public header.
 */
#ifndef CODERQ_AGENT_INT_H
#define CODERQ_AGENT_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coderq/agent/agent.h"
#include "coderq/agent/judge.h"
#include "coderq/agent/testrun.h"
#include "coderq/agent/tooltext.h"

#define SOLUTION_MAX ((size_t)64 << 20) /* fresh tests need it all */

/* An image file seen in the work dir after a cell (images.c). */
typedef struct seen_file {
        char *name;
        size_t len;          /* its size when last seen */
        long cell;           /* the job's cell after which it appeared or last
                                changed size; 0: not known (a replayed cell) */
        char parent_sha[65]; /* the digest of a session parent's file as
                                its replayed cells left it; "" for the
                                job's own */
} seen_file_t;

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
        long cells_done;   /* the job's cells stored before this run */
        seen_file_t *seen; /* image files seen after the cells so far */
        size_t nseen;
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
         * the turn that answers it (agent_hold()). */
        bool holding;
        size_t held;
        /* An observer refused a checkpoint (failed write, lost lease): no
         * other is written, or the stored conversation would have a gap. A
         * stop (opts->stop) aborts without it: what ran is still kept. */
        bool refused;
        /* The visible tests: job->visible, or a job built by hand with
         * only job->tests (and job->tests_fresh) set. */
        cq_job_tests_t visible;
        /* Judging: whether a final answer was tested, the verdict of the
         * last visible test run, the judge that ran it, and of the
         * solution's own cell (a job with a solution). */
        bool answered;
        const char *test_verdict;
        const char *test_judge;
        const char *solution_verdict;
        const char *hidden_verdict;
        const char *hidden_judge;
        /* The reference solution's time per case or call (calibration),
         * once measured. */
        bool calibrated;
        int64_t *ref_ms;
        size_t nref_ms;
        /* stuck: the last failed cell's code and error, and the last
         * failed tests' feedback with no cell since */
        char fail_sig[65];
        bool stuck; /* it failed "stuck": the turn in hand ends the run */
        char tests_sig[65];
        long cells_since_tests;
} run_t;

/* agent.c */

/* Replace *\p dst by a new formatted string (NULL when out of memory). */
void agent_set_str(char **dst, const char *fmt, ...) CQ_PRINTF(2, 3);
/* The observer refused a checkpoint: the run aborts and writes no other. */
void agent_refuse(run_t *run);
/* Whether the job's cancel flag rose. */
bool agent_cancelled(const run_t *run);
/* Send the event \p type with \p data (takes ownership; NULL: none). */
void agent_event(run_t *run, const char *type, json_t *data);
/* Milliseconds left of the job's time; <= 0 once it is up. */
int64_t agent_remaining_ms(const run_t *run);
/* A cell that succeeded becomes part of the job's solution. */
void agent_add_solution_cell(run_t *run, const char *code);
/* Run one cell and record it everywhere; with \p deferred the caller
 * reports it (agent_append_turn(), with the tool message that answers it).
 * CQ_OK, or the interpreter's error (cq_interp_errmsg()). A cell a drain
 * interrupted (cancelled while opts->stop is raised) is recorded nowhere
 * and aborts the run: CQ_OK with run->aborted set. */
cq_err_t agent_run_cell(run_t *run,
                        const char *code,
                        cq_cell_result_t *res,
                        bool deferred);
/* "NameError: name 'x' is not defined" for a failed cell, into *\p dst. */
void agent_cell_error_summary(const cq_cell_result_t *res, char **dst);
/* End the run with \p status; \p code is the kind of reason
 * (docs/OPERATIONS.md#reason-codes), a static string. */
void agent_fail(run_t *run,
                cq_agent_status_t status,
                const char *code,
                const char *fmt,
                ...) CQ_PRINTF(4, 5);
/* Whether the run must stop now; sets the result when it must. */
bool agent_must_stop(run_t *run);
/* Handle the assistant message at \p index: answer its open calls, or
 * treat it as the final answer. Returns 1 when the job is done (result
 * set), 0 to go on with the next LLM call, -1 to stop. */
int agent_handle_assistant(run_t *run,
                           size_t index,
                           const cq_llm_reply_t *reply);

/* checkpoint.c */

/* One more failed cell or test run (\p from_tests: a test run), recorded
 * by the observer so that max_retries holds over the whole job. */
void agent_count_retry(run_t *run, bool from_tests);
/* Append \p msg (takes ownership) to the history and checkpoint it (with
 * a held reply before it, if any). 0, or -1 when the run must stop. */
int agent_append(run_t *run, json_t *msg);
/* As agent_append(), but a reply with calls waits for the turn that answers
 * it to be checkpointed with it. */
int agent_hold(run_t *run, json_t *msg);
/* Checkpoint the held reply alone, if any. Also a cq_exec_opts_t on_slow
 * callback (\p opaque: the run). */
void agent_flush_held(void *opaque);
/* Report a cell that just ran (on_cell). */
void agent_report_cell(run_t *run,
                       const char *code,
                       const cq_cell_result_t *res);
/* Append the messages of \p msgs (takes ownership; an array) to the
 * history and checkpoint them with the cell \p code (NULL: none) that
 * came before them. 0, or -1 when the run must stop. */
int agent_append_turn(run_t *run,
                      const char *code,
                      const cq_cell_result_t *res,
                      json_t *msgs);
/* A new array of \p msg (taken; NULL gives NULL). */
json_t *agent_one_message(json_t *msg);
/* A new message {"role", "content"}; NULL when out of memory. */
json_t *agent_text_message(const char *role, const char *content);

/* opening.c */

/* Write the job's input files into \p interp's work dir, fetching those
 * the job gives by URL. 0, or -1 when the run must stop (result set). */
int agent_put_input_files(run_t *run, cq_interp_t *interp);
/* Start a new conversation, or continue a saved one. Returns 0, or -1
 * when the run must stop. \p hint is filled from \p mem. */
int agent_begin(run_t *run,
                const cq_agent_start_t *start,
                const cq_agent_memory_t *mem,
                cq_agent_recall_t *hint);

/* resume.c */

/* Take up the saved conversation of \p start: its messages, checkpointed
 * again for a session (so that it resumes on its own), then its cells
 * replayed; for a resumed job, the turns and retries it had used. 0, or
 * -1 when the run must stop. */
int agent_take_up(run_t *run, const cq_agent_start_t *start);
/* If the history ends inside a turn, finish it. Returns as
 * agent_handle_assistant(), 0 when there is none. */
int agent_finish_open_turn(run_t *run);

/* answer_tests.c */

/* The job's tests, after a final answer. Returns 1 when they passed, 0 when
 * they failed (feedback appended), -1 when the run must stop. */
int agent_run_tests(run_t *run);

/* The hidden tests, once, on the answer the run ended with. 0, or -1
 * when out of memory. */
int agent_run_hidden_tests(run_t *run);

/* judging.c */

/* The verdict of a harness test run (\p res: its cell, or NULL). */
const char *agent_harness_verdict(const cq_testrun_t *tr,
                                  const cq_cell_result_t *res);
/* Whether the job's cases have limits of their own (case_timeout_s or a
 * reference), so each runs in a cell of its own. */
bool agent_case_limits(const run_t *run);
/* Case (or call) \p i's limit within a test run of \p run_ms. */
int64_t agent_case_limit_ms(const run_t *run, size_t i, int64_t run_ms);
/* Time the reference solution on \p set once (run->ref_ms). 0; 1 when
 * the run must stop (result set); -1 when out of memory. */
int agent_calibrate(run_t *run, const cq_job_tests_t *set, int64_t run_ms);
/* "code" tests \p set in the judging interpreter against the code in
 * \p interp, within \p run_ms: \p tr filled as the harness fills it,
 * *\p verdictp set, and the judge's own result in \p jrp (may be NULL).
 * 0; 1 when the run must stop (result set: the judge failed, ours); -1
 * when out of memory. */
int agent_judge_code(run_t *run,
                     const cq_job_tests_t *set,
                     cq_interp_t *interp,
                     int64_t run_ms,
                     cq_testrun_t *tr,
                     const char **verdictp,
                     cq_judge_result_t *jrp);
/* "cases" tests \p set one cell per case, each within its limit; with
 * \p timesp, each case's time (caller frees). Returns as
 * agent_judge_code(). */
int agent_cases_each(run_t *run,
                     const cq_job_tests_t *set,
                     cq_interp_t *interp,
                     int64_t run_ms,
                     cq_testrun_t *tr,
                     int64_t **timesp);

/* budget.c */

/* Tokens the tools schema adds to each request; -1 when out of memory. */
int64_t agent_tools_tokens(void);
/* Whether the next LLM call may go; when it may not, the result says why
 * (reason code "budget") or the run aborts. */
bool agent_within_budget(run_t *run);
/* Count one LLM call in the metrics: its \p outcome and duration, and on
 * success (\p call non-NULL) its tokens and \p cost (< 0: unknown). */
void agent_count_call(run_t *run,
                      const char *outcome,
                      int64_t ms,
                      const cq_usage_t *call,
                      double cost);
/* Count a call's usage and cost into the job's and report them. */
void agent_account(run_t *run,
                   const cq_llm_reply_t *reply,
                   int64_t estimate,
                   int64_t ms);

/* images.c */

/* Images the cell that just ran showed, as files named cell<N>-<K>.<ext>
 * (N the job's number of the cell). */
void agent_collect_output_images(run_t *run, const cq_cell_result_t *res);
/* Note the image files in the work dir now: those new or of another size
 * since the last look appeared after the cell that just ran, or with
 * \p replayed after cells replayed (cell not known). */
void agent_note_created_files(run_t *run, bool replayed);
/* Note the image files the replayed cells of a session's parent left,
 * with their digests: the parent's, not to be stored again. */
void agent_note_parent_files(run_t *run);
/* Image files the code saved anywhere under the work dir, each with the
 * cell after which it was seen, but for a parent's file left as it was;
 * then the images ordered by cell. */
void agent_collect_created_images(run_t *run);
/* Free the images of \p images. */
void agent_images_release(cq_agent_images_t *images);
/* Free what agent_note_created_files() noted. */
void agent_forget_files(run_t *run);

/* memory.c */

/* Look up a remembered solution of a problem like the job's in \p mem
 * (NULL: none) into \p hint; a failed lookup is logged and the run goes
 * on without. */
void agent_recall(run_t *run,
                  const cq_agent_memory_t *mem,
                  cq_agent_recall_t *hint);
/* The solution as one text with "# %%" between cells, for memory; NULL
 * when over MEMORY_CODE_MAX or empty. Caller owns the returned value. */
char *agent_solution_text(const run_t *run);
/* A remembered solution run against the tests before any LLM call.
 * Returns 1 when it passed (done), 0 otherwise, with \p triedp saying so
 * for the task message. */
int agent_try_memory(run_t *run,
                     const cq_agent_recall_t *recall,
                     char **triedp);

#endif
