/* SPDX-License-Identifier: MIT */
/* kinit/kinit.c - the outer process and pid 1 of a sandboxed forked kernel: a
 * small program of its own (built into the coderq binary, started by the
 * kernel server from a memfd; see docs/internals/protocols/kernel-server.md) so
 * that the only copy of the server's Python image a kernel costs is the
 * kernel's. It uses libc alone and links no sanitizer.
 *
 * Descriptors: 3 the kernel log, 4 the worker's life pipe, 5 a
 * SOCK_SEQPACKET socket to the server. argv is what ps shows of pid 1
 * (the cold kernel's command line); the settings come as the first
 * datagram on 5: NUL-separated key=value (work, uid, gid, drop, mem,
 * nproc, fsize, nice, tmp, shm: the sizes of /tmp and /dev/shm, 0 for
 * Linux's default).
 *
 * The outer process enters new mount, pid, network, IPC, UTS and cgroup
 * namespaces and forks pid 1, tells the server pid 1's pid, then waits
 * for it (without reaping: the server, a subreaper, does) or kills it
 * when the worker is gone. Pid 1 builds the kernel's filesystem, brings
 * loopback up, makes a session, confines itself, says "ready", gets a
 * pidfd on the kernel (which the server forks into these namespaces)
 * and reaps orphans until the kernel exits. */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOG_FD         3
#define LIFE_FD        4
#define CTL_FD         5
#define MSG_MAX        8192
#define MOUNTS_MAX     256
#define KERNEL_WAIT_MS 10000

typedef struct settings {
        char work[PATH_MAX];
        unsigned long long uid, gid, mem, nproc, fsize, tmp, shm;
        long long nice;
        bool drop;
        /* the kernel's matplotlibrc, made on its /tmp, or none */
        const char *mplrc;
        size_t mplrc_len;
} settings_t;

/* Where a sandboxed kernel's matplotlibrc goes (kernel.h's
 * CQ_KERNEL_BOXED_MPLCONFIGDIR), under the new root. */
#define MPL_DIR  "/newroot/tmp/matplotlib"
#define MPL_FILE MPL_DIR "/matplotlibrc"

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt,
                                                                ...)
{
        char msg[1024];
        va_list ap;
        int n;

        va_start(ap, fmt);
        n = vsnprintf(msg, sizeof(msg) - 1, fmt, ap);
        va_end(ap);
        if (n < 0)
                n = 0;
        if ((size_t)n > sizeof(msg) - 2)
                n = (int)sizeof(msg) - 2;
        msg[n++] = '\n';
        if (write(LOG_FD, "kernel server: ", 15) < 0 ||
            write(LOG_FD, msg, (size_t)n) < 0) {
                /* nothing left to tell it with */
        }
        _exit(126);
}

static void check(int rc, const char *what, const char *arg)
{
        if (rc != 0)
                die("could not %s%s%s: %s", what, arg ? " " : "",
                    arg ? arg : "", strerror(errno));
}

static bool parse_ull(const char *s, unsigned long long *out)
{
        char *end;

        if (!*s || *s == '-')
                return false;
        errno = 0;
        *out = strtoull(s, &end, 10);
        return errno == 0 && *end == '\0';
}

