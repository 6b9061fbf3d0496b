/* SPDX-License-Identifier: MIT */
/* kafka.h - the Kafka side of a worker process: one shared idempotent
 * producer, the intake (jobs topic -> PostgreSQL, bad messages -> DLQ),
 * the outbox relay (outbox rows -> results topic) and best-effort progress
 * events. Intake and relay are blocking run loops, each meant for its own
 * thread; the worker daemon starts them and stops them through an atomic
 * flag. Nothing here knows about the agent.
 *
 * Delivery guarantees: a job message's offset is stored (and so committed)
 * only after PostgreSQL has the job or the DLQ has acknowledged the
 * message; an outbox row is marked sent only after a successful delivery
 * report. Both are at least once: consumers dedupe on job_id/event_id. */
#ifndef CODERQ_KAFKA_H
#define CODERQ_KAFKA_H

#include <stdatomic.h>

#include <jansson.h>

#include "coderq/common/common.h"
#include "coderq/common/config.h"
#include "coderq/storage/outbox.h"

#define CQ_KAFKA_TOPIC_JOBS    "coderq.jobs"
#define CQ_KAFKA_TOPIC_DLQ     "coderq.jobs.dlq"
#define CQ_KAFKA_TOPIC_RESULTS "coderq.results"
#define CQ_KAFKA_TOPIC_EVENTS  "coderq.events"
#define CQ_KAFKA_GROUP         "coderq-workers"

/** @brief Settings shared by the Kafka modules. Strings are borrowed: they
 *         must outlive every handle made from them. */
typedef struct cq_kafka_opts {
        const char *brokers;          /* bootstrap.servers */
        const char *client_id;        /* worker id; NULL: "coderq" */
        const cq_store_opts_t *store; /* the intake's and relay's stores
                                         (copied; reconnect_ms is replaced
                                         by pg_reconnect_ms so the loops
                                         keep polling Kafka). NULL:
                                         cq_store_opts_init() defaults;
                                         cq_kafka_opts_from_config()
                                         leaves it NULL */
        const char *topic_jobs;
        const char *topic_dlq;
        const char *topic_results; /* outbox rows without a topic */
        const char *topic_events;
        const char *group; /* consumer group of the intake */
        size_t job_max;    /* job message cap, bytes (CODERQ_JOB_MAX_BYTES) */
        long backlog_max;  /* pause intake above this many queued jobs;
                              0: never */
        int backlog_check_ms; /* how often the backlog is counted */
        int session_timeout_ms;
        int max_poll_interval_ms;
        int commit_interval_ms;  /* auto.commit.interval.ms */
        int message_timeout_ms;  /* producer message.timeout.ms */
        int linger_ms;           /* producer linger.ms (a default: the
                                    operator's properties win) */
        const char *compression; /* producer compression.type (a default
                                    too); NULL: none */
        int events_linger_ms;    /* linger.ms of the worker's second
                                    producer, the progress events' */
        int pg_reconnect_ms;     /* one reconnect attempt budget per call */
        int relay_interval_ms;   /* outbox poll period */
        /* longest poll period, reached by doubling while polls find
         * nothing (a finishing slot kicks its relay instead) */
        int relay_idle_ms;
        int relay_batch;         /* rows per outbox claim */
        int relay_lease_ms;      /* how long a relay's claim on a row lasts;
                                    0: message_timeout_ms + 15 s, so a
                                    delivery in flight never outlives it */
        size_t event_max_bytes;  /* completion event cap
                                    (CODERQ_EVENT_MAX_BYTES) */
        int flush_timeout_ms;    /* bounded waits at shutdown */
        long events_queue_max;   /* events in flight before dropping */
        const char *const *conf; /* extra librdkafka "key", "value" pairs for
                                    every client, NULL-terminated; or NULL
                                    (tests) */
        const struct cq_kprops *props; /* the operator's librdkafka
                                          properties (cfg->kafka_props),
                                          or NULL */
} cq_kafka_opts_t;

