# shellcheck shell=bash
# pg-pair.sh - a PostgreSQL primary and its synchronous streaming standby,
# for the tests of failover (sourced by services.sh: start --pg-standby,
# stop --pg-standby, env --pg-standby, pg-failover, pg-rebuild). A pair of
# its own beside the main server, which stays as it is: a failover drill
# must not take down the server every other suite uses, and a synchronous
# standby makes each commit of its primary wait for it.
#
# Two nodes, a and b, on CODERQ_PG_PAIR_PORT and the next port; either may
# be the primary ($PP_DIR/primary says which). The standby is a
# pg_basebackup of the primary, streaming through a replication slot, and
# named in the primary's synchronous_standby_names: a commit returns once
# the standby has flushed it. pg-failover stops the primary with -m
# immediate and promotes the standby; pg-rebuild (or the next start) makes
# the old primary a fresh standby of the new one.

PP_DIR=$CQ_RUN_DIR/pg-pair
PP_PORT=${CODERQ_PG_PAIR_PORT:-25434}

pp_port() { if [ "$1" = a ]; then echo "$PP_PORT"; else echo $((PP_PORT + 1)); fi; }
pp_other() { if [ "$1" = a ]; then echo b; else echo a; fi; }
pp_data() { echo "$PP_DIR/$1/data"; }
pp_admin() { echo "postgresql://postgres@127.0.0.1:$(pp_port "$1")/postgres"; }

pp_primary() {
        local p
        p=$(cat "$PP_DIR/primary" 2>/dev/null || echo a)
        [ "$p" = b ] && echo b || echo a
}

# Both hosts; libpq takes the first that accepts writes.
pp_dsn() {
        echo "postgresql://coderq@127.0.0.1:$(pp_port a),127.0.0.1:$(pp_port b)/coderq?target_session_attrs=read-write&connect_timeout=5"
}

pp_running() {
        [ -f "$(pp_data "$1")/postmaster.pid" ] &&
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$1")" status >/dev/null 2>&1
}

pp_sql() { psql "$(pp_admin "$1")" -XAtqc "$2"; }

# pp_role_conf NODE TEXT: the settings that make NODE primary or standby
# (coderq-role.conf, included last by postgresql.conf); prints "changed"
# when they changed.
pp_role_conf() {
        local conf
        conf="$(pp_data "$1")/coderq-role.conf"
        if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$2" ]; then
                printf '%s\n' "$2" >"$conf"
                chown "$PG_USER:" "$conf"
                echo changed
        fi
}

pp_start_node() {
        local node=$1 port
        port=$(pp_port "$node")
        pp_running "$node" && return 0
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                cq_die "port $port is taken by another process; choose another CODERQ_PG_PAIR_PORT"
        fi
        pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$node")" -l "$PP_DIR/$node.log" \
                -o "-p $port" -w -t 60 start >/dev/null ||
                cq_die "PostgreSQL node $node did not start; see $PP_DIR/$node.log"
}

pp_stop_node() {
        pp_running "$1" || return 0
        pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$1")" -m "$2" -w -t 60 \
                stop >/dev/null 2>&1 ||
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$1")" -m immediate \
                        -w stop >/dev/null 2>&1 || true
}

# A fresh primary: initdb, the role and database of coderq.
pp_init() {
        local node=$1 data
        data=$(pp_data "$node")
        cq_say "initialising the PostgreSQL pair's primary in $data"
        rm -rf "$PP_DIR/$node"
        pg_as mkdir -p "$data"
        pg_as "$CQ_PG_BIN/initdb" -D "$data" -U postgres -A trust -E UTF8 \
                --locale=C.UTF-8 >/dev/null
        # initdb's pg_hba.conf already trusts replication on loopback
        cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PP_DIR/sock'
max_connections = 100
shared_buffers = 32MB
log_min_messages = warning
wal_level = replica
max_wal_senders = 5
max_replication_slots = 5
hot_standby = on
include_if_exists = 'coderq-role.conf'
CONF
        echo "$node" >"$PP_DIR/primary"
        pp_start_node "$node"
        pg_bootstrap "$(pp_port "$node")"
}

# Whether NODE is set up to stream from PRIMARY.
pp_is_standby_of() {
        local data
        data=$(pp_data "$1")
        [ -f "$data/standby.signal" ] &&
                grep -q "port=$(pp_port "$2") " "$data/coderq-role.conf" 2>/dev/null
}

# pp_rebuild NODE PRIMARY: NODE becomes a fresh base backup of PRIMARY,
# streaming through the slot coderq_NODE.
pp_rebuild() {
        local node=$1 primary=$2 data
        data=$(pp_data "$node")
        cq_say "making node $node a standby of node $primary (pg_basebackup)"
        pp_stop_node "$node" immediate
        rm -rf "$PP_DIR/$node"
        pg_as mkdir -p "$PP_DIR/$node"
        pp_sql "$primary" "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = 'coderq_$node'" >/dev/null
        pp_sql "$primary" "select pg_create_physical_replication_slot('coderq_$node')" >/dev/null
        pg_as "$CQ_PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$(pp_port "$primary")" \
                -U postgres -D "$data" -X stream -c fast -S "coderq_$node" \
                >"$PP_DIR/basebackup.log" 2>&1 ||
                cq_die "pg_basebackup failed; see $PP_DIR/basebackup.log"
        pp_role_conf "$node" "primary_conninfo = 'host=127.0.0.1 port=$(pp_port "$primary") user=postgres application_name=coderq_$node'
primary_slot_name = 'coderq_$node'" >/dev/null
        pg_as touch "$data/standby.signal"
}

