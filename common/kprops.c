/* SPDX-License-Identifier: MIT */
/* kprops.c - the operator's librdkafka properties: a strict reader of
 * Java-style properties files, the CODERQ_KAFKA_PROP_<NAME> variables, the
 * names coderq keeps for itself and the names whose values are secrets.
 * The file is untrusted text: its size is capped before it is read, every
 * read below is bounded by its length, and no error quotes a value. */
#include "coderq/common/kprops.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct kprop {
        char *key;
        char *value;
        char *source;
} kprop_t;

struct cq_kprops {
        kprop_t *v;
        size_t n, cap;
};

/* Names coderq sets itself, and why; aliases librdkafka accepts for them
 * are listed too, so an alias cannot slip past. */
static const struct reserved {
        const char *key;
        const char *why;
} reserved[] = {
    {"bootstrap.servers", "coderq sets it from CODERQ_KAFKA_BROKERS"},
    {"metadata.broker.list", "coderq sets it from CODERQ_KAFKA_BROKERS"},
    {"group.id", "coderq sets it from CODERQ_KAFKA_GROUP"},
    {"enable.auto.offset.store",
     "the intake stores an offset only after PostgreSQL has the job (false)"},
    {"enable.auto.commit",
     "the intake relies on auto-commit of the offsets it stored (true)"},
    {"auto.commit.enable",
     "the intake relies on auto-commit of the offsets it stored (true)"},
    {"auto.offset.reset",
     "a new consumer group must read the jobs topic from its start, losing "
     "no job (earliest)"},
    {"partition.assignment.strategy",
     "the intake needs the eager range assignor (librdkafka 2.0.2's "
     "cooperative-sticky can hang)"},
    {"enable.partition.eof", "the intake does not handle partition EOF events"},
    {"enable.idempotence",
     "completion events and submitted jobs need the idempotent producer "
     "(true)"},
    {"acks", "the idempotent producer needs acks=all"},
    {"request.required.acks", "the idempotent producer needs acks=all"},
    {"message.timeout.ms",
     "the relay's claim on an outbox row lasts the message timeout + 15 s"},
    {"delivery.timeout.ms",
     "the relay's claim on an outbox row lasts the message timeout + 15 s"},
    {"transactional.id", "coderq's producers are not transactional"},
};

cq_kprops_t *cq_kprops_new(void) { return calloc(1, sizeof(cq_kprops_t)); }

void cq_kprops_destroy(cq_kprops_t **propsp)
{
        cq_kprops_t *props = *propsp;
        size_t i;

        if (!props)
                return;
        for (i = 0; i < props->n; i++) {
                free(props->v[i].key);
                free(props->v[i].value);
                free(props->v[i].source);
        }
        free(props->v);
        free(props);
        *propsp = NULL;
}

size_t cq_kprops_count(const cq_kprops_t *props) { return props->n; }

void cq_kprops_get(const cq_kprops_t *props,
                   size_t i,
                   const char **keyp,
                   const char **valuep,
                   const char **sourcep)
{
        *keyp = props->v[i].key;
        *valuep = props->v[i].value;
        if (sourcep)
                *sourcep = props->v[i].source;
}

const char *cq_kprops_reserved(const char *key)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(reserved); i++)
                if (strcmp(key, reserved[i].key) == 0)
                        return reserved[i].why;
        return NULL;
}

/* A case-insensitive search for \p needle in \p s. */
static bool has_word(const char *s, const char *needle)
{
        size_t n = strlen(needle);

        for (; *s; s++)
                if (strncasecmp(s, needle, n) == 0)
                        return true;
        return false;
}

bool cq_kprops_is_secret(const char *key)
{
        static const char *const exact[] = {
            "ssl.key.pem",      /* a private key */
            "ssl_key",          /* the same, librdkafka's internal name */
            "ssl.keystore.key", /* Java clients' PEM private key */
            "sasl.jaas.config", /* Java clients' credentials */
            "sasl.oauthbearer.config", /* may hold credentials */
        };
        size_t i;

        if (has_word(key, "password") || has_word(key, "secret"))
                return true;
        for (i = 0; i < CQ_ARRAY_SIZE(exact); i++)
                if (strcmp(key, exact[i]) == 0)
                        return true;
        return false;
}

