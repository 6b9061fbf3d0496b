/* SPDX-License-Identifier: MIT */
/* agent.h - the reflection loop: the LLM writes Python, the interpreter runs
 * it, every error goes back to the LLM with a reflection prompt, a final
 * answer must pass the job's tests, and limits end the job as failed -
 * never as a fake success.
 *
 * The loop knows no Kafka and no PostgreSQL: everything it produces leaves
 * through the observer (checkpoints, progress events) and its result. */
#ifndef CODERQ_AGENT_H
#define CODERQ_AGENT_H

#include <jansson.h>
#include <stdatomic.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/interp/interp.h"
#include "coderq/common/job.h"
#include "coderq/agent/judge.h"
#include "coderq/agent/llm.h"
#include "coderq/common/metrics.h"
#include "coderq/agent/notebook.h"
#include "coderq/common/prices.h"

/**
 * @brief Where the loop reports as it goes. Every callback may be NULL.
 *        A non-zero return from on_message, on_cell or on_turn stops the
 *        job (the
 *        worker lost its lease, or could not checkpoint): the loop returns
 *        with status CQ_AGENT_ABORTED and does nothing more.
 */
typedef struct cq_agent_observer {
        /** @brief A message was appended to the history at \p index. */
        int (*on_message)(void *opaque, size_t index, const json_t *message);
        /** @brief A cell finished (replayed cells are not reported). */
        int (*on_cell)(void *opaque,
                       const char *code,
                       const cq_cell_result_t *res);
        /** @brief A turn's checkpoint in one piece, when set: the cell
         *         that just ran (\p code and \p res; NULL for none), then
         *         the messages of the array \p messages, appended to the
         *         history from \p index on. The loop then calls neither
         *         on_cell nor on_message for them: a tool call's cell comes
         *         with its tool message, the start's messages together.
         *         A reply with tool calls comes with the first cell that
         *         answers it (\p index is then the reply's), or alone
         *         (\p code NULL) once that cell has run 250 ms, or when
         *         the run ends before it. After a non-zero return nothing
         *         more is reported. A non-zero return stops the job, as
         *         for on_message. */
        int (*on_turn)(void *opaque,
                       const char *code,
                       const cq_cell_result_t *res,
                       size_t index,
                       const json_t *messages);
        /** @brief A progress event (docs/JOBS.md#kafka-topics):
         *         llm.reply, cell.started, cell.output, cell.finished,
         *         reflection, tests.result. \p data borrowed. */
        void (*on_event)(void *opaque, const char *type, const json_t *data);
        /** @brief A failed cell or test run was counted; \p retries is the
         *         job's count so far, earlier attempts included (what
         *         start->retries_done must be when the job resumes). A
         *         non-zero return stops the job, as for on_message. */
        int (*on_retry)(void *opaque, long retries);
        /** @brief An LLM call returned: the job's usage so far, earlier
         *         attempts included, and its cost in USD (< 0: unknown).
         *         What start->usage_done and start->cost_done_usd must be
         *         when the job resumes. A non-zero return stops the job,
         *         as for on_message. */
        int (*on_usage)(void *opaque, const cq_usage_t *total, double cost_usd);
        /**
         * @brief Before each LLM call, once the job's own limits allow it:
         *        hold \p estimate_usd (the most the call may cost; < 0
         *        when its cost is unknown) against the run's budget, if
         *        the run has one.
         * @returns 0: the call may go; 1: it would cross the run's
         *          budget (\p why says how): the job fails with reason
         *          code "budget"; -1 stops the job, as for on_message.
         */
        int (*reserve)(void *opaque,
                       double estimate_usd,
                       char *why,
                       size_t why_size);
        void *opaque;
} cq_agent_observer_t;

/** @brief A solved problem recalled from episodic memory; every string
 *         is owned (free()) and may be NULL. */
