/* SPDX-License-Identifier: MIT */
/* images.c - the images a job leaves: those its cells showed (PNG, JPEG
 * and SVG outputs) and the image files its code saved under the work
 * dir, each with the job's cell that made it. A saved file's cell is the
 * one after which it was first seen, or last seen change size: the work
 * dir is looked at after every cell. A session's child leaves the files
 * its parent's replayed cells made to the parent. */
#include "coderq/agent/agent.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "agent_int.h"

/* The kinds of image a cell's output may hold. */
typedef struct image_kind {
        const char *mime, *ext;
        bool base64;
} image_kind_t;

static const image_kind_t kinds[] = {{"image/png", "png", true},
                                     {"image/jpeg", "jpg", true},
                                     {"image/svg+xml", "svg", false}};

/* The job's number of the cell that ran last: the cells stored before
 * this run, then this run's. */
static long cell_seq(const run_t *run)
{
        return run->cells_done + run->result->cells;
}

/* The bytes of the image \p value of \p kind, in *\p lenp; NULL when it
 * cannot be decoded or out of memory. */
static unsigned char *
image_bytes(const image_kind_t *kind, const json_t *value, size_t *lenp)
{
        unsigned char *bytes;

        if (kind->base64)
                return cq_b64_decode(json_string_value(value),
                                     json_string_length(value), lenp);
        *lenp = json_string_length(value);
        bytes = malloc(*lenp + 1);
        if (bytes)
                memcpy(bytes, json_string_value(value), *lenp);
        return bytes;
}

/* Add the image \p name of \p cell to the result; \p data (\p len bytes)
 * is taken, even on failure. -1 when out of memory (run->oom set). */
static int add_image(run_t *run,
                     const char *name,
                     const char *mime,
                     unsigned char *data,
                     size_t len,
                     long cell)
{
        cq_agent_images_t *images = &run->result->images;
        cq_agent_image_t *v, *img;

        v = realloc(images->v, (images->n + 1) * sizeof(*images->v));
        if (!v) {
                free(data);
                run->oom = true;
                return -1;
        }
        images->v = v;
        img = &images->v[images->n];
        img->name = strdup(name);
        img->mime = strdup(mime);
        img->data = data;
        img->len = len;
        img->cell = cell;
        if (!img->name || !img->mime) {
                free(img->name);
                free(img->mime);
                free(data);
                run->oom = true;
                return -1;
        }
        images->n++;
        return 0;
}

void agent_collect_output_images(run_t *run, const cq_cell_result_t *res)
{
        size_t i, k;
        json_t *output;

        json_array_foreach(res->outputs, i, output)
        {
                json_t *data = json_object_get(output, "data");

                for (k = 0; data && k < CQ_ARRAY_SIZE(kinds); k++) {
                        json_t *value = json_object_get(data, kinds[k].mime);
                        unsigned char *bytes;
                        char name[64];
                        size_t len;

                        if (!json_is_string(value))
                                continue;
                        bytes = image_bytes(&kinds[k], value, &len);
                        if (!bytes)
                                continue; /* undecodable: leave it be */
                        snprintf(name, sizeof(name), "cell%ld-%ld.%s",
                                 cell_seq(run), ++run->image_seq, kinds[k].ext);
                        if (add_image(run, name, kinds[k].mime, bytes, len,
                                      cell_seq(run)) != 0)
                                return;
                }
        }
}

static seen_file_t *seen_find(const run_t *run, const char *name)
{
        size_t i;

        for (i = 0; i < run->nseen; i++)
                if (strcmp(run->seen[i].name, name) == 0)
                        return &run->seen[i];
        return NULL;
}

/* Note the image file \p file seen after cell \p cell; the entry, NULL
 * when out of memory (run->oom set). */
static seen_file_t *seen_note(run_t *run, const cq_file_t *file, long cell)
{
        seen_file_t *seen = seen_find(run, file->name), *v;

        if (seen) {
                if (seen->len != file->len) {
                        seen->len = file->len;
                        seen->cell = cell;
                }
                return seen;
        }
        v = realloc(run->seen, (run->nseen + 1) * sizeof(*run->seen));
        if (!v) {
                run->oom = true;
                return NULL;
        }
        run->seen = v;
        seen = &run->seen[run->nseen];
        seen->name = strdup(file->name);
        seen->len = file->len;
        seen->cell = cell;
        seen->parent_sha[0] = '\0';
        if (!seen->name) {
                run->oom = true;
                return NULL;
        }
        run->nseen++;
        return seen;
}

