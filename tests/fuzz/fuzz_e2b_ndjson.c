/* SPDX-License-Identifier: MIT */
/* fuzz_e2b_ndjson.c - libFuzzer target: an E2B /execute NDJSON stream, cut
 * into lines at '\n' as the backend does, each line into
 * cq_e2b_parse_line(); the outputs it yields then go into a notebook code
 * cell (cq_nb_add_code, cq_nb_dumps), the path they take in a job. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/e2b/e2b.h"
#include "coderq/agent/notebook.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        const char *p = (const char *)data, *end = p + size;
        cq_cell_result_t res;
        cq_nb_t *nb;
        char errstr[256], *text;
        size_t len;

        cq_cell_result_init(&res);
        res.outputs = json_array();
        if (!res.outputs)
                return 0;
        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
                cq_e2b_line_t line;

                if (n > 0 && cq_e2b_parse_line(p, n, &line, errstr,
                                               sizeof(errstr)) == CQ_OK) {
                        if (line.kind == CQ_E2B_LINE_OUTPUT) {
                                if (!json_is_string(json_object_get(
                                        line.output, "output_type")))
                                        abort();
                                json_array_append_new(res.outputs, line.output);
                        } else if (line.kind == CQ_E2B_LINE_COUNT) {
                                res.execution_count = line.execution_count;
                        }
                }
                p += n + (nl ? 1 : 0);
        }
        nb = cq_nb_new(NULL);
        if (nb && cq_nb_add_code(nb, "x", &res) == 0) {
                text = cq_nb_dumps(nb, &len);
                free(text);
        }
        cq_nb_destroy(&nb);
        cq_cell_result_release(&res);
        return 0;
}
