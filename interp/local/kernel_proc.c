/* SPDX-License-Identifier: MIT */
/* kernel_proc.c - the kernel's processes: the connection file, spawning
 * (cold, sandboxed or not, or forked by the kernel server) with the
 * environment of kernel_env.c, signals, renicing, reaping and a teardown
 * that waits until the sandbox's last process is gone; and the handle's
 * last error. */
#include "coderq/local/kernel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "kernel_int.h"

/* The descriptor of the kernel's child on which bubblewrap gets --info-fd. */
#define INFO_FD 3
/* bubblewrap's --file source of the matplotlibrc (sandboxed kernels) */
#define MPLRC_FD 4
/* How long a blocking reap waits, once a forked kernel's parent exited,
 * for the rest of it to be gone (reap_forked()) */
#define REAP_WAIT_MS 2000

CQ_PRINTF(2, 3)
void kernel_set_error(cq_kernel_t *kernel, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(kernel->errmsg, sizeof(kernel->errmsg), fmt, ap);
        va_end(ap);
}

/* ---- files ---- */

/* The last bytes of the kernel's log, for error messages. */
void kernel_log_tail(const cq_kernel_t *kernel, char *out, size_t size)
{
        struct stat st;
        char buf[400];
        ssize_t n;
        off_t end;
        int fd;
        size_t i;

        out[0] = '\0';
        /* The run dir belongs to the kernel's uid: the code may have put a
         * FIFO or a symlink there, which must neither block nor lead out. */
        fd = openat(kernel->run_fd, "kernel.log",
                    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
                return;
        if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
                close(fd);
                return;
        }
        end = lseek(fd, 0, SEEK_END);
        if (end > (off_t)sizeof(buf) - 1)
                lseek(fd, end - (off_t)sizeof(buf) + 1, SEEK_SET);
        else
                lseek(fd, 0, SEEK_SET);
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return;
        buf[n] = '\0';
        for (i = 0; i < (size_t)n; i++)
                if (buf[i] == '\n' || buf[i] == '\r')
                        buf[i] = ' ';
        snprintf(out, size, "; kernel log: ...%s", buf);
}

int kernel_write_conn_file(cq_kernel_t *kernel)
{
        json_t *conn = NULL;
        char ip[PATH_MAX + 8];
        int rc = -1, fd = -1;
        char *text = NULL;
        size_t len, off = 0;

        snprintf(ip, sizeof(ip), "%s", kernel->ipc_kernel);
        conn = json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:s, s:s, s:s}",
                         "shell_port", 1, "iopub_port", 2, "stdin_port", 3,
                         "control_port", 4, "hb_port", 5, "ip", ip, "key",
                         kernel->key, "transport", "ipc", "signature_scheme",
                         "hmac-sha256", "kernel_name", "python3");
        text = conn ? json_dumps(conn, JSON_COMPACT) : NULL;
        if (!text) {
                kernel_set_error(kernel, "could not build connection file: "
                                         "out of memory");
                goto out;
        }
        unlinkat(kernel->run_fd, "conn.json", 0);
        fd = openat(kernel->run_fd, "conn.json",
                    O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
                kernel_set_error(kernel, "could not create \"%s\": %s",
                                 kernel->conn_path, strerror(errno));
                goto out;
        }
        len = strlen(text);
        while (off < len) {
                ssize_t n = write(fd, text + off, len - off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        kernel_set_error(kernel, "could not write \"%s\": %s",
                                         kernel->conn_path, strerror(errno));
                        goto out;
                }
                off += (size_t)n;
        }
        if (cq_sandbox_own_fd(&kernel->id, fd)) {
                kernel_set_error(kernel, "could not chown \"%s\": %s",
                                 kernel->conn_path, strerror(errno));
                goto out;
        }
        rc = 0;
out:
        if (fd >= 0)
                close(fd);
        free(text);
        json_decref(conn);
        return rc;
}

/* ---- process ---- */

/* Whether a process is left in process group \p pgid (EPERM: one of
 * another uid). While one is, no new process can take that id. */
static bool group_left(pid_t pgid)
{
        return pgid > 0 && (kill(-pgid, 0) == 0 || errno == EPERM);
}

