/* SPDX-License-Identifier: MIT */
/* intake.c - the jobs topic into PostgreSQL. Messages are handled strictly
 * in order: each one is either upserted or acknowledged by the DLQ before
 * its offset (+1) is stored, so auto-commit never passes a message that is
 * in neither place. While PostgreSQL or the DLQ is unavailable, or the
 * queued backlog is over its bound, all assigned partitions are paused
 * (tracked here: 2.0.2 does not clear an application pause on revoke) and
 * the consumer keeps polling. */
#include "coderq/consumer/kafka.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/job.h"
#include "coderq/common/log.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/probe.h"
#include "coderq/common/util.h"
#include "kafka_int.h"

#define FIFO_HIGH               500 /* pause above this many unhandled messages */
#define BACKOFF_FIRST_MS        100
#define BACKOFF_MAX_MS          2000
#define STORE_FATAL_MAX         3   /* refusals by PostgreSQL before the DLQ */
#define WINDOW                  256 /* messages handled ahead of the oldest */
#define FINAL_COMMIT_MS         15000 /* retries of the shutdown commit, in all */
#define FINAL_COMMIT_BACKOFF_MS 250
#define BATCH_MAX               64        /* jobs upserted in one statement */
#define BATCH_BYTES             (8 << 20) /* and their messages' bytes */
/* A problem's samples are stored by one statement: at most this many
 * bytes of message times samples, so one message cannot make the intake
 * build gigabytes. */
#define FANOUT_MAX_BYTES ((size_t)64 << 20)

typedef struct pending {
        rd_kafka_message_t *msg;
        cq_dr_t *dr;     /* DLQ delivery in flight */
        char *error;     /* why it goes to the DLQ, once decided */
        int store_fatal; /* consecutive refusals by PostgreSQL */
        bool done;       /* upserted, or acknowledged by the DLQ (and its
                            answer, when it has one, by the results topic) */
        bool dlq_done;   /* the DLQ acknowledged it */
        /* The "rejected" completion event of a message whose job id can
         * be read; NULL when it has none (or must not have one: its id
         * names a stored job). */
        char *answer;
        char answer_key[CQ_JOB_ID_MAX + 1];
        bool answer_made; /* answer decided (made, or none) */
        bool no_answer;   /* its id belongs to a stored job: no event */
        cq_dr_t *answer_dr;
        bool answer_done;
} pending_t;

struct cq_intake {
        cq_kafka_opts_t opts;
        cq_store_opts_t store_opts;
        cq_producer_t *prod; /* borrowed */
        rd_kafka_t *rk;
        cq_store_t *store;     /* lazily connected */
        cq_backlog_t *backlog; /* lazily made */
        pending_t *fifo;
        size_t head, n, cap;                     /* fifo[head .. head+n) */
        rd_kafka_topic_partition_list_t *paused; /* what we paused */
        bool pg_down, dlq_down, backlog_over;
        int64_t retry_at;
        int failures; /* in a row, since the last recovery */
        int64_t next_backlog_check;
        long backlog_est;
        bool ran;
        bool auth_failed; /* stopped by an authentication or TLS failure */
        char errmsg[512];
        /* stats, read from any thread */
        atomic_ullong received, upserted, duplicates, dlq, stored, pg_retries,
            dlq_retries, pauses, backlog_pauses, batches, batched, answered;
        atomic_bool st_paused, st_pg_down;
        atomic_long st_backlog;
        atomic_int st_assigned;
        atomic_llong st_beat_ms; /* the poll loop's last round */
        /* the consumer lag per assigned partition, measured every
         * LAG_EVERY_MS by the intake's thread */
        pthread_mutex_t lag_lock; /* guards lag and nlag */
        cq_intake_lag_t lag[CQ_INTAKE_LAG_MAX];
        size_t nlag;
        int64_t next_lag;
};

/* How often the intake measures its lag: the high watermarks are the
 * ones fetch responses brought, so this costs no request to the broker. */
#define LAG_EVERY_MS 2000

static void CQ_PRINTF(2, 3) set_error(cq_intake_t *intake, const char *fmt, ...)
{
        va_list ap;

        if (intake->errmsg[0])
                return; /* the first error is the root cause */
        va_start(ap, fmt);
        vsnprintf(intake->errmsg, sizeof(intake->errmsg), fmt, ap);
        va_end(ap);
}

static void pending_release(cq_intake_t *intake, pending_t *p)
{
        if (p->msg)
                rd_kafka_message_destroy(p->msg);
        cq_dr_put(intake->prod, &p->dr);
        cq_dr_put(intake->prod, &p->answer_dr);
        free(p->error);
        free(p->answer);
        memset(p, 0, sizeof(*p));
}

static void fifo_pop(cq_intake_t *intake)
{
        pending_release(intake, &intake->fifo[intake->head]);
        intake->head++;
        intake->n--;
        if (intake->n == 0)
                intake->head = 0;
}

/* Forget every message not yet handled: their offsets were not stored, so
 * they are delivered again (here or to the partition's next owner). */
static void fifo_drop(cq_intake_t *intake)
{
        while (intake->n > 0)
                fifo_pop(intake);
}

static int fifo_push(cq_intake_t *intake, rd_kafka_message_t *msg)
{
        if (intake->head + intake->n == intake->cap) {
                if (intake->head > 0) {
                        memmove(intake->fifo, intake->fifo + intake->head,
                                intake->n * sizeof(*intake->fifo));
                        intake->head = 0;
                } else {
                        size_t cap = intake->cap ? intake->cap * 2 : 64;
                        pending_t *v = realloc(intake->fifo, cap * sizeof(*v));

                        if (!v)
                                return -1;
                        intake->fifo = v;
                        intake->cap = cap;
                }
        }
        memset(&intake->fifo[intake->head + intake->n], 0, sizeof(pending_t));
        intake->fifo[intake->head + intake->n].msg = msg;
        intake->n++;
        return 0;
}

