#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""eval_problems.py - the problem set of `scripts/bench.sh eval`: small
Python functions with `cases` tests, made from 22 families of problems
(sums, clamps, sequences, primes, strings, lists, dates...), each family
varied by its constants, plus for every problem a right and a plausible
wrong solution (an off-by-one, a missed case such as upper-case letters or
the 400-year leap rule, the wrong end of an interval, counting from 0
instead of 1).

Problem i is answered right when i is even and wrong when i is odd, by a
script of the fake LLM (tests/fakes/fake_llm.py): one execute_code call
that defines the function and prints one example, then a final answer.
The expected values come from running the right solution here; a wrong
solution that passes every case is refused here, so the bench's "wrong
answers passed" can only be the harness's doing.

Usage:
  /usr/bin/python3 bench/eval_problems.py --count N --run RUN --out DIR
      [--isolation kernel|fresh]

Writes DIR/jobs.jsonl (one job message per line, model
"script:eval-<i>"), DIR/scripts/eval-<i>.json (the fake LLM's scripts)
and DIR/answers.json ({job_id: "right" | "wrong"}). Standard library
only.
"""

import argparse
import json
import math
import os
import signal
import sys

FAMILIES = []


def family(fn):
    FAMILIES.append(fn)
    return fn


# Each family takes the variant number v (0, 1, ...) and returns
# (name, params, what, right, wrong, cases): the function's name and
# parameters, what it must do (for the prompt), the two bodies (indented
# code after the def line) and the argument lists of the cases.


@family
def sum_multiples(v):
    k = 2 + v
    return (f"sum_multiples_of_{k}", "n",
            f"returns the sum of the positive multiples of {k} that are at "
            f"most n (0 when there is none)",
            f"    return sum(range({k}, n + 1, {k}))",
            f"    return sum(range({k}, n, {k}))",
            [[0], [k - 1], [k], [3 * k], [10 * k + 1], [7 * k]])


@family
def clamp(v):
    lo, hi = -3 * v - 1, 5 + 2 * v
    return (f"clamp_{v}", "x",
            f"returns x clamped to the closed interval [{lo}, {hi}]",
            f"    return max({lo}, min(x, {hi}))",
            f"    return max({lo}, min(x, {hi} - 1))",
            [[lo - 5], [lo], [(lo + hi) // 2], [hi], [hi + 3]])


LETTER_SETS = ["aeiou", "xyz", "rst", "lmn", "aei", "bcd", "ou", "qrs",
               "hjk", "ptk", "wv", "fgh", "ea", "nm"]


@family
def count_letters(v):
    letters = LETTER_SETS[v % len(LETTER_SETS)]
    tag = letters + ("" if v < len(LETTER_SETS) else str(v))
    return (f"count_{tag}", "s",
            f"returns how many characters of the string s are one of the "
            f"letters {', '.join(letters)}, upper or lower case",
            f"    return sum(1 for c in s.lower() if c in {letters!r})",
            f"    return sum(1 for c in s if c in {letters!r})",
            [[""], [letters], [letters.upper()], ["Mixed " + letters.upper()
                                                  + " and " + letters],
             ["no match 0123"]])


@family
def seq_term(v):
    a, b = v % 5, 1 + v
    return (f"term_{a}_{b}", "n",
            f"returns term n (counting from 0) of the sequence that starts "
            f"{a}, {b} and whose every later term is the sum of the two "
            f"before it",
            f"    x, y = {a}, {b}\n    for _ in range(n):\n"
            f"        x, y = y, x + y\n    return x",
            f"    x, y = {a}, {b}\n    for _ in range(n - 1):\n"
            f"        x, y = y, x + y\n    return x",
            [[0], [1], [2], [5], [10]])


@family
def count_primes(v):
    lo = 2 + v % 7
    n0 = 30 + v
    return (f"count_primes_from_{lo}_{v}", "n",
            f"counts the prime numbers p with {lo} <= p <= n",
            "    def is_prime(m):\n        if m < 2:\n            return False\n"
            "        i = 2\n        while i * i <= m:\n"
            "            if m % i == 0:\n                return False\n"
            "            i += 1\n        return True\n"
            f"    return sum(1 for p in range({lo}, n + 1) if is_prime(p))",
            "    def is_prime(m):\n        if m < 2:\n            return False\n"
            "        for i in range(2, int(m ** 0.5)):\n"
            "            if m % i == 0:\n                return False\n"
            "        return True\n"
            f"    return sum(1 for p in range({lo}, n + 1) if is_prime(p))",
            [[lo], [10], [n0], [50], [100]])


@family
def polygonal(v):
    s = 3 + v
    return (f"polygonal_{s}", "n",
            f"returns the n-th {s}-gonal number, n counting from 1 "
            f"(the {s}-gonal numbers start 1, {s}, ...)",
            f"    return (({s} - 2) * n * n - ({s} - 4) * n) // 2",
            f"    n -= 1\n"
            f"    return (({s} - 2) * n * n - ({s} - 4) * n) // 2",
            [[1], [2], [3], [7], [20]])


SEPARATORS = [(" ", "space"), (",", "comma"), ("-", "dash"), ("|", "pipe"),
              (";", "semicolon"), ("/", "slash"), (":", "colon"),
              ("+", "plus"), ("_", "underscore"), (".", "dot")]


@family
def reverse_fields(v):
    sep, word = SEPARATORS[v % len(SEPARATORS)]
    tag = word + ("" if v < len(SEPARATORS) else str(v))
    j = sep.join
    return (f"reverse_{tag}_fields", "s",
            f"returns s with the order of its fields reversed, the fields "
            f"being separated by single {sep!r} characters",
            f"    return {sep!r}.join(s.split({sep!r})[::-1])",
            "    return s[::-1]",
            [[""], ["one"], [j(["ab", "cd"])], [j(["red", "green", "blue"])],
             [j(["x1", "y22", "z333", "w"])]])


@family
def window_sums(v):
    w = 2 + v % 9
    scale = 1 + v // 9
    name = f"window_sums_{w}" + (f"_x{scale}" if scale > 1 else "")
    what = (f"returns the list of the sums of every run of {w} consecutive "
            f"elements of the list xs, in order"
            + (f", each multiplied by {scale}" if scale > 1 else "")
            + " (an empty list when xs is shorter)")
    return (name, "xs", what,
            f"    return [sum(xs[i:i + {w}]) * {scale} for i in "
            f"range(len(xs) - {w} + 1)]",
            f"    return [sum(xs[i:i + {w}]) * {scale} for i in "
            f"range(len(xs) - {w})]",
            [[[]], [list(range(w))], [list(range(1, w + 4))],
             [[5, -2, 7, 0, 3, 9, -4, 1, 8, 2, 6]]])


@family
def lcm3(v):
    c = 2 + v
    return (f"lcm_with_{c}", "a, b",
            f"returns the least common multiple of a, b and {c} "
            f"(a and b are positive integers)",
            "    from math import gcd\n"
            "    def lcm(x, y):\n        return x * y // gcd(x, y)\n"
            f"    return lcm(lcm(a, b), {c})",
            "    from math import gcd\n"
            f"    return a * b * {c} // gcd(gcd(a, b), {c})",
            [[1, 1], [2, 3], [4, 6], [c, 2 * c], [12, 18]])


@family
def digit_sum(v):
    b = 2 + v % 15
    off = v // 15
    name = f"digit_sum_base_{b}" + (f"_plus_{off}" if off else "")
    what = (f"returns the sum of the digits of the non-negative integer n "
            f"written in base {b}" + (f", plus {off}" if off else ""))
    return (name, "n", what,
            f"    t = 0\n    while n > 0:\n        t += n % {b}\n"
            f"        n //= {b}\n    return t + {off}",
            f"    t = 0\n    while n >= {b}:\n        t += n % {b}\n"
            f"        n //= {b}\n    return t + {off}",
            [[0], [1], [b - 1], [b], [b * b + 3], [12345]])


SUBSTRINGS = ["aa", "aba", "xx", "121", "oo", "abab", "zz", "010", "eve",
              "nana", "111", "tt", "ss", "pop"]


@family
def count_overlapping(v):
    sub = SUBSTRINGS[v % len(SUBSTRINGS)]
    tag = str(v)
    return (f"count_overlapping_{tag}", "s",
            f"counts the occurrences of {sub!r} in the string s, "
            f"overlapping occurrences included",
            f"    n, i = 0, s.find({sub!r})\n    while i >= 0:\n"
            f"        n += 1\n        i = s.find({sub!r}, i + 1)\n"
            "    return n",
            f"    return s.count({sub!r})",
            [[""], [sub], [sub * 3], [sub[:-1] + sub + sub[1:]],
             ["x" + sub + "y" + sub + sub]])


@family
def rounded_mean(v):
    d = v % 4
    scale = 1 + v // 4
    return (f"mean_{scale}x_rounded_{d}", "xs",
            f"returns the mean of the numbers xs multiplied by {scale}, "
            f"rounded to {d} decimals with round(); 0.0 for an empty list",
            f"    if not xs:\n        return 0.0\n"
            f"    return round(sum(xs) * {scale} / len(xs), {d})",
            f"    if not xs:\n        return 0.0\n"
            f"    return round(sum(xs) * {scale} // len(xs), {d})",
            [[[]], [[4]], [[1, 2]], [[1, 2, 2]], [[1, 2, 2, 2]], [[-1, 0]],
             [[0.3]], [[(7 + 0.75 / 10 ** d) / scale]],
             [[3.5, -1, 10, 0.25]]])


MODULI = [7, 11, 13, 97, 101, 1009, 65537, 1000003, 17, 19, 23, 29, 31,
          37, 41]


@family
def factorial_mod(v):
    m = MODULI[v % len(MODULI)] + (v // len(MODULI)) * 1000
    return (f"factorial_mod_{m}", "n",
            f"returns n! modulo {m} (0! is 1)",
            f"    r = 1\n    for i in range(1, n + 1):\n"
            f"        r = r * i % {m}\n    return r % {m}",
            f"    r = 1\n    for i in range(1, n):\n"
            f"        r = r * i % {m}\n    return r % {m}",
            [[0], [1], [3], [6], [10]])


@family
def insertion_point(v):
    k = v
    after = v % 2 == 0
    side = "after" if after else "before"
    cmp_right, cmp_wrong = ("<=", "<") if after else ("<", "<=")
    return (f"insert_{side}_equal_shift_{k}", "xs, x",
            f"returns the index at which x + {k} would be inserted into the "
            f"ascending list xs to keep it sorted, {side} any elements equal "
            f"to x + {k}",
            f"    y = x + {k}\n    lo, hi = 0, len(xs)\n    while lo < hi:\n"
            f"        mid = (lo + hi) // 2\n"
            f"        if xs[mid] {cmp_right} y:\n            lo = mid + 1\n"
            f"        else:\n            hi = mid\n    return lo",
            f"    y = x + {k}\n    lo, hi = 0, len(xs)\n    while lo < hi:\n"
            f"        mid = (lo + hi) // 2\n"
            f"        if xs[mid] {cmp_wrong} y:\n            lo = mid + 1\n"
            f"        else:\n            hi = mid\n    return lo",
            [[[], 0], [[1, 2, 3], -k], [[1, 2, 2, 2, 5], 2 - k],
             [[0, 0, 0], -k], [[1, 3, 5, 7], 4 - k], [[2, 4, 4, 9], 4 - k]])


@family
def caesar(v):
    k = 1 + v % 25
    rep = v // 25
    name = f"shift_letters_{k}" + (f"_{rep}" if rep else "")
    return (name, "s",
            f"returns s with every lower-case letter a-z moved {k} places "
            f"forward in the alphabet, wrapping around from z to a; other "
            f"characters stay as they are",
            "    return ''.join(chr((ord(c) - 97 + "
            f"{k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)",
            f"    return ''.join(chr(ord(c) + {k}) if 'a' <= c <= 'z' else c "
            "for c in s)",
            [[""], ["abc"], ["xyz"], ["Hello, world!"], ["zebra 42"]])


@family
def median_scaled(v):
    k = 1 + v
    return (f"median_times_{k}", "xs",
            f"returns the median of the numbers xs multiplied by {k} (for an "
            f"even count, the mean of the two middle values); xs is not "
            f"empty",
            f"    ys = sorted(x * {k} for x in xs)\n    n = len(ys)\n"
            "    if n % 2:\n        return ys[n // 2]\n"
            "    return (ys[n // 2 - 1] + ys[n // 2]) / 2",
            f"    ys = sorted(x * {k} for x in xs)\n    return ys[len(ys) // 2]",
            [[[3]], [[1, 2]], [[5, 1, 3]], [[4, 1, 3, 2]], [[7, 7, 1, 9]]])


@family
def leap_years(v):
    y0 = 1583 + 23 * v % 700  # the cases reach 2400, a 400-year leap
    return (f"leap_years_since_{y0}", "y",
            f"counts the leap years of the Gregorian calendar from {y0} to "
            f"y, both included (0 when y < {y0})",
            f"    return sum(1 for t in range({y0}, y + 1) "
            "if t % 4 == 0 and (t % 100 != 0 or t % 400 == 0))",
            f"    return sum(1 for t in range({y0}, y + 1) "
            "if t % 4 == 0 and t % 100 != 0)",
            [[y0 - 1], [y0], [max(y0, 1999) + 1], [2024], [2404]])


@family
def rotate_right(v):
    k = 1 + v
    return (f"rotate_right_{k}", "xs",
            f"returns the list xs rotated {k} places to the right (the last "
            f"element moves to the front, {k} times); [] stays []",
            f"    if not xs:\n        return []\n    k = {k} % len(xs)\n"
            "    return xs[len(xs) - k:] + xs[:len(xs) - k]",
            f"    if not xs:\n        return []\n    k = {k} % len(xs)\n"
            "    return xs[k:] + xs[:k]",
            [[[]], [[1]], [[1, 2, 3]], [list(range(7))],
             [list(range(k + 5))]])


IGNORED = [" ", " ,.", " -_", " '!?", " ;:", " .", " /", " *", " #", " ()"]


@family
def palindrome(v):
    chars = IGNORED[v % len(IGNORED)]
    tag = str(v)
    sample = "Ab" + chars[-1] + "bA"
    return (f"is_palindrome_{tag}", "s",
            f"returns True when s reads the same backwards once every "
            f"character in {chars!r} is removed and case is ignored, "
            f"else False",
            f"    t = ''.join(c for c in s if c not in {chars!r}).lower()\n"
            "    return t == t[::-1]",
            f"    t = ''.join(c for c in s if c not in {chars!r})\n"
            "    return t == t[::-1]",
            [[""], ["abba"], [sample], ["Never odd or even"], ["abc"]])


@family
def divisible_either(v):
    a, b = 2 + v % 5, 3 + v
    if a == b:
        b += 1
    return (f"count_divisible_{a}_or_{b}", "n",
            f"counts the integers from 1 to n that are divisible by {a} or "
            f"by {b} (or both)",
            "    from math import gcd\n"
            f"    lcm = {a} * {b} // gcd({a}, {b})\n"
            f"    return n // {a} + n // {b} - n // lcm",
            f"    return n // {a} + n // {b}",
            [[0], [a], [b], [a * b], [1000]])


@family
def kth_largest(v):
    k = 2 + v % 4
    shift = v // 4
    return (f"largest_distinct_{k}_plus_{shift}", "xs",
            f"returns the {k}-th largest distinct value of xs plus {shift}, "
            f"or None when xs has fewer than {k} distinct values",
            f"    ys = sorted(set(xs), reverse=True)\n"
            f"    return ys[{k} - 1] + {shift} if len(ys) >= {k} else None",
            f"    ys = sorted(xs, reverse=True)\n"
            f"    return ys[{k} - 1] + {shift} if len(ys) >= {k} else None",
            [[[]], [list(range(k))], [[9] * k + [1] * k],
             [[5, 5, 4, 4, 3, 3, 2, 2, 1, 1]], [[3, 1, 2]]])


@family
def collatz_steps(v):
    t = 2 + v  # the wrong "n >= t" must still stop: every n reaches 1
    return (f"collatz_steps_to_{t}", "n",
            f"returns how many steps of the Collatz map (n // 2 for an even "
            f"n, 3 * n + 1 for an odd n) take n to a value at most {t}; 0 "
            f"when n <= {t} already",
            f"    s = 0\n    while n > {t}:\n"
            "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
            "        s += 1\n    return s",
            f"    s = 0\n    while n >= {t}:\n"
            "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
            "        s += 1\n    return s",
            [[1], [t], [t + 1], [27], [2 * t + 7]])


def define(name, params, body):
    ns = {}
    exec(compile(f"def {name}({params}):\n{body}\n", name, "exec"), ns)
    return ns[name]


def same(a, b):
    """The harness's comparison, on plain data."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Slow(Exception):
    pass


def call(fn, args):
    """fn(*args), refusing one that runs over 2 s (a wrong solution that
    loops would hang its job until the test deadline)."""
    def alarm(signum, frame):
        raise Slow()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(2)
    try:
        return fn(*json.loads(json.dumps(args)))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def problem(i):
    fam = FAMILIES[i % len(FAMILIES)]
    name, params, what, right, wrong, cases = fam(i // len(FAMILIES))
    good = define(name, params, right)
    bad = define(name, params, wrong)
    out, wrong_fails = [], False
    for args in cases:
        want = call(good, args)
        json.dumps(want)
        out.append({"args": args, "expected": want})
        try:
            got = call(bad, args)
        except Slow:
            sys.exit(f"eval_problems: the wrong {name}{tuple(args)} does "
                     f"not finish")
        except Exception:
            wrong_fails = True
            continue
        if not same(got, want):
            wrong_fails = True
    if not wrong_fails:
        sys.exit(f"eval_problems: the wrong {name} passes every case")
    return name, params, what, right, wrong, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--isolation", choices=("kernel", "fresh"),
                    default="kernel")
    a = ap.parse_args()
    if a.count < 2 or a.count % 2:
        sys.exit("eval_problems: --count must be an even number >= 2")
    os.makedirs(os.path.join(a.out, "scripts"), exist_ok=True)
    names, answers = set(), {}
    with open(os.path.join(a.out, "jobs.jsonl"), "w") as jobs:
        for i in range(a.count):
            name, params, what, right, wrong, cases = problem(i)
            if name in names:
                sys.exit(f"eval_problems: two problems named {name}")
            names.add(name)
            kind = "right" if i % 2 == 0 else "wrong"
            body = right if kind == "right" else wrong
            example = json.dumps(cases[-1]["args"])[1:-1]
            code = (f"def {name}({params}):\n{body}\n\n"
                    f"print({name}({example}))")
            script = {"steps": [{"tool_calls": [{"code": code}]},
                                {"content": f"`{name}` is defined above "
                                            f"and printed one example."}]}
            with open(os.path.join(a.out, "scripts", f"eval-{i}.json"),
                      "w") as f:
                json.dump(script, f)
            job_id = f"{a.run}-{i:05d}"
            answers[job_id] = kind
            msg = {"job_id": job_id, "run_id": a.run, "title": name,
                   "prompt": f"Write a Python function {name}({params}) "
                             f"that {what}. Define it in the notebook.",
                   "model": f"script:eval-{i}",
                   "tests": {"kind": "cases", "function": name,
                             "cases": cases, "isolation": a.isolation},
                   "limits": {"max_turns": 4, "max_retries": 0,
                              "cell_timeout_s": 60}}
            jobs.write(json.dumps(msg) + "\n")
    with open(os.path.join(a.out, "answers.json"), "w") as f:
        json.dump(answers, f)
    print(f"{a.count} problems from {len(FAMILIES)} families: "
          f"{a.count // 2} answered right, {a.count // 2} wrong")


if __name__ == "__main__":
    main()
