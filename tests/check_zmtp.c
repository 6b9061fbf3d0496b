/* SPDX-License-Identifier: MIT */
/* check_zmtp.c - the ZMTP 3.0 client (zmtp.c): a DEALER and a SUB
 * talking to libzmq itself (pyzmq's ROUTER and XPUB, the sockets
 * ipykernel binds); and against a raw peer on a socketpair, the bounds
 * (frames, bytes, a message without end), every protocol error, PING,
 * nothing sent before the peer's READY, the send buffer's cap, and random
 * bytes. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/local/zmtp.h"

extern char **environ;

/* Up to \p ms for a message (or a drop, or the end) on \p z. */
static int pump(cq_zmtp_t *z, cq_zmtp_msg_t *msg, int ms)
{
        int waited = 0;

        for (;;) {
                struct pollfd p = {cq_zmtp_fd(z), cq_zmtp_events(z), 0};
                int r = cq_zmtp_recv(z, msg);

                if (r != 0)
                        return r;
                if (waited >= ms)
                        return 0;
                if (!cq_zmtp_pending(z))
                        (void)poll(&p, 1, 10);
                waited += 10;
        }
}

static bool frame_is(const cq_zmtp_msg_t *m, size_t i, const char *s)
{
        return i < m->nframes && m->frames[i].len == strlen(s) &&
               memcmp(m->frames[i].data, s, strlen(s)) == 0;
}

/* What libzmq itself answers: a ROUTER echoing what our DEALER sends
 * (with the routing id it saw last), and an XPUB that publishes once our
 * subscription arrived. */
static const char peer_py[] =
    "import sys, zmq\n"
    "d = sys.argv[1]\n"
    "ctx = zmq.Context()\n"
    "r = ctx.socket(zmq.ROUTER); r.bind('ipc://' + d + '/r')\n"
    "p = ctx.socket(zmq.XPUB); p.bind('ipc://' + d + '/p')\n"
    "open(d + '/up', 'w').close()\n"
    "ident, *frames = r.recv_multipart()\n"
    "r.send_multipart([ident, b'echo'] + frames + [ident])\n"
    "sub = p.recv()\n"
    "p.send_multipart([b'topic', b'x' * 300, sub])\n"
    "r.recv_multipart()\n";

