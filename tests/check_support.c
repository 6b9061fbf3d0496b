/* SPDX-License-Identifier: MIT */
/* check_support.c - shared test runner pieces. */
#include "check_support.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "coderq/common/buf.h"
#include "coderq/common/util.h"

/* Tests run in forked children (CK_FORK): the skip count lives in a shared
 * anonymous mapping made before the first fork, so the parent sees it. */
static atomic_int *skips;

/* CQ_CHECK_CASE (set by tests/CMakeLists.txt, which makes each case of a
 * suite of several its own CTest entry): the one case of \p suite to run.
 * It is read once and unset, so a suite a test builds and runs in a child
 * runs whole. A name the suite has not is an error, never an empty pass. */
static int pick_case(Suite *suite, char *name, size_t size)
{
        const char *want = getenv("CQ_CHECK_CASE");

        name[0] = '\0';
        if (!want || !*want)
                return 0;
        if (strlen(want) >= size) {
                fprintf(stderr, "check_support: CQ_CHECK_CASE is too long\n");
                return -1;
        }
        memcpy(name, want, strlen(want) + 1);
        unsetenv("CQ_CHECK_CASE");
        if (!suite_tcase(suite, name)) {
                fprintf(stderr,
                        "check_support: CQ_CHECK_CASE=%s names no case of "
                        "this suite\n",
                        name);
                return -1;
        }
        return 0;
}

int cq_check_run(Suite *suite)
{
        SRunner *sr = srunner_create(suite);
        int failed, skipped;
        char only[64];

        if (pick_case(suite, only, sizeof(only)) != 0) {
                srunner_free(sr);
                return EXIT_FAILURE;
        }

        skips = mmap(NULL, sizeof(*skips), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (skips == MAP_FAILED) {
                perror("check_support: mmap");
                srunner_free(sr);
                return EXIT_FAILURE;
        }
        atomic_init(skips, 0);
        if (only[0])
                srunner_run(sr, NULL, only, CK_NORMAL);
        else
                srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        skipped = atomic_load(skips);
        munmap(skips, sizeof(*skips));
        skips = NULL;
        if (failed > 0)
                return EXIT_FAILURE;
        if (skipped > 0) {
                fprintf(stderr, "%d test(s) skipped: exit status %d\n", skipped,
                        CQ_CHECK_SKIPPED);
                return CQ_CHECK_SKIPPED;
        }
        return EXIT_SUCCESS;
}

/* Whether CQ_REQUIRE names \p need (or says "all"). */
static int required(const char *need)
{
        const char *list = getenv("CQ_REQUIRE"), *p;
        size_t n = strlen(need);

        for (p = list; p && *p;) {
                size_t len = strcspn(p, ",");

                if ((len == 3 && strncmp(p, "all", 3) == 0) ||
                    (len == n && strncmp(p, need, n) == 0))
                        return 1;
                p += len;
                if (*p == ',')
                        p++;
        }
        return 0;
}

void cq_check_skip(const char *need, const char *fmt, ...)
{
        char why[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        ck_assert_msg(!required(need),
                      "%s cannot skip: CQ_REQUIRE=%s says this machine has "
                      "%s, yet: %s",
                      tcase_name(), getenv("CQ_REQUIRE"), need, why);
        fprintf(stderr, "SKIP %s: needs %s: %s\n", tcase_name(), need, why);
        if (skips)
                atomic_fetch_add(skips, 1);
}

int cq_check_skip_suite(const char *suite,
                        const char *need,
                        const char *fmt,
                        ...)
{
        char why[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        if (required(need)) {
                fprintf(stderr,
                        "%s cannot skip: CQ_REQUIRE=%s says this machine has "
                        "%s, yet: %s\n",
                        suite, getenv("CQ_REQUIRE"), need, why);
                return EXIT_FAILURE;
        }
        fprintf(stderr, "SKIP %s: needs %s: %s\n", suite, need, why);
        return CQ_CHECK_SKIPPED;
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

static int case_cmp(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

size_t cq_check_cases(const char *rel, char **names, size_t max)
{
        const char *path = cq_check_srcpath(rel);
        struct dirent *de;
        size_t n = 0;
        DIR *dir;

        dir = opendir(path);
        ck_assert_msg(dir != NULL, "cannot open %s", path);
        while ((de = readdir(dir)) != NULL) {
                if (de->d_name[0] == '.')
                        continue;
                ck_assert_uint_lt(n, max);
                names[n] = strdup(de->d_name);
                ck_assert_ptr_nonnull(names[n]);
                n++;
        }
        closedir(dir);
        qsort(names, n, sizeof(names[0]), case_cmp);
        return n;
}

int cq_check_golden(const char *path, const char *got, const char *label)
{
        char *expected;
        int rc = 0;

        if (getenv("CQ_GOLDEN_UPDATE")) {
                cq_check_spit(path, got, strlen(got));
                return 0;
        }
        expected = cq_check_slurp(path, NULL);
        if (strcmp(expected, got) != 0) {
                fprintf(stderr, "%s:\n--- expected\n%s--- got\n%s", label,
                        expected, got);
                rc = 1;
        }
        free(expected);
        return rc;
}

bool cq_check_wait_until(bool (*pred)(void *arg), void *arg, int64_t timeout_ms)
{
        int64_t deadline = cq_now_ms() + timeout_ms;

        for (;;) {
                struct timespec ts = {0, CQ_CHECK_WAIT_STEP_MS * 1000000L};
                bool last = cq_now_ms() >= deadline;

                if (pred(arg))
                        return true;
                if (last)
                        return false;
                nanosleep(&ts, NULL);
        }
}
