/* SPDX-License-Identifier: MIT */
/* check_llm.c - the Chat Completions client against tests/fakes/fake_llm.py
 * (started per test on a loopback port), the reply parser on golden and
 * malformed replies, Retry-After parsing, the token estimate and the
 * settings. */
#include <curl/curl.h>
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/config.h"
#include "coderq/agent/llm.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "../agent/llm_int.h"
#include "support/fake_llm.h"
#include "support/loopback.h"

#define TEST_KEY "sk-test-SECRET-4f9a0c1d2e3b5a6978"

static cq_fake_llm_t *fake;

static void fake_setup(void)
{
        ck_assert_int_eq(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
        fake = cq_fake_llm_start(NULL);
        ck_assert_msg(fake != NULL, "could not start the fake LLM");
}

static void fake_teardown(void)
{
        cq_fake_llm_stop(&fake);
        curl_global_cleanup();
}

/* A client for the fake with fast backoff; tests adjust \p conf first. */
static void test_conf(cq_llm_conf_t *conf, const char *model)
{
        cq_llm_conf_init(conf);
        conf->base_url = cq_fake_llm_base_url(fake);
        conf->api_key = TEST_KEY;
        conf->model = model;
        conf->max_tokens = 1024;
        conf->timeout_s = 30;
        conf->max_attempts = 4;
        conf->max_wait_s = 30;
        conf->backoff_base_ms = 10;
        conf->backoff_max_ms = 50;
}

static cq_llm_t *new_llm(const cq_llm_conf_t *conf)
{
        char errstr[256] = "";
        cq_llm_t *llm = cq_llm_new(conf, errstr, sizeof(errstr));

        ck_assert_msg(llm != NULL, "cq_llm_new: %s", errstr);
        return llm;
}

static json_t *start_history(void)
{
        return json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system",
                         "content", "You are a careful data analyst.", "role",
                         "user", "content", "Compute 1 + 1 in Python.");
}

/* Append the reply verbatim and answer each of its tool calls. */
static void append_turn(json_t *history, const cq_llm_reply_t *reply)
{
        size_t i;

        ck_assert_int_eq(json_array_append(history, reply->message), 0);
        for (i = 0; i < reply->ncalls; i++)
                ck_assert_int_eq(
                    json_array_append_new(
                        history,
                        json_pack("{s:s, s:s, s:s, s:s}", "role", "tool",
                                  "tool_call_id", reply->calls[i].id, "name",
                                  CQ_LLM_TOOL_NAME, "content", "2\n")),
                    0);
}

static json_t *requests(void)
{
        json_t *reqs = cq_fake_llm_requests(fake);

        ck_assert_msg(json_is_array(reqs), "no request log from the fake");
        return reqs;
}

static json_int_t req_int(const json_t *reqs, size_t i, const char *key)
{
        return json_integer_value(
            json_object_get(json_array_get(reqs, i), key));
}

static const char *req_str(const json_t *reqs, size_t i, const char *key)
{
        return json_string_value(json_object_get(json_array_get(reqs, i), key));
}

/* --- talking to the fake --------------------------------------------- */

START_TEST(one_tool_call_then_final)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs, *body, *tools, *fn;
        int64_t prompt, completion;
        size_t i;

        test_conf(&conf, "script:one_call");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_int_eq(reply.attempts, 1);
        ck_assert_uint_eq(reply.ncalls, 1);
        ck_assert_str_eq(reply.calls[0].id, "call_one_call_0_0");
        ck_assert_str_eq(reply.calls[0].name, "execute_code");
        ck_assert_str_eq(reply.calls[0].code, "print(1 + 1)");
        ck_assert_ptr_null(reply.calls[0].error);
        ck_assert_str_eq(reply.finish_reason, "tool_calls");
        ck_assert_ptr_null(reply.content);
        ck_assert(reply.has_usage);
        ck_assert_int_eq(reply.prompt_tokens, 100);
        ck_assert_int_eq(reply.completion_tokens, 20);
        append_turn(history, &reply);

        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 0);
        ck_assert_str_eq(reply.content, "The answer is 2.");
        ck_assert_str_eq(reply.finish_reason, "stop");
        cq_llm_usage(llm, &prompt, &completion);
        ck_assert_int_eq(prompt, 250);
        ck_assert_int_eq(completion, 30);
        cq_llm_usage_reset(llm);
        cq_llm_usage(llm, &prompt, NULL);
        ck_assert_int_eq(prompt, 0);

        /* What the server saw: valid bodies with our tool and settings, the
         * assistant message sent back unchanged, the tool answer's id. */
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 2);
        for (i = 0; i < 2; i++) {
                body = json_object_get(json_array_get(reqs, i), "body");
                ck_assert_msg(json_is_true(json_object_get(
                                  json_array_get(reqs, i), "valid")),
                              "request %zu invalid: %s", i,
                              req_str(reqs, i, "error"));
                ck_assert_str_eq(
                    json_string_value(json_object_get(body, "model")),
                    "script:one_call");
                ck_assert_str_eq(
                    json_string_value(json_object_get(body, "tool_choice")),
                    "auto");
                ck_assert_int_eq(
                    json_integer_value(json_object_get(body, "max_tokens")),
                    1024);
                tools = json_object_get(body, "tools");
                ck_assert_uint_eq(json_array_size(tools), 1);
                fn = json_object_get(json_array_get(tools, 0), "function");
                ck_assert_str_eq(json_string_value(json_object_get(fn, "name")),
                                 "execute_code");
                ck_assert_str_eq(req_str(reqs, i, "authorization"),
                                 "Bearer " TEST_KEY);
                ck_assert_str_eq(req_str(reqs, i, "content_type"),
                                 "application/json");
        }
        body = json_object_get(json_array_get(reqs, 1), "body");
        ck_assert_uint_eq(json_array_size(json_object_get(body, "messages")),
                          4);
        ck_assert(
            json_equal(json_array_get(json_object_get(body, "messages"), 2),
                       json_array_get(history, 2)));
        ck_assert_int_eq(req_int(reqs, 1, "step"), 1);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
        ck_assert_ptr_null(llm);
}
END_TEST

