/* SPDX-License-Identifier: MIT */
/* metrics.c - the metrics registry and its text exposition. A value is a
 * double kept as its bit pattern in an atomic 64-bit word (added to with
 * compare-and-swap); a histogram keeps one atomic count per bucket, not
 * cumulative, so an observation touches one bucket and the sum, and the
 * render adds them up (its +Inf bucket and _count are the same total, as
 * Prometheus requires). A family's series sit in an array published by
 * an atomic count: readers scan it without a lock, the mutex only orders
 * the writers that append. */
#include "coderq/common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cq_series {
        char values[CQ_METRICS_LABELS_MAX][CQ_METRICS_VALUE_MAX + 1];
        _Atomic uint64_t bits;     /* the value, or a histogram's sum */
        _Atomic uint64_t *buckets; /* a histogram's nbounds + 1 counts */
        const cq_metric_t *m;
};

struct cq_metric {
        cq_metric_type_t type;
        char *name, *help;
        char *labels[CQ_METRICS_LABELS_MAX];
        size_t nlabels;
        double *bounds;
        size_t nbounds;
        size_t max_series;
        cq_series_t **series;  /* max_series slots */
        atomic_size_t nseries; /* published series */
        pthread_mutex_t lock;  /* orders appends to series */
        struct cq_metric *next;
};

struct cq_metrics {
        pthread_mutex_t lock; /* guards the family list and renders */
        cq_metric_t *first, *last;
        void (*collect)(void *opaque);
        void *collect_opaque;
};

static uint64_t to_bits(double v)
{
        uint64_t u;

        memcpy(&u, &v, sizeof(u));
        return u;
}

static double from_bits(uint64_t u)
{
        double v;

        memcpy(&v, &u, sizeof(v));
        return v;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
        uint64_t old = atomic_load_explicit(p, memory_order_relaxed);

        while (!atomic_compare_exchange_weak_explicit(
            p, &old, to_bits(from_bits(old) + v), memory_order_relaxed,
            memory_order_relaxed))
                ;
}

cq_metrics_t *cq_metrics_new(void)
{
        cq_metrics_t *reg = calloc(1, sizeof(*reg));

        if (!reg)
                return NULL;
        pthread_mutex_init(&reg->lock, NULL);
        return reg;
}

static void series_free(cq_series_t *s)
{
        if (!s)
                return;
        free(s->buckets);
        free(s);
}

static void metric_free(cq_metric_t *m)
{
        size_t i, n;

        if (!m)
                return;
        n = atomic_load(&m->nseries);
        for (i = 0; m->series && i < n; i++)
                series_free(m->series[i]);
        free(m->series);
        for (i = 0; i < m->nlabels; i++)
                free(m->labels[i]);
        free(m->bounds);
        free(m->name);
        free(m->help);
        pthread_mutex_destroy(&m->lock);
        free(m);
}

void cq_metrics_destroy(cq_metrics_t **regp)
{
        cq_metrics_t *reg = *regp;
        cq_metric_t *m, *next;

        if (!reg)
                return;
        *regp = NULL;
        for (m = reg->first; m; m = next) {
                next = m->next;
                metric_free(m);
        }
        pthread_mutex_destroy(&reg->lock);
        free(reg);
}

static bool name_ok(const char *s, bool colon)
{
        size_t i;

        if (!s || !*s)
                return false;
        for (i = 0; s[i]; i++) {
                char c = s[i];
                bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                             c == '_' || (colon && c == ':');

                if (!alpha && !(i > 0 && c >= '0' && c <= '9'))
                        return false;
        }
        return true;
}

static bool ends_with(const char *s, const char *tail)
{
        size_t n = strlen(s), k = strlen(tail);

        return n >= k && strcmp(s + n - k, tail) == 0;
}

/* Why \p def cannot be a family, or NULL. */
static const char *def_error(const cq_metric_def_t *def, size_t *nlabelsp)
{
        size_t i, j, n = 0;

        if (!name_ok(def->name, true))
                return "not a valid metric name";
        if (def->type == CQ_METRIC_COUNTER && !ends_with(def->name, "_total"))
                return "a counter's name must end in _total";
        if (def->type != CQ_METRIC_COUNTER && ends_with(def->name, "_total"))
                return "only a counter's name may end in _total";
        if (!def->help || strchr(def->help, '\n'))
                return "help must be one line";
        while (n < CQ_METRICS_LABELS_MAX && def->labels[n])
                n++;
        for (i = 0; i < n; i++) {
                if (!name_ok(def->labels[i], false) ||
                    strncmp(def->labels[i], "__", 2) == 0)
                        return "not a valid label name";
                if (def->type == CQ_METRIC_HISTOGRAM &&
                    strcmp(def->labels[i], "le") == 0)
                        return "a histogram may not have a label \"le\"";
                for (j = 0; j < i; j++)
                        if (strcmp(def->labels[i], def->labels[j]) == 0)
                                return "a label name is repeated";
        }
        if (def->max_series > CQ_METRICS_SERIES_MAX)
                return "too many label combinations";
        if (def->max_series == 1 && n > 0)
                return "a family with labels needs room for two series";
        if (def->type == CQ_METRIC_HISTOGRAM) {
                if (!def->bounds || def->nbounds < 1 ||
                    def->nbounds > CQ_METRICS_BUCKETS_MAX)
                        return "a histogram needs 1 to 24 bounds";
                for (i = 0; i < def->nbounds; i++)
                        if (!isfinite(def->bounds[i]) ||
                            (i > 0 && def->bounds[i] <= def->bounds[i - 1]))
                                return "bounds must be finite and increasing";
        }
        *nlabelsp = n;
        return NULL;
}

