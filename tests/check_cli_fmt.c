/* SPDX-License-Identifier: MIT */
/* check_cli_fmt.c - the CLI's pure formatting helpers: CSV fields, UTF-8
 * display width, cell cutting, table alignment, the progress bar, image
 * file names and durations; plus random bytes through every helper. */
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/cli/clifmt.h"

static char *csv(const char *s)
{
        cq_buf_t buf;
        char *out;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_fmt_csv_field(&buf, s), CQ_OK);
        out = cq_buf_take(&buf, NULL);
        return out ? out : strdup("");
}

START_TEST(csv_quotes_only_when_needed)
{
        static const char *const cases[][2] = {
            {"plain", "plain"},
            {"", ""},
            {"a,b", "\"a,b\""},
            {"say \"hi\"", "\"say \"\"hi\"\"\""},
            {"\"", "\"\"\"\""},
            {"line1\nline2", "\"line1\nline2\""},
            {"cr\rhere", "\"cr\rhere\""},
            {"bad, \"quoted\" reason", "\"bad, \"\"quoted\"\" reason\""},
            {" lead", "\" lead\""},
            {"trail ", "\"trail \""},
            {"naïve 日本", "naïve 日本"},
            {"semi;colon", "semi;colon"},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                char *got = csv(cases[i][0]);

                ck_assert_msg(strcmp(got, cases[i][1]) == 0,
                              "case %zu: got [%s] want [%s]", i, got,
                              cases[i][1]);
                free(got);
        }
        {
                char *got = csv(NULL);

                ck_assert_str_eq(got, "");
                free(got);
        }
}
END_TEST

START_TEST(csv_field_respects_the_cap)
{
        cq_buf_t buf;

        cq_buf_init(&buf, 4);
        ck_assert_int_eq(cq_fmt_csv_field(&buf, "a,bcdef"), CQ_ERR_TOO_LARGE);
        cq_buf_release(&buf);
}
END_TEST

START_TEST(width_counts_columns_not_bytes)
{
        ck_assert_uint_eq(cq_fmt_width("abc"), 3);
        ck_assert_uint_eq(cq_fmt_width(""), 0);
        ck_assert_uint_eq(cq_fmt_width(NULL), 0);
        ck_assert_uint_eq(cq_fmt_width("é"), 1);         /* 2 bytes */
        ck_assert_uint_eq(cq_fmt_width("e\xcc\x81"), 1); /* e + combining */
        ck_assert_uint_eq(cq_fmt_width("日本語"), 6);
        ck_assert_uint_eq(cq_fmt_width("한국"), 4);
        ck_assert_uint_eq(cq_fmt_width("\xf0\x9f\x98\x80"), 2); /* emoji */
        ck_assert_uint_eq(cq_fmt_width("a\xff"
                                       "b"),
                          3);                               /* bad byte: 1 */
        ck_assert_uint_eq(cq_fmt_width("\xe6\x97"), 2);     /* truncated */
        ck_assert_uint_eq(cq_fmt_width("\xc0\xaf"), 2);     /* overlong */
        ck_assert_uint_eq(cq_fmt_width("\xed\xa0\x80"), 3); /* surrogate */
}
END_TEST

static char *cell(const char *s, size_t max)
{
        cq_buf_t buf;
        char *out;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_fmt_cell(&buf, s, max), CQ_OK);
        out = cq_buf_take(&buf, NULL);
        return out ? out : strdup("");
}

START_TEST(cell_flattens_and_cuts_on_code_points)
{
        char *s;

        s = cell("a\nb\tc", 0);
        ck_assert_str_eq(s, "a b c");
        free(s);
        s = cell("abcdefghij", 8);
        ck_assert_str_eq(s, "abcde...");
        free(s);
        s = cell("abcdefgh", 8);
        ck_assert_str_eq(s, "abcdefgh");
        free(s);
        /* 日 is 2 columns: 5 columns of room hold two of them */
        s = cell("日本語日本語", 8);
        ck_assert_str_eq(s, "日本...");
        ck_assert_uint_le(cq_fmt_width(s), 8);
        free(s);
        s = cell("\n\n\n\n\n\n\n\n\n\n", 5);
        ck_assert_str_eq(s, "  ...");
        free(s);
}
END_TEST

static char *render(cq_table_t *table);

static char *untrusted(const char *s, size_t max_width)
{
        char *out = cq_fmt_untrusted_dup(s, max_width);

        ck_assert_ptr_nonnull(out);
        return out;
}

