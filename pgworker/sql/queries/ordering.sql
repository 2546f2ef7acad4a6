-- Per-key ordering: the key locks and the promotion of each key's next job (docs/scheduling.md).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

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

-- name: ordering_keys_try_lock
-- The same locks as ordering_keys_lock, for maintenance, which never waits: returns the
-- keys whose lock was granted at once; the caller skips the others this time (a
-- caller's open transaction that enqueued for a key holds its lock until it commits).
-- No waiting means no deadlock, so the order does not matter here.
SELECT k.key
FROM (SELECT DISTINCT key FROM unnest(%(keys)s::text[]) AS key) AS k
WHERE pg_try_advisory_xact_lock(hashtext(%(namespace)s), hashtext(k.key));

-- fragment: ordering_key_head
-- The head probe, written once: which job heads the ordering key k.key (the statement
-- around it names its key so: a relation k with a column key). The head is the oldest
-- unfinished job of the key, a dead job that blocks its key (dead_blocks_key) counting
-- as unfinished. Pasted into ordering_keys_promote (which unblocks a key's head) and
-- job_insert / jobs_insert_many (a new job is blocked when its key has a head already),
-- so the three cannot disagree on what a head is. One row at most: the first entry of
-- jobs_ordering_key_idx with ordering_key >= k.key in (ordering_key, id) order, which is
-- the key's head when its ordering_key = k.key (the caller checks that; otherwise the key
-- has no head). Written as a range in the index's order because only that index can
-- deliver it in one descent, however many jobs wait behind the head; with "ordering_key =
-- key ORDER BY id LIMIT 1" the planner may walk the primary key instead, expecting an
-- early match, and read every finished job of the table (it did, in the benchmark).
SELECT o.id, o.ordering_key, o.state, o.blocked
FROM {schema}.jobs o
WHERE o.ordering_key IS NOT NULL
  AND (o.state IN ('pending', 'running') OR (o.state = 'dead' AND o.dead_blocks_key))
  AND o.ordering_key >= k.key
ORDER BY o.ordering_key, o.id
LIMIT 1

-- name: ordering_keys_promote
-- For each key with no active job (claimable or running), unblock its head: the oldest
-- unfinished job, when it is pending and blocked. A dead job that blocks its key
-- (dead_blocks_key) is a head that cannot be promoted: the key waits until it is
-- replayed or discarded. Idempotent. Runs after ordering_keys_lock, in a new statement,
-- so its snapshot includes every job committed by writers that held the lock before us.
-- The "no active job" test keeps a replayed old job from running beside a newer job of
-- its key that is already active: it waits its turn, and is promoted when that one ends.
-- The head is the fragment ordering_key_head (below), the probe job_insert and
-- jobs_insert_many decide a new job's blocked flag with. The activity probe reads
-- jobs_ordering_active_idx (one entry per key).
WITH heads AS (
    SELECT h.id
    FROM unnest(%(keys)s::text[]) AS k(key)
    CROSS JOIN LATERAL ({ordering_key_head}) AS h
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
), backdated AS (
    -- a promoted head keeps the run_at of its enqueue (its place in line): its queue's
    -- claim epoch is bumped (migration 0013), a claimer's floor may be past it
    SELECT {schema}.claim_backdate(ARRAY(SELECT DISTINCT queue FROM promoted)) AS n
)
SELECT p.id, p.queue,
       (CASE WHEN p.run_at <= clock_timestamp() THEN pg_notify(%(channel)s, p.queue) END) IS NULL AS notified
FROM promoted AS p
WHERE (SELECT n FROM backdated) >= 0;

-- name: jobs_ordering_keys
-- The ordering keys of these jobs (an ordering key never changes, so no lock is needed):
-- read before a keyed transition so its key locks can be taken before its row locks.
SELECT id, ordering_key FROM {schema}.jobs
WHERE id = ANY(%(ids)s::bigint[]) AND ordering_key IS NOT NULL;
