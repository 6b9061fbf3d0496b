/* SPDX-License-Identifier: MIT */
/* kafka_conf.c - the one place an rd_kafka_conf_t is built, for every Kafka
 * client of coderq (the intake consumer, the worker's shared and progress
 * events' producers, coderq submit and coderq doctor): coderq's defaults,
 * then the operator's properties (the CODERQ_KAFKA_PROPERTIES file, then
 * CODERQ_KAFKA_PROP_* variables), then what coderq's correctness depends
 * on (for every producer: idempotence and acks=all). Secrets never reach
 * an error or a log line from here. */
#include "coderq/consumer/kafka_conf.h"

#include <stdio.h>
#include <string.h>
#include <sys/syslog.h>

#include "coderq/common/job.h"
#include "coderq/common/kprops.h"
#include "coderq/common/log.h"
#include "kafka_int.h"

void cq_kafka_opts_init(cq_kafka_opts_t *opts)
{
        memset(opts, 0, sizeof(*opts));
        opts->brokers = "127.0.0.1:9092";
        opts->topic_jobs = CQ_KAFKA_TOPIC_JOBS;
        opts->topic_dlq = CQ_KAFKA_TOPIC_DLQ;
        opts->topic_results = CQ_KAFKA_TOPIC_RESULTS;
        opts->topic_events = CQ_KAFKA_TOPIC_EVENTS;
        opts->group = CQ_KAFKA_GROUP;
        opts->job_max = CQ_JOB_DEFAULT_MAX;
        opts->backlog_max = 1000;
        opts->backlog_check_ms = 1000;
        opts->session_timeout_ms = 30000;
        opts->max_poll_interval_ms = 120000;
        opts->commit_interval_ms = 1000;
        opts->message_timeout_ms = 60000;
        opts->linger_ms = 5;
        opts->events_linger_ms = 100;
        opts->pg_reconnect_ms = 500;
        opts->relay_interval_ms = 200;
        opts->relay_idle_ms = 5000;
        opts->relay_batch = 100;
        opts->event_max_bytes = 256 * 1024;
        opts->flush_timeout_ms = 10000;
        opts->events_queue_max = 10000;
}

void cq_kafka_opts_from_config(cq_kafka_opts_t *opts, const cq_config_t *cfg)
{
        cq_kafka_opts_init(opts);
        if (cfg->kafka_brokers)
                opts->brokers = cfg->kafka_brokers;
        opts->client_id = cfg->worker_id;
        opts->props = cfg->kafka_props;
        if (cfg->topic_jobs)
                opts->topic_jobs = cfg->topic_jobs;
        if (cfg->topic_dlq)
                opts->topic_dlq = cfg->topic_dlq;
        if (cfg->topic_results)
                opts->topic_results = cfg->topic_results;
        if (cfg->topic_events)
                opts->topic_events = cfg->topic_events;
        if (cfg->kafka_group)
                opts->group = cfg->kafka_group;
        opts->job_max = cfg->job_max_bytes;
        opts->backlog_max = cfg->backlog_max;
        opts->events_queue_max = cfg->events_queue_max;
        opts->events_linger_ms = (int)cfg->events_linger_ms;
        opts->relay_interval_ms = (int)cfg->relay_interval_ms;
        opts->relay_idle_ms = (int)cfg->relay_idle_ms;
        opts->event_max_bytes = cfg->event_max_bytes;
}

int kafka_conf_set(rd_kafka_conf_t *conf,
                   const char *key,
                   const char *value,
                   const char *source,
                   char *errstr,
                   size_t errstr_size)
{
        char reason[512];
        bool secret = cq_kprops_is_secret(key);

        if (rd_kafka_conf_set(conf, key, value, reason, sizeof(reason)) ==
            RD_KAFKA_CONF_OK)
                return 0;
        if (!errstr)
                return -1;
        /* librdkafka's reason may quote the value: not for a secret. */
        if (secret)
                cq_errstr_set(errstr, errstr_size,
                              "could not set Kafka property %s (from %s): its "
                              "value is refused",
                              key, source ? source : "coderq");
        else
                cq_errstr_set(
                    errstr, errstr_size,
                    "could not set Kafka property %s=%s (from %s): %s", key,
                    value, source ? source : "coderq", reason);
        return -1;
}