/** @brief Defaults: the topic and group names above, job_max
 *         CQ_JOB_DEFAULT_MAX, backlog 1000 checked every second, session
 *         30 s, max poll 120 s, commit every 1 s, message timeout 60 s,
 *         linger 5 ms without compression (events: 100 ms),
 *         reconnect 500 ms, relay every 200 ms by 100 rows, relay lease
 *         from the message timeout, events capped at 256 KiB, flush 10 s,
 *         10000 events in flight. */
void cq_kafka_opts_init(cq_kafka_opts_t *opts);

/** @brief Fill \p opts from \p cfg (borrowed: it must outlive the
 *         handles). */
void cq_kafka_opts_from_config(cq_kafka_opts_t *opts, const cq_config_t *cfg);

/**
 * @brief Whether a Kafka error (an rd_kafka_resp_err_t from an error
 *        callback or a consumer error) means the client can never
 *        connect as configured, so waiting cannot help: the broker
 *        refused the credentials or the SASL mechanism
 *        (_AUTHENTICATION, SASL_AUTHENTICATION_FAILED,
 *        UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE) or the TLS
 *        handshake failed (_SSL: unknown CA, wrong host name, a TLS
 *        client on a plaintext port). Callers stop at once with exit 4
 *        instead of librdkafka's endless reconnects.
 */
bool cq_kafka_err_is_auth(int err);

/**
 * @brief Check that librdkafka takes every property of cfg->kafka_props
 *        (names it knows, values of the right type), so a mistake is a
 *        configuration error at start, not a failure later.
 * @returns 0, or -1 with \p errstr filled ("could not set Kafka property
 *          K=V (from SOURCE): reason", no value shown for a secret).
 */
CQ_NODISCARD int
cq_kafka_props_check(const cq_config_t *cfg, char *errstr, size_t errstr_size);

/* ------------------------------------------------------------- producer */

typedef struct cq_producer cq_producer_t;

/**
 * @brief The process's one producer (enable.idempotence=true), with its
 *        own thread serving delivery reports. A fatal producer error
 *        (rd_kafka_fatal_error()) destroys and recreates the rd_kafka_t;
 *        messages in flight then fail and are retried by their owners.
 * @returns Caller owns the returned value; free with cq_producer_destroy().
 *          NULL with \p errstr filled on a configuration error.
 * @locality Any thread. The handle is thread-safe (internal rwlock and
 *           mutex).
 */
cq_producer_t *
cq_producer_new(const cq_kafka_opts_t *opts, char *errstr, size_t errstr_size);

/** @brief Flush (bounded by opts.flush_timeout_ms, and by the deadline of
 *         cq_producer_flush_by()), stop the thread and destroy. Call after
 *         every intake, relay and events handle using it is destroyed. */
void cq_producer_destroy(cq_producer_t **prodp);

/**
 * @brief End cq_producer_destroy()'s flush by \p deadline_ms (cq_now_ms()'s
 *        clock) at the latest: a draining worker has a deadline of its
 *        own. What is still undelivered then is purged, as at the end of
 *        any flush.
 * @locality Any thread.
 */
void cq_producer_flush_by(cq_producer_t *prod, int64_t deadline_ms);

/**
 * @brief Whether the producer's client met an authentication or TLS
 *        failure (cq_kafka_err_is_auth()): then nothing it sends can be
 *        delivered, and cq_producer_destroy() does not wait to flush.
 * @param why (out, may be NULL) the first failure's reason (librdkafka's
 *        text; it names no secret).
 * @locality Any thread.
 */
bool cq_producer_auth_failed(cq_producer_t *prod, char *why, size_t why_size);

/** @brief How many times a fatal error made the producer recreate its
 *         client. */
unsigned cq_producer_recreated(cq_producer_t *prod);

/** @brief One message of cq_producer_deliver(). */
typedef struct cq_kafka_msg {
        const char *key;   /* borrowed; NUL-terminated */
        const void *value; /* borrowed */
        size_t len;
        int err; /* (out) 0: delivered; else the rd_kafka_resp_err_t that
                    ended it (cq_kafka_err_str() names it) */
} cq_kafka_msg_t;

