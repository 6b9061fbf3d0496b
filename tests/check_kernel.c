/* SPDX-License-Identifier: MIT */
/* check_kernel.c - the local kernel backend against a real ipykernel
 * (/usr/bin/python3 with Debian's ipykernel): outputs, errors, figures,
 * timeouts, death, cancel, output floods, text edge cases, the sandbox,
 * the pool and created files. Each test reuses one kernel for many cells
 * since a start costs about a second of CPU. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "../interp/local/kernel_int.h"
#include "../interp/local/kserver_int.h"
#include "coderq/backend/backend.h"
#include "coderq/common/buf.h"
#include "coderq/interp/collect.h"
#include "coderq/common/config.h"
#include "coderq/local/interp_local.h"
#include "coderq/local/kpool.h"
#include "coderq/local/kserver.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/local/workdir.h"
#include "support/cells.h"

/* Work root of this run, set before the test processes fork. */
static char root[256];

static void root_setup(void)
{
        snprintf(root, sizeof(root), "/tmp/cqcheck-kernel-%ld", (long)getpid());
}

/* Writes \p text to a new file \p path. */
static void write_text(const char *path, const char *text)
{
        FILE *fp = fopen(path, "w");

        ck_assert_ptr_nonnull(fp);
        ck_assert_int_eq(fputs(text, fp) >= 0, 1);
        ck_assert_int_eq(fclose(fp), 0);
}

/* The command line of process \p pid (/proc/PID/cmdline, its first
 * \p size - 1 bytes) as ps shows it: NULs as spaces, the trailing ones
 * dropped. Returns its length; 0 when the process is gone. */
static size_t cmdline_of(const char *pid, char *buf, size_t size)
{
        char path[300];
        size_t len, i;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%s/cmdline", pid);
        fp = fopen(path, "rb");
        buf[0] = '\0';
        if (!fp)
                return 0;
        len = fread(buf, 1, size - 1, fp);
        fclose(fp);
        for (i = 0; i < len; i++)
                if (buf[i] == '\0')
                        buf[i] = ' ';
        while (len > 0 && buf[len - 1] == ' ')
                len--;
        buf[len] = '\0';
        return len;
}

/* Pids (at most \p max) of the processes whose command line mentions
 * \p needle; returns how many there are. */
static size_t pids_naming(const char *needle, pid_t *out, size_t max)
{
        DIR *proc = opendir("/proc");
        struct dirent *de;
        size_t n = 0;

        ck_assert_ptr_nonnull(proc);
        while ((de = readdir(proc))) {
                char buf[4096];

                if (de->d_name[0] < '0' || de->d_name[0] > '9')
                        continue;
                if (!cmdline_of(de->d_name, buf, sizeof(buf)) ||
                    !strstr(buf, needle))
                        continue;
                if (n < max)
                        out[n] = (pid_t)strtol(de->d_name, NULL, 10);
                n++;
        }
        closedir(proc);
        return n;
}

/* Pids (at most \p max) of the processes whose command line mentions our
 * work root; returns how many there are. */
static size_t kernel_pids(pid_t *out, size_t max)
{
        return pids_naming(root, out, max);
}

static int count_kernels(void)
{
        pid_t pids[1];

        return (int)kernel_pids(pids, 0);
}

/* Whether every process whose command line mentions our work root has
 * niceness \p nice (and there is at least one). */
static bool kernels_nice(int nice)
{
        pid_t pids[256];
        size_t n = kernel_pids(pids, 256), i, bad = 0;

        ck_assert_uint_le(n, 256);
        for (i = 0; i < n; i++) {
                int prio;

                errno = 0;
                prio = getpriority(PRIO_PROCESS, (id_t)pids[i]);
                if (errno == 0 && prio != nice)
                        bad++;
        }
        return n > 0 && bad == 0;
}

/* Whether \p pid is gone or a zombie (killed, not yet reaped). The
 * signal may take a moment to land: wait up to 30 s for it. */
