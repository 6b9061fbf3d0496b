/* SPDX-License-Identifier: MIT */
/* fuzz_jmsg.c - libFuzzer target: a Jupyter multipart message into
 * cq_jmsg_parse(). The input's frames are separated by the byte 0x1e.
 * When its first byte is odd, the frames after it are the four dicts and
 * any buffers, and the target adds an identity, the delimiter and a valid
 * HMAC with a fixed key, so the JSON parsing behind the signature check is
 * reached; when even, the frames go in as they are (delimiter search,
 * frame counts and signature checks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/local/jmsg.h"

#define SEP     0x1e
#define KEY     "fbc1e1a2-35c4e9b8d7f6a5b4c3d2e1f0"
#define MAXF    (CQ_JMSG_MAX_FRAMES + 4)
#define MAX_LEN ((size_t)1 << 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Split \p data at SEP into at most \p max frames. */
static size_t
split(const uint8_t *data, size_t size, cq_jframe_t *frames, size_t max)
{
        size_t n = 0, start = 0, i;

        for (i = 0; i <= size && n < max; i++) {
                if (i == size || data[i] == SEP) {
                        frames[n].data = data + start;
                        frames[n].len = i - start;
                        n++;
                        start = i + 1;
                }
        }
        return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        cq_jframe_t in[MAXF], frames[MAXF + 3];
        char sig[CQ_JMSG_SIG_LEN + 1];
        cq_jmsg_stats_t stats = {0};
        cq_jmsg_t msg;
        char errstr[256];
        size_t n, nframes = 0, i;

        if (size < 1)
                return 0;
        n = split(data + 1, size - 1, in, MAXF);
        if (data[0] & 1) {
                if (n < 4)
                        return 0;
                if (cq_jmsg_sign(KEY, strlen(KEY), in, sig) != 0)
                        abort();
                frames[nframes++] = (cq_jframe_t){"kernel.abc.iopub", 16};
                frames[nframes++] =
                    (cq_jframe_t){CQ_JMSG_DELIM, strlen(CQ_JMSG_DELIM)};
                frames[nframes++] = (cq_jframe_t){sig, strlen(sig)};
        }
        for (i = 0; i < n; i++)
                frames[nframes++] = in[i];
        cq_jmsg_init(&msg);
        if (cq_jmsg_parse(KEY, strlen(KEY), frames, nframes, MAX_LEN, &msg,
                          &stats, errstr,
                          sizeof(errstr)) == CQ_JMSG_DROP_NONE) {
                if (!msg.msg_type || !msg.msg_id || !json_is_object(msg.header))
                        abort();
                cq_jmsg_release(&msg);
        }
        return 0;
}
