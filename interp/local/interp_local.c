/* SPDX-License-Identifier: MIT */
/* interp_local.c - the "local" interpreter backend: one kernel (kernel.c)
 * in its own work dir behind cq_interp_t, with the job's input files and
 * the files the code creates (workfiles.c, which opens paths inside the
 * work dir one component at a time without following symlinks, since the
 * code running in the kernel controls that tree). */
#include "coderq/local/interp_local.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"
#include "coderq/local/workfiles.h"

typedef struct local_interp {
        cq_interp_t base; /* first: cq_interp_t * casts to this */
        cq_kernel_t *kernel;
        const cq_sandbox_t *sandbox;
        char work_dir[PATH_MAX];
        bool own_dir;
        cq_local_hooks_t hooks; /* the pool's, or all NULL */
        cq_workfiles_t *files;  /* the work dir's files at start, inputs */
        char errmsg[512];
} local_interp_t;

static const cq_interp_ops_t local_ops;

CQ_PRINTF(2, 3)
static void set_error(local_interp_t *li, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(li->errmsg, sizeof(li->errmsg), fmt, ap);
        va_end(ap);
}

/* ---- ops ---- */

static cq_err_t local_put_file(cq_interp_t *interp,
                               const char *name,
                               const void *data,
                               size_t len)
{
        local_interp_t *li = (local_interp_t *)interp;

        return cq_workfiles_put(li->files, name, data, len,
                                cq_sandbox_enabled(li->sandbox)
                                    ? cq_kernel_sandbox_id(li->kernel)
                                    : NULL,
                                li->errmsg, sizeof(li->errmsg));
}

static cq_err_t local_execute(cq_interp_t *interp,
                              const char *code,
                              const cq_exec_opts_t *opts,
                              cq_cell_result_t *res)
{
        local_interp_t *li = (local_interp_t *)interp;
        uint64_t ticket = 0;
        cq_err_t err;

        /* Only the start is gated: the kernel's timeout runs from when
         * the cell is sent. */
        if (li->hooks.gate)
                ticket = cq_gate_enter(li->hooks.gate);
        err = cq_kernel_execute(li->kernel, code, opts, res);
        if (li->hooks.gate)
                cq_gate_leave(li->hooks.gate, ticket);

        if (err != CQ_OK)
                set_error(li, "%s", cq_kernel_errmsg(li->kernel));
        return err;
}

static int local_interrupt(cq_interp_t *interp)
{
        return cq_kernel_interrupt(((local_interp_t *)interp)->kernel);
}

static cq_err_t local_restart(cq_interp_t *interp)
{
        local_interp_t *li = (local_interp_t *)interp;
        cq_err_t err = cq_kernel_restart(li->kernel);

        if (err != CQ_OK)
                set_error(li, "%s", cq_kernel_errmsg(li->kernel));
        return err;
}

static cq_err_t
local_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files)
{
        local_interp_t *li = (local_interp_t *)interp;

        return cq_workfiles_created(li->files, with_data, files, li->errmsg,
                                    sizeof(li->errmsg));
}

static cq_err_t local_get_file(cq_interp_t *interp,
                               const char *name,
                               size_t max,
                               cq_file_t *file)
{
        local_interp_t *li = (local_interp_t *)interp;

        return cq_workfiles_get(li->files, name, max, file, li->errmsg,
                                sizeof(li->errmsg));
}

static const char *local_errmsg(const cq_interp_t *interp)
{
        return ((const local_interp_t *)interp)->errmsg;
}

static const json_t *local_env(cq_interp_t *interp)
{
        const local_interp_t *li = (const local_interp_t *)interp;

        return li->kernel ? cq_kernel_env(li->kernel) : NULL;
}

static const json_t *local_language_info(cq_interp_t *interp)
{
        const local_interp_t *li = (const local_interp_t *)interp;

        return li->kernel ? cq_kernel_language_info(li->kernel) : NULL;
}

static void local_teardown(void *arg)
{
        local_interp_t *li = arg;

        /* A work dir of our own goes with the kernel: nothing a graceful
         * shutdown would flush there can outlive it. */
        if (li->own_dir)
                cq_kernel_discard(&li->kernel);
        else
                cq_kernel_destroy(&li->kernel);
        if (li->own_dir && li->work_dir[0])
                cq_work_dir_remove(li->work_dir);
        cq_workfiles_destroy(&li->files);
        free(li);
}

