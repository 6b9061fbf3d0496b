#!/usr/bin/env bash
# services.sh start|stop|status|env - a private PostgreSQL cluster and a
# single-node Kafka broker (KRaft, combined broker+controller) under the
# git-ignored runtime folder, on non-default loopback ports. start waits
# for real readiness (a query; a metadata request) and is a no-op for what
# already runs; stop leaves no process behind.
#
# start --secure (or CODERQ_SERVICES_SECURE=1) adds, beside the plaintext
# listener that stays as it is: a test CA and a server certificate made
# with openssl under the runtime folder, a Kafka SSL listener and a
# SASL_SSL listener with SCRAM-SHA-512 (the user is created with Kafka's
# own ConfigCommand), and TLS on PostgreSQL (ssl=on with the same CA;
# plaintext connections keep working). Secure mode lasts until stop;
# restart-kafka and restart-pg keep it. env --secure prints the client
# settings for it.
#
# start --cluster adds three KRaft nodes beside the single broker
# (services/kafka-cluster.sh; kill-broker N, start-broker N and leader
# TOPIC [PARTITION] act on them), start --pg-standby a PostgreSQL primary
# with a synchronous standby beside the main server
# (services/pg-pair.sh; pg-failover, pg-rebuild). Either flag makes
# start and stop act on those only; plain stop stops everything. env
# with a flag prints that service's settings in place of the single one's.
#
# Variables: CODERQ_RUNTIME_DIR (default .run), CODERQ_PG_PORT (25432),
# CODERQ_KAFKA_PORT (29092; the controller listens on the next port),
# CODERQ_KAFKA_SSL_PORT (CODERQ_KAFKA_PORT + 3) and CODERQ_KAFKA_SASL_PORT
# (CODERQ_KAFKA_PORT + 4) for the secure listeners,
# CODERQ_KAFKA_CLUSTER_PORT (29111: nodes 1-3 on it and the next two
# ports, their controllers 10 above) and CODERQ_PG_PAIR_PORT (25434 and
# the next port).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/services/kafka-cluster.sh"
. "$(dirname "$0")/services/pg-pair.sh"

PG_DIR=$CQ_RUN_DIR/pg
K_DIR=$CQ_RUN_DIR/kafka
PG_USER=postgres # PostgreSQL refuses to run as root: use its own account
DSN="postgresql://coderq@127.0.0.1:$CQ_PG_PORT/coderq"
BROKERS="127.0.0.1:$CQ_KAFKA_PORT"
SEC_DIR=$CQ_RUN_DIR/secure
SSL_PORT=${CODERQ_KAFKA_SSL_PORT:-$((CQ_KAFKA_PORT + 3))}
SASL_PORT=${CODERQ_KAFKA_SASL_PORT:-$((CQ_KAFKA_PORT + 4))}
SCRAM_USER=coderq

# Secure mode is on while this marker exists: start --secure creates it,
# stop removes it, so restart-kafka and restart-pg keep the mode.
secure_on() { [ -f "$SEC_DIR/enabled" ]; }

# The test CA, a server certificate for localhost and 127.0.0.1 signed by
# it, the broker's PKCS12 keystore, the SCRAM password, and a second CA
# that signed nothing (what a client trusting the wrong CA has). Made
# once; kept across stop and start.
secure_material() {
        command -v openssl >/dev/null || cq_die "openssl not found; run scripts/setup.sh"
        mkdir -p "$SEC_DIR"
        chmod 0755 "$SEC_DIR"
        [ -f "$SEC_DIR/.complete" ] && return
        cq_say "making a test CA and certificates in $SEC_DIR"
        local d=$SEC_DIR
        (
                set -e
                umask 077
                openssl req -x509 -newkey rsa:2048 -nodes -days 3650 \
                        -keyout "$d/ca.key" -out "$d/ca.pem" \
                        -subj "/CN=coderq test CA" \
                        -addext "basicConstraints=critical,CA:TRUE" \
                        -addext "keyUsage=critical,keyCertSign,cRLSign"
                openssl req -newkey rsa:2048 -nodes -keyout "$d/server.key" \
                        -out "$d/server.csr" -subj "/CN=localhost"
                printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" \
                        "basicConstraints=CA:FALSE" \
                        "keyUsage=critical,digitalSignature,keyEncipherment" \
                        "extendedKeyUsage=serverAuth" >"$d/server.ext"
                openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" \
                        -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
                        -extfile "$d/server.ext" -out "$d/server.pem"
                openssl rand -hex 16 >"$d/keystore.password"
                openssl pkcs12 -export -in "$d/server.pem" -inkey "$d/server.key" \
                        -certfile "$d/ca.pem" -name broker -out "$d/broker.p12" \
                        -passout "file:$d/keystore.password"
                openssl rand -hex 16 >"$d/scram.password"
                openssl req -x509 -newkey rsa:2048 -nodes -days 3650 \
                        -keyout "$d/other-ca.key" -out "$d/other-ca.pem" \
                        -subj "/CN=coderq test CA that signed nothing"
                chmod 0644 "$d/ca.pem" "$d/other-ca.pem" "$d/server.pem"
        ) >"$SEC_DIR/openssl.log" 2>&1 || cq_die "openssl failed; see $SEC_DIR/openssl.log"
        touch "$SEC_DIR/.complete"
}

