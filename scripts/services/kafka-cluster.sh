# shellcheck shell=bash
# kafka-cluster.sh - three KRaft nodes beside the single broker, for the
# tests of replication (sourced by services.sh: start --cluster, stop
# --cluster, env --cluster, kill-broker, start-broker, leader). Each node
# is broker and controller at once; the three make the controller quorum
# (static voters). Topics get three replicas and need two in sync to take
# a write (acks=all), so one node may die without losing or refusing
# anything. The same pinned jars as the single broker; folders under
# $CQ_RUN_DIR/kafka-cluster/node<N>/.

KC_DIR=$CQ_RUN_DIR/kafka-cluster
KC_PORT=${CODERQ_KAFKA_CLUSTER_PORT:-29111}
KC_NODES=(1 2 3)
# The topics coderq uses by default, with their partitions (as
# docker-compose.yml creates them on the single broker).
KC_TOPICS=(coderq.jobs:6 coderq.jobs.dlq:1 coderq.results:6 coderq.events:6)

# Node N's client port is KC_PORT + N - 1, its controller port 10 above.
kc_port() { echo $((KC_PORT + $1 - 1)); }
kc_controller_port() { echo $((KC_PORT + 9 + $1)); }
kc_dir() { echo "$KC_DIR/node$1"; }

kc_brokers() {
        local n list=""
        for n in "${KC_NODES[@]}"; do
                list+="${list:+,}127.0.0.1:$(kc_port "$n")"
        done
        echo "$list"
}

kc_node_check() {
        case ${1:-} in
        1 | 2 | 3) ;;
        *) cq_die "no cluster node \"${1:-}\": the nodes are 1, 2 and 3" ;;
        esac
}

# The configuration of node N, written at each start. What the settings
# buy is in docs/DEPLOYING.md (Replicated Kafka and PostgreSQL failover).
kc_config() {
        local n=$1 dir voters="" v
        dir=$(kc_dir "$n")
        for v in "${KC_NODES[@]}"; do
                voters+="${voters:+,}$v@127.0.0.1:$(kc_controller_port "$v")"
        done
        mkdir -p "$dir/data"
        cat >"$dir/server.properties" <<CONF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(kc_port "$n"),CONTROLLER://127.0.0.1:$(kc_controller_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(kc_port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=3
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
CONF
}

kc_pid() { kafka_node_pid "$(kc_dir "$1")"; }

# The brokers that answer a metadata request through node N, one id a
# line (empty when it does not answer).
kc_listed() {
        local md
        md=$(kcat -b "127.0.0.1:$(kc_port "$1")" -L -m 5 2>/dev/null) || return 0
        awk '$1 == "broker" && $3 == "at" { print $2 }' <<<"$md"
}

# Node N is ready when the process we started owns its port and a
# metadata request through it lists it.
kc_node_ready() {
        local pid
        pid=$(kc_pid "$1") || return 1
        ss -ltnpH "( sport = :$(kc_port "$1") )" 2>/dev/null | grep -q "pid=$pid," ||
                return 1
        kc_listed "$1" | grep -qx "$1"
}

# Whether node N is in the in-sync replicas of every partition it holds a
# replica of: it has caught up after a restart.
kc_node_in_sync() {
        local md
        md=$(kcat -b "$(kc_brokers)" -L -m 5 2>/dev/null) || return 1
        awk -v n="$1" '
                $1 == "partition" {
                        r = ""; i = ""
                        for (f = 1; f <= NF; f++) {
                                if ($f == "replicas:") r = $(f + 1)
                                if ($f == "isrs:") i = $(f + 1)
                        }
                        sub(/,$/, "", r)
                        if (("," r ",") ~ ("," n ",") && ("," i ",") !~ ("," n ","))
                                out = 1
                }
                END { exit out }' <<<"$md"
}

# Start node N (formatting its log once) without waiting for it.
kc_launch() {
        local n=$1 dir port id
        dir=$(kc_dir "$n")
        for port in "$(kc_port "$n")" "$(kc_controller_port "$n")"; do
                if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                        cq_die "port $port is taken by another process; choose another CODERQ_KAFKA_CLUSTER_PORT"
                fi
        done
        kc_config "$n"
        if [ ! -f "$KC_DIR/cluster.id" ]; then
                kafka_random_uuid >"$KC_DIR/cluster.id.tmp"
                mv "$KC_DIR/cluster.id.tmp" "$KC_DIR/cluster.id"
        fi
        id=$(cat "$KC_DIR/cluster.id")
        [ -n "$id" ] || cq_die "no cluster id in $KC_DIR/cluster.id"
        kafka_node_format "$dir" "$id"
        kafka_node_launch "$dir"
}

