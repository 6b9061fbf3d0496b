/* SPDX-License-Identifier: MIT */
/* llm.h - an LLM client offering the single execute_code tool, speaking
 * two wire formats: OpenAI-compatible Chat Completions (OpenAI, DeepSeek,
 * vLLM, Ollama, llama.cpp servers) and the Anthropic Messages API.
 *
 * The history is always Chat Completions messages (that is what jobs
 * checkpoint); the Anthropic format converts it at request time and turns
 * its reply back into a Chat Completions assistant message.
 *
 * One handle per thread: it owns one HTTP client (coderq/http/http.h),
 * so one curl easy handle. The caller keeps the conversation;
 * cq_llm_chat() sends it verbatim and returns the assistant message
 * verbatim, so it can be appended to the history unchanged (with its
 * tool_calls and a provider's reasoning_content).
 *
 * Errors: 429, 529 (Anthropic's "overloaded"), 5xx, 408 and network errors or
 * timeouts are retried with exponential backoff and full jitter (Retry-After
 * honoured), bounded in attempts and in total wait; a reply that is not valid
 * JSON or has no choices[0].message is retried the same way. Other 4xx fail at
 * once with the provider's message. A reply larger than the cap fails at once.
 * The API key never appears in an error message or a log line.
 *
 * cq_http_global_init() must have run (main() does it; tests call it or
 * curl_global_init()). */
#ifndef CODERQ_LLM_H
#define CODERQ_LLM_H

#include <jansson.h>
#include <stdatomic.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"

/** @brief The only tool offered to the model. */
#define CQ_LLM_TOOL_NAME "execute_code"

/**
 * @brief The exact text a tool result shows in place of an image, as a
 *        printf format taking the file name, the mime type and the size in
 *        bytes (%zu). The tool description quotes the same wording; use
 *        cq_llm_image_placeholder() to format it.
 */
#define CQ_LLM_IMAGE_PLACEHOLDER_FMT "[image %s: %s, %zu bytes, not shown]"

/** @brief The wire format of a provider. */
typedef enum cq_llm_provider {
        CQ_LLM_OPENAI,    /* "openai": Chat Completions */
        CQ_LLM_ANTHROPIC, /* "anthropic": Messages API */
        CQ_LLM_NONE,      /* "none": no LLM; every call fails at once (a
                             worker that only judges jobs' solutions) */
} cq_llm_provider_t;

/** @brief Why a job that needs the model cannot run with CQ_LLM_NONE. */
#define CQ_LLM_NONE_REASON                                                     \
        "CODERQ_LLM_PROVIDER is none: no LLM is called here, so only a job "   \
        "with a \"solution\" can run"

/**
 * @brief Parse a provider name ("openai", "anthropic" or "none").
 * @returns 0, or -1 when \p name is none of them.
 * @locality Any thread.
 */
CQ_NODISCARD int cq_llm_provider_parse(const char *name,
                                       cq_llm_provider_t *providerp);

/** @brief "openai", "anthropic" or "none". */
const char *cq_llm_provider_name(cq_llm_provider_t provider);

/** @brief Why the model stopped, across providers. */
typedef enum cq_llm_stop {
        CQ_LLM_STOP_NONE,       /* the server sent no reason */
        CQ_LLM_STOP_END,        /* "stop", "end_turn", "stop_sequence" */
        CQ_LLM_STOP_TOOL_USE,   /* "tool_calls", "tool_use" */
        CQ_LLM_STOP_MAX_TOKENS, /* "length", "max_tokens" */
        CQ_LLM_STOP_REFUSAL,    /* "refusal", "content_filter" */
        CQ_LLM_STOP_OTHER,      /* anything else ("pause_turn", ...) */
} cq_llm_stop_t;

