/* SPDX-License-Identifier: MIT */
/* artifacts.c - what a running job leaves behind: its conversation, its
 * cells and notebook (the checkpoint a resumed job starts from), and its
 * images (bytea, binary format both ways, deduplicated by SHA-256 within
 * a job, each under every name it was stored under). Writes of a running
 * job are guarded by its lease. */
#include "coderq/storage/artifacts.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"
#include "store_int.h"

/* Idempotent: the caller names the seq, so a write retried after its
 * commit's reply was lost finds its own row ('stored') instead of adding
 * another. 'lost' when the lease is not this owner's; 'conflict' when the
 * seq holds something else (a bug: nothing is overwritten). */
/* One statement: the message and, when $6 is true, the job's LLM usage
 * so far ($7..$11, as SQL_USAGE in queue.c writes it: the call's hold
 * released), so the call's usage and its reply are one checkpoint; it
 * also answers whether the job's run has a budget now, so a budget set
 * while the job runs holds its next calls at no extra round trip. */
static const char SQL_APPEND_MESSAGE[] =
    "WITH j AS (SELECT job_id, attempts, run_id FROM jobs"
    "  WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'),"
    " u AS (UPDATE jobs SET prompt_tokens = $7, completion_tokens = $8,"
    "  cache_read_tokens = $9, cache_creation_tokens = $10,"
    "  cost_usd = $11::numeric, budget_hold_usd = 0, updated_at = now()"
    "  WHERE $6::boolean AND job_id = $1 AND lease_owner = $2"
    "  AND status = 'running' RETURNING 1),"
    " ins AS (INSERT INTO job_messages (job_id, seq, role, message, attempt)"
    "  SELECT j.job_id, $3, $4, $5::jsonb, j.attempts FROM j"
    "  ON CONFLICT (job_id, seq) DO NOTHING RETURNING 1)"
    " SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM j) THEN 'lost'"
    "  WHEN EXISTS (SELECT 1 FROM ins) THEN 'stored'"
    "  WHEN EXISTS (SELECT 1 FROM job_messages m WHERE m.job_id = $1"
    "   AND m.seq = $3 AND m.role = $4 AND m.message = $5::jsonb)"
    "  THEN 'stored' ELSE 'conflict' END,"
    " EXISTS (SELECT 1 FROM j JOIN runs r ON r.run_id = j.run_id"
    "  WHERE r.budget_usd IS NOT NULL)";

/* One statement (one round trip, one implicit transaction): the cell,
 * and the notebook snapshot ($10, NULL: none) rewritten when the cell is
 * stored now or was by an earlier attempt whose reply was lost, never
 * when seq holds another cell. */
static const char SQL_RECORD_CELL[] =
    "WITH j AS (SELECT job_id, attempts FROM jobs"
    "  WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'),"
    " ins AS (INSERT INTO cells (job_id, seq, code, status, outputs,"
    "  execution_count, duration_ms, truncated, attempt)"
    "  SELECT j.job_id, $3, $4, $5, $6::jsonb, $7, $8, $9, j.attempts FROM j"
    "  ON CONFLICT (job_id, seq) DO NOTHING RETURNING 1),"
    " o AS (SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM j) THEN 'lost'"
    "  WHEN EXISTS (SELECT 1 FROM ins) THEN 'stored'"
    "  WHEN EXISTS (SELECT 1 FROM cells c WHERE c.job_id = $1"
    "   AND c.seq = $3 AND c.code = $4 AND c.status = $5"
    "   AND c.outputs = $6::jsonb)"
    "  THEN 'stored' ELSE 'conflict' END AS outcome),"
    " nb AS (INSERT INTO notebooks (job_id, doc, bytes, ncells)"
    "  SELECT $1, $10::jsonb, $11, $12 FROM o"
    "  WHERE o.outcome = 'stored' AND $10::jsonb IS NOT NULL"
    "  ON CONFLICT (job_id) DO UPDATE SET doc = EXCLUDED.doc,"
    "  bytes = EXCLUDED.bytes, ncells = EXCLUDED.ncells, updated_at = now())"
    " SELECT outcome FROM o";

/* One statement for a whole turn: SQL_RECORD_CELL's cell ($3..$12, none
 * when $4 is NULL), the messages of the array $14 at seq $13 onwards and
 * SQL_APPEND_MESSAGE's usage ($15..$20). A seq that holds something else
 * is a conflict found in the statement's snapshot before anything is
 * written (only the lease holder writes a job's rows), so a conflict
 * writes nothing at all; a row stored identically by an earlier attempt
 * whose reply was lost is kept ('stored'). */
