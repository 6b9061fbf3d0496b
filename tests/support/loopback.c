/* SPDX-License-Identifier: MIT */
/* loopback.c - see loopback.h. */
#include "support/loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"

int cq_loopback_listen(const char *ip, int *portp)
{
        struct sockaddr_in sin;
        socklen_t slen = sizeof(sin);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(fd, 0);
        memset(&sin, 0, sizeof(sin));
        sin.sin_family = AF_INET;
        ck_assert_int_eq(inet_pton(AF_INET, ip, &sin.sin_addr), 1);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
        ck_assert_int_eq(listen(fd, 16), 0);
        ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &slen), 0);
        *portp = ntohs(sin.sin_port);
        return fd;
}

int cq_loopback_dead_port(void)
{
        struct sockaddr_in sa;
        socklen_t len = sizeof(sa);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        int port;

        ck_assert_int_ge(fd, 0);
        memset(&sa, 0, sizeof(sa));
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
        port = ntohs(sa.sin_port);
        close(fd);
        return port;
}

int cq_loopback_accept(int fd, int poll_ms, char *req, size_t size)
{
        struct pollfd pfd = {fd, POLLIN, 0};
        size_t len = 0;
        int c;

        req[0] = '\0';
        if (poll(&pfd, 1, poll_ms) <= 0)
                return -1;
        c = accept(fd, NULL, NULL);
        if (c < 0)
                return -1;
        while (len + 1 < size) {
                ssize_t n = read(c, req + len, size - 1 - len);

                if (n <= 0)
                        break;
                len += (size_t)n;
                req[len] = '\0';
                if (strstr(req, "\r\n\r\n"))
                        break;
        }
        return c;
}

void *cq_loopback_raise_later(void *flag)
{
        struct timespec ts = {0, 300 * 1000000L};

        nanosleep(&ts, NULL);
        atomic_store((atomic_int *)flag, 1);
        return NULL;
}
