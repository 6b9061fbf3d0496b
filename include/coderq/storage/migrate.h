/* SPDX-License-Identifier: MIT */
/* migrate.h - the migration runner over the numbered SQL files of migrations/.
 * Errors and threads as store.h says. */
#ifndef CODERQ_STORAGE_MIGRATE_H
#define CODERQ_STORAGE_MIGRATE_H

#include "coderq/storage/store.h"

/** @brief Called with each migration file name as it is applied. */
typedef void(cq_migrate_cb_t)(void *opaque, const char *name);

/**
 * @brief Apply the pending migrations of \p dir (NULL: CODERQ_MIGRATIONS_DIR
 *        default compiled in) to the database at \p dsn: NNNN_name.sql in
 *        version order, each in its own transaction, recorded with its
 *        SHA-256 in schema_migrations, serialised by an advisory lock. A
 *        file changed after it was applied is refused.
 * @param appliedp (out, optional) How many were applied now.
 * @returns CQ_OK; CQ_ERR_RETRIABLE when PostgreSQL is unreachable;
 *          CQ_ERR_FATAL for a refused or failed migration (\p errstr).
 * @locality Any thread; opens its own connection.
 */
CQ_NODISCARD cq_err_t cq_migrate_run(const char *dsn,
                                     const char *dir,
                                     cq_migrate_cb_t *cb,
                                     void *opaque,
                                     int *appliedp,
                                     char *errstr,
                                     size_t errstr_size);

/** @brief The compiled-in migrations directory. */
const char *cq_migrate_default_dir(void);

#endif
