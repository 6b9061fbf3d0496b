/* SPDX-License-Identifier: MIT */
/* check_jobfile.c - a `coderq submit` FILE told apart and cut into job
 * messages (jobfile.c): golden files tests/data/jobfile/<case>/{input,
 * expected}, expected being the form and each job's line and text, or the
 * error that names where the file stops being any of the three forms.
 * CQ_GOLDEN_UPDATE=1 rewrites the expected files (then review the diff). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "coderq/cli/jobfile.h"
#include "coderq/common/buf.h"

static const char *form_name(cq_jobfile_form_t form)
{
        switch (form) {
        case CQ_JOBFILE_ARRAY:
                return "array";
        case CQ_JOBFILE_OBJECT:
                return "object";
        case CQ_JOBFILE_LINES:
        default:
                return "lines";
        }
}

/* What cq_jobfile_parse() made of \p data, as the expected files say it. */
static void describe(const char *data, size_t len, cq_buf_t *out)
{
        cq_jobfile_t jf;
        char errstr[512];
        cq_err_t err;
        size_t i;

        cq_jobfile_init(&jf);
        err = cq_jobfile_parse(data, len, &jf, errstr, sizeof(errstr));
        if (err != CQ_OK) {
                ck_assert_int_eq(err, CQ_ERR_FATAL);
                ck_assert_uint_eq(jf.n, 0);
                ck_assert_int_eq(cq_buf_printf(out, "error: %s\n", errstr),
                                 CQ_OK);
                return;
        }
        ck_assert_int_eq(cq_buf_printf(out, "form: %s\n", form_name(jf.form)),
                         CQ_OK);
        for (i = 0; i < jf.n; i++) {
                ck_assert_uint_eq(strlen(jf.jobs[i].text), jf.jobs[i].len);
                ck_assert_int_eq(cq_buf_printf(out, "line %ld: %s\n",
                                               jf.jobs[i].line,
                                               jf.jobs[i].text),
                                 CQ_OK);
        }
        cq_jobfile_release(&jf);
        ck_assert_ptr_null(jf.jobs);
        ck_assert_uint_eq(jf.n, 0);
}

START_TEST(jobfile_golden_cases)
{
        char *names[64];
        size_t n, i, failed = 0;

        n = cq_check_cases("tests/data/jobfile", names, CQ_ARRAY_SIZE(names));
        ck_assert_uint_ge(n, 10);
        for (i = 0; i < n; i++) {
                char rel[300], label[300];
                char *data;
                size_t len;
                cq_buf_t out;

                snprintf(rel, sizeof(rel), "tests/data/jobfile/%s/input",
                         names[i]);
                data = cq_check_slurp(cq_check_srcpath(rel), &len);
                ck_assert_ptr_nonnull(data);
                cq_buf_init(&out, 1 << 20);
                describe(data, len, &out);
                snprintf(rel, sizeof(rel), "tests/data/jobfile/%s/expected",
                         names[i]);
                snprintf(label, sizeof(label), "jobfile case %s", names[i]);
                failed += (size_t)cq_check_golden(cq_check_srcpath(rel),
                                                  out.data, label);
                cq_buf_release(&out);
                free(data);
                free(names[i]);
        }
        ck_assert_uint_eq(failed, 0);
}
END_TEST

/* A NUL byte in a line is that line's to refuse, not the end of the
 * file; texts may be taken from the jobs before they are released. */
START_TEST(jobfile_nul_bytes_and_taken_texts)
{
        static const char data[] = "{\"job_id\":\"a\",\"prompt\":\"p\"}\n"
                                   "{\"job_id\":\"b\0\"}\n"
                                   "{\"job_id\":\"c\",\"prompt\":\"p\"}\n";
        cq_jobfile_t jf;
        char errstr[256];
        char *taken;

        cq_jobfile_init(&jf);
        ck_assert_int_eq(cq_jobfile_parse(data, sizeof(data) - 1, &jf, errstr,
                                          sizeof(errstr)),
                         CQ_OK);
        ck_assert_int_eq(jf.form, CQ_JOBFILE_LINES);
        ck_assert_uint_eq(jf.n, 3);
        ck_assert_uint_eq(jf.jobs[1].len, 15);
        ck_assert(memcmp(jf.jobs[1].text, "{\"job_id\":\"b\0\"}", 15) == 0);
        ck_assert_int_eq(jf.jobs[2].line, 3);
        taken = jf.jobs[0].text;
        jf.jobs[0].text = NULL;
        cq_jobfile_release(&jf);
        ck_assert_str_eq(taken, "{\"job_id\":\"a\",\"prompt\":\"p\"}");
        free(taken);
}
END_TEST

static Suite *jobfile_suite(void)
{
        Suite *s = suite_create("jobfile");
        TCase *tc = tcase_create("jobfile");

        tcase_add_test(tc, jobfile_golden_cases);
        tcase_add_test(tc, jobfile_nul_bytes_and_taken_texts);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(jobfile_suite)
