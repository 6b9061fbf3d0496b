/* SPDX-License-Identifier: MIT */
/* llm.c - the LLM transport's policy over the HTTP client (http.c, which
 * owns the capped reply, the cancel flag and deadline, Retry-After and
 * the API keys' redaction): which failures to retry, bounded in attempts
 * and in total wait, with full-jitter backoff or the server's
 * Retry-After, and the hook into the worker's shared rate limiter. The
 * wire formats live in llm_openai.c and llm_anthropic.c. */
#include "coderq/agent/llm.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/http/http.h"
#include "llm_int.h"

#define DEFAULT_CONNECT_TIMEOUT 10
#define DEFAULT_TIMEOUT         300
#define DEFAULT_MAX_ATTEMPTS    5
#define DEFAULT_MAX_WAIT        120
#define DEFAULT_RESPONSE_MAX    ((size_t)8 * 1024 * 1024)
#define DEFAULT_BACKOFF_BASE_MS 500
#define DEFAULT_BACKOFF_MAX_MS  30000
#define PROVIDER_MSG_MAX        LLM_PROVIDER_MSG_MAX
#define ANTHROPIC_VERSION       "2023-06-01"

const char cq_llm_tool_description[] =
    "Run Python code in a stateful Jupyter kernel (IPython). Variables, "
    "imports and files persist across calls; the working directory holds "
    "the task's data files, so use relative paths and save every file you "
    "produce (plots, tables, models) there. Returns the cell's output as "
    "text: stdout, stderr, the value of the last expression and, on "
    "failure, the error with its traceback; long outputs are shortened to "
    "their head and tail. Rich output cannot be shown: each image the code "
    "displays or saves is returned as the text \"[image NAME: MIME, N bytes, "
    "not shown]\", so print the numbers a plot shows if you need them.";

/* Which outcome one HTTP attempt had. */
enum attempt_kind {
        ATTEMPT_OK,
        ATTEMPT_TRANSIENT, /* 429, 408, 5xx, network: retry */
        ATTEMPT_INVALID,   /* 2xx with a body we cannot use: retry */
        ATTEMPT_FATAL,     /* other 4xx, bad URL, TLS trust: give up */
        ATTEMPT_TOO_LARGE, /* reply over the cap: give up */
        ATTEMPT_CANCELLED,
};

/* What one provider's requests need. */
struct endpoint {
        struct curl_slist *headers;
        char *url;
        char *url_shown;    /* url without user:password@ and ?query */
        char *models_url;   /* the list of models (cq_llm_list_models()) */
        char *models_shown; /* as url_shown */
};

struct cq_llm {
        cq_http_t *http;
        struct endpoint ep[2]; /* by cq_llm_provider_t, but none */
        cq_llm_provider_t conf_provider;
        cq_llm_provider_t provider; /* now */
        const char *url_shown;      /* ep[provider].url_shown; none: "" */
        char *api_key;              /* only for redaction; wiped on destroy */
        char *api_key2;             /* the anthropic key when it differs */
        const char *secrets[2];     /* both, for the HTTP client */
        char *conf_model;
        char *model_override;      /* NULL: conf_model */
        bool sampling_set;         /* a job's sampling parameters below */
        double temperature, top_p; /* < 0: not sent */
        bool has_seed;
        long long seed;
        cq_llm_conf_t conf; /* string fields point at the copies above */
        const atomic_int *cancel;
        int64_t deadline_ms; /* cq_now_ms() clock; 0: none */
        int64_t prompt_tokens;
        int64_t completion_tokens;
        int64_t cache_read_tokens;
        int64_t cache_creation_tokens;
        cq_http_res_t res; /* the last attempt's */
        char errmsg[1024];
};

void cq_llm_conf_init(cq_llm_conf_t *conf)
{
        memset(conf, 0, sizeof(*conf));
        conf->temperature = -1.0;
        conf->connect_timeout_s = DEFAULT_CONNECT_TIMEOUT;
        conf->timeout_s = DEFAULT_TIMEOUT;
        conf->max_attempts = DEFAULT_MAX_ATTEMPTS;
        conf->max_wait_s = DEFAULT_MAX_WAIT;
        conf->response_max = DEFAULT_RESPONSE_MAX;
        conf->backoff_base_ms = DEFAULT_BACKOFF_BASE_MS;
        conf->backoff_max_ms = DEFAULT_BACKOFF_MAX_MS;
}

void cq_llm_conf_from_config(cq_llm_conf_t *conf, const cq_config_t *cfg)
{
        cq_llm_conf_init(conf);
        if (cfg->llm_base_url && *cfg->llm_base_url)
                conf->base_url = cfg->llm_base_url;
        if (cfg->llm_provider && *cfg->llm_provider &&
            cq_llm_provider_parse(cfg->llm_provider, &conf->provider) != 0)
                conf->provider = CQ_LLM_OPENAI; /* config.c validated it */
        conf->api_key = cfg->llm_api_key;
        conf->anthropic_api_key = cfg->llm_anthropic_api_key;
        conf->model = cfg->llm_model;
        conf->max_tokens = cfg->llm_max_tokens;
        conf->connect_timeout_s = cfg->llm_connect_timeout_s;
        conf->timeout_s = cfg->llm_timeout_s;
        conf->max_attempts = cfg->llm_max_attempts;
        conf->max_wait_s = cfg->llm_max_wait_s;
        conf->response_max = cfg->llm_response_max;
}

void cq_llm_reply_init(cq_llm_reply_t *reply)
{
        memset(reply, 0, sizeof(*reply));
}

