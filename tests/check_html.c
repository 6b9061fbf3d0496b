/* SPDX-License-Identifier: MIT */
/* check_html.c - the run report's HTML (cli/html*.c): escaping of
 * hostile and malformed text (fixed cases and random bytes, whose output
 * must be valid UTF-8 with no raw markup and decode back to the input),
 * page names, and the index and job pages rendered from crafted JSON:
 * fields the renderer does not know, costs, hostile values, broken
 * outputs, images, and the Content-Security-Policy hashes of the page's
 * own style and script. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/cli/html.h"
#include "coderq/common/util.h"

static char *escape(const char *s, size_t len)
{
        cq_buf_t buf;
        char *out;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_html_escape(&buf, s, len), CQ_OK);
        out = cq_buf_take(&buf, NULL);
        ck_assert_ptr_nonnull(out);
        return out;
}

START_TEST(escape_fixed_cases)
{
        static const struct {
                const char *in;
                size_t len;
                const char *want;
        } cases[] = {
            {"plain text", 10, "plain text"},
            {"", 0, ""},
            {"<script>alert(1)</script>", 25,
             "&lt;script&gt;alert(1)&lt;/script&gt;"},
            {"<img src=x onerror=\"a('b')\">", 28,
             "&lt;img src=x onerror=&quot;a(&#39;b&#39;)&quot;&gt;"},
            {"&amp; &", 7, "&amp;amp; &amp;"},
            {"tab\tnl\ncr\r", 10, "tab\tnl\ncr\r"},
            /* controls and NUL become visible pictures */
            {"a\0b", 3,
             "a\xe2\x90\x80"
             "b"},
            {"\x01\x1b\x1f\x7f", 4,
             "\xe2\x90\x81\xe2\x90\x9b\xe2\x90\x9f\xe2\x90\xa1"},
            /* valid UTF-8 is kept */
            {"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80", 14,
             "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"},
            {"\xef\xbf\xbf\xc2\x9b", 5, "\xef\xbf\xbf\xc2\x9b"},
            /* malformed UTF-8: one U+FFFD per bad byte */
            {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
            {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
            {"\xe2\x82", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
            {"\xf4\x90\x80\x80", 4,
             "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
            {"\xff<\xfe", 3, "\xef\xbf\xbd&lt;\xef\xbf\xbd"},
            {"\xe0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
            {"x\xf0\x9f\x98", 4, "x\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
            {"\x80\xbf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
        };
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                char *got = escape(cases[i].in, cases[i].len);

                ck_assert_msg(strcmp(got, cases[i].want) == 0,
                              "case %zu: got [%s] want [%s]", i, got,
                              cases[i].want);
                free(got);
        }
        {
                cq_buf_t buf;

                cq_buf_init(&buf, 64);
                ck_assert_int_eq(cq_html_escape(&buf, NULL, 5), CQ_OK);
                ck_assert_uint_eq(buf.len, 0);
                cq_buf_release(&buf);
        }
}
END_TEST

START_TEST(escape_respects_the_buffer_cap)
{
        cq_buf_t buf;

        cq_buf_init(&buf, 16);
        ck_assert_int_eq(cq_html_escape(&buf, "<<<<<<<<", 8), CQ_ERR_TOO_LARGE);
        ck_assert_uint_le(buf.len, 16);
        cq_buf_release(&buf);
}
END_TEST

START_TEST(term_strips_ansi_then_escapes)
{
        static const char in[] = "\x1b[0;31mValueError\x1b[0m: <x>\x1b]0;t\x07"
                                 "\x1b(B done \x1b";
        cq_buf_t buf;

        cq_buf_init(&buf, 1024);
        ck_assert_int_eq(cq_html_term(&buf, in, sizeof(in) - 1), CQ_OK);
        /* a lone ESC goes; what follows it (here "(B") stays as text */
        ck_assert_str_eq(buf.data, "ValueError: &lt;x&gt;(B done ");
        cq_buf_release(&buf);
}
END_TEST

/* Decode what cq_html_escape() writes: the five references back to their
 * characters. Returns NULL when the text holds a '&' that starts none. */
static char *unescape(const char *s, size_t *lenp)
{
        static const char *const refs[][2] = {{"&amp;", "&"},
                                              {"&lt;", "<"},
                                              {"&gt;", ">"},
                                              {"&quot;", "\""},
                                              {"&#39;", "'"}};
        char *out = malloc(strlen(s) + 1);
        size_t o = 0, k;

        ck_assert_ptr_nonnull(out);
        while (*s) {
                bool hit = false;

                for (k = 0; *s == '&' && k < CQ_ARRAY_SIZE(refs); k++) {
                        size_t n = strlen(refs[k][0]);

                        if (strncmp(s, refs[k][0], n) == 0) {
                                out[o++] = refs[k][1][0];
                                s += n;
                                hit = true;
                                break;
                        }
                }
                if (*s == '&' && !hit) {
                        free(out);
                        return NULL;
                }
                if (!hit)
                        out[o++] = *s++;
        }
        out[o] = '\0';
        *lenp = o;
        return out;
}

START_TEST(escape_random_bytes)
{
        /* bytes that matter to HTML and UTF-8, and anything */
        static const unsigned char pool[] = {
            '<',  '>',  '&',  '"',  '\'', '=',  '/',  ' ',  'a',  'Z',
            '\n', '\t', '\r', 0x00, 0x01, 0x1b, 0x7f, 0x80, 0xbf, 0xc2,
            0xc0, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0xa0, 0x9f};
        unsigned seed = 20251201;
        char in[96];
        int iter;

        for (iter = 0; iter < 20000; iter++) {
                size_t len = (size_t)(rand_r(&seed) % (int)sizeof(in)), i;
                char *out, *back;
                size_t olen, blen = 0;
                bool valid, plain = true;

                for (i = 0; i < len; i++)
                        in[i] =
                            (char)(rand_r(&seed) % 3
                                       ? pool[rand_r(&seed) % (int)sizeof(pool)]
                                       : rand_r(&seed) % 256);
                out = escape(in, len);
                olen = strlen(out);
                ck_assert_msg(cq_utf8_valid(out, olen),
                              "iteration %d: invalid UTF-8 out", iter);
                for (i = 0; i < olen; i++) {
                        unsigned char c = (unsigned char)out[i];

                        ck_assert_msg(c != '<' && c != '>' && c != '"' &&
                                          c != '\'' && c != 0x7f &&
                                          (c >= 0x20 || c == '\t' ||
                                           c == '\n' || c == '\r'),
                                      "iteration %d: byte 0x%02x at %zu of "
                                      "[%s]",
                                      iter, c, i, out);
                }
                back = unescape(out, &blen);
                ck_assert_msg(back != NULL, "iteration %d: a bare '&' in [%s]",
                              iter, out);
                /* what was valid text without controls comes back exactly */
                valid = cq_utf8_valid(in, len);
                for (i = 0; i < len; i++) {
                        unsigned char c = (unsigned char)in[i];

                        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') ||
                            c == 0x7f)
                                plain = false;
                }
                if (valid && plain)
                        ck_assert_msg(blen == len && memcmp(back, in, len) == 0,
                                      "iteration %d: not reversible", iter);
                free(back);
                free(out);
        }
}
END_TEST

START_TEST(page_names_are_safe_and_unique)
{
        const char *ids[] = {
            "job-1", "JOB-1", "../../etc/passwd", "a/b",   "a?b",        "a b",
            "job-1", "",      "<script>",         "job-1", "x\xff\xfe\n"};
        char names[CQ_ARRAY_SIZE(ids)][CQ_HTML_NAME_MAX];
        char longid[300];
        size_t i, j, k;

        ck_assert_int_eq(cq_html_page_names(ids, CQ_ARRAY_SIZE(ids), names), 0);
        for (i = 0; i < CQ_ARRAY_SIZE(ids); i++) {
                ck_assert_msg(strncmp(names[i], "job-", 4) == 0, "%s",
                              names[i]);
                ck_assert(strlen(names[i]) > 5 &&
                          strcmp(names[i] + strlen(names[i]) - 5, ".html") ==
                              0);
                for (k = 0; names[i][k]; k++)
                        ck_assert_msg(
                            (names[i][k] >= 'a' && names[i][k] <= 'z') ||
                                (names[i][k] >= 'A' && names[i][k] <= 'Z') ||
                                (names[i][k] >= '0' && names[i][k] <= '9') ||
                                strchr("-_.", names[i][k]),
                            "unsafe %s", names[i]);
                ck_assert_ptr_null(strstr(names[i], ".."));
                for (j = 0; j < i; j++)
                        ck_assert_msg(strcmp(names[i], names[j]) != 0,
                                      "%zu and %zu: %s", i, j, names[i]);
        }
        /* the first of a repeated id keeps its name, the others get -N */
        {
                char plain[CQ_HTML_NAME_MAX], want[CQ_HTML_NAME_MAX + 8];

                cq_html_page_name("job-1", plain);
                ck_assert_str_eq(names[0], plain);
                plain[strlen(plain) - 5] = '\0';
                snprintf(want, sizeof(want), "%s-2.html", plain);
                ck_assert_str_eq(names[6], want);
                snprintf(want, sizeof(want), "%s-3.html", plain);
                ck_assert_str_eq(names[9], want);
        }
        ck_assert(strncmp(names[2], "job-______etc_passwd-", 21) == 0);
        memset(longid, 'z', sizeof(longid) - 1);
        longid[sizeof(longid) - 1] = '\0';
        cq_html_page_name(longid, names[0]);
        ck_assert_uint_eq(strlen(names[0]), 4 + 48 + 1 + 12 + 5);
}
END_TEST

/* 'sha256-...' of \p text, as the page's policy must list it. */
static void csp_hash(const char *text, size_t len, char *out, size_t size)
{
        char hex[65], *b64;
        unsigned char raw[32];
        size_t i;

        cq_sha256_hex(text, len, hex);
        for (i = 0; i < 32; i++) {
                unsigned v;

                ck_assert_int_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
                raw[i] = (unsigned char)v;
        }
        b64 = cq_b64_encode(raw, sizeof(raw), NULL);
        ck_assert_ptr_nonnull(b64);
        snprintf(out, size, "'sha256-%s'", b64);
        free(b64);
}

/* The text between \p open and the next \p close. */
static char *between(const char *page, const char *open, const char *close)
{
        const char *a = strstr(page, open), *b;

        ck_assert_ptr_nonnull(a);
        a += strlen(open);
        b = strstr(a, close);
        ck_assert_ptr_nonnull(b);
        return strndup(a, (size_t)(b - a));
}

static size_t count(const char *hay, const char *needle)
{
        size_t n = 0;

        while ((hay = strstr(hay, needle)) != NULL) {
                n++;
                hay += strlen(needle);
        }
        return n;
}

static const cq_html_meta_t META = {"run-<1>", "2025-12-01T00:00:00Z", "9.9"};

static char *index_page(const json_t *figures, const json_t *rows)
{
        const char *ids[16];
        char names[16][CQ_HTML_NAME_MAX];
        cq_buf_t buf;
        size_t i;
        char *page;

        ck_assert_uint_le(json_array_size(rows), 16);
        for (i = 0; i < json_array_size(rows); i++)
                ids[i] = json_string_value(
                    json_object_get(json_array_get(rows, i), "job_id"));
        ck_assert_int_eq(cq_html_page_names(ids, json_array_size(rows), names),
                         0);
        cq_buf_init(&buf, 1 << 22);
        ck_assert_int_eq(cq_html_index(&buf, &META, figures, rows,
                                       (const char(*)[CQ_HTML_NAME_MAX])names),
                         CQ_OK);
        page = cq_buf_take(&buf, NULL);
        ck_assert_ptr_nonnull(page);
        return page;
}

START_TEST(index_shows_known_and_new_fields)
{
        json_t *rows = json_pack(
            "[{s:s, s:s, s:s, s:n, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:n, "
            "s:f, s:s, s:n, s:s},"
            " {s:s, s:n, s:s, s:s, s:i, s:i, s:i, s:n, s:n, s:i, s:b, s:s, "
            "s:n, s:n, s:s, s:n}]",
            "job_id", "<b>j1</b>", "title", "t\"1", "status", "succeeded",
            "reason", "attempts", 1, "turns", 3, "retries", 0, "tests_passed",
            2, "tests_total", 2, "total_tokens", 1234, "from_memory", 0,
            "memory_source_job", "cost_usd", 0.01234, "model", "gpt-x",
            "retry_of", "sandbox", "bwrap",
            /* the second row */
            "job_id", "j2", "title", "status", "<evil>", "reason",
            "tests: <i>no</i>", "attempts", 2, "turns", 1, "retries", 1,
            "tests_passed", "tests_total", "total_tokens", 5, "from_memory", 1,
            "memory_source_job", "<j1>", "cost_usd", "model", "retry_of",
            "j0\"><script>", "sandbox");
        json_t *summary = json_pack(
            "{s:s, s:s, s:n, s:[], s:{s:i, s:i, s:f, s:f, s:{s:i, s:s}, "
            "s:[{s:s, s:i}, {s:s, s:i}], s:n}}",
            "run_id", "run-<1>", "attempts", "latest", "budget_usd", "models",
            "total", "jobs", 2, "succeeded", 1, "pass_rate", 0.5,
            "p50_duration_ms", 1500.0, "by_status", "failed", 1, "<x>", "<y>",
            "by_model", "model", "<m1>", "jobs", 1, "model", "m2", "jobs", 1,
            "cost_usd");
        static const char want_head[] =
            "<th data-key=\"job_id\" data-type=\"text\"><button "
            "type=\"button\">job</button></th>"
            "<th data-key=\"title\" data-type=\"text\"><button "
            "type=\"button\">title</button></th>"
            "<th data-key=\"model\" data-type=\"text\"><button "
            "type=\"button\">model</button></th>"
            "<th data-key=\"status\" data-type=\"text\"><button "
            "type=\"button\">status</button></th>"
            "<th data-key=\"verdict\" data-type=\"text\"><button "
            "type=\"button\">verdict</button></th>"
            "<th data-key=\"tests_passed\" data-type=\"num\" "
            "class=\"num\"><button type=\"button\">tests</button></th>"
            "<th data-key=\"turns\" data-type=\"num\" class=\"num\">"
            "<button type=\"button\">turns</button></th>"
            "<th data-key=\"cost_usd\" data-type=\"num\" class=\"num\">"
            "<button type=\"button\">cost</button></th>"
            "<th data-key=\"duration_ms\" data-type=\"num\" "
            "class=\"num\"><button type=\"button\">duration</button></th>"
            "<th hidden ";
        char *page, *style, *script, *csp, *head;
        char key[8];
        size_t i;

        /* fields only the second row has, more than any cap would keep */
        json_object_set_new(json_array_get(rows, 1), "late_field",
                            json_string("late <x>"));
        for (i = 0; i < 20; i++) {
                snprintf(key, sizeof(key), "k%02zu", i);
                json_object_set_new(json_array_get(rows, 1), key,
                                    json_integer((json_int_t)i));
        }
        page = index_page(summary, rows);
        char want[128];

        /* the policy lists the page's own style and script by hash */
        csp = between(page, "http-equiv=\"Content-Security-Policy\" content=\"",
                      "\"");
        style = between(page, "<style>", "</style>");
        script = between(page, "<script>", "</script>");
        ck_assert_ptr_nonnull(strstr(csp, "default-src 'none'"));
        ck_assert_ptr_nonnull(strstr(csp, "img-src data:;"));
        csp_hash(style, strlen(style), want, sizeof(want));
        ck_assert_msg(strstr(csp, want) != NULL, "%s lacks %s", csp, want);
        csp_hash(script, strlen(script), want, sizeof(want));
        ck_assert_msg(strstr(csp, want) != NULL, "%s lacks %s", csp, want);
        ck_assert_uint_eq(count(page, "<script"), 1);

        /* the default columns, shown in their order; every other column
         * hidden until chosen */
        head =
            between(page, "<table id=\"jobs\">\n<thead><tr>", "</tr></thead>");
        ck_assert_msg(strncmp(head, want_head, strlen(want_head)) == 0, "%s",
                      head);
        ck_assert_uint_eq(count(head, "<th data-key="), 9);
        /* every other field, the ones only a later row has too: a column
         * and a box in the chooser */
        ck_assert_uint_eq(count(head, "<th hidden data-key="),
                          count(page, "<input type=\"checkbox\"") - 9);
        ck_assert_ptr_nonnull(
            strstr(head, "<th hidden data-key=\"late_field\""));
        ck_assert_ptr_nonnull(strstr(head, "<th hidden data-key=\"k19\" "
                                           "data-type=\"num\""));
        ck_assert_ptr_nonnull(
            strstr(page, "<input type=\"checkbox\" value=\"late_field\">"));
        ck_assert_ptr_nonnull(strstr(page, "<td hidden><span class=\"clip\">"
                                           "late &lt;x&gt;</span></td>"));
        ck_assert_ptr_nonnull(strstr(page, "<input type=\"checkbox\" "
                                           "value=\"job_id\" checked "
                                           "disabled> job</label>"));
        free(head);

        /* known columns, cost (some row has one), model; the unknown key
         * retry_of as a column of its own; sandbox too */
        ck_assert_ptr_nonnull(strstr(page, "data-key=\"cost_usd\" "
                                           "data-type=\"num\""));
        ck_assert_ptr_nonnull(strstr(page, "<button type=\"button\">cost"));
        ck_assert_ptr_nonnull(strstr(page, "$0.0123"));
        ck_assert_ptr_nonnull(strstr(page, "data-key=\"model\""));
        ck_assert_ptr_nonnull(strstr(page, "<button type=\"button\">retry "
                                           "of</button>"));
        ck_assert_ptr_nonnull(strstr(page, "j0&quot;&gt;&lt;script&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "data-key=\"attempts\" "
                                           "data-type=\"num\""));
        ck_assert_ptr_nonnull(strstr(page, "data-key=\"sandbox\" "
                                           "data-type=\"text\""));
        /* hostile values as text; an unknown status gets no class of its
         * own */
        ck_assert_ptr_nonnull(strstr(page, "&lt;b&gt;j1&lt;/b&gt;</a>"));
        ck_assert_ptr_nonnull(strstr(page, "data-status=\"&lt;evil&gt;\""));
        ck_assert_ptr_nonnull(
            strstr(page, "<span class=\"badge s-other\">&lt;evil&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "from &lt;j1&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "tests: &lt;i&gt;no&lt;/i&gt;"));
        ck_assert_ptr_nonnull(strstr(page, ">2/2</span>"));
        ck_assert_ptr_nonnull(strstr(page, "data-v=\"1234\""));
        ck_assert_ptr_null(strstr(page, "<b>"));
        ck_assert_ptr_null(strstr(page, "<evil>"));
        /* the summary: cards, nested objects and arrays of objects */
        ck_assert_ptr_nonnull(strstr(page, "50.0%"));
        ck_assert_ptr_nonnull(strstr(page, "1.5s"));
        ck_assert_ptr_nonnull(strstr(page, "<dt>by status</dt>"));
        ck_assert_ptr_nonnull(strstr(page, "<dt>attempts</dt><dd>latest"));
        ck_assert_ptr_nonnull(strstr(page, "<dt>&lt;x&gt;</dt><dd>&lt;y&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "<td>&lt;m1&gt;</td>"));
        ck_assert_ptr_nonnull(strstr(page, "<h1>Run run-&lt;1&gt;</h1>"));
        ck_assert_uint_eq(count(page, "<tr data-status="), 2);
        free(csp);
        free(style);
        free(script);
        free(page);

        /* columns other than the default ones with no value anywhere are
         * left out; the default ones stay */
        json_object_set_new(json_array_get(rows, 0), "cost_usd", json_null());
        json_object_set_new(json_array_get(rows, 0), "model", json_null());
        json_object_set_new(json_array_get(rows, 1), "retry_of", json_null());
        json_object_set_new(json_array_get(rows, 1), "late_field", json_null());
        page = index_page(NULL, rows);
        ck_assert_ptr_nonnull(strstr(page, "<th data-key=\"cost_usd\""));
        ck_assert_ptr_nonnull(strstr(page, "<th data-key=\"model\""));
        ck_assert_ptr_null(strstr(page, "data-key=\"retry_of\""));
        ck_assert_ptr_null(strstr(page, "data-key=\"late_field\""));
        ck_assert_ptr_null(strstr(page, "value=\"late_field\""));
        ck_assert_ptr_nonnull(strstr(page, "No figures."));
        ck_assert_ptr_null(strstr(page, "id=\"models\""));
        ck_assert_ptr_null(strstr(page, "id=\"samples\""));
        free(page);
        json_decref(rows);
        json_decref(summary);
}
END_TEST

static char *job_page(const json_t *doc,
                      const cq_images_t *images,
                      const cq_html_attempts_t *attempts)
{
        cq_buf_t buf;
        char *page;

        cq_buf_init(&buf, 1 << 22);
        ck_assert_int_eq(cq_html_job(&buf, &META, doc, images, attempts),
                         CQ_OK);
        page = cq_buf_take(&buf, NULL);
        ck_assert_ptr_nonnull(page);
        return page;
}

/* A row of cq_store_report_run() with the keys the index reads. */
static json_t *row_of(const char *id,
                      const char *retry_of,
                      int attempt,
                      bool latest,
                      const char *model,
                      const char *verdict,
                      const char *problem,
                      int sample)
{
        json_t *row = json_pack(
            "{s:s, s:s, s:s, s:n, s:i, s:i, s:b, s:s, s:s, s:i, s:i}", "job_id",
            id, "title", "t", "status",
            verdict && strcmp(verdict, "passed") == 0 ? "succeeded" : "failed",
            "reason_code", "turns", 1, "run_attempt", attempt, "latest", latest,
            "model", model, "verdict", verdict ? verdict : "", "tests_passed",
            1, "tests_total", 2);

        ck_assert_ptr_nonnull(row);
        json_object_set_new(row, "retry_of",
                            retry_of ? json_string(retry_of) : json_null());
        if (!verdict)
                json_object_set_new(row, "verdict", json_null());
        json_object_set_new(row, "problem_id",
                            problem ? json_string(problem) : json_null());
        json_object_set_new(row, "sample_index",
                            problem ? json_integer(sample) : json_null());
        return row;
}

START_TEST(index_compares_models_and_draws_samples)
{
        /* 40 characters: shortened to 18 + U+2026 + 9 */
        static const char long_id[] =
            "0123456789abcdefghij0123456789abcdefghij";
        json_t *rows = json_array(), *figures;
        char *page, *cell;

        /* a job tried twice: the earlier attempt has no row */
        json_array_append_new(rows, row_of(long_id, NULL, 1, false, "m-a",
                                           "wrong_answer", NULL, 0));
        json_array_append_new(rows, row_of("retry-2", long_id, 2, true, "m-a",
                                           "passed", NULL, 0));
        /* problem P: three samples of m-a, one missing index; two of m-b */
        json_array_append_new(
            rows, row_of("P~s0", NULL, 1, true, "m-a", "passed", "P", 0));
        json_array_append_new(
            rows, row_of("P~s1", NULL, 1, true, "m-a", "timeout", "P", 1));
        json_array_append_new(
            rows, row_of("P~s3", NULL, 1, true, "m-a", "infra_error", "P", 3));
        json_array_append_new(
            rows, row_of("Q~s0", NULL, 1, true, "m-b", NULL, "P", 0));
        json_array_append_new(
            rows, row_of("Q~s1", NULL, 1, true, "m-b", "<odd>", "P", 1));
        figures = json_pack(
            "{s:[{s:s, s:i, s:f, s:f, s:n, s:{s:i, s:i}, s:{s:i}, s:i, "
            "s:f, s:i, s:f, s:f}, {s:s, s:i, s:n, s:n, s:n, s:{}, s:{}, s:i, "
            "s:f, s:i, s:n, s:n}], s:{s:n, s:i, s:f, s:f, s:i, s:i}}",
            "models", "model", "m-a", "jobs", 4, "pass_rate", 0.5, "pass_at_1",
            0.25, "pass_at_10", "verdicts", "passed", 2, "<v>", 1, "reasons",
            "<tests>", 1, "total_tokens", 1234, "cost_usd", 0.5, "cost_unknown",
            2, "p50_duration_ms", 1500.0, "p95_duration_ms", 61000.0, "model",
            "m-b", "jobs", 2, "pass_rate", "pass_at_1", "pass_at_10",
            "verdicts", "reasons", "total_tokens", 0, "cost_usd", 0.0,
            "cost_unknown", 0, "p50_duration_ms", "p95_duration_ms", "total",
            "model", "jobs", 6, "pass_rate", 0.4, "pass_at_1", 0.25, "problems",
            2, "samples", 5);
        ck_assert_ptr_nonnull(figures);
        page = index_page(figures, rows);

        /* the figures: pass@1 and the samples, for a run that has them */
        ck_assert_ptr_nonnull(strstr(page, "<div class=\"v\">25.0%</div><div "
                                           "class=\"k\">pass@1</div>"));
        ck_assert_ptr_nonnull(strstr(page, "<div class=\"k\">samples</div>"));
        /* the models side by side, and in all; pass@10 known for none */
        ck_assert_ptr_nonnull(strstr(page, "<th class=\"num\">pass@1</th>"));
        ck_assert_ptr_null(strstr(page, "<th class=\"num\">pass@10</th>"));
        ck_assert_ptr_nonnull(strstr(
            page, "<tr><td><span class=\"clip\">m-a</span></td><td "
                  "class=\"num\">4</td><td class=\"num "
                  "rate\">50.0%</td><td class=\"num\">25.0%</td><td "
                  "class=\"counts verdicts\"><span "
                  "class=\"chip v-passed\">passed <span class=\"n\">2</span>"
                  "</span><span class=\"chip\">&lt;v&gt; <span "
                  "class=\"n\">1</span></span></td><td class=\"counts\"><span "
                  "class=\"chip\">"
                  "&lt;tests&gt; <span class=\"n\">1</span></span></td>"
                  "<td class=\"num\">1234</td><td class=\"num\">$0.5000 "
                  "<span class=\"muted\" title=\"and 2 jobs of unknown "
                  "cost\">+?</span></td><td class=\"num\">1.5s</td>"));
        ck_assert_ptr_nonnull(strstr(page, "<tr class=\"total\"><td>all "
                                           "models</td>"));
        ck_assert_ptr_nonnull(strstr(page, "All figures by model"));

        /* the table: the latest attempt only, with its count; a long id
         * shortened, whole in its title */
        ck_assert_uint_eq(count(page, "<tr data-status="), 6);
        ck_assert_ptr_null(strstr(page, "data-id=\"0123456789abcdefghij"));
        cell =
            between(page, "<tr data-status=\"succeeded\" data-id=\"retry-2\">",
                    "</td>");
        ck_assert_ptr_nonnull(strstr(cell, "&times;2</span>"));
        free(cell);
        ck_assert_ptr_nonnull(strstr(page, "<td data-s=\"retry-2\">"));
        ck_assert_ptr_nonnull(strstr(page, "<span class=\"verdict v-timeout\">"
                                           "timeout</span>"));
        ck_assert_ptr_nonnull(
            strstr(page, "<span class=\"verdict v-none\">&lt;odd&gt;</span>"));

        /* the grid: two rows (one problem, two models), four columns, an
         * empty cell for the missing index, a square per sample */
        cell = between(page, "<section id=\"samples\">", "</section>");
        ck_assert_uint_eq(count(cell, "<th class=\"ix\">"), 4);
        ck_assert_uint_eq(count(cell, "<a class=\"sq "), 5);
        ck_assert_ptr_nonnull(strstr(cell, "<th>model</th>"));
        ck_assert_ptr_nonnull(strstr(cell, "<td class=\"num\">1/2</td>"));
        ck_assert_ptr_nonnull(
            strstr(cell, "title=\"P~s1: timeout\"></a></td><td></td><td><a "
                         "class=\"sq v-infra_error\" href=\"jobs/job-P_s3-"));
        ck_assert_ptr_nonnull(strstr(cell, "title=\"Q~s0: failed\"></a>"));
        ck_assert_ptr_nonnull(strstr(cell, "<td class=\"num\">0/1</td>"));
        ck_assert_ptr_nonnull(strstr(cell, "v-none\" href=\"jobs/job-Q_s1-"));
        ck_assert_uint_eq(count(cell, "<span class=\"key\">"), 9);
        free(cell);
        free(page);

        /* a shortened id: its start and end around U+2026, whole in its
         * title and its link */
        json_object_set_new(json_array_get(rows, 0), "latest", json_true());
        json_object_set_new(json_array_get(rows, 1), "retry_of",
                            json_string("other"));
        page = index_page(NULL, rows);
        ck_assert_ptr_nonnull(
            strstr(page, "title=\"0123456789abcdefghij0123456789abcdefghij\">"
                         "0123456789abcdefgh\xe2\x80\xa6"
                         "bcdefghij</a></td>"));
        ck_assert_ptr_nonnull(strstr(page, "<a href=\"jobs/job-0123456789"));
        ck_assert_ptr_null(strstr(page, "&times;"));
        free(page);

        /* cut at characters, not bytes: 30 two-byte letters and an
         * invalid byte (one U+FFFD) keep 18 and 9 of them */
        {
                char id[80], want[160];
                size_t k, o = 0;

                for (k = 0; k < 30; k++) {
                        id[o++] = (char)0xc3;
                        id[o++] = (char)0xa9;
                }
                id[o++] = (char)0xff;
                id[o] = '\0';
                json_object_set_new(json_array_get(rows, 0), "job_id",
                                    json_string_nocheck(id));
                page = index_page(NULL, rows);
                ck_assert(cq_utf8_valid(page, strlen(page)));
                o = 0;
                o += (size_t)snprintf(want, sizeof(want), "\">");
                for (k = 0; k < 18; k++)
                        o += (size_t)snprintf(want + o, sizeof(want) - o,
                                              "\xc3\xa9");
                o += (size_t)snprintf(want + o, sizeof(want) - o,
                                      "\xe2\x80\xa6");
                for (k = 0; k < 8; k++)
                        o += (size_t)snprintf(want + o, sizeof(want) - o,
                                              "\xc3\xa9");
                snprintf(want + o, sizeof(want) - o, "\xef\xbf\xbd</a>");
                ck_assert_msg(strstr(page, want) != NULL, "%s", want);
                free(page);
        }
        json_decref(rows);
        json_decref(figures);
}
END_TEST

START_TEST(attempts_link_both_ways)
{
        json_t *rows = json_array(), *doc;
        const char *ids[4] = {"other", "orig", "orig~r2", "orig~r3"};
        char names[4][CQ_HTML_NAME_MAX], *page, *want;
        cq_html_attempts_t att;
        size_t i;

        json_array_append_new(
            rows, row_of("other", NULL, 1, true, "m", "passed", NULL, 0));
        json_array_append_new(
            rows, row_of("orig", NULL, 1, false, "m", "wrong_answer", NULL, 0));
        json_array_append_new(
            rows, row_of("orig~r2", "orig", 2, false, "m", "timeout", NULL, 0));
        json_array_append_new(
            rows, row_of("orig~r3", "orig", 3, true, "m", "passed", NULL, 0));
        ck_assert_int_eq(cq_html_page_names(ids, 4, names), 0);
        for (i = 1; i < 4; i++) {
                cq_html_attempts(rows, (const char(*)[CQ_HTML_NAME_MAX])names,
                                 i, &att);
                ck_assert_uint_eq(att.first, 1);
                ck_assert_uint_eq(att.n, 3);
        }
        cq_html_attempts(rows, (const char(*)[CQ_HTML_NAME_MAX])names, 0, &att);
        ck_assert_uint_eq(att.first, 0);
        ck_assert_uint_eq(att.n, 1);

        /* the retry in the middle links to the original and the last
         * retry, not to itself */
        cq_html_attempts(rows, (const char(*)[CQ_HTML_NAME_MAX])names, 2, &att);
        doc = json_pack("{s:{s:s, s:s, s:i, s:s}}", "status", "job_id",
                        "orig~r2", "retry_of", "orig", "run_attempt", 2,
                        "verdict", "timeout");
        page = job_page(doc, NULL, &att);
        ck_assert_ptr_nonnull(strstr(page, "<a href=\"#attempts\">attempt 2 "
                                           "of 3</a>"));
        ck_assert_ptr_nonnull(strstr(page, "<section id=\"attempts\">"));
        ck_assert_uint_eq(count(page, "<a href=\"job-"), 2);
        want = malloc(CQ_HTML_NAME_MAX + 64);
        ck_assert_ptr_nonnull(want);
        snprintf(want, CQ_HTML_NAME_MAX + 64,
                 "<a href=\"%s\"><code>orig</code>", names[1]);
        ck_assert_ptr_nonnull(strstr(page, want));
        snprintf(want, CQ_HTML_NAME_MAX + 64,
                 "<a href=\"%s\"><code>orig~r3</code>", names[3]);
        ck_assert_ptr_nonnull(strstr(page, want));
        ck_assert_ptr_nonnull(strstr(page, "<tr class=\"self\"><td "
                                           "class=\"num\">2</td><td><code>"
                                           "orig~r2</code> (this page)"));
        ck_assert_ptr_nonnull(strstr(page, "<div class=\"v\"><span "
                                           "class=\"verdict v-timeout\">"));
        free(page);
        /* a job tried once lists no attempts */
        cq_html_attempts(rows, (const char(*)[CQ_HTML_NAME_MAX])names, 0, &att);
        page = job_page(doc, NULL, &att);
        ck_assert_ptr_null(strstr(page, "id=\"attempts\""));
        ck_assert_ptr_null(strstr(page, "<a href=\"job-"));
        free(page);
        free(want);
        json_decref(doc);
        json_decref(rows);
}
END_TEST

START_TEST(job_page_draws_only_what_is_safe)
{
        static const unsigned char png[] = {0x89, 'P',  'N', 'G', '\r', '\n',
                                            0x1a, '\n', 1,   2,   3};
        static const char svg[] = "<svg onload=\"x()\"><script>y()</script>"
                                  "</svg>";
        char *png_b64 = cq_b64_encode(png, sizeof(png), NULL), *page, *svg_b64;
        char sha_png[65], want[256];
        cq_image_t img[3];
        cq_images_t images = {img, 3};
        json_t *doc;

        ck_assert_ptr_nonnull(png_b64);
        cq_sha256_hex(png, sizeof(png), sha_png);
        doc = json_pack(
            "{s:{s:s, s:s, s:s, s:i, s:i, s:f}, s:s, s:{s:{s:i, s:i, s:s, "
            "s:s}}, s:[{s:s, s:[{s:s, s:s}, {s:i}]}, {s:s, s:n, s:[{s:s, "
            "s:{s:s, "
            "s:s}}, {s:s, s:{s:o}}]}, {s:s, s:s, s:s}], s:{s:[{s:s, s:s, "
            "s:[s, s], s:n, s:[{s:s, s:{s:[s, s], s:s}, s:{}}, {s:s, s:{s:s}, "
            "s:{}}, {s:s, s:{s:s}, s:{}}, {s:s, s:{s:s}, s:{}}, {s:s, s:{s:o}, "
            "s:{}}, {s:s, s:s}]}]}}",
            "status", "job_id", "j\"1", "title", "", "status", "failed",
            "tests_passed", 0, "tests_total", 1, "cost_usd", 0.5, "answer",
            "<b>answer</b>", "report", "tests", "passed", 0, "total", 1,
            "isolation", "fresh", "error", "\x1b[31mboom <b>\x1b[0m",
            "messages", "role", "user", "content", "type", "text", "text",
            "<i>part</i>", "<weird>", 1, "role", "assistant", "content",
            "tool_calls", "id", "c<1>", "function", "name", "execute_code",
            "arguments", "not json <x>", "id", "c2", "function", "arguments",
            json_pack("{s:s}", "code", "obj <code>"), "role", "tool",
            "tool_call_id", "c<1>", "content", "\x1b[1mbold\x1b[0m <out>",
            "notebook", "cells", "cell_type", "code", "id", "c1", "source",
            "a = 1\n", "b = '<x>'", "execution_count", "outputs", "output_type",
            "display_data", "data", "image/png", png_b64, "\n", "text/plain",
            "<Figure>", "metadata", "output_type", "display_data", "data",
            "image/svg+xml", svg, "metadata", "output_type", "display_data",
            "data", "image/jpeg", "\"><script>z()</script>", "metadata",
            "output_type", "display_data", "data", "text/markdown", "**<md>**",
            "metadata", "output_type", "display_data", "data",
            "application/json", json_pack("{s:s}", "k", "<v>"), "metadata",
            "output_type", "weird", "x", "<y>");
        ck_assert_ptr_nonnull(doc);
        /* the stored images: the notebook's PNG (drawn once), a BMP (not
         * drawn), a GIF under a hostile name */
        memset(img, 0, sizeof(img));
        memcpy(img[0].sha256, sha_png, 65);
        img[0].name = (char *)(uintptr_t) "cell1-1.png";
        img[0].mime = (char *)(uintptr_t) "image/png";
        img[0].data = (unsigned char *)(uintptr_t)png;
        img[0].len = sizeof(png);
        memset(img[1].sha256, 'b', 64);
        img[1].name = (char *)(uintptr_t) "x.bmp";
        img[1].mime = (char *)(uintptr_t) "image/bmp";
        img[1].data = (unsigned char *)(uintptr_t) "BM";
        img[1].len = 2;
        memset(img[2].sha256, 'c', 64);
        img[2].name = (char *)(uintptr_t) "<img onerror=1>.gif";
        img[2].mime = (char *)(uintptr_t) "image/gif";
        img[2].data = (unsigned char *)(uintptr_t) "GIF89a";
        img[2].len = 6;

        page = job_page(doc, &images, NULL);
        ck_assert_uint_eq(count(page, "<script"), 0);
        ck_assert_ptr_nonnull(strstr(page, "script-src 'none'"));
        ck_assert_ptr_null(strstr(page, "<svg"));
        ck_assert_ptr_null(strstr(page, "\x1b"));
        /* an empty title: the id heads the page */
        ck_assert_ptr_nonnull(strstr(page, "<h1>j&quot;1</h1>"));
        ck_assert_ptr_nonnull(strstr(page, "$0.5000"));
        ck_assert_ptr_nonnull(strstr(page, "&lt;b&gt;answer&lt;/b&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "boom &lt;b&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "<dt>isolation</dt><dd>fresh"));
        /* the transcript: parts, raw arguments, object arguments, ANSI
         * stripped from tool results */
        ck_assert_ptr_nonnull(strstr(page, "&lt;i&gt;part&lt;/i&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "&quot;&lt;weird&gt;&quot;: 1"));
        ck_assert_ptr_nonnull(strstr(page, "not json &lt;x&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "obj &lt;code&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "<pre>bold &lt;out&gt;</pre>"));
        /* the notebook: PNG (line-split base64) and SVG drawn from bytes
         * encoded here, the broken JPEG not, markdown and JSON as text */
        snprintf(want, sizeof(want), "<img src=\"data:image/png;base64,%s\"",
                 png_b64);
        ck_assert_ptr_nonnull(strstr(page, want));
        svg_b64 = cq_b64_encode(svg, strlen(svg), NULL);
        snprintf(want, sizeof(want),
                 "<img src=\"data:image/svg+xml;base64,%s\"", svg_b64);
        ck_assert_ptr_nonnull(strstr(page, want));
        free(svg_b64);
        ck_assert_ptr_nonnull(strstr(page, "[image/jpeg output not shown"));
        ck_assert_ptr_nonnull(strstr(page, "**&lt;md&gt;**"));
        ck_assert_ptr_nonnull(strstr(page, "&lt;v&gt;"));
        ck_assert_ptr_nonnull(strstr(page, "a = 1\nb = &#39;&lt;x&gt;&#39;"));
        ck_assert_ptr_nonnull(strstr(page, "&quot;&lt;y&gt;&quot;"));
        /* stored images: the PNG not again, the GIF drawn, the BMP named */
        ck_assert_uint_eq(count(page, "data:image/png"), 1);
        ck_assert_ptr_nonnull(strstr(page, "data:image/gif;base64,R0lGODlh"));
        ck_assert_ptr_nonnull(strstr(page, "alt=\"&lt;img onerror=1&gt;.gif"));
        ck_assert_ptr_nonnull(strstr(page, "x.bmp &middot; image/bmp"));
        ck_assert_ptr_null(strstr(page, "data:image/bmp"));
        ck_assert_uint_eq(count(page, "<img "), 3);
        free(page);
        json_decref(doc);

        /* a job with nothing but an id, or nothing at all */
        doc = json_pack("{s:{s:s}}", "status", "job_id", "bare");
        page = job_page(doc, NULL, NULL);
        ck_assert_ptr_nonnull(strstr(page, "No messages."));
        ck_assert_ptr_nonnull(strstr(page, "No cells."));
        ck_assert_ptr_nonnull(strstr(page, "No final answer."));
        free(page);
        json_decref(doc);
        doc = json_object();
        page = job_page(doc, NULL, NULL);
        ck_assert_ptr_nonnull(strstr(page, "</html>\n"));
        free(page);
        json_decref(doc);
        free(png_b64);
}
END_TEST

static Suite *html_suite(void)
{
        Suite *s = suite_create("html");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 120); /* the random bytes, under ASan */
        tcase_add_test(tc, escape_fixed_cases);
        tcase_add_test(tc, escape_respects_the_buffer_cap);
        tcase_add_test(tc, term_strips_ansi_then_escapes);
        tcase_add_test(tc, escape_random_bytes);
        tcase_add_test(tc, page_names_are_safe_and_unique);
        tcase_add_test(tc, index_shows_known_and_new_fields);
        tcase_add_test(tc, job_page_draws_only_what_is_safe);
        tcase_add_test(tc, index_compares_models_and_draws_samples);
        tcase_add_test(tc, attempts_link_both_ways);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(html_suite)
