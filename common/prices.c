/* SPDX-License-Identifier: MIT */
/* prices.c - the prices file (CODERQ_PRICES_FILE) and the cost of token
 * usage. The file is read whole under a size cap, parsed with duplicate
 * keys rejected, and every model entry is checked: a misspelt price key
 * is an error, not a price of 0. */
#include "coderq/common/prices.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL_NAME_MAX 256

typedef struct entry {
        char *name; /* without the trailing '*' of a prefix entry */
        size_t len;
        bool prefix;
        cq_price_t price;
} entry_t;

struct cq_prices {
        entry_t *v;
        size_t n;
};

void cq_prices_destroy(cq_prices_t **pricesp)
{
        cq_prices_t *prices = *pricesp;
        size_t i;

        if (!prices)
                return;
        for (i = 0; i < prices->n; i++)
                free(prices->v[i].name);
        free(prices->v);
        free(prices);
        *pricesp = NULL;
}

size_t cq_prices_count(const cq_prices_t *prices)
{
        return prices ? prices->n : 0;
}

/* Printable ASCII without spaces, as model names are. */
static bool name_is_valid(const char *s, size_t len)
{
        size_t i;

        if (len == 0 || len > MODEL_NAME_MAX)
                return false;
        for (i = 0; i < len; i++)
                if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
                        return false;
        return true;
}

/* One price: required unless \p defval is given (>= 0). */
static int price_field(const json_t *obj,
                       const char *model,
                       const char *key,
                       double defval,
                       double *outp,
                       const char *source,
                       char *errstr,
                       size_t errstr_size)
{
        const json_t *v = json_object_get(obj, key);
        double d;

        if (!v) {
                if (defval >= 0) {
                        *outp = defval;
                        return 0;
                }
                cq_errstr_set(errstr, errstr_size,
                              "prices file \"%s\": field \"models.%s.%s\" is "
                              "required",
                              source, model, key);
                return -1;
        }
        if (!json_is_number(v) || !((d = json_number_value(v)) >= 0) ||
            d > CQ_PRICE_MAX) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\": field \"models.%s.%s\" must be a "
                    "number from 0 to %.0f",
                    source, model, key, CQ_PRICE_MAX);
                return -1;
        }
        *outp = d;
        return 0;
}

static int parse_entry(const char *name,
                       const json_t *obj,
                       entry_t *e,
                       const char *source,
                       char *errstr,
                       size_t errstr_size)
{
        static const char *const known[] = {"input", "output", "cached_input",
                                            "cache_write", NULL};
        size_t len = strlen(name), i;
        const char *key, *star;
        const json_t *value;
        char shown[MODEL_NAME_MAX + 1];

        snprintf(shown, sizeof(shown), "%.*s",
                 (int)(len > MODEL_NAME_MAX ? MODEL_NAME_MAX : len), name);
        star = strchr(name, '*');
        if (!name_is_valid(name, len) ||
            (star && (star != name + len - 1 || len == 1))) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\": model \"%.64s\" must be 1 to %d "
                    "printable ASCII characters without spaces, with at "
                    "most one '*', at the end, after a prefix",
                    source, shown, MODEL_NAME_MAX);
                return -1;
        }
        if (!json_is_object(obj)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\": field \"models.%s\" must be an "
                    "object",
                    source, shown);
                return -1;
        }
        json_object_foreach((json_t *)(uintptr_t)obj, key, value)
        {
                bool found = false;

                (void)value;
                for (i = 0; known[i]; i++)
                        found = found || strcmp(key, known[i]) == 0;
                if (!found) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "prices file \"%s\": unknown field "
                            "\"models.%s.%.64s\" (known: input, output, "
                            "cached_input, cache_write)",
                            source, shown, key);
                        return -1;
                }
        }
        if (price_field(obj, shown, "input", -1, &e->price.input, source,
                        errstr, errstr_size) ||
            price_field(obj, shown, "output", -1, &e->price.output, source,
                        errstr, errstr_size) ||
            price_field(obj, shown, "cached_input", e->price.input,
                        &e->price.cached_input, source, errstr, errstr_size) ||
            price_field(obj, shown, "cache_write", e->price.input,
                        &e->price.cache_write, source, errstr, errstr_size))
                return -1;
        e->prefix = name[len - 1] == '*';
        e->len = e->prefix ? len - 1 : len;
        e->name = strndup(name, e->len);
        if (!e->name) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                return -1;
        }
        return 0;
}

