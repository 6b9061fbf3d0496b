#!/usr/bin/env bash
# upstream.sh [JOBS] - coderq against the upstream Python CoderAgent it
# replaces (MathModelAgent's backend), side by side on the same scripted
# fake LLM and the same small job (one cell, two LLM turns):
#   one)    one job per process: `coderq run` (sandboxed, its one kernel
#           started on demand) against bench/upstream_anchor.py (the
#           app's imports, LocalCodeInterpreter's kernel and pre-execute
#           cell, CoderAgent.run()); wall time, median of CQ_UP_REPS
#           (default 5) alternated runs: one_ratio = coderq / upstream.
#   batch)  JOBS (default 20) jobs in sequence: JOBS `coderq run`s against
#           one upstream process running them with a kernel each
#           (batch_ratio), and against upstream's own shape, the JOBS as
#           subtasks of one task sharing one kernel and one history
#           (shared_ratio; no isolation between the jobs at all).
# Upstream is not part of this repository: CQ_UPSTREAM_DIR names a
# checkout of github.com/jihe520/MathModelAgent (its backend/ is imported
# as is; Redis publishing, the web UI's stream, is replaced by a no-op).
# It needs Python 3.12 or later (CQ_UPSTREAM_PYTHON, default the first
# python3.13/python3.12 on PATH); its packages are installed from PyPI
# into a virtualenv under the cache (CODERQ_CACHE_DIR/upstream-venv).
# Without either the benchmark says why and ends with a JSON line whose
# "skipped" gives the reason (exit status 0: nothing was measured, nothing
# failed). Every run's answers are checked: a wrong answer fails it.
# Last line: JSON.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

build=${CQ_BUILD:-$CQ_ROOT/build}
jobs=${1:-20}
reps=${CQ_UP_REPS:-5}
case "$jobs$reps" in
''|*[!0-9]*) cq_die "JOBS and CQ_UP_REPS must be numbers" ;;
esac

skip() {
        cq_say "skipped: $1"
        printf '{"bench": "upstream", "skipped": "%s"}\n' "$1"
        exit 0
}

up=${CQ_UPSTREAM_DIR:-}
[ -n "$up" ] || skip "CQ_UPSTREAM_DIR is not set (a checkout of jihe520/MathModelAgent)"
[ -f "$up/backend/app/core/agents/coder_agent.py" ] ||
        skip "CQ_UPSTREAM_DIR=$up has no backend/app/core/agents/coder_agent.py"
py=${CQ_UPSTREAM_PYTHON:-}
if [ -z "$py" ]; then
        for c in python3.13 python3.12; do
                if command -v "$c" >/dev/null; then
                        py=$(command -v "$c")
                        break
                fi
        done
fi
[ -n "$py" ] || skip "no Python 3.12 or later (CQ_UPSTREAM_PYTHON) for upstream"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' ||
        skip "$py is older than Python 3.12, which upstream requires"

cache=${CODERQ_CACHE_DIR:-$CQ_ROOT/.cache}
venv=$cache/upstream-venv
# upstream's imports on the CoderAgent's path, and the kernel's own
pkgs=(openai anthropic loguru pydantic pydantic-settings redis requests
        jupyter_client ipykernel numpy pandas matplotlib nbformat icecream
        ansi2html aiofile httpx fastapi pypandoc-binary)
if [ ! -f "$venv/.ok" ]; then
        cq_say "installing upstream's packages into $venv"
        rm -rf "$venv"
        "$py" -m venv "$venv"
        "$venv/bin/pip" install -q "${pkgs[@]}"
        touch "$venv/.ok"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cqbench-upstream.XXXXXX")
llm_pid=
cleanup() {
        [ -n "$llm_pid" ] && kill "$llm_pid" 2>/dev/null && wait "$llm_pid" 2>/dev/null
        rm -rf "$tmp"
}
trap cleanup EXIT

# Matched by the task's text, so that every subtask of a shared-kernel run
# starts the script again (upstream keeps no final answer in its history).
mkdir -p "$tmp/model"
cat >"$tmp/model/small.json" <<'JSON'
{"match": "Compute 6*7 and print it.",
 "steps": [{"tool_calls": [{"code": "x = 6 * 7\nprint(x)"}]},
           {"content": "x is 42."}]}
