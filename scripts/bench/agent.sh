#!/usr/bin/env bash
# agent.sh [JOBS] [TURNS] - the agent loop's own cost per turn. JOBS jobs
# of TURNS tool-call turns (each cell "pass") plus a final answer run
# through cq_agent_run() against the fake LLM (no latency) and one local
# kernel; the anchor, in the same run, is the same LLM requests (the very
# histories the loop sent) and the same cells without the loop. Overhead
# per turn = (loop - raw LLM - raw kernel) / LLM calls. Last line: JSON.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

jobs=${1:-40}
turns=${2:-8}
tmp=$(mktemp -d)
trap 'kill "$fake_pid" 2>/dev/null || true; wait "$fake_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
/usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" --port-file "$tmp/port" >/dev/null &
fake_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
port=$(cat "$tmp/port")

/usr/bin/python3 - "$port" "$turns" <<'PY'
import http.client, json, sys
port, turns = int(sys.argv[1]), int(sys.argv[2])
steps = [{"tool_calls": [{"code": "pass"}]} for _ in range(turns)]
steps.append({"content": "done"})
c = http.client.HTTPConnection("127.0.0.1", port)
c.request("POST", "/_fake/scripts", json.dumps({"name": "bench_agent", "steps": steps}),
          {"Content-Type": "application/json"})
r = c.getresponse()
body = r.read()
assert r.status == 200, body
PY
cq_say "agent loop: $jobs jobs x $turns cell turns + a final answer, fake LLM without latency, one local kernel"
"$CQ_BUILD/bench/bench_agent" "http://127.0.0.1:$port/v1" "script:bench_agent" "$jobs"
