/* SPDX-License-Identifier: MIT */
/* clifmt.c - text formatting for the CLI: CSV fields, display width of
 * UTF-8, untrusted text escaped for a terminal, aligned tables, the
 * progress bar and durations. The width table is a small approximation
 * of wcwidth() that does not depend on the locale (main() runs in the C
 * locale). */
#include "coderq/cli/clifmt.h"

#include <stdlib.h>
#include <string.h>

/* Decode one code point at \p s (at most \p n bytes). Returns its length
 * in bytes (>= 1) and sets *cpp, or -1 for a byte that starts no valid
 * sequence (its length is then 1). */
static size_t utf8_next(const unsigned char *s, size_t n, long *cpp)
{
        long cp;
        size_t len, i;

        if (s[0] < 0x80) {
                *cpp = s[0];
                return 1;
        }
        if (s[0] >= 0xC2 && s[0] <= 0xDF) {
                len = 2;
                cp = s[0] & 0x1F;
        } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
                len = 3;
                cp = s[0] & 0x0F;
        } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
                len = 4;
                cp = s[0] & 0x07;
        } else {
                *cpp = -1;
                return 1;
        }
        if (len > n) {
                *cpp = -1;
                return 1;
        }
        for (i = 1; i < len; i++) {
                if ((s[i] & 0xC0) != 0x80) {
                        *cpp = -1;
                        return 1;
                }
                cp = (cp << 6) | (s[i] & 0x3F);
        }
        /* overlong forms, surrogates and values past U+10FFFF */
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
                *cpp = -1;
                return 1;
        }
        *cpp = cp;
        return len;
}

static const long wide_ranges[][2] = {
    {0x1100, 0x115F},   {0x2E80, 0x303E},   {0x3041, 0x33FF},
    {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xA000, 0xA4CF},
    {0xAC00, 0xD7A3},   {0xF900, 0xFAFF},   {0xFE30, 0xFE4F},
    {0xFF00, 0xFF60},   {0xFFE0, 0xFFE6},   {0x1F300, 0x1F64F},
    {0x1F900, 0x1F9FF}, {0x20000, 0x2FFFD}, {0x30000, 0x3FFFD},
};

static const long zero_ranges[][2] = {
    {0x0300, 0x036F}, {0x0483, 0x0489}, {0x0591, 0x05BD}, {0x200B, 0x200F},
    {0x20D0, 0x20FF}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE2F},
};

static bool in_ranges(long cp, const long (*r)[2], size_t n)
{
        size_t i;

        for (i = 0; i < n; i++)
                if (cp >= r[i][0] && cp <= r[i][1])
                        return true;
        return false;
}

static size_t cp_width(long cp)
{
        if (cp < 0)
                return 1; /* shown as one replacement glyph */
        if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0))
                return 0;
        if (in_ranges(cp, zero_ranges, CQ_ARRAY_SIZE(zero_ranges)))
                return 0;
        if (in_ranges(cp, wide_ranges, CQ_ARRAY_SIZE(wide_ranges)))
                return 2;
        return 1;
}

size_t cq_fmt_width(const char *s)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t n, w = 0;
        long cp;

        if (!s)
                return 0;
        n = strlen(s);
        while (n > 0) {
                size_t len = utf8_next(p, n, &cp);

                w += cp_width(cp);
                p += len;
                n -= len;
        }
        return w;
}

/* Bidirectional formatting controls: they reorder the text around them
 * on a terminal that implements bidi, so output could read differently
 * from what it holds. */
