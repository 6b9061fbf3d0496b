/* SPDX-License-Identifier: MIT */
/* e2b.h - the E2B interpreter backend: one remote sandbox per handle, made
 * from the code-interpreter template over E2B's HTTP API
 * (docs/internals/protocols/e2b.md), behind the cq_interp_t interface of
 * interp.h.
 *
 * Lifecycle. cq_e2b_new() creates the sandbox with a short TTL and a kernel
 * context of its own; each cell extends the TTL when a third of it has
 * passed (or when the cell's deadline would outlast it), a running cell
 * extends it again once two thirds have passed, and cq_e2b_keepalive()
 * lets a housekeeping thread do the same at any time (a fleet does it for
 * every sandbox of a worker). Creation is retried only when E2B says a
 * retry may help (429, 502, 503, 504, Should-Retry: true) or the request
 * never went out; a create whose reply was lost or failed with a 5xx
 * first kills what it may have made, found by its metadata tag. A sandbox found
 * gone before a cell (its TTL ended, or a 502) is replaced and the cell runs in
 * the new one with state_lost set and a note on stderr. E2B_DEBUG mode
 * (no control plane) is not supported. The sandbox is killed on destroy and on
 * every failed construction, so a worker that dies leaves only sandboxes that
 * expire within the TTL.
 *
 * Cell statuses (cq_interp_execute()):
 * - ok / error: the stream ended with end_of_execution; the last error line
 *   wins.
 * - timeout: the client deadline passed; the transfer is aborted, which makes
 *   the server interrupt the kernel (at its next write, within 5 s). A probe
 *   cell ("pass", which takes one execution count) then checks that the
 *   context answers; state_lost is false unless it did not and the context
 *   had to be restarted. (interp.h says a timeout restarts the kernel; E2B
 *   keeps the context, so this backend reports state_lost honestly.)
 * - error with ename KeyboardInterrupt: cq_interp_interrupt() aborted it.
 * - cancelled: the cancel flag was raised; the transfer is aborted (the
 *   server interrupts the kernel), state is kept.
 * - died: the sandbox was lost (proxy 502, connection reset and envd gone)
 *   or the stream broke its protocol (ended without end_of_execution, a
 *   malformed or over-long line). The backend has then either restarted the
 *   context (sandbox alive) or created a fresh sandbox and re-uploaded the
 *   job files; state_lost is true and an "error" output says what happened.
 *   Files the code had created in a lost sandbox are gone.
 * A cell that ipykernel refused before running any of it (ExecutionAborted
 * right after a failed cell) is sent again once.
 * cq_interp_execute() returns CQ_ERR_RETRIABLE when that recovery failed
 * too or /execute answered another 5xx, and CQ_ERR_FATAL for 401/403 (a
 * bad key fails at once) and 400/422.
 *
 * Files: cq_interp_put_file() uploads to /home/user/<name> at once (the
 * agent calls it before the first cell) and keeps a copy for a replacement
 * sandbox. cq_interp_created_files() lists /home/user recursively once,
 * when called, and reports files new or changed (size, mtime) since the
 * sandbox started, leaving out the job's input files, hidden paths,
 * __pycache__ and symlinks (envd lists a link with its target's type). */
#ifndef CODERQ_E2B_H
#define CODERQ_E2B_H

#include <jansson.h>
#include <stdbool.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/interp/interp.h"

