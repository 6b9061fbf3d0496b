/* SPDX-License-Identifier: MIT */
/* check_e2b.c - the E2B backend against the local double
 * (tests/fakes/fake_e2b.py, real ipykernels behind it): cells, files,
 * lifetime extension, injected faults, and fuzz-style tests of the NDJSON
 * line parser. The double runs for the whole suite; the last test checks
 * that it has no live sandbox left. */
#include "coderq/e2b/e2b.h"

#include <check.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/interp/collect.h"
#include "coderq/common/log.h"
#include "support/fake_e2b.h"

static cq_fake_e2b_t fake;

static void fake_up(void)
{
        curl_global_init(CURL_GLOBAL_DEFAULT);
        ck_assert_int_eq(cq_fake_e2b_start(&fake, 1.0), 0);
}

static void fake_down(void)
{
        cq_fake_e2b_stop(&fake);
        curl_global_cleanup();
}

/* ------------------------------------------------------------- helpers */

static cq_interp_t *new_interp(void)
{
        char err[512] = "";
        cq_interp_t *interp = cq_fake_e2b_interp(&fake, err, sizeof(err));

        ck_assert_msg(interp != NULL, "cq_e2b_new: %s", err);
        return interp;
}

static void run(cq_interp_t *interp,
                const char *code,
                int64_t timeout_ms,
                cq_cell_result_t *res)
{
        cq_exec_opts_t opts = {0};
        cq_err_t err;

        opts.timeout_ms = timeout_ms;
        cq_cell_result_init(res);
        err = cq_interp_execute(interp, code, &opts, res);
        ck_assert_msg(err == CQ_OK, "execute: %s", cq_interp_errmsg(interp));
        ck_assert(json_is_array(res->outputs));
}

/* The text of all stream outputs named \p name, joined. */
static char *stream_text(const cq_cell_result_t *res, const char *name)
{
        static char text[65536];
        json_t *o;
        size_t i;

        text[0] = '\0';
        json_array_foreach(res->outputs, i, o)
        {
                const char *t =
                    json_string_value(json_object_get(o, "output_type"));
                const char *n = json_string_value(json_object_get(o, "name"));

                if (t && strcmp(t, "stream") == 0 && n && strcmp(n, name) == 0)
                        snprintf(text + strlen(text),
                                 sizeof(text) - strlen(text), "%s",
                                 json_string_value(json_object_get(o, "text")));
        }
        return text;
}

static json_t *find_output(const cq_cell_result_t *res, const char *type)
{
        json_t *o;
        size_t i;

        json_array_foreach(res->outputs, i, o)
        {
                const char *t =
                    json_string_value(json_object_get(o, "output_type"));

                if (t && strcmp(t, type) == 0)
                        return o;
        }
        return NULL;
}

static const char *error_field(const cq_cell_result_t *res, const char *key)
{
        json_t *err = find_output(res, "error");

        ck_assert_msg(err != NULL, "no error output");
        return json_string_value(json_object_get(err, key));
}

static void inject(const char *faults)
{
        ck_assert_int_eq(cq_fake_e2b_post(&fake, "/_fake/faults", faults), 204);
}

/* ---------------------------------------------------------- the parser */

START_TEST(parse_lines_of_every_type)
{
        cq_e2b_line_t line;
        char err[256];
        json_t *data;
        static const char *count =
            "{\"type\": \"number_of_executions\", \"execution_count\": 7}";
        static const char *out = "{\"type\": \"stdout\", \"text\": \"hi\\n\", "
                                 "\"timestamp\": \"2026-11-29T10:00:00Z\"}";
        static const char *res =
            "{\"type\": \"result\", \"text\": \"2\", \"html\": \"<b>2</b>\", "
            "\"png\": \"iVBO\", \"json\": {\"a\": 1}, "
            "\"extra\": {\"application/x-thing\": \"t\"}, "
            "\"is_main_result\": true}";
        static const char *disp = "{\"type\": \"result\", \"svg\": \"<svg/>\", "
                                  "\"extra\": {}, \"is_main_result\": false}";
        static const char *error =
            "{\"type\": \"error\", \"name\": \"ZeroDivisionError\", "
            "\"value\": \"division by zero\", \"traceback\": "
            "\"\\u001b[0;31m---\\u001b[0m\\nCell In[1], line 1\\n1/0\"}";

        ck_assert_int_eq(
            cq_e2b_parse_line(count, strlen(count), &line, err, sizeof(err)),
            CQ_OK);
        ck_assert_int_eq(line.kind, CQ_E2B_LINE_COUNT);
        ck_assert_int_eq(line.execution_count, 7);

        ck_assert_int_eq(
            cq_e2b_parse_line(out, strlen(out), &line, err, sizeof(err)),
            CQ_OK);
        ck_assert_int_eq(line.kind, CQ_E2B_LINE_OUTPUT);
        ck_assert_str_eq(
            json_string_value(json_object_get(line.output, "name")), "stdout");
        ck_assert_str_eq(
            json_string_value(json_object_get(line.output, "text")), "hi\n");
        json_decref(line.output);

        ck_assert_int_eq(
            cq_e2b_parse_line(res, strlen(res), &line, err, sizeof(err)),
            CQ_OK);
        ck_assert_str_eq(
            json_string_value(json_object_get(line.output, "output_type")),
            "execute_result");
        data = json_object_get(line.output, "data");
        ck_assert_str_eq(json_string_value(json_object_get(data, "text/plain")),
                         "2");
        ck_assert_str_eq(json_string_value(json_object_get(data, "text/html")),
                         "<b>2</b>");
        ck_assert_str_eq(json_string_value(json_object_get(data, "image/png")),
                         "iVBO");
        ck_assert_int_eq(json_integer_value(json_object_get(
                             json_object_get(data, "application/json"), "a")),
                         1);
        ck_assert_str_eq(
            json_string_value(json_object_get(data, "application/x-thing")),
            "t");
        ck_assert(json_is_object(json_object_get(line.output, "metadata")));
        json_decref(line.output);

        ck_assert_int_eq(
            cq_e2b_parse_line(disp, strlen(disp), &line, err, sizeof(err)),
            CQ_OK);
        ck_assert_str_eq(
            json_string_value(json_object_get(line.output, "output_type")),
            "display_data");
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(line.output, "data"), "image/svg+xml")),
            "<svg/>");
        json_decref(line.output);

        ck_assert_int_eq(
            cq_e2b_parse_line(error, strlen(error), &line, err, sizeof(err)),
            CQ_OK);
        ck_assert_str_eq(
            json_string_value(json_object_get(line.output, "ename")),
            "ZeroDivisionError");
        data = json_object_get(line.output, "traceback");
        ck_assert_int_eq(json_array_size(data), 3);
        ck_assert_str_eq(json_string_value(json_array_get(data, 0)), "---");
        ck_assert_str_eq(json_string_value(json_array_get(data, 2)), "1/0");
        json_decref(line.output);

        ck_assert_int_eq(cq_e2b_parse_line("{\"type\": \"keepalive\"}", 21,
                                           &line, err, sizeof(err)),
                         CQ_OK);
        ck_assert_int_eq(line.kind, CQ_E2B_LINE_IGNORED);
        ck_assert_int_eq(
            cq_e2b_parse_line("{\"type\": \"new_thing\", \"x\": 1}", 29, &line,
                              err, sizeof(err)),
            CQ_OK);
        ck_assert_int_eq(line.kind, CQ_E2B_LINE_IGNORED);
        ck_assert_int_eq(cq_e2b_parse_line("{\"type\": \"end_of_execution\"}",
                                           28, &line, err, sizeof(err)),
                         CQ_OK);
        ck_assert_int_eq(line.kind, CQ_E2B_LINE_END);
}
END_TEST