START_TEST(two_tool_calls_in_one_reply)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:two_calls");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 2);
        ck_assert_str_eq(reply.calls[0].id, "call_two_calls_0_0");
        ck_assert_str_eq(reply.calls[0].code, "x = 41 + 1");
        ck_assert_str_eq(reply.calls[1].id, "call_two_calls_0_1");
        ck_assert_str_eq(reply.calls[1].code, "print(x)");
        ck_assert_str_eq(reply.content, "I will define x, then print it.");
        ck_assert_uint_eq(
            json_array_size(json_object_get(reply.message, "tool_calls")), 2);
        append_turn(history, &reply);
        /* The fake rejects a history where a call is left unanswered, so
         * this succeeding proves both answers went out with their ids. */
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "x is 42.");
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 2);
        ck_assert(
            json_is_true(json_object_get(json_array_get(reqs, 1), "valid")));
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(unanswered_tool_call_is_rejected_by_the_fake)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();

        test_conf(&conf, "script:two_calls");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        /* Answer only the first call, as upstream does. */
        ck_assert_int_eq(json_array_append(history, reply.message), 0);
        ck_assert_int_eq(
            json_array_append_new(history,
                                  json_pack("{s:s, s:s, s:s}", "role", "tool",
                                            "tool_call_id", reply.calls[0].id,
                                            "content", "")),
            0);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_FATAL);
        ck_assert_int_eq(reply.attempts, 1);
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm),
                                     "HTTP 400: an assistant message with "
                                     "'tool_calls' must be followed"));
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "call_two_calls_0_1"));
        ck_assert_ptr_null(reply.message);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(final_text_from_default_script)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();

        test_conf(&conf, "gpt-4o-mini");
        conf.temperature = 0.2;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 0);
        ck_assert_str_eq(reply.content, "This is the fake LLM's final answer.");
        ck_assert_str_eq(reply.finish_reason, "stop");
        ck_assert(reply.has_usage);
        ck_assert_int_gt(reply.prompt_tokens, 0);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(model_override_selects_the_script)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();

        test_conf(&conf, "gpt-4o-mini");
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_set_model(llm, "script:two_calls"), 0);
        ck_assert_str_eq(cq_llm_model(llm), "script:two_calls");
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 2);
        ck_assert_int_eq(cq_llm_set_model(llm, NULL), 0);
        ck_assert_str_eq(cq_llm_model(llm), "gpt-4o-mini");
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(reasoning_content_kept_verbatim)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *stripped;

        test_conf(&conf, "script:reasoning");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.reasoning,
                         "The user wants a greeting; I will print one.");
        ck_assert_str_eq(json_string_value(json_object_get(
                             reply.message, "reasoning_content")),
                         "The user wants a greeting; I will print one.");
        ck_assert(json_is_null(json_object_get(reply.message, "content")));

        /* Like DeepSeek's thinking mode, the fake refuses a history whose
         * assistant message lost its reasoning_content ... */
        stripped = json_deep_copy(history);
        append_turn(history, &reply);
        {
                json_t *msg = json_deep_copy(reply.message);
                cq_llm_reply_t r2;

                json_object_del(msg, "reasoning_content");
                json_array_append_new(stripped, msg);
                json_array_append_new(
                    stripped,
                    json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                              reply.calls[0].id, "content", "hello\n"));
                cq_llm_reply_init(&r2);
                ck_assert_int_eq(cq_llm_chat(llm, stripped, &r2), CQ_ERR_FATAL);
                ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm),
                                             "reasoning_content in the "
                                             "thinking mode must be passed "
                                             "back"));
                cq_llm_reply_release(&r2);
        }
        /* ... and accepts the verbatim one. */
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "Printed hello.");
        ck_assert_str_eq(reply.reasoning, "It printed hello, so I am done.");
        cq_llm_reply_release(&reply);
        json_decref(stripped);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(rate_limit_honours_retry_after)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;
        double gap;

        test_conf(&conf, "script:rate_limited");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "after the rate limit");
        ck_assert_int_eq(reply.attempts, 2);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 2);
        ck_assert_int_eq(req_int(reqs, 0, "status"), 429);
        ck_assert_int_eq(req_int(reqs, 1, "status"), 200);
        /* Backoff here is at most 50 ms; only Retry-After: 1 can separate
         * the attempts by a second. A lower bound on a sleep cannot flake. */
        gap = json_real_value(json_object_get(json_array_get(reqs, 1), "ts")) -
              json_real_value(json_object_get(json_array_get(reqs, 0), "ts"));
        ck_assert_msg(gap >= 0.9, "Retry-After not honoured: gap %.3f s", gap);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(rate_limit_with_http_date)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();

        test_conf(&conf, "script:rate_limited_date");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "after the dated rate limit");
        ck_assert_int_eq(reply.attempts, 2);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(retry_after_beyond_budget_gives_up)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:rate_limited");
        conf.max_wait_s = 0;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_int_eq(reply.attempts, 1);
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "HTTP 429: Rate limit reached"));
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "beyond the retry budget"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(server_error_then_success)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:server_error");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "after two 500s");
        ck_assert_int_eq(reply.attempts, 3);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 3);
        ck_assert_int_eq(req_int(reqs, 0, "status"), 500);
        ck_assert_int_eq(req_int(reqs, 1, "status"), 500);
        ck_assert_int_eq(req_int(reqs, 2, "status"), 200);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(server_down_bounded_attempts)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:server_down");
        conf.max_attempts = 3;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_int_eq(reply.attempts, 3);
        ck_assert_ptr_null(reply.message);
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "after 3 attempts"));
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm),
                   "HTTP 503: The engine is currently overloaded"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 3);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(unauthorized_fails_at_once_without_the_key)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:bad_key");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_FATAL);
        ck_assert_int_eq(reply.attempts, 1);
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "HTTP 401: Incorrect API key provided"));
        /* The fake echoed the Authorization header into its message. */
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "Bearer [redacted]"));
        ck_assert_ptr_null(strstr(cq_llm_errmsg(llm), TEST_KEY));
        ck_assert_ptr_null(strstr(cq_llm_errmsg(llm), "SECRET"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

/* Read everything written to the log pipe so far. */
static char *drain(int fd)
{
        static char text[65536];
        size_t len = 0;
        ssize_t n;

        while (len + 1 < sizeof(text) &&
               (n = read(fd, text + len, sizeof(text) - 1 - len)) > 0)
                len += (size_t)n;
        text[len] = '\0';
        return text;
}

START_TEST(key_never_in_logs)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *script;
        int fds[2];
        char *logs;

        script = json_pack("[{s:[{s:s, s:i, s:i, s:s, s:b}], s:s}]", "faults",
                           "kind", "http", "status", 502, "times", 2, "message",
                           "bad gateway", "echo_auth", 1, "content",
                           "through at last");
        ck_assert_int_eq(cq_fake_llm_add_script(fake, "echo_502", script), 0);
        json_decref(script);
        ck_assert_int_eq(pipe(fds), 0);
        cq_log_set_fd(fds[1]);
        test_conf(&conf, "script:echo_502");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "through at last");
        ck_assert_int_eq(reply.attempts, 3);
        cq_log_set_fd(2);
        close(fds[1]);
        logs = drain(fds[0]);
        close(fds[0]);
        /* Two retry warnings that quote the provider's echo, redacted. */
        ck_assert_ptr_nonnull(strstr(logs, "LLM request failed, retrying"));
        ck_assert_ptr_nonnull(strstr(logs, "\"attempt\":\"2/4\""));
        ck_assert_ptr_nonnull(strstr(logs, "bad gateway (you sent: Bearer "
                                           "[redacted])"));
        ck_assert_ptr_null(strstr(logs, TEST_KEY));
        ck_assert_ptr_null(strstr(logs, "SECRET"));
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(invalid_replies_then_success)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:garbage_then_ok");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "after three bad replies");
        ck_assert_int_eq(reply.attempts, 4);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 4);
        ck_assert_str_eq(req_str(reqs, 0, "fault"), "invalid_json");
        ck_assert_str_eq(req_str(reqs, 1, "fault"), "truncated");
        ck_assert_str_eq(req_str(reqs, 2, "fault"), "no_choices");
        ck_assert(
            json_is_null(json_object_get(json_array_get(reqs, 3), "fault")));
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(invalid_replies_forever_fail_clearly)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:garbage_forever");
        conf.max_attempts = 3;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_FATAL);
        ck_assert_int_eq(reply.attempts, 3);
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "could not get a usable reply"));
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "after 3 attempts"));
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "invalid reply: not valid JSON"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 3);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(dropped_connection_is_retried)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();

        test_conf(&conf, "script:disconnect_then_ok");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.content, "after a dropped connection");
        ck_assert_int_eq(reply.attempts, 2);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(response_over_cap_is_fatal)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:huge");
        conf.response_max = 64 * 1024;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_TOO_LARGE);
        ck_assert_int_eq(reply.attempts, 1);
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm),
                                     "reply exceeds the limit of 65536 "
                                     "bytes"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        cq_llm_destroy(&llm);

        /* The same reply fits a larger cap. */
        conf.response_max = 1024 * 1024;
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(strlen(reply.content), 300000);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

/* The caller's deadline (a job's time limit) ends a call as a cancel
 * does: the request in flight, and no retry after it. */
START_TEST(deadline_ends_a_slow_reply)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:slow");
        conf.timeout_s = 120; /* longer than the fake's 20 s delay */
        llm = new_llm(&conf);
        cq_llm_set_deadline(llm, cq_now_ms() + 300);
        cq_llm_reply_init(&reply);
        /* without the deadline this call would succeed after 20 s */
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_msg(
            strstr(cq_llm_errmsg(llm), "the caller's deadline passed"), "%s",
            cq_llm_errmsg(llm));
        ck_assert_int_eq(reply.attempts, 1);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        /* past it, the next call sends nothing */
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        /* cleared, calls go out again */
        cq_llm_set_deadline(llm, 0);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(cancel_aborts_a_slow_reply)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;
        atomic_int cancel = 0;
        pthread_t thread;

        test_conf(&conf, "script:slow");
        conf.timeout_s = 120; /* longer than the fake's 20 s delay */
        llm = new_llm(&conf);
        cq_llm_set_cancel(llm, &cancel);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(
            pthread_create(&thread, NULL, cq_loopback_raise_later, &cancel), 0);
        /* Without the cancel this call would succeed with "too late"
         * after 20 s; the error proves the flag ended it. */
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        pthread_join(thread, NULL);
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "request cancelled"));
        ck_assert_int_eq(reply.attempts, 1);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);

        /* A raised flag stops the next call before any request. */
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

/* GET .../models tries the key as each provider sends it: a Bearer token
 * for openai at BASE/models, x-api-key and anthropic-version for
 * anthropic at BASE/models when BASE ends in /v1 (BASE/v1/models
 * otherwise); the status of a refused key, never the key. */
START_TEST(list_models_tries_the_key)
{
        const char *args[] = {"--require-key", TEST_KEY, NULL};
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        json_t *reqs, *r;
        long status = -1;
        char want[256];

        cq_fake_llm_stop(&fake);
        fake = cq_fake_llm_start(args);
        ck_assert_ptr_nonnull(fake);
        test_conf(&conf, "demo");
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_list_models(llm, &status), CQ_OK);
        ck_assert_int_eq(status, 200);
        snprintf(want, sizeof(want), "GET %s/models: HTTP 200",
                 cq_fake_llm_base_url(fake));
        ck_assert_str_eq(cq_llm_errmsg(llm), want);
        ck_assert_int_eq(cq_llm_set_provider(llm, "anthropic"), 0);
        ck_assert_int_eq(cq_llm_list_models(llm, &status), CQ_OK);
        cq_llm_destroy(&llm);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 2);
        r = json_array_get(reqs, 0);
        ck_assert_str_eq(json_string_value(json_object_get(r, "path")),
                         "/v1/models");
        ck_assert_str_eq(json_string_value(json_object_get(r, "api")),
                         "openai");
        ck_assert_str_eq(json_string_value(json_object_get(r, "authorization")),
                         "Bearer " TEST_KEY);
        r = json_array_get(reqs, 1);
        ck_assert_str_eq(json_string_value(json_object_get(r, "path")),
                         "/v1/models");
        ck_assert_str_eq(json_string_value(json_object_get(r, "api")),
                         "anthropic");
        ck_assert_str_eq(json_string_value(json_object_get(r, "x_api_key")),
                         TEST_KEY);
        json_decref(reqs);

        /* a wrong key, and none: 401, the key nowhere in the message */
        conf.api_key = "sk-wrong-SECRET-key";
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_list_models(llm, &status), CQ_ERR_FATAL);
        ck_assert_int_eq(status, 401);
        snprintf(want, sizeof(want), "GET %s/models: HTTP 401",
                 cq_fake_llm_base_url(fake));
        ck_assert_str_eq(cq_llm_errmsg(llm), want);
        cq_llm_destroy(&llm);
        conf.api_key = NULL;
        conf.provider = CQ_LLM_ANTHROPIC;
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_list_models(llm, &status), CQ_ERR_FATAL);
        ck_assert_int_eq(status, 401);
        cq_llm_destroy(&llm);

        /* no server: no status, worth another try */
        conf.base_url = "http://127.0.0.1:1/v1";
        conf.provider = CQ_LLM_OPENAI;
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_list_models(llm, &status), CQ_ERR_RETRIABLE);
        ck_assert_int_eq(status, 0);
        ck_assert_msg(strncmp(cq_llm_errmsg(llm),
                              "GET http://127.0.0.1:1/v1/models: ", 34) == 0,
                      "%s", cq_llm_errmsg(llm));
        cq_llm_destroy(&llm);
}
END_TEST

/* With provider none there is no LLM: a job's provider does not bring
 * one back, and a call or a key check fails at once, sending nothing and
 * naming the setting. */
