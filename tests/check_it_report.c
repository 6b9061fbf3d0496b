/* SPDX-License-Identifier: MIT */
/* check_it_report.c - `coderq report` against a real PostgreSQL
 * (CODERQ_PG_DSN; a fresh database per test, migrated from migrations/)
 * on a crafted run whose job ids, titles, prompts, answers, messages, cell
 * outputs, test reports and images are hostile: markup, event handlers,
 * script in SVG, ANSI escapes, URLs of a local listener. The pages are
 * then loaded in headless Chromium (Debian's package; the suite skips
 * with "needs chromium" without it), which dumps the DOM it built: the
 * test checks it holds only the report's own elements, no event handler
 * attributes, the hostile text as text, the rows, and that the index's
 * script sorts and filters (driven by the URL fragment). No page may
 * connect to the listener. A second run (two models, samples of problems,
 * a job retried twice, a 40-character id, a field only its last job has)
 * is measured in the browser at 1280x900: a copy of its index without
 * its policy carries a probe script that reports the layout (the default
 * table fits without scrolling, each row on one line). Screenshots are
 * written under the build tree: report-index.png, report-job.png,
 * report-retry.png (a retry's page) and report-samples.png (the grid). */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_support.h"
#include "support/pgtest.h"
#include "support/proc.h"
#include "coderq/common/buf.h"
#include "coderq/cli/html.h"
#include "coderq/agent/notebook.h"
#include "coderq/storage/queue.h"
#include "coderq/storage/artifacts.h"
#include "coderq/common/util.h"

static char g_dsn[2048];
static char g_dbname[64];
static char g_tmpdir[256];
static int g_listen = -1; /* a page that loads anything connects here */
static int g_port;

/* The jobs of the run, in the order they are created. */
#define ID_HOSTILE "<script>alert(1)</script>"
#define ID_PASSWD  "../../etc/passwd"
#define ID_QUOTE   "q\"uote'&amp;"
#define ID_OK      "plain-ok-1"
#define ID_MEMORY  "memory-hit"
#define ID_QUEUED  "waiting-job"
#define ID_NEWLINE "evil\n<b>x</b>"
#define NJOBS      8

static char g_long_id[129]; /* 128 bytes, the longest id */

static const char *job_ids(size_t i)
{
        static const char *const ids[] = {ID_HOSTILE, ID_PASSWD, ID_QUOTE,
                                          ID_OK,      ID_MEMORY, ID_QUEUED,
                                          ID_NEWLINE, g_long_id};

        return ids[i];
}

/* ------------------------------------------------------------- fixture */

static void qexec(const char *sql, int n, const char *const *params)
{
        PGconn *conn = cq_pgtest_connect(g_dsn);
        PGresult *res = PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);

        ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK ||
                          PQresultStatus(res) == PGRES_TUPLES_OK,
                      "%s: %s", sql, PQerrorMessage(conn));
        PQclear(res);
        PQfinish(conn);
}

static void setup(void)
{
        struct sockaddr_in addr;
        socklen_t len = sizeof(addr);

        cq_pgtest_sweep("cqrep");
        cq_pgtest_create("cqrep", true, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
        snprintf(g_tmpdir, sizeof(g_tmpdir), "/tmp/cqt_report_XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(g_tmpdir));
        setenv("CODERQ_PG_DSN", g_dsn, 1);
        setenv("CODERQ_LOG_LEVEL", "error", 1);
        memset(g_long_id, 'x', 128);
        memcpy(g_long_id, "long-", 5);
        g_long_id[128] = '\0';

        g_listen = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        ck_assert_int_ge(g_listen, 0);
        memset(&addr, 0, sizeof(addr));
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(bind(g_listen, (struct sockaddr *)&addr, len), 0);
        ck_assert_int_eq(listen(g_listen, 64), 0);
        ck_assert_int_eq(getsockname(g_listen, (struct sockaddr *)&addr, &len),
                         0);
        g_port = ntohs(addr.sin_port);
}

static void teardown(void)
{
        char cmd[400];

        if (g_listen >= 0)
                close(g_listen);
        g_listen = -1;
        cq_pgtest_drop(g_dbname);
        if (g_tmpdir[0] && strncmp(g_tmpdir, "/tmp/cqt_report_", 16) == 0) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmpdir);
                if (system(cmd) != 0)
                        fprintf(stderr, "could not remove %s\n", g_tmpdir);
        }
}

/* Connections the pages made to the listener (there must be none). */
static int connections(void)
{
        int n = 0, fd;

        while ((fd = accept(g_listen, NULL, NULL)) >= 0) {
                close(fd);
                n++;
        }
        ck_assert_msg(errno == EAGAIN || errno == EWOULDBLOCK, "accept: %s",
                      strerror(errno));
        return n;
}

static cq_store_t *store_for(const char *owner)
{
        cq_store_opts_t opts;
        char errstr[512];
        cq_store_t *store;

        cq_store_opts_init(&opts);
        opts.dsn = g_dsn;
        opts.owner = owner;
        opts.lease_s = 600;
        store = cq_store_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(store != NULL, "%s", errstr);
        return store;
}