/* Kill what is left in a forked kernel's process groups, after its
 * parent exited; true when nothing is. Safe from signalling strangers:
 * a group id is not reused while a process is left in the group. */
static bool clear_groups(cq_kernel_t *kernel)
{
        bool left = false;
        size_t i;

        for (i = 0; i < 2; i++) {
                pid_t pgid = kernel->fork_groups[i];

                if (!group_left(pgid)) {
                        kernel->fork_groups[i] = 0;
                        continue;
                }
                killpg(pgid, SIGKILL);
                left = true;
        }
        return !left;
}

/* A forked kernel's parent (the sandbox's pid 1, or an unsandboxed
 * kernel's run_init) exited once its pidfd is readable: blocking, wait
 * for that up to 5 s. A sandbox's pid 1 exits last, but run_init may die
 * of the same SIGKILL before the kernel, its child, has finished
 * exiting, and when the kernel dies by itself a job's subprocess may be
 * left in its group. So once the parent exited, what is left in the
 * kernel's process groups is killed, and a blocking reap waits until the
 * server has reaped the parent (a zombie counts against its uid's
 * process limit and holds its pid) and the groups are empty, looking
 * again after 0.25 ms and twice as long each time (at most 64 ms), for
 * up to REAP_WAIT_MS by the clock. */
static void reap_forked(cq_kernel_t *kernel, bool block)
{
        int64_t until;
        long pause_us = 250;

        if (block)
                atomic_store(&kernel->sig_pid, -1);
        if (kernel->pid > 0) {
                struct pollfd pfd = {kernel->pidfd, POLLIN, 0};
                int rc;

                while ((rc = poll(&pfd, 1, block ? 5000 : 0)) < 0 &&
                       errno == EINTR)
                        ;
                if (rc == 0 && block)
                        cq_log_warn("kernel: forked kernel still alive 5 s "
                                    "after SIGKILL");
                if (rc == 0)
                        return;
                atomic_store(&kernel->sig_pid, -1);
                kernel->fork_groups[0] = kernel->pid;
                kernel->fork_groups[1] = kernel->fork_kernel;
                kernel->pid = -1;
                kernel->fork_kernel = 0;
        }
        /* what is left is killed; only a blocking reap waits for it */
        if (clear_groups(kernel) || !block)
                return;
        until = cq_now_ms() + REAP_WAIT_MS;
        for (;;) {
                bool parent = kernel->pidfd >= 0 &&
                              syscall(SYS_pidfd_send_signal, kernel->pidfd, 0,
                                      NULL, 0U) == 0;
                struct timespec ts = {0, pause_us * 1000};

                if (clear_groups(kernel) && !parent)
                        break;
                if (cq_now_ms() >= until) {
                        cq_log_warn("kernel: forked kernel's processes not "
                                    "all gone %d ms after its parent exited "
                                    "(parent %s, groups %d %d left)",
                                    REAP_WAIT_MS,
                                    parent ? "unreaped" : "reaped",
                                    (int)kernel->fork_groups[0],
                                    (int)kernel->fork_groups[1]);
                        kernel->fork_groups[0] = kernel->fork_groups[1] = 0;
                        break;
                }
                nanosleep(&ts, NULL);
                if (pause_us < 64000)
                        pause_us *= 2;
        }
}

void kernel_reap(cq_kernel_t *kernel, bool block)
{
        siginfo_t si;
        int status, rc;

        if (kernel->forked) {
                if (kernel->pid > 0 || kernel->fork_groups[0] > 0 ||
                    kernel->fork_groups[1] > 0)
                        reap_forked(kernel, block);
                return;
        }
        if (kernel->pid <= 0)
                return;
        if (block)
                atomic_store(&kernel->sig_pid, -1);
        /* Exited: before it is reaped (its zombie holds the id), kill
         * what a job left in its process group, which it leads. */
        memset(&si, 0, sizeof(si));
        while ((rc = waitid(P_PID, (id_t)kernel->pid, &si,
                            WEXITED | WNOWAIT | (block ? 0 : WNOHANG))) < 0 &&
               errno == EINTR)
                ;
        if (rc < 0 || si.si_pid != kernel->pid)
                return;
        killpg(kernel->pid, SIGKILL);
        /* no interrupt from another thread may signal the pid once it
         * is free again */
        atomic_store(&kernel->sig_pid, -1);
        if (waitpid(kernel->pid, &status, 0) == kernel->pid)
                kernel->pid = -1;
}