JSON
/usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" --scripts "$tmp/model" \
        --port-file "$tmp/llm.port" --no-record >"$tmp/llm.out" 2>&1 &
llm_pid=$!
for _ in $(seq 1 100); do
        [ -s "$tmp/llm.port" ] && break
        sleep 0.1
done
[ -s "$tmp/llm.port" ] || cq_die "the fake LLM did not start; see $tmp/llm.out"
base=http://127.0.0.1:$(cat "$tmp/llm.port")/v1
model=bench-small
export CODERQ_LLM_BASE_URL=$base CODERQ_LLM_MODEL=$model
unset CODERQ_LLM_API_KEY OPENAI_API_KEY
printf '{"job_id": "small", "prompt": "Compute 6*7 and print it.", "title": "small", "model": "%s"}\n' \
        "$model" >"$tmp/job.json"

now() { date +%s.%N; }
# coderq_runs N: N sequential `coderq run`s; prints their wall seconds
coderq_runs() {
        local t0 i
        t0=$(now)
        for i in $(seq 1 "$1"); do
                rm -rf "$tmp/out"
                "$build/coderq" run "$tmp/job.json" --out "$tmp/out" >/dev/null 2>&1 ||
                        cq_die "coderq run failed; run it by hand: $build/coderq run $tmp/job.json --out $tmp/out"
                /usr/bin/python3 -c 'import json, sys
sys.exit(json.load(open(sys.argv[1])).get("answer") != "x is 42.")' \
                        "$tmp/out/result.json" ||
                        cq_die "coderq run gave another answer: $(cat "$tmp/out/result.json")"
        done
        awk -v a="$(now)" -v b="$t0" 'BEGIN {print a - b}'
}
# upstream_run ARGS: one upstream process; prints its wall seconds
upstream_run() {
        local t0 line
        rm -rf "$tmp/up"
        t0=$(now)
        # in $tmp: upstream's logger writes logs/ under the working directory
        line=$(cd "$tmp" && "$venv/bin/python" "$CQ_ROOT/bench/upstream_anchor.py" \
                "$up" "$base" "$model" "$tmp/up" "$@" 2>"$tmp/up.err" | tail -1)
        case "$line" in
        *'"answers_ok": true'*) ;;
        *) cq_die "upstream failed or answered wrong: $line $(tail -3 "$tmp/up.err")" ;;
        esac
        awk -v a="$(now)" -v b="$t0" 'BEGIN {print a - b}'
}
div() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

cq_say "warm-up: one run of each"
coderq_runs 1 >/dev/null
upstream_run >/dev/null
cq_say "one) one job per process, $reps alternated runs"
: >"$tmp/one.c"
: >"$tmp/one.u"
for _ in $(seq 1 "$reps"); do
        coderq_runs 1 >>"$tmp/one.c"
        upstream_run >>"$tmp/one.u"
done
one_c=$(median <"$tmp/one.c")
one_u=$(median <"$tmp/one.u")
printf 'one: coderq run %.3f s, upstream %.3f s (medians of %d)\n' "$one_c" "$one_u" "$reps"
cq_say "batch) $jobs jobs in sequence"
batch_c=$(coderq_runs "$jobs")
batch_u=$(upstream_run --jobs "$jobs")
shared_u=$(upstream_run --jobs "$jobs" --shared-kernel)
printf 'batch of %d: coderq run x %d %.2f s; upstream, a kernel per job %.2f s; upstream, one shared kernel %.2f s\n' \
        "$jobs" "$jobs" "$batch_c" "$batch_u" "$shared_u"
printf '{"bench": "upstream", "one_ratio": %.3f, "coderq_run_s": %.3f, "upstream_s": %.3f, "batch_jobs": %d, "batch_ratio": %.3f, "shared_ratio": %.3f, "coderq_batch_s": %.2f, "upstream_batch_s": %.2f, "upstream_shared_s": %.2f, "reps": %d}\n' \
        "$(div "$one_c" "$one_u")" "$one_c" "$one_u" "$jobs" \
        "$(div "$batch_c" "$batch_u")" "$(div "$batch_c" "$shared_u")" \
        "$batch_c" "$batch_u" "$shared_u" "$reps"
