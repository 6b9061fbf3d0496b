/* SPDX-License-Identifier: MIT */
/* proc.h - run a program as a subprocess from a test, with a bounded time
 * and bounded output, and collect its exit status, stdout and stderr. Used
 * by the suites that drive the coderq executable. */
#ifndef CODERQ_CHECK_PROC_H
#define CODERQ_CHECK_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* Output kept per stream; the rest is read and dropped. */
#define CQ_CHECK_PROC_MAX_OUTPUT (1024 * 1024)

/** @brief What a finished subprocess left behind. Strings are owned by the
 *         struct and NUL-terminated (never NULL after a run). */
typedef struct cq_check_proc {
        int status; /* exit code, or 128 + signal number */
        int timed_out;
        char *out;
        size_t out_len;
        char *err;
        size_t err_len;
} cq_check_proc_t;

/**
 * @brief Run \p argv (argv[0] is a path, not searched in PATH) with the
 *        environment of this process changed by \p env: "NAME=value" sets,
 *        "NAME" unsets; \p env may be NULL. stdin is /dev/null. A process
 *        still running after \p timeout_ms is killed (status 128 + 9).
 * @param proc (out) filled on success; release with cq_check_proc_release().
 * @returns 0, or -1 when the process could not be started.
 */
int cq_check_proc_run(const char *const *argv,
                      const char *const *env,
                      int timeout_ms,
                      cq_check_proc_t *proc);

/**
 * @brief Run the built `coderq ARGS...` (\p args NULL-terminated, at most
 *        14) as cq_check_proc_run() runs a program, with \p env.
 * @returns As cq_check_proc_run().
 */
int cq_check_coderq(const char *const *args,
                    const char *const *env,
                    int timeout_ms,
                    cq_check_proc_t *proc);

/**
 * @brief Start \p argv as cq_check_proc_run() would, with \p env, without
 *        waiting for it: stdin /dev/null, stdout and stderr appended to
 *        the file \p log, and killed when the test process dies
 *        (PR_SET_PDEATHSIG). The caller reaps it (waitpid()).
 * @returns Its pid, or -1 when it could not be started.
 */
pid_t cq_check_proc_spawn(const char *const *argv,
                          const char *const *env,
                          const char *log);

/**
 * @brief cq_check_coderq() against a test's own PostgreSQL database
 *        (\p dsn) and jobs topic (\p topic), the brokers of this process's
 *        environment, errors only in the log and no prices file.
 * @returns As cq_check_proc_run().
 */
int cq_check_coderq_at(const char *dsn,
                       const char *topic,
                       const char *const *args,
                       int timeout_ms,
                       cq_check_proc_t *proc);

/** @brief Free the strings of \p proc, not the struct. */
void cq_check_proc_release(cq_check_proc_t *proc);

/**
 * @brief Write the stacks of every thread of the live process \p pid to
 *        stderr, with gdb (when installed), in at most about 60 s: what a
 *        test prints before it kills a process that did not stop in time,
 *        so a hang on CI says where it waits. Prints one line saying why
 *        when gdb is absent or fails.
 */
void cq_check_proc_backtrace(int pid);

/** @brief Number of lines (newline-terminated or not) in \p s. */
size_t cq_check_count_lines(const char *s);

#endif
