/* SPDX-License-Identifier: MIT */
/* check_notebook.c - the notebook builder: golden notebooks under
 * tests/data/notebook/<case>/{input.json,expected.ipynb}, round trips, and
 * nbformat's own validator (Debian's python3-nbformat) run on what we
 * write, with a negative control proving that check can fail. Set
 * CQ_GOLDEN_UPDATE=1 to rewrite the expected files (then review the diff).
 *
 * input.json: {"language_info": {...}?, "meta": {key: value}?, "cells": [
 *   {"heading": "title"} | {"markdown": "text"} |
 *   {"code": "src", "result": null | {"status": "ok"|..., "execution_count":
 *    N, "outputs": [...], "timing": {...}?, "truncated": bool?,
 *    "state_lost": bool?}}]} */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/agent/notebook.h"

static cq_cell_status_t status_from_name(const char *name)
{
        static const cq_cell_status_t all[] = {CQ_CELL_OK, CQ_CELL_ERROR,
                                               CQ_CELL_TIMEOUT, CQ_CELL_DIED,
                                               CQ_CELL_CANCELLED};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(all); i++)
                if (strcmp(cq_cell_status_name(all[i]), name) == 0)
                        return all[i];
        ck_abort_msg("unknown status %s", name);
        return CQ_CELL_OK;
}

/* Build the notebook an input.json describes. */
static cq_nb_t *build(const json_t *input)
{
        const json_t *cells = json_object_get(input, "cells");
        const json_t *meta = json_object_get(input, "meta");
        cq_nb_t *nb = cq_nb_new(json_object_get(input, "language_info"));
        const char *key;
        json_t *value;
        size_t i;

        ck_assert_ptr_nonnull(nb);
        json_object_foreach((json_t *)(uintptr_t)meta, key, value)
            ck_assert_int_eq(cq_nb_set_meta(nb, key, json_deep_copy(value)), 0);
        for (i = 0; i < json_array_size(cells); i++) {
                const json_t *cell = json_array_get(cells, i);
                const json_t *result = json_object_get(cell, "result");

                if (json_object_get(cell, "heading")) {
                        ck_assert_int_eq(
                            cq_nb_add_heading(
                                nb, json_string_value(
                                        json_object_get(cell, "heading"))),
                            0);
                } else if (json_object_get(cell, "markdown")) {
                        const json_t *md = json_object_get(cell, "markdown");
                        char *text = malloc(json_string_length(md) + 1);

                        /* Up to a NUL, as a C caller would pass it. */
                        ck_assert_ptr_nonnull(text);
                        memcpy(text, json_string_value(md),
                               json_string_length(md) + 1);
                        ck_assert_int_eq(cq_nb_add_markdown(nb, text), 0);
                        free(text);
                } else if (json_is_object(result)) {
                        cq_cell_result_t res;

                        cq_cell_result_init(&res);
                        res.status = status_from_name(json_string_value(
                            json_object_get(result, "status")));
                        res.execution_count = (int)json_integer_value(
                            json_object_get(result, "execution_count"));
                        res.outputs =
                            json_deep_copy(json_object_get(result, "outputs"));
                        res.timing =
                            json_deep_copy(json_object_get(result, "timing"));
                        res.truncated =
                            json_is_true(json_object_get(result, "truncated"));
                        res.state_lost =
                            json_is_true(json_object_get(result, "state_lost"));
                        ck_assert_int_eq(
                            cq_nb_add_code(nb,
                                           json_string_value(
                                               json_object_get(cell, "code")),
                                           &res),
                            0);
                        cq_cell_result_release(&res);
                } else {
                        ck_assert_int_eq(
                            cq_nb_add_code(nb,
                                           json_string_value(
                                               json_object_get(cell, "code")),
                                           NULL),
                            0);
                }
        }
        ck_assert_uint_eq(cq_nb_ncells(nb), json_array_size(cells));
        return nb;
}

