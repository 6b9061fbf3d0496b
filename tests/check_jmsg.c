/* SPDX-License-Identifier: MIT */
/* check_jmsg.c - Jupyter wire messages: golden HMAC from Python's hmac,
 * build/parse round trips, and malformed input that must be dropped and
 * counted, never crash. No kernel needed. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/local/jmsg.h"

static const char *const golden_names[4] = {"header", "parent_header",
                                            "metadata", "content"};

START_TEST(golden_signature_matches_python)
{
        char *files[4], *key, *expected, path[128], hex[CQ_JMSG_SIG_LEN + 1];
        cq_jframe_t dicts[4];
        size_t keylen, elen, len;
        int i;

        key = cq_check_slurp(cq_check_srcpath("tests/data/jmsg/golden/key"),
                             &keylen);
        expected = cq_check_slurp(
            cq_check_srcpath("tests/data/jmsg/golden/expected"), &elen);
        for (i = 0; i < 4; i++) {
                snprintf(path, sizeof(path), "tests/data/jmsg/golden/%s",
                         golden_names[i]);
                files[i] = cq_check_slurp(cq_check_srcpath(path), &len);
                dicts[i].data = files[i];
                dicts[i].len = len;
        }
        ck_assert_int_eq(cq_jmsg_sign(key, keylen, dicts, hex), 0);
        ck_assert_uint_eq(elen, 65);
        expected[64] = '\0';
        ck_assert_str_eq(hex, expected);
        for (i = 0; i < 4; i++)
                free(files[i]);
        free(key);
        free(expected);
}
END_TEST

/* A full received message: idents..., delimiter, sig, 4 dicts. */
typedef struct wire {
        cq_jframe_t f[12];
        size_t n;
        cq_jmsg_out_t out;
} wire_t;

static const char key[] = "0123abcd-4567ef";

static void wire_build(wire_t *w, int topics, const char *type)
{
        json_t *content =
            json_pack("{s:s, s:s}", "name", "stdout", "text", "hi");
        json_t *parent = json_pack("{s:s}", "msg_id", "req-1");
        int i;

        ck_assert_int_eq(cq_jmsg_build(key, strlen(key), "sess", 7, type,
                                       &content, parent, &w->out),
                         0);
        ck_assert_ptr_null(content);
        json_decref(parent);
        w->n = 0;
        for (i = 0; i < topics; i++) {
                w->f[w->n].data = "kernel.abc.stream";
                w->f[w->n++].len = 17;
        }
        w->f[w->n].data = CQ_JMSG_DELIM;
        w->f[w->n++].len = 9;
        w->f[w->n].data = w->out.sig;
        w->f[w->n++].len = strlen(w->out.sig);
        for (i = 0; i < 4; i++) {
                w->f[w->n].data = w->out.frames[i];
                w->f[w->n++].len = w->out.lens[i];
        }
}

START_TEST(round_trip_with_topic_frames)
{
        wire_t w;
        cq_jmsg_t msg;
        cq_jmsg_stats_t stats = {0};
        int topics;

        for (topics = 0; topics <= 3; topics++) {
                wire_build(&w, topics, "stream");
                ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n,
                                               1 << 20, &msg, &stats, NULL, 0),
                                 CQ_JMSG_DROP_NONE);
                ck_assert_str_eq(msg.msg_type, "stream");
                ck_assert_str_eq(msg.msg_id, "sess_7");
                ck_assert_str_eq(msg.parent_id, "req-1");
                ck_assert_str_eq(
                    json_string_value(json_object_get(msg.content, "text")),
                    "hi");
                /* header date has 6-digit microseconds and a Z */
                ck_assert_uint_eq(strlen(json_string_value(
                                      json_object_get(msg.header, "date"))),
                                  27);
                cq_jmsg_release(&msg);
                cq_jmsg_out_release(&w.out);
        }
        ck_assert_uint_eq(stats.received, 4);
}
END_TEST

