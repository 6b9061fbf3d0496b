/* SPDX-License-Identifier: MIT */
/* bench_e2e.c - the worker daemon end to end through real Kafka and
 * PostgreSQL with the fake LLM: `coderq worker` processes are started with
 * their own topics on a database of their own; jobs are produced to the
 * jobs topic and their completion events read back from the results topic.
 * Each phase prints one JSON line; scripts/bench/e2e.sh sums them up.
 *
 *   bench_e2e CODERQ BASE_URL DSN BROKERS PHASE SLOTS JOBS POOL SCRIPT
 *             TURNS LATENCY_MS
 *
 * PHASE is a name for the topics. CQ_E2E_WORKERS (default 2, at most 8)
 * workers share SLOTS and POOL (each gets its share, rounded up) and one
 * outbox, so duplicate_events measures relays racing for rows.
 * CQ_E2E_SANDBOX (default on, as a worker runs by default) is their
 * CODERQ_SANDBOX. The kernel pools are filled
 * before the first job is produced (kernel starts are CPU-bound and would
 * otherwise be what is measured); SLOTS 0 measures an idle worker's RSS.
 * Efficiency = jobs/s over (first submit .. last completion event) divided
 * by the ideal SLOTS / (TURNS x LATENCY). Once every job has its event and
 * the outbox is all sent, the results topic is read to its end and
 * duplicate_events counts the completion events beyond one per job. */
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchstat.h"

/* Where a job's time goes, from the checkpoint rows (each message is
 * committed on its own, so its created_at is when the loop got it):
 * claim to first message (interpreter, memory lookup), an LLM call (the
 * gap before an assistant message), a cell (the gap before a tool
 * message), last message to the finish transaction. */
#define SQL_GAPS                                                               \
        "WITH m AS (SELECT role, created_at - lag(created_at) OVER "           \
        "(PARTITION BY job_id ORDER BY seq) AS gap FROM job_messages) "        \
        "SELECT 1000 * avg(extract(epoch FROM gap)) FROM m "
/* The relay's part: outbox row written (finish) to marked sent (its
 * delivery report arrived); the rest of "relay" is the reader's fetch. */
#define SQL_OUTBOX                                                             \
        "SELECT 1000 * avg(extract(epoch FROM sent_at - created_at)) FROM "    \
        "outbox"
#define SQL_LLM_TURN  SQL_GAPS "WHERE role = 'assistant'"
#define SQL_TOOL_TURN SQL_GAPS "WHERE role = 'tool'"
#define SQL_SETUP                                                              \
        "SELECT 1000 * avg(extract(epoch FROM (SELECT min(created_at) FROM "   \
        "job_messages m WHERE m.job_id = j.job_id) - j.started_at)) FROM "     \
        "jobs j"
#define SQL_FINISH                                                             \
        "SELECT 1000 * avg(extract(epoch FROM j.finished_at - (SELECT "        \
        "max(created_at) FROM job_messages m WHERE m.job_id = j.job_id))) "    \
        "FROM jobs j"

/* Transactions committed in the phase's database; a backend reports its
 * counts when it exits at the latest, so read once the workers stopped. */
#define SQL_COMMITS                                                            \
        "SELECT xact_commit FROM pg_stat_database WHERE datname = "            \
        "current_database()"

#define SQL_OTHER_BACKENDS                                                     \
        "SELECT count(*) FROM pg_stat_activity WHERE datname = "               \
        "current_database() AND pid <> pg_backend_pid()"

#define MAX_WORKERS 8

typedef struct bench {
        const char *coderq, *base_url, *dsn, *brokers, *phase, *script;
        long slots, jobs, pool, turns, latency_ms;
        char prefix[128];
        char log[512]; /* the first worker's; the others' end in -N.log */
        int nworkers;
        pid_t workers[MAX_WORKERS];
} bench_t;

/* Wall clock, not monotonic: submit and completion times are compared
 * with PostgreSQL's timestamps of the same host. */
static double now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(long ms)
{
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

        nanosleep(&ts, NULL);
}

static double pct(const double *sorted, size_t n, double p)
{
        size_t i = (size_t)(p * (double)(n - 1) + 0.5);

        return sorted[i < n ? i : n - 1];
}

/* VmRSS of \p pid in kB, or -1. */
static long rss_kb(pid_t pid)
{
        char path[64], line[256];
        long kb = -1;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
        fp = fopen(path, "r");
        if (!fp)
                return -1;
        while (fgets(line, sizeof(line), fp))
                if (strncmp(line, "VmRSS:", 6) == 0)
                        kb = strtol(line + 6, NULL, 10);
        fclose(fp);
        return kb;
}

/* One row of /proc/PID/stat. */
typedef struct prow {
        long pid, ppid;
        unsigned long long start, ticks, reaped; /* own, reaped children's */
} prow_t;

