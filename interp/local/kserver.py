# SPDX-License-Identifier: MIT
# kserver.py - the forking kernel server (built into coderq as a C string
# by interp/local/CMakeLists.txt; see docs/internals/protocols/kernel-server.md).
# It imports ipykernel and the configured modules once, single-threaded,
# and forks a fresh kernel per request, or a runner or a judging
# interpreter (a program of coderq's own, which the request carries); it
# never runs job code itself.
# A sandboxed kernel's outer process and pid 1 are a small program of their
# own (kinit/kinit.c) that this server runs; it forks the kernel into pid 1's
# namespaces.
# argv: SOCK_FD LIFE_FD PRELOAD (comma-separated modules) MPLRC (the text of
# every kernel's matplotlibrc) KINIT_FD (kinit/kinit.c's program, or -1)
# KIND ("kernels", or "light": a server for runners and judges only). One
# request, one reply, each one SOCK_SEQPACKET datagram of JSON; fds go as
# SCM_RIGHTS.
import os
import sys

# A thread in the server at fork time would exist in no child, holding
# whatever lock it held: numerical libraries must not start any.
for _v in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS',
           'NUMEXPR_NUM_THREADS', 'VECLIB_MAXIMUM_THREADS'):
    os.environ[_v] = '1'
# The server's environment before its imports: what they add to it
# (IMPORT_ENV) a kernel's own imports would have added to the kernel's.
START_ENV = dict(os.environ)
IMPORT_ENV = {}

import builtins
import codecs
import ctypes
import errno
import fcntl
import gc
import importlib
import json
import resource
import select
import signal
import socket
import stat
import struct
import time
import types

MAX_MSG = 65536
MPLRC_MAX = 2048  # CQ_KSERVER_MPLRC_MAX
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.restype = ctypes.c_long
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                       ctypes.c_ulong, ctypes.c_char_p]
libc.unshare.argtypes = [ctypes.c_int]
MS_NOSUID = 2
MS_NODEV = 4
MS_REC = 16384
MS_PRIVATE = 1 << 18


class Fail(Exception):
    pass


def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise Fail('could not %s: %s' % (what, os.strerror(e)))


def prctl(op, arg):
    check(libc.prctl(op, arg, 0, 0, 0), 'prctl %d' % op)


def threads():
    return len(os.listdir('/proc/self/task'))


def close_from(lowfd, keep=()):
    top = os.sysconf('SC_OPEN_MAX')
    lo = lowfd
    for fd in sorted(k for k in keep if k >= lowfd) + [top]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1


def confine(req):
    """rlimits, then the kernel's uid: as cq_sandbox_child() does before
    bubblewrap, and bubblewrap's no-new-privileges and empty bounding
    set."""
    # no core files: a crash helper named by the host's core_pattern
    # would write them as root, outside the sandbox
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for res, key in ((resource.RLIMIT_AS, 'mem'),
                     (resource.RLIMIT_NPROC, 'nproc'),
                     (resource.RLIMIT_FSIZE, 'fsize')):
        if req.get(key):
            resource.setrlimit(res, (req[key], req[key]))
    if req.get('sandbox'):
        with open('/proc/sys/kernel/cap_last_cap') as f:
            last = int(f.read())
        if os.geteuid() == 0:
            for cap in range(last + 1):
                prctl(PR_CAPBSET_DROP, cap)
    if req.get('drop'):
        os.setgroups([req['gid']])
        os.setgid(req['gid'])
        os.setuid(req['uid'])
        try:
            os.setuid(0)
        except OSError:
            pass
        else:
            raise Fail('could not drop root')
    if req.get('sandbox'):
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        deny_keyrings()


class SockFilter(ctypes.Structure):
    _fields_ = [('code', ctypes.c_uint16), ('jt', ctypes.c_uint8),
                ('jf', ctypes.c_uint8), ('k', ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [('len', ctypes.c_ushort),
                ('filter', ctypes.POINTER(SockFilter))]


BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7fff0000
X32_SYSCALL_BIT = 0x40000000
# add_key, request_key and keyctl in every syscall ABI a process on such a
# host can use: (AUDIT_ARCH_*, numbers). x86_64's x32 ABI reports
# AUDIT_ARCH_X86_64 with X32_SYSCALL_BIT set in the number; int 0x80 (and
# a 32-bit program) AUDIT_ARCH_I386; arm32 on aarch64 AUDIT_ARCH_ARM.
KEY_SYSCALLS = {
    'x86_64': ((0xc000003e, (248, 249, 250, 248 | X32_SYSCALL_BIT,
                             249 | X32_SYSCALL_BIT, 250 | X32_SYSCALL_BIT)),
               (0x40000003, (286, 287, 288))),
    'aarch64': ((0xc00000b7, (217, 218, 219)),
                (0x40000028, (309, 310, 311))),
}


def keyring_filter(machine):
    """The seccomp program that makes the key syscalls fail with EPERM:
    forked kernels run as host uids in the initial user namespace, where
    the kernel keyring of a uid (_uid.N) outlives the job that leased it
    (a cold kernel's dies with bubblewrap's user namespace). An ABI it
    does not know is killed, which no process on the host can reach."""
    arches = KEY_SYSCALLS.get(machine)
    if arches is None:
        raise Fail('no keyring filter for this host\'s architecture (%s): '
                   'sandboxed forked kernels need x86_64 or aarch64'
                   % machine)
    prog = [(BPF_LD_W_ABS, 0, 0, 4)]  # seccomp_data.arch
    for arch, nrs in arches:
        n = len(nrs)
        prog.append((BPF_JEQ_K, 0, n + 3, arch))
        prog.append((BPF_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
        prog += [(BPF_JEQ_K, n - i, 0, nr) for i, nr in enumerate(nrs)]
        prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
        prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM))
    prog.append((BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS))
    return prog


def deny_keyrings():
    """Installs keyring_filter() for this process and every process it
    starts (after PR_SET_NO_NEW_PRIVS), or fails: a kernel never runs
    without it."""
    prog = keyring_filter(os.uname().machine)
    insns = (SockFilter * len(prog))(*prog)
    fprog = SockFprog(len(prog), insns)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                     ctypes.addressof(fprog), 0, 0),
          'install the keyring filter (seccomp)')


def life_gone(life_fd):
    p = select.poll()
    p.register(life_fd, 0)
    return bool(p.poll(0))