/* The files created under the work dir, listed without their bytes,
 * into \p created. -1 when they could not be listed (logged). */
static int list_created(run_t *run, cq_files_t *created)
{
        if (cq_interp_created_files(run->interp, false, created) == CQ_OK)
                return 0;
        cq_log_kv(CQ_LOG_WARN, "could not list created files", "job_id",
                  run->job->job_id, "error", cq_interp_errmsg(run->interp),
                  NULL);
        return -1;
}

void agent_note_created_files(run_t *run, bool replayed)
{
        cq_files_t created = {0};
        size_t i;

        if (list_created(run, &created) != 0)
                return;
        for (i = 0; i < created.n && !run->oom; i++)
                if (strncmp(created.v[i].mime, "image/", 6) == 0)
                        seen_note(run, &created.v[i],
                                  replayed ? 0 : cell_seq(run));
        cq_files_release(&created);
}

/* Read the image file \p name into \p file; -1 when it cannot be read
 * (logged). */
static int read_image(run_t *run, const char *name, cq_file_t *file)
{
        if (cq_interp_get_file(run->interp, name, run->opts->file_max, file) ==
            CQ_OK)
                return 0;
        cq_log_kv(CQ_LOG_WARN, "could not read created image", "job_id",
                  run->job->job_id, "file", name, "error",
                  cq_interp_errmsg(run->interp), NULL);
        return -1;
}

void agent_note_parent_files(run_t *run)
{
        cq_files_t created = {0};
        size_t i;

        if (list_created(run, &created) != 0)
                return;
        for (i = 0; i < created.n && !run->oom; i++) {
                cq_file_t file = {0};
                seen_file_t *seen;

                if (strncmp(created.v[i].mime, "image/", 6) != 0 ||
                    read_image(run, created.v[i].name, &file) != 0)
                        continue;
                seen = seen_note(run, &created.v[i], 0);
                if (seen)
                        cq_sha256_hex(file.data, file.len, seen->parent_sha);
                free(file.name);
                free(file.mime);
                free(file.data);
        }
        cq_files_release(&created);
}

/* Whether \p file is a session parent's, as its replayed cells left it. */
static bool parents(const seen_file_t *seen, const cq_file_t *file)
{
        char sha[65];

        if (!seen || !seen->parent_sha[0])
                return false;
        cq_sha256_hex(file->data, file->len, sha);
        return strcmp(sha, seen->parent_sha) == 0;
}

/* Order the images by cell, those of no known cell last; images of one
 * cell keep their order. */
static void sort_by_cell(cq_agent_images_t *images)
{
        size_t i, k;

        for (i = 1; i < images->n; i++) {
                cq_agent_image_t img = images->v[i];
                long key = img.cell > 0 ? img.cell : LONG_MAX;

                for (k = i; k > 0; k--) {
                        long prev = images->v[k - 1].cell;

                        if ((prev > 0 ? prev : LONG_MAX) <= key)
                                break;
                        images->v[k] = images->v[k - 1];
                }
                images->v[k] = img;
        }
}

void agent_collect_created_images(run_t *run)
{
        cq_files_t created = {0};
        size_t i;

        if (list_created(run, &created) != 0) {
                sort_by_cell(&run->result->images);
                return;
        }
        for (i = 0; i < created.n; i++) {
                const seen_file_t *seen = seen_find(run, created.v[i].name);
                cq_file_t file = {0};

                if (strncmp(created.v[i].mime, "image/", 6) != 0 ||
                    read_image(run, created.v[i].name, &file) != 0)
                        continue;
                if (parents(seen, &file)) {
                        /* stored with the parent already */
                        free(file.data);
                } else {
                        /* add_image() takes the bytes */
                        (void)add_image(run, file.name, file.mime, file.data,
                                        file.len, seen ? seen->cell : 0);
                }
                free(file.name);
                free(file.mime);
                if (run->oom)
                        break;
        }
        cq_files_release(&created);
        sort_by_cell(&run->result->images);
}

void agent_images_release(cq_agent_images_t *images)
{
        size_t i;

        for (i = 0; i < images->n; i++) {
                free(images->v[i].name);
                free(images->v[i].mime);
                free(images->v[i].data);
        }
        free(images->v);
        images->v = NULL;
        images->n = 0;
}

void agent_forget_files(run_t *run)
{
        size_t i;

        for (i = 0; i < run->nseen; i++)
                free(run->seen[i].name);
        free(run->seen);
        run->seen = NULL;
        run->nseen = 0;
}
