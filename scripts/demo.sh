#!/usr/bin/env bash
# demo.sh - coderq end to end on this machine: install (setup.sh), start
# PostgreSQL and Kafka (services.sh), build (Release, build/), apply the
# migrations, start two workers, submit the batch of examples/jobs.jsonl
# through Kafka, follow it to the end, print the results table and export
# every job's notebook, images and answer.
#
# The LLM: with CODERQ_LLM_API_KEY or OPENAI_API_KEY set (and optionally
# CODERQ_LLM_BASE_URL, CODERQ_LLM_MODEL) that model is used. Without a key,
# the scripted demo model (examples/demo-model, served by the fake
# OpenAI-compatible server tests/fakes/fake_llm.py) answers, and the script
# says so: its replies include real first-attempt bugs that the reflection
# loop fixes; the code, kernels, tests and storage are all real.
#
# Options:
#   --stop     stop the services at the end (default: leave them running)
#   -h|--help  this text
set -euo pipefail
. "$(dirname "$0")/lib.sh"

stop=0
for arg in "$@"; do
        case $arg in
        --stop) stop=1 ;;
        -h | --help)
                sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
                exit 0
                ;;
        *)
                echo "usage: $0 [--stop]" >&2
                exit 2
                ;;
        esac
done

step() { printf '\n### %s\n' "$*"; }

run_id=demo-$(date +%Y%m%d-%H%M%S)
work=$CQ_RUN_DIR/demo/$run_id
out=$CQ_ROOT/out/$run_id
mkdir -p "$work" "$out"
pids=()
cleanup() {
        local pid
        for pid in "${pids[@]}"; do
                kill -TERM "$pid" 2>/dev/null || true
        done
        for pid in "${pids[@]}"; do
                wait "$pid" 2>/dev/null || true
        done
        if [ "$stop" -eq 1 ]; then
                cq_services stop
        fi
}
trap cleanup EXIT

step "1/8 setup: Debian packages and the Kafka $CQ_KAFKA_VERSION jars"
"$CQ_ROOT/scripts/setup.sh"

step "2/8 services: PostgreSQL and Kafka on loopback"
cq_services start
eval "$("$CQ_ROOT/scripts/services.sh" env)"
echo "CODERQ_PG_DSN=$CODERQ_PG_DSN"
echo "CODERQ_KAFKA_BROKERS=$CODERQ_KAFKA_BROKERS"

step "3/8 build: Release into build/"
cq_build "$CQ_ROOT/build" Release
coderq=$CQ_ROOT/build/coderq
"$coderq" --version

step "4/8 migrations"
"$coderq" migrate

step "5/8 the LLM"
if [ -n "${CODERQ_LLM_API_KEY:-}${OPENAI_API_KEY:-}" ]; then
        echo "using the configured model: ${CODERQ_LLM_MODEL:-gpt-4o-mini}" \
                "at ${CODERQ_LLM_BASE_URL:-https://api.openai.com/v1}"
else
        /usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" \
                --scripts "$CQ_ROOT/examples/demo-model" \
                --port-file "$work/llm.port" --log "$work/llm.jsonl" \
                >"$work/llm.out" 2>&1 &
        pids+=($!)
        for _ in $(seq 1 100); do
                [ -s "$work/llm.port" ] && break
                sleep 0.1
        done
        [ -s "$work/llm.port" ] || cq_die "the demo model did not start; see $work/llm.out"
        export CODERQ_LLM_BASE_URL="http://127.0.0.1:$(cat "$work/llm.port")/v1"
        export CODERQ_LLM_MODEL=demo
        unset CODERQ_LLM_API_KEY OPENAI_API_KEY
        echo "no API key set (CODERQ_LLM_API_KEY or OPENAI_API_KEY): using the"
        echo "SCRIPTED DEMO MODEL (examples/demo-model) at $CODERQ_LLM_BASE_URL."
        echo "Its replies are recorded; the code it writes really runs in kernels."
fi

step "6/8 two workers (2 slots each)"
export CODERQ_SLOTS=${CODERQ_SLOTS:-2} CODERQ_KPOOL_SIZE=${CODERQ_KPOOL_SIZE:-2}
for n in 1 2; do
        CODERQ_WORKER_ID=demo-worker-$n "$coderq" worker >"$work/worker-$n.log" 2>&1 &
        pids+=($!)
        echo "worker demo-worker-$n: pid $!, log $work/worker-$n.log"
done

step "7/8 submit examples/jobs.jsonl as run $run_id, and follow it"
# Job ids get the run id in front, so every demo run is a new batch.
/usr/bin/python3 - "$CQ_ROOT/examples/jobs.jsonl" "$run_id" >"$work/jobs.jsonl" <<'PY'
import json, sys
src, run = sys.argv[1], sys.argv[2]
for line in open(src, encoding="utf-8"):
    if not line.strip():
        continue
    job = json.loads(line)
    job["job_id"] = run + "-" + job["job_id"]
    if job.get("parent_job_id"):
        job["parent_job_id"] = run + "-" + job["parent_job_id"]
    job["run_id"] = run
    print(json.dumps(job, ensure_ascii=False))
PY
rc=0
"$coderq" submit "$work/jobs.jsonl" --wait --timeout 1800 >"$work/submitted.txt" || rc=$?
# stdout holds the job ids, then the summary table
grep -v "^$run_id-[A-Za-z0-9_-]*\$" "$work/submitted.txt" || true

step "8/8 results of run $run_id"
"$coderq" results --run "$run_id"
grep -x "$run_id-[A-Za-z0-9_-]*" "$work/submitted.txt" | while read -r job; do
        "$coderq" export "$job" --out "$out/$job" >/dev/null
done
cat <<EOF_DONE

Exported each job's notebook.ipynb, images/ and answer.md under
  $out/
Worker logs: $work/worker-*.log
Query the results with SQL: psql "$CODERQ_PG_DSN" (see
docs/JOBS.md#querying-results). The services are $([ "$stop" -eq 1 ] && echo "stopped now" || echo "still running: scripts/services.sh stop").
EOF_DONE
exit "$rc"
