#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""eval_run.py - drives one evaluation run for `scripts/bench.sh eval`:
the fake LLM serving the problem set's scripts, WORKERS `coderq worker`
processes on topics of their own, one warm-up job (it creates the jobs
topic, and the workers' kernel pools fill meanwhile), then the whole
problem set submitted through Kafka with `coderq submit`, followed in
PostgreSQL until every job finished.

Measured between the submit and the last finished job:
  - jobs/s sustained: over the middle 80% of the jobs by finish time
    ((the 90th - the 10th percentile job) / their time apart), and over
    the whole batch (jobs / first submit to last finish);
  - CPU seconds per job: user + system time of every process involved,
    from /proc/<pid>/stat (utime, stime, cutime, cstime) of each process
    tree, read before and after: the workers with their kernels, the
    PostgreSQL server with its backends, the Kafka broker, the fake LLM;
    the sandboxed kernels, followed one by one (see Cpu); and `coderq
    submit` (its rusage). Following the run (one psql session) is left
    out;
  - fidelity: right answers passed % (succeeded with every test passed)
    and wrong answers passed % (succeeded at all).
A job finished from memory, or fidelity other than 100 and 0, fails the
run (exit 1). Last line: JSON.

Usage (see scripts/bench/eval.sh):
  eval_run.py --coderq BIN --dsn DSN --brokers HOST:PORT --pg-port N
      --kafka-port N --dir DIR --run RUN --prefix P [--workers 2]
      [--slots 2] [--sandbox auto] [--timeout 1800] [--report DIR]
"""

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def say(msg):
    print(msg, flush=True)


def psql(dsn, sql):
    out = subprocess.run(["psql", dsn, "-XAtq", "-F", "\t", "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


class Session:
    """One psql process and one server backend for the polling, so that
    following the run costs no connection (and no backend fork) per look;
    its CPU is left out of the figures."""

    def __init__(self, dsn):
        self.p = subprocess.Popen(["psql", dsn, "-XAtq", "-F", "\t"],
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def query(self, sql):
        self.p.stdin.write(sql + ";\n\\echo __eval_end__\n")
        self.p.stdin.flush()
        rows = []
        for line in self.p.stdout:
            line = line.rstrip("\n")
            if line == "__eval_end__":
                return rows
            rows.append(line.split("\t"))
        sys.exit("eval: psql exited")

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def listening_pids(port):
    out = subprocess.run(["ss", "-ltnpH", f"( sport = :{port} )"],
                         capture_output=True, text=True).stdout
    return sorted({int(p) for p in re.findall(r"pid=(\d+)", out)})


def proc_table():
    """pid -> (ppid, start time, own ticks, ticks of reaped children)."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2:].split()
        # [1] ppid; [11] utime, [12] stime, [13] cutime, [14] cstime;
        # [19] start time
        table[int(d)] = (int(fields[1]), int(fields[19]),
                         int(fields[11]) + int(fields[12]),
                         int(fields[13]) + int(fields[14]))
    return table


def in_child_pid_ns(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) > 2
    except OSError:
        pass
    return False


class Cpu:
    """CPU time of process trees, from /proc. Linux adds a child's time
    to its parent's when the parent reaps it, so a tree's time is its live
    processes' time plus what they reaped: exact for PostgreSQL and its
    backends, the broker, the fake LLM, and unsandboxed kernels. Not for a
    sandboxed kernel: its sandbox is torn down by SIGKILLing the init of
    its pid namespace, and the time of the processes that init then reaps
    is dropped. So processes in a child pid namespace are followed one by
    one and count with their own time at the last look (look() runs at
    every poll): what such a kernel spends in its last poll interval
    before the kill is not counted."""

    def __init__(self, roots):
        self.roots = roots  # name -> pids
        self.ns = {}  # (pid, start) -> in a child pid namespace
        self.last = {}  # (pid, start) -> own ticks, namespaced processes

    def look(self):
        table = proc_table()
        self.sums = {}
        children = collections.defaultdict(list)
        for pid, row in table.items():
            children[row[0]].append(pid)
        for name, pids in self.roots.items():
            own = below = 0
            seen, stack = set(), [(r, True) for r in pids]
            while stack:
                pid, root = stack.pop()
                if pid in seen or pid not in table:
                    continue
                seen.add(pid)
                _, start, ticks, reaped = table[pid]
                key = (pid, start)
                if key not in self.ns:
                    self.ns[key] = not root and in_child_pid_ns(pid)
                if self.ns[key]:
                    self.last[key] = ticks
                elif root:
                    own += ticks
                    below += reaped
                else:
                    below += ticks + reaped
                stack.extend((c, False) for c in children[pid])
            self.sums[name] = (own / CLK_TCK, below / CLK_TCK)
        return dict(self.sums), dict(self.last)


def percentile_rate(times):
    """Jobs per second over the middle 80% of the sorted finish times."""
    n = len(times)
    lo, hi = int(0.1 * n), max(int(0.9 * n) - 1, int(0.1 * n) + 1)
    hi = min(hi, n - 1)
    span = times[hi] - times[lo]
    return (hi - lo) / span if span > 0 else float("nan")


def coderq_env(a, llm_url):
    """The environment of the run's coderq commands: the run's database
    and topics, the LLM at llm_url, no key, no memory scope."""
    env = dict(os.environ)
    for k in ("CODERQ_LLM_API_KEY", "OPENAI_API_KEY",
              "CODERQ_LLM_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY",
              "CODERQ_MEMORY_SCOPE", "CODERQ_LLM_PROVIDER",
              "CODERQ_LLM_MODEL", "CODERQ_BACKEND"):
        env.pop(k, None)
    env.update({
        "CODERQ_PG_DSN": a.dsn, "CODERQ_KAFKA_BROKERS": a.brokers,
        "CODERQ_TOPIC_JOBS": a.prefix + ".jobs",
        "CODERQ_TOPIC_DLQ": a.prefix + ".dlq",
        "CODERQ_TOPIC_RESULTS": a.prefix + ".results",
        "CODERQ_TOPIC_EVENTS": a.prefix + ".events",
        "CODERQ_KAFKA_GROUP": a.prefix,
        "CODERQ_LLM_BASE_URL": llm_url,
        "CODERQ_SLOTS": str(a.slots),
        "CODERQ_SANDBOX": a.sandbox,
        "CODERQ_LOG_LEVEL": "info",
    })
    return env


def start_workers(a, env, procs):
    """a.workers `coderq worker` processes, logging to DIR/worker-N.log;
    also appended to procs."""
    workers = []
    for w in range(a.workers):
        wenv = dict(env, CODERQ_WORKER_ID=f"{a.prefix}-w{w}")
        p = subprocess.Popen(
            [a.coderq, "worker"], env=wenv, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(a.dir, f"worker-{w}.log"), "w"))
        procs.append(p)
        workers.append(p)
    return workers


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    for a in ("--coderq", "--dsn", "--brokers", "--dir", "--run", "--prefix"):
        ap.add_argument(a, required=True)
    ap.add_argument("--pg-port", type=int, required=True)
    ap.add_argument("--kafka-port", type=int, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--sandbox", default="auto")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--report")
    a = ap.parse_args()

    with open(os.path.join(a.dir, "answers.json")) as f:
        answers = json.load(f)
    n = len(answers)
    procs = []

    try:
        port_file = os.path.join(a.dir, "llm.port")
        llm = subprocess.Popen(
            ["/usr/bin/python3", os.path.join(ROOT, "tests/fakes/fake_llm.py"),
             "--scripts", os.path.join(a.dir, "scripts"), "--port-file",
             port_file, "--no-record"],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(a.dir, "llm.log"), "w"))
        procs.append(llm)
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read()):
            if time.monotonic() > deadline or llm.poll() is not None:
                sys.exit("eval: the fake LLM did not start")
            time.sleep(0.05)
        port = int(open(port_file).read())

        env = coderq_env(a, f"http://127.0.0.1:{port}/v1")
        env.update({"CODERQ_KPOOL_SIZE": str(a.slots),
                    "CODERQ_KERNEL_STARTUP_TIMEOUT_S": "300"})

        # The warm-up job creates the jobs topic before any worker
        # subscribes to it, and runs once through everything.
        warm = {"job_id": a.run + "-warmup", "run_id": a.run + "-warmup",
                "prompt": "Define warm(x) returning x + 1.",
                "model": "script:warmup",
                "tests": {"kind": "cases", "function": "warm",
                          "cases": [{"args": [1], "expected": 2}]}}
        with open(os.path.join(a.dir, "scripts", "warmup.json"), "w") as f:
            json.dump([{"tool_calls": [{"code":
                                        "def warm(x):\n    return x + 1"}]},
                       {"content": "done"}], f)
        with open(os.path.join(a.dir, "warmup.jsonl"), "w") as f:
            f.write(json.dumps(warm) + "\n")
        subprocess.run([a.coderq, "submit",
                        os.path.join(a.dir, "warmup.jsonl")],
                       env=env, check=True, stdout=subprocess.DEVNULL)

        workers = start_workers(a, env, procs)

        say(f"waiting for the warm-up job and {a.workers} workers' kernel "
            f"pools")
        deadline = time.monotonic() + 600
        while True:
            if any(p.poll() is not None for p in workers):
                sys.exit(f"eval: a worker exited; see {a.dir}/worker-*.log")
            if time.monotonic() > deadline:
                sys.exit("eval: the warm-up job did not finish in 600 s")
            done = psql(a.dsn, "SELECT status FROM jobs WHERE job_id = '"
                        + warm["job_id"] + "'")
            table = proc_table()
            kids = [sum(1 for q in table.values() if q[0] == p.pid)
                    for p in workers]
            if done and done[0][0] in ("succeeded", "failed") and \
                    min(kids) >= a.slots:
                break
            time.sleep(0.2)
        if done[0][0] != "succeeded":
            sys.exit("eval: the warm-up job failed: "
                     + str(psql(a.dsn, "SELECT reason FROM jobs WHERE "
                                "job_id = '" + warm["job_id"] + "'")))

        roots = {
            "workers": [p.pid for p in workers],
            "postgres": listening_pids(a.pg_port),
            "kafka": listening_pids(a.kafka_port),
            "fake llm": [llm.pid],
        }
        for k, v in roots.items():
            if not v:
                sys.exit(f"eval: no process found for {k}")
        session = Session(a.dsn)
        cpu_meter = Cpu(roots)
        before, ns_before = cpu_meter.look()
        t0 = time.time()
        sub = subprocess.Popen([a.coderq, "submit",
                                os.path.join(a.dir, "jobs.jsonl")], env=env,
                               stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(sub.pid, 0)
        sub.returncode = os.waitstatus_to_exitcode(status)
        if sub.returncode != 0:
            sys.exit(f"eval: coderq submit exited {sub.returncode}")
        submit_cpu = usage.ru_utime + usage.ru_stime
        say(f"{n} jobs submitted in {time.time() - t0:.1f} s; following "
            f"them in PostgreSQL")
        deadline = time.monotonic() + a.timeout
        last = -1
        while True:
            cpu_meter.look()
            row = session.query("SELECT count(*) FILTER (WHERE finished_at "
                                "IS NOT NULL), count(*) FROM jobs WHERE "
                                "run_id = '" + a.run + "'")[0]
            finished = int(row[0])
            if finished >= n:
                break
            if any(p.poll() is not None for p in workers):
                sys.exit(f"eval: a worker exited; see {a.dir}/worker-*.log")
            if time.monotonic() > deadline:
                sys.exit(f"eval: {finished} of {n} jobs finished after "
                         f"{a.timeout} s")
            if finished // 50 != last // 50:
                say(f"  {finished}/{n} finished after "
                    f"{time.time() - t0:.0f} s")
            last = finished
            time.sleep(0.2)
        after, ns_after = cpu_meter.look()
        t1 = time.time()
        session.close()
    finally:
        stop_all(procs)

    cpu = {k: (after[k][0] - before[k][0], after[k][1] - before[k][1])
           for k in roots}
    sandboxed = sum(v - ns_before.get(k, 0)
                    for k, v in ns_after.items()) / CLK_TCK
    total = sum(o + b for o, b in cpu.values()) + sandboxed + submit_cpu

    rows = psql(a.dsn, "SELECT o.job_id, o.status, COALESCE(o.tests_passed, "
                "-1), COALESCE(o.tests_total, -1), o.from_memory, "
                "COALESCE(o.reason, ''), extract(epoch FROM o.finished_at), "
                "COALESCE((SELECT r.report->>'sandbox' FROM results r WHERE "
                "r.job_id = o.job_id), '') FROM job_overview o WHERE "
                "o.run_id = '" + a.run + "'")
    finish = sorted(float(r[6]) for r in rows)
    right = [r for r in rows if answers.get(r[0]) == "right"]
    wrong = [r for r in rows if answers.get(r[0]) == "wrong"]
    passed = lambda r: (r[1] == "succeeded" and int(r[3]) > 0
                        and r[2] == r[3])
    right_pct = 100.0 * sum(passed(r) for r in right) / max(len(right), 1)
    wrong_pct = 100.0 * sum(r[1] == "succeeded" for r in wrong) / \
        max(len(wrong), 1)
    memory = [r[0] for r in rows if r[4] == "t"]
    sandboxes = collections.Counter(r[7] or "-" for r in rows)
    reasons = collections.Counter(r[5].split(":")[0][:60] or "-"
                                  for r in wrong)
    sustained = percentile_rate(finish)
    overall = n / (finish[-1] - t0)

    say(f"jobs: {len(rows)} ({len(right)} answered right, {len(wrong)} "
        f"wrong); sandbox: "
        + ", ".join(f"{k} {v}" for k, v in sandboxes.items()))
    say(f"right answers passed: {right_pct:.1f}%; wrong answers passed: "
        f"{wrong_pct:.1f}%; wrong answers failed with: "
        + ", ".join(f"{k} ({v})" for k, v in reasons.most_common(4)))
    for r in right:
        if not passed(r):
            say(f"  right answer not passed: {r[0]} {r[1]} {r[2]}/{r[3]} "
                f"{r[5][:200]}")
    for r in wrong:
        if r[1] == "succeeded":
            say(f"  wrong answer passed: {r[0]} {r[2]}/{r[3]}")
    say(f"throughput: {sustained:.3f} jobs/s sustained (middle 80% of "
        f"finishes), {overall:.3f} jobs/s over the batch ({t1 - t0:.1f} s "
        f"from submit to the last finish, {a.workers} workers x {a.slots} "
        f"slots)")
    say(f"CPU: {total:.1f} s for {n} jobs, {total / n:.3f} s per job: "
        + "; ".join(f"{k} {o + b:.1f} s (own {o:.1f}, children {b:.1f})"
                    for k, (o, b) in cpu.items())
        + f"; sandboxed kernels {sandboxed:.1f} s; coderq submit "
        f"{submit_cpu:.1f} s (children: unsandboxed kernels and sandbox "
        "monitors of the workers, backends of PostgreSQL)")

    if a.report:
        rep = subprocess.run([a.coderq, "report", "--run", a.run, "--out",
                              a.report], env=env, capture_output=True,
                             text=True)
        say(f"report: {rep.stdout.strip() or rep.stderr.strip()}")

    ok = right_pct == 100.0 and wrong_pct == 0.0 and not memory and \
        len(rows) == n
    if memory:
        say(f"jobs finished from memory: {len(memory)} (memory must be off)")
    print(json.dumps({"bench": "eval", "jobs_per_s": round(sustained, 3),
                      "cpu_s_per_job": round(total / n, 3),
                      "right_passed_pct": round(right_pct, 1),
                      "wrong_passed_pct": round(wrong_pct, 1)},
                     separators=(",", ":")))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
