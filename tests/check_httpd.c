/* SPDX-License-Identifier: MIT */
/* check_httpd.c - the worker's HTTP server: the request parser on good,
 * incomplete and malformed heads; a live server answering GET and HEAD,
 * 404 and 405; malformed requests (a table, then random and mutated
 * bytes) that get 400 or a closed connection and never stop the server;
 * a head over the cap; idle connections closed at their deadline; more
 * clients than connections; bad listen addresses. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/worker/httpd.h"

START_TEST(httpd_parse_cases)
{
        static const struct {
                const char *head;
                int status;
                const char *path;
        } cases[] = {
            {"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 200, "/metrics"},
            {"GET /metrics?x=1&y HTTP/1.0\r\n\r\n", 200, "/metrics"},
            {"HEAD /readyz HTTP/1.1\n\n", 200, "/readyz"},
            {"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 200, "/"},
            {"GET /metrics HTTP/1.1\r\nHost: x\r\n", 0, NULL},
            {"GET /met", 0, NULL},
            {"", 0, NULL},
            {"POST /metrics HTTP/1.1\r\n\r\n", 405, NULL},
            {"DELETE / HTTP/1.1\r\n\r\n", 405, NULL},
            {"GET /metrics\r\n\r\n", 400, NULL},
            {"GET  /metrics HTTP/1.1\r\n\r\n", 400, NULL},
            {"GET metrics HTTP/1.1\r\n\r\n", 400, NULL},
            {"GET /metrics HTTP/2.0\r\n\r\n", 400, NULL},
            {"GET /metrics HTTP/1.1 extra\r\n\r\n", 400, NULL},
            {"GET /a\x01"
             "z HTTP/1.1\r\n\r\n",
             400, NULL},
            {"G(T / HTTP/1.1\r\n\r\n", 400, NULL},
            {"\r\n\r\n", 400, NULL},
            {"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, NULL},
            {"GET / HTTP/1.1\r\n: empty name\r\n\r\n", 400, NULL},
            {"GET / HTTP/1.1\r\nba d: x\r\n\r\n", 400, NULL},
            {"GET / HTTP/1.1\r\nX: a\x02"
             "b\r\n\r\n",
             400, NULL},
            {"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400, NULL},
            {"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, NULL},
        };
        cq_httpd_req_t req;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                int status =
                    cq_httpd_parse(cases[i].head, strlen(cases[i].head), &req);

                ck_assert_msg(status == cases[i].status, "case %zu: %d, not %d",
                              i, status, cases[i].status);
                if (cases[i].path)
                        ck_assert_str_eq(req.path, cases[i].path);
        }
        ck_assert_int_eq(cq_httpd_parse("HEAD / HTTP/1.1\r\n\r\n", 19, &req),
                         200);
        ck_assert(req.head);
        /* a NUL inside the head */
        ck_assert_int_eq(cq_httpd_parse("GET /\0 HTTP/1.1\r\n\r\n", 20, &req),
                         400);
}
END_TEST

START_TEST(httpd_parse_bounds)
{
        char *big = malloc(CQ_HTTPD_HEAD_MAX + 16);
        cq_httpd_req_t req;
        size_t n;

        ck_assert_ptr_nonnull(big);
        /* a head that never ends, at the cap: refused, not waited for */
        n = (size_t)snprintf(big, CQ_HTTPD_HEAD_MAX + 16,
                             "GET / HTTP/1.1\r\nX: ");
        memset(big + n, 'a', CQ_HTTPD_HEAD_MAX - n);
        ck_assert_int_eq(cq_httpd_parse(big, CQ_HTTPD_HEAD_MAX, &req), 400);
        ck_assert_int_eq(cq_httpd_parse(big, CQ_HTTPD_HEAD_MAX - 1, &req), 0);
        /* a path over CQ_HTTPD_PATH_MAX */
        n = (size_t)snprintf(big, 8, "GET /");
        memset(big + n, 'p', CQ_HTTPD_PATH_MAX);
        n += CQ_HTTPD_PATH_MAX;
        n += (size_t)snprintf(big + n, 32, " HTTP/1.1\r\n\r\n");
        ck_assert_int_eq(cq_httpd_parse(big, n, &req), 400);
        free(big);
}
END_TEST

static int handler(void *opaque,
                   const char *path,
                   cq_buf_t *body,
                   const char **content_typep)
{
        (void)opaque;
        if (strcmp(path, "/hello") == 0) {
                *content_typep = "text/x-test";
                return cq_buf_append_str(body, "hello\n") == CQ_OK ? 200 : 500;
        }
        if (strcmp(path, "/big") == 0) {
                size_t i;

                for (i = 0; i < 100000; i++)
                        if (cq_buf_append_str(body, "0123456789") != CQ_OK)
                                return 500;
                return 200;
        }
        return 404;
}

static cq_httpd_t *start(size_t max_conns, int timeout_ms)
{
        cq_httpd_opts_t opts;
        char errstr[256] = "";
        cq_httpd_t *h;

        memset(&opts, 0, sizeof(opts));
        opts.addr = "127.0.0.1:0";
        opts.max_conns = max_conns;
        opts.timeout_ms = timeout_ms;
        opts.handler = handler;
        h = cq_httpd_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(h != NULL, "%s", errstr);
        ck_assert_int_gt(cq_httpd_port(h), 0);
        return h;
}

