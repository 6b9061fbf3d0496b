/* SPDX-License-Identifier: MIT */
/* interp_int.h - what interp.c shares with the source built from
 * env_probe.py (cq_embed() in interp/CMakeLists.txt). */
#ifndef CODERQ_INTERP_INT_H
#define CODERQ_INTERP_INT_H

/* The environment probe's Python, NUL-terminated: it defines
 * _cq_env(marker) and calls nothing. */
extern const char cq_interp_env_probe_py[];

#endif
