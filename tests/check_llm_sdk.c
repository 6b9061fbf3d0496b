/* SPDX-License-Identifier: MIT */
/* check_llm_sdk.c - the official Anthropic Python SDK (PyPI "anthropic",
 * installed with pip into $CQ_BINARY_DIR/pyenv-anthropic) is the oracle
 * for the fake's Messages API: tests/conformance/anthropic/oracle.py
 * drives a tool-use round trip and the error replies through the SDK,
 * then the C client holds the same conversation and its requests must
 * equal the SDK's, body for body. Exits 77 (CTest's skip) when no Python
 * with pip is found or PyPI cannot be reached, unless CQ_REQUIRE names
 * "pypi" (then it fails). */
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/agent/llm.h"
#include "coderq/common/util.h"
#include "support/fake_llm.h"

#define TEST_KEY "sk-ant-test-0123456789abcdef"

static char python[64];
static char pyenv[4096];

/* Run argv with extra environment \p env (NULL-terminated "K=V"), stdout
 * and stderr to ours unless \p quiet, killing it after \p timeout_ms.
 * Returns its exit status, 128 when killed or not run. */
static int
run(char *const argv[], char *const env[], bool quiet, int64_t timeout_ms)
{
        int64_t deadline = cq_now_ms() + timeout_ms;
        int status;
        pid_t pid = fork();

        if (pid < 0)
                return 128;
        if (pid == 0) {
                size_t i;

                for (i = 0; env && env[i]; i++)
                        putenv(env[i]);
                if (quiet) {
                        if (!freopen("/dev/null", "w", stdout) ||
                            !freopen("/dev/null", "w", stderr))
                                _exit(126);
                }
                setpgid(0, 0);
                execvp(argv[0], argv);
                _exit(127);
        }
        for (;;) {
                struct timespec ts = {0, 50000000L};

                if (waitpid(pid, &status, WNOHANG) == pid)
                        break;
                if (cq_now_ms() > deadline) {
                        kill(-pid, SIGKILL);
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        return 128;
                }
                nanosleep(&ts, NULL);
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The first Python with pip: the one on PATH, else Debian's. */
static bool find_python(void)
{
        static const char *const candidates[] = {"python3", "/usr/bin/python3"};
        size_t i;

        for (i = 0; i < 2; i++) {
                char a_py[64], a_m[] = "-m", a_pip[] = "pip",
                               a_ver[] = "--version";
                char *argv[] = {a_py, a_m, a_pip, a_ver, NULL};

                snprintf(a_py, sizeof(a_py), "%s", candidates[i]);
                if (run(argv, NULL, true, 60000) == 0) {
                        snprintf(python, sizeof(python), "%s", candidates[i]);
                        return true;
                }
        }
        return false;
}

/* pip install anthropic into the build tree once. */
static bool install_sdk(void)
{
        const char *bindir = getenv("CQ_BINARY_DIR");
        char marker[4200];
        char a_m[] = "-m", a_pip[] = "pip", a_install[] = "install",
             a_q[] = "--quiet", a_nv[] = "--disable-pip-version-check",
             a_timeout[] = "--timeout=20", a_target[] = "--target",
             a_pkg[] = "anthropic<1";
        char *argv[] = {python,    a_m,      a_pip, a_install, a_q, a_nv,
                        a_timeout, a_target, pyenv, a_pkg,     NULL};
        struct stat st;

        snprintf(pyenv, sizeof(pyenv), "%s/pyenv-anthropic",
                 bindir ? bindir : CQ_BINARY_DIR);
        snprintf(marker, sizeof(marker), "%s/anthropic/__init__.py", pyenv);
        if (stat(marker, &st) == 0)
                return true;
        return run(argv, NULL, false, 300000) == 0 && stat(marker, &st) == 0;
}

static json_t *bodies_of(cq_fake_llm_t *fake, const char *script)
{
        json_t *reqs = cq_fake_llm_requests(fake), *out = json_array(), *req;
        size_t i;

        ck_assert_ptr_nonnull(reqs);
        json_array_foreach(reqs, i, req)
        {
                const char *s =
                    json_string_value(json_object_get(req, "script"));

                if (s && strcmp(s, script) == 0 &&
                    json_integer_value(json_object_get(req, "status")) == 200) {
                        ck_assert_msg(
                            json_is_true(json_object_get(req, "valid")),
                            "request %zu invalid: %s", i,
                            json_string_value(json_object_get(req, "error")));
                        ck_assert_str_eq(json_string_value(json_object_get(
                                             req, "anthropic_version")),
                                         "2023-06-01");
                        ck_assert_str_eq(json_string_value(
                                             json_object_get(req, "x_api_key")),
                                         TEST_KEY);
                        json_array_append(out, json_object_get(req, "body"));
                }
        }
        json_decref(reqs);
        return out;
}

static void add_fault_script(cq_fake_llm_t *fake,
                             const char *name,
                             int status,
                             int times,
                             const char *content)
{
        json_t *script = json_pack(
            "{s:[{s:s, s:[{s:s, s:i, s:i, s:s, s:s}]}]}", "steps", "content",
            content, "faults", "kind", "http", "status", status, "times", times,
            "retry_after", "0", "message", "fake failure");

        ck_assert_int_eq(cq_fake_llm_add_script(fake, name, script), 0);
        json_decref(script);
}

START_TEST(sdk_accepts_the_fake_and_matches_the_c_client)
{
        cq_fake_llm_t *fake;
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history, *req, *sdk, *ours;
        char *body, *tools_text, *a, *b;
        size_t len, i;
        char e_base[128], e_key[64], e_path[4200], *e_tools;
        char a_script[4096];
        char *argv[] = {python, a_script, NULL};
        char *env[5];
        int rc;

        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        fake = cq_fake_llm_start(NULL);
        ck_assert_ptr_nonnull(fake);
        add_fault_script(fake, "sdk_overloaded", 529, -1, "never");
        add_fault_script(fake, "sdk_limited", 429, -1, "never");
        add_fault_script(fake, "sdk_denied", 401, -1, "never");
        add_fault_script(fake, "sdk_overloaded_once", 529, 1, "recovered");

        cq_llm_conf_init(&conf);
        conf.provider = CQ_LLM_ANTHROPIC;
        conf.base_url = cq_fake_llm_base_url(fake);
        conf.anthropic_api_key = TEST_KEY;
        conf.model = "script:two_calls";
        conf.max_tokens = 1024;
        conf.max_attempts = 1;
        llm = cq_llm_new(&conf, NULL, 0);
        ck_assert_ptr_nonnull(llm);
        history =
            json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content",
                      "You are a careful data analyst.", "role", "user",
                      "content", "Compute 1 + 1 in Python.");
        body = cq_llm_request_body(llm, history, &len);
        req = json_loads(body, 0, NULL);
        tools_text = json_dumps(json_object_get(req, "tools"), JSON_COMPACT);
        ck_assert_ptr_nonnull(tools_text);
        json_decref(req);
        free(body);

        /* The SDK's conversation. */
        snprintf(a_script, sizeof(a_script), "%s",
                 cq_check_srcpath("tests/conformance/anthropic/oracle.py"));
        snprintf(e_base, sizeof(e_base), "FAKE_BASE=http://127.0.0.1:%d",
                 cq_fake_llm_port(fake));
        snprintf(e_key, sizeof(e_key), "FAKE_KEY=%s", TEST_KEY);
        snprintf(e_path, sizeof(e_path), "PYTHONPATH=%s", pyenv);
        e_tools = malloc(strlen(tools_text) + sizeof("TOOLS="));
        memcpy(e_tools, "TOOLS=", 6);
        memcpy(e_tools + 6, tools_text, strlen(tools_text) + 1);
        env[0] = e_base;
        env[1] = e_key;
        env[2] = e_path;
        env[3] = e_tools;
        env[4] = NULL;
        rc = run(argv, env, false, 120000);
        ck_assert_msg(rc == 0, "the Anthropic SDK rejected the fake (exit %d)",
                      rc);
        sdk = bodies_of(fake, "two_calls");
        ck_assert_int_eq(json_array_size(sdk), 2);
        ck_assert_int_eq(cq_fake_llm_reset(fake), 0);

        /* The same conversation from the C client. */
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 2);
        json_array_append(history, reply.message);
        for (i = 0; i < reply.ncalls; i++)
                json_array_append_new(
                    history,
                    json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                              reply.calls[i].id, "content", "ok"));
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "x is 42.");
        ours = bodies_of(fake, "two_calls");
        ck_assert_int_eq(json_array_size(ours), 2);
        for (i = 0; i < 2; i++) {
                a = json_dumps(json_array_get(ours, i),
                               JSON_SORT_KEYS | JSON_INDENT(1));
                b = json_dumps(json_array_get(sdk, i),
                               JSON_SORT_KEYS | JSON_INDENT(1));
                ck_assert_msg(
                    json_equal(json_array_get(ours, i), json_array_get(sdk, i)),
                    "request %zu differs from the SDK's:\n"
                    "ours %s\nSDK's %s",
                    i, a, b);
                free(a);
                free(b);
        }
        cq_llm_reply_release(&reply);
        json_decref(ours);
        json_decref(sdk);
        json_decref(history);
        free(e_tools);
        free(tools_text);
        cq_llm_destroy(&llm);
        cq_fake_llm_stop(&fake);
        curl_global_cleanup();
}
END_TEST

static Suite *llm_sdk_suite(void)
{
        Suite *s = suite_create("llm_sdk");
        TCase *tc = tcase_create("anthropic");

        tcase_set_timeout(tc, 200);
        tcase_add_test(tc, sdk_accepts_the_fake_and_matches_the_c_client);
        suite_add_tcase(s, tc);
        return s;
}

int main(void)
{
        if (!find_python())
                return cq_check_skip_suite("check_llm_sdk", "pypi",
                                           "no python3 with pip to install "
                                           "the Anthropic SDK");
        if (!install_sdk())
                return cq_check_skip_suite("check_llm_sdk", "pypi",
                                           "pip could not install anthropic "
                                           "from PyPI (offline?)");
        return cq_check_run(llm_sdk_suite());
}
