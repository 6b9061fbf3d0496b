/* SPDX-License-Identifier: MIT */
/* check_cmd_run.c - `coderq run` as a user runs it: the built binary, the
 * fake LLM serving the scripted demo model, a real kernel. */
#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_support.h"
#include "support/fake_e2b.h"
#include "support/fake_llm.h"

static cq_fake_llm_t *fake;
static char dir[] = "/tmp/cq-cmd-run-XXXXXX";

static void setup(void)
{
        const char *args[] = {"--scripts", NULL, NULL};
        static char scripts[4096];

        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        snprintf(scripts, sizeof(scripts), "%s",
                 cq_check_srcpath("examples/demo-model"));
        args[1] = scripts;
        fake = cq_fake_llm_start(args);
        ck_assert_ptr_nonnull(fake);
        ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
        char cmd[256];

        cq_fake_llm_stop(&fake);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
        curl_global_cleanup();
}

/* Run `coderq run JOB --out OUT` with the fake as the LLM, and \p env
 * (shell assignments) before it; returns the exit status; stderr goes to
 * DIR/stderr.txt. */
static int coderq_run_env(const char *env,
                          const char *job,
                          const char *out,
                          const char *model)
{
        char cmd[8192];
        int st;

        snprintf(cmd, sizeof(cmd),
                 "%s CODERQ_LLM_BASE_URL=%s CODERQ_LLM_MODEL=%s "
                 "CODERQ_LLM_API_KEY= OPENAI_API_KEY= CODERQ_LOG_LEVEL=warn "
                 "%s/coderq run %s --out %s >%s/stdout.txt 2>%s/stderr.txt",
                 env, cq_fake_llm_base_url(fake), model, CQ_BINARY_DIR, job,
                 out, dir, dir);
        st = system(cmd);
        ck_assert(WIFEXITED(st));
        return WEXITSTATUS(st);
}

static int coderq_run(const char *job, const char *out, const char *model)
{
        return coderq_run_env("", job, out, model);
}

static json_t *load(const char *path)
{
        json_error_t jerr;
        json_t *doc = json_load_file(path, 0, &jerr);

        ck_assert_msg(doc != NULL, "%s: %s", path, jerr.text);
        return doc;
}

/* The whole of DIR/\p name (what a run printed, perhaps nothing); caller
 * frees. */
static char *slurp(const char *name)
{
        char path[1024], *text = NULL;
        size_t cap = 0;
        FILE *fp;

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        fp = fopen(path, "r");
        ck_assert_ptr_nonnull(fp);
        if (getdelim(&text, &cap, '\0', fp) < 0) {
                ck_assert(feof(fp) && !ferror(fp)); /* an empty file */
                free(text);
                text = strdup("");
                ck_assert_ptr_nonnull(text);
        }
        fclose(fp);
        return text;
}

/* Write \p text to the file \p path (a job, cells). */
static void write_job(const char *path, const char *text)
{
        FILE *fp = fopen(path, "w");

        ck_assert_ptr_nonnull(fp);
        fputs(text, fp);
        fclose(fp);
}

/* Write the line of examples/jobs.jsonl holding job \p id to \p path. */
static void example_job(const char *id, const char *path)
{
        FILE *in = fopen(cq_check_srcpath("examples/jobs.jsonl"), "r");
        FILE *out;
        char *line = NULL;
        size_t cap = 0;
        char needle[128];
        bool found = false;

        ck_assert_ptr_nonnull(in);
        snprintf(needle, sizeof(needle), "\"job_id\": \"%s\"", id);
        while (getline(&line, &cap, in) > 0) {
                if (!strstr(line, needle))
                        continue;
                out = fopen(path, "w");
                ck_assert_ptr_nonnull(out);
                fputs(line, out);
                fclose(out);
                found = true;
                break;
        }
        free(line);
        fclose(in);
        ck_assert_msg(found, "no example job %s", id);
}

