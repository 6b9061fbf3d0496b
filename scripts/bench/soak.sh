#!/usr/bin/env bash
# soak.sh [JOBS] - JOBS (default 20000) one-cell jobs with the instant
# fake LLM through 2 workers (CQ_SOAK_SLOTS slots each, default 8) on the
# 3-broker cluster and one PostgreSQL, a worker killed with SIGKILL a
# third of the way in and a broker stopped for 10 s two thirds of the way
# in (CQ_SOAK_BROKER_RESTARTS=N: N times, evenly from a third to the end;
# bench/soak.py). Every worker's RSS and open descriptors are measured
# every CQ_SOAK_SAMPLE_S seconds (default 10; each the medians of 21 reads
# over 2 s) into soak.csv and plotted into soak.png (matplotlib, Debian's
# python3-matplotlib) in CQ_SOAK_OUT (default bench/results;
# CQ_KEEP_LOGS=1 keeps the workers' logs), and again at rest (nothing in
# flight) after 20% of the jobs, after 45% and at the end. Fails when a
# job is stuck or fails, or RSS drifts 5% or more after the warm-up, or
# descriptors at rest 5% or more from a worker's first rest to its last.
# Starts what is not running (and stops it again). Last line: JSON.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

jobs=${1:-20000}
[[ $jobs =~ ^[0-9]+$ ]] || cq_die "JOBS must be a number"
build=${CQ_BUILD:-$CQ_ROOT/build}
out=${CQ_SOAK_OUT:-$CQ_ROOT/bench/results}
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
        cq_die "matplotlib not found: apt-get install python3-matplotlib"
cq_bench_setup soak
mkdir -p "$out"
cq_bench_cluster
cq_bench_fake_llm soak_one '[{"tool_calls": [{"code": "x = 1"}]}, {"content": "1"}]'
cq_say "soak: $jobs jobs, 2 workers, a SIGKILL and a broker restart; output in $out"
/usr/bin/python3 "$CQ_ROOT/bench/soak.py" "$build/coderq" "$CQ_ROOT/scripts/services.sh" \
        "$CQ_BENCH_DSN" "$CQ_BENCH_BROKERS" "$CQ_BENCH_LLM_BASE" "$out" "$CQ_BENCH_TMP" "$jobs"