START_TEST(talks_to_libzmq)
{
        char dir[] = "/tmp/cq-zmtp-XXXXXX", path[128], big[300];
        char py[] = "/usr/bin/python3", dash_c[] = "-c";
        char *argv[] = {py, dash_c, NULL, dir, NULL};
        cq_jframe_t out[2];
        cq_zmtp_msg_t m;
        cq_zmtp_t *dealer, *sub;
        struct stat st;
        pid_t pid;
        int i, status;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        if (access("/usr/bin/python3", X_OK) != 0 ||
            system("/usr/bin/python3 -c 'import zmq' 2>/dev/null") != 0) {
                rmdir(dir);
                CQ_CHECK_SKIP("pyzmq", "no /usr/bin/python3 with zmq");
        }
        argv[2] = strdup(peer_py);
        ck_assert_ptr_nonnull(argv[2]);
        ck_assert_int_eq(posix_spawn(&pid, argv[0], NULL, NULL, argv, environ),
                         0);
        free(argv[2]);
        snprintf(path, sizeof(path), "%s/up", dir);
        for (i = 0; i < 3000 && stat(path, &st) != 0; i++)
                usleep(10000);
        ck_assert_int_eq(stat(path, &st), 0);

        dealer = cq_zmtp_new(CQ_ZMTP_DEALER, "id-123", 1 << 16, 1 << 16);
        ck_assert_ptr_nonnull(dealer);
        snprintf(path, sizeof(path), "%s/r", dir);
        ck_assert_int_eq(cq_zmtp_connect(dealer, path), 0);
        memset(big, 'b', sizeof(big));
        out[0].data = "hello";
        out[0].len = 5;
        out[1].data = big;
        out[1].len = sizeof(big); /* a long frame */
        ck_assert_int_eq(cq_zmtp_send(dealer, out, 2), 0);
        ck_assert_int_eq(pump(dealer, &m, 20000), 1);
        ck_assert(cq_zmtp_ready(dealer));
        ck_assert_uint_eq(m.nframes, 4);
        ck_assert(frame_is(&m, 0, "echo"));
        ck_assert(frame_is(&m, 1, "hello"));
        ck_assert_uint_eq(m.frames[2].len, sizeof(big));
        ck_assert(memcmp(m.frames[2].data, big, sizeof(big)) == 0);
        /* our READY's Identity is the routing id the ROUTER saw */
        ck_assert(frame_is(&m, 3, "id-123"));

        sub = cq_zmtp_new(CQ_ZMTP_SUB, NULL, 1 << 16, 1024);
        ck_assert_ptr_nonnull(sub);
        snprintf(path, sizeof(path), "%s/p", dir);
        ck_assert_int_eq(cq_zmtp_connect(sub, path), 0);
        ck_assert_int_eq(pump(sub, &m, 20000), 1);
        ck_assert_uint_eq(m.nframes, 3);
        ck_assert(frame_is(&m, 0, "topic"));
        ck_assert_uint_eq(m.frames[1].len, 300);
        /* the subscription to everything, as libzmq received it */
        ck_assert(frame_is(&m, 2, "\x01"));

        out[0].data = "bye";
        out[0].len = 3;
        ck_assert_int_eq(cq_zmtp_send(dealer, out, 1), 0);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        /* the peer is gone: the end, said once and then always */
        ck_assert_int_eq(pump(dealer, &m, 5000), -2);
        ck_assert(cq_zmtp_closed(dealer));
        ck_assert_int_eq(cq_zmtp_recv(dealer, &m), -2);
        ck_assert_int_eq(cq_zmtp_fd(dealer), -1);
        cq_zmtp_destroy(&dealer);
        cq_zmtp_destroy(&sub);
        ck_assert_ptr_null(dealer);
        snprintf(path, sizeof(path), "rm -rf '%s'", dir);
        ck_assert_int_eq(system(path), 0);
}
END_TEST

/* ---- a raw peer ---- */

static void put(int fd, const void *p, size_t n)
{
        const char *c = p;

        while (n > 0) {
                ssize_t w = write(fd, c, n);

                ck_assert_int_gt(w, 0);
                c += w;
                n -= (size_t)w;
        }
}

/* Up to \p max bytes that \p fd holds within \p ms. */
static size_t take(int fd, unsigned char *buf, size_t max, int ms)
{
        size_t n = 0;

        while (n < max) {
                struct pollfd p = {fd, POLLIN, 0};
                ssize_t r;

                if (poll(&p, 1, ms) <= 0)
                        break;
                r = read(fd, buf + n, max - n);
                if (r <= 0)
                        break;
                n += (size_t)r;
                ms = 50;
        }
        return n;
}

static const unsigned char greeting[64] = {0xff, 0, 0, 0,   0,   0,   0,  0, 1,
                                           0x7f, 3, 1, 'N', 'U', 'L', 'L'};

/* The peer's READY of \p type, as a command frame into \p out. */
static size_t ready_frame(unsigned char *out, const char *type)
{
        size_t tl = strlen(type), n = 0;

        out[n++] = 4;
        out[n++] = (unsigned char)(6 + 1 + 11 + 4 + tl);
        memcpy(out + n, "\x05READY\x0bSocket-Type\0\0\0", 21);
        n += 21;
        out[n++] = (unsigned char)tl;
        memcpy(out + n, type, tl);
        return n + tl;
}

/* A DEALER on one end of a socketpair whose other end (*peer) sent its
 * greeting and a ROUTER's READY, and whose handshake was read. */