START_TEST(demo_job_succeeds_and_writes_outputs)
{
        char job[512], out[512], path[1024], cmd[2048];
        json_t *result;

        snprintf(job, sizeof(job), "%s/newton.json", dir);
        snprintf(out, sizeof(out), "%s/newton", dir);
        example_job("demo-newton", job);
        ck_assert_int_eq(coderq_run(job, out, "demo"), 0);
        snprintf(path, sizeof(path), "%s/result.json", out);
        result = load(path);
        ck_assert_str_eq(json_string_value(json_object_get(result, "status")),
                         "succeeded");
        /* the demo model's first attempt has a real bug: one retry */
        ck_assert_int_eq(json_integer_value(json_object_get(result, "retries")),
                         1);
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(result, "tests"), "passed")),
                         1);
        /* the default configuration runs it sandboxed, and says so */
        ck_assert_str_eq(json_string_value(json_object_get(result, "sandbox")),
                         geteuid() == 0 ? "bwrap+uid-per-kernel" : "bwrap");
        json_decref(result);
        snprintf(path, sizeof(path), "%s/images/newton.png", out);
        ck_assert_int_eq(access(path, R_OK), 0);
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 -c 'import nbformat,sys; "
                 "nbformat.validate(nbformat.read(sys.argv[1], "
                 "as_version=4))' %s/notebook.ipynb",
                 out);
        ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(e2b_backend_runs_the_same_job)
{
        cq_fake_e2b_t e2b;
        char env[1024], job[512], out[512], path[1024];
        json_t *result;

        ck_assert_int_eq(cq_fake_e2b_start(&e2b, 1.0), 0);
        snprintf(env, sizeof(env),
                 "CODERQ_BACKEND=e2b E2B_API_KEY=%s E2B_API_URL=%s "
                 "E2B_SANDBOX_URL=%s",
                 e2b.api_key, e2b.api_url, e2b.sandbox_url);
        snprintf(job, sizeof(job), "%s/lp.json", dir);
        snprintf(out, sizeof(out), "%s/lp-e2b", dir);
        example_job("demo-lp", job);
        ck_assert_int_eq(coderq_run_env(env, job, out, "demo"), 0);
        snprintf(path, sizeof(path), "%s/result.json", out);
        result = load(path);
        ck_assert_str_eq(json_string_value(json_object_get(result, "status")),
                         "succeeded");
        ck_assert_str_eq(json_string_value(json_object_get(result, "sandbox")),
                         "e2b");
        json_decref(result);
        /* the banner names the E2B sandbox it ran in, not local kernels */
        {
                char *text = slurp("stdout.txt"), want[1024];

                snprintf(want, sizeof(want),
                         " (an E2B sandbox, template code-interpreter-v1, "
                         "API %s)\n",
                         e2b.api_url);
                ck_assert_msg(strstr(text, want) != NULL, "%s", text);
                ck_assert_msg(strstr(text, "local kernels") == NULL, "%s",
                              text);
                free(text);
        }
        /* the sandbox was created through the control plane and killed */
        ck_assert_int_ge(cq_fake_e2b_stat(&e2b, "created"), 1);
        ck_assert_int_eq(cq_fake_e2b_stat(&e2b, "live"), 0);
        cq_fake_e2b_stop(&e2b);
}
END_TEST

/* Run the job \p job_json (named \p name) whose model's one cell divides
 * by zero with max_retries 0: it fails, exit 1. Returns its result.json;
 * what it printed is DIR/stdout.txt. */
static json_t *run_failing_job(const char *name, const char *job_json)
{
        char job[512], out[512], path[1024], model[128];
        json_t *script;

        script = json_loads("[{\"tool_calls\":[{\"code\":\"1/0\"}]},"
                            "{\"content\":\"never\"}]",
                            0, NULL);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, name, script), 0);
        json_decref(script);
        snprintf(job, sizeof(job), "%s/%s.json", dir, name);
        write_job(job, job_json);
        snprintf(out, sizeof(out), "%s/%s", dir, name);
        snprintf(model, sizeof(model), "script:%s", name);
        ck_assert_int_eq(coderq_run(job, out, model), 1);
        snprintf(path, sizeof(path), "%s/result.json", out);
        return load(path);
}

