-- Enqueueing: single and bulk inserts, their wake-ups, and deduplication.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

-- name: job_insert
-- Insert one job. A duplicate dedupe_key inserts nothing (the caller then looks up the
-- job holding it, dedupe_holders); ON CONFLICT DO NOTHING never raises, so the caller's
-- transaction survives. With an ordering key the caller took ordering_keys_lock in an
-- earlier statement, so the probe below (this statement's snapshot is newer than that
-- lock) sees every job of the key committed by writers that held the lock before us: the
-- job is blocked while any earlier job of its key is unfinished (a dead job counts while
-- it blocks its key): the head probe ordering_key_head (ordering.sql), the one
-- ordering_keys_promote uses. A job that is due now and unblocked wakes listeners:
-- NOTIFY is delivered at commit, never on rollback.
-- The job's run_at is claim_stamp's clock (plus the delay), taken under the queue's
-- bucket lock (migration 0013: what keeps a claimer's floors safe); a run_at given in the
-- past bumps the bucket's epoch instead (claim_backdate), once the row is in.
WITH stamp AS MATERIALIZED (
    SELECT {schema}.claim_stamp(ARRAY[%(queue)s::text]) AS at
), ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, run_at, max_attempts,
                               dedupe_key, dedupe_window, ordering_key, dead_blocks_key,
                               blocked, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
            coalesce(%(run_at)s::timestamptz, (SELECT at FROM stamp) + make_interval(secs => %(delay)s::float8)),
            %(max_attempts)s, %(dedupe_key)s, make_interval(secs => %(dedupe_window)s::float8),
            %(ordering_key)s::text, %(dead_blocks_key)s::boolean,
            %(ordering_key)s::text IS NOT NULL AND coalesce((
                SELECT h.ordering_key = k.key
                FROM (SELECT %(ordering_key)s::text AS key) AS k
                CROSS JOIN LATERAL ({ordering_key_head}) AS h), false),
            %(trace_context)s::jsonb)
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL
      AND (state IN ('pending', 'running') OR (state = 'succeeded' AND dedupe_until IS NOT NULL))
    DO NOTHING
    RETURNING id, queue, run_at, blocked
)
SELECT id,
       (CASE WHEN run_at <= (SELECT at FROM stamp) AND NOT blocked
             THEN pg_notify(%(channel)s, %(notify_payload)s) END) IS NULL AS notified,
       CASE WHEN run_at < (SELECT at FROM stamp) AND NOT blocked
            THEN {schema}.claim_backdate(ARRAY[queue]) END AS backdated
FROM ins;

-- name: job_insert_plain
-- Insert one job without a dedupe or an ordering key, the common case: job_insert without
-- the conflict arbiter and the ordering probe, and with fewer parameters to send. A job
-- due now wakes listeners (NOTIFY, delivered at commit, never on rollback). run_at as in
-- job_insert (claim_stamp, or claim_backdate for a run_at in the past).
WITH stamp AS MATERIALIZED (
    SELECT {schema}.claim_stamp(ARRAY[%(queue)s::text]) AS at
), ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, run_at, max_attempts, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s,
            coalesce(%(run_at)s::timestamptz, (SELECT at FROM stamp) + make_interval(secs => %(delay)s::float8)),
            %(max_attempts)s, %(trace_context)s::jsonb)
    RETURNING id, run_at
)
SELECT id, (CASE WHEN run_at <= (SELECT at FROM stamp) THEN pg_notify(%(channel)s, %(queue)s) END) IS NULL AS notified,
       CASE WHEN run_at < (SELECT at FROM stamp) THEN {schema}.claim_backdate(ARRAY[%(queue)s::text]) END AS backdated
FROM ins;

-- name: job_ids_allocate
-- Reserve ids for a bulk insert, so COPY (which cannot return them) still reports them,
-- and read the database clock for the batch's run_at: claim_stamp's, under the bucket
-- locks of the batch's queues, held until the transaction that inserts the batch ends
-- (migration 0013; the caller bumps the epoch with claim_backdate_queues for a run_at
-- given in the past). One row: the ids in order as comma-separated text (a row per id
-- cost the client more than the COPY of the jobs), and that clock.
SELECT string_agg(nextval(%(sequence)s::regclass)::text, ',' ORDER BY g),
       (SELECT {schema}.claim_stamp(%(queues)s::text[]))
FROM generate_series(1, %(count)s) AS g;

-- name: claim_backdate_queues
-- Jobs of these queues became claimable (or a claimable job was locked) with a run_at
-- before the transaction's claim_stamp: bump their buckets' epochs (migration 0013).
SELECT {schema}.claim_backdate(%(queues)s::text[]);

