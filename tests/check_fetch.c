/* SPDX-License-Identifier: MIT */
/* check_fetch.c - job input files given by URL: a capped GET against a
 * local HTTP server (the fake LLM's health endpoint serves as one), and
 * the refusal of non-public addresses, redirects included, against two
 * tiny in-process servers on 127.0.0.1 and 127.0.0.2. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/agent/fetch.h"
#include "coderq/common/util.h"
#include "support/fake_llm.h"
#include "support/loopback.h"

/* The existing cases talk to a loopback server, which needs allowing. */
#define LOOPBACK "127.0.0.1"

static cq_fake_llm_t *fake;

static void setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        fake = cq_fake_llm_start(NULL);
        ck_assert_ptr_nonnull(fake);
}

static void teardown(void)
{
        cq_fake_llm_stop(&fake);
        curl_global_cleanup();
}

static void url_of(const char *path, char *out, size_t size)
{
        snprintf(out, size, "http://127.0.0.1:%d%s", cq_fake_llm_port(fake),
                 path);
}

START_TEST(fetches_a_body)
{
        char url[256], err[256] = "";
        unsigned char *data = NULL;
        size_t len = 0;

        url_of("/_fake/health", url, sizeof(url));
        ck_assert_int_eq(cq_fetch_url(url, 1024, 10, LOOPBACK, &data, &len, err,
                                      sizeof(err)),
                         CQ_OK);
        ck_assert_ptr_nonnull(data);
        ck_assert_msg(len > 0 && memmem(data, len, "\"ok\"", 4), "%.*s",
                      (int)len, data);
        free(data);
}
END_TEST

START_TEST(refuses_a_body_over_the_cap)
{
        char url[256], err[256] = "";
        unsigned char *data = NULL;
        size_t len = 0;

        url_of("/_fake/health", url, sizeof(url));
        ck_assert_int_eq(
            cq_fetch_url(url, 4, 10, LOOPBACK, &data, &len, err, sizeof(err)),
            CQ_ERR_TOO_LARGE);
        ck_assert_ptr_null(data);
        ck_assert_msg(strstr(err, "larger than 4 bytes"), "%s", err);
}
END_TEST

START_TEST(classifies_failures)
{
        char url[256], err[256] = "";
        unsigned char *data = NULL;
        size_t len = 0;

        url_of("/no/such/path", url, sizeof(url));
        ck_assert_int_eq(cq_fetch_url(url, 1024, 10, LOOPBACK, &data, &len, err,
                                      sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "HTTP status 404"), "%s", err);
        ck_assert_int_eq(cq_fetch_url("file:///etc/passwd", 1024, 10, LOOPBACK,
                                      &data, &len, err, sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "only http and https"), "%s", err);
        /* nothing listens on port 1 */
        ck_assert_int_eq(cq_fetch_url("http://127.0.0.1:1/x", 1024, 10,
                                      LOOPBACK, &data, &len, err, sizeof(err)),
                         CQ_ERR_RETRIABLE);
        ck_assert_ptr_null(data);
}
END_TEST

/* ---- a minimal HTTP server: "/ok" answers "hello", "/to/<url>" answers
 * 302 to <url>; it counts the requests it received ---- */

typedef struct mini {
        int fd, port;
        pthread_t thread;
        atomic_int stop, requests;
        int stalled[8]; /* connections of "/stall", held open */
        size_t nstalled;
} mini_t;

