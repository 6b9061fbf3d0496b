/* SPDX-License-Identifier: MIT */
/* kernel_proc.c - the kernel's processes: the connection file, spawning
 * (cold, sandboxed or not, or forked by the kernel server) with the
 * environment of kernel_env.c, and the teardown of its files; and the
 * handle's last error. Signals, renicing, reaping and the wait until the
 * sandbox's last process is gone are lproc.c's, shared with runners and
 * judges. */
#include "coderq/local/kernel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "kernel_int.h"

/* The descriptor of the kernel's child on which bubblewrap gets --info-fd. */
#define INFO_FD 3
/* bubblewrap's --file source of the matplotlibrc (sandboxed kernels) */
#define MPLRC_FD 4

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
        struct pollfd pfd = {kernel->proc.pidfd, POLLIN, 0};
        struct stat st, host;
        char path[64];
        int fd;

        snprintf(path, sizeof(path), "/proc/%ld/root/tmp",
                 (long)kernel->proc.pid);
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
        lproc_kill(&kernel->proc);
        kernel->warm_in_kernel = false;
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
        lproc_forked_from(&kernel->proc, &child);
        kernel->warm_in_kernel = req.warm != NULL;
        return 0;
}

void kernel_close_sockets(cq_kernel_t *kernel)
{
        cq_zmtp_destroy(&kernel->shell);
        cq_zmtp_destroy(&kernel->control);
        cq_zmtp_destroy(&kernel->iopub);
}

/* SIGKILL the process group and the sandbox, reap it, wait until the
 * sandbox's processes are gone (lproc_kill()), close sockets, remove the
 * files. */
void kernel_teardown(cq_kernel_t *kernel)
{
        char name[16];
        int port;

        lproc_kill(&kernel->proc);
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
        lproc_child_begin();
        child_fds(sp);
        lproc_child_exec(kernel->sandbox, &kernel->id, kernel->work_dir,
                         kernel->nice, parent, sp->argv, sp->envp);
}

/* Start the kernel ourselves: fork, and exec it (in bubblewrap when
 * sandboxed) in a process group of its own. */
static int spawn_cold(cq_kernel_t *kernel, spawn_t *sp)
{
        pid_t parent = getpid(), pid;

        if (kernel_write_conn_file(kernel))
                return -1;
        pid = lproc_fork(&kernel->proc);
        if (pid < 0) {
                kernel_set_error(kernel, "could not fork: %s", strerror(errno));
                return -1;
        }
        if (pid == 0)
                exec_child(kernel, sp, parent);
        kernel->proc.info_fd = sp->info[0];
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

int cq_kernel_renice(cq_kernel_t *kernel, int nice)
{
        kernel->nice = nice;
        return lproc_renice(&kernel->proc, cq_sandbox_enabled(kernel->sandbox),
                            nice);
}

void cq_kernel_kill(cq_kernel_t *kernel)
{
        if (kernel)
                lproc_kill_low(&kernel->proc);
}
