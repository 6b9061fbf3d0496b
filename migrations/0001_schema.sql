-- 0001_schema.sql - coderq's queue and source of truth: jobs and their
-- state machine, the conversation and cells (the checkpoint), notebooks,
-- images, results, the transactional outbox and the episodic memory.
-- Applied by `coderq migrate` in one transaction; never edit once applied:
-- add a new numbered file instead.

CREATE EXTENSION IF NOT EXISTS pg_trgm;

-- The queue. A job moves queued -> running -> succeeded | failed |
-- cancelled; running may also go back to queued (lease expired, or the
-- worker released it on shutdown). Terminal states are final.
CREATE TABLE jobs (
    job_id            text PRIMARY KEY
                      CHECK (length(job_id) BETWEEN 1 AND 128),
    status            text NOT NULL DEFAULT 'queued'
                      CHECK (status IN ('queued', 'running', 'succeeded',
                                        'failed', 'cancelled')),
    prompt            text NOT NULL,
    title             text,
    task_id           text,
    run_id            text,
    -- No foreign key: the parent's message may arrive after the child's
    -- (different Kafka partitions). A child is claimable only once a
    -- parent row exists and has succeeded.
    parent_job_id     text CHECK (parent_job_id <> job_id),
    priority          integer NOT NULL DEFAULT 0,
    spec              jsonb NOT NULL CHECK (jsonb_typeof(spec) = 'object'),
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts      integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    lease_owner       text,
    lease_until       timestamptz,
    heartbeat_at      timestamptz,
    run_after         timestamptz NOT NULL DEFAULT now(),
    cancel_requested  boolean NOT NULL DEFAULT false,
    source_topic      text,
    source_partition  integer CHECK (source_partition >= 0),
    source_offset     bigint CHECK (source_offset >= 0),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    finished_by       text,
    prompt_tokens     bigint NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens bigint NOT NULL DEFAULT 0
                      CHECK (completion_tokens >= 0),
    turns             integer NOT NULL DEFAULT 0 CHECK (turns >= 0),
    retries           integer NOT NULL DEFAULT 0 CHECK (retries >= 0),
    error             text,
    reason            text,
    CONSTRAINT jobs_attempts_capped CHECK (attempts <= max_attempts),
    -- A lease exists exactly while the job runs.
    CONSTRAINT jobs_lease_iff_running CHECK (
        (status = 'running') =
        (lease_owner IS NOT NULL AND lease_until IS NOT NULL)),
    CONSTRAINT jobs_running_was_started CHECK (
        status <> 'running' OR started_at IS NOT NULL),
    -- finished_at is set exactly for the terminal states.
    CONSTRAINT jobs_finished_iff_terminal CHECK (
        (status IN ('succeeded', 'failed', 'cancelled')) =
        (finished_at IS NOT NULL)),
    CONSTRAINT jobs_source_complete CHECK (
        (source_topic IS NULL) = (source_offset IS NULL) AND
        (source_topic IS NULL) = (source_partition IS NULL))
);

-- Claiming: queued jobs by priority, then age.
CREATE INDEX jobs_claim_idx ON jobs (priority DESC, created_at, job_id)
    WHERE status = 'queued';
