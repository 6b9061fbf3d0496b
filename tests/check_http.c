/* SPDX-License-Identifier: MIT */
/* check_http.c - the HTTP client against a scripted in-process server on
 * 127.0.0.1: the body cap (by Content-Length and while streaming), the
 * deadline, the cancel flag and the tick ending a silent server,
 * Retry-After in both forms and as garbage, the address hook, redirects
 * left to the caller, and secrets kept out of every message. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "coderq/http/http.h"
#include "support/loopback.h"

/* ---- a server that gives every request the same scripted reply ---- */

typedef struct reply {
        int status;
        const char *headers; /* extra lines, each ending in "\r\n" */
        size_t body_len;     /* that many 'x' */
        bool chunked;        /* no Content-Length: the size comes late */
        int delay_ms;        /* silence before the reply */
} reply_t;

typedef struct server {
        int fd, port;
        pthread_t thread;
        atomic_int stop, requests;
        reply_t reply; /* set before server_start(), then read-only */
} server_t;

static bool send_all(int c, const char *p, size_t n)
{
        while (n) {
                ssize_t w = send(c, p, n, MSG_NOSIGNAL);

                if (w <= 0)
                        return false;
                p += w;
                n -= (size_t)w;
        }
        return true;
}

/* Wait \p ms unless the client hangs up or the server stops. */
static void stall(server_t *srv, int c, int ms)
{
        int64_t end = cq_now_ms() + ms;
        char buf[256];

        while (!atomic_load(&srv->stop) && cq_now_ms() < end) {
                struct pollfd pfd = {c, POLLIN, 0};

                if (poll(&pfd, 1, 20) > 0 && read(c, buf, sizeof(buf)) <= 0)
                        return;
        }
}

static void answer(server_t *srv, int c)
{
        const reply_t *r = &srv->reply;
        char head[2048], chunk[4096], size[32];
        size_t left = r->body_len;

        memset(chunk, 'x', sizeof(chunk));
        if (r->delay_ms)
                stall(srv, c, r->delay_ms);
        if (r->chunked)
                snprintf(head, sizeof(head),
                         "HTTP/1.1 %d Scripted\r\n%sTransfer-Encoding: "
                         "chunked\r\nConnection: close\r\n\r\n",
                         r->status, r->headers ? r->headers : "");
        else
                snprintf(head, sizeof(head),
                         "HTTP/1.1 %d Scripted\r\n%sContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n",
                         r->status, r->headers ? r->headers : "", left);
        if (!send_all(c, head, strlen(head)))
                return;
        while (left) {
                size_t n = left < sizeof(chunk) ? left : sizeof(chunk);

                snprintf(size, sizeof(size), "%zx\r\n", n);
                if ((r->chunked && !send_all(c, size, strlen(size))) ||
                    !send_all(c, chunk, n) ||
                    (r->chunked && !send_all(c, "\r\n", 2)))
                        return;
                left -= n;
        }
        if (r->chunked)
                (void)send_all(c, "0\r\n\r\n", 5);
}

static void *server_main(void *arg)
{
        server_t *srv = arg;

        while (!atomic_load(&srv->stop)) {
                char req[4096];
                int c = cq_loopback_accept(srv->fd, 20, req, sizeof(req));

                if (c < 0)
                        continue;
                atomic_fetch_add(&srv->requests, 1);
                answer(srv, c);
                close(c);
        }
        return NULL;
}

static void server_start(server_t *srv, const reply_t *reply)
{
        memset(srv, 0, sizeof(*srv));
        srv->reply = *reply;
        srv->fd = cq_loopback_listen("127.0.0.1", &srv->port);
        ck_assert_int_eq(pthread_create(&srv->thread, NULL, server_main, srv),
                         0);
}

static void server_stop(server_t *srv)
{
        atomic_store(&srv->stop, 1);
        pthread_join(srv->thread, NULL);
        close(srv->fd);
}

static cq_http_t *new_http(const char *const *secrets, size_t nsecrets)
{
        cq_http_conf_t conf = {0};
        char err[256];
        cq_http_t *http;

        conf.user_agent = "coderq-test";
        conf.secrets = secrets;
        conf.nsecrets = nsecrets;
        http = cq_http_new(&conf, err, sizeof(err));
        ck_assert_msg(http != NULL, "%s", err);
        return http;
}