cq_prices_t *cq_prices_parse(const char *text,
                             size_t len,
                             const char *source,
                             char *errstr,
                             size_t errstr_size)
{
        json_error_t jerr;
        json_t *doc = NULL;
        const json_t *models, *value;
        const char *key;
        cq_prices_t *prices = NULL;

        if (!source)
                source = "-";
        if (len > CQ_PRICES_FILE_MAX) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\" is %zu bytes, over the limit of "
                    "%zu",
                    source, len, CQ_PRICES_FILE_MAX);
                return NULL;
        }
        doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!doc) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\" is not valid JSON: %s (line %d, "
                    "column %d)",
                    source, jerr.text, jerr.line, jerr.column);
                return NULL;
        }
        models = json_object_get(doc, "models");
        if (json_object_size(doc) != 1 || !json_is_object(models)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\" must be an object with one field, "
                    "\"models\": an object of model names",
                    source);
                goto fail;
        }
        prices = calloc(1, sizeof(*prices));
        if (prices && json_object_size(models) > 0)
                prices->v = calloc(json_object_size(models), sizeof(entry_t));
        if (!prices || (json_object_size(models) > 0 && !prices->v)) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                goto fail;
        }
        json_object_foreach((json_t *)(uintptr_t)models, key, value)
        {
                if (parse_entry(key, value, &prices->v[prices->n], source,
                                errstr, errstr_size))
                        goto fail;
                prices->n++;
        }
        json_decref(doc);
        return prices;
fail:
        json_decref(doc);
        cq_prices_destroy(&prices);
        return NULL;
}

cq_prices_t *cq_prices_load(const char *path, char *errstr, size_t errstr_size)
{
        struct stat st;
        char *text = NULL;
        size_t got = 0;
        cq_prices_t *prices = NULL;
        int fd;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
                cq_errstr_set(errstr, errstr_size,
                              "could not open prices file \"%s\": %s", path,
                              strerror(errno));
                return NULL;
        }
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "could not read prices file \"%s\": not a regular "
                    "file",
                    path);
                goto out;
        }
        if ((size_t)st.st_size > CQ_PRICES_FILE_MAX) {
                cq_errstr_set(
                    errstr, errstr_size,
                    "prices file \"%s\" is %lld bytes, over the limit of "
                    "%zu",
                    path, (long long)st.st_size, CQ_PRICES_FILE_MAX);
                goto out;
        }
        /* One byte more than the cap: a file that grew is seen. */
        text = malloc(CQ_PRICES_FILE_MAX + 1);
        if (!text) {
                cq_errstr_set(errstr, errstr_size, "out of memory");
                goto out;
        }
        for (;;) {
                ssize_t n = read(fd, text + got, CQ_PRICES_FILE_MAX + 1 - got);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not read prices file \"%s\": %s",
                                      path, strerror(errno));
                        goto out;
                }
                if (n == 0 || got + (size_t)n > CQ_PRICES_FILE_MAX) {
                        got += (size_t)n;
                        break;
                }
                got += (size_t)n;
        }
        prices = cq_prices_parse(text, got, path, errstr, errstr_size);
out:
        free(text);
        close(fd);
        return prices;
}

bool cq_prices_find(const cq_prices_t *prices,
                    const char *model,
                    cq_price_t *pricep)
{
        const entry_t *best = NULL;
        size_t i, len;

        if (!prices || !model)
                return false;
        len = strlen(model);
        for (i = 0; i < prices->n; i++) {
                const entry_t *e = &prices->v[i];

                if (!e->prefix) {
                        if (e->len == len && memcmp(e->name, model, len) == 0) {
                                best = e;
                                break;
                        }
                        continue;
                }
                if (e->len <= len && memcmp(e->name, model, e->len) == 0 &&
                    (!best || (best->prefix && e->len > best->len)))
                        best = e;
        }
        if (!best)
                return false;
        *pricep = best->price;
        return true;
}

static double clamp0(int64_t n) { return n > 0 ? (double)n : 0.0; }

double cq_price_cost(const cq_price_t *price, const cq_usage_t *usage)
{
        double prompt = clamp0(usage->prompt_tokens);
        double read = clamp0(usage->cache_read_tokens);
        double write = clamp0(usage->cache_creation_tokens);
        double plain;

        if (read > prompt)
                read = prompt;
        if (write > prompt - read)
                write = prompt - read;
        plain = prompt - read - write;
        return (plain * price->input + read * price->cached_input +
                write * price->cache_write +
                clamp0(usage->completion_tokens) * price->output) /
               1e6;
}

double cq_price_estimate(const cq_price_t *price,
                         int64_t prompt_tokens,
                         int64_t max_tokens)
{
        return (clamp0(prompt_tokens) * price->input +
                clamp0(max_tokens) * price->output) /
               1e6;
}
