/* SPDX-License-Identifier: MIT */
/* check_runner.c - the light interpreter (runner.c, runner.py) and the
 * judging interpreter's process (judgeproc.c) against the real
 * /usr/bin/python3: cells, outputs, errors and their tracebacks,
 * timeouts, deaths, cancels, the output cap, forged replies, files, and
 * the sandbox really applied (no network, the work dir only, the leased
 * uid, the scrubbed environment); the judge's protocol round trip through
 * cq_judge_run() with a played candidate, its kill on destroy and its
 * sandbox. With CQ_CHECK_KSERVER=on (ctest's check_runner_forked) every
 * runner and judge is forked by a kernel server and each start asserts
 * it was; otherwise they start cold. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/agent/judge.h"
#include "coderq/agent/testrun.h"
#include "coderq/backend/backend.h"
#include "coderq/common/config.h"
#include "coderq/common/job.h"
#include "coderq/common/util.h"
#include "coderq/interp/collect.h"
#include "coderq/local/judgeproc.h"
#include "coderq/local/kpool.h"
#include "coderq/local/runner.h"
#include "coderq/local/sandbox.h"
#include "coderq/local/workdir.h"
#include "support/cells.h"
#include "support/loopback.h"

/* Work root of this run, set before the test processes fork. */
static char root[256];

static void root_setup(void)
{
        snprintf(root, sizeof(root), "/tmp/cqcheck-runner-%ld", (long)getpid());
}

/* What the forked mode's kernel server imports: little, it starts in
 * every test process. */
#define TEST_PRELOAD "json"

/* The sandbox in \p mode under root, with a kernel's rlimits. */
static cq_sandbox_t *new_sandbox(cq_sandbox_mode_t mode)
{
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        char errstr[512];

        mkdir(root, 0711);
        sopts.mode = mode;
        sopts.probe_dir = root;
        sopts.mem = 4UL << 30;
        sopts.nproc = 512;
        sopts.fsize = 1UL << 30;
        if (geteuid() == 0) {
                sopts.uid_first = CQ_SANDBOX_UIDS_FIRST;
                sopts.uid_last = CQ_SANDBOX_UIDS_LAST;
        }
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        return sandbox;
}

static cq_interp_t *
start_runner(const cq_sandbox_t *sandbox, size_t out_max, int64_t grace_ms)
{
        cq_runner_opts_t opts;
        char errstr[700] = "";
        cq_interp_t *interp;

        memset(&opts, 0, sizeof(opts));
        opts.work_root = root;
        opts.sandbox = sandbox;
        opts.output_max = out_max;
        opts.interrupt_grace_ms = grace_ms;
        opts.kserver = cq_check_kserver(sandbox, root, TEST_PRELOAD);
        interp = cq_runner_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(interp != NULL, "runner start failed: %s", errstr);
        ck_assert(cq_runner_is(interp));
        ck_assert_msg(cq_runner_forked(interp) == cq_check_forked_mode(),
                      "the runner was %s",
                      cq_check_forked_mode() ? "not forked" : "forked");
        return interp;
}

static const char *ename_of(const cq_cell_result_t *res)
{
        return json_string_value(
            json_object_get(cq_check_find_output(res, "error"), "ename"));
}

/* Destroy \p interp and check that its work dir went with it. */
static void destroy_runner(cq_interp_t **interpp)
{
        char dir[PATH_MAX];

        snprintf(dir, sizeof(dir), "%s", cq_runner_work_dir(*interpp));
        cq_interp_destroy(interpp);
        ck_assert_msg(access(dir, F_OK) != 0 && errno == ENOENT,
                      "the runner's work dir %s outlived it", dir);
}

static int ncallbacks;

static void count_output(void *opaque, const json_t *output)
{
        (void)opaque;
        ck_assert_ptr_nonnull(json_object_get(output, "output_type"));
        ncallbacks++;
}

