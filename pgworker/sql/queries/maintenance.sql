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
-- Expired leases, oldest first, with their ordering keys. Read without locks: the
-- caller then takes the ordering-key locks (before any row lock, the lock order of every
-- keyed transition) and reaps these ids with jobs_reap, which re-checks each one.
SELECT id, ordering_key
FROM {schema}.jobs
WHERE state = 'running' AND lease_expires_at <= now()
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: jobs_reap
-- Recover the given jobs whose lease expired: back to pending after a backoff with
-- jitter, to dead with LEASE_EXPIRED once attempts are spent, or to cancelled when a
-- cancellation was requested. Re-checks the expiry (the job may have been settled since
-- jobs_reap_candidates); SKIP LOCKED makes concurrent reapers share the work instead of
-- colliding. The token is not changed: the next claim increments it.
WITH expired AS (
    SELECT id
    FROM {schema}.jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running' AND lease_expires_at <= now()
    FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT j.id,
           CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::{schema}.job_state
                WHEN j.attempts >= j.max_attempts THEN 'dead'::{schema}.job_state
                ELSE 'pending'::{schema}.job_state END AS next_state
    FROM {schema}.jobs AS j JOIN expired USING (id)
)
UPDATE {schema}.jobs AS j
SET state = d.next_state,
    run_at = CASE WHEN d.next_state = 'pending'
                  THEN now() + make_interval(secs => least(%(backoff_max_seconds)s::float8,
                           %(backoff_base_seconds)s::float8 * power(2.0, greatest(j.attempts - 1, 0)))
                           * (1.0 - %(backoff_jitter)s::float8 * random()))
                  ELSE j.run_at END,
    finished_at = CASE WHEN d.next_state = 'pending' THEN NULL ELSE now() END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    last_error_code = 'LEASE_EXPIRED',
    errors = {schema}.bounded_append(j.errors, jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'code', 'LEASE_EXPIRED',
        'message', 'lease expired at ' || j.lease_expires_at || ' without a renewal or an outcome',
        'worker', j.lease_owner), %(keep)s)
FROM decided AS d
WHERE j.id = d.id
RETURNING j.id, j.queue, j.task, j.state::text AS state, j.ordering_key, j.lease_token, j.dead_blocks_key;

-- name: jobs_prune
-- Delete up to %(limit)s succeeded and cancelled jobs that finished more than
-- %(older_than_seconds)s ago (their events go with them), except succeeded jobs still
-- holding their dedupe key (dedupe_until in the future). Bounded, so each batch is a
-- short transaction; the caller loops.
DELETE FROM {schema}.jobs
WHERE id IN (
    SELECT id FROM {schema}.jobs
    WHERE state IN ('succeeded', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(older_than_seconds)s::float8)
      AND (dedupe_until IS NULL OR dedupe_until <= now())
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id;
