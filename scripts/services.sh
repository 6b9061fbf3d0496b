#!/usr/bin/env bash
# services.sh start|stop|status|env - a private PostgreSQL cluster and a
# single-node Kafka broker (KRaft, combined broker+controller) under the
# git-ignored runtime folder, on non-default loopback ports. start waits
# for real readiness (a query; a metadata request) and is a no-op for what
# already runs; stop leaves no process behind.
#
# Variables: CODERQ_RUNTIME_DIR (default .run), CODERQ_PG_PORT (25432),
# CODERQ_KAFKA_PORT (29092; the controller listens on the next port).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PG_DIR=$CQ_RUN_DIR/pg
K_DIR=$CQ_RUN_DIR/kafka
PG_USER=postgres # PostgreSQL refuses to run as root: use its own account
DSN="postgresql://coderq@127.0.0.1:$CQ_PG_PORT/coderq"
BROKERS="127.0.0.1:$CQ_KAFKA_PORT"

pg_as() { runuser -u "$PG_USER" -- "$@"; }

pg_running() {
        [ -f "$PG_DIR/data/postmaster.pid" ] &&
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1
}

pg_ready() {
        local out
        out=$(psql "$DSN" -XAtqc 'select 1' 2>/dev/null) && [ "$out" = 1 ]
}

# The cluster's files must be reachable by the postgres account; a clone
# under a private home (0700) is not, so the data then lives in /var/tmp
# and the runtime folder holds a symlink to it.
pg_prepare_dir() {
        mkdir -p "$CQ_RUN_DIR"
        if [ -e "$PG_DIR" ]; then
                return
        fi
        mkdir -p "$PG_DIR"
        chown "$PG_USER:" "$PG_DIR"
        if ! pg_as test -w "$PG_DIR"; then
                rmdir "$PG_DIR"
                local alt
                alt=/var/tmp/coderq-pg-$(printf '%s' "$CQ_RUN_DIR" | sha256sum | cut -c1-12)
                mkdir -p "$alt"
                chown "$PG_USER:" "$alt"
                ln -s "$alt" "$PG_DIR"
        fi
}

pg_start() {
        [ -n "$CQ_PG_BIN" ] || cq_die "PostgreSQL server binaries not found; run scripts/setup.sh"
        if pg_running && pg_ready; then
                cq_say "PostgreSQL already running on port $CQ_PG_PORT"
                return
        fi
        if ! pg_running && (exec 3<>"/dev/tcp/127.0.0.1/$CQ_PG_PORT") 2>/dev/null; then
                cq_die "port $CQ_PG_PORT is taken by another process; choose another CODERQ_PG_PORT"
        fi
        pg_prepare_dir
        if [ ! -f "$PG_DIR/data/PG_VERSION" ]; then
                cq_say "initialising PostgreSQL cluster in $PG_DIR/data"
                rm -rf "$PG_DIR/data"
                pg_as mkdir -p "$PG_DIR/sock"
                # trust on loopback only: a private, throw-away test cluster
                pg_as "$CQ_PG_BIN/initdb" -D "$PG_DIR/data" -U postgres \
                        -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
                cat >>"$PG_DIR/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $CQ_PG_PORT
unix_socket_directories = '$PG_DIR/sock'
max_connections = 300
shared_buffers = 128MB
log_min_messages = warning
CONF
        fi
        cq_say "starting PostgreSQL on 127.0.0.1:$CQ_PG_PORT"
        # -p: the port follows CODERQ_PG_PORT even for a cluster that was
        # initialised with another one.
        pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" \
                -o "-p $CQ_PG_PORT" -w -t 60 start >/dev/null
        # Role and database for coderq (superuser: migrations create the
        # pg_trgm extension).
        local admin="postgresql://postgres@127.0.0.1:$CQ_PG_PORT/postgres"
        if ! psql "$admin" -XAtqc "select 1 from pg_roles where rolname='coderq'" | grep -q 1; then
                psql "$admin" -Xqc "create role coderq login superuser" >/dev/null
        fi
        if ! psql "$admin" -XAtqc "select 1 from pg_database where datname='coderq'" | grep -q 1; then
                psql "$admin" -Xqc "create database coderq owner coderq" >/dev/null
        fi
        local i
        for i in $(seq 1 100); do
                pg_ready && return
                sleep 0.1
        done
        cq_die "PostgreSQL did not answer a query; see $PG_DIR/server.log"
}

pg_stop() {
        if [ -f "$PG_DIR/data/postmaster.pid" ]; then
                cq_say "stopping PostgreSQL"
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w -t 60 \
                        stop >/dev/null 2>&1 ||
                        pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate \
                                -w stop >/dev/null 2>&1 || true
        fi
}

