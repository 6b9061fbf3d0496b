/* SPDX-License-Identifier: MIT */
/* itworker.h - `coderq worker` processes for the integration suites: the
 * settings of one test's coderq processes (its database, brokers, topics
 * and the fake LLM), workers started with them into a log folder of the
 * suite, stopped or killed, and the end of their logs on stderr when a
 * test fails. Every helper fails the current test on an error. */
#ifndef CODERQ_CHECK_ITWORKER_H
#define CODERQ_CHECK_ITWORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "support/fake_llm.h"

#define CQ_ITW_ENV_MAX 48

/** @brief "NAME=value" settings (or "NAME": unset) for cq_itw_start()
 *         and, as \p v, cq_check_coderq(). */
typedef struct cq_itw_env {
        const char *v[CQ_ITW_ENV_MAX + 1]; /* read-only; NULL-terminated */
        char *own[CQ_ITW_ENV_MAX];         /* private: the strings of v */
        size_t n;
} cq_itw_env_t;

/**
 * @brief The settings of one test: CODERQ_PG_DSN \p dsn,
 *        CODERQ_KAFKA_BROKERS \p brokers, the topics <prefix>.jobs,
 *        .dlq, .results and .events and the group <prefix>, the fake LLM
 *        at \p llm_url (no API keys), no sandbox, a kernel server that
 *        preloads no numerical stack (the jobs of these suites print),
 *        info logs, 2 slots, a 30 s lease, 100 ms polls, a 200 ms relay.
 *        Borrowed strings are copied. Release with cq_itw_env_release().
 */
void cq_itw_env_init(cq_itw_env_t *env,
                     const char *dsn,
                     const char *brokers,
                     const char *prefix,
                     const char *llm_url);

/** @brief Set \p name to \p value (NULL: unset it), replacing an earlier
 *         setting of \p name. */
void cq_itw_env_set(cq_itw_env_t *env, const char *name, const char *value);

void cq_itw_env_release(cq_itw_env_t *env);

/** @brief One started worker. Fields read-only. */
typedef struct cq_itw {
        pid_t pid;  /* 0 once reaped */
        int status; /* exit status (or 128 + signal) once reaped */
        char name[64];
        char log[512];
} cq_itw_t;

/**
 * @brief Start `coderq worker` with \p env and CODERQ_WORKER_ID \p name,
 *        its output appended to \p logdir/<name>.log; it dies with the
 *        test process.
 */
void cq_itw_start(cq_itw_t *w,
                  const cq_itw_env_t *env,
                  const char *logdir,
                  const char *name);

/** @brief Wait up to \p timeout_ms for the worker to log "worker started"
 *         (its interpreters, intake and relay are up); fails the test
 *         when it does not, or exits first. */
void cq_itw_wait_started(cq_itw_t *w, int timeout_ms);

/** @brief Whether the worker still runs (reaps it when it exited). */
bool cq_itw_alive(cq_itw_t *w);

/**
 * @brief Signal the worker (\p sig 0: signalled already) and wait for it
 *        for up to \p timeout_ms.
 * @returns Its exit status (or 128 + signal), or -1 when it did not exit
 *          in time: its threads' stacks and log are then printed and it
 *          is killed. A status other than 0 or a kill prints the end of
 *          its log.
 */
int cq_itw_stop(cq_itw_t *w, int sig, int timeout_ms);

/** @brief The last 40 lines of the worker's log on stderr: warnings and
 *         errors only unless \p all. */
void cq_itw_dump_log(const cq_itw_t *w, bool all);

#define CQ_ITW_FLEET_MAX 4

/** @brief What a suite of workers on the fake LLM holds: the fake, a
 *         migrated database of its own, a log folder and its workers.
 *         Fields read-only. */
typedef struct cq_itw_fleet {
        cq_fake_llm_t *fake;
        char dsn[2048]; /* the database's conninfo */
        char dbname[96];
        char logdir[64];
        cq_itw_t workers[CQ_ITW_FLEET_MAX];
} cq_itw_fleet_t;

/**
 * @brief Start the fake LLM, make the log folder /tmp/cq-it-<name>-XXXXXX
 *        and the database <dbprefix>_<pid>_... on the server of
 *        CODERQ_PG_DSN (dropping those of earlier runs that died).
 */
void cq_itw_fleet_setup(cq_itw_fleet_t *fleet,
                        const char *name,
                        const char *dbprefix);

/** @brief Stop the fake, drop the database and remove the log folder (kept,
 *         and said so, when CQ_KEEP_LOGS is set). */
void cq_itw_fleet_teardown(cq_itw_fleet_t *fleet);

/** @brief Start worker \p i of the fleet as cq_itw_start() does, in its
 *         log folder, and wait until it has started. */
void cq_itw_fleet_start(cq_itw_fleet_t *fleet,
                        size_t i,
                        const cq_itw_env_t *env,
                        const char *name);

/** @brief Kill every worker of the fleet still running (after a test, pass
 *         or fail). */
void cq_itw_fleet_kill(cq_itw_fleet_t *fleet);

/** @brief Whether every worker of the fleet started so far still runs;
 *         fails the test naming the one that exited, and \p when. */
void cq_itw_fleet_alive(cq_itw_fleet_t *fleet, const char *when);

/** @brief How many jobs of the fleet's database finished (succeeded,
 *         failed or cancelled). */
long cq_itw_fleet_finished(const cq_itw_fleet_t *fleet);

#endif
