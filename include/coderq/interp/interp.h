/* SPDX-License-Identifier: MIT */
/* interp.h - one interface for every execution backend: the local Jupyter
 * kernel (kernel.h, kpool.h) and E2B sandboxes. A backend embeds cq_interp_t
 * as the first member of its handle and fills in the ops; callers only use
 * the cq_interp_* functions below.
 *
 * Outputs are nbformat v4 output objects (jansson), in the order the code
 * produced them:
 *   {"output_type":"stream","name":"stdout"|"stderr","text":"..."}
 *   {"output_type":"display_data","data":{mime: value},"metadata":{}}
 *   {"output_type":"execute_result","data":{...},"metadata":{},
 *    "execution_count":N}
 *   {"output_type":"error","ename":"...","evalue":"...","traceback":[...]}
 * with text values as single strings (not line lists), tracebacks without
 * ANSI escapes, images as base64 strings exactly as the kernel sent them and
 * JSON mime types as JSON values. Consecutive streams of one name are
 * merged. The notebook builder, the agent and storage all consume this
 * shape. A cell's result (cq_cell_result_t) is in cell.h. */
#ifndef CODERQ_INTERP_H
#define CODERQ_INTERP_H

#include <jansson.h>
#include <stdatomic.h>

#include "coderq/common/cell.h"
#include "coderq/common/common.h"

/**
 * @brief Called for each output as it arrives, before the cell finishes.
 * @param output Borrowed; valid during the call only.
 * @locality The thread that called cq_interp_execute().
 */
typedef void(cq_interp_output_cb_t)(void *opaque, const json_t *output);

/* A value of cq_exec_opts_t.cancel: the cell is abandoned rather than
 * interrupted. The backend does not wait for it to stop: a local kernel is
 * killed (not replaced: a later cell in it ends CQ_CELL_DIED and starts a
 * fresh one), an E2B request is dropped. For a caller that runs no more
 * cells in the interpreter (a worker draining): interrupting 24 cells
 * gracefully took 3 to 6 s on two busy cores, each kernel formatting its
 * KeyboardInterrupt. */
#define CQ_INTERP_CANCEL_ABANDON 2

typedef struct cq_exec_opts {
        int64_t timeout_ms;               /* <= 0: no deadline */
        cq_interp_output_cb_t *on_output; /* may be NULL */
        void *opaque;
        /* When non-NULL and raised (non-zero) while the cell runs, the cell
         * is interrupted (abandoned at CQ_INTERP_CANCEL_ABANDON) and the
         * result is CQ_CELL_CANCELLED. Borrowed. */
        const atomic_int *cancel;
        /* When non-NULL: called once, from the thread that runs the cell,
         * when the cell has run slow_ms without finishing (at the backend's
         * next look after that: within 100 ms for a local kernel, about a
         * second for E2B). It may block (the kernel's output waits for it,
         * nothing is dropped). Not called for a cell that ends sooner. */
        void (*on_slow)(void *opaque);
        int64_t slow_ms;
} cq_exec_opts_t;

/** @brief A file from the work dir. Release with cq_files_release(). */
typedef struct cq_file {
        char *name;          /* relative to the work dir, '/'-separated */
        char *mime;          /* guessed from the name */
        unsigned char *data; /* may be NULL when only listed */
        size_t len;
} cq_file_t;

typedef struct cq_files {
        cq_file_t *v;
        size_t n;
} cq_files_t;

void cq_files_release(cq_files_t *files);

typedef struct cq_interp cq_interp_t;

/** @brief What a backend implements; see the cq_interp_* wrappers. */
typedef struct cq_interp_ops {
        const char *name; /* "local", "e2b" */
        cq_err_t (*put_file)(cq_interp_t *interp,
                             const char *name,
                             const void *data,
                             size_t len);
        cq_err_t (*execute)(cq_interp_t *interp,
                            const char *code,
                            const cq_exec_opts_t *opts,
                            cq_cell_result_t *res);
        int (*interrupt)(cq_interp_t *interp);
        cq_err_t (*restart)(cq_interp_t *interp);
        cq_err_t (*created_files)(cq_interp_t *interp,
                                  bool with_data,
                                  cq_files_t *files);
        cq_err_t (*get_file)(cq_interp_t *interp,
                             const char *name,
                             size_t max,
                             cq_file_t *file);
        const char *(*errmsg)(const cq_interp_t *interp);
        void (*destroy)(cq_interp_t *interp);
        /* May be NULL: the backend does not know its environment. */
        const json_t *(*env)(cq_interp_t *interp);
        /* May be NULL: the backend does not know its kernel's language. */
        const json_t *(*language_info)(cq_interp_t *interp);
} cq_interp_ops_t;

struct cq_interp {
        const cq_interp_ops_t *ops;
};

/**
 * @brief Write \p data as \p name (relative, no "..") into the work dir.
 * @returns CQ_OK, CQ_ERR_FATAL for a bad name, else CQ_ERR_RETRIABLE.
 * @locality The thread that owns \p interp.
 */
CQ_NODISCARD cq_err_t cq_interp_put_file(cq_interp_t *interp,
                                         const char *name,
                                         const void *data,
                                         size_t len);

