# SPDX-License-Identifier: MIT
# runner.py - the light interpreter (built into coderq as a C string;
# interp/local/runner.c drives it, docs/internals/BACKENDS.md "The
# runner"): one Python process that runs cells of code in one persistent
# namespace, a module __main__ as in a kernel, without Jupyter. Started
# cold (`python -P -s -c RUNNER MARKER OUT_MAX`) or forked by the kernel
# server, confined as a kernel either way.
#
# Descriptors: 0 /dev/null (input() fails at once), 1 and 2 the pipes the
# worker reads as the cells' stdout and stderr, 3 the control socket,
# which this moves away from 3.
# Control, after "MARKER ready\n" once at the start:
#   worker -> runner: "CELL_MARKER NBYTES FLAG\n" then NBYTES of UTF-8
#       code; FLAG "s" for a silent cell (no execution count, no result
#       shown), else "-"
#   runner -> worker: "CELL_MARKER JSON\n", JSON {"ok": BOOL, "count":
#       N|null, "result": REPR|null} and, when not ok, "ename", "evalue"
#       and "traceback" (a list of str), within the bounds below.
# The code runs in this process and can reach every descriptor of it, so
# the worker takes nothing written on the control socket for more than a
# claim about the cell's own outputs (runner.c says what that can bend).
import ast
import builtins
import io
import json
import linecache
import os
import signal
import sys
import traceback
import types

# Characters of an exception's text, of a traceback, of an exception
# name; a result's repr gets OUT_MAX / 8. Each character is at most 6
# bytes of the reply's JSON, so a reply stays within OUT_MAX + 256 KiB.
EVALUE_MAX = 8192
TRACEBACK_MAX = 16384
ENAME_MAX = 256

# What the cells may replace, held here.
_dumps = json.dumps
_repr = repr
_str = str
_len = len
_format_exception = traceback.format_exception
_SIGINT = {signal.SIGINT}


def cut(text, limit):
    """\\p text within \\p limit characters, and encodable (a lone
    surrogate, which the worker's JSON parser refuses, becomes '?')."""
    if _len(text) > limit:
        text = text[:limit] + '...'
    return text.encode('utf-8', 'replace').decode('utf-8')


def describe(exc, own):
    """An exception as a kernel reports it: its name, its text, and its
    traceback without the runner's own frames (its program's, \\p own)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == own:
        tb = tb.tb_next
    try:
        lines = _format_exception(type(exc), exc, tb)
    except BaseException:
        lines = ['%s\n' % type(exc).__name__]
    kept, size = [], 0
    for line in lines:
        line = cut(line, TRACEBACK_MAX - size)
        kept.append(line)
        size += _len(line)
        if size >= TRACEBACK_MAX:
            break
    try:
        evalue = _str(exc)
    except BaseException:
        evalue = '<the exception could not be shown>'
    return {'ename': cut(type(exc).__name__, ENAME_MAX),
            'evalue': cut(evalue, EVALUE_MAX), 'traceback': kept}


def let_interrupts_in():
    """An interrupt is taken only while a cell's code runs: one that came
    late for the last cell is dropped, not left for the next."""
    while signal.SIGINT in signal.sigpending():
        signal.sigtimedwait(_SIGINT, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGINT)


class Runner:
    def __init__(self, out_max):
        self.count = 0
        self.result_max = out_max // 8
        self.own = sys._getframe().f_code.co_filename
        main = types.ModuleType('__main__')
        main.__builtins__ = builtins
        sys.modules['__main__'] = main
        self.ns = main.__dict__

    def run(self, code, silent):
        """One cell: its statements, then its last expression's value
        shown as a kernel shows it (a repr)."""
        if not silent:
            self.count += 1
        name = '<cell-%d>' % self.count if not silent else '<coderq>'
        linecache.cache[name] = (_len(code), None, code.splitlines(True),
                                 name)
        reply = {'ok': True, 'count': None if silent else self.count,
                 'result': None}
        try:
            tree = compile(code, name, 'exec', ast.PyCF_ONLY_AST)
            last = None
            if not silent and tree.body and isinstance(tree.body[-1],
                                                       ast.Expr):
                last = compile(ast.Expression(tree.body.pop().value), name,
                               'eval')
            body = compile(tree, name, 'exec')
            value = None
            try:
                let_interrupts_in()
                exec(body, self.ns)
                if last is not None:
                    value = eval(last, self.ns)
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
            if value is not None:
                reply['result'] = cut(_repr(value), self.result_max)
        except BaseException as e:  # noqa: B036 (a cell's exception is its result)
            reply['ok'] = False
            reply.update(describe(e, self.own))
        return reply


def read_exactly(fd, buf, n):
    while _len(buf) < n:
        more = os.read(fd, 1 << 16)
        if not more:
            os._exit(0)  # the worker went away
        buf += more
    return buf[:n], buf[n:]


def read_line(fd, buf):
    while b'\n' not in buf:
        more = os.read(fd, 1 << 16)
        if not more:
            os._exit(0)
        buf += more
    line, _, rest = buf.partition(b'\n')
    return line, rest


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def streams():
    """The cells' stdout and stderr: line by line into the pipes, so that
    what a cell printed before it hung is there when it is killed. The
    streams they replace are kept: collected, they would close fds 1 and
    2."""
    keep = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__,
            sys.__stdout__, sys.__stderr__)
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w', closefd=False)),
                           encoding='utf-8', line_buffering=True)
    err = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, 'w', closefd=False)),
                           encoding='utf-8', errors='backslashreplace',
                           line_buffering=True)
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = err
    return keep + (out, err)


def work_dir_on_path():
    """The work dir ('') after the standard library, before the installed
    packages, where IPython puts it in a kernel: a job imports its own
    modules, never instead of the standard library's."""
    for i, p in enumerate(sys.path):
        if p.endswith(('site-packages', 'dist-packages')):
            sys.path.insert(i, '')
            return
    sys.path.append('')


def main():
    marker, out_max = sys.argv[1].encode('ascii'), int(sys.argv[2])
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
    ctl = os.dup(3)
    os.close(3)
    held = streams()
    work_dir_on_path()
    runner = Runner(out_max)
    write_all(ctl, marker + b' ready\n')
    buf = b''
    while True:
        header, buf = read_line(ctl, buf)
        cell, size, flag = header.split(b' ')
        code, buf = read_exactly(ctl, buf, int(size))
        reply = runner.run(code.decode('utf-8', 'surrogateescape'),
                           flag == b's')
        for f in (sys.stdout, sys.stderr) + held[-2:]:
            try:
                f.flush()
            except BaseException:  # noqa: B036 (the cell's streams, broken)
                pass
        write_all(ctl, cell + b' ' +
                  _dumps(reply, ensure_ascii=False).encode('utf-8') + b'\n')


if __name__ == '__main__':
    main()
