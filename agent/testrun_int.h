/* SPDX-License-Identifier: MIT */
/* testrun_int.h - what testrun.c shares with the source built from
 * testrun_harness.py (cq_embed() in agent/CMakeLists.txt). */
#ifndef CODERQ_TESTRUN_INT_H
#define CODERQ_TESTRUN_INT_H

/* The test harness's Python program, NUL-terminated. */
extern const char cq_testrun_harness_py[];

#endif
