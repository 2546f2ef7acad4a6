-- pgworker schema, version 5: no value may poison a queue.
-- {schema} is replaced by the quoted schema name before this file runs.
--
-- The jobs table is locked first, for the whole migration (ALTER TABLE ... ADD
-- CONSTRAINT takes this lock anyway): no enqueue, claim or outcome runs between the
-- repairs below and the constraints that keep them repaired. Each step scans the table
-- once; on a large table, migrate at a quiet moment.
LOCK TABLE {schema}.jobs, {schema}.queues IN ACCESS EXCLUSIVE MODE;

-- 1. Timestamps every claim can handle (pgworker.jobs.EARLIEST_TIMESTAMP, LATEST_TIMESTAMP).
-- One row with run_at = '-infinity' (written by SQL, a migration, a restore) made every
-- claim of its queue fail ("cannot subtract infinite timestamps"), and a run_at before
-- year 1 or after 9999 in the session's time zone cannot be read back by psycopg: the
-- claim committed, the worker lost the whole batch, and the reaper spent the attempts of
-- every job in it. The claim reads back run_at, created_at and lease_expires_at, and
-- computes with a queue's tokens_at: each must lie between 1970-01-01 and 9999-01-01 UTC.
--
-- Existing rows out of that range are kept, never deleted: each value is clamped to the
-- nearest bound (a run_at of '-infinity' becomes 1970-01-01, due now and first in line
-- as it meant; 'infinity' becomes 9999-01-01, never due in practice, as it meant), and
-- the job's audit trail (job_events, `pgworker jobs show ID`) gets a 'timestamps_clamped'
-- entry with the values as they were. A queue's out-of-range tokens_at becomes now() (its
-- bucket refills from now; a bound would have stalled it for good), noted in
-- queue_events as 'tokens_at_reset'.
WITH bad AS (
    SELECT id, run_at, created_at, lease_expires_at
    FROM {schema}.jobs
    WHERE NOT (run_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
       OR NOT (created_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
       OR NOT (lease_expires_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
), clamped AS (
    UPDATE {schema}.jobs AS j
    SET run_at = least(greatest(j.run_at, '1970-01-01 00:00:00+00'), '9999-01-01 00:00:00+00'),
        created_at = least(greatest(j.created_at, '1970-01-01 00:00:00+00'), '9999-01-01 00:00:00+00'),
        -- greatest() and least() skip NULLs: a job without a lease keeps none
        lease_expires_at = CASE WHEN j.lease_expires_at IS NOT NULL THEN
            least(greatest(j.lease_expires_at, '1970-01-01 00:00:00+00'), '9999-01-01 00:00:00+00') END
    FROM bad
    WHERE j.id = bad.id
)
INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
SELECT b.id, 'timestamps_clamped', 'pgworker migrate (schema version 5)', jsonb_strip_nulls(jsonb_build_object(
    'run_at', CASE WHEN NOT (b.run_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
                   THEN b.run_at::text END,
    'created_at', CASE WHEN NOT (b.created_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
                       THEN b.created_at::text END,
    'lease_expires_at', CASE WHEN NOT (b.lease_expires_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
                             THEN b.lease_expires_at::text END))
FROM bad AS b;

WITH bad AS (
    SELECT name, tokens_at FROM {schema}.queues
    WHERE NOT (tokens_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
), reset AS (
    UPDATE {schema}.queues AS q SET tokens_at = now() FROM bad WHERE q.name = bad.name
)
INSERT INTO {schema}.queue_events (queue, kind, actor, detail)
SELECT b.name, 'tokens_at_reset', 'pgworker migrate (schema version 5)',
       jsonb_build_object('tokens_at', b.tokens_at::text)
FROM bad AS b;

ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_run_at_range
        CHECK (run_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'),
    ADD CONSTRAINT jobs_created_at_range
        CHECK (created_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'),
    ADD CONSTRAINT jobs_lease_expires_at_range
        CHECK (lease_expires_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00');
ALTER TABLE {schema}.queues
    ADD CONSTRAINT queues_tokens_at_range
        CHECK (tokens_at BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00');
