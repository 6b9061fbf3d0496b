/* SPDX-License-Identifier: MIT */
/* kernel.c - one local Jupyter kernel over ZeroMQ: readiness, execute with
 * a deadline, interrupt, recovery by replacement, shutdown. The process
 * itself (spawn, signals, reaping, teardown) is kernel_proc.c's; message
 * signing and parsing live in jmsg.c; the ZMTP connections in zmtp.c;
 * confinement in sandbox.c. Kernel output is untrusted: messages are
 * bounded in frames and bytes as they are read (zmtp.c; iopub's frames
 * from the output cap), each cell's outputs by output_max (collect.c). */
#include "coderq/local/kernel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/interp/collect.h"
#include "coderq/common/log.h"
#include "coderq/common/pylit.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"
#include "coderq/local/zmtp.h"
#include "kernel_int.h"
#include "py_int.h"

#define POLL_SLICE_MS 100
/* The cap of a forked kernel's warm-up report (read_warm_report(); its
 * names in kernel_int.h): the kernel writes at most 64 KiB of stdout,
 * which JSON may make six times as long. */
#define WARM_MAX (400u << 10)

const char *cq_kernel_errmsg(const cq_kernel_t *kernel)
{
        return kernel->errmsg;
}

pid_t cq_kernel_pid(const cq_kernel_t *kernel) { return kernel->proc.pid; }

bool cq_kernel_forked(const cq_kernel_t *kernel) { return kernel->proc.forked; }

const char *cq_kernel_work_dir(const cq_kernel_t *kernel)
{
        return kernel->work_dir;
}

const cq_sandbox_id_t *cq_kernel_sandbox_id(const cq_kernel_t *kernel)
{
        return &kernel->id;
}

const json_t *cq_kernel_language_info(const cq_kernel_t *kernel)
{
        return kernel->language_info;
}

const json_t *cq_kernel_env(const cq_kernel_t *kernel) { return kernel->env; }

void cq_kernel_stats(const cq_kernel_t *kernel, cq_jmsg_stats_t *stats)
{
        *stats = kernel->stats;
}

static int random_hex(char *out, size_t nbytes)
{
        static const char digits[] = "0123456789abcdef";
        unsigned char raw[32];
        size_t i;

        if (nbytes > sizeof(raw))
                return -1;
        if (getrandom(raw, nbytes, 0) != (ssize_t)nbytes)
                return -1;
        for (i = 0; i < nbytes; i++) {
                out[2 * i] = digits[raw[i] >> 4];
                out[2 * i + 1] = digits[raw[i] & 0xf];
        }
        out[2 * nbytes] = '\0';
        return 0;
}

/* ---- sockets and messages ---- */

/* A connection of \p type with our bounds, not yet connected: see
 * connect_socket(). Frames above the cap of the socket (iopub's from the
 * output cap) are read and dropped, not kept (zmtp.c). */
static cq_zmtp_t *new_socket(cq_kernel_t *kernel, cq_zmtp_type_t type)
{
        size_t cap = type == CQ_ZMTP_SUB ? kernel->iopub_max : kernel->msg_max;
        cq_zmtp_t *z =
            cq_zmtp_new(type, type == CQ_ZMTP_DEALER ? kernel->session : NULL,
                        cap, type == CQ_ZMTP_SUB ? 1024 : cap + 4096);

        if (!z)
                kernel_set_error(kernel,
                                 "could not create socket: out of memory");
        return z;
}

/* The dir holding the kernel's socket files, and the name of that of
 * \p port in it (into \p name, 32 bytes). */
static int sock_dir(const cq_kernel_t *kernel, int port, char *name)
{
        snprintf(name, 32, "%s-%d", kernel->ipc_name, port);
        return kernel->tmp_fd >= 0 ? kernel->tmp_fd : kernel->run_fd;
}

/* Connect \p z to the kernel's socket file of \p port through an O_PATH
 * of it that no link led to (/proc/self/fd/N: that inode, never a path
 * the kernel could have pointed at a socket of the host's). 0 connected,
 * 1 when the kernel does not listen yet (try again), -1 on error. */
