/* SPDX-License-Identifier: MIT */
/* check_kprops.c - the operator's librdkafka properties: the strict
 * properties-file reader on well-formed and malformed input (every
 * refusal names its line and never quotes a value), the
 * CODERQ_KAFKA_PROP_<NAME> mapping, precedence, reserved names, secrets,
 * and the one builder of librdkafka configurations (precedence there, no
 * secret in its errors, refusals at start with exit 3). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "check_support.h"
#include "coderq/common/config.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/kprops.h"
#include "support/proc.h"
#include "../consumer/kafka_int.h"

/* The value of \p key in \p props, or NULL. */
static const char *
get(const cq_kprops_t *props, const char *key, const char **sourcep)
{
        size_t i;

        for (i = 0; i < cq_kprops_count(props); i++) {
                const char *k, *v, *s;

                cq_kprops_get(props, i, &k, &v, &s);
                if (strcmp(k, key) == 0) {
                        if (sourcep)
                                *sourcep = s;
                        return v;
                }
        }
        return NULL;
}

/* Parse \p text; returns the set (caller destroys) or NULL with errstr. */
static cq_kprops_t *parse(const char *text, char *errstr, size_t size)
{
        cq_kprops_t *props = cq_kprops_new();

        ck_assert_ptr_nonnull(props);
        errstr[0] = '\0';
        if (cq_kprops_parse(props, text, strlen(text), "client.properties",
                            errstr, size) != 0) {
                cq_kprops_destroy(&props);
                return NULL;
        }
        return props;
}

START_TEST(file_forms)
{
        char errstr[256];
        const char *src = NULL;
        cq_kprops_t *props =
            parse("# a comment\n"
                  "   ! another comment = not an entry\n"
                  "\n"
                  "security.protocol=SASL_SSL\n"
                  "  sasl.mechanism = SCRAM-SHA-512\n"
                  "sasl.username:alice\r\n"
                  "ssl.ca.location\t=\t/etc/ca.pem   \r"
                  "client.id = first\\\n"
                  "     second\\\\\n"
                  "sasl.password=p\\u00e9\\=\\:\\#x\\ty\\uD83D\\uDE00\n"
                  "linger.ms=\n"
                  "sasl.kerberos.service.name=kafka",
                  errstr, sizeof(errstr));

        ck_assert_msg(props, "%s", errstr);
        ck_assert_uint_eq(cq_kprops_count(props), 8);
        ck_assert_str_eq(get(props, "security.protocol", &src), "SASL_SSL");
        ck_assert_str_eq(src, "client.properties line 4");
        ck_assert_str_eq(get(props, "sasl.mechanism", NULL), "SCRAM-SHA-512");
        ck_assert_str_eq(get(props, "sasl.username", &src), "alice");
        ck_assert_str_eq(src, "client.properties line 6");
        /* Trailing blanks belong to the value, as in Java. */
        ck_assert_str_eq(get(props, "ssl.ca.location", &src), "/etc/ca.pem   ");
        ck_assert_str_eq(src, "client.properties line 7");
        /* Continued: the next line's leading blanks are dropped; an even
         * run of backslashes is an escaped backslash, not a continuation. */
        ck_assert_str_eq(get(props, "client.id", &src), "firstsecond\\");
        ck_assert_str_eq(src, "client.properties line 8");
        ck_assert_str_eq(get(props, "sasl.password", &src),
                         "p\xc3\xa9=:#x\ty\xf0\x9f\x98\x80");
        ck_assert_str_eq(src, "client.properties line 10");
        ck_assert_str_eq(get(props, "linger.ms", NULL), "");
        ck_assert_str_eq(get(props, "sasl.kerberos.service.name", &src),
                         "kafka");
        ck_assert_str_eq(src, "client.properties line 12");
        cq_kprops_destroy(&props);
        ck_assert_ptr_null(props);
}
END_TEST