typedef struct cq_agent_recall {
        char *code;       /* the remembered code; NULL: nothing similar */
        char *source_job; /* the job that solved it */
        char *scope;      /* the memory scope it was found in */
        char *model;      /* the model that solved it */
        double similarity;
} cq_agent_recall_t;

void cq_agent_recall_release(cq_agent_recall_t *recall);

/** @brief Episodic memory: a solved problem similar to the job's prompt.
 *         The caller passes it only for a job allowed to recall (one
 *         that names a memory scope). */
typedef struct cq_agent_memory {
        /**
         * @param recall (out) Zeroed by the loop; filled when a similar
         *        problem was found (recall->code non-NULL).
         * @returns 0, or -1 on an error (the loop logs it and goes on).
         */
        int (*lookup)(void *opaque,
                      const char *prompt,
                      cq_agent_recall_t *recall);
        void *opaque;
} cq_agent_memory_t;

/**
 * @brief A new interpreter for tests.isolation "fresh", on the backend
 *        \p backend ("local", "e2b", NULL for the default).
 * @returns Caller owns the returned value (cq_interp_destroy()); NULL with
 *          \p errstr filled.
 * @locality The thread running the loop.
 */
typedef cq_interp_t *(cq_agent_new_interp_t)(void *opaque,
                                             const char *backend,
                                             char *errstr,
                                             size_t errstr_size);

/** @brief The loop's metric families (docs/OPERATIONS.md#metrics);
 *         borrowed from the registry. Every member may be NULL: not
 *         recorded. */
typedef struct cq_agent_metrics {
        cq_metric_t *llm_calls;   /* coderq_llm_calls_total{model,outcome} */
        cq_metric_t *llm_seconds; /* coderq_llm_call_duration_seconds{model} */
        cq_metric_t *tokens;      /* coderq_llm_tokens_total{model,kind} */
        cq_metric_t *cost;        /* coderq_llm_cost_usd_total{model} */
        cq_metric_t *cells;       /* coderq_cell_duration_seconds{status} */
} cq_agent_metrics_t;

/**
 * @brief Add the loop's families to \p reg and point \p am at them.
 * @returns 0, or -1 with \p errstr filled (a name already used, out of
 *          memory). With \p reg NULL, 0 and every member NULL.
 * @locality Start-up.
 */
int cq_agent_metrics_add(cq_agent_metrics_t *am,
                         cq_metrics_t *reg,
                         char *errstr,
                         size_t errstr_size);

/** @brief Settings of the loop; limits of the job override these. */
typedef struct cq_agent_opts {
        const char *system_prompt; /* NULL: the built-in English prompt */
        long max_turns;            /* LLM calls */
        long max_retries;          /* failed cells + failed test runs */
        long cell_timeout_s;
        long job_timeout_s;
        long test_timeout_s;      /* one test run; 0: cell_timeout_s */
        size_t context_tokens;    /* the model's window, estimated tokens */
        size_t tool_item_max;     /* per output item, head + tail */
        size_t tool_total_max;    /* per tool result */
        size_t file_max;          /* a created file taken as an artefact */
        const char *fetch_allow;  /* borrowed; CODERQ_FETCH_ALLOW, or NULL */
        const atomic_int *cancel; /* borrowed; raise to cancel the job: a
                                     running cell is interrupted */
        const atomic_int *stop;   /* borrowed; raise to stop at the next
                                     checkpoint (the worker is shutting
                                     down): status CQ_AGENT_ABORTED. A
                                     cell \p cancel interrupts while it
                                     is raised is not recorded (no cell,
                                     no tool message, no retry): the
                                     resumed job runs it again */
        cq_agent_new_interp_t *new_interp; /* tests.isolation "fresh";
                                              NULL: such tests fail */
        void *new_interp_opaque;
        const cq_prices_t *prices; /* borrowed; NULL: every cost unknown */
        const cq_agent_metrics_t *metrics; /* borrowed; NULL: none */
        /* Starts the judging interpreter of "code" tests (judge.h); NULL:
         * such tests cannot be judged apart from the model's interpreter
         * and fail as an infrastructure fault. */
        cq_judge_start_fn *judge_start;
        /* Judges kept between runs of the same test code (judge.h), both
         * with judge_opaque; NULL: every run starts a judge of its own. */
        cq_judge_take_fn *judge_take;
        cq_judge_keep_fn *judge_keep;
        void *judge_opaque;
        double case_time_factor; /* a case's limit: this many times the
                                    reference's time (CODERQ_CASE_TIME_
                                    FACTOR); at least the case's floor */
} cq_agent_opts_t;

