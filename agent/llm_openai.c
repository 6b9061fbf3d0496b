/* SPDX-License-Identifier: MIT */
/* llm_openai.c - the Chat Completions wire format: the history is sent
 * verbatim, and the reply's choices[0].message is kept verbatim. The
 * transport (retries, the limiter) is llm.c, over the HTTP client. */
#include "coderq/agent/llm.h"

#include <stdlib.h>
#include <string.h>

#include "llm_int.h"

static const char *path(const char *base, size_t base_len)
{
        (void)base;
        (void)base_len;
        return "/chat/completions";
}

static const char *models_path(const char *base, size_t base_len)
{
        (void)base;
        (void)base_len;
        return "/models";
}

/* The body: {"messages": <verbatim>, "model", "max_tokens", ...}. The
 * messages are serialised separately so that the caller's const history is
 * never copied or modified. */
static char *
build_body(const llm_req_t *req, const json_t *messages, size_t *lenp)
{
        json_t *head = NULL;
        char *head_text = NULL, *msgs_text = NULL, *body = NULL;
        size_t hlen, mlen;

        head =
            json_pack("{s:s, s:o, s:s, s:b}", "model", req->model, "tools",
                      cq_llm_tools_json(), "tool_choice", "auto", "stream", 0);
        if (!head)
                goto out;
        if (req->max_tokens > 0 &&
            json_object_set_new(head, "max_tokens",
                                json_integer(req->max_tokens)))
                goto out;
        if (req->temperature >= 0 &&
            json_object_set_new(head, "temperature",
                                json_real(req->temperature)))
                goto out;
        if (req->top_p >= 0 &&
            json_object_set_new(head, "top_p", json_real(req->top_p)))
                goto out;
        if (req->has_seed &&
            json_object_set_new(head, "seed",
                                json_integer((json_int_t)req->seed)))
                goto out;
        head_text = json_dumps(head, JSON_COMPACT);
        msgs_text = json_dumps(messages, JSON_COMPACT);
        if (!head_text || !msgs_text)
                goto out;
        hlen = strlen(head_text); /* "{...}" with at least one member */
        mlen = strlen(msgs_text);
        body = malloc(sizeof("{\"messages\":,") + mlen + hlen);
        if (!body)
                goto out;
        memcpy(body, "{\"messages\":", 12);
        memcpy(body + 12, msgs_text, mlen);
        body[12 + mlen] = ',';
        memcpy(body + 13 + mlen, head_text + 1, hlen); /* with its NUL */
        *lenp = 12 + mlen + hlen;
out:
        json_decref(head);
        free(head_text);
        free(msgs_text);
        return body;
}

static int parse_tool_calls(const json_t *calls,
                            cq_llm_reply_t *reply,
                            char *errstr,
                            size_t errstr_size)
{
        size_t i, n;
        const json_t *call;

        if (!calls || json_is_null(calls))
                return 0;
        if (!json_is_array(calls)) {
                cq_errstr_set(errstr, errstr_size,
                              "invalid reply: message.tool_calls is not an "
                              "array");
                return -1;
        }
        n = json_array_size(calls);
        if (n == 0)
                return 0;
        reply->calls = calloc(n, sizeof(*reply->calls));
        if (!reply->calls)
                goto oom;
        json_array_foreach(calls, i, call)
        {
                cq_llm_tool_call_t *out = &reply->calls[i];
                const json_t *id = json_object_get(call, "id");
                const json_t *fn = json_object_get(call, "function");
                const json_t *name = json_object_get(fn, "name");
                const json_t *args = json_object_get(fn, "arguments");

                if (!json_is_object(call)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: tool_calls[%zu] is not "
                                      "an object",
                                      i);
                        return -1;
                }
                if (!json_is_string(id) || !*json_string_value(id)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: tool_calls[%zu] has no "
                                      "id",
                                      i);
                        return -1;
                }
                if (!json_is_object(fn) || !json_is_string(name)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: tool_calls[%zu] has no "
                                      "function name",
                                      i);
                        return -1;
                }
                reply->ncalls = i + 1; /* release frees what is set */
                out->id = strdup(json_string_value(id));
                out->name = strdup(json_string_value(name));
                if (!out->id || !out->name)
                        goto oom;
                if (json_is_string(args)) {
                        out->arguments = strdup(json_string_value(args));
                        if (!out->arguments)
                                goto oom;
                } else if (json_is_object(args)) {
                        /* Some servers send the object itself. */
                        out->arguments = json_dumps(args, JSON_COMPACT);
                        if (!out->arguments)
                                goto oom;
                } else if (args && !json_is_null(args)) {
                        out->error = strdup("arguments are neither a JSON "
                                            "string nor an object");
                        if (!out->error)
                                goto oom;
                        continue;
                }
                if (llm_parse_code(out) != 0)
                        goto oom;
        }
        return 0;
