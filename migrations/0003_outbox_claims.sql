-- 0003_outbox_claims.sql - one relay per outbox row, and a failed state.
--
-- A relay claims the rows it produces (claimed_by, claimed_until) with
-- FOR UPDATE SKIP LOCKED: another relay skips a row while its claim runs,
-- so a fleet of relays produces each completion event once. A claim
-- outlives the producer's message timeout; it is released (with a
-- growing backoff in claimed_until) when a delivery fails for a reason a
-- retry can fix, and a relay that dies holding claims leaves them to
-- expire, after which another relay takes the rows over.
--
-- A row whose delivery can never succeed (a message the broker refuses
-- for its size, a topic it refuses) is marked failed: failed_at and the
-- error, left for an operator, and no longer holds back the rows behind
-- it. `UPDATE outbox SET failed_at = NULL, error = NULL WHERE ...` makes
-- such a row eligible again.

ALTER TABLE outbox
    ADD COLUMN claimed_by    text,
    ADD COLUMN claimed_until timestamptz,
    ADD COLUMN attempts      integer NOT NULL DEFAULT 0
        CHECK (attempts >= 0),
    ADD COLUMN failed_at     timestamptz,
    ADD COLUMN error         text,
    ADD CONSTRAINT outbox_sent_or_failed
        CHECK (sent_at IS NULL OR failed_at IS NULL);

-- The rows a relay may still produce, in order.
DROP INDEX outbox_unsent_idx;
CREATE INDEX outbox_pending_idx ON outbox (seq)
    WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX outbox_failed_idx ON outbox (failed_at)
    WHERE failed_at IS NOT NULL;
