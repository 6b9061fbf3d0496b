/* SPDX-License-Identifier: MIT */
/* job.c - parsing and validation of job messages (docs/JOBS.md#validation).
 * Everything here is untrusted input from Kafka or a file: the size cap is
 * checked before parsing, every field is type- and range-checked, and every
 * rejection names the field. A field this version does not know is refused
 * at the top level and inside limits, files[], tests and memory, with the
 * nearest known name when it looks misspelt: a misspelt "model" or
 * "temperature" that silently ran another experiment is worse than a
 * bounced job. Free-form data has its place, "metadata". Only a spec that
 * coderq stored itself (CQ_JOB_F_STORED) keeps fields it does not know.
 * JSON null counts as "not given" for every optional field.
 *
 * Bounds: ids (job_id, parent_job_id, task_id, run_id, problem_id) are
 * 1-128 printable ASCII bytes without spaces; at most 1000 files and 64 MiB
 * of decoded inline content; URLs at most 2048 bytes; at most 10000 test
 * cases; limits max_turns and max_retries 1..1000, cell_timeout_s and
 * test_timeout_s 1..86400, job_timeout_s 1..604800, max_tokens_total
 * 1..10^12, max_cost_usd above 0 up to 10^6; priority -1000..1000;
 * temperature 0..2, top_p 0..1, seed any integer; run_attempt 2..1000
 * with retry_of (and only with it); samples 1..1000; sample_index 0..999
 * with problem_id; queue 1-64 of [a-z0-9._-]; metadata an object of at
 * most 64 KiB; tests.case_timeout_s above 0 up to 3600; memory.scope
 * follows the id rules. */
#include "coderq/common/job.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coderq/common/util.h"

/* Decoded inline file bytes over all files of one job. */
#define JOB_FILES_MAX_BYTES  ((size_t)64 << 20)
#define JOB_FILES_MAX_COUNT  1000
#define JOB_URL_MAX          2048
#define JOB_CASES_MAX        10000
#define JOB_IDENT_MAX        128
#define JOB_PRIORITY_MIN     (-1000)
#define JOB_PRIORITY_MAX     1000
#define JOB_TOKENS_MAX       1000000000000LL
#define JOB_COST_MAX         1e6
#define JOB_RUN_ATTEMPT_MAX  1000
#define JOB_SAMPLES_MAX      1000
#define JOB_FIELD_NAME_MAX   64
#define JOB_QUEUE_MAX        64
#define JOB_METADATA_MAX     ((size_t)64 << 10) /* serialized, bytes */
#define JOB_CASE_TIMEOUT_MAX 3600.0

void cq_job_init(cq_job_t *job)
{
        memset(job, 0, sizeof(*job));
        job->limits.max_turns = -1;
        job->limits.max_retries = -1;
        job->limits.cell_timeout_s = -1;
        job->limits.job_timeout_s = -1;
        job->limits.test_timeout_s = -1;
        job->limits.max_tokens_total = -1;
        job->limits.max_cost_usd = -1;
        job->run_attempt = 1;
        job->sample_index = -1;
        job->memory.recall = true;
        job->memory.remember = true;
}

void cq_job_release(cq_job_t *job)
{
        size_t i;

        free(job->job_id);
        free(job->prompt);
        free(job->title);
        free(job->task_id);
        free(job->run_id);
        free(job->parent_job_id);
        free(job->backend);
        free(job->provider);
        free(job->model);
        free(job->system_prompt);
        free(job->memory.scope);
        free(job->retry_of);
        for (i = 0; i < job->nfiles; i++) {
                free(job->files[i].name);
                free(job->files[i].data);
                free(job->files[i].url);
        }
        free(job->files);
        json_decref(job->tests);
        json_decref(job->visible.spec);
        json_decref(job->hidden.spec);
        free(job->reference);
        free(job->solution);
        free(job->problem_id);
        free(job->queue);
        json_decref(job->metadata);
        json_decref(job->spec);
        cq_job_init(job);
}

/* An identifier (job_id, parent_job_id, task_id, run_id): 1..128 bytes of
 * printable ASCII without spaces, so it is safe as a Kafka key, in logs, in
 * file names of `coderq run` output and on a command line. */
static bool id_is_valid(const char *s, size_t len)
{
        size_t i;

        if (len == 0 || len > CQ_JOB_ID_MAX)
                return false;
        for (i = 0; i < len; i++)
                if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
                        return false;
        return true;
}

bool cq_job_id_valid(const char *s, size_t len)
{
        return s && id_is_valid(s, len);
}

static bool is_python_identifier(const char *s)
{
        size_t i;

        if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') ||
              s[0] == '_'))
                return false;
        for (i = 1; s[i]; i++) {
                char c = s[i];

                if (i >= JOB_IDENT_MAX)
                        return false;
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '_'))
                        return false;
        }
        return true;
}

/* http:// or https://, a non-empty host part, no whitespace or control
 * characters, bounded length. */
static bool url_is_valid(const char *s, size_t len)
{
        size_t i, skip;

        if (len > JOB_URL_MAX)
                return false;
        if (len > 7 && strncasecmp(s, "http://", 7) == 0)
                skip = 7;
        else if (len > 8 && strncasecmp(s, "https://", 8) == 0)
                skip = 8;
        else
                return false;
        if (s[skip] == '/' || s[skip] == '?' || s[skip] == '#')
                return false;
        for (i = 0; i < len; i++)
                if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f)
                        return false;
        return true;
}

