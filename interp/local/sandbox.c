/* SPDX-License-Identifier: MIT */
/* sandbox.c - confinement of local kernels with bubblewrap, unprivileged
 * uids and rlimits; the startup probe that decides whether bubblewrap
 * works; the lease of per-kernel uids.
 *
 * Kernels forked by the kernel server (kserver.py) are confined to the
 * same effect without bubblewrap; see
 * docs/internals/protocols/kernel-server.md.
 *
 * What it does (mode on, the default, or auto when the probe passed):
 * - The kernel runs under `bwrap --unshare-all --die-with-parent
 *   --new-session`: its own network namespace with no interfaces but an
 *   unconfigured loopback, so it cannot open a connection to anything,
 *   the host's loopback services included; its own pid, ipc, uts and
 *   cgroup namespaces; no controlling terminal (no TIOCSTI injection).
 * - Filesystem: /usr and /etc read-only, a fresh /proc, a minimal /dev, a
 *   private tmpfs /tmp (CODERQ_SANDBOX_TMP bytes, 512M) and /dev/shm
 *   (CODERQ_SANDBOX_SHM, 64M), and the job's work dir as the only
 *   writable bind; the root and /dev themselves are read-only, so
 *   nothing a kernel writes outside its work dir can grow beyond those
 *   two sizes (tmpfs is memory, which RLIMIT_AS does not count).
 *   /root, /home, /var, /srv, the worker's other work dirs and everything
 *   else not listed do not exist inside.
 * - When the worker runs as root, the child drops to an unprivileged uid
 *   and gid (setgroups, setgid, setuid) before it execs bwrap: bwrap's
 *   --uid only renames root inside the user namespace, so without the
 *   drop the kernel could read root-only files such as /etc/shadow.
 *   With a uid range (CODERQ_SANDBOX_UIDS, default auto) each kernel gets
 *   a uid of its own, leased host-wide through byte locks on
 *   CQ_SANDBOX_UID_LOCK_FILE and held until its processes are gone, so
 *   RLIMIT_NPROC, which Linux counts per uid, is each kernel's own: a fork
 *   bomb in one job cannot stop another job's kernel from forking.
 *   Without a range every kernel runs as 65534 and they share the limit.
 * - rlimits set before exec and inherited by everything the kernel
 *   starts: RLIMIT_AS (memory), RLIMIT_NPROC (processes and threads of
 *   the uid), RLIMIT_FSIZE (largest file written).
 * - In every mode the kernel gets an environment built from scratch
 *   (kernel_env.c): no OPENAI_API_KEY, E2B_API_KEY, CODERQ_*, PG* or any
 *   other variable of the worker; mode off keeps that and the rlimits.
 *   The worker makes itself non-dumpable (cq_sandbox_protect_self()), so
 *   code of its own uid cannot read its /proc/PID/environ either.
 * - The kernel dies with the worker (--die-with-parent and
 *   PR_SET_PDEATHSIG) and a timeout kills its whole process group.
 *
 * What it does not protect against:
 * - Exploits of the host Linux kernel (namespaces share it); E2B, a
 *   microVM per sandbox, is the stronger isolation for hostile code.
 * - CPU exhaustion and memory beyond RLIMIT_AS accounting (no cgroups):
 *   a cell can spin a core until its deadline and can fill page cache;
 *   each kernel's /tmp and /dev/shm hold up to their sizes in memory.
 * - A worker that is not root cannot switch uids: its kernels run as its
 *   own uid (inside bubblewrap) and share its process limit; naming a
 *   uid range then refuses to start instead.
 * - Reading world-readable files under /usr and /etc (configuration,
 *   installed code), and anything the job itself put into the work dir.
 * - Disk filling of the work dir beyond RLIMIT_FSIZE per file (no quota).
 * - Mode off, or auto when the probe fails (both only when configured so
 *   explicitly; the worker then warns at start and with every job): no
 *   namespaces at all; the code runs as the worker's user with the
 *   worker's filesystem view and network; only the scrubbed environment
 *   and the rlimits remain. */
#include "coderq/local/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/local/kpool.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"
#include "py_int.h"

/* Exit status of a probe child that could not switch uids. */
#define PROBE_DROP_FAILED 125
/* The file the probe's bubblewrap makes on its /tmp (sandbox_probe.py
 * reads it back), and what it holds */
#define PROBE_FILE "/tmp/coderq-probe/file"
#define PROBE_TEXT "probe\n"

