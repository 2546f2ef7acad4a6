-- Every statement pgworker runs, one named block each. The name is reused as the
-- span suffix, the metric `operation` label and the log `action`.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Lease arithmetic uses the database clock (now()), never the worker's.
-- Every transition after the claim is guarded by id + state + lease_token (the fence);
-- renew and complete also require an unexpired lease. Zero rows = the lease is lost.
--
-- The batched fenced writes compare `j.state::text = 'running'` on purpose. Written
-- `j.state = 'running'`, the condition matches the predicate of jobs_lease_expiry_idx,
-- and the planner (which estimates the running set of the whole table at about one row,
-- and an unnest() of a parameter at ten) scans every running lease of every worker and
-- re-runs the unnest for each: the cost grows with running leases x batch size (5 ms
-- for a batch of 100 beside 400 other running jobs, 200 ms for 1000). Compared as text
-- the index cannot apply, and each row is found by its primary key: linear in the batch.

-- name: job_insert
-- Insert one job. A duplicate dedupe_key inserts nothing (the caller then looks up the
-- job holding it); this never raises, so the caller's transaction survives. A job that
-- is due now and unblocked wakes listeners: NOTIFY is delivered at commit, never on rollback.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, run_at, max_attempts,
                               dedupe_key, ordering_key, blocked, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
            coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
            %(max_attempts)s, %(dedupe_key)s, %(ordering_key)s::text,
            %(ordering_key)s::text IS NOT NULL AND EXISTS (
                SELECT 1 FROM {schema}.jobs o
                WHERE o.ordering_key = %(ordering_key)s::text
                  AND o.state IN ('pending', 'running', 'dead')),
            %(trace_context)s::jsonb)
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running')
    DO NOTHING
    RETURNING id, run_at, blocked
)
SELECT id,
       (CASE WHEN run_at <= now() AND NOT blocked
             THEN pg_notify(%(channel)s, %(notify_payload)s) END) IS NULL AS notified
FROM ins;

-- name: job_ids_allocate
-- Reserve ids for a bulk insert, so COPY (which cannot return them) still reports them,
-- and read the database clock for the batch's run_at.
SELECT nextval(%(sequence)s::regclass), now() FROM generate_series(1, %(count)s);

-- name: jobs_insert_many
-- Bulk insert with dedupe and ordering keys (the COPY path takes the rest). Ids were
-- reserved by job_ids_allocate. Within the batch, later jobs of a key wait behind the first.
INSERT INTO {schema}.jobs (id, queue, task, payload, priority, run_at, max_attempts,
                           dedupe_key, ordering_key, blocked, trace_context)
SELECT b.id, b.queue, b.task, b.payload, b.priority, b.run_at, b.max_attempts,
       b.dedupe_key, b.ordering_key,
       b.ordering_key IS NOT NULL AND (
           row_number() OVER (PARTITION BY b.ordering_key ORDER BY b.id) > 1
           OR EXISTS (SELECT 1 FROM {schema}.jobs o
                      WHERE o.ordering_key = b.ordering_key
                        AND o.state IN ('pending', 'running', 'dead'))),
       b.trace_context
