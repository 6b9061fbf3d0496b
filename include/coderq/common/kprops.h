/* SPDX-License-Identifier: MIT */
/* kprops.h - librdkafka properties given by the operator, for every Kafka
 * client coderq makes (intake consumer, producer, coderq submit, coderq
 * doctor): a Java-style properties file (CODERQ_KAFKA_PROPERTIES, as
 * Kafka's own tools take) and CODERQ_KAFKA_PROP_<NAME> variables. This
 * module parses both, strictly, and knows which names coderq keeps for
 * itself and which values are secrets; consumer/ applies the result to
 * librdkafka.
 *
 * Precedence, lowest first: coderq's defaults for each client, the file,
 * the variables, coderq's own settings. The names coderq sets itself
 * (cq_kprops_reserved()) are refused in the file and the variables, so
 * nothing given here is silently overridden. */
#ifndef CODERQ_KPROPS_H
#define CODERQ_KPROPS_H

#include <stdbool.h>
#include <stddef.h>

#include "coderq/common/common.h"

/* Prefix of the variables: CODERQ_KAFKA_PROP_SASL_MECHANISM. */
#define CQ_KPROPS_ENV_PREFIX "CODERQ_KAFKA_PROP_"
/* Largest properties file read, bytes. */
#define CQ_KPROPS_FILE_MAX ((size_t)1 << 20)
/* Longest property name. */
#define CQ_KPROPS_KEY_MAX 128

typedef struct cq_kprops cq_kprops_t;

/** @brief An empty set. @returns Caller owns the returned value; free with
 *         cq_kprops_destroy(). NULL when out of memory. */
cq_kprops_t *cq_kprops_new(void);

/** @brief Accepts *propsp == NULL; sets it to NULL. */
void cq_kprops_destroy(cq_kprops_t **propsp);

/**
 * @brief Parse the text of a properties file and add its entries (a name
 *        already set, by an earlier file or variable, is replaced).
 *
 * The format is java.util.Properties', strictly: natural lines end in
 * \\n, \\r\\n or \\r; a line whose first non-blank character is '#' or
 * '!' is a comment; a line ending in an odd number of backslashes goes on
 * on the next line (its leading blanks dropped); an entry is
 * "name = value" or "name : value" (blanks around the separator dropped);
 * escapes \\t \\n \\r \\f \\uXXXX (UTF-16, surrogate pairs combined; the
 * value is stored as UTF-8) and backslash before any other character
 * stand for that character. Refused, with the line named
 * ("FILE line 3: ..."): a line without '=' or ':', an empty name, a name
 * outside [A-Za-z0-9._-] or longer than CQ_KPROPS_KEY_MAX, a name set
 * twice in the file, a malformed \\u escape or lone surrogate, a NUL
 * (raw or \\u0000), a backslash continuation at the end of the text, and
 * a reserved name (cq_kprops_reserved()). A value is never quoted in an
 * error.
 * @param origin Borrowed; names the text in errors and sources (a path).
 * @returns 0, or -1 with \p errstr filled.
 */
CQ_NODISCARD int cq_kprops_parse(cq_kprops_t *props,
                                 const char *text,
                                 size_t len,
                                 const char *origin,
                                 char *errstr,
                                 size_t errstr_size);

/**
 * @brief Read \p path (at most CQ_KPROPS_FILE_MAX bytes) and parse it
 *        with cq_kprops_parse().
 * @returns 0, or -1 with \p errstr filled ("could not read FILE: reason"
 *          or a parse error).
 */
CQ_NODISCARD int cq_kprops_load_file(cq_kprops_t *props,
                                     const char *path,
                                     char *errstr,
                                     size_t errstr_size);

/**
 * @brief The property a variable name stands for: the part after
 *        CQ_KPROPS_ENV_PREFIX, lower-cased, each '_' becoming '.'
 *        (SASL_MECHANISM -> sasl.mechanism). The part must be non-empty,
 *        only A-Z, 0-9 and '_', and neither start nor end with '_' nor
 *        hold "__" (names with '_' or '-' cannot be set this way; use
 *        the file).
 * @param env The whole variable name ("CODERQ_KAFKA_PROP_SASL_MECHANISM").
 * @returns 0, or -1 when \p env does not have that form.
 */
CQ_NODISCARD int
cq_kprops_env_to_key(const char *env, char *out, size_t out_size);

/**
 * @brief Add every CODERQ_KAFKA_PROP_<NAME>=value of \p envp (an environ
 *        array, borrowed); a variable with an empty value is skipped, as
 *        the other settings are.
 * @returns 0, or -1 with \p errstr filled: a malformed name, two
 *          variables for one property, a reserved name.
 */
CQ_NODISCARD int cq_kprops_load_env(cq_kprops_t *props,
                                    char *const *envp,
                                    char *errstr,
                                    size_t errstr_size);

/**
 * @brief Whether the value of property \p key is a secret, never printed
 *        or logged: a name holding "password" or "secret" (any case),
 *        the private keys ssl.key.pem, ssl_key and ssl.keystore.key, and
 *        sasl.jaas.config and sasl.oauthbearer.config (they may hold
 *        credentials).
 */
bool cq_kprops_is_secret(const char *key);

/**
 * @brief Why coderq keeps \p key for itself (it sets it on the clients
 *        that need it, and correctness depends on the value), or NULL
 *        when the operator may set it. Covers librdkafka's aliases too.
 * @returns Borrowed, static text.
 */
const char *cq_kprops_reserved(const char *key);

/** @brief Number of entries, in the order they were first set. */
size_t cq_kprops_count(const cq_kprops_t *props);

/**
 * @brief Entry \p i (< cq_kprops_count()). Borrowed; valid until the set
 *        changes or is destroyed.
 * @param sourcep (out, may be NULL) where it came from: "FILE line N" or
 *        the variable's name.
 */
void cq_kprops_get(const cq_kprops_t *props,
                   size_t i,
                   const char **keyp,
                   const char **valuep,
                   const char **sourcep);

#endif