static const char SQL_CHECKPOINT_TURN[] =
    "WITH j AS (SELECT job_id, attempts, run_id FROM jobs"
    "  WHERE job_id = $1 AND lease_owner = $2 AND status = 'running'),"
    " m AS (SELECT t.msg, $13::int + t.ord::int - 1 AS seq"
    "  FROM jsonb_array_elements($14::jsonb) WITH ORDINALITY AS t(msg, ord)),"
    " bad AS (SELECT EXISTS (SELECT 1 FROM m JOIN job_messages x"
    "   ON x.job_id = $1 AND x.seq = m.seq WHERE x.message <> m.msg)"
    "  OR ($4::text IS NOT NULL AND EXISTS (SELECT 1 FROM cells c"
    "   WHERE c.job_id = $1 AND c.seq = $3 AND NOT (c.code = $4"
    "   AND c.status = $5 AND c.outputs = $6::jsonb))) AS conflict),"
    " u AS (UPDATE jobs SET prompt_tokens = $16, completion_tokens = $17,"
    "  cache_read_tokens = $18, cache_creation_tokens = $19,"
    "  cost_usd = $20::numeric, budget_hold_usd = 0, updated_at = now()"
    "  FROM bad WHERE $15::boolean AND NOT bad.conflict AND job_id = $1"
    "  AND lease_owner = $2 AND status = 'running' RETURNING 1),"
    " cins AS (INSERT INTO cells (job_id, seq, code, status, outputs,"
    "  execution_count, duration_ms, truncated, attempt)"
    "  SELECT j.job_id, $3, $4, $5, $6::jsonb, $7, $8, $9, j.attempts"
    "  FROM j, bad WHERE $4::text IS NOT NULL AND NOT bad.conflict"
    "  ON CONFLICT (job_id, seq) DO NOTHING RETURNING 1),"
    " mins AS (INSERT INTO job_messages (job_id, seq, role, message, attempt)"
    "  SELECT j.job_id, m.seq, m.msg->>'role', m.msg, j.attempts"
    "  FROM j, m, bad WHERE NOT bad.conflict"
    "  ON CONFLICT (job_id, seq) DO NOTHING RETURNING 1),"
    " o AS (SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM j) THEN 'lost'"
    "  WHEN (SELECT conflict FROM bad) THEN 'conflict'"
    "  ELSE 'stored' END AS outcome),"
    " nb AS (INSERT INTO notebooks (job_id, doc, bytes, ncells)"
    "  SELECT $1, $10::jsonb, $11, $12 FROM o"
    "  WHERE o.outcome = 'stored' AND $4::text IS NOT NULL"
    "  AND $10::jsonb IS NOT NULL"
    "  ON CONFLICT (job_id) DO UPDATE SET doc = EXCLUDED.doc,"
    "  bytes = EXCLUDED.bytes, ncells = EXCLUDED.ncells, updated_at = now())"
    " SELECT outcome, EXISTS (SELECT 1 FROM j JOIN runs r"
    "  ON r.run_id = j.run_id WHERE r.budget_usd IS NOT NULL) FROM o";

/* Bytes new to the job are stored, and the images_first_name trigger
 * (migrations/0008_image_names.sql) names them; bytes stored already get
 * the name as one more of theirs. Their row is not in the statement's
 * snapshot when ins stores it, so each name is written once. */
static const char SQL_PUT_IMAGE[] =
    "WITH ins AS (INSERT INTO images (job_id, sha256, mime, name, cell_seq,"
    "  bytes, data) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    "  ON CONFLICT (job_id, sha256) DO NOTHING RETURNING 1),"
    " named AS (INSERT INTO image_names (image_id, name, mime, cell_seq)"
    "  SELECT i.image_id, $4, $3, $5 FROM images i"
    "  WHERE i.job_id = $1 AND i.sha256 = $2"
    "  ON CONFLICT (image_id, name) DO NOTHING RETURNING 1)"
    " SELECT EXISTS (SELECT 1 FROM ins)";

/* Read in binary format: text columns arrive as their bytes. One row per
 * name: the bytes of an image come once for each of its names. */
