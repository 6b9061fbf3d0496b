#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""writer.py - a small upstream writer agent in Python, as upstream systems
use coderq: it publishes one session of subtasks to the jobs topic (an EDA
job, then two questions that continue the same kernel through
parent_job_id), waits for their completion events on the results topic,
and reads the notebooks and images from PostgreSQL.

Debian's python3-confluent-kafka and python3-psycopg; nothing else.

Usage:
  /usr/bin/python3 examples/upstream/writer.py [--session ID] [--model M]
      [--out DIR] [--timeout SECONDS] [--print-jobs]

Settings come from the same environment as coderq's:
  CODERQ_KAFKA_BROKERS     bootstrap servers (default 127.0.0.1:9092)
  CODERQ_KAFKA_PROPERTIES  a librdkafka properties file (name=value lines)
  CODERQ_KAFKA_PROP_<NAME> one property each (SASL_MECHANISM for
                           sasl.mechanism), winning over the file
  CODERQ_TOPIC_JOBS        jobs topic (default coderq.jobs)
  CODERQ_TOPIC_RESULTS     results topic (default coderq.results)
  CODERQ_PG_DSN            libpq connection string of coderq's database
so `eval "$(scripts/services.sh env --secure)"` points it at SASL_SSL and
verify-full TLS as well as at the plaintext services.

--print-jobs prints the session's job messages (one JSON object a line)
and exits: the tests validate them against schemas/job.schema.json.
Exit status: 0 when every job succeeded, 1 when one did not or the wait
timed out, 2 for bad usage or settings.
"""

import argparse
import base64
import json
import os
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(HERE), "data", "sales.csv")
ENV_PREFIX = "CODERQ_KAFKA_PROP_"


def session_jobs(session, model):
    """The subtasks of one session: eda, then ques1 and ques2 continuing
    the same kernel (each child waits until its parent succeeded, and its
    kernel replays the parent's cells first, so each job carries the
    files those cells read)."""
    with open(DATA, "rb") as fp:
        csv_b64 = base64.b64encode(fp.read()).decode("ascii")
    eda = f"{session}-eda"
    q1 = f"{session}-ques1"
    q2 = f"{session}-ques2"
    jobs = [
        {
            "job_id": eda,
            "run_id": session,
            "task_id": "eda",
            "title": "销售数据探索 (EDA)",
            "prompt": "Upstream session: explore sales.csv. Load it into a "
                      "DataFrame named df, report its shape and columns, and "
                      "plot total revenue per region as a bar chart titled "
                      "in Chinese (各地区总收入); save it as revenue_by_region.png.",
            "files": [{"name": "sales.csv", "content_b64": csv_b64}],
        },
        {
            "job_id": q1,
            "run_id": session,
            "task_id": "ques1",
            "parent_job_id": eda,
            "files": [{"name": "sales.csv", "content_b64": csv_b64}],
            "prompt": "Upstream question 1: using df from before, which "
                      "region has the highest mean units_sold? Define "
                      "best_region() returning its name.",
            # The test reads the session's df, which lives in the model's
            # kernel and is no plain data: it runs there ("judge":
            # "model"), and its verdict is counted as one the model's
            # code could have bent (docs/EVALUATION.md).
            "tests": {"kind": "code", "judge": "model",
                      "code": "assert best_region() == "
                              "df.groupby('region')['units_sold'].mean().idxmax()"},
        },
        {
            "job_id": q2,
            "run_id": session,
            "task_id": "ques2",
            "parent_job_id": q1,
            "files": [{"name": "sales.csv", "content_b64": csv_b64}],
            "prompt": "Upstream question 2: still with df, define "
                      "revenue_share(region) giving that region's share of "
                      "total revenue as a fraction.",
            # The expected value comes from the same data, as an upstream
            # writer would know it; cases compare with a tolerance.
            "tests": {"kind": "cases", "function": "revenue_share",
                      "cases": [{"args": ["north"],
                                 "expected": _share(DATA, "north")}]},
        },
    ]
    if model:
        for job in jobs:
            job["model"] = model
    return jobs


def _share(path, region):
    total = part = 0.0
    with open(path, encoding="utf-8") as fp:
        header = fp.readline().strip().split(",")
        r, rev = header.index("region"), header.index("revenue")
        for line in fp:
            cols = line.strip().split(",")
            if len(cols) != len(header):
                continue
            total += float(cols[rev])
            if cols[r] == region:
                part += float(cols[rev])
    return part / total


def kafka_config():
    """librdkafka settings as coderq takes them: the properties file, then
    CODERQ_KAFKA_PROP_<NAME> (upper case, '_' for '.')."""
    conf = {"bootstrap.servers": os.environ.get("CODERQ_KAFKA_BROKERS",
                                                "127.0.0.1:9092")}
    path = os.environ.get("CODERQ_KAFKA_PROPERTIES")
    if path:
        with open(path, encoding="utf-8") as fp:
            for n, line in enumerate(fp, 1):
                line = line.strip()
                if not line or line[0] in "#!":
                    continue
                key, sep, value = line.partition("=")
                if not sep:
                    raise SystemExit(f"{path} line {n}: expected name=value")
                conf[key.strip()] = value.strip()
    for name, value in os.environ.items():
        if name.startswith(ENV_PREFIX) and value:
            conf[name[len(ENV_PREFIX):].lower().replace("_", ".")] = value
    return conf


def publish(conf, topic, jobs):
    from confluent_kafka import Producer

    producer = Producer(dict(conf, **{"enable.idempotence": True}))
    failed = []

    def report(err, msg):
        if err is not None:
            failed.append(f"{msg.key().decode()}: {err}")

    for job in jobs:
        producer.produce(topic, key=job["job_id"],
                         value=json.dumps(job, ensure_ascii=False).encode(),
                         on_delivery=report)
    left = producer.flush(30)
    if left or failed:
        raise SystemExit("could not publish the session: "
                         + ("; ".join(failed) or f"{left} undelivered"))


def wait_events(conf, topic, ids, timeout):
    """The completion event of each id, deduplicated on job_id (the
    results topic is at least once)."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(dict(conf, **{
        "group.id": "upstream-writer-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }))
    consumer.subscribe([topic])
    events = {}
    deadline = time.monotonic() + timeout
    try:
        while len(events) < len(ids) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    print(f"results topic: {msg.error()}", file=sys.stderr)
                continue
            key = msg.key().decode() if msg.key() else ""
            if key in ids and key not in events:
                events[key] = json.loads(msg.value())
                ev = events[key]
                # a message the intake refused is answered too, with its
                # reason: no need to wait for a job that will never run
                print(f"event  {key}: {ev['status']}"
                      + (f" ({ev.get('reason')})"
                         if ev["status"] == "rejected" else ""), flush=True)
    finally:
        consumer.close()
    return events


