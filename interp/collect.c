/* SPDX-License-Identifier: MIT */
/* collect.c - the output collector of both backends: every byte a cell
 * sends is counted, a head and a tail are kept around one marker that
 * states the bytes dropped. Memory stays within the cap plus what one
 * output in flight weighs; see collect.h. */
#include "coderq/interp/collect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Display ids of dropped outputs remembered to count their updates. */
#define LOST_IDS_MAX 256

static const char cap_note[] = "\n[coderq: output cap reached; only the tail "
                               "of the remaining output is kept]\n";

static int count_cb(const char *buffer, size_t size, void *data)
{
        (void)buffer;
        *(size_t *)data += size;
        return 0;
}

/* Length of the compact serialization of \p v (0 for NULL). */
static size_t json_size(const json_t *v)
{
        size_t n = 0;

        if (v && json_dump_callback(v, count_cb, &n,
                                    JSON_COMPACT | JSON_ENCODE_ANY) != 0)
                return 0;
        return n;
}

static bool is_stream(const json_t *out, const char **namep)
{
        const char *type =
            json_string_value(json_object_get(out, "output_type"));
        const char *name = json_string_value(json_object_get(out, "name"));

        if (!type || strcmp(type, "stream") != 0 || !name ||
            !json_is_string(json_object_get(out, "text")))
                return false;
        if (namep)
                *namep = name;
        return true;
}

size_t cq_collect_size(const json_t *output)
{
        if (is_stream(output, NULL))
                return json_string_length(json_object_get(output, "text"));
        return json_size(output);
}

int cq_collect_init(cq_collect_t *col,
                    size_t max,
                    cq_interp_output_cb_t *cb,
                    void *opaque)
{
        memset(col, 0, sizeof(*col));
        col->head_max = max / 2;
        col->tail_max = max - col->head_max;
        col->cb = cb;
        col->opaque = opaque;
        col->head = json_array();
        col->tail = json_array();
        col->lost_ids = json_object();
        return col->head && col->tail && col->lost_ids ? 0 : -1;
}

void cq_collect_release(cq_collect_t *col)
{
        json_decref(col->head);
        json_decref(col->tail);
        json_decref(col->lost_ids);
        col->head = col->tail = col->lost_ids = NULL;
}

static json_t *stream_part(const char *name, const char *text, size_t len)
{
        return json_pack("{s:s, s:s, s:o}", "output_type", "stream", "name",
                         name, "text", json_stringn_nocheck(text, len));
}

/* Append \p out (stolen) to \p arr, merging a stream into a preceding
 * stream of the same name. */
static int append_merged(json_t *arr, json_t *out)
{
        const char *name, *lname;
        json_t *last = json_array_get(arr, json_array_size(arr) - 1);

        if (last && is_stream(out, &name) && is_stream(last, &lname) &&
            strcmp(name, lname) == 0) {
                json_t *a = json_object_get(last, "text");
                json_t *b = json_object_get(out, "text");
                size_t alen = json_string_length(a),
                       blen = json_string_length(b);
                char *joined = malloc(alen + blen + 1);
                int rc;

                if (!joined) {
                        json_decref(out);
                        return -1;
                }
                memcpy(joined, json_string_value(a), alen);
                memcpy(joined + alen, json_string_value(b), blen);
                rc = json_object_set_new(
                    last, "text", json_stringn_nocheck(joined, alen + blen));
                free(joined);
                json_decref(out);
                return rc;
        }
        return json_array_append_new(arr, out);
}

/* Largest n <= want that does not cut a UTF-8 sequence at s[n]. */
static size_t utf8_floor(const char *s, size_t len, size_t want)
{
        if (want >= len)
                return len;
        while (want > 0 && ((unsigned char)s[want] & 0xc0) == 0x80)
                want--;
        return want;
}

/* Remember the display id of a dropped output, so its updates count. */
static void lose_id(cq_collect_t *col, const json_t *out)
{
        const char *id = json_string_value(
            json_object_get(json_object_get(out, "transient"), "display_id"));

        if (!id)
                return;
        if (json_object_size(col->lost_ids) >= LOST_IDS_MAX ||
            json_object_set_new(col->lost_ids, id, json_true()) != 0)
                col->lost_ids_full = true;
}

static void close_head(cq_collect_t *col)
{
        if (col->closed)
                return;
        col->closed = true;
        if (col->cb) {
                json_t *note =
                    stream_part("stderr", cap_note, sizeof(cap_note) - 1);

                if (note)
                        col->cb(col->opaque, note);
                json_decref(note);
        }
}

/* Keep the tail within tail_max by dropping from its front. */
static void trim_tail(cq_collect_t *col)
{
        while (col->tail_bytes > col->tail_max &&
               json_array_size(col->tail) > 0) {
                json_t *front = json_array_get(col->tail, 0);
                size_t excess = col->tail_bytes - col->tail_max;
                size_t size = cq_collect_size(front);
                const char *name;

                if (is_stream(front, &name) && excess < size) {
                        json_t *text = json_object_get(front, "text");
                        const char *s = json_string_value(text);
                        size_t cut = excess;

                        while (cut < size &&
                               ((unsigned char)s[cut] & 0xc0) == 0x80)
                                cut++;
                        if (json_object_set_new(
                                front, "text",
                                json_stringn_nocheck(s + cut, size - cut)) ==
                            0) {
                                col->tail_bytes -= cut;
                                col->dropped += cut;
                                continue;
                        }
                }
                col->tail_bytes -=
                    size < col->tail_bytes ? size : col->tail_bytes;
                col->dropped += size;
                lose_id(col, front);
                json_array_remove(col->tail, 0);
        }
}