FROM unnest(%(ids)s::bigint[], %(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[],
            %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(max_attempts)s::int[],
            %(dedupe_keys)s::text[], %(ordering_keys)s::text[], %(trace_contexts)s::jsonb[])
     AS b(id, queue, task, payload, priority, run_at, max_attempts, dedupe_key, ordering_key, trace_context)
ORDER BY b.id
ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running')
DO NOTHING
RETURNING id, run_at <= now() AND NOT blocked AS due;

-- name: jobs_by_dedupe_key
-- The active jobs holding these dedupe keys (after an insert that found duplicates).
SELECT dedupe_key, id FROM {schema}.jobs
WHERE dedupe_key = ANY(%(keys)s::text[]) AND state IN ('pending', 'running');

-- name: queues_notify
-- One wake-up per queue for a bulk insert (NOTIFY is delivered at commit).
SELECT pg_notify(%(channel)s, n.payload) IS NULL
FROM unnest(%(payloads)s::text[]) AS n(payload);

-- name: ordering_keys_lock
-- Serialise writers of the same ordering keys until commit: enqueue (which decides
-- whether a new job waits) and the transitions that promote the next job. Locks are
-- taken in hash order so two writers never wait on each other in a cycle.
SELECT count(pg_advisory_xact_lock(hashtext(%(namespace)s), k.h))
FROM (SELECT DISTINCT hashtext(key) AS h FROM unnest(%(keys)s::text[]) AS key ORDER BY 1) AS k;

-- name: ordering_keys_promote
-- Unblock the head of each key: its oldest unfinished job, when that job is pending
-- and still blocked. Idempotent. Runs after ordering_keys_lock, in a new statement, so
-- its snapshot includes every job committed by writers that held the lock before us.
WITH heads AS (
    SELECT DISTINCT ON (h.ordering_key) h.id, h.state, h.blocked
    FROM {schema}.jobs h
    WHERE h.ordering_key = ANY(%(keys)s::text[])
      AND h.state IN ('pending', 'running', 'dead')
    ORDER BY h.ordering_key, h.id
), promoted AS (
    UPDATE {schema}.jobs AS j
    SET blocked = false
    FROM heads
    WHERE j.id = heads.id AND heads.state = 'pending' AND heads.blocked
    RETURNING j.id, j.queue, j.run_at
)
SELECT p.id, p.queue,
       (CASE WHEN p.run_at <= now() THEN pg_notify(%(channel)s, p.queue) END) IS NULL AS notified
FROM promoted AS p;

-- name: job_claim
-- Claim up to %(limit)s due jobs of one queue in claim order (priority DESC, run_at,
-- id) and lease them for %(lease_seconds)s. FOR UPDATE SKIP LOCKED sits inside the CTE,
-- where rows are chosen: concurrent claimers skip each other's rows instead of waiting
-- (PostgreSQL docs, SELECT, "The Locking Clause"). The WHERE clause repeats the partial
-- index predicate so the planner can use jobs_claim_idx. Each claim increments attempts
-- and the fencing token; the caller commits at once and runs the jobs outside any
-- transaction.
WITH candidate AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        lease_token = j.lease_token + 1,
        lease_owner = %(owner)s,
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8),
        started_at = now(),
        heartbeat_at = now(),
        cancel_requested_at = NULL
    FROM candidate
    WHERE j.id = candidate.id
    RETURNING j.id, j.queue, j.task, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease_token, j.lease_expires_at, j.run_at, j.created_at, j.trace_context,
              j.ordering_key, j.dedupe_key,
              extract(epoch FROM now() - j.run_at)::float8 AS wait_seconds
)
-- UPDATE ... RETURNING follows the join's order, not the CTE's: sort again so the
-- batch runs in claim order.
SELECT * FROM claimed ORDER BY priority DESC, run_at, id;

-- name: job_renew
-- Extend live leases by %(lease_seconds)s from now. Fenced: only rows still running
-- under the same token with an unexpired lease. Rows not returned lost their lease.
-- Returns whether a cancellation was requested, so the worker learns of it.
UPDATE {schema}.jobs AS j
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8),
    heartbeat_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
  AND j.lease_expires_at > now()
RETURNING j.id, j.lease_token, j.cancel_requested_at IS NOT NULL AS cancel_requested;

-- name: job_complete
-- Record successes. Fenced by id + state + token + unexpired lease; rows not returned
-- were refused by the fence (the lease was lost) and stay untouched.
UPDATE {schema}.jobs AS j
SET state = 'succeeded',
    finished_at = now(),
    lease_owner = NULL,
    lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
  AND j.lease_expires_at > now()
RETURNING j.id, j.lease_token, j.ordering_key;

-- name: job_fail
-- Record failed attempts. Each goes back to pending at now() + its delay (the retry
-- policy's backoff, computed by the caller), or to dead when the failure is permanent
-- or its attempts are spent. Fenced by id + state + token. The error joins a history
-- bounded to %(keep)s entries.
UPDATE {schema}.jobs AS j
SET state = CASE WHEN f.permanent OR j.attempts >= j.max_attempts
                 THEN 'dead'::{schema}.job_state ELSE 'pending'::{schema}.job_state END,
    run_at = CASE WHEN f.permanent OR j.attempts >= j.max_attempts
                  THEN j.run_at ELSE now() + make_interval(secs => f.delay) END,
    finished_at = CASE WHEN f.permanent OR j.attempts >= j.max_attempts THEN now() END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    last_error_code = f.code,
    errors = {schema}.bounded_append(j.errors, jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'code', f.code, 'message', f.message,
        'worker', j.lease_owner), %(keep)s)
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[],
            %(permanent)s::boolean[], %(codes)s::text[], %(messages)s::text[])
     AS f(id, token, delay, permanent, code, message)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