/** @brief Defaults: 30 turns, 5 retries, 120 s cells, 1800 s jobs. */
void cq_agent_opts_init(cq_agent_opts_t *opts);

/** @brief Settings from the configuration (CODERQ_MAX_TURNS, ...);
 *         \p cfg is borrowed and must outlive \p opts. */
void cq_agent_opts_from_config(cq_agent_opts_t *opts, const cq_config_t *cfg);

/**
 * @brief Where a run starts: afresh, or from a checkpoint.
 *   - history NULL: a new conversation.
 *   - continue_job: \p history is this job's own saved conversation; its
 *     successful \p cells are replayed silently and the loop goes on from
 *     the last message (a completed turn is never repeated).
 *   - otherwise (a session: the job has a parent): \p history and \p cells
 *     are the parent's; the cells are replayed and the job's prompt is
 *     appended to the parent's conversation.
 * Limits hold over the whole job: elapsed_ms (any start) is running time
 * already spent, which job_timeout_s counts; turns_done and retries_done
 * count against max_turns and max_retries.
 */
typedef struct cq_agent_start {
        const json_t *history; /* borrowed; array of messages */
        const json_t *cells;   /* borrowed; array of code strings: every
                                  cell that ran to the end, failed ones
                                  included (they may have set state) */
        size_t parent_cells;   /* the first parent_cells of cells are a
                                  session's ancestors': the image files
                                  they make are the parent's, stored with
                                  it, and not again with this job unless
                                  its own cells change them */
        bool continue_job;
        long turns_done;       /* continue_job: already spent */
        long retries_done;     /* continue_job: already spent */
        int64_t elapsed_ms;    /* running time already spent by the job */
        long cells_done;       /* the job's cells stored by earlier attempts
                                  (replays excluded): this run's cells are
                                  numbered on from there, as they are
                                  stored */
        cq_usage_t usage_done; /* tokens of earlier attempts */
        double cost_done_usd;  /* their cost; < 0: unknown */
} cq_agent_start_t;

typedef enum cq_agent_status {
        CQ_AGENT_SUCCEEDED = 0,
        CQ_AGENT_FAILED,
        CQ_AGENT_CANCELLED,
        CQ_AGENT_ABORTED, /* the observer or opts->stop asked to stop;
                             record nothing final: the job can resume */
} cq_agent_status_t;

const char *cq_agent_status_name(cq_agent_status_t status);

/** @brief An image a run left: a figure a cell showed, or an image file
 *         its code saved under the work dir. */
typedef struct cq_agent_image {
        char *name; /* cell<N>-<K>.<ext> for a figure shown (the K-th of
                       the run, in cell N), else the file's path in the
                       work dir */
        char *mime;
        unsigned char *data;
        size_t len;
        long cell; /* the job's cell that showed the figure, or after which
                      the file appeared or last changed size; 0 when not
                      known (a file a replayed cell made, or one that
                      appeared after the last cell) */
} cq_agent_image_t;

typedef struct cq_agent_images {
        cq_agent_image_t *v; /* by cell, those of no known cell last */
        size_t n;
} cq_agent_images_t;

