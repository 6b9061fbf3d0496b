/* SPDX-License-Identifier: MIT */
/* pgconn.c - a failed PostgreSQL connection in one line: the target as
 * libpq parses the DSN (no password), and the failure read from libpq's
 * message, since a connection that never started has no SQLSTATE. The
 * patterns are libpq's and the server's English wording; a message they
 * do not match is an outage, which the caller waits out. */
#include "coderq/storage/pgconn.h"

#include <libpq-fe.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"

/* Words of a line that waiting cannot change. server: only in the
 * server's own "FATAL:" text. */
static const struct {
        const char *words;
        bool server;
} fatal_words[] = {
    /* the database or the role */
    {"does not exist", true},
    {"is not permitted to log in", true},
    {"permission denied for database", true},
    /* credentials: password, peer, ident, LDAP, certificate, ... */
    {"authentication failed for user", true},
    {"pg_hba.conf", true},
    {"no password supplied", false},
    {"channel binding", false},
    /* TLS the client refuses */
    {"server does not support SSL", false},
    {"certificate verify failed", false},
    {"does not match host name", false},
    {"root certificate file", false},
    {"certificate file", false},
    {"private key file", false},
    /* a connection string libpq cannot parse */
    {"invalid connection option", false},
    {"in connection info string", false},
    {"invalid URI", false},
    {"invalid integer value", false},
    {"invalid port number", false},
    {"invalid sslmode value", false},
};

/* \p line (\p len bytes) without libpq's "connection to server at "H",
 * port P failed: " (the target names the host) and the server's
 * "FATAL:"; *serverp says whether that was there. */
static const char *strip_line(const char *line, size_t *lenp, bool *serverp)
{
        static const char at[] = "connection to server at ";
        static const char failed[] = " failed: ";
        static const char fatal[] = "FATAL:";
        const char *end = line + *lenp, *p;

        if (*lenp > sizeof(at) && strncmp(line, at, sizeof(at) - 1) == 0) {
                for (p = line; p + sizeof(failed) - 1 <= end; p++) {
                        if (strncmp(p, failed, sizeof(failed) - 1) == 0) {
                                line = p + sizeof(failed) - 1;
                                break;
                        }
                }
        }
        *serverp = (size_t)(end - line) >= sizeof(fatal) - 1 &&
                   strncmp(line, fatal, sizeof(fatal) - 1) == 0;
        if (*serverp)
                line += sizeof(fatal) - 1;
        while (line < end && *line == ' ')
                line++;
        while (end > line && (end[-1] == ' ' || end[-1] == '\r'))
                end--;
        *lenp = (size_t)(end - line);
        return line;
}

static bool has_words(const char *s, size_t len, const char *words)
{
        size_t n = strlen(words), i;

        for (i = 0; n <= len && i <= len - n; i++)
                if (memcmp(s + i, words, n) == 0)
                        return true;
        return false;
}

static bool fatal_line(const char *s, size_t len, bool server)
{
        size_t i;

        for (i = 0; i < CQ_ARRAY_SIZE(fatal_words); i++)
                if ((server || !fatal_words[i].server) &&
                    has_words(s, len, fatal_words[i].words))
                        return true;
        return false;
}

cq_err_t cq_pgconn_classify(const char *message, char *why, size_t why_size)
{
        const char *line = message ? message : "", *first = NULL;
        size_t first_len = 0;

        while (*line) {
                size_t len = strcspn(line, "\n");
                const char *next = line[len] ? line + len + 1 : line + len;
                bool server;
                const char *text;

                /* libpq's hints are indented; a server's DETAIL and
                 * HINT lines follow its FATAL one */
                if (line[0] == '\t' || strncmp(line, "DETAIL:", 7) == 0 ||
                    strncmp(line, "HINT:", 5) == 0) {
                        line = next;
                        continue;
                }
                text = strip_line(line, &len, &server);
                if (len > 0 && fatal_line(text, len, server)) {
                        snprintf(why, why_size, "%.*s", (int)len, text);
                        return CQ_ERR_FATAL;
                }
                if (!first && len > 0) {
                        first = text;
                        first_len = len;
                }
                line = next;
        }
        if (first)
                snprintf(why, why_size, "%.*s", (int)first_len, first);
        else
                snprintf(why, why_size, "no reason given");
        return CQ_ERR_RETRIABLE;
}

/* Append to \p out (\p size bytes, *usedp of them taken), cutting at the
 * end. */
static void add(char *out, size_t size, size_t *usedp, const char *fmt, ...)
    CQ_PRINTF(4, 5);

