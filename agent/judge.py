# SPDX-License-Identifier: MIT
# judge.py - the judging interpreter of a job's "code" tests (agent/judge.c
# drives it; docs/EVALUATION.md, "The judge"). It runs the test code, and
# never the model's: a name the test code uses and does not define is
# looked up in the model's interpreter through the worker, which answers
# with plain data (a value) or with a function that calls across. Every
# call's arguments go over as data, and what comes back is data again, so
# the comparisons of the test happen here, where no code of the model runs.
#
# Protocol: one JSON object per line, requests on stdin, answers on the
# descriptor named by argv[1] (stdout is the test's own, captured). A
# judge takes runs one after another until its stdin closes.
#   worker -> judge: {"op": "run", "code": SRC, "mutates": BOOL}
#   judge -> worker: {"op": "lookup", "name": N}
#       worker: {"op": "function"} | {"op": "value", "value": V}
#               | {"op": "missing"} | {"op": "fail", "kind": K, "why": W}
#   judge -> worker: {"op": "call", "name": N, "args": [V...],
#                     "kwargs": [[NAME, V]...]}
#       worker: {"op": "return", "value": V, "args": [V...] | null}
#               | {"op": "raise", "type": T, "message": M}
#               | {"op": "fail", "kind": K, "why": W}
#         K: "timeout" (the call ran past its limit), "died" (the model's
#         interpreter was lost), "not_plain" (the value was not plain data)
#   judge -> worker: {"op": "done", "ok": BOOL, "calls": N, "output": TEXT,
#                     "error": {"type", "message", "traceback", "origin"}}
#       origin: "test" (the test's own code failed: a wrong answer),
#       "candidate" (an exception the code under test raised), or K.
#
# Values V are plain data in a tagged form (agent/judgeval.c checks it
# before it reaches here): null, true, false, a JSON integer, a JSON real,
# "s..." a str, "i..." an int beyond 64 bits, "f..." inf, -inf or nan,
# "b..." bytes in base64, a JSON array a list, and {"t": T, "v": [...]}
# for T tuple, set, frozenset, dict ([[key, value], ...]) and complex
# ([real, imag]).
import base64
import builtins
import io
import json
import os
import sys
import traceback

_OUTPUT_MAX = 64 * 1024


class CandidateError(Exception):
    """An exception of a type that is not a built-in one, raised by the
    code under test (its class lives in the other interpreter)."""


class CandidateFailure(BaseException):
    """The call could not give a value: a timeout, a lost interpreter,
    or a result that is not plain data. Not an Exception, so a test that
    catches Exception does not take it for an answer."""

    def __init__(self, kind, why):
        BaseException.__init__(self, why)
        self.kind = kind


class _Channel:
    def __init__(self, fd):
        self.out = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        self.inp = sys.__stdin__

    def send(self, msg):
        self.out.write(json.dumps(msg, ensure_ascii=False,
                                  separators=(",", ":")) + "\n")
        self.out.flush()

    def recv(self):
        line = self.inp.readline()
        if not line:
            raise SystemExit(3)  # the worker went away
        return json.loads(line)


def decode(v):
    """A tagged plain value as a Python value."""
    if v is None or v is True or v is False:
        return v
    t = type(v)
    if t is int or t is float:
        return v
    if t is str:
        tag, rest = v[:1], v[1:]
        if tag == "s":
            return rest
        if tag == "i":
            return int(rest)
        if tag == "f":
            return float(rest)
        if tag == "b":
            return base64.b64decode(rest)
        raise ValueError("a value tag %r" % tag)
    if t is list:
        return [decode(x) for x in v]
    if t is dict:
        kind, items = v["t"], v["v"]
        if kind == "tuple":
            return tuple(decode(x) for x in items)
        if kind == "set":
            return set(decode(x) for x in items)
        if kind == "frozenset":
            return frozenset(decode(x) for x in items)
        if kind == "dict":
            return dict((decode(k), decode(x)) for k, x in items)
        if kind == "complex":
            return complex(decode(items[0]), decode(items[1]))
    raise ValueError("not a plain value")


def encode(v, depth=0):
    """A Python value of the test (a call's arguments) in the tagged
    form; anything else is refused (TypeError), as the other side does."""
    if depth > 100:
        raise TypeError("arguments nested deeper than 100 levels")
    t = type(v)
    if v is None or t is bool:
        return v
    if t is int:
        return v if -(1 << 63) <= v < (1 << 63) else "i%d" % v
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) \
            else "f%r" % v
    if t is str:
        return "s" + v
    if t is bytes or t is bytearray:
        return "b" + base64.b64encode(bytes(v)).decode("ascii")
    if t is list:
        return [encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"t": "tuple", "v": [encode(x, depth + 1) for x in v]}
    if t is set or t is frozenset:
        return {"t": t.__name__, "v": [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(x, depth + 1)]
                                   for k, x in v.items()]}
    if t is complex:
        return {"t": "complex", "v": [encode(v.real), encode(v.imag)]}
    raise TypeError("an argument of type %s cannot be passed to the code "
                    "under test (plain data only)" % t.__name__)


