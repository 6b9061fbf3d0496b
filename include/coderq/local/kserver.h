/* SPDX-License-Identifier: MIT */
/* kserver.h - the forking kernel server: one long-lived Python process
 * that has imported ipykernel and the configured modules once and forks a
 * fresh, sandboxed kernel per request, which the kernel client then
 * drives as any other (docs/internals/protocols/kernel-server.md). A kernel it
 * cannot give is started cold by the caller; the server is a speed-up,
 * never a reason for less isolation. */
#ifndef CODERQ_KSERVER_H
#define CODERQ_KSERVER_H

#include <sys/types.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/local/sandbox.h"

/* Largest request or reply datagram, in bytes. */
#define CQ_KSERVER_MSG_MAX 65536
/* Imports of CODERQ_KERNEL_PRELOAD when unset. */
#define CQ_KSERVER_PRELOAD_DEFAULT "numpy,pandas,matplotlib.pyplot,scipy"

typedef enum cq_kserver_mode {
        CQ_KSERVER_OFF = 0, /* every kernel starts cold */
        CQ_KSERVER_AUTO,    /* the server when its start-up probe passes */
        CQ_KSERVER_ON,      /* the server, or fail to start */
} cq_kserver_mode_t;

typedef struct cq_kserver_opts {
        cq_kserver_mode_t mode;
        const char *python;    /* NULL: /usr/bin/python3 */
        const char *preload;   /* comma-separated modules; NULL: the default */
        const char *work_root; /* the server's own dir goes here */
        const cq_sandbox_t *sandbox; /* borrowed: what the probe confines */
        int64_t start_timeout_ms;    /* server ready; <= 0: 60 s */
        int64_t reply_timeout_ms;    /* one request; <= 0: 10 s */
        /* A server for runners and judges only (cq_kserver_run()): it
         * imports no kernel's modules (preload NULL: the standard
         * library's that solutions use most, CQ_KSERVER_LIGHT_PRELOAD),
         * so that a fork copies little; it refuses kernels. */
        bool light;
} cq_kserver_opts_t;

/* Imports of a light server when its preload is NULL: what judged
 * solutions import most (HumanEval's prompts import typing). */
#define CQ_KSERVER_LIGHT_PRELOAD                                               \
        "typing,math,re,collections,itertools,functools,heapq,bisect,string"

/** @brief "auto", "on", "off" -> mode. @returns 0, or -1 when unknown. */
CQ_NODISCARD int cq_kserver_mode_parse(const char *s, cq_kserver_mode_t *mp);

/** @brief Fill \p opts from CODERQ_KERNEL_SERVER (unset: auto),
 *         CODERQ_KERNEL_PRELOAD, CODERQ_PYTHON and CODERQ_WORK_ROOT;
 *         strings stay borrowed from \p cfg, \p sandbox is stored.
 * @returns 0, or -1 when cfg->kernel_server is not auto, on or off. */
CQ_NODISCARD int cq_kserver_opts_from_config(cq_kserver_opts_t *opts,
                                             const cq_config_t *cfg,
                                             const cq_sandbox_t *sandbox);

/** @brief Thread-safe handle on the server process.
 * @locks ks->lock (a pthread mutex) guards the server process, its
 *        socket, its state and the counters; one request at a time. */
typedef struct cq_kserver cq_kserver_t;

/**
 * @brief Start the server and run its probe: one forked child confined
 *        as a kernel (namespaces, filesystem, uid, rlimits), which must
 *        exit 0. Mode off starts nothing.
 * @param opts Borrowed; strings are copied.
 * @returns Caller owns the returned value; free with cq_kserver_destroy().
 *          In auto mode a failed probe still returns a handle, disabled
 *          (cq_kserver_enabled() false, cq_kserver_reason() why), and
 *          logs at warn. NULL with \p errstr filled in mode on when the
 *          probe failed, or out of memory.
 * @locality Any thread.
 */
cq_kserver_t *
cq_kserver_new(const cq_kserver_opts_t *opts, char *errstr, size_t errstr_size);

/** @brief Stop the server; kernels it forked are killed too (they end
 *         with the handle's life pipe). Accepts *ksp == NULL. */
void cq_kserver_destroy(cq_kserver_t **ksp);

/** @brief Whether kernels are forked (the probe passed). NULL: false. */
bool cq_kserver_enabled(const cq_kserver_t *ks);

/** @brief Why the server is off; "" when on. Borrowed, valid until
 *         destroy. */
const char *cq_kserver_reason(const cq_kserver_t *ks);

/** @brief The interpreter the server runs (so its kernels run); a kernel
 *         of another interpreter starts cold. Borrowed, valid until
 *         destroy. */
const char *cq_kserver_python(const cq_kserver_t *ks);

/** @brief Process id of the current server process, or -1 (none now).
 * @locality Any thread. */
pid_t cq_kserver_pid(cq_kserver_t *ks);

/** What a forked kernel is to run as, and where. */
typedef struct cq_kserver_req {
        const char *work_dir;        /* its cwd and only writable bind */
        const char *const *argv;     /* ipykernel's arguments */
        const char *const *envp;     /* its whole environment */
        const cq_sandbox_t *sandbox; /* NULL: no sandbox, no rlimits */
        const cq_sandbox_id_t *id;   /* the uid it runs as; NULL: ours */
        int nice;                    /* 1..19, or 0 */
        int log_fd;                  /* its stdout and stderr */
        /* NULL, or code the kernel runs as a silent cell before it
         * answers, writing {"ok", "ename", "evalue", "stdout"} (JSON) to
         * warm_out (a new
         * file, which must not exist) */
        const char *warm;
        const char *warm_out;
        /* NULL, or a sandboxed kernel's matplotlibrc (text, no NUL, at
         * most CQ_KSERVER_MPLRC_MAX bytes), which its pid 1 writes to
         * CQ_KERNEL_BOXED_MPLCONFIGDIR/matplotlibrc on the kernel's /tmp
         * (a directory 0700 and a file 0600 of the kernel's uid) */
        const char *mplrc;
        /* NULL, or Python source a runner or a judge (cq_kserver_run())
         * runs before its program, in a namespace of its own, so that
         * what it defines is there before any job code runs (a runner's:
         * the test harness); the server keeps it compiled as it keeps
         * the program, and the child runs the compiled code */
        const char *preload;
} cq_kserver_req_t;

