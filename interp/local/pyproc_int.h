/* SPDX-License-Identifier: MIT */
/* pyproc_int.h - a Python program of coderq's own (a runner, a judging
 * interpreter) as one confined process, exactly as a local kernel is
 * confined: a new work dir of its own, the uid a kernel would lease, the
 * scrubbed environment, the sandbox's rlimits and bubblewrap (or, forked
 * by the kernel server, the same confinement built by kinit); forked when
 * the server can, else started cold. Its descriptors 0-3 are the
 * caller's. runner.c and judgeproc.c start theirs with it. Not a public
 * header. */
#ifndef CODERQ_PYPROC_INT_H
#define CODERQ_PYPROC_INT_H

#include <limits.h>

#include "coderq/local/kserver.h"
#include "coderq/local/sandbox.h"
#include "lproc_int.h"

/* What a pyproc runs and where; the strings and vectors are borrowed and
 * must outlive it (a restart uses them again). */
typedef struct pyproc_opts {
        const char *op;              /* "runner", "judge": the kernel
                                        server's request, and for logs */
        const char *python;          /* NULL: /usr/bin/python3 */
        const char *const *flags;    /* a cold start's interpreter options
                                        before -c; NULL-terminated */
        const char *program;         /* run as `python -c PROGRAM` */
        const char *const *args;     /* its arguments; NULL-terminated */
        const cq_sandbox_t *sandbox; /* NULL: no sandbox, no rlimits */
        cq_kserver_t *kserver;       /* NULL: always cold */
        const char *work_root;       /* NULL: the default */
        /* NULL, or what a forked start runs before the program
         * (cq_kserver_req_t's preload); a cold start runs none */
        const char *preload;
} pyproc_opts_t;

typedef struct pyproc {
        pyproc_opts_t opts;
        lproc_t proc;
        cq_sandbox_id_t id;      /* leased at the first start, till release */
        char work_dir[PATH_MAX]; /* "" until the first start made it */
} pyproc_t;

/** @brief Nothing started yet; \p opts copied (see pyproc_opts_t). */
void pyproc_init(pyproc_t *pp, const pyproc_opts_t *opts);

/**
 * @brief Start the program with \p fds as its descriptors 0-3 (ours stay
 *        open: the caller closes them once this returned). The first
 *        start makes the work dir and leases the uid, which later starts
 *        (after pyproc_stop()) keep. Returns as soon as the process runs;
 *        any handshake is the caller's.
 * @returns 0, or -1 with \p errstr filled and nothing left running.
 */
CQ_NODISCARD int
pyproc_start(pyproc_t *pp, const int fds[4], char *errstr, size_t errstr_size);

/** @brief Whether the running one was forked by the kernel server. */
bool pyproc_forked(const pyproc_t *pp);

/** @brief Kill every process of it and wait until they are gone; the
 *         work dir and the uid stay for another start. */
void pyproc_stop(pyproc_t *pp);

/** @brief pyproc_stop(), then give the uid back and remove the work dir
 *         (without following a link in it). \p pp is then as after
 *         pyproc_init(). */
void pyproc_release(pyproc_t *pp);

#endif
