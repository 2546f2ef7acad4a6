-- The lease and the fenced outcomes of an attempt (the contract: pgworker/worker/lease.py).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.
--
-- Every transition after the claim is guarded by id + state + lease_token (the fence);
-- renewals also require an unexpired lease. Zero rows = the write was refused. An
-- outcome is accepted after its lease expired as long as the row is still running under
-- the same token (nobody else can own it until the reaper moves it): the rules are the
-- lease contract's, in pgworker/worker/lease.py.
--
-- A cancellation requested while the job ran (cancel_requested_at) ends it cancelled
-- whatever the attempt's outcome, success apart: a failure, a snooze or a release would
-- otherwise put it back to pending, and the next claim would run it again. Each such
-- CASE reads the row being updated (the latest version, re-read if it changed while we
-- waited for its lock), not a snapshot taken earlier in the statement.
--
-- The batched fenced writes compare `j.state::text = 'running'` on purpose. Written
-- `j.state = 'running'`, the condition matches the predicate of jobs_running_idx,
-- and the planner (which estimates the running set of the whole table at about one row,
-- and an unnest() of a parameter at ten) scans every running lease of every worker and
-- re-runs the unnest for each: the cost grows with running leases x batch size (5 ms
-- for a batch of 100 beside 400 other running jobs, 200 ms for 1000). Compared as text
-- the index cannot apply, and each row is found by its primary key: linear in the batch.

-- name: job_renew
-- Extend live leases by %(lease_seconds)s from now. Fenced: only rows still running
-- under the same token with an unexpired lease (an expired lease is never revived: the
-- pod has told its handler it may be lost). Rows not returned lost their lease. Returns
-- whether a cancellation was requested, so the worker learns of it, and the new expiry
-- (Unix seconds, database clock).
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8),
    heartbeat_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
  AND j.lease_expires_at > now()
RETURNING j.id, j.lease_token, j.cancel_requested_at IS NOT NULL AS cancel_requested,
          extract(epoch FROM j.lease_expires_at)::float8 AS expires_at;

-- name: job_renew_skip_locked
-- The pod's renewer: job_renew for many leases at once that never waits on a row. A
-- row another session holds locked (an operator's open transaction, App.cancel(conn=...)
-- inside a caller's transaction, an outcome write in flight) is skipped, not waited for:
-- one locked row once held the whole batch until the pass timed out, and every lease of
-- the pod lapsed. Each row returned says whether it was renewed or skipped; a lease
-- with no row was refused (lost). `locked` is referenced twice, so PostgreSQL
-- materializes it (its rows are locked once); FOR UPDATE re-checks the fence on the
-- row's latest version. A skipped row is fenced as the snapshot saw it, so a lease whose
-- locker is taking the job away (the reaper) reads as skipped once, and as refused on
-- the next pass. Compared as text, as below, for the same reason as the outcome writes.
WITH f AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
), locked AS (
    SELECT j.id, j.lease_token FROM {schema}.jobs AS j JOIN f ON j.id = f.id
    WHERE j.state::text = 'running' AND j.lease_token = f.token AND j.lease_expires_at > now()
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE {schema}.jobs AS j
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8),
        heartbeat_at = now()
    FROM locked AS l
    WHERE j.id = l.id AND j.state::text = 'running' AND j.lease_token = l.lease_token
    RETURNING j.id, j.lease_token, j.cancel_requested_at IS NOT NULL AS cancel_requested,
              extract(epoch FROM j.lease_expires_at)::float8 AS expires_at
)
SELECT id, lease_token, cancel_requested, expires_at, false AS skipped FROM renewed
UNION ALL
SELECT j.id, j.lease_token, NULL, NULL, true FROM {schema}.jobs AS j JOIN f ON j.id = f.id
WHERE j.state::text = 'running' AND j.lease_token = f.token AND j.lease_expires_at > now()
  AND j.id NOT IN (SELECT id FROM locked);