static void unpause(cq_intake_t *intake, rd_kafka_t *rk)
{
        if (!intake->paused)
                return;
        /* Resume exactly what we paused: resuming a partition that was not
         * paused can rewind it in 2.0.2 (#4636). */
        rd_kafka_resume_partitions(rk, intake->paused);
        rd_kafka_topic_partition_list_destroy(intake->paused);
        intake->paused = NULL;
        atomic_store(&intake->st_paused, false);
}

static void on_rebalance(rd_kafka_t *rk,
                         rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
        cq_intake_t *intake = opaque;
        rd_kafka_resp_err_t aerr;

        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                aerr = rd_kafka_assign(rk, parts);
                if (aerr)
                        cq_log_kv(CQ_LOG_ERROR, "could not assign partitions",
                                  "error", rd_kafka_err2str(aerr), NULL);
                atomic_store(&intake->st_assigned, parts->cnt);
                cq_log_json(CQ_LOG_INFO, NULL, "intake assigned %d partitions",
                            parts->cnt);
                return;
        }
        if (err != RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS)
                cq_log_kv(CQ_LOG_ERROR, "rebalance error: unassigning", "error",
                          rd_kafka_err2str(err), NULL);
        /* Eager protocol: everything is revoked. Unhandled messages go
         * back to Kafka (not stored); stored offsets are committed by the
         * unassign (auto-commit) unless the assignment was lost. */
        fifo_drop(intake);
        unpause(intake, rk);
        aerr = rd_kafka_assign(rk, NULL);
        if (aerr)
                cq_log_kv(CQ_LOG_ERROR, "could not unassign partitions",
                          "error", rd_kafka_err2str(aerr), NULL);
        atomic_store(&intake->st_assigned, 0);
}

cq_intake_t *cq_intake_new(const cq_kafka_opts_t *opts,
                           cq_producer_t *prod,
                           char *errstr,
                           size_t errstr_size)
{
        cq_intake_t *intake = calloc(1, sizeof(*intake));
        rd_kafka_conf_t *conf = NULL;
        rd_kafka_topic_partition_list_t *topics = NULL;
        rd_kafka_resp_err_t err;
        char reason[512];

        if (!intake) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create intake: out of memory");
                return NULL;
        }
        pthread_mutex_init(&intake->lag_lock, NULL);
        intake->opts = *opts;
        if (opts->store)
                intake->store_opts = *opts->store;
        else
                cq_store_opts_init(&intake->store_opts);
        intake->store_opts.reconnect_ms = opts->pg_reconnect_ms;
        intake->prod = prod;
        atomic_store(&intake->st_backlog, -1);

        {
                char commit[32], session[32], heartbeat[32], poll[32];
                /* Bound what is prefetched: a message over the job cap is
                 * still fetched whole (it must reach the DLQ unchanged). */
                const char *const defaults[] = {"auto.commit.interval.ms",
                                                commit,
                                                "session.timeout.ms",
                                                session,
                                                "heartbeat.interval.ms",
                                                heartbeat,
                                                "max.poll.interval.ms",
                                                poll,
                                                "queued.max.messages.kbytes",
                                                "65536",
                                                NULL};
                /* Correctness: offsets stored only after PostgreSQL has
                 * the job, committed by auto-commit; a new group starts
                 * at the beginning; the eager range assignor. */
                const char *const mandatory[] = {
                    "group.id",
                    opts->group,
                    "partition.assignment.strategy",
                    "range",
                    "enable.auto.offset.store",
                    "false",
                    "enable.auto.commit",
                    "true",
                    "auto.offset.reset",
                    "earliest",
                    "enable.partition.eof",
                    "false",
                    NULL};

                snprintf(commit, sizeof(commit), "%d",
                         opts->commit_interval_ms);
                snprintf(session, sizeof(session), "%d",
                         opts->session_timeout_ms);
                snprintf(heartbeat, sizeof(heartbeat), "%d",
                         opts->session_timeout_ms / 3);
                snprintf(poll, sizeof(poll), "%d", opts->max_poll_interval_ms);
                conf = cq_kafka_conf_new(opts, defaults, mandatory, errstr,
                                         errstr_size);
                if (!conf)
                        goto fail;
        }
        rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
        rd_kafka_conf_set_opaque(conf, intake);
        intake->rk =
            rd_kafka_new(RD_KAFKA_CONSUMER, conf, reason, sizeof(reason));
        if (!intake->rk) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create Kafka consumer: %s", reason);
                goto fail;
        }
        conf = NULL; /* rd_kafka_t owns it now */
        rd_kafka_poll_set_consumer(intake->rk);
        topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, opts->topic_jobs,
                                          RD_KAFKA_PARTITION_UA);
        err = rd_kafka_subscribe(intake->rk, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (err) {
                cq_errstr_set(errstr, errstr_size,
                              "could not subscribe to \"%s\": %s",
                              opts->topic_jobs, rd_kafka_err2str(err));
                goto fail;
        }
        return intake;
fail:
        if (conf)
                rd_kafka_conf_destroy(conf);
        cq_intake_destroy(&intake);
        return NULL;
}

void cq_intake_destroy(cq_intake_t **intakep)
{
        cq_intake_t *intake = *intakep;

        if (!intake)
                return;
        fifo_drop(intake);
        free(intake->fifo);
        if (intake->paused)
                rd_kafka_topic_partition_list_destroy(intake->paused);
        if (intake->rk) {
                if (!intake->ran)
                        rd_kafka_consumer_close(intake->rk);
                rd_kafka_destroy(intake->rk);
        }
        cq_store_destroy(&intake->store);
        cq_backlog_destroy(&intake->backlog);
        pthread_mutex_destroy(&intake->lag_lock);
        free(intake);
        *intakep = NULL;
}

const char *cq_intake_errmsg(const cq_intake_t *intake)
{
        return intake->errmsg;
}

bool cq_intake_auth_failed(const cq_intake_t *intake)
{
        return intake->auth_failed;
}

