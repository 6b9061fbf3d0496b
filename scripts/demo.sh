#!/usr/bin/env bash
# demo.sh - what coderq can do so far, end to end on this machine: install
# (setup.sh), start PostgreSQL and Kafka (services.sh), build coderq
# (Release, build/), run `coderq doctor`, and a short smoke of what exists:
# a job-shaped message through the real Kafka broker and a row through
# PostgreSQL. The worker pipeline (intake, job queue, agent loop,
# notebooks) is added by later work and extends this script.
#
# Options:
#   --stop     stop the services at the end (default: leave them running)
#   -h|--help  this text
set -euo pipefail
. "$(dirname "$0")/lib.sh"

stop=0
for arg in "$@"; do
        case $arg in
        --stop) stop=1 ;;
        -h | --help)
                sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
                exit 0
                ;;
        *)
                echo "usage: $0 [--stop]" >&2
                exit 2
                ;;
        esac
done
[ "$stop" -eq 1 ] && trap 'cq_services stop' EXIT

step() { printf '\n### %s\n' "$*"; }

step "1/6 setup: Debian packages and the Kafka $CQ_KAFKA_VERSION jars"
"$CQ_ROOT/scripts/setup.sh"

step "2/6 services: PostgreSQL and Kafka on loopback"
cq_services start
eval "$("$CQ_ROOT/scripts/services.sh" env)"
echo "CODERQ_PG_DSN=$CODERQ_PG_DSN"
echo "CODERQ_KAFKA_BROKERS=$CODERQ_KAFKA_BROKERS"

step "3/6 build: Release into build/"
cq_build "$CQ_ROOT/build" Release
coderq=$CQ_ROOT/build/coderq
"$coderq" --version

step "4/6 coderq doctor"
"$coderq" doctor

step "5/6 coderq config (the effective settings; secrets hidden)"
"$coderq" config

step "6/6 smoke: a job-shaped message through Kafka, a row through PostgreSQL"
topic=coderq.demo.$(date +%s)
job='{"job_id":"demo-1","prompt":"print the first 10 squares"}'
printf 'demo-1\t%s\n' "$job" |
        kcat -b "$CODERQ_KAFKA_BROKERS" -P -t "$topic" -K "\t" -X enable.idempotence=true -X log_level=3
got=$(kcat -b "$CODERQ_KAFKA_BROKERS" -C -t "$topic" -o beginning -c 1 -e \
        -f '%k\t%s\n' -m 10 2>/dev/null)
echo "kafka: produced to and consumed from $topic: $got"
[ "$got" = "demo-1	$job" ] || cq_die "the message read back differs"
row=$(psql "$CODERQ_PG_DSN" -XAtq -v job="$job" <<'SQL'
CREATE TEMP TABLE demo_jobs (job_id text PRIMARY KEY, spec jsonb NOT NULL);
INSERT INTO demo_jobs SELECT (:'job'::jsonb)->>'job_id', :'job'::jsonb
ON CONFLICT (job_id) DO NOTHING;
INSERT INTO demo_jobs SELECT (:'job'::jsonb)->>'job_id', :'job'::jsonb
ON CONFLICT (job_id) DO NOTHING;
SELECT count(*) || ' row, prompt: ' || (spec->>'prompt') FROM demo_jobs GROUP BY spec;
SQL
)
echo "postgresql: the same job upserted twice gives $row"
[ "$row" = "1 row, prompt: print the first 10 squares" ] ||
        cq_die "unexpected PostgreSQL result: $row"

cat <<EOF_DONE

Ran: setup.sh, services.sh start, a Release build, coderq doctor, coderq
config, one message produced to and consumed from the real Kafka broker
(topic $topic), and an idempotent upsert in PostgreSQL. That is all that
exists so far: the worker pipeline (Kafka intake, the PostgreSQL job
queue, the LLM agent loop with Jupyter kernels, notebooks and completion
events) comes in later work. The services are $( [ "$stop" -eq 1 ] && echo "stopped now" || echo "still running: scripts/services.sh stop")
EOF_DONE