void cq_llm_reply_release(cq_llm_reply_t *reply)
{
        size_t i;

        for (i = 0; i < reply->ncalls; i++) {
                free(reply->calls[i].id);
                free(reply->calls[i].name);
                free(reply->calls[i].arguments);
                free(reply->calls[i].code);
                free(reply->calls[i].error);
        }
        free(reply->calls);
        free(reply->finish_reason);
        json_decref(reply->message);
        cq_llm_reply_init(reply);
}

/* --- errors -------------------------------------------------------- */

/* Replace each byte that does not start a valid UTF-8 sequence with '?',
 * in place: provider messages are cut at a byte count and error pages may
 * be in any encoding, but errmsg ends up in JSON (events, the jobs table),
 * which must be valid UTF-8. */
static void sanitize_utf8(char *s)
{
        unsigned char *p = (unsigned char *)s;

        while (*p) {
                size_t n = *p < 0x80             ? 1
                           : (*p & 0xe0) == 0xc0 ? 2
                           : (*p & 0xf0) == 0xe0 ? 3
                           : (*p & 0xf8) == 0xf0 ? 4
                                                 : 0;
                size_t i;

                for (i = 1; n > 1 && i < n; i++)
                        if (!p[i])
                                n = 0; /* cut short by the NUL */
                if (n == 0 || !cq_utf8_valid((const char *)p, n)) {
                        *p++ = '?';
                        continue;
                }
                p += n;
        }
}

static void llm_set_error(cq_llm_t *llm, const char *fmt, ...) CQ_PRINTF(2, 3);

static void llm_set_error(cq_llm_t *llm, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(llm->errmsg, sizeof(llm->errmsg), fmt, ap);
        va_end(ap);
        cq_http_redact(llm->http, llm->errmsg, sizeof(llm->errmsg));
        sanitize_utf8(llm->errmsg);
}

const char *cq_llm_errmsg(const cq_llm_t *llm) { return llm->errmsg; }

/* --- lifecycle ------------------------------------------------------ */

static bool has_control_chars(const char *s)
{
        for (; *s; s++)
                if ((unsigned char)*s < 0x20 || *s == 0x7f)
                        return true;
        return false;
}

static const llm_provider_t *provider_of(cq_llm_provider_t id)
{
        return id == CQ_LLM_ANTHROPIC ? &cq_llm_provider_anthropic
                                      : &cq_llm_provider_openai;
}

int cq_llm_provider_parse(const char *name, cq_llm_provider_t *providerp)
{
        if (name && strcmp(name, "openai") == 0) {
                *providerp = CQ_LLM_OPENAI;
                return 0;
        }
        if (name && strcmp(name, "anthropic") == 0) {
                *providerp = CQ_LLM_ANTHROPIC;
                return 0;
        }
        if (name && strcmp(name, "none") == 0) {
                *providerp = CQ_LLM_NONE;
                return 0;
        }
        return -1;
}

const char *cq_llm_provider_name(cq_llm_provider_t provider)
{
        return provider == CQ_LLM_NONE ? "none" : provider_of(provider)->name;
}

static struct curl_slist *add_header(struct curl_slist **listp, const char *h)
{
        struct curl_slist *l = curl_slist_append(*listp, h);

        if (l)
                *listp = l;
        return l;
}

/* \p base_len bytes of \p base, then \p path; NULL when out of memory. */
static char *join_url(const char *base, size_t base_len, const char *path)
{
        size_t path_len = strlen(path);
        char *url = malloc(base_len + path_len + 1);

        if (url) {
                memcpy(url, base, base_len);
                memcpy(url + base_len, path, path_len + 1);
        }
        return url;
}

/* The URLs and headers of one provider. Returns 0, -1 when out of
 * memory. */
static int endpoint_init(struct endpoint *ep,
                         const llm_provider_t *prov,
                         const char *base_conf,
                         const char *key)
{
        const char *base =
            base_conf && *base_conf ? base_conf : prov->default_base;
        size_t base_len = strlen(base), klen;
        char *auth = NULL;
        int rc = -1;

        while (base_len && base[base_len - 1] == '/')
                base_len--;
        ep->url = join_url(base, base_len, prov->path(base, base_len));
        ep->models_url =
            join_url(base, base_len, prov->models_path(base, base_len));
        if (!ep->url || !ep->models_url)
                goto out;
        ep->url_shown = cq_http_url_shown(ep->url);
        ep->models_shown = cq_http_url_shown(ep->models_url);
        if (!ep->url_shown || !ep->models_shown)
                goto out;
        if (!add_header(&ep->headers, "Content-Type: application/json") ||
            !add_header(&ep->headers, "Accept: application/json") ||
            !add_header(&ep->headers, "Expect:")) /* no 100-continue */
                goto out;
        if (prov->id == CQ_LLM_ANTHROPIC &&
            !add_header(&ep->headers, "anthropic-version: " ANTHROPIC_VERSION))
                goto out;
        if (key && *key) {
                const char *name = prov->id == CQ_LLM_ANTHROPIC
                                       ? "x-api-key: "
                                       : "Authorization: Bearer ";
                size_t nlen = strlen(name);

                klen = strlen(key);
                auth = malloc(nlen + klen + 1);
                if (!auth)
                        goto out;
                memcpy(auth, name, nlen);
                memcpy(auth + nlen, key, klen + 1);
                if (!add_header(&ep->headers, auth))
                        goto out;
        }
        rc = 0;
out:
        if (auth) {
                explicit_bzero(auth, strlen(auth));
                free(auth);
        }
        return rc;
}