static bool is_dead_or_zombie(void *arg)
{
        pid_t pid = *(const pid_t *)arg;
        char path[64], buf[512], *p;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        f = fopen(path, "r");
        if (!f)
                return true;
        p = fgets(buf, sizeof(buf), f);
        fclose(f);
        p = p ? strrchr(buf, ')') : NULL;
        return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static bool dead_or_zombie(pid_t pid)
{
        return cq_check_wait_until(is_dead_or_zombie, &pid, 30000);
}

/* The autogroup of \p pid ("/autogroup-N"); false without autogroups. */
static bool autogroup_of(pid_t pid, char *out, size_t size)
{
        char path[64];
        FILE *f;
        bool ok;

        snprintf(path, sizeof(path), "/proc/%d/autogroup", (int)pid);
        f = fopen(path, "r");
        if (!f)
                return false;
        ok = fgets(out, (int)size, f) != NULL;
        fclose(f);
        if (ok)
                out[strcspn(out, " \n")] = '\0';
        return ok;
}

/* CQ_CHECK_KSERVER=on (ctest's check_kernel_forked) runs the suite with
 * every kernel forked by a kernel server, and each start asserts it was
 * (which needs root, as the server's sandbox does); otherwise kernels
 * start cold (support/cells.h). */
static bool forked_mode(void) { return cq_check_forked_mode(); }

static cq_kserver_t *test_kserver(const cq_sandbox_t *sandbox)
{
        return cq_check_kserver(sandbox, root, NULL);
}

/* A start of the suite's mode happened in that mode. */
static void assert_mode(cq_interp_t *interp)
{
        ck_assert_msg(
            cq_kernel_forked(cq_local_interp_kernel(interp)) == forked_mode(),
            "the kernel was %s", forked_mode() ? "not forked" : "forked");
}

static cq_interp_t *
start_kernel(const cq_sandbox_t *sandbox, size_t out_max, cq_kserver_t *ks)
{
        cq_local_opts_t opts;
        char errstr[512] = "";
        cq_interp_t *interp;

        memset(&opts, 0, sizeof(opts));
        opts.work_root = root;
        opts.kernel.sandbox = sandbox;
        opts.kernel.output_max = out_max;
        opts.kernel.startup_timeout_ms = 60000;
        opts.kernel.kserver = ks;
        interp = cq_local_interp_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(interp != NULL, "kernel start failed: %s", errstr);
        return interp;
}

static cq_interp_t *start_local(const cq_sandbox_t *sandbox, size_t out_max)
{
        cq_interp_t *interp =
            start_kernel(sandbox, out_max, test_kserver(sandbox));

        assert_mode(interp);
        return interp;
}

/* The shared helpers (support/cells.h) by this suite's names. */
static void run(cq_interp_t *interp,
                const char *code,
                int64_t timeout_ms,
                cq_cell_result_t *res)
{
        cq_check_cell(interp, code, timeout_ms, res);
}

static char *stream_text(const cq_cell_result_t *res, const char *name)
{
        return cq_check_stream_text(res, name);
}

static const json_t *find_output(const cq_cell_result_t *res, const char *type)
{
        return cq_check_find_output(res, type);
}

static void
assert_stdout(cq_interp_t *interp, const char *code, const char *want)
{
        cq_check_stdout(interp, code, want);
}

static int ncallbacks;

static void count_output(void *opaque, const json_t *output)
{
        (void)opaque;
        ck_assert_ptr_nonnull(json_object_get(output, "output_type"));
        ncallbacks++;
}

START_TEST(outputs_errors_and_text)
{
        cq_interp_t *interp;
        cq_cell_result_t res;
        cq_exec_opts_t opts = {0};
        const json_t *err, *tb, *img;
        char *out, *errtext;
        size_t i;
        json_t *v;

        setenv("OPENAI_API_KEY", "sk-secret-from-test", 1);
        setenv("CODERQ_PG_DSN", "postgres://secret", 1);
        interp = start_local(NULL, 0);
        ck_assert_str_eq(cq_interp_backend(interp), "local");

        /* stdout and stderr both captured, streaming callback per output */
        opts.on_output = count_output;
        cq_cell_result_init(&res);
        ck_assert_int_eq(
            cq_interp_execute(interp,
                              "import sys\nprint('out1')\n"
                              "print('err1', file=sys.stderr)\n"
                              "sys.stdout.flush(); sys.stderr.flush()\n"
                              "print('out2')\n6*7",
                              &opts, &res),
            CQ_OK);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert_int_eq(res.execution_count, 1);
        out = stream_text(&res, "stdout");
        errtext = stream_text(&res, "stderr");
        ck_assert_str_eq(out, "out1\nout2\n");
        ck_assert_str_eq(errtext, "err1\n");
        /* the environment was reported at the start, in the silent
         * warm-up cell: nothing of it in the first cell */
        ck_assert_ptr_nonnull(cq_interp_env(interp));
        ck_assert_msg(strncmp(json_string_value(json_object_get(
                                  cq_interp_env(interp), "python")),
                              "3.", 2) == 0,
                      "no python version");
        ck_assert_ptr_nonnull(json_string_value(json_object_get(
            json_object_get(cq_interp_env(interp), "packages"), "numpy")));
        /* the kernel's language_info, for the notebook, through the
         * interface: the one the kernel behind it reported */
        ck_assert_ptr_eq(
            cq_interp_language_info(interp),
            cq_kernel_language_info(cq_local_interp_kernel(interp)));
        ck_assert_str_eq(json_string_value(json_object_get(
                             cq_interp_language_info(interp), "name")),
                         "python");
        free(out);
        free(errtext);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(find_output(&res, "execute_result"), "data"),
                "text/plain")),
            "42");
        ck_assert_int_ge(ncallbacks, 3);
        ck_assert_ptr_nonnull(
            json_object_get(res.timing, "shell.execute_reply"));
        cq_cell_result_release(&res);

        /* an exception: error output with an ANSI-free traceback */
        run(interp, "x = 1\ndef f():\n    raise ValueError('boom')\nf()", 30000,
            &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        err = find_output(&res, "error");
        ck_assert_ptr_nonnull(err);
        ck_assert_str_eq(json_string_value(json_object_get(err, "ename")),
                         "ValueError");
        ck_assert_str_eq(json_string_value(json_object_get(err, "evalue")),
                         "boom");
        tb = json_object_get(err, "traceback");
        ck_assert_int_gt(json_array_size(tb), 1);
        json_array_foreach(tb, i, v)
            ck_assert_ptr_null(strchr(json_string_value(v), '\x1b'));
        ck_assert_ptr_nonnull(strstr(
            json_string_value(json_array_get(tb, json_array_size(tb) - 1)),
            "ValueError: boom"));
        cq_cell_result_release(&res);

        /* the next cell runs normally right after an error */
        assert_stdout(interp, "print(x + 1)", "2\n");

        /* input() fails at once instead of hanging */
        run(interp, "input('name? ')", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(json_string_value(json_object_get(
                             find_output(&res, "error"), "ename")),
                         "StdinNotImplementedError");
        cq_cell_result_release(&res);

        /* NUL kept, lone surrogate becomes U+FFFD */
        run(interp, "print('a\\x00b')\nprint('\\udcff')", 30000, &res);
        out = stream_text(&res, "stdout");
        ck_assert_int_eq(memcmp(out, "a\0b\n\xef\xbf\xbd\n", 9), 0);
        free(out);
        cq_cell_result_release(&res);

        /* no secret of the worker reaches the kernel */
        assert_stdout(interp,
                      "import os\nprint(sorted(k for k in os.environ "
                      "if k.startswith(('OPENAI', 'CODERQ', 'PG', 'E2B'))))\n"
                      "print(os.environ.get('MPLBACKEND', '').startswith("
                      "'module://matplotlib_inline'))",
                      "[]\nTrue\n");

        /* a matplotlib figure arrives as image/png display_data */
        run(interp,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        img = json_object_get(
            json_object_get(find_output(&res, "display_data"), "data"),
            "image/png");
        ck_assert_ptr_nonnull(img);
        ck_assert_int_eq(strncmp(json_string_value(img), "iVBORw0KGgo", 11), 0);
        cq_cell_result_release(&res);

        /* update_display_data replaces, clear_output(wait) clears */
        run(interp,
            "from IPython.display import display, clear_output\n"
            "h = display('one', display_id=True)\nh.update('two')\n"
            "print('gone')\nclear_output(wait=True)\nprint('kept')",
            30000, &res);
        out = stream_text(&res, "stdout");
        ck_assert_str_eq(out, "kept\n");
        free(out);
        ck_assert_ptr_null(find_output(&res, "display_data"));
        cq_cell_result_release(&res);
        run(interp, "h = display('one', display_id=True)\nh.update('two')",
            30000, &res);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(find_output(&res, "display_data"), "data"),
                "text/plain")),
            "'two'");
        ck_assert_ptr_null(
            json_object_get(find_output(&res, "display_data"), "transient"));
        cq_cell_result_release(&res);

        /* language_info kept for the notebook; nothing was dropped */
        {
                cq_kernel_t *kernel = cq_local_interp_kernel(interp);
                cq_jmsg_stats_t stats;

                ck_assert_str_eq(json_string_value(json_object_get(
                                     cq_kernel_language_info(kernel), "name")),
                                 "python");
                cq_kernel_stats(kernel, &stats);
                ck_assert_uint_gt(stats.received, 10);
                ck_assert_uint_eq(stats.bad_signature, 0);
                ck_assert_uint_eq(stats.malformed, 0);
        }
        cq_interp_destroy(&interp);
        ck_assert_ptr_null(interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

START_TEST(files_created_and_inputs)
{
        cq_interp_t *interp = start_local(NULL, 0);
        cq_files_t files = {0};
        cq_file_t file = {0};
        cq_cell_result_t res;
        bool png = false, csv = false;
        size_t i;

        ck_assert_int_eq(
            cq_interp_put_file(interp, "data/in.csv", "a,b\n1,2\n", 8), CQ_OK);
        ck_assert_int_eq(cq_interp_put_file(interp, "../evil", "x", 1),
                         CQ_ERR_FATAL);
        ck_assert_int_eq(cq_interp_put_file(interp, "/etc/evil", "x", 1),
                         CQ_ERR_FATAL);
        ck_assert_int_eq(
            cq_interp_put_file(interp, ".coderq/conn.json", "x", 1),
            CQ_ERR_FATAL);
        run(interp,
            "import os, matplotlib\nmatplotlib.use('Agg')\n"
            "import matplotlib.pyplot as plt\n"
            "os.makedirs('out/figs', exist_ok=True)\n"
            "plt.plot([1, 2]); plt.savefig('out/figs/p.png')\n"
            "open('table.csv', 'w').write(open('data/in.csv').read())",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        cq_cell_result_release(&res);
        ck_assert_int_eq(cq_interp_created_files(interp, true, &files), CQ_OK);
        for (i = 0; i < files.n; i++) {
                ck_assert_str_ne(files.v[i].name, "data/in.csv");
                ck_assert_ptr_null(strstr(files.v[i].name, ".coderq"));
                if (!strcmp(files.v[i].name, "out/figs/p.png")) {
                        png = true;
                        ck_assert_str_eq(files.v[i].mime, "image/png");
                        ck_assert_int_eq(memcmp(files.v[i].data, "\x89PNG", 4),
                                         0);
                }
                if (!strcmp(files.v[i].name, "table.csv"))
                        csv = files.v[i].len == 8;
        }
        ck_assert(png);
        ck_assert(csv);
        ck_assert_uint_eq(files.n, 2);
        cq_files_release(&files);
        ck_assert_int_eq(cq_interp_get_file(interp, "table.csv", 4, &file),
                         CQ_ERR_TOO_LARGE);
        ck_assert_int_eq(cq_interp_get_file(interp, "table.csv", 100, &file),
                         CQ_OK);
        ck_assert_int_eq(memcmp(file.data, "a,b\n1,2\n", 8), 0);
        free(file.name);
        free(file.mime);
        free(file.data);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A call into the interpreter made on a helper thread, so that a call
 * blocked on a FIFO fails the test instead of hanging it. */
typedef struct file_call {
        cq_interp_t *interp;
        const char *name;
        bool put;
        cq_err_t err;
        atomic_int done;
} file_call_t;

static void *file_call_main(void *arg)
{
        file_call_t *call = arg;
        cq_file_t file = {0};

        if (call->put) {
                call->err =
                    cq_interp_put_file(call->interp, call->name, "x", 1);
        } else {
                call->err =
                    cq_interp_get_file(call->interp, call->name, 100, &file);
                free(file.name);
                free(file.mime);
                free(file.data);
        }
        atomic_store(&call->done, 1);
        return NULL;
}

static bool file_call_done(void *arg)
{
        return atomic_load(&((file_call_t *)arg)->done) != 0;
}

/* Run the call; true when it returned within 10 s. A blocked call is
 * released by opening the FIFO from the other end. */
static bool call_returns(cq_interp_t *interp,
                         const char *dir,
                         const char *name,
                         bool put,
                         cq_err_t *errp)
{
        file_call_t call = {interp, name, put, CQ_OK, 0};
        pthread_t thread;
        bool done;

        ck_assert_int_eq(pthread_create(&thread, NULL, file_call_main, &call),
                         0);
        done = cq_check_wait_until(file_call_done, &call, 10000);
        if (!done) {
                char path[PATH_MAX];
                int fd;

                snprintf(path, sizeof(path), "%s/%s", dir, name);
                fd = open(path, (put ? O_RDONLY : O_WRONLY) | O_NONBLOCK);
                pthread_join(thread, NULL);
                if (fd >= 0)
                        close(fd);
        } else {
                pthread_join(thread, NULL);
        }
        *errp = call.err;
        return done;
}

START_TEST(fifo_in_work_dir_does_not_block)
{
        cq_interp_t *interp = start_local(NULL, 0);
        cq_files_t files = {0};
        cq_cell_result_t res;
        char dir[PATH_MAX];
        cq_err_t err;

        snprintf(dir, sizeof(dir), "%s",
                 cq_kernel_work_dir(cq_local_interp_kernel(interp)));
        ck_assert_int_eq(cq_interp_put_file(interp, "in.txt", "in", 2), CQ_OK);
        /* the code swaps its input for a FIFO and leaves another */
        run(interp,
            "import os\nos.remove('in.txt')\nos.mkfifo('in.txt')\n"
            "os.mkfifo('pipe.csv')",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        cq_cell_result_release(&res);
        ck_assert_msg(call_returns(interp, dir, "pipe.csv", false, &err),
                      "reading a FIFO blocked");
        ck_assert_int_ne(err, CQ_OK);
        ck_assert_msg(call_returns(interp, dir, "in.txt", true, &err),
                      "writing over a FIFO blocked");
        ck_assert_int_ne(err, CQ_OK);
        ck_assert_int_eq(cq_interp_created_files(interp, true, &files), CQ_OK);
        ck_assert_uint_eq(files.n, 0);
        cq_files_release(&files);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* The shared running cell (support/cells.h) by this suite's names. */
#define MARKED_SLEEP CQ_CHECK_MARKED_SLEEP
typedef cq_check_running_t running_cell_t;

static void *act_when_running(void *arg)
{
        return cq_check_act_when_running(arg);
}

/* Set keep = 5 in \p interp, then run MARKED_SLEEP there with \p cell's
 * cancel flag raised (to its cancel_value) once the cell runs: the result
 * in \p res, cancelled. Returns the time from the raise to the result. */
static int64_t
run_cancelled(cq_interp_t *interp, running_cell_t *cell, cq_cell_result_t *res)
{
        cq_exec_opts_t opts = {0};
        pthread_t thread;
        int64_t took;

        snprintf(cell->mark, sizeof(cell->mark), "%s/running.mark",
                 cq_kernel_work_dir(cq_local_interp_kernel(interp)));
        assert_stdout(interp, "import time\nkeep = 5", "");
        opts.cancel = cell->cancel;
        pthread_create(&thread, NULL, act_when_running, cell);
        cq_cell_result_init(res);
        ck_assert_int_eq(cq_interp_execute(interp, MARKED_SLEEP, &opts, res),
                         CQ_OK);
        took = cq_now_ms() - cell->acted_ms;
        pthread_join(thread, NULL);
        ck_assert_msg(cell->ran, "the cell never ran");
        ck_assert_int_eq(res->status, CQ_CELL_CANCELLED);
        return took;
}

static void cancel_and_interrupt(cq_interp_t *interp)
{
        cq_cell_result_t res;
        atomic_int cancel = 0;
        running_cell_t cell = {.cancel = &cancel, .interp = interp};
        pthread_t thread;

        (void)run_cancelled(interp, &cell, &res);
        ck_assert(!res.state_lost);
        ck_assert_str_eq(json_string_value(json_object_get(
                             find_output(&res, "error"), "ename")),
                         "KeyboardInterrupt");
        cq_cell_result_release(&res);
        ck_assert_int_eq(unlink(cell.mark), 0);
        /* interrupt from another thread: a KeyboardInterrupt error */
        cell.cancel = NULL;
        cell.interrupt = -1;
        pthread_create(&thread, NULL, act_when_running, &cell);
        run(interp, MARKED_SLEEP, 0, &res);
        pthread_join(thread, NULL);
        ck_assert_msg(cell.ran, "the cell never ran");
        ck_assert_int_eq(cell.interrupt, 0);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(json_string_value(json_object_get(
                             find_output(&res, "error"), "ename")),
                         "KeyboardInterrupt");
        cq_cell_result_release(&res);
        ck_assert_int_eq(unlink(cell.mark), 0);
        assert_stdout(interp, "print(keep)", "5\n");
}

START_TEST(timeout_and_death_replace_the_kernel)
{
        cq_interp_t *interp = start_local(NULL, 0);
        cq_cell_result_t res;
        const json_t *err;

        /* cancel and interrupt keep the kernel and its state */
        cancel_and_interrupt(interp);
        assert_stdout(interp, "x = 41\nprint(x)", "41\n");
        run(interp, "print('before', flush=True)\nwhile True: pass", 1500,
            &res);
        ck_assert_int_eq(res.status, CQ_CELL_TIMEOUT);
        ck_assert(res.state_lost);
        err = json_array_get(res.outputs, json_array_size(res.outputs) - 1);
        ck_assert_str_eq(json_string_value(json_object_get(err, "ename")),
                         "TimeoutError");
        ck_assert_ptr_nonnull(
            strstr(json_string_value(json_object_get(err, "evalue")), "state"));
        cq_cell_result_release(&res);
        /* a fresh kernel: the variable is gone */
        run(interp, "x", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_ERROR);
        ck_assert_str_eq(json_string_value(json_object_get(
                             find_output(&res, "error"), "ename")),
                         "NameError");
        ck_assert_int_eq(res.execution_count, 1);
        cq_cell_result_release(&res);

        run(interp, "y = 1\nimport os\nos._exit(1)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        ck_assert(res.state_lost);
        cq_cell_result_release(&res);
        assert_stdout(interp, "print('alive', 'y' in dir())", "alive False\n");

        /* the same through an explicit restart */
        assert_stdout(interp, "z = 3", "");
        ck_assert_int_eq(cq_interp_restart(interp), CQ_OK);
        assert_stdout(interp, "print('z' in dir())", "False\n");
        cq_interp_destroy(&interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A cell abandoned (CQ_INTERP_CANCEL_ABANDON: a worker draining) is not
 * waited for: no interrupt, no KeyboardInterrupt for the kernel to
 * format, its kernel killed at once. The next cell finds the kernel dead
 * and starts a fresh one. */
START_TEST(abandoned_cell_is_not_waited_for)
{
        cq_interp_t *interp = start_local(NULL, 0);
        cq_cell_result_t res;
        atomic_int cancel = 0;
        running_cell_t cell = {.cancel = &cancel,
                               .cancel_value = CQ_INTERP_CANCEL_ABANDON,
                               .interp = interp};
        int64_t took = run_cancelled(interp, &cell, &res);

        ck_assert(res.state_lost);
        ck_assert_str_eq(json_string_value(json_object_get(
                             find_output(&res, "error"), "ename")),
                         "Cancelled");
        /* a look at the flag (100 ms slices), not a reply */
        ck_assert_msg(took < 1000, "abandoned after %lld ms", (long long)took);
        cq_cell_result_release(&res);
        run(interp, "print(keep)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        cq_cell_result_release(&res);
        assert_stdout(interp, "print('keep' in dir())", "False\n");
        cq_interp_destroy(&interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

static long vm_hwm_kb(void)
{
        FILE *fp = fopen("/proc/self/status", "r");
        char line[256];
        long kb = -1;

        ck_assert_ptr_nonnull(fp);
        while (fgets(line, sizeof(line), fp))
                if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
                        break;
        fclose(fp);
        return kb;
}

/* The peak RSS (VmHWM) grew by less than \p max_kb since \p before;
 * both printed. Under a sanitizer only printed: ASan's quarantine keeps
 * freed memory (256 MB), TSan's allocator keeps freed blocks and its
 * shadow memory multiplies what is live, so the bound says nothing there;
 * the Release run checks it. */
static void assert_peak_grew_less(const char *test, long before, long max_kb)
{
        long after = vm_hwm_kb();

        fprintf(stderr, "%s: VmHWM %ld kB -> %ld kB (+%ld kB)\n", test, before,
                after, after - before);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
        (void)max_kb;
        fprintf(stderr, "%s: RSS bound not checked under a sanitizer\n", test);
#else
        ck_assert_msg(after - before < max_kb, "%s: peak RSS grew by %ld kB",
                      test, after - before);
#endif
}

/* The bytes the marker of \p res says were dropped, -1 without one;
 * *at_leastp tells whether it is a lower bound. */
static long long marker_bytes(const cq_cell_result_t *res, bool *at_leastp)
{
        char *err = stream_text(res, "stderr");
        const char *m = strstr(err, CQ_COLLECT_MARK);
        long long n = -1;

        *at_leastp = false;
        if (m) {
                m += strlen(CQ_COLLECT_MARK);
                if (strncmp(m, "at least ", 9) == 0) {
                        *at_leastp = true;
                        m += 9;
                }
                ck_assert_int_eq(sscanf(m, "%lld bytes dropped", &n), 1);
        }
        free(err);
        return n;
}

/* What the kept outputs weigh, as the collector counts them. */
static size_t kept_size(const cq_cell_result_t *res)
{
        size_t i, n = 0;
        json_t *v;

        json_array_foreach(res->outputs, i, v) n += cq_collect_size(v);
        return n;
}

START_TEST(output_flood_is_bounded)
{
        cq_interp_t *interp = start_local(NULL, 1 << 20);
        cq_cell_result_t res;
        long before, after;
        size_t total = 0, i;
        json_t *v;
        char *out, *err;
        long long n;
        bool at_least;

        /* make sure the baseline includes a warmed-up client */
        assert_stdout(interp, "print('warm')", "warm\n");
        before = vm_hwm_kb();
        run(interp,
            "import sys\nline = 'x' * 999 + '\\n'\n"
            "for i in range(200000):\n    sys.stdout.write(line)\n"
            "print('THE END')",
            0, &res);
        after = vm_hwm_kb();
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.truncated);
        json_array_foreach(res.outputs, i, v)
        {
                json_t *text = json_object_get(v, "text");

                total += json_string_length(text);
        }
        ck_assert_uint_le(total, (1 << 20) + 200);
        out = stream_text(&res, "stdout");
        err = stream_text(&res, "stderr");
        ck_assert_int_eq(strncmp(out, "xxxx", 4), 0);
        ck_assert_ptr_nonnull(strstr(out, "THE END\n"));
        ck_assert_msg(strstr(out, "output truncated by coderq") ||
                          strstr(err, "output truncated by coderq"),
                      "no truncation marker");
        ck_assert(strstr(out, " dropped ...]") || strstr(err, " dropped ...]"));
        free(out);
        free(err);
        /* the marker states the bytes really dropped (the kernel's count
         * and the client's) */
        n = marker_bytes(&res, &at_least);
        ck_assert(!at_least);
        ck_assert_int_ge(n, 200000000 - (1 << 20));
        ck_assert_int_le(n, 200000008);
        cq_cell_result_release(&res);
        /* 200 MB went through; the peak grew by far less */
        ck_assert_msg(after - before < 64 * 1024, "peak RSS grew by %ld kB",
                      after - before);
        assert_stdout(interp, "print('after')", "after\n");
        cq_interp_destroy(&interp);
}
END_TEST

/* A cell that writes a message without end (empty frames, each flagged
 * MORE) straight into its iopub connection: libzmq queued such frames
 * without limit, 64 bytes of the worker's memory for every 2 the kernel
 * wrote (16 MiB grew it by half a GiB). Now they are read and dropped as
 * they come, and nothing is read between cells: the worker's peak stays
 * where it was, the cells end, and a kernel answers afterwards. */
static const char iopub_flood[] =
    "import os, select, socket, threading\n"
    "from ipykernel.kernelapp import IPKernelApp\n"
    "app = IPKernelApp.instance()\n"
    "path = '%s-%d' % (app.ip, app.iopub_port)\n"
    "fds = []\n"
    "for fd in sorted(int(x) for x in os.listdir('/proc/self/fd')):\n"
    "    try:\n"
    "        s = socket.socket(fileno=os.dup(fd))\n"
    "    except OSError:\n"
    "        continue\n"
    "    try:\n"
    "        if (s.family == socket.AF_UNIX and s.getsockname() == path and\n"
    "                not s.getsockopt(socket.SOL_SOCKET,\n"
    "                                 socket.SO_ACCEPTCONN)):\n"
    "            fds.append(fd)\n"
    "    except OSError:\n"
    "        pass\n"
    "    finally:\n"
    "        s.close()\n"
    "chunk = b'\\x01\\x00' * 65536\n"
    "def flood():\n"
    "    sent = 0\n"
    "    while sent < 16 << 20:\n"
    "        try:\n"
    "            sent += os.write(fds[-1], chunk)\n"
    "        except BlockingIOError:\n"
    "            select.select([], [fds[-1]], [], 1.0)\n"
    "        except OSError:\n"
    "            return\n"
    "threading.Thread(target=flood, daemon=True).start()\n"
    "print(len(fds))\n";

START_TEST(frames_without_end_do_not_grow_the_worker)
{
        cq_interp_t *interp = start_local(NULL, 1 << 20);
        cq_cell_result_t res;
        long before;
        int64_t t0;
        char *out;

        assert_stdout(interp, "print('warm')", "warm\n");
        before = vm_hwm_kb();
        run(interp, iopub_flood, 30000, &res);
        out = stream_text(&res, "stdout");
        /* the flood's own output may be lost with the stream it broke */
        ck_assert_msg(res.status != CQ_CELL_OK || strcmp(out, "0\n") != 0,
                      "the cell found no iopub connection");
        free(out);
        cq_cell_result_release(&res);
        t0 = cq_now_ms();
        run(interp, "import time\ntime.sleep(3)\nprint('slept')", 30000, &res);
        /* whatever became of it (the kernel broke its own stream), it
         * ended within its deadline */
        ck_assert_int_lt(cq_now_ms() - t0, 30000 + 10000);
        cq_cell_result_release(&res);
        assert_peak_grew_less("frames_without_end_do_not_grow_the_worker",
                              before, 24 * 1024);
        assert_stdout(interp, "print('next')", "next\n");
        cq_interp_destroy(&interp);
}
END_TEST

/* Every byte a cell sends counts against the cap: metadata, JSON values
 * that are not strings, display updates; a frame far above the cap is
 * refused without being allocated, and iopub still works afterwards. */
START_TEST(every_byte_counts_against_the_cap)
{
        cq_interp_t *interp = start_local(NULL, 1 << 20);
        cq_cell_result_t res;
        long before;
        long long n;
        bool at_least;
        const json_t *disp;

        assert_stdout(interp, "from IPython.display import display", "");
        before = vm_hwm_kb();

        /* metadata: three displays of 400 kB each */
        run(interp,
            "for i in range(3):\n"
            "    display({'text/plain': str(i)}, metadata={'m': 'x' * "
            "400000}, raw=True)",
            60000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.truncated);
        n = marker_bytes(&res, &at_least);
        ck_assert(!at_least);
        ck_assert_int_ge(n, 400000);
        ck_assert_int_le(n, 400200);
        ck_assert_uint_le(kept_size(&res), (1 << 20) + 200);
        cq_cell_result_release(&res);

        /* JSON values that are not strings, 589 kB each */
        run(interp,
            "for i in range(3):\n"
            "    display({'application/json': list(range(100000))}, "
            "raw=True)",
            60000, &res);
        ck_assert(res.truncated);
        n = marker_bytes(&res, &at_least);
        ck_assert(!at_least);
        ck_assert_int_ge(n, 3 * 588000);
        ck_assert_uint_le(kept_size(&res), (1 << 20) + 200);
        cq_cell_result_release(&res);

        /* a display that an update makes too large */
        run(interp,
            "h = display({'text/plain': 'a'}, raw=True, display_id=True)\n"
            "print('between')\n"
            "h.update({'text/plain': 'y' * 900000}, raw=True)",
            60000, &res);
        ck_assert(res.truncated);
        n = marker_bytes(&res, &at_least);
        ck_assert_int_ge(n, 900000);
        ck_assert_uint_le(kept_size(&res), (1 << 20) + 200);
        cq_cell_result_release(&res);

        /* 100000 updates of one display: the last one is kept */
        run(interp,
            "h = display({'text/plain': 'start'}, raw=True, "
            "display_id=True)\n"
            "for i in range(100000):\n"
            "    h.update({'text/plain': 'u%d' % i}, raw=True)\n"
            "h.update({'text/plain': 'last'}, raw=True)",
            300000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(!res.truncated);
        ck_assert_uint_eq(json_array_size(res.outputs), 1);
        disp = find_output(&res, "display_data");
        ck_assert_ptr_nonnull(disp);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(disp, "data"), "text/plain")),
                         "last");
        cq_cell_result_release(&res);

        /* displays published faster than the client parses them: the
         * kernel waits for the client to read, nothing is lost */
        {
                json_t *list = json_array(), *one;
                size_t size, shown = 0, i;
                json_t *v;

                for (i = 0; i < 80000; i++)
                        json_array_append_new(list, json_integer((int)i));
                one = json_pack("{s:s, s:{s:o}, s:{}, s:{}}", "output_type",
                                "display_data", "data", "application/json",
                                list, "metadata", "transient");
                size = cq_collect_size(one);
                json_decref(one);
                run(interp,
                    "d = {'application/json': list(range(80000))}\n"
                    "for i in range(100):\n"
                    "    display(d, raw=True)",
                    300000, &res);
                ck_assert(res.truncated);
                json_array_foreach(res.outputs, i, v) shown +=
                    json_object_get(v, "data") != NULL;
                n = marker_bytes(&res, &at_least);
                ck_assert(!at_least);
                ck_assert_int_eq(n, (long long)((100 - shown) * size));
                cq_cell_result_release(&res);
        }

        /* a 500 MB JSON value: refused at the frame cap, read to its end
         * and counted by its size as sent */
        run(interp,
            "display({'application/json': {'a': 'x' * 500_000_000}}, "
            "raw=True)",
            300000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        ck_assert(res.truncated);
        n = marker_bytes(&res, &at_least);
        ck_assert(!at_least);
        ck_assert_int_ge(n, 500000000);
        ck_assert_int_lt(n, 500000000 + 4096);
        ck_assert_uint_le(kept_size(&res), (1 << 20) + 200);
        cq_cell_result_release(&res);
        /* the connection goes on: output flows */
        assert_stdout(interp, "print('next')", "next\n");
        assert_peak_grew_less("every_byte_counts_against_the_cap", before,
                              24 * 1024);
        cq_interp_destroy(&interp);
}
END_TEST

static int listen_loopback(int *portp)
{
        struct sockaddr_in addr;
        socklen_t len = sizeof(addr);
        int fd = socket(AF_INET, SOCK_STREAM, 0);

        ck_assert_int_ge(fd, 0);
        memset(&addr, 0, sizeof(addr));
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        ck_assert_int_eq(listen(fd, 4), 0);
        ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&addr, &len), 0);
        *portp = ntohs(addr.sin_port);
        return fd;
}

/* The sandbox in auto mode (bubblewrap where it works) under root, its
 * kernels' /tmp and /dev/shm of \p tmp and \p shm bytes (0: Linux's
 * default). */
static cq_sandbox_t *sized_sandbox(size_t tmp, size_t shm)
{
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        char errstr[512];

        mkdir(root, 0711);
        sopts.mode = CQ_SANDBOX_AUTO;
        sopts.probe_dir = root;
        sopts.mem = 4UL << 30;
        sopts.nproc = 512;
        sopts.fsize = 1UL << 30;
        sopts.tmp = tmp;
        sopts.shm = shm;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        return sandbox;
}

static cq_sandbox_t *auto_sandbox(void) { return sized_sandbox(0, 0); }

/* auto_sandbox(), or NULL and \p why when bubblewrap does not work. */
static cq_sandbox_t *usable_sandbox(char *why, size_t size)
{
        cq_sandbox_t *sandbox = auto_sandbox();

        if (cq_sandbox_enabled(sandbox))
                return sandbox;
        snprintf(why, size, "bubblewrap does not work here: %s",
                 cq_sandbox_reason(sandbox));
        cq_sandbox_destroy(&sandbox);
        return NULL;
}

/* What a sandboxed kernel can write outside its work dir: /tmp and
 * /dev/shm, each a tmpfs of its configured size (memory, which RLIMIT_AS
 * does not count), and nothing else: the root and /dev are read-only. */
static const char tmpfs_cell[] =
    "import errno, os\n"
    "def size(p):\n"
    "    s = os.statvfs(p)\n"
    "    return s.f_blocks * s.f_frsize\n"
    "def fill(p, n):\n"
    "    try:\n"
    "        with open(p, 'wb') as f:\n"
    "            f.write(b'x' * n)\n"
    "        return 'ok'\n"
    "    except OSError as e:\n"
    "        return errno.errorcode.get(e.errno, str(e.errno))\n"
    "print(size('/tmp'), size('/dev/shm'))\n"
    "print(fill('/tmp/big', 9 << 20), fill('/dev/shm/big', 5 << 20))\n"
    "os.remove('/tmp/big'); os.remove('/dev/shm/big')\n"
    "print(fill('/tmp/small', 1 << 20), fill('/dev/shm/small', 1 << 20))\n"
    "print(fill('/coderq-escape', 1), fill('/dev/coderq-escape', 1), "
    "fill('/coderq-dir/x', 1))\n"
    "try:\n"
    "    os.mkdir('/coderq-dir')\n"
    "except OSError as e:\n"
    "    print(errno.errorcode[e.errno])\n";

START_TEST(sandbox_bounds_its_tmpfs)
{
        cq_sandbox_t *sandbox = sized_sandbox(8u << 20, 4u << 20);
        cq_interp_t *interp;

        if (!cq_sandbox_enabled(sandbox)) {
                char why[512];

                snprintf(why, sizeof(why), "%s", cq_sandbox_reason(sandbox));
                cq_sandbox_destroy(&sandbox);
                CQ_CHECK_SKIP("bwrap",
                              "sandbox_bounds_its_tmpfs: bubblewrap does not "
                              "work here: %s",
                              why);
        }
        interp = start_local(sandbox, 0);
        assert_stdout(interp, tmpfs_cell,
                      "8388608 4194304\nENOSPC ENOSPC\nok ok\n"
                      "EROFS EROFS ENOENT\nEROFS\n");
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A sandboxed kernel's IPython profile and matplotlib's directory (with
 * its matplotlibrc) are on the sandbox's own /tmp (a tmpfs that goes with
 * the kernel), not in the run dir on the work root's disk: nothing of
 * them is left for the worker to remove. */
START_TEST(sandboxed_kernel_dirs_are_on_its_tmpfs)
{
        cq_sandbox_t *sandbox = auto_sandbox();
        cq_interp_t *interp;
        char path[PATH_MAX];

        if (!cq_sandbox_enabled(sandbox)) {
                char why[512];

                snprintf(why, sizeof(why), "%s", cq_sandbox_reason(sandbox));
                cq_sandbox_destroy(&sandbox);
                CQ_CHECK_SKIP("bwrap",
                              "sandboxed_kernel_dirs_are_on_its_tmpfs: "
                              "bubblewrap does not work here: %s",
                              why);
        }
        interp = start_local(sandbox, 0);
        assert_stdout(
            interp,
            "import os, stat\nimport matplotlib as mpl\n"
            "p = get_ipython().profile_dir\n"
            "print(os.environ['IPYTHONDIR'], p.location)\n"
            "print(sorted(os.listdir(p.location)), "
            "os.path.isfile(os.path.join(p.startup_dir, 'README')))\n"
            "print(os.stat('/tmp').st_dev == os.stat(p.location).st_dev != "
            "os.stat('.').st_dev)\n"
            "d = os.environ['MPLCONFIGDIR']\n"
            "st = [os.stat(x) for x in (d, mpl.matplotlib_fname())]\n"
            "print(d, mpl.get_configdir(), mpl.matplotlib_fname())\n"
            "print([oct(stat.S_IMODE(s.st_mode)) for s in st], "
            "[s.st_uid == os.getuid() for s in st], "
            "st[0].st_dev == os.stat('/tmp').st_dev)\n"
            "print(open(mpl.matplotlib_fname()).read().splitlines()[-1])\n"
            "print(mpl.rcParams['font.family'])",
            CQ_KERNEL_BOXED_IPYTHONDIR
            " " CQ_KERNEL_BOXED_IPYTHONDIR "/profile_default\n"
            "['db', 'log', 'pid', 'security', 'startup'] True\n"
            "True\n" CQ_KERNEL_BOXED_MPLCONFIGDIR
            " " CQ_KERNEL_BOXED_MPLCONFIGDIR " " CQ_KERNEL_BOXED_MPLCONFIGDIR
            "/matplotlibrc\n"
            "['0o700', '0o600'] [True, True] True\n"
            "font.family: DejaVu Sans, Noto Sans CJK JP\n"
            "['DejaVu Sans', 'Noto Sans CJK JP']\n");
        snprintf(path, sizeof(path), "%s/" CQ_KERNEL_RUN_DIR "/ipython",
                 cq_kernel_work_dir(cq_local_interp_kernel(interp)));
        ck_assert_int_ne(access(path, F_OK), 0);
        snprintf(path, sizeof(path), "%s/" CQ_KERNEL_RUN_DIR "/mpl",
                 cq_kernel_work_dir(cq_local_interp_kernel(interp)));
        ck_assert_int_ne(access(path, F_OK), 0);
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

START_TEST(sandbox_confines_the_kernel)
{
        cq_sandbox_t *sandbox = auto_sandbox();
        cq_interp_t *interp;
        char code[1024], want[256];
        int lfd, port;

        if (!cq_sandbox_enabled(sandbox)) {
                char why[512];

                snprintf(why, sizeof(why), "%s", cq_sandbox_reason(sandbox));
                cq_sandbox_destroy(&sandbox);
                CQ_CHECK_SKIP("bwrap",
                              "sandbox_confines_the_kernel: bubblewrap does "
                              "not work here: %s",
                              why);
        }
        setenv("OPENAI_API_KEY", "sk-secret-from-test", 1);
        lfd = listen_loopback(&port);
        interp = start_local(sandbox, 0);
        snprintf(code, sizeof(code),
                 "import socket, os\n"
                 "def tryit(f):\n"
                 "    try:\n        f()\n        return 'ok'\n"
                 "    except Exception as e:\n"
                 "        return type(e).__name__\n"
                 "print(tryit(lambda: socket.create_connection(('127.0.0.1', "
                 "%d), timeout=3)))\n"
                 "print(tryit(lambda: open('/etc/coderq-escape', 'w')))\n"
                 "print(tryit(lambda: open('/var/tmp/coderq-escape', 'w')))\n"
                 "print(tryit(lambda: open('/etc/shadow').read()))\n"
                 "print(tryit(lambda: open('inside.txt', 'w').write('x')))\n"
                 "print('OPENAI_API_KEY' in os.environ, os.getuid())\n"
                 "import resource\n"
                 "print(resource.getrlimit(resource.RLIMIT_CORE))\n"
                 "print(tryit(lambda: resource.setrlimit("
                 "resource.RLIMIT_CORE, (-1, -1))))",
                 port);
        /* no core files: a crash helper of the host's core_pattern would
         * write them outside the sandbox, as root */
        snprintf(want, sizeof(want),
                 "ConnectionRefusedError\nOSError\nFileNotFoundError\n"
                 "PermissionError\nok\nFalse %d\n(0, 0)\nValueError\n",
                 geteuid() == 0 ? CQ_SANDBOX_UID : (int)geteuid());
        /* OSError: read-only file system (errno EROFS) */
        {
                cq_cell_result_t res;
                char *out;

                run(interp, code, 60000, &res);
                out = stream_text(&res, "stdout");
                ck_assert_msg(strcmp(out, want) == 0, "sandbox said:\n%s", out);
                free(out);
                cq_cell_result_release(&res);
        }
        ck_assert_int_ne(access("/var/tmp/coderq-escape", F_OK), 0);
        ck_assert_int_ne(access("/etc/coderq-escape", F_OK), 0);
        /* a figure still arrives from inside the sandbox */
        {
                cq_cell_result_t res;

                run(interp,
                    "import matplotlib.pyplot as plt\nplt.plot([1])\n"
                    "plt.show()",
                    60000, &res);
                ck_assert_ptr_nonnull(json_object_get(
                    json_object_get(find_output(&res, "display_data"), "data"),
                    "image/png"));
                cq_cell_result_release(&res);
        }
        close(lfd);
        /* renicing reaches the kernel inside bubblewrap's session */
        {
                cq_kernel_t *k = cq_local_interp_kernel(interp);

                ck_assert_int_eq(cq_kernel_renice(k, 7), 0);
                assert_stdout(interp,
                              "import os\nprint(os.getpriority("
                              "os.PRIO_PROCESS, 0))",
                              "7\n");
                if (geteuid() == 0) {
                        ck_assert_int_eq(cq_kernel_renice(k, 0), 0);
                        assert_stdout(interp,
                                      "import os\nprint(os.getpriority("
                                      "os.PRIO_PROCESS, 0))",
                                      "0\n");
                }
        }
        /* timeouts, cancel and interrupt work through bubblewrap too */
        cancel_and_interrupt(interp);
        {
                cq_cell_result_t res;

                run(interp, "v = 1\nwhile True: pass", 1000, &res);
                ck_assert_int_eq(res.status, CQ_CELL_TIMEOUT);
                cq_cell_result_release(&res);
                run(interp, "import os\nos._exit(3)", 30000, &res);
                ck_assert_int_eq(res.status, CQ_CELL_DIED);
                cq_cell_result_release(&res);
                assert_stdout(interp, "print('v' in dir())", "False\n");
        }
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A pool under our work root; \p starts and \p start_nice as in
 * cq_kpool_opts_t. */
static cq_kpool_t *new_pool(size_t size, size_t starts, int start_nice)
{
        cq_kpool_opts_t opts;
        cq_kpool_t *pool;
        char errstr[512] = "";

        memset(&opts, 0, sizeof(opts));
        opts.size = size;
        opts.starts = starts;
        opts.start_nice = start_nice;
        opts.cell_gate = 2;
        opts.local.work_root = root;
        opts.local.kernel.startup_timeout_ms = 60000;
        if (forked_mode())
                opts.kserver.mode = CQ_KSERVER_ON;
        pool = cq_kpool_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(pool != NULL, "%s", errstr);
        return pool;
}

/* Wait (up to 30 s) until the pool's reaper has torn down \p n used
 * kernels, with none left waiting. */
typedef struct pool_wait {
        cq_kpool_t *pool;
        uint64_t n;
} pool_wait_t;

static bool discarded_n(void *arg)
{
        const pool_wait_t *w = arg;
        cq_kpool_stats_t st;

        cq_kpool_stats(w->pool, &st);
        return st.discarded == w->n && st.discarding == 0;
}

static void wait_discarded(cq_kpool_t *pool, uint64_t n)
{
        pool_wait_t w = {pool, n};
        cq_kpool_stats_t st;

        (void)cq_check_wait_until(discarded_n, &w, 30000);
        cq_kpool_stats(pool, &st);
        ck_assert_uint_eq(st.discarded, n);
        ck_assert_uint_eq(st.discarding, 0);
}

static bool ready_n(void *arg)
{
        const pool_wait_t *w = arg;

        return cq_kpool_ready(w->pool) >= w->n;
}

/* Wait (up to two minutes) until \p n kernels are ready; the caller
 * asserts on what it finds. */
static void wait_ready(cq_kpool_t *pool, size_t n)
{
        pool_wait_t w = {pool, n};

        (void)cq_check_wait_until(ready_n, &w, 120000);
}

/* A figure titled in Chinese renders its glyphs: the kernel's matplotlib
 * falls back to Noto Sans CJK (the matplotlibrc coderq writes for each
 * kernel), sandboxed where bubblewrap works. No "Glyph ... missing from
 * current font" warning, the font resolves inside the kernel, and the PNG
 * differs from the same figure forced to DejaVu Sans alone (boxes), which
 * does warn. */
START_TEST(cjk_labels_render_without_tofu)
{
        static const char code[] =
            "import io, warnings\n"
            "import matplotlib\n"
            "import matplotlib.pyplot as plt\n"
            "from matplotlib import font_manager as fm\n"
            "def draw(families=None):\n"
            "    ctx = {'font.family': families} if families else {}\n"
            "    with warnings.catch_warnings(record=True) as w, "
            "plt.rc_context(ctx):\n"
            "        warnings.simplefilter('always')\n"
            "        fig, ax = plt.subplots(figsize=(4, 2))\n"
            "        ax.plot([1, 3, 2])\n"
            "        ax.set_title('销售额分布：中文标题')\n"
            "        buf = io.BytesIO()\n"
            "        fig.savefig(buf, format='png', dpi=80)\n"
            "        plt.close(fig)\n"
            "    return buf.getvalue(), sum('missing from' in str(x.message) "
            "for x in w)\n"
            "png, missing = draw()\n"
            "tofu, tofu_missing = draw(['DejaVu Sans'])\n"
            "print('family', matplotlib.rcParams['font.family'])\n"
            "print('cjk', fm.findfont(fm.FontProperties(family='Noto Sans CJK "
            "JP'), fallback_to_default=False))\n"
            "print('missing', missing, 'tofu_missing', tofu_missing > 0)\n"
            "print('differs', png != tofu)\n"
            "fig, ax = plt.subplots(figsize=(4, 2))\n"
            "ax.plot([1, 3, 2])\n"
            "ax.set_title('销售额分布：中文标题')\n"
            "fig.savefig('zh.png', dpi=80)\n"
            "plt.show()\n";
        cq_sandbox_t *sandbox = auto_sandbox();
        cq_interp_t *interp;
        cq_cell_result_t res;
        char *out, *err;
        const json_t *png;

        interp = start_local(sandbox, 0);
        run(interp, code, 120000, &res);
        out = stream_text(&res, "stdout");
        err = stream_text(&res, "stderr");
        ck_assert_msg(res.status == CQ_CELL_OK, "cell failed: %s%s", out, err);
        ck_assert_msg(strstr(err, "missing from") == NULL,
                      "matplotlib warned of missing glyphs:\n%s", err);
        ck_assert_msg(strstr(out, "family ['DejaVu Sans', 'Noto Sans CJK "
                                  "JP']\n"),
                      "%s", out);
        ck_assert_msg(strstr(out, "cjk /usr/share/fonts/opentype/noto/"
                                  "NotoSansCJK-Regular.ttc\n"),
                      "%s", out);
        ck_assert_msg(strstr(out, "missing 0 tofu_missing True\n"), "%s", out);
        ck_assert_msg(strstr(out, "differs True\n"), "%s", out);
        png = json_object_get(
            json_object_get(find_output(&res, "display_data"), "data"),
            "image/png");
        ck_assert_ptr_nonnull(png);
        if (getenv("CQ_KEEP_LOGS")) {
                size_t len = 0;
                unsigned char *bytes = cq_b64_decode(
                    json_string_value(png), json_string_length(png), &len);
                char path[64];

                snprintf(path, sizeof(path), "/tmp/cq-cjk-%d.png",
                         (int)getpid());
                ck_assert_ptr_nonnull(bytes);
                cq_check_spit(path, bytes, len);
                fprintf(stderr, "CJK figure kept in %s (%s)\n", path,
                        cq_sandbox_mode_name(sandbox));
                free(bytes);
        }
        free(out);
        free(err);
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
}
END_TEST

START_TEST(pool_hands_out_ready_kernels)
{
        cq_kpool_t *pool;
        cq_interp_t *a, *b;
        char errstr[512] = "", dir[4096];
        struct stat st;
        pid_t pid;

        pool = new_pool(1, 1, 0);
        wait_ready(pool, 1);
        ck_assert_uint_eq(cq_kpool_ready(pool), 1);
        /* a ready kernel comes out without waiting for a start */
        a = cq_kpool_acquire(pool, 0, errstr, sizeof(errstr));
        ck_assert_msg(a != NULL, "%s", errstr);
        assert_mode(a);
        ck_assert_uint_eq(cq_kpool_ready(pool), 0);
        /* the refill thread replaces it */
        b = cq_kpool_acquire(pool, 60000, errstr, sizeof(errstr));
        ck_assert_msg(b != NULL, "%s", errstr);
        assert_mode(b);
        snprintf(dir, sizeof(dir), "%s",
                 cq_kernel_work_dir(cq_local_interp_kernel(a)));
        ck_assert_str_ne(dir, cq_kernel_work_dir(cq_local_interp_kernel(b)));
        /* warmed up silently: modules loaded, counter and namespace clean */
        {
                cq_cell_result_t res;
                char *out;

                run(a,
                    "import sys\nprint('numpy' in sys.modules, "
                    "'matplotlib.pyplot' in sys.modules, "
                    "[n for n in dir() if 'cq' in n])",
                    30000, &res);
                out = stream_text(&res, "stdout");
                ck_assert_str_eq(out, "True True []\n");
                free(out);
                ck_assert_int_eq(res.execution_count, 1);
                ck_assert_uint_eq(json_array_size(res.outputs), 1);
                cq_cell_result_release(&res);
        }
        /* a job's state stays in its kernel */
        assert_stdout(a, "secret = 1", "");
        assert_stdout(b, "print('secret' in dir())", "False\n");
        /* a used pooled kernel is discarded, not shut down gracefully:
         * killed when destroy returns (a zombie, or gone), then reaped
         * and its work dir removed by the pool's reaper */
        pid = cq_kernel_pid(cq_local_interp_kernel(a));
        ck_assert_int_gt(pid, 0);
        cq_interp_destroy(&a);
        ck_assert(dead_or_zombie(pid));
        wait_discarded(pool, 1);
        ck_assert_int_eq(kill(pid, 0), -1);
        ck_assert_int_eq(errno, ESRCH);
        ck_assert_int_ne(stat(dir, &st), 0); /* work dir removed */
        cq_interp_destroy(&b);
        cq_kpool_destroy(&pool);
        ck_assert_ptr_null(pool);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

START_TEST(pool_starts_kernels_in_parallel)
{
        cq_kpool_stats_t st;
        cq_kpool_t *pool;
        cq_interp_t *k[4];
        char errstr[512] = "";
        size_t i;

        /* mild niceness, so that starts still finish on a loaded CI */
        pool = new_pool(4, 2, 5);
        wait_ready(pool, 4);
        /* waiting kernels run niced (where it can be undone: as root) */
        cq_kpool_stats(pool, &st);
        ck_assert_int_eq(st.start_nice, geteuid() == 0 ? 5 : 0);
        ck_assert(kernels_nice(st.start_nice));
        for (i = 0; i < 4; i++) {
                k[i] = cq_kpool_acquire(pool, 120000, errstr, sizeof(errstr));
                ck_assert_msg(k[i] != NULL, "%s", errstr);
                assert_mode(k[i]);
        }
        cq_kpool_stats(pool, &st);
        /* two refill threads: two starts at once, never more */
        ck_assert_uint_eq(st.peak_starting, 2);
        ck_assert_uint_ge(st.started, 4);
        ck_assert_uint_eq(st.failed, 0);
        for (i = 0; i < 4; i++) {
                pid_t pid = cq_kernel_pid(cq_local_interp_kernel(k[i]));

                /* a process group of its own in our session, so that
                 * an autogroup scheduler weighs it (and its niceness)
                 * together with this process, not as a group of its own */
                ck_assert_int_eq(getpgid(pid), pid);
                ck_assert_int_eq(getsid(pid), getsid(0));
                {
                        char mine[64], its[64];

                        if (autogroup_of(getpid(), mine, sizeof(mine))) {
                                ck_assert(autogroup_of(pid, its, sizeof(its)));
                                ck_assert_str_eq(its, mine);
                        }
                }
                /* a job's kernel runs at normal priority again */
                errno = 0;
                ck_assert_int_eq(getpriority(PRIO_PROCESS, (id_t)pid), 0);
                ck_assert_int_eq(errno, 0);
                assert_stdout(k[i],
                              "import os\nprint(6 * 7, os.getpriority("
                              "os.PRIO_PROCESS, 0))",
                              "42 0\n");
                cq_interp_destroy(&k[i]);
        }
        /* each job's cell took its turn at the pool's gate */
        cq_kpool_stats(pool, &st);
        ck_assert_uint_eq(st.gate.width, 2);
        ck_assert_uint_eq(st.gate.entered, 4);
        /* the used kernels were killed at once and reaped by the pool */
        wait_discarded(pool, 4);
        /* the replacements come up too */
        wait_ready(pool, 4);
        cq_kpool_stats(pool, &st);
        ck_assert_uint_eq(st.ready, 4);
        ck_assert_uint_eq(st.starting, 0);
        ck_assert_uint_eq(st.peak_starting, 2);
        cq_kpool_destroy(&pool);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

START_TEST(acquire_starts_its_own_when_the_pool_has_none)
{
        cq_kpool_stats_t st;
        cq_kpool_t *pool;
        cq_interp_t *k;
        char errstr[512] = "";

        /* size 0: nothing pre-started, acquire starts one on demand at
         * the job's priority even when starts would be niced */
        pool = new_pool(0, 1, 5);
        /* not willing to wait: no kernel, a clear reason */
        k = cq_kpool_acquire(pool, 0, errstr, sizeof(errstr));
        ck_assert_ptr_null(k);
        ck_assert_msg(strstr(errstr, "none ready in time") != NULL, "%s",
                      errstr);
        k = cq_kpool_acquire(pool, 60000, errstr, sizeof(errstr));
        ck_assert_msg(k != NULL, "%s", errstr);
        assert_mode(k);
        assert_stdout(k, "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))",
                      "0\n");
        cq_kpool_stats(pool, &st);
        ck_assert_uint_eq(st.own_starts, 1);
        ck_assert_uint_eq(st.started, 0);
        ck_assert_uint_eq(st.ready, 0);
        cq_interp_destroy(&k);
        cq_kpool_destroy(&pool);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* Whether at most *\p arg kernels are alive (a zombie's command line is
 * empty: it does not count). */
static bool kernels_at_most(void *arg)
{
        return count_kernels() <= *(const int *)arg;
}

/* A worker that drains takes no more jobs: its pool starts no more
 * kernels and kills the ready ones at once, so that its exit does not
 * wait for them; a job that still asks gets a kernel of its own. */
START_TEST(drained_pool_kills_its_ready_kernels_and_starts_none)
{
        cq_kpool_stats_t st;
        cq_kpool_t *pool;
        cq_interp_t *k;
        char errstr[512] = "";
        int before, want;

        pool = new_pool(2, 2, 0);
        wait_ready(pool, 2);
        before = count_kernels();
        ck_assert_int_ge(before, 2);
        cq_kpool_drain(pool);
        ck_assert_uint_eq(cq_kpool_ready(pool), 0);
        want = before - 2;
        ck_assert_msg(cq_check_wait_until(kernels_at_most, &want, 30000),
                      "%d kernels alive after the drain, %d before",
                      count_kernels(), before);
        /* nothing refills it */
        usleep(500 * 1000);
        cq_kpool_stats(pool, &st);
        ck_assert_uint_eq(st.ready, 0);
        ck_assert_uint_eq(st.starting, 0);
        ck_assert_uint_eq(st.started, 2);
        /* a job that still asks does not wait for a refill */
        k = cq_kpool_acquire(pool, 60000, errstr, sizeof(errstr));
        ck_assert_msg(k != NULL, "%s", errstr);
        assert_stdout(k, "print(6 * 7)", "42\n");
        cq_kpool_stats(pool, &st);
        ck_assert_uint_eq(st.own_starts, 1);
        cq_interp_destroy(&k);
        cq_kpool_destroy(&pool);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

START_TEST(sweep_removes_dirs_of_dead_workers)
{
        char sweep[300], path[400], mine[400], errstr[256];
        const char *keep[] = {"k-notapid-x", "k-0-x", "other", "k-12"};
        struct stat st;
        pid_t dead;
        size_t i;
        FILE *fp;

        /* a pid that surely is not running: a child we reaped */
        dead = fork();
        ck_assert_int_ge(dead, 0);
        if (dead == 0)
                _exit(0);
        ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
        snprintf(sweep, sizeof(sweep), "%s/sweep", root);
        mkdir(root, 0711);
        ck_assert_int_eq(cq_work_root_sweep(sweep), 0); /* missing: fine */
        ck_assert_int_eq(mkdir(sweep, 0711), 0);
        /* ours, made the normal way: kept */
        ck_assert_int_eq(
            cq_work_dir_new(sweep, mine, sizeof(mine), errstr, sizeof(errstr)),
            0);
        /* a dead worker's, with content: removed */
        snprintf(path, sizeof(path), "%s/k-%ld-abcdef", sweep, (long)dead);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/k-%ld-abcdef/sub", sweep, (long)dead);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/k-%ld-abcdef/sub/f", sweep,
                 (long)dead);
        fp = fopen(path, "w");
        ck_assert_ptr_nonnull(fp);
        fclose(fp);
        /* a live process's (pid 1): kept; and names that are not ours */
        snprintf(path, sizeof(path), "%s/k-1-abcdef", sweep);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        for (i = 0; i < CQ_ARRAY_SIZE(keep); i++) {
                snprintf(path, sizeof(path), "%s/%s", sweep, keep[i]);
                ck_assert_int_eq(mkdir(path, 0700), 0);
        }
        ck_assert_int_eq(cq_work_root_sweep(sweep), 1);
        snprintf(path, sizeof(path), "%s/k-%ld-abcdef", sweep, (long)dead);
        ck_assert_int_ne(stat(path, &st), 0);
        ck_assert_int_eq(stat(mine, &st), 0);
        snprintf(path, sizeof(path), "%s/k-1-abcdef", sweep);
        ck_assert_int_eq(stat(path, &st), 0);
        for (i = 0; i < CQ_ARRAY_SIZE(keep); i++) {
                snprintf(path, sizeof(path), "%s/%s", sweep, keep[i]);
                ck_assert_int_eq(stat(path, &st), 0);
        }
        ck_assert_int_eq(cq_work_root_sweep(sweep), 0);
        cq_work_dir_remove(sweep);
        ck_assert_int_ne(stat(sweep, &st), 0);
}
END_TEST

/* A job's input file and its parent dirs go to the kernel's uid through
 * the descriptors they were opened by: a parent dir the code swaps for a
 * symlink (renameat2 RENAME_EXCHANGE in a loop, in a thread that runs
 * while the worker writes inputs) never leads the ownership change to
 * what the link points to. The old chown() of paths gave it away. */
START_TEST(input_ownership_follows_no_planted_symlink)
{
        cq_sandbox_t *sandbox;
        cq_interp_t *interp;
        char target[300], file[400], code[900], why[600];
        struct stat st;
        int64_t end;
        int ok = 0;

        if (geteuid() != 0)
                CQ_CHECK_SKIP("root",
                              "input_ownership_follows_no_planted_symlink: "
                              "no uid per kernel without root");
        sandbox = usable_sandbox(why, sizeof(why));
        if (!sandbox)
                CQ_CHECK_SKIP("bwrap",
                              "input_ownership_follows_no_planted_symlink: %s",
                              why);
        mkdir(root, 0711);
        snprintf(target, sizeof(target), "%s/planted", root);
        ck_assert_int_eq(mkdir(target, 0755), 0);
        snprintf(file, sizeof(file), "%s/x", target);
        write_text(file, "host's\n");
        interp = start_local(sandbox, 0);
        snprintf(code, sizeof(code),
                 "import ctypes, os, threading\n"
                 "libc = ctypes.CDLL(None, use_errno=True)\n"
                 "os.mkdir('a')\n"
                 "os.symlink('%s', 'l')\n"
                 "stop = False\n"
                 "def swap():\n"
                 "    while not stop:\n"
                 "        libc.renameat2(-100, b'a', -100, b'l', 2)\n"
                 "swapper = threading.Thread(target=swap, daemon=True)\n"
                 "swapper.start()",
                 target);
        assert_stdout(interp, code, "");
        /* 3000 written (each a race won by the dir), or 20 s */
        end = cq_now_ms() + 20000;
        while (ok < 3000 && cq_now_ms() < end)
                ok += cq_interp_put_file(interp, "a/x", "x", 1) == CQ_OK;
        assert_stdout(interp, "stop = True\nswapper.join()", "");
        ck_assert_msg(ok > 0, "no input written: %s", cq_interp_errmsg(interp));
        ck_assert_int_eq(lstat(target, &st), 0);
        ck_assert_msg(st.st_uid == 0, "the link's target went to uid %ld",
                      (long)st.st_uid);
        ck_assert_int_eq(lstat(file, &st), 0);
        ck_assert_msg(st.st_uid == 0, "a file under the link went to uid %ld",
                      (long)st.st_uid);
        ck_assert_uint_eq(st.st_size, 7);
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
        cq_work_dir_remove(target);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* Makes the chain \p depth dirs "d" deep under \p dfd, holding two
 * descriptors at a time; in the one at depth \p at, symlinks to
 * \p outside and to its file "keep". */
static void make_chain(int dfd, int depth, int at, const char *outside)
{
        char target[400];
        int fd = dup(dfd), i;

        ck_assert_int_ge(fd, 0);
        for (i = 0; i < depth; i++) {
                int sub;

                ck_assert_int_eq(mkdirat(fd, "d", 0700), 0);
                sub = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                ck_assert_int_ge(sub, 0);
                close(fd);
                fd = sub;
                if (i != at)
                        continue;
                ck_assert_int_eq(symlinkat(outside, fd, "out"), 0);
                snprintf(target, sizeof(target), "%s/keep", outside);
                ck_assert_int_eq(symlinkat(target, fd, "keep"), 0);
        }
        close(fd);
}

/* A work dir 50000 dirs deep, and a wide one, are removed with the
 * descriptors of a low RLIMIT_NOFILE (in a child), without following
 * the symlinks in them: what they point to stays. */
START_TEST(work_dir_removal_is_flat)
{
        char top[300], outside[300], path[400];
        struct rlimit rl = {10, 10};
        struct stat st;
        int fd, i, j, status;
        pid_t pid;
        FILE *fp;

        mkdir(root, 0711);
        snprintf(top, sizeof(top), "%s/flat", root);
        snprintf(outside, sizeof(outside), "%s/outside", root);
        ck_assert_int_eq(mkdir(top, 0700), 0);
        ck_assert_int_eq(mkdir(outside, 0700), 0);
        snprintf(path, sizeof(path), "%s/keep", outside);
        fp = fopen(path, "w");
        ck_assert_ptr_nonnull(fp);
        fclose(fp);
        fd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        make_chain(fd, 50000, 30000, outside);
        /* wide: 64 dirs of 64 files and a short chain each */
        for (i = 0; i < 64; i++) {
                snprintf(path, sizeof(path), "%s/w%d", top, i);
                ck_assert_int_eq(mkdir(path, 0700), 0);
                for (j = 0; j < 64; j++) {
                        snprintf(path, sizeof(path), "%s/w%d/f%d", top, i, j);
                        fp = fopen(path, "w");
                        ck_assert_ptr_nonnull(fp);
                        fclose(fp);
                }
        }
        ck_assert_int_eq(symlinkat(outside, fd, "out"), 0);
        close(fd);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* what the removal may hold: 10 - stdin, stdout, stderr */
                for (i = 3; i < 1024; i++)
                        close(i);
                if (setrlimit(RLIMIT_NOFILE, &rl))
                        _exit(2);
                cq_work_dir_remove(top);
                _exit(lstat(top, &st) == 0 || errno != ENOENT ? 1 : 0);
        }
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "removal under RLIMIT_NOFILE 10: status %d", status);
        ck_assert_int_eq(stat(outside, &st), 0);
        snprintf(path, sizeof(path), "%s/keep", outside);
        ck_assert_int_eq(stat(path, &st), 0);
        cq_work_dir_remove(outside);
        ck_assert_int_ne(lstat(outside, &st), 0);
}
END_TEST

/* In a child that is a session leader with a pseudo-terminal as its
 * controlling terminal (as a worker started from a shell has one): a
 * kernel's answer to opening /dev/tty. Exit codes name the step that
 * failed; 0 means the kernel had no terminal and shares our session. */
static int tty_probe(void)
{
        int master, slave, tty;
        cq_local_opts_t opts;
        cq_exec_opts_t eo = {0};
        cq_cell_result_t res;
        cq_interp_t *interp;
        char errstr[512], *out;
        int rc;

        if (setsid() < 0)
                return 10;
        master = posix_openpt(O_RDWR | O_NOCTTY);
        if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0)
                return 11;
        slave = open(ptsname(master), O_RDWR);
        if (slave < 0 || ioctl(slave, TIOCSCTTY, 0) != 0)
                return 12;
        tty = open("/dev/tty", O_RDWR);
        if (tty < 0)
                return 13; /* we have none: the probe would prove nothing */
        close(tty);
        memset(&opts, 0, sizeof(opts));
        opts.work_root = root;
        opts.kernel.startup_timeout_ms = 60000;
        opts.kernel.kserver = test_kserver(NULL);
        interp = cq_local_interp_new(&opts, errstr, sizeof(errstr));
        if (!interp)
                return 14;
        if (cq_kernel_forked(cq_local_interp_kernel(interp)) != forked_mode())
                return 18;
        eo.timeout_ms = 60000;
        cq_cell_result_init(&res);
        rc = 15;
        if (cq_interp_execute(interp,
                              "import os\ntry:\n    os.close(os.open("
                              "'/dev/tty', os.O_RDWR))\n    print('tty')\n"
                              "except OSError as e:\n    print('none', "
                              "e.errno)",
                              &eo, &res) == CQ_OK) {
                out = stream_text(&res, "stdout");
                rc = strcmp(out, "none 6\n") == 0 ? 0 : 16; /* ENXIO */
                free(out);
        }
        /* still our session, so autogroup scheduling weighs it with us */
        if (rc == 0 &&
            getsid(cq_kernel_pid(cq_local_interp_kernel(interp))) != getsid(0))
                rc = 17;
        cq_cell_result_release(&res);
        cq_interp_destroy(&interp);
        cq_check_kservers_stop(); /* _exit() runs no atexit() */
        /* closing the master hangs up our own terminal */
        signal(SIGHUP, SIG_IGN);
        close(slave);
        close(master);
        return rc;
}

START_TEST(kernel_has_no_controlling_terminal)
{
        int status = -1;
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0)
                _exit(tty_probe());
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "tty probe failed at step %d, signal %d (16: the "
                      "kernel could open the terminal)",
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}
END_TEST

START_TEST(config_and_start_failure)
{
        cq_config_t cfg;
        cq_sandbox_opts_t sopts;
        cq_kpool_opts_t popts;
        cq_local_opts_t lopts;
        char errstr[512] = "";
        cq_interp_t *interp;

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_str_eq(cfg.python, "/usr/bin/python3");
        ck_assert_int_eq(cfg.kpool_size, 2);
        ck_assert_int_eq(cfg.kpool_starts, 2);
        ck_assert_uint_eq(cfg.output_max, 1 << 20);
        ck_assert_int_eq(cq_sandbox_opts_from_config(&sopts, &cfg), 0);
        ck_assert_int_eq(sopts.mode, CQ_SANDBOX_ON);
        ck_assert_uint_eq(sopts.mem, 4UL << 30);
        cq_kpool_opts_from_config(&popts, &cfg, NULL);
        ck_assert_uint_eq(popts.size, 2);
        ck_assert_uint_eq(popts.starts, 2);
        ck_assert_uint_eq(popts.cell_gate, 4);
        ck_assert_int_eq(popts.local.kernel.startup_timeout_ms, 60000);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_CELL_GATE", "0",
                                       "CODERQ_CELL_GATE", errstr,
                                       sizeof(errstr)),
                         0);
        cq_kpool_opts_from_config(&popts, &cfg, NULL);
        ck_assert_uint_eq(popts.cell_gate, 0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_CELL_GATE", "-1",
                                       "CODERQ_CELL_GATE", errstr,
                                       sizeof(errstr)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_SANDBOX", "maybe",
                                       "CODERQ_SANDBOX", errstr,
                                       sizeof(errstr)),
                         -1);
        /* an interpreter that cannot start: a clear error, nothing left */
        cq_local_opts_from_config(&lopts, &cfg, NULL);
        /* (a server forks only kernels of its own interpreter) */
        lopts.kernel.kserver = test_kserver(NULL);
        lopts.kernel.python = "/nonexistent/python3";
        lopts.work_root = root;
        interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
        ck_assert_ptr_null(interp);
        ck_assert_msg(strstr(errstr, "exited during startup") != NULL, "%s",
                      errstr);
        /* a python without ipykernel says why */
        lopts.kernel.python = "/bin/false";
        interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
        ck_assert_ptr_null(interp);
        ck_assert_ptr_nonnull(strstr(errstr, "kernel"));
        /* ipc socket paths must fit in sun_path (108 bytes) */
        {
                char longroot[512];

                mkdir(root, 0711);
                snprintf(
                    longroot, sizeof(longroot), "%s/%s", root,
                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
                lopts.kernel.python = "/usr/bin/python3";
                lopts.work_root = longroot;
                interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
                ck_assert_ptr_null(interp);
                ck_assert_msg(strstr(errstr, "too long") != NULL, "%s", errstr);
                ck_assert_int_eq(rmdir(longroot), 0);
        }
        cq_config_release(&cfg);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* Whether bubblewrap (\p bwrap; NULL: the default) runs the kernel
 * interpreter here at all (an auto probe in an existing root); when not,
 * \p why says why, for CQ_CHECK_SKIP(). */
static bool bwrap_works(const char *bwrap, char *why, size_t size)
{
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        char errstr[512];
        bool ok;

        mkdir(root, 0711);
        sopts.mode = CQ_SANDBOX_AUTO;
        sopts.bwrap = bwrap;
        sopts.probe_dir = root;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        ok = cq_sandbox_enabled(sandbox);
        if (!ok)
                snprintf(why, size, "bubblewrap does not work here: %s",
                         cq_sandbox_reason(sandbox));
        cq_sandbox_destroy(&sandbox);
        return ok;
}

/* The probe with a bubblewrap that cannot work, skipping as the sandbox
 * tests do; run by skips_fail_when_cq_require_names_them only. */
START_TEST(probe_with_a_broken_bwrap)
{
        char why[768];

        if (!bwrap_works("/bin/false", why, sizeof(why)))
                CQ_CHECK_SKIP("bwrap", "%s", why);
        ck_abort_msg("/bin/false passed for bubblewrap");
}
END_TEST

/* probe_with_a_broken_bwrap in a runner of its own, with CQ_REQUIRE set to
 * \p require (NULL: unset); returns the runner's exit status. */
static int run_broken_probe(const char *require)
{
        int st;
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* not a case of this suite (tests/CMakeLists.txt reads
                 * the quoted tcase names): a suite of its own, run here */
                const char *name = "skip";
                Suite *s = suite_create(name);
                TCase *tc = tcase_create(name);

                tcase_add_test(tc, probe_with_a_broken_bwrap);
                suite_add_tcase(s, tc);
                if (require)
                        setenv("CQ_REQUIRE", require, 1);
                else
                        unsetenv("CQ_REQUIRE");
                _exit(cq_check_run(s));
        }
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        ck_assert(WIFEXITED(st));
        return WEXITSTATUS(st);
}

/* A sandbox test that cannot run shows as skipped (exit 77), and fails
 * where CQ_REQUIRE says the machine has bubblewrap. */
START_TEST(skips_fail_when_cq_require_names_them)
{
        ck_assert_int_eq(run_broken_probe(NULL), CQ_CHECK_SKIPPED);
        ck_assert_int_eq(run_broken_probe("node"), CQ_CHECK_SKIPPED);
        ck_assert_int_eq(run_broken_probe("node,bwrap"), EXIT_FAILURE);
        ck_assert_int_eq(run_broken_probe("all"), EXIT_FAILURE);
}
END_TEST

/* On a fresh machine the work root does not exist yet: the default
 * configuration creates it (0711, ours) before its probe and runs the
 * kernel sandboxed, never as us with /root in view. */
START_TEST(fresh_work_root_runs_sandboxed)
{
        cq_config_t cfg;
        cq_sandbox_opts_t sopts;
        cq_sandbox_t *sandbox;
        cq_local_opts_t lopts;
        cq_interp_t *interp;
        char fresh[400], top[300], errstr[512], want[64], code[4600];
        struct stat st;

        if (!bwrap_works(NULL, errstr, sizeof(errstr)))
                CQ_CHECK_SKIP("bwrap", "%s", errstr);
        snprintf(top, sizeof(top), "%s/fresh", root);
        snprintf(fresh, sizeof(fresh), "%s/work/root", top);
        ck_assert_int_ne(stat(top, &st), 0);
        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_WORK_ROOT", fresh, NULL,
                                       errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_sandbox_opts_from_config(&sopts, &cfg), 0);
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        ck_assert_msg(cq_sandbox_enabled(sandbox), "%s",
                      cq_sandbox_reason(sandbox));
        ck_assert_str_eq(cq_sandbox_mode_name(sandbox),
                         geteuid() == 0 ? "bwrap+uid-per-kernel" : "bwrap");
        ck_assert_int_eq(lstat(fresh, &st), 0);
        ck_assert(S_ISDIR(st.st_mode));
        ck_assert_uint_eq(st.st_mode & 07777, 0711);
        ck_assert_uint_eq(st.st_uid, geteuid());
        cq_local_opts_from_config(&lopts, &cfg, sandbox);
        lopts.kernel.kserver = test_kserver(sandbox);
        interp = cq_local_interp_new(&lopts, errstr, sizeof(errstr));
        ck_assert_msg(interp != NULL, "%s", errstr);
        assert_mode(interp);
        /* not us, no /root, no source tree (the worker's files) */
        snprintf(want, sizeof(want), "%s False False\n",
                 geteuid() == 0 ? "True" : "False");
        snprintf(code, sizeof(code),
                 "import os\nu = os.getuid()\n"
                 "print(100000 <= u <= 100999, os.path.exists('/root'), "
                 "os.path.exists('%s'))",
                 CQ_SOURCE_DIR);
        assert_stdout(interp, code, want);
        if (geteuid() == 0)
                assert_stdout(interp, "import os\nprint(os.getuid() != 0)",
                              "True\n");
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
        cq_config_release(&cfg);
        cq_work_dir_remove(top);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* An existing work root: ours and looser than 0711 is tightened (and
 * says so), tighter stays; a symlink, another uid's directory or a file is
 * refused, and a worker refuses to start on it. */
START_TEST(existing_work_root_is_tightened_or_refused)
{
        static const struct {
                mode_t before, after;
        } modes[] = {{0755, 0711}, {0744, 0700}, {02755, 0711},
                     {0750, 0710}, {0711, 0711}, {0700, 0700}};
        /* others may write these: shared, refused, never chmodded */
        static const mode_t shared[] = {0777, 0775, 0757, 01777, 01733};
        char top[300], dir[400], link[400], file[400], slash[410];
        char errstr[512], logpath[] = "/tmp/cq-workroot-log-XXXXXX";
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        struct stat st;
        char *log;
        size_t i;
        int fd;

        snprintf(top, sizeof(top), "%s/roots", root);
        mkdir(root, 0711);
        ck_assert_int_eq(mkdir(top, 0700), 0);
        snprintf(dir, sizeof(dir), "%s/work", top);
        fd = mkstemp(logpath);
        ck_assert_int_ge(fd, 0);
        cq_log_set_fd(fd);
        for (i = 0; i < CQ_ARRAY_SIZE(modes); i++) {
                ck_assert_int_eq(mkdir(dir, 0700), 0);
                ck_assert_int_eq(chmod(dir, modes[i].before), 0);
                ck_assert_msg(
                    cq_work_root_prepare(dir, errstr, sizeof(errstr)) == 0,
                    "%04o: %s", (unsigned)modes[i].before, errstr);
                ck_assert_int_eq(lstat(dir, &st), 0);
                ck_assert_msg(
                    (st.st_mode & 07777) == modes[i].after,
                    "%04o became %04o, not %04o", (unsigned)modes[i].before,
                    (unsigned)(st.st_mode & 07777), (unsigned)modes[i].after);
                ck_assert_int_eq(rmdir(dir), 0);
        }
        for (i = 0; i < CQ_ARRAY_SIZE(shared); i++) {
                ck_assert_int_eq(mkdir(dir, 0700), 0);
                ck_assert_int_eq(chmod(dir, shared[i]), 0);
                ck_assert_int_eq(
                    cq_work_root_prepare(dir, errstr, sizeof(errstr)), -1);
                ck_assert_msg(strstr(errstr, "be writable only by it"), "%s",
                              errstr);
                ck_assert_int_eq(lstat(dir, &st), 0);
                ck_assert_uint_eq(st.st_mode & 07777, shared[i]);
                ck_assert_int_eq(rmdir(dir), 0);
        }
        cq_log_set_fd(2);
        log = cq_check_slurp(logpath, NULL);
        close(fd);
        unlink(logpath);
        ck_assert_msg(strstr(log, "\"mode_was\":\"0755\"") &&
                          strstr(log, "\"mode_was\":\"0750\"") &&
                          strstr(log, "tightened"),
                      "%s", log);
        ck_assert_ptr_null(strstr(log, "\"mode_was\":\"0700\""));
        free(log);

        /* a symlink to a directory of ours, with or without a slash */
        ck_assert_int_eq(mkdir(dir, 0755), 0);
        snprintf(link, sizeof(link), "%s/link", top);
        ck_assert_int_eq(symlink(dir, link), 0);
        snprintf(slash, sizeof(slash), "%s/", link);
        ck_assert_int_eq(cq_work_root_prepare(link, errstr, sizeof(errstr)),
                         -1);
        ck_assert_msg(strstr(errstr, "is a symbolic link"), "%s", errstr);
        ck_assert_int_eq(cq_work_root_prepare(slash, errstr, sizeof(errstr)),
                         -1);
        ck_assert_msg(strstr(errstr, "is a symbolic link"), "%s", errstr);
        ck_assert_int_eq(lstat(dir, &st), 0);
        ck_assert_uint_eq(st.st_mode & 07777, 0755); /* left alone */

        /* the sandbox probe refuses it (on: no sandbox; auto: disabled,
         * saying why), and a worker refuses to start on it in every
         * mode, since no kernel could start there */
        sopts.mode = CQ_SANDBOX_ON;
        sopts.probe_dir = link;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_ptr_null(sandbox);
        ck_assert_msg(strstr(errstr, "is a symbolic link"), "%s", errstr);
        sopts.mode = CQ_SANDBOX_AUTO;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_ptr_nonnull(sandbox);
        ck_assert(!cq_sandbox_enabled(sandbox));
        ck_assert_msg(strstr(cq_sandbox_reason(sandbox), "is a symbolic link"),
                      "%s", cq_sandbox_reason(sandbox));
        cq_sandbox_destroy(&sandbox);
        for (i = 0; i < 3; i++) {
                static const char *const mode[] = {"on", "auto", "off"};
                cq_config_t cfg;
                cq_backend_t *backend;

                ck_assert_int_eq(cq_config_init(&cfg), 0);
                ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_SANDBOX", mode[i],
                                               NULL, errstr, sizeof(errstr)),
                                 0);
                ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_WORK_ROOT", link,
                                               NULL, errstr, sizeof(errstr)),
                                 0);
                backend = cq_backend_new(&cfg, 0, errstr, sizeof(errstr));
                ck_assert_ptr_null(backend);
                ck_assert_msg(strstr(errstr, "is a symbolic link"), "%s: %s",
                              mode[i], errstr);
                cq_config_release(&cfg);
        }

        /* a file */
        snprintf(file, sizeof(file), "%s/file", top);
        cq_check_spit(file, "x", 1);
        ck_assert_int_eq(cq_work_root_prepare(file, errstr, sizeof(errstr)),
                         -1);
        ck_assert_msg(strstr(errstr, "is not a directory"), "%s", errstr);

        /* another uid's directory: only root can make one here */
        if (geteuid() == 0) {
                ck_assert_int_eq(chown(dir, 12345, 12345), 0);
                ck_assert_int_eq(
                    cq_work_root_prepare(dir, errstr, sizeof(errstr)), -1);
                ck_assert_msg(strstr(errstr, "must belong to uid 0 and be "
                                             "writable only by it (it is uid "
                                             "12345, mode 0755)"),
                              "%s", errstr);
                ck_assert_int_eq(lstat(dir, &st), 0);
                ck_assert_uint_eq(st.st_mode & 07777, 0755);
        } else {
                ck_assert_int_eq(
                    cq_work_root_prepare("/usr", errstr, sizeof(errstr)), -1);
                ck_assert_msg(strstr(errstr, "must belong to uid"), "%s",
                              errstr);
        }
        unlink(file);
        unlink(link);
        rmdir(dir);
        ck_assert_int_eq(rmdir(top), 0);
}
END_TEST

/* CODERQ_SANDBOX=on (the default) with a bubblewrap that cannot work is
 * an error, never a fallback; only auto falls back, and says why. */
START_TEST(sandbox_on_fails_closed)
{
        cq_config_t cfg;
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        char errstr[512] = "";
        long first, last;
        bool required;

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_str_eq(cfg.sandbox, "on");
        ck_assert_str_eq(cfg.sandbox_uids, "auto");
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_SANDBOX_UIDS", "999-2000",
                                       NULL, errstr, sizeof(errstr)),
                         -1);
        /* the config's bound is the sandbox's */
        {
                char want[64];

                snprintf(want, sizeof(want), "%ld <= FIRST",
                         (long)CQ_SANDBOX_UIDS_MIN);
                ck_assert_msg(strstr(errstr, want) != NULL, "%s", errstr);
        }
        /* below 65536, for user namespaces that map only 65536 uids */
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_SANDBOX_UIDS",
                                       "60000-60999", NULL, errstr,
                                       sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_SANDBOX_UIDS",
                                       "200000-100000", NULL, errstr,
                                       sizeof(errstr)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_SANDBOX_UIDS", "100000",
                                       NULL, errstr, sizeof(errstr)),
                         -1);
        ck_assert_int_eq(cq_config_set(&cfg, "sandbox-uids", "300000-300009",
                                       NULL, errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(
            cq_sandbox_uids_parse(cfg.sandbox_uids, &first, &last, &required),
            0);
        ck_assert_int_eq(first, 300000);
        ck_assert_int_eq(last, 300009);
        ck_assert(required);
        ck_assert_int_eq(
            cq_sandbox_uids_parse("auto", &first, &last, &required), 0);
        ck_assert_int_eq(first, CQ_SANDBOX_UIDS_FIRST);
        ck_assert(!required);
        cq_config_release(&cfg);

        mkdir(root, 0711);
        sopts.probe_dir = root;
        sopts.mode = CQ_SANDBOX_ON;
        sopts.bwrap = "/nonexistent/bwrap";
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_ptr_null(sandbox);
        ck_assert_msg(strstr(errstr, "could not enable the sandbox") &&
                          strstr(errstr, "/nonexistent/bwrap"),
                      "%s", errstr);
        /* present, but failing its probe */
        sopts.bwrap = "/bin/false";
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_ptr_null(sandbox);
        ck_assert_msg(strstr(errstr, "probe failed") != NULL, "%s", errstr);
        /* a work root that cannot be created fails it too */
        sopts.bwrap = NULL;
        sopts.probe_dir = "/proc/nope/coderq";
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_ptr_null(sandbox);
        ck_assert_msg(strstr(errstr, "/proc/nope") != NULL, "%s", errstr);
        /* auto, asked for explicitly, falls back and says why */
        sopts.probe_dir = root;
        sopts.bwrap = "/bin/false";
        sopts.mode = CQ_SANDBOX_AUTO;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_ptr_nonnull(sandbox);
        ck_assert(!cq_sandbox_enabled(sandbox));
        ck_assert_str_eq(cq_sandbox_mode_name(sandbox), "off");
        ck_assert_ptr_nonnull(strstr(cq_sandbox_reason(sandbox), "probe"));
        cq_sandbox_destroy(&sandbox);
        /* a uid range the operator named needs root: never less isolation
         * than configured (checked as an unprivileged child) */
        if (geteuid() == 0) {
                int status = -1;
                pid_t pid = fork();

                ck_assert_int_ge(pid, 0);
                if (pid == 0) {
                        cq_sandbox_opts_t o = {0};
                        char e[512] = "";
                        cq_sandbox_t *sb;

                        if (setgid(65534) || setuid(65534))
                                _exit(10);
                        o.mode = CQ_SANDBOX_ON;
                        o.probe_dir = "/tmp";
                        o.uid_first = 300000;
                        o.uid_last = 300009;
                        o.uids_required = true;
                        sb = cq_sandbox_new(&o, e, sizeof(e));
                        if (sb)
                                _exit(11);
                        _exit(strstr(e, "needs a worker running as root") ? 0
                                                                          : 12);
                }
                ck_assert_int_eq(waitpid(pid, &status, 0), pid);
                ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                              "unprivileged child: status %d", status);
                /* a range holding an account's uid (Debian's nobody is
                 * 65534) is refused: its kernels could use that
                 * account's files */
                sopts.mode = CQ_SANDBOX_ON;
                sopts.bwrap = NULL;
                sopts.uid_first = 65000;
                sopts.uid_last = 65534;
                sopts.uids_required = true;
                sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
                ck_assert_ptr_null(sandbox);
                ck_assert_msg(strstr(errstr, "is the account \"nobody\"") ||
                                  strstr(errstr, "is the group \"nogroup\""),
                              "%s", errstr);
        }
}
END_TEST

