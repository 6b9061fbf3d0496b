-- 0006_eval_runs.sql - what evaluation runs need: retries linked to
-- their original job, a reason code per failure, the cost of every job
-- and a budget per run, and summaries over the latest attempt of each
-- original job (README "Evaluation runs").
--
-- jobs: retry_of (the original job a retry tries again; a retry of a
-- retry names the same original) and run_attempt (1 for the original, N
-- for its retry ORIGINAL~rN); reason_code, the kind of reason of a job
-- that did not succeed; cache_read_tokens and cache_creation_tokens (of
-- prompt_tokens); cost_usd (the cost of the job's LLM calls at the prices
-- the worker had, NULL when one of them had no price: unknown, never a
-- silent 0); budget_hold_usd (what the job's LLM call in flight may cost,
-- held against its run's budget until its usage is recorded, released
-- when the job leaves 'running'). Tokens and cost are written after every
-- LLM call, so limits and budgets count every attempt of a job.
--
-- runs: a budget per run (`coderq budget`). results.model: the model a
-- finished job used, from its report's "repro" record.
--
-- Replaces: coderq_account_run_time() (releases the hold),
-- coderq_finish() (a new signature with the reason code, cached tokens
-- and cost; the old one is kept and calls it, for workers not yet
-- upgraded), coderq_completion_event() (cost_usd, retry_of,
-- run_attempt, reason_code, model, cached tokens), the views job_overview
-- (columns added at the end) and run_summary (now over the latest attempt
-- of each original job; columns added at the end).

ALTER TABLE jobs
    ADD COLUMN retry_of text CHECK (retry_of <> job_id),
    ADD COLUMN run_attempt integer NOT NULL DEFAULT 1
        CHECK (run_attempt BETWEEN 1 AND 1000),
    ADD COLUMN reason_code text CHECK (reason_code ~ '^[a-z_]{1,32}$'),
    ADD COLUMN cache_read_tokens bigint NOT NULL DEFAULT 0
        CHECK (cache_read_tokens >= 0),
    ADD COLUMN cache_creation_tokens bigint NOT NULL DEFAULT 0
        CHECK (cache_creation_tokens >= 0),
    ADD COLUMN cost_usd numeric DEFAULT 0 CHECK (cost_usd >= 0),
    ADD COLUMN budget_hold_usd numeric NOT NULL DEFAULT 0
        CHECK (budget_hold_usd >= 0),
    ADD CONSTRAINT jobs_retry_linked
        CHECK ((retry_of IS NULL) = (run_attempt = 1));
CREATE INDEX jobs_retry_of_idx ON jobs (retry_of) WHERE retry_of IS NOT NULL;

-- Jobs that used the LLM before prices existed have an unknown cost.
UPDATE jobs SET cost_usd = NULL
WHERE prompt_tokens + completion_tokens > 0;

-- Reason codes of the jobs that finished before this migration, from the
-- wording their reasons had.
UPDATE jobs SET reason_code = CASE
        WHEN status = 'cancelled' THEN 'cancelled'
        WHEN reason LIKE 'turn limit reached%' THEN 'max_turns'
        WHEN reason LIKE 'retry limit reached%' THEN 'max_retries'
        WHEN reason LIKE 'job time limit reached%' THEN 'job_timeout'
        WHEN reason LIKE 'the LLM %' THEN 'llm'
        WHEN reason LIKE 'lease expired after%'
          OR reason LIKE 'gave up after%' THEN 'attempts'
        WHEN reason LIKE 'parent job %' THEN 'parent'
        WHEN reason LIKE 'could not get input file%'
          OR reason LIKE 'could not write input file%' THEN 'input'
        WHEN reason = 'out of memory' THEN 'internal'
        ELSE 'other' END
WHERE status IN ('failed', 'cancelled');

