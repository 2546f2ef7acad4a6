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
-- job holding it, dedupe_holders); ON CONFLICT DO NOTHING never raises, so the caller's
-- transaction survives. With an ordering key the caller took ordering_keys_lock in an
-- earlier statement, so the probe below (this statement's snapshot is newer than that
-- lock) sees every job of the key committed by writers that held the lock before us: the
-- job is blocked while any earlier job of its key is unfinished (a dead job counts while
-- it blocks its key). The probe is the first entry of jobs_ordering_key_idx from the key
-- on, as in ordering_keys_promote (which says why it is written so). A job that is due now and unblocked wakes listeners: NOTIFY is
-- delivered at commit, never on rollback.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, run_at, max_attempts,
                               dedupe_key, dedupe_window, ordering_key, dead_blocks_key,
                               blocked, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
            coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
            %(max_attempts)s, %(dedupe_key)s, make_interval(secs => %(dedupe_window)s::float8),
            %(ordering_key)s::text, %(dead_blocks_key)s::boolean,
            %(ordering_key)s::text IS NOT NULL AND coalesce((
                SELECT o.ordering_key = %(ordering_key)s::text FROM {schema}.jobs o
                WHERE o.ordering_key IS NOT NULL
                  AND (o.state IN ('pending', 'running') OR (o.state = 'dead' AND o.dead_blocks_key))
                  AND o.ordering_key >= %(ordering_key)s::text
                ORDER BY o.ordering_key, o.id
                LIMIT 1), false),
            %(trace_context)s::jsonb)
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL
      AND (state IN ('pending', 'running') OR (state = 'succeeded' AND dedupe_until IS NOT NULL))
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
-- reserved by job_ids_allocate; the ordering keys were locked by ordering_keys_lock in
-- an earlier statement (see job_insert, and its probe of jobs_ordering_key_idx). Within
-- the batch, later jobs of a key wait behind the first (row_number). ON CONFLICT DO NOTHING also absorbs duplicates inside
-- the batch: the first row with a dedupe key wins.
INSERT INTO {schema}.jobs (id, queue, task, payload, priority, run_at, max_attempts,
                           dedupe_key, dedupe_window, ordering_key, dead_blocks_key, blocked,
                           trace_context)
SELECT b.id, b.queue, b.task, b.payload, b.priority, b.run_at, b.max_attempts,
       b.dedupe_key, make_interval(secs => b.dedupe_window), b.ordering_key, b.dead_blocks_key,
       b.ordering_key IS NOT NULL AND (
           row_number() OVER (PARTITION BY b.ordering_key ORDER BY b.id) > 1
           OR coalesce((SELECT o.ordering_key = b.ordering_key FROM {schema}.jobs o
                        WHERE o.ordering_key IS NOT NULL
                          AND (o.state IN ('pending', 'running') OR (o.state = 'dead' AND o.dead_blocks_key))
                          AND o.ordering_key >= b.ordering_key
                        ORDER BY o.ordering_key, o.id
                        LIMIT 1), false)),
       b.trace_context