/* The sandbox on, a uid per kernel, \p nproc processes each; the caller
 * skipped where root or bubblewrap is missing. */
static cq_sandbox_t *uid_sandbox(long nproc)
{
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        char errstr[512];

        sopts.mode = CQ_SANDBOX_ON;
        sopts.probe_dir = root;
        sopts.nproc = nproc;
        sopts.uid_first = CQ_SANDBOX_UIDS_FIRST;
        sopts.uid_last = CQ_SANDBOX_UIDS_LAST;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        return sandbox;
}

/* A file of the host's, \p path, holds \p want. */
static void assert_file(const char *path, const char *want)
{
        char buf[256] = "";
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n;

        ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        ck_assert_int_ge(n, 0);
        buf[n] = '\0';
        ck_assert_str_eq(buf, want);
}

/* The run dir (.coderq) and the work dir around it belong to the
 * kernel's uid, and its code may leave links there for the worker, which
 * is root, to follow on the kernel's next start or at its end: a
 * kernel.log that leads to a host file (which the new kernel's stdout
 * would have been appended to), a .coderq that is a link to a host dir
 * (whose files its start would have replaced and its end removed). The
 * worker follows none: kernel.c's run_fd, kernel_proc.c's open_log(). */
START_TEST(kernel_links_do_not_lead_the_worker_out)
{
        cq_sandbox_t *sandbox;
        cq_interp_t *interp;
        cq_cell_result_t res;
        char errstr[512], victim[PATH_MAX], vdir[PATH_MAX];
        char vfile[PATH_MAX + 16];
        char code[PATH_MAX + 256];
        int fd;

        if (geteuid() != 0)
                CQ_CHECK_SKIP("root", "kernel_links_do_not_lead_the_worker_out:"
                                      " a kernel of another uid needs root");
        if (!bwrap_works(NULL, errstr, sizeof(errstr)))
                CQ_CHECK_SKIP("bwrap", "%s", errstr);
        sandbox = uid_sandbox(64);
        snprintf(victim, sizeof(victim), "%s/victim-%ld", root, (long)getpid());
        snprintf(vdir, sizeof(vdir), "%s/vdir-%ld", root, (long)getpid());
        snprintf(vfile, sizeof(vfile), "%s/kernel.log", vdir);
        fd = open(victim, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "original\n", 9), 9);
        close(fd);
        ck_assert_int_eq(mkdir(vdir, 0700), 0);
        fd = open(vfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "precious\n", 9), 9);
        close(fd);

        /* kernel.log made a link to a host file, then a restart */
        interp = start_local(sandbox, 0);
        snprintf(code, sizeof(code),
                 "import os\nos.unlink('.coderq/kernel.log')\n"
                 "os.symlink('%s', '.coderq/kernel.log')\nprint('planted')",
                 victim);
        assert_stdout(interp, code, "planted\n");
        run(interp, "import os\nos.kill(os.getpid(), 9)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        cq_cell_result_release(&res);
        /* its stdout and stderr as file descriptors, the log's */
        run(interp,
            "import os\nos.write(1, b'escaped\\n')\nos.write(2, b'escaped\\n')",
            30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_OK);
        cq_cell_result_release(&res);
        assert_file(victim, "original\n");
        /* its log is a file of the worker's again, not the link */
        assert_stdout(interp,
                      "import os\nprint(os.path.islink('.coderq/kernel.log'))",
                      "False\n");

        /* .coderq made a link to a host dir, then a restart and the end */
        snprintf(code, sizeof(code),
                 "import os\nos.rename('.coderq', 'moved')\n"
                 "os.symlink('%s', '.coderq')\nprint('planted')",
                 vdir);
        assert_stdout(interp, code, "planted\n");
        /* its restart fails (the kernel finds no connection file where
         * its .coderq now leads), with the cell or after it */
        {
                cq_exec_opts_t opts = {0};
                cq_err_t e;

                opts.timeout_ms = 30000;
                cq_cell_result_init(&res);
                e = cq_interp_execute(
                    interp, "import os\nos.kill(os.getpid(), 9)", &opts, &res);
                ck_assert(e != CQ_OK || res.status == CQ_CELL_DIED);
                cq_cell_result_release(&res);
        }
        cq_interp_destroy(&interp);
        assert_file(vfile, "precious\n");
        ck_assert_int_eq(unlink(vfile), 0);
        ck_assert_int_eq(rmdir(vdir), 0); /* nothing else was made in it */
        ck_assert_int_eq(unlink(victim), 0);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A uid of its own per kernel: a fork bomb fills its own process limit
 * only, and a concurrent kernel still forks. The bomb's children wait on
 * a pipe (at most two minutes) so the limit stays full while the other
 * kernel runs its subprocess. */
START_TEST(fork_bomb_stays_in_its_kernel)
{
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        cq_interp_t *a, *b;
        char errstr[512], *out;
        cq_cell_result_t res;
        long ua = -1, ub = -1;
        struct stat st;

        if (geteuid() != 0)
                CQ_CHECK_SKIP("root", "uids are switched by root only");
        if (!bwrap_works(NULL, errstr, sizeof(errstr)))
                CQ_CHECK_SKIP("bwrap", "%s", errstr);
        sopts.mode = CQ_SANDBOX_ON;
        sopts.probe_dir = root;
        sopts.nproc = 64;
        sopts.uid_first = CQ_SANDBOX_UIDS_FIRST;
        sopts.uid_last = CQ_SANDBOX_UIDS_LAST;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        ck_assert(cq_sandbox_uid_per_kernel(sandbox));
        a = start_local(sandbox, 0);
        b = start_local(sandbox, 0);
        run(a, "import os\nprint(os.getuid())", 30000, &res);
        out = stream_text(&res, "stdout");
        ua = strtol(out, NULL, 10);
        free(out);
        cq_cell_result_release(&res);
        run(b, "import os\nprint(os.getuid())", 30000, &res);
        out = stream_text(&res, "stdout");
        ub = strtol(out, NULL, 10);
        free(out);
        cq_cell_result_release(&res);
        ck_assert_int_ne(ua, ub);
        ck_assert(ua >= CQ_SANDBOX_UIDS_FIRST && ua <= CQ_SANDBOX_UIDS_LAST);
        ck_assert(ub >= CQ_SANDBOX_UIDS_FIRST && ub <= CQ_SANDBOX_UIDS_LAST);
        /* each work dir belongs to its kernel's uid */
        ck_assert_int_eq(
            stat(cq_kernel_work_dir(cq_local_interp_kernel(a)), &st), 0);
        ck_assert_int_eq((long)st.st_uid, ua);
        ck_assert_int_eq(
            stat(cq_kernel_work_dir(cq_local_interp_kernel(b)), &st), 0);
        ck_assert_int_eq((long)st.st_uid, ub);
        /* the bomb: fork until the limit says no */
        assert_stdout(a,
                      "import os, select, errno\n"
                      "r, w = os.pipe()\n"
                      "kids, err = [], None\n"
                      "for _ in range(1000):\n"
                      "    try:\n"
                      "        pid = os.fork()\n"
                      "    except OSError as e:\n"
                      "        err = e.errno\n"
                      "        break\n"
                      "    if pid == 0:\n"
                      "        os.close(w)\n"
                      "        select.select([r], [], [], 120)\n"
                      "        os._exit(0)\n"
                      "    kids.append(pid)\n"
                      "os.close(r)\n"
                      "print(err == errno.EAGAIN, 0 < len(kids) < 64)",
                      "True True\n");
        /* the other kernel is not affected */
        run(b,
            "import subprocess\n"
            "try:\n"
            "    print(subprocess.run(['true']).returncode)\n"
            "except OSError as e:\n"
            "    print('failed', e)",
            30000, &res);
        out = stream_text(&res, "stdout");
        ck_assert_msg(strcmp(out, "0\n") == 0,
                      "a fork bomb in another kernel broke this one: %s", out);
        free(out);
        cq_cell_result_release(&res);
        /* and the bomb is over once its pipe closes */
        assert_stdout(a,
                      "os.close(w)\n"
                      "for p in kids:\n"
                      "    os.waitpid(p, 0)\n"
                      "print(len(kids) > 0)",
                      "True\n");
        cq_interp_destroy(&a);
        cq_interp_destroy(&b);
        /* both uids are free again: two leases get two uids of the range,
         * and none runs a process any more */
        {
                cq_sandbox_id_t ia = CQ_SANDBOX_ID_INIT,
                                ib = CQ_SANDBOX_ID_INIT;

                ck_assert_int_eq(
                    cq_sandbox_id_acquire(sandbox, &ia, errstr, sizeof(errstr)),
                    0);
                ck_assert_int_eq(
                    cq_sandbox_id_acquire(sandbox, &ib, errstr, sizeof(errstr)),
                    0);
                ck_assert(ia.drop && ib.drop);
                ck_assert_uint_ne(ia.uid, ib.uid);
                cq_sandbox_id_release(&ia);
                cq_sandbox_id_release(&ib);
        }
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A job's "backend" may ask for more isolation than the configuration
 * (E2B where local kernels are the default), never for less: where an
 * operator chose E2B, a job naming local kernels fails with the reason,
 * and no kernel starts. */
START_TEST(job_cannot_choose_less_isolation)
{
        static const char *const set[][2] = {{"CODERQ_BACKEND", "e2b"},
                                             {"E2B_API_KEY", "e2b_test"},
                                             {"CODERQ_SANDBOX", "off"}};
        cq_config_t cfg;
        cq_backend_t *backend;
        cq_interp_t *interp = (cq_interp_t *)&interp;
        char errstr[512], where[384], own_root[300];
        size_t i;

        snprintf(own_root, sizeof(own_root), "%s-backend", root);
        ck_assert_int_eq(cq_config_init(&cfg), 0);
        for (i = 0; i < CQ_ARRAY_SIZE(set); i++)
                ck_assert_int_eq(cq_config_set(&cfg, set[i][0], set[i][1], NULL,
                                               errstr, sizeof(errstr)),
                                 0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_WORK_ROOT", own_root, NULL,
                                       errstr, sizeof(errstr)),
                         0);
        backend = cq_backend_new(&cfg, 0, errstr, sizeof(errstr));
        ck_assert_msg(backend != NULL, "%s", errstr);
        errstr[0] = '\0';
        ck_assert_int_eq(cq_backend_acquire(backend, "local", 5000, &interp,
                                            errstr, sizeof(errstr)),
                         CQ_ERR_FATAL);
        ck_assert_ptr_null(interp);
        ck_assert_msg(strstr(errstr, "the job asks for backend \"local\", "
                                     "less isolated than this worker's "
                                     "CODERQ_BACKEND=e2b: refused"),
                      "%s", errstr);
        cq_backend_describe_job(backend, "local", where, sizeof(where));
        ck_assert_str_eq(where,
                         "backend \"local\", refused: this worker runs jobs "
                         "on e2b");
        cq_backend_describe_job(backend, NULL, where, sizeof(where));
        ck_assert_msg(strncmp(where, "an E2B sandbox", 14) == 0, "%s", where);
        ck_assert_int_eq(count_kernels(), 0);
        cq_backend_destroy(&backend);

        /* the other way round is allowed: local configured, E2B asked */
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_BACKEND", "local", NULL,
                                       errstr, sizeof(errstr)),
                         0);
        backend = cq_backend_new(&cfg, 0, errstr, sizeof(errstr));
        ck_assert_msg(backend != NULL, "%s", errstr);
        cq_backend_describe_job(backend, "e2b", where, sizeof(where));
        ck_assert_msg(strncmp(where, "an E2B sandbox", 14) == 0, "%s", where);
        cq_backend_describe_job(backend, "local", where, sizeof(where));
        ck_assert_msg(strncmp(where, "local kernels", 13) == 0, "%s", where);
        cq_backend_destroy(&backend);
        cq_config_release(&cfg);
        ck_assert_int_eq(rmdir(own_root), 0); /* no kernel dir was made */
}
END_TEST