/**
 * @brief The rate limiter every slot of a worker shares: one adaptive
 *        request rate per provider and model. Thread-safe (one mutex).
 *
 * Until the first 429 or 529 of a model, requests pass at once (or at
 * most \p rate_max per second when that is set). A 429 or 529 cuts the
 * model's rate to 0.95 times what the server let through in the last
 * second (at most one cut per round trip: replies to requests sent before
 * the last cut do not cut again) and, with a Retry-After, holds every
 * slot of that model until then. Each success then raises the rate by
 * 2% per second of successes (by one request per second per success
 * while probing up from the floor of 1/s after a cut that had no
 * successes to measure), never above \p rate_max.
 */
typedef struct cq_llm_limiter cq_llm_limiter_t;

/**
 * @brief Create a limiter.
 * @param rate_max Requests per second per model, the ceiling; <= 0: none.
 * @returns Caller owns the returned value; free with
 *          cq_llm_limiter_destroy() after every client using it. NULL
 *          when out of memory.
 * @locality Any thread.
 */
cq_llm_limiter_t *cq_llm_limiter_new(double rate_max);

/** @brief Free it; accepts *limp == NULL and sets it to NULL. */
void cq_llm_limiter_destroy(cq_llm_limiter_t **limp);

/** @brief Counters since creation; pointers may be NULL.
 *  @locality Any thread. */
void cq_llm_limiter_stats(cq_llm_limiter_t *lim,
                          int64_t *cutsp,
                          int64_t *waited_msp);

/** @brief The current rate of \p key ("provider:model"), 0 when
 *         unlimited. @locality Any thread. */
double cq_llm_limiter_rate(cq_llm_limiter_t *lim, const char *key);

/** @brief How to reach the model. Strings are borrowed by cq_llm_new(),
 *         which copies them. */
typedef struct cq_llm_conf {
        cq_llm_provider_t provider;    /* default CQ_LLM_OPENAI; CQ_LLM_NONE:
                                          every call fails at once */
        const char *base_url;          /* NULL: the provider's default,
                                          https://api.openai.com/v1 (requests go to
                                          {base}/chat/completions) or
                                          https://api.anthropic.com (requests go to
                                          {base}/v1/messages, or {base}/messages
                                          when the base ends in /v1) */
        const char *api_key;           /* NULL or "": no Authorization header */
        const char *anthropic_api_key; /* for anthropic, wins over api_key;
                                          NULL or "": api_key */
        cq_llm_limiter_t *limiter;     /* borrowed, shared; NULL: none */
        const char *model;             /* required */
        long max_tokens;               /* <= 0: not sent */
        double temperature;     /* < 0: not sent (the server's default) */
        long connect_timeout_s; /* <= 0: 10 */
        long timeout_s;         /* per attempt, whole transfer; <= 0: 300 */
        long max_attempts;      /* attempts per call, >= 1; <= 0: 5 */
        long max_wait_s;        /* total backoff sleep per call; < 0: 120 */
        size_t response_max;    /* reply body cap in bytes; 0: 8 MiB */
        long backoff_base_ms;   /* first backoff ceiling; <= 0: 500 */
        long backoff_max_ms;    /* backoff ceiling cap; <= 0: 30000 */
} cq_llm_conf_t;

/** @brief Defaults for every field (model and key unset). */
void cq_llm_conf_init(cq_llm_conf_t *conf);

/**
 * @brief Whether \p conf's provider has the API key it needs: openai
 *        api_key, anthropic anthropic_api_key or api_key; none needs
 *        none. A server at a local base URL (a loopback or other
 *        non-public address, localhost, a *.localhost or *.local name, or
 *        a name without a dot, as a container's or a service's) is often
 *        self-hosted and asks for none.
 * @param errstr (out) With 1, the warning to give; with -1, the error,
 *        naming the variables that hold the key.
 * @returns 0 the key is there or none is needed; 1 there is none but the
 *          base URL is local; -1 there is none.
 * @locality Any thread.
 */
int cq_llm_conf_check_key(const cq_llm_conf_t *conf,
                          char *errstr,
                          size_t errstr_size);

