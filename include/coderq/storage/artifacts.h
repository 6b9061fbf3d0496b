/* SPDX-License-Identifier: MIT */
/* artifacts.h - a job's checkpoints (messages, cells, the notebook
 * and the turn that ties them) and its images.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_ARTIFACTS_H
#define CODERQ_STORAGE_ARTIFACTS_H

#include "coderq/storage/store.h"

/*
 * Checkpoint writes are idempotent: the caller names each message's and
 * cell's seq (its key with the job), so a write retried after a lost
 * connection (its commit may have landed) is stored once. Retrying the
 * same seq with the same content is CQ_OK; other content at a stored seq
 * is CQ_ERR_FATAL (nothing is overwritten). Strings in documents may hold
 * any character, U+0000 included (stored escaped, see store_int.h and
 * docs/JOBS.md#every-character-code-prints-is-kept); readers here return them
 * unescaped.
 */

/**
 * @brief Store one conversation message (an OpenAI chat message object
 *        with a "role") at \p seq of the job, guarded by the lease.
 *        Retried once after a reconnect (safe: \p seq is its key).
 * @param seq From 1: the message's position in the conversation.
 * @param message Borrowed.
 * @param lostp (out) true when this owner no longer holds the lease:
 *        nothing was written.
 */
CQ_NODISCARD cq_err_t cq_store_append_message(cq_store_t *store,
                                              const char *job_id,
                                              int seq,
                                              const json_t *message,
                                              bool *lostp);

/**
 * @brief cq_store_append_message() and, in the same statement, what
 *        cq_store_record_usage() writes (\p usage: the job's totals, NULL:
 *        none), so an LLM reply and the usage of the call that made it are
 *        one checkpoint: stored together or not at all.
 * @param usage Borrowed; NULL writes the message alone.
 * @param cost_usd The job's cost so far; < 0: unknown.
 * @param run_budgetp (out, may be NULL) whether the job's run has a budget
 *        now, read in the same statement; false when the lease was lost or
 *        on error.
 */
CQ_NODISCARD cq_err_t cq_store_append_message_usage(cq_store_t *store,
                                                    const char *job_id,
                                                    int seq,
                                                    const json_t *message,
                                                    const cq_usage_t *usage,
                                                    double cost_usd,
                                                    bool *lostp,
                                                    bool *run_budgetp);

/**
 * @brief Record an executed cell at \p seq and rewrite the job's notebook,
 *        in one transaction guarded by the lease. Not retried here (a
 *        transaction): on CQ_ERR_RETRIABLE call it again with the same
 *        arguments.
 * @param seq From 1: the cell's position among the job's cells.
 * @param code, res, notebook Borrowed. \p notebook may be NULL.
 * @returns CQ_ERR_TOO_LARGE when the notebook exceeds the cap.
 */
CQ_NODISCARD cq_err_t cq_store_record_cell(cq_store_t *store,
                                           const char *job_id,
                                           int seq,
                                           const char *code,
                                           const cq_cell_result_t *res,
                                           const json_t *notebook,
                                           bool *lostp);

/**
 * @brief One turn's checkpoint in one statement (one round trip, one
 *        transaction): the cell that just ran with the notebook snapshot,
 *        as cq_store_record_cell() writes them (\p code NULL: no cell),
 *        then the messages of \p messages at seq \p first_seq onwards,
 *        and the usage as cq_store_append_message_usage() writes it:
 *        stored all together or not at all, so a turn killed half way
 *        leaves no cell without its tool message. Retry-safe like those:
 *        on CQ_ERR_RETRIABLE call it again with the same arguments.
 * @param cell_seq From 1, with \p code; ignored without it.
 * @param code, res, notebook Borrowed; \p notebook may be NULL.
 * @param messages Borrowed; an array of message objects, each with a
 *        "role" string, at least one.
 * @param usage Borrowed; NULL: none.
 * @param cost_usd The job's cost so far; < 0: unknown.
 * @param lostp (out) true when this owner no longer holds the lease:
 *        nothing was written.
 * @param run_budgetp (out, may be NULL) as for
 *        cq_store_append_message_usage().
 * @returns CQ_ERR_TOO_LARGE when the notebook exceeds the cap (nothing
 *          written).
 */
CQ_NODISCARD cq_err_t cq_store_checkpoint_turn(cq_store_t *store,
                                               const char *job_id,
                                               int cell_seq,
                                               const char *code,
                                               const cq_cell_result_t *res,
                                               const json_t *notebook,
                                               int first_seq,
                                               const json_t *messages,
                                               const cq_usage_t *usage,
                                               double cost_usd,
                                               bool *lostp,
                                               bool *run_budgetp);

/** @brief What a resumed job starts from. Release with
 *         cq_checkpoint_release(). */
typedef struct cq_checkpoint {
        json_t *messages;     /* array of message objects in seq order */
        json_t *cells;        /* array of {"seq","code","status",
                                 "execution_count","outputs"} of the cells
                                 that ran to the end (status ok or error: a
                                 failed cell may have set state), in seq
                                 order */
        json_t *notebook;     /* the last notebook, or NULL */
        int last_message_seq; /* highest stored seq, 0 for none */
        int last_cell_seq;    /* highest stored cell seq (all statuses) */
} cq_checkpoint_t;

void cq_checkpoint_init(cq_checkpoint_t *cp);
void cq_checkpoint_release(cq_checkpoint_t *cp);

/** @brief Load a job's checkpoint (empty arrays when it has none). */
CQ_NODISCARD cq_err_t cq_store_load_checkpoint(cq_store_t *store,
                                               const char *job_id,
                                               cq_checkpoint_t *cp);

/* ------------------------------------------------------------ images */

/** @brief One name of a stored image, with the image's bytes. Release
 *         with cq_images_release(). */
typedef struct cq_image {
        char sha256[65];
        char *name;
        char *mime;
        int cell_seq; /* the cell that showed it or after which the file
                         appeared; 0 when not known */
        unsigned char *data;
        size_t len;
} cq_image_t;

typedef struct cq_images {
        cq_image_t *v;
        size_t n;
} cq_images_t;

void cq_images_init(cq_images_t *images);
void cq_images_release(cq_images_t *images);

/**
 * @brief Store an image of a job under \p name. The same bytes twice in one
 *        job are kept once (unique sha256 per job), under every name they
 *        were stored with: a figure a cell showed and the file the code
 *        saved of it keep both names. Retry-safe: the same bytes under the
 *        same name are stored once.
 * @param data Borrowed, \p len bytes (any bytes, NUL included).
 * @param cell_seq The cell that produced it under this name (the cell that
 *        showed it, or after which the file appeared), or 0: not known.
 * @param sha256 (out, optional) 65 bytes: the hex digest.
 * @param createdp (out, optional) false when the bytes were stored already
 *        (under this name or another).
 * @returns CQ_ERR_TOO_LARGE over the image cap.
 */
CQ_NODISCARD cq_err_t cq_store_put_image(cq_store_t *store,
                                         const char *job_id,
                                         const char *name,
                                         const char *mime,
                                         const void *data,
                                         size_t len,
                                         int cell_seq,
                                         char *sha256,
                                         bool *createdp);

/** @brief All images of a job, one entry per name (the bytes repeated for
 *         each name of the same image), in the order the names were
 *         stored. */
CQ_NODISCARD cq_err_t cq_store_get_images(cq_store_t *store,
                                          const char *job_id,
                                          cq_images_t *images);

#endif
