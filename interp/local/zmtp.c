/* SPDX-License-Identifier: MIT */
/* zmtp.c - the client end of a ZMTP 3.0 connection (RFC 23/ZMTP, NULL
 * mechanism) to a kernel's ROUTER or PUB socket, with bounds that hold
 * whatever the peer sends (see zmtp.h for why not libzmq).
 *
 * The wire: a 64-byte greeting each way (signature FF 00*8 7F, version
 * 3.0, mechanism "NULL", as-server 0); then each side's READY command
 * (Socket-Type, and Identity for a DEALER); then frames of a flags byte
 * (MORE 1, LONG 2, COMMAND 4), a size (one byte, or eight big-endian when
 * LONG) and the body. A SUB subscribes with the data message 0x01 +
 * topic. We send our greeting and READY at once, and messages (the
 * subscription first) only once the peer's READY arrived: libzmq reads a
 * message that arrives before it has sent its own READY as a broken
 * handshake and drops the connection. */
#include "coderq/local/zmtp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "coderq/common/buf.h"

#define GREETING_LEN 64
#define RBUF_SIZE    (64u << 10)
/* what one cq_zmtp_recv() reads at most before it returns, so that a
 * peer sending without end cannot keep the caller from its deadlines */
#define READ_BUDGET (1u << 20)
/* the longest command we keep: READY with a socket type and an identity
 * of at most 255 bytes, and whatever small properties a peer adds */
#define COMMAND_MAX 4096
#define FLAG_MORE   1u
#define FLAG_LONG   2u
#define FLAG_CMD    4u

enum rstate {
        R_GREETING, /* collecting the peer's 64 bytes */
        R_FLAGS,    /* a frame's flags byte */
        R_SIZE,     /* its 1 or 8 size bytes */
        R_BODY,     /* its body */
};

struct cq_zmtp {
        cq_zmtp_type_t type;
        size_t frame_max, total_max;
        int fd;
        bool ready, closed;
        char err[200];

        /* bytes read, not yet parsed: rbuf[rpos, rlen) */
        unsigned char *rbuf;
        size_t rpos, rlen;
        enum rstate rs;
        unsigned char hdr[GREETING_LEN]; /* greeting or size bytes */
        size_t hdr_len, hdr_want;
        unsigned flags; /* of the frame being read */
        uint64_t size;  /* its body's length */
        uint64_t got;   /* of its body, consumed */
        bool keep;      /* its body is kept (not a dropped message's) */

        /* the message being assembled: kept frames' bodies in mbuf */
        unsigned char *mbuf;
        size_t mlen, mcap;
        size_t fstart[CQ_JMSG_MAX_FRAMES], flen[CQ_JMSG_MAX_FRAMES];
        size_t nframes;
        bool dropping; /* past a bound: read to its end, keep nothing */
        uint64_t msg_bytes, msg_frames, msg_max_frame;
        bool delivered; /* the last recv returned it: reset on the next */

        unsigned char cmd[COMMAND_MAX]; /* a command frame's body */

        /* to write: out.data[out_off, out.len); before the peer's READY
         * only up to hs_len, the greeting and our READY */
        cq_buf_t out;
        size_t out_off, hs_len;
};

CQ_PRINTF(2, 3)
static void fail(cq_zmtp_t *z, const char *fmt, ...)
{
        va_list ap;

        if (!z->closed) {
                va_start(ap, fmt);
                vsnprintf(z->err, sizeof(z->err), fmt, ap);
                va_end(ap);
        }
        z->closed = true;
}

/* A frame's header and body into out: MORE when \p more, LONG when the
 * size needs it, COMMAND when \p cmd. */