def child_begin(req, parent):
    """The first steps of a forked child (a kernel, a runner, a judge) in
    its confinement: the signals and death of a fresh process, dumpable
    again, cwd its work dir."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if parent is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(124)
    # A process whose uid changed without an execve() is not dumpable,
    # which would hide its own /proc/self from it; after bubblewrap's
    # execve() a kernel is.
    prctl(PR_SET_DUMPABLE, 1)
    os.chdir(req['work_dir'])


def child_environ(req):
    """The request's environment, and what the imports the server made for
    the child set, as they set it (after the environment execve() gave;
    absent from /proc/PID/environ)."""
    os.environ.clear()
    for kv in req['env']:
        k, _, v = kv.partition('=')
        os.environ[k] = v
    set_environ(req['env'])
    for k, v in IMPORT_ENV.items():
        os.environ.setdefault(k, v)


def child_main(argv0, args, file=None):
    """sys.argv, sys.path without the work dir (the server's -c put ''
    first; a cold child runs with -P), a fresh __main__, and the random
    state a fresh process draws: random and numpy reseeded from the OS,
    and multiprocessing's authentication key (random when it is imported,
    which the preload may have done) its own. Returns __main__."""
    sys.argv = [argv0] + args
    if sys.path and sys.path[0] == '':
        del sys.path[0]
    main = types.ModuleType('__main__')
    if file is not None:
        main.__file__ = file
    sys.modules['__main__'] = main
    import random
    random.seed()
    if 'numpy' in sys.modules:
        sys.modules['numpy'].random.seed()
    mp = sys.modules.get('multiprocessing.process')
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)
    return main


def run_kernel(req, log_fd, parent):
    """The kernel process: what `python -m ipykernel_launcher -f CONN`
    would be, forked instead of started."""
    child_begin(req, parent)
    null = os.open('/dev/null', os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    close_from(3)
    child_environ(req)
    if req.get('probe'):
        os._exit(0)
    # As a cold kernel's `python -P -m ipykernel_launcher`: IPython adds ''
    # after the standard library in initialize().
    child_main(LAUNCHER, req['argv'], LAUNCHER)
    # What importing matplotlib in a fresh kernel reads: the kernel's own
    # MPLCONFIGDIR/matplotlibrc (the CJK font fallback). The server
    # imported matplotlib before this kernel's settings existed, and
    # applied what the file says in every kernel (apply_mpl_rc()).
    mpl = sys.modules.get('matplotlib')
    if mpl is not None:
        forget_mpl_dirs(mpl)
    rc = os.path.join(os.environ.get('MPLCONFIGDIR', ''), 'matplotlibrc')
    if mpl is not None and os.path.isfile(rc) and read_text(rc) != MPL_RC:
        mpl.rc_file(rc)
    from ipykernel import kernelapp
    if SHELL is not None:
        adopt_shell()
    code = 0
    traits = cached_traits()
    try:
        adopted = adopt_app()
        app = adopted[0] if adopted else None
        if app is None:
            # not the server's, made for other kernels (build_app())
            kernelapp.IPKernelApp.clear_instance()
            app = kernelapp.IPKernelApp.instance()
        if CLI is not None:
            adopt_cli(app)
        adopt_extensions(app)
        adopt_connection(app)
        # Its start-up makes some 100000 objects, all kept: collections
        # while it runs would find nothing to free.
        gc.disable()
        pinned = pin_start()
        flushes = quiet_flushes()
        try:
            app.initialize()
        finally:
            loud_flushes(flushes)
            unpin(pinned)
            unadopt_app(adopted)
        gc.enable()
        # the kernel's own code and the job's see traitlets as it was
        restore_traits(traits)
        traits = None
        # What importing matplotlib in a fresh kernel does with the
        # backend ipykernel has just chosen (inline figures).
        mpl = sys.modules.get('matplotlib')
        if mpl is not None and os.environ.get('MPLBACKEND'):
            mpl.rcParams['backend'] = os.environ['MPLBACKEND']
        if isinstance(req.get('warm'), str) and \
                isinstance(req.get('warm_out'), str):
            warm_up(app, req['warm'], req['warm_out'])
        app.start()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    finally:
        restore_traits(traits)
    child_exit(code)


def child_exit(code):
    """What an interpreter does as it ends: the atexit functions, stdout
    and stderr flushed; then the exit, with no other clean-up."""
    import atexit
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code)


# What the server forks besides kernels: a runner (interp/local/runner.py)
# or a judging interpreter (agent/judge.py), each the program its request
# names, compiled here once (compiling runs none of it) and run in the
# child only, as `python -c PROGRAM ARGS` would run it.
PROGRAM_OPS = ('runner', 'judge')
PROGRAMS = {}


def compiled(op, text):
    """The code of the program of the latest request of \p op."""
    if not isinstance(text, str) or '\0' in text:
        raise Fail('%s: no program' % op)
    held = PROGRAMS.get(op)
    if held is None or held[0] != text:
        held = (text, compile(text, '<string>', 'exec'))
        PROGRAMS[op] = held
    return held[1]


# The server's own standard streams, kept: a child that dropped them
# would close fds 0-2 when they are collected, which are its own there.
SERVER_STDIO = []


def run_program(req, fds, parent):
    """A runner or a judging interpreter: what `python -c PROGRAM ARGS`
    would be, forked instead of started, with fds as its 0-3 (for a
    runner: /dev/null, the pipes of its cells' stdout and stderr, its
    control socket; for a judge: its requests, /dev/null twice, its
    answers)."""
    child_begin(req, parent)
    for f in (sys.stdout, sys.stderr):
        f.flush()
    SERVER_STDIO.extend((sys.stdin, sys.stdout, sys.stderr, sys.__stdin__,
                         sys.__stdout__, sys.__stderr__))
    # sources above the targets, so no dup2() below overwrites one
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]
    for target, fd in enumerate(moved):
        os.dup2(fd, target)
    close_from(len(fds))
    child_environ(req)
    main = child_main('-c', req['argv'])
    sys.stdin = sys.__stdin__ = open(0, 'r', encoding='utf-8',
                                     closefd=False)
    sys.stdout = sys.__stdout__ = open(1, 'w', encoding='utf-8',
                                       closefd=False)
    sys.stderr = sys.__stderr__ = open(2, 'w', encoding='utf-8',
                                       errors='backslashreplace',
                                       closefd=False, buffering=1)
    code = 0
    try:
        if req.get('_preload') is not None:
            # ours (a runner's test harness), before any job code, in a
            # namespace of its own: what it keeps, it keeps in sys.modules
            exec(req['_preload'], {'__builtins__': builtins,
                                   '__name__': '_coderq_preload'})
        exec(req['_code'], main.__dict__)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else e.code is not None
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    child_exit(code & 0xff)


def run_child(req, fds, parent):
    """The child a request asked for, in its confinement: a kernel (its log
    the one fd) or a program."""
    if req['op'] in PROGRAM_OPS:
        run_program(req, fds, parent)
    run_kernel(req, fds[0], parent)


def log_of(req, fds):
    """Where a child's start reports its failure: a kernel's log, a
    program's stderr."""
    return fds[2] if req['op'] in PROGRAM_OPS else fds[0]


def title(req):
    """What ps shows of a child and its parent: the command a cold one
    runs (a program's text shown by its name); None for a probe."""
    if req.get('probe'):
        return None
    if req['op'] in PROGRAM_OPS:
        return [sys.executable, '-c', 'coderq-' + req['op']] + req['argv']
    return [sys.executable] + LAUNCH + req['argv']


def watch_pipe_fd(self):
    """ipykernel's OutStream._watch_pipe_fd, which reads what is written to
    fds 1 and 2 themselves (a subprocess, a C library), made to decode
    UTF-8 across reads and to make invalid bytes U+FFFD: ipykernel's own
    decodes each 1000-byte read strictly, and the first character split
    between two reads ended it, losing every later byte written there and
    blocking the writers once the pipe was full. The same as the client's
    output shim installs in a cold kernel (kernel.c)."""
    dec = codecs.getincrementaldecoder('utf-8')('replace')
    while True:
        try:
            b = os.read(self._fid, 65536)
        except InterruptedError:
            continue
        except OSError:
            return
        try:
            t = dec.decode(b, final=not b)
            if t:
                self.write(t)
        except Exception:
            pass
        if not b or not self._should_watch:
            return
        try:
            os.write(self._original_stdstream_copy, b)
        except OSError:
            pass


watch_pipe_fd._cq_watch = True


def fit_fd_watcher():
    """Every kernel's stream watchers run watch_pipe_fd()."""
    from ipykernel import iostream
    iostream.OutStream._watch_pipe_fd = watch_pipe_fd


def forget_mpl_dirs(mpl):
    """matplotlib remembers its config and cache directories from their
    first use, the server's (its MPLCONFIGDIR): forget them, so that this
    kernel finds its own (matplotlib_fname() and the caches follow
    get_configdir()), as its import would in a cold kernel. A matplotlib
    whose memo is not _logged_cached's two cells is left as it is."""
    for name in ('get_configdir', 'get_cachedir'):
        f = getattr(mpl, name, None)
        code = getattr(f, '__code__', None)
        if code is None or f.__closure__ is None:
            continue
        cells = dict(zip(code.co_freevars, f.__closure__))
        if set(cells) >= {'called', 'ret'} and \
                isinstance(cells['called'].cell_contents, bool):
            cells['called'].cell_contents = False
            cells['ret'].cell_contents = None


def pin_start():
    """Hold this kernel to the CPU it runs on while it initializes;
    returns the mask unpin() restores, or None when there is nothing to
    do. From init_sockets() on a kernel has threads (iopub, heartbeat,
    control and libzmq's own) while its main thread writes to
    thousands of the server's pages, and every copy-on-write fault of a
    process whose threads ran on another CPU flushes that CPU's TLB with
    an interrupt: on one CPU a fault flushes only its own. Measured with
    perf, those flushes and the page-table lock they hold were a sixth
    of a forked start's CPU. Nothing of a job runs while it is held."""
    try:
        mask = os.sched_getaffinity(0)
        cpu = libc.sched_getcpu()
        if len(mask) < 2 or cpu not in mask:
            return None
        os.sched_setaffinity(0, {cpu})
        return mask
    except OSError:
        return None


