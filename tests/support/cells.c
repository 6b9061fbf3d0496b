/* SPDX-License-Identifier: MIT */
/* cells.c - see cells.h. */
#include "support/cells.h"

#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "check_support.h"
#include "coderq/common/util.h"
#include "coderq/local/interp_local.h"

void cq_check_cell(cq_interp_t *interp,
                   const char *code,
                   int64_t timeout_ms,
                   cq_cell_result_t *res)
{
        cq_exec_opts_t opts = {0};

        opts.timeout_ms = timeout_ms;
        cq_cell_result_init(res);
        ck_assert_int_eq(cq_interp_execute(interp, code, &opts, res), CQ_OK);
        ck_assert_ptr_nonnull(res->outputs);
}

char *cq_check_stream_text(const cq_cell_result_t *res, const char *name)
{
        size_t i, len = 0;
        json_t *v;
        char *out = calloc(1, 1);

        json_array_foreach(res->outputs, i, v)
        {
                const char *type =
                    json_string_value(json_object_get(v, "output_type"));
                json_t *text = json_object_get(v, "text");
                char *grown;

                if (strcmp(type, "stream") ||
                    strcmp(json_string_value(json_object_get(v, "name")), name))
                        continue;
                grown = realloc(out, len + json_string_length(text) + 1);
                ck_assert_ptr_nonnull(grown);
                out = grown;
                memcpy(out + len, json_string_value(text),
                       json_string_length(text));
                len += json_string_length(text);
                out[len] = '\0';
        }
        return out;
}

const json_t *cq_check_find_output(const cq_cell_result_t *res,
                                   const char *type)
{
        size_t i;
        json_t *v;

        json_array_foreach(res->outputs, i, v)
        {
                if (!strcmp(
                        json_string_value(json_object_get(v, "output_type")),
                        type))
                        return v;
        }
        return NULL;
}

void cq_check_stdout(cq_interp_t *interp, const char *code, const char *want)
{
        cq_cell_result_t res;
        char *text;

        cq_check_cell(interp, code, 30000, &res);
        text = cq_check_stream_text(&res, "stdout");
        ck_assert_msg(strcmp(text, want) == 0,
                      "cell %s: stdout \"%s\", want \"%s\"", code, text, want);
        free(text);
        cq_cell_result_release(&res);
}

static bool mark_exists(void *arg)
{
        return access(((const cq_check_running_t *)arg)->mark, F_OK) == 0;
}

void *cq_check_act_when_running(void *arg)
{
        cq_check_running_t *cell = arg;

        cell->ran = cq_check_wait_until(mark_exists, cell, 30000);
        cell->acted_ms = cq_now_ms();
        if (cell->cancel)
                atomic_store(cell->cancel,
                             cell->cancel_value ? cell->cancel_value : 1);
        else
                cell->interrupt = cq_interp_interrupt(cell->interp);
        return NULL;
}

cq_interp_t *cq_check_agent_interp(const cq_fake_e2b_t *e2b)
{
        cq_local_opts_t lo;
        char err[512] = "";
        cq_interp_t *interp;

        if (e2b) {
                interp = cq_fake_e2b_interp(e2b, err, sizeof(err));
                ck_assert_msg(interp != NULL, "no sandbox: %s", err);
                return interp;
        }
        memset(&lo, 0, sizeof(lo));
        lo.kernel.python = "/usr/bin/python3";
        lo.kernel.startup_timeout_ms = 60000;
        lo.kernel.output_max = 1 << 20;
        interp = cq_local_interp_new(&lo, err, sizeof(err));
        ck_assert_msg(interp != NULL, "no kernel: %s", err);
        return interp;
}

bool cq_check_forked_mode(void)
{
        const char *v = getenv("CQ_CHECK_KSERVER");

        return v && strcmp(v, "on") == 0;
}

static cq_kserver_t *kservers[2]; /* unsandboxed, sandboxed */

void cq_check_kservers_stop(void)
{
        cq_kserver_destroy(&kservers[0]);
        cq_kserver_destroy(&kservers[1]);
}

cq_kserver_t *cq_check_kserver(const cq_sandbox_t *sandbox,
                               const char *work_root,
                               const char *preload)
{
        cq_kserver_t **ksp = &kservers[cq_sandbox_enabled(sandbox)];
        cq_kserver_opts_t ko;
        char errstr[700] = "";

        if (!cq_check_forked_mode())
                return NULL;
        if (!*ksp) {
                memset(&ko, 0, sizeof(ko));
                ko.mode = CQ_KSERVER_ON;
                ko.work_root = work_root;
                ko.sandbox = sandbox;
                ko.preload = preload;
                if (!kservers[0] && !kservers[1])
                        atexit(cq_check_kservers_stop);
                *ksp = cq_kserver_new(&ko, errstr, sizeof(errstr));
                ck_assert_msg(*ksp != NULL, "%s", errstr);
        }
        return *ksp;
}
