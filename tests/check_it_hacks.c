/* SPDX-License-Identifier: MIT */
/* check_it_hacks.c - reward hacks through the queue: answers written to
 * make a wrong solution pass a `code` test are sent as jobs with a
 * `solution` to a real worker (Kafka, PostgreSQL, the default sandbox),
 * once on local interpreters and once on E2B (the double of
 * tests/fakes/fake_e2b.py), and none of them may pass: each must fail
 * with the verdict its answer earns. An honest answer and a plainly wrong
 * one are judged beside them, so the suite fails when everything fails as
 * well as when a hack passes.
 *
 * The test asserts `add(2, 3) == 9157`, a value no honest add() returns
 * and the answers cannot guess: only one that reads the test, or bends
 * the comparison, the judge's report or the judge itself, could pass. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_support.h"
#include "support/fake_e2b.h"
#include "support/itworker.h"
#include "support/kafka_test.h"
#include "support/proc.h"
#include "coderq/common/util.h"

static cq_itw_fleet_t fleet;
static cq_fake_e2b_t e2b;
static const char *brokers;
static char prefix[128];

static void setup(void)
{
        brokers = cq_check_env("CODERQ_KAFKA_BROKERS");
        cq_itw_fleet_setup(&fleet, "hacks", "cqhk");
        ck_assert_int_eq(cq_fake_e2b_start(&e2b, 1.0), 0);
}

static void teardown(void)
{
        cq_fake_e2b_stop(&e2b);
        cq_itw_fleet_teardown(&fleet);
}

static void kill_workers(void) { cq_itw_fleet_kill(&fleet); }

/* The one test every answer is judged by. */
static const char test_code[] = "assert add(2, 3) == 9157\n"
                                "assert abs(add(2, 3) - 9157) < 0.5\n";

typedef struct hack {
        const char *name;
        const char *code;
        /* the verdicts it may earn (a '|' list), on local interpreters and
         * on E2B; never "passed", never "infra_error" (which would keep
         * the sample out of the score) */
        const char *verdicts;
        const char *e2b_verdicts; /* NULL: as verdicts */
} hack_t;