/* Code may print a NUL ("\u0000" in the stream): kept like any other
 * character, in stdout text, error values and tracebacks. */
START_TEST(parse_keeps_nul_bytes)
{
        cq_e2b_line_t line;
        char err[256];
        const json_t *text, *tb;
        static const char out[] =
            "{\"type\": \"stdout\", \"text\": \"a\\u0000b\\n\"}";
        static const char error[] =
            "{\"type\": \"error\", \"name\": \"E\", \"value\": \"x\\u0000y\", "
            "\"traceback\": \"\\u001b[0;31mt\\u0000\\u001b[0m\\nlast\\u0000"
            "\"}";

        ck_assert_msg(cq_e2b_parse_line(out, strlen(out), &line, err,
                                        sizeof(err)) == CQ_OK,
                      "%s", err);
        ck_assert_int_eq(line.kind, CQ_E2B_LINE_OUTPUT);
        text = json_object_get(line.output, "text");
        ck_assert_uint_eq(json_string_length(text), 4);
        ck_assert_mem_eq(json_string_value(text), "a\0b\n", 4);
        json_decref(line.output);

        ck_assert_msg(cq_e2b_parse_line(error, strlen(error), &line, err,
                                        sizeof(err)) == CQ_OK,
                      "%s", err);
        text = json_object_get(line.output, "evalue");
        ck_assert_uint_eq(json_string_length(text), 3);
        ck_assert_mem_eq(json_string_value(text), "x\0y", 3);
        tb = json_object_get(line.output, "traceback");
        ck_assert_uint_eq(json_array_size(tb), 2);
        ck_assert_uint_eq(json_string_length(json_array_get(tb, 0)), 2);
        ck_assert_mem_eq(json_string_value(json_array_get(tb, 0)), "t\0", 2);
        ck_assert_uint_eq(json_string_length(json_array_get(tb, 1)), 5);
        ck_assert_mem_eq(json_string_value(json_array_get(tb, 1)), "last\0", 5);
        json_decref(line.output);
}
END_TEST

START_TEST(parse_rejects_malformed_lines)
{
        static const char *bad[] = {
            "",
            "{",
            "{\"type\": \"stdout\", \"text\": ",
            "[1, 2]",
            "\"stdout\"",
            "{\"text\": \"x\"}",
            "{\"type\": 5}",
            "{\"type\": null}",
            "{\"type\": \"stdout\"}",
            "{\"type\": \"stdout\", \"text\": 5}",
            "{\"type\": \"stderr\", \"text\": [\"a\"]}",
            "{\"type\": \"number_of_executions\"}",
            "{\"type\": \"number_of_executions\", \"execution_count\": \"1\"}",
            "{\"type\": \"number_of_executions\", \"execution_count\": -1}",
            "{\"type\": \"number_of_executions\", \"execution_count\": "
            "99999999999999}",
            "{\"type\": \"error\", \"name\": 1, \"value\": \"v\"}",
            "{\"type\": \"error\", \"name\": \"n\"}",
            "{\"type\": \"error\", \"name\": \"n\", \"value\": \"v\", "
            "\"traceback\": [1]}",
            "{\"type\": \"result\", \"text\": 2}",
            "{\"type\": \"result\", \"png\": {}}",
            "{\"type\": \"result\", \"extra\": []}",
            "{\"type\": \"result\", \"is_main_result\": \"yes\"}",
            "{\"type\": \"stdout\", \"type\": \"stderr\", \"text\": \"x\"}",
            "{\"type\": \"stdout\", \"text\": \"\xff\xfe\"}",
            "\x00\x01\x02",
        };
        cq_e2b_line_t line;
        char err[256];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                size_t len = i == CQ_ARRAY_SIZE(bad) - 1 ? 3 : strlen(bad[i]);

                ck_assert_msg(cq_e2b_parse_line(bad[i], len, &line, err,
                                                sizeof(err)) == CQ_ERR_FATAL,
                              "accepted bad line %zu", i);
                ck_assert_msg(err[0] != '\0', "no message for line %zu", i);
                ck_assert(line.output == NULL);
        }
}
END_TEST

START_TEST(parse_survives_random_and_truncated_input)
{
        static const char *good =
            "{\"type\": \"result\", \"text\": \"2\", \"png\": \"iVBO\", "
            "\"extra\": {\"a/b\": {\"k\": [1, 2]}}, \"is_main_result\": true}";
        unsigned int seed = 12345;
        char buf[512];
        cq_e2b_line_t line;
        char err[256];
        size_t i, n;
        int round;

        /* every prefix of a valid line but the whole is rejected cleanly */
        for (n = 0; n < strlen(good); n++) {
                ck_assert(cq_e2b_parse_line(good, n, &line, err, sizeof(err)) ==
                          CQ_ERR_FATAL);
                ck_assert(err[0]);
        }
        /* random bytes, and valid lines with random bytes flipped */
        for (round = 0; round < 20000; round++) {
                n = (size_t)(rand_r(&seed) % sizeof(buf));
                if (round % 2) {
                        for (i = 0; i < n; i++)
                                buf[i] = (char)rand_r(&seed);
                } else {
                        n = strlen(good);
                        memcpy(buf, good, n);
                        buf[rand_r(&seed) % n] = (char)rand_r(&seed);
                }
                if (cq_e2b_parse_line(buf, n, &line, err, sizeof(err)) ==
                    CQ_OK) {
                        json_decref(line.output);
                } else {
                        ck_assert(err[0]);
                        ck_assert(line.output == NULL);
                }
        }
}
END_TEST

