/* SPDX-License-Identifier: MIT */
/* store.c - the store handle: one PGconn, statement parameters, execution
 * with reconnect (bounded exponential backoff) and retry only where a
 * statement is safe to run twice, and the transaction helpers. */
#include "coderq/storage/store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/storage/pgconn.h"
#include "store_int.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS   1000

void cq_store_opts_init(cq_store_opts_t *opts)
{
        memset(opts, 0, sizeof(*opts));
        opts->owner = "coderq";
        opts->lease_s = 120;
        opts->max_attempts = 3;
        opts->notebook_max = (size_t)64 << 20;
        opts->image_max = (size_t)32 << 20;
        opts->memory_threshold = 0.3;
        opts->reconnect_ms = 30000;
        opts->results_topic = CQ_STORE_RESULTS_TOPIC;
        opts->prepare = true;
        opts->parent_wait_s = 3600;
}

void cq_store_opts_from_config(cq_store_opts_t *opts, const cq_config_t *cfg)
{
        cq_store_opts_init(opts);
        opts->dsn = cfg->pg_dsn;
        if (cfg->worker_id)
                opts->owner = cfg->worker_id;
        opts->lease_s = (int)cfg->lease_s;
        opts->max_attempts = (int)cfg->max_attempts;
        opts->notebook_max = cfg->notebook_max;
        opts->image_max = cfg->image_max;
        opts->memory_threshold = (double)cfg->memory_threshold / 100.0;
        opts->reconnect_ms = (int)cfg->pg_reconnect_s * 1000;
        opts->prepare = !cfg->pg_prepare || strcmp(cfg->pg_prepare, "off") != 0;
        opts->parent_wait_s = (int)cfg->parent_wait_s;
        /* Completion events are written to the outbox with their topic,
         * so every writer (worker, reaper, coderq cancel) uses this one. */
        if (cfg->topic_results)
                opts->results_topic = cfg->topic_results;
        opts->queues = cfg->queues;
}

/* opts->queues as the text[] literal the claim takes: the names are
 * checked ([a-z0-9._-]), so they need no quoting. NULL with \p errstr
 * filled when the list is invalid or out of memory. */
static char *queues_literal(const char *list, char *errstr, size_t errstr_size)
{
        char names[CQ_QUEUES_MAX][CQ_QUEUE_NAME_MAX + 1];
        size_t n, i, len = 3, at = 0;
        char *out;

        if (cq_config_queues(list, names, CQ_QUEUES_MAX, &n, errstr,
                             errstr_size))
                return NULL;
        for (i = 0; i < n; i++)
                len += strlen(names[i]) + 1;
        out = malloc(len);
        if (!out) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return NULL;
        }
        out[at++] = '{';
        for (i = 0; i < n; i++) {
                size_t nlen = strlen(names[i]);

                if (i)
                        out[at++] = ',';
                memcpy(out + at, names[i], nlen);
                at += nlen;
        }
        out[at++] = '}';
        out[at] = '\0';
        return out;
}

void sp_init(store_params_t *sp) { memset(sp, 0, sizeof(*sp)); }

static int sp_slot(store_params_t *sp)
{
        /* A statement with more parameters is our bug, not bad input. */
        if (sp->n >= STORE_MAX_PARAMS)
                abort();
        return sp->n++;
}

void sp_text(store_params_t *sp, const char *s)
{
        int i = sp_slot(sp);

        sp->values[i] = s;
        sp->lengths[i] = 0;
        sp->formats[i] = 0;
}

void sp_long(store_params_t *sp, long long v)
{
        int i = sp_slot(sp);

        snprintf(sp->nums[i], sizeof(sp->nums[i]), "%lld", v);
        sp->values[i] = sp->nums[i];
        sp->formats[i] = 0;
}

void sp_double(store_params_t *sp, double v)
{
        int i = sp_slot(sp);

        snprintf(sp->nums[i], sizeof(sp->nums[i]), "%.17g", v);
        sp->values[i] = sp->nums[i];
        sp->formats[i] = 0;
}

