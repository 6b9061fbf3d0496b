# shellcheck shell=bash
# Shared by the scripts: paths, ports and small helpers. Sourced, not run.

CQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CQ_RUN_DIR=${CODERQ_RUNTIME_DIR:-$CQ_ROOT/.run}
CQ_CACHE_DIR=${CODERQ_CACHE_DIR:-$CQ_ROOT/.cache}
CQ_KAFKA_VERSION=3.9.1
CQ_KAFKA_LIBS=$CQ_CACHE_DIR/kafka-$CQ_KAFKA_VERSION/libs
CQ_PG_PORT=${CODERQ_PG_PORT:-25432}
CQ_KAFKA_PORT=${CODERQ_KAFKA_PORT:-29092}
CQ_KAFKA_CONTROLLER_PORT=$((CQ_KAFKA_PORT + 1))
CQ_PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)

cq_say() { printf '==> %s\n' "$*" >&2; }
cq_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# cq_as_root CMD...: run as root, through sudo when we are not root.
cq_as_root() {
        if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# cq_services CMD: scripts/services.sh CMD, as root (through sudo when we
# are not root), with this shell's port and folder settings.
cq_services() {
        if [ "$(id -u)" -eq 0 ]; then
                "$CQ_ROOT/scripts/services.sh" "$@"
        else
                sudo env CODERQ_PG_PORT="$CQ_PG_PORT" \
                        CODERQ_KAFKA_PORT="$CQ_KAFKA_PORT" \
                        ${CODERQ_KAFKA_SSL_PORT:+CODERQ_KAFKA_SSL_PORT="$CODERQ_KAFKA_SSL_PORT"} \
                        ${CODERQ_KAFKA_SASL_PORT:+CODERQ_KAFKA_SASL_PORT="$CODERQ_KAFKA_SASL_PORT"} \
                        ${CODERQ_KAFKA_CLUSTER_PORT:+CODERQ_KAFKA_CLUSTER_PORT="$CODERQ_KAFKA_CLUSTER_PORT"} \
                        ${CODERQ_PG_PAIR_PORT:+CODERQ_PG_PAIR_PORT="$CODERQ_PG_PAIR_PORT"} \
                        ${CODERQ_SERVICES_SECURE:+CODERQ_SERVICES_SECURE="$CODERQ_SERVICES_SECURE"} \
                        CODERQ_RUNTIME_DIR="$CQ_RUN_DIR" \
                        CODERQ_CACHE_DIR="$CQ_CACHE_DIR" \
                        "$CQ_ROOT/scripts/services.sh" "$@"
        fi
}

# cq_build DIR TYPE [TARGET...]: configure (strict: -Werror) when DIR is
# not yet configured that way, then build incrementally (only TARGETs when
# given); the compiler's output goes to DIR/build.log and is shown on
# failure. The Fuzz type is configured with clang. Configuring only when
# needed matters: a second configure can move a pkg-config module's
# "-isystem" from the include directories into the compile flags, which
# rebuilds everything.
cq_build() {
        local dir=$1 type=$2 configure=1 cc=() targets=() t
        shift 2
        for t in "$@"; do targets+=(--target "$t"); done
        [ "$type" = Fuzz ] && cc=(-DCMAKE_C_COMPILER=clang)
        mkdir -p "$dir"
        if [ -f "$dir/CMakeCache.txt" ] &&
                grep -qx "CMAKE_BUILD_TYPE:STRING=$type" "$dir/CMakeCache.txt" &&
                grep -qx "CQ_WERROR:BOOL=ON" "$dir/CMakeCache.txt"; then
                configure=0
        fi
        if ! {
                if [ "$configure" -eq 1 ]; then
                        cmake -S "$CQ_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE="$type" \
                                -DCQ_WERROR=ON "${cc[@]}"
                fi &&
                        cmake --build "$dir" -j"$(nproc)" "${targets[@]}"
        } >"$dir/build.log" 2>&1; then
                cat "$dir/build.log" >&2
                cq_die "the $type build in $dir failed"
        fi
}

# cq_bench_setup NAME: what the end-to-end benchmarks share: the services
# (each started when it is not running, and only those stopped again at
# exit), a temporary folder $CQ_BENCH_TMP (kept at exit when CQ_KEEP_LOGS
# is set) and a migrated database of their own, $CQ_BENCH_DSN (dropped at
# exit).
# A script with more to clean up defines cq_bench_cleanup_more first.
cq_bench_setup() {
        eval "$("$CQ_ROOT/scripts/services.sh" env)"
        # what was down here is started, and only that is stopped at exit:
        # a service that ran before (another run's, or one an outage test
        # of someone else stopped a moment) is left as it was
        CQ_BENCH_STOP=()
        psql "$CODERQ_PG_DSN" -XAtqc 'select 1' >/dev/null 2>&1 ||
                CQ_BENCH_STOP+=(stop-pg)
        (exec 3<>"/dev/tcp/127.0.0.1/$CQ_KAFKA_PORT") 2>/dev/null ||
                CQ_BENCH_STOP+=(stop-kafka)
        if [ "${#CQ_BENCH_STOP[@]}" -gt 0 ]; then
                cq_services start
        fi
        CQ_BENCH_TMP=$(mktemp -d)
        CQ_BENCH_DB=cqbench_$1_$$
        trap cq_bench_cleanup EXIT
        # one a bench killed before its cleanup left, under a pid since
        # reused: no live bench has this pid but this one
        psql "$CODERQ_PG_DSN" -Xqc "DROP DATABASE IF EXISTS $CQ_BENCH_DB WITH (FORCE)" \
                >/dev/null 2>&1
        psql "$CODERQ_PG_DSN" -Xqc "CREATE DATABASE $CQ_BENCH_DB" >/dev/null
        CQ_BENCH_DSN=${CODERQ_PG_DSN%/*}/$CQ_BENCH_DB
        CODERQ_PG_DSN=$CQ_BENCH_DSN "${CQ_BUILD:-$CQ_ROOT/build}/coderq" migrate >/dev/null
}

cq_bench_cleanup() {
        if declare -F cq_bench_cleanup_more >/dev/null; then
                cq_bench_cleanup_more || true
        fi
        psql "$CODERQ_PG_DSN" -Xqc "DROP DATABASE IF EXISTS $CQ_BENCH_DB WITH (FORCE)" >/dev/null 2>&1 || true
        if [ -n "${CQ_KEEP_LOGS:-}" ]; then
                echo "worker logs kept in $CQ_BENCH_TMP" >&2
        else
                rm -rf "$CQ_BENCH_TMP"
        fi
        if [ -n "${CQ_BENCH_LLM_PID:-}" ]; then
                kill "$CQ_BENCH_LLM_PID" 2>/dev/null || true
                wait "$CQ_BENCH_LLM_PID" 2>/dev/null || true
        fi
        if [ "${CQ_BENCH_CLUSTER_STARTED:-0}" = 1 ]; then
                "$CQ_ROOT/scripts/services.sh" stop --cluster || true
        fi
        local verb
        for verb in "${CQ_BENCH_STOP[@]}"; do
                cq_services "$verb" || true
        done
}

# cq_bench_cluster: after cq_bench_setup, the 3-broker cluster
# (services.sh start --cluster; stopped again at exit when this started
# it), its brokers in $CQ_BENCH_BROKERS.
cq_bench_cluster() {
        local status
        status=$("$CQ_ROOT/scripts/services.sh" status 2>/dev/null || true)
        if [[ $status != *"node 1 on "* ]]; then
                cq_say "starting the 3-broker cluster"
                CQ_BENCH_CLUSTER_STARTED=1
                "$CQ_ROOT/scripts/services.sh" start --cluster >/dev/null
        fi
        CQ_BENCH_BROKERS=$("$CQ_ROOT/scripts/services.sh" env --cluster |
                sed -n "s/^export CODERQ_KAFKA_BROKERS='\(.*\)'$/\1/p")
        [ -n "$CQ_BENCH_BROKERS" ] || cq_die "could not read the cluster's brokers"
}

# cq_bench_fake_llm NAME STEPS: after cq_bench_setup, the fake LLM
# (stopped at exit) with one script NAME of STEPS (a JSON array); its
# base URL in $CQ_BENCH_LLM_BASE, its pid in $CQ_BENCH_LLM_PID.
cq_bench_fake_llm() {
        /usr/bin/python3 "$CQ_ROOT/tests/fakes/fake_llm.py" --port-file "$CQ_BENCH_TMP/port" >/dev/null &
        CQ_BENCH_LLM_PID=$!
        for _ in $(seq 100); do [ -s "$CQ_BENCH_TMP/port" ] && break; sleep 0.05; done
        [ -s "$CQ_BENCH_TMP/port" ] || cq_die "the fake LLM did not start"
        CQ_BENCH_LLM_BASE="http://127.0.0.1:$(cat "$CQ_BENCH_TMP/port")/v1"
        /usr/bin/python3 - "$CQ_BENCH_LLM_BASE" "$1" "$2" <<'PY'
import http.client, json, sys, urllib.parse
url = urllib.parse.urlparse(sys.argv[1])
c = http.client.HTTPConnection(url.hostname, url.port)
c.request("POST", "/_fake/scripts", json.dumps({"name": sys.argv[2], "steps": json.loads(sys.argv[3])}),
          {"Content-Type": "application/json"})
r = c.getresponse()
assert r.status == 200, r.read()
PY
}