/* One test's server, client and request. */
typedef struct fixture {
        server_t srv;
        cq_http_t *http;
        cq_http_req_t req;
        cq_http_res_t res;
        char url[128];
} fixture_t;

/* Serve \p reply and aim a request with a cap of \p max at \p path. */
static void
begin(fixture_t *fx, const reply_t *reply, const char *path, size_t max)
{
        memset(fx, 0, sizeof(*fx));
        server_start(&fx->srv, reply);
        fx->http = new_http(NULL, 0);
        cq_http_res_init(&fx->res);
        snprintf(fx->url, sizeof(fx->url), "http://127.0.0.1:%d%s",
                 fx->srv.port, path);
        fx->req.url = fx->url;
        fx->req.max = max;
}

static void end(fixture_t *fx)
{
        cq_http_res_release(&fx->res);
        ck_assert_ptr_null(fx->res.redirect_url);
        cq_http_destroy(&fx->http);
        ck_assert_ptr_null(fx->http);
        server_stop(&fx->srv);
}

static cq_http_outcome_t perform(fixture_t *fx)
{
        return cq_http_perform(fx->http, &fx->req, &fx->res);
}

static void setup(void) { ck_assert_int_eq(cq_http_global_init(), 0); }

static void teardown(void) { cq_http_global_cleanup(); }

/* ---- bodies ---- */

typedef struct seen {
        char test_header[64];
        long status;
        size_t bytes;
        int stop_after; /* the sink says stop after this many calls; 0: never */
        int calls;
} seen_t;

static void note_header(void *opaque, const char *name, const char *value)
{
        seen_t *seen = opaque;

        if (strcmp(name, "X-Test") == 0)
                snprintf(seen->test_header, sizeof(seen->test_header), "%s",
                         value);
}

static int count_body(void *opaque, long status, const char *data, size_t len)
{
        seen_t *seen = opaque;

        seen->status = status;
        seen->bytes += len;
        ck_assert(memchr(data, 'y', len) == NULL);
        return ++seen->calls == seen->stop_after ? -1 : 0;
}

START_TEST(reads_a_body_within_the_cap)
{
        reply_t reply = {200, "X-Test:   yes, trimmed  \r\n", 1000, false, 0};
        fixture_t fx;
        seen_t seen = {0};

        begin(&fx, &reply, "/body", 1000);
        fx.req.on_header = note_header;
        fx.req.opaque = &seen;
        ck_assert_int_eq(perform(&fx), CQ_HTTP_OK);
        ck_assert_int_eq(fx.res.status, 200);
        ck_assert_uint_eq(fx.res.body.len, 1000);
        ck_assert_int_eq(fx.res.body.data[999], 'x');
        ck_assert_str_eq(fx.res.error, "");
        ck_assert_str_eq(seen.test_header, "yes, trimmed");
        ck_assert_int_eq(fx.res.retry_after_ms, -1);
        ck_assert_ptr_null(fx.res.redirect_url);

        /* a sink takes a body of any length, the buffer stays empty */
        fx.req.max = 10;
        fx.req.sink = count_body;
        ck_assert_int_eq(perform(&fx), CQ_HTTP_OK);
        ck_assert_int_eq(seen.status, 200);
        ck_assert_uint_eq(seen.bytes, 1000);
        ck_assert_uint_eq(fx.res.body.len, 0);
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 2);
        end(&fx);
}
END_TEST

