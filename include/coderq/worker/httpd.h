/* SPDX-License-Identifier: MIT */
/* httpd.h - the worker's small HTTP/1.1 server for /metrics, /healthz and
 * /readyz: one thread, plain sockets and poll(), a bounded number of
 * connections, a bounded request head, a deadline per connection, GET and
 * HEAD only, one request per connection (every reply says
 * "Connection: close"). Anything malformed gets 400 and the connection is
 * closed; nothing a client sends can stop the server. */
#ifndef CODERQ_HTTPD_H
#define CODERQ_HTTPD_H

#include "coderq/common/buf.h"
#include "coderq/common/common.h"

#define CQ_HTTPD_HEAD_MAX 8192 /* request line and headers, bytes */
#define CQ_HTTPD_PATH_MAX 256  /* the path of a request, NUL excluded */

/**
 * @brief Answer one request.
 * @param path  The request's path without its query; borrowed.
 * @param body  (out) An empty buffer (its cap: opts.body_max) for the
 *              reply's body.
 * @param content_typep (out) The body's type; a static string. Left as
 *              "text/plain; charset=utf-8" when not set.
 * @returns The HTTP status: 200, 404, 503, ...
 * @locality The server's thread.
 */
typedef int (*cq_httpd_handler_t)(void *opaque,
                                  const char *path,
                                  cq_buf_t *body,
                                  const char **content_typep);

typedef struct cq_httpd_opts {
        const char *addr; /* "host:port", ":port" (every interface) or
                             "[v6]:port"; port 0 picks a free one */
        size_t max_conns; /* open connections at once; 0: 8. Further
                             ones wait in the listen backlog */
        int timeout_ms;   /* to read a request and write its reply;
                             <= 0: 5000 */
        size_t body_max;  /* a reply body's cap; 0: 4 MiB */
        cq_httpd_handler_t handler;
        void *opaque;
} cq_httpd_opts_t;

typedef struct cq_httpd cq_httpd_t;

/**
 * @brief Bind and listen on opts->addr, and start the server's thread.
 * @returns Caller owns the returned value; free with cq_httpd_destroy().
 *          NULL with \p errstr filled ("could not listen on \"ADDR\":
 *          reason").
 * @locality Any thread.
 */
cq_httpd_t *
cq_httpd_new(const cq_httpd_opts_t *opts, char *errstr, size_t errstr_size);

/** @brief The port it listens on (the one picked for port 0). */
int cq_httpd_port(const cq_httpd_t *httpd);

/** @brief Stop the thread, close every connection and free the server;
 *         accepts *httpdp == NULL and sets it to NULL. */
void cq_httpd_destroy(cq_httpd_t **httpdp);

/** @brief What cq_httpd_parse() found. */
typedef struct cq_httpd_req {
        bool head;                        /* HEAD, else GET */
        char path[CQ_HTTPD_PATH_MAX + 1]; /* without the query */
} cq_httpd_req_t;

/**
 * @brief Parse a request head: "METHOD SP target SP HTTP/1.x" CRLF, then
 *        header lines ("name: value", name a token), then an empty line
 *        (a bare LF ends a line too). A request that announces a body
 *        (Content-Length other than 0, Transfer-Encoding) is refused.
 * @param data Borrowed; \p len bytes, need not be NUL-terminated.
 * @returns 0 when the head is not complete yet (and \p len is below
 *          CQ_HTTPD_HEAD_MAX), 200 with \p req filled, 405 for a method
 *          other than GET and HEAD, else 400.
 * @locality Any thread.
 */
int cq_httpd_parse(const char *data, size_t len, cq_httpd_req_t *req);

#endif
