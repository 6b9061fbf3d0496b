/* SPDX-License-Identifier: MIT */
/* fuzz_llm_reply.c - libFuzzer target: a Chat Completions reply body from
 * any OpenAI-compatible server into cq_llm_parse_reply(). */
#include <stdint.h>
#include <stdlib.h>

#include "coderq/agent/llm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_llm_reply_t reply;
        char errstr[512];

        cq_llm_reply_init(&reply);
        if (cq_llm_parse_reply((const char *)data, size, &reply, errstr,
                               sizeof(errstr)) == 0)
                cq_llm_reply_release(&reply);
        return 0;
}
