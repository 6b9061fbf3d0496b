-- 0008_image_names.sql - a figure under every name it was stored under
-- (docs/JOBS.md#results-in-postgresql). The model is asked to save each
-- figure and show it; the bytes it saves as revenue.png are the bytes
-- the cell showed as cell3-1.png, and images keeps bytes once per job,
-- so the name the answer gives was lost. Now images still holds the
-- bytes once, and image_names every name they were stored under, each
-- with its own mime type and the cell that showed the figure or after
-- which the file appeared (cell_seq, NULL when not known).
--
-- images keeps its columns: its name, mime and cell_seq are those of the
-- first name its bytes were stored under. A trigger names each images row
-- as it is inserted, so a worker not yet upgraded (which inserts into
-- images alone) keeps the names it kept before; the bytes it finds
-- stored already get no second name from it.
--
-- Replaces: coderq_completion_event() (images: one entry per name, in the
-- order the names were stored, with cell_seq) and job_overview (images
-- counts names, as the event lists them and coderq export writes them).

CREATE TABLE image_names (
    image_id   bigint NOT NULL REFERENCES images (image_id) ON DELETE CASCADE,
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    mime       text NOT NULL CHECK (mime ~ '^[a-z]+/[-+.a-z0-9]+$'),
    cell_seq   integer CHECK (cell_seq >= 1),
    -- the order names were stored in
    name_id    bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (image_id, name)
);

-- The names of the images stored so far: each its first and only one.
INSERT INTO image_names (image_id, name, mime, cell_seq, created_at)
SELECT image_id, name, mime, cell_seq, created_at FROM images
ORDER BY image_id;

CREATE FUNCTION coderq_image_first_name() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO image_names (image_id, name, mime, cell_seq)
    VALUES (NEW.image_id, NEW.name, NEW.mime, NEW.cell_seq)
    ON CONFLICT (image_id, name) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER images_first_name AFTER INSERT ON images
    FOR EACH ROW EXECUTE FUNCTION coderq_image_first_name();

-- As in 0007, with every name of every image.
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
                                'name', n.name, 'mime', n.mime,
                                'sha256', i.sha256, 'bytes', i.bytes,
                                'cell_seq', n.cell_seq)
                                ORDER BY n.name_id)
                            FROM images i
                            JOIN image_names n ON n.image_id = i.image_id
                            WHERE i.job_id = j.job_id),
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

-- As in 0007; images counts names.
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
       (SELECT count(*) FROM images i
        JOIN image_names n ON n.image_id = i.image_id
        WHERE i.job_id = j.job_id) AS images,
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
