/* SPDX-License-Identifier: MIT */
/* fuzz_kprops.c - libFuzzer target: a librdkafka properties file
 * (CODERQ_KAFKA_PROPERTIES) into cq_kprops_parse(). Parsed entries must
 * keep the reader's promises: a name of [A-Za-z0-9._-], never reserved,
 * and a value without NUL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/kprops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_kprops_t *props = cq_kprops_new();
        char errstr[512];
        size_t i;

        if (!props)
                return 0;
        if (cq_kprops_parse(props, (const char *)data, size, "fuzz", errstr,
                            sizeof(errstr)) == 0) {
                for (i = 0; i < cq_kprops_count(props); i++) {
                        const char *key, *value, *source;

                        cq_kprops_get(props, i, &key, &value, &source);
                        if (!*key || strlen(key) > CQ_KPROPS_KEY_MAX ||
                            strspn(key, "abcdefghijklmnopqrstuvwxyz"
                                        "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789._-") != strlen(key) ||
                            cq_kprops_reserved(key) || !value || !source ||
                            strncmp(source, "fuzz line ", 10) != 0)
                                abort();
                }
        } else if (strncmp(errstr, "fuzz line ", 10) != 0) {
                abort(); /* every refusal names its line */
        }
        cq_kprops_destroy(&props);
        return 0;
}
