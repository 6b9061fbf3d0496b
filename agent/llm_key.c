/* SPDX-License-Identifier: MIT */
/* llm_key.c - whether the configured provider has the API key it needs,
 * checked by a worker before it starts: a missing key is a setting to
 * fix, unless the base URL is local, where a self-hosted server often
 * asks for none. Nothing here is sent anywhere; coderq doctor's request
 * that tries the key is cq_llm_list_models() in llm.c. */
#include "coderq/agent/llm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "coderq/agent/fetch.h"
#include "coderq/common/util.h"

/* Whether \p name (\p len bytes) ends with \p suffix, case aside. */
static bool ends_with(const char *name, size_t len, const char *suffix)
{
        size_t n = strlen(suffix);

        return len >= n && strncasecmp(name + len - n, suffix, n) == 0;
}

bool cq_llm_url_is_local(const char *url)
{
        const char *scheme = url ? strstr(url, "://") : NULL;
        const char *host, *at, *p;
        size_t auth_len, len;
        char text[256];
        struct sockaddr_in v4 = {0};
        struct sockaddr_in6 v6 = {0};

        if (!scheme)
                return false;
        host = scheme + 3;
        auth_len = strcspn(host, "/?#");
        for (at = NULL, p = host; p < host + auth_len; p++)
                if (*p == '@')
                        at = p;
        if (at) {
                auth_len -= (size_t)(at + 1 - host);
                host = at + 1;
        }
        if (*host == '[') {
                p = memchr(host, ']', auth_len);
                if (!p)
                        return false;
                host++;
                len = (size_t)(p - host);
        } else {
                p = memchr(host, ':', auth_len);
                len = p ? (size_t)(p - host) : auth_len;
        }
        while (len > 0 && host[len - 1] == '.')
                len--; /* "localhost." is localhost */
        if (len == 0 || len >= sizeof(text))
                return false;
        memcpy(text, host, len);
        text[len] = '\0';
        if (inet_pton(AF_INET, text, &v4.sin_addr) == 1) {
                v4.sin_family = AF_INET;
                return !cq_fetch_addr_is_public((const struct sockaddr *)&v4);
        }
        if (inet_pton(AF_INET6, text, &v6.sin6_addr) == 1) {
                v6.sin6_family = AF_INET6;
                return !cq_fetch_addr_is_public((const struct sockaddr *)&v6);
        }
        return strcasecmp(text, "localhost") == 0 ||
               ends_with(text, len, ".localhost") ||
               ends_with(text, len, ".local") || !strchr(text, '.');
}

/* Whether \p url holds user:password@, credentials of its own. */
static bool has_userinfo(const char *url)
{
        const char *scheme = strstr(url, "://");
        size_t auth_len;

        if (!scheme)
                return false;
        auth_len = strcspn(scheme + 3, "/?#");
        return memchr(scheme + 3, '@', auth_len) != NULL;
}

int cq_llm_conf_check_key(const cq_llm_conf_t *conf,
                          char *errstr,
                          size_t errstr_size)
{
        const char *base =
            conf->base_url && *conf->base_url ? conf->base_url : NULL;
        const char *key, *vars;
        char shown[512];

        switch (conf->provider) {
        case CQ_LLM_OPENAI:
                key = conf->api_key;
                vars = "CODERQ_LLM_API_KEY (or OPENAI_API_KEY)";
                break;
        case CQ_LLM_ANTHROPIC:
                key = conf->anthropic_api_key && *conf->anthropic_api_key
                          ? conf->anthropic_api_key
                          : conf->api_key;
                vars = "CODERQ_LLM_ANTHROPIC_API_KEY (or ANTHROPIC_API_KEY, "
                       "or CODERQ_LLM_API_KEY)";
                break;
        default:
                return 0; /* none calls no LLM */
        }
        if ((key && *key) || (base && has_userinfo(base)))
                return 0;
        if (base)
                cq_url_redact(base, shown, sizeof(shown));
        if (base && cq_llm_url_is_local(base)) {
                cq_errstr_set(errstr, errstr_size,
                              "no LLM API key: CODERQ_LLM_BASE_URL %s is "
                              "local, so its requests go without one (set "
                              "%s if the server wants one)",
                              shown, vars);
                return 1;
        }
        cq_errstr_set(errstr, errstr_size,
                      "CODERQ_LLM_PROVIDER=%s needs an API key: set %s%s%s%s",
                      cq_llm_provider_name(conf->provider), vars,
                      base ? " (CODERQ_LLM_BASE_URL " : "", base ? shown : "",
                      base ? " is not local)" : "");
        return -1;
}
