/* SPDX-License-Identifier: MIT */
/* benchstat.h - what every benchmark program counts with: a monotonic
 * clock in milliseconds and the median of a sample. Built into each
 * bench/bench_*.c program (bench/CMakeLists.txt). */
#ifndef CODERQ_BENCHSTAT_H
#define CODERQ_BENCHSTAT_H

#include <stddef.h>

/** @brief CLOCK_MONOTONIC in milliseconds. */
double cq_bench_now_ms(void);

/** @brief qsort()'s comparison of two doubles, ascending. */
int cq_bench_cmp_double(const void *a, const void *b);

/** @brief The median of \p v (\p n > 0 values), which it sorts. */
double cq_bench_median(double *v, size_t n);

#endif