def unpin(mask):
    """Every thread of the kernel (those initialize() started inherited
    the pin) back on \\p mask, before the kernel answers anything."""
    if mask is None:
        return
    for tid in os.listdir('/proc/self/task'):
        try:
            os.sched_setaffinity(int(tid), mask)
        except (OSError, ValueError):
            pass


# what the report keeps of the warm-up's output: JSON makes a character at
# most 12 bytes, within what the client reads (WARM_MAX in kernel.c)
WARM_OUT_MAX = 1 << 14


def warm_up(app, code, out_path):
    """The client's warm-up cell, run as ipykernel runs a silent
    execute_request (no history, no execution count), before the kernel
    answers anything: what the cell prints and whether it failed go to
    \\p out_path as JSON for the client, not to iopub, which nobody has
    subscribed to yet. Saves the kernel a request's round trip."""
    import io
    buf = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = buf
    error = None
    try:
        result = app.shell.run_cell(code, store_history=False, silent=True)
        error = result.error_before_exec or result.error_in_exec
    except BaseException as e:  # what a cell's own failure would be
        error = e
    finally:
        sys.stdout, sys.stderr = saved
    text = json.dumps({'ok': error is None,
                       'ename': type(error).__name__ if error else None,
                       'evalue': str(error)[:WARM_OUT_MAX] if error else None,
                       'stdout': buf.getvalue()[:WARM_OUT_MAX]})
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                 os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        data = memoryview(text.encode('ascii'))
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


# The settings every kernel's shell gets (kernel_proc.c's argv after the
# connection file): the shell the server builds has them, and a kernel
# whose settings differ builds its own.
SHELL_ARGV = ['--HistoryManager.hist_file=:memory:',
              '--InteractiveShell.colors=NoColor']
# The application's own sections of a kernel's config: no shell reads them.
APP_SECTIONS = ('IPKernelApp', 'KernelApp', 'BaseIPythonApplication',
                'Application')
SHELL = None
SHELL_CONFIG = None


def shell_config(config):
    return {k: v for k, v in config.items() if k not in APP_SECTIONS}


def build_shell():
    """The InteractiveShell (its namespaces, magics, aliases, completer,
    formatters and history) that IPythonKernel's constructor builds, made
    once here, before any fork: a child only fits it to its kernel
    (fit_shell()). No code ever runs in it here."""
    global SHELL, SHELL_CONFIG
    import atexit
    from traitlets.config.loader import KVArgParseConfigLoader
    from ipykernel.compiler import XCachingCompiler
    from ipykernel.zmqshell import ZMQInteractiveShell
    config = KVArgParseConfigLoader(argv=SHELL_ARGV).load_config()
    main = sys.modules.get('__main__')
    try:
        shell = ZMQInteractiveShell.instance(config=config,
                                             compiler_class=XCachingCompiler)
    finally:
        # the shell made its namespace __main__; the server's stays
        sys.modules['__main__'] = main
    # a kernel's exit, not the server's
    atexit.unregister(shell.atexit_operations)
    forget_history_session(shell.history_manager)
    SHELL, SHELL_CONFIG = shell, config


def forget_history_session(hm):
    """The history session the shell opened, undone: each kernel opens
    its own (fit_shell()), which is then the first of its in-memory
    database, as a cold kernel's is, and has no session of the server's
    to close first (an UPDATE and a write-out of the input cache in every
    kernel). Only for the in-memory database kernels are given, and the
    schema IPython made it with; otherwise the session stays."""
    if getattr(hm, 'hist_file', None) != ':memory:' or \
            getattr(hm, 'session_number', None) != 1 or \
            getattr(hm, 'db', None) is None:
        return
    with hm.db:
        if hm.db.execute('SELECT count(*) FROM sessions').fetchone() != (1,):
            return
        hm.db.execute('DELETE FROM sessions')
        hm.db.execute("DELETE FROM sqlite_sequence WHERE name = 'sessions'")
    hm.session_number = 0


# The extensions every kernel's application loads (InteractiveShellApp's
# default_extensions, IPython's storemagic, which registers its magics
# and nothing else), loaded into the server's shell once, and the
# configurables that added to the shell. A kernel with the server's shell
# and that list skips init_extensions() (adopt_extensions()): loading the
# extension looks for a top-level module of its name on sys.path first,
# ~1 ms of a forked start.
PRELOADED = None


def preload_extensions(shell):
    global PRELOADED
    from ipykernel.kernelapp import IPKernelApp
    exts = IPKernelApp.class_traits()['default_extensions'].default()
    if shell is None or list(exts) != ['storemagic']:
        return  # another IPython: whatever it loads, it loads in kernels
    before = list(shell.configurables)
    for ext in exts:
        shell.extension_manager.load_extension(ext)
    PRELOADED = (list(exts), [c for c in shell.configurables
                              if all(c is not b for b in before)])


# The keys of a connection file that say where and how a kernel listens.
CONN_KEYS = ('transport', 'ip', 'shell_port', 'iopub_port', 'stdin_port',
             'control_port', 'hb_port', 'key', 'signature_scheme')


def connection_of(app):
    """What \\p app would write into its connection file, by CONN_KEYS."""
    key = app.session.key
    return {'transport': app.transport, 'ip': app.ip,
            'shell_port': app.shell_port, 'iopub_port': app.iopub_port,
            'stdin_port': app.stdin_port, 'control_port': app.control_port,
            'hb_port': app.hb_port,
            'key': key.decode('ascii') if isinstance(key, bytes) else key,
            'signature_scheme': app.session.signature_scheme}


def adopt_connection(app):
    """init_connection_file() and write_connection_file() of \\p app for
    the file the client wrote: read straight from its absolute path (the
    original looks for it in the runtime dir too, and resolves that dir),
    and not written again when the kernel listens exactly where the file
    says, as it does with the client's fixed ipc ports; any other case
    goes to the originals. About 30 fewer pages written per forked start
    (bench_kernel's fork_faults_kernel, alternated runs)."""
    orig_init = app.init_connection_file
    orig_write = app.write_connection_file
    loaded = {}

    def init_connection_file():
        path = app.connection_file
        try:
            if not os.path.isabs(path):
                raise ValueError('relative')
            with open(path, 'rb') as f:
                info = json.loads(f.read(1 << 16))
            if (not isinstance(info, dict) or info.get('transport') != 'ipc'
                    or not all(info.get(k) for k in CONN_KEYS)):
                raise ValueError('not a file of the client')
        except (OSError, ValueError):
            return orig_init()
        app.load_connection_info(info)
        loaded.update((k, info[k]) for k in CONN_KEYS)

    def write_connection_file():
        if not loaded or connection_of(app) != loaded:
            return orig_write()

    app.init_connection_file = init_connection_file
    app.write_connection_file = write_connection_file


def adopt_extensions(app):
    """init_extensions() of \\p app a no-op when its shell is the server's
    and its extensions are those the server loaded into it, but for the
    order of the shell's configurables: a kernel appends the extension's
    after the application's."""
    if PRELOADED is None:
        return
    orig = app.init_extensions

    def init_extensions():
        exts = app.default_extensions + app.extensions + app.extra_extensions
        if app.shell is not SHELL or exts != PRELOADED[0]:
            return orig()
        conf = app.shell.configurables
        for c in PRELOADED[1]:
            for i, x in enumerate(conf):
                if x is c:
                    del conf[i]
                    break
            conf.append(c)

    app.init_extensions = init_extensions


def quiet_flushes():
    """While a kernel initializes nothing but IPython writes to its output
    streams, and it flushes them four times with nothing in them: each
    flush hands its work to the iopub thread and waits for it (a thread
    round trip, ~0.2 ms of CPU each here). An OutStream with nothing in its
    buffer and no flush pending flushes on this thread instead: what the
    iopub thread would do (its echo stream; no message). Returns what
    loud_flushes() puts back."""
    from ipykernel.iostream import OutStream
    orig = vars(OutStream).get('flush')
    if orig is None:
        return None

    def flush(self):
        try:
            idle = (not self._flush_pending and
                    not self._subprocess_flush_pending and
                    self._buffer.tell() == 0)
        except AttributeError:
            idle = False
        return self._flush() if idle else orig(self)

    OutStream.flush = flush
    return orig


