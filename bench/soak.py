#!/usr/bin/python3
# soak.py - JOBS one-cell jobs through two `coderq worker` processes on the
# 3-broker cluster, one of them killed with SIGKILL a third of the way in
# (and started again), one broker stopped and started two thirds of the
# way in (CQ_SOAK_BROKER_RESTARTS=N: N times, evenly from a third to the
# end, to tell a step paid once from one paid at each restart). The jobs
# go in as a steady producer upstream sends them, CHUNK at a time
# whenever fewer than CHUNK / 2 are unfinished; every worker's RSS and
# open descriptors are measured every SAMPLE_S seconds (each measurement
# the medians of BURST reads over 2 s) into OUT/soak.csv and plotted into
# OUT/soak.png. The feed pauses at rest three times: after the warm-up
# (WARMUP_PCT% of the jobs), after the restarted worker's (45%), and at
# the end; each time, once nothing is in flight and REST_S has passed,
# each worker's RSS and descriptors are measured again.
# Checks that every job ends succeeded (none stuck), that each worker's
# RSS drifts less than 5% after the warm-up (the first WARMUP_PCT% of its
# samples; the median of the last quarter of the rest against the median
# of its first quarter), and that its descriptors at rest drift less than
# 5% from its first rest to its last: descriptors swing with the jobs and
# kernels in flight, which hold their sockets and pipes, so a leak shows
# at rest. Run by scripts/bench/soak.sh.
# Worker logs and job files go to TMP.
# usage: soak.py CODERQ SERVICES_SH DSN BROKERS LLM_BASE OUT TMP JOBS
import csv
import json
import os
import signal
from statistics import median
import subprocess
import sys
import time

SAMPLE_S = float(os.environ.get("CQ_SOAK_SAMPLE_S", "10"))
WARMUP_PCT = 20
SLOTS = os.environ.get("CQ_SOAK_SLOTS", "8")
STUCK_S = 600  # how long the jobs may go without one finishing
BROKER_RESTARTS = int(os.environ.get("CQ_SOAK_BROKER_RESTARTS", "1"))
CHUNK = 500
REST_S = 10  # a pause at rest: the kernel pools refill
BURST, BURST_GAP_S = 21, 0.1  # one measurement: 21 reads over 2 s


def psql(dsn, sql):
    out = subprocess.run(["psql", dsn, "-XAtqc", sql], check=True,
                         capture_output=True, text=True).stdout
    return out.strip()


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def nfds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def burst(procs):
    """One measurement of each process: the medians of BURST reads of its
    RSS and descriptors BURST_GAP_S apart. A single read catches the jobs
    in flight at one instant, each holding its interpreter's pipes and
    sockets, and swings 100 to 160 descriptors between two reads; the
    median over two seconds is the worker at its steady load."""
    reads = {name: ([], []) for name in procs}
    for i in range(BURST):
        if i:
            time.sleep(BURST_GAP_S)
        for name, p in procs.items():
            r, f = rss_kb(p.pid), nfds(p.pid)
            if r is not None and f is not None:
                reads[name][0].append(r)
                reads[name][1].append(f)
    return {name: (median(r), median(f)) for name, (r, f) in reads.items()
            if r}


class Fleet:
    def __init__(self, coderq, dsn, brokers, base, tmp, prefix):
        self.coderq, self.tmp, self.prefix = coderq, tmp, prefix
        self.env = dict(os.environ)
        self.env.update({
            "CODERQ_PG_DSN": dsn, "CODERQ_KAFKA_BROKERS": brokers,
            "CODERQ_TOPIC_JOBS": prefix + ".jobs",
            "CODERQ_TOPIC_DLQ": prefix + ".dlq",
            "CODERQ_TOPIC_RESULTS": prefix + ".results",
            "CODERQ_TOPIC_EVENTS": prefix + ".events",
            "CODERQ_KAFKA_GROUP": prefix, "CODERQ_LLM_BASE_URL": base,
            "CODERQ_LLM_MODEL": "script:soak_one", "CODERQ_SLOTS": SLOTS,
            "CODERQ_KPOOL_SIZE": SLOTS, "CODERQ_KERNEL_SERVER": "on",
            "CODERQ_LEASE_S": "30", "CODERQ_POLL_MS": "100",
            "CODERQ_LOG_LEVEL": "warn"})
        for k in ("CODERQ_LLM_API_KEY", "OPENAI_API_KEY"):
            self.env.pop(k, None)
        self.procs = {}  # name -> Popen
        self.lives = {}  # name -> processes started under it

    def start(self, name):
        life = self.lives[name] = self.lives.get(name, 0) + 1
        env = dict(self.env, CODERQ_WORKER_ID="%s-%s" % (self.prefix, name))
        log = open(os.path.join(self.tmp, "%s.%d.log" % (name, life)), "w")
        self.procs[name] = subprocess.Popen([self.coderq, "worker"], env=env,
                                            stdout=log, stderr=log)
        log.close()
        return "%s#%d" % (name, life)

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def drift(rows, key):
    """Per worker life: % change from the median of the first quarter of
    its samples after the warm-up to the median of the last quarter, or
    None when it lived too short. Medians of windows, not single samples:
    descriptors swing with the jobs in flight (each a runner's pipes and
    sockets), and a drift is a trend, not one sample's swing."""
    out = {}
    for life in sorted({r["life"] for r in rows}):
        v = [r[key] for r in rows if r["life"] == life and r[key] is not None]
        k = len(v) * WARMUP_PCT // 100
        rest = v[k:]
        q = len(rest) // 4
        if q < 3:
            continue
        a, b = median(rest[:q]), median(rest[-q:])
        out[life] = 100.0 * (b - a) / a
    return out