/* Each malformed input, the line it must name, and what it must say. */
static const struct bad {
        const char *text;
        const char *expect;
} bad[] = {
    {"a=1\nnovalue\n", "client.properties line 2: expected name=value"},
    {"a b\n", "client.properties line 1: expected name=value"},
    {"=value\n", "client.properties line 1: empty property name"},
    {" : value\n", "client.properties line 1: empty property name"},
    {"x=1\r\nsasl.pass?word=hunter2\r\n",
     "client.properties line 2: invalid property name"},
    {"a=1\n#c\nb=2\na=3\n",
     "client.properties line 4: property \"a\" is already set on line 1"},
    {"a=\\u12g4\n", "client.properties line 1: malformed \\u escape"},
    {"a=\\u12", "client.properties line 1: malformed \\u escape"},
    {"a=\\uDC00\n", "client.properties line 1: \\u escape of a lone low"},
    {"a=\\uD800x\n", "client.properties line 1: \\u escape of a high"},
    {"a=\\uD800\\u0041\n", "client.properties line 1: \\u escape of a high"},
    {"a=x\\u0000y\n", "client.properties line 1: a NUL character"},
    {"a=1\nb=2\\", "client.properties line 2: a backslash continues"},
    {"a=1\n\n\nenable.auto.offset.store=true\n",
     "client.properties line 4: property \"enable.auto.offset.store\" cannot "
     "be set: the intake stores an offset only after PostgreSQL"},
    {"bootstrap.servers=h:9092\n",
     "client.properties line 1: property \"bootstrap.servers\" cannot be set: "
     "coderq sets it from CODERQ_KAFKA_BROKERS"},
    {"a=1\\\n  b=2\nc\n", "client.properties line 3: expected name=value"},
    {"a=1\rb\r", "client.properties line 2: expected name=value"},
    {"k23456789012345678901234567890123456789012345678901234567890123456"
     "7890123456789012345678901234567890123456789012345678901234567890=1",
     "client.properties line 1: property name too long"},
};

START_TEST(file_malformed)
{
        char errstr[256];
        const struct bad *b = &bad[_i];
        cq_kprops_t *props = parse(b->text, errstr, sizeof(errstr));

        ck_assert_msg(props == NULL, "case %d was accepted", _i);
        ck_assert_msg(strncmp(errstr, b->expect, strlen(b->expect)) == 0,
                      "case %d: \"%s\" does not start with \"%s\"", _i, errstr,
                      b->expect);
        /* No value ever appears in an error. */
        ck_assert_ptr_null(strstr(errstr, "hunter2"));
        ck_assert_ptr_null(strstr(errstr, "h:9092"));
}
END_TEST

START_TEST(file_nul_byte_names_its_line)
{
        static const char text[] = "a=1\r\nb=2\nc=x\0y\n";
        char errstr[128];
        cq_kprops_t *props = cq_kprops_new();

        ck_assert_int_eq(cq_kprops_parse(props, text, sizeof(text) - 1, "f",
                                         errstr, sizeof(errstr)),
                         -1);
        ck_assert_str_eq(errstr, "f line 3: a NUL byte");
        ck_assert_uint_eq(cq_kprops_count(props), 0);
        cq_kprops_destroy(&props);
}
END_TEST

/* Arbitrary bytes never crash the reader and either parse or name a
 * line (run under ASan in CI). */
START_TEST(file_random_bytes)
{
        static const char alphabet[] = "ab.=:\\u0Dd9 \t\f\r\n#!x";
        unsigned int seed = 12345;
        char text[96], errstr[256];
        int round;

        for (round = 0; round < 20000; round++) {
                cq_kprops_t *props = cq_kprops_new();
                size_t len = (size_t)(rand_r(&seed) % (int)sizeof(text)), i;
                int rc;

                for (i = 0; i < len; i++)
                        text[i] = alphabet[rand_r(&seed) %
                                           (int)(sizeof(alphabet) - 1)];
                errstr[0] = '\0';
                rc = cq_kprops_parse(props, text, len, "r", errstr,
                                     sizeof(errstr));
                if (rc != 0)
                        ck_assert_msg(strncmp(errstr, "r line ", 7) == 0,
                                      "error without a line: %s", errstr);
                cq_kprops_destroy(&props);
        }
}
END_TEST

