/* SPDX-License-Identifier: MIT */
/* cmd_exec.c - `coderq exec [FILE...] [--out NOTEBOOK]`: run Python cells
 * in one local kernel (the same backend jobs use, sandbox included) and
 * write the notebook. Cells come from the files, or from stdin, split at
 * lines that start with "# %%". A way to try the backend by hand. */
#include "coderq/cli/cmd_cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/backend/backend.h"
#include "coderq/common/buf.h"
#include "coderq/cli/cli.h"
#include "coderq/cli/clifmt.h"
#include "coderq/interp/collect.h"
#include "coderq/agent/notebook.h"

#define EXEC_SOURCE_MAX ((size_t)64 << 20)

static atomic_int exec_cancel;

static void on_signal(int sig)
{
        (void)sig;
        atomic_store(&exec_cancel, 1);
}

/* Print one output as it arrives. */
static void print_output(void *opaque, const json_t *output)
{
        const char *type =
            json_string_value(json_object_get(output, "output_type"));
        json_t *data = json_object_get(output, "data");

        (void)opaque;
        if (!type)
                return;
        if (strcmp(type, "stream") == 0) {
                const char *name =
                    json_string_value(json_object_get(output, "name"));
                json_t *text = json_object_get(output, "text");

                fwrite(json_string_value(text), 1, json_string_length(text),
                       name && strcmp(name, "stderr") == 0 ? stderr : stdout);
        } else if (strcmp(type, "error") == 0) {
                json_t *tb = json_object_get(output, "traceback");
                size_t i;
                json_t *line;

                json_array_foreach(tb, i, line)
                    fprintf(stderr, "%s\n", json_string_value(line));
                /* the backend's own errors (DeadKernelError, TimeoutError)
                 * have no traceback; nor has an exception whose
                 * _render_traceback_() returns none, so the kernel's words
                 * are escaped (cq_fmt_untrusted()) like a status line's */
                if (json_array_size(tb) == 0) {
                        char *name = cq_fmt_untrusted_dup(
                            json_string_value(json_object_get(output, "ename")),
                            0);
                        char *value = cq_fmt_untrusted_dup(
                            json_string_value(
                                json_object_get(output, "evalue")),
                            0);

                        fprintf(stderr, "%s: %s\n", name ? name : "?",
                                value ? value : "?");
                        free(name);
                        free(value);
                }
        } else if (data) {
                const char *mime;
                json_t *value;

                json_object_foreach(data, mime, value)
                {
                        if (strcmp(mime, "text/plain") == 0)
                                printf("%s\n", json_string_value(value));
                        else if (strncmp(mime, "image/", 6) == 0)
                                printf("[%s, %zu base64 characters]\n", mime,
                                       json_string_length(value));
                }
        }
        fflush(stdout);
}

/* Once the output cap is reached only the head was printed live: print
 * what the notebook keeps from the truncation marker on (the tail, and
 * errors such as DeadKernelError or TimeoutError). */
static void print_rest(const json_t *outputs)
{
        size_t i;
        json_t *v;
        bool found = false;

        json_array_foreach(outputs, i, v)
        {
                if (found) {
                        print_output(NULL, v);
                        continue;
                }
                if (json_is_string(json_object_get(v, "text"))) {
                        json_t *text = json_object_get(v, "text");
                        const char *s = json_string_value(text);
                        size_t len = json_string_length(text);
                        const char *mark = memmem(s, len, CQ_COLLECT_MARK,
                                                  sizeof(CQ_COLLECT_MARK) - 1);

                        if (!mark)
                                continue;
                        found = true;
                        fwrite(mark, 1, len - (size_t)(mark - s), stderr);
                }
        }
        fflush(stderr);
}

/* Split \p text at "# %%" lines and append the cells to \p cells. */
static int split_cells(const char *text, json_t *cells)
{
        const char *p = text, *start = text;

        for (;;) {
                const char *eol = strchr(p, '\n');
                bool last = eol == NULL;
                bool marker = strncmp(p, "# %%", 4) == 0;

                if (marker || last) {
                        const char *end = marker ? p : p + strlen(p);
                        size_t n = (size_t)(end - start);

                        /* skip cells of only blank lines */
                        if (strspn(start, " \t\r\n") < n &&
                            json_array_append_new(cells,
                                                  json_stringn(start, n)) != 0)
                                return -1;
                        if (last)
                                return 0;
                        start = eol + 1;
                }
                p = eol + 1;
        }
}