START_TEST(provider_none_calls_nothing)
{
        cq_llm_conf_t conf;
        cq_llm_provider_t provider = CQ_LLM_OPENAI;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;
        cq_llm_t *llm;
        long status = -1;

        ck_assert_int_eq(cq_llm_provider_parse("none", &provider), 0);
        ck_assert_int_eq(provider, CQ_LLM_NONE);
        ck_assert_str_eq(cq_llm_provider_name(CQ_LLM_NONE), "none");
        test_conf(&conf, "demo");
        conf.provider = CQ_LLM_NONE;
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_provider(llm), CQ_LLM_NONE);
        ck_assert_int_eq(cq_llm_set_provider(llm, "anthropic"), 0);
        ck_assert_int_eq(cq_llm_provider(llm), CQ_LLM_NONE);
        ck_assert_int_eq(cq_llm_set_provider(llm, "nope"), -1);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_FATAL);
        ck_assert_str_eq(cq_llm_errmsg(llm),
                         "could not call the LLM: " CQ_LLM_NONE_REASON);
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "CODERQ_LLM_PROVIDER is none"));
        ck_assert_int_eq(cq_llm_list_models(llm, &status), CQ_ERR_FATAL);
        ck_assert_int_eq(status, 0);
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        cq_llm_destroy(&llm);
        /* nor may a job ask for none on a client that has an LLM */
        conf.provider = CQ_LLM_OPENAI;
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_set_provider(llm, "none"), -1);
        ck_assert_int_eq(cq_llm_provider(llm), CQ_LLM_OPENAI);
        cq_llm_destroy(&llm);
        json_decref(history);
}
END_TEST

START_TEST(provider_variations)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();

        test_conf(&conf, "script:variants");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_str_eq(reply.finish_reason, "eos");
        ck_assert(!reply.has_usage);
        ck_assert_str_eq(reply.content, "");
        ck_assert_uint_eq(reply.ncalls, 4);
        ck_assert_str_eq(reply.calls[0].code, "print('object arguments')");
        ck_assert_ptr_null(reply.calls[1].code);
        ck_assert_ptr_nonnull(
            strstr(reply.calls[1].error, "arguments are not valid JSON"));
        ck_assert_str_eq(reply.calls[1].arguments, "{\"code\": \"print(1)\"");
        ck_assert_ptr_null(reply.calls[2].code);
        ck_assert_str_eq(reply.calls[2].error,
                         "arguments have no \"code\" string");
        ck_assert_str_eq(reply.calls[3].name, "run_shell");
        ck_assert_ptr_nonnull(
            strstr(reply.calls[3].error, "unknown tool \"run_shell\""));
        /* Vendor fields stay in the verbatim message. */
        ck_assert_int_eq(
            json_integer_value(json_object_get(
                json_object_get(reply.message, "vendor_field"), "a")),
            1);
        ck_assert(json_is_null(json_object_get(reply.message, "refusal")));
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(connection_refused_is_retriable)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history();
        char url[64];

        snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/",
                 cq_loopback_dead_port());
        test_conf(&conf, "gpt-4o-mini");
        conf.base_url = url;
        conf.max_attempts = 2;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_int_eq(reply.attempts, 2);
        /* The trailing slash of the base URL was dropped. */
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "/v1/chat/completions"));
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "after 2 attempts"));
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "onnect"));
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(bad_arguments_fail_without_a_request)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *empty = json_array(), *reqs;
        char errstr[256];

        test_conf(&conf, "gpt-4o-mini");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, empty, &reply), CQ_ERR_FATAL);
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "non-empty array"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 0);
        json_decref(reqs);
        cq_llm_destroy(&llm);

        conf.model = NULL;
        ck_assert_ptr_null(cq_llm_new(&conf, errstr, sizeof(errstr)));
        ck_assert_ptr_nonnull(strstr(errstr, "no model configured"));
        conf.model = "m";
        conf.base_url = "ftp://example.com/v1";
        ck_assert_ptr_null(cq_llm_new(&conf, errstr, sizeof(errstr)));
        ck_assert_ptr_nonnull(strstr(errstr, "is not http:// or https://"));
        ck_assert_ptr_null(cq_llm_new(&conf, NULL, 0));
        json_decref(empty);
}
END_TEST

START_TEST(timeout_is_retriable)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *reqs;

        test_conf(&conf, "script:slow");
        conf.timeout_s = 1;
        conf.max_attempts = 2;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_int_eq(reply.attempts, 2);
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "timed out"));
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), 2);
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

/* The fake refuses what a real server refuses, so client bugs surface. */
START_TEST(fake_rejects_invalid_histories)
{
        static const struct {
                const char *history;
                const char *want;
        } cases[] = {
            {"[{\"role\": \"robot\", \"content\": \"x\"}]",
             "messages[0].role 'robot' is invalid"},
            {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", "
             "\"tool_call_id\": \"c9\", \"content\": \"\"}]",
             "answers no preceding tool call"},
            {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": "
             "\"c1\", \"type\": \"function\", \"function\": {\"name\": "
             "\"execute_code\", \"arguments\": \"{}\"}}]}, {\"role\": "
             "\"user\", \"content\": \"next\"}]",
             "must be followed by tool messages"},
            {"[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
             "\"assistant\", \"content\": \"hi\", \"tool_calls\": []}]",
             "empty array"},
            {"[{\"role\": \"user\"}]", "messages[0].content must be a string"},
        };
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history, *reqs;
        size_t i;

        test_conf(&conf, "gpt-4o-mini");
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        for (i = 0; i < CQ_ARRAY_SIZE(cases); i++) {
                history = json_loads(cases[i].history, 0, NULL);
                ck_assert_ptr_nonnull(history);
                ck_assert_int_eq(cq_llm_chat(llm, history, &reply),
                                 CQ_ERR_FATAL);
                ck_assert_int_eq(reply.attempts, 1);
                ck_assert_msg(strstr(cq_llm_errmsg(llm), "HTTP 400: ") &&
                                  strstr(cq_llm_errmsg(llm), cases[i].want),
                              "case %zu: %s", i, cq_llm_errmsg(llm));
                json_decref(history);
        }
        reqs = requests();
        ck_assert_uint_eq(json_array_size(reqs), CQ_ARRAY_SIZE(cases));
        ck_assert(
            json_is_false(json_object_get(json_array_get(reqs, 0), "valid")));
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(fake_log_file_and_port_file)
{
        char dir[] = "/tmp/cq-fake-llm-XXXXXX";
        char log_path[128], port_path[128];
        const char *args[] = {"--log",   log_path,       "--port-file",
                              port_path, "--latency-ms", "5",
                              NULL};
        cq_fake_llm_t *other;
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *line;
        char *text;
        size_t len;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(log_path, sizeof(log_path), "%s/requests.jsonl", dir);
        snprintf(port_path, sizeof(port_path), "%s/port", dir);
        other = cq_fake_llm_start(args);
        ck_assert_ptr_nonnull(other);
        text = cq_check_slurp(port_path, &len);
        ck_assert_int_eq(strtol(text, NULL, 10), cq_fake_llm_port(other));
        free(text);
        test_conf(&conf, "script:one_call");
        conf.base_url = cq_fake_llm_base_url(other);
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        cq_fake_llm_stop(&other);
        text = cq_check_slurp(log_path, &len);
        ck_assert_uint_eq(len > 0 ? (size_t)(strchr(text, '\n') - text) + 1 : 0,
                          len); /* exactly one line */
        line = json_loads(text, 0, NULL);
        ck_assert_ptr_nonnull(line);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(line, "body"), "model")),
                         "script:one_call");
        ck_assert_int_eq(json_integer_value(json_object_get(line, "status")),
                         200);
        json_decref(line);
        free(text);
        unlink(log_path);
        unlink(port_path);
        rmdir(dir);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

START_TEST(messages_hide_url_credentials_and_stay_utf8)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *script, *event;
        char url[128], errstr[256];

        /* A Latin-1 error page: "Serveur surcharg\xe9" and a cut sequence. */
        script =
            json_pack("[{s:[{s:s, s:i, s:i, s:s}], s:s}]", "faults", "kind",
                      "http", "status", 502, "times", -1, "raw_body_hex",
                      "3c703e53657276657572207375726368617267e93c2f703ee6",
                      "content", "never");
        ck_assert_ptr_nonnull(script);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, "latin1", script), 0);
        json_decref(script);
        snprintf(url, sizeof(url), "http://bob:sekrit@127.0.0.1:%d/v1",
                 cq_fake_llm_port(fake));
        test_conf(&conf, "script:latin1");
        conf.base_url = url;
        conf.max_attempts = 1;
        llm = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_ptr_null(strstr(cq_llm_errmsg(llm), "sekrit"));
        ck_assert_ptr_nonnull(strstr(cq_llm_errmsg(llm), "http://127.0.0.1:"));
        ck_assert_ptr_nonnull(
            strstr(cq_llm_errmsg(llm), "HTTP 502: <p>Serveur surcharg?</p>?"));
        /* It can go into JSON as it is. */
        event = json_pack("{s:s}", "reason", cq_llm_errmsg(llm));
        ck_assert_ptr_nonnull(event);
        json_decref(event);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);

        conf.api_key = "sk-abc\n";
        ck_assert_ptr_null(cq_llm_new(&conf, errstr, sizeof(errstr)));
        ck_assert_ptr_nonnull(strstr(errstr, "control characters"));
        ck_assert_ptr_null(strstr(errstr, "sk-abc"));
}
END_TEST

/* --- pure functions ---------------------------------------------------- */

START_TEST(tools_json_shape)
{
        json_t *tools = cq_llm_tools_json();
        json_t *tool, *fn, *params, *code;
        const char *desc;
        char text[128];

        ck_assert_uint_eq(json_array_size(tools), 1);
        tool = json_array_get(tools, 0);
        ck_assert_str_eq(json_string_value(json_object_get(tool, "type")),
                         "function");
        fn = json_object_get(tool, "function");
        ck_assert_str_eq(json_string_value(json_object_get(fn, "name")),
                         "execute_code");
        params = json_object_get(fn, "parameters");
        ck_assert_str_eq(json_string_value(json_object_get(params, "type")),
                         "object");
        ck_assert(
            json_is_false(json_object_get(params, "additionalProperties")));
        ck_assert_uint_eq(json_array_size(json_object_get(params, "required")),
                          1);
        ck_assert_str_eq(json_string_value(json_array_get(
                             json_object_get(params, "required"), 0)),
                         "code");
        ck_assert_uint_eq(
            json_object_size(json_object_get(params, "properties")), 1);
        code = json_object_get(json_object_get(params, "properties"), "code");
        ck_assert_str_eq(json_string_value(json_object_get(code, "type")),
                         "string");
        desc = json_string_value(json_object_get(fn, "description"));
        ck_assert_ptr_nonnull(
            strstr(desc, "\"[image NAME: MIME, N bytes, not shown]\""));
        ck_assert_ptr_nonnull(strstr(desc, "stderr"));
        cq_llm_image_placeholder(text, sizeof(text), "fig1.png", "image/png",
                                 52311);
        ck_assert_str_eq(text, "[image fig1.png: image/png, 52311 bytes, not "
                               "shown]");
        json_decref(tools);
}
END_TEST