START_TEST(parse_huge_values)
{
        static const char prefix[] = "{\"type\": \"stdout\", \"text\": \"";
        size_t n = 8u << 20, i;
        char *line = malloc(n + 64);
        cq_e2b_line_t parsed;
        char err[256];

        ck_assert(line != NULL);
        /* an 8 MiB stdout text parses (the cap is the stream's job) */
        memcpy(line, prefix, sizeof(prefix) - 1);
        for (i = 0; i < n; i++)
                line[sizeof(prefix) - 1 + i] = 'x';
        memcpy(line + sizeof(prefix) - 1 + n, "\"}", 2);
        ck_assert_int_eq(cq_e2b_parse_line(line, sizeof(prefix) + 1 + n,
                                           &parsed, err, sizeof(err)),
                         CQ_OK);
        ck_assert_uint_eq(
            json_string_length(json_object_get(parsed.output, "text")), n);
        json_decref(parsed.output);
        /* deep nesting is refused, not a stack overflow */
        for (i = 0; i < n / 2; i++)
                line[i] = '[';
        ck_assert_int_eq(
            cq_e2b_parse_line(line, n / 2, &parsed, err, sizeof(err)),
            CQ_ERR_FATAL);
        free(line);
}
END_TEST

START_TEST(data_plane_urls_and_config)
{
        char url[256];
        cq_config_t cfg;
        cq_e2b_opts_t opts;
        char err[256];

        ck_assert_int_eq(
            cq_e2b_data_url(NULL, NULL, "iabc", 49999, url, sizeof(url)), 0);
        ck_assert_str_eq(url, "https://49999-iabc.e2b.app");
        ck_assert_int_eq(
            cq_e2b_data_url(NULL, "e2b.app", "iabc", 49983, url, sizeof(url)),
            0);
        ck_assert_str_eq(url, "https://sandbox.e2b.app");
        ck_assert_int_eq(
            cq_e2b_data_url(NULL, "e2b.dev", "iabc", 49983, url, sizeof(url)),
            0);
        ck_assert_str_eq(url, "https://sandbox.e2b.dev");
        ck_assert_int_eq(cq_e2b_data_url(NULL, "example.org", "iabc", 49983,
                                         url, sizeof(url)),
                         0);
        ck_assert_str_eq(url, "https://49983-iabc.example.org");
        ck_assert_int_eq(cq_e2b_data_url("http://127.0.0.1:9/", "e2b.app",
                                         "iabc", 49999, url, sizeof(url)),
                         0);
        ck_assert_str_eq(url, "http://127.0.0.1:9");
        ck_assert_int_eq(
            cq_e2b_data_url(NULL, "example.org", "iabc", 49999, url, 10), -1);

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        cq_e2b_opts_from_config(&opts, &cfg);
        ck_assert(opts.api_key == NULL);
        ck_assert_str_eq(opts.domain, "e2b.app");
        ck_assert_str_eq(opts.template_id, "code-interpreter-v1");
        /* what the official SDKs use now */
        ck_assert_str_eq(opts.create_path, "/v2/sandboxes");
        ck_assert_int_eq(opts.ttl_s, 300);
        ck_assert_int_eq(opts.max_timeout_s, 3600);
        ck_assert_int_eq(cq_config_check(&cfg, err, sizeof(err)), 0);
        /* a TTL E2B would refuse on every create is refused now */
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_E2B_TTL_S", "7200", "env",
                                       err, sizeof(err)),
                         0);
        ck_assert_int_eq(cq_config_check(&cfg, err, sizeof(err)), -1);
        ck_assert_msg(strstr(err, "CODERQ_E2B_MAX_TIMEOUT_S"), "%s", err);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_E2B_MAX_TIMEOUT_S",
                                       "86400", "env", err, sizeof(err)),
                         0);
        ck_assert_int_eq(cq_config_check(&cfg, err, sizeof(err)), 0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_E2B_MAX_TIMEOUT_S",
                                       "90000", "env", err, sizeof(err)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "E2B_API_KEY", "e2b_abc", "env",
                                       err, sizeof(err)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "e2b-create-path", "/v2/sandboxes",
                                       "flag", err, sizeof(err)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_E2B_TTL_S", "5", "env",
                                       err, sizeof(err)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_BACKEND", "e2b", "env",
                                       err, sizeof(err)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_BACKEND", "docker", "env",
                                       err, sizeof(err)),
                         -1);
        cq_e2b_opts_from_config(&opts, &cfg);
        ck_assert_str_eq(opts.api_key, "e2b_abc");
        ck_assert_str_eq(opts.create_path, "/v2/sandboxes");
        ck_assert_str_eq(cfg.backend, "e2b");
        cq_config_release(&cfg);
}
END_TEST

/* ------------------------------------------------------- cells & files */

START_TEST(cells_stdout_stderr_error_and_png)
{
        cq_interp_t *interp = new_interp();
        cq_cell_result_t res;
        json_t *o, *data;
        long set_timeout_before = cq_fake_e2b_stat(&fake, "set_timeout");
        char errstr[256];

        ck_assert_str_eq(cq_interp_backend(interp), "e2b");
        /* E2B does not say: a notebook gets no language_info */
        ck_assert_ptr_null(cq_interp_language_info(interp));
        run(interp,
            "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n"
            "x = 41",
            30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "hello\n");
        ck_assert_str_eq(stream_text(&res, "stderr"), "warn\n");
        ck_assert_int_eq(res.execution_count, 1);
        ck_assert(!res.state_lost);
        cq_cell_result_release(&res);

        run(interp, "x + 1", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        o = find_output(&res, "execute_result");
        ck_assert(o != NULL);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(o, "data"), "text/plain")),
                         "42");
        ck_assert_int_eq(
            json_integer_value(json_object_get(o, "execution_count")), 2);
        cq_cell_result_release(&res);

        run(interp, "print('before')\n1/0", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(stream_text(&res, "stdout"), "before\n");
        ck_assert_str_eq(error_field(&res, "ename"), "ZeroDivisionError");
        ck_assert_str_eq(error_field(&res, "evalue"), "division by zero");
        o = json_object_get(find_output(&res, "error"), "traceback");
        ck_assert(json_array_size(o) > 0);
        ck_assert_msg(strchr(json_string_value(json_array_get(o, 0)), '\x1b') ==
                          NULL,
                      "ANSI codes left in the traceback");
        cq_cell_result_release(&res);

        run(interp,
            "import matplotlib\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3])\nplt.show()",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        o = find_output(&res, "display_data");
        ck_assert(o != NULL);
        data = json_object_get(o, "data");
        ck_assert(json_is_string(json_object_get(data, "image/png")));
        ck_assert(strncmp(json_string_value(json_object_get(data, "image/png")),
                          "iVBORw0KGgo", 11) == 0);
        ck_assert(json_is_string(json_object_get(data, "text/plain")));
        cq_cell_result_release(&res);

        /* the 60 s TTL was extended before the first cell (its 30 s
         * deadline would outlast a third of it), and on demand */
        ck_assert_int_gt(cq_fake_e2b_stat(&fake, "set_timeout"),
                         set_timeout_before);
        set_timeout_before = cq_fake_e2b_stat(&fake, "set_timeout");
        ck_assert_int_eq(cq_e2b_keepalive(interp, errstr, sizeof(errstr)),
                         CQ_OK);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "set_timeout"),
                         set_timeout_before + 1);
        cq_interp_destroy(&interp);
        ck_assert(interp == NULL);
}
END_TEST

