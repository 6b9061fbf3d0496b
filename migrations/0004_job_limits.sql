-- 0004_job_limits.sql - limits that hold over a whole job, not per
-- attempt: the running time of every attempt is summed in run_ms, so a
-- resumed job's job_timeout_s counts the time its earlier attempts ran.
--
-- claimed_at is when the current attempt was claimed (NULL while the job
-- is not running). When a job leaves 'running' (finished, released,
-- given back, or requeued after its lease expired) the attempt's time is
-- added to run_ms: up to now, or, for an expired lease, up to the last
-- heartbeat (the worker is presumed dead since then). A trigger does it so
-- that every path out of 'running' is counted, present and future.

ALTER TABLE jobs
    ADD COLUMN claimed_at timestamptz,
    ADD COLUMN run_ms bigint NOT NULL DEFAULT 0 CHECK (run_ms >= 0);

CREATE FUNCTION coderq_account_run_time() RETURNS trigger
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
        END IF;
        RETURN NEW;
END
$$;

CREATE TRIGGER jobs_run_time
        BEFORE UPDATE OF status ON jobs
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION coderq_account_run_time();
