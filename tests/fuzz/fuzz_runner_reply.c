/* SPDX-License-Identifier: MIT */
/* fuzz_runner_reply.c - libFuzzer target: one control line of a runner
 * (anything its cell's code writes there) into cq_runner_reply_parse(),
 * for the marker "m0". Accepted, it is a reply of its shape: an error
 * output exactly when not ok, a result only when ok, a count above 0 or
 * none; a refusal says why. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/local/runner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_runner_reply_t reply;
        char errstr[256] = "";
        int r = cq_runner_reply_parse((const char *)data, size, "m0", &reply,
                                      errstr, sizeof(errstr));

        if (r < 0 && !errstr[0])
                abort();
        if (r != 0)
                return 0;
        if (reply.ok != (reply.error == NULL) || (!reply.ok && reply.result) ||
            reply.count == 0 || reply.count < -1 ||
            (reply.error &&
             !json_is_string(json_object_get(reply.error, "ename"))) ||
            (reply.result &&
             !json_is_string(json_object_get(
                 json_object_get(reply.result, "data"), "text/plain"))))
                abort();
        cq_runner_reply_release(&reply);
        return 0;
}