/**
 * @brief Whether the host of \p url is local, as cq_llm_conf_check_key()
 *        reads it; no name is resolved.
 * @locality Any thread.
 */
bool cq_llm_url_is_local(const char *url);

/**
 * @brief Fill \p conf from the CODERQ_LLM_* settings.
 * @param cfg Borrowed; its strings must outlive \p conf's use.
 */
void cq_llm_conf_from_config(cq_llm_conf_t *conf, const cq_config_t *cfg);

/** @brief One tool call of a reply. All strings owned by the reply. */
typedef struct cq_llm_tool_call {
        char *id;        /* never NULL */
        char *name;      /* never NULL */
        char *arguments; /* the arguments as the model sent them (an object
                            is serialised); NULL when absent */
        char *code;      /* the parsed "code" argument, or NULL ... */
        char *error;     /* ... and then why: "arguments are not valid
                            JSON: ...", "unknown tool \"x\"", ... */
} cq_llm_tool_call_t;

/** @brief One assistant reply. Init with cq_llm_reply_init(), release with
 *         cq_llm_reply_release(). Read-only for the caller. */
typedef struct cq_llm_reply {
        json_t *message;       /* choices[0].message exactly as received; owned.
                                  json_incref() it to keep it in a history */
        const char *content;   /* borrowed from message: text content, NULL
                                  when null or absent */
        const char *reasoning; /* borrowed: reasoning_content (or
                                  "reasoning"), NULL when absent */
        cq_llm_tool_call_t *calls; /* in the order the model sent them */
        size_t ncalls;
        char *finish_reason;   /* the provider's own words: "stop",
                                  "tool_calls", "end_turn", "tool_use", ...;
                                  NULL when the server sent none */
        cq_llm_stop_t stop;    /* finish_reason mapped */
        bool has_usage;        /* the server reported usage */
        int64_t prompt_tokens; /* all input tokens, cached ones included */
        int64_t completion_tokens;
        int64_t cache_read_tokens;     /* input tokens read from a cache */
        int64_t cache_creation_tokens; /* input tokens written to one */
        int attempts; /* HTTP requests this call made, retries included */
} cq_llm_reply_t;

void cq_llm_reply_init(cq_llm_reply_t *reply);
void cq_llm_reply_release(cq_llm_reply_t *reply);

typedef struct cq_llm cq_llm_t;

/**
 * @brief Create a client.
 * @param conf Borrowed; copied.
 * @returns Caller owns the returned value; free with cq_llm_destroy().
 *          NULL on failure with \p errstr filled (NULL allowed).
 * @locality Any thread; the handle then belongs to one thread at a time.
 */
cq_llm_t *
cq_llm_new(const cq_llm_conf_t *conf, char *errstr, size_t errstr_size);

/** @brief Free the handle; accepts *llmp == NULL and sets it to NULL. */
void cq_llm_destroy(cq_llm_t **llmp);

/**
 * @brief Use \p model instead of the configured one (a job's override);
 *        NULL restores the configured model.
 * @param model Borrowed; copied.
 * @returns 0, or -1 when out of memory (the model is then unchanged).
 */
CQ_NODISCARD int cq_llm_set_model(cq_llm_t *llm, const char *model);

/**
 * @brief Use provider \p name ("openai", "anthropic") instead of the
 *        configured one (a job's override); NULL restores it. A client
 *        configured with none stays none whatever \p name is: it has no
 *        LLM to switch to.
 * @returns 0, or -1 when \p name is unknown or "none" (the provider is
 *          unchanged).
 */
CQ_NODISCARD int cq_llm_set_provider(cq_llm_t *llm, const char *name);