void cq_intake_stats(cq_intake_t *intake, cq_intake_stats_t *stats)
{
        stats->received = atomic_load(&intake->received);
        stats->upserted = atomic_load(&intake->upserted);
        stats->duplicates = atomic_load(&intake->duplicates);
        stats->dlq = atomic_load(&intake->dlq);
        stats->stored = atomic_load(&intake->stored);
        stats->batches = atomic_load(&intake->batches);
        stats->batched = atomic_load(&intake->batched);
        stats->pg_retries = atomic_load(&intake->pg_retries);
        stats->dlq_retries = atomic_load(&intake->dlq_retries);
        stats->answered = atomic_load(&intake->answered);
        stats->pauses = atomic_load(&intake->pauses);
        stats->backlog_pauses = atomic_load(&intake->backlog_pauses);
        stats->paused = atomic_load(&intake->st_paused);
        stats->pg_down = atomic_load(&intake->st_pg_down);
        stats->backlog = atomic_load(&intake->st_backlog);
        stats->assigned = atomic_load(&intake->st_assigned);
        stats->beat_ms = atomic_load(&intake->st_beat_ms);
}

size_t cq_intake_lag(cq_intake_t *intake, cq_intake_lag_t *lag, size_t max)
{
        size_t n;

        pthread_mutex_lock(&intake->lag_lock);
        n = intake->nlag < max ? intake->nlag : max;
        memcpy(lag, intake->lag, n * sizeof(*lag));
        pthread_mutex_unlock(&intake->lag_lock);
        return n;
}

/* Each assigned partition's high watermark minus the consumer's position
 * (the next offset it fetches); partitions without a position yet are
 * left out. */
static void measure_lag(cq_intake_t *intake, int64_t now)
{
        rd_kafka_topic_partition_list_t *parts = NULL;
        cq_intake_lag_t lag[CQ_INTAKE_LAG_MAX];
        size_t n = 0;
        int i;

        if (now < intake->next_lag)
                return;
        intake->next_lag = now + LAG_EVERY_MS;
        if (rd_kafka_assignment(intake->rk, &parts) != 0 || !parts)
                return;
        if (parts->cnt > 0 && rd_kafka_position(intake->rk, parts) == 0) {
                for (i = 0; i < parts->cnt && n < CQ_INTAKE_LAG_MAX; i++) {
                        const rd_kafka_topic_partition_t *p = &parts->elems[i];
                        int64_t lo = -1, hi = -1;

                        if (p->offset < 0 ||
                            rd_kafka_get_watermark_offsets(intake->rk, p->topic,
                                                           p->partition, &lo,
                                                           &hi) != 0 ||
                            hi < 0)
                                continue;
                        lag[n].partition = p->partition;
                        lag[n].lag = hi > p->offset ? hi - p->offset : 0;
                        n++;
                }
        }
        rd_kafka_topic_partition_list_destroy(parts);
        pthread_mutex_lock(&intake->lag_lock);
        memcpy(intake->lag, lag, n * sizeof(*lag));
        intake->nlag = n;
        pthread_mutex_unlock(&intake->lag_lock);
}

static void store_offset(cq_intake_t *intake, const rd_kafka_message_t *msg)
{
        rd_kafka_topic_partition_list_t *list =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_t *part;
        rd_kafka_resp_err_t err;

        part = rd_kafka_topic_partition_list_add(
            list, rd_kafka_topic_name(msg->rkt), msg->partition);
        part->offset = msg->offset + 1; /* the next message to read */
        err = rd_kafka_offsets_store(intake->rk, list);
        if (!err)
                err = part->err;
        rd_kafka_topic_partition_list_destroy(list);
        if (!err) {
                atomic_fetch_add(&intake->stored, 1);
                return;
        }
        /* __STATE: revoked meanwhile; the next owner redoes it, which the
         * upsert makes harmless. */
        if (err != RD_KAFKA_RESP_ERR__STATE)
                cq_log_kv(CQ_LOG_WARN, "could not store offset", "error",
                          rd_kafka_err2str(err), NULL);
}

/* The intake is one thread waiting on its own: no jitter. */
static void backoff(cq_intake_t *intake)
{
        intake->retry_at =
            cq_now_ms() + cq_backoff_ms(++intake->failures, BACKOFF_FIRST_MS,
                                        BACKOFF_MAX_MS, CQ_JITTER_NONE);
}

static void recovered(cq_intake_t *intake)
{
        intake->failures = 0;
        intake->retry_at = 0;
}

static void set_pg_down(cq_intake_t *intake, bool down)
{
        if (down != intake->pg_down)
                cq_log_json(down ? CQ_LOG_WARN : CQ_LOG_INFO, NULL,
                            down ? "intake: PostgreSQL unavailable, pausing"
                                 : "intake: PostgreSQL is back");
        intake->pg_down = down;
        atomic_store(&intake->st_pg_down, down);
}

/* A readable copy of a key for an error header: at most 64 bytes,
 * non-printable bytes as '?'. */
static void printable(const void *data, size_t len, char *out, size_t size)
{
        const unsigned char *p = data;
        size_t i, n = len < size - 1 ? len : size - 1;

        if (n > 64)
                n = 64;
        for (i = 0; i < n; i++)
                out[i] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
        out[n] = '\0';
}

/* Decide whether a message is a valid job; NULL when it is, else the
 * reason (caller frees). *job is filled when valid. */
static char *validate(cq_intake_t *intake,
                      const rd_kafka_message_t *msg,
                      cq_job_t *job,
                      bool *oomp)
{
        char errstr[512], key[80], *reason;
        const char *data = msg->payload ? msg->payload : "";
        cq_err_t err;

        *oomp = false;
        err = cq_job_parse(data, msg->len, intake->opts.job_max, job, errstr,
                           sizeof(errstr));
        if (err == CQ_OK) {
                /* A key, when given, is the job id
                 * (docs/JOBS.md#kafka-topics: key = job_id); a disagreeing
                 * one means a confused producer. */
                if (msg->key_len > 0 &&
                    (msg->key_len != strlen(job->job_id) ||
                     memcmp(msg->key, job->job_id, msg->key_len) != 0)) {
                        printable(msg->key, msg->key_len, key, sizeof(key));
                        snprintf(errstr, sizeof(errstr),
                                 "message key \"%s\" does not match field "
                                 "\"job_id\"",
                                 key);
                        cq_job_release(job);
                } else if (job->parent_job_id &&
                           strcmp(job->parent_job_id, job->job_id) == 0) {
                        snprintf(errstr, sizeof(errstr),
                                 "field \"parent_job_id\" must differ from "
                                 "\"job_id\"");
                        cq_job_release(job);
                } else if (job->samples > 0 &&
                           msg->len * (size_t)job->samples > FANOUT_MAX_BYTES) {
                        snprintf(errstr, sizeof(errstr),
                                 "field \"samples\": %ld samples of a "
                                 "%zu-byte message are over the %zu MiB a "
                                 "problem may fan out into",
                                 job->samples, msg->len,
                                 FANOUT_MAX_BYTES >> 20);
                        cq_job_release(job);
                } else {
                        return NULL;
                }
        }
        reason = strdup(errstr);
        if (!reason)
                *oomp = true;
        return reason;
}

