/* SPDX-License-Identifier: MIT */
/* sandbox.c - confinement of local kernels with bubblewrap, an unprivileged
 * uid and rlimits; the startup probe that decides whether bubblewrap works.
 *
 * What it does (mode on, or auto when the probe passed):
 * - The kernel runs under `bwrap --unshare-all --die-with-parent
 *   --new-session`: its own network namespace with no interfaces but an
 *   unconfigured loopback, so it cannot open a connection to anything,
 *   the host's loopback services included; its own pid, ipc, uts and
 *   cgroup namespaces; no controlling terminal (no TIOCSTI injection).
 * - Filesystem: /usr and /etc read-only, a fresh /proc, a minimal /dev, a
 *   private tmpfs /tmp, and the job's work dir as the only writable bind.
 *   /root, /home, /var, /srv, the worker's other work dirs and everything
 *   else not listed do not exist inside.
 * - When the worker runs as root, the child drops to uid/gid 65534
 *   (setgroups, setgid, setuid) before it execs bwrap: bwrap's --uid only
 *   renames root inside the user namespace, so without the drop the
 *   kernel could read root-only files such as /etc/shadow.
 * - rlimits set before exec and inherited by everything the kernel
 *   starts: RLIMIT_AS (memory), RLIMIT_NPROC (processes and threads of
 *   the uid), RLIMIT_FSIZE (largest file written).
 * - In every mode the kernel gets an environment built from scratch
 *   (kernel.c): no OPENAI_API_KEY, E2B_API_KEY, CODERQ_*, PG* or any
 *   other variable of the worker; mode off keeps that and the rlimits.
 * - The kernel dies with the worker (--die-with-parent and
 *   PR_SET_PDEATHSIG) and a timeout kills its whole process group.
 *
 * What it does not protect against:
 * - Exploits of the host Linux kernel (namespaces share it); E2B, a
 *   microVM per sandbox, is the stronger isolation for hostile code.
 * - CPU exhaustion and memory beyond RLIMIT_AS accounting (no cgroups):
 *   a cell can spin a core until its deadline and can fill page cache;
 *   RLIMIT_NPROC counts per uid, so all kernels share it.
 * - Reading world-readable files under /usr and /etc (configuration,
 *   installed code), and anything the job itself put into the work dir.
 * - Disk filling of the work dir beyond RLIMIT_FSIZE per file (no quota).
 * - Mode off, or auto when the probe fails: no namespaces at all; the
 *   code runs as the worker's user with the worker's filesystem view and
 *   network; only the scrubbed environment and the rlimits remain. */
#include "coderq/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coderq/util.h"

