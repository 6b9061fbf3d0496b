/* SPDX-License-Identifier: MIT */
/* proc.c - subprocesses for tests: fork, exec, read both pipes with poll()
 * until both close, kill on timeout. */
#include "support/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct sink {
        char *data;
        size_t len;
};

static long long now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int sink_add(struct sink *sink, const char *p, size_t n)
{
        char *data;

        if (sink->len >= CQ_CHECK_PROC_MAX_OUTPUT)
                return 0;
        if (n > CQ_CHECK_PROC_MAX_OUTPUT - sink->len)
                n = CQ_CHECK_PROC_MAX_OUTPUT - sink->len;
        data = realloc(sink->data, sink->len + n + 1);
        if (!data)
                return -1;
        memcpy(data + sink->len, p, n);
        sink->len += n;
        data[sink->len] = '\0';
        sink->data = data;
        return 0;
}

static void child_exec(const char *const *argv,
                       const char *const *env,
                       int out_fd,
                       int err_fd)
{
        int null_fd = open("/dev/null", O_RDONLY);
        size_t i;

        if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(out_fd, 1) < 0 ||
            dup2(err_fd, 2) < 0)
                _exit(127);
        for (i = 0; env && env[i]; i++) {
                const char *eq = strchr(env[i], '=');

                if (eq) {
                        char name[256];
                        size_t n = (size_t)(eq - env[i]);

                        if (n >= sizeof(name))
                                _exit(127);
                        memcpy(name, env[i], n);
                        name[n] = '\0';
                        if (setenv(name, eq + 1, 1) != 0)
                                _exit(127);
                } else if (unsetenv(env[i]) != 0) {
                        _exit(127);
                }
        }
        /* execv() takes char *const[] for historical reasons only. */
        execv(argv[0], (char *const *)(uintptr_t)argv);
        _exit(127);
}

int cq_check_proc_run(const char *const *argv,
                      const char *const *env,
                      int timeout_ms,
                      cq_check_proc_t *proc)
{
        int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
        struct sink sinks[2] = {{NULL, 0}, {NULL, 0}};
        struct pollfd fds[2];
        long long deadline = now_ms() + timeout_ms;
        pid_t pid = -1;
        int wstatus = 0, open_fds = 2, rc = -1, i;

        memset(proc, 0, sizeof(*proc));
        if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
                goto out;
        pid = fork();
        if (pid < 0)
                goto out;
        if (pid == 0)
                child_exec(argv, env, out_pipe[1], err_pipe[1]);
        close(out_pipe[1]);
        close(err_pipe[1]);
        out_pipe[1] = err_pipe[1] = -1;
        fds[0].fd = out_pipe[0];
        fds[1].fd = err_pipe[0];
        fds[0].events = fds[1].events = POLLIN;
        while (open_fds > 0) {
                long long left = deadline - now_ms();
                int n;

                if (left <= 0) {
                        proc->timed_out = 1;
                        kill(pid, SIGKILL);
                        break;
                }
                n = poll(fds, 2, (int)left);
                if (n < 0 && errno != EINTR)
                        break;
                for (i = 0; n > 0 && i < 2; i++) {
                        char chunk[4096];
                        ssize_t got;

                        if (fds[i].fd < 0 || !fds[i].revents)
                                continue;
                        got = read(fds[i].fd, chunk, sizeof(chunk));
                        if (got > 0) {
                                if (sink_add(&sinks[i], chunk, (size_t)got))
                                        goto out;
                        } else if (got == 0 ||
                                   (errno != EINTR && errno != EAGAIN)) {
                                fds[i].fd = -1;
                                open_fds--;
                        }
                }
        }
        while (waitpid(pid, &wstatus, 0) < 0) {
                if (errno != EINTR)
                        goto out;
        }
        pid = -1;
        proc->status =
            WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        /* A silent stream still gives an empty string, never NULL. */
        for (i = 0; i < 2; i++)
                if (!sinks[i].data && sink_add(&sinks[i], "", 0) != 0)
                        goto out;
        proc->out = sinks[0].data;
        proc->out_len = sinks[0].len;
        proc->err = sinks[1].data;
        proc->err_len = sinks[1].len;
        sinks[0].data = sinks[1].data = NULL;
        rc = 0;
out:
        if (pid > 0) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
        }
        for (i = 0; i < 2; i++) {
                if (out_pipe[i] >= 0)
                        close(out_pipe[i]);
                if (err_pipe[i] >= 0)
                        close(err_pipe[i]);
                free(sinks[i].data);
        }
        return rc;
}