static void *mini_main(void *arg)
{
        mini_t *m = arg;

        while (!atomic_load(&m->stop)) {
                char req[2048], path[1024], reply[1400];
                int c = cq_loopback_accept(m->fd, 50, req, sizeof(req));

                if (c < 0)
                        continue;
                atomic_fetch_add(&m->requests, 1);
                if (sscanf(req, "GET %1023s", path) != 1)
                        path[0] = '\0';
                if (strcmp(path, "/stall") == 0 &&
                    m->nstalled < CQ_ARRAY_SIZE(m->stalled)) {
                        /* a body that never comes: headers, one byte */
                        static const char head[] =
                            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nx";

                        if (write(c, head, sizeof(head) - 1) < 0)
                                perror("mini server write");
                        m->stalled[m->nstalled++] = c;
                        continue;
                }
                if (strncmp(path, "/to/", 4) == 0)
                        snprintf(reply, sizeof(reply),
                                 "HTTP/1.1 302 Found\r\nLocation: %s\r\n"
                                 "Content-Length: 0\r\nConnection: "
                                 "close\r\n\r\n",
                                 path + 4);
                else
                        snprintf(reply, sizeof(reply),
                                 "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"
                                 "Connection: close\r\n\r\nhello");
                if (write(c, reply, strlen(reply)) < 0)
                        perror("mini server write");
                close(c);
        }
        return NULL;
}

static void mini_start(mini_t *m, const char *ip)
{
        memset(m, 0, sizeof(*m));
        m->fd = cq_loopback_listen(ip, &m->port);
        ck_assert_int_eq(pthread_create(&m->thread, NULL, mini_main, m), 0);
}

static void mini_stop(mini_t *m)
{
        size_t i;

        atomic_store(&m->stop, 1);
        pthread_join(m->thread, NULL);
        for (i = 0; i < m->nstalled; i++)
                close(m->stalled[i]);
        close(m->fd);
}

static mini_t one, two; /* on 127.0.0.1 and 127.0.0.2 */

static void ssrf_setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        mini_start(&one, "127.0.0.1");
        mini_start(&two, "127.0.0.2");
}

static void ssrf_teardown(void)
{
        mini_stop(&one);
        mini_stop(&two);
        curl_global_cleanup();
}

static cq_err_t
get(const char *url, const char *allow, char *body, char *err, size_t size)
{
        unsigned char *data = NULL;
        size_t len = 0;
        cq_err_t rc;

        err[0] = body[0] = '\0';
        rc = cq_fetch_url(url, 1024, 10, allow, &data, &len, err, size);
        if (rc == CQ_OK)
                snprintf(body, size, "%.*s", (int)len, (const char *)data);
        free(data);
        return rc;
}

START_TEST(refuses_loopback_by_default)
{
        char url[256], body[256], err[256];

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/ok", one.port);
        ck_assert_int_eq(get(url, NULL, body, err, sizeof(err)), CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "non-public address 127.0.0.1"), "%s", err);
        /* refused before connecting: the server never saw it */
        ck_assert_int_eq(atomic_load(&one.requests), 0);
        /* the IPv4-mapped IPv6 form of the same address */
        snprintf(url, sizeof(url), "http://[::ffff:127.0.0.1]:%d/ok", one.port);
        ck_assert_int_eq(get(url, NULL, body, err, sizeof(err)), CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "non-public address"), "%s", err);
        /* a name that resolves to loopback */
        snprintf(url, sizeof(url), "http://localhost:%d/ok", one.port);
        ck_assert_int_eq(get(url, NULL, body, err, sizeof(err)), CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "non-public address"), "%s", err);
        /* the cloud metadata address, refused without any network */
        ck_assert_int_eq(get("http://169.254.169.254/latest/meta-data/", NULL,
                             body, err, sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "non-public address 169.254.169.254"), "%s",
                      err);
        ck_assert_int_eq(atomic_load(&one.requests), 0);
}
END_TEST