struct cq_sandbox {
        bool enabled;
        bool drop;       /* root: kernels switch to an unprivileged uid */
        bool per_kernel; /* ... a uid of their own from the range */
        long uid_first, uid_last;
        char *bwrap;
        size_t mem;
        long nproc;
        size_t fsize;
        size_t tmp, shm;
        char reason[768];
};

int cq_sandbox_mode_parse(const char *s, cq_sandbox_mode_t *mp)
{
        if (strcmp(s, "auto") == 0)
                *mp = CQ_SANDBOX_AUTO;
        else if (strcmp(s, "on") == 0)
                *mp = CQ_SANDBOX_ON;
        else if (strcmp(s, "off") == 0)
                *mp = CQ_SANDBOX_OFF;
        else
                return -1;
        return 0;
}

static bool parse_uid(const char *s, const char *end, long *out)
{
        long v = 0;

        if (s == end || end - s > 10)
                return false;
        for (; s < end; s++) {
                if (*s < '0' || *s > '9')
                        return false;
                v = v * 10 + (*s - '0');
        }
        *out = v;
        return true;
}

int cq_sandbox_uids_parse(const char *s,
                          long *firstp,
                          long *lastp,
                          bool *requiredp)
{
        const char *dash;
        long first, last;

        if (strcmp(s, "auto") == 0) {
                *firstp = CQ_SANDBOX_UIDS_FIRST;
                *lastp = CQ_SANDBOX_UIDS_LAST;
                *requiredp = false;
                return 0;
        }
        if (strcmp(s, "off") == 0) {
                *firstp = 0;
                *lastp = 0;
                *requiredp = false;
                return 0;
        }
        dash = strchr(s, '-');
        if (!dash || !parse_uid(s, dash, &first) ||
            !parse_uid(dash + 1, dash + 1 + strlen(dash + 1), &last) ||
            first < CQ_SANDBOX_UIDS_MIN || last > CQ_SANDBOX_UIDS_MAX ||
            first > last)
                return -1;
        *firstp = first;
        *lastp = last;
        *requiredp = true;
        return 0;
}

int cq_sandbox_opts_from_config(cq_sandbox_opts_t *opts, const cq_config_t *cfg)
{
        memset(opts, 0, sizeof(opts[0]));
        opts->python = cfg->python;
        opts->probe_dir = cfg->work_root;
        opts->mem = cfg->sandbox_mem;
        opts->nproc = cfg->sandbox_nproc;
        opts->fsize = cfg->sandbox_fsize;
        opts->tmp = cfg->sandbox_tmp;
        opts->shm = cfg->sandbox_shm;
        if (cq_sandbox_uids_parse(
                cfg->sandbox_uids ? cfg->sandbox_uids : "auto",
                &opts->uid_first, &opts->uid_last, &opts->uids_required))
                return -1;
        return cq_sandbox_mode_parse(cfg->sandbox ? cfg->sandbox : "on",
                                     &opts->mode);
}

bool cq_sandbox_enabled(const cq_sandbox_t *sandbox)
{
        return sandbox && sandbox->enabled;
}

bool cq_sandbox_uid_per_kernel(const cq_sandbox_t *sandbox)
{
        return cq_sandbox_enabled(sandbox) && sandbox->per_kernel;
}

const char *cq_sandbox_mode_name(const cq_sandbox_t *sandbox)
{
        if (!cq_sandbox_enabled(sandbox))
                return CQ_SANDBOX_MODE_OFF;
        return sandbox->per_kernel ? CQ_SANDBOX_MODE_UIDS
                                   : CQ_SANDBOX_MODE_BWRAP;
}

void cq_sandbox_limits(const cq_sandbox_t *sandbox,
                       size_t *memp,
                       long *nprocp,
                       size_t *fsizep)
{
        *memp = sandbox ? sandbox->mem : 0;
        *nprocp = sandbox ? sandbox->nproc : 0;
        *fsizep = sandbox ? sandbox->fsize : 0;
}

void cq_sandbox_tmpfs(const cq_sandbox_t *sandbox, size_t *tmpp, size_t *shmp)
{
        *tmpp = cq_sandbox_enabled(sandbox) ? sandbox->tmp : 0;
        *shmp = cq_sandbox_enabled(sandbox) ? sandbox->shm : 0;
}

