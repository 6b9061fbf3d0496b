/* SPDX-License-Identifier: MIT */
/* store_int.h - what the storage modules share: the handle, statement
 * parameters and the execute/transaction helpers of store.c. Not a public
 * header: only the storage sources (and their unit tests) include it. */
#ifndef CODERQ_STORE_INT_H
#define CODERQ_STORE_INT_H

#include <libpq-fe.h>
#include <stdint.h>

#include "coderq/storage/store.h"

#define STORE_MAX_PARAMS 24

/* Statements prepared on the current connection (statement "cq<i>"). */
#define STORE_PREP_MAX 64

typedef struct store_prep {
        uint64_t hash;
        char *sql;
} store_prep_t;

struct cq_store {
        PGconn *conn;
        cq_store_opts_t opts; /* strings point at the copies below */
        char *dsn;
        char *owner;
        char *topic;
        char *queues; /* opts.queues as a text[] literal: {a,b} */
        bool in_txn;
        unsigned reconnects;
        /* Forgotten on reconnect; prep_off after the server lost them
         * (a transaction-mode pooler), for the rest of this handle. */
        store_prep_t prep[STORE_PREP_MAX];
        int nprep;
        bool prep_off;
        char errmsg[1024];
};

/* Parameters of one statement. Text values are borrowed until executed;
 * numbers are formatted into the struct itself. */
typedef struct store_params {
        int n;
        const char *values[STORE_MAX_PARAMS];
        int lengths[STORE_MAX_PARAMS];
        int formats[STORE_MAX_PARAMS];
        char nums[STORE_MAX_PARAMS][32];
} store_params_t;

void sp_init(store_params_t *sp);
/* NULL becomes SQL NULL. */
void sp_text(store_params_t *sp, const char *s);
void sp_long(store_params_t *sp, long long v);
void sp_double(store_params_t *sp, double v);
/* An amount of USD as numeric text; < 0 (unknown) becomes SQL NULL. */
void sp_cost(store_params_t *sp, double usd);
/* Binary (bytea); len must fit an int (callers cap it first). */
void sp_bin(store_params_t *sp, const void *data, size_t len);

void store_set_error(cq_store_t *store, const char *fmt, ...) CQ_PRINTF(2, 3);

/* Run one statement. \p what names it in errors ("claim a job"). On CQ_OK
 * *resp holds a result that succeeded (caller PQclear()s it; may be NULL
 * when resp is NULL). \p retry_safe: running it twice is harmless, so it
 * is run again once after a reconnect (never inside a transaction). */
CQ_NODISCARD cq_err_t store_exec(cq_store_t *store,
                                 const char *what,
                                 const char *sql,
                                 const store_params_t *sp,
                                 int result_format,
                                 bool retry_safe,
                                 PGresult **resp);

CQ_NODISCARD cq_err_t store_begin(cq_store_t *store, const char *what);
/* BEGIN a read-only transaction that sees one snapshot: every read until
 * store_commit() sees the database as it was at its first. */
CQ_NODISCARD cq_err_t store_begin_snapshot(cq_store_t *store, const char *what);
CQ_NODISCARD cq_err_t store_commit(cq_store_t *store, const char *what);
/* Roll back when a transaction is open; a broken connection is fine. */
void store_rollback(cq_store_t *store);

/* Copy of a result value, or NULL for SQL NULL; sets *oom on failure. */
char *store_strdup_value(const PGresult *res, int row, int col, bool *oom);
long long store_long_value(const PGresult *res, int row, int col);

/* Parse a JSON text column; NULL for SQL NULL or on error (error set). */
json_t *store_json_value(
    cq_store_t *store, const PGresult *res, int row, int col, const char *what);

/* JSON text of \p doc, compact; NULL with error set when out of memory. */
char *store_dump(cq_store_t *store, const json_t *doc, size_t *lenp);

/* Documents (messages, cell outputs, notebooks, result reports) are
 * stored losslessly in jsonb, which cannot hold U+0000: in their strings
 * and keys each U+0000 is written as U+FFFF followed by '0' and each
 * U+FFFF as two U+FFFF. Strings holding neither are stored unchanged. */

/* The escaped or unescaped copy of \p doc; NULL when out of memory. */
json_t *store_doc_encode(const json_t *doc);
json_t *store_doc_decode(const json_t *doc);

/* store_dump() of the escaped \p doc. */
char *store_dump_doc(cq_store_t *store, const json_t *doc, size_t *lenp);

/* store_json_value() of an escaped document, unescaped. */
json_t *store_doc_value(
    cq_store_t *store, const PGresult *res, int row, int col, const char *what);

/* The cells of a JSON array (column \p col of row 0 of \p res, already
 * parsed into \p cells) whose "outputs" are escaped documents while the
 * code is a plain text column: unescape each cell's outputs in place,
 * when the text holds a U+FFFF at all. Returns 0, or -1 with the error
 * set when out of memory. Shared by checkpoints and the run report. */
int store_decode_outputs(cq_store_t *store,
                         const PGresult *res,
                         int col,
                         json_t *cells);

/* A PostgreSQL text[] literal of \p v ("{\"a\",\"b\"}"); caller frees.
 * NULL with the error set when out of memory. */
char *store_text_array(cq_store_t *store, const char *const *v, size_t n);

/* Serialize \p notebook (may be NULL: *textp NULL) under the notebook
 * cap: CQ_ERR_TOO_LARGE above it. Caller frees *textp. */
CQ_NODISCARD cq_err_t store_dump_notebook(cq_store_t *store,
                                          const char *job_id,
                                          const json_t *notebook,
                                          char **textp,
                                          size_t *lenp);

/* Write a serialized notebook (inside the caller's transaction). */
CQ_NODISCARD cq_err_t store_write_notebook(cq_store_t *store,
                                           const char *job_id,
                                           const json_t *notebook,
                                           const char *text,
                                           size_t len);

/* migrate.c, exposed to unit tests. */
typedef struct cq_migration {
        int version;
        char *name; /* file name, "0001_schema.sql" */
        char *path;
} cq_migration_t;

/* Whether \p name is a migration file name (NNNN_name.sql, the name of
 * letters, digits, '_' and '-'); *versionp gets NNNN. */
bool cq_migrate_parse_name(const char *name, int *versionp);

/* The migrations of \p dir sorted by version; a duplicate version is an
 * error. Caller owns *vp: free with cq_migrations_free(). */
CQ_NODISCARD int cq_migrate_list(const char *dir,
                                 cq_migration_t **vp,
                                 size_t *np,
                                 char *errstr,
                                 size_t errstr_size);
void cq_migrations_free(cq_migration_t *v, size_t n);

#endif
