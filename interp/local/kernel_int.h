/* SPDX-License-Identifier: MIT */
/* kernel_int.h - what kernel.c (the kernel's messages and execution) and
 * kernel_proc.c (the kernel's processes) share: the handle and the
 * functions kernel.c calls in kernel_proc.c, which calls nothing of
 * kernel.c's. Not a public header. */
#ifndef CODERQ_KERNEL_INT_H
#define CODERQ_KERNEL_INT_H

#include <limits.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "coderq/local/kernel.h"
#include "coderq/local/zmtp.h"
#include "lproc_int.h"

/* A forked kernel's report of the warm-up it ran (kernel.c's
 * read_warm_report()): its name in the run dir, and its path and that of
 * the socket files (KERNEL_TMP_IPC "-1" to "-5") on a sandboxed forked
 * kernel's own /tmp. */
#define WARM_NAME           "warm-up.json"
#define KERNEL_TMP_WARM     "/tmp/.coderq-warm-up.json"
#define KERNEL_TMP_IPC_NAME ".coderq-k"
#define KERNEL_TMP_IPC      "/tmp/" KERNEL_TMP_IPC_NAME

/* How the shim reports the bytes it dropped: "[" DROP_TAG nonce " N]". */
#define DROP_TAG "coderq-dropped "

struct cq_kernel {
        /* options, copied */
        char *python;
        char *work_dir;
        char *preload;
        int64_t startup_timeout_ms;
        size_t output_max;
        size_t msg_max;   /* shell and control frames */
        size_t iopub_max; /* iopub frames: from output_max */
        int64_t interrupt_grace_ms;
        int64_t idle_wait_ms;
        const cq_sandbox_t *sandbox;
        cq_sandbox_id_t id; /* the uid it runs as, for its whole life */

        /* one incarnation of the kernel process */
        char run_dir[PATH_MAX];
        char conn_path[PATH_MAX + 16];
        /* The run dir, O_PATH, opened when it was made, before any code
         * of the kernel ran: it belongs to the kernel's uid, inside a work
         * dir that does too, so a path through them may lead anywhere
         * once the kernel ran (a .coderq swapped for a symlink, a
         * kernel.log made one). Every file of it this process makes, opens
         * or removes is reached from this fd, with O_NOFOLLOW. */
        int run_fd;
        /* The kernel's socket files, "-1" to "-5" after a prefix: the one
         * the kernel binds (its connection file's "ip"), and the name
         * prefix in the dir that holds them here, which is run_fd or, for
         * a sandboxed forked kernel, tmp_fd: an O_PATH of its own /tmp (a
         * tmpfs; kernel_proc.c's reach_tmp()). */
        char ipc_kernel[PATH_MAX + 8];
        const char *ipc_name; /* "k" or ".coderq-k" */
        int tmp_fd;           /* or -1 */
        char key[33];
        char session[37];
        uint64_t seq;
        /* connections to the kernel's sockets (zmtp.c), made once per
         * incarnation through an O_PATH of each socket file that no link
         * led to; never made again to a path */
        cq_zmtp_t *shell, *control, *iopub;
        char nonce[17];                       /* of this start's shim */
        char drop_tag[sizeof(DROP_TAG) + 20]; /* "[" DROP_TAG nonce " " */
        /* its process, cold or forked by the kernel server (forked:
         * proc.fork_kernel is the kernel itself; proc.pid its parent) */
        lproc_t proc;
        int nice; /* of the processes started; 0: inherited */
        cq_kserver_t *kserver;
        /* While start() runs: its warm-up cell, which a forked kernel runs
         * itself before it answers, reporting to warm_path (its path as
         * the kernel sees it; on its /tmp when tmp_fd is open) */
        const char *warm_code;
        char warm_path[PATH_MAX + 32];
        bool warm_in_kernel; /* the forked kernel took warm_code */
        json_t *language_info;
        json_t *env; /* the probe's report at the last start, or NULL */

        atomic_int interrupt_req;
        cq_jmsg_stats_t stats;
        char errmsg[512];
};

/* kernel.c */

/* The outputs that a forked kernel's warm-up report (\p len bytes of
 * JSON {"ok", "ename", "evalue", "stdout"}, from kserver.py's warm_up())
 * stands for, as a cell's would be: a stdout stream and, when it failed
 * (*ok false), an error. NULL when it is not one. */
json_t *kernel_warm_outputs(const char *buf, size_t len, bool *ok);

/* kernel_proc.c */

CQ_PRINTF(2, 3)
void kernel_set_error(cq_kernel_t *kernel, const char *fmt, ...);
void kernel_close_sockets(cq_kernel_t *kernel);

void kernel_log_tail(const cq_kernel_t *kernel, char *out, size_t size);
int kernel_write_conn_file(cq_kernel_t *kernel);
/* The kernel's files (sockets, warm-up report) in run_dir, as for a cold
 * kernel: ipc_kernel, ipc_client and warm_path; tmp_fd closed. */
void kernel_files_in_run_dir(cq_kernel_t *kernel);
void kernel_teardown(cq_kernel_t *kernel);
int kernel_write_mpl_rc(cq_kernel_t *kernel);
int kernel_spawn(cq_kernel_t *kernel);

#endif
