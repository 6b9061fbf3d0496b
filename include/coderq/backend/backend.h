/* SPDX-License-Identifier: MIT */
/* backend.h - where a job's code runs, chosen per job: the local kernel
 * pool (sandboxed when bubblewrap works), a runner for a job judged with
 * no LLM (runner.h), or E2B; and where a job's tests are judged (a
 * judging interpreter, always local). Built once per process from the
 * configuration; the commands (run, exec, worker) take their
 * interpreters from here. */
#ifndef CODERQ_BACKEND_H
#define CODERQ_BACKEND_H

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/common/job.h"
#include "coderq/backend/judges.h"
#include "coderq/interp/interp.h"

typedef struct cq_backend cq_backend_t;

/**
 * @brief Make the process non-dumpable (cq_sandbox_protect_self()), set
 *        up the sandbox (creating the work root, then the probe) and,
 *        unless CODERQ_BACKEND is e2b (whose jobs need no local kernel),
 *        a pool of \p pool_size ready kernels. Logs the sandbox mode, at
 *        warn unless each kernel runs sandboxed as a uid of its own, and
 *        how judging interpreters run.
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
 * @brief Have every runner started from now on run \p source at its
 *        start, before any job code (cq_runner_opts_t's preload): the
 *        test harness (cq_testrun_harness()), set by the commands that
 *        judge, so that a judge's calls find it compiled.
 * @param source Borrowed; must outlive the backend (a program's static
 *        text). NULL: none.
 * @locality Any thread.
 */
void cq_backend_set_runner_preload(cq_backend_t *backend, const char *source);

/** @brief A sandbox mode no build of coderq gives: what
 *         cq_backend_weaker_sandbox() makes of a name it does not know. */
#define CQ_SANDBOX_MODE_UNKNOWN "unknown"

/**
 * @brief The less isolated of two sandbox modes, as
 *        cq_backend_sandbox_mode() names them: off, then bwrap, then
 *        bwrap+uid-per-kernel, then e2b. A name it does not know is
 *        CQ_SANDBOX_MODE_UNKNOWN, below them all; NULL is no mode (the
 *        other one is returned, or NULL when both are).
 * @returns A static string, or NULL.
 */
const char *cq_backend_weaker_sandbox(const char *a, const char *b);

/**
 * @brief A fresh interpreter for one job.
 * @param which "local", "e2b", or NULL for CODERQ_BACKEND: the job's
 *        field, which may ask for more isolation than CODERQ_BACKEND,
 *        never for less ("local" where it is e2b is CQ_ERR_FATAL).
 * @param interpp (out) Caller owns the returned value on CQ_OK
 *        (cq_interp_destroy() after the job); NULL otherwise.
 * @returns CQ_OK; CQ_ERR_FATAL when trying again cannot help (an unknown
 *          backend or a less isolated one, E2B without E2B_API_KEY, E2B
 * refusing the key with 401/403 or the request with another 4xx);
 * CQ_ERR_RETRIABLE when it may (no local kernel ready in time or one that could
 * not start, E2B unreachable or answering 429/5xx, out of memory). \p errstr
 * says why.
 * @locality Any thread; the interpreter then belongs to that thread.
 */
CQ_NODISCARD cq_err_t cq_backend_acquire(cq_backend_t *backend,
                                         const char *which,
                                         int64_t timeout_ms,
                                         cq_interp_t **interpp,
                                         char *errstr,
                                         size_t errstr_size);

/**
 * @brief cq_backend_acquire() for a job: an E2B sandbox is tagged with
 *        \p job_id and \p attempt (borrowed) and, once
 *        cq_backend_track_e2b() ran, kept alive by housekeeping.
 *        Returns as cq_backend_acquire().
 * @locality Any thread; the interpreter then belongs to that thread.
 */
CQ_NODISCARD cq_err_t cq_backend_acquire_job(cq_backend_t *backend,
                                             const char *which,
                                             int64_t timeout_ms,
                                             const char *job_id,
                                             int attempt,
                                             cq_interp_t **interpp,
                                             char *errstr,
                                             size_t errstr_size);

/**
 * @brief Whether \p job runs in a runner rather than a kernel: it runs
 *        locally (its "backend" field, else CODERQ_BACKEND), it is judged
 *        with no LLM (it has a "solution"), and it asks for nothing only
 *        a kernel gives: no input files (data work whose figures a
 *        notebook shows) and no line of its solution in IPython's own
 *        syntax (a magic or a shell escape: its first character that is
 *        not blank is '%' or '!').
 * @locality Any thread.
 */
bool cq_backend_job_runner(const cq_backend_t *backend, const cq_job_t *job);

/**
 * @brief cq_backend_acquire_job() for \p job (borrowed): its "backend"
 *        field and id; a runner (see cq_backend_job_runner()) where it
 *        needs no kernel. Returns as cq_backend_acquire(); a runner that
 *        could not start is CQ_ERR_RETRIABLE.
 * @locality Any thread; the interpreter then belongs to that thread.
 */
CQ_NODISCARD cq_err_t cq_backend_acquire_for(cq_backend_t *backend,
                                             const cq_job_t *job,
                                             int attempt,
                                             int64_t timeout_ms,
                                             cq_interp_t **interpp,
                                             char *errstr,
                                             size_t errstr_size);