START_TEST(file_read_errors)
{
        char path[] = "/tmp/cq-kprops-XXXXXX", errstr[256];
        cq_kprops_t *props = cq_kprops_new();
        char *big = malloc(CQ_KPROPS_FILE_MAX + 2);
        int fd = mkstemp(path);

        ck_assert_int_ge(fd, 0);
        ck_assert_ptr_nonnull(big);
        memset(big, '#', CQ_KPROPS_FILE_MAX + 1);
        ck_assert_int_eq(write(fd, big, CQ_KPROPS_FILE_MAX + 1),
                         (ssize_t)CQ_KPROPS_FILE_MAX + 1);
        close(fd);
        ck_assert_int_eq(
            cq_kprops_load_file(props, path, errstr, sizeof(errstr)), -1);
        ck_assert_ptr_nonnull(strstr(errstr, "larger than 1048576 bytes"));
        unlink(path);
        ck_assert_int_eq(
            cq_kprops_load_file(props, path, errstr, sizeof(errstr)), -1);
        ck_assert_ptr_nonnull(strstr(errstr, "could not read /tmp/cq-kprops-"));
        ck_assert_ptr_nonnull(strstr(errstr, "No such file"));
        free(big);
        cq_kprops_destroy(&props);
}
END_TEST

START_TEST(env_names)
{
        char key[64];

        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_SASL_MECHANISM", key,
                                 sizeof(key)),
            0);
        ck_assert_str_eq(key, "sasl.mechanism");
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_SSL_CA_LOCATION", key,
                                 sizeof(key)),
            0);
        ck_assert_str_eq(key, "ssl.ca.location");
        ck_assert_int_eq(cq_kprops_env_to_key(
                             "CODERQ_KAFKA_PROP_SASL_OAUTHBEARER_CLIENT_SECRET",
                             key, sizeof(key)),
                         0);
        ck_assert_str_eq(key, "sasl.oauthbearer.client.secret");
        ck_assert_int_eq(cq_kprops_env_to_key("CODERQ_KAFKA_PROP_LINGER_MS2",
                                              key, sizeof(key)),
                         0);
        ck_assert_str_eq(key, "linger.ms2");
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_", key, sizeof(key)), -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_sasl_mechanism", key,
                                 sizeof(key)),
            -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_SASL__X", key, sizeof(key)),
            -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP__SASL", key, sizeof(key)),
            -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_SASL_", key, sizeof(key)),
            -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_A-B", key, sizeof(key)),
            -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_SASL", key, sizeof(key)), -1);
        ck_assert_int_eq(
            cq_kprops_env_to_key("CODERQ_KAFKA_PROP_ABCDEFGH", key, 4), -1);
}
END_TEST

START_TEST(env_over_file)
{
        char errstr[256];
        const char *src = NULL;
        cq_kprops_t *props = parse("sasl.username=from-file\n"
                                   "sasl.mechanism=PLAIN\n",
                                   errstr, sizeof(errstr));
        static char e1[] = "PATH=/usr/bin",
                    e2[] = "CODERQ_KAFKA_PROP_SASL_MECHANISM=SCRAM-SHA-512",
                    e3[] = "CODERQ_KAFKA_PROP_SECURITY_PROTOCOL=SASL_SSL",
                    e4[] = "CODERQ_KAFKA_PROP_SASL_PASSWORD=",
                    e5[] = "CODERQ_KAFKA_BROKERS=h:1";
        char *env[] = {e1, e2, e3, e4, e5, NULL};

        ck_assert_msg(props, "%s", errstr);
        ck_assert_int_eq(cq_kprops_load_env(props, env, errstr, sizeof(errstr)),
                         0);
        ck_assert_uint_eq(cq_kprops_count(props), 3);
        ck_assert_str_eq(get(props, "sasl.username", &src), "from-file");
        ck_assert_str_eq(src, "client.properties line 1");
        ck_assert_str_eq(get(props, "sasl.mechanism", &src), "SCRAM-SHA-512");
        ck_assert_str_eq(src, "CODERQ_KAFKA_PROP_SASL_MECHANISM");
        ck_assert_str_eq(get(props, "security.protocol", NULL), "SASL_SSL");
        /* An empty variable is unset, as for every setting. */
        ck_assert_ptr_null(get(props, "sasl.password", NULL));
        cq_kprops_destroy(&props);
}
END_TEST