START_TEST(cells_outputs_and_errors)
{
        cq_interp_t *interp = start_runner(NULL, 0, 0);
        cq_exec_opts_t opts = {0};
        cq_cell_result_t res;
        const json_t *out, *tb;
        char *text, *tbtext;

        ck_assert_str_eq(cq_interp_backend(interp), "local");
        /* stdout, stderr, and fds 1 and 2 themselves (a subprocess) */
        opts.timeout_ms = 30000;
        opts.on_output = count_output;
        cq_cell_result_init(&res);
        ck_assert_int_eq(
            cq_interp_execute(interp,
                              "import os, subprocess, sys\nx = 40\n"
                              "print('out')\nprint('err', file=sys.stderr)\n"
                              "os.write(1, b'raw\\n')\n"
                              "subprocess.run(['echo', 'sub'])",
                              &opts, &res),
            CQ_OK);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_int_eq(res.execution_count, 1);
        text = cq_check_stream_text(&res, "stdout");
        ck_assert_str_eq(text, "out\nraw\nsub\n");
        free(text);
        text = cq_check_stream_text(&res, "stderr");
        ck_assert_str_eq(text, "err\n");
        free(text);
        ck_assert_int_gt(ncallbacks, 0);
        cq_cell_result_release(&res);
        /* the last expression's value, as a kernel shows it */
        cq_check_cell(interp, "x + 2", 30000, &res);
        out = cq_check_find_output(&res, "execute_result");
        ck_assert_ptr_nonnull(out);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(out, "data"), "text/plain")),
                         "42");
        ck_assert_int_eq(
            json_integer_value(json_object_get(out, "execution_count")), 2);
        ck_assert_int_eq(res.execution_count, 2);
        cq_cell_result_release(&res);
        /* an exception: its name, text, and a traceback of the cell's own
         * frames only */
        cq_check_cell(interp, "def f():\n    return 1 / 0\nf()", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(ename_of(&res), "ZeroDivisionError");
        out = cq_check_find_output(&res, "error");
        ck_assert_str_eq(json_string_value(json_object_get(out, "evalue")),
                         "division by zero");
        tb = json_object_get(out, "traceback");
        tbtext = json_dumps(tb, 0);
        ck_assert_ptr_nonnull(strstr(tbtext, "<cell-3>"));
        ck_assert_ptr_nonnull(strstr(tbtext, "return 1 / 0"));
        ck_assert_ptr_null(strstr(tbtext, "<string>"));
        free(tbtext);
        cq_cell_result_release(&res);
        cq_check_cell(interp, "def (", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(ename_of(&res), "SyntaxError");
        cq_cell_result_release(&res);
        /* SystemExit is the cell's error; the runner goes on */
        cq_check_cell(interp, "raise SystemExit(3)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(ename_of(&res), "SystemExit");
        cq_cell_result_release(&res);
        /* one namespace, __main__'s, as the test harness needs it */
        cq_check_stdout(interp,
                        "import __main__\nexec('y = x + 1', globals())\n"
                        "print(y, __name__, globals() is __main__.__dict__)",
                        "41 __main__ True\n");
        /* no input: it fails at once */
        cq_check_cell(interp, "input()", 30000, &res);
        ck_assert_str_eq(ename_of(&res), "EOFError");
        cq_cell_result_release(&res);
        /* a character split between two reads of the pipe is joined; a
         * byte that is not UTF-8 is U+FFFD */
        cq_check_cell(interp,
                      "import os\ns = '\\u20ac' * 40000\n"
                      "os.write(1, s.encode() + b'\\xff\\n')\nprint(len(s))",
                      30000, &res);
        text = cq_check_stream_text(&res, "stdout");
        ck_assert_uint_eq(strlen(text), 40000 * 3 + 3 + 1 + 6);
        ck_assert_str_eq(text + 40000 * 3, "\xef\xbf\xbd\n40000\n");
        ck_assert(cq_utf8_valid(text, strlen(text)));
        free(text);
        cq_cell_result_release(&res);
        ck_assert_ptr_nonnull(cq_interp_env(interp));
        ck_assert_ptr_nonnull(json_object_get(cq_interp_env(interp), "python"));
        destroy_runner(&interp);
}
END_TEST

/* A timeout kills the runner, and what the cell printed before it hung
 * is there; later cells die until a restart, which starts afresh. */
START_TEST(timeout_and_death_lose_the_runner)
{
        cq_interp_t *interp = start_runner(NULL, 0, 0);
        cq_cell_result_t res;
        char *text;

        cq_check_stdout(interp, "v = 1", "");
        cq_check_cell(interp, "print('start')\nwhile True: pass", 1000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_TIMEOUT);
        ck_assert(res.state_lost);
        ck_assert_str_eq(ename_of(&res), "TimeoutError");
        text = cq_check_stream_text(&res, "stdout");
        ck_assert_str_eq(text, "start\n");
        free(text);
        cq_cell_result_release(&res);
        cq_check_cell(interp, "print(v)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(res.state_lost);
        ck_assert_str_eq(ename_of(&res), "DeadKernelError");
        cq_cell_result_release(&res);
        ck_assert_int_eq(cq_interp_restart(interp), CQ_OK);
        ck_assert_msg(cq_runner_forked(interp) == cq_check_forked_mode(),
                      "the restart's mode");
        cq_check_stdout(interp, "print('v' in dir())", "False\n");
        /* it dies by its own hand: seen by its exit */
        cq_check_cell(interp, "import os\nos._exit(3)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert_str_eq(ename_of(&res), "DeadKernelError");
        cq_cell_result_release(&res);
        ck_assert_int_eq(cq_interp_restart(interp), CQ_OK);
        /* it closes its control socket: seen by its end */
        cq_check_cell(interp, "import os\nos.closerange(3, 4096)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        cq_cell_result_release(&res);
        cq_check_cell(interp, "print(1)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        cq_cell_result_release(&res);
        destroy_runner(&interp);
}
END_TEST

/* A cancel interrupts the cell and keeps the runner; one that the code
 * ignores kills it after the grace. An interrupt from another thread is
 * the cell's KeyboardInterrupt. */
/* The interrupt's grace of the runners that cancel_and_interrupt_in()
 * runs: long enough for a busy machine (or valgrind) to answer a SIGINT
 * within it, which it waits out once, for a cell that ignores it. */
#define CANCEL_GRACE_MS 3000

static void cancel_and_interrupt_in(cq_interp_t *interp)
{
        cq_exec_opts_t opts = {0};
        atomic_int cancel = 0;
        cq_check_running_t cell;
        cq_cell_result_t res;
        pthread_t thread;

        memset(&cell, 0, sizeof(cell));
        cell.interp = interp;
        cell.cancel = &cancel;
        snprintf(cell.mark, sizeof(cell.mark), "%s/running.mark",
                 cq_runner_work_dir(interp));
        cq_check_stdout(interp, "import time, signal\nkeep = 5", "");
        opts.cancel = &cancel;
        pthread_create(&thread, NULL, cq_check_act_when_running, &cell);
        cq_cell_result_init(&res);
        ck_assert_int_eq(
            cq_interp_execute(interp, CQ_CHECK_MARKED_SLEEP, &opts, &res),
            CQ_OK);
        pthread_join(thread, NULL);
        ck_assert_msg(cell.ran, "the cell never ran");
        ck_assert_int_eq(res.status, CQ_CELL_CANCELLED);
        ck_assert(!res.state_lost);
        ck_assert_str_eq(ename_of(&res), "KeyboardInterrupt");
        cq_cell_result_release(&res);
        ck_assert_int_eq(unlink(cell.mark), 0);
        cell.cancel = NULL;
        cell.interrupt = -1;
        pthread_create(&thread, NULL, cq_check_act_when_running, &cell);
        cq_check_cell(interp, CQ_CHECK_MARKED_SLEEP, 0, &res);
        pthread_join(thread, NULL);
        ck_assert_int_eq(cell.interrupt, 0);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(ename_of(&res), "KeyboardInterrupt");
        cq_cell_result_release(&res);
        ck_assert_int_eq(unlink(cell.mark), 0);
        cq_check_stdout(interp, "print(keep)", "5\n");
        /* the code will not be interrupted: killed after the grace */
        atomic_store(&cancel, 0);
        cell.cancel = &cancel;
        pthread_create(&thread, NULL, cq_check_act_when_running, &cell);
        cq_cell_result_init(&res);
        ck_assert_int_eq(
            cq_interp_execute(interp,
                              "signal.signal(signal.SIGINT, "
                              "signal.SIG_IGN)\n" CQ_CHECK_MARKED_SLEEP,
                              &opts, &res),
            CQ_OK);
        pthread_join(thread, NULL);
        ck_assert_int_eq(res.status, CQ_CELL_CANCELLED);
        ck_assert(res.state_lost);
        ck_assert_str_eq(ename_of(&res), "Cancelled");
        cq_cell_result_release(&res);
}

START_TEST(cancel_and_interrupt)
{
        cq_interp_t *interp = start_runner(NULL, 0, CANCEL_GRACE_MS);

        cancel_and_interrupt_in(interp);
        destroy_runner(&interp);
}
END_TEST

/* A cell's outputs are capped as a kernel's are: head and tail around
 * one marker, in bounded time and memory. */
START_TEST(output_is_capped)
{
        cq_interp_t *interp = start_runner(NULL, 64 * 1024, 0);
        cq_cell_result_t res;
        const char *repr;
        char *text;
        int64_t t0 = cq_now_ms();

        cq_check_cell(interp,
                      "import sys, os\nprint('first')\n"
                      "for i in range(200000): print('x' * 50)\n"
                      "os.write(1, b'y' * (8 << 20))\nprint('\\nlast')",
                      120000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.truncated);
        text = cq_check_stream_text(&res, "stdout");
        ck_assert_msg(strncmp(text, "first\n", 6) == 0, "head lost");
        ck_assert_msg(strlen(text) > 5 &&
                          strcmp(text + strlen(text) - 5, "last\n") == 0,
                      "tail lost");
        ck_assert_uint_le(strlen(text), 64 * 1024);
        free(text);
        /* the marker between them, as the collector writes it */
        text = cq_check_stream_text(&res, "stderr");
        ck_assert_ptr_nonnull(strstr(text, CQ_COLLECT_MARK));
        free(text);
        cq_cell_result_release(&res);
        ck_assert_int_lt(cq_now_ms() - t0, 60000);
        /* a repr too large to show is cut where it is made, to an eighth
         * of the cap */
        cq_check_cell(interp, "'z' * (1 << 20)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        repr = json_string_value(json_object_get(
            json_object_get(cq_check_find_output(&res, "execute_result"),
                            "data"),
            "text/plain"));
        ck_assert_uint_eq(strlen(repr), 8 * 1024 + 3);
        ck_assert_str_eq(repr + 8 * 1024, "...");
        cq_cell_result_release(&res);
        destroy_runner(&interp);
}
END_TEST

/* The code can write on the control socket (it is in the same process).
 * A line for no cell is ignored, a line over the cap skipped, a forged
 * reply for its own cell ends that cell with what it claims, and the
 * real reply that follows is ignored; a line with the cell's marker that
 * is no reply ends the runner. Nothing of that reaches another cell. */
START_TEST(forged_replies_touch_only_their_cell)
{
        cq_interp_t *interp = start_runner(NULL, 64 * 1024, 0);
        cq_cell_result_t res;

        cq_check_stdout(
            interp,
            "import os, sys, socket, stat, time\n"
            "def ctl():\n"
            "    for e in os.listdir('/proc/self/fd'):\n"
            "        try:\n"
            "            if stat.S_ISSOCK(os.fstat(int(e)).st_mode):\n"
            "                return int(e)\n"
            "        except OSError:\n"
            "            pass\n"
            "def marker():\n"
            "    return sys._getframe(3).f_locals['cell']\n"
            "print(ctl() is not None)",
            "True\n");
        /* another cell's marker, and a line over the cap: ignored */
        cq_check_cell(
            interp,
            "os.write(ctl(), b'0123 {\"ok\": true, \"count\": 9}\\n')\n"
            "os.write(ctl(), b'x' * (1 << 20) + b'\\n')\n"
            "print('own')",
            30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_int_ne(res.execution_count, 9);
        cq_cell_result_release(&res);
        /* its own reply, forged: the cell ends with what it claims */
        cq_check_cell(interp,
                      "os.write(ctl(), marker() + b' {\"ok\": false, "
                      "\"count\": 77, \"ename\": \"Forged\", \"evalue\": "
                      "\"claimed\", \"traceback\": []}\\n')\n"
                      "time.sleep(0.5)\nprint('late')",
                      30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(ename_of(&res), "Forged");
        ck_assert_int_eq(res.execution_count, 77);
        cq_cell_result_release(&res);
        /* the next cell is its own: the forged cell's real reply is
         * another marker's */
        cq_check_cell(interp, "print('next')", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_ptr_nonnull(cq_check_find_output(&res, "stream"));
        cq_cell_result_release(&res);
        cq_check_stdout(interp, "print('clean')", "clean\n");
        /* its own marker on a line that is no reply: the runner is done */
        cq_check_cell(interp,
                      "os.write(ctl(), marker() + b' not json\\n')\n"
                      "time.sleep(5)",
                      30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(res.state_lost);
        cq_cell_result_release(&res);
        destroy_runner(&interp);
}
END_TEST

/* Input files in, created files out, through the work dir's rules. */
START_TEST(files_in_and_out)
{
        cq_interp_t *interp = start_runner(NULL, 0, 0);
        cq_files_t files;
        cq_file_t file;
        size_t i;
        bool out = false, sub = false;

        ck_assert_int_eq(cq_interp_put_file(interp, "data/in.txt", "input", 5),
                         CQ_OK);
        ck_assert_int_eq(cq_interp_put_file(interp, "../x", "x", 1),
                         CQ_ERR_FATAL);
        cq_check_stdout(
            interp,
            "import os\nprint(open('data/in.txt').read())\n"
            "open('out.txt', 'w').write('made')\n"
            "os.makedirs('sub')\nopen('sub/o.csv', 'w').write('a,b')\n"
            "print(os.getcwd() == os.environ['HOME'])",
            "input\nTrue\n");
        ck_assert_int_eq(cq_interp_created_files(interp, true, &files), CQ_OK);
        ck_assert_uint_eq(files.n, 2);
        for (i = 0; i < files.n; i++) {
                out = out || strcmp(files.v[i].name, "out.txt") == 0;
                sub = sub || strcmp(files.v[i].name, "sub/o.csv") == 0;
        }
        ck_assert(out && sub);
        cq_files_release(&files);
        ck_assert_int_eq(cq_interp_get_file(interp, "out.txt", 100, &file),
                         CQ_OK);
        ck_assert_uint_eq(file.len, 4);
        ck_assert_int_eq(memcmp(file.data, "made", 4), 0);
        free(file.name);
        free(file.mime);
        free(file.data);
        ck_assert_int_eq(cq_interp_get_file(interp, "out.txt", 2, &file),
                         CQ_ERR_TOO_LARGE);
        destroy_runner(&interp);
}
END_TEST

/* The sandbox in auto mode, or NULL and \p why when bubblewrap does not
 * work here. */
static cq_sandbox_t *bwrap_sandbox(char *why, size_t size)
{
        cq_sandbox_t *sandbox = new_sandbox(CQ_SANDBOX_AUTO);

        if (cq_sandbox_enabled(sandbox))
                return sandbox;
        snprintf(why, size, "bubblewrap does not work here: %s",
                 cq_sandbox_reason(sandbox));
        cq_sandbox_destroy(&sandbox);
        return NULL;
}

/* Python that prints what a sandbox lets through, a line each: a
 * connection to our loopback \p port, a write to /etc, a read of
 * /etc/shadow, whether the work root holds only its own work dir,
 * whether our secret reached its environment, its uid. */
static void escape_probe(char *code, size_t size, int port)
{
        snprintf(code, size,
                 "import socket, os\n"
                 "def tryit(f):\n"
                 "    try:\n        f()\n        return 'ok'\n"
                 "    except Exception as e:\n"
                 "        return type(e).__name__\n"
                 "print(tryit(lambda: socket.create_connection(('127.0.0.1', "
                 "%d), timeout=3)))\n"
                 "print(tryit(lambda: open('/etc/coderq-escape', 'w')))\n"
                 "print(tryit(lambda: open('/etc/shadow').read()))\n"
                 "print(os.listdir('%s') == [os.path.basename(os.getcwd())])\n"
                 "print('OPENAI_API_KEY' in os.environ)\n"
                 "print(os.getuid())\n",
                 port, root);
}

/* For a test of what a sandbox lets through: the sandbox (NULL, and
 * \p why, when bubblewrap does not work here), our secret in our
 * environment, a port listening on our loopback (*\p lfdp; close it) and
 * escape_probe()'s code for it in \p code. */
static cq_sandbox_t *
escape_setup(char *code, size_t size, int *lfdp, char *why, size_t why_size)
{
        cq_sandbox_t *sandbox = bwrap_sandbox(why, why_size);
        int port;

        if (!sandbox)
                return NULL;
        setenv("OPENAI_API_KEY", "sk-secret-from-test", 1);
        *lfdp = cq_loopback_listen("127.0.0.1", &port);
        escape_probe(code, size, port);
        return sandbox;
}

/* What escape_probe() prints in the sandbox, for uid \p uid. */
static void escape_probe_want(char *want, size_t size, long uid)
{
        snprintf(want, size,
                 "ConnectionRefusedError\nOSError\nPermissionError\nTrue\n"
                 "False\n%ld\n",
                 uid);
}

/* The sandbox, as a kernel gets it: no network, nothing writable but the
 * work dir (and its own /tmp), the leased uid, no secret of ours, no
 * core files, its own processes only; and a second runner has a uid of
 * its own. */
START_TEST(sandbox_confines_the_runner)
{
        cq_interp_t *interp, *other;
        cq_sandbox_t *sandbox;
        char code[2000], want[300], why[600];
        size_t n;
        int lfd;

        sandbox = escape_setup(code, sizeof(code), &lfd, why, sizeof(why));
        if (!sandbox)
                CQ_CHECK_SKIP("bwrap", "sandbox_confines_the_runner: %s", why);
        interp = start_runner(sandbox, 0, 0);
        n = strlen(code);
        snprintf(code + n, sizeof(code) - n,
                 "import resource\n"
                 "print(tryit(lambda: open('/var/tmp/coderq-escape', 'w')))\n"
                 "print(tryit(lambda: open('inside.txt', 'w').write('x')))\n"
                 "print(os.getcwd() == '%s')\n"
                 "print(resource.getrlimit(resource.RLIMIT_CORE), "
                 "resource.getrlimit(resource.RLIMIT_NPROC)[0])\n"
                 "print(sorted(int(p) for p in os.listdir('/proc') "
                 "if p.isdigit())[0])",
                 cq_runner_work_dir(interp));
        escape_probe_want(want, sizeof(want),
                          (long)cq_runner_sandbox_id(interp)->uid);
        n = strlen(want);
        snprintf(want + n, sizeof(want) - n,
                 "FileNotFoundError\nok\nTrue\n(0, 0) 512\n1\n");
        cq_check_stdout(interp, code, want);
        ck_assert_int_ne(access("/var/tmp/coderq-escape", F_OK), 0);
        ck_assert_int_ne(access("/etc/coderq-escape", F_OK), 0);
        if (geteuid() == 0) {
                ck_assert_int_ge(cq_runner_sandbox_id(interp)->uid,
                                 CQ_SANDBOX_UIDS_FIRST);
                other = start_runner(sandbox, 0, 0);
                ck_assert_int_ne(cq_runner_sandbox_id(other)->uid,
                                 cq_runner_sandbox_id(interp)->uid);
                destroy_runner(&other);
        }
        close(lfd);
        destroy_runner(&interp);
        /* cancels, interrupts and timeouts work through the sandbox too */
        interp = start_runner(sandbox, 0, CANCEL_GRACE_MS);
        cancel_and_interrupt_in(interp);
        ck_assert_int_eq(cq_interp_restart(interp), CQ_OK);
        {
                cq_cell_result_t res;

                cq_check_cell(interp, "while True: pass", 1000, &res);
                ck_assert_int_eq(res.status, CQ_CELL_TIMEOUT);
                cq_cell_result_release(&res);
        }
        destroy_runner(&interp);
        cq_sandbox_destroy(&sandbox);
        unsetenv("OPENAI_API_KEY");
}
END_TEST

/* Whether the pool \p arg's reaper has torn down a used interpreter. */
static bool reaped_one(void *arg)
{
        cq_kpool_stats_t st;

        cq_kpool_stats(arg, &st);
        return st.discarded >= 1;
}

/* A server for runners and judges only forks them, not kernels; and a
 * pool's reaper tears a runner down behind its destroy. */
START_TEST(light_server_and_deferred_teardown)
{
        static const char *const no_args[] = {NULL};
        cq_kserver_opts_t ko;
        cq_kserver_t *ks;
        cq_kserver_req_t req;
        cq_kserver_child_t child;
        cq_kpool_opts_t po;
        cq_kpool_t *pool;
        cq_local_hooks_t hooks;
        cq_runner_opts_t ro;
        cq_interp_t *interp;
        char errstr[700], dir[PATH_MAX];

        mkdir(root, 0711);
        memset(&ko, 0, sizeof(ko));
        ko.mode = CQ_KSERVER_ON;
        ko.work_root = root;
        ko.light = true;
        ks = cq_kserver_new(&ko, errstr, sizeof(errstr));
        ck_assert_msg(ks != NULL, "%s", errstr);
        memset(&req, 0, sizeof(req));
        req.work_dir = root;
        req.argv = no_args;
        req.envp = no_args;
        req.log_fd = 2;
        ck_assert_int_ne(
            cq_kserver_spawn(ks, &req, &child, errstr, sizeof(errstr)), 0);
        ck_assert_msg(strstr(errstr, "forks no kernel"), "%s", errstr);
        memset(&po, 0, sizeof(po));
        po.local.work_root = root;
        pool = cq_kpool_new(&po, errstr, sizeof(errstr));
        ck_assert_msg(pool != NULL, "%s", errstr);
        cq_kpool_hooks(pool, &hooks);
        memset(&ro, 0, sizeof(ro));
        ro.work_root = root;
        ro.kserver = ks;
        ro.hooks = &hooks;
        interp = cq_runner_new(&ro, errstr, sizeof(errstr));
        ck_assert_msg(interp != NULL, "%s", errstr);
        ck_assert(cq_runner_forked(interp));
        cq_check_stdout(interp, "import typing\nprint('light')", "light\n");
        snprintf(dir, sizeof(dir), "%s", cq_runner_work_dir(interp));
        cq_interp_destroy(&interp);
        ck_assert_msg(cq_check_wait_until(reaped_one, pool, 30000),
                      "the reaper did not tear the runner down");
        ck_assert_int_ne(access(dir, F_OK), 0);
        cq_kpool_destroy(&pool);
        cq_kserver_destroy(&ks);
}
END_TEST

/* The reply parser, on what the code could write there. */
START_TEST(reply_parser)
{
        static const char *const bad[] = {
            "M ",
            "M {",
            "M []",
            "M {\"ok\": 1}",
            "M {\"ok\": true, \"count\": 0}",
            "M {\"ok\": true, \"count\": -3}",
            "M {\"ok\": true, \"count\": 1.5}",
            "M {\"ok\": true, \"count\": 99999999999}",
            "M {\"ok\": true, \"count\": null, \"extra\": 1}",
            "M {\"ok\": true, \"count\": null, \"result\": 5}",
            "M {\"ok\": false, \"count\": null, \"result\": \"r\", \"ename\": "
            "\"E\", \"evalue\": \"\", \"traceback\": []}",
            "M {\"ok\": false, \"count\": null}",
            "M {\"ok\": false, \"count\": null, \"ename\": \"\", \"evalue\": "
            "\"\", \"traceback\": []}",
            "M {\"ok\": false, \"count\": null, \"ename\": \"E\", \"evalue\": "
            "\"\", \"traceback\": [1]}",
            "M {\"ok\": true, \"count\": null, \"ename\": \"E\"}",
            "M {\"ok\": true, \"ok\": false, \"count\": null}",
        };
        cq_runner_reply_t reply;
        char errstr[256];
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                errstr[0] = '\0';
                ck_assert_msg(cq_runner_reply_parse(bad[i], strlen(bad[i]), "M",
                                                    &reply, errstr,
                                                    sizeof(errstr)) == -1,
                              "accepted: %s", bad[i]);
                ck_assert_msg(errstr[0] != '\0', "no reason for %s", bad[i]);
        }
        /* not this cell's */
        ck_assert_int_eq(cq_runner_reply_parse("N {}", 4, "M", &reply, errstr,
                                               sizeof(errstr)),
                         1);
        ck_assert_int_eq(cq_runner_reply_parse("M{}", 3, "M", &reply, errstr,
                                               sizeof(errstr)),
                         1);
        ck_assert_int_eq(cq_runner_reply_parse("MM {}", 5, "MMM", &reply,
                                               errstr, sizeof(errstr)),
                         1);
        {
                const char *ok = "M {\"ok\": true, \"count\": 3, \"result\": "
                                 "\"42\"}";

                ck_assert_int_eq(cq_runner_reply_parse(ok, strlen(ok), "M",
                                                       &reply, errstr,
                                                       sizeof(errstr)),
                                 0);
                ck_assert(reply.ok);
                ck_assert_int_eq(reply.count, 3);
                ck_assert_ptr_null(reply.error);
                ck_assert_str_eq(
                    json_string_value(json_object_get(
                        json_object_get(reply.result, "data"), "text/plain")),
                    "42");
                cq_runner_reply_release(&reply);
        }
        {
                const char *err = "M {\"ok\": false, \"count\": null, "
                                  "\"ename\": \"E\", \"evalue\": \"v\", "
                                  "\"traceback\": [\"a\", \"b\"]}";

                ck_assert_int_eq(cq_runner_reply_parse(err, strlen(err), "M",
                                                       &reply, errstr,
                                                       sizeof(errstr)),
                                 0);
                ck_assert(!reply.ok);
                ck_assert_int_eq(reply.count, -1);
                ck_assert_ptr_null(reply.result);
                ck_assert_str_eq(
                    json_string_value(json_object_get(reply.error, "ename")),
                    "E");
                ck_assert_uint_eq(
                    json_array_size(json_object_get(reply.error, "traceback")),
                    2);
                cq_runner_reply_release(&reply);
        }
}
END_TEST

/* ------------------------------------------------- the judge's process */

/* A played candidate: add(a, b) returns a + b; any other name is
 * missing. */
static int play_call(void *opaque,
                     const json_t *request,
                     int64_t limit_ms,
                     json_t **answerp,
                     int64_t *elapsed_ms)
{
        const json_t *args = json_object_get(request, "args");

        (void)opaque;
        (void)limit_ms;
        *elapsed_ms = 1;
        *answerp = json_pack("{s:s, s:I, s:n}", "op", "return", "value",
                             json_integer_value(json_array_get(args, 0)) +
                                 json_integer_value(json_array_get(args, 1)),
                             "args");
        return 0;
}

static int play_lookup(void *opaque, const char *name, json_t **answerp)
{
        (void)opaque;
        *answerp = strcmp(name, "add") == 0
                       ? json_pack("{s:s}", "op", "function")
                       : json_pack("{s:s}", "op", "missing");
        return 0;
}

static cq_interp_proc_t *start_judge(const cq_sandbox_t *sandbox)
{
        cq_judgeproc_opts_t jo;
        cq_interp_proc_t *proc;
        char errstr[700] = "";

        memset(&jo, 0, sizeof(jo));
        jo.sandbox = sandbox;
        jo.work_root = root;
        jo.kserver = cq_check_kserver(sandbox, root, TEST_PRELOAD);
        proc =
            cq_judgeproc_start(&jo, cq_judge_program(), errstr, sizeof(errstr));
        ck_assert_msg(proc != NULL, "judge start failed: %s", errstr);
        ck_assert_msg(cq_judgeproc_forked(proc) == cq_check_forked_mode(),
                      "the judge was %s",
                      cq_check_forked_mode() ? "not forked" : "forked");
        return proc;
}

/* Run \p code in a new judge; jr filled. */
static void judge_code(const cq_sandbox_t *sandbox,
                       const char *code,
                       int64_t run_ms,
                       cq_judge_result_t *jr)
{
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        cq_interp_proc_t *proc = start_judge(sandbox);
        char dir[PATH_MAX];

        snprintf(dir, sizeof(dir), "%s", cq_judgeproc_work_dir(proc));
        limits.deadline_ms = cq_now_ms() + run_ms;
        limits.call_ms = 1000;
        ck_assert_int_eq(cq_judge_run(proc, code, false, &cand, &limits, jr),
                         0);
        proc->destroy(proc);
        ck_assert_msg(access(dir, F_OK) != 0 && errno == ENOENT,
                      "the judge's work dir %s outlived it", dir);
}

START_TEST(judge_round_trip)
{
        cq_judge_result_t jr;

        judge_code(NULL,
                   "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"
                   "print('judged')",
                   60000, &jr);
        ck_assert_msg(jr.ok && !jr.fault, "fault %s", jr.fault);
        ck_assert_int_eq(jr.calls, 2);
        ck_assert_str_eq(jr.output, "judged\n");
        cq_judge_result_release(&jr);
        judge_code(NULL, "assert add(1, 2) == 4, 'wrong'", 60000, &jr);
        ck_assert(!jr.ok);
        ck_assert_ptr_null(jr.fault);
        ck_assert_str_eq(json_string_value(json_object_get(jr.error, "origin")),
                         "test");
        cq_judge_result_release(&jr);
}
END_TEST

/* A judge that runs past its time is killed by destroy: its process is
 * gone, and so is its work dir. */
START_TEST(judge_is_killed_on_destroy)
{
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        cq_interp_proc_t *proc = start_judge(NULL);
        cq_judge_result_t jr;
        char path[PATH_MAX + 8], *text;
        long pid;

        snprintf(path, sizeof(path), "%s/pid", cq_judgeproc_work_dir(proc));
        limits.deadline_ms = cq_now_ms() + 1500;
        limits.call_ms = 1000;
        ck_assert_int_eq(
            cq_judge_run(proc,
                         "import os\nopen('pid', 'w').write(str(os.getpid()))"
                         "\nwhile True: pass",
                         false, &cand, &limits, &jr),
            0);
        ck_assert(jr.timed_out);
        ck_assert_ptr_null(jr.fault);
        cq_judge_result_release(&jr);
        text = cq_check_slurp(path, NULL);
        pid = strtol(text, NULL, 10);
        free(text);
        ck_assert_int_gt(pid, 1);
        ck_assert_int_eq(kill((pid_t)pid, 0), 0);
        proc->destroy(proc);
        ck_assert_int_ne(kill((pid_t)pid, 0), 0);
        ck_assert_int_eq(errno, ESRCH);
        ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

/* The judge's sandbox is a kernel's: what its test code can reach. */
START_TEST(judge_is_sandboxed)
{
        cq_judge_result_t jr;
        cq_sandbox_t *sandbox;
        char code[2000], want[300], why[600];
        const char *uid;
        size_t n;
        int lfd;

        sandbox = escape_setup(code, sizeof(code), &lfd, why, sizeof(why));
        if (!sandbox)
                CQ_CHECK_SKIP("bwrap", "judge_is_sandboxed: %s", why);
        n = strlen(code);
        snprintf(code + n, sizeof(code) - n, "assert add(2, 2) == 4");
        judge_code(sandbox, code, 60000, &jr);
        ck_assert_msg(jr.ok && !jr.fault, "fault %s", jr.fault);
        /* a uid of the kernels' range (as root), else ours */
        uid = strrchr(jr.output, '\n');
        ck_assert_ptr_nonnull(uid);
        while (uid > jr.output && uid[-1] != '\n')
                uid--;
        escape_probe_want(want, sizeof(want), strtol(uid, NULL, 10));
        ck_assert_str_eq(jr.output, want);
        if (geteuid() == 0)
                ck_assert_int_ge(strtol(uid, NULL, 10), CQ_SANDBOX_UIDS_FIRST);
        else
                ck_assert_int_eq(strtol(uid, NULL, 10), (long)geteuid());
        cq_judge_result_release(&jr);
        close(lfd);
        cq_sandbox_destroy(&sandbox);
        unsetenv("OPENAI_API_KEY");
}
END_TEST

/* ------------------------------------------------------ the backend */

/* A configuration of CODERQ_BACKEND \p backend under root, in the
 * suite's mode (the kernel server on, or off). */
static void backend_config(cq_config_t *cfg, const char *backend)
{
        const char *const set[][2] = {
            {"CODERQ_BACKEND", backend},
            {"E2B_API_KEY", "e2b_test"},
            {"CODERQ_SANDBOX", "auto"},
            {"CODERQ_WORK_ROOT", root},
            {"CODERQ_KERNEL_SERVER", cq_check_forked_mode() ? "on" : "off"},
            {"CODERQ_KERNEL_PRELOAD", TEST_PRELOAD}};
        char errstr[512];
        size_t i;

        mkdir(root, 0711);
        ck_assert_int_eq(cq_config_init(cfg), 0);
        for (i = 0; i < CQ_ARRAY_SIZE(set); i++)
                ck_assert_msg(cq_config_set(cfg, set[i][0], set[i][1], NULL,
                                            errstr, sizeof(errstr)) == 0,
                              "%s", errstr);
}

/* The job \p json, parsed into \p job. */
static void parse_job(const char *json, cq_job_t *job)
{
        char errstr[512];

        cq_job_init(job);
        ck_assert_msg(cq_job_parse(json, strlen(json), 0, job, errstr,
                                   sizeof(errstr)) == CQ_OK,
                      "%s", errstr);
}

/* A judge's first call (cq_testrun_judge_code() with loaded false) in
 * \p interp: the lookup of add, answered as a function. */
static void first_call_finds_add(cq_interp_t *interp)
{
        json_t *req = json_pack("{s:s}", "name", "add"), *answer = NULL;
        char marker[40], errstr[256];
        char *code =
            cq_testrun_judge_code("lookup", req, false, marker, sizeof(marker),
                                  errstr, sizeof(errstr));
        cq_exec_opts_t xo = {0};
        cq_cell_result_t res;

        ck_assert_msg(code != NULL, "%s", errstr);
        cq_cell_result_init(&res);
        xo.timeout_ms = 30000;
        ck_assert_int_eq(cq_interp_execute(interp, code, &xo, &res), CQ_OK);
        ck_assert_int_eq(
            cq_testrun_judge_answer("lookup", false, marker, &res, &answer), 0);
        ck_assert_str_eq(json_string_value(json_object_get(answer, "op")),
                         "function");
        json_decref(answer);
        cq_cell_result_release(&res);
        free(code);
        json_decref(req);
}

/* A local job with a solution gets a runner, confined as the kernels
 * are; one with input files, or whose solution speaks IPython, a kernel;
 * so does one with no solution. */
START_TEST(backend_runs_solutions_in_runners)
{
        static const char *const kernel_jobs[] = {
            "{\"job_id\": \"k1\", \"prompt\": \"p\"}",
            "{\"job_id\": \"k2\", \"prompt\": \"p\", \"solution\": \"x = 1\", "
            "\"files\": [{\"name\": \"a.csv\", \"content_b64\": \"YQ==\"}]}",
            "{\"job_id\": \"k3\", \"prompt\": \"p\", \"solution\": "
            "\"x = 1\\n  %timeit x\"}",
            "{\"job_id\": \"k4\", \"prompt\": \"p\", \"solution\": "
            "\"!ls\\nx = 1\"}",
        };
        cq_config_t cfg;
        cq_backend_t *backend;
        cq_interp_t *interp = NULL, *other = NULL;
        char errstr[700];
        cq_job_t job;
        size_t i;

        backend_config(&cfg, "local");
        backend = cq_backend_new(&cfg, 0, errstr, sizeof(errstr));
        ck_assert_msg(backend != NULL, "%s", errstr);
        cq_backend_set_runner_preload(backend, cq_testrun_harness());
        for (i = 0; i < CQ_ARRAY_SIZE(kernel_jobs); i++) {
                parse_job(kernel_jobs[i], &job);
                ck_assert_msg(!cq_backend_job_runner(backend, &job),
                              "a runner for %s", kernel_jobs[i]);
                cq_job_release(&job);
        }
        parse_job("{\"job_id\": \"r1\", \"prompt\": \"p\", \"solution\": "
                  "\"def add(a, b):\\n    return a + b\\n\"}",
                  &job);
        ck_assert(cq_backend_job_runner(backend, &job));
        ck_assert_int_eq(cq_backend_acquire_for(backend, &job, 1, 60000,
                                                &interp, errstr,
                                                sizeof(errstr)),
                         CQ_OK);
        ck_assert_msg(cq_runner_is(interp), "not a runner");
        ck_assert(cq_runner_forked(interp) == cq_check_forked_mode());
        ck_assert_str_eq(cq_backend_sandbox_mode(backend, interp),
                         cq_backend_sandbox_mode(backend, NULL));
        /* the harness is there before any job code when forked (a cold
         * start runs no preload), and left no name in the job's
         * namespace */
        cq_check_stdout(interp,
                        "import sys\n"
                        "print('_coderq_testrun' in sys.modules, "
                        "[k for k in globals() if not k.startswith('__') "
                        "and k != 'sys'])",
                        cq_check_forked_mode() ? "True []\n" : "False []\n");
        cq_check_stdout(interp, job.solution, "");
        cq_check_stdout(interp, "print(add(1, 2))", "3\n");
        /* a judge's first call runs the harness kept there, which it
         * does not replace; a cold runner's gets it from the call, and
         * keeps it */
        cq_check_stdout(interp,
                        "h = sys.modules.get('_coderq_testrun')\n"
                        "if h is not None:\n"
                        "    h.seen = True\n",
                        "");
        first_call_finds_add(interp);
        cq_check_stdout(interp,
                        "print(getattr(sys.modules['_coderq_testrun'], "
                        "'seen', False))",
                        cq_check_forked_mode() ? "True\n" : "False\n");
        /* the first runner's environment report is every runner's */
        ck_assert_int_eq(cq_backend_acquire_for(backend, &job, 1, 60000, &other,
                                                errstr, sizeof(errstr)),
                         CQ_OK);
        ck_assert_ptr_nonnull(cq_interp_env(interp));
        ck_assert(json_equal((json_t *)(uintptr_t)cq_interp_env(interp),
                             (json_t *)(uintptr_t)cq_interp_env(other)));
        cq_interp_destroy(&other);
        cq_interp_destroy(&interp);
        cq_job_release(&job);
        /* a solution the job sends to E2B is E2B's */
        parse_job("{\"job_id\": \"e1\", \"prompt\": \"p\", \"backend\": "
                  "\"e2b\", \"solution\": \"x = 1\"}",
                  &job);
        ck_assert(!cq_backend_job_runner(backend, &job));
        cq_job_release(&job);
        cq_backend_destroy(&backend);
        cq_config_release(&cfg);
}
END_TEST

/* With CODERQ_BACKEND=e2b no local kernel is started (no pool), and the
 * judge still runs here, through the backend's starter. */
START_TEST(backend_e2b_judges_locally_without_kernels)
{
        cq_judge_candidate_t cand = {play_call, play_lookup, NULL};
        cq_judge_limits_t limits = {0};
        cq_backend_pool_t pool;
        cq_judge_start_fn *start = cq_backend_judge_start;
        cq_judge_proc_t *proc;
        cq_judge_result_t jr;
        cq_backend_t *backend;
        cq_config_t cfg;
        char errstr[700];

        backend_config(&cfg, "e2b");
        backend = cq_backend_new(&cfg, 1, errstr, sizeof(errstr));
        ck_assert_msg(backend != NULL, "%s", errstr);
        ck_assert(!cq_backend_pool(backend, &pool));
        proc = start(backend, cq_judge_program(), errstr, sizeof(errstr));
        ck_assert_msg(proc != NULL, "%s", errstr);
        /* a server of its own forks judges, kernels or not */
        ck_assert(cq_judgeproc_forked(proc) == cq_check_forked_mode());
        limits.deadline_ms = cq_now_ms() + 60000;
        limits.call_ms = 1000;
        ck_assert_int_eq(cq_judge_run(proc, "assert add(20, 22) == 42", false,
                                      &cand, &limits, &jr),
                         0);
        ck_assert_msg(jr.ok && !jr.fault, "fault %s", jr.fault);
        ck_assert_int_eq(jr.calls, 1);
        cq_judge_result_release(&jr);
        proc->destroy(proc);
        cq_backend_destroy(&backend);
        cq_config_release(&cfg);
}
END_TEST

static Suite *cq_runner_suite(void)
{
        Suite *s = suite_create("runner");
        TCase *tc = tcase_create("runner");

        root_setup();
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, cells_outputs_and_errors);
        tcase_add_test(tc, timeout_and_death_lose_the_runner);
        tcase_add_test(tc, cancel_and_interrupt);
        tcase_add_test(tc, output_is_capped);
        tcase_add_test(tc, forged_replies_touch_only_their_cell);
        tcase_add_test(tc, files_in_and_out);
        tcase_add_test(tc, sandbox_confines_the_runner);
        tcase_add_test(tc, light_server_and_deferred_teardown);
        tcase_add_test(tc, reply_parser);
        suite_add_tcase(s, tc);
        tc = tcase_create("judge");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, judge_round_trip);
        tcase_add_test(tc, judge_is_killed_on_destroy);
        tcase_add_test(tc, judge_is_sandboxed);
        suite_add_tcase(s, tc);
        tc = tcase_create("backend");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, backend_runs_solutions_in_runners);
        tcase_add_test(tc, backend_e2b_judges_locally_without_kernels);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_runner_suite)