# A client properties file for the SASL_SSL listener, as Kafka's own
# tools take it (CODERQ_KAFKA_PROPERTIES can name it).
secure_client_properties() {
        (
                umask 077
                cat >"$SEC_DIR/client.properties" <<PROPS
# coderq test broker, SASL_SSL listener 127.0.0.1:$SASL_PORT
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=$SCRAM_USER
sasl.password=$(cat "$SEC_DIR/scram.password")
ssl.ca.location=$SEC_DIR/ca.pem
PROPS
        )
}

pg_as() { runuser -u "$PG_USER" -- "$@"; }

pg_running() {
        [ -f "$PG_DIR/data/postmaster.pid" ] &&
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1
}

pg_ready() {
        local out
        out=$(psql "$DSN" -XAtqc 'select 1' 2>/dev/null) && [ "$out" = 1 ]
}

# pg_prepare_dir DIR [SUFFIX]: a folder of PostgreSQL's files (the main
# cluster's, $PG_DIR, or the pair's), which the postgres account must
# reach; a clone under a private home (0700) is not reachable, so the data
# then lives in /var/tmp (coderq-pg-HASH, SUFFIX appended) and the runtime
# folder holds a symlink to it.
pg_prepare_dir() {
        local dir=$1 suffix=${2:-}
        mkdir -p "$CQ_RUN_DIR"
        if [ -e "$dir" ]; then
                return
        fi
        mkdir -p "$dir"
        chown "$PG_USER:" "$dir"
        if ! pg_as test -w "$dir"; then
                rmdir "$dir"
                local alt
                alt=/var/tmp/coderq-pg-$(printf '%s' "$CQ_RUN_DIR" | sha256sum | cut -c1-12)$suffix
                mkdir -p "$alt"
                chown "$PG_USER:" "$alt"
                ln -s "$alt" "$dir"
        fi
}

# pg_bootstrap PORT: the role and database of coderq on the server at PORT
# (superuser: migrations create the pg_trgm extension).
pg_bootstrap() {
        local admin="postgresql://postgres@127.0.0.1:$1/postgres"
        if ! psql "$admin" -XAtqc "select 1 from pg_roles where rolname='coderq'" | grep -q 1; then
                psql "$admin" -Xqc "create role coderq login superuser" >/dev/null
        fi
        if ! psql "$admin" -XAtqc "select 1 from pg_database where datname='coderq'" | grep -q 1; then
                psql "$admin" -Xqc "create database coderq owner coderq" >/dev/null
        fi
}

# TLS for PostgreSQL in secure mode: the server certificate from the test
# CA, in a file included by postgresql.conf (absent in plain mode, so a
# plain start after stop is exactly as before). Plaintext connections
# still work (host lines are not hostssl). Prints "changed" when the file
# was written or removed.
pg_tls_config() {
        local conf=$PG_DIR/data/coderq-tls.conf tls=$PG_DIR/tls
        if ! secure_on; then
                if [ -f "$conf" ]; then
                        rm -f "$conf"
                        echo changed
                fi
                return 0
        fi
        grep -qx "include_if_exists = 'coderq-tls.conf'" "$PG_DIR/data/postgresql.conf" ||
                echo "include_if_exists = 'coderq-tls.conf'" >>"$PG_DIR/data/postgresql.conf"
        mkdir -p "$tls"
        install -o "$PG_USER" -m 0644 "$SEC_DIR/server.pem" "$tls/server.pem"
        install -o "$PG_USER" -m 0600 "$SEC_DIR/server.key" "$tls/server.key"
        local want
        want=$(printf '%s\n' "ssl = on" "ssl_cert_file = '$tls/server.pem'" \
                "ssl_key_file = '$tls/server.key'" "ssl_min_protocol_version = 'TLSv1.2'")
        if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$want" ]; then
                printf '%s\n' "$want" >"$conf"
                chown "$PG_USER:" "$conf"
                echo changed
        fi
}