struct cq_sandbox {
        bool enabled;
        bool drop; /* root: drop to CQ_SANDBOX_UID in the child */
        char *bwrap;
        size_t mem;
        long nproc;
        size_t fsize;
        char reason[256];
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

int cq_sandbox_opts_from_config(cq_sandbox_opts_t *opts, const cq_config_t *cfg)
{
        memset(opts, 0, sizeof(*opts));
        opts->python = cfg->python;
        opts->probe_dir = cfg->work_root;
        opts->mem = cfg->sandbox_mem;
        opts->nproc = cfg->sandbox_nproc;
        opts->fsize = cfg->sandbox_fsize;
        return cq_sandbox_mode_parse(cfg->sandbox ? cfg->sandbox : "auto",
                                     &opts->mode);
}

bool cq_sandbox_enabled(const cq_sandbox_t *sandbox)
{
        return sandbox && sandbox->enabled;
}

const char *cq_sandbox_reason(const cq_sandbox_t *sandbox)
{
        return sandbox ? sandbox->reason : "";
}

int cq_sandbox_own(const cq_sandbox_t *sandbox, const char *path)
{
        if (!sandbox || !sandbox->enabled || !sandbox->drop)
                return 0;
        return chown(path, CQ_SANDBOX_UID, CQ_SANDBOX_GID);
}

static int set_limit(int resource, rlim_t value)
{
        struct rlimit rl;

        rl.rlim_cur = value;
        rl.rlim_max = value;
        return setrlimit(resource, &rl);
}

int cq_sandbox_child(const cq_sandbox_t *sandbox)
{
        if (!sandbox)
                return 0;
        if (sandbox->mem && set_limit(RLIMIT_AS, (rlim_t)sandbox->mem))
                return -1;
        if (sandbox->nproc && set_limit(RLIMIT_NPROC, (rlim_t)sandbox->nproc))
                return -1;
        if (sandbox->fsize && set_limit(RLIMIT_FSIZE, (rlim_t)sandbox->fsize))
                return -1;
        if (sandbox->enabled && sandbox->drop) {
                gid_t gid = CQ_SANDBOX_GID;

                if (setgroups(1, &gid) || setgid(CQ_SANDBOX_GID) ||
                    setuid(CQ_SANDBOX_UID))
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

char **cq_sandbox_argv(const cq_sandbox_t *sandbox,
                       const char *work_dir,
                       const char *const *cmd,
                       int info_fd)
{
        static const char *const head[] = {
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
            "/dev",          "--tmpfs",
            "/tmp",
        };
        size_t ncmd = 0, n = 0, i, total;
        char **argv;

        while (cmd[ncmd])
                ncmd++;
        total = ncmd + 1;
        if (cq_sandbox_enabled(sandbox))
                total += 1 + CQ_ARRAY_SIZE(head) + 5 + 2;
        argv = calloc(total, sizeof(*argv));
        if (!argv)
                return NULL;
        if (cq_sandbox_enabled(sandbox)) {
                argv[n++] = strdup(sandbox->bwrap);
                for (i = 0; i < CQ_ARRAY_SIZE(head); i++)
                        argv[n++] = strdup(head[i]);
                argv[n++] = strdup("--bind");
                argv[n++] = strdup(work_dir);
                argv[n++] = strdup(work_dir);
                argv[n++] = strdup("--chdir");
                argv[n++] = strdup(work_dir);
                if (info_fd >= 0) {
                        char num[16];

                        snprintf(num, sizeof(num), "%d", info_fd);
                        argv[n++] = strdup("--info-fd");
                        argv[n++] = strdup(num);
                }
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

/* Run the interpreter under bubblewrap as the kernels will; 0 when it
 * exited 0 within ten seconds. */
static int probe(cq_sandbox_t *sandbox, const char *python, const char *dir)
{
        const char *cmd[] = {python, "-c", "import sys; sys.exit(0)", NULL};
        char tmpl[4096];
        char **argv = NULL;
        char path_env[] = "PATH=/usr/bin:/bin";
        char *const envp[] = {path_env, NULL};
        int64_t deadline;
        pid_t pid = -1;
        int status = 0, rc = -1, devnull;

        snprintf(tmpl, sizeof(tmpl), "%s/probe-XXXXXX", dir);
        if (!mkdtemp(tmpl)) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not create probe dir in %s: %s", dir,
                         strerror(errno));
                return -1;
        }
        if (cq_sandbox_own(sandbox, tmpl)) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not chown probe dir: %s", strerror(errno));
                goto out;
        }
        argv = cq_sandbox_argv(sandbox, tmpl, cmd, -1);
        if (!argv) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "out of memory");
                goto out;
        }
        pid = fork();
        if (pid < 0) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "could not fork: %s", strerror(errno));
                goto out;
        }
        if (pid == 0) {
                devnull = open("/dev/null", O_RDWR);
                if (devnull >= 0) {
                        dup2(devnull, 0);
                        dup2(devnull, 1);
                        dup2(devnull, 2);
                }
                if (cq_sandbox_child(sandbox) == 0)
                        execve(argv[0], argv, envp);
                _exit(127);
        }
        deadline = cq_now_ms() + 10000;
        for (;;) {
                pid_t w = waitpid(pid, &status, WNOHANG);
                struct timespec ts = {0, 10 * 1000 * 1000};

                if (w == pid)
                        break;
                if (w < 0 && errno != EINTR) {
                        snprintf(sandbox->reason, sizeof(sandbox->reason),
                                 "could not wait for the probe: %s",
                                 strerror(errno));
                        goto out;
                }
                if (cq_now_ms() > deadline) {
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        snprintf(sandbox->reason, sizeof(sandbox->reason),
                                 "bubblewrap probe timed out");
                        goto out;
                }
                nanosleep(&ts, NULL);
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "bubblewrap probe failed (status %d): %s cannot "
                         "run %s in a sandbox here",
                         status, sandbox->bwrap, python);
                goto out;
        }
        rc = 0;
out:
        cq_sandbox_argv_free(argv);
        rmdir(tmpl);
        return rc;
}

cq_sandbox_t *
cq_sandbox_new(const cq_sandbox_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_sandbox_t *sandbox = calloc(1, sizeof(*sandbox));
        const char *dir = opts->probe_dir ? opts->probe_dir : "/tmp";

        if (!sandbox) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not create sandbox: out of memory");
                return NULL;
        }
        sandbox->bwrap = strdup(opts->bwrap ? opts->bwrap : "/usr/bin/bwrap");
        if (!sandbox->bwrap) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not create sandbox: out of memory");
                cq_sandbox_destroy(&sandbox);
                return NULL;
        }
        sandbox->mem = opts->mem;
        sandbox->nproc = opts->nproc;
        sandbox->fsize = opts->fsize;
        sandbox->drop = geteuid() == 0;
        if (opts->mode == CQ_SANDBOX_OFF) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "sandbox disabled (CODERQ_SANDBOX=off)");
                return sandbox;
        }
        sandbox->enabled = true;
        if (access(sandbox->bwrap, X_OK) != 0) {
                snprintf(sandbox->reason, sizeof(sandbox->reason),
                         "%s is not executable: %s", sandbox->bwrap,
                         strerror(errno));
                sandbox->enabled = false;
        } else if (probe(sandbox,
                         opts->python ? opts->python : "/usr/bin/python3",
                         dir)) {
                sandbox->enabled = false;
        }
        if (!sandbox->enabled && opts->mode == CQ_SANDBOX_ON) {
                if (errstr)
                        snprintf(errstr, errstr_size,
                                 "could not enable the sandbox: %s",
                                 sandbox->reason);
                cq_sandbox_destroy(&sandbox);
                return NULL;
        }
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
