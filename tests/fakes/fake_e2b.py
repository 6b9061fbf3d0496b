#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""fake_e2b.py - a local double of E2B for tests: the control plane, envd
(files, filesystem RPC, commands) and the code interpreter (/execute,
/contexts), each sandbox backed by real ipykernels so behaviour matches the
real service. Standard library plus Debian's jupyter_client/ipykernel only.

Two loopback listeners on ephemeral ports, printed first on stdout:
    API <port>
    SANDBOX <port>
(and written to --port-file when given). The sandbox listener routes by the
E2b-Sandbox-Id / E2b-Sandbox-Port headers, as the real proxy does for
localhost. /home/user and /tmp inside a sandbox map to per-sandbox temp
dirs; where bubblewrap runs, kernels and commands see them at those paths,
with cwd and HOME /home/user, as in E2B (GET /_fake/stats says "jailed").

Fault injection (API listener):
    POST /_fake/faults {"create": [{"status": 429, "count": 2,
                                    "retry_after": 1}],
                        "execute": [{"mode": "truncate"|"malformed"|
                                     "never_end"|"kill"|"proxy_502"|
                                     "aborted",
                                     "count": 1}]}
    POST /_fake/kill/<id>    kill a sandbox now (as if it died)
    POST /_fake/reset        clear faults and the request log
    GET  /_fake/stats        {"live": n, "created": n, ...}
    GET  /_fake/log          the request log (method, path, port, status,
                             Content-Encoding)
    create faults may also be {"mode": "lost"} (the sandbox is made, the
    reply never sent) and carry "should_retry": true|false (the
    Should-Retry header of the error reply).
