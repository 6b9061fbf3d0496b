/* SPDX-License-Identifier: MIT */
/* sandbox.h - how a local kernel process is confined: bubblewrap (no
 * network, read-only system, only the work dir writable), an unprivileged
 * uid, a scrubbed environment (kernel.c builds it) and rlimits. See the
 * comment block at the top of sandbox.c for what this does and does not
 * protect against. */
#ifndef CODERQ_SANDBOX_H
#define CODERQ_SANDBOX_H

#include <sys/types.h>

#include "coderq/common.h"
#include "coderq/config.h"

/* The uid and gid kernels run as when the worker is root. */
#define CQ_SANDBOX_UID 65534
#define CQ_SANDBOX_GID 65534

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
} cq_sandbox_opts_t;

/**
 * @brief Fill \p opts from CODERQ_SANDBOX, CODERQ_SANDBOX_MEM/_NPROC/_FSIZE,
 *        CODERQ_PYTHON and CODERQ_WORK_ROOT. Strings stay borrowed from
 *        \p cfg (probe_dir may be NULL: /tmp).
 * @returns 0, or -1 when cfg->sandbox is not auto, on or off.
 */
CQ_NODISCARD int cq_sandbox_opts_from_config(cq_sandbox_opts_t *opts,
                                             const cq_config_t *cfg);

/** @brief Immutable after cq_sandbox_new(); shared by every kernel. */
typedef struct cq_sandbox cq_sandbox_t;

/** @brief "auto", "on", "off" -> mode. @returns 0, or -1 when unknown. */
CQ_NODISCARD int cq_sandbox_mode_parse(const char *s, cq_sandbox_mode_t *mp);

/**
 * @brief Decide how kernels are confined; in auto and on modes this runs a
 *        probe (the python interpreter under bubblewrap, as the sandbox uid).
 * @param opts Borrowed; strings are copied.
 * @returns Caller owns the returned value; free with cq_sandbox_destroy().
 *          NULL when mode is on and the probe failed, or out of memory.
 * @locality Any thread; the handle is then thread-safe (read-only).
 */
cq_sandbox_t *
cq_sandbox_new(const cq_sandbox_opts_t *opts, char *errstr, size_t errstr_size);

void cq_sandbox_destroy(cq_sandbox_t **sandboxp);

/** @brief Whether kernels run under bubblewrap. */
bool cq_sandbox_enabled(const cq_sandbox_t *sandbox);

/** @brief Why auto mode fell back to no bubblewrap ("" when it did not);
 *         borrowed, valid until cq_sandbox_destroy(). */
const char *cq_sandbox_reason(const cq_sandbox_t *sandbox);

/**
 * @brief Give \p path to the uid kernels run as (a no-op unless the
 *        sandbox is on and the worker is root).
 * @returns 0, or -1 with errno set.
 */
CQ_NODISCARD int cq_sandbox_own(const cq_sandbox_t *sandbox, const char *path);

/**
 * @brief The argv that runs \p cmd in the sandbox with \p work_dir as its
 *        only writable directory (and cwd); \p cmd itself when the sandbox
 *        is off.
 * @param cmd Borrowed; NULL-terminated.
 * @param info_fd When >= 0 and the sandbox is on, bubblewrap writes its
 *        JSON info (`child-pid`: the sandbox's pid 1, as the host sees
 *        it) to this descriptor of the child; -1 for none.
 * @returns Caller owns the returned vector and its strings; free with
 *          cq_sandbox_argv_free(). NULL when out of memory.
 */
char **cq_sandbox_argv(const cq_sandbox_t *sandbox,
                       const char *work_dir,
                       const char *const *cmd,
                       int info_fd);

void cq_sandbox_argv_free(char **argv);

/**
 * @brief Child side, between fork() and execve(): set the rlimits and drop
 *        to the sandbox uid (setgroups, setgid, setuid) when enabled and
 *        root. Only async-signal-safe calls. \p sandbox may be NULL.
 * @returns 0, or -1 (the child must then _exit()).
 */
int cq_sandbox_child(const cq_sandbox_t *sandbox);

#endif
