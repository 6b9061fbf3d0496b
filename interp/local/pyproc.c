/* SPDX-License-Identifier: MIT */
/* pyproc.c - a Python program of coderq's own (a runner, a judging
 * interpreter) as one process confined as a local kernel is
 * (pyproc_int.h): its work dir and uid, the scrubbed environment of
 * kernel_env.c, then a fork by the kernel server (kinit's confinement)
 * or, when the server is off, refuses or runs another Python, a cold
 * start under bubblewrap. The process's life is lproc.c's. */
#include "coderq/local/kserver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/local/kernel.h"
#include "coderq/local/kernel_env.h"
#include "coderq/local/workdir.h"
#include "pyproc_int.h"

/* The descriptor of a cold start's child on which bubblewrap gets
 * --info-fd: above the program's 0-3. */
#define INFO_FD 4
/* Words of a cold start's command line besides the program's arguments
 * and interpreter options: python, -c, the program, NULL. */
#define CMD_FIXED 4
#define CMD_MAX   32

void pyproc_init(pyproc_t *pp, const pyproc_opts_t *opts)
{
        cq_sandbox_id_t none = CQ_SANDBOX_ID_INIT;

        memset(pp, 0, sizeof(*pp));
        pp->opts = *opts;
        if (!pp->opts.python)
                pp->opts.python = "/usr/bin/python3";
        lproc_init(&pp->proc, opts->op);
        pp->id = none;
}

bool pyproc_forked(const pyproc_t *pp) { return pp->proc.forked; }

/* The first start's work dir, given to the uid leased for it. -1 with
 * \p errstr filled. */
static int make_home(pyproc_t *pp, char *errstr, size_t errstr_size)
{
        char err[400];

        if (cq_work_dir_new(pp->opts.work_root, pp->work_dir,
                            sizeof(pp->work_dir), err, sizeof(err))) {
                pp->work_dir[0] = '\0';
                cq_errstr_set(errstr, errstr_size, "could not start the %s: %s",
                              pp->opts.op, err);
                return -1;
        }
        if (cq_sandbox_id_acquire(pp->opts.sandbox, &pp->id, err,
                                  sizeof(err))) {
                cq_errstr_set(errstr, errstr_size, "could not start the %s: %s",
                              pp->opts.op, err);
                return -1;
        }
        if (cq_sandbox_own(&pp->id, pp->work_dir)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the %s: could not chown "
                              "\"%s\": %s",
                              pp->opts.op, pp->work_dir, strerror(errno));
                return -1;
        }
        return 0;
}

/* Ask the kernel server for it: 0 when forked. */
static int start_forked(pyproc_t *pp, char *const *envp, const int fds[4])
{
        cq_kserver_t *ks = pp->opts.kserver;
        cq_kserver_child_t child;
        cq_kserver_req_t req;
        char err[512];

        if (!cq_kserver_enabled(ks) ||
            strcmp(cq_kserver_python(ks), pp->opts.python) != 0)
                return -1;
        memset(&req, 0, sizeof(req));
        req.work_dir = pp->work_dir;
        req.argv = pp->opts.args;
        req.envp = (const char *const *)envp;
        req.sandbox = pp->opts.sandbox;
        req.id = &pp->id;
        req.log_fd = -1;
        req.preload = pp->opts.preload;
        if (cq_kserver_run(ks, pp->opts.op, &req, pp->opts.program, fds, &child,
                           err, sizeof(err))) {
                cq_log_kv(CQ_LOG_INFO, "starting cold", "what", pp->opts.op,
                          "reason", err, NULL);
                return -1;
        }
        lproc_forked_from(&pp->proc, &child);
        return 0;
}

/* A cold start's child: \p fds as 0-3 and bubblewrap's \p info pipe (or
 * none, -1) as INFO_FD, every other descriptor closed. Sources are moved
 * above their targets first, so that no dup2() overwrites another's
 * source; a dup2() onto another number clears O_CLOEXEC.
 * Async-signal-safe. */
static void child_fds(const int fds[4], int info)
{
        int src[INFO_FD + 1], n = info >= 0 ? INFO_FD + 1 : INFO_FD, i;

        for (i = 0; i < n; i++) {
                src[i] =
                    fcntl(i < INFO_FD ? fds[i] : info, F_DUPFD, INFO_FD + 1);
                if (src[i] < 0)
                        _exit(126);
        }
        for (i = 0; i < n; i++)
                if (dup2(src[i], i) < 0)
                        _exit(126);
        /* bubblewrap writes it with blocking semantics */
        if (info >= 0)
                fcntl(INFO_FD, F_SETFL, 0);
        syscall(SYS_close_range, (unsigned)n, ~0U, 0U);
}