static bool key_char(char c)
{
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

static int find(const cq_kprops_t *props, const char *key)
{
        size_t i;

        for (i = 0; i < props->n; i++)
                if (strcmp(props->v[i].key, key) == 0)
                        return (int)i;
        return -1;
}

/* Set key (replacing an earlier entry of that name). Copies everything;
 * -1 when out of memory. */
static int
set(cq_kprops_t *props, const char *key, const char *value, const char *source)
{
        char *k = NULL, *v = strdup(value), *s = strdup(source);
        int at = find(props, key);

        if (!v || !s)
                goto oom;
        if (at >= 0) {
                free(props->v[at].value);
                free(props->v[at].source);
                props->v[at].value = v;
                props->v[at].source = s;
                return 0;
        }
        k = strdup(key);
        if (!k)
                goto oom;
        if (props->n == props->cap) {
                size_t cap = props->cap ? props->cap * 2 : 16;
                kprop_t *nv = realloc(props->v, cap * sizeof(*nv));

                if (!nv)
                        goto oom;
                props->v = nv;
                props->cap = cap;
        }
        props->v[props->n].key = k;
        props->v[props->n].value = v;
        props->v[props->n].source = s;
        props->n++;
        return 0;
oom:
        free(k);
        free(v);
        free(s);
        return -1;
}

/* ---------------------------------------------------------------- file */

/* A growing output string for one key or value (bounded by the text). */
typedef struct out {
        char *p;
        size_t len, cap;
} out_t;

static int out_put(out_t *o, const char *s, size_t n)
{
        if (o->len + n + 1 > o->cap) {
                size_t cap = o->cap ? o->cap : 64;
                char *np;

                while (cap < o->len + n + 1)
                        cap *= 2;
                np = realloc(o->p, cap);
                if (!np)
                        return -1;
                o->p = np;
                o->cap = cap;
        }
        memcpy(o->p + o->len, s, n);
        o->len += n;
        o->p[o->len] = '\0';
        return 0;
}

static size_t utf8_put(char buf[4], uint32_t cp)
{
        if (cp < 0x80) {
                buf[0] = (char)cp;
                return 1;
        }
        if (cp < 0x800) {
                buf[0] = (char)(0xC0 | (cp >> 6));
                buf[1] = (char)(0x80 | (cp & 0x3F));
                return 2;
        }
        if (cp < 0x10000) {
                buf[0] = (char)(0xE0 | (cp >> 12));
                buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[2] = (char)(0x80 | (cp & 0x3F));
                return 3;
        }
        buf[0] = (char)(0xF0 | (cp >> 18));
        buf[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        buf[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        buf[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
}

/* The reader's state over the whole text. */
typedef struct reader {
        const char *s;
        size_t len, pos;
        long line; /* natural line of s[pos], from 1 */
} reader_t;

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\f'; }

static bool eol(char c) { return c == '\n' || c == '\r'; }

/* Step over the line ending at pos (\n, \r or \r\n). */
static void skip_eol(reader_t *r)
{
        if (r->s[r->pos] == '\r') {
                r->pos++;
                if (r->pos < r->len && r->s[r->pos] == '\n')
                        r->pos++;
        } else {
                r->pos++;
        }
        r->line++;
}

/* Whether the natural line s[start, end) goes on on the next one: a
 * backslash escapes the character after it, so only an odd run of
 * backslashes at its end continues it. */
static bool continues(const char *s, size_t start, size_t end)
{
        size_t n = 0;

        while (end - n > start && s[end - 1 - n] == '\\')
                n++;
        return n % 2 == 1;
}

static int hexval(char c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* Four hex digits at s[i, i+4) (bounded by n) into *cpp. */
static int hex4(const char *s, size_t n, size_t i, uint32_t *cpp)
{
        uint32_t cp = 0;
        size_t k;

        for (k = 0; k < 4; k++) {
                int h = i + k < n ? hexval(s[i + k]) : -1;

                if (h < 0)
                        return -1;
                cp = cp << 4 | (uint32_t)h;
        }
        *cpp = cp;
        return 0;
}

/*
 * Read one escape: s[*ip] is the character after the backslash. Append
 * what it stands for and move *ip past it. Returns 0, or -1 with why
 * filled.
 */
static int
escape(const char *s, size_t n, size_t *ip, out_t *o, const char **why)
{
        char c = s[*ip], buf[4];
        uint32_t cp, lo;

        switch (c) {
        case 't':
                c = '\t';
                break;
        case 'n':
                c = '\n';
                break;
        case 'r':
                c = '\r';
                break;
        case 'f':
                c = '\f';
                break;
        case 'u':
                if (hex4(s, n, *ip + 1, &cp)) {
                        *why = "malformed \\u escape (four hex digits "
                               "expected)";
                        return -1;
                }
                *ip += 5;
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        *why = "\\u escape of a lone low surrogate";
                        return -1;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (*ip + 1 >= n || s[*ip] != '\\' ||
                            s[*ip + 1] != 'u' || hex4(s, n, *ip + 2, &lo) ||
                            lo < 0xDC00 || lo > 0xDFFF) {
                                *why = "\\u escape of a high surrogate not "
                                       "followed by a low one";
                                return -1;
                        }
                        *ip += 6;
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) {
                        *why = "a NUL character (\\u0000)";
                        return -1;
                }
                if (out_put(o, buf, utf8_put(buf, cp))) {
                        *why = "out of memory";
                        return -1;
                }
                return 0;
        default:
                break; /* any other character stands for itself */
        }
        (*ip)++;
        if (out_put(o, &c, 1)) {
                *why = "out of memory";
                return -1;
        }
        return 0;
}

/*
 * Split one logical line (natural lines joined, continuation blanks
 * dropped) into key and value. \p s..n is the joined text without line
 * ends. Returns 0, or -1 with why filled.
 */
static int
split(const char *s, size_t n, out_t *key, out_t *value, const char **why)
{
        size_t i = 0;
        bool sep = false;

        if (out_put(key, "", 0) || out_put(value, "", 0)) {
                *why = "out of memory";
                return -1;
        }
        while (i < n && blank(s[i]))
                i++;
        while (i < n) {
                char c = s[i];

                if (c == '=' || c == ':' || blank(c))
                        break;
                if (c == '\\') {
                        if (++i == n)
                                break; /* an escaped line end: continued */
                        if (escape(s, n, &i, key, why))
                                return -1;
                        continue;
                }
                if (out_put(key, &c, 1)) {
                        *why = "out of memory";
                        return -1;
                }
                i++;
        }
        while (i < n && blank(s[i]))
                i++;
        if (i < n && (s[i] == '=' || s[i] == ':')) {
                sep = true;
                i++;
                while (i < n && blank(s[i]))
                        i++;
        }
        if (!sep) {
                *why = "expected name=value";
                return -1;
        }
        while (i < n) {
                char c = s[i];

                if (c == '\\') {
                        i++;
                        if (i == n)
                                break; /* cannot happen: continued */
                        if (escape(s, n, &i, value, why))
                                return -1;
                        continue;
                }
                if (out_put(value, &c, 1)) {
                        *why = "out of memory";
                        return -1;
                }
                i++;
        }
        return 0;
}

static int check_key(const char *key, const char **why)
{
        size_t i, n = strlen(key);

        if (n == 0) {
                *why = "empty property name";
                return -1;
        }
        if (n > CQ_KPROPS_KEY_MAX) {
                *why = "property name too long";
                return -1;
        }
        for (i = 0; i < n; i++)
                if (!key_char(key[i])) {
                        *why = "invalid property name (letters, digits, '.', "
                               "'_' and '-' only)";
                        return -1;
                }
        return 0;
}

int cq_kprops_parse(cq_kprops_t *props,
                    const char *text,
                    size_t len,
                    const char *origin,
                    char *errstr,
                    size_t errstr_size)
{
        reader_t r = {text, len, 0, 1};
        /* Keys set by this text, and the line that set each. */
        char **seen = NULL;
        long *seen_line = NULL;
        size_t nseen = 0;
        out_t joined = {0}, key = {0}, value = {0};
        int rc = -1;

        if (memchr(text, '\0', len)) {
                size_t at =
                    (size_t)((const char *)memchr(text, '\0', len) - text);
                long line = 1;
                size_t i;

                for (i = 0; i < at; i++)
                        if (text[i] == '\n' ||
                            (text[i] == '\r' &&
                             (i + 1 >= len || text[i + 1] != '\n')))
                                line++;
                cq_errstr_set(errstr, errstr_size, "%s line %ld: a NUL byte",
                              origin, line);
                return -1;
        }
        while (r.pos < r.len) {
                long first = r.line;
                const char *why = NULL, *res;
                char source[512];
                size_t start, end;
                bool more = true;

                joined.len = 0;
                key.len = 0;
                value.len = 0;
                if (key.p)
                        key.p[0] = '\0';
                if (value.p)
                        value.p[0] = '\0';
                /* Leading blanks of the first natural line. */
                while (r.pos < r.len && blank(r.s[r.pos]))
                        r.pos++;
                if (r.pos == r.len)
                        break;
                if (eol(r.s[r.pos])) {
                        skip_eol(&r);
                        continue;
                }
                if (r.s[r.pos] == '#' || r.s[r.pos] == '!') {
                        while (r.pos < r.len && !eol(r.s[r.pos]))
                                r.pos++;
                        if (r.pos < r.len)
                                skip_eol(&r);
                        continue;
                }
                while (more) {
                        start = r.pos;
                        while (r.pos < r.len && !eol(r.s[r.pos]))
                                r.pos++;
                        end = r.pos;
                        more = continues(r.s, start, end);
                        if (more)
                                end--; /* drop the continuing backslash */
                        if (out_put(&joined, r.s + start, end - start)) {
                                why = "out of memory";
                                break;
                        }
                        if (r.pos < r.len)
                                skip_eol(&r);
                        else if (more) {
                                why = "a backslash continues the last line";
                                break;
                        }
                        if (more)
                                while (r.pos < r.len && blank(r.s[r.pos]))
                                        r.pos++;
                }
                if (!why)
                        (void)split(joined.p ? joined.p : "", joined.len, &key,
                                    &value, &why);
                if (!why)
                        (void)check_key(key.p, &why);
                if (!why && value.len != strlen(value.p))
                        why = "a NUL character";
                if (why) {
                        cq_errstr_set(errstr, errstr_size, "%s line %ld: %s",
                                      origin, first, why);
                        goto out;
                }
                res = cq_kprops_reserved(key.p);
                if (res) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "%s line %ld: property \"%s\" cannot be set: "
                            "%s",
                            origin, first, key.p, res);
                        goto out;
                }
                {
                        size_t i;

                        for (i = 0; i < nseen; i++)
                                if (strcmp(seen[i], key.p) == 0) {
                                        cq_errstr_set(
                                            errstr, errstr_size,
                                            "%s line %ld: property \"%s\" "
                                            "is already set on line %ld",
                                            origin, first, key.p, seen_line[i]);
                                        goto out;
                                }
                }
                {
                        char **ns = realloc(seen, (nseen + 1) * sizeof(*ns));
                        long *nl;

                        if (!ns)
                                goto oom;
                        seen = ns;
                        nl = realloc(seen_line, (nseen + 1) * sizeof(*nl));
                        if (!nl)
                                goto oom;
                        seen_line = nl;
                        seen[nseen] = strdup(key.p);
                        if (!seen[nseen])
                                goto oom;
                        seen_line[nseen++] = first;
                }
                snprintf(source, sizeof(source), "%s line %ld", origin, first);
                if (set(props, key.p, value.p, source))
                        goto oom;
        }
        rc = 0;
        goto out;
oom:
        cq_errstr_set(errstr, errstr_size, "could not read %s: out of memory",
                      origin);
out:
        while (nseen > 0)
                free(seen[--nseen]);
        free(seen);
        free(seen_line);
        free(joined.p);
        free(key.p);
        free(value.p);
        return rc;
}

int cq_kprops_load_file(cq_kprops_t *props,
                        const char *path,
                        char *errstr,
                        size_t errstr_size)
{
        FILE *fp = fopen(path, "rb");
        char *text = NULL;
        size_t len = 0;
        int rc = -1;

        if (!fp) {
                cq_errstr_set(errstr, errstr_size, "could not read %s: %s",
                              path, strerror(errno));
                return -1;
        }
        text = malloc(CQ_KPROPS_FILE_MAX + 1);
        if (!text) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read %s: out of memory", path);
                goto out;
        }
        len = fread(text, 1, CQ_KPROPS_FILE_MAX + 1, fp);
        if (ferror(fp)) {
                cq_errstr_set(errstr, errstr_size, "could not read %s: %s",
                              path, strerror(errno));
                goto out;
        }
        if (len > CQ_KPROPS_FILE_MAX) {
                cq_errstr_set(errstr, errstr_size,
                              "could not read %s: larger than %zu bytes", path,
                              CQ_KPROPS_FILE_MAX);
                goto out;
        }
        rc = cq_kprops_parse(props, text, len, path, errstr, errstr_size);
out:
        free(text);
        fclose(fp);
        return rc;
}

/* ----------------------------------------------------------- variables */

int cq_kprops_env_to_key(const char *env, char *out, size_t out_size)
{
        size_t plen = strlen(CQ_KPROPS_ENV_PREFIX), i, n;
        const char *name;

        if (strncmp(env, CQ_KPROPS_ENV_PREFIX, plen) != 0)
                return -1;
        name = env + plen;
        n = strlen(name);
        if (n == 0 || n >= out_size || n > CQ_KPROPS_KEY_MAX ||
            name[0] == '_' || name[n - 1] == '_' || strstr(name, "__"))
                return -1;
        for (i = 0; i < n; i++) {
                char c = name[i];

                if (c == '_')
                        out[i] = '.';
                else if (c >= 'A' && c <= 'Z')
                        out[i] = (char)(c - 'A' + 'a');
                else if (c >= '0' && c <= '9')
                        out[i] = c;
                else
                        return -1;
        }
        out[n] = '\0';
        return 0;
}

int cq_kprops_load_env(cq_kprops_t *props,
                       char *const *envp,
                       char *errstr,
                       size_t errstr_size)
{
        size_t plen = strlen(CQ_KPROPS_ENV_PREFIX), first = props->n;
        char *const *e;

        for (e = envp; e && *e; e++) {
                const char *eq = strchr(*e, '=');
                char name[256], key[CQ_KPROPS_KEY_MAX + 1];
                const char *why;
                size_t nlen;
                int at;

                if (strncmp(*e, CQ_KPROPS_ENV_PREFIX, plen) != 0 || !eq)
                        continue;
                nlen = (size_t)(eq - *e);
                if (nlen >= sizeof(name)) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "invalid variable %.64s...: name too long", *e);
                        return -1;
                }
                memcpy(name, *e, nlen);
                name[nlen] = '\0';
                if (!eq[1])
                        continue; /* empty: unset, as for every setting */
                if (cq_kprops_env_to_key(name, key, sizeof(key))) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "invalid variable %s: after %s the name must "
                            "be the property's, upper-case, with '_' for "
                            "'.' (CODERQ_KAFKA_PROP_SASL_MECHANISM for "
                            "sasl.mechanism)",
                            name, CQ_KPROPS_ENV_PREFIX);
                        return -1;
                }
                why = cq_kprops_reserved(key);
                if (why) {
                        cq_errstr_set(errstr, errstr_size,
                                      "%s: property \"%s\" cannot be set: %s",
                                      name, key, why);
                        return -1;
                }
                at = find(props, key);
                if (at >= 0 && (size_t)at >= first) {
                        cq_errstr_set(
                            errstr, errstr_size,
                            "%s: property \"%s\" is already set by %s", name,
                            key, props->v[at].source);
                        return -1;
                }
                if (set(props, key, eq + 1, name)) {
                        cq_errstr_set(errstr, errstr_size,
                                      "could not set %s: out of memory", name);
                        return -1;
                }
        }
        return 0;
}
