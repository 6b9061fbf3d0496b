/* SPDX-License-Identifier: MIT */
/* llm_anthropic.c - the Anthropic Messages API wire format. The history
 * stays Chat Completions messages; this file converts it at request time
 * (system prompts to the top-level "system", tool calls to tool_use
 * blocks, tool results to tool_result blocks in user messages, same-role
 * neighbours merged) and turns a reply back into a Chat Completions
 * assistant message. The transport is llm.c. */
#include "coderq/agent/llm.h"

#include <stdint.h>

#include <stdlib.h>
#include <string.h>

#include "coderq/common/buf.h"
#include "llm_int.h"

/* The Messages API requires max_tokens. */
#define DEFAULT_MAX_TOKENS 8192

/* BASE/v1/messages, or BASE/messages when the base already ends in /v1
 * (so one CODERQ_LLM_BASE_URL can serve both formats of a gateway). */
static const char *path(const char *base, size_t base_len)
{
        if (base_len >= 3 && memcmp(base + base_len - 3, "/v1", 3) == 0)
                return "/messages";
        return "/v1/messages";
}

/* As path(): BASE/v1/models, or BASE/models. */
static const char *models_path(const char *base, size_t base_len)
{
        if (base_len >= 3 && memcmp(base + base_len - 3, "/v1", 3) == 0)
                return "/models";
        return "/v1/models";
}

/* Append the text of a Chat Completions "content" (a string, or parts
 * with "text") to \p blocks as text blocks; empty text is dropped, the
 * API rejects it. Returns 0, -1 when out of memory. */
static int add_text_blocks(json_t *blocks, const json_t *content)
{
        size_t i;
        const json_t *part;

        if (json_is_string(content)) {
                if (json_string_length(content) == 0)
                        return 0;
                return json_array_append_new(
                    blocks,
                    json_pack("{s:s, s:O}", "type", "text", "text", content));
        }
        if (!json_is_array(content))
                return 0;
        json_array_foreach(content, i, part)
        {
                const json_t *text = json_object_get(part, "text");

                if (!json_is_string(text) || json_string_length(text) == 0)
                        continue;
                if (json_array_append_new(
                        blocks,
                        json_pack("{s:s, s:O}", "type", "text", "text", text)))
                        return -1;
        }
        return 0;
}

/* The "input" object of a tool_use block from an OpenAI "arguments"
 * (a JSON string, or an object some servers send). Arguments that are
 * not an object are kept under "_arguments" so the model sees what it
 * sent; the API requires an object. */
static json_t *tool_input(const json_t *args)
{
        json_t *obj;

        if (json_is_object(args))
                return json_deep_copy(args);
        if (json_is_string(args)) {
                obj = json_loads(json_string_value(args), 0, NULL);
                if (json_is_object(obj))
                        return obj;
                json_decref(obj);
                return json_pack("{s:O}", "_arguments", args);
        }
        return json_object();
}

static int add_tool_use(json_t *blocks, const json_t *calls)
{
        size_t i;
        const json_t *call;

        if (!json_is_array(calls))
                return 0;
        json_array_foreach(calls, i, call)
        {
                const json_t *fn = json_object_get(call, "function");
                const char *id = json_string_value(json_object_get(call, "id"));
                const char *name =
                    json_string_value(json_object_get(fn, "name"));
                json_t *input;

                if (!id || !name)
                        continue; /* nothing the API could accept */
                input = tool_input(json_object_get(fn, "arguments"));
                if (!input ||
                    json_array_append_new(
                        blocks,
                        json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use",
                                  "id", id, "name", name, "input", input)))
                        return -1;
        }
        return 0;
}

static int add_tool_result(json_t *blocks, const json_t *msg)
{
        const json_t *id = json_object_get(msg, "tool_call_id");
        const json_t *content = json_object_get(msg, "content");
        json_t *block, *parts;

        if (!json_is_string(id))
                return 0;
        block =
            json_pack("{s:s, s:O}", "type", "tool_result", "tool_use_id", id);
        if (!block)
                return -1;
        if (json_is_string(content)) {
                if (json_object_set_new(
                        block, "content",
                        json_stringn(json_string_value(content),
                                     json_string_length(content))))
                        goto fail;
        } else if (json_is_array(content)) {
                parts = json_array();
                if (!parts || add_text_blocks(parts, content) ||
                    json_object_set_new(block, "content", parts))
                        goto fail;
        }
        return json_array_append_new(blocks, block);
fail:
        json_decref(block);
        return -1;
}