/* Insert a job as the intake would; \p msg is its JSON message. */
static void add_job(cq_store_t *store, json_t *msg)
{
        char *text = json_dumps(msg, JSON_COMPACT);
        cq_job_t job;
        char errstr[256];
        bool created = false;

        ck_assert_ptr_nonnull(text);
        cq_job_init(&job);
        ck_assert_msg(cq_job_parse(text, strlen(text), 0, &job, errstr,
                                   sizeof(errstr)) == CQ_OK,
                      "%s: %s", text, errstr);
        ck_assert_msg(cq_store_upsert_job(store, &job, NULL, &created) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(created);
        cq_job_release(&job);
        free(text);
        json_decref(msg);
}

static void claim(cq_store_t *store, const char *want)
{
        cq_claim_t c;
        bool found = false;

        cq_claim_init(&c);
        ck_assert_msg(cq_store_claim(store, &c, &found) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        ck_assert(found);
        ck_assert_str_eq(c.job_id, want);
        cq_claim_release(&c);
}

static void message(cq_store_t *store, const char *id, int seq, json_t *msg)
{
        bool lost = true;

        ck_assert_ptr_nonnull(msg);
        ck_assert_msg(cq_store_append_message(store, id, seq, msg, &lost) ==
                          CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(!lost);
        json_decref(msg);
}

/* Run a cell into the notebook and the cells table. */
static void cell(cq_store_t *store,
                 const char *id,
                 cq_nb_t *nb,
                 int seq,
                 const char *code,
                 cq_cell_status_t status,
                 json_t *outputs)
{
        cq_cell_result_t res;
        bool lost = true;

        ck_assert_ptr_nonnull(outputs);
        cq_cell_result_init(&res);
        res.status = status;
        res.execution_count = seq;
        res.duration_ms = 40 * seq;
        res.outputs = outputs;
        ck_assert_int_eq(cq_nb_add_code(nb, code, &res), 0);
        ck_assert_msg(cq_store_record_cell(store, id, seq, code, &res,
                                           cq_nb_json(nb), &lost) == CQ_OK,
                      "%s", cq_store_errmsg(store));
        ck_assert(!lost);
        cq_cell_result_release(&res);
}

typedef struct fin {
        const char *status, *reason, *answer, *reason_code;
        int passed, total, turns, retries;
        int64_t ptok, ctok;
        double cost;
        const cq_nb_t *nb;
        json_t *report; /* owned */
} fin_t;

static void finish(cq_store_t *store, const char *id, fin_t *a)
{
        cq_finish_t fin;
        bool lost = true;

        memset(&fin, 0, sizeof(fin));
        fin.job_id = id;
        fin.status = a->status;
        fin.reason = a->reason;
        fin.reason_code = a->reason_code;
        fin.answer = a->answer;
        fin.cost_usd = a->cost;
        fin.tests_passed = a->passed;
        fin.tests_total = a->total;
        fin.turns = a->turns;
        fin.retries = a->retries;
        fin.prompt_tokens = a->ptok;
        fin.completion_tokens = a->ctok;
        fin.notebook = a->nb ? cq_nb_json(a->nb) : NULL;
        fin.report = a->report;
        ck_assert_msg(cq_store_finish(store, &fin, &lost) == CQ_OK, "%s",
                      cq_store_errmsg(store));
        ck_assert(!lost);
        json_decref(a->report);
}

/* A real PNG (a small matplotlib plot), made by Debian's Python. */
static unsigned char *make_png(size_t *lenp)
{
        char path[400], cmd[1200];

        snprintf(path, sizeof(path), "%s/plot.png", g_tmpdir);
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 -c 'import math, matplotlib; "
                 "matplotlib.use(\"Agg\"); import matplotlib.pyplot as plt; "
                 "fig, ax = plt.subplots(figsize=(4, 2.4), dpi=60); "
                 "x = [i / 10 for i in range(70)]; "
                 "ax.plot(x, [math.sin(v) for v in x]); "
                 "ax.set_title(\"sin(x)\"); fig.savefig(\"%s\")'",
                 path);
        ck_assert_int_eq(system(cmd), 0);
        return (unsigned char *)cq_check_slurp(path, lenp);
}

static char *url(const char *path)
{
        static char buf[4][200];
        static int i;

        i = (i + 1) % 4;
        snprintf(buf[i], sizeof(buf[i]), "http://127.0.0.1:%d/%s", g_port,
                 path);
        return buf[i];
}

/* Bytes of the hostile SVG: script, an event handler and a remote image
 * (none of which runs or loads in an <img>). */
static char *hostile_svg(void)
{
        char *svg = malloc(1024);

        ck_assert_ptr_nonnull(svg);
        snprintf(svg, 1024,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"120\" "
                 "height=\"40\" onload=\"fetch('%s')\"><script>fetch('%s')"
                 "</script><image href=\"%s\" width=\"10\" height=\"10\"/>"
                 "<rect width=\"120\" height=\"40\" fill=\"#8250df\"/></svg>",
                 url("svg-onload"), url("svg-script"), url("svg-image"));
        return svg;
}

/* The hostile job: everything a model or its code wrote is markup. */
static void
make_hostile(cq_store_t *store, const unsigned char *png, size_t png_len)
{
        char prompt[512], answer[1024], tool[512], *png_b64, *svg, *svg_file;
        char evil_png_name[] = "evil<img src=x onerror=alert(6)>.png";
        unsigned char *png2;
        cq_nb_t *nb = cq_nb_new(NULL);
        fin_t fin = {0};

        snprintf(prompt, sizeof(prompt),
                 "Write f(x) </pre><script>alert('user')</script>"
                 "<img src=\"%s\">",
                 url("prompt.png"));
        snprintf(answer, sizeof(answer),
                 "<script>document.title='pwned'</script><img src=x "
                 "onerror=\"document.body.setAttribute('data-pwned','1')\">"
                 "<link rel=\"stylesheet\" href=\"%s\"><iframe src=\"%s\">"
                 "</iframe>\"quoted\" 'single' & done",
                 url("answer.css"), url("answer-frame"));
        snprintf(tool, sizeof(tool),
                 "stdout:\n<script>alert(1)</script>\n\x1b[31mred\x1b[0m "
                 "<img src=\"%s\">",
                 url("tool.png"));
        add_job(store, json_pack("{s:s, s:s, s:s, s:s, s:{s:s, s:s, s:[{s:[i], "
                                 "s:i}]}}",
                                 "job_id", ID_HOSTILE, "run_id", "r1", "title",
                                 "<img src=x onerror=alert(7)> title", "prompt",
                                 prompt, "tests", "kind", "cases", "function",
                                 "f", "cases", "args", 1, "expected", 2));
        claim(store, ID_HOSTILE);
        message(store, ID_HOSTILE, 1,
                json_pack("{s:s, s:s}", "role", "system", "content",
                          "You are careful. <b>not bold</b>"));
        message(store, ID_HOSTILE, 2,
                json_pack("{s:s, s:s}", "role", "user", "content", prompt));
        message(store, ID_HOSTILE, 3,
                json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role",
                          "assistant", "content", "tool_calls", "id",
                          "call_<1>", "type", "function", "function", "name",
                          "execute_code", "arguments",
                          "{\"code\": \"print('<script>alert(1)</script>')"
                          "\\n</pre><b>code</b>\"}"));
        message(store, ID_HOSTILE, 4,
                json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                          "call_<1>", "content", tool));
        message(store, ID_HOSTILE, 5,
                json_pack("{s:s, s:s, s:s}", "role", "assistant", "content",
                          answer, "reasoning_content",
                          "<think><img src=x onerror=alert(2)></think>"));

        png_b64 = cq_b64_encode(png, png_len, NULL);
        svg = hostile_svg();
        ck_assert_ptr_nonnull(png_b64);
        cell(store, ID_HOSTILE, nb, 1, "print('<script>alert(1)</script>')",
             CQ_CELL_OK,
             json_pack("[{s:s, s:s, s:s}, {s:s, s:s, s:s}]", "output_type",
                       "stream", "name", "stdout", "text",
                       "<script>alert(1)</script>\n", "output_type", "stream",
                       "name", "stderr", "text", "warn <b>x</b>\x01\n"));
        cell(store, ID_HOSTILE, nb, 2, "plot()", CQ_CELL_OK,
             json_pack("[{s:s, s:{s:s, s:s}, s:{}}, {s:s, s:{s:s}, s:{}}, "
                       "{s:s, s:{s:s}, s:{}}, {s:s, s:{s:s}, s:{}}, "
                       "{s:s, s:{s:s}, s:{}, s:i}]",
                       "output_type", "display_data", "data", "image/png",
                       png_b64, "text/plain", "<Figure>", "metadata",
                       "output_type", "display_data", "data", "image/svg+xml",
                       svg, "metadata", "output_type", "display_data", "data",
                       "text/html",
                       "<iframe src=http://127.0.0.1:1/f></iframe>"
                       "<script>alert(3)</script>",
                       "metadata", "output_type", "display_data", "data",
                       "image/png", "\" onerror=\"alert(4)", "metadata",
                       "output_type", "execute_result", "data", "text/plain",
                       "'<img src=x onerror=alert(5)>'", "metadata",
                       "execution_count", 2));
        cell(store, ID_HOSTILE, nb, 3, "raise ValueError('<bad>')",
             CQ_CELL_ERROR,
             json_pack("[{s:s, s:s, s:s, s:[s, s]}]", "output_type", "error",
                       "ename", "ValueError", "evalue", "<bad>", "traceback",
                       "\x1b[0;31m-----------------------------\x1b[0m",
                       "\x1b[0;31mValueError\x1b[0m: <bad>"));

        /* the notebook's PNG again (drawn once), another PNG under a
         * hostile name, the SVG as a file, and a type that is not drawn */
        ck_assert_int_eq(cq_store_put_image(store, ID_HOSTILE, "cell2-1.png",
                                            "image/png", png, png_len, 2, NULL,
                                            NULL),
                         CQ_OK);
        png2 = malloc(png_len + 1);
        ck_assert_ptr_nonnull(png2);
        memcpy(png2, png, png_len);
        png2[png_len] = 0; /* trailing bytes: still a PNG, other digest */
        ck_assert_int_eq(cq_store_put_image(store, ID_HOSTILE, evil_png_name,
                                            "image/png", png2, png_len + 1, 0,
                                            NULL, NULL),
                         CQ_OK);
        svg_file = malloc(strlen(svg) + 32);
        ck_assert_ptr_nonnull(svg_file);
        snprintf(svg_file, strlen(svg) + 32, "%s<!-- a file -->", svg);
        ck_assert_int_eq(cq_store_put_image(store, ID_HOSTILE, "drawing.svg",
                                            "image/svg+xml", svg_file,
                                            strlen(svg_file), 0, NULL, NULL),
                         CQ_OK);
        free(svg_file);
        ck_assert_int_eq(cq_store_put_image(store, ID_HOSTILE, "raw.bmp",
                                            "image/bmp", "BM\x01\x02", 4, 0,
                                            NULL, NULL),
                         CQ_OK);

        fin.status = "succeeded";
        fin.answer = answer;
        fin.passed = 2;
        fin.total = 2;
        fin.turns = 2;
        fin.ptok = 1500;
        fin.ctok = 300;
        fin.nb = nb;
        fin.report = json_pack(
            "{s:b, s:s, s:i, s:s, s:{s:i, s:i, s:s, s:[{s:i, s:b, s:s, s:s, "
            "s:s}, {s:i, s:b, s:s, s:s, s:s}]}}",
            "from_memory", 0, "sandbox", "bwrap", "cells", 3, "last_error",
            "<script>last()</script>", "tests", "passed", 2, "total", 2,
            "isolation", "kernel", "cases", "case", 1, "ok", 1, "call",
            "f('<script>')", "expected", "'<b>'", "got", "'<b>'", "case", 2,
            "ok", 1, "call", "f(2)", "expected", "4", "got", "4");
        finish(store, ID_HOSTILE, &fin);
        cq_nb_destroy(&nb);
        free(png2);
        free(svg);
        free(png_b64);
}

