/* SPDX-License-Identifier: MIT */
/* workfiles.c - a job's files in a work dir (workfiles.h): a note of the
 * files there at the start and of the input files written, the walk that
 * finds what the code created, and the reads and writes, each path
 * opened one component at a time without following a symlink, since the
 * code running in that dir controls its tree. */
#include "coderq/local/workfiles.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coderq/common/util.h"
#include "coderq/local/kernel.h"

typedef struct snap_entry {
        char *name;
        off_t size;
        struct timespec mtime;
} snap_entry_t;

typedef struct snap {
        snap_entry_t *v;
        size_t n, alloc;
} snap_t;

struct cq_workfiles {
        char *dir;
        snap_t snap;   /* files at start, and input files as written */
        char **inputs; /* names given to cq_workfiles_put() */
        size_t ninputs;
};

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

static int walk_work_dir(const cq_workfiles_t *wf, walk_fn_t *fn, void *opaque)
{
        size_t budget = 10000;
        int fd = open(wf->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

        if (fd < 0)
                return -1;
        return walk(fd, "", 0, &budget, fn, opaque);
}

static int snap_cb(void *opaque, const char *name, const struct stat *st)
{
        return snap_put(opaque, name, st);
}

void cq_workfiles_destroy(cq_workfiles_t **wfp)
{
        cq_workfiles_t *wf = *wfp;
        size_t i;

        if (!wf)
                return;
        *wfp = NULL;
        for (i = 0; i < wf->ninputs; i++)
                free(wf->inputs[i]);
        free(wf->inputs);
        snap_release(&wf->snap);
        free(wf->dir);
        free(wf);
}

cq_workfiles_t *
cq_workfiles_new(const char *dir, char *errstr, size_t errstr_size)
{
        cq_workfiles_t *wf = calloc(1, sizeof(*wf));

        if (!wf || !(wf->dir = strdup(dir))) {
                cq_errstr_set(errstr, errstr_size,
                              "could not list work dir \"%s\": out of memory",
                              dir);
                cq_workfiles_destroy(&wf);
                return NULL;
        }
        if (walk_work_dir(wf, snap_cb, &wf->snap)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not list work dir \"%s\"", dir);
                cq_workfiles_destroy(&wf);
                return NULL;
        }
        return wf;
}

const char *cq_workfiles_dir(const cq_workfiles_t *wf) { return wf->dir; }

cq_err_t cq_workfiles_put(cq_workfiles_t *wf,
                          const char *name,
                          const void *data,
                          size_t len,
                          const cq_sandbox_id_t *own,
                          char *errstr,
                          size_t errstr_size)
{
        const char *p = data;
        struct stat st;
        char **inputs;
        int fd;

        if (!cq_relpath_is_safe(name) ||
            strncmp(name, CQ_KERNEL_RUN_DIR, strlen(CQ_KERNEL_RUN_DIR)) == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not write \"%s\": unsafe file name", name);
                return CQ_ERR_FATAL;
        }
        /* Parent dirs made here belong to us; the tree goes to the
         * code's uid so that it can write next to its inputs. */
        fd = open_beneath(wf->dir, name, true, own);
        if (fd < 0) {
                cq_errstr_set(errstr, errstr_size, "could not write \"%s\": %s",
                              name, strerror(errno));
                return CQ_ERR_RETRIABLE;
        }
        while (len > 0) {
                ssize_t n = write(fd, p, len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not write \"%s\": %s", name,
                                      strerror(errno));
                        close(fd);
                        return CQ_ERR_RETRIABLE;
                }
                p += n;
                len -= (size_t)n;
        }
        if (fstat(fd, &st) || close(fd)) {
                cq_errstr_set(errstr, errstr_size, "could not write \"%s\": %s",
                              name, strerror(errno));
                return CQ_ERR_RETRIABLE;
        }
        inputs = realloc(wf->inputs, (wf->ninputs + 1) * sizeof(*inputs));
        if (!inputs || snap_put(&wf->snap, name, &st)) {
                if (inputs)
                        wf->inputs = inputs;
                cq_errstr_set(errstr, errstr_size,
                              "could not record \"%s\": out of memory", name);
                return CQ_ERR_RETRIABLE;
        }
        wf->inputs = inputs;
        wf->inputs[wf->ninputs] = strdup(name);
        if (wf->inputs[wf->ninputs])
                wf->ninputs++;
        return CQ_OK;
}

static bool is_input(const cq_workfiles_t *wf, const char *name)
{
        size_t i;

        for (i = 0; i < wf->ninputs; i++)
                if (strcmp(wf->inputs[i], name) == 0)
                        return true;
        return false;
}

static cq_err_t read_file(const cq_workfiles_t *wf,
                          const char *name,
                          size_t max,
                          cq_file_t *file,
                          char *errstr,
                          size_t errstr_size)
{
        struct stat st;
        unsigned char *data = NULL;
        size_t off = 0;
        int fd = open_beneath(wf->dir, name, false, NULL);

        if (fd < 0) {
                cq_errstr_set(errstr, errstr_size, "could not open \"%s\": %s",
                              name, strerror(errno));
                return errno == ENOENT ? CQ_ERR_FATAL : CQ_ERR_RETRIABLE;
        }
        if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": not a regular file",
                              name);
                close(fd);
                return CQ_ERR_FATAL;
        }
        if ((size_t)st.st_size > max) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": %lld bytes is above the "
                              "%zu byte cap",
                              name, (long long)st.st_size, max);
                close(fd);
                return CQ_ERR_TOO_LARGE;
        }
        data = malloc((size_t)st.st_size + 1);
        if (!data) {
                close(fd);
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": out of memory", name);
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
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": out of memory", name);
                return CQ_ERR_RETRIABLE;
        }
        return CQ_OK;
}

typedef struct created_ctx {
        cq_workfiles_t *wf;
        cq_files_t *files;
        size_t alloc;
} created_ctx_t;

static int created_cb(void *opaque, const char *name, const struct stat *st)
{
        created_ctx_t *ctx = opaque;
        snap_entry_t *e = snap_find(&ctx->wf->snap, name);
        cq_file_t *f;

        if (is_input(ctx->wf, name))
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

cq_err_t cq_workfiles_created(cq_workfiles_t *wf,
                              bool with_data,
                              cq_files_t *files,
                              char *errstr,
                              size_t errstr_size)
{
        created_ctx_t ctx = {wf, files, 0};
        char err[300];
        size_t i;

        files->v = NULL;
        files->n = 0;
        if (walk_work_dir(wf, created_cb, &ctx)) {
                cq_errstr_set(errstr, errstr_size, "could not list \"%s\": %s",
                              wf->dir, strerror(errno));
                cq_files_release(files);
                return CQ_ERR_RETRIABLE;
        }
        for (i = 0; with_data && i < files->n; i++) {
                cq_file_t one = {0};

                /* one that cannot be read is listed without its bytes */
                if (read_file(wf, files->v[i].name, CREATED_READ_MAX, &one, err,
                              sizeof(err)) != CQ_OK)
                        continue;
                files->v[i].data = one.data;
                files->v[i].len = one.len;
                one.data = NULL;
                free(one.name);
                free(one.mime);
        }
        return CQ_OK;
}

cq_err_t cq_workfiles_get(cq_workfiles_t *wf,
                          const char *name,
                          size_t max,
                          cq_file_t *file,
                          char *errstr,
                          size_t errstr_size)
{
        memset(file, 0, sizeof(*file));
        return read_file(wf, name, max, file, errstr, errstr_size);
}
