-- Reads: one job, job lists, statistics for /metrics and `pgworker status`, the schema version.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

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
-- Statistics for the metrics collector and `pgworker status`, one row per queue, each
-- figure from the partial index that covers it: jobs by state (the finished states are
-- counted by the workers' counters instead: counting them would scan the history), the
-- age of the oldest due claimable job and of the oldest dead job (database clock),
-- running jobs whose lease expired but were not reaped yet, ordering keys held by a dead
-- job (dead-head policy 'block', on jobs_dead_idx), and whether the queue is paused.
-- Pending jobs are split by run_at into due (claimable now: what autoscaling and backlog
-- alerts want) and scheduled (run_at later: a retry's backoff, a delayed job), two
-- ranges of jobs_due_idx (queue, run_at); with blocked, each pending job is in one.
SELECT q.queue,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked AND j.run_at <= now()) AS due,
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked AND j.run_at > now()) AS scheduled,
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

-- name: jobs_next_due
-- Seconds until the earliest job of these queues that is not due yet becomes due (NULL:
-- none), paused queues excepted: a drain run's summary says when work comes next (a
-- retry's backoff, a job scheduled later), so "left": 0 is not read as "all done". One
-- descent of jobs_due_idx (queue, run_at) per queue, however many jobs wait.
SELECT extract(epoch FROM min(n.run_at) - now())::float8
FROM unnest(%(queues)s::text[]) AS q (name)
CROSS JOIN LATERAL (
    SELECT run_at FROM {schema}.jobs
    WHERE queue = q.name AND state = 'pending' AND NOT blocked AND run_at > now()
    ORDER BY run_at
    LIMIT 1
) AS n
WHERE q.name NOT IN (SELECT name FROM {schema}.queues WHERE paused_at IS NOT NULL);

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

-- name: db_now
-- The database clock (schedules compute their slots against it, not the worker's clock).
SELECT statement_timestamp();

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
