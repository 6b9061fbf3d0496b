/* SPDX-License-Identifier: MIT */
/* check_support.c - shared test runner pieces. */
#include "check_support.h"

#include <stdio.h>
#include <stdlib.h>

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