RETURNING j.id, j.lease_token, j.state::text AS state, j.ordering_key;

-- name: job_release
-- Hand running jobs back to pending without spending an attempt (shutdown, a claimer
-- that will not start them). The job keeps its place in line. Fenced by id + state + token.
UPDATE {schema}.jobs AS j
SET state = 'pending',
    attempts = greatest(j.attempts - 1, 0),
    lease_owner = NULL,
    lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS f(id, token)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
RETURNING j.id, j.lease_token;

-- name: job_snooze
-- Run jobs again after a delay without spending an attempt. Fenced by id + state + token.
UPDATE {schema}.jobs AS j
SET state = 'pending',
    attempts = greatest(j.attempts - 1, 0),
    run_at = now() + make_interval(secs => f.delay),
    lease_owner = NULL,
    lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[]) AS f(id, token, delay)
WHERE j.id = f.id AND j.state::text = 'running' AND j.lease_token = f.token
RETURNING j.id, j.lease_token;

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

-- name: jobs_reap
-- Recover up to %(limit)s expired leases: back to pending after a backoff with jitter,
-- to dead with LEASE_EXPIRED once attempts are spent, or to cancelled when a
-- cancellation was requested. SKIP LOCKED makes concurrent reapers share the work
-- instead of colliding. The token is not changed: the next claim increments it.
WITH expired AS (
    SELECT id
    FROM {schema}.jobs
    WHERE state = 'running' AND lease_expires_at <= now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
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
RETURNING j.id, j.queue, j.task, j.state::text AS state, j.ordering_key, j.lease_token;

-- name: job_lease_states
-- Where these jobs stand now: after a connection failed mid-write, tells a worker
-- whether its write committed before the reply was lost.
SELECT id, state::text, lease_token, last_error_code FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_cancel
-- Operator cancel: a pending or dead job becomes cancelled at once; a running one gets
-- a cancellation request that the next renewal carries to its worker.
UPDATE {schema}.jobs AS j
SET state = CASE WHEN j.state = 'running' THEN j.state ELSE 'cancelled'::{schema}.job_state END,
    finished_at = CASE WHEN j.state = 'running' THEN j.finished_at ELSE now() END,
    cancel_requested_at = CASE WHEN j.state = 'running'
                               THEN coalesce(j.cancel_requested_at, now())
                               ELSE j.cancel_requested_at END
WHERE j.id = %(id)s AND j.state IN ('pending', 'running', 'dead')
RETURNING j.id, j.state::text AS state, j.ordering_key;

-- name: job_event_insert
-- Audit trail of operator actions.
INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
SELECT unnest(%(ids)s::bigint[]), %(kind)s, %(actor)s, %(detail)s::jsonb;

-- name: jobs_replay
-- Replay dead jobs: back to pending with the same id, a fresh attempt budget, and
-- their error history kept. The lease token keeps growing, so any stale owner of an
-- earlier attempt stays fenced out. A job with an ordering key waits if another job of
-- its key is unfinished. Each replay is written to job_events with its actor.
WITH target AS (
    SELECT id, attempts FROM {schema}.jobs
    WHERE state = 'dead'
      AND (id = ANY(%(ids)s::bigint[]) OR (%(queue)s::text IS NOT NULL AND queue = %(queue)s::text))
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
), replayed AS (
    UPDATE {schema}.jobs AS j
    SET state = 'pending',
        run_at = now(),
        attempts = 0,
        finished_at = NULL,
        lease_owner = NULL,
        lease_expires_at = NULL,
        blocked = j.ordering_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM {schema}.jobs o
            WHERE o.ordering_key = j.ordering_key AND o.id <> j.id
              AND (o.state = 'running' OR (o.state IN ('pending', 'dead') AND o.id < j.id)))
    FROM target
    WHERE j.id = target.id
    RETURNING j.id, j.queue, j.blocked, target.attempts AS previous_attempts
), audit AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
    SELECT r.id, 'replayed', %(actor)s, jsonb_build_object('previous_attempts', r.previous_attempts)
    FROM replayed AS r
)
SELECT r.id, r.queue,
       (CASE WHEN NOT r.blocked THEN pg_notify(%(channel)s, r.queue) END) IS NULL AS notified