-- name: job_progress
-- A running job's progress (ctx.progress): a fraction 0-1 and a short message, bounded
-- by the caller and by CHECK constraints. Fenced like an outcome (id + state + token):
-- no row means the lease was lost, and the worker's handler is told so. Also a
-- heartbeat (heartbeat_at). Kept by the job after it finishes, for `pgworker jobs show`.
-- Returns whether an operator asked the job to stop (cancel_requested_at): a handler that
-- reports progress sees a cancel at its next write, not at the renewer's next tick (a
-- third of the lease).
UPDATE {schema}.jobs AS j
SET progress = %(progress)s::real, progress_message = %(message)s::text, progress_at = now(),
    heartbeat_at = now()
WHERE j.id = %(id)s AND j.state = 'running' AND j.lease_token = %(token)s
RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested;

-- name: job_complete
-- Record successes, and what each handler returned. Fenced by id + state + token,
-- expired lease or not (the token proves ownership while the row is still running: a
-- late success is kept, not run again). Rows not returned were refused by the fence and
-- stay untouched, and so is their result: a result is inserted only for a row this
-- statement moved to succeeded (`done`), so a stale worker's result is never stored. A
-- job with a dedupe_window keeps its dedupe key held until dedupe_until (it stays in the
-- unique index); the others release it (a succeeded row without dedupe_until leaves the
-- index). %(has_result)s says whether a row is written to job_results; %(results)s is its
-- JSON text (NULL with has_result: the result was lost, see the migration). A job that
-- returned nothing gets no row, so the common case costs job_results nothing.
-- Once anything completed, one NOTIFY on %(results_channel)s (empty payload; delivered
-- at commit) wakes App.wait_result callers, who re-read their own job: the uncorrelated
-- subquery runs once per statement, not per row, and a statement that completed nothing
-- sends nothing.
WITH f AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(has_result)s::boolean[],
                         %(results)s::text[]) AS f(id, token, has_result, result)
), done AS (
    UPDATE {schema}.jobs AS j
    SET state = 'succeeded',
        finished_at = now(),
        lease_owner = NULL,
        lease_expires_at = NULL,
        dedupe_until = CASE WHEN j.dedupe_key IS NOT NULL THEN now() + j.dedupe_window END
    FROM f
    WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
    RETURNING j.id, j.lease_token, j.ordering_key, f.has_result, f.result, j.has_children
), children_locked AS (
    -- The dependents of this statement's parents, locked in id order before the
    -- dependency trigger (job_dependencies_settle, an AFTER ROW trigger: it fires at the
    -- end of this statement, parent by parent in the update's order) updates them. Two
    -- claimers whose batches share children then queue on the first shared child instead
    -- of locking them in opposite orders (DeadlockDetected, or lock waits up to
    -- lock_timeout while the batch's leases expired unrenewed). Costs nothing for a batch
    -- without parents: the array of parents is empty, and nothing is probed. (Arrays, not
    -- a join: the children are found through the edges' and the jobs' primary keys
    -- whatever the planner thinks of the table sizes, never by a scan of jobs.)
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {schema}.jobs AS c
        WHERE c.id = ANY (ARRAY(SELECT d.child_id FROM {schema}.job_dependencies AS d
                                WHERE d.parent_id = ANY (ARRAY(SELECT id FROM done WHERE has_children))))
        ORDER BY c.id
        FOR NO KEY UPDATE OF c
    ) AS l
), stored AS (
    INSERT INTO {schema}.job_results (job_id, result)
    SELECT id, result::jsonb FROM done WHERE has_result
    ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, stored_at = now()
    RETURNING job_id
)
SELECT id, lease_token, ordering_key FROM done
WHERE (SELECT count(pg_notify(%(results_channel)s, '')) FROM (SELECT 1 FROM done LIMIT 1) AS any_done) >= 0
  AND (SELECT n FROM children_locked) >= 0;

-- name: job_fail
-- Record failed attempts. Each goes back to pending at claim_stamp's clock + its delay
-- (the task's backoff, computed and bounded by the caller; the stamp under its queue's
-- bucket lock, migration 0013), to dead when the failure is permanent or its attempts
-- are spent, or to cancelled when a cancellation was requested. Fenced by id + state +
-- token. The error joins a history bounded to %(keep)s entries, with the handler's
-- traceback when the worker kept one.
UPDATE {schema}.jobs AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::{schema}.job_state
                 WHEN f.permanent OR j.attempts >= j.max_attempts THEN 'dead'::{schema}.job_state
                 ELSE 'pending'::{schema}.job_state END,
    run_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR f.permanent OR j.attempts >= j.max_attempts
                  THEN j.run_at ELSE {schema}.claim_stamp(ARRAY[j.queue]) + make_interval(secs => f.delay) END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR f.permanent OR j.attempts >= j.max_attempts
                       THEN now() END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    last_error_code = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'CANCELLED' ELSE f.code END,
    errors = {schema}.bounded_append(j.errors, jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'code', f.code, 'message', f.message,
        'worker', j.lease_owner) || jsonb_strip_nulls(jsonb_build_object('traceback', f.traceback)), %(keep)s)
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[],
            %(permanent)s::boolean[], %(codes)s::text[], %(messages)s::text[], %(tracebacks)s::text[])
     AS f(id, token, delay, permanent, code, message, traceback)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