static void endpoint_release(struct endpoint *ep)
{
        struct curl_slist *h;

        for (h = ep->headers; h; h = h->next)
                explicit_bzero(h->data, strlen(h->data));
        curl_slist_free_all(ep->headers);
        free(ep->url);
        free(ep->url_shown);
        free(ep->models_url);
        free(ep->models_shown);
        memset(ep, 0, sizeof(*ep));
}

static const char *anthropic_key(const cq_llm_conf_t *conf)
{
        return conf->anthropic_api_key && *conf->anthropic_api_key
                   ? conf->anthropic_api_key
                   : conf->api_key;
}

cq_llm_t *
cq_llm_new(const cq_llm_conf_t *conf, char *errstr, size_t errstr_size)
{
        cq_llm_t *llm = NULL;
        const char *base = conf->base_url;
        const char *akey = anthropic_key(conf);
        cq_http_conf_t hconf = {0};
        char ua[64];
        bool ok = false;

        if (!conf->model || !*conf->model) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create LLM client: no model "
                              "configured (CODERQ_LLM_MODEL)");
                return NULL;
        }
        if ((conf->api_key && has_control_chars(conf->api_key)) ||
            (akey && has_control_chars(akey))) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create LLM client: the API key "
                              "contains control characters (a stray "
                              "newline?)");
                return NULL;
        }
        if (base && *base && strncmp(base, "http://", 7) != 0 &&
            strncmp(base, "https://", 8) != 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create LLM client: base URL "
                              "\"%s\" is not http:// or https://",
                              base);
                return NULL;
        }
        if (conf->provider != CQ_LLM_OPENAI &&
            conf->provider != CQ_LLM_ANTHROPIC &&
            conf->provider != CQ_LLM_NONE) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create LLM client: unknown "
                              "provider %d",
                              (int)conf->provider);
                return NULL;
        }
        llm = calloc(1, sizeof(*llm));
        if (!llm)
                goto out;
        llm->conf = *conf;
        llm->conf_provider = llm->provider = conf->provider;
        cq_http_res_init(&llm->res);
        llm->conf_model = strdup(conf->model);
        if (!llm->conf_model)
                goto out;
        if (endpoint_init(&llm->ep[CQ_LLM_OPENAI], &cq_llm_provider_openai,
                          base, conf->api_key) != 0 ||
            endpoint_init(&llm->ep[CQ_LLM_ANTHROPIC],
                          &cq_llm_provider_anthropic, base, akey) != 0)
                goto out;
        llm->url_shown = llm->provider == CQ_LLM_NONE
                             ? ""
                             : llm->ep[llm->provider].url_shown;
        if (conf->api_key && *conf->api_key) {
                llm->api_key = strdup(conf->api_key);
                if (!llm->api_key)
                        goto out;
        }
        if (akey && *akey && akey != conf->api_key) {
                llm->api_key2 = strdup(akey);
                if (!llm->api_key2)
                        goto out;
        }
        llm->conf.base_url = NULL; /* only the urls are kept */
        llm->conf.api_key = NULL;
        llm->conf.anthropic_api_key = NULL;
        llm->conf.model = NULL;
        if (llm->conf.connect_timeout_s <= 0)
                llm->conf.connect_timeout_s = DEFAULT_CONNECT_TIMEOUT;
        if (llm->conf.timeout_s <= 0)
                llm->conf.timeout_s = DEFAULT_TIMEOUT;
        if (llm->conf.max_attempts <= 0)
                llm->conf.max_attempts = DEFAULT_MAX_ATTEMPTS;
        if (llm->conf.max_wait_s < 0)
                llm->conf.max_wait_s = DEFAULT_MAX_WAIT;
        if (llm->conf.backoff_base_ms <= 0)
                llm->conf.backoff_base_ms = DEFAULT_BACKOFF_BASE_MS;
        if (llm->conf.backoff_max_ms <= 0)
                llm->conf.backoff_max_ms = DEFAULT_BACKOFF_MAX_MS;
        if (!llm->conf.response_max)
                llm->conf.response_max = DEFAULT_RESPONSE_MAX;

        snprintf(ua, sizeof(ua), "coderq/%s", CQ_VERSION);
        llm->secrets[0] = llm->api_key;
        llm->secrets[1] = llm->api_key2;
        hconf.user_agent = ua;
        hconf.connect_timeout_ms = llm->conf.connect_timeout_s * 1000;
        hconf.compressed = true;
        hconf.tcp_keepalive = true;
        hconf.secrets = llm->secrets;
        hconf.nsecrets = CQ_ARRAY_SIZE(llm->secrets);
        llm->http = cq_http_new(&hconf, NULL, 0);
        if (!llm->http)
                goto out;
        ok = true;
out:
        if (!ok) {
                cq_errstr_set(errstr, errstr_size,
                              "could not create LLM client: out of memory "
                              "or libcurl setup failed");
                cq_llm_destroy(&llm);
        }
        return llm;
}

void cq_llm_destroy(cq_llm_t **llmp)
{
        cq_llm_t *llm = *llmp;

        if (!llm)
                return;
        cq_http_destroy(&llm->http);
        endpoint_release(&llm->ep[0]);
        endpoint_release(&llm->ep[1]);
        if (llm->api_key) {
                explicit_bzero(llm->api_key, strlen(llm->api_key));
                free(llm->api_key);
        }
        if (llm->api_key2) {
                explicit_bzero(llm->api_key2, strlen(llm->api_key2));
                free(llm->api_key2);
        }
        free(llm->conf_model);
        free(llm->model_override);
        cq_http_res_release(&llm->res);
        free(llm);
        *llmp = NULL;
}