/* Every command that runs model code sets its process non-dumpable in
 * cq_backend_new(), before any kernel: then code of the same uid cannot
 * read its /proc/PID/environ (where the API keys are). Run as an
 * unprivileged child, dumpable again as a worker started by a user is. */
static int dumpable_probe(void)
{
        cq_config_t cfg;
        cq_backend_t *backend;
        char errstr[512], path[64], dumpable_root[300];
        int status = -1;
        pid_t pid;

        if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
                return 10;
        if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) ||
            prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 1)
                return 11;
        setenv("CQ_TEST_SECRET", "sk-worker-secret", 1);
        /* a root of its own: the worker refuses one others may write */
        snprintf(dumpable_root, sizeof(dumpable_root), "%s-dumpable", root);
        if (cq_config_init(&cfg) ||
            cq_config_set(&cfg, "CODERQ_SANDBOX", "off", NULL, errstr,
                          sizeof(errstr)) ||
            cq_config_set(&cfg, "CODERQ_WORK_ROOT", dumpable_root, NULL, errstr,
                          sizeof(errstr)))
                return 12;
        backend = cq_backend_new(&cfg, 0, errstr, sizeof(errstr));
        if (!backend)
                return 13;
        if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
                return 14;
        snprintf(path, sizeof(path), "/proc/%ld/environ", (long)getpid());
        pid = fork();
        if (pid < 0)
                return 15;
        if (pid == 0) {
                int fd = open("/dev/null", O_WRONLY);

                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                }
                execl("/bin/cat", "cat", path, (char *)NULL);
                _exit(127);
        }
        if (waitpid(pid, &status, 0) != pid)
                return 16;
        cq_backend_destroy(&backend);
        cq_config_release(&cfg);
        /* cat, our uid, could not read it */
        return WIFEXITED(status) && WEXITSTATUS(status) == 1 ? 0 : 17;
}

