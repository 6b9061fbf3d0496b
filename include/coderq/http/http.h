/* SPDX-License-Identifier: MIT */
/* http.h - the one HTTP client under the LLM client, the E2B backend and
 * input-file downloads. It owns what every request needs: the response
 * body in a capped buffer, a deadline and a cancel flag seen within about
 * 100 ms, Retry-After in both its forms, and the redaction of the
 * callers' secrets from every message it makes. What to retry and how
 * often, and which addresses may be reached, stay with the callers
 * (their hooks below).
 *
 * One handle per thread: it owns one curl easy handle, driven through a
 * private multi handle, and keeps its connections between requests.
 * cq_http_global_init() must have run before any thread starts. */
#ifndef CODERQ_HTTP_H
#define CODERQ_HTTP_H

#include <curl/curl.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "coderq/common/buf.h"
#include "coderq/common/common.h"

/** @brief What a secret becomes in a message. */
#define CQ_HTTP_REDACTED "[redacted]"

/**
 * @brief libcurl's process-wide set-up; main() calls it before any thread
 *        starts, cq_http_global_cleanup() after the last one ended.
 * @returns 0, or -1 when libcurl could not be initialised.
 * @locality The main thread, alone.
 */
CQ_NODISCARD int cq_http_global_init(void);

/** @brief Undo cq_http_global_init(). @locality The main thread, alone. */
void cq_http_global_cleanup(void);

/** @brief What every request of a handle shares. */
typedef struct cq_http_conf {
        const char *user_agent;  /* copied; NULL: no User-Agent header */
        long connect_timeout_ms; /* <= 0: 10000 */
        bool http1;              /* HTTP/1.1, never HTTP/2 */
        bool compressed;         /* accept every encoding libcurl decodes;
                                    the cap counts decoded bytes */
        bool tcp_keepalive;      /* probe idle connections */
        /* Strings that must never appear in a message of this handle
         * (API keys, tokens): borrowed, an array of \p nsecrets entries,
         * NULL entries and entries shorter than 4 bytes skipped. The array
         * and the strings must outlive the handle; they are read each
         * time a message is made, so a caller may change a secret's text
         * in place (a new token) under its own lock. */
        const char *const *secrets;
        size_t nsecrets;
} cq_http_conf_t;

typedef struct cq_http cq_http_t;

/**
 * @brief Create a handle.
 * @param conf Borrowed; its strings are copied, its secrets are not.
 * @returns Caller owns the returned value; free with cq_http_destroy().
 *          NULL on failure with \p errstr filled (NULL allowed).
 * @locality Any thread; the handle then belongs to one thread at a time.
 */
cq_http_t *
cq_http_new(const cq_http_conf_t *conf, char *errstr, size_t errstr_size);

/** @brief Free it; accepts *httpp == NULL and sets it to NULL. */
void cq_http_destroy(cq_http_t **httpp);

/** @brief How a request ended. */
typedef enum cq_http_outcome {
        CQ_HTTP_OK,        /* a whole response arrived, of any status */
        CQ_HTTP_NETWORK,   /* no whole response: see code and error */
        CQ_HTTP_TOO_LARGE, /* the body passed req.max */
        CQ_HTTP_CANCELLED, /* *req.cancel rose */
        CQ_HTTP_DEADLINE,  /* req.deadline_ms passed */
        CQ_HTTP_REFUSED,   /* req.allow_addr refused the address */
        CQ_HTTP_ABORTED,   /* req.sink or req.tick asked to stop */
} cq_http_outcome_t;

/** @brief One request. Zero it, then fill what applies. Every pointer is
 *         borrowed for the call. */