FROM replayed AS r;

-- name: jobs_prune
-- Delete up to %(limit)s succeeded and cancelled jobs that finished more than
-- %(older_than_seconds)s ago (their events go with them). Bounded, so each batch is a
-- short transaction; the caller loops.
DELETE FROM {schema}.jobs
WHERE id IN (
    SELECT id FROM {schema}.jobs
    WHERE state IN ('succeeded', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(older_than_seconds)s::float8)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id;

-- name: job_get
-- One job with its full row, for `pgworker jobs show`.
SELECT id, queue, task, payload, state::text AS state, priority, run_at, attempts,
       max_attempts, lease_owner, lease_token, lease_expires_at, started_at, heartbeat_at,
       finished_at, last_error_code, errors, dedupe_key, ordering_key, blocked,
       cancel_requested_at, trace_context, created_at
FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_events_list
SELECT at, kind, actor, detail FROM {schema}.job_events WHERE job_id = %(id)s ORDER BY id;

-- name: jobs_list
-- Jobs filtered by queue and state, newest first, without payloads.
SELECT id, queue, task, state::text AS state, priority, run_at, attempts, max_attempts,
       lease_token, last_error_code, created_at, finished_at
FROM {schema}.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text::{schema}.job_state)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_stats
-- Statistics for the metrics collector, one row per queue, each figure from the
-- partial index that covers it: jobs by state (the finished states are counted by the
-- workers' counters instead: counting them would scan the history), the age of the
-- oldest due claimable job and of the oldest dead job (database clock), and running
-- jobs whose lease expired but were not reaped yet.
SELECT q.queue,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked) AS pending,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.ordering_key IS NOT NULL AND j.queue = q.queue AND j.state = 'pending' AND j.blocked) AS blocked,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.state = 'running' AND j.queue = q.queue) AS running,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'dead') AS dead,
       coalesce((SELECT extract(epoch FROM now() - min(j.run_at)) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked
           AND j.run_at <= now()), 0)::float8 AS oldest_due_age_seconds,
       coalesce((SELECT extract(epoch FROM now() - min(j.finished_at)) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'dead'), 0)::float8 AS oldest_dead_age_seconds,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.state = 'running' AND j.lease_expires_at <= now() AND j.queue = q.queue) AS expired_leases
FROM unnest(%(queues)s::text[]) AS q(queue);

-- name: queue_status
-- Counts by queue and state over the whole table, for `pgworker status` (on demand).
SELECT queue, state::text AS state, count(*) AS jobs,
       extract(epoch FROM now() - min(run_at) FILTER (
           WHERE state = 'pending' AND NOT blocked AND run_at <= now()))::float8 AS oldest_due_age_seconds,
       count(*) FILTER (WHERE state = 'running' AND lease_expires_at <= now()) AS expired_leases
FROM {schema}.jobs
GROUP BY queue, state
ORDER BY queue, state;

-- name: jobs_due_count
-- Due, claimable jobs in these queues (drain mode: is there work left?).
SELECT count(*) FROM {schema}.jobs
WHERE queue = ANY(%(queues)s::text[]) AND state = 'pending' AND NOT blocked AND run_at <= now();

-- name: schema_version_get
-- The highest applied migration, or NULL when the schema has none.
SELECT max(version) FROM {schema}.migrations;

-- name: demo_summary
-- Totals for the demo's closing table: succeeded, dead, unfinished, recorded failures.
SELECT count(*) FILTER (WHERE state = 'succeeded'),
       count(*) FILTER (WHERE state = 'dead'),
       count(*) FILTER (WHERE state IN ('pending', 'running')),
       coalesce(sum(jsonb_array_length(errors)), 0)::bigint
FROM {schema}.jobs;

-- name: demo_dead_codes
SELECT last_error_code, count(*) FROM {schema}.jobs WHERE state = 'dead' GROUP BY 1 ORDER BY 2 DESC, 1;
