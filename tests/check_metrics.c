/* SPDX-License-Identifier: MIT */
/* check_metrics.c - the metrics registry and its text exposition: the
 * golden output of a registry with every kind of family, the escaping of
 * help text and label values, cumulative histogram buckets, the bound on
 * label combinations and the "other" series, refused definitions, NULL
 * registries, and exact totals under concurrent updates. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/common/metrics.h"

static char *render(cq_metrics_t *reg)
{
        cq_buf_t buf;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_metrics_render(reg, &buf), CQ_OK);
        return cq_buf_take(&buf, NULL);
}

static cq_metric_t *add(cq_metrics_t *reg, const cq_metric_def_t *def)
{
        char errstr[256] = "";
        cq_metric_t *m = cq_metrics_add(reg, def, errstr, sizeof(errstr));

        ck_assert_msg(m != NULL, "%s", errstr);
        return m;
}

static const double secs[] = {0.1, 1, 2.5};

START_TEST(metrics_golden_output)
{
        cq_metrics_t *reg = cq_metrics_new();
        cq_metric_def_t c = {CQ_METRIC_COUNTER,
                             "cq_jobs_total",
                             "Jobs done.",
                             {"status", "reason"},
                             NULL,
                             0,
                             0};
        cq_metric_def_t g = {
            CQ_METRIC_GAUGE, "cq_running", "Running now.", {NULL}, NULL, 0, 0};
        cq_metric_def_t h = {CQ_METRIC_HISTOGRAM,
                             "cq_latency_seconds",
                             "Call latency.",
                             {"model"},
                             secs,
                             CQ_ARRAY_SIZE(secs),
                             0};
        cq_metric_t *jobs, *running, *lat;
        char *text;

        ck_assert_ptr_nonnull(reg);
        jobs = add(reg, &c);
        running = add(reg, &g);
        lat = add(reg, &h);
        cq_series_add(cq_metric_series(jobs, (const char *[]){"failed", "llm"}),
                      2);
        cq_series_add(
            cq_metric_series(jobs, (const char *[]){"succeeded", "ok"}), 1);
        cq_series_add(cq_metric_series(jobs, (const char *[]){"failed", "llm"}),
                      1);
        cq_series_set(cq_metric_series(running, NULL), 3);
        cq_series_add(cq_metric_series(running, NULL), -1);
        /* 0.05 and 0.1 fall in le=0.1 (bounds are inclusive), 2 in 2.5,
         * 7 only in +Inf */
        cq_series_observe(cq_metric_series(lat, (const char *[]){"m"}), 0.05);
        cq_series_observe(cq_metric_series(lat, (const char *[]){"m"}), 0.1);
        cq_series_observe(cq_metric_series(lat, (const char *[]){"m"}), 2);
        cq_series_observe(cq_metric_series(lat, (const char *[]){"m"}), 7);
        text = render(reg);
        ck_assert_str_eq(text,
                         "# HELP cq_jobs_total Jobs done.\n"
                         "# TYPE cq_jobs_total counter\n"
                         "cq_jobs_total{status=\"failed\",reason=\"llm\"} 3\n"
                         "cq_jobs_total{status=\"succeeded\",reason=\"ok\"} 1\n"
                         "# HELP cq_running Running now.\n"
                         "# TYPE cq_running gauge\n"
                         "cq_running 2\n"
                         "# HELP cq_latency_seconds Call latency.\n"
                         "# TYPE cq_latency_seconds histogram\n"
                         "cq_latency_seconds_bucket{model=\"m\",le=\"0.1\"} 2\n"
                         "cq_latency_seconds_bucket{model=\"m\",le=\"1\"} 2\n"
                         "cq_latency_seconds_bucket{model=\"m\",le=\"2.5\"} 3\n"
                         "cq_latency_seconds_bucket{model=\"m\",le=\"+Inf\"} "
                         "4\n"
                         "cq_latency_seconds_sum{model=\"m\"} 9.15\n"
                         "cq_latency_seconds_count{model=\"m\"} 4\n");
        ck_assert_uint_eq(
            cq_series_count(cq_metric_series(lat, (const char *[]){"m"})), 4);
        free(text);
        cq_metrics_destroy(&reg);
        ck_assert_ptr_null(reg);
}
END_TEST

