/* SPDX-License-Identifier: MIT */
/* check_schemas.c - schemas/job.schema.json and the C validator
 * (common/job.c) must not drift apart. Every message of the test corpus
 * (the golden job cases, the fuzz seed corpus, examples/jobs.jsonl, the
 * Python example's session and a table of one-field variations) goes
 * through cq_job_parse() and through the schema with a real validator
 * (python3-jsonschema, tests/schemas/check_schemas.py): whatever the C
 * validator accepts, the schema must accept; whatever it refuses, the
 * schema must refuse too, except for the few rules JSON Schema cannot
 * express, which are listed here by name and must still be refused by C
 * and accepted by the schema (so the list stays exact). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/common/job.h"
#include "coderq/common/util.h"
#include "support/proc.h"

#define PYTHON "/usr/bin/python3"

typedef struct kase {
        char *name;
        char *data;
        size_t len;
        char want; /* table cases: 'o' ok, 'e' refused, 'k' refused by C
                      only (JSON Schema cannot say it); 0: no expectation */
        bool c_ok;
        char c_err[256];
} kase_t;

typedef struct corpus {
        kase_t *v;
        size_t n, cap;
} corpus_t;

static void
add(corpus_t *c, const char *name, const char *data, size_t len, char want)
{
        kase_t *k;

        if (c->n == c->cap) {
                c->cap = c->cap ? c->cap * 2 : 256;
                c->v = realloc(c->v, c->cap * sizeof(*c->v));
                ck_assert_ptr_nonnull(c->v);
        }
        k = &c->v[c->n++];
        memset(k, 0, sizeof(*k));
        k->name = strdup(name);
        k->data = malloc(len + 1);
        ck_assert_ptr_nonnull(k->name);
        ck_assert_ptr_nonnull(k->data);
        memcpy(k->data, data, len);
        k->data[len] = '\0';
        k->len = len;
        k->want = want;
}

static void corpus_free(corpus_t *c)
{
        size_t i;

        for (i = 0; i < c->n; i++) {
                free(c->v[i].name);
                free(c->v[i].data);
        }
        free(c->v);
}

/* 65 characters, one more than a queue's name may have. */
#define Q65 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

/* A minimal valid job with \p members (JSON members, may be empty). */
#define JOB(members) "{\"job_id\":\"j1\",\"prompt\":\"p\"" members "}"

/* One-field variations: what each rule of common/job.c accepts and
 * refuses. */
