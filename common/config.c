/* SPDX-License-Identifier: MIT */
/* config.c - the settings table and its parsers. Values come from the
 * defaults, then the environment, then flags; the last one wins. Nothing
 * here is global: the table is constant and values live in cq_config_t. */
#include "coderq/common/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coderq/common/kprops.h"

#define F(field) offsetof(cq_config_t, field)

/* One row per setting. The flag is derived from env: CODERQ_FOO_BAR ->
 * foo-bar (see flag_of()); the column only documents it. */
static const cq_cfg_entry_t entries[] = {
    {"CODERQ_LOG_LEVEL", NULL, "log-level", CQ_CFG_LEVEL, F(log_level), "info",
     0, 0, NULL,
     "lowest log level written to stderr: debug, info, warn or error"},
    {"CODERQ_WORKER_ID", NULL, "worker-id", CQ_CFG_STRING, F(worker_id), NULL,
     0, 0, NULL,
     "name of this worker in leases and events (default: host name and "
     "process id)"},
    {"CODERQ_METRICS_ADDR", NULL, "metrics-addr", CQ_CFG_STRING,
     F(metrics_addr), NULL, 0, 0, NULL,
     "HOST:PORT, :PORT or [V6]:PORT where coderq worker serves /metrics, "
     "/healthz and /readyz over HTTP (unset: no server; see "
     "docs/OPERATIONS.md#metrics-and-health)"},
    {"CODERQ_HEALTH_STALL_S", NULL, "health-stall-s", CQ_CFG_INT,
     F(health_stall_s), "120", 5, 3600, NULL,
     "seconds a worker thread may go without a heartbeat before /healthz "
     "answers 503; keep it above a few CODERQ_PG_RECONNECT_S, which a "
     "thread may wait per statement while PostgreSQL is down"},
    {"CODERQ_PG_DSN", NULL, "pg-dsn", CQ_CFG_SECRET, F(pg_dsn), NULL, 0, 0,
     NULL,
     "libpq connection string or URI of the PostgreSQL database (libpq's "
     "PG* variables fill what it leaves out)"},
    {"CODERQ_KAFKA_BROKERS", NULL, "kafka-brokers", CQ_CFG_STRING,
     F(kafka_brokers), "127.0.0.1:9092", 0, 0, NULL,
     "Kafka bootstrap servers, comma-separated host:port"},
    {"CODERQ_KAFKA_PROPERTIES", NULL, "kafka-properties", CQ_CFG_STRING,
     F(kafka_properties), NULL, 0, 0, NULL,
     "librdkafka properties file (name=value lines, # comments, as Kafka's "
     "tools take) for every Kafka client, e.g. security.protocol, "
     "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location; "
     "CODERQ_KAFKA_PROP_<NAME> variables (SASL_MECHANISM for "
     "sasl.mechanism) win over it; see "
     "docs/DEPLOYING.md#kafka-client-properties"},
    {"CODERQ_LLM_PROVIDER", NULL, "llm-provider", CQ_CFG_CHOICE,
     F(llm_provider), "openai", 0, 0, "openai|anthropic|none",
     "wire format of the LLM API: openai (Chat Completions) or anthropic "
     "(Messages API); a job's \"provider\" overrides it. none: no LLM, for "
     "workers that only judge jobs with a \"solution\" (coderq eval's); "
     "any other job fails at once with reason code llm"},
    {"CODERQ_LLM_BASE_URL", NULL, "llm-base-url", CQ_CFG_STRING,
     F(llm_base_url), NULL, 0, 0, NULL,
     "base URL of the LLM API for every provider (unset: "
     "https://api.openai.com/v1 or https://api.anthropic.com); openai "
     "requests go to BASE/chat/completions, anthropic ones to "
     "BASE/v1/messages (BASE/messages when BASE ends in /v1)"},
    {"CODERQ_LLM_API_KEY", "OPENAI_API_KEY", "llm-api-key", CQ_CFG_SECRET,
     F(llm_api_key), NULL, 0, 0, NULL,
     "API key: a Bearer token for openai, x-api-key for anthropic unless "
     "CODERQ_LLM_ANTHROPIC_API_KEY is set (unset: no key header; a worker "
     "then refuses to start unless CODERQ_LLM_BASE_URL is local, see "
     "docs/DEPLOYING.md#llm-providers)"},
    {"CODERQ_LLM_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY",
     "llm-anthropic-api-key", CQ_CFG_SECRET, F(llm_anthropic_api_key), NULL, 0,
     0, NULL,
     "API key for anthropic requests, preferred to CODERQ_LLM_API_KEY"},
    {"CODERQ_LLM_RATE_MAX", NULL, "llm-rate-max", CQ_CFG_INT, F(llm_rate_max),
     "0", 0, 1000000, NULL,
     "ceiling of the requests per second a worker sends per model, shared "
     "by its slots (0: none; the rate still adapts to 429 and 529)"},
    {"CODERQ_LLM_MODEL", NULL, "llm-model", CQ_CFG_STRING, F(llm_model),
     "gpt-4o-mini", 0, 0, NULL, "model name (a job's \"model\" overrides it)"},
    {"CODERQ_LLM_MAX_TOKENS", NULL, "llm-max-tokens", CQ_CFG_INT,
     F(llm_max_tokens), "8192", 1, 1000000, NULL, "max_tokens of each reply"},
    {"CODERQ_LLM_CONNECT_TIMEOUT_S", NULL, "llm-connect-timeout-s", CQ_CFG_INT,
     F(llm_connect_timeout_s), "10", 1, 600, NULL,
     "seconds to establish the connection to the LLM API"},
    {"CODERQ_LLM_TIMEOUT_S", NULL, "llm-timeout-s", CQ_CFG_INT,
     F(llm_timeout_s), "300", 1, 86400, NULL,
     "seconds for one whole LLM request (each attempt)"},
    {"CODERQ_LLM_MAX_ATTEMPTS", NULL, "llm-max-attempts", CQ_CFG_INT,
     F(llm_max_attempts), "5", 1, 100, NULL,
     "attempts per LLM call on 429, 5xx, network errors and invalid replies"},
    {"CODERQ_LLM_MAX_WAIT_S", NULL, "llm-max-wait-s", CQ_CFG_INT,
     F(llm_max_wait_s), "120", 0, 86400, NULL,
     "total seconds of backoff (Retry-After included) per LLM call"},
    {"CODERQ_LLM_RESPONSE_MAX", NULL, "llm-response-max", CQ_CFG_SIZE,
     F(llm_response_max), "8M", 1024, 1024L * 1024 * 1024, NULL,
     "largest LLM reply body accepted; a larger one fails the call"},
    {"CODERQ_LLM_CONTEXT_WINDOW", NULL, "llm-context-window", CQ_CFG_INT,
     F(llm_context_window), "128000", 1024, 100000000, NULL,
     "the model's context window in tokens; old tool outputs are elided "
     "as the history nears it"},
    {"CODERQ_PRICES_FILE", NULL, "prices-file", CQ_CFG_STRING, F(prices_file),
     NULL, 0, 0, NULL,
     "JSON file of token prices per model, USD per million input, output, "
     "cached-input and cache-write tokens, that give jobs their cost_usd "
     "(unset: every cost is unknown; see "
     "docs/EVALUATION.md#cost-and-budgets); read when a command starts, a "
     "malformed file is a configuration error"},
    {"CODERQ_PYTHON", NULL, "python", CQ_CFG_STRING, F(python),
     "/usr/bin/python3", 0, 0, NULL,
     "Python interpreter with ipykernel that runs local kernels"},
    {"CODERQ_WORK_ROOT", NULL, "work-root", CQ_CFG_STRING, F(work_root), NULL,
     0, 0, NULL,
     "directory holding one work dir per local kernel (default: "
     "$TMPDIR/coderq or /tmp/coderq)"},
    {"CODERQ_KPOOL_SIZE", NULL, "kpool-size", CQ_CFG_INT, F(kpool_size), "2", 0,
     64, NULL, "local kernels kept started and ready for new jobs"},
    {"CODERQ_KPOOL_STARTS", NULL, "kpool-starts", CQ_CFG_INT, F(kpool_starts),
     "2", 1, 16, NULL,
     "local kernels the pool starts at once (a start is CPU-bound: about "
     "the number of cores)"},
    {"CODERQ_KPOOL_NICE", NULL, "kpool-nice", CQ_CFG_INT, F(kpool_nice), "15",
     0, 19, NULL,
     "niceness of pool kernels while they start and wait, restored when a "
     "job takes one, so pre-starts yield the CPU to running jobs (0: off; "
     "needs CAP_SYS_NICE or RLIMIT_NICE, else off)"},
    {"CODERQ_CELL_GATE", NULL, "cell-gate", CQ_CFG_INT, F(cell_gate), "4", 0,
     1024, NULL,
     "local cells that start at once, first come first served; a cell "
     "counts for its first 50 ms only (0: no gate)"},
    {"CODERQ_KERNEL_STARTUP_TIMEOUT_S", NULL, "kernel-startup-timeout-s",
     CQ_CFG_INT, F(kernel_startup_timeout_s), "60", 1, 3600, NULL,
     "seconds a local kernel may take to become ready"},
    {"CODERQ_KERNEL_SERVER", NULL, "kernel-server", CQ_CFG_CHOICE,
     F(kernel_server), "auto", 0, 0, "auto|on|off",
     "forking kernel server: local kernels are forked from one process that "
     "imported CODERQ_KERNEL_PRELOAD once, as confined as cold ones; auto "
     "uses it when its start-up probe passes (else cold starts, logged at "
     "warn), on refuses to start without it, off starts every kernel cold "
     "(see docs/internals/BACKENDS.md#the-kernel-server)"},
    {"CODERQ_KERNEL_PRELOAD", NULL, "kernel-preload", CQ_CFG_STRING,
     F(kernel_preload), "numpy,pandas,matplotlib.pyplot,scipy", 0, 0, NULL,
     "comma-separated modules the kernel server imports once for every "
     "kernel it forks (empty: ipykernel only)"},
    {"CODERQ_OUTPUT_MAX", NULL, "output-max", CQ_CFG_SIZE, F(output_max), "1M",
     1024, 0, NULL,
     "output kept per cell, every byte counted (head and tail around a "
     "marker stating the bytes dropped); also bounds one kernel message or "
     "E2B line to this plus 64 KiB"},
    {"CODERQ_SANDBOX", NULL, "sandbox", CQ_CFG_CHOICE, F(sandbox), "on", 0, 0,
     "on|auto|off",
     "bubblewrap sandbox for local kernels: on refuses to start without it; "
     "auto runs kernels unsandboxed when its startup probe fails; off never "
     "uses it (both warn at start and with every job)"},
    {"CODERQ_SANDBOX_UIDS", NULL, "sandbox-uids", CQ_CFG_RANGE, F(sandbox_uids),
     "auto", 1000, 2147483646L, NULL, /* CQ_SANDBOX_UIDS_MIN, _MAX */
     "uids of sandboxed kernels, one per kernel so each has its own process "
     "limit: FIRST-LAST (no uid or gid of an existing account or group; "
     "the worker must be root), auto (100000-100999 when root, else the "
     "worker's own uid) or off (every kernel as 65534)"},
    {"CODERQ_SANDBOX_MEM", NULL, "sandbox-mem", CQ_CFG_SIZE, F(sandbox_mem),
     "4G", 0, 0, NULL, "address-space limit (RLIMIT_AS) of a kernel; 0: none"},
    {"CODERQ_SANDBOX_NPROC", NULL, "sandbox-nproc", CQ_CFG_INT,
     F(sandbox_nproc), "512", 0, 1000000, NULL,
     "process and thread limit (RLIMIT_NPROC) of the kernel uid (of each "
     "kernel with a uid per kernel); 0: none"},
    {"CODERQ_SANDBOX_FSIZE", NULL, "sandbox-fsize", CQ_CFG_SIZE,
     F(sandbox_fsize), "1G", 0, 0, NULL,
     "largest file a kernel may write (RLIMIT_FSIZE); 0: none"},
    {"CODERQ_SANDBOX_TMP", NULL, "sandbox-tmp", CQ_CFG_SIZE, F(sandbox_tmp),
     "512M", 0, 0, NULL,
     "size of a sandboxed kernel's /tmp, a tmpfs of its own (memory, which "
     "RLIMIT_AS does not count): a write beyond it fails with ENOSPC; 0: "
     "Linux's default, half of RAM"},
    {"CODERQ_SANDBOX_SHM", NULL, "sandbox-shm", CQ_CFG_SIZE, F(sandbox_shm),
     "64M", 0, 0, NULL,
     "size of a sandboxed kernel's /dev/shm (POSIX shared memory, "
     "multiprocessing's semaphores), a tmpfs of its own; 0: Linux's "
     "default, half of RAM"},
    {"CODERQ_MIGRATIONS_DIR", NULL, "migrations-dir", CQ_CFG_STRING,
     F(migrations_dir), NULL, 0, 0, NULL,
     "folder of NNNN_name.sql migrations applied by coderq migrate (default: "
     "the migrations/ folder of the source tree coderq was built from)"},
    {"CODERQ_LEASE_S", NULL, "lease-s", CQ_CFG_INT, F(lease_s), "120", 5, 86400,
     NULL,
     "seconds a claimed job stays leased without a heartbeat before another "
     "worker may take it over"},
    {"CODERQ_MAX_ATTEMPTS", NULL, "max-attempts", CQ_CFG_INT, F(max_attempts),
     "3", 1, 100, NULL,
     "claims of one job before it fails (a crashed or lost worker, or a "
     "try that found no interpreter, counts one; a shutdown does not)"},
    {"CODERQ_REQUEUE_DELAY_MS", NULL, "requeue-delay-ms", CQ_CFG_INT,
     F(requeue_delay_ms), "2000", 0, 3600000, NULL,
     "wait before a job that met a passing failure (no interpreter, "
     "PostgreSQL trouble) is tried again; doubles with each attempt, "
     "jittered"},
    {"CODERQ_REQUEUE_DELAY_MAX_S", NULL, "requeue-delay-max-s", CQ_CFG_INT,
     F(requeue_delay_max_s), "300", 1, 86400, NULL,
     "longest wait before a job is tried again"},
    {"CODERQ_PARENT_WAIT_S", NULL, "parent-wait-s", CQ_CFG_INT,
     F(parent_wait_s), "3600", 1, 604800, NULL,
     "seconds a job waits for its parent_job_id to exist before it fails"},
    {"CODERQ_NOTEBOOK_MAX", NULL, "notebook-max", CQ_CFG_SIZE, F(notebook_max),
     "64M", 4096, 200L << 20, NULL,
     "largest notebook stored (serialized JSON); a larger one is refused"},
    {"CODERQ_IMAGE_MAX", NULL, "image-max", CQ_CFG_SIZE, F(image_max), "32M",
     1024, 1L << 30, NULL, "largest image stored; a larger one is refused"},
    {"CODERQ_MEMORY_THRESHOLD", NULL, "memory-threshold", CQ_CFG_INT,
     F(memory_threshold), "30", 1, 100, NULL,
     "percent of trigram similarity a solved problem needs to be recalled "
     "for a new prompt"},
    {"CODERQ_MEMORY_SCOPE", NULL, "memory-scope", CQ_CFG_STRING,
     F(memory_scope), NULL, 0, 0, NULL,
     "episodic memory scope of jobs that name none in \"memory\" (unset or "
     "empty: such jobs neither recall nor are remembered; see "
     "docs/EVALUATION.md#episodic-memory)"},
    {"CODERQ_PG_RECONNECT_S", NULL, "pg-reconnect-s", CQ_CFG_INT,
     F(pg_reconnect_s), "30", 0, 3600, NULL,
     "seconds to keep trying to reconnect to PostgreSQL before an operation "
     "fails"},
    {"CODERQ_PG_PREPARE", NULL, "pg-prepare", CQ_CFG_CHOICE, F(pg_prepare),
     "on", 0, 0, "on|off",
     "prepare each statement once per connection (parsed and planned once; "
     "off behind a transaction-mode pooler that cannot keep them)"},
    {"CODERQ_TOPIC_JOBS", NULL, "topic-jobs", CQ_CFG_STRING, F(topic_jobs),
     "coderq.jobs", 0, 0, NULL,
     "Kafka topic of job messages: the intake consumes it, coderq submit "
     "produces to it"},
    {"CODERQ_MAX_TURNS", NULL, "max-turns", CQ_CFG_INT, F(max_turns), "30", 1,
     1000, NULL,
     "LLM calls a job may make before it fails (a job's limits.max_turns "
     "wins)"},
    {"CODERQ_MAX_RETRIES", NULL, "max-retries", CQ_CFG_INT, F(max_retries), "5",
     0, 1000, NULL,
     "failed cells and failed test runs a job may have; one more fails it "
     "(limits.max_retries wins)"},
    {"CODERQ_CELL_TIMEOUT_S", NULL, "cell-timeout-s", CQ_CFG_INT,
     F(cell_timeout_s), "120", 1, 86400, NULL,
     "seconds one cell may run before it is interrupted and the kernel "
     "replaced (limits.cell_timeout_s wins)"},
    {"CODERQ_JOB_TIMEOUT_S", NULL, "job-timeout-s", CQ_CFG_INT,
     F(job_timeout_s), "1800", 1, 604800, NULL,
     "seconds a job may run in all (limits.job_timeout_s wins)"},
    {"CODERQ_CASE_TIME_FACTOR", NULL, "case-time-factor", CQ_CFG_INT,
     F(case_time_factor), "4", 1, 1000, NULL,
     "with a reference solution (tests.reference), each test case may take "
     "this many times what the reference took in the same kind of "
     "interpreter, and at least tests.case_timeout_s (1 s when not given), "
     "as EvalPlus calibrates its limits"},
    {"CODERQ_SYSTEM_PROMPT", NULL, "system-prompt", CQ_CFG_STRING,
     F(system_prompt), NULL, 0, 0, NULL,
     "system prompt of the agent (a job's system_prompt wins; default: the "
     "built-in English prompt)"},
    {"CODERQ_TOOL_ITEM_MAX", NULL, "tool-item-max", CQ_CFG_SIZE,
     F(tool_item_max), "2000", 200, 1048576, NULL,
     "characters of one output item the model sees (head and tail kept)"},
    {"CODERQ_TOOL_TOTAL_MAX", NULL, "tool-total-max", CQ_CFG_SIZE,
     F(tool_total_max), "8000", 500, 4194304, NULL,
     "characters of one tool result the model sees in all"},
    {"CODERQ_ARTIFACT_MAX", NULL, "artifact-max", CQ_CFG_SIZE, F(artifact_max),
     "20M", 1024, 1073741824L, NULL,
     "largest file the code creates that is kept as an artefact"},
    {"CODERQ_TOPIC_DLQ", NULL, "topic-dlq", CQ_CFG_STRING, F(topic_dlq),
     "coderq.jobs.dlq", 0, 0, NULL,
     "Kafka topic that receives invalid job messages unchanged, with an "
     "\"error\" header and their source topic/partition/offset"},
    {"CODERQ_TOPIC_RESULTS", NULL, "topic-results", CQ_CFG_STRING,
     F(topic_results), "coderq.results", 0, 0, NULL,
     "Kafka topic of completion events (the outbox relay)"},
    {"CODERQ_TOPIC_EVENTS", NULL, "topic-events", CQ_CFG_STRING,
     F(topic_events), "coderq.events", 0, 0, NULL,
     "Kafka topic of best-effort progress events"},
    {"CODERQ_KAFKA_GROUP", NULL, "kafka-group", CQ_CFG_STRING, F(kafka_group),
     "coderq-workers", 0, 0, NULL, "Kafka consumer group of the intake"},
    {"CODERQ_JOB_MAX_BYTES", NULL, "job-max-bytes", CQ_CFG_SIZE,
     F(job_max_bytes), "16M", 1024, 256L << 20, NULL,
     "largest job message accepted; a larger one goes to the DLQ"},
    {"CODERQ_BACKLOG_MAX", NULL, "backlog-max", CQ_CFG_INT, F(backlog_max),
     "1000", 0, 100000000, NULL,
     "the intake pauses its partitions while more jobs than this are "
     "queued in PostgreSQL, and resumes below it (0: never pause)"},
    {"CODERQ_EVENTS_QUEUE_MAX", NULL, "events-queue-max", CQ_CFG_INT,
     F(events_queue_max), "10000", 1, 10000000, NULL,
     "progress events waiting for Kafka before new ones are dropped"},
    {"CODERQ_EVENTS_LINGER_MS", NULL, "events-linger-ms", CQ_CFG_INT,
     F(events_linger_ms), "100", 0, 5000, NULL,
     "how long progress events wait to be sent together: linger.ms of the "
     "progress events' own producer, whose batches are lz4-compressed; "
     "completion events and the DLQ keep the shared producer's 5 ms"},
    {"CODERQ_RELAY_INTERVAL_MS", NULL, "relay-interval-ms", CQ_CFG_INT,
     F(relay_interval_ms), "200", 10, 60000, NULL,
     "how often the outbox relay looks for unsent completion events while "
     "it finds some"},
    {"CODERQ_RELAY_IDLE_MS", NULL, "relay-idle-ms", CQ_CFG_INT,
     F(relay_idle_ms), "5000", 10, 600000, NULL,
     "longest pause between the relay's looks: each look that finds "
     "nothing doubles the pause from CODERQ_RELAY_INTERVAL_MS up to this, "
     "and one that finds a row sets it back; a job this worker finishes, "
     "and a job its housekeeping fails, wake its relay at once whatever "
     "the pause"},
    {"CODERQ_EVENT_MAX_BYTES", NULL, "event-max-bytes", CQ_CFG_SIZE,
     F(event_max_bytes), "256K", 4096, 64L << 20, NULL,
     "largest completion event produced; a larger answer is cut in the "
     "event (the full answer stays in PostgreSQL). Keep it under the "
     "broker's message.max.bytes (1 MB by default)"},
    {"CODERQ_SLOTS", NULL, "slots", CQ_CFG_INT, F(slots), "2", 0, 1024, NULL,
     "jobs a worker runs at once (threads, each with its own connection "
     "and kernel); 0 runs only intake and relay"},
    {"CODERQ_DRAIN_S", "CODERQ_SHUTDOWN_S", "drain-s", CQ_CFG_INT, F(drain_s),
     "30", 1, 3600, NULL,
     "seconds a worker given SIGTERM or SIGINT has to drain: it stops "
     "claiming at once, lets running cells that end in time end, "
     "checkpoints and gives back the rest, flushes its completion events "
     "and exits 0 within this time; keep it below the grace period of "
     "whatever stops it (a pod's terminationGracePeriodSeconds). "
     "CODERQ_SHUTDOWN_S, its former name, is read when it is unset"},
    {"CODERQ_QUEUES", NULL, "queues", CQ_CFG_STRING, F(queues), "default", 0, 0,
     NULL,
     "the named queues this worker claims jobs from, comma-separated "
     "(a job's \"queue\", \"default\" when it names none); one queue per "
     "provider, backend or team keeps jobs on the workers set up for them "
     "(see docs/OPERATIONS.md#queues)"},
    {"CODERQ_POLL_MS", NULL, "poll-ms", CQ_CFG_INT, F(poll_ms), "500", 10,
     60000, NULL,
     "how often an idle worker looks for a runnable job nobody "
     "announced (one slot looks)"},
    {"CODERQ_BACKEND", NULL, "backend", CQ_CFG_CHOICE, F(backend), "local", 0,
     0, "local|e2b",
     "interpreter for jobs that do not name one: local (Jupyter kernel) or "
     "e2b (E2B sandbox); with e2b, a job naming local fails (a job may ask "
     "for more isolation, never less)"},
    {"E2B_API_KEY", NULL, "e2b-api-key", CQ_CFG_SECRET, F(e2b_api_key), NULL, 0,
     0, NULL, "E2B API key, sent as X-API-KEY (required for e2b)"},
    {"E2B_DOMAIN", NULL, "e2b-domain", CQ_CFG_STRING, F(e2b_domain), "e2b.app",
     0, 0, NULL,
     "E2B domain: API at https://api.DOMAIN, sandboxes under DOMAIN"},
    {"E2B_API_URL", NULL, "e2b-api-url", CQ_CFG_STRING, F(e2b_api_url), NULL, 0,
     0, NULL, "E2B API base URL (default: https://api.E2B_DOMAIN)"},
    {"E2B_SANDBOX_URL", NULL, "e2b-sandbox-url", CQ_CFG_STRING,
     F(e2b_sandbox_url), NULL, 0, 0, NULL,
     "base URL of every sandbox call (envd and code interpreter), routed by "
     "the E2b-Sandbox-Id/-Port headers (default: per-sandbox hosts)"},
    {"CODERQ_E2B_TEMPLATE", NULL, "e2b-template", CQ_CFG_STRING,
     F(e2b_template), "code-interpreter-v1", 0, 0, NULL,
     "E2B template of new sandboxes"},
    {"CODERQ_E2B_TTL_S", NULL, "e2b-ttl-s", CQ_CFG_INT, F(e2b_ttl_s), "300", 30,
     86400, NULL,
     "sandbox lifetime in seconds, extended while the job runs; a sandbox of "
     "a dead worker ends within this long (plus the running cell's "
     "deadline)"},
    {"CODERQ_E2B_MAX_TIMEOUT_S", NULL, "e2b-max-timeout-s", CQ_CFG_INT,
     F(e2b_max_timeout_s), "3600", 60, 86400, NULL,
     "the longest sandbox timeout the E2B plan accepts (Hobby 3600, Pro "
     "86400); CODERQ_E2B_TTL_S must not exceed it, and extensions are "
     "capped at it"},
    {"CODERQ_E2B_CREATE_PATH", NULL, "e2b-create-path", CQ_CFG_CHOICE,
     F(e2b_create_path), "/v2/sandboxes", 0, 0, "/sandboxes|/v2/sandboxes",
     "E2B API path that creates sandboxes"},
    {"CODERQ_FETCH_ALLOW", NULL, "fetch-allow", CQ_CFG_STRING, F(fetch_allow),
     NULL, 0, 0, NULL,
     "input file URLs may reach these non-public addresses: a comma-"
     "separated list of addresses, CIDR blocks and host names (default: "
     "public addresses only)"},
};