static rd_kafka_headers_t *dlq_headers(const pending_t *p)
{
        const rd_kafka_message_t *msg = p->msg;
        rd_kafka_headers_t *orig = NULL, *hdrs;
        char num[32];

        /* Keep the producer's own headers: the message is unchanged. */
        if (rd_kafka_message_headers(msg, &orig) == RD_KAFKA_RESP_ERR_NO_ERROR)
                hdrs = rd_kafka_headers_copy(orig);
        else
                hdrs = rd_kafka_headers_new(4);
        rd_kafka_header_add(hdrs, "error", -1, p->error, -1);
        rd_kafka_header_add(hdrs, "source_topic", -1,
                            rd_kafka_topic_name(msg->rkt), -1);
        snprintf(num, sizeof(num), "%" PRId32, msg->partition);
        rd_kafka_header_add(hdrs, "source_partition", -1, num, -1);
        snprintf(num, sizeof(num), "%" PRId64, msg->offset);
        rd_kafka_header_add(hdrs, "source_offset", -1, num, -1);
        return hdrs;
}

typedef enum step { STEP_DONE, STEP_WAIT, STEP_BLOCKED } step_t;

/* The outcome of a tracked delivery in flight (*drp non-NULL): STEP_WAIT
 * until its report, then STEP_DONE (*drp released) or, when it failed,
 * STEP_BLOCKED with a backoff, so the caller sends it again. */
static step_t tracked(cq_intake_t *intake, cq_dr_t **drp, const char *what)
{
        rd_kafka_resp_err_t err;
        rd_kafka_msg_status_t status;

        if (!cq_dr_done(intake->prod, *drp, &err, &status))
                return STEP_WAIT;
        cq_dr_put(intake->prod, drp);
        if (!err) {
                if (intake->dlq_down)
                        cq_log_info("intake: the DLQ is back");
                intake->dlq_down = false;
                recovered(intake);
                return STEP_DONE;
        }
        cq_log_kv(CQ_LOG_WARN, what, "error", rd_kafka_err2str(err), NULL);
        atomic_fetch_add(&intake->dlq_retries, 1);
        intake->dlq_down = true;
        backoff(intake);
        return STEP_BLOCKED;
}

/* Produce one tracked message (*hdrsp taken); STEP_WAIT, or STEP_BLOCKED
 * with a backoff when the producer refused it. */
static step_t send_tracked(cq_intake_t *intake,
                           const char *topic,
                           const void *key,
                           size_t keylen,
                           const void *value,
                           size_t len,
                           rd_kafka_headers_t **hdrsp,
                           cq_dr_t **drp)
{
        rd_kafka_resp_err_t err;

        *drp = cq_dr_new(intake->prod);
        if (!*drp) {
                if (*hdrsp)
                        rd_kafka_headers_destroy(*hdrsp);
                *hdrsp = NULL;
                backoff(intake);
                return STEP_BLOCKED;
        }
        err = cq_producer_send(intake->prod, topic, key, keylen, value, len,
                               hdrsp, *drp);
        if (err) {
                cq_dr_put(intake->prod, drp);
                cq_log_kv(CQ_LOG_WARN, "could not produce: retrying", "topic",
                          topic, "error", rd_kafka_err2str(err), NULL);
                atomic_fetch_add(&intake->dlq_retries, 1);
                intake->dlq_down = true;
                backoff(intake);
                return STEP_BLOCKED;
        }
        return STEP_WAIT;
}

/* The job id a refused message names, when it can be read: its "job_id"
 * when that is a valid id, else its key when that is one. */
static bool readable_id(const rd_kafka_message_t *msg, char *out, size_t size)
{
        json_t *doc = msg->payload ? json_loadb(msg->payload, msg->len,
                                                JSON_DISABLE_EOF_CHECK, NULL)
                                   : NULL;
        const json_t *id = json_object_get(doc, "job_id");
        bool ok = false;

        if (json_is_string(id) &&
            cq_job_id_valid(json_string_value(id), json_string_length(id)) &&
            json_string_length(id) < size) {
                memcpy(out, json_string_value(id), json_string_length(id) + 1);
                ok = true;
        } else if (msg->key_len > 0 && msg->key_len < size &&
                   cq_job_id_valid(msg->key, msg->key_len)) {
                memcpy(out, msg->key, msg->key_len);
                out[msg->key_len] = '\0';
                ok = true;
        }
        json_decref(doc);
        return ok;
}

/* The "rejected" completion event of \p p (docs/JOBS.md#completion-events),
 * so that whoever waits on its job id is answered; p->answer stays NULL
 * when its id cannot be read or belongs to a stored job. 0, or -1 when
 * out of memory. */
static int make_answer(cq_intake_t *intake, pending_t *p)
{
        const rd_kafka_message_t *msg = p->msg;
        json_t *event;

        if (p->answer_made)
                return 0;
        if (!p->no_answer &&
            readable_id(msg, p->answer_key, sizeof(p->answer_key))) {
                event = json_pack(
                    "{s:s, s:s, s:s, s:s, s:n, s:s, s:{s:s, s:i, s:I}}",
                    "job_id", p->answer_key, "status", "rejected", "reason",
                    p->error, "reason_code", "invalid_job", "verdict", "worker",
                    intake->opts.client_id ? intake->opts.client_id : "coderq",
                    "source", "topic", rd_kafka_topic_name(msg->rkt),
                    "partition", (int)msg->partition, "offset",
                    (json_int_t)msg->offset);
                p->answer = event ? json_dumps(event, JSON_COMPACT) : NULL;
                json_decref(event);
                if (!p->answer)
                        return -1;
        }
        p->answer_made = true;
        return 0;
}