/* Every process's stat row into a malloc'd array (*np rows), or NULL. */
static prow_t *proc_table(size_t *np)
{
        DIR *dir = opendir("/proc");
        struct dirent *de;
        prow_t *rows = NULL, *tmp;
        size_t n = 0, cap = 0;

        *np = 0;
        if (!dir)
                return NULL;
        while ((de = readdir(dir)) != NULL) {
                char path[300], buf[1024], *p;
                unsigned long long ut, st, cut, cst, start;
                long ppid;
                FILE *fp;

                if (de->d_name[0] < '0' || de->d_name[0] > '9')
                        continue;
                snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
                fp = fopen(path, "r");
                if (!fp)
                        continue;
                if (!fgets(buf, sizeof(buf), fp)) {
                        fclose(fp);
                        continue;
                }
                fclose(fp);
                /* pid (comm) state ppid pgrp session tty tpgid flags minflt
                 * cminflt majflt cmajflt utime stime cutime cstime priority
                 * nice threads itrealvalue starttime; comm may hold spaces */
                p = strrchr(buf, ')');
                if (!p || sscanf(p + 1,
                                 " %*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u"
                                 " %llu %llu %llu %llu %*d %*d %*d %*d %llu",
                                 &ppid, &ut, &st, &cut, &cst, &start) != 6)
                        continue;
                if (n == cap) {
                        cap = cap ? cap * 2 : 512;
                        tmp = realloc(rows, cap * sizeof(*rows));
                        if (!tmp)
                                break;
                        rows = tmp;
                }
                rows[n].pid = strtol(de->d_name, NULL, 10);
                rows[n].ppid = ppid;
                rows[n].start = start;
                rows[n].ticks = ut + st;
                rows[n].reaped = cut + cst;
                n++;
        }
        closedir(dir);
        *np = n;
        return rows;
}

/* Kernels the pool of \p pid started: its grandchildren (a cold kernel's
 * inner bwrap; a forked kernel's outer process under the kernel server)
 * and its children without children (an unsandboxed cold kernel). */
static long kernels(pid_t pid)
{
        size_t n, i, j;
        prow_t *t = proc_table(&n);
        long k = 0;

        if (!t)
                return -1;
        for (i = 0; i < n; i++) {
                bool kids = false;

                if (t[i].ppid != (long)pid)
                        continue;
                for (j = 0; j < n; j++)
                        if (t[j].ppid == t[i].pid) {
                                kids = true;
                                k++;
                        }
                if (!kids)
                        k++;
        }
        free(t);
        return k;
}

/* CPU time of process trees from /proc (the approach of eval_run.py):
 * Linux adds a child's time to its parent's when the parent reaps it, so
 * a tree's time is its live processes' time plus what they reaped. Not
 * for a cold sandboxed kernel: its sandbox is torn down by SIGKILLing the
 * init of its pid namespace, and the time of what that init reaps is
 * dropped. So processes in a child pid namespace whose parent is in one
 * too (a cold kernel under bubblewrap's pid 1) are followed one by one and
 * count with their own time at the last look (every 0.2 s): what such a
 * kernel spends in its last interval before the kill is not counted, and
 * one that exits by itself and is reaped counts twice. A forked kernel
 * and its pid 1 have parents outside (the kernel server, kinit's outer
 * process), which reap them: they count once, exactly, in the parent's
 * reaped time (following them too counted most of their time twice:
 * 90.7 ms of kernel CPU per job in phase s where the kernel servers'
 * own and reaped time over a longer window was 68). */
enum { G_WORKER, G_KERNELS, G_POSTGRES, G_BROKER, G_LLM, NGROUPS };
static const char *const GROUP_NAME[NGROUPS] = {"worker", "kernels", "postgres",
                                                "broker", "llm"};
#define MAX_ROOTS 16
#define MAX_NS    32768

typedef struct nsproc {
        long pid;
        unsigned long long start, first, last;
        int group;
        bool ns;
} nsproc_t;

typedef struct cpumeter {
        long roots[NGROUPS][MAX_ROOTS];
        int nroots[NGROUPS];
        nsproc_t *seen; /* every non-root process once looked at */
        size_t nseen;
        unsigned long long base[NGROUPS], sum[NGROUPS]; /* tree ticks */
        bool started;
} cpumeter_t;

static bool in_child_pid_ns(long pid)
{
        char path[64], line[256];
        bool ns = false;
        FILE *fp;

        snprintf(path, sizeof(path), "/proc/%ld/status", pid);
        fp = fopen(path, "r");
        if (!fp)
                return false;
        while (fgets(line, sizeof(line), fp))
                if (strncmp(line, "NSpid:", 6) == 0) {
                        char *p = line + 6;
                        int fields = 0;

                        while (*p) {
                                while (*p == ' ' || *p == '\t')
                                        p++;
                                if (*p && *p != '\n')
                                        fields++;
                                while (*p && *p != ' ' && *p != '\t')
                                        p++;
                        }
                        ns = fields > 1;
                }
        fclose(fp);
        return ns;
}