static const char SQL_GET_IMAGES[] =
    "SELECT i.sha256, n.name, n.mime, COALESCE(n.cell_seq, 0)::text, i.data"
    " FROM images i JOIN image_names n ON n.image_id = i.image_id"
    " WHERE i.job_id = $1 ORDER BY n.name_id";

/* One statement, so one snapshot: messages and cells agree. Cells that
 * raised are part of the state too (a cell can define a variable and fail
 * on its next line); cells that timed out, died or were cancelled are not
 * replayed: their kernel was replaced. */
static const char SQL_CHECKPOINT[] =
    "SELECT (SELECT COALESCE(json_agg(m.message ORDER BY m.seq), '[]')"
    "        FROM job_messages m WHERE m.job_id = $1)::text,"
    " (SELECT COALESCE(json_agg(json_build_object('seq', c.seq,"
    "   'code', c.code, 'status', c.status,"
    "   'execution_count', c.execution_count,"
    "   'outputs', c.outputs) ORDER BY c.seq), '[]')"
    "  FROM cells c WHERE c.job_id = $1"
    "   AND c.status IN ('ok', 'error'))::text,"
    " (SELECT n.doc::text FROM notebooks n WHERE n.job_id = $1),"
    " (SELECT COALESCE(max(m.seq), 0) FROM job_messages m"
    "  WHERE m.job_id = $1),"
    " (SELECT COALESCE(max(c.seq), 0) FROM cells c WHERE c.job_id = $1)";

static void lease_lost(cq_store_t *store, const char *what, const char *job_id)
{
        store_set_error(store,
                        "could not %s of job \"%s\": worker \"%s\" does not "
                        "hold its lease",
                        what, job_id, store->owner);
}

/* What an idempotent checkpoint write found: CQ_OK stored (now or by an
 * earlier attempt), lease lost (*lostp) or a conflicting row. */
static cq_err_t write_outcome(cq_store_t *store,
                              const PGresult *res,
                              const char *what,
                              const char *job_id,
                              int seq,
                              bool *lostp)
{
        const char *outcome = PQgetvalue(res, 0, 0);

        if (strcmp(outcome, "lost") == 0) {
                *lostp = true;
                lease_lost(store, what, job_id);
                return CQ_OK;
        }
        if (strcmp(outcome, "stored") == 0)
                return CQ_OK;
        store_set_error(store,
                        "could not %s of job \"%s\": seq %d is already "
                        "stored with other content",
                        what, job_id, seq);
        return CQ_ERR_FATAL;
}

cq_err_t cq_store_append_message(cq_store_t *store,
                                 const char *job_id,
                                 int seq,
                                 const json_t *message,
                                 bool *lostp)
{
        return cq_store_append_message_usage(store, job_id, seq, message, NULL,
                                             -1, lostp, NULL);
}

static long long tokens(long long v) { return v < 0 ? 0 : v; }

/* The usage parameters of SQL_APPEND_MESSAGE and SQL_CHECKPOINT_TURN. */
static void sp_usage(store_params_t *sp, const cq_usage_t *usage, double cost)
{
        int i;

        sp_text(sp, usage ? "true" : "false");
        if (!usage) {
                for (i = 0; i < 5; i++)
                        sp_text(sp, NULL);
                return;
        }
        sp_long(sp, tokens(usage->prompt_tokens));
        sp_long(sp, tokens(usage->completion_tokens));
        sp_long(sp, tokens(usage->cache_read_tokens));
        sp_long(sp, tokens(usage->cache_creation_tokens));
        sp_cost(sp, cost);
}

/* The cell parameters $3..$12 of SQL_RECORD_CELL and SQL_CHECKPOINT_TURN;
 * \p outputs and \p nb (nblen bytes) are the dumped documents or NULL. */
static void sp_cell(store_params_t *sp,
                    int seq,
                    const char *code,
                    const cq_cell_result_t *res,
                    const char *outputs,
                    const json_t *notebook,
                    const char *nb,
                    size_t nblen)
{
        sp_long(sp, seq);
        sp_text(sp, code);
        sp_text(sp, cq_cell_status_str(res->status));
        sp_text(sp, outputs ? outputs : "[]");
        if (res->execution_count >= 0)
                sp_long(sp, res->execution_count);
        else
                sp_text(sp, NULL);
        sp_long(sp, res->duration_ms < 0 ? 0 : res->duration_ms);
        sp_text(sp, res->truncated ? "true" : "false");
        sp_text(sp, nb);
        sp_long(sp, nb ? (long long)nblen : 0);
        sp_long(sp, nb ? (long long)json_array_size(
                             json_object_get(notebook, "cells"))
                       : 0);
}