-- The reaper: running jobs by lease expiry.
CREATE INDEX jobs_lease_idx ON jobs (lease_until) WHERE status = 'running';
CREATE INDEX jobs_owner_idx ON jobs (lease_owner) WHERE status = 'running';
CREATE INDEX jobs_run_idx ON jobs (run_id, created_at) WHERE run_id IS NOT NULL;
CREATE INDEX jobs_task_idx ON jobs (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX jobs_parent_idx ON jobs (parent_job_id)
    WHERE parent_job_id IS NOT NULL;

-- The conversation, one row per message (OpenAI chat message object).
CREATE TABLE job_messages (
    job_id     text NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    seq        integer NOT NULL CHECK (seq >= 1),
    role       text NOT NULL
               CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    message    jsonb NOT NULL CHECK (jsonb_typeof(message) = 'object'),
    attempt    integer NOT NULL CHECK (attempt >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- One row per executed cell; outputs are nbformat v4 output objects.
CREATE TABLE cells (
    job_id          text NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    seq             integer NOT NULL CHECK (seq >= 1),
    code            text NOT NULL,
    status          text NOT NULL
                    CHECK (status IN ('ok', 'error', 'timeout', 'died',
                                      'cancelled')),
    outputs         jsonb NOT NULL CHECK (jsonb_typeof(outputs) = 'array'),
    execution_count integer CHECK (execution_count >= 0),
    duration_ms     bigint NOT NULL DEFAULT 0 CHECK (duration_ms >= 0),
    truncated       boolean NOT NULL DEFAULT false,
    attempt         integer NOT NULL CHECK (attempt >= 1),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- The nbformat 4.5 document, rewritten after every cell. jsonb keeps it
-- queryable; the worker caps its size (CODERQ_NOTEBOOK_MAX) far below
-- jsonb's 256 MB limit, and images live in `images`, not here.
CREATE TABLE notebooks (
    job_id     text PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    doc        jsonb NOT NULL CHECK (jsonb_typeof(doc) = 'object'),
    bytes      integer NOT NULL CHECK (bytes >= 0),
    ncells     integer NOT NULL DEFAULT 0 CHECK (ncells >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE images (
    image_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     text NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    sha256     text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    mime       text NOT NULL CHECK (mime ~ '^[a-z]+/[-+.a-z0-9]+$'),
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    cell_seq   integer CHECK (cell_seq >= 1),
    bytes      integer NOT NULL CHECK (bytes >= 0),
    data       bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT images_bytes_match CHECK (octet_length(data) = bytes),
    CONSTRAINT images_unique_per_job UNIQUE (job_id, sha256)
);
-- Already compressed (PNG, JPEG): do not spend CPU on pglz.
ALTER TABLE images ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE results (
    job_id        text PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    status        text NOT NULL
                  CHECK (status IN ('succeeded', 'failed', 'cancelled')),
    answer        text,
    tests_passed  integer CHECK (tests_passed >= 0),
    tests_total   integer CHECK (tests_total >= 0),
    report        jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT results_tests_consistent CHECK (
        (tests_passed IS NULL) = (tests_total IS NULL) AND
        tests_passed <= tests_total)
);

-- Completion events waiting for Kafka's acknowledgement.
CREATE TABLE outbox (
    event_id   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq        bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    job_id     text NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    topic      text NOT NULL CHECK (topic <> ''),
    key        text NOT NULL,
    payload    jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz,
    -- One completion event per job and topic.
    CONSTRAINT outbox_one_event_per_job UNIQUE (job_id, topic)
);
CREATE INDEX outbox_unsent_idx ON outbox (seq) WHERE sent_at IS NULL;

-- Episodic memory: solved problems, looked up by trigram similarity.
CREATE TABLE solutions (
    solution_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      text UNIQUE REFERENCES jobs (job_id) ON DELETE SET NULL,
    prompt      text NOT NULL CHECK (prompt <> ''),
    code        text NOT NULL,
    answer      text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX solutions_prompt_trgm_idx ON solutions
    USING gin (prompt gin_trgm_ops);

-- The completion event of a finished job (its shape:
-- schemas/completion-event.schema.json), built from the stored rows
-- inside the transaction that finishes the job, so the event can never
-- disagree with the database.
CREATE FUNCTION coderq_completion_event(p_job_id text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'job_id', j.job_id,
        'task_id', j.task_id,
        'run_id', j.run_id,
        'status', j.status,
        'reason', j.reason,
        'answer', r.answer,
        'tests', CASE WHEN r.tests_total IS NULL THEN NULL
                      ELSE jsonb_build_object('passed', r.tests_passed,
                                              'total', r.tests_total) END,
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
        'worker', j.finished_by)
    FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id
    WHERE j.job_id = p_job_id
$$;

-- Finish a job in one statement (one round trip, one implicit
-- transaction): the job row guarded by its lease, the result, the final
-- notebook and the completion event. Returns 'finished'; 'done' when this
-- owner already finished it with this status (a retry after a lost
-- COMMIT reply); 'lost' when the lease is not this owner's (nothing
-- written).
CREATE FUNCTION coderq_finish(p_job_id text, p_owner text, p_status text,
                              p_reason text, p_turns integer,
                              p_retries integer, p_prompt_tokens bigint,
                              p_completion_tokens bigint, p_answer text,
                              p_tests_passed integer, p_tests_total integer,
                              p_report jsonb, p_notebook jsonb,
                              p_notebook_bytes integer, p_topic text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET status = p_status, lease_owner = NULL,
           lease_until = NULL, finished_at = now(), finished_by = p_owner,
           updated_at = now(), reason = p_reason, turns = p_turns,
           retries = p_retries, prompt_tokens = p_prompt_tokens,
           completion_tokens = p_completion_tokens
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

-- For people: one row per job.
CREATE VIEW job_overview AS
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
       left(r.answer, 200) AS answer_head
FROM jobs j LEFT JOIN results r ON r.job_id = j.job_id;

-- For people: one row per run.
CREATE VIEW run_summary AS
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
       max(j.finished_at) AS last_finished_at
FROM jobs j
WHERE j.run_id IS NOT NULL
GROUP BY j.run_id;