int cq_llm_set_provider(cq_llm_t *llm, const char *name)
{
        cq_llm_provider_t provider = llm->conf_provider;

        if (name && (cq_llm_provider_parse(name, &provider) != 0 ||
                     provider == CQ_LLM_NONE))
                return -1;
        if (llm->conf_provider == CQ_LLM_NONE)
                return 0; /* no LLM to switch to */
        llm->provider = provider;
        llm->url_shown = llm->ep[provider].url_shown;
        return 0;
}

cq_llm_provider_t cq_llm_provider(const cq_llm_t *llm) { return llm->provider; }

int cq_llm_set_model(cq_llm_t *llm, const char *model)
{
        char *copy = NULL;

        if (model && *model) {
                copy = strdup(model);
                if (!copy)
                        return -1;
        }
        free(llm->model_override);
        llm->model_override = copy;
        return 0;
}

const char *cq_llm_model(const cq_llm_t *llm)
{
        return llm->model_override ? llm->model_override : llm->conf_model;
}

int cq_llm_set_sampling(cq_llm_t *llm,
                        double temperature,
                        double top_p,
                        const long long *seed)
{
        if (seed && llm->provider == CQ_LLM_ANTHROPIC)
                return -1;
        llm->sampling_set = true;
        llm->temperature = temperature < 0 ? -1 : temperature;
        llm->top_p = top_p < 0 ? -1 : top_p;
        llm->has_seed = seed != NULL;
        llm->seed = seed ? *seed : 0;
        return 0;
}

void cq_llm_reset_sampling(cq_llm_t *llm)
{
        llm->sampling_set = false;
        llm->has_seed = false;
}

long cq_llm_max_tokens(const cq_llm_t *llm)
{
        if (llm->conf.max_tokens > 0)
                return llm->conf.max_tokens;
        /* the Messages API requires one: llm_anthropic.c sends its own */
        return llm->provider == CQ_LLM_ANTHROPIC ? 8192 : 0;
}

json_t *cq_llm_sampling_json(const cq_llm_t *llm)
{
        double t = llm->sampling_set ? llm->temperature : llm->conf.temperature;
        double p = llm->sampling_set ? llm->top_p : -1;
        long max = cq_llm_max_tokens(llm);

        return json_pack("{s:o, s:o, s:o, s:o}", "temperature",
                         t >= 0 ? json_real(t) : json_null(), "top_p",
                         p >= 0 ? json_real(p) : json_null(), "seed",
                         llm->sampling_set && llm->has_seed
                             ? json_integer((json_int_t)llm->seed)
                             : json_null(),
                         "max_tokens",
                         max > 0 ? json_integer(max) : json_null());
}

void cq_llm_set_cancel(cq_llm_t *llm, const atomic_int *cancel)
{
        llm->cancel = cancel;
}

void cq_llm_set_deadline(cq_llm_t *llm, int64_t deadline_ms)
{
        llm->deadline_ms = deadline_ms;
}

void cq_llm_usage(const cq_llm_t *llm,
                  int64_t *prompt_tokensp,
                  int64_t *completion_tokensp)
{
        if (prompt_tokensp)
                *prompt_tokensp = llm->prompt_tokens;
        if (completion_tokensp)
                *completion_tokensp = llm->completion_tokens;
}

void cq_llm_usage_cache(const cq_llm_t *llm,
                        int64_t *cache_readp,
                        int64_t *cache_creationp)
{
        if (cache_readp)
                *cache_readp = llm->cache_read_tokens;
        if (cache_creationp)
                *cache_creationp = llm->cache_creation_tokens;
}

void cq_llm_usage_reset(cq_llm_t *llm)
{
        llm->prompt_tokens = 0;
        llm->completion_tokens = 0;
        llm->cache_read_tokens = 0;
        llm->cache_creation_tokens = 0;
}

/* --- tools and estimates -------------------------------------------- */

json_t *cq_llm_tools_json(void)
{
        return json_pack(
            "[{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s, s:s}}, s:[s], s:b}}}]",
            "type", "function", "function", "name", CQ_LLM_TOOL_NAME,
            "description", cq_llm_tool_description, "parameters", "type",
            "object", "properties", "code", "type", "string", "description",
            "the Python code to run as one notebook cell", "required", "code",
            "additionalProperties", 0);
}

void cq_llm_image_placeholder(char *out,
                              size_t out_size,
                              const char *name,
                              const char *mime,
                              size_t bytes)
{
        snprintf(out, out_size, CQ_LLM_IMAGE_PLACEHOLDER_FMT, name, mime,
                 bytes);
}

static int64_t text_tokens(const char *s)
{
        const unsigned char *p = (const unsigned char *)s;
        int64_t ascii = 0, other = 0;

        if (!s)
                return 0;
        for (; *p; p++) {
                if (*p < 0x80)
                        ascii++;
                else if ((*p & 0xc0) != 0x80)
                        other++; /* a lead byte: one code point */
        }
        return (ascii + 2) / 3 + other;
}

static int64_t content_tokens(const json_t *content)
{
        int64_t n = 0;
        size_t i;
        const json_t *part;

        if (json_is_string(content))
                return text_tokens(json_string_value(content));
        if (!json_is_array(content))
                return 0;
        json_array_foreach(content, i, part)
        {
                n += text_tokens(
                    json_string_value(json_object_get(part, "text")));
        }
        return n;
}