int cq_cmd_exec(const cq_config_t *cfg, int argc, char **argv)
{
        const char *out = "exec.ipynb";
        json_t *cells = json_array(), *cell;
        cq_backend_t *backend = NULL;
        cq_config_t one;
        cq_interp_t *interp = NULL;
        cq_nb_t *nb = NULL;
        char errstr[1024];
        long timeout_s = cfg->cell_timeout_s;
        int i, nfiles = 0, failed = 0, rc = CQ_EXIT_FAILED;
        size_t k;

        if (!cells)
                return CQ_EXIT_INTERNAL;
        for (i = 1; i < argc; i++) {
                char *text = NULL;
                size_t len;

                if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
                        out = argv[++i];
                        continue;
                }
                if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
                        char *end;

                        timeout_s = strtol(argv[++i], &end, 10);
                        if (*end || timeout_s <= 0) {
                                cq_cli_error("exec: --timeout needs a "
                                             "positive number of seconds");
                                json_decref(cells);
                                return CQ_EXIT_USAGE;
                        }
                        continue;
                }
                if (argv[i][0] == '-' && argv[i][1]) {
                        cq_cli_error("exec: unknown option %s", argv[i]);
                        json_decref(cells);
                        return CQ_EXIT_USAGE;
                }
                nfiles++;
                if (cq_cmd_read_file(argv[i], EXEC_SOURCE_MAX, &text, &len) !=
                        0 ||
                    split_cells(text, cells) != 0) {
                        free(text);
                        json_decref(cells);
                        return CQ_EXIT_USAGE;
                }
                free(text);
        }
        if (nfiles == 0) {
                char *text = NULL;
                size_t len;

                if (cq_cmd_read_file("-", EXEC_SOURCE_MAX, &text, &len) != 0 ||
                    split_cells(text, cells) != 0) {
                        free(text);
                        json_decref(cells);
                        return CQ_EXIT_USAGE;
                }
                free(text);
        }
        /* One kernel, started on demand, nothing speculative: no pool
         * refill behind it, no server, no imports the job did not ask
         * for (cq_config_one_shot()). */
        cq_config_one_shot(&one, cfg);
        backend = cq_backend_new(&one, 0, errstr, sizeof(errstr));
        if (!backend) {
                cq_cli_error("could not set up kernels: %s", errstr);
                goto out;
        }
        if (cq_backend_acquire(backend, "local",
                               cfg->kernel_startup_timeout_s * 1000, &interp,
                               errstr, sizeof(errstr)) != CQ_OK) {
                cq_cli_error("could not start a kernel: %s", errstr);
                goto out;
        }
        fprintf(stderr, "-- sandbox: %s\n",
                cq_backend_sandbox_mode(backend, interp));
        nb = cq_nb_new(cq_interp_language_info(interp));
        if (!nb) {
                rc = CQ_EXIT_INTERNAL;
                goto out;
        }
        signal(SIGINT, on_signal);
        json_array_foreach(cells, k, cell)
        {
                cq_cell_result_t res;
                cq_exec_opts_t xo = {0};

                if (atomic_load(&exec_cancel))
                        break;
                cq_cell_result_init(&res);
                xo.timeout_ms = timeout_s * 1000;
                xo.on_output = print_output;
                xo.cancel = &exec_cancel;
                if (cq_interp_execute(interp, json_string_value(cell), &xo,
                                      &res) != CQ_OK) {
                        cq_cli_error("could not run cell %zu: %s", k + 1,
                                     cq_interp_errmsg(interp));
                        cq_cell_result_release(&res);
                        goto out;
                }
                if (res.truncated)
                        print_rest(res.outputs);
                fprintf(stderr, "-- cell %zu: %s (%lld ms)%s\n", k + 1,
                        cq_cell_status_name(res.status),
                        (long long)res.duration_ms,
                        res.state_lost ? "; kernel restarted, state lost" : "");
                if (res.status != CQ_CELL_OK)
                        failed++;
                if (cq_nb_add_code(nb, json_string_value(cell), &res) != 0) {
                        cq_cell_result_release(&res);
                        rc = CQ_EXIT_INTERNAL;
                        goto out;
                }
                cq_cell_result_release(&res);
        }
        if (cq_nb_write_file(nb, out, errstr, sizeof(errstr)) != 0) {
                cq_cli_error("%s", errstr);
                goto out;
        }
        fprintf(stderr, "-- wrote %s (%zu cells, %d failed)\n", out,
                json_array_size(cells), failed);
        rc = failed ? CQ_EXIT_FAILED : CQ_EXIT_OK;
out:
        signal(SIGINT, SIG_DFL);
        cq_nb_destroy(&nb);
        cq_interp_destroy(&interp);
        cq_backend_destroy(&backend);
        json_decref(cells);
        return rc;
}