CREATE TABLE runs (
    run_id     text PRIMARY KEY CHECK (length(run_id) BETWEEN 1 AND 128),
    budget_usd numeric CHECK (budget_usd >= 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE results ADD COLUMN model text GENERATED ALWAYS AS (
    CASE WHEN jsonb_typeof(report->'repro'->'model') = 'string'
         THEN report->'repro'->>'model' END) STORED;

-- As in 0004, and a job that leaves 'running' no longer holds any of its
-- run's budget.
CREATE OR REPLACE FUNCTION coderq_account_run_time() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
        ended timestamptz;
BEGIN
        IF NEW.status = 'running' THEN
                NEW.claimed_at := now();
        ELSIF OLD.status = 'running' THEN
                IF OLD.claimed_at IS NOT NULL THEN
                        ended := CASE WHEN OLD.lease_until < now()
                                      THEN COALESCE(OLD.heartbeat_at, now())
                                      ELSE now() END;
                        NEW.run_ms := OLD.run_ms + GREATEST(0,
                            (extract(epoch FROM (ended - OLD.claimed_at))
                             * 1000)::bigint);
                END IF;
                NEW.claimed_at := NULL;
                NEW.budget_hold_usd := 0;
        END IF;
        RETURN NEW;
END
$$;

-- Hold p_estimate (the most the job's next LLM call may cost) against the
-- budget of the job's run. The run's row lock serialises the holds of a
-- run across workers, and the sums are read after it is taken (a plpgsql
-- statement sees what committed before it started), so two jobs can never
-- both take the last of a budget. Spent is every known cost of the run's
-- jobs, all attempts; held is what their other calls in flight hold.
-- Returns one row: outcome 'ok' (held), 'none' (the run has no budget),
-- 'over' (the call would cross it), 'unknown' (the call's cost, or the
-- run's spending, is unknown: refused) or 'lost' (not this owner's job).
CREATE FUNCTION coderq_budget_reserve(p_job_id text, p_owner text,
                                      p_estimate numeric)
RETURNS TABLE (outcome text, budget_usd numeric, spent_usd numeric,
               held_usd numeric)
LANGUAGE plpgsql AS $$
DECLARE
        v_run text;
        v_budget numeric;
        v_spent numeric;
        v_held numeric;
        v_unknown boolean;
BEGIN
        SELECT j.run_id INTO v_run FROM jobs j
        WHERE j.job_id = p_job_id AND j.lease_owner = p_owner
          AND j.status = 'running';
        IF NOT FOUND THEN
                RETURN QUERY SELECT 'lost'::text, NULL::numeric,
                                    NULL::numeric, NULL::numeric;
                RETURN;
        END IF;
        IF v_run IS NOT NULL THEN
                SELECT r.budget_usd INTO v_budget FROM runs r
                WHERE r.run_id = v_run FOR UPDATE;
        END IF;
        IF v_budget IS NULL THEN
                RETURN QUERY SELECT 'none'::text, NULL::numeric,
                                    NULL::numeric, NULL::numeric;
                RETURN;
        END IF;
        SELECT COALESCE(sum(j.cost_usd), 0),
               COALESCE(sum(j.budget_hold_usd) FILTER (
                   WHERE j.status = 'running' AND j.job_id <> p_job_id), 0),
               bool_or(j.cost_usd IS NULL)
          INTO v_spent, v_held, v_unknown
        FROM jobs j WHERE j.run_id = v_run;
        IF p_estimate IS NULL OR p_estimate < 0 OR v_unknown THEN
                RETURN QUERY SELECT 'unknown'::text, v_budget, v_spent,
                                    v_held;
                RETURN;
        END IF;
        IF v_spent + v_held + p_estimate > v_budget THEN
                RETURN QUERY SELECT 'over'::text, v_budget, v_spent, v_held;
                RETURN;
        END IF;
        UPDATE jobs SET budget_hold_usd = p_estimate
        WHERE job_id = p_job_id;
        RETURN QUERY SELECT 'ok'::text, v_budget, v_spent, v_held;
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
        'answer', r.answer,
        'tests', CASE WHEN r.tests_total IS NULL THEN NULL
                      ELSE jsonb_build_object('passed', r.tests_passed,
                                              'total', r.tests_total,
                                              'isolation',
                                              r.report->'tests'->'isolation')
                      END,
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
        'run_attempt', j.run_attempt)
    FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id
    WHERE j.job_id = p_job_id
$$;

-- As in 0001, with the reason code, the cached tokens and the cost.
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
                              p_notebook_bytes integer, p_topic text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET status = p_status, lease_owner = NULL,
           lease_until = NULL, finished_at = now(), finished_by = p_owner,
           updated_at = now(), reason = p_reason,
           reason_code = CASE WHEN p_status = 'succeeded' THEN NULL
                              ELSE COALESCE(p_reason_code, 'other') END,
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
                         report)
    VALUES (p_job_id, p_status, p_answer, p_tests_passed, p_tests_total,
            p_report);
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

-- The signature of 0001, for workers not yet upgraded: no reason code
-- ('other'), no cached tokens, an unknown cost.
CREATE OR REPLACE FUNCTION coderq_finish(p_job_id text, p_owner text,
                                         p_status text, p_reason text,
                                         p_turns integer, p_retries integer,
                                         p_prompt_tokens bigint,
                                         p_completion_tokens bigint,
                                         p_answer text,
                                         p_tests_passed integer,
                                         p_tests_total integer,
                                         p_report jsonb, p_notebook jsonb,
                                         p_notebook_bytes integer,
                                         p_topic text)
RETURNS text LANGUAGE sql AS $$
    SELECT coderq_finish(p_job_id, p_owner, p_status, p_reason, NULL,
                         p_turns, p_retries, p_prompt_tokens,
                         p_completion_tokens, 0, 0, NULL, p_answer,
                         p_tests_passed, p_tests_total, p_report, p_notebook,
                         p_notebook_bytes, p_topic)
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
       COALESCE(r.model, j.spec->>'model') AS model
FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id;

-- The figures of one run by model (is_total false, model NULL for jobs
-- whose model is not known yet: queued without a "model" field) and in
-- all (is_total true). Over the latest attempt of each original job (the
-- highest run_attempt among the original and its retries), or over every
-- attempt with p_all_attempts. pass_rate is succeeded over succeeded +
-- failed; cost_usd sums the known costs and cost_unknown counts the jobs
-- whose cost is unknown; reasons counts the jobs that failed or were
-- cancelled by reason code; durations are of finished jobs.
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
               is_total boolean)
