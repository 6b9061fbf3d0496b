/* SPDX-License-Identifier: MIT */
/* jmsg.h - Jupyter wire messages (protocol 5.3): build and sign outgoing
 * messages, authenticate and parse incoming multipart frames. Pure: no
 * sockets here (kernel.c moves the frames), so every path is testable with
 * plain byte arrays.
 *
 * Frames: [ident...] "<IDS|MSG>" hmac header parent_header metadata content
 * [buffer...]. The HMAC-SHA256 covers the four dict frames as sent; its key
 * is the UTF-8 bytes of the connection file's key string. */
#ifndef CODERQ_JMSG_H
#define CODERQ_JMSG_H

#include <jansson.h>

#include "coderq/common/common.h"

#define CQ_JMSG_DELIM      "<IDS|MSG>"
#define CQ_JMSG_SIG_LEN    64 /* lower-case hex of HMAC-SHA256 */
#define CQ_JMSG_VERSION    "5.3"
#define CQ_JMSG_MAX_FRAMES 32 /* idents + 6 + buffers we accept at most */

/** @brief One received frame. Borrowed bytes. */
typedef struct cq_jframe {
        const void *data;
        size_t len;
} cq_jframe_t;

/** @brief Why a message was dropped; see cq_jmsg_parse(). */
typedef enum cq_jmsg_drop {
        CQ_JMSG_DROP_NONE = 0,
        CQ_JMSG_DROP_MALFORMED, /* no delimiter, too few frames, bad JSON */
        CQ_JMSG_DROP_OVERSIZE,  /* a frame above the cap */
        CQ_JMSG_DROP_SIGNATURE, /* missing, wrong length or wrong HMAC */
} cq_jmsg_drop_t;

/** @brief Counters of dropped messages; plain integers, one owner thread. */
typedef struct cq_jmsg_stats {
        uint64_t received; /* accepted messages */
        uint64_t malformed;
        uint64_t oversize;
        uint64_t bad_signature;
} cq_jmsg_stats_t;

/** @brief A parsed message. Release with cq_jmsg_release(). */
typedef struct cq_jmsg {
        json_t *header, *parent_header, *metadata, *content; /* owned */
        const char *msg_type;  /* borrowed from header; never NULL */
        const char *msg_id;    /* borrowed from header; never NULL */
        const char *parent_id; /* borrowed from parent_header; may be NULL */
} cq_jmsg_t;

void cq_jmsg_init(cq_jmsg_t *msg);
void cq_jmsg_release(cq_jmsg_t *msg);

/**
 * @brief HMAC-SHA256 of the four dict frames, as lower-case hex.
 * @param key Borrowed; UTF-8 bytes of the key string (may be empty: then
 *            \p hex is "" as Jupyter's unsigned mode sends).
 * @returns 0, or -1 when libcrypto failed.
 * @locality Any thread.
 */
CQ_NODISCARD int cq_jmsg_sign(const char *key,
                              size_t keylen,
                              const cq_jframe_t dicts[4],
                              char hex[CQ_JMSG_SIG_LEN + 1]);

/** @brief An outgoing message: the frames after the delimiter. */
typedef struct cq_jmsg_out {
        char sig[CQ_JMSG_SIG_LEN + 1];
        char *frames[4]; /* header, parent, metadata, content; owned */
        size_t lens[4];
        char msg_id[64];
} cq_jmsg_out_t;

/**
 * @brief Build and sign a message.
 * @param session  Borrowed; the client's session id.
 * @param seq      Makes msg_id unique within the session.
 * @param content  Takes ownership, even on failure.
 * @param parent   Borrowed header of the message replied to, or NULL.
 * @param out      (out) Release with cq_jmsg_out_release(), error or not.
 * @returns 0, or -1 when out of memory.
 * @locality Any thread.
 */
CQ_NODISCARD int cq_jmsg_build(const char *key,
                               size_t keylen,
                               const char *session,
                               uint64_t seq,
                               const char *msg_type,
                               json_t **contentp,
                               const json_t *parent,
                               cq_jmsg_out_t *out);

void cq_jmsg_out_release(cq_jmsg_out_t *out);

/**
 * @brief Authenticate and parse one received multipart message.
 *
 * Order: find "<IDS|MSG>" (any number of identity or topic frames before
 * it), require four dict frames, cap every frame at \p max_frame bytes,
 * check the signature length and then the HMAC in constant time, and only
 * then parse JSON (JSON_ALLOW_NUL; invalid UTF-8 is replaced by U+FFFD and
 * parsed again). Each dict must be an object; header needs string msg_id
 * and msg_type.
 * @param frames  Borrowed.
 * @param msg     (out) Filled on CQ_JMSG_DROP_NONE, else left empty.
 * @param stats   Optional; the matching counter is incremented.
 * @returns CQ_JMSG_DROP_NONE, or why the message was dropped; \p errstr
 *          (optional) says more.
 * @locality Any thread.
 */
cq_jmsg_drop_t cq_jmsg_parse(const char *key,
                             size_t keylen,
                             const cq_jframe_t *frames,
                             size_t nframes,
                             size_t max_frame,
                             cq_jmsg_t *msg,
                             cq_jmsg_stats_t *stats,
                             char *errstr,
                             size_t errstr_size);

/**
 * @brief Parse one JSON frame of a kernel message: JSON_ALLOW_NUL, and on
 *        invalid UTF-8 repair to U+FFFD then parse again.
 * @returns New reference, or NULL on invalid JSON.
 */
json_t *cq_jmsg_loads(const void *data, size_t len);

#endif