void sp_cost(store_params_t *sp, double usd)
{
        int i;

        if (!(usd >= 0)) {
                sp_text(sp, NULL);
                return;
        }
        /* 15 significant digits: what a double holds exactly in decimal,
         * so 0.1 is stored as 0.1 */
        i = sp_slot(sp);
        snprintf(sp->nums[i], sizeof(sp->nums[i]), "%.15g", usd);
        sp->values[i] = sp->nums[i];
        sp->formats[i] = 0;
}

void sp_bin(store_params_t *sp, const void *data, size_t len)
{
        int i = sp_slot(sp);

        sp->values[i] = len ? data : "";
        sp->lengths[i] = (int)len;
        sp->formats[i] = 1;
}

void store_set_error(cq_store_t *store, const char *fmt, ...)
{
        va_list ap;
        size_t n;

        va_start(ap, fmt);
        vsnprintf(store->errmsg, sizeof(store->errmsg), fmt, ap);
        va_end(ap);
        /* libpq messages end in a newline; ours do not. */
        n = strlen(store->errmsg);
        while (n > 0 &&
               (store->errmsg[n - 1] == '\n' || store->errmsg[n - 1] == ' '))
                store->errmsg[--n] = '\0';
}

const char *cq_store_errmsg(const cq_store_t *store) { return store->errmsg; }

int cq_store_backend_pid(const cq_store_t *store)
{
        return store->conn ? PQbackendPID(store->conn) : 0;
}

unsigned cq_store_reconnects(const cq_store_t *store)
{
        return store->reconnects;
}

static void sleep_ms(int ms)
{
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
}

/* Notices (e.g. "extension already exists") are not errors: keep them off
 * stderr. */
static void quiet_notice(void *arg, const char *message)
{
        (void)arg;
        (void)message;
}

/* Settings before the DSN are defaults it may override. connect_timeout:
 * a host that does not answer at all (its machine died, a partition) is
 * given up after 5 s and libpq tries the next host of a multi-host DSN,
 * instead of waiting out the kernel's SYN retries (over two minutes) on
 * every connect and reconnect. Keepalives: a connection that is idle, or
 * waits for a long statement's reply, notices such a server within about
 * a minute, and the handle reconnects to the one that took over. The
 * listener (listen.c) uses the same values. */
static PGconn *connect_once(const char *dsn)
{
        const char *keys[] = {"connect_timeout",  "keepalives",
                              "keepalives_idle",  "keepalives_interval",
                              "keepalives_count", "dbname",
                              "application_name", NULL};
        const char *vals[] = {"5",      "1", "30", "10", "3", dsn ? dsn : "",
                              "coderq", NULL};
        PGconn *conn = PQconnectdbParams(keys, vals, 1);

        if (conn && PQstatus(conn) == CONNECTION_OK)
                PQsetNoticeProcessor(conn, quiet_notice, NULL);
        return conn;
}

/* Re-establish the connection, waiting 50 ms, 100 ms, ... up to 1 s
 * between attempts, for at most opts.reconnect_ms. */
static void prep_forget(cq_store_t *store)
{
        int i;

        for (i = 0; i < store->nprep; i++)
                free(store->prep[i].sql);
        store->nprep = 0;
}

static cq_err_t reconnect(cq_store_t *store)
{
        int64_t deadline = cq_now_ms() + store->opts.reconnect_ms;
        int64_t delay;
        int failures = 0;

        store->in_txn = false;
        prep_forget(store); /* a new session has none */
        for (;;) {
                PQreset(store->conn);
                if (PQstatus(store->conn) == CONNECTION_OK) {
                        PQsetNoticeProcessor(store->conn, quiet_notice, NULL);
                        store->reconnects++;
                        return CQ_OK;
                }
                /* the connection is this thread's alone: no jitter */
                delay = cq_backoff_ms(++failures, BACKOFF_FIRST_MS,
                                      BACKOFF_MAX_MS, CQ_JITTER_NONE);
                if (cq_now_ms() + delay > deadline)
                        break;
                sleep_ms((int)delay);
        }
        store_set_error(store, "could not reconnect to PostgreSQL: %s",
                        PQerrorMessage(store->conn));
        return CQ_ERR_RETRIABLE;
}

