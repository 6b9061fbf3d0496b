/* SPDX-License-Identifier: MIT */
/* fake_llm.h - start and stop tests/fakes/fake_llm.py (an OpenAI-compatible
 * server with scripted replies) from a test, and read what it recorded.
 * Each fake is a child process on an ephemeral loopback port; stopping it
 * kills and reaps it. The caller must have run curl_global_init(). */
#ifndef CODERQ_TEST_FAKE_LLM_H
#define CODERQ_TEST_FAKE_LLM_H

#include <jansson.h>
#include <sys/types.h>

typedef struct cq_fake_llm cq_fake_llm_t;

/**
 * @brief Start the fake with the scripts of tests/data/llm/scripts.
 * @param extra_args Borrowed; NULL-terminated extra command-line arguments
 *                   ("--latency-ms", "50", NULL), or NULL.
 * @returns Caller owns the returned value; stop with cq_fake_llm_stop().
 *          NULL when it could not start (a message went to stderr).
 */
cq_fake_llm_t *cq_fake_llm_start(const char *const *extra_args);

/** @brief Kill and reap the fake; accepts *fakep == NULL, sets it NULL. */
void cq_fake_llm_stop(cq_fake_llm_t **fakep);

/** @brief "http://127.0.0.1:PORT/v1"; borrowed, valid until stop. */
const char *cq_fake_llm_base_url(const cq_fake_llm_t *fake);

int cq_fake_llm_port(const cq_fake_llm_t *fake);

pid_t cq_fake_llm_pid(const cq_fake_llm_t *fake);

/**
 * @brief Every chat request received so far (GET /_fake/requests): an
 *        array of {seq, ts, path, authorization, body, valid, error,
 *        status, script, step, fault}.
 * @returns A new reference, or NULL on failure.
 */
json_t *cq_fake_llm_requests(cq_fake_llm_t *fake);

/**
 * @brief How often the fake answered (status 200) each step of each job,
 *        from the requests it recorded: counts[j * nsteps + s] for step s
 *        (the assistant messages in the request) of the job whose prompt
 *        holds "Job <prefix>-<j as 3 digits>:", j < njobs, s < nsteps. A
 *        count above 1 is a turn the job asked for again.
 * @param counts (out) njobs * nsteps counts.
 * @returns 0, or -1 when the requests could not be read.
 */
int cq_fake_llm_count_steps(cq_fake_llm_t *fake,
                            const char *prefix,
                            int njobs,
                            int nsteps,
                            int *counts);

/** @brief Forget recorded requests and fault counters. @returns 0 or -1. */
int cq_fake_llm_reset(cq_fake_llm_t *fake);

/**
 * @brief Register (or replace) script \p name.
 * @param script Borrowed; a list of steps or {"steps": [...], ...}.
 * @returns 0, or -1 when the fake refused it.
 */
int cq_fake_llm_add_script(cq_fake_llm_t *fake,
                           const char *name,
                           const json_t *script);

#endif
