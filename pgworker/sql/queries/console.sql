-- The web console's reads (pgworker.web), the pod registry and the bulk operations.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
--
-- The console adds no index to jobs (its cost per job is the project's scaling limit):
-- every read below walks an index that exists (tests/web/test_web_plans.py checks each
-- plan on a large table), never counts a state over the whole history (counts stop at
-- a cap and say "10,000+"), and never pages with OFFSET: lists continue from the last
-- row shown (keyset), the jobs list newest first by id. A filter no index serves is
-- evaluated over a bounded window of the newest jobs, and the page says how far back it
-- looked.

-- fragment: console_job_columns
-- The columns of a job row in the console's lists, which the pages read by name (one
-- rule for every list: due, running, finished, dead, a dead group, the filtered listing),
-- unqualified: the jobs table is the only relation of the FROM that has these names.
id, queue, task, state::text AS state, priority, run_at, attempts, max_attempts, lease_owner,
lease_expires_at, last_error_code, created_at, finished_at, ordering_key, dedupe_key, waiting_parents, blocked

-- name: console_queue_names
-- The queues worth a row on the overview: configured ones, scheduled ones, and every
-- queue with claimable, running or dead jobs, found by a loose index scan (one descent of
-- jobs_due_idx, jobs_running_idx and jobs_dead_idx per distinct queue, however many jobs
-- each holds: SELECT DISTINCT queue would read every row; oban_met #19 is that
-- complaint). At most %(limit)s names.
WITH RECURSIVE due AS (
    (SELECT queue FROM {schema}.jobs WHERE state = 'pending' AND NOT blocked ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs j
            WHERE j.state = 'pending' AND NOT j.blocked AND j.queue > d.queue ORDER BY j.queue LIMIT 1)
    FROM due d WHERE d.queue IS NOT NULL
), running AS (
    (SELECT queue FROM {schema}.jobs WHERE state = 'running' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs j WHERE j.state = 'running' AND j.queue > r.queue
            ORDER BY j.queue LIMIT 1)
    FROM running r WHERE r.queue IS NOT NULL
), dead AS (
    (SELECT queue FROM {schema}.jobs WHERE state = 'dead' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs j WHERE j.state = 'dead' AND j.queue > d.queue
            ORDER BY j.queue LIMIT 1)
    FROM dead d WHERE d.queue IS NOT NULL
)
SELECT name FROM (
    SELECT queue AS name FROM due WHERE queue IS NOT NULL
    UNION SELECT queue FROM running WHERE queue IS NOT NULL
    UNION SELECT queue FROM dead WHERE queue IS NOT NULL
    UNION SELECT name FROM {schema}.queues
    UNION SELECT queue FROM {schema}.schedules
) AS q
ORDER BY name
LIMIT %(limit)s;

-- name: console_queue_overview
-- One row per queue of %(queues)s: its jobs by state, each counted on the partial index
-- that holds them and stopped at %(cap)s (the page shows "10,000+"), the age of its
-- oldest due job (one descent of jobs_due_idx), expired leases not yet reaped, and its
-- settings row (pause, limits). Finished jobs have no index by queue and are not counted
-- here: the throughput chart shows them (console_throughput).
SELECT q.queue,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked AND j.run_at <= now()
         LIMIT %(cap)s) c) AS due,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked AND j.run_at > now()
         LIMIT %(cap)s) c) AS scheduled,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'running' LIMIT %(cap)s) c) AS running,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'running' AND j.lease_expires_at <= now()
         LIMIT %(cap)s) c) AS expired_leases,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'dead' LIMIT %(cap)s) c) AS dead,
       (SELECT extract(epoch FROM now() - j.run_at)::float8 FROM {schema}.jobs j
         WHERE j.queue = q.queue AND j.state = 'pending' AND NOT j.blocked AND j.run_at <= now()
         ORDER BY j.run_at LIMIT 1) AS oldest_due_age_seconds,
       s.paused_at, s.paused_by, s.concurrency_limit, s.rate_per_second, s.rate_burst, s.aging_seconds
