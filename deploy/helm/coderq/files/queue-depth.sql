-- The jobs the workers of one release should be busy with: those a
-- worker could claim now (queued, run_after passed) and those running,
-- over the queues the workers serve, from the view queue_depth
-- (migrations/0007_evaluation.sql). Jobs held back (waiting: a parent
-- not done, a retry's delay) are left out: no worker can take them yet.
-- The chart puts the comma-separated queue names in place of the quoted
-- marker; tests/check_it_autoscale.c binds them as a parameter instead.
-- One bigint row, never NULL, as KEDA's postgresql scaler reads it.
SELECT COALESCE(sum(queued + running), 0)::bigint AS jobs
FROM queue_depth
WHERE queue = ANY (string_to_array('@QUEUES@', ','))