/* Each {input, expected} of \p cases through \p fmt with no width limit. */
static void expect_each(char *(*fmt)(const char *, size_t),
                        const char *const (*cases)[2],
                        size_t n)
{
        size_t i;

        for (i = 0; i < n; i++) {
                char *got = fmt(cases[i][0], 0);

                ck_assert_msg(strcmp(got, cases[i][1]) == 0,
                              "case %zu: got [%s] want [%s]", i, got,
                              cases[i][1]);
                free(got);
        }
}

/* A table cell never carries C1 or bidi controls nor bad bytes: each
 * shows as U+FFFD, one column, so the columns stay aligned. */
START_TEST(cell_replaces_c1_bidi_and_bad_bytes)
{
        static const char *const cases[][2] = {
            {"a\xc2\x9b"
             "31mb",
             "a\xef\xbf\xbd"
             "31mb"},
            {"x\xe2\x80\xaey", "x\xef\xbf\xbdy"}, /* U+202E */
            {"x\xe2\x81\xa6y", "x\xef\xbf\xbdy"}, /* U+2066 */
            {"x\xe2\x80\x8fy", "x\xef\xbf\xbdy"}, /* U+200F */
            {"x\xd8\x9cy", "x\xef\xbf\xbdy"},     /* U+061C */
            {"x\xffy", "x\xef\xbf\xbdy"},         /* bad byte */
            {"x\x1b[2Ky", "x [2Ky"},              /* C0: space */
            {"na\xc3\xafve \xe6\x97\xa5", "na\xc3\xafve \xe6\x97\xa5"},
        };

        expect_each(cell, cases, CQ_ARRAY_SIZE(cases));
        /* the replacement is one column wherever it stands */
        {
                static const char *const headers[] = {"A", "B"};
                static const char *const row[] = {"\xe2\x80\xae\xc2\x9b", "x"};
                cq_table_t *t = cq_table_new(2, headers, NULL, 0);
                char *out;

                ck_assert_ptr_nonnull(t);
                ck_assert_int_eq(cq_table_add(t, row), 0);
                out = render(t);
                ck_assert_str_eq(out, "A   B\n\xef\xbf\xbd\xef\xbf\xbd  x\n");
                free(out);
                cq_table_destroy(&t);
        }
}
END_TEST

START_TEST(untrusted_text_is_escaped_on_one_line)
{
        static const char *const cases[][2] = {
            {"plain text", "plain text"},
            {"", ""},
            {"a\nb\rc\td", "a\\nb\\rc\\td"},
            {"\x1b[2K\x1b[1A", "\\x1b[2K\\x1b[1A"},
            {"\x01\x7f", "\\x01\\x7f"},
            {"\xc2\x9b"
             "31m\xc2\x85",
             "\\u009b31m\\u0085"},
            {"\xe2\x80\xaa\xe2\x80\xae\xe2\x81\xa6\xe2\x81\xa9",
             "\\u202a\\u202e\\u2066\\u2069"},
            {"\xe2\x80\x8e\xe2\x80\x8f\xd8\x9c", "\\u200e\\u200f\\u061c"},
            {"bad\xff\xfe", "bad\\xff\\xfe"},
            {"cut\xe6\x97", "cut\\xe6\\x97"},    /* truncated sequence */
            {"\xc0\xaf", "\\xc0\\xaf"},          /* overlong '/' */
            {"\xed\xa0\x80", "\\xed\\xa0\\x80"}, /* surrogate */
            {"na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \\n",
             "na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac \\n"},
        };

        expect_each(untrusted, cases, CQ_ARRAY_SIZE(cases));
        {
                char *got = untrusted(NULL, 0);

                ck_assert_str_eq(got, "");
                free(got);
        }
}
END_TEST

