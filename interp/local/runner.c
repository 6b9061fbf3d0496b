/* SPDX-License-Identifier: MIT */
/* runner.c - the light interpreter (runner.h): cq_interp_t over one
 * runner.py process, confined as a kernel (pyproc.c), for jobs judged
 * with no LLM. A cell is a request on a control socket (its random
 * marker, its size, its code); what it writes to fds 1 and 2 comes
 * through pipes read as they fill, into the collector (collect.c); its
 * end is the reply line that carries its marker (cq_runner_reply_parse()).
 *
 * The code runs in the runner's own process and can reach every
 * descriptor there, the control socket included, and the marker is in
 * that process's memory, so nothing on the control socket is trusted
 * beyond what the code could have said anyway. A forged reply can end
 * its cell early (what the code still writes goes to a later cell or
 * nowhere), call it a success or an error, and invent its exception and
 * its result's repr: claims about its own outputs, which the judge never
 * takes for a verdict (tests compare values in an interpreter of their
 * own, or in the test harness's report, which is parsed as untrusted
 * too). It cannot pass the cell's deadline (kept here, by the clock; the
 * process is killed), the output cap (counted here), a line over
 * cq_runner_line_max() (skipped), reach another cell's reply (each has a
 * marker of its own, and a reply for another is ignored), or break the
 * parser (fuzzed: tests/fuzz/fuzz_runner_reply.c): a line with its
 * cell's marker that is not a reply ends the runner as dead. Its death
 * is seen here, by its pidfd or the end of its control socket. */
#include "coderq/local/runner.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/interp/collect.h"
#include "coderq/local/workfiles.h"
#include "py_int.h"
#include "pyproc_int.h"

#define POLL_SLICE_MS 100
#define CHUNK         (64 * 1024)
/* reads of one pipe per turn of a cell's loop, so that one flood does
 * not starve the others */
#define READS_PER_TURN 16
/* a reply's fields besides its result (runner.py's bounds, as JSON) */
#define LINE_SLACK ((size_t)256 << 10)
#define MARKER_LEN 32
/* what a failed start says of the runner's stderr */
#define SAID_MAX 600

/* A cold start's interpreter options: as a kernel's, no work dir on the
 * path while it starts (runner.py adds it after the standard library)
 * and no user site dir. */
static const char *const cold_flags[] = {"-P", "-s", NULL};

typedef struct stream {
        int fd; /* our read end; -1 when closed */
        const char *name;
        /* the start of a UTF-8 character the next read completes */
        char carry[4];
        size_t ncarry;
} stream_t;

typedef struct runner {
        cq_interp_t base; /* first: cq_interp_t * casts to this */
        pyproc_t pp;
        char *python, *work_root, *preload;
        /* its arguments: the start's marker and the output cap */
        char start_marker[MARKER_LEN + 1];
        char out_max[24];
        const char *args[3];
        size_t output_max;
        int64_t start_ms, grace_ms;
        int ctl; /* our end of its control socket; -1 when closed */
        stream_t streams[2];
        /* control bytes read past the last whole line */
        char *in;
        size_t in_len, in_alloc, in_used;
        bool skipping; /* the line being read passed the cap: dropped */
        /* killed (a timeout, a cancel past its grace) or dead: every cell
         * dies until a restart */
        bool lost;
        json_t *env;
        cq_workfiles_t *files;
        cq_local_hooks_t hooks; /* all NULL until it started */
        atomic_int interrupt_req;
        char errmsg[512];
} runner_t;

static const cq_interp_ops_t runner_ops;

CQ_PRINTF(2, 3)
static void set_error(runner_t *r, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(r->errmsg, sizeof(r->errmsg), fmt, ap);
        va_end(ap);
}

static int new_marker(char out[MARKER_LEN + 1])
{
        unsigned char raw[MARKER_LEN / 2];
        size_t i;

        if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
                return -1;
        for (i = 0; i < sizeof(raw); i++)
                snprintf(out + 2 * i, 3, "%02x", raw[i]);
        return 0;
}

size_t cq_runner_line_max(size_t output_max)
{
        return (output_max ? output_max : (size_t)1 << 20) + LINE_SLACK;
}

/* ---- the reply ---- */

void cq_runner_reply_release(cq_runner_reply_t *reply)
{
        json_decref(reply->result);
        json_decref(reply->error);
        memset(reply, 0, sizeof(*reply));
        reply->count = -1;
}

static bool reply_key(const char *key)
{
        static const char *const keys[] = {"ok",    "count",  "result",
                                           "ename", "evalue", "traceback"};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(keys); i++)
                if (strcmp(key, keys[i]) == 0)
                        return true;
        return false;
}