FROM unnest(%(ids)s::bigint[], %(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[],
            %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(max_attempts)s::int[],
            %(dedupe_keys)s::text[], %(dedupe_windows)s::float8[], %(ordering_keys)s::text[],
            %(dead_blocks_keys)s::boolean[], %(trace_contexts)s::jsonb[])
     AS b(id, queue, task, payload, priority, run_at, max_attempts, dedupe_key, dedupe_window,
          ordering_key, dead_blocks_key, trace_context)
ORDER BY b.id
ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL
  AND (state IN ('pending', 'running') OR (state = 'succeeded' AND dedupe_until IS NOT NULL))
DO NOTHING
RETURNING id, run_at <= now() AND NOT blocked AS due;

-- name: dedupe_holders
-- The jobs holding these dedupe keys, after an insert found them taken. A succeeded job
-- holds its key until dedupe_until; an expired hold is released here (dedupe_until set
-- to NULL takes the row out of the unique index) so that the caller's next insert
-- succeeds. The data-modifying CTE always runs to completion; the SELECT reads the
-- snapshot from before it, hence its own dedupe_until > now() test. A key missing from
-- the result is free now: the caller inserts again (never check-then-insert: the unique
-- index decides). A concurrent releaser of the same hold waits for our row lock and then
-- finds the row no longer matches, so a hold is released once.
WITH released AS (
    UPDATE {schema}.jobs
    SET dedupe_until = NULL
    WHERE dedupe_key = ANY(%(keys)s::text[]) AND state = 'succeeded' AND dedupe_until <= now()
    RETURNING id
)
SELECT dedupe_key, id FROM {schema}.jobs
WHERE dedupe_key = ANY(%(keys)s::text[]) AND dedupe_key IS NOT NULL
  AND (state IN ('pending', 'running') OR (state = 'succeeded' AND dedupe_until IS NOT NULL))
  AND (state <> 'succeeded' OR dedupe_until > now());

-- name: queues_notify
-- One wake-up per queue for a bulk insert (NOTIFY is delivered at commit).
SELECT pg_notify(%(channel)s, n.payload) IS NULL
FROM unnest(%(payloads)s::text[]) AS n(payload);

-- name: ordering_keys_lock
-- Serialise the writers of the same ordering keys until commit: enqueue (which decides
-- whether a new job waits) and every transition that finishes, kills, discards or
-- replays a job of a key (which then promotes the next one). Transaction-level advisory
-- locks, taken in hash order so that two writers never wait on each other in a cycle,
-- and always BEFORE any job row lock of the same transaction (the lock order every
-- keyed transition follows; a row lock taken first could deadlock with a writer that
-- holds the key and waits for the row).
SELECT count(pg_advisory_xact_lock(hashtext(%(namespace)s), k.h))
FROM (SELECT DISTINCT hashtext(key) AS h FROM unnest(%(keys)s::text[]) AS key ORDER BY 1) AS k;

-- name: ordering_keys_promote
-- For each key with no active job (claimable or running), unblock its head: the oldest
-- unfinished job, when it is pending and blocked. A dead job that blocks its key
-- (dead_blocks_key) is a head that cannot be promoted: the key waits until it is
-- replayed or discarded. Idempotent. Runs after ordering_keys_lock, in a new statement,
-- so its snapshot includes every job committed by writers that held the lock before us.
-- The "no active job" test keeps a replayed old job from running beside a newer job of
-- its key that is already active: it waits its turn, and is promoted when that one ends.
-- The head is found with one descent of jobs_ordering_key_idx per key, however many jobs
-- wait behind it: the first index entry with ordering_key >= key in (ordering_key, id)
-- order, kept if it is of this key. Written as a range in the index's order because only
-- that index can deliver it; with "ordering_key = key ORDER BY id LIMIT 1" the planner
-- may walk the primary key instead, expecting an early match, and read every finished
-- job of the table (it did, in the benchmark). The activity probe reads jobs_ordering_active_idx (one entry per key).
WITH heads AS (
    SELECT h.id
    FROM unnest(%(keys)s::text[]) AS k(key)
    CROSS JOIN LATERAL (
        SELECT o.id, o.ordering_key, o.state, o.blocked
        FROM {schema}.jobs o
        WHERE o.ordering_key IS NOT NULL
          AND (o.state IN ('pending', 'running') OR (o.state = 'dead' AND o.dead_blocks_key))
          AND o.ordering_key >= k.key
        ORDER BY o.ordering_key, o.id
        LIMIT 1) AS h
    WHERE h.ordering_key = k.key AND h.state = 'pending' AND h.blocked
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.jobs a
          WHERE a.ordering_key = k.key
            AND (a.state = 'running' OR (a.state = 'pending' AND NOT a.blocked)))
), promoted AS (
    UPDATE {schema}.jobs AS j
    SET blocked = false
    FROM heads
    WHERE j.id = heads.id
    RETURNING j.id, j.queue, j.run_at
)
SELECT p.id, p.queue,
       (CASE WHEN p.run_at <= now() THEN pg_notify(%(channel)s, p.queue) END) IS NULL AS notified
FROM promoted AS p;

-- name: jobs_ordering_keys
-- The ordering keys of these jobs (an ordering key never changes, so no lock is needed):
-- read before a keyed transition so its key locks can be taken before its row locks.
SELECT id, ordering_key FROM {schema}.jobs
WHERE id = ANY(%(ids)s::bigint[]) AND ordering_key IS NOT NULL;

