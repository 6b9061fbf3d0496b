/* SPDX-License-Identifier: MIT */
/* httpd.c - the worker's HTTP/1.1 server: one thread polls the listening
 * socket, a wake-up pipe and at most max_conns non-blocking connections.
 * A connection reads its request head into a fixed buffer, gets its whole
 * reply from the handler, writes it and is closed; past its deadline it is
 * closed whatever its state. While max_conns are open the listening socket
 * is not polled, so the kernel's backlog holds the rest. */
#include "coderq/worker/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"

typedef struct conn {
        int fd; /* -1: free */
        int64_t deadline;
        char in[CQ_HTTPD_HEAD_MAX];
        size_t inlen;
        char *out; /* the reply, once the request was read */
        size_t outlen, outoff;
} conn_t;

struct cq_httpd {
        cq_httpd_opts_t opts;
        int lfd, wake[2], port;
        pthread_t thread;
        bool started;
        conn_t *conns;
        struct pollfd *pfds;
        int *pconn; /* pfds index -> conns index */
};

static bool is_tchar(unsigned char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The end of the line starting at \p p (its LF), or NULL. */
static const char *line_end(const char *p, const char *end)
{
        return memchr(p, '\n', (size_t)(end - p));
}

/* The length of [p, e) without a trailing CR. */
static size_t trim_cr(const char *p, const char *e)
{
        return e > p && e[-1] == '\r' ? (size_t)(e - p - 1) : (size_t)(e - p);
}

static bool header_is(const char *p, size_t n, const char *name)
{
        size_t k = strlen(name);

        return n == k && strncasecmp(p, name, k) == 0;
}

/* A header line "name: value"; 0 or 400. Refuses one announcing a body. */
static int parse_header(const char *p, size_t n)
{
        const char *colon = memchr(p, ':', n);
        const char *v;
        size_t i, k, vn;

        if (!colon || colon == p)
                return 400;
        k = (size_t)(colon - p);
        for (i = 0; i < k; i++)
                if (!is_tchar((unsigned char)p[i]))
                        return 400;
        for (i = k + 1; i < n; i++)
                if ((unsigned char)p[i] < 0x20 && p[i] != '\t')
                        return 400;
        v = colon + 1;
        vn = n - k - 1;
        while (vn && (*v == ' ' || *v == '\t'))
                v++, vn--;
        while (vn && (v[vn - 1] == ' ' || v[vn - 1] == '\t'))
                vn--;
        if (header_is(p, k, "transfer-encoding"))
                return 400;
        if (header_is(p, k, "content-length") && !(vn == 1 && v[0] == '0'))
                return 400;
        return 0;
}

static int parse_request_line(const char *p, size_t n, cq_httpd_req_t *req)
{
        const char *sp1 = memchr(p, ' ', n), *sp2, *target, *q;
        size_t mlen, tlen, vlen, i;

        if (!sp1 || sp1 == p)
                return 400;
        mlen = (size_t)(sp1 - p);
        for (i = 0; i < mlen; i++)
                if (!is_tchar((unsigned char)p[i]))
                        return 400;
        target = sp1 + 1;
        sp2 = memchr(target, ' ', n - mlen - 1);
        if (!sp2 || sp2 == target)
                return 400;
        tlen = (size_t)(sp2 - target);
        vlen = n - mlen - tlen - 2;
        if (vlen != 8 || strncmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
            (sp2[8] != '0' && sp2[8] != '1'))
                return 400;
        if (target[0] != '/')
                return 400;
        for (i = 0; i < tlen; i++)
                if ((unsigned char)target[i] <= 0x20 ||
                    (unsigned char)target[i] >= 0x7f)
                        return 400;
        q = memchr(target, '?', tlen);
        if (q)
                tlen = (size_t)(q - target);
        if (tlen > CQ_HTTPD_PATH_MAX)
                return 400;
        memcpy(req->path, target, tlen);
        req->path[tlen] = '\0';
        if (mlen == 3 && memcmp(p, "GET", 3) == 0)
                req->head = false;
        else if (mlen == 4 && memcmp(p, "HEAD", 4) == 0)
                req->head = true;
        else
                return 405;
        return 200;
}

int cq_httpd_parse(const char *data, size_t len, cq_httpd_req_t *req)
{
        const char *p = data, *end = data + len, *e;
        int status = 0;
        bool first = true;

        memset(req, 0, sizeof(*req));
        if (len > CQ_HTTPD_HEAD_MAX)
                return 400;
        while ((e = line_end(p, end))) {
                size_t n = trim_cr(p, e);
                int rc;

                if (memchr(p, '\0', n))
                        return 400;
                if (first) {
                        status = parse_request_line(p, n, req);
                        if (status == 400)
                                return 400;
                        first = false;
                } else if (n == 0) {
                        return status;
                } else if ((rc = parse_header(p, n)) != 0) {
                        return rc;
                }
                p = e + 1;
        }
        if (first && memchr(data, '\0', len))
                return 400;
        return len >= CQ_HTTPD_HEAD_MAX ? 400 : 0;
}

static const char *reason(int status)
{
        switch (status) {
        case 200:
                return "OK";
        case 400:
                return "Bad Request";
        case 404:
                return "Not Found";
        case 405:
                return "Method Not Allowed";
        case 408:
                return "Request Timeout";
        case 503:
                return "Service Unavailable";
        default:
                return "Internal Server Error";
        }
}

/* Build the reply of conn \p c for \p status (the parser's) into c->out. */
static void build_reply(cq_httpd_t *h, conn_t *c, int status)
{
        cq_buf_t body, head;
        const char *type = "text/plain; charset=utf-8";
        cq_httpd_req_t req;
        bool head_only = false;

        cq_buf_init(&body, h->opts.body_max);
        cq_buf_init(&head, 1024 + h->opts.body_max);
        if (status == 200) {
                (void)cq_httpd_parse(c->in, c->inlen, &req);
                head_only = req.head;
                status =
                    h->opts.handler(h->opts.opaque, req.path, &body, &type);
        } else {
                cq_buf_reset(&body);
                if (cq_buf_printf(&body, "%s\n", reason(status)) != CQ_OK)
                        cq_buf_reset(&body);
        }
        if (cq_buf_printf(&head,
                          "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n"
                          "Content-Length: %zu\r\nConnection: close\r\n"
                          "%s\r\n",
                          status, reason(status), type, body.len,
                          status == 405 ? "Allow: GET, HEAD\r\n" : "") !=
                CQ_OK ||
            (!head_only && body.len &&
             cq_buf_append(&head, body.data, body.len) != CQ_OK)) {
                /* the head fits 1024 bytes; only the body can be past a
                 * cap: say so rather than cut it */
                cq_buf_reset(&head);
                if (cq_buf_append_str(&head,
                                      "HTTP/1.1 500 Internal Server Error\r\n"
                                      "Content-Length: 0\r\n"
                                      "Connection: close\r\n\r\n") != CQ_OK)
                        cq_buf_reset(&head);
        }
        c->outlen = head.len;
        c->outoff = 0;
        c->out = cq_buf_take(&head, NULL);
        if (!c->out)
                c->outlen = 0;
        cq_buf_release(&body);
}

static void conn_close(conn_t *c)
{
        if (c->fd >= 0)
                close(c->fd);
        c->fd = -1;
        free(c->out);
        c->out = NULL;
        c->inlen = c->outlen = c->outoff = 0;
}

/* Read what is there; once the head is complete or bad, build the reply.
 * Returns false when the connection is done. */
static bool conn_read(cq_httpd_t *h, conn_t *c)
{
        ssize_t n;
        cq_httpd_req_t req;
        int status;

        n = read(c->fd, c->in + c->inlen, sizeof(c->in) - c->inlen);
        if (n < 0)
                return errno == EAGAIN || errno == EINTR;
        if (n == 0)
                return false; /* closed before a whole request */
        c->inlen += (size_t)n;
        status = cq_httpd_parse(c->in, c->inlen, &req);
        if (status == 0)
                return true;
        build_reply(h, c, status);
        return c->out != NULL;
}

static bool conn_write(conn_t *c)
{
        ssize_t n = send(c->fd, c->out + c->outoff, c->outlen - c->outoff,
                         MSG_NOSIGNAL);

        if (n < 0)
                return errno == EAGAIN || errno == EINTR;
        c->outoff += (size_t)n;
        return c->outoff < c->outlen;
}

static void accept_one(cq_httpd_t *h)
{
        size_t i;
        int fd = accept(h->lfd, NULL, NULL);

        if (fd < 0)
                return;
        for (i = 0; i < h->opts.max_conns; i++)
                if (h->conns[i].fd < 0)
                        break;
        if (i == h->opts.max_conns ||
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
                close(fd);
                return;
        }
        h->conns[i].fd = fd;
        h->conns[i].inlen = 0;
        h->conns[i].deadline = cq_now_ms() + h->opts.timeout_ms;
}

static void *httpd_main(void *arg)
{
        cq_httpd_t *h = arg;

        for (;;) {
                size_t i, open = 0;
                nfds_t n = 0;
                int64_t now = cq_now_ms(), wait = 1000;

                h->pfds[n].fd = h->wake[0];
                h->pfds[n++].events = POLLIN;
                for (i = 0; i < h->opts.max_conns; i++) {
                        conn_t *c = &h->conns[i];

                        if (c->fd < 0)
                                continue;
                        if (now >= c->deadline) {
                                conn_close(c);
                                continue;
                        }
                        open++;
                        if (c->deadline - now < wait)
                                wait = c->deadline - now;
                        h->pfds[n].fd = c->fd;
                        h->pfds[n].events = c->out ? POLLOUT : POLLIN;
                        h->pconn[n++] = (int)i;
                }
                if (open < h->opts.max_conns) {
                        h->pfds[n].fd = h->lfd;
                        h->pfds[n].events = POLLIN;
                        h->pconn[n++] = -1;
                }
                if (poll(h->pfds, n, (int)wait) < 0 && errno != EINTR) {
                        cq_log_error("metrics server: could not poll: %s",
                                     strerror(errno));
                        (void)poll(NULL, 0, 100);
                        continue;
                }
                if (h->pfds[0].revents)
                        break;
                for (i = 1; i < n; i++) {
                        conn_t *c;
                        bool more;

                        if (!h->pfds[i].revents)
                                continue;
                        if (h->pconn[i] < 0) {
                                accept_one(h);
                                continue;
                        }
                        c = &h->conns[h->pconn[i]];
                        if (c->out)
                                more = conn_write(c);
                        else if (h->pfds[i].revents & (POLLIN | POLLHUP))
                                more = conn_read(h, c);
                        else
                                more = false;
                        if (!more)
                                conn_close(c);
                }
        }
        return NULL;
}

/* Split "host:port", ":port" or "[v6]:port"; host "" for every
 * interface. */
static int split_addr(const char *addr,
                      char *host,
                      size_t host_size,
                      char *port,
                      size_t port_size)
{
        const char *colon;
        const char *h = addr;
        size_t hlen, i;

        if (addr[0] == '[') {
                const char *close = strchr(addr, ']');

                if (!close || close[1] != ':')
                        return -1;
                h = addr + 1;
                hlen = (size_t)(close - h);
                colon = close + 1;
        } else {
                colon = strrchr(addr, ':');
                if (!colon)
                        return -1;
                hlen = (size_t)(colon - addr);
                if (memchr(addr, ':', hlen))
                        return -1; /* a bare v6 address needs brackets */
        }
        if (hlen >= host_size || strlen(colon + 1) >= port_size || !colon[1] ||
            strlen(colon + 1) > 5)
                return -1;
        for (i = 1; colon[i]; i++)
                if (colon[i] < '0' || colon[i] > '9')
                        return -1;
        if (strtol(colon + 1, NULL, 10) > 65535)
                return -1;
        memcpy(host, h, hlen);
        host[hlen] = '\0';
        snprintf(port, port_size, "%s", colon + 1);
        return 0;
}

static int listen_on(cq_httpd_t *h, char *errstr, size_t errstr_size)
{
        struct addrinfo hints, *res = NULL, *ai;
        char host[256], port[8];
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int rc, one = 1, err = 0;

        if (split_addr(h->opts.addr, host, sizeof(host), port, sizeof(port))) {
                cq_errstr_set(errstr, errstr_size,
                              "could not listen on \"%s\": not HOST:PORT, "
                              ":PORT or [V6]:PORT",
                              h->opts.addr);
                return -1;
        }
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
        if (rc != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not listen on \"%s\": %s", h->opts.addr,
                              gai_strerror(rc));
                return -1;
        }
        for (ai = res; ai; ai = ai->ai_next) {
                h->lfd = socket(ai->ai_family,
                                ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                ai->ai_protocol);
                if (h->lfd < 0) {
                        err = errno;
                        continue;
                }
                setsockopt(h->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(h->lfd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                    listen(h->lfd, 16) == 0)
                        break;
                err = errno;
                close(h->lfd);
                h->lfd = -1;
        }
        freeaddrinfo(res);
        if (h->lfd < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not listen on \"%s\": %s", h->opts.addr,
                              strerror(err));
                return -1;
        }
        if (getsockname(h->lfd, (struct sockaddr *)&ss, &sl) == 0)
                h->port = ntohs(ss.ss_family == AF_INET6
                                    ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                    : ((struct sockaddr_in *)&ss)->sin_port);
        return 0;
}