typedef struct cq_e2b_opts {
        const char *api_key;     /* required; never logged */
        const char *domain;      /* NULL: "e2b.app" */
        const char *api_url;     /* NULL: https://api.{domain} */
        const char *sandbox_url; /* NULL: per-sandbox hosts (e2b.md §2) */
        const char *template_id; /* NULL: "code-interpreter-v1" */
        const char *create_path; /* NULL: "/v2/sandboxes" ("/sandboxes") */
        int ttl_s;               /* <= 0: 300 */
        size_t max_line;         /* longer lines are dropped; 0: cap + 64K */
        size_t max_output;       /* per-cell output cap; 0: 1 MiB */
        size_t max_body;         /* API/RPC reply cap; 0: 16 MiB */
        size_t max_file;         /* created_files() data cap; 0: 64 MiB */
        int max_attempts;        /* lifecycle call attempts; <= 0: 5 */
        int retry_base_ms;       /* first backoff; <= 0: 250 */
        int retry_max_ms;        /* backoff and Retry-After cap; <= 0: 10 s */
        int request_timeout_ms;  /* per lifecycle request; <= 0: 60 s */
        int probe_timeout_ms;    /* after a timeout; <= 0: 15 s */
        int max_timeout_s;       /* the plan's longest timeout; <= 0: 3600.
                                    ttl_s and extensions are capped here */
        /* Metadata tags of the sandbox (coderq_worker, coderq_job,
         * coderq_attempt, plus coderq_create, a nonce per create call), by
         * which lost sandboxes are found and killed. NULL: no such tag. */
        const char *worker_id;
        const char *job_id;
        int attempt;
        struct cq_e2b_fleet *fleet; /* borrowed, or NULL; see below */
} cq_e2b_opts_t;

/** @brief The E2B sandboxes of one worker process: housekeeping extends
 *         their lifetimes and kills the worker's strays. Thread-safe
 *         (@locks its own mutex). */
typedef struct cq_e2b_fleet cq_e2b_fleet_t;

/**
 * @brief Fill \p opts from \p cfg (E2B_API_KEY, E2B_DOMAIN, E2B_API_URL,
 *        E2B_SANDBOX_URL, CODERQ_E2B_TEMPLATE, CODERQ_E2B_TTL_S,
 *        CODERQ_E2B_MAX_TIMEOUT_S, CODERQ_E2B_CREATE_PATH,
 *        CODERQ_WORKER_ID); the rest get their defaults.
 * @remark The strings are borrowed from \p cfg; keep it alive as long as
 *         \p opts is used (cq_e2b_new() copies what it keeps).
 */
void cq_e2b_opts_from_config(cq_e2b_opts_t *opts, const cq_config_t *cfg);

/**
 * @brief Create a sandbox and return an interpreter over it.
 * @param opts Borrowed.
 * @returns Caller owns the returned value; free with cq_interp_destroy().
 *          NULL on failure with \p errstr filled ("could not create E2B
 *          sandbox: HTTP 401: ..."); no sandbox is left behind.
 * @remark cq_http_global_init() (or curl_global_init()) must have run.
 * @locality Any thread; the handle then belongs to that thread, except for
 *           cq_interp_interrupt() and cq_e2b_keepalive().
 */
cq_interp_t *
cq_e2b_new(const cq_e2b_opts_t *opts, char *errstr, size_t errstr_size);

/**
 * @brief cq_e2b_new() that says whether trying again later can help.
 * @param interpp (out) Caller owns the returned value on CQ_OK; NULL
 *        otherwise.
 * @returns CQ_OK; CQ_ERR_FATAL when retrying cannot help (no API key, the
 *          key refused with 401/403, another 4xx such as an unknown
 *          template); CQ_ERR_TOO_LARGE for an over-long reply;
 *          CQ_ERR_RETRIABLE for network errors, 429 and 5xx after the
 *          call's own retries, or out of memory. \p errstr says why.
 * @locality As cq_e2b_new().
 */
CQ_NODISCARD cq_err_t cq_e2b_create(const cq_e2b_opts_t *opts,
                                    cq_interp_t **interpp,
                                    char *errstr,
                                    size_t errstr_size);

/**
 * @brief Extend the sandbox's TTL now (POST /sandboxes/{id}/timeout), on a
 *        curl handle of its own.
 * @returns CQ_OK; CQ_ERR_FATAL for 401/403/404; else CQ_ERR_RETRIABLE.
 *          \p errstr (optional) says why.
 * @locality Any thread, concurrently with a running cell.
 */
CQ_NODISCARD cq_err_t cq_e2b_keepalive(cq_interp_t *interp,
                                       char *errstr,
                                       size_t errstr_size);

/**
 * @brief A fleet for sandboxes tagged with \p opts->worker_id (required);
 *        the API settings of \p opts are copied.
 * @returns Caller owns the returned value; free with
 *          cq_e2b_fleet_destroy() once every member is destroyed. NULL
 *          with \p errstr filled.
 * @locality Any thread.
 */
