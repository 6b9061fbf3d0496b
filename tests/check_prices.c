/* SPDX-License-Identifier: MIT */
/* check_prices.c - the prices file: golden cases under
 * tests/data/prices/<case>/{input.json,expected} (well-formed files and
 * every way of getting one wrong), lookups of exact and prefix names,
 * cost and budget-estimate arithmetic, the file reader's bounds, and
 * mutated files that must never crash. CQ_GOLDEN_UPDATE=1 rewrites the
 * expected files (then review the diff). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/common/prices.h"

/* The models every golden case is asked about. */
static const char *const probes[] = {"gpt-4o-mini",
                                     "gpt-4o-mini-2024-07-18",
                                     "gpt-4o",
                                     "gpt-4o-2024-08-06",
                                     "claude-sonnet-4-5",
                                     "free-model",
                                     "unknown",
                                     "gpt-4"};

static char *summarize(const cq_prices_t *prices, const char *errstr)
{
        cq_buf_t buf;
        size_t i;

        cq_buf_init(&buf, 1 << 20);
        if (!prices) {
                ck_assert_int_eq(cq_buf_printf(&buf, "error: %s\n", errstr),
                                 CQ_OK);
                return cq_buf_take(&buf, NULL);
        }
        ck_assert_int_eq(
            cq_buf_printf(&buf, "ok: %zu models\n", cq_prices_count(prices)),
            CQ_OK);
        for (i = 0; i < CQ_ARRAY_SIZE(probes); i++) {
                cq_price_t p;

                if (!cq_prices_find(prices, probes[i], &p)) {
                        ck_assert_int_eq(
                            cq_buf_printf(&buf, "%s: no price\n", probes[i]),
                            CQ_OK);
                        continue;
                }
                ck_assert_int_eq(cq_buf_printf(&buf,
                                               "%s: input=%g output=%g "
                                               "cached_input=%g "
                                               "cache_write=%g\n",
                                               probes[i], p.input, p.output,
                                               p.cached_input, p.cache_write),
                                 CQ_OK);
        }
        return cq_buf_take(&buf, NULL);
}

START_TEST(prices_golden_cases)
{
        char dirpath[4096];
        char *names[128];
        size_t n = 0, i, failed = 0, ok = 0;

        snprintf(dirpath, sizeof(dirpath), "%s",
                 cq_check_srcpath("tests/data/prices"));
        n = cq_check_cases("tests/data/prices", names, CQ_ARRAY_SIZE(names));
        ck_assert_uint_ge(n, 20);
        for (i = 0; i < n; i++) {
                char path[4600], errstr[512] = "";
                char *input, *got;
                size_t len;
                cq_prices_t *prices;

                snprintf(path, sizeof(path), "%s/%s/input.json", dirpath,
                         names[i]);
                input = cq_check_slurp(path, &len);
                prices = cq_prices_parse(input, len, "input.json", errstr,
                                         sizeof(errstr));
                /* every case says by its name whether it must parse */
                ck_assert_msg((prices != NULL) ==
                                  (strncmp(names[i], "ok_", 3) == 0),
                              "%s: %s", names[i], errstr);
                if (!prices)
                        ck_assert_msg(errstr[0] != '\0', "%s: empty error",
                                      names[i]);
                else
                        ok++;
                got = summarize(prices, errstr);
                snprintf(path, sizeof(path), "%s/%s/expected", dirpath,
                         names[i]);
                failed += (size_t)cq_check_golden(path, got, names[i]);
                free(got);
                free(input);
                cq_prices_destroy(&prices);
                ck_assert_ptr_null(prices);
                free(names[i]);
        }
        ck_assert_uint_eq(ok, 2);
        ck_assert_uint_eq(failed, 0);
}
END_TEST

/* An exact name wins over every prefix; among prefixes the longest. */
START_TEST(prices_lookup_order)
{
        static const char doc[] =
            "{\"models\":{\"m*\":{\"input\":1,\"output\":1},"
            "\"model-a*\":{\"input\":2,\"output\":2},"
            "\"model-a\":{\"input\":3,\"output\":3},"
            "\"model-*\":{\"input\":4,\"output\":4}}}";
        char errstr[256] = "";
        cq_prices_t *prices =
            cq_prices_parse(doc, strlen(doc), "t", errstr, sizeof(errstr));
        cq_price_t p;

        ck_assert_msg(prices != NULL, "%s", errstr);
        ck_assert(cq_prices_find(prices, "model-a", &p));
        ck_assert_double_eq(p.input, 3);
        ck_assert(cq_prices_find(prices, "model-ab", &p));
        ck_assert_double_eq(p.input, 2);
        ck_assert(cq_prices_find(prices, "model-b", &p));
        ck_assert_double_eq(p.input, 4);
        ck_assert(cq_prices_find(prices, "mx", &p));
        ck_assert_double_eq(p.input, 1);
        /* a prefix entry matches its prefix itself too */
        ck_assert(cq_prices_find(prices, "m", &p));
        ck_assert_double_eq(p.input, 1);
        ck_assert(!cq_prices_find(prices, "x", &p));
        ck_assert(!cq_prices_find(prices, NULL, &p));
        /* no file: nothing has a price */
        ck_assert(!cq_prices_find(NULL, "model-a", &p));
        cq_prices_destroy(&prices);
        cq_prices_destroy(&prices); /* NULL is fine */
}
END_TEST

/* Uncached input, cache reads, cache writes and output each at their
 * price; counts a provider got wrong cannot make a cost negative. */