pg_start() {
        [ -n "$CQ_PG_BIN" ] || cq_die "PostgreSQL server binaries not found; run scripts/setup.sh"
        if pg_running && pg_ready; then
                if [ -n "$(pg_tls_config)" ]; then
                        cq_say "reloading PostgreSQL for its TLS settings"
                        pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" reload >/dev/null
                        pg_wait_ssl
                fi
                cq_say "PostgreSQL already running on port $CQ_PG_PORT"
                return
        fi
        if ! pg_running && (exec 3<>"/dev/tcp/127.0.0.1/$CQ_PG_PORT") 2>/dev/null; then
                cq_die "port $CQ_PG_PORT is taken by another process; choose another CODERQ_PG_PORT"
        fi
        pg_prepare_dir "$PG_DIR"
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
        pg_tls_config >/dev/null
        cq_say "starting PostgreSQL on 127.0.0.1:$CQ_PG_PORT"
        # -p: the port follows CODERQ_PG_PORT even for a cluster that was
        # initialised with another one.
        pg_as "$CQ_PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" \
                -o "-p $CQ_PG_PORT" -w -t 60 start >/dev/null
        pg_bootstrap "$CQ_PG_PORT"
        local i
        for i in $(seq 1 100); do
                if pg_ready; then
                        pg_wait_ssl
                        return
                fi
                sleep 0.1
        done
        cq_die "PostgreSQL did not answer a query; see $PG_DIR/server.log"
}

# In secure mode, ready means a verify-full connection works.
pg_wait_ssl() {
        secure_on || return 0
        local i out
        for i in $(seq 1 100); do
                out=$(psql "$DSN?sslmode=verify-full&sslrootcert=$SEC_DIR/ca.pem" \
                        -XAtqc 'select ssl from pg_stat_ssl where pid = pg_backend_pid()' 2>/dev/null) &&
                        [ "$out" = t ] && return 0
                sleep 0.1
        done
        cq_die "PostgreSQL does not accept TLS connections; see $PG_DIR/server.log"
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

# kafka_node_pid DIR: the live broker whose pid DIR/broker.pid holds.
kafka_node_pid() {
        local pid
        [ -f "$1/broker.pid" ] || return 1
        pid=$(cat "$1/broker.pid")
        pid_alive "$pid" || return 1
        grep -q 'kafka.Kafka' "/proc/$pid/cmdline" 2>/dev/null || return 1
        echo "$pid"
}

kafka_pid() { kafka_node_pid "$K_DIR"; }

# kafka_node_launch DIR: start the broker of DIR/server.properties in the
# background, its output appended to DIR/broker.log; returns once
# DIR/broker.pid names it (readiness is the caller's to wait for).
kafka_node_launch() {
        local dir=$1 deadline=$((SECONDS + 30))
        # setsid: the broker must not die with the shell that started it.
        # setsid forks when it is a process group leader (under job
        # control), so $! may not be the broker: the shell that becomes
        # java writes its own pid.
        rm -f "$dir/broker.pid"
        setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' bash "$dir/broker.pid" \
                java -Xms256m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
                -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
                -Dorg.slf4j.simpleLogger.showDateTime=true \
                -cp "$CQ_KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" \
                >>"$dir/broker.log" 2>&1 </dev/null &
        while [ ! -s "$dir/broker.pid" ] && [ "$SECONDS" -lt "$deadline" ]; do
                sleep 0.05
        done
}

# A fresh cluster id for a format.
kafka_random_uuid() {
        java -cp "$CQ_KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null |
                tail -n 1
}

# kafka_node_format DIR ID [ARG...]: format DIR/data for cluster ID (once;
# a formatted log is kept).
kafka_node_format() {
        local dir=$1 id=$2
        shift 2
        [ -f "$dir/data/meta.properties" ] && return 0
        java -cp "$CQ_KAFKA_LIBS/*" kafka.tools.StorageTool format "$@" \
                -t "$id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 ||
                cq_die "could not format Kafka storage; see $dir/format.log"
}

# kafka_node_stop DIR NAME: TERM the broker of DIR (a controlled shutdown),
# KILL it after 30 s.
kafka_node_stop() {
        local dir=$1 name=$2 pid i
        pid=$(kafka_node_pid "$dir") || { rm -f "$dir/broker.pid"; return 0; }
        cq_say "stopping $name"
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 120); do
                pid_alive "$pid" || break
                sleep 0.25
        done
        if pid_alive "$pid"; then
                cq_say "$name did not stop within 30 s; killing it"
                kafka_node_kill "$dir"
        fi
        rm -f "$dir/broker.pid"
}