Templates "fault-401", "fault-404", "fault-429" always fail create;
template "seeded" starts with /home/user/seed.txt and seed2.txt; other
templates than those, "code-interpreter-v1" and "base" get a 404, and a
timeout above --max-timeout-s a 400, as E2B answers. Create-time
"metadata" is listed (GET /v2/sandboxes?metadata=k%3Dv filters on it) and
"envVars" reach the kernels and commands. As E2B does: /execute's
"env_vars" hold for that run only; POST /files takes multipart or
octet-stream bodies, gzip-encoded or not; a directory's entry says so in
its type and permissions; commands run as "user" (uid 1000, where
bubblewrap can map it: GET /_fake/stats says "users"); connect never
shortens a sandbox's life, /timeout may.
"""

import argparse
import base64
import datetime
import gzip
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# jupyter_client's kernel-spec lookup imports ipykernel, whose debugger
# warns on stderr about frozen modules in every test's output otherwise
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
from jupyter_client.manager import KernelManager  # noqa: E402

HOME = "/home/user"
ENVD_PORT = "49983"
CI_PORT = "49999"
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def go_mode(mode):
    """os.FileMode.String() of Go, which envd reports as permissions:
    type letters (d directory, L symlink, D device, p pipe, S socket, u
    setuid, g setgid, c char device, t sticky) or "-", then rwx bits."""
    kinds = ((stat.S_ISDIR(mode), "d"), (stat.S_ISLNK(mode), "L"),
             (stat.S_ISBLK(mode) or stat.S_ISCHR(mode), "D"),
             (stat.S_ISFIFO(mode), "p"), (stat.S_ISSOCK(mode), "S"),
             (mode & stat.S_ISUID, "u"), (mode & stat.S_ISGID, "g"),
             (stat.S_ISCHR(mode), "c"), (mode & stat.S_ISVTX, "t"))
    head = "".join(c for on, c in kinds if on) or "-"
    return head + "".join(c if mode & (1 << (8 - i)) else "-"
                          for i, c in enumerate("rwxrwxrwx"))


def rfc3339(ts):
    return datetime.datetime.fromtimestamp(
        ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Set by probe_jail(): a directory for kernel connection files, visible
# at the same path inside the jail, or None when bubblewrap cannot run.
RUN_DIR = None
# Where kernels' connection files, sockets and stderr logs live: RUN_DIR
# when jailed, else a private temporary directory (made on first use).
KERNEL_DIR = None


def kernel_dir():
    global KERNEL_DIR
    if KERNEL_DIR is None:
        KERNEL_DIR = RUN_DIR or tempfile.mkdtemp(prefix="fake-e2b-run-")
    return KERNEL_DIR


# Set by probe_jail() when bubblewrap can also map a process to uid 1000
# in a user namespace: files for /etc/passwd and /etc/group that name it
# "user", as E2B's templates do. None: commands run as the double's user.
USER_DB = None
USER_UID = 1000


def bwrap_ok(args):
    try:
        return subprocess.run(["bwrap"] + args + ["true"],
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def user_db(run):
    """/etc/passwd and /etc/group with "user" (uid and gid 1000, home
    /home/user) in place of whatever the host has there."""
    out = {}
    for name, line in (("passwd", "user:x:%d:%d::%s:/bin/bash\n"
                        % (USER_UID, USER_UID, HOME)),
                       ("group", "user:x:%d:\n" % USER_UID)):
        keep = []
        try:
            with open("/etc/" + name) as f:
                for old in f:
                    fields = old.split(":")
                    if len(fields) > 2 and fields[0] != "user" and \
                            fields[2] != str(USER_UID):
                        keep.append(old if old.endswith("\n") else old + "\n")
        except OSError:
            pass
        out[name] = os.path.join(run, name)
        with open(out[name], "w") as f:
            f.writelines(keep + [line])
    return out


def probe_jail():
    """Can bubblewrap give a process a /home/user and /tmp of its own, and
    run it as "user"?"""
    global RUN_DIR, USER_DB
    if not shutil.which("bwrap"):
        return
    if not bwrap_ok(["--dev-bind", "/", "/", "--tmpfs", "/home", "--dir",
                     HOME, "--chdir", HOME]):
        return
    RUN_DIR = tempfile.mkdtemp(prefix="fake-e2b-run-")
    if bwrap_ok(["--dev-bind", "/", "/", "--unshare-user", "--uid",
                 str(USER_UID), "--gid", str(USER_UID)]):
        USER_DB = user_db(RUN_DIR)


def jail(root, tmp, cwd=HOME, user=None):
    """The bwrap prefix that runs a command as E2B would: /home/user is the
    sandbox's home, /tmp its own, cwd and HOME /home/user; with user
    "user", as that user (uid 1000), as envd runs commands, and with
    "root" HOME /root. No --die-with-parent: that parent is the request
    thread that started the kernel, which ends with its connection."""
    cmd = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/home",
           "--bind", root, HOME, "--bind", tmp, "/tmp",
           "--bind", RUN_DIR, RUN_DIR, "--chdir", cwd,
           "--setenv", "HOME", "/root" if user == "root" else HOME]
    if user == "user" and USER_DB:
        cmd += ["--unshare-user", "--uid", str(USER_UID), "--gid",
                str(USER_UID), "--ro-bind", USER_DB["passwd"], "/etc/passwd",
                "--ro-bind", USER_DB["group"], "/etc/group"]
    return cmd + ["--"]


class JailedKernelManager(KernelManager):
    prefix = []

    def __init__(self, **kw):
        super().__init__(**kw)
        # SIGINT to the process group would end bwrap's monitor too, and
        # --die-with-parent the kernel with it: interrupt by message
        self.kernel_spec.interrupt_mode = "message"

    def format_kernel_cmd(self, extra_arguments=None):
        return self.prefix + super().format_kernel_cmd(extra_arguments)


class Context:
    """One Jupyter kernel, as the code-interpreter server keeps per context."""

    def __init__(self, root, language="python", cwd=HOME, envs=None,
                 tmp=None):
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        env = dict(os.environ)
        env.update(envs or {})
        home = HOME if RUN_DIR else root
        env["HOME"] = home
        env["MPLCONFIGDIR"] = os.path.join(home, ".config", "matplotlib")
        env["PYTHONUNBUFFERED"] = "1"
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env.pop("PYTHONPATH", None)
        # Unix sockets, not TCP: jupyter_client picks TCP ports by binding
        # and releasing them, and under a parallel test run another
        # process's kernel may take one before this kernel binds it.
        run = kernel_dir()
        name = "kernel-%s" % secrets.token_hex(8)
        if RUN_DIR:
            self.km = JailedKernelManager(kernel_name="python3",
                                          transport="ipc")
            self.km.prefix = jail(root, tmp, cwd if cwd.startswith(HOME)
                                  else HOME)
        else:
            self.km = KernelManager(kernel_name="python3", transport="ipc")
        self.km.connection_file = os.path.join(run, name + ".json")
        self.km.ip = os.path.join(run, name + "-ipc")
        # the kernel's stderr (debugger notices) is kept aside, and shown
        # only when the kernel does not come up
        # (open while the context lives: a restart starts the kernel anew
        # with the same arguments)
        self.errlog = os.path.join(run, name + ".stderr")
        self.err = open(self.errlog, "wb")
        self.km.start_kernel(cwd=root, env=env, stdout=subprocess.DEVNULL,
                             stderr=self.err)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except RuntimeError as e:
            self.report(e)
            self.shutdown()
            raise
        self.id = self.km.kernel_id

    def report(self, why):
        """Say on the double's stderr why a kernel did not come up."""
        try:
            with open(self.errlog, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode("utf-8", "replace")
        except OSError as e:
            tail = "(no stderr: %s)" % e
        alive = self.km.is_alive()
        print("fake_e2b: kernel did not start (%s; process %s); its "
              "stderr ends:\n%s" % (why, "alive" if alive else "gone",
                                      tail), file=sys.stderr, flush=True)

    def restart(self):
        with self.lock:
            self.km.restart_kernel(now=True)
            self.kc.stop_channels()
            self.kc = self.km.blocking_client()
            self.kc.start_channels()
            try:
                self.kc.wait_for_ready(timeout=60)
            except RuntimeError as e:
                self.report(e)
                raise

    def shutdown(self):
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        try:
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass
        self.err.close()
        try:
            os.unlink(self.errlog)
        except OSError:
            pass


class Sandbox:
    def __init__(self, template, timeout_s, metadata=None, envs=None):
        self.id = "i" + secrets.token_hex(10)
        self.metadata = dict(metadata or {})
        self.envs = dict(envs or {})
        self.template = template
        self.token = secrets.token_hex(16)
        self.root = tempfile.mkdtemp(prefix="fake-e2b-")
        self.tmp = tempfile.mkdtemp(prefix="fake-e2b-tmp-")
        self.started = time.time()
        self.end = time.time() + timeout_s
        self.contexts = {}
        self.default_ctx = None
        self.lock = threading.Lock()
        self.alive = True

    def body(self):
        return {"templateID": self.template, "sandboxID": self.id,
                "clientID": "6532622b", "envdVersion": "0.6.13",
                "envdAccessToken": self.token, "trafficAccessToken": None,
                "domain": None, "alias": None}

    def detail(self):
        return {"templateID": self.template, "sandboxID": self.id,
                "clientID": "6532622b", "startedAt": rfc3339(self.started),
                "endAt": rfc3339(self.end), "cpuCount": 2, "memoryMB": 512,
                "diskSizeMB": 1024, "state": "running",
                "envdVersion": "0.6.13", "metadata": dict(self.metadata)}

    def local(self, path):
        """Map a sandbox path to the host: /home/user and /tmp are the
        sandbox's own; None elsewhere (the rest of the VM is not
        modelled)."""
        if path is None:
            return None
        if path.startswith("~"):
            path = HOME + path[1:]
        if not path.startswith("/"):
            path = HOME + "/" + path
        norm = os.path.normpath(path)
        for top, host in ((HOME, self.root), ("/tmp", self.tmp)):
            if norm == top or norm.startswith(top + "/"):
                return host + norm[len(top):]
        return None

    def remote(self, local):
        for top, host in ((HOME, self.root), ("/tmp", self.tmp)):
            rel = os.path.relpath(local, host)
            if not rel.startswith(".."):
                return top if rel == "." else top + "/" + rel
        return local

    def context(self, ctx_id):
        with self.lock:
            if ctx_id is None:
                if self.default_ctx is None:
                    ctx = Context(self.root, envs=self.envs, tmp=self.tmp)
                    self.contexts[ctx.id] = ctx
                    self.default_ctx = ctx.id
                return self.contexts[self.default_ctx]
            return self.contexts.get(ctx_id)

    def new_context(self, language, cwd):
        ctx = Context(self.root, language, cwd, self.envs, self.tmp)
        with self.lock:
            if not self.alive:
                ctx.shutdown()
                raise RuntimeError("sandbox was killed")
            self.contexts[ctx.id] = ctx
        return ctx

    def kill(self):
        with self.lock:
            self.alive = False
            ctxs = list(self.contexts.values())
            self.contexts.clear()
        for ctx in ctxs:
            ctx.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


# what the double's team can create from; others get E2B's 404
TEMPLATES = ("code-interpreter-v1", "base", "seeded")


class State:
    def __init__(self, api_key, keepalive_s, max_timeout_s=3600):
        self.api_key = api_key
        self.keepalive_s = keepalive_s
        self.max_timeout_s = max_timeout_s
        # re-entrant: send() records the request while a handler may hold it
        self.lock = threading.RLock()
        self.sandboxes = {}
        self.faults = {"create": [], "execute": []}
        self.log = []
        self.stats = {"created": 0, "killed": 0, "expired": 0,
                      "set_timeout": 0, "connect": 0, "executions": 0,
                      "create_calls": 0, "streams": 0}

    def too_long(self):
        # E2B states the plan's bound in hours
        return "Timeout cannot be greater than %d hours" % (
            self.max_timeout_s // 3600)

    def record(self, method, path, port, status, encoding=None):
        with self.lock:
            self.log.append({"method": method, "path": path, "port": port,
                             "status": status, "encoding": encoding})
            if len(self.log) > 10000:
                del self.log[:1000]

    def take_fault(self, kind):
        with self.lock:
            lst = self.faults[kind]
            while lst:
                f = lst[0]
                if f.get("count", 1) <= 0:
                    lst.pop(0)
                    continue
                f["count"] = f.get("count", 1) - 1
                return dict(f)
            return None

    def get(self, sid):
        with self.lock:
            sbx = self.sandboxes.get(sid)
            if sbx and sbx.end <= time.time():
                del self.sandboxes[sid]
                self.stats["expired"] += 1
                expired = sbx
                sbx = None
            else:
                expired = None
        if expired:
            expired.kill()
        return sbx

    def remove(self, sid, stat="killed"):
        with self.lock:
            sbx = self.sandboxes.pop(sid, None)
            if sbx:
                self.stats[stat] += 1
        if sbx:
            sbx.kill()
        return sbx

    def reap(self):
        with self.lock:
            dead = [s for s in self.sandboxes.values()
                    if s.end <= time.time()]
        for sbx in dead:
            self.remove(sbx.id, "expired")

    def shutdown(self):
        with self.lock:
            ids = list(self.sandboxes)
        for sid in ids:
            self.remove(sid)


class ClientGone(Exception):
    pass


def with_envs(code, envs):
    """The cell the code-interpreter server runs for /execute with
    env_vars: a line setting each, indented as the code's first line, then
    the code (so tracebacks count those lines too)."""
    if not envs:
        return code
    indent = ""
    for line in code.split("\n"):
        if line.strip():
            indent = line[:len(line) - len(line.lstrip())]
            break
    sets = ["import os; os.environ[%r] = %r" % kv for kv in envs.items()]
    return "\n".join([""] + [indent + s for s in sets] + [code])


def reset_envs(kc, envs, create_envs):
    """Silently restore each of envs to its create-time value, or unset
    it. ipykernel aborts requests that arrive while it unwinds a failed
    cell: send it again then."""
    code = "\n".join(
        "import os; os.environ[%r] = %r" % (k, create_envs[k])
        if k in create_envs else "import os; os.environ.pop(%r, None)" % k
        for k in envs)
    for _ in range(50):
        msg_id = kc.execute(code, silent=True, store_history=False,
                            allow_stdin=False, stop_on_error=False)
        if SandboxHandler.reply_status(kc, msg_id) != "aborted":
            return
        time.sleep(0.1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-e2b/1"
    state = None  # set on the subclass
    role = None

    def log_message(self, fmt, *args):
        pass

    # ---- plumbing ----
    def body(self):
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise ClientGone()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:
                        trailer = self.rfile.readline(65537)
                        if trailer in (b"\r\n", b"\n", b""):
                            break
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(3)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def json_body(self):
        raw = self.body()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def send(self, status, body=b"", ctype="application/json", headers=None):
        if isinstance(body, (dict, list)) or body is None:
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        # logged first: a client that has the reply may read the log next
        self.state.record(self.command, self.path,
                          self.headers.get("E2b-Sandbox-Port"), status,
                          self.headers.get("Content-Encoding"))
        self.send_response(status)
        if ctype and body:
            self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def api_error(self, status, message, headers=None):
        self.send(status, {"code": status, "message": message},
                  headers=headers)

    def dispatch(self):
        try:
            self.route()
        except ClientGone:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = dispatch


class ApiHandler(Handler):
    def route(self):
        url = urlsplit(self.path)
        path = url.path
        st = self.state
        if path.startswith("/_fake/"):
            return self.fake(path)
        if path == "/health":
            return self.send(200, "Health check successful", "text/plain")
        if (self.command == "POST"
                and re.fullmatch(r"(?:/v2)?/sandboxes", path)):
            with st.lock:
                st.stats["create_calls"] += 1
        if self.headers.get("X-API-KEY") != st.api_key:
            self.body()
            return self.api_error(401, "Invalid API key, please visit "
                                  "https://e2b.dev/docs/api-key for more "
                                  "information.")
        m = re.fullmatch(r"(?:/v2)?/sandboxes", path)
        if m and self.command == "POST":
            return self.create()
        if path == "/v2/sandboxes" and self.command == "GET":
            q = parse_qs(url.query)
            want = {}
            for m in q.get("metadata", []):
                # "k=v&k2=v2", itself URL-encoded once more in the query
                for k, v in parse_qs(m, keep_blank_values=True).items():
                    want[k] = v[0]
            states = ",".join(q.get("state", ["running,paused"])).split(",")
            st.reap()
            with st.lock:
                sbxs = [s for s in st.sandboxes.values()
                        if all(s.metadata.get(k) == v
                               for k, v in want.items())
                        and "running" in states]
            return self.send(200, [s.detail() for s in sbxs])
        m = re.fullmatch(r"(?:/v2)?/sandboxes/([^/]+)(/[a-z]+)?", path)
        if not m:
            self.body()
            return self.api_error(404, "not found")
        sid, op = m.group(1), m.group(2) or ""
        req = self.json_body() if self.command == "POST" else None
        if not re.fullmatch(r"[a-z0-9]+", sid):
            return self.api_error(400, "Invalid sandbox ID")
        sbx = st.get(sid)
        if not sbx:
            return self.api_error(404, 'Sandbox "%s" doesn\'t exist or you '
                                  "don't have access to it" % sid)
        if op == "" and self.command == "DELETE":
            st.remove(sid)
            return self.send(204)
        if op == "" and self.command == "GET":
            return self.send(200, sbx.detail())
        if op in ("/timeout", "/connect") and self.command == "POST":
            # /timeout sets the end to now + timeout, shortening too;
            # connect only ever extends a running sandbox, by the 300 s
            # the v2 API defaults to when no timeout is given (the SDKs
            # send none unless asked)
            default = 300 if op == "/connect" and path.startswith("/v2/") \
                else None
            t = req.get("timeout", default) if isinstance(req, dict) else None
            if not isinstance(t, int) or isinstance(t, bool):
                return self.api_error(400, "Error when parsing request: "
                                      "timeout is required")
            if t < 0 or (t == 0 and op == "/timeout"):
                return self.api_error(400, "Timeout must be greater than 0")
            if t > st.max_timeout_s:
                return self.api_error(400, st.too_long())
            if op == "/timeout":
                sbx.end = time.time() + t
                with st.lock:
                    st.stats["set_timeout"] += 1
                return self.send(204)
            sbx.end = max(sbx.end, time.time() + t)
            with st.lock:
                st.stats["connect"] += 1
            return self.send(200, sbx.body())
        return self.api_error(404, "not found")

    def create(self):
        st = self.state
        req = self.json_body()
        if not isinstance(req, dict) or not isinstance(
                req.get("templateID"), str):
            return self.api_error(400, "templateID is required")
        tpl = req["templateID"]
        timeout = req.get("timeout", 15)
        if not isinstance(timeout, int) or timeout <= 0:
            return self.api_error(400, "Timeout must be greater than 0")
        if timeout > st.max_timeout_s:
            return self.api_error(400, st.too_long())
        meta = req.get("metadata") or {}
        envs = req.get("envVars") or {}
        if not isinstance(meta, dict) or not isinstance(envs, dict) or not all(
                isinstance(v, str) for v in list(meta.values())
                + list(envs.values())):
            return self.api_error(400, "metadata and envVars must map "
                                  "strings to strings")
        fault = st.take_fault("create")
        if tpl == "fault-401" or (fault and fault.get("status") == 401):
            return self.api_error(401, "Invalid API key, please visit "
                                  "https://e2b.dev/docs/api-key for more "
                                  "information.")
        if tpl == "fault-404" or (fault and fault.get("status") == 404):
            return self.api_error(404, "template '%s' not found" % tpl)
        if tpl == "fault-429" or (fault and fault.get("status") == 429):
            ra = str((fault or {}).get("retry_after", 1))
            return self.api_error(429, "Rate limit exceeded",
                                  {"Retry-After": ra})
        if tpl not in TEMPLATES and not tpl.startswith("fault-"):
            return self.api_error(404, "template '%s' not found" % tpl)
        if fault and fault.get("status"):
            hdrs = {}
            if "should_retry" in fault:
                hdrs["Should-Retry"] = ("true" if fault["should_retry"]
                                        else "false")
            return self.api_error(fault["status"], "injected failure", hdrs)
        sbx = Sandbox(tpl, timeout, meta, envs)
        if tpl == "seeded":
            # a template that ships files in /home/user
            for name in ("seed.txt", "seed2.txt"):
                with open(os.path.join(sbx.root, name), "w") as f:
                    f.write("seed\n")
        with st.lock:
            st.sandboxes[sbx.id] = sbx
            st.stats["created"] += 1
        if fault and fault.get("mode") == "lost":
            # made, but the reply never arrives
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return None
        return self.send(201, sbx.body())

    def fake(self, path):
        st = self.state
        if path == "/_fake/stats":
            st.reap()
            with st.lock:
                out = dict(st.stats, live=len(st.sandboxes),
                           ids=list(st.sandboxes), jailed=bool(RUN_DIR),
                           users=bool(USER_DB))
            return self.send(200, out)
        if path == "/_fake/log":
            with st.lock:
                log = list(st.log)
            return self.send(200, log)
        req = self.json_body() if self.command == "POST" else {}
        if path == "/_fake/faults" and isinstance(req, dict):
            with st.lock:
                for kind in ("create", "execute"):
                    st.faults[kind].extend(req.get(kind, []))
            return self.send(204)
        if path == "/_fake/reset":
            with st.lock:
                st.faults = {"create": [], "execute": []}
                st.log.clear()
            return self.send(204)
        m = re.fullmatch(r"/_fake/kill/([a-z0-9]+)", path)
        if m:
            return self.send(204 if st.remove(m.group(1)) else 404)
        return self.api_error(404, "not found")


class SandboxHandler(Handler):
    def route(self):
        st = self.state
        sid = self.headers.get("E2b-Sandbox-Id", "")
        port = self.headers.get("E2b-Sandbox-Port", "")
        sbx = st.get(sid) if re.fullmatch(r"[a-z0-9]+", sid) else None
        if not sbx:
            self.body()
            return self.send(502, {"sandboxId": sid, "message":
                                   "The sandbox was not found", "code": 502})
        if port == ENVD_PORT:
            return self.envd(sbx)
        if port == CI_PORT:
            return self.interpreter(sbx)
        self.body()
        return self.send(502, {"sandboxId": sid, "message": "The sandbox is "
                               "running but port is not open",
                               "port": int(port) if port.isdigit() else 0,
                               "code": 502})

    def token_ok(self, sbx):
        return self.headers.get("X-Access-Token") == sbx.token

    # ---- envd ----
    def envd(self, sbx):
        url = urlsplit(self.path)
        q = parse_qs(url.query)
        if url.path == "/health":
            return self.send(204)
        if url.path == "/files":
            if not self.token_ok(sbx):
                self.body()
                return self.send(401, {"code": 401, "message":
                                       "unauthorized access, please provide "
                                       "a valid access token or method "
                                       "signing if supported"})
            if self.command == "GET":
                return self.read_file(sbx, q.get("path", [None])[0])
            if self.command == "POST":
                return self.write_files(sbx, q)
        if not self.token_ok(sbx):
            self.body()
            return self.send(401, {"code": 401, "message":
                                   "unauthorized access, please provide a "
                                   "valid access token or method signing if "
                                   "supported"})
        if url.path.startswith("/filesystem.Filesystem/"):
            return self.fs_rpc(sbx, url.path.rsplit("/", 1)[1])
        if url.path == "/process.Process/Start":
            return self.process_start(sbx)
        self.body()
        return self.send(404, {"code": 404, "message": "not found"})

    def read_file(self, sbx, path):
        local = sbx.local(path)
        if local is None or not os.path.exists(local):
            return self.send(404, {"code": 404, "message":
                                   "path '%s' does not exist" % path})
        if os.path.isdir(local):
            return self.send(400, {"code": 400, "message":
                                   "path '%s' is a directory" % path})
        with open(local, "rb") as f:
            data = f.read()
        return self.send(200, data, "application/octet-stream")

    def store(self, sbx, path, data):
        local = sbx.local(path)
        if local is None:
            raise ValueError("path '%s' is outside %s" % (path, HOME))
        if os.path.isdir(local):
            raise ValueError("path is a directory: %s" % sbx.remote(local))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "wb") as f:
            f.write(data)
        return {"path": sbx.remote(local), "name": os.path.basename(local),
                "type": "file"}

    def upload_body(self, raw):
        """The body as envd reads it: Content-Encoding gzip is decoded
        (what the SDKs send with gzip), identity or none taken as is,
        anything else refused. ValueError says why."""
        enc = self.headers.get("Content-Encoding", "").split(";")[0]
        enc = enc.strip().lower()
        if enc in ("", "identity"):
            return raw
        if enc != "gzip":
            raise ValueError("unsupported Content-Encoding: %s, supported: "
                             "[gzip]" % self.headers["Content-Encoding"])
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError("error decompressing request body: %s" % e)

    def write_files(self, sbx, q):
        """POST /files as envd takes it: application/octet-stream (the body
        is the file at ?path=) or multipart/form-data (each "file" part;
        ?path= when given, else the part's filename), gzip-encoded or not;
        any other type is refused."""
        raw = self.body()
        qpath = q.get("path", [None])[0]
        user = q.get("username", ["user"])[0]
        ctype = self.headers.get("Content-Type", "")
        mtype = ctype.split(";")[0].strip().lower()
        out = []
        if user not in ("user", "root"):
            return self.send(401, {"code": 401, "message": "error looking up "
                                   "user '%s': unknown user" % user})
        try:
            data = self.upload_body(raw)
            if mtype == "application/octet-stream":
                if not qpath:
                    raise ValueError("path query parameter is required for "
                                     "raw body upload")
                out.append(self.store(sbx, qpath, data))
            elif mtype.startswith("multipart/"):
                m = re.search(r'boundary="?([^";]+)"?', ctype)
                if not m:
                    raise ValueError("error parsing multipart form: no "
                                     "boundary")
                delim = b"--" + m.group(1).encode()
                for part in data.split(delim)[1:]:
                    if part.startswith(b"--"):
                        break
                    head, _, body = part.partition(b"\r\n\r\n")
                    if body.endswith(b"\r\n"):
                        body = body[:-2]
                    disp = re.search(rb'name="([^"]*)"(?:; filename="([^"]*)")?',
                                     head)
                    if not disp or disp.group(1) != b"file":
                        continue
                    fname = qpath or (disp.group(2) or b"").decode()
                    if any(sbx.local(e["path"]) == sbx.local(fname)
                           for e in out):
                        raise ValueError("you cannot upload multiple files "
                                         "to the same path '%s' in one "
                                         "upload request" % fname)
                    out.append(self.store(sbx, fname, body))
            else:
                raise ValueError("unsupported content type: %s, expected "
                                 "multipart/form-data or "
                                 "application/octet-stream" % ctype)
        except ValueError as e:
            return self.send(400, {"code": 400, "message": str(e)})
        return self.send(200, out)

    def resolve(self, sbx, local):
        """Where the symlink local leads, as a host path, following
        links as the sandbox sees them; None when it leads nowhere."""
        for _ in range(40):
            if not os.path.islink(local):
                return local if os.path.exists(local) else None
            target = os.readlink(local)
            if not target.startswith("/"):
                target = os.path.join(sbx.remote(os.path.dirname(local)),
                                      target)
            local = sbx.local(target)
            if local is None:
                return None
        return None

    def entry(self, sbx, local):
        """An EntryInfo as envd makes it: a symlink has its target's type
        and mode and a symlinkTarget; permissions is Go's FileMode text
        ("drwxr-xr-x", "Lrwxrwxrwx"); mode the permission bits."""
        lst = os.lstat(local)
        out = {"name": os.path.basename(local), "path": sbx.remote(local),
               "size": str(lst.st_size), "permissions": go_mode(lst.st_mode),
               "owner": "user", "group": "user",
               "modifiedTime": rfc3339(lst.st_mtime)}
        st = lst
        if stat.S_ISLNK(lst.st_mode):
            target = self.resolve(sbx, local)
            out["symlinkTarget"] = sbx.remote(target) if target else \
                sbx.remote(local)
            st = os.stat(target) if target else None
        if st is None:
            out["type"] = "FILE_TYPE_UNSPECIFIED"
        elif stat.S_ISDIR(st.st_mode):
            out["type"] = "FILE_TYPE_DIRECTORY"
        elif stat.S_ISREG(st.st_mode):
            out["type"] = "FILE_TYPE_FILE"
        else:
            out["type"] = "FILE_TYPE_UNSPECIFIED"
        out["mode"] = stat.S_IMODE(st.st_mode) & 0o777 if st else 0
        return out

    def fs_rpc(self, sbx, method):
        req = self.json_body()
        if not isinstance(req, dict):
            return self.send(400, {"code": "invalid_argument",
                                   "message": "invalid JSON"})

        def notfound(p):
            return self.send(404, {"code": "not_found",
                                   "message": "path '%s' not found" % p})
        path = req.get("path")
        if method == "ListDir":
            depth = req.get("depth", 1)
            local = sbx.local(path)
            if not isinstance(depth, int) or depth < 1:
                return self.send(400, {"code": "invalid_argument",
                                       "message": "depth must be >= 1"})
            if local is None or not os.path.isdir(local):
                return notfound(path)
            entries = []

            def walk(d, level):
                for name in sorted(os.listdir(d)):
                    full = os.path.join(d, name)
                    entries.append(self.entry(sbx, full))
                    if (level < depth and os.path.isdir(full)
                            and not os.path.islink(full)):
                        walk(full, level + 1)
            walk(local, 1)
            return self.send(200, {"entries": entries})
        if method == "Stat":
            local = sbx.local(path)
            if local is None or not os.path.lexists(local):
                return notfound(path)
            return self.send(200, {"entry": self.entry(sbx, local)})
        if method == "MakeDir":
            local = sbx.local(path)
            if local is None:
                return notfound(path)
            if os.path.isdir(local):
                return self.send(409, {"code": "already_exists",
                                       "message": "exists"})
            os.makedirs(local)
            return self.send(200, {"entry": self.entry(sbx, local)})
        if method == "Remove":
            local = sbx.local(path)
            if local is None or not os.path.lexists(local):
                return notfound(path)
            if os.path.isdir(local):
                shutil.rmtree(local)
            else:
                os.unlink(local)
            return self.send(200, {})
        if method == "Move":
            src, dst = sbx.local(req.get("source")), sbx.local(
                req.get("destination"))
            if src is None or dst is None or not os.path.lexists(src):
                return notfound(req.get("source"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            return self.send(200, {"entry": self.entry(sbx, dst)})
        return self.send(404, {"code": "unimplemented",
                               "message": "unknown method"})

    def process_start(self, sbx):
        raw = self.body()
        try:
            if self.headers.get("Content-Type", "").startswith(
                    "application/connect+json"):
                n = int.from_bytes(raw[1:5], "big")
                req = json.loads(raw[5:5 + n])
            else:
                req = json.loads(raw)
            proc = req["process"]
            argv = [proc["cmd"]] + list(proc.get("args", []))
        except (ValueError, KeyError, TypeError):
            return self.send(400, {"code": "invalid_argument",
                                   "message": "bad request"})
        # envd runs a command as the user of "Authorization: Basic
        # <user:>", else as the template's default user, "user"
        user = "user"
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            try:
                user = base64.b64decode(auth[6:]).decode().split(":")[0]
            except ValueError:
                user = ""
        if user not in ("user", "root"):
            return self.send(401, {"code": "unauthenticated", "message":
                                   "error looking up user '%s'" % user})
        cwd = sbx.local(proc.get("cwd")) or sbx.root
        env = dict(os.environ, HOME=sbx.root)
        if RUN_DIR:
            env.update(HOME="/root" if user == "root" else HOME, USER=user,
                       LOGNAME=user)
            argv = jail(sbx.root, sbx.tmp, sbx.remote(cwd), user) + argv
        env.update(sbx.envs)
        env.update(proc.get("envs") or {})
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, err = p.communicate()

        def frame(obj, flag=0):
            data = json.dumps(obj).encode()
            return bytes([flag]) + len(data).to_bytes(4, "big") + data
        frames = [frame({"event": {"start": {"pid": p.pid}}})]
        if out:
            frames.append(frame({"event": {"data": {
                "stdout": base64.b64encode(out).decode()}}}))
        if err:
            frames.append(frame({"event": {"data": {
                "stderr": base64.b64encode(err).decode()}}}))
        frames.append(frame({"event": {"end": {
            "exitCode": p.returncode, "exited": True,
            "status": "exit status %d" % p.returncode}}}))
        frames.append(frame({}, 2))
        return self.send(200, b"".join(frames), "application/connect+json")

    # ---- code interpreter ----
    def interpreter(self, sbx):
        url = urlsplit(self.path)
        path = url.path
        if path == "/health":
            return self.send(200, "OK")
        if path == "/execute" and self.command == "POST":
            return self.execute(sbx)
        if path == "/contexts" and self.command == "POST":
            req = self.json_body() or {}
            try:
                ctx = sbx.new_context(req.get("language") or "python",
                                      req.get("cwd") or HOME)
            except Exception as e:
                return self.send(500, "Failed to create context: %s" % e,
                                 "text/plain")
            return self.send(200, {"id": ctx.id, "language": ctx.language,
                                   "cwd": ctx.cwd})
        if path == "/contexts" and self.command == "GET":
            with sbx.lock:
                ctxs = list(sbx.contexts.values())
            return self.send(200, [{"id": c.id, "language": c.language,
                                    "cwd": c.cwd} for c in ctxs])
        m = re.fullmatch(r"/contexts/([^/]+)(/restart)?", path)
        if m:
            self.body()
            ctx = sbx.context(m.group(1))
            if not ctx:
                return self.send(404, "Context %s not found" % m.group(1),
                                 "text/plain")
            if m.group(2) and self.command == "POST":
                ctx.restart()
                return self.send(200, None)
            if not m.group(2) and self.command == "DELETE":
                with sbx.lock:
                    sbx.contexts.pop(ctx.id, None)
                ctx.shutdown()
                return self.send(200, None)
        self.body()
        return self.send(404, "Not Found", "text/plain")

    def chunk(self, obj):
        line = obj if isinstance(obj, bytes) else (
            json.dumps(obj) + "\n").encode()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise ClientGone()

    def execute(self, sbx):
        st = self.state
        if not self.token_ok(sbx):
            self.body()
            return self.send(401, {"code": 401, "message":
                                   "unauthorized access"})
        req = self.json_body()
        if not isinstance(req, dict) or not isinstance(req.get("code"), str):
            return self.send(422, {"detail": [{"loc": ["body", "code"],
                                               "msg": "field required"}]})
        envs = req.get("env_vars") or {}
        if not isinstance(envs, dict) or not all(
                isinstance(k, str) and isinstance(v, str)
                for k, v in envs.items()):
            return self.send(422, {"detail": [{"loc": ["body", "env_vars"],
                                               "msg": "str type expected"}]})
        if req.get("context_id") and req.get("language"):
            return self.send(400, "Only one of context_id or language can be "
                             "provided", "text/plain")
        fault = st.take_fault("execute")
        mode = fault.get("mode") if fault else None
        if mode == "proxy_502":
            return self.send(502, {"sandboxId": sbx.id, "message":
                                   "The sandbox was not found", "code": 502})
        ctx_id = req.get("context_id")
        ctx = sbx.context(ctx_id)
        if ctx is None:
            return self.send(404, "Context %s not found" % ctx_id,
                             "text/plain")
        with st.lock:
            st.stats["executions"] += 1
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        st.record("POST", "/execute", CI_PORT, 200)
        if mode == "never_end":
            self.chunk({"type": "number_of_executions",
                        "execution_count": 0})
            while True:
                time.sleep(st.keepalive_s)
                self.chunk({"type": "keepalive"})
        if mode == "aborted":
            # what the server sends when ipykernel refuses the request
            self.chunk({"type": "error", "name": "ExecutionAborted",
                        "value": "Execution was aborted", "traceback": ""})
            self.chunk({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            return
        if mode == "kill":
            self.chunk({"type": "number_of_executions",
                        "execution_count": 0})
            st.remove(sbx.id)
            return self.drop()
        with ctx.lock:
            ended = self.run_cell(sbx, ctx, with_envs(req["code"], envs),
                                  mode)
            if envs and ended:
                # the server resets them in a cell of its own once this
                # one ended, before the next runs: env_vars hold for one
                # run only
                reset_envs(ctx.kc, envs, sbx.envs)

    def drop(self):
        """Reset the connection as a dying sandbox VM does."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def run_cell(self, sbx, ctx, code, mode):
        """Run code, streaming its outputs; True when the stream ended
        with end_of_execution."""
        st = self.state
        kc = ctx.kc
        msg_id = kc.execute(code, allow_stdin=False, stop_on_error=True)
        sent = 0
        last = time.time()
        try:
            while True:
                try:
                    msg = kc.get_iopub_msg(timeout=0.5)
                except queue.Empty:
                    if not sbx.alive:
                        return self.drop()
                    if not ctx.km.is_alive():
                        self.chunk({"type": "error", "name": "WebSocketError",
                                    "value": "The connections was lost, rerun "
                                    "the code to get the results",
                                    "traceback": ""})
                        break
                    if time.time() - last >= st.keepalive_s:
                        self.chunk({"type": "keepalive"})
                        last = time.time()
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                line = self.translate(msg)
                if line == "idle":
                    break
                if line is None:
                    continue
                self.chunk(line)
                if line["type"] in ("stdout", "stderr"):
                    # the cell's output was seen: it runs (for tests
                    # that act on a running cell)
                    with st.lock:
                        st.stats["streams"] += 1
                last = time.time()
                sent += 1
                if mode == "malformed" and sent == 1:
                    self.chunk(b'{"type": "stdout", "text": \n')
                    self.chunk(b'\x00\xff garbage\n')
                if mode == "truncate" and sent >= 2:
                    # drop the connection without end_of_execution
                    self.drop()
                    self.drain(ctx, msg_id, interrupt=False)
                    return
            if self.reply_status(kc, msg_id) == "aborted":
                # ipykernel aborts requests that arrive while it still
                # unwinds a failed cell (stop_on_error); the real server
                # reports that as an error line
                self.chunk({"type": "error", "name": "ExecutionAborted",
                            "value": "Execution was aborted",
                            "traceback": ""})
            self.chunk({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            return True
        except ClientGone:
            self.close_connection = True
            self.drain(ctx, msg_id, interrupt=True)

    @staticmethod
    def reply_status(kc, msg_id):
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                reply = kc.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"].get("status")
        return None

    def drain(self, ctx, msg_id, interrupt):
        """The client went away: interrupt the kernel as the real server does
        and wait for the cell to finish so the next one starts clean."""
        if interrupt:
            try:
                ctx.km.interrupt_kernel()
            except Exception:
                return
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                msg = ctx.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if not ctx.km.is_alive():
                    return
                continue
            if (msg["parent_header"].get("msg_id") == msg_id
                    and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                return

    @staticmethod
    def translate(msg):
        t = msg["msg_type"]
        c = msg["content"]
        if t == "status" and c.get("execution_state") == "idle":
            return "idle"
        if t == "execute_input":
            return {"type": "number_of_executions",
                    "execution_count": c.get("execution_count")}
        if t == "stream":
            return {"type": c["name"], "text": c["text"],
                    "timestamp": now_iso()}
        if t == "error":
            return {"type": "error", "name": c["ename"], "value": c["evalue"],
                    "traceback": "".join(c["traceback"])}
        if t in ("execute_result", "display_data"):
            data = dict(c.get("data", {}))
            out = {"type": "result"}
            names = {"text/plain": "text", "text/html": "html",
                     "text/markdown": "markdown", "image/svg+xml": "svg",
                     "image/png": "png", "image/jpeg": "jpeg",
                     "application/pdf": "pdf", "text/latex": "latex",
                     "application/json": "json",
                     "application/javascript": "javascript",
                     "e2b/data": "data", "e2b/chart": "chart"}
            for mime, field in names.items():
                if mime in data:
                    out[field] = data.pop(mime)
            text = out.get("text")
            if (isinstance(text, str) and len(text) >= 2
                    and text[0] == text[-1] and text[0] in "'\""):
                out["text"] = text[1:-1]
            out["extra"] = data
            out["is_main_result"] = t == "execute_result"
            return out
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file")
    ap.add_argument("--api-key",
                    default="e2b_0123456789abcdef0123456789abcdef01234567")
    ap.add_argument("--keepalive-s", type=float, default=5.0)
    ap.add_argument("--max-timeout-s", type=int, default=3600,
                    help="the plan's longest sandbox timeout (Hobby 3600)")
    args = ap.parse_args()
    probe_jail()
    state = State(args.api_key, args.keepalive_s, args.max_timeout_s)
    api_cls = type("Api", (ApiHandler,), {"state": state})
    sbx_cls = type("Sbx", (SandboxHandler,), {"state": state})
    ThreadingHTTPServer.daemon_threads = True
    # the default listen backlog of 5 drops the SYNs of a burst of
    # clients, each then retried only after 1 s
    ThreadingHTTPServer.request_queue_size = 256
    api = ThreadingHTTPServer(("127.0.0.1", 0), api_cls)
    sbx = ThreadingHTTPServer(("127.0.0.1", 0), sbx_cls)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for srv in (api, sbx):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    text = "API %d\nSANDBOX %d\n" % (api.server_address[1],
                                     sbx.server_address[1])
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.port_file)
    sys.stdout.write(text)
    sys.stdout.flush()
    while not stop.wait(0.5):
        state.reap()
    api.shutdown()
    sbx.shutdown()
    state.shutdown()
    if KERNEL_DIR:
        shutil.rmtree(KERNEL_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
