/* SPDX-License-Identifier: MIT */
/* kserver.c - the client of the forking kernel server (kserver.py, built
 * in as cq_kserver_py): starts the server, probes it, asks it for
 * kernels over a socketpair, restarts it with backoff when it dies,
 * wedges or talks nonsense. Each message is one SOCK_SEQPACKET datagram
 * of JSON of at most CQ_KSERVER_MSG_MAX bytes; descriptors go as
 * SCM_RIGHTS. The design is in docs/internals/protocols/kernel-server.md. */
#include "coderq/local/kserver.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/local/kernel_env.h"
#include "coderq/local/workdir.h"
#include "kserver_int.h"

#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS   60000
/* A probe child runs the whole confinement, then exits. */
#define PROBE_TIMEOUT_MS 15000

typedef enum state {
        KS_NONE = 0, /* no process: start one at retry_at */
        KS_STARTING, /* started, its ready message not read yet */
        KS_READY,
} state_t;

struct cq_kserver {
        pthread_mutex_t lock; /* guards everything below it */
        state_t state;
        pid_t pid;
        int pidfd;
        int sock;
        int64_t started_at, retry_at, backoff_ms;
        cq_kserver_stats_t stats;
        char dir[PATH_MAX]; /* the current server's own dir */
        /* read-only after cq_kserver_new() */
        bool enabled;
        bool light; /* runners and judges only (cq_kserver_opts_t) */
        char *python, *preload, *work_root;
        int64_t start_ms, reply_ms;
        /* The life pipe: its write end lives as long as this handle (and
         * this process), so every forked kernel's outer process sees
         * POLLHUP on the read end and kills its kernel when we are gone,
         * whichever server forked it. */
        int life_r, life_w;
        int kinit_fd; /* a sealed memfd of kinit/kinit.c, or -1 */
        char reason[600];
};

int cq_kserver_mode_parse(const char *s, cq_kserver_mode_t *mp)
{
        cq_sandbox_mode_t m;

        /* the same three words as CODERQ_SANDBOX */
        if (cq_sandbox_mode_parse(s, &m))
                return -1;
        *mp = m == CQ_SANDBOX_ON    ? CQ_KSERVER_ON
              : m == CQ_SANDBOX_OFF ? CQ_KSERVER_OFF
                                    : CQ_KSERVER_AUTO;
        return 0;
}

int cq_kserver_opts_from_config(cq_kserver_opts_t *opts,
                                const cq_config_t *cfg,
                                const cq_sandbox_t *sandbox)
{
        memset(opts, 0, sizeof(*opts));
        opts->python = cfg->python;
        opts->preload = cfg->kernel_preload;
        opts->work_root = cfg->work_root;
        opts->sandbox = sandbox;
        opts->start_timeout_ms = cfg->kernel_startup_timeout_s * 1000;
        return cq_kserver_mode_parse(
            cfg->kernel_server ? cfg->kernel_server : "auto", &opts->mode);
}

bool cq_kserver_enabled(const cq_kserver_t *ks) { return ks && ks->enabled; }

const char *cq_kserver_python(const cq_kserver_t *ks)
{
        return ks ? ks->python : "";
}

const char *cq_kserver_reason(const cq_kserver_t *ks)
{
        return ks ? ks->reason : "kernel server off";
}

/* ---- the protocol ---- */

static int get_pid(json_t *reply,
                   const char *key,
                   pid_t *out,
                   char *errstr,
                   size_t errstr_size)
{
        json_t *v = json_object_get(reply, key);
        json_int_t n;

        if (!json_is_integer(v)) {
                cq_errstr_set(errstr, errstr_size,
                              "reply has no integer \"%s\"", key);
                return -1;
        }
        n = json_integer_value(v);
        if (n <= 1 || n > INT32_MAX) {
                cq_errstr_set(errstr, errstr_size, "reply has \"%s\" %lld", key,
                              (long long)n);
                return -1;
        }
        *out = (pid_t)n;
        return 0;
}