# kafka_node_kill DIR: kill -9 the broker of DIR and wait until it is gone.
kafka_node_kill() {
        local pid i
        pid=$(kafka_node_pid "$1") || { rm -f "$1/broker.pid"; return 0; }
        kill -KILL "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do
                pid_alive "$pid" || break
                sleep 0.1
        done
        rm -f "$1/broker.pid"
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

# Whether the running broker was started with the secure listeners.
kafka_started_secure() {
        grep -q '^listeners=.*SASL_SSL://' "$K_DIR/server.properties" 2>/dev/null
}

# The client settings of the SASL_SSL listener, as kcat -X arguments.
kcat_sasl_args() {
        printf '%s\n' -b "127.0.0.1:$SASL_PORT" -X security.protocol=SASL_SSL \
                -X sasl.mechanisms=SCRAM-SHA-512 -X "sasl.username=$SCRAM_USER" \
                -X "sasl.password=$(cat "$SEC_DIR/scram.password")" \
                -X "ssl.ca.location=$SEC_DIR/ca.pem"
}

# The SCRAM user, created with Kafka's own ConfigCommand through the
# plaintext listener (KRaft keeps it in the metadata log, so it survives
# restarts); then a metadata request over SASL_SSL and one over SSL must
# answer: the secure listeners are ready.
kafka_secure_ready() {
        local args md i
        mapfile -t args < <(kcat_sasl_args)
        md=$(kcat "${args[@]}" -L -m 5 2>/dev/null) && grep -q "broker 1 at" <<<"$md" &&
                return 0
        cq_say "creating the SCRAM-SHA-512 user $SCRAM_USER"
        java -cp "$CQ_KAFKA_LIBS/*" kafka.admin.ConfigCommand \
                --bootstrap-server "$BROKERS" --alter --entity-type users \
                --entity-name "$SCRAM_USER" --add-config \
                "SCRAM-SHA-512=[iterations=4096,password=$(cat "$SEC_DIR/scram.password")]" \
                >"$K_DIR/scram.log" 2>&1 || cq_die "could not create the SCRAM user; see $K_DIR/scram.log"
        for i in $(seq 1 100); do
                if md=$(kcat "${args[@]}" -L -m 5 2>/dev/null) &&
                        grep -q "broker 1 at" <<<"$md"; then
                        md=$(kcat -b "127.0.0.1:$SSL_PORT" -X security.protocol=SSL \
                                -X "ssl.ca.location=$SEC_DIR/ca.pem" -L -m 5 2>/dev/null) &&
                                grep -q "broker 1 at" <<<"$md" && return 0
                fi
                sleep 0.1
        done
        cq_die "the SASL_SSL and SSL listeners do not answer; see $K_DIR/broker.log"
}

kafka_start() {
        [ -f "$CQ_KAFKA_LIBS/.complete" ] || cq_die "Kafka jars missing; run scripts/setup.sh"
        if kafka_ready; then
                if ! secure_on || kafka_started_secure; then
                        if secure_on; then kafka_secure_ready; fi
                        cq_say "Kafka already running on $BROKERS"
                        return
                fi
                cq_say "restarting Kafka with the secure listeners"
                kafka_stop
        fi
        if kafka_pid >/dev/null; then
                cq_say "Kafka runs but does not answer; restarting it"
                kafka_stop
        fi
        local port ports=("$CQ_KAFKA_PORT" "$CQ_KAFKA_CONTROLLER_PORT")
        if secure_on; then ports+=("$SSL_PORT" "$SASL_PORT"); fi
        for port in "${ports[@]}"; do
                if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                        cq_die "port $port is taken by another process; choose another CODERQ_KAFKA_PORT (or CODERQ_KAFKA_SSL_PORT, CODERQ_KAFKA_SASL_PORT)"
                fi
        done
        mkdir -p "$K_DIR/data"
        local listeners="PLAINTEXT://127.0.0.1:$CQ_KAFKA_PORT,CONTROLLER://127.0.0.1:$CQ_KAFKA_CONTROLLER_PORT"
        local advertised="PLAINTEXT://127.0.0.1:$CQ_KAFKA_PORT"
        local protocols="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        if secure_on; then
                listeners+=",SSL://127.0.0.1:$SSL_PORT,SASL_SSL://127.0.0.1:$SASL_PORT"
                advertised+=",SSL://127.0.0.1:$SSL_PORT,SASL_SSL://127.0.0.1:$SASL_PORT"
                protocols+=",SSL:SSL,SASL_SSL:SASL_SSL"
        fi
        cat >"$K_DIR/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CQ_KAFKA_CONTROLLER_PORT
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$K_DIR/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
CONF
        if secure_on; then
                cat >>"$K_DIR/server.properties" <<CONF
ssl.keystore.type=PKCS12
ssl.keystore.location=$SEC_DIR/broker.p12
ssl.keystore.password=$(cat "$SEC_DIR/keystore.password")
ssl.key.password=$(cat "$SEC_DIR/keystore.password")
ssl.client.auth=none
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
CONF
        fi
        if [ ! -f "$K_DIR/data/meta.properties" ]; then
                cq_say "formatting Kafka storage (KRaft, standalone)"
                kafka_node_format "$K_DIR" "$(kafka_random_uuid)" --standalone
        fi
        cq_say "starting Kafka $CQ_KAFKA_VERSION on $BROKERS"
        local deadline=$((SECONDS + 90))
        kafka_node_launch "$K_DIR"
        while [ "$SECONDS" -lt "$deadline" ]; do
                if kafka_ready; then
                        # not "secure_on && …": its status would be the
                        # function's, and set -e would end the script
                        if secure_on; then kafka_secure_ready; fi
                        return 0
                fi
                kafka_pid >/dev/null || cq_die "Kafka exited during start; see $K_DIR/broker.log"
                sleep 0.1
        done
        cq_die "Kafka did not answer a metadata request in 90 s; see $K_DIR/broker.log"
}

kafka_stop() { kafka_node_stop "$K_DIR" Kafka; }

status() {
        local rc=0
        if pg_running && pg_ready; then
                echo "postgresql: running on 127.0.0.1:$CQ_PG_PORT$(secure_on && echo ' (TLS on)')"
        else
                echo "postgresql: stopped"
                rc=3
        fi
        if kafka_ready; then
                echo "kafka: running on $BROKERS (pid $(kafka_pid))$(kafka_started_secure &&
                        echo "; SSL on 127.0.0.1:$SSL_PORT, SASL_SSL on 127.0.0.1:$SASL_PORT")"
        else
                echo "kafka: stopped"
                rc=3
        fi
        # the replicated services, when they were ever started
        kc_status
        pp_status
        return $rc
}

