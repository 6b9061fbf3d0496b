/* SPDX-License-Identifier: MIT */
/* config.h - every setting of coderq, read from a CODERQ_* environment
 * variable (a few also from a conventional name such as OPENAI_API_KEY) and
 * overridable by a command-line flag derived from the variable's name:
 * CODERQ_LOG_LEVEL <-> --log-level. Invalid values are rejected with a
 * message that names the variable or flag.
 *
 * Adding a setting: a field in cq_config_t and one row in config.c's table;
 * --help, the environment and the flag then all work. */
#ifndef CODERQ_CONFIG_H
#define CODERQ_CONFIG_H

#include <stdio.h>

#include "coderq/common/common.h"
#include "coderq/common/log.h"

typedef enum cq_cfg_type {
        CQ_CFG_STRING, /* char *, may be NULL (unset) */
        CQ_CFG_SECRET, /* like STRING, never printed */
        CQ_CFG_INT,    /* long, within [min, max] */
        CQ_CFG_BOOL,   /* bool: 1/0, true/false, yes/no, on/off */
        CQ_CFG_SIZE,   /* size_t bytes, suffixes k, M, G (powers of 1024) */
        CQ_CFG_LEVEL,  /* cq_log_level_t */
        CQ_CFG_CHOICE, /* char *, one of a '|'-separated list */
        CQ_CFG_RANGE,  /* char *: auto, off or FIRST-LAST within [min, max] */
} cq_cfg_type_t;

/** @brief All settings. Strings are owned by the struct. */
typedef struct cq_config {
        /* general */
        cq_log_level_t log_level;
        char *worker_id;
        char *metrics_addr; /* CODERQ_METRICS_ADDR, or NULL */
        long health_stall_s;
        /* services */
        char *pg_dsn;
        char *kafka_brokers;
        char *kafka_properties;        /* path of a properties file */
        struct cq_kprops *kafka_props; /* the file and the
                                          CODERQ_KAFKA_PROP_* variables,
                                          once cq_config_load_kafka() ran;
                                          NULL before */
        /* LLM */
        char *llm_provider; /* "openai" or "anthropic" */
        char *llm_base_url;
        char *llm_api_key;
        char *llm_anthropic_api_key;
        long llm_rate_max;
        char *llm_model;
        long llm_max_tokens;
        long llm_connect_timeout_s;
        long llm_timeout_s;
        long llm_max_attempts;
        long llm_max_wait_s;
        size_t llm_response_max;
        long llm_context_window;
        char *prices_file; /* CODERQ_PRICES_FILE, or NULL */
        /* local kernels */
        char *python;
        char *work_root;
        long kpool_size;
        long kpool_starts;
        long kpool_nice;
        long cell_gate;
        long kernel_startup_timeout_s;
        char *kernel_server;  /* auto, on or off */
        char *kernel_preload; /* modules, comma-separated */
        size_t output_max;
        char *sandbox;
        char *sandbox_uids; /* auto, off or FIRST-LAST */
        size_t sandbox_mem;
        long sandbox_nproc;
        size_t sandbox_fsize;
        size_t sandbox_tmp, sandbox_shm; /* tmpfs sizes of /tmp, /dev/shm */
        /* storage */
        char *migrations_dir;
        long lease_s;
        long max_attempts;
        long requeue_delay_ms;
        long requeue_delay_max_s;
        long parent_wait_s;
        size_t notebook_max;
        size_t image_max;
        long memory_threshold; /* percent */
        char *memory_scope;    /* NULL: jobs without a scope use no memory */
        long pg_reconnect_s;
        char *pg_prepare;
        /* agent loop */
        long max_turns;
        long max_retries;
        long cell_timeout_s;
        long job_timeout_s;
        long case_time_factor;
        char *system_prompt;
        size_t tool_item_max;
        size_t tool_total_max;
        size_t artifact_max;
        /* kafka */
        char *topic_jobs;
        char *topic_dlq;
        char *topic_results;
        char *topic_events;
        char *kafka_group;
        size_t job_max_bytes;
        long backlog_max;
        long events_queue_max;
        long events_linger_ms;
        long relay_interval_ms;
        long relay_idle_ms;
        size_t event_max_bytes;
        /* worker */
        long slots;
        long drain_s;
        char *queues; /* comma-separated queue names (cq_config_queues()) */
        long poll_ms;
        /* interpreter backend */
        char *backend; /* "local" or "e2b" */
        /* E2B (see e2b.h) */
        char *e2b_api_key;
        char *e2b_domain;
        char *e2b_api_url;
        char *e2b_sandbox_url;
        char *e2b_template;
        long e2b_ttl_s;
        long e2b_max_timeout_s;
        char *e2b_create_path;
        /* job input files fetched by URL */
        char *fetch_allow;
} cq_config_t;

#define CQ_QUEUES_MAX     64 /* queues one worker serves */
#define CQ_QUEUE_NAME_MAX 64

