/* SPDX-License-Identifier: MIT */
/* judge_proc.c - see judge_proc.h. */
#include "support/judge_proc.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct proc {
        cq_judge_proc_t base;
        pid_t pid;
} proc_t;

static void proc_destroy(cq_judge_proc_t *base)
{
        proc_t *p = (proc_t *)base;
        int status;

        close(p->base.to_fd);
        close(p->base.from_fd);
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
        free(p);
}

pid_t cq_check_judge_pid(const cq_judge_proc_t *proc)
{
        return ((const proc_t *)proc)->pid;
}

cq_judge_proc_t *cq_check_judge_start(void *opaque,
                                      const char *program,
                                      char *errstr,
                                      size_t errstr_size)
{
        int in[2] = {-1, -1}, out[2] = {-1, -1};
        proc_t *p = calloc(1, sizeof(*p));

        if (!p || pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
                snprintf(errstr, errstr_size, "no pipe or memory");
                goto fail;
        }
        p->pid = fork();
        if (p->pid < 0) {
                snprintf(errstr, errstr_size, "could not fork");
                goto fail;
        }
        if (p->pid == 0) {
                dup2(in[0], 0);
                dup2(out[1], 3);
                execl("/usr/bin/python3", "python3", "-I", "-c", program, "3",
                      (char *)NULL);
                _exit(127);
        }
        close(in[0]);
        close(out[1]);
        p->base.to_fd = in[1];
        p->base.from_fd = out[0];
        p->base.destroy = proc_destroy;
        if (opaque)
                ++*(int *)opaque;
        return &p->base;
fail:
        if (in[0] >= 0) {
                close(in[0]);
                close(in[1]);
        }
        if (out[0] >= 0) {
                close(out[0]);
                close(out[1]);
        }
        free(p);
        return NULL;
}