/* Fetch an optional string member. *valuep is NULL when the field is absent
 * or JSON null. Returns -1 with errstr filled when it has another type. */
static int get_opt_string(const json_t *obj,
                          const char *key,
                          const char *field,
                          const json_t **valuep,
                          char *errstr,
                          size_t errstr_size)
{
        const json_t *value = json_object_get(obj, key);

        *valuep = NULL;
        if (!value || json_is_null(value))
                return 0;
        if (!json_is_string(value)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s\" must be a string", field);
                return -1;
        }
        *valuep = value;
        return 0;
}

static int dup_string(const json_t *value, char **outp)
{
        *outp = strdup(json_string_value(value));
        return *outp ? 0 : -1;
}

/* An optional non-empty free-text field (title, model, system_prompt). */
static int parse_text(const json_t *spec,
                      const char *key,
                      char **outp,
                      char *errstr,
                      size_t errstr_size)
{
        const json_t *value;

        if (get_opt_string(spec, key, key, &value, errstr, errstr_size))
                return -1;
        if (!value)
                return 0;
        if (json_string_length(value) == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s\" must be a non-empty string", key);
                return -1;
        }
        if (dup_string(value, outp)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

/* An optional identifier (task_id, run_id, parent_job_id). */
static int parse_id(const json_t *spec,
                    const char *key,
                    char **outp,
                    char *errstr,
                    size_t errstr_size)
{
        const json_t *value;

        if (get_opt_string(spec, key, key, &value, errstr, errstr_size))
                return -1;
        if (!value)
                return 0;
        if (!id_is_valid(json_string_value(value), json_string_length(value))) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s\" must be 1 to %d printable ASCII "
                              "characters without spaces",
                              key, CQ_JOB_ID_MAX);
                return -1;
        }
        if (dup_string(value, outp)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

/* The edit distance of \p a and \p b (Levenshtein), stopping at 3: only
 * a near miss is worth a suggestion. */
static size_t edit_distance(const char *a, const char *b)
{
        size_t la = strlen(a), lb = strlen(b), i, j;
        size_t row[JOB_FIELD_NAME_MAX + 1];

        if (la > JOB_FIELD_NAME_MAX || lb > JOB_FIELD_NAME_MAX)
                return 3;
        for (j = 0; j <= lb; j++)
                row[j] = j;
        for (i = 1; i <= la; i++) {
                size_t diag = row[0];

                row[0] = i;
                for (j = 1; j <= lb; j++) {
                        size_t up = row[j];
                        size_t best = diag + (a[i - 1] != b[j - 1]);

                        if (up + 1 < best)
                                best = up + 1;
                        if (row[j - 1] + 1 < best)
                                best = row[j - 1] + 1;
                        row[j] = best;
                        diag = up;
                }
        }
        return row[lb] < 3 ? row[lb] : 3;
}

/* The known name nearest \p key when it is a near miss (at most 2 edits,
 * and fewer than half its length), else NULL. */
static const char *nearest_known(const char *key, const char *const *known)
{
        const char *best = NULL;
        size_t best_d = 3, i;

        for (i = 0; known[i]; i++) {
                size_t d = edit_distance(key, known[i]);

                if (d < best_d && 2 * d < strlen(known[i])) {
                        best = known[i];
                        best_d = d;
                }
        }
        return best;
}

/* Refuse a key of \p obj that is not in \p known, naming it (under
 * \p prefix, "" at the top level) and the known one it is nearest. */
static int check_known_keys(const json_t *obj,
                            const char *const *known,
                            const char *prefix,
                            char *errstr,
                            size_t errstr_size)
{
        const char *key;
        const json_t *value;
        size_t i;

        /* jansson's iteration API takes a non-const object; it does not
         * modify it. */
        json_object_foreach((json_t *)(uintptr_t)obj, key, value)
        {
                bool found = false;
                const char *near;

                (void)value;
                for (i = 0; known[i]; i++)
                        if (strcmp(key, known[i]) == 0)
                                found = true;
                if (found)
                        continue;
                near = nearest_known(key, known);
                cq_errstr_set(errstr, errstr_size,
                              "unknown field \"%s%s%.64s\"%s%s%s%s%s", prefix,
                              *prefix ? "." : "", key,
                              near ? "; did you mean \"" : "",
                              near ? prefix : "", near && *prefix ? "." : "",
                              near ? near : "", near ? "\"?" : "");
                return -1;
        }
        return 0;
}

static int parse_limit(const json_t *limits,
                       const char *key,
                       long min,
                       long max,
                       long *outp,
                       char *errstr,
                       size_t errstr_size)
{
        const json_t *value = json_object_get(limits, key);
        json_int_t n;

        if (!value || json_is_null(value))
                return 0;
        if (!json_is_integer(value) || (n = json_integer_value(value)) < min) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"limits.%s\" must be %s integer", key,
                              min > 0 ? "a positive" : "a non-negative");
                return -1;
        }
        if (n > max) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"limits.%s\" must be at most %ld", key,
                              max);
                return -1;
        }
        *outp = (long)n;
        return 0;
}

/* An optional number (integer or real) of \p obj from \p min (above it
 * when \p above) to \p max; \p field names it in errors. *\p outp is set
 * only when it is given. */
