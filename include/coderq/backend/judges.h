/* SPDX-License-Identifier: MIT */
/* judges.h - judging interpreters kept between runs of the same test
 * code: a judge whose run ended cleanly waits, under the key of the test
 * code it ran (cq_judge_key()), for the next run of that code, so that
 * the samples of one problem pay for one judge's start instead of one
 * each. Bounded in number, in idle time and in runs per judge. Never
 * shared between different test code: no state a run of one test code
 * leaves in its judge can reach a run of another. */
#ifndef CODERQ_BACKEND_JUDGES_H
#define CODERQ_BACKEND_JUDGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coderq/interp/interp.h"

typedef struct cq_judges cq_judges_t;

/** @brief What the keeper did so far. */
typedef struct cq_judges_stats {
        size_t idle;      /* judges waiting now */
        uint64_t kept;    /* judges handed back and kept */
        uint64_t taken;   /* runs that got a kept judge */
        uint64_t dropped; /* kept judges ended: idle too long, too many runs,
                             no room, or found dead when taken */
} cq_judges_stats_t;

/**
 * @brief A keeper of at most \p max idle judges (0: keeps none), each
 *        ended after \p idle_ms without a run or after \p runs_max runs.
 * @returns Caller owns the returned value; free with cq_judges_destroy().
 *          NULL when out of memory.
 * @locality Any thread; the handle is then thread-safe.
 */
cq_judges_t *cq_judges_new(size_t max, int64_t idle_ms, unsigned runs_max);

/**
 * @brief The judge kept last under \p key, alive and waiting, or NULL.
 *        A kept judge found dead (its pipes closed or written to while it
 *        waited) is destroyed, and the next one under \p key is tried.
 * @returns Caller owns the returned value (destroy it, or hand it back
 *          with cq_judges_keep()).
 */
cq_interp_proc_t *cq_judges_take(cq_judges_t *judges, const char *key);

/**
 * @brief Keep \p proc, whose last run (of the test code of \p key) ended
 *        with its report and nothing after it, for the next run of that
 *        code. With no room, the judge idle longest is ended for it.
 * @returns true: \p judges owns \p proc. false (its runs are used up, the
 *          keeper keeps none, out of memory): the caller still does.
 */
bool cq_judges_keep(cq_judges_t *judges,
                    const char *key,
                    cq_interp_proc_t *proc);

/** @brief End the judges idle for longer than the keeper's idle time at
 *         \p now_ms (cq_now_ms()). @returns How many ended. */
size_t cq_judges_expire(cq_judges_t *judges, int64_t now_ms);

void cq_judges_stats(cq_judges_t *judges, cq_judges_stats_t *st);

/** @brief End every kept judge and free the keeper. Accepts NULL. */
void cq_judges_destroy(cq_judges_t **judgesp);

#endif
