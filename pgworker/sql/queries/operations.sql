-- Operator actions on jobs and queues, each audited.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

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

-- name: job_retry_now
-- Operator "retry now": a pending job scheduled later (a retry's backoff, a delay) becomes
-- due at once. Fenced by state: only a pending job whose run_at is still ahead changes
-- (a job that started, finished or is already due meanwhile is left alone, and no row
-- comes back). Audited in job_events with the run_at it had; wakes the listeners for its
-- queue unless it waits behind its ordering key (blocked).
WITH target AS (
    SELECT id, run_at FROM {schema}.jobs
    WHERE id = %(id)s AND state = 'pending' AND run_at > now()
    FOR UPDATE
), moved AS (
    -- due at claim_stamp's clock (migration 0013), not now(): a claimer's floor never passes it
    UPDATE {schema}.jobs AS j SET run_at = {schema}.claim_stamp(ARRAY[j.queue])
    FROM target AS t
    WHERE j.id = t.id AND j.state = 'pending'
    RETURNING j.id, j.queue, j.blocked, t.run_at AS previous_run_at
), audit AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
    SELECT m.id, 'retried_now', %(actor)s, jsonb_build_object('previous_run_at', m.previous_run_at)
    FROM moved AS m
)
SELECT m.id, m.queue, m.previous_run_at,
       (CASE WHEN NOT m.blocked THEN pg_notify(%(channel)s, m.queue) END) IS NULL AS notified
FROM moved AS m;

-- name: job_event_insert
-- Audit trail of operator actions.
INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
SELECT unnest(%(ids)s::bigint[]), %(kind)s, %(actor)s, %(detail)s::jsonb;

-- name: jobs_replay_targets
-- The dead jobs of these ids a replay would take (a queue's: jobs_replay_queue_page),
-- with their ordering and dedupe keys, read without locks so the key locks can be taken
-- first (and expired dedupe holds released, dedupe_holders); jobs_replay re-checks that
-- each is still dead.
SELECT id, ordering_key, dedupe_key FROM {schema}.jobs
WHERE state = 'dead' AND id = ANY(%(ids)s::bigint[])
ORDER BY id
LIMIT %(limit)s;

-- name: jobs_replay_queue_page
-- A page of a queue's dead jobs for a replay of the queue: up to %(limit)s after id
-- %(after)s, in id order, with their keys and whether another job holds the dedupe key
-- now (pending or running, or succeeded within its window: the unique index's rows, as
-- dedupe_holders reads them). Such a job would stay dead, so the replay passes over it
-- rather than fill its limit with it: the first dead jobs of a queue, held, once filled
-- every call, and "call again for the rest" never reached the rest (a break-it trial).
-- Read without locks, as jobs_replay_targets: jobs_replay decides under the key locks.
SELECT t.id, t.ordering_key, t.dedupe_key,
       t.dedupe_key IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.jobs AS h
           WHERE h.dedupe_key = t.dedupe_key AND h.id <> t.id
             AND (h.state IN ('pending', 'running') OR (h.state = 'succeeded' AND h.dedupe_until IS NOT NULL))
             AND (h.state <> 'succeeded' OR h.dedupe_until > now())) AS held
FROM {schema}.jobs AS t
WHERE t.state = 'dead' AND t.queue = %(queue)s AND t.id > %(after)s
ORDER BY t.id
LIMIT %(limit)s;

-- name: jobs_replay
-- Replay dead jobs: back to pending with the same id, a fresh attempt budget (no
-- start, heartbeat or progress of the earlier attempts), and their error history kept. The lease token keeps growing, so any stale owner of an
-- earlier attempt stays fenced out. A job with an ordering key comes back blocked; the
-- caller then promotes its key (ordering_keys_promote), which lets it run when no other
-- job of its key is active. A job whose dedupe key is held by another job stays dead
-- (returning it to pending would violate the unique index), and of several dead jobs
-- sharing a dedupe key only the oldest is replayed. Each replay is written to
-- job_events with its actor. has_children says which may have children its death
-- cancelled (the caller then runs dependents_requeue for those only).
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
        run_at = {schema}.claim_stamp(ARRAY[j.queue]),  -- migration 0013: fresh, never behind a floor
        attempts = 0,
        finished_at = NULL,
        lease_owner = NULL,
        lease_expires_at = NULL,
        -- a fresh budget reads as never started (the earlier attempts stay in errors)
        started_at = NULL,
        heartbeat_at = NULL,
        progress = NULL,
        progress_message = NULL,
        progress_at = NULL,
        blocked = j.ordering_key IS NOT NULL
    FROM target
    WHERE j.id = target.id
    RETURNING j.id, j.queue, j.blocked, j.has_children, target.attempts AS previous_attempts
), audit AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
    SELECT r.id, 'replayed', %(actor)s, jsonb_build_object('previous_attempts', r.previous_attempts)
    FROM replayed AS r
)
SELECT r.id, r.queue,
       (CASE WHEN NOT r.blocked THEN pg_notify(%(channel)s, r.queue) END) IS NULL AS notified,
       r.has_children
FROM replayed AS r;

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
    SELECT s.name, 'configured', %(actor)s, {queue_settings_detail}
    FROM upsert AS s
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