FROM unnest(%(queues)s::text[]) AS q(queue)
LEFT JOIN {schema}.queues AS s ON s.name = q.queue
ORDER BY q.queue;

-- name: console_throughput
-- Jobs finished per minute over the last hour, by final state and queue, for the
-- overview's chart: the newest %(limit)s of each state on jobs_finished_idx (state,
-- finished_at), walked backwards from now. A state with more than that in the hour is
-- cut (the caller sees its count reach the limit and says how far back the chart goes):
-- a busy hour never costs more than the limit's rows.
SELECT f.state, f.queue, floor(extract(epoch FROM now() - f.finished_at) / 60)::int AS minutes_ago,
       count(*) AS jobs
FROM (
    (SELECT 'succeeded' AS state, queue, finished_at FROM {schema}.jobs
     WHERE state = 'succeeded' AND finished_at >= now() - interval '1 hour'
     ORDER BY finished_at DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT 'dead', queue, finished_at FROM {schema}.jobs
     WHERE state = 'dead' AND finished_at >= now() - interval '1 hour'
     ORDER BY finished_at DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT 'cancelled', queue, finished_at FROM {schema}.jobs
     WHERE state = 'cancelled' AND finished_at >= now() - interval '1 hour'
     ORDER BY finished_at DESC LIMIT %(limit)s)
) AS f
GROUP BY 1, 2, 3;

-- name: console_jobs_estimate
-- The planner's estimate of the jobs table's rows (pg_class.reltuples, kept by
-- autovacuum and ANALYZE): the list's "about 1.1 million jobs" without a count.
SELECT c.reltuples::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'jobs';

-- name: console_jobs_window
-- The jobs list, newest first: the jobs that match %(filter)s (console_job_filter) among
-- the %(scan)s newest below id %(before)s, at most %(limit)s of them. The window's lower
-- bound (`floor`: the lowest id it holds, from an index-only walk of the primary key) is
-- computed first, so the scan is a primary-key range however rare the matches are; every
-- row carries it, and a window without a match yields one row of NULLs with it. The next
-- page continues below the last row shown, or below the floor when the window ran out.
-- A filter served by another index (a graph, due order, running leases, finish time) has
-- its own statement below.
WITH bound AS (
    SELECT coalesce(min(w.id), 0) AS floor, count(*) AS scanned
    FROM (SELECT id FROM {schema}.jobs WHERE id < %(before)s ORDER BY id DESC LIMIT %(scan)s) AS w
)
SELECT b.floor, b.scanned, m.*
FROM bound AS b
LEFT JOIN LATERAL (
    SELECT {console_job_columns}  -- of j: bound has no column of these names
    FROM {schema}.jobs AS j
    WHERE j.id < %(before)s AND j.id >= b.floor
      AND {schema}.console_job_filter(%(filter)s::jsonb, j.queue, j.state::text, j.task, j.ordering_key,
                                      j.dedupe_key, j.last_error_code, j.created_at, j.payload, j.graph_id)
    ORDER BY j.id DESC
    LIMIT %(limit)s
) AS m ON true
ORDER BY m.id DESC;