cq_err_t cq_store_connect(const cq_store_opts_t *opts,
                          cq_store_t **storep,
                          char *errstr,
                          size_t errstr_size)
{
        cq_store_t *store = calloc(1, sizeof(*store));
        cq_err_t err = CQ_ERR_FATAL;

        *storep = NULL;
        if (!store) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create store: out of memory");
                return CQ_ERR_RETRIABLE;
        }
        store->opts = *opts;
        store->dsn = opts->dsn ? strdup(opts->dsn) : NULL;
        store->owner = strdup(opts->owner ? opts->owner : "coderq");
        store->topic = strdup(opts->results_topic ? opts->results_topic
                                                  : CQ_STORE_RESULTS_TOPIC);
        if ((opts->dsn && !store->dsn) || !store->owner || !store->topic) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create store: out of memory");
                err = CQ_ERR_RETRIABLE;
                goto fail;
        }
        store->queues = queues_literal(opts->queues, errstr, errstr_size);
        if (!store->queues)
                goto fail;
        store->opts.dsn = store->dsn;
        store->opts.owner = store->owner;
        store->opts.results_topic = store->topic;
        if (store->opts.lease_s < 1)
                store->opts.lease_s = 1;
        if (store->opts.max_attempts < 1)
                store->opts.max_attempts = 1;
        store->conn = connect_once(store->dsn);
        if (!store->conn || PQstatus(store->conn) != CONNECTION_OK) {
                err = cq_pgconn_error(
                    "could not connect to PostgreSQL", store->dsn,
                    store->conn ? PQerrorMessage(store->conn) : NULL, errstr,
                    errstr_size);
                goto fail;
        }
        *storep = store;
        return CQ_OK;
fail:
        cq_store_destroy(&store);
        return err;
}

cq_store_t *
cq_store_new(const cq_store_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_store_t *store = NULL;

        if (cq_store_connect(opts, &store, errstr, errstr_size) != CQ_OK)
                return NULL;
        return store;
}

void cq_store_destroy(cq_store_t **storep)
{
        cq_store_t *store = *storep;

        if (!store)
                return;
        if (store->conn)
                PQfinish(store->conn);
        prep_forget(store);
        free(store->dsn);
        free(store->owner);
        free(store->topic);
        free(store->queues);
        free(store);
        *storep = NULL;
}

/* SQLSTATE classes worth another try: connection exceptions, transaction
 * rollbacks (serialization, deadlock), insufficient resources, operator
 * intervention (shutdown), lock/statement timeouts, and prepared
 * statements that are not ours (the retry runs unprepared). */
/* Whether the server refused a write as read-only (SQLSTATE 25006). */
static bool read_only(const PGresult *res)
{
        const char *state =
            res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

        return state && strcmp(state, "25006") == 0;
}

static cq_err_t classify(const PGresult *res)
{
        const char *state =
            res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

        if (!state)
                return CQ_ERR_RETRIABLE; /* no server reply at all */
        if (strncmp(state, "08", 2) == 0 || strncmp(state, "40", 2) == 0 ||
            /* read_only_sql_transaction: a failover in progress */
            strcmp(state, "25006") == 0 || strncmp(state, "53", 2) == 0 ||
            strncmp(state, "57", 2) == 0 || strcmp(state, "55P03") == 0 ||
            /* prepared statements not ours: retried unprepared */
            strcmp(state, "26000") == 0 || strcmp(state, "42P05") == 0)
                return CQ_ERR_RETRIABLE;
        if (strcmp(state, "54000") == 0)
                return CQ_ERR_TOO_LARGE; /* program_limit_exceeded */
        return CQ_ERR_FATAL;
}

