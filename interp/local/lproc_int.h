/* SPDX-License-Identifier: MIT */
/* lproc_int.h - one confined process of this room (a kernel, a runner, a
 * judging interpreter), whichever way it started: cold, as our child (in
 * bubblewrap when sandboxed), or forked by the kernel server, when it is
 * known by pidfd alone. What kernel_proc.c and pyproc.c share: its ids,
 * the child's steps up to execve(), signals, reaping, and a teardown
 * that returns once the last process of its sandbox is gone. The
 * identity it runs as, its work dir and its pipes are its owner's. Not a
 * public header. */
#ifndef CODERQ_LPROC_INT_H
#define CODERQ_LPROC_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include "coderq/local/kserver.h"
#include "coderq/local/sandbox.h"

typedef struct lproc {
        const char *what; /* "kernel", "runner", "judge": for logs; static */
        /* Cold: our child (bubblewrap, when sandboxed), a process group
         * leader. Forked: its parent (pid 1 of its namespaces, or an
         * unsandboxed one's run_init), not our child: known by pidfd
         * alone, the server reaps it. -1: none. */
        pid_t pid;
        int pidfd;
        /* In the sandbox: bubblewrap's info pipe until it is read, then a
         * pidfd on the sandbox's pid 1 (-1 when unknown). bubblewrap runs
         * the process in a new session, out of reach of killpg(pid), and
         * its pid 1 outlives the outer bwrap briefly. */
        int info_fd;
        int inner_pidfd;
        pid_t inner_pid;
        bool killed; /* lproc_kill_low() ran: only reaping is left */
        bool forked;
        /* Forked and sandboxed: the process itself, which the server
         * forked into pid 1's namespace; it leads a group of its own,
         * outside pid 1's (0: none). Only meant while pid 1 runs (it dies
         * with it). */
        pid_t fork_kernel;
        /* Forked, once its parent exited: the process groups (the
         * parent's and fork_kernel's; 0: none) that a blocking reap still
         * empties */
        pid_t fork_groups[2];
        /* pid, for signals from other threads; -1 from just before the
         * process is reaped */
        atomic_int sig_pid;
} lproc_t;

/** @brief No process yet; \p what names it in logs (static). */
void lproc_init(lproc_t *p, const char *what);

/* ---- a cold start ---- */

/**
 * @brief The child's first steps after fork(): default signal handlers
 *        and an empty mask, a process group of its own in our session
 *        (for killpg() and renicing; with autogroup scheduling a session
 *        of its own would be weighed like all our jobs together), and no
 *        controlling terminal. Async-signal-safe.
 */
void lproc_child_begin(void);

/**
 * @brief The child's last steps, its descriptors in place: cwd \p dir,
 *        niceness \p nice (when > 0, before the uid change: raising it
 *        is always allowed), the rlimits and uid of \p sandbox and \p id,
 *        death with its parent \p parent (exit when it is already gone),
 *        then execve(). Async-signal-safe; never returns.
 */
_Noreturn void lproc_child_exec(const cq_sandbox_t *sandbox,
                                const cq_sandbox_id_t *id,
                                const char *dir,
                                int nice,
                                pid_t parent,
                                char *const *argv,
                                char *const *envp);

/**
 * @brief fork() for a cold start: in the parent the child is \p p's
 *        (its group set here too, so that a killpg() cannot come before
 *        the child's own setpgid(), its pidfd held).
 * @returns 0 in the child, the pid in the parent, -1 with errno set.
 */
pid_t lproc_fork(lproc_t *p);

/** @brief Up to \p max bytes of \p fd into \p buf, until end of file or
 *         an error (EINTR retried): how many. */
size_t lproc_read_upto(int fd, char *buf, size_t max);

/**
 * @brief Learn the sandbox's pid 1 from bubblewrap's info pipe
 *        ({"child-pid": N}, written before the program runs, so complete
 *        once it answered) and hold a pidfd on it; without one the
 *        teardown cannot wait for the sandbox to be gone. \p warn logs
 *        what is missing.
 */
void lproc_read_inner_pid(lproc_t *p, bool warn);

/* ---- a forked start ---- */

/** @brief \p child, which the kernel server forked, is \p p's now (its
 *         pidfd taken). */
void lproc_forked_from(lproc_t *p, const cq_kserver_child_t *child);

/** @brief Whether a forked process's parent still runs. */
bool lproc_forked_alive(const lproc_t *p);

/**
 * @brief Signal a forked process: its process groups (its parent's, and
 *        the sandboxed process's own), then the parent by pidfd: in the
 *        sandbox SIGKILL to the namespace's pid 1 ends every process in
 *        it, and the process dies with its parent either way.
 */
void lproc_kill_forked(lproc_t *p, int sig);

/* ---- either ---- */

/**
 * @brief Reap what exited, blocking (until it did) or not. Cold: once
 *        the child exited, what it left in its group is killed before it
 *        is reaped. Forked: see lproc.c's reap_forked().
 */
void lproc_reap(lproc_t *p, bool block);

/** @brief Whether the process (or its forked parent) still runs: a
 *         reap without blocking first. */
bool lproc_alive(lproc_t *p);

/** @brief Wait up to \p ms for it to exit. */
bool lproc_wait_exit(lproc_t *p, int ms);

/**
 * @brief SIGKILL its processes at niceness 19 (its exit is CPU spent in
 *        its name, after its job) and return at once; lproc_kill() still
 *        reaps them. Once: a no-op when done or when nothing runs.
 */
void lproc_kill_low(lproc_t *p);

/**
 * @brief SIGKILL every process of it, reap it, and wait (up to 5 s)
 *        until the sandbox's pid 1, which outlives every process in it,
 *        is gone: nothing runs as its uid when this returns. \p p is then
 *        as after lproc_init().
 */
void lproc_kill(lproc_t *p);

/**
 * @brief Set the niceness of its process groups (the process and what it
 *        started, bubblewrap's included). \p boxed: it runs in the
 *        sandbox, where a cold one's group is pid 1's.
 * @returns 0, or -1 with errno set.
 */
int lproc_renice(lproc_t *p, bool boxed, int nice);

/**
 * @brief The process group the program itself is in (a forked sandboxed
 *        one's own, a cold sandboxed one's pid 1's, else pid's), for a
 *        signal such as SIGINT; 0 when none is known or it exited. Ask
 *        from the thread that reaps it: a group id is the group's only
 *        until its leader is reaped.
 */
pid_t lproc_group(const lproc_t *p);

#endif