verb=${1:-}
shift || true
secure=0
cluster=0
pair=0
args=()
for arg in "$@"; do
        case $arg in
        --secure) secure=1 ;;
        --cluster) cluster=1 ;;
        --pg-standby) pair=1 ;;
        -*)
                echo "$0: unknown option $arg" >&2
                exit 2
                ;;
        *) args+=("$arg") ;;
        esac
done
case $verb in
kill-broker | start-broker | leader) ;;
*)
        if [ "${#args[@]}" -gt 0 ]; then
                echo "$0: $verb takes no argument ${args[0]}" >&2
                exit 2
        fi
        ;;
esac
# Secure mode is the single services' (CODERQ_SERVICES_SECURE too); the
# cluster and the pair have none.
if [ $((cluster + pair)) -gt 0 ] && [ "$verb" != env ]; then
        [ "$secure" -eq 0 ] ||
                cq_die "--secure is for the single broker and PostgreSQL, not --cluster or --pg-standby"
elif [ "${CODERQ_SERVICES_SECURE:-0}" = 1 ]; then
        secure=1
fi
if [ "$secure" -eq 1 ]; then
        case $verb in
        start | start-pg | start-kafka | restart-pg | restart-kafka)
                secure_material
                touch "$SEC_DIR/enabled"
                ;;
        env) [ -f "$SEC_DIR/.complete" ] ||
                cq_die "no secure material in $SEC_DIR; run $0 start --secure first" ;;
        esac