-- name: queue_lock
-- First statement of a claim on a queue with a global concurrency or rate limit: lock
-- its row, so that claims on the queue run one at a time across every pod. The claim
-- itself must be a NEW statement of the same transaction: under READ COMMITTED each
-- statement reads a snapshot taken when it starts, so a statement that waited for this
-- lock inside itself would still count the running jobs (and read the token bucket) as
-- they were before the previous holder committed its claim, and could claim past the
-- limit. A statement started after the lock was granted sees that claim.
-- FOR NO KEY UPDATE: the claim then updates the row (the token bucket) without
-- touching its key.
SELECT name FROM {schema}.queues WHERE name = %(queue)s FOR NO KEY UPDATE;

-- name: job_claim
-- Claim up to %(limit)s due jobs of one queue and lease them for %(lease_seconds)s.
-- Returns one "gate" row (the queue's policy verdict: paused, limited, allowance,
-- retry_after_seconds) joined to each claimed job, so an empty claim still says why.
--
-- gate: the queue's row by primary key (no row: no policy). A paused queue gets an
-- allowance of 0 (enqueues go on; claims stop as soon as the pause commits). A queue with
-- a concurrency or rate limit is only claimed with %(locked)s, i.e. after queue_lock in
-- the same transaction (see there); unlocked, the allowance is 0 and the caller retries
-- locked. The allowance is the batch size, cut to the free concurrency (limit minus the
-- jobs running now, counted on jobs_running_idx) and to the whole tokens of the bucket,
-- refilled from tokens_at to this statement's start at rate_per_second and capped at the
-- burst. CASE evaluates lazily: an unlimited queue never runs the count.
--
-- Two arms pick the candidates (priority aging). aged: jobs due for longer than the
-- aging bound, oldest first, on jobs_due_idx (queue, run_at); with no bound the scan key
-- is NULL and the index scan returns at once. ranked: the rest of the batch in
-- priority order (priority DESC, run_at, id) on jobs_claim_idx, excluding the rows the
-- first arm took (our own locks would not make SKIP LOCKED skip them). Both arms repeat
-- the partial-index predicate (state = 'pending' AND NOT blocked) so the planner can use
-- the indexes, and lock with FOR UPDATE SKIP LOCKED inside the CTE where the rows are
-- chosen: concurrent claimers skip each other's rows instead of waiting (PostgreSQL docs,
-- SELECT, "The Locking Clause"). Blocked jobs (not the head of their ordering key) are
-- absent from both indexes, so a claim never comes back short because of them.
--
-- Each claimed job gets attempts + 1, a new fencing token and a lease measured from
-- statement_timestamp() (the claim's own start, after any wait for queue_lock). The
-- bucket loses one token per claimed job. The caller commits at once and runs the jobs
-- outside any transaction.
WITH gate AS (
    SELECT coalesce(q.paused_at IS NOT NULL, false) AS paused,
           coalesce(q.concurrency_limit IS NOT NULL OR q.rate_per_second IS NOT NULL, false) AS limited,
           coalesce(q.aging_seconds, %(aging_seconds)s::float8) AS aging_seconds,
           q.concurrency_limit, q.rate_per_second,
           least(q.rate_burst, q.tokens + q.rate_per_second
                 * greatest(0.0, extract(epoch FROM statement_timestamp() - q.tokens_at)::float8)) AS tokens
    FROM (VALUES (1)) AS one (x)
    LEFT JOIN {schema}.queues AS q ON q.name = %(queue)s
), allowance AS (
    SELECT g.*,
           CASE WHEN g.paused OR (g.limited AND NOT %(locked)s::boolean) THEN 0
                ELSE greatest(0, least(
                    %(limit)s::int,
                    CASE WHEN g.concurrency_limit IS NULL THEN %(limit)s::int
                         ELSE g.concurrency_limit - (SELECT count(*) FROM {schema}.jobs AS r
                                                     WHERE r.queue = %(queue)s AND r.state = 'running')::int
                    END,
                    CASE WHEN g.rate_per_second IS NULL THEN %(limit)s::int
                         ELSE floor(g.tokens)::int END))
           END AS n
    FROM gate AS g
), aged AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
      AND run_at <= now() - make_interval(secs => (SELECT aging_seconds FROM gate))
    ORDER BY run_at
    LIMIT (SELECT n FROM allowance)
    FOR UPDATE SKIP LOCKED
), ranked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked AND run_at <= now()
      AND id NOT IN (SELECT id FROM aged)
    ORDER BY priority DESC, run_at, id
    LIMIT (SELECT n FROM allowance) - (SELECT count(*) FROM aged)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    -- The rows are matched through "id = ANY(ARRAY(...))", not by joining the CTEs: the
    -- arms' LIMIT is an expression, so the planner guesses they return a tenth of the
    -- table, and a join on that guess becomes a hash join over a sequential scan of jobs.
    -- An array parameter is estimated at a handful of elements: primary-key probes.
    UPDATE {schema}.jobs AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        lease_token = j.lease_token + 1,
        lease_owner = %(owner)s,
        lease_expires_at = statement_timestamp() + make_interval(secs => %(lease_seconds)s::float8),
        started_at = statement_timestamp(),
        heartbeat_at = statement_timestamp(),
        cancel_requested_at = NULL
    WHERE j.id = ANY (ARRAY(SELECT id FROM aged UNION ALL SELECT id FROM ranked))
    RETURNING j.id, j.queue, j.task, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease_token, j.lease_expires_at, j.run_at, j.created_at, j.trace_context,
              j.ordering_key, j.dedupe_key,
              extract(epoch FROM statement_timestamp() - j.run_at)::float8 AS wait_seconds,
              j.id = ANY (ARRAY(SELECT id FROM aged)) AS aged
), bucket AS (
    UPDATE {schema}.queues AS q
    SET tokens = a.tokens - (SELECT count(*) FROM claimed),
        tokens_at = greatest(q.tokens_at, statement_timestamp())
    FROM allowance AS a
    WHERE q.name = %(queue)s AND q.rate_per_second IS NOT NULL AND %(locked)s::boolean
)
-- UPDATE ... RETURNING follows the join's order, not the CTE's: sort again so the
-- batch runs in claim order (aged jobs first, oldest first; then by priority).
SELECT a.paused, a.limited, a.n AS allowance,
       CASE WHEN a.rate_per_second IS NOT NULL
                 AND a.tokens - (SELECT count(*) FROM claimed) < 1
            THEN (1 - (a.tokens - (SELECT count(*) FROM claimed))) / a.rate_per_second
       END AS retry_after_seconds,
       c.id, c.queue, c.task, c.payload, c.priority, c.attempts, c.max_attempts, c.lease_token,
       c.lease_expires_at, c.run_at, c.created_at, c.trace_context, c.ordering_key, c.dedupe_key,
       c.wait_seconds
