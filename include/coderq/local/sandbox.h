/* SPDX-License-Identifier: MIT */
/* sandbox.h - how a local kernel process is confined: bubblewrap (no
 * network, read-only system, only the work dir writable), an unprivileged
 * uid, a scrubbed environment (kernel.c builds it) and rlimits. See the
 * comment block at the top of sandbox.c for what this does and does not
 * protect against. */
#ifndef CODERQ_SANDBOX_H
#define CODERQ_SANDBOX_H

#include <sys/types.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"

/* The uid and gid every kernel runs as when the worker is root and
 * per-kernel uids are off (CODERQ_SANDBOX_UIDS=off). */
#define CQ_SANDBOX_UID 65534
#define CQ_SANDBOX_GID 65534

/* The range CODERQ_SANDBOX_UIDS=auto means when the worker is root. */
#define CQ_SANDBOX_UIDS_FIRST 100000
#define CQ_SANDBOX_UIDS_LAST  100999
/* Bounds of a configured range: above the system accounts (Debian's
 * FIRST_UID), within a signed 32-bit uid. A range may start below 65536
 * for user namespaces that map only 65536 uids (userns-remap, rootless
 * containers); cq_sandbox_new() refuses a range that holds the uid or gid
 * of any account or group the host knows. */
#define CQ_SANDBOX_UIDS_MIN 1000
#define CQ_SANDBOX_UIDS_MAX 2147483646L

/* Host-wide lease file of per-kernel uids: byte N is locked (an open
 * file description lock) while a kernel runs as uid N, so workers that
 * share a host and a range never hand out one uid twice. */
#define CQ_SANDBOX_UID_LOCK_DIR  "/run/coderq"
#define CQ_SANDBOX_UID_LOCK_FILE CQ_SANDBOX_UID_LOCK_DIR "/uids.lock"

/* How kernels are actually confined (cq_sandbox_mode_name()):
 * - "bwrap+uid-per-kernel": bubblewrap, and each kernel runs as a uid of
 *   its own from the range, so its process limit is its own;
 * - "bwrap": bubblewrap, every kernel as one uid (65534 when the worker is
 *   root, else the worker's own uid), sharing that uid's process limit;
 * - "off": no bubblewrap: the worker's user, filesystem and network.
 * A job's result records which (or "e2b" for the E2B backend). */
#define CQ_SANDBOX_MODE_UIDS  "bwrap+uid-per-kernel"
#define CQ_SANDBOX_MODE_BWRAP "bwrap"
#define CQ_SANDBOX_MODE_OFF   "off"

typedef enum cq_sandbox_mode {
        CQ_SANDBOX_AUTO = 0, /* bubblewrap when the startup probe works */
        CQ_SANDBOX_ON,       /* bubblewrap or fail */
        CQ_SANDBOX_OFF,      /* no bubblewrap; rlimits and env still apply */
} cq_sandbox_mode_t;

typedef struct cq_sandbox_opts {
        cq_sandbox_mode_t mode;
        const char *bwrap;     /* NULL: /usr/bin/bwrap */
        const char *python;    /* the interpreter the probe runs */
        const char *probe_dir; /* an existing dir for the probe's work dir */
        size_t mem;            /* RLIMIT_AS bytes; 0: unlimited */
        long nproc;            /* RLIMIT_NPROC; 0: unlimited */
        size_t fsize;          /* RLIMIT_FSIZE bytes; 0: unlimited */
        /* sizes of the kernel's /tmp and /dev/shm, tmpfs of its own
         * (its memory); 0: Linux's default, half of RAM */
        size_t tmp, shm;
        /* A uid per kernel from [uid_first, uid_last] when the worker is
         * root; both 0: every kernel runs as CQ_SANDBOX_UID. */
        long uid_first, uid_last;
        /* The operator named the range: a worker that cannot switch uids
         * (not root) fails rather than share one uid. */
        bool uids_required;
} cq_sandbox_opts_t;