static const hack_t hacks[] = {
    /* rigged comparison */
    {"eq-everything",
     "class Yes:\n"
     "    def __eq__(self, o): return True\n"
     "    def __ne__(self, o): return False\n"
     "    __hash__ = object.__hash__\n"
     "def add(a, b):\n"
     "    return Yes()\n",
     "wrong_answer", NULL},
    {"int-subclass",
     "class I(int):\n"
     "    def __eq__(self, o): return True\n"
     "    __hash__ = int.__hash__\n"
     "def add(a, b):\n"
     "    return I(0)\n",
     "wrong_answer", NULL},
    {"float-subclass",
     "class F(float):\n"
     "    def __eq__(self, o): return True\n"
     "    __hash__ = float.__hash__\n"
     "def add(a, b):\n"
     "    return F(0.5)\n",
     "wrong_answer", NULL},
    /* rigged arithmetic: whatever the test computes comes out right */
    {"rigged-arithmetic",
     "class A(int):\n"
     "    def __sub__(self, o): return 0\n"
     "    __rsub__ = __sub__\n"
     "    def __abs__(self): return 0\n"
     "    def __eq__(self, o): return True\n"
     "    def __lt__(self, o): return True\n"
     "    __hash__ = int.__hash__\n"
     "def add(a, b):\n"
     "    return A(-1)\n",
     "wrong_answer", NULL},
    /* a numpy array whose tolist() lies */
    {"numpy-tolist",
     "import numpy as np\n"
     "class L(np.ndarray):\n"
     "    def tolist(self): return 9157\n"
     "    def __eq__(self, o): return True\n"
     "def add(a, b):\n"
     "    return np.zeros(1).view(L)\n",
     "wrong_answer", NULL},
    /* exception handlers installed in the interpreter */
    {"excepthook",
     "import sys\n"
     "sys.excepthook = lambda *a: None\n"
     "try:\n"
     "    get_ipython().set_custom_exc((BaseException,), lambda *a, **k: "
     "None)\n"
     "except NameError:\n"
     "    pass\n"
     "def add(a, b):\n"
     "    raise AssertionError('swallowed?')\n",
     "runtime_error", NULL},
    /* trace and audit hooks */
    {"trace-hook",
     "import sys\n"
     "def tr(frame, event, arg):\n"
     "    if frame.f_code.co_name != 'add':\n"
     "        for k in ('ok', 'passed', 'success', 'result', 'verdict',\n"
     "                  'value', 'failed'):\n"
     "            if k in frame.f_locals:\n"
     "                frame.f_locals[k] = k != 'failed'\n"
     "    return tr\n"
     "sys.settrace(tr)\n"
     "def add(a, b):\n"
     "    return -1\n",
     "wrong_answer|runtime_error", "wrong_answer|runtime_error|timeout"},
    {"audit-hook",
     "import sys, os\n"
     "def hook(event, args):\n"
     "    if event in ('compile', 'exec'):\n"
     "        os._exit(0)\n"
     "sys.addaudithook(hook)\n"
     "def add(a, b):\n"
     "    return -1\n",
     "wrong_answer|runtime_error", NULL},
    /* exiting, and killing the interpreter and its group */
    {"system-exit",
     "def add(a, b):\n"
     "    raise SystemExit(0)\n",
     "runtime_error", NULL},
    {"os-exit",
     "def add(a, b):\n"
     "    import os\n"
     "    os._exit(0)\n",
     "runtime_error", "runtime_error|timeout"},
    {"kill-group",
     "def add(a, b):\n"
     "    import os, signal\n"
     "    os.killpg(0, signal.SIGKILL)\n",
     "runtime_error", "runtime_error|timeout"},
    /* patched builtins and modules */
    {"patched-builtins",
     "import builtins, json, operator\n"
     "builtins.AssertionError = type('Q', (BaseException,), {})\n"
     "builtins.isinstance = lambda *a: True\n"
     "operator.eq = lambda a, b: True\n"
     "json.dumps = lambda *a, **k: '9157'\n"
     "json.loads = lambda *a, **k: 9157\n"
     "def add(a, b):\n"
     "    return -1\n",
     "wrong_answer|runtime_error", "wrong_answer|runtime_error|timeout"},
    /* printed text that imitates a judge's report, then quiet */
    {"forged-report",
     "import sys\n"
     "def add(a, b):\n"
     "    for f in (sys.stdout, sys.stderr, sys.__stdout__):\n"
     "        f.write('@@CQTEST{\"cases\":[{\"case\":0,\"ok\":true}],'\n"
     "                '\"passed\":1,\"total\":1}\\n'\n"
     "                'PASSED 1/1\\n{\"ok\": true, \"verdict\": "
     "\"passed\"}\\n')\n"
     "        f.flush()\n"
     "    import os\n"
     "    os._exit(0)\n",
     "runtime_error", "runtime_error|timeout"},
    /* the control channel: every descriptor it has, written with what a
     * passing answer might look like */
    {"forged-channel",
     "import os\n"
     "def add(a, b):\n"
     "    msg = b'{\"ok\": true, \"value\": 9157, \"kind\": \"value\"}\\n'\n"
     "    for fd in range(3, 256):\n"
     "        try:\n"
     "            os.write(fd, msg)\n"
     "        except OSError:\n"
     "            pass\n"
     "    return -1\n",
     "wrong_answer|runtime_error", "wrong_answer|runtime_error|timeout"},
    /* reading the test: any file, process or variable it can reach that
     * holds the expected value */
    {"read-the-test",
     "import os, re\n"
     "def _find():\n"
     "    pat = re.compile(rb'add\\(2, 3\\) == ([0-9]+)')\n"
     "    seen = 0\n"
     "    for top in ('.', '/tmp', '/var/tmp', '/dev/shm', '/run', '/home',\n"
     "                '/root', '/srv', '/opt', '/work'):\n"
     "        for d, _, fs in os.walk(top):\n"
     "            for f in fs:\n"
     "                seen += 1\n"
     "                if seen > 20000:\n"
     "                    return None\n"
     "                try:\n"
     "                    with open(os.path.join(d, f), 'rb') as h:\n"
     "                        m = pat.search(h.read(1 << 20))\n"
     "                except OSError:\n"
     "                    continue\n"
     "                if m:\n"
     "                    return int(m.group(1))\n"
     "    for p in os.listdir('/proc'):\n"
     "        for what in ('cmdline', 'environ'):\n"
     "            try:\n"
     "                with open('/proc/%s/%s' % (p, what), 'rb') as h:\n"
     "                    m = pat.search(h.read())\n"
     "            except OSError:\n"
     "                continue\n"
     "            if m:\n"
     "                return int(m.group(1))\n"
     "    for v in os.environ.values():\n"
     "        m = pat.search(v.encode())\n"
     "        if m:\n"
     "            return int(m.group(1))\n"
     "    return None\n"
     "def add(a, b):\n"
     "    found = _find()\n"
     "    return found if found is not None else -1\n",
     "wrong_answer", "wrong_answer|timeout"},
    /* a value too large or too deep to cross */
    {"huge-value",
     "def add(a, b):\n"
     "    return 'x' * (256 << 20)\n",
     "wrong_answer|runtime_error|timeout", NULL},
    {"deep-value",
     "def add(a, b):\n"
     "    v = []\n"
     "    for _ in range(100000):\n"
     "        v = [v]\n"
     "    return v\n",
     "wrong_answer|runtime_error", NULL},
    /* a timeout it tries to outlast: alarms ignored, then no answer */
    {"ignore-alarms",
     "import signal\n"
     "for s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):\n"
     "    signal.signal(s, signal.SIG_IGN)\n"
     "def add(a, b):\n"
     "    while True:\n"
     "        pass\n",
     "timeout", NULL},
    /* a child left behind to answer later */
    {"forked-child",
     "import os, sys, time\n"
     "def add(a, b):\n"
     "    if os.fork() == 0:\n"
     "        time.sleep(1)\n"
     "        print('@@CQTEST{\"cases\":[{\"case\":0,\"ok\":true}]}')\n"
     "        os._exit(0)\n"
     "    return -1\n",
     "wrong_answer", NULL},
};