START_TEST(env_refusals)
{
        char errstr[256];
        cq_kprops_t *props = cq_kprops_new();
        static char r1[] = "CODERQ_KAFKA_PROP_ENABLE_IDEMPOTENCE=false",
                    b1[] = "CODERQ_KAFKA_PROP_sasl_password=hunter2",
                    a1[] = "CODERQ_KAFKA_PROP_DELIVERY_TIMEOUT_MS=5";
        char *reserved_env[] = {r1, NULL};
        char *bad_env[] = {b1, NULL};
        char *alias_env[] = {a1, NULL};

        ck_assert_int_eq(
            cq_kprops_load_env(props, reserved_env, errstr, sizeof(errstr)),
            -1);
        ck_assert_str_eq(errstr,
                         "CODERQ_KAFKA_PROP_ENABLE_IDEMPOTENCE: property "
                         "\"enable.idempotence\" cannot be set: completion "
                         "events and submitted jobs need the idempotent "
                         "producer (true)");
        ck_assert_int_eq(
            cq_kprops_load_env(props, bad_env, errstr, sizeof(errstr)), -1);
        ck_assert_ptr_nonnull(
            strstr(errstr, "invalid variable CODERQ_KAFKA_PROP_sasl_password"));
        ck_assert_ptr_null(strstr(errstr, "hunter2"));
        ck_assert_int_eq(
            cq_kprops_load_env(props, alias_env, errstr, sizeof(errstr)), -1);
        ck_assert_ptr_nonnull(strstr(errstr, "\"delivery.timeout.ms\""));
        ck_assert_uint_eq(cq_kprops_count(props), 0);
        cq_kprops_destroy(&props);
}
END_TEST

START_TEST(secrets_and_reserved)
{
        ck_assert(cq_kprops_is_secret("sasl.password"));
        ck_assert(cq_kprops_is_secret("ssl.key.password"));
        ck_assert(cq_kprops_is_secret("ssl.keystore.password"));
        ck_assert(cq_kprops_is_secret("ssl.key.pem"));
        ck_assert(cq_kprops_is_secret("sasl.oauthbearer.client.secret"));
        ck_assert(cq_kprops_is_secret("sasl.jaas.config"));
        ck_assert(cq_kprops_is_secret("my.PassWord.thing"));
        ck_assert(!cq_kprops_is_secret("sasl.username"));
        ck_assert(!cq_kprops_is_secret("ssl.ca.location"));
        ck_assert(!cq_kprops_is_secret("ssl.certificate.pem"));
        ck_assert_ptr_nonnull(cq_kprops_reserved("metadata.broker.list"));
        ck_assert_ptr_nonnull(cq_kprops_reserved("group.id"));
        ck_assert_ptr_nonnull(cq_kprops_reserved("enable.auto.offset.store"));
        ck_assert_ptr_nonnull(cq_kprops_reserved("request.required.acks"));
        ck_assert_ptr_nonnull(cq_kprops_reserved("transactional.id"));
        ck_assert_ptr_null(cq_kprops_reserved("security.protocol"));
        ck_assert_ptr_null(cq_kprops_reserved("client.id"));
        ck_assert_ptr_null(cq_kprops_reserved("session.timeout.ms"));
}
END_TEST

static char *conf_get(const rd_kafka_conf_t *conf, const char *key)
{
        static char value[512];
        size_t size = sizeof(value);

        ck_assert_int_eq(rd_kafka_conf_get(conf, key, value, &size),
                         RD_KAFKA_CONF_OK);
        return value;
}

