/* SPDX-License-Identifier: MIT */
/* e2b_exec.c - cells over the /execute stream: the stream read with a
 * bounded line, outputs through the collector (collect.c), deadlines,
 * cancel and interrupt, recovery after a broken stream, and the
 * environment probe in the sandbox's default context. */
#include "coderq/e2b/e2b.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coderq/common/buf.h"
#include "coderq/interp/collect.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "e2b_int.h"

enum outcome {
        OUT_END = 0,  /* end_of_execution seen */
        OUT_DEADLINE, /* client deadline */
        OUT_CANCEL,   /* cancel flag */
        OUT_INTERRUPT,
        OUT_TRUNCATED, /* the stream ended without end_of_execution */
        OUT_PROTOCOL,  /* malformed or over-long line */
        OUT_HTTP,      /* a non-200 status */
        OUT_NETWORK,   /* connection failed or reset */
};

struct exec {
        cq_e2b_t *e2b;
        const cq_exec_opts_t *opts;
        int64_t deadline_ms;
        int64_t *slow_at; /* when to call opts->on_slow; 0: done (or never) */
        cq_buf_t line;
        cq_buf_t errbody; /* non-200 reply */
        long status;
        bool end_seen;
        enum outcome outcome; /* set by the hooks when they stop it */
        char why[512];
        int execution_count;
        cq_collect_t col; /* outputs: head, tail, bytes dropped */
        bool col_ok;
        uint64_t skipped; /* bytes of the line over max_line being skipped */
        bool skipping;
        bool skipped_error;   /* that line is an "error" line */
        json_t *error;        /* the last error output */
        json_t *results;      /* execute_result outputs waiting for the count */
        bool default_context; /* run in the sandbox's default context */
};

static int exec_line(struct exec *x)
{
        cq_e2b_line_t line;
        char err[256];

        if (x->line.len == 0 || x->end_seen)
                return 0;
        if (cq_e2b_parse_line(x->line.data, x->line.len, &line, err,
                              sizeof(err)) != CQ_OK) {
                snprintf(x->why, sizeof(x->why),
                         "malformed line in the E2B /execute stream: %s", err);
                x->outcome = OUT_PROTOCOL;
                return -1;
        }
        switch (line.kind) {
        case CQ_E2B_LINE_COUNT:
                x->execution_count = line.execution_count;
                break;
        case CQ_E2B_LINE_END:
                x->end_seen = true;
                break;
        case CQ_E2B_LINE_IGNORED:
                break;
        case CQ_E2B_LINE_OUTPUT: {
                const char *t = json_string_value(
                    json_object_get(line.output, "output_type"));

                if (strcmp(t, "execute_result") == 0 && x->execution_count >= 0)
                        json_object_set_new(line.output, "execution_count",
                                            json_integer(x->execution_count));
                if (strcmp(t, "error") == 0) {
                        /* the last error wins; the caller reports it */
                        json_decref(x->error);
                        x->error = line.output;
                        return 0;
                }
                cq_collect_add(&x->col, &line.output);
                break;
        }
        }
        return 0;
}

static json_t *error_output(const char *ename, const char *evalue);

/* The end of a line that was over max_line: count it, and keep a trace of
 * an error line so the cell still fails. */
static void skip_done(struct exec *x)
{
        cq_log_warn("e2b: skipped a line of %llu bytes in the /execute "
                    "stream (over %zu)",
                    (unsigned long long)x->skipped, x->e2b->max_line);
        cq_collect_dropped(&x->col, x->skipped, false);
        if (x->skipped_error) {
                char evalue[256];

                snprintf(evalue, sizeof(evalue),
                         "the cell raised an exception whose report (%llu "
                         "bytes) exceeded the output cap and was dropped",
                         (unsigned long long)x->skipped);
                json_decref(x->error);
                x->error = error_output("OutputTooLarge", evalue);
        }
        x->skipping = x->skipped_error = false;
        x->skipped = 0;
}