static cq_zmtp_t *ready_pair(int *peer, size_t frame_max)
{
        unsigned char buf[512];
        cq_zmtp_msg_t m;
        cq_zmtp_t *z = cq_zmtp_new(CQ_ZMTP_DEALER, "me", frame_max, 4096);
        int sv[2];

        ck_assert_ptr_nonnull(z);
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
                         0);
        ck_assert_int_eq(cq_zmtp_adopt(z, sv[0]), 0);
        put(sv[1], greeting, sizeof(greeting));
        put(sv[1], buf, ready_frame(buf, "ROUTER"));
        ck_assert_int_eq(pump(z, &m, 2000), 0);
        ck_assert(cq_zmtp_ready(z));
        ck_assert_uint_gt(take(sv[1], buf, sizeof(buf), 200), 64);
        *peer = sv[1];
        return z;
}

START_TEST(nothing_is_sent_before_the_peer_is_ready)
{
        unsigned char buf[1024];
        cq_jframe_t f = {"early", 5};
        cq_zmtp_msg_t m;
        cq_zmtp_t *z = cq_zmtp_new(CQ_ZMTP_DEALER, "me", 1000, 4096);
        size_t n, i;
        int sv[2];

        ck_assert_ptr_nonnull(z);
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
                         0);
        ck_assert_int_eq(cq_zmtp_adopt(z, sv[0]), 0);
        ck_assert_int_eq(cq_zmtp_send(z, &f, 1), 0);
        n = take(sv[1], buf, sizeof(buf), 200);
        /* the greeting: signature, 3.0, NULL, as-client */
        ck_assert_uint_ge(n, 64);
        ck_assert_int_eq(buf[0], 0xff);
        ck_assert_int_eq(buf[9], 0x7f);
        ck_assert_int_eq(buf[10], 3);
        ck_assert(memcmp(buf + 12, "NULL\0", 5) == 0);
        ck_assert_int_eq(buf[32], 0);
        /* READY with our type and identity, and nothing after it */
        ck_assert_int_eq(buf[64], 4);
        ck_assert_uint_eq(n, 66u + buf[65]);
        ck_assert(memmem(buf + 66, buf[65], "DEALER", 6) != NULL);
        ck_assert(memmem(buf + 66, buf[65], "\x08Identity\0\0\0\x02me", 15) !=
                  NULL);
        ck_assert(!cq_zmtp_ready(z));
        put(sv[1], greeting, sizeof(greeting));
        put(sv[1], buf, ready_frame(buf, "ROUTER"));
        ck_assert_int_eq(pump(z, &m, 2000), 0);
        ck_assert(cq_zmtp_ready(z));
        /* now the message went: one short frame, no MORE */
        n = take(sv[1], buf, sizeof(buf), 500);
        ck_assert_uint_eq(n, 7);
        ck_assert_int_eq(buf[0], 0);
        ck_assert_int_eq(buf[1], 5);
        ck_assert(memcmp(buf + 2, "early", 5) == 0);
        /* the send buffer holds what the peer does not read, and no
         * more: before READY nothing is written at all */
        cq_zmtp_destroy(&z);
        close(sv[1]);
        z = cq_zmtp_new(CQ_ZMTP_DEALER, NULL, 1000, 1000);
        ck_assert_ptr_nonnull(z);
        memset(buf, 'x', sizeof(buf));
        f.data = buf;
        f.len = 900;
        for (i = 0; i < 3 && cq_zmtp_send(z, &f, 1) == 0; i++)
                ;
        ck_assert_uint_eq(i, 3 - 1);
        ck_assert_ptr_nonnull(strstr(cq_zmtp_error(z), "send buffer is full"));
        cq_zmtp_destroy(&z);
}
END_TEST

/* Messages past the bounds are read to their end and dropped, with their
 * size; those around them arrive whole; bytes may come one at a time. */