static void make_plain(cq_store_t *store,
                       const char *id,
                       const char *status,
                       const char *reason,
                       int passed,
                       int64_t ptok,
                       json_t *report)
{
        fin_t fin = {0};

        add_job(store,
                json_pack("{s:s, s:s, s:s, s:s}", "job_id", id, "run_id", "r1",
                          "title", "a plain job", "prompt", "add two numbers"));
        claim(store, id);
        message(store, id, 1,
                json_pack("{s:s, s:s}", "role", "user", "content",
                          "add two numbers"));
        fin.status = status;
        fin.reason = reason;
        fin.answer = "3";
        fin.passed = passed;
        fin.total = 2;
        fin.turns = 1;
        fin.ptok = ptok;
        fin.report = report;
        finish(store, id, &fin);
}

static void make_run(void)
{
        cq_store_t *store = store_for("w1");
        const char *params[2] = {ID_NEWLINE, "r1"};
        cq_cancel_outcome_t outcome;
        unsigned char *png;
        size_t png_len;

        png = make_png(&png_len);
        make_hostile(store, png, png_len);
        make_plain(store, ID_PASSWD, "failed", "tests: 1 of 2 passed <i>x</i>",
                   1, 300, NULL);
        make_plain(store, ID_QUOTE, "failed", "max_turns reached", 0, 900,
                   NULL);
        make_plain(store, ID_OK, "succeeded", NULL, 2, 120, NULL);
        make_plain(store, ID_MEMORY, "succeeded", NULL, 2, 0,
                   json_pack("{s:b, s:s}", "from_memory", 1,
                             "memory_source_job", ID_OK));
        add_job(store, json_pack("{s:s, s:s, s:s}", "job_id", ID_QUEUED,
                                 "run_id", "r1", "prompt", "later"));
        /* an id no job message could carry, straight into the table */
        qexec("INSERT INTO jobs (job_id, prompt, spec, run_id) VALUES "
              "($1, 'p', '{}', $2)",
              2, params);
        add_job(store, json_pack("{s:s, s:s, s:s}", "job_id", g_long_id,
                                 "run_id", "r1", "prompt", "cancel me"));
        ck_assert_int_eq(cq_store_cancel(store, g_long_id, &outcome), CQ_OK);
        ck_assert_int_eq(outcome, CQ_CANCEL_DONE);
        free(png);
        cq_store_destroy(&store);
}

/* ---------------------------------------------------- the second run */

/* Run r2: what an evaluation looks like. */
#define ID_40    "eval-2025-12-06-humaneval-0042-4f9c2a7e1" /* 40 bytes */
#define ID_FLAKY "flaky-parse"
#define ID_LATE  "late-e2b"
#define MODEL_A  "gpt-4o-mini-2024-07-18"
#define MODEL_B  "claude-sonnet-4-5-20250929"
#define R2_JOBS  18 /* originals */
#define R2_ALL   20 /* attempts */

static void set_verdict(const char *id, const char *verdict)
{
        const char *params[2] = {id, verdict};

        qexec("UPDATE jobs SET verdict = $2 WHERE job_id = $1", 2, params);
        qexec("UPDATE results SET verdict = $2 WHERE job_id = $1", 2, params);
}

/* Add a job of run r2 (\p msg gets the run and a prompt), claim it, and
 * finish it as \p fin says; \p verdict (or NULL) replaces the one the
 * status gives. */
static void
run_job(cq_store_t *store, json_t *msg, fin_t *fin, const char *verdict)
{
        char id[200];

        snprintf(id, sizeof(id), "%s",
                 json_string_value(json_object_get(msg, "job_id")));
        json_object_set_new(msg, "run_id", json_string("r2"));
        json_object_set_new(msg, "prompt", json_string("write f"));
        add_job(store, msg);
        claim(store, id);
        message(store, id, 1,
                json_pack("{s:s, s:s}", "role", "user", "content", "write f"));
        if (!fin->answer)
                fin->answer = "def f(x): return x";
        if (!fin->total)
                fin->total = 3;
        if (!fin->turns)
                fin->turns = 2;
        fin->ptok = 800;
        fin->ctok = 120;
        finish(store, id, fin);
        if (verdict)
                set_verdict(id, verdict);
}

static void run_sample(cq_store_t *store,
                       const char *problem,
                       const char *id_stem,
                       int index,
                       const char *model,
                       const char *verdict)
{
        char id[200];
        fin_t fin = {0};
        bool ok = strcmp(verdict, "passed") == 0;

        snprintf(id, sizeof(id), "%s~s%d", id_stem, index);
        fin.status = ok ? "succeeded" : "failed";
        fin.reason = ok ? NULL : "tests: 1 of 3 passed";
        fin.reason_code = ok ? NULL : "tests";
        fin.passed = ok ? 3 : 1;
        fin.cost = 0.0021 + 0.0003 * index;
        run_job(store,
                json_pack("{s:s, s:s, s:s, s:s, s:i}", "job_id", id, "title",
                          problem, "model", model, "problem_id", problem,
                          "sample_index", index),
                &fin, verdict);
}