#undef F

const cq_cfg_entry_t *cq_config_entries(size_t *np)
{
        *np = CQ_ARRAY_SIZE(entries);
        return entries;
}

static void *field(cq_config_t *cfg, const cq_cfg_entry_t *entry)
{
        return (char *)cfg + entry->offset;
}

static const void *cfield(const cq_config_t *cfg, const cq_cfg_entry_t *entry)
{
        return (const char *)cfg + entry->offset;
}

/* "CODERQ_LOG_LEVEL" -> "log-level"; names without the prefix keep all
 * their words ("OPENAI_API_KEY" -> "openai-api-key"). */
static void flag_of(const char *env, char *out, size_t size)
{
        size_t i = 0;

        if (strncmp(env, "CODERQ_", 7) == 0)
                env += 7;
        for (; *env && i + 1 < size; env++, i++)
                out[i] = *env == '_' ? '-' : (char)tolower((unsigned char)*env);
        out[i] = '\0';
}

static bool parse_bool(const char *s, bool *out)
{
        static const char *const yes[] = {"1", "true", "yes", "on"};
        static const char *const no[] = {"0", "false", "no", "off"};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(yes); i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *out = true;
                        return true;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *out = false;
                        return true;
                }
        }
        return false;
}

static bool parse_long(const char *s, long *out)
{
        char *end;
        long v;

        if (!*s || isspace((unsigned char)*s))
                return false;
        errno = 0;
        v = strtol(s, &end, 10);
        if (errno || *end)
                return false;
        *out = v;
        return true;
}

