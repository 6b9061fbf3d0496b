/* SPDX-License-Identifier: MIT */
/* itworker.c - coderq worker processes for the integration suites. */
#include "support/itworker.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "check_support.h"
#include "support/fake_llm.h"
#include "support/kafka_test.h"
#include "support/pgtest.h"
#include "support/proc.h"

void cq_itw_env_set(cq_itw_env_t *env, const char *name, const char *value)
{
        size_t len = strlen(name), i;
        char *kv;

        if (value) {
                ck_assert_int_ge(asprintf(&kv, "%s=%s", name, value), 0);
        } else {
                kv = strdup(name);
                ck_assert_ptr_nonnull(kv);
        }
        for (i = 0; i < env->n; i++) {
                if (strncmp(env->own[i], name, len) == 0 &&
                    (env->own[i][len] == '=' || env->own[i][len] == '\0')) {
                        free(env->own[i]);
                        env->own[i] = kv;
                        env->v[i] = kv;
                        return;
                }
        }
        ck_assert_uint_lt(env->n, CQ_ITW_ENV_MAX);
        env->own[env->n] = kv;
        env->v[env->n++] = kv;
        env->v[env->n] = NULL;
}

void cq_itw_env_init(cq_itw_env_t *env,
                     const char *dsn,
                     const char *brokers,
                     const char *prefix,
                     const char *llm_url)
{
        static const char *const topics[][2] = {
            {"CODERQ_TOPIC_JOBS", "jobs"},
            {"CODERQ_TOPIC_DLQ", "dlq"},
            {"CODERQ_TOPIC_RESULTS", "results"},
            {"CODERQ_TOPIC_EVENTS", "events"},
        };
        static const char *const fixed[][2] = {
            {"CODERQ_LLM_API_KEY", NULL},
            {"OPENAI_API_KEY", NULL},
            {"E2B_API_KEY", NULL},
            {"CODERQ_LLM_MAX_WAIT_S", "5"},
            {"CODERQ_SLOTS", "2"},
            {"CODERQ_KPOOL_SIZE", "2"},
            {"CODERQ_LEASE_S", "30"},
            {"CODERQ_POLL_MS", "100"},
            {"CODERQ_RELAY_INTERVAL_MS", "200"},
            {"CODERQ_DRAIN_S", "20"},
            {"CODERQ_SANDBOX", "off"},
            /* importing numpy, pandas, matplotlib and scipy took a
             * loaded CI machine 16 s per worker */
            {"CODERQ_KERNEL_PRELOAD", "json"},
            {"CODERQ_LOG_LEVEL", "info"},
        };
        char topic[256];
        size_t i;

        memset(env, 0, sizeof(*env));
        cq_itw_env_set(env, "CODERQ_PG_DSN", dsn);
        cq_itw_env_set(env, "CODERQ_KAFKA_BROKERS", brokers);
        cq_itw_env_set(env, "CODERQ_KAFKA_GROUP", prefix);
        cq_itw_env_set(env, "CODERQ_LLM_BASE_URL", llm_url);
        for (i = 0; i < sizeof(topics) / sizeof(topics[0]); i++) {
                snprintf(topic, sizeof(topic), "%s.%s", prefix, topics[i][1]);
                cq_itw_env_set(env, topics[i][0], topic);
        }
        for (i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
                cq_itw_env_set(env, fixed[i][0], fixed[i][1]);
}

void cq_itw_env_release(cq_itw_env_t *env)
{
        size_t i;

        for (i = 0; i < env->n; i++)
                free(env->own[i]);
        memset(env, 0, sizeof(*env));
}

void cq_itw_start(cq_itw_t *w,
                  const cq_itw_env_t *env,
                  const char *logdir,
                  const char *name)
{
        const char *argv[] = {CQ_BINARY_DIR "/coderq", "worker", NULL};
        const char *all[CQ_ITW_ENV_MAX + 2];
        char id[128];
        size_t i;

        memset(w, 0, sizeof(*w));
        snprintf(w->name, sizeof(w->name), "%s", name);
        snprintf(w->log, sizeof(w->log), "%s/%s.log", logdir, name);
        snprintf(id, sizeof(id), "CODERQ_WORKER_ID=%s", name);
        for (i = 0; i < env->n; i++)
                all[i] = env->v[i];
        all[i++] = id;
        all[i] = NULL;
        w->pid = cq_check_proc_spawn(argv, all, w->log);
        ck_assert_msg(w->pid > 0, "could not start worker %s", name);
}

/* Whether the log of the worker \p arg has a "worker started" line, or
 * the worker is gone (cq_itw_wait_started() tells which). */
static bool started_or_gone(void *arg)
{
        cq_itw_t *w = arg;
        char line[4096];
        bool found = false;
        FILE *fp = fopen(w->log, "r");

        while (fp && !found && fgets(line, sizeof(line), fp))
                found = strstr(line, "\"msg\":\"worker started\"") != NULL;
        if (fp)
                fclose(fp);
        return found || !cq_itw_alive(w);
}

void cq_itw_wait_started(cq_itw_t *w, int timeout_ms)
{
        bool done = cq_check_wait_until(started_or_gone, w, timeout_ms);

        if (!done || !cq_itw_alive(w))
                cq_itw_dump_log(w, true);
        ck_assert_msg(done && cq_itw_alive(w),
                      "worker %s did not start in %d ms (exit status %d)",
                      w->name, timeout_ms, w->status);
}

bool cq_itw_alive(cq_itw_t *w)
{
        int st;

        if (w->pid <= 0)
                return false;
        if (waitpid(w->pid, &st, WNOHANG) != w->pid)
                return true;
        w->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        w->pid = 0;
        return false;
}

int cq_itw_stop(cq_itw_t *w, int sig, int timeout_ms)
{
        int waited;

        if (w->pid <= 0)
                return w->status;
        if (sig)
                kill(w->pid, sig);
        for (waited = 0; waited < timeout_ms; waited += 50) {
                if (!cq_itw_alive(w)) {
                        if (w->status != 0 && w->status != 128 + SIGKILL)
                                cq_itw_dump_log(w, false);
                        return w->status;
                }
                kt_sleep_ms(50);
        }
        /* Still running: say where it waits before killing it. */
        fprintf(stderr, "--- worker %s did not exit within %d ms ---\n",
                w->name, timeout_ms);
        cq_itw_dump_log(w, true);
        cq_check_proc_backtrace(w->pid);
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
        w->pid = 0;
        w->status = 128 + SIGKILL;
        return -1;
}

void cq_itw_dump_log(const cq_itw_t *w, bool all)
{
        enum { KEEP = 40 };
        char line[2048], *ring[KEEP] = {0};
        size_t n = 0, i;
        FILE *fp = fopen(w->log, "r");

        if (!fp)
                return;
        while (fgets(line, sizeof(line), fp)) {
                if (!all && (strstr(line, "\"level\":\"debug\"") ||
                             strstr(line, "\"level\":\"info\"")))
                        continue;
                free(ring[n % KEEP]);
                ring[n % KEEP] = strdup(line);
                n++;
        }
        fclose(fp);
        fprintf(stderr, "--- last %s of worker %s (%s) ---\n",
                all ? "lines" : "warnings", w->name, w->log);
        for (i = n > KEEP ? n - KEEP : 0; i < n; i++)
                fputs(ring[i % KEEP] ? ring[i % KEEP] : "", stderr);
        for (i = 0; i < KEEP; i++)
                free(ring[i]);
}

void cq_itw_fleet_setup(cq_itw_fleet_t *fleet,
                        const char *name,
                        const char *dbprefix)
{
        memset(fleet, 0, sizeof(*fleet));
        fleet->fake = cq_fake_llm_start(NULL);
        ck_assert_ptr_nonnull(fleet->fake);
        snprintf(fleet->logdir, sizeof(fleet->logdir),
                 "/tmp/cq-it-%.20s-XXXXXX", name);
        ck_assert_ptr_nonnull(mkdtemp(fleet->logdir));
        cq_pgtest_sweep(dbprefix);
        cq_pgtest_create(dbprefix, true, fleet->dsn, sizeof(fleet->dsn),
                         fleet->dbname, sizeof(fleet->dbname));
}

void cq_itw_fleet_teardown(cq_itw_fleet_t *fleet)
{
        char cmd[128];

        cq_itw_fleet_kill(fleet);
        cq_fake_llm_stop(&fleet->fake);
        if (fleet->dbname[0])
                cq_pgtest_drop(fleet->dbname);
        if (!fleet->logdir[0])
                return;
        snprintf(cmd, sizeof(cmd), "rm -rf %s", fleet->logdir);
        if (getenv("CQ_KEEP_LOGS"))
                fprintf(stderr, "worker logs kept in %s\n", fleet->logdir);
        else if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", fleet->logdir);
}

void cq_itw_fleet_start(cq_itw_fleet_t *fleet,
                        size_t i,
                        const cq_itw_env_t *env,
                        const char *name)
{
        ck_assert_uint_lt(i, CQ_ITW_FLEET_MAX);
        cq_itw_start(&fleet->workers[i], env, fleet->logdir, name);
        cq_itw_wait_started(&fleet->workers[i], 120000);
}

void cq_itw_fleet_kill(cq_itw_fleet_t *fleet)
{
        size_t i;

        for (i = 0; i < CQ_ITW_FLEET_MAX; i++)
                if (fleet->workers[i].pid > 0)
                        (void)cq_itw_stop(&fleet->workers[i], SIGKILL, 10000);
}

void cq_itw_fleet_alive(cq_itw_fleet_t *fleet, const char *when)
{
        size_t i;

        for (i = 0; i < CQ_ITW_FLEET_MAX; i++) {
                cq_itw_t *w = &fleet->workers[i];

                if (!w->name[0])
                        continue;
                ck_assert_msg(cq_itw_alive(w), "worker %s exited (%d) %s",
                              w->name, w->status, when);
        }
}

long cq_itw_fleet_finished(const cq_itw_fleet_t *fleet)
{
        return kt_pg_long(fleet->dsn,
                          "SELECT count(*) FROM jobs WHERE status IN "
                          "('succeeded', 'failed', 'cancelled')",
                          NULL);
}