-- name: console_jobs_graph_window
-- The jobs list of one graph (the filter's "graph", %(graph)s), newest first: as
-- console_jobs_window, but the window is the %(scan)s newest jobs of that graph below id
-- %(before)s, read from jobs_graph_idx (graph_id, id), never the whole table's newest; the
-- filter's other keys (console_job_filter) are checked on those jobs only. The jobs list,
-- the API and a bulk operation's count read it whenever the filter names a graph.
WITH bound AS (
    SELECT coalesce(min(w.id), 0) AS floor, count(*) AS scanned
    FROM (SELECT id FROM {schema}.jobs
          WHERE graph_id = %(graph)s AND graph_id IS NOT NULL AND id < %(before)s
          ORDER BY graph_id DESC, id DESC LIMIT %(scan)s) AS w
)
SELECT b.floor, b.scanned, m.*
FROM bound AS b
LEFT JOIN LATERAL (
    SELECT {console_job_columns}  -- of j: bound has no column of these names
    FROM {schema}.jobs AS j
    WHERE j.graph_id = %(graph)s AND j.graph_id IS NOT NULL AND j.id < %(before)s AND j.id >= b.floor
      AND {schema}.console_job_filter(%(filter)s::jsonb, j.queue, j.state::text, j.task, j.ordering_key,
                                      j.dedupe_key, j.last_error_code, j.created_at, j.payload, j.graph_id)
    ORDER BY j.graph_id DESC, j.id DESC
    LIMIT %(limit)s
) AS m ON true
ORDER BY m.id DESC;

-- name: console_jobs_due
-- Claimable jobs of one queue in due order (run_at, id), after the keyset position
-- (%(after_run_at)s, %(after_id)s): a range scan of jobs_due_idx (queue, run_at).
SELECT {console_job_columns}
FROM {schema}.jobs
WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
  AND (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint)
ORDER BY run_at, id
LIMIT %(limit)s;

-- name: console_jobs_running
-- Running jobs by lease expiry, soonest first, after the keyset position: the running
-- jobs (of every queue, or of one) on jobs_running_idx (queue), sorted by the lease read
-- from the rows. No index holds the lease (renewals stay HOT, migration 0010); the
-- running set is bounded by the claimers times their batch.
SELECT {console_job_columns}
FROM {schema}.jobs
WHERE state = 'running' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (lease_expires_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
ORDER BY lease_expires_at, id
LIMIT %(limit)s;

-- name: console_jobs_finished
-- Finished jobs of one state (succeeded, cancelled or dead: the literal arms let the
-- planner prove jobs_finished_idx's predicate), the last finished first, before the
-- keyset position (%(before_at)s, %(before_id)s): a backward range scan of
-- jobs_finished_idx (state, finished_at).
SELECT {console_job_columns}
FROM {schema}.jobs
WHERE ((%(state)s = 'succeeded' AND state = 'succeeded') OR (%(state)s = 'cancelled' AND state = 'cancelled')
       OR (%(state)s = 'dead' AND state = 'dead'))
  AND (finished_at, id) < (%(before_at)s::timestamptz, %(before_id)s::bigint)
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s;

-- name: console_jobs_dead_in_queue
-- Dead jobs of one queue, the last to die first, before the keyset position: a backward
-- range scan of jobs_dead_idx (queue, finished_at).
SELECT {console_job_columns}
FROM {schema}.jobs
WHERE queue = %(queue)s AND state = 'dead'
  AND (finished_at, id) < (%(before_at)s::timestamptz, %(before_id)s::bigint)
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s;

-- name: console_dead_groups
-- Dead jobs grouped by task and error code, with counts, first and last seen and the
-- newest job of each group: from the newest %(scan)s dead jobs (jobs_finished_idx, or
-- jobs_dead_idx for one queue), so a flood of dead jobs costs a bounded read; `scanned`
-- says how many were read (the page says so when it reached the bound).
SELECT d.task, d.last_error_code, count(*) AS jobs, min(d.finished_at) AS first_seen,
       max(d.finished_at) AS last_seen, max(d.id) AS newest_id, (sum(count(*)) OVER ())::bigint AS scanned
FROM (
    SELECT task, last_error_code, finished_at, id FROM {schema}.jobs
    WHERE state = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    ORDER BY finished_at DESC
    LIMIT %(scan)s
) AS d
GROUP BY d.task, d.last_error_code
ORDER BY jobs DESC, d.task, d.last_error_code
LIMIT %(limit)s;

-- name: console_dead_group_jobs
-- The jobs of one dead group (task, error code, optionally a queue), the last to die
-- first, before the keyset position (%(before_at)s, %(before_id)s): among the newest
-- %(scan)s dead jobs on jobs_finished_idx (or jobs_dead_idx for one queue), the group's
-- first %(limit)s. The inner LIMIT bounds what a rare group costs; the outer one stops
-- the walk as soon as a page is found. The dead set only, however long the history.
SELECT d.* FROM (
    SELECT {console_job_columns}
    FROM {schema}.jobs
    WHERE state = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (finished_at, id) < (%(before_at)s::timestamptz, %(before_id)s::bigint)
    ORDER BY finished_at DESC, id DESC
    LIMIT %(scan)s
) AS d
WHERE (%(task)s::text IS NULL OR d.task = %(task)s::text)
  AND (%(error_code)s::text IS NULL OR d.last_error_code = %(error_code)s::text)
ORDER BY d.finished_at DESC, d.id DESC
LIMIT %(limit)s;

-- name: console_dead_count
-- How many dead jobs match a group (task, error code, optionally a queue), up to %(cap)s:
-- the count shown before a bulk replay or discard of the group is confirmed. The dead set
-- only (jobs_finished_idx's dead range, or jobs_dead_idx for one queue), never the history.
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.jobs
    WHERE state = 'dead' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(error_code)s::text IS NULL OR last_error_code = %(error_code)s::text)
    LIMIT %(cap)s
) AS c;

-- name: console_job_tail
-- The newest job id (one descent of the primary key): the upper bound of a bulk
-- operation, and of the jobs list's first page.
SELECT coalesce(max(id), 0) FROM {schema}.jobs;

-- name: pod_heartbeat
-- The pod registry: insert or refresh this pod's row (its claimers and what each holds,
-- read from their slot tables), on the renewer's cadence. Returns nothing; a row whose
-- last_seen falls behind is shown as gone and pruned (pods_prune).
INSERT INTO {schema}.pods AS p (id, host, pid, version, queues, concurrency, drain, claimers)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(queues)s::text[], %(concurrency)s, %(drain)s,
        %(claimers)s::jsonb)
