-- Maintenance: the reaper (expired leases) and retention (pruning finished jobs).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

-- name: server_writable
-- Whether this session can write: false on a standby (pg_is_in_recovery()) or with
-- default_transaction_read_only on. The reaper asks before each pass, so a worker says
-- "read-only" even when there is nothing to reap (an empty pass writes nothing).
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off';

-- name: jobs_reap_candidates
-- Expired leases, oldest first, with what their reap needs (queue, ordering key, task,
-- attempts: the caller computes each job's retry delay from its task's retry policy, the
-- same policy as a handler's failure) and the expiry, the cursor of a reaper pass.
--
-- FOR NO KEY UPDATE SKIP LOCKED (the lock its UPDATE takes; a handler's transaction
-- holding FOR KEY SHARE on the row, as a step record's foreign key does, does not block it):
-- a row another session holds locked (an operator's open
-- transaction, App.cancel(conn=...) inside a caller's transaction) is passed over here.
-- Read without locks, such rows filled the batch, jobs_reap then skipped every one, and
-- the pass ended with nothing reaped: the expired leases behind them stayed stuck, pass
-- after pass (seen: 0 of 250 reapable leases reaped behind 1,500 older locked rows).
--
-- The cursor: a pass walks the expired leases in (lease_expires_at, id) order, each
-- batch after the last candidate of the one before (%(after_at)s, %(after_id)s; NULL for
-- the first), so the candidates a batch had to leave (key locked elsewhere, a row that
-- cannot be written) never hide the ones after them either; the next pass starts over.
-- The row comparison settles ties on id.
--
-- The running set comes from jobs_running_idx (queue) WHERE state = 'running', and the
-- expiry is read from the rows: no index holds lease_expires_at, so that a renewal can be
-- a HOT update (migration 0010). The running set is bounded by the claimers times their
-- batch (a few thousand rows however long the history), and a pass runs once per reaper
-- interval: reading each running row's lease is cheaper than an index entry written by
-- every claim and every renewal (tests/integration/test_concurrency_and_plans.py checks
-- the plan on a large table).
--
-- Lock order: this statement runs on its own (a transaction of its own on the reaper's
-- autocommit connection), so its row locks end with it, before the reap's transaction
-- (Store.reap) try-locks the candidates' ordering keys and then locks the rows again in
-- jobs_reap, which re-checks each: key locks before row locks, as in every keyed
-- transition. Read and reap in one transaction, the rows would be locked before their
-- keys; harmless while every lock here is tried or skipped (nothing waits, so nothing can
-- wait in a cycle), but the one rule would then have an exception to reason about. The
-- price is a tuple lock per candidate, for a pass that only runs when leases expired.
SELECT id, queue, ordering_key, task, attempts, lease_expires_at
FROM {schema}.jobs
WHERE state = 'running' AND lease_expires_at <= now()
  AND (lease_expires_at, id) > (coalesce(%(after_at)s::timestamptz, '-infinity'), coalesce(%(after_id)s::bigint, 0))
ORDER BY lease_expires_at, id
LIMIT %(limit)s
FOR NO KEY UPDATE SKIP LOCKED;

-- name: jobs_reap
-- Recover the given jobs whose lease expired: back to pending after the delay computed
-- for each (%(delays)s, seconds, bounded by the caller, from claim_stamp's clock as a
-- retry's: migration 0013), to dead with LEASE_EXPIRED once
-- attempts are spent, or to cancelled when a cancellation was requested. Re-checks the
-- expiry (the job may have been settled since jobs_reap_candidates); SKIP LOCKED makes
-- concurrent reapers share the work instead of colliding, and the outcome is computed
-- from the locked row. The token is not changed: the next claim increments it.
WITH expired AS (
    SELECT j.id
    FROM {schema}.jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'running' AND j.lease_expires_at <= now()
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::{schema}.job_state
                 WHEN j.attempts >= j.max_attempts THEN 'dead'::{schema}.job_state
                 ELSE 'pending'::{schema}.job_state END,
    run_at = CASE WHEN j.cancel_requested_at IS NULL AND j.attempts < j.max_attempts
                  THEN {schema}.claim_stamp(ARRAY[j.queue]) + make_interval(secs => d.delay) ELSE j.run_at END,
    finished_at = CASE WHEN j.cancel_requested_at IS NULL AND j.attempts < j.max_attempts THEN NULL ELSE now() END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    last_error_code = 'LEASE_EXPIRED',
    errors = {schema}.bounded_append(j.errors, jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'code', 'LEASE_EXPIRED',
        'message', 'lease expired at ' || j.lease_expires_at || ' without a renewal or an outcome',
        'worker', j.lease_owner), %(keep)s)
FROM expired AS e
JOIN unnest(%(ids)s::bigint[], %(delays)s::float8[]) AS d(id, delay) ON d.id = e.id
WHERE j.id = e.id
RETURNING j.id, j.queue, j.task, j.state::text AS state, j.ordering_key, j.lease_token, j.dead_blocks_key;

-- name: job_reap_failure_note
-- A job the reaper could not write (jobs_reap failed for its row alone: a CHECK
-- constraint or a trigger a user added, a value out of range): its error history says so
-- (code REAP_FAILED, the server's message), so `pgworker jobs show ID` explains a job left
-- running with an expired lease. Only the history and last_error_code change (the row
-- cannot be reaped yet); this update can fail too (a trigger refusing every update), and
-- the caller then reports the job in its log and metric only. Not fenced by a token: it is
-- the reaper's record on a row still running with an expired lease, whoever owned it.
UPDATE {schema}.jobs AS j
SET last_error_code = 'REAP_FAILED',
    errors = {schema}.bounded_append(j.errors, jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'code', 'REAP_FAILED', 'message', %(message)s::text,
        'worker', j.lease_owner), %(keep)s)
WHERE j.id = %(id)s AND j.state = 'running' AND j.lease_expires_at <= now()
RETURNING j.id;

-- name: jobs_prune
-- Retention: delete up to %(limit)s jobs of each finished state that finished longer
-- ago than that state's retention (seconds; NULL keeps them all), their audit events
-- with them (ON DELETE CASCADE, on job_events_job_idx). Succeeded jobs still holding
-- their dedupe key (dedupe_until in the future) stay. Each arm is a range scan of
-- jobs_finished_idx (state, finished_at), oldest first, so a batch costs its own rows
-- however much history is kept; SKIP LOCKED lets the pruners of several pods share the
-- work, and a row another session holds locked never hides the rows behind it. The
-- caller repeats while an arm comes back full; each batch is a short transaction.
--
-- A dead job that blocks its ordering key heads it: deleting it changes which job of the
-- key runs next, so it goes only under the key's lock, and the caller promotes the key's
-- next job afterwards (a new statement of the same transaction; the pruner once deleted
-- such heads and promoted nothing: the key's jobs stayed blocked for good, with no dead
-- row left to show why). Maintenance never waits for a key: the lock is tried
-- (pg_try_advisory_xact_lock, the lock of ordering_keys_lock) in the arm's filter, so a
-- head whose key another transaction holds is passed over this time, and the scan goes on
-- to the rows behind it. The filter runs in the scan, before FOR UPDATE locks the row:
-- the key lock comes before the row lock, as in every keyed transition (and, tried, it
-- can never wait in a cycle). CASE keeps the try-lock to the dead heads only (the planner
-- may reorder a WHERE clause's conditions, never a CASE's).
--
-- The delete itself is delete_finished_jobs (schema.sql, migration 0005): a SECURITY
-- DEFINER function that re-checks each id is finished and past the retention given, so
-- that the least-privilege worker role, which has no DELETE, may prune. It returns each
-- deleted row's state, and the key of a deleted dead head.
WITH succeeded AS (
    SELECT id FROM {schema}.jobs
    WHERE state = 'succeeded'
      AND finished_at < now() - make_interval(secs => %(succeeded_seconds)s::float8)
      AND (dedupe_until IS NULL OR dedupe_until <= now())
    ORDER BY finished_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), cancelled AS (
    SELECT id FROM {schema}.jobs
    WHERE state = 'cancelled' AND finished_at < now() - make_interval(secs => %(cancelled_seconds)s::float8)
    ORDER BY finished_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), dead AS (
    SELECT id FROM {schema}.jobs
    WHERE state = 'dead' AND finished_at < now() - make_interval(secs => %(dead_seconds)s::float8)
      AND CASE WHEN ordering_key IS NOT NULL AND dead_blocks_key
               THEN pg_try_advisory_xact_lock(hashtext(%(namespace)s), hashtext(ordering_key))
               ELSE true END
    ORDER BY finished_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
SELECT d.deleted_state, d.deleted_key
FROM {schema}.delete_finished_jobs(
    ARRAY(SELECT id FROM succeeded UNION ALL SELECT id FROM cancelled UNION ALL SELECT id FROM dead),
    %(succeeded_seconds)s::float8, %(cancelled_seconds)s::float8, %(dead_seconds)s::float8) AS d;

-- name: queue_events_prune
-- Retention of the queues' audit trail: delete up to %(limit)s events older than
-- %(older_than_seconds)s, oldest first, on queue_events_at_idx. Chosen here without a
-- lock (the least-privilege worker may read the trail, not lock it; nobody else locks an
-- event) and deleted by delete_queue_events (schema.sql, migration 0005), a SECURITY
-- DEFINER function that re-checks the age and skips events another pruner has locked.
SELECT e.id
FROM {schema}.delete_queue_events(ARRAY(
    SELECT id FROM {schema}.queue_events
    WHERE at < now() - make_interval(secs => %(older_than_seconds)s::float8)
    ORDER BY at
    LIMIT %(limit)s), %(older_than_seconds)s::float8) AS e (id);