START_TEST(bounds_drop_a_message_and_keep_the_next)
{
        unsigned char buf[4096];
        cq_zmtp_msg_t m;
        int peer, i;
        cq_zmtp_t *z = ready_pair(&peer, 1000);
        size_t n = 0;

        /* 40 frames: more than a Jupyter message has */
        for (i = 0; i < 40; i++) {
                buf[n++] = 1;
                buf[n++] = 1;
                buf[n++] = 'f';
        }
        buf[n++] = 0;
        buf[n++] = 0;
        put(peer, buf, n);
        ck_assert_int_eq(pump(z, &m, 2000), -1);
        ck_assert_uint_eq(m.dropped_frames, 41);
        ck_assert_uint_eq(m.dropped_bytes, 40);
        ck_assert_uint_eq(m.dropped_max_frame, 1);
        /* a long frame above the frame cap */
        n = 0;
        buf[n++] = 2;
        memcpy(buf + n, "\0\0\0\0\0\0\x03\xe9", 8); /* 1001 */
        n += 8;
        memset(buf + n, 'y', 1001);
        n += 1001;
        put(peer, buf, n);
        ck_assert_int_eq(pump(z, &m, 2000), -1);
        ck_assert_uint_eq(m.dropped_max_frame, 1001);
        ck_assert_uint_eq(m.dropped_frames, 1);
        /* then a good one of three frames, the second long, byte by
         * byte */
        n = 0;
        buf[n++] = 1;
        buf[n++] = 2;
        buf[n++] = 'a';
        buf[n++] = 'b';
        buf[n++] = 3;
        memcpy(buf + n, "\0\0\0\0\0\0\x01\x2c", 8); /* 300 */
        n += 8;
        memset(buf + n, 'z', 300);
        n += 300;
        buf[n++] = 0;
        buf[n++] = 0;
        for (i = 0; i < (int)n; i++) {
                put(peer, buf + i, 1);
                if (i + 1 < (int)n)
                        ck_assert_int_eq(pump(z, &m, 0), 0);
        }
        ck_assert_int_eq(pump(z, &m, 2000), 1);
        ck_assert_uint_eq(m.nframes, 3);
        ck_assert(frame_is(&m, 0, "ab"));
        ck_assert_uint_eq(m.frames[1].len, 300);
        ck_assert_uint_eq(m.frames[2].len, 0);
        /* two messages in one read: both, in order */
        put(peer,
            "\0\x01"
            "1\0\x01"
            "2",
            6);
        ck_assert_int_eq(pump(z, &m, 2000), 1);
        ck_assert(frame_is(&m, 0, "1"));
        ck_assert(cq_zmtp_pending(z));
        ck_assert_int_eq(pump(z, &m, 2000), 1);
        ck_assert(frame_is(&m, 0, "2"));
        close(peer);
        cq_zmtp_destroy(&z);
}
END_TEST

static long rss_kb(void)
{
        char *s = cq_check_slurp("/proc/self/status", NULL);
        char *p = s ? strstr(s, "VmRSS:") : NULL;
        long kb = p ? strtol(p + 6, NULL, 10) : -1;

        free(s);
        return kb;
}

/* A message that never ends (every frame flagged MORE): what libzmq
 * queues without limit. Here each recv() returns after its read budget,
 * nothing is kept, memory stays flat, and the message's end is counted. */
