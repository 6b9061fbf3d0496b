/* SPDX-License-Identifier: MIT */
/* zmtp.h - the client end of one ZeroMQ connection to a kernel's socket:
 * ZMTP 3.0 (RFC 23) with the NULL mechanism, as a DEALER or a SUB, over a
 * unix stream socket, with bounds that hold whatever the peer sends.
 *
 * Why not libzmq: libzmq's receive high-water mark counts whole messages
 * and ZMQ_MAXMSGSIZE bounds one frame, so the frames of a message that
 * never ends (a "more" flag on every frame) pile up in its queue without
 * limit, read by its I/O thread whether we read or not: a kernel could
 * grow the worker's memory by gigabytes. Here bytes are read only when
 * the caller asks for a message, into a fixed buffer; a message is kept
 * up to a frame count and a byte count and dropped (read and counted,
 * not kept) beyond them; a peer that sends faster than we read waits on
 * its own socket. No thread, no context.
 *
 * Not thread-safe: one owner thread per connection. */
#ifndef CODERQ_ZMTP_H
#define CODERQ_ZMTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coderq/common/common.h"
#include "coderq/local/jmsg.h"

/** @brief The socket type this end speaks as. */
typedef enum cq_zmtp_type {
        CQ_ZMTP_DEALER, /* to a ROUTER (shell, control) */
        CQ_ZMTP_SUB,    /* to a PUB or XPUB (iopub); subscribes to all */
} cq_zmtp_type_t;

/** @brief One connection. Opaque. */
typedef struct cq_zmtp cq_zmtp_t;

/** @brief One received message: frames borrowed from the connection,
 *         valid until its next cq_zmtp_recv() or cq_zmtp_destroy(). */
typedef struct cq_zmtp_msg {
        cq_jframe_t frames[CQ_JMSG_MAX_FRAMES];
        size_t nframes;
        /* a message dropped (cq_zmtp_recv() returned -1) for its frames
         * or bytes: its bytes and frames as sent, and its largest frame */
        uint64_t dropped_bytes;
        uint64_t dropped_frames;
        uint64_t dropped_max_frame;
} cq_zmtp_msg_t;

/**
 * @brief A connection of \p type that will send \p identity (NULL or "":
 *        none; at most 255 bytes) as its routing id, keeping messages of
 *        at most CQ_JMSG_MAX_FRAMES frames, each of at most \p frame_max
 *        bytes and all of them together at most \p frame_max + 64 KiB. Sends
 * are buffered up to \p send_max bytes. Not connected: see cq_zmtp_connect().
 * @returns Caller owns; cq_zmtp_destroy(). NULL when out of memory or
 *          \p identity is too long.
 */
cq_zmtp_t *cq_zmtp_new(cq_zmtp_type_t type,
                       const char *identity,
                       size_t frame_max,
                       size_t send_max);

/** @brief Close the connection and free \p *zp; sets it NULL. */
void cq_zmtp_destroy(cq_zmtp_t **zp);

/**
 * @brief Connect to the unix socket at \p path (e.g. "/proc/self/fd/N"
 *        of an O_PATH descriptor of the socket file), without blocking.
 *        The greeting is sent at once; the handshake completes in later
 *        calls.
 * @returns 0 when connected; 1 when the peer is not listening yet
 *          (ECONNREFUSED, EAGAIN: try again later); -1 on another error
 *          (cq_zmtp_error()).
 */
int cq_zmtp_connect(cq_zmtp_t *z, const char *path);

/**
 * @brief Take \p fd, a connected stream socket, as the connection (for
 *        tests: one end of a socketpair). It is made non-blocking and
 *        closed by cq_zmtp_destroy(). The greeting is queued.
 * @returns 0, or -1 when \p z already has one.
 */
int cq_zmtp_adopt(cq_zmtp_t *z, int fd);

/** @brief The descriptor to poll (-1: not connected) and the events to
 *         poll it for: POLLIN, and POLLOUT while sends wait. */
int cq_zmtp_fd(const cq_zmtp_t *z);
short cq_zmtp_events(const cq_zmtp_t *z);

/**
 * @brief Whether a message may be had without waiting on the descriptor:
 *        bytes already read hold at least the next frame's header, so
 *        poll() would not say so. Call before a poll to pick its timeout.
 */
bool cq_zmtp_pending(const cq_zmtp_t *z);

/**
 * @brief The next message, reading what the socket holds without
 *        blocking (and writing what waits to be sent).
 * @returns 1 with \p msg filled; 0 when no whole message has arrived; -1
 *          when one was dropped for the bounds (\p msg's dropped_*
 *          filled; call again for the next); -2 when the connection ended
 *          or broke the protocol (cq_zmtp_error(); every later call
 *          returns -2).
 */
int cq_zmtp_recv(cq_zmtp_t *z, cq_zmtp_msg_t *msg);

/**
 * @brief Queue a message of \p n frames (n >= 1) and write what the
 *        socket takes now; the rest goes with later calls (poll for
 *        cq_zmtp_events()). Before the handshake completes, it waits
 *        queued.
 * @returns 0; -1 when it does not fit the send buffer or the connection
 *          is gone (cq_zmtp_error()).
 */
int cq_zmtp_send(cq_zmtp_t *z, const cq_jframe_t *frames, size_t n);

/** @brief Write what waits to be sent, without blocking. 0, or -2 as
 *         cq_zmtp_recv(). */
int cq_zmtp_flush(cq_zmtp_t *z);

/** @brief Whether the handshake completed (the peer's READY arrived). */
bool cq_zmtp_ready(const cq_zmtp_t *z);

/** @brief Whether the connection ended or broke the protocol. */
bool cq_zmtp_closed(const cq_zmtp_t *z);

/** @brief Why the last call failed, or "". */
const char *cq_zmtp_error(const cq_zmtp_t *z);

#endif
