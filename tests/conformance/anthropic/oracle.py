# SPDX-License-Identifier: MIT
"""oracle.py - the official Anthropic Python SDK against the fake LLM's
Messages API: if the SDK parses every reply and error, the fake speaks the
real shapes, and the requests it records are what a correct client sends.
Run by tests/check_llm_sdk.c with FAKE_BASE (http://127.0.0.1:PORT),
FAKE_KEY and TOOLS (the "tools" array the C client sends) in the
environment. Prints "OK" and exits 0 when every check holds."""

import json
import os
import sys

import anthropic


def check(cond, what):
    if not cond:
        sys.stderr.write("oracle: %s\n" % what)
        sys.exit(1)


def main():
    base, key = os.environ["FAKE_BASE"], os.environ["FAKE_KEY"]
    tools = json.loads(os.environ["TOOLS"])
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    system = "You are a careful data analyst."
    msgs = [{"role": "user",
             "content": [{"type": "text",
                          "text": "Compute 1 + 1 in Python."}]}]
    r = client.messages.create(model="script:two_calls", max_tokens=1024,
                               system=system, messages=msgs, tools=tools,
                               tool_choice={"type": "auto"})
    check(r.type == "message" and r.role == "assistant", "not a message")
    check(r.stop_reason == "tool_use", "stop_reason %r" % r.stop_reason)
    uses = [b for b in r.content if b.type == "tool_use"]
    texts = [b for b in r.content if b.type == "text"]
    check(len(uses) == 2, "%d tool_use blocks" % len(uses))
    check(uses[0].name == "execute_code", "tool name %r" % uses[0].name)
    check(uses[0].input == {"code": "x = 41 + 1"}, "input %r" % uses[0].input)
    check(texts and texts[0].text == "I will define x, then print it.",
          "text blocks %r" % texts)
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0,
          "usage %r" % r.usage)
    msgs.append({"role": "assistant",
                 "content": [b.model_dump(exclude_none=True)
                             for b in r.content]})
    msgs.append({"role": "user",
                 "content": [{"type": "tool_result", "tool_use_id": u.id,
                              "content": "ok"} for u in uses]})
    r = client.messages.create(model="script:two_calls", max_tokens=1024,
                               system=system, messages=msgs, tools=tools,
                               tool_choice={"type": "auto"})
    check(r.stop_reason == "end_turn", "stop_reason %r" % r.stop_reason)
    check(r.content[0].type == "text" and r.content[0].text == "x is 42.",
          "final %r" % r.content)

    # Errors: the SDK maps them from the status and reads the error body.
    for model, status, etype, cls in (
            ("script:sdk_overloaded", 529, "overloaded_error",
             anthropic.APIStatusError),
            ("script:sdk_limited", 429, "rate_limit_error",
             anthropic.RateLimitError),
            ("script:sdk_denied", 401, "authentication_error",
             anthropic.AuthenticationError)):
        try:
            client.messages.create(model=model, max_tokens=16,
                                   messages=msgs[:1], tools=tools)
            check(False, "%s: no error" % model)
        except cls as e:
            check(e.status_code == status, "%s: status %r" % (model,
                                                             e.status_code))
            check(isinstance(e.body, dict) and
                  e.body.get("error", {}).get("type") == etype,
                  "%s: body %r" % (model, e.body))
    # The SDK's own retry honours the fake's retry-after on 529.
    retrying = anthropic.Anthropic(base_url=base, api_key=key, max_retries=2)
    r = retrying.messages.create(model="script:sdk_overloaded_once",
                                 max_tokens=16, messages=msgs[:1],
                                 tools=tools)
    check(r.content[0].text == "recovered", "after 529: %r" % r.content)
    print("OK")


if __name__ == "__main__":
    main()