ON CONFLICT (id) DO UPDATE SET claimers = EXCLUDED.claimers, last_seen = now(), stopped_at = NULL;

-- name: pod_stop
-- A pod that stops cleanly says so (the page shows it stopped rather than gone).
UPDATE {schema}.pods SET stopped_at = now(), last_seen = now(), claimers = '[]'::jsonb
WHERE id = %(id)s;

-- name: pods_prune
-- Registry rows not refreshed for %(older_than)s seconds go (a pod killed never says it
-- stopped). The table holds a row per pod: a sequential scan of it is the plan.
DELETE FROM {schema}.pods WHERE last_seen < now() - make_interval(secs => %(older_than)s);

-- name: pods_list
-- Every registered pod, newest first, with its age by the database clock.
SELECT id, host, pid, version, queues, concurrency, drain, claimers, started_at, last_seen, stopped_at,
       extract(epoch FROM now() - last_seen)::float8 AS seen_seconds_ago
FROM {schema}.pods
ORDER BY started_at DESC, id
LIMIT %(limit)s;

-- name: pods_claiming
-- What `pgworker status` reads of the registry: the queues each pod claims and whether it
-- is alive (the columns a producer may read; a row per pod).
SELECT queues, stopped_at, extract(epoch FROM now() - last_seen)::float8 AS seen_seconds_ago
FROM {schema}.pods
LIMIT %(limit)s;

-- name: bulk_operation_create
-- Record a bulk operation (kind, normalised filter, who asked, why); it takes the jobs
-- up to the newest id at this moment. Returns its row.
INSERT INTO {schema}.bulk_operations (kind, filter, actor, max_id, expected, batch_size, reason)
VALUES (%(kind)s, %(filter)s::jsonb, %(actor)s, (SELECT coalesce(max(id), 0) FROM {schema}.jobs),
        %(expected)s, %(batch_size)s, %(reason)s)
RETURNING *;

-- name: bulk_operation_get
SELECT * FROM {schema}.bulk_operations WHERE id = %(id)s;

-- name: bulk_operations_list
-- Bulk operations, newest first, before the keyset position %(before)s.
SELECT * FROM {schema}.bulk_operations WHERE id < %(before)s ORDER BY id DESC LIMIT %(limit)s;

-- name: bulk_operation_claim
-- Take the oldest running operation for one batch: its row is locked until the batch
-- commits, so two appliers (console replicas) never apply one batch twice; one held by
-- another applier is skipped, not waited for (bulk_operations_running_idx).
SELECT * FROM {schema}.bulk_operations WHERE state = 'running' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;