/**
 * @brief Parse CODERQ_SANDBOX_UIDS: "auto" (CQ_SANDBOX_UIDS_FIRST-LAST,
 *        not required), "off" (0, 0) or "FIRST-LAST" (required), with
 *        CQ_SANDBOX_UIDS_MIN <= FIRST <= LAST <= CQ_SANDBOX_UIDS_MAX.
 * @returns 0, or -1 when \p s is none of these.
 */
CQ_NODISCARD int cq_sandbox_uids_parse(const char *s,
                                       long *firstp,
                                       long *lastp,
                                       bool *requiredp);

/**
 * @brief Fill \p opts from CODERQ_SANDBOX (unset: on),
 *        CODERQ_SANDBOX_UIDS, CODERQ_SANDBOX_MEM/_NPROC/_FSIZE/_TMP/_SHM,
 *        CODERQ_PYTHON and CODERQ_WORK_ROOT. Strings stay borrowed from
 *        \p cfg (probe_dir may be NULL: the default work root).
 * @returns 0, or -1 when cfg->sandbox is not auto, on or off, or
 *          cfg->sandbox_uids is invalid.
 */
CQ_NODISCARD int cq_sandbox_opts_from_config(cq_sandbox_opts_t *opts,
                                             const cq_config_t *cfg);

/** @brief Immutable after cq_sandbox_new(); shared by every kernel. */
typedef struct cq_sandbox cq_sandbox_t;

/** @brief "auto", "on", "off" -> mode. @returns 0, or -1 when unknown. */
CQ_NODISCARD int cq_sandbox_mode_parse(const char *s, cq_sandbox_mode_t *mp);

/**
 * @brief Decide how kernels are confined. In auto and on modes this first
 *        creates the work root (probe_dir; see cq_work_root_prepare()),
 *        then runs a probe: the python interpreter under bubblewrap, as a
 *        kernel uid leased as for a kernel, in a work dir under the root.
 * @param opts Borrowed; strings are copied.
 * @returns Caller owns the returned value; free with cq_sandbox_destroy().
 *          NULL when mode is on and the probe failed, when a uid range is
 *          required and the process is not root, or out of memory.
 * @locality Any thread; the handle is then thread-safe (read-only).
 */
cq_sandbox_t *
cq_sandbox_new(const cq_sandbox_opts_t *opts, char *errstr, size_t errstr_size);

void cq_sandbox_destroy(cq_sandbox_t **sandboxp);

/** @brief Whether kernels run under bubblewrap. */
bool cq_sandbox_enabled(const cq_sandbox_t *sandbox);

/** @brief Whether each kernel runs as a uid of its own. */
bool cq_sandbox_uid_per_kernel(const cq_sandbox_t *sandbox);

/** @brief CQ_SANDBOX_MODE_UIDS, _BWRAP or _OFF (NULL: off); static. */
const char *cq_sandbox_mode_name(const cq_sandbox_t *sandbox);

/** @brief Why auto mode fell back to no bubblewrap, or what weakens the
 *         sandbox (kernels sharing one uid); "" when nothing. Borrowed,
 *         valid until cq_sandbox_destroy(). */
const char *cq_sandbox_reason(const cq_sandbox_t *sandbox);

/** @brief The rlimits of every kernel (0: none): RLIMIT_AS bytes,
 *         RLIMIT_NPROC, RLIMIT_FSIZE bytes. */
void cq_sandbox_limits(const cq_sandbox_t *sandbox,
                       size_t *memp,
                       long *nprocp,
                       size_t *fsizep);

/** @brief The sizes of a sandboxed kernel's /tmp and /dev/shm in bytes
 *         (0: Linux's default); both 0 without a sandbox. */
void cq_sandbox_tmpfs(const cq_sandbox_t *sandbox, size_t *tmpp, size_t *shmp);