static int parse_real(const json_t *obj,
                      const char *key,
                      const char *field,
                      double min,
                      bool above,
                      double max,
                      double *outp,
                      char *errstr,
                      size_t errstr_size)
{
        const json_t *value = json_object_get(obj, key);
        double v = json_number_value(value);

        if (!value || json_is_null(value))
                return 0;
        if (!json_is_number(value) || !(above ? v > min : v >= min) ||
            !(v <= max)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    above ? "field \"%s\" must be a number above %.10g "
                            "and at most %.10g"
                          : "field \"%s\" must be a number from %.10g to "
                            "%.10g",
                    field, min, max);
                return -1;
        }
        *outp = v;
        return 0;
}

static int parse_limits(const json_t *spec,
                        cq_job_limits_t *limits,
                        char *errstr,
                        size_t errstr_size)
{
        static const char *const known[] = {
            "max_turns",      "max_retries",
            "cell_timeout_s", "job_timeout_s",
            "test_timeout_s", "max_tokens_total",
            "max_cost_usd",   NULL};
        const json_t *total;
        const json_t *obj = json_object_get(spec, "limits");

        if (!obj || json_is_null(obj))
                return 0;
        if (!json_is_object(obj)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"limits\" must be an object");
                return -1;
        }
        if (check_known_keys(obj, known, "limits", errstr, errstr_size) ||
            parse_limit(obj, "max_turns", 1, 1000, &limits->max_turns, errstr,
                        errstr_size) ||
            parse_limit(obj, "max_retries", 0, 1000, &limits->max_retries,
                        errstr, errstr_size) ||
            parse_limit(obj, "cell_timeout_s", 1, 86400,
                        &limits->cell_timeout_s, errstr, errstr_size) ||
            parse_limit(obj, "job_timeout_s", 1, 7 * 86400,
                        &limits->job_timeout_s, errstr, errstr_size) ||
            parse_limit(obj, "test_timeout_s", 1, 86400,
                        &limits->test_timeout_s, errstr, errstr_size) ||
            parse_real(obj, "max_cost_usd", "limits.max_cost_usd", 0, true,
                       JOB_COST_MAX, &limits->max_cost_usd, errstr,
                       errstr_size))
                return -1;
        /* A long may be 32 bits: the token bound has its own check. */
        total = json_object_get(obj, "max_tokens_total");
        if (total && !json_is_null(total)) {
                if (!json_is_integer(total) || json_integer_value(total) < 1) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"limits.max_tokens_total\" must be a "
                            "positive integer");
                        return -1;
                }
                if (json_integer_value(total) > JOB_TOKENS_MAX) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"limits.max_tokens_total\" must be at "
                            "most %lld",
                            JOB_TOKENS_MAX);
                        return -1;
                }
                limits->max_tokens_total = (long long)json_integer_value(total);
        }
        return 0;
}

static int parse_sampling(const json_t *spec,
                          cq_job_sampling_t *sampling,
                          char *errstr,
                          size_t errstr_size)
{
        const json_t *seed = json_object_get(spec, "seed");

        sampling->temperature = sampling->top_p = -1;
        if (parse_real(spec, "temperature", "temperature", 0, false, 2,
                       &sampling->temperature, errstr, errstr_size) ||
            parse_real(spec, "top_p", "top_p", 0, false, 1, &sampling->top_p,
                       errstr, errstr_size))
                return -1;
        sampling->has_temperature = sampling->temperature >= 0;
        sampling->has_top_p = sampling->top_p >= 0;
        if (!seed || json_is_null(seed))
                return 0;
        if (!json_is_integer(seed)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"seed\" must be an integer");
                return -1;
        }
        sampling->has_seed = true;
        sampling->seed = (long long)json_integer_value(seed);
        return 0;
}

/* retry_of and run_attempt: given together (a retry made by `coderq
 * retry`, or by anyone following its rules) or not at all. */
static int
parse_retry(const json_t *spec, cq_job_t *job, char *errstr, size_t errstr_size)
{
        const json_t *attempt = json_object_get(spec, "run_attempt");
        bool has_attempt = attempt && !json_is_null(attempt);

        if (parse_id(spec, "retry_of", &job->retry_of, errstr, errstr_size))
                return -1;
        if (has_attempt &&
            (!json_is_integer(attempt) || json_integer_value(attempt) < 2 ||
             json_integer_value(attempt) > JOB_RUN_ATTEMPT_MAX)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"run_attempt\" must be an integer from 2 to %d",
                    JOB_RUN_ATTEMPT_MAX);
                return -1;
        }
        if (has_attempt != (job->retry_of != NULL)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "fields \"retry_of\" and \"run_attempt\" go together");
                return -1;
        }
        if (job->retry_of && strcmp(job->retry_of, job->job_id) == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"retry_of\" must differ from \"job_id\"");
                return -1;
        }
        if (has_attempt)
                job->run_attempt = (long)json_integer_value(attempt);
        return 0;
}