cq_httpd_t *
cq_httpd_new(const cq_httpd_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_httpd_t *h = calloc(1, sizeof(*h));
        size_t i;
        int err;

        if (!h) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return NULL;
        }
        h->opts = *opts;
        h->lfd = h->wake[0] = h->wake[1] = -1;
        if (!h->opts.max_conns)
                h->opts.max_conns = 8;
        if (h->opts.timeout_ms <= 0)
                h->opts.timeout_ms = 5000;
        if (!h->opts.body_max)
                h->opts.body_max = (size_t)4 << 20;
        h->conns = calloc(h->opts.max_conns, sizeof(*h->conns));
        h->pfds = calloc(h->opts.max_conns + 2, sizeof(*h->pfds));
        h->pconn = calloc(h->opts.max_conns + 2, sizeof(*h->pconn));
        if (!h->conns || !h->pfds || !h->pconn) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                goto fail;
        }
        for (i = 0; i < h->opts.max_conns; i++)
                h->conns[i].fd = -1;
        if (!opts->addr || !opts->handler) {
                cq_errstr_set(errstr, errstr_size,
                              "could not listen: no address or handler");
                goto fail;
        }
        if (listen_on(h, errstr, errstr_size) != 0)
                goto fail;
        if (pipe2(h->wake, O_CLOEXEC) != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not listen on \"%s\": %s", opts->addr,
                              strerror(errno));
                goto fail;
        }
        err = pthread_create(&h->thread, NULL, httpd_main, h);
        if (err != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the metrics server thread: %s",
                              strerror(err));
                goto fail;
        }
        h->started = true;
        return h;
fail:
        cq_httpd_destroy(&h);
        return NULL;
}

int cq_httpd_port(const cq_httpd_t *httpd) { return httpd->port; }

void cq_httpd_destroy(cq_httpd_t **httpdp)
{
        cq_httpd_t *h = *httpdp;
        size_t i;

        if (!h)
                return;
        *httpdp = NULL;
        if (h->started) {
                ssize_t n = write(h->wake[1], "x", 1);

                (void)n;
                pthread_join(h->thread, NULL);
        }
        for (i = 0; h->conns && i < h->opts.max_conns; i++)
                conn_close(&h->conns[i]);
        if (h->lfd >= 0)
                close(h->lfd);
        if (h->wake[0] >= 0)
                close(h->wake[0]);
        if (h->wake[1] >= 0)
                close(h->wake[1]);
        free(h->conns);
        free(h->pfds);
        free(h->pconn);
        free(h);
}