cq_err_t cq_store_append_message_usage(cq_store_t *store,
                                       const char *job_id,
                                       int seq,
                                       const json_t *message,
                                       const cq_usage_t *usage,
                                       double cost_usd,
                                       bool *lostp,
                                       bool *run_budgetp)
{
        store_params_t sp;
        PGresult *res = NULL;
        const char *role;
        char *text = NULL;
        cq_err_t err;

        *lostp = false;
        if (run_budgetp)
                *run_budgetp = false;
        role = json_string_value(json_object_get(message, "role"));
        if (!json_is_object(message) || !role || seq < 1) {
                store_set_error(store,
                                "could not store a message of job \"%s\": "
                                "not an object with a \"role\" string, or "
                                "seq %d below 1",
                                job_id, seq);
                return CQ_ERR_FATAL;
        }
        text = store_dump_doc(store, message, NULL);
        if (!text)
                return CQ_ERR_FATAL;
        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        sp_long(&sp, seq);
        sp_text(&sp, role);
        sp_text(&sp, text);
        sp_usage(&sp, usage, cost_usd);
        /* Retry-safe: the seq is its key, the usage is set, not added. */
        err = store_exec(store, "store a message", SQL_APPEND_MESSAGE, &sp, 0,
                         true, &res);
        if (err == CQ_OK)
                err = write_outcome(store, res, "store a message", job_id, seq,
                                    lostp);
        if (err == CQ_OK && !*lostp && run_budgetp)
                *run_budgetp = PQgetvalue(res, 0, 1)[0] == 't';
        PQclear(res);
        free(text);
        return err;
}

cq_err_t cq_store_record_cell(cq_store_t *store,
                              const char *job_id,
                              int seq,
                              const char *code,
                              const cq_cell_result_t *res,
                              const json_t *notebook,
                              bool *lostp)
{
        store_params_t sp;
        PGresult *pgres = NULL;
        char *outputs = NULL, *nb = NULL;
        size_t nblen = 0;
        const char *status = cq_cell_status_str(res->status);
        cq_err_t err;

        *lostp = false;
        if (!status || !code || seq < 1 ||
            (res->outputs && !json_is_array(res->outputs))) {
                store_set_error(store,
                                "could not store a cell of job \"%s\": "
                                "invalid seq, status, code or outputs",
                                job_id);
                return CQ_ERR_FATAL;
        }
        err = store_dump_notebook(store, job_id, notebook, &nb, &nblen);
        if (err != CQ_OK)
                return err;
        if (res->outputs) {
                outputs = store_dump_doc(store, res->outputs, NULL);
                if (!outputs) {
                        err = CQ_ERR_FATAL;
                        goto out;
                }
        }
        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        sp_cell(&sp, seq, code, res, outputs, notebook, nb, nblen);
        /* Retry-safe: the seq is its key, the notebook is overwritten. */
        err = store_exec(store, "store a cell", SQL_RECORD_CELL, &sp, 0, true,
                         &pgres);
        if (err == CQ_OK)
                err = write_outcome(store, pgres, "store a cell", job_id, seq,
                                    lostp);
out:
        PQclear(pgres);
        free(outputs);
        free(nb);
        return err;
}