static const struct {
        const char *name;
        const char *text;
        char want;
} table[] = {
    {"minimal", JOB(""), 'o'},
    {"version_1", JOB(",\"version\":1"), 'o'},
    {"all_optional_null",
     JOB(",\"title\":null,\"task_id\":null,\"run_id\":null,"
         "\"parent_job_id\":null,\"backend\":null,\"model\":null,"
         "\"provider\":null,\"system_prompt\":null,\"files\":null,"
         "\"tests\":null,\"limits\":null,\"memory\":null,\"priority\":null"),
     'o'},
    {"all_fields",
     JOB(",\"version\":1,\"title\":\"t\",\"task_id\":\"a\",\"run_id\":\"r\","
         "\"parent_job_id\":\"j0\",\"backend\":\"e2b\",\"model\":\"m\","
         "\"provider\":\"anthropic\",\"system_prompt\":\"s\","
         "\"files\":[{\"name\":\"d/a.csv\",\"content_b64\":\"YQ==\"},"
         "{\"name\":\"b\",\"url\":\"HTTPS://x.org/b?q=1\"}],"
         "\"tests\":{\"kind\":\"cases\",\"function\":\"_f1\",\"cases\":"
         "[{\"args\":[1,[2]],\"expected\":null}],\"isolation\":\"fresh\"},"
         "\"limits\":{\"max_turns\":1000,\"max_retries\":0,"
         "\"cell_timeout_s\":86400,\"job_timeout_s\":604800,"
         "\"test_timeout_s\":1},"
         "\"memory\":{\"scope\":\"s-1\",\"recall\":false,\"remember\":null,"
         "\"cross_model\":true},\"priority\":-1000"),
     'o'},
    {"tests_code",
     JOB(",\"tests\":{\"kind\":\"code\",\"code\":\"assert 1\","
         "\"isolation\":\"kernel\"}"),
     'o'},
    {"unknown_top_level_refused", JOB(",\"x\":{\"y\":[1,\"z\",null]}"), 'e'},
    {"misspelt_model_refused", JOB(",\"modle\":\"m\""), 'e'},
    {"eval_fields",
     JOB(",\"samples\":1000,\"queue\":\"team-a.1\",\"metadata\":{\"k\":"
         "[1,{\"v\":null}]},\"solution\":\"def f(): pass\","
         "\"tests\":{\"kind\":\"code\",\"code\":\"assert f() is None\","
         "\"judge\":\"separate\",\"mutates\":true,\"reference\":\"x=1\","
         "\"case_timeout_s\":0.5,\"hidden\":{\"kind\":\"cases\","
         "\"function\":\"f\",\"cases\":[{\"args\":[],\"expected\":null}],"
         "\"judge\":\"model\",\"isolation\":\"fresh\"}}"),
     'o'},
    {"hidden_only",
     JOB(",\"tests\":{\"hidden\":{\"kind\":\"code\","
         "\"code\":\"assert 1\"},\"case_timeout_s\":3}"),
     'o'},
    {"sample", JOB(",\"problem_id\":\"p\",\"sample_index\":999"), 'o'},
    {"samples_zero", JOB(",\"samples\":0"), 'e'},
    {"samples_over", JOB(",\"samples\":1001"), 'e'},
    {"sample_index_alone", JOB(",\"sample_index\":0"), 'e'},
    {"problem_id_alone", JOB(",\"problem_id\":\"p\""), 'e'},
    {"sample_fans_out",
     JOB(",\"problem_id\":\"p\",\"sample_index\":0,\"samples\":2"), 'e'},
    {"queue_upper", JOB(",\"queue\":\"A\""), 'e'},
    {"queue_long", JOB(",\"queue\":\"" Q65 "\""), 'e'},
    {"metadata_array", JOB(",\"metadata\":[1]"), 'e'},
    {"solution_empty", JOB(",\"solution\":\"\""), 'e'},
    {"judge_unknown",
     JOB(",\"tests\":{\"kind\":\"code\",\"code\":\"x\","
         "\"judge\":\"kernel\"}"),
     'e'},
    {"cases_mutates",
     JOB(",\"tests\":{\"kind\":\"cases\",\"function\":"
         "\"f\",\"cases\":[{\"args\":[],\"expected\":1}],"
         "\"mutates\":true}"),
     'e'},
    {"hidden_nested",
     JOB(",\"tests\":{\"hidden\":{\"kind\":\"code\",\"code\":\"x\","
         "\"hidden\":null}}"),
     'e'},
    {"hidden_with_reference",
     JOB(",\"tests\":{\"hidden\":{\"kind\":\"code\",\"code\":\"x\","
         "\"reference\":\"y\"}}"),
     'e'},
    {"case_timeout_zero",
     JOB(",\"tests\":{\"kind\":\"code\",\"code\":\"x\","
         "\"case_timeout_s\":0}"),
     'e'},
    {"base64_unpadded_and_spaced",
     JOB(",\"files\":[{\"name\":\"a\",\"content_b64\":\"YW Jj\\nZA\"}]"), 'o'},
    {"base64_empty", JOB(",\"files\":[{\"name\":\"a\",\"content_b64\":\"\"}]"),
     'o'},
    {"name_dotfile",
     JOB(",\"files\":[{\"name\":\".a/..b\",\"url\":"
         "\"http://h\"}]"),
     'o'},
    {"priority_max", JOB(",\"priority\":1000"), 'o'},
    {"version_2", JOB(",\"version\":2"), 'e'},
    {"version_string", JOB(",\"version\":\"1\""), 'e'},
    {"version_null", JOB(",\"version\":null"), 'e'},
    {"job_id_number", "{\"job_id\":5,\"prompt\":\"p\"}", 'e'},
    {"job_id_empty", "{\"job_id\":\"\",\"prompt\":\"p\"}", 'e'},
    {"job_id_space", "{\"job_id\":\"a b\",\"prompt\":\"p\"}", 'e'},
    {"job_id_non_ascii", "{\"job_id\":\"\\u00e9\",\"prompt\":\"p\"}", 'e'},
    {"job_id_missing", "{\"prompt\":\"p\"}", 'e'},
    {"prompt_missing", "{\"job_id\":\"j1\"}", 'e'},
    {"prompt_empty", "{\"job_id\":\"j1\",\"prompt\":\"\"}", 'e'},
    {"prompt_number", "{\"job_id\":\"j1\",\"prompt\":5}", 'e'},
    {"prompt_nul", "{\"job_id\":\"j1\",\"prompt\":\"a\\u0000b\"}", 'e'},
    {"title_empty", JOB(",\"title\":\"\""), 'e'},
    {"title_number", JOB(",\"title\":3"), 'e'},
    {"task_id_tab", JOB(",\"task_id\":\"a\\tb\""), 'e'},
    {"run_id_array", JOB(",\"run_id\":[]"), 'e'},
    {"parent_empty", JOB(",\"parent_job_id\":\"\""), 'e'},
    {"backend_unknown", JOB(",\"backend\":\"docker\""), 'e'},
    {"model_empty", JOB(",\"model\":\"\""), 'e'},
    {"provider_unknown", JOB(",\"provider\":\"gemini\""), 'e'},
    {"system_prompt_bool", JOB(",\"system_prompt\":false"), 'e'},
    {"files_object", JOB(",\"files\":{}"), 'e'},
    {"files_item_number", JOB(",\"files\":[1]"), 'e'},
    {"file_no_source", JOB(",\"files\":[{\"name\":\"a\"}]"), 'e'},
    {"file_no_name", JOB(",\"files\":[{\"url\":\"http://h\"}]"), 'e'},
    {"file_both_sources",
     JOB(",\"files\":[{\"name\":\"a\",\"url\":\"http://h\","
         "\"content_b64\":\"YQ==\"}]"),
     'e'},
    {"file_null_source", JOB(",\"files\":[{\"name\":\"a\",\"url\":null}]"),
     'e'},
    {"file_unknown_key",
     JOB(",\"files\":[{\"name\":\"a\",\"url\":\"http://h\","
         "\"mode\":1}]"),
     'e'},
    {"name_absolute",
     JOB(",\"files\":[{\"name\":\"/a\",\"url\":\"http://h\"}]"), 'e'},
    {"name_dotdot",
     JOB(",\"files\":[{\"name\":\"a/../b\",\"url\":"
         "\"http://h\"}]"),
     'e'},
    {"name_dot", JOB(",\"files\":[{\"name\":\".\",\"url\":\"http://h\"}]"),
     'e'},
    {"name_empty_component",
     JOB(",\"files\":[{\"name\":\"a//b\",\"url\":"
         "\"http://h\"}]"),
     'e'},
    {"name_trailing_slash",
     JOB(",\"files\":[{\"name\":\"a/\",\"url\":"
         "\"http://h\"}]"),
     'e'},
    {"name_backslash",
     JOB(",\"files\":[{\"name\":\"a\\\\b\",\"url\":"
         "\"http://h\"}]"),
     'e'},
    {"name_control",
     JOB(",\"files\":[{\"name\":\"a\\u0001\",\"url\":"
         "\"http://h\"}]"),
     'e'},
    {"name_empty", JOB(",\"files\":[{\"name\":\"\",\"url\":\"http://h\"}]"),
     'e'},
    {"base64_bad_char",
     JOB(",\"files\":[{\"name\":\"a\",\"content_b64\":"
         "\"!!!!\"}]"),
     'e'},
    {"base64_one_left",
     JOB(",\"files\":[{\"name\":\"a\",\"content_b64\":"
         "\"YWJjZ\"}]"),
     'e'},
    {"base64_bad_padding",
     JOB(",\"files\":[{\"name\":\"a\",\"content_b64\":"
         "\"YQ=\"}]"),
     'e'},
    {"base64_data_after_padding",
     JOB(",\"files\":[{\"name\":\"a\","
         "\"content_b64\":\"YQ==YQ==\"}]"),
     'e'},
    {"base64_number", JOB(",\"files\":[{\"name\":\"a\",\"content_b64\":5}]"),
     'e'},
    {"url_scheme", JOB(",\"files\":[{\"name\":\"a\",\"url\":\"ftp://h\"}]"),
     'e'},
    {"url_no_host", JOB(",\"files\":[{\"name\":\"a\",\"url\":\"http://\"}]"),
     'e'},
    {"url_slash_host",
     JOB(",\"files\":[{\"name\":\"a\",\"url\":\"http:///x\"}]"), 'e'},
    {"url_space", JOB(",\"files\":[{\"name\":\"a\",\"url\":\"http://a b\"}]"),
     'e'},
    {"tests_array", JOB(",\"tests\":[]"), 'e'},
    {"tests_kind_unknown", JOB(",\"tests\":{\"kind\":\"x\"}"), 'e'},
    {"tests_function_digit",
     JOB(",\"tests\":{\"kind\":\"cases\",\"function\":"
         "\"1a\",\"cases\":[{\"args\":[],"
         "\"expected\":1}]}"),
     'e'},
    {"tests_cases_empty",
     JOB(",\"tests\":{\"kind\":\"cases\",\"function\":"
         "\"f\",\"cases\":[]}"),
     'e'},
    {"tests_case_number",
     JOB(",\"tests\":{\"kind\":\"cases\",\"function\":"
         "\"f\",\"cases\":[1]}"),
     'e'},
    {"tests_args_object",
     JOB(",\"tests\":{\"kind\":\"cases\",\"function\":"
         "\"f\",\"cases\":[{\"args\":{},"
         "\"expected\":1}]}"),
     'e'},
    {"tests_no_expected",
     JOB(",\"tests\":{\"kind\":\"cases\",\"function\":"
         "\"f\",\"cases\":[{\"args\":[]}]}"),
     'e'},
    {"tests_case_unknown_key",
     JOB(",\"tests\":{\"kind\":\"cases\","
         "\"function\":\"f\",\"cases\":[{\"args\":"
         "[],\"expected\":1,\"x\":1}]}"),
     'e'},
    {"tests_cases_with_code",
     JOB(",\"tests\":{\"kind\":\"cases\","
         "\"function\":\"f\",\"cases\":[{\"args\":"
         "[],\"expected\":1}],\"code\":\"x\"}"),
     'e'},
    {"tests_code_empty", JOB(",\"tests\":{\"kind\":\"code\",\"code\":\"\"}"),
     'e'},
    {"tests_code_unknown_key",
     JOB(",\"tests\":{\"kind\":\"code\",\"code\":"
         "\"x\",\"function\":\"f\"}"),
     'e'},
    {"tests_isolation_unknown",
     JOB(",\"tests\":{\"kind\":\"code\",\"code\":"
         "\"x\",\"isolation\":\"vm\"}"),
     'e'},
    {"limits_array", JOB(",\"limits\":[]"), 'e'},
    {"limits_unknown_key", JOB(",\"limits\":{\"turns\":3}"), 'e'},
    {"max_turns_zero", JOB(",\"limits\":{\"max_turns\":0}"), 'e'},
    {"max_turns_over", JOB(",\"limits\":{\"max_turns\":1001}"), 'e'},
    {"max_turns_string", JOB(",\"limits\":{\"max_turns\":\"5\"}"), 'e'},
    {"max_turns_fraction", JOB(",\"limits\":{\"max_turns\":1.5}"), 'e'},
    {"max_retries_negative", JOB(",\"limits\":{\"max_retries\":-1}"), 'e'},
    {"cell_timeout_over", JOB(",\"limits\":{\"cell_timeout_s\":86401}"), 'e'},
    {"job_timeout_over", JOB(",\"limits\":{\"job_timeout_s\":604801}"), 'e'},
    {"test_timeout_zero", JOB(",\"limits\":{\"test_timeout_s\":0}"), 'e'},
    {"memory_number", JOB(",\"memory\":5"), 'e'},
    {"memory_scope_space", JOB(",\"memory\":{\"scope\":\"a b\"}"), 'e'},
    {"memory_recall_string", JOB(",\"memory\":{\"recall\":\"yes\"}"), 'e'},
    {"memory_unknown_key", JOB(",\"memory\":{\"forget\":true}"), 'e'},
    {"priority_over", JOB(",\"priority\":1001"), 'e'},
    {"priority_fraction", JOB(",\"priority\":1.5"), 'e'},
    {"priority_string", JOB(",\"priority\":\"1\""), 'e'},
    {"unknown_field_nul", JOB(",\"x\":[\"a\\u0000\"]"), 'e'},
    {"key_nul", JOB(",\"x\\u0000\":1"), 'e'},
    {"top_level_array", "[1]", 'e'},
    {"top_level_string", "\"job\"", 'e'},
    {"not_json", "{job", 'e'},
    {"nan", JOB(",\"x\":NaN"), 'e'},
    {"duplicate_key", "{\"job_id\":\"j1\",\"prompt\":\"p\",\"prompt\":\"q\"}",
     'e'},
    {"lone_surrogate", JOB(",\"x\":\"\\ud800\""), 'e'},
    /* What JSON Schema cannot say: refused by coderq alone. */
    {"parent_is_self", JOB(",\"parent_job_id\":\"j1\""), 'k'},
    {"file_duplicate_name",
     JOB(",\"files\":[{\"name\":\"a\",\"url\":\"http://h\"},"
         "{\"name\":\"a\",\"url\":\"http://i\"}]"),
     'k'},
    {"max_turns_integral_fraction", JOB(",\"limits\":{\"max_turns\":5.0}"),
     'k'},
    {"priority_exponent", JOB(",\"priority\":1e2"), 'k'},
};