/* Append \p blocks as a message of \p role, merged into the last message
 * when it has the same role (the API wants alternating roles). Steals
 * \p blocks. */
static int push(json_t *out, const char *role, json_t *blocks)
{
        json_t *last = json_array_get(out, json_array_size(out) - 1);
        int rc;

        if (!blocks)
                return -1;
        if (json_array_size(blocks) == 0) {
                json_decref(blocks);
                return 0;
        }
        if (last && strcmp(json_string_value(json_object_get(last, "role")),
                           role) == 0) {
                rc =
                    json_array_extend(json_object_get(last, "content"), blocks);
                json_decref(blocks);
                return rc;
        }
        return json_array_append_new(
            out, json_pack("{s:s, s:o}", "role", role, "content", blocks));
}

/* Convert the history; the system text goes to \p systemp (a new
 * reference, NULL when there is none). */
static json_t *convert(const json_t *messages, json_t **systemp)
{
        json_t *out = json_array(), *system = NULL, *blocks;
        const json_t *msg;
        size_t i;

        *systemp = NULL;
        if (!out)
                return NULL;
        json_array_foreach(messages, i, msg)
        {
                const char *role =
                    json_string_value(json_object_get(msg, "role"));
                const json_t *content = json_object_get(msg, "content");

                if (!role)
                        continue;
                if (strcmp(role, "system") == 0 ||
                    strcmp(role, "developer") == 0) {
                        if (!system)
                                system = json_array();
                        if (!system || add_text_blocks(system, content))
                                goto fail;
                } else if (strcmp(role, "assistant") == 0) {
                        blocks = json_array();
                        if (!blocks || add_text_blocks(blocks, content) ||
                            add_tool_use(blocks,
                                         json_object_get(msg, "tool_calls"))) {
                                json_decref(blocks);
                                goto fail;
                        }
                        if (push(out, "assistant", blocks))
                                goto fail;
                } else if (strcmp(role, "tool") == 0) {
                        blocks = json_array();
                        if (!blocks || add_tool_result(blocks, msg)) {
                                json_decref(blocks);
                                goto fail;
                        }
                        if (push(out, "user", blocks))
                                goto fail;
                } else {
                        blocks = json_array();
                        if (!blocks || add_text_blocks(blocks, content)) {
                                json_decref(blocks);
                                goto fail;
                        }
                        if (push(out, "user", blocks))
                                goto fail;
                }
        }
        *systemp = system;
        return out;
fail:
        json_decref(system);
        json_decref(out);
        return NULL;
}

static json_t *tools(void)
{
        return json_pack("[{s:s, s:s, s:{s:s, s:{s:{s:s, s:s}}, s:[s], s:b}}]",
                         "name", CQ_LLM_TOOL_NAME, "description",
                         cq_llm_tool_description, "input_schema", "type",
                         "object", "properties", "code", "type", "string",
                         "description",
                         "the Python code to run as one notebook cell",
                         "required", "code", "additionalProperties", 0);
}