START_TEST(failed_job_exits_one_with_the_reason)
{
        json_t *result =
            run_failing_job("run_fails", "{\"job_id\":\"fails\",\"prompt\":"
                                         "\"divide\",\"limits\":{\"max_"
                                         "retries\":0}}\n");

        ck_assert_str_eq(json_string_value(json_object_get(result, "status")),
                         "failed");
        ck_assert_msg(
            strstr(json_string_value(json_object_get(result, "reason")),
                   "ZeroDivisionError"),
            "reason lacks the last error");
        json_decref(result);
}
END_TEST

/* A job with a solution is judged with no LLM call (no turn), its code
 * tests in a judge of their own, started by the backend: a right
 * solution passes, a wrong one is a wrong answer (exit 1). */
START_TEST(solution_job_is_judged_apart)
{
        static const char *const solutions[2] = {
            "def add(a, b):\\n    return a + b\\n",
            "def add(a, b):\\n    return a - b\\n"};
        static const char *const verdicts[2] = {"passed", "wrong_answer"};
        char job[512], out[512], path[1024], text[1024];
        json_t *result, *tests;
        int i;

        for (i = 0; i < 2; i++) {
                snprintf(job, sizeof(job), "%s/solution-%d.json", dir, i);
                snprintf(text, sizeof(text),
                         "{\"job_id\":\"solution-%d\",\"prompt\":\"add\","
                         "\"solution\":\"%s\",\"tests\":{\"kind\":"
                         "\"code\",\"code\":\"assert add(1, 2) == 3\"}}\n",
                         i, solutions[i]);
                write_job(job, text);
                snprintf(out, sizeof(out), "%s/solution-%d", dir, i);
                ck_assert_int_eq(coderq_run(job, out, "demo"), i);
                snprintf(path, sizeof(path), "%s/result.json", out);
                result = load(path);
                tests = json_object_get(result, "tests");
                ck_assert_str_eq(
                    json_string_value(json_object_get(result, "status")),
                    i ? "failed" : "succeeded");
                ck_assert_str_eq(
                    json_string_value(json_object_get(tests, "judge")),
                    "separate");
                ck_assert_str_eq(
                    json_string_value(json_object_get(tests, "verdict")),
                    verdicts[i]);
                ck_assert_int_eq(
                    json_integer_value(json_object_get(result, "turns")), 0);
                json_decref(result);
        }
}
END_TEST

/* What the model and the kernel say reaches the terminal escaped: a cell
 * whose error moves the cursor and forges "succeeded" lines, and an
 * answer with an OSC title, a C1 CSI and a bidi override, print as
 * visible escapes on their own lines; result.json keeps the text. */