START_TEST(allowlist_admits_internal_hosts)
{
        char url[256], body[256], err[256];

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/ok", one.port);
        ck_assert_int_eq(
            get(url, "10.0.0.0/8, 127.0.0.1", body, err, sizeof(err)), CQ_OK);
        ck_assert_str_eq(body, "hello");
        ck_assert_int_eq(get(url, "127.0.0.0/8", body, err, sizeof(err)),
                         CQ_OK);
        ck_assert_str_eq(body, "hello");
        /* by host name: any address of that host */
        snprintf(url, sizeof(url), "http://localhost:%d/ok", one.port);
        ck_assert_int_eq(get(url, "LocalHost", body, err, sizeof(err)), CQ_OK);
        ck_assert_str_eq(body, "hello");
        /* a block that does not cover it */
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/ok", one.port);
        ck_assert_int_eq(get(url, "127.0.0.2/32", body, err, sizeof(err)),
                         CQ_ERR_FATAL);
        /* a malformed allowlist is an error, not "allow nothing" */
        ck_assert_int_eq(get(url, "127.0.0.1/40", body, err, sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "invalid CODERQ_FETCH_ALLOW entry"), "%s",
                      err);
        ck_assert_int_eq(
            cq_fetch_allow_check("10.0.0.0/8,::1,files.lan", err, sizeof(err)),
            0);
        ck_assert_int_eq(cq_fetch_allow_check("10.0.0.0/x", err, sizeof(err)),
                         -1);
        ck_assert_int_eq(cq_fetch_allow_check("a b", err, sizeof(err)), -1);
}
END_TEST

START_TEST(checks_every_redirect)
{
        char url[256], body[256], err[256];

        /* allowed 127.0.0.1 redirects to refused 127.0.0.2 */
        snprintf(url, sizeof(url),
                 "http://127.0.0.1:%d/to/http://"
                 "127.0.0.2:%d/ok",
                 one.port, two.port);
        ck_assert_int_eq(get(url, "127.0.0.1", body, err, sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "non-public address 127.0.0.2"), "%s", err);
        ck_assert_int_eq(atomic_load(&one.requests), 1);
        ck_assert_int_eq(atomic_load(&two.requests), 0);
        /* both allowed: the redirect is followed */
        ck_assert_int_eq(
            get(url, "127.0.0.1,127.0.0.2", body, err, sizeof(err)), CQ_OK);
        ck_assert_str_eq(body, "hello");
        ck_assert_int_eq(atomic_load(&two.requests), 1);
        /* a redirect loop ends */
        snprintf(url, sizeof(url),
                 "http://127.0.0.1:%d/to/http://127.0.0.1:%d/to/http://"
                 "127.0.0.1:%d/to/http://127.0.0.1:%d/to/http://"
                 "127.0.0.1:%d/to/http://127.0.0.1:%d/to/http://"
                 "127.0.0.1:%d/ok",
                 one.port, one.port, one.port, one.port, one.port, one.port,
                 one.port);
        ck_assert_int_eq(get(url, "127.0.0.1", body, err, sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "more than 5 redirects"), "%s", err);
        /* to another scheme */
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/to/file:///etc/passwd",
                 one.port);
        ck_assert_int_eq(get(url, "127.0.0.1", body, err, sizeof(err)),
                         CQ_ERR_FATAL);
}
END_TEST

static bool is_public(const char *ip)
{
        struct sockaddr_in sin = {0};
        struct sockaddr_in6 sin6 = {0};

        if (inet_pton(AF_INET, ip, &sin.sin_addr) == 1) {
                sin.sin_family = AF_INET;
                return cq_fetch_addr_is_public((struct sockaddr *)&sin);
        }
        ck_assert_int_eq(inet_pton(AF_INET6, ip, &sin6.sin6_addr), 1);
        sin6.sin6_family = AF_INET6;
        return cq_fetch_addr_is_public((struct sockaddr *)&sin6);
}

static void *raise_soon(void *opaque)
{
        struct timespec ts = {0, 300 * 1000000L};

        nanosleep(&ts, NULL);
        atomic_store((atomic_int *)opaque, 1);
        return NULL;
}

/* A server that sends headers and then nothing holds a fetch only until
 * its deadline (a job's time limit), or until the job is cancelled:
 * without either this one would wait the whole 120 s of the test's
 * default. */