START_TEST(metrics_escaping)
{
        cq_metrics_t *reg = cq_metrics_new();
        cq_metric_def_t g = {CQ_METRIC_GAUGE,
                             "cq_g",
                             "back\\slash and \"quotes\"",
                             {"v"},
                             NULL,
                             0,
                             0};
        cq_metric_t *m = add(reg, &g);
        char *text;

        cq_series_set(cq_metric_series(m, (const char *[]){"a\"b\\c"}), 1);
        /* a newline is a control byte: folded, never written raw */
        cq_series_set(cq_metric_series(m, (const char *[]){"x\ny"}), 2);
        cq_series_set(cq_metric_series(m, (const char *[]){"模型-é"}), 0.5);
        cq_series_set(cq_metric_series(m, (const char *[]){"inf"}), INFINITY);
        cq_series_set(cq_metric_series(m, (const char *[]){"nan"}), NAN);
        text = render(reg);
        ck_assert_str_eq(text, "# HELP cq_g back\\\\slash and \"quotes\"\n"
                               "# TYPE cq_g gauge\n"
                               "cq_g{v=\"a\\\"b\\\\c\"} 1\n"
                               "cq_g{v=\"other\"} 2\n"
                               "cq_g{v=\"模型-é\"} 0.5\n"
                               "cq_g{v=\"inf\"} +Inf\n"
                               "cq_g{v=\"nan\"} NaN\n");
        free(text);
        cq_metrics_destroy(&reg);
}
END_TEST

START_TEST(metrics_label_bound)
{
        cq_metrics_t *reg = cq_metrics_new();
        cq_metric_def_t c = {CQ_METRIC_COUNTER,
                             "cq_calls_total",
                             "Calls.",
                             {"model"},
                             NULL,
                             0,
                             4};
        cq_metric_t *m = add(reg, &c);
        char name[32], long_value[CQ_METRICS_VALUE_MAX + 2];
        cq_series_t *first, *other;
        int i;

        first = cq_metric_series(m, (const char *[]){"m0"});
        for (i = 0; i < 10; i++) {
                snprintf(name, sizeof(name), "m%d", i);
                cq_series_add(cq_metric_series(m, (const char *[]){name}), 1);
        }
        /* three named series and "other", which took m3..m9 */
        other = cq_metric_series(m, (const char *[]){"m9"});
        ck_assert_ptr_eq(cq_metric_series(m, (const char *[]){"m0"}), first);
        ck_assert_ptr_eq(cq_metric_series(m, (const char *[]){"other"}), other);
        ck_assert(cq_series_value(first) == 1);
        ck_assert(cq_series_value(other) == 7);
        memset(long_value, 'x', sizeof(long_value) - 1);
        long_value[sizeof(long_value) - 1] = '\0';
        ck_assert_ptr_eq(cq_metric_series(m, (const char *[]){long_value}),
                         other);
        ck_assert_ptr_eq(cq_metric_series(m, (const char *[]){""}), other);
        ck_assert_ptr_eq(cq_metric_series(m, (const char *[]){NULL}), other);
        /* counters never go down */
        cq_series_add(first, -5);
        cq_series_add(first, NAN);
        ck_assert(cq_series_value(first) == 1);
        cq_metrics_destroy(&reg);
}
END_TEST

