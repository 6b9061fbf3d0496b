/* SPDX-License-Identifier: MIT */
/* cmd_cli.h - the commands of the coderq executable and the small helpers
 * they share: option parsing, reading input files and opening the store
 * with the exit code a failure maps to. Each command lives in
 * cli/cmd_<name>.c; cli.c's table refers to them. */
#ifndef CODERQ_CMD_CLI_H
#define CODERQ_CMD_CLI_H

#include "coderq/cli/cli.h"
#include "coderq/cli/clifmt.h"
#include "coderq/storage/store.h"

cq_cmd_fn_t cq_cmd_submit;
cq_cmd_fn_t cq_cmd_status;
cq_cmd_fn_t cq_cmd_results;
cq_cmd_fn_t cq_cmd_export;
cq_cmd_fn_t cq_cmd_cancel;
cq_cmd_fn_t cq_cmd_migrate;
cq_cmd_fn_t cq_cmd_doctor;
cq_cmd_fn_t cq_cmd_run;
cq_cmd_fn_t cq_cmd_exec;
cq_cmd_fn_t cq_cmd_worker;
cq_cmd_fn_t cq_cmd_report;
cq_cmd_fn_t cq_cmd_retry;
cq_cmd_fn_t cq_cmd_budget;
cq_cmd_fn_t cq_cmd_eval;

/* The usage text of doctor, shared with its tests. */
extern const char cq_cmd_doctor_usage[];

/**
 * @brief Read a whole file ("-" is stdin) refusing more than \p max bytes.
 * @param textp (out) NUL-terminated contents; caller owns it (free()).
 * @returns 0, or -1 after printing one error line.
 */
CQ_NODISCARD int
cq_cmd_read_file(const char *path, size_t max, char **textp, size_t *lenp);

/**
 * @brief Match argv[*ip] against the option \p name ("--out"), as
 *        "--out VALUE" or "--out=VALUE".
 * @param valuep (out) Borrowed from argv.
 * @returns 1 when it matched (*ip then points at the last argument used),
 *          0 when argv[*ip] is another argument, -1 when the value is
 *          missing (an error line was printed).
 */
int cq_cli_opt(
    int argc, char **argv, int *ip, const char *name, const char **valuep);

/**
 * @brief Parse a whole decimal number in [min, max] for option \p name.
 * @returns 0, or -1 after printing an error line.
 */
int cq_cli_parse_long(
    const char *name, const char *text, long min, long max, long *valuep);

/**
 * @brief Parse a whole decimal number in [min, max] for option \p name.
 * @returns 0, or -1 after printing an error line.
 */
int cq_cli_parse_double(
    const char *name, const char *text, double min, double max, double *valuep);

/** @brief Fill \p buf with \p n random bytes (getrandom()).
 *  @returns 0, or -1 with errno set. */
CQ_NODISCARD int cq_cli_random(void *buf, size_t n);

/**
 * @brief A new run id: "PREFIX-YYYYMMDD-HHMMSS-xxxxxx" (UTC, 6 random hex
 *        digits), for \p size >= strlen(prefix) + 24.
 * @returns 0, or -1 after printing an error line.
 */
CQ_NODISCARD int cq_cli_new_run_id(const char *prefix, char *out, size_t size);

/**
 * @brief Keep the warnings of the clients a command runs (the Kafka
 *        producer logs them for a worker's operators) off its terminal:
 *        a command says what failed in its one line, so below error they
 *        show only at debug. A log that is off (the commands' quiet
 *        default, no --verbose) stays off.
 * @locality The main thread, before the clients start.
 */
void cq_cli_quiet_clients(void);

/** @brief Sleep \p ms milliseconds, signals notwithstanding. */
void cq_cli_sleep_ms(long ms);

/** @brief The wait before the next look at jobs followed with --wait,
 *         after a wait of \p interval ms (0: the first): 250 ms doubling
 *         to 1 s, and 100 ms while the jobs \p left are no more than
 *         those that finished since the last look (\p finished), so that
 *         the command ends soon after its last job. */
long cq_cli_follow_interval(long interval, size_t left, size_t finished);

/** @brief The progress line of a wait on stderr: redrawn in place on a
 *         terminal, else a plain line at each change and every 30 s. */
typedef struct cq_cli_progress {
        bool tty;
        bool shown;         /* a line is drawn and not ended */
        char last[256];     /* not a terminal: the last line printed */
        int64_t last_print; /* cq_now_ms() of it */
} cq_cli_progress_t;

void cq_cli_progress_init(cq_cli_progress_t *out);
void cq_cli_progress_show(cq_cli_progress_t *out,
                          const cq_progress_t *progress);
/** @brief End the line drawn on a terminal (before printing more). */
void cq_cli_progress_end(cq_cli_progress_t *out);

/**
 * @brief Send job messages as `coderq submit` does (the idempotent
 *        producer, key = job id, the value as given), and print each
 *        delivered id on stdout when \p print_ids.
 * @param ids, values Borrowed; \p n of each, values NUL-terminated and
 *        already validated.
 * @returns An exit code: 0 all delivered, 1 some refused, 3 the producer
 *          could not be configured, 4 Kafka unreachable.
 */
int cq_cli_send_jobs(const cq_config_t *cfg,
                     const char *const *ids,
                     const char *const *values,
                     size_t n,
                     bool print_ids);

/**
 * @brief Send job messages as `coderq submit` does (the idempotent
 *        producer, key = job id, the value as given; each delivered id
 *        printed on stdout), then with \p wait follow them as
 *        `submit --wait` does (\p timeout_s 0: no limit).
 * @param ids, values Borrowed; \p n of each, values NUL-terminated and
 *        already validated.
 * @returns An exit code, as `coderq submit` returns them.
 */
int cq_cli_submit_jobs(const cq_config_t *cfg,
                       const char *const *ids,
                       const char *const *values,
                       size_t n,
                       bool wait,
                       long timeout_s);

/** @brief The exit code for a failed store call: 4 when PostgreSQL could
 *         not be reached, else 1. */
int cq_cli_store_exit(cq_err_t err);

/**
 * @brief Connect to PostgreSQL with the configured settings.
 * @param storep (out) Caller owns the returned value; free with
 *        cq_store_destroy().
 * @returns CQ_EXIT_OK, or CQ_EXIT_UNAVAILABLE / CQ_EXIT_CONFIG after
 *          printing an error line.
 */
int cq_cli_store_open(const cq_config_t *cfg, cq_store_t **storep);

/**
 * @brief Write \p len bytes to \p path (mode 0644) through a temporary
 *        file and a rename, so a reader never sees half a file.
 * @returns 0, or -1 after printing an error line.
 */
CQ_NODISCARD int
cq_cli_write_file(const char *path, const void *data, size_t len);

/**
 * @brief Create directory \p path (mode 0755) unless it is one already.
 * @returns 0, or -1 after printing an error line.
 */
CQ_NODISCARD int cq_cli_make_dir(const char *path);

#endif