START_TEST(deadline_and_cancel_end_a_stalled_fetch)
{
        char url[256], err[256] = "";
        unsigned char *data = NULL;
        size_t len = 0;
        atomic_int cancel = 0;
        pthread_t thread;

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/stall", one.port);
        ck_assert_int_eq(cq_fetch_url_until(url, 1024, cq_now_ms() + 500, NULL,
                                            LOOPBACK, &data, &len, err,
                                            sizeof(err)),
                         CQ_ERR_RETRIABLE);
        ck_assert_msg(strstr(err, "its deadline passed"), "%s", err);
        ck_assert_ptr_null(data);
        /* a deadline already past sends nothing */
        ck_assert_int_eq(cq_fetch_url_until(url, 1024, cq_now_ms() - 1, NULL,
                                            LOOPBACK, &data, &len, err,
                                            sizeof(err)),
                         CQ_ERR_RETRIABLE);
        ck_assert_int_eq(atomic_load(&one.requests), 1);
        ck_assert_int_eq(pthread_create(&thread, NULL, raise_soon, &cancel), 0);
        ck_assert_int_eq(cq_fetch_url_until(url, 1024, cq_now_ms() + 120000,
                                            &cancel, LOOPBACK, &data, &len, err,
                                            sizeof(err)),
                         CQ_ERR_RETRIABLE);
        pthread_join(thread, NULL);
        ck_assert_msg(strstr(err, "cancelled"), "%s", err);
        ck_assert_ptr_null(data);
}
END_TEST

START_TEST(classifies_addresses)
{
        static const char *const refused[] = {"0.0.0.0",
                                              "10.1.2.3",
                                              "100.64.0.1",
                                              "127.0.0.1",
                                              "127.255.0.9",
                                              "169.254.169.254",
                                              "172.16.0.1",
                                              "172.31.255.255",
                                              "192.168.1.1",
                                              "224.0.0.1",
                                              "255.255.255.255",
                                              "198.18.0.1",
                                              "::",
                                              "::1",
                                              "::ffff:127.0.0.1",
                                              "::ffff:10.0.0.1",
                                              "::127.0.0.1",
                                              "fe80::1",
                                              "fc00::1",
                                              "fd12:3456::1",
                                              "ff02::1",
                                              "64:ff9b::a9fe:a9fe",
                                              "2002:7f00:1::",
                                              "2001:db8::1",
                                              "2001::1",
                                              "fec0::1"};
        static const char *const allowed[] = {
            "1.1.1.1",        "8.8.8.8",          "172.32.0.1",
            "100.128.0.1",    "93.184.216.34",    "2606:4700::1111",
            "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"};
        size_t i;

        for (i = 0; i < sizeof(refused) / sizeof(*refused); i++)
                ck_assert_msg(!is_public(refused[i]), "%s", refused[i]);
        for (i = 0; i < sizeof(allowed) / sizeof(*allowed); i++)
                ck_assert_msg(is_public(allowed[i]), "%s", allowed[i]);
}
END_TEST

static Suite *fetch_suite(void)
{
        Suite *s = suite_create("fetch");
        TCase *tc = tcase_create("get");
        TCase *ssrf = tcase_create("ssrf");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_test(tc, fetches_a_body);
        tcase_add_test(tc, refuses_a_body_over_the_cap);
        tcase_add_test(tc, classifies_failures);
        suite_add_tcase(s, tc);
        tcase_add_checked_fixture(ssrf, ssrf_setup, ssrf_teardown);
        tcase_add_test(ssrf, refuses_loopback_by_default);
        tcase_add_test(ssrf, allowlist_admits_internal_hosts);
        tcase_add_test(ssrf, checks_every_redirect);
        tcase_add_test(ssrf, classifies_addresses);
        tcase_add_test(ssrf, deadline_and_cancel_end_a_stalled_fetch);
        suite_add_tcase(s, ssrf);
        return s;
}

CQ_CHECK_MAIN(fetch_suite)
