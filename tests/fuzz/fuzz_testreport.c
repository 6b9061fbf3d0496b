/* SPDX-License-Identifier: MIT */
/* fuzz_testreport.c - libFuzzer target: what a test cell printed, into
 * cq_testrun_parse(), the reader of the harness's report (the output is
 * the model's to shape: its code ran in that interpreter). The first
 * byte picks the job's tests (cases of every JSON type, or code tests),
 * whether the cell was cut by the output cap and whether byte 0x1e splits
 * the rest into several stdout outputs; the rest is the output, repaired
 * to UTF-8 as the collector does, with "%M" standing for the marker. The
 * report read must stay within the tests: passed <= total == cases. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/agent/testrun.h"
#include "coderq/common/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MARKER "@@CQTEST0123456789abcdef01234567"

static const char *const tests_json[] = {
    "{\"kind\":\"cases\",\"function\":\"f\",\"cases\":["
    "{\"args\":[1],\"expected\":5},"
    "{\"args\":[\"a\",[1,2]],\"expected\":\"x\\u00e9\"},"
    "{\"args\":[],\"expected\":[1,2.5,[true,null]]},"
    "{\"args\":[{\"k\":1}],\"expected\":{\"a\":1,\"b\":[false]}},"
    "{\"args\":[0.1],\"expected\":0.30000000000000004},"
    "{\"args\":[],\"expected\":true},"
    "{\"args\":[],\"expected\":null},"
    "{\"args\":[],\"expected\":9223372036854775807}]}",
    "{\"kind\":\"code\",\"code\":\"assert f(2) == 4\"}",
};

/* One stdout output of \p n bytes at \p p, "%M" replaced by the marker. */
static int add_stdout(json_t *outputs, const char *p, size_t n)
{
        cq_buf_t buf;
        char *text;
        size_t i, len;
        int rc = -1;

        cq_buf_init(&buf, (size_t)4 << 20);
        for (i = 0; i < n; i++) {
                if (p[i] == '%' && i + 1 < n && p[i + 1] == 'M') {
                        if (cq_buf_append_str(&buf, MARKER) != CQ_OK)
                                goto out;
                        i++;
                } else if (cq_buf_append(&buf, p + i, 1) != CQ_OK) {
                        goto out;
                }
        }
        text = cq_utf8_repair(buf.data ? buf.data : "", buf.len, &len);
        if (!text)
                goto out;
        rc = json_array_append_new(
            outputs, json_pack("{s:s, s:s, s:s%}", "output_type", "stream",
                               "name", "stdout", "text", text, len));
        free(text);
out:
        cq_buf_release(&buf);
        return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        const char *p = (const char *)data + 1, *end = p + size - 1;
        cq_cell_result_t res;
        cq_testrun_t tr;
        json_t *tests;
        int total;

        if (size == 0)
                return 0;
        tests = json_loads(tests_json[data[0] & 1], 0, NULL);
        if (!tests)
                abort();
        total = json_object_get(tests, "cases")
                    ? (int)json_array_size(json_object_get(tests, "cases"))
                    : 1;
        cq_cell_result_init(&res);
        res.truncated = (data[0] & 2) != 0;
        res.outputs = json_array();
        while (res.outputs) {
                const char *sep =
                    (data[0] & 4) ? memchr(p, 0x1e, (size_t)(end - p)) : NULL;
                size_t n = sep ? (size_t)(sep - p) : (size_t)(end - p);

                if (add_stdout(res.outputs, p, n) != 0)
                        break;
                if (!sep)
                        break;
                p = sep + 1;
        }
        if (res.outputs && cq_testrun_parse(tests, MARKER, &res, &tr) == 0) {
                if (tr.total != total || tr.passed < 0 ||
                    tr.passed > tr.total || !json_is_object(tr.report))
                        abort();
                cq_testrun_release(&tr);
        }
        cq_cell_result_release(&res);
        json_decref(tests);
        return 0;
}
