/* SPDX-License-Identifier: MIT */
/* cell.h - the result of one executed cell and the names of its statuses:
 * what an interpreter fills in (interp.h) and what storage writes, in one
 * place both may use. The outputs are nbformat v4 output objects; interp.h
 * describes their shape. */
#ifndef CODERQ_CELL_H
#define CODERQ_CELL_H

#include <jansson.h>

#include "coderq/common/common.h"

typedef enum cq_cell_status {
        CQ_CELL_OK = 0,
        CQ_CELL_ERROR,     /* the code raised; see the "error" output */
        CQ_CELL_TIMEOUT,   /* deadline hit; see state_lost */
        CQ_CELL_DIED,      /* the kernel died; a fresh one was started */
        CQ_CELL_CANCELLED, /* the cancel flag was raised; interrupted */
} cq_cell_status_t;

/** @brief "ok", "error", "timeout", "died", "cancelled" (the values of
 *         the cells table's status column); NULL for a value outside
 *         the enum. Static string. */
const char *cq_cell_status_str(cq_cell_status_t status);

/** @brief cq_cell_status_str(), or "unknown" for a value outside the
 *         enum, for logs and messages. Static string. */
const char *cq_cell_status_name(cq_cell_status_t status);

/** @brief The result of one cell. Release with cq_cell_result_release(). */
typedef struct cq_cell_result {
        cq_cell_status_t status;
        json_t *outputs;     /* array of outputs (see interp.h); owned */
        int execution_count; /* -1 when the kernel gave none */
        int64_t duration_ms;
        bool truncated;  /* the per-cell output cap was hit; a marker output
                            says where */
        bool state_lost; /* the kernel was replaced: variables are gone */
        json_t *timing;  /* nbformat cell metadata.execution, or NULL */
} cq_cell_result_t;

/** @brief An empty result: status ok, no outputs, execution count -1. */
void cq_cell_result_init(cq_cell_result_t *res);

/** @brief Free the outputs and timing and leave \p res as after
 *         cq_cell_result_init(). */
void cq_cell_result_release(cq_cell_result_t *res);

#endif
