/* SPDX-License-Identifier: MIT */
/* interp_local.c - the "local" interpreter backend: one kernel (kernel.c)
 * in its own work dir behind cq_interp_t, with the job's input files and
 * the files the code creates. Paths inside the work dir are opened one
 * component at a time without following symlinks, since the code running
 * in the kernel controls that tree. */
#include "coderq/local/interp_local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"

typedef struct snap_entry {
        char *name;
        off_t size;
        struct timespec mtime;
} snap_entry_t;

typedef struct snap {
        snap_entry_t *v;
        size_t n, alloc;
} snap_t;

typedef struct local_interp {
        cq_interp_t base; /* first: cq_interp_t * casts to this */
        cq_kernel_t *kernel;
        const cq_sandbox_t *sandbox;
        char work_dir[PATH_MAX];
        bool own_dir;
        cq_local_hooks_t hooks; /* the pool's, or all NULL */
        snap_t snap;            /* files at start, and input files as written */
        char **inputs;          /* names given to put_file */
        size_t ninputs;
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

/* Gives what \p fd opened to the uid of \p own (NULL: nothing); \p own,
 * or NULL once that fails, as the ownership change is best effort. */
static const cq_sandbox_id_t *give(const cq_sandbox_id_t *own, int fd)
{
        return own && cq_sandbox_own_fd(own, fd) == 0 ? own : NULL;
}

/* Open \p name under \p root, never following a symlink on the way; only
 * a regular file (errno EINVAL otherwise). \p create: make missing parent
 * directories and the file itself, truncated. \p own: give every dir on
 * the way below \p root, and the file, to its uid, through the
 * descriptors opened (a path could be swapped for a symlink). */
static int open_beneath(const char *root,
                        const char *name,
                        bool create,
                        const cq_sandbox_id_t *own)
{
        char comp[256];
        const char *p = name;
        struct stat st;
        int dirfd, fd;

        dirfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dirfd < 0)
                return -1;
        for (;;) {
                const char *slash = strchr(p, '/');
                size_t len = slash ? (size_t)(slash - p) : strlen(p);

                if (len == 0 || len >= sizeof(comp)) {
                        close(dirfd);
                        errno = EINVAL;
                        return -1;
                }
                memcpy(comp, p, len);
                comp[len] = '\0';
                if (!slash)
                        break;
                if (create && mkdirat(dirfd, comp, 0755) && errno != EEXIST) {
                        close(dirfd);
                        return -1;
                }
                fd = openat(dirfd, comp,
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                close(dirfd);
                if (fd < 0)
                        return -1;
                own = give(own, fd);
                dirfd = fd;
                p = slash + 1;
        }
        /* The code may have left a FIFO or a device under this name: an
         * open would block the slot on a FIFO, or touch the device. Look
         * first, open without blocking, and check the file opened. */
        if (fstatat(dirfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            !S_ISREG(st.st_mode)) {
                close(dirfd);
                errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
                return -1;
        }
        fd = openat(dirfd, comp,
                    (create ? O_WRONLY | O_CREAT : O_RDONLY) | O_NOFOLLOW |
                        O_NONBLOCK | O_CLOEXEC,
                    0644);
        close(dirfd);
        if (fd < 0)
                return -1;
        if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
                close(fd);
                errno = EINVAL;
                return -1;
        }
        if (create && ftruncate(fd, 0)) {
                int saved = errno;

                close(fd);
                errno = saved;
                return -1;
        }
        give(own, fd);
        return fd;
}

/* ---- snapshots ---- */

static void snap_release(snap_t *snap)
{
        size_t i;

        for (i = 0; i < snap->n; i++)
                free(snap->v[i].name);
        free(snap->v);
        memset(snap, 0, sizeof(*snap));
}

static snap_entry_t *snap_find(snap_t *snap, const char *name)
{
        size_t i;

        for (i = 0; i < snap->n; i++)
                if (strcmp(snap->v[i].name, name) == 0)
                        return &snap->v[i];
        return NULL;
}

static int snap_put(snap_t *snap, const char *name, const struct stat *st)
{
        snap_entry_t *e = snap_find(snap, name);

        if (!e) {
                if (snap->n == snap->alloc) {
                        size_t alloc = snap->alloc ? snap->alloc * 2 : 16;
                        snap_entry_t *v = realloc(snap->v, alloc * sizeof(*v));

                        if (!v)
                                return -1;
                        snap->v = v;
                        snap->alloc = alloc;
                }
                e = &snap->v[snap->n];
                e->name = strdup(name);
                if (!e->name)
                        return -1;
                snap->n++;
        }
        e->size = st->st_size;
        e->mtime = st->st_mtim;
        return 0;
}

/* Walk regular files under the work dir (not the kernel's run dir, no
 * symlinks), calling \p fn with the relative name. At most 10000 files and
 * 32 levels, so a hostile tree cannot stall the worker. */
typedef int(walk_fn_t)(void *opaque, const char *name, const struct stat *st);

static int walk(int dfd,
                const char *prefix,
                int depth,
                size_t *budget,
                walk_fn_t *fn,
                void *opaque)
{
        DIR *dir;
        struct dirent *de;
        int rc = 0;

        if (depth > 32) {
                close(dfd);
                return 0;
        }
        dir = fdopendir(dfd);
        if (!dir) {
                close(dfd);
                return -1;
        }
        while ((de = readdir(dir)) && rc == 0) {
                char name[PATH_MAX];
                struct stat st;

                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                if (depth == 0 && !strcmp(de->d_name, CQ_KERNEL_RUN_DIR))
                        continue;
                if (*budget == 0)
                        break;
                (*budget)--;
                if (snprintf(name, sizeof(name), "%s%s%s", prefix,
                             *prefix ? "/" : "",
                             de->d_name) >= (int)sizeof(name))
                        continue;
                if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
                        continue;
                if (S_ISDIR(st.st_mode)) {
                        int sub = openat(dirfd(dir), de->d_name,
                                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                             O_CLOEXEC);

                        if (sub >= 0)
                                rc = walk(sub, name, depth + 1, budget, fn,
                                          opaque);
                } else if (S_ISREG(st.st_mode)) {
                        rc = fn(opaque, name, &st);
                }
        }
        closedir(dir);
        return rc;
}

static int walk_work_dir(local_interp_t *li, walk_fn_t *fn, void *opaque)
{
        size_t budget = 10000;
        int fd =
            open(li->work_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

        if (fd < 0)
                return -1;
        return walk(fd, "", 0, &budget, fn, opaque);
}

static int snap_cb(void *opaque, const char *name, const struct stat *st)
{
        return snap_put(opaque, name, st);
}

/* ---- ops ---- */

static cq_err_t local_put_file(cq_interp_t *interp,
                               const char *name,
                               const void *data,
                               size_t len)
{
        local_interp_t *li = (local_interp_t *)interp;
        const char *p = data;
        struct stat st;
        char **inputs;
        int fd;

        if (!cq_relpath_is_safe(name) ||
            strncmp(name, CQ_KERNEL_RUN_DIR, strlen(CQ_KERNEL_RUN_DIR)) == 0) {
                set_error(li, "could not write \"%s\": unsafe file name", name);
                return CQ_ERR_FATAL;
        }
        /* Parent dirs made here belong to us; the tree goes to the kernel
         * uid so the code can write next to its inputs. */
        fd = open_beneath(li->work_dir, name, true,
                          cq_sandbox_enabled(li->sandbox)
                              ? cq_kernel_sandbox_id(li->kernel)
                              : NULL);
        if (fd < 0) {
                set_error(li, "could not write \"%s\": %s", name,
                          strerror(errno));
                return CQ_ERR_RETRIABLE;
        }
        while (len > 0) {
                ssize_t n = write(fd, p, len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        set_error(li, "could not write \"%s\": %s", name,
                                  strerror(errno));
                        close(fd);
                        return CQ_ERR_RETRIABLE;
                }
                p += n;
                len -= (size_t)n;
        }
        if (fstat(fd, &st) || close(fd)) {
                set_error(li, "could not write \"%s\": %s", name,
                          strerror(errno));
                return CQ_ERR_RETRIABLE;
        }
        inputs = realloc(li->inputs, (li->ninputs + 1) * sizeof(*inputs));
        if (!inputs || snap_put(&li->snap, name, &st)) {
                if (inputs)
                        li->inputs = inputs;
                set_error(li, "could not record \"%s\": out of memory", name);
                return CQ_ERR_RETRIABLE;
        }
        li->inputs = inputs;
        li->inputs[li->ninputs] = strdup(name);
        if (li->inputs[li->ninputs])
                li->ninputs++;
        return CQ_OK;
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

static bool is_input(const local_interp_t *li, const char *name)
{
        size_t i;

        for (i = 0; i < li->ninputs; i++)
                if (strcmp(li->inputs[i], name) == 0)
                        return true;
        return false;
}

static cq_err_t
read_file(local_interp_t *li, const char *name, size_t max, cq_file_t *file)
{
        struct stat st;
        unsigned char *data = NULL;
        size_t off = 0;
        int fd = open_beneath(li->work_dir, name, false, NULL);

        if (fd < 0) {
                set_error(li, "could not open \"%s\": %s", name,
                          strerror(errno));
                return errno == ENOENT ? CQ_ERR_FATAL : CQ_ERR_RETRIABLE;
        }
        if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
                set_error(li, "could not read \"%s\": not a regular file",
                          name);
                close(fd);
                return CQ_ERR_FATAL;
        }
        if ((size_t)st.st_size > max) {
                set_error(li,
                          "could not read \"%s\": %lld bytes is above the "
                          "%zu byte cap",
                          name, (long long)st.st_size, max);
                close(fd);
                return CQ_ERR_TOO_LARGE;
        }
        data = malloc((size_t)st.st_size + 1);
        if (!data) {
                close(fd);
                set_error(li, "could not read \"%s\": out of memory", name);
                return CQ_ERR_RETRIABLE;
        }
        while (off < (size_t)st.st_size) {
                ssize_t n = read(fd, data + off, (size_t)st.st_size - off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                off += (size_t)n;
        }
        close(fd);
        file->name = strdup(name);
        file->mime = strdup(cq_mime_from_name(name));
        file->data = data;
        file->len = off;
        if (!file->name || !file->mime) {
                free(file->name);
                free(file->mime);
                free(data);
                memset(file, 0, sizeof(*file));
                set_error(li, "could not read \"%s\": out of memory", name);
                return CQ_ERR_RETRIABLE;
        }
        return CQ_OK;
}

typedef struct created_ctx {
        local_interp_t *li;
        cq_files_t *files;
        size_t alloc;
} created_ctx_t;

static int created_cb(void *opaque, const char *name, const struct stat *st)
{
        created_ctx_t *ctx = opaque;
        snap_entry_t *e = snap_find(&ctx->li->snap, name);
        cq_file_t *f;

        if (is_input(ctx->li, name))
                return 0;
        if (e && e->size == st->st_size &&
            e->mtime.tv_sec == st->st_mtim.tv_sec &&
            e->mtime.tv_nsec == st->st_mtim.tv_nsec)
                return 0;
        if (ctx->files->n == ctx->alloc) {
                size_t alloc = ctx->alloc ? ctx->alloc * 2 : 8;
                cq_file_t *v = realloc(ctx->files->v, alloc * sizeof(*v));

                if (!v)
                        return -1;
                ctx->files->v = v;
                ctx->alloc = alloc;
        }
        f = &ctx->files->v[ctx->files->n];
        memset(f, 0, sizeof(*f));
        f->name = strdup(name);
        f->mime = strdup(cq_mime_from_name(name));
        f->len = (size_t)st->st_size;
        if (!f->name || !f->mime) {
                free(f->name);
                free(f->mime);
                return -1;
        }
        ctx->files->n++;
        return 0;
}

/* Files read whole are capped; larger ones are listed without data. */
#define CREATED_READ_MAX (64u << 20)

static cq_err_t
local_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files)
{
        local_interp_t *li = (local_interp_t *)interp;
        created_ctx_t ctx = {li, files, 0};
        size_t i;

        files->v = NULL;
        files->n = 0;
        if (walk_work_dir(li, created_cb, &ctx)) {
                set_error(li, "could not list \"%s\": %s", li->work_dir,
                          strerror(errno));
                cq_files_release(files);
                return CQ_ERR_RETRIABLE;
        }
        for (i = 0; with_data && i < files->n; i++) {
                cq_file_t one = {0};

                if (read_file(li, files->v[i].name, CREATED_READ_MAX, &one) !=
                    CQ_OK)
                        continue;
                files->v[i].data = one.data;
                files->v[i].len = one.len;
                one.data = NULL;
                free(one.name);
                free(one.mime);
        }
        return CQ_OK;
}

static cq_err_t local_get_file(cq_interp_t *interp,
                               const char *name,
                               size_t max,
                               cq_file_t *file)
{
        memset(file, 0, sizeof(*file));
        return read_file((local_interp_t *)interp, name, max, file);
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
        size_t i;

        /* A work dir of our own goes with the kernel: nothing a graceful
         * shutdown would flush there can outlive it. */
        if (li->own_dir)
                cq_kernel_discard(&li->kernel);
        else
                cq_kernel_destroy(&li->kernel);
        if (li->own_dir && li->work_dir[0])
                cq_work_dir_remove(li->work_dir);
        for (i = 0; i < li->ninputs; i++)
                free(li->inputs[i]);
        free(li->inputs);
        snap_release(&li->snap);
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
        if (walk_work_dir(li, snap_cb, &li->snap)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not list work dir \"%s\"", li->work_dir);
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