static bool is_bidi(long cp)
{
        return (cp >= 0x202A && cp <= 0x202E) ||
               (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F ||
               cp == 0x061C;
}

#define SHOW_TMP 16 /* an escape: "\\u202e" and its NUL fit */

/* How text is shown: as a table cell, or as one line of untrusted text. */
typedef enum show_mode {
        SHOW_CELL, /* C0 and DEL as a space; C1, bidi, bad bytes as U+FFFD */
        SHOW_LINE, /* every one of those as a visible escape */
} show_mode_t;

/* What the code point \p cp (\p len bytes at \p p; cp < 0 for a byte
 * that is not UTF-8) shows as in \p mode: sets *outp and *outlen (to \p p
 * itself, or to \p tmp of SHOW_TMP bytes) and returns its columns. */
static size_t show_cp(show_mode_t mode,
                      long cp,
                      const unsigned char *p,
                      size_t len,
                      char *tmp,
                      const char **outp,
                      size_t *outlen)
{
        bool c0 = cp >= 0 && (cp < 0x20 || cp == 0x7F);
        bool other = cp < 0 || (cp >= 0x80 && cp < 0xA0) || is_bidi(cp);

        if (mode == SHOW_CELL && (c0 || other)) {
                *outp = c0 ? " " : "\xef\xbf\xbd"; /* U+FFFD */
                *outlen = c0 ? 1 : 3;
                return 1;
        }
        if (cp == '\n' || cp == '\r' || cp == '\t')
                *outlen = (size_t)snprintf(tmp, SHOW_TMP, "\\%c",
                                           cp == '\n'   ? 'n'
                                           : cp == '\r' ? 'r'
                                                        : 't');
        else if (c0 || cp < 0)
                *outlen = (size_t)snprintf(tmp, SHOW_TMP, "\\x%02x",
                                           c0 ? (unsigned)cp : (unsigned)p[0]);
        else if (other)
                *outlen = (size_t)snprintf(tmp, SHOW_TMP, "\\u%04lx", cp);
        else {
                *outp = (const char *)p;
                *outlen = len;
                return cp_width(cp);
        }
        *outp = tmp;
        return *outlen;
}

/* The columns \p s takes once shown in \p mode. */
static size_t shown_width(show_mode_t mode, const char *s)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t n = strlen(s), w = 0, outlen;
        const char *out;
        char tmp[SHOW_TMP];
        long cp;

        while (n > 0) {
                size_t len = utf8_next(p, n, &cp);

                w += show_cp(mode, cp, p, len, tmp, &out, &outlen);
                p += len;
                n -= len;
        }
        return w;
}

/* Append \p s shown in \p mode, cut to \p max_width columns (0: no
 * limit) at a code point (never inside an escape) with "...". */