START_TEST(untrusted_text_prints_escaped)
{
        static const char forge[] =
            "raise ValueError('\\r\\x1b[2K\\x1b[1Aforged\\n"
            "[tests] 3 of 3 passed\\ncoderq run: succeeded \\u202e\\x9b')";
        char job[512], out[512];
        json_t *script;
        char *text, *line;

        script = json_pack("[{s:s, s:[{s:s}]}, {s:[{s:s}]}, {s:s}]", "content",
                           "look\x1b]0;owned\x07 \xe2\x80\xae\xc2\x9b"
                           "31m",
                           "tool_calls", "code", forge, "tool_calls", "code",
                           forge, "content", "never");
        ck_assert_ptr_nonnull(script);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, "run_forges", script), 0);
        json_decref(script);
        snprintf(job, sizeof(job), "%s/forge.json", dir);
        write_job(job, "{\"job_id\":\"forge\",\"prompt\":\"x\","
                       "\"limits\":{\"max_retries\":1}}\n");
        snprintf(out, sizeof(out), "%s/forge", dir);
        ck_assert_int_eq(coderq_run(job, out, "script:run_forges"), 1);
        text = slurp("stdout.txt");
        ck_assert_msg(strchr(text, 0x1b) == NULL, "raw ESC: %s", text);
        ck_assert_msg(strchr(text, '\r') == NULL, "raw CR: %s", text);
        ck_assert_msg(strstr(text, "\xc2\x9b") == NULL, "raw C1: %s", text);
        ck_assert_msg(strstr(text, "\xe2\x80\xae") == NULL, "raw bidi: %s",
                      text);
        ck_assert_msg(strstr(text, "\nforged") == NULL &&
                          strstr(text, "\n[tests]") == NULL &&
                          strstr(text, "\ncoderq run: succeeded") == NULL,
                      "forged lines: %s", text);
        ck_assert_msg(strstr(text, "coderq run: job forge with model "
                                   "script:run_forges (") != NULL,
                      "banner: %s", text);
        ck_assert_msg(strstr(text, "           look\\x1b]0;owned\\x07 "
                                   "\\u202e\\u009b31m\n") != NULL,
                      "answer: %s", text);
        ck_assert_msg(
            strstr(text, "[reflection] ValueError: \\r\\x1b[2K"
                         "\\x1b[1Aforged\\n[tests] 3 of 3 passed"
                         "\\ncoderq run: succeeded \\u202e\\u009b\n") != NULL,
            "reflection: %s", text);
        /* the final line carries the same error, escaped, to its end */
        line = strstr(text, "\ncoderq run: failed: ");
        ck_assert_msg(line != NULL, "final line: %s", text);
        ck_assert_msg(strncmp(strstr(line, "ValueError: "),
                              "ValueError: \\r\\x1b[2K\\x1b[1Aforged\\n"
                              "[tests] 3 of 3 passed\\ncoderq run: succeeded "
                              "\\u202e\\u009b (",
                              80) == 0,
                      "final line: %s", line);
        free(text);
}
END_TEST

/* A job with tests that failed before they ran: "tests not run", as
 * result.json's "tests": null says, not "tests 0/0". */
START_TEST(tests_that_never_ran_say_so)
{
        json_t *result = run_failing_job(
            "run_no_tests",
            "{\"job_id\":\"notests\",\"prompt\":\"f\",\"limits\":{\"max_"
            "retries\":0},\"tests\":{\"kind\":\"cases\",\"function\":\"f\","
            "\"cases\":[{\"args\":[1],\"expected\":1}]}}\n");
        char *text;

        ck_assert(json_is_null(json_object_get(result, "tests")));
        json_decref(result);
        text = slurp("stdout.txt");
        ck_assert_msg(strstr(text, ", tests not run)\n") != NULL, "%s", text);
        ck_assert_msg(strstr(text, "tests 0/0") == NULL, "%s", text);
        free(text);
}
END_TEST

START_TEST(invalid_job_is_one_clear_line_and_exit_two)
{
        char job[512], out[512], path[1024], text[1024] = "";
        FILE *fp;
        size_t n;

        snprintf(job, sizeof(job), "%s/bad.json", dir);
        fp = fopen(job, "w");
        ck_assert_ptr_nonnull(fp);
        fputs("{\"job_id\":\"bad\",\"prompt\":\"x\",\"limits\":"
              "{\"max_turns\":\"many\"}}",
              fp);
        fclose(fp);
        snprintf(out, sizeof(out), "%s/bad", dir);
        ck_assert_int_eq(coderq_run(job, out, "demo"), 2);
        snprintf(path, sizeof(path), "%s/stderr.txt", dir);
        fp = fopen(path, "r");
        ck_assert_ptr_nonnull(fp);
        n = fread(text, 1, sizeof(text) - 1, fp);
        fclose(fp);
        text[n] = '\0';
        ck_assert_msg(strstr(text, "limits.max_turns"), "%s", text);
        ck_assert_msg(strchr(text, '\n') == text + strlen(text) - 1,
                      "not one line: %s", text);
}
END_TEST