const char *cq_sandbox_reason(const cq_sandbox_t *sandbox)
{
        return sandbox ? sandbox->reason : "";
}

/* A uid range for kernels must belong to nobody: a kernel running as an
 * account's uid (or in a group's gid) could read and write that
 * account's files. Reads the host's account and group databases once, at
 * start-up (getpwent() and getgrent() are not thread-safe; start-up runs
 * before any thread that could use them). 0, or -1 with \p errstr naming
 * the account. */
static int
range_unowned(long first, long last, char *errstr, size_t errstr_size)
{
        struct passwd *pw;
        struct group *gr;
        int rc = 0;

        setpwent();
        while (rc == 0 && (pw = getpwent()) != NULL)
                if ((long)pw->pw_uid >= first && (long)pw->pw_uid <= last) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "uid %ld of CODERQ_SANDBOX_UIDS=%ld-%ld is "
                            "the account \"%s\"; choose a range no "
                            "account or group uses",
                            (long)pw->pw_uid, first, last, pw->pw_name);
                        rc = -1;
                }
        endpwent();
        setgrent();
        while (rc == 0 && (gr = getgrent()) != NULL)
                if ((long)gr->gr_gid >= first && (long)gr->gr_gid <= last) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "gid %ld of CODERQ_SANDBOX_UIDS=%ld-%ld is "
                            "the group \"%s\"; choose a range no "
                            "account or group uses",
                            (long)gr->gr_gid, first, last, gr->gr_name);
                        rc = -1;
                }
        endgrent();
        return rc;
}

/* The lease file, opened anew for each lease: open file description
 * locks conflict between descriptions, in this process too. */
static int open_lock_file(char *errstr, size_t errstr_size)
{
        struct stat st;
        int fd;

        if (mkdir(CQ_SANDBOX_UID_LOCK_DIR, 0700) && errno != EEXIST) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create \"%s\": %s",
                              CQ_SANDBOX_UID_LOCK_DIR, strerror(errno));
                return -1;
        }
        if (lstat(CQ_SANDBOX_UID_LOCK_DIR, &st) || !S_ISDIR(st.st_mode) ||
            st.st_uid != 0 || (st.st_mode & 022)) {
                cq_errstr_set(errstr, errstr_size,
                              "\"%s\" must be a directory of root's that only "
                              "root can write",
                              CQ_SANDBOX_UID_LOCK_DIR);
                return -1;
        }
        fd = open(CQ_SANDBOX_UID_LOCK_FILE,
                  O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
                cq_errstr_set(errstr, errstr_size, "could not open \"%s\": %s",
                              CQ_SANDBOX_UID_LOCK_FILE, strerror(errno));
                return -1;
        }
        return fd;
}

int cq_sandbox_id_acquire(const cq_sandbox_t *sandbox,
                          cq_sandbox_id_t *id,
                          char *errstr,
                          size_t errstr_size)
{
        char err[256];
        long uid;
        int fd;

        id->uid = geteuid();
        id->gid = getegid();
        id->drop = false;
        id->lock_fd = -1;
        if (!cq_sandbox_enabled(sandbox) || !sandbox->drop)
                return 0;
        if (!sandbox->per_kernel) {
                id->uid = CQ_SANDBOX_UID;
                id->gid = CQ_SANDBOX_GID;
                id->drop = true;
                return 0;
        }
        fd = open_lock_file(err, sizeof(err));
        if (fd < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not lease a kernel uid: %s", err);
                return -1;
        }
        /* The lowest free one: the file stays sparse and small. */
        for (uid = sandbox->uid_first; uid <= sandbox->uid_last; uid++) {
                struct flock fl;

                memset(&fl, 0, sizeof(fl));
                fl.l_type = F_WRLCK;
                fl.l_whence = SEEK_SET;
                fl.l_start = (off_t)uid;
                fl.l_len = 1;
                if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
                        id->uid = (uid_t)uid;
                        id->gid = (gid_t)uid;
                        id->drop = true;
                        id->lock_fd = fd;
                        return 0;
                }
                if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not lease a kernel uid: could "
                                      "not lock \"%s\": %s",
                                      CQ_SANDBOX_UID_LOCK_FILE,
                                      strerror(errno));
                        close(fd);
                        return -1;
                }
        }
        close(fd);
        cq_errstr_set(errstr, errstr_size,
                      "could not lease a kernel uid: all of %ld-%ld are in "
                      "use (CODERQ_SANDBOX_UIDS)",
                      sandbox->uid_first, sandbox->uid_last);
        return -1;
}

