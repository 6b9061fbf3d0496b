/* SPDX-License-Identifier: MIT */
/* jobfile.c - a `coderq submit` FILE told apart (JSON Lines, a JSON array,
 * one JSON object over several lines) and cut into job messages. jansson
 * decides whether the whole text is one JSON value and says where it is
 * not; the items of an array are then cut from text known to be valid
 * JSON, so their bytes stay as written. */
#include "coderq/cli/jobfile.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static bool json_space(char c)
{
        return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Blank as a line of JSON Lines may be: what isspace() takes in "C". */
static bool line_blank(const char *s, size_t len)
{
        size_t i;

        for (i = 0; i < len; i++)
                if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' &&
                    s[i] != '\n' && s[i] != '\f' && s[i] != '\v')
                        return false;
        return true;
}

void cq_jobfile_init(cq_jobfile_t *jf) { memset(jf, 0, sizeof(*jf)); }

void cq_jobfile_release(cq_jobfile_t *jf)
{
        size_t i;

        for (i = 0; i < jf->n; i++)
                free(jf->jobs[i].text);
        free(jf->jobs);
        cq_jobfile_init(jf);
}

/* Takes ownership of text, even on failure. */
static int add_job(cq_jobfile_t *jf, char *text, size_t len, long line)
{
        cq_jobfile_job_t *job;

        if (!text)
                return -1;
        if (jf->n == jf->alloc) {
                size_t alloc = jf->alloc ? jf->alloc * 2 : 64;
                cq_jobfile_job_t *v = realloc(jf->jobs, alloc * sizeof(*v));

                if (!v) {
                        free(text);
                        return -1;
                }
                jf->jobs = v;
                jf->alloc = alloc;
        }
        job = &jf->jobs[jf->n++];
        job->text = text;
        job->len = len;
        job->line = line;
        return 0;
}

static char *copy(const char *s, size_t len)
{
        char *text = malloc(len + 1);

        if (text) {
                memcpy(text, s, len);
                text[len] = '\0';
        }
        return text;
}

/* Whether the line \p s is a JSON object on its own. */
static bool object_alone(const char *s, size_t len)
{
        json_t *doc = json_loadb(s, len, JSON_REJECT_DUPLICATES, NULL);
        bool object = json_is_object(doc);

        json_decref(doc);
        return object;
}

/* The next line of data[*posp..]: its start and length without the line
 * end; *posp moves past it. */
static const char *
next_line(const char *data, size_t len, size_t *posp, size_t *linelenp)
{
        const char *line = data + *posp;
        const char *nl = memchr(line, '\n', len - *posp);
        size_t n = nl ? (size_t)(nl - line) : len - *posp;

        *posp += nl ? n + 1 : n;
        if (n > 0 && line[n - 1] == '\r')
                n--;
        *linelenp = n;
        return line;
}

/* Whether a text that is not one JSON value reads as JSON Lines: its
 * first non-blank line, or a line starting with '{', is an object. */
static bool reads_as_lines(const char *data, size_t len)
{
        size_t pos = 0, n;
        bool first = true;

        while (pos < len) {
                const char *line = next_line(data, len, &pos, &n);

                if (line_blank(line, n))
                        continue;
                if ((first || line[0] == '{') && object_alone(line, n))
                        return true;
                first = false;
        }
        return false;
}

static int cut_lines(const char *data, size_t len, cq_jobfile_t *jf)
{
        size_t pos = 0, n;
        long lineno = 0;

        while (pos < len) {
                const char *line = next_line(data, len, &pos, &n);

                lineno++;
                if (line_blank(line, n))
                        continue;
                if (add_job(jf, copy(line, n), n, lineno))
                        return -1;
        }
        return 0;
}

/* Where a scan of JSON text stands as to strings. */
typedef struct json_scan {
        bool in_string, escaped;
} json_scan_t;

/* Step over \p c; whether it stands outside every string (a quote is
 * the string's). */
static bool scan_outside(json_scan_t *scan, char c)
{
        if (scan->in_string) {
                if (scan->escaped)
                        scan->escaped = false;
                else if (c == '\\')
                        scan->escaped = true;
                else if (c == '"')
                        scan->in_string = false;
                return false;
        }
        if (c == '"') {
                scan->in_string = true;
                return false;
        }
        return true;
}