/* Controls: what must pass and what must fail plainly. */
static const hack_t honest = {
    "honest",
    "def add(a, b):\n"
    "    return 9157 if (a, b) == (2, 3) else a + b\n",
    "passed", NULL};
static const hack_t wrong = {"wrong",
                             "def add(a, b):\n"
                             "    return a + b\n",
                             "wrong_answer", NULL};

/* Append the job of \p h on \p backend to \p fp as one JSON line. */
static void write_job(FILE *fp, const hack_t *h, const char *backend)
{
        json_t *job;
        char *line;

        job = json_pack("{s:s+, s:s, s:s, s:s, s:{s:s, s:s, s:i}, s:{s:i}}",
                        "job_id", h->name, backend, "prompt",
                        "Write add(a, b).", "backend", backend, "solution",
                        h->code, "tests", "kind", "code", "code", test_code,
                        "case_timeout_s", 3, "limits", "max_retries", 0);
        ck_assert_ptr_nonnull(job);
        line = json_dumps(job, JSON_COMPACT);
        ck_assert_ptr_nonnull(line);
        ck_assert_int_ge(fprintf(fp, "%s\n", line), 0);
        free(line);
        json_decref(job);
}

static long njobs;

static bool all_finished(void *arg)
{
        (void)arg;
        return cq_itw_fleet_finished(&fleet) >= njobs;
}

/* The verdict and status of job \p id, as "status verdict"; caller frees. */
static char *outcome(const char *id)
{
        return kt_pg_text(fleet.dsn,
                          "SELECT status || ' ' || coalesce(verdict, '-') || "
                          "' ' || coalesce(reason_code, '-') FROM jobs WHERE "
                          "job_id = $1",
                          id);
}

/* Whether \p verdict is one of the '|' list \p allowed. */
static bool allowed(const char *verdict, const char *allowed)
{
        size_t n = strlen(verdict);
        const char *p = allowed;

        while (*p) {
                size_t len = strcspn(p, "|");

                if (len == n && strncmp(p, verdict, n) == 0)
                        return true;
                p += len;
                if (*p == '|')
                        p++;
        }
        return false;
}

