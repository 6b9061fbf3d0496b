/* SPDX-License-Identifier: MIT */
/* lproc.c - one confined process of this room (lproc_int.h): the steps
 * of a cold start's child, the ids of a forked one, signals, reaping and
 * the teardown that waits until the sandbox's last process is gone.
 * Kernels (kernel_proc.c) and runners and judges (pyproc.c) start theirs
 * with it. */
#include "coderq/local/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "lproc_int.h"

/* How long a blocking reap waits, once a forked process's parent exited,
 * for the rest of it to be gone (reap_forked()) */
#define REAP_WAIT_MS 2000

void lproc_init(lproc_t *p, const char *what)
{
        memset(p, 0, sizeof(*p));
        p->what = what;
        p->pid = -1;
        p->pidfd = -1;
        p->info_fd = -1;
        p->inner_pidfd = -1;
        p->inner_pid = -1;
        atomic_init(&p->sig_pid, -1);
}

/* ---- a cold start ---- */

void lproc_child_begin(void)
{
        sigset_t none;
        struct sigaction dfl;
        int tty;

        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGINT, &dfl, NULL);
        sigaction(SIGTERM, &dfl, NULL);
        sigaction(SIGPIPE, &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        /* A process group of its own (for killpg() and renicing) in the
         * worker's session, not a session of its own: with autogroup
         * scheduling every session is weighed as one, and a niced pool
         * start alone in its session would take as much CPU as all
         * running jobs together. And no controlling terminal: the code it
         * runs must not reach the operator's terminal (TIOCSTI, prompts
         * that stop a background group, sudo's per-terminal timestamp).
         * TIOCNOTTY from a process that is not the session leader
         * detaches only itself. */
        setpgid(0, 0);
        tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (tty >= 0) {
                ioctl(tty, TIOCNOTTY);
                close(tty);
        }
}

_Noreturn void lproc_child_exec(const cq_sandbox_t *sandbox,
                                const cq_sandbox_id_t *id,
                                const char *dir,
                                int nice,
                                pid_t parent,
                                char *const *argv,
                                char *const *envp)
{
        if (chdir(dir) != 0)
                _exit(126);
        /* Before the uid change: raising niceness is always allowed, and
         * the process's children inherit it. */
        if (nice > 0)
                setpriority(PRIO_PROCESS, 0, nice);
        if (cq_sandbox_child(sandbox, id) != 0)
                _exit(125);
        /* After the uid change, which clears the death signal. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
                _exit(124);
        execve(argv[0], argv, envp);
        _exit(127);
}

pid_t lproc_fork(lproc_t *p)
{
        pid_t pid = fork();

        if (pid <= 0)
                return pid;
        p->pid = pid;
        (void)setpgid(pid, pid);
        atomic_store(&p->sig_pid, (int)pid);
        p->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        return pid;
}

size_t lproc_read_upto(int fd, char *buf, size_t max)
{
        size_t len = 0;

        while (len < max) {
                ssize_t r = read(fd, buf + len, max - len);

                if (r > 0)
                        len += (size_t)r;
                else if (r < 0 && errno == EINTR)
                        continue;
                else
                        break;
        }
        return len;
}

void lproc_read_inner_pid(lproc_t *p, bool warn)
{
        char buf[1024];
        size_t len;
        json_t *info;
        json_int_t child;

        if (p->info_fd < 0)
                return;
        len = lproc_read_upto(p->info_fd, buf, sizeof(buf) - 1);
        close(p->info_fd);
        p->info_fd = -1;
        info = json_loadb(buf, len, 0, NULL);
        child = json_integer_value(json_object_get(info, "child-pid"));
        json_decref(info);
        if (child <= 1 || child > INT32_MAX) {
                if (warn)
                        cq_log_warn("sandbox: no child pid from bubblewrap");
                return;
        }
        /* The pid is kept without a pidfd too (no pidfd_open: old kernel
         * or seccomp): renicing needs it, only the wait does not. */
        p->inner_pid = (pid_t)child;
        p->inner_pidfd = (int)syscall(SYS_pidfd_open, (pid_t)child, 0);
        if (p->inner_pidfd < 0 && warn)
                cq_log_kv(CQ_LOG_WARN,
                          "sandbox: no pidfd for its pid 1; the teardown "
                          "will not wait for it",
                          "error", strerror(errno), NULL);
}