/* `coderq exec --out NB` with \p cells on stdin; stdout and stderr go to
 * DIR/exec.out and DIR/exec.err. Returns its exit status. */
static int coderq_exec(const char *cells, const char *nb)
{
        char cmd[4096], src[512];
        int st;

        snprintf(src, sizeof(src), "%s/cells.py", dir);
        write_job(src, cells);
        snprintf(cmd, sizeof(cmd),
                 "CODERQ_LOG_LEVEL=warn %s/coderq exec --out %s <%s "
                 ">%s/exec.out 2>%s/exec.err",
                 CQ_BINARY_DIR, nb, src, dir, dir);
        st = system(cmd);
        ck_assert(WIFEXITED(st));
        return WEXITSTATUS(st);
}

START_TEST(exec_runs_cells_from_stdin_and_writes_the_notebook)
{
        char cmd[4096], nb[512];

        snprintf(nb, sizeof(nb), "%s/exec.ipynb", dir);
        /* the third cell raised: exit 1, the notebook is still written */
        ck_assert_int_eq(coderq_exec("x = 6 * 7\n# %%\nprint(x)\n# %%\n"
                                     "raise ValueError('boom')\n",
                                     nb),
                         1);
        snprintf(cmd, sizeof(cmd), "grep -qx 42 %s/exec.out", dir);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(cmd, sizeof(cmd), "grep -q 'ValueError: boom' %s/exec.err",
                 dir);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 -c 'import nbformat,sys; "
                 "nb = nbformat.read(sys.argv[1], as_version=4); "
                 "nbformat.validate(nb); "
                 "assert [c.execution_count for c in nb.cells] == [1, 2, 3]; "
                 "assert nb.cells[2].outputs[0].output_type == \"error\"' "
                 "%s",
                 nb);
        ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* An error without a traceback prints as coderq's "Name: message" line,
 * the kernel's text in it escaped: it cannot erase or forge lines. */
START_TEST(exec_escapes_an_error_without_a_traceback)
{
        char nb[512], *err;

        snprintf(nb, sizeof(nb), "%s/forged.ipynb", dir);
        ck_assert_int_eq(coderq_exec("class Forged(Exception):\n"
                                     "    def _render_traceback_(self):\n"
                                     "        return []\n"
                                     "raise Forged('\\x1b[2K\\rgone\\n"
                                     "-- cell 1: ok')\n",
                                     nb),
                         1);
        err = slurp("exec.err");
        ck_assert_msg(
            strstr(err, "\nForged: \\x1b[2K\\rgone\\n-- cell 1: ok\n") != NULL,
            "%s", err);
        ck_assert_msg(strchr(err, 0x1b) == NULL, "%s", err);
        free(err);
}
END_TEST

/* Commands other than worker print their own text only: the JSON log
 * lines of what they start (the sandbox, the kernel pool) come with
 * --verbose, not at the default level. */