bool kernel_alive(cq_kernel_t *kernel)
{
        kernel_reap(kernel, false);
        return kernel->pid > 0;
}

/* Whether a forked kernel's parent is still running: it is not our
 * child, so once it exited its pid may name another process group. */
static bool forked_alive(const cq_kernel_t *kernel)
{
        struct pollfd pfd = {kernel->pidfd, POLLIN, 0};

        return kernel->pid > 0 && kernel->pidfd >= 0 && poll(&pfd, 1, 0) == 0;
}

/* Signal a forked kernel: its process group (the group of its parent,
 * which leads it, as the kernel and what it starts are in it), then the
 * parent by pidfd: in the sandbox SIGKILL to the namespace's pid 1 ends
 * every process in it, and the kernel dies with its parent either way. */
void kernel_kill_forked(cq_kernel_t *kernel, int sig)
{
        if (!forked_alive(kernel))
                return;
        killpg(kernel->pid, sig);
        if (kernel->fork_kernel > 0)
                killpg(kernel->fork_kernel, sig);
        syscall(SYS_pidfd_send_signal, kernel->pidfd, sig, NULL, 0U);
}

void kernel_files_in_run_dir(cq_kernel_t *kernel)
{
        if (kernel->tmp_fd >= 0)
                close(kernel->tmp_fd);
        kernel->tmp_fd = -1;
        snprintf(kernel->ipc_kernel, sizeof(kernel->ipc_kernel), "%s/k",
                 kernel->run_dir);
        kernel->ipc_name = "k";
        snprintf(kernel->warm_path, sizeof(kernel->warm_path), "%s/" WARM_NAME,
                 kernel->run_dir);
}

/* A sandboxed forked kernel binds its sockets on its own /tmp, a tmpfs
 * that goes with it (on ext4, binding five socket files was 3% of the CPU
 * of the server and its forked kernels in perf, ext4 searching for a
 * free inode past recently freed ones): open that
 * /tmp as O_PATH through its pid 1's root and connect through the fd. Its
 * pid 1 had confined itself (its root is the sandbox's) before the server
 * forked the kernel; its pidfd, polled after the open, says the pid was
 * still its and not a process's that reused it; a /tmp on the device of
 * our own / or /tmp is refused. The fd keeps that /tmp, not a path that
 * could name another's later, for a restart's connections. */
static int reach_tmp(cq_kernel_t *kernel)
{
        struct pollfd pfd = {kernel->pidfd, POLLIN, 0};
        struct stat st, host;
        char path[64];
        int fd;

        snprintf(path, sizeof(path), "/proc/%ld/root/tmp", (long)kernel->pid);
        fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
                kernel_set_error(kernel, "could not open %s: %s", path,
                                 strerror(errno));
                return -1;
        }
        if (poll(&pfd, 1, 0) != 0) {
                kernel_set_error(kernel, "the forked kernel's pid 1 exited "
                                         "before its /tmp was opened");
                close(fd);
                return -1;
        }
        if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) ||
            (stat("/", &host) == 0 && host.st_dev == st.st_dev) ||
            (stat("/tmp", &host) == 0 && host.st_dev == st.st_dev)) {
                kernel_set_error(kernel, "%s is not the sandbox's own /tmp",
                                 path);
                close(fd);
                return -1;
        }
        kernel->tmp_fd = fd;
        kernel->ipc_name = KERNEL_TMP_IPC_NAME;
        return 0;
}

/* Undo a fork_spawn() whose kernel cannot be used: kill, reap, forget. */
static void drop_forked(cq_kernel_t *kernel)
{
        kernel_kill_forked(kernel, SIGKILL);
        kernel_reap(kernel, true);
        if (kernel->pidfd >= 0)
                close(kernel->pidfd);
        kernel->pidfd = -1;
        kernel->pid = -1;
        kernel->forked = false;
        kernel->warm_in_kernel = false;
        kernel->fork_kernel = 0;
        kernel->fork_groups[0] = kernel->fork_groups[1] = 0;
        atomic_store(&kernel->sig_pid, -1);
}

