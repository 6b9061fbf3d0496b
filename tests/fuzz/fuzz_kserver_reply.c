/* SPDX-License-Identifier: MIT */
/* fuzz_kserver_reply.c - libFuzzer target: one datagram of the kernel
 * server into cq_kserver_reply_parse(). The first byte picks how many
 * descriptors came with it (0-3) and whether it answers a probe; a parsed
 * success names pids above 1. */
#include <stdint.h>
#include <stdlib.h>

#include "coderq/local/kserver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_kserver_reply_t reply;
        char errstr[256];
        int nfds;
        bool probe;

        if (size == 0)
                return 0;
        nfds = data[0] & 3;
        probe = (data[0] & 4) != 0;
        if (cq_kserver_reply_parse((const char *)data + 1, size - 1, nfds,
                                   probe, &reply, errstr,
                                   sizeof(errstr)) == 0 &&
            reply.ok &&
            (reply.pid <= 1 || reply.outer <= 1 || (!probe && nfds != 2)))
                abort();
        return 0;
}
