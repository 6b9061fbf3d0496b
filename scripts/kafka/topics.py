#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""topics.py - create Kafka topics with a replication factor and a
min.insync.replicas of their own, through the Admin API (Debian's
python3-confluent-kafka): the single broker's jars have no topic tool.
A topic that exists already is kept as it is, and said so.

Usage: topics.py BROKERS REPLICAS MIN_ISR NAME:PARTITIONS...

Exit 0 when every topic exists with REPLICAS replicas per partition;
else 1, with the reason on stderr.
"""
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka import KafkaError


def main(argv):
    if len(argv) < 5:
        sys.stderr.write(__doc__)
        return 2
    brokers, replicas, min_isr = argv[1], int(argv[2]), argv[3]
    wanted = []
    for spec in argv[4:]:
        name, _, parts = spec.rpartition(':')
        if not name or not parts.isdigit():
            sys.stderr.write('not NAME:PARTITIONS: %s\n' % spec)
            return 2
        wanted.append((name, int(parts)))
    admin = AdminClient({'bootstrap.servers': brokers})
    topics = [NewTopic(name, parts, replicas,
                       config={'min.insync.replicas': min_isr})
              for name, parts in wanted]
    failed = False
    for name, fut in admin.create_topics(topics,
                                         operation_timeout=30).items():
        try:
            fut.result(timeout=60)
            print('created %s' % name)
        except Exception as e:  # a KafkaException, or a timeout
            err = e.args[0] if e.args else None
            if isinstance(err, KafkaError) and \
                    err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                print('kept %s (it exists)' % name)
                continue
            sys.stderr.write('could not create topic %s: %s\n' % (name, e))
            failed = True
    # a created topic reaches every broker's metadata a moment later
    deadline = time.monotonic() + 30
    while True:
        problems = check(admin, wanted, replicas)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p in problems:
        sys.stderr.write(p + '\n')
    return 1 if failed or problems else 0


def check(admin, wanted, replicas):
    """What is not as wanted yet: one line per topic or partition."""
    md = admin.list_topics(timeout=30)
    problems = []
    for name, parts in wanted:
        topic = md.topics.get(name)
        if topic is None or topic.error is not None or \
                len(topic.partitions) != parts:
            problems.append('topic %s is not there with %d partitions'
                            % (name, parts))
            continue
        for p in topic.partitions.values():
            if len(p.replicas) != replicas:
                problems.append('topic %s partition %d has %d replicas, '
                                'not %d' % (name, p.id, len(p.replicas),
                                            replicas))
    return problems


if __name__ == '__main__':
    sys.exit(main(sys.argv))
