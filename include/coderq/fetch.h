/* SPDX-License-Identifier: MIT */
/* fetch.h - download one http(s) URL into memory with a size cap and
 * timeouts; used for job input files given by URL. */
#ifndef CODERQ_FETCH_H
#define CODERQ_FETCH_H

#include "coderq/common.h"

/**
 * @brief GET \p url following at most 5 redirects (http and https only).
 * @param max Refuse a body larger than this many bytes.
 * @param datap (out) On CQ_OK the body; caller owns it (free()).
 * @returns CQ_OK; CQ_ERR_TOO_LARGE over \p max; CQ_ERR_RETRIABLE for
 *          network errors, timeouts, 429 and 5xx; CQ_ERR_FATAL for other
 *          statuses and bad URLs. \p errstr says which.
 * @locality Any thread (uses its own curl handle).
 */
CQ_NODISCARD cq_err_t cq_fetch_url(const char *url,
                                   size_t max,
                                   long timeout_s,
                                   unsigned char **datap,
                                   size_t *lenp,
                                   char *errstr,
                                   size_t errstr_size);

#endif