/**
 * @brief Produce \p n messages to \p topic (each copied) and wait for the
 *        delivery report of every one: a client's one-shot send, such as
 *        coderq submit's. A full local queue waits for room. Every
 *        message gets exactly one report by opts.message_timeout_ms after
 *        it was produced; \p wait_ms past the last produce (covering the
 *        broker's own request timeout) ends the wait anyway, and what is
 *        still unreported then fails with RD_KAFKA_RESP_ERR__MSG_TIMED_OUT.
 * @returns 0 when every message has its outcome in err; -1 when the broker
 *          refused the credentials or TLS (cq_kafka_err_is_auth()), with
 *          librdkafka's reason in \p errstr: nothing more can be
 *          delivered, the messages not yet reported keep err
 *          RD_KAFKA_RESP_ERR__AUTHENTICATION.
 * @locality Any thread; the messages are the caller's until it returns.
 */
CQ_NODISCARD int cq_producer_deliver(cq_producer_t *prod,
                                     const char *topic,
                                     cq_kafka_msg_t *msgs,
                                     size_t n,
                                     int64_t wait_ms,
                                     char *errstr,
                                     size_t errstr_size);

/** @brief librdkafka's text for an rd_kafka_resp_err_t. Borrowed; static. */
const char *cq_kafka_err_str(int err);

/* --------------------------------------------------------------- intake */

typedef struct cq_intake cq_intake_t;

/** @brief Counters of an intake; a consistent-enough snapshot. */
typedef struct cq_intake_stats {
        uint64_t received;       /* messages consumed */
        uint64_t upserted;       /* jobs created in PostgreSQL */
        uint64_t duplicates;     /* valid messages whose job already existed */
        uint64_t dlq;            /* messages acknowledged by the DLQ */
        uint64_t stored;         /* offsets stored */
        uint64_t batches;        /* multi-job upserts (one statement each) */
        uint64_t batched;        /* messages upserted in those */
        uint64_t pg_retries;     /* upserts that failed retriably */
        uint64_t dlq_retries;    /* DLQ deliveries that failed (retried) */
        uint64_t answered;       /* "rejected" completion events delivered */
        uint64_t pauses;         /* times all partitions were paused */
        uint64_t backlog_pauses; /* of which because of the backlog */
        bool paused;             /* partitions paused right now */
        bool pg_down;            /* the last PostgreSQL call failed */
        long backlog;            /* last counted queued jobs (-1: unknown) */
        int assigned;            /* partitions assigned right now */
        int64_t beat_ms;         /* cq_now_ms() of the poll loop's last round;
                                    0 before it ran */
} cq_intake_stats_t;

/** @brief The consumer lag of one assigned partition. */
typedef struct cq_intake_lag {
        int32_t partition;
        int64_t lag; /* high watermark minus the consumer's position */
} cq_intake_lag_t;

#define CQ_INTAKE_LAG_MAX 64 /* partitions whose lag is kept */

/**
 * @brief Create the consumer (group opts.group, subscribed to
 *        opts.topic_jobs). PostgreSQL need not be up yet.
 *
 * A message goes to opts.topic_dlq, with its key, value and headers
 * unchanged plus the headers "error" (the reason), "source_topic",
 * "source_partition" and "source_offset" (decimal), when cq_job_parse()
 * refuses it (not JSON, wrong types, missing fields, over opts.job_max,
 * unknown version, ...), when its key is not empty and differs from its
 * job_id, when parent_job_id equals job_id, or when PostgreSQL refuses the
 * row three times in a row (CQ_ERR_FATAL/TOO_LARGE from the upsert).
 * A null or empty key is accepted.
 * @param prod Borrowed; used for the DLQ; must outlive the intake.
 * @returns Caller owns the returned value; free with cq_intake_destroy().
 * @locality Any thread.
 */
cq_intake_t *cq_intake_new(const cq_kafka_opts_t *opts,
                           cq_producer_t *prod,
                           char *errstr,
                           size_t errstr_size);

