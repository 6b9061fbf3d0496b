/* SPDX-License-Identifier: MIT */
/* check_e2b_conformance.c - the official E2B JavaScript SDKs (npm e2b and
 * @e2b/code-interpreter, versions pinned in tests/conformance/e2b/
 * package.json) run unchanged against the E2B double: if they accept it,
 * the double speaks the real protocol. npm installs them into
 * $CQ_BINARY_DIR/conformance-e2b (cache in .cache/npm). Skips, saying so,
 * only when node or npm is not installed. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "support/fake_e2b.h"

static bool in_path(const char *prog)
{
        const char *path = getenv("PATH");
        char dir[4096];

        while (path && *path) {
                const char *colon = strchr(path, ':');
                size_t n = colon ? (size_t)(colon - path) : strlen(path);

                snprintf(dir, sizeof(dir), "%.*s/%s", (int)n, path, prog);
                if (n > 0 && access(dir, X_OK) == 0)
                        return true;
                path = colon ? colon + 1 : NULL;
        }
        return false;
}

static void copy_file(const char *from, const char *to)
{
        char buf[65536];
        int in = open(from, O_RDONLY | O_CLOEXEC);
        int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        ssize_t n;

        ck_assert_msg(in >= 0 && out >= 0, "could not copy %s to %s: %s", from,
                      to, strerror(errno));
        while ((n = read(in, buf, sizeof(buf))) > 0)
                ck_assert(write(out, buf, (size_t)n) == n);
        close(in);
        close(out);
}

/* Run argv in \p dir with extra environment \p env (NULL-terminated
 * "K=V"), killing it after \p timeout_ms. Returns its exit status. */
static int run_in(const char *dir,
                  char *const argv[],
                  char *const env[],
                  int64_t timeout_ms)
{
        int64_t deadline = cq_now_ms() + timeout_ms;
        int status;
        pid_t pid = fork();

        ck_assert(pid >= 0);
        if (pid == 0) {
                size_t i;

                if (chdir(dir) != 0)
                        _exit(126);
                for (i = 0; env && env[i]; i++)
                        putenv(env[i]);
                setpgid(0, 0);
                execvp(argv[0], argv);
                _exit(127);
        }
        for (;;) {
                struct timespec ts = {0, 100000000L};

                if (waitpid(pid, &status, WNOHANG) == pid)
                        break;
                if (cq_now_ms() > deadline) {
                        kill(-pid, SIGKILL);
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        ck_abort_msg("%s timed out after %lld ms", argv[0],
                                     (long long)timeout_ms);
                }
                nanosleep(&ts, NULL);
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

START_TEST(official_js_sdks_accept_the_double)
{
        const char *bindir = getenv("CQ_BINARY_DIR");
        char work[4096], from[4096], to[4200], cache[4096];
        char api[128], sbx[128], key[128];
        char a_npm[] = "npm", a_install[] = "install", a_audit[] = "--no-audit",
             a_fund[] = "--no-fund", a_lock[] = "--no-package-lock",
             a_cache[] = "--cache", a_log[] = "--loglevel=error",
             a_node[] = "node", a_script[] = "conformance.mjs";
        char *npm[] = {a_npm,   a_install, a_audit, a_fund, a_lock,
                       a_cache, cache,     a_log,   NULL};
        char *node[] = {a_node, a_script, NULL};
        char *env[] = {api, sbx, key, NULL};
        cq_fake_e2b_t fake;
        int rc;

        if (!in_path("node") || !in_path("npm"))
                CQ_CHECK_SKIP("node", "node and npm are needed to run the "
                                      "official E2B SDKs (apt-get install "
                                      "nodejs npm)");
        snprintf(work, sizeof(work), "%s/conformance-e2b",
                 bindir ? bindir : CQ_BINARY_DIR);
        ck_assert(mkdir(work, 0755) == 0 || errno == EEXIST);
        snprintf(cache, sizeof(cache), "%s", cq_check_srcpath(".cache/npm"));
        snprintf(from, sizeof(from), "%s",
                 cq_check_srcpath("tests/conformance/e2b/package.json"));
        snprintf(to, sizeof(to), "%s/package.json", work);
        copy_file(from, to);
        snprintf(from, sizeof(from), "%s",
                 cq_check_srcpath("tests/conformance/e2b/conformance.mjs"));
        snprintf(to, sizeof(to), "%s/conformance.mjs", work);
        copy_file(from, to);

        rc = run_in(work, npm, NULL, 240000);
        ck_assert_msg(rc == 0, "npm install of the E2B SDKs failed (exit %d)",
                      rc);

        ck_assert_int_eq(cq_fake_e2b_start(&fake, 0), 0);
        snprintf(api, sizeof(api), "E2B_API_URL=%s", fake.api_url);
        snprintf(sbx, sizeof(sbx), "E2B_SANDBOX_URL=%s", fake.sandbox_url);
        snprintf(key, sizeof(key), "E2B_API_KEY=%s", fake.api_key);
        rc = run_in(work, node, env, 180000);
        if (rc == 0)
                rc = cq_fake_e2b_stat(&fake, "live") == 0 ? 0 : 200;
        cq_fake_e2b_stop(&fake);
        ck_assert_msg(rc == 0,
                      "the official E2B SDKs rejected the double (exit %d; "
                      "200: sandboxes left alive)",
                      rc);
}
END_TEST

static Suite *e2b_conformance_suite(void)
{
        Suite *s = suite_create("e2b_conformance");
        TCase *tc = tcase_create("js_sdk");

        tcase_set_timeout(tc, 290);
        tcase_add_test(tc, official_js_sdks_accept_the_double);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(e2b_conformance_suite)