static int dial(int port)
{
        struct sockaddr_in sa;
        int fd = socket(AF_INET, SOCK_STREAM, 0);

        ck_assert_int_ge(fd, 0);
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        return fd;
}

/* Everything the server sends until it closes (at most 10 s); caller
 * frees. */
static char *read_all(int fd, size_t *lenp)
{
        cq_buf_t buf;
        char chunk[65536];
        char *out;

        cq_buf_init(&buf, 8 << 20);
        for (;;) {
                struct pollfd pfd = {fd, POLLIN, 0};
                ssize_t n;

                if (poll(&pfd, 1, 10000) != 1)
                        break;
                n = read(fd, chunk, sizeof(chunk));
                if (n <= 0)
                        break;
                ck_assert_int_eq(cq_buf_append(&buf, chunk, (size_t)n), CQ_OK);
        }
        if (lenp)
                *lenp = buf.len;
        out = cq_buf_take(&buf, NULL);
        return out ? out : strdup("");
}

/* Send \p req (\p len bytes) on a new connection; the reply. */
static char *exchange(int port, const void *req, size_t len)
{
        int fd = dial(port);
        char *reply;

        if (len)
                ck_assert_int_eq(send(fd, req, len, MSG_NOSIGNAL), (long)len);
        shutdown(fd, SHUT_WR);
        reply = read_all(fd, NULL);
        close(fd);
        return reply;
}

static void assert_alive(int port)
{
        static const char req[] = "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n";
        char *reply = exchange(port, req, strlen(req));

        ck_assert_msg(strncmp(reply, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s",
                      reply);
        free(reply);
}

START_TEST(httpd_serves_get_head_and_errors)
{
        cq_httpd_t *h = start(4, 2000);
        int port = cq_httpd_port(h);
        char *reply;
        size_t len;
        int fd;

        reply = exchange(port, "GET /hello?x HTTP/1.1\r\n\r\n", 25);
        ck_assert_str_eq(reply,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/x-test\r\n"
                         "Content-Length: 6\r\nConnection: close\r\n"
                         "\r\nhello\n");
        free(reply);
        reply = exchange(port, "HEAD /hello HTTP/1.1\r\n\r\n", 24);
        ck_assert_str_eq(reply,
                         "HTTP/1.1 200 OK\r\nContent-Type: text/x-test\r\n"
                         "Content-Length: 6\r\nConnection: close\r\n"
                         "\r\n");
        free(reply);
        reply = exchange(port, "GET /nope HTTP/1.1\r\n\r\n", 22);
        ck_assert_ptr_nonnull(strstr(reply, "HTTP/1.1 404 Not Found\r\n"));
        free(reply);
        reply = exchange(port, "PUT /hello HTTP/1.1\r\n\r\n", 23);
        ck_assert_ptr_nonnull(strstr(reply, "HTTP/1.1 405 "));
        ck_assert_ptr_nonnull(strstr(reply, "\r\nAllow: GET, HEAD\r\n"));
        free(reply);
        reply = exchange(port, "hello\r\n\r\n", 9);
        ck_assert_ptr_nonnull(strstr(reply, "HTTP/1.1 400 Bad Request\r\n"));
        free(reply);
        /* a body of 1 MB, written in pieces as the socket takes them */
        fd = dial(port);
        ck_assert_int_eq(send(fd, "GET /big HTTP/1.1\r\n\r\n", 21, 0), 21);
        reply = read_all(fd, &len);
        close(fd);
        ck_assert_ptr_nonnull(strstr(reply, "Content-Length: 1000000\r\n"));
        ck_assert_uint_eq(len - (size_t)(strstr(reply, "\r\n\r\n") + 4 - reply),
                          1000000);
        free(reply);
        cq_httpd_destroy(&h);
        ck_assert_ptr_null(h);
}
END_TEST

START_TEST(httpd_malformed_requests_never_stop_it)
{
        static const char *const bad[] = {
            "GET\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "GET / HTTP/9.9\r\n\r\n",
            "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", /* TLS */
            "GET /\xff\xfe HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\n\r",
        };
        cq_httpd_t *h = start(4, 1000);
        int port = cq_httpd_port(h);
        unsigned int seed = 15;
        char base[] = "GET /hello HTTP/1.1\r\nHost: t\r\nAccept: */*\r\n\r\n";
        char *big = malloc(CQ_HTTPD_HEAD_MAX * 2);
        char junk[512], *reply;
        size_t i, k;

        ck_assert_ptr_nonnull(big);
        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                reply = exchange(port, bad[i], strlen(bad[i]));
                ck_assert_msg(reply[0] == '\0' ||
                                  strncmp(reply, "HTTP/1.1 400 ", 13) == 0,
                              "case %zu: %s", i, reply);
                free(reply);
        }
        /* NUL bytes in a header */
        reply = exchange(port, "GET / HTTP/1.1\r\nX\0\0: y\r\n\r\n", 26);
        ck_assert_msg(strncmp(reply, "HTTP/1.1 400 ", 13) == 0, "%s", reply);
        free(reply);
        /* a head past the cap: 400 once the cap is reached */
        memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
        memset(big + 19, 'x', CQ_HTTPD_HEAD_MAX * 2 - 19);
        reply = exchange(port, big, CQ_HTTPD_HEAD_MAX * 2);
        ck_assert_msg(strncmp(reply, "HTTP/1.1 400 ", 13) == 0, "%s", reply);
        free(reply);
        /* random bytes, and the good request with bytes flipped */
        for (i = 0; i < 300; i++) {
                size_t n = 1 + (size_t)rand_r(&seed) % sizeof(junk);

                if (i % 2) {
                        for (k = 0; k < n; k++)
                                junk[k] = (char)(rand_r(&seed) & 0xff);
                } else {
                        n = sizeof(base) - 1;
                        memcpy(junk, base, n);
                        for (k = 0; k < 3; k++)
                                junk[(size_t)rand_r(&seed) % n] =
                                    (char)(rand_r(&seed) & 0xff);
                }
                reply = exchange(port, junk, n);
                ck_assert_msg(reply[0] == '\0' ||
                                  strncmp(reply, "HTTP/1.1 ", 9) == 0,
                              "round %zu: %s", i, reply);
                free(reply);
        }
        /* the same, straight into the parser */
        for (i = 0; i < 20000; i++) {
                cq_httpd_req_t req;
                size_t n = (size_t)rand_r(&seed) % sizeof(junk);
                int status;

                for (k = 0; k < n; k++)
                        junk[k] = (char)(rand_r(&seed) & 0xff);
                status = cq_httpd_parse(junk, n, &req);
                ck_assert(status == 0 || status == 200 || status == 400 ||
                          status == 405);
        }
        assert_alive(port);
        free(big);
        cq_httpd_destroy(&h);
}
END_TEST

