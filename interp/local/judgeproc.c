/* SPDX-License-Identifier: MIT */
/* judgeproc.c - the judging interpreter's process (judgeproc.h): the
 * judge's program as a pyproc, with a pipe of requests as its stdin and a
 * pipe of answers as its fd 3. Its protocol is agent/judge.c's. */
#include "coderq/local/judgeproc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pyproc_int.h"

/* Its fd for answers, the argument the program reads. */
#define ANSWER_FD "3"

/* As check_judge and a plain run: isolated mode (no environment's
 * PYTHON*, no user site, no script dir on the path). */
static const char *const cold_flags[] = {"-I", NULL};
static const char *const judge_args[] = {ANSWER_FD, NULL};

typedef struct judgeproc {
        cq_interp_proc_t base; /* first: cq_interp_proc_t * casts to this */
        pyproc_t pp;
        char *python, *work_root, *program;
        cq_local_hooks_t hooks; /* all NULL until it started */
} judgeproc_t;

/* Close our ends of its pipes. */
static void close_pipes(judgeproc_t *j)
{
        if (j->base.to_fd >= 0)
                close(j->base.to_fd);
        if (j->base.from_fd >= 0)
                close(j->base.from_fd);
        j->base.to_fd = j->base.from_fd = -1;
}

static void judgeproc_teardown(void *arg)
{
        judgeproc_t *j = arg;

        pyproc_release(&j->pp);
        close_pipes(j);
        free(j->python);
        free(j->work_root);
        free(j->program);
        free(j);
}

/* The judge dies now; with a defer hook, the rest is done behind the
 * caller's back. */
static void judgeproc_destroy(cq_interp_proc_t *base)
{
        judgeproc_t *j = (judgeproc_t *)base;

        if (j->hooks.defer) {
                lproc_kill_low(&j->pp.proc);
                close_pipes(j);
                if (j->hooks.defer(j->hooks.opaque, judgeproc_teardown, j) == 0)
                        return;
        }
        judgeproc_teardown(j);
}

bool cq_judgeproc_forked(const cq_interp_proc_t *proc)
{
        return pyproc_forked(&((const judgeproc_t *)proc)->pp);
}

const char *cq_judgeproc_work_dir(const cq_interp_proc_t *proc)
{
        return ((const judgeproc_t *)proc)->pp.work_dir;
}

/* The handle, its strings copied; NULL when out of memory. */
static judgeproc_t *judgeproc_alloc(const cq_judgeproc_opts_t *opts,
                                    const char *program)
{
        judgeproc_t *j = calloc(1, sizeof(*j));
        pyproc_opts_t po;

        if (!j)
                return NULL;
        j->base.to_fd = j->base.from_fd = -1;
        j->base.destroy = judgeproc_destroy;
        j->python = strdup(opts->python ? opts->python : "/usr/bin/python3");
        j->work_root = opts->work_root ? strdup(opts->work_root) : NULL;
        j->program = strdup(program);
        memset(&po, 0, sizeof(po));
        po.op = "judge";
        po.python = j->python;
        po.flags = cold_flags;
        po.program = j->program;
        po.args = judge_args;
        po.sandbox = opts->sandbox;
        po.kserver = opts->kserver;
        po.work_root = j->work_root;
        pyproc_init(&j->pp, &po);
        if (!j->python || !j->program || (opts->work_root && !j->work_root)) {
                judgeproc_destroy(&j->base);
                return NULL;
        }
        return j;
}

cq_interp_proc_t *cq_judgeproc_start(const cq_judgeproc_opts_t *opts,
                                     const char *program,
                                     char *errstr,
                                     size_t errstr_size)
{
        judgeproc_t *j = judgeproc_alloc(opts, program);
        int req[2] = {-1, -1}, ans[2] = {-1, -1}, null = -1;
        cq_interp_proc_t *proc = NULL;
        size_t i;

        if (!j) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the judge: out of memory");
                return NULL;
        }
        /* our ends non-blocking (agent/judge.c waits with poll()), the
         * judge's blocking, as a Python started by a shell has them */
        if (pipe2(req, O_CLOEXEC) || pipe2(ans, O_CLOEXEC) ||
            fcntl(req[1], F_SETFL, O_NONBLOCK) ||
            fcntl(ans[0], F_SETFL, O_NONBLOCK) ||
            (null = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the judge: %s", strerror(errno));
                goto out;
        }
        {
                const int fds[4] = {req[0], null, null, ans[1]};

                if (pyproc_start(&j->pp, fds, errstr, errstr_size))
                        goto out;
        }
        j->base.to_fd = req[1];
        j->base.from_fd = ans[0];
        req[1] = ans[0] = -1;
        if (opts->hooks)
                j->hooks = *opts->hooks;
        proc = &j->base;
        j = NULL;
out:
        if (j)
                judgeproc_destroy(&j->base);
        for (i = 0; i < 2; i++) {
                if (req[i] >= 0)
                        close(req[i]);
                if (ans[i] >= 0)
                        close(ans[i]);
        }
        if (null >= 0)
                close(null);
        return proc;
}