static cq_series_t *series_new(const cq_metric_t *m, const char *const *values)
{
        cq_series_t *s = calloc(1, sizeof(*s));
        size_t i;

        if (!s)
                return NULL;
        s->m = m;
        for (i = 0; i < m->nlabels; i++)
                snprintf(s->values[i], sizeof(s->values[i]), "%s", values[i]);
        if (m->type == CQ_METRIC_HISTOGRAM) {
                s->buckets = calloc(m->nbounds + 1, sizeof(*s->buckets));
                if (!s->buckets) {
                        free(s);
                        return NULL;
                }
        }
        atomic_init(&s->bits, to_bits(0.0));
        return s;
}

cq_metric_t *cq_metrics_add(cq_metrics_t *reg,
                            const cq_metric_def_t *def,
                            char *errstr,
                            size_t errstr_size)
{
        cq_metric_t *m = NULL, *o;
        const char *why;
        size_t n = 0, i;

        if (!reg)
                return NULL;
        why = def_error(def, &n);
        if (why) {
                cq_errstr_set(errstr, errstr_size, "metric \"%s\": %s",
                              def->name ? def->name : "", why);
                return NULL;
        }
        m = calloc(1, sizeof(*m));
        if (!m)
                goto oom;
        pthread_mutex_init(&m->lock, NULL);
        atomic_init(&m->nseries, 0);
        m->type = def->type;
        m->nlabels = n;
        m->max_series = def->max_series ? def->max_series : 32;
        if (n == 0)
                m->max_series = 1;
        m->name = strdup(def->name);
        m->help = strdup(def->help);
        m->series = calloc(m->max_series, sizeof(*m->series));
        if (!m->name || !m->help || !m->series)
                goto oom;
        for (i = 0; i < n; i++)
                if (!(m->labels[i] = strdup(def->labels[i])))
                        goto oom;
        if (def->type == CQ_METRIC_HISTOGRAM) {
                m->nbounds = def->nbounds;
                m->bounds = calloc(def->nbounds, sizeof(*m->bounds));
                if (!m->bounds)
                        goto oom;
                memcpy(m->bounds, def->bounds,
                       def->nbounds * sizeof(*m->bounds));
        }
        if (n == 0) {
                m->series[0] = series_new(m, NULL);
                if (!m->series[0])
                        goto oom;
                atomic_store(&m->nseries, 1);
        }
        pthread_mutex_lock(&reg->lock);
        for (o = reg->first; o; o = o->next)
                if (strcmp(o->name, m->name) == 0)
                        break;
        if (!o) {
                if (reg->last)
                        reg->last->next = m;
                else
                        reg->first = m;
                reg->last = m;
        }
        pthread_mutex_unlock(&reg->lock);
        if (o) {
                cq_errstr_set(errstr, errstr_size,
                              "metric \"%s\": the name is already used",
                              def->name);
                metric_free(m);
                return NULL;
        }
        return m;
oom:
        cq_errstr_set(errstr, errstr_size, "metric \"%s\": out of memory",
                      def->name);
        metric_free(m);
        return NULL;
}

static bool value_ok(const char *v)
{
        size_t i;

        if (!v || !*v)
                return false;
        for (i = 0; v[i]; i++)
                if (i >= CQ_METRICS_VALUE_MAX || (unsigned char)v[i] < 0x20 ||
                    v[i] == 0x7f)
                        return false;
        return true;
}

static cq_series_t *
find(cq_metric_t *m, const char *const *values, size_t from, size_t to)
{
        size_t i, j;

        for (i = from; i < to; i++) {
                cq_series_t *s = m->series[i];

                for (j = 0; j < m->nlabels; j++)
                        if (strcmp(s->values[j], values[j]) != 0)
                                break;
                if (j == m->nlabels)
                        return s;
        }
        return NULL;
}