/* "512", "64k", "8M", "1G" (powers of 1024); no negative values. */
static bool parse_size(const char *s, size_t *out)
{
        char *end;
        unsigned long long v, mul = 1;

        if (!*s || !isdigit((unsigned char)*s))
                return false;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno)
                return false;
        if (*end) {
                switch (*end) {
                case 'k':
                case 'K':
                        mul = 1024ULL;
                        break;
                case 'm':
                case 'M':
                        mul = 1024ULL * 1024;
                        break;
                case 'g':
                case 'G':
                        mul = 1024ULL * 1024 * 1024;
                        break;
                default:
                        return false;
                }
                end++;
                if (*end == 'b' || *end == 'B')
                        end++;
                if (*end)
                        return false;
        }
        if (v > SIZE_MAX / mul)
                return false;
        *out = (size_t)(v * mul);
        return true;
}

static bool in_choices(const char *choices, const char *s)
{
        size_t n = strlen(s);
        const char *p = choices;

        while (p && *p) {
                const char *bar = strchr(p, '|');
                size_t len = bar ? (size_t)(bar - p) : strlen(p);

                if (len == n && strncmp(p, s, n) == 0)
                        return true;
                p = bar ? bar + 1 : NULL;
        }
        return false;
}

/* "auto", "off", or "FIRST-LAST" with min <= FIRST <= LAST <= max. */
static bool valid_range(const cq_cfg_entry_t *entry, const char *s)
{
        const char *dash = strchr(s, '-');
        char first[24];
        long a, b;

        if (strcmp(s, "auto") == 0 || strcmp(s, "off") == 0)
                return true;
        if (!dash || (size_t)(dash - s) >= sizeof(first) || dash == s ||
            !isdigit((unsigned char)dash[1]))
                return false;
        memcpy(first, s, (size_t)(dash - s));
        first[dash - s] = '\0';
        if (!isdigit((unsigned char)first[0]) || !parse_long(first, &a) ||
            !parse_long(dash + 1, &b))
                return false;
        return a >= entry->min && b <= entry->max && a <= b;
}