FROM allowance AS a
LEFT JOIN claimed AS c ON true
ORDER BY c.aged DESC, CASE WHEN c.aged THEN c.run_at END, c.priority DESC, c.run_at, c.id;

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
-- were refused by the fence (the lease was lost) and stay untouched. A job with a
-- dedupe_window keeps its dedupe key held until dedupe_until (it stays in the unique
-- index); the others release it (a succeeded row without dedupe_until leaves the index).
UPDATE {schema}.jobs AS j
SET state = 'succeeded',
    finished_at = now(),
    lease_owner = NULL,
    lease_expires_at = NULL,
    dedupe_until = CASE WHEN j.dedupe_key IS NOT NULL THEN now() + j.dedupe_window END
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
RETURNING j.id, j.lease_token, j.state::text AS state, j.ordering_key, j.dead_blocks_key;

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

-- name: jobs_replay_targets
-- The dead jobs a replay would take (by id, or up to %(limit)s of a queue), with their
-- ordering and dedupe keys, read without locks so the key locks can be taken first (and
-- expired dedupe holds released, dedupe_holders); jobs_replay re-checks that each is
-- still dead.
SELECT id, ordering_key, dedupe_key FROM {schema}.jobs
WHERE state = 'dead'
  AND (id = ANY(%(ids)s::bigint[]) OR (%(queue)s::text IS NOT NULL AND queue = %(queue)s::text))
