/* SPDX-License-Identifier: MIT */
/* py_int.h - the Python of this room that runs in kernels and in the
 * sandbox probe, besides the kernel server's (kserver_int.h): files of
 * their own beside the sources, built in as NUL-terminated text by
 * cmake/Embed.cmake. Each defines what its C caller calls, with the
 * arguments as literals or command-line arguments: C passes data, it
 * never edits the code. Not a public header. */
#ifndef CODERQ_PY_INT_H
#define CODERQ_PY_INT_H

/* kernel_shim.py: _cq_setup(budget, keep, chunk, tag) and _cq_fd(), run
 * in every kernel's warm-up (kernel.c's build_warmup()). */
extern const char cq_kernel_shim_py[];

/* kpool_preload.py: _cq_preload(names), the imports of a pooled kernel's
 * warm-up (kpool.c's preload_code()). */
extern const char cq_kpool_preload_py[];

/* runner.py: the light interpreter's program, run with `-c` and, as its
 * arguments, its start's marker and the output cap (runner.c). */
extern const char cq_runner_py[];

/* sandbox_probe.py: the sandbox probe, run with `-c` and, as its
 * arguments, the path of the file it reads and what that must hold
 * (sandbox.c's probe()). */
extern const char cq_sandbox_probe_py[];

#endif