cq_series_t *cq_metric_series(cq_metric_t *m, const char *const *values)
{
        const char *use[CQ_METRICS_LABELS_MAX];
        const char *const other[CQ_METRICS_LABELS_MAX] = {
            CQ_METRICS_OTHER, CQ_METRICS_OTHER, CQ_METRICS_OTHER};
        cq_series_t *s;
        size_t n, i, now;

        if (!m)
                return NULL;
        if (m->nlabels == 0)
                return m->series[0];
        for (i = 0; i < m->nlabels; i++)
                use[i] = value_ok(values[i]) ? values[i] : CQ_METRICS_OTHER;
        n = atomic_load_explicit(&m->nseries, memory_order_acquire);
        s = find(m, use, 0, n);
        if (s)
                return s;
        pthread_mutex_lock(&m->lock);
        now = atomic_load_explicit(&m->nseries, memory_order_relaxed);
        s = find(m, use, n, now);
        if (!s && now + 1 >= m->max_series) {
                /* the last slot is kept for the "other" combination */
                s = find(m, other, 0, now);
                if (!s && now < m->max_series) {
                        s = series_new(m, other);
                        if (s) {
                                m->series[now] = s;
                                atomic_store_explicit(&m->nseries, now + 1,
                                                      memory_order_release);
                        }
                }
        } else if (!s) {
                s = series_new(m, use);
                if (s) {
                        m->series[now] = s;
                        atomic_store_explicit(&m->nseries, now + 1,
                                              memory_order_release);
                }
        }
        pthread_mutex_unlock(&m->lock);
        return s;
}

void cq_series_add(cq_series_t *s, double v)
{
        if (!s || s->m->type == CQ_METRIC_HISTOGRAM || isnan(v))
                return;
        if (s->m->type == CQ_METRIC_COUNTER && !(v >= 0))
                return;
        atomic_add_double(&s->bits, v);
}

void cq_series_set(cq_series_t *s, double v)
{
        if (!s || s->m->type == CQ_METRIC_HISTOGRAM)
                return;
        atomic_store_explicit(&s->bits, to_bits(v), memory_order_relaxed);
}

void cq_metric_zero(cq_metric_t *m)
{
        size_t i, n;

        if (!m || m->type == CQ_METRIC_HISTOGRAM)
                return;
        n = atomic_load_explicit(&m->nseries, memory_order_acquire);
        for (i = 0; i < n; i++)
                cq_series_set(m->series[i], 0);
}

void cq_series_observe(cq_series_t *s, double v)
{
        size_t i = 0;

        if (!s || s->m->type != CQ_METRIC_HISTOGRAM || isnan(v))
                return;
        while (i < s->m->nbounds && v > s->m->bounds[i])
                i++;
        atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
        atomic_add_double(&s->bits, v);
}

double cq_series_value(cq_series_t *s)
{
        return s ? from_bits(
                       atomic_load_explicit(&s->bits, memory_order_relaxed))
                 : 0;
}

uint64_t cq_series_count(cq_series_t *s)
{
        uint64_t n = 0;
        size_t i;

        if (!s || !s->buckets)
                return 0;
        for (i = 0; i <= s->m->nbounds; i++)
                n += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        return n;
}

void cq_metrics_on_collect(cq_metrics_t *reg,
                           void (*fn)(void *opaque),
                           void *opaque)
{
        if (!reg)
                return;
        pthread_mutex_lock(&reg->lock);
        reg->collect = fn;
        reg->collect_opaque = opaque;
        pthread_mutex_unlock(&reg->lock);
}

/* HELP text escapes backslash and newline; a label value also the double
 * quote. */
static cq_err_t append_escaped(cq_buf_t *buf, const char *s, bool quote)
{
        cq_err_t err = CQ_OK;
        const char *run = s;

        for (; *s && err == CQ_OK; s++) {
                const char *rep = NULL;

                if (*s == '\\')
                        rep = "\\\\";
                else if (*s == '\n')
                        rep = "\\n";
                else if (quote && *s == '"')
                        rep = "\\\"";
                if (!rep)
                        continue;
                err = cq_buf_append(buf, run, (size_t)(s - run));
                if (err == CQ_OK)
                        err = cq_buf_append_str(buf, rep);
                run = s + 1;
        }
        if (err == CQ_OK)
                err = cq_buf_append_str(buf, run);
        return err;
}

/* The shortest of 15 to 17 significant digits that reads back as \p v:
 * "0.1", not "0.10000000000000001". */
static void format_double(char *out, size_t size, double v)
{
        int digits;

        for (digits = 15; digits < 17; digits++) {
                snprintf(out, size, "%.*g", digits, v);
                if (strtod(out, NULL) == v)
                        return;
        }
        snprintf(out, size, "%.17g", v);
}