-- name: bulk_operation_candidates
-- One batch of an operation: the next %(limit)s jobs by id after its cursor, up to its
-- max_id (a primary-key range), each with whether it matches the operation's filter and
-- its state. The cursor then moves to the last id read, matching or not, so a batch costs
-- at most %(limit)s rows however rare the matches are.
SELECT j.id, j.state::text AS state,
       {schema}.console_job_filter(%(filter)s::jsonb, j.queue, j.state::text, j.task, j.ordering_key,
                                   j.dedupe_key, j.last_error_code, j.created_at, j.payload, j.graph_id) AS matches
FROM {schema}.jobs AS j
WHERE j.id > %(after)s AND j.id <= %(max_id)s
ORDER BY j.id
LIMIT %(limit)s;

-- name: bulk_operation_candidates_graph
-- One batch of an operation whose filter names a graph (%(graph)s): as
-- bulk_operation_candidates, over that graph's jobs only (a range of jobs_graph_idx
-- (graph_id, id) after the cursor, up to max_id), so replaying a graph's dead jobs reads
-- the graph, not every job of the table.
SELECT j.id, j.state::text AS state,
       {schema}.console_job_filter(%(filter)s::jsonb, j.queue, j.state::text, j.task, j.ordering_key,
                                   j.dedupe_key, j.last_error_code, j.created_at, j.payload, j.graph_id) AS matches
FROM {schema}.jobs AS j
WHERE j.graph_id = %(graph)s AND j.graph_id IS NOT NULL AND j.id > %(after)s AND j.id <= %(max_id)s
ORDER BY j.graph_id, j.id
LIMIT %(limit)s;

-- name: bulk_operation_advance
-- Record a batch in the transaction that changed its jobs: the jobs it changed (the
-- primary key refuses a job changed twice by one operation), the cursor, the counts, and
-- `done` when the cursor reached max_id. Returns the row.
WITH linked AS (
    INSERT INTO {schema}.bulk_operation_jobs (operation_id, job_id)
    SELECT %(id)s, unnest(%(applied_ids)s::bigint[])
    RETURNING 1
)
UPDATE {schema}.bulk_operations AS o
SET cursor_id = %(cursor)s,
    examined = o.examined + %(examined)s,
    applied = o.applied + (SELECT count(*) FROM linked),
    updated_at = now(),
    state = CASE WHEN %(finished)s THEN 'done' ELSE o.state END,
    finished_at = CASE WHEN %(finished)s THEN now() ELSE o.finished_at END
WHERE o.id = %(id)s AND o.state = 'running'
RETURNING o.*;

-- name: bulk_operation_fail
-- An operation whose batch the database refused (a privilege, a constraint) stops with
-- the reason, bounded by the caller; what earlier batches did stays done.
UPDATE {schema}.bulk_operations SET state = 'failed', error = %(error)s, finished_at = now(), updated_at = now()
WHERE id = %(id)s AND state = 'running';

-- name: bulk_operation_cancel
-- Stop a running operation. A batch in flight holds the row lock: this waits for it (one
-- batch at most) and the operation stops between batches, its applied jobs left as they are.
UPDATE {schema}.bulk_operations
SET state = 'cancelled', cancelled_by = %(actor)s, finished_at = now(), updated_at = now()
WHERE id = %(id)s AND state = 'running'
RETURNING *;

-- name: bulk_operation_jobs_of
-- The jobs an operation changed, by id, after %(after)s (the operation's page and tests).
SELECT job_id FROM {schema}.bulk_operation_jobs
WHERE operation_id = %(id)s AND job_id > %(after)s ORDER BY job_id LIMIT %(limit)s;

-- name: bulk_operations_prune
-- Finished operations older than %(older_than)s seconds go, with their job rows
-- (bulk_operations_finished_idx; ON DELETE CASCADE on bulk_operation_jobs' primary key).
DELETE FROM {schema}.bulk_operations
WHERE state <> 'running' AND finished_at < now() - make_interval(secs => %(older_than)s);
