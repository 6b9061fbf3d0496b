/* SPDX-License-Identifier: MIT */
/* memory.h - episodic memory: solved problems kept per scope and
 * model, recalled by trigram similarity.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_MEMORY_H
#define CODERQ_STORAGE_MEMORY_H

#include "coderq/storage/store.h"

/**
 * @brief Remember a solved problem (once per job) in memory scope \p scope
 *        as solved by \p model. Only a job that named the scope may
 *        recall it (cq_store_recall()).
 * @param scope Required, 1..128 bytes.
 * @param model Required: the model whose conversation produced \p code.
 */
CQ_NODISCARD cq_err_t cq_store_remember(cq_store_t *store,
                                        const char *job_id,
                                        const char *scope,
                                        const char *model,
                                        const char *prompt,
                                        const char *code,
                                        const char *answer);

/** @brief A recalled solution. Release with cq_solution_release(). */
typedef struct cq_solution {
        char *job_id; /* may be NULL */
        char *prompt;
        char *code;
        char *answer; /* may be NULL */
        char *model;  /* the model that solved it; may be NULL */
        double similarity;
} cq_solution_t;

void cq_solution_init(cq_solution_t *sol);
void cq_solution_release(cq_solution_t *sol);

/**
 * @brief The most similar problem remembered in \p scope whose trigram
 *        similarity to \p prompt reaches the threshold.
 * @param scope Required: nothing outside it is ever returned.
 * @param model Only solutions of this model; NULL for any model.
 * @param threshold 0..1, or < 0 for the store's memory_threshold.
 * @param foundp (out) false when none is similar enough.
 */
CQ_NODISCARD cq_err_t cq_store_recall(cq_store_t *store,
                                      const char *scope,
                                      const char *model,
                                      const char *prompt,
                                      double threshold,
                                      cq_solution_t *sol,
                                      bool *foundp);

#endif
