/* SPDX-License-Identifier: MIT */
/* judge.h - a job's "code" tests judged in an interpreter that is not the
 * model's (docs/EVALUATION.md, "The judge"). The judging interpreter
 * (agent/judge.py, started by the caller in a sandbox of its own) runs
 * the test code; each name it lacks is looked up, and each function it
 * calls is called, in the model's interpreter, through the candidate
 * hooks below: arguments go over as plain data and what comes back is
 * checked here (cq_judge_value_check()) before the judge sees it. So the
 * comparisons happen where no code of the model runs, and nothing the
 * model's code does in its own interpreter can make a case pass.
 *
 * Plain values travel in a tagged JSON form: null, true, false, a JSON
 * integer (int64) or real (finite), "s..." a str, "i..." an int beyond
 * 64 bits (decimal digits), "f..." one of inf, -inf, nan, "b..." bytes
 * (base64), a JSON array a list, and {"t": T, "v": [...]} for T "tuple",
 * "set", "frozenset", "dict" ([[key, value], ...]) and "complex" ([real,
 * imag], each a real or an "f..." string). */
#ifndef CODERQ_AGENT_JUDGE_H
#define CODERQ_AGENT_JUDGE_H

#include <jansson.h>

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"

/* Bounds of one plain value (the model's harness keeps to the same). */
#define CQ_JUDGE_DEPTH_MAX  101
#define CQ_JUDGE_ITEMS_MAX  1000000
#define CQ_JUDGE_DIGITS_MAX 5000

/**
 * @brief Whether \p v is a plain value in the tagged form, within
 *        CQ_JUDGE_DEPTH_MAX levels and CQ_JUDGE_ITEMS_MAX values.
 * @param why (out, may be NULL) what is wrong, when it is not.
 * @locality Any thread.
 */
bool cq_judge_value_check(const json_t *v, char *why, size_t why_size);

/**
 * @brief A short Python repr of a tagged value for reports and feedback,
 *        at most \p max bytes (cut with "..."); "?" for a value that does
 *        not pass cq_judge_value_check().
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory.
 */
char *cq_judge_value_repr(const json_t *v, size_t max);

/** @brief The code under test, as the judge reaches it (the model's
 *         interpreter, through the agent). */
typedef struct cq_judge_candidate {
        /* Call the function of the request ({"name", "args", "kwargs",
         * "mutates"}) within \p limit_ms. *answerp: {"op": "return",
         * "value", "args"} | {"op": "raise", "type", "message"} |
         * {"op": "fail", "kind": "timeout"|"died"|"not_plain", "why"};
         * *elapsed_ms, how long the call took. Returns 0, or -1 when the
         * call could not be made at all for a reason of ours (out of
         * memory, the interpreter lost by no doing of the code): the run
         * then ends as an infrastructure fault. */
        int (*call)(void *opaque,
                    const json_t *request,
                    int64_t limit_ms,
                    json_t **answerp,
                    int64_t *elapsed_ms);
        /* What the name is in the model's interpreter: {"op": "function"}
         * | {"op": "value", "value"} | {"op": "missing"} | {"op": "fail",
         * ...}. Returns as call(). */
        int (*lookup)(void *opaque, const char *name, json_t **answerp);
        void *opaque;
} cq_judge_candidate_t;

/** @brief The judging interpreter's process, as its starter made it:
 *         to_fd its stdin (requests), from_fd its protocol descriptor
 *         (answers); destroy kills, reaps and cleans up, and frees it.
 *         The interpreters' helper process (interp.h), so that a
 *         backend's starter (cq_backend_judge_start()) is a
 *         cq_judge_start_fn. */
typedef cq_interp_proc_t cq_judge_proc_t;

/**
 * @brief Start a judging interpreter running \p program (agent/judge.py
 *        as cq_judge_program() gives it) with the protocol descriptor
 *        number as its first argument. Supplied by whoever runs the agent
 *        (the worker: a sandboxed process of the local backend).
 * @returns The process, or NULL with \p errstr filled.
 */
