# SPDX-License-Identifier: MIT
"""sdk_oracle.py - drives the official E2B Python SDK (e2b-code-interpreter
from PyPI, pinned in scripts/requirements-tools.txt), unchanged, against
the double named by E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY, one check
per run:

    sdk_oracle.py CASE

where CASE is one of the functions below. Each makes its own sandbox and
kills it. Exit 0 when the SDK saw E2B's behaviour, 1 with the mismatch on
stderr. tests/check_e2b_sdk.c runs every case.
"""

import hashlib
import json
import os
import sys
import time
import urllib.request

from e2b_code_interpreter import Sandbox

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def expect(what, got, want):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def double_log():
    """The double's request log (GET /_fake/log)."""
    url = os.environ["E2B_API_URL"] + "/_fake/log"
    with urllib.request.urlopen(url, timeout=30) as res:
        return json.load(res)


def run(sbx, code, **kw):
    """run_code, once more when ipykernel refused the request while it
    unwound a failed cell (ExecutionAborted: the code never ran)."""
    ex = sbx.run_code(code, **kw)
    if ex.error and ex.error.name == "ExecutionAborted":
        ex = sbx.run_code(code, **kw)
    return ex


def stdout(ex):
    if ex.error:
        raise AssertionError("the cell failed: %s: %s"
                             % (ex.error.name, ex.error.value))
    return "".join(ex.logs.stdout)


@case
def run_code_envs_hold_for_one_run(sbx):
    """run_code(envs=...) sets them for that run; afterwards a variable
    set at create time has its value again and a new one is gone, after a
    failed run too."""
    show = ("import os\nprint(os.environ.get('CQ_RUN'), "
            "os.environ.get('CQ_BOTH'))")
    expect("envs in their run",
           stdout(run(sbx, show, envs={"CQ_RUN": "r", "CQ_BOTH": "run"})),
           "r run\n")
    expect("envs in the next run", stdout(run(sbx, show)),
           "None create\n")
    ex = run(sbx, "1/0", envs={"CQ_RUN": "failed"})
    expect("error of a run with envs", ex.error and ex.error.name,
           "ZeroDivisionError")
    expect("envs after a failed run", stdout(run(sbx, show)),
           "None create\n")


@case
def files_write_gzip(sbx):
    """files.write(gzip=True) sends an application/octet-stream body with
    Content-Encoding: gzip; the file holds the decoded bytes."""
    data = bytes(range(256)) * 64
    info = sbx.files.write("/home/user/gz/data.bin", data, gzip=True)
    sent = [r for r in double_log() if r["method"] == "POST"
            and r["path"].startswith("/files?") and "data.bin" in r["path"]]
    expect("encodings of the upload", [r.get("encoding") for r in sent],
           ["gzip"])
    expect("path written", info.path, "/home/user/gz/data.bin")
    back = bytes(sbx.files.read("/home/user/gz/data.bin", format="bytes"))
    expect("bytes read back (length, sha256)", (len(back), sha256(back)),
           (len(data), sha256(data)))
    expect("size listed", sbx.files.get_info("/home/user/gz/data.bin").size,
           len(data))
    # the same bytes as the kernel sees them, and a plain octet-stream
    # upload beside it
    sbx.files.write("/home/user/gz/plain.txt", "plain", use_octet_stream=True)
    expect("kernel's view", stdout(run(
        sbx, "import hashlib\nprint(hashlib.sha256(open('gz/data.bin', "
        "'rb').read()).hexdigest(), open('gz/plain.txt').read())")),
        "%s plain\n" % sha256(data))


@case
def files_list_directory_entry(sbx):
    """A directory's entry in files.list is a directory: its type, and
    permissions that start with "d" and give search rights."""
    sbx.files.make_dir("/home/user/tree/sub")
    sbx.files.write("/home/user/tree/f.txt", "f")
    entries = {e.name: e for e in sbx.files.list("/home/user/tree")}
    expect("names", sorted(entries), ["f.txt", "sub"])
    sub, f = entries["sub"], entries["f.txt"]
    expect("directory type", sub.type.value, "dir")
    if not sub.permissions.startswith("d") or sub.mode & 0o111 == 0:
        raise AssertionError("directory permissions %r, mode %o"
                             % (sub.permissions, sub.mode))
    expect("directory mode text", sub.permissions[1:],
           "".join(c if sub.mode & (1 << (8 - i)) else "-"
                   for i, c in enumerate("rwxrwxrwx")))
    expect("file type", f.type.value, "file")
    if not f.permissions.startswith("-"):
        raise AssertionError("file permissions %r" % f.permissions)
    expect("directory from get_info",
           sbx.files.get_info("/home/user/tree/sub").type.value, "dir")


@case
def commands_run_as_user(sbx):
    """commands.run runs as "user" with HOME and cwd /home/user, and what
    it makes is that user's; user="root" runs as root."""
    res = sbx.commands.run("id -un; echo $HOME; pwd; touch made.txt; "
                           "stat -c %U made.txt")
    expect("exit code", res.exit_code, 0)
    expect("user, HOME, cwd, owner", res.stdout,
           "user\n/home/user\n/home/user\nuser\n")
    res = sbx.commands.run("id -un; echo $HOME", user="root")
    expect("as root", res.stdout, "root\n/root\n")


@case
def connect_never_shortens(sbx):
    """connect() without a timeout leaves a longer life alone (E2B extends
    a running sandbox on connect, never shortens it); set_timeout() may
    shorten, and a connect after it extends by the default 300 s."""
    def left():
        return sbx.get_info().end_at.timestamp() - time.time()

    if left() < 590:
        raise AssertionError("created with 600 s, %.0f s left" % left())
    Sandbox.connect(sbx.sandbox_id)
    if left() < 580:
        raise AssertionError("connect() cut the life to %.0f s" % left())
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    if left() < 580:
        raise AssertionError("connect(timeout=10) cut the life to %.0f s"
                             % left())
    sbx.set_timeout(30)
    if not 20 < left() <= 31:
        raise AssertionError("set_timeout(30) left %.0f s" % left())
    Sandbox.connect(sbx.sandbox_id)
    if not 280 < left() <= 301:
        raise AssertionError("connect() after set_timeout(30) left %.0f s"
                             % left())


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        print("usage: sdk_oracle.py {%s}" % "|".join(CASES), file=sys.stderr)
        return 2
    sbx = Sandbox.create(timeout=600, envs={"CQ_BOTH": "create"})
    try:
        CASES[sys.argv[1]](sbx)
    except AssertionError as e:
        print("sdk_oracle: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        return 1
    finally:
        sbx.kill()
    print("sdk_oracle: %s: passed" % sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