/* Defaults < operator's properties < coderq's own settings. */
START_TEST(conf_precedence)
{
        char errstr[256];
        cq_kprops_t *props = parse("linger.ms=50\n"
                                   "client.id=mine\n"
                                   "security.protocol=SASL_SSL\n",
                                   errstr, sizeof(errstr));
        cq_kafka_opts_t opts;
        const char *const defaults[] = {"linger.ms", "5", "socket.timeout.ms",
                                        "7000", NULL};
        const char *const mandatory[] = {"enable.idempotence", "true", NULL};
        rd_kafka_conf_t *conf;

        ck_assert_msg(props, "%s", errstr);
        cq_kafka_opts_init(&opts);
        opts.brokers = "127.0.0.1:1";
        opts.client_id = "worker-1";
        opts.props = props;
        conf = cq_kafka_conf_new(&opts, defaults, mandatory, errstr,
                                 sizeof(errstr));
        ck_assert_msg(conf, "%s", errstr);
        ck_assert_str_eq(conf_get(conf, "linger.ms"), "50");
        ck_assert_str_eq(conf_get(conf, "client.id"), "mine");
        ck_assert_str_eq(conf_get(conf, "socket.timeout.ms"), "7000");
        ck_assert_str_eq(conf_get(conf, "security.protocol"), "sasl_ssl");
        ck_assert_str_eq(conf_get(conf, "enable.idempotence"), "true");
        ck_assert_str_eq(conf_get(conf, "bootstrap.servers"), "127.0.0.1:1");
        rd_kafka_conf_destroy(conf);
        cq_kprops_destroy(&props);
}
END_TEST

/* Every producer coderq makes (the worker's shared one, its progress
 * events' one with lz4, coderq submit's) writes with acks=all and
 * idempotence, whatever was set before coderq's own settings. */
START_TEST(producer_conf_is_durable)
{
        static const char *const earlier[] = {"acks", "1", "enable.idempotence",
                                              "false", NULL};
        const char *const compression[] = {NULL, "lz4"};
        char errstr[512];
        cq_kafka_opts_t opts;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(compression); i++) {
                rd_kafka_conf_t *conf;
                rd_kafka_t *rk;

                cq_kafka_opts_init(&opts);
                opts.brokers = "127.0.0.1:1";
                opts.compression = compression[i];
                opts.linger_ms = 100;
                opts.message_timeout_ms = 4321;
                opts.conf = earlier;
                conf =
                    cq_kafka_producer_conf_new(&opts, errstr, sizeof(errstr));
                ck_assert_msg(conf, "%s", errstr);
                ck_assert_str_eq(conf_get(conf, "acks"), "-1");
                ck_assert_str_eq(conf_get(conf, "enable.idempotence"), "true");
                ck_assert_str_eq(conf_get(conf, "message.timeout.ms"), "4321");
                ck_assert_str_eq(conf_get(conf, "linger.ms"), "100");
                ck_assert_str_eq(conf_get(conf, "compression.type"),
                                 compression[i] ? compression[i] : "none");
                /* librdkafka takes it as it is */
                rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr,
                                  sizeof(errstr));
                ck_assert_msg(rk, "%s", errstr);
                ck_assert_str_eq(conf_get(rd_kafka_conf(rk), "acks"), "-1");
                rd_kafka_destroy(rk);
        }
}
END_TEST

/* librdkafka refuses a value: the error names the property and where it
 * came from, and shows neither a secret's value nor librdkafka's reason
 * (which may quote it). */
START_TEST(conf_errors_hide_secrets)
{
        char errstr[512];
        cq_kprops_t *props;
        cq_kafka_opts_t opts;

        cq_kafka_opts_init(&opts);
        props = parse("security.protocol=BOGUS\n", errstr, sizeof(errstr));
        opts.props = props;
        ck_assert_ptr_null(
            cq_kafka_conf_new(&opts, NULL, NULL, errstr, sizeof(errstr)));
        ck_assert_ptr_nonnull(strstr(errstr, "security.protocol=BOGUS (from "
                                             "client.properties line 1)"));
        cq_kprops_destroy(&props);
        props = parse("\n\nsasl.jaas.config=x required password='hunter2';\n",
                      errstr, sizeof(errstr));
        opts.props = props;
        ck_assert_ptr_null(
            cq_kafka_conf_new(&opts, NULL, NULL, errstr, sizeof(errstr)));
        ck_assert_str_eq(errstr, "could not set Kafka property "
                                 "sasl.jaas.config (from client.properties "
                                 "line 3): its value is refused");
        cq_kprops_destroy(&props);
}
END_TEST

/* The command line: a bad file or a value librdkafka refuses stops any
 * command with exit 3 and one line; coderq config shows the properties
 * with their sources and secrets as (set). */
