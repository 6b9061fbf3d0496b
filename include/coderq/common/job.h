/* SPDX-License-Identifier: MIT */
/* job.h - the job message (topic coderq.jobs, JSON, version 1): parsing and
 * validation of untrusted input into a typed job. Used by the intake (bad
 * messages go to the DLQ with the error text), by `coderq run` and
 * `coderq submit`, and by storage (which keeps the whole spec as jsonb). */
#ifndef CODERQ_JOB_H
#define CODERQ_JOB_H

#include <jansson.h>

#include "coderq/common/common.h"

#define CQ_JOB_ID_MAX      128
#define CQ_JOB_VERSION     1
#define CQ_JOB_DEFAULT_MAX ((size_t)16 << 20) /* whole message, bytes */

/** @brief A file for the work dir: inline bytes or a URL to fetch. */
typedef struct cq_job_file {
        char *name;          /* safe relative path (cq_relpath_is_safe) */
        unsigned char *data; /* decoded content_b64, or NULL for a URL */
        size_t len;
        char *url; /* http(s) URL, or NULL */
} cq_job_file_t;

/** @brief Per-job limits; -1 means "not given: use the configured one". */
typedef struct cq_job_limits {
        long max_turns;
        long max_retries;
        long cell_timeout_s;
        long job_timeout_s;
        long test_timeout_s; /* one test run (the test cell) */
        /* Over the whole job, every attempt counted: the tokens (input
         * and output) and the cost its LLM calls may use. A call whose
         * estimate would cross one is not made: the job fails with reason
         * code "budget". -1: no limit. */
        long long max_tokens_total;
        double max_cost_usd;
} cq_job_limits_t;

/**
 * @brief Sampling parameters sent with every LLM call of a job; a flag
 *        that is false means "not sent" (the provider's default).
 */
typedef struct cq_job_sampling {
        bool has_temperature;
        double temperature; /* 0..2 */
        bool has_top_p;
        double top_p; /* 0..1 */
        bool has_seed;
        long long seed; /* openai only; the Messages API has no seed */
} cq_job_sampling_t;

/**
 * @brief Episodic memory of one job ("memory" field). Without a scope
 *        (here or the worker's CODERQ_MEMORY_SCOPE) the job neither
 *        recalls, nor is given hints, nor is remembered.
 */
typedef struct cq_job_memory {
        char *scope;      /* NULL when not given */
        bool recall;      /* recall a similar solved problem (default on) */
        bool remember;    /* remember this job's solution (default on) */
        bool cross_model; /* recall solutions of other models (default off) */
} cq_job_memory_t;

/** @brief Where a job's test code runs, and so who can bend its verdict. */
typedef enum cq_judge {
        /* A judging interpreter of its own: the code under test runs in
         * the model's interpreter, and what it returns crosses back as
         * plain data (the default). */
        CQ_JUDGE_SEPARATE = 0,
        /* The model's own interpreter ("judge": "model"), for tests that
         * must read its state: a verdict its code could have bent. */
        CQ_JUDGE_MODEL,
} cq_judge_t;

/** @brief One set of tests: the visible ones (reflection sees their
 *         failures) or the hidden ones (the score, never shown). */
typedef struct cq_job_tests {
        json_t *spec; /* the "cases" or "code" object, without the keys
                         "hidden", "reference" and "case_timeout_s";
                         NULL when the job has no such set; owned */
        bool fresh;   /* "isolation": "fresh" (a new interpreter) */
        cq_judge_t judge;
        bool mutates; /* code: arguments changed in place are copied back
                         into the test's objects after each call */
} cq_job_tests_t;

