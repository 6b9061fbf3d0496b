/* SPDX-License-Identifier: MIT */
/* fuzz_notebook.c - libFuzzer target: a JSON document as a stored notebook
 * into cq_nb_from_json() (continued with one more cell and serialised),
 * and, when it has an "outputs" array, those outputs as a kernel's into a
 * new notebook's code cell (the conversion to nbformat's stored shapes). */
#include <stdint.h>
#include <stdlib.h>

#include "coderq/agent/notebook.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void dump(cq_nb_t *nb)
{
        size_t len;
        char *text = cq_nb_dumps(nb, &len);

        free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        json_t *doc =
            json_loadb((const char *)data, size, JSON_ALLOW_NUL, NULL);
        json_t *outputs;
        cq_nb_t *nb;
        char errstr[256];

        if (!doc)
                return 0;
        nb = cq_nb_from_json(doc, errstr, sizeof(errstr));
        if (nb) {
                if (cq_nb_add_heading(nb, "more") == 0 &&
                    cq_nb_add_code(nb, "1", NULL) == 0)
                        dump(nb);
                cq_nb_destroy(&nb);
        }
        outputs = json_object_get(doc, "outputs");
        if (json_is_array(outputs)) {
                cq_cell_result_t res;

                cq_cell_result_init(&res);
                res.outputs = json_deep_copy(outputs);
                res.execution_count = 1;
                nb = cq_nb_new(json_object_get(doc, "language_info"));
                if (nb && res.outputs && cq_nb_add_code(nb, "x", &res) == 0)
                        dump(nb);
                cq_nb_destroy(&nb);
                cq_cell_result_release(&res);
        }
        json_decref(doc);
        return 0;
}