int cq_kserver_reply_parse(const char *data,
                           size_t len,
                           int nfds,
                           bool probe,
                           cq_kserver_reply_t *reply,
                           char *errstr,
                           size_t errstr_size)
{
        json_t *root = NULL, *ok, *v;
        json_error_t jerr;
        int rc = -1;

        memset(reply, 0, sizeof(*reply));
        reply->status = -1;
        if (len == 0 || len > CQ_KSERVER_MSG_MAX) {
                cq_errstr_set(errstr, errstr_size, "reply of %zu bytes", len);
                goto out;
        }
        root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(root)) {
                cq_errstr_set(errstr, errstr_size,
                              "reply is not a JSON object%s%s",
                              root ? "" : ": ", root ? "" : jerr.text);
                goto out;
        }
        ok = json_object_get(root, "ok");
        if (!json_is_boolean(ok)) {
                cq_errstr_set(errstr, errstr_size,
                              "reply has no boolean \"ok\"");
                goto out;
        }
        reply->ok = json_is_true(ok);
        if (!reply->ok) {
                v = json_object_get(root, "error");
                if (!json_is_string(v) || nfds != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "refusal without a reason, or with "
                                      "descriptors");
                        goto out;
                }
                snprintf(reply->error, sizeof(reply->error), "%s",
                         json_string_value(v));
                rc = 0;
                goto out;
        }
        if (get_pid(root, "pid", &reply->pid, errstr, errstr_size) ||
            get_pid(root, "outer", &reply->outer, errstr, errstr_size) ||
            (json_object_get(root, "kernel") &&
             get_pid(root, "kernel", &reply->kernel, errstr, errstr_size)))
                goto out;
        if (probe) {
                v = json_object_get(root, "status");
                if (!json_is_integer(v) || json_integer_value(v) < -255 ||
                    json_integer_value(v) > 255 || nfds != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "probe reply without a status, or with "
                                      "descriptors");
                        goto out;
                }
                reply->status = (int)json_integer_value(v);
        } else if (nfds != 2) {
                cq_errstr_set(errstr, errstr_size,
                              "reply came with %d descriptors, not 2", nfds);
                goto out;
        }
        rc = 0;
out:
        json_decref(root);
        return rc;
}

/* The most descriptors a request carries: a runner's or a judge's 0-3. */
#define REQ_FDS_MAX 4