/* The kernel's log, kernel.log in the run dir, open for appending, as
 * its stdout and stderr: ours, a regular file with one link, made by this
 * process. The run dir is the kernel's: a restart finds whatever its code
 * left there, a symlink to a file of the host's, a FIFO, a hard link, a
 * file of its own; any of them is removed and the log made anew (it
 * loses what the earlier starts wrote). -1 with errno set. */
static int open_log(const cq_kernel_t *kernel)
{
        struct stat st;
        int fd =
            openat(kernel->run_fd, "kernel.log",
                   O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);

        /* O_NONBLOCK only kept a FIFO from blocking the open */
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            st.st_nlink == 1 && st.st_uid == geteuid() &&
            fcntl(fd, F_SETFL, O_APPEND) == 0)
                return fd;
        if (fd >= 0)
                close(fd);
        if (unlinkat(kernel->run_fd, "kernel.log", 0) != 0 && errno != ENOENT)
                return -1;
        return openat(kernel->run_fd, "kernel.log",
                      O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW |
                          O_CLOEXEC,
                      0600);
}

/* Ask the kernel server for the kernel: 0 when forked. */
static int fork_spawn(cq_kernel_t *kernel,
                      const char *const *cmd,
                      char *const *envp,
                      int logfd)
{
        cq_kserver_req_t req;
        cq_kserver_child_t child;
        char err[512];

        memset(&req, 0, sizeof(req));
        req.work_dir = kernel->work_dir;
        req.argv = cmd + 5; /* after python -P -s -m ipykernel_launcher */
        req.envp = (const char *const *)envp;
        req.sandbox = kernel->sandbox;
        req.id = &kernel->id;
        req.nice = kernel->nice;
        req.log_fd = logfd;
        /* its pid 1 makes the matplotlibrc on the kernel's /tmp */
        if (cq_sandbox_enabled(kernel->sandbox))
                req.mplrc = cq_kernel_mpl_rc;
        /* the warm-up goes along when it leaves the request room */
        if (kernel->warm_code &&
            strlen(kernel->warm_code) <= CQ_KSERVER_MSG_MAX / 4) {
                req.warm = kernel->warm_code;
                req.warm_out = kernel->warm_path;
        }
        if (cq_kserver_spawn(kernel->kserver, &req, &child, err, sizeof(err))) {
                cq_log_kv(CQ_LOG_INFO, "kernel: starting cold", "reason", err,
                          NULL);
                return -1;
        }
        kernel->forked = true;
        kernel->warm_in_kernel = req.warm != NULL;
        kernel->pid = child.pid;
        kernel->pidfd = child.pidfd;
        kernel->fork_kernel = child.kernel;
        kernel->fork_groups[0] = kernel->fork_groups[1] = 0;
        atomic_store(&kernel->sig_pid, (int)child.pid);
        return 0;
}

size_t kernel_read_upto(int fd, char *buf, size_t max)
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

/* Learn the sandbox's pid 1 from bubblewrap's info pipe ({"child-pid":
 * N}, written before the kernel runs, so complete once it answered) and
 * hold a pidfd on it. Without one, kernel_teardown cannot wait for the
 * sandbox to be gone. */
void kernel_read_inner_pid(cq_kernel_t *kernel, bool warn)
{
        char buf[1024];
        size_t len;
        json_t *info;
        json_int_t child;

        if (kernel->info_fd < 0)
                return;
        len = kernel_read_upto(kernel->info_fd, buf, sizeof(buf) - 1);
        close(kernel->info_fd);
        kernel->info_fd = -1;
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
        kernel->inner_pid = (pid_t)child;
        kernel->inner_pidfd = (int)syscall(SYS_pidfd_open, (pid_t)child, 0);
        if (kernel->inner_pidfd < 0 && warn)
                cq_log_kv(
                    CQ_LOG_WARN,
                    "sandbox: no pidfd for its pid 1; kernel_teardown will not "
                    "wait for it",
                    "error", strerror(errno), NULL);
}