static int connect_socket(cq_kernel_t *kernel, cq_zmtp_t *z, int port)
{
        char path[64], name[32];
        struct stat st;
        int dir = sock_dir(kernel, port, name), rc;
        int fd = openat(dir, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);

        if (fd < 0 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
                kernel_set_error(kernel, "the kernel's socket file %s is %s",
                                 name,
                                 fd < 0 ? strerror(errno) : "not a socket");
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        rc = cq_zmtp_connect(z, path);
        close(fd);
        if (rc < 0)
                kernel_set_error(kernel, "could not connect to %s: %s", name,
                                 cq_zmtp_error(z));
        return rc;
}

/* A pollfd for \p z: its descriptor (-1 when it has none, which poll()
 * skips) and the events it waits for. */
static void poll_item(struct pollfd *p, const cq_zmtp_t *z)
{
        p->fd = z ? cq_zmtp_fd(z) : -1;
        p->events = z ? cq_zmtp_events(z) : 0;
        p->revents = 0;
}

/* Wait up to \p ms for the kernel: items[0..2] its shell, iopub and
 * control, items[3] its pidfd; not at all when shell or iopub hold bytes
 * read before (pend[0], pend[1]), which poll() would not see. 0, or -1
 * when poll() failed (errno). */
static int
poll_kernel(cq_kernel_t *kernel, struct pollfd items[4], bool pend[2], long ms)
{
        pend[0] = kernel->shell && cq_zmtp_pending(kernel->shell);
        pend[1] = kernel->iopub && cq_zmtp_pending(kernel->iopub);
        poll_item(&items[0], kernel->shell);
        poll_item(&items[1], kernel->iopub);
        poll_item(&items[2], kernel->control);
        items[3].fd = kernel->proc.pidfd;
        items[3].events = POLLIN;
        items[3].revents = 0;
        if (poll(items, 4, pend[0] || pend[1] ? 0 : (int)ms) < 0 &&
            errno != EINTR)
                return -1;
        return 0;
}

/* After a poll: write what waits to be sent on \p z; whether to read it
 * (bytes arrived, or read before that hold more). */
static bool poll_done(const struct pollfd *p, cq_zmtp_t *z, bool pending)
{
        if (!z)
                return false;
        if (p->revents & POLLOUT)
                (void)cq_zmtp_flush(z);
        return pending || (p->revents & (POLLIN | POLLHUP | POLLERR));
}

/* Send a request; its msg_id goes to \p msg_id (64 bytes). */
static int send_request(cq_kernel_t *kernel,
                        cq_zmtp_t *sock,
                        const char *msg_type,
                        json_t *content,
                        char *msg_id)
{
        cq_jmsg_out_t out;
        cq_jframe_t frames[6];
        int rc = -1, i;

        if (cq_jmsg_build(kernel->key, strlen(kernel->key), kernel->session,
                          ++kernel->seq, msg_type, &content, NULL, &out)) {
                kernel_set_error(kernel, "could not build %s: out of memory",
                                 msg_type);
                goto out;
        }
        frames[0].data = CQ_JMSG_DELIM;
        frames[0].len = sizeof(CQ_JMSG_DELIM) - 1;
        frames[1].data = out.sig;
        frames[1].len = strlen(out.sig);
        for (i = 0; i < 4; i++) {
                frames[2 + i].data = out.frames[i];
                frames[2 + i].len = out.lens[i];
        }
        if (cq_zmtp_send(sock, frames, 6) != 0) {
                kernel_set_error(kernel, "could not send %s: %s", msg_type,
                                 cq_zmtp_error(sock));
                goto out;
        }
        if (msg_id)
                snprintf(msg_id, 64, "%s", out.msg_id);
        rc = 0;
out:
        cq_jmsg_out_release(&out);
        return rc;
}

/* Receive one message without blocking: 1 with \p msg filled, 0 when none
 * is waiting (or the connection is gone: cq_zmtp_closed()), -1 when one
 * arrived but was dropped. Of one dropped for its size or its frames, the
 * size of its largest frame (the content, or a buffer: what the output
 * was) is added to \p *dropped (NULL: not counted). */
static int recv_msg(cq_kernel_t *kernel,
                    cq_zmtp_t *sock,
                    cq_jmsg_t *msg,
                    uint64_t *dropped)
{
        cq_zmtp_msg_t m;
        int r;

        cq_jmsg_init(msg);
        if (!sock)
                return 0;
        r = cq_zmtp_recv(sock, &m);
        if (r == 0 || r == -2)
                return 0;
        if (r == -1) {
                if (m.dropped_frames > CQ_JMSG_MAX_FRAMES)
                        kernel->stats.malformed++;
                else
                        kernel->stats.oversize++;
                if (dropped)
                        *dropped += m.dropped_max_frame;
                return -1;
        }
        if (cq_jmsg_parse(kernel->key, strlen(kernel->key), m.frames, m.nframes,
                          sock == kernel->iopub ? kernel->iopub_max
                                                : kernel->msg_max,
                          msg, &kernel->stats, NULL, 0) == CQ_JMSG_DROP_NONE)
                return 1;
        return -1;
}

/* ---- output collection (the accounting is collect.c's) ---- */

static json_t *stream_part(const char *name, const char *text, size_t len)
{
        return json_pack("{s:s, s:s, s:o}", "output_type", "stream", "name",
                         name, "text", json_stringn_nocheck(text, len));
}

/* Add a stream's text to \p col, turning each "[TAG N]" of the shim into
 * N bytes dropped at that point. */
static void add_stream(cq_collect_t *col,
                       const char *tag,
                       const char *name,
                       const char *s,
                       size_t len,
                       bool *reportedp)
{
        size_t taglen = strlen(tag);

        while (len > 0) {
                const char *p = memmem(s, len, tag, taglen);
                const char *q = p ? p + taglen : NULL;
                uint64_t n = 0;
                json_t *out;

                while (q && q < s + len && *q >= '0' && *q <= '9' &&
                       n < UINT64_MAX / 10)
                        n = n * 10 + (uint64_t)(*q++ - '0');
                if (q && (q == p + taglen || q >= s + len || *q != ']'))
                        q = NULL; /* not a report after all: plain text */
                if (!q) {
                        out = stream_part(name, s, len);
                        cq_collect_add(col, &out);
                        return;
                }
                if (p > s) {
                        out = stream_part(name, s, (size_t)(p - s));
                        cq_collect_add(col, &out);
                }
                cq_collect_dropped(col, n, false);
                *reportedp = true;
                len -= (size_t)(q + 1 - s);
                s = q + 1;
        }
}

static json_t *error_output(const json_t *content)
{
        json_t *tb = json_array(), *v;
        const char *ename =
            json_string_value(json_object_get(content, "ename"));
        const char *evalue =
            json_string_value(json_object_get(content, "evalue"));
        size_t i;

        if (!tb)
                return NULL;
        json_array_foreach(json_object_get(content, "traceback"), i, v)
        {
                size_t len;
                char *clean;

                if (!json_is_string(v))
                        continue;
                clean = cq_ansi_strip(json_string_value(v),
                                      json_string_length(v), &len);
                if (clean)
                        json_array_append_new(tb,
                                              json_stringn_nocheck(clean, len));
                free(clean);
        }
        return json_pack("{s:s, s:s, s:s, s:o}", "output_type", "error",
                         "ename", ename ? ename : "Error", "evalue",
                         evalue ? evalue : "", "traceback", tb);
}

/* One iopub message of the running cell, turned into outputs. */
static void handle_iopub(cq_kernel_t *kernel,
                         cq_collect_t *col,
                         const cq_jmsg_t *msg,
                         cq_cell_result_t *res,
                         bool *idle,
                         bool *saw_error,
                         bool *shim_dropped)
{
        const char *type = msg->msg_type;
        const json_t *c = msg->content;
        json_t *out = NULL;

        if (strcmp(type, "status") == 0) {
                const char *state =
                    json_string_value(json_object_get(c, "execution_state"));

                if (state && strcmp(state, "idle") == 0)
                        *idle = true;
                if (res->timing && state)
                        json_object_set(res->timing,
                                        strcmp(state, "idle") == 0
                                            ? "iopub.status.idle"
                                            : "iopub.status.busy",
                                        json_object_get(msg->header, "date"));
                return;
        }
        if (strcmp(type, "execute_input") == 0) {
                json_t *n = json_object_get(c, "execution_count");

                if (json_is_integer(n))
                        res->execution_count = (int)json_integer_value(n);
                if (res->timing)
                        json_object_set(res->timing, "iopub.execute_input",
                                        json_object_get(msg->header, "date"));
                return;
        }
        if (strcmp(type, "stream") == 0) {
                const json_t *text = json_object_get(c, "text");
                const char *name =
                    json_string_value(json_object_get(c, "name"));

                if (!json_is_string(text) || !name ||
                    (strcmp(name, "stdout") && strcmp(name, "stderr")))
                        return;
                add_stream(col, kernel->drop_tag, name, json_string_value(text),
                           json_string_length(text), shim_dropped);
                return;
        } else if (strcmp(type, "display_data") == 0 ||
                   strcmp(type, "execute_result") == 0) {
                json_t *data = json_object_get(c, "data");
                json_t *meta = json_object_get(c, "metadata");

                if (!json_is_object(data))
                        return;
                out = json_pack("{s:s, s:O, s:o}", "output_type", type, "data",
                                data, "metadata",
                                json_is_object(meta) ? json_incref(meta)
                                                     : json_object());
                if (out && strcmp(type, "execute_result") == 0) {
                        json_t *n = json_object_get(c, "execution_count");

                        json_object_set_new(out, "execution_count",
                                            json_is_integer(n) ? json_incref(n)
                                                               : json_null());
                        if (json_is_integer(n))
                                res->execution_count =
                                    (int)json_integer_value(n);
                }
                if (out && json_is_object(json_object_get(c, "transient")))
                        json_object_set(out, "transient",
                                        json_object_get(c, "transient"));
        } else if (strcmp(type, "error") == 0) {
                out = error_output(c);
                *saw_error = true;
        } else if (strcmp(type, "clear_output") == 0) {
                cq_collect_clear(col, json_is_true(json_object_get(c, "wait")));
                return;
        } else if (strcmp(type, "update_display_data") == 0) {
                const char *id = json_string_value(json_object_get(
                    json_object_get(c, "transient"), "display_id"));

                cq_collect_update(col, id, json_object_get(c, "data"),
                                  json_object_get(c, "metadata"));
                return;
        } else {
                return; /* comms and the like are not outputs */
        }
        if (!out) /* out of memory: the message still counts */
                cq_collect_dropped(col, cq_collect_size(c), false);
        cq_collect_add(col, &out);
}

/* ---- lifecycle ---- */

static cq_err_t run_cell(cq_kernel_t *kernel,
                         const char *code,
                         bool silent,
                         const cq_exec_opts_t *opts,
                         cq_cell_result_t *res);

/* Whether a connection to the kernel ended or broke the protocol: the
 * kernel closed it or sent what no kernel sends. Said in its error. */
static bool broken(cq_kernel_t *kernel)
{
        cq_zmtp_t *socks[3] = {kernel->shell, kernel->iopub, kernel->control};
        size_t i;

        for (i = 0; i < 3; i++)
                if (!socks[i] || cq_zmtp_closed(socks[i])) {
                        kernel_set_error(
                            kernel, "the kernel broke its connection: %s",
                            socks[i] ? cq_zmtp_error(socks[i]) : "none");
                        return true;
                }
        return false;
}

/* Read and drop what control holds (replies to interrupts), at most a
 * few messages a call: nothing waits for them, and a closed connection
 * shows as such. */
static void drop_control(cq_kernel_t *kernel)
{
        cq_jmsg_t msg;
        int n = 0;

        while (n++ < 16 && recv_msg(kernel, kernel->control, &msg, NULL) != 0)
                cq_jmsg_release(&msg);
}

/* Drop what iopub holds now: a bounded number of rounds, so a kernel that
 * publishes without end cannot keep us here. */
static void drain_iopub(cq_kernel_t *kernel)
{
        cq_jmsg_t msg;
        int round;

        for (round = 0; round < 64 && kernel->iopub; round++) {
                struct pollfd p;
                bool pending = cq_zmtp_pending(kernel->iopub);
                int n = 0;

                poll_item(&p, kernel->iopub);
                if (p.fd < 0 || (poll(&p, 1, 0) <= 0 && !pending))
                        return;
                if (!poll_done(&p, kernel->iopub, pending))
                        return;
                while (recv_msg(kernel, kernel->iopub, &msg, NULL) != 0 &&
                       n++ < 256)
                        cq_jmsg_release(&msg);
                cq_jmsg_release(&msg);
        }
}

/* \p code as one line that hands it to exec(): IPython tokenizes a cell
 * line by line, more than once, before it runs it (some 5 ms of CPU for
 * the hundred lines of the warm-up); one string token costs next to
 * nothing. The literal escapes what would end it or is not printable and
 * keeps every other byte, so the cell is hardly longer (ipykernel hashes
 * every cell's text in Python). */
static cq_err_t exec_line(cq_buf_t *out, const cq_buf_t *code)
{
        cq_err_t err = cq_buf_append_str(out, "exec('");
        size_t i;

        for (i = 0; err == CQ_OK && i < code->len; i++) {
                const unsigned char c = (unsigned char)code->data[i];

                if (c == '\\' || c == '\'')
                        err = cq_buf_printf(out, "\\%c", c);
                else if (c == '\n')
                        err = cq_buf_append_str(out, "\\n");
                else if (c < 0x20 || c == 0x7f)
                        err = cq_buf_printf(out, "\\x%02x", c);
                else
                        err = cq_buf_append(out, &code->data[i], 1);
        }
        return err != CQ_OK ? err : cq_buf_append_str(out, "')\n");
}

/* This start's warm-up cell into \p line: the output shim, the pool's
 * preload and the environment probe (reporting after \p marker), as one
 * exec() line.
 *
 * The shim (kernel_shim.py) runs silently in every kernel once it is
 * ready: _cq_setup() gets the head budget, the tail kept per stream, the
 * characters per message and the drop tag. ipykernel buffers stdout for
 * 0.2 s and publishes it as one message however large, which iopub's
 * frame cap would refuse. This makes the kernel itself keep a head and a
 * tail per cell, send small messages (blocking the writer until each is
 * sent), and report the UTF-8 bytes it dropped as "[TAG N]" where they
 * were, as it goes (a cell that dies has reported most); TAG holds a
 * random nonce, and the client adds N to its own count. And iopub blocks
 * instead of dropping when the client does not read (XPUB_NODROP: the
 * client reads only while a cell waits, zmtp.c), so the backlog of a fast
 * publisher stays in the kernel. The tail is the client's (half the cap)
 * per stream: the client trims what two streams' tails add up to. And
 * what is written to fds 1 and 2 themselves (a subprocess, a C library)
 * is read by _cq_fd()'s watcher, which decodes UTF-8 across reads and
 * makes invalid bytes U+FFFD: ipykernel's own decodes each 1000-byte read
 * strictly, and the first character split between two reads (or any
 * invalid byte) ended it for good, losing every later byte written there
 * and blocking the writers once the pipe was full. A kernel forked by the
 * kernel server has this watcher from the start (kserver.py); a cold one
 * gets its pipes replaced, so that ipykernel's watcher reads its end and
 * stops. The client still enforces its cap: code can undo this. */
static int build_warmup(cq_kernel_t *kernel, const char *marker, cq_buf_t *line)
{
        size_t half = kernel->output_max / 2;
        /* a message of chunk characters is at most 6 bytes each as JSON
         * (\u001f), so within iopub's frame cap */
        size_t chunk = kernel->output_max / 16;
        char *probe = cq_interp_env_probe(marker);
        char tag[sizeof(DROP_TAG) + sizeof(kernel->nonce)];
        cq_buf_t code;
        int rc = -1;

        snprintf(tag, sizeof(tag), DROP_TAG "%s", kernel->nonce);
        cq_buf_init(&code, 1 << 20);
        if (probe && cq_buf_append_str(&code, cq_kernel_shim_py) == CQ_OK &&
            cq_buf_printf(&code, "_cq_setup(%zu, %zu, %zu, ",
                          half > 2048 ? half - 1024 : half / 2,
                          half > 2048 ? half - 512 : half / 2,
                          chunk > 256 ? chunk : 256) == CQ_OK &&
            cq_pylit_append(&code, tag, strlen(tag)) == CQ_OK &&
            cq_buf_append_str(&code, ")\ndel _cq_setup\n"
                                     "_cq_fd()\ndel _cq_fd\n") == CQ_OK &&
            (!kernel->preload ||
             (cq_buf_append_str(&code, "\n") == CQ_OK &&
              cq_buf_append_str(&code, kernel->preload) == CQ_OK)) &&
            cq_buf_append_str(&code, "\n") == CQ_OK &&
            cq_buf_append_str(&code, probe) == CQ_OK &&
            exec_line(line, &code) == CQ_OK)
                rc = 0;
        free(probe);
        cq_buf_release(&code);
        return rc;
}

/* Note what the warm-up made of the environment (stdout \p outputs) and
 * log a failure as such; a warm-up that failed leaves a kernel that
 * works, as before. */
static void warm_result(cq_kernel_t *kernel,
                        const char *marker,
                        const char *status,
                        json_t *outputs)
{
        if (status) {
                char *dump = json_dumps(outputs, JSON_COMPACT);

                cq_log_kv(CQ_LOG_WARN, "kernel warm-up failed", "status",
                          status, "outputs", dump ? dump : "", NULL);
                free(dump);
        }
        /* The first start's report stands for the kernel's life: a
         * restart follows job code, which may have left files that a
         * fresh Python reads as it starts. */
        if (!kernel->env)
                kernel->env = cq_interp_env_parse(outputs, marker);
}

/* The warm-up as a silent cell, for a kernel that did not run it itself
 * (a cold one). */
static int
run_warmup(cq_kernel_t *kernel, const cq_buf_t *warm, const char *marker)
{
        cq_exec_opts_t eo = {0};
        cq_cell_result_t res;

        eo.timeout_ms = kernel->startup_timeout_ms;
        cq_cell_result_init(&res);
        if (run_cell(kernel, warm->data, true, &eo, &res) != CQ_OK ||
            res.status != CQ_CELL_OK) {
                warm_result(kernel, marker, cq_cell_status_name(res.status),
                            res.outputs);
                if (!lproc_alive(&kernel->proc)) {
                        cq_cell_result_release(&res);
                        kernel_set_error(kernel, "kernel died during warm-up");
                        return -1;
                }
        } else {
                warm_result(kernel, marker, NULL, res.outputs);
        }
        cq_cell_result_release(&res);
        return 0;
}

json_t *kernel_warm_outputs(const char *buf, size_t len, bool *ok)
{
        json_t *doc = json_loadb(buf, len, 0, NULL), *outputs = NULL, *out;
        const json_t *okv = json_object_get(doc, "ok");
        const char *ename, *evalue;

        if (!json_is_object(doc) || !json_is_boolean(okv) ||
            !json_is_string(json_object_get(doc, "stdout")))
                goto out;
        *ok = json_is_true(okv);
        outputs = json_array();
        out = json_pack("{s:s, s:s, s:O}", "output_type", "stream", "name",
                        "stdout", "text", json_object_get(doc, "stdout"));
        if (!outputs || json_array_append_new(outputs, out) != 0)
                goto fail;
        if (!*ok) {
                ename = json_string_value(json_object_get(doc, "ename"));
                evalue = json_string_value(json_object_get(doc, "evalue"));
                out = json_pack("{s:s, s:s, s:s}", "output_type", "error",
                                "ename", ename ? ename : "", "evalue",
                                evalue ? evalue : "");
                if (json_array_append_new(outputs, out) != 0)
                        goto fail;
        }
        goto out;
fail:
        json_decref(outputs);
        outputs = NULL;
out:
        json_decref(doc);
        return outputs;
}

/* What a forked kernel reported of the warm-up it ran before it
 * answered, read from the run dir or its /tmp, which it can write: no
 * link followed, at most WARM_MAX bytes, parsed as any kernel output is.
 * No report from a kernel that answered is an error. */
static int read_warm_report(cq_kernel_t *kernel, const char *marker)
{
        json_t *outputs = NULL;
        struct stat st;
        char *buf = NULL;
        size_t len = 0;
        bool ok = false;
        const char *name = strrchr(kernel->warm_path, '/') + 1;
        int fd, rc = -1;

        /* in the run dir or on its /tmp, through the O_PATH of either */
        fd = openat(kernel->tmp_fd >= 0 ? kernel->tmp_fd : kernel->run_fd, name,
                    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
                kernel_set_error(kernel, "kernel left no warm-up report: %s",
                                 fd < 0 ? strerror(errno) : "not a file");
                goto out;
        }
        buf = malloc(WARM_MAX);
        if (!buf) {
                kernel_set_error(kernel, "out of memory");
                goto out;
        }
        len = lproc_read_upto(fd, buf, WARM_MAX);
        outputs = kernel_warm_outputs(buf, len, &ok);
        if (!outputs) {
                kernel_set_error(kernel,
                                 "kernel's warm-up report is not one "
                                 "(%zu bytes)",
                                 len);
                goto out;
        }
        warm_result(kernel, marker, ok ? NULL : "error", outputs);
        rc = 0;
out:
        json_decref(outputs);
        free(buf);
        if (fd >= 0)
                close(fd);
        unlinkat(kernel->tmp_fd >= 0 ? kernel->tmp_fd : kernel->run_fd, name,
                 0);
        return rc;
}

/* The sockets start() connects, in the order of kernel->shell, iopub and
 * control, and the kernel's socket files they connect to. */
static const int start_ports[3] = {1, 2, 4};

static cq_zmtp_t **start_socket(cq_kernel_t *kernel, int i)
{
        return i == 0   ? &kernel->shell
               : i == 1 ? &kernel->iopub
                        : &kernel->control;
}

/* Connect each socket of start() whose file the kernel has bound and
 * listens on; returns how many are connected, -1 on error. A stat() of
 * the file from the poll loop tells when to try. */
static int connect_bound(cq_kernel_t *kernel, bool connected[3])
{
        int i, n = 0, rc;

        for (i = 0; i < 3; i++) {
                char name[32];
                struct stat st;

                if (!connected[i]) {
                        int dir = sock_dir(kernel, start_ports[i], name);

                        if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
                                continue;
                        rc = connect_socket(kernel, *start_socket(kernel, i),
                                            start_ports[i]);
                        if (rc < 0)
                                return -1;
                        if (rc > 0)
                                continue; /* bound, not yet listening */
                        connected[i] = true;
                }
                n++;
        }
        return n;
}

/* A start's new keys, nonce and files, and its warm-up cell into \p warm
 * with the marker its environment report comes after (\p marker, 64
 * bytes). -1 with the error set. */
static int start_prepare(cq_kernel_t *kernel, char *marker, cq_buf_t *warm)
{
        int port;

        if (random_hex(kernel->key, 16) || random_hex(kernel->session, 16) ||
            random_hex(kernel->nonce, 8)) {
                kernel_set_error(kernel, "could not get random bytes: %s",
                                 strerror(errno));
                return -1;
        }
        snprintf(kernel->drop_tag, sizeof(kernel->drop_tag), "[" DROP_TAG "%s ",
                 kernel->nonce);
        kernel->seq = 0;
        atomic_store(&kernel->interrupt_req, 0);
        kernel_files_in_run_dir(kernel);
        for (port = 1; port <= 5; port++) {
                char name[32];

                unlinkat(sock_dir(kernel, port, name), name, 0);
        }
        /* The environment is reported in the same silent cell, after
         * the preload, before any job code runs. */
        snprintf(marker, 64, "coderq-env %s ", kernel->nonce);
        if (unlinkat(kernel->run_fd, WARM_NAME, 0) != 0 && errno != ENOENT) {
                kernel_set_error(kernel, "could not remove %s: %s",
                                 kernel->warm_path, strerror(errno));
                return -1;
        }
        if (build_warmup(kernel, marker, warm)) {
                kernel_set_error(kernel, "out of memory");
                return -1;
        }
        return 0;
}

/* A start's wait for the kernel (start_wait()). */
typedef struct boot {
        int64_t spawned, deadline;
        int64_t next_send; /* of the next kernel_info_request */
        bool connected[3]; /* as start_socket() numbers them */
        int nconnected;
        bool got_reply; /* shell answered kernel_info */
        bool got_iopub; /* iopub published */
} boot_t;

/* Whether the kernel still may come up: -1 with the error set (and its
 * log's tail) when its time is up or it exited. */
static int boot_alive(cq_kernel_t *kernel, const boot_t *b, int64_t now)
{
        char tail[420];

        if (now >= b->deadline) {
                kernel_log_tail(kernel, tail, sizeof(tail));
                kernel_set_error(kernel, "kernel did not respond in %lld ms%s",
                                 (long long)kernel->startup_timeout_ms, tail);
                return -1;
        }
        if (!lproc_alive(&kernel->proc)) {
                kernel_log_tail(kernel, tail, sizeof(tail));
                kernel_set_error(kernel, "kernel exited during startup%s",
                                 tail);
                return -1;
        }
        return 0;
}

/* Ask for kernel_info when it is time to. A request waits in the shell
 * socket for a kernel it is connected to, not for one it is not. */
static int boot_ask(cq_kernel_t *kernel, boot_t *b, int64_t now)
{
        if (!b->connected[0] || now < b->next_send)
                return 0;
        if (send_request(kernel, kernel->shell, "kernel_info_request",
                         json_object(), NULL))
                return -1;
        /* Once shell answered, only iopub's subscription is missing: ask
         * again soon. Before, each request waits queued for the kernel. */
        b->next_send = now + (b->got_reply ? 20 : 100);
        return 0;
}

/* Read what the poll found: control's messages dropped, shell's
 * kernel_info_reply (its language_info kept), any message of iopub. */
static void boot_read(cq_kernel_t *kernel,
                      boot_t *b,
                      const struct pollfd items[4],
                      const bool pend[2])
{
        cq_jmsg_t msg;
        int k = 0;

        if (poll_done(&items[2], kernel->control, false))
                drop_control(kernel);
        if (poll_done(&items[0], kernel->shell, pend[0])) {
                while (recv_msg(kernel, kernel->shell, &msg, NULL) != 0) {
                        if (msg.content &&
                            strcmp(msg.msg_type, "kernel_info_reply") == 0) {
                                json_t *li = json_object_get(msg.content,
                                                             "language_info");

                                if (json_is_object(li) &&
                                    !kernel->language_info)
                                        kernel->language_info =
                                            json_deep_copy(li);
                                b->got_reply = true;
                        }
                        cq_jmsg_release(&msg);
                }
        }
        if (poll_done(&items[1], kernel->iopub, pend[1])) {
                while (k++ < 256 &&
                       recv_msg(kernel, kernel->iopub, &msg, NULL) != 0) {
                        if (msg.content)
                                b->got_iopub = true;
                        cq_jmsg_release(&msg);
                }
        }
}

/* Whether a connection to the starting kernel ended or broke the
 * protocol: said in its error, with the log's tail. */
static bool boot_broken(cq_kernel_t *kernel)
{
        char tail[420];

        if (!cq_zmtp_closed(kernel->shell) && !cq_zmtp_closed(kernel->iopub) &&
            !cq_zmtp_closed(kernel->control))
                return false;
        kernel_log_tail(kernel, tail, sizeof(tail));
        kernel_set_error(
            kernel, "the kernel broke its connection: %s%s",
            *cq_zmtp_error(kernel->shell)   ? cq_zmtp_error(kernel->shell)
            : *cq_zmtp_error(kernel->iopub) ? cq_zmtp_error(kernel->iopub)
                                            : cq_zmtp_error(kernel->control),
            tail);
        return true;
}

/* Wait until the spawned kernel answered kernel_info and published on
 * iopub: iopub is PUB/SUB and drops what was sent before our subscription
 * reached it, so resend kernel_info every 100 ms until iopub speaks. Each
 * socket connects once the kernel has bound it (connect_bound()). */
static int start_wait(cq_kernel_t *kernel)
{
        boot_t b;

        memset(&b, 0, sizeof(b));
        b.spawned = cq_now_ms();
        b.deadline = b.spawned + kernel->startup_timeout_ms;
        while (!b.got_reply || !b.got_iopub || b.nconnected < 3) {
                struct pollfd items[4];
                int64_t now = cq_now_ms();
                long wait_ms;
                bool pend[2];

                if (boot_alive(kernel, &b, now))
                        return -1;
                if (b.nconnected < 3) {
                        b.nconnected = connect_bound(kernel, b.connected);
                        if (b.nconnected < 0)
                                return -1;
                }
                if (boot_ask(kernel, &b, now))
                        return -1;
                /* Until the kernel has bound its sockets, look for their
                 * files often while a forked kernel would be coming up,
                 * less often after. */
                wait_ms = b.nconnected == 3       ? 50
                          : now - b.spawned < 200 ? 2
                                                  : 10;
                if (poll_kernel(kernel, items, pend, wait_ms) != 0) {
                        kernel_set_error(kernel, "could not poll: %s",
                                         strerror(errno));
                        return -1;
                }
                boot_read(kernel, &b, items, pend);
                if (boot_broken(kernel))
                        return -1;
        }
        return 0;
}

/* Spawn the kernel, wait until it is ready (start_wait()), and have it
 * run its warm-up: itself before it answered (forked), or as a silent
 * cell. */
static int start(cq_kernel_t *kernel)
{
        char marker[64];
        cq_buf_t warm;

        cq_buf_init(&warm, (4 << 20) + 64);
        if (start_prepare(kernel, marker, &warm)) {
                cq_buf_release(&warm);
                return -1;
        }
        kernel->warm_code = warm.data;
        kernel->warm_in_kernel = false;
        kernel->shell = new_socket(kernel, CQ_ZMTP_DEALER);
        kernel->iopub = kernel->shell ? new_socket(kernel, CQ_ZMTP_SUB) : NULL;
        kernel->control =
            kernel->iopub ? new_socket(kernel, CQ_ZMTP_DEALER) : NULL;
        if (!kernel->control || kernel_spawn(kernel) || start_wait(kernel))
                goto fail;
        lproc_read_inner_pid(&kernel->proc, true);
        /* What the kernel_info requests left queued; what still comes of
         * them later is told apart by its parent header (run_cell). */
        drain_iopub(kernel);
        if (kernel->warm_code && kernel->proc.forked &&
            kernel->warm_in_kernel) {
                if (read_warm_report(kernel, marker))
                        goto fail;
        } else if (run_warmup(kernel, &warm, marker)) {
                goto fail;
        }
        cq_buf_release(&warm);
        kernel->warm_code = NULL;
        return 0;
fail:
        cq_buf_release(&warm);
        kernel->warm_code = NULL;
        kernel_teardown(kernel);
        return -1;
}

static cq_err_t respawn(cq_kernel_t *kernel)
{
        kernel_teardown(kernel);
        return start(kernel) == 0 ? CQ_OK : CQ_ERR_RETRIABLE;
}

/* The options of \p opts, copied, with their defaults, and the paths of
 * the run dir. -1 with the error set. */
static int kernel_options(cq_kernel_t *kernel, const cq_kernel_opts_t *opts)
{
        kernel->nice = opts->nice > 0 && opts->nice < 20 ? opts->nice : 0;
        kernel->python =
            strdup(opts->python ? opts->python : "/usr/bin/python3");
        kernel->work_dir = opts->work_dir ? strdup(opts->work_dir) : NULL;
        kernel->preload = opts->preload ? strdup(opts->preload) : NULL;
        kernel->startup_timeout_ms =
            opts->startup_timeout_ms > 0 ? opts->startup_timeout_ms : 60000;
        kernel->output_max = opts->output_max ? opts->output_max : 1 << 20;
        kernel->msg_max = opts->msg_max ? opts->msg_max : 64u << 20;
        /* an iopub frame larger than this carries an output that could not
         * be kept whole anyway: refuse it rather than allocate it */
        kernel->iopub_max = kernel->output_max + CQ_COLLECT_SLACK;
        if (opts->msg_max && opts->msg_max < kernel->iopub_max)
                kernel->iopub_max = opts->msg_max;
        kernel->interrupt_grace_ms =
            opts->interrupt_grace_ms > 0 ? opts->interrupt_grace_ms : 2500;
        kernel->idle_wait_ms =
            opts->idle_wait_ms > 0 ? opts->idle_wait_ms : 4000;
        kernel->sandbox = opts->sandbox;
        kernel->kserver = opts->kserver;
        if (!kernel->python || !kernel->work_dir ||
            (opts->preload && !kernel->preload)) {
                kernel_set_error(kernel, "could not start kernel: %s",
                                 kernel->work_dir ? "out of memory"
                                                  : "no work dir");
                return -1;
        }
        snprintf(kernel->run_dir, sizeof(kernel->run_dir), "%s/%s",
                 kernel->work_dir, CQ_KERNEL_RUN_DIR);
        snprintf(kernel->conn_path, sizeof(kernel->conn_path), "%s/conn.json",
                 kernel->run_dir);
        if (strlen(kernel->run_dir) + sizeof("/k-5") >
            sizeof(((struct sockaddr_un *)0)->sun_path)) {
                kernel_set_error(kernel,
                                 "could not start kernel: ipc path in \"%s\" "
                                 "is too long for a Unix socket",
                                 kernel->run_dir);
                return -1;
        }
        return 0;
}

/* The kernel's uid, and its run dir made, owned by that uid and opened
 * (run_fd), with an unsandboxed kernel's matplotlibrc. -1 with the error
 * set. */
static int make_run_dir(cq_kernel_t *kernel)
{
        struct stat st;

        /* Its own uid before any of its files exist, for its whole life:
         * a restart keeps it, destroy releases it once nothing runs as
         * it. */
        if (cq_sandbox_id_acquire(kernel->sandbox, &kernel->id, kernel->errmsg,
                                  sizeof(kernel->errmsg)))
                return -1;
        if (cq_sandbox_own(&kernel->id, kernel->work_dir)) {
                kernel_set_error(kernel, "could not chown \"%s\": %s",
                                 kernel->work_dir, strerror(errno));
                return -1;
        }
        if (mkdir(kernel->run_dir, 0700) && errno != EEXIST) {
                kernel_set_error(kernel, "could not create \"%s\": %s",
                                 kernel->run_dir, strerror(errno));
                return -1;
        }
        if (lstat(kernel->run_dir, &st) || !S_ISDIR(st.st_mode) ||
            chmod(kernel->run_dir, 0700) ||
            cq_sandbox_own(&kernel->id, kernel->run_dir)) {
                kernel_set_error(kernel, "could not prepare \"%s\": %s",
                                 kernel->run_dir, strerror(errno));
                return -1;
        }
        /* no code of the kernel has run: this path is still the dir */
        kernel->run_fd = open(kernel->run_dir,
                              O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (kernel->run_fd < 0) {
                kernel_set_error(kernel, "could not open \"%s\": %s",
                                 kernel->run_dir, strerror(errno));
                return -1;
        }
        /* a sandboxed kernel's is made on its own /tmp */
        if (!cq_sandbox_enabled(kernel->sandbox) &&
            kernel_write_mpl_rc(kernel)) {
                kernel_set_error(kernel,
                                 "could not write the matplotlibrc of \"%s\": "
                                 "%s",
                                 kernel->run_dir, strerror(errno));
                return -1;
        }
        return 0;
}

cq_kernel_t *
cq_kernel_new(const cq_kernel_opts_t *opts, char *errstr, size_t errstr_size)
{
        cq_kernel_t *kernel = calloc(1, sizeof(*kernel));

        if (!kernel) {
                cq_errstr_set(errstr, errstr_size,
                              "could not start kernel: out of memory");
                return NULL;
        }
        lproc_init(&kernel->proc, "kernel");
        kernel->tmp_fd = -1;
        kernel->run_fd = -1;
        kernel->id.lock_fd = -1;
        atomic_init(&kernel->interrupt_req, 0);
        if (kernel_options(kernel, opts) || make_run_dir(kernel) ||
            start(kernel)) {
                cq_errstr_set(errstr, errstr_size, "%s", kernel->errmsg);
                cq_kernel_destroy(&kernel);
                return NULL;
        }
        return kernel;
}

int cq_kernel_interrupt(cq_kernel_t *kernel)
{
        pid_t pid = (pid_t)atomic_load(&kernel->proc.sig_pid);

        atomic_store(&kernel->interrupt_req, 1);
        /* In the sandbox the kernel is in bubblewrap's own session, out of
         * reach of our signal: the owner thread sends interrupt_request on
         * control instead (see cell_turn()). */
        if (!cq_sandbox_enabled(kernel->sandbox) && pid > 0)
                return killpg(pid, SIGINT) == 0 ? 0 : -1;
        return 0;
}

static void send_interrupt(cq_kernel_t *kernel)
{
        json_t *content;

        if (!cq_sandbox_enabled(kernel->sandbox) && kernel->proc.pid > 0) {
                killpg(kernel->proc.pid, SIGINT);
                return;
        }
        content = json_object();
        (void)send_request(kernel, kernel->control, "interrupt_request",
                           content, NULL);
}

static void add_output(cq_collect_t *col, json_t *out)
{
        cq_collect_add(col, &out);
}

static json_t *status_error(const char *ename, const char *evalue)
{
        return json_pack("{s:s, s:s, s:s, s:[]}", "output_type", "error",
                         "ename", ename, "evalue", evalue, "traceback");
}

/* All six fields: without "silent" ipykernel 6.17 never replies. */
static json_t *execute_content(const char *code, bool silent)
{
        return json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", code,
                         "silent", silent, "store_history", !silent,
                         "user_expressions", "allow_stdin", 0, "stop_on_error",
                         1);
}

/* ---- one cell, as a state machine ---- */

/* Where a cell is in run_cell(). cell_start() sends it and gives the
 * first state; while it waits for the kernel, a function per state
 * takes it on each turn (cell_turn(): cell_running(), cell_interrupted()
 * or cell_replied()), after which the kernel is polled and read
 * (cell_poll()); cell_finish() makes the result of the state it ends
 * in. */
typedef enum cell_state {
        CELL_RUNNING,     /* no reply yet: its deadline and a cancel apply */
        CELL_INTERRUPTED, /* timed out or cancelled, interrupted, no reply
                           * yet: the interrupt's grace applies */
        CELL_REPLIED,     /* replied: the idle status ends its outputs */
        CELL_DONE,        /* replied, and idle or waited for long enough */
        CELL_KILL,        /* hung or broke its connection: replace it */
        CELL_ABANDONED,   /* cancelled with CQ_INTERP_CANCEL_ABANDON: not
                           * waited for; the kernel is killed */
        CELL_DIED,        /* the kernel died: replace it */
        CELL_FAILED,      /* a request could not be sent: no result */
} cell_state_t;

/* Why a cell was interrupted. */
typedef enum cell_stop {
        CELL_STOP_NONE = 0,
        CELL_STOP_TIMEOUT, /* its deadline passed */
        CELL_STOP_CANCEL,  /* opts->cancel was set */
} cell_stop_t;

/* One cell on its way through the states. */
typedef struct cell {
        cq_kernel_t *kernel;
        const char *code;
        bool silent;
        const cq_exec_opts_t *opts;
        cq_cell_result_t *res;
        cq_collect_t col;
        char msg_id[64]; /* of the execute_request in flight */
        /* The execute_reply's content (every message parsed has one),
         * from CELL_REPLIED on; NULL before. */
        json_t *reply;
        int64_t start_ms;
        int64_t deadline, slow_at; /* 0: none, or passed (slow_at) */
        int64_t reply_at;
        int64_t heard_at;       /* iopub's last message after the reply */
        int64_t interrupted_at; /* 0: not interrupted */
        cell_stop_t stop;
        int aborts; /* execute_requests sent again after an abort */
        /* what iopub told: the idle status, an error output, a report of
         * bytes the shim dropped */
        bool idle, saw_error, shim_dropped;
} cell_t;

/* Send the cell's execute_request; its msg_id goes to c->msg_id. */
static int cell_send(cell_t *c)
{
        json_t *content = execute_content(c->code, c->silent);

        if (!content) {
                kernel_set_error(c->kernel,
                                 "could not run cell: out of memory");
                return -1;
        }
        return send_request(c->kernel, c->kernel->shell, "execute_request",
                            content, c->msg_id);
}

/* CELL_START: a kernel that died, or closed or broke a connection
 * between cells, is replaced before it is sent the cell. */
static cell_state_t cell_start(cell_t *c)
{
        const cq_exec_opts_t *opts = c->opts;

        if (!lproc_alive(&c->kernel->proc))
                return CELL_DIED;
        if (broken(c->kernel))
                return CELL_KILL;
        if (cell_send(c))
                return CELL_FAILED;
        c->deadline = opts->timeout_ms > 0 ? c->start_ms + opts->timeout_ms : 0;
        c->slow_at = opts->on_slow
                         ? c->start_ms + (opts->slow_ms > 0 ? opts->slow_ms : 0)
                         : 0;
        return CELL_RUNNING;
}

/* Whether the cell's cancel flag says to abandon it. */
static bool abandoned(const cell_t *c)
{
        return c->opts->cancel &&
               atomic_load(c->opts->cancel) == CQ_INTERP_CANCEL_ABANDON;
}

/* CELL_RUNNING: its deadline or a cancel interrupts the cell. */
static cell_state_t cell_running(cell_t *c, int64_t now)
{
        bool cancel = c->opts->cancel && atomic_load(c->opts->cancel) != 0;

        if (abandoned(c)) {
                c->stop = CELL_STOP_CANCEL;
                return CELL_ABANDONED;
        }
        if (c->deadline && now >= c->deadline)
                c->stop = CELL_STOP_TIMEOUT;
        else if (cancel)
                c->stop = CELL_STOP_CANCEL;
        else
                return CELL_RUNNING;
        send_interrupt(c->kernel);
        c->interrupted_at = now;
        return CELL_INTERRUPTED;
}

/* Whether an interrupted cell has outlived the interrupt's grace. */
static bool grace_over(const cell_t *c, int64_t now)
{
        return c->interrupted_at &&
               now - c->interrupted_at >= c->kernel->interrupt_grace_ms;
}

/* CELL_INTERRUPTED: a cell that does not stop in time is killed. */
static cell_state_t cell_interrupted(cell_t *c, int64_t now)
{
        if (abandoned(c)) {
                c->stop = CELL_STOP_CANCEL;
                return CELL_ABANDONED;
        }
        return grace_over(c, now) ? CELL_KILL : CELL_INTERRUPTED;
}

/* CELL_REPLIED: the idle status comes behind what iopub still holds (the
 * kernel queues outputs faster than they are read and parsed: 100
 * displays of 470 kB outlast 4 s under TSan): wait for it while messages
 * keep coming, up to 15 times the wait; then the reply is authoritative.
 * An interrupted cell still has its grace only. */
static cell_state_t cell_replied(cell_t *c, int64_t now)
{
        int64_t idle_wait_ms = c->kernel->idle_wait_ms;
        int64_t heard = c->heard_at > c->reply_at ? c->heard_at : c->reply_at;

        if (now - heard >= idle_wait_ms ||
            now - c->reply_at >= 15 * idle_wait_ms)
                return CELL_DONE;
        return grace_over(c, now) ? CELL_KILL : CELL_REPLIED;
}

/* How long the next poll may wait: a slice, less up to the deadline of a
 * cell not interrupted, less up to the slow callback. */
static long cell_wait_ms(const cell_t *c, int64_t now)
{
        long wait = POLL_SLICE_MS;

        /* Once the reply is in, neither the cell's deadline nor its slow
         * mark is waited for (the idle wait has bounds of its own): a time
         * passed would make a wait of 0, a loop that spins, or a negative
         * one, a poll() that blocks until some descriptor is ready. */
        if (c->reply)
                return wait;
        if (c->deadline && !c->interrupted_at && c->deadline - now < wait)
                wait = c->deadline > now ? (long)(c->deadline - now) : 0;
        if (c->slow_at && c->slow_at - now < wait)
                wait = c->slow_at > now ? (long)(c->slow_at - now) : 0;
        return wait;
}

/* Read what iopub holds, at most 256 messages: those of this cell are its
 * outputs. */
static void cell_read_iopub(cell_t *c)
{
        cq_kernel_t *kernel = c->kernel;
        uint64_t dropped = 0;
        cq_jmsg_t msg;
        int k;

        for (k = 0; k < 256; k++) {
                int r = recv_msg(kernel, kernel->iopub, &msg, &dropped);

                if (r == 0)
                        break;
                if (c->reply)
                        c->heard_at = cq_now_ms();
                if (r > 0 && msg.parent_id &&
                    strcmp(msg.parent_id, c->msg_id) == 0)
                        handle_iopub(kernel, &c->col, &msg, c->res, &c->idle,
                                     &c->saw_error, &c->shim_dropped);
                cq_jmsg_release(&msg);
        }
        if (dropped) {
                /* a message above the frame cap (or of too many frames),
                 * read to its end and not kept: whose it was is unknown,
                 * its size is not */
                cq_collect_dropped(&c->col, dropped, false);
                cq_log_warn("kernel: an iopub message with a frame of %llu "
                            "bytes exceeded the cap of %zu; its output was "
                            "dropped",
                            (unsigned long long)dropped, kernel->iopub_max);
        }
}

/* Read what shell holds, at most 256 messages, for this cell's
 * execute_reply; true when it was aborted and is to be sent again. */
static bool cell_read_shell(cell_t *c)
{
        cq_kernel_t *kernel = c->kernel;
        cq_jmsg_t msg;
        int r, k = 0;

        while (k++ < 256 &&
               (r = recv_msg(kernel, kernel->shell, &msg, NULL)) != 0) {
                if (r > 0 && msg.parent_id &&
                    strcmp(msg.parent_id, c->msg_id) == 0 &&
                    strcmp(msg.msg_type, "execute_reply") == 0 && !c->reply) {
                        const char *st = json_string_value(
                            json_object_get(msg.content, "status"));

                        /* ipykernel keeps aborting for a moment after an
                         * error (stop_on_error); our one cell in flight
                         * can only have been caught by that, so send it
                         * again. */
                        if (st && !strcmp(st, "aborted") && c->aborts < 20) {
                                c->aborts++;
                                cq_jmsg_release(&msg);
                                return true;
                        }
                        c->reply_at = cq_now_ms();
                        c->reply = json_incref(msg.content);
                        if (c->res->timing)
                                json_object_set(
                                    c->res->timing, "shell.execute_reply",
                                    json_object_get(msg.header, "date"));
                }
                cq_jmsg_release(&msg);
        }
        return false;
}

/* A waiting state's turn with the kernel: poll it, read what came (iopub
 * first: a reply may not end the cell before the outputs that preceded
 * it were read), and see whether it still lives. */
static cell_state_t cell_poll(cell_t *c, cell_state_t state, int64_t now)
{
        cq_kernel_t *kernel = c->kernel;
        struct pollfd items[4];
        bool pend[2];

        if (poll_kernel(kernel, items, pend, cell_wait_ms(c, now)) != 0) {
                kernel_set_error(kernel, "could not poll: %s", strerror(errno));
                return CELL_KILL;
        }
        if (poll_done(&items[2], kernel->control, false))
                drop_control(kernel);
        if (poll_done(&items[1], kernel->iopub, pend[1]))
                cell_read_iopub(c);
        if (poll_done(&items[0], kernel->shell, pend[0]) &&
            cell_read_shell(c)) {
                struct timespec ts = {0, 5 * 1000 * 1000};

                nanosleep(&ts, NULL);
                if (cell_send(c))
                        return CELL_FAILED;
        }
        if ((items[3].revents & POLLIN) ||
            (kernel->proc.pidfd < 0 && !lproc_alive(&kernel->proc))) {
                lproc_reap(&kernel->proc, true);
                return CELL_DIED;
        }
        /* a dying kernel closes its sockets too */
        if (broken(kernel))
                return lproc_wait_exit(&kernel->proc, 200) ? CELL_DIED
                                                           : CELL_KILL;
        if (!c->reply)
                return state;
        return c->idle ? CELL_DONE : CELL_REPLIED;
}

/* One turn of a waiting state (CELL_RUNNING, CELL_INTERRUPTED or
 * CELL_REPLIED): its clocks, an interrupt asked for from another
 * thread, the slow callback, then the kernel. */
static cell_state_t cell_turn(cell_t *c, cell_state_t state)
{
        int64_t now = cq_now_ms();

        if (state == CELL_RUNNING)
                state = cell_running(c, now);
        else if (state == CELL_INTERRUPTED)
                state = cell_interrupted(c, now);
        else
                state = cell_replied(c, now);
        if (state == CELL_DONE || state == CELL_KILL || state == CELL_ABANDONED)
                return state;
        /* in the sandbox cq_kernel_interrupt() cannot signal the kernel:
         * the thread that owns control sends the request */
        if (atomic_exchange(&c->kernel->interrupt_req, 0) &&
            cq_sandbox_enabled(c->kernel->sandbox))
                send_interrupt(c->kernel);
        if (c->slow_at && state != CELL_REPLIED && now >= c->slow_at) {
                c->slow_at = 0;
                c->opts->on_slow(c->opts->opaque);
                return state; /* the clock moved on */
        }
        return cell_poll(c, state, now);
}

/* What the reply says of the cell: its execution count, an error. */
static void cell_reply_status(cell_t *c)
{
        const char *st = json_string_value(json_object_get(c->reply, "status"));
        json_t *n = json_object_get(c->reply, "execution_count");

        if (json_is_integer(n))
                c->res->execution_count = (int)json_integer_value(n);
        if (st && strcmp(st, "error") == 0) {
                c->res->status = CQ_CELL_ERROR;
                if (!c->saw_error)
                        add_output(&c->col, error_output(c->reply));
        } else if (st && strcmp(st, "aborted") == 0) {
                c->res->status = CQ_CELL_ERROR;
                add_output(
                    &c->col,
                    status_error("Aborted", "the kernel aborted this cell"));
        }
}

/* What the way the cell ended says of it: a timeout, a death, a cancel,
 * a kill; whether the kernel is to be replaced. */
static bool cell_end_status(cell_t *c, cell_state_t state)
{
        cq_cell_result_t *res = c->res;

        if (c->stop == CELL_STOP_TIMEOUT) {
                char text[200];

                res->status = CQ_CELL_TIMEOUT;
                snprintf(text, sizeof(text),
                         "the cell exceeded its %lld ms deadline; the kernel "
                         "was restarted and its state (variables, imports) "
                         "is lost",
                         (long long)c->opts->timeout_ms);
                add_output(&c->col, status_error("TimeoutError", text));
                return true;
        }
        if (state == CELL_DIED) {
                res->status = CQ_CELL_DIED;
                add_output(&c->col,
                           status_error("DeadKernelError",
                                        "the kernel died while running the "
                                        "cell; a fresh kernel was started "
                                        "and its state (variables, imports) "
                                        "is lost"));
                return true;
        }
        if (state == CELL_ABANDONED) {
                res->status = CQ_CELL_CANCELLED;
                res->state_lost = true;
                add_output(&c->col,
                           status_error("Cancelled",
                                        "the cell was abandoned and its "
                                        "kernel killed; its state is lost"));
                return false;
        }
        if (c->stop == CELL_STOP_CANCEL) {
                res->status = CQ_CELL_CANCELLED;
                if (state == CELL_KILL)
                        add_output(&c->col,
                                   status_error("Cancelled",
                                                "the cell was cancelled and "
                                                "did not stop; the kernel "
                                                "was restarted and its "
                                                "state is lost"));
        } else if (state == CELL_KILL && res->status == CQ_CELL_OK) {
                res->status = CQ_CELL_TIMEOUT;
        }
        return state == CELL_KILL;
}

/* The result of a cell that ended in \p state (CELL_DONE, CELL_KILL or
 * CELL_DIED), and a fresh kernel when this one is not to be used again. */
static cq_err_t cell_finish(cell_t *c, cell_state_t state)
{
        cq_cell_result_t *res = c->res;
        cq_err_t err = CQ_OK;
        bool replace;

        if (c->reply)
                cell_reply_status(c);
        replace = cell_end_status(c, state);
        /* the shim reports the rest of what it dropped when the cell
         * ends, which a killed kernel never did */
        if (c->shim_dropped && !c->reply)
                cq_collect_dropped(&c->col, 0, true);
        json_decref(res->outputs);
        res->outputs = cq_collect_finish(&c->col);
        res->truncated = cq_collect_truncated(&c->col);
        if (!res->outputs) {
                kernel_set_error(c->kernel,
                                 "could not run cell: out of memory");
                err = CQ_ERR_RETRIABLE;
        }
        if (replace) {
                res->state_lost = true;
                if (respawn(c->kernel) != CQ_OK)
                        err = CQ_ERR_RETRIABLE;
        } else if (state == CELL_ABANDONED) {
                cq_kernel_kill(c->kernel); /* reaped by its destroy */
        }
        return err;
}

static cq_err_t run_cell(cq_kernel_t *kernel,
                         const char *code,
                         bool silent,
                         const cq_exec_opts_t *opts,
                         cq_cell_result_t *res)
{
        cq_err_t err = CQ_ERR_RETRIABLE;
        cell_state_t state;
        cell_t c;

        memset(&c, 0, sizeof(c));
        c.start_ms = cq_now_ms();
        c.kernel = kernel;
        c.code = code;
        c.silent = silent;
        c.opts = opts;
        c.res = res;
        if (cq_collect_init(&c.col, kernel->output_max,
                            silent ? NULL : opts->on_output,
                            opts->opaque) != 0) {
                kernel_set_error(kernel, "could not run cell: out of memory");
                goto out;
        }
        json_decref(res->timing);
        res->timing = silent ? NULL : json_object();
        atomic_store(&kernel->interrupt_req, 0);
        state = cell_start(&c);
        while (state == CELL_RUNNING || state == CELL_INTERRUPTED ||
               state == CELL_REPLIED)
                state = cell_turn(&c, state);
        if (state != CELL_FAILED)
                err = cell_finish(&c, state);
out:
        res->duration_ms = cq_now_ms() - c.start_ms;
        json_decref(c.reply);
        cq_collect_release(&c.col);
        return err;
}

cq_err_t cq_kernel_execute(cq_kernel_t *kernel,
                           const char *code,
                           const cq_exec_opts_t *opts,
                           cq_cell_result_t *res)
{
        static const cq_exec_opts_t defaults = {0};

        if (kernel->proc.pid <= 0 && respawn(kernel) != CQ_OK)
                return CQ_ERR_RETRIABLE;
        return run_cell(kernel, code, false, opts ? opts : &defaults, res);
}

cq_err_t cq_kernel_restart(cq_kernel_t *kernel) { return respawn(kernel); }

static void kernel_close(cq_kernel_t **kernelp, bool graceful)
{
        cq_kernel_t *kernel = *kernelp;

        if (!kernel)
                return;
        *kernelp = NULL;
        if (graceful && kernel->proc.pid > 0 && kernel->control) {
                json_t *content = json_pack("{s:b}", "restart", 0);

                if (content &&
                    send_request(kernel, kernel->control, "shutdown_request",
                                 content, NULL) == 0)
                        lproc_wait_exit(&kernel->proc, 500);
        }
        /* A process's exit (freeing a Python heap) is CPU spent in its
         * own name: a discarded kernel dies at the lowest priority,
         * behind the work of running jobs. */
        if (!graceful) {
                cq_kernel_kill(kernel); /* once: a no-op when done */
        } else if (kernel->proc.pid > 0 && !kernel->proc.killed) {
                if (kernel->proc.forked)
                        lproc_kill_forked(&kernel->proc, SIGTERM);
                else
                        killpg(kernel->proc.pid, SIGTERM);
                lproc_wait_exit(&kernel->proc, 300);
        }
        kernel_teardown(kernel);
        /* no link followed: the last component with O_NOFOLLOW, those
         * above it the worker's own (cq_work_dir_new()) */
        if (kernel->run_dir[0])
                cq_work_dir_remove(kernel->run_dir);
        if (kernel->run_fd >= 0)
                close(kernel->run_fd);
        /* kernel_teardown() waited for the sandbox's pid 1, which outlives
         * every process in it: nothing runs as the uid any more. */
        cq_sandbox_id_release(&kernel->id);
        json_decref(kernel->env);
        free(kernel->python);
        free(kernel->work_dir);
        free(kernel->preload);
        free(kernel);
}

void cq_kernel_destroy(cq_kernel_t **kernelp) { kernel_close(kernelp, true); }

void cq_kernel_discard(cq_kernel_t **kernelp) { kernel_close(kernelp, false); }