cq_e2b_fleet_t *
cq_e2b_fleet_new(const cq_e2b_opts_t *opts, char *errstr, size_t errstr_size);

/** @brief Accepts *fleetp == NULL. Members must be gone. */
void cq_e2b_fleet_destroy(cq_e2b_fleet_t **fleetp);

/**
 * @brief Extend the sandbox of every member (an interpreter made by
 *        cq_e2b_new() with this fleet in its options) once a third of its
 *        TTL has passed, or now with \p force; one attempt each, on a
 *        curl handle of its own. An LLM turn longer than the TTL then
 *        does not lose the sandbox.
 * @returns How many were extended, or -1 when out of memory.
 * @locality Any thread; members may run cells and be destroyed meanwhile
 *           (destroy waits for a keepalive in flight).
 */
int cq_e2b_fleet_keepalive(cq_e2b_fleet_t *fleet, bool force);

/**
 * @brief Kill the running or paused sandboxes tagged with the fleet's
 *        worker id that no member holds: left by a create whose reply was
 *        lost, or by an earlier process with the same worker id. While a
 *        member is creating, nothing is killed (its sandbox may be listed
 *        before its reply arrives).
 * @returns How many were killed, or -1 with \p errstr filled when the
 *          list failed.
 * @locality One thread at a time (the fleet's own API handle).
 */
int cq_e2b_fleet_reconcile(cq_e2b_fleet_t *fleet,
                           char *errstr,
                           size_t errstr_size);

/**
 * @brief Copy the current sandbox id (it changes when a lost sandbox is
 *        replaced) into \p out.
 * @locality Any thread.
 */
void cq_e2b_sandbox_id(cq_interp_t *interp, char *out, size_t out_size);

/**
 * @brief The base URL (no trailing slash) of a sandbox's \p port, as the
 *        SDKs build it: \p sandbox_url when set (routing is then by the
 *        E2b-Sandbox-Id/-Port headers, which the backend always sends);
 *        for envd (49983) on e2b.app, e2b.dev, e2b.pro or e2b-staging.dev
 *        the shared host https://sandbox.{domain}; else
 *        https://{port}-{sandbox_id}.{domain}. \p domain NULL: e2b.app.
 * @returns 0, or -1 when it does not fit in \p size.
 * @locality Any thread.
 */
int cq_e2b_data_url(const char *sandbox_url,
                    const char *domain,
                    const char *sandbox_id,
                    int port,
                    char *out,
                    size_t size);

/** @brief What one NDJSON line of /execute meant. */
typedef enum cq_e2b_line_kind {
        CQ_E2B_LINE_IGNORED = 0, /* keepalive or an unknown type */
        CQ_E2B_LINE_COUNT,       /* number_of_executions */
        CQ_E2B_LINE_OUTPUT,      /* stdout, stderr, result or error */
        CQ_E2B_LINE_END,         /* end_of_execution */
} cq_e2b_line_kind_t;

typedef struct cq_e2b_line {
        cq_e2b_line_kind_t kind;
        int execution_count; /* CQ_E2B_LINE_COUNT */
        json_t *output;      /* CQ_E2B_LINE_OUTPUT: an nbformat output
                                (interp.h); owned, json_decref() it */
} cq_e2b_line_t;

/**
 * @brief Parse one line of the /execute stream (without its '\n').
 * @param line Borrowed; need not be NUL-terminated; untrusted.
 * @returns CQ_OK with \p out filled, or CQ_ERR_FATAL with \p errstr saying
 *          what is wrong (invalid JSON, no "type", a field of the wrong
 *          type); \p out is then zeroed.
 * @remark An execute_result output has no execution_count; the caller adds
 *         the one from number_of_executions.
 * @locality Any thread.
 */
CQ_NODISCARD cq_err_t cq_e2b_parse_line(const char *line,
                                        size_t len,
                                        cq_e2b_line_t *out,
                                        char *errstr,
                                        size_t errstr_size);

#endif