START_TEST(files_up_and_created_files_down)
{
        cq_interp_t *interp = new_interp();
        cq_cell_result_t res;
        cq_files_t files = {NULL, 0};
        cq_file_t file;
        static const char csv[] = "a,b\n1,2\n3,4\n";

        ck_assert_int_eq(
            cq_interp_put_file(interp, "data.csv", csv, sizeof(csv) - 1),
            CQ_OK);
        ck_assert_int_eq(
            cq_interp_put_file(interp, "in/nested.txt", "nested", 6), CQ_OK);
        ck_assert_int_eq(cq_interp_put_file(interp, "../evil", "x", 1),
                         CQ_ERR_FATAL);
        run(interp,
            "import os\nprint(open('data.csv').read().count('\\n'))\n"
            "print(open('in/nested.txt').read())\n"
            "os.makedirs('out/plots', exist_ok=True)\n"
            "open('out/plots/fig.png', 'wb').write(b'\\x89PNG fake')\n"
            "open('result.txt', 'w').write('done')\n"
            "open('.hidden', 'w').write('no')\n"
            "os.symlink('result.txt', 'link.txt')\n",
            30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "3\nnested\n");
        cq_cell_result_release(&res);
        /* envd refuses to write over a directory */
        ck_assert_int_eq(cq_interp_put_file(interp, "out", "x", 1),
                         CQ_ERR_FATAL);
        ck_assert_msg(strstr(cq_interp_errmsg(interp),
                             "could not upload \"out\" to E2B sandbox: HTTP "
                             "400: path is a directory") != NULL,
                      "%s", cq_interp_errmsg(interp));

        ck_assert_int_eq(cq_interp_created_files(interp, true, &files), CQ_OK);
        ck_assert_uint_eq(files.n, 2);
        ck_assert_str_eq(files.v[0].name, "out/plots/fig.png");
        ck_assert_str_eq(files.v[0].mime, "image/png");
        ck_assert_uint_eq(files.v[0].len, 9);
        ck_assert(memcmp(files.v[0].data, "\x89PNG fake", 9) == 0);
        ck_assert_str_eq(files.v[1].name, "result.txt");
        ck_assert(memcmp(files.v[1].data, "done", 4) == 0);
        cq_files_release(&files);

        /* listing only: no bytes, but the sizes */
        ck_assert_int_eq(cq_interp_created_files(interp, false, &files), CQ_OK);
        ck_assert_uint_eq(files.n, 2);
        ck_assert(files.v[0].data == NULL);
        ck_assert_uint_eq(files.v[0].len, 9);
        ck_assert_uint_eq(files.v[1].len, 4);
        cq_files_release(&files);

        ck_assert_int_eq(cq_interp_get_file(interp, "result.txt", 100, &file),
                         CQ_OK);
        ck_assert_uint_eq(file.len, 4);
        ck_assert(memcmp(file.data, "done", 4) == 0);
        free(file.name);
        free(file.mime);
        free(file.data);
        ck_assert_int_eq(cq_interp_get_file(interp, "data.csv", 4, &file),
                         CQ_ERR_TOO_LARGE);
        ck_assert_int_eq(cq_interp_get_file(interp, "missing.txt", 100, &file),
                         CQ_ERR_FATAL);
        ck_assert(strstr(cq_interp_errmsg(interp), "no such file") != NULL);
        cq_interp_destroy(&interp);
}
END_TEST

/* The bytes the marker of \p res says were dropped, -1 without one. */
static long long marker_bytes(const cq_cell_result_t *res, bool *at_leastp)
{
        const char *m = strstr(stream_text(res, "stderr"), CQ_COLLECT_MARK);
        long long n = -1;

        *at_leastp = false;
        if (m) {
                m += strlen(CQ_COLLECT_MARK);
                if (strncmp(m, "at least ", 9) == 0) {
                        *at_leastp = true;
                        m += 9;
                }
                ck_assert_int_eq(sscanf(m, "%lld bytes dropped", &n), 1);
        }
        return n;
}