/* The error output of a reply that is not ok, or NULL (\p why set). */
static json_t *reply_error(const json_t *doc, const char **why)
{
        const json_t *ename = json_object_get(doc, "ename");
        const json_t *evalue = json_object_get(doc, "evalue");
        const json_t *tb = json_object_get(doc, "traceback"), *v;
        size_t i;

        if (!json_is_string(ename) || json_string_length(ename) == 0 ||
            !json_is_string(evalue) || !json_is_array(tb)) {
                *why = "an error without its name, text or traceback";
                return NULL;
        }
        json_array_foreach(tb, i, v)
        {
                if (!json_is_string(v)) {
                        *why = "a traceback of other than strings";
                        return NULL;
                }
        }
        *why = "out of memory";
        return json_pack("{s:s, s:O, s:O, s:O}", "output_type", "error",
                         "ename", ename, "evalue", evalue, "traceback", tb);
}

/* The fields of a parsed reply \p doc into \p reply; NULL, or why not. */
static const char *reply_fields(const json_t *doc, cq_runner_reply_t *reply)
{
        const json_t *ok = json_object_get(doc, "ok");
        const json_t *count = json_object_get(doc, "count");
        const json_t *result = json_object_get(doc, "result");
        const char *key, *why = NULL;
        json_t *v;

        json_object_foreach((json_t *)(uintptr_t)doc, key, v)
        {
                if (!reply_key(key))
                        return "a key of no reply";
        }
        if (!json_is_boolean(ok))
                return "no boolean \"ok\"";
        if (!(json_is_null(count) ||
              (json_is_integer(count) && json_integer_value(count) > 0 &&
               json_integer_value(count) <= INT_MAX)))
                return "a count that is neither null nor a positive int";
        if (result && !json_is_null(result) &&
            (!json_is_string(result) || !json_is_true(ok)))
                return "a result that is not a string, or with an error";
        reply->ok = json_is_true(ok);
        reply->count =
            json_is_integer(count) ? (int)json_integer_value(count) : -1;
        if (!reply->ok) {
                reply->error = reply_error(doc, &why);
                return reply->error ? NULL : why;
        }
        if (json_object_get(doc, "ename") || json_object_get(doc, "evalue") ||
            json_object_get(doc, "traceback"))
                return "an error's fields in a reply that is ok";
        if (json_is_string(result)) {
                reply->result =
                    json_pack("{s:s, s:{s:O}, s:{}, s:o}", "output_type",
                              "execute_result", "data", "text/plain", result,
                              "metadata", "execution_count",
                              reply->count > 0 ? json_integer(reply->count)
                                               : json_null());
                if (!reply->result)
                        return "out of memory";
        }
        return NULL;
}

int cq_runner_reply_parse(const char *line,
                          size_t len,
                          const char *marker,
                          cq_runner_reply_t *reply,
                          char *errstr,
                          size_t errstr_size)
{
        size_t mlen = strlen(marker);
        cq_runner_reply_t got = {false, -1, NULL, NULL};
        json_error_t jerr;
        const char *why;
        json_t *doc;

        if (mlen == 0 || len <= mlen || memcmp(line, marker, mlen) != 0 ||
            line[mlen] != ' ')
                return 1;
        doc = json_loadb(line + mlen + 1, len - mlen - 1,
                         JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(doc)) {
                cq_errstr_set(errstr, errstr_size,
                              "a reply that is not a JSON object%s%s",
                              doc ? "" : ": ", doc ? "" : jerr.text);
                json_decref(doc);
                return -1;
        }
        why = reply_fields(doc, &got);
        json_decref(doc);
        if (why) {
                cq_runner_reply_release(&got);
                cq_errstr_set(errstr, errstr_size, "a reply with %s", why);
                return -1;
        }
        *reply = got;
        return 0;
}

/* ---- its control socket and pipes ---- */

/* The next whole control line: 1 with it in *linep and *lenp (valid until
 * the next call), 0 when none came yet, -1 when the socket ended. A line
 * over cq_runner_line_max() is skipped to its end, unread. */