START_TEST(estimate_tokens_counts_code_and_reasoning)
{
        json_t *msgs;
        char code[301];

        ck_assert_int_eq(cq_llm_estimate_tokens(NULL), 0);
        msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "abcdef");
        ck_assert_int_eq(cq_llm_estimate_tokens(msgs), 3 + 4 + 2);
        json_decref(msgs);
        /* Two CJK code points are two tokens; "ab" one. */
        msgs = json_pack("[{s:s, s:s}]", "role", "user", "content",
                         "ab\xe6\x95\xb0\xe6\x8d\xae");
        ck_assert_int_eq(cq_llm_estimate_tokens(msgs), 3 + 4 + 1 + 2);
        json_decref(msgs);
        /* The code in the arguments and the reasoning count (upstream
         * counted neither). */
        memset(code, 'a', 300);
        code[300] = '\0';
        msgs = json_pack("[{s:s, s:n, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}]",
                         "role", "assistant", "content", "reasoning_content",
                         "xyz", "tool_calls", "id", "c1", "type", "function",
                         "function", "name", "execute_code", "arguments", code);
        /* 3 + 4 + reasoning 1 + call 8 + name 4 + args 100 */
        ck_assert_int_eq(cq_llm_estimate_tokens(msgs), 3 + 4 + 1 + 8 + 4 + 100);
        json_decref(msgs);
        /* Content parts and tool messages. */
        msgs =
            json_pack("[{s:s, s:[{s:s, s:s}]}, {s:s, s:s, s:s}]", "role",
                      "user", "content", "type", "text", "text", "abc", "role",
                      "tool", "tool_call_id", "c1", "content", "abcdef");
        ck_assert_int_eq(cq_llm_estimate_tokens(msgs), 3 + 4 + 1 + 4 + 1 + 2);
        json_decref(msgs);
}
END_TEST

/* A worker's check of the key before it starts: each provider's key and
 * the variables that hold it, none needing none, and a local base URL
 * (a self-hosted server) getting a warning instead of a refusal. */
START_TEST(key_check_names_the_variables)
{
        static const struct {
                const char *url;
                bool local;
        } urls[] = {
            {"http://127.0.0.1:8000/v1", true},
            {"http://localhost:11434/v1", true},
            {"http://LOCALHOST./v1", true},
            {"http://[::1]:8000/v1", true},
            {"http://10.1.2.3/v1", true},
            {"http://192.168.1.20:8080", true},
            {"http://[fd00::5]/v1", true},
            {"http://gpu-box.local:8000/v1", true},
            {"http://vllm:8000/v1", true},
            {"http://u:p@127.0.0.1/v1", true},
            {"https://api.openai.com/v1", false},
            {"https://8.8.8.8/v1", false},
            {"https://llm.example.com", false},
            {"https://[2001:4860::8888]/v1", false},
            {"https://127.0.0.1.example.com/v1", false},
            {"127.0.0.1:8000", false},
            {"http://", false},
        };
        cq_llm_conf_t conf;
        char errstr[512];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(urls); i++)
                ck_assert_msg(cq_llm_url_is_local(urls[i].url) == urls[i].local,
                              "%s", urls[i].url);

        cq_llm_conf_init(&conf);
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         -1);
        ck_assert_str_eq(errstr, "CODERQ_LLM_PROVIDER=openai needs an API "
                                 "key: set CODERQ_LLM_API_KEY (or "
                                 "OPENAI_API_KEY)");
        conf.api_key = "";
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         -1);
        conf.api_key = "sk-1";
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         0);
        conf.provider = CQ_LLM_ANTHROPIC;
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         0); /* CODERQ_LLM_API_KEY serves anthropic too */
        conf.api_key = NULL;
        conf.base_url = "https://u:p@gw.example.com?key=k";
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         0); /* credentials of its own */
        conf.base_url = "https://gw.example.com/v1?key=k";
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         -1);
        ck_assert_str_eq(errstr,
                         "CODERQ_LLM_PROVIDER=anthropic needs an API key: set "
                         "CODERQ_LLM_ANTHROPIC_API_KEY (or ANTHROPIC_API_KEY, "
                         "or CODERQ_LLM_API_KEY) (CODERQ_LLM_BASE_URL "
                         "https://gw.example.com/v1?key=(redacted) is not "
                         "local)");
        conf.anthropic_api_key = "sk-ant-1";
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         0);
        conf.anthropic_api_key = NULL;
        conf.base_url = "http://127.0.0.1:8000";
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         1);
        ck_assert_str_eq(errstr, "no LLM API key: CODERQ_LLM_BASE_URL "
                                 "http://127.0.0.1:8000 is local, so its "
                                 "requests go without one (set "
                                 "CODERQ_LLM_ANTHROPIC_API_KEY (or "
                                 "ANTHROPIC_API_KEY, or CODERQ_LLM_API_KEY) "
                                 "if the server wants one)");
        conf.provider = CQ_LLM_NONE;
        conf.base_url = NULL;
        ck_assert_int_eq(cq_llm_conf_check_key(&conf, errstr, sizeof(errstr)),
                         0);
}
END_TEST

START_TEST(settings_rows)
{
        cq_config_t cfg;
        cq_llm_conf_t conf;
        char errstr[256];

        unsetenv("CODERQ_LLM_API_KEY");
        setenv("OPENAI_API_KEY", "sk-from-openai-var", 1);
        setenv("CODERQ_LLM_MAX_TOKENS", "2048", 1);
        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_ptr_null(cfg.llm_base_url); /* the provider's default */
        ck_assert_str_eq(cfg.llm_provider, "openai");
        ck_assert_int_eq(cfg.llm_rate_max, 0);
        ck_assert_int_eq(cfg.llm_max_attempts, 5);
        ck_assert_uint_eq(cfg.llm_response_max, 8u * 1024 * 1024);
        ck_assert_int_eq(cfg.llm_context_window, 128000);
        ck_assert_int_eq(cq_config_load_env(&cfg, errstr, sizeof(errstr)), 0);
        ck_assert_str_eq(cfg.llm_api_key, "sk-from-openai-var");
        ck_assert_int_eq(cfg.llm_max_tokens, 2048);
        setenv("CODERQ_LLM_API_KEY", "sk-coderq-var", 1);
        ck_assert_int_eq(cq_config_load_env(&cfg, errstr, sizeof(errstr)), 0);
        ck_assert_str_eq(cfg.llm_api_key, "sk-coderq-var");
        ck_assert_int_eq(cq_config_set(&cfg, "llm-timeout-s", "0", "--x",
                                       errstr, sizeof(errstr)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "llm-response-max", "1M", NULL,
                                       errstr, sizeof(errstr)),
                         0);
        cq_llm_conf_from_config(&conf, &cfg);
        ck_assert_str_eq(conf.api_key, "sk-coderq-var");
        ck_assert_str_eq(conf.model, "gpt-4o-mini");
        ck_assert_int_eq(conf.max_tokens, 2048);
        ck_assert_int_eq(conf.timeout_s, 300);
        ck_assert_uint_eq(conf.response_max, 1024 * 1024);
        ck_assert(conf.temperature < 0);
        cq_config_release(&cfg);
        unsetenv("OPENAI_API_KEY");
        unsetenv("CODERQ_LLM_API_KEY");
        unsetenv("CODERQ_LLM_MAX_TOKENS");
}
END_TEST

/* --- the reply parser: golden files and malformed input --------------- */

static json_t *str_or_null(const char *s)
{
        return s ? json_string(s) : json_null();
}

static json_t *summarize(const cq_llm_reply_t *reply)
{
        json_t *calls = json_array();
        size_t i;

        for (i = 0; i < reply->ncalls; i++)
                json_array_append_new(
                    calls,
                    json_pack("{s:s, s:s, s:o, s:o}", "id", reply->calls[i].id,
                              "name", reply->calls[i].name, "code",
                              str_or_null(reply->calls[i].code), "error",
                              str_or_null(reply->calls[i].error)));
        return json_pack("{s:o, s:o, s:o, s:b, s:I, s:I, s:o}", "content",
                         str_or_null(reply->content), "reasoning",
                         str_or_null(reply->reasoning), "finish_reason",
                         str_or_null(reply->finish_reason), "has_usage",
                         reply->has_usage, "prompt_tokens",
                         (json_int_t)reply->prompt_tokens, "completion_tokens",
                         (json_int_t)reply->completion_tokens, "calls", calls);
}