def loud_flushes(orig):
    if orig is not None:
        from ipykernel.iostream import OutStream
        OutStream.flush = orig


def fit_shell(shell, kw):
    """What IPythonKernel asks of the shell (its parent, the kernel, the
    profile) and what InteractiveShell's constructor took from the
    process (environment, working and home directory, __main__), applied
    to the server's shell in the kernel."""
    import atexit
    from pickleshare import PickleShareDB
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir
    from IPython.utils.path import get_home_dir
    parent = kw['parent']
    app = getattr(parent, 'parent', None)
    shell.parent = parent
    shell.kernel = kw.get('kernel')
    # A cold shell takes its IPython directory before its extension
    # manager exists, which would make an 'extensions' dir there on a
    # change; the server's has one already.
    em = getattr(shell, 'extension_manager', None)
    seen = getattr(em, '_on_ipython_dir_changed', None)
    if seen is not None:
        shell.unobserve(seen, names=('ipython_dir',))
    try:
        shell.ipython_dir = (getattr(app, 'ipython_dir', None) or
                             get_ipython_dir())
    finally:
        if seen is not None:
            shell.observe(seen, names=('ipython_dir',))
    if kw.get('profile_dir') is not None:
        shell.profile_dir = kw['profile_dir']
    else:
        shell.profile_dir = ProfileDir.create_profile_dir_by_name(
            shell.ipython_dir, 'default')
    shell.db = PickleShareDB(os.path.join(shell.profile_dir.location, 'db'))
    shell.starting_dir = os.getcwd()
    shell.home_dir = get_home_dir()
    shell.logger.home_dir = shell.home_dir
    shell.init_environment()
    # a session of its own, the directory history (_dh) from here
    shell.history_manager.reset(new_session=True)
    sys.modules[shell.user_module.__name__] = shell.user_module
    atexit.register(shell.atexit_operations)


def adopt_shell():
    """Make IPythonKernel's ZMQInteractiveShell.instance() call return
    the server's shell, fitted to this kernel, when the kernel asks for
    what it was built as; otherwise drop it and build a new one, as a
    cold kernel does."""
    from ipykernel.zmqshell import ZMQInteractiveShell
    shell, orig = SHELL, ZMQInteractiveShell.instance.__func__

    def instance(cls, *args, **kw):
        ZMQInteractiveShell.instance = classmethod(orig)
        parent = kw.get('parent')
        if (cls is type(shell) and not args and parent is not None and
                kw.get('user_module') is None and kw.get('user_ns') is None
                and kw.get('compiler_class') is type(shell.compile) and
                shell_config(parent.config) == SHELL_CONFIG):
            fit_shell(shell, kw)
            return shell
        ZMQInteractiveShell.clear_instance()
        return orig(cls, *args, **kw)

    ZMQInteractiveShell.instance = classmethod(instance)


# The command line of every kernel but for its connection file
# (kernel_proc.c's: -f CONN, then SHELL_ARGV), parsed once here as
# Application.parse_command_line() parses it (traitlets builds an
# argparse parser over every configurable class: some 10 ms, and pages
# of the server's objects written in each child).
CONN_MARK = '/coderq-kernel-server/connection-file.json'
CLI = None


def cache_cli():
    """The Config that IPKernelApp's loader makes of the kernels'
    command line, with CONN_MARK where the connection file goes."""
    global CLI
    import logging
    from ipykernel.kernelapp import IPKernelApp
    from traitlets.config.loader import KVArgParseConfigLoader
    app = IPKernelApp()  # not the instance: never initialized
    flags, aliases = app.flatten_flags()
    classes = tuple(app._classes_with_config_traits())
    loader = KVArgParseConfigLoader(['-f', CONN_MARK] + SHELL_ARGV, aliases,
                                    flags, classes=classes,
                                    log=logging.getLogger('coderq.kserver'))
    config = loader.load_config()
    if loader.extra_args:
        raise Fail('the kernels\' command line left %r' % loader.extra_args)
    where = [(sec, key) for sec, sub in config.items()
             if hasattr(sub, 'items') for key, v in sub.items()
             if v == CONN_MARK]
    if len(where) != 1:
        raise Fail('the connection file is not one setting: %r' % where)
    CLI = (config, where[0])


def adopt_cli(app):
    """IPKernelApp.parse_command_line() for this kernel: the cached
    Config with its connection file, applied as the original applies
    what its loader returns, when the command line is the one the server
    parsed; any other goes to the original."""
    import copy
    config0, (sec, key) = CLI
    orig = type(app).parse_command_line

    def parse_command_line(argv=None):
        argv = sys.argv[1:] if argv is None else argv
        if (len(argv) != 2 + len(SHELL_ARGV) or argv[0] != '-f' or
                not argv[1] or argv[1].startswith('-') or
                list(argv[2:]) != SHELL_ARGV):
            return orig(app, argv)
        app.argv = list(argv)
        config = copy.deepcopy(config0)
        config[sec][key] = argv[1]
        app.cli_config = config
        app.update_config(config)
        app.extra_args = []

    app.parse_command_line = parse_command_line


# What IPKernelApp.initialize() does before its connection file and
# sockets (the part BaseIPythonApplication.initialize() does: the command
# line, the crash handler, the profile directory and the config files),
# done once here for every sandboxed kernel: their IPython directory is
# the same path (CQ_KERNEL_BOXED_IPYTHONDIR in kernel.h) on a tmpfs of
# their own, their command line the same but for the connection file.
# Made in a mount namespace of the server's own with a fresh tmpfs on /tmp,
# as a kernel's /tmp is, so nothing of the host's /tmp is read or
# written; what IPython made there is recorded and made again in each
# kernel (adopt_app()).
BOXED_IPYTHONDIR = '/tmp/ipython'
APP = None
# the names BaseIPythonApplication.initialize() uses in the IPython this
# was written against; another leaves every kernel to run its own
BASE_INIT_NAMES = ('parse_command_line', 'init_crash_handler', 'subapp',
                   'deepcopy', 'config', 'init_profile_dir',
                   'init_config_files', 'load_config_file', 'update_config')


def record_tree(top):
    """Every directory and regular file under \\p top: (path, mode,
    data or None), parents first."""
    out = []
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for d in dirs:
            path = os.path.join(root, d)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise Fail('%s is not a directory' % path)
            out.append((path, st.st_mode & 0o7777, None))
        for f in sorted(files):
            path = os.path.join(root, f)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
                raise Fail('%s is not a small regular file' % path)
            with open(path, 'rb') as fh:
                out.append((path, st.st_mode & 0o7777, fh.read()))
    return tuple(out)


