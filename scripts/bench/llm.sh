#!/usr/bin/env bash
# llm.sh [CALLS] - the LLM client's own cost per call against the fake
# server (no latency), anchored on Python's http.client posting the very
# same request body to the same server over one keep-alive connection.
# Ratio < 1: the C client adds less than a minimal Python client.
#
# Then the rate-limit phase: a second fake enforces LLM_BENCH_RATE
# requests/s (default 50, burst of as many) and LLM_BENCH_THREADS clients
# (default 64, a worker's slots) call it for LLM_BENCH_SECONDS (default 30)
# through one shared limiter; the anchor is the same run without it (each
# call retries on its own, as before the limiter). rate_limited_ratio is
# the calls answered per second over the allowed rate (the burst counted
# as allowed), rate_limited_429_pct the share of requests answered 429.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

calls=${1:-300}
tmp=$(mktemp -d)
rate=${LLM_BENCH_RATE:-50}
threads=${LLM_BENCH_THREADS:-64}
seconds=${LLM_BENCH_SECONDS:-30}
rl_pid=
trap 'kill "$fake_pid" $rl_pid 2>/dev/null || true; wait "$fake_pid" $rl_pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
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
/usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" --rate-limit "$rate" \
        --no-record --port-file "$tmp/rl_port" >/dev/null &
rl_pid=$!
for _ in $(seq 100); do [ -s "$tmp/rl_port" ] && break; sleep 0.05; done
rl_port=$(cat "$tmp/rl_port")
fake_stats() {
        /usr/bin/python3 -c 'import sys, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:%s/_fake%s" % (sys.argv[1], sys.argv[2]),
      data=(b"" if sys.argv[2] == "/reset" else None)).read().decode())' "$rl_port" "$1"
}
rate_run() { # LIMITER(0|1): one phase, its stats appended
        fake_stats /reset >/dev/null
        # the bucket refills while idle: start each run with a full one
        sleep 1.1
        local run
        run=$("$CQ_BUILD/bench/bench_llm" rate "http://127.0.0.1:$rl_port/v1" \
                "$threads" "$seconds" "$1" 2>/dev/null)
        echo "$run $(fake_stats /stats)"
}
limited=$(rate_run 1)
echo "rate limit $rate/s, $threads threads, shared limiter: $limited"
unlimited=$(rate_run 0)
echo "rate limit $rate/s, $threads threads, anchor (no limiter): $unlimited"

/usr/bin/python3 - "$ours" "$anchor" "$rate" "$limited" "$unlimited" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rate = float(sys.argv[3])
def phase(text):
    run, stats = text.split("} {")
    run, stats = json.loads(run + "}"), json.loads("{" + stats)
    allowed = rate * run["seconds"] + rate
    return (round(run["calls_ok"] / allowed, 3),
            round(100.0 * stats["limited"] / max(1, stats["requests"]), 2))
lim, anc = phase(sys.argv[4]), phase(sys.argv[5])
print("rate limit: achieved/allowed %.3f with %.2f%% 429 (limiter) vs "
      "%.3f with %.2f%% 429 (anchor)" % (lim + anc), file=sys.stderr)
print(json.dumps({"bench": "llm",
                  "call_ms_mean": round(a["call_ms_mean"], 3),
                  "anchor_call_ms_mean": round(b["call_ms_mean"], 3),
                  "ratio_mean": round(a["call_ms_mean"] / b["call_ms_mean"], 3),
                  "ratio_p50": round(a["call_ms_p50"] / b["call_ms_p50"], 3),
                  "parse_us": a["parse_us"],
                  "request_bytes": b["request_bytes"],
                  "rate_limited_ratio": lim[0],
                  "rate_limited_429_pct": lim[1],
                  "anchor_rate_limited_ratio": anc[0],
                  "anchor_rate_limited_429_pct": anc[1]}))
PY
