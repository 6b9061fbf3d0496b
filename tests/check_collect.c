/* SPDX-License-Identifier: MIT */
/* check_collect.c - the output collector both backends share: sizes by
 * serialization, head and tail around a marker with the true count,
 * display updates recounted, drops reported by a backend, clear_output,
 * and a random sequence checked against a model of the bytes sent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/interp/collect.h"

static json_t *stream(const char *name, const char *text)
{
        return json_pack("{s:s, s:s, s:s}", "output_type", "stream", "name",
                         name, "text", text);
}

/* A display of \p n bytes of 'd' as text/plain, shown as \p id. */
static json_t *display(size_t n, const char *id, json_t *meta)
{
        char *text = malloc(n + 1);
        json_t *out;

        ck_assert_ptr_nonnull(text);
        memset(text, 'd', n);
        text[n] = '\0';
        out = json_pack("{s:s, s:{s:s}, s:o}", "output_type", "display_data",
                        "data", "text/plain", text, "metadata",
                        meta ? meta : json_object());
        ck_assert_ptr_nonnull(out);
        if (id)
                json_object_set_new(out, "transient",
                                    json_pack("{s:s}", "display_id", id));
        free(text);
        return out;
}

static size_t dumped_len(const json_t *v)
{
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        size_t n;

        ck_assert_ptr_nonnull(s);
        n = strlen(s);
        free(s);
        return n;
}

/* The count in the marker of \p outputs, -1 without one. */
static long long marker_count(const json_t *outputs, bool *at_leastp)
{
        size_t i;
        json_t *v;

        *at_leastp = false;
        json_array_foreach(outputs, i, v)
        {
                const char *text =
                    json_string_value(json_object_get(v, "text"));
                const char *m = text ? strstr(text, CQ_COLLECT_MARK) : NULL;
                long long n;

                if (!m)
                        continue;
                m += strlen(CQ_COLLECT_MARK);
                if (strncmp(m, "at least ", 9) == 0) {
                        *at_leastp = true;
                        m += 9;
                }
                ck_assert_int_eq(sscanf(m, "%lld bytes dropped", &n), 1);
                return n;
        }
        return -1;
}

/* Bytes of the outputs but the marker. */
static size_t kept(const json_t *outputs)
{
        size_t i, n = 0;
        json_t *v;

        json_array_foreach(outputs, i, v)
        {
                const char *text =
                    json_string_value(json_object_get(v, "text"));
                const char *m =
                    text ? strstr(text, "\n" CQ_COLLECT_MARK) : NULL;

                n += cq_collect_size(v);
                if (m) /* the marker may have merged with stderr around */
                        n -= (size_t)(strstr(m, " ...]\n") + 6 - m);
        }
        return n;
}

static void add(cq_collect_t *col, json_t *out)
{
        cq_collect_add(col, &out);
        ck_assert_ptr_null(out);
}

START_TEST(sizes_count_every_byte)
{
        json_t *meta = json_pack("{s:[i,i,i]}", "m", 1, 2, 3);
        json_t *s = stream("stdout", "h\xc3\xa9llo");
        json_t *d = display(10, "x", json_incref(meta));
        json_t *j =
            json_pack("{s:s, s:{s:[i,i]}, s:{}}", "output_type", "display_data",
                      "data", "application/json", 1, 22, "metadata");

        /* a stream: its text's UTF-8 bytes */
        ck_assert_uint_eq(cq_collect_size(s), 6);
        /* anything else: its serialization, metadata and transient too */
        ck_assert_uint_eq(cq_collect_size(d), dumped_len(d));
        ck_assert_uint_gt(cq_collect_size(d), 10 + dumped_len(meta));
        ck_assert_uint_eq(cq_collect_size(j), dumped_len(j));
        json_decref(meta);
        json_decref(s);
        json_decref(d);
        json_decref(j);
}
END_TEST