static void parse_settings(const char *msg, size_t len, settings_t *st)
{
        const char *p = msg, *end = msg + len;
        bool have_work = false;

        memset(st, 0, sizeof(*st));
        while (p < end) {
                const char *kv = p, *eq;
                size_t n = strnlen(p, (size_t)(end - p));
                unsigned long long v = 0;
                bool ok;

                if (n == (size_t)(end - p))
                        die("bad settings: an entry without its NUL");
                p += n + 1;
                eq = strchr(kv, '=');
                if (!eq)
                        die("bad settings: \"%.40s\" has no '='", kv);
                if (strncmp(kv, "work=", 5) == 0) {
                        ok = eq[1] == '/' && strlen(eq + 1) < sizeof(st->work);
                        if (ok)
                                snprintf(st->work, sizeof(st->work), "%s",
                                         eq + 1);
                        have_work = ok;
                } else if (strncmp(kv, "mplrc=", 6) == 0) {
                        /* any text: it stays in msg, which outlives st */
                        st->mplrc = eq + 1;
                        st->mplrc_len = strlen(eq + 1);
                        ok = true;
                } else if (strncmp(kv, "nice=", 5) == 0) {
                        char *e;

                        errno = 0;
                        st->nice = strtoll(eq + 1, &e, 10);
                        ok = errno == 0 && e != eq + 1 && *e == '\0' &&
                             st->nice >= -20 && st->nice <= 19;
                } else {
                        ok = parse_ull(eq + 1, &v);
                        if (!ok)
                                die("bad settings: \"%.60s\"", kv);
                        if (strncmp(kv, "uid=", 4) == 0)
                                st->uid = v;
                        else if (strncmp(kv, "gid=", 4) == 0)
                                st->gid = v;
                        else if (strncmp(kv, "drop=", 5) == 0)
                                st->drop = v != 0;
                        else if (strncmp(kv, "mem=", 4) == 0)
                                st->mem = v;
                        else if (strncmp(kv, "nproc=", 6) == 0)
                                st->nproc = v;
                        else if (strncmp(kv, "fsize=", 6) == 0)
                                st->fsize = v;
                        else if (strncmp(kv, "tmp=", 4) == 0)
                                st->tmp = v;
                        else if (strncmp(kv, "shm=", 4) == 0)
                                st->shm = v;
                        else
                                die("bad settings: unknown \"%.40s\"", kv);
                }
                if (!ok)
                        die("bad settings: \"%.60s\"", kv);
        }
        if (!have_work || st->uid > 0x7fffffffULL || st->gid > 0x7fffffffULL)
                die("bad settings: no work dir, or an id out of range");
}

static void xmount(const char *src,
                   const char *dst,
                   const char *type,
                   unsigned long flags,
                   const char *data)
{
        check(mount(src, dst, type, flags, data), "mount on", dst);
}

/* mkdir -p, 0755. */
static void mkdirs(const char *path)
{
        char p[PATH_MAX];
        size_t i, n = strlen(path);

        if (n >= sizeof(p))
                die("path too long: %.80s", path);
        memcpy(p, path, n + 1);
        for (i = 1; i <= n; i++) {
                if (p[i] != '/' && p[i] != '\0')
                        continue;
                p[i] = '\0';
                if (mkdir(p, 0755) != 0 && errno != EEXIST)
                        check(-1, "make", p);
                p[i] = path[i];
        }
}

/* Field 5 of a mountinfo line, its \ooo escapes undone, into \p out. */
static bool mount_point(const char *line, char *out, size_t size)
{
        const char *p = line;
        size_t n = 0;
        int f;

        for (f = 0; f < 4; f++) {
                p = strchr(p, ' ');
                if (!p)
                        return false;
                p++;
        }
        while (*p && *p != ' ' && n + 1 < size) {
                if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' &&
                    p[2] <= '7' && p[3] >= '0' && p[3] <= '7') {
                        out[n++] = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 +
                                          (p[3] - '0'));
                        p += 4;
                } else {
                        out[n++] = *p++;
                }
        }
        out[n] = '\0';
        return *p == ' ';
}

static int by_length(const void *a, const void *b)
{
        size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);

        return la < lb ? -1 : la > lb;
}

/* Remount \p path and every mount below it read-only: a bind with MS_REC
 * keeps submounts writable otherwise (/etc/hosts in a container). Between
 * the two pivots the host's /proc is under /oldroot. */
