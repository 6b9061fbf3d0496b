/* SPDX-License-Identifier: MIT */
/* prices.h - token prices per model (CODERQ_PRICES_FILE) and what a job's
 * LLM usage costs. The file is JSON (docs/EVALUATION.md#cost-and-budgets):
 *
 *   {"models": {"gpt-4o-mini": {"input": 0.15, "output": 0.60,
 *                               "cached_input": 0.075},
 *               "claude-sonnet-4-*": {"input": 3, "output": 15,
 *                                     "cached_input": 0.3,
 *                                     "cache_write": 3.75}}}
 *
 * Prices are USD per million tokens. A name ending in '*' matches every
 * model it is a prefix of; an exact name wins, then the longest prefix. A
 * model the file does not name has no price: its cost is unknown (never
 * 0). The file is untrusted input as far as its shape goes: every field is
 * checked and every rejection names it. */
#ifndef CODERQ_PRICES_H
#define CODERQ_PRICES_H

#include <stddef.h>
#include <stdint.h>

#include "coderq/common/common.h"

/* Largest prices file read, bytes. */
#define CQ_PRICES_FILE_MAX ((size_t)1 << 20)
/* Largest price accepted, USD per million tokens. */
#define CQ_PRICE_MAX 100000.0

/** @brief The prices of one model, USD per million tokens. */
typedef struct cq_price {
        double input;        /* input tokens not served by a cache */
        double output;       /* output tokens */
        double cached_input; /* input tokens read from a prompt cache
                                (default: input) */
        double cache_write;  /* input tokens written to a prompt cache
                                (default: input) */
} cq_price_t;

/** @brief Token counts of one call or of a whole job. */
typedef struct cq_usage {
        int64_t prompt_tokens; /* every input token, cached ones included */
        int64_t completion_tokens;
        int64_t cache_read_tokens;     /* of prompt_tokens */
        int64_t cache_creation_tokens; /* of prompt_tokens */
} cq_usage_t;

typedef struct cq_prices cq_prices_t;

/**
 * @brief Parse a prices document.
 * @param text Borrowed, \p len bytes (at most CQ_PRICES_FILE_MAX).
 * @param source Names the document in errors (a path).
 * @returns Caller owns the returned value; free with cq_prices_destroy().
 *          NULL with \p errstr filled: `prices file "F": field
 *          "models.gpt-4o.input" must be a number from 0 to 100000`.
 * @locality Any thread; the result is read-only and may be shared.
 */
cq_prices_t *cq_prices_parse(const char *text,
                             size_t len,
                             const char *source,
                             char *errstr,
                             size_t errstr_size);

/** @brief cq_prices_parse() of the file at \p path (refused over
 *         CQ_PRICES_FILE_MAX bytes). */
cq_prices_t *cq_prices_load(const char *path, char *errstr, size_t errstr_size);

void cq_prices_destroy(cq_prices_t **pricesp);

/** @brief How many model entries the file has. */
size_t cq_prices_count(const cq_prices_t *prices);

/**
 * @brief The price of \p model: its exact entry, else the longest "prefix*"
 *        entry it starts with.
 * @param prices May be NULL (no file: nothing has a price).
 * @returns true with *\p pricep filled, false when \p model has no price.
 * @locality Any thread.
 */
bool cq_prices_find(const cq_prices_t *prices,
                    const char *model,
                    cq_price_t *pricep);

/**
 * @brief What \p usage costs at \p price, in USD: uncached input tokens
 *        at input, cache reads at cached_input, cache writes at
 *        cache_write, output tokens at output. Negative counts count 0;
 *        cached counts above prompt_tokens are capped at it.
 */
double cq_price_cost(const cq_price_t *price, const cq_usage_t *usage);

/**
 * @brief The most the next call may cost, for budgets: \p prompt_tokens
 *        (an estimate) all at the uncached input price, and \p max_tokens
 *        output tokens (the reply's bound) at the output price.
 */
double cq_price_estimate(const cq_price_t *price,
                         int64_t prompt_tokens,
                         int64_t max_tokens);

#endif