START_TEST(bad_signatures_are_dropped)
{
        wire_t w;
        cq_jmsg_t msg;
        cq_jmsg_stats_t stats = {0};
        char errstr[128];
        char sig[CQ_JMSG_SIG_LEN + 2];

        wire_build(&w, 1, "stream");
        /* one flipped hex digit */
        memcpy(sig, w.out.sig, CQ_JMSG_SIG_LEN + 1);
        sig[10] = sig[10] == 'a' ? 'b' : 'a';
        w.f[2].data = sig;
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n, 1 << 20,
                                       &msg, &stats, errstr, sizeof(errstr)),
                         CQ_JMSG_DROP_SIGNATURE);
        ck_assert_ptr_nonnull(strstr(errstr, "mismatch"));
        ck_assert_ptr_null(msg.content);
        /* too short, too long, empty */
        w.f[2].len = 63;
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n, 1 << 20,
                                       &msg, &stats, errstr, sizeof(errstr)),
                         CQ_JMSG_DROP_SIGNATURE);
        ck_assert_ptr_nonnull(strstr(errstr, "64"));
        memcpy(sig, w.out.sig, CQ_JMSG_SIG_LEN);
        sig[64] = 'f';
        w.f[2].len = 65;
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n, 1 << 20,
                                       &msg, &stats, NULL, 0),
                         CQ_JMSG_DROP_SIGNATURE);
        w.f[2].len = 0;
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n, 1 << 20,
                                       &msg, &stats, NULL, 0),
                         CQ_JMSG_DROP_SIGNATURE);
        /* wrong key */
        w.f[2].data = w.out.sig;
        w.f[2].len = CQ_JMSG_SIG_LEN;
        ck_assert_int_eq(
            cq_jmsg_parse("other", 5, w.f, w.n, 1 << 20, &msg, &stats, NULL, 0),
            CQ_JMSG_DROP_SIGNATURE);
        ck_assert_uint_eq(stats.bad_signature, 5);
        ck_assert_uint_eq(stats.received, 0);
        cq_jmsg_out_release(&w.out);
}
END_TEST

START_TEST(structural_errors_are_dropped)
{
        wire_t w;
        cq_jmsg_t msg;
        cq_jmsg_stats_t stats = {0};
        char errstr[128];
        size_t cut;

        wire_build(&w, 1, "stream");
        /* missing delimiter */
        w.f[1].data = "<IDS|MSH>";
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n, 1 << 20,
                                       &msg, &stats, errstr, sizeof(errstr)),
                         CQ_JMSG_DROP_MALFORMED);
        ck_assert_ptr_nonnull(strstr(errstr, "delimiter"));
        w.f[1].data = CQ_JMSG_DELIM;
        /* every truncation of the frame list */
        for (cut = 0; cut < w.n; cut++)
                ck_assert_int_ne(cq_jmsg_parse(key, strlen(key), w.f, cut,
                                               1 << 20, &msg, &stats, NULL, 0),
                                 CQ_JMSG_DROP_NONE);
        /* oversize frame */
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n, 16, &msg,
                                       &stats, NULL, 0),
                         CQ_JMSG_DROP_OVERSIZE);
        ck_assert_uint_eq(stats.oversize, 1);
        /* too many frames */
        ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f,
                                       CQ_JMSG_MAX_FRAMES + 1, 1 << 20, &msg,
                                       &stats, NULL, 0),
                         CQ_JMSG_DROP_MALFORMED);
        cq_jmsg_out_release(&w.out);
}
END_TEST

/* Correctly signed but hostile JSON must still be rejected cleanly. */
static cq_jmsg_drop_t parse_signed(const char *h,
                                   const char *p,
                                   const char *m,
                                   const char *c,
                                   size_t clen,
                                   cq_jmsg_t *msg)
{
        cq_jframe_t f[6];
        char sig[CQ_JMSG_SIG_LEN + 1];

        f[0].data = CQ_JMSG_DELIM;
        f[0].len = 9;
        f[2].data = h;
        f[2].len = strlen(h);
        f[3].data = p;
        f[3].len = strlen(p);
        f[4].data = m;
        f[4].len = strlen(m);
        f[5].data = c;
        f[5].len = clen;
        ck_assert_int_eq(cq_jmsg_sign(key, strlen(key), &f[2], sig), 0);
        f[1].data = sig;
        f[1].len = strlen(sig);
        return cq_jmsg_parse(key, strlen(key), f, 6, 1 << 20, msg, NULL, NULL,
                             0);
}