/* A deterministic event id for the answer of the message at \p msg's
 * place: a redelivered message answers again under the same id. */
static void answer_event_id(const rd_kafka_message_t *msg, char out[37])
{
        char place[512], hex[65];

        snprintf(place, sizeof(place), "rejected:%s:%" PRId32 ":%" PRId64,
                 rd_kafka_topic_name(msg->rkt), msg->partition, msg->offset);
        cq_sha256_hex(place, strlen(place), hex);
        snprintf(out, 37, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12,
                 hex + 16, hex + 20);
}

/* Send a message to the DLQ and its answer to the results topic, or look
 * at their deliveries; done when both are acknowledged. */
static step_t step_dlq(cq_intake_t *intake, pending_t *p)
{
        rd_kafka_headers_t *hdrs;
        step_t dlq = STEP_DONE, ans = STEP_DONE;

        if (make_answer(intake, p)) {
                backoff(intake);
                return STEP_BLOCKED;
        }
        if (!p->dlq_done) {
                if (p->dr) {
                        dlq = tracked(intake, &p->dr,
                                      "could not deliver to the DLQ: "
                                      "retrying");
                        if (dlq == STEP_DONE) {
                                p->dlq_done = true;
                                atomic_fetch_add(&intake->dlq, 1);
                        }
                } else {
                        hdrs = dlq_headers(p);
                        dlq = send_tracked(intake, intake->opts.topic_dlq,
                                           p->msg->key, p->msg->key_len,
                                           p->msg->payload, p->msg->len, &hdrs,
                                           &p->dr);
                }
        }
        if (p->answer && !p->answer_done) {
                if (p->answer_dr) {
                        ans = tracked(intake, &p->answer_dr,
                                      "could not deliver a rejected job's "
                                      "event: retrying");
                        if (ans == STEP_DONE) {
                                p->answer_done = true;
                                atomic_fetch_add(&intake->answered, 1);
                        }
                } else {
                        char id[37];

                        answer_event_id(p->msg, id);
                        hdrs = rd_kafka_headers_new(1);
                        rd_kafka_header_add(hdrs, "event_id", -1, id, -1);
                        ans = send_tracked(intake, intake->opts.topic_results,
                                           p->answer_key, strlen(p->answer_key),
                                           p->answer, strlen(p->answer), &hdrs,
                                           &p->answer_dr);
                }
        }
        if (dlq == STEP_BLOCKED || ans == STEP_BLOCKED)
                return STEP_BLOCKED;
        if (dlq == STEP_WAIT || ans == STEP_WAIT)
                return STEP_WAIT;
        return STEP_DONE;
}

static bool ensure_store(cq_intake_t *intake)
{
        char errstr[512];

        if (intake->store)
                return true;
        intake->store =
            cq_store_new(&intake->store_opts, errstr, sizeof(errstr));
        if (!intake->store)
                cq_log_kv(CQ_LOG_WARN, "intake", "error", errstr, NULL);
        return intake->store != NULL;
}

static void backlog_add(cq_intake_t *intake, long n)
{
        if (intake->backlog_est < 0)
                return;
        intake->backlog_est += n;
        if (intake->opts.backlog_max > 0 &&
            intake->backlog_est > intake->opts.backlog_max)
                intake->backlog_over = true;
}

/* The sample jobs of \p problem (a job with samples), in \p jobs (room
 * for problem->samples, each initialised here); 0, or -1 when out of
 * memory (every job released). A sample's spec is the problem's with
 * its own id, problem_id, sample_index and seed (cq_job_sample_spec()). */
static int fan_out(const cq_job_t *problem, cq_job_t *jobs)
{
        long i;

        for (i = 0; i < problem->samples; i++)
                cq_job_init(&jobs[i]);
        for (i = 0; i < problem->samples; i++) {
                json_t *spec = cq_job_sample_spec(problem, i);

                if (!spec || cq_job_from_json(spec, CQ_JOB_F_STORED, &jobs[i],
                                              NULL, 0) != CQ_OK) {
                        json_decref(spec);
                        while (i-- > 0)
                                cq_job_release(&jobs[i]);
                        return -1;
                }
                json_decref(spec);
        }
        return 0;
}

/* Store every sample of \p problem in one statement, all or none: a
 * redelivered problem creates nothing again (its samples' ids are
 * deterministic). The outcome as cq_store_upsert_jobs()'s; *createdp
 * counts the samples created, *differsp says whether stored samples
 * hold other content than this problem's. */
static cq_err_t upsert_samples(cq_intake_t *intake,
                               const cq_job_t *problem,
                               const cq_job_src_t *src,
                               long *createdp,
                               bool *differsp)
{
        cq_job_t *jobs = calloc((size_t)problem->samples, sizeof(*jobs));
        cq_job_upsert_t *v = calloc((size_t)problem->samples, sizeof(*v));
        cq_err_t err = CQ_ERR_RETRIABLE;
        long i;

        *createdp = 0;
        *differsp = false;
        if (!jobs || !v || fan_out(problem, jobs)) {
                free(jobs);
                free(v);
                return CQ_ERR_RETRIABLE; /* out of memory: try again */
        }
        for (i = 0; i < problem->samples; i++) {
                v[i].job = &jobs[i];
                v[i].src = src;
        }
        err = cq_store_upsert_jobs(intake->store, v, (size_t)problem->samples);
        for (i = 0; err == CQ_OK && i < problem->samples; i++)
                *createdp += v[i].created;
        /* None created: a redelivery, unless the stored samples came from
         * other content, which would be lost without a word. */
        if (err == CQ_OK && *createdp == 0) {
                bool differs = false;

                err = cq_store_job_differs(intake->store, &jobs[0], &differs);
                if (err == CQ_OK && differs)
                        *differsp = true;
        }
        for (i = 0; i < problem->samples; i++)
                cq_job_release(&jobs[i]);
        free(jobs);
        free(v);
        return err;
}

