/* SPDX-License-Identifier: MIT */
/* check_store.c - the pure parts of storage, no PostgreSQL needed:
 * migration file names, ordering, duplicates, and store options. */
#include <stdlib.h>
#include <string.h>

#include "coderq/storage/migrate.h"
#include "../storage/store_int.h"
#include "check_support.h"

START_TEST(migration_names)
{
        static const struct {
                const char *name;
                bool ok;
                int version;
        } cases[] = {
            {"0001_schema.sql", true, 1},
            {"0042_add-index_2.sql", true, 42},
            {"9999_x.sql", true, 9999},
            {"0000_zero.sql", false, 0},
            {"0001.sql", false, 0},
            {"0001_.sql", false, 0},
            {"001_short.sql", false, 0},
            {"00001_long.sql", false, 0},
            {"0001-dash.sql", false, 0},
            {"0001_schema.SQL", false, 0},
            {"0001_schema.sql.bak", false, 0},
            {"0001_sp ace.sql", false, 0},
            {"0001_semi;colon.sql", false, 0},
            {"0001_dot.x.sql", false, 0},
            {"abcd_x.sql", false, 0},
            {"", false, 0},
            {".sql", false, 0},
            {"0001_\xff\xfe.sql", false, 0},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                int version = -1;
                bool ok = cq_migrate_parse_name(cases[i].name, &version);

                ck_assert_msg(ok == cases[i].ok, "%s: expected %s",
                              cases[i].name, cases[i].ok ? "valid" : "invalid");
                if (ok)
                        ck_assert_int_eq(version, cases[i].version);
                else
                        ck_assert_int_eq(version, -1);
        }
}
END_TEST

START_TEST(migration_random_names_do_not_crash)
{
        char name[64];
        int i, version;
        size_t j, len;

        srand(7);
        for (i = 0; i < 20000; i++) {
                len = (size_t)(rand() % (int)(sizeof(name) - 1));
                for (j = 0; j < len; j++)
                        name[j] = (char)(1 + rand() % 255);
                if (i % 3 == 0 && len > 9)
                        memcpy(name, "0007_", 5);
                if (i % 2 == 0 && len > 9)
                        memcpy(name + len - 4, ".sql", 4);
                name[len] = '\0';
                version = -1;
                if (cq_migrate_parse_name(name, &version))
                        ck_assert_int_eq(version, 7);
        }
}
END_TEST

START_TEST(migration_list_orders_by_version)
{
        cq_migration_t *v = NULL;
        size_t n = 0;
        char errstr[256];

        ck_assert_int_eq(
            cq_migrate_list(cq_check_srcpath("tests/data/store/order"), &v, &n,
                            errstr, sizeof(errstr)),
            0);
        ck_assert_uint_eq(n, 3);
        ck_assert_str_eq(v[0].name, "0001_one.sql");
        ck_assert_int_eq(v[0].version, 1);
        ck_assert_str_eq(v[1].name, "0002_two.sql");
        ck_assert_str_eq(v[2].name, "0010_ten.sql");
        ck_assert_int_eq(v[2].version, 10);
        ck_assert_ptr_nonnull(strstr(v[2].path, "order/0010_ten.sql"));
        cq_migrations_free(v, n);
}
END_TEST

START_TEST(migration_list_refuses_duplicates)
{
        cq_migration_t *v = NULL;
        size_t n = 0;
        char errstr[256] = "";

        ck_assert_int_eq(
            cq_migrate_list(cq_check_srcpath("tests/data/store/dup"), &v, &n,
                            errstr, sizeof(errstr)),
            -1);
        ck_assert_ptr_nonnull(strstr(errstr, "same version 0001"));
        ck_assert_ptr_null(v);
        ck_assert_int_eq(cq_migrate_list(cq_check_srcpath("tests/data/store/"
                                                          "missing"),
                                         &v, &n, errstr, sizeof(errstr)),
                         -1);
        ck_assert_ptr_nonnull(strstr(errstr, "could not open migrations"));
}
END_TEST

START_TEST(shipped_migrations_are_listed)
{
        cq_migration_t *v = NULL;
        size_t n = 0, i;
        char errstr[256];

        ck_assert_int_eq(cq_migrate_list(cq_migrate_default_dir(), &v, &n,
                                         errstr, sizeof(errstr)),
                         0);
        ck_assert_uint_ge(n, 1);
        ck_assert_int_eq(v[0].version, 1);
        for (i = 1; i < n; i++)
                ck_assert_int_gt(v[i].version, v[i - 1].version);
        cq_migrations_free(v, n);
}
END_TEST

START_TEST(migrate_unreachable_is_retriable)
{
        char errstr[512] = "";
        int applied = -1;

        ck_assert_int_eq(cq_migrate_run("postgresql://nobody@127.0.0.1:1/x",
                                        NULL, NULL, NULL, &applied, errstr,
                                        sizeof(errstr)),
                         CQ_ERR_RETRIABLE);
        ck_assert_int_eq(applied, 0);
        ck_assert_ptr_nonnull(strstr(errstr, "could not connect"));
        ck_assert_int_eq(
            cq_migrate_run("postgresql://nobody@127.0.0.1:1/x",
                           cq_check_srcpath("tests/data/store/dup"), NULL, NULL,
                           &applied, errstr, sizeof(errstr)),
            CQ_ERR_FATAL);
        ck_assert_ptr_nonnull(strstr(errstr, "same version"));
}
END_TEST

