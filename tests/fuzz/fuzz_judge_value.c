/* SPDX-License-Identifier: MIT */
/* fuzz_judge_value.c - libFuzzer target: an answer of the model's
 * interpreter as the judge's side reads it: JSON into
 * cq_judge_value_check(), and every value it passes into
 * cq_judge_value_repr(), which must give a bounded string. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/agent/judge.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        json_t *v = json_loadb((const char *)data, size,
                               JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
        char why[128] = "";

        if (!v)
                return 0;
        if (cq_judge_value_check(v, why, sizeof(why))) {
                char *r = cq_judge_value_repr(v, 200);

                if (r && strlen(r) > 200)
                        abort();
                free(r);
        } else if (!why[0]) {
                abort(); /* every refusal says why */
        }
        json_decref(v);
        return 0;
}