LANGUAGE sql STABLE AS $$
    WITH a AS (
        SELECT j.job_id, j.status, j.reason_code, j.run_attempt, j.turns,
               j.retries, j.prompt_tokens, j.completion_tokens,
               j.cache_read_tokens, j.cache_creation_tokens, j.cost_usd,
               j.created_at, j.finished_at,
               COALESCE(r.model, j.spec->>'model') AS m,
               COALESCE(r.from_memory, false) AS from_memory,
               r.tests_passed, r.tests_total,
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
               round(count(*) FILTER (WHERE s.status = 'succeeded')::numeric
                     / NULLIF(count(*) FILTER (WHERE s.status IN
                              ('succeeded', 'failed')), 0), 4) AS pass_rate,
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
               max(s.finished_at) AS last_finished_at
        FROM s GROUP BY GROUPING SETS ((s.m), ()))
    SELECT g.m, g.jobs, g.succeeded, g.failed, g.cancelled, g.queued,
           g.running, g.pending, g.pass_rate, g.from_memory, g.retried,
           g.tests_passed, g.tests_total, g.turns, g.mean_turns, g.retries,
           g.mean_retries, g.prompt_tokens, g.completion_tokens,
           g.cache_read_tokens, g.cache_creation_tokens, g.total_tokens,
           g.cost_usd, g.cost_unknown, g.p50_duration_ms, g.p95_duration_ms,
           g.max_duration_ms, COALESCE(rc.reasons, '{}'::jsonb),
           g.first_created_at, g.last_finished_at, g.is_total
    FROM g LEFT JOIN rc ON rc.is_total = g.is_total
                       AND rc.m IS NOT DISTINCT FROM g.m
    ORDER BY g.is_total, g.m NULLS LAST
$$;

-- For people: one row per run over the latest attempt of each original
-- job; the columns of 0005 first, in their order.
DROP VIEW run_summary;
CREATE VIEW run_summary AS
SELECT r.run_id, s.jobs, s.succeeded, s.failed, s.cancelled, s.pending,
       s.pass_rate, s.mean_turns, s.mean_retries, s.prompt_tokens,
       s.completion_tokens, s.p50_duration_ms, s.p95_duration_ms,
       s.first_created_at, s.last_finished_at, s.from_memory,
       s.queued, s.running, s.retried, s.tests_passed, s.tests_total,
       s.cache_read_tokens, s.cache_creation_tokens, s.total_tokens,
       s.cost_usd, s.cost_unknown, s.max_duration_ms, s.reasons,
       b.budget_usd
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
       s.max_duration_ms, s.reasons
FROM (SELECT DISTINCT run_id FROM jobs WHERE run_id IS NOT NULL) r
CROSS JOIN LATERAL coderq_run_summary(r.run_id, false) s
WHERE NOT s.is_total;
