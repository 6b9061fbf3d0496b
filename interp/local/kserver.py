# SPDX-License-Identifier: MIT
# kserver.py - the forking kernel server (built into the coderq binary as a
# C string by interp/local/CMakeLists.txt; see docs/protocols/kernel-server.md).
# It imports ipykernel and the configured modules once, single-threaded,
# and forks a fresh kernel per request; it never runs job code itself.
# Nothing may be imported lazily on the way to a kernel: between the two
# pivot_root() calls no /usr is in view.
# argv: SOCK_FD LIFE_FD PRELOAD (comma-separated modules). One request, one
# reply, each one SOCK_SEQPACKET datagram of JSON; fds go as SCM_RIGHTS.
import os
import sys

# A thread in the server at fork time would exist in no child, holding
# whatever lock it held: numerical libraries must not start any.
for _v in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS',
           'NUMEXPR_NUM_THREADS', 'VECLIB_MAXIMUM_THREADS'):
    os.environ[_v] = '1'

import ctypes
import fcntl
import gc
import importlib
import json
import re
import resource
import select
import signal
import socket
import struct
import time

MAX_MSG = 65536
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
SYS_PIVOT_ROOT = {'x86_64': 155, 'aarch64': 41}.get(os.uname().machine)
DEVICES = ('null', 'zero', 'full', 'random', 'urandom', 'tty')

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                       ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.restype = ctypes.c_long


class Fail(Exception):
    pass


def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise Fail('could not %s: %s' % (what, os.strerror(e)))


def prctl(op, arg):
    check(libc.prctl(op, arg, 0, 0, 0), 'prctl %d' % op)


def mount(src, dst, fstype, flags, data=None):
    enc = (lambda s: s.encode() if s is not None else None)
    check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)),
          'mount %s on %s' % (src or fstype, dst))


def threads():
    return len(os.listdir('/proc/self/task'))


def close_from(lowfd, keep=()):
    top = os.sysconf('SC_OPEN_MAX')
    lo = lowfd
    for fd in sorted(k for k in keep if k >= lowfd) + [top]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1


def mkdirs(path, mode=0o755):
    os.makedirs(path, mode=mode, exist_ok=True)


def remount_ro_under(path, flags):
    """Remount \\p path and every mount below it read-only (a bind with
    MS_REC keeps submounts writable otherwise, /etc/hosts in a container
    for one)."""
    mounts = []
    # between the two pivots the host's /proc is under /oldroot
    info = '/oldroot/proc/self/mountinfo'
    with open(info if os.path.exists(info) else '/proc/self/mountinfo') as f:
        for line in f:
            p = re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)),
                       line.split()[4])
            if p == path or p.startswith(path.rstrip('/') + '/'):
                mounts.append(p)
    for p in sorted(set(mounts), key=len):
        try:
            mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except Fail:
            if p == path:
                raise


def bind(src, dst, ro, flags=MS_NOSUID | MS_NODEV):
    mount(src, dst, None, MS_BIND | MS_REC)
    if ro:
        remount_ro_under(dst, flags)
    else:
        mount(None, dst, None, MS_REMOUNT | MS_BIND | flags)