static nsproc_t *
cpu_seen(cpumeter_t *m, const prow_t *r, const prow_t *parent, int group)
{
        size_t i;

        for (i = m->nseen; i-- > 0;)
                if (m->seen[i].pid == r->pid && m->seen[i].start == r->start)
                        return &m->seen[i];
        if (m->nseen == MAX_NS)
                return NULL;
        m->seen[m->nseen].pid = r->pid;
        m->seen[m->nseen].start = r->start;
        /* followed one by one only when its reaper is in a child pid
         * namespace too: a parent outside (the kernel server, kinit's
         * outer process, bubblewrap's outer process) reaps it whatever
         * kills it, and its time then counts in that parent's */
        m->seen[m->nseen].ns =
            in_child_pid_ns(r->pid) && in_child_pid_ns(parent->pid);
        m->seen[m->nseen].group = group;
        /* a process born after the first look counts from zero */
        m->seen[m->nseen].first = m->started ? 0 : r->ticks;
        m->seen[m->nseen].last = r->ticks;
        return &m->seen[m->nseen++];
}

/* Sum the trees of each group into m->sum, following namespaced ones. */
static void cpu_look(cpumeter_t *m)
{
        size_t n, i, top;
        prow_t *t = proc_table(&n);
        size_t *stack;
        bool *done;
        int g, r;

        if (!t)
                return;
        stack = malloc((n + 1) * sizeof(*stack));
        done = calloc(n + 1, sizeof(*done));
        if (!stack || !done)
                goto out;
        for (g = 0; g < NGROUPS; g++)
                m->sum[g] = 0;
        for (g = 0; g < NGROUPS; g++)
                for (r = 0; r < m->nroots[g]; r++) {
                        for (i = 0; i < n && t[i].pid != m->roots[g][r]; i++)
                                ;
                        if (i == n || done[i])
                                continue;
                        done[i] = true;
                        /* a worker's own time is the worker's; all it
                         * reaped and all below it is its kernels' */
                        if (g == G_WORKER) {
                                m->sum[G_WORKER] += t[i].ticks;
                                m->sum[G_KERNELS] += t[i].reaped;
                        } else {
                                m->sum[g] += t[i].ticks + t[i].reaped;
                        }
                        top = 0;
                        stack[top++] = i;
                        while (top > 0) {
                                size_t p = stack[--top], c;

                                for (c = 0; c < n; c++) {
                                        nsproc_t *s;
                                        int gg = g == G_WORKER ? G_KERNELS : g;

                                        if (done[c] || t[c].ppid != t[p].pid)
                                                continue;
                                        done[c] = true;
                                        stack[top++] = c;
                                        s = cpu_seen(m, &t[c], &t[p], gg);
                                        if (s && s->ns)
                                                s->last = t[c].ticks;
                                        else
                                                m->sum[gg] +=
                                                    t[c].ticks + t[c].reaped;
                                }
                        }
                }
        if (!m->started) {
                memcpy(m->base, m->sum, sizeof(m->base));
                m->started = true;
        }
out:
        free(stack);
        free(done);
        free(t);
}

/* Milliseconds of CPU of group \p g since the first look. */
static double cpu_ms(const cpumeter_t *m, int g)
{
        long long ticks = (long long)m->sum[g] - (long long)m->base[g];
        size_t i;

        for (i = 0; i < m->nseen; i++)
                if (m->seen[i].ns && m->seen[i].group == g)
                        ticks +=
                            (long long)(m->seen[i].last - m->seen[i].first);
        return (double)ticks * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static int pg_exec(const char *dsn, const char *sql)
{
        PGconn *conn = PQconnectdb(dsn);
        PGresult *res = NULL;
        int rc = -1;

        if (PQstatus(conn) != CONNECTION_OK) {
                fprintf(stderr, "bench_e2e: %s", PQerrorMessage(conn));
                goto out;
        }
        res = PQexec(conn, sql);
        if (PQresultStatus(res) != PGRES_COMMAND_OK &&
            PQresultStatus(res) != PGRES_TUPLES_OK) {
                fprintf(stderr, "bench_e2e: %s: %s", sql, PQerrorMessage(conn));
                goto out;
        }
        rc = 0;
out:
        PQclear(res);
        PQfinish(conn);
        return rc;
}

/* The first value of \p sql as a double, or -1. */
static double pg_value(const char *dsn, const char *sql)
{
        PGconn *conn = PQconnectdb(dsn);
        PGresult *res = NULL;
        double v = -1;

        if (PQstatus(conn) != CONNECTION_OK)
                goto out;
        res = PQexec(conn, sql);
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
            !PQgetisnull(res, 0, 0))
                v = strtod(PQgetvalue(res, 0, 0), NULL);
out:
        PQclear(res);
        PQfinish(conn);
        return v;
}

/* Mean time per stage of the jobs: submit -> row created (intake), ->
 * claimed (queue), -> finished (run), -> completion event read (relay). */