/* Start it ourselves: fork, and exec it (in bubblewrap when sandboxed)
 * in a process group of its own. -1 with \p errstr filled. */
static int start_cold(pyproc_t *pp,
                      char *const *envp,
                      const int fds[4],
                      char *errstr,
                      size_t errstr_size)
{
        const char *cmd[CMD_MAX];
        bool boxed = cq_sandbox_enabled(pp->opts.sandbox);
        int info[2] = {-1, -1}, rc = -1;
        size_t n = 0, i;
        char **argv = NULL;
        pid_t parent = getpid(), pid;

        for (i = 0; pp->opts.flags && pp->opts.flags[i]; i++)
                n++;
        for (i = 0; pp->opts.args && pp->opts.args[i]; i++)
                n++;
        if (n + CMD_FIXED > CMD_MAX) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the %s: %zu words", pp->opts.op,
                              n + CMD_FIXED);
                goto out;
        }
        n = 0;
        cmd[n++] = pp->opts.python;
        for (i = 0; pp->opts.flags && pp->opts.flags[i]; i++)
                cmd[n++] = pp->opts.flags[i];
        cmd[n++] = "-c";
        cmd[n++] = pp->opts.program;
        for (i = 0; pp->opts.args && pp->opts.args[i]; i++)
                cmd[n++] = pp->opts.args[i];
        cmd[n] = NULL;
        argv = cq_sandbox_argv(pp->opts.sandbox, pp->work_dir, cmd,
                               boxed ? INFO_FD : -1, -1, NULL);
        if (!argv || (boxed && pipe2(info, O_CLOEXEC | O_NONBLOCK) != 0)) {
                cq_errstr_set(errstr, errstr_size, "could not start the %s: %s",
                              pp->opts.op,
                              argv ? strerror(errno) : "out of memory");
                goto out;
        }
        pid = lproc_fork(&pp->proc);
        if (pid < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the %s: could not fork: %s",
                              pp->opts.op, strerror(errno));
                goto out;
        }
        if (pid == 0) {
                lproc_child_begin();
                child_fds(fds, info[1]);
                lproc_child_exec(pp->opts.sandbox, &pp->id, pp->work_dir, 0,
                                 parent, argv, envp);
        }
        pp->proc.info_fd = info[0];
        info[0] = -1;
        rc = 0;
out:
        if (info[0] >= 0)
                close(info[0]);
        if (info[1] >= 0)
                close(info[1]);
        cq_sandbox_argv_free(argv);
        return rc;
}

int pyproc_start(pyproc_t *pp,
                 const int fds[4],
                 char *errstr,
                 size_t errstr_size)
{
        char run_dir[PATH_MAX + 16];
        char **envp = NULL;
        int rc = -1;

        if (!pp->work_dir[0] && make_home(pp, errstr, errstr_size))
                return -1;
        /* a kernel's environment, with its caches under a run dir that
         * is not made until something (an unsandboxed program) makes it */
        snprintf(run_dir, sizeof(run_dir), "%s/%s", pp->work_dir,
                 CQ_KERNEL_RUN_DIR);
        envp = cq_kernel_environ(pp->work_dir, run_dir,
                                 cq_sandbox_enabled(pp->opts.sandbox), 0);
        if (!envp) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the %s: out of memory",
                              pp->opts.op);
                return -1;
        }
        if (start_forked(pp, envp, fds) == 0 ||
            start_cold(pp, envp, fds, errstr, errstr_size) == 0)
                rc = 0;
        cq_sandbox_argv_free(envp);
        return rc;
}

void pyproc_stop(pyproc_t *pp) { lproc_kill(&pp->proc); }

void pyproc_release(pyproc_t *pp)
{
        pyproc_opts_t opts = pp->opts;

        pyproc_stop(pp);
        /* lproc_kill() waited for the sandbox's pid 1, which outlives
         * every process in it: nothing runs as the uid any more. */
        cq_sandbox_id_release(&pp->id);
        if (pp->work_dir[0])
                cq_work_dir_remove(pp->work_dir);
        pyproc_init(pp, &opts);
}
