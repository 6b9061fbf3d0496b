/* SPDX-License-Identifier: MIT */
/* migrate.c - the migration runner: NNNN_name.sql files applied in version
 * order, each in its own transaction, recorded in schema_migrations with
 * its SHA-256, serialised between processes by an advisory lock. A file
 * changed after it was applied is refused, never re-applied. Files must
 * not contain BEGIN/COMMIT themselves. */
#include "coderq/storage/migrate.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "coderq/common/util.h"
#include "coderq/storage/pgconn.h"
#include "store_int.h"

#ifndef CQ_MIGRATIONS_DIR
#define CQ_MIGRATIONS_DIR "migrations"
#endif

/* "coderq!" in ASCII: the advisory lock key every runner takes. */
#define MIGRATE_LOCK_KEY "27981971403317537"
#define MIGRATION_MAX    ((size_t)16 << 20)

const char *cq_migrate_default_dir(void) { return CQ_MIGRATIONS_DIR; }

bool cq_migrate_parse_name(const char *name, int *versionp)
{
        size_t len = strlen(name), i;
        int version = 0;

        /* 4 digits, '_', at least one name character, ".sql" */
        if (len < 10 || strcmp(name + len - 4, ".sql") != 0)
                return false;
        for (i = 0; i < 4; i++) {
                if (!isdigit((unsigned char)name[i]))
                        return false;
                version = version * 10 + (name[i] - '0');
        }
        if (name[4] != '_')
                return false;
        for (i = 5; i < len - 4; i++) {
                unsigned char c = (unsigned char)name[i];

                if (!isalnum(c) && c != '_' && c != '-')
                        return false;
        }
        if (version == 0)
                return false; /* 0000 is reserved: versions start at 1 */
        *versionp = version;
        return true;
}

void cq_migrations_free(cq_migration_t *v, size_t n)
{
        size_t i;

        for (i = 0; i < n && v; i++) {
                free(v[i].name);
                free(v[i].path);
        }
        free(v);
}

/* Applied files whose text changed later in comments only: a database
 * that recorded the former sha256 accepts exactly the reworded file (and
 * nothing else). A change to a statement always needs a new migration. */
static const struct {
        long version;
        const char *former; /* what a database may have recorded */
        const char *now;    /* the file as shipped since */
} reworded[] = {
    /* 0001: a comment named a design note outside the repository */
    {1, "33b226bcde50851682c81e0ada0143fac8fd9d4e54dd7d977fe89313ffcf247a",
     "4138e65c44b53bfe03133126e45eb560cc5922c67202b0d9a103a475a9a7efd4"},
};

static bool reworded_only(long version, const char *recorded, const char *hex)
{
        for (size_t i = 0; i < sizeof(reworded) / sizeof(reworded[0]); i++)
                if (reworded[i].version == version &&
                    strcmp(reworded[i].former, recorded) == 0 &&
                    strcmp(reworded[i].now, hex) == 0)
                        return true;
        return false;
}

static int by_version(const void *a, const void *b)
{
        const cq_migration_t *ma = a, *mb = b;

        return (ma->version > mb->version) - (ma->version < mb->version);
}

int cq_migrate_list(const char *dir,
                    cq_migration_t **vp,
                    size_t *np,
                    char *errstr,
                    size_t errstr_size)
{
        DIR *d = NULL;
        struct dirent *ent;
        cq_migration_t *v = NULL;
        size_t n = 0, alloc = 0, i;
        int rc = -1;

        d = opendir(dir);
        if (!d) {
                cq_errstr_set(errstr, errstr_size,
                              "could not open migrations folder \"%s\": %s",
                              dir, strerror(errno));
                goto out;
        }
        while ((ent = readdir(d)) != NULL) {
                int version;
                size_t plen;

                if (!cq_migrate_parse_name(ent->d_name, &version))
                        continue;
                if (n == alloc) {
                        size_t na = alloc ? alloc * 2 : 16;
                        cq_migration_t *nv = realloc(v, na * sizeof(*v));

                        if (!nv)
                                goto oom;
                        v = nv;
                        alloc = na;
                }
                plen = strlen(dir) + strlen(ent->d_name) + 2;
                v[n].version = version;
                v[n].name = strdup(ent->d_name);
                v[n].path = malloc(plen);
                n++;
                if (!v[n - 1].name || !v[n - 1].path)
                        goto oom;
                snprintf(v[n - 1].path, plen, "%s/%s", dir, ent->d_name);
        }
        if (n > 1)
                qsort(v, n, sizeof(*v), by_version);
        for (i = 1; i < n; i++) {
                if (v[i].version == v[i - 1].version) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "migrations \"%s\" and \"%s\" have the same "
                            "version %04d",
                            v[i - 1].name, v[i].name, v[i].version);
                        goto out;
                }
        }
        *vp = v;
        *np = n;
        v = NULL;
        n = 0;
        rc = 0;
        goto out;