typedef cq_judge_proc_t *(cq_judge_start_fn)(void *opaque,
                                             const char *program,
                                             char *errstr,
                                             size_t errstr_size);

/**
 * @brief A judging interpreter kept for test code whose key is \p key
 *        (cq_judge_key()), ready for its next run, or NULL when none is
 *        kept. Supplied with cq_judge_start_fn (the worker:
 *        cq_backend_judge_take()). A judge is only ever kept for the
 *        test code that it ran: runs of other test code never share it.
 * @returns Caller owns the returned value, as cq_judge_start_fn's.
 */
typedef cq_judge_proc_t *(cq_judge_take_fn)(void *opaque, const char *key);

/**
 * @brief Keep \p proc, whose last run (of the test code of \p key) ended
 *        reusable (cq_judge_result_t.reusable), for a later run of the
 *        same test code.
 * @returns true when it took \p proc (it owns it now); false: the caller
 *          still owns it (and destroys it).
 */
typedef bool(cq_judge_keep_fn)(void *opaque,
                               const char *key,
                               cq_judge_proc_t *proc);

/** @brief The size of a key of test code, with its NUL. */
#define CQ_JUDGE_KEY_SIZE 66

/** @brief The key under which a judge that ran \p code (with \p mutates)
 *         is kept, into \p key: the hex SHA-256 of the code, then 'm'
 *         or '-' for the flag; "" when there is none. */
void cq_judge_key(const char *code, bool mutates, char key[CQ_JUDGE_KEY_SIZE]);

/** @brief agent/judge.py, built in. Borrowed; static. */
const char *cq_judge_program(void);

/** @brief How one judged run ended. Release with cq_judge_result_release(). */
typedef struct cq_judge_result {
        bool ok;      /* the test code ran to its end */
        int calls;    /* calls of the code under test */
        char *output; /* what the test printed (bounded), or NULL */
        /* When !ok and not a fault: {"type", "message", "traceback",
         * "origin": "test" | "candidate" | "timeout" | "died" |
         * "not_plain"}. Owned. */
        json_t *error;
        /* Each call: {"call": "f(1, 2)", "limit_ms", "time_ms", "outcome":
         * "return" | "raise" | "timeout" | "died" | "not_plain"}. Owned. */
        json_t *calls_report;
        /* Set when the judging itself failed (the judge died, broke the
         * protocol, ran past the run's time): our fault, never the
         * model's. Owned. */
        char *fault;
        bool timed_out; /* the whole run passed its deadline */
        /* The run ended with the judge's report and nothing after it: the
         * judge waits for another run, and may be kept for one of the same
         * test code (cq_judge_keep_fn). */
        bool reusable;
} cq_judge_result_t;

void cq_judge_result_init(cq_judge_result_t *jr);
void cq_judge_result_release(cq_judge_result_t *jr);

/** @brief The limits of one judged run. */
typedef struct cq_judge_limits {
        int64_t deadline_ms; /* cq_now_ms() by which the run must end */
        int64_t call_ms;     /* a call's limit when \p call_ms_of is NULL */
        const int64_t *call_ms_of; /* per call, in order (calibrated from a
                                      reference); past its end, call_ms */
        size_t ncall_ms;
        size_t line_max; /* bytes of one protocol line */
} cq_judge_limits_t;

/**
 * @brief Run \p code (the test code, borrowed) in the judging interpreter
 *        \p proc, answering its lookups and calls through \p cand.
 * @returns 0 with \p jr filled (a failed test is jr->ok false; a fault of
 *          ours is jr->fault), -1 when out of memory.
 * @locality The thread that owns \p proc and the candidate's interpreter.
 */
CQ_NODISCARD int cq_judge_run(cq_judge_proc_t *proc,
                              const char *code,
                              bool mutates,
                              const cq_judge_candidate_t *cand,
                              const cq_judge_limits_t *limits,
                              cq_judge_result_t *jr);

#endif