START_TEST(run_and_exec_log_only_when_verbose)
{
        static const char *const how[] = {"", "--verbose "};
        char cmd[8192], job[512], src[512], *err;
        int i, st;

        snprintf(job, sizeof(job), "%s/quiet.json", dir);
        example_job("demo-newton", job);
        snprintf(src, sizeof(src), "%s/quiet.py", dir);
        write_job(src, "print(6 * 7)\n");
        for (i = 0; i < 2; i++) {
                /* the job's verdict is another test's: only its log here */
                snprintf(cmd, sizeof(cmd),
                         "env -u CODERQ_LOG_LEVEL CODERQ_LLM_BASE_URL=%s "
                         "CODERQ_LLM_MODEL=demo CODERQ_LLM_API_KEY= "
                         "OPENAI_API_KEY= %s/coderq %srun %s --out %s/quiet "
                         ">/dev/null 2>%s/quiet-run.err",
                         cq_fake_llm_base_url(fake), CQ_BINARY_DIR, how[i], job,
                         dir, dir);
                st = system(cmd);
                ck_assert(WIFEXITED(st) && WEXITSTATUS(st) <= 1);
                snprintf(cmd, sizeof(cmd),
                         "env -u CODERQ_LOG_LEVEL %s/coderq %sexec --out "
                         "%s/quiet.ipynb %s >/dev/null 2>%s/quiet-exec.err",
                         CQ_BINARY_DIR, how[i], dir, src, dir);
                st = system(cmd);
                ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
                err = slurp("quiet-run.err");
                ck_assert_msg((strstr(err, "\"level\":") != NULL) == (i == 1),
                              "run%s: %s", how[i], err);
                free(err);
                err = slurp("quiet-exec.err");
                ck_assert_msg((strstr(err, "\"msg\":\"sandbox\"") != NULL) ==
                                  (i == 1),
                              "exec%s: %s", how[i], err);
                ck_assert_msg(i == 1 || !strstr(err, "\"level\":"), "exec: %s",
                              err);
                free(err);
        }
}
END_TEST

/* A fresh machine: the work root does not exist. Both the first run
 * (which creates it) and the second run the code sandboxed, not as us:
 * no /root, no source tree, another uid. */
START_TEST(exec_in_a_fresh_work_root_is_sandboxed)
{
        char cmd[8192], src[512], path[600], want[4200], *text = NULL;
        size_t cap = 0;
        FILE *fp;
        int st, i;

        /* kernel uids pass through it to reach the work root */
        ck_assert_int_eq(chmod(dir, 0711), 0);
        snprintf(src, sizeof(src), "%s/whoami.py", dir);
        fp = fopen(src, "w");
        ck_assert_ptr_nonnull(fp);
        fprintf(fp,
                "import os\nprint(os.getuid() == %ld, "
                "os.path.exists('/root'), os.path.exists('%s'))\n",
                (long)geteuid(), CQ_SOURCE_DIR);
        fclose(fp);
        snprintf(want, sizeof(want), "-- sandbox: %s\n",
                 geteuid() == 0 ? "bwrap+uid-per-kernel" : "bwrap");
        for (i = 0; i < 2; i++) {
                snprintf(cmd, sizeof(cmd),
                         "env -u CODERQ_SANDBOX -u CODERQ_SANDBOX_UIDS "
                         "CODERQ_WORK_ROOT=%s/fresh-root CODERQ_LOG_LEVEL=warn "
                         "%s/coderq exec --out %s/fresh.ipynb %s "
                         ">%s/fresh.out 2>%s/fresh.err",
                         dir, CQ_BINARY_DIR, dir, src, dir, dir);
                st = system(cmd);
                snprintf(path, sizeof(path), "%s/fresh.err", dir);
                fp = fopen(path, "r");
                ck_assert_ptr_nonnull(fp);
                ck_assert_int_ge(getdelim(&text, &cap, '\0', fp), 0);
                fclose(fp);
                ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                              "run %d: %s", i + 1, text);
                ck_assert_msg(strstr(text, want) != NULL, "run %d: %s", i + 1,
                              text);
                snprintf(cmd, sizeof(cmd),
                         "grep -qx 'False False False' %s/fresh.out", dir);
                ck_assert_msg(system(cmd) == 0, "run %d ran unsandboxed",
                              i + 1);
        }
        free(text);
}
END_TEST

/* A cell past the output cap: exec prints what the notebook keeps after
 * the marker (the tail, DeadKernelError, TimeoutError), and the stored
 * marker states a real byte count. */