/**
 * @brief Split CODERQ_QUEUES (\p list; NULL: "default") into queue names,
 *        each 1-64 of [a-z0-9._-], duplicates dropped.
 * @param names (out) room for \p max names.
 * @param np (out, may be NULL) how many.
 * @returns 0, or -1 with \p errstr naming CODERQ_QUEUES.
 * @locality Any thread.
 */
CQ_NODISCARD int cq_config_queues(const char *list,
                                  char names[][CQ_QUEUE_NAME_MAX + 1],
                                  size_t max,
                                  size_t *np,
                                  char *errstr,
                                  size_t errstr_size);

/** @brief One row of the settings table; read-only. */
typedef struct cq_cfg_entry {
        const char *env;     /* "CODERQ_LOG_LEVEL" */
        const char *alt_env; /* read when env is unset, or NULL */
        const char *flag;    /* "log-level" (derived; for --help) */
        cq_cfg_type_t type;
        size_t offset;       /* into cq_config_t */
        const char *defval;  /* textual default, NULL for unset */
        long min, max;       /* CQ_CFG_INT, _SIZE and _RANGE bounds */
        const char *choices; /* CQ_CFG_CHOICE: "local|e2b" */
        const char *help;
} cq_cfg_entry_t;

/** @brief The settings table, in --help order. */
const cq_cfg_entry_t *cq_config_entries(size_t *np);

/**
 * @brief Fill \p cfg with the defaults.
 * @returns 0, or -1 when out of memory.
 */
CQ_NODISCARD int cq_config_init(cq_config_t *cfg);

/** @brief Free the strings, not the struct. */
void cq_config_release(cq_config_t *cfg);

/**
 * @brief The settings a one-shot command (`coderq run`, `coderq exec`)
 *        starts its single kernel with: \p src, where
 *        CODERQ_KERNEL_SERVER=auto means off and, with the server off,
 *        nothing is preloaded. A server's start (its imports and probe)
 *        costs more than the one kernel it would fork, and a job imports
 *        what it uses itself.
 * @param dst (out) A shallow copy: its strings are \p src's or static;
 *        never pass it to cq_config_release().
 */
void cq_config_one_shot(cq_config_t *dst, const cq_config_t *src);

/**
 * @brief Apply every variable set in the environment.
 * @returns 0, or -1 on the first invalid value with \p errstr filled:
 *          invalid value "x" for CODERQ_SLOTS: expected an integer ...
 */
CQ_NODISCARD int
cq_config_load_env(cq_config_t *cfg, char *errstr, size_t errstr_size);

/**
 * @brief Set one setting by variable name ("CODERQ_SLOTS") or flag name
 *        ("slots"); \p source names it in errors.
 * @returns 0; 1 when \p name is no setting; -1 on an invalid value.
 */
CQ_NODISCARD int cq_config_set(cq_config_t *cfg,
                               const char *name,
                               const char *value,
                               const char *source,
                               char *errstr,
                               size_t errstr_size);

/**
 * @brief Consume "--flag=value" and "--flag value" arguments that name a
 *        setting, compacting argv to what is left (argv[0] kept).
 * @returns 0, or -1 on an invalid value or a flag missing its value.
 */
CQ_NODISCARD int cq_config_parse_args(cq_config_t *cfg,
                                      int *argcp,
                                      char **argv,
                                      char *errstr,
                                      size_t errstr_size);

/**
 * @brief Checks that span settings, run once all are set: the E2B TTL
 *        within the plan's longest timeout (E2B refuses a longer one with
 *        HTTP 400 on every create).
 * @returns 0, or -1 with \p errstr filled.
 */
CQ_NODISCARD int
cq_config_check(const cq_config_t *cfg, char *errstr, size_t errstr_size);

/**
 * @brief Read the operator's librdkafka properties into cfg->kafka_props:
 *        the CODERQ_KAFKA_PROPERTIES file (when set), then the
 *        CODERQ_KAFKA_PROP_<NAME> variables of \p envp (see kprops.h).
 *        Run once every flag is parsed.
 * @returns 0, or -1 with \p errstr filled (the file's line or the
 *          variable named, no value quoted).
 */
CQ_NODISCARD int cq_config_load_kafka(cq_config_t *cfg,
                                      char *const *envp,
                                      char *errstr,
                                      size_t errstr_size);

/** @brief Print every variable, its flag, default and help to \p fp. */
void cq_config_print_help(FILE *fp);

/**
 * @brief Print docs/CONFIGURATION.md to \p fp: every setting as a row of a
 *        Markdown table (variable, flag, the values it takes, default,
 *        meaning) with the prose around it. scripts/gen-docs.sh writes the
 *        file from it; check_cli fails when the committed file differs.
 * @locality Any thread.
 */
void cq_config_print_markdown(FILE *fp);

/**
 * @brief Describe the current value of one setting for logs: secrets are
 *        "(set)" or "(unset)".
 */
void cq_config_describe(const cq_config_t *cfg,
                        const cq_cfg_entry_t *entry,
                        char *out,
                        size_t out_size);

#endif