/* The HTTP client's sink: the stream, line by line. */
static int exec_write(void *ud, long status, const char *ptr, size_t n)
{
        struct exec *x = ud;
        size_t off = 0;

        if (x->status == 0)
                x->status = status;
        if (x->status != 200) {
                size_t room = cq_buf_room(&x->errbody);
                cq_err_t kept =
                    cq_buf_append(&x->errbody, ptr, n < room ? n : room);

                /* only the start of an error body is kept for messages
                 * (out of memory, less of it): the rest is read and
                 * dropped */
                (void)kept;
                return 0;
        }
        while (off < n) {
                const char *nl = memchr(ptr + off, '\n', n - off);
                size_t seg = nl ? (size_t)(nl - (ptr + off)) : n - off;

                /* A line over max_line (the output cap plus slack) holds an
                 * output that could not be kept whole: stop buffering it,
                 * count its bytes as dropped and go on with the cell. */
                if (!x->skipping &&
                    cq_buf_append(&x->line, ptr + off, seg) != CQ_OK) {
                        size_t head = x->line.len < 64 ? x->line.len : 64;

                        /* the server writes "type" first */
                        x->skipping = true;
                        x->skipped_error =
                            head &&
                            memmem(x->line.data, head, "\"error\"", 7) != NULL;
                        x->skipped = x->line.len;
                        cq_buf_reset(&x->line);
                }
                if (x->skipping)
                        x->skipped += seg;
                off += seg;
                if (!nl)
                        break;
                off++;
                if (x->skipping) {
                        skip_done(x);
                        continue;
                }
                if (exec_line(x) != 0)
                        return -1;
                cq_buf_reset(&x->line);
        }
        return 0;
}

/* A cell without a deadline (or a longer one than the TTL) must not
 * outlive its sandbox: extend on the side handle once two thirds of the
 * TTL have passed. One attempt; the next progress tick tries again. */
static void extend_during_cell(cq_e2b_t *e2b)
{
        int64_t now = cq_now_ms(), left;
        char buf[512];
        long status = 0;

        if (now < e2b->next_extend_try_ms)
                return;
        pthread_mutex_lock(&e2b->lock);
        left = e2b->expires_ms - now;
        if (left < (int64_t)e2b->ttl_s * 1000 / 3 && e2b->aux) {
                e2b->next_extend_try_ms = now + 1000;
                if (e2b_set_timeout_on(e2b, e2b->aux, e2b->ttl_s, &status, buf,
                                       sizeof(buf), 1) != CQ_OK)
                        cq_log_warn("e2b: %s", buf);
        }
        pthread_mutex_unlock(&e2b->lock);
}

/* The HTTP client's tick, while the stream runs (the client itself
 * watches the cancel flag and the deadline). */
static int exec_tick(void *ud)
{
        struct exec *x = ud;

        if (atomic_exchange(&x->e2b->interrupt, 0)) {
                x->outcome = OUT_INTERRUPT;
                return 1;
        }
        if (x->slow_at && *x->slow_at && cq_now_ms() >= *x->slow_at) {
                *x->slow_at = 0;
                x->opts->on_slow(x->opts->opaque);
        }
        extend_during_cell(x->e2b);
        return 0;
}