START_TEST(a_body_over_the_cap_ends_the_request)
{
        reply_t reply = {200, NULL, 100000, false, 0};
        fixture_t fx;
        seen_t seen = {0};

        /* announced by Content-Length */
        begin(&fx, &reply, "/big", 4096);
        ck_assert_int_eq(perform(&fx), CQ_HTTP_TOO_LARGE);
        ck_assert_msg(strstr(fx.res.error, "exceeds 4096 bytes"), "%s",
                      fx.res.error);
        ck_assert_uint_le(fx.res.body.len, 4096);
        end(&fx);

        /* found while streaming: no length said up front */
        reply.chunked = true;
        begin(&fx, &reply, "/big", 4096);
        ck_assert_int_eq(perform(&fx), CQ_HTTP_TOO_LARGE);
        ck_assert_int_eq(fx.res.code, CURLE_WRITE_ERROR);
        ck_assert_uint_le(fx.res.body.len, 4096);
        ck_assert_msg(strstr(fx.res.error, "exceeds 4096 bytes"), "%s",
                      fx.res.error);
        /* the same body fits a larger cap */
        fx.req.max = 100000;
        ck_assert_int_eq(perform(&fx), CQ_HTTP_OK);
        ck_assert_uint_eq(fx.res.body.len, 100000);

        /* a sink that says stop */
        seen.stop_after = 1;
        fx.req.sink = count_body;
        fx.req.opaque = &seen;
        ck_assert_int_eq(perform(&fx), CQ_HTTP_ABORTED);
        ck_assert_int_eq(seen.calls, 1);
        end(&fx);
}
END_TEST

/* ---- deadline, cancel, tick ---- */

START_TEST(the_deadline_ends_a_silent_server)
{
        reply_t reply = {200, NULL, 10, false, 20000};
        fixture_t fx;
        int64_t t0;

        begin(&fx, &reply, "/slow", 100);
        fx.req.timeout_ms = 60000;
        t0 = cq_now_ms();
        fx.req.deadline_ms = t0 + 300;
        /* without the deadline this would succeed after 20 s */
        ck_assert_int_eq(perform(&fx), CQ_HTTP_DEADLINE);
        ck_assert_int_ge(cq_now_ms() - t0, 290);
        ck_assert_int_lt(cq_now_ms() - t0, 3000);
        ck_assert_str_eq(fx.res.error, "the caller's deadline passed");
        ck_assert_int_eq(fx.res.status, 0);
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 1);

        /* past it, nothing is sent */
        ck_assert_int_eq(perform(&fx), CQ_HTTP_DEADLINE);
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 1);

        /* a request's own timeout is no deadline: a network error */
        fx.req.deadline_ms = 0;
        fx.req.timeout_ms = 300;
        t0 = cq_now_ms();
        ck_assert_int_eq(perform(&fx), CQ_HTTP_NETWORK);
        ck_assert_int_eq(fx.res.code, CURLE_OPERATION_TIMEDOUT);
        ck_assert_int_lt(cq_now_ms() - t0, 3000);
        ck_assert_msg(strstr(fx.res.error, "timed out"), "%s", fx.res.error);
        end(&fx);
}
END_TEST

static int tick_thrice(void *opaque)
{
        int *ticks = opaque;

        return ++*ticks >= 3;
}

START_TEST(the_cancel_flag_ends_a_silent_server)
{
        reply_t reply = {200, NULL, 10, false, 20000};
        fixture_t fx;
        atomic_int cancel = 0;
        pthread_t thread;
        int64_t t0;
        int ticks = 0;

        begin(&fx, &reply, "/slow", 100);
        fx.req.cancel = &cancel;
        t0 = cq_now_ms();
        ck_assert_int_eq(
            pthread_create(&thread, NULL, cq_loopback_raise_later, &cancel), 0);
        ck_assert_int_eq(perform(&fx), CQ_HTTP_CANCELLED);
        pthread_join(thread, NULL);
        ck_assert_int_ge(cq_now_ms() - t0, 290);
        ck_assert_int_lt(cq_now_ms() - t0, 3000);
        ck_assert_str_eq(fx.res.error, "request cancelled");
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 1);

        /* a raised flag sends nothing */
        ck_assert_int_eq(perform(&fx), CQ_HTTP_CANCELLED);
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 1);

        /* the caller's tick stops it too, asked again every 100 ms */
        atomic_store(&cancel, 0);
        fx.req.tick = tick_thrice;
        fx.req.opaque = &ticks;
        t0 = cq_now_ms();
        ck_assert_int_eq(perform(&fx), CQ_HTTP_ABORTED);
        ck_assert_int_eq(ticks, 3);
        ck_assert_int_lt(cq_now_ms() - t0, 3000);
        ck_assert_str_eq(fx.res.error, "stopped by the caller");
        end(&fx);
}
END_TEST

