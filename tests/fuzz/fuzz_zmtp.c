/* SPDX-License-Identifier: MIT */
/* fuzz_zmtp.c - libFuzzer target: bytes a kernel sends on one connection
 * into the ZMTP client (zmtp.c), through a socketpair. The first byte
 * picks the socket type and whether a good greeting and READY come first.
 * Whatever arrives, a message it returns is within its bounds, and a
 * stream that ends is said to have ended. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coderq/local/zmtp.h"

#define FRAME_MAX 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t handshake[] = {
    0xff, 0,   0,    0,   0,   0,   0,   0,   1,   0x7f, 3,   1,   'N', 'U',
    'L',  'L', 0,    0,   0,   0,   0,   0,   0,   0,    0,   0,   0,   0,
    0,    0,   0,    0,   0,   0,   0,   0,   0,   0,    0,   0,   0,   0,
    0,    0,   0,    0,   0,   0,   0,   0,   0,   0,    0,   0,   0,   0,
    0,    0,   0,    0,   0,   0,   0,   0,   4,   0x1c, 5,   'R', 'E', 'A',
    'D',  'Y', 0x0b, 'S', 'o', 'c', 'k', 'e', 't', '-',  'T', 'y', 'p', 'e',
    0,    0,   0,    6,   'R', 'O', 'U', 'T', 'E', 'R',
};

static int feed(int fd, const void *p, size_t n)
{
        const uint8_t *c = p;

        while (n > 0) {
                ssize_t w = write(fd, c, n);

                if (w <= 0)
                        return -1;
                c += w;
                n -= (size_t)w;
        }
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_zmtp_msg_t m;
        cq_zmtp_t *z;
        int sv[2], r = 0, k;
        size_t i;

        if (size == 0 || size > 60000)
                return 0;
        z = cq_zmtp_new((data[0] & 1) ? CQ_ZMTP_SUB : CQ_ZMTP_DEALER, "f",
                        FRAME_MAX, 256);
        if (!z)
                abort();
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
                abort();
        if (cq_zmtp_adopt(z, sv[0]) != 0)
                abort();
        /* a SUB talks to a PUB: the ROUTER's READY is refused there */
        if (((data[0] & 2) && feed(sv[1], handshake, sizeof(handshake))) ||
            feed(sv[1], data + 1, size - 1))
                abort();
        close(sv[1]);
        for (k = 0; k < 100000; k++) {
                r = cq_zmtp_recv(z, &m);
                if (r == 1) {
                        if (m.nframes > CQ_JMSG_MAX_FRAMES)
                                abort();
                        for (i = 0; i < m.nframes; i++)
                                if (m.frames[i].len > FRAME_MAX)
                                        abort();
                }
                if (r == 0 || r == -2)
                        break;
        }
        /* the peer closed: every byte was read, so the end shows */
        if (r != -2 || !cq_zmtp_closed(z))
                abort();
        cq_zmtp_destroy(&z);
        return 0;
}