static int set_entry(cq_config_t *cfg,
                     const cq_cfg_entry_t *entry,
                     const char *value,
                     const char *source,
                     char *errstr,
                     size_t errstr_size)
{
        void *p = field(cfg, entry);
        const char *shown = entry->type == CQ_CFG_SECRET ? "(hidden)" : value;

        switch (entry->type) {
        case CQ_CFG_STRING:
        case CQ_CFG_SECRET:
        case CQ_CFG_RANGE:
        case CQ_CFG_CHOICE: {
                char *copy;

                if (entry->type == CQ_CFG_RANGE && !valid_range(entry, value)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid value \"%s\" for %s: "
                                      "expected auto, off or FIRST-LAST "
                                      "with %ld <= FIRST <= LAST <= %ld",
                                      value, source, entry->min, entry->max);
                        return -1;
                }
                if (entry->type == CQ_CFG_CHOICE &&
                    !in_choices(entry->choices, value)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid value \"%s\" for %s: "
                                      "expected one of %s",
                                      value, source, entry->choices);
                        return -1;
                }
                copy = strdup(value);
                if (!copy) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not set %s: out of memory",
                                      source);
                        return -1;
                }
                free(*(char **)p);
                *(char **)p = copy;
                return 0;
        }
        case CQ_CFG_INT: {
                long v;

                if (!parse_long(value, &v) || v < entry->min ||
                    v > entry->max) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid value \"%s\" for %s: "
                                      "expected an integer from %ld to %ld",
                                      shown, source, entry->min, entry->max);
                        return -1;
                }
                *(long *)p = v;
                return 0;
        }
        case CQ_CFG_BOOL: {
                bool v;

                if (!parse_bool(value, &v)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid value \"%s\" for %s: "
                                      "expected true or false (1/0, yes/no, "
                                      "on/off)",
                                      shown, source);
                        return -1;
                }
                *(bool *)p = v;
                return 0;
        }
        case CQ_CFG_SIZE: {
                size_t v;

                if (!parse_size(value, &v) || v < (size_t)entry->min ||
                    (entry->max > 0 && v > (size_t)entry->max)) {
                        if (entry->max > 0)
                                cq_errstr_set(errstr, errstr_size,
                                              "invalid value \"%s\" for %s: "
                                              "expected a size in bytes from "
                                              "%ld to %ld (suffixes k, M, G)",
                                              shown, source, entry->min,
                                              entry->max);
                        else
                                cq_errstr_set(errstr, errstr_size,
                                              "invalid value \"%s\" for %s: "
                                              "expected a size in bytes of at "
                                              "least %ld (suffixes k, M, G)",
                                              shown, source, entry->min);
                        return -1;
                }
                *(size_t *)p = v;
                return 0;
        }
        case CQ_CFG_LEVEL: {
                cq_log_level_t level;

                if (cq_log_level_parse(value, &level) != 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid value \"%s\" for %s: "
                                      "expected debug, info, warn or error",
                                      shown, source);
                        return -1;
                }
                *(cq_log_level_t *)p = level;
                return 0;
        }
        }
        return -1;
}