void cq_collect_add(cq_collect_t *col, json_t **outputp)
{
        json_t *out = *outputp;
        size_t size;
        const char *name;

        *outputp = NULL;
        if (!out)
                return;
        if (col->clear_pending) {
                cq_collect_clear(col, false);
                col->clear_pending = false;
        }
        size = cq_collect_size(out);
        if (!col->closed && size <= col->head_max - col->head_bytes) {
                if (col->cb)
                        col->cb(col->opaque, out);
                col->head_bytes += size;
                if (append_merged(col->head, out) != 0) {
                        col->head_bytes -= size;
                        col->dropped += size;
                        close_head(col);
                }
                return;
        }
        if (!col->closed && is_stream(out, &name)) {
                /* the part of a stream that fits still goes to the head */
                const char *s = json_string_value(json_object_get(out, "text"));
                size_t room =
                    utf8_floor(s, size, col->head_max - col->head_bytes);

                if (room > 0) {
                        json_t *part = stream_part(name, s, room);
                        json_t *rest = stream_part(name, s + room, size - room);

                        if (!part || !rest) {
                                json_decref(part);
                                json_decref(rest);
                        } else {
                                if (col->cb)
                                        col->cb(col->opaque, part);
                                if (append_merged(col->head, part) == 0)
                                        col->head_bytes += room;
                                else
                                        col->dropped += room;
                                json_decref(out);
                                out = rest;
                                size -= room;
                        }
                }
        }
        close_head(col);
        col->tail_bytes += size;
        if (append_merged(col->tail, out) != 0) {
                col->tail_bytes -= size;
                col->dropped += size;
                return;
        }
        trim_tail(col);
}

/* Update the outputs of \p arr shown as \p id; returns how many matched.
 * *bytesp is adjusted by the change of size. In the head (\p is_head) an
 * output that no longer fits is dropped. */
static size_t update_in(cq_collect_t *col,
                        json_t *arr,
                        bool is_head,
                        const char *id,
                        json_t *data,
                        json_t *metadata)
{
        size_t i = 0, matched = 0;

        while (i < json_array_size(arr)) {
                json_t *v = json_array_get(arr, i);
                const char *have = json_string_value(json_object_get(
                    json_object_get(v, "transient"), "display_id"));
                size_t *bytes = is_head ? &col->head_bytes : &col->tail_bytes;
                size_t before, after;

                if (!have || strcmp(have, id) != 0) {
                        i++;
                        continue;
                }
                matched++;
                before = cq_collect_size(v);
                if (json_object_set(v, "data", data) ||
                    json_object_set(v, "metadata", metadata))
                        after = before + col->head_max + col->tail_max + 1;
                else
                        after = cq_collect_size(v);
                *bytes -= before < *bytes ? before : *bytes;
                if (is_head && after > col->head_max - col->head_bytes) {
                        /* the display no longer fits where it was */
                        col->dropped += after;
                        lose_id(col, v);
                        json_array_remove(arr, i);
                        close_head(col);
                        continue;
                }
                *bytes += after;
                i++;
        }
        return matched;
}

void cq_collect_update(cq_collect_t *col,
                       const char *id,
                       json_t *data,
                       json_t *metadata)
{
        json_t *meta;
        size_t matched;

        if (!id || !json_is_object(data))
                return;
        meta = json_is_object(metadata) ? json_incref(metadata) : json_object();
        if (!meta) {
                col->dropped += json_size(data);
                close_head(col);
                return;
        }
        matched = update_in(col, col->head, true, id, data, meta);
        matched += update_in(col, col->tail, false, id, data, meta);
        trim_tail(col);
        if (matched == 0 &&
            (json_object_get(col->lost_ids, id) || col->lost_ids_full))
                col->dropped += json_size(data) + json_size(meta);
        json_decref(meta);
}

void cq_collect_clear(cq_collect_t *col, bool wait)
{
        if (wait) {
                col->clear_pending = true;
                return;
        }
        json_array_clear(col->head);
        json_array_clear(col->tail);
        json_object_clear(col->lost_ids);
        col->head_bytes = col->tail_bytes = 0;
        col->dropped = 0;
        col->at_least = col->closed = col->lost_ids_full = false;
}

void cq_collect_dropped(cq_collect_t *col, uint64_t bytes, bool at_least)
{
        col->dropped += bytes;
        if (at_least)
                col->at_least = true;
        close_head(col);
}

bool cq_collect_truncated(const cq_collect_t *col)
{
        return col->dropped > 0 || col->at_least;
}

static int append_all(json_t *all, json_t *arr)
{
        json_t *v;
        size_t i;

        json_array_foreach(arr, i, v)
        {
                /* a shallow copy: merging and dropping "transient" leave
                 * the collector's own outputs alone */
                json_t *out = json_copy(v);

                if (!out)
                        return -1;
                json_object_del(out, "transient");
                if (append_merged(all, out) != 0)
                        return -1;
        }
        return 0;
}

json_t *cq_collect_finish(cq_collect_t *col)
{
        json_t *all = json_array();

        if (!all || append_all(all, col->head) != 0)
                goto fail;
        if (cq_collect_truncated(col)) {
                char note[160];
                json_t *marker;

                snprintf(note, sizeof(note),
                         "\n" CQ_COLLECT_MARK "%s%llu bytes dropped ...]\n",
                         col->at_least ? "at least " : "",
                         (unsigned long long)col->dropped);
                marker = stream_part("stderr", note, strlen(note));
                if (!marker || append_merged(all, marker) != 0)
                        goto fail;
        }
        if (append_all(all, col->tail) != 0)
                goto fail;
        return all;
fail:
        json_decref(all);
        return NULL;
}