int64_t cq_llm_estimate_tokens(const json_t *messages)
{
        int64_t n = 3;
        size_t i, j;
        const json_t *msg, *call;

        if (!json_is_array(messages))
                return 0;
        json_array_foreach(messages, i, msg)
        {
                const json_t *calls = json_object_get(msg, "tool_calls");

                n += 4;
                n += content_tokens(json_object_get(msg, "content"));
                n += text_tokens(json_string_value(
                    json_object_get(msg, "reasoning_content")));
                n += text_tokens(
                    json_string_value(json_object_get(msg, "reasoning")));
                n += text_tokens(
                    json_string_value(json_object_get(msg, "name")));
                n += text_tokens(
                    json_string_value(json_object_get(msg, "tool_call_id")));
                if (!json_is_array(calls))
                        continue;
                json_array_foreach(calls, j, call)
                {
                        const json_t *fn = json_object_get(call, "function");
                        const json_t *args = json_object_get(fn, "arguments");

                        n += 8;
                        n += text_tokens(
                            json_string_value(json_object_get(fn, "name")));
                        if (json_is_string(args)) {
                                n += text_tokens(json_string_value(args));
                        } else if (args) {
                                char *text = json_dumps(args, JSON_COMPACT);

                                n += text_tokens(text);
                                free(text);
                        }
                }
        }
        return n;
}

/* --- reply parsing -------------------------------------------------- */

char *llm_dup_printf(const char *fmt, ...)
{
        va_list ap;
        char *s;
        int n;

        va_start(ap, fmt);
        n = vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (n < 0)
                return NULL;
        s = malloc((size_t)n + 1);
        if (!s)
                return NULL;
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
        return s;
}

int llm_unnul(json_t *obj, const char *key)
{
        const json_t *v = json_object_get(obj, key);
        const char *s;
        size_t n, i, nul = 0;
        char *out, *o;
        int rc;

        if (!json_is_string(v))
                return 0;
        s = json_string_value(v);
        n = json_string_length(v);
        for (i = 0; i < n; i++)
                nul += s[i] == '\0';
        if (!nul)
                return 0;
        out = malloc(n + 2 * nul + 1);
        if (!out)
                return -1;
        for (i = 0, o = out; i < n; i++) {
                if (s[i] == '\0') {
                        memcpy(o, "\xef\xbf\xbd", 3);
                        o += 3;
                } else {
                        *o++ = s[i];
                }
        }
        *o = '\0';
        rc =
            json_object_set_new(obj, key, json_stringn(out, (size_t)(o - out)));
        free(out);
        return rc ? -1 : 0;
}

int llm_parse_code(cq_llm_tool_call_t *call)
{
        json_t *args = NULL;
        const json_t *code;
        json_error_t jerr;
        int rc = -1;

        if (strcmp(call->name, CQ_LLM_TOOL_NAME) != 0) {
                call->error =
                    llm_dup_printf("unknown tool \"%.100s\"; the only "
                                   "tool is " CQ_LLM_TOOL_NAME,
                                   call->name);
                goto done;
        }
        if (!call->arguments) {
                call->error = strdup("the tool call has no arguments");
                goto done;
        }
        args = json_loads(call->arguments, JSON_ALLOW_NUL, &jerr);
        if (!args) {
                call->error = llm_dup_printf("arguments are not valid JSON: %s "
                                             "(at character %d)",
                                             jerr.text, jerr.position);
                goto done;
        }
        if (!json_is_object(args)) {
                call->error = strdup("arguments are not a JSON object");
                goto done;
        }
        code = json_object_get(args, "code");
        if (!json_is_string(code)) {
                call->error =
                    strdup(code ? "argument \"code\" is not a string"
                                : "arguments have no \"code\" string");
                goto done;
        }
        if (strlen(json_string_value(code)) != json_string_length(code)) {
                call->error = strdup("the code contains the character U+0000 "
                                     "(NUL), which Python source cannot "
                                     "hold; write it as '\\0' in a string");
                goto done;
        }
        call->code = strdup(json_string_value(code));
        rc = call->code ? 0 : -1;
        goto out;
done:
        rc = call->error ? 0 : -1;
out:
        json_decref(args);
        return rc;
}

int64_t llm_usage_value(const json_t *usage, const char *key)
{
        const json_t *v = json_object_get(usage, key);

        if (json_is_integer(v) && json_integer_value(v) >= 0)
                return (int64_t)json_integer_value(v);
        if (json_is_real(v) && json_real_value(v) >= 0 &&
            json_real_value(v) < 9e15)
                return (int64_t)json_real_value(v);
        return 0;
}

const char *llm_provider_message(const json_t *root)
{
        const json_t *error = json_object_get(root, "error");
        const json_t *v;

        if (json_is_object(error)) {
                v = json_object_get(error, "message");
                if (json_is_string(v))
                        return json_string_value(v);
        }
        if (json_is_string(error))
                return json_string_value(error);
        v = json_object_get(root, "message");
        if (json_is_string(v))
                return json_string_value(v);
        v = json_object_get(root, "detail");
        if (json_is_string(v))
                return json_string_value(v);
        return NULL;
}

/* --- the request ---------------------------------------------------- */

static bool past_deadline(const cq_llm_t *llm)
{
        return llm->deadline_ms > 0 && cq_now_ms() >= llm->deadline_ms;
}

/* The cancel flag, or the deadline: either ends requests and waits. */
static bool cancelled(const cq_llm_t *llm)
{
        return (llm->cancel && atomic_load(llm->cancel) != 0) ||
               past_deadline(llm);
}