static cq_err_t
put_frame(cq_buf_t *out, const void *body, size_t len, bool more, bool cmd)
{
        unsigned char h[9];
        size_t hl, i;

        h[0] = (unsigned char)((more ? FLAG_MORE : 0) | (cmd ? FLAG_CMD : 0));
        if (len <= 255) {
                h[1] = (unsigned char)len;
                hl = 2;
        } else {
                h[0] |= FLAG_LONG;
                for (i = 0; i < 8; i++)
                        h[1 + i] =
                            (unsigned char)((uint64_t)len >> (8 * (7 - i)));
                hl = 9;
        }
        if (cq_buf_append(out, h, hl) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        return len ? cq_buf_append(out, body, len) : CQ_OK;
}

/* One READY property: name-size, name, 4-byte value-size, value. */
static cq_err_t put_prop(cq_buf_t *b, const char *name, const char *v, size_t n)
{
        unsigned char l[4] = {(unsigned char)(n >> 24),
                              (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                              (unsigned char)n};
        unsigned char nl = (unsigned char)strlen(name);

        if (cq_buf_append(b, &nl, 1) != CQ_OK ||
            cq_buf_append(b, name, nl) != CQ_OK ||
            cq_buf_append(b, l, 4) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        return n ? cq_buf_append(b, v, n) : CQ_OK;
}

/* Our greeting, READY and, for a SUB, the subscription to everything. */
static cq_err_t put_handshake(cq_zmtp_t *z, const char *identity)
{
        unsigned char g[GREETING_LEN] = {0};
        const char *type = z->type == CQ_ZMTP_DEALER ? "DEALER" : "SUB";
        unsigned char sub = 1;
        cq_buf_t ready;
        cq_err_t err;

        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = 3; /* version 3.0 */
        g[11] = 0;
        memcpy(g + 12, "NULL", 4);
        if (cq_buf_append(&z->out, g, sizeof(g)) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        cq_buf_init(&ready, COMMAND_MAX);
        err = cq_buf_append(&ready, "\x05READY", 6);
        if (err == CQ_OK)
                err = put_prop(&ready, "Socket-Type", type, strlen(type));
        if (err == CQ_OK && identity && *identity)
                err = put_prop(&ready, "Identity", identity, strlen(identity));
        if (err == CQ_OK)
                err = put_frame(&z->out, ready.data, ready.len, false, true);
        cq_buf_release(&ready);
        z->hs_len = z->out.len;
        if (err == CQ_OK && z->type == CQ_ZMTP_SUB)
                err = put_frame(&z->out, &sub, 1, false, false);
        return err;
}

cq_zmtp_t *cq_zmtp_new(cq_zmtp_type_t type,
                       const char *identity,
                       size_t frame_max,
                       size_t send_max)
{
        cq_zmtp_t *z;

        if (identity && strlen(identity) > 255)
                return NULL;
        z = calloc(1, sizeof(*z));
        if (!z)
                return NULL;
        z->type = type;
        z->fd = -1;
        z->frame_max = frame_max;
        z->total_max =
            frame_max > SIZE_MAX / 2 ? SIZE_MAX / 2 : frame_max + (64u << 10);
        z->rs = R_GREETING;
        z->hdr_want = GREETING_LEN;
        z->rbuf = malloc(RBUF_SIZE);
        /* room for the handshake beside the caller's messages */
        cq_buf_init(&z->out, send_max + 1024);
        if (!z->rbuf || put_handshake(z, identity) != CQ_OK) {
                cq_zmtp_destroy(&z);
                return NULL;
        }
        return z;
}

void cq_zmtp_destroy(cq_zmtp_t **zp)
{
        cq_zmtp_t *z = *zp;

        if (!z)
                return;
        if (z->fd >= 0)
                close(z->fd);
        free(z->rbuf);
        free(z->mbuf);
        cq_buf_release(&z->out);
        free(z);
        *zp = NULL;
}

int cq_zmtp_adopt(cq_zmtp_t *z, int fd)
{
        int fl;

        if (z->fd >= 0)
                return -1;
        fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
                fail(z, "could not make the socket non-blocking: %s",
                     strerror(errno));
                close(fd);
                return -1;
        }
        z->fd = fd;
        return cq_zmtp_flush(z) == 0 ? 0 : -1;
}

int cq_zmtp_connect(cq_zmtp_t *z, const char *path)
{
        struct sockaddr_un sa;
        int fd;

        if (z->fd >= 0 || z->closed) {
                fail(z, "already connected");
                return -1;
        }
        memset(&sa, 0, sizeof(sa));
        sa.sun_family = AF_UNIX;
        if (strlen(path) >= sizeof(sa.sun_path)) {
                snprintf(z->err, sizeof(z->err), "socket path too long");
                return -1;
        }
        memcpy(sa.sun_path, path, strlen(path) + 1);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                snprintf(z->err, sizeof(z->err),
                         "could not create a socket: %s", strerror(errno));
                return -1;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 &&
            errno != EINPROGRESS) {
                int e = errno;

                close(fd);
                if (e == ECONNREFUSED || e == EAGAIN || e == ENOENT)
                        return 1;
                snprintf(z->err, sizeof(z->err), "could not connect: %s",
                         strerror(e));
                return -1;
        }
        z->fd = fd;
        return cq_zmtp_flush(z) == 0 ? 0 : -1;
}

static size_t out_limit(const cq_zmtp_t *z);

int cq_zmtp_fd(const cq_zmtp_t *z) { return z->closed ? -1 : z->fd; }

short cq_zmtp_events(const cq_zmtp_t *z)
{
        return (short)(POLLIN | (z->out_off < out_limit(z) ? POLLOUT : 0));
}

bool cq_zmtp_pending(const cq_zmtp_t *z)
{
        return !z->closed && z->rpos < z->rlen;
}

bool cq_zmtp_ready(const cq_zmtp_t *z) { return z->ready && !z->closed; }

bool cq_zmtp_closed(const cq_zmtp_t *z) { return z->closed; }

const char *cq_zmtp_error(const cq_zmtp_t *z) { return z->err; }

/* What may be written now: all of out once the peer is ready. */
static size_t out_limit(const cq_zmtp_t *z)
{
        return z->ready || z->hs_len > z->out.len ? z->out.len : z->hs_len;
}

int cq_zmtp_flush(cq_zmtp_t *z)
{
        if (z->closed)
                return -2;
        while (z->fd >= 0 && z->out_off < out_limit(z)) {
                ssize_t n = send(z->fd, z->out.data + z->out_off,
                                 out_limit(z) - z->out_off,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);

                if (n > 0) {
                        z->out_off += (size_t)n;
                        continue;
                }
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                        return 0;
                fail(z, "could not send: %s",
                     n < 0 ? strerror(errno) : "nothing written");
                return -2;
        }
        if (z->out_off == z->out.len) {
                cq_buf_reset(&z->out);
                z->out_off = z->hs_len = 0;
        }
        return 0;
}

int cq_zmtp_send(cq_zmtp_t *z, const cq_jframe_t *frames, size_t n)
{
        size_t i, need = 0;

        if (z->closed)
                return -1;
        for (i = 0; i < n; i++)
                need += 9 + frames[i].len;
        if (n == 0 || need > cq_buf_room(&z->out)) {
                snprintf(z->err, sizeof(z->err),
                         n ? "the send buffer is full (the kernel does not "
                             "read)"
                           : "an empty message");
                return -1;
        }
        for (i = 0; i < n; i++)
                if (put_frame(&z->out, frames[i].data, frames[i].len, i + 1 < n,
                              false) != CQ_OK)
                        return -1; /* cannot happen: room was checked */
        return cq_zmtp_flush(z) == 0 ? 0 : -1;
}

/* ---- reading ---- */

static bool name_is(const unsigned char *p, size_t n, const char *name)
{
        size_t i;

        if (n != strlen(name))
                return false;
        for (i = 0; i < n; i++) {
                unsigned char a = p[i], b = (unsigned char)name[i];

                if (a >= 'A' && a <= 'Z')
                        a = (unsigned char)(a - 'A' + 'a');
                if (b >= 'A' && b <= 'Z')
                        b = (unsigned char)(b - 'A' + 'a');
                if (a != b)
                        return false;
        }
        return true;
}

/* The peer's greeting: ZMTP 3.x with the NULL mechanism. */
static int check_greeting(cq_zmtp_t *z)
{
        static const unsigned char null_mech[20] = "NULL";
        const unsigned char *g = z->hdr;

        if (g[0] != 0xff || (g[9] & 1) == 0) {
                fail(z, "the peer does not speak ZMTP 3 (bad signature)");
                return -2;
        }
        if (g[10] < 3) {
                fail(z, "the peer speaks ZMTP %u, not 3", g[10]);
                return -2;
        }
        if (memcmp(g + 12, null_mech, sizeof(null_mech)) != 0) {
                fail(z, "the peer asks for a security mechanism other than "
                        "NULL");
                return -2;
        }
        return 0;
}

/* A command from the peer: READY (once, with a socket type ours may talk
 * to), ERROR (the end), PING (answered), anything else ignored. */
static int on_command(cq_zmtp_t *z, const unsigned char *b, size_t n)
{
        size_t nl, off;
        bool typed = false;

        if (n < 1 || (nl = b[0]) + 1 > n) {
                fail(z, "a malformed command from the peer");
                return -2;
        }
        if (name_is(b + 1, nl, "ERROR")) {
                size_t rl = n > nl + 1 ? b[nl + 1] : 0;

                if (rl > n - nl - 2)
                        rl = n - nl - 2;
                fail(z, "the peer refused the connection: %.*s", (int)rl,
                     (const char *)b + nl + 2);
                return -2;
        }
        if (name_is(b + 1, nl, "PING")) {
                /* ZMTP 3.1: PONG with the ping's context (after its TTL) */
                unsigned char pong[5 + 16] = {4, 'P', 'O', 'N', 'G'};
                size_t cl = n > nl + 3 ? n - nl - 3 : 0;

                if (cl > 16)
                        cl = 16;
                memcpy(pong + 5, b + nl + 3, cl);
                if (put_frame(&z->out, pong, 5 + cl, false, true) != CQ_OK) {
                        fail(z, "no room to answer the peer's ping");
                        return -2;
                }
                return 0;
        }
        if (!name_is(b + 1, nl, "READY"))
                return 0;
        if (z->ready) {
                fail(z, "a second READY from the peer");
                return -2;
        }
        off = 1 + nl;
        while (off < n) {
                size_t pl = b[off], vl;
                const unsigned char *pn = b + off + 1, *v;

                if (off + 1 + pl + 4 > n) {
                        fail(z, "a malformed READY from the peer");
                        return -2;
                }
                vl = (size_t)b[off + 1 + pl] << 24 |
                     (size_t)b[off + 2 + pl] << 16 |
                     (size_t)b[off + 3 + pl] << 8 | (size_t)b[off + 4 + pl];
                v = b + off + 5 + pl;
                if (vl > n - (off + 5 + pl)) {
                        fail(z, "a malformed READY from the peer");
                        return -2;
                }
                if (name_is(pn, pl, "Socket-Type")) {
                        bool ok = z->type == CQ_ZMTP_DEALER
                                      ? name_is(v, vl, "ROUTER")
                                      : name_is(v, vl, "PUB") ||
                                            name_is(v, vl, "XPUB");

                        if (!ok) {
                                fail(z,
                                     "the peer is a %.*s socket, not one a "
                                     "%s talks to",
                                     (int)(vl > 16 ? 16 : vl), (const char *)v,
                                     z->type == CQ_ZMTP_DEALER ? "DEALER"
                                                               : "SUB");
                                return -2;
                        }
                        typed = true;
                }
                off += 5 + pl + vl;
        }
        if (!typed) {
                fail(z, "the peer's READY names no socket type");
                return -2;
        }
        z->ready = true;
        return 0;
}

static void reset_message(cq_zmtp_t *z)
{
        z->mlen = 0;
        z->nframes = 0;
        z->dropping = false;
        z->msg_bytes = z->msg_frames = z->msg_max_frame = 0;
        z->delivered = false;
}

/* A data frame of z->size bytes begins: keep it, or drop the message. */
static int begin_data(cq_zmtp_t *z)
{
        if (!z->ready) {
                fail(z, "a message from the peer before its READY");
                return -2;
        }
        z->msg_frames++;
        if (z->size > z->msg_max_frame)
                z->msg_max_frame = z->size;
        z->msg_bytes = z->msg_bytes + z->size < z->msg_bytes
                           ? UINT64_MAX
                           : z->msg_bytes + z->size;
        if (!z->dropping &&
            (z->nframes == CQ_JMSG_MAX_FRAMES || z->size > z->frame_max ||
             z->msg_bytes > z->total_max))
                z->dropping = true;
        z->keep = !z->dropping;
        if (z->keep && z->mlen + z->size > z->mcap) {
                size_t cap = z->mcap ? z->mcap : 4096;
                unsigned char *p;

                while (cap < z->mlen + z->size)
                        cap *= 2;
                p = realloc(z->mbuf, cap);
                if (!p) {
                        z->dropping = true;
                        z->keep = false;
                } else {
                        z->mbuf = p;
                        z->mcap = cap;
                }
        }
        if (z->keep) {
                z->fstart[z->nframes] = z->mlen;
                z->flen[z->nframes] = (size_t)z->size;
        }
        return 0;
}

/* The frame just read ended. 1: a whole message; -1: a dropped one; 0:
 * go on; -2: the end. */
static int end_frame(cq_zmtp_t *z, cq_zmtp_msg_t *msg)
{
        size_t i;

        if (z->flags & FLAG_CMD)
                return on_command(z, z->cmd, (size_t)z->size);
        if (z->keep)
                z->nframes++;
        if (z->flags & FLAG_MORE)
                return 0;
        z->delivered = true;
        if (z->dropping) {
                msg->nframes = 0;
                msg->dropped_bytes = z->msg_bytes;
                msg->dropped_frames = z->msg_frames;
                msg->dropped_max_frame = z->msg_max_frame;
                return -1;
        }
        for (i = 0; i < z->nframes; i++) {
                /* empty frames only: no buffer yet, and none needed */
                msg->frames[i].data =
                    z->mbuf ? (const void *)(z->mbuf + z->fstart[i]) : "";
                msg->frames[i].len = z->flen[i];
        }
        msg->nframes = z->nframes;
        msg->dropped_bytes = msg->dropped_frames = 0;
        msg->dropped_max_frame = 0;
        return 1;
}

/* The size of a frame was read: its body follows. */
static int begin_body(cq_zmtp_t *z)
{
        size_t i;

        z->size = 0;
        for (i = 0; i < z->hdr_len; i++)
                z->size = z->size << 8 | z->hdr[i];
        z->got = 0;
        z->rs = R_BODY;
        if (!(z->flags & FLAG_CMD))
                return begin_data(z);
        if (z->size > COMMAND_MAX) {
                fail(z, "a command of %llu bytes from the peer",
                     (unsigned long long)z->size);
                return -2;
        }
        if (z->nframes || z->msg_frames) {
                fail(z, "a command inside a message");
                return -2;
        }
        z->keep = false;
        return 0;
}

/* Parse what rbuf holds; stops after a whole message. */
static int parse(cq_zmtp_t *z, cq_zmtp_msg_t *msg)
{
        for (;;) {
                const unsigned char *p = z->rbuf + z->rpos;
                size_t avail = z->rlen - z->rpos, take;
                int r;

                if (z->rs == R_BODY) {
                        /* an empty body ends at once, with nothing read */
                        take = z->size - z->got < avail
                                   ? (size_t)(z->size - z->got)
                                   : avail;
                        /* (an empty frame may come before any buffer) */
                        if (take > 0 && (z->flags & FLAG_CMD))
                                memcpy(z->cmd + z->got, p, take);
                        else if (take > 0 && z->keep)
                                memcpy(z->mbuf + z->mlen, p, take);
                        if (!(z->flags & FLAG_CMD) && z->keep)
                                z->mlen += take;
                        z->got += take;
                        z->rpos += take;
                        if (z->got < z->size)
                                return 0; /* all of rbuf was taken */
                        z->rs = R_FLAGS;
                        r = end_frame(z, msg);
                        if (r != 0)
                                return r;
                        continue;
                }
                if (avail == 0)
                        return 0;
                if (z->rs == R_FLAGS) {
                        z->flags = *p;
                        z->rpos++;
                        if (z->flags & ~(FLAG_MORE | FLAG_LONG | FLAG_CMD)) {
                                fail(z, "a frame with unknown flags 0x%02x",
                                     z->flags);
                                return -2;
                        }
                        if ((z->flags & FLAG_CMD) && (z->flags & FLAG_MORE)) {
                                fail(z, "a command frame flagged MORE");
                                return -2;
                        }
                        z->hdr_len = 0;
                        z->hdr_want = z->flags & FLAG_LONG ? 8 : 1;
                        z->rs = R_SIZE;
                        continue;
                }
                /* R_GREETING or R_SIZE: collect hdr_want bytes */
                take = z->hdr_want - z->hdr_len;
                if (take > avail)
                        take = avail;
                memcpy(z->hdr + z->hdr_len, p, take);
                z->hdr_len += take;
                z->rpos += take;
                if (z->hdr_len < z->hdr_want)
                        return 0;
                if (z->rs == R_GREETING) {
                        if (check_greeting(z))
                                return -2;
                        z->rs = R_FLAGS;
                        continue;
                }
                if ((r = begin_body(z)) != 0)
                        return r;
        }
}

int cq_zmtp_recv(cq_zmtp_t *z, cq_zmtp_msg_t *msg)
{
        size_t budget = READ_BUDGET;

        msg->nframes = 0;
        msg->dropped_bytes = msg->dropped_frames = msg->dropped_max_frame = 0;
        if (z->closed)
                return -2;
        if (z->delivered)
                reset_message(z);
        if (cq_zmtp_flush(z) != 0)
                return -2;
        for (;;) {
                ssize_t n;
                int r = parse(z, msg);

                if (r != 0) {
                        /* a PONG queued by the parse goes out now */
                        if (r != -2 && cq_zmtp_flush(z) != 0)
                                return -2;
                        return r;
                }
                if (z->out_off < out_limit(z) && cq_zmtp_flush(z) != 0)
                        return -2;
                z->rpos = z->rlen = 0;
                if (z->fd < 0 || budget == 0)
                        return 0;
                n = recv(z->fd, z->rbuf,
                         budget < RBUF_SIZE ? budget : RBUF_SIZE, MSG_DONTWAIT);
                if (n > 0) {
                        z->rlen = (size_t)n;
                        budget -= (size_t)n;
                        continue;
                }
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                        return 0;
                if (n == 0)
                        fail(z, "the kernel closed the connection");
                else
                        fail(z, "could not read: %s", strerror(errno));
                return -2;
        }
}