static void remount_ro_under(const char *path, unsigned long flags)
{
        char *found[MOUNTS_MAX], line[8192], mp[PATH_MAX];
        size_t n = 0, i, plen = strlen(path);
        FILE *fp = fopen("/oldroot/proc/self/mountinfo", "re");

        if (!fp)
                fp = fopen("/proc/self/mountinfo", "re");
        if (!fp)
                check(-1, "read", "mountinfo");
        while (fgets(line, sizeof(line), fp)) {
                if (!mount_point(line, mp, sizeof(mp)))
                        continue;
                if (strcmp(mp, path) != 0 &&
                    !(strncmp(mp, path, plen) == 0 && mp[plen] == '/'))
                        continue;
                if (n == MOUNTS_MAX)
                        die("more than %d mounts under %s", MOUNTS_MAX, path);
                found[n] = strdup(mp);
                if (!found[n])
                        die("out of memory");
                n++;
        }
        fclose(fp);
        qsort(found, n, sizeof(found[0]), by_length);
        for (i = 0; i < n; i++) {
                if ((i == 0 || strcmp(found[i], found[i - 1]) != 0) &&
                    mount(NULL, found[i], NULL,
                          MS_REMOUNT | MS_BIND | MS_RDONLY | flags,
                          NULL) != 0 &&
                    strcmp(found[i], path) == 0)
                        check(-1, "remount read-only", path);
        }
        for (i = 0; i < n; i++)
                free(found[i]);
}

static void
bind_mount(const char *src, const char *dst, bool ro, unsigned long fl)
{
        xmount(src, dst, NULL, MS_BIND | MS_REC, NULL);
        if (ro)
                remount_ro_under(dst, fl);
        else
                xmount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | fl, NULL);
}

static void path2(char *out, size_t size, const char *a, const char *b)
{
        if ((size_t)snprintf(out, size, "%s%s", a, b) >= size)
                die("path too long: %.60s%.60s", a, b);
}

/* Mount options of a tmpfs the kernel owns (\p own), \p size bytes at
 * most (0: Linux's default). */
static void
tmpfs_opts(char *out, size_t n, const char *own, unsigned long long size)
{
        if (size)
                snprintf(out, n, "%s,size=%llu", own, size);
        else
                snprintf(out, n, "%s", own);
}

/* The kernel's matplotlibrc on its /tmp, as bubblewrap's --dir and
 * --file make it for a cold kernel (sandbox.c): a directory 0700 and a
 * file 0600, the kernel's. */