/* The jobs of run r2 that are no sample, in the order they run. */
static const struct r2_job {
        const char *id, *title, *model;
        const char *retry_of; /* and run_attempt, or NULL */
        int run_attempt;
        const char *status, *reason, *reason_code, *verdict;
        int passed, turns;
        double cost;
} R2_PLAIN[] = {
    {ID_40, "Sum the even numbers of a list", MODEL_A, NULL, 0, "succeeded",
     NULL, NULL, NULL, 3, 2, 0.0123},
    /* tried three times: the tests failed, it ran out of time, it passed */
    {ID_FLAKY, "Parse a CSV line with quoted fields", MODEL_A, NULL, 0,
     "failed", "tests: 1 of 3 passed", "tests", NULL, 1, 2, 0.004},
    {ID_FLAKY "~r2", "Parse a CSV line with quoted fields", MODEL_A, ID_FLAKY,
     2, "failed", "job_timeout: the job ran for 600 s", "job_timeout",
     "timeout", 0, 2, 0.011},
    {ID_FLAKY "~r3", "Parse a CSV line with quoted fields", MODEL_A, ID_FLAKY,
     3, "succeeded", NULL, NULL, NULL, 3, 2, 0.006},
    /* a long title; a cost nobody knows */
    {"iso-duration",
     "Parse an ISO 8601 duration such as P3DT4H into seconds, rejecting "
     "malformed input",
     MODEL_B, NULL, 0, "failed",
     "max_turns: 8 turns without an answer that passed", "max_turns", NULL, 0,
     8, -1},
};

static void run_plain(cq_store_t *store, const struct r2_job *j)
{
        json_t *msg = json_pack("{s:s, s:s, s:s}", "job_id", j->id, "title",
                                j->title, "model", j->model);
        fin_t fin = {0};

        if (j->retry_of) {
                json_object_set_new(msg, "retry_of", json_string(j->retry_of));
                json_object_set_new(msg, "run_attempt",
                                    json_integer(j->run_attempt));
        }
        fin.status = j->status;
        fin.reason = j->reason;
        fin.reason_code = j->reason_code;
        fin.passed = j->passed;
        fin.turns = j->turns;
        fin.cost = j->cost;
        run_job(store, msg, &fin, j->verdict);
}

static void make_run2(void)
{
        static const char *const he7_a[] = {"passed", "passed", "wrong_answer",
                                            "passed", "runtime_error"};
        static const char *const he7_b[] = {"passed", "timeout",
                                            "syntax_error"};
        static const char *const he12_a[] = {"wrong_answer", "stuck", "passed",
                                             "no_answer", "infra_error"};
        cq_store_t *store = store_for("w2");
        fin_t fin = {0};
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(R2_PLAIN); i++)
                run_plain(store, &R2_PLAIN[i]);
        /* samples: one problem asked of both models, one of the first */
        for (i = 0; i < CQ_ARRAY_SIZE(he7_a); i++)
                run_sample(store, "HumanEval/7", "HumanEval/7", (int)i, MODEL_A,
                           he7_a[i]);
        for (i = 0; i < CQ_ARRAY_SIZE(he7_b); i++)
                run_sample(store, "HumanEval/7", "HumanEval/7-b", (int)i,
                           MODEL_B, he7_b[i]);
        for (i = 0; i < CQ_ARRAY_SIZE(he12_a); i++)
                run_sample(store, "HumanEval/12", "HumanEval/12", (int)i,
                           MODEL_A, he12_a[i]);
        /* the only job whose result says where it ran, last */
        fin.status = "succeeded";
        fin.passed = 3;
        fin.cost = 0.0031;
        fin.report = json_pack("{s:s, s:{s:s, s:s}}", "sandbox", "e2b", "repro",
                               "backend", "e2b", "python", "3.12.1");
        run_job(store,
                json_pack("{s:s, s:s, s:s}", "job_id", ID_LATE, "title",
                          "Merge overlapping intervals", "model", MODEL_B),
                &fin, NULL);
        add_job(store,
                json_pack("{s:s, s:s, s:s, s:s}", "job_id", "still-queued",
                          "run_id", "r2", "prompt", "later", "model", MODEL_B));
        cq_store_destroy(&store);
}

/* ------------------------------------------------------------- running */

static void coderq(cq_check_proc_t *proc, const char *const *args)
{
        char bin[512];
        const char *argv[16];
        size_t i;

        snprintf(bin, sizeof(bin), "%s/coderq", cq_check_env("CQ_BINARY_DIR"));
        argv[0] = bin;
        for (i = 0; args[i] && i + 2 < CQ_ARRAY_SIZE(argv); i++)
                argv[i + 1] = args[i];
        argv[i + 1] = NULL;
        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 120000, proc), 0);
}

static const char *out_dir(void)
{
        static char dir[300];

        snprintf(dir, sizeof(dir), "%s/site", g_tmpdir);
        return dir;
}

static char *page_path(const char *id)
{
        static char path[512];
        char name[CQ_HTML_NAME_MAX];

        cq_html_page_name(id, name);
        snprintf(path, sizeof(path), "%s/jobs/%s", out_dir(), name);
        return path;
}

/* Chromium from the PATH, or NULL. */
static const char *chromium(void)
{
        static char path[512];
        const char *env = getenv("PATH");
        const char *p = env ? env : "/usr/bin";

        while (*p) {
                size_t n = strcspn(p, ":");

                if (n > 0 && n < sizeof(path) - 10) {
                        snprintf(path, sizeof(path), "%.*s/chromium", (int)n,
                                 p);
                        if (access(path, X_OK) == 0)
                                return path;
                }
                p += n;
                if (*p == ':')
                        p++;
        }
        return NULL;
}

/* Load \p file_url in headless Chromium (fresh profile, no network
 * services) in a 1280x900 window; with \p png, write a screenshot there
 * instead of dumping the DOM. Returns the DOM (caller frees) or NULL. */
static char *browse(const char *file_url, const char *png)
{
        char profile[300], dir_arg[320], shot[600];
        const char *argv[20];
        cq_check_proc_t proc;
        size_t n = 0;
        char *dom;

        snprintf(profile, sizeof(profile), "%s/profile-XXXXXX", g_tmpdir);
        ck_assert_ptr_nonnull(mkdtemp(profile));
        snprintf(dir_arg, sizeof(dir_arg), "--user-data-dir=%s", profile);
        argv[n++] = chromium();
        argv[n++] = "--headless";
        argv[n++] = "--no-sandbox";
        argv[n++] = "--disable-gpu";
        argv[n++] = "--disable-quic";
        argv[n++] = "--no-first-run";
        argv[n++] = "--disable-background-networking";
        argv[n++] = "--disable-component-update";
        argv[n++] = "--disable-sync";
        argv[n++] = "--hide-scrollbars";
        argv[n++] = dir_arg;
        /* the layout the probe measures is this window's */
        argv[n++] = "--window-size=1280,900";
        if (png) {
                snprintf(shot, sizeof(shot), "--screenshot=%s", png);
                argv[n++] = shot;
        } else {
                argv[n++] = "--dump-dom";
        }
        argv[n++] = file_url;
        argv[n] = NULL;
        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 90000, &proc), 0);
        ck_assert_msg(proc.status == 0 && !proc.timed_out,
                      "chromium exit %d: %s", proc.status, proc.err);
        ck_assert_msg(proc.out_len < CQ_CHECK_PROC_MAX_OUTPUT,
                      "the DOM of %s is too large to check", file_url);
        dom = proc.out;
        proc.out = NULL;
        cq_check_proc_release(&proc);
        ck_assert_int_eq(connections(), 0);
        return dom;
}