# The primary waits for NODE at each commit; returns once NODE streams as
# the synchronous standby. remote_apply, not just the flush that makes a
# commit durable: a database created on the primary is there on the
# standby too when CREATE DATABASE returns, and libpq, which tries the
# hosts of the DSN in order, gives up at a host without the database
# instead of going on to the next.
pp_sync_on() {
        local primary=$1 node=$2 i state=""
        if [ -n "$(pp_role_conf "$primary" "synchronous_standby_names = 'coderq_$node'
synchronous_commit = remote_apply")" ]; then
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$primary")" reload >/dev/null
        fi
        for i in $(seq 1 300); do
                state=$(pp_sql "$primary" "select state || ' ' || sync_state from pg_stat_replication where application_name = 'coderq_$node'" 2>/dev/null) || true
                [ "$state" = "streaming sync" ] && return 0
                sleep 0.2
        done
        cq_die "node $node does not stream as the synchronous standby (\"$state\"); see $PP_DIR/$node.log"
}

# pp_start [rebuild]: the primary, then its standby (rebuilt when it is
# not one, or when asked), in sync.
pp_start() {
        local p s
        [ -n "$CQ_PG_BIN" ] || cq_die "PostgreSQL server binaries not found; run scripts/setup.sh"
        pg_prepare_dir "$PP_DIR" -pair
        pg_as mkdir -p "$PP_DIR/sock"
        p=$(pp_primary)
        s=$(pp_other "$p")
        [ -f "$(pp_data "$p")/PG_VERSION" ] || pp_init "$p"
        [ ! -f "$(pp_data "$p")/standby.signal" ] ||
                cq_die "node $p should be the primary but is a standby; remove $PP_DIR to start afresh"
        cq_say "PostgreSQL pair: primary $p on 127.0.0.1:$(pp_port "$p")"
        pp_start_node "$p"
        if [ "${1:-}" = rebuild ] || ! pp_is_standby_of "$s" "$p"; then
                pp_rebuild "$s" "$p"
        fi
        cq_say "PostgreSQL pair: standby $s on 127.0.0.1:$(pp_port "$s")"
        pp_start_node "$s"
        pp_sync_on "$p" "$s"
}

pp_stop() {
        local p
        [ -d "$PP_DIR" ] || return 0
        p=$(pp_primary)
        if pp_running a || pp_running b; then
                cq_say "stopping the PostgreSQL pair"
        fi
        pp_stop_node "$p" fast
        pp_stop_node "$(pp_other "$p")" fast
}

# Stop the primary as a crash would (-m immediate: no shutdown
# checkpoint, clients cut off), promote the standby, and wait until the
# pair's DSN reaches a server that takes writes.
pp_failover() {
        local p s t0 i ms
        p=$(pp_primary)
        s=$(pp_other "$p")
        pp_running "$p" && pp_running "$s" || cq_die "the PostgreSQL pair is not running; run start --pg-standby"
        [ "$(pp_sql "$p" "select sync_state from pg_stat_replication where application_name = 'coderq_$s'")" = sync ] ||
                cq_die "node $s is not a synchronous standby now"
        t0=$(date +%s%3N)
        pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$p")" -m immediate -w stop >/dev/null
        pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$s")" -w -t 60 promote >/dev/null ||
                cq_die "could not promote node $s; see $PP_DIR/$s.log"
        echo "$s" >"$PP_DIR/primary"
        # the new primary has no standby: a commit must not wait for one
        if [ -n "$(pp_role_conf "$s" "")" ]; then
                pg_as "$CQ_PG_BIN/pg_ctl" -D "$(pp_data "$s")" reload >/dev/null
        fi
        for i in $(seq 1 300); do
                [ "$(psql "$(pp_dsn)" -XAtqc 'select pg_is_in_recovery()' 2>/dev/null)" = f ] && break
                sleep 0.1
        done
        ms=$(($(date +%s%3N) - t0))
        cq_say "node $p stopped (immediate), node $s promoted: writes accepted after $ms ms"
}

pp_status() {
        local n line="" role
        [ -d "$PP_DIR" ] || return 0
        for n in a b; do
                if ! pp_running "$n"; then
                        line+=" $n stopped;"
                        continue
                fi
                role=primary
                [ "$(pp_sql "$n" 'select pg_is_in_recovery()' 2>/dev/null)" = t ] && role=standby
                line+=" $n $role on 127.0.0.1:$(pp_port "$n");"
        done
        echo "postgresql pair:${line%;}"
}

pp_env() {
        echo "export CODERQ_PG_DSN='$(pp_dsn)'"
        echo "export CODERQ_PG_PAIR_PORT='$PP_PORT'"
}