START_TEST(httpd_idle_and_excess_connections)
{
        cq_httpd_t *h = start(2, 300);
        int port = cq_httpd_port(h);
        int idle[4];
        char *reply;
        size_t i;

        /* more clients than connections, none sending: each is closed at
         * its deadline, the waiting ones are then taken, and a real
         * request gets through after them */
        for (i = 0; i < CQ_ARRAY_SIZE(idle); i++)
                idle[i] = dial(port);
        assert_alive(port);
        for (i = 0; i < CQ_ARRAY_SIZE(idle); i++) {
                reply = read_all(idle[i], NULL);
                ck_assert_str_eq(reply, "");
                free(reply);
                close(idle[i]);
        }
        /* half a request, then silence */
        idle[0] = dial(port);
        ck_assert_int_eq(send(idle[0], "GET /hel", 8, 0), 8);
        reply = read_all(idle[0], NULL);
        ck_assert_str_eq(reply, "");
        free(reply);
        close(idle[0]);
        assert_alive(port);
        cq_httpd_destroy(&h);
}
END_TEST

START_TEST(httpd_bad_addresses)
{
        static const char *const addrs[] = {"9464",      "host",     ":",
                                            ":99999",    ":12a",     "::1:9464",
                                            "[::1]9464", "[::1:9464"};
        cq_httpd_opts_t opts;
        char errstr[256];
        cq_httpd_t *h, *h2;
        char addr[32];
        size_t i;

        memset(&opts, 0, sizeof(opts));
        opts.handler = handler;
        for (i = 0; i < CQ_ARRAY_SIZE(addrs); i++) {
                errstr[0] = '\0';
                opts.addr = addrs[i];
                ck_assert_ptr_null(cq_httpd_new(&opts, errstr, sizeof(errstr)));
                ck_assert_msg(strstr(errstr, "could not listen on \""),
                              "%s: %s", addrs[i], errstr);
        }
        /* a port in use */
        opts.addr = "127.0.0.1:0";
        h = cq_httpd_new(&opts, errstr, sizeof(errstr));
        ck_assert_ptr_nonnull(h);
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", cq_httpd_port(h));
        opts.addr = addr;
        h2 = cq_httpd_new(&opts, errstr, sizeof(errstr));
        ck_assert_ptr_null(h2);
        ck_assert_ptr_nonnull(strstr(errstr, "Address already in use"));
        /* ":PORT" listens on every interface */
        opts.addr = ":0";
        h2 = cq_httpd_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(h2 != NULL, "%s", errstr);
        assert_alive(cq_httpd_port(h2));
        cq_httpd_destroy(&h2);
        cq_httpd_destroy(&h);
}
END_TEST

static Suite *httpd_suite(void)
{
        Suite *s = suite_create("httpd");
        TCase *tc = tcase_create("httpd");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, httpd_parse_cases);
        tcase_add_test(tc, httpd_parse_bounds);
        tcase_add_test(tc, httpd_serves_get_head_and_errors);
        tcase_add_test(tc, httpd_malformed_requests_never_stop_it);
        tcase_add_test(tc, httpd_idle_and_excess_connections);
        tcase_add_test(tc, httpd_bad_addresses);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(httpd_suite)