typedef struct cq_http_req {
        const char *method; /* NULL or "GET"; "POST" sends body (or an
                               empty one) or mime; any other is sent as
                               it is, without a body */
        const char *url;
        struct curl_slist *headers; /* or NULL */
        const void *body;           /* POST body of body_len bytes */
        size_t body_len;
        curl_mime *mime;          /* a multipart POST body instead (see
                                     cq_http_mime_new()) */
        size_t max;               /* the body cap in bytes; a longer body
                                     ends the request (CQ_HTTP_TOO_LARGE) */
        long timeout_ms;          /* the whole transfer; <= 0: none */
        int64_t deadline_ms;      /* cq_now_ms()'s clock; 0: none */
        const atomic_int *cancel; /* raised (non-zero): stop; or NULL */
        /* Hooks, each optional, each given \p opaque. */
        /* The body as it arrives, instead of the capped buffer (a stream
         * read line by line); \p status is the response's. Return 0 to go
         * on, -1 to stop (CQ_HTTP_ABORTED). */
        int (*sink)(void *opaque, long status, const char *data, size_t len);
        /* Each response header, name and value trimmed and NUL-terminated
         * (the value cut at 2047 bytes). */
        void (*on_header)(void *opaque, const char *name, const char *value);
        /* Called before the request goes out and then about every 100 ms
         * while it runs; non-zero stops it (CQ_HTTP_ABORTED). It may make
         * requests of its own on another handle. */
        int (*tick)(void *opaque);
        /* Each address a connection is about to be made to, after name
         * resolution (so also after a DNS change between requests): false
         * refuses it. With this hook no proxy is used, since a proxy
         * would connect on the request's behalf. */
        bool (*allow_addr)(void *opaque, const struct sockaddr *sa);
        void *opaque;
} cq_http_req_t;

/** @brief What came of a request. Init with cq_http_res_init(), release
 *         with cq_http_res_release(); read-only for the caller. */
typedef struct cq_http_res {
        cq_http_outcome_t outcome;
        long status;            /* the last response's, 0 when none came */
        CURLcode code;          /* libcurl's result */
        cq_buf_t body;          /* without a sink: the body, capped */
        int64_t retry_after_ms; /* Retry-After-Ms, else Retry-After, of the
                                   last response; -1 when neither */
        char *redirect_url;     /* a 3xx's Location resolved against the
                                   URL (never followed), or NULL */
        char refused_addr[64];  /* the address allow_addr refused */
        char error[512];        /* why, when not CQ_HTTP_OK, redacted:
                                   libcurl's words, "request cancelled", "the
                                   caller's deadline passed", ... */
} cq_http_res_t;

void cq_http_res_init(cq_http_res_t *res);
void cq_http_res_release(cq_http_res_t *res);

/**
 * @brief Send \p req and wait for its response. Nothing is sent when the
 *        cancel flag is already up or the deadline already passed.
 * @param res (out) Initialised by the caller; its previous contents are
 *            released first.
 * @returns res->outcome. A status of 4xx or 5xx is CQ_HTTP_OK: which
 *          statuses to retry is the caller's decision.
 * @locality The thread that owns \p http.
 */
cq_http_outcome_t
cq_http_perform(cq_http_t *http, const cq_http_req_t *req, cq_http_res_t *res);

/**
 * @brief Replace every secret of \p http's configuration in \p s with
 *        CQ_HTTP_REDACTED, in place, never writing past \p size (the text
 *        may be cut).
 * @locality Any thread that may read the secrets.
 */
void cq_http_redact(const cq_http_t *http, char *s, size_t size);

/**
 * @brief \p url as it may be shown: without user:password@ and without
 *        its ?query (some gateways take "?api-key=").
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory.
 * @locality Any thread.
 */
char *cq_http_url_shown(const char *url);

/**
 * @brief Parse a Retry-After value: delay-seconds (fractions allowed) or
 *        an HTTP-date, relative to \p now (seconds since the epoch).
 * @returns The delay in ms, at most a year (0 for a date in the past),
 *          or -1 when the value is neither.
 * @locality Any thread.
 */
int64_t cq_http_parse_retry_after(const char *value, int64_t now);

/**
 * @brief URL-encode \p s (every byte but A-Z a-z 0-9 - . _ ~).
 * @returns Caller owns the returned value (free()); NULL when out of
 *          memory.
 * @locality The thread that owns \p http.
 */
char *cq_http_escape(cq_http_t *http, const char *s);

/**
 * @brief A multipart body for req.mime, bound to \p http's easy handle.
 * @returns Caller owns the returned value; free with curl_mime_free()
 *          after the request. NULL when out of memory.
 * @locality The thread that owns \p http.
 */
curl_mime *cq_http_mime_new(cq_http_t *http);

#endif
