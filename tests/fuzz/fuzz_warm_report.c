/* SPDX-License-Identifier: MIT */
/* fuzz_warm_report.c - libFuzzer target: a forked kernel's warm-up report
 * (a file its sandbox can write) into kernel_warm_outputs(), and what it
 * accepts into the environment probe's parser. Accepted, it is a stdout
 * stream, then an error exactly when the report says it failed. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../interp/local/kernel_int.h"
#include "coderq/interp/interp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        json_t *outputs, *first;
        bool ok = false;

        outputs = kernel_warm_outputs((const char *)data, size, &ok);
        if (!outputs)
                return 0;
        first = json_array_get(outputs, 0);
        if (!json_is_array(outputs) ||
            json_array_size(outputs) != (ok ? 1u : 2u) ||
            !json_is_string(json_object_get(first, "text")) ||
            strcmp(json_string_value(json_object_get(first, "name")),
                   "stdout") != 0)
                abort();
        json_decref(cq_interp_env_parse(outputs, "coderq-env 00ff "));
        json_decref(outputs);
        return 0;
}