/**
 * @brief Start a judging interpreter running \p program (agent/judge.h:
 *        a cq_judge_start_fn, \p backend its opaque). It runs locally
 *        whatever CODERQ_BACKEND says (it runs a job's test code, never
 *        the model's): confined as a local kernel (the sandbox, a uid of
 *        the kernels' range, the scrubbed environment, the rlimits, a
 *        fresh work dir), forked by the kernel server when there is one;
 *        where the sandbox is off, a plain process with the rlimits and
 *        the scrubbed environment. cq_backend_new() logged which.
 * @param backend A cq_backend_t.
 * @returns Caller owns the returned value (its destroy kills it, waits
 *          until its sandbox is gone and removes its work dir); NULL with
 *          \p errstr filled.
 * @locality Any thread; the process dies when that thread exits.
 */
cq_interp_proc_t *cq_backend_judge_start(void *backend,
                                         const char *program,
                                         char *errstr,
                                         size_t errstr_size);

/**
 * @brief A judge kept for the test code of \p key, or NULL (judge.h's
 *        cq_judge_take_fn, \p backend its opaque; judges.h). At most
 *        CODERQ_SLOTS judges wait, each for 30 s and 100 runs at most.
 */
cq_interp_proc_t *cq_backend_judge_take(void *backend, const char *key);

/** @brief Keep \p proc for the next run of the test code of \p key
 *         (judge.h's cq_judge_keep_fn). @returns true when kept. */
bool cq_backend_judge_keep(void *backend,
                           const char *key,
                           cq_interp_proc_t *proc);

/** @brief How many judges wait, were kept and were taken again. */
void cq_backend_judges(cq_backend_t *backend, cq_judges_stats_t *st);

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
 * @brief Start the kernel server again once the backoff after its death
 *        has passed, and take its ready message, without waiting for
 *        either (else only a kernel start would, and an idle worker's
 *        next jobs would start cold). Extend every running E2B sandbox
 *        once a third of its TTL has passed and, each minute, kill this
 *        worker's stray sandboxes (when tracking). Call it every few
 *        seconds.
 * @locality One housekeeping thread.
 */
void cq_backend_housekeep(cq_backend_t *backend);

/** @brief One line on how local kernels are confined, for logs. Borrowed. */
const char *cq_backend_describe(const cq_backend_t *backend);

/**
 * @brief Where the code of a job whose "backend" field is \p which (NULL:
 *        CODERQ_BACKEND, else local) runs, for people: local kernels as
 *        cq_backend_describe() says, or "an E2B sandbox, template T,
 *        domain D" ("API URL" instead of the domain when E2B_API_URL is
 *        set). Written to \p out, cut to \p size.
 * @locality Any thread.
 */
void cq_backend_describe_job(const cq_backend_t *backend,
                             const char *which,
                             char *out,
                             size_t size);

/**
 * @brief Where the code of \p interp runs, for a job's result: "e2b" for
 *        an E2B sandbox, else the local sandbox mode of its kernel or
 *        runner ("bwrap+uid-per-kernel", "bwrap" or "off"; see
 *        sandbox.h). \p interp may be NULL (the local mode). Static
 *        string.
 * @locality Any thread.
 */
const char *cq_backend_sandbox_mode(const cq_backend_t *backend,
                                    cq_interp_t *interp);

/**
 * @brief Whether the code of \p interp runs unconfined, as this process's
 *        user: cq_backend_sandbox_mode() is "off".
 * @locality Any thread.
 */
bool cq_backend_unsandboxed(const cq_backend_t *backend, cq_interp_t *interp);

/**
 * @brief Log what the kernel pool and its cell gate did, at info ("kernel
 *        pool"), for capacity planning: starts a job waited for
 *        (own_starts) say the pool is too small or refills too slowly;
 *        long gate waits say CODERQ_CELL_GATE is too low. No-op without a
 *        pool.
 * @locality Any thread.
 */
void cq_backend_log_pool(cq_backend_t *backend);

/** @brief The kernel pool now, for the metrics. */
typedef struct cq_backend_pool {
        size_t size;      /* kernels it keeps ready */
        size_t ready;     /* ready now */
        size_t starting;  /* starting now */
        uint64_t started; /* kernels started so far, the ones a job waited
                             for included */
        uint64_t forked;  /* of those, forked by the kernel server */
        uint64_t failed;  /* starts that failed */
        /* used kernels, runners and judges the reaper has yet to tear
         * down */
        size_t discarding;
        /* the kernel server: whether it is on (its probe passed), ready
         * to fork now, how often it was started again after it died or
         * failed, and the starts it did not serve (down, restarting or
         * refused), each of which started its kernel cold instead */
        bool server, server_up;
        uint64_t server_restarts, server_refused;
} cq_backend_pool_t;

/**
 * @brief Fill \p pool from the kernel pool.
 * @returns false, \p pool zeroed, without a pool (CODERQ_BACKEND=e2b).
 * @locality Any thread.
 */
bool cq_backend_pool(cq_backend_t *backend, cq_backend_pool_t *pool);

/**
 * @brief The worker takes no more jobs: the kernel pool starts no more
 *        kernels and kills its ready ones now, so that the worker's exit
 *        does not wait for them (cq_kpool_drain()). Interpreters can still
 *        be had. No-op without a pool.
 * @locality Any thread; not while cq_backend_destroy() runs.
 */
void cq_backend_drain(cq_backend_t *backend);

/** @brief Stop the pool; interpreters must be destroyed first. */
void cq_backend_destroy(cq_backend_t **backendp);

#endif
