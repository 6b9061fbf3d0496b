/* SPDX-License-Identifier: MIT */
/* fake_llm.c - fork/exec /usr/bin/python3 tests/fakes/fake_llm.py, read
 * the "PORT n" line it prints once it listens, and talk to its /_fake
 * endpoints with libcurl. */
#include "support/fake_llm.h"

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

#define START_TIMEOUT_MS 15000
#define STOP_TIMEOUT_MS  3000

struct cq_fake_llm {
        pid_t pid;
        int port;
        char base_url[96];
        char root[64];
};

static int read_port(int fd, int *portp)
{
        char line[128];
        size_t len = 0;
        int64_t deadline = cq_now_ms() + START_TIMEOUT_MS;

        while (len + 1 < sizeof(line)) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                int64_t left = deadline - cq_now_ms();
                ssize_t n;
                char *nl;

                if (left <= 0)
                        return -1;
                if (poll(&pfd, 1, (int)left) <= 0)
                        continue;
                n = read(fd, line + len, sizeof(line) - 1 - len);
                if (n <= 0)
                        return -1;
                len += (size_t)n;
                line[len] = '\0';
                nl = strchr(line, '\n');
                if (nl) {
                        long port;
                        char *end;

                        *nl = '\0';
                        if (strncmp(line, "PORT ", 5) != 0)
                                return -1;
                        port = strtol(line + 5, &end, 10);
                        if (*end || port <= 0 || port > 65535)
                                return -1;
                        *portp = (int)port;
                        return 0;
                }
        }
        return -1;
}

cq_fake_llm_t *cq_fake_llm_start(const char *const *extra_args)
{
        cq_fake_llm_t *fake = calloc(1, sizeof(*fake));
        char script[4096], scripts[4096];
        const char *argv[64];
        size_t argc = 0;
        int fds[2] = {-1, -1};
        pid_t parent = getpid();

        if (!fake)
                return NULL;
        snprintf(script, sizeof(script), "%s",
                 cq_check_srcpath("tests/fakes/fake_llm.py"));
        snprintf(scripts, sizeof(scripts), "%s",
                 cq_check_srcpath("tests/data/llm/scripts"));
        argv[argc++] = "/usr/bin/python3";
        argv[argc++] = script;
        argv[argc++] = "--port";
        argv[argc++] = "0";
        argv[argc++] = "--scripts";
        argv[argc++] = scripts;
        while (extra_args && *extra_args && argc + 1 < CQ_ARRAY_SIZE(argv))
                argv[argc++] = *extra_args++;
        argv[argc] = NULL;
        if (pipe2(fds, O_CLOEXEC) != 0)
                goto fail;
        fake->pid = fork();
        if (fake->pid < 0)
                goto fail;
        if (fake->pid == 0) {
                /* Never outlive the runner: a suite that dies in a fixture
                 * would otherwise leave the fake holding CTest's output
                 * pipe, and CTest waits for that pipe until its timeout. */
                if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 ||
                    getppid() != parent)
                        _exit(127);
                /* dup2 clears O_CLOEXEC on the copy. */
                if (dup2(fds[1], STDOUT_FILENO) < 0)
                        _exit(127);
                /* execv() never writes to argv; its prototype predates
                 * const. */
                execv(argv[0], (char *const *)(uintptr_t)argv);
                _exit(127);
        }
        close(fds[1]);
        fds[1] = -1;
        if (read_port(fds[0], &fake->port) != 0) {
                fprintf(stderr, "fake_llm: no PORT line from %s\n", script);
                goto fail;
        }
        close(fds[0]);
        snprintf(fake->root, sizeof(fake->root), "http://127.0.0.1:%d",
                 fake->port);
        snprintf(fake->base_url, sizeof(fake->base_url), "%s/v1", fake->root);
        return fake;
fail:
        if (fds[0] >= 0)
                close(fds[0]);
        if (fds[1] >= 0)
                close(fds[1]);
        cq_fake_llm_stop(&fake);
        return NULL;
}

