/* SPDX-License-Identifier: MIT */
/* fake_e2b.c - runs tests/fakes/fake_e2b.py as a child process for check
 * runners; see fake_e2b.h. */
#include "support/fake_e2b.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/buf.h"
#include "coderq/common/util.h"

#define FAKE_KEY "e2b_0123456789abcdef0123456789abcdef01234567"

/* Read "API <port>\nSANDBOX <port>\n" from \p fd within \p ms. */
static int read_ports(cq_fake_e2b_t *fake, int fd, int ms)
{
        char text[256];
        size_t len = 0;
        int64_t deadline = cq_now_ms() + ms;

        while (len + 1 < sizeof(text)) {
                struct pollfd pfd = {fd, POLLIN, 0};
                int64_t left = deadline - cq_now_ms();
                ssize_t n;

                text[len] = '\0';
                if (sscanf(text, "API %d\nSANDBOX %d\n", &fake->api_port,
                           &fake->sandbox_port) == 2 &&
                    strchr(strstr(text, "SANDBOX"), '\n'))
                        return 0;
                if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
                        return -1;
                n = read(fd, text + len, sizeof(text) - 1 - len);
                if (n <= 0)
                        return -1;
                len += (size_t)n;
        }
        return -1;
}

int cq_fake_e2b_start(cq_fake_e2b_t *fake, double keepalive_s)
{
        const char *script = cq_check_srcpath("tests/fakes/fake_e2b.py");
        char ka[32];
        int fds[2];
        pid_t pid;

        memset(fake, 0, sizeof(*fake));
        fake->out_fd = -1;
        snprintf(ka, sizeof(ka), "%g", keepalive_s > 0 ? keepalive_s : 5.0);
        snprintf(fake->api_key, sizeof(fake->api_key), "%s", FAKE_KEY);
        if (pipe2(fds, O_CLOEXEC) != 0)
                return -1;
        pid = fork();
        if (pid < 0) {
                close(fds[0]);
                close(fds[1]);
                return -1;
        }
        if (pid == 0) {
                /* never outlive the runner, even when it crashes */
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                dup2(fds[1], 1);
                execl("/usr/bin/python3", "python3", script, "--api-key",
                      FAKE_KEY, "--keepalive-s", ka, (char *)NULL);
                _exit(127);
        }
        close(fds[1]);
        fake->pid = pid;
        fake->out_fd = fds[0];
        if (read_ports(fake, fds[0], 30000) != 0) {
                fprintf(stderr, "fake_e2b: %s did not report its ports\n",
                        script);
                cq_fake_e2b_stop(fake);
                return -1;
        }
        snprintf(fake->api_url, sizeof(fake->api_url), "http://127.0.0.1:%d",
                 fake->api_port);
        snprintf(fake->sandbox_url, sizeof(fake->sandbox_url),
                 "http://127.0.0.1:%d", fake->sandbox_port);
        return 0;
}

void cq_fake_e2b_stop(cq_fake_e2b_t *fake)
{
        int status, i;

        if (fake->pid > 0) {
                kill(fake->pid, SIGTERM);
                /* it shuts its kernels down first: allow a while */
                for (i = 0; i < 300; i++) {
                        struct timespec ts = {0, 100000000L};

                        if (waitpid(fake->pid, &status, WNOHANG) == fake->pid)
                                break;
                        nanosleep(&ts, NULL);
                }
                if (i == 300) {
                        kill(fake->pid, SIGKILL);
                        waitpid(fake->pid, &status, 0);
                }
                fake->pid = 0;
        }
        if (fake->out_fd >= 0)
                close(fake->out_fd);
        fake->out_fd = -1;
}

void cq_fake_e2b_opts(const cq_fake_e2b_t *fake, cq_e2b_opts_t *opts)
{
        memset(opts, 0, sizeof(*opts));
        opts->api_key = fake->api_key;
        opts->api_url = fake->api_url;
        opts->sandbox_url = fake->sandbox_url;
        opts->ttl_s = 60;
        opts->max_attempts = 4;
        opts->retry_base_ms = 20;
        opts->retry_max_ms = 300;
        opts->request_timeout_ms = 60000;
}

cq_interp_t *
cq_fake_e2b_interp(const cq_fake_e2b_t *fake, char *errstr, size_t size)
{
        cq_e2b_opts_t opts;

        cq_fake_e2b_opts(fake, &opts);
        return cq_e2b_new(&opts, errstr, size);
}

static size_t collect(char *ptr, size_t size, size_t nmemb, void *ud)
{
        size_t n = size * nmemb;

        return cq_buf_append(ud, ptr, n) == CQ_OK ? n : 0;
}

static long request(const cq_fake_e2b_t *fake,
                    const char *path,
                    const char *body,
                    cq_buf_t *reply)
{
        CURL *curl = curl_easy_init();
        struct curl_slist *headers = NULL;
        char url[256], key[128];
        long status = -1;

        if (!curl)
                return -1;
        snprintf(url, sizeof(url), "%s%s", fake->api_url, path);
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 30000L);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, reply);
        snprintf(key, sizeof(key), "X-API-KEY: %s", fake->api_key);
        headers = curl_slist_append(NULL, key);
        if (headers)
                headers = curl_slist_append(headers,
                                            "Content-Type: application/json");
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        if (body)
                curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        if (curl_easy_perform(curl) == CURLE_OK)
                curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(curl);
        curl_slist_free_all(headers);
        return status;
}

json_t *cq_fake_e2b_get(const cq_fake_e2b_t *fake, const char *path)
{
        cq_buf_t reply;
        json_t *doc = NULL;

        cq_buf_init(&reply, 16u << 20);
        if (request(fake, path, NULL, &reply) == 200 && reply.data)
                doc = json_loadb(reply.data, reply.len, 0, NULL);
        cq_buf_release(&reply);
        return doc;
}

long cq_fake_e2b_post(const cq_fake_e2b_t *fake,
                      const char *path,
                      const char *body)
{
        cq_buf_t reply;
        long status;

        cq_buf_init(&reply, 1u << 20);
        status = request(fake, path, body ? body : "", &reply);
        cq_buf_release(&reply);
        return status;
}

long cq_fake_e2b_stat(const cq_fake_e2b_t *fake, const char *name)
{
        json_t *stats = cq_fake_e2b_get(fake, "/_fake/stats");
        long v = -1;

        if (json_is_integer(json_object_get(stats, name)))
                v = (long)json_integer_value(json_object_get(stats, name));
        json_decref(stats);
        return v;
}