/* Every cell id matches nbformat's pattern and is unique. */
static void assert_ids(const json_t *doc)
{
        const json_t *cells = json_object_get(doc, "cells");
        size_t i, j;

        for (i = 0; i < json_array_size(cells); i++) {
                const char *id = json_string_value(
                    json_object_get(json_array_get(cells, i), "id"));

                ck_assert_ptr_nonnull(id);
                ck_assert_uint_ge(strlen(id), 1);
                ck_assert_uint_le(strlen(id), 64);
                ck_assert_uint_eq(strspn(id, "abcdefghijklmnopqrstuvwxyz"
                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                             "0123456789-_"),
                                  strlen(id));
                for (j = 0; j < i; j++)
                        ck_assert_str_ne(id,
                                         json_string_value(json_object_get(
                                             json_array_get(cells, j), "id")));
        }
}

/* dumps -> parse -> from_json -> dumps gives the same bytes. */
static void assert_round_trip(const char *text, size_t len)
{
        json_error_t jerr;
        json_t *doc = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
        char errstr[256] = "";
        cq_nb_t *nb;
        char *again;
        size_t again_len;

        ck_assert_msg(doc != NULL, "%s", jerr.text);
        nb = cq_nb_from_json(doc, errstr, sizeof(errstr));
        ck_assert_msg(nb != NULL, "from_json: %s", errstr);
        again = cq_nb_dumps(nb, &again_len);
        ck_assert_ptr_nonnull(again);
        ck_assert_uint_eq(again_len, len);
        ck_assert_mem_eq(again, text, len);
        free(again);
        cq_nb_destroy(&nb);
        ck_assert_ptr_null(nb);
        json_decref(doc);
}

