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
-- Expired leases, oldest first, with their ordering keys, tasks and attempts. Read
-- without locks: the caller computes each job's retry delay from its task's retry policy
-- (the same policy as a handler's failure), try-locks the ordering keys (before any row
-- lock, the lock order of every keyed transition; a key held by someone else is skipped
-- this pass, never waited for), and reaps these ids with jobs_reap, which re-checks each.
SELECT id, ordering_key, task, attempts
FROM {schema}.jobs
WHERE state = 'running' AND lease_expires_at <= now()
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: jobs_reap
-- Recover the given jobs whose lease expired: back to pending after the delay computed
-- for each (%(delays)s, seconds, bounded by the caller), to dead with LEASE_EXPIRED once
-- attempts are spent, or to cancelled when a cancellation was requested. Re-checks the
-- expiry (the job may have been settled since jobs_reap_candidates); SKIP LOCKED makes
-- concurrent reapers share the work instead of colliding, and the outcome is computed
-- from the locked row. The token is not changed: the next claim increments it.
WITH expired AS (
    SELECT j.id
    FROM {schema}.jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'running' AND j.lease_expires_at <= now()
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::{schema}.job_state
                 WHEN j.attempts >= j.max_attempts THEN 'dead'::{schema}.job_state
                 ELSE 'pending'::{schema}.job_state END,
    run_at = CASE WHEN j.cancel_requested_at IS NULL AND j.attempts < j.max_attempts
                  THEN now() + make_interval(secs => d.delay) ELSE j.run_at END,
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

-- name: jobs_prune
-- Retention: delete up to %(limit)s jobs of each finished state that finished longer
-- ago than that state's retention (seconds; NULL keeps them all), their audit events
-- with them (ON DELETE CASCADE, on job_events_job_idx). Succeeded jobs still holding
-- their dedupe key (dedupe_until in the future) stay. Each arm is a range scan of
-- jobs_finished_idx (state, finished_at), oldest first, so a batch costs its own rows
-- however much history is kept; SKIP LOCKED lets the pruners of several pods share the
-- work. The caller repeats while an arm comes back full; each batch is a short
-- transaction.
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
    ORDER BY finished_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.jobs
WHERE id = ANY (ARRAY(SELECT id FROM succeeded UNION ALL SELECT id FROM cancelled UNION ALL SELECT id FROM dead))
RETURNING state::text;

-- name: queue_events_prune
-- Retention of the queues' audit trail: delete up to %(limit)s events older than
-- %(older_than_seconds)s, oldest first, on queue_events_at_idx.
DELETE FROM {schema}.queue_events
WHERE id IN (
    SELECT id FROM {schema}.queue_events
    WHERE at < now() - make_interval(secs => %(older_than_seconds)s::float8)
    ORDER BY at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id;