START_TEST(parser_golden_replies)
{
        const char *dir = cq_check_srcpath("tests/data/llm/replies");
        char base[4096];
        DIR *d;
        struct dirent *de;
        int cases = 0;

        snprintf(base, sizeof(base), "%s", dir);
        d = opendir(base);
        ck_assert_ptr_nonnull(d);
        while ((de = readdir(d)) != NULL) {
                char path[8192];
                char *body;
                size_t len, cut;
                json_t *expected, *got;
                cq_llm_reply_t reply;
                char errstr[512] = "";
                const char *want_err;
                int rc;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "%s/%s/input.json", base,
                         de->d_name);
                body = cq_check_slurp(path, &len);
                snprintf(path, sizeof(path), "%s/%s/expected.json", base,
                         de->d_name);
                expected = json_load_file(path, 0, NULL);
                ck_assert_msg(expected != NULL, "bad %s", path);
                cq_llm_reply_init(&reply);
                rc = cq_llm_parse_reply(body, len, &reply, errstr,
                                        sizeof(errstr));
                want_err = json_string_value(
                    json_object_get(expected, "error_contains"));
                if (want_err) {
                        ck_assert_msg(rc == -1, "%s: parsed", de->d_name);
                        ck_assert_msg(strstr(errstr, want_err) != NULL,
                                      "%s: error \"%s\" lacks \"%s\"",
                                      de->d_name, errstr, want_err);
                } else {
                        char *a, *b;

                        ck_assert_msg(rc == 0, "%s: %s", de->d_name, errstr);
                        got = summarize(&reply);
                        a = json_dumps(got, JSON_SORT_KEYS);
                        b = json_dumps(expected, JSON_SORT_KEYS);
                        ck_assert_msg(json_equal(got, expected),
                                      "%s:\n got %s\nwant %s", de->d_name, a,
                                      b);
                        free(a);
                        free(b);
                        json_decref(got);
                }
                cq_llm_reply_release(&reply);
                /* Every strict prefix of the body is rejected cleanly. */
                while (len && (body[len - 1] == '\n' || body[len - 1] == ' '))
                        len--;
                for (cut = 0; cut < len; cut++) {
                        errstr[0] = '\0';
                        ck_assert_int_eq(cq_llm_parse_reply(body, cut, &reply,
                                                            errstr,
                                                            sizeof(errstr)),
                                         -1);
                        ck_assert_msg(errstr[0] != '\0', "no error at %zu",
                                      cut);
                        ck_assert_ptr_null(reply.message);
                }
                json_decref(expected);
                free(body);
                cases++;
        }
        closedir(d);
        ck_assert_int_ge(cases, 7);
}
END_TEST

static uint64_t fuzz_rng = 0x12345678abcdefULL;

static uint64_t fuzz_next(void)
{
        fuzz_rng ^= fuzz_rng << 13;
        fuzz_rng ^= fuzz_rng >> 7;
        fuzz_rng ^= fuzz_rng << 17;
        return fuzz_rng;
}

START_TEST(parser_random_bytes_and_mutations)
{
        char buf[1024];
        char errstr[256];
        cq_llm_reply_t reply;
        char *golden;
        size_t glen, i, j;

        cq_llm_reply_init(&reply);
        for (i = 0; i < 3000; i++) {
                size_t len = fuzz_next() % sizeof(buf);

                for (j = 0; j < len; j++)
                        buf[j] = (char)fuzz_next();
                errstr[0] = '\0';
                ck_assert_int_eq(cq_llm_parse_reply(buf, len, &reply, errstr,
                                                    sizeof(errstr)),
                                 -1);
                ck_assert(errstr[0] != '\0');
        }
        golden = cq_check_slurp(cq_check_srcpath("tests/data/llm/replies/"
                                                 "openai_tool_call/input.json"),
                                &glen);
        for (i = 0; i < 3000; i++) {
                char *copy = malloc(glen);
                size_t flips = 1 + fuzz_next() % 4;
                int rc;

                memcpy(copy, golden, glen);
                for (j = 0; j < flips; j++)
                        copy[fuzz_next() % glen] = (char)fuzz_next();
                errstr[0] = '\0';
                rc = cq_llm_parse_reply(copy, glen, &reply, errstr,
                                        sizeof(errstr));
                if (rc == 0) {
                        ck_assert_ptr_nonnull(reply.message);
                        for (j = 0; j < reply.ncalls; j++)
                                ck_assert(reply.calls[j].code ||
                                          reply.calls[j].error);
                } else {
                        ck_assert_int_eq(rc, -1);
                        ck_assert(errstr[0] != '\0');
                        ck_assert_ptr_null(reply.message);
                }
                cq_llm_reply_release(&reply);
                free(copy);
        }
        free(golden);
        ck_assert_int_eq(cq_llm_parse_reply(NULL, 0, &reply, NULL, 0), -1);
}
END_TEST

/* Malformed shapes: body, expected rc, text the error or the first call's
 * error must contain. */
static const struct {
        const char *body;
        int rc;
        const char *want;
} malformed[] = {
    {"", -1, "not valid JSON"},
    {"[]", -1, "not a JSON object"},
    {"{}", -1, "no choices"},
    {"{\"choices\": {}}", -1, "choices is not a non-empty array"},
    {"{\"choices\": []}", -1, "choices is not a non-empty array"},
    {"{\"choices\": [1]}", -1, "choices[0].message is missing"},
    {"{\"choices\": [{\"message\": \"hi\"}]}", -1, "not an object"},
    {"{\"choices\": [{\"message\": null}]}", -1, "not an object"},
    {"{\"choices\": [{}]}", -1, "choices[0].message is missing"},
    {"{\"error\": \"model not found\"}", -1, "the server said: model not"},
    {"{\"detail\": \"Not Found\", \"choices\": null}", -1,
     "the server said: Not Found"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": {}}}]}", -1,
     "tool_calls is not an array"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [1]}}]}", -1,
     "tool_calls[0] is not an object"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"function\": "
     "{\"name\": \"execute_code\", \"arguments\": \"{}\"}}]}}]}",
     -1, "tool_calls[0] has no id"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": 7, "
     "\"function\": {\"name\": \"execute_code\"}}]}}]}",
     -1, "tool_calls[0] has no id"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\"}]}}]}", -1,
     "tool_calls[0] has no function name"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"arguments\": \"{}\"}}]}}]}",
     -1, "has no function name"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"name\": \"execute_code\"}}]}}]}",
     0, "the tool call has no arguments"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"name\": \"execute_code\", \"arguments\": 5}}]}}]}",
     0, "neither a JSON string nor an object"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"name\": \"execute_code\", \"arguments\": "
     "\"print(1)\"}}]}}]}",
     0, "arguments are not valid JSON"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"name\": \"execute_code\", \"arguments\": "
     "\"[1, 2]\"}}]}}]}",
     0, "arguments are not a JSON object"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"name\": \"execute_code\", \"arguments\": "
     "\"{\\\"code\\\": 3}\"}}]}}]}",
     0, "argument \"code\" is not a string"},
    {"{\"choices\": [{\"message\": {\"tool_calls\": [{\"id\": \"a\", "
     "\"function\": {\"name\": \"execute_code\", \"arguments\": "
     "\"{\\\"code\\\": \\\"a\\\\u0000b\\\"}\"}}]}}]}",
     0, "the code contains the character U+0000 (NUL)"},
    {"{\"choices\": [{\"message\": {\"content\": 5, \"tool_calls\": null}, "
     "\"finish_reason\": 3}], \"usage\": {\"prompt_tokens\": \"x\", "
     "\"completion_tokens\": -4}}",
     0, NULL},
    {"{\"choices\": [{\"message\": {\"content\": \"\\ud800\"}}]}", -1,
     "not valid JSON"},
};

START_TEST(parser_malformed_shapes)
{
        size_t i;
        char errstr[512];
        cq_llm_reply_t reply;

        cq_llm_reply_init(&reply);
        for (i = 0; i < CQ_ARRAY_SIZE(malformed); i++) {
                int rc;

                errstr[0] = '\0';
                rc = cq_llm_parse_reply(malformed[i].body,
                                        strlen(malformed[i].body), &reply,
                                        errstr, sizeof(errstr));
                ck_assert_msg(rc == malformed[i].rc, "case %zu: rc %d (%s)", i,
                              rc, errstr);
                if (rc == -1) {
                        ck_assert_msg(strstr(errstr, malformed[i].want) != NULL,
                                      "case %zu: \"%s\" lacks \"%s\"", i,
                                      errstr, malformed[i].want);
                        ck_assert_ptr_null(reply.message);
                        continue;
                }
                ck_assert_ptr_nonnull(reply.message);
                if (malformed[i].want) {
                        ck_assert_uint_eq(reply.ncalls, 1);
                        ck_assert_ptr_null(reply.calls[0].code);
                        ck_assert_msg(strstr(reply.calls[0].error,
                                             malformed[i].want) != NULL,
                                      "case %zu: \"%s\" lacks \"%s\"", i,
                                      reply.calls[0].error, malformed[i].want);
                } else {
                        /* Wrong types are ignored, not trusted. */
                        ck_assert_ptr_null(reply.content);
                        ck_assert_ptr_null(reply.finish_reason);
                        ck_assert_int_eq(reply.prompt_tokens, 0);
                        ck_assert_int_eq(reply.completion_tokens, 0);
                }
                cq_llm_reply_release(&reply);
        }
}
END_TEST

/* U+0000 is valid JSON: a reply holding it is taken, its text with
 * U+FFFD in its place (whole as a C string), and code holding it gets
 * an error the model can act on, in both providers' formats. */
START_TEST(parser_takes_nul_characters)
{
        static const char openai[] =
            "{\"choices\":[{\"message\":{\"role\":\"assistant\","
            "\"content\":\"a\\u0000b\",\"tool_calls\":[{\"id\":\"c1\","
            "\"type\":\"function\",\"function\":{\"name\":"
            "\"execute_code\",\"arguments\":"
            "\"{\\\"code\\\": \\\"x = 1\\\\u0000\\\"}\"}}]},"
            "\"finish_reason\":\"tool_calls\"}]}";
        static const char anthropic[] =
            "{\"type\":\"message\",\"role\":\"assistant\",\"content\":"
            "[{\"type\":\"text\",\"text\":\"a\\u0000b\"},"
            "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":"
            "\"execute_code\",\"input\":{\"code\":\"x = 1\\u0000\"}}],"
            "\"stop_reason\":\"tool_use\"}";
        const char *bodies[] = {openai, anthropic};
        cq_llm_provider_t providers[] = {CQ_LLM_OPENAI, CQ_LLM_ANTHROPIC};
        char errstr[512];
        size_t i;

        for (i = 0; i < 2; i++) {
                cq_llm_reply_t reply;

                cq_llm_reply_init(&reply);
                errstr[0] = '\0';
                ck_assert_msg(cq_llm_parse_reply_as(
                                  providers[i], bodies[i], strlen(bodies[i]),
                                  &reply, errstr, sizeof(errstr)) == 0,
                              "%zu: %s", i, errstr);
                ck_assert_str_eq(reply.content, "a\xef\xbf\xbd"
                                                "b");
                ck_assert_uint_eq(reply.ncalls, 1);
                ck_assert_ptr_null(reply.calls[0].code);
                ck_assert_msg(reply.calls[0].error &&
                                  strstr(reply.calls[0].error,
                                         "contains the character U+0000"),
                              "%zu: %s", i,
                              reply.calls[0].error ? reply.calls[0].error
                                                   : "(none)");
                ck_assert_ptr_null(strstr(reply.calls[0].error, "JSON"));
                cq_llm_reply_release(&reply);
        }
}
END_TEST