def rest(fleet, lives, rested, label, t):
    """Each live worker's RSS and descriptors at rest (nothing in flight,
    its kernel pool refilled): what it holds for itself, which a leak
    would raise, without the jobs in flight that swing the samples."""
    live = {n: p for n, p in fleet.procs.items() if p.poll() is None}
    for name, (rss, fds) in burst(live).items():
        rested.append({"life": lives[name], "at": label, "t": round(t, 1),
                       "rss_kb": rss, "fds": fds})


def rest_drift(rested, key):
    """Per worker life: % change from its first rest to its last, or
    None when it rested once."""
    out = {}
    for life in sorted({r["life"] for r in rested}):
        v = [r[key] for r in rested if r["life"] == life]
        if len(v) >= 2:
            out[life] = 100.0 * (v[-1] - v[0]) / v[0]
    return out


def plot(rows, path, events, rested):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for life in sorted({r["life"] for r in rows}):
        t = [r["t"] for r in rows if r["life"] == life]
        line, = ax1.plot(t, [r["rss_kb"] / 1024 for r in rows
                             if r["life"] == life], marker=".", label=life)
        ax2.plot(t, [r["fds"] for r in rows if r["life"] == life],
                 marker=".", label=life, color=line.get_color())
        at = [r for r in rested if r["life"] == life]
        if at:
            ax1.plot([r["t"] for r in at], [r["rss_kb"] / 1024 for r in at],
                     "D", color=line.get_color(), markersize=7,
                     label=life + " at rest")
            ax2.plot([r["t"] for r in at], [r["fds"] for r in at], "D",
                     color=line.get_color(), markersize=7,
                     label=life + " at rest")
    for at, what in events:
        for ax in (ax1, ax2):
            ax.axvline(at, color="grey", linestyle=":")
        ax1.annotate(what, (at, ax1.get_ylim()[1]), fontsize=8,
                     rotation=90, va="top")
    ax1.set_ylabel("worker RSS (MiB)")
    ax2.set_ylabel("open descriptors")
    ax2.set_xlabel("seconds")
    ax1.legend(fontsize=7, ncol=2)
    ax1.set_title("soak: worker RSS and descriptors every %g s, and at rest "
                  "(diamonds: nothing in flight, kernel pools full)" % SAMPLE_S,
                  fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    if len(sys.argv) != 9:
        sys.exit("usage: soak.py CODERQ SERVICES_SH DSN BROKERS LLM_BASE OUT TMP JOBS")
    coderq, services, dsn, brokers, base, out, tmp, njobs = sys.argv[1:9]
    njobs = int(njobs)
    prefix = "cqsoak-%d-%d" % (os.getpid(), int(time.time()))
    fleet = Fleet(coderq, dsn, brokers, base, tmp, prefix)
    lives = {"w1": fleet.start("w1"), "w2": fleet.start("w2")}
    jobfile = os.path.join(tmp, "jobs.jsonl")
    sent = 0

    def send(n):
        with open(jobfile, "w") as f:
            for i in range(sent, sent + n):
                jid = "%s-%06d" % (prefix, i)
                f.write(json.dumps({"job_id": jid, "run_id": prefix,
                                    "prompt": "Job %s: compute." % jid}) + "\n")
        subprocess.run([coderq, "submit", jobfile], env=fleet.env, check=True,
                       stdout=subprocess.DEVNULL)
        return n

    t0 = time.time()
    done_sql = ("SELECT count(*) FILTER (WHERE status IN ('succeeded', "
                "'failed', 'cancelled')), count(*) FILTER (WHERE status = "
                "'succeeded') FROM jobs WHERE run_id = '%s'" % prefix)
    rows, events = [], []
    # pauses at rest after the warm-up, after the restarted worker's, and
    # at the end: (life, when, rss_kb, fds)
    rests = [njobs * WARMUP_PCT // 100, njobs * 45 // 100]
    rested = []
    killed = False
    restarts = 0
    next_sample = time.time()
    last_done, last_change = 0, time.time()
    while True:
        now = time.time()
        done, ok = (int(x) for x in psql(dsn, done_sql).split("|"))
        if rests and sent >= rests[0] and done >= sent:
            # a pause at rest: nothing in flight, the pools refilled
            at = rests.pop(0)
            time.sleep(REST_S)
            rest(fleet, lives, rested, "%d jobs" % at, time.time() - t0)
            events.append((time.time() - t0, "at rest"))
            print("soak: %.0f s: at rest after %d jobs" % (time.time() - t0, at),
                  flush=True)
            last_change = time.time()
        elif (sent < njobs and sent - done < CHUNK // 2 and
              not (rests and sent >= rests[0])):
            # up to the next rest, where the feed waits for the jobs
            sent += send(min(CHUNK, njobs - sent,
                             rests[0] - sent if rests else CHUNK))
        if done != last_done:
            last_done, last_change = done, now
        if now >= next_sample:
            next_sample += SAMPLE_S
            live = {n: p for n, p in fleet.procs.items() if p.poll() is None}
            for name, (rss, fds) in burst(live).items():
                rows.append({"t": round(now - t0, 1), "life": lives[name],
                             "rss_kb": rss, "fds": fds, "done": done})
            print("soak: %.0f s: %d of %d jobs done" % (now - t0, done, njobs),
                  flush=True)
        if not killed and done >= njobs // 3:
            killed = True
            fleet.procs["w2"].kill()
            fleet.procs["w2"].wait()
            events.append((now - t0, "kill -9 w2"))
            print("soak: %.0f s: killed w2 with SIGKILL at %d jobs" % (now - t0, done),
                  flush=True)
            lives["w2"] = fleet.start("w2")
        # the k-th restart at (k + 1) / (N + 1) of the way from a third
        # to the end: two thirds for one
        at = njobs // 3 + (2 * njobs // 3) * (restarts + 1) // \
            (BROKER_RESTARTS + 1)
        if restarts < BROKER_RESTARTS and done >= at:
            restarts += 1
            events.append((now - t0, "broker 2 stopped"))
            subprocess.run([services, "kill-broker", "2"], check=True,
                           stdout=subprocess.DEVNULL)
            time.sleep(10)
            subprocess.run([services, "start-broker", "2"], check=True,
                           stdout=subprocess.DEVNULL)
            events.append((time.time() - t0, "started"))
            print("soak: %.0f s: broker 2 stopped for 10 s and started" %
                  (time.time() - t0), flush=True)
        if done >= njobs or now - last_change > STUCK_S:
            break
        time.sleep(1)
    wall = time.time() - t0
    if done >= njobs:
        time.sleep(REST_S)
        rest(fleet, lives, rested, "the end", time.time() - t0)
    fleet.stop_all()
    with open(os.path.join(out, "soak.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t", "life", "rss_kb", "fds", "done"])
        w.writeheader()
        w.writerows(rows)
    plot(rows, os.path.join(out, "soak.png"), events, rested)
    stuck = psql(dsn, "SELECT count(*) FROM jobs WHERE run_id = '%s' AND status "
                 "NOT IN ('succeeded', 'failed', 'cancelled')" % prefix)
    attempts = psql(dsn, "SELECT coalesce(max(attempts), 0) FROM jobs WHERE "
                    "run_id = '%s'" % prefix)
    rd, fd = drift(rows, "rss_kb"), drift(rows, "fds")
    rrd, rfd = rest_drift(rested, "rss_kb"), rest_drift(rested, "fds")
    for r in rested:
        print("soak: %s at rest after %s: RSS %.1f MiB, %d descriptors"
              % (r["life"], r["at"], r["rss_kb"] / 1024, r["fds"]))
    for life in sorted(set(rd) | set(rfd)):
        print("soak: %s: RSS drift %s every %g s, %s at rest; descriptors "
              "%s at rest (%s every %g s, with the jobs in flight)"
              % (life, pct(rd.get(life)), SAMPLE_S, pct(rrd.get(life)),
                 pct(rfd.get(life)), pct(fd.get(life)), SAMPLE_S))
    # the bound: RSS over the run and descriptors at rest
    held = list(rd.values()) + list(rfd.values())
    worst = max([abs(x) for x in held] or [0])
    res = {"bench": "soak", "jobs": njobs, "done": last_done, "succeeded": ok,
           "stuck": int(stuck), "wall_s": round(wall, 1),
           "jobs_per_s": round(last_done / wall, 2), "max_attempts": int(attempts),
           "rss_drift_pct": rnd(rd), "rss_rest_drift_pct": rnd(rrd),
           "fds_rest_drift_pct": rnd(rfd), "fds_inflight_drift_pct": rnd(fd),
           "at_rest": rested, "worst_drift_pct": round(worst, 2),
           "samples": len(rows)}
    print(json.dumps(res))
    sys.exit(0 if ok == njobs and int(stuck) == 0 and worst < 5 and rfd
             else 1)


def pct(v):
    return "n/a" if v is None else "%+.2f%%" % v


def rnd(d):
    return {k: round(v, 2) for k, v in d.items()}


if __name__ == "__main__":
    main()