static int parse_file(const json_t *entry,
                      size_t i,
                      cq_job_file_t *file,
                      size_t *totalp,
                      char *errstr,
                      size_t errstr_size)
{
        static const char *const known[] = {"name", "content_b64", "url", NULL};
        const json_t *name, *b64, *url;
        char prefix[48];

        snprintf(prefix, sizeof(prefix), "files[%zu]", i);
        if (!json_is_object(entry)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s\" must be an object", prefix);
                return -1;
        }
        if (check_known_keys(entry, known, prefix, errstr, errstr_size))
                return -1;
        name = json_object_get(entry, "name");
        if (!json_is_string(name) ||
            strlen(json_string_value(name)) != json_string_length(name) ||
            !cq_relpath_is_safe(json_string_value(name))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"%s.name\" must be a safe relative path "
                    "(no \"..\", no leading \"/\", at most 255 bytes)",
                    prefix);
                return -1;
        }
        b64 = json_object_get(entry, "content_b64");
        url = json_object_get(entry, "url");
        if ((b64 != NULL) == (url != NULL)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"%s\" must have exactly one of \"content_b64\" "
                    "and \"url\"",
                    prefix);
                return -1;
        }
        if (b64) {
                if (!json_is_string(b64)) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"%s.content_b64\" must be a string",
                            prefix);
                        return -1;
                }
                file->data = cq_b64_decode(json_string_value(b64),
                                           json_string_length(b64), &file->len);
                if (!file->data) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"%s.content_b64\" is not valid base64",
                            prefix);
                        return -1;
                }
                if (file->len > JOB_FILES_MAX_BYTES - *totalp) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"files\": inline files exceed %zu "
                            "bytes in total",
                            JOB_FILES_MAX_BYTES);
                        return -1;
                }
                *totalp += file->len;
        } else {
                if (!json_is_string(url) ||
                    !url_is_valid(json_string_value(url),
                                  json_string_length(url))) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"%s.url\" must be an http or https "
                            "URL",
                            prefix);
                        return -1;
                }
                if (dup_string(url, &file->url)) {
                        cq_errstr_set(errstr, errstr_size, "out of memory");
                        return -1;
                }
        }
        if (dup_string(name, &file->name)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

static int
parse_files(const json_t *spec, cq_job_t *job, char *errstr, size_t errstr_size)
{
        const json_t *arr = json_object_get(spec, "files");
        size_t i, j, n, total = 0;

        if (!arr || json_is_null(arr))
                return 0;
        if (!json_is_array(arr)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"files\" must be an array");
                return -1;
        }
        n = json_array_size(arr);
        if (n > JOB_FILES_MAX_COUNT) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"files\" must have at most %d entries",
                              JOB_FILES_MAX_COUNT);
                return -1;
        }
        if (n == 0)
                return 0;
        job->files = calloc(n, sizeof(*job->files));
        if (!job->files) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        for (i = 0; i < n; i++) {
                /* Counted before the parse so release frees a partial one. */
                job->nfiles = i + 1;
                if (parse_file(json_array_get(arr, i), i, &job->files[i],
                               &total, errstr, errstr_size))
                        return -1;
                for (j = 0; j < i; j++)
                        if (strcmp(job->files[j].name, job->files[i].name) ==
                            0) {
                                cq_errstr_set(
                                    errstr, errstr_size,
                                    "field \"files[%zu].name\" repeats "
                                    "\"%.255s\"",
                                    i, job->files[i].name);
                                return -1;
                        }
        }
        return 0;
}

/* The keys a test set may have beside its kind's own; "hidden",
 * "reference" and "case_timeout_s" only at the top (TOP_ONLY). */
#define TEST_COMMON_KEYS "kind", "isolation", "judge"
#define TEST_TOP_KEYS    "hidden", "reference", "case_timeout_s"

static int parse_cases(const json_t *tests,
                       const char *prefix,
                       bool top,
                       char *errstr,
                       size_t errstr_size)
{
        static const char *const known_top[] = {TEST_COMMON_KEYS, TEST_TOP_KEYS,
                                                "function", "cases", NULL};
        static const char *const known[] = {TEST_COMMON_KEYS, "function",
                                            "cases", NULL};
        static const char *const case_known[] = {"args", "expected", NULL};
        const json_t *function = json_object_get(tests, "function");
        const json_t *cases = json_object_get(tests, "cases");
        size_t i;

        if (check_known_keys(tests, top ? known_top : known, prefix, errstr,
                             errstr_size))
                return -1;
        if (!json_is_string(function) ||
            strlen(json_string_value(function)) !=
                json_string_length(function) ||
            !is_python_identifier(json_string_value(function))) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s.function\" must be a Python "
                              "identifier",
                              prefix);
                return -1;
        }
        if (!json_is_array(cases) || json_array_size(cases) == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s.cases\" must be a non-empty array",
                              prefix);
                return -1;
        }
        if (json_array_size(cases) > JOB_CASES_MAX) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s.cases\" must have at most %d "
                              "entries",
                              prefix, JOB_CASES_MAX);
                return -1;
        }
        for (i = 0; i < json_array_size(cases); i++) {
                const json_t *tc = json_array_get(cases, i);
                char at[64];

                snprintf(at, sizeof(at), "%s.cases[%zu]", prefix, i);
                if (!json_is_object(tc)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "field \"%s\" must be an object", at);
                        return -1;
                }
                if (check_known_keys(tc, case_known, at, errstr, errstr_size))
                        return -1;
                if (!json_is_array(json_object_get(tc, "args"))) {
                        cq_errstr_set(errstr, errstr_size,
                                      "field \"%s.args\" must be an array", at);
                        return -1;
                }
                if (!json_object_get(tc, "expected")) {
                        cq_errstr_set(errstr, errstr_size,
                                      "field \"%s.expected\" is required", at);
                        return -1;
                }
        }
        return 0;
}