static void add(char *out, size_t size, size_t *usedp, const char *fmt, ...)
{
        va_list ap;
        int n;

        if (*usedp + 1 >= size)
                return;
        va_start(ap, fmt);
        n = vsnprintf(out + *usedp, size - *usedp, fmt, ap);
        va_end(ap);
        if (n > 0)
                *usedp +=
                    (size_t)n < size - *usedp ? (size_t)n : size - *usedp - 1;
}

/* The keys shown, each with the variable libpq reads when the DSN leaves
 * it out. */
static const struct {
        const char *key;
        const char *env;
} shown[] = {
    {"host", "PGHOST"},       {"hostaddr", "PGHOSTADDR"},
    {"port", "PGPORT"},       {"dbname", "PGDATABASE"},
    {"user", "PGUSER"},       {"service", "PGSERVICE"},
    {"sslmode", "PGSSLMODE"},
};

/* The PG* variables that are set, of the keys \p given does not hold
 * ("PGHOST=db ..."; \p given NULL: of every key), and PGPASSWORD as
 * "(set)" with CQ_PGCONN_F_PASSWORD unless \p password_given. Returns
 * how many. */
static int add_env(char *out,
                   size_t size,
                   size_t *usedp,
                   const bool *given,
                   bool password_given,
                   unsigned flags)
{
        const char *value;
        size_t i;
        int n = 0;

        for (i = 0; i < CQ_ARRAY_SIZE(shown); i++) {
                value = getenv(shown[i].env);
                if ((given && given[i]) || !value || !*value)
                        continue;
                add(out, size, usedp, "%s%s=%s", n++ ? " " : "", shown[i].env,
                    value);
        }
        value = getenv("PGPASSWORD");
        if ((flags & CQ_PGCONN_F_PASSWORD) && value && *value &&
            !password_given)
                add(out, size, usedp, "%sPGPASSWORD=(set)", n++ ? " " : "");
        return n;
}

void cq_pgconn_describe(const char *dsn,
                        unsigned flags,
                        char *out,
                        size_t out_size)
{
        bool given[CQ_ARRAY_SIZE(shown)] = {false};
        PQconninfoOption *opts, *o;
        char *err = NULL, vars[512] = "";
        size_t used = 0, vused = 0, i;
        bool password = false;
        int n = 0;

        if (out_size == 0)
                return;
        out[0] = '\0';
        if (!dsn) {
                if (add_env(vars, sizeof(vars), &vused, NULL, false, flags) > 0)
                        add(out, out_size, &used,
                            "not set; libpq's PG* variables apply: %s", vars);
                else
                        add(out, out_size, &used,
                            "not set, nor is any PG* variable: libpq's "
                            "defaults apply");
                return;
        }
        opts = PQconninfoParse(dsn, &err);
        if (!opts) {
                PQfreemem(err); /* it may quote a piece of the DSN */
                add(out, out_size, &used, "not a valid connection string");
                return;
        }
        for (i = 0; i < CQ_ARRAY_SIZE(shown); i++) {
                for (o = opts; o->keyword; o++) {
                        if (strcmp(o->keyword, shown[i].key) != 0 || !o->val ||
                            !*o->val)
                                continue;
                        add(out, out_size, &used, "%s%s=%s", n++ ? " " : "",
                            o->keyword, o->val);
                        given[i] = true;
                }
        }
        for (o = opts; o->keyword; o++)
                if (strcmp(o->keyword, "password") == 0 && o->val && *o->val)
                        password = true;
        PQconninfoFree(opts);
        if (password && (flags & CQ_PGCONN_F_PASSWORD))
                add(out, out_size, &used, "%spassword=(set)", n++ ? " " : "");
        if (add_env(vars, sizeof(vars), &vused, given, password, flags) > 0)
                add(out, out_size, &used, "%slibpq's PG* variables: %s",
                    n ? "; " : "", vars);
        else if (n == 0)
                add(out, out_size, &used, "libpq's defaults");
}

cq_err_t cq_pgconn_error(const char *what,
                         const char *dsn,
                         const char *message,
                         char *errstr,
                         size_t errstr_size)
{
        char target[512], why[512];
        cq_err_t err;

        if (!message) {
                snprintf(why, sizeof(why), "out of memory");
                err = CQ_ERR_RETRIABLE;
        } else {
                err = cq_pgconn_classify(message, why, sizeof(why));
        }
        cq_pgconn_describe(dsn, 0, target, sizeof(target));
        cq_errstr_set(errstr, errstr_size, "%s (%s%s%s): %s", what,
                      CQ_PGCONN_SETTING, dsn ? ": " : " ", target, why);
        return err;
}