/**
 * @brief Sampling parameters of the calls that follow (a job's), replacing
 *        the configured temperature: \p temperature and \p top_p < 0 are
 *        not sent; \p seed NULL is not sent. cq_llm_reset_sampling()
 *        restores the configuration.
 * @param seed Borrowed; copied.
 * @returns 0, or -1 when the current provider cannot send one of them
 *          (the Messages API has no seed): nothing changed.
 * @locality The thread that owns \p llm.
 */
CQ_NODISCARD int cq_llm_set_sampling(cq_llm_t *llm,
                                     double temperature,
                                     double top_p,
                                     const long long *seed);

/** @brief Back to the configured sampling parameters. */
void cq_llm_reset_sampling(cq_llm_t *llm);

/**
 * @brief What the requests send now, as {"temperature", "top_p", "seed",
 *        "max_tokens"} (null for one not sent), for a job's record.
 * @returns A new reference (json_decref()); NULL when out of memory.
 */
json_t *cq_llm_sampling_json(const cq_llm_t *llm);

/** @brief The max_tokens of each reply (the most a reply may hold, also
 *         for the Messages API's default); <= 0 when none is sent. */
long cq_llm_max_tokens(const cq_llm_t *llm);

/** @brief The provider requests go to now. */
cq_llm_provider_t cq_llm_provider(const cq_llm_t *llm);

/** @brief The model requests name now; borrowed, valid until the next
 *         cq_llm_set_model(). */
const char *cq_llm_model(const cq_llm_t *llm);

/**
 * @brief While \p cancel is non-NULL and raised (non-zero), a request in
 *        flight is aborted within about 100 ms and backoff sleeps end, so
 *        cq_llm_chat() returns CQ_ERR_RETRIABLE ("request cancelled").
 * @param cancel Borrowed; must outlive its use by \p llm. NULL disables.
 */
void cq_llm_set_cancel(cq_llm_t *llm, const atomic_int *cancel);

/**
 * @brief Past \p deadline_ms (cq_now_ms()'s clock), as when the cancel
 *        flag rises: a request in flight is aborted within about 100 ms,
 *        backoff and rate-limit waits end by it, and cq_llm_chat() returns
 *        CQ_ERR_RETRIABLE ("the caller's deadline passed"). 0: none.
 */
void cq_llm_set_deadline(cq_llm_t *llm, int64_t deadline_ms);

/**
 * @brief Ask the model for the next assistant message.
 * @param messages Borrowed; a JSON array of Chat Completions messages, sent
 *                 verbatim.
 * @param reply    (out) Initialised by the caller; filled on CQ_OK,
 *                 released and re-initialised otherwise (attempts is set
 *                 either way).
 * @returns CQ_OK; CQ_ERR_RETRIABLE when every attempt met a transient
 *          error (429, 5xx, network, timeout) or the call was cancelled;
 *          CQ_ERR_FATAL for a 4xx other than 429/408, a reply that stayed
 *          invalid after every attempt, or bad arguments;
 *          CQ_ERR_TOO_LARGE when the reply exceeded response_max (never
 *          retried: treat it as fatal). See cq_llm_errmsg().
 * @remark Usage of a successful call is added to the handle's totals.
 * @locality The thread that owns \p llm.
 */
CQ_NODISCARD cq_err_t cq_llm_chat(cq_llm_t *llm,
                                  const json_t *messages,
                                  cq_llm_reply_t *reply);

/**
 * @brief GET the provider's list of models (BASE/models; for anthropic
 *        BASE/v1/models, or BASE/models when the base ends in /v1): the
 *        cheapest request that shows whether the server takes the key,
 *        for coderq doctor. One attempt, within the client's timeouts.
 * @param statusp (out) The response's status; 0 when none came.
 * @returns CQ_OK for a 2xx; CQ_ERR_RETRIABLE for 408, 429, 5xx or no
 *          response; CQ_ERR_FATAL for another status or a client
 *          configured with none. cq_llm_errmsg() then names the request,
 *          the URL without userinfo and query, and its outcome ("GET
 *          http://h/v1/models: HTTP 401"), on CQ_OK too.
 * @locality The thread that owns \p llm.
 */