def build_app():
    """The application every sandboxed kernel would make before its
    connection file, made here (see above); APP stays None where it
    cannot be (not root, an IPython of another shape, a config file
    that would run code): kernels then make their own."""
    global APP
    import copy
    from IPython.core.application import BaseIPythonApplication
    from ipykernel.kernelapp import IPKernelApp
    base = getattr(BaseIPythonApplication.initialize, '__wrapped__', None)
    if (os.geteuid() != 0 or CLI is None or base is None or
            base.__code__.co_names != BASE_INIT_NAMES):
        return
    own = os.open('/proc/self/ns/mnt', os.O_RDONLY | os.O_CLOEXEC)
    here = os.open('.', os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    env = os.environ.get('IPYTHONDIR')
    hook = sys.excepthook
    try:
        check(libc.unshare(CLONE_NEWNS), 'make a mount namespace')
        try:
            check(libc.mount(b'none', b'/', None, MS_REC | MS_PRIVATE, None),
                  'make / private')
            check(libc.mount(b'tmpfs', b'/tmp', b'tmpfs', MS_NOSUID | MS_NODEV,
                             b'size=4m,mode=1777'), 'mount a tmpfs on /tmp')
            os.environ['IPYTHONDIR'] = BOXED_IPYTHONDIR
            app = IPKernelApp.instance()
            adopt_cli(app)
            app.parse_command_line(['-f', CONN_MARK] + SHELL_ARGV)
            app.init_crash_handler()
            cl_config = copy.deepcopy(app.config)
            app.init_profile_dir()
            app.init_config_files()
            for d in app.config_file_paths:
                if d.startswith('/tmp/'):
                    continue
                for name in ('ipython_config', app.config_file_name):
                    for ext in ('.py', '.json'):
                        if os.path.lexists(os.path.join(d, name + ext)):
                            raise Fail('a config file in %s' % d)
            app.load_config_file()
            app.update_config(cl_config)
            tree = record_tree('/tmp')
        finally:
            if env is None:
                os.environ.pop('IPYTHONDIR', None)
            else:
                os.environ['IPYTHONDIR'] = env
            sys.excepthook = hook
            if libc.setns(own, CLONE_NEWNS) != 0:
                os.write(2, b'kernel server: could not return to its mount '
                         b'namespace\n')
                os._exit(70)
            os.fchdir(here)
    finally:
        os.close(own)
        os.close(here)
    APP = (app, tree)


def make_tree(tree):
    for path, mode, data in tree:
        if data is None:
            os.mkdir(path, mode)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                         os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        os.chmod(path, mode)


def adopt_app():
    """The server's application for this kernel, when it was made for
    what this kernel is (its IPython directory, not yet on its /tmp, its
    command line): the tree the server's profile made, made here, and
    BaseIPythonApplication.initialize() reduced to applying this kernel's
    connection file until it has run once. Returns the application and
    what unadopt_app() puts back, or None: the kernel makes its own."""
    from IPython.core.application import BaseIPythonApplication
    if APP is None or os.environ.get('IPYTHONDIR') != BOXED_IPYTHONDIR:
        return None
    argv = sys.argv[1:]
    if (len(argv) != 2 + len(SHELL_ARGV) or argv[0] != '-f' or
            not argv[1] or argv[1].startswith('-') or
            list(argv[2:]) != SHELL_ARGV or
            os.path.lexists(BOXED_IPYTHONDIR)):
        return None
    app, tree = APP
    try:
        make_tree(tree)
    except OSError:
        return None  # what exists of it, the kernel's own start completes
    _, (sec, key) = CLI
    orig = vars(BaseIPythonApplication)['initialize']

    def initialize(self, argv=None):
        """What BaseIPythonApplication.initialize() leaves of a kernel's
        command line different from the server's: its connection file;
        and the crash handler the server made, as sys.excepthook."""
        from traitlets.config.loader import Config
        BaseIPythonApplication.initialize = orig
        if self is not app:
            return orig(self, argv)
        self.argv = list(sys.argv[1:])
        self.cli_config[sec][key] = sys.argv[2]
        conf = Config()
        conf[sec][key] = sys.argv[2]
        self.update_config(conf)
        sys.excepthook = self.excepthook

    BaseIPythonApplication.initialize = initialize
    return app, orig


def unadopt_app(adopted):
    if adopted is not None:
        from IPython.core.application import BaseIPythonApplication
        BaseIPythonApplication.initialize = adopted[1]


def read_text(path):
    try:
        with open(path, encoding='utf-8', errors='surrogateescape') as f:
            return f.read(1 << 16)
    except OSError:
        return None


MPL_RC = None


def apply_mpl_rc(text):
    """What importing matplotlib in a kernel whose MPLCONFIGDIR has a
    matplotlibrc saying \\p text makes of rcParams, and of rcParamsOrig
    (what rc_file_defaults() restores): the file over the defaults."""
    global MPL_RC
    mpl = sys.modules['matplotlib']
    fd = os.memfd_create('matplotlibrc', os.MFD_CLOEXEC)
    try:
        os.write(fd, text.encode('utf-8', 'surrogateescape'))
        path = '/proc/self/fd/%d' % fd
        mpl.rc_file(path)
        dict.update(mpl.rcParamsOrig, dict.items(
            mpl.rc_params_from_file(path, use_default_template=True)))
    finally:
        os.close(fd)
    MPL_RC = text


# The name ipykernel gives each cell's code (its tracebacks' file name,
# its linecache entry): murmur2 of the cell's UTF-8 text, in pure Python,
# 0.57 ms of CPU for the warm-up's 4.5 KB and about as much per 4.5 KB of
# every cell a job runs. The same hash with the blocks' mixing done by
# numpy (or struct, without numpy), the chaining alone left to Python:
# 0.10 ms. fast_murmur() puts it in ipykernel.compiler, which looks the
# name up at every call, when it gives the original's answers on a few
# texts; check_kernel compares it with the algorithm on random texts.
M32 = 0xFFFFFFFF
MURMUR_M = 0x5BD1E995


def murmur2_x86(data, seed):
    b = str.encode(data, 'utf8')
    length = len(b)
    h = seed ^ length
    end = length & ~3
    np = sys.modules.get('numpy')
    if np is not None:
        ks = np.frombuffer(b, '<u4', end >> 2).astype(np.uint64)
        ks = (ks * MURMUR_M) & M32
        ks ^= ks >> 24
        ks = (ks * MURMUR_M) & M32
        for k in ks.tolist():
            h = ((h * MURMUR_M) & M32) ^ k
    else:
        for k in struct.unpack_from('<%dI' % (end >> 2), b):
            k = (k * MURMUR_M) & M32
            k ^= k >> 24
            h = ((h * MURMUR_M) & M32) ^ ((k * MURMUR_M) & M32)
    if length & 3:
        h ^= int.from_bytes(b[end:], 'little')
        h = (h * MURMUR_M) & M32
    h ^= h >> 13
    h = (h * MURMUR_M) & M32
    h ^= h >> 15
    return h


def fast_murmur():
    from ipykernel import compiler
    orig = getattr(compiler, 'murmur2_x86', None)
    if orig is None:
        return
    seed = compiler.get_tmp_hash_seed()
    for text in ('', 'a', 'ab', 'abc', 'abcd', 'h\u00e9llo\n\u4e2d\U0001f600',
                 'x = 1\nprint(x)\n' * 97):
        if orig(text, seed) != murmur2_x86(text, seed):
            raise Fail('the hash differs from ipykernel\'s')
    compiler.murmur2_x86 = murmur2_x86


def warm_caches():
    """Fill what a kernel's first message and first cell fill lazily,
    with constant input, nothing of a job: tokenize's compiled patterns
    (IPython tokenizes every cell), the glob patterns of the startup
    files, the date parser of message headers, IPython's transformers,
    glibc's name service, OpenSSL's algorithm tables."""
    import fnmatch
    import io
    import tokenize
    src = ('x = 1\ns = "a" + \'b\' + """c""" + \'\'\'d\'\'\' + f"{x}" + '
           'rb"e".decode()\n')
    list(tokenize.generate_tokens(io.StringIO(src).readline))
    for pat in ('*.py', '*.ipy'):
        fnmatch.filter([], pat)
    from jupyter_client.jsonutil import extract_dates
    extract_dates({'date': '2026-01-01T00:00:00.000000Z'})
    if SHELL is not None:
        SHELL.input_transformer_manager.transform_cell(src)
    # glibc reads nsswitch.conf and looks for its NSS modules (some 60
    # paths) on a process's first protocol lookup, which libzmq makes in
    # every kernel's first context: once here, for all of them.
    socket.getprotobyname('tcp')
    # OpenSSL fills its tables of algorithms on the first use of one: a
    # kernel signs every message with HMAC-SHA256 (and makes a session
    # id from the OS's random source).
    import hashlib
    import hmac
    import uuid
    hmac.new(b'key', b'message', hashlib.sha256).hexdigest()
    uuid.uuid4()


def warm_abc_answers():
    """An ABC remembers which classes are not its subclasses, until any
    ABC registers a class. With numpy's and pandas' registered, "is str
    a Mapping?" walks Mapping's whole tree of subclasses, 0.4-0.6 ms of
    CPU the first time in every kernel, whose start-up logs "Loading
    connection file %s" and "Starting the kernel at pid: %i". Asked once
    here, after the last import (abc.get_cache_token() says whether a
    kernel finds the answers still valid). Answers for the builtin types
    only: nothing of a job."""
    import collections.abc
    # logging.LogRecord asks it of a record's one argument
    for v in ('', 0, 0.0, b'', (), [], None, True):
        isinstance(v, collections.abc.Mapping)


def compact_module_keys():
    """sys.modules with its keys replaced by equal copies made together,
    in order. At the end of its start IPython records
    set(sys.modules.keys()) (for %reset -f's aggressive mode): with the
    keys the import system made, some 1500 strings spread over as many
    pages, the set's reference to each would copy every one of those
    pages in every kernel. The dict stays the one the interpreter
    knows; no code runs while a module is briefly out of it."""
    mods = sys.modules
    for k, v in list(mods.items()):
        if type(k) is not str:
            continue
        c = k.encode('utf-8', 'surrogatepass').decode('utf-8',
                                                      'surrogatepass')
        del mods[k]
        mods[c] = v


# traits(config=True) of every Configurable class, as HasTraits.traits()
# finds them: by getattr() on each of the class's members, which writes a
# reference count into every member (a few hundred functions and traits
# for IPKernelApp), copying their pages in each kernel that asks. A kernel
# asks it of each Configurable it makes while it starts; the answer was
# made here, once (cache_traits()).
CONFIG_TRAITS = None


def cache_traits():
    global CONFIG_TRAITS
    from traitlets import traitlets as tl
    from traitlets.config.configurable import Configurable
    out, todo = {}, [Configurable]
    while todo:
        cls = todo.pop()
        if cls in out:
            continue
        todo.extend(type.__subclasses__(cls))
        try:
            members = tl.getmembers(cls)
        except Exception:
            continue  # asked of the class itself, as traitlets does
        # traitlets' test of metadata config=True: _SimpleTest(True)
        out[cls] = {k: v for k, v in members if isinstance(v, tl.TraitType)
                    and v.metadata.get('config', None) == True}  # noqa: E712
    CONFIG_TRAITS = out


# The code HasTraits.traits and HasDescriptors.setup_instance run while a
# kernel starts (cached_traits()): run as traitlets' own functions, with
# traitlets' globals, where cached_traits() puts the names they use.
def _cq_traits(self, **metadata):
    got = None
    if len(metadata) == 1 and metadata.get('config', None) is True:
        got = _cq_config_traits.get(self.__class__)  # noqa: F821
    if got is not None:
        return dict(got)
    return _cq_traits_orig(self, **metadata)  # noqa: F821


def _cq_setup_instance(*args, **kwargs):
    self = args[0]
    inits = _cq_instance_inits.get(self.__class__)  # noqa: F821
    if inits is None:
        return _cq_setup_orig(*args, **kwargs)  # noqa: F821
    self._cross_validation_lock = False
    for value in inits:
        value.instance_init(self)


CQ_TRAIT_NAMES = ('_cq_config_traits', '_cq_traits_orig',
                  '_cq_instance_inits', '_cq_setup_orig')


def cached_traits():
    """HasTraits.traits() answering traits(config=True) of the classes
    cache_traits() saw from the cache (a new dict each call, as the
    original's), and HasDescriptors.setup_instance() initializing the
    descriptors cache_instance_inits() found; every other question goes
    to the original. Not by assigning other functions to the classes:
    that invalidates the method caches of every subclass of HasTraits,
    writing into each class object (0.4 ms of CPU per kernel, most of it
    copy-on-write faults), and again when the originals go back. The
    functions stay; their code is swapped (the original's called through
    a function of its own), and the names the new code uses go into
    traitlets' module for the while. Returns what restore_traits() puts
    back, or None when there is nothing to answer from (or traitlets
    defines these elsewhere, or with closures)."""
    from traitlets import traitlets as tl
    g = vars(tl)
    f = vars(tl.HasTraits).get('traits')
    setup = vars(tl.HasDescriptors).get('setup_instance')
    if CONFIG_TRAITS is None or INSTANCE_INITS is None or \
            any(n in g for n in CQ_TRAIT_NAMES):
        return None
    swaps = []
    for fn, new, table, names in (
            (f, _cq_traits, CONFIG_TRAITS, CQ_TRAIT_NAMES[:2]),
            (setup, _cq_setup_instance, INSTANCE_INITS, CQ_TRAIT_NAMES[2:])):
        if not isinstance(fn, types.FunctionType) or \
                fn.__globals__ is not g or fn.__code__.co_freevars:
            continue
        orig = types.FunctionType(fn.__code__, g, fn.__name__,
                                  fn.__defaults__)
        orig.__kwdefaults__ = fn.__kwdefaults__
        orig.__qualname__ = fn.__qualname__
        g[names[0]] = table
        g[names[1]] = orig
        swaps.append((fn, fn.__code__, names))
        names_kw = {'co_name': fn.__code__.co_name}
        if hasattr(fn.__code__, 'co_qualname'):
            names_kw['co_qualname'] = fn.__code__.co_qualname
        fn.__code__ = new.__code__.replace(**names_kw)
    return swaps or None


def restore_traits(swaps):
    if swaps is None:
        return
    for fn, code, names in swaps:
        fn.__code__ = code
        for name in names:
            fn.__globals__.pop(name, None)


# The descriptors HasDescriptors.setup_instance() initializes in every new
# instance, per class, as it finds them: dir(cls) in its order, getattr()
# of each name (a name whose getattr() raises AttributeError is passed
# over), the BaseDescriptor values kept. Found anew for every instance,
# that writes a reference count into every member of the class and its
# bases (some 300 for IPKernelApp): pages of the server's objects copied in
# each kernel. Made here, once; traitlets 5.10 and later keep the same list
# per class themselves.
INSTANCE_INITS = None


def cache_instance_inits():
    global INSTANCE_INITS
    from traitlets import traitlets as tl
    out, todo = {}, [tl.HasDescriptors]
    while todo:
        cls = todo.pop()
        if cls in out:
            continue
        todo.extend(type.__subclasses__(cls))
        inits = []
        try:
            for key in dir(cls):
                try:
                    value = getattr(cls, key)
                except AttributeError:
                    continue
                if isinstance(value, tl.BaseDescriptor):
                    inits.append(value)
        except Exception:
            out[cls] = None  # asked of the class itself, as traitlets does
            continue
        out[cls] = tuple(inits)
    INSTANCE_INITS = out


MADV_COLLAPSE = 25
HUGE = 1 << 21


def collapse_memory():
    """Back the server's anonymous memory with huge pages where whole
    aligned 2 MiB ranges of it exist (MADV_COLLAPSE, Linux 6.1): a fork
    then copies one page-table entry per 2 MiB there instead of 512, the
    larger part of what the server spends per kernel. A child's write still
    copies only the 4 KiB page it writes (the kernel splits the mapping
    first), and no mapping is marked MADV_HUGEPAGE, so a child's own new
    memory stays in small pages. Where huge pages are off or the kernel is
    older this does nothing; returns the MiB collapsed."""
    done = 0
    try:
        with open('/proc/self/maps') as f:
            maps = f.read().splitlines()
    except OSError:
        return 0
    for line in maps:
        f = line.split()
        if len(f) < 5 or not f[1].startswith('rw') or f[1][3] != 'p':
            continue
        if len(f) > 5 and f[5] != '[heap]':
            continue
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        lo = (lo + HUGE - 1) & ~(HUGE - 1)
        hi &= ~(HUGE - 1)
        if hi > lo and libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
    return done >> 20


def set_environ(env):
    """What /proc/PID/environ shows of the kernel: its own environment, as
    execve() lays it out for a cold kernel, written over this process's
    copy of the server's (whose CQ_ENV_ROOM leaves room for it) and padded
    with NULs. One that does not fit leaves it empty, never the server's.
    Nothing points into the block any more: os.environ.clear() removed
    its entries from the C environment."""
    with open('/proc/self/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    start, end = int(fields[47]), int(fields[48])
    room = end - start
    block = b''.join(kv.encode('utf-8', 'surrogateescape') + b'\0'
                     for kv in env)
    if len(block) > room:
        block = b''
    if room > 0:
        ctypes.memmove(start, block + b'\0' * (room - len(block)), room)


def set_cmdline(words):
    """What /proc/PID/cmdline (ps) shows of the kernel and its parent: the
    command a cold kernel runs, written over this process's own copy of
    the server's argv (the empty arguments after its own leave room:
    ARGV_ROOM in kserver.c)."""
    with open('/proc/self/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    start, end = int(fields[45]), int(fields[46])
    room = end - start
    title = b'\0'.join(w.encode() for w in words)[:max(room - 1, 0)]
    if room > 0:
        ctypes.memmove(start, title + b'\0' * (room - len(title)), room)


def run_init(req, fds, life_fd):
    """The parent of an unsandboxed child (a sandboxed one's is
    kinit/kinit.c's pid 1): the child's identity, then it reaps until the
    child exits and exits with its status."""
    if title(req):
        set_cmdline(title(req))
    # unsandboxed kernels stay in the worker's session (autogroup
    # scheduling weighs them with it), in a group of their own
    os.setpgid(0, 0)
    confine(req)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if life_gone(life_fd):
        os._exit(1)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    me = os.getpid()
    kid = os.fork()
    if kid == 0:
        os.close(life_fd)
        run_child(req, fds, me)
    for fd in fds:
        os.close(fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == kid:
            os._exit(os.waitstatus_to_exitcode(status) & 0xff)


def run_outer(req, fds, pid_w, life_fd, server):
    """An unsandboxed child's outer process (kinit/kinit.c's is a sandboxed
    one's): fork the child's parent, say its pid, then wait for it to
    exit (without reaping it: the server, a subreaper, does, so its pid
    stays ours until the client holds a pidfd), or kill it when the
    worker is gone."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    close_from(3, tuple(fds) + (pid_w, life_fd))
    if os.getppid() != server:
        os._exit(1)
    os.setpgid(0, 0)
    if req.get('nice'):
        os.setpriority(os.PRIO_PROCESS, 0, req['nice'])
    kid = os.fork()
    if kid == 0:
        os.close(pid_w)
        try:
            run_init(req, fds, life_fd)
        except BaseException as e:
            child_failed(log_of(req, fds), e)
        os._exit(126)
    for fd in fds:
        os.close(fd)
    os.write(pid_w, struct.pack('i', kid))
    os.close(pid_w)
    kfd = os.pidfd_open(kid)
    p = select.poll()
    p.register(kfd, select.POLLIN)
    p.register(life_fd, 0)
    while True:
        ready = [fd for fd, _ in p.poll()]
        if kfd in ready:
            break
        if life_fd in ready:
            os.kill(kid, signal.SIGKILL)
            break
    info = os.waitid(os.P_PID, kid, os.WEXITED | os.WNOWAIT)
    os._exit(info.si_status & 0xff if info else 1)


KINIT_FD = -1
OWN_PIDNS = -1


def setns(fd, nstype, what):
    check(libc.setns(fd, nstype), 'enter %s' % what)


def kinit_settings(req):
    work = req['work_dir']
    if '\0' in work or not work.startswith('/'):
        raise Fail('bad work dir')
    kv = ['work=' + work, 'uid=%d' % req['uid'], 'gid=%d' % req['gid'],
          'drop=%d' % bool(req.get('drop')), 'mem=%d' % (req.get('mem') or 0),
          'nproc=%d' % (req.get('nproc') or 0),
          'fsize=%d' % (req.get('fsize') or 0),
          'nice=%d' % (req.get('nice') or 0),
          'tmp=%d' % (req.get('tmp') or 0), 'shm=%d' % (req.get('shm') or 0)]
    rc = req.get('mplrc')
    if rc is not None:
        # the kernel's matplotlibrc, which pid 1 writes on its /tmp
        if not isinstance(rc, str) or '\0' in rc or len(rc) > MPLRC_MAX:
            raise Fail('bad matplotlibrc')
        kv.append('mplrc=' + rc)
    return b''.join(x.encode('utf-8', 'surrogateescape') + b'\0' for x in kv)


def recv_ctl(sock, what):
    p = select.poll()
    p.register(sock.fileno(), select.POLLIN)
    if not p.poll(5000):
        raise Fail('the forked kernel did not %s in 5 s' % what)
    data = sock.recv(64)
    if not data:
        raise Fail('the forked kernel exited at once (see kernel.log)')
    return data


def child_failed(log_fd, e):
    """A child of the server that cannot go on: why, in the kernel's log,
    then exit 126."""
    try:
        os.write(log_fd, ('kernel server: %s\n' % e).encode())
    except OSError:
        pass
    os._exit(126)


def run_boxed_child(req, fds, ns_fd):
    """The child of a sandboxed fork (a kernel, a runner, a judge), forked
    by the server into pid 1's pid namespace: it enters pid 1's other
    namespaces (and so its root), makes a session of its own and takes
    the child's identity, as pid 1 did for itself; then it is the
    child."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        close_from(3, tuple(fds) + (ns_fd,))
        setns(ns_fd, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC |
              CLONE_NEWUTS | CLONE_NEWCGROUP, "the kernel's namespaces")
        os.close(ns_fd)
        os.chdir('/')
        os.setsid()
        if req.get('nice'):
            os.setpriority(os.PRIO_PROCESS, 0, req['nice'])
        if title(req):
            set_cmdline(title(req))
        confine(req)
        run_child(req, fds, None)
    except BaseException as e:
        child_failed(log_of(req, fds), e)
    os._exit(126)


def spawn_boxed(req, fds, life_fd):
    """A sandboxed child whose outer process and pid 1 are kinit/kinit.c's
    program (run from its memfd, no copy of this process), and which this
    process forks into pid 1's pid namespace: the only fork of the
    server's image a kernel (or a runner, or a judge) costs. Returns what
    spawn() does, and the child's pid."""
    n = threads()
    if n != 1:
        raise Fail('the kernel server has %d threads, not 1' % n)
    if KINIT_FD < 0:
        raise Fail('no program for sandboxed kernels\' pid 1 (see the '
                   'worker log)')
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    moved = []
    outer = None
    try:
        # sources above the targets, so no dup2() below overwrites one
        for fd in (log_of(req, fds), life_fd, theirs.fileno()):
            moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        words = title(req) or ['coderq-kinit']
        actions = [(os.POSIX_SPAWN_DUP2, moved[0], 3),
                   (os.POSIX_SPAWN_DUP2, moved[1], 4),
                   (os.POSIX_SPAWN_DUP2, moved[2], 5)]
        outer = os.posix_spawn('/proc/%d/fd/%d' % (os.getpid(), KINIT_FD),
                               words, {}, file_actions=actions)
    finally:
        for fd in moved:
            os.close(fd)
        theirs.close()
    held = []  # pidfds, closed unless returned
    try:
        ours.send(kinit_settings(req))
        msg = recv_ctl(ours, 'start')
        if not msg.startswith(b'pid='):
            raise Fail('the forked kernel said %r' % msg[:40])
        init = int(msg[4:])
        held.append(os.pidfd_open(outer))
        held.append(os.pidfd_open(init))
        if recv_ctl(ours, 'confine itself') != b'ready':
            raise Fail('the forked kernel did not get ready')
        setns(held[1], CLONE_NEWPID, "pid 1's pid namespace")
        kid = -1
        try:
            kid = os.fork()
        finally:
            if kid != 0:
                back_to_own_pidns()
        if kid == 0:
            ours.close()
            run_boxed_child(req, fds, held[1])
        held.append(os.pidfd_open(kid))
        socket.send_fds(ours, [b'kernel'], [held[2]])
        os.close(held.pop())
        ofd, ifd = held
        held = []
        return outer, init, ofd, ifd, kid
    except BaseException:
        os.kill(outer, signal.SIGKILL)  # reaped by the loop
        raise
    finally:
        for fd in held:
            os.close(fd)
        ours.close()


def back_to_own_pidns():
    """The server's children in its own pid namespace again, or the
    server ends: every later child would be born in a kernel's."""
    try:
        setns(OWN_PIDNS, CLONE_NEWPID, 'our own pid namespace')
    except Fail as e:
        os.write(2, ('kernel server: %s\n' % e).encode())
        os._exit(70)


def spawn(req, fds, life_fd, server):
    n = threads()
    if n != 1:
        raise Fail('the kernel server has %d threads, not 1' % n)
    r, w = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    outer = os.fork()
    if outer == 0:
        try:
            os.close(r)
            run_outer(req, fds, w, life_fd, server)
        except BaseException as e:
            child_failed(log_of(req, fds), e)
        os._exit(126)
    os.close(w)
    try:
        p = select.poll()
        p.register(r, select.POLLIN)
        if not p.poll(5000):
            os.kill(outer, signal.SIGKILL)  # reaped by the loop
            raise Fail('the forked kernel did not start in 5 s')
        data = os.read(r, 4)
    finally:
        os.close(r)
    if len(data) != 4:
        os.waitpid(outer, 0)
        raise Fail('the forked kernel exited at once (see kernel.log)')
    kid = struct.unpack('i', data)[0]
    # Held before any waitpid(-1) below can reap it, so the pid is ours.
    return outer, kid, os.pidfd_open(outer), os.pidfd_open(kid)


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def send(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def serve(sock, life_fd):
    server = os.getpid()
    # A child's exit wakes the loop (the handler does nothing; the byte
    # in the wakeup pipe does): kernels are reaped at once, their pids
    # and their uid's process count freed, and only here, after a spawn
    # holds its pidfds.
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    signal.signal(signal.SIGCHLD, lambda sig, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        events = [fd for fd, _ in poller.poll(1000)]
        if wake_r in events:
            try:
                while os.read(wake_r, 256):
                    pass
            except BlockingIOError:
                pass
        reap()
        if sock.fileno() not in events:
            continue
        try:
            data, fds, flags, _ = socket.recv_fds(sock, MAX_MSG, 4)
        except InterruptedError:
            continue
        if not data:
            return  # the worker closed its end: it is gone
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise Fail('request too large')
            req = json.loads(data)
            if not isinstance(req, dict):
                raise Fail('request is not an object')
            op = req.get('op')
            if op == 'ping':
                send(sock, {'ok': True, 'threads': threads()})
            elif op in ('spawn', 'probe') + PROGRAM_OPS:
                if op == 'spawn' and LIGHT:
                    raise Fail('a server for runners and judges forks no '
                               'kernel')
                if op in PROGRAM_OPS:
                    if len(fds) != 4:
                        raise Fail('%s takes four fds (its 0-3)' % op)
                    req['_code'] = compiled(op, req.get('program'))
                    req['_preload'] = None
                    if req.get('preload') is not None:
                        req['_preload'] = compiled(op + ' preload',
                                                   req['preload'])
                elif len(fds) != 1:
                    raise Fail('spawn takes one fd (the log)')
                if op == 'probe':
                    req['probe'] = True
                kernel = None
                if req.get('sandbox'):
                    outer, kid, ofd, kfd, kernel = spawn_boxed(
                        req, fds, life_fd)
                else:
                    outer, kid, ofd, kfd = spawn(req, fds, life_fd, server)
                if op == 'probe':
                    status = 0
                    if kernel is not None:
                        _, st = os.waitpid(kernel, 0)
                        status = os.waitstatus_to_exitcode(st)
                    _, st = os.waitpid(outer, 0)
                    os.close(ofd)
                    os.close(kfd)
                    send(sock, {'ok': True, 'pid': kid, 'outer': outer,
                                'status': status or
                                os.waitstatus_to_exitcode(st)})
                else:
                    rep = {'ok': True, 'pid': kid, 'outer': outer}
                    if kernel is not None:
                        rep['kernel'] = kernel
                    try:
                        send(sock, rep, (kfd, ofd))
                    finally:
                        os.close(ofd)
                        os.close(kfd)
            else:
                raise Fail('unknown op %r' % (op,))
        except (Fail, OSError, ValueError, KeyError, TypeError) as e:
            send(sock, {'ok': False, 'error': str(e)[:400]})
        finally:
            for fd in fds:
                os.close(fd)


LAUNCHER = 'ipykernel_launcher'
# a cold kernel's command before its arguments (kernel_proc.c), which a
# forked kernel's title repeats
LAUNCH = ['-P', '-s', '-m', 'ipykernel_launcher']


# What ipykernel_launcher imports, and what a kernel imports while it
# starts, paid once in a server for kernels.
KERNEL_IMPORTS = [
    'ipykernel.kernelapp', 'ipykernel.ipkernel', 'ipykernel.zmqshell',
    'ipykernel.iostream', 'ipykernel.heartbeat', 'ipykernel.control',
    'ipykernel.parentpoller', 'ipykernel.eventloops', 'ipykernel.comm',
    'ipykernel.displayhook', 'ipykernel.compiler', 'ipykernel.kernelbase',
    'ipykernel.debugger', 'ipykernel.jsonutil', 'IPython.core.completer',
    'IPython.core.interactiveshell', 'IPython.core.history',
    'IPython.core.magics', 'IPython.core.profiledir', 'IPython.core.shellapp',
    'IPython.extensions.storemagic', 'jupyter_client.session',
    'jupyter_client.connect', 'jupyter_core.paths', 'tornado.ioloop',
    'tornado.queues', 'zmq.eventloop.zmqstream', 'asyncio', 'sqlite3', 'jedi',
    'faulthandler']
# What the programs import (runner.py, agent/judge.py), paid once in a
# server for runners and judges.
PROGRAM_IMPORTS = ['ast', 'base64', 'linecache', 'traceback']
# A server for runners and judges only (argv's sixth): it imports none of
# a kernel's modules, so that forking it copies little.
LIGHT = False


def prepare_kernels(mpl_rc, failed):
    """Once, after the imports: what every kernel would otherwise do as it
    starts (docs/internals/protocols/kernel-server.md)."""
    global LAUNCHER
    if 'matplotlib' in sys.modules:
        try:
            # the font list, which a fresh MPLCONFIGDIR would make every
            # kernel build again
            importlib.import_module('matplotlib.font_manager')
        except Exception as e:
            failed.append('matplotlib.font_manager: %s' % e)
        if mpl_rc is not None:
            try:
                apply_mpl_rc(mpl_rc)
            except Exception as e:
                failed.append('the matplotlibrc: %s' % e)
    try:
        import importlib.util as iu
        LAUNCHER = iu.find_spec('ipykernel_launcher').origin
    except Exception:
        pass
    for what, step in (('the fd watcher', fit_fd_watcher),
                       ('the shell', build_shell),
                       ('the extensions', lambda: preload_extensions(SHELL)),
                       ('the command line', cache_cli),
                       ('the application', build_app),
                       ('the caches', warm_caches),
                       ('the cell hash', fast_murmur)):
        try:
            step()
        except Exception as e:
            failed.append('%s: %s' % (what, e))
    if threads() != 1:
        failed.append('the shell: it started a thread')
    try:
        cache_traits()
        cache_instance_inits()
    except Exception as e:
        failed.append('the traits: %s' % e)


def main():
    global KINIT_FD, OWN_PIDNS, LIGHT
    sock_fd, life_fd = int(sys.argv[1]), int(sys.argv[2])
    preload = [m for m in sys.argv[3].split(',') if m] if len(sys.argv) > 3 \
        else []
    mpl_rc = sys.argv[4] if len(sys.argv) > 4 else None
    KINIT_FD = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    LIGHT = len(sys.argv) > 6 and sys.argv[6] == 'light'
    if KINIT_FD >= 0:
        os.set_inheritable(KINIT_FD, False)
        OWN_PIDNS = os.open('/proc/self/ns/pid', os.O_RDONLY | os.O_CLOEXEC)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)
    t0 = time.monotonic()
    base = PROGRAM_IMPORTS if LIGHT else KERNEL_IMPORTS
    failed = []
    for m in base + preload:
        try:
            importlib.import_module(m)
        except Exception as e:
            failed.append('%s: %s' % (m, e))
    # debugpy's PYDEVD_USE_FRAME_EVAL=NO (ipykernel.debugger imports it)
    IMPORT_ENV.update((k, v) for k, v in os.environ.items()
                      if START_ENV.get(k) != v)
    if not LIGHT:
        prepare_kernels(mpl_rc, failed)
    try:
        warm_abc_answers()  # after the last import
    except Exception as e:
        failed.append('the ABC answers: %s' % e)
    try:
        compact_module_keys()  # after the last import
    except Exception as e:
        failed.append('the module list: %s' % e)
    gc.collect()
    # Objects that exist now are never collected: the collector would
    # otherwise write to every page of them in every child.
    gc.freeze()
    collapse_memory()
    sock = socket.socket(fileno=sock_fd)
    send(sock, {'ready': True, 'pid': os.getpid(), 'threads': threads(),
                'imported': [m for m in base + preload if m in sys.modules],
                'failed': failed, 'app': APP is not None,
                'import_ms': int((time.monotonic() - t0) * 1000)})
    serve(sock, life_fd)


if __name__ == '__main__':
    main()
