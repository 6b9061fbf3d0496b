/* SPDX-License-Identifier: MIT */
/* kpool.h - a pool of pre-started kernels, handed out as local
 * interpreters (interp_local.h). Each pooled kernel is handed out once and
 * destroyed with its work dir after the job, so no state leaks between
 * jobs; its teardown runs on the pool's reaper thread. */
#ifndef CODERQ_KPOOL_H
#define CODERQ_KPOOL_H

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/common/gate.h"
#include "coderq/interp/interp.h"
#include "coderq/local/interp_local.h"
#include "coderq/local/kernel.h"

/* Imports run silently in pooled kernels before they are handed out, so
 * the first plot of a job does not pay for them. */
#define CQ_KPOOL_PRELOAD                                                       \
        "def _cq_preload():\n"                                                 \
        "    import importlib\n"                                               \
        "    for m in ('numpy', 'pandas', 'matplotlib.pyplot'):\n"             \
        "        try:\n"                                                       \
        "            importlib.import_module(m)\n"                             \
        "        except Exception:\n"                                          \
        "            pass\n"                                                   \
        "_cq_preload()\n"                                                      \
        "del _cq_preload\n"

/**
 * @brief Thread-safe pool of ready kernels.
 * @locks pool->lock (a pthread mutex) guards the ready list, the number
 *        of kernels starting, the stop flag and the last error.
 */
typedef struct cq_kpool cq_kpool_t;

typedef struct cq_kpool_opts {
        size_t size;   /* kernels kept ready (and starting) */
        size_t starts; /* refill threads: kernels starting at once (0: 1) */
        /* 1..19: niceness of kernels while they start and wait in the
         * pool, back to local.kernel.nice when acquired, so speculative
         * starts yield the CPU to running jobs; 0, or when niceness
         * cannot be lowered again here (no CAP_SYS_NICE or RLIMIT_NICE),
         * kernels start at local.kernel.nice. */
        int start_nice;
        /* Cells of the pool's kernels that start at once, first come
         * first served (see gate.h); each counts for its first
         * CQ_KPOOL_GATE_HOLD_MS only. 0: no gate. */
        unsigned cell_gate;
        cq_local_opts_t local; /* kernel.work_dir is ignored */
        /* The kernel server the pool's kernels are forked from, started
         * by cq_kpool_new() and stopped by destroy (mode off, as when
         * zeroed: none, every kernel starts cold); its sandbox, python
         * and work root are the local ones. */
        cq_kserver_opts_t kserver;
} cq_kpool_opts_t;

/** How long a cell counts against the pool's cell gate: longer cells are
 *  long work, which sharing the CPUs suits. */
#define CQ_KPOOL_GATE_HOLD_MS 50

/** @brief Counters of a pool. */
typedef struct cq_kpool_stats {
        size_t ready;         /* kernels ready now */
        size_t starting;      /* kernels starting now */
        size_t peak_starting; /* most kernels ever starting at once */
        uint64_t started;     /* kernels that became ready */
        uint64_t failed;      /* starts that failed */
        int start_nice;       /* niceness of starts in effect */
        uint64_t own_starts;  /* kernels acquire started itself */
        uint64_t forked;      /* of started and own_starts, the kernels
                                 the kernel server forked */
        size_t discarding;    /* used kernels waiting for the reaper */
        uint64_t discarded;   /* used kernels the reaper tore down */
        cq_gate_stats_t gate; /* the cell gate's; all 0 without one */
} cq_kpool_stats_t;

/** @brief Fill \p opts from \p cfg (CODERQ_KPOOL_SIZE,
 *         CODERQ_KPOOL_STARTS, CODERQ_CELL_GATE, CODERQ_KERNEL_SERVER,
 *         CODERQ_KERNEL_PRELOAD and the local kernel settings); \p sandbox
 *         is borrowed. */
void cq_kpool_opts_from_config(cq_kpool_opts_t *opts,
                               const cq_config_t *cfg,
                               const cq_sandbox_t *sandbox);

/**
 * @brief Start the pool and its refill threads (opts->starts of them),
 *        which start kernels until \p size are ready or starting. A
 *        kernel start is CPU-bound (Python imports): more threads than
 *        cores only slow each start down.
 * @param opts Borrowed; strings copied. opts->local.kernel.preload NULL
 *        means importing opts->kserver.preload's modules (the server's
 *        imports, so a cold kernel gets the same), or CQ_KPOOL_PRELOAD
 *        when that is NULL too; an invalid module name fails.
 * @returns Caller owns the returned value; free with cq_kpool_destroy().
 * @locality Any thread.
 */
cq_kpool_t *
cq_kpool_new(const cq_kpool_opts_t *opts, char *errstr, size_t errstr_size);

/**
 * @brief Take a ready kernel, waiting up to \p timeout_ms for one when
 *        none is ready (0: do not wait). The refill threads then start a
 *        replacement. When starts are niced and none is ready after 1.5 s
 *        (or at once for a pool of size 0), the caller starts a kernel
 *        of its own at the job's priority instead (which may take up to
 *        the kernel startup timeout), so a job never waits on a start
 *        that a busy machine starves.
 * @returns Caller owns the returned interpreter (destroying it kills the
 *          kernel at once; the pool's reaper thread, at niceness 19, reaps
 *          it and removes its work dir, and cq_kpool_destroy() waits for
 *          it); NULL on timeout or when the pool is stopping, with
 *          \p errstr filled.
 * @locality Any thread. The kernel moves to the calling thread under the
 *           pool's mutex. Kernels are tied to the life of the refill
 *           thread that started them (PR_SET_PDEATHSIG): destroy
 *           interpreters before the pool.
 */
cq_interp_t *cq_kpool_acquire(cq_kpool_t *pool,
                              int64_t timeout_ms,
                              char *errstr,
                              size_t errstr_size);

/**
 * @brief The hooks the pool gives the interpreters of its kernels
 *        (interp_local.h): its reaper thread as their teardown's defer,
 *        and its cell gate; for other interpreters of the pool's worker
 *        (runners, judges) whose teardown is to leave the caller's path
 *        too.
 * @param hooks (out) Valid until cq_kpool_destroy(), which waits for
 *        every teardown handed to the reaper.
 * @locality Any thread.
 */
void cq_kpool_hooks(cq_kpool_t *pool, cq_local_hooks_t *hooks);

/** @brief The pool's kernel server; NULL when it has none. Borrowed,
 *         valid until cq_kpool_destroy(). @locality Any thread. */
cq_kserver_t *cq_kpool_kserver(cq_kpool_t *pool);

/**
 * @brief The pool's owner takes no more jobs (a worker draining): the
 *        refill threads start no more kernels, the ready ones are killed
 *        now (they die while the jobs drain, not when the pool is
 *        destroyed) and a start under way is killed when it ends.
 *        cq_kpool_acquire() still works, starting the caller's own kernel
 *        without waiting.
 * @locality Any thread; not while cq_kpool_destroy() runs.
 */
void cq_kpool_drain(cq_kpool_t *pool);

/** @brief Kernels ready now. @locality Any thread. */
size_t cq_kpool_ready(cq_kpool_t *pool);

/** @brief The pool's counters. @locality Any thread. */
void cq_kpool_stats(cq_kpool_t *pool, cq_kpool_stats_t *stats);

/**
 * @brief Stop the refill threads, let the reaper finish tearing down the
 *        used kernels handed to it, and destroy every kernel the pool
 *        holds. Interpreters from the pool must be destroyed first.
 *        Accepts *poolp == NULL and sets it to NULL.
 */
void cq_kpool_destroy(cq_kpool_t **poolp);

#endif