static int next_line(runner_t *r, const char **linep, size_t *lenp)
{
        size_t cap = cq_runner_line_max(r->output_max), reads = 0;

        if (r->in_used) {
                memmove(r->in, r->in + r->in_used, r->in_len - r->in_used);
                r->in_len -= r->in_used;
                r->in_used = 0;
        }
        for (;;) {
                char *nl = r->in_len ? memchr(r->in, '\n', r->in_len) : NULL;
                ssize_t n;

                if (nl && r->skipping) {
                        r->in_used = (size_t)(nl - r->in) + 1;
                        r->skipping = false;
                        memmove(r->in, r->in + r->in_used,
                                r->in_len - r->in_used);
                        r->in_len -= r->in_used;
                        r->in_used = 0;
                        continue;
                }
                if (nl) {
                        *linep = r->in;
                        *lenp = (size_t)(nl - r->in);
                        r->in_used = *lenp + 1;
                        return 1;
                }
                if (r->in_len > cap) {
                        r->skipping = true;
                        r->in_len = 0;
                }
                if (r->ctl < 0 || reads++ >= READS_PER_TURN)
                        return r->ctl < 0 ? -1 : 0;
                if (r->in_alloc - r->in_len < CHUNK) {
                        size_t alloc = r->in_alloc ? r->in_alloc * 2 : CHUNK;
                        char *in;

                        while (alloc - r->in_len < CHUNK)
                                alloc *= 2;
                        in = realloc(r->in, alloc);
                        if (!in)
                                return -1;
                        r->in = in;
                        r->in_alloc = alloc;
                }
                n = read(r->ctl, r->in + r->in_len, CHUNK);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && errno == EAGAIN)
                        return 0;
                if (n <= 0)
                        return -1;
                r->in_len += (size_t)n;
        }
}

/* How many bytes at the end of \p s start a UTF-8 character that a later
 * read may complete (0 to 3). */
static size_t utf8_partial(const char *s, size_t len)
{
        size_t back;

        for (back = 1; back <= 3 && back <= len; back++) {
                unsigned char c = (unsigned char)s[len - back];

                if ((c & 0xc0) == 0x80)
                        continue;
                if (c >= 0xc0) {
                        size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;

                        return need > back ? back : 0;
                }
                return 0;
        }
        return 0;
}

/* \p len bytes of \p s's text as a stream output: invalid UTF-8 becomes
 * U+FFFD, as the kernel's watcher makes it. */
static void
emit(const stream_t *s, cq_collect_t *col, const char *p, size_t len)
{
        size_t tlen = 0;
        char *text;
        json_t *out;

        if (len == 0 || !col)
                return;
        text = cq_utf8_repair(p, len, &tlen);
        out = text ? json_pack("{s:s, s:s, s:s%}", "output_type", "stream",
                               "name", s->name, "text", text, tlen)
                   : NULL;
        free(text);
        if (!out) /* out of memory: the bytes still count */
                cq_collect_dropped(col, len, false);
        cq_collect_add(col, &out);
}

/* Read what \p s holds, up to READS_PER_TURN chunks, into \p col (NULL:
 * dropped); at its end the pipe is closed and what was carried goes out.
 * Returns the bytes read. */
static size_t read_stream(stream_t *s, cq_collect_t *col)
{
        char buf[CHUNK + sizeof(s->carry)];
        size_t total = 0, k;

        for (k = 0; s->fd >= 0 && k < READS_PER_TURN; k++) {
                ssize_t n;
                size_t len, keep;

                memcpy(buf, s->carry, s->ncarry);
                n = read(s->fd, buf + s->ncarry, CHUNK);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        break; /* EAGAIN: nothing more now */
                if (n == 0) {
                        close(s->fd);
                        s->fd = -1;
                        emit(s, col, s->carry, s->ncarry);
                        s->ncarry = 0;
                        break;
                }
                total += (size_t)n;
                len = s->ncarry + (size_t)n;
                keep = utf8_partial(buf, len);
                emit(s, col, buf, len - keep);
                memcpy(s->carry, buf + len - keep, keep);
                s->ncarry = keep;
        }
        return total;
}

/* What is left in both pipes, read without waiting: up to \p budget bytes,
 * so that a process that keeps writing cannot keep us here. */
static void drain(runner_t *r, cq_collect_t *col, size_t budget)
{
        size_t got = 1;

        while (got > 0 && budget > 0) {
                got = read_stream(&r->streams[0], col) +
                      read_stream(&r->streams[1], col);
                budget = got < budget ? budget - got : 0;
        }
}

static void close_fd(int *fdp)
{
        if (*fdp >= 0)
                close(*fdp);
        *fdp = -1;
}

/* ---- the process ---- */

/* Kill it, wait until its sandbox is gone, read what its pipes still
 * hold into \p col (NULL: nothing read), close our ends; the work dir and
 * uid stay. */
static void runner_stop(runner_t *r, cq_collect_t *col)
{
        pyproc_stop(&r->pp);
        /* its writers are gone (but what an unsandboxed one let escape
         * its group, which a drain without waiting leaves) */
        if (col)
                drain(r, col, 2 * r->output_max + CHUNK);
        close_fd(&r->ctl);
        close_fd(&r->streams[0].fd);
        close_fd(&r->streams[1].fd);
        r->streams[0].ncarry = r->streams[1].ncarry = 0;
        r->in_len = r->in_used = 0;
        r->skipping = false;
}