pid_t cq_check_proc_spawn(const char *const *argv,
                          const char *const *env,
                          const char *log)
{
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        pid_t pid;

        if (fd < 0)
                return -1;
        pid = fork();
        if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                child_exec(argv, env, fd, fd);
        }
        close(fd);
        return pid;
}

void cq_check_proc_release(cq_check_proc_t *proc)
{
        free(proc->out);
        free(proc->err);
        proc->out = proc->err = NULL;
        proc->out_len = proc->err_len = 0;
}

size_t cq_check_count_lines(const char *s)
{
        size_t n = 0;

        for (; s && *s; s++)
                if (*s == '\n' || s[1] == '\0')
                        n++;
        return n;
}

void cq_check_proc_backtrace(int pid)
{
        static const char *const gdbs[] = {"/usr/bin/gdb",
                                           "/usr/local/bin/gdb"};
        const char *gdb = NULL;
        char target[32];
        cq_check_proc_t proc;
        size_t i;

        for (i = 0; i < sizeof(gdbs) / sizeof(gdbs[0]); i++)
                if (access(gdbs[i], X_OK) == 0) {
                        gdb = gdbs[i];
                        break;
                }
        if (!gdb) {
                fprintf(stderr,
                        "--- no stacks of process %d: gdb is not "
                        "installed ---\n",
                        pid);
                return;
        }
        snprintf(target, sizeof(target), "%d", pid);
        {
                const char *const argv[] = {gdb,
                                            "-nx",
                                            "-batch",
                                            "-p",
                                            target,
                                            "-ex",
                                            "thread apply all bt",
                                            NULL};

                if (cq_check_proc_run(argv, NULL, 60000, &proc) != 0) {
                        fprintf(stderr,
                                "--- no stacks of process %d: could "
                                "not run gdb ---\n",
                                pid);
                        return;
                }
        }
        fprintf(stderr, "--- stacks of process %d (gdb exit %d) ---\n%s%s\n",
                pid, proc.status, proc.out, proc.err);
        cq_check_proc_release(&proc);
}

int cq_check_coderq(const char *const *args,
                    const char *const *env,
                    int timeout_ms,
                    cq_check_proc_t *proc)
{
        const char *argv[16];
        size_t i;

        argv[0] = CQ_BINARY_DIR "/coderq";
        for (i = 0; args[i]; i++) {
                if (i + 2 >= sizeof(argv) / sizeof(argv[0]))
                        return -1;
                argv[i + 1] = args[i];
        }
        argv[i + 1] = NULL;
        return cq_check_proc_run(argv, env, timeout_ms, proc);
}

int cq_check_coderq_at(const char *dsn,
                       const char *topic,
                       const char *const *args,
                       int timeout_ms,
                       cq_check_proc_t *proc)
{
        char dsn_kv[2100], topic_kv[300];
        const char *env[5];

        snprintf(dsn_kv, sizeof(dsn_kv), "CODERQ_PG_DSN=%s", dsn);
        snprintf(topic_kv, sizeof(topic_kv), "CODERQ_TOPIC_JOBS=%s", topic);
        env[0] = dsn_kv;
        env[1] = topic_kv;
        env[2] = "CODERQ_LOG_LEVEL=error";
        env[3] = "CODERQ_PRICES_FILE";
        env[4] = NULL;
        return cq_check_coderq(args, env, timeout_ms, proc);
}