START_TEST(a_message_without_end_stays_bounded)
{
        static unsigned char chunk[1 << 16];
        const size_t chunks = 512; /* 32 MiB: 16 Mi empty frames */
        cq_zmtp_msg_t m;
        long before, after;
        int peer, r, calls = 0;
        cq_zmtp_t *z = ready_pair(&peer, 1 << 20);
        pid_t pid;
        size_t i;

        for (i = 0; i < sizeof(chunk); i += 2) {
                chunk[i] = 1;
                chunk[i + 1] = 0;
        }
        before = rss_kb();
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                for (i = 0; i < chunks; i++)
                        if (write(peer, chunk, sizeof(chunk)) !=
                            (ssize_t)sizeof(chunk))
                                _exit(1);
                _exit(write(peer, "\0\0", 2) == 2 ? 0 : 1);
        }
        do {
                r = pump(z, &m, 30000);
                calls++;
        } while (r == 0 && calls < 100000);
        ck_assert_int_eq(r, -1);
        ck_assert_uint_eq(m.dropped_frames, chunks * sizeof(chunk) / 2 + 1);
        ck_assert_uint_eq(m.dropped_bytes, 0);
        after = rss_kb();
        ck_assert_int_eq(waitpid(pid, &r, 0), pid);
        ck_assert(WIFEXITED(r) && WEXITSTATUS(r) == 0);
        ck_assert_msg(after - before < 4096, "RSS grew by %ld kB",
                      after - before);
        close(peer);
        cq_zmtp_destroy(&z);
}
END_TEST

/* What the peer sends that no ZMTP 3.0 ROUTER sends ends the connection,
 * with the reason. */
static const struct {
        const char *name;
        const char *bytes; /* after a good greeting, or in its place */
        size_t len;
        bool own_greeting;
        const char *why;
} broken[] = {
    {"signature", "\x7f\0\0\0\0\0\0\0\0\x7f\x03\0NULL", 16, true,
     "bad signature"},
    {"version 2", "\xff\0\0\0\0\0\0\0\x01\x7f\x02\0NULL", 16, true, "ZMTP 2"},
    {"mechanism", "\xff\0\0\0\0\0\0\0\x01\x7f\x03\0PLAIN", 17, true,
     "mechanism"},
    {"data first", "\0\x02hi", 4, false, "before its READY"},
    {"flags", "\x08\x01x", 3, false, "unknown flags"},
    {"command MORE", "\x05\x01x", 3, false, "flagged MORE"},
    {"long command", "\x06\0\0\0\0\0\0\x13\x88", 9, false, "command of"},
    {"no type", "\x04\x06\x05READY", 8, false, "no socket type"},
    {"wrong type", "\x04\x19\x05READY\x0bSocket-Type\0\0\0\x03PUB", 27, false,
     "PUB socket"},
    {"bad property", "\x04\x0a\x05READY\x0bSock", 12, false, "malformed"},
    {"error",
     "\x04\x0c\x05"
     "ERROR\x05"
     "nope!",
     14, false, "refused"},
    {"empty command", "\x04\x00", 2, false, "malformed command"},
};

START_TEST(protocol_errors_end_the_connection)
{
        unsigned char buf[600];
        cq_zmtp_msg_t m;
        cq_zmtp_t *z = cq_zmtp_new(CQ_ZMTP_DEALER, "me", 1000, 4096);
        int sv[2], r;

        ck_assert_ptr_nonnull(z);
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
                         0);
        ck_assert_int_eq(cq_zmtp_adopt(z, sv[0]), 0);
        memset(buf, 0, 64);
        if (broken[_i].own_greeting) {
                memcpy(buf, broken[_i].bytes, broken[_i].len);
                put(sv[1], buf, 64);
        } else {
                put(sv[1], greeting, sizeof(greeting));
                put(sv[1], broken[_i].bytes, broken[_i].len);
        }
        r = pump(z, &m, 2000);
        ck_assert_msg(r == -2, "%s: %d", broken[_i].name, r);
        ck_assert(cq_zmtp_closed(z));
        ck_assert_msg(strstr(cq_zmtp_error(z), broken[_i].why) != NULL,
                      "%s: %s", broken[_i].name, cq_zmtp_error(z));
        ck_assert_int_eq(cq_zmtp_fd(z), -1);
        ck_assert_int_eq(cq_zmtp_send(z, &(cq_jframe_t){"x", 1}, 1), -1);
        cq_zmtp_destroy(&z);
        close(sv[1]);
}
END_TEST

