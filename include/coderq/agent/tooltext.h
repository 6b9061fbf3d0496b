/* SPDX-License-Identifier: MIT */
/* tooltext.h - the text the LLM receives about an executed cell (the
 * execute_code tool result), the reflection prompt after a failed cell and
 * the feedback after failed job tests. Everything is bounded and valid
 * UTF-8: each output item keeps a head and a tail around a marker saying how
 * many characters were left out, and the whole text is bounded the same way.
 * stdout, stderr, results and the error appear together, in the order the
 * code produced them. Images are never sent as base64; they are described
 * by CQ_TOOLTEXT_IMAGE_FORMAT. Pure functions, safe from any thread. */
#ifndef CODERQ_TOOLTEXT_H
#define CODERQ_TOOLTEXT_H

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"

/* How every image output appears in tool text, e.g.
 *   [image output 2: image/png, 640x480, 23.4 KB; shown to the user, you
 *   cannot see it]
 * (the size part is omitted when unknown). The execute_code tool
 * description quotes this so the model knows what the placeholder means. */
#define CQ_TOOLTEXT_IMAGE_FORMAT                                               \
        "[image output N: MIME, WIDTHxHEIGHT, SIZE; shown to the user, you "   \
        "cannot see it]"

/* What the model is told to do about images, for the tool description. */
#define CQ_TOOLTEXT_IMAGE_ADVICE                                               \
        "Images are shown to the user but not to you; they appear "            \
        "as " CQ_TOOLTEXT_IMAGE_FORMAT ". Print the numbers you need to see."

/** @brief Caps in bytes. A text that fits head + tail is kept whole; cuts
 *         never split a UTF-8 sequence. */
typedef struct cq_tooltext_opts {
        size_t item_head, item_tail;   /* each stream or result item */
        size_t error_head, error_tail; /* each traceback */
        size_t total_head, total_tail; /* the whole tool text */
        size_t code_head, code_tail;   /* code quoted in the reflection */
        size_t max_failures;           /* failed test cases listed */
} cq_tooltext_opts_t;

/** @brief Defaults: items 1500+1500, tracebacks 1000+2000, total
 *         6000+6000, code 3000+2000, 5 failures. */
void cq_tooltext_opts_init(cq_tooltext_opts_t *opts);

/**
 * @brief The tool result text for one executed cell.
 * @param res  Borrowed.
 * @param opts Borrowed; NULL for the defaults.
 * @param lenp (out, optional) Length of the returned text.
 * @returns Caller owns the returned value (free()): NUL-terminated, valid
 *          UTF-8, no NUL bytes inside (a NUL in output is shown as "\x00").
 *          NULL when out of memory.
 * @remark Status notes (timeout, died, cancelled, lost kernel state,
 *         truncated output) come last and are never cut by the total cap.
 */
char *cq_tooltext_format(const cq_cell_result_t *res,
                         const cq_tooltext_opts_t *opts,
                         size_t *lenp);

/**
 * @brief The reflection prompt sent as a user message after a failed cell:
 *        what went wrong (the error, or a timeout / dead kernel), a short
 *        checklist, the failing code and a request to call execute_code
 *        again.
 * @param res  Borrowed; a result whose status is not CQ_CELL_OK.
 * @param code Borrowed; the code of that cell.
 * @returns Caller owns the returned value (free()); NULL when out of memory.
 */
char *cq_tooltext_reflection(const cq_cell_result_t *res,
                             const char *code,
                             const cq_tooltext_opts_t *opts,
                             size_t *lenp);

/** @brief One failed test. Strings are borrowed; any may be NULL. */
typedef struct cq_test_failure {
        size_t index;         /* 1-based case number; 0 for "code" tests */
        const char *call;     /* the call as Python source: "f(1, 2)" */
        const char *expected; /* repr of the expected value */
        const char *got;      /* repr of the returned value */
        const char *error;    /* "Name: value" and traceback, when it raised */
} cq_test_failure_t;

/**
 * @brief The message sent to the model when its final answer fails the
 *        job's tests.
 * @param function The function under test (kind "cases"), or NULL.
 * @param failures Borrowed array of \p nfailures entries; at most
 *        opts->max_failures are listed, the rest are counted.
 * @returns Caller owns the returned value (free()); NULL when out of memory.
 */
char *cq_tooltext_test_feedback(const char *function,
                                size_t passed,
                                size_t total,
                                const cq_test_failure_t *failures,
                                size_t nfailures,
                                const cq_tooltext_opts_t *opts,
                                size_t *lenp);

#endif