/* One POST /execute; fills x->outcome. */
static void exec_run(struct exec *x, const char *code)
{
        cq_e2b_t *e2b = x->e2b;
        char base[512], url[1024];
        struct curl_slist *headers = NULL;
        cq_http_req_t hreq = {0};
        cq_http_res_t res;
        json_t *req = NULL;
        char *body = NULL;

        cq_http_res_init(&res);
        req = x->default_context ? json_pack("{s:s}", "code", code)
                                 : json_pack("{s:s, s:s}", "code", code,
                                             "context_id", e2b->context_id);
        body = req ? json_dumps(req, JSON_COMPACT) : NULL;
        headers =
            body ? e2b_make_headers(e2b, PLANE_CI, "application/json") : NULL;
        if (!headers || e2b_dp_base(e2b, CI_PORT, base, sizeof(base)) != 0) {
                snprintf(x->why, sizeof(x->why),
                         "could not build the /execute request (code not "
                         "UTF-8, or out of memory)");
                x->outcome = OUT_HTTP;
                x->status = 400;
                goto out;
        }
        snprintf(url, sizeof(url), "%s/execute", base);
        hreq.method = "POST";
        hreq.url = url;
        hreq.headers = headers;
        hreq.body = body;
        hreq.body_len = strlen(body);
        hreq.deadline_ms = x->deadline_ms;
        hreq.cancel = x->opts->cancel;
        hreq.sink = exec_write;
        hreq.tick = exec_tick;
        hreq.opaque = x;
        switch (cq_http_perform(e2b->http, &hreq, &res)) {
        case CQ_HTTP_CANCELLED:
                x->outcome = OUT_CANCEL;
                goto out;
        case CQ_HTTP_DEADLINE:
                x->outcome = OUT_DEADLINE;
                goto out;
        case CQ_HTTP_ABORTED: /* the sink or the tick set x->outcome */
                goto out;
        case CQ_HTTP_OK:
        case CQ_HTTP_NETWORK:
        case CQ_HTTP_TOO_LARGE: /* not with a sink */
        case CQ_HTTP_REFUSED:   /* nor without an address hook */
                break;
        }
        if (res.outcome != CQ_HTTP_OK && x->status == 0) {
                snprintf(x->why, sizeof(x->why),
                         "the /execute request failed: %.400s", res.error);
                x->outcome = OUT_NETWORK;
                goto out;
        }
        if (x->status == 0)
                x->status = res.status;
        if (x->status != 200) {
                char reason[256];

                e2b_reply_reason(&x->errbody, reason, sizeof(reason));
                snprintf(x->why, sizeof(x->why),
                         "/execute returned HTTP %ld: %s", x->status, reason);
                x->outcome = OUT_HTTP;
                goto out;
        }
        /* a last line without '\n' */
        if (x->skipping)
                skip_done(x);
        if (!x->end_seen && x->line.len > 0 && exec_line(x) != 0)
                goto out;
        if (!x->end_seen) {
                snprintf(x->why, sizeof(x->why),
                         "the E2B /execute stream ended without "
                         "end_of_execution (%.400s)",
                         res.outcome == CQ_HTTP_OK ? "connection closed"
                                                   : res.error);
                x->outcome = OUT_TRUNCATED;
                goto out;
        }
        x->outcome = OUT_END;
out:
        cq_http_res_release(&res);
        curl_slist_free_all(headers);
        json_decref(req);
        free(body);
}

static void exec_init(struct exec *x, cq_e2b_t *e2b, const cq_exec_opts_t *opts)
{
        memset(x, 0, sizeof(*x));
        x->e2b = e2b;
        x->opts = opts;
        x->execution_count = -1;
        cq_buf_init(&x->line, e2b->max_line);
        cq_buf_init(&x->errbody, MAX_ERR_BODY);
        x->col_ok = cq_collect_init(&x->col, e2b->max_output, opts->on_output,
                                    opts->opaque) == 0;
}

static void exec_release(struct exec *x)
{
        cq_buf_release(&x->line);
        cq_buf_release(&x->errbody);
        cq_collect_release(&x->col);
        json_decref(x->error);
}

/* After a broken stream: restart the context when the sandbox lives,
 * else replace the sandbox. Sets *replacedp. */
static cq_err_t recover(cq_e2b_t *e2b, bool *replacedp)
{
        *replacedp = false;
        if (e2b_sandbox_alive(e2b) && e2b_restart_context(e2b) == CQ_OK)
                return CQ_OK;
        *replacedp = true;
        return e2b_replace_sandbox(e2b);
}

static json_t *error_output(const char *ename, const char *evalue)
{
        return json_pack("{s:s, s:s, s:s, s:[s]}", "output_type", "error",
                         "ename", ename, "evalue", evalue, "traceback", evalue);
}

/* Run "pass" with a short deadline: does the context answer after an
 * aborted cell? */
static bool context_answers(cq_e2b_t *e2b)
{
        static const cq_exec_opts_t probe_opts = {0};
        struct exec x;
        bool ok;

        exec_init(&x, e2b, &probe_opts);
        x.deadline_ms = cq_now_ms() + e2b->probe_timeout_ms;
        exec_run(&x, "pass");
        ok = x.outcome == OUT_END;
        exec_release(&x);
        return ok;
}

/* The server said ExecutionAborted and nothing else: the kernel refused
 * the request without running any of it. */
static bool never_ran(const struct exec *x)
{
        const char *ename =
            json_string_value(json_object_get(x->error, "ename"));

        return x->outcome == OUT_END && ename &&
               strcmp(ename, "ExecutionAborted") == 0 &&
               json_array_size(x->col.head) == 0 &&
               json_array_size(x->col.tail) == 0 && x->col.dropped == 0;
}

