/* SPDX-License-Identifier: MIT */
/* kernel_env.h - what a local kernel's process starts with, cold
 * (kernel_proc.c) or forked by the kernel server (kserver.c): its
 * environment and its matplotlibrc. */
#ifndef CODERQ_KERNEL_ENV_H
#define CODERQ_KERNEL_ENV_H

#include <stdbool.h>
#include <sys/types.h>

/**
 * @brief A kernel's whole environment, built from scratch: nothing of the
 *        worker's (API keys, database DSN, CODERQ_*) reaches model-written
 *        code. HOME is \p home; the XDG cache dir is under \p run_dir,
 *        and so are matplotlib's and IPython's unless \p boxed (a
 *        sandboxed kernel's: CQ_KERNEL_BOXED_MPLCONFIGDIR and
 *        CQ_KERNEL_BOXED_IPYTHONDIR, and PWD, last, is \p home, as
 *        bubblewrap sets it); JPY_PARENT_PID is \p parent when > 0.
 *        MPLBACKEND stays unset so figures are published inline.
 * @returns Caller owns the returned vector and its strings; free with
 *          cq_sandbox_argv_free(). NULL when out of memory.
 */
char **cq_kernel_environ(const char *home,
                         const char *run_dir,
                         bool boxed,
                         pid_t parent);

/**
 * @brief IPython's directory (its profile tree) for a sandboxed kernel:
 *        on the sandbox's own /tmp, a tmpfs that goes with the kernel,
 *        so neither the kernel's start-up nor the worker's clean-up pays
 *        for a dozen directories and files on the work root's disk.
 */
#define CQ_KERNEL_BOXED_IPYTHONDIR "/tmp/ipython"

/**
 * @brief matplotlib's directory for a sandboxed kernel, on its /tmp too:
 *        its matplotlibrc (cq_kernel_mpl_rc) is made there by bubblewrap
 *        (`--file`) or, for a forked kernel, by its pid 1, before the
 *        kernel runs; nothing of it is on the work root's disk.
 */
#define CQ_KERNEL_BOXED_MPLCONFIGDIR "/tmp/matplotlib"

/**
 * @brief The matplotlibrc written in every kernel's MPLCONFIGDIR, the
 *        file interp/local/kernel_mpl.rc built in (NUL-terminated): text
 *        falls back glyph by glyph (matplotlib >= 3.6) from DejaVu Sans,
 *        its own font, to Noto Sans CJK (Debian's fonts-noto-cjk, which
 *        scripts/setup.sh and the Docker image install), so Chinese,
 *        Japanese and Korean labels do not come out as boxes. Debian's
 *        matplotlib 3.6 reads the first face of the font collection,
 *        named "Noto Sans CJK JP"; its glyphs cover the simplified and
 *        traditional Chinese ideographs too. Code may still pick other
 *        fonts with rcParams. The kernel server applies it before the
 *        fork, so a kernel whose file says the same need not read it
 *        again.
 */
extern const char cq_kernel_mpl_rc[];

#endif
