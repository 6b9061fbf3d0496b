/* SPDX-License-Identifier: MIT */
/* listen.c - LISTEN on one channel over a connection of its own, for
 * wake-up hints (migrations/0002_wakeups.sql). A hint is never the only
 * way work is found: callers keep polling, because PostgreSQL replays
 * nothing to a listener that was disconnected. So a lost connection is
 * reconnected with a bounded backoff and reported as "reconnected", and
 * the caller treats that as "anything may have happened". */
#include "coderq/storage/listen.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"
#include "store_int.h"

#define LISTEN_BACKOFF_FIRST_MS 100
#define LISTEN_BACKOFF_MAX_MS   5000

struct cq_listener {
        char *dsn;
        char *channel;
        PGconn *conn;
        int failures; /* in a row, since the last connection */
        int64_t retry_at;
        bool was_down; /* a connection was lost or never made */
        unsigned reconnects;
        char errmsg[512];
};

static void quiet_notice(void *arg, const char *message)
{
        (void)arg;
        (void)message;
}

static void drop(cq_listener_t *l, const char *why)
{
        const char *detail = l->conn ? PQerrorMessage(l->conn) : "";

        snprintf(l->errmsg, sizeof(l->errmsg), "%s%s%s", why,
                 *detail ? ": " : "", detail);
        l->errmsg[strcspn(l->errmsg, "\n")] = '\0';
        if (l->conn)
                PQfinish(l->conn);
        l->conn = NULL;
        l->was_down = true;
        /* one listener a process waits on its own: no jitter */
        l->retry_at =
            cq_now_ms() + cq_backoff_ms(++l->failures, LISTEN_BACKOFF_FIRST_MS,
                                        LISTEN_BACKOFF_MAX_MS, CQ_JITTER_NONE);
}

/* Connect and LISTEN; false (and the backoff armed) on failure. */
static bool connect_listen(cq_listener_t *l)
{
        /* Keepalives: an idle listener must notice a peer that vanished
         * without a reset (network partition, failover), or it would
         * wait for notifications that never come. */
        const char *keys[] = {"dbname",           "application_name",
                              "connect_timeout",  "keepalives",
                              "keepalives_idle",  "keepalives_interval",
                              "keepalives_count", NULL};
        const char *vals[] = {
            l->dsn, "coderq-listen", "5", "1", "30", "10", "3", NULL};
        PGresult *res;
        char *ident, *sql;
        bool ok;

        l->conn = PQconnectdbParams(keys, vals, 1);
        if (!l->conn || PQstatus(l->conn) != CONNECTION_OK) {
                drop(l, "could not connect to PostgreSQL to listen");
                return false;
        }
        PQsetNoticeProcessor(l->conn, quiet_notice, NULL);
        ident = PQescapeIdentifier(l->conn, l->channel, strlen(l->channel));
        sql = ident ? malloc(strlen(ident) + 8) : NULL;
        if (!sql) {
                PQfreemem(ident);
                drop(l, "could not listen: out of memory");
                return false;
        }
        snprintf(sql, strlen(ident) + 8, "LISTEN %s", ident);
        PQfreemem(ident);
        res = PQexec(l->conn, sql);
        free(sql);
        ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        PQclear(res);
        if (!ok || PQsetnonblocking(l->conn, 1) != 0) {
                drop(l, "could not listen");
                return false;
        }
        l->failures = 0;
        l->errmsg[0] = '\0';
        return true;
}

cq_listener_t *cq_listener_new(const cq_store_opts_t *opts,
                               const char *channel,
                               char *errstr,
                               size_t errstr_size)
{
        cq_listener_t *l = calloc(1, sizeof(*l));

        if (l) {
                l->dsn = strdup(opts->dsn ? opts->dsn : "");
                l->channel = strdup(channel);
        }
        if (!l || !l->dsn || !l->channel) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create a listener: out of memory");
                cq_listener_destroy(&l);
                return NULL;
        }
        /* A failure is not fatal: cq_listener_wait() keeps trying. */
        (void)connect_listen(l);
        return l;
}

/* Sum of the payloads of the notifications received (a payload that is
 * not a positive count counts 1). */
static long collect(cq_listener_t *l)
{
        PGnotify *n;
        long sum = 0;

        while ((n = PQnotifies(l->conn)) != NULL) {
                char *end = NULL;
                long v;

                errno = 0;
                v = strtol(n->extra, &end, 10);
                if (errno || end == n->extra || *end || v < 1)
                        v = 1;
                sum = sum > LONG_MAX - v ? LONG_MAX : sum + v;
                PQfreemem(n);
        }
        return sum;
}

long cq_listener_wait(cq_listener_t *l, int timeout_ms, bool *reconnectedp)
{
        struct pollfd pfd;
        long sum;
        int rc;

        *reconnectedp = false;
        if (!l->conn) {
                int64_t now = cq_now_ms();

                if (now < l->retry_at) {
                        int64_t left = l->retry_at - now;

                        poll(NULL, 0,
                             (int)(left < timeout_ms ? left : timeout_ms));
                        return -1;
                }
                if (!connect_listen(l))
                        return -1;
                l->reconnects++;
                *reconnectedp = l->was_down;
                l->was_down = false;
                return 0;
        }
        /* Notifications may already be buffered from the last read. */
        if (PQconsumeInput(l->conn) == 0) {
                drop(l, "lost the listening connection");
                return -1;
        }
        sum = collect(l);
        if (sum > 0)
                return sum;
        pfd.fd = PQsocket(l->conn);
        pfd.events = POLLIN;
        pfd.revents = 0;
        if (pfd.fd < 0) {
                drop(l, "lost the listening connection");
                return -1;
        }
        rc = poll(&pfd, 1, timeout_ms);
        if (rc < 0 && errno != EINTR) {
                drop(l, "could not poll the listening connection");
                return -1;
        }
        if (rc <= 0)
                return 0;
        if (PQconsumeInput(l->conn) == 0 ||
            PQstatus(l->conn) != CONNECTION_OK) {
                drop(l, "lost the listening connection");
                return -1;
        }
        return collect(l);
}

const char *cq_listener_errmsg(const cq_listener_t *l) { return l->errmsg; }

unsigned cq_listener_reconnects(const cq_listener_t *l)
{
        return l->reconnects;
}

void cq_listener_destroy(cq_listener_t **lp)
{
        cq_listener_t *l = *lp;

        if (!l)
                return;
        *lp = NULL;
        if (l->conn)
                PQfinish(l->conn);
        free(l->dsn);
        free(l->channel);
        free(l);
}
