#!/usr/bin/env bash
# llm.sh [CALLS] - the LLM client's own cost per call against the fake
# server (no latency), anchored on Python's http.client posting the very
# same request body to the same server over one keep-alive connection.
# Ratio < 1: the C client adds less than a minimal Python client.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

calls=${1:-300}
tmp=$(mktemp -d)
trap 'kill "$fake_pid" 2>/dev/null || true; wait "$fake_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
/usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" --port-file "$tmp/port" >/dev/null &
fake_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
port=$(cat "$tmp/port")
base="http://127.0.0.1:$port/v1"

ours=$("$CQ_BUILD/bench/bench_llm" "$base" "$calls" \
        "$CQ_ROOT/tests/data/llm/replies/openai_tool_call/input.json")
echo "coderq: $ours"

anchor=$(/usr/bin/python3 - "$port" "$calls" <<'PY'
import http.client, json, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
c.request("GET", "/_fake/requests")
body = json.dumps(json.loads(c.getresponse().read())[0]["body"]).encode()
hdr = {"Content-Type": "application/json", "Accept": "application/json"}
ts = []
for _ in range(n):
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, hdr)
    reply = json.loads(c.getresponse().read())
    reply["choices"][0]["message"]
    ts.append((time.perf_counter() - t0) * 1e3)
ts.sort()
print(json.dumps({"calls": n, "call_ms_mean": sum(ts) / n,
                  "call_ms_p50": ts[n // 2], "request_bytes": len(body)}))
PY
)
echo "anchor (python http.client): $anchor"
/usr/bin/python3 - "$ours" "$anchor" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"bench": "llm",
                  "call_ms_mean": round(a["call_ms_mean"], 3),
                  "anchor_call_ms_mean": round(b["call_ms_mean"], 3),
                  "ratio_mean": round(a["call_ms_mean"] / b["call_ms_mean"], 3),
                  "ratio_p50": round(a["call_ms_p50"] / b["call_ms_p50"], 3),
                  "parse_us": a["parse_us"],
                  "request_bytes": b["request_bytes"]}))
PY