fi

case "$verb" in
start)
        [ "$(id -u)" -eq 0 ] || cq_die "services.sh start needs root (it runs PostgreSQL as $PG_USER)"
        # --cluster and --pg-standby start only those, beside the single
        # services, which stay as they are
        if [ $((cluster + pair)) -eq 0 ]; then
                pg_start
                kafka_start
        fi
        if [ "$cluster" -eq 1 ]; then kc_start; fi
        if [ "$pair" -eq 1 ]; then pp_start; fi
        status
        ;;
start-pg) pg_start ;;
start-kafka) kafka_start ;;
stop)
        if [ "$cluster" -eq 1 ] || [ "$pair" -eq 0 ]; then kc_stop; fi
        if [ "$pair" -eq 1 ] || [ "$cluster" -eq 0 ]; then pp_stop; fi
        if [ $((cluster + pair)) -eq 0 ]; then
                kafka_stop
                pg_stop
                rm -f "$SEC_DIR/enabled"
        fi
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
kill-broker) kc_kill "${args[0]:-}" ;;
start-broker) kc_start_node "${args[0]:-}" ;;
leader) kc_leader "${args[0]:-}" "${args[1]:-0}" ;;
pg-failover) pp_failover ;;
pg-rebuild) pp_start rebuild ;;
status) status ;;
env)
        if [ "$pair" -eq 1 ]; then
                pp_env
        elif [ "$secure" -eq 1 ]; then
                echo "export CODERQ_PG_DSN='$DSN?sslmode=verify-full&sslrootcert=$SEC_DIR/ca.pem'"
        else
                echo "export CODERQ_PG_DSN='$DSN'"
        fi
        if [ "$cluster" -eq 1 ]; then
                kc_env
        elif [ "$secure" -eq 1 ]; then
                secure_client_properties
                echo "export CODERQ_KAFKA_BROKERS='127.0.0.1:$SASL_PORT'"
                echo "export CODERQ_KAFKA_PROP_SECURITY_PROTOCOL='SASL_SSL'"
                echo "export CODERQ_KAFKA_PROP_SASL_MECHANISM='SCRAM-SHA-512'"
                echo "export CODERQ_KAFKA_PROP_SASL_USERNAME='$SCRAM_USER'"
                echo "export CODERQ_KAFKA_PROP_SASL_PASSWORD='$(cat "$SEC_DIR/scram.password")'"
                echo "export CODERQ_KAFKA_PROP_SSL_CA_LOCATION='$SEC_DIR/ca.pem'"
                echo "export CODERQ_KAFKA_SSL_PORT='$SSL_PORT'"
                echo "export CODERQ_KAFKA_SASL_PORT='$SASL_PORT'"
                echo "# the same Kafka settings as a file: CODERQ_KAFKA_PROPERTIES='$SEC_DIR/client.properties'"
                echo "# the SSL listener (no SASL): 127.0.0.1:$SSL_PORT; a CA that signed nothing: $SEC_DIR/other-ca.pem"
        else
                echo "export CODERQ_KAFKA_BROKERS='$BROKERS'"
        fi
        # the ports, so that tests restarting a service reach these ones
        echo "export CODERQ_PG_PORT='$CQ_PG_PORT'"
        echo "export CODERQ_KAFKA_PORT='$CQ_KAFKA_PORT'"
        ;;
*)
        echo "usage: $0 start|stop|status|env [--secure | --cluster | --pg-standby] (also start-pg, start-kafka, stop-pg, stop-kafka, restart-pg, restart-kafka; kill-broker N, start-broker N, leader TOPIC [PARTITION]; pg-failover, pg-rebuild)" >&2
        exit 2
        ;;
esac