void cq_sandbox_id_release(cq_sandbox_id_t *id)
{
        if (!id)
                return;
        if (id->lock_fd >= 0)
                close(id->lock_fd); /* drops the byte lock */
        id->lock_fd = -1;
        id->drop = false;
}

int cq_sandbox_own(const cq_sandbox_id_t *id, const char *path)
{
        if (!id || !id->drop)
                return 0;
        return chown(path, id->uid, id->gid);
}

int cq_sandbox_own_fd(const cq_sandbox_id_t *id, int fd)
{
        if (!id || !id->drop)
                return 0;
        return fchown(fd, id->uid, id->gid);
}

int cq_sandbox_protect_self(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }

static int set_limit(int resource, rlim_t value)
{
        struct rlimit rl;

        rl.rlim_cur = value;
        rl.rlim_max = value;
        return setrlimit(resource, &rl);
}

int cq_sandbox_child(const cq_sandbox_t *sandbox, const cq_sandbox_id_t *id)
{
        if (sandbox) {
                /* No core files: a crash helper named by the host's
                 * core_pattern would write them as root, outside the
                 * sandbox's file system and limits. */
                if (set_limit(RLIMIT_CORE, 0))
                        return -1;
                if (sandbox->mem && set_limit(RLIMIT_AS, (rlim_t)sandbox->mem))
                        return -1;
                if (sandbox->nproc &&
                    set_limit(RLIMIT_NPROC, (rlim_t)sandbox->nproc))
                        return -1;
                if (sandbox->fsize &&
                    set_limit(RLIMIT_FSIZE, (rlim_t)sandbox->fsize))
                        return -1;
        }
        if (id && id->drop) {
                gid_t gid = id->gid;

                if (setgroups(1, &gid) || setgid(id->gid) || setuid(id->uid))
                        return -1;
                /* Refuse to go on if root could be regained. */
                if (setuid(0) == 0)
                        return -1;
        }
        return 0;
}

void cq_sandbox_argv_free(char **argv)
{
        size_t i;

        if (!argv)
                return;
        for (i = 0; argv[i]; i++)
                free(argv[i]);
        free(argv);
}

/* "--size N" before a --tmpfs when \p size is set (bubblewrap 0.5). */
static void add_size(char **argv, size_t *n, size_t size)
{
        char num[32];

        if (!size)
                return;
        snprintf(num, sizeof(num), "%zu", size);
        argv[(*n)++] = strdup("--size");
        argv[(*n)++] = strdup(num);
}

/* bubblewrap's options (bwrap_args()) before the tmpfs mounts */
static const char *const bwrap_head[] = {
    "--unshare-all", "--die-with-parent",
    "--new-session", "--ro-bind",
    "/usr",          "/usr",
    "--symlink",     "usr/lib",
    "/lib",          "--symlink",
    "usr/lib64",     "/lib64",
    "--symlink",     "usr/bin",
    "/bin",          "--symlink",
    "usr/sbin",      "/sbin",
    "--ro-bind",     "/etc",
    "/etc",          "--proc",
    "/proc",         "--dev",
    "/dev",
};

/* ... and after the binds: the root and /dev are tmpfs the kernel's uid
 * owns, read-only once every mount point exists, so that /tmp, /dev/shm
 * and the work dir are all it can write (bubblewrap does not recurse) */
static const char *const bwrap_tail[] = {
    "--remount-ro",
    "/dev",
    "--remount-ro",
    "/",
};

/* bubblewrap's options, after its path, into \p argv from *\p np on
 * (cq_sandbox_argv()): \p slash, when set, is the last '/' of a checked
 * \p file_path that the --file of \p file_fd makes. A string it could
 * not copy is a NULL in its place. */