/* Our ends, non-blocking: the runner's stay blocking, as a Python
 * started by a shell has them. */
static int nonblocking(int fd)
{
        int fl = fcntl(fd, F_GETFL);

        return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Wait for "MARKER ready" up to the start timeout; -1 with the error set
 * (and what the runner said on stderr) when it exited or did not come. */
static int wait_ready(runner_t *r)
{
        int64_t deadline = cq_now_ms() + r->start_ms;
        size_t mlen = strlen(r->start_marker);
        char said[SAID_MAX + 1], buf[CHUNK];
        size_t nsaid = 0;

        for (;;) {
                struct pollfd p[4] = {{r->ctl, POLLIN, 0},
                                      {r->streams[0].fd, POLLIN, 0},
                                      {r->streams[1].fd, POLLIN, 0},
                                      {r->pp.proc.pidfd, POLLIN, 0}};
                int64_t left = deadline - cq_now_ms();
                const char *line;
                size_t len, i;
                int got = next_line(r, &line, &len);

                if (got > 0 && len == mlen + 6 &&
                    memcmp(line, r->start_marker, mlen) == 0 &&
                    memcmp(line + mlen, " ready", 6) == 0)
                        return 0;
                if (got > 0)
                        continue;
                said[nsaid] = '\0';
                for (i = 0; i < nsaid; i++)
                        if (said[i] == '\n' || said[i] == '\r')
                                said[i] = ' ';
                if (got < 0 || left <= 0) {
                        set_error(r, "the runner %s%s%s",
                                  got < 0 ? "exited as it started"
                                          : "did not start in time",
                                  nsaid ? ": " : "", said);
                        return -1;
                }
                if (poll(p, 4,
                         (int)(left < POLL_SLICE_MS ? left : POLL_SLICE_MS)) <
                        0 &&
                    errno != EINTR) {
                        set_error(r, "could not wait for the runner: %s",
                                  strerror(errno));
                        return -1;
                }
                for (i = 1; i < 3; i++) {
                        ssize_t n =
                            r->streams[i - 1].fd >= 0 &&
                                    (p[i].revents & (POLLIN | POLLHUP))
                                ? read(r->streams[i - 1].fd, buf, sizeof(buf))
                                : -1;

                        if (n == 0)
                                close_fd(&r->streams[i - 1].fd);
                        if (n > 0 && nsaid < SAID_MAX) {
                                size_t k = (size_t)n < SAID_MAX - nsaid
                                               ? (size_t)n
                                               : SAID_MAX - nsaid;

                                memcpy(said + nsaid, buf, k);
                                nsaid += k;
                        }
                }
                /* exited: what it said is read, then the line is missed */
                if (p[3].revents & POLLIN)
                        close_fd(&r->ctl);
        }
}

/* Start the runner and wait until it is ready. -1 with the error set,
 * nothing left running. */
static int runner_spawn(runner_t *r)
{
        int ctl[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
        int null = -1, rc = -1;

        if (new_marker(r->start_marker) ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) ||
            pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
            (null = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0 ||
            nonblocking(ctl[0]) || nonblocking(out[0]) || nonblocking(err[0])) {
                set_error(r, "could not start the runner: %s", strerror(errno));
                goto out;
        }
        {
                const int fds[4] = {null, out[1], err[1], ctl[1]};

                if (pyproc_start(&r->pp, fds, r->errmsg, sizeof(r->errmsg)))
                        goto out;
        }
        r->ctl = ctl[0];
        r->streams[0].fd = out[0];
        r->streams[1].fd = err[0];
        ctl[0] = out[0] = err[0] = -1;
        /* only the runner holds its ends now: its exit ends them */
        close_fd(&ctl[1]);
        close_fd(&out[1]);
        close_fd(&err[1]);
        if (wait_ready(r)) {
                runner_stop(r, NULL);
                goto out;
        }
        lproc_read_inner_pid(&r->pp.proc, true);
        r->lost = false;
        rc = 0;
out:
        close_fd(&ctl[0]);
        close_fd(&ctl[1]);
        close_fd(&out[0]);
        close_fd(&out[1]);
        close_fd(&err[0]);
        close_fd(&err[1]);
        close_fd(&null);
        return rc;
}

/* Interrupt the cell that runs (SIGINT to the runner's process group,
 * from the thread that reaps it, so that the group is still its). */
static void send_interrupt(runner_t *r)
{
        pid_t group = lproc_group(&r->pp.proc);

        if (group > 0)
                killpg(group, SIGINT);
}

/* ---- one cell ---- */

/* Why a cell stopped before its reply. */
typedef enum stop {
        STOP_NONE = 0,
        STOP_TIMEOUT, /* its deadline passed: killed */
        STOP_CANCEL,  /* opts->cancel: interrupted, killed past the grace */
} stop_t;

typedef struct cell {
        runner_t *r;
        const cq_exec_opts_t *opts;
        cq_collect_t col;
        bool silent;
        char marker[MARKER_LEN + 1];
        char head[MARKER_LEN + 32]; /* "MARKER NBYTES FLAG\n" */
        const char *code;
        size_t head_len, total, sent;
        cq_runner_reply_t reply;
        bool replied;
        bool ended; /* the runner died, or broke its protocol */
        char why[300];
        stop_t stop;
        int64_t start_ms, deadline, slow_at, interrupted_at;
} cell_t;

/* Send what is left of the request without blocking; -1 when the
 * runner's end is gone. */
static int cell_send(cell_t *c)
{
        while (c->sent < c->total) {
                const char *p = c->sent < c->head_len
                                    ? c->head + c->sent
                                    : c->code + (c->sent - c->head_len);
                size_t n = c->sent < c->head_len ? c->head_len - c->sent
                                                 : c->total - c->sent;
                ssize_t w = send(c->r->ctl, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);

                if (w < 0 && errno == EINTR)
                        continue;
                if (w < 0 && errno == EAGAIN)
                        return 0;
                if (w <= 0)
                        return -1;
                c->sent += (size_t)w;
        }
        return 0;
}

/* The control lines that came: this cell's reply ends it; a line with
 * its marker that is no reply ends the runner. */
static void cell_read_ctl(cell_t *c)
{
        const char *line;
        size_t len;
        int got;
        char err[256];

        while (!c->replied && !c->ended &&
               (got = next_line(c->r, &line, &len)) != 0) {
                int r;

                if (got < 0) {
                        snprintf(c->why, sizeof(c->why),
                                 "its control socket ended");
                        c->ended = true;
                        break;
                }
                r = cq_runner_reply_parse(line, len, c->marker, &c->reply, err,
                                          sizeof(err));
                if (r == 0)
                        c->replied = true;
                if (r < 0) {
                        snprintf(c->why, sizeof(c->why),
                                 "its reply could not be read: %s", err);
                        c->ended = true;
                }
        }
}

/* The clocks of a cell without its reply: true when it is to be killed
 * (its deadline passed, or a cancel's grace). A cancel and an interrupt
 * from another thread send SIGINT; the slow callback is called once. */
static bool cell_clock(cell_t *c, int64_t now)
{
        const cq_exec_opts_t *opts = c->opts;
        bool cancel = opts->cancel && atomic_load(opts->cancel) != 0;

        if (c->deadline && now >= c->deadline) {
                c->stop = STOP_TIMEOUT;
                return true;
        }
        if (c->interrupted_at && now - c->interrupted_at >= c->r->grace_ms)
                return true;
        if (cancel && !c->interrupted_at) {
                c->stop = STOP_CANCEL;
                c->interrupted_at = now;
                send_interrupt(c->r);
        }
        if (atomic_exchange(&c->r->interrupt_req, 0))
                send_interrupt(c->r);
        if (c->slow_at && now >= c->slow_at) {
                c->slow_at = 0;
                opts->on_slow(opts->opaque);
        }
        return false;
}

/* One wait on the runner: its control socket (to send the request, to
 * read its reply), its pipes, its pidfd. */
static void cell_poll(cell_t *c, int64_t now)
{
        runner_t *r = c->r;
        struct pollfd p[4] = {
            {r->ctl, (short)(POLLIN | (c->sent < c->total ? POLLOUT : 0)), 0},
            {r->streams[0].fd, POLLIN, 0},
            {r->streams[1].fd, POLLIN, 0},
            {r->pp.proc.pidfd, POLLIN, 0}};
        int64_t wait = POLL_SLICE_MS;

        if (c->deadline && c->deadline - now < wait)
                wait = c->deadline > now ? c->deadline - now : 0;
        if (c->slow_at && c->slow_at - now < wait)
                wait = c->slow_at > now ? c->slow_at - now : 0;
        if (poll(p, 4, (int)wait) < 0 && errno != EINTR) {
                snprintf(c->why, sizeof(c->why), "could not poll: %s",
                         strerror(errno));
                c->ended = true;
                return;
        }
        if (p[1].revents)
                read_stream(&r->streams[0], &c->col);
        if (p[2].revents)
                read_stream(&r->streams[1], &c->col);
        if ((p[0].revents & POLLOUT) && cell_send(c) != 0) {
                snprintf(c->why, sizeof(c->why), "it took no request");
                c->ended = true;
                return;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR))
                cell_read_ctl(c);
        if (!c->replied && (p[3].revents & POLLIN)) {
                /* what it wrote before it died comes first */
                cell_read_ctl(c);
                if (!c->replied) {
                        snprintf(c->why, sizeof(c->why), "it exited");
                        c->ended = true;
                }
        }
}

static json_t *status_error(const char *ename, const char *evalue)
{
        return json_pack("{s:s, s:s, s:s, s:[]}", "output_type", "error",
                         "ename", ename, "evalue", evalue, "traceback");
}

static void add_output(cq_collect_t *col, json_t *out)
{
        cq_collect_add(col, &out);
}

/* A cell that ended without its reply: the runner is killed (what it
 * wrote is read first) and lost until a restart. */
static void cell_lost(cell_t *c, cq_cell_result_t *res)
{
        runner_t *r = c->r;
        char text[400];

        runner_stop(r, &c->col);
        r->lost = true;
        res->state_lost = true;
        if (c->stop == STOP_TIMEOUT) {
                res->status = CQ_CELL_TIMEOUT;
                snprintf(text, sizeof(text),
                         "the cell exceeded its %lld ms deadline; the runner "
                         "was stopped and its state (variables, imports) is "
                         "lost",
                         (long long)c->opts->timeout_ms);
                add_output(&c->col, status_error("TimeoutError", text));
        } else if (c->stop == STOP_CANCEL && !c->ended) {
                res->status = CQ_CELL_CANCELLED;
                add_output(&c->col,
                           status_error("Cancelled",
                                        "the cell was cancelled and did not "
                                        "stop; the runner was stopped and "
                                        "its state is lost"));
        } else {
                res->status = CQ_CELL_DIED;
                snprintf(text, sizeof(text),
                         "the runner died while running the cell (%s); its "
                         "state (variables, imports) is lost",
                         c->why);
                add_output(&c->col, status_error("DeadKernelError", text));
        }
}

/* The result of a cell that replied. */
static void cell_replied(cell_t *c, cq_cell_result_t *res)
{
        cq_runner_reply_t *reply = &c->reply;

        /* what it wrote before it replied is in the pipes */
        drain(c->r, &c->col, 2 * c->r->output_max + CHUNK);
        res->execution_count = reply->count;
        if (reply->result) {
                add_output(&c->col, reply->result);
                reply->result = NULL;
        }
        if (reply->error) {
                add_output(&c->col, reply->error);
                reply->error = NULL;
        }
        res->status = c->stop == STOP_CANCEL ? CQ_CELL_CANCELLED
                      : reply->ok            ? CQ_CELL_OK
                                             : CQ_CELL_ERROR;
}

/* The outputs of a cell, with what the pipes still carried of a split
 * character. */
static cq_err_t cell_outputs(cell_t *c, cq_cell_result_t *res)
{
        size_t i;

        for (i = 0; i < 2; i++) {
                stream_t *s = &c->r->streams[i];

                emit(s, &c->col, s->carry, s->ncarry);
                s->ncarry = 0;
        }
        json_decref(res->outputs);
        res->outputs = cq_collect_finish(&c->col);
        res->truncated = cq_collect_truncated(&c->col);
        if (!res->outputs) {
                set_error(c->r, "could not run cell: out of memory");
                return CQ_ERR_RETRIABLE;
        }
        return CQ_OK;
}

/* Send \p code as a cell and wait for its reply, its deadline, a cancel
 * or the runner's death. */
static cq_err_t run_cell(runner_t *r,
                         const char *code,
                         bool silent,
                         const cq_exec_opts_t *opts,
                         cq_cell_result_t *res)
{
        cell_t c;
        cq_err_t err = CQ_ERR_RETRIABLE;

        memset(&c, 0, sizeof(c));
        c.r = r;
        c.opts = opts;
        c.silent = silent;
        c.code = code;
        c.reply.count = -1;
        c.start_ms = cq_now_ms();
        if (cq_collect_init(&c.col, r->output_max,
                            silent ? NULL : opts->on_output,
                            opts->opaque) != 0 ||
            new_marker(c.marker)) {
                set_error(r, "could not run cell: out of memory or "
                             "randomness");
                goto out;
        }
        if (r->lost) {
                res->status = CQ_CELL_DIED;
                res->state_lost = true;
                add_output(&c.col,
                           status_error("DeadKernelError",
                                        "the runner was stopped by an "
                                        "earlier cell's timeout, cancel or "
                                        "death; its state is lost and no "
                                        "cell runs until it is restarted"));
                err = cell_outputs(&c, res);
                goto out;
        }
        c.head_len =
            (size_t)snprintf(c.head, sizeof(c.head), "%s %zu %c\n", c.marker,
                             strlen(code), silent ? 's' : '-');
        c.total = c.head_len + strlen(code);
        c.deadline = opts->timeout_ms > 0 ? c.start_ms + opts->timeout_ms : 0;
        c.slow_at = opts->on_slow
                        ? c.start_ms + (opts->slow_ms > 0 ? opts->slow_ms : 0)
                        : 0;
        atomic_store(&r->interrupt_req, 0);
        if (cell_send(&c) != 0) {
                snprintf(c.why, sizeof(c.why), "it took no request");
                c.ended = true;
        }
        while (!c.replied && !c.ended) {
                int64_t now = cq_now_ms();

                if (cell_clock(&c, now))
                        break;
                cell_poll(&c, now);
        }
        if (c.replied)
                cell_replied(&c, res);
        else
                cell_lost(&c, res);
        err = cell_outputs(&c, res);
out:
        res->duration_ms = cq_now_ms() - c.start_ms;
        cq_runner_reply_release(&c.reply);
        cq_collect_release(&c.col);
        return err;
}

/* The environment report at the start, before any job code: the probe
 * as a silent cell. One that fails leaves a runner that works, with no
 * report. */
static void probe_env(runner_t *r)
{
        cq_exec_opts_t eo = {0};
        cq_cell_result_t res;
        char marker[64], hex[MARKER_LEN + 1];
        char *probe;

        if (new_marker(hex))
                return;
        snprintf(marker, sizeof(marker), "coderq-env %.16s ", hex);
        probe = cq_interp_env_probe(marker);
        if (!probe)
                return;
        eo.timeout_ms = r->start_ms;
        cq_cell_result_init(&res);
        if (run_cell(r, probe, true, &eo, &res) == CQ_OK &&
            res.status == CQ_CELL_OK)
                r->env = cq_interp_env_parse(res.outputs, marker);
        else
                cq_log_kv(CQ_LOG_WARN, "runner: its environment report failed",
                          "status", cq_cell_status_name(res.status), NULL);
        cq_cell_result_release(&res);
        free(probe);
}

/* ---- ops ---- */

static cq_err_t runner_put_file(cq_interp_t *interp,
                                const char *name,
                                const void *data,
                                size_t len)
{
        runner_t *r = (runner_t *)interp;

        return cq_workfiles_put(
            r->files, name, data, len,
            cq_sandbox_enabled(r->pp.opts.sandbox) ? &r->pp.id : NULL,
            r->errmsg, sizeof(r->errmsg));
}

static cq_err_t runner_execute(cq_interp_t *interp,
                               const char *code,
                               const cq_exec_opts_t *opts,
                               cq_cell_result_t *res)
{
        return run_cell((runner_t *)interp, code, false, opts, res);
}

/* Only a cell that runs is interrupted: the thread that owns the runner
 * sends the signal within a turn of its wait (100 ms). */
static int runner_interrupt(cq_interp_t *interp)
{
        atomic_store(&((runner_t *)interp)->interrupt_req, 1);
        return 0;
}

static cq_err_t runner_restart(cq_interp_t *interp)
{
        runner_t *r = (runner_t *)interp;

        runner_stop(r, NULL);
        r->lost = true;
        return runner_spawn(r) == 0 ? CQ_OK : CQ_ERR_RETRIABLE;
}

static cq_err_t
runner_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files)
{
        runner_t *r = (runner_t *)interp;

        return cq_workfiles_created(r->files, with_data, files, r->errmsg,
                                    sizeof(r->errmsg));
}