static int
stages(const bench_t *b, const double *sub, const double *done, double out[4])
{
        PGconn *conn = PQconnectdb(b->dsn);
        PGresult *res = NULL;
        int i, n, rc = -1;

        memset(out, 0, 4 * sizeof(double));
        if (PQstatus(conn) != CONNECTION_OK)
                goto out;
        res = PQexec(conn, "SELECT job_id, 1000 * extract(epoch FROM "
                           "created_at), 1000 * extract(epoch FROM "
                           "started_at), 1000 * extract(epoch FROM "
                           "finished_at) FROM jobs");
        if (PQresultStatus(res) != PGRES_TUPLES_OK)
                goto out;
        n = PQntuples(res);
        for (i = 0; i < n; i++) {
                const char *id = PQgetvalue(res, i, 0);
                const char *dash = strrchr(id, '-');
                long k = dash ? strtol(dash + 1, NULL, 10) : -1;
                double c = strtod(PQgetvalue(res, i, 1), NULL);
                double st = strtod(PQgetvalue(res, i, 2), NULL);
                double f = strtod(PQgetvalue(res, i, 3), NULL);

                if (k < 0 || k >= b->jobs)
                        goto out;
                out[0] += c - sub[k];
                out[1] += st - c;
                out[2] += f - st;
                out[3] += done[k] - f;
        }
        for (i = 0; i < 4 && n > 0; i++)
                out[i] /= n;
        rc = n == b->jobs ? 0 : -1;
out:
        PQclear(res);
        PQfinish(conn);
        return rc;
}

static rd_kafka_conf_t *conf_new(const char *brokers)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char errstr[256];

        if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr,
                              sizeof(errstr)) != RD_KAFKA_CONF_OK)
                fprintf(stderr, "bench_e2e: %s\n", errstr);
        return conf;
}

static int create_topic(const char *brokers, const char *topic, int parts)
{
        char errstr[256];
        rd_kafka_t *rk;
        rd_kafka_NewTopic_t *nt;
        rd_kafka_queue_t *q;
        rd_kafka_event_t *ev;
        const rd_kafka_CreateTopics_result_t *res;
        const rd_kafka_topic_result_t **tres;
        size_t n;
        int rc = -1;

        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf_new(brokers), errstr,
                          sizeof(errstr));
        if (!rk) {
                fprintf(stderr, "bench_e2e: %s\n", errstr);
                return -1;
        }
        /* the brokers' default replication: 1 on the single broker, 3 on
         * the cluster (scripts/bench/capacity.sh) */
        nt = rd_kafka_NewTopic_new(topic, parts, -1, errstr, sizeof(errstr));
        q = rd_kafka_queue_new(rk);
        rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
        ev = rd_kafka_queue_poll(q, 30000);
        res = ev ? rd_kafka_event_CreateTopics_result(ev) : NULL;
        tres = res ? rd_kafka_CreateTopics_result_topics(res, &n) : NULL;
        if (tres && n == 1 &&
            (rd_kafka_topic_result_error(tres[0]) == 0 ||
             rd_kafka_topic_result_error(tres[0]) ==
                 RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS))
                rc = 0;
        else
                fprintf(stderr, "bench_e2e: could not create topic %s\n",
                        topic);
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_queue_destroy(q);
        rd_kafka_NewTopic_destroy(nt);
        rd_kafka_destroy(rk);
        return rc;
}

/* A worker's share of \p total among \p n, rounded up. */
static long share(long total, int n)
{
        return n > 1 ? (total + n - 1) / n : total;
}

static void child_env(const bench_t *b, int w)
{
        char v[512];

        setenv("CODERQ_PG_DSN", b->dsn, 1);
        setenv("CODERQ_KAFKA_BROKERS", b->brokers, 1);
        snprintf(v, sizeof(v), "%s.jobs", b->prefix);
        setenv("CODERQ_TOPIC_JOBS", v, 1);
        snprintf(v, sizeof(v), "%s.dlq", b->prefix);
        setenv("CODERQ_TOPIC_DLQ", v, 1);
        snprintf(v, sizeof(v), "%s.results", b->prefix);
        setenv("CODERQ_TOPIC_RESULTS", v, 1);
        snprintf(v, sizeof(v), "%s.events", b->prefix);
        setenv("CODERQ_TOPIC_EVENTS", v, 1);
        setenv("CODERQ_KAFKA_GROUP", b->prefix, 1);
        setenv("CODERQ_LLM_BASE_URL", b->base_url, 1);
        snprintf(v, sizeof(v), "script:%s", b->script);
        setenv("CODERQ_LLM_MODEL", v, 1);
        unsetenv("CODERQ_LLM_API_KEY");
        unsetenv("OPENAI_API_KEY");
        snprintf(v, sizeof(v), "%ld", share(b->slots, b->nworkers));
        setenv("CODERQ_SLOTS", v, 1);
        snprintf(v, sizeof(v), "%ld", share(b->pool, b->nworkers));
        setenv("CODERQ_KPOOL_SIZE", v, 1);
        setenv("CODERQ_KERNEL_STARTUP_TIMEOUT_S", "300", 1);
        setenv("CODERQ_LEASE_S", "60", 1);
        setenv("CODERQ_POLL_MS", "100", 1);
        setenv("CODERQ_SHUTDOWN_S", "20", 1);
        v[0] = '\0';
        if (getenv("CQ_E2E_SANDBOX"))
                snprintf(v, sizeof(v), "%s", getenv("CQ_E2E_SANDBOX"));
        setenv("CODERQ_SANDBOX", v[0] ? v : "on", 1);
        setenv("CODERQ_LOG_LEVEL", "info", 1);
        if (w == 0)
                snprintf(v, sizeof(v), "bench-%s", b->phase);
        else
                snprintf(v, sizeof(v), "bench-%s-%d", b->phase, w);
        setenv("CODERQ_WORKER_ID", v, 1);
}