void kernel_close_sockets(cq_kernel_t *kernel)
{
        cq_zmtp_destroy(&kernel->shell);
        cq_zmtp_destroy(&kernel->control);
        cq_zmtp_destroy(&kernel->iopub);
}

/* SIGKILL the process group and the sandbox, kernel_reap, wait until the
 * sandbox's processes are gone, close sockets, remove the files. */
void kernel_teardown(cq_kernel_t *kernel)
{
        char name[16];
        int port;

        /* A start that failed early may not have read it yet. */
        if (kernel->info_fd >= 0)
                kernel_read_inner_pid(kernel, false);
        if (kernel->inner_pidfd >= 0)
                syscall(SYS_pidfd_send_signal, kernel->inner_pidfd, SIGKILL,
                        NULL, 0U);
        if (kernel->pid > 0) {
                if (kernel->forked) {
                        kernel_kill_forked(kernel, SIGKILL);
                } else {
                        killpg(kernel->pid, SIGKILL);
                        kill(kernel->pid, SIGKILL);
                }
                kernel_reap(kernel, true);
        } else if (kernel->forked) {
                kernel_reap(kernel, true); /* what is left in its groups */
        }
        kernel->pid = -1;
        kernel->forked = false;
        kernel->fork_kernel = 0;
        kernel->fork_groups[0] = kernel->fork_groups[1] = 0;
        if (kernel->pidfd >= 0)
                close(kernel->pidfd);
        kernel->pidfd = -1;
        if (kernel->inner_pidfd >= 0) {
                /* The pid namespace's init exits only after every process
                 * in it did: readable means the whole sandbox is gone. */
                struct pollfd pfd = {kernel->inner_pidfd, POLLIN, 0};
                int64_t until = cq_now_ms() + 5000, left;
                int rc = 0;

                while ((left = until - cq_now_ms()) > 0 &&
                       (rc = poll(&pfd, 1, (int)left)) < 0 && errno == EINTR)
                        ;
                if (rc == 0)
                        cq_log_warn("sandbox: processes still alive 5 s "
                                    "after SIGKILL");
                close(kernel->inner_pidfd);
                kernel->inner_pidfd = -1;
        }
        kernel->inner_pid = -1;
        if (kernel->info_fd >= 0)
                close(kernel->info_fd);
        kernel->info_fd = -1;
        kernel_close_sockets(kernel);
        kernel_files_in_run_dir(kernel);
        for (port = 1; port <= 5; port++) {
                snprintf(name, sizeof(name), "k-%d", port);
                unlinkat(kernel->run_fd, name, 0);
        }
        unlinkat(kernel->run_fd, "conn.json", 0);
        json_decref(kernel->language_info);
        kernel->language_info = NULL;
        /* kernel->env stays: the first start's report (warm_result()) */
}

/* Write an unsandboxed kernel's MPLCONFIGDIR (run_dir/mpl, its own) and
 * its matplotlibrc, owned by the kernel's uid (a sandboxed kernel's is
 * made on its /tmp: CQ_KERNEL_BOXED_MPLCONFIGDIR). */
int kernel_write_mpl_rc(cq_kernel_t *kernel)
{
        char dir[PATH_MAX + 8], path[PATH_MAX + 24];
        int fd = -1, rc = -1;
        size_t off = 0;

        snprintf(dir, sizeof(dir), "%s/mpl", kernel->run_dir);
        snprintf(path, sizeof(path), "%s/matplotlibrc", dir);
        if ((mkdir(dir, 0700) && errno != EEXIST) ||
            cq_sandbox_own(&kernel->id, dir))
                goto out;
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                  0600);
        if (fd < 0)
                goto out;
        while (off < strlen(cq_kernel_mpl_rc)) {
                ssize_t n = write(fd, cq_kernel_mpl_rc + off,
                                  strlen(cq_kernel_mpl_rc) - off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        goto out;
                off += (size_t)n;
        }
        if (cq_sandbox_own(&kernel->id, path))
                goto out;
        rc = 0;
out:
        if (fd >= 0)
                close(fd);
        return rc;
}

