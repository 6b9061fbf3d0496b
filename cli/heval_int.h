/* SPDX-License-Identifier: MIT */
/* heval_int.h - what heval.c and heval_py.c share. */
#ifndef CODERQ_HEVAL_INT_H
#define CODERQ_HEVAL_INT_H

#include <stddef.h>

/* numpy.mean() of \p n doubles: their pairwise sum as numpy adds them,
 * divided by n; NaN when n is 0. */
double heval_numpy_mean(const double *a, size_t n);

#endif