ORDER BY id
LIMIT %(limit)s;

-- name: jobs_replay
-- Replay dead jobs: back to pending with the same id, a fresh attempt budget, and
-- their error history kept. The lease token keeps growing, so any stale owner of an
-- earlier attempt stays fenced out. A job with an ordering key comes back blocked; the
-- caller then promotes its key (ordering_keys_promote), which lets it run when no other
-- job of its key is active. A job whose dedupe key is held by another job stays dead
-- (returning it to pending would violate the unique index), and of several dead jobs
-- sharing a dedupe key only the oldest is replayed. Each replay is written to
-- job_events with its actor.
WITH pick AS (
    SELECT DISTINCT ON (coalesce(t.dedupe_key, t.id::text)) t.id
    FROM {schema}.jobs AS t
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.state = 'dead'
      AND (t.dedupe_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM {schema}.jobs AS h
          WHERE h.dedupe_key = t.dedupe_key AND h.dedupe_key IS NOT NULL
            AND (h.state IN ('pending', 'running') OR (h.state = 'succeeded' AND h.dedupe_until IS NOT NULL))
            AND (h.state <> 'succeeded' OR h.dedupe_until > now())))
    ORDER BY coalesce(t.dedupe_key, t.id::text), t.id
), target AS (
    -- locked in a separate step: FOR UPDATE is not allowed with DISTINCT
    SELECT t.id, t.attempts FROM {schema}.jobs AS t
    WHERE t.id IN (SELECT id FROM pick) AND t.state = 'dead'
    FOR UPDATE
), replayed AS (
    UPDATE {schema}.jobs AS j
    SET state = 'pending',
        run_at = now(),
        attempts = 0,
        finished_at = NULL,
        lease_owner = NULL,
        lease_expires_at = NULL,
        blocked = j.ordering_key IS NOT NULL
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

-- name: job_get
-- One job with its full row, for `pgworker jobs show`.
SELECT id, queue, task, payload, state::text AS state, priority, run_at, attempts,
       max_attempts, lease_owner, lease_token, lease_expires_at, started_at, heartbeat_at,
       finished_at, last_error_code, errors, dedupe_key,
       extract(epoch FROM dedupe_window)::float8 AS dedupe_window_seconds, dedupe_until,
       ordering_key, blocked, dead_blocks_key, schedule_name, schedule_slot,
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
-- oldest due claimable job and of the oldest dead job (database clock), running
-- jobs whose lease expired but were not reaped yet, ordering keys held by a dead job
-- (dead-head policy 'block', on jobs_dead_idx), and whether the queue is paused.
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
         WHERE j.state = 'running' AND j.lease_expires_at <= now() AND j.queue = q.queue) AS expired_leases,
       (SELECT count(DISTINCT j.ordering_key) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'dead' AND j.ordering_key IS NOT NULL
           AND j.dead_blocks_key) AS dead_blocked_keys,
       coalesce((SELECT qs.paused_at IS NOT NULL FROM {schema}.queues qs WHERE qs.name = q.queue), false) AS paused
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
-- Due, claimable jobs in these queues, paused queues excepted (drain mode: is there
-- work left that a claim could take?).
SELECT count(*) FROM {schema}.jobs
WHERE queue = ANY(%(queues)s::text[]) AND state = 'pending' AND NOT blocked AND run_at <= now()
  AND queue NOT IN (SELECT name FROM {schema}.queues WHERE paused_at IS NOT NULL);

-- name: ordering_keys_dead_blocked
-- Ordering keys held by a dead job (dead-head policy 'block'), oldest first, with how
-- many jobs wait behind each, for `pgworker status`. On demand only.
SELECT d.queue, d.ordering_key, d.id AS dead_job_id, d.task, d.last_error_code, d.finished_at,
       (SELECT count(*) FROM {schema}.jobs w
         WHERE w.ordering_key = d.ordering_key AND w.state = 'pending' AND w.blocked) AS waiting
FROM {schema}.jobs d
WHERE d.state = 'dead' AND d.ordering_key IS NOT NULL AND d.dead_blocks_key
ORDER BY d.finished_at, d.id
LIMIT %(limit)s;