static char *file_url(const char *path, const char *fragment)
{
        static char buf[4][800];
        static int i;

        i = (i + 1) % 4;
        snprintf(buf[i], sizeof(buf[i]), "file://%s%s%s", path,
                 fragment ? "#" : "", fragment ? fragment : "");
        return buf[i];
}

/* ------------------------------------------------------ DOM inspection */

static size_t count(const char *hay, const char *needle)
{
        size_t n = 0;
        const char *p = hay;

        while ((p = strstr(p, needle)) != NULL) {
                n++;
                p += strlen(needle);
        }
        return n;
}

/* Walk the tags of a serialised DOM (text never holds a raw '<' followed
 * by a letter: the serialiser escapes it) and check each element is one
 * the report makes, no attribute is an event handler, and every src and
 * href stays on the page (data:) or in the report (relative). Returns
 * the number of elements. */
static size_t check_tags(const char *dom, bool index)
{
        static const char *const allowed[] = {
            "html",   "head",       "meta",    "link",    "title",   "style",
            "body",   "header",     "h1",      "h2",      "h3",      "div",
            "span",   "code",       "a",       "main",    "section", "dl",
            "dt",     "dd",         "details", "summary", "table",   "thead",
            "tbody",  "tr",         "th",      "td",      "pre",     "figure",
            "img",    "figcaption", "p",       "input",   "select",  "option",
            "button", "script",     "label"};
        const char *p = dom;
        size_t n = 0;

        while ((p = strchr(p, '<')) != NULL) {
                char name[32];
                size_t i = 0, k;
                bool ok = false;

                p++;
                if (*p == '/' || *p == '!') {
                        p++;
                        continue;
                }
                while (isalnum((unsigned char)*p) && i + 1 < sizeof(name))
                        name[i++] = (char)tolower((unsigned char)*p++);
                name[i] = '\0';
                ck_assert_msg(i > 0, "a '<' in text at: %.60s", p - 1);
                for (k = 0; k < CQ_ARRAY_SIZE(allowed); k++)
                        ok = ok || strcmp(allowed[k], name) == 0;
                ck_assert_msg(ok, "unexpected element <%s> at: %.80s", name,
                              p - 1 - i);
                ck_assert_msg(index || strcmp(name, "script") != 0,
                              "a <script> on a job page");
                n++;
                if (strcmp(name, "script") == 0 || strcmp(name, "style") == 0) {
                        /* raw text up to the end tag: ours, from the
                         * source (checked by hash in the policy) */
                        const char *end =
                            strstr(p, strcmp(name, "script") == 0 ? "</script>"
                                                                  : "</style>");

                        ck_assert_ptr_nonnull(end);
                        p = end;
                        continue;
                }
                /* attributes up to the '>' outside quotes */
                while (*p && *p != '>') {
                        char attr[64];
                        size_t a = 0;

                        while (*p == ' ' || *p == '\n' || *p == '\t' ||
                               *p == '/')
                                p++;
                        while (*p && *p != '=' && *p != ' ' && *p != '>' &&
                               a + 1 < sizeof(attr))
                                attr[a++] = (char)tolower((unsigned char)*p++);
                        attr[a] = '\0';
                        ck_assert_msg(strncmp(attr, "on", 2) != 0,
                                      "event handler %s on <%s>", attr, name);
                        if (*p == '=' && p[1] == '"') {
                                const char *v = p + 2, *end = strchr(v, '"');

                                ck_assert_ptr_nonnull(end);
                                if (strcmp(attr, "src") == 0)
                                        ck_assert_msg(
                                            strncmp(v, "data:image/", 11) == 0,
                                            "src leaves the page: %.60s", v);
                                /* the index links into jobs/ and to
                                 * its own sections, a job's page back
                                 * to it and to its other attempts */
                                if (strcmp(attr, "href") == 0)
                                        ck_assert_msg(
                                            (index &&
                                             (strncmp(v, "jobs/job-", 9) == 0 ||
                                              v[0] == '#')) ||
                                                (!index &&
                                                 (strncmp(v, "../index.html",
                                                          13) == 0 ||
                                                  strncmp(v, "job-", 4) == 0 ||
                                                  strncmp(v, "#attempts\"",
                                                          10) == 0)) ||
                                                strncmp(v, "data:,", 6) == 0,
                                            "href leaves the report: %.60s", v);
                                p = end + 1;
                        } else if (*p == '=') {
                                p++;
                                while (*p && *p != ' ' && *p != '>')
                                        p++;
                        }
                }
        }
        return n;
}

/* The job page links of the rows of the index's table of jobs, in DOM
 * order, and whether each row is hidden. */
typedef struct row {
        char href[CQ_HTML_NAME_MAX + 8];
        bool hidden;
} row_t;

static size_t rows_of(const char *dom, row_t *rows, size_t max)
{
        const char *p = strstr(dom, "<table id=\"jobs\">"), *stop;
        size_t n = 0;

        ck_assert_ptr_nonnull(p);
        p = strstr(p, "<tbody>");
        ck_assert_ptr_nonnull(p);
        stop = strstr(p, "</tbody>");
        ck_assert_ptr_nonnull(stop);
        while ((p = strstr(p, "<tr")) != NULL && p < stop && n < max) {
                const char *end = strchr(p, '>');
                const char *a = strstr(p, "href=\"jobs/");
                const char *q;

                ck_assert_ptr_nonnull(end);
                ck_assert_ptr_nonnull(a);
                rows[n].hidden = false;
                for (q = p; q < end; q++)
                        if (strncmp(q, " hidden", 7) == 0)
                                rows[n].hidden = true;
                a += 11;
                q = strchr(a, '"');
                ck_assert_ptr_nonnull(q);
                snprintf(rows[n].href, sizeof(rows[n].href), "%.*s",
                         (int)(q - a), a);
                n++;
                p = end;
        }
        return n;
}

static const char *name_of(const char *id)
{
        static char name[8][CQ_HTML_NAME_MAX];
        static int i;

        i = (i + 1) % 8;
        cq_html_page_name(id, name[i]);
        return name[i];
}

/* A screenshot of \p file_url, \p name under the build tree, to look
 * at. */
static void screenshot(const char *file_url, const char *name)
{
        char shot[600], *png;
        size_t n = 0;

        snprintf(shot, sizeof(shot), "%s/%s", cq_check_env("CQ_BINARY_DIR"),
                 name);
        unlink(shot);
        free(browse(file_url, shot));
        png = cq_check_slurp(shot, &n);
        ck_assert_uint_gt(n, 10000);
        ck_assert(memcmp(png, "\x89PNG\r\n\x1a\n", 8) == 0);
        free(png);
}

/* What the probe measured of the index in a 1280x900 window. */
typedef struct layout {
        bool page_fits;  /* the page does not scroll sideways */
        bool table_fits; /* nor does the table of jobs in its panel */
        int id_lines;    /* the most lines a job's link takes (boxes) */
        int row_max;     /* the tallest row of the table, in px */
        char late[16];   /* the column "backend": shown, hidden or none */
        char text[256];
} layout_t;

/* Set on <html> by the probe: the layout after the report's script ran
 * (it runs after it, in the same page). */
