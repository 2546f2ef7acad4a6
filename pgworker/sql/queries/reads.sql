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
       cancel_requested_at, trace_context, created_at, graph_id, waiting_parents,
       CASE WHEN cancel_on_parent_failure THEN 'cancel' ELSE 'hold' END AS on_parent_failure, has_children,
       progress, progress_message, progress_at, unblocked_at
FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_events_list
SELECT at, kind, actor, detail FROM {schema}.job_events WHERE job_id = %(id)s ORDER BY id;

-- name: jobs_list
-- Jobs filtered by queue, state and task, newest first, without payloads.
SELECT id, queue, task, state::text AS state, priority, run_at, attempts, max_attempts,
       lease_token, last_error_code, created_at, finished_at, waiting_parents, blocked
FROM {schema}.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text::{schema}.job_state)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: jobs_recent_names
-- The queue and task names among the newest %(limit)s jobs, for the name a `jobs list`
-- filter that matched nothing was probably meant to be: a backward walk of the primary
-- key, bounded, since no index leads with the task (a DISTINCT over the table would
-- read every row of the history). task is cast to text: its column's type is a domain
-- (migration 0015), and an array of a domain reaches the client as a type it cannot read
-- (psycopg gave the array's text, '{add}', whose characters became the names).
SELECT coalesce(array_agg(DISTINCT r.queue), '{{}}') AS queues,
       coalesce(array_agg(DISTINCT r.task::text), '{{}}') AS tasks
FROM (SELECT queue, task FROM {schema}.jobs ORDER BY id DESC LIMIT %(limit)s) AS r;

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
       -- dependencies (docs/graphs.md): jobs waiting for parents (jobs_waiting_idx), and
       -- how long the oldest of them has waited behind a dead parent (since it died)
       (SELECT count(*) FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND j.waiting_parents > 0) AS waiting_on_parents,
       coalesce((SELECT extract(epoch FROM now() - min(p.finished_at)) FROM {schema}.jobs c
         JOIN {schema}.job_dependencies d ON d.child_id = c.id JOIN {schema}.jobs p ON p.id = d.parent_id
         WHERE c.queue = q.queue AND c.state = 'pending' AND c.waiting_parents > 0 AND p.state = 'dead'),
         0)::float8 AS blocked_by_dead_parent_age_seconds,
       coalesce((SELECT qs.paused_at IS NOT NULL FROM {schema}.queues qs WHERE qs.name = q.queue), false) AS paused
FROM unnest(%(queues)s::text[]) AS q(queue);

-- name: queues_live
-- The queues that hold live jobs (pending, running or dead), and those with a settings
-- row, for `pgworker status` (on demand), in name order. Each partial index whose first
-- column is the queue is walked one queue at a time (a loose index scan: PostgreSQL 15
-- has no skip scan): jobs_due_idx (pending, not blocked), jobs_running_idx (running),
-- jobs_dead_idx (dead), so the cost is a few descents per queue, never a read of the
-- finished history (status once grouped over every row of the table). Blocked jobs
-- (pending behind their key's head) are found through jobs_ordering_key_idx, which
-- holds the unfinished keyed jobs only.
WITH RECURSIVE pending AS (
    (SELECT queue FROM {schema}.jobs WHERE state = 'pending' AND NOT blocked ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'pending' AND NOT j.blocked AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
    FROM pending AS p WHERE p.queue IS NOT NULL
), running AS (
    (SELECT queue FROM {schema}.jobs WHERE state = 'running' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'running' AND j.queue > r.queue ORDER BY j.queue LIMIT 1)
    FROM running AS r WHERE r.queue IS NOT NULL
), dead AS (
    (SELECT queue FROM {schema}.jobs WHERE state = 'dead' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'dead' AND j.queue > d.queue ORDER BY j.queue LIMIT 1)
    FROM dead AS d WHERE d.queue IS NOT NULL
)
SELECT queue FROM pending WHERE queue IS NOT NULL
UNION SELECT queue FROM running WHERE queue IS NOT NULL
UNION SELECT queue FROM dead WHERE queue IS NOT NULL
UNION SELECT queue FROM {schema}.jobs WHERE ordering_key IS NOT NULL AND state = 'pending' AND blocked
-- jobs waiting for their parents (docs/graphs.md), on jobs_waiting_idx (those jobs only)
UNION SELECT queue FROM {schema}.jobs WHERE state = 'pending' AND waiting_parents > 0
UNION SELECT name FROM {schema}.queues
ORDER BY 1;

-- name: jobs_finished_counts
-- Finished jobs of the whole table by state, for `pgworker status`: succeeded and
-- cancelled counted exactly up to %(limit)s rows each on jobs_finished_idx (state,
-- finished_at), then only estimated, from the planner's statistics of the last ANALYZE
-- (pg_class.reltuples times the state's frequency in pg_stats): the cost is bounded
-- whatever the retention keeps. Dead jobs are live work for an operator, counted per
-- queue by queue_stats. ORDER BY finished_at keeps each count on the index: without it
-- the planner may pick a sequential scan, expecting the matching rows at once, and read
-- the history until it finds them. NULL estimate: the table was never analyzed.
WITH stats AS (
    SELECT greatest(c.reltuples, 0)::float8 AS rows, s.most_common_vals::text::text[] AS vals,
           s.most_common_freqs AS freqs
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    LEFT JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'state'
    WHERE n.nspname = %(schema)s AND c.relname = 'jobs'
)
SELECT f.state, f.counted,
       (SELECT round(st.rows * st.freqs[array_position(st.vals, f.state)])::bigint FROM stats AS st) AS estimated
FROM (VALUES
    ('succeeded', (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs WHERE state = 'succeeded'
                                         ORDER BY finished_at LIMIT %(limit)s) AS x)),
    ('cancelled', (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs WHERE state = 'cancelled'
                                         ORDER BY finished_at LIMIT %(limit)s) AS x))
) AS f (state, counted);

-- fragment: due_claimable
-- The jobs of %(queues)s that are due and claimable, paused queues excepted: a WHERE
-- condition on {schema}.jobs (jobs_due_count and jobs_due_locked).
queue = ANY(%(queues)s::text[]) AND state = 'pending' AND NOT blocked AND run_at <= now()
  AND queue NOT IN (SELECT name FROM {schema}.queues WHERE paused_at IS NOT NULL)

-- name: jobs_due_count
-- Due, claimable jobs in these queues, paused queues excepted (drain mode: is there
-- work left that a claim could take?).
SELECT count(*) FROM {schema}.jobs WHERE {due_claimable};

-- name: jobs_due_locked
-- Of the due, claimable jobs in these queues (jobs_due_count's; at most %(limit)s looked
-- at), how many another transaction holds locked, so that a claim skips them (an
-- operator's open SELECT ... FOR UPDATE or UPDATE, say): the rows a SKIP LOCKED probe at
-- the claim's lock strength could not take. Run in a transaction that is rolled back (its
-- own locks go with it); the statement then bumps the queues' claim epoch (claim_backdate,
-- after the rows are counted: the aggregate's one row), as a claim that locked jobs without
-- taking them does: a claim that skipped a row the probe held must not keep a floor past
-- it (pgworker.claim_floors). Drain mode asks it only when due jobs are left at exit.
SELECT count(*) - count(free.id), {schema}.claim_backdate(%(queues)s::text[]) FROM (
    SELECT id FROM {schema}.jobs WHERE {due_claimable}
    ORDER BY id LIMIT %(limit)s
) AS due
LEFT JOIN (
    SELECT id FROM {schema}.jobs WHERE {due_claimable}
    ORDER BY id LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
) AS free USING (id);

-- name: jobs_due_paused
-- The paused queues of these queues that hold due jobs, each with how many (counted up to
-- %(limit)s: one range of jobs_due_idx (queue, run_at) a queue): a drain run leaves
-- them, and says so, since its `left` counts only what a claim could take.
SELECT p.name, d.n
FROM {schema}.queues AS p
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {schema}.jobs
        WHERE queue = p.name AND state = 'pending' AND NOT blocked AND run_at <= now()
        LIMIT %(limit)s) AS due
) AS d
WHERE p.name = ANY(%(queues)s::text[]) AND p.paused_at IS NOT NULL AND d.n > 0
ORDER BY p.name;

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

-- name: pgworker_schemas
-- The schemas of this database that hold pgworker's tables (its migrations and jobs), for
-- the error that names a schema which is not one (a typo, another case): at most 50, and
-- only those this role may use (not another tenant's).
SELECT n.nspname FROM pg_namespace n
WHERE has_schema_privilege(n.oid, 'USAGE')
  AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'migrations')
  AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'jobs')
ORDER BY n.nspname
LIMIT 50;

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
