#!/usr/bin/env bash
# storage.sh [seconds] - the PostgreSQL job queue: claim + heartbeat +
# finish cycles per second with 1 and 8 connections (bench_storage), side
# by side with pgbench running single-row INSERT transactions (8 clients)
# on the same server in the same run; and the 8-connection run with
# prepared statements off (CODERQ_PG_PREPARE=off), as prepared_ratio_8.
# Starts PostgreSQL with services.sh when it is not running (and stops it
# again). Last line: JSON.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"

secs=${1:-10}
build=${CQ_BUILD:-$CQ_ROOT/build}
pgbench=$CQ_PG_BIN/pgbench
eval "$("$CQ_ROOT/scripts/services.sh" env)"
started=0
if ! psql "$CODERQ_PG_DSN" -XAtqc 'select 1' >/dev/null 2>&1; then
        cq_as_root "$CQ_ROOT/scripts/services.sh" start-pg
        started=1
fi
cleanup() {
        psql "$CODERQ_PG_DSN" -Xqc "DROP DATABASE IF EXISTS cqbench_pgbench WITH (FORCE)" >/dev/null 2>&1 || true
        if [ "$started" = 1 ]; then
                cq_as_root "$CQ_ROOT/scripts/services.sh" stop-pg || true
        fi
}
trap cleanup EXIT

cq_say "coderq queue: claim + heartbeat + finish, ${secs}s per run"
out=$("$build/bench/bench_storage" "$secs")
printf '%s\n' "$out"
c1=$(printf '%s\n' "$out" | sed -n 's/^cycles_per_s_1=//p')
c8=$(printf '%s\n' "$out" | sed -n 's/^cycles_per_s_8=//p')
pr=$(printf '%s\n' "$out" | sed -n 's/^prepared_ratio_8=//p')

cq_say "pgbench: single-row INSERT transactions, 8 clients, ${secs}s"
psql "$CODERQ_PG_DSN" -Xqc "DROP DATABASE IF EXISTS cqbench_pgbench WITH (FORCE)" >/dev/null
psql "$CODERQ_PG_DSN" -Xqc "CREATE DATABASE cqbench_pgbench" >/dev/null
port=$CQ_PG_PORT
psql -h 127.0.0.1 -p "$port" -U coderq -d cqbench_pgbench -Xqc \
        "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, v text NOT NULL, at timestamptz NOT NULL DEFAULT now())" >/dev/null
script=$(mktemp)
echo "INSERT INTO bench_rows (v) VALUES ('x');" >"$script"
pgb=$("$pgbench" -n -f "$script" -c 8 -j 2 -T "$secs" -h 127.0.0.1 -p "$port" -U coderq cqbench_pgbench 2>&1)
rm -f "$script"
tps=$(printf '%s\n' "$pgb" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n 1)
[ -n "$tps" ] || cq_die "could not read pgbench's tps: $pgb"
echo "pgbench_tps=$tps"
ratio=$(awk -v a="$c8" -v b="$tps" 'BEGIN { printf "%.3f", a / b }')
printf '{"bench":"storage","cycles_per_s_1":%s,"cycles_per_s_8":%s,"pgbench_tps":%s,"ratio_8":%s,"prepared_ratio_8":%s}\n' \
        "$c1" "$c8" "$tps" "$ratio" "$pr"