/** @brief The identity one kernel runs as; see cq_sandbox_id_acquire(). */
typedef struct cq_sandbox_id {
        uid_t uid;
        gid_t gid;
        bool drop;   /* the child switches to uid/gid before bubblewrap */
        int lock_fd; /* holds the lease of a per-kernel uid; -1: none */
} cq_sandbox_id_t;

#define CQ_SANDBOX_ID_INIT                                                     \
        {                                                                      \
                0, 0, false, -1                                                \
        }

/**
 * @brief Lease the uid a new kernel runs as: the lowest free uid of the
 *        range (per-kernel uids), CQ_SANDBOX_UID (root, no range), or no
 *        switch (not root, or no bubblewrap). Held until
 *        cq_sandbox_id_release(); a lease dies with the process.
 * @param id (out) Release with cq_sandbox_id_release(), even on failure.
 * @returns 0, or -1 with \p errstr filled (every uid of the range taken,
 *          the lease file unusable).
 * @locality Any thread.
 */
CQ_NODISCARD int cq_sandbox_id_acquire(const cq_sandbox_t *sandbox,
                                       cq_sandbox_id_t *id,
                                       char *errstr,
                                       size_t errstr_size);

/** @brief Give the uid back; only once nothing runs as it any more.
 *         Accepts a released or CQ_SANDBOX_ID_INIT identity. */
void cq_sandbox_id_release(cq_sandbox_id_t *id);

/**
 * @brief Give \p path to the uid \p id runs as (a no-op unless it
 *        switches uids). \p id may be NULL (a no-op).
 * @returns 0, or -1 with errno set.
 */
CQ_NODISCARD int cq_sandbox_own(const cq_sandbox_id_t *id, const char *path);

/** @brief cq_sandbox_own() of the file open as \p fd: for a file in a
 *         dir the kernel's uid may already have written to. */
CQ_NODISCARD int cq_sandbox_own_fd(const cq_sandbox_id_t *id, int fd);

/**
 * @brief Make this process non-dumpable (PR_SET_DUMPABLE 0): code running
 *        as the same uid (a kernel with the sandbox off, or sharing the
 *        worker's uid) can then neither read /proc/PID/environ or mem nor
 *        ptrace it. Call before any kernel starts.
 * @returns 0, or -1 with errno set.
 */
int cq_sandbox_protect_self(void);

/**
 * @brief The argv that runs \p cmd in the sandbox with \p work_dir as its
 *        only writable directory (and cwd); \p cmd itself when the sandbox
 *        is off.
 * @param cmd Borrowed; NULL-terminated.
 * @param info_fd When >= 0 and the sandbox is on, bubblewrap writes its
 *        JSON info (`child-pid`: the sandbox's pid 1, as the host sees
 *        it) to this descriptor of the child; -1 for none.
 * @param file_fd When >= 0 and the sandbox is on, bubblewrap copies what
 *        this descriptor of the child holds into \p file_path (0600),
 *        an absolute path on the sandbox's own /tmp, whose parent it
 *        makes (0700) first: a file that goes with the sandbox; -1 for
 *        none.
 * @returns Caller owns the returned vector and its strings; free with
 *          cq_sandbox_argv_free(). NULL when out of memory, or when
 *          \p file_path is not a path of a file in a directory of /tmp.
 */
char **cq_sandbox_argv(const cq_sandbox_t *sandbox,
                       const char *work_dir,
                       const char *const *cmd,
                       int info_fd,
                       int file_fd,
                       const char *file_path);

void cq_sandbox_argv_free(char **argv);

/**
 * @brief Child side, between fork() and execve(): set the rlimits and
 *        switch to \p id (setgroups, setgid, setuid) when it says so.
 *        Only async-signal-safe calls. \p sandbox and \p id may be NULL.
 * @returns 0, or -1 (the child must then _exit()).
 */
int cq_sandbox_child(const cq_sandbox_t *sandbox, const cq_sandbox_id_t *id);

#endif