/* Send \p text with the \p nfds descriptors \p fds as one datagram. */
static int send_msg(int sock, const char *text, const int *fds, int nfds)
{
        union {
                char buf[CMSG_SPACE(REQ_FDS_MAX * sizeof(int))];
                struct cmsghdr align;
        } u;
        struct iovec iov;
        struct msghdr mh;
        ssize_t n;

        /* sendmsg() does not write through iov_base */
        iov.iov_base = (void *)(uintptr_t)text;
        iov.iov_len = strlen(text);
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        if (nfds > 0 && nfds <= REQ_FDS_MAX) {
                struct cmsghdr *c;

                memset(&u, 0, sizeof(u));
                mh.msg_control = u.buf;
                mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
                c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
                memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
        }
        do
                n = sendmsg(sock, &mh, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        return n == (ssize_t)iov.iov_len ? 0 : -1;
}

/* Wait up to \p ms for one datagram: its length, or -1 with \p errstr
 * (timeout, the server gone, too large). Descriptors that came with it go
 * to \p fds (at most 2; more, or a cut control message, is an error and
 * closes them all). */
static ssize_t recv_msg(int sock,
                        char *buf,
                        size_t size,
                        int64_t ms,
                        int *fds,
                        int *nfdsp,
                        char *errstr,
                        size_t errstr_size)
{
        union {
                char buf[CMSG_SPACE(4 * sizeof(int))];
                struct cmsghdr align;
        } u;
        struct pollfd pfd = {sock, POLLIN, 0};
        int64_t until = cq_now_ms() + ms, left;
        struct iovec iov = {buf, size};
        struct msghdr mh;
        struct cmsghdr *c;
        int got[4], ngot = 0, i, r = 0;
        ssize_t n;

        *nfdsp = 0;
        while ((left = until - cq_now_ms()) > 0 &&
               (r = poll(&pfd, 1, (int)left)) < 0 && errno == EINTR)
                ;
        if (r <= 0) {
                cq_errstr_set(errstr, errstr_size, "no reply within %lld ms",
                              (long long)ms);
                return -1;
        }
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof(u.buf);
        do
                n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        for (c = CMSG_FIRSTHDR(&mh); n >= 0 && c; c = CMSG_NXTHDR(&mh, c)) {
                size_t k;

                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                for (k = 0;
                     k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && ngot < 4;
                     k++)
                        memcpy(&got[ngot++], CMSG_DATA(c) + k * sizeof(int),
                               sizeof(int));
        }
        if (n < 0 || n == 0 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
            ngot > 2) {
                if (n < 0)
                        cq_errstr_set(errstr, errstr_size, "could not read: %s",
                                      strerror(errno));
                else if (n == 0)
                        cq_errstr_set(errstr, errstr_size,
                                      "it closed the socket");
                else
                        cq_errstr_set(errstr, errstr_size,
                                      "reply larger than %zu bytes or with too "
                                      "many descriptors",
                                      size);
                for (i = 0; i < ngot; i++)
                        close(got[i]);
                return -1;
        }
        for (i = 0; i < ngot; i++)
                fds[i] = got[i];
        *nfdsp = ngot;
        return n;
}

/* ---- the server process ---- */

/* The last bytes of the log \p name in \p dir, for reasons. */
static void log_tail(const char *dir, const char *name, char *out, size_t size)
{
        char path[PATH_MAX + 16], buf[300];
        ssize_t n;
        off_t end;
        int fd;
        size_t i;

        out[0] = '\0';
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
                return;
        end = lseek(fd, 0, SEEK_END);
        lseek(fd,
              end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0,
              SEEK_SET);
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return;
        buf[n] = '\0';
        for (i = 0; i < (size_t)n; i++)
                if (buf[i] == '\n' || buf[i] == '\r')
                        buf[i] = ' ';
        snprintf(out, size, "; %s: ...%s", name, buf);
}

/* Kill and reap the current server process, close its socket, remove
 * its dir. Under lock. */
static void server_stop(cq_kserver_t *ks)
{
        if (ks->sock >= 0)
                close(ks->sock);
        ks->sock = -1;
        if (ks->pid > 0) {
                kill(ks->pid, SIGKILL);
                while (waitpid(ks->pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        }
        ks->pid = -1;
        if (ks->pidfd >= 0)
                close(ks->pidfd);
        ks->pidfd = -1;
        if (ks->dir[0])
                cq_work_dir_remove(ks->dir);
        ks->dir[0] = '\0';
        ks->state = KS_NONE;
        ks->stats.import_ms = -1;
        ks->stats.app_prepared = false;
}

/* Write all \p len bytes of \p buf to \p fd. Returns 0, -1 (errno). */
static int write_all(int fd, const void *buf, size_t len)
{
        size_t off = 0;

        while (off < len) {
                ssize_t n = write(fd, (const char *)buf + off, len - off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        if (n == 0)
                                errno = EIO;
                        return -1;
                }
                off += (size_t)n;
        }
        return 0;
}

/* kinit/kinit.c's program in a sealed memfd, for the server to run (fd 5 in
 * it): -1 when that cannot be, and the server builds sandboxed kernels'
 * outer process and pid 1 by forking itself instead. */
static int kinit_memfd(void)
{
        int fd = memfd_create("coderq-kinit", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        if (fd < 0 || write_all(fd, cq_kinit_elf, cq_kinit_elf_len) != 0)
                goto fail;
        if (fchmod(fd, 0500) != 0 || fcntl(fd, F_ADD_SEALS,
                                           F_SEAL_WRITE | F_SEAL_SHRINK |
                                               F_SEAL_GROW | F_SEAL_SEAL) != 0)
                goto fail;
        return fd;
fail:
        cq_log_kv(CQ_LOG_WARN,
                  "kernel server: sandboxed kernels' pid 1 is forked instead",
                  "reason", strerror(errno ? errno : EIO), NULL);
        if (fd >= 0)
                close(fd);
        return -1;
}

/* Bytes of the server's environment block beyond a kernel's fixed part:
 * each forked kernel writes its own environment over the block, which is
 * what /proc/PID/environ shows (kserver.py set_environ()), and a kernel's
 * is longer than the server's (its run dir's subdirectories, the parent's
 * pid). */
#define ENV_ROOM 1024

/* \p envp (taken) with a last entry CQ_ENV_ROOM=xxx... of ENV_ROOM
 * bytes; NULL when out of memory (\p envp freed). */
static char **with_env_room(char **envp)
{
        size_t n = 0;
        char **more, *room;

        while (envp && envp[n])
                n++;
        more = envp ? realloc(envp, (n + 2) * sizeof(*envp)) : NULL;
        room = malloc(ENV_ROOM + 1);
        if (!more || !room) {
                free(room);
                cq_sandbox_argv_free(more ? more : envp);
                return NULL;
        }
        memcpy(room, "CQ_ENV_ROOM=", 12);
        memset(room + 12, 'x', ENV_ROOM - 12);
        room[ENV_ROOM] = '\0';
        more[n] = room;
        more[n + 1] = NULL;
        return more;
}

/* The server's program, kserver.py, goes in on this descriptor, read
 * by a short -c program: on the command line ps would show all of it. */
#define PROGRAM_FD   6
#define PROGRAM_BOOT "exec(compile(open(6, 'rb').read(), 'kserver.py', 'exec'))"

/* Empty arguments after the server's own: the bytes of its argv block a
 * forked kernel writes its command line over (kserver.py set_cmdline()),
 * one NUL each, nothing for ps to show. */
#define ARGV_ROOM 4096

/* kserver.py in an unnamed file at offset 0, for PROGRAM_FD; -1 (errno)
 * when that cannot be. A new one per start: the server's read moves the
 * offset it shares. */
static int program_memfd(void)
{
        int fd = memfd_create("coderq-kserver", MFD_CLOEXEC);

        if (fd < 0)
                return -1;
        if (write_all(fd, cq_kserver_py, strlen(cq_kserver_py)) != 0 ||
            lseek(fd, 0, SEEK_SET) != 0) {
                int e = errno;

                close(fd);
                errno = e;
                return -1;
        }
        return fd;
}

/* The server's argv: python -s -c PROGRAM_BOOT, its fds and settings,
 * ARGV_ROOM empty strings; NULL when out of memory. The strings are
 * borrowed (execve() does not write through them); free() the array. */
static char **server_argv(cq_kserver_t *ks)
{
        /* -s: no user site dir, as a cold kernel has none (-P would
         * leave the '' a forked kernel's start removes) */
        const char *const fixed[] = {ks->python,
                                     "-s",
                                     "-c",
                                     PROGRAM_BOOT,
                                     "3",
                                     "4",
                                     ks->preload,
                                     cq_kernel_mpl_rc,
                                     ks->kinit_fd >= 0 ? "5" : "-1",
                                     ks->light ? "light" : "kernels"};
        size_t n = CQ_ARRAY_SIZE(fixed), i;
        char **argv = calloc(n + ARGV_ROOM + 1, sizeof(*argv));

        if (!argv)
                return NULL;
        for (i = 0; i < n; i++)
                argv[i] = (char *)(uintptr_t)fixed[i];
        for (; i < n + ARGV_ROOM; i++)
                argv[i] = (char *)(uintptr_t) "";
        return argv;
}

/* Start a server process; its ready message is read later. Under lock. */
static int server_start(cq_kserver_t *ks, char *errstr, size_t errstr_size)
{
        char logpath[PATH_MAX + 16], err[300];
        char **argv = server_argv(ks), **envp = NULL;
        int sv[2] = {-1, -1}, logfd = -1, nullfd = -1, progfd = -1, rc = -1;
        pid_t pid;

        if (cq_work_dir_new(ks->work_root, ks->dir, sizeof(ks->dir), err,
                            sizeof(err))) {
                ks->dir[0] = '\0';
                cq_errstr_set(errstr, errstr_size, "%s", err);
                goto out;
        }
        snprintf(logpath, sizeof(logpath), "%s/server.log", ks->dir);
        logfd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        /* The fixed part of a kernel's environment, so that what Python
         * reads at start-up (UTF-8 mode, stdio encoding, no bytecode
         * writing) is what a cold kernel gets; its own dirs for
         * matplotlib's font list and IPython; nothing of ours. */
        envp = with_env_room(cq_kernel_environ(ks->dir, ks->dir, false, 0));
        progfd = program_memfd();
        if (logfd < 0 || nullfd < 0 || !envp || !argv || progfd < 0 ||
            socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
                cq_errstr_set(errstr, errstr_size, "could not prepare: %s",
                              strerror(errno ? errno : ENOMEM));
                goto out;
        }
        pid = fork();
        if (pid < 0) {
                cq_errstr_set(errstr, errstr_size, "could not fork: %s",
                              strerror(errno));
                goto out;
        }
        if (pid == 0) {
                sigset_t none;
                int s, l, k, p, tty;

                /* Only async-signal-safe calls until execve(). A group of
                 * its own, no terminal (as kernel.c's spawn()). */
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                setpgid(0, 0);
                tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
                if (tty >= 0) {
                        ioctl(tty, TIOCNOTTY);
                        close(tty);
                }
                s = fcntl(sv[1], F_DUPFD, 10);
                l = fcntl(ks->life_r, F_DUPFD, 10);
                k = ks->kinit_fd >= 0 ? fcntl(ks->kinit_fd, F_DUPFD, 10) : -1;
                p = fcntl(progfd, F_DUPFD, 10);
                if (s < 0 || l < 0 || (ks->kinit_fd >= 0 && k < 0) || p < 0 ||
                    dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 ||
                    dup2(logfd, 2) < 0 || dup2(s, 3) < 0 || dup2(l, 4) < 0 ||
                    (k >= 0 && dup2(k, 5) < 0) || dup2(p, PROGRAM_FD) < 0)
                        _exit(126);
                if (k < 0)
                        close(5);
                syscall(SYS_close_range, PROGRAM_FD + 1U, ~0U, 0U);
                if (chdir(ks->dir) != 0)
                        _exit(126);
                execve(argv[0], argv, envp);
                _exit(127);
        }
        (void)setpgid(pid, pid);
        ks->pid = pid;
        ks->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        ks->sock = sv[0];
        sv[0] = -1;
        ks->state = KS_STARTING;
        ks->started_at = cq_now_ms();
        rc = 0;
out:
        if (sv[0] >= 0)
                close(sv[0]);
        if (sv[1] >= 0)
                close(sv[1]);
        if (logfd >= 0)
                close(logfd);
        if (nullfd >= 0)
                close(nullfd);
        if (progfd >= 0)
                close(progfd);
        free(argv);
        cq_sandbox_argv_free(envp);
        if (rc && ks->dir[0]) {
                cq_work_dir_remove(ks->dir);
                ks->dir[0] = '\0';
        }
        return rc;
}

/* Read the ready message, waiting up to \p ms: 0 ready, 1 not yet, -1
 * failed (\p errstr). Under lock. */
static int
server_ready(cq_kserver_t *ks, int64_t ms, char *errstr, size_t errstr_size)
{
        char buf[CQ_KSERVER_MSG_MAX + 1], err[300], tail[340];
        json_t *msg = NULL, *failed;
        int fds[2], nfds = 0, rc = -1, i;
        struct pollfd pfd = {ks->sock, POLLIN, 0};
        json_int_t threads;
        ssize_t n;

        if (ms <= 0 && poll(&pfd, 1, 0) == 0) {
                if (cq_now_ms() - ks->started_at < ks->start_ms)
                        return 1;
                cq_errstr_set(errstr, errstr_size,
                              "the kernel server was not ready in %lld ms",
                              (long long)ks->start_ms);
                return -1;
        }
        n = recv_msg(ks->sock, buf, sizeof(buf) - 1, ms > 0 ? ms : 1, fds,
                     &nfds, err, sizeof(err));
        for (i = 0; i < nfds; i++)
                close(fds[i]);
        if (n < 0) {
                log_tail(ks->dir, "server.log", tail, sizeof(tail));
                cq_errstr_set(errstr, errstr_size,
                              "the kernel server did not start: %.200s%.300s",
                              err, tail);
                goto out;
        }
        msg = json_loadb(buf, (size_t)n, 0, NULL);
        threads = json_integer_value(json_object_get(msg, "threads"));
        if (!json_is_true(json_object_get(msg, "ready")) || nfds) {
                cq_errstr_set(errstr, errstr_size,
                              "the kernel server sent no ready message");
                goto out;
        }
        if (threads != 1) {
                /* A module that starts a thread on import: every fork
                 * would lose it. Found, not assumed. */
                cq_errstr_set(
                    errstr, errstr_size,
                    "the kernel server has %lld threads after its "
                    "imports (CODERQ_KERNEL_PRELOAD=%s); forking needs "
                    "exactly 1",
                    (long long)threads, ks->preload);
                goto out;
        }
        failed = json_object_get(msg, "failed");
        if (json_is_array(failed) && json_array_size(failed) > 0) {
                /* A preload module that is missing, or a part of the
                 * kernels' start-up that could not be done once: the
                 * kernels do it themselves, as cold ones do. */
                char *list = json_dumps(failed, JSON_COMPACT);

                cq_log_kv(CQ_LOG_WARN,
                          "kernel server: not prepared before the fork",
                          "failed", list ? list : "?", NULL);
                free(list);
        }
        ks->stats.import_ms =
            json_integer_value(json_object_get(msg, "import_ms"));
        ks->stats.app_prepared = json_is_true(json_object_get(msg, "app"));
        ks->state = KS_READY;
        rc = 0;
out:
        json_decref(msg);
        return rc;
}

/* The server misbehaved or died: stop it, start again after a doubling
 * delay. Under lock. */
static void server_failed(cq_kserver_t *ks, const char *why)
{
        char retry[32];

        snprintf(retry, sizeof(retry), "%lld", (long long)ks->backoff_ms);
        cq_log_kv(CQ_LOG_WARN,
                  "kernel server failed; kernels start cold until it is "
                  "back",
                  "error", why, "retry_in_ms", retry, NULL);
        server_stop(ks);
        ks->retry_at = cq_now_ms() + ks->backoff_ms;
        ks->backoff_ms = ks->backoff_ms * 2 > BACKOFF_MAX_MS
                             ? BACKOFF_MAX_MS
                             : ks->backoff_ms * 2;
}

/* ---- requests ---- */

static char *
build_request(const char *op, const cq_kserver_req_t *req, const char *program)
{
        json_t *msg = NULL, *argv, *env;
        size_t mem = 0, fsize = 0, tmp = 0, shm = 0, i;
        long nproc = 0;
        char *text = NULL;

        if (req->sandbox) {
                cq_sandbox_limits(req->sandbox, &mem, &nproc, &fsize);
                cq_sandbox_tmpfs(req->sandbox, &tmp, &shm);
        }
        argv = json_array();
        env = json_array();
        for (i = 0; argv && req->argv && req->argv[i]; i++)
                json_array_append_new(argv, json_string(req->argv[i]));
        for (i = 0; env && req->envp && req->envp[i]; i++)
                json_array_append_new(env, json_string(req->envp[i]));
        msg = json_pack(
            "{s:s, s:s, s:o, s:o, s:I, s:I, s:b, s:b, s:I, s:I, s:I, s:i, s:I, "
            "s:I}",
            "op", op, "work_dir", req->work_dir, "argv", argv, "env", env,
            "uid", (json_int_t)(req->id ? req->id->uid : geteuid()), "gid",
            (json_int_t)(req->id ? req->id->gid : getegid()), "drop",
            req->id && req->id->drop, "sandbox",
            cq_sandbox_enabled(req->sandbox), "mem", (json_int_t)mem, "nproc",
            (json_int_t)nproc, "fsize", (json_int_t)fsize, "nice", req->nice,
            "tmp", (json_int_t)tmp, "shm", (json_int_t)shm);
        if (msg && req->mplrc &&
            (strlen(req->mplrc) > CQ_KSERVER_MPLRC_MAX ||
             json_object_set_new(msg, "mplrc", json_string(req->mplrc)))) {
                json_decref(msg);
                msg = NULL;
        }
        if (msg && program &&
            json_object_set_new(msg, "program", json_string(program))) {
                json_decref(msg);
                msg = NULL;
        }
        if (msg && program && req->preload &&
            json_object_set_new(msg, "preload", json_string(req->preload))) {
                json_decref(msg);
                msg = NULL;
        }
        if (msg && req->warm && req->warm_out &&
            (json_object_set_new(msg, "warm", json_string(req->warm)) ||
             json_object_set_new(msg, "warm_out",
                                 json_string(req->warm_out)))) {
                json_decref(msg);
                msg = NULL;
        }
        if (msg)
                text = json_dumps(msg, JSON_COMPACT);
        json_decref(msg);
        if (text && strlen(text) > CQ_KSERVER_MSG_MAX) {
                free(text);
                text = NULL;
        }
        return text;
}

/* One request and its reply, under lock. A server that does not answer
 * in time or answers nonsense is failed. 0 with \p reply (which may be a
 * refusal), or -1. */
static int transact(cq_kserver_t *ks,
                    const char *op,
                    const cq_kserver_req_t *req,
                    const char *program,
                    const int *req_fds,
                    int req_nfds,
                    int64_t reply_ms,
                    cq_kserver_reply_t *reply,
                    int *fds,
                    char *errstr,
                    size_t errstr_size)
{
        char buf[CQ_KSERVER_MSG_MAX + 1], err[300], why[420];
        char *text = build_request(op, req, program);
        bool probe = strcmp(op, "probe") == 0;
        int nfds = 0, i;
        ssize_t n;

        if (!text) {
                cq_errstr_set(errstr, errstr_size,
                              "could not build the request: out of memory, "
                              "larger than %d bytes, or a matplotlibrc over "
                              "%d",
                              CQ_KSERVER_MSG_MAX, CQ_KSERVER_MPLRC_MAX);
                return -1;
        }
        if (send_msg(ks->sock, text, req_fds, req_nfds) != 0) {
                snprintf(why, sizeof(why), "could not send: %s",
                         strerror(errno));
                goto failed;
        }
        n = recv_msg(ks->sock, buf, sizeof(buf) - 1, reply_ms, fds, &nfds, err,
                     sizeof(err));
        if (n < 0) {
                snprintf(why, sizeof(why), "%s", err);
                goto failed;
        }
        if (cq_kserver_reply_parse(buf, (size_t)n, nfds, probe, reply, err,
                                   sizeof(err))) {
                for (i = 0; i < nfds; i++)
                        close(fds[i]);
                snprintf(why, sizeof(why), "malformed reply: %s", err);
                goto failed;
        }
        free(text);
        return 0;
failed:
        free(text);
        cq_errstr_set(errstr, errstr_size, "kernel server: %s", why);
        server_failed(ks, why);
        return -1;
}

/* The server is ready, or is made so when it may be. Under lock. */
static int ensure_ready(cq_kserver_t *ks, char *errstr, size_t errstr_size)
{
        char err[600];
        int r;

        if (ks->state == KS_READY && ks->pidfd >= 0) {
                struct pollfd pfd = {ks->pidfd, POLLIN, 0};

                if (poll(&pfd, 1, 0) > 0) {
                        server_failed(ks, "the server process exited");
                        cq_errstr_set(errstr, errstr_size,
                                      "kernel server exited; restarting");
                        return -1;
                }
        }
        if (ks->state == KS_NONE) {
                if (cq_now_ms() < ks->retry_at) {
                        cq_errstr_set(errstr, errstr_size,
                                      "kernel server restarts in %lld ms",
                                      (long long)(ks->retry_at - cq_now_ms()));
                        return -1;
                }
                ks->stats.restarts++;
                if (server_start(ks, err, sizeof(err))) {
                        server_failed(ks, err);
                        cq_errstr_set(
                            errstr, errstr_size,
                            "could not restart the kernel server: %.400s", err);
                        return -1;
                }
        }
        if (ks->state == KS_STARTING) {
                r = server_ready(ks, 0, err, sizeof(err));
                if (r < 0) {
                        server_failed(ks, err);
                        cq_errstr_set(errstr, errstr_size, "%s", err);
                        return -1;
                }
                if (r > 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "kernel server still starting");
                        return -1;
                }
                cq_log_info("kernel server ready again");
        }
        return 0;
}

/* One child of \p op ("spawn": a kernel, its log in \p req; "runner",
 * "judge": \p program with \p req_fds as its 0-3). Only kernels count in
 * the stats. */
static int fork_child(cq_kserver_t *ks,
                      const char *op,
                      const cq_kserver_req_t *req,
                      const char *program,
                      const int *req_fds,
                      int req_nfds,
                      cq_kserver_child_t *child,
                      char *errstr,
                      size_t errstr_size)
{
        cq_kserver_reply_t reply;
        int fds[2] = {-1, -1}, rc = -1;
        bool kernel = strcmp(op, "spawn") == 0;

        child->pid = -1;
        child->pidfd = -1;
        child->kernel = 0;
        if (!cq_kserver_enabled(ks)) {
                cq_errstr_set(errstr, errstr_size, "kernel server off: %s",
                              cq_kserver_reason(ks));
                return -1;
        }
        pthread_mutex_lock(&ks->lock);
        if (ensure_ready(ks, errstr, errstr_size) ||
            transact(ks, op, req, program, req_fds, req_nfds, ks->reply_ms,
                     &reply, fds, errstr, errstr_size))
                goto out;
        if (!reply.ok) {
                cq_errstr_set(errstr, errstr_size,
                              "the kernel server refused: %s", reply.error);
                /* Threads appeared: no later fork is safe either. */
                if (strstr(reply.error, "threads"))
                        server_failed(ks, reply.error);
                goto out;
        }
        /* fds[0] is on pid, fds[1] on the outer process, which exits with
         * it: only the first is kept. */
        close(fds[1]);
        child->pid = reply.pid;
        child->pidfd = fds[0];
        child->kernel = reply.kernel;
        ks->stats.forked += kernel;
        ks->backoff_ms = BACKOFF_FIRST_MS;
        rc = 0;
out:
        if (rc)
                ks->stats.refused += kernel;
        pthread_mutex_unlock(&ks->lock);
        return rc;
}

int cq_kserver_spawn(cq_kserver_t *ks,
                     const cq_kserver_req_t *req,
                     cq_kserver_child_t *child,
                     char *errstr,
                     size_t errstr_size)
{
        return fork_child(ks, "spawn", req, NULL, &req->log_fd, 1, child,
                          errstr, errstr_size);
}

int cq_kserver_run(cq_kserver_t *ks,
                   const char *op,
                   const cq_kserver_req_t *req,
                   const char *program,
                   const int fds[4],
                   cq_kserver_child_t *child,
                   char *errstr,
                   size_t errstr_size)
{
        return fork_child(ks, op, req, program, fds, 4, child, errstr,
                          errstr_size);
}

/* The probe: one child confined as a kernel of \p sandbox would be, as a
 * uid leased as for a kernel, in a work dir of its own, which exits 0
 * once all of it is in place. Under lock (or before anyone else can
 * have the handle). */
static int probe(cq_kserver_t *ks,
                 const cq_sandbox_t *sandbox,
                 char *errstr,
                 size_t errstr_size)
{
        static const char *const env[] = {"PATH=/usr/bin:/bin", NULL};
        static const char *const argv[] = {NULL};
        cq_sandbox_id_t id = CQ_SANDBOX_ID_INIT;
        cq_kserver_req_t req;
        cq_kserver_reply_t reply;
        char dir[PATH_MAX], path[PATH_MAX + 16], err[400], tail[340];
        int fds[2], logfd = -1, rc = -1;

        dir[0] = '\0';
        if (cq_sandbox_id_acquire(sandbox, &id, err, sizeof(err)) ||
            cq_work_dir_new(ks->work_root, dir, sizeof(dir), err,
                            sizeof(err))) {
                dir[0] = '\0';
                cq_errstr_set(errstr, errstr_size, "probe: %s", err);
                goto out;
        }
        snprintf(path, sizeof(path), "%s/probe.log", dir);
        if (cq_sandbox_own(&id, dir) ||
            (logfd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                          0600)) < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "probe: could not prepare: %s", strerror(errno));
                goto out;
        }
        memset(&req, 0, sizeof(req));
        req.work_dir = dir;
        req.argv = argv;
        req.envp = env;
        req.sandbox = sandbox;
        req.id = &id;
        req.log_fd = logfd;
        if (transact(ks, "probe", &req, NULL, &logfd, 1, PROBE_TIMEOUT_MS,
                     &reply, fds, err, sizeof(err))) {
                cq_errstr_set(errstr, errstr_size, "probe: %s", err);
                goto out;
        }
        if (!reply.ok || reply.status != 0) {
                log_tail(dir, "probe.log", tail, sizeof(tail));
                snprintf(
                    errstr, errstr_size,
                    "probe: a forked child confined as a kernel%s %s%.200s "
                    "(status %d)%.300s",
                    cq_sandbox_enabled(sandbox) ? " in its own namespaces" : "",
                    reply.ok ? "did not exit 0" : "could not start: ",
                    reply.ok ? "" : reply.error, reply.status, tail);
                goto out;
        }
        rc = 0;
out:
        if (logfd >= 0)
                close(logfd);
        if (dir[0])
                cq_work_dir_remove(dir);
        cq_sandbox_id_release(&id);
        return rc;
}

cq_kserver_t *
cq_kserver_new(const cq_kserver_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_kserver_t *ks = calloc(1, sizeof(*ks));
        char err[600];
        int life[2];

        if (!ks) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create the kernel server: out of "
                              "memory");
                return NULL;
        }
        pthread_mutex_init(&ks->lock, NULL);
        ks->pid = -1;
        ks->pidfd = ks->sock = ks->life_r = ks->life_w = ks->kinit_fd = -1;
        ks->stats.import_ms = -1;
        ks->backoff_ms = BACKOFF_FIRST_MS;
        ks->start_ms =
            opts->start_timeout_ms > 0 ? opts->start_timeout_ms : 60000;
        ks->reply_ms =
            opts->reply_timeout_ms > 0 ? opts->reply_timeout_ms : 10000;
        ks->python = strdup(opts->python ? opts->python : "/usr/bin/python3");
        ks->light = opts->light;
        ks->preload = strdup(opts->preload ? opts->preload
                             : opts->light ? CQ_KSERVER_LIGHT_PRELOAD
                                           : CQ_KSERVER_PRELOAD_DEFAULT);
        ks->work_root = opts->work_root ? strdup(opts->work_root) : NULL;
        if (!ks->python || !ks->preload ||
            (opts->work_root && !ks->work_root)) {
                snprintf(ks->reason, sizeof(ks->reason), "out of memory");
                goto fail;
        }
        if (opts->mode == CQ_KSERVER_OFF) {
                snprintf(ks->reason, sizeof(ks->reason),
                         "kernel server off (CODERQ_KERNEL_SERVER=off)");
                return ks;
        }
        if (pipe2(life, O_CLOEXEC) != 0) {
                snprintf(ks->reason, sizeof(ks->reason),
                         "could not create a pipe: %s", strerror(errno));
                goto fail;
        }
        ks->life_r = life[0];
        ks->life_w = life[1];
        ks->kinit_fd = kinit_memfd();
        if (server_start(ks, err, sizeof(err)) ||
            server_ready(ks, ks->start_ms, err, sizeof(err)) ||
            probe(ks, opts->sandbox, err, sizeof(err))) {
                snprintf(ks->reason, sizeof(ks->reason), "%s", err);
                server_stop(ks);
                if (opts->mode == CQ_KSERVER_ON)
                        goto fail;
                cq_log_kv(CQ_LOG_WARN,
                          ks->light ? "runner server off: every runner and "
                                      "judge starts cold"
                                    : "kernel server off: every kernel "
                                      "starts cold",
                          "reason", ks->reason, NULL);
                return ks;
        }
        ks->enabled = true;
        {
                char ms[32];

                snprintf(ms, sizeof(ms), "%lld",
                         (long long)ks->stats.import_ms);
                cq_log_kv(CQ_LOG_INFO,
                          ks->light ? "runner server ready: runners and "
                                      "judges are forked from it"
                                    : "kernel server ready: kernels are "
                                      "forked from it",
                          "preload", ks->preload, "import_ms", ms, NULL);
        }
        return ks;