/* In the sandbox the kernel's parent is bubblewrap's pid 1, which
 * ipykernel's parent poller takes for an orphaning: there
 * --die-with-parent does that job instead. */
static char **build_env(const cq_kernel_t *kernel)
{
        bool boxed = cq_sandbox_enabled(kernel->sandbox);

        return cq_kernel_environ(kernel->work_dir, kernel->run_dir, boxed,
                                 boxed ? 0 : getpid());
}

/* What a spawn hands the kernel, made before the kernel server is asked
 * (a forked kernel gets the log and the environment too): -1 or NULL
 * where there is none. */
typedef struct spawn {
        char **argv, **envp;
        int logfd, nullfd;
        int info[2];  /* bubblewrap's --info-fd pipe (sandboxed) */
        int mplrc[2]; /* the matplotlibrc bubblewrap copies (sandboxed) */
        bool boxed;
} spawn_t;

/* The log, /dev/null, the command line, the environment and, in the
 * sandbox, the info pipe and the matplotlibrc's: -1 with the error set
 * when one is missing. */
static int
spawn_prepare(cq_kernel_t *kernel, const char *const *cmd, spawn_t *sp)
{
        sp->boxed = cq_sandbox_enabled(kernel->sandbox);
        sp->logfd = open_log(kernel);
        sp->nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        sp->argv =
            cq_sandbox_argv(kernel->sandbox, kernel->work_dir, cmd,
                            sp->boxed ? INFO_FD : -1, sp->boxed ? MPLRC_FD : -1,
                            CQ_KERNEL_BOXED_MPLCONFIGDIR "/matplotlibrc");
        sp->envp = build_env(kernel);
        if (sp->boxed && pipe2(sp->info, O_CLOEXEC | O_NONBLOCK) != 0)
                sp->info[0] = sp->info[1] = -1;
        /* the matplotlibrc bubblewrap copies onto the kernel's /tmp: a
         * pipe holds all of it (far less than its buffer) */
        if (sp->boxed && pipe2(sp->mplrc, O_CLOEXEC) == 0) {
                if (write(sp->mplrc[1], cq_kernel_mpl_rc,
                          strlen(cq_kernel_mpl_rc)) !=
                    (ssize_t)strlen(cq_kernel_mpl_rc)) {
                        close(sp->mplrc[0]);
                        sp->mplrc[0] = -1;
                }
                close(sp->mplrc[1]);
                sp->mplrc[1] = -1;
        }
        if (sp->logfd < 0 || sp->nullfd < 0 || !sp->argv || !sp->envp ||
            (sp->boxed && (sp->info[0] < 0 || sp->mplrc[0] < 0))) {
                kernel_set_error(kernel, "could not prepare kernel launch: %s",
                                 strerror(errno));
                return -1;
        }
        return 0;
}

static void spawn_release(spawn_t *sp)
{
        if (sp->info[0] >= 0)
                close(sp->info[0]);
        if (sp->info[1] >= 0)
                close(sp->info[1]);
        if (sp->mplrc[0] >= 0)
                close(sp->mplrc[0]);
        if (sp->logfd >= 0)
                close(sp->logfd);
        if (sp->nullfd >= 0)
                close(sp->nullfd);
        cq_sandbox_argv_free(sp->argv);
        cq_sandbox_argv_free(sp->envp);
}

/* Ask the kernel server for the kernel, whose sockets and warm-up report
 * are on its own /tmp when it is sandboxed: 0 when it forked one that can
 * be reached; else -1, the files back in the run dir for a cold start. */
static int
spawn_forked(cq_kernel_t *kernel, const char *const *cmd, const spawn_t *sp)
{
        if (sp->boxed) {
                snprintf(kernel->ipc_kernel, sizeof(kernel->ipc_kernel), "%s",
                         KERNEL_TMP_IPC);
                snprintf(kernel->warm_path, sizeof(kernel->warm_path), "%s",
                         KERNEL_TMP_WARM);
        }
        if (kernel_write_conn_file(kernel) == 0 &&
            fork_spawn(kernel, cmd, sp->envp, sp->logfd) == 0) {
                if (!sp->boxed || reach_tmp(kernel) == 0)
                        return 0;
                cq_log_kv(CQ_LOG_WARN, "kernel: starting cold", "reason",
                          kernel->errmsg, NULL);
                drop_forked(kernel);
        }
        kernel_files_in_run_dir(kernel);
        return -1;
}

