/* SPDX-License-Identifier: MIT */
/* jobfile.h - the jobs of a `coderq submit` FILE, which holds JSON Lines
 * (a job per line), a JSON array of jobs, or one job as a JSON object
 * over several lines: which of the three it is, and its job messages with
 * the line each starts on. Pure parsing, no I/O, so every case has a
 * golden test (tests/data/jobfile/); validating a job is cq_job_parse()'s
 * part, not this one's. */
#ifndef CODERQ_CLI_JOBFILE_H
#define CODERQ_CLI_JOBFILE_H

#include <stddef.h>

#include "coderq/common/common.h"

typedef enum cq_jobfile_form {
        CQ_JOBFILE_LINES = 0, /* JSON Lines: a job per non-blank line */
        CQ_JOBFILE_ARRAY,     /* a JSON array: a job per item */
        CQ_JOBFILE_OBJECT,    /* one job, a JSON object over several lines */
} cq_jobfile_form_t;

/** @brief One job message of a file; read-only. */
typedef struct cq_jobfile_job {
        char *text; /* NUL-terminated. JSON Lines: the line as written,
                       without its line end; else the item's or the
                       object's JSON text without the whitespace between
                       its tokens (strings and numbers as written), so
                       every message is one line */
        size_t len; /* bytes of text */
        long line;  /* the line it starts on, from 1 */
} cq_jobfile_job_t;

/** @brief The jobs of a file, cq_jobfile_init() to cq_jobfile_release(). */
typedef struct cq_jobfile {
        cq_jobfile_form_t form; /* read-only */
        cq_jobfile_job_t *jobs; /* read-only; n of them, in file order */
        size_t n;               /* read-only */
        size_t alloc;           /* private */
} cq_jobfile_t;

void cq_jobfile_init(cq_jobfile_t *jf);

/** @brief Free the jobs and their texts, not the struct; jf is left as
 *         cq_jobfile_init() leaves it. */
void cq_jobfile_release(cq_jobfile_t *jf);

/**
 * @brief Tell which form \p data is and cut it into job messages. A UTF-8
 *        byte order mark at the start is not part of any job. The whole
 *        text as one JSON array is an array; as one JSON object, one
 *        object when it spans several lines, else JSON Lines of one line.
 *        A text that is not one JSON value is JSON Lines when its first
 *        non-blank line is a JSON object on its own, or any line starting
 *        with '{' is (the others are then invalid lines, as JSON Lines
 *        have); else it is none of the three. Blank text is JSON Lines
 *        with no job.
 * @param data Borrowed; \p len bytes, NUL bytes included.
 * @param jf (out) Initialised by the caller; filled on CQ_OK, released
 *        on error. Taking a job's text (and setting it to NULL) is
 *        allowed; cq_jobfile_release() frees what is left.
 * @returns CQ_OK; CQ_ERR_FATAL when \p data is none of the three, \p errstr
 *          then "line L column C: why" (where the text stops being one
 *          JSON value, as jansson counts); CQ_ERR_TOO_LARGE when out of
 *          memory.
 * @locality Any thread.
 */
CQ_NODISCARD cq_err_t cq_jobfile_parse(const char *data,
                                       size_t len,
                                       cq_jobfile_t *jf,
                                       char *errstr,
                                       size_t errstr_size);

#endif
