#!/usr/bin/env bash
# e2e.sh - the worker daemon end to end through real Kafka and PostgreSQL
# with the fake LLM (bench_e2e drives `coderq worker` processes on topics
# and a database of their own):
#   a)    instant LLM, 2-cell jobs: 40 jobs at once to a 4-slot worker;
#         jobs/s and p50/p95 submit -> completion-event latency
#   idle) a worker with 0 slots: the RSS baseline
#   b)    1 s LLM latency, 4-turn jobs (3 cells + the answer), 16 slots
#         (48 jobs) and 64 slots (64 jobs) in one worker: throughput as a
#         fraction of the ideal slots / (4 x 1 s), and worker RSS per slot
#         ((peak - idle) / slots; kernels are separate processes).
#   s)    sustained: 300 (CQ_E2E_SUSTAINED_JOBS) 2-cell jobs, instant
#         LLM, 8 slots, a pool of 4 and the kernel server on
#         (CODERQ_KERNEL_SERVER=on), so kernel starts are on the critical
#         path once the pool is drained: sustained_jobs_per_s.
# Every phase also reports CPU per job by process tree (worker, kernels
# with the kernel server, PostgreSQL, broker, fake LLM; utime + stime from
# /proc over first submit .. last completion event, sandboxed kernels
# sampled every 0.2 s) and the transactions committed per job in its
# database over the workers' lifetime (commits_per_job, start-up and this
# benchmark's own queries included); the JSON's figures of these are the
# sustained phase's.
# Also printed: where the time goes (mean intake, queue, run, relay; a
# run split into setup, LLM turns, cell turns, finish, from the checkpoint
# rows) and run efficiency = 4 x 1 s / a job's mean run time, i.e. what the
# slots reach once the fixed latency of the first intake and the last
# relay is left out.
# Kernel pools are filled before the jobs go in: a fresh kernel per job
# costs ~1 s of CPU here and the refill starts two at a time, so without
# it kernel starts would be all that is measured (their rate is printed).
# Also printed per phase b: its overhead, the wall time beyond the LLM
# latency its waves of jobs must wait (wall - jobs/slots x 4 x latency).
# First, CQ_E2E_WARMUP_JOBS (default 200; 0: none) jobs as in phase s that
# no figure counts: the broker's JIT compilation is a fresh broker's cost,
# not a job's.
# CQ_E2E_LATENCY_MS (default 1000) sets the LLM latency of phase b,
# CQ_E2E_PHASES (default "a idle b16 b64 s") which phases run (figures of
# phases left out are null in the JSON), CQ_E2E_WORKERS (default 2, at
# most 8) how many worker processes share each phase's slots and pool
# (and one outbox), and CQ_E2E_SANDBOX (default on, a worker's default)
# their CODERQ_SANDBOX.
# Also printed per phase: duplicate completion events (events beyond one
# per job on the results topic, read to its end once the outbox is all
# sent); duplicate_events in the JSON is their sum over the phases.
# Starts the services with services.sh when they are not running (and
# stops them again). Last line: JSON.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

build=${CQ_BUILD:-$CQ_ROOT/build}
fake_pid=
cq_bench_cleanup_more() {
        [ -n "$fake_pid" ] && { kill "$fake_pid" 2>/dev/null || true; wait "$fake_pid" 2>/dev/null || true; }
}
cq_bench_setup e2e
tmp=$CQ_BENCH_TMP
dsn=$CQ_BENCH_DSN

/usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" --port-file "$tmp/port" >/dev/null &
fake_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
port=$(cat "$tmp/port")
base="http://127.0.0.1:$port/v1"
latency=${CQ_E2E_LATENCY_MS:-1000}
phases=" ${CQ_E2E_PHASES:-a idle b16 b64 s} "
sjobs=${CQ_E2E_SUSTAINED_JOBS:-300}
case "$latency" in
''|*[!0-9]*) cq_die "CQ_E2E_LATENCY_MS must be a number of milliseconds" ;;
esac
case "$sjobs" in
''|*[!0-9]*) cq_die "CQ_E2E_SUSTAINED_JOBS must be a number of jobs" ;;
esac
for p in $phases; do
        case "$p" in
        a|idle|b16|b64|s) ;;
        *) cq_die "unknown phase in CQ_E2E_PHASES: $p (a, idle, b16, b64, s)" ;;
        esac