-- name: queue_configure
-- Create or change a queue's limits and aging bound. Each setting changes only when its
-- set_* flag is true (NULL then removes it). A new or changed rate refills the bucket
-- to its burst. Returns the row; the change is audited in queue_events.
WITH upsert AS (
    INSERT INTO {schema}.queues AS q (name, concurrency_limit, rate_per_second, rate_burst, tokens,
                                      tokens_at, aging_seconds)
    VALUES (%(queue)s, %(concurrency_limit)s, %(rate_per_second)s::float8, %(rate_burst)s::float8,
            %(rate_burst)s::float8, now(), %(aging_seconds)s::float8)
    ON CONFLICT (name) DO UPDATE SET
        concurrency_limit = CASE WHEN %(set_concurrency)s THEN EXCLUDED.concurrency_limit
                                 ELSE q.concurrency_limit END,
        rate_per_second = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_per_second ELSE q.rate_per_second END,
        rate_burst = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_burst ELSE q.rate_burst END,
        tokens = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_burst ELSE q.tokens END,
        tokens_at = CASE WHEN %(set_rate)s THEN now() ELSE q.tokens_at END,
        aging_seconds = CASE WHEN %(set_aging)s THEN EXCLUDED.aging_seconds ELSE q.aging_seconds END,
        updated_at = now()
    RETURNING q.*
), audit AS (
    INSERT INTO {schema}.queue_events (queue, kind, actor, detail)
    SELECT u.name, 'configured', %(actor)s, jsonb_build_object(
        'concurrency_limit', u.concurrency_limit, 'rate_per_second', u.rate_per_second,
        'rate_burst', u.rate_burst, 'aging_seconds', u.aging_seconds)
    FROM upsert AS u
)
SELECT name, paused_at, paused_by, concurrency_limit, rate_per_second, rate_burst, aging_seconds
FROM upsert;

-- name: queue_pause
-- Pause a queue: claims of every pod stop taking its jobs from the commit on (the claim
-- reads paused_at in its own statement); running jobs finish; enqueues go on. Pausing a
-- paused queue keeps the first pause's time and actor. Audited in queue_events.
WITH upsert AS (
    INSERT INTO {schema}.queues AS q (name, paused_at, paused_by)
    VALUES (%(queue)s, now(), %(actor)s)
    ON CONFLICT (name) DO UPDATE SET
        paused_at = coalesce(q.paused_at, EXCLUDED.paused_at),
        paused_by = CASE WHEN q.paused_at IS NULL THEN EXCLUDED.paused_by ELSE q.paused_by END,
        updated_at = now()
    RETURNING q.name, q.paused_at, q.paused_by
), audit AS (
    INSERT INTO {schema}.queue_events (queue, kind, actor)
    SELECT u.name, 'paused', %(actor)s FROM upsert AS u
)
SELECT name, paused_at, paused_by FROM upsert;

-- name: queue_resume
-- Resume a paused queue and wake the listeners, so idle claimers take its backlog at
-- once (NOTIFY is delivered at commit). Audited in queue_events. No row: it was not paused.
WITH resumed AS (
    UPDATE {schema}.queues AS q
    SET paused_at = NULL, paused_by = NULL, updated_at = now()
    WHERE q.name = %(queue)s AND q.paused_at IS NOT NULL
    RETURNING q.name
), audit AS (
    INSERT INTO {schema}.queue_events (queue, kind, actor)
    SELECT r.name, 'resumed', %(actor)s FROM resumed AS r
)
SELECT r.name, pg_notify(%(channel)s, r.name) IS NULL AS notified FROM resumed AS r;

-- name: queues_list
-- Every configured queue with its settings and its running jobs (jobs_running_idx).
SELECT q.name, q.paused_at, q.paused_by, q.concurrency_limit, q.rate_per_second, q.rate_burst,
       q.aging_seconds,
       (SELECT count(*) FROM {schema}.jobs j WHERE j.queue = q.name AND j.state = 'running') AS running,
       q.updated_at
FROM {schema}.queues AS q
ORDER BY q.name;

