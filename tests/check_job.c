/* SPDX-License-Identifier: MIT */
/* check_job.c - the job message parser: golden cases under
 * tests/data/job/<case>/{input.json,expected} and fuzz-style runs over
 * truncated, mutated, mistyped and random messages. Set CQ_GOLDEN_UPDATE=1
 * to rewrite the expected files (then review the diff). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/common/job.h"
#include "coderq/common/util.h"

/* The golden cases run with this size cap so one case can exceed it. */
#define GOLDEN_MAX 4096

#define OPT(label, s)                                                          \
        do {                                                                   \
                if (s)                                                         \
                        ck_assert_int_eq(                                      \
                            cq_buf_printf(&buf, "%s: %s\n", label, s), CQ_OK); \
        } while (0)

/* A readable summary of a parse, compared with the expected file. */
static char *summarize(cq_err_t rc, const cq_job_t *job, const char *errstr)
{
        cq_buf_t buf;
        size_t i;

        cq_buf_init(&buf, 1 << 20);
        if (rc != CQ_OK) {
                ck_assert_int_eq(
                    cq_buf_printf(
                        &buf, "%s: %s\n",
                        rc == CQ_ERR_TOO_LARGE ? "too_large" : "fatal", errstr),
                    CQ_OK);
                return cq_buf_take(&buf, NULL);
        }
        ck_assert_int_eq(cq_buf_printf(&buf,
                                       "ok\njob_id: %s\nprompt: %zu bytes\n",
                                       job->job_id, strlen(job->prompt)),
                         CQ_OK);
        OPT("title", job->title);
        OPT("task_id", job->task_id);
        OPT("run_id", job->run_id);
        OPT("parent_job_id", job->parent_job_id);
        OPT("backend", job->backend);
        OPT("model", job->model);
        OPT("provider", job->provider);
        if (job->system_prompt)
                ck_assert_int_eq(cq_buf_printf(&buf,
                                               "system_prompt: %zu bytes\n",
                                               strlen(job->system_prompt)),
                                 CQ_OK);
        for (i = 0; i < job->nfiles; i++) {
                const cq_job_file_t *file = &job->files[i];

                if (file->url)
                        ck_assert_int_eq(cq_buf_printf(&buf,
                                                       "file: %s url %s\n",
                                                       file->name, file->url),
                                         CQ_OK);
                else
                        ck_assert_int_eq(cq_buf_printf(&buf,
                                                       "file: %s %zu bytes\n",
                                                       file->name, file->len),
                                         CQ_OK);
        }
        if (job->tests) {
                const json_t *cases = json_object_get(job->tests, "cases");

                ck_assert_int_eq(
                    cq_buf_printf(
                        &buf, "tests: %s",
                        json_string_value(json_object_get(job->tests, "kind"))),
                    CQ_OK);
                if (cases)
                        ck_assert_int_eq(
                            cq_buf_printf(&buf, " %s, %zu cases",
                                          json_string_value(json_object_get(
                                              job->tests, "function")),
                                          json_array_size(cases)),
                            CQ_OK);
                if (job->tests_fresh)
                        ck_assert_int_eq(
                            cq_buf_append_str(&buf, ", isolation fresh"),
                            CQ_OK);
                ck_assert_int_eq(cq_buf_append_str(&buf, "\n"), CQ_OK);
        }
        /* Printed only when given, so older expected files stay valid. */
        if (job->visible.spec &&
            (job->visible.judge != CQ_JUDGE_SEPARATE || job->visible.mutates))
                ck_assert_int_eq(
                    cq_buf_printf(&buf, "tests: judge %s%s\n",
                                  job->visible.judge == CQ_JUDGE_MODEL
                                      ? "model"
                                      : "separate",
                                  job->visible.mutates ? ", mutates" : ""),
                    CQ_OK);
        if (job->hidden.spec) {
                const json_t *hc = json_object_get(job->hidden.spec, "cases");

                ck_assert_int_eq(
                    cq_buf_printf(&buf, "hidden: %s, %zu cases, judge %s\n",
                                  json_string_value(json_object_get(
                                      job->hidden.spec, "kind")),
                                  hc ? json_array_size(hc) : 1,
                                  job->hidden.judge == CQ_JUDGE_MODEL
                                      ? "model"
                                      : "separate"),
                    CQ_OK);
                ck_assert_ptr_null(json_object_get(
                    job->tests ? job->tests : job->hidden.spec, "hidden"));
        }
        if (job->case_timeout_s > 0 || job->reference)
                ck_assert_int_eq(
                    cq_buf_printf(&buf, "case_timeout_s: %g reference: %s\n",
                                  job->case_timeout_s,
                                  job->reference ? "yes" : "no"),
                    CQ_OK);
        if (job->tests)
                ck_assert_ptr_null(json_object_get(job->tests, "reference"));
        if (job->solution)
                ck_assert_int_eq(cq_buf_printf(&buf, "solution: %zu bytes\n",
                                               strlen(job->solution)),
                                 CQ_OK);
        if (job->samples || job->problem_id)
                ck_assert_int_eq(
                    cq_buf_printf(&buf,
                                  "samples: %ld problem_id: %s "
                                  "sample_index: %ld\n",
                                  job->samples,
                                  job->problem_id ? job->problem_id : "-",
                                  job->sample_index),
                    CQ_OK);
        if (strcmp(job->queue, CQ_JOB_QUEUE_DEFAULT) != 0)
                ck_assert_int_eq(cq_buf_printf(&buf, "queue: %s\n", job->queue),
                                 CQ_OK);
        if (job->metadata) {
                char *text =
                    json_dumps(job->metadata, JSON_COMPACT | JSON_SORT_KEYS);

                ck_assert_ptr_nonnull(text);
                ck_assert_int_eq(cq_buf_printf(&buf, "metadata: %s\n", text),
                                 CQ_OK);
                free(text);
        }
        if (job->limits.test_timeout_s >= 0)
                ck_assert_int_eq(cq_buf_printf(&buf, "test_timeout_s: %ld\n",
                                               job->limits.test_timeout_s),
                                 CQ_OK);
        if (job->memory.scope || !job->memory.recall || !job->memory.remember ||
            job->memory.cross_model)
                ck_assert_int_eq(
                    cq_buf_printf(&buf,
                                  "memory: scope=%s recall=%d remember=%d "
                                  "cross_model=%d\n",
                                  job->memory.scope ? job->memory.scope : "-",
                                  job->memory.recall, job->memory.remember,
                                  job->memory.cross_model),
                    CQ_OK);
        if (job->sampling.has_temperature || job->sampling.has_top_p ||
            job->sampling.has_seed) {
                ck_assert_int_eq(cq_buf_append_str(&buf, "sampling:"), CQ_OK);
                if (job->sampling.has_temperature)
                        ck_assert_int_eq(
                            cq_buf_printf(&buf, " temperature=%g",
                                          job->sampling.temperature),
                            CQ_OK);
                if (job->sampling.has_top_p)
                        ck_assert_int_eq(cq_buf_printf(&buf, " top_p=%g",
                                                       job->sampling.top_p),
                                         CQ_OK);
                if (job->sampling.has_seed)
                        ck_assert_int_eq(cq_buf_printf(&buf, " seed=%lld",
                                                       job->sampling.seed),
                                         CQ_OK);
                ck_assert_int_eq(cq_buf_append_str(&buf, "\n"), CQ_OK);
        }
        if (job->limits.max_tokens_total >= 0 || job->limits.max_cost_usd >= 0)
                ck_assert_int_eq(cq_buf_printf(&buf,
                                               "budget: max_tokens_total=%lld "
                                               "max_cost_usd=%g\n",
                                               job->limits.max_tokens_total,
                                               job->limits.max_cost_usd),
                                 CQ_OK);
        if (job->retry_of || job->run_attempt != 1)
                ck_assert_int_eq(
                    cq_buf_printf(&buf, "retry_of: %s run_attempt: %ld\n",
                                  job->retry_of ? job->retry_of : "-",
                                  job->run_attempt),
                    CQ_OK);
        ck_assert_int_eq(
            cq_buf_printf(&buf,
                          "limits: max_turns=%ld max_retries=%ld "
                          "cell_timeout_s=%ld job_timeout_s=%ld\n"
                          "priority: %ld\n",
                          job->limits.max_turns, job->limits.max_retries,
                          job->limits.cell_timeout_s, job->limits.job_timeout_s,
                          job->priority),
            CQ_OK);
        return cq_buf_take(&buf, NULL);
}