START_TEST(parser_huge_and_deep_input)
{
        size_t n = 4u * 1024 * 1024, depth = 100000, i;
        const char *head = "{\"choices\": [{\"message\": {\"content\": \"";
        const char *tail = "\"}}]}";
        char *body = malloc(strlen(head) + n + strlen(tail) + 1);
        char *deep = malloc(depth * 2 + 64);
        char errstr[256];
        cq_llm_reply_t reply;
        size_t off = 0;

        ck_assert_ptr_nonnull(body);
        ck_assert_ptr_nonnull(deep);
        memcpy(body, head, strlen(head));
        memset(body + strlen(head), 'y', n);
        memcpy(body + strlen(head) + n, tail, strlen(tail) + 1);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_parse_reply(body, strlen(body), &reply, errstr,
                                            sizeof(errstr)),
                         0);
        ck_assert_uint_eq(strlen(reply.content), n);
        cq_llm_reply_release(&reply);

        /* 100000 nested arrays inside the message: refused, not a crash. */
        off += (size_t)snprintf(deep, 64,
                                "{\"choices\": [{\"message\": "
                                "{\"content\": ");
        for (i = 0; i < depth; i++)
                deep[off++] = '[';
        for (i = 0; i < depth; i++)
                deep[off++] = ']';
        memcpy(deep + off, "}}]}", 5);
        off += 4;
        errstr[0] = '\0';
        ck_assert_int_eq(
            cq_llm_parse_reply(deep, off, &reply, errstr, sizeof(errstr)), -1);
        ck_assert_ptr_nonnull(strstr(errstr, "not valid JSON"));
        free(deep);
        free(body);
}
END_TEST

/* --- the Anthropic Messages API ------------------------------------- */

static const char *stop_name(cq_llm_stop_t stop)
{
        switch (stop) {
        case CQ_LLM_STOP_NONE:
                return "none";
        case CQ_LLM_STOP_END:
                return "end";
        case CQ_LLM_STOP_TOOL_USE:
                return "tool_use";
        case CQ_LLM_STOP_MAX_TOKENS:
                return "max_tokens";
        case CQ_LLM_STOP_REFUSAL:
                return "refusal";
        case CQ_LLM_STOP_OTHER:
                return "other";
        }
        return "?";
}

START_TEST(anthropic_golden_replies)
{
        const char *dir = cq_check_srcpath("tests/data/llm/anthropic_replies");
        char base[4096];
        DIR *d;
        struct dirent *de;
        int cases = 0;

        snprintf(base, sizeof(base), "%s", dir);
        d = opendir(base);
        ck_assert_ptr_nonnull(d);
        while ((de = readdir(d)) != NULL) {
                char path[8192];
                char *body;
                size_t len, cut;
                json_t *expected, *got;
                cq_llm_reply_t reply;
                char errstr[512] = "";
                const char *want_err;
                int rc;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(path, sizeof(path), "%s/%s/input.json", base,
                         de->d_name);
                body = cq_check_slurp(path, &len);
                snprintf(path, sizeof(path), "%s/%s/expected.json", base,
                         de->d_name);
                expected = json_load_file(path, 0, NULL);
                ck_assert_msg(expected != NULL, "bad %s", path);
                cq_llm_reply_init(&reply);
                rc = cq_llm_parse_reply_as(CQ_LLM_ANTHROPIC, body, len, &reply,
                                           errstr, sizeof(errstr));
                want_err = json_string_value(
                    json_object_get(expected, "error_contains"));
                if (want_err) {
                        ck_assert_msg(rc == -1, "%s: parsed", de->d_name);
                        ck_assert_msg(strstr(errstr, want_err) != NULL,
                                      "%s: error \"%s\" lacks \"%s\"",
                                      de->d_name, errstr, want_err);
                        ck_assert_ptr_null(reply.message);
                } else {
                        char *a, *b;

                        ck_assert_msg(rc == 0, "%s: %s", de->d_name, errstr);
                        got = summarize(&reply);
                        json_object_set_new(got, "stop",
                                            json_string(stop_name(reply.stop)));
                        json_object_set_new(
                            got, "cache_read_tokens",
                            json_integer(reply.cache_read_tokens));
                        json_object_set_new(
                            got, "cache_creation_tokens",
                            json_integer(reply.cache_creation_tokens));
                        json_object_set(got, "message", reply.message);
                        a = json_dumps(got, JSON_SORT_KEYS);
                        b = json_dumps(expected, JSON_SORT_KEYS);
                        ck_assert_msg(json_equal(got, expected),
                                      "%s:\n got %s\nwant %s", de->d_name, a,
                                      b);
                        free(a);
                        free(b);
                        json_decref(got);
                }
                cq_llm_reply_release(&reply);
                while (len && (body[len - 1] == '\n' || body[len - 1] == ' '))
                        len--;
                for (cut = 0; cut < len; cut++) {
                        errstr[0] = '\0';
                        ck_assert_int_eq(cq_llm_parse_reply_as(
                                             CQ_LLM_ANTHROPIC, body, cut,
                                             &reply, errstr, sizeof(errstr)),
                                         -1);
                        ck_assert_msg(errstr[0] != '\0', "no error at %zu",
                                      cut);
                        ck_assert_ptr_null(reply.message);
                }
                json_decref(expected);
                free(body);
                cases++;
        }
        closedir(d);
        ck_assert_int_ge(cases, 12);
}
END_TEST

/* Random mutations of a valid reply and hostile shapes: an error or a
 * reply, never a crash (ASan runs this too). */
START_TEST(anthropic_parser_mutations_and_huge_input)
{
        char *body, errstr[256];
        size_t len, i, big = (size_t)4 << 20;
        cq_llm_reply_t reply;
        int n;
        char *huge;
        static const char *const shapes[] = {
            "null",
            "[]",
            "{\"type\":\"message\",\"content\":null}",
            "{\"type\":\"message\",\"content\":[null]}",
            "{\"type\":\"message\",\"content\":[{\"type\":7}]}",
            "{\"type\":\"message\",\"content\":[{\"type\":\"tool_use\","
            "\"id\":\"\",\"name\":\"execute_code\",\"input\":{}}]}",
            "{\"type\":\"message\",\"content\":[{\"type\":\"tool_use\","
            "\"id\":\"t\",\"name\":5,\"input\":{}}]}",
            "{\"type\":\"message\",\"content\":[],\"stop_reason\":5,"
            "\"usage\":[]}",
            "{\"type\":\"message\",\"content\":[{\"type\":\"tool_use\","
            "\"id\":\"t\",\"name\":\"execute_code\",\"input\":{\"code\":7}}]}",
            "{\"type\":\"error\"}",
        };

        body = cq_check_slurp(
            cq_check_srcpath(
                "tests/data/llm/anthropic_replies/multi_tool_use/input.json"),
            &len);
        for (n = 0; n < 3000; n++) {
                char *m = malloc(len);

                memcpy(m, body, len);
                for (i = 0; i < 1 + fuzz_next() % 4; i++)
                        m[fuzz_next() % len] = (char)(fuzz_next() & 0xff);
                cq_llm_reply_init(&reply);
                if (cq_llm_parse_reply_as(CQ_LLM_ANTHROPIC, m, len, &reply,
                                          errstr, sizeof(errstr)) == 0)
                        ck_assert_ptr_nonnull(reply.message);
                else
                        ck_assert(errstr[0] != '\0');
                cq_llm_reply_release(&reply);
                free(m);
        }
        free(body);
        for (i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
                int rc;

                cq_llm_reply_init(&reply);
                errstr[0] = '\0';
                rc = cq_llm_parse_reply_as(CQ_LLM_ANTHROPIC, shapes[i],
                                           strlen(shapes[i]), &reply, errstr,
                                           sizeof(errstr));
                ck_assert_msg(rc == -1 || reply.message, "shape %zu", i);
                if (rc == -1)
                        ck_assert_msg(errstr[0], "shape %zu: no error", i);
                cq_llm_reply_release(&reply);
        }
        /* The bad-code shape keeps the call with an error for the model. */
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_parse_reply_as(CQ_LLM_ANTHROPIC, shapes[8],
                                               strlen(shapes[8]), &reply,
                                               errstr, sizeof(errstr)),
                         0);
        ck_assert_uint_eq(reply.ncalls, 1);
        ck_assert_str_eq(reply.calls[0].error,
                         "argument \"code\" is not a string");
        cq_llm_reply_release(&reply);
        /* A 4 MiB text block arrives whole. */
        huge = malloc(big + 128);
        len = (size_t)snprintf(huge, 128,
                               "{\"type\":\"message\",\"content\":[{\"type\":"
                               "\"text\",\"text\":\"");
        memset(huge + len, 'y', big);
        memcpy(huge + len + big, "\"}]}", 5);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_parse_reply_as(CQ_LLM_ANTHROPIC, huge,
                                               len + big + 4, &reply, errstr,
                                               sizeof(errstr)),
                         0);
        ck_assert_uint_eq(strlen(reply.content), big);
        cq_llm_reply_release(&reply);
        free(huge);
}
END_TEST

