/* SPDX-License-Identifier: MIT */
/* check_fetch.c - job input files given by URL: a capped GET against a
 * local HTTP server (the fake LLM's health endpoint serves as one). */
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/fetch.h"
#include "support/fake_llm.h"

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
        ck_assert_int_eq(
            cq_fetch_url(url, 1024, 10, &data, &len, err, sizeof(err)), CQ_OK);
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
            cq_fetch_url(url, 4, 10, &data, &len, err, sizeof(err)),
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
        ck_assert_int_eq(
            cq_fetch_url(url, 1024, 10, &data, &len, err, sizeof(err)),
            CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "HTTP status 404"), "%s", err);
        ck_assert_int_eq(cq_fetch_url("file:///etc/passwd", 1024, 10, &data,
                                      &len, err, sizeof(err)),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(err, "only http and https"), "%s", err);
        /* nothing listens on port 1 */
        ck_assert_int_eq(cq_fetch_url("http://127.0.0.1:1/x", 1024, 10, &data,
                                      &len, err, sizeof(err)),
                         CQ_ERR_RETRIABLE);
        ck_assert_ptr_null(data);
}
END_TEST

static Suite *fetch_suite(void)
{
        Suite *s = suite_create("fetch");
        TCase *tc = tcase_create("get");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_test(tc, fetches_a_body);
        tcase_add_test(tc, refuses_a_body_over_the_cap);
        tcase_add_test(tc, classifies_failures);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(fetch_suite)