/* Whether the sandbox's pid 1 is known and still running: it is not our
 * child, so once it exited its pid may name another process group. */
static bool inner_alive(const lproc_t *p)
{
        struct pollfd pfd;

        if (p->inner_pid <= 0 || p->inner_pidfd < 0)
                return false;
        pfd.fd = p->inner_pidfd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        return poll(&pfd, 1, 0) == 0;
}

/* ---- a forked start ---- */

void lproc_forked_from(lproc_t *p, const cq_kserver_child_t *child)
{
        p->forked = true;
        p->pid = child->pid;
        p->pidfd = child->pidfd;
        p->fork_kernel = child->kernel;
        p->fork_groups[0] = p->fork_groups[1] = 0;
        atomic_store(&p->sig_pid, (int)child->pid);
}

bool lproc_forked_alive(const lproc_t *p)
{
        struct pollfd pfd = {p->pidfd, POLLIN, 0};

        return p->pid > 0 && p->pidfd >= 0 && poll(&pfd, 1, 0) == 0;
}

void lproc_kill_forked(lproc_t *p, int sig)
{
        if (!lproc_forked_alive(p))
                return;
        killpg(p->pid, sig);
        if (p->fork_kernel > 0)
                killpg(p->fork_kernel, sig);
        syscall(SYS_pidfd_send_signal, p->pidfd, sig, NULL, 0U);
}

/* Whether a process is left in process group \p pgid (EPERM: one of
 * another uid). While one is, no new process can take that id. */
static bool group_left(pid_t pgid)
{
        return pgid > 0 && (kill(-pgid, 0) == 0 || errno == EPERM);
}

/* Kill what is left in a forked process's groups, after its parent
 * exited; true when nothing is. Safe from signalling strangers: a group
 * id is not reused while a process is left in the group. */
static bool clear_groups(lproc_t *p)
{
        bool left = false;
        size_t i;

        for (i = 0; i < 2; i++) {
                pid_t pgid = p->fork_groups[i];

                if (!group_left(pgid)) {
                        p->fork_groups[i] = 0;
                        continue;
                }
                killpg(pgid, SIGKILL);
                left = true;
        }
        return !left;
}

/* A forked process's parent (the sandbox's pid 1, or an unsandboxed
 * one's run_init) exited once its pidfd is readable: blocking, wait for
 * that up to 5 s. A sandbox's pid 1 exits last, but run_init may die of
 * the same SIGKILL before the process, its child, has finished exiting,
 * and when the process dies by itself a job's subprocess may be left in
 * its group. So once the parent exited, what is left in its process
 * groups is killed, and a blocking reap waits until the server has
 * reaped the parent (a zombie counts against its uid's process limit and
 * holds its pid) and the groups are empty, looking again after 0.25 ms
 * and twice as long each time (at most 64 ms), for up to REAP_WAIT_MS by
 * the clock. */
