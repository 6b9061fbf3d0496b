/* SPDX-License-Identifier: MIT */
/* kernel.h - one local ipykernel driven over ZeroMQ: launch (optionally in
 * the sandbox), wait until ready, run cells with a deadline, interrupt,
 * recover from a hung or dead kernel by starting a fresh one, shut down.
 * The kernel's own files (connection file, ipc sockets, log, caches) live
 * in CQ_KERNEL_RUN_DIR inside the work dir and are removed on destroy. */
#ifndef CODERQ_KERNEL_H
#define CODERQ_KERNEL_H

#include <jansson.h>
#include <sys/types.h>

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"
#include "coderq/local/jmsg.h"
#include "coderq/local/kernel_env.h"
#include "coderq/local/kserver.h"
#include "coderq/local/sandbox.h"

/* Name of the kernel's private directory inside its work dir. */
#define CQ_KERNEL_RUN_DIR ".coderq"

typedef struct cq_kernel cq_kernel_t;

typedef struct cq_kernel_opts {
        const char *python;   /* NULL: /usr/bin/python3 */
        const char *work_dir; /* required: existing dir, the kernel's cwd */
        int64_t startup_timeout_ms; /* <= 0: 60 s */
        size_t output_max;          /* per-cell output cap; 0: 1 MiB */
        size_t msg_max;             /* ZMQ_MAXMSGSIZE per frame; 0: 64 MiB */
        int64_t interrupt_grace_ms; /* <= 0: 2.5 s */
        int64_t idle_wait_ms;       /* after the reply; <= 0: 4 s */
        /* Python run silently once the kernel is ready (not in history,
         * no outputs, no execution count), e.g. imports to warm up; or
         * NULL. Its failure is logged, not fatal. */
        const char *preload;
        const cq_sandbox_t *sandbox; /* borrowed; NULL: no sandbox/rlimits */
        int nice; /* 1..19: start with this niceness; 0: inherit */
        /* borrowed: fork kernels from this server, starting cold when it
         * gives none; NULL: always cold */
        cq_kserver_t *kserver;
} cq_kernel_opts_t;

/**
 * @brief Launch a kernel and wait until it is ready (kernel_info reply and
 *        an iopub message seen). With a sandbox that switches uids, the
 *        kernel first leases its uid (cq_sandbox_id_acquire()) and gives
 *        it the work dir; destroy releases the uid once the kernel's
 *        processes are gone.
 * @param opts Borrowed; strings are copied.
 * @returns Caller owns the returned value; free with cq_kernel_destroy().
 *          NULL on failure with \p errstr filled (no process left behind).
 * @locality Any thread; the kernel (its sockets) then belongs to that
 *           thread, or moves whole under a lock (see kpool.h). The kernel
 *           is killed when the thread that created it exits
 *           (PR_SET_PDEATHSIG is per thread).
 */
cq_kernel_t *
cq_kernel_new(const cq_kernel_opts_t *opts, char *errstr, size_t errstr_size);

/**
 * @brief Run \p code as one cell; see cq_interp_execute() for the contract.
 * @param res Initialised by the caller; filled on CQ_OK.
 * @returns CQ_OK when \p res describes the cell; CQ_ERR_RETRIABLE when the
 *          kernel could not run it and could not be replaced.
 * @locality The thread that owns \p kernel.
 */
CQ_NODISCARD cq_err_t cq_kernel_execute(cq_kernel_t *kernel,
                                        const char *code,
                                        const cq_exec_opts_t *opts,
                                        cq_cell_result_t *res);

/**
 * @brief Ask the running cell to stop (KeyboardInterrupt). Harmless when
 *        the kernel is idle.
 * @returns 0, or -1 when no signal could be delivered.
 * @locality Any thread.
 */
int cq_kernel_interrupt(cq_kernel_t *kernel);

/**
 * @brief Kill the kernel and start a fresh one in the same work dir.
 * @locality The thread that owns \p kernel.
 */
CQ_NODISCARD cq_err_t cq_kernel_restart(cq_kernel_t *kernel);

/** @brief kernel_info_reply's language_info; borrowed, valid until the
 *         next restart. */
const json_t *cq_kernel_language_info(const cq_kernel_t *kernel);

/** @brief What the kernel's Python reported at its first start that
 *         reported (see cq_interp_env()): a restart, after job code ran,
 *         does not replace it. Borrowed, valid until cq_kernel_destroy();
 *         NULL when no report was well formed. */
const json_t *cq_kernel_env(const cq_kernel_t *kernel);

/** @brief The last error; borrowed, valid until the next call. */
const char *cq_kernel_errmsg(const cq_kernel_t *kernel);

/** @brief Process id of the kernel (of bwrap when sandboxed; of its
 *         parent, pid 1 of its namespaces, when forked), or -1. */
pid_t cq_kernel_pid(const cq_kernel_t *kernel);

/** @brief Whether the running kernel was forked by the kernel server
 *         (false: started cold). */
bool cq_kernel_forked(const cq_kernel_t *kernel);

/** @brief The work dir; borrowed, valid until destroy. */
const char *cq_kernel_work_dir(const cq_kernel_t *kernel);

/** @brief The identity the kernel runs as (its uid lease, restarts
 *         included); borrowed, valid until destroy. */
const cq_sandbox_id_t *cq_kernel_sandbox_id(const cq_kernel_t *kernel);

/**
 * @brief Set the niceness of the kernel's processes (its process groups:
 *        the kernel and what it started, bubblewrap's included) and of
 *        the kernels a restart starts.
 * @returns 0, or -1 with errno (EACCES/EPERM: lowering niceness needs
 *          CAP_SYS_NICE or RLIMIT_NICE).
 * @locality The thread that owns \p kernel.
 */
int cq_kernel_renice(cq_kernel_t *kernel, int nice);

/** @brief Counters of dropped kernel messages. */
void cq_kernel_stats(const cq_kernel_t *kernel, cq_jmsg_stats_t *stats);

/**
 * @brief shutdown_request on control, a short wait, then SIGTERM and
 *        SIGKILL to the process group; reaps it and removes the run dir.
 *        Accepts *kernelp == NULL and sets it to NULL.
 * @locality The thread that owns the kernel.
 */
void cq_kernel_destroy(cq_kernel_t **kernelp);

/**
 * @brief SIGKILL the kernel's processes at niceness 19 and return at once;
 *        cq_kernel_discard() (or destroy) still reaps them and frees the
 *        handle. For a kernel whose teardown is finished elsewhere.
 * @locality The thread that owns the kernel.
 */
void cq_kernel_kill(cq_kernel_t *kernel);

/**
 * @brief As cq_kernel_destroy() without the shutdown_request: SIGTERM and
 *        SIGKILL to the process group at once. For a kernel whose state
 *        and work dir are thrown away (a pooled kernel after its job):
 *        with the pool's imports loaded, ipykernel takes longer than the
 *        500 ms grace to honour a shutdown_request, which a worker slot
 *        would otherwise wait out after every job.
 * @locality The thread that owns the kernel.
 */
void cq_kernel_discard(cq_kernel_t **kernelp);

#endif