/* FNV-1a of a statement's text: its name, and its key in the cache
 * (checked against the text, so SQL built at run time can never run as
 * another statement's plan). */
static uint64_t sql_hash(const char *sql)
{
        uint64_t h = 14695981039346656037ULL;

        for (; *sql; sql++)
                h = (h ^ (unsigned char)*sql) * 1099511628211ULL;
        return h;
}

/* Whether the server's prepared statements are not the ones this handle
 * made: gone (26000) or already there (42P05). A pooler in transaction
 * mode hands each transaction another server connection, and DISCARD ALL
 * drops them. */
static bool prep_foreign(const PGresult *res)
{
        const char *state =
            res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

        return state &&
               (strcmp(state, "26000") == 0 || strcmp(state, "42P05") == 0);
}

/* The statement as text: parsed and planned by the server this once. */
static PGresult *exec_plain(cq_store_t *store,
                            const char *sql,
                            const store_params_t *sp,
                            int fmt)
{
        return PQexecParams(store->conn, sql, sp->n, NULL, sp->values,
                            sp->lengths, sp->formats, fmt);
}

/* Stop preparing on this handle; outside a transaction nothing ran, so
 * \p res (the failure) is replaced by the statement run unprepared. */
static PGresult *prep_give_up(cq_store_t *store,
                              PGresult *res,
                              const char *name,
                              const char *sql,
                              const store_params_t *sp,
                              int fmt)
{
        cq_log_kv(CQ_LOG_WARN,
                  "PostgreSQL's prepared statements on this connection are "
                  "not the ones coderq made (a transaction-mode pooler? set "
                  "CODERQ_PG_PREPARE=off); not preparing on it again",
                  "statement", name, "sqlstate",
                  PQresultErrorField(res, PG_DIAG_SQLSTATE), NULL);
        prep_forget(store);
        store->prep_off = true;
        if (store->in_txn)
                return res;
        PQclear(res);
        return exec_plain(store, sql, sp, fmt);
}

/* Run \p sql once. A statement with parameters is prepared on first use
 * and then only bound and executed: it is parsed, analysed and planned
 * once per connection instead of on every call (for a checkpoint INSERT
 * that is a third of the server's work; bench/bench_storage.c). Plans
 * follow PostgreSQL's plan_cache_mode as for any prepared statement.
 * A statement is named after a hash of its text, so that one name means
 * one text for every handle (behind a pooler, handles share server
 * connections). Statements without parameters (transaction control) are
 * sent as they are. */
static PGresult *
exec_once(cq_store_t *store, const char *sql, const store_params_t *sp, int fmt)
{
        char name[24];
        uint64_t h;
        PGresult *res;
        int i;

        if (sp->n == 0 || !store->opts.prepare || store->prep_off)
                return exec_plain(store, sql, sp, fmt);
        h = sql_hash(sql);
        snprintf(name, sizeof(name), "cq_%016" PRIx64, h);
        for (i = 0; i < store->nprep && store->prep[i].hash != h; i++)
                ;
        if (i < store->nprep) {
                /* Another text under the same name: run this one as text. */
                if (strcmp(store->prep[i].sql, sql) != 0)
                        return exec_plain(store, sql, sp, fmt);
        } else {
                char *copy;

                /* Full (more distinct statements than coderq has), or no
                 * memory to remember it: run it unprepared. */
                if (store->nprep == STORE_PREP_MAX || !(copy = strdup(sql)))
                        return exec_plain(store, sql, sp, fmt);
                res = PQprepare(store->conn, name, sql, sp->n, NULL);
                if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                        free(copy);
                        if (prep_foreign(res))
                                return prep_give_up(store, res, name, sql, sp,
                                                    fmt);
                        return res; /* its error is the statement's */
                }
                PQclear(res);
                store->prep[i].hash = h;
                store->prep[i].sql = copy;
                store->nprep++;
        }
        res = PQexecPrepared(store->conn, name, sp->n, sp->values, sp->lengths,
                             sp->formats, fmt);
        if (prep_foreign(res))
                res = prep_give_up(store, res, name, sql, sp, fmt);
        return res;
}