cq_err_t cq_store_checkpoint_turn(cq_store_t *store,
                                  const char *job_id,
                                  int cell_seq,
                                  const char *code,
                                  const cq_cell_result_t *res,
                                  const json_t *notebook,
                                  int first_seq,
                                  const json_t *messages,
                                  const cq_usage_t *usage,
                                  double cost_usd,
                                  bool *lostp,
                                  bool *run_budgetp)
{
        store_params_t sp;
        PGresult *pgres = NULL;
        char *outputs = NULL, *nb = NULL, *msgs = NULL;
        size_t nblen = 0, i;
        const json_t *msg;
        cq_err_t err = CQ_ERR_FATAL;

        *lostp = false;
        if (run_budgetp)
                *run_budgetp = false;
        if (!json_is_array(messages) || json_array_size(messages) == 0 ||
            first_seq < 1 ||
            (code &&
             (cell_seq < 1 || !res || !cq_cell_status_str(res->status) ||
              (res->outputs && !json_is_array(res->outputs))))) {
                store_set_error(store,
                                "could not checkpoint a turn of job \"%s\": "
                                "no messages, or an invalid seq, status or "
                                "outputs",
                                job_id);
                return CQ_ERR_FATAL;
        }
        json_array_foreach(messages, i, msg)
        {
                if (!json_is_object(msg) ||
                    !json_string_value(json_object_get(msg, "role"))) {
                        store_set_error(store,
                                        "could not checkpoint a turn of job "
                                        "\"%s\": message %zu is not an "
                                        "object with a \"role\" string",
                                        job_id, i);
                        return CQ_ERR_FATAL;
                }
        }
        if (code) {
                err = store_dump_notebook(store, job_id, notebook, &nb, &nblen);
                if (err != CQ_OK)
                        return err;
                err = CQ_ERR_FATAL;
                if (res->outputs &&
                    !(outputs = store_dump_doc(store, res->outputs, NULL)))
                        goto out;
        }
        msgs = store_dump_doc(store, messages, NULL);
        if (!msgs)
                goto out;
        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, store->owner);
        if (code) {
                sp_cell(&sp, cell_seq, code, res, outputs, notebook, nb, nblen);
        } else {
                for (i = 0; i < 10; i++)
                        sp_text(&sp, NULL);
        }
        sp_long(&sp, first_seq);
        sp_text(&sp, msgs);
        sp_usage(&sp, usage, cost_usd);
        /* Retry-safe: seqs are the keys, the notebook and usage are set. */
        err = store_exec(store, "checkpoint a turn", SQL_CHECKPOINT_TURN, &sp,
                         0, true, &pgres);
        if (err == CQ_OK)
                err = write_outcome(store, pgres, "checkpoint a turn", job_id,
                                    first_seq, lostp);
        if (err == CQ_OK && !*lostp && run_budgetp)
                *run_budgetp = PQgetvalue(pgres, 0, 1)[0] == 't';
out:
        PQclear(pgres);
        free(outputs);
        free(nb);
        free(msgs);
        return err;
}

cq_err_t cq_store_put_image(cq_store_t *store,
                            const char *job_id,
                            const char *name,
                            const char *mime,
                            const void *data,
                            size_t len,
                            int cell_seq,
                            char *sha256,
                            bool *createdp)
{
        store_params_t sp;
        PGresult *res = NULL;
        char hex[65];
        cq_err_t err;

        if (createdp)
                *createdp = false;
        if (len > store->opts.image_max || len > INT_MAX) {
                store_set_error(store,
                                "could not store image \"%s\" of job \"%s\": "
                                "%zu bytes exceeds the cap of %zu "
                                "(CODERQ_IMAGE_MAX)",
                                name ? name : "", job_id, len,
                                store->opts.image_max);
                return CQ_ERR_TOO_LARGE;
        }
        if (!name || !mime || (!data && len)) {
                store_set_error(store,
                                "could not store an image of job \"%s\": "
                                "name, mime and data are required",
                                job_id);
                return CQ_ERR_FATAL;
        }
        cq_sha256_hex(data, len, hex);
        sp_init(&sp);
        sp_text(&sp, job_id);
        sp_text(&sp, hex);
        sp_text(&sp, mime);
        sp_text(&sp, name);
        if (cell_seq > 0)
                sp_long(&sp, cell_seq);
        else
                sp_text(&sp, NULL);
        sp_long(&sp, (long long)len);
        sp_bin(&sp, data, len);
        /* Retry-safe: the same bytes twice are one row, the same name of
         * them one name. */
        err = store_exec(store, "store an image", SQL_PUT_IMAGE, &sp, 0, true,
                         &res);
        if (err == CQ_OK) {
                if (createdp)
                        *createdp = PQgetvalue(res, 0, 0)[0] == 't';
                if (sha256)
                        memcpy(sha256, hex, sizeof(hex));
        }
        PQclear(res);
        return err;
}

void cq_images_init(cq_images_t *images) { memset(images, 0, sizeof(*images)); }

void cq_images_release(cq_images_t *images)
{
        size_t i;

        for (i = 0; i < images->n; i++) {
                free(images->v[i].name);
                free(images->v[i].mime);
                free(images->v[i].data);
        }
        free(images->v);
        cq_images_init(images);
}

