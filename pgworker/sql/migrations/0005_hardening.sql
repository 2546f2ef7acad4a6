-- pgworker schema, version 5: no value may poison a queue, no key stays stranded, and a
-- least-privilege worker may prune.
-- {schema} is replaced by the quoted schema name before this file runs.
--
-- The jobs table is locked first, for the whole migration (ALTER TABLE ... ADD
-- CONSTRAINT takes this lock anyway): no enqueue, claim or outcome runs between the
-- repairs below and the constraints that keep them repaired. Each step scans the table
-- once; on a large table, migrate at a quiet moment.
LOCK TABLE {schema}.jobs, {schema}.queues IN ACCESS EXCLUSIVE MODE;

-- 1. Timestamps every claim can handle (pgworker.jobs.EARLIEST_TIMESTAMP says so too).
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

-- 2. Ordering keys stranded by the defects this version fixes (a batch enqueue whose job
-- was refused by its dedupe key, the pruner deleting a dead head: each changed which job
-- heads a key without promoting the next one). A key whose head, its oldest unfinished
-- job, is pending and blocked while nothing of the key is active can never move again;
-- no correct transition leaves one (each promotes in the transaction that changes the
-- head), and with the table locked no transaction is half done. Each such head is
-- promoted, as ordering_keys_promote would have, and the job's audit trail says so
-- ('promoted'). The heads are found as ordering_keys_promote finds them (DISTINCT ON
-- over jobs_ordering_key_idx's order).
WITH heads AS (
    SELECT DISTINCT ON (ordering_key) id, ordering_key, state, blocked
    FROM {schema}.jobs
    WHERE ordering_key IS NOT NULL
      AND (state IN ('pending', 'running') OR (state = 'dead' AND dead_blocks_key))
    ORDER BY ordering_key, id
), stranded AS (
    SELECT h.id FROM heads AS h
    WHERE h.state = 'pending' AND h.blocked
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.jobs AS a
          WHERE a.ordering_key = h.ordering_key
            AND (a.state = 'running' OR (a.state = 'pending' AND NOT a.blocked)))
), promoted AS (
    UPDATE {schema}.jobs AS j SET blocked = false FROM stranded WHERE j.id = stranded.id RETURNING j.id
)
INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
SELECT p.id, 'promoted', 'pgworker migrate (schema version 5)',
       jsonb_build_object('reason', 'the head of its ordering key was blocked with nothing of the key active')
FROM promoted AS p;

-- 3. Retention for a role without DELETE (the least-privilege worker of `pgworker sql
-- grants --worker`, whose pruner, on by default, could only log an ERROR and stop).
-- SECURITY DEFINER: these run as the schema's owner (the role that migrates), and what
-- they may delete is fixed here, so EXECUTE can be granted to a role that may not DELETE:
-- of the ids given, only jobs that are finished (succeeded without a live dedupe hold,
-- cancelled, dead) longer ago than the caller's retention for their state (NULL keeps the
-- state), and audit events older than the caller's retention. The caller chooses which
-- rows and locks them (jobs_prune, queue_events_prune in sql/queries/maintenance.sql,
-- with the ordering-key locks a dead head needs); these re-check and delete. search_path
-- fixed to the schema itself (only its owner may create objects in it) with pg_temp last,
-- so no caller's object can stand in for one named here (PostgreSQL docs, CREATE
-- FUNCTION, "Writing SECURITY DEFINER Functions Safely"); EXECUTE revoked from PUBLIC.
CREATE FUNCTION {schema}.delete_finished_jobs(ids bigint[], succeeded_seconds double precision,
                                              cancelled_seconds double precision, dead_seconds double precision)
RETURNS TABLE (deleted_state text, deleted_key text)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    DELETE FROM jobs AS j
    WHERE j.id = ANY (ids)
      AND ((j.state = 'succeeded' AND j.finished_at < now() - make_interval(secs => succeeded_seconds)
            AND (j.dedupe_until IS NULL OR j.dedupe_until <= now()))
        OR (j.state = 'cancelled' AND j.finished_at < now() - make_interval(secs => cancelled_seconds))
        OR (j.state = 'dead' AND j.finished_at < now() - make_interval(secs => dead_seconds)))
    -- the key of a dead job that headed it: the caller promotes its next job
    RETURNING j.state::text, CASE WHEN j.state = 'dead' AND j.dead_blocks_key THEN j.ordering_key END
$$;
REVOKE ALL ON FUNCTION {schema}.delete_finished_jobs(bigint[], double precision, double precision,
                                                     double precision) FROM PUBLIC;

CREATE FUNCTION {schema}.delete_queue_events(ids bigint[], older_than_seconds double precision)
RETURNS SETOF bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    -- SKIP LOCKED: the pruners of several pods may have chosen the same events
    DELETE FROM queue_events AS e
    WHERE e.id IN (SELECT x.id FROM queue_events AS x
                   WHERE x.id = ANY (ids) AND x.at < now() - make_interval(secs => older_than_seconds)
                   FOR UPDATE SKIP LOCKED)
    RETURNING e.id
$$;
REVOKE ALL ON FUNCTION {schema}.delete_queue_events(bigint[], double precision) FROM PUBLIC;