static void reap_forked(lproc_t *p, bool block)
{
        int64_t until;
        long pause_us = 250;

        if (block)
                atomic_store(&p->sig_pid, -1);
        if (p->pid > 0) {
                struct pollfd pfd = {p->pidfd, POLLIN, 0};
                int rc;

                while ((rc = poll(&pfd, 1, block ? 5000 : 0)) < 0 &&
                       errno == EINTR)
                        ;
                if (rc == 0 && block)
                        cq_log_warn("%s: forked %s still alive 5 s after "
                                    "SIGKILL",
                                    p->what, p->what);
                if (rc == 0)
                        return;
                atomic_store(&p->sig_pid, -1);
                p->fork_groups[0] = p->pid;
                p->fork_groups[1] = p->fork_kernel;
                p->pid = -1;
                p->fork_kernel = 0;
        }
        /* what is left is killed; only a blocking reap waits for it */
        if (clear_groups(p) || !block)
                return;
        until = cq_now_ms() + REAP_WAIT_MS;
        for (;;) {
                bool parent =
                    p->pidfd >= 0 &&
                    syscall(SYS_pidfd_send_signal, p->pidfd, 0, NULL, 0U) == 0;
                struct timespec ts = {0, pause_us * 1000};

                if (clear_groups(p) && !parent)
                        break;
                if (cq_now_ms() >= until) {
                        cq_log_warn("%s: forked %s's processes not all gone "
                                    "%d ms after its parent exited (parent "
                                    "%s, groups %d %d left)",
                                    p->what, p->what, REAP_WAIT_MS,
                                    parent ? "unreaped" : "reaped",
                                    (int)p->fork_groups[0],
                                    (int)p->fork_groups[1]);
                        p->fork_groups[0] = p->fork_groups[1] = 0;
                        break;
                }
                nanosleep(&ts, NULL);
                if (pause_us < 64000)
                        pause_us *= 2;
        }
}

/* ---- either ---- */

void lproc_reap(lproc_t *p, bool block)
{
        siginfo_t si;
        int status, rc;

        if (p->forked) {
                if (p->pid > 0 || p->fork_groups[0] > 0 ||
                    p->fork_groups[1] > 0)
                        reap_forked(p, block);
                return;
        }
        if (p->pid <= 0)
                return;
        if (block)
                atomic_store(&p->sig_pid, -1);
        /* Exited: before it is reaped (its zombie holds the id), kill
         * what a job left in its process group, which it leads. */
        memset(&si, 0, sizeof(si));
        while ((rc = waitid(P_PID, (id_t)p->pid, &si,
                            WEXITED | WNOWAIT | (block ? 0 : WNOHANG))) < 0 &&
               errno == EINTR)
                ;
        if (rc < 0 || si.si_pid != p->pid)
                return;
        killpg(p->pid, SIGKILL);
        /* no interrupt from another thread may signal the pid once it
         * is free again */
        atomic_store(&p->sig_pid, -1);
        if (waitpid(p->pid, &status, 0) == p->pid)
                p->pid = -1;
}

bool lproc_alive(lproc_t *p)
{
        lproc_reap(p, false);
        return p->pid > 0;
}

bool lproc_wait_exit(lproc_t *p, int ms)
{
        int64_t until = cq_now_ms() + ms;

        while (lproc_alive(p)) {
                struct pollfd pfd = {p->pidfd, POLLIN, 0};
                int64_t left = until - cq_now_ms();

                if (left <= 0)
                        return false;
                if (p->pidfd >= 0)
                        poll(&pfd, 1, (int)(left < 20 ? left : 20));
                else {
                        struct timespec ts = {0, 10 * 1000 * 1000};

                        nanosleep(&ts, NULL);
                }
        }
        return true;
}

void lproc_kill_low(lproc_t *p)
{
        if (p->pid <= 0 || p->killed)
                return;
        if (p->forked) {
                if (lproc_forked_alive(p))
                        (void)setpriority(PRIO_PGRP, (id_t)p->pid, 19);
                lproc_kill_forked(p, SIGKILL);
                p->killed = true;
                return;
        }
        /* Lowest priority first: its exit is CPU spent in its name.
         * Raising niceness is always allowed. Our child's pid (and so
         * its group) stays ours until we reap it. */
        (void)setpriority(PRIO_PGRP, (id_t)p->pid, 19);
        if (inner_alive(p)) {
                (void)setpriority(PRIO_PGRP, (id_t)p->inner_pid, 19);
                syscall(SYS_pidfd_send_signal, p->inner_pidfd, SIGKILL, NULL,
                        0U);
        }
        killpg(p->pid, SIGKILL);
        p->killed = true;
}