# Wait until node N answers (and, with "sync", is back in every ISR).
kc_wait() {
        local n=$1 what=${2:-} deadline=$((SECONDS + 120))
        while [ "$SECONDS" -lt "$deadline" ]; do
                if kc_node_ready "$n" && { [ "$what" != sync ] || kc_node_in_sync "$n"; }; then
                        return 0
                fi
                kc_pid "$n" >/dev/null ||
                        cq_die "cluster node $n exited during start; see $(kc_dir "$n")/broker.log"
                sleep 0.2
        done
        cq_die "cluster node $n was not ready in 120 s; see $(kc_dir "$n")/broker.log"
}

# The topics of KC_TOPICS, three replicas each and two in sync for a
# write; existing ones are kept as they are.
kc_create_topics() {
        /usr/bin/python3 "$CQ_ROOT/scripts/kafka/topics.py" "$(kc_brokers)" 3 2 \
                "${KC_TOPICS[@]}" >"$KC_DIR/topics.log" 2>&1 ||
                cq_die "could not create the cluster's topics; see $KC_DIR/topics.log"
}

kc_start() {
        local n started=()
        [ -f "$CQ_KAFKA_LIBS/.complete" ] || cq_die "Kafka jars missing; run scripts/setup.sh"
        mkdir -p "$KC_DIR"
        for n in "${KC_NODES[@]}"; do
                kc_node_ready "$n" && continue
                if kc_pid "$n" >/dev/null; then
                        cq_say "cluster node $n runs but does not answer; restarting it"
                        kafka_node_stop "$(kc_dir "$n")" "cluster node $n"
                fi
                kc_launch "$n"
                started+=("$n")
        done
        if [ "${#started[@]}" -gt 0 ]; then
                cq_say "starting Kafka cluster nodes ${started[*]} on $(kc_brokers)"
        fi
        for n in "${KC_NODES[@]}"; do
                kc_wait "$n"
        done
        # every node lists all three: the quorum has them registered
        local deadline=$((SECONDS + 60))
        until [ "$(kc_listed 1 | sort | tr '\n' ' ')" = "1 2 3 " ]; do
                [ "$SECONDS" -lt "$deadline" ] ||
                        cq_die "the cluster does not list its three brokers; see $KC_DIR/node*/broker.log"
                sleep 0.2
        done
        kc_create_topics
}

# Stop every node at once: one by one, the last two would wait for a
# quorum that is already gone.
kc_stop() {
        local n pid pids=() i alive
        for n in "${KC_NODES[@]}"; do
                if pid=$(kc_pid "$n"); then
                        kill -TERM "$pid" 2>/dev/null || true
                        pids+=("$pid")
                fi
        done
        [ "${#pids[@]}" -gt 0 ] || return 0
        cq_say "stopping the Kafka cluster"
        for i in $(seq 1 120); do
                alive=0
                for pid in "${pids[@]}"; do
                        if pid_alive "$pid"; then alive=1; fi
                done
                [ "$alive" -eq 1 ] || break
                sleep 0.25
        done
        for n in "${KC_NODES[@]}"; do
                kafka_node_kill "$(kc_dir "$n")"
        done
}

kc_kill() {
        kc_node_check "${1:-}"
        kc_pid "$1" >/dev/null || cq_die "cluster node $1 is not running"
        kafka_node_kill "$(kc_dir "$1")"
        cq_say "killed cluster node $1 (SIGKILL)"
}

# Start node N again and wait until it is back in every ISR it belongs to.
kc_start_node() {
        kc_node_check "${1:-}"
        if ! kc_node_ready "$1"; then
                [ -d "$(kc_dir "$1")/data" ] || cq_die "cluster node $1 was never started; run start --cluster"
                if kc_pid "$1" >/dev/null; then
                        kafka_node_stop "$(kc_dir "$1")" "cluster node $1"
                fi
                cq_say "starting cluster node $1"
                kc_launch "$1"
        fi
        kc_wait "$1" sync
}

# The node that leads partition PARTITION (default 0) of TOPIC.
kc_leader() {
        local topic=${1:-} part=${2:-0} md leader
        [ -n "$topic" ] || cq_die "usage: services.sh leader TOPIC [PARTITION]"
        md=$(kcat -b "$(kc_brokers)" -L -t "$topic" -m 5 2>/dev/null) ||
                cq_die "the cluster does not answer a metadata request"
        leader=$(awk -v p="$part," '$1 == "partition" && $2 == p { sub(/,$/, "", $4); print $4 }' <<<"$md")
        [ -n "$leader" ] && [ "$leader" -ge 1 ] 2>/dev/null ||
                cq_die "partition $part of $topic has no leader now"
        echo "$leader"
}

kc_status() {
        local n line=""
        [ -d "$KC_DIR" ] || return 0
        for n in "${KC_NODES[@]}"; do
                if kc_node_ready "$n"; then
                        line+=" node $n on 127.0.0.1:$(kc_port "$n") (pid $(kc_pid "$n"));"
                else
                        line+=" node $n stopped;"
                fi
        done
        echo "kafka cluster:${line%;}"
}

kc_env() {
        echo "export CODERQ_KAFKA_BROKERS='$(kc_brokers)'"
        echo "export CODERQ_KAFKA_CLUSTER_PORT='$KC_PORT'"
}