static char *binary_text(const PGresult *res, int row, int col, bool *oom)
{
        int len = PQgetlength(res, row, col);
        char *s = malloc((size_t)len + 1);

        if (!s) {
                *oom = true;
                return NULL;
        }
        memcpy(s, PQgetvalue(res, row, col), (size_t)len);
        s[len] = '\0';
        return s;
}

cq_err_t
cq_store_get_images(cq_store_t *store, const char *job_id, cq_images_t *images)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;
        bool oom = false;
        int row, n;

        sp_init(&sp);
        sp_text(&sp, job_id);
        err = store_exec(store, "read images", SQL_GET_IMAGES, &sp, 1, true,
                         &res);
        if (err != CQ_OK)
                goto out;
        n = PQntuples(res);
        if (n == 0)
                goto out;
        images->v = calloc((size_t)n, sizeof(*images->v));
        if (!images->v) {
                oom = true;
                goto out;
        }
        for (row = 0; row < n; row++) {
                cq_image_t *img = &images->v[row];
                size_t len = (size_t)PQgetlength(res, row, 4);
                char *seq;

                images->n++;
                snprintf(img->sha256, sizeof(img->sha256), "%.*s",
                         PQgetlength(res, row, 0), PQgetvalue(res, row, 0));
                img->name = binary_text(res, row, 1, &oom);
                img->mime = binary_text(res, row, 2, &oom);
                seq = binary_text(res, row, 3, &oom);
                img->cell_seq = seq ? (int)strtol(seq, NULL, 10) : 0;
                free(seq);
                img->data = malloc(len ? len : 1);
                if (!img->data) {
                        oom = true;
                        break;
                }
                memcpy(img->data, PQgetvalue(res, row, 4), len);
                img->len = len;
        }
out:
        if (oom) {
                store_set_error(store,
                                "could not read images of job \"%s\": "
                                "out of memory",
                                job_id);
                cq_images_release(images);
                err = CQ_ERR_FATAL;
        }
        PQclear(res);
        return err;
}

void cq_checkpoint_init(cq_checkpoint_t *cp) { memset(cp, 0, sizeof(*cp)); }

void cq_checkpoint_release(cq_checkpoint_t *cp)
{
        json_decref(cp->messages);
        json_decref(cp->cells);
        json_decref(cp->notebook);
        cq_checkpoint_init(cp);
}

int store_decode_outputs(cq_store_t *store,
                         const PGresult *res,
                         int col,
                         json_t *cells)
{
        json_t *cell;
        size_t i;

        if (!memmem(PQgetvalue(res, 0, col), (size_t)PQgetlength(res, 0, col),
                    "\xef\xbf\xbf", 3))
                return 0;
        json_array_foreach(cells, i, cell)
        {
                json_t *outputs = json_object_get(cell, "outputs"), *dec;

                if (!outputs)
                        continue;
                dec = store_doc_decode(outputs);
                if (!dec || json_object_set_new(cell, "outputs", dec)) {
                        store_set_error(store, "could not read the outputs "
                                               "of a cell: out of memory");
                        return -1;
                }
        }
        return 0;
}

cq_err_t cq_store_load_checkpoint(cq_store_t *store,
                                  const char *job_id,
                                  cq_checkpoint_t *cp)
{
        store_params_t sp;
        PGresult *res = NULL;
        cq_err_t err;

        sp_init(&sp);
        sp_text(&sp, job_id);
        err = store_exec(store, "load a checkpoint", SQL_CHECKPOINT, &sp, 0,
                         true, &res);
        if (err != CQ_OK)
                goto out;
        cp->messages = store_doc_value(store, res, 0, 0, "messages");
        cp->cells = store_json_value(store, res, 0, 1, "cells");
        if (!PQgetisnull(res, 0, 2))
                cp->notebook = store_doc_value(store, res, 0, 2, "notebook");
        cp->last_message_seq = (int)store_long_value(res, 0, 3);
        cp->last_cell_seq = (int)store_long_value(res, 0, 4);
        if (cp->cells && store_decode_outputs(store, res, 1, cp->cells) != 0)
                err = CQ_ERR_FATAL;
        if (!cp->messages || !cp->cells ||
            (!PQgetisnull(res, 0, 2) && !cp->notebook))
                err = CQ_ERR_FATAL;
        if (err != CQ_OK)
                cq_checkpoint_release(cp);
out:
        PQclear(res);
        return err;
}