static const char PROBE_JS[] =
    "(function () {"
    " var d = document, t = d.getElementById('jobs'), w = t.parentNode,"
    "  lines = 0, tall = 0, th = d.querySelector('th[data-key=\"backend\"]'),"
    "  box = d.querySelector('#cols input[value=\"backend\"]');"
    " Array.prototype.forEach.call(t.tBodies[0].rows, function (r) {"
    "  if (r.hidden) return;"
    "  tall = Math.max(tall, Math.round(r.getBoundingClientRect().height));"
    "  var a = r.querySelector('a');"
    "  if (a) lines = Math.max(lines, a.getClientRects().length);"
    " });"
    " d.documentElement.setAttribute('data-probe', ["
    "  'page=' + (d.documentElement.scrollWidth <= innerWidth ? 1 : 0),"
    "  'table=' + (w.scrollWidth <= w.clientWidth ? 1 : 0),"
    "  'lines=' + lines, 'row=' + tall,"
    "  'late=' + (th ? (th.hidden ? 'hidden' : 'shown') : 'none'),"
    "  'box=' + (box && box.checked ? 1 : 0),"
    "  'widths=' + d.documentElement.scrollWidth + '/' + innerWidth + ','"
    "  + w.scrollWidth + '/' + w.clientWidth].join(' '));"
    "})();";

/* A copy of the page \p path beside it, without its policy and with
 * \p markup before </body>, named into \p copy: what the browser is to
 * measure or draw beyond what the page itself does. The pages themselves
 * are never changed. */
static void
copy_with(const char *path, const char *markup, char *copy, size_t size)
{
        char *page, *csp, *end, *body;
        cq_buf_t buf;

        page = cq_check_slurp(path, NULL);
        csp = strstr(page, "<meta http-equiv=\"Content-Security-Policy\"");
        ck_assert_ptr_nonnull(csp);
        end = strchr(csp, '>');
        body = strstr(page, "</body>");
        ck_assert_ptr_nonnull(end);
        ck_assert_ptr_nonnull(body);
        cq_buf_init(&buf, SIZE_MAX);
        ck_assert_int_eq(cq_buf_append(&buf, page, (size_t)(csp - page)),
                         CQ_OK);
        ck_assert_int_eq(
            cq_buf_append(&buf, end + 1, (size_t)(body - (end + 1))), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&buf, markup), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&buf, body), CQ_OK);
        snprintf(copy, size, "%s.copy.html", path);
        cq_check_spit(copy, buf.data, buf.len);
        cq_buf_release(&buf);
        free(page);
}

/* Measure the index \p path (with \p fragment, or NULL) in the browser:
 * a copy runs the probe after its own script. */
static void
probe_layout(const char *path, const char *fragment, layout_t *layout)
{
        char copy[600], script[sizeof(PROBE_JS) + 32], *dom, *attr;

        snprintf(script, sizeof(script), "<script>%s</script>", PROBE_JS);
        copy_with(path, script, copy, sizeof(copy));
        dom = browse(file_url(copy, fragment), NULL);
        unlink(copy);
        attr = strstr(dom, "data-probe=\"");
        ck_assert_msg(attr != NULL, "the probe did not run");
        attr += 12;
        snprintf(layout->text, sizeof(layout->text), "%.*s",
                 (int)strcspn(attr, "\""), attr);
        free(dom);
        ck_assert_msg(strstr(layout->text, "page=") != NULL, "%s",
                      layout->text);
        layout->page_fits = strstr(layout->text, "page=1") != NULL;
        layout->table_fits = strstr(layout->text, "table=1") != NULL;
        layout->id_lines =
            (int)strtol(strstr(layout->text, "lines=") + 6, NULL, 10);
        layout->row_max =
            (int)strtol(strstr(layout->text, "row=") + 4, NULL, 10);
        snprintf(layout->late, sizeof(layout->late), "%.*s",
                 (int)strcspn(strstr(layout->text, "late=") + 5, " "),
                 strstr(layout->text, "late=") + 5);
}

/* ---------------------------------------------------------------- tests */

static void report_ok(const char *run)
{
        const char *args[] = {"report", "--run", run, "--out", out_dir(), NULL};
        cq_check_proc_t proc;
        char want[400];

        coderq(&proc, args);
        ck_assert_msg(proc.status == 0, "exit %d: %s", proc.status, proc.err);
        snprintf(want, sizeof(want), "%s/index.html\n", out_dir());
        ck_assert_str_eq(proc.out, want);
        ck_assert_str_eq(proc.err, "");
        cq_check_proc_release(&proc);
}

START_TEST(report_files_escape_everything)
{
        char path[400], *page;
        size_t i;

        make_run();
        report_ok("r1");

        snprintf(path, sizeof(path), "%s/index.html", out_dir());
        page = cq_check_slurp(path, NULL);
        /* one script, ours; the hostile id and title only as text */
        ck_assert_uint_eq(count(page, "<script"), 1);
        ck_assert_ptr_null(strstr(page, "<script>alert"));
        ck_assert_ptr_null(strstr(page, "<img src=x"));
        ck_assert_ptr_nonnull(
            strstr(page, "&lt;script&gt;alert(1)&lt;/script&gt;</a>"));
        ck_assert_ptr_nonnull(
            strstr(page, "&lt;img src=x onerror=alert(7)&gt; title"));
        ck_assert_ptr_nonnull(strstr(page, "q&quot;uote&#39;&amp;amp;</a>"));
        /* the id with a newline, and its unsafe bytes out of its name */
        ck_assert_ptr_nonnull(strstr(page, "evil\n&lt;b&gt;x&lt;/b&gt;</a>"));
        ck_assert_ptr_nonnull(strstr(page, "href=\"jobs/job-evil__b_x__b_-"));
        ck_assert_uint_eq(count(page, "<tr data-status="), NJOBS);
        ck_assert_ptr_null(strstr(page, "http://"));
        free(page);

        for (i = 0; i < NJOBS; i++) {
                const char *name = name_of(job_ids(i));
                size_t j;

                for (j = 0; name[j]; j++)
                        ck_assert_msg(isalnum((unsigned char)name[j]) ||
                                          strchr("-_.", name[j]),
                                      "unsafe page name %s", name);
                ck_assert_uint_le(strlen(name), 70);
                page = cq_check_slurp(page_path(job_ids(i)), NULL);
                ck_assert_uint_eq(count(page, "<script"), 0);
                ck_assert_ptr_nonnull(strstr(page, "script-src 'none'"));
                ck_assert_ptr_nonnull(strstr(page, "href=\"../index.html\""));
                free(page);
        }

        page = cq_check_slurp(page_path(ID_HOSTILE), NULL);
        ck_assert_ptr_null(strstr(page, "<img src=x"));
        ck_assert_ptr_null(strstr(page, "<iframe"));
        ck_assert_ptr_null(strstr(page, "<svg"));
        ck_assert_ptr_null(strstr(page, "\x1b"));
        ck_assert_ptr_null(strstr(page, "[0;31m"));
        ck_assert_ptr_null(strstr(page, "src=\"http"));
        ck_assert_ptr_null(strstr(page, "href=\"http"));
        /* the notebook's PNG, its SVG and the two stored images not in
         * the notebook are drawn; the PNG stored twice only once; the BMP
         * is only named */
        ck_assert_uint_eq(count(page, "<img src=\"data:image/png;base64,"), 2);
        ck_assert_uint_eq(count(page, "<img src=\"data:image/svg+xml;base64,"),
                          2);
        ck_assert_uint_eq(count(page, "<img "), 4);
        ck_assert_ptr_nonnull(strstr(page, "raw.bmp &middot; image/bmp"));
        ck_assert_ptr_nonnull(
            strstr(page, "evil&lt;img src=x onerror=alert(6)&gt;.png"));
        /* the tool result as the model saw it, ANSI colours removed */
        ck_assert_ptr_nonnull(
            strstr(page, "&lt;/script&gt;\nred &lt;img src=&quot;http"));
        ck_assert_ptr_nonnull(strstr(page, "[image/png output not shown"));
        ck_assert_ptr_nonnull(strstr(page, "text/html (shown as text)"));
        ck_assert_ptr_nonnull(
            strstr(page, "warn &lt;b&gt;x&lt;/b&gt;\xe2\x90\x81"));
        ck_assert_ptr_nonnull(strstr(page, "ValueError: &lt;bad&gt;\n"
                                           "-----------------------------\n"
                                           "ValueError: &lt;bad&gt;"));
        free(page);
}
END_TEST