static int start_worker(bench_t *b, int w)
{
        pid_t pid = fork();

        if (pid < 0)
                return -1;
        if (pid == 0) {
                char log[600];
                int fd;

                if (w == 0)
                        snprintf(log, sizeof(log), "%s", b->log);
                else
                        snprintf(log, sizeof(log), "%.*s-%d.log",
                                 (int)strlen(b->log) - 4, b->log, w);
                fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (fd >= 0) {
                        dup2(fd, 1);
                        dup2(fd, 2);
                        close(fd);
                }
                child_env(b, w);
                execl(b->coderq, "coderq", "worker", (char *)NULL);
                _exit(127);
        }
        b->workers[w] = pid;
        return 0;
}

static void stop_workers(bench_t *b)
{
        int st, waited, w, left;

        for (w = 0; w < b->nworkers; w++)
                if (b->workers[w] > 0)
                        kill(b->workers[w], SIGTERM);
        for (waited = 0; waited < 40000; waited += 50) {
                for (w = 0, left = 0; w < b->nworkers; w++) {
                        if (b->workers[w] <= 0)
                                continue;
                        if (waitpid(b->workers[w], &st, WNOHANG) ==
                            b->workers[w])
                                b->workers[w] = 0;
                        else
                                left++;
                }
                if (left == 0)
                        return;
                sleep_ms(50);
        }
        for (w = 0; w < b->nworkers; w++) {
                if (b->workers[w] <= 0)
                        continue;
                kill(b->workers[w], SIGKILL);
                waitpid(b->workers[w], &st, 0);
                b->workers[w] = 0;
        }
}

/* Sum over the workers of rss_kb() or kernels(); -1 when one is gone. */
static long workers_sum(const bench_t *b, long (*f)(pid_t))
{
        long sum = 0, v;
        int w;

        for (w = 0; w < b->nworkers; w++) {
                v = f(b->workers[w]);
                if (v < 0)
                        return -1;
                sum += v;
        }
        return sum;
}

/* Index of a worker that exited, or -1. */
static int worker_exited(bench_t *b)
{
        int w;

        for (w = 0; w < b->nworkers; w++)
                if (waitpid(b->workers[w], NULL, WNOHANG) != 0) {
                        b->workers[w] = 0;
                        return w;
                }
        return -1;
}

static rd_kafka_t *results_consumer(const bench_t *b)
{
        rd_kafka_conf_t *conf = conf_new(b->brokers);
        rd_kafka_topic_partition_list_t *parts;
        char errstr[256], topic[256], group[200];
        rd_kafka_t *rk;

        snprintf(group, sizeof(group), "%s-reader", b->prefix);
        rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr));
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr,
                          sizeof(errstr));
        /* A fetch returns as soon as an event is there (fetch.min.bytes
         * 1): a short fetch.wait.max.ms gains no latency, only idle
         * fetches that would count as the broker's CPU per job. */
        rd_kafka_conf_set(conf, "fetch.wait.max.ms", "500", errstr,
                          sizeof(errstr));
        rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
        if (!rk) {
                fprintf(stderr, "bench_e2e: %s\n", errstr);
                return NULL;
        }
        snprintf(topic, sizeof(topic), "%s.results", b->prefix);
        parts = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(parts, topic, 0)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_assign(rk, parts);
        rd_kafka_topic_partition_list_destroy(parts);
        return rk;
}

/* Job index from a completion event's key "<prefix>-NNNNN", or -1. */
static long job_index(const bench_t *b, const rd_kafka_message_t *m)
{
        size_t plen = strlen(b->prefix);
        char key[64];

        if (!m->key || m->key_len <= plen + 1 || m->key_len - plen > 60 ||
            memcmp(m->key, b->prefix, plen) != 0)
                return -1;
        memcpy(key, (const char *)m->key + plen + 1, m->key_len - plen - 1);
        key[m->key_len - plen - 1] = '\0';
        return strtol(key, NULL, 10);
}