def read_results(dsn, ids, out):
    """The notebook and images of each job, from PostgreSQL."""
    import psycopg

    summary = {}
    with psycopg.connect(dsn) as conn:
        for job_id in ids:
            row = conn.execute(
                "SELECT doc FROM notebooks WHERE job_id = %s", (job_id,)
            ).fetchone()
            notebook = row[0] if row else None
            images = conn.execute(
                "SELECT n.name, n.mime, i.data FROM images i"
                " JOIN image_names n USING (image_id) WHERE i.job_id = %s"
                " ORDER BY n.name_id", (job_id,)).fetchall()
            answer = conn.execute(
                "SELECT answer, tests_passed, tests_total FROM results"
                " WHERE job_id = %s", (job_id,)).fetchone()
            summary[job_id] = {
                "cells": sum(1 for c in (notebook or {}).get("cells", [])
                             if c.get("cell_type") == "code"),
                "images": [name for name, _, _ in images],
                "tests": None if not answer or answer[2] is None
                else f"{answer[1]}/{answer[2]}",
            }
            if out:
                d = os.path.join(out, job_id)
                os.makedirs(os.path.join(d, "images"), exist_ok=True)
                with open(os.path.join(d, "notebook.ipynb"), "w",
                          encoding="utf-8") as fp:
                    json.dump(notebook, fp, ensure_ascii=False, indent=1)
                for name, _, data in images:
                    with open(os.path.join(d, "images",
                                           os.path.basename(name)), "wb") as fp:
                        fp.write(bytes(data))
    return summary


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--session", default="upstream-" + uuid.uuid4().hex[:8])
    ap.add_argument("--model", default=None,
                    help="model of every job (default: the worker's)")
    ap.add_argument("--out", default=None,
                    help="write each job's notebook and images here")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--print-jobs", action="store_true")
    args = ap.parse_args(argv[1:])

    jobs = session_jobs(args.session, args.model)
    if args.print_jobs:
        for job in jobs:
            print(json.dumps(job, ensure_ascii=False))
        return 0
    dsn = os.environ.get("CODERQ_PG_DSN")
    if not dsn:
        print("writer.py: CODERQ_PG_DSN is not set", file=sys.stderr)
        return 2
    conf = kafka_config()
    ids = [job["job_id"] for job in jobs]
    publish(conf, os.environ.get("CODERQ_TOPIC_JOBS", "coderq.jobs"), jobs)
    print(f"published {len(jobs)} jobs of session {args.session}", flush=True)
    events = wait_events(conf, os.environ.get("CODERQ_TOPIC_RESULTS",
                                              "coderq.results"),
                         set(ids), args.timeout)
    missing = [i for i in ids if i not in events]
    if missing:
        print(f"writer.py: no completion event for {', '.join(missing)} "
              f"within {args.timeout:g} s", file=sys.stderr)
        return 1
    rejected = [i for i in ids if events[i]["status"] == "rejected"]
    for job_id in rejected:
        print(f"job    {job_id}: rejected: {events[job_id].get('reason')}",
              file=sys.stderr)
    ids = [i for i in ids if i not in rejected]
    summary = read_results(dsn, ids, args.out)
    ok = not rejected
    for job_id in ids:
        ev, s = events[job_id], summary[job_id]
        ok = ok and ev["status"] == "succeeded"
        print(f"job    {job_id}: {ev['status']}, tests {s['tests'] or '-'}, "
              f"{s['cells']} cells, images {', '.join(s['images']) or '-'}; "
              f"answer: {(ev.get('answer') or '').splitlines()[0][:80] if ev.get('answer') else '-'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