static cq_err_t runner_get_file(cq_interp_t *interp,
                                const char *name,
                                size_t max,
                                cq_file_t *file)
{
        runner_t *r = (runner_t *)interp;

        return cq_workfiles_get(r->files, name, max, file, r->errmsg,
                                sizeof(r->errmsg));
}

static const char *runner_errmsg(const cq_interp_t *interp)
{
        return ((const runner_t *)interp)->errmsg;
}

static const json_t *runner_env(cq_interp_t *interp)
{
        return ((runner_t *)interp)->env;
}

static void runner_teardown(void *arg)
{
        runner_t *r = arg;

        runner_stop(r, NULL);
        /* its sandbox is gone: the uid goes back, the work dir away */
        pyproc_release(&r->pp);
        cq_workfiles_destroy(&r->files);
        json_decref(r->env);
        free(r->in);
        free(r->python);
        free(r->work_root);
        free(r->preload);
        free(r);
}

/* The runner dies now; with a defer hook, it is reaped and its dir
 * removed behind the caller's back, as a pool kernel is (reaping its
 * processes and removing the dir cost CPU and wall time after the job). */
static void runner_destroy(cq_interp_t *interp)
{
        runner_t *r = (runner_t *)interp;

        if (r->hooks.defer) {
                lproc_kill_low(&r->pp.proc);
                /* ours, which nothing reads any more */
                close_fd(&r->ctl);
                close_fd(&r->streams[0].fd);
                close_fd(&r->streams[1].fd);
                if (r->hooks.defer(r->hooks.opaque, runner_teardown, r) == 0)
                        return;
        }
        runner_teardown(r);
}