START_TEST(text_array_escapes)
{
        cq_store_t store;
        const char *v[] = {"a", "b\"c", "d\\e", "", "{x,y}"};
        char *s;

        memset(&store, 0, sizeof(store));
        s = store_text_array(&store, v, CQ_ARRAY_SIZE(v));
        ck_assert_str_eq(s, "{\"a\",\"b\\\"c\",\"d\\\\e\",\"\",\"{x,y}\"}");
        free(s);
        s = store_text_array(&store, v, 0);
        ck_assert_str_eq(s, "{}");
        free(s);
}
END_TEST

/* The escape of stored documents: NUL and U+FFFF in strings and keys
 * round-trip, everything else is left as it is. */
START_TEST(doc_escape_round_trips)
{
        static const struct {
                const char *in;
                size_t len;
                const char *enc;
                size_t enc_len;
        } cases[] = {
            {"plain h\xc3\xa9", 9, "plain h\xc3\xa9", 9},
            {"", 0, "", 0},
            {"\0", 1,
             "\xef\xbf\xbf"
             "0",
             4},
            {"a\0\0b", 4,
             "a\xef\xbf\xbf"
             "0\xef\xbf\xbf"
             "0b",
             10},
            {"\xef\xbf\xbf", 3, "\xef\xbf\xbf\xef\xbf\xbf", 6},
            {"\xef\xbf\xbf"
             "0",
             4,
             "\xef\xbf\xbf\xef\xbf\xbf"
             "0",
             7},
            {"\xef\xbf\xbf\0", 4,
             "\xef\xbf\xbf\xef\xbf\xbf\xef\xbf\xbf"
             "0",
             10},
        };
        size_t i;

        for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                json_t *doc = json_pack("[s%, {}]", cases[i].in, cases[i].len);
                json_t *enc, *dec, *v;
                const char *k;
                size_t klen, nkeys = 0;

                ck_assert_ptr_nonnull(doc);
                ck_assert_int_eq(json_object_setn_new(json_array_get(doc, 1),
                                                      cases[i].in, cases[i].len,
                                                      json_null()),
                                 0);
                enc = store_doc_encode(doc);
                ck_assert_ptr_nonnull(enc);
                ck_assert_uint_eq(json_string_length(json_array_get(enc, 0)),
                                  cases[i].enc_len);
                ck_assert_mem_eq(json_string_value(json_array_get(enc, 0)),
                                 cases[i].enc, cases[i].enc_len);
                json_object_keylen_foreach(json_array_get(enc, 1), k, klen, v)
                {
                        ck_assert_uint_eq(klen, cases[i].enc_len);
                        ck_assert_mem_eq(k, cases[i].enc, klen);
                        nkeys++;
                }
                ck_assert_uint_eq(nkeys, 1);
                dec = store_doc_decode(enc);
                ck_assert_ptr_nonnull(dec);
                ck_assert_uint_eq(json_string_length(json_array_get(dec, 0)),
                                  cases[i].len);
                ck_assert_mem_eq(json_string_value(json_array_get(dec, 0)),
                                 cases[i].in, cases[i].len);
                json_object_keylen_foreach(json_array_get(dec, 1), k, klen, v)
                {
                        ck_assert_uint_eq(klen, cases[i].len);
                        ck_assert_mem_eq(k, cases[i].in, klen);
                }
                json_decref(doc);
                json_decref(enc);
                json_decref(dec);
        }
}
END_TEST

START_TEST(opts_from_config)
{
        cq_config_t cfg;
        cq_store_opts_t opts;
        char errstr[256];

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        cq_store_opts_from_config(&opts, &cfg);
        ck_assert_int_eq(opts.lease_s, 120);
        ck_assert_int_eq(opts.max_attempts, 3);
        ck_assert_uint_eq(opts.notebook_max, (size_t)64 << 20);
        ck_assert_uint_eq(opts.image_max, (size_t)32 << 20);
        ck_assert_double_eq_tol(opts.memory_threshold, 0.3, 1e-9);
        ck_assert_int_eq(opts.reconnect_ms, 30000);
        ck_assert_str_eq(opts.owner, "coderq");
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_LEASE_S", "3", NULL,
                                       errstr, sizeof(errstr)),
                         -1);
        ck_assert_ptr_nonnull(strstr(errstr, "CODERQ_LEASE_S"));
        ck_assert_int_eq(cq_config_set(&cfg, "memory-threshold", "55", NULL,
                                       errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "image-max", "2M", NULL, errstr,
                                       sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "worker-id", "w1", NULL, errstr,
                                       sizeof(errstr)),
                         0);
        cq_store_opts_from_config(&opts, &cfg);
        ck_assert_double_eq_tol(opts.memory_threshold, 0.55, 1e-9);
        ck_assert_uint_eq(opts.image_max, (size_t)2 << 20);
        ck_assert_str_eq(opts.owner, "w1");
        cq_config_release(&cfg);
}
END_TEST

static Suite *store_suite(void)
{
        Suite *s = suite_create("store");
        TCase *tc = tcase_create("pure");

        tcase_add_test(tc, migration_names);
        tcase_add_test(tc, migration_random_names_do_not_crash);
        tcase_add_test(tc, migration_list_orders_by_version);
        tcase_add_test(tc, migration_list_refuses_duplicates);
        tcase_add_test(tc, shipped_migrations_are_listed);
        tcase_add_test(tc, migrate_unreachable_is_retriable);
        tcase_add_test(tc, text_array_escapes);
        tcase_add_test(tc, opts_from_config);
        tcase_add_test(tc, doc_escape_round_trips);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(store_suite)