/* A sample value: integers exactly, others as format_double(), and the
 * exposition's own spellings of infinities and NaN. */
static cq_err_t append_number(cq_buf_t *buf, double v)
{
        char text[40];

        if (isnan(v))
                return cq_buf_append_str(buf, "NaN");
        if (isinf(v))
                return cq_buf_append_str(buf, v > 0 ? "+Inf" : "-Inf");
        if (v > -9007199254740992.0 && v < 9007199254740992.0 &&
            v == (double)(long long)v)
                return cq_buf_printf(buf, "%lld", (long long)v);
        format_double(text, sizeof(text), v);
        return cq_buf_append_str(buf, text);
}

/* name{l1="v1",...[,le="b"]} */
static cq_err_t append_sample_name(cq_buf_t *buf,
                                   const cq_metric_t *m,
                                   const char *suffix,
                                   const cq_series_t *s,
                                   const char *le)
{
        cq_err_t err = cq_buf_printf(buf, "%s%s", m->name, suffix);
        size_t i;

        if (err != CQ_OK || (m->nlabels == 0 && !le))
                return err;
        err = cq_buf_append_str(buf, "{");
        for (i = 0; err == CQ_OK && i < m->nlabels; i++) {
                err = cq_buf_printf(buf, "%s%s=\"", i ? "," : "", m->labels[i]);
                if (err == CQ_OK)
                        err = append_escaped(buf, s->values[i], true);
                if (err == CQ_OK)
                        err = cq_buf_append_str(buf, "\"");
        }
        if (err == CQ_OK && le)
                err = cq_buf_printf(buf, "%sle=\"%s\"", m->nlabels ? "," : "",
                                    le);
        if (err == CQ_OK)
                err = cq_buf_append_str(buf, "}");
        return err;
}

static cq_err_t render_series(cq_buf_t *buf, cq_series_t *s)
{
        const cq_metric_t *m = s->m;
        uint64_t total = 0;
        cq_err_t err = CQ_OK;
        size_t i;

        if (m->type != CQ_METRIC_HISTOGRAM) {
                err = append_sample_name(buf, m, "", s, NULL);
                if (err == CQ_OK)
                        err = cq_buf_append_str(buf, " ");
                if (err == CQ_OK)
                        err = append_number(buf, cq_series_value(s));
                return err == CQ_OK ? cq_buf_append_str(buf, "\n") : err;
        }
        for (i = 0; err == CQ_OK && i <= m->nbounds; i++) {
                char le[48];

                total +=
                    atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
                if (i == m->nbounds)
                        snprintf(le, sizeof(le), "+Inf");
                else
                        format_double(le, sizeof(le), m->bounds[i]);
                err = append_sample_name(buf, m, "_bucket", s, le);
                if (err == CQ_OK)
                        err = cq_buf_printf(buf, " %llu\n",
                                            (unsigned long long)total);
        }
        if (err == CQ_OK)
                err = append_sample_name(buf, m, "_sum", s, NULL);
        if (err == CQ_OK)
                err = cq_buf_append_str(buf, " ");
        if (err == CQ_OK)
                err = append_number(buf, cq_series_value(s));
        if (err == CQ_OK)
                err = cq_buf_append_str(buf, "\n");
        if (err == CQ_OK)
                err = append_sample_name(buf, m, "_count", s, NULL);
        if (err == CQ_OK)
                err = cq_buf_printf(buf, " %llu\n", (unsigned long long)total);
        return err;
}

static const char *type_name(cq_metric_type_t type)
{
        switch (type) {
        case CQ_METRIC_COUNTER:
                return "counter";
        case CQ_METRIC_GAUGE:
                return "gauge";
        default:
                return "histogram";
        }
}

cq_err_t cq_metrics_render(cq_metrics_t *reg, cq_buf_t *buf)
{
        cq_metric_t *m;
        cq_err_t err = CQ_OK;

        if (!reg)
                return CQ_OK;
        pthread_mutex_lock(&reg->lock);
        if (reg->collect)
                reg->collect(reg->collect_opaque);
        for (m = reg->first; m && err == CQ_OK; m = m->next) {
                size_t n =
                    atomic_load_explicit(&m->nseries, memory_order_acquire);
                size_t i;

                err = cq_buf_printf(buf, "# HELP %s ", m->name);
                if (err == CQ_OK)
                        err = append_escaped(buf, m->help, false);
                if (err == CQ_OK)
                        err = cq_buf_printf(buf, "\n# TYPE %s %s\n", m->name,
                                            type_name(m->type));
                for (i = 0; err == CQ_OK && i < n; i++)
                        err = render_series(buf, m->series[i]);
        }
        pthread_mutex_unlock(&reg->lock);
        return err;
}
