/* SPDX-License-Identifier: MIT */
/* fuzz_llm_anthropic.c - libFuzzer target: a Messages API reply body from
 * an Anthropic-compatible server into cq_llm_parse_reply_as(); a parsed
 * reply must carry the assistant message the history keeps. */
#include <stdint.h>
#include <stdlib.h>

#include "coderq/agent/llm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_llm_reply_t reply;
        char errstr[512];

        cq_llm_reply_init(&reply);
        if (cq_llm_parse_reply_as(CQ_LLM_ANTHROPIC, (const char *)data, size,
                                  &reply, errstr, sizeof(errstr)) == 0) {
                if (!json_is_object(reply.message))
                        abort();
                cq_llm_reply_release(&reply);
        }
        return 0;
}