START_TEST(anthropic_request_golden)
{
        json_t *history, *expected, *got, *tools;
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        char *body, *a, *b;
        size_t len = 0;

        history = json_load_file(
            cq_check_srcpath("tests/data/llm/anthropic_request/input.json"), 0,
            NULL);
        expected = json_load_file(
            cq_check_srcpath("tests/data/llm/anthropic_request/expected.json"),
            0, NULL);
        ck_assert_ptr_nonnull(history);
        ck_assert_ptr_nonnull(expected);
        cq_llm_conf_init(&conf);
        conf.provider = CQ_LLM_ANTHROPIC;
        conf.model = "claude-sonnet-4-5";
        conf.max_tokens = 1024;
        llm = new_llm(&conf);
        body = cq_llm_request_body(llm, history, &len);
        ck_assert_ptr_nonnull(body);
        ck_assert_uint_eq(len, strlen(body));
        got = json_loads(body, 0, NULL);
        ck_assert_ptr_nonnull(got);
        tools = json_object_get(got, "tools");
        ck_assert_int_eq(json_array_size(tools), 1);
        ck_assert_str_eq(json_string_value(
                             json_object_get(json_array_get(tools, 0), "name")),
                         "execute_code");
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(json_array_get(tools, 0), "input_schema"),
                "type")),
            "object");
        json_object_set_new(got, "tools", json_string("(checked separately)"));
        a = json_dumps(got, JSON_SORT_KEYS | JSON_INDENT(1));
        b = json_dumps(expected, JSON_SORT_KEYS | JSON_INDENT(1));
        ck_assert_msg(json_equal(got, expected), "got %s\nwant %s", a, b);
        free(a);
        free(b);
        free(body);
        /* Without max_tokens configured the required field still goes. */
        cq_llm_destroy(&llm);
        conf.max_tokens = 0;
        llm = new_llm(&conf);
        body = cq_llm_request_body(llm, history, &len);
        json_decref(got);
        got = json_loads(body, 0, NULL);
        ck_assert_int_eq(json_integer_value(json_object_get(got, "max_tokens")),
                         8192);
        /* The OpenAI format of the same handle sends the history as is. */
        ck_assert_int_eq(cq_llm_set_provider(llm, "openai"), 0);
        free(body);
        body = cq_llm_request_body(llm, history, &len);
        json_decref(got);
        got = json_loads(body, 0, NULL);
        ck_assert(json_equal(json_object_get(got, "messages"), history));
        ck_assert_int_eq(cq_llm_set_provider(llm, "gemini"), -1);
        ck_assert_int_eq(cq_llm_provider(llm), CQ_LLM_OPENAI);
        ck_assert_int_eq(cq_llm_set_provider(llm, NULL), 0);
        ck_assert_int_eq(cq_llm_provider(llm), CQ_LLM_ANTHROPIC);
        free(body);
        json_decref(got);
        json_decref(expected);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

static cq_llm_t *anthropic_llm(const char *model)
{
        cq_llm_conf_t conf;

        test_conf(&conf, model);
        conf.provider = CQ_LLM_ANTHROPIC;
        conf.api_key = "sk-openai-not-this-one";
        conf.anthropic_api_key = TEST_KEY;
        return new_llm(&conf);
}

/* Two tool calls in one reply, answered as tool_result blocks in one user
 * message, then the final answer; the fake validates every request as the
 * Messages API would. */
START_TEST(anthropic_round_trip_against_the_fake)
{
        cq_llm_t *llm = anthropic_llm("script:two_calls");
        json_t *history = start_history(), *reqs, *req, *msgs, *last;
        cq_llm_reply_t reply;
        int64_t p = 0, c = 0, cr = 0, cc = 0;
        size_t i;

        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 2);
        ck_assert_int_eq(reply.stop, CQ_LLM_STOP_TOOL_USE);
        ck_assert_str_eq(reply.finish_reason, "tool_use");
        ck_assert_ptr_nonnull(reply.calls[0].code);
        ck_assert_ptr_nonnull(reply.calls[1].code);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_array_get(json_object_get(reply.message, "tool_calls"), 1),
                "id")),
            reply.calls[1].id);
        append_turn(history, &reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_uint_eq(reply.ncalls, 0);
        ck_assert_int_eq(reply.stop, CQ_LLM_STOP_END);
        ck_assert_ptr_nonnull(reply.content);
        cq_llm_usage(llm, &p, &c);
        cq_llm_usage_cache(llm, &cr, &cc);
        ck_assert_int_gt(p, 0);
        ck_assert_int_gt(c, 0);
        ck_assert_int_eq(cr, 0);
        ck_assert_int_eq(cc, 0);
        reqs = cq_fake_llm_requests(fake);
        ck_assert_int_eq(json_array_size(reqs), 2);
        json_array_foreach(reqs, i, req)
        {
                ck_assert_msg(json_is_true(json_object_get(req, "valid")),
                              "request %zu: %s", i,
                              json_string_value(json_object_get(req, "error")));
                ck_assert_str_eq(
                    json_string_value(json_object_get(req, "path")),
                    "/v1/messages");
                ck_assert_str_eq(
                    json_string_value(json_object_get(req, "x_api_key")),
                    TEST_KEY);
                ck_assert_str_eq(json_string_value(
                                     json_object_get(req, "anthropic_version")),
                                 "2023-06-01");
                ck_assert(json_is_null(json_object_get(req, "authorization")));
        }
        req = json_object_get(json_array_get(reqs, 1), "body");
        ck_assert_str_eq(json_string_value(json_object_get(req, "system")),
                         "You are a careful data analyst.");
        msgs = json_object_get(req, "messages");
        ck_assert_int_eq(json_array_size(msgs), 3);
        last = json_object_get(json_array_get(msgs, 2), "content");
        ck_assert_int_eq(json_array_size(last), 2);
        ck_assert_str_eq(
            json_string_value(json_object_get(json_array_get(last, 0), "type")),
            "tool_result");
        ck_assert_str_eq(
            json_string_value(
                json_object_get(json_array_get(last, 1), "tool_use_id")),
            json_string_value(json_object_get(
                json_array_get(
                    json_object_get(json_array_get(history, 2), "tool_calls"),
                    1),
                "id")));
        json_decref(reqs);
        cq_llm_reply_release(&reply);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

/* 529 overloaded and 429 with retry-after are retried; usage with cache
 * tokens adds up; 401 fails at once with the provider's words. */
START_TEST(anthropic_overloaded_rate_limited_and_fatal)
{
        json_t *script = json_pack(
            "{s:[{s:s, s:[{s:s, s:i, s:s}, {s:s, s:i, s:s}], s:{s:i, s:i, "
            "s:i, s:i}}]}",
            "steps", "content", "done", "faults", "kind", "http", "status", 529,
            "message", "Overloaded", "kind", "http", "status", 429,
            "retry_after", "0", "anthropic_usage", "input_tokens", 10,
            "output_tokens", 5, "cache_read_input_tokens", 300,
            "cache_creation_input_tokens", 20);
        json_t *bad = json_pack("{s:[{s:s, s:[{s:s, s:i, s:s}]}]}", "steps",
                                "content", "x", "faults", "kind", "http",
                                "status", 401, "message", "invalid x-api-key");
        cq_llm_t *llm;
        json_t *history = start_history();
        cq_llm_reply_t reply;
        int64_t p = 0, c = 0, cr = 0, cc = 0;

        ck_assert_int_eq(cq_fake_llm_add_script(fake, "busy", script), 0);
        ck_assert_int_eq(cq_fake_llm_add_script(fake, "denied", bad), 0);
        llm = anthropic_llm("script:busy");
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_OK);
        ck_assert_int_eq(reply.attempts, 3);
        ck_assert_str_eq(reply.content, "done");
        cq_llm_usage(llm, &p, &c);
        cq_llm_usage_cache(llm, &cr, &cc);
        ck_assert_int_eq(p, 330);
        ck_assert_int_eq(c, 5);
        ck_assert_int_eq(cr, 300);
        ck_assert_int_eq(cc, 20);
        ck_assert_int_eq(cq_llm_set_model(llm, "script:denied"), 0);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_FATAL);
        ck_assert_int_eq(reply.attempts, 1);
        ck_assert_msg(strstr(cq_llm_errmsg(llm),
                             "HTTP 401: authentication_error: invalid "
                             "x-api-key") != NULL,
                      "%s", cq_llm_errmsg(llm));
        ck_assert_ptr_null(strstr(cq_llm_errmsg(llm), TEST_KEY));
        json_decref(script);
        json_decref(bad);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

/* --- the shared rate limiter ---------------------------------------- */

START_TEST(limiter_cuts_pauses_grows_and_caps)
{
        cq_llm_limiter_t *lim = cq_llm_limiter_new(0);
        const char *key = "anthropic:m";
        int64_t now, need = 0, cuts = -1;
        double r0, r1;
        atomic_int cancel = 0;
        int i;

        ck_assert_ptr_nonnull(lim);
        /* Unlimited until a 429. */
        now = cq_now_ms();
        for (i = 0; i < 50; i++) {
                ck_assert_int_eq(
                    llm_limiter_acquire(lim, key, now, NULL, &need), 0);
                llm_limiter_report(lim, key, cq_now_ms(), LLM_OUTCOME_OK, -1);
        }
        ck_assert(cq_llm_limiter_rate(lim, key) == 0);
        /* A 429 with Retry-After: 5 s holds every slot of the model ... */
        llm_limiter_report(lim, key, cq_now_ms(), LLM_OUTCOME_LIMITED, 5000);
        r0 = cq_llm_limiter_rate(lim, key);
        ck_assert(r0 >= 1.0);
        now = cq_now_ms();
        ck_assert_int_eq(llm_limiter_acquire(lim, key, now + 100, NULL, &need),
                         1);
        ck_assert_int_gt(need, 4000);
        /* ... but not another model's. */
        ck_assert_int_eq(
            llm_limiter_acquire(lim, "anthropic:other", now, NULL, &need), 0);
        /* A raised cancel flag ends the wait. */
        atomic_store(&cancel, 1);
        ck_assert_int_eq(
            llm_limiter_acquire(lim, key, now + 60000, &cancel, &need), -1);
        /* Replies to requests sent before the cut do not cut again. */
        llm_limiter_report(lim, key, now - 1000, LLM_OUTCOME_LIMITED, -1);
        ck_assert(cq_llm_limiter_rate(lim, key) == r0);
        cq_llm_limiter_stats(lim, &cuts, NULL);
        ck_assert_int_eq(cuts, 1);
        /* Successes grow it. */
        for (i = 0; i < 100; i++)
                llm_limiter_report(lim, key, cq_now_ms(), LLM_OUTCOME_OK, -1);
        r1 = cq_llm_limiter_rate(lim, key);
        ck_assert(r1 > r0);
        /* A later 429 cuts it below what it was. */
        llm_limiter_report(lim, key, cq_now_ms() + 1, LLM_OUTCOME_LIMITED, -1);
        ck_assert(cq_llm_limiter_rate(lim, key) < r1);
        cq_llm_limiter_destroy(&lim);
        ck_assert_ptr_null(lim);

        /* The ceiling is the rate from the start and is never passed. */
        lim = cq_llm_limiter_new(20);
        now = cq_now_ms();
        ck_assert_int_eq(llm_limiter_acquire(lim, key, now, NULL, &need), 0);
        ck_assert(cq_llm_limiter_rate(lim, key) == 20);
        /* The bucket holds one request at 20/s: the next must wait. */
        ck_assert_int_eq(llm_limiter_acquire(lim, key, now, NULL, &need), 1);
        ck_assert_int_gt(need, 0);
        for (i = 0; i < 1000; i++)
                llm_limiter_report(lim, key, cq_now_ms(), LLM_OUTCOME_OK, -1);
        ck_assert(cq_llm_limiter_rate(lim, key) == 20);
        cq_llm_limiter_destroy(&lim);
}
END_TEST