static int parse_code(const json_t *tests,
                      const char *prefix,
                      bool top,
                      char *errstr,
                      size_t errstr_size)
{
        static const char *const known_top[] = {TEST_COMMON_KEYS, TEST_TOP_KEYS,
                                                "code", "mutates", NULL};
        static const char *const known[] = {TEST_COMMON_KEYS, "code", "mutates",
                                            NULL};
        const json_t *code = json_object_get(tests, "code");
        const json_t *mutates = json_object_get(tests, "mutates");

        if (check_known_keys(tests, top ? known_top : known, prefix, errstr,
                             errstr_size))
                return -1;
        if (!json_is_string(code) || json_string_length(code) == 0 ||
            strlen(json_string_value(code)) != json_string_length(code)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s.code\" must be a non-empty string",
                              prefix);
                return -1;
        }
        if (mutates && !json_is_null(mutates) && !json_is_boolean(mutates)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s.mutates\" must be true or false",
                              prefix);
                return -1;
        }
        return 0;
}

/* One of the string enums of a test set: absent or null gives 0, else
 * the index of the value in \p values. */
static int parse_test_enum(const json_t *tests,
                           const char *key,
                           const char *prefix,
                           const char *const *values,
                           int *outp,
                           char *errstr,
                           size_t errstr_size)
{
        const json_t *value = json_object_get(tests, key);
        int i;

        *outp = 0;
        if (!value || json_is_null(value))
                return 0;
        for (i = 0; json_is_string(value) && values[i]; i++)
                if (strcmp(json_string_value(value), values[i]) == 0) {
                        *outp = i;
                        return 0;
                }
        cq_errstr_set(errstr, errstr_size,
                      "field \"%s.%s\" must be \"%s\" or \"%s\"", prefix, key,
                      values[0], values[1]);
        return -1;
}

/* One test set (the visible one at \p top, or tests.hidden) into \p set:
 * its kind's fields checked, a private copy without the top-level keys
 * that are not the tests themselves (hidden tests and the reference
 * solution must never reach the model with the visible ones). */
static int parse_test_set(const json_t *tests,
                          const char *prefix,
                          bool top,
                          cq_job_tests_t *set,
                          char *errstr,
                          size_t errstr_size)
{
        static const char *const isolation[] = {"kernel", "fresh", NULL};
        static const char *const judge[] = {"separate", "model", NULL};
        const json_t *kind = json_object_get(tests, "kind");
        const char *k = json_is_string(kind) ? json_string_value(kind) : "";
        int fresh, model;

        if (!json_is_object(tests)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s\" must be an object", prefix);
                return -1;
        }
        if (strcmp(k, "cases") == 0) {
                if (parse_cases(tests, prefix, top, errstr, errstr_size))
                        return -1;
        } else if (strcmp(k, "code") == 0) {
                if (parse_code(tests, prefix, top, errstr, errstr_size))
                        return -1;
        } else {
                cq_errstr_set(errstr, errstr_size,
                              "field \"%s.kind\" must be \"cases\" or "
                              "\"code\"",
                              prefix);
                return -1;
        }
        if (parse_test_enum(tests, "isolation", prefix, isolation, &fresh,
                            errstr, errstr_size) ||
            parse_test_enum(tests, "judge", prefix, judge, &model, errstr,
                            errstr_size))
                return -1;
        set->fresh = fresh == 1;
        set->judge = model == 1 ? CQ_JUDGE_MODEL : CQ_JUDGE_SEPARATE;
        set->mutates = json_is_true(json_object_get(tests, "mutates"));
        set->spec = json_deep_copy(tests);
        if (!set->spec) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        /* absent keys are no error here */
        (void)json_object_del(set->spec, "hidden");
        (void)json_object_del(set->spec, "reference");
        (void)json_object_del(set->spec, "case_timeout_s");
        return 0;
}

/* tests.reference and tests.case_timeout_s: how long a case may take. */
static int parse_case_limits(const json_t *tests,
                             cq_job_t *job,
                             char *errstr,
                             size_t errstr_size)
{
        const json_t *ref = json_object_get(tests, "reference");

        if (parse_real(tests, "case_timeout_s", "tests.case_timeout_s", 0, true,
                       JOB_CASE_TIMEOUT_MAX, &job->case_timeout_s, errstr,
                       errstr_size))
                return -1;
        if (!ref || json_is_null(ref))
                return 0;
        if (!json_is_string(ref) || json_string_length(ref) == 0 ||
            strlen(json_string_value(ref)) != json_string_length(ref)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"tests.reference\" must be a non-empty "
                              "string");
                return -1;
        }
        if (dup_string(ref, &job->reference)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

static int
parse_tests(const json_t *spec, cq_job_t *job, char *errstr, size_t errstr_size)
{
        static const char *const only_hidden[] = {TEST_TOP_KEYS, NULL};
        const json_t *tests = json_object_get(spec, "tests");
        const json_t *hidden;

        if (!tests || json_is_null(tests))
                return 0;
        if (!json_is_object(tests)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"tests\" must be an object");
                return -1;
        }
        hidden = json_object_get(tests, "hidden");
        if (hidden && json_is_null(hidden))
                hidden = NULL;
        /* Hidden tests alone: no visible set, nothing for reflection. */
        if (!json_object_get(tests, "kind") && hidden) {
                if (check_known_keys(tests, only_hidden, "tests", errstr,
                                     errstr_size))
                        return -1;
        } else if (parse_test_set(tests, "tests", true, &job->visible, errstr,
                                  errstr_size)) {
                return -1;
        }
        if (hidden && parse_test_set(hidden, "tests.hidden", false,
                                     &job->hidden, errstr, errstr_size))
                return -1;
        if (parse_case_limits(tests, job, errstr, errstr_size))
                return -1;
        job->tests = json_incref(job->visible.spec);
        job->tests_fresh = job->visible.fresh;
        return 0;
}