done
/usr/bin/python3 - "$port" "$latency" <<'PY'
import http.client, json, sys
port, d = int(sys.argv[1]), int(sys.argv[2])
cell = lambda code, delay=0: {"tool_calls": [{"code": code}], **({"delay_ms": delay} if delay else {})}
scripts = {
    "e2e_two": [cell("x = 6 * 7"), cell("print(x)"), {"content": "42"}],
    "e2e_slow4": [cell("a = 1", d), cell("b = a + 1", d),
                  cell("print(a + b)", d), {"content": "3", "delay_ms": d}],
}
c = http.client.HTTPConnection("127.0.0.1", port)
for name, steps in scripts.items():
    c.request("POST", "/_fake/scripts", json.dumps({"name": name, "steps": steps}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    assert r.status == 200, body
PY

export CQ_BENCH_LOGDIR=$tmp
# the roots of the process trees whose CPU bench_e2e accounts
listeners() { ss -ltnpH "( sport = :$1 )" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u | tr '\n' ' '; }
CQ_E2E_PIDS_POSTGRES=$(listeners "$CODERQ_PG_PORT")
CQ_E2E_PIDS_BROKER=$(listeners "$CODERQ_KAFKA_PORT")
CQ_E2E_PIDS_LLM=$fake_pid
[ -n "$CQ_E2E_PIDS_POSTGRES" ] || cq_die "no process listens on the PostgreSQL port $CODERQ_PG_PORT"
[ -n "$CQ_E2E_PIDS_BROKER" ] || cq_die "no process listens on the Kafka port $CODERQ_KAFKA_PORT"
export CQ_E2E_PIDS_POSTGRES CQ_E2E_PIDS_BROKER CQ_E2E_PIDS_LLM
phase() { # NAME SLOTS JOBS POOL SCRIPT TURNS LATENCY_MS
        "$build/bench/bench_e2e" "$build/coderq" "$base" "$dsn" "$CODERQ_KAFKA_BROKERS" "$@"
}
a=null idle=null b16=null b64=null s=null
# A broker just started spends seconds of CPU compiling itself (the JVM's
# JIT threads: 1.5 s of the 3 s a fresh broker used in one phase s), which
# a long-lived broker paid long ago: a batch of jobs the figures leave
# out goes first.
wjobs=${CQ_E2E_WARMUP_JOBS:-200}
[[ $wjobs =~ ^[0-9]+$ ]] || cq_die "CQ_E2E_WARMUP_JOBS must be a number of jobs"
if [ "$wjobs" -gt 0 ]; then
        cq_say "warm-up: $wjobs jobs as in phase s, left out of every figure"
        CODERQ_KERNEL_SERVER=on phase warm 8 "$wjobs" 4 e2e_two 3 0 >/dev/null
fi
if [[ $phases == *" a "* ]]; then
        cq_say "a) instant LLM, 2-cell jobs: 40 jobs, 4 slots"
        a=$(phase a 4 40 40 e2e_two 3 0); echo "$a"
fi
if [[ $phases == *" idle "* ]]; then
        cq_say "idle worker, 0 slots"
        idle=$(phase idle 0 0 0 e2e_two 3 0); echo "$idle"
fi
if [[ $phases == *" b16 "* ]]; then
        cq_say "b) ${latency} ms LLM latency, 4-turn jobs: 16 slots, 48 jobs"
        b16=$(phase b16 16 48 48 e2e_slow4 4 "$latency"); echo "$b16"
fi
if [[ $phases == *" b64 "* ]]; then
        cq_say "b) ${latency} ms LLM latency, 4-turn jobs: 64 slots, 64 jobs"
        b64=$(phase b64 64 64 64 e2e_slow4 4 "$latency"); echo "$b64"
fi
if [[ $phases == *" s "* ]]; then
        cq_say "s) sustained: instant LLM, 2-cell jobs: $sjobs jobs, 8 slots, pool 4, kernel server on"
        s=$(CODERQ_KERNEL_SERVER=on phase s 8 "$sjobs" 4 e2e_two 3 0); echo "$s"
fi

/usr/bin/python3 - "$a" "$idle" "$b16" "$b64" "$s" <<'PY'
import json, sys
a, idle, b16, b64, s = (json.loads(x) for x in sys.argv[1:6])
bs = [b for b in (b16, b64) if b]
per = lambda b: (b["rss_peak_kb"] - idle["rss_kb"]) / b["slots"]
if idle and bs:
    print("rss per slot (peak - idle 0-slot worker) / slots: "
          + ", ".join("%d slots %.0f kB" % (b["slots"], per(b)) for b in bs)
          + ("; marginal (peak64 - peak16) / 48: %.0f kB"
             % ((b64["rss_peak_kb"] - b16["rss_peak_kb"]) / 48) if b16 and b64 else ""))
for b in bs:
    ideal_run = b["turns"] * b["latency_ms"]
    waves = b["jobs"] / b["slots"]
    print("%d slots: efficiency %.3f over first submit .. last event; a job's run "
          "%.0f ms for %d ms of LLM latency (run efficiency %.3f); mean ms: intake %.0f, "
          "queue %.0f, run %.0f (setup %.0f, per LLM turn %.0f, per cell turn %.0f, "
          "finish %.0f), relay %.0f (outbox row to acknowledged %.0f)"
          % (b["slots"], b["efficiency"], b["run_ms_mean"], ideal_run,
             ideal_run / b["run_ms_mean"], b["intake_ms_mean"], b["queue_ms_mean"],
             b["run_ms_mean"], b["setup_ms_mean"], b["llm_turn_ms_mean"],
             b["tool_turn_ms_mean"], b["finish_ms_mean"], b["relay_ms_mean"],
             b["outbox_ms_mean"]))
    print("%d slots: overhead %.0f ms: wall %.0f ms for %.0f wave(s) of %d ms of LLM latency"
          % (b["slots"], b["wall_s"] * 1000 - waves * ideal_run, b["wall_s"] * 1000,
             waves, ideal_run))
ran = [x for x in (a, b16, b64, s) if x]
for x in ran:
    c = x["cpu_ms_per_job"]
    print("%s: CPU ms per job: %s; outside the kernels %.1f; %.1f commits per job"
          % (x["phase"], ", ".join("%s %.1f" % kv for kv in c.items()),
             x["cpu_ms_per_job_outside_kernels"], x["commits_per_job"]))
if s:
    print("s: %d jobs at %.2f jobs/s sustained (8 slots, pool 4, kernel server on)"
          % (s["jobs"], s["jobs_per_s"]))
if ran and b64:
    print("kernel pool refill: %.2f kernels/s at best in this run; sustained "
          "64-slot throughput would need %.0f/s"
          % (max(x["kernel_starts_per_s"] for x in ran), b64["ideal_jobs_per_s"]))
for x in ran:
    print("%s: %d worker(s), %d jobs, %s duplicate completion event(s)"
          % (x["phase"], x["workers"], x["jobs"],
             x["duplicate_events"] if x["duplicate_events"] >= 0 else "unknown"))
dups = [x["duplicate_events"] for x in ran]
eff = lambda b: b["efficiency"] if b else None
reff = lambda b: round(b["turns"] * b["latency_ms"] / b["run_ms_mean"], 3) if b else None
over = lambda b: (round(b["wall_s"] * 1000 - b["jobs"] / b["slots"] * b["turns"] * b["latency_ms"])
                  if b else None)
print(json.dumps({"bench": "e2e", "jobs_per_s": a and a["jobs_per_s"],
                  "p50_ms": a and a["p50_ms"], "p95_ms": a and a["p95_ms"],
                  "latency_ms": bs[0]["latency_ms"] if bs else None,
                  "efficiency_16": eff(b16), "efficiency_64": eff(b64),
                  "run_efficiency_16": reff(b16), "run_efficiency_64": reff(b64),
                  "overhead_ms_16": over(b16), "overhead_ms_64": over(b64),
                  "rss_per_slot_kb": round(per(b64)) if b64 and idle else None,
                  "kernel_starts_per_s": round(max(x["kernel_starts_per_s"] for x in ran), 3)
                  if ran else None,
                  "workers": ran[0]["workers"] if ran else None,
                  "duplicate_events": sum(dups) if ran and min(dups) >= 0 else None,
                  "sustained_jobs_per_s": s and s["jobs_per_s"],
                  "cpu_ms_per_job_outside_kernels": s and s["cpu_ms_per_job_outside_kernels"],
                  "cpu_ms_per_job": s and s["cpu_ms_per_job"],
                  "commits_per_job": s and s["commits_per_job"]}))
PY
