/* SPDX-License-Identifier: MIT */
/* gate.h - first come, first served admission of short bursts of work.
 *
 * When many threads start CPU-bound work at the same moment (64 slots
 * whose LLM replies arrive together, each then running a cell), the
 * scheduler shares the CPUs among all of them and every one finishes at
 * the end of the burst. A gate lets at most `width` of them in at once, in
 * arrival order: the first finish early, and the spread they finish with
 * carries over into their next LLM calls, so later bursts do not form.
 * Work that outlasts `hold_ms` stops counting against the width (it is
 * long work, which sharing suits), so no caller waits longer than about
 * queue length / width x hold_ms. */
#ifndef CODERQ_GATE_H
#define CODERQ_GATE_H

#include <stdint.h>

#include "coderq/common/common.h"

typedef struct cq_gate cq_gate_t;

/** @brief Counters of a gate. */
typedef struct cq_gate_stats {
        uint64_t arrived;    /* calls to cq_gate_enter() so far */
        uint64_t entered;    /* calls that got in */
        uint64_t waited;     /* of those, calls that had to wait */
        uint64_t expired;    /* holders that outlasted hold_ms */
        int64_t max_wait_ms; /* longest wait to get in */
        unsigned width;      /* as created */
        int64_t hold_ms;     /* as created */
} cq_gate_stats_t;

/**
 * @brief A gate admitting \p width callers at once, each counted for at
 *        most \p hold_ms (at least 1).
 * @returns Caller owns the returned value; free with cq_gate_destroy().
 *          NULL when out of memory or \p width is 0.
 */
cq_gate_t *cq_gate_new(unsigned width, int64_t hold_ms);

/** @brief Accepts *gatep == NULL; sets it to NULL. No caller may be in
 *         or waiting at the gate. */
void cq_gate_destroy(cq_gate_t **gatep);

/**
 * @brief Wait for a turn, in order of arrival.
 * @returns The ticket to pass to cq_gate_leave().
 * @locality Any thread.
 */
uint64_t cq_gate_enter(cq_gate_t *gate);

/** @brief Done with the work of \p ticket (harmless after it expired). */
void cq_gate_leave(cq_gate_t *gate, uint64_t ticket);

/** @brief A snapshot of the counters. @locality Any thread. */
void cq_gate_stats(cq_gate_t *gate, cq_gate_stats_t *stats);

#endif