/* C refusals JSON Schema cannot express, by the C validator's words: the
 * corpus files outside the table are explained by these. */
static bool inexpressible(const char *err)
{
        return strstr(err, "must differ from \"job_id\"") ||
               strstr(err, "repeats") || strstr(err, "over the limit of") ||
               strstr(err, "inline files exceed");
}

/* A case made of \p head, \p count times \p unit, then \p tail. */
static void add_repeat(corpus_t *c,
                       const char *name,
                       const char *head,
                       const char *unit,
                       size_t count,
                       const char *tail,
                       char want)
{
        cq_buf_t buf;
        size_t i;

        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_buf_append_str(&buf, head), CQ_OK);
        for (i = 0; i < count; i++)
                ck_assert_int_eq(cq_buf_append_str(&buf, unit), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&buf, tail), CQ_OK);
        add(c, name, buf.data, buf.len, want);
        cq_buf_release(&buf);
}

#define FILE_NAME_HEAD                                                         \
        "{\"job_id\":\"j1\",\"prompt\":\"p\",\"files\":[{\"name\":\""
#define FILE_NAME_TAIL "\",\"url\":\"http://h\"}]}"

static void add_table(corpus_t *c)
{
        cq_buf_t buf;
        size_t i;
        char name[300];

        for (i = 0; i < CQ_ARRAY_SIZE(table); i++) {
                snprintf(name, sizeof(name), "table/%s", table[i].name);
                add(c, name, table[i].text, strlen(table[i].text),
                    table[i].want);
        }
        /* Lengths at and past each bound. */
        add_repeat(c, "table/job_id_128", "{\"job_id\":\"", "x", 128,
                   "\",\"prompt\":\"p\"}", 'o');
        add_repeat(c, "table/job_id_129", "{\"job_id\":\"", "x", 129,
                   "\",\"prompt\":\"p\"}", 'e');
        add_repeat(c, "table/name_255", FILE_NAME_HEAD, "n", 255,
                   FILE_NAME_TAIL, 'o');
        add_repeat(c, "table/name_256", FILE_NAME_HEAD, "n", 256,
                   FILE_NAME_TAIL, 'e');
        /* 200 characters, 400 bytes: within maxLength, over 255 bytes. */
        add_repeat(c, "table/name_400_bytes", FILE_NAME_HEAD, "\xc3\xa9", 200,
                   FILE_NAME_TAIL, 'k');
        add_repeat(c, "table/url_2048",
                   FILE_NAME_HEAD "a\",\"url\":\"http://h/", "x", 2039, "\"}]}",
                   'o');
        add_repeat(c, "table/url_2049",
                   FILE_NAME_HEAD "a\",\"url\":\"http://h/", "x", 2040, "\"}]}",
                   'e');
        cq_buf_init(&buf, 1 << 20);
        ck_assert_int_eq(cq_buf_append_str(&buf,
                                           "{\"job_id\":\"j1\",\"prompt\":"
                                           "\"p\",\"files\":["),
                         CQ_OK);
        for (i = 0; i < 1001; i++)
                ck_assert_int_eq(cq_buf_printf(&buf,
                                               "%s{\"name\":\"f%zu\",\"url\":"
                                               "\"http://h\"}",
                                               i ? "," : "", i),
                                 CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&buf, "]}"), CQ_OK);
        add(c, "table/files_1001", buf.data, buf.len, 'e');
        cq_buf_release(&buf);
}

