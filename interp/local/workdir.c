/* SPDX-License-Identifier: MIT */
/* workdir.c - the work root and the kernels' work dirs in it: created with
 * the modes and ownership a uid per kernel needs, removed without
 * following symlinks (the code in a kernel controls what is inside), and
 * swept of the dirs of workers that are gone. */
#include "coderq/local/workdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coderq/common/log.h"

void cq_work_root_default(char *out, size_t size)
{
        const char *tmp = getenv("TMPDIR");

        snprintf(out, size, "%s/coderq", tmp && *tmp == '/' ? tmp : "/tmp");
}

/* The work root \p root, copied into \p path to work in, and its
 * missing parents. -1 with \p errstr filled. */
static int
make_root(const char *root, char *path, char *errstr, size_t errstr_size)
{
        size_t i, len = strlen(path);

        /* Missing parents as mkdir -p makes them; the root itself 0711:
         * kernel uids must traverse it, not list it. */
        for (i = 1; i < len; i++) {
                if (path[i] != '/')
                        continue;
                path[i] = '\0';
                if (mkdir(path, 0755) && errno != EEXIST) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not create \"%s\" for the "
                                      "work root: %s",
                                      path, strerror(errno));
                        return -1;
                }
                path[i] = '/';
        }
        if (mkdir(root, 0711) == 0) {
                if (chmod(root, 0711)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not chmod work root \"%s\": "
                                      "%s",
                                      root, strerror(errno));
                        return -1;
                }
        } else if (errno != EEXIST) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create work root \"%s\": %s", root,
                              strerror(errno));
                return -1;
        }
        return 0;
}

/* Keep the existing work root (open as \p fd, \p st its stat) only when
 * it is safe to work in as root, tightened to 0711. -1 with \p errstr
 * filled. */
static int tighten_root(const char *root,
                        int fd,
                        const struct stat *st,
                        char *errstr,
                        size_t errstr_size)
{
        char was[8], now[8];

        /* Work dirs are made and removed in it as root: one that others
         * own or may write could have them swapped for symlinks. A
         * directory others may write is shared (/tmp): never chmod it. */
        if (st->st_uid != geteuid() || (st->st_mode & 022)) {
                cq_errstr_set(errstr, errstr_size,
                              "work root \"%s\" must belong to uid %ld and "
                              "be writable only by it (it is uid %ld, mode "
                              "%04o)",
                              root, (long)geteuid(), (long)st->st_uid,
                              (unsigned)(st->st_mode & 07777));
                return -1;
        }
        /* Ours, but others may list it (or a special bit is set): made
         * 0711, so that kernel uids can reach their work dirs and not
         * list the others'. Tighter modes stay. */
        if (st->st_mode & 07777 & ~(mode_t)0711) {
                mode_t tight = st->st_mode & 0711;

                if (fchmod(fd, tight) != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not chmod work root \"%s\" "
                                      "from %04o to %04o: %s",
                                      root, (unsigned)(st->st_mode & 07777),
                                      (unsigned)tight, strerror(errno));
                        return -1;
                }
                snprintf(was, sizeof(was), "%04o",
                         (unsigned)(st->st_mode & 07777));
                snprintf(now, sizeof(now), "%04o", (unsigned)tight);
                cq_log_kv(
                    CQ_LOG_WARN, "work root was looser than 0711; tightened it",
                    "work_root", root, "mode_was", was, "mode", now, NULL);
        }
        return 0;
}

int cq_work_root_prepare(const char *root, char *errstr, size_t errstr_size)
{
        char path[PATH_MAX];
        struct stat st;
        size_t len = strlen(root);
        int fd = -1, rc = -1;

        if (root[0] != '/' || len >= sizeof(path)) {
                cq_errstr_set(errstr, errstr_size,
                              "work root \"%s\" must be an absolute path "
                              "shorter than %zu bytes",
                              root, sizeof(path));
                return -1;
        }
        memcpy(path, root, len + 1);
        if (make_root(root, path, errstr, errstr_size))
                return -1;
        /* Opened without following a symlink, then checked and tightened
         * through the descriptor: the path cannot be swapped between the
         * check and the chmod. */
        while (len > 1 && path[len - 1] == '/')
                path[--len] = '\0'; /* "dir/" would follow a symlink */
        fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0) {
                int e = errno;

                if (!errstr)
                        goto out;
                /* O_DIRECTORY | O_NOFOLLOW on a symlink: ENOTDIR or ELOOP */
                if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
                        cq_errstr_set(
                            errstr, errstr_size,
                            "work root \"%s\" is a symbolic link; name "
                            "the directory itself",
                            root);
                else
                        cq_errstr_set(errstr, errstr_size,
                                      "work root \"%s\" is not a directory: %s",
                                      root, strerror(e));
                goto out;
        }
        rc = tighten_root(root, fd, &st, errstr, errstr_size);
out:
        if (fd >= 0)
                close(fd);
        return rc;
}

