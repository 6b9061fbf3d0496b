/* SPDX-License-Identifier: MIT */
/* html_int.h - what html.c shares with the sources built from report.css
 * and report.js (cq_embed() in cli/CMakeLists.txt). */
#ifndef CODERQ_HTML_INT_H
#define CODERQ_HTML_INT_H

/* The run report's stylesheet and the index's script, NUL-terminated: put
 * in the pages as they are, and named by hash in their policy. */
extern const char cq_html_report_css[];
extern const char cq_html_report_js[];

#endif
