/* SPDX-License-Identifier: MIT */
/* memory.c - episodic memory: solved problems kept with their code and
 * answer per scope and model, recalled for a new prompt by pg_trgm
 * similarity (GIN index on the prompt; the % operator uses the threshold
 * set for the lookup) inside one scope only. */
#include "coderq/storage/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_int.h"

static const char SQL_REMEMBER[] =
    "INSERT INTO solutions (job_id, prompt, code, answer, scope, model)"
    " VALUES ($1, $2, $3, $4, $5, $6)"
    " ON CONFLICT (job_id) DO UPDATE SET prompt = EXCLUDED.prompt,"
    " code = EXCLUDED.code, answer = EXCLUDED.answer,"
    " scope = EXCLUDED.scope, model = EXCLUDED.model";

static const char SQL_THRESHOLD[] =
    "SELECT set_config('pg_trgm.similarity_threshold', $1, true)";

static const char SQL_RECALL[] =
    "SELECT job_id, prompt, code, answer, similarity(prompt, $1)::text,"
    " model FROM solutions WHERE prompt % $1 AND scope = $2"
    " AND ($3::text IS NULL OR model = $3)"
    " ORDER BY similarity(prompt, $1) DESC, solution_id DESC LIMIT 1";

cq_err_t cq_store_remember(cq_store_t *store,
                           const char *job_id,
                           const char *scope,
                           const char *model,
                           const char *prompt,
                           const char *code,
                           const char *answer)
{
        store_params_t sp;

        if (!prompt || !*prompt || !code || !scope || !*scope || !model) {
                store_set_error(store, "could not remember a solution: "
                                       "scope, model, prompt and code are "
                                       "required");
                return CQ_ERR_FATAL;
        }
        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, prompt);
        sp_text(&sp, code);
        sp_text(&sp, answer);
        sp_text(&sp, scope);
        sp_text(&sp, model);
        return store_exec(store, "remember a solution", SQL_REMEMBER, &sp, 0,
                          job_id != NULL, NULL);
}

void cq_solution_init(cq_solution_t *sol) { memset(sol, 0, sizeof(*sol)); }

void cq_solution_release(cq_solution_t *sol)
{
        free(sol->job_id);
        free(sol->prompt);
        free(sol->code);
        free(sol->answer);
        free(sol->model);
        cq_solution_init(sol);
}

cq_err_t cq_store_recall(cq_store_t *store,
                         const char *scope,
                         const char *model,
                         const char *prompt,
                         double threshold,
                         cq_solution_t *sol,
                         bool *foundp)
{
        store_params_t sp;
        PGresult *res = NULL;
        char num[32];
        cq_err_t err;
        bool oom = false;

        *foundp = false;
        if (threshold < 0)
                threshold = store->opts.memory_threshold;
        if (!(threshold >= 0 && threshold <= 1) || !prompt || !scope ||
            !*scope) {
                store_set_error(store, "could not recall a solution: a "
                                       "prompt, a scope and a threshold "
                                       "within 0..1 are required");
                return CQ_ERR_FATAL;
        }
        snprintf(num, sizeof(num), "%.6f", threshold);
        err = store_begin(store, "recall a solution");
        if (err != CQ_OK)
                return err;
        sp_init(&sp);
        sp_text(&sp, num);
        err = store_exec(store, "set the similarity threshold", SQL_THRESHOLD,
                         &sp, 0, false, NULL);
        if (err != CQ_OK)
                goto out;
        sp_init(&sp);
        sp_text(&sp, prompt);
        sp_text(&sp, scope);
        sp_text(&sp, model);
        err = store_exec(store, "recall a solution", SQL_RECALL, &sp, 0, false,
                         &res);
        if (err != CQ_OK)
                goto out;
        err = store_commit(store, "recall a solution");
        if (err != CQ_OK || PQntuples(res) == 0)
                goto out;
        sol->job_id = store_strdup_value(res, 0, 0, &oom);
        sol->prompt = store_strdup_value(res, 0, 1, &oom);
        sol->code = store_strdup_value(res, 0, 2, &oom);
        sol->answer = store_strdup_value(res, 0, 3, &oom);
        sol->similarity = strtod(PQgetvalue(res, 0, 4), NULL);
        sol->model = store_strdup_value(res, 0, 5, &oom);
        if (oom) {
                store_set_error(store, "could not recall a solution: out of "
                                       "memory");
                cq_solution_release(sol);
                err = CQ_ERR_FATAL;
                goto out;
        }
        *foundp = true;
out:
        if (err != CQ_OK)
                store_rollback(store);
        PQclear(res);
        return err;
}