int cq_work_dir_new(const char *root,
                    char *out,
                    size_t out_size,
                    char *errstr,
                    size_t errstr_size)
{
        char def[PATH_MAX];

        if (!root) {
                cq_work_root_default(def, sizeof(def));
                root = def;
        }
        if (cq_work_root_prepare(root, errstr, errstr_size))
                return -1;
        /* The worker's pid in the name lets cq_work_root_sweep() tell the
         * dirs of workers that are gone. The kernel gives the dir to the
         * uid it runs as (cq_kernel_new()). */
        if (snprintf(out, out_size, "%s/k-%ld-XXXXXX", root, (long)getpid()) >=
                (int)out_size ||
            !mkdtemp(out)) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create work dir in \"%s\": %s", root,
                              strerror(errno));
                return -1;
        }
        return 0;
}

/* A fresh name in the top dir for an entry moved up into it; the names
 * are tried in turn, so that none is taken twice. */
static int move_up(int sub, const char *name, int top, unsigned long *next)
{
        char fresh[32];
        int tries;

        for (tries = 0; tries < 64; tries++) {
                snprintf(fresh, sizeof(fresh), ".cq-rm-%lu", (*next)++);
                if (renameat2(sub, name, top, fresh, RENAME_NOREPLACE) == 0)
                        return 0;
                if (errno != EEXIST)
                        return -1;
        }
        return -1;
}

/* Moves the entries of the dir \p name in \p top up into \p top, then
 * removes it. How many entries were moved or removed (progress), or -1
 * when \p name is not a dir (a symlink is not followed). */
static long flatten(int top, const char *name, unsigned long *next)
{
        int fd =
            openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        long done = 0;
        struct dirent *de;
        DIR *dir;

        if (fd < 0)
                return errno == ENOTDIR || errno == ELOOP ? -1 : 0;
        dir = fdopendir(fd);
        if (!dir) {
                close(fd);
                return 0;
        }
        while ((de = readdir(dir))) {
                if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                        continue;
                if (move_up(dirfd(dir), de->d_name, top, next) == 0)
                        done++;
        }
        closedir(dir);
        /* ENOTEMPTY (some entry could not be moved, or came while it was
         * read): the next scan of the top dir tries again */
        if (unlinkat(top, name, AT_REMOVEDIR) == 0)
                done++;
        return done;
}

/* Empties the dir \p top with two descriptors whatever its depth: files
 * and symlinks are unlinked where they are; a dir's entries are moved up
 * into \p top (renameat2() opens nothing, and cannot follow a link), and
 * the emptied dir removed. Takes \p top. Each entry moves at most once. Every
 * scan must remove or move something, else it gives up: what stays is left. */
static void empty_dir(int top)
{
        DIR *dir = fdopendir(top);
        unsigned long next = 0;
        struct dirent *de;

        if (!dir) {
                close(top);
                return;
        }
        for (;;) {
                size_t seen = 0, done = 0;
                long n;

                rewinddir(dir);
                while ((de = readdir(dir))) {
                        if (!strcmp(de->d_name, ".") ||
                            !strcmp(de->d_name, ".."))
                                continue;
                        seen++;
                        if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN &&
                            unlinkat(top, de->d_name, 0) == 0) {
                                done++;
                                continue;
                        }
                        n = flatten(top, de->d_name, &next);
                        if (n > 0)
                                done += (size_t)n;
                        else if (n < 0 && unlinkat(top, de->d_name, 0) == 0)
                                done++;
                }
                if (!seen || !done)
                        break;
        }
        closedir(dir);
}

static void remove_at(int dfd, const char *name)
{
        int fd =
            openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

        if (fd < 0) {
                unlinkat(dfd, name, 0);
                return;
        }
        empty_dir(fd);
        if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
                cq_log_kv(CQ_LOG_WARN, "could not remove a work dir", "path",
                          name, "error", strerror(errno), NULL);
}

void cq_work_dir_remove(const char *path) { remove_at(AT_FDCWD, path); }

/* The pid in a work dir name "k-PID-XXXXXX", or -1. */
static long name_pid(const char *name)
{
        const char *p = name + 2;
        long pid = 0;

        if (strncmp(name, "k-", 2) != 0 || *p < '1' || *p > '9')
                return -1;
        for (; *p >= '0' && *p <= '9'; p++) {
                if (pid > INT32_MAX / 10)
                        return -1;
                pid = pid * 10 + (*p - '0');
        }
        return *p == '-' ? pid : -1;
}

int cq_work_root_sweep(const char *root)
{
        char def[PATH_MAX];
        struct dirent *de;
        DIR *dir;
        int fd, removed = 0;

        if (!root) {
                cq_work_root_default(def, sizeof(def));
                root = def;
        }
        fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -1;
        dir = fdopendir(fd);
        if (!dir) {
                close(fd);
                return -1;
        }
        while ((de = readdir(dir))) {
                long pid = name_pid(de->d_name);

                if (pid <= 0 || pid == (long)getpid())
                        continue;
                /* EPERM: alive, someone else's */
                if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
                        continue;
                remove_at(dirfd(dir), de->d_name);
                removed++;
        }
        closedir(dir);
        return removed;
}