-- name: queue_events_list
-- The audit trail of one queue, newest first.
SELECT at, kind, actor, detail FROM {schema}.queue_events
WHERE queue = %(queue)s ORDER BY id DESC LIMIT %(limit)s;

-- name: db_now
-- The database clock (schedules compute their slots against it, not the worker's clock).
SELECT statement_timestamp();

-- name: schedule_register
-- Record a declared schedule, or update it when its definition changed. A new schedule
-- (or one whose cron expression or time zone changed) starts at %(initial_slot)s, the
-- latest slot before now: slots from before it was declared are not owed. Dispatchers
-- of different versions that disagree on a definition overwrite each other; the slot
-- bookkeeping (last_slot) is never moved backwards by this.
INSERT INTO {schema}.schedules AS s (name, task, queue, cron, timezone, missed, last_slot, next_slot)
VALUES (%(name)s, %(task)s, %(queue)s, %(cron)s, %(timezone)s, %(missed)s, %(initial_slot)s,
        %(next_slot)s)
ON CONFLICT (name) DO UPDATE SET
    task = EXCLUDED.task, queue = EXCLUDED.queue, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, missed = EXCLUDED.missed,
    last_slot = CASE WHEN (s.cron, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone)
                     THEN greatest(s.last_slot, EXCLUDED.last_slot) ELSE s.last_slot END,
    updated_at = now()
WHERE (s.task, s.queue, s.cron, s.timezone, s.missed)
      IS DISTINCT FROM (EXCLUDED.task, EXCLUDED.queue, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.missed);

-- name: schedules_state
-- Where these schedules stand (the last slot enqueued or skipped), and the database clock.
SELECT name, last_slot, statement_timestamp() AS now
FROM {schema}.schedules WHERE name = ANY(%(names)s::text[]);

-- name: schedule_fire
-- Advance a schedule to %(slot)s and, when %(enqueue)s, enqueue its job, in one
-- statement. The UPDATE is a compare-and-set: last_slot only moves forward and only to a
-- slot that is due by the database clock. Concurrent dispatchers firing the same slot
-- queue on the schedule row's lock; once the first commits, the others re-check the
-- condition on the new row (READ COMMITTED re-evaluates a waited-for row) and update
-- nothing, so they insert nothing. jobs_schedule_slot_idx, a unique key per slot, backs
-- this up: ON CONFLICT DO NOTHING (no target: any unique index) refuses a second job
-- for a slot even if last_slot were reset. run_at is the slot, so a late slot shows its
-- lateness in the queue's age (and ages ahead of newer work). Wakes listeners.
WITH advanced AS (
    UPDATE {schema}.schedules AS s
    SET last_slot = %(slot)s, next_slot = %(next_slot)s,
        skipped_slots = s.skipped_slots + %(skipped)s, updated_at = now()
    WHERE s.name = %(name)s AND (s.last_slot IS NULL OR s.last_slot < %(slot)s)
      AND %(slot)s <= statement_timestamp()
    RETURNING s.name
), ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, run_at, max_attempts, schedule_name,
                               schedule_slot)
    SELECT %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(slot)s, %(max_attempts)s,
           a.name, %(slot)s
    FROM advanced AS a
    WHERE %(enqueue)s
    ON CONFLICT DO NOTHING
    RETURNING id, queue
)
SELECT (SELECT count(*) FROM advanced) > 0 AS advanced, i.id,
       (CASE WHEN i.id IS NOT NULL THEN pg_notify(%(channel)s, i.queue) END) IS NULL AS notified
FROM (VALUES (1)) AS one (x)
LEFT JOIN ins AS i ON true;

-- name: schedules_list
-- Every recorded schedule with its last job (on jobs_schedule_slot_idx).
SELECT s.name, s.task, s.queue, s.cron, s.timezone, s.missed, s.last_slot, s.next_slot,
       s.skipped_slots, s.updated_at, lj.id AS last_job_id, lj.state AS last_job_state
FROM {schema}.schedules AS s
LEFT JOIN LATERAL (
    SELECT j.id, j.state::text AS state FROM {schema}.jobs AS j
    WHERE j.schedule_name = s.name
    ORDER BY j.schedule_slot DESC
    LIMIT 1) AS lj ON true
ORDER BY s.name;

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