/* Why cancelled() stopped a call. */
static const char *cancel_why(const cq_llm_t *llm)
{
        return llm->cancel && atomic_load(llm->cancel) != 0
                   ? "request cancelled"
                   : "the caller's deadline passed";
}

static bool curl_code_transient(CURLcode code)
{
        switch (code) {
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
        case CURLE_COULDNT_CONNECT:
        case CURLE_OPERATION_TIMEDOUT:
        case CURLE_SEND_ERROR:
        case CURLE_RECV_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_PARTIAL_FILE:
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
        case CURLE_HTTP3:
        case CURLE_BAD_CONTENT_ENCODING:
                return true;
        default:
                return false;
        }
}

/* Describe a failed response in \p out: the provider's message, else the
 * start of the body with control bytes replaced. */
static void describe_body(const cq_buf_t *body, char *out, size_t out_size)
{
        json_t *root = NULL;
        const char *pm = NULL;
        size_t i, n;

        out[0] = '\0';
        if (!body->data || !body->len)
                return;
        root = json_loadb(body->data, body->len, 0, NULL);
        if (root)
                pm = llm_provider_message(root);
        if (pm) {
                const json_t *err = json_object_get(root, "error");
                const char *type =
                    json_string_value(json_object_get(err, "type"));

                /* Anthropic names the kind ("overloaded_error"); OpenAI's
                 * types say little beyond the status */
                if (type && *type &&
                    json_is_string(json_object_get(root, "type")) &&
                    strcmp(json_string_value(json_object_get(root, "type")),
                           "error") == 0)
                        snprintf(out, out_size, "%.*s: %.*s", 64, type,
                                 PROVIDER_MSG_MAX, pm);
                else
                        snprintf(out, out_size, "%.*s", PROVIDER_MSG_MAX, pm);
        } else {
                n = body->len < PROVIDER_MSG_MAX ? body->len : PROVIDER_MSG_MAX;
                if (n >= out_size)
                        n = out_size - 1;
                for (i = 0; i < n; i++) {
                        unsigned char c = (unsigned char)body->data[i];

                        out[i] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
                }
                out[n] = '\0';
        }
        json_decref(root);
}

/* One attempt. On anything but ATTEMPT_OK, \p why says what happened (not
 * yet redacted) and \p retry_after_msp is the server's wish or -1. */
static enum attempt_kind attempt(cq_llm_t *llm,
                                 const char *body,
                                 size_t body_len,
                                 cq_llm_reply_t *reply,
                                 char *why,
                                 size_t why_size,
                                 int64_t *retry_after_msp,
                                 long *statusp)
{
        cq_http_req_t req = {0};
        cq_http_res_t *res = &llm->res;
        long status;
        char detail[PROVIDER_MSG_MAX + 72];

        *retry_after_msp = -1;
        *statusp = 0;
        req.method = "POST";
        req.url = llm->ep[llm->provider].url;
        req.headers = llm->ep[llm->provider].headers;
        req.body = body;
        req.body_len = body_len;
        req.max = llm->conf.response_max;
        req.timeout_ms = llm->conf.timeout_s * 1000;
        req.deadline_ms = llm->deadline_ms;
        req.cancel = llm->cancel;
        switch (cq_http_perform(llm->http, &req, res)) {
        case CQ_HTTP_OK:
                break;
        case CQ_HTTP_CANCELLED:
        case CQ_HTTP_DEADLINE:
                snprintf(why, why_size, "%s", res->error);
                return ATTEMPT_CANCELLED;
        case CQ_HTTP_TOO_LARGE:
                snprintf(why, why_size,
                         "reply exceeds the limit of %zu bytes "
                         "(CODERQ_LLM_RESPONSE_MAX)",
                         req.max);
                return ATTEMPT_TOO_LARGE;
        case CQ_HTTP_NETWORK:
        case CQ_HTTP_REFUSED: /* no hook asks for these two */
        case CQ_HTTP_ABORTED:
                snprintf(why, why_size, "%s", res->error);
                return curl_code_transient(res->code) ? ATTEMPT_TRANSIENT
                                                      : ATTEMPT_FATAL;
        }
        status = res->status;
        if (status >= 200 && status < 300) {
                if (provider_of(llm->provider)
                        ->parse_reply(res->body.data, res->body.len, reply, why,
                                      why_size) != 0)
                        return ATTEMPT_INVALID;
                return ATTEMPT_OK;
        }
        describe_body(&res->body, detail, sizeof(detail));
        snprintf(why, why_size, "HTTP %ld%s%s", status, detail[0] ? ": " : "",
                 detail);
        *statusp = status;
        if (status == 429 || status == 408 || status >= 500) {
                *retry_after_msp = res->retry_after_ms;
                return ATTEMPT_TRANSIENT;
        }
        return ATTEMPT_FATAL;
}

/* Sleep \p ms unless the cancel flag rises; returns false if it did. */
static bool sleep_ms(const cq_llm_t *llm, int64_t ms)
{
        int64_t end = cq_now_ms() + ms;

        for (;;) {
                int64_t left = end - cq_now_ms();
                struct timespec ts;

                if (cancelled(llm))
                        return false;
                if (left <= 0)
                        return true;
                if (left > 50)
                        left = 50;
                ts.tv_sec = 0;
                ts.tv_nsec = (long)left * 1000000L;
                nanosleep(&ts, NULL);
        }
}