int cq_config_init(cq_config_t *cfg)
{
        size_t i;

        memset(cfg, 0, sizeof(*cfg));
        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                if (!entries[i].defval)
                        continue;
                if (set_entry(cfg, &entries[i], entries[i].defval,
                              entries[i].env, NULL, 0) != 0) {
                        cq_config_release(cfg);
                        return -1;
                }
        }
        return 0;
}

void cq_config_one_shot(cq_config_t *dst, const cq_config_t *src)
{
        static char off[] = "off", none[] = "";

        *dst = *src;
        if (!src->kernel_server || strcmp(src->kernel_server, "auto") == 0)
                dst->kernel_server = off;
        if (strcmp(dst->kernel_server, "off") == 0)
                dst->kernel_preload = none;
}

void cq_config_release(cq_config_t *cfg)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                switch (entries[i].type) {
                case CQ_CFG_STRING:
                case CQ_CFG_SECRET:
                case CQ_CFG_RANGE:
                case CQ_CFG_CHOICE: {
                        char **p = field(cfg, &entries[i]);

                        free(*p);
                        *p = NULL;
                        break;
                }
                default:
                        break;
                }
        }
        cq_kprops_destroy(&cfg->kafka_props);
}

int cq_config_load_kafka(cq_config_t *cfg,
                         char *const *envp,
                         char *errstr,
                         size_t errstr_size)
{
        cq_kprops_t *props = cq_kprops_new();

        if (!props) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read the Kafka properties: out of "
                              "memory");
                return -1;
        }
        if ((cfg->kafka_properties && *cfg->kafka_properties &&
             cq_kprops_load_file(props, cfg->kafka_properties, errstr,
                                 errstr_size)) ||
            cq_kprops_load_env(props, envp, errstr, errstr_size)) {
                cq_kprops_destroy(&props);
                return -1;
        }
        cq_kprops_destroy(&cfg->kafka_props);
        cfg->kafka_props = props;
        return 0;
}