START_TEST(head_tail_and_the_true_count)
{
        cq_collect_t col;
        json_t *outs, *d = display(5000, NULL, NULL);
        bool at_least;
        char text[101];
        size_t big = dumped_len(d);
        int i;

        json_decref(d);
        memset(text, 'a', 100);
        text[100] = '\0';
        ck_assert_int_eq(cq_collect_init(&col, 1000, NULL, NULL), 0);
        for (i = 0; i < 30; i++) /* 3000 bytes */
                add(&col, stream("stdout", text));
        add(&col, display(5000, NULL, NULL)); /* larger than the tail */
        add(&col, stream("stdout", "END"));
        ck_assert(cq_collect_truncated(&col));
        outs = cq_collect_finish(&col);
        ck_assert_ptr_nonnull(outs);
        /* the head; the display pushed the streams out of the tail and
         * did not fit in it either; then "END" */
        ck_assert_uint_eq(kept(outs), 500 + 3);
        ck_assert_int_eq(marker_count(outs, &at_least),
                         (long long)(3000 + big + 3 - 503));
        ck_assert(!at_least);
        json_decref(outs);
        cq_collect_release(&col);
}
END_TEST

START_TEST(updates_are_recounted)
{
        cq_collect_t col;
        json_t *outs, *data, *big, *shown = display(5000, "p", NULL);
        bool at_least;
        size_t grown = dumped_len(shown);
        int i;

        json_decref(shown);
        ck_assert_int_eq(cq_collect_init(&col, 2000, NULL, NULL), 0);
        add(&col, display(1, "p", NULL));
        add(&col, stream("stdout", "x"));
        /* many updates, the last one wins and nothing is dropped */
        for (i = 0; i < 1000; i++) {
                data = json_pack("{s:i}", "text/plain", i);
                cq_collect_update(&col, "p", data, NULL);
                json_decref(data);
        }
        data = json_pack("{s:s}", "text/plain", "last");
        cq_collect_update(&col, "p", data, NULL);
        /* an update of a display of an earlier cell is not ours */
        cq_collect_update(&col, "elsewhere", data, NULL);
        json_decref(data);
        ck_assert(!cq_collect_truncated(&col));
        outs = cq_collect_finish(&col);
        ck_assert_uint_eq(json_array_size(outs), 2);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(json_array_get(outs, 0), "data"),
                             "text/plain")),
                         "last");
        json_decref(outs);

        /* an update that no longer fits in the head drops the display,
         * and later updates of it count as dropped */
        big = display(5000, NULL, NULL);
        cq_collect_update(&col, "p", json_object_get(big, "data"), NULL);
        ck_assert(cq_collect_truncated(&col));
        cq_collect_update(&col, "p", json_object_get(big, "data"), NULL);
        outs = cq_collect_finish(&col);
        ck_assert_uint_eq(json_array_size(outs), 2); /* "x", the marker */
        /* the grown display, then the update's data and "{}" metadata */
        ck_assert_int_eq(
            marker_count(outs, &at_least),
            (long long)(grown + dumped_len(json_object_get(big, "data")) + 2));
        json_decref(outs);
        json_decref(big);
        cq_collect_release(&col);
}
END_TEST