def build_root(req):
    """The filesystem bubblewrap builds for a kernel (sandbox.c): /usr and
    /etc read-only, fresh /proc, minimal /dev, private /tmp, the work dir
    the only writable bind; everything else does not exist."""
    uid, gid = req['uid'], req['gid']
    own = 'mode=0755,uid=%d,gid=%d' % (uid, gid)
    work = req['work_dir']
    mount(None, '/', None, MS_REC | MS_PRIVATE)
    mount('tmpfs', '/tmp', 'tmpfs', MS_NOSUID | MS_NODEV, 'mode=0700')
    os.chdir('/tmp')
    os.mkdir('newroot', 0o700)
    os.mkdir('oldroot', 0o700)
    check(libc.syscall(SYS_PIVOT_ROOT, b'/tmp', b'/tmp/oldroot'),
          'pivot_root')
    os.chdir('/')
    mount('tmpfs', '/newroot', 'tmpfs', MS_NOSUID | MS_NODEV, own)
    for d in ('usr', 'etc'):
        mkdirs('/newroot/' + d)
        bind('/oldroot/' + d, '/newroot/' + d, True)
    for link, to in (('lib', 'usr/lib'), ('lib64', 'usr/lib64'),
                     ('bin', 'usr/bin'), ('sbin', 'usr/sbin')):
        os.symlink(to, '/newroot/' + link)
    mkdirs('/newroot/proc')
    mount('proc', '/newroot/proc', 'proc', MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mkdirs('/newroot/dev')
    mount('tmpfs', '/newroot/dev', 'tmpfs', MS_NOSUID | MS_NODEV, own)
    for d in DEVICES:
        open('/newroot/dev/' + d, 'w').close()
        bind('/oldroot/dev/' + d, '/newroot/dev/' + d, False, MS_NOSUID)
    for link, to in (('fd', '/proc/self/fd'), ('stdin', '/proc/self/fd/0'),
                     ('stdout', '/proc/self/fd/1'),
                     ('stderr', '/proc/self/fd/2'), ('core', '/proc/kcore'),
                     ('ptmx', 'pts/ptmx')):
        os.symlink(to, '/newroot/dev/' + link)
    os.mkdir('/newroot/dev/shm', 0o755)
    os.chown('/newroot/dev/shm', uid, gid)
    os.mkdir('/newroot/dev/pts', 0o755)
    mount('devpts', '/newroot/dev/pts', 'devpts', MS_NOSUID | MS_NOEXEC,
          'newinstance,ptmxmode=0666,mode=620')
    mkdirs('/newroot/tmp')
    mount('tmpfs', '/newroot/tmp', 'tmpfs', MS_NOSUID | MS_NODEV, own)
    mkdirs('/newroot' + work)
    bind('/oldroot' + work, '/newroot' + work, False)
    # Parents of the work dir were made by root: give the ones inside the
    # kernel's own tmpfs to it, as bubblewrap (running as the kernel's
    # uid) would have.
    for top in ('/newroot/tmp', '/newroot'):
        if ('/newroot' + work).startswith(top + '/'):
            p = os.path.dirname('/newroot' + work)
            while p != top and p.startswith(top + '/'):
                os.chown(p, uid, gid)
                p = os.path.dirname(p)
            break
    mount(None, '/oldroot', None, MS_REC | MS_PRIVATE)
    check(libc.umount2(b'/oldroot', MNT_DETACH), 'unmount the old root')
    os.chdir('/newroot')
    check(libc.syscall(SYS_PIVOT_ROOT, b'.', b'.'), 'pivot_root')
    check(libc.umount2(b'.', MNT_DETACH), 'unmount the base')
    os.chdir('/')


def loopback_up():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack('16sh14x', b'lo', 0)
        flags = struct.unpack('16sh14x', fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack('16sh14x', b'lo',
                                                 flags | IFF_UP))
    finally:
        s.close()


def confine(req):
    """rlimits, then the kernel's uid: as cq_sandbox_child() does before
    bubblewrap, and bubblewrap's no-new-privileges and empty bounding
    set."""
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


def life_gone(life_fd):
    p = select.poll()
    p.register(life_fd, 0)
    return bool(p.poll(0))


def run_kernel(req, log_fd, parent):
    """The kernel process: what `python -m ipykernel_launcher -f CONN`
    would be, forked instead of started."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(124)
    # A process whose uid changed without an execve() is not dumpable,
    # which would hide its own /proc/self from it; after bubblewrap's
    # execve() a kernel is.
    prctl(PR_SET_DUMPABLE, 1)
    os.chdir(req['work_dir'])
    null = os.open('/dev/null', os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    close_from(3)
    os.environ.clear()
    for kv in req['env']:
        k, _, v = kv.partition('=')
        os.environ[k] = v
    if req.get('probe'):
        os._exit(0)
    sys.argv = [LAUNCHER] + req['argv']
    sys.path[0] = req['work_dir']
    import types
    main = types.ModuleType('__main__')
    main.__file__ = LAUNCHER
    sys.modules['__main__'] = main
    import random
    random.seed()
    if 'numpy' in sys.modules:
        sys.modules['numpy'].random.seed()
    # What importing matplotlib in a fresh kernel reads: the kernel's own
    # MPLCONFIGDIR/matplotlibrc (the CJK font fallback). The server
    # imported matplotlib before this kernel's settings existed.
    mpl = sys.modules.get('matplotlib')
    rc = os.path.join(os.environ.get('MPLCONFIGDIR', ''), 'matplotlibrc')
    if mpl is not None and os.path.isfile(rc):
        mpl.rc_file(rc)
    from ipykernel import kernelapp
    if SHELL is not None:
        adopt_shell()
    code = 0
    try:
        app = kernelapp.IPKernelApp.instance()
        # Its start-up makes some 100000 objects, all kept: collections
        # while it runs would find nothing to free.
        gc.disable()
        app.initialize()
        gc.enable()
        # What importing matplotlib in a fresh kernel does with the
        # backend ipykernel has just chosen (inline figures).
        mpl = sys.modules.get('matplotlib')
        if mpl is not None and os.environ.get('MPLBACKEND'):
            mpl.rcParams['backend'] = os.environ['MPLBACKEND']
        app.start()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    import atexit
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code)


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
    SHELL, SHELL_CONFIG = shell, config


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
    shell.ipython_dir = getattr(app, 'ipython_dir', None) or get_ipython_dir()
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


def set_cmdline(words):
    """What /proc/PID/cmdline (ps) shows of the kernel and its parent: the
    command a cold kernel runs, written over this process's own copy of
    the server's argv (the long -c program leaves room)."""
    with open('/proc/self/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    start, end = int(fields[45]), int(fields[46])
    room = end - start
    title = b'\0'.join(w.encode() for w in words)[:max(room - 1, 0)]
    if room > 0:
        ctypes.memmove(start, title + b'\0' * (room - len(title)), room)


def run_init(req, log_fd, life_fd):
    """Pid 1 of the kernel's pid namespace (or, unsandboxed, the kernel's
    parent): the filesystem, then the kernel's identity, then it reaps
    until the kernel exits and exits with its status."""
    if not req.get('probe'):
        set_cmdline([sys.executable, '-m', 'ipykernel_launcher'] +
                    req['argv'])
    if req.get('sandbox'):
        build_root(req)
        loopback_up()
    # bubblewrap's --new-session; unsandboxed kernels stay in the
    # worker's session (autogroup scheduling weighs them with it), in a
    # group of their own
    if req.get('sandbox'):
        os.setsid()
    else:
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
        run_kernel(req, log_fd, me)
    os.close(log_fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == kid:
            os._exit(os.waitstatus_to_exitcode(status) & 0xff)


def run_outer(req, log_fd, pid_w, life_fd, server):
    """Outside the namespaces (as bubblewrap's outer process): enter new
    ones, fork their pid 1, say its pid, then wait for it to exit (without
    reaping it: the server, a subreaper, does, so its pid stays ours until
    the client holds a pidfd), or kill it when the worker is gone."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    close_from(3, (log_fd, pid_w, life_fd))
    if os.getppid() != server:
        os._exit(1)
    os.setpgid(0, 0)
    if req.get('nice'):
        os.setpriority(os.PRIO_PROCESS, 0, req['nice'])
    if req.get('sandbox'):
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET |
                           CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP),
              'unshare')
    kid = os.fork()
    if kid == 0:
        os.close(pid_w)
        try:
            run_init(req, log_fd, life_fd)
        except BaseException as e:
            os.write(log_fd, ('kernel server: %s\n' % e).encode())
        os._exit(126)
    os.close(log_fd)
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


def spawn(req, log_fd, life_fd, server):
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
            run_outer(req, log_fd, w, life_fd, server)
        except BaseException as e:
            try:
                os.write(log_fd, ('kernel server: %s\n' % e).encode())
            except OSError:
                pass
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
            elif op in ('spawn', 'probe'):
                if len(fds) != 1:
                    raise Fail('spawn takes one fd (the log)')
                if op == 'probe':
                    req['probe'] = True
                outer, kid, ofd, kfd = spawn(req, fds[0], life_fd, server)
                if op == 'probe':
                    _, status = os.waitpid(outer, 0)
                    os.close(ofd)
                    os.close(kfd)
                    send(sock, {'ok': True, 'pid': kid, 'outer': outer,
                                'status': os.waitstatus_to_exitcode(status)})
                else:
                    try:
                        send(sock, {'ok': True, 'pid': kid, 'outer': outer},
                             (kfd, ofd))
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


def main():
    global LAUNCHER
    sock_fd, life_fd = int(sys.argv[1]), int(sys.argv[2])
    preload = [m for m in sys.argv[3].split(',') if m] if len(sys.argv) > 3 \
        else []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)
    t0 = time.monotonic()
    # What ipykernel_launcher imports, and what a kernel imports while it
    # starts, paid once here.
    base = ['ipykernel.kernelapp', 'ipykernel.ipkernel', 'ipykernel.zmqshell',
            'ipykernel.iostream', 'ipykernel.heartbeat', 'ipykernel.control',
            'ipykernel.parentpoller', 'ipykernel.eventloops',
            'ipykernel.comm', 'ipykernel.displayhook',
            'ipykernel.compiler', 'ipykernel.kernelbase',
            'ipykernel.debugger', 'ipykernel.pickleutil',
            'ipykernel.serialize', 'ipykernel.jsonutil',
            'IPython.core.completer', 'IPython.core.interactiveshell',
            'IPython.core.history', 'IPython.core.magics',
            'IPython.core.profiledir', 'IPython.core.shellapp',
            'IPython.extensions.storemagic', 'jupyter_client.session',
            'jupyter_client.connect', 'jupyter_core.paths', 'tornado.ioloop',
            'tornado.queues', 'zmq.eventloop.zmqstream', 'asyncio',
            'sqlite3', 'jedi']
    failed = []
    for m in base + preload:
        try:
            importlib.import_module(m)
        except Exception as e:
            failed.append('%s: %s' % (m, e))
    if 'matplotlib' in sys.modules:
        try:
            # the font list, which a fresh MPLCONFIGDIR would make every
            # kernel build again
            importlib.import_module('matplotlib.font_manager')
        except Exception as e:
            failed.append('matplotlib.font_manager: %s' % e)
    try:
        import importlib.util as iu
        LAUNCHER = iu.find_spec('ipykernel_launcher').origin
    except Exception:
        pass
    try:
        build_shell()
    except Exception as e:
        failed.append('the shell: %s' % e)
    if threads() != 1:
        failed.append('the shell: it started a thread')
    gc.collect()
    # Objects that exist now are never collected: the collector would
    # otherwise write to every page of them in every child.
    gc.freeze()
    sock = socket.socket(fileno=sock_fd)
    send(sock, {'ready': True, 'pid': os.getpid(), 'threads': threads(),
                'imported': [m for m in base + preload if m in sys.modules],
                'failed': failed,
                'import_ms': int((time.monotonic() - t0) * 1000)})
    serve(sock, life_fd)


if __name__ == '__main__':
    main()