fail:
        cq_errstr_set(
            errstr, errstr_size, "could not start the kernel server%s: %s",
            opts->mode == CQ_KSERVER_ON ? " (CODERQ_KERNEL_SERVER=on)" : "",
            ks->reason);
        cq_kserver_destroy(&ks);
        return NULL;
}

int cq_kserver_wait(cq_kserver_t *ks, int64_t timeout_ms)
{
        int64_t until = cq_now_ms() + timeout_ms;
        char err[600];
        int rc;

        if (!cq_kserver_enabled(ks))
                return -1;
        for (;;) {
                struct timespec ts = {0, 50 * 1000 * 1000};

                pthread_mutex_lock(&ks->lock);
                rc = ensure_ready(ks, err, sizeof(err));
                pthread_mutex_unlock(&ks->lock);
                if (rc == 0)
                        return 0;
                if (cq_now_ms() >= until)
                        return -1;
                nanosleep(&ts, NULL);
        }
}

pid_t cq_kserver_pid(cq_kserver_t *ks)
{
        pid_t pid;

        if (!ks)
                return -1;
        pthread_mutex_lock(&ks->lock);
        pid = ks->pid;
        pthread_mutex_unlock(&ks->lock);
        return pid;
}

void cq_kserver_stats(cq_kserver_t *ks, cq_kserver_stats_t *stats)
{
        pthread_mutex_lock(&ks->lock);
        *stats = ks->stats;
        stats->up = ks->enabled && ks->state == KS_READY;
        if (stats->up && ks->pidfd >= 0) {
                struct pollfd pfd = {ks->pidfd, POLLIN, 0};

                /* exited: readable; ensure_ready() notices it later */
                stats->up = poll(&pfd, 1, 0) == 0;
        }
        pthread_mutex_unlock(&ks->lock);
}

void cq_kserver_destroy(cq_kserver_t **ksp)
{
        cq_kserver_t *ks = *ksp;

        if (!ks)
                return;
        *ksp = NULL;
        server_stop(ks);
        if (ks->life_w >= 0)
                close(ks->life_w);
        if (ks->life_r >= 0)
                close(ks->life_r);
        if (ks->kinit_fd >= 0)
                close(ks->kinit_fd);
        pthread_mutex_destroy(&ks->lock);
        free(ks->python);
        free(ks->preload);
        free(ks->work_root);
        free(ks);
}