static int name_cmp(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t list_cases(const char *dirpath, char **names, size_t max)
{
        DIR *dir = opendir(dirpath);
        struct dirent *de;
        size_t n = 0;

        ck_assert_msg(dir != NULL, "cannot open %s", dirpath);
        while ((de = readdir(dir)) != NULL) {
                if (de->d_name[0] == '.')
                        continue;
                ck_assert_uint_lt(n, max);
                names[n] = strdup(de->d_name);
                ck_assert_ptr_nonnull(names[n]);
                n++;
        }
        closedir(dir);
        qsort(names, n, sizeof(names[0]), name_cmp);
        return n;
}

START_TEST(nb_golden_cases)
{
        char dirpath[4096];
        char *names[128];
        size_t n, i, failed = 0;
        bool update = getenv("CQ_GOLDEN_UPDATE") != NULL;

        snprintf(dirpath, sizeof(dirpath), "%s",
                 cq_check_srcpath("tests/data/notebook"));
        n = list_cases(dirpath, names, CQ_ARRAY_SIZE(names));
        ck_assert_uint_ge(n, 7);
        for (i = 0; i < n; i++) {
                char path[4600];
                json_error_t jerr;
                json_t *input;
                cq_nb_t *nb;
                char *got, *expected;
                size_t got_len, expected_len;

                snprintf(path, sizeof(path), "%s/%s/input.json", dirpath,
                         names[i]);
                input = json_load_file(path, JSON_ALLOW_NUL, &jerr);
                ck_assert_msg(input != NULL, "%s: %s", path, jerr.text);
                nb = build(input);
                assert_ids(cq_nb_json(nb));
                got = cq_nb_dumps(nb, &got_len);
                ck_assert_ptr_nonnull(got);
                ck_assert_int_eq(got[got_len - 1], '\n');
                snprintf(path, sizeof(path), "%s/%s/expected.ipynb", dirpath,
                         names[i]);
                if (update) {
                        cq_check_spit(path, got, got_len);
                } else {
                        expected = cq_check_slurp(path, &expected_len);
                        if (expected_len != got_len ||
                            memcmp(expected, got, got_len) != 0) {
                                fprintf(stderr,
                                        "notebook case %s differs:\n%s\n",
                                        names[i], got);
                                failed++;
                        }
                        free(expected);
                }
                assert_round_trip(got, got_len);
                free(got);
                cq_nb_destroy(&nb);
                json_decref(input);
                free(names[i]);
        }
        ck_assert_uint_eq(failed, 0);
}
END_TEST

/* Run python3 -c code path and return its exit status (-1 when it did not
 * exit normally). No shell is involved. */
static int run_python(const char *code, const char *path, bool quiet)
{
        pid_t pid = fork();
        int status;

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* Negative controls: the validator's report is expected. */
                if (quiet && !freopen("/dev/null", "w", stderr))
                        _exit(126);
                execl("/usr/bin/python3", "python3", "-c", code, path,
                      (char *)NULL);
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
                ck_assert_int_eq(errno, EINTR);
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define VALIDATE                                                               \
        "import nbformat,sys; "                                                \
        "nbformat.validate(nbformat.read(sys.argv[1], as_version=4))"

/* Also: nbformat's own writer gives the same bytes as ours. */
#define VALIDATE_AND_REWRITE                                                   \
        "import nbformat,sys\n"                                                \
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"                      \
        "nbformat.validate(nb)\n"                                              \
        "mine = open(sys.argv[1], encoding='utf-8').read()\n"                  \
        "theirs = nbformat.writes(nb) + '\\n'\n"                               \
        "sys.exit(0 if mine == theirs else 3)\n"

static char tmpdir[64];

static void make_tmpdir(void)
{
        snprintf(tmpdir, sizeof(tmpdir), "/tmp/cq-nb-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
        DIR *dir = opendir(tmpdir);
        struct dirent *de;
        char path[512];

        ck_assert_ptr_nonnull(dir);
        while ((de = readdir(dir)) != NULL) {
                if (de->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "%s/%s", tmpdir, de->d_name);
                unlink(path);
        }
        closedir(dir);
        ck_assert_int_eq(rmdir(tmpdir), 0);
}

START_TEST(nb_nbformat_validates_golden_notebooks)
{
        char dirpath[4096];
        char *names[128];
        size_t n, i;

        snprintf(dirpath, sizeof(dirpath), "%s",
                 cq_check_srcpath("tests/data/notebook"));
        n = list_cases(dirpath, names, CQ_ARRAY_SIZE(names));
        for (i = 0; i < n; i++) {
                char path[4600];

                snprintf(path, sizeof(path), "%s/%s/expected.ipynb", dirpath,
                         names[i]);
                ck_assert_msg(run_python(VALIDATE_AND_REWRITE, path, false) ==
                                  0,
                              "nbformat rejects or rewrites %s", path);
                free(names[i]);
        }
}
END_TEST

/* A notebook with every kind of output, built through the API, written to
 * a file and validated by nbformat. */
START_TEST(nb_nbformat_validates_written_file)
{
        static const char png[] = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAf"
                                  "FcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAA"
                                  "AABJRU5ErkJggg==\n";
        cq_nb_t *nb = cq_nb_new(NULL);
        cq_cell_result_t res;
        char path[256], errstr[256] = "";
        char *text, *written;
        size_t len, wlen;

        ck_assert_ptr_nonnull(nb);
        make_tmpdir();
        ck_assert_int_eq(cq_nb_add_heading(nb, "Everything"), 0);
        cq_cell_result_init(&res);
        res.status = CQ_CELL_ERROR;
        res.execution_count = 3;
        res.outputs = json_pack(
            "[{s:s, s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:{s:s, s:s}, s:{}},"
            " {s:s, s:{s:s}, s:{}, s:{s:s}}, {s:s, s:{s:{s:[i,i]}}, s:{}},"
            " {s:s, s:{s:s}, s:{}}, {s:s, s:{s:s}, s:{}, s:i},"
            " {s:s, s:s, s:s, s:[s, s]}]",
            "output_type", "stream", "name", "stdout", "text", "out 价\n",
            "output_type", "stream", "name", "stderr", "text", "warn\n",
            "output_type", "display_data", "data", "image/png", png,
            "text/plain", "<Figure>", "metadata", "output_type", "display_data",
            "data", "text/html", "<b>x</b>\n<i>y</i>", "metadata", "transient",
            "display_id", "d1", "output_type", "display_data", "data",
            "application/json", "a", 1, 2, "metadata", "output_type",
            "display_data", "data", "image/svg+xml", "<svg>\n</svg>\n",
            "metadata", "output_type", "execute_result", "data", "text/plain",
            "'\\x00'", "metadata", "execution_count", 3, "output_type", "error",
            "ename", "ValueError", "evalue", "bad", "traceback",
            "Traceback:", "ValueError: bad");
        ck_assert_ptr_nonnull(res.outputs);
        /* A NUL inside stream text. */
        ck_assert_int_eq(
            json_array_append_new(res.outputs,
                                  json_pack("{s:s, s:s, s:s#}", "output_type",
                                            "stream", "name", "stdout", "text",
                                            "a\0b\n", (size_t)4)),
            0);
        ck_assert_int_eq(
            cq_nb_add_code(nb, "print('out')\nraise ValueError", &res), 0);
        cq_cell_result_release(&res);
        ck_assert_int_eq(cq_nb_add_code(nb, "not_run()", NULL), 0);
        /* Invalid UTF-8 in code is repaired, not fatal. */
        ck_assert_int_eq(cq_nb_add_code(nb, "x = '\xff\xfe'\n", NULL), 0);
        ck_assert_int_eq(cq_nb_set_meta(nb, "job_id", json_string("j1")), 0);
        ck_assert_int_eq(cq_nb_set_meta(nb, "bad", NULL), -1);

        snprintf(path, sizeof(path), "%s/out.ipynb", tmpdir);
        ck_assert_msg(cq_nb_write_file(nb, path, errstr, sizeof(errstr)) == 0,
                      "%s", errstr);
        text = cq_nb_dumps(nb, &len);
        written = cq_check_slurp(path, &wlen);
        ck_assert_uint_eq(wlen, len);
        ck_assert_mem_eq(written, text, len);
        ck_assert_ptr_nonnull(strstr(written, "\"a\\u0000b\\n\""));
        ck_assert_ptr_nonnull(strstr(written, "out 价\\n"));
        ck_assert_ptr_nonnull(
            strstr(written, "x = '\xef\xbf\xbd\xef\xbf\xbd'"));
        ck_assert_ptr_null(strstr(written, "transient"));
        ck_assert_ptr_nonnull(strstr(written, "AABJRU5ErkJggg==\\n\""));
        assert_round_trip(text, len);
        free(written);
        free(text);
        ck_assert_int_eq(run_python(VALIDATE, path, false), 0);
        ck_assert_int_eq(run_python(VALIDATE_AND_REWRITE, path, false), 0);
        cq_nb_destroy(&nb);
        remove_tmpdir();
}
END_TEST

/* The validator check can fail: documents nbformat must reject. */
START_TEST(nb_nbformat_rejects_broken_documents)
{
        static const char *const broken[] = {
            /* a markdown cell with outputs (no extra properties allowed) */
            "{\"cells\":[{\"cell_type\":\"markdown\",\"id\":\"a\","
            "\"metadata\":{},\"outputs\":[],\"source\":[]}],\"metadata\":{},"
            "\"nbformat\":4,\"nbformat_minor\":5}\n",
            /* a stream output without its name */
            "{\"cells\":[{\"cell_type\":\"code\",\"execution_count\":1,"
            "\"id\":\"a\",\"metadata\":{},\"outputs\":[{\"output_type\":"
            "\"stream\",\"text\":\"x\"}],\"source\":[]}],\"metadata\":{},"
            "\"nbformat\":4,\"nbformat_minor\":5}\n",
            /* an output keeping "transient" (no extra properties allowed) */
            "{\"cells\":[{\"cell_type\":\"code\",\"execution_count\":1,"
            "\"id\":\"a\",\"metadata\":{},\"outputs\":[{\"output_type\":"
            "\"display_data\",\"data\":{},\"metadata\":{},\"transient\":{}}],"
            "\"source\":[]}],\"metadata\":{},\"nbformat\":4,"
            "\"nbformat_minor\":5}\n",
            /* a negative execution count */
            "{\"cells\":[{\"cell_type\":\"code\",\"execution_count\":-1,"
            "\"id\":\"a\",\"metadata\":{},\"outputs\":[],\"source\":[]}],"
            "\"metadata\":{},\"nbformat\":4,\"nbformat_minor\":5}\n",
        };
        char path[256];
        size_t i;

        make_tmpdir();
        snprintf(path, sizeof(path), "%s/broken.ipynb", tmpdir);
        for (i = 0; i < CQ_ARRAY_SIZE(broken); i++) {
                cq_check_spit(path, broken[i], strlen(broken[i]));
                ck_assert_msg(run_python(VALIDATE, path, true) != 0,
                              "nbformat accepted broken document %zu", i);
        }
        remove_tmpdir();
}
END_TEST

START_TEST(nb_from_json_rejects_and_upgrades)
{
        static const struct {
                const char *doc, *error;
        } bad[] = {
            {"[]", "notebook must be a JSON object"},
            {"{\"nbformat\":3,\"nbformat_minor\":0,\"metadata\":{},"
             "\"cells\":[]}",
             "not an nbformat 4 notebook (nbformat 4, nbformat_minor 0 to 5 "
             "expected)"},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{}}",
             "notebook needs a \"metadata\" object and a \"cells\" array"},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{},"
             "\"cells\":[{\"cell_type\":\"markdown\",\"metadata\":{},"
             "\"source\":\"x\"}]}",
             "cell 0 has no valid \"id\" (required in nbformat 4.5)"},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{},"
             "\"cells\":[{\"id\":\"a b\",\"cell_type\":\"markdown\","
             "\"metadata\":{},\"source\":\"x\"}]}",
             "cell 0 has no valid \"id\" (required in nbformat 4.5)"},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{},"
             "\"cells\":[{\"id\":\"a\",\"cell_type\":\"markdown\","
             "\"metadata\":{},\"source\":\"x\"},{\"id\":\"a\","
             "\"cell_type\":\"raw\",\"metadata\":{},\"source\":[]}]}",
             "cell 1 repeats the id \"a\""},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{},"
             "\"cells\":[{\"id\":\"a\",\"cell_type\":\"code\","
             "\"metadata\":{},\"source\":\"x\",\"outputs\":[]}]}",
             "code cell 0 needs an \"outputs\" array and an "
             "\"execution_count\" that is null or >= 0"},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{},"
             "\"cells\":[{\"id\":\"a\",\"cell_type\":\"heading\","
             "\"metadata\":{},\"source\":\"x\"}]}",
             "cell 0 is not a code, markdown or raw cell"},
            {"{\"nbformat\":4,\"nbformat_minor\":5,\"metadata\":{},"
             "\"cells\":[{\"id\":\"a\",\"cell_type\":\"raw\","
             "\"metadata\":{},\"source\":[1]}]}",
             "cell 0 needs a text \"source\" and a \"metadata\" object"},
        };
        const char *v44 =
            "{\"nbformat\":4,\"nbformat_minor\":4,\"metadata\":{},\"cells\":["
            "{\"cell_type\":\"code\",\"metadata\":{},\"source\":\"a\\nb\","
            "\"execution_count\":1,\"outputs\":[{\"output_type\":\"stream\","
            "\"name\":\"stdout\",\"text\":\"1\\n2\\n\"},{\"output_type\":"
            "\"display_data\",\"metadata\":{},\"data\":{\"text/plain\":"
            "\"p\\nq\",\"image/png\":\"AAAA\\n\"}}]},"
            "{\"cell_type\":\"code\",\"metadata\":{},\"source\":\"a\\nb\","
            "\"execution_count\":null,\"outputs\":[]}]}";
        char errstr[256];
        size_t i;
        json_t *doc;
        cq_nb_t *nb;
        char *text;
        size_t len;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                doc = json_loads(bad[i].doc, JSON_DECODE_ANY, NULL);
                ck_assert_ptr_nonnull(doc);
                errstr[0] = '\0';
                nb = cq_nb_from_json(doc, errstr, sizeof(errstr));
                ck_assert_ptr_null(nb);
                ck_assert_str_eq(errstr, bad[i].error);
                json_decref(doc);
        }

        /* 4.4 gets ids (distinct even for identical cells), minor 5 and the
         * stored line-list shapes; the result validates and continues. */
        doc = json_loads(v44, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        nb = cq_nb_from_json(doc, errstr, sizeof(errstr));
        ck_assert_msg(nb != NULL, "%s", errstr);
        json_decref(doc);
        ck_assert_int_eq(json_integer_value(
                             json_object_get(cq_nb_json(nb), "nbformat_minor")),
                         5);
        ck_assert_ptr_nonnull(json_object_get(
            json_object_get(cq_nb_json(nb), "metadata"), "kernelspec"));
        ck_assert_int_eq(cq_nb_add_heading(nb, "more"), 0);
        ck_assert_uint_eq(cq_nb_ncells(nb), 3);
        assert_ids(cq_nb_json(nb));
        text = cq_nb_dumps(nb, &len);
        ck_assert_ptr_nonnull(text);
        ck_assert_ptr_nonnull(strstr(text, "\"source\": [\n    \"a\\n\",\n"
                                           "    \"b\"\n   ]"));
        ck_assert_ptr_nonnull(strstr(text, "\"image/png\": \"AAAA\\n\""));
        ck_assert_ptr_nonnull(strstr(text, "\"text\": [\n      \"1\\n\",\n"));
        assert_round_trip(text, len);
        make_tmpdir();
        {
                char path[256];

                snprintf(path, sizeof(path), "%s/up.ipynb", tmpdir);
                cq_check_spit(path, text, len);
                ck_assert_int_eq(run_python(VALIDATE_AND_REWRITE, path, false),
                                 0);
        }
        remove_tmpdir();
        free(text);
        cq_nb_destroy(&nb);
}
END_TEST