static void bwrap_args(const cq_sandbox_t *sandbox,
                       const char *work_dir,
                       int info_fd,
                       int file_fd,
                       const char *file_path,
                       const char *slash,
                       char **argv,
                       size_t *np)
{
        size_t n = *np, i;

        for (i = 0; i < CQ_ARRAY_SIZE(bwrap_head); i++)
                argv[n++] = strdup(bwrap_head[i]);
        add_size(argv, &n, sandbox->shm);
        argv[n++] = strdup("--tmpfs");
        argv[n++] = strdup("/dev/shm");
        add_size(argv, &n, sandbox->tmp);
        argv[n++] = strdup("--tmpfs");
        argv[n++] = strdup("/tmp");
        if (slash) {
                char num[16];

                snprintf(num, sizeof(num), "%d", file_fd);
                argv[n++] = strdup("--perms");
                argv[n++] = strdup("0700");
                argv[n++] = strdup("--dir");
                argv[n++] = strndup(file_path, (size_t)(slash - file_path));
                argv[n++] = strdup("--perms");
                argv[n++] = strdup("0600");
                argv[n++] = strdup("--file");
                argv[n++] = strdup(num);
                argv[n++] = strdup(file_path);
        }
        argv[n++] = strdup("--bind");
        argv[n++] = strdup(work_dir);
        argv[n++] = strdup(work_dir);
        for (i = 0; i < CQ_ARRAY_SIZE(bwrap_tail); i++)
                argv[n++] = strdup(bwrap_tail[i]);
        argv[n++] = strdup("--chdir");
        argv[n++] = strdup(work_dir);
        if (info_fd >= 0) {
                char num[16];

                snprintf(num, sizeof(num), "%d", info_fd);
                argv[n++] = strdup("--info-fd");
                argv[n++] = strdup(num);
        }
        *np = n;
}

char **cq_sandbox_argv(const cq_sandbox_t *sandbox,
                       const char *work_dir,
                       const char *const *cmd,
                       int info_fd,
                       int file_fd,
                       const char *file_path)
{
        size_t ncmd = 0, n = 0, i, total;
        const char *slash = NULL;
        char **argv;

        if (cq_sandbox_enabled(sandbox) && file_fd >= 0) {
                slash = file_path ? strrchr(file_path, '/') : NULL;
                if (!file_path || strncmp(file_path, "/tmp/", 5) != 0 ||
                    slash == file_path + 4 || !slash[1] ||
                    strstr(file_path, "/../") || strstr(file_path, "//"))
                        return NULL;
        }
        while (cmd[ncmd])
                ncmd++;
        total = ncmd + 1;
        if (cq_sandbox_enabled(sandbox))
                total += 1 + CQ_ARRAY_SIZE(bwrap_head) + 2 * 4 +
                         CQ_ARRAY_SIZE(bwrap_tail) + 5 + 2 + 9;
        argv = calloc(total, sizeof(*argv));
        if (!argv)
                return NULL;
        if (cq_sandbox_enabled(sandbox)) {
                argv[n++] = strdup(sandbox->bwrap);
                bwrap_args(sandbox, work_dir, info_fd, file_fd, file_path,
                           slash, argv, &n);
        }
        for (i = 0; i < ncmd; i++)
                argv[n++] = strdup(cmd[i]);
        argv[n] = NULL;
        for (i = 0; i < n; i++) {
                if (!argv[i]) {
                        size_t k;

                        for (k = 0; k < n; k++)
                                free(argv[k]);
                        free(argv);
                        return NULL;
                }
        }
        return argv;
}

/* The probe's child: no output, the file's pipe as fd 3 (bubblewrap's
 * --file source), the kernels' identity, then bubblewrap. Only
 * async-signal-safe calls. */
_Noreturn static void probe_child(const cq_sandbox_t *sandbox,
                                  const cq_sandbox_id_t *id,
                                  int file,
                                  char **argv,
                                  char *const *envp)
{
        int devnull = open("/dev/null", O_RDWR);

        if (devnull >= 0) {
                dup2(devnull, 0);
                dup2(devnull, 1);
                dup2(devnull, 2);
        }
        /* dup2() clears O_CLOEXEC: bubblewrap reads it as fd 3 */
        if (file == 3)
                fcntl(3, F_SETFD, 0);
        else
                dup2(file, 3);
        if (cq_sandbox_child(sandbox, id) != 0)
                _exit(PROBE_DROP_FAILED);
        execve(argv[0], argv, envp);
        _exit(127);
}

/* Wait up to ten seconds for the probe's child \p pid: 0 with its exit
 * \p status, else -1 with the reason set (one that outlived its time
 * killed). */