cq_err_t store_exec(cq_store_t *store,
                    const char *what,
                    const char *sql,
                    const store_params_t *sp,
                    int result_format,
                    bool retry_safe,
                    PGresult **resp)
{
        PGresult *res = NULL;
        cq_err_t err;
        int tries = 0;
        static const store_params_t none;

        if (!sp)
                sp = &none;
        if (resp)
                *resp = NULL;
        if (!store->in_txn && PQstatus(store->conn) != CONNECTION_OK) {
                err = reconnect(store);
                if (err != CQ_OK)
                        return err;
        }
        for (;;) {
                ExecStatusType st;
                const char *msg;

                res = exec_once(store, sql, sp, result_format);
                st = PQresultStatus(res);
                if (res && (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)) {
                        if (resp)
                                *resp = res;
                        else
                                PQclear(res);
                        return CQ_OK;
                }
                err = classify(res);
                msg = res ? PQresultErrorMessage(res) : "";
                if (!*msg)
                        msg = PQerrorMessage(store->conn);
                store_set_error(store, "could not %s: %s", what, msg);
                if (read_only(res)) {
                        /* A server that no longer takes writes (a primary
                         * demoted, a standby reached during a failover):
                         * a new connection looks for the one that does
                         * (target_session_attrs=read-write). The write was
                         * refused, so it may run again there; a
                         * transaction is the caller's to run again. */
                        PQclear(res);
                        res = NULL;
                        if (store->in_txn || reconnect(store) != CQ_OK ||
                            ++tries > 1) {
                                if (store->in_txn)
                                        (void)reconnect(store);
                                return CQ_ERR_RETRIABLE;
                        }
                        continue;
                }
                PQclear(res);
                res = NULL;
                if (PQstatus(store->conn) == CONNECTION_OK)
                        return err;
                /* The connection broke. A transaction is gone with it; a
                 * single statement may or may not have run. */
                if (store->in_txn) {
                        store->in_txn = false;
                        return CQ_ERR_RETRIABLE;
                }
                if (reconnect(store) != CQ_OK)
                        return CQ_ERR_RETRIABLE;
                if (!retry_safe || ++tries > 1) {
                        store_set_error(store,
                                        "could not %s: the connection to "
                                        "PostgreSQL was lost (reconnected; "
                                        "not retried)",
                                        what);
                        return CQ_ERR_RETRIABLE;
                }
        }
}

cq_err_t store_begin(cq_store_t *store, const char *what)
{
        cq_err_t err;

        (void)what;
        err = store_exec(store, "begin a transaction", "BEGIN", NULL, 0, true,
                         NULL);
        if (err == CQ_OK)
                store->in_txn = true;
        return err;
}

cq_err_t store_begin_snapshot(cq_store_t *store, const char *what)
{
        cq_err_t err = store_exec(
            store, what, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            NULL, 0, true, NULL);

        if (err == CQ_OK)
                store->in_txn = true;
        return err;
}

cq_err_t store_commit(cq_store_t *store, const char *what)
{
        cq_err_t err = store_exec(store, what, "COMMIT", NULL, 0, false, NULL);

        store->in_txn = false;
        return err;
}

void store_rollback(cq_store_t *store)
{
        if (store->in_txn && PQstatus(store->conn) == CONNECTION_OK)
                PQclear(PQexec(store->conn, "ROLLBACK"));
        store->in_txn = false;
}