/* An optional boolean member of "memory". */
static int memory_flag(const json_t *obj,
                       const char *key,
                       bool *outp,
                       char *errstr,
                       size_t errstr_size)
{
        const json_t *value = json_object_get(obj, key);

        if (!value || json_is_null(value))
                return 0;
        if (!json_is_boolean(value)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"memory.%s\" must be true or false", key);
                return -1;
        }
        *outp = json_is_true(value);
        return 0;
}

static int parse_memory(const json_t *spec,
                        cq_job_memory_t *memory,
                        char *errstr,
                        size_t errstr_size)
{
        static const char *const known[] = {"scope", "recall", "remember",
                                            "cross_model", NULL};
        const json_t *obj = json_object_get(spec, "memory");
        const json_t *scope;

        if (!obj || json_is_null(obj))
                return 0;
        if (!json_is_object(obj)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"memory\" must be an object");
                return -1;
        }
        if (check_known_keys(obj, known, "memory", errstr, errstr_size) ||
            get_opt_string(obj, "scope", "memory.scope", &scope, errstr,
                           errstr_size) ||
            memory_flag(obj, "recall", &memory->recall, errstr, errstr_size) ||
            memory_flag(obj, "remember", &memory->remember, errstr,
                        errstr_size) ||
            memory_flag(obj, "cross_model", &memory->cross_model, errstr,
                        errstr_size))
                return -1;
        if (!scope)
                return 0;
        if (!id_is_valid(json_string_value(scope), json_string_length(scope))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"memory.scope\" must be 1 to %d printable "
                    "ASCII characters without spaces",
                    CQ_JOB_ID_MAX);
                return -1;
        }
        if (dup_string(scope, &memory->scope)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

/* Every top-level field of a job message. */
static const char *const top_known[] = {
    "version",  "job_id",   "prompt",        "title",
    "task_id",  "run_id",   "parent_job_id", "backend",
    "model",    "provider", "system_prompt", "files",
    "tests",    "limits",   "memory",        "temperature",
    "top_p",    "seed",     "retry_of",      "run_attempt",
    "priority", "samples",  "problem_id",    "sample_index",
    "queue",    "metadata", "solution",      NULL};

/* samples, and problem_id with sample_index (a sample made by a fan-out,
 * by coderq or by a producer following its rules). */
static int parse_samples(const json_t *spec,
                         cq_job_t *job,
                         char *errstr,
                         size_t errstr_size)
{
        const json_t *samples = json_object_get(spec, "samples");
        const json_t *index = json_object_get(spec, "sample_index");
        bool has_index = index && !json_is_null(index);

        if (samples && !json_is_null(samples)) {
                if (!json_is_integer(samples) ||
                    json_integer_value(samples) < 1 ||
                    json_integer_value(samples) > JOB_SAMPLES_MAX) {
                        cq_errstr_set(errstr, errstr_size,
                                      "field \"samples\" must be an integer "
                                      "from 1 to %d",
                                      JOB_SAMPLES_MAX);
                        return -1;
                }
                job->samples = (long)json_integer_value(samples);
        }
        if (parse_id(spec, "problem_id", &job->problem_id, errstr, errstr_size))
                return -1;
        if (has_index &&
            (!json_is_integer(index) || json_integer_value(index) < 0 ||
             json_integer_value(index) >= JOB_SAMPLES_MAX)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"sample_index\" must be an integer "
                              "from 0 to %d",
                              JOB_SAMPLES_MAX - 1);
                return -1;
        }
        if (has_index != (job->problem_id != NULL)) {
                cq_errstr_set(errstr, errstr_size,
                              "fields \"problem_id\" and \"sample_index\" go "
                              "together");
                return -1;
        }
        if (job->samples && job->problem_id) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"samples\": a sample (\"problem_id\") "
                              "cannot fan out again");
                return -1;
        }
        if (has_index)
                job->sample_index = (long)json_integer_value(index);
        return 0;
}

/* queue (default "default"): lower-case letters, digits, '-', '_', '.'. */
static int
parse_queue(const json_t *spec, cq_job_t *job, char *errstr, size_t errstr_size)
{
        const json_t *value;
        const char *s;
        size_t i, len;

        if (get_opt_string(spec, "queue", "queue", &value, errstr, errstr_size))
                return -1;
        s = value ? json_string_value(value) : CQ_JOB_QUEUE_DEFAULT;
        len = value ? json_string_length(value) : strlen(s);
        for (i = 0; i < len; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') ||
                      (s[i] >= '0' && s[i] <= '9') || s[i] == '-' ||
                      s[i] == '_' || s[i] == '.'))
                        break;
        if (len == 0 || len > JOB_QUEUE_MAX || i < len) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"queue\" must be 1 to %d lower-case "
                              "letters, digits, '-', '_' or '.'",
                              JOB_QUEUE_MAX);
                return -1;
        }
        job->queue = strdup(s);
        if (!job->queue) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

