-- 0002_wakeups.sql - wake-up hints for idle workers.
--
-- Whenever jobs become claimable, a notification on channel coderq_jobs
-- carries how many (an upper bound): new queued jobs, jobs put back in
-- the queue (lease expired, released on shutdown), and the queued
-- children of a job that just succeeded. Workers LISTEN on a connection of their own and
-- wake that many idle slots; they still poll (CODERQ_POLL_MS), since a
-- notification is only a hint: none is replayed to a listener that was
-- disconnected, and several in one transaction may be folded into one.

CREATE FUNCTION coderq_notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
        n bigint;
BEGIN
        IF TG_OP = 'INSERT' THEN
                SELECT count(*) INTO n FROM new_rows WHERE status = 'queued';
        ELSE
                SELECT count(*) INTO n
                FROM new_rows nr JOIN old_rows o USING (job_id)
                WHERE nr.status IS DISTINCT FROM o.status
                  AND nr.status = 'queued';
                SELECT n + count(*) INTO n
                FROM new_rows nr JOIN old_rows o USING (job_id)
                JOIN jobs c ON c.parent_job_id = nr.job_id
                WHERE nr.status = 'succeeded'
                  AND o.status IS DISTINCT FROM 'succeeded'
                  AND c.status = 'queued';
        END IF;
        IF n > 0 THEN
                PERFORM pg_notify('coderq_jobs', n::text);
        END IF;
        RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_insert
        AFTER INSERT ON jobs
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION coderq_notify_jobs();

CREATE TRIGGER jobs_notify_update
        AFTER UPDATE ON jobs
        REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION coderq_notify_jobs();
