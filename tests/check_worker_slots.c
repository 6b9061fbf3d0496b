/* SPDX-License-Identifier: MIT */
/* check_worker_slots.c - what housekeeping learns about a slot's job
 * (its lease lost, its cancel requested) reaches that job only: the slot
 * may have finished it and claimed the next one since housekeeping took
 * its snapshot of the running jobs, and the next one must run on. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "../worker/worker_int.h"
#include "check_support.h"

static void slot_init(slot_t *slot, const char *job_id)
{
        memset(slot, 0, sizeof(*slot));
        pthread_mutex_init(&slot->lock, NULL);
        if (job_id) {
                snprintf(slot->job_id, sizeof(slot->job_id), "%s", job_id);
                slot->busy = true;
        }
}

START_TEST(lost_lease_of_a_finished_job_spares_the_next)
{
        slot_t slot;

        /* the snapshot had job-a; the slot now runs job-b */
        slot_init(&slot, "job-b");
        ck_assert(!worker_slot_mark(&slot, "job-a", true));
        ck_assert_int_eq(atomic_load(&slot.lost), 0);
        ck_assert_int_eq(atomic_load(&slot.cancel), 0);
        /* job-b's own lost lease does reach it */
        ck_assert(worker_slot_mark(&slot, "job-b", true));
        ck_assert_int_eq(atomic_load(&slot.lost), 1);
        ck_assert_int_eq(atomic_load(&slot.cancel), 1);
        ck_assert_int_eq(atomic_load(&slot.user_cancel), 0);
        pthread_mutex_destroy(&slot.lock);
}
END_TEST

START_TEST(cancel_of_a_finished_job_spares_the_next)
{
        slot_t slot;

        slot_init(&slot, "job-b");
        ck_assert(!worker_slot_mark(&slot, "job-a", false));
        ck_assert_int_eq(atomic_load(&slot.user_cancel), 0);
        ck_assert_int_eq(atomic_load(&slot.cancel), 0);
        /* the first request for job-b cancels it; later polls that still
         * see the request keep it cancelled without telling it again */
        ck_assert(worker_slot_mark(&slot, "job-b", false));
        ck_assert(!worker_slot_mark(&slot, "job-b", false));
        ck_assert_int_eq(atomic_load(&slot.user_cancel), 1);
        ck_assert_int_eq(atomic_load(&slot.cancel), 1);
        ck_assert_int_eq(atomic_load(&slot.lost), 0);
        pthread_mutex_destroy(&slot.lock);
}
END_TEST

START_TEST(an_idle_slot_is_left_alone)
{
        slot_t slot;

        /* the job finished and the slot claimed nothing yet */
        slot_init(&slot, NULL);
        ck_assert(!worker_slot_mark(&slot, "job-a", true));
        ck_assert(!worker_slot_mark(&slot, "job-a", false));
        ck_assert_int_eq(atomic_load(&slot.lost), 0);
        ck_assert_int_eq(atomic_load(&slot.cancel), 0);
        ck_assert_int_eq(atomic_load(&slot.user_cancel), 0);
        pthread_mutex_destroy(&slot.lock);
}
END_TEST

static Suite *cq_worker_slots_suite(void)
{
        Suite *s = suite_create("worker_slots");
        TCase *tc = tcase_create("slots");

        tcase_add_test(tc, lost_lease_of_a_finished_job_spares_the_next);
        tcase_add_test(tc, cancel_of_a_finished_job_spares_the_next);
        tcase_add_test(tc, an_idle_slot_is_left_alone);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(cq_worker_slots_suite)