/**
 * @brief Consume until *\p stop becomes non-zero: validate each message,
 *        upsert its job, then store its offset; send bad ones to the DLQ.
 *        Never returns because of bad input or PostgreSQL or broker
 *        outages. On stop: a final synchronous commit (checked), then the
 *        consumer is closed.
 * @returns 0; -1 when the final commit or the close failed, on a fatal
 *          consumer error, or when the broker refused the credentials or
 *          TLS (then at once, without the final commit; see
 *          cq_intake_auth_failed() and cq_intake_errmsg()).
 * @locality One thread, once per handle.
 */
CQ_NODISCARD int cq_intake_run(cq_intake_t *intake, const atomic_int *stop);

/** @brief The last error. Borrowed; valid until the handle is destroyed
 *         (read it after cq_intake_run() returned). */
const char *cq_intake_errmsg(const cq_intake_t *intake);

/** @brief Whether cq_intake_run() stopped because the broker refused the
 *         credentials or TLS (cq_kafka_err_is_auth()); cq_intake_errmsg()
 *         then holds librdkafka's reason. Read it after cq_intake_run()
 *         returned. */
bool cq_intake_auth_failed(const cq_intake_t *intake);

/** @locality Any thread. */
void cq_intake_stats(cq_intake_t *intake, cq_intake_stats_t *stats);

/**
 * @brief The lag of each assigned partition as last measured (every 2 s,
 *        by the intake's thread, from the high watermarks the fetches
 *        brought: no request to the broker). Messages fetched but not yet
 *        stored in PostgreSQL are not counted; a partition the consumer
 *        has no position for yet is left out.
 * @param lag (out) Up to \p max entries.
 * @returns How many were filled.
 * @locality Any thread.
 */
size_t cq_intake_lag(cq_intake_t *intake, cq_intake_lag_t *lag, size_t max);

void cq_intake_destroy(cq_intake_t **intakep);

/* ---------------------------------------------------------------- relay */

typedef struct cq_relay cq_relay_t;

typedef struct cq_relay_stats {
        uint64_t produced;  /* rows handed to the producer */
        uint64_t sent;      /* rows marked sent */
        uint64_t failed;    /* deliveries that failed for a reason a retry
                               can fix (row released, retried later) */
        uint64_t rejected;  /* rows marked failed for good (a permanent
                               produce error) */
        uint64_t truncated; /* events cut to event_max_bytes */
        uint64_t inflight;  /* rows waiting for their delivery report */
        uint64_t claims;    /* outbox claims made (kicked or polled) */
        uint64_t empty;     /* ... of which found no row */
        bool pg_down;
        int64_t beat_ms; /* cq_now_ms() of the run loop's last round; 0
                            before it ran */
} cq_relay_stats_t;

/**
 * @brief Whether a produce or delivery error (an rd_kafka_resp_err_t) can
 *        never succeed on a retry of the same message: a message or batch
 *        the broker refuses
 *        (MSG_SIZE_TOO_LARGE, INVALID_MSG, INVALID_MSG_SIZE,
 *        RECORD_LIST_TOO_LARGE, INVALID_RECORD, a timestamp or format the
 *        broker refuses), a topic it refuses (TOPIC_AUTHORIZATION_FAILED,
 *        TOPIC_EXCEPTION) and local invalid arguments. Everything else
 *        (timeouts, purges, a full queue, leader changes, transport
 *        errors, unknown topics and partitions, which may yet be created)
 *        is retried.
 */
bool cq_kafka_err_permanent(int err);

/**
 * @brief Cap a completion event at \p max bytes of JSON text. An event
 *        within the cap is copied as it is. Otherwise the "answer" string
 *        is cut (on a UTF-8 boundary) so the event fits, and the event
 *        gains "answer_truncated": true, "answer_bytes" (the full
 *        answer's size) and "answer_ref" (where the full answer is:
 *        table, column, job_id and the command that writes it). When
 *        that is still too large, only the job's identity, status and
 *        figures are kept, with "event_truncated": true and "event_bytes"
 *        (the full event's size).
 * @param outp (out) The capped JSON text, NUL-terminated; caller frees.
 * @param cutp (out, may be NULL) true when the event was cut.
 * @returns 0; -1 when \p json is not a JSON object or no event fits in
 *          \p max (errstr says why).
 */