cq_err_t e2b_execute(cq_interp_t *interp,
                     const char *code,
                     const cq_exec_opts_t *opts,
                     cq_cell_result_t *res)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        int64_t start = cq_now_ms(), slow_at = 0;
        struct exec x;
        json_t *extra_err = NULL;
        cq_err_t err = CQ_OK;
        bool replaced = false;
        char evalue[768];

        /* The environment is probed before the job's first cell: later,
         * files that cell made in the home dir it shares with the default
         * context could pass for installed packages. Not counted in the
         * cell's time; a failure leaves the environment unknown. */
        if (!e2b->env_probed) {
                (void)e2b_env(interp);
                start = cq_now_ms();
        }
        exec_init(&x, e2b, opts);
        e2b->errbuf[0] = '\0';
        if (!x.col_ok) {
                e2b_set_error(e2b, "could not run cell: out of memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        if (!e2b->sandbox_id[0] || e2b->lost) {
                /* an earlier recovery failed, or a call saw a 502 */
                err = e2b_replace_sandbox(e2b);
                if (err != CQ_OK)
                        goto out;
                res->state_lost = true;
        }
        err = e2b_maybe_extend(e2b, opts->timeout_ms);
        if (err != CQ_OK && !e2b->lost) /* 401/403 */
                goto out;
        if (err != CQ_OK) {
                /* 404: the sandbox already expired; start again */
                err = e2b_replace_sandbox(e2b);
                if (err != CQ_OK)
                        goto out;
                res->state_lost = true;
        }
        if (res->state_lost) {
                /* tell the reader why earlier variables are missing */
                static const char note[] =
                    "[the E2B sandbox was lost before this cell and was "
                    "replaced with a fresh one holding the job files; "
                    "variables from earlier cells are gone]\n";
                json_t *o = json_pack("{s:s, s:s, s:s}", "output_type",
                                      "stream", "name", "stderr", "text", note);

                if (!o) {
                        e2b_set_error(e2b, "could not run cell: out of memory");
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                cq_collect_add(&x.col, &o);
        }
        if (opts->timeout_ms > 0)
                x.deadline_ms = start + opts->timeout_ms;
        /* from the request, as the local kernel counts it */
        if (opts->on_slow)
                slow_at = cq_now_ms() + (opts->slow_ms > 0 ? opts->slow_ms : 0);
        x.slow_at = &slow_at;
        atomic_store(&e2b->interrupt, 0);
        exec_run(&x, code);
        if (never_ran(&x)) {
                /* ipykernel aborts a request that arrives while it still
                 * unwinds the previous failed cell; the code did not run,
                 * so run it again once */
                struct timespec ts = {0, 200000000L};

                cq_log_info("e2b: execution aborted before it started; "
                            "running the cell again");
                nanosleep(&ts, NULL);
                exec_release(&x);
                exec_init(&x, e2b, opts);
                if (!x.col_ok) {
                        e2b_set_error(e2b, "could not run cell: out of memory");
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                if (opts->timeout_ms > 0)
                        x.deadline_ms = start + opts->timeout_ms;
                x.slow_at = &slow_at;
                exec_run(&x, code);
        }
        res->status = x.error ? CQ_CELL_ERROR : CQ_CELL_OK;
        switch (x.outcome) {
        case OUT_END:
                break;
        case OUT_DEADLINE:
                res->status = CQ_CELL_TIMEOUT;
                snprintf(evalue, sizeof(evalue),
                         "the cell did not finish within %lld ms and was "
                         "interrupted",
                         (long long)opts->timeout_ms);
                if (!context_answers(e2b)) {
                        err = recover(e2b, &replaced);
                        if (err != CQ_OK)
                                goto out;
                        res->state_lost = true;
                        snprintf(evalue + strlen(evalue),
                                 sizeof(evalue) - strlen(evalue),
                                 "; the kernel did not answer afterwards and "
                                 "was restarted (variables are gone)");
                }
                extra_err = error_output("TimeoutError", evalue);
                break;
        case OUT_CANCEL:
                res->status = CQ_CELL_CANCELLED;
                break;
        case OUT_INTERRUPT:
                res->status = CQ_CELL_ERROR;
                extra_err = error_output("KeyboardInterrupt",
                                         "the cell was interrupted");
                break;
        case OUT_HTTP:
                if (x.status == 401 || x.status == 403) {
                        e2b_set_error(e2b, "could not run cell: %s", x.why);
                        err = CQ_ERR_FATAL;
                        goto out;
                }
                if (x.status != 502 && x.status != 404) {
                        e2b_set_error(e2b, "could not run cell: %s", x.why);
                        err = x.status == 400 || x.status == 422
                                  ? CQ_ERR_FATAL
                                  : CQ_ERR_RETRIABLE;
                        goto out;
                }
                if (x.status == 502)
                        e2b->lost = true;
                /* fall through - 502: sandbox lost, 404: context lost */
        case OUT_TRUNCATED:
        case OUT_PROTOCOL:
        case OUT_NETWORK:
                cq_log_warn("e2b: sandbox %s: %s", e2b->sandbox_id, x.why);
                err = recover(e2b, &replaced);
                if (err != CQ_OK) {
                        char saved[sizeof(e2b->errbuf)];

                        memcpy(saved, e2b->errbuf, sizeof(saved));
                        e2b_set_error(e2b,
                                      "could not run cell: %s; recovery "
                                      "failed: %s",
                                      x.why, saved);
                        goto out;
                }
                res->status = CQ_CELL_DIED;
                res->state_lost = true;
                snprintf(evalue, sizeof(evalue), "%s; %s", x.why,
                         replaced ? "the sandbox was lost and a fresh one "
                                    "was started with the job files "
                                    "(variables and files the code wrote "
                                    "are gone)"
                                  : "the kernel was restarted (variables "
                                    "are gone)");
                e2b_set_error(e2b, "%s", evalue);
                extra_err = error_output(
                    replaced ? "SandboxLost" : "KernelRestarted", evalue);
                break;
        }
        if (extra_err) {
                json_decref(x.error);
                x.error = extra_err;
                extra_err = NULL;
        }
        /* the error comes last, counted like any output */
        cq_collect_add(&x.col, &x.error);
        res->outputs = cq_collect_finish(&x.col);
        if (!res->outputs) {
                e2b_set_error(e2b, "could not collect cell outputs: out of "
                                   "memory");
                err = CQ_ERR_FATAL;
                goto out;
        }
        res->truncated = cq_collect_truncated(&x.col);
        res->execution_count = x.execution_count;
        err = CQ_OK;
out:
        res->duration_ms = cq_now_ms() - start;
        json_decref(extra_err);
        exec_release(&x);
        return err;
}

int e2b_interrupt(cq_interp_t *interp)
{
        atomic_store(&((cq_e2b_t *)interp)->interrupt, 1);
        return 0;
}

cq_err_t e2b_restart(cq_interp_t *interp)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;

        if (!e2b->sandbox_id[0] || e2b->lost)
                return e2b_replace_sandbox(e2b);
        if (e2b_restart_context(e2b) == CQ_OK)
                return CQ_OK;
        /* recover() would try the restart once more: a sandbox whose
         * context will not restart is replaced at once */
        return e2b_replace_sandbox(e2b);
}

/* The environment, from the sandbox's default Python context: the job's
 * code runs in a context of its own, so it cannot change what this one
 * imported. Probed once, before the first cell runs (e2b_execute()) or on
 * the first call; a failure leaves it unknown. */
const json_t *e2b_env(cq_interp_t *interp)
{
        cq_e2b_t *e2b = (cq_e2b_t *)interp;
        cq_exec_opts_t eo = {0};
        struct exec x;
        json_t *outputs;
        char marker[64], nonce[NONCE_LEN + 1], *probe;

        if (e2b->env_probed || !e2b->sandbox_id[0] || e2b->lost)
                return e2b->env;
        e2b->env_probed = true;
        e2b_make_nonce(e2b, nonce);
        snprintf(marker, sizeof(marker), "coderq-env %s ", nonce);
        probe = cq_interp_env_probe(marker);
        if (!probe)
                return NULL;
        exec_init(&x, e2b, &eo);
        x.default_context = true;
        x.deadline_ms = cq_now_ms() + e2b->probe_timeout_ms;
        if (x.col_ok)
                exec_run(&x, probe);
        if (x.col_ok && x.outcome == OUT_END) {
                outputs = cq_collect_finish(&x.col);
                e2b->env = cq_interp_env_parse(outputs, marker);
                json_decref(outputs);
        }
        if (!e2b->env)
                cq_log_warn("e2b: sandbox %s did not report its Python "
                            "environment%s%s",
                            e2b->sandbox_id, x.why[0] ? ": " : "", x.why);
        exec_release(&x);
        free(probe);
        return e2b->env;
}
