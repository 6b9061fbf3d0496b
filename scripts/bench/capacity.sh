#!/usr/bin/env bash
# capacity.sh [SECONDS] - what one PostgreSQL and a Kafka cluster cost a
# fleet, on this machine:
#   queue)  claim + heartbeat + finish cycles per second with 64 and 256
#           connections racing for the same rows (FOR UPDATE SKIP LOCKED;
#           bench_storage --connections), SECONDS (default 10) each, with
#           CQ_CAP_QUEUED (default 2000) jobs queued: a claim's cost grows
#           with the queued jobs (docs/CAPACITY.md);
#   wake)   LISTEN/NOTIFY: 8 and 64 listeners on the jobs channel (a
#           worker has one), jobs inserted one at a time: insert to
#           wake-up latency, then the inserts per second with them
#           listening (bench_storage --listeners);
#   fleet)  CQ_CAP_WORKERS (default 8) `coderq worker` processes of
#           CQ_CAP_SLOTS (default 16) slots each against the 3-broker
#           cluster (services.sh start --cluster) and the one PostgreSQL:
#           CQ_CAP_JOBS (default 2000) one-cell jobs with the instant fake
#           LLM (bench_e2e, kernel server on): jobs/s, the eight relays
#           racing for one outbox (relay and outbox-to-acknowledged mean
#           ms), and the cost per job: commits and CPU ms of PostgreSQL
#           and of the brokers.
# Starts what is not running (and stops it again). Last line: JSON.
# Figures: docs/BENCHMARKS.md; what they mean for a fleet: docs/CAPACITY.md.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

secs=${1:-10}
build=${CQ_BUILD:-$CQ_ROOT/build}
workers=${CQ_CAP_WORKERS:-8}
slots=${CQ_CAP_SLOTS:-16}
jobs=${CQ_CAP_JOBS:-2000}
queued=${CQ_CAP_QUEUED:-2000}
for v in "$secs" "$workers" "$slots" "$jobs" "$queued"; do
        [[ $v =~ ^[0-9]+$ ]] || cq_die "SECONDS and the CQ_CAP_ settings are numbers"
done
cq_bench_setup capacity
tmp=$CQ_BENCH_TMP
dsn=$CQ_BENCH_DSN

cq_say "queue: claim + heartbeat + finish, 64 and 256 connections, $queued jobs queued, ${secs}s each"
queue=$(CODERQ_PG_DSN=$dsn CQ_BENCH_QUEUED=$queued "$build/bench/bench_storage" --connections 64,256 "$secs")
printf '%s\n' "$queue"
cq_say "wake-ups: 8 and 64 listeners, ${secs}s of inserts each"
wake=$(CODERQ_PG_DSN=$dsn "$build/bench/bench_storage" --listeners 8,64 "$secs")
printf '%s\n' "$wake"

cq_bench_cluster
brokers=$CQ_BENCH_BROKERS
cq_bench_fake_llm cap_one '[{"tool_calls": [{"code": "x = 1"}]}, {"content": "1"}]'
export CQ_BENCH_LOGDIR=$tmp
listeners() { ss -ltnpH "( sport = :$1 )" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u | tr '\n' ' '; }
CQ_E2E_PIDS_POSTGRES=$(listeners "$CODERQ_PG_PORT")
CQ_E2E_PIDS_BROKER=
for p in ${brokers//,/ }; do
        CQ_E2E_PIDS_BROKER+="$(listeners "${p##*:}")"
done
CQ_E2E_PIDS_LLM=$CQ_BENCH_LLM_PID
[ -n "$CQ_E2E_PIDS_POSTGRES" ] || cq_die "no process listens on the PostgreSQL port $CODERQ_PG_PORT"
[ -n "${CQ_E2E_PIDS_BROKER// /}" ] || cq_die "no process listens on the cluster's ports"
export CQ_E2E_PIDS_POSTGRES CQ_E2E_PIDS_BROKER CQ_E2E_PIDS_LLM
fleet() { # NAME JOBS
        CQ_E2E_WORKERS=$workers CODERQ_KERNEL_SERVER=on "$build/bench/bench_e2e" \
                "$build/coderq" "$CQ_BENCH_LLM_BASE" "$dsn" "$brokers" \
                "$1" $((workers * slots)) "$2" $((workers * 2)) cap_one 2 0
}
cq_say "fleet warm-up: $((workers * 20)) jobs, left out of every figure"
fleet capwarm $((workers * 20)) >/dev/null
cq_say "fleet: $workers workers x $slots slots, $jobs one-cell jobs, 3 brokers"
fl=$(fleet fleet "$jobs")
echo "$fl"

/usr/bin/python3 - "$queue" "$wake" "$fl" "$queued" <<'PY'
import json, re, sys
queue, wake, fl = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kv = lambda text, key: float(re.search(r"^%s=([0-9.]+)$" % key, text, re.M).group(1))
w = {int(m[0]): (float(m[1]), float(m[2])) for m in
     re.findall(r"^listeners=(\d+) wake_ms p50=([0-9.]+) p95=([0-9.]+)", wake, re.M)}
ins = {int(m[0]): float(m[1]) for m in
       re.findall(r"^listeners=(\d+) inserts_per_s=([0-9.]+)", wake, re.M)}
c = fl["cpu_ms_per_job"]
print("fleet: %d workers, %d slots: %.2f jobs/s; per job %.2f commits, PostgreSQL "
      "%.2f CPU ms, brokers %.2f CPU ms, workers %.2f CPU ms; relay %.0f ms mean "
      "(outbox row to acknowledged %.0f ms); %d duplicate completion events"
      % (fl["workers"], fl["slots"], fl["jobs_per_s"], fl["commits_per_job"],
         c["postgres"], c["broker"], c["worker"], fl["relay_ms_mean"],
         fl["outbox_ms_mean"], fl["duplicate_events"]))
print(json.dumps({"bench": "capacity",
                  "queued": int(sys.argv[4]),
                  "cycles_per_s_64": kv(queue, "cycles_per_s_64"),
                  "cycles_per_s_256": kv(queue, "cycles_per_s_256"),
                  "wake_p50_ms_8": w[8][0], "wake_p95_ms_8": w[8][1],
                  "wake_p50_ms_64": w[64][0], "wake_p95_ms_64": w[64][1],
                  "inserts_per_s_64_listeners": ins[64],
                  "fleet_workers": fl["workers"], "fleet_slots": fl["slots"],
                  "fleet_jobs": fl["jobs"], "fleet_jobs_per_s": fl["jobs_per_s"],
                  "commits_per_job": fl["commits_per_job"],
                  "pg_cpu_ms_per_job": c["postgres"],
                  "broker_cpu_ms_per_job": c["broker"],
                  "worker_cpu_ms_per_job": c["worker"],
                  "relay_ms_mean": fl["relay_ms_mean"],
                  "duplicate_events": fl["duplicate_events"]}))
PY
