/* SPDX-License-Identifier: MIT */
/* check_judges.c - judges kept between runs of the same test code
 * (interp/backend/judges.c): a judge is taken only under the key it was
 * kept for, newest first; the bounds on their number, idle time and runs
 * end judges; a judge that died or wrote while it waited is never taken;
 * and the keeper is safe from several threads. The judges here are pipe
 * pairs standing for the processes (the judge's own suites, check_judge
 * and check_agent_judge, run real ones). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_support.h"
#include "coderq/backend/judges.h"
#include "coderq/common/util.h"

static atomic_int ended; /* fake judges destroyed */

typedef struct fake {
        cq_interp_proc_t base;
        int their_in;  /* the judge's stdin: reads what to_fd gets */
        int their_out; /* the judge's answers: what from_fd reads */
} fake_t;

static void fake_destroy(cq_interp_proc_t *base)
{
        fake_t *f = (fake_t *)base;

        close(f->base.to_fd);
        close(f->base.from_fd);
        if (f->their_in >= 0)
                close(f->their_in);
        if (f->their_out >= 0)
                close(f->their_out);
        free(f);
        atomic_fetch_add(&ended, 1);
}

static fake_t *fake_new(void)
{
        fake_t *f = calloc(1, sizeof(*f));
        int in[2], out[2];

        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(pipe2(in, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
        f->base.to_fd = in[1];
        f->their_in = in[0];
        f->base.from_fd = out[0];
        f->their_out = out[1];
        f->base.destroy = fake_destroy;
        return f;
}

static void setup(void)
{
        atomic_store(&ended, 0);
        signal(SIGPIPE, SIG_IGN);
}

/* Under its key only, and the same judge comes back. */
START_TEST(judges_are_taken_under_their_key)
{
        cq_judges_t *j = cq_judges_new(4, 60000, 100);
        fake_t *f = fake_new();
        cq_interp_proc_t *p;
        cq_judges_stats_t st;
        char k1[65], k2[65];

        cq_sha256_hex("-assert f(1) == 2", 17, k1);
        cq_sha256_hex("-assert f(1) == 3", 17, k2);
        ck_assert_ptr_null(cq_judges_take(j, k1));
        ck_assert(cq_judges_keep(j, k1, &f->base));
        ck_assert_ptr_null(cq_judges_take(j, k2));
        ck_assert_ptr_null(cq_judges_take(j, ""));
        ck_assert_ptr_null(cq_judges_take(j, NULL));
        p = cq_judges_take(j, k1);
        ck_assert_ptr_nonnull(p);
        /* the same process: its pipes */
        ck_assert_int_eq(p->to_fd, f->base.to_fd);
        ck_assert_int_eq(p->from_fd, f->base.from_fd);
        ck_assert_ptr_null(cq_judges_take(j, k1)); /* lent, not kept */
        cq_judges_stats(j, &st);
        ck_assert_uint_eq(st.idle, 0);
        ck_assert_uint_eq(st.kept, 1);
        ck_assert_uint_eq(st.taken, 1);
        ck_assert(cq_judges_keep(j, k1, p));
        cq_judges_stats(j, &st);
        ck_assert_uint_eq(st.idle, 1);
        ck_assert_uint_eq(st.kept, 2);
        ck_assert_int_eq(atomic_load(&ended), 0);
        cq_judges_destroy(&j);
        ck_assert_ptr_null(j);
        ck_assert_int_eq(atomic_load(&ended), 1);
        cq_judges_destroy(&j); /* NULL is fine */
}
END_TEST

/* Several under one key: the newest first. */
START_TEST(the_newest_judge_first)
{
        cq_judges_t *j = cq_judges_new(4, 60000, 100);
        fake_t *a = fake_new(), *b = fake_new();
        cq_interp_proc_t *p;
        const char *key = "k";

        ck_assert(cq_judges_keep(j, key, &a->base));
        ck_assert(cq_judges_keep(j, key, &b->base));
        p = cq_judges_take(j, key);
        ck_assert_int_eq(p->from_fd, b->base.from_fd);
        p->destroy(p);
        p = cq_judges_take(j, key);
        ck_assert_int_eq(p->from_fd, a->base.from_fd);
        p->destroy(p);
        ck_assert_int_eq(atomic_load(&ended), 2);
        cq_judges_destroy(&j);
}
END_TEST

/* No room: the judge idle longest ends for the new one. None kept with
 * a bound of 0, nor under a key too long. */
START_TEST(the_number_kept_is_bounded)
{
        cq_judges_t *j = cq_judges_new(2, 60000, 100), *none;
        fake_t *f[3];
        cq_judges_stats_t st;
        char longkey[100];
        int i;

        for (i = 0; i < 3; i++) {
                char key[2] = {(char)('a' + i), '\0'};

                f[i] = fake_new();
                ck_assert(cq_judges_keep(j, key, &f[i]->base));
        }
        ck_assert_int_eq(atomic_load(&ended), 1);
        ck_assert_ptr_null(cq_judges_take(j, "a"));
        cq_judges_stats(j, &st);
        ck_assert_uint_eq(st.idle, 2);
        ck_assert_uint_eq(st.dropped, 1);
        cq_judges_destroy(&j);
        ck_assert_int_eq(atomic_load(&ended), 3);

        none = cq_judges_new(0, 60000, 100);
        f[0] = fake_new();
        ck_assert(!cq_judges_keep(none, "a", &f[0]->base));
        memset(longkey, 'x', sizeof(longkey) - 1);
        longkey[sizeof(longkey) - 1] = '\0';
        j = cq_judges_new(2, 60000, 100);
        ck_assert(!cq_judges_keep(j, longkey, &f[0]->base));
        ck_assert(!cq_judges_keep(j, "", &f[0]->base));
        f[0]->base.destroy(&f[0]->base);
        cq_judges_destroy(&none);
        cq_judges_destroy(&j);
}
END_TEST

/* A judge serves at most runs_max runs, then its holder ends it. */
START_TEST(runs_per_judge_are_bounded)
{
        cq_judges_t *j = cq_judges_new(2, 60000, 3);
        cq_interp_proc_t *p = &fake_new()->base;
        int runs = 1;

        while (cq_judges_keep(j, "k", p)) {
                p = cq_judges_take(j, "k");
                ck_assert_ptr_nonnull(p);
                runs++;
        }
        ck_assert_int_eq(runs, 3); /* kept after runs 1 and 2 */
        ck_assert_int_eq(atomic_load(&ended), 0);
        p->destroy(p);
        ck_assert_int_eq(atomic_load(&ended), 1);
        cq_judges_destroy(&j);
}
END_TEST

/* Idle past the keeper's time: ended by housekeeping. */
START_TEST(idle_judges_expire)
{
        cq_judges_t *j = cq_judges_new(8, 1000, 100);
        int i;

        for (i = 0; i < 3; i++)
                ck_assert(cq_judges_keep(j, "k", &fake_new()->base));
        ck_assert_uint_eq(cq_judges_expire(j, cq_now_ms()), 0);
        ck_assert_uint_eq(cq_judges_expire(j, cq_now_ms() + 1000), 3);
        ck_assert_int_eq(atomic_load(&ended), 3);
        ck_assert_ptr_null(cq_judges_take(j, "k"));
        cq_judges_destroy(&j);
}
END_TEST

/* A judge that exited, closed its stdin or wrote while it waited is
 * ended when found, and the next one under the key is taken. */
START_TEST(dead_judges_are_never_taken)
{
        cq_judges_t *j = cq_judges_new(8, 60000, 100);
        fake_t *good = fake_new(), *gone = fake_new(), *deaf = fake_new(),
               *talks = fake_new();
        cq_interp_proc_t *p;

        ck_assert(cq_judges_keep(j, "k", &good->base));
        ck_assert(cq_judges_keep(j, "k", &gone->base));
        ck_assert(cq_judges_keep(j, "k", &deaf->base));
        ck_assert(cq_judges_keep(j, "k", &talks->base));
        close(gone->their_out); /* exited: its answers' pipe closed */
        gone->their_out = -1;
        close(deaf->their_in); /* reads no more requests */
        deaf->their_in = -1;
        ck_assert_int_eq(write(talks->their_out, "x\n", 2), 2);
        p = cq_judges_take(j, "k");
        ck_assert_ptr_nonnull(p);
        ck_assert_int_eq(p->from_fd, good->base.from_fd);
        ck_assert_int_eq(atomic_load(&ended), 3);
        p->destroy(p);
        ck_assert_ptr_null(cq_judges_take(j, "k"));
        cq_judges_destroy(&j);
}
END_TEST

/* ------------------------------------------------------- threads */

#define THREAD_ROUNDS 2000

static void *churn(void *arg)
{
        cq_judges_t *j = arg;
        int i;

        for (i = 0; i < THREAD_ROUNDS; i++) {
                char key[2] = {(char)('a' + i % 3), '\0'};
                cq_interp_proc_t *p = cq_judges_take(j, key);

                if (!p)
                        p = &fake_new()->base;
                if (!cq_judges_keep(j, key, p))
                        p->destroy(p);
                if (i % 100 == 0)
                        (void)cq_judges_expire(j, cq_now_ms() - 1);
        }
        return NULL;
}

/* Takes, keeps and expiry from several threads at once: every judge is
 * kept, lent or ended exactly once. */
START_TEST(several_threads_share_the_keeper)
{
        cq_judges_t *j = cq_judges_new(2, 60000, 50);
        pthread_t t[3];
        cq_judges_stats_t st;
        int i;

        for (i = 0; i < 3; i++)
                ck_assert_int_eq(pthread_create(&t[i], NULL, churn, j), 0);
        for (i = 0; i < 3; i++)
                pthread_join(t[i], NULL);
        cq_judges_stats(j, &st);
        ck_assert_uint_le(st.idle, 2);
        ck_assert_uint_gt(st.taken, 0);
        ck_assert_uint_eq(st.kept, st.taken + st.idle + st.dropped);
        cq_judges_destroy(&j);
}
END_TEST

static Suite *judges_suite(void)
{
        Suite *s = suite_create("judges");
        TCase *tc = tcase_create("keeper");

        tcase_add_checked_fixture(tc, setup, NULL);
        tcase_add_test(tc, judges_are_taken_under_their_key);
        tcase_add_test(tc, the_newest_judge_first);
        tcase_add_test(tc, the_number_kept_is_bounded);
        tcase_add_test(tc, runs_per_judge_are_bounded);
        tcase_add_test(tc, idle_judges_expire);
        tcase_add_test(tc, dead_judges_are_never_taken);
        tcase_add_test(tc, several_threads_share_the_keeper);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(judges_suite)