/* Handle one message: upsert or DLQ. Its offset is stored later, by
 * drain(), once every message before it is done too. */
static step_t step(cq_intake_t *intake, pending_t *p)
{
        cq_job_t job;
        cq_job_src_t src;
        bool oom, created = false;
        cq_err_t err;

        if (p->error)
                return step_dlq(intake, p);
        cq_job_init(&job);
        p->error = validate(intake, p->msg, &job, &oom);
        if (oom) {
                backoff(intake);
                return STEP_BLOCKED;
        }
        if (p->error)
                return step_dlq(intake, p);
        if (!ensure_store(intake)) {
                cq_job_release(&job);
                set_pg_down(intake, true);
                atomic_fetch_add(&intake->pg_retries, 1);
                backoff(intake);
                return STEP_BLOCKED;
        }
        src.topic = rd_kafka_topic_name(p->msg->rkt);
        src.partition = p->msg->partition;
        src.offset = p->msg->offset;
        if (job.samples > 0) {
                long n = 0;
                bool differs = false;

                err = upsert_samples(intake, &job, &src, &n, &differs);
                if (err == CQ_OK && differs) {
                        char reason[600];

                        snprintf(reason, sizeof(reason),
                                 "job_id \"%.200s\" names a problem whose "
                                 "samples are already stored with other "
                                 "content: a job_id stands for one problem",
                                 job.job_id);
                        cq_job_release(&job);
                        p->no_answer = true;
                        p->error = strdup(reason);
                        if (!p->error) {
                                backoff(intake);
                                return STEP_BLOCKED;
                        }
                        return step_dlq(intake, p);
                }
                cq_job_release(&job);
                if (err == CQ_OK) {
                        set_pg_down(intake, false);
                        recovered(intake);
                        if (n > 0) {
                                atomic_fetch_add(&intake->upserted,
                                                 (uint64_t)n);
                                backlog_add(intake, n);
                        } else {
                                atomic_fetch_add(&intake->duplicates, 1);
                        }
                        return STEP_DONE;
                }
                goto failed;
        }
        err = cq_store_upsert_job(intake->store, &job, &src, &created);
        if (err == CQ_OK && !created) {
                /* A redelivery is a duplicate; other content under a
                 * stored job's id would be lost without a word. */
                bool differs = false;

                err = cq_store_job_differs(intake->store, &job, &differs);
                if (err == CQ_OK && differs) {
                        char reason[600];

                        snprintf(reason, sizeof(reason),
                                 "job_id \"%.200s\" names a job already "
                                 "stored with other content: a job_id stands "
                                 "for one job (send a new job_id; coderq "
                                 "retry queues a job again)",
                                 job.job_id);
                        /* the id is the stored job's: its own event will
                         * answer it, a "rejected" one must not */
                        p->no_answer = true;
                        p->error = strdup(reason);
                        cq_job_release(&job);
                        if (!p->error) {
                                backoff(intake);
                                return STEP_BLOCKED;
                        }
                        return step_dlq(intake, p);
                }
        }
        cq_job_release(&job);
        if (err == CQ_OK) {
                set_pg_down(intake, false);
                recovered(intake);
                if (created) {
                        atomic_fetch_add(&intake->upserted, 1);
                        backlog_add(intake, 1);
                } else {
                        atomic_fetch_add(&intake->duplicates, 1);
                }
                return STEP_DONE;
        }
failed:
        atomic_fetch_add(&intake->pg_retries, 1);
        if (err == CQ_ERR_RETRIABLE) {
                set_pg_down(intake, true);
                backoff(intake);
                return STEP_BLOCKED;
        }
        /* PostgreSQL answered and refused this job. Retry a few times (a
         * refusal can be transient, e.g. during a migration), then send it
         * to the DLQ with the reason rather than block the partition. */
        if (err == CQ_ERR_FATAL && ++p->store_fatal < STORE_FATAL_MAX) {
                cq_log_kv(CQ_LOG_WARN, "PostgreSQL refused a job: retrying",
                          "error", cq_store_errmsg(intake->store), NULL);
                backoff(intake);
                return STEP_BLOCKED;
        }
        {
                char reason[600];

                snprintf(reason, sizeof(reason), "%s",
                         cq_store_errmsg(intake->store));
                reason[strcspn(reason, "\n")] = '\0';
                p->error = strdup(reason);
        }
        if (!p->error) {
                backoff(intake);
                return STEP_BLOCKED;
        }
        return step_dlq(intake, p);
}

/* Count queued jobs, at most backlog_max + 1 (see cq_backlog_count()).
 * -1 when PostgreSQL cannot be asked. */
static long backlog_count(cq_intake_t *intake)
{
        if (!intake->backlog)
                intake->backlog = cq_backlog_new(intake->store_opts.dsn);
        if (!intake->backlog)
                return -1;
        return cq_backlog_count(intake->backlog, intake->opts.backlog_max + 1);
}

static void check_backlog(cq_intake_t *intake, int64_t now)
{
        long n;

        if (intake->opts.backlog_max <= 0 || now < intake->next_backlog_check)
                return;
        intake->next_backlog_check = now + intake->opts.backlog_check_ms;
        n = backlog_count(intake);
        intake->backlog_est = n;
        atomic_store(&intake->st_backlog, n);
        if (n < 0)
                return; /* unknown: keep the current decision */
        intake->backlog_over = n > intake->opts.backlog_max;
}