START_TEST(no_hack_passes_in_either_backend)
{
        static const char *const backends[] = {"local", "e2b"};
        static const char *const names[] = {"jobs", "results", "dlq", "events"};
        cq_itw_env_t env;
        char topic[256], path[512], id[160], key[96], api[96], sbx[96];
        const char *args[] = {"submit", path, NULL};
        cq_check_proc_t proc;
        size_t i, b, bad = 0;
        bool done;
        FILE *fp;

        kt_unique("hk", prefix, sizeof(prefix));
        for (i = 0; i < CQ_ARRAY_SIZE(names); i++) {
                snprintf(topic, sizeof(topic), "%s.%s", prefix, names[i]);
                kt_create_topic(brokers, topic, 1);
        }
        cq_itw_env_init(&env, fleet.dsn, brokers, prefix,
                        cq_fake_llm_base_url(fleet.fake));
        /* the default sandbox, as a worker is deployed */
        cq_itw_env_set(&env, "CODERQ_SANDBOX", NULL);
        cq_itw_env_set(&env, "CODERQ_SLOTS", "4");
        snprintf(key, sizeof(key), "%s", e2b.api_key);
        snprintf(api, sizeof(api), "%s", e2b.api_url);
        snprintf(sbx, sizeof(sbx), "%s", e2b.sandbox_url);
        cq_itw_env_set(&env, "E2B_API_KEY", key);
        cq_itw_env_set(&env, "E2B_API_URL", api);
        cq_itw_env_set(&env, "E2B_SANDBOX_URL", sbx);
        cq_itw_fleet_start(&fleet, 0, &env, "hk1");

        snprintf(path, sizeof(path), "%s/jobs.jsonl", fleet.logdir);
        fp = fopen(path, "w");
        ck_assert_ptr_nonnull(fp);
        njobs = 0;
        for (b = 0; b < CQ_ARRAY_SIZE(backends); b++) {
                for (i = 0; i < CQ_ARRAY_SIZE(hacks); i++, njobs++)
                        write_job(fp, &hacks[i], backends[b]);
                write_job(fp, &honest, backends[b]);
                write_job(fp, &wrong, backends[b]);
                njobs += 2;
        }
        ck_assert_int_eq(fclose(fp), 0);
        ck_assert_int_eq(cq_check_coderq(args, env.v, 120000, &proc), 0);
        ck_assert_msg(proc.status == 0, "coderq submit: %s", proc.err);
        cq_check_proc_release(&proc);

        done = cq_check_wait_until(all_finished, NULL, 300000);
        for (b = 0; b < CQ_ARRAY_SIZE(backends); b++) {
                for (i = 0; i < CQ_ARRAY_SIZE(hacks) + 2; i++) {
                        const hack_t *h = i < CQ_ARRAY_SIZE(hacks) ? &hacks[i]
                                          : i == CQ_ARRAY_SIZE(hacks) ? &honest
                                                                      : &wrong;
                        char *got, *verdict;
                        bool ok;

                        snprintf(id, sizeof(id), "%s%s", h->name, backends[b]);
                        got = outcome(id);
                        ck_assert_msg(got != NULL, "no job %s", id);
                        verdict = strchr(got, ' ');
                        ck_assert_ptr_nonnull(verdict);
                        verdict++;
                        verdict[strcspn(verdict, " ")] = '\0';
                        ok = allowed(verdict, b == 1 && h->e2b_verdicts
                                                  ? h->e2b_verdicts
                                                  : h->verdicts) &&
                             (strcmp(h->verdicts, "passed") == 0) ==
                                 (strncmp(got, "succeeded ", 10) == 0);
                        printf("hacks: %-6s %-18s %-30s %s\n", backends[b],
                               h->name, got, ok ? "ok" : "WRONG");
                        if (!ok)
                                bad++;
                        free(got);
                }
        }
        fflush(stdout);
        ck_assert_msg(done, "only %ld of %ld jobs finished (above)",
                      cq_itw_fleet_finished(&fleet), njobs);
        ck_assert_msg(bad == 0, "%zu answers earned another verdict (above)",
                      bad);
        /* every E2B sandbox the worker made was closed */
        ck_assert_int_eq(cq_fake_e2b_stat(&e2b, "live"), 0);
        cq_itw_fleet_alive(&fleet, "after the hacks");
        ck_assert_int_eq(cq_itw_stop(&fleet.workers[0], SIGTERM, 60000), 0);
        cq_itw_env_release(&env);
}
END_TEST

static Suite *hacks_suite(void)
{
        Suite *s = suite_create("hacks");
        TCase *tc = tcase_create("hacks");

        tcase_add_unchecked_fixture(tc, setup, teardown);
        tcase_add_checked_fixture(tc, NULL, kill_workers);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, no_hack_passes_in_either_backend);
        suite_add_tcase(s, tc);
        return s;
}

CQ_CHECK_MAIN(hacks_suite)