/* Completion events beyond one per job: wait (bounded) until the outbox
 * is all sent, then read the results topic to its high watermark.
 * \p seen: events read per job so far, \p nread: events read so far (from
 * the topic's start). Returns -1 when it could not tell. */
static long
duplicates(const bench_t *b, rd_kafka_t *cons, long *seen, long nread)
{
        char topic[256];
        int64_t lo = 0, hi = 0, pos = nread;
        double t0 = now_ms();
        long dup = 0, i;

        while (pg_value(b->dsn, "SELECT count(*) FROM outbox WHERE sent_at "
                                "IS NULL") != 0) {
                if (now_ms() - t0 > 60000)
                        return -1;
                sleep_ms(100);
        }
        snprintf(topic, sizeof(topic), "%s.results", b->prefix);
        if (rd_kafka_query_watermark_offsets(cons, topic, 0, &lo, &hi, 10000) !=
            RD_KAFKA_RESP_ERR_NO_ERROR)
                return -1;
        while (lo + pos < hi && now_ms() - t0 < 120000) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(cons, 100);

                if (!m)
                        continue;
                if (!m->err) {
                        long k = job_index(b, m);

                        pos++;
                        if (k >= 0 && k < b->jobs)
                                seen[k]++;
                }
                rd_kafka_message_destroy(m);
        }
        if (lo + pos < hi)
                return -1;
        for (i = 0; i < b->jobs; i++)
                dup += seen[i] > 1 ? seen[i] - 1 : 0;
        return dup;
}