/* Slots of one model share the limiter: after the fake's 429 with
 * Retry-After, a second client waits instead of sending, and a wait
 * beyond the call's budget fails the call without a request. */
START_TEST(limiter_shared_by_clients_against_the_fake)
{
        cq_llm_limiter_t *lim = cq_llm_limiter_new(0);
        json_t *script = json_pack("{s:[{s:s, s:[{s:s, s:i, s:s}]}]}", "steps",
                                   "content", "ok", "faults", "kind", "http",
                                   "status", 429, "retry_after", "30");
        cq_llm_conf_t conf;
        cq_llm_t *a, *b;
        json_t *history = start_history(), *reqs;
        cq_llm_reply_t reply;

        ck_assert_int_eq(cq_fake_llm_add_script(fake, "limited", script), 0);
        test_conf(&conf, "script:limited");
        conf.limiter = lim;
        conf.max_attempts = 1;
        a = new_llm(&conf);
        conf.max_wait_s = 5;
        conf.max_attempts = 3;
        b = new_llm(&conf);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(a, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert(cq_llm_limiter_rate(lim, "openai:script:limited") >= 1.0);
        /* b would have to wait 30 s, beyond its 5 s budget. */
        ck_assert_int_eq(cq_llm_chat(b, history, &reply), CQ_ERR_RETRIABLE);
        ck_assert_msg(strstr(cq_llm_errmsg(b), "shared rate limit") != NULL,
                      "%s", cq_llm_errmsg(b));
        reqs = cq_fake_llm_requests(fake);
        ck_assert_int_eq(json_array_size(reqs), 1);
        json_decref(reqs);
        json_decref(script);
        json_decref(history);
        cq_llm_destroy(&a);
        cq_llm_destroy(&b);
        cq_llm_limiter_destroy(&lim);
}
END_TEST

/* A job's sampling parameters in the body of either format; a seed the
 * Messages API cannot take is refused, not dropped; the configuration
 * comes back after a reset. */
START_TEST(sampling_in_request_bodies)
{
        cq_llm_conf_t conf;
        cq_llm_t *llm;
        cq_llm_reply_t reply;
        json_t *history = start_history(), *body, *sent;
        long long seed = 42;
        char *text;
        size_t len;

        cq_llm_conf_init(&conf);
        conf.base_url = "http://127.0.0.1:9/v1";
        conf.model = "m";
        conf.max_tokens = 512;
        conf.temperature = 0.2;
        llm = new_llm(&conf);
        ck_assert_int_eq(cq_llm_set_sampling(llm, 0.7, 0.9, &seed), 0);
        text = cq_llm_request_body(llm, history, &len);
        body = json_loads(text, 0, NULL);
        free(text);
        ck_assert_double_eq(
            json_real_value(json_object_get(body, "temperature")), 0.7);
        ck_assert_double_eq(json_real_value(json_object_get(body, "top_p")),
                            0.9);
        ck_assert_int_eq(json_integer_value(json_object_get(body, "seed")), 42);
        json_decref(body);
        sent = cq_llm_sampling_json(llm);
        ck_assert_int_eq(json_integer_value(json_object_get(sent, "seed")), 42);
        ck_assert_int_eq(
            json_integer_value(json_object_get(sent, "max_tokens")), 512);
        json_decref(sent);
        /* not sent: the server's default */
        ck_assert_int_eq(cq_llm_set_sampling(llm, -1, -1, NULL), 0);
        text = cq_llm_request_body(llm, history, &len);
        body = json_loads(text, 0, NULL);
        free(text);
        ck_assert_ptr_null(json_object_get(body, "temperature"));
        ck_assert_ptr_null(json_object_get(body, "top_p"));
        ck_assert_ptr_null(json_object_get(body, "seed"));
        json_decref(body);
        /* the Messages API: temperature and top_p, never a seed */
        ck_assert_int_eq(cq_llm_set_provider(llm, "anthropic"), 0);
        ck_assert_int_eq(cq_llm_set_sampling(llm, 0.5, 0.8, &seed), -1);
        ck_assert_int_eq(cq_llm_set_sampling(llm, 0.5, 0.8, NULL), 0);
        text = cq_llm_request_body(llm, history, &len);
        body = json_loads(text, 0, NULL);
        free(text);
        ck_assert_double_eq(
            json_real_value(json_object_get(body, "temperature")), 0.5);
        ck_assert_double_eq(json_real_value(json_object_get(body, "top_p")),
                            0.8);
        ck_assert_ptr_null(json_object_get(body, "seed"));
        json_decref(body);
        /* a seed set for openai, then the provider changed: refused at
         * the call, before any request */
        ck_assert_int_eq(cq_llm_set_provider(llm, NULL), 0);
        ck_assert_int_eq(cq_llm_set_sampling(llm, -1, -1, &seed), 0);
        ck_assert_int_eq(cq_llm_set_provider(llm, "anthropic"), 0);
        cq_llm_reply_init(&reply);
        ck_assert_int_eq(cq_llm_chat(llm, history, &reply), CQ_ERR_FATAL);
        ck_assert_msg(strstr(cq_llm_errmsg(llm), "takes no seed"), "%s",
                      cq_llm_errmsg(llm));
        ck_assert_int_eq(reply.attempts, 0);
        cq_llm_reply_release(&reply);
        /* back to the configuration */
        ck_assert_int_eq(cq_llm_set_provider(llm, NULL), 0);
        cq_llm_reset_sampling(llm);
        sent = cq_llm_sampling_json(llm);
        ck_assert_double_eq(
            json_real_value(json_object_get(sent, "temperature")), 0.2);
        ck_assert(json_is_null(json_object_get(sent, "top_p")));
        ck_assert(json_is_null(json_object_get(sent, "seed")));
        json_decref(sent);
        json_decref(history);
        cq_llm_destroy(&llm);
}
END_TEST

static Suite *cq_llm_suite(void)
{
        Suite *s = suite_create("llm");
        TCase *tc = tcase_create("fake");
        TCase *pure = tcase_create("pure");

        tcase_add_checked_fixture(tc, fake_setup, fake_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, one_tool_call_then_final);
        tcase_add_test(tc, two_tool_calls_in_one_reply);
        tcase_add_test(tc, unanswered_tool_call_is_rejected_by_the_fake);
        tcase_add_test(tc, final_text_from_default_script);
        tcase_add_test(tc, model_override_selects_the_script);
        tcase_add_test(tc, reasoning_content_kept_verbatim);
        tcase_add_test(tc, rate_limit_honours_retry_after);
        tcase_add_test(tc, rate_limit_with_http_date);
        tcase_add_test(tc, retry_after_beyond_budget_gives_up);
        tcase_add_test(tc, server_error_then_success);
        tcase_add_test(tc, server_down_bounded_attempts);
        tcase_add_test(tc, unauthorized_fails_at_once_without_the_key);
        tcase_add_test(tc, key_never_in_logs);
        tcase_add_test(tc, invalid_replies_then_success);
        tcase_add_test(tc, invalid_replies_forever_fail_clearly);
        tcase_add_test(tc, dropped_connection_is_retried);
        tcase_add_test(tc, response_over_cap_is_fatal);
        tcase_add_test(tc, cancel_aborts_a_slow_reply);
        tcase_add_test(tc, deadline_ends_a_slow_reply);
        tcase_add_test(tc, provider_variations);
        tcase_add_test(tc, list_models_tries_the_key);
        tcase_add_test(tc, provider_none_calls_nothing);
        tcase_add_test(tc, connection_refused_is_retriable);
        tcase_add_test(tc, bad_arguments_fail_without_a_request);
        tcase_add_test(tc, timeout_is_retriable);
        tcase_add_test(tc, fake_rejects_invalid_histories);
        tcase_add_test(tc, fake_log_file_and_port_file);
        tcase_add_test(tc, messages_hide_url_credentials_and_stay_utf8);
        tcase_add_test(tc, anthropic_round_trip_against_the_fake);
        tcase_add_test(tc, anthropic_overloaded_rate_limited_and_fatal);
        tcase_add_test(tc, limiter_shared_by_clients_against_the_fake);
        suite_add_tcase(s, tc);

        tcase_set_timeout(pure, 120);
        tcase_add_test(pure, tools_json_shape);
        tcase_add_test(pure, sampling_in_request_bodies);
        tcase_add_test(pure, estimate_tokens_counts_code_and_reasoning);
        tcase_add_test(pure, settings_rows);
        tcase_add_test(pure, key_check_names_the_variables);
        tcase_add_test(pure, parser_golden_replies);
        tcase_add_test(pure, parser_random_bytes_and_mutations);
        tcase_add_test(pure, parser_malformed_shapes);
        tcase_add_test(pure, parser_huge_and_deep_input);
        tcase_add_test(pure, parser_takes_nul_characters);
        tcase_add_test(pure, anthropic_golden_replies);
        tcase_add_test(pure, anthropic_parser_mutations_and_huge_input);
        tcase_add_test(pure, anthropic_request_golden);
        tcase_add_test(pure, limiter_cuts_pauses_grows_and_caps);
        suite_add_tcase(s, pure);
        return s;
}

CQ_CHECK_MAIN(cq_llm_suite)
