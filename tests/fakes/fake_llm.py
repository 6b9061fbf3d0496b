#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""fake_llm.py - an LLM server for tests, demos and benchmarks speaking
OpenAI-compatible Chat Completions (POST .../chat/completions) and the
Anthropic Messages API (POST .../messages, e.g. /v1/messages) from the same
scripts. Python standard library only.

Usage:
  /usr/bin/python3 tests/fakes/fake_llm.py [--host 127.0.0.1] [--port 0]
      [--port-file FILE] [--scripts DIR] [--log FILE] [--latency-ms N]
      [--require-key KEY] [--allow-no-tools] [--rate-limit N]
      [--no-record] [--verbose]

Messages API: the body is validated as the Anthropic API does (model,
max_tokens, roles user/assistant starting with user, content blocks, each
tool_use answered by a tool_result in the next user message, tools with
input_schema); the step is counted the same way; the reply is the step in
Anthropic shape: text and tool_use blocks ("input" is the parsed
arguments), "stop_reason" (tool_use, end_turn, max_tokens for a
finish_reason "length"; a step's "stop_reason" is sent as given) and usage
{input_tokens, output_tokens, cache_read_input_tokens,
cache_creation_input_tokens} (a step's "anthropic_usage" replaces it).
Errors use {"type": "error", "error": {"type", "message"}}: 529 is
"overloaded_error", 429 "rate_limit_error". With --require-key the key is
expected in x-api-key and "anthropic-version" must be sent.

--rate-limit N: a token bucket of N requests per second (burst N) in
front of both APIs; a request beyond it gets 429 with Retry-After (whole
seconds, rounded up) and retry-after-ms (when a token frees). GET
/_fake/stats returns {"requests", "ok", "limited"} counted since start or
the last reset. --no-record keeps no request log (long benchmarks).

On start it prints "PORT <n>" as the first line on stdout (and writes the
number to --port-file, atomically, when given).

Scripts. The request's "model" selects a script: "script:<name>" names
DIR/<name>.json or one registered with POST /_fake/scripts
({"name": ..., "steps": [...]} or {"name": ..., "script": {...}}). With
any other model, a script of DIR whose "match" phrase is in a user
message of the conversation answers it, its step counted from the last
user message holding the phrase (the demo model, examples/demo-model,
works this way); failing that, the default script: a final text reply at
every turn. A script file is either a list of steps or {"steps": [...],
"deepseek_reasoning": bool, "match": phrase}.

The step is chosen statelessly: step i answers a request whose history
holds i assistant messages, so a resumed conversation continues at the
right step and a repeated turn is visible. A request beyond the last step
gets 400.

A step is a reply, optionally preceded by faults:
  {"tool_calls": [{"code": "..."}, ...]}     tool calls; ids are
      "call_<script>_<step>_<i>"; a call may give "arguments" (a raw
      string, sent as is), "arguments_object" (sent as a JSON object),
      "name" or "id" instead
  {"content": "final text"}                  a final answer
  common keys: "content" (also beside tool calls), "reasoning_content",
      "finish_reason", "usage" ({prompt_tokens, completion_tokens} or null
      to omit usage), "message_extra" / "reply_extra" (merged into the
      message / the reply), "delay_ms" (a slow reply), "content_size" (a
      content of N 'x' bytes)
  "faults": [{"kind": K, "times": n, ...}, ...]   served in order before
      the reply; "times" defaults to 1, -1 means forever. The counter is
      per script and step (stateful; POST /_fake/reset clears it). Kinds:
        "http": "status" (429, 500, 401, 400, ...), "message",
                "retry_after" (sent verbatim as Retry-After; "date+N"
                sends the HTTP-date N seconds ahead), "type",
                "code", "echo_auth" (append the Authorization header to
                the message, as careless providers do), "raw_body_hex"
                (send these bytes as a text/html body instead)
        "slow": "delay_ms" then the normal reply
        "truncated": the reply's JSON cut in half (valid HTTP)
        "invalid_json": a 200 whose body is not JSON
        "no_choices": a 200 without choices
        "disconnect": headers promise more bytes than are sent

Every request is validated as a Chat Completions body (model, message
roles, each assistant tool call answered by a tool message with its id
before the next non-tool message, tools schema present); an invalid one
gets 400 with the reason. Every request is recorded: GET /_fake/requests
returns them as a JSON array (--log FILE appends JSONL). GET /_fake/health
answers {"ok": true}.

GET .../models (/v1/models) lists one model, "demo", in the shape of the
API the request speaks (the Messages API's when it sends
anthropic-version); with --require-key another key, or none, gets 401.
It is recorded as a chat request is, with "method": "GET".
"""

import argparse
import email.utils
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLES = {"system", "developer", "user", "assistant", "tool"}
DEFAULT_SCRIPT = {
    "steps": [{"content": "This is the fake LLM's final answer."}]
}


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.requests = []
        self.scripts = {}
        self.fault_counts = {}
        self.log = open(args.log, "a", encoding="utf-8") if args.log else None
        self.stats = {"requests": 0, "ok": 0, "limited": 0}
        self.bucket = float(args.rate_limit or 0)
        self.bucket_ts = time.monotonic()

    def take_token(self):
        """Rate-limit mode: None when the request may pass, else the
        seconds until a token frees."""
        rate = self.args.rate_limit
        with self.lock:
            self.stats["requests"] += 1
            if not rate:
                return None
            now = time.monotonic()
            self.bucket = min(float(rate),
                              self.bucket + (now - self.bucket_ts) * rate)
            self.bucket_ts = now
            if self.bucket >= 1.0:
                self.bucket -= 1.0
                return None
            self.stats["limited"] += 1
            return (1.0 - self.bucket) / rate

    def script(self, name):
        with self.lock:
            if name in self.scripts:
                return self.scripts[name]
        if self.args.scripts and "/" not in name and not name.startswith("."):
            path = os.path.join(self.args.scripts, name + ".json")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    return normalise_script(json.load(f))
        return None

    def match(self, messages):
        """The "match" script for a conversation: a script whose "match"
        phrase is in a user message, with the step counted from the last
        such message (so a session's earlier turns do not count). Returns
        (name, script, step) or None."""
        if not self.args.scripts or not os.path.isdir(self.args.scripts):
            return None
        best = None
        for fn in sorted(os.listdir(self.args.scripts)):
            if not fn.endswith(".json"):
                continue
            script = self.script(fn[:-5])
            phrase = script.get("match") if script else None
            if not phrase:
                continue
            for i, m in enumerate(messages):
                if isinstance(m, dict) and m.get("role") == "user" and \
                        isinstance(m.get("content"), str) and \
                        phrase in m["content"] and \
                        (best is None or i > best[2]):
                    best = (fn[:-5], script, i)
        if best is None:
            return None
        name, script, at = best
        return name, script, count_assistant(messages[at + 1:])

    def record(self, entry):
        if entry.get("status") == 200:
            with self.lock:
                self.stats["ok"] += 1
        if self.args.no_record:
            return
        with self.lock:
            entry["seq"] = len(self.requests)
            self.requests.append(entry)
            if self.log:
                self.log.write(json.dumps(entry) + "\n")
                self.log.flush()

    def next_fault(self, key, faults):
        with self.lock:
            n = self.fault_counts.get(key, 0)
            self.fault_counts[key] = n + 1
        for fault in faults:
            times = fault.get("times", 1)
            if times < 0 or n < times:
                return fault
            n -= times
        return None


def normalise_script(obj):
    if isinstance(obj, list):
        obj = {"steps": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("steps"), list):
        raise ValueError("a script is a list of steps or {\"steps\": [...]}")
    for i, step in enumerate(obj["steps"]):
        if not isinstance(step, dict):
            raise ValueError("step %d is not an object" % i)
    return obj


def validate(body, allow_no_tools):
    """Return None for a valid Chat Completions body, else the reason."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "'model' must be a non-empty string"
    if body.get("stream"):
        return "streaming is not supported by this server"
    mt = body.get("max_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool)
                           or mt <= 0):
        return "'max_tokens' must be a positive integer"
    tools = body.get("tools")
    if tools is None:
        if not allow_no_tools:
            return "'tools' is missing"
    else:
        if not isinstance(tools, list) or not tools:
            return "'tools' must be a non-empty array"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                return "tools[%d].type must be 'function'" % i
            fn = tool.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                return "tools[%d].function.name is missing" % i
            params = fn.get("parameters")
            if not isinstance(params, dict) or params.get("type") != "object":
                return "tools[%d].function.parameters must be an object " \
                    "schema" % i
            req = params.get("required", [])
            props = params.get("properties", {})
            if not isinstance(props, dict) or not all(
                    r in props for r in req):
                return "tools[%d]: every required parameter needs a " \
                    "property" % i
    tc = body.get("tool_choice")
    if tc is not None and tc not in ("auto", "none", "required") and \
            not isinstance(tc, dict):
        return "'tool_choice' is invalid"
    if tc is not None and tools is None:
        return "'tool_choice' is only allowed when 'tools' are specified"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    pending = []  # tool_call ids still to be answered, in order
    for i, msg in enumerate(messages):
        where = "messages[%d]" % i
        if not isinstance(msg, dict):
            return where + " is not an object"
        role = msg.get("role")
        if role not in ROLES:
            return "%s.role %r is invalid" % (where, role)
        content = msg.get("content")
        if role == "tool":
            tid = msg.get("tool_call_id")
            if not isinstance(tid, str):
                return where + ".tool_call_id is missing"
            if tid not in pending:
                return "%s: tool message with tool_call_id %r answers no " \
                    "preceding tool call" % (where, tid)
            pending.remove(tid)
            if not isinstance(content, (str, list)):
                return where + ".content must be a string"
            continue
        if pending:
            return "an assistant message with 'tool_calls' must be " \
                "followed by tool messages responding to each " \
                "'tool_call_id'; %s (role %s) comes before the answer " \
                "to %s" % (where, role, ", ".join(pending))
        if role == "assistant":
            calls = msg.get("tool_calls")
            if content is not None and not isinstance(content, (str, list)):
                return where + ".content must be a string or null"
            if calls is not None:
                if not isinstance(calls, list):
                    return where + ".tool_calls must be an array"
                if not calls:
                    return "Invalid '%s.tool_calls': empty array. Expected " \
                        "an array with minimum length 1" % where
                for j, call in enumerate(calls):
                    cw = "%s.tool_calls[%d]" % (where, j)
                    if not isinstance(call, dict) or \
                            not isinstance(call.get("id"), str):
                        return cw + ".id is missing"
                    fn = call.get("function")
                    if not isinstance(fn, dict) or \
                            not isinstance(fn.get("name"), str):
                        return cw + ".function.name is missing"
                    if not isinstance(fn.get("arguments"), (str, dict)):
                        return cw + ".function.arguments is missing"
                    pending.append(call["id"])
            elif content is None:
                return where + ": an assistant message needs content or " \
                    "tool_calls"
        else:
            if not isinstance(content, (str, list)):
                return "%s.content must be a string (role %s)" % (where, role)
    if pending:
        return "an assistant message with 'tool_calls' must be followed " \
            "by tool messages responding to each 'tool_call_id'; " \
            "unanswered: " + ", ".join(pending)
    return None


def count_assistant(messages):
    return sum(1 for m in messages
               if isinstance(m, dict) and m.get("role") == "assistant")


def estimate_tokens(obj):
    return max(1, len(json.dumps(obj)) // 4)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: 64 slots connecting at
    # once overflow it, and each dropped SYN costs its client a 1 s
    # retransmission, which real providers do not charge.
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # Clients that give up (a cancel, a size cap) reset the connection;
        # that is their right, not a server error worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-llm/1"
    # Headers and body leave in separate writes; with Nagle on, a
    # keep-alive client waits for the delayed ACK (~40 ms) on every reply.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        if self.server.state.args.verbose:
            sys.stderr.write("fake_llm: " + (fmt % args) + "\n")

    # -- plumbing ------------------------------------------------------
    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def send_bytes(self, status, data, headers=None, ctype="application/json",
                   length=None):
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length",
                             str(len(data) if length is None else length))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except ConnectionError:
            self.close_connection = True

    def send_json(self, status, obj, headers=None):
        self.send_bytes(status, json.dumps(obj).encode(), headers)

    def send_error_json(self, status, message, etype="invalid_request_error",
                        code=None, headers=None):
        self.send_json(status, {"error": {"message": message, "type": etype,
                                          "param": None, "code": code}},
                       headers)

    def send_anthropic_error(self, status, message, etype=None,
                             headers=None):
        if etype is None:
            etype = {400: "invalid_request_error",
                     401: "authentication_error",
                     403: "permission_error", 404: "not_found_error",
                     413: "request_too_large", 429: "rate_limit_error",
                     529: "overloaded_error"}.get(status, "api_error")
        headers = dict(headers or {})
        headers["request-id"] = "req_fake_%d" % int(time.time() * 1000)
        self.send_json(status, {"type": "error",
                                "error": {"type": etype,
                                          "message": message}}, headers)

    def rate_limited(self, anthropic):
        wait = self.server.state.take_token()
        if wait is None:
            return False
        headers = {"Retry-After": str(max(1, int(wait + 0.999))),
                   "retry-after-ms": str(max(1, int(wait * 1000 + 0.999)))}
        if anthropic:
            self.send_anthropic_error(429, "fake: rate limit of %d requests "
                                      "per second exceeded"
                                      % self.server.state.args.rate_limit,
                                      headers=headers)
        else:
            self.send_error_json(429, "Rate limit reached: %d requests per "
                                 "second" % self.server.state.args.rate_limit,
                                 "requests", "rate_limit_exceeded", headers)
        return True

    # -- routes ----------------------------------------------------------
    def do_GET(self):
        state = self.server.state
        if self.path == "/_fake/health":
            self.send_json(200, {"ok": True})
        elif self.path == "/_fake/stats":
            with state.lock:
                data = json.dumps(state.stats).encode()
            self.send_bytes(200, data)
        elif self.path == "/_fake/requests":
            with state.lock:
                data = json.dumps(state.requests).encode()
            self.send_bytes(200, data)
        elif self.path.rstrip("/").endswith("/models"):
            self.models()
        else:
            self.send_error_json(404, "no route GET " + self.path)

    def key_ok(self, anthropic):
        """Whether the request carries the --require-key key (any request
        does without it): x-api-key for the Messages API, else a Bearer
        token."""
        want = self.server.state.args.require_key
        if want is None:
            return True
        if anthropic:
            return self.headers.get("x-api-key") == want
        return self.headers.get("Authorization") == "Bearer " + want

    def models(self):
        """GET .../models: the list of models, as both APIs give it; an
        anthropic-version header makes it the Messages API's (the key in
        x-api-key). With --require-key another key, or none, gets 401."""
        state = self.server.state
        anthropic = self.headers.get("anthropic-version") is not None
        entry = {"ts": time.time(), "path": self.path, "method": "GET",
                 "api": "anthropic" if anthropic else "openai",
                 "authorization": self.headers.get("Authorization"),
                 "x_api_key": self.headers.get("x-api-key"),
                 "anthropic_version": self.headers.get("anthropic-version")}
        if not self.key_ok(anthropic):
            entry.update(status=401)
            state.record(entry)
            if anthropic:
                self.send_anthropic_error(401, "invalid x-api-key")
            else:
                self.send_error_json(401, "Incorrect API key provided.",
                                     code="invalid_api_key")
            return
        entry.update(status=200)
        state.record(entry)
        if anthropic:
            self.send_json(200, {"data": [{"type": "model", "id": "demo",
                                           "display_name": "Demo",
                                           "created_at":
                                           "2026-01-01T00:00:00Z"}],
                                 "has_more": False, "first_id": "demo",
                                 "last_id": "demo"})
        else:
            self.send_json(200, {"object": "list",
                                 "data": [{"id": "demo", "object": "model",
                                           "created": 0,
                                           "owned_by": "coderq"}]})

    def do_DELETE(self):
        if self.path == "/_fake/requests":
            with self.server.state.lock:
                self.server.state.requests.clear()
            self.send_json(200, {"ok": True})
        else:
            self.send_error_json(404, "no route DELETE " + self.path)

    def do_POST(self):
        state = self.server.state
        raw = self.read_body()
        if self.path == "/_fake/scripts":
            try:
                obj = json.loads(raw)
                name = obj["name"]
                script = normalise_script(obj.get("script", obj.get("steps")))
            except (ValueError, KeyError, TypeError) as e:
                self.send_error_json(400, "bad script: %s" % e)
                return
            with state.lock:
                state.scripts[name] = script
                state.fault_counts = {k: v for k, v in
                                      state.fault_counts.items()
                                      if k[0] != name}
            self.send_json(200, {"ok": True, "name": name})
        elif self.path == "/_fake/reset":
            with state.lock:
                state.requests.clear()
                state.fault_counts.clear()
                state.stats = {"requests": 0, "ok": 0, "limited": 0}
            self.send_json(200, {"ok": True})
        elif self.path.rstrip("/").endswith("/chat/completions"):
            if self.rate_limited(False):
                return
            self.chat(raw)
        elif self.path.rstrip("/").endswith("/messages"):
            if self.rate_limited(True):
                return
            self.chat(raw, anthropic=True)
        else:
            self.send_error_json(404, "no route POST " + self.path)

    def chat(self, raw, anthropic=False):
        state = self.server.state
        entry = {"ts": time.time(), "path": self.path,
                 "api": "anthropic" if anthropic else "openai",
                 "authorization": self.headers.get("Authorization"),
                 "x_api_key": self.headers.get("x-api-key"),
                 "anthropic_version": self.headers.get("anthropic-version"),
                 "content_type": self.headers.get("Content-Type")}

        def fail(status, message, etype=None, code=None, headers=None):
            if anthropic:
                self.send_anthropic_error(status, message, etype, headers)
            else:
                self.send_error_json(status, message,
                                     etype or "invalid_request_error", code,
                                     headers)

        try:
            body = json.loads(raw)
        except ValueError as e:
            entry.update(body=raw.decode("utf-8", "replace"), valid=False,
                         error="body is not JSON: %s" % e, status=400)
            state.record(entry)
            fail(400, "We could not parse the JSON body of your request: %s"
                 % e)
            return
        entry["body"] = body
        if anthropic:
            err = validate_anthropic(body, state.args.allow_no_tools)
            if not err and not self.headers.get("anthropic-version"):
                err = "anthropic-version: header is required"
        else:
            err = validate(body, state.args.allow_no_tools)
        if err:
            entry.update(valid=False, error=err, status=400)
            state.record(entry)
            fail(400, err)
            return
        entry["valid"] = True
        if not self.key_ok(anthropic):
            entry.update(status=401)
            state.record(entry)
            fail(401, "invalid x-api-key" if anthropic
                 else "Incorrect API key provided.", code="invalid_api_key")
            return
        messages = to_openai_messages(body) if anthropic else body["messages"]
        model = body["model"]
        if model.startswith("script:"):
            name = model[len("script:"):]
            script = state.script(name)
            if script is None:
                entry.update(status=404)
                state.record(entry)
                fail(404, "The model `%s` does not exist" % model,
                     code="model_not_found")
                return
            step_no = count_assistant(messages)
        else:
            found = state.match(messages)
            if found:
                name, script, step_no = found
            else:
                name, script = "default", DEFAULT_SCRIPT
                step_no = count_assistant(messages)
        entry.update(script=name, step=step_no)
        steps = script["steps"]
        if script is DEFAULT_SCRIPT:
            step_no = 0  # any conversation gets the final text
            entry["step"] = 0
        if step_no >= len(steps):
            entry.update(status=400, error="script has no such step")
            state.record(entry)
            fail(400, "fake: script %r has %d steps but the history holds "
                 "%d assistant messages" % (name, len(steps), step_no))
            return
        if script.get("deepseek_reasoning") and not anthropic:
            err = check_reasoning_echo(steps, messages)
            if err:
                entry.update(status=400, error=err)
                state.record(entry)
                fail(400, err)
                return
        step = steps[step_no]
        fault = state.next_fault((name, step_no), step.get("faults", []))
        entry["fault"] = fault.get("kind") if fault else None
        if state.args.latency_ms:
            time.sleep(state.args.latency_ms / 1000.0)
        if fault and fault.get("kind") == "http":
            status = int(fault.get("status", 500))
            entry["status"] = status
            state.record(entry)
            headers = {}
            if "retry_after" in fault:
                ra = str(fault["retry_after"])
                if ra.startswith("date+"):
                    ra = email.utils.formatdate(
                        time.time() + float(ra[5:]), usegmt=True)
                headers["Retry-After"] = ra
            if "raw_body_hex" in fault:
                self.send_bytes(status, bytes.fromhex(fault["raw_body_hex"]),
                                headers, ctype="text/html")
                return
            msg = fault.get("message", "fake error %d" % status)
            if fault.get("echo_auth"):
                msg += " (you sent: %s)" % (
                    self.headers.get("x-api-key") if anthropic
                    else self.headers.get("Authorization"))
            if anthropic:
                self.send_anthropic_error(status, msg, fault.get("type"),
                                          headers)
            else:
                self.send_error_json(status, msg,
                                     fault.get("type", "fake_error"),
                                     fault.get("code"), headers)
            return
        delay = step.get("delay_ms", 0)
        if fault and fault.get("kind") == "slow":
            delay = fault.get("delay_ms", 2000)
        reply = build_reply(name, step_no, step, {"model": model,
                                                  "messages": messages})
        if anthropic:
            reply = to_anthropic_reply(reply, step)
        entry["status"] = 200
        state.record(entry)
        if delay:
            time.sleep(delay / 1000.0)
        data = json.dumps(reply).encode()
        kind = fault.get("kind") if fault else None
        if kind == "truncated":
            self.send_bytes(200, data[:len(data) // 2])
        elif kind == "invalid_json":
            self.send_bytes(200, b"<html>upstream proxy error</html> {")
        elif kind == "no_choices":
            if anthropic:
                self.send_json(200, {"id": reply["id"], "type": "message",
                                     "role": "assistant", "model": model})
            else:
                self.send_json(200, {"id": reply["id"],
                                     "object": "chat.completion",
                                     "model": model, "choices": []})
        elif kind == "disconnect":
            self.send_bytes(200, data[:len(data) // 2], length=len(data))
            self.close_connection = True
        else:
            self.send_bytes(200, data)


BLOCK_TYPES = {"text", "image", "document", "tool_use", "tool_result",
               "thinking", "redacted_thinking"}


def validate_anthropic(body, allow_no_tools):
    """Return None for a valid Messages API body, else the reason (the
    checks the real API makes that a client can get wrong)."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    for key in body:
        if key not in ("model", "max_tokens", "messages", "system", "tools",
                       "tool_choice", "temperature", "top_p", "top_k",
                       "stop_sequences", "stream", "metadata", "thinking",
                       "service_tier"):
            return "%s: Extra inputs are not permitted" % key
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    mt = body.get("max_tokens")
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        return "max_tokens: Field required (a positive integer)"
    if body.get("stream"):
        return "streaming is not supported by this server"
    system = body.get("system")
    if system is not None:
        if isinstance(system, list):
            for i, b in enumerate(system):
                if not isinstance(b, dict) or b.get("type") != "text" or \
                        not isinstance(b.get("text"), str):
                    return "system.%d: expected a text block" % i
        elif not isinstance(system, str):
            return "system: Input should be a valid string or list"
    tools = body.get("tools")
    if tools is None:
        if not allow_no_tools:
            return "'tools' is missing"
    else:
        if not isinstance(tools, list) or not tools:
            return "tools: must be a non-empty list"
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or \
                    not isinstance(tool.get("name"), str):
                return "tools.%d.name: Field required" % i
            if "type" in tool and tool["type"] != "custom":
                return "tools.%d.type: unknown tool type" % i
            schema = tool.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                return "tools.%d.input_schema: must be an object schema" % i
            if "function" in tool or "parameters" in tool:
                return "tools.%d: Extra inputs are not permitted" % i
    tc = body.get("tool_choice")
    if tc is not None:
        if not isinstance(tc, dict) or \
                tc.get("type") not in ("auto", "any", "tool", "none"):
            return "tool_choice: Input should be an object with type " \
                "auto, any, tool or none"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    pending = []
    for i, msg in enumerate(messages):
        where = "messages.%d" % i
        if not isinstance(msg, dict):
            return where + ": Input should be an object"
        role = msg.get("role")
        if role not in ("user", "assistant"):
            return "%s.role: Input should be 'user' or 'assistant'" % where
        if i == 0 and role != "user":
            return "messages: first message must use the \"user\" role"
        content = msg.get("content")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            blocks = content
        else:
            return where + ".content: Input should be a string or list"
        if not blocks:
            return "%s: all messages must have non-empty content except " \
                "for the optional final assistant message" % where
        answered = []
        for j, b in enumerate(blocks):
            bw = "%s.content.%d" % (where, j)
            if not isinstance(b, dict) or b.get("type") not in BLOCK_TYPES:
                return bw + ": unknown content block type"
            t = b["type"]
            if t == "text":
                if not isinstance(b.get("text"), str) or not b["text"]:
                    return bw + ": text content blocks must be non-empty"
            elif t == "tool_use":
                if role != "assistant":
                    return bw + ": tool_use blocks belong to the assistant"
                if not isinstance(b.get("id"), str) or \
                        not isinstance(b.get("name"), str):
                    return bw + ": tool_use needs id and name"
                if not isinstance(b.get("input"), dict):
                    return bw + ".input: Input should be a valid dictionary"
            elif t == "tool_result":
                if role != "user":
                    return bw + ": tool_result blocks belong to the user"
                if not isinstance(b.get("tool_use_id"), str):
                    return bw + ".tool_use_id: Field required"
                c = b.get("content")
                if c is not None and not isinstance(c, (str, list)):
                    return bw + ".content: Input should be a string or list"
                answered.append(b["tool_use_id"])
        if pending:
            missing = [t for t in pending if t not in answered]
            if role != "user" or missing:
                return "%s: tool_use ids were found without tool_result " \
                    "blocks immediately after: %s" % (
                        where, ", ".join(missing or pending))
            kinds = [b["type"] for b in blocks]
            first_other = next((k for k, t in enumerate(kinds)
                                if t != "tool_result"), len(kinds))
            if "tool_result" in kinds[first_other:]:
                return where + ": tool_result blocks must come first"
            pending = []
        elif answered:
            return "%s: unexpected tool_use_id found in tool_result " \
                "blocks: %s. Each tool_result block must have a " \
                "corresponding tool_use block in the previous message" % (
                    where, answered[0])
        if role == "assistant":
            pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
    if pending:
        return "tool_use ids were found without tool_result blocks " \
            "immediately after: " + ", ".join(pending)
    return None


def block_text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return ""


def to_openai_messages(body):
    """The conversation in Chat Completions roles, for script matching and
    step counting."""
    out = []
    if body.get("system"):
        out.append({"role": "system", "content": block_text(body["system"])})
    for m in body["messages"]:
        out.append({"role": m["role"], "content": block_text(m["content"])})
    return out


def to_anthropic_reply(reply, step):
    msg = reply["choices"][0]["message"]
    blocks = []
    if msg.get("content"):
        blocks.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls", []):
        args = call["function"]["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"_raw": args}
        if not isinstance(args, dict):
            args = {"_raw": args}
        blocks.append({"type": "tool_use", "id": call["id"].replace(
            "call_", "toolu_", 1), "name": call["function"]["name"],
            "input": args})
    finish = reply["choices"][0]["finish_reason"]
    stop = step.get("stop_reason", {"tool_calls": "tool_use",
                                    "length": "max_tokens",
                                    "stop": "end_turn"}.get(finish, finish))
    usage = reply.get("usage") or {}
    out = {"id": reply["id"].replace("chatcmpl-", "msg_", 1),
           "type": "message", "role": "assistant", "model": reply["model"],
           "content": blocks, "stop_reason": stop, "stop_sequence": None,
           "usage": step.get("anthropic_usage", {
               "input_tokens": usage.get("prompt_tokens", 0),
               "output_tokens": usage.get("completion_tokens", 0),
               "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})}
    return out


def check_reasoning_echo(steps, messages):
    """DeepSeek thinking mode: an assistant message that came with
    reasoning_content must be sent back with it (else HTTP 400)."""
    k = 0
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "assistant":
            want = steps[k].get("reasoning_content") if k < len(steps) \
                else None
            if want is not None and m.get("reasoning_content") != want:
                return ("The reasoning_content in the thinking mode must be "
                        "passed back to the API (messages[%d])" % i)
            k += 1
    return None


def build_reply(name, step_no, step, body):
    msg = {"role": "assistant", "content": step.get("content")}
    if "content_size" in step:
        msg["content"] = "x" * int(step["content_size"])
    if "reasoning_content" in step:
        msg["reasoning_content"] = step["reasoning_content"]
    calls = []
    for i, call in enumerate(step.get("tool_calls", [])):
        if "arguments_object" in call:
            args = call["arguments_object"]
        elif "arguments" in call:
            args = call["arguments"]
        else:
            args = json.dumps({"code": call.get("code", "")})
        calls.append({"id": call.get("id", "call_%s_%d_%d"
                                     % (name, step_no, i)),
                      "type": "function",
                      "function": {"name": call.get("name", "execute_code"),
                                   "arguments": args}})
    if calls:
        msg["tool_calls"] = calls
    msg.update(step.get("message_extra", {}))
    finish = step.get("finish_reason", "tool_calls" if calls else "stop")
    reply = {"id": "chatcmpl-fake-%s-%d" % (name, step_no),
             "object": "chat.completion", "created": int(time.time()),
             "model": body["model"], "system_fingerprint": "fp_fake",
             "choices": [{"index": 0, "message": msg, "logprobs": None,
                          "finish_reason": finish}]}
    if "usage" in step:
        usage = step["usage"]
    else:
        usage = {"prompt_tokens": estimate_tokens(body["messages"]),
                 "completion_tokens": estimate_tokens(msg)}
    if usage is not None:
        usage = dict(usage)
        usage["total_tokens"] = usage.get("prompt_tokens", 0) + \
            usage.get("completion_tokens", 0)
        reply["usage"] = usage
    reply.update(step.get("reply_extra", {}))
    return reply


def on_term(*_):
    raise KeyboardInterrupt


def main():
    # SIGTERM ends serve_forever the way Ctrl-C does.
    signal.signal(signal.SIGTERM, on_term)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--scripts", help="directory of <name>.json scripts")
    ap.add_argument("--log", help="append every request as JSONL")
    ap.add_argument("--latency-ms", type=int, default=0)
    ap.add_argument("--require-key", help="answer 401 to other keys")
    ap.add_argument("--allow-no-tools", action="store_true")
    ap.add_argument("--rate-limit", type=int, default=0,
                    help="requests per second before 429")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    server = Server((args.host, args.port), Handler)
    server.state = State(args)
    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.replace(tmp, args.port_file)
    sys.stdout.write("PORT %d\n" % port)
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