START_TEST(report_in_a_browser)
{
        char index[400], *dom;
        layout_t layout;
        row_t rows[NJOBS + 1];
        size_t n, i;

        if (!chromium())
                CQ_CHECK_SKIP("chromium", "chromium is not on the PATH "
                                          "(Debian's package \"chromium\")");
        make_run();
        report_ok("r1");
        snprintf(index, sizeof(index), "%s/index.html", out_dir());

        /* the index as built: the script ran, the style applied, every row
         * is there and shown, in the run's order */
        dom = browse(file_url(index, NULL), NULL);
        ck_assert_ptr_nonnull(
            strstr(dom, "<html lang=\"en\" data-report=\"ready\""));
        check_tags(dom, true);
        ck_assert_ptr_null(strstr(dom, "data-pwned=\""));
        ck_assert_ptr_nonnull(
            strstr(dom, "&lt;script&gt;alert(1)&lt;/script&gt;</a>"));
        n = rows_of(dom, rows, CQ_ARRAY_SIZE(rows));
        ck_assert_uint_eq(n, NJOBS);
        for (i = 0; i < n; i++) {
                ck_assert_str_eq(rows[i].href, name_of(job_ids(i)));
                ck_assert(!rows[i].hidden);
        }
        ck_assert_ptr_nonnull(strstr(dom, "<span id=\"shown\">8</span>"));
        free(dom);

        /* filtered by status and sorted by tokens, from the fragment */
        dom = browse(
            file_url(index, "status=failed&sort=total_tokens&dir=desc"), NULL);
        n = rows_of(dom, rows, CQ_ARRAY_SIZE(rows));
        ck_assert_uint_eq(n, NJOBS);
        ck_assert_str_eq(rows[0].href, name_of(ID_HOSTILE));
        ck_assert_str_eq(rows[1].href, name_of(ID_QUOTE));
        ck_assert_str_eq(rows[2].href, name_of(ID_PASSWD));
        ck_assert_str_eq(rows[3].href, name_of(ID_OK));
        ck_assert(rows[0].hidden);
        ck_assert(!rows[1].hidden);
        ck_assert(!rows[2].hidden);
        for (i = 3; i < n; i++)
                ck_assert(rows[i].hidden);
        ck_assert_ptr_nonnull(strstr(dom, "<span id=\"shown\">2</span>"));
        ck_assert_ptr_nonnull(strstr(
            dom, "data-key=\"total_tokens\" data-type=\"num\" class=\"num\" "
                 "aria-sort=\"descending\""));
        free(dom);

        /* the text filter, over the id, and ascending tests */
        dom =
            browse(file_url(index, "q=PASSWD&sort=tests_passed&dir=asc"), NULL);
        n = rows_of(dom, rows, CQ_ARRAY_SIZE(rows));
        ck_assert_uint_eq(n, NJOBS);
        for (i = 0; i < n; i++)
                ck_assert_msg(
                    rows[i].hidden ==
                        (strcmp(rows[i].href, name_of(ID_PASSWD)) != 0),
                    "row %zu %s", i, rows[i].href);
        /* no tests (-1) first, in the run's order, then 0/2, 1/2, 2/2 */
        ck_assert_str_eq(rows[0].href, name_of(ID_QUEUED));
        ck_assert_str_eq(rows[1].href, name_of(ID_NEWLINE));
        ck_assert_str_eq(rows[2].href, name_of(g_long_id));
        ck_assert_str_eq(rows[3].href, name_of(ID_QUOTE));
        ck_assert_str_eq(rows[4].href, name_of(ID_PASSWD));
        ck_assert_str_eq(rows[5].href, name_of(ID_HOSTILE));
        ck_assert_ptr_nonnull(strstr(dom, "<span id=\"shown\">1</span>"));
        free(dom);

        /* a hostile fragment is data: nothing breaks, nothing is matched */
        dom = browse(file_url(index, "q=%E0%A4%A&status=%3Cscript%3E&sort="
                                     "constructor&dir=__proto__"),
                     NULL);
        ck_assert_ptr_nonnull(strstr(dom, "data-report=\"ready\""));
        ck_assert_ptr_nonnull(strstr(dom, "<span id=\"shown\">8</span>"));
        check_tags(dom, true);
        free(dom);

        /* the hostile job's page as the browser built it */
        dom = browse(file_url(page_path(ID_HOSTILE), NULL), NULL);
        ck_assert_uint_gt(check_tags(dom, false), 50);
        ck_assert_ptr_null(strstr(dom, "data-pwned=\""));
        ck_assert_ptr_nonnull(strstr(
            dom, "<title>&lt;img src=x onerror=alert(7)&gt; title - coderq "
                 "run r1</title>"));
        ck_assert_ptr_nonnull(
            strstr(dom, "&lt;script&gt;document.title='pwned'&lt;/script&gt;"
                        "&lt;img src=x onerror=\"document.body.setAttribute("
                        "'data-pwned','1')\"&gt;"));
        ck_assert_ptr_nonnull(strstr(dom,
                                     "&lt;think&gt;&lt;img src=x "
                                     "onerror=alert(2)&gt;&lt;/think&gt;"));
        ck_assert_ptr_nonnull(strstr(dom, "print('&lt;script&gt;alert(1)&lt;"
                                          "/script&gt;')\n&lt;/pre&gt;&lt;b&gt;"
                                          "code&lt;/b&gt;"));
        ck_assert_uint_eq(count(dom, "<img "), 4);
        ck_assert_ptr_null(strstr(dom, "\x1b"));
        free(dom);

        /* every other page loads and holds only our elements */
        for (i = 1; i < NJOBS; i++) {
                dom = browse(file_url(page_path(job_ids(i)), NULL), NULL);
                check_tags(dom, false);
                free(dom);
        }

        /* the layout, with the longest id there is */
        probe_layout(index, NULL, &layout);
        ck_assert_msg(layout.page_fits && layout.table_fits &&
                          layout.id_lines == 1 && layout.row_max <= 40,
                      "%s", layout.text);

        /* the hostile job's page, to look at */
        screenshot(file_url(page_path(ID_HOSTILE), NULL), "report-job.png");
}
END_TEST