START_TEST(output_cap_keeps_head_and_tail)
{
        cq_e2b_opts_t opts;
        cq_interp_t *interp;
        cq_cell_result_t res;
        cq_exec_opts_t eopts = {0};
        char err[256];
        const char *out;
        long long n;
        bool at_least;

        cq_fake_e2b_opts(&fake, &opts);
        opts.max_output = 4096;
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        eopts.timeout_ms = 30000;
        cq_cell_result_init(&res);
        ck_assert_int_eq(
            cq_interp_execute(interp,
                              "print('FIRST')\nfor i in range(5000): "
                              "print('line', i)\nprint('LAST')",
                              &eopts, &res),
            CQ_OK);
        ck_assert(res.truncated);
        out = stream_text(&res, "stdout");
        ck_assert(strncmp(out, "FIRST\n", 6) == 0);
        ck_assert(strlen(out) <= 4096);
        ck_assert(strstr(out, "LAST\n") != NULL);
        ck_assert(strstr(stream_text(&res, "stderr"), "output truncated") !=
                  NULL);
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);

        /* JSON values that are not strings count their serialized size */
        cq_fake_e2b_opts(&fake, &opts);
        opts.max_output = 65536;
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_cell_result_init(&res);
        ck_assert_int_eq(
            cq_interp_execute(interp,
                              "from IPython.display import display\n"
                              "for i in range(20):\n"
                              "    display({'application/json': "
                              "list(range(5000))}, raw=True)",
                              &eopts, &res),
            CQ_OK);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.truncated);
        n = marker_bytes(&res, &at_least);
        ck_assert(!at_least);
        ck_assert_int_ge(n, 150000);
        {
                size_t i, kept = 0;
                json_t *v;

                json_array_foreach(res.outputs, i, v) kept +=
                    cq_collect_size(v);
                ck_assert_uint_le(kept, 65536 + 200);
        }
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);

        /* one NDJSON line over the line cap: skipped and counted, the cell
         * goes on */
        cq_fake_e2b_opts(&fake, &opts);
        opts.max_line = 256 * 1024;
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_cell_result_init(&res);
        ck_assert_int_eq(cq_interp_execute(interp,
                                           "import sys\n"
                                           "print('x' * 400000)\n"
                                           "sys.stdout.flush()\n"
                                           "print('after')",
                                           &eopts, &res),
                         CQ_OK);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.truncated);
        n = marker_bytes(&res, &at_least);
        ck_assert(!at_least);
        ck_assert_int_ge(n, 400000);
        ck_assert(strstr(stream_text(&res, "stdout"), "after\n") != NULL);
        cq_cell_result_release(&res);
        /* an error line over the cap still fails the cell */
        cq_cell_result_init(&res);
        ck_assert_int_eq(cq_interp_execute(interp,
                                           "raise ValueError('v' * 400000)",
                                           &eopts, &res),
                         CQ_OK);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(error_field(&res, "ename"), "OutputTooLarge");
        ck_assert(res.truncated);
        cq_cell_result_release(&res);
        cq_cell_result_init(&res);
        ck_assert_int_eq(cq_interp_execute(interp, "print('ok')", &eopts, &res),
                         CQ_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "ok\n");
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(created_files_reports_changed_template_files)
{
        cq_e2b_opts_t opts;
        cq_interp_t *interp;
        cq_cell_result_t res;
        cq_files_t files = {NULL, 0};
        char err[256];

        cq_fake_e2b_opts(&fake, &opts);
        opts.template_id = "seeded";
        opts.create_path = "/v2/sandboxes"; /* as npm e2b 2.51 creates */
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        {
                json_t *log = cq_fake_e2b_get(&fake, "/_fake/log"), *entry;
                size_t i;
                bool seen = false;

                json_array_foreach(log, i, entry)
                {
                        const char *path =
                            json_string_value(json_object_get(entry, "path"));

                        if (path && strcmp(path, "/v2/sandboxes") == 0 &&
                            json_integer_value(
                                json_object_get(entry, "status")) == 201)
                                seen = true;
                }
                json_decref(log);
                ck_assert_msg(seen, "no 201 for POST /v2/sandboxes");
        }
        run(interp,
            "print(open('seed2.txt').read(), end='')\n"
            "open('seed.txt', 'a').write('more')",
            30000, &res);
        ck_assert_str_eq(stream_text(&res, "stdout"), "seed\n");
        cq_cell_result_release(&res);
        ck_assert_int_eq(cq_interp_created_files(interp, true, &files), CQ_OK);
        ck_assert_uint_eq(files.n, 1);
        ck_assert_str_eq(files.v[0].name, "seed.txt");
        ck_assert_uint_eq(files.v[0].len, 9);
        ck_assert(memcmp(files.v[0].data, "seed\nmore", 9) == 0);
        cq_files_release(&files);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(long_cell_outlives_the_ttl)
{
        cq_e2b_opts_t opts;
        cq_interp_t *interp;
        cq_cell_result_t res;
        char err[256], before[64], after[64];
        long extended, connects;

        cq_fake_e2b_opts(&fake, &opts);
        opts.ttl_s = 12;
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_e2b_sandbox_id(interp, before, sizeof(before));
        extended = cq_fake_e2b_stat(&fake, "set_timeout");
        connects = cq_fake_e2b_stat(&fake, "connect");
        /* no deadline: only extensions during the cell keep it alive */
        run(interp, "import time\ntime.sleep(16)\nprint('survived')", 0, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(!res.state_lost);
        ck_assert_str_eq(stream_text(&res, "stdout"), "survived\n");
        cq_cell_result_release(&res);
        cq_e2b_sandbox_id(interp, after, sizeof(after));
        ck_assert_str_eq(before, after);
        /* surviving 16 s on a 12 s TTL needs an extension during the cell
         * (one before it gives at most 12 s from its start) */
        ck_assert_int_ge(cq_fake_e2b_stat(&fake, "set_timeout"), extended + 1);
        /* by its own timeout calls: E2B's connect only ever lengthens a
         * life, by a default the client does not choose */
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "connect"), connects);
        cq_interp_destroy(&interp);
}
END_TEST

/* --------------------------------------------------------------- faults */

/* Whether the double expired a sandbox more than \p arg, a count of
 * expired sandboxes before. */
static bool expired_more(void *arg)
{
        return cq_fake_e2b_stat(&fake, "expired") > *(const long *)arg;
}