START_TEST(cli_config_and_refusals)
{
        char path[] = "/tmp/cq-kprops-cli-XXXXXX";
        char envfile[600];
        const char *argv[] = {CQ_BINARY_DIR "/coderq", "config", NULL};
        cq_check_proc_t proc;
        int fd = mkstemp(path);
        const char good[] = "# managed Kafka\n"
                            "security.protocol=SASL_SSL\n"
                            "sasl.username=svc\n"
                            "sasl.password=hunter2-file\n";
        const char *env[] = {
            envfile, "CODERQ_KAFKA_PROP_SASL_MECHANISM=SCRAM-SHA-512",
            "CODERQ_KAFKA_PROP_SASL_PASSWORD=hunter2-env", NULL};

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, good, sizeof(good) - 1),
                         (ssize_t)sizeof(good) - 1);
        close(fd);
        snprintf(envfile, sizeof(envfile), "CODERQ_KAFKA_PROPERTIES=%s", path);
        ck_assert_int_eq(cq_check_proc_run(argv, env, 30000, &proc), 0);
        ck_assert_msg(proc.status == 0, "%s", proc.err);
        ck_assert_ptr_null(strstr(proc.out, "hunter2"));
        ck_assert_ptr_null(strstr(proc.err, "hunter2"));
        ck_assert_ptr_nonnull(
            strstr(proc.out, "\nkafka.security.protocol=SASL_SSL  ("));
        ck_assert_ptr_nonnull(
            strstr(proc.out, " line 2)\nkafka.sasl.username=svc  ("));
        ck_assert_ptr_nonnull(strstr(proc.out,
                                     "\nkafka.sasl.password=(set)  "
                                     "(CODERQ_KAFKA_PROP_SASL_PASSWORD)\n"));
        ck_assert_ptr_nonnull(strstr(proc.out,
                                     "\nkafka.sasl.mechanism=SCRAM-SHA-512  "
                                     "(CODERQ_KAFKA_PROP_SASL_MECHANISM)\n"));
        cq_check_proc_release(&proc);

        /* A malformed line: exit 3, one line naming it. */
        fd = open(path, O_WRONLY | O_TRUNC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "a=1\nsasl.password hunter2\n", 26), 26);
        close(fd);
        ck_assert_int_eq(cq_check_proc_run(argv, env, 30000, &proc), 0);
        ck_assert_int_eq(proc.status, 3);
        ck_assert_uint_eq(cq_check_count_lines(proc.err), 1);
        ck_assert_ptr_nonnull(strstr(proc.err, " line 2: expected name=value"));
        ck_assert_ptr_null(strstr(proc.err, "hunter2"));
        cq_check_proc_release(&proc);

        /* A property librdkafka does not know: exit 3 at start. */
        fd = open(path, O_WRONLY | O_TRUNC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "ssl.truststore.password=hunter2\n", 32),
                         32);
        close(fd);
        ck_assert_int_eq(cq_check_proc_run(argv, env, 30000, &proc), 0);
        ck_assert_int_eq(proc.status, 3);
        ck_assert_uint_eq(cq_check_count_lines(proc.err), 1);
        ck_assert_ptr_nonnull(strstr(proc.err,
                                     "could not set Kafka property "
                                     "ssl.truststore.password (from "));
        ck_assert_ptr_null(strstr(proc.err, "hunter2"));
        cq_check_proc_release(&proc);
        unlink(path);
}
END_TEST

static Suite *kprops_suite(void)
{
        Suite *s = suite_create("kprops");
        TCase *tc = tcase_create("kprops");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, file_forms);
        tcase_add_loop_test(tc, file_malformed, 0, (int)CQ_ARRAY_SIZE(bad));
        tcase_add_test(tc, file_nul_byte_names_its_line);
        tcase_add_test(tc, file_random_bytes);
        tcase_add_test(tc, file_read_errors);
        tcase_add_test(tc, env_names);
        tcase_add_test(tc, env_over_file);
        tcase_add_test(tc, env_refusals);
        tcase_add_test(tc, secrets_and_reserved);
        tcase_add_test(tc, conf_precedence);
        tcase_add_test(tc, producer_conf_is_durable);
        tcase_add_test(tc, conf_errors_hide_secrets);
        tcase_add_test(tc, cli_config_and_refusals);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(kprops_suite)