/* The descriptors of a cold spawn's child: stdin /dev/null, stdout and
 * stderr the log, bubblewrap's info pipe as INFO_FD and the
 * matplotlibrc's as MPLRC_FD, no other. Async-signal-safe. */
static void child_fds(const spawn_t *sp)
{
        int isrc, msrc;

        dup2(sp->nullfd, 0);
        dup2(sp->logfd, 1);
        dup2(sp->logfd, 2);
        /* above their targets first, so that neither dup2() below
         * overwrites the other's source; a dup2() onto another number
         * clears O_CLOEXEC */
        isrc =
            sp->info[1] >= 0 ? fcntl(sp->info[1], F_DUPFD, MPLRC_FD + 1) : -1;
        msrc =
            sp->mplrc[0] >= 0 ? fcntl(sp->mplrc[0], F_DUPFD, MPLRC_FD + 1) : -1;
        if (isrc >= 0) {
                dup2(isrc, INFO_FD);
                /* bubblewrap writes it with blocking semantics */
                fcntl(INFO_FD, F_SETFL, 0);
        }
        if (msrc >= 0)
                dup2(msrc, MPLRC_FD);
        syscall(SYS_close_range,
                msrc >= 0   ? MPLRC_FD + 1U
                : isrc >= 0 ? INFO_FD + 1U
                            : 3U,
                ~0U, 0U);
}

/* The child of a cold spawn, up to execve() of the kernel (or
 * bubblewrap): only async-signal-safe calls. */
_Noreturn static void
exec_child(cq_kernel_t *kernel, const spawn_t *sp, pid_t parent)
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
        child_fds(sp);
        if (chdir(kernel->work_dir) != 0)
                _exit(126);
        /* Before the uid change: raising niceness is always allowed, and
         * the kernel's processes inherit it. */
        if (kernel->nice > 0)
                setpriority(PRIO_PROCESS, 0, kernel->nice);
        if (cq_sandbox_child(kernel->sandbox, &kernel->id) != 0)
                _exit(125);
        /* After the uid change, which clears the death signal. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
                _exit(124);
        execve(sp->argv[0], sp->argv, sp->envp);
        _exit(127);
}

/* Start the kernel ourselves: fork, and exec it (in bubblewrap when
 * sandboxed) in a process group of its own. */
static int spawn_cold(cq_kernel_t *kernel, spawn_t *sp)
{
        pid_t parent = getpid();

        if (kernel_write_conn_file(kernel))
                return -1;
        kernel->pid = fork();
        if (kernel->pid < 0) {
                kernel_set_error(kernel, "could not fork: %s", strerror(errno));
                return -1;
        }
        if (kernel->pid == 0)
                exec_child(kernel, sp, parent);
        /* Also here, so that killpg() cannot run before the child's. */
        (void)setpgid(kernel->pid, kernel->pid);
        atomic_store(&kernel->sig_pid, (int)kernel->pid);
        kernel->pidfd = (int)syscall(SYS_pidfd_open, kernel->pid, 0);
        kernel->info_fd = sp->info[0];
        sp->info[0] = -1;
        return 0;
}