/* The cut counts the columns of the escapes and never splits one. */
START_TEST(untrusted_text_is_cut_at_code_points)
{
        static const struct {
                const char *in;
                size_t width;
                const char *want;
        } cases[] = {
            {"abcdefghij", 8, "abcde..."},
            {"abcdefgh", 8, "abcdefgh"},
            /* 日 is 2 columns: 5 columns of room hold two of them */
            {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe6\x97\xa5\xe6\x9c\xac", 8,
             "\xe6\x97\xa5\xe6\x9c\xac..."},
            /* "ab\x1b" is 6 columns, 5 fit */
            {"ab\x1b"
             "cdefgh",
             8, "ab..."},
            {"a\n", 3, "a\\n"},
            {"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 4, "\xc3\xa9..."},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                char *got = untrusted(cases[i].in, cases[i].width);

                ck_assert_msg(strcmp(got, cases[i].want) == 0,
                              "case %zu: got [%s] want [%s]", i, got,
                              cases[i].want);
                free(got);
        }
}
END_TEST

/* Whether \p s is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
static bool valid_utf8(const unsigned char *s)
{
        while (*s) {
                unsigned long cp;
                int n, i;

                if (s[0] < 0x80) {
                        s++;
                        continue;
                }
                n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : 2;
                if (s[0] < 0xC2 || s[0] > 0xF4)
                        return false;
                cp = s[0] & (0x7F >> n);
                for (i = 1; i < n; i++) {
                        if ((s[i] & 0xC0) != 0x80)
                                return false;
                        cp = (cp << 6) | (s[i] & 0x3F);
                }
                if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
                    (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
                        return false;
                s += n;
        }
        return true;
}

/* Random bytes (many of them near the dangerous ranges) through the
 * untrusted-text formatter: never an ESC, a C1 or bidi control, a line
 * break or invalid UTF-8 in what is printed, and never wider than asked. */
START_TEST(untrusted_random_bytes_print_nothing_a_terminal_obeys)
{
        static const unsigned char pick[] = {0x1b, 0x9b, 0xc2, 0xe2, 0x80,
                                             0x81, 0xaa, 0xae, 0xa6, 0xd8,
                                             0x9c, 0x8f, '\n', '\r', 'a'};
        unsigned seed = 4242;
        unsigned char s[64];
        int round, i;

        for (round = 0; round < 5000; round++) {
                int len = (int)(rand_r(&seed) % (sizeof(s) - 1));
                size_t max = round % 3 ? 0 : 1 + rand_r(&seed) % 40;
                const unsigned char *p;
                char *out;

                for (i = 0; i < len; i++)
                        s[i] = rand_r(&seed) % 2
                                   ? pick[rand_r(&seed) % sizeof(pick)]
                                   : (unsigned char)(rand_r(&seed) % 255 + 1);
                s[len] = '\0';
                out = untrusted((const char *)s, max);
                p = (const unsigned char *)out;
                ck_assert_ptr_null(strchr(out, 0x1b));
                ck_assert_ptr_null(strpbrk(out, "\n\r\t\x7f"));
                ck_assert_msg(valid_utf8(p), "round %d: invalid UTF-8", round);
                for (i = 0; p[i]; i++) {
                        ck_assert_uint_ge(p[i], 0x20);
                        /* C1 as UTF-8: C2 80..C2 9F */
                        ck_assert(!(p[i] == 0xC2 && p[i + 1] >= 0x80 &&
                                    p[i + 1] <= 0x9F));
                        /* U+200E/F, U+202A-E, U+2066-9, U+061C */
                        ck_assert(!(p[i] == 0xE2 && p[i + 1] == 0x80 &&
                                    (p[i + 2] == 0x8E || p[i + 2] == 0x8F ||
                                     (p[i + 2] >= 0xAA && p[i + 2] <= 0xAE))));
                        ck_assert(!(p[i] == 0xE2 && p[i + 1] == 0x81 &&
                                    p[i + 2] >= 0xA6 && p[i + 2] <= 0xA9));
                        ck_assert(!(p[i] == 0xD8 && p[i + 1] == 0x9C));
                }
                if (max)
                        ck_assert_uint_le(cq_fmt_width(out), max);
                free(out);
                out = cell((const char *)s, 0);
                ck_assert_msg(valid_utf8((const unsigned char *)out),
                              "round %d: invalid UTF-8 in a cell", round);
                ck_assert_ptr_null(strpbrk(out, "\x1b\n\r"));
                free(out);
        }
}
END_TEST

static char *render(cq_table_t *table)
{
        cq_buf_t buf;
        char *out;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_table_render(table, &buf), CQ_OK);
        out = cq_buf_take(&buf, NULL);
        ck_assert_ptr_nonnull(out);
        return out;
}