oom:
        cq_errstr_set(errstr, errstr_size,
                      "could not list migrations in \"%s\": out of memory",
                      dir);
out:
        cq_migrations_free(v, n);
        if (d)
                closedir(d);
        return rc;
}

static int read_file(const char *path,
                     char **textp,
                     size_t *lenp,
                     char *errstr,
                     size_t errstr_size)
{
        FILE *fp = fopen(path, "rb");
        cq_buf_t buf;
        char chunk[8192];
        size_t got;
        int rc = -1;

        cq_buf_init(&buf, MIGRATION_MAX);
        if (!fp) {
                cq_errstr_set(errstr, errstr_size, "could not open \"%s\": %s",
                              path, strerror(errno));
                goto out;
        }
        while ((got = fread(chunk, 1, sizeof(chunk), fp)) > 0) {
                if (cq_buf_append(&buf, chunk, got) != CQ_OK) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not read \"%s\": larger than %zu "
                                      "bytes or out of memory",
                                      path, MIGRATION_MAX);
                        goto out;
                }
        }
        if (ferror(fp)) {
                cq_errstr_set(errstr, errstr_size, "could not read \"%s\": %s",
                              path, strerror(errno));
                goto out;
        }
        *textp = cq_buf_take(&buf, lenp);
        if (!*textp) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read \"%s\": out of memory", path);
                goto out;
        }
        rc = 0;
out:
        cq_buf_release(&buf);
        if (fp)
                fclose(fp);
        return rc;
}

/* Run \p sql; on failure fill errstr with "could not <what>: <reason>". */
static int run(PGconn *conn,
               const char *what,
               const char *sql,
               int nparams,
               const char *const *params,
               PGresult **resp,
               char *errstr,
               size_t errstr_size)
{
        PGresult *res;
        ExecStatusType st;

        if (nparams > 0)
                res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL,
                                   0);
        else
                res = PQexec(conn, sql);
        st = PQresultStatus(res);
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
                const char *msg = res ? PQresultErrorMessage(res) : "";

                if (!*msg)
                        msg = PQerrorMessage(conn);
                cq_errstr_set(errstr, errstr_size, "could not %s: %s", what,
                              msg);
                errstr[strcspn(errstr, "\n")] = '\0';
                PQclear(res);
                return -1;
        }
        if (resp)
                *resp = res;
        else
                PQclear(res);
        return 0;
}

static void quiet_notice(void *arg, const char *message)
{
        (void)arg;
        (void)message;
}