START_TEST(prices_cost_and_estimate)
{
        cq_price_t p = {
            .input = 3, .output = 15, .cached_input = 0.3, .cache_write = 3.75};
        cq_usage_t u = {.prompt_tokens = 10000,
                        .completion_tokens = 2000,
                        .cache_read_tokens = 6000,
                        .cache_creation_tokens = 1000};

        /* 3000 * 3 + 6000 * 0.3 + 1000 * 3.75 + 2000 * 15, per million */
        ck_assert_double_eq_tol(cq_price_cost(&p, &u), 0.04455, 1e-12);
        u.cache_read_tokens = u.cache_creation_tokens = 0;
        ck_assert_double_eq_tol(cq_price_cost(&p, &u), 0.06, 1e-12);
        /* cached counts above the prompt are capped at it */
        u.cache_read_tokens = 20000;
        u.cache_creation_tokens = 5;
        ck_assert_double_eq_tol(cq_price_cost(&p, &u), 0.003 + 0.03, 1e-12);
        u.prompt_tokens = -5;
        u.completion_tokens = -1;
        ck_assert_double_eq(cq_price_cost(&p, &u), 0);
        /* the estimate: every prompt token uncached, a full reply */
        ck_assert_double_eq_tol(cq_price_estimate(&p, 1000, 8192),
                                0.003 + 0.12288, 1e-12);
        ck_assert_double_eq(cq_price_estimate(&p, -1, -1), 0);
}
END_TEST

START_TEST(prices_file_bounds)
{
        char dir[] = "/tmp/cqt_prices_XXXXXX", path[256], errstr[512];
        cq_prices_t *prices;
        char *big;
        size_t i;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/missing.json", dir);
        errstr[0] = '\0';
        ck_assert_ptr_null(cq_prices_load(path, errstr, sizeof(errstr)));
        ck_assert_msg(strstr(errstr, "could not open prices file") &&
                          strstr(errstr, "No such file"),
                      "%s", errstr);
        /* a directory is not a prices file */
        ck_assert_ptr_null(cq_prices_load(dir, errstr, sizeof(errstr)));
        ck_assert_msg(strstr(errstr, "not a regular file"), "%s", errstr);
        /* over the cap, even when it is valid JSON */
        big = malloc(CQ_PRICES_FILE_MAX + 64);
        ck_assert_ptr_nonnull(big);
        i = (size_t)snprintf(big, 64, "{\"models\":{}}");
        memset(big + i, ' ', CQ_PRICES_FILE_MAX + 1 - i);
        snprintf(path, sizeof(path), "%s/big.json", dir);
        cq_check_spit(path, big, CQ_PRICES_FILE_MAX + 1);
        ck_assert_ptr_null(cq_prices_load(path, errstr, sizeof(errstr)));
        ck_assert_msg(strstr(errstr, "over the limit of 1048576"), "%s",
                      errstr);
        ck_assert_ptr_null(cq_prices_parse(big, CQ_PRICES_FILE_MAX + 1, path,
                                           errstr, sizeof(errstr)));
        /* the cap itself is fine */
        cq_check_spit(path, big, CQ_PRICES_FILE_MAX);
        prices = cq_prices_load(path, errstr, sizeof(errstr));
        ck_assert_msg(prices != NULL, "%s", errstr);
        ck_assert_uint_eq(cq_prices_count(prices), 0);
        cq_prices_destroy(&prices);
        free(big);
        /* a good file read from disk, its path named in errors */
        snprintf(path, sizeof(path), "%s/p.json", dir);
        {
                static const char one[] = "{\"models\":{\"a\":{\"input\":1}}}";

                cq_check_spit(path, one, strlen(one));
        }
        ck_assert_ptr_null(cq_prices_load(path, errstr, sizeof(errstr)));
        ck_assert_msg(strstr(errstr, path) &&
                          strstr(errstr, "\"models.a.output\" is required"),
                      "%s", errstr);
        unlink(path);
        snprintf(path, sizeof(path), "%s/big.json", dir);
        unlink(path);
        rmdir(dir);
}
END_TEST

/* Truncations and byte flips of a good file: a result or an error, never
 * a crash (ASan checks the reads). */
START_TEST(prices_mutations_never_crash)
{
        char *base, *work;
        size_t len, i, round, ok = 0;
        unsigned seed = 7;

        base = cq_check_slurp(
            cq_check_srcpath("tests/data/prices/ok_full/input.json"), &len);
        work = malloc(len);
        ck_assert_ptr_nonnull(work);
        for (i = 0; i <= len; i++) {
                char errstr[256];
                cq_prices_t *p =
                    cq_prices_parse(base, i, "t", errstr, sizeof(errstr));

                ok += p != NULL;
                cq_prices_destroy(&p);
        }
        for (round = 0; round < 3000; round++) {
                char errstr[256];
                cq_prices_t *p;

                memcpy(work, base, len);
                work[rand_r(&seed) % len] = (char)(rand_r(&seed) & 0xff);
                p = cq_prices_parse(work, len, "t", errstr, sizeof(errstr));
                ok += p != NULL;
                cq_prices_destroy(&p);
        }
        ck_assert_uint_gt(ok, 0);
        free(work);
        free(base);
}
END_TEST

static Suite *prices_suite(void)
{
        Suite *s = suite_create("prices");
        TCase *tc = tcase_create("prices");

        tcase_add_test(tc, prices_golden_cases);
        tcase_add_test(tc, prices_lookup_order);
        tcase_add_test(tc, prices_cost_and_estimate);
        tcase_add_test(tc, prices_file_bounds);
        tcase_add_test(tc, prices_mutations_never_crash);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(prices_suite)