static char *
build_body(const llm_req_t *req, const json_t *messages, size_t *lenp)
{
        json_t *root = NULL, *system = NULL, *msgs;
        char *text = NULL;

        msgs = convert(messages, &system);
        if (!msgs)
                goto out;
        root = json_pack(
            "{s:s, s:I, s:o, s:o, s:{s:s}}", "model", req->model, "max_tokens",
            (json_int_t)(req->max_tokens > 0 ? req->max_tokens
                                             : DEFAULT_MAX_TOKENS),
            "messages", msgs, "tools", tools(), "tool_choice", "type", "auto");
        if (!root)
                goto out;
        if (system && json_array_size(system) > 0) {
                /* One string, as SDK users write it: the texts joined. */
                cq_buf_t buf;
                size_t i;
                const json_t *part;
                char *joined;
                bool failed = false;

                cq_buf_init(&buf, SIZE_MAX / 2);
                json_array_foreach(system, i, part)
                {
                        const json_t *t = json_object_get(part, "text");

                        if ((i > 0 && cq_buf_append(&buf, "\n\n", 2)) ||
                            cq_buf_append(&buf, json_string_value(t),
                                          json_string_length(t)))
                                failed = true;
                }
                joined = failed ? NULL : cq_buf_take(&buf, NULL);
                cq_buf_release(&buf);
                if (!joined ||
                    json_object_set_new(root, "system", json_string(joined))) {
                        free(joined);
                        goto out;
                }
                free(joined);
        }
        if (req->temperature >= 0 &&
            json_object_set_new(root, "temperature",
                                json_real(req->temperature)))
                goto out;
        /* No seed: the Messages API has none (cq_llm_set_sampling()
         * refuses one for this provider). */
        if (req->top_p >= 0 &&
            json_object_set_new(root, "top_p", json_real(req->top_p)))
                goto out;
        text = json_dumps(root, JSON_COMPACT);
        if (text)
                *lenp = strlen(text);
out:
        json_decref(system);
        json_decref(root);
        return text;
}

/* --- replies -------------------------------------------------------- */

static int oom(char *errstr, size_t errstr_size)
{
        cq_errstr_set(errstr, errstr_size,
                      "could not parse reply: out of memory");
        return -1;
}

/* Read the tool_use blocks into reply->calls and the text blocks into
 * \p text (a new string, or NULL when there was none). */
static int read_blocks(const json_t *content,
                       cq_llm_reply_t *reply,
                       json_t **textp,
                       char *errstr,
                       size_t errstr_size)
{
        size_t i, ncalls = 0;
        const json_t *block;
        json_t *text = NULL;

        json_array_foreach(content, i, block)
        {
                const char *type =
                    json_string_value(json_object_get(block, "type"));

                if (!json_is_object(block) || !type) {
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: content[%zu] is not "
                                      "a block with a type",
                                      i);
                        goto fail;
                }
                if (strcmp(type, "tool_use") == 0)
                        ncalls++;
        }
        if (ncalls) {
                reply->calls = calloc(ncalls, sizeof(*reply->calls));
                if (!reply->calls)
                        goto oom;
        }
        json_array_foreach(content, i, block)
        {
                const char *type =
                    json_string_value(json_object_get(block, "type"));

                if (strcmp(type, "text") == 0) {
                        const json_t *t = json_object_get(block, "text");

                        if (!json_is_string(t)) {
                                cq_errstr_set(errstr, errstr_size,
                                              "invalid reply: content[%zu] "
                                              "has no text string",
                                              i);
                                goto fail;
                        }
                        if (!text) {
                                text = json_stringn(json_string_value(t),
                                                    json_string_length(t));
                        } else {
                                size_t a = json_string_length(text),
                                       b = json_string_length(t);
                                char *buf = malloc(a + b + 1);

                                if (!buf)
                                        goto oom;
                                memcpy(buf, json_string_value(text), a);
                                memcpy(buf + a, json_string_value(t), b);
                                buf[a + b] = '\0';
                                json_decref(text);
                                text = json_stringn(buf, a + b);
                                free(buf);
                        }
                        if (!text)
                                goto oom;
                } else if (strcmp(type, "tool_use") == 0) {
                        cq_llm_tool_call_t *call = &reply->calls[reply->ncalls];
                        const json_t *id = json_object_get(block, "id");
                        const json_t *name = json_object_get(block, "name");
                        const json_t *input = json_object_get(block, "input");

                        if (!json_is_string(id) || !*json_string_value(id)) {
                                cq_errstr_set(errstr, errstr_size,
                                              "invalid reply: tool_use "
                                              "block content[%zu] has no id",
                                              i);
                                goto fail;
                        }
                        if (!json_is_string(name)) {
                                cq_errstr_set(errstr, errstr_size,
                                              "invalid reply: tool_use "
                                              "block content[%zu] has no "
                                              "name",
                                              i);
                                goto fail;
                        }
                        reply->ncalls++; /* release frees what is set */
                        call->id = strdup(json_string_value(id));
                        call->name = strdup(json_string_value(name));
                        if (!call->id || !call->name)
                                goto oom;
                        if (!json_is_object(input)) {
                                call->error = strdup(
                                    "the tool input is not a JSON object");
                                if (!call->error)
                                        goto oom;
                                continue;
                        }
                        call->arguments = json_dumps(input, JSON_COMPACT);
                        if (!call->arguments || llm_parse_code(call) != 0)
                                goto oom;
                }
                /* thinking, redacted_thinking, server tool blocks: not
                 * ours to answer; they are not kept */
        }
        *textp = text;
        return 0;