int cq_event_cap(const char *json,
                 size_t len,
                 size_t max,
                 char **outp,
                 size_t *outlenp,
                 bool *cutp,
                 char *errstr,
                 size_t errstr_size);

/**
 * @brief An outbox relay. Each row is produced to its own topic (the
 *        results topic the store wrote; opts.topic_results when empty),
 *        key = the row's key (the job_id), header "event_id".
 * @param prod Borrowed; must outlive the relay.
 * @returns Caller owns the returned value; free with cq_relay_destroy().
 */
cq_relay_t *cq_relay_new(const cq_kafka_opts_t *opts,
                         cq_producer_t *prod,
                         char *errstr,
                         size_t errstr_size);

/**
 * @brief Relay until *\p stop: when kicked (cq_relay_kick()) and every
 *        relay_interval_ms claim unsent rows
 *        (cq_store_outbox_claim(): no other relay produces them while the
 *        claim runs), produce them capped at event_max_bytes
 *        (cq_event_cap()), and mark a row sent when its delivery report
 *        succeeded (err 0, status PERSISTED). A delivery that failed for a
 *        reason a retry can fix (or possibly persisted) releases the row
 *        with a backoff; a permanent error (cq_kafka_err_permanent())
 *        marks it failed, logged at error and counted in "rejected". On
 *        stop, claims once more if it was kicked meanwhile (a job of this
 *        process finished as the stop came), then waits at most
 *        flush_timeout_ms, and not past the deadline of
 *        cq_relay_flush_by(), for the reports in flight; rows still in
 *        flight keep their claim until it expires. A poll
 *        that finds nothing doubles the period up to relay_idle_ms; one
 *        that finds a row, or a kick that does, sets it back.
 * @returns 0.
 * @locality One thread.
 */
int cq_relay_run(cq_relay_t *relay, const atomic_int *stop);

/**
 * @brief Ask the relay to look at the outbox now rather than at its next
 *        interval (a job of this process just finished).
 * @locality Any thread.
 */
void cq_relay_kick(cq_relay_t *relay);

/**
 * @brief End the relay's flush at stop (cq_relay_run()) by \p deadline_ms
 *        (cq_now_ms()'s clock) at the latest: a draining worker has a
 *        deadline of its own.
 * @locality Any thread.
 */
void cq_relay_flush_by(cq_relay_t *relay, int64_t deadline_ms);

/** @locality Any thread. */
void cq_relay_stats(cq_relay_t *relay, cq_relay_stats_t *stats);

void cq_relay_destroy(cq_relay_t **relayp);

/* --------------------------------------------------------------- events */

typedef struct cq_events cq_events_t;

typedef struct cq_events_stats {
        uint64_t published; /* handed to the producer */
        uint64_t dropped;   /* queue full or producer refused */
        uint64_t failed;    /* delivery reports with an error */
} cq_events_stats_t;

/**
 * @brief Best-effort progress events on opts.topic_events.
 * @param prod Borrowed; must outlive the events handle.
 * @returns Caller owns the returned value; free with cq_events_destroy().
 */
cq_events_t *cq_events_new(const cq_kafka_opts_t *opts,
                           cq_producer_t *prod,
                           char *errstr,
                           size_t errstr_size);

/**
 * @brief Publish {"job_id", "seq", "ts", "type", ...members of \p data}
 *        keyed by job_id. seq counts from 1 per job within this process;
 *        type "job.finished" forgets the job's counter afterwards. Never
 *        blocks on the network: when opts.events_queue_max events are in
 *        flight, or the producer refuses, the event is dropped and
 *        counted.
 * @param data Borrowed; an object or NULL. Its members cannot override
 *        job_id, seq, ts or type.
 * @returns 0 when handed to the producer, -1 when dropped.
 * @locality Any thread (the seq table has its own mutex).
 */
int cq_events_publish(cq_events_t *events,
                      const char *job_id,
                      const char *type,
                      const json_t *data);

/** @locality Any thread. */
void cq_events_stats(cq_events_t *events, cq_events_stats_t *stats);

void cq_events_destroy(cq_events_t **eventsp);

#endif
