/* SPDX-License-Identifier: MIT */
/* judge_int.h - what judge.c shares with the source built from judge.py
 * (cq_embed() in agent/CMakeLists.txt), and its line reader. */
#ifndef CODERQ_JUDGE_INT_H
#define CODERQ_JUDGE_INT_H

#include "coderq/common/buf.h"

/* The judging interpreter's Python program, NUL-terminated. */
extern const char cq_judge_py[];

/* Lines from the judge: what was read past the last full line. */
typedef struct judge_reader {
        int fd;
        cq_buf_t buf; /* capped at the longest line */
} judge_reader_t;

#endif
