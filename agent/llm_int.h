/* SPDX-License-Identifier: MIT */
/* llm_int.h - what llm.c (the transport) shares with the wire formats
 * (llm_openai.c, llm_anthropic.c) and the rate limiter (llm_limit.c).
 * Not installed; not part of the public API. */
#ifndef CODERQ_LLM_INT_H
#define CODERQ_LLM_INT_H

#include <jansson.h>

#include "coderq/agent/llm.h"

/** @brief The part of the configuration a wire format needs. */
typedef struct llm_req {
        const char *model;
        long max_tokens;    /* <= 0: not sent (the Messages API requires it,
                               so llm_anthropic.c sends a default) */
        double temperature; /* < 0: not sent */
        double top_p;       /* < 0: not sent */
        bool has_seed;      /* seed sent (Chat Completions only) */
        long long seed;
} llm_req_t;

/** @brief One wire format: how the common history becomes a request body
 *         and how a reply body becomes a cq_llm_reply_t. */
typedef struct llm_provider {
        cq_llm_provider_t id;
        const char *name;
        const char *default_base; /* when conf.base_url is NULL */
        /* The path appended to a base URL (without a trailing slash). */
        const char *(*path)(const char *base, size_t base_len);
        /* The same for the list of models (cq_llm_list_models()). */
        const char *(*models_path)(const char *base, size_t base_len);
        /* Caller owns the returned value (free()); NULL when out of
         * memory. The history is never modified. */
        char *(*build_body)(const llm_req_t *req,
                            const json_t *messages,
                            size_t *lenp);
        /* As cq_llm_parse_reply(). */
        int (*parse_reply)(const char *body,
                           size_t len,
                           cq_llm_reply_t *reply,
                           char *errstr,
                           size_t errstr_size);
} llm_provider_t;

extern const llm_provider_t cq_llm_provider_openai;
extern const llm_provider_t cq_llm_provider_anthropic;

/** @brief The tool's description, shared by both formats. */
extern const char cq_llm_tool_description[];

/** @brief Longest piece of a provider's error message kept. */
#define LLM_PROVIDER_MSG_MAX 400

char *llm_dup_printf(const char *fmt, ...) CQ_PRINTF(1, 2);

/* Fill call->code or call->error from call->name and call->arguments.
 * Returns -1 only when out of memory. */
int llm_parse_code(cq_llm_tool_call_t *call);

/* Replace the string at \p obj's \p key, when it holds U+0000 (which a
 * reply's JSON may carry and C strings cannot), by a copy with U+FFFD in
 * its place: the reply's text is then whole as a C string. 0, or -1 when
 * out of memory. */
int llm_unnul(json_t *obj, const char *key);

/* A non-negative count from usage.<key>, else 0. */
int64_t llm_usage_value(const json_t *usage, const char *key);

/* A provider's own words about a failure: error.message, error (a string),
 * message or detail; NULL when the body holds none of them. Borrowed from
 * \p root. */
const char *llm_provider_message(const json_t *root);

/* Map a provider's stop reason to the common one. */
cq_llm_stop_t llm_stop_from(const char *reason);

/* --- the shared rate limiter (llm_limit.c) -------------------------- */

/* How an attempt ended, for the limiter. */
enum llm_outcome {
        LLM_OUTCOME_OK,      /* a 2xx */
        LLM_OUTCOME_LIMITED, /* 429 or 529: cut the rate */
        LLM_OUTCOME_NEUTRAL, /* anything else: no signal */
};

/* Wait for a request slot of \p key. Returns 0 when the request may go,
 * 1 when waiting would pass \p deadline_ms (the wait it needed in
 * *needp), -1 when \p cancel rose. */
int llm_limiter_acquire(cq_llm_limiter_t *lim,
                        const char *key,
                        int64_t deadline_ms,
                        const atomic_int *cancel,
                        int64_t *needp);

/* Report the outcome of a request that llm_limiter_acquire() let go at
 * \p sent_ms (cq_now_ms()). */
void llm_limiter_report(cq_llm_limiter_t *lim,
                        const char *key,
                        int64_t sent_ms,
                        enum llm_outcome outcome,
                        int64_t retry_after_ms);

#endif