RETURNING j.id, j.lease_token, j.state::text AS state, j.ordering_key, j.dead_blocks_key;

-- name: job_release
-- Hand running jobs back to pending without spending an attempt (shutdown, a job whose
-- lease was lost before it started); the job keeps its place in line, its old run_at,
-- so its queue's claim epoch is bumped (claim_backdate, migration 0013: a claimer's
-- floor may be past it). A job whose cancellation was requested ends cancelled instead.
-- Fenced by id + state + token.
WITH released AS (
    UPDATE {schema}.jobs AS j
    SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::{schema}.job_state
                     ELSE 'pending'::{schema}.job_state END,
        attempts = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.attempts ELSE greatest(j.attempts - 1, 0) END,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() END,
        last_error_code = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'CANCELLED' ELSE j.last_error_code END,
        lease_owner = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
    WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
    RETURNING j.id, j.queue, j.lease_token, j.state::text AS state, j.ordering_key, j.blocked
), backdated AS (
    SELECT {schema}.claim_backdate(ARRAY(SELECT DISTINCT queue FROM released
                                         WHERE state = 'pending' AND NOT blocked)) AS n
)
SELECT id, lease_token, state, ordering_key FROM released
WHERE (SELECT n FROM backdated) >= 0;

-- name: job_snooze
-- Run jobs again after a delay without spending an attempt (counted from claim_stamp's
-- clock, as a retry's); a job whose cancellation was requested ends cancelled instead
-- (cancel beats snooze). Fenced by id + state + token.
UPDATE {schema}.jobs AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::{schema}.job_state
                 ELSE 'pending'::{schema}.job_state END,
    attempts = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.attempts ELSE greatest(j.attempts - 1, 0) END,
    run_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.run_at
                  ELSE {schema}.claim_stamp(ARRAY[j.queue]) + make_interval(secs => f.delay) END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() END,
    last_error_code = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'CANCELLED' ELSE j.last_error_code END,
    lease_owner = NULL,
    lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[]) AS f(id, token, delay)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
RETURNING j.id, j.lease_token, j.state::text AS state, j.ordering_key;

-- name: job_cancel_finish
-- A running job whose cancellation was requested ended: record it cancelled.
-- Fenced by id + state + token.
UPDATE {schema}.jobs AS j
SET state = 'cancelled',
    finished_at = now(),
    lease_owner = NULL,
    lease_expires_at = NULL,
    last_error_code = 'CANCELLED'
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
RETURNING j.id, j.lease_token, j.ordering_key;

-- name: job_lease_states
-- Where these jobs stand now: after a connection failed mid-write, tells a worker
-- whether its write committed before the reply was lost.
SELECT id, state::text, lease_token, last_error_code FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]);