int cq_config_load_env(cq_config_t *cfg, char *errstr, size_t errstr_size)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                const cq_cfg_entry_t *entry = &entries[i];
                const char *name = entry->env;
                const char *value = getenv(name);

                if ((!value || !*value) && entry->alt_env) {
                        name = entry->alt_env;
                        value = getenv(name);
                }
                if (!value || !*value)
                        continue;
                if (set_entry(cfg, entry, value, name, errstr, errstr_size))
                        return -1;
        }
        return 0;
}

int cq_config_queues(const char *list,
                     char names[][CQ_QUEUE_NAME_MAX + 1],
                     size_t max,
                     size_t *np,
                     char *errstr,
                     size_t errstr_size)
{
        const char *p = list ? list : "default";
        size_t n = 0;

        for (;;) {
                size_t len = strcspn(p, ","), i;

                for (i = 0; i < len; i++)
                        if (!((p[i] >= 'a' && p[i] <= 'z') ||
                              (p[i] >= '0' && p[i] <= '9') || p[i] == '-' ||
                              p[i] == '_' || p[i] == '.'))
                                break;
                if (len == 0 || len > CQ_QUEUE_NAME_MAX || i < len) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "invalid CODERQ_QUEUES \"%.200s\": each "
                            "queue is 1 to %d lower-case letters, "
                            "digits, '-', '_' or '.', comma-separated",
                            list ? list : "", CQ_QUEUE_NAME_MAX);
                        return -1;
                }
                if (n == max) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid CODERQ_QUEUES: more than %zu "
                                      "queues",
                                      max);
                        return -1;
                }
                memcpy(names[n], p, len);
                names[n][len] = '\0';
                for (i = 0; i < n; i++)
                        if (strcmp(names[i], names[n]) == 0)
                                break;
                if (i == n)
                        n++;
                p += len;
                if (*p == '\0')
                        break;
                p++;
        }
        if (np)
                *np = n;
        return 0;
}

