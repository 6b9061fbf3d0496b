/* SPDX-License-Identifier: MIT */
/* pgtest.c - fresh databases for integration suites. */
#include "pgtest.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/storage/migrate.h"
#include "coderq/common/util.h"

/* The server's DSN as the suite found it: suites point CODERQ_PG_DSN at
 * their own database for the programs they run, and must still reach the
 * server's default database to create and drop theirs. */
static const char *admin_dsn(void)
{
        static char admin[2048];

        if (!admin[0])
                snprintf(admin, sizeof(admin), "%s",
                         cq_check_env("CODERQ_PG_DSN"));
        return admin;
}

void cq_pgtest_dsn_for(const char *base,
                       const char *dbname,
                       char *out,
                       size_t size)
{
        PQconninfoOption *opts, *o;
        char *err = NULL;
        size_t len = 0;

        opts = PQconninfoParse(base, &err);
        ck_assert_msg(opts != NULL, "bad CODERQ_PG_DSN: %s", err ? err : "");
        out[0] = '\0';
        for (o = opts; o->keyword; o++) {
                const char *val =
                    strcmp(o->keyword, "dbname") == 0 ? dbname : o->val;
                const char *p;

                if (!val || !*val)
                        continue;
                len +=
                    (size_t)snprintf(out + len, size - len, "%s='", o->keyword);
                for (p = val; *p && len + 3 < size; p++) {
                        if (*p == '\'' || *p == '\\')
                                out[len++] = '\\';
                        out[len++] = *p;
                }
                len += (size_t)snprintf(out + len, size - len, "' ");
                ck_assert_uint_lt(len, size - 1);
        }
        PQconninfoFree(opts);
        PQfreemem(err);
}

PGconn *cq_pgtest_connect(const char *dsn)
{
        PGconn *conn = PQconnectdb(dsn);

        ck_assert_msg(PQstatus(conn) == CONNECTION_OK, "connect: %s",
                      PQerrorMessage(conn));
        return conn;
}

void cq_pgtest_exec(PGconn *conn, const char *sql)
{
        PGresult *res = PQexec(conn, sql);
        ExecStatusType st = PQresultStatus(res);

        ck_assert_msg(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK, "%s: %s",
                      sql, PQerrorMessage(conn));
        PQclear(res);
}

void cq_pgtest_create(const char *prefix,
                      bool migrate,
                      char *dsn,
                      size_t dsn_size,
                      char *name,
                      size_t name_size)
{
        static unsigned counter;
        const char *base = admin_dsn();
        PGconn *admin;
        char sql[192], errstr[1024];
        int applied = 0;

        snprintf(name, name_size, "%s_%ld_%u_%ld", prefix, (long)getpid(),
                 counter++, (long)(cq_now_ms() % 100000));
        admin = cq_pgtest_connect(base);
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
        cq_pgtest_exec(admin, sql);
        PQfinish(admin);
        cq_pgtest_dsn_for(base, name, dsn, dsn_size);
        if (migrate)
                ck_assert_msg(cq_migrate_run(dsn,
                                             cq_check_srcpath("migrations"),
                                             NULL, NULL, &applied, errstr,
                                             sizeof(errstr)) == CQ_OK,
                              "migrate: %s", errstr);
}

void cq_pgtest_drop(const char *name)
{
        PGconn *admin = PQconnectdb(admin_dsn());
        char sql[192];

        if (PQstatus(admin) == CONNECTION_OK) {
                snprintf(sql, sizeof(sql),
                         "DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", name);
                PQclear(PQexec(admin, sql));
        }
        PQfinish(admin);
}

void cq_pgtest_sweep(const char *prefix)
{
        PGconn *admin = cq_pgtest_connect(admin_dsn());
        const char *params[1];
        char pattern[96];
        PGresult *res;
        size_t plen = strlen(prefix);
        int row;

        snprintf(pattern, sizeof(pattern), "%s\\_%%", prefix);
        params[0] = pattern;
        res = PQexecParams(admin,
                           "SELECT datname FROM pg_database WHERE datname "
                           "LIKE $1",
                           1, NULL, params, NULL, NULL, 0);
        for (row = 0; row < PQntuples(res); row++) {
                const char *name = PQgetvalue(res, row, 0);
                long pid = strtol(name + plen + 1, NULL, 10);

                if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
                        cq_pgtest_drop(name);
        }
        PQclear(res);
        PQfinish(admin);
}