cq_err_t
cq_llm_chat(cq_llm_t *llm, const json_t *messages, cq_llm_reply_t *reply)
{
        cq_err_t rc = CQ_ERR_FATAL;
        char *body = NULL;
        size_t body_len = 0;
        char why[1024], shown[1024];
        int64_t waited_ms = 0, budget_ms, retry_after_ms, delay, sent_ms;
        long status = 0;
        char key[300];
        enum attempt_kind kind = ATTEMPT_FATAL;
        int n, attempts = 0, max_attempts = (int)llm->conf.max_attempts;

        llm->errmsg[0] = '\0';
        cq_llm_reply_release(reply);
        if (llm->provider == CQ_LLM_NONE) {
                llm_set_error(llm, "could not call the LLM: %s",
                              CQ_LLM_NONE_REASON);
                return CQ_ERR_FATAL;
        }
        if (!json_is_array(messages) || json_array_size(messages) == 0) {
                llm_set_error(llm, "could not call the LLM: messages must be "
                                   "a non-empty array");
                return CQ_ERR_FATAL;
        }
        if (llm->sampling_set && llm->has_seed &&
            llm->provider == CQ_LLM_ANTHROPIC) {
                llm_set_error(llm, "could not call the LLM: the Messages API "
                                   "(provider anthropic) takes no seed");
                return CQ_ERR_FATAL;
        }
        body = cq_llm_request_body(llm, messages, &body_len);
        if (!body) {
                llm_set_error(llm, "could not build the LLM request: out of "
                                   "memory");
                return CQ_ERR_FATAL;
        }
        budget_ms = llm->conf.max_wait_s * 1000;
        snprintf(key, sizeof(key), "%s:%s", cq_llm_provider_name(llm->provider),
                 cq_llm_model(llm));
        for (n = 1; n <= max_attempts; n++) {
                attempts = n;
                if (cancelled(llm)) {
                        kind = ATTEMPT_CANCELLED;
                        snprintf(why, sizeof(why), "%s", cancel_why(llm));
                        break;
                }
                if (llm->conf.limiter) {
                        int64_t t0 = cq_now_ms(), need = 0;
                        int64_t until = t0 + budget_ms - waited_ms;
                        int lr;

                        if (llm->deadline_ms > 0 && llm->deadline_ms < until)
                                until = llm->deadline_ms;
                        lr = llm_limiter_acquire(llm->conf.limiter, key, until,
                                                 llm->cancel, &need);

                        if (lr < 0) {
                                kind = ATTEMPT_CANCELLED;
                                snprintf(why, sizeof(why), "%s",
                                         cancel_why(llm));
                                break;
                        }
                        if (lr > 0) {
                                kind = ATTEMPT_TRANSIENT;
                                snprintf(why, sizeof(why),
                                         "the shared rate limit of model %s "
                                         "needs a wait of %" PRId64
                                         " ms, beyond the retry budget "
                                         "(CODERQ_LLM_MAX_WAIT_S)",
                                         cq_llm_model(llm), need);
                                break;
                        }
                        waited_ms += cq_now_ms() - t0;
                }
                sent_ms = cq_now_ms();
                kind = attempt(llm, body, body_len, reply, why, sizeof(why),
                               &retry_after_ms, &status);
                if (llm->conf.limiter)
                        llm_limiter_report(llm->conf.limiter, key, sent_ms,
                                           kind == ATTEMPT_OK ? LLM_OUTCOME_OK
                                           : status == 429 || status == 529
                                               ? LLM_OUTCOME_LIMITED
                                               : LLM_OUTCOME_NEUTRAL,
                                           retry_after_ms);
                if (kind == ATTEMPT_OK) {
                        llm->prompt_tokens += reply->prompt_tokens;
                        llm->completion_tokens += reply->completion_tokens;
                        llm->cache_read_tokens += reply->cache_read_tokens;
                        llm->cache_creation_tokens +=
                            reply->cache_creation_tokens;
                        rc = CQ_OK;
                        goto out;
                }
                if (kind != ATTEMPT_TRANSIENT && kind != ATTEMPT_INVALID)
                        break;
                if (n == max_attempts)
                        break;
                if (retry_after_ms >= 0) {
                        if (retry_after_ms > budget_ms - waited_ms) {
                                size_t l = strlen(why);

                                snprintf(why + l, sizeof(why) - l,
                                         "; the server asked to wait %" PRId64
                                         " ms, beyond the retry budget "
                                         "(CODERQ_LLM_MAX_WAIT_S)",
                                         retry_after_ms);
                                break;
                        }
                        delay = retry_after_ms;
                } else {
                        /* many slots and workers share one provider */
                        delay = cq_backoff_ms(n, llm->conf.backoff_base_ms,
                                              llm->conf.backoff_max_ms,
                                              CQ_JITTER_FULL);
                        if (delay > budget_ms - waited_ms)
                                delay = budget_ms - waited_ms;
                }
                snprintf(shown, sizeof(shown), "%s", why);
                cq_http_redact(llm->http, shown, sizeof(shown));
                sanitize_utf8(shown);
                {
                        char attempt_text[32], delay_text[32];

                        snprintf(attempt_text, sizeof(attempt_text), "%d/%d", n,
                                 max_attempts);
                        snprintf(delay_text, sizeof(delay_text), "%" PRId64,
                                 delay);
                        cq_log_kv(CQ_LOG_WARN, "LLM request failed, retrying",
                                  "url", llm->url_shown, "model",
                                  cq_llm_model(llm), "attempt", attempt_text,
                                  "error", shown, "delay_ms", delay_text, NULL);
                }
                if (!sleep_ms(llm, delay)) {
                        kind = ATTEMPT_CANCELLED;
                        snprintf(why, sizeof(why), "%s", cancel_why(llm));
                        break;
                }
                waited_ms += delay;
        }
        switch (kind) {
        case ATTEMPT_TRANSIENT:
                rc = CQ_ERR_RETRIABLE;
                llm_set_error(llm,
                              "could not get a reply from %s (model %s) after "
                              "%d attempt%s: %s",
                              llm->url_shown, cq_llm_model(llm), attempts,
                              attempts == 1 ? "" : "s", why);
                break;
        case ATTEMPT_INVALID:
                rc = CQ_ERR_FATAL;
                llm_set_error(llm,
                              "could not get a usable reply from %s (model "
                              "%s) after %d attempt%s: %s",
                              llm->url_shown, cq_llm_model(llm), attempts,
                              attempts == 1 ? "" : "s", why);
                break;
        case ATTEMPT_CANCELLED:
                rc = CQ_ERR_RETRIABLE;
                llm_set_error(llm, "could not get a reply from %s: %s",
                              llm->url_shown, why);
                break;
        case ATTEMPT_TOO_LARGE:
                rc = CQ_ERR_TOO_LARGE;
                llm_set_error(llm, "could not read the reply from %s: %s",
                              llm->url_shown, why);
                break;
        case ATTEMPT_FATAL:
        case ATTEMPT_OK:
                rc = CQ_ERR_FATAL;
                llm_set_error(llm, "LLM request to %s (model %s) failed: %s",
                              llm->url_shown, cq_llm_model(llm), why);
                break;
        }
out:
        /* The parser re-initialises the reply: set the count last. */
        if (rc != CQ_OK)
                cq_llm_reply_release(reply);
        reply->attempts = attempts;
        free(body);
        return rc;
}

