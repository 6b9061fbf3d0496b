-- 0005_memory_scope.sql - episodic memory kept per scope and model, and
-- a result that says when it came from memory.
--
-- A solution is recalled only inside the scope its job named, and only
-- for the same model unless the recalling job allows any model. Rows
-- remembered before this migration have no scope and are never recalled.
-- results.from_memory and results.memory_source_job are derived from the
-- report the worker stores (report->'from_memory', a boolean, and
-- report->'memory_source_job', a string), so coderq_finish() is
-- unchanged. Replaces: the view job_overview (two columns added at the
-- end), the view run_summary (one column added at the end) and the
-- function coderq_completion_event() (from_memory and memory_source_job
-- added; tests carry the isolation that ran).

ALTER TABLE solutions ADD COLUMN scope text
    CHECK (length(scope) BETWEEN 1 AND 128);
ALTER TABLE solutions ADD COLUMN model text;
CREATE INDEX solutions_scope_model_idx ON solutions (scope, model)
    WHERE scope IS NOT NULL;

ALTER TABLE results ADD COLUMN from_memory boolean GENERATED ALWAYS AS (
    COALESCE(report->'from_memory' = 'true'::jsonb, false)) STORED;
ALTER TABLE results ADD COLUMN memory_source_job text GENERATED ALWAYS AS (
    CASE WHEN jsonb_typeof(report->'memory_source_job') = 'string'
         THEN report->>'memory_source_job' END) STORED;

CREATE OR REPLACE FUNCTION coderq_completion_event(p_job_id text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'job_id', j.job_id,
        'task_id', j.task_id,
        'run_id', j.run_id,
        'status', j.status,
        'reason', j.reason,
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
        'usage', jsonb_build_object('prompt_tokens', j.prompt_tokens,
                                    'completion_tokens', j.completion_tokens),
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
        'memory_source_job', r.memory_source_job)
    FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id
    WHERE j.job_id = p_job_id
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
       r.from_memory, r.memory_source_job
FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id;

CREATE OR REPLACE VIEW run_summary AS
SELECT j.run_id,
       count(*) AS jobs,
       count(*) FILTER (WHERE j.status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE j.status = 'failed') AS failed,
       count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE j.status IN ('queued', 'running')) AS pending,
       round(count(*) FILTER (WHERE j.status = 'succeeded')::numeric /
             NULLIF(count(*) FILTER (WHERE j.status IN
                    ('succeeded', 'failed')), 0), 4) AS pass_rate,
       round(avg(j.turns) FILTER (WHERE j.finished_at IS NOT NULL), 2)
           AS mean_turns,
       round(avg(j.retries) FILTER (WHERE j.finished_at IS NOT NULL), 2)
           AS mean_retries,
       sum(j.prompt_tokens) AS prompt_tokens,
       sum(j.completion_tokens) AS completion_tokens,
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY
             extract(epoch FROM (j.finished_at - j.started_at)) * 1000))
             ::numeric, 1) AS p50_duration_ms,
       round((percentile_cont(0.95) WITHIN GROUP (ORDER BY
             extract(epoch FROM (j.finished_at - j.started_at)) * 1000))
             ::numeric, 1) AS p95_duration_ms,
       min(j.created_at) AS first_created_at,
       max(j.finished_at) AS last_finished_at,
       count(*) FILTER (WHERE r.from_memory) AS from_memory
FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id
WHERE j.run_id IS NOT NULL
GROUP BY j.run_id;