static int set_pairs(rd_kafka_conf_t *conf,
                     const char *const *kv,
                     const char *source,
                     char *errstr,
                     size_t errstr_size)
{
        for (; kv && kv[0] && kv[1]; kv += 2)
                if (kafka_conf_set(conf, kv[0], kv[1], source, errstr,
                                   errstr_size))
                        return -1;
        return 0;
}

/* librdkafka's own log lines, into coderq's log: warnings and worse as
 * warnings (the client recovers from most by itself), the rest at debug.
 * They never hold a secret (librdkafka redacts them even in its debug
 * dump of the configuration). Called from librdkafka's threads. */
static void
log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
        (void)rk;
        cq_log_kv(level <= LOG_WARNING ? CQ_LOG_WARN : CQ_LOG_DEBUG,
                  "librdkafka", "facility", fac, "message", buf, NULL);
}

rd_kafka_conf_t *cq_kafka_conf_new(const cq_kafka_opts_t *opts,
                                   const char *const *defaults,
                                   const char *const *mandatory,
                                   char *errstr,
                                   size_t errstr_size)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        size_t i, n;

        if (!conf) {
                cq_errstr_set(errstr, errstr_size,
                              "could not configure a Kafka client: out of "
                              "memory");
                return NULL;
        }
        rd_kafka_conf_set_log_cb(conf, log_cb);
        if (kafka_conf_set(conf, "client.id",
                           opts->client_id ? opts->client_id : "coderq", NULL,
                           errstr, errstr_size) ||
            set_pairs(conf, defaults, NULL, errstr, errstr_size))
                goto fail;
        n = opts->props ? cq_kprops_count(opts->props) : 0;
        for (i = 0; i < n; i++) {
                const char *key, *value, *source;

                cq_kprops_get(opts->props, i, &key, &value, &source);
                if (kafka_conf_set(conf, key, value, source, errstr,
                                   errstr_size))
                        goto fail;
        }
        if (set_pairs(conf, opts->conf, "cq_kafka_opts_t.conf", errstr,
                      errstr_size) ||
            (opts->brokers &&
             kafka_conf_set(conf, "bootstrap.servers", opts->brokers,
                            "CODERQ_KAFKA_BROKERS", errstr, errstr_size)) ||
            set_pairs(conf, mandatory, NULL, errstr, errstr_size))
                goto fail;
        return conf;
fail:
        rd_kafka_conf_destroy(conf);
        return NULL;
}

rd_kafka_conf_t *cq_kafka_producer_conf_new(const cq_kafka_opts_t *opts,
                                            char *errstr,
                                            size_t errstr_size)
{
        char timeout[32], linger[32];
        const char *const defaults[] = {
            "linger.ms", linger, "compression.type",
            opts->compression ? opts->compression : "none", NULL};
        /* acks=all explicitly: idempotence would imply it, but the
         * durability of every produced message must not hang on an
         * implied setting. */
        const char *const mandatory[] = {
            "enable.idempotence", "true",  "acks", "all",
            "message.timeout.ms", timeout, NULL};

        snprintf(timeout, sizeof(timeout), "%d", opts->message_timeout_ms);
        snprintf(linger, sizeof(linger), "%d", opts->linger_ms);
        return cq_kafka_conf_new(opts, defaults, mandatory, errstr,
                                 errstr_size);
}

bool cq_kafka_err_is_auth(int err)
{
        switch (err) {
        case RD_KAFKA_RESP_ERR__AUTHENTICATION:
        case RD_KAFKA_RESP_ERR__SSL:
        case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
        case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
        case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
                return true;
        default:
                return false;
        }
}

int cq_kafka_props_check(const cq_config_t *cfg,
                         char *errstr,
                         size_t errstr_size)
{
        cq_kafka_opts_t opts;
        rd_kafka_conf_t *conf;

        cq_kafka_opts_from_config(&opts, cfg);
        conf = cq_kafka_conf_new(&opts, NULL, NULL, errstr, errstr_size);
        if (!conf)
                return -1;
        rd_kafka_conf_destroy(conf);
        return 0;
}