def _copy_back(orig, new):
    """Write what the call did to a mutable argument into the test's own
    object, in place (tests.mutates)."""
    t = type(orig)
    if t is list and type(new) is list:
        orig[:] = new
    elif t is dict and type(new) is dict:
        orig.clear()
        orig.update(new)
    elif t is set and type(new) is set:
        orig.clear()
        orig.update(new)
    elif t is bytearray and type(new) is bytes:
        orig[:] = new


class Judge:
    def __init__(self, chan):
        self.chan = chan
        self.calls = 0
        self.mutates = False

    def _raise(self, answer):
        op = answer.get("op")
        if op == "raise":
            name, message = answer["type"], answer["message"]
            cls = getattr(builtins, name, None)
            if (isinstance(cls, type) and issubclass(cls, Exception)):
                raise cls(message)
            raise CandidateError("%s: %s" % (name, message))
        if op == "fail":
            raise CandidateFailure(answer["kind"], answer["why"])
        raise CandidateFailure("died", "the worker answered %r" % op)

    def call(self, name, args, kwargs):
        self.calls += 1
        self.chan.send({"op": "call", "name": name,
                        "args": [encode(a) for a in args],
                        "kwargs": [[k, encode(x)] for k, x in kwargs.items()]})
        answer = self.chan.recv()
        if answer.get("op") != "return":
            self._raise(answer)
        if self.mutates and answer.get("args") is not None:
            for orig, new in zip(args, answer["args"]):
                _copy_back(orig, decode(new))
        return decode(answer["value"])

    def lookup(self, name):
        self.chan.send({"op": "lookup", "name": name})
        answer = self.chan.recv()
        op = answer.get("op")
        if op == "function":
            judge = self

            def candidate(*args, **kwargs):
                return judge.call(name, args, kwargs)
            candidate.__name__ = candidate.__qualname__ = name
            return candidate
        if op == "value":
            return decode(answer["value"])
        if op == "missing":
            raise NameError("name %r is not defined" % name)
        self._raise(answer)


class Globals(dict):
    """The test's globals: what the test defines, then the builtins, then
    the model's interpreter, asked once per name."""

    def __init__(self, judge):
        dict.__init__(self, __name__="__main__", __builtins__=builtins)
        self.judge = judge

    def __missing__(self, name):
        if hasattr(builtins, name):
            return getattr(builtins, name)
        value = self.judge.lookup(name)
        self[name] = value
        return value


def _origin(exc):
    if isinstance(exc, CandidateFailure):
        return exc.kind
    tb = exc.__traceback__
    # raised by Judge._raise: the code under test raised it
    while tb is not None:
        if tb.tb_frame.f_code is Judge._raise.__code__:
            return "candidate"
        tb = tb.tb_next
    return "test"


# The last test code compiled, as (source, code object): a judge kept for
# more runs runs the same test code each time (the worker keeps it for
# that code alone).
_compiled = [None, None]


def _compile(code):
    if _compiled[0] != code:
        _compiled[:] = [code, compile(code, "<tests>", "exec")]
    return _compiled[1]


def run(judge, code):
    out = io.StringIO()
    sys.stdout = sys.stderr = out
    error = None
    try:
        exec(_compile(code), Globals(judge))
    except BaseException as e:  # noqa: B036 (every failure is the verdict)
        if isinstance(e, SystemExit) and e.code in (None, 0):
            error = None  # the test itself ended early, with success
        else:
            error = {"type": type(e).__name__, "message": str(e)[:1000],
                     "traceback": traceback.format_exc(limit=8)[-4000:],
                     "origin": _origin(e)}
            if isinstance(e, SyntaxError):
                error["origin"] = "test"
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    text = out.getvalue()
    if len(text) > _OUTPUT_MAX:
        text = text[:_OUTPUT_MAX // 2] + "\n[...]\n" + text[-_OUTPUT_MAX // 2:]
    return {"op": "done", "ok": error is None, "calls": judge.calls,
            "output": text, "error": error}


def main():
    """One run per request, until the worker closes our stdin: a judge
    whose run ended cleanly may be kept for more runs of the same test
    code (docs/EVALUATION.md, "The judge"), each in globals of its own."""
    chan = _Channel(int(sys.argv[1]))
    while True:
        request = chan.recv()
        judge = Judge(chan)
        judge.mutates = bool(request.get("mutates"))
        chan.send(run(judge, request["code"]))


if __name__ == "__main__":
    main()
