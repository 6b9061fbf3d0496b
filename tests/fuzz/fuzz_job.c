/* SPDX-License-Identifier: MIT */
/* fuzz_job.c - libFuzzer target: one job message (topic coderq.jobs) into
 * cq_job_parse(), the first parser untrusted input meets. A parsed job
 * must have its required fields. */
#include <stdint.h>
#include <stdlib.h>

#include "coderq/common/job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_job_t job;
        char errstr[512];

        cq_job_init(&job);
        if (cq_job_parse((const char *)data, size, 1 << 20, &job, errstr,
                         sizeof(errstr)) == CQ_OK) {
                if (!job.job_id || !job.prompt || !job.spec)
                        abort();
                cq_job_release(&job);
        }
        return 0;
}