# A process that exited but was not reaped (PID 1 here may not reap) is a
# zombie: kill -0 still succeeds on it, yet it holds nothing. Count only
# live processes.
pid_alive() {
        local state
        [ -r "/proc/$1/stat" ] || return 1
        state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
        [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

kafka_pid() {
        local pid
        [ -f "$K_DIR/broker.pid" ] || return 1
        pid=$(cat "$K_DIR/broker.pid")
        pid_alive "$pid" || return 1
        grep -q 'kafka.Kafka' "/proc/$pid/cmdline" 2>/dev/null || return 1
        echo "$pid"
}

# Ready means a metadata request answered with our broker in it. A closed
# port is checked first (instantly) so that a starting broker is not
# probed with a full metadata timeout each time.
kafka_port_open() {
        (exec 3<>"/dev/tcp/127.0.0.1/$CQ_KAFKA_PORT") 2>/dev/null
}

# Our broker is ready when the process we started owns the listening
# port and answers a metadata request that lists it. (Another broker on
# the same port must never pass for ours.)
kafka_ready() {
        local pid md
        pid=$(kafka_pid) || return 1
        kafka_port_open || return 1
        ss -ltnpH "( sport = :$CQ_KAFKA_PORT )" 2>/dev/null | grep -q "pid=$pid," ||
                return 1
        # not piped into grep -q: under pipefail kcat's SIGPIPE would fail it
        md=$(kcat -b "$BROKERS" -L -m 5 2>/dev/null) || return 1
        grep -q "broker 1 at" <<<"$md"
}

kafka_start() {
        [ -f "$CQ_KAFKA_LIBS/.complete" ] || cq_die "Kafka jars missing; run scripts/setup.sh"
        if kafka_ready; then
                cq_say "Kafka already running on $BROKERS"
                return
        fi
        if kafka_pid >/dev/null; then
                cq_say "Kafka runs but does not answer; restarting it"
                kafka_stop
        fi
        local port
        for port in "$CQ_KAFKA_PORT" "$CQ_KAFKA_CONTROLLER_PORT"; do
                if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                        cq_die "port $port is taken by another process; choose another CODERQ_KAFKA_PORT"
                fi
        done
        mkdir -p "$K_DIR/data"
        cat >"$K_DIR/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CQ_KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$CQ_KAFKA_PORT,CONTROLLER://127.0.0.1:$CQ_KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$CQ_KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$K_DIR/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
CONF
        local cp="$CQ_KAFKA_LIBS/*"
        if [ ! -f "$K_DIR/data/meta.properties" ]; then
                cq_say "formatting Kafka storage (KRaft, standalone)"
                local id
                id=$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
                java -cp "$cp" kafka.tools.StorageTool format --standalone \
                        -t "$id" -c "$K_DIR/server.properties" >"$K_DIR/format.log" 2>&1 ||
                        cq_die "could not format Kafka storage; see $K_DIR/format.log"
        fi
        cq_say "starting Kafka $CQ_KAFKA_VERSION on $BROKERS"
        # setsid: the broker must not die with the shell that started it.
        # setsid forks when it is a process group leader (under job
        # control), so $! may not be the broker: the shell that becomes
        # java writes its own pid.
        rm -f "$K_DIR/broker.pid"
        setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' bash "$K_DIR/broker.pid" \
                java -Xms256m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
                -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
                -Dorg.slf4j.simpleLogger.showDateTime=true \
                -cp "$cp" kafka.Kafka "$K_DIR/server.properties" \
                >>"$K_DIR/broker.log" 2>&1 </dev/null &
        local deadline=$((SECONDS + 90))
        while [ ! -s "$K_DIR/broker.pid" ] && [ "$SECONDS" -lt "$deadline" ]; do
                sleep 0.05
        done
        while [ "$SECONDS" -lt "$deadline" ]; do
                if kafka_ready; then
                        return
                fi
                kafka_pid >/dev/null || cq_die "Kafka exited during start; see $K_DIR/broker.log"
                sleep 0.1
        done
        cq_die "Kafka did not answer a metadata request in 90 s; see $K_DIR/broker.log"
}

kafka_stop() {
        local pid i
        pid=$(kafka_pid) || { rm -f "$K_DIR/broker.pid"; return 0; }
        cq_say "stopping Kafka"
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 120); do
                pid_alive "$pid" || break
                sleep 0.25
        done
        if pid_alive "$pid"; then
                cq_say "Kafka did not stop within 30 s; killing it"
                kill -KILL "$pid" 2>/dev/null || true
                for i in $(seq 1 20); do
                        pid_alive "$pid" || break
                        sleep 0.1
                done
        fi
        rm -f "$K_DIR/broker.pid"
}

status() {
        local rc=0
        if pg_running && pg_ready; then
                echo "postgresql: running on 127.0.0.1:$CQ_PG_PORT"
        else
                echo "postgresql: stopped"
                rc=3
        fi
        if kafka_ready; then
                echo "kafka: running on $BROKERS (pid $(kafka_pid))"
        else
                echo "kafka: stopped"
                rc=3
        fi
        return $rc
}

case "${1:-}" in
start)
        [ "$(id -u)" -eq 0 ] || cq_die "services.sh start needs root (it runs PostgreSQL as $PG_USER)"
        pg_start
        kafka_start
        status
        ;;
start-pg) pg_start ;;
start-kafka) kafka_start ;;
stop)
        kafka_stop
        pg_stop
        ;;
stop-pg) pg_stop ;;
stop-kafka) kafka_stop ;;
restart-kafka)
        kafka_stop
        kafka_start
        ;;
restart-pg)
        pg_stop
        pg_start
        ;;
status) status ;;
env)
        echo "export CODERQ_PG_DSN='$DSN'"
        echo "export CODERQ_KAFKA_BROKERS='$BROKERS'"
        # the ports, so that tests restarting a service reach these ones
        echo "export CODERQ_PG_PORT='$CQ_PG_PORT'"
        echo "export CODERQ_KAFKA_PORT='$CQ_KAFKA_PORT'"
        ;;
*)
        echo "usage: $0 start|stop|status|env (also start-pg, start-kafka, stop-pg, stop-kafka, restart-pg, restart-kafka)" >&2
        exit 2
        ;;
esac