START_TEST(ping_is_answered_with_pong)
{
        unsigned char buf[64];
        cq_zmtp_msg_t m;
        int peer;
        cq_zmtp_t *z = ready_pair(&peer, 1000);
        size_t n;

        /* a second READY is a protocol error; a PING gets its context */
        put(peer,
            "\x04\x0a\x04PING\x00\x10"
            "abc",
            12);
        ck_assert_int_eq(pump(z, &m, 500), 0);
        n = take(peer, buf, sizeof(buf), 500);
        ck_assert_uint_eq(n, 10);
        ck_assert(memcmp(buf, "\x04\x08\x04PONGabc", 10) == 0);
        ck_assert(!cq_zmtp_closed(z));
        put(peer, buf, ready_frame(buf, "ROUTER"));
        ck_assert_int_eq(pump(z, &m, 500), -2);
        ck_assert_ptr_nonnull(strstr(cq_zmtp_error(z), "second READY"));
        close(peer);
        cq_zmtp_destroy(&z);
}
END_TEST

/* Random bytes after a handshake (and in place of one) never crash it,
 * and whatever it returns is within the bounds. */
START_TEST(random_bytes_never_break_the_bounds)
{
        unsigned char buf[2048];
        unsigned seed = 12345;
        int round;

        for (round = 0; round < 3000; round++) {
                cq_zmtp_msg_t m;
                cq_zmtp_t *z = cq_zmtp_new(
                    round % 2 ? CQ_ZMTP_SUB : CQ_ZMTP_DEALER, "r", 64, 256);
                size_t n = (size_t)(rand_r(&seed) % sizeof(buf)), i;
                int sv[2], r, k;

                ck_assert_ptr_nonnull(z);
                ck_assert_int_eq(
                    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
                ck_assert_int_eq(cq_zmtp_adopt(z, sv[0]), 0);
                for (i = 0; i < n; i++)
                        buf[i] = (unsigned char)rand_r(&seed);
                if (round % 3) {
                        size_t l;

                        put(sv[1], greeting, sizeof(greeting));
                        l = ready_frame(buf + 1024,
                                        round % 2 ? "XPUB" : "ROUTER");
                        put(sv[1], buf + 1024, l);
                        /* mostly small frames, so messages complete */
                        for (i = 0; i < n && round % 3 == 2; i++)
                                if (i % 5 == 0)
                                        buf[i] &= 3;
                }
                put(sv[1], buf, n);
                if (round % 4 == 0)
                        close(sv[1]);
                for (k = 0; k < 200; k++) {
                        r = cq_zmtp_recv(z, &m);
                        if (r == 1) {
                                ck_assert_uint_le(m.nframes,
                                                  CQ_JMSG_MAX_FRAMES);
                                for (i = 0; i < m.nframes; i++)
                                        ck_assert_uint_le(m.frames[i].len, 64);
                        }
                        if (r == 0 || r == -2)
                                break;
                }
                cq_zmtp_destroy(&z);
                if (round % 4 != 0)
                        close(sv[1]);
        }
}
END_TEST

static Suite *zmtp_suite(void)
{
        Suite *s = suite_create("zmtp");
        TCase *tc = tcase_create("zmtp");

        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, talks_to_libzmq);
        tcase_add_test(tc, nothing_is_sent_before_the_peer_is_ready);
        tcase_add_test(tc, bounds_drop_a_message_and_keep_the_next);
        tcase_add_test(tc, a_message_without_end_stays_bounded);
        tcase_add_loop_test(tc, protocol_errors_end_the_connection, 0,
                            (int)CQ_ARRAY_SIZE(broken));
        tcase_add_test(tc, ping_is_answered_with_pong);
        tcase_add_test(tc, random_bytes_never_break_the_bounds);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(zmtp_suite)