static void apply_pause(cq_intake_t *intake)
{
        bool blocked = intake->n > 0 && intake->retry_at > cq_now_ms();
        bool want = intake->pg_down || intake->dlq_down || blocked ||
                    intake->backlog_over || intake->n >= FIFO_HIGH;
        rd_kafka_topic_partition_list_t *parts = NULL;

        if (want && !intake->paused) {
                if (rd_kafka_assignment(intake->rk, &parts) != 0 ||
                    parts->cnt == 0) {
                        if (parts)
                                rd_kafka_topic_partition_list_destroy(parts);
                        return;
                }
                /* The whole assignment: pausing one partition still let
                 * others deliver on the 2.0.2 mock. */
                rd_kafka_pause_partitions(intake->rk, parts);
                intake->paused = parts;
                atomic_store(&intake->st_paused, true);
                atomic_fetch_add(&intake->pauses, 1);
                if (intake->backlog_over) {
                        atomic_fetch_add(&intake->backlog_pauses, 1);
                        cq_log_json(CQ_LOG_INFO, NULL,
                                    "intake: backlog of %ld queued jobs over "
                                    "%ld, pausing",
                                    intake->backlog_est,
                                    intake->opts.backlog_max);
                }
        } else if (!want && intake->paused) {
                unpause(intake, intake->rk);
        }
}