START_TEST(nb_ids_are_deterministic_and_unique)
{
        cq_nb_t *a = cq_nb_new(NULL), *b = cq_nb_new(NULL);
        char *ta, *tb;
        int i;

        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(b);
        for (i = 0; i < 300; i++) {
                /* Identical cells: ids must still differ. */
                ck_assert_int_eq(cq_nb_add_code(a, "x", NULL), 0);
                ck_assert_int_eq(cq_nb_add_code(b, "x", NULL), 0);
        }
        assert_ids(cq_nb_json(a));
        ta = cq_nb_dumps(a, NULL);
        tb = cq_nb_dumps(b, NULL);
        ck_assert_str_eq(ta, tb);
        free(ta);
        free(tb);
        cq_nb_destroy(&a);
        cq_nb_destroy(&b);
        cq_nb_destroy(&b); /* accepts NULL */
}
END_TEST

START_TEST(nb_write_file_is_atomic_and_reports_errors)
{
        cq_nb_t *nb = cq_nb_new(NULL);
        char path[256], errstr[256] = "";
        DIR *dir;
        struct dirent *de;
        int entries = 0;
        struct stat st;

        ck_assert_ptr_nonnull(nb);
        make_tmpdir();
        snprintf(path, sizeof(path), "%s/nb.ipynb", tmpdir);
        cq_check_spit(path, "old", 3);
        ck_assert_int_eq(cq_nb_add_markdown(nb, "new"), 0);
        ck_assert_int_eq(cq_nb_write_file(nb, path, errstr, sizeof(errstr)), 0);
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_int_eq(st.st_mode & 0777, 0644);
        dir = opendir(tmpdir);
        ck_assert_ptr_nonnull(dir);
        while ((de = readdir(dir)) != NULL)
                if (de->d_name[0] != '.')
                        entries++;
        closedir(dir);
        ck_assert_int_eq(entries, 1); /* no temporary file left behind */

        snprintf(path, sizeof(path), "%s/missing/nb.ipynb", tmpdir);
        ck_assert_int_eq(cq_nb_write_file(nb, path, errstr, sizeof(errstr)),
                         -1);
        ck_assert_ptr_nonnull(strstr(errstr, "could not create temporary "
                                             "file for"));
        ck_assert_ptr_nonnull(strstr(errstr, "No such file or directory"));
        remove_tmpdir();
        cq_nb_destroy(&nb);
}
END_TEST

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dULL;
}