static void produce_job(const bench_t *b, rd_kafka_t *rk, long i)
{
        char id[192], value[1024], topic[256];
        int len;

        snprintf(id, sizeof(id), "%s-%05ld", b->prefix, i);
        len = snprintf(value, sizeof(value),
                       "{\"job_id\":\"%s\",\"run_id\":\"%s\",\"model\":"
                       "\"script:%s\",\"prompt\":\"Job %s: compute.\"}",
                       id, b->prefix, b->script, id);
        snprintf(topic, sizeof(topic), "%s.jobs", b->prefix);
        while (rd_kafka_producev(
                   rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(id, strlen(id)),
                   RD_KAFKA_V_VALUE(value, (size_t)len),
                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                   RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(rk, 10);
}

/* Roots of group \p g from the space-separated pids in $\p var. */
static void cpu_roots(cpumeter_t *m, int g, const char *var)
{
        const char *p = getenv(var);
        char *end;

        while (p && *p && m->nroots[g] < MAX_ROOTS) {
                long pid = strtol(p, &end, 10);

                if (end == p)
                        break;
                if (pid > 0)
                        m->roots[g][m->nroots[g]++] = pid;
                p = end;
        }
}

int main(int argc, char **argv)
{
        cpumeter_t cpu;
        double t_look = 0;
        bench_t b;
        char topic[256], errstr[256], sql[512];
        rd_kafka_t *prod = NULL, *cons = NULL;
        double *sub = NULL, *done = NULL, *lat = NULL;
        long *seen = NULL, nread = 0, dup = -1;
        const char *nw = getenv("CQ_E2E_WORKERS");
        int w, g;
        double outside, commits0 = -1, commits = -1;
        double st[4], t0, t_first = 0, t_last = 0, warm_s, wall_s, jps, ideal;
        long i, ndone = 0, rss_warm, rss_peak = 0, kids;
        int rc = 1;

        if (argc != 12) {
                fprintf(stderr,
                        "usage: %s CODERQ BASE_URL DSN BROKERS PHASE SLOTS "
                        "JOBS POOL SCRIPT TURNS LATENCY_MS\n",
                        argv[0]);
                return 2;
        }
        memset(&b, 0, sizeof(b));
        memset(&cpu, 0, sizeof(cpu));
        b.coderq = argv[1];
        b.base_url = argv[2];
        b.dsn = argv[3];
        b.brokers = argv[4];
        b.phase = argv[5];
        b.slots = strtol(argv[6], NULL, 10);
        b.jobs = strtol(argv[7], NULL, 10);
        b.pool = strtol(argv[8], NULL, 10);
        b.script = argv[9];
        b.turns = strtol(argv[10], NULL, 10);
        b.latency_ms = strtol(argv[11], NULL, 10);
        b.nworkers = nw && *nw ? (int)strtol(nw, NULL, 10) : 2;
        if (b.slots < 0 || b.jobs < 0 || b.jobs > 99999 || b.pool < 0 ||
            b.nworkers < 1 || b.nworkers > MAX_WORKERS)
                return 2;
        snprintf(b.prefix, sizeof(b.prefix), "cqbench-%s-%ld-%ld", b.phase,
                 (long)getpid(), (long)time(NULL));
        snprintf(b.log, sizeof(b.log), "%s/%s.log",
                 getenv("CQ_BENCH_LOGDIR") ? getenv("CQ_BENCH_LOGDIR") : "/tmp",
                 b.prefix);
        sub = calloc((size_t)b.jobs + 1, sizeof(double));
        done = calloc((size_t)b.jobs + 1, sizeof(double));
        lat = calloc((size_t)b.jobs + 1, sizeof(double));
        seen = calloc((size_t)b.jobs + 1, sizeof(long));
        cpu.seen = calloc(MAX_NS, sizeof(*cpu.seen));
        if (!sub || !done || !lat || !seen || !cpu.seen)
                goto out;
        if (pg_exec(b.dsn, "SET client_min_messages = warning; "
                           "TRUNCATE jobs, solutions CASCADE"))
                goto out;
        snprintf(topic, sizeof(topic), "%s.jobs", b.prefix);
        if (create_topic(b.brokers, topic, 3))
                goto out;
        snprintf(topic, sizeof(topic), "%s.results", b.prefix);
        if (create_topic(b.brokers, topic, 1))
                goto out;
        snprintf(topic, sizeof(topic), "%s.dlq", b.prefix);
        if (create_topic(b.brokers, topic, 1))
                goto out;
        snprintf(topic, sizeof(topic), "%s.events", b.prefix);
        if (create_topic(b.brokers, topic, 1))
                goto out;

        commits0 = pg_value(b.dsn, SQL_COMMITS);
        t0 = now_ms();
        for (w = 0; w < b.nworkers; w++)
                if (start_worker(&b, w))
                        goto out;
        /* Fill the pool: the refill threads (CODERQ_KPOOL_STARTS) start
         * two kernels at a time, so when all are forked the last two may
         * still be starting; the pause below covers them. */
        kids = 0;
        while (b.slots > 0 && (kids = workers_sum(&b, kernels)) <
                                  share(b.pool, b.nworkers) * b.nworkers) {
                if ((w = worker_exited(&b)) >= 0) {
                        fprintf(stderr, "bench_e2e: worker %d exited; see %s\n",
                                w, b.log);
                        goto out;
                }
                if (now_ms() - t0 > 900000) {
                        fprintf(stderr,
                                "bench_e2e: pool not full after 900 s "
                                "(%ld kernels)\n",
                                kids);
                        goto out;
                }
                sleep_ms(200);
        }
        warm_s = (now_ms() - t0) / 1e3;
        sleep_ms(b.slots > 0 ? 8000 : 3000);
        rss_warm = workers_sum(&b, rss_kb);
        if (b.jobs == 0) {
                printf("{\"phase\":\"%s\",\"slots\":%ld,\"rss_kb\":%ld}\n",
                       b.phase, b.slots, rss_warm);
                rc = 0;
                goto out;
        }
        fprintf(stderr,
                "bench_e2e: %s: %ld kernels started in %.1f s (%.2f/s); "
                "worker RSS %ld kB before jobs\n",
                b.phase, b.pool, warm_s, (double)b.pool / warm_s, rss_warm);

        cons = results_consumer(&b);
        {
                rd_kafka_conf_t *conf = conf_new(b.brokers);

                rd_kafka_conf_set(conf, "linger.ms", "1", errstr,
                                  sizeof(errstr));
                prod = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr,
                                    sizeof(errstr));
        }
        if (!cons || !prod) {
                fprintf(stderr, "bench_e2e: %s\n", errstr);
                goto out;
        }
        /* connect both before the clock starts: upstream producers are
         * long-lived, so the first produce's connection and topic
         * metadata are not part of a job's latency */
        rd_kafka_consumer_poll(cons, 500);
        {
                rd_kafka_topic_t *rkt;
                const struct rd_kafka_metadata *md = NULL;

                snprintf(topic, sizeof(topic), "%s.jobs", b.prefix);
                rkt = rd_kafka_topic_new(prod, topic, NULL);
                if (rkt && rd_kafka_metadata(prod, 0, rkt, &md, 10000) ==
                               RD_KAFKA_RESP_ERR_NO_ERROR)
                        rd_kafka_metadata_destroy(md);
                if (rkt)
                        rd_kafka_topic_destroy(rkt);
        }
        for (w = 0; w < b.nworkers; w++)
                cpu.roots[G_WORKER][cpu.nroots[G_WORKER]++] = b.workers[w];
        cpu_roots(&cpu, G_POSTGRES, "CQ_E2E_PIDS_POSTGRES");
        cpu_roots(&cpu, G_BROKER, "CQ_E2E_PIDS_BROKER");
        cpu_roots(&cpu, G_LLM, "CQ_E2E_PIDS_LLM");
        cpu_look(&cpu);
        t_look = t_first = now_ms();
        for (i = 0; i < b.jobs; i++) {
                sub[i] = now_ms();
                produce_job(&b, prod, i);
        }
        rd_kafka_flush(prod, 30000);
        while (ndone < b.jobs && now_ms() - t_first < 900000) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(cons, 20);
                long r = workers_sum(&b, rss_kb);

                if (r > rss_peak)
                        rss_peak = r;
                if (now_ms() - t_look >= 200) {
                        cpu_look(&cpu);
                        t_look = now_ms();
                }
                if (!m)
                        continue;
                if (!m->err) {
                        long k = job_index(&b, m);

                        nread++;
                        if (k >= 0 && k < b.jobs)
                                seen[k]++;
                        if (k >= 0 && k < b.jobs && done[k] == 0) {
                                done[k] = now_ms();
                                t_last = done[k];
                                ndone++;
                        }
                }
                rd_kafka_message_destroy(m);
        }
        cpu_look(&cpu);
        if (ndone < b.jobs) {
                fprintf(stderr,
                        "bench_e2e: only %ld of %ld completion events; see "
                        "%s\n",
                        ndone, b.jobs, b.log);
                goto out;
        }
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND "
                 "run_id = '%s'",
                 b.prefix);
        if (pg_value(b.dsn, sql) != (double)b.jobs) {
                fprintf(stderr, "bench_e2e: not every job succeeded; see %s\n",
                        b.log);
                goto out;
        }
        if (stages(&b, sub, done, st) != 0) {
                fprintf(stderr, "bench_e2e: could not read the job rows\n");
                goto out;
        }
        dup = duplicates(&b, cons, seen, nread);
        fprintf(stderr,
                "bench_e2e: %s: %d worker(s), %ld jobs: %ld duplicate "
                "completion event(s)\n",
                b.phase, b.nworkers, b.jobs, dup);
        stop_workers(&b);
        /* the workers' backends report their counts as they exit */
        for (t0 = now_ms();
             now_ms() - t0 < 10000 && pg_value(b.dsn, SQL_OTHER_BACKENDS) > 0;)
                sleep_ms(50);
        commits = pg_value(b.dsn, SQL_COMMITS) - commits0;
        for (i = 0; i < b.jobs; i++)
                lat[i] = done[i] - sub[i];
        qsort(lat, (size_t)b.jobs, sizeof(double), cq_bench_cmp_double);
        wall_s = (t_last - t_first) / 1e3;
        jps = (double)b.jobs / wall_s;
        ideal = b.latency_ms > 0
                    ? (double)b.slots / ((double)b.turns * b.latency_ms / 1e3)
                    : 0;
        printf("{\"phase\":\"%s\",\"slots\":%ld,\"jobs\":%ld,\"pool\":%ld,"
               "\"turns\":%ld,\"latency_ms\":%ld,\"wall_s\":%.3f,"
               "\"jobs_per_s\":%.3f,\"ideal_jobs_per_s\":%.3f,"
               "\"efficiency\":%.3f,\"p50_ms\":%.1f,\"p95_ms\":%.1f,"
               "\"max_ms\":%.1f,\"rss_before_kb\":%ld,\"rss_peak_kb\":%ld,"
               "\"kernel_starts_per_s\":%.3f,"
               "\"intake_ms_mean\":%.1f,\"queue_ms_mean\":%.1f,"
               "\"run_ms_mean\":%.1f,\"relay_ms_mean\":%.1f,"
               "\"setup_ms_mean\":%.1f,\"llm_turn_ms_mean\":%.1f,"
               "\"tool_turn_ms_mean\":%.1f,\"finish_ms_mean\":%.1f,"
               "\"outbox_ms_mean\":%.1f,\"workers\":%d,"
               "\"duplicate_events\":%ld,\"cpu_ms_per_job\":{",
               b.phase, b.slots, b.jobs, b.pool, b.turns, b.latency_ms, wall_s,
               jps, ideal, ideal > 0 ? jps / ideal : 0, pct(lat, b.jobs, 0.5),
               pct(lat, b.jobs, 0.95), lat[b.jobs - 1], rss_warm, rss_peak,
               (double)b.pool / warm_s, st[0], st[1], st[2], st[3],
               pg_value(b.dsn, SQL_SETUP), pg_value(b.dsn, SQL_LLM_TURN),
               pg_value(b.dsn, SQL_TOOL_TURN), pg_value(b.dsn, SQL_FINISH),
               pg_value(b.dsn, SQL_OUTBOX), b.nworkers, dup);
        for (g = 0; g < NGROUPS; g++)
                printf("%s\"%s\":%.2f", g ? "," : "", GROUP_NAME[g],
                       cpu_ms(&cpu, g) / (double)b.jobs);
        for (g = 0, outside = 0; g < NGROUPS; g++)
                if (g != G_KERNELS)
                        outside += cpu_ms(&cpu, g);
        printf("},\"cpu_ms_per_job_outside_kernels\":%.2f,"
               "\"commits_per_job\":%.2f}\n",
               outside / (double)b.jobs,
               commits0 >= 0 && commits >= 0 ? commits / (double)b.jobs : -1);
        rc = 0;
out:
        stop_workers(&b);
        if (prod)
                rd_kafka_destroy(prod);
        if (cons) {
                rd_kafka_consumer_close(cons);
                rd_kafka_destroy(cons);
        }
        free(sub);
        free(done);
        free(lat);
        free(seen);
        free(cpu.seen);
        return rc;
}