void cq_fake_llm_stop(cq_fake_llm_t **fakep)
{
        cq_fake_llm_t *fake = *fakep;
        int64_t deadline;

        if (!fake)
                return;
        if (fake->pid > 0) {
                kill(fake->pid, SIGTERM);
                deadline = cq_now_ms() + STOP_TIMEOUT_MS;
                for (;;) {
                        pid_t r = waitpid(fake->pid, NULL, WNOHANG);

                        if (r == fake->pid || (r < 0 && errno != EINTR))
                                break;
                        if (cq_now_ms() > deadline) {
                                kill(fake->pid, SIGKILL);
                                waitpid(fake->pid, NULL, 0);
                                break;
                        }
                        usleep(10000);
                }
        }
        free(fake);
        *fakep = NULL;
}

const char *cq_fake_llm_base_url(const cq_fake_llm_t *fake)
{
        return fake->base_url;
}

int cq_fake_llm_port(const cq_fake_llm_t *fake) { return fake->port; }

pid_t cq_fake_llm_pid(const cq_fake_llm_t *fake) { return fake->pid; }

static size_t collect(char *p, size_t size, size_t n, void *opaque)
{
        cq_buf_t *buf = opaque;

        return cq_buf_append(buf, p, size * n) == CQ_OK ? size * n : 0;
}

/* One request to the fake's control API; returns the parsed reply. */
static json_t *call(cq_fake_llm_t *fake,
                    const char *method,
                    const char *path,
                    const char *body)
{
        CURL *curl = curl_easy_init();
        struct curl_slist *headers = NULL;
        cq_buf_t buf;
        char url[256];
        long status = 0;
        json_t *reply = NULL;

        cq_buf_init(&buf, (size_t)256 * 1024 * 1024);
        if (!curl)
                goto out;
        snprintf(url, sizeof(url), "%s%s", fake->root, path);
        headers = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buf);
        if (body)
                curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        if (curl_easy_perform(curl) != CURLE_OK)
                goto out;
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200 || !buf.data)
                goto out;
        reply = json_loadb(buf.data, buf.len, 0, NULL);
out:
        curl_slist_free_all(headers);
        if (curl)
                curl_easy_cleanup(curl);
        cq_buf_release(&buf);
        return reply;
}

json_t *cq_fake_llm_requests(cq_fake_llm_t *fake)
{
        return call(fake, "GET", "/_fake/requests", NULL);
}

int cq_fake_llm_count_steps(
    cq_fake_llm_t *fake, const char *prefix, int njobs, int nsteps, int *counts)
{
        json_t *reqs = cq_fake_llm_requests(fake), *req;
        char tag[160];
        size_t i;

        if (!reqs)
                return -1;
        memset(counts, 0, sizeof(*counts) * (size_t)njobs * (size_t)nsteps);
        snprintf(tag, sizeof(tag), "Job %s-", prefix);
        json_array_foreach(reqs, i, req)
        {
                char *body = json_dumps(json_object_get(req, "body"), 0);
                const char *at = body ? strstr(body, tag) : NULL;
                json_int_t step =
                    json_integer_value(json_object_get(req, "step"));
                int job;

                if (at && sscanf(at + strlen(tag), "%3d:", &job) == 1 &&
                    job >= 0 && job < njobs && step >= 0 && step < nsteps &&
                    json_integer_value(json_object_get(req, "status")) == 200)
                        counts[job * nsteps + step]++;
                free(body);
        }
        json_decref(reqs);
        return 0;
}

int cq_fake_llm_reset(cq_fake_llm_t *fake)
{
        json_t *reply = call(fake, "POST", "/_fake/reset", "{}");
        int rc = reply ? 0 : -1;

        json_decref(reply);
        return rc;
}

int cq_fake_llm_add_script(cq_fake_llm_t *fake,
                           const char *name,
                           const json_t *script)
{
        json_t *req = json_pack("{s:s, s:o}", "name", name, "script",
                                json_deep_copy(script));
        char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
        json_t *reply =
            text ? call(fake, "POST", "/_fake/scripts", text) : NULL;
        int rc = reply ? 0 : -1;

        json_decref(reply);
        free(text);
        json_decref(req);
        return rc;
}