cq_err_t cq_llm_list_models(cq_llm_t *llm, long *statusp)
{
        cq_http_req_t req = {0};
        cq_http_res_t *res = &llm->res;
        const struct endpoint *ep;

        *statusp = 0;
        llm->errmsg[0] = '\0';
        if (llm->provider == CQ_LLM_NONE) {
                llm_set_error(llm, "%s", CQ_LLM_NONE_REASON);
                return CQ_ERR_FATAL;
        }
        ep = &llm->ep[llm->provider];
        req.method = "GET";
        req.url = ep->models_url;
        req.headers = ep->headers;
        req.max = llm->conf.response_max;
        req.timeout_ms = llm->conf.timeout_s * 1000;
        req.deadline_ms = llm->deadline_ms;
        req.cancel = llm->cancel;
        if (cq_http_perform(llm->http, &req, res) != CQ_HTTP_OK) {
                llm_set_error(llm, "GET %s: %s", ep->models_shown, res->error);
                return CQ_ERR_RETRIABLE;
        }
        *statusp = res->status;
        llm_set_error(llm, "GET %s: HTTP %ld", ep->models_shown, res->status);
        if (res->status >= 200 && res->status < 300)
                return CQ_OK;
        if (res->status == 429 || res->status == 408 || res->status >= 500)
                return CQ_ERR_RETRIABLE;
        return CQ_ERR_FATAL;
}

/* --- provider dispatch ---------------------------------------------- */

char *cq_llm_request_body(cq_llm_t *llm, const json_t *messages, size_t *lenp)
{
        llm_req_t req;

        req.model = cq_llm_model(llm);
        req.max_tokens = llm->conf.max_tokens;
        req.temperature =
            llm->sampling_set ? llm->temperature : llm->conf.temperature;
        req.top_p = llm->sampling_set ? llm->top_p : -1;
        req.has_seed = llm->sampling_set && llm->has_seed;
        req.seed = llm->seed;
        return provider_of(llm->provider)->build_body(&req, messages, lenp);
}

int cq_llm_parse_reply(const char *body,
                       size_t len,
                       cq_llm_reply_t *reply,
                       char *errstr,
                       size_t errstr_size)
{
        return cq_llm_provider_openai.parse_reply(body, len, reply, errstr,
                                                  errstr_size);
}

int cq_llm_parse_reply_as(cq_llm_provider_t provider,
                          const char *body,
                          size_t len,
                          cq_llm_reply_t *reply,
                          char *errstr,
                          size_t errstr_size)
{
        return provider_of(provider)->parse_reply(body, len, reply, errstr,
                                                  errstr_size);
}

cq_llm_stop_t llm_stop_from(const char *reason)
{
        static const struct {
                const char *name;
                cq_llm_stop_t stop;
        } map[] = {
            {"stop", CQ_LLM_STOP_END},
            {"end_turn", CQ_LLM_STOP_END},
            {"stop_sequence", CQ_LLM_STOP_END},
            {"tool_calls", CQ_LLM_STOP_TOOL_USE},
            {"function_call", CQ_LLM_STOP_TOOL_USE},
            {"tool_use", CQ_LLM_STOP_TOOL_USE},
            {"length", CQ_LLM_STOP_MAX_TOKENS},
            {"max_tokens", CQ_LLM_STOP_MAX_TOKENS},
            {"model_context_window_exceeded", CQ_LLM_STOP_MAX_TOKENS},
            {"refusal", CQ_LLM_STOP_REFUSAL},
            {"content_filter", CQ_LLM_STOP_REFUSAL},
        };
        size_t i;

        if (!reason)
                return CQ_LLM_STOP_NONE;
        for (i = 0; i < sizeof(map) / sizeof(map[0]); i++)
                if (strcmp(reason, map[i].name) == 0)
                        return map[i].stop;
        return CQ_LLM_STOP_OTHER;
}
