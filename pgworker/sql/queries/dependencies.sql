-- Dependencies and graphs: the enqueue of jobs that wait for parents, and the reads of
-- the edges. The rule that unblocks or cancels children lives in one place, the trigger
-- job_dependencies_settle (migration 0008_graphs), fired by whatever statement finishes a parent.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.

-- name: job_parents_lock
-- The parents a new job will wait for, locked (FOR NO KEY UPDATE, in id order: two
-- enqueues of children of the same parents queue behind each other instead of
-- deadlocking) until the enqueue's transaction ends, so that none finishes between this
-- read and the child's insert: a parent that completes meanwhile is read after its commit
-- (READ COMMITTED re-reads a row it waited for), and a parent that completes later finds
-- the edge. Each is marked has_children (its triggers fire from now on). Returns the
-- parents found; the caller refuses the enqueue if one is missing. A claim skips a parent
-- locked here, so a claimable one bumps its queue's claim epoch (claim_backdate,
-- migration 0013): a claimer's floor may have passed it meanwhile.
WITH locked AS (
    SELECT id, queue, state::text AS state, blocked, graph_id, has_children, last_error_code
    FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[])
    ORDER BY id
    FOR NO KEY UPDATE
), flagged AS (
    UPDATE {schema}.jobs AS j SET has_children = true
    FROM locked AS l
    WHERE j.id = l.id AND NOT l.has_children
), backdated AS (
    SELECT {schema}.claim_backdate(ARRAY(SELECT DISTINCT queue FROM locked
                                         WHERE state = 'pending' AND NOT blocked)) AS n
)
SELECT id, state, graph_id, last_error_code FROM locked
WHERE (SELECT n FROM backdated) >= 0;