static void write_mplrc(const settings_t *st)
{
        size_t off = 0;
        int fd;

        check(mkdir(MPL_DIR, 0700), "make", MPL_DIR);
        check(chown(MPL_DIR, (uid_t)st->uid, (gid_t)st->gid), "own", MPL_DIR);
        fd = open(MPL_FILE,
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                check(-1, "make", MPL_FILE);
        while (off < st->mplrc_len) {
                ssize_t n = write(fd, st->mplrc + off, st->mplrc_len - off);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        check(-1, "write", MPL_FILE);
                off += (size_t)n;
        }
        check(fchown(fd, (uid_t)st->uid, (gid_t)st->gid), "own", MPL_FILE);
        check(close(fd), "write", MPL_FILE);
}

/* The filesystem bubblewrap builds for a kernel (sandbox.c): /usr and
 * /etc read-only, fresh /proc, minimal /dev, private /tmp and /dev/shm
 * of their sizes, the work dir the only writable bind, the root and /dev
 * read-only; everything else does not exist. */
static void build_root(const settings_t *st)
{
        static const char *const devices[] = {"null",   "zero",    "full",
                                              "random", "urandom", "tty"};
        static const char *const dev_links[][2] = {
            {"fd", "/proc/self/fd"},       {"stdin", "/proc/self/fd/0"},
            {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
            {"core", "/proc/kcore"},       {"ptmx", "pts/ptmx"}};
        static const char *const links[][2] = {{"lib", "usr/lib"},
                                               {"lib64", "usr/lib64"},
                                               {"bin", "usr/bin"},
                                               {"sbin", "usr/sbin"}};
        const unsigned long nsnd = MS_NOSUID | MS_NODEV;
        char own[64], sized[96], a[PATH_MAX + 16], b[PATH_MAX + 16],
            w[PATH_MAX + 16];
        uid_t uid = (uid_t)st->uid;
        gid_t gid = (gid_t)st->gid;
        size_t i;
        int fd;

        snprintf(own, sizeof(own), "mode=0755,uid=%u,gid=%u", (unsigned)uid,
                 (unsigned)gid);
        xmount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
        xmount("tmpfs", "/tmp", "tmpfs", nsnd, "mode=0700");
        check(chdir("/tmp"), "enter", "/tmp");
        check(mkdir("newroot", 0700), "make", "newroot");
        check(mkdir("oldroot", 0700), "make", "oldroot");
        check((int)syscall(SYS_pivot_root, "/tmp", "/tmp/oldroot"),
              "pivot_root", NULL);
        check(chdir("/"), "enter", "/");
        xmount("tmpfs", "/newroot", "tmpfs", nsnd, own);
        mkdirs("/newroot/usr");
        bind_mount("/oldroot/usr", "/newroot/usr", true, nsnd);
        mkdirs("/newroot/etc");
        bind_mount("/oldroot/etc", "/newroot/etc", true, nsnd);
        for (i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
                path2(a, sizeof(a), "/newroot/", links[i][0]);
                check(symlink(links[i][1], a), "link", a);
        }
        mkdirs("/newroot/proc");
        xmount("proc", "/newroot/proc", "proc", nsnd | MS_NOEXEC, NULL);
        mkdirs("/newroot/dev");
        xmount("tmpfs", "/newroot/dev", "tmpfs", nsnd, own);
        for (i = 0; i < sizeof(devices) / sizeof(devices[0]); i++) {
                path2(a, sizeof(a), "/newroot/dev/", devices[i]);
                path2(b, sizeof(b), "/oldroot/dev/", devices[i]);
                fd = open(a, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
                check(fd < 0 ? -1 : close(fd), "make", a);
                bind_mount(b, a, false, MS_NOSUID);
        }
        for (i = 0; i < sizeof(dev_links) / sizeof(dev_links[0]); i++) {
                path2(a, sizeof(a), "/newroot/dev/", dev_links[i][0]);
                check(symlink(dev_links[i][1], a), "link", a);
        }
        check(mkdir("/newroot/dev/shm", 0755), "make", "/dev/shm");
        tmpfs_opts(sized, sizeof(sized), own, st->shm);
        xmount("tmpfs", "/newroot/dev/shm", "tmpfs", nsnd, sized);
        check(mkdir("/newroot/dev/pts", 0755), "make", "/dev/pts");
        xmount("devpts", "/newroot/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=620");
        mkdirs("/newroot/tmp");
        tmpfs_opts(sized, sizeof(sized), own, st->tmp);
        xmount("tmpfs", "/newroot/tmp", "tmpfs", nsnd, sized);
        if (st->mplrc)
                write_mplrc(st);
        path2(w, sizeof(w), "/newroot", st->work);
        path2(b, sizeof(b), "/oldroot", st->work);
        mkdirs(w);
        bind_mount(b, w, false, nsnd);
        /* Parents of the work dir were made by root: give the ones inside
         * the kernel's own tmpfs to it, as bubblewrap (running as the
         * kernel's uid) would have. */
        {
                const char *top = strncmp(w, "/newroot/tmp/", 13) == 0
                                      ? "/newroot/tmp"
                                      : "/newroot";
                size_t tl = strlen(top);
                char *slash;

                snprintf(a, sizeof(a), "%s", w);
                while ((slash = strrchr(a, '/')) != NULL && slash > a) {
                        *slash = '\0';
                        if (strlen(a) <= tl)
                                break;
                        check(chown(a, uid, gid), "own", a);
                }
        }
        /* every mount point exists: the root and /dev, tmpfs the kernel
         * owns, become read-only, as bubblewrap's --remount-ro makes them */
        xmount(NULL, "/newroot/dev", NULL,
               MS_REMOUNT | MS_BIND | MS_RDONLY | nsnd, NULL);
        xmount(NULL, "/newroot", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | nsnd,
               NULL);
        xmount(NULL, "/oldroot", NULL, MS_REC | MS_PRIVATE, NULL);
        check(umount2("/oldroot", MNT_DETACH), "unmount", "the old root");
        check(chdir("/newroot"), "enter", "/newroot");
        check((int)syscall(SYS_pivot_root, ".", "."), "pivot_root", ".");
        check(umount2(".", MNT_DETACH), "unmount", "the base");
        check(chdir("/"), "enter", "/");
}

static void loopback_up(void)
{
        struct ifreq ifr;
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

        if (s < 0)
                check(-1, "open", "a socket for loopback");
        memset(&ifr, 0, sizeof(ifr));
        snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
        check(ioctl(s, SIOCGIFFLAGS, &ifr), "read", "loopback's flags");
        ifr.ifr_flags |= IFF_UP;
        check(ioctl(s, SIOCSIFFLAGS, &ifr), "bring up", "loopback");
        close(s);
}

/* rlimits, an empty bounding set, the kernel's uid, no new privileges:
 * what kserver.py's confine() does for the kernel. */
static void confine(const settings_t *st)
{
        const struct {
                int res;
                unsigned long long v;
        } lim[] = {{RLIMIT_AS, st->mem},
                   {RLIMIT_NPROC, st->nproc},
                   {RLIMIT_FSIZE, st->fsize}};
        const struct rlimit no_core = {0, 0};
        size_t i;

        /* no core files (a crash helper would write them as root) */
        check(setrlimit(RLIMIT_CORE, &no_core), "set", "the core file limit");
        for (i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
                struct rlimit rl = {(rlim_t)lim[i].v, (rlim_t)lim[i].v};

                if (lim[i].v)
                        check(setrlimit(lim[i].res, &rl), "set", "an rlimit");
        }
        if (geteuid() == 0) {
                int cap;

                for (cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
                        check(prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop",
                              "a capability");
        }
        if (st->drop) {
                gid_t g = (gid_t)st->gid;

                check(setgroups(1, &g), "set", "groups");
                check(setgid(g), "set", "the gid");
                check(setuid((uid_t)st->uid), "set", "the uid");
                if (setuid(0) == 0)
                        die("could not drop root");
        }
        check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set", "no_new_privs");
}

static bool life_gone(void)
{
        struct pollfd p = {LIFE_FD, 0, 0};

        return poll(&p, 1, 0) > 0;
}

/* The kernel's pidfd from the server, waiting at most KERNEL_WAIT_MS. */
static int recv_kernel(void)
{
        struct pollfd p = {CTL_FD, POLLIN, 0};
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        char data[16];
        struct iovec iov = {data, sizeof(data)};
        struct msghdr mh;
        struct cmsghdr *c;
        int fd = -1;

        if (poll(&p, 1, KERNEL_WAIT_MS) != 1)
                die("the kernel did not come in %d ms", KERNEL_WAIT_MS);
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof(u.buf);
        if (recvmsg(CTL_FD, &mh, MSG_CMSG_CLOEXEC) <= 0)
                die("the server sent no kernel");
        c = CMSG_FIRSTHDR(&mh);
        if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len == CMSG_LEN(sizeof(int)))
                memcpy(&fd, CMSG_DATA(c), sizeof(int));
        if (fd < 0)
                die("the server sent no kernel descriptor");
        return fd;
}

/* Pid 1: the filesystem, the kernel's identity, then it reaps orphans
 * until the kernel exits. */
__attribute__((noreturn)) static void run_init(const settings_t *st, int go)
{
        struct pollfd p[2];
        sigset_t chld;
        char byte;
        int kfd, sfd;

        if (read(go, &byte, 1) != 1)
                _exit(1); /* the outer process is gone */
        close(go);
        build_root(st);
        loopback_up();
        check(setsid() < 0 ? -1 : 0, "make", "a session");
        confine(st);
        check(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "set", "pdeathsig");
        if (life_gone())
                _exit(1);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        sigprocmask(SIG_BLOCK, &chld, NULL);
        sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
        if (sfd < 0)
                check(-1, "open", "a signalfd");
        if (send(CTL_FD, "ready", 5, MSG_NOSIGNAL) != 5)
                die("could not tell the server: %s", strerror(errno));
        kfd = recv_kernel();
        close(CTL_FD);
        close(LIFE_FD);
        p[0] = (struct pollfd){kfd, POLLIN, 0};
        p[1] = (struct pollfd){sfd, POLLIN, 0};
        for (;;) {
                struct signalfd_siginfo si;

                if (poll(p, 2, -1) < 0 && errno != EINTR)
                        _exit(1);
                while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                        ;
                while (waitpid(-1, NULL, WNOHANG) > 0)
                        ;
                if (p[0].revents)
                        _exit(0);
        }
}

int main(void)
{
        char msg[MSG_MAX], ack[32];
        struct pollfd p[2];
        settings_t st;
        siginfo_t info;
        int go[2], pfd, n;
        ssize_t len;
        pid_t kid;

        syscall(SYS_close_range, 6U, ~0U, 0U);
        /* run from a memfd, its name would be the descriptor's number */
        prctl(PR_SET_NAME, "coderq-kinit", 0, 0, 0);
        len = recv(CTL_FD, msg, sizeof(msg), MSG_TRUNC);
        if (len <= 0 || (size_t)len > sizeof(msg))
                die("no settings from the server");
        parse_settings(msg, (size_t)len, &st);
        check(setpgid(0, 0), "make", "a process group");
        if (st.nice)
                check(setpriority(PRIO_PROCESS, 0, (int)st.nice), "set",
                      "the niceness");
        check(unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                      CLONE_NEWUTS | CLONE_NEWCGROUP),
              "unshare", NULL);
        check(pipe2(go, O_CLOEXEC), "make", "a pipe");
        kid = fork();
        if (kid < 0)
                check(-1, "fork", NULL);
        if (kid == 0) {
                close(go[1]);
                run_init(&st, go[0]);
        }
        close(go[0]);
        n = snprintf(ack, sizeof(ack), "pid=%ld", (long)kid);
        if (send(CTL_FD, ack, (size_t)n, MSG_NOSIGNAL) != n)
                die("could not tell the server: %s", strerror(errno));
        /* pid 1 may go on once the server has its pid */
        if (write(go[1], "g", 1) != 1)
                die("could not start pid 1: %s", strerror(errno));
        close(go[1]);
        close(CTL_FD);
        pfd = (int)syscall(SYS_pidfd_open, kid, 0);
        if (pfd < 0)
                check(-1, "hold", "pid 1");
        p[0] = (struct pollfd){pfd, POLLIN, 0};
        p[1] = (struct pollfd){LIFE_FD, 0, 0};
        for (;;) {
                if (poll(p, 2, -1) < 0 && errno != EINTR)
                        break;
                if (p[0].revents)
                        break;
                if (p[1].revents) {
                        kill(kid, SIGKILL);
                        break;
                }
        }
        memset(&info, 0, sizeof(info));
        if (waitid(P_PID, (id_t)kid, &info, WEXITED | WNOWAIT) != 0)
                _exit(1);
        _exit(info.si_code == CLD_EXITED ? info.si_status & 0xff
                                         : 128 + (info.si_status & 0x7f));
}