START_TEST(backend_makes_the_process_non_dumpable)
{
        int status = -1;
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0)
                _exit(dumpable_probe());
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        {
                char dumpable_root[300];

                snprintf(dumpable_root, sizeof(dumpable_root), "%s-dumpable",
                         root);
                rmdir(dumpable_root);
        }
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "dumpable probe failed at step %d (14: still dumpable; "
                      "17: a same-uid process read /proc/PID/environ)",
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}
END_TEST

START_TEST(nothing_left_behind)
{
        DIR *dir;
        struct dirent *de;
        int entries = 0;

        ck_assert_int_eq(count_kernels(), 0);
        dir = opendir(root);
        if (dir) {
                while ((de = readdir(dir)))
                        if (strcmp(de->d_name, ".") &&
                            strcmp(de->d_name, "..")) {
                                fprintf(stderr, "left behind: %s/%s\n", root,
                                        de->d_name);
                                entries++;
                        }
                closedir(dir);
                rmdir(root);
        }
        ck_assert_int_eq(entries, 0);
}
END_TEST

/* ---- the kernel server ---- */

/* stdout of one cell; caller frees. */
static char *stdout_of(cq_interp_t *interp, const char *code)
{
        cq_cell_result_t res;
        char *out;

        run(interp, code, 30000, &res);
        out = stream_text(&res, "stdout");
        cq_cell_result_release(&res);
        return out;
}

static cq_kserver_t *new_kserver(const cq_sandbox_t *sandbox,
                                 const char *python,
                                 const char *preload,
                                 int64_t reply_ms,
                                 cq_kserver_mode_t mode,
                                 char *errstr,
                                 size_t errstr_size)
{
        cq_kserver_opts_t ko;

        memset(&ko, 0, sizeof(ko));
        ko.mode = mode;
        ko.work_root = root;
        ko.sandbox = sandbox;
        ko.python = python;
        ko.preload = preload;
        ko.reply_timeout_ms = reply_ms;
        mkdir(root, 0711);
        return cq_kserver_new(&ko, errstr, errstr_size);
}

/* A kernel server on \p sandbox importing \p preload, which must start. */
static cq_kserver_t *server_with(const cq_sandbox_t *sandbox,
                                 const char *preload)
{
        char errstr[700];
        cq_kserver_t *ks = new_kserver(sandbox, NULL, preload, 0, CQ_KSERVER_ON,
                                       errstr, sizeof(errstr));

        ck_assert_msg(ks != NULL, "%s", errstr);
        return ks;
}

/* A kernel on \p sandbox that \p ks must fork, not start cold. */
static cq_interp_t *start_forked(const cq_sandbox_t *sandbox, cq_kserver_t *ks)
{
        cq_interp_t *interp = start_kernel(sandbox, 0, ks);

        ck_assert_msg(cq_kernel_forked(cq_local_interp_kernel(interp)),
                      "the kernel started cold, not forked");
        return interp;
}