oom:
        oom(errstr, errstr_size);
fail:
        json_decref(text);
        return -1;
}

/* The Chat Completions assistant message equivalent to the reply. */
static json_t *as_message(const cq_llm_reply_t *reply, json_t *text)
{
        json_t *msg, *calls;
        size_t i;

        msg = json_pack("{s:s, s:O}", "role", "assistant", "content",
                        text ? text : json_null());
        if (!msg || reply->ncalls == 0)
                return msg;
        calls = json_array();
        if (!calls || json_object_set_new(msg, "tool_calls", calls))
                goto fail;
        for (i = 0; i < reply->ncalls; i++) {
                const cq_llm_tool_call_t *call = &reply->calls[i];

                if (json_array_append_new(
                        calls,
                        json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call->id,
                                  "type", "function", "function", "name",
                                  call->name, "arguments",
                                  call->arguments ? call->arguments : "{}")))
                        goto fail;
        }
        return msg;
fail:
        json_decref(msg);
        return NULL;
}

static int parse_reply(const char *body,
                       size_t len,
                       cq_llm_reply_t *reply,
                       char *errstr,
                       size_t errstr_size)
{
        json_t *root = NULL, *text = NULL;
        const json_t *content, *v, *usage;
        const char *type;
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
        type = json_string_value(json_object_get(root, "type"));
        content = json_object_get(root, "content");
        if ((type && strcmp(type, "message") != 0) || !json_is_array(content)) {
                const char *pm = llm_provider_message(root);

                if (pm)
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: no message; the "
                                      "server said: %.*s",
                                      LLM_PROVIDER_MSG_MAX, pm);
                else if (type && strcmp(type, "message") != 0)
                        cq_errstr_set(errstr, errstr_size,
                                      "invalid reply: type is \"%.40s\", "
                                      "not \"message\"",
                                      type);
                else
                        cq_errstr_set(errstr, errstr_size, "invalid reply: %s",
                                      content ? "content is not an array"
                                              : "no content");
                goto out;
        }
        if (read_blocks(content, reply, &text, errstr, errstr_size) != 0)
                goto out;
        reply->message = as_message(reply, text);
        if (!reply->message || llm_unnul(reply->message, "content")) {
                oom(errstr, errstr_size);
                goto out;
        }
        reply->content =
            json_string_value(json_object_get(reply->message, "content"));
        v = json_object_get(root, "stop_reason");
        if (json_is_string(v)) {
                reply->stop = llm_stop_from(json_string_value(v));
                reply->finish_reason = strdup(json_string_value(v));
                if (!reply->finish_reason) {
                        oom(errstr, errstr_size);
                        goto out;
                }
        }
        usage = json_object_get(root, "usage");
        if (json_is_object(usage)) {
                reply->has_usage = true;
                reply->cache_read_tokens =
                    llm_usage_value(usage, "cache_read_input_tokens");
                reply->cache_creation_tokens =
                    llm_usage_value(usage, "cache_creation_input_tokens");
                /* input_tokens counts only the uncached part; the job's
                 * prompt_tokens count every input token, as OpenAI's do */
                reply->prompt_tokens = llm_usage_value(usage, "input_tokens") +
                                       reply->cache_read_tokens +
                                       reply->cache_creation_tokens;
                reply->completion_tokens =
                    llm_usage_value(usage, "output_tokens");
        }
        rc = 0;
out:
        json_decref(text);
        json_decref(root);
        if (rc != 0)
                cq_llm_reply_release(reply);
        return rc;
}

const llm_provider_t cq_llm_provider_anthropic = {
    .id = CQ_LLM_ANTHROPIC,
    .name = "anthropic",
    .default_base = "https://api.anthropic.com",
    .path = path,
    .models_path = models_path,
    .build_body = build_body,
    .parse_reply = parse_reply,
};