-- name: jobs_insert_batch
-- Bulk insert of jobs without dedupe or ordering keys (the keyed ones take
-- jobs_insert_many), in ONE statement, so a batch costs one round trip and, on an
-- autocommit connection, one transaction: the rows inserted with ids drawn from the
-- sequence, and one NOTIFY per queue that got a job due now (delivered at commit, never
-- on rollback). The NOTIFY CTE is read by the final SELECT so that it runs (a SELECT CTE
-- nobody reads is not evaluated). Input order: the scan of unnest() yields the jobs in
-- input order and nextval() runs in that order as the rows are inserted, and a session's
-- nextval() calls return increasing values (the sequence does not cycle), so the ids in
-- ascending order are the ids in input order; no CTE materialises the input to remember
-- it (which cost a fifth of the statement, EXPLAIN ANALYZE on 100 rows).
-- What travels is shaped for the client's cost, which dominated the call (Python
-- formatted every array element on its own; pgworker.store.batch): the payloads as ONE
-- text, the JSON texts joined by U+001E (JSON escapes every control character, so none
-- occurs inside a payload); the options jobs share (queue, task, priority, run_at,
-- delay, max_attempts) as small arrays of distinct "shapes", with each job's shape number
-- (1-based, comma-separated text; NULL when the batch has one shape); the trace context
-- once (one span per call). Returns one row: the ids in input order as comma-separated
-- text, the count of NOTIFYs, and of the buckets bumped for a run_at given in the past
-- (run_at is claim_stamp's clock plus the delay otherwise: job_insert).
WITH stamp AS MATERIALIZED (
    SELECT {schema}.claim_stamp(%(queues)s::text[]) AS at
), ins AS (
    INSERT INTO {schema}.jobs (id, queue, task, payload, priority, run_at, max_attempts, trace_context)
    SELECT nextval(%(sequence)s::regclass), (%(queues)s::text[])[x.s], (%(tasks)s::text[])[x.s],
           p.payload::jsonb, (%(priorities)s::smallint[])[x.s],
           coalesce((%(run_ats)s::timestamptz[])[x.s],
                    (SELECT at FROM stamp) + make_interval(secs => (%(delays)s::float8[])[x.s])),
           (%(max_attempts)s::int[])[x.s], %(trace_context)s::jsonb
    FROM unnest(string_to_array(%(payloads)s::text, E'\x1e'),
                string_to_array(%(shape_of)s::text, ',')::int[]) AS p(payload, shape),
         LATERAL (SELECT coalesce(p.shape, 1) AS s) AS x
    RETURNING id, queue, run_at <= (SELECT at FROM stamp) AS due, run_at < (SELECT at FROM stamp) AS backdated
), notified AS (
    SELECT count(pg_notify(%(channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM ins WHERE due) AS q
), backdated AS (
    SELECT {schema}.claim_backdate(ARRAY(SELECT DISTINCT queue FROM ins WHERE backdated)) AS n
)
SELECT string_agg(id::text, ',' ORDER BY id), (SELECT n FROM notified), (SELECT n FROM backdated) FROM ins;

-- name: jobs_insert_many
-- Bulk insert with dedupe and ordering keys (the COPY path takes the rest). Ids were
-- reserved by job_ids_allocate; the ordering keys were locked by ordering_keys_lock in
-- an earlier statement (see job_insert; the head probe is ordering_key_head). Within
-- the batch, later jobs of a key wait behind the first (row_number). ON CONFLICT DO
-- NOTHING also absorbs duplicates inside the batch: the first row with a dedupe key wins.
-- row_number counts the rows ON CONFLICT then refuses too, so a key whose job was refused
-- may be left with every job blocked: the caller (Store.insert_jobs_many) promotes those
-- keys afterwards, under the same locks, once the refused jobs are settled. Refused jobs
-- whose key turned out free are inserted again by this statement with their reserved ids.
-- run_at comes from job_ids_allocate's claim_stamp (plus each delay), so a job due now
-- has a run_at after this transaction's start: "due" compares it with the clock.
INSERT INTO {schema}.jobs (id, queue, task, payload, priority, run_at, max_attempts,
                           dedupe_key, dedupe_window, ordering_key, dead_blocks_key, blocked,
                           trace_context)
SELECT b.id, b.queue, b.task, b.payload, b.priority, b.run_at, b.max_attempts,
       b.dedupe_key, make_interval(secs => b.dedupe_window), b.ordering_key, b.dead_blocks_key,
       b.ordering_key IS NOT NULL AND (
           row_number() OVER (PARTITION BY b.ordering_key ORDER BY b.id) > 1
           OR coalesce((SELECT h.ordering_key = k.key
                        FROM (SELECT b.ordering_key AS key) AS k
                        CROSS JOIN LATERAL ({ordering_key_head}) AS h), false)),
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
RETURNING id, run_at <= clock_timestamp() AND NOT blocked AS due;

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