int kernel_spawn(cq_kernel_t *kernel)
{
        /* -P: no work dir on sys.path while Python and ipykernel start,
         * so a restart after job code ran imports nothing it planted
         * there (a launcher, a module of the start-up); IPython then adds
         * '' after the standard library, as it does for every kernel.
         * -s: no user site dir (a .pth file there runs at start). */
        const char *cmd[] = {kernel->python,
                             "-P",
                             "-s",
                             "-m",
                             "ipykernel_launcher",
                             "-f",
                             kernel->conn_path,
                             "--HistoryManager.hist_file=:memory:",
                             "--InteractiveShell.colors=NoColor",
                             NULL};
        spawn_t sp = {NULL, NULL, -1, -1, {-1, -1}, {-1, -1}, false};
        int rc = -1;

        if (spawn_prepare(kernel, cmd, &sp) == 0) {
                if (cq_kserver_enabled(kernel->kserver) &&
                    strcmp(cq_kserver_python(kernel->kserver),
                           kernel->python) == 0 &&
                    spawn_forked(kernel, cmd, &sp) == 0)
                        rc = 0;
                else
                        rc = spawn_cold(kernel, &sp);
        }
        spawn_release(&sp);
        return rc;
}

/* Wait up to \p ms for the process to exit. */
bool kernel_wait_exit(cq_kernel_t *kernel, int ms)
{
        int64_t until = cq_now_ms() + ms;

        while (kernel_alive(kernel)) {
                struct pollfd pfd = {kernel->pidfd, POLLIN, 0};
                int64_t left = until - cq_now_ms();

                if (left <= 0)
                        return false;
                if (kernel->pidfd >= 0)
                        poll(&pfd, 1, (int)(left < 20 ? left : 20));
                else {
                        struct timespec ts = {0, 10 * 1000 * 1000};

                        nanosleep(&ts, NULL);
                }
        }
        return true;
}

int cq_kernel_renice(cq_kernel_t *kernel, int nice)
{
        int rc = 0;

        kernel->nice = nice;
        /* setpgid() made the kernel (or the outer bwrap) a group leader;
         * bubblewrap's --new-session made its pid 1 a session leader,
         * whose group holds the Python kernel. */
        if (kernel->forked)
                return forked_alive(kernel) &&
                               setpriority(PRIO_PGRP, (id_t)kernel->pid,
                                           nice) == 0 &&
                               (kernel->fork_kernel <= 0 ||
                                setpriority(PRIO_PGRP,
                                            (id_t)kernel->fork_kernel,
                                            nice) == 0)
                           ? 0
                           : -1;
        if (kernel->pid > 0 &&
            setpriority(PRIO_PGRP, (id_t)kernel->pid, nice) != 0)
                rc = -1;
        if (rc == 0 && kernel->inner_pid > 0 &&
            setpriority(PRIO_PGRP, (id_t)kernel->inner_pid, nice) != 0)
                rc = -1;
        /* Sandboxed without a known pid 1, the Python kernel's group is
         * out of reach: say so rather than leave it niced silently. */
        if (rc == 0 && kernel->pid > 0 && kernel->inner_pid <= 0 &&
            cq_sandbox_enabled(kernel->sandbox)) {
                errno = ESRCH;
                rc = -1;
        }
        return rc;
}

/* Whether the sandbox's pid 1 is known and still running: it is not our
 * child, so once it exited its pid may name another process group. */
static bool inner_alive(const cq_kernel_t *kernel)
{
        struct pollfd pfd;

        if (kernel->inner_pid <= 0 || kernel->inner_pidfd < 0)
                return false;
        pfd.fd = kernel->inner_pidfd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        return poll(&pfd, 1, 0) == 0;
}

void cq_kernel_kill(cq_kernel_t *kernel)
{
        if (!kernel || kernel->pid <= 0 || kernel->killed)
                return;
        if (kernel->forked) {
                if (forked_alive(kernel))
                        (void)setpriority(PRIO_PGRP, (id_t)kernel->pid, 19);
                kernel_kill_forked(kernel, SIGKILL);
                kernel->killed = true;
                return;
        }
        /* Lowest priority first: its exit is CPU spent in its name.
         * Raising niceness is always allowed. Our child's pid (and so
         * its group) stays ours until we kernel_reap it. */
        (void)setpriority(PRIO_PGRP, (id_t)kernel->pid, 19);
        if (inner_alive(kernel)) {
                (void)setpriority(PRIO_PGRP, (id_t)kernel->inner_pid, 19);
                syscall(SYS_pidfd_send_signal, kernel->inner_pidfd, SIGKILL,
                        NULL, 0U);
        }
        killpg(kernel->pid, SIGKILL);
        kernel->killed = true;
}