/* Every regular file of \p dir (a golden case dir holds input.json). */
static void add_dir(corpus_t *c, const char *rel, bool golden)
{
        char dirpath[4096], path[4600], name[600];
        DIR *dir;
        struct dirent *de;

        snprintf(dirpath, sizeof(dirpath), "%s", cq_check_srcpath(rel));
        dir = opendir(dirpath);
        ck_assert_msg(dir != NULL, "cannot open %s", dirpath);
        while ((de = readdir(dir)) != NULL) {
                char *data;
                size_t len;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "%s/%s%s", dirpath, de->d_name,
                         golden ? "/input.json" : "");
                if (golden && access(path, R_OK) != 0)
                        continue;
                data = cq_check_slurp(path, &len);
                snprintf(name, sizeof(name), "%s/%s", rel, de->d_name);
                add(c, name, data, len, 0);
                free(data);
        }
        closedir(dir);
}

/* Each non-blank line of \p text as a case named PREFIX:N. */
static void add_lines(corpus_t *c, const char *prefix, const char *text)
{
        const char *p = text;
        char name[300];
        int n = 0;

        while (*p) {
                const char *nl = strchr(p, '\n');
                size_t len = nl ? (size_t)(nl - p) : strlen(p);

                n++;
                if (len > 0 && p[len - 1] == '\r')
                        len--;
                if (len > 0) {
                        snprintf(name, sizeof(name), "%s:%d", prefix, n);
                        add(c, name, p, len, 'o');
                }
                p += nl ? (size_t)(nl - p) + 1 : strlen(p);
        }
}