/** @brief What a run produced. Release with cq_agent_result_release(). */
typedef struct cq_agent_result {
        cq_agent_status_t status;
        char *reason;            /* why it failed or was cancelled, else NULL */
        const char *reason_code; /* static: the kind of reason, see
                                    docs/OPERATIONS.md#reason-codes; NULL when
                                    it succeeded */
        char *last_error;        /* the last cell or test error, or NULL */
        char *answer;            /* the final answer text, or NULL */
        long turns; /* LLM calls, including those before a resume */
        long retries;
        long cells; /* cells run (replays excluded) */
        int tests_passed;
        int tests_total;         /* -1: the job has no tests */
        json_t *tests;           /* last test report, or NULL */
        bool from_memory;        /* solved by a remembered solution, no LLM */
        char *memory_source_job; /* the job whose remembered solution
                                    finished this one (from_memory) or was
                                    given to the model as a hint; or NULL */
        char *solution; /* code of the successful cells (the job's solution,
                           see cq_agent_run()), for memory; NULL when over
                           4 MiB */
        /* Usage and cost of the whole job, earlier attempts included. */
        int64_t prompt_tokens;
        int64_t completion_tokens;
        int64_t cache_read_tokens;     /* of prompt_tokens, read from a
                                          provider's prompt cache */
        int64_t cache_creation_tokens; /* of prompt_tokens, written to it */
        double cost_usd; /* < 0: unknown (a model without a price, or a
                            reply without usage) */
        /* What the run used (docs/EVALUATION.md#reproducibility):
         * {"temperature", "top_p", "seed", "max_tokens" (null: not sent),
         * "model", "provider", "system_prompt_sha256", "coderq_version",
         * "backend", "python", "packages"}; owned, may be NULL. */
        json_t *repro;
        json_t *history;          /* the conversation; owned */
        cq_agent_images_t images; /* images shown or saved by the code;
                                     the same bytes under each of their
                                     names */
        int64_t duration_ms;
        /* The evaluation's outcome (docs/EVALUATION.md#verdicts), static;
         * NULL when it was cancelled or stopped. */
        const char *verdict;
        const char *judge; /* "separate", "model", or NULL: no tests ran */
        int hidden_passed; /* the hidden tests' counts; hidden_total 0 */
        int hidden_total;  /* when the job has none, or they did not run */
        json_t *hidden;    /* their report, or NULL; owned */
        /* It failed by a fault another try may mend (the LLM unavailable,
         * an interpreter or the judge lost, our own): the caller may run
         * it again from its checkpoint. */
        bool transient;
} cq_agent_result_t;

void cq_agent_result_init(cq_agent_result_t *result);
void cq_agent_result_release(cq_agent_result_t *result);

/**
 * @brief Run \p job to the end.
 * @param interp Borrowed; a fresh interpreter for this job.
 * @param llm    Borrowed; its model is set to the job's override for the
 *               run and its cancel flag to opts->cancel; its usage total is
 *               reset at the start.
 * @param nb     Borrowed; cells are appended to it (may be NULL).
 * @param start  NULL for a new job, else where to continue from.
 * @param mem    NULL for no memory.
 *
 * The job's solution is the code of its cells that succeeded, in the order
 * they ran: cells replayed from a parent session or a checkpoint count
 * when their replay succeeded. Tests with isolation "fresh" run on it
 * alone: a new interpreter gets the job's input files, runs those cells one
 * by one, then the tests; the job's own kernel is left as it was.
 * @returns CQ_OK with \p result filled (whatever the job's outcome);
 *          CQ_ERR_FATAL only when out of memory or the interpreter is
 *          unusable before anything ran.
 * @locality The thread that owns \p interp.
 */
CQ_NODISCARD cq_err_t cq_agent_run(const cq_job_t *job,
                                   cq_interp_t *interp,
                                   cq_llm_t *llm,
                                   const cq_agent_opts_t *opts,
                                   const cq_agent_observer_t *obs,
                                   const cq_agent_memory_t *mem,
                                   const cq_agent_start_t *start,
                                   cq_nb_t *nb,
                                   cq_agent_result_t *result);

/** @brief The built-in system prompt (English). */
const char *cq_agent_default_system_prompt(void);

#endif