int cq_config_check(const cq_config_t *cfg, char *errstr, size_t errstr_size)
{
        char names[CQ_QUEUES_MAX][CQ_QUEUE_NAME_MAX + 1];

        if (cq_config_queues(cfg->queues, names, CQ_QUEUES_MAX, NULL, errstr,
                             errstr_size))
                return -1;
        if (cfg->e2b_ttl_s > cfg->e2b_max_timeout_s) {
                cq_errstr_set(errstr, errstr_size,
                              "invalid CODERQ_E2B_TTL_S %ld: above "
                              "CODERQ_E2B_MAX_TIMEOUT_S (%ld), the longest "
                              "timeout E2B accepts",
                              cfg->e2b_ttl_s, cfg->e2b_max_timeout_s);
                return -1;
        }
        return 0;
}

static const cq_cfg_entry_t *find_entry(const char *name)
{
        size_t i;
        char flag[64];

        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                if (strcmp(name, entries[i].env) == 0 ||
                    (entries[i].alt_env &&
                     strcmp(name, entries[i].alt_env) == 0))
                        return &entries[i];
                flag_of(entries[i].env, flag, sizeof(flag));
                if (strcmp(name, flag) == 0)
                        return &entries[i];
        }
        return NULL;
}

int cq_config_set(cq_config_t *cfg,
                  const char *name,
                  const char *value,
                  const char *source,
                  char *errstr,
                  size_t errstr_size)
{
        const cq_cfg_entry_t *entry = find_entry(name);

        if (!entry)
                return 1;
        return set_entry(cfg, entry, value, source ? source : name, errstr,
                         errstr_size);
}

int cq_config_parse_args(
    cq_config_t *cfg, int *argcp, char **argv, char *errstr, size_t errstr_size)
{
        int argc = *argcp, in, out = 1;

        for (in = 1; in < argc; in++) {
                const char *arg = argv[in];
                const cq_cfg_entry_t *entry;
                char name[64], source[80];
                const char *eq, *value;
                size_t len;

                if (strcmp(arg, "--") == 0) {
                        /* Everything after "--" is an operand. */
                        while (in < argc)
                                argv[out++] = argv[in++];
                        break;
                }
                if (strncmp(arg, "--", 2) != 0) {
                        argv[out++] = argv[in];
                        continue;
                }
                eq = strchr(arg + 2, '=');
                len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
                if (len == 0 || len >= sizeof(name)) {
                        argv[out++] = argv[in];
                        continue;
                }
                memcpy(name, arg + 2, len);
                name[len] = '\0';
                entry = find_entry(name);
                if (!entry || strchr(name, '_')) {
                        argv[out++] = argv[in]; /* not ours: leave it */
                        continue;
                }
                snprintf(source, sizeof(source), "--%s", name);
                if (eq) {
                        value = eq + 1;
                } else if (in + 1 < argc) {
                        value = argv[++in];
                } else {
                        cq_errstr_set(errstr, errstr_size,
                                      "option %s needs a value", source);
                        return -1;
                }
                if (set_entry(cfg, entry, value, source, errstr, errstr_size))
                        return -1;
        }
        argv[out] = NULL;
        *argcp = out;
        return 0;
}

static const char *type_hint(const cq_cfg_entry_t *entry)
{
        switch (entry->type) {
        case CQ_CFG_INT:
                return "N";
        case CQ_CFG_BOOL:
                return "BOOL";
        case CQ_CFG_SIZE:
                return "BYTES";
        case CQ_CFG_LEVEL:
                return "LEVEL";
        case CQ_CFG_CHOICE:
                return "CHOICE";
        case CQ_CFG_RANGE:
                return "RANGE";
        default:
                return "STR";
        }
}

void cq_config_print_help(FILE *fp)
{
        size_t i;

        fprintf(fp, "Environment variables (each also a flag):\n");
        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                const cq_cfg_entry_t *entry = &entries[i];
                char flag[64];

                flag_of(entry->env, flag, sizeof(flag));
                fprintf(fp, "  %s", entry->env);
                if (entry->alt_env)
                        fprintf(fp, " (or %s)", entry->alt_env);
                fprintf(fp, ", --%s=%s\n", flag, type_hint(entry));
                fprintf(fp, "      %s", entry->help);
                if (entry->type == CQ_CFG_CHOICE)
                        fprintf(fp, " [%s]", entry->choices);
                fprintf(fp, "; default: %s\n",
                        entry->defval ? entry->defval : "unset");
        }
}

/* A help string as the text of a Markdown table cell: the characters
 * Markdown or the table would read as syntax escaped, and each mention of
 * a doc ("docs/EVALUATION.md#episodic-memory") a link relative to docs/,
 * where the generated file lives. */
static void md_text(FILE *fp, const char *s)
{
        static const char doc_chars[] = "abcdefghijklmnopqrstuvwxyz"
                                        "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_./#-";

        while (*s) {
                if (strncmp(s, "docs/", 5) == 0) {
                        size_t n = strspn(s, doc_chars);

                        while (n > 5 && s[n - 1] == '.')
                                n--;
                        fprintf(fp, "[%.*s](%.*s)", (int)n, s, (int)(n - 5),
                                s + 5);
                        s += n;
                        continue;
                }
                switch (*s) {
                case '|':
                case '*':
                case '[':
                case ']':
                case '`':
                case '\\':
                        fprintf(fp, "\\%c", *s);
                        break;
                case '<':
                        fputs("&lt;", fp);
                        break;
                case '>':
                        fputs("&gt;", fp);
                        break;
                default:
                        fputc(*s, fp);
                }
                s++;
        }
}