static void add_upstream(corpus_t *c)
{
        const char *argv[] = {
            PYTHON,         cq_check_srcpath("examples/upstream/writer.py"),
            "--print-jobs", "--session",
            "schema-check", "--model",
            "gpt-4o-mini",  NULL};
        cq_check_proc_t proc;

        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 60000, &proc), 0);
        ck_assert_msg(proc.status == 0, "writer.py --print-jobs: %s", proc.err);
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 3);
        add_lines(c, "examples/upstream/writer.py", proc.out);
        cq_check_proc_release(&proc);
}

START_TEST(schema_and_c_validator_agree)
{
        corpus_t c = {0};
        char manifest[] = "/tmp/cq-schemas-XXXXXX", checker[4096];
        const char *argv[] = {PYTHON, checker, "jobs", manifest, NULL};
        cq_check_proc_t proc;
        size_t i, nok = 0, nerr = 0, nknown = 0, failed = 0;
        const char *line;
        char *text;
        FILE *fp;
        int fd;

        /* cq_check_srcpath() answers in a static buffer. */
        snprintf(checker, sizeof(checker), "%s",
                 cq_check_srcpath("tests/schemas/check_schemas.py"));
        add_table(&c);
        add_dir(&c, "tests/data/job", true);
        add_dir(&c, "tests/fuzz/corpus/job", false);
        text = cq_check_slurp(cq_check_srcpath("examples/jobs.jsonl"), NULL);
        add_lines(&c, "examples/jobs.jsonl", text);
        free(text);
        add_upstream(&c);

        fd = mkstemp(manifest);
        ck_assert_int_ge(fd, 0);
        fp = fdopen(fd, "w");
        ck_assert_ptr_nonnull(fp);
        for (i = 0; i < c.n; i++) {
                kase_t *k = &c.v[i];
                cq_job_t job;
                char *b64 = cq_b64_encode(k->data, k->len, NULL);
                json_t *entry;
                char *dump;

                cq_job_init(&job);
                k->c_ok = cq_job_parse(k->data, k->len, 0, &job, k->c_err,
                                       sizeof(k->c_err)) == CQ_OK;
                cq_job_release(&job);
                ck_assert_ptr_nonnull(b64);
                entry = json_pack("{s:s, s:s}", "name", k->name, "b64", b64);
                dump = json_dumps(entry, JSON_COMPACT);
                ck_assert_ptr_nonnull(dump);
                fprintf(fp, "%s\n", dump);
                free(dump);
                json_decref(entry);
                free(b64);
        }
        ck_assert_int_eq(fclose(fp), 0);

        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 120000, &proc), 0);
        unlink(manifest);
        ck_assert_msg(proc.status == 0, "check_schemas.py: %s", proc.err);
        ck_assert_uint_eq(cq_check_count_lines(proc.out), c.n);
        line = proc.out;
        for (i = 0; i < c.n; i++) {
                kase_t *k = &c.v[i];
                const char *tab = strchr(line, '\t');
                const char *nl = strchr(line, '\n');
                bool schema_ok;

                ck_assert_ptr_nonnull(tab);
                ck_assert_ptr_nonnull(nl);
                ck_assert_msg((size_t)(tab - line) == strlen(k->name) &&
                                  strncmp(line, k->name, strlen(k->name)) == 0,
                              "line %zu is not case %s", i, k->name);
                schema_ok = strncmp(tab + 1, "valid\t", 6) == 0;
                /* The table says what coderq does; check that first. */
                if (k->want == 'o' && !k->c_ok) {
                        fprintf(stderr, "%s: the C validator refuses it: %s\n",
                                k->name, k->c_err);
                        failed++;
                } else if ((k->want == 'e' || k->want == 'k') && k->c_ok) {
                        fprintf(stderr, "%s: the C validator accepts it\n",
                                k->name);
                        failed++;
                } else if (k->c_ok && !schema_ok) {
                        fprintf(stderr,
                                "%s: accepted by coderq, refused by "
                                "the schema: %.*s\n",
                                k->name, (int)(nl - tab - 1), tab + 1);
                        failed++;
                } else if (!k->c_ok && schema_ok && k->want != 'k' &&
                           !(k->want == 0 && inexpressible(k->c_err))) {
                        fprintf(stderr,
                                "%s: refused by coderq (%s), accepted "
                                "by the schema\n",
                                k->name, k->c_err);
                        failed++;
                } else if (k->want == 'k' && !schema_ok) {
                        fprintf(stderr,
                                "%s: listed as inexpressible, but the "
                                "schema refuses it: update the "
                                "list\n",
                                k->name);
                        failed++;
                }
                if (k->c_ok)
                        nok++;
                else if (schema_ok)
                        nknown++;
                else
                        nerr++;
                line = nl + 1;
        }
        fprintf(stderr,
                "%zu cases: %zu valid for both, %zu refused by both, %zu "
                "refused by coderq alone (inexpressible)\n",
                c.n, nok, nerr, nknown);
        ck_assert_uint_eq(failed, 0);
        /* The corpus is not trivially small. */
        ck_assert_uint_ge(nok, 40);
        ck_assert_uint_ge(nerr, 100);
        cq_check_proc_release(&proc);
        corpus_free(&c);
}
END_TEST

START_TEST(schemas_are_valid_schemas)
{
        const char *argv[] = {
            PYTHON, cq_check_srcpath("tests/schemas/check_schemas.py"),
            "schemas", NULL};
        cq_check_proc_t proc;

        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 60000, &proc), 0);
        ck_assert_msg(proc.status == 0, "%s%s", proc.out, proc.err);
        ck_assert_uint_eq(cq_check_count_lines(proc.out), 3);
        cq_check_proc_release(&proc);
}
END_TEST

static Suite *schemas_suite(void)
{
        Suite *s = suite_create("schemas");
        TCase *tc = tcase_create("schemas");

        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, schemas_are_valid_schemas);
        tcase_add_test(tc, schema_and_c_validator_agree);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(schemas_suite)