/* Mutated notebooks (byte edits that still parse as JSON, and values of
 * the wrong type at every path) never crash cq_nb_from_json; whatever it
 * accepts can be continued and round-trips. */
START_TEST(nb_from_json_fuzz)
{
        static const char *const wrong[] = {"null", "1",  "-1",  "\"x\"",
                                            "[]",   "{}", "[1]", "true"};
        size_t len, round, accepted = 0, rejected = 0;
        char *base = cq_check_slurp(
            cq_check_srcpath("tests/data/notebook/rich/expected.ipynb"), &len);
        char *work = malloc(len);

        ck_assert_ptr_nonnull(work);
        for (round = 0; round < 4000; round++) {
                size_t k, edits = 1 + rng() % 3;
                json_t *doc;
                cq_nb_t *nb;
                char errstr[256] = "";

                memcpy(work, base, len);
                for (k = 0; k < edits; k++)
                        work[rng() % len] =
                            "0123456789[]{}\",:nulltrue-a"[rng() % 28];
                doc = json_loadb(work, len, JSON_ALLOW_NUL, NULL);
                if (!doc)
                        continue;
                nb = cq_nb_from_json(doc, errstr, sizeof(errstr));
                if (nb) {
                        char *text;
                        size_t tlen;

                        ck_assert_int_eq(cq_nb_add_heading(nb, "more"), 0);
                        assert_ids(cq_nb_json(nb));
                        text = cq_nb_dumps(nb, &tlen);
                        ck_assert_ptr_nonnull(text);
                        assert_round_trip(text, tlen);
                        free(text);
                        cq_nb_destroy(&nb);
                        accepted++;
                } else {
                        ck_assert(errstr[0] != '\0');
                        rejected++;
                }
                json_decref(doc);
        }
        /* Structured: replace cells[1], its metadata, outputs[i] and their
         * fields with wrong types. */
        {
                static const char *const paths[][3] = {
                    {"cells", NULL, NULL},
                    {"metadata", NULL, NULL},
                    {"nbformat", NULL, NULL},
                    {"nbformat_minor", NULL, NULL},
                    {"cell_type", NULL, NULL},
                    {"source", NULL, NULL},
                    {"outputs", NULL, NULL},
                    {"id", NULL, NULL},
                    {"execution_count", NULL, NULL}};
                size_t p, w;

                for (p = 0; p < CQ_ARRAY_SIZE(paths); p++) {
                        for (w = 0; w < CQ_ARRAY_SIZE(wrong); w++) {
                                json_t *doc = json_loadb(base, len, 0, NULL);
                                json_t *target = doc;
                                char errstr[256] = "";
                                cq_nb_t *nb;

                                ck_assert_ptr_nonnull(doc);
                                if (p >= 4)
                                        target = json_array_get(
                                            json_object_get(doc, "cells"), 1);
                                json_object_set_new(target, paths[p][0],
                                                    json_loads(wrong[w],
                                                               JSON_DECODE_ANY,
                                                               NULL));
                                nb = cq_nb_from_json(doc, errstr,
                                                     sizeof(errstr));
                                if (nb)
                                        accepted++;
                                else
                                        ck_assert(errstr[0] != '\0');
                                rejected += nb == NULL;
                                cq_nb_destroy(&nb);
                                json_decref(doc);
                        }
                }
        }
        ck_assert_uint_gt(accepted, 10);
        ck_assert_uint_gt(rejected, 100);
        free(work);
        free(base);
}
END_TEST

static Suite *cq_notebook_suite(void)
{
        Suite *s = suite_create("notebook");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, nb_golden_cases);
        tcase_add_test(tc, nb_nbformat_validates_golden_notebooks);
        tcase_add_test(tc, nb_nbformat_validates_written_file);
        tcase_add_test(tc, nb_nbformat_rejects_broken_documents);
        tcase_add_test(tc, nb_from_json_rejects_and_upgrades);
        tcase_add_test(tc, nb_ids_are_deterministic_and_unique);
        tcase_add_test(tc, nb_write_file_is_atomic_and_reports_errors);
        tcase_add_test(tc, nb_from_json_fuzz);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_notebook_suite)
