/* SPDX-License-Identifier: MIT */
/* cli_util.c - what the user-facing commands share: option matching,
 * number parsing, reading input files, opening the store, writing output
 * files, run ids and the progress line of a wait, each failure reported
 * as one line on stderr with the exit code it maps to. */
#include "coderq/cli/cmd_cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coderq/common/buf.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"

int cq_cli_opt(
    int argc, char **argv, int *ip, const char *name, const char **valuep)
{
        const char *arg = argv[*ip];
        size_t n = strlen(name);

        if (strncmp(arg, name, n) != 0)
                return 0;
        if (arg[n] == '=') {
                *valuep = arg + n + 1;
                return 1;
        }
        if (arg[n] != '\0')
                return 0;
        if (*ip + 1 >= argc) {
                cq_cli_error("option %s needs a value", name);
                return -1;
        }
        (*ip)++;
        *valuep = argv[*ip];
        return 1;
}

int cq_cli_parse_long(
    const char *name, const char *text, long min, long max, long *valuep)
{
        char *end = NULL;
        long v;

        errno = 0;
        v = strtol(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
                cq_cli_error("invalid value \"%s\" for %s: expected an "
                             "integer from %ld to %ld",
                             text, name, min, max);
                return -1;
        }
        *valuep = v;
        return 0;
}

int cq_cli_parse_double(
    const char *name, const char *text, double min, double max, double *valuep)
{
        char *end = NULL;
        double v;

        errno = 0;
        v = strtod(text, &end);
        if (errno != 0 || end == text || *end != '\0' || !isfinite(v) ||
            v < min || v > max) {
                cq_cli_error("invalid value \"%s\" for %s: expected a number "
                             "from %g to %g",
                             text, name, min, max);
                return -1;
        }
        *valuep = v;
        return 0;
}

int cq_cli_random(void *buf, size_t n)
{
        unsigned char *b = buf;
        size_t got = 0;

        while (got < n) {
                ssize_t r = getrandom(b + got, n - got, 0);

                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return -1;
                }
                got += (size_t)r;
        }
        return 0;
}

int cq_cli_new_run_id(const char *prefix, char *out, size_t size)
{
        unsigned char b[3];
        time_t now = time(NULL);
        struct tm tm;
        char stamp[32];

        if (cq_cli_random(b, sizeof(b)) || !gmtime_r(&now, &tm) ||
            strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm) == 0) {
                cq_cli_error("could not make a run id: %s", strerror(errno));
                return -1;
        }
        snprintf(out, size, "%s-%s-%02x%02x%02x", prefix, stamp, b[0], b[1],
                 b[2]);
        return 0;
}

void cq_cli_quiet_clients(void)
{
        cq_log_level_t level = cq_log_get_level();

        if (level > CQ_LOG_DEBUG && level < CQ_LOG_ERROR)
                cq_log_set_level(CQ_LOG_ERROR);
}

void cq_cli_sleep_ms(long ms)
{
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
}

long cq_cli_follow_interval(long interval, size_t left, size_t finished)
{
        if (finished > 0 && left <= finished)
                return 100;
        if (interval < 250)
                return 250;
        return interval >= 500 ? 1000 : interval * 2;
}

void cq_cli_progress_init(cq_cli_progress_t *out)
{
        memset(out, 0, sizeof(*out));
        out->tty = isatty(STDERR_FILENO) == 1;
}

void cq_cli_progress_show(cq_cli_progress_t *out, const cq_progress_t *progress)
{
        char line[256];

        cq_fmt_progress(line, sizeof(line), progress, 24);
        if (out->tty) {
                fprintf(stderr, "\r%s\033[K", line);
                fflush(stderr);
                out->shown = true;
        } else if (strcmp(line, out->last) != 0 ||
                   cq_now_ms() - out->last_print >= 30000) {
                /* plain lines in a log: each change, and every 30 s */
                fprintf(stderr, "%s\n", line);
                out->last_print = cq_now_ms();
                snprintf(out->last, sizeof(out->last), "%s", line);
        }
}

void cq_cli_progress_end(cq_cli_progress_t *out)
{
        if (out->tty && out->shown)
                fputc('\n', stderr);
        out->shown = false;
}

int cq_cli_store_exit(cq_err_t err)
{
        return err == CQ_ERR_RETRIABLE ? CQ_EXIT_UNAVAILABLE : CQ_EXIT_FAILED;
}

int cq_cli_store_open(const cq_config_t *cfg, cq_store_t **storep)
{
        cq_store_opts_t opts;
        char errstr[512];

        cq_store_opts_from_config(&opts, cfg);
        *storep = cq_store_new(&opts, errstr, sizeof(errstr));
        if (!*storep) {
                cq_cli_error("%s", errstr);
                return CQ_EXIT_UNAVAILABLE;
        }
        return CQ_EXIT_OK;
}

int cq_cmd_read_file(const char *path, size_t max, char **textp, size_t *lenp)
{
        FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
        char chunk[65536];
        cq_buf_t buf;
        size_t n;
        int rc = -1;

        if (!fp) {
                cq_cli_error("could not open %s: %s", path, strerror(errno));
                return -1;
        }
        cq_buf_init(&buf, max);
        while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0) {
                if (cq_buf_append(&buf, chunk, n) != CQ_OK) {
                        cq_cli_error("could not read %s: larger than %zu "
                                     "bytes",
                                     path, max);
                        goto out;
                }
        }
        if (ferror(fp)) {
                cq_cli_error("could not read %s: %s", path, strerror(errno));
                goto out;
        }
        *textp = cq_buf_take(&buf, lenp);
        if (!*textp) {
                cq_cli_error("could not read %s: out of memory", path);
                goto out;
        }
        rc = 0;
out:
        if (fp != stdin)
                fclose(fp);
        cq_buf_release(&buf);
        return rc;
}

int cq_cli_write_file(const char *path, const void *data, size_t len)
{
        char tmp[PATH_MAX];
        const char *p = data;
        int fd = -1, rc = -1;

        if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >=
            sizeof(tmp)) {
                cq_cli_error("could not write \"%s\": path too long", path);
                return -1;
        }
        fd = mkstemp(tmp);
        if (fd < 0) {
                cq_cli_error("could not write \"%s\": %s", path,
                             strerror(errno));
                return -1;
        }
        while (len > 0) {
                ssize_t n = write(fd, p, len);

                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        cq_cli_error("could not write \"%s\": %s", path,
                                     strerror(errno));
                        goto out;
                }
                p += n;
                len -= (size_t)n;
        }
        if (fchmod(fd, 0644) != 0 || close(fd) != 0) {
                fd = -1;
                cq_cli_error("could not write \"%s\": %s", path,
                             strerror(errno));
                goto out;
        }
        fd = -1;
        if (rename(tmp, path) != 0) {
                cq_cli_error("could not write \"%s\": %s", path,
                             strerror(errno));
                goto out;
        }
        rc = 0;
out:
        if (fd >= 0)
                close(fd);
        if (rc)
                unlink(tmp);
        return rc;
}

int cq_cli_make_dir(const char *path)
{
        struct stat st;

        if (mkdir(path, 0755) == 0)
                return 0;
        if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
                return 0;
        cq_cli_error("could not create directory \"%s\": %s", path,
                     errno == EEXIST ? "a file of that name exists"
                                     : strerror(errno));
        return -1;
}
