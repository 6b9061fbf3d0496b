/* SPDX-License-Identifier: MIT */
/* collect.h - one accounting for every byte a cell sends, shared by the
 * local kernel and E2B backends. A cell's outputs are kept as a head (up to
 * half the cap) and a sliding tail (the other half) around one visible
 * marker that states how many bytes were dropped between them.
 *
 * Sizes: a stream output counts the UTF-8 bytes of its text; any other
 * output the length of its compact JSON serialization (data whatever the
 * JSON type of each value, metadata, transient, traceback). An update of a
 * kept display replaces the old bytes with the new ones. What a backend
 * refused before it reached the collector (a frame or line above its
 * bound, output the kernel itself dropped) is added with
 * cq_collect_dropped(), as an exact count or as a lower bound. */
#ifndef CODERQ_COLLECT_H
#define CODERQ_COLLECT_H

#include <jansson.h>

#include "coderq/common/common.h"
#include "coderq/interp/interp.h"

/* Start of the marker output: "\n" CQ_COLLECT_MARK "N bytes dropped ...]\n"
 * or "... at least N bytes dropped ...]\n". */
#define CQ_COLLECT_MARK "[... output truncated by coderq: "

/* The slack a backend allows a frame or line above the output cap: an
 * output that large could not be kept whole anyway. */
#define CQ_COLLECT_SLACK ((size_t)64 << 10)

/** @brief The outputs of one cell; fields are private. */
typedef struct cq_collect {
        json_t *head, *tail; /* arrays of outputs ("transient" kept) */
        size_t head_bytes, tail_bytes, head_max, tail_max;
        uint64_t dropped;   /* bytes received or reported but not kept */
        bool at_least;      /* dropped is a lower bound */
        bool closed;        /* the head takes no more outputs */
        bool clear_pending; /* clear_output(wait=True) seen */
        json_t *lost_ids;   /* display ids of dropped outputs (bounded) */
        bool lost_ids_full; /* more ids were dropped than lost_ids holds */
        cq_interp_output_cb_t *cb;
        void *opaque;
} cq_collect_t;

/**
 * @brief Start an empty collector for at most \p max bytes of outputs.
 * @param cb Called with each output that goes into the head, as it
 *           arrives, and once with a note when the head closes; may be NULL.
 * @returns 0, or -1 when out of memory (release it anyway).
 */
CQ_NODISCARD int cq_collect_init(cq_collect_t *col,
                                 size_t max,
                                 cq_interp_output_cb_t *cb,
                                 void *opaque);

/** @brief Free the contents, not the struct. */
void cq_collect_release(cq_collect_t *col);

/** @brief The size an output counts for (see above). */
size_t cq_collect_size(const json_t *output);

/**
 * @brief Add one output in arrival order; consecutive streams of one name
 *        merge. Out of memory, the output is counted as dropped.
 * @param outputp Takes ownership, even on failure; NULL is ignored.
 */
void cq_collect_add(cq_collect_t *col, json_t **outputp);

/**
 * @brief update_display_data: every kept output whose transient
 *        display_id is \p id gets \p data and \p metadata, and is counted
 *        again; one that no longer fits is dropped. An update of a display
 *        that was dropped counts as dropped too.
 * @param data, metadata Borrowed (referenced when kept).
 */
void cq_collect_update(cq_collect_t *col,
                       const char *id,
                       json_t *data,
                       json_t *metadata);

/**
 * @brief clear_output: forget everything so far (with \p wait, at the next
 *        output), counts included.
 */
void cq_collect_clear(cq_collect_t *col, bool wait);

/**
 * @brief Count \p bytes dropped before they reached the collector, at this
 *        point of the output: the head closes, later outputs go to the tail.
 * @param at_least \p bytes is a lower bound (the real size is unknown).
 */
void cq_collect_dropped(cq_collect_t *col, uint64_t bytes, bool at_least);

/** @brief Whether anything was dropped so far. */
bool cq_collect_truncated(const cq_collect_t *col);

/**
 * @brief The final outputs: head, the marker when something was dropped,
 *        tail; "transient" removed and streams merged. The collector is
 *        left as it was.
 * @returns New reference, or NULL when out of memory.
 */
json_t *cq_collect_finish(cq_collect_t *col);

#endif
