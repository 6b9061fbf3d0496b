/* SPDX-License-Identifier: MIT */
/* metrics.h - a registry of counters, gauges and histograms and their
 * Prometheus text exposition (format 0.0.4). Updating a value is a few
 * atomic operations and never takes a lock; finding a label combination
 * the first time takes the family's mutex once. Every family holds a
 * bounded number of label combinations: past the bound, and for a label
 * value that is empty, too long or holds a control byte, the update goes
 * to the combination whose every value is "other".
 *
 * Every function accepts NULL for the registry, the family and the
 * series and then does nothing, so code whose caller passed no registry
 * updates nothing without testing for it. */
#ifndef CODERQ_METRICS_H
#define CODERQ_METRICS_H

#include "coderq/common/buf.h"
#include "coderq/common/common.h"

typedef struct cq_metrics cq_metrics_t;
typedef struct cq_metric cq_metric_t; /* a family: one name, its labels */
typedef struct cq_series cq_series_t; /* one label combination */

typedef enum cq_metric_type {
        CQ_METRIC_COUNTER,
        CQ_METRIC_GAUGE,
        CQ_METRIC_HISTOGRAM
} cq_metric_type_t;

#define CQ_METRICS_LABELS_MAX  3   /* label names per family */
#define CQ_METRICS_BUCKETS_MAX 24  /* histogram bounds, +Inf not counted */
#define CQ_METRICS_VALUE_MAX   64  /* bytes of a label value, NUL excluded */
#define CQ_METRICS_SERIES_MAX  256 /* label combinations per family */
#define CQ_METRICS_OTHER       "other"

/** @brief What a family is. Strings are borrowed and copied. */
typedef struct cq_metric_def {
        cq_metric_type_t type;
        const char *name; /* [a-zA-Z_:][a-zA-Z0-9_:]*; a counter's ends
                             in "_total" */
        const char *help; /* one line of text */
        const char *labels[CQ_METRICS_LABELS_MAX]; /* names; the first
                             NULL ends them; never "le" */
        const double *bounds; /* a histogram's upper bounds, finite and
                                 increasing; +Inf is added */
        size_t nbounds;       /* 1..CQ_METRICS_BUCKETS_MAX */
        size_t max_series;    /* label combinations, "other" included;
                                 0: 32; at most CQ_METRICS_SERIES_MAX */
} cq_metric_def_t;

/**
 * @brief An empty registry.
 * @returns Caller owns the returned value; free with cq_metrics_destroy()
 *          once no thread updates it. NULL when out of memory.
 * @locality Any thread.
 */
cq_metrics_t *cq_metrics_new(void);

/** @brief Free it and its families; accepts *regp == NULL and sets it to
 *         NULL. */
void cq_metrics_destroy(cq_metrics_t **regp);

/**
 * @brief Add a family. A family without labels has its one series (at 0)
 *        from the start.
 * @returns The family, borrowed; valid until the registry is destroyed.
 *          NULL with \p errstr filled for a bad definition ("metric
 *          \"x\": ..."), a name already used, or out of memory; NULL
 *          without an error when \p reg is NULL.
 * @locality Any thread; meant for start-up.
 */
cq_metric_t *cq_metrics_add(cq_metrics_t *reg,
                            const cq_metric_def_t *def,
                            char *errstr,
                            size_t errstr_size);

/**
 * @brief The series of one label combination, created on first use.
 * @param values One value per label of the family, in order; borrowed.
 *        NULL for a family without labels.
 * @returns The series, borrowed; valid until the registry is destroyed.
 *          Keep it to update without looking up again. NULL only when
 *          \p m is NULL or out of memory.
 * @locality Any thread; lock-free when the combination exists.
 */
cq_series_t *cq_metric_series(cq_metric_t *m, const char *const *values);

/** @brief Add \p v (>= 0 for a counter; a negative one is ignored) to a
 *         counter or a gauge. @locality Any thread. */
void cq_series_add(cq_series_t *s, double v);

/** @brief Set a gauge, or a counter that mirrors a monotonic count kept
 *         elsewhere. @locality Any thread. */
void cq_series_set(cq_series_t *s, double v);

/** @brief Set every series of a counter or gauge family to 0, for one
 *         that mirrors a set of things that may shrink (the partitions
 *         assigned now). @locality Any thread. */
void cq_metric_zero(cq_metric_t *m);

/** @brief Record one observation in a histogram. @locality Any thread. */
void cq_series_observe(cq_series_t *s, double v);

/** @brief The value of a counter or a gauge (a histogram's sum).
 *  @locality Any thread. */
double cq_series_value(cq_series_t *s);

/** @brief A histogram's observations so far. @locality Any thread. */
uint64_t cq_series_count(cq_series_t *s);

/**
 * @brief Have \p fn called at the start of each cq_metrics_render(), to
 *        set the gauges and counters that mirror state kept elsewhere.
 *        One per registry; a second call replaces the first.
 * @locality Start-up, before any render.
 */
void cq_metrics_on_collect(cq_metrics_t *reg,
                           void (*fn)(void *opaque),
                           void *opaque);

/**
 * @brief Append every family in the text exposition format 0.0.4, in the
 *        order added, series in the order created.
 * @returns CQ_OK; CQ_ERR_TOO_LARGE past \p buf's cap; CQ_ERR_FATAL when
 *          out of memory. On error \p buf may hold part of the text.
 * @locality Any thread; renders are serialised.
 */
CQ_NODISCARD cq_err_t cq_metrics_render(cq_metrics_t *reg, cq_buf_t *buf);

/** The Content-Type of what cq_metrics_render() writes. */
#define CQ_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