/** @brief A validated job. Strings are owned; optional ones may be NULL. */
typedef struct cq_job {
        char *job_id;
        char *prompt;
        char *title;
        char *task_id;
        char *run_id;
        char *parent_job_id;
        char *backend; /* "local" or "e2b"; NULL when not given */
        char *model;
        char *provider; /* "openai" or "anthropic"; NULL when not given */
        char *system_prompt;
        cq_job_file_t *files;
        size_t nfiles;
        json_t *tests;    /* visible.spec (a reference of its own), or NULL */
        bool tests_fresh; /* visible.fresh */
        cq_job_tests_t visible; /* tests (kind "cases" or "code") */
        cq_job_tests_t hidden;  /* tests.hidden: judged once, on the final
                                   answer; never shown to the model */
        double case_timeout_s;  /* tests.case_timeout_s; 0: not given */
        char *reference;        /* tests.reference: a reference solution
                                   timed to set case limits; NULL */
        char *solution;    /* code judged as the answer, with no LLM; NULL */
        long samples;      /* samples to fan out into; 0: not given */
        char *problem_id;  /* a sample's problem; NULL when not a sample */
        long sample_index; /* 0.. for a sample; -1 when not one */
        char *queue;       /* the queue it waits in; never NULL once parsed */
        json_t *metadata;  /* the producer's own object, echoed; or NULL */
        cq_job_memory_t memory;
        cq_job_limits_t limits;
        cq_job_sampling_t sampling;
        char *retry_of;   /* the original job this one tries again; NULL */
        long run_attempt; /* 1 for an original, 2.. for its retries */
        long priority;    /* 0 when not given */
        json_t *spec;     /* the whole message as parsed; owned */
} cq_job_t;

void cq_job_init(cq_job_t *job);
void cq_job_release(cq_job_t *job);

/**
 * @brief Parse and validate one job message.
 * @param max Size cap for \p data (0: CQ_JOB_DEFAULT_MAX).
 * @param job (out) Initialised by the caller; filled on CQ_OK, left
 *            released on error.
 * @returns CQ_OK; CQ_ERR_TOO_LARGE over \p max; CQ_ERR_FATAL for anything
 *          else, with a readable reason in \p errstr naming the field:
 *          field "limits.max_turns" must be a positive integer
 * @locality Any thread.
 */
CQ_NODISCARD cq_err_t cq_job_parse(const char *data,
                                   size_t len,
                                   size_t max,
                                   cq_job_t *job,
                                   char *errstr,
                                   size_t errstr_size);

/**
 * @brief The job id of attempt \p attempt (2..1000) of original job
 *        \p root: "ROOT~rN", or, when that would pass CQ_JOB_ID_MAX, the
 *        start of ROOT, '~', the first 16 hex digits of ROOT's SHA-256 and
 *        "~rN" (so the id stays unique and the same for the same ROOT).
 * @param out At least CQ_JOB_ID_MAX + 1 bytes.
 * @returns 0, or -1 when \p attempt is out of range or \p size too small.
 * @locality Any thread.
 */
CQ_NODISCARD int
cq_job_retry_id(const char *root, long attempt, char *out, size_t size);

/** @brief Whether \p s (\p len bytes) is a valid job id: 1 to
 *         CQ_JOB_ID_MAX printable ASCII bytes without spaces. */
bool cq_job_id_valid(const char *s, size_t len);

/** @brief How cq_job_from_json() reads a document. */
enum cq_job_flags {
        /* A spec coderq stored after validating it (the worker's claim):
         * top-level fields this version does not know are ignored, so a
         * job queued by a newer or older coderq still runs. */
        CQ_JOB_F_STORED = 1 << 0,
};

/** @brief As cq_job_parse() for an already parsed document (borrowed);
 *         \p flags from enum cq_job_flags. */
CQ_NODISCARD cq_err_t cq_job_from_json(const json_t *spec,
                                       unsigned flags,
                                       cq_job_t *job,
                                       char *errstr,
                                       size_t errstr_size);

/**
 * @brief The job id of sample \p index (0..999) of problem \p problem:
 *        "PROBLEM~sN", or, when that would pass CQ_JOB_ID_MAX, shortened
 *        as cq_job_retry_id() does (the same for the same problem).
 * @param out At least CQ_JOB_ID_MAX + 1 bytes.
 * @returns 0, or -1 when \p index is out of range or \p size too small.
 */
CQ_NODISCARD int
cq_job_sample_id(const char *problem, long index, char *out, size_t size);

/**
 * @brief The spec of sample \p index of the problem \p job (a parsed job
 *        with samples): its message with "samples" removed, its own job id
 *        (cq_job_sample_id()), "problem_id" and "sample_index", and, when
 *        the problem has a seed, seed + index.
 * @returns Caller owns the returned value (json_decref()); NULL when out
 *          of memory.
 */
json_t *cq_job_sample_spec(const cq_job_t *job, long index);

/** @brief The queue a job names when it names none. */
#define CQ_JOB_QUEUE_DEFAULT "default"

#endif
