/* SPDX-License-Identifier: MIT */
/* probe.c - connections of their own for two questions that must not wait
 * on a store handle's reconnects: the intake's backlog count (each check
 * costs at most one connect timeout while PostgreSQL is down, and the
 * connection is kept between checks) and coderq doctor's one-shot check
 * of the server. */
#include "coderq/storage/probe.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/storage/pgconn.h"

struct cq_backlog {
        char *dsn; /* "" for libpq's PG* defaults */
        PGconn *conn;
};

static const char SQL_BACKLOG[] =
    "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE status = 'queued'"
    " LIMIT $1::bigint) q";

cq_backlog_t *cq_backlog_new(const char *dsn)
{
        cq_backlog_t *bl = calloc(1, sizeof(*bl));

        if (!bl)
                return NULL;
        bl->dsn = strdup(dsn ? dsn : "");
        if (!bl->dsn) {
                free(bl);
                return NULL;
        }
        return bl;
}

long cq_backlog_count(cq_backlog_t *bl, long limit)
{
        char text[32];
        const char *params[1] = {text};
        PGresult *res = NULL;
        long n = -1;

        if (!bl->conn) {
                const char *keys[] = {"dbname", "connect_timeout",
                                      "application_name", NULL};
                const char *vals[] = {bl->dsn, "2", "coderq-intake", NULL};

                bl->conn = PQconnectdbParams(keys, vals, 1);
        }
        if (!bl->conn || PQstatus(bl->conn) != CONNECTION_OK)
                goto out;
        snprintf(text, sizeof(text), "%ld", limit);
        res =
            PQexecParams(bl->conn, SQL_BACKLOG, 1, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
                goto out;
        n = strtol(PQgetvalue(res, 0, 0), NULL, 10);
out:
        PQclear(res);
        if (n < 0 && bl->conn) {
                PQfinish(bl->conn);
                bl->conn = NULL;
        }
        return n;
}

void cq_backlog_destroy(cq_backlog_t **blp)
{
        cq_backlog_t *bl = *blp;

        if (!bl)
                return;
        *blp = NULL;
        PQfinish(bl->conn);
        free(bl->dsn);
        free(bl);
}

int cq_store_probe(const char *dsn,
                   int connect_timeout_s,
                   int statement_timeout_ms,
                   const char *application_name,
                   cq_store_probe_t *probe,
                   char *errstr,
                   size_t errstr_size)
{
        const char *keys[5], *values[5];
        char timeout[16], options[64];
        PGconn *conn = NULL;
        PGresult *res = NULL;
        int n = 0, rc = -1;

        memset(probe, 0, sizeof(*probe));
        snprintf(timeout, sizeof(timeout), "%d", connect_timeout_s);
        snprintf(options, sizeof(options), "-c statement_timeout=%d",
                 statement_timeout_ms);
        if (dsn) {
                keys[n] = "dbname"; /* expanded: a DSN or a URI */
                values[n++] = dsn;
        }
        keys[n] = "connect_timeout";
        values[n++] = timeout;
        keys[n] = "application_name";
        values[n++] = application_name;
        keys[n] = "options";
        values[n++] = options;
        keys[n] = NULL;
        values[n] = NULL;
        conn = PQconnectdbParams(keys, values, 1);
        if (!conn) {
                cq_errstr_set(errstr, errstr_size,
                              "could not connect: out of memory");
                goto out;
        }
        if (PQstatus(conn) != CONNECTION_OK) {
                (void)cq_pgconn_error("could not connect", dsn,
                                      PQerrorMessage(conn), errstr,
                                      errstr_size);
                goto out;
        }
        res = PQexec(conn, "SELECT current_setting('server_version'), "
                           "current_database()");
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
                cq_errstr_set(errstr, errstr_size, "could not run a query: %s",
                              PQerrorMessage(conn));
                goto out;
        }
        snprintf(probe->version, sizeof(probe->version), "%s",
                 PQgetvalue(res, 0, 0));
        snprintf(probe->database, sizeof(probe->database), "%s",
                 PQgetvalue(res, 0, 1));
        probe->tls = PQsslInUse(conn) != 0;
        if (probe->tls) {
                const char *protocol = PQsslAttribute(conn, "protocol");
                const char *cipher = PQsslAttribute(conn, "cipher");

                snprintf(probe->tls_protocol, sizeof(probe->tls_protocol), "%s",
                         protocol ? protocol : "");
                snprintf(probe->tls_cipher, sizeof(probe->tls_cipher), "%s",
                         cipher ? cipher : "");
        }
        rc = 0;
out:
        PQclear(res);
        PQfinish(conn);
        return rc;
}