START_TEST(metrics_refused_definitions)
{
        cq_metrics_t *reg = cq_metrics_new();
        static const double bad_order[] = {1, 1};
        static const double inf[] = {INFINITY};
        const struct {
                cq_metric_def_t def;
                const char *why;
        } cases[] = {
            {{CQ_METRIC_COUNTER, "cq_x", "h", {NULL}, NULL, 0, 0},
             "must end in _total"},
            {{CQ_METRIC_GAUGE, "cq_x_total", "h", {NULL}, NULL, 0, 0},
             "only a counter"},
            {{CQ_METRIC_GAUGE, "9x", "h", {NULL}, NULL, 0, 0},
             "not a valid metric name"},
            {{CQ_METRIC_GAUGE, "cq-x", "h", {NULL}, NULL, 0, 0},
             "not a valid metric name"},
            {{CQ_METRIC_GAUGE, "cq_x", "two\nlines", {NULL}, NULL, 0, 0},
             "one line"},
            {{CQ_METRIC_GAUGE, "cq_x", "h", {"__x"}, NULL, 0, 0},
             "not a valid label name"},
            {{CQ_METRIC_GAUGE, "cq_x", "h", {"a:b"}, NULL, 0, 0},
             "not a valid label name"},
            {{CQ_METRIC_GAUGE, "cq_x", "h", {"a", "a"}, NULL, 0, 0},
             "repeated"},
            {{CQ_METRIC_HISTOGRAM, "cq_x", "h", {"le"}, secs, 3, 0}, "\"le\""},
            {{CQ_METRIC_HISTOGRAM, "cq_x", "h", {NULL}, bad_order, 2, 0},
             "increasing"},
            {{CQ_METRIC_HISTOGRAM, "cq_x", "h", {NULL}, inf, 1, 0},
             "increasing"},
            {{CQ_METRIC_HISTOGRAM, "cq_x", "h", {NULL}, NULL, 0, 0}, "bounds"},
            {{CQ_METRIC_GAUGE,
              "cq_x",
              "h",
              {"a"},
              NULL,
              0,
              CQ_METRICS_SERIES_MAX + 1},
             "too many"},
        };
        cq_metric_def_t ok = {CQ_METRIC_GAUGE, "cq_x", "h", {NULL}, NULL, 0, 0};
        char errstr[256];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                errstr[0] = '\0';
                ck_assert_ptr_null(
                    cq_metrics_add(reg, &cases[i].def, errstr, sizeof(errstr)));
                ck_assert_msg(strstr(errstr, cases[i].why), "case %zu: %s", i,
                              errstr);
        }
        ck_assert_ptr_nonnull(cq_metrics_add(reg, &ok, errstr, sizeof(errstr)));
        ck_assert_ptr_null(cq_metrics_add(reg, &ok, errstr, sizeof(errstr)));
        ck_assert_str_eq(errstr, "metric \"cq_x\": the name is already used");
        cq_metrics_destroy(&reg);
}
END_TEST

START_TEST(metrics_null_registry_is_a_no_op)
{
        cq_metric_def_t g = {CQ_METRIC_GAUGE, "cq_x", "h", {NULL}, NULL, 0, 0};
        cq_metric_t *m = cq_metrics_add(NULL, &g, NULL, 0);
        cq_buf_t buf;

        ck_assert_ptr_null(m);
        ck_assert_ptr_null(cq_metric_series(m, NULL));
        cq_series_add(NULL, 1);
        cq_series_set(NULL, 1);
        cq_series_observe(NULL, 1);
        ck_assert(cq_series_value(NULL) == 0);
        cq_buf_init(&buf, 16);
        ck_assert_int_eq(cq_metrics_render(NULL, &buf), CQ_OK);
        ck_assert_uint_eq(buf.len, 0);
}
END_TEST

START_TEST(metrics_render_cap_and_collect)
{
        cq_metrics_t *reg = cq_metrics_new();
        cq_metric_def_t g = {CQ_METRIC_GAUGE, "cq_x", "h", {NULL}, NULL, 0, 0};
        cq_metric_t *m = add(reg, &g);
        cq_buf_t buf;
        char *text;

        cq_buf_init(&buf, 10);
        ck_assert_int_eq(cq_metrics_render(reg, &buf), CQ_ERR_TOO_LARGE);
        cq_buf_release(&buf);
        cq_series_set(cq_metric_series(m, NULL), 42);
        text = render(reg);
        ck_assert_ptr_nonnull(strstr(text, "\ncq_x 42\n"));
        free(text);
        cq_metrics_destroy(&reg);
}
END_TEST