START_TEST(drops_reported_by_a_backend_and_clear)
{
        cq_collect_t col;
        json_t *outs;
        bool at_least;

        ck_assert_int_eq(cq_collect_init(&col, 1000, NULL, NULL), 0);
        add(&col, stream("stdout", "head "));
        cq_collect_dropped(&col, 12345, false);
        /* after a drop the head is closed: this goes after the marker */
        add(&col, stream("stdout", "tail"));
        outs = cq_collect_finish(&col);
        ck_assert_uint_eq(json_array_size(outs), 3);
        ck_assert_str_eq(
            json_string_value(json_object_get(json_array_get(outs, 0), "text")),
            "head ");
        ck_assert_str_eq(
            json_string_value(json_object_get(json_array_get(outs, 2), "text")),
            "tail");
        ck_assert_int_eq(marker_count(outs, &at_least), 12345);
        ck_assert(!at_least);
        json_decref(outs);

        cq_collect_dropped(&col, 1000, true);
        outs = cq_collect_finish(&col);
        ck_assert_int_eq(marker_count(outs, &at_least), 13345);
        ck_assert(at_least);
        json_decref(outs);

        /* clear_output(wait=True): everything goes at the next output */
        cq_collect_clear(&col, true);
        ck_assert(cq_collect_truncated(&col));
        add(&col, stream("stdout", "fresh"));
        ck_assert(!cq_collect_truncated(&col));
        outs = cq_collect_finish(&col);
        ck_assert_uint_eq(json_array_size(outs), 1);
        ck_assert_str_eq(
            json_string_value(json_object_get(json_array_get(outs, 0), "text")),
            "fresh");
        json_decref(outs);
        cq_collect_release(&col);
}
END_TEST

static unsigned long rng_state = 12345;

static unsigned long rng(void)
{
        rng_state = rng_state * 6364136223846793005UL + 1442695040888963407UL;
        return rng_state >> 33;
}

/* Without updates: kept + dropped is every byte sent, kept is within the
 * cap, and the callback saw exactly the head. */
static size_t cb_bytes;

static void on_output(void *opaque, const json_t *out)
{
        (void)opaque;
        if (!strstr(json_string_value(json_object_get(out, "text"))
                        ? json_string_value(json_object_get(out, "text"))
                        : "",
                    "output cap reached"))
                cb_bytes += cq_collect_size(out);
}

START_TEST(random_outputs_add_up)
{
        int round;

        for (round = 0; round < 200; round++) {
                cq_collect_t col;
                size_t max = 1 + rng() % 4000, sent = 0;
                int n = (int)(rng() % 60), i;
                json_t *outs;
                bool at_least;
                long long dropped;

                cb_bytes = 0;
                ck_assert_int_eq(cq_collect_init(&col, max, on_output, NULL),
                                 0);
                for (i = 0; i < n; i++) {
                        json_t *out;

                        if (rng() % 3) {
                                /* multibyte text, cut anywhere */
                                size_t len = rng() % 700, k;
                                char *text = malloc(len * 2 + 1), *p = text;

                                ck_assert_ptr_nonnull(text);
                                for (k = 0; k < len; k++) {
                                        if (rng() % 4 == 0) {
                                                *p++ = '\xc3';
                                                *p++ = '\xa9';
                                        } else {
                                                *p++ = 'a';
                                        }
                                }
                                *p = '\0';
                                out = stream(rng() % 2 ? "stdout" : "stderr",
                                             text);
                                free(text);
                        } else {
                                out = display(rng() % 900, NULL, NULL);
                        }
                        sent += cq_collect_size(out);
                        add(&col, out);
                }
                outs = cq_collect_finish(&col);
                ck_assert_ptr_nonnull(outs);
                dropped = marker_count(outs, &at_least);
                ck_assert(!at_least);
                ck_assert_uint_le(kept(outs), max);
                ck_assert_uint_eq(
                    kept(outs) + (size_t)(dropped < 0 ? 0 : dropped), sent);
                ck_assert(cq_collect_truncated(&col) == (dropped > 0));
                ck_assert_uint_le(cb_bytes, max / 2);
                json_decref(outs);
                cq_collect_release(&col);
        }
}
END_TEST

static Suite *collect_suite(void)
{
        Suite *s = suite_create("collect");
        TCase *tc = tcase_create("collect");

        tcase_add_test(tc, sizes_count_every_byte);
        tcase_add_test(tc, head_tail_and_the_true_count);
        tcase_add_test(tc, updates_are_recounted);
        tcase_add_test(tc, drops_reported_by_a_backend_and_clear);
        tcase_add_test(tc, random_outputs_add_up);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(collect_suite)