START_TEST(expired_sandbox_is_replaced)
{
        cq_interp_t *interp = new_interp();
        cq_cell_result_t res;
        long expired = cq_fake_e2b_stat(&fake, "expired");
        char id[64], path[128];

        run(interp, "v = 1", 30000, &res);
        cq_cell_result_release(&res);
        /* shorten its lifetime to 1 s, as a worker that stopped extending
         * it would leave it: the double expires it */
        cq_e2b_sandbox_id(interp, id, sizeof(id));
        snprintf(path, sizeof(path), "/sandboxes/%s/timeout", id);
        ck_assert_int_eq(cq_fake_e2b_post(&fake, path, "{\"timeout\": 1}"),
                         204);
        ck_assert_msg(cq_check_wait_until(expired_more, &expired, 10000),
                      "the sandbox did not expire");
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "expired"), expired + 1);
        run(interp, "print('v' in dir())", 30000, &res);
        ck_assert(res.state_lost);
        cq_cell_result_release(&res);
        run(interp, "print('again')", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "again\n");
        ck_assert(!res.state_lost);
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(faults_in_the_stream_recover)
{
        cq_interp_t *interp = new_interp();
        cq_cell_result_t res;
        char before[64], after[64];

        ck_assert_int_eq(cq_interp_put_file(interp, "data.csv", "a\n1\n", 4),
                         CQ_OK);
        run(interp, "x = 1", 30000, &res);
        cq_cell_result_release(&res);

        /* malformed NDJSON: a clear error, the context restarted */
        inject("{\"execute\": [{\"mode\": \"malformed\"}]}");
        run(interp, "print('a')", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(res.state_lost);
        ck_assert_str_eq(error_field(&res, "ename"), "KernelRestarted");
        ck_assert(strstr(error_field(&res, "evalue"), "malformed line") !=
                  NULL);
        cq_cell_result_release(&res);
        run(interp, "print('x' in dir())", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "False\n");
        cq_cell_result_release(&res);

        /* refused by the kernel before it ran (ExecutionAborted after a
         * failed cell): run again, transparently */
        inject("{\"execute\": [{\"mode\": \"aborted\"}]}");
        run(interp, "print('ran')", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "ran\n");
        ck_assert(find_output(&res, "error") == NULL);
        cq_cell_result_release(&res);

        /* a stream cut without end_of_execution */
        inject("{\"execute\": [{\"mode\": \"truncate\"}]}");
        run(interp, "print(1)\nprint(2)\nprint(3)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(strstr(error_field(&res, "evalue"),
                         "ended without end_of_execution") != NULL);
        cq_cell_result_release(&res);

        /* the sandbox killed mid-cell: a new one, with the job files */
        cq_e2b_sandbox_id(interp, before, sizeof(before));
        inject("{\"execute\": [{\"mode\": \"kill\"}]}");
        run(interp, "print('never')", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(res.state_lost);
        ck_assert_str_eq(error_field(&res, "ename"), "SandboxLost");
        cq_cell_result_release(&res);
        cq_e2b_sandbox_id(interp, after, sizeof(after));
        ck_assert_str_ne(before, after);
        run(interp, "print(open('data.csv').read().split())", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "['a', '1']\n");
        cq_cell_result_release(&res);

        /* a proxy 502 on /execute, and a sandbox killed between cells */
        inject("{\"execute\": [{\"mode\": \"proxy_502\"}]}");
        run(interp, "1", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(strstr(error_field(&res, "evalue"), "502") != NULL);
        cq_cell_result_release(&res);
        cq_e2b_sandbox_id(interp, before, sizeof(before));
        {
                char path[128];

                snprintf(path, sizeof(path), "/_fake/kill/%s", before);
                ck_assert_int_eq(cq_fake_e2b_post(&fake, path, NULL), 204);
        }
        /* found out by the lifetime extension before the cell: the cell
         * runs in a fresh sandbox and says so */
        run(interp, "print(2 + 2)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.state_lost);
        ck_assert_str_eq(stream_text(&res, "stdout"), "4\n");
        ck_assert(strstr(stream_text(&res, "stderr"), "sandbox was lost") !=
                  NULL);
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
}
END_TEST

struct side {
        cq_interp_t *interp;
        cq_err_t keepalive;
        long streams; /* the double's count of output lines before */
        bool ran;     /* the cell's first output arrived */
};

/* Whether the cell printed (and so runs): the double passed on more
 * output lines than before it. */
static bool side_cell_runs(void *arg)
{
        const struct side *side = arg;

        return cq_fake_e2b_stat(&fake, "streams") > side->streams;
}

/* From another thread once the cell runs: extend the lifetime, then
 * interrupt. */
static void *side_thread(void *arg)
{
        struct side *side = arg;
        char err[256];

        side->ran = cq_check_wait_until(side_cell_runs, side, 30000);
        side->keepalive = cq_e2b_keepalive(side->interp, err, sizeof(err));
        (void)cq_interp_interrupt(side->interp);
        return NULL;
}

START_TEST(timeouts_and_cancel)
{
        cq_interp_t *interp = new_interp();
        cq_cell_result_t res;
        cq_exec_opts_t opts = {0};
        atomic_int cancel;

        run(interp, "y = 'kept'", 30000, &res);
        cq_cell_result_release(&res);

        /* a busy loop: the deadline aborts, the server interrupts, state
         * survives */
        run(interp, "while True: pass", 1500, &res);
        ck_assert_int_eq(res.status, CQ_CELL_TIMEOUT);
        ck_assert(!res.state_lost);
        ck_assert_str_eq(error_field(&res, "ename"), "TimeoutError");
        cq_cell_result_release(&res);
        run(interp, "print(y)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"), "kept\n");
        cq_cell_result_release(&res);

        /* a stream that never ends */
        inject("{\"execute\": [{\"mode\": \"never_end\"}]}");
        run(interp, "print('x')", 1500, &res);
        ck_assert_int_eq(res.status, CQ_CELL_TIMEOUT);
        cq_cell_result_release(&res);

        /* the cancel flag */
        atomic_init(&cancel, 1);
        opts.timeout_ms = 60000;
        opts.cancel = &cancel;
        cq_cell_result_init(&res);
        ck_assert_int_eq(cq_interp_execute(interp,
                                           "import time\n"
                                           "time.sleep(30)",
                                           &opts, &res),
                         CQ_OK);
        ck_assert_int_eq(res.status, CQ_CELL_CANCELLED);
        ck_assert_int_lt(res.duration_ms, 20000);
        cq_cell_result_release(&res);

        /* an interrupt (and a lifetime extension) from another thread */
        {
                struct side side = {interp, CQ_ERR_FATAL,
                                    cq_fake_e2b_stat(&fake, "streams"), false};
                pthread_t tid;

                ck_assert_int_eq(pthread_create(&tid, NULL, side_thread, &side),
                                 0);
                run(interp,
                    "import time\nprint('sleeping', flush=True)\n"
                    "time.sleep(20)",
                    60000, &res);
                pthread_join(tid, NULL);
                ck_assert_msg(side.ran, "the cell never printed");
                ck_assert_str_eq(stream_text(&res, "stdout"), "sleeping\n");
                ck_assert_int_eq(side.keepalive, CQ_OK);
                ck_assert_int_eq(res.status, CQ_CELL_ERROR);
                ck_assert_str_eq(error_field(&res, "ename"),
                                 "KeyboardInterrupt");
                ck_assert_int_lt(res.duration_ms, 15000);
                cq_cell_result_release(&res);
        }

        /* restart loses state and still works */
        ck_assert_int_eq(cq_interp_restart(interp), CQ_OK);
        run(interp, "print('y' in dir())", 30000, &res);
        ck_assert_str_eq(stream_text(&res, "stdout"), "False\n");
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(create_retries_429_then_succeeds)
{
        long calls = cq_fake_e2b_stat(&fake, "create_calls");
        cq_interp_t *interp;

        inject("{\"create\": [{\"status\": 429, \"count\": 2, "
               "\"retry_after\": 1}]}");
        interp = new_interp();
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 3);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(create_401_fails_at_once_without_the_key)
{
        cq_e2b_opts_t opts;
        char err[512];
        long calls = cq_fake_e2b_stat(&fake, "create_calls");
        int fds[2];
        char logs[8192];
        ssize_t n;
        static const char wrong[] = "e2b_ffffffffffffffffffffffff0000000000";

        ck_assert_int_eq(pipe(fds), 0);
        cq_log_set_fd(fds[1]);
        cq_log_set_level(CQ_LOG_DEBUG);

        /* a wrong key */
        cq_fake_e2b_opts(&fake, &opts);
        opts.api_key = wrong;
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert_msg(strstr(err, "HTTP 401") != NULL, "%s", err);
        ck_assert(strstr(err, "E2B_API_KEY") != NULL);
        ck_assert(strstr(err, wrong) == NULL);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 1);

        /* a 401 injected for the right key, and a template that fails */
        cq_fake_e2b_opts(&fake, &opts);
        opts.template_id = "fault-401";
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert(strstr(err, "401") != NULL);
        ck_assert(strstr(err, fake.api_key) == NULL);
        opts.template_id = "fault-404";
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert_msg(strstr(err, "HTTP 404") != NULL, "%s", err);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 3);

        /* nothing listening: retried, then a retriable network error */
        cq_fake_e2b_opts(&fake, &opts);
        opts.api_url = "http://127.0.0.1:1";
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert_msg(strstr(err, "could not create E2B sandbox: ") != NULL &&
                          strstr(err, "connect") != NULL,
                      "%s", err);

        /* no API key at all */
        opts.api_key = NULL;
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert(strstr(err, "E2B_API_KEY is not set") != NULL);

        /* retries of a 5xx are logged, never with the key */
        inject("{\"create\": [{\"status\": 503, \"count\": 1}]}");
        cq_fake_e2b_opts(&fake, &opts);
        {
                cq_interp_t *interp = cq_e2b_new(&opts, err, sizeof(err));

                ck_assert_msg(interp != NULL, "%s", err);
                cq_interp_destroy(&interp);
        }
        cq_log_set_fd(2);
        close(fds[1]);
        n = read(fds[0], logs, sizeof(logs) - 1);
        close(fds[0]);
        ck_assert_int_gt(n, 0);
        logs[n] = '\0';
        ck_assert_msg(strstr(logs, "HTTP 503") != NULL, "%s", logs);
        ck_assert(strstr(logs, fake.api_key) == NULL);
        ck_assert(strstr(logs, wrong) == NULL);
}
END_TEST

/* ----------------------------------------------------- money & lifetime */

/* The sandboxes the double holds whose metadata has \p key = \p value. */
static json_t *tagged(const char *key, const char *value)
{
        char path[512];

        snprintf(path, sizeof(path),
                 "/v2/sandboxes?metadata=%s%%3D%s&state=running", key, value);
        return cq_fake_e2b_get(&fake, path);
}

START_TEST(create_retries_only_what_may_help)
{
        cq_e2b_opts_t opts;
        cq_interp_t *interp;
        char err[512];
        long calls = cq_fake_e2b_stat(&fake, "create_calls");

        cq_fake_e2b_opts(&fake, &opts);
        /* a 500 may have made a sandbox: not repeated */
        inject("{\"create\": [{\"status\": 500, \"count\": 1}]}");
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert_msg(strstr(err, "HTTP 500"), "%s", err);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 1);
        /* ... unless the API says it may be */
        inject("{\"create\": [{\"status\": 500, \"count\": 1, "
               "\"should_retry\": true}]}");
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 3);
        /* a 503 is retried, Should-Retry: false is obeyed */
        inject("{\"create\": [{\"status\": 503, \"count\": 1}]}");
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 5);
        inject("{\"create\": [{\"status\": 503, \"count\": 1, "
               "\"should_retry\": false}]}");
        ck_assert(cq_e2b_new(&opts, err, sizeof(err)) == NULL);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "create_calls"), calls + 6);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 0);
}
END_TEST

