#!/usr/bin/python3
# soak.py - JOBS one-cell jobs through two `coderq worker` processes on the
# 3-broker cluster, one of them killed with SIGKILL a third of the way in
# (and started again), one broker stopped and started two thirds of the
# way in (CQ_SOAK_BROKER_RESTARTS=N: N times, evenly from a third to the
# end, to tell a step paid once from one paid at each restart). The jobs go in as a steady producer upstream sends them, CHUNK
# at a time whenever fewer than CHUNK / 2 are unfinished; every worker's RSS and open descriptors sampled every
# SAMPLE_S seconds into OUT/soak.csv and plotted into OUT/soak.png.
# Checks that every job ends succeeded (none stuck) and that each
# worker's RSS and descriptors drift less than 5% after the warm-up (the
# first WARMUP_PCT% of its samples; the mean of its last 3 samples against
# the mean of the 3 after the warm-up). Run by scripts/bench/soak.sh.
# Worker logs and job files go to TMP.
# usage: soak.py CODERQ SERVICES_SH DSN BROKERS LLM_BASE OUT TMP JOBS
import csv
import json
import os
import signal
import subprocess
import sys
import time

SAMPLE_S = float(os.environ.get("CQ_SOAK_SAMPLE_S", "10"))
WARMUP_PCT = 20
SLOTS = os.environ.get("CQ_SOAK_SLOTS", "8")
STUCK_S = 600  # how long the jobs may go without one finishing
BROKER_RESTARTS = int(os.environ.get("CQ_SOAK_BROKER_RESTARTS", "1"))
CHUNK = 500


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
    """Per worker life: % change from the 3 samples after the warm-up to
    the last 3, or None when it lived too short."""
    out = {}
    for life in sorted({r["life"] for r in rows}):
        v = [r[key] for r in rows if r["life"] == life and r[key] is not None]
        k = len(v) * WARMUP_PCT // 100
        if len(v) - k < 6:
            continue
        a, b = sum(v[k:k + 3]) / 3, sum(v[-3:]) / 3
        out[life] = 100.0 * (b - a) / a
    return out


def plot(rows, path, events):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for life in sorted({r["life"] for r in rows}):
        t = [r["t"] for r in rows if r["life"] == life]
        ax1.plot(t, [r["rss_kb"] / 1024 for r in rows if r["life"] == life],
                 marker=".", label=life)
        ax2.plot(t, [r["fds"] for r in rows if r["life"] == life],
                 marker=".", label=life)
    for at, what in events:
        for ax in (ax1, ax2):
            ax.axvline(at, color="grey", linestyle=":")
        ax1.annotate(what, (at, ax1.get_ylim()[1]), fontsize=8,
                     rotation=90, va="top")
    ax1.set_ylabel("worker RSS (MiB)")
    ax2.set_ylabel("open descriptors")
    ax2.set_xlabel("seconds")
    ax1.legend(fontsize=8)
    ax1.set_title("soak: worker RSS and descriptors every %g s" % SAMPLE_S)
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
    killed = False
    restarts = 0
    next_sample = time.time()
    last_done, last_change = 0, time.time()
    while True:
        now = time.time()
        done, ok = (int(x) for x in psql(dsn, done_sql).split("|"))
        if sent < njobs and sent - done < CHUNK // 2:
            sent += send(min(CHUNK, njobs - sent))
        if done != last_done:
            last_done, last_change = done, now
        if now >= next_sample:
            next_sample += SAMPLE_S
            for name, p in fleet.procs.items():
                if p.poll() is None:
                    rows.append({"t": round(now - t0, 1), "life": lives[name],
                                 "rss_kb": rss_kb(p.pid), "fds": nfds(p.pid),
                                 "done": done})
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
    fleet.stop_all()
    with open(os.path.join(out, "soak.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t", "life", "rss_kb", "fds", "done"])
        w.writeheader()
        w.writerows(rows)
    plot(rows, os.path.join(out, "soak.png"), events)
    stuck = psql(dsn, "SELECT count(*) FROM jobs WHERE run_id = '%s' AND status "
                 "NOT IN ('succeeded', 'failed', 'cancelled')" % prefix)
    attempts = psql(dsn, "SELECT coalesce(max(attempts), 0) FROM jobs WHERE "
                    "run_id = '%s'" % prefix)
    rd, fd = drift(rows, "rss_kb"), drift(rows, "fds")
    worst = max([abs(x) for x in list(rd.values()) + list(fd.values())] or [0])
    for life in rd:
        print("soak: %s: RSS drift %+.2f%%, descriptors drift %+.2f%% after warm-up"
              % (life, rd[life], fd.get(life, 0.0)))
    res = {"bench": "soak", "jobs": njobs, "done": last_done, "succeeded": ok,
           "stuck": int(stuck), "wall_s": round(wall, 1),
           "jobs_per_s": round(last_done / wall, 2), "max_attempts": int(attempts),
           "rss_drift_pct": {k: round(v, 2) for k, v in rd.items()},
           "fds_drift_pct": {k: round(v, 2) for k, v in fd.items()},
           "worst_drift_pct": round(worst, 2), "samples": len(rows)}
    print(json.dumps(res))
    sys.exit(0 if ok == njobs and int(stuck) == 0 and worst < 5 else 1)


if __name__ == "__main__":
    main()
