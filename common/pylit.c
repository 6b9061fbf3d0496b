/* SPDX-License-Identifier: MIT */
/* pylit.c - Python str literals of untrusted text, for arguments handed
 * to the Python programs coderq runs; the programs never see C format
 * strings. */
#include "coderq/common/pylit.h"

#include <stdio.h>

#include "coderq/common/util.h"

cq_err_t cq_pylit_append(cq_buf_t *buf, const char *s, size_t n)
{
        cq_buf_t lit;
        cq_err_t err;
        size_t i, start = 0;

        if (!cq_utf8_valid(s, n))
                return CQ_ERR_FATAL;
        /* built apart, so that \p buf gets all of it or nothing */
        cq_buf_init(&lit, cq_buf_room(buf));
        err = cq_buf_append(&lit, "'", 1);
        for (i = 0; i < n && err == CQ_OK; i++) {
                unsigned char c = (unsigned char)s[i];
                char esc[5];

                if (c >= 0x20 && c != 0x7f && c != '\\' && c != '\'')
                        continue;
                err = cq_buf_append(&lit, s + start, i - start);
                if (err != CQ_OK)
                        break;
                if (c == '\\' || c == '\'')
                        snprintf(esc, sizeof(esc), "\\%c", c);
                else
                        snprintf(esc, sizeof(esc), "\\x%02x", c);
                err = cq_buf_append_str(&lit, esc);
                start = i + 1;
        }
        if (err == CQ_OK)
                err = cq_buf_append(&lit, s + start, n - start);
        if (err == CQ_OK)
                err = cq_buf_append(&lit, "'", 1);
        if (err == CQ_OK)
                err = cq_buf_append(buf, lit.data, lit.len);
        cq_buf_release(&lit);
        return err;
}