START_TEST(lost_create_reply_leaves_no_second_sandbox)
{
        cq_e2b_opts_t opts;
        cq_interp_t *interp;
        json_t *mine;
        char err[512], id[64];
        long created = cq_fake_e2b_stat(&fake, "created");

        cq_fake_e2b_opts(&fake, &opts);
        opts.worker_id = "w-lost";
        opts.job_id = "job-lost";
        opts.attempt = 2;
        /* the first create makes a sandbox whose reply never arrives */
        inject("{\"create\": [{\"mode\": \"lost\", \"count\": 1}]}");
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "created"), created + 2);
        /* the lost one was found by its tag and killed: one is billed */
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 1);
        mine = tagged("coderq_job", "job-lost");
        ck_assert_uint_eq(json_array_size(mine), 1);
        cq_e2b_sandbox_id(interp, id, sizeof(id));
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(mine, 0), "sandboxID")),
                         id);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(json_array_get(mine, 0), "metadata"),
                "coderq_attempt")),
            "2");
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(json_array_get(mine, 0), "metadata"),
                "coderq_worker")),
            "w-lost");
        json_decref(mine);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 0);
}
END_TEST

START_TEST(fleet_keeps_sandboxes_alive_and_kills_strays)
{
        cq_e2b_opts_t opts;
        cq_e2b_fleet_t *fleet;
        cq_interp_t *interp;
        json_t *detail, *stray;
        char err[512], id[64], path[128], end_before[64];
        long set_timeout;

        cq_fake_e2b_opts(&fake, &opts);
        opts.worker_id = "w-fleet";
        fleet = cq_e2b_fleet_new(&opts, err, sizeof(err));
        ck_assert_msg(fleet != NULL, "%s", err);
        opts.fleet = fleet;
        opts.job_id = "job-fleet";
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_e2b_sandbox_id(interp, id, sizeof(id));

        /* not due yet: nothing sent; forced (or due): extended */
        set_timeout = cq_fake_e2b_stat(&fake, "set_timeout");
        ck_assert_int_eq(cq_e2b_fleet_keepalive(fleet, false), 0);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "set_timeout"), set_timeout);
        snprintf(path, sizeof(path), "/sandboxes/%s", id);
        detail = cq_fake_e2b_get(&fake, path);
        snprintf(end_before, sizeof(end_before), "%s",
                 json_string_value(json_object_get(detail, "endAt")));
        json_decref(detail);
        ck_assert_int_eq(cq_e2b_fleet_keepalive(fleet, true), 1);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "set_timeout"),
                         set_timeout + 1);
        detail = cq_fake_e2b_get(&fake, path);
        ck_assert_str_gt(json_string_value(json_object_get(detail, "endAt")),
                         end_before);
        json_decref(detail);

        /* a stray of this worker (say, a lost create's sandbox that came
         * up after the create gave up) and one of another worker */
        ck_assert_int_eq(
            cq_fake_e2b_post(&fake, "/v2/sandboxes",
                             "{\"templateID\": \"base\", \"timeout\": 60, "
                             "\"metadata\": {\"coderq_worker\": "
                             "\"w-fleet\"}}"),
            201);
        ck_assert_int_eq(
            cq_fake_e2b_post(&fake, "/v2/sandboxes",
                             "{\"templateID\": \"base\", \"timeout\": 60, "
                             "\"metadata\": {\"coderq_worker\": "
                             "\"w-other\"}}"),
            201);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 3);
        ck_assert_int_eq(cq_e2b_fleet_reconcile(fleet, err, sizeof(err)), 1);
        stray = tagged("coderq_worker", "w-fleet");
        ck_assert_uint_eq(json_array_size(stray), 1);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(stray, 0), "sandboxID")),
                         id);
        json_decref(stray);
        stray = tagged("coderq_worker", "w-other");
        ck_assert_uint_eq(json_array_size(stray), 1);
        snprintf(path, sizeof(path), "/_fake/kill/%s",
                 json_string_value(
                     json_object_get(json_array_get(stray, 0), "sandboxID")));
        json_decref(stray);
        ck_assert_int_eq(cq_fake_e2b_post(&fake, path, NULL), 204);
        cq_interp_destroy(&interp);
        /* a member gone: keepalive has nothing to do */
        ck_assert_int_eq(cq_e2b_fleet_keepalive(fleet, true), 0);
        cq_e2b_fleet_destroy(&fleet);
        ck_assert(fleet == NULL);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 0);
}
END_TEST