CQ_NODISCARD cq_err_t cq_llm_list_models(cq_llm_t *llm, long *statusp);

/** @brief The last error, never containing the API key; borrowed, valid
 *         until the next call on \p llm. "" when none. */
const char *cq_llm_errmsg(const cq_llm_t *llm);

/** @brief Token usage summed over every successful call since creation or
 *         the last cq_llm_usage_reset(); pointers may be NULL. */
void cq_llm_usage(const cq_llm_t *llm,
                  int64_t *prompt_tokensp,
                  int64_t *completion_tokensp);

/** @brief Cache token totals, as cq_llm_usage(); pointers may be NULL. */
void cq_llm_usage_cache(const cq_llm_t *llm,
                        int64_t *cache_readp,
                        int64_t *cache_creationp);

/**
 * @brief The request body cq_llm_chat() would send for \p messages with
 *        the current provider and model (exposed for tests).
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory.
 * @locality The thread that owns \p llm.
 */
char *cq_llm_request_body(cq_llm_t *llm, const json_t *messages, size_t *lenp);

/** @brief Start a new usage total (e.g. when the handle moves to the next
 *         job). */
void cq_llm_usage_reset(cq_llm_t *llm);

/**
 * @brief The "tools" array of every request: execute_code with one
 *        required string parameter "code".
 * @returns A new reference (json_decref()); NULL when out of memory.
 * @locality Any thread.
 */
json_t *cq_llm_tools_json(void);

/** @brief Format CQ_LLM_IMAGE_PLACEHOLDER_FMT into \p out. */
void cq_llm_image_placeholder(char *out,
                              size_t out_size,
                              const char *name,
                              const char *mime,
                              size_t bytes);

/**
 * @brief Estimate the prompt tokens of \p messages without a tokenizer.
 *
 * Heuristic, deliberately pessimistic so that context management acts
 * before a real limit: per message 4 tokens of framing; for the text of
 * "content" (a string, or the "text" of content parts), "reasoning_content"
 * (or "reasoning"), "name", "tool_call_id" and each tool call's name and
 * "arguments" (the code travels there), one token per 3 ASCII bytes
 * (rounded up; BPE vocabularies average 3.5-4 for English and code) plus
 * one token per non-ASCII code point (a CJK character is about one token);
 * 8 more tokens per tool call; 3 for the reply's priming.
 * @param messages Borrowed; anything that is not an array counts 0.
 * @locality Any thread.
 */
int64_t cq_llm_estimate_tokens(const json_t *messages);

/**
 * @brief Parse a Chat Completions reply body (exposed for tests and
 *        fuzzing; cq_llm_chat() uses it).
 * @param reply (out) Initialised by the caller; filled on 0, left
 *              initialised-empty on -1.
 * @returns 0, or -1 with \p errstr filled when the body is not JSON, has no
 *          choices[0].message object, or a tool call lacks an id or a
 *          function name. Bad arguments of one call are not an error: that
 *          call gets code NULL and an error text.
 * @locality Any thread.
 */
CQ_NODISCARD int cq_llm_parse_reply(const char *body,
                                    size_t len,
                                    cq_llm_reply_t *reply,
                                    char *errstr,
                                    size_t errstr_size);

/**
 * @brief Parse a reply body of \p provider's format (exposed for tests and
 *        fuzzing). For anthropic, reply->message is the equivalent Chat
 *        Completions assistant message (text blocks joined as content,
 *        tool_use blocks as tool_calls with the input serialised as
 *        arguments), so the history keeps one shape.
 * @returns As cq_llm_parse_reply().
 * @locality Any thread.
 */
CQ_NODISCARD int cq_llm_parse_reply_as(cq_llm_provider_t provider,
                                       const char *body,
                                       size_t len,
                                       cq_llm_reply_t *reply,
                                       char *errstr,
                                       size_t errstr_size);

#endif