/* Threads of process \p pid, from /proc. */
static int threads_of(pid_t pid)
{
        char path[64];
        struct dirent *de;
        DIR *dir;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
        dir = opendir(path);
        ck_assert_ptr_nonnull(dir);
        while ((de = readdir(dir)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(dir);
        return n;
}

/* Two kernels forked at once from one server into the sandbox: neither
 * sees the other's files or processes nor can signal it, neither has a
 * network, each has its own uid, random state and fresh namespace, and
 * the server had one thread at every fork. */
START_TEST(forked_kernels_are_strangers)
{
        cq_sandbox_opts_t sopts = {0};
        cq_sandbox_t *sandbox;
        cq_kserver_t *ks;
        cq_kserver_stats_t st;
        cq_interp_t *a, *b;
        char errstr[700], code[1024], *ra, *rb, *out;
        pid_t pa, pb;
        int lfd, port;

        if (geteuid() != 0)
                CQ_CHECK_SKIP("root", "forked_kernels_are_strangers: the "
                                      "kernel server's sandbox needs root");
        if (!bwrap_works(NULL, errstr, sizeof(errstr)))
                CQ_CHECK_SKIP("bwrap", "%s", errstr);
        sopts.mode = CQ_SANDBOX_ON;
        sopts.probe_dir = root;
        sopts.nproc = 256;
        sopts.uid_first = CQ_SANDBOX_UIDS_FIRST;
        sopts.uid_last = CQ_SANDBOX_UIDS_LAST;
        sandbox = cq_sandbox_new(&sopts, errstr, sizeof(errstr));
        ck_assert_msg(sandbox != NULL, "%s", errstr);
        ks = server_with(sandbox, "numpy");
        ck_assert(cq_kserver_enabled(ks));
        a = start_forked(sandbox, ks);
        b = start_forked(sandbox, ks);
        ck_assert_int_eq(threads_of(cq_kserver_pid(ks)), 1);
        cq_kserver_stats(ks, &st);
        ck_assert_uint_eq(st.forked, 2);
        pa = cq_kernel_pid(cq_local_interp_kernel(a));
        pb = cq_kernel_pid(cq_local_interp_kernel(b));
        /* files: a's work dir does not exist for b, only its own */
        assert_stdout(a, "open('mine.txt', 'w').write('a')\nprint('ok')",
                      "ok\n");
        snprintf(code, sizeof(code),
                 "import os\nprint(os.path.exists('%s'), "
                 "os.path.exists('%s/mine.txt'), os.listdir('.'))",
                 cq_kernel_work_dir(cq_local_interp_kernel(a)),
                 cq_kernel_work_dir(cq_local_interp_kernel(a)));
        assert_stdout(b, code, "False False ['.coderq']\n");
        /* processes: only its own pid 1 and itself; its parent is the
         * server, outside its namespace (pid 1 is kinit/kinit.c's program) */
        assert_stdout(a,
                      "import os\nprint(sorted(int(p) for p in "
                      "os.listdir('/proc') if p.isdigit()) == [1, "
                      "os.getpid()], os.getppid(), "
                      "open('/proc/1/comm').read().strip())",
                      "True 0 coderq-kinit\n");
        /* no signal reaches the other, by its host pid or any other */
        snprintf(code, sizeof(code),
                 "import os, signal\nr = []\nfor p in (%ld, %ld):\n"
                 "    try:\n        os.kill(p, signal.SIGKILL)\n"
                 "        r.append('sent')\n"
                 "    except OSError as e:\n        r.append(e.errno)\n"
                 "print(r)",
                 (long)pb, (long)pa);
        assert_stdout(a, code, "[3, 3]\n"); /* ESRCH: not in its world */
        assert_stdout(b, "print('alive')", "alive\n");
        /* no network: a port listening on the host's loopback is out of
         * reach, and no interface but loopback exists */
        lfd = listen_loopback(&port);
        snprintf(code, sizeof(code),
                 "import socket\ntry:\n"
                 "    socket.create_connection(('127.0.0.1', %d), 3)\n"
                 "    print('connected')\nexcept OSError:\n"
                 "    print('refused')\n"
                 "print(sorted(n for _, n in socket.if_nameindex()))",
                 port);
        assert_stdout(a, code, "refused\n['lo']\n");
        close(lfd);
        /* its own uid; the worker's environment is not there */
        ra = stdout_of(a, "import os\nprint(os.getuid(), "
                          "'CQ_CHECK_KSERVER' in os.environ)");
        rb = stdout_of(b, "import os\nprint(os.getuid(), "
                          "'CQ_CHECK_KSERVER' in os.environ)");
        ck_assert_str_ne(ra, rb);
        ck_assert_ptr_nonnull(strstr(ra, " False"));
        free(ra);
        free(rb);
        /* random state: reseeded in each child, so siblings differ */
        ra = stdout_of(a, "import random, numpy\nprint(random.random(), "
                          "numpy.random.rand())");
        rb = stdout_of(b, "import random, numpy\nprint(random.random(), "
                          "numpy.random.rand())");
        ck_assert_str_ne(ra, rb);
        ck_assert_msg(strchr(ra, ' ') &&
                          strncmp(ra, rb, (size_t)(strchr(ra, ' ') - ra)) &&
                          strcmp(strchr(ra, ' '), strchr(rb, ' ')),
                      "same random state: %s / %s", ra, rb);
        free(ra);
        free(rb);
        /* fresh: nothing of a's session in b; numpy preloaded */
        assert_stdout(a, "secret = 42", "");
        out = stdout_of(b, "import sys\nprint('secret' in dir(), 'numpy' in "
                           "sys.modules)");
        ck_assert_str_eq(out, "False True\n");
        free(out);
        ck_assert_int_eq(threads_of(cq_kserver_pid(ks)), 1);
        cq_interp_destroy(&a);
        cq_interp_destroy(&b);
        cq_kserver_destroy(&ks);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

static int open_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0;

        ck_assert_ptr_nonnull(d);
        while ((e = readdir(d)))
                n += e->d_name[0] != '.';
        closedir(d);
        return n - 1; /* the DIR's own */
}

/* A sandboxed forked kernel binds its sockets on its own /tmp, not in
 * the work dir's run dir (kernel_proc.c's reach_tmp()); the client
 * reaches them through an fd that goes with the kernel, a restart
 * included; no kernel sees another's, and none is left open. */
START_TEST(forked_kernel_sockets_are_on_its_tmp)
{
        cq_sandbox_t *sandbox;
        cq_kserver_t *ks;
        cq_interp_t *a, *b;
        char errstr[700];
        const char *listing =
            "import os\nprint(sorted(os.listdir('.coderq')), sorted(n for n "
            "in os.listdir('/tmp') if n.startswith('.coderq')))";
        const char *want = "['conn.json', 'kernel.log'] ['.coderq-k-1', "
                           "'.coderq-k-2', '.coderq-k-3', '.coderq-k-4', "
                           "'.coderq-k-5']\n";
        int fds;

        if (geteuid() != 0)
                CQ_CHECK_SKIP("root", "forked_kernel_sockets_are_on_its_tmp: "
                                      "the kernel server's sandbox needs "
                                      "root");
        if (!bwrap_works(NULL, errstr, sizeof(errstr)))
                CQ_CHECK_SKIP("bwrap", "%s", errstr);
        sandbox = uid_sandbox(256);
        ks = server_with(sandbox, "");
        ck_assert(cq_kserver_enabled(ks));
        fds = open_fds();
        a = start_forked(sandbox, ks);
        b = start_forked(sandbox, ks);
        assert_stdout(a, listing, want);
        assert_stdout(b, listing, want);
        /* the report of the warm-up was read and removed */
        assert_stdout(a,
                      "import os\nprint(os.path.exists("
                      "'/tmp/.coderq-warm-up.json'))",
                      "False\n");
        /* b's sockets are not a's, whatever a does to its own */
        assert_stdout(a,
                      "import os\nfor n in os.listdir('/tmp'):\n"
                      "    if n.startswith('.coderq-k-'):\n"
                      "        os.unlink('/tmp/' + n)\nprint('gone')",
                      "gone\n");
        assert_stdout(b, "print('b answers')", "b answers\n");
        assert_stdout(a, "print('a answers')", "a answers\n");
        /* a restart forks again, with a /tmp of its own again */
        ck_assert_int_eq(cq_interp_restart(a), CQ_OK);
        ck_assert(cq_kernel_forked(cq_local_interp_kernel(a)));
        assert_stdout(a, listing, want);
        assert_stdout(a, "x = 1\nprint(x)", "1\n");
        cq_interp_destroy(&a);
        cq_interp_destroy(&b);
        ck_assert_int_eq(open_fds(), fds);
        cq_kserver_destroy(&ks);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* The shell the server builds before the fork is fresh in every kernel:
 * a variable, an import's side effect on a preloaded module and on
 * builtins, and an alias magic made in one forked kernel are absent from
 * the next, whose history (In, _ih, Out, _oh) holds its own cell alone;
 * the shell is the server's, fitted to the kernel's directories, with
 * a history database whose one session is the kernel's, the first, as a
 * cold kernel's is. */
START_TEST(forked_kernels_get_a_fresh_shell)
{
        cq_kserver_t *ks;
        cq_interp_t *a, *b;
        char *out;

        ks = server_with(NULL, "numpy");
        a = start_forked(NULL, ks);
        assert_stdout(a, "cq_secret = 42", "");
        assert_stdout(a,
                      "import builtins, numpy\nnumpy.cq_mark = 1\n"
                      "builtins.cq_mark = 1",
                      "");
        assert_stdout(a, "%alias cq_hi echo hi", "");
        assert_stdout(a, "print(get_ipython().alias_manager.is_alias('cq_hi'))",
                      "True\n");
        assert_stdout(a, "6 * 7", "");
        assert_stdout(a, "print('cq_secret = 42' in In, 42 in Out.values())",
                      "True True\n");
        b = start_forked(NULL, ks);
        out = stdout_of(b, "import builtins, numpy, os\nip = get_ipython()\n"
                           "print('cq_secret' in dir(), hasattr(numpy, "
                           "'cq_mark'), hasattr(builtins, 'cq_mark'), "
                           "ip.alias_manager.is_alias('cq_hi'), 'cq_hi' in "
                           "ip.magics_manager.magics['line'])\n"
                           "print(len(In), In[0], len(_ih), Out, _oh, "
                           "ip.execution_count)\n"
                           "hm = ip.history_manager\n"
                           "print(hm.session_number, hm.db.execute("
                           "'SELECT count(*), min(session) FROM sessions')"
                           ".fetchone(), "
                           "[str(p) for p in _dh] == [os.getcwd()] == "
                           "[ip.starting_dir], "
                           "ip.profile_dir.location == os.path.join("
                           "os.environ['IPYTHONDIR'], 'profile_default'))");
        ck_assert_str_eq(out, "False False False False False\n"
                              "2  2 {} {} 1\n"
                              "1 (1, 1) True True\n");
        free(out);
        cq_interp_destroy(&a);
        cq_interp_destroy(&b);
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* The server's keyring filter on a host it has no syscall numbers for is
 * an error (the confinement, and so the probe, fails: no forked kernel
 * starts), not a kernel without it. kserver.py run as a module. */
START_TEST(keyring_filter_fails_closed)
{
        static const char check[] =
            "import sys\n"
            "ns = {'__name__': 'kserver'}\n"
            "exec(open(sys.argv[1]).read(), ns)\n"
            "for m in ('riscv64', 'x86_64', 'aarch64'):\n"
            "    try:\n"
            "        print(m, len(ns['keyring_filter'](m)))\n"
            "    except ns['Fail'] as e:\n"
            "        print(m, 'riscv64' in str(e))\n";
        char path[300], cmd[700], out[256] = "";
        size_t n;
        FILE *fp;

        mkdir(root, 0711);
        snprintf(path, sizeof(path), "%s/kserver-module.py", root);
        write_text(path, cq_kserver_py);
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 -c \"$CQ_CHECK_PY\" %s",
                 path);
        setenv("CQ_CHECK_PY", check, 1);
        fp = popen(cmd, "r");
        ck_assert_ptr_nonnull(fp);
        n = fread(out, 1, sizeof(out) - 1, fp);
        out[n] = '\0';
        ck_assert_int_eq(pclose(fp), 0);
        /* x86_64: load arch; per ABI (6 and 3 numbers) a check of the
         * arch, a load of the number, its checks, allow, deny; kill */
        ck_assert_str_eq(out, "riscv64 True\nx86_64 19\naarch64 16\n");
        unlink(path);
}
END_TEST

/* The key syscalls in a cell: add_key, keyctl and request_key by number
 * through libc's syscall(), on x86_64 also by x32's numbers and by
 * int 0x80 (i386, in a child: a host without it kills the child). Each
 * prints "ok" or its errno's name. */
static const char keys_cell[] =
    "import ctypes, errno, mmap, os, platform\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "m = platform.machine()\n"
    "ADD, REQ, CTL = {'x86_64': (248, 249, 250),\n"
    "                 'aarch64': (217, 218, 219)}[m]\n"
    "def sc(n, *a):\n"
    "    r = libc.syscall(ctypes.c_long(n), *a)\n"
    "    if r >= 0:\n"
    "        return 'ok'\n"
    "    return errno.errorcode.get(ctypes.get_errno(), '?')\n"
    "U = ctypes.c_int(-4)  # KEY_SPEC_USER_KEYRING\n"
    "def add(n):\n"
    "    return sc(n, b'user', b'cq-cross-job', b'secret', "
    "ctypes.c_size_t(6), U)\n"
    "def int80(nr):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        # push rbx; mov eax, nr; xor ebx, ebx; int 0x80; pop rbx; ret\n"
    "        code = b'\\x53\\xb8' + nr.to_bytes(4, 'little') + "
    "b'\\x31\\xdb\\xcd\\x80\\x5b\\xc3'\n"
    "        p = mmap.mmap(-1, 4096, prot=7)\n"
    "        p.write(code)\n"
    "        f = ctypes.CFUNCTYPE(ctypes.c_int)(\n"
    "            ctypes.addressof(ctypes.c_char.from_buffer(p)))\n"
    "        os._exit(-f() & 0xff)\n"
    "    st = os.waitpid(pid, 0)[1]\n"
    "    if not os.WIFEXITED(st):\n"
    "        return 'none'\n"
    "    return errno.errorcode.get(os.WEXITSTATUS(st), 'ok')\n"
    "print(add(ADD), sc(CTL, ctypes.c_int(0), U, ctypes.c_int(1)),\n"
    "      sc(REQ, b'user', b'cq-cross-job', None, ctypes.c_int(0)))\n"
    "if m == 'x86_64':\n"
    "    print(add(ADD | 0x40000000), int80(286))\n"
    "else:\n"
    "    print('EPERM EPERM')\n";

/* A later kernel, leased the same uid, looks for the key. */
static const char search_cell[] =
    "import ctypes, errno, platform\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "CTL = {'x86_64': 250, 'aarch64': 219}[platform.machine()]\n"
    "r = libc.syscall(ctypes.c_long(CTL), ctypes.c_int(10), "
    "ctypes.c_int(-4), b'user', b'cq-cross-job', ctypes.c_int(0))\n"
    "print('found' if r >= 0 else 'not found')\n";

/* A forked sandboxed kernel runs as a host uid in the initial user
 * namespace, where the uid's keyring outlives the job: its key syscalls
 * fail with EPERM (a seccomp filter, in every ABI), and what else it runs
 * still runs. A cold kernel's keyring is its user namespace's: in both
 * modes, a key one job added is not found by the next kernel, which gets
 * the same uid. */
START_TEST(kernels_share_no_keyring)
{
        cq_sandbox_t *sandbox;
        cq_interp_t *interp;
        struct utsname un;
        cq_cell_result_t res;
        char *out, *uid, why[600];

        ck_assert_int_eq(uname(&un), 0);
        if (strcmp(un.machine, "x86_64") && strcmp(un.machine, "aarch64"))
                CQ_CHECK_SKIP("bwrap",
                              "kernels_share_no_keyring: no key syscall "
                              "numbers for %s",
                              un.machine);
        sandbox = usable_sandbox(why, sizeof(why));
        if (!sandbox)
                CQ_CHECK_SKIP("bwrap", "kernels_share_no_keyring: %s", why);
        interp = start_local(sandbox, 0);
        uid = stdout_of(interp, "import os\nprint(os.getuid())");
        run(interp, keys_cell, 60000, &res);
        out = stream_text(&res, "stdout");
        if (forked_mode())
                ck_assert_msg(strcmp(out, "EPERM EPERM EPERM\nEPERM EPERM\n") ==
                                  0,
                              "key syscalls in a forked kernel:\n%s", out);
        else
                ck_assert_msg(strncmp(out, "ok ok", 5) == 0,
                              "key syscalls in a cold kernel:\n%s", out);
        free(out);
        cq_cell_result_release(&res);
        assert_stdout(interp,
                      "import subprocess, sys\n"
                      "print(subprocess.run([sys.executable, '-c', "
                      "'print(6 * 7)'], capture_output=True).stdout.decode()"
                      ".strip(), sum(range(10)))",
                      "42 45\n");
        cq_interp_destroy(&interp);
        interp = start_local(sandbox, 0);
        assert_stdout(interp, "import os\nprint(os.getuid())", uid);
        assert_stdout(interp, search_cell, "not found\n");
        free(uid);
        cq_interp_destroy(&interp);
        cq_sandbox_destroy(&sandbox);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* What a module makes random when it is imported is each kernel's own:
 * multiprocessing's authentication key, imported by the server, differs
 * between two kernels it forks, as between two cold ones. */
START_TEST(forked_kernels_get_their_own_keys)
{
        static const char cell[] =
            "import multiprocessing as mp\n"
            "print(bytes(mp.current_process().authkey).hex())";
        cq_kserver_t *ks = server_with(NULL, "multiprocessing");
        cq_interp_t *a = start_forked(NULL, ks), *b = start_forked(NULL, ks);
        char *ka = stdout_of(a, cell), *kb = stdout_of(b, cell);

        ck_assert_uint_eq(strlen(ka), 65);
        ck_assert_str_ne(ka, kb);
        free(ka);
        free(kb);
        cq_interp_destroy(&a);
        cq_interp_destroy(&b);
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* An unsandboxed kernel, cold or forked, that dies by itself takes its
 * process group with it: a job's subprocess left in that group (which
 * outlives the kernel otherwise, reparented to an init or the server) is
 * killed before the cell's result says the kernel died, and the next
 * cell gets a fresh kernel. */
/* ps shows the kernel server as a short command, not its program:
 * kserver.py goes in on a descriptor. A forked kernel still shows a cold
 * kernel's command line, written over the room the server's argv
 * leaves. */
START_TEST(kserver_command_line_is_short)
{
        cq_kserver_t *ks = server_with(NULL, "numpy");
        cq_interp_t *interp;
        char pid[32], buf[8192];
        pid_t pids[8];
        size_t n, i, len;
        bool titled = false;

        snprintf(pid, sizeof(pid), "%ld", (long)cq_kserver_pid(ks));
        len = cmdline_of(pid, buf, sizeof(buf));
        ck_assert_msg(len > 0 && len < 1024, "%zu bytes: %.300s", len, buf);
        ck_assert_msg(strstr(buf, " -s -c exec(compile(open(6, ") &&
                          !strstr(buf, "def "),
                      "%s", buf);
        interp = start_forked(NULL, ks);
        n = kernel_pids(pids, CQ_ARRAY_SIZE(pids));
        for (i = 0; i < n && i < CQ_ARRAY_SIZE(pids); i++) {
                snprintf(pid, sizeof(pid), "%ld", (long)pids[i]);
                cmdline_of(pid, buf, sizeof(buf));
                if (strstr(buf, " -m ipykernel_launcher -f "))
                        titled = true;
        }
        ck_assert_msg(titled, "no forked kernel shows its command line");
        cq_interp_destroy(&interp);
        cq_kserver_destroy(&ks);
}
END_TEST

START_TEST(kernels_die_with_their_group)
{
        cq_kserver_t *ks;
        char mark[300], code[900];
        int i;

        ks = server_with(NULL, "numpy");
        snprintf(mark, sizeof(mark), "%s/cq-left-behind", root);
        snprintf(code, sizeof(code),
                 "import subprocess, sys\n"
                 "p = subprocess.Popen([sys.executable, '-c', 'import time; "
                 "time.sleep(600)', '%s'])\n"
                 "print(os.getpgid(p.pid) == os.getpgid(0))",
                 mark);
        for (i = 0; i < 2; i++) {
                cq_interp_t *interp =
                    i ? start_forked(NULL, ks) : start_kernel(NULL, 0, NULL);
                cq_cell_result_t res;
                pid_t pids[4];

                assert_stdout(interp, "import os", "");
                assert_stdout(interp, code, "True\n");
                ck_assert_uint_eq(pids_naming(mark, pids, 4), 1);
                run(interp, "os._exit(1)", 30000, &res);
                ck_assert_int_eq(res.status, CQ_CELL_DIED);
                cq_cell_result_release(&res);
                ck_assert_msg(pids_naming(mark, pids, 4) == 0,
                              "a %s kernel's subprocess outlived it",
                              i ? "forked" : "cold");
                assert_stdout(interp, "print('os' in dir())", "False\n");
                cq_interp_destroy(&interp);
        }
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A forked kernel records sys.modules at the end of its start as a cold
 * one does (IPython's snapshot for %reset's aggressive mode): the
 * server's modules are in it, so an aggressive reset culls a module the
 * job imported and keeps numpy, the same object as before. */
START_TEST(forked_kernels_reset_as_cold_ones)
{
        cq_kserver_t *ks;
        cq_interp_t *interp;

        ks = server_with(NULL, "numpy");
        interp = start_forked(NULL, ks);
        assert_stdout(interp,
                      "import sys\n"
                      "snap = get_ipython()._sys_modules_keys\n"
                      "print(type(snap).__name__, 'numpy' in snap, "
                      "'tabnanny' in snap, snap <= set(sys.modules), "
                      "all(type(k) is str for k in snap))",
                      "set True False True True\n");
        assert_stdout(interp,
                      "import tabnanny, numpy, sys\n"
                      "import builtins\n"
                      "builtins.cq_np = numpy\n"
                      "print('tabnanny' in sys.modules)",
                      "True\n");
        assert_stdout(interp, "%reset -f --aggressive",
                      "culling sys module...\n");
        assert_stdout(interp,
                      "import sys, builtins\n"
                      "print('tabnanny' in sys.modules, "
                      "sys.modules['numpy'] is builtins.cq_np)",
                      "False True\n");
        cq_interp_destroy(&interp);
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* What a kernel's application and matplotlib were configured with, with
 * its own connection file and directories named by placeholders. */
static const char settings_cell[] =
    "import json, os, sys\n"
    "import matplotlib as mpl\n"
    "app = get_ipython().kernel.parent\n"
    "def cq_norm(v):\n"
    "    if isinstance(v, str):\n"
    "        return v.replace(app.connection_file, '<conn>')\n"
    "    return v if isinstance(v, (int, float, bool, type(None))) else "
    "repr(v)\n"
    "def cq_conf(c):\n"
    "    return {s: {k: cq_norm(v) for k, v in sub.items()} for s, sub in "
    "c.items()}\n"
    "print(json.dumps([cq_conf(app.config), cq_conf(app.cli_config), "
    "app.extra_args, [cq_norm(a) for a in app.argv], "
    "type(app.config['IPKernelApp']).__name__], sort_keys=True))\n"
    "print(json.dumps([{k: repr(v) for k, v in p.items() if k != 'backend'} "
    "for p in (mpl.rcParams, mpl.rcParamsOrig)], sort_keys=True))\n"
    "print(mpl.rcParams['font.family'], mpl.rcParamsOrig['font.family'])\n"
    "from traitlets import traitlets as tl\n"
    "from traitlets.traitlets import HasTraits\n"
    "print(HasTraits.traits.__module__, HasTraits.traits.__qualname__, "
    "list(app.traits(config=True)) == sorted(type(app).class_traits("
    "config=True)))\n"
    "print([(os.path.basename(f.__code__.co_filename), f.__code__.co_name, "
    "f.__code__.co_firstlineno) for f in (HasTraits.traits, "
    "tl.HasDescriptors.setup_instance)], "
    "[n for n in vars(tl) if n.startswith('_cq')])\n"
    "from IPython.core import extensions\n"
    "ip = get_ipython()\n"
    "print([type(c).__name__ for c in ip.configurables], "
    "sorted(ip.extension_manager.loaded), extensions.BUILTINS_EXTS, "
    "list(ip.magics_manager.registry))\n"
    "d = os.environ['MPLCONFIGDIR']\n"
    "print(mpl.get_configdir() == mpl.get_cachedir() == d, "
    "mpl.matplotlib_fname() == os.path.join(d, 'matplotlibrc'))\n"
    "with open('/proc/self/environ', 'rb') as f:\n"
    "    block = f.read().decode().split('\\0')\n"
    "print([e.replace(os.getcwd(), '<wd>') for e in block if e])\n"
    "print(sorted(k + '=' + v.replace(os.getcwd(), '<wd>') for k, v in "
    "os.environ.items()))";

/* \p got equals \p want, or the test fails naming the first line that
 * differs (check's messages hold a few hundred bytes, not the whole). */
static void assert_same_output(const char *got, const char *want)
{
        size_t line = 1, i = 0, start = 0;

        while (got[i] && got[i] == want[i]) {
                if (got[i] == '\n') {
                        line++;
                        start = i + 1;
                }
                i++;
        }
        ck_assert_msg(got[i] == want[i],
                      "line %zu differs at byte %zu: forked \"%.150s\", cold "
                      "\"%.150s\"",
                      line, i - start, got + (i > start + 60 ? i - 60 : start),
                      want + (i > start + 60 ? i - 60 : start));
}

/* Start a test of a cold kernel beside a forked one, both with
 * \p sandbox: a server that imports \p preload, the cold kernel without
 * it, the other forked by it. Returns the server. */
static cq_kserver_t *start_pair(const cq_sandbox_t *sandbox,
                                const char *preload,
                                cq_interp_t **cold,
                                cq_interp_t **forked)
{
        cq_kserver_t *ks = server_with(sandbox, preload);

        *cold = start_kernel(sandbox, 0, NULL);
        ck_assert(!cq_kernel_forked(cq_local_interp_kernel(*cold)));
        *forked = start_forked(sandbox, ks);
        return ks;
}

/* End a test of a cold kernel beside a forked one: both kernels, their
 * server, and nothing of theirs left. */
static void
stop_pair(cq_interp_t **cold, cq_interp_t **forked, cq_kserver_t **ks)
{
        cq_interp_destroy(cold);
        cq_interp_destroy(forked);
        cq_kserver_destroy(ks);
        ck_assert_int_eq(count_kernels(), 0);
}

/* The server parses the kernels' command line, applies their matplotlibrc
 * and finds every Configurable's config traits once, before the fork: a
 * forked kernel's application configuration, rcParams and rcParamsOrig
 * are a cold kernel's, and so is traitlets once the kernel has started. */
START_TEST(forked_kernels_are_configured_as_cold_ones)
{
        cq_kserver_t *ks;
        cq_interp_t *cold, *forked;
        char *want, *got;

        ks = start_pair(NULL, "matplotlib.pyplot", &cold, &forked);
        want = stdout_of(cold, settings_cell);
        got = stdout_of(forked, settings_cell);
        ck_assert_msg(strstr(want, "\"connection_file\": \"<conn>\"") &&
                          strstr(want, "HistoryManager") &&
                          strstr(want, "['DejaVu Sans', 'Noto Sans CJK JP'] "
                                       "['DejaVu Sans', 'Noto Sans CJK JP']") &&
                          strstr(want, "traitlets.traitlets HasTraits.traits "
                                       "True\n") &&
                          strstr(want, "True True\n") &&
                          strstr(want, "'HOME=<wd>'"),
                      "cold kernel: %s", want);
        assert_same_output(got, want);
        free(want);
        free(got);
        stop_pair(&cold, &forked, &ks);
}
END_TEST

/* A sandboxed kernel's profile tree on its /tmp, and what its application
 * took from it: paths, modes, sizes and contents. */
static const char profile_cell[] =
    "import hashlib, json, os, sys\n"
    "app = get_ipython().kernel.parent\n"
    "tree = []\n"
    "for r, ds, fs in os.walk(os.environ['IPYTHONDIR']):\n"
    "    ds.sort()\n"
    "    for n in ds + sorted(fs):\n"
    "        p = os.path.join(r, n)\n"
    "        st = os.lstat(p)\n"
    "        h = hashlib.sha256(open(p, 'rb').read()).hexdigest() if n in fs "
    "else ''\n"
    "        tree.append([p, oct(st.st_mode), st.st_uid == os.getuid(), h])\n"
    "print(json.dumps([tree, app.ipython_dir, app.profile_dir.location, "
    "app.config_file_paths, app.profile, "
    "getattr(sys.excepthook, '__qualname__', repr(sys.excepthook))], "
    "sort_keys=True))";

/* The server also makes a sandboxed kernel's application before the fork
 * (its command line, crash handler, profile directory and config files,
 * in a mount namespace of its own with a fresh /tmp: build_app()): a
 * forked sandboxed kernel is configured as a cold sandboxed one and has
 * the same profile tree, made as its own uid. */
START_TEST(sandboxed_forked_kernels_are_configured_as_cold_ones)
{
        cq_sandbox_t *sandbox = auto_sandbox();
        cq_kserver_stats_t st;
        cq_kserver_t *ks;
        cq_interp_t *cold, *forked;
        char errstr[700], *want, *got;

        if (!cq_sandbox_enabled(sandbox)) {
                snprintf(errstr, sizeof(errstr), "%s",
                         cq_sandbox_reason(sandbox));
                cq_sandbox_destroy(&sandbox);
                CQ_CHECK_SKIP("bwrap",
                              "sandboxed_forked_kernels_are_configured_as_"
                              "cold_ones: bubblewrap does not work here: %s",
                              errstr);
        }
        if (geteuid() != 0) {
                cq_sandbox_destroy(&sandbox);
                CQ_CHECK_SKIP("root", "sandboxed kernels are forked by a "
                                      "root worker only");
        }
        ks = start_pair(sandbox, "matplotlib.pyplot", &cold, &forked);
        cq_kserver_stats(ks, &st);
        ck_assert_msg(st.app_prepared, "the server made no application");
        want = stdout_of(cold, settings_cell);
        got = stdout_of(forked, settings_cell);
        ck_assert_msg(strstr(want, "\"connection_file\": \"<conn>\""),
                      "cold kernel: %s", want);
        assert_same_output(got, want);
        free(want);
        free(got);
        want = stdout_of(cold, profile_cell);
        got = stdout_of(forked, profile_cell);
        ck_assert_msg(strstr(want, "\"" CQ_KERNEL_BOXED_IPYTHONDIR
                                   "/profile_default/startup/README\"") &&
                          strstr(want, "InteractiveShell.excepthook") &&
                          !strstr(want, "false"),
                      "cold kernel: %s", want);
        assert_same_output(got, want);
        free(want);
        free(got);
        stop_pair(&cold, &forked, &ks);
        cq_sandbox_destroy(&sandbox);
}
END_TEST

/* ipykernel's murmur2 of a cell's text (the name of its code), as
 * ipykernel 6 writes it, against the kernel's, on random texts; and the
 * name of one cell. */
static const char murmur_cell[] =
    "import os, random\n"
    "from ipykernel import compiler\n"
    "def ref(data, seed):\n"
    "    m = 0x5BD1E995\n"
    "    d = str.encode(data, 'utf8')\n"
    "    n = len(d)\n"
    "    h = seed ^ n\n"
    "    e = n & 0xFFFFFFFC\n"
    "    for i in range(0, e, 4):\n"
    "        k = d[i] | d[i + 1] << 8 | d[i + 2] << 16 | d[i + 3] << 24\n"
    "        k = (k * m) & 0xFFFFFFFF\n"
    "        k ^= k >> 24\n"
    "        k = (k * m) & 0xFFFFFFFF\n"
    "        h = (h * m) & 0xFFFFFFFF\n"
    "        h ^= k\n"
    "    k = 0\n"
    "    for j in range(n - e - 1, -1, -1):\n"
    "        k = k << 8 | d[e + j]\n"
    "    if n & 3:\n"
    "        h ^= k\n"
    "        h = (h * m) & 0xFFFFFFFF\n"
    "    h ^= h >> 13\n"
    "    h = (h * m) & 0xFFFFFFFF\n"
    "    return h ^ (h >> 15)\n"
    "r = random.Random(7)\n"
    "seed = compiler.get_tmp_hash_seed()\n"
    "bad = 0\n"
    "for i in range(300):\n"
    "    t = ''.join(r.choice('ab\\u00e9\\u4e2d\\U0001f600\\n\\0 ') for _ in "
    "range(r.choice((i % 9, r.randrange(6000)))))\n"
    "    bad += compiler.murmur2_x86(t, seed) != ref(t, seed)\n"
    "print(bad, os.path.basename(compiler.get_file_name('print(1)\\n')))";

/* The server gives ipykernel a faster murmur2 for the names of cells'
 * code (kserver.py's fast_murmur()): a forked kernel names cells as a
 * cold one does. */
START_TEST(forked_kernels_name_cells_as_cold_ones)
{
        cq_kserver_t *ks;
        cq_interp_t *cold, *forked;
        char *want, *got;

        ks = start_pair(NULL, "numpy", &cold, &forked);
        want = stdout_of(cold, murmur_cell);
        got = stdout_of(forked, murmur_cell);
        ck_assert_msg(strncmp(want, "0 ", 2) == 0 && strstr(want, ".py\n"),
                      "cold kernel: %s", want);
        assert_same_output(got, want);
        free(got);
        got = stdout_of(forked, "from ipykernel import compiler\n"
                                "print(compiler.murmur2_x86.__module__)");
        ck_assert_str_ne(got, "ipykernel.compiler\n");
        free(got);
        /* without numpy, its other way */
        free(stdout_of(forked, "import sys\ndel sys.modules['numpy']\n"));
        got = stdout_of(forked, murmur_cell);
        assert_same_output(got, want);
        free(want);
        free(got);
        stop_pair(&cold, &forked, &ks);
}
END_TEST

/* Whether collections.abc.Mapping's answers "not a Mapping" for builtin
 * types are still valid (its negative cache at the current ABC token).
 * A kernel's own start-up asks it of str and int only. */
static const char abc_cell[] =
    "import abc, _abc, collections.abc\n"
    "reg, pos, neg, ver = _abc._get_dump(collections.abc.Mapping)\n"
    "known = {w() for w in neg}\n"
    "print(ver == abc.get_cache_token(), [t.__name__ for t in (str, int, "
    "float, bytes, tuple, list, type(None), bool) if t not in known])";

/* The server answers those questions once, after its last import
 * (kserver.py's warm_abc_answers()): a forked kernel starts with them
 * answered, and nothing the server or the kernel's start does after it
 * registers an ABC (which would throw every answer away). */
START_TEST(forked_kernels_start_with_abc_answers)
{
        cq_kserver_t *ks;
        cq_interp_t *k;

        ks = server_with(NULL, "numpy,pandas");
        k = start_forked(NULL, ks);
        assert_stdout(k, abc_cell, "True []\n");
        /* the answers are the kernel's own: registering throws them away
         * (their version is no longer the token) */
        assert_stdout(k,
                      "import abc, _abc, collections.abc\n"
                      "class M: pass\n"
                      "collections.abc.Mapping.register(M)\n"
                      "ver = _abc._get_dump(collections.abc.Mapping)[3]\n"
                      "print(ver == abc.get_cache_token())",
                      "False\n");
        cq_interp_destroy(&k);
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* Every thread's CPUs, as one line per distinct set. */
static const char affinity_cell[] =
    "import os\n"
    "print(sorted({tuple(sorted(os.sched_getaffinity(int(t))))\n"
    "             for t in os.listdir('/proc/self/task')}))";

/* A forked kernel initializes held to one CPU (kserver.py's pin_start()):
 * once it answers, each of its threads may run on every CPU a cold
 * kernel's may, this process's. */
START_TEST(forked_kernels_are_not_left_pinned)
{
        cq_kserver_t *ks;
        cq_interp_t *cold, *forked;
        char want[4096], *cold_out, *got;
        cpu_set_t set;
        size_t len;
        int cpu, n = 0;

        ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
        len = (size_t)snprintf(want, sizeof(want), "[(");
        for (cpu = 0; cpu < CPU_SETSIZE && len < sizeof(want) - 16; cpu++) {
                if (!CPU_ISSET(cpu, &set))
                        continue;
                len += (size_t)snprintf(want + len, sizeof(want) - len,
                                        n++ ? ", %d" : "%d", cpu);
        }
        snprintf(want + len, sizeof(want) - len, ")]\n");
        if (n < 2)
                CQ_CHECK_SKIP("2 CPUs", "this process may run on %d", n);
        ks = start_pair(NULL, "", &cold, &forked);
        cold_out = stdout_of(cold, affinity_cell);
        got = stdout_of(forked, affinity_cell);
        ck_assert_str_eq(cold_out, want);
        assert_same_output(got, want);
        free(cold_out);
        free(got);
        stop_pair(&cold, &forked, &ks);
}
END_TEST

/* The parser of a forked kernel's warm-up report, which the kernel's
 * sandbox can write: malformed reports are refused, mutations of good
 * ones never crash it, and what it accepts reads as a cell's outputs. */
START_TEST(warm_report_parser)
{
        static const char *const bad[] = {
            "",
            "not json",
            "null",
            "[]",
            "{}",
            "{\"ok\": 1, \"stdout\": \"\"}",
            "{\"ok\": \"true\", \"stdout\": \"\"}",
            "{\"ok\": true}",
            "{\"ok\": true, \"stdout\": 5}",
            "{\"ok\": true, \"stdout\": null}",
            "{\"ok\": true, \"stdout\": \"\\ud800\"}",
            "{\"ok\": true, \"stdout\": \"a\"",
            "{\"ok\": true, \"stdout\": \"a\"} trailing",
        };
        static const char good[] =
            "{\"ok\": true, \"ename\": null, \"evalue\": null, \"stdout\": "
            "\"\\ncoderq-env 00ff {\\\"python\\\": \\\"3.11.2\\\", "
            "\\\"packages\\\": {\\\"numpy\\\": \\\"1.24.2\\\"}}\\n\"}";
        static const char nul[] = "{\"ok\": true, \"stdout\": \"a\0b\"}";
        static const char failed[] =
            "{\"ok\": false, \"ename\": \"RuntimeError\", \"evalue\": \"no\", "
            "\"stdout\": \"half\"}";
        json_t *outputs, *env;
        char buf[sizeof(good) + 8];
        unsigned seed = 15;
        bool ok = true;
        size_t i, k;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++)
                ck_assert_msg(
                    kernel_warm_outputs(bad[i], strlen(bad[i]), &ok) == NULL,
                    "accepted %s", bad[i]);
        /* an embedded NUL ends nothing: the length is what counts */
        ck_assert_ptr_null(kernel_warm_outputs(nul, sizeof(nul) - 1, &ok));
        outputs = kernel_warm_outputs(good, strlen(good), &ok);
        ck_assert_ptr_nonnull(outputs);
        ck_assert(ok);
        ck_assert_uint_eq(json_array_size(outputs), 1);
        env = cq_interp_env_parse(outputs, "coderq-env 00ff ");
        ck_assert_ptr_nonnull(env);
        ck_assert_str_eq(json_string_value(json_object_get(env, "python")),
                         "3.11.2");
        json_decref(env);
        json_decref(outputs);
        outputs = kernel_warm_outputs(failed, strlen(failed), &ok);
        ck_assert_ptr_nonnull(outputs);
        ck_assert(!ok);
        ck_assert_uint_eq(json_array_size(outputs), 2);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(outputs, 1), "ename")),
                         "RuntimeError");
        ck_assert_ptr_null(cq_interp_env_parse(outputs, "coderq-env 00ff "));
        json_decref(outputs);
        /* every byte of a good report, flipped, cut or dropped */
        for (i = 0; i < 4000; i++) {
                size_t len = strlen(good);

                memcpy(buf, good, len);
                for (k = 0; k < 1 + i % 4; k++) {
                        seed = seed * 1103515245u + 12345u;
                        buf[(seed >> 8) % len] = (char)(seed >> 16);
                }
                if (i % 3 == 0)
                        len = (seed >> 4) % len;
                outputs = kernel_warm_outputs(buf, len, &ok);
                if (outputs) {
                        ck_assert(json_is_array(outputs));
                        ck_assert_uint_ge(json_array_size(outputs), 1);
                        json_decref(
                            cq_interp_env_parse(outputs, "coderq-env 00ff "));
                }
                json_decref(outputs);
        }
}
END_TEST

/* What the warm-up leaves in a kernel, as one line. */
static const char warm_state_cell[] =
    "import ipykernel.iostream as cq_io\n"
    "cq_ip = get_ipython()\n"
    "print(cq_ip.execution_count, len(cq_ip.history_manager.input_hist_raw), "
    "'_cq_setup' in globals(), 'cq_pre' in globals(), "
    "getattr(cq_io.OutStream, '_cq_capped', False), "
    "len(cq_ip.events.callbacks['pre_execute']), "
    "len(cq_ip.events.callbacks['post_execute']), "
    "sorted(k for k in globals() if k.startswith('_cq')))";

static cq_interp_t *start_preloaded(cq_kserver_t *ks, const char *preload)
{
        cq_local_opts_t opts;
        char errstr[512] = "";
        cq_interp_t *interp;

        memset(&opts, 0, sizeof(opts));
        opts.work_root = root;
        opts.kernel.startup_timeout_ms = 60000;
        opts.kernel.kserver = ks;
        opts.kernel.preload = preload;
        interp = cq_local_interp_new(&opts, errstr, sizeof(errstr));
        ck_assert_msg(interp != NULL, "kernel start failed: %s", errstr);
        ck_assert(cq_kernel_forked(cq_local_interp_kernel(interp)) ==
                  (ks != NULL));
        return interp;
}

/* A forked kernel runs the warm-up itself, before it answers, and
 * reports it through a file: the kernel it leaves, and the environment
 * reported, are a cold kernel's, and a warm-up that fails fails in both
 * the same way (the kernel works, the environment is unknown). */
START_TEST(forked_kernels_warm_up_as_cold_ones)
{
        static const char *const preloads[] = {
            "import json as cq_pre\nprint('preloaded')",
            "import json as cq_pre\nraise RuntimeError('cq-warm-fails')",
        };
        cq_kserver_t *ks;
        cq_interp_t *cold, *forked;
        cq_cell_result_t res;
        char *want, *got;
        size_t i;

        ks = server_with(NULL, "");
        for (i = 0; i < CQ_ARRAY_SIZE(preloads); i++) {
                cold = start_preloaded(NULL, preloads[i]);
                forked = start_preloaded(ks, preloads[i]);
                if (i == 0) {
                        ck_assert_ptr_nonnull(cq_interp_env(cold));
                        ck_assert_msg(json_equal(cq_interp_env(cold),
                                                 cq_interp_env(forked)),
                                      "the forked kernel's environment "
                                      "differs");
                } else {
                        ck_assert_ptr_null(cq_interp_env(cold));
                        ck_assert_ptr_null(cq_interp_env(forked));
                }
                want = stdout_of(cold, warm_state_cell);
                got = stdout_of(forked, warm_state_cell);
                ck_assert_msg(strncmp(want, "1 ", 2) == 0 &&
                                  strstr(want, " False True True ") &&
                                  strstr(want, " []\n"),
                              "cold kernel after its warm-up: %s", want);
                assert_same_output(got, want);
                free(want);
                free(got);
                /* the first cell of each counts as the first */
                run(forked, "6 * 7", 30000, &res);
                ck_assert_int_eq(res.status, CQ_CELL_OK);
                ck_assert_int_eq(res.execution_count, 2);
                cq_cell_result_release(&res);
                cq_interp_destroy(&cold);
                cq_interp_destroy(&forked);
        }
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* A server killed with SIGKILL: its kernels live on, the next kernel
 * starts cold, and the server comes back and forks again. */
START_TEST(killed_server_is_restarted)
{
        cq_kserver_t *ks;
        cq_kserver_stats_t st;
        cq_interp_t *a, *b, *c;
        pid_t old;
        int i;

        ks = server_with(NULL, "");
        a = start_forked(NULL, ks);
        cq_kserver_stats(ks, &st);
        ck_assert(st.up);
        old = cq_kserver_pid(ks);
        ck_assert_int_gt(old, 1);
        ck_assert_int_eq(kill(old, SIGKILL), 0);
        /* down as soon as it has exited, before any start notices */
        for (i = 0; i < 100; i++) {
                cq_kserver_stats(ks, &st);
                if (!st.up)
                        break;
                usleep(50 * 1000);
        }
        ck_assert_msg(!st.up, "a killed server still counts as up");
        ck_assert_uint_eq(st.restarts, 0);
        b = start_kernel(NULL, 0, ks);
        ck_assert(!cq_kernel_forked(cq_local_interp_kernel(b)));
        assert_stdout(b, "print(1 + 1)", "2\n");
        /* the forked kernel did not die with its server */
        assert_stdout(a, "print('still here')", "still here\n");
        ck_assert_int_eq(cq_kserver_wait(ks, 120000), 0);
        ck_assert_int_ne(cq_kserver_pid(ks), old);
        cq_kserver_stats(ks, &st);
        ck_assert(st.up);
        c = start_forked(NULL, ks);
        assert_stdout(c, "print(2 + 2)", "4\n");
        cq_kserver_stats(ks, &st);
        ck_assert_uint_eq(st.restarts, 1);
        ck_assert_uint_eq(st.forked, 2);
        ck_assert_uint_ge(st.refused, 1);
        cq_interp_destroy(&a);
        cq_interp_destroy(&b);
        cq_interp_destroy(&c);
        cq_kserver_destroy(&ks);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* The parser of the server's replies, on what a broken server could
 * send. */
START_TEST(kserver_reply_parser)
{
        static const struct {
                const char *text;
                int nfds;
                bool probe;
        } bad[] = {
            {"", 0, false},
            {"not json", 0, false},
            {"null", 0, false},
            {"[1, 2]", 2, false},
            {"{}", 2, false},
            {"{\"ok\": 1, \"pid\": 5, \"outer\": 6}", 2, false},
            {"{\"ok\": true}", 2, false},
            {"{\"ok\": true, \"pid\": 5}", 2, false},
            {"{\"ok\": true, \"pid\": 1, \"outer\": 6}", 2, false},
            {"{\"ok\": true, \"pid\": 0, \"outer\": 6}", 2, false},
            {"{\"ok\": true, \"pid\": -5, \"outer\": 6}", 2, false},
            {"{\"ok\": true, \"pid\": 4294967302, \"outer\": 6}", 2, false},
            {"{\"ok\": true, \"pid\": \"5\", \"outer\": 6}", 2, false},
            {"{\"ok\": true, \"pid\": 5.5, \"outer\": 6}", 2, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6}", 0, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6}", 1, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6}", 3, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6, \"pid\": 7}", 2, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6}", 0, true},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6, \"status\": 999}", 0,
             true},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6, \"status\": 0}", 2,
             true},
            {"{\"ok\": false}", 0, false},
            {"{\"ok\": false, \"error\": 3}", 0, false},
            {"{\"ok\": false, \"error\": \"x\"}", 2, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6} trailing", 2, false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6, \"kernel\": 1}", 2,
             false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6, \"kernel\": \"7\"}", 2,
             false},
            {"{\"ok\": true, \"pid\": 5, \"outer\": 6, \"kernel\": null}", 2,
             false},
        };
        cq_kserver_reply_t reply;
        char errstr[256], *big;
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                errstr[0] = '\0';
                ck_assert_msg(
                    cq_kserver_reply_parse(bad[i].text, strlen(bad[i].text),
                                           bad[i].nfds, bad[i].probe, &reply,
                                           errstr, sizeof(errstr)) == -1,
                    "accepted: %s", bad[i].text);
                ck_assert_msg(errstr[0] != '\0', "no reason for: %s",
                              bad[i].text);
        }
        /* larger than a datagram may be */
        big = malloc(CQ_KSERVER_MSG_MAX + 2);
        ck_assert_ptr_nonnull(big);
        memset(big, ' ', CQ_KSERVER_MSG_MAX + 1);
        memcpy(big, "{\"ok\": false, \"error\": \"x\"}", 27);
        big[CQ_KSERVER_MSG_MAX + 1] = '\0';
        ck_assert_int_eq(cq_kserver_reply_parse(big, CQ_KSERVER_MSG_MAX + 1, 0,
                                                false, &reply, errstr,
                                                sizeof(errstr)),
                         -1);
        free(big);
        /* what a working server says */
        {
                const char *spawn = "{\"ok\": true, \"pid\": 1234, "
                                    "\"outer\": 1230}";
                const char *boxed = "{\"ok\": true, \"pid\": 1234, "
                                    "\"outer\": 1230, \"kernel\": 1240}";
                const char *no = "{\"ok\": false, \"error\": \"no\"}";
                const char *probe = "{\"ok\": true, \"pid\": 9, \"outer\": 8, "
                                    "\"status\": 0}";

                ck_assert_int_eq(cq_kserver_reply_parse(spawn, strlen(spawn), 2,
                                                        false, &reply, errstr,
                                                        sizeof(errstr)),
                                 0);
                ck_assert(reply.ok);
                ck_assert_int_eq(reply.pid, 1234);
                ck_assert_int_eq(reply.outer, 1230);
                ck_assert_int_eq(reply.kernel, 0);
                ck_assert_int_eq(cq_kserver_reply_parse(boxed, strlen(boxed), 2,
                                                        false, &reply, errstr,
                                                        sizeof(errstr)),
                                 0);
                ck_assert_int_eq(reply.kernel, 1240);
                ck_assert_int_eq(cq_kserver_reply_parse(no, strlen(no), 0,
                                                        false, &reply, errstr,
                                                        sizeof(errstr)),
                                 0);
                ck_assert(!reply.ok);
                ck_assert_str_eq(reply.error, "no");
                ck_assert_int_eq(cq_kserver_reply_parse(probe, strlen(probe), 0,
                                                        true, &reply, errstr,
                                                        sizeof(errstr)),
                                 0);
        }
        ck_assert_int_eq(reply.status, 0);
}
END_TEST