START_TEST(table_aligns_by_display_width)
{
        static const char *const headers[] = {"JOB", "N", "NOTE"};
        static const int align[] = {CQ_TABLE_LEFT, CQ_TABLE_RIGHT,
                                    CQ_TABLE_LEFT};
        const char *r1[] = {"日本", "7", "ok"};
        const char *r2[] = {"abcde", "123", NULL};
        const char *r3[] = {"x", "", "multi\nline"};
        cq_table_t *table = cq_table_new(3, headers, align, 0);
        char *out;

        ck_assert_ptr_nonnull(table);
        ck_assert_int_eq(cq_table_add(table, r1), 0);
        ck_assert_int_eq(cq_table_add(table, r2), 0);
        ck_assert_int_eq(cq_table_add(table, r3), 0);
        out = render(table);
        ck_assert_str_eq(out, "JOB      N  NOTE\n"
                              "日本     7  ok\n"
                              "abcde  123  -\n"
                              "x           multi line\n");
        free(out);
        cq_table_destroy(&table);
        ck_assert_ptr_null(table);
        cq_table_destroy(&table);
}
END_TEST

START_TEST(table_cuts_wide_cells)
{
        static const char *const headers[] = {"A", "REASON"};
        const char *r1[] = {"1", "a very long reason that goes on"};
        cq_table_t *table = cq_table_new(2, headers, NULL, 10);
        char *out;

        ck_assert_int_eq(cq_table_add(table, r1), 0);
        out = render(table);
        ck_assert_str_eq(out, "A  REASON\n"
                              "1  a very ...\n");
        free(out);
        cq_table_destroy(&table);
        ck_assert_ptr_null(cq_table_new(0, headers, NULL, 0));
}
END_TEST

START_TEST(progress_bar_renders_counts)
{
        cq_progress_t p = {16, 7, 2, 0, 3, 4};
        char line[256];

        cq_fmt_progress(line, sizeof(line), &p, 16);
        ck_assert_str_eq(line, "[#########.......] 9/16 done  7 ok 2 failed  "
                               "3 running  4 queued");
        p = (cq_progress_t){3, 1, 0, 1, 0, 1};
        cq_fmt_progress(line, sizeof(line), &p, 10);
        ck_assert_str_eq(line, "[######....] 2/3 done  1 ok 0 failed 1 "
                               "cancelled  0 running  1 queued");
        p = (cq_progress_t){3, 3, 0, 0, 0, 0};
        cq_fmt_progress(line, sizeof(line), &p, 4);
        ck_assert_str_eq(line,
                         "[####] 3/3 done  3 ok 0 failed  0 running  0 queued");
        /* almost done never shows a full bar */
        p = (cq_progress_t){100, 99, 0, 0, 1, 0};
        cq_fmt_progress(line, sizeof(line), &p, 10);
        ck_assert(strncmp(line, "[#########.]", 12) == 0);
        p = (cq_progress_t){0, 0, 0, 0, 0, 0};
        cq_fmt_progress(line, sizeof(line), &p, 2);
        ck_assert_str_eq(line,
                         "[##] 0/0 done  0 ok 0 failed  0 running  0 queued");
        /* a tiny buffer is cut, never overrun */
        p = (cq_progress_t){16, 7, 2, 0, 3, 4};
        memset(line, 'Z', sizeof(line));
        cq_fmt_progress(line, 12, &p, 40);
        ck_assert_uint_lt(strlen(line), 12);
        ck_assert_int_eq(line[12], 'Z');
}
END_TEST

START_TEST(durations_for_people)
{
        static const struct {
                long long ms;
                const char *want;
        } cases[] = {
            {-1, "-"},          {0, "0ms"},        {850, "850ms"},
            {1000, "1.0s"},     {12345, "12.3s"},  {59999, "59.9s"},
            {60000, "1m00s"},   {245000, "4m05s"}, {3600000, "1h00m"},
            {7380000, "2h03m"},
        };
        char out[32];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                cq_fmt_duration(out, sizeof(out), cases[i].ms);
                ck_assert_str_eq(out, cases[i].want);
        }
}
END_TEST

START_TEST(scalars_as_text)
{
        static const struct {
                const char *json;
                const char *want;
        } cases[] = {
            {"\"text\"", "text"},
            {"null", ""},
            {"42", "42"},
            {"-7", "-7"},
            {"0.875", "0.875"},
            {"true", "true"},
            {"false", "false"},
            {"[1,2]", "[1,2]"},
            {"{\"a\":1}", "{\"a\":1}"},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
                cq_buf_t buf;

                ck_assert_ptr_nonnull(v);
                cq_buf_init(&buf, 1024);
                ck_assert_int_eq(cq_fmt_scalar(&buf, v), CQ_OK);
                ck_assert_str_eq(buf.data ? buf.data : "", cases[i].want);
                cq_buf_release(&buf);
                json_decref(v);
        }
}
END_TEST