/**
 * @brief Run \p code as one cell and collect its outputs into \p res (which
 *        the caller initialised with cq_cell_result_init()).
 * @returns CQ_OK whenever \p res describes the cell: a Python exception,
 *          a timeout, a dead kernel and a cancel are cell statuses, not
 *          errors. CQ_ERR_RETRIABLE / CQ_ERR_FATAL when the backend could not
 *          run the cell at all (and could not recover); see
 *          cq_interp_errmsg().
 * @remark After CQ_CELL_TIMEOUT or CQ_CELL_DIED the backend has already
 *         recovered, and res->state_lost says whether the variables
 *         survived: a local kernel is always replaced (true); an E2B
 *         context survives a timeout whose interrupt worked (false), while
 *         a lost sandbox is replaced (true). A runner (local/runner.h) is
 *         not replaced: its later cells are CQ_CELL_DIED (state_lost)
 *         until cq_interp_restart().
 * @locality The thread that owns \p interp.
 */
CQ_NODISCARD cq_err_t cq_interp_execute(cq_interp_t *interp,
                                        const char *code,
                                        const cq_exec_opts_t *opts,
                                        cq_cell_result_t *res);

/**
 * @brief Interrupt the running cell (SIGINT or the backend's equivalent).
 * @returns 0, or -1 when the backend could not deliver it.
 * @locality Any thread.
 */
int cq_interp_interrupt(cq_interp_t *interp);

/**
 * @brief Replace the kernel with a fresh one: all state is lost; files in
 *        the work dir stay.
 * @locality The thread that owns \p interp.
 */
CQ_NODISCARD cq_err_t cq_interp_restart(cq_interp_t *interp);

/**
 * @brief Files under the work dir that are new or changed since the
 *        interpreter started (job input files excluded), recursively.
 * @param with_data Also read each file's bytes.
 * @param files (out) Filled on CQ_OK; caller releases.
 * @locality The thread that owns \p interp.
 */
CQ_NODISCARD cq_err_t cq_interp_created_files(cq_interp_t *interp,
                                              bool with_data,
                                              cq_files_t *files);

/**
 * @brief Read one file of the work dir, refusing one larger than \p max
 *        (CQ_ERR_TOO_LARGE).
 * @locality The thread that owns \p interp.
 */
CQ_NODISCARD cq_err_t cq_interp_get_file(cq_interp_t *interp,
                                         const char *name,
                                         size_t max,
                                         cq_file_t *file);

/** @brief The last error; borrowed, valid until the next call. */
const char *cq_interp_errmsg(const cq_interp_t *interp);

/**
 * @brief What the interpreter's Python says about itself, from a Python
 *        the job's code does not run in: {"python": "3.11.2", "packages":
 *        {"numpy": "1.24.2", ...}} (numpy, pandas, matplotlib and scipy,
 *        those that are installed). A local kernel reports it when it
 *        starts, before any job code; an E2B sandbox on the first call,
 *        from its default Python context (the job runs in a context of
 *        its own).
 * @returns Borrowed, valid until the interpreter is restarted or
 *          destroyed; NULL when it is not known.
 * @locality The thread that owns \p interp.
 */
const json_t *cq_interp_env(cq_interp_t *interp);

/**
 * @brief The kernel's language_info as it reported it when it started
 *        ({"name": "python", "version": "3.11.2", ...}), for a notebook's
 *        metadata.
 * @returns Borrowed, valid until the interpreter is restarted or
 *          destroyed; NULL when the backend does not know it (E2B, a
 *          runner).
 * @locality The thread that owns \p interp.
 */
const json_t *cq_interp_language_info(cq_interp_t *interp);

/**
 * @brief The Python that reports the environment: it prints one line,
 *        \p marker then a JSON object, on stdout. Cheap: packages already
 *        imported give their __version__, the others are read from their
 *        installed metadata, nothing new is imported into the namespace.
 * @param marker Borrowed; letters, digits, '-' and ' ' only.
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory or \p marker is unsafe.
 */
char *cq_interp_env_probe(const char *marker);

/**
 * @brief Find the probe's line in \p outputs (a cell's outputs) and
 *        validate it: a version string of at most 32 characters of
 *        [0-9A-Za-z.+!_-] for Python and each known package; anything
 *        else is dropped.
 * @returns A new reference (json_decref()), or NULL when the line is
 *          missing or malformed.
 */
json_t *cq_interp_env_parse(const json_t *outputs, const char *marker);

/**
 * @brief A helper process that speaks a line protocol over two
 *        descriptors, such as the judging interpreter (agent/judge.h's
 *        cq_judge_proc_t is this type): requests go to its to_fd, its
 *        answers come from from_fd, our ends of its pipes; destroy kills
 *        and reaps it, removes what it was given (a work dir), closes
 *        both and frees \p proc.
 */
typedef struct cq_interp_proc {
        int to_fd;
        int from_fd;
        void (*destroy)(struct cq_interp_proc *proc);
} cq_interp_proc_t;

/** @brief The backend's name ("local", "e2b"). */
const char *cq_interp_backend(const cq_interp_t *interp);

/**
 * @brief Stop the kernel or sandbox and free everything; no process or
 *        remote sandbox outlives this call. Accepts *interpp == NULL and
 *        sets it to NULL.
 */
void cq_interp_destroy(cq_interp_t **interpp);

/** @brief A mime type guessed from a file name ("image/png", ...); static. */
const char *cq_mime_from_name(const char *name);

/**
 * @brief Whether \p name is a safe relative path: non-empty, not absolute,
 *        no "..", "." or empty components, no NUL or control characters,
 *        at most 255 bytes.
 */
bool cq_relpath_is_safe(const char *name);

#endif
