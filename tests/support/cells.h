/* SPDX-License-Identifier: MIT */
/* cells.h - running cells in an interpreter from a test and reading what
 * they gave: shared by the suites of the local interpreters (kernels and
 * runners). Each fails the test when the interpreter does. */
#ifndef CODERQ_CHECK_CELLS_H
#define CODERQ_CHECK_CELLS_H

#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "coderq/interp/interp.h"
#include "coderq/local/kserver.h"
#include "coderq/local/sandbox.h"
#include "support/fake_e2b.h"

/** @brief Run \p code within \p timeout_ms (0: none) into \p res (which
 *         this initialises); the interpreter must give a result. */
void cq_check_cell(cq_interp_t *interp,
                   const char *code,
                   int64_t timeout_ms,
                   cq_cell_result_t *res);

/** @brief The text of all streams called \p name, joined. Caller owns the
 *         returned value (free()). */
char *cq_check_stream_text(const cq_cell_result_t *res, const char *name);

/** @brief The first output of \p type, or NULL. Borrowed from \p res. */
const json_t *cq_check_find_output(const cq_cell_result_t *res,
                                   const char *type);

/** @brief Run \p code (30 s at most) and check that its stdout is
 *         \p want. */
void cq_check_stdout(cq_interp_t *interp, const char *code, const char *want);

/**
 * @brief A new interpreter for an agent test: an E2B sandbox of \p e2b's
 *        double, or (\p e2b NULL) a local kernel of /usr/bin/python3 with
 *        no sandbox, a 60 s start and 1 MiB of output. Fails the test when
 *        it cannot be had. Caller owns it (cq_interp_destroy()).
 */
cq_interp_t *cq_check_agent_interp(const cq_fake_e2b_t *e2b);

/** @brief Whether the suite runs with every local interpreter forked by a
 *         kernel server: CQ_CHECK_KSERVER=on (ctest's *_forked runs,
 *         which need root, as the server's sandbox does). */
bool cq_check_forked_mode(void);

/**
 * @brief A kernel server of \p sandbox's kind (sandboxed or not) under
 *        \p work_root, importing \p preload (NULL: the default), started
 *        at the first call of the test (each test is a process of its own)
 *        and stopped at its exit; NULL when not in forked mode.
 * @returns Borrowed; valid until the test process exits.
 */
cq_kserver_t *cq_check_kserver(const cq_sandbox_t *sandbox,
                               const char *work_root,
                               const char *preload);

/** @brief Stop the kernel servers of cq_check_kserver() (at exit, or
 *         before an _exit(), which runs no atexit()). */
void cq_check_kservers_stop(void);

/* A cell that marks, in its work dir, that it runs, then sleeps: the
 * thread acting on it (raise its cancel flag, or interrupt it) waits for
 * the mark, so what it acts on is a running cell. */
#define CQ_CHECK_MARKED_SLEEP                                                  \
        "open('running.mark', 'w').close()\ntime.sleep(30)"

typedef struct cq_check_running {
        char mark[PATH_MAX]; /* the mark's path */
        atomic_int *cancel;  /* raised when set, else interp interrupted */
        int cancel_value;    /* what it is raised to; 0: 1 */
        cq_interp_t *interp;
        bool ran;         /* the mark appeared */
        int interrupt;    /* cq_interp_interrupt()'s result */
        int64_t acted_ms; /* when it acted */
} cq_check_running_t;

/** @brief A pthread start routine on a cq_check_running_t: once the mark
 *         exists (30 s at most), raise the cancel flag or interrupt. */
void *cq_check_act_when_running(void *arg);

#endif