static int probe_wait(cq_sandbox_t *sandbox, pid_t pid, int *status)
{
        int64_t deadline = cq_now_ms() + 10000;

        for (;;) {
                pid_t w = waitpid(pid, status, WNOHANG);
                struct timespec ts = {0, 10 * 1000 * 1000};

                if (w == pid)
                        return 0;
                if (w < 0 && errno != EINTR) {
                        snprintf(sandbox->reason, sizeof(sandbox->reason),
                                 "could not wait for the probe: %s",
                                 strerror(errno));
                        return -1;
                }
                if (cq_now_ms() > deadline) {
                        kill(pid, SIGKILL);
                        waitpid(pid, status, 0);
                        snprintf(sandbox->reason, sizeof(sandbox->reason),
                                 "bubblewrap probe timed out");
                        return -1;
                }
                nanosleep(&ts, NULL);
        }
}

/* What the probe's exit \p status says: 0 when it passed, else -1 with
 * the reason set. */
static int probe_verdict(cq_sandbox_t *sandbox,
                         int status,
                         const cq_sandbox_id_t *id,
                         const char *python)
{
        if (WIFEXITED(status) && WEXITSTATUS(status) == PROBE_DROP_FAILED) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "bubblewrap probe failed: could not switch to uid "
                         "%ld or set the rlimits (is the uid mapped in this "
                         "user namespace? see CODERQ_SANDBOX_UIDS)",
                         (long)id->uid);
                return -1;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "bubblewrap probe failed (status %d): %s cannot "
                         "run %s in a sandbox here",
                         status, sandbox->bwrap, python);
                return -1;
        }
        return 0;
}

/* Run the interpreter under bubblewrap as the kernels will, as a kernel
 * uid leased like theirs, in a work dir under \p dir, with a file of its
 * own on its /tmp as a kernel's matplotlibrc; 0 when it exited 0 (it read
 * that file back) within ten seconds. */
static int probe(cq_sandbox_t *sandbox, const char *python, const char *dir)
{
        const char *cmd[] = {python,     "-c",       cq_sandbox_probe_py,
                             PROBE_FILE, PROBE_TEXT, NULL};
        int file[2] = {-1, -1};
        char tmpl[PATH_MAX], err[256];
        char **argv = NULL;
        char path_env[] = "PATH=/usr/bin:/bin";
        char *const envp[] = {path_env, NULL};
        cq_sandbox_id_t id = CQ_SANDBOX_ID_INIT;
        pid_t pid = -1;
        int status = 0, rc = -1;
        bool made = false;

        if (cq_sandbox_id_acquire(sandbox, &id, err, sizeof(err))) {
                snprintf(sandbox->reason, sizeof(sandbox->reason), "%s", err);
                goto out;
        }
        if (snprintf(tmpl, sizeof(tmpl), "%s/probe-XXXXXX", dir) >=
                (int)sizeof(tmpl) ||
            !mkdtemp(tmpl)) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not create probe dir in %.300s: %s", dir,
                         strerror(errno));
                goto out;
        }
        made = true;
        if (cq_sandbox_own(&id, tmpl)) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not chown probe dir: %s", strerror(errno));
                goto out;
        }
        argv = cq_sandbox_argv(sandbox, tmpl, cmd, -1, 3, PROBE_FILE);
        if (!argv) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "out of memory");
                goto out;
        }
        if (pipe2(file, O_CLOEXEC) != 0 ||
            write(file[1], PROBE_TEXT, sizeof(PROBE_TEXT) - 1) !=
                (ssize_t)(sizeof(PROBE_TEXT) - 1)) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not make the probe's pipe: %s",
                         strerror(errno));
                goto out;
        }
        close(file[1]);
        file[1] = -1;
        pid = fork();
        if (pid < 0) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not fork: %s", strerror(errno));
                goto out;
        }
        if (pid == 0)
                probe_child(sandbox, &id, file[0], argv, envp);
        if (probe_wait(sandbox, pid, &status) == 0)
                rc = probe_verdict(sandbox, status, &id, python);
out:
        if (file[0] >= 0)
                close(file[0]);
        if (file[1] >= 0)
                close(file[1]);
        cq_sandbox_argv_free(argv);
        if (made)
                rmdir(tmpl);
        cq_sandbox_id_release(&id);
        return rc;
}

/* Whether a kernel uid (no group of ours) can reach \p dir: every
 * directory on the way needs o+x; says which one does not. */
