-- The claim: FOR UPDATE SKIP LOCKED in one statement that commits at once, and the
-- queue lock that precedes it on a queue with a global limit.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

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
-- jobs running now under a lease that has not expired: the queue's running jobs on
-- jobs_running_idx (queue), each lease read from its row (no index holds the lease, so
-- that renewals can be HOT; the running jobs of a limited queue are about its limit); a
-- job whose worker died holds no slot while it waits for the reaper) and to the whole
-- tokens of the bucket,
-- refilled from tokens_at to this statement's start at rate_per_second and capped at the
-- burst. CASE evaluates lazily: an unlimited queue never runs the count.
--
-- Two arms pick the candidates (priority aging). aged: jobs due for longer than the
-- aging bound, oldest first, on jobs_due_idx (queue, run_at); with no bound the scan key
-- is NULL and the index scan returns at once. The priority arm (ranked_top, then
-- ranked_rest): the rest of the batch in priority order (priority DESC, run_at, id) on
-- jobs_claim_idx, excluding the rows the first arm took (our own locks would not make
-- SKIP LOCKED skip them). Both arms repeat the partial-index predicate (state =
-- 'pending' AND NOT blocked) so the planner can use the indexes, and lock with FOR
-- UPDATE SKIP LOCKED where the rows are chosen: concurrent claimers skip each other's
-- rows instead of waiting (PostgreSQL docs,
-- SELECT, "The Locking Clause"). Blocked jobs (not the head of their ordering key) are
-- absent from both indexes, so a claim never comes back short because of them.
--
-- The priority arm walks the queue's priorities one at a time (a loose index scan), so
-- that jobs scheduled later are not read: PostgreSQL 15 has no skip scan, and a single
-- scan ordered by (priority DESC, run_at, id) cannot bound run_at, so it read every
-- not-yet-due entry of each higher priority before the first due job of a lower one
-- (1,000,000 jobs scheduled later, a third at a higher priority: 20 ms per claim
-- instead of 1.5 ms). priorities: the recursive CTE descends jobs_claim_idx once per
-- distinct pending priority, highest first, lazily. ranked_top: for each, the range
-- run_at <= now() of that priority, until the batch is full. The outer LIMIT takes the
-- lateral rows in the order the nested loop yields them, priorities in the order the
-- recursion produced them (PostgreSQL wiki, "Loose indexscan"); the final SELECT sorts
-- the batch again.
--
-- Each priority walked costs about two index descents, even one whose jobs are all
-- scheduled later (then more than the scan it saves), so the walk stops after 8
-- priorities; ranked_rest then fills what is left of the batch with the single ordered
-- scan, over the priorities below the last one walked only. A claim thus costs at most
-- 16 descents more than the single scan, on queues with thousands of distinct
-- priorities too. ranked_rest runs only when the batch is not full and the walk stopped
-- at its cap (CASE evaluates lazily, and LIMIT 0 does not run its scan).
--
-- Floors (pgworker/claim_floors.py, migration 0013): a claimer passes, per priority, the
-- position (run_at, id) below which it knows no job of that priority is claimable
-- (%(floor_priorities)s, %(floor_at)s, %(floor_id)s), a run_at for the priorities it has
-- not met (%(floor_default)s: the walk's descents skip the entries below it in the index,
-- without reading their rows) and one for the aging arm (%(floor_aged)s); each range scan
-- starts there, one descent past the entries of jobs claimed since a snapshot that is still
-- held. NULL everywhere (App.claim, a claimer's first claim or after a drop) is the scan
-- from the start. The final SELECT returns the queue's horizon (claim_horizon: the epoch,
-- a time, and whether the try of the queue's bucket lock was granted), which the
-- claimer's next floors are capped with, how many jobs the aging arm took and its
-- bound, which say how far each arm ran, and now(), where the due ranges ended. The arms lock FOR NO KEY UPDATE, the lock the
-- update takes anyway: a row held FOR KEY SHARE (a foreign key's check) is not skipped.
--
-- Each claimed job gets attempts + 1, a new fencing token and a lease measured from
-- statement_timestamp() (the claim's own start, after any wait for queue_lock). The
-- bucket loses one token per claimed job. The caller commits at once and runs the jobs
-- outside any transaction.
--
-- retry_after_seconds: when the bucket is dry (under one whole token) AND a due job is
-- left that this claim did not take, the seconds until its next token; else NULL. An
-- empty bucket with nothing due owes no claim: a drain run that waited for the next
-- token anyway (an hour, for an hourly rate) stayed up with no work. The claimed rows
-- still read as pending in this statement's snapshot, hence NOT IN claimed. The check
-- is written as the first row in run_at order, not EXISTS: for EXISTS the planner
-- estimates that a sequential scan finds a pending row at once and picks it, through
-- every finished row; ORDER BY run_at makes it one descent of jobs_due_idx. CASE is
-- lazy, so it runs only when the bucket is dry.
--
-- Plans: every choice above holds without the parameters' values (no arm needs the
-- queue's name or the batch size to pick its index), and the claimer's session runs the
-- statement on its generic plan (pgworker.db.use_generic_plans): planning it costs about
-- 1.3 ms, half a claim of 100 again, and PostgreSQL left to choose planned most claims
-- of a drain anew (1,261 of 1,433). Dropped one at a time (benchmarks/claim_cost.py,
-- docs/benchmarks.md), no part above costs more than about 2.5 µs per job of a claim of
-- 100 (33.5 µs on the generic plan in that run): the walk, the final sort, ranked_rest,
-- retry_after_seconds, unblock_wait_seconds, and the aging arm without a bound (under
-- 1 µs, within the noise: not worth a second statement chosen per queue). The seeds'
-- one-statement claim on this table costs 28.3 µs: the rest is the table's rows and
-- indexes, not this statement.
WITH RECURSIVE floors AS MATERIALIZED (
    SELECT f.priority, f.at, f.id
    FROM unnest(%(floor_priorities)s::smallint[], %(floor_at)s::timestamptz[], %(floor_id)s::bigint[])
         AS f(priority, at, id)
), gate AS (
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
                                                     WHERE r.queue = %(queue)s AND r.state = 'running'
                                                       AND r.lease_expires_at > statement_timestamp())::int
                    END,
                    CASE WHEN g.rate_per_second IS NULL THEN %(limit)s::int
                         ELSE floor(g.tokens)::int END))
           END AS n
    FROM gate AS g
), aged AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
      AND run_at >= coalesce(%(floor_aged)s::timestamptz, '-infinity')
      AND run_at <= now() - make_interval(secs => (SELECT aging_seconds FROM gate))
    ORDER BY run_at
    LIMIT (SELECT n FROM allowance)
    FOR NO KEY UPDATE SKIP LOCKED
), priorities AS (
    (SELECT greatest(k.priority, d.priority) AS priority, 1 AS walked
     FROM (SELECT max(f.priority) AS priority FROM floors AS f) AS k
     LEFT JOIN LATERAL (
         SELECT j.priority
         FROM {schema}.jobs AS j
         WHERE j.queue = %(queue)s AND j.state = 'pending' AND NOT j.blocked
           AND j.priority > coalesce(k.priority, -32769) AND j.run_at >= coalesce(%(floor_default)s::timestamptz, '-infinity')
         ORDER BY j.priority DESC
         LIMIT 1) AS d ON true)
    UNION ALL
    SELECT (SELECT greatest(k.priority, d.priority)
            FROM (SELECT max(f.priority) AS priority FROM floors AS f WHERE f.priority < p.priority) AS k
            LEFT JOIN LATERAL (
                SELECT j.priority
                FROM {schema}.jobs AS j
                WHERE j.queue = %(queue)s AND j.state = 'pending' AND NOT j.blocked AND j.priority < p.priority
                  AND j.priority > coalesce(k.priority, -32769) AND j.run_at >= coalesce(%(floor_default)s::timestamptz, '-infinity')
                ORDER BY j.priority DESC
                LIMIT 1) AS d ON true),
           p.walked + 1
    FROM priorities AS p
    WHERE p.priority IS NOT NULL AND p.walked < 8
), ranked_top AS (
    SELECT c.id
    FROM priorities AS p
    CROSS JOIN LATERAL (
        SELECT coalesce(f.at, %(floor_default)s::timestamptz, '-infinity') AS at, coalesce(f.id, 0) AS id
        FROM (VALUES (1)) AS one (x)
        LEFT JOIN floors AS f ON f.priority = p.priority
    ) AS fl
    CROSS JOIN LATERAL (
        SELECT id
        FROM {schema}.jobs
        WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked
          AND priority = p.priority AND run_at <= now()
          -- from the claimer's floor (pgworker/claim_floors.py), a position (run_at, id):
          -- the row comparison is the index condition that starts the scan there; the
          -- plain run_at bound beside it, which it implies, keeps the generic plan on
          -- this index (without it the planner took jobs_due_idx, across priorities)
          AND run_at >= fl.at AND (run_at, id) >= (fl.at, fl.id)
          AND id NOT IN (SELECT id FROM aged)
        ORDER BY run_at, id
        LIMIT (SELECT n FROM allowance) - (SELECT count(*) FROM aged)
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    LIMIT (SELECT n FROM allowance) - (SELECT count(*) FROM aged)
), ranked_rest AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked AND run_at <= now()
      AND priority < (SELECT min(priority) FROM priorities)
      AND id NOT IN (SELECT id FROM aged)
    ORDER BY priority DESC, run_at, id
    LIMIT CASE WHEN (SELECT n FROM allowance) - (SELECT count(*) FROM aged) - (SELECT count(*) FROM ranked_top) <= 0
               THEN 0
               WHEN EXISTS (SELECT 1 FROM priorities
                            WHERE walked = 8 AND priority IS NOT NULL)
               THEN (SELECT n FROM allowance) - (SELECT count(*) FROM aged) - (SELECT count(*) FROM ranked_top)
               ELSE 0 END
    FOR NO KEY UPDATE SKIP LOCKED
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
    WHERE j.id = ANY (ARRAY(SELECT id FROM aged UNION ALL SELECT id FROM ranked_top
                            UNION ALL SELECT id FROM ranked_rest))
    RETURNING j.id, j.queue, j.task, j.payload, j.priority, j.attempts, j.max_attempts,
              j.lease_token, j.lease_expires_at, j.run_at, j.created_at, j.trace_context,
              j.ordering_key, j.dedupe_key,
              extract(epoch FROM statement_timestamp() - j.run_at)::float8 AS wait_seconds,
              j.id = ANY (ARRAY(SELECT id FROM aged)) AS aged,
              -- a dependent's first attempt: from unblocked (and due) to this claim
              CASE WHEN j.unblocked_at IS NOT NULL AND j.attempts = 1 THEN extract(epoch FROM
                  statement_timestamp() - greatest(j.unblocked_at, j.run_at))::float8 END AS unblock_wait_seconds
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
                 AND (SELECT w.run_at FROM {schema}.jobs AS w
                      WHERE w.queue = %(queue)s AND w.state = 'pending' AND NOT w.blocked
                        AND w.run_at <= now() AND w.id NOT IN (SELECT id FROM claimed)
                      ORDER BY w.run_at
                      LIMIT 1) IS NOT NULL
            THEN (1 - (a.tokens - (SELECT count(*) FROM claimed))) / a.rate_per_second
       END AS retry_after_seconds,
       h.at AS horizon_at, h.epoch AS horizon_epoch, h.granted AS horizon_granted,
       (SELECT count(*) FROM aged) AS aged_count, a.aging_seconds, now() AS due_until,
       c.id, c.queue, c.task, c.payload, c.priority, c.attempts, c.max_attempts, c.lease_token,
       c.lease_expires_at, c.run_at, c.created_at, c.trace_context, c.ordering_key, c.dedupe_key,
       c.wait_seconds, c.unblock_wait_seconds
FROM allowance AS a
CROSS JOIN {schema}.claim_horizon(%(queue)s) AS h
LEFT JOIN claimed AS c ON true
ORDER BY c.aged DESC, CASE WHEN c.aged THEN c.run_at END, c.priority DESC, c.run_at, c.id;

-- name: job_take_over
-- An idle claimer of the pod takes over a job that waits unstarted in a peer's batch:
-- fenced by id and token, it records itself as the lease's owner (so a WORKER_DIED entry
-- or `pgworker jobs show` names the claimer that really runs the job) and reads the claim's
-- columns (the peer's process holds the payload, not shared memory). The lease, its
-- expiry and the token are kept. No row: the lease was lost meanwhile, or has expired
-- (a job whose lease may be gone is never started; the reaper recovers it).
UPDATE {schema}.jobs AS j
SET lease_owner = %(owner)s
WHERE j.id = %(id)s AND j.state = 'running' AND j.lease_token = %(token)s AND j.lease_expires_at > now()
RETURNING j.id, j.queue, j.task, j.payload, j.priority, j.attempts, j.max_attempts, j.lease_token,
          j.lease_expires_at, j.run_at, j.created_at, j.trace_context, j.ordering_key, j.dedupe_key,
          extract(epoch FROM statement_timestamp() - j.run_at)::float8 AS wait_seconds;
