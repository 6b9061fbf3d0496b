/* SPDX-License-Identifier: MIT */
/* check_worker_start.c - the worker's start-up when one of its threads
 * cannot be created. pthread_create is wrapped at link time (-Wl,--wrap,
 * see tests/CMakeLists.txt) so that a test can make the Nth call fail;
 * cq_worker_run() must then log which thread it could not start, stop the
 * ones it did start and return -1, not run on without it. No services:
 * PostgreSQL is a closed port, where the threads retry until stopped. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/common/config.h"
#include "coderq/common/log.h"
#include "coderq/common/util.h"
#include "coderq/worker/worker.h"

int __real_pthread_create(pthread_t *thr,
                          const pthread_attr_t *attr,
                          void *(*fn)(void *),
                          void *arg);
int __wrap_pthread_create(pthread_t *thr,
                          const pthread_attr_t *attr,
                          void *(*fn)(void *),
                          void *arg);

/* The call that fails: 1 is the next one; 0 never. */
static atomic_int countdown;

int __wrap_pthread_create(pthread_t *thr,
                          const pthread_attr_t *attr,
                          void *(*fn)(void *),
                          void *arg)
{
        if (atomic_load(&countdown) > 0 && atomic_fetch_sub(&countdown, 1) == 1)
                return EAGAIN;
        return __real_pthread_create(thr, attr, fn, arg);
}

/* Raises the worker's signal flag when the test is done, or after a bound
 * (then the worker had run on without a thread). */
static volatile sig_atomic_t signals;
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cond = PTHREAD_COND_INITIALIZER;
static int wd_done;

static void *watchdog(void *arg)
{
        struct timespec ts;

        (void)arg;
        cq_abstime_in(&ts, 20000);
        pthread_mutex_lock(&wd_lock);
        while (!wd_done &&
               pthread_cond_timedwait(&wd_cond, &wd_lock, &ts) != ETIMEDOUT)
                ;
        pthread_mutex_unlock(&wd_lock);
        signals = 1;
        return NULL;
}

static const char *const what[] = {"housekeeping", "listener", "job slot"};

/* With one slot and neither intake nor relay, cq_worker_run() starts the
 * housekeeping, listener and slot threads in that order; loop i makes the
 * (i+1)th of them fail. */
START_TEST(failed_thread_start_fails_the_run)
{
        cq_worker_opts_t opts = {.slots = 1, .drain_s = 5};
        char errstr[512], logpath[] = "/tmp/cq-worker-start-XXXXXX", want[128];
        cq_config_t cfg;
        cq_worker_t *w;
        pthread_t wd;
        char *log;
        int fd, rc;

        ck_assert_int_eq(cq_config_init(&cfg), 0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_PG_DSN",
                                       "host=127.0.0.1 port=1 "
                                       "connect_timeout=2",
                                       "test", errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_WORKER_ID", "ws", "test",
                                       errstr, sizeof(errstr)),
                         0);
        ck_assert_int_eq(cq_config_set(&cfg, "CODERQ_KPOOL_SIZE", "1", "test",
                                       errstr, sizeof(errstr)),
                         0);
        fd = mkstemp(logpath);
        ck_assert_int_ge(fd, 0);
        cq_log_set_fd(fd);
        w = cq_worker_new(&cfg, &opts, errstr, sizeof(errstr));
        ck_assert_msg(w != NULL, "%s", errstr);
        ck_assert_int_eq(__real_pthread_create(&wd, NULL, watchdog, NULL), 0);

        atomic_store(&countdown, _i + 1);
        rc = cq_worker_run(w, &signals);
        atomic_store(&countdown, 0);
        pthread_mutex_lock(&wd_lock);
        wd_done = 1;
        pthread_cond_signal(&wd_cond);
        pthread_mutex_unlock(&wd_lock);
        ck_assert_int_eq(pthread_join(wd, NULL), 0);
        cq_worker_destroy(&w);
        cq_log_set_fd(2);

        log = cq_check_slurp(logpath, NULL);
        unlink(logpath);
        close(fd);
        snprintf(want, sizeof(want), "could not start the %s thread: %s",
                 what[_i], strerror(EAGAIN));
        ck_assert_msg(strstr(log, want) != NULL, "log lacks \"%s\":\n%s", want,
                      log);
        ck_assert_ptr_null(strstr(log, "\"worker started\""));
        free(log);
        ck_assert_int_eq(rc, -1);
        cq_config_release(&cfg);
}
END_TEST

static Suite *worker_start_suite(void)
{
        Suite *s = suite_create("worker_start");
        TCase *tc = tcase_create("start");

        tcase_set_timeout(tc, 120);
        tcase_add_loop_test(tc, failed_thread_start_fails_the_run, 0, 3);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(worker_start_suite)