void lproc_kill(lproc_t *p)
{
        /* A start that failed early may not have read it yet. */
        if (p->info_fd >= 0)
                lproc_read_inner_pid(p, false);
        if (p->inner_pidfd >= 0)
                syscall(SYS_pidfd_send_signal, p->inner_pidfd, SIGKILL, NULL,
                        0U);
        if (p->pid > 0) {
                if (p->forked) {
                        lproc_kill_forked(p, SIGKILL);
                } else {
                        killpg(p->pid, SIGKILL);
                        kill(p->pid, SIGKILL);
                }
                lproc_reap(p, true);
        } else if (p->forked) {
                lproc_reap(p, true); /* what is left in its groups */
        }
        p->pid = -1;
        p->forked = false;
        p->killed = false;
        p->fork_kernel = 0;
        p->fork_groups[0] = p->fork_groups[1] = 0;
        atomic_store(&p->sig_pid, -1);
        if (p->pidfd >= 0)
                close(p->pidfd);
        p->pidfd = -1;
        if (p->inner_pidfd >= 0) {
                /* The pid namespace's init exits only after every process
                 * in it did: readable means the whole sandbox is gone. */
                struct pollfd pfd = {p->inner_pidfd, POLLIN, 0};
                int64_t until = cq_now_ms() + 5000, left;
                int rc = 0;

                while ((left = until - cq_now_ms()) > 0 &&
                       (rc = poll(&pfd, 1, (int)left)) < 0 && errno == EINTR)
                        ;
                if (rc == 0)
                        cq_log_warn("sandbox: processes still alive 5 s "
                                    "after SIGKILL");
                close(p->inner_pidfd);
                p->inner_pidfd = -1;
        }
        p->inner_pid = -1;
        if (p->info_fd >= 0)
                close(p->info_fd);
        p->info_fd = -1;
}

int lproc_renice(lproc_t *p, bool boxed, int nice)
{
        int rc = 0;

        /* setpgid() made the process (or the outer bwrap) a group leader;
         * bubblewrap's --new-session made its pid 1 a session leader,
         * whose group holds the program. */
        if (p->forked)
                return lproc_forked_alive(p) &&
                               setpriority(PRIO_PGRP, (id_t)p->pid, nice) ==
                                   0 &&
                               (p->fork_kernel <= 0 ||
                                setpriority(PRIO_PGRP, (id_t)p->fork_kernel,
                                            nice) == 0)
                           ? 0
                           : -1;
        if (p->pid > 0 && setpriority(PRIO_PGRP, (id_t)p->pid, nice) != 0)
                rc = -1;
        if (rc == 0 && p->inner_pid > 0 &&
            setpriority(PRIO_PGRP, (id_t)p->inner_pid, nice) != 0)
                rc = -1;
        /* Sandboxed without a known pid 1, the program's group is out of
         * reach: say so rather than leave it niced silently. */
        if (rc == 0 && p->pid > 0 && p->inner_pid <= 0 && boxed) {
                errno = ESRCH;
                rc = -1;
        }
        return rc;
}

/* Whether our cold child is still running (not exited; it is not reaped
 * before it did). */
static bool child_running(const lproc_t *p)
{
        siginfo_t si;

        memset(&si, 0, sizeof(si));
        return p->pid > 0 &&
               waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT) ==
                   0 &&
               si.si_pid == 0;
}

pid_t lproc_group(const lproc_t *p)
{
        if (p->forked)
                return lproc_forked_alive(p)
                           ? (p->fork_kernel > 0 ? p->fork_kernel : p->pid)
                           : 0;
        /* Without a pidfd on pid 1 (no pidfd_open: an old kernel,
         * seccomp, valgrind), bubblewrap still running says pid 1 does:
         * it exits as soon as its pid 1 has. */
        if (p->inner_pid > 0)
                return inner_alive(p) ||
                               (p->inner_pidfd < 0 && child_running(p))
                           ? p->inner_pid
                           : 0;
        return p->pid > 0 ? p->pid : 0;
}