START_TEST(report_reads_at_a_glance)
{
        static const char chosen[] =
            "cols=job_id,title,model,status,verdict,tests_passed,turns,"
            "cost_usd,duration_ms,backend";
        char index[400], want[400], copy[600], *dom, *p;
        row_t rows[R2_JOBS + 1];
        layout_t layout;
        size_t n;

        if (!chromium())
                CQ_CHECK_SKIP("chromium", "chromium is not on the PATH "
                                          "(Debian's package \"chromium\")");
        make_run2();
        report_ok("r2");
        snprintf(index, sizeof(index), "%s/index.html", out_dir());

        /* every attempt has a page */
        ck_assert_int_eq(access(page_path(ID_FLAKY), R_OK), 0);
        ck_assert_int_eq(access(page_path(ID_FLAKY "~r2"), R_OK), 0);
        ck_assert_int_eq(access(page_path(ID_FLAKY "~r3"), R_OK), 0);

        /* the index: the latest attempt of each job, its count, the
         * models, the grid */
        dom = browse(file_url(index, NULL), NULL);
        check_tags(dom, true);
        n = rows_of(dom, rows, CQ_ARRAY_SIZE(rows));
        ck_assert_uint_eq(n, R2_JOBS);
        ck_assert_str_eq(rows[1].href, name_of(ID_FLAKY "~r3"));
        ck_assert_ptr_nonnull(strstr(dom, "18 jobs (20 attempts)"));
        ck_assert_ptr_nonnull(strstr(dom, "\xc3\x97"
                                          "3</span>")); /* U+00D7 */
        ck_assert_ptr_nonnull(strstr(dom, "<span id=\"shown\">18</span>"));
        /* the 40-byte id, shortened; whole on hover and in its page */
        ck_assert_ptr_nonnull(strstr(dom, "title=\"" ID_40
                                          "\">eval-2025-12-06-hu\xe2\x80\xa6"
                                          "4f9c2a7e1</a>"));
        p = strstr(dom, "<section id=\"models\">");
        ck_assert_ptr_nonnull(p);
        ck_assert_ptr_nonnull(strstr(p, "<th class=\"num\">pass@1</th>"));
        ck_assert_ptr_nonnull(strstr(p, "all models</td>"));
        p = strstr(dom, "<section id=\"samples\">");
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq(count(p, "<a class=\"sq "), 13);
        ck_assert_uint_eq(count(p, "<tr><td><span class=\"clip\""), 3);
        snprintf(want, sizeof(want),
                 "<a class=\"sq v-syntax_error\" href=\"jobs/%s\"",
                 name_of("HumanEval/7-b~s2"));
        ck_assert_ptr_nonnull(strstr(p, want));
        /* the field only the last job has: a column to choose */
        ck_assert_ptr_nonnull(
            strstr(dom, "<th hidden=\"\" data-key=\"backend\""));
        ck_assert_ptr_nonnull(strstr(dom, "value=\"backend\""));
        free(dom);

        /* at 1280x900 the default table fits its panel, one line a row;
         * the field is there to choose */
        probe_layout(index, NULL, &layout);
        ck_assert_msg(layout.page_fits && layout.table_fits &&
                          layout.id_lines == 1 && layout.row_max <= 40 &&
                          strcmp(layout.late, "hidden") == 0 &&
                          strstr(layout.text, "box=0") != NULL,
                      "%s", layout.text);
        /* chosen in the fragment, its column shows, with the last job's
         * value; the page still does not scroll sideways */
        probe_layout(index, chosen, &layout);
        ck_assert_msg(layout.page_fits && strcmp(layout.late, "shown") == 0 &&
                          strstr(layout.text, "box=1") != NULL,
                      "%s", layout.text);
        dom = browse(file_url(index, chosen), NULL);
        ck_assert_ptr_nonnull(strstr(dom, "<th data-key=\"backend\""));
        ck_assert_ptr_nonnull(
            strstr(dom, "<td><span class=\"clip\">e2b</span>"));
        free(dom);

        /* the retry chain, both ways: the middle attempt links to the
         * original and the last, the original to both retries */
        dom = browse(file_url(page_path(ID_FLAKY "~r2"), NULL), NULL);
        check_tags(dom, false);
        snprintf(want, sizeof(want), "<a href=\"%s\"><code>" ID_FLAKY "</code>",
                 name_of(ID_FLAKY));
        ck_assert_ptr_nonnull(strstr(dom, want));
        snprintf(want, sizeof(want),
                 "<a href=\"%s\"><code>" ID_FLAKY "~r3</code>",
                 name_of(ID_FLAKY "~r3"));
        ck_assert_ptr_nonnull(strstr(dom, want));
        ck_assert_ptr_nonnull(strstr(dom, "attempt 2 of 3"));
        free(dom);
        dom = browse(file_url(page_path(ID_FLAKY), NULL), NULL);
        check_tags(dom, false);
        ck_assert_uint_eq(count(dom, "<a href=\"job-flaky-parse_r"), 2);
        free(dom);
        dom = browse(file_url(page_path("HumanEval/12~s1"), NULL), NULL);
        check_tags(dom, false);
        ck_assert_ptr_nonnull(
            strstr(dom, "sample 1 of problem <code>HumanEval/12</code>"));
        free(dom);

        /* to look at */
        screenshot(file_url(index, NULL), "report-index.png");
        screenshot(file_url(page_path(ID_FLAKY "~r2"), NULL),
                   "report-retry.png");
        /* headless Chromium draws a page scrolled to an anchor as if it
         * were not: the grid's picture is of a copy that shows the header
         * and the grid alone */
        copy_with(index,
                  "<style>#figures,#models,#jobs-section{display:none}"
                  "</style>",
                  copy, sizeof(copy));
        screenshot(file_url(copy, NULL), "report-samples.png");
        unlink(copy);
}
END_TEST

START_TEST(report_exit_codes)
{
        const char *none[] = {"report", "--run",   "nope",
                              "--out",  out_dir(), NULL};
        const char *usage[] = {"report", "--run", "r1", NULL};
        const char *extra[] = {"report",  "--run", "r1", "--out",
                               out_dir(), "more",  NULL};
        char blocked[400];
        const char *unwritable[] = {"report", "--run", "r1",
                                    "--out",  blocked, NULL};
        cq_check_proc_t proc;

        make_run();
        coderq(&proc, none);
        ck_assert_int_eq(proc.status, 5);
        ck_assert_str_eq(proc.err, "coderq: no jobs in run \"nope\"\n");
        ck_assert_str_eq(proc.out, "");
        cq_check_proc_release(&proc);
        ck_assert_int_ne(access(out_dir(), F_OK), 0);

        coderq(&proc, usage);
        ck_assert_int_eq(proc.status, 2);
        cq_check_proc_release(&proc);
        coderq(&proc, extra);
        ck_assert_int_eq(proc.status, 2);
        cq_check_proc_release(&proc);

        /* a file where the folder should go */
        snprintf(blocked, sizeof(blocked), "%s/file", g_tmpdir);
        cq_check_spit(blocked, "x", 1);
        snprintf(blocked, sizeof(blocked), "%s/file/site", g_tmpdir);
        coderq(&proc, unwritable);
        ck_assert_int_eq(proc.status, 1);
        ck_assert_msg(
            strncmp(proc.err, "coderq: could not create directory", 34) == 0,
            "%s", proc.err);
        cq_check_proc_release(&proc);

        setenv("CODERQ_PG_DSN", "postgresql://nobody@127.0.0.1:1/none", 1);
        coderq(&proc, none);
        ck_assert_int_eq(proc.status, 4);
        ck_assert_msg(strncmp(proc.err, "coderq: ", 8) == 0 &&
                          strchr(proc.err, '\n') ==
                              proc.err + strlen(proc.err) - 1,
                      "[%s]", proc.err);
        cq_check_proc_release(&proc);
}
END_TEST

static Suite *it_report_suite(void)
{
        Suite *s = suite_create("it_report");
        TCase *tc = tcase_create("core");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, report_files_escape_everything);
        tcase_add_test(tc, report_in_a_browser);
        tcase_add_test(tc, report_reads_at_a_glance);
        tcase_add_test(tc, report_exit_codes);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(it_report_suite)