/* A stand-in for the server's interpreter: it answers the probe as the
 * real one does, then misbehaves as its "preload" argument says. */
static const char fake_server[] =
    "#!/usr/bin/python3\n"
    "import json, os, socket, sys, time\n"
    "how = sys.argv[6]  # after -s -c PROGRAM SOCK LIFE\n"
    "s = socket.socket(fileno=3)\n"
    "ready = {'ready': True, 'threads': 2 if how == 'threads' else 1, "
    "'pid': os.getpid(), 'import_ms': 1}\n"
    "s.send(json.dumps(ready).encode())\n"
    "data, fds, _, _ = socket.recv_fds(s, 65536, 4)\n"
    "s.send(json.dumps({'ok': True, 'pid': 5, 'outer': 6, "
    "'status': 0}).encode())\n"
    "while True:\n"
    "    data, fds, _, _ = socket.recv_fds(s, 65536, 4)\n"
    "    if not data:\n"
    "        sys.exit(0)\n"
    "    if how == 'garbage':\n"
    "        s.send(b'\\x00{not json')\n"
    "    elif how == 'oversized':\n"
    "        s.send(b'{\"ok\": false, \"error\": \"' + b'x' * 70000 + "
    "b'\"}')\n"
    "    elif how == 'fds':\n"
    "        socket.send_fds(s, [b'{\"ok\": true, \"pid\": 5, \"outer\": "
    "6}'], [0, 1, 2])\n"
    "    elif how == 'wedge':\n"
    "        time.sleep(600)\n";