char *store_strdup_value(const PGresult *res, int row, int col, bool *oom)
{
        char *s;

        if (PQgetisnull(res, row, col))
                return NULL;
        s = strdup(PQgetvalue(res, row, col));
        if (!s)
                *oom = true;
        return s;
}

long long store_long_value(const PGresult *res, int row, int col)
{
        if (PQgetisnull(res, row, col))
                return 0;
        return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

json_t *store_json_value(
    cq_store_t *store, const PGresult *res, int row, int col, const char *what)
{
        json_error_t jerr;
        json_t *doc;

        if (PQgetisnull(res, row, col))
                return NULL;
        doc = json_loadb(PQgetvalue(res, row, col),
                         (size_t)PQgetlength(res, row, col), JSON_DECODE_ANY,
                         &jerr);
        if (!doc)
                store_set_error(store, "could not parse %s: %s", what,
                                jerr.text);
        return doc;
}

char *store_dump(cq_store_t *store, const json_t *doc, size_t *lenp)
{
        char *text = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);

        if (!text) {
                store_set_error(store, "could not serialize JSON: out of "
                                       "memory or invalid value");
                return NULL;
        }
        if (lenp)
                *lenp = strlen(text);
        return text;
}

/* ------------------------------------------------- lossless documents */

/* U+FFFF in UTF-8: a noncharacter, never meant for interchange, so the
 * escape character of stored documents. */
static const char MARK[] = "\xef\xbf\xbf";
#define MARK_LEN 3

static bool str_needs_escape(const char *s, size_t len)
{
        return memchr(s, '\0', len) || memmem(s, len, MARK, MARK_LEN);
}

/* \p s escaped (NUL -> U+FFFF '0', U+FFFF -> U+FFFF U+FFFF) or unescaped;
 * NULL when out of memory. */
static json_t *str_map(const char *s, size_t len, bool encode)
{
        /* NUL grows to four bytes, U+FFFF to six: at most four times */
        char *out = malloc(encode ? len * 4 + 1 : len + 1);
        size_t i = 0, n = 0;
        json_t *v;

        if (!out)
                return NULL;
        while (i < len) {
                if (encode && s[i] == '\0') {
                        memcpy(out + n, MARK, MARK_LEN);
                        out[n + MARK_LEN] = '0';
                        n += MARK_LEN + 1;
                        i++;
                } else if (encode && len - i >= MARK_LEN &&
                           memcmp(s + i, MARK, MARK_LEN) == 0) {
                        memcpy(out + n, MARK, MARK_LEN);
                        memcpy(out + n + MARK_LEN, MARK, MARK_LEN);
                        n += 2 * MARK_LEN;
                        i += MARK_LEN;
                } else if (!encode && len - i > MARK_LEN &&
                           memcmp(s + i, MARK, MARK_LEN) == 0 &&
                           s[i + MARK_LEN] == '0') {
                        out[n++] = '\0';
                        i += MARK_LEN + 1;
                } else if (!encode && len - i >= 2 * MARK_LEN &&
                           memcmp(s + i, MARK, MARK_LEN) == 0 &&
                           memcmp(s + i + MARK_LEN, MARK, MARK_LEN) == 0) {
                        memcpy(out + n, MARK, MARK_LEN);
                        n += MARK_LEN;
                        i += 2 * MARK_LEN;
                } else {
                        out[n++] = s[i++];
                }
        }
        v = json_stringn_nocheck(out, n);
        free(out);
        return v;
}

/* \p v for jansson calls that only read it but are not declared const
 * (iteration, reference counts). */
static json_t *unconst(const json_t *v)
{
        union {
                const json_t *c;
                json_t *m;
        } u;

        u.c = v;
        return u.m;
}

static json_t *shared(const json_t *v) { return json_incref(unconst(v)); }

/* A copy of \p doc with every string and key mapped; unchanged scalars
 * are shared. NULL when out of memory. */