static cq_err_t
show_text(cq_buf_t *buf, const char *s, size_t max_width, show_mode_t mode)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t n, w = 0, limit;
        bool cut;
        long cp;

        if (!s)
                return CQ_OK;
        cut = max_width > 0 && shown_width(mode, s) > max_width;
        limit = !cut ? (size_t)-1 : max_width > 3 ? max_width - 3 : max_width;
        n = strlen(s);
        while (n > 0) {
                size_t len = utf8_next(p, n, &cp), outlen, cw;
                const char *out;
                char tmp[SHOW_TMP];

                cw = show_cp(mode, cp, p, len, tmp, &out, &outlen);
                if (w + cw > limit)
                        break;
                if (cq_buf_append(buf, out, outlen) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
                w += cw;
                p += len;
                n -= len;
        }
        if (cut && max_width > 3 && cq_buf_append(buf, "...", 3) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        return CQ_OK;
}

cq_err_t cq_fmt_cell(cq_buf_t *buf, const char *s, size_t max_width)
{
        return show_text(buf, s, max_width, SHOW_CELL);
}

cq_err_t cq_fmt_untrusted(cq_buf_t *buf, const char *s, size_t max_width)
{
        return show_text(buf, s, max_width, SHOW_LINE);
}

char *cq_fmt_untrusted_dup(const char *s, size_t max_width)
{
        cq_buf_t buf;

        cq_buf_init(&buf, SIZE_MAX);
        if (cq_fmt_untrusted(&buf, s, max_width) != CQ_OK) {
                cq_buf_release(&buf);
                return NULL;
        }
        return cq_buf_take(&buf, NULL);
}

cq_err_t cq_fmt_csv_field(cq_buf_t *buf, const char *s)
{
        size_t n;
        const char *p;
        bool quote;

        if (!s || !*s)
                return CQ_OK;
        n = strlen(s);
        quote = strpbrk(s, ",\"\r\n") != NULL || s[0] == ' ' || s[n - 1] == ' ';
        if (!quote)
                return cq_buf_append(buf, s, n) == CQ_OK ? CQ_OK
                                                         : CQ_ERR_TOO_LARGE;
        if (cq_buf_append(buf, "\"", 1) != CQ_OK)
                return CQ_ERR_TOO_LARGE;
        for (p = s; *p; p++) {
                if (*p == '"' && cq_buf_append(buf, "\"", 1) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
                if (cq_buf_append(buf, p, 1) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        }
        return cq_buf_append(buf, "\"", 1) == CQ_OK ? CQ_OK : CQ_ERR_TOO_LARGE;
}

/* ---------------------------------------------------------------- table */

struct cq_table {
        size_t ncols;
        size_t max_width;
        int *align;
        size_t *widths;
        char **cells; /* (nrows + 1) * ncols, row 0 is the header */
        size_t nrows; /* including the header */
        size_t alloc; /* rows allocated */
};

void cq_table_destroy(cq_table_t **tablep)
{
        cq_table_t *table = *tablep;
        size_t i;

        if (!table)
                return;
        for (i = 0; i < table->nrows * table->ncols; i++)
                free(table->cells[i]);
        free(table->cells);
        free(table->widths);
        free(table->align);
        free(table);
        *tablep = NULL;
}

static int table_add(cq_table_t *table, const char *const *cells, bool header)
{
        size_t i, base;
        cq_buf_t buf;

        if (table->nrows == table->alloc) {
                size_t alloc = table->alloc ? table->alloc * 2 : 16;
                char **v =
                    realloc(table->cells, alloc * table->ncols * sizeof(*v));

                if (!v)
                        return -1;
                table->cells = v;
                table->alloc = alloc;
        }
        base = table->nrows * table->ncols;
        for (i = 0; i < table->ncols; i++)
                table->cells[base + i] = NULL;
        table->nrows++;
        for (i = 0; i < table->ncols; i++) {
                const char *s = cells[i] ? cells[i] : "-";
                size_t w;

                cq_buf_init(&buf, SIZE_MAX);
                if (cq_fmt_cell(&buf, s, header ? 0 : table->max_width) !=
                    CQ_OK) {
                        cq_buf_release(&buf);
                        return -1;
                }
                table->cells[base + i] = cq_buf_take(&buf, NULL);
                if (!table->cells[base + i]) {
                        table->cells[base + i] = strdup("");
                        if (!table->cells[base + i])
                                return -1;
                }
                w = cq_fmt_width(table->cells[base + i]);
                if (w > table->widths[i])
                        table->widths[i] = w;
        }
        return 0;
}

cq_table_t *cq_table_new(size_t ncols,
                         const char *const *headers,
                         const int *align,
                         size_t max_width)
{
        cq_table_t *table;
        size_t i;

        if (ncols == 0)
                return NULL;
        table = calloc(1, sizeof(*table));
        if (!table)
                return NULL;
        table->ncols = ncols;
        table->max_width = max_width;
        table->align = calloc(ncols, sizeof(*table->align));
        table->widths = calloc(ncols, sizeof(*table->widths));
        if (!table->align || !table->widths)
                goto fail;
        for (i = 0; i < ncols; i++)
                table->align[i] = align ? align[i] : CQ_TABLE_LEFT;
        if (table_add(table, headers, true))
                goto fail;
        return table;
fail:
        cq_table_destroy(&table);
        return NULL;
}

int cq_table_add(cq_table_t *table, const char *const *cells)
{
        return table_add(table, cells, false);
}

static cq_err_t pad(cq_buf_t *buf, size_t n)
{
        static const char spaces[] = "                                ";

        while (n > 0) {
                size_t k = n < sizeof(spaces) - 1 ? n : sizeof(spaces) - 1;

                if (cq_buf_append(buf, spaces, k) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
                n -= k;
        }
        return CQ_OK;
}

cq_err_t cq_table_render(const cq_table_t *table, cq_buf_t *buf)
{
        size_t r, c;

        for (r = 0; r < table->nrows; r++) {
                for (c = 0; c < table->ncols; c++) {
                        const char *s = table->cells[r * table->ncols + c];
                        size_t fill = table->widths[c] - cq_fmt_width(s);
                        bool last = c + 1 == table->ncols;

                        if (c > 0 && pad(buf, 2) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                        if (table->align[c] == CQ_TABLE_RIGHT &&
                            pad(buf, fill) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                        if (cq_buf_append_str(buf, s) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                        if (table->align[c] != CQ_TABLE_RIGHT && !last &&
                            pad(buf, fill) != CQ_OK)
                                return CQ_ERR_TOO_LARGE;
                }
                if (cq_buf_append(buf, "\n", 1) != CQ_OK)
                        return CQ_ERR_TOO_LARGE;
        }
        return CQ_OK;
}

/* ------------------------------------------------------------- progress */

void cq_fmt_progress(char *out,
                     size_t size,
                     const cq_progress_t *progress,
                     size_t bar_width)
{
        size_t done, filled, i, len = 0;
        char cancelled[48] = "";
        int n;

        if (size == 0)
                return;
        done = progress->succeeded + progress->failed + progress->cancelled;
        if (progress->total == 0 || done >= progress->total)
                filled = bar_width;
        else
                filled = done * bar_width / progress->total;
        out[0] = '\0';
        if (size < bar_width + 3)
                bar_width = 0;
        if (bar_width > 0) {
                out[len++] = '[';
                for (i = 0; i < bar_width; i++)
                        out[len++] = i < filled ? '#' : '.';
                out[len++] = ']';
                out[len++] = ' ';
                out[len] = '\0';
        }
        if (progress->cancelled > 0)
                snprintf(cancelled, sizeof(cancelled), " %zu cancelled",
                         progress->cancelled);
        n = snprintf(out + len, size - len,
                     "%zu/%zu done  %zu ok %zu failed%s  %zu running  %zu "
                     "queued",
                     done, progress->total, progress->succeeded,
                     progress->failed, cancelled, progress->running,
                     progress->queued);
        (void)n;
}

void cq_fmt_duration(char *out, size_t size, long long ms)
{
        if (ms < 0)
                snprintf(out, size, "-");
        else if (ms < 1000)
                snprintf(out, size, "%lldms", ms);
        else if (ms < 60000)
                snprintf(out, size, "%lld.%llds", ms / 1000, (ms % 1000) / 100);
        else if (ms < 3600000)
                snprintf(out, size, "%lldm%02llds", ms / 60000,
                         (ms % 60000) / 1000);
        else
                snprintf(out, size, "%lldh%02lldm", ms / 3600000,
                         (ms % 3600000) / 60000);
}

cq_err_t cq_fmt_scalar(cq_buf_t *buf, const json_t *value)
{
        cq_err_t err = CQ_OK;
        char *text;

        if (!value)
                return CQ_OK;
        switch (json_typeof(value)) {
        case JSON_STRING:
                err = cq_buf_append(buf, json_string_value(value),
                                    json_string_length(value));
                break;
        case JSON_INTEGER:
                err = cq_buf_printf(buf, "%" JSON_INTEGER_FORMAT,
                                    json_integer_value(value));
                break;
        case JSON_REAL:
                err = cq_buf_printf(buf, "%.15g", json_real_value(value));
                break;
        case JSON_TRUE:
                err = cq_buf_append_str(buf, "true");
                break;
        case JSON_FALSE:
                err = cq_buf_append_str(buf, "false");
                break;
        case JSON_OBJECT:
        case JSON_ARRAY:
                text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
                if (!text)
                        return CQ_ERR_TOO_LARGE;
                err = cq_buf_append_str(buf, text);
                free(text);
                break;
        case JSON_NULL:
        default:
                break;
        }
        return err == CQ_OK ? CQ_OK : CQ_ERR_TOO_LARGE;
}

static const char *ext_of_mime(const char *mime)
{
        static const char *const map[][2] = {
            {"image/png", ".png"},       {"image/jpeg", ".jpg"},
            {"image/gif", ".gif"},       {"image/svg+xml", ".svg"},
            {"image/webp", ".webp"},     {"image/bmp", ".bmp"},
            {"application/pdf", ".pdf"},
        };
        size_t i;

        for (i = 0; mime && i < CQ_ARRAY_SIZE(map); i++)
                if (strcmp(mime, map[i][0]) == 0)
                        return map[i][1];
        return ".bin";
}

/* Longest prefix of s[0..n) that ends on a code point boundary. */
static size_t utf8_cut(const char *s, size_t n)
{
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
                n--;
        return n;
}

/* Copy \p n bytes of \p s into \p out, unsafe bytes as '_'. */
static size_t copy_clean(char *out, const char *s, size_t n)
{
        size_t i;

        for (i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];

                out[i] = c < 0x20 || c == 0x7F || c == ':' ? '_' : s[i];
        }
        out[n] = '\0';
        return n;
}

void cq_fmt_image_name(const char *name,
                       const char *mime,
                       const char *sha256,
                       char *out,
                       size_t size)
{
        const char *base = name ? name : "", *p, *ext;
        char clean[128];
        size_t len, elen, stem;

        for (p = base; *p; p++)
                if (*p == '/' || *p == '\\')
                        base = p + 1;
        while (*base == '.')
                base++;
        len = strlen(base);
        if (len == 0) {
                snprintf(out, size, "image-%.12s%s",
                         sha256 && *sha256 ? sha256 : "unnamed",
                         ext_of_mime(mime));
                return;
        }
        /* At most 100 bytes: a short extension is kept, the stem is cut
         * at a code point boundary. */
        ext = strrchr(base, '.');
        elen = ext && strlen(ext) <= 16 ? strlen(ext) : 0;
        stem = len - elen;
        if (stem + elen > 100)
                stem = utf8_cut(base, 100 - elen);
        copy_clean(clean, base, stem);
        copy_clean(clean + stem, base + len - elen, elen);
        snprintf(out, size, "%s%s", stem == 0 ? "image" : "", clean);
}

void cq_fmt_name_variant(const char *name, int n, char *out, size_t size)
{
        const char *dot = strrchr(name, '.');

        if (!dot || dot == name)
                snprintf(out, size, "%s-%d", name, n);
        else
                snprintf(out, size, "%.*s-%d%s", (int)(dot - name), name, n,
                         dot);
}
