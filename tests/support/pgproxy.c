/* SPDX-License-Identifier: MIT */
/* pgproxy.c - see pgproxy.h. */
#include "support/pgproxy.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/util.h"
#include "support/pgtest.h"

#define MAX_PAIRS 8

typedef struct pair {
        int client, server; /* -1 when unused */
        bool held;          /* replies kept back */
        /* Parser of the held server stream: message type + length. */
        unsigned char hdr[5];
        size_t hdr_len;
        size_t body_left;
        int ready;     /* ReadyForQuery messages held */
        char tail[32]; /* last client bytes, for a marker split over reads */
        size_t tail_len;
} pair_t;

struct cq_pgproxy {
        int listen_fd, port, wake[2];
        struct sockaddr_storage target;
        socklen_t target_len;
        pthread_t thread;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        pair_t pairs[MAX_PAIRS];
        char marker[32]; /* "" when not armed */
        bool drop, stop;
};

static void pair_close(pair_t *p)
{
        if (p->client >= 0)
                close(p->client);
        if (p->server >= 0)
                close(p->server);
        memset(p, 0, sizeof(*p));
        p->client = p->server = -1;
}

static int connect_target(const cq_pgproxy_t *proxy)
{
        int fd = socket(proxy->target.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

        if (fd < 0)
                return -1;
        if (connect(fd, (const struct sockaddr *)&proxy->target,
                    proxy->target_len) != 0) {
                close(fd);
                return -1;
        }
        return fd;
}

static bool write_all(int fd, const char *buf, size_t len)
{
        while (len > 0) {
                ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return false;
                buf += n;
                len -= (size_t)n;
        }
        return true;
}

/* Count the ReadyForQuery messages in held server bytes. */
static void parse_held(pair_t *p, const unsigned char *buf, size_t len)
{
        size_t i = 0;

        while (i < len) {
                if (p->body_left > 0) {
                        size_t n =
                            len - i < p->body_left ? len - i : p->body_left;

                        p->body_left -= n;
                        i += n;
                        continue;
                }
                p->hdr[p->hdr_len++] = buf[i++];
                if (p->hdr_len < 5)
                        continue;
                p->body_left =
                    (((size_t)p->hdr[1] << 24) | ((size_t)p->hdr[2] << 16) |
                     ((size_t)p->hdr[3] << 8) | p->hdr[4]) -
                    4;
                if (p->hdr[0] == 'Z')
                        p->ready++;
                p->hdr_len = 0;
        }
}

/* Client bytes: forward; arm the hold when they carry the marker. */
static bool from_client(cq_pgproxy_t *proxy, pair_t *p)
{
        char buf[65536], scan[sizeof(buf) + sizeof(p->tail)];
        ssize_t n = recv(p->client, buf, sizeof(buf), 0);
        size_t keep;

        if (n <= 0)
                return false;
        pthread_mutex_lock(&proxy->lock);
        if (proxy->marker[0]) {
                memcpy(scan, p->tail, p->tail_len);
                memcpy(scan + p->tail_len, buf, (size_t)n);
                if (memmem(scan, p->tail_len + (size_t)n, proxy->marker,
                           strlen(proxy->marker))) {
                        p->held = true;
                        proxy->marker[0] = '\0';
                }
        }
        pthread_mutex_unlock(&proxy->lock);
        keep = (size_t)n < sizeof(p->tail) ? (size_t)n : sizeof(p->tail);
        memcpy(p->tail, buf + n - (ssize_t)keep, keep);
        p->tail_len = keep;
        return write_all(p->server, buf, (size_t)n);
}

static bool from_server(cq_pgproxy_t *proxy, pair_t *p)
{
        char buf[65536];
        ssize_t n = recv(p->server, buf, sizeof(buf), 0);

        if (n <= 0)
                return false;
        if (!p->held)
                return write_all(p->client, buf, (size_t)n);
        pthread_mutex_lock(&proxy->lock);
        parse_held(p, (const unsigned char *)buf, (size_t)n);
        pthread_cond_broadcast(&proxy->cond);
        pthread_mutex_unlock(&proxy->lock);
        return true;
}

static void *proxy_main(void *arg)
{
        cq_pgproxy_t *proxy = arg;

        for (;;) {
                struct pollfd fds[2 + 2 * MAX_PAIRS];
                int map[2 + 2 * MAX_PAIRS];
                nfds_t nfds = 0;
                int i;

                pthread_mutex_lock(&proxy->lock);
                if (proxy->stop) {
                        pthread_mutex_unlock(&proxy->lock);
                        break;
                }
                if (proxy->drop) {
                        for (i = 0; i < MAX_PAIRS; i++)
                                if (proxy->pairs[i].held)
                                        pair_close(&proxy->pairs[i]);
                        proxy->drop = false;
                        pthread_cond_broadcast(&proxy->cond);
                }
                pthread_mutex_unlock(&proxy->lock);
                fds[nfds].fd = proxy->wake[0];
                fds[nfds].events = POLLIN;
                map[nfds++] = -1;
                fds[nfds].fd = proxy->listen_fd;
                fds[nfds].events = POLLIN;
                map[nfds++] = -2;
                for (i = 0; i < MAX_PAIRS; i++) {
                        if (proxy->pairs[i].client < 0)
                                continue;
                        fds[nfds].fd = proxy->pairs[i].client;
                        fds[nfds].events = POLLIN;
                        map[nfds++] = 2 * i;
                        fds[nfds].fd = proxy->pairs[i].server;
                        fds[nfds].events = POLLIN;
                        map[nfds++] = 2 * i + 1;
                }
                if (poll(fds, nfds, 1000) < 0 && errno != EINTR)
                        break;
                for (i = 0; i < (int)nfds; i++) {
                        pair_t *p;
                        bool ok;

                        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                                continue;
                        if (map[i] == -1) {
                                char c[16];

                                /* drained; a failure is EAGAIN */
                                (void)!read(proxy->wake[0], c, sizeof(c));
                                continue;
                        }
                        if (map[i] == -2) {
                                int c = accept4(proxy->listen_fd, NULL, NULL,
                                                SOCK_CLOEXEC);
                                int k, s = c >= 0 ? connect_target(proxy) : -1;

                                for (k = 0; k < MAX_PAIRS &&
                                            proxy->pairs[k].client >= 0;
                                     k++)
                                        ;
                                if (c < 0 || s < 0 || k == MAX_PAIRS) {
                                        if (c >= 0)
                                                close(c);
                                        if (s >= 0)
                                                close(s);
                                        continue;
                                }
                                pthread_mutex_lock(&proxy->lock);
                                proxy->pairs[k].client = c;
                                proxy->pairs[k].server = s;
                                pthread_mutex_unlock(&proxy->lock);
                                continue;
                        }
                        p = &proxy->pairs[map[i] / 2];
                        if (p->client < 0)
                                continue; /* closed earlier in this round */
                        ok = map[i] % 2 == 0 ? from_client(proxy, p)
                                             : from_server(proxy, p);
                        if (!ok) {
                                /* Either side gone: so is the other (held
                                 * replies are never forwarded). */
                                pthread_mutex_lock(&proxy->lock);
                                pair_close(p);
                                pthread_cond_broadcast(&proxy->cond);
                                pthread_mutex_unlock(&proxy->lock);
                        }
                }
        }
        return NULL;
}

/* Where the server of \p dsn listens, from a connection to it. */
static void resolve_target(cq_pgproxy_t *proxy, const char *dsn)
{
        PGconn *conn = cq_pgtest_connect(dsn);
        const char *host = PQhost(conn), *port = PQport(conn);

        ck_assert_ptr_nonnull(host);
        ck_assert_ptr_nonnull(port);
        if (host[0] == '/') {
                struct sockaddr_un *un = (struct sockaddr_un *)&proxy->target;

                un->sun_family = AF_UNIX;
                ck_assert_int_lt(snprintf(un->sun_path, sizeof(un->sun_path),
                                          "%s/.s.PGSQL.%s", host, port),
                                 (int)sizeof(un->sun_path));
                proxy->target_len = sizeof(*un);
        } else {
                struct addrinfo hints, *ai = NULL;

                memset(&hints, 0, sizeof(hints));
                hints.ai_socktype = SOCK_STREAM;
                ck_assert_int_eq(getaddrinfo(host, port, &hints, &ai), 0);
                memcpy(&proxy->target, ai->ai_addr, ai->ai_addrlen);
                proxy->target_len = ai->ai_addrlen;
                freeaddrinfo(ai);
        }
        PQfinish(conn);
}

cq_pgproxy_t *cq_pgproxy_start(const char *dsn)
{
        return cq_pgproxy_start_on(dsn, 0);
}

cq_pgproxy_t *cq_pgproxy_start_on(const char *dsn, int port)
{
        cq_pgproxy_t *proxy = calloc(1, sizeof(*proxy));
        struct sockaddr_in addr;
        socklen_t len = sizeof(addr);
        int i, one = 1;

        ck_assert_ptr_nonnull(proxy);
        for (i = 0; i < MAX_PAIRS; i++)
                proxy->pairs[i].client = proxy->pairs[i].server = -1;
        resolve_target(proxy, dsn);
        pthread_mutex_init(&proxy->lock, NULL);
        pthread_cond_init(&proxy->cond, NULL);
        ck_assert_int_eq(pipe2(proxy->wake, O_CLOEXEC | O_NONBLOCK), 0);
        proxy->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(proxy->listen_fd, 0);
        memset(&addr, 0, sizeof(addr));
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons((uint16_t)port);
        /* a port a proxy used before may be taken again at once */
        ck_assert_int_eq(setsockopt(proxy->listen_fd, SOL_SOCKET, SO_REUSEADDR,
                                    &one, sizeof(one)),
                         0);
        ck_assert_int_eq(
            bind(proxy->listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        ck_assert_int_eq(listen(proxy->listen_fd, 16), 0);
        ck_assert_int_eq(
            getsockname(proxy->listen_fd, (struct sockaddr *)&addr, &len), 0);
        proxy->port = ntohs(addr.sin_port);
        ck_assert_int_eq(
            pthread_create(&proxy->thread, NULL, proxy_main, proxy), 0);
        return proxy;
}

void cq_pgproxy_dsn(const cq_pgproxy_t *proxy,
                    const char *dsn,
                    char *out,
                    size_t size)
{
        char base[2048];
        PQconninfoOption *opts = PQconninfoParse(dsn, NULL), *o;
        const char *dbname = NULL, *user = NULL;

        ck_assert_ptr_nonnull(opts);
        for (o = opts; o->keyword; o++) {
                if (strcmp(o->keyword, "dbname") == 0)
                        dbname = o->val;
                else if (strcmp(o->keyword, "user") == 0)
                        user = o->val;
        }
        snprintf(base, sizeof(base), "user='%s' ", user ? user : "");
        ck_assert_int_lt(snprintf(out, size,
                                  "%sdbname='%s' host=127.0.0.1 port=%d "
                                  "sslmode=disable gssencmode=disable",
                                  user ? base : "", dbname ? dbname : "",
                                  proxy->port),
                         (int)size);
        PQconninfoFree(opts);
}

static void wake(cq_pgproxy_t *proxy)
{
        if (write(proxy->wake[1], "w", 1) < 0 && errno != EAGAIN)
                ck_abort_msg("could not wake the proxy: %s", strerror(errno));
}

void cq_pgproxy_hold_after(cq_pgproxy_t *proxy, const char *marker)
{
        pthread_mutex_lock(&proxy->lock);
        snprintf(proxy->marker, sizeof(proxy->marker), "%s", marker);
        pthread_mutex_unlock(&proxy->lock);
}

bool cq_pgproxy_wait_held(cq_pgproxy_t *proxy, int timeout_ms)
{
        int64_t deadline = cq_now_ms() + timeout_ms;
        bool held = false;
        int i;

        pthread_mutex_lock(&proxy->lock);
        while (!held && cq_now_ms() < deadline) {
                struct timespec ts;

                for (i = 0; i < MAX_PAIRS; i++)
                        if (proxy->pairs[i].held && proxy->pairs[i].ready > 0)
                                held = true;
                if (held)
                        break;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 50 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&proxy->cond, &proxy->lock, &ts);
        }
        pthread_mutex_unlock(&proxy->lock);
        return held;
}

void cq_pgproxy_drop_held(cq_pgproxy_t *proxy)
{
        pthread_mutex_lock(&proxy->lock);
        proxy->drop = true;
        wake(proxy);
        while (proxy->drop)
                pthread_cond_wait(&proxy->cond, &proxy->lock);
        pthread_mutex_unlock(&proxy->lock);
}

void cq_pgproxy_stop(cq_pgproxy_t **proxyp)
{
        cq_pgproxy_t *proxy = *proxyp;
        int i;

        if (!proxy)
                return;
        pthread_mutex_lock(&proxy->lock);
        proxy->stop = true;
        pthread_mutex_unlock(&proxy->lock);
        wake(proxy);
        pthread_join(proxy->thread, NULL);
        for (i = 0; i < MAX_PAIRS; i++)
                pair_close(&proxy->pairs[i]);
        close(proxy->listen_fd);
        close(proxy->wake[0]);
        close(proxy->wake[1]);
        pthread_cond_destroy(&proxy->cond);
        pthread_mutex_destroy(&proxy->lock);
        free(proxy);
        *proxyp = NULL;
}