static bool reachable(const char *dir, char *err, size_t err_size)
{
        char path[PATH_MAX];
        struct stat st;
        char *slash;

        if (strlen(dir) >= sizeof(path))
                return false;
        memcpy(path, dir, strlen(dir) + 1);
        for (;;) {
                if (stat(path, &st) == 0 && !(st.st_mode & S_IXOTH)) {
                        snprintf(err, err_size,
                                 "kernel uids cannot reach the work root "
                                 "%.200s: %.200s has mode %04o (needs o+x)",
                                 dir, path, (unsigned)(st.st_mode & 07777));
                        return false;
                }
                slash = strrchr(path, '/');
                if (!slash || slash == path)
                        return true;
                *slash = '\0';
        }
}

cq_sandbox_t *
cq_sandbox_new(const cq_sandbox_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_sandbox_t *sandbox = calloc(1, sizeof(*sandbox));
        char def[PATH_MAX], err[600];
        const char *dir = opts->probe_dir;

        if (!sandbox) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create sandbox: out of memory");
                return NULL;
        }
        sandbox->bwrap = strdup(opts->bwrap ? opts->bwrap : "/usr/bin/bwrap");
        if (!sandbox->bwrap) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create sandbox: out of memory");
                cq_sandbox_destroy(&sandbox);
                return NULL;
        }
        if (!dir) {
                cq_work_root_default(def, sizeof(def));
                dir = def;
        }
        sandbox->mem = opts->mem;
        sandbox->nproc = opts->nproc;
        sandbox->fsize = opts->fsize;
        sandbox->tmp = opts->tmp;
        sandbox->shm = opts->shm;
        sandbox->drop = geteuid() == 0;
        if (opts->mode == CQ_SANDBOX_OFF) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "sandbox disabled (CODERQ_SANDBOX=off)");
                return sandbox;
        }
        if (opts->uid_first > 0 && opts->uid_last >= opts->uid_first) {
                if (sandbox->drop) {
                        if (range_unowned(opts->uid_first, opts->uid_last, err,
                                          sizeof(err))) {
                                cq_errstr_set(errstr, errstr_size,
                                              "could not enable the "
                                              "sandbox: %s",
                                              err);
                                cq_sandbox_destroy(&sandbox);
                                return NULL;
                        }
                        sandbox->per_kernel = true;
                        sandbox->uid_first = opts->uid_first;
                        sandbox->uid_last = opts->uid_last;
                } else if (opts->uids_required) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not enable the sandbox: a uid "
                                      "per kernel (CODERQ_SANDBOX_UIDS=%ld-"
                                      "%ld) needs a worker running as "
                                      "root; set CODERQ_SANDBOX_UIDS=auto "
                                      "to share one uid",
                                      opts->uid_first, opts->uid_last);
                        cq_sandbox_destroy(&sandbox);
                        return NULL;
                }
        }
        sandbox->enabled = true;
        if (access(sandbox->bwrap, X_OK) != 0) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "%s is not executable: %s", sandbox->bwrap,
                         strerror(errno));
                sandbox->enabled = false;
        } else if (cq_work_root_prepare(dir, err, sizeof(err))) {
                snprintf(sandbox->reason, sizeof(sandbox->reason), "%s", err);
                sandbox->enabled = false;
        } else if (sandbox->drop && !reachable(dir, err, sizeof(err))) {
                snprintf(sandbox->reason, sizeof(sandbox->reason), "%s", err);
                sandbox->enabled = false;
        } else if (probe(sandbox,
                         opts->python ? opts->python : "/usr/bin/python3",
                         dir)) {
                sandbox->enabled = false;
        }
        if (!sandbox->enabled && opts->mode == CQ_SANDBOX_ON) {
                cq_errstr_set(errstr, errstr_size,
                              "could not enable the sandbox "
                              "(CODERQ_SANDBOX=on): %s",
                              sandbox->reason);
                cq_sandbox_destroy(&sandbox);
                return NULL;
        }
        if (sandbox->enabled && !sandbox->per_kernel)
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "every kernel runs as uid %ld and shares its process "
                         "limit (%s)",
                         sandbox->drop ? (long)CQ_SANDBOX_UID : (long)geteuid(),
                         sandbox->drop ? "CODERQ_SANDBOX_UIDS=off"
                                       : "a uid per kernel needs a worker "
                                         "running as root");
        return sandbox;
}

void cq_sandbox_destroy(cq_sandbox_t **sandboxp)
{
        cq_sandbox_t *sandbox = *sandboxp;

        if (!sandbox)
                return;
        *sandboxp = NULL;
        free(sandbox->bwrap);
        free(sandbox);
}