/* metadata: any JSON object of the producer's, at most JOB_METADATA_MAX
 * bytes as compact JSON; stored and echoed in the completion event. */
static int parse_metadata(const json_t *spec,
                          cq_job_t *job,
                          char *errstr,
                          size_t errstr_size)
{
        json_t *value = json_object_get(spec, "metadata");
        size_t size;

        if (!value || json_is_null(value))
                return 0;
        if (!json_is_object(value)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"metadata\" must be an object");
                return -1;
        }
        size = json_dumpb(value, NULL, 0, JSON_COMPACT);
        if (size > JOB_METADATA_MAX) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"metadata\" is %zu bytes as JSON, over "
                              "the limit of %zu",
                              size, JOB_METADATA_MAX);
                return -1;
        }
        job->metadata = json_incref(value);
        return 0;
}

/* solution: code judged as the final answer, with no LLM call. */
static int parse_solution(const json_t *spec,
                          cq_job_t *job,
                          char *errstr,
                          size_t errstr_size)
{
        const json_t *value = json_object_get(spec, "solution");

        if (!value || json_is_null(value))
                return 0;
        if (!json_is_string(value) || json_string_length(value) == 0 ||
            strlen(json_string_value(value)) != json_string_length(value)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"solution\" must be a non-empty "
                              "string");
                return -1;
        }
        if (dup_string(value, &job->solution)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

/* Fill job from spec, which job already owns; \p flags as
 * cq_job_from_json()'s. */
static int fill(cq_job_t *job, unsigned flags, char *errstr, size_t errstr_size)
{
        const json_t *spec = job->spec;
        const json_t *value;

        if (!json_is_object(spec)) {
                cq_errstr_set(errstr, errstr_size,
                              "job message must be a JSON object");
                return -1;
        }
        /* A misspelt field would silently run another experiment: refused
         * at every door (submit, intake, run), ignored only in a spec
         * coderq itself stored. */
        if (!(flags & CQ_JOB_F_STORED) &&
            check_known_keys(spec, top_known, "", errstr, errstr_size))
                return -1;
        value = json_object_get(spec, "version");
        if (value && !(json_is_integer(value) &&
                       json_integer_value(value) == CQ_JOB_VERSION)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"version\": unsupported version (this worker "
                    "understands version %d)",
                    CQ_JOB_VERSION);
                return -1;
        }

        value = json_object_get(spec, "job_id");
        if (!value) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"job_id\" is required");
                return -1;
        }
        if (!json_is_string(value)) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"job_id\" must be a string");
                return -1;
        }
        if (!id_is_valid(json_string_value(value), json_string_length(value))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"job_id\" must be 1 to %d printable ASCII "
                    "characters without spaces",
                    CQ_JOB_ID_MAX);
                return -1;
        }
        if (dup_string(value, &job->job_id))
                goto oom;

        value = json_object_get(spec, "prompt");
        if (!value) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"prompt\" is required");
                return -1;
        }
        if (!json_is_string(value) || json_string_length(value) == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "field \"prompt\" must be a non-empty string");
                return -1;
        }
        if (dup_string(value, &job->prompt))
                goto oom;

        if (parse_text(spec, "title", &job->title, errstr, errstr_size) ||
            parse_id(spec, "task_id", &job->task_id, errstr, errstr_size) ||
            parse_id(spec, "run_id", &job->run_id, errstr, errstr_size) ||
            parse_id(spec, "parent_job_id", &job->parent_job_id, errstr,
                     errstr_size) ||
            parse_text(spec, "model", &job->model, errstr, errstr_size) ||
            parse_text(spec, "system_prompt", &job->system_prompt, errstr,
                       errstr_size))
                return -1;
        if (job->parent_job_id &&
            strcmp(job->parent_job_id, job->job_id) == 0) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "field \"parent_job_id\" must differ from \"job_id\"");
                return -1;
        }

        if (get_opt_string(spec, "backend", "backend", &value, errstr,
                           errstr_size))
                return -1;
        if (value) {
                if (strcmp(json_string_value(value), "local") != 0 &&
                    strcmp(json_string_value(value), "e2b") != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "field \"backend\" must be \"local\" or "
                                      "\"e2b\"");
                        return -1;
                }
                if (dup_string(value, &job->backend))
                        goto oom;
        }
        if (get_opt_string(spec, "provider", "provider", &value, errstr,
                           errstr_size))
                return -1;
        if (value) {
                if (strcmp(json_string_value(value), "openai") != 0 &&
                    strcmp(json_string_value(value), "anthropic") != 0) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"provider\" must be \"openai\" or "
                            "\"anthropic\"");
                        return -1;
                }
                if (dup_string(value, &job->provider))
                        goto oom;
        }

        if (parse_files(spec, job, errstr, errstr_size) ||
            parse_tests(spec, job, errstr, errstr_size) ||
            parse_limits(spec, &job->limits, errstr, errstr_size) ||
            parse_memory(spec, &job->memory, errstr, errstr_size) ||
            parse_sampling(spec, &job->sampling, errstr, errstr_size) ||
            parse_retry(spec, job, errstr, errstr_size) ||
            parse_samples(spec, job, errstr, errstr_size) ||
            parse_queue(spec, job, errstr, errstr_size) ||
            parse_metadata(spec, job, errstr, errstr_size) ||
            parse_solution(spec, job, errstr, errstr_size))
                return -1;

        value = json_object_get(spec, "priority");
        if (value && !json_is_null(value)) {
                if (!json_is_integer(value) ||
                    json_integer_value(value) < JOB_PRIORITY_MIN ||
                    json_integer_value(value) > JOB_PRIORITY_MAX) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "field \"priority\" must be an integer from "
                            "%d to %d",
                            JOB_PRIORITY_MIN, JOB_PRIORITY_MAX);
                        return -1;
                }
                job->priority = (long)json_integer_value(value);
        }
        return 0;