-- name: jobs_insert_graph
-- Insert jobs with their dependency columns (ids reserved by job_ids_allocate, run_at
-- from its claim_stamp clock, so "due" compares with the clock, not now()): a job with
-- waiting parents goes in blocked (out of the claim's indexes); a parent of jobs in the
-- same call goes in with has_children. No dedupe or ordering keys here (the caller
-- refuses them with depends_on). Returns each id and whether it is due now (for the
-- NOTIFY per queue).
INSERT INTO {schema}.jobs (id, queue, task, payload, priority, run_at, max_attempts, trace_context,
                           blocked, waiting_parents, has_children, cancel_on_parent_failure, graph_id)
SELECT b.id, b.queue, b.task, b.payload, b.priority, b.run_at, b.max_attempts, b.trace_context,
       b.waiting > 0, b.waiting, b.has_children, b.cancel_on_parent_failure, b.graph_id
FROM unnest(%(ids)s::bigint[], %(queues)s::text[], %(tasks)s::text[], %(payloads)s::jsonb[],
            %(priorities)s::smallint[], %(run_ats)s::timestamptz[], %(max_attempts)s::int[],
            %(trace_contexts)s::jsonb[], %(waiting)s::int[], %(has_children)s::boolean[],
            %(cancel_on_parent_failure)s::boolean[], %(graph_ids)s::bigint[])
     AS b(id, queue, task, payload, priority, run_at, max_attempts, trace_context, waiting, has_children,
          cancel_on_parent_failure, graph_id)
ORDER BY b.id
RETURNING id, run_at <= clock_timestamp() AND NOT blocked AS due;

-- name: job_dependencies_insert
-- The edges of the jobs just inserted (each parent locked or inserted by this transaction).
INSERT INTO {schema}.job_dependencies (parent_id, child_id)
SELECT p, c FROM unnest(%(parents)s::bigint[], %(children)s::bigint[]) AS e(p, c)
ON CONFLICT DO NOTHING;

-- name: job_parents_list
-- A job's parents with their states (and whether each stored a result), for `pgworker jobs show`.
SELECT p.id, p.task, p.state::text AS state, p.last_error_code
FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS p ON p.id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY p.id
LIMIT %(limit)s;

-- name: job_children_list
-- A job's children with their states, for `pgworker jobs show`.
SELECT c.id, c.task, c.state::text AS state, c.waiting_parents, c.last_error_code
FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS c ON c.id = d.child_id
WHERE d.parent_id = %(id)s
ORDER BY c.id
LIMIT %(limit)s;

-- name: job_parent_results
-- What a job's parents returned, for its handler (ctx.parent_results()): every parent
-- has succeeded when the child runs; a parent that returned nothing has no result row.
SELECT d.parent_id, r.job_id IS NOT NULL AS has_result, r.result
FROM {schema}.job_dependencies AS d LEFT JOIN {schema}.job_results AS r ON r.job_id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY d.parent_id;

-- name: graphs_existing
-- Which of the graph ids an enqueue names (graph_id=) exist: some job carries the id
-- (jobs_graph_idx answers each with one index probe). A graph id names no graph until a
-- job of it is enqueued (its first job's id), so a made-up or mistyped id is refused.
SELECT g FROM unnest(%(ids)s::bigint[]) AS g
WHERE EXISTS (SELECT 1 FROM {schema}.jobs WHERE graph_id = g);

-- name: graph_jobs
-- The jobs of a graph, oldest first, after the id %(after)s (keyset pages: cancel and
-- replay of a graph read every page; jobs_graph_idx serves it).
SELECT id, queue, task, state::text AS state, waiting_parents, last_error_code
FROM {schema}.jobs WHERE graph_id = %(graph_id)s AND graph_id IS NOT NULL AND id > %(after)s
ORDER BY id
LIMIT %(limit)s;

-- name: dependents_requeue
-- The jobs a dead parent's death cancelled wait again, once it is replayed: jobs
-- cancelled by the dependency policy (PARENT_DEAD) that are children of %(parents)s (the
-- jobs a replay just put back, or the layer this statement requeued before) or, for the
-- replay of a graph, jobs of the graph %(graph_id)s (NULL: none). Each waits again, blocked,
-- for those of its parents that have not succeeded, when none of them is cancelled or still
-- dead (a job whose other dead parent is replayed later comes back with that replay). The
-- caller runs it again with the jobs it requeued until it requeues nothing: each run frees
-- the next layer below (a graph's depth bounds the loop), at most %(limit)s jobs per run.
-- The one rule for every replay (App.replay, `pgworker dead replay`, the console, bulk
-- replays, replay_graph). Counters are recomputed from the edges, under the parents' locks
-- (taken as an enqueue takes them). Audited in job_events (kind replayed, the detail names
-- PARENT_DEAD). Returns the jobs requeued. Jobs with dependencies carry no ordering key, so
-- no key's head changes.
WITH candidates AS (
    SELECT c.id FROM {schema}.jobs AS c
    WHERE c.graph_id = %(graph_id)s::bigint AND c.graph_id IS NOT NULL AND c.state = 'cancelled'
      AND c.last_error_code = 'PARENT_DEAD'
    UNION
    SELECT c.id FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS c ON c.id = d.child_id
    WHERE d.parent_id = ANY(%(parents)s::bigint[]) AND c.state = 'cancelled' AND c.last_error_code = 'PARENT_DEAD'
), hopeful AS (
    -- a job behind a cancelled or dead parent is not a candidate (it would fill the limit
    -- and stop the loop); re-checked below under the parents' locks
    SELECT k.id FROM candidates AS k
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS p ON p.id = d.parent_id
        WHERE d.child_id = k.id AND p.state IN ('cancelled', 'dead'))
    ORDER BY k.id
    LIMIT %(limit)s
), parents AS (
    SELECT p.id, p.queue, p.state, p.blocked FROM {schema}.jobs AS p
    WHERE p.id IN (SELECT d.parent_id FROM {schema}.job_dependencies AS d WHERE d.child_id IN (SELECT id FROM hopeful))
    ORDER BY p.id
    FOR NO KEY UPDATE
), backdated AS (
    -- a claim skips a parent locked here: a claimable one bumps its queue's claim epoch
    -- (migration 0013), as job_parents_lock does
    SELECT {schema}.claim_backdate(ARRAY(SELECT DISTINCT queue FROM parents
                                         WHERE state = 'pending' AND NOT blocked)) AS n
), counted AS (
    SELECT d.child_id AS id, count(*) FILTER (WHERE p.state <> 'succeeded') AS waiting,
           bool_or(p.state IN ('cancelled', 'dead')) AS hopeless
    FROM {schema}.job_dependencies AS d JOIN parents AS p ON p.id = d.parent_id
    WHERE d.child_id IN (SELECT id FROM hopeful)
    GROUP BY d.child_id
), requeued AS (
    UPDATE {schema}.jobs AS j
    SET state = 'pending', finished_at = NULL, run_at = {schema}.claim_stamp(ARRAY[j.queue]), waiting_parents = k.waiting,
        blocked = k.waiting > 0, last_error_code = NULL
    FROM counted AS k
    WHERE j.id = k.id AND NOT k.hopeless AND j.state = 'cancelled' AND j.last_error_code = 'PARENT_DEAD'
    RETURNING j.id, j.queue, j.blocked
), audit AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
    SELECT r.id, 'replayed', %(actor)s,
           jsonb_strip_nulls(jsonb_build_object('cancelled_by', 'PARENT_DEAD', 'graph_id', %(graph_id)s::bigint))
    FROM requeued AS r
)
SELECT r.id, (CASE WHEN NOT r.blocked THEN pg_notify(%(channel)s, r.queue) END) IS NULL AS notified
FROM requeued AS r
WHERE (SELECT n FROM backdated) >= 0;

-- name: dependency_stats
-- Jobs waiting for parents, per queue, and how many of them wait behind a dead parent
-- (with the oldest such wait, since the parent died), for /metrics: read from
-- jobs_waiting_idx and the edges of the waiting jobs only.
SELECT w.queue, count(*) AS waiting,
       count(*) FILTER (WHERE w.dead_since IS NOT NULL) AS behind_dead,
       coalesce(extract(epoch FROM now() - min(w.dead_since)), 0)::float8 AS behind_dead_age_seconds
FROM (
    SELECT c.id, c.queue,
           (SELECT min(p.finished_at) FROM {schema}.job_dependencies AS d
            JOIN {schema}.jobs AS p ON p.id = d.parent_id
            WHERE d.child_id = c.id AND p.state = 'dead') AS dead_since
    FROM {schema}.jobs AS c
    WHERE c.state = 'pending' AND c.waiting_parents > 0
) AS w
GROUP BY w.queue;

-- name: jobs_list_graph
-- The jobs listing (jobs_list) for one graph, newest first, on jobs_graph_idx.
SELECT id, queue, task, state::text AS state, priority, run_at, attempts, max_attempts,
       lease_token, last_error_code, created_at, finished_at, waiting_parents, blocked
FROM {schema}.jobs
WHERE graph_id = %(graph_id)s AND graph_id IS NOT NULL
  AND (%(state)s::text IS NULL OR state = %(state)s::text::{schema}.job_state)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
ORDER BY graph_id DESC, id DESC
LIMIT %(limit)s;