/* A server that answers nonsense, too much, too many descriptors or not
 * at all is an error for that request and is restarted; one with threads
 * is never used. Nothing of this crashes us. */
START_TEST(broken_server_is_an_error)
{
        static const char *const how[] = {"garbage", "oversized", "fds",
                                          "wedge"};
        static const char *const argv[] = {NULL};
        static const char *const env[] = {"PATH=/usr/bin:/bin", NULL};
        char path[300], errstr[700];
        cq_kserver_req_t req;
        cq_kserver_child_t child;
        cq_kserver_stats_t st;
        cq_kserver_t *ks;
        size_t i;

        mkdir(root, 0711);
        snprintf(path, sizeof(path), "%s/fake-python", root);
        write_text(path, fake_server);
        ck_assert_int_eq(chmod(path, 0755), 0);
        /* threads at fork time: off, and says why */
        ks = new_kserver(NULL, path, "threads", 0, CQ_KSERVER_AUTO, errstr,
                         sizeof(errstr));
        ck_assert_ptr_nonnull(ks);
        ck_assert(!cq_kserver_enabled(ks));
        ck_assert_msg(strstr(cq_kserver_reason(ks), "2 threads") != NULL, "%s",
                      cq_kserver_reason(ks));
        cq_kserver_destroy(&ks);
        ks = new_kserver(NULL, path, "threads", 0, CQ_KSERVER_ON, errstr,
                         sizeof(errstr));
        ck_assert_ptr_null(ks);
        ck_assert_ptr_nonnull(strstr(errstr, "threads"));
        for (i = 0; i < CQ_ARRAY_SIZE(how); i++) {
                pid_t old;

                ks = new_kserver(NULL, path, how[i], 500, CQ_KSERVER_ON, errstr,
                                 sizeof(errstr));
                ck_assert_msg(ks != NULL, "%s: %s", how[i], errstr);
                old = cq_kserver_pid(ks);
                memset(&req, 0, sizeof(req));
                req.work_dir = root;
                req.argv = argv;
                req.envp = env;
                req.log_fd = 2;
                errstr[0] = '\0';
                ck_assert_int_eq(
                    cq_kserver_spawn(ks, &req, &child, errstr, sizeof(errstr)),
                    -1);
                ck_assert_int_eq(child.pidfd, -1);
                ck_assert_msg(strstr(errstr, "kernel server") != NULL, "%s: %s",
                              how[i], errstr);
                /* the server was stopped, to be started again */
                ck_assert_int_eq(cq_kserver_pid(ks), -1);
                ck_assert_int_ne(kill(old, 0), 0);
                cq_kserver_stats(ks, &st);
                ck_assert_uint_eq(st.refused, 1);
                ck_assert_uint_eq(st.forked, 0);
                ck_assert_int_eq(cq_kserver_wait(ks, 30000), 0);
                ck_assert_int_gt(cq_kserver_pid(ks), 0);
                cq_kserver_destroy(&ks);
        }
        ck_assert_int_eq(unlink(path), 0);
}
END_TEST

/* The probe's report comes from code the kernel runs, so it is checked:
 * its line only behind the marker on stdout, versions of safe
 * characters and bounded length, unknown packages dropped. */
START_TEST(env_probe_report_is_checked)
{
        static const char *const bad[] = {
            "M {\"python\": 3}",
            "M {\"python\": \"3.11 beta\"}",
            "M {\"python\": \"<script>\"}",
            "M {\"python\": \"123456789012345678901234567890123\"}",
            "M {\"python\": \"3.11.2\"",
            "M [\"3.11.2\"]",
            "M ",
            "no marker {\"python\": \"3.11.2\"}",
        };
        char *probe;
        json_t *outputs, *env;
        size_t i;

        ck_assert_ptr_null(cq_interp_env_probe("bad'marker"));
        probe = cq_interp_env_probe("coderq-env 00ff ");
        ck_assert_ptr_nonnull(probe);
        ck_assert_ptr_nonnull(strstr(probe, "_cq_env('coderq-env 00ff ')"));
        free(probe);
        outputs = json_pack(
            "[{s:s, s:s, s:s}, {s:s, s:s, s:s}]", "output_type", "stream",
            "name", "stderr", "text", "M {\"python\": \"9.9.9\"}\n",
            "output_type", "stream", "name", "stdout", "text",
            "noise\nM {\"python\": \"3.11.2\", \"packages\": "
            "{\"numpy\": "
            "\"1.24.2\", \"scipy\": \"1.10.1+local\", \"evil\": \"1\", "
            "\"pandas\": 2, \"matplotlib\": \"3 6\"}, \"extra\": "
            "1}\nmore\n");
        env = cq_interp_env_parse(outputs, "M ");
        ck_assert_ptr_nonnull(env);
        {
                char *text = json_dumps(env, JSON_COMPACT | JSON_SORT_KEYS);

                ck_assert_str_eq(text, "{\"packages\":{\"numpy\":\"1.24.2\","
                                       "\"scipy\":\"1.10.1+local\"},\"python\":"
                                       "\"3.11.2\"}");
                free(text);
        }
        json_decref(env);
        json_decref(outputs);
        for (i = 0; i < CQ_ARRAY_SIZE(bad); i++) {
                outputs = json_pack("[{s:s, s:s, s:s}]", "output_type",
                                    "stream", "name", "stdout", "text", bad[i]);
                env = cq_interp_env_parse(outputs, "M ");
                ck_assert_msg(env == NULL, "accepted: %s", bad[i]);
                json_decref(outputs);
        }
        ck_assert_ptr_null(cq_interp_env_parse(NULL, "M "));
}
END_TEST

/* Bytes written to fds 1 and 2 themselves (a subprocess, a C library)
 * arrive whole: a character split between two of the watcher's reads is
 * joined, an invalid byte becomes U+FFFD, and the watcher goes on, so a
 * later write larger than the pipe does not block. */
START_TEST(fd_output_survives_split_and_invalid_utf8)
{
        cq_interp_t *interp = start_local(NULL, 0);
        const char *cells[] = {
            /* 1201 bytes in one write: the watcher's reads split a "€" */
            "import os\nos.write(1, ('\\u20ac' * 400 + '\\n').encode())\n"
            "os.write(1, b'\\xffx\\n')",
            "import subprocess\n"
            "subprocess.run(['sh', '-c', 'echo done; head -c 200000 "
            "/dev/zero | tr \"\\\\0\" a; echo'], timeout=60)\n",
            "import time\ntime.sleep(2)"};
        cq_buf_t all;
        size_t i, euros = 0, as = 0;
        const char *p;

        cq_buf_init(&all, SIZE_MAX);
        for (i = 0; i < CQ_ARRAY_SIZE(cells); i++) {
                cq_cell_result_t res;
                char *out;

                run(interp, cells[i], 90000, &res);
                ck_assert_msg(res.status == CQ_CELL_OK, "cell %zu: status %d",
                              i, (int)res.status);
                out = stream_text(&res, "stdout");
                ck_assert_int_eq(cq_buf_append_str(&all, out), CQ_OK);
                free(out);
                cq_cell_result_release(&res);
        }
        ck_assert_int_eq(cq_buf_append(&all, "", 1), CQ_OK);
        for (p = all.data; (p = strstr(p, "\xe2\x82\xac")) != NULL; p += 3)
                euros++;
        for (p = all.data; *p; p++)
                as += *p == 'a';
        ck_assert_uint_eq(euros, 400);
        ck_assert_msg(strstr(all.data, "\n\xef\xbf\xbdx\ndone\n"),
                      "no U+FFFD then 'done': %.200s", all.data);
        ck_assert_uint_eq(as, 200000);
        cq_buf_release(&all);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* Job code can leave files in its work dir that a fresh Python would run
 * as it starts, were the work dir on its path then: the launcher that
 * ipykernel's command names, modules of the start-up, site hooks. A
 * restart (here after the kernel died) runs none of them, the
 * environment report stays the first start's, and the job still imports
 * its own modules from the work dir. */
START_TEST(restart_runs_nothing_the_job_planted)
{
        cq_interp_t *interp = start_local(NULL, 0);
        cq_cell_result_t res;
        char *before, *after;

        ck_assert_ptr_nonnull(cq_interp_env(interp));
        before = json_dumps(cq_interp_env(interp), JSON_SORT_KEYS);
        assert_stdout(
            interp,
            "import os\n"
            "src = ('open(%r, \"w\").close()\\nimport sys\\n'\n"
            "       'sys.version_info = (6, 6, 6)\\n')\n"
            "for name in ('ipykernel_launcher', 'sitecustomize',\n"
            "             'usercustomize', 'traitlets', 'zmq', 'tornado',\n"
            "             'jupyter_client', 'ipykernel', 'IPython'):\n"
            "    with open(name + '.py', 'w') as f:\n"
            "        f.write(src % os.path.abspath('planted-' + name))\n"
            "os.makedirs('numpy-6.6.6.dist-info', exist_ok=True)\n"
            "with open('mine.py', 'w') as f:\n"
            "    f.write('VALUE = 42\\n')\n"
            "print(len(os.listdir()) >= 11)",
            "True\n");
        run(interp, "import os\nos._exit(1)", 30000, &res);
        ck_assert_int_eq(res.status, CQ_CELL_DIED);
        cq_cell_result_release(&res);
        assert_stdout(interp,
                      "import os, sys\n"
                      "print(sorted(f for f in os.listdir()\n"
                      "             if f.startswith('planted-')),\n"
                      "      sys.version_info[0])\n"
                      "import mine\n"
                      "print(mine.VALUE)",
                      "[] 3\n42\n");
        after = json_dumps(cq_interp_env(interp), JSON_SORT_KEYS);
        ck_assert_ptr_nonnull(after);
        ck_assert_str_eq(after, before);
        free(before);
        free(after);
        cq_interp_destroy(&interp);
        ck_assert_int_eq(count_kernels(), 0);
}
END_TEST

/* The probe itself, run by /usr/bin/python3 in a temp dir that stands
 * for a kernel's work dir, on sys.path as ipykernel's launcher puts it
 * there (and as '.'): a NAME-VERSION.dist-info dir in it (a job's input
 * file "numpy-6.6.6.dist-info/METADATA" makes one) is not an install,
 * nor is a metadata file elsewhere; a metadata dir on the path is. */
START_TEST(env_probe_skips_the_work_dir)
{
        char top[] = "/tmp/cq-probe-XXXXXX", path[512], cmd[1024];
        char out[65536], *probe;
        const char *numpy, *pandas;
        const json_t *pk;
        json_t *outputs, *env;
        size_t n;
        FILE *fp;

        ck_assert_ptr_nonnull(mkdtemp(top));
        snprintf(path, sizeof(path), "%s/work", top);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/work/numpy-6.6.6.dist-info", top);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/site", top);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/site/scipy-1.2.3.dist-info", top);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        snprintf(path, sizeof(path), "%s/site/pandas-9.9.9.dist-info", top);
        ck_assert_int_eq(close(open(path, O_WRONLY | O_CREAT, 0600)), 0);
        probe = cq_interp_env_probe("coderq-env 00ff ");
        ck_assert_ptr_nonnull(probe);
        /* the probe's code through the environment: no file to write */
        ck_assert_int_eq(setenv("CQ_PROBE", probe, 1), 0);
        free(probe);
        snprintf(cmd, sizeof(cmd),
                 "cd %s/work && /usr/bin/python3 -s -c 'import os, sys; "
                 "sys.path[0:0] = [os.getcwd(), \".\", sys.argv[1]]; "
                 "exec(os.environ[\"CQ_PROBE\"])' %s/site",
                 top, top);
        fp = popen(cmd, "r");
        ck_assert_ptr_nonnull(fp);
        n = fread(out, 1, sizeof(out) - 1, fp);
        out[n] = '\0';
        ck_assert_int_eq(pclose(fp), 0);
        outputs = json_pack("[{s:s, s:s, s:s}]", "output_type", "stream",
                            "name", "stdout", "text", out);
        env = cq_interp_env_parse(outputs, "coderq-env 00ff ");
        ck_assert_msg(env != NULL, "no report in: %s", out);
        pk = json_object_get(env, "packages");
        numpy = json_string_value(json_object_get(pk, "numpy"));
        pandas = json_string_value(json_object_get(pk, "pandas"));
        ck_assert_msg((!numpy || strcmp(numpy, "6.6.6") != 0) &&
                          (!pandas || strcmp(pandas, "9.9.9") != 0),
                      "forged versions reported: %s", out);
        ck_assert_str_eq(json_string_value(json_object_get(pk, "scipy")),
                         "1.2.3");
        json_decref(env);
        json_decref(outputs);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
        ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *cq_kernel_suite(void)
{
        Suite *s = suite_create("kernel");
        TCase *tc = tcase_create("kernel");

        root_setup();
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, outputs_errors_and_text);
        tcase_add_test(tc, env_probe_report_is_checked);
        tcase_add_test(tc, warm_report_parser);
        tcase_add_test(tc, files_created_and_inputs);
        tcase_add_test(tc, fifo_in_work_dir_does_not_block);
        tcase_add_test(tc, timeout_and_death_replace_the_kernel);
        tcase_add_test(tc, abandoned_cell_is_not_waited_for);
        tcase_add_test(tc, output_flood_is_bounded);
        tcase_add_test(tc, every_byte_counts_against_the_cap);
        tcase_add_test(tc, frames_without_end_do_not_grow_the_worker);
        tcase_add_test(tc, sandbox_confines_the_kernel);
        tcase_add_test(tc, sandbox_bounds_its_tmpfs);
        tcase_add_test(tc, sandboxed_kernel_dirs_are_on_its_tmpfs);
        tcase_add_test(tc, cjk_labels_render_without_tofu);
        suite_add_tcase(s, tc);
        /* The pool and the kernel server: CQ_CHECK_CASE=pool. */
        tc = tcase_create("pool");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, pool_hands_out_ready_kernels);
        tcase_add_test(tc, pool_starts_kernels_in_parallel);
        tcase_add_test(tc, acquire_starts_its_own_when_the_pool_has_none);
        tcase_add_test(tc,
                       drained_pool_kills_its_ready_kernels_and_starts_none);
        tcase_add_test(tc, sweep_removes_dirs_of_dead_workers);
        tcase_add_test(tc, kernel_has_no_controlling_terminal);
        tcase_add_test(tc, killed_server_is_restarted);
        tcase_add_test(tc, kserver_reply_parser);
        tcase_add_test(tc, broken_server_is_an_error);
        suite_add_tcase(s, tc);
        /* Start-up and the sandbox's edges: CQ_CHECK_CASE=sandbox. */
        tc = tcase_create("sandbox");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, config_and_start_failure);
        tcase_add_test(tc, fresh_work_root_runs_sandboxed);
        tcase_add_test(tc, sandbox_on_fails_closed);
        tcase_add_test(tc, existing_work_root_is_tightened_or_refused);
        tcase_add_test(tc, fork_bomb_stays_in_its_kernel);
        tcase_add_test(tc, kernel_links_do_not_lead_the_worker_out);
        tcase_add_test(tc, skips_fail_when_cq_require_names_them);
        tcase_add_test(tc, backend_makes_the_process_non_dumpable);
        tcase_add_test(tc, forked_kernels_are_strangers);
        tcase_add_test(tc, forked_kernel_sockets_are_on_its_tmp);
        tcase_add_test(tc, nothing_left_behind);
        suite_add_tcase(s, tc);
        /* The server's command line: CQ_CHECK_CASE=cmdline. */
        tc = tcase_create("cmdline");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, kserver_command_line_is_short);
        suite_add_tcase(s, tc);
        /* The kernel keyrings: CQ_CHECK_CASE=keyring. */
        tc = tcase_create("keyring");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, kernels_share_no_keyring);
        tcase_add_test(tc, keyring_filter_fails_closed);
        suite_add_tcase(s, tc);
        /* What the worker does in work dirs as root: CQ_CHECK_CASE=workdir. */
        tc = tcase_create("workdir");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, work_dir_removal_is_flat);
        tcase_add_test(tc, input_ownership_follows_no_planted_symlink);
        tcase_add_test(tc, job_cannot_choose_less_isolation);
        suite_add_tcase(s, tc);
        /* No kernel: CQ_CHECK_CASE=probe runs it alone. */
        tc = tcase_create("probe");
        /* they start interpreters: Check's default of 4 s is too short
         * on a loaded machine */
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, env_probe_skips_the_work_dir);
        tcase_add_test(tc, restart_runs_nothing_the_job_planted);
        tcase_add_test(tc, fd_output_survives_split_and_invalid_utf8);
        suite_add_tcase(s, tc);
        /* The server's prebuilt shell: CQ_CHECK_CASE=shell runs it alone. */
        tc = tcase_create("shell");
        tcase_set_timeout(tc, 240);
        tcase_add_test(tc, forked_kernels_get_a_fresh_shell);
        tcase_add_test(tc, forked_kernels_get_their_own_keys);
        tcase_add_test(tc, kernels_die_with_their_group);
        tcase_add_test(tc, forked_kernels_reset_as_cold_ones);
        tcase_add_test(tc, forked_kernels_are_configured_as_cold_ones);
        tcase_add_test(tc,
                       sandboxed_forked_kernels_are_configured_as_cold_ones);
        tcase_add_test(tc, forked_kernels_are_not_left_pinned);
        tcase_add_test(tc, forked_kernels_warm_up_as_cold_ones);
        tcase_add_test(tc, forked_kernels_name_cells_as_cold_ones);
        tcase_add_test(tc, forked_kernels_start_with_abc_answers);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_kernel_suite)