START_TEST(image_names_are_safe)
{
        static const struct {
                const char *name;
                const char *want;
        } cases[] = {
            {"plot.png", "plot.png"},
            {"../../etc/passwd", "passwd"},
            {"a/b/c.png", "c.png"},
            {"..\\..\\win.png", "win.png"},
            {"..", "image-0123456789ab.png"},
            {".hidden.png", "hidden.png"},
            {"", "image-0123456789ab.png"},
            {NULL, "image-0123456789ab.png"},
            {"dir/", "image-0123456789ab.png"},
            {"a:b\nc.png", "a_b_c.png"},
        };
        char out[160], variant[200];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                cq_fmt_image_name(cases[i].name, "image/png",
                                  "0123456789abcdef0123", out, sizeof(out));
                ck_assert_msg(strcmp(out, cases[i].want) == 0,
                              "case %zu: got [%s]", i, out);
                ck_assert_ptr_null(strchr(out, '/'));
        }
        cq_fmt_image_name(NULL, "image/jpeg", NULL, out, sizeof(out));
        ck_assert_str_eq(out, "image-unnamed.jpg");
        cq_fmt_image_name(NULL, "text/weird", "ff", out, sizeof(out));
        ck_assert_str_eq(out, "image-ff.bin");
        {
                char longname[400];

                memset(longname, 'x', sizeof(longname));
                memcpy(longname + 390, ".png", 5);
                cq_fmt_image_name(longname, NULL, NULL, out, sizeof(out));
                ck_assert_uint_eq(strlen(out), 100);
                ck_assert_str_eq(out + 96, ".png");
        }
        cq_fmt_name_variant("plot.png", 2, variant, sizeof(variant));
        ck_assert_str_eq(variant, "plot-2.png");
        cq_fmt_name_variant("data", 3, variant, sizeof(variant));
        ck_assert_str_eq(variant, "data-3");
        cq_fmt_name_variant("a.tar.gz", 2, variant, sizeof(variant));
        ck_assert_str_eq(variant, "a.tar-2.gz");
}
END_TEST

/* Random bytes through every helper: no crash, widths stay consistent. */
START_TEST(random_bytes_do_not_crash)
{
        unsigned seed = 12345;
        char s[64], out[160];
        int round, i;

        for (round = 0; round < 2000; round++) {
                int len = (int)(rand_r(&seed) % (sizeof(s) - 1));
                cq_buf_t buf;
                char *c;

                for (i = 0; i < len; i++)
                        s[i] = (char)(rand_r(&seed) % 255 + 1);
                s[len] = '\0';
                (void)cq_fmt_width(s);
                c = cell(s, 10);
                ck_assert_uint_le(cq_fmt_width(c), 10);
                free(c);
                cq_buf_init(&buf, 1 << 16);
                ck_assert_int_eq(cq_fmt_csv_field(&buf, s), CQ_OK);
                cq_buf_release(&buf);
                cq_fmt_image_name(s, "image/png", "ab", out, sizeof(out));
                ck_assert_ptr_null(strchr(out, '/'));
                ck_assert_ptr_null(strchr(out, '\\'));
                ck_assert(out[0] != '\0' && out[0] != '.');
        }
}
END_TEST

static Suite *cli_fmt_suite(void)
{
        Suite *s = suite_create("cli_fmt");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, csv_quotes_only_when_needed);
        tcase_add_test(tc, csv_field_respects_the_cap);
        tcase_add_test(tc, width_counts_columns_not_bytes);
        tcase_add_test(tc, cell_flattens_and_cuts_on_code_points);
        tcase_add_test(tc, cell_replaces_c1_bidi_and_bad_bytes);
        tcase_add_test(tc, untrusted_text_is_escaped_on_one_line);
        tcase_add_test(tc, untrusted_text_is_cut_at_code_points);
        tcase_add_test(tc,
                       untrusted_random_bytes_print_nothing_a_terminal_obeys);
        tcase_add_test(tc, table_aligns_by_display_width);
        tcase_add_test(tc, table_cuts_wide_cells);
        tcase_add_test(tc, progress_bar_renders_counts);
        tcase_add_test(tc, durations_for_people);
        tcase_add_test(tc, scalars_as_text);
        tcase_add_test(tc, image_names_are_safe);
        tcase_add_test(tc, random_bytes_do_not_crash);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cli_fmt_suite)