static int name_cmp(const void *a, const void *b)
{
        return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(job_golden_cases)
{
        char dirpath[4096];
        DIR *dir;
        struct dirent *de;
        char *names[512];
        size_t n = 0, i, failed = 0;
        bool update = getenv("CQ_GOLDEN_UPDATE") != NULL;

        snprintf(dirpath, sizeof(dirpath), "%s",
                 cq_check_srcpath("tests/data/job"));
        dir = opendir(dirpath);
        ck_assert_msg(dir != NULL, "cannot open %s", dirpath);
        while ((de = readdir(dir)) != NULL) {
                if (de->d_name[0] == '.')
                        continue;
                ck_assert_uint_lt(n, CQ_ARRAY_SIZE(names));
                names[n] = strdup(de->d_name);
                ck_assert_ptr_nonnull(names[n]);
                n++;
        }
        closedir(dir);
        qsort(names, n, sizeof(names[0]), name_cmp);
        ck_assert_uint_ge(n, 30);
        for (i = 0; i < n; i++) {
                char path[4600];
                char errstr[512] = "";
                char *input, *expected, *got;
                size_t len;
                cq_job_t job;
                cq_err_t rc;

                snprintf(path, sizeof(path), "%s/%s/input.json", dirpath,
                         names[i]);
                input = cq_check_slurp(path, &len);
                cq_job_init(&job);
                rc = cq_job_parse(input, len, GOLDEN_MAX, &job, errstr,
                                  sizeof(errstr));
                if (rc != CQ_OK) {
                        ck_assert_msg(errstr[0] != '\0', "%s: empty error",
                                      names[i]);
                        ck_assert_ptr_null(job.job_id);
                        ck_assert_ptr_null(job.spec);
                }
                got = summarize(rc, &job, errstr);
                snprintf(path, sizeof(path), "%s/%s/expected", dirpath,
                         names[i]);
                if (update) {
                        cq_check_spit(path, got, strlen(got));
                } else {
                        expected = cq_check_slurp(path, NULL);
                        if (strcmp(expected, got) != 0) {
                                fprintf(stderr,
                                        "job case %s:\n--- expected\n%s--- "
                                        "got\n%s",
                                        names[i], expected, got);
                                failed++;
                        }
                        free(expected);
                }
                free(got);
                free(input);
                cq_job_release(&job);
                free(names[i]);
        }
        ck_assert_uint_eq(failed, 0);
}
END_TEST

/* Retry ids: ROOT~rN, or a hashed stem when that would pass 128. */
START_TEST(job_retry_ids)
{
        char id[CQ_JOB_ID_MAX + 1], other[CQ_JOB_ID_MAX + 1], hex[65];
        char root[CQ_JOB_ID_MAX + 1];

        ck_assert_int_eq(cq_job_retry_id("eval-1-0003", 2, id, sizeof(id)), 0);
        ck_assert_str_eq(id, "eval-1-0003~r2");
        ck_assert_int_eq(cq_job_retry_id("x", 1000, id, sizeof(id)), 0);
        ck_assert_str_eq(id, "x~r1000");
        /* the attempt range and the buffer */
        ck_assert_int_eq(cq_job_retry_id("x", 1, id, sizeof(id)), -1);
        ck_assert_int_eq(cq_job_retry_id("x", 1001, id, sizeof(id)), -1);
        ck_assert_int_eq(cq_job_retry_id("x", 2, id, 64), -1);
        ck_assert_int_eq(cq_job_retry_id("", 2, id, sizeof(id)), -1);
        /* 125 + "~r2" fits exactly; 126 does not */
        memset(root, 'a', 125);
        root[125] = '\0';
        ck_assert_int_eq(cq_job_retry_id(root, 2, id, sizeof(id)), 0);
        ck_assert_uint_eq(strlen(id), 128);
        ck_assert_str_eq(id + 125, "~r2");
        memset(root, 'a', 128);
        root[128] = '\0';
        ck_assert_int_eq(cq_job_retry_id(root, 12, id, sizeof(id)), 0);
        ck_assert_uint_eq(strlen(id), 128);
        cq_sha256_hex(root, 128, hex);
        ck_assert_int_eq(memcmp(id + 107, "~", 1), 0);
        ck_assert_int_eq(memcmp(id + 108, hex, 16), 0);
        ck_assert_str_eq(id + 124, "~r12");
        /* two long roots with the same start get different ids */
        root[127] = 'b';
        ck_assert_int_eq(cq_job_retry_id(root, 12, other, sizeof(other)), 0);
        ck_assert_str_ne(id, other);
        ck_assert_int_eq(memcmp(id, other, 107), 0);
        /* the id is a valid job id with a valid retry_of */
        {
                char text[1024], errstr[256] = "";
                cq_job_t job;

                snprintf(text, sizeof(text),
                         "{\"job_id\":\"%s\",\"prompt\":\"p\","
                         "\"retry_of\":\"%s\",\"run_attempt\":12}",
                         id, root);
                cq_job_init(&job);
                ck_assert_msg(cq_job_parse(text, strlen(text), 0, &job, errstr,
                                           sizeof(errstr)) == CQ_OK,
                              "%s", errstr);
                ck_assert_str_eq(job.retry_of, root);
                ck_assert_int_eq(job.run_attempt, 12);
                cq_job_release(&job);
        }
}
END_TEST

START_TEST(job_fields_are_typed_and_owned)
{
        const char *text = "{\"job_id\":\"a-1\",\"prompt\":\"p\","
                           "\"files\":[{\"name\":\"d/x.bin\","
                           "\"content_b64\":\"AAEC/w==\"}],"
                           "\"limits\":{\"max_turns\":7},\"future\":[1]}";
        char errstr[256] = "";
        cq_job_t job;
        json_t *doc;

        cq_job_init(&job);
        ck_assert_int_eq(job.limits.max_turns, -1);
        /* A field this version does not know is refused at every door,
         * naming it... */
        ck_assert_int_eq(
            cq_job_parse(text, strlen(text), 0, &job, errstr, sizeof(errstr)),
            CQ_ERR_FATAL);
        ck_assert_str_eq(errstr, "unknown field \"future\"");
        /* ...and kept in a spec coderq stored itself (a job queued by
         * another version still runs). */
        doc = json_loads(text, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        ck_assert_int_eq(cq_job_from_json(doc, CQ_JOB_F_STORED, &job, errstr,
                                          sizeof(errstr)),
                         CQ_OK);
        json_decref(doc);
        ck_assert_str_eq(job.job_id, "a-1");
        ck_assert_uint_eq(job.nfiles, 1);
        ck_assert_uint_eq(job.files[0].len, 4);
        ck_assert_int_eq(job.files[0].data[0], 0);
        ck_assert_int_eq(job.files[0].data[3], 0xff);
        ck_assert_ptr_null(job.files[0].url);
        ck_assert_int_eq(job.limits.max_turns, 7);
        ck_assert_int_eq(job.limits.max_retries, -1);
        ck_assert_ptr_nonnull(json_object_get(job.spec, "future"));
        ck_assert_str_eq(job.queue, "default");
        ck_assert_int_eq(job.sample_index, -1);
        cq_job_release(&job);
        ck_assert_ptr_null(job.spec);
        text = "{\"job_id\":\"a-1\",\"prompt\":\"p\"}";

        /* from_json copies: changing the caller's document afterwards does
         * not reach the job. */
        doc = json_loads(text, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        ck_assert_int_eq(cq_job_from_json(doc, 0, &job, errstr, sizeof(errstr)),
                         CQ_OK);
        json_object_set_new(doc, "job_id", json_string("changed"));
        ck_assert_str_eq(json_string_value(json_object_get(job.spec, "job_id")),
                         "a-1");
        cq_job_release(&job);
        json_decref(doc);

        doc = json_array();
        ck_assert_int_eq(cq_job_from_json(doc, 0, &job, errstr, sizeof(errstr)),
                         CQ_ERR_FATAL);
        ck_assert_str_eq(errstr, "job message must be a JSON object");
        json_decref(doc);

        /* A NULL error buffer is accepted. */
        ck_assert_int_eq(cq_job_parse("[]", 2, 0, &job, NULL, 0), CQ_ERR_FATAL);
        /* The size cap is checked before parsing. */
        ck_assert_int_eq(
            cq_job_parse("{not json", 9, 4, &job, errstr, sizeof(errstr)),
            CQ_ERR_TOO_LARGE);
        ck_assert_str_eq(errstr, "job message is 9 bytes, over the limit of 4");
}
END_TEST

/* xorshift64*: deterministic, so a failure can be replayed. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dULL;
}

static size_t n_ok, n_rejected;

/* Parse one input; it must not crash, and a rejection must say why. */
static void try_parse(const char *data, size_t len)
{
        char errstr[512];
        cq_job_t job;
        cq_err_t rc;

        errstr[0] = '\0';
        cq_job_init(&job);
        rc = cq_job_parse(data, len, 1 << 20, &job, errstr, sizeof(errstr));
        if (rc == CQ_OK) {
                ck_assert_ptr_nonnull(job.job_id);
                ck_assert_ptr_nonnull(job.prompt);
                ck_assert_ptr_nonnull(job.spec);
                n_ok++;
        } else {
                ck_assert(rc == CQ_ERR_FATAL || rc == CQ_ERR_TOO_LARGE);
                ck_assert_msg(errstr[0] != '\0', "rejection without a reason");
                ck_assert_ptr_null(job.job_id);
                ck_assert_ptr_null(job.files);
                n_rejected++;
        }
        cq_job_release(&job);
}

START_TEST(job_fuzz_never_crashes)
{
        static const char *const wrong[] = {
            "null",
            "true",
            "0",
            "-1",
            "1.5",
            "1e308",
            "9223372036854775807",
            "-9223372036854775808",
            "\"\"",
            "\"x\"",
            "\"../../etc/passwd\"",
            "\"\\u0000\"",
            "\"\\u00e9\\n\"",
            "[]",
            "{}",
            "[{}]",
            "[[[[[[[[[[]]]]]]]]]]",
            "{\"kind\":\"cases\"}",
            "{\"kind\":\"code\",\"code\":7}",
            "[{\"name\":\"a\",\"content_b64\":\"!!\"}]",
            "[{\"name\":\"a\",\"url\":\"ftp://x\"}]",
            "{\"max_turns\":0}",
        };
        static const char *const keys[] = {
            "version",  "job_id",        "prompt",        "title",
            "task_id",  "run_id",        "parent_job_id", "backend",
            "model",    "files",         "tests",         "limits",
            "priority", "system_prompt", "memory",        "temperature",
            "top_p",    "seed",          "retry_of",      "run_attempt"};
        size_t len, i, k, w, round;
        char *base = cq_check_slurp(
            cq_check_srcpath("tests/data/job/ok_full/input.json"), &len);
        char *work = malloc(len + 64);
        json_t *doc;

        ck_assert_ptr_nonnull(work);
        n_ok = n_rejected = 0;
        try_parse(base, len);
        ck_assert_uint_eq(n_ok, 1);

        /* Every truncation. */
        for (i = 0; i < len; i++)
                try_parse(base, i);

        /* Random byte flips, insertions and deletions. */
        for (round = 0; round < 6000; round++) {
                size_t wlen = len, edits = 1 + rng() % 4;

                memcpy(work, base, len);
                for (k = 0; k < edits; k++) {
                        size_t pos = rng() % wlen;

                        switch (rng() % 3) {
                        case 0:
                                work[pos] = (char)(rng() & 0xff);
                                break;
                        case 1:
                                if (wlen < len + 60) {
                                        memmove(work + pos + 1, work + pos,
                                                wlen - pos);
                                        work[pos] =
                                            "{}[]\",:0\\ae\x80"[rng() % 13];
                                        wlen++;
                                }
                                break;
                        default:
                                memmove(work + pos, work + pos + 1,
                                        wlen - pos - 1);
                                wlen--;
                                break;
                        }
                }
                try_parse(work, wlen);
        }

        /* Pure random bytes. */
        for (round = 0; round < 2000; round++) {
                size_t wlen = rng() % (len + 1);

                for (i = 0; i < wlen; i++)
                        work[i] = (char)(rng() & 0xff);
                try_parse(work, wlen);
        }

        /* Every known field replaced with every wrong-ish value, and
         * removed. */
        doc = json_loadb(base, len, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        for (k = 0; k < CQ_ARRAY_SIZE(keys); k++) {
                for (w = 0; w <= CQ_ARRAY_SIZE(wrong); w++) {
                        json_t *copy = json_deep_copy(doc);
                        char *text;

                        ck_assert_ptr_nonnull(copy);
                        if (w == CQ_ARRAY_SIZE(wrong)) {
                                json_object_del(copy, keys[k]);
                        } else {
                                json_t *value = json_loads(
                                    wrong[w], JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                    NULL);

                                ck_assert_msg(value != NULL, "bad %s",
                                              wrong[w]);
                                json_object_set_new(copy, keys[k], value);
                        }
                        text = json_dumps(copy, JSON_COMPACT);
                        ck_assert_ptr_nonnull(text);
                        try_parse(text, strlen(text));
                        free(text);
                        json_decref(copy);
                }
        }
        json_decref(doc);

        /* Deep nesting and a huge string. */
        {
                size_t deep = 100000;
                char *big = malloc(2 * deep + 2);

                ck_assert_ptr_nonnull(big);
                memset(big, '[', deep);
                memset(big + deep, ']', deep);
                try_parse(big, 2 * deep);
                free(big);
        }
        fprintf(stderr, "job fuzz: %zu accepted, %zu rejected\n", n_ok,
                n_rejected);
        ck_assert_uint_gt(n_rejected, 8000);
        ck_assert_uint_gt(n_ok, 10);
        free(work);
        free(base);
}
END_TEST

static Suite *cq_job_suite(void)
{
        Suite *s = suite_create("job");
        TCase *tc = tcase_create("core");

        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, job_golden_cases);
        tcase_add_test(tc, job_fields_are_typed_and_owned);
        tcase_add_test(tc, job_retry_ids);
        tcase_add_test(tc, job_fuzz_never_crashes);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_job_suite)