static const cq_interp_ops_t runner_ops = {
    .name = "local",
    .put_file = runner_put_file,
    .execute = runner_execute,
    .interrupt = runner_interrupt,
    .restart = runner_restart,
    .created_files = runner_created_files,
    .get_file = runner_get_file,
    .errmsg = runner_errmsg,
    .destroy = runner_destroy,
    .env = runner_env,
};

bool cq_runner_is(const cq_interp_t *interp)
{
        return interp && interp->ops == &runner_ops;
}

bool cq_runner_forked(const cq_interp_t *interp)
{
        return cq_runner_is(interp) &&
               pyproc_forked(&((const runner_t *)interp)->pp);
}

const char *cq_runner_work_dir(const cq_interp_t *interp)
{
        return ((const runner_t *)interp)->pp.work_dir;
}

const cq_sandbox_id_t *cq_runner_sandbox_id(const cq_interp_t *interp)
{
        return &((const runner_t *)interp)->pp.id;
}

/* The handle, its options copied; NULL when out of memory. */
static runner_t *runner_alloc(const cq_runner_opts_t *opts)
{
        runner_t *r = calloc(1, sizeof(*r));
        pyproc_opts_t po;

        if (!r)
                return NULL;
        r->base.ops = &runner_ops;
        r->ctl = r->streams[0].fd = r->streams[1].fd = -1;
        r->streams[0].name = "stdout";
        r->streams[1].name = "stderr";
        r->output_max = opts->output_max ? opts->output_max : (size_t)1 << 20;
        r->start_ms =
            opts->start_timeout_ms > 0 ? opts->start_timeout_ms : 60000;
        r->grace_ms =
            opts->interrupt_grace_ms > 0 ? opts->interrupt_grace_ms : 2500;
        atomic_init(&r->interrupt_req, 0);
        snprintf(r->out_max, sizeof(r->out_max), "%zu", r->output_max);
        r->args[0] = r->start_marker;
        r->args[1] = r->out_max;
        r->args[2] = NULL;
        r->python = strdup(opts->python ? opts->python : "/usr/bin/python3");
        r->work_root = opts->work_root ? strdup(opts->work_root) : NULL;
        r->preload = opts->preload ? strdup(opts->preload) : NULL;
        r->env = opts->env ? json_incref((json_t *)(uintptr_t)opts->env) : NULL;
        memset(&po, 0, sizeof(po));
        po.op = "runner";
        po.python = r->python;
        po.flags = cold_flags;
        po.program = cq_runner_py;
        po.args = r->args;
        po.sandbox = opts->sandbox;
        po.kserver = opts->kserver;
        po.work_root = r->work_root;
        po.preload = r->preload;
        pyproc_init(&r->pp, &po);
        if (!r->python || (opts->work_root && !r->work_root) ||
            (opts->preload && !r->preload)) {
                runner_destroy(&r->base);
                return NULL;
        }
        return r;
}

cq_interp_t *
cq_runner_new(const cq_runner_opts_t *opts, char *errstr, size_t errstr_size)
{
        runner_t *r = runner_alloc(opts);

        if (!r) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start the runner: out of memory");
                return NULL;
        }
        if (runner_spawn(r)) {
                cq_errstr_set(errstr, errstr_size, "%s", r->errmsg);
                runner_destroy(&r->base);
                return NULL;
        }
        /* files present now are not the job's creations */
        r->files = cq_workfiles_new(r->pp.work_dir, errstr, errstr_size);
        if (!r->files) {
                runner_destroy(&r->base);
                return NULL;
        }
        if (!r->env)
                probe_env(r);
        /* only now: a failed start is torn down here, not deferred */
        if (opts->hooks)
                r->hooks = *opts->hooks;
        return &r->base;
}
