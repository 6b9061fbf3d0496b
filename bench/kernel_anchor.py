#!/usr/bin/python3
# kernel_anchor.py CELLS - the anchor for bench_kernel: the median round trip
# of a trivial cell ("pass", execute_reply and idle) through jupyter_client's
# blocking client, with the same kernel command and flags as coderq. Prints
# one JSON line.
import json
import statistics
import sys
import os
import time

from jupyter_client.manager import KernelManager


def main():
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    cells = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    km = KernelManager(kernel_name="python3")
    km.kernel_cmd = [
        "/usr/bin/python3", "-m", "ipykernel_launcher", "-f",
        "{connection_file}", "--HistoryManager.hist_file=:memory:",
        "--InteractiveShell.colors=NoColor",
    ]
    t0 = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    start_ms = (time.perf_counter() - t0) * 1000
    try:
        for _ in range(10):  # warm-up, as coderq's run does
            kc.execute_interactive("pass", timeout=30)
        rtts = []
        for _ in range(cells):
            t = time.perf_counter()
            reply = kc.execute_interactive("pass", timeout=30)
            rtts.append((time.perf_counter() - t) * 1000)
            assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print(json.dumps({"anchor": "jupyter_client", "cells": cells,
                      "rtt_ms_median": statistics.median(rtts),
                      "start_ms": start_ms}))


if __name__ == "__main__":
    main()