/* ---- Retry-After ---- */

START_TEST(retry_after_values)
{
        int64_t now = 1764400000; /* 2025-11-29T07:06:40Z */

        ck_assert_int_eq(cq_http_parse_retry_after("5", now), 5000);
        ck_assert_int_eq(cq_http_parse_retry_after(" 2 ", now), 2000);
        ck_assert_int_eq(cq_http_parse_retry_after("1.5", now), 1500);
        ck_assert_int_eq(cq_http_parse_retry_after("0", now), 0);
        ck_assert_int_eq(
            cq_http_parse_retry_after("Sat, 29 Nov 2025 07:06:50 GMT", now),
            10000);
        /* the obsolete forms HTTP still allows */
        ck_assert_int_eq(
            cq_http_parse_retry_after("Saturday, 29-Nov-25 07:06:50 GMT", now),
            10000);
        ck_assert_int_eq(
            cq_http_parse_retry_after("Sat Nov 29 07:06:50 2025", now), 10000);
        ck_assert_int_eq(
            cq_http_parse_retry_after("Sat, 29 Nov 2025 07:00:00 GMT", now), 0);
        /* bounded: a year at most, in either form */
        ck_assert_int_eq(cq_http_parse_retry_after("99999999999", now),
                         86400LL * 365 * 1000);
        ck_assert_int_eq(
            cq_http_parse_retry_after("Fri, 29 Nov 2120 07:06:40 GMT", now),
            86400LL * 365 * 1000);
        /* garbage */
        ck_assert_int_eq(cq_http_parse_retry_after("soon", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after("", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after("   ", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after("-3", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after("5s", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after("nan", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after("\x01\xff", now), -1);
        ck_assert_int_eq(cq_http_parse_retry_after(NULL, now), -1);
}
END_TEST

/* The Retry-After the client reads from a 429 with \p headers. */
static int64_t retry_after_of(const char *headers)
{
        reply_t reply = {429, headers, 2, false, 0};
        fixture_t fx;
        int64_t ms;

        begin(&fx, &reply, "/busy", 100);
        /* a 429 is a response like any other: retrying is the caller's */
        ck_assert_int_eq(perform(&fx), CQ_HTTP_OK);
        ck_assert_int_eq(fx.res.status, 429);
        ms = fx.res.retry_after_ms;
        end(&fx);
        return ms;
}

START_TEST(retry_after_in_both_forms)
{
        char date[128];
        time_t in30 = time(NULL) + 30;
        struct tm tm;
        int64_t ms;

        ck_assert_int_eq(retry_after_of("Retry-After: 2\r\n"), 2000);
        gmtime_r(&in30, &tm);
        strftime(date, sizeof(date),
                 "Retry-After: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        ms = retry_after_of(date);
        ck_assert_int_ge(ms, 27000);
        ck_assert_int_le(ms, 30000);
        ck_assert_int_eq(retry_after_of("Retry-After: soon\r\n"), -1);
        ck_assert_int_eq(retry_after_of("X-Other: 5\r\n"), -1);
        /* the finer header wins, before or after Retry-After */
        ck_assert_int_eq(
            retry_after_of("Retry-After: 9\r\nRetry-After-Ms: 1500\r\n"), 1500);
        ck_assert_int_eq(
            retry_after_of("retry-after-ms: 1500\r\nRetry-After: 9\r\n"), 1500);
        ck_assert_int_eq(
            retry_after_of("Retry-After-Ms: never\r\nRetry-After: 9\r\n"),
            9000);
}
END_TEST

/* ---- what reaches messages ---- */

START_TEST(secrets_never_reach_messages)
{
        static const char *const secrets[] = {"sk-live-123456", NULL, "abc",
                                              "tok-999", "localhost"};
        cq_http_t *http = new_http(secrets, CQ_ARRAY_SIZE(secrets));
        cq_http_req_t req = {0};
        cq_http_res_t res;
        char s[128], small[16], url[128];
        char *shown;

        snprintf(s, sizeof(s),
                 "key sk-live-123456 and tok-999 twice: tok-999; abc stays");
        cq_http_redact(http, s, sizeof(s));
        ck_assert_str_eq(s, "key [redacted] and [redacted] twice: [redacted]; "
                            "abc stays");
        /* the mark is longer than the secret: cut, never past the buffer */
        snprintf(small, sizeof(small), "ab tok-999 cdef");
        cq_http_redact(http, small, sizeof(small));
        ck_assert_str_eq(small, "ab [redacted] c");
        snprintf(small, sizeof(small), "abcdefg tok-999");
        cq_http_redact(http, small, sizeof(small));
        ck_assert_str_eq(small, "abcdefg [redact");

        /* libcurl's own words name the host; the handle's messages do not */
        cq_http_res_init(&res);
        snprintf(url, sizeof(url), "http://localhost:%d/",
                 cq_loopback_dead_port());
        req.url = url;
        req.max = 100;
        ck_assert_int_eq(cq_http_perform(http, &req, &res), CQ_HTTP_NETWORK);
        ck_assert_int_eq(res.code, CURLE_COULDNT_CONNECT);
        ck_assert_msg(strstr(res.error, "[redacted]"), "%s", res.error);
        ck_assert_msg(!strstr(res.error, "localhost"), "%s", res.error);
        cq_http_res_release(&res);

        shown = cq_http_url_shown("https://bob:sekrit@api.example.com:8443/v1/"
                                  "chat?api-key=K");
        ck_assert_str_eq(shown, "https://api.example.com:8443/v1/chat");
        free(shown);
        shown = cq_http_url_shown("http://host/a@b");
        ck_assert_str_eq(shown, "http://host/a@b");
        free(shown);
        shown = cq_http_escape(http, "a b/c&d");
        ck_assert_str_eq(shown, "a%20b%2Fc%26d");
        free(shown);
        cq_http_destroy(&http);
}
END_TEST

/* ---- the caller's policies ---- */

static bool refuse_v4(void *opaque, const struct sockaddr *sa)
{
        int *asked = opaque;

        (*asked)++;
        return sa->sa_family != AF_INET;
}

static bool allow_all(void *opaque, const struct sockaddr *sa)
{
        (void)sa;
        return ++*(int *)opaque > 0;
}

START_TEST(the_address_hook_refuses_before_connecting)
{
        reply_t reply = {302, "Location: /elsewhere?x=1\r\n", 0, false, 0};
        fixture_t fx;
        char want[128];
        int asked = 0;

        begin(&fx, &reply, "/from", 100);
        fx.req.allow_addr = refuse_v4;
        fx.req.opaque = &asked;
        ck_assert_int_eq(perform(&fx), CQ_HTTP_REFUSED);
        ck_assert_int_eq(asked, 1);
        ck_assert_str_eq(fx.res.refused_addr, "127.0.0.1");
        ck_assert_msg(strstr(fx.res.error, "127.0.0.1"), "%s", fx.res.error);
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 0);

        /* allowed: a redirect is reported, not followed */
        fx.req.allow_addr = allow_all;
        ck_assert_int_eq(perform(&fx), CQ_HTTP_OK);
        ck_assert_int_eq(asked, 2);
        ck_assert_int_eq(fx.res.status, 302);
        snprintf(want, sizeof(want), "http://127.0.0.1:%d/elsewhere?x=1",
                 fx.srv.port);
        ck_assert_str_eq(fx.res.redirect_url, want);
        ck_assert_int_eq(atomic_load(&fx.srv.requests), 1);
        end(&fx);
}
END_TEST

static Suite *http_suite(void)
{
        Suite *s = suite_create("http");
        TCase *tc = tcase_create("client");
        TCase *pure = tcase_create("pure");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, reads_a_body_within_the_cap);
        tcase_add_test(tc, a_body_over_the_cap_ends_the_request);
        tcase_add_test(tc, the_deadline_ends_a_silent_server);
        tcase_add_test(tc, the_cancel_flag_ends_a_silent_server);
        tcase_add_test(tc, retry_after_in_both_forms);
        tcase_add_test(tc, secrets_never_reach_messages);
        tcase_add_test(tc, the_address_hook_refuses_before_connecting);
        suite_add_tcase(s, tc);
        tcase_add_test(pure, retry_after_values);
        suite_add_tcase(s, pure);
        return s;
}

CQ_CHECK_MAIN(http_suite)
