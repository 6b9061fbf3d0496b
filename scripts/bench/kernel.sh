#!/usr/bin/env bash
# kernel.sh [CELLS] - coderq's kernel client vs jupyter_client (round trip
# of a trivial cell), pool acquire vs cold kernel start, and a kernel
# forked by the kernel server vs a cold start (time, CPU, PSS; in the
# sandbox when it works). Run through scripts/bench.sh kernel; the last
# line is JSON with the ratios.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

exec "$CQ_BUILD/bench/bench_kernel" "$CQ_ROOT/bench/kernel_anchor.py" "${1:-200}"
