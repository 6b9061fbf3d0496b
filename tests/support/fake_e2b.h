/* SPDX-License-Identifier: MIT */
/* fake_e2b.h - start and stop the E2B test double (tests/fakes/fake_e2b.py)
 * from a check runner, point an E2B backend at it, and talk to its
 * /_fake control endpoints. Any suite can run its interpreter scenarios on
 * E2B this way:
 *
 *     cq_fake_e2b_t fake;
 *     cq_fake_e2b_start(&fake);               (once, e.g. in a fixture)
 *     interp = cq_fake_e2b_interp(&fake, errstr, sizeof(errstr));
 *     ...
 *     cq_fake_e2b_stop(&fake);                (kills every kernel) */
#ifndef CODERQ_TESTS_FAKE_E2B_H
#define CODERQ_TESTS_FAKE_E2B_H

#include <jansson.h>
#include <sys/types.h>

#include "coderq/e2b/e2b.h"

typedef struct cq_fake_e2b {
        pid_t pid; /* 0 when not running */
        int out_fd;
        int api_port, sandbox_port;
        char api_url[64];
        char sandbox_url[64];
        char api_key[64];
} cq_fake_e2b_t;

/**
 * @brief Start the double on ephemeral loopback ports and wait until it
 *        listens. Its stderr is the runner's.
 * @param keepalive_s Seconds of silence between keepalive lines (the real
 *                    server uses 5); <= 0 for 5.
 * @returns 0, or -1 with a message on stderr.
 */
int cq_fake_e2b_start(cq_fake_e2b_t *fake, double keepalive_s);

/** @brief SIGTERM the double and wait for it (it kills its kernels). */
void cq_fake_e2b_stop(cq_fake_e2b_t *fake);

/**
 * @brief Options that point an E2B backend at the double, with short
 *        retries and a 60 s TTL. The strings are borrowed from \p fake.
 */
void cq_fake_e2b_opts(const cq_fake_e2b_t *fake, cq_e2b_opts_t *opts);

/** @brief cq_e2b_new() with cq_fake_e2b_opts(). */
cq_interp_t *
cq_fake_e2b_interp(const cq_fake_e2b_t *fake, char *errstr, size_t size);

/* Requests to the API listener carry the double's API key, so the real
 * control-plane paths ("/sandboxes/<id>/timeout") work too. */

/**
 * @brief GET \p path on the API listener ("/_fake/stats").
 * @returns Caller owns the returned value; NULL on any failure.
 */
json_t *cq_fake_e2b_get(const cq_fake_e2b_t *fake, const char *path);

/**
 * @brief POST \p body (JSON text, may be NULL) to \p path on the API
 *        listener ("/_fake/faults").
 * @returns The HTTP status, or -1.
 */
long cq_fake_e2b_post(const cq_fake_e2b_t *fake,
                      const char *path,
                      const char *body);

/** @brief One counter of GET /_fake/stats ("live", "set_timeout"), or
 *         -1. */
long cq_fake_e2b_stat(const cq_fake_e2b_t *fake, const char *name);

#endif