oom:
        cq_errstr_set(errstr, errstr_size,
                      "could not parse reply: out of memory");
        return -1;
}

static int parse_reply(const char *body,
                       size_t len,
                       cq_llm_reply_t *reply,
                       char *errstr,
                       size_t errstr_size)
{
        json_t *root = NULL;
        const json_t *choices, *choice, *v, *usage;
        json_t *message;
        json_error_t jerr;
        int rc = -1;

        cq_llm_reply_init(reply);
        if (!body) {
                cq_errstr_set(errstr, errstr_size, "invalid reply: empty body");
                goto out;
        }
        /* U+0000 is valid JSON: taken, then made U+FFFD in the text */
        root = json_loadb(body, len, JSON_ALLOW_NUL, &jerr);
        if (!root) {
                cq_errstr_set(errstr, errstr_size,
                              "invalid reply: not valid JSON: %s (at byte %d "
                              "of %zu)",
                              jerr.text, jerr.position, len);
                goto out;
        }
        if (!json_is_object(root)) {
                cq_errstr_set(errstr, errstr_size,
                              "invalid reply: not a JSON object");
                goto out;
        }
        choices = json_object_get(root, "choices");
        if (!json_is_array(choices) || json_array_size(choices) == 0) {
                const char *pm = llm_provider_message(root);

                if (pm)
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: no choices; the server "
                                      "said: %.*s",
                                      LLM_PROVIDER_MSG_MAX, pm);
                else
                        cq_errstr_set(errstr, errstr_size, "invalid reply: %s",
                                      choices ? "choices is not a non-empty "
                                                "array"
                                              : "no choices");
                goto out;
        }
        choice = json_array_get(choices, 0);
        message = json_object_get(choice, "message");
        if (!json_is_object(message)) {
                cq_errstr_set(errstr, errstr_size,
                              "invalid reply: choices[0].message is missing or "
                              "not an object");
                goto out;
        }
        if (llm_unnul(message, "content") ||
            llm_unnul(message, "reasoning_content") ||
            llm_unnul(message, "reasoning")) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                goto out;
        }
        reply->message = json_incref(message);
        v = json_object_get(message, "content");
        if (json_is_string(v))
                reply->content = json_string_value(v);
        v = json_object_get(message, "reasoning_content");
        if (!json_is_string(v))
                v = json_object_get(message, "reasoning");
        if (json_is_string(v))
                reply->reasoning = json_string_value(v);
        v = json_object_get(choice, "finish_reason");
        if (json_is_string(v)) {
                reply->stop = llm_stop_from(json_string_value(v));
                reply->finish_reason = strdup(json_string_value(v));
                if (!reply->finish_reason) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not parse reply: out of memory");
                        goto out;
                }
        }
        if (parse_tool_calls(json_object_get(message, "tool_calls"), reply,
                             errstr, errstr_size) != 0)
                goto out;
        usage = json_object_get(root, "usage");
        if (json_is_object(usage)) {
                reply->has_usage = true;
                const json_t *details =
                    json_object_get(usage, "prompt_tokens_details");

                reply->prompt_tokens = llm_usage_value(usage, "prompt_tokens");
                reply->completion_tokens =
                    llm_usage_value(usage, "completion_tokens");
                /* OpenAI counts cached tokens inside prompt_tokens;
                 * DeepSeek reports prompt_cache_hit_tokens. */
                reply->cache_read_tokens =
                    llm_usage_value(details, "cached_tokens");
                if (!reply->cache_read_tokens)
                        reply->cache_read_tokens =
                            llm_usage_value(usage, "prompt_cache_hit_tokens");
        }
        rc = 0;
out:
        json_decref(root);
        if (rc != 0)
                cq_llm_reply_release(reply);
        return rc;
}

const llm_provider_t cq_llm_provider_openai = {
    .id = CQ_LLM_OPENAI,
    .name = "openai",
    .default_base = "https://api.openai.com/v1",
    .path = path,
    .models_path = models_path,
    .build_body = build_body,
    .parse_reply = parse_reply,
};