static void collect_set(void *opaque) { cq_series_set(opaque, 7); }

START_TEST(metrics_collect_runs_before_render)
{
        cq_metrics_t *reg = cq_metrics_new();
        cq_metric_def_t g = {CQ_METRIC_GAUGE, "cq_x", "h", {NULL}, NULL, 0, 0};
        cq_series_t *s = cq_metric_series(add(reg, &g), NULL);
        char *text;

        cq_metrics_on_collect(reg, collect_set, s);
        text = render(reg);
        ck_assert_ptr_nonnull(strstr(text, "\ncq_x 7\n"));
        free(text);
        cq_metrics_destroy(&reg);
}
END_TEST

#define THREADS 4
#define ROUNDS  20000

typedef struct race {
        cq_metric_t *calls, *lat;
        int index;
} race_t;

static void *race_main(void *arg)
{
        race_t *r = arg;
        char model[16];
        int i;

        for (i = 0; i < ROUNDS; i++) {
                snprintf(model, sizeof(model), "m%d", (i + r->index) % 3);
                cq_series_add(
                    cq_metric_series(r->calls, (const char *[]){model, "ok"}),
                    1);
                cq_series_observe(cq_metric_series(r->lat, NULL), 0.5);
        }
        return NULL;
}

START_TEST(metrics_concurrent_totals_are_exact)
{
        cq_metrics_t *reg = cq_metrics_new();
        cq_metric_def_t c = {CQ_METRIC_COUNTER,
                             "cq_calls_total",
                             "Calls.",
                             {"model", "outcome"},
                             NULL,
                             0,
                             0};
        cq_metric_def_t h = {CQ_METRIC_HISTOGRAM,
                             "cq_lat_seconds",
                             "Latency.",
                             {NULL},
                             secs,
                             CQ_ARRAY_SIZE(secs),
                             0};
        pthread_t thr[THREADS];
        race_t races[THREADS];
        double total = 0;
        int i;

        for (i = 0; i < THREADS; i++) {
                races[i].calls = i ? races[0].calls : add(reg, &c);
                races[i].lat = i ? races[0].lat : add(reg, &h);
                races[i].index = i;
        }
        for (i = 0; i < THREADS; i++)
                ck_assert_int_eq(
                    pthread_create(&thr[i], NULL, race_main, &races[i]), 0);
        for (i = 0; i < THREADS; i++)
                pthread_join(thr[i], NULL);
        for (i = 0; i < 3; i++) {
                char model[16];

                snprintf(model, sizeof(model), "m%d", i);
                total += cq_series_value(cq_metric_series(
                    races[0].calls, (const char *[]){model, "ok"}));
        }
        ck_assert(total == (double)THREADS * ROUNDS);
        ck_assert_uint_eq(cq_series_count(cq_metric_series(races[0].lat, NULL)),
                          THREADS * ROUNDS);
        ck_assert(cq_series_value(cq_metric_series(races[0].lat, NULL)) ==
                  0.5 * THREADS * ROUNDS);
        cq_metrics_destroy(&reg);
}
END_TEST

static Suite *metrics_suite(void)
{
        Suite *s = suite_create("metrics");
        TCase *tc = tcase_create("metrics");

        tcase_add_test(tc, metrics_golden_output);
        tcase_add_test(tc, metrics_escaping);
        tcase_add_test(tc, metrics_label_bound);
        tcase_add_test(tc, metrics_refused_definitions);
        tcase_add_test(tc, metrics_null_registry_is_a_no_op);
        tcase_add_test(tc, metrics_render_cap_and_collect);
        tcase_add_test(tc, metrics_collect_runs_before_render);
        tcase_add_test(tc, metrics_concurrent_totals_are_exact);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(metrics_suite)
