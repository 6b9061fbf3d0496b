/* SPDX-License-Identifier: MIT */
/* config.c - the settings table and its parsers. Values come from the
 * defaults, then the environment, then flags; the last one wins. Nothing
 * here is global: the table is constant and values live in cq_config_t. */
#include "coderq/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
    {"CODERQ_PG_DSN", NULL, "pg-dsn", CQ_CFG_SECRET, F(pg_dsn), NULL, 0, 0,
     NULL,
     "libpq connection string or URI of the PostgreSQL database (libpq's "
     "PG* variables fill what it leaves out)"},
    {"CODERQ_KAFKA_BROKERS", NULL, "kafka-brokers", CQ_CFG_STRING,
     F(kafka_brokers), "127.0.0.1:9092", 0, 0, NULL,
     "Kafka bootstrap servers, comma-separated host:port"},
    {"CODERQ_BACKEND", NULL, "backend", CQ_CFG_CHOICE, F(backend), "local", 0,
     0, "local|e2b",
     "interpreter for jobs that do not name one: local (Jupyter kernel) or "
     "e2b (E2B sandbox)"},
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
    {"CODERQ_E2B_CREATE_PATH", NULL, "e2b-create-path", CQ_CFG_CHOICE,
     F(e2b_create_path), "/sandboxes", 0, 0, "/sandboxes|/v2/sandboxes",
     "E2B API path that creates sandboxes"},
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
        case CQ_CFG_CHOICE: {
                char *copy;

                if (entry->type == CQ_CFG_CHOICE &&
                    !in_choices(entry->choices, value)) {
                        if (errstr)
                                snprintf(errstr, errstr_size,
                                         "invalid value \"%s\" for %s: "
                                         "expected one of %s",
                                         value, source, entry->choices);
                        return -1;
                }
                copy = strdup(value);
                if (!copy) {
                        if (errstr)
                                snprintf(errstr, errstr_size,
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
                        if (errstr)
                                snprintf(errstr, errstr_size,
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
                        if (errstr)
                                snprintf(errstr, errstr_size,
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
                        if (errstr)
                                snprintf(errstr, errstr_size,
                                         "invalid value \"%s\" for %s: "
                                         "expected a size in bytes from %ld "
                                         "to %ld (suffixes k, M, G)",
                                         shown, source, entry->min, entry->max);
                        return -1;
                }
                *(size_t *)p = v;
                return 0;
        }
        case CQ_CFG_LEVEL: {
                cq_log_level_t level;

                if (cq_log_level_parse(value, &level) != 0) {
                        if (errstr)
                                snprintf(errstr, errstr_size,
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

void cq_config_release(cq_config_t *cfg)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(entries); i++) {
                switch (entries[i].type) {
                case CQ_CFG_STRING:
                case CQ_CFG_SECRET:
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
                        if (errstr)
                                snprintf(errstr, errstr_size,
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
