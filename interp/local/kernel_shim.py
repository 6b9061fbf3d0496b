# kernel_shim.py - run silently in every kernel at its start, in its
# warm-up cell (kernel.c's build_warmup(), which says why): _cq_setup()
# caps and chunks what the kernel publishes per cell, _cq_fd() watches
# fds 1 and 2. kernel.c appends the calls, with their arguments, and
# deletes both names.


def _cq_setup(budget, keep, chunk, tag):
    import collections
    import ipykernel.iostream as m
    from IPython import get_ipython
    if getattr(m.OutStream, '_cq_capped', False):
        return
    w = m.OutStream.write
    st = {'sent': 0, 'tails': {}}
    def nbytes(s, end):
        return sum(len(s[i:min(i + 65536, end)].encode('utf-8', 'surrogatepass')) for i in range(0, end, 65536))
    def send(self, s, n=chunk):
        for i in range(0, len(s), n):
            w(self, s[i:i + n])
            try:
                if self._buffer.tell() >= n:
                    self.flush()
            except Exception:
                pass
    def write(self, s):
        if not isinstance(s, str):
            return w(self, s)
        rest = s
        room = budget - st['sent']
        if room > 0:
            st['sent'] += min(room, len(s))
            send(self, s[:room])
            rest = s[room:]
        if rest:
            t = st['tails'].setdefault(self, [collections.deque(), 0, 0, False])
            t[0].append(rest)
            t[1] += len(rest)
            while len(t[0]) > 1 and t[1] - len(t[0][0]) >= keep:
                k = t[0].popleft()
                t[1] -= len(k)
                t[2] += nbytes(k, len(k))
            if t[1] > keep:
                k = t[0][0]
                cut = min(len(k), t[1] - keep)
                t[0][0] = k[cut:]
                t[1] -= cut
                t[2] += nbytes(k, cut)
            if t[2] >= keep or (t[2] and not t[3]):
                send(self, '[' + tag + ' ' + str(t[2]) + ']')
                t[2] = 0
                t[3] = True
        return len(s)
    def pre(*args):
        st['sent'] = 0
        st['tails'] = {}
    def post(*args):
        tails = st['tails']
        st['tails'] = {}
        for stream, (chunks, n, dropped, _) in tails.items():
            text = ''.join(chunks)
            if n > keep:
                dropped += nbytes(text, n - keep)
                text = text[n - keep:]
            if dropped:
                text = '[' + tag + ' ' + str(dropped) + ']' + text
            send(stream, text)
    m.OutStream.write = write
    m.OutStream._cq_capped = True
    ip = get_ipython()
    ip.events.register('pre_execute', pre)
    ip.events.register('post_execute', post)
    try:
        import zmq
        t = ip.kernel.iopub_thread
        t.schedule(lambda: t.socket.setsockopt(zmq.XPUB_NODROP, 1))
    except Exception:
        pass


def _cq_fd():
    import ipykernel.iostream as m
    import os, sys, threading, codecs
    def watch(self):
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
    def refit(s, fno):
        old = s._fid
        ino = os.fstat(old).st_ino
        for e in os.listdir('/proc/self/fd'):
            if int(e) not in (old, fno):
                try:
                    if os.readlink('/proc/self/fd/' + e) == 'pipe:[%d]' % ino:
                        os.close(int(e))
                except OSError:
                    pass
        pr, pw = os.pipe()
        os.dup2(pw, fno)
        os.close(pw)
        s.watch_fd_thread.join(5)
        if not s.watch_fd_thread.is_alive():
            os.close(old)
        s._fid = pr
        s.watch_fd_thread = threading.Thread(target=s._watch_pipe_fd, daemon=True)
        s.watch_fd_thread.start()
    if not getattr(m.OutStream._watch_pipe_fd, '_cq_watch', False):
        watch._cq_watch = True
        m.OutStream._watch_pipe_fd = watch
        for s, fno in ((sys.stdout, 1), (sys.stderr, 2)):
            if isinstance(s, m.OutStream) and getattr(s, 'watch_fd_thread', None):
                try:
                    refit(s, fno)
                except Exception:
                    pass