/* Returns -1 only on a fatal consumer error. */
static int on_message(cq_intake_t *intake, rd_kafka_message_t *msg)
{
        if (msg->err) {
                rd_kafka_resp_err_t err = msg->err;

                if (cq_kafka_err_is_auth(err)) {
                        /* Credentials or TLS the broker refuses: waiting
                         * cannot help, the worker stops (exit 4). */
                        set_error(intake, "%s", rd_kafka_message_errstr(msg));
                        intake->auth_failed = true;
                        rd_kafka_message_destroy(msg);
                        return -1;
                }
                rd_kafka_message_destroy(msg);
                if (err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
                        return 0;
                if (err == RD_KAFKA_RESP_ERR__FATAL) {
                        char reason[512];

                        rd_kafka_fatal_error(intake->rk, reason,
                                             sizeof(reason));
                        set_error(intake, "fatal consumer error: %s", reason);
                        return -1;
                }
                /* Unknown topic (not created yet), broker down, ...: the
                 * client recovers by itself. */
                cq_log_kv(CQ_LOG_WARN, "intake consumer error", "error",
                          rd_kafka_err2str(err), NULL);
                return 0;
        }
        atomic_fetch_add(&intake->received, 1);
        if (fifo_push(intake, msg) != 0) {
                /* Out of memory: not stored, so Kafka delivers it again
                 * after a rebalance; pausing keeps us from dropping more. */
                cq_log_error("intake: out of memory, message %" PRId64
                             " dropped from memory (not committed)",
                             msg->offset);
                rd_kafka_message_destroy(msg);
                return 0;
        }
        return 0;
}

/* Upsert the valid messages among the oldest WINDOW in one statement
 * (a burst of jobs costs one commit instead of one each). Messages that
 * fail validation get their reason and are left to step(), which sends
 * them to the DLQ; when PostgreSQL refuses the batch as a whole, step()
 * upserts its messages one by one to find the culprit. Returns false
 * when the round must stop (PostgreSQL unavailable, out of memory). */
static bool batch(cq_intake_t *intake, size_t limit)
{
        cq_job_upsert_t *v = NULL;
        cq_job_t *jobs = NULL;
        cq_job_src_t *srcs = NULL;
        pending_t **ps = NULL;
        size_t i, n = 0, bytes = 0;
        long room = BATCH_MAX;
        bool ok = true, oom = false;
        cq_err_t err;

        v = calloc(BATCH_MAX, sizeof(*v));
        jobs = calloc(BATCH_MAX, sizeof(*jobs));
        srcs = calloc(BATCH_MAX, sizeof(*srcs));
        ps = calloc(BATCH_MAX, sizeof(*ps));
        if (!v || !jobs || !srcs || !ps) {
                oom = true;
                goto out;
        }
        /* No more than the backlog bound has room for: it would be
         * crossed by a whole batch otherwise. */
        if (intake->opts.backlog_max > 0 && intake->backlog_est >= 0)
                room = intake->opts.backlog_max - intake->backlog_est + 1;
        for (i = 0; i < limit && (long)n < room && n < BATCH_MAX &&
                    bytes < BATCH_BYTES;
             i++) {
                pending_t *p = &intake->fifo[intake->head + i];

                if (p->done || p->error || p->store_fatal > 0)
                        continue;
                cq_job_init(&jobs[n]);
                p->error = validate(intake, p->msg, &jobs[n], &oom);
                if (oom)
                        goto out;
                if (p->error)
                        continue;
                if (jobs[n].samples > 0) {
                        /* a statement of its own (step()) */
                        cq_job_release(&jobs[n]);
                        continue;
                }
                srcs[n].topic = rd_kafka_topic_name(p->msg->rkt);
                srcs[n].partition = p->msg->partition;
                srcs[n].offset = p->msg->offset;
                v[n].job = &jobs[n];
                v[n].src = &srcs[n];
                ps[n] = p;
                bytes += p->msg->len;
                n++;
        }
        if (n < 2) /* nothing to gain: step() does it */
                goto out;
        if (!ensure_store(intake)) {
                set_pg_down(intake, true);
                atomic_fetch_add(&intake->pg_retries, 1);
                backoff(intake);
                ok = false;
                goto out;
        }
        err = cq_store_upsert_jobs(intake->store, v, n);
        if (err == CQ_OK) {
                set_pg_down(intake, false);
                recovered(intake);
                atomic_fetch_add(&intake->batches, 1);
                atomic_fetch_add(&intake->batched, n);
                for (i = 0; i < n; i++) {
                        /* one not created is looked at again by step():
                         * a duplicate, or other content for the DLQ */
                        if (v[i].created) {
                                ps[i]->done = true;
                                atomic_fetch_add(&intake->upserted, 1);
                                backlog_add(intake, 1);
                        }
                }
        } else if (err == CQ_ERR_RETRIABLE) {
                atomic_fetch_add(&intake->pg_retries, 1);
                set_pg_down(intake, true);
                backoff(intake);
                ok = false;
        } else {
                cq_log_kv(CQ_LOG_WARN,
                          "PostgreSQL refused a batch of jobs: storing them "
                          "one by one",
                          "error", cq_store_errmsg(intake->store), NULL);
        }
out:
        if (oom) {
                backoff(intake);
                ok = false;
        }
        for (i = 0; jobs && i < n; i++)
                cq_job_release(&jobs[i]);
        free(v);
        free(jobs);
        free(srcs);
        free(ps);
        return ok;
}

/* Work through the oldest WINDOW messages: DLQ deliveries are pipelined
 * (a message waiting for its report does not hold up the next one), but a
 * failure stops the round. Then store the offsets of the done messages at
 * the front, in order: an offset is never stored while an earlier message
 * is in neither PostgreSQL nor the DLQ. */
static void drain(cq_intake_t *intake, const atomic_int *stop)
{
        size_t i, limit = intake->n < WINDOW ? intake->n : WINDOW;

        if (cq_now_ms() < intake->retry_at || !batch(intake, limit))
                limit = 0;
        for (i = 0; i < limit && !atomic_load(stop) && !intake->backlog_over;
             i++) {
                pending_t *p = &intake->fifo[intake->head + i];
                step_t r;

                if (p->done)
                        continue;
                if (cq_now_ms() < intake->retry_at)
                        break;
                r = step(intake, p);
                if (r == STEP_DONE)
                        p->done = true;
                else if (r == STEP_BLOCKED)
                        break;
        }
        while (intake->n > 0 && intake->fifo[intake->head].done) {
                store_offset(intake, intake->fifo[intake->head].msg);
                fifo_pop(intake);
        }
}

/* The shutdown commit of the stored offsets. Coordinator moves and a
 * rebalance under way (a broker restart leaves both for a while) are
 * retried for a bounded time. When the group has moved on without us
 * (member fenced, generation stale, assignment lost) the partitions
 * belong to another member, which re-reads from the last committed
 * offset: those messages are upserted again, which is idempotent, so
 * that is a warning, not a failure. Anything else, or the bound reached,
 * fails the shutdown: offsets that should have been committed were not. */
static int final_commit(cq_intake_t *intake)
{
        int64_t deadline = cq_now_ms() + FINAL_COMMIT_MS;
        rd_kafka_resp_err_t err;
        int tries = 0;

        for (;;) {
                tries++;
                err = rd_kafka_commit(intake->rk, NULL, 0);
                switch (err) {
                case RD_KAFKA_RESP_ERR_NO_ERROR:
                case RD_KAFKA_RESP_ERR__NO_OFFSET:
                        return 0;
                case RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID:
                case RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION:
                case RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID:
                case RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST:
                        cq_log_kv(CQ_LOG_WARN,
                                  "final commit skipped: the group reassigned "
                                  "our partitions; their new owner re-reads "
                                  "the uncommitted messages (upserts are "
                                  "idempotent)",
                                  "error", rd_kafka_err2str(err), NULL);
                        return 0;
                case RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS:
                case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
                case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
                case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
                case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
                case RD_KAFKA_RESP_ERR__WAIT_COORD:
                case RD_KAFKA_RESP_ERR__TRANSPORT:
                case RD_KAFKA_RESP_ERR__TIMED_OUT:
                case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
                        if (cq_now_ms() + FINAL_COMMIT_BACKOFF_MS < deadline) {
                                rd_kafka_message_t *m;

                                cq_log_kv(CQ_LOG_INFO, "final commit: retrying",
                                          "error", rd_kafka_err2str(err), NULL);
                                /* Wait by polling: that serves a rebalance
                                 * under way (a revoke commits through the
                                 * unassign). A message it returns is not
                                 * handled: it is delivered again later. */
                                m = rd_kafka_consumer_poll(
                                    intake->rk, FINAL_COMMIT_BACKOFF_MS);
                                if (m)
                                        rd_kafka_message_destroy(m);
                                continue;
                        }
                        break;
                default:
                        break;
                }
                set_error(intake, "could not commit offsets (%d tries): %s",
                          tries, rd_kafka_err2str(err));
                return -1;
        }
}

int cq_intake_run(cq_intake_t *intake, const atomic_int *stop)
{
        int rc = 0;
        rd_kafka_resp_err_t err;

        if (intake->ran) {
                set_error(intake, "intake already ran");
                return -1;
        }
        intake->ran = true;
        while (!atomic_load(stop)) {
                int64_t now = cq_now_ms();
                int timeout = 100;
                rd_kafka_message_t *msg;

                atomic_store(&intake->st_beat_ms, now);
                measure_lag(intake, now);
                check_backlog(intake, now);
                apply_pause(intake);
                if (intake->n > 0)
                        timeout = intake->retry_at > now
                                      ? (int)(intake->retry_at - now)
                                      : 5;
                if (timeout > 100)
                        timeout = 100;
                /* Take what has already arrived (up to a batch) before
                 * storing: a burst becomes one statement, not one each. */
                msg = rd_kafka_consumer_poll(intake->rk, timeout);
                while (msg) {
                        if (on_message(intake, msg) != 0) {
                                rc = -1;
                                break;
                        }
                        msg = intake->n < BATCH_MAX
                                  ? rd_kafka_consumer_poll(intake->rk, 0)
                                  : NULL;
                }
                if (rc != 0)
                        break;
                /* Over the backlog bound, messages already fetched wait
                 * too: pausing alone would not stop them. */
                if (!intake->backlog_over)
                        drain(intake, stop);
        }

        /* Shutdown: what was handled is stored; the rest is delivered
         * again later. Commit synchronously and check it, because close()
         * reports success even when its own final commit failed. */
        fifo_drop(intake);
        if (intake->paused) {
                rd_kafka_topic_partition_list_destroy(intake->paused);
                intake->paused = NULL;
        }
        /* A broker that refuses us takes no commit: it would only be
         * retried until FINAL_COMMIT_MS (what was stored is delivered
         * again, harmlessly). */
        if (!intake->auth_failed && final_commit(intake) != 0)
                rc = -1;
        err = rd_kafka_consumer_close(intake->rk);
        if (err) {
                set_error(intake, "could not close the consumer: %s",
                          rd_kafka_err2str(err));
                rc = -1;
        }
        return rc;
}
