/* SPDX-License-Identifier: MIT */
/* backend.h - where a job's code runs, chosen per job: the local kernel
 * pool (sandboxed when bubblewrap works) or E2B. Built once per process
 * from the configuration; the commands (run, exec, worker) take their
 * interpreters from here. */
#ifndef CODERQ_BACKEND_H
#define CODERQ_BACKEND_H

#include "coderq/common.h"
#include "coderq/config.h"
#include "coderq/interp.h"
#include "coderq/kpool.h"

typedef struct cq_backend cq_backend_t;

/**
 * @brief Set up the sandbox and a pool of \p pool_size ready kernels.
 * @param cfg Borrowed; must outlive the backend.
 * @returns Caller owns the returned value; free with cq_backend_destroy().
 *          NULL with \p errstr filled (CODERQ_SANDBOX=on without a working
 *          bubblewrap, out of memory).
 * @locality Any thread; the handle is then thread-safe.
 */
cq_backend_t *cq_backend_new(const cq_config_t *cfg,
                             size_t pool_size,
                             char *errstr,
                             size_t errstr_size);

/**
 * @brief A fresh interpreter for one job.
 * @param which "local", "e2b", or NULL for CODERQ_BACKEND.
 * @returns Caller owns the returned value (cq_interp_destroy() after the
 *          job); NULL with \p errstr filled.
 * @locality Any thread; the interpreter then belongs to that thread.
 */
cq_interp_t *cq_backend_acquire(cq_backend_t *backend,
                                const char *which,
                                int64_t timeout_ms,
                                char *errstr,
                                size_t errstr_size);

/**
 * @brief cq_backend_acquire() for a job: an E2B sandbox is tagged with
 *        \p job_id and \p attempt (borrowed) and, once
 *        cq_backend_track_e2b() ran, kept alive by housekeeping.
 * @locality Any thread; the interpreter then belongs to that thread.
 */
cq_interp_t *cq_backend_acquire_job(cq_backend_t *backend,
                                    const char *which,
                                    int64_t timeout_ms,
                                    const char *job_id,
                                    int attempt,
                                    char *errstr,
                                    size_t errstr_size);

/**
 * @brief Track this worker's E2B sandboxes (when E2B_API_KEY is set):
 *        tag them with \p worker_id (copied) so that
 *        cq_backend_housekeep() extends them and kills strays.
 * @returns 0, or -1 with \p errstr filled.
 * @locality Before any interpreter is acquired.
 */
int cq_backend_track_e2b(cq_backend_t *backend,
                         const char *worker_id,
                         char *errstr,
                         size_t errstr_size);

/**
 * @brief Extend every running E2B sandbox once a third of its TTL has
 *        passed and, each minute, kill this worker's stray sandboxes.
 *        Call it every few seconds. No-op without tracking.
 * @locality One housekeeping thread.
 */
void cq_backend_housekeep(cq_backend_t *backend);

/** @brief One line on how kernels are confined, for logs. Borrowed. */
const char *cq_backend_describe(const cq_backend_t *backend);

/** @brief The local kernel pool, or NULL (E2B only, or no pool).
 *         Borrowed; lives as long as the backend. */
cq_kpool_t *cq_backend_kpool(cq_backend_t *backend);

/** @brief Stop the pool; interpreters must be destroyed first. */
void cq_backend_destroy(cq_backend_t **backendp);

#endif