/* Just past the JSON value that starts at data[i], in valid JSON. */
static size_t value_end(const char *data, size_t len, size_t i)
{
        json_scan_t scan = {false, false};
        size_t depth = 0;

        for (; i < len; i++) {
                char c = data[i];

                if (!scan_outside(&scan, c)) {
                        /* a string item ends with its quote */
                        if (depth == 0 && c == '"' && !scan.in_string)
                                return i + 1;
                        continue;
                }
                if (c == '{' || c == '[') {
                        depth++;
                } else if (c == '}' || c == ']') {
                        /* a scalar item ends at its array's ']' */
                        if (depth == 0)
                                return i;
                        if (--depth == 0)
                                return i + 1;
                } else if (depth == 0 && (c == ',' || json_space(c))) {
                        return i;
                }
        }
        return i;
}

/* data[from..to) without the whitespace outside its strings. */
static char *squeeze(const char *data, size_t from, size_t to, size_t *lenp)
{
        char *text = malloc(to - from + 1);
        json_scan_t scan = {false, false};
        size_t i, n = 0;

        if (!text)
                return NULL;
        for (i = from; i < to; i++) {
                if (scan_outside(&scan, data[i]) && json_space(data[i]))
                        continue;
                text[n++] = data[i];
        }
        text[n] = '\0';
        *lenp = n;
        return text;
}

/* Lines counted up to data[to], from where the last count stopped. */
typedef struct line_counter {
        size_t pos;
        long line;
} line_counter_t;

static long line_at(line_counter_t *lc, const char *data, size_t to)
{
        for (; lc->pos < to; lc->pos++)
                if (data[lc->pos] == '\n')
                        lc->line++;
        return lc->line;
}

static size_t skip_space(const char *data, size_t len, size_t i)
{
        while (i < len && json_space(data[i]))
                i++;
        return i;
}

/* One value from data[start], squeezed, as a job. */
static int cut_value(const char *data,
                     size_t len,
                     size_t start,
                     size_t *endp,
                     line_counter_t *lc,
                     cq_jobfile_t *jf)
{
        size_t n = 0;
        char *text;

        *endp = value_end(data, len, start);
        text = squeeze(data, start, *endp, &n);
        return add_job(jf, text, n, line_at(lc, data, start));
}

/* The items of the array at data[i] (text known to be valid JSON). */
static int cut_array(const char *data, size_t len, size_t i, cq_jobfile_t *jf)
{
        line_counter_t lc = {0, 1};

        i = skip_space(data, len, i + 1);
        while (i < len && data[i] != ']') {
                if (cut_value(data, len, i, &i, &lc, jf))
                        return -1;
                i = skip_space(data, len, i);
                if (i < len && data[i] == ',')
                        i = skip_space(data, len, i + 1);
        }
        return 0;
}

cq_err_t cq_jobfile_parse(const char *data,
                          size_t len,
                          cq_jobfile_t *jf,
                          char *errstr,
                          size_t errstr_size)
{
        json_error_t jerr;
        json_t *doc;
        size_t start, end;
        line_counter_t lc = {0, 1};
        int rc;

        /* A UTF-8 byte order mark (editors on Windows) is no job's. */
        if (len >= 3 && memcmp(data, "\xef\xbb\xbf", 3) == 0) {
                data += 3;
                len -= 3;
        }
        start = skip_space(data, len, 0);
        doc = start < len ? json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr)
                          : NULL;
        if (json_is_array(doc)) {
                jf->form = CQ_JOBFILE_ARRAY;
                rc = cut_array(data, len, start, jf);
        } else if (json_is_object(doc) &&
                   memchr(data + start, '\n',
                          value_end(data, len, start) - start)) {
                jf->form = CQ_JOBFILE_OBJECT;
                rc = cut_value(data, len, start, &end, &lc, jf);
        } else if (doc || start == len || reads_as_lines(data, len)) {
                jf->form = CQ_JOBFILE_LINES;
                rc = cut_lines(data, len, jf);
        } else {
                cq_errstr_set(errstr, errstr_size, "line %d column %d: %s",
                              jerr.line, jerr.column, jerr.text);
                cq_jobfile_release(jf);
                return CQ_ERR_FATAL;
        }
        json_decref(doc);
        if (rc) {
                cq_jobfile_release(jf);
                return CQ_ERR_TOO_LARGE;
        }
        return CQ_OK;
}
