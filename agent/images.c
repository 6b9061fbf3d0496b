/* SPDX-License-Identifier: MIT */
/* images.c - the images a job leaves: those its cells showed (PNG, JPEG
 * and SVG outputs) and the image files its code saved under the work
 * dir. */
#include "coderq/agent/agent.h"

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

/* Add \p bytes (takes ownership, even on failure) to the result's images
 * as the next image of the last cell. -1 when out of memory (run->oom
 * set). */
static int add_image(run_t *run,
                     const image_kind_t *kind,
                     unsigned char *bytes,
                     size_t len)
{
        cq_files_t *images = &run->result->images;
        cq_file_t *v, *file;
        char name[64];

        v = realloc(images->v, (images->n + 1) * sizeof(*images->v));
        if (!v) {
                free(bytes);
                run->oom = true;
                return -1;
        }
        images->v = v;
        snprintf(name, sizeof(name), "cell%ld-%ld.%s", run->result->cells,
                 ++run->image_seq, kind->ext);
        file = &images->v[images->n];
        file->name = strdup(name);
        file->mime = strdup(kind->mime);
        file->data = bytes;
        file->len = len;
        if (!file->name || !file->mime) {
                free(file->name);
                free(file->mime);
                free(bytes);
                run->oom = true;
                return -1;
        }
        images->n++;
        return 0;
}

/* Images a cell showed, as files named cell<N>-<K>.<ext>. */
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
                        size_t len;

                        if (!json_is_string(value))
                                continue;
                        bytes = image_bytes(&kinds[k], value, &len);
                        if (!bytes)
                                continue; /* undecodable: leave it be */
                        if (add_image(run, &kinds[k], bytes, len) != 0)
                                return;
                }
        }
}

/* Image files the code saved anywhere under the work dir. */
void agent_collect_created_images(run_t *run)
{
        cq_files_t created = {0};
        cq_files_t *images = &run->result->images;
        size_t i;

        if (cq_interp_created_files(run->interp, false, &created) != CQ_OK) {
                cq_log_kv(CQ_LOG_WARN, "could not list created files", "job_id",
                          run->job->job_id, "error",
                          cq_interp_errmsg(run->interp), NULL);
                return;
        }
        for (i = 0; i < created.n; i++) {
                cq_file_t file = {0};
                cq_file_t *v;

                if (strncmp(created.v[i].mime, "image/", 6) != 0)
                        continue;
                if (cq_interp_get_file(run->interp, created.v[i].name,
                                       run->opts->file_max, &file) != CQ_OK) {
                        cq_log_kv(CQ_LOG_WARN, "could not read created image",
                                  "job_id", run->job->job_id, "file",
                                  created.v[i].name, "error",
                                  cq_interp_errmsg(run->interp), NULL);
                        continue;
                }
                v = realloc(images->v, (images->n + 1) * sizeof(*images->v));
                if (!v) {
                        cq_files_t one = {&file, 1};

                        cq_files_release(&one);
                        run->oom = true;
                        break;
                }
                images->v = v;
                images->v[images->n++] = file;
        }
        cq_files_release(&created);
}