oom:
        cq_errstr_set(errstr, errstr_size, "out of memory");
        return -1;
}

cq_err_t cq_job_parse(const char *data,
                      size_t len,
                      size_t max,
                      cq_job_t *job,
                      char *errstr,
                      size_t errstr_size)
{
        json_error_t jerr;
        json_t *spec;

        if (max == 0)
                max = CQ_JOB_DEFAULT_MAX;
        if (len > max) {
                cq_errstr_set(errstr, errstr_size,
                              "job message is %zu bytes, over the limit of %zu",
                              len, max);
                return CQ_ERR_TOO_LARGE;
        }
        /* No JSON_ALLOW_NUL: a NUL inside a job string is never legitimate
         * and would be cut by every C consumer downstream. */
        spec = json_loadb(data, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                          &jerr);
        if (!spec) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "job message is not valid JSON: %s (line %d, column "
                    "%d)",
                    jerr.text, jerr.line, jerr.column);
                return CQ_ERR_FATAL;
        }
        job->spec = spec; /* job owns it now */
        if (fill(job, 0, errstr, errstr_size)) {
                cq_job_release(job);
                return CQ_ERR_FATAL;
        }
        return CQ_OK;
}

cq_err_t cq_job_from_json(const json_t *spec,
                          unsigned flags,
                          cq_job_t *job,
                          char *errstr,
                          size_t errstr_size)
{
        if (!json_is_object(spec)) {
                cq_errstr_set(errstr, errstr_size,
                              "job message must be a JSON object");
                return CQ_ERR_FATAL;
        }
        /* A private copy: the caller may change or free its document. */
        job->spec = json_deep_copy(spec);
        if (!job->spec) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return CQ_ERR_FATAL;
        }
        if (fill(job, flags, errstr, errstr_size)) {
                cq_job_release(job);
                return CQ_ERR_FATAL;
        }
        return CQ_OK;
}

/* ROOT followed by SUFFIX, or, when that would pass CQ_JOB_ID_MAX, the
 * start of ROOT, '~' and the first 16 hex digits of ROOT's SHA-256 before
 * SUFFIX: unique, and the same for the same ROOT. */
static int
derived_id(const char *root, const char *suffix, char *out, size_t size)
{
        char hex[65];
        size_t len = strlen(root), slen = strlen(suffix), keep;

        if (size < CQ_JOB_ID_MAX + 1 || len == 0)
                return -1;
        if (len + slen <= CQ_JOB_ID_MAX) {
                memcpy(out, root, len);
                memcpy(out + len, suffix, slen + 1);
                return 0;
        }
        /* "~" + 16 hex digits tell long roots with one start apart */
        cq_sha256_hex(root, len, hex);
        keep = CQ_JOB_ID_MAX - slen - 17;
        snprintf(out, size, "%.*s~%.16s%s", (int)keep, root, hex, suffix);
        return 0;
}

int cq_job_retry_id(const char *root, long attempt, char *out, size_t size)
{
        char suffix[16];

        if (attempt < 2 || attempt > JOB_RUN_ATTEMPT_MAX)
                return -1;
        snprintf(suffix, sizeof(suffix), "~r%ld", attempt);
        return derived_id(root, suffix, out, size);
}

int cq_job_sample_id(const char *problem, long index, char *out, size_t size)
{
        char suffix[16];

        if (index < 0 || index >= JOB_SAMPLES_MAX)
                return -1;
        snprintf(suffix, sizeof(suffix), "~s%ld", index);
        return derived_id(problem, suffix, out, size);
}

/* The problem's seed plus \p index, wrapping at 64 bits as unsigned
 * arithmetic does (a seed near the top still gives every sample its own). */
static long long sample_seed(const cq_job_t *job, long index)
{
        uint64_t seed = (uint64_t)job->sampling.seed + (uint64_t)index;

        return (long long)seed;
}

json_t *cq_job_sample_spec(const cq_job_t *job, long index)
{
        char id[CQ_JOB_ID_MAX + 1];
        json_t *spec;

        if (cq_job_sample_id(job->job_id, index, id, sizeof(id)))
                return NULL;
        spec = json_deep_copy(job->spec);
        if (!spec)
                return NULL;
        (void)json_object_del(spec, "samples"); /* absent: no error */
        if (json_object_set_new(spec, "job_id", json_string(id)) ||
            json_object_set_new(spec, "problem_id", json_string(job->job_id)) ||
            json_object_set_new(spec, "sample_index", json_integer(index)) ||
            (job->sampling.has_seed &&
             json_object_set_new(spec, "seed",
                                 json_integer(sample_seed(job, index))))) {
                json_decref(spec);
                return NULL;
        }
        return spec;
}
