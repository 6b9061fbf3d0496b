/* SPDX-License-Identifier: MIT */
/* check_support.c - shared test runner pieces. */
#include "check_support.h"

#include <stdio.h>
#include <stdlib.h>

#include "coderq/buf.h"

int cq_check_run(Suite *suite)
{
        SRunner *sr = srunner_create(suite);
        int failed;

        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

const char *cq_check_env(const char *name)
{
        const char *value = getenv(name);

        ck_assert_msg(value && *value,
                      "%s is not set: start the services with "
                      "scripts/services.sh start and eval \"$(scripts/"
                      "services.sh env)\"",
                      name);
        return value;
}

const char *cq_check_srcpath(const char *rel)
{
        static char path[4096];
        const char *root = getenv("CQ_SOURCE_DIR");

        snprintf(path, sizeof(path), "%s/%s", root ? root : CQ_SOURCE_DIR, rel);
        return path;
}

char *cq_check_slurp(const char *path, size_t *lenp)
{
        FILE *fp = fopen(path, "rb");
        char chunk[65536], *data;
        cq_buf_t buf;
        size_t n;

        ck_assert_msg(fp != NULL, "cannot open %s", path);
        cq_buf_init(&buf, (size_t)256 << 20);
        while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
                ck_assert_int_eq(cq_buf_append(&buf, chunk, n), CQ_OK);
        ck_assert_msg(!ferror(fp), "cannot read %s", path);
        fclose(fp);
        data = cq_buf_take(&buf, lenp);
        ck_assert_ptr_nonnull(data);
        return data;
}

void cq_check_spit(const char *path, const void *data, size_t len)
{
        FILE *fp = fopen(path, "wb");

        ck_assert_msg(fp != NULL, "cannot write %s", path);
        ck_assert_uint_eq(fwrite(data, 1, len, fp), len);
        ck_assert_int_eq(fclose(fp), 0);
}