/* 1048576 -> "1M": the largest suffix that divides the size. */
static void md_size(FILE *fp, long v)
{
        static const char suffix[] = "GMK";
        int i;

        for (i = 0; i < 3; i++) {
                long unit = 1L << (10 * (3 - i));

                if (v >= unit && v % unit == 0) {
                        fprintf(fp, "%ld%c", v / unit, suffix[i]);
                        return;
                }
        }
        fprintf(fp, "%ld", v);
}

/* The values a setting takes, from its type and bounds. */
static void md_values(FILE *fp, const cq_cfg_entry_t *entry)
{
        const char *p;

        switch (entry->type) {
        case CQ_CFG_STRING:
                fputs("text", fp);
                break;
        case CQ_CFG_SECRET:
                fputs("text, secret: shown only as (set)", fp);
                break;
        case CQ_CFG_INT:
                fprintf(fp, "integer, %ld to %ld", entry->min, entry->max);
                break;
        case CQ_CFG_BOOL:
                fputs("`true` or `false` (1/0, yes/no, on/off)", fp);
                break;
        case CQ_CFG_SIZE:
                fputs(entry->max > 0 ? "size, " : "size, at least ", fp);
                md_size(fp, entry->min);
                if (entry->max > 0) {
                        fputs(" to ", fp);
                        md_size(fp, entry->max);
                }
                break;
        case CQ_CFG_LEVEL:
                fputs("`debug`, `info`, `warn` or `error`", fp);
                break;
        case CQ_CFG_CHOICE:
                for (p = entry->choices; p;) {
                        const char *bar = strchr(p, '|');
                        int n = bar ? (int)(bar - p) : (int)strlen(p);

                        fprintf(fp, "%s`%.*s`", p == entry->choices ? "" : ", ",
                                n, p);
                        p = bar ? bar + 1 : NULL;
                }
                break;
        case CQ_CFG_RANGE:
                fprintf(fp,
                        "`auto`, `off` or FIRST-LAST, %ld <= FIRST <= LAST "
                        "<= %ld",
                        entry->min, entry->max);
                break;
        }
}

/* The prose around the table. Each paragraph is one line of the output:
 * Markdown joins wrapped lines anyway, and a line per paragraph keeps the
 * strings here free to break anywhere. */
static const char md_head[] =
    "# Configuration\n"
    "\n"
    "<!-- Generated from the settings table in common/config.c by `coderq "
    "config --markdown` (scripts/gen-docs.sh): edit the table, not this "
    "file. check_cli fails when the two differ. -->\n"
    "\n"
    "Every setting is an environment variable and a command-line flag named "
    "after it (`CODERQ_LOG_LEVEL` <-> `--log-level`, given as "
    "`--log-level=debug` or `--log-level debug` anywhere on the command "
    "line); a flag wins over the variable, the variable over the default. "
    "`coderq --help` lists them with their defaults and `coderq config` "
    "prints their effective values ([CLI.md](CLI.md#coderq-config)). An "
    "invalid value stops coderq with exit code 3 and a message naming the "
    "variable or flag. Sizes take the suffixes K, M and G (powers of 1024). "
    "A job's own fields win over some of these for that job "
    "([JOBS.md](JOBS.md#job-fields-and-settings)).\n"
    "\n"
    "| variable | flag | values | default | meaning |\n"
    "| --- | --- | --- | --- | --- |\n";

static const char md_tail[] =
    "\n"
    "## Kafka client properties\n"
    "\n"
    "`CODERQ_KAFKA_PROP_<NAME>` (no flag; unset by default) sets one "
    "librdkafka property and wins over the file of "
    "`CODERQ_KAFKA_PROPERTIES`: NAME is the property upper-cased with `_` "
    "for `.` (`CODERQ_KAFKA_PROP_SASL_MECHANISM` sets `sasl.mechanism`). "
    "How the properties combine, and which ones coderq sets itself, is in "
    "[DEPLOYING.md](DEPLOYING.md#kafka-client-properties).\n"
    "\n"
    "## Variables of the scripts\n"
    "\n"
    "`scripts/` reads a few more variables, for the local services only: "
    "see [DEPLOYING.md](DEPLOYING.md#local-services).\n";

void cq_config_print_markdown(FILE *fp)
{
        size_t i;

        fputs(md_head, fp);
        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                const cq_cfg_entry_t *entry = &entries[i];
                char flag[64];

                flag_of(entry->env, flag, sizeof(flag));
                fprintf(fp, "| `%s`", entry->env);
                if (entry->alt_env)
                        fprintf(fp, " (or `%s`)", entry->alt_env);
                fprintf(fp, " | `--%s` | ", flag);
                md_values(fp, entry);
                if (entry->defval)
                        fprintf(fp, " | `%s` | ", entry->defval);
                else
                        fputs(" | unset | ", fp);
                md_text(fp, entry->help);
                fputs(" |\n", fp);
        }
        fputs(md_tail, fp);
}

void cq_config_describe(const cq_config_t *cfg,
                        const cq_cfg_entry_t *entry,
                        char *out,
                        size_t out_size)
{
        const void *p = cfield(cfg, entry);

        switch (entry->type) {
        case CQ_CFG_SECRET:
                snprintf(out, out_size, "%s",
                         *(char *const *)p ? "(set)" : "(unset)");
                break;
        case CQ_CFG_STRING:
        case CQ_CFG_RANGE:
        case CQ_CFG_CHOICE:
                snprintf(out, out_size, "%s",
                         *(char *const *)p ? *(char *const *)p : "(unset)");
                break;
        case CQ_CFG_INT:
                snprintf(out, out_size, "%ld", *(const long *)p);
                break;
        case CQ_CFG_BOOL:
                snprintf(out, out_size, "%s",
                         *(const bool *)p ? "true" : "false");
                break;
        case CQ_CFG_SIZE:
                snprintf(out, out_size, "%zu", *(const size_t *)p);
                break;
        case CQ_CFG_LEVEL:
                snprintf(out, out_size, "%s",
                         cq_log_level_name(*(const cq_log_level_t *)p));
                break;
        }
}