START_TEST(hostile_json_is_rejected_or_repaired)
{
        static const char hdr[] = "{\"msg_id\":\"x\",\"msg_type\":\"stream\"}";
        static const char bad_utf8[] = "{\"text\":\"a\xff"
                                       "b\"}";
        static const char nul[] = "{\"text\":\"a\\u0000b\"}";
        cq_jmsg_t msg;
        json_t *text;

        ck_assert_int_eq(parse_signed("[1,2]", "{}", "{}", "{}", 2, &msg),
                         CQ_JMSG_DROP_MALFORMED);
        ck_assert_int_eq(parse_signed(hdr, "{}", "{}", "\"str\"", 5, &msg),
                         CQ_JMSG_DROP_MALFORMED);
        ck_assert_int_eq(parse_signed(hdr, "{}", "{}", "{\"a\":", 5, &msg),
                         CQ_JMSG_DROP_MALFORMED);
        ck_assert_int_eq(parse_signed("{\"msg_id\":1,\"msg_type\":\"s\"}", "{}",
                                      "{}", "{}", 2, &msg),
                         CQ_JMSG_DROP_MALFORMED);
        ck_assert_int_eq(parse_signed(hdr, "null", "{}", "{}", 2, &msg),
                         CQ_JMSG_DROP_MALFORMED);
        /* invalid UTF-8 is repaired to U+FFFD */
        ck_assert_int_eq(
            parse_signed(hdr, "{}", "{}", bad_utf8, strlen(bad_utf8), &msg),
            CQ_JMSG_DROP_NONE);
        ck_assert_str_eq(
            json_string_value(json_object_get(msg.content, "text")),
            "a\xef\xbf\xbd"
            "b");
        ck_assert_ptr_null(msg.parent_id);
        cq_jmsg_release(&msg);
        /* NUL survives */
        ck_assert_int_eq(parse_signed(hdr, "{}", "{}", nul, strlen(nul), &msg),
                         CQ_JMSG_DROP_NONE);
        text = json_object_get(msg.content, "text");
        ck_assert_uint_eq(json_string_length(text), 3);
        ck_assert_int_eq(memcmp(json_string_value(text), "a\0b", 3), 0);
        cq_jmsg_release(&msg);
}
END_TEST

START_TEST(fuzz_random_frames)
{
        unsigned int seed = 12345;
        cq_jmsg_stats_t stats = {0};
        unsigned char *bufs[10];
        cq_jframe_t f[10];
        wire_t w;
        int iter, i;

        for (i = 0; i < 10; i++)
                bufs[i] = malloc(256);
        for (iter = 0; iter < 20000; iter++) {
                size_t n = (size_t)(rand_r(&seed) % 10);
                cq_jmsg_t msg;

                for (i = 0; i < (int)n; i++) {
                        size_t len = (size_t)(rand_r(&seed) % 256), k;

                        for (k = 0; k < len; k++)
                                bufs[i][k] = (unsigned char)rand_r(&seed);
                        f[i].data = bufs[i];
                        f[i].len = len;
                        if (rand_r(&seed) % 4 == 0) {
                                f[i].data = CQ_JMSG_DELIM;
                                f[i].len = 9;
                        }
                }
                ck_assert_int_ne(cq_jmsg_parse(key, strlen(key), f, n, 128,
                                               &msg, &stats, NULL, 0),
                                 CQ_JMSG_DROP_NONE);
        }
        /* signed messages with random bytes flipped in the dict frames */
        for (iter = 0; iter < 2000; iter++) {
                cq_jmsg_t msg;
                size_t fi, pos;
                char *frame;

                wire_build(&w, iter % 2, "stream");
                fi = 2 + (size_t)(iter % 2) + (size_t)(rand_r(&seed) % 4);
                frame = w.out.frames[fi - 2 - (size_t)(iter % 2)];
                pos = (size_t)rand_r(&seed) % w.f[fi].len;
                frame[pos] = (char)(frame[pos] ^ (1 + rand_r(&seed) % 255));
                ck_assert_int_eq(cq_jmsg_parse(key, strlen(key), w.f, w.n,
                                               1 << 20, &msg, &stats, NULL, 0),
                                 CQ_JMSG_DROP_SIGNATURE);
                cq_jmsg_out_release(&w.out);
        }
        ck_assert_uint_eq(stats.received, 0);
        for (i = 0; i < 10; i++)
                free(bufs[i]);
}
END_TEST

static Suite *cq_jmsg_suite(void)
{
        Suite *s = suite_create("jmsg");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, golden_signature_matches_python);
        tcase_add_test(tc, round_trip_with_topic_frames);
        tcase_add_test(tc, bad_signatures_are_dropped);
        tcase_add_test(tc, structural_errors_are_dropped);
        tcase_add_test(tc, hostile_json_is_rejected_or_repaired);
        tcase_add_test(tc, fuzz_random_frames);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_jmsg_suite)