START_TEST(exec_prints_the_tail_and_errors_of_truncated_cells)
{
        char cmd[4096], nb[512], src[512];
        FILE *fp;
        int st;

        snprintf(src, sizeof(src), "%s/flood.py", dir);
        fp = fopen(src, "w");
        ck_assert_ptr_nonnull(fp);
        fputs("import os, sys, time\n"
              "sys.stdout.write('x' * 3000000)\n"
              "sys.stdout.flush()\n"
              "time.sleep(0.5)\n"
              "os._exit(1)\n"
              "# %%\n"
              "import time\n"
              "print('y' * 3000000)\n"
              "print('TAIL-MARK')\n"
              "time.sleep(120)\n",
              fp);
        fclose(fp);
        snprintf(nb, sizeof(nb), "%s/flood.ipynb", dir);
        snprintf(cmd, sizeof(cmd),
                 "CODERQ_LOG_LEVEL=warn %s/coderq exec --timeout 5 --out %s "
                 "%s >%s/flood.out 2>%s/flood.err",
                 CQ_BINARY_DIR, nb, src, dir, dir);
        st = system(cmd);
        ck_assert(WIFEXITED(st));
        ck_assert_int_eq(WEXITSTATUS(st), 1);
        snprintf(cmd, sizeof(cmd), "grep -q TAIL-MARK %s/flood.out", dir);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(cmd, sizeof(cmd), "grep -q '^DeadKernelError: ' %s/flood.err",
                 dir);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(cmd, sizeof(cmd), "grep -q '^TimeoutError: ' %s/flood.err",
                 dir);
        ck_assert_int_eq(system(cmd), 0);
        snprintf(cmd, sizeof(cmd),
                 "test $(grep -c 'output truncated by coderq: .*[1-9][0-9]* "
                 "bytes dropped' %s/flood.err) -eq 2",
                 dir);
        ck_assert_int_eq(system(cmd), 0);
        /* the notebook has the same: a real count, the tail, the errors */
        snprintf(
            cmd, sizeof(cmd),
            "/usr/bin/python3 -c 'import nbformat, re, sys; "
            "nb = nbformat.read(sys.argv[1], as_version=4); "
            "outs = [c.outputs for c in nb.cells]; "
            "text = lambda o: \"\".join(x.get(\"text\", \"\") for x in o); "
            "counts = [int(re.search(r\"(\\d+) bytes dropped\", "
            "text(o)).group(1)) for o in outs]; "
            /* 3 MB sent, at most the cap (1 MiB) kept */
            "assert all(n >= 3000000 - 1048576 for n in counts), counts; "
            "assert outs[0][-1].ename == \"DeadKernelError\"; "
            "assert outs[1][-1].ename == \"TimeoutError\"; "
            "assert \"TAIL-MARK\" in text(outs[1])' %s",
            nb);
        ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *cmd_run_suite(void)
{
        Suite *s = suite_create("cmd_run");
        TCase *tc = tcase_create("run");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, demo_job_succeeds_and_writes_outputs);
        tcase_add_test(tc, e2b_backend_runs_the_same_job);
        tcase_add_test(tc, failed_job_exits_one_with_the_reason);
        tcase_add_test(tc, solution_job_is_judged_apart);
        tcase_add_test(tc, untrusted_text_prints_escaped);
        tcase_add_test(tc, tests_that_never_ran_say_so);
        tcase_add_test(tc, invalid_job_is_one_clear_line_and_exit_two);
        tcase_add_test(tc, exec_runs_cells_from_stdin_and_writes_the_notebook);
        tcase_add_test(tc, exec_escapes_an_error_without_a_traceback);
        tcase_add_test(tc, exec_in_a_fresh_work_root_is_sandboxed);
        tcase_add_test(tc, run_and_exec_log_only_when_verbose);
        tcase_add_test(tc, exec_prints_the_tail_and_errors_of_truncated_cells);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cmd_run_suite)