static json_t *doc_map(const json_t *doc, bool encode)
{
        json_t *out = NULL, *v, *m, *obj;
        const char *key;
        size_t i, klen;

        switch (json_typeof(doc)) {
        case JSON_STRING:
                if (!encode || str_needs_escape(json_string_value(doc),
                                                json_string_length(doc)))
                        return str_map(json_string_value(doc),
                                       json_string_length(doc), encode);
                return shared(doc);
        case JSON_ARRAY:
                out = json_array();
                json_array_foreach(doc, i, v)
                {
                        m = out ? doc_map(v, encode) : NULL;
                        if (!m || json_array_append_new(out, m)) {
                                json_decref(out);
                                return NULL;
                        }
                }
                return out;
        case JSON_OBJECT:
                obj = unconst(doc);
                out = json_object();
                json_object_keylen_foreach(obj, key, klen, v)
                {
                        json_t *k = out ? str_map(key, klen, encode) : NULL;

                        m = k ? doc_map(v, encode) : NULL;
                        if (!m || json_object_setn_new_nocheck(
                                      out, json_string_value(k),
                                      json_string_length(k), m)) {
                                json_decref(m);
                                json_decref(k);
                                json_decref(out);
                                return NULL;
                        }
                        json_decref(k);
                }
                return out;
        default:
                return shared(doc);
        }
}

json_t *store_doc_encode(const json_t *doc) { return doc_map(doc, true); }

json_t *store_doc_decode(const json_t *doc) { return doc_map(doc, false); }

char *store_dump_doc(cq_store_t *store, const json_t *doc, size_t *lenp)
{
        char *text = store_dump(store, doc, lenp);
        size_t len;
        json_t *enc;

        if (!text)
                return NULL;
        len = strlen(text);
        /* Most documents hold neither: one scan of the text decides (a
         * literal backslash before "u0000" only costs the slow path). */
        if (!memmem(text, len, "\\u0000", 6) &&
            !memmem(text, len, MARK, MARK_LEN))
                return text;
        free(text);
        enc = store_doc_encode(doc);
        if (!enc) {
                store_set_error(store, "could not serialize JSON: out of "
                                       "memory");
                return NULL;
        }
        text = store_dump(store, enc, lenp);
        json_decref(enc);
        return text;
}

json_t *store_doc_value(
    cq_store_t *store, const PGresult *res, int row, int col, const char *what)
{
        json_t *doc = store_json_value(store, res, row, col, what), *dec;

        if (!doc || !memmem(PQgetvalue(res, row, col),
                            (size_t)PQgetlength(res, row, col), MARK, MARK_LEN))
                return doc;
        dec = store_doc_decode(doc);
        json_decref(doc);
        if (!dec)
                store_set_error(store, "could not parse %s: out of memory",
                                what);
        return dec;
}

char *store_text_array(cq_store_t *store, const char *const *v, size_t n)
{
        cq_buf_t buf;
        size_t i;
        const char *p;
        char *out = NULL;

        cq_buf_init(&buf, SIZE_MAX / 2);
        if (cq_buf_append(&buf, "{", 1) != CQ_OK)
                goto out;
        for (i = 0; i < n; i++) {
                if (cq_buf_append_str(&buf, i ? ",\"" : "\"") != CQ_OK)
                        goto out;
                for (p = v[i]; *p; p++) {
                        if ((*p == '"' || *p == '\\') &&
                            cq_buf_append(&buf, "\\", 1) != CQ_OK)
                                goto out;
                        if (cq_buf_append(&buf, p, 1) != CQ_OK)
                                goto out;
                }
                if (cq_buf_append(&buf, "\"", 1) != CQ_OK)
                        goto out;
        }
        if (cq_buf_append(&buf, "}", 1) != CQ_OK)
                goto out;
        out = cq_buf_take(&buf, NULL);
out:
        if (!out)
                store_set_error(store, "could not build an array parameter: "
                                       "out of memory");
        cq_buf_release(&buf);
        return out;
}