cq_err_t cq_migrate_run(const char *dsn,
                        const char *dir,
                        cq_migrate_cb_t *cb,
                        void *opaque,
                        int *appliedp,
                        char *errstr_out,
                        size_t errstr_out_size)
{
        const char *keys[] = {"dbname", "application_name", NULL};
        const char *vals[] = {dsn ? dsn : "", "coderq migrate", NULL};
        char errbuf[1024] = "";
        char *errstr = errbuf;
        size_t errstr_size = sizeof(errbuf);
        PGconn *conn = NULL;
        PGresult *applied = NULL;
        cq_migration_t *v = NULL;
        size_t n = 0, i;
        char *text = NULL;
        int napplied = 0, row;
        cq_err_t err = CQ_ERR_FATAL;

        if (appliedp)
                *appliedp = 0;
        if (!dir)
                dir = cq_migrate_default_dir();
        if (cq_migrate_list(dir, &v, &n, errstr, errstr_size) != 0)
                goto out;
        if (n == 0) {
                cq_errstr_set(errstr, errstr_size,
                              "no migrations (NNNN_name.sql) in \"%s\"", dir);
                goto out;
        }
        conn = PQconnectdbParams(keys, vals, 1);
        if (!conn || PQstatus(conn) != CONNECTION_OK) {
                /* exit 4 for every failed connection, as before */
                (void)cq_pgconn_error("could not connect to PostgreSQL", dsn,
                                      conn ? PQerrorMessage(conn) : NULL,
                                      errstr, errstr_size);
                err = CQ_ERR_RETRIABLE;
                goto out;
        }
        PQsetNoticeProcessor(conn, quiet_notice, NULL);
        /* Session lock: held across the per-file transactions, released
         * on close even if we die. */
        if (run(conn, "take the migration lock",
                "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", 0, NULL, NULL,
                errstr, errstr_size) ||
            run(conn, "create schema_migrations",
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY CHECK (version > 0),"
                " name text NOT NULL,"
                " checksum text NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),"
                " applied_at timestamptz NOT NULL DEFAULT now())",
                0, NULL, NULL, errstr, errstr_size) ||
            run(conn, "read schema_migrations",
                "SELECT version, name, checksum FROM schema_migrations"
                " ORDER BY version",
                0, NULL, &applied, errstr, errstr_size))
                goto out;

        /* Every recorded migration must still be there, unchanged. */
        for (row = 0; row < PQntuples(applied); row++) {
                long version = strtol(PQgetvalue(applied, row, 0), NULL, 10);
                const char *rname = PQgetvalue(applied, row, 1);
                const char *rsum = PQgetvalue(applied, row, 2);
                char hex[65];
                size_t len;

                for (i = 0; i < n && v[i].version != version; i++)
                        ;
                if (i == n) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "migration %04ld (\"%s\") is recorded as "
                            "applied but has no file in \"%s\"; refusing "
                            "to migrate with an older migrations folder",
                            version, rname, dir);
                        goto out;
                }
                if (read_file(v[i].path, &text, &len, errstr, errstr_size))
                        goto out;
                cq_sha256_hex(text, len, hex);
                free(text);
                text = NULL;
                if (strcmp(hex, rsum) != 0 &&
                    !reworded_only(version, rsum, hex)) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "migration \"%s\" was changed after it was "
                            "applied (sha256 %.12s..., recorded "
                            "%.12s...); restore the applied version and "
                            "put changes in a new migration",
                            v[i].name, hex, rsum);
                        goto out;
                }
        }

        for (i = 0; i < n; i++) {
                char hex[65], version[16];
                const char *params[3];
                size_t len;
                bool done = false;
                char what[300];

                for (row = 0; row < PQntuples(applied); row++)
                        if (strtol(PQgetvalue(applied, row, 0), NULL, 10) ==
                            v[i].version)
                                done = true;
                if (done)
                        continue;
                if (read_file(v[i].path, &text, &len, errstr, errstr_size))
                        goto out;
                cq_sha256_hex(text, len, hex);
                snprintf(version, sizeof(version), "%d", v[i].version);
                params[0] = version;
                params[1] = v[i].name;
                params[2] = hex;
                snprintf(what, sizeof(what), "apply migration \"%s\"",
                         v[i].name);
                if (run(conn, what, "BEGIN", 0, NULL, NULL, errstr,
                        errstr_size))
                        goto out;
                if (run(conn, what, text, 0, NULL, NULL, errstr, errstr_size) ||
                    run(conn, what,
                        "INSERT INTO schema_migrations (version, name, "
                        "checksum) VALUES ($1, $2, $3)",
                        3, params, NULL, errstr, errstr_size) ||
                    run(conn, what, "COMMIT", 0, NULL, NULL, errstr,
                        errstr_size)) {
                        PQclear(PQexec(conn, "ROLLBACK"));
                        goto out;
                }
                free(text);
                text = NULL;
                napplied++;
                if (cb)
                        cb(opaque, v[i].name);
        }
        err = CQ_OK;
out:
        if (err != CQ_OK && conn && PQstatus(conn) != CONNECTION_OK &&
            err == CQ_ERR_FATAL && napplied == 0 && !applied)
                err = CQ_ERR_RETRIABLE; /* lost the server before starting */
        if (appliedp)
                *appliedp = napplied;
        if (err != CQ_OK && errstr_out && errstr_out_size > 0)
                snprintf(errstr_out, errstr_out_size, "%s", errbuf);
        free(text);
        PQclear(applied);
        cq_migrations_free(v, n);
        if (conn)
                PQfinish(conn);
        return err;
}