static void local_destroy(cq_interp_t *interp)
{
        local_interp_t *li = (local_interp_t *)interp;

        /* A pool kernel dies now and is reaped behind the caller's back:
         * the job is over, and the caller's next job should not wait for
         * the reaping (on a busy machine, invalidating the dead
         * processes' /proc entries and removing the work dir cost ~10 ms
         * of CPU each). */
        if (li->hooks.defer && li->own_dir) {
                cq_kernel_kill(li->kernel);
                if (li->hooks.defer(li->hooks.opaque, local_teardown, li) == 0)
                        return;
        }
        local_teardown(li);
}

static const cq_interp_ops_t local_ops = {
    .name = "local",
    .put_file = local_put_file,
    .execute = local_execute,
    .interrupt = local_interrupt,
    .restart = local_restart,
    .created_files = local_created_files,
    .get_file = local_get_file,
    .errmsg = local_errmsg,
    .destroy = local_destroy,
    .env = local_env,
    .language_info = local_language_info,
};

cq_kernel_t *cq_local_interp_kernel(cq_interp_t *interp)
{
        if (!interp || interp->ops != &local_ops)
                return NULL;
        return ((local_interp_t *)interp)->kernel;
}

cq_interp_t *cq_local_interp_wrap(cq_kernel_t **kernelp,
                                  const cq_sandbox_t *sandbox,
                                  bool own_dir,
                                  const cq_local_hooks_t *hooks,
                                  char *errstr,
                                  size_t errstr_size)
{
        local_interp_t *li = calloc(1, sizeof(*li));
        cq_kernel_t *kernel = *kernelp;

        *kernelp = NULL;
        if (!li) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create interpreter: out of memory");
                if (own_dir) {
                        char dir[PATH_MAX];

                        snprintf(dir, sizeof(dir), "%s",
                                 cq_kernel_work_dir(kernel));
                        cq_kernel_destroy(&kernel);
                        cq_work_dir_remove(dir);
                }
                cq_kernel_destroy(&kernel);
                return NULL;
        }
        li->base.ops = &local_ops;
        li->kernel = kernel;
        li->sandbox = sandbox;
        li->own_dir = own_dir;
        snprintf(li->work_dir, sizeof(li->work_dir), "%s",
                 cq_kernel_work_dir(kernel));
        /* Files present now (the kernel's own are in the run dir) are not
         * the job's creations. */
        li->files = cq_workfiles_new(li->work_dir, errstr, errstr_size);
        if (!li->files) {
                local_destroy(&li->base);
                return NULL;
        }
        /* Only now: a failed wrap is torn down here, not deferred. */
        if (hooks)
                li->hooks = *hooks;
        return &li->base;
}

void cq_local_opts_from_config(cq_local_opts_t *opts,
                               const cq_config_t *cfg,
                               const cq_sandbox_t *sandbox)
{
        memset(opts, 0, sizeof(*opts));
        opts->kernel.python = cfg->python;
        opts->kernel.startup_timeout_ms = cfg->kernel_startup_timeout_s * 1000;
        opts->kernel.output_max = cfg->output_max;
        opts->kernel.sandbox = sandbox;
        opts->work_root = cfg->work_root;
}

cq_interp_t *cq_local_interp_new(const cq_local_opts_t *opts,
                                 char *errstr,
                                 size_t errstr_size)
{
        cq_kernel_opts_t kopts = opts->kernel;
        char dir[PATH_MAX];
        cq_kernel_t *kernel;
        bool own = false;

        if (!kopts.work_dir) {
                if (cq_work_dir_new(opts->work_root, dir, sizeof(dir), errstr,
                                    errstr_size))
                        return NULL;
                kopts.work_dir = dir;
                own = true;
        }
        kernel = cq_kernel_new(&kopts, errstr, errstr_size);
        if (!kernel) {
                if (own)
                        cq_work_dir_remove(dir);
                return NULL;
        }
        return cq_local_interp_wrap(&kernel, kopts.sandbox, own, NULL, errstr,
                                    errstr_size);
}
