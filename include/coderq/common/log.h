/* SPDX-License-Identifier: MIT */
/* log.h - structured logging: one JSON object per line on stderr with
 * "ts" (UTC, ISO 8601, milliseconds), "level", "msg" and any extra fields
 * (job_id, slot, ...). Each line is written with a single write(2), so lines
 * from different threads never interleave. */
#ifndef CODERQ_LOG_H
#define CODERQ_LOG_H

#include "coderq/common/common.h"

typedef enum cq_log_level {
        CQ_LOG_DEBUG = 0,
        CQ_LOG_INFO = 1,
        CQ_LOG_WARN = 2,
        CQ_LOG_ERROR = 3,
        CQ_LOG_OFF = 4, /* no line at all; never parsed, only set */
} cq_log_level_t;

/**
 * @brief Parse "debug", "info", "warn" (or "warning") or "error",
 *        case-insensitively.
 * @returns 0, or -1 when \p s names no level (\p levelp untouched).
 */
int cq_log_level_parse(const char *s, cq_log_level_t *levelp);

/** @brief The lower-case name of \p level. */
const char *cq_log_level_name(cq_log_level_t level);

/**
 * @brief Set the lowest level written; the default is CQ_LOG_INFO.
 * @locality Any thread; meant to be called once by main().
 */
void cq_log_set_level(cq_log_level_t level);
cq_log_level_t cq_log_get_level(void);

/**
 * @brief Send log lines to \p fd instead of stderr (2); tests use a pipe.
 * @locality Any thread; meant to be called before threads start.
 */
void cq_log_set_fd(int fd);

/**
 * @brief Write one line when \p level is enabled.
 * @param fields Borrowed; a JSON object whose members are added to the
 *               line (may be NULL). "ts", "level" and "msg" are reserved and
 *               win over members of the same name.
 * @locality Any thread.
 */
void cq_log_json(cq_log_level_t level, const void *fields, const char *fmt, ...)
    CQ_PRINTF(3, 4);

/**
 * @brief Write one line with string fields given as NULL-terminated
 *        key/value pairs after the message: cq_log_kv(CQ_LOG_INFO,
 *        "job claimed", "job_id", id, "slot", "3", NULL). A NULL value
 *        writes JSON null.
 * @locality Any thread.
 */
void cq_log_kv(cq_log_level_t level, const char *msg, ...);

#define cq_log_debug(...) cq_log_json(CQ_LOG_DEBUG, NULL, __VA_ARGS__)
#define cq_log_info(...)  cq_log_json(CQ_LOG_INFO, NULL, __VA_ARGS__)
#define cq_log_warn(...)  cq_log_json(CQ_LOG_WARN, NULL, __VA_ARGS__)
#define cq_log_error(...) cq_log_json(CQ_LOG_ERROR, NULL, __VA_ARGS__)

#endif