START_TEST(timeout_bound_of_the_plan)
{
        cq_e2b_opts_t opts;
        cq_interp_t *interp;
        json_t *detail;
        char err[512], id[64], path[128];
        long set_timeout;

        cq_fake_e2b_opts(&fake, &opts);
        /* the double's plan allows one hour, like Hobby */
        opts.ttl_s = 7200;
        opts.max_timeout_s = 86400;
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert(interp == NULL);
        ck_assert_msg(strstr(err, "Timeout cannot be greater than 1 hours"),
                      "%s", err);
        opts.max_timeout_s = 3600;
        interp = cq_e2b_new(&opts, err, sizeof(err));
        ck_assert_msg(interp != NULL, "%s", err);
        cq_e2b_sandbox_id(interp, id, sizeof(id));
        set_timeout = cq_fake_e2b_stat(&fake, "set_timeout");
        ck_assert_int_eq(cq_e2b_keepalive(interp, err, sizeof(err)), CQ_OK);
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "set_timeout"),
                         set_timeout + 1);
        snprintf(path, sizeof(path), "/sandboxes/%s", id);
        detail = cq_fake_e2b_get(&fake, path);
        ck_assert(detail != NULL);
        json_decref(detail);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(double_behaves_like_e2b)
{
        json_t *list;

        /* an unknown template and a timeout above the plan's bound */
        ck_assert_int_eq(cq_fake_e2b_post(&fake, "/v2/sandboxes",
                                          "{\"templateID\": \"no-such\"}"),
                         404);
        ck_assert_int_eq(
            cq_fake_e2b_post(&fake, "/v2/sandboxes",
                             "{\"templateID\": \"base\", \"timeout\": 3601}"),
            400);
        /* metadata reaches the list and filters it */
        ck_assert_int_eq(
            cq_fake_e2b_post(&fake, "/v2/sandboxes",
                             "{\"templateID\": \"base\", \"timeout\": 30, "
                             "\"metadata\": {\"k\": \"v1\"}, "
                             "\"envVars\": {\"CQ_ENV\": \"set\"}}"),
            201);
        list = tagged("k", "v1");
        ck_assert_uint_eq(json_array_size(list), 1);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(json_array_get(list, 0), "metadata"), "k")),
            "v1");
        {
                char path[128];

                snprintf(path, sizeof(path), "/_fake/kill/%s",
                         json_string_value(json_object_get(
                             json_array_get(list, 0), "sandboxID")));
                ck_assert_int_eq(cq_fake_e2b_post(&fake, path, NULL), 204);
        }
        json_decref(list);
        list = tagged("k", "v2");
        ck_assert_uint_eq(json_array_size(list), 0);
        json_decref(list);
}
END_TEST

START_TEST(sandbox_paths_are_e2b_s)
{
        cq_interp_t *interp;
        cq_cell_result_t res;
        json_t *stats = cq_fake_e2b_get(&fake, "/_fake/stats");
        bool jailed = json_is_true(json_object_get(stats, "jailed"));

        json_decref(stats);
        if (!jailed)
                CQ_CHECK_SKIP("bwrap", "bubblewrap cannot run here, so the "
                                       "double's kernels see host paths");
        interp = new_interp();
        run(interp,
            "import os\nopen('/tmp/t.txt', 'w').write('tmp')\n"
            "print(os.getcwd(), os.environ['HOME'], "
            "os.path.expanduser('~'), open('/tmp/t.txt').read())",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_str_eq(stream_text(&res, "stdout"),
                         "/home/user /home/user /home/user tmp\n");
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
}
END_TEST

/* The job's code cannot forge repro.packages: NAME-VERSION.dist-info
 * dirs its cell makes in its working dir and in the home dir (the default
 * context's sys.path[0]) are not reported as installed versions. */
START_TEST(env_ignores_metadata_the_job_made)
{
        cq_interp_t *interp = new_interp();
        cq_cell_result_t res;
        const json_t *env;
        const char *numpy, *pandas;

        run(interp,
            "import os\n"
            "for d in (os.getcwd(), os.path.expanduser('~')):\n"
            "    for n in ('numpy-6.6.6.dist-info', "
            "'pandas-9.9.9.dist-info'):\n"
            "        os.makedirs(os.path.join(d, n), exist_ok=True)\n",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        cq_cell_result_release(&res);
        env = cq_interp_env(interp);
        ck_assert_ptr_nonnull(env);
        numpy = json_string_value(
            json_object_get(json_object_get(env, "packages"), "numpy"));
        pandas = json_string_value(
            json_object_get(json_object_get(env, "packages"), "pandas"));
        ck_assert_msg(!numpy || strcmp(numpy, "6.6.6") != 0, "numpy %s", numpy);
        ck_assert_msg(!pandas || strcmp(pandas, "9.9.9") != 0, "pandas %s",
                      pandas);
        cq_interp_destroy(&interp);
}
END_TEST

START_TEST(no_sandbox_is_left_behind)
{
        ck_assert_int_eq(cq_fake_e2b_stat(&fake, "live"), 0);
        ck_assert_int_gt(cq_fake_e2b_stat(&fake, "killed"), 0);
}
END_TEST

static Suite *e2b_suite(void)
{
        Suite *s = suite_create("e2b");
        TCase *parser = tcase_create("parser");
        TCase *tc = tcase_create("backend");
        TCase *dbl = tcase_create("double");

        tcase_add_test(parser, parse_lines_of_every_type);
        tcase_add_test(parser, parse_keeps_nul_bytes);
        tcase_add_test(parser, parse_rejects_malformed_lines);
        tcase_add_test(parser, parse_survives_random_and_truncated_input);
        tcase_add_test(parser, parse_huge_values);
        tcase_add_test(parser, data_plane_urls_and_config);
        suite_add_tcase(s, parser);

        tcase_add_unchecked_fixture(tc, fake_up, fake_down);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, cells_stdout_stderr_error_and_png);
        tcase_add_test(tc, files_up_and_created_files_down);
        tcase_add_test(tc, output_cap_keeps_head_and_tail);
        tcase_add_test(tc, created_files_reports_changed_template_files);
        tcase_add_test(tc, expired_sandbox_is_replaced);
        tcase_add_test(tc, long_cell_outlives_the_ttl);
        tcase_add_test(tc, faults_in_the_stream_recover);
        tcase_add_test(tc, timeouts_and_cancel);
        tcase_add_test(tc, create_retries_429_then_succeeds);
        tcase_add_test(tc, create_401_fails_at_once_without_the_key);
        tcase_add_test(tc, create_retries_only_what_may_help);
        tcase_add_test(tc, lost_create_reply_leaves_no_second_sandbox);
        tcase_add_test(tc, fleet_keeps_sandboxes_alive_and_kills_strays);
        tcase_add_test(tc, timeout_bound_of_the_plan);
        tcase_add_test(tc, double_behaves_like_e2b);
        tcase_add_test(tc, env_ignores_metadata_the_job_made);
        tcase_add_test(tc, no_sandbox_is_left_behind);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(dbl, fake_up, fake_down);
        tcase_set_timeout(dbl, 120);
        tcase_add_test(dbl, sandbox_paths_are_e2b_s);
        suite_add_tcase(s, dbl);
        return s;
}

CQ_CHECK_MAIN(e2b_suite)