/** The longest matplotlibrc a spawn request carries (kinit's settings). */
#define CQ_KSERVER_MPLRC_MAX 2048

/** A forked kernel: its parent (pid 1 of its namespaces, a session and
 *  group leader) as the host sees it. */
typedef struct cq_kserver_child {
        pid_t pid;
        int pidfd;    /* on pid: readable once it and the kernel are gone */
        pid_t kernel; /* a sandboxed kernel, the leader of a group of its
                         own outside pid's (forked by the server into pid's
                         namespace); 0 when it is in pid's group */
} cq_kserver_child_t;

/**
 * @brief Fork a kernel. A server that died, did not answer within the
 *        reply timeout or answered nonsense is killed and started again
 *        after a doubling delay (1 s to 60 s), without waiting for it;
 *        until it is ready every request fails, and the caller starts
 *        its kernel cold.
 * @param req Borrowed.
 * @param child (out) On 0; the caller owns child->pidfd.
 * @returns 0, or -1 with \p errstr filled (no process left behind).
 * @locality Any thread.
 */
CQ_NODISCARD int cq_kserver_spawn(cq_kserver_t *ks,
                                  const cq_kserver_req_t *req,
                                  cq_kserver_child_t *child,
                                  char *errstr,
                                  size_t errstr_size);

/**
 * @brief Fork a runner or a judging interpreter instead of a kernel:
 *        \p program, run as `python -c PROGRAM ARGS` would run it
 *        (req->argv its arguments), with \p fds as its descriptors 0-3,
 *        in req's work dir and confined exactly as a kernel of req's
 *        sandbox (namespaces, filesystem, uid, rlimits, the keyring
 *        filter, req's environment), after req->preload when there is
 *        one. req->log_fd, warm and mplrc are not
 *        used: what goes wrong in its start is written to fds[2]. Fails,
 *        restarts and backs off as cq_kserver_spawn(); the caller then
 *        starts it cold. Not counted in the kernel stats.
 * @param op "runner" or "judge": the server keeps each one's program
 *        compiled (compiling runs none of it).
 * @param program Borrowed; it, req and its preload must fit
 *        CQ_KSERVER_MSG_MAX.
 * @param child (out) On 0; the caller owns child->pidfd.
 * @returns 0, or -1 with \p errstr filled (no process left behind).
 * @locality Any thread.
 */
CQ_NODISCARD int cq_kserver_run(cq_kserver_t *ks,
                                const char *op,
                                const cq_kserver_req_t *req,
                                const char *program,
                                const int fds[4],
                                cq_kserver_child_t *child,
                                char *errstr,
                                size_t errstr_size);

/**
 * @brief Wait until the server is ready, starting it again when its
 *        restart is due (a spawn would otherwise do that lazily).
 * @returns 0, or -1 when it is off or not ready within \p timeout_ms (0:
 *          one look, no waiting).
 * @locality Any thread.
 */
int cq_kserver_wait(cq_kserver_t *ks, int64_t timeout_ms);

/** @brief Counters of a server handle. */
typedef struct cq_kserver_stats {
        uint64_t forked;   /* kernels forked */
        uint64_t refused;  /* requests that got no kernel */
        uint64_t restarts; /* server processes started after the first */
        int64_t import_ms; /* the current server's imports, or -1 */
        /* the current server made sandboxed kernels' application before
         * the fork (its ready message's "app"; kserver.py build_app()) */
        bool app_prepared;
        /* a server process is ready to fork now: enabled, its ready
         * message read, and it has not exited (a server that died is
         * started again, after its backoff, by the next spawn or
         * cq_kserver_wait(), which the worker's housekeeping calls) */
        bool up;
} cq_kserver_stats_t;

/** @brief The counters. @locality Any thread. */
void cq_kserver_stats(cq_kserver_t *ks, cq_kserver_stats_t *stats);

/** A reply of the server, parsed. */
typedef struct cq_kserver_reply {
        bool ok;
        pid_t pid;       /* ok: the forked kernel's parent */
        pid_t outer;     /* ok: the process outside its namespaces */
        pid_t kernel;    /* ok, optional: the kernel's own pid, else 0 */
        int status;      /* ok, probe: its exit status; else -1 */
        char error[420]; /* !ok: the server's reason */
} cq_kserver_reply_t;

/**
 * @brief Parse one reply datagram (untrusted: the server is a process
 *        that could misbehave): a JSON object with "ok" true and the
 *        integers "pid" and "outer" (> 1), optionally "kernel" (> 1),
 *        and, for a probe, "status"; or
 *        "ok" false and a string "error".
 * @param nfds Descriptors that came with it: 2 for a spawn, 0 otherwise.
 * @returns 0 with \p reply filled, or -1 with \p errstr saying why.
 */
CQ_NODISCARD int cq_kserver_reply_parse(const char *data,
                                        size_t len,
                                        int nfds,
                                        bool probe,
                                        cq_kserver_reply_t *reply,
                                        char *errstr,
                                        size_t errstr_size);

#endif
