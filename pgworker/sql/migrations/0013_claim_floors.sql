-- pgworker schema: claims that start from where they left off (issue 23, "flat under a
-- held snapshot"; docs/architecture.md, "Claim floors").
--   * A claim walks jobs_claim_idx from the start of its queue's range. A claimed job's
--     entry stays there until VACUUM removes it, and neither VACUUM nor an index scan
--     (kill_prior_tuple) may remove it while any snapshot older than the claim is held (a
--     report, pg_dump, a replica's query with hot_standby_feedback): every claim then
--     re-reads, row by row from the heap, every job claimed since that snapshot. Measured
--     (docs/benchmarks.md): 1,619 buffers a claim of 100 before a drain, 8,350 after
--     100,000 jobs, the drain at a third of its plain rate.
--   * A claimer now keeps, per queue and priority, a floor: a run_at below which no job of
--     that priority can be claimable, and starts each priority's range scan there
--     (pgworker/claim_floors.py says when a floor may move and why it is safe). What
--     makes a floor safe against jobs that become claimable later is this file:
--   * claim_stamp(queues): every statement that makes a job claimable with a fresh
--     run_at (an enqueue due now or after a delay, a retry, a snooze, a replay, "retry
--     now") first takes a shared transaction-level advisory lock of each queue's bucket
--     (hashtext(queue) & 15, so 16 keys per schema), then reads the clock: the jobs'
--     run_at is that time (plus any delay), never the transaction's start (now()).
--   * claim_horizon(queue): each claim reads its bucket's epoch, then the clock T, then
--     tries the bucket's lock exclusively, releasing it at once. Granted, no writer held
--     it at that instant: every writer that took it earlier has committed (the next
--     claim's snapshot sees its jobs), and every later one stamps its jobs after T. So
--     after the next claim, no job below T can appear that it did not see: the floors a
--     claimer computes are capped at T (the claimer's previous T, taken before its scan).
--     Not granted (writers in flight): T is the start of the oldest holder's transaction
--     (each stamps after it), read from pg_locks and pg_stat_activity, or NULL where a
--     holder's start is hidden; the epoch is then not a baseline.
--   * claim_backdate(queues): a statement that makes a job claimable with an older run_at
--     (a released job keeps its place, an ordering key's next job or a dependent is
--     unblocked, an enqueue with a run_at in the past, a periodic job for a past slot), or
--     that locks a claimable job without changing it (a dependent's enqueue locks its
--     parents; a claim skips a locked job, and its floor may pass it), bumps the bucket's
--     epoch while holding the same shared lock. A claimer that sees its bucket's epoch
--     change at a granted horizon drops its floors for that queue: the next claim walks
--     the range from the start, as every claim did before. The epoch is a sequence:
--     nextval is seen at once by every session, committed or not, and never rolled back.
--   * The three functions run with search_path set to this schema (the lock key is the
--     OID of claim_epoch_0, so two schemas never share one). claim_backdate and
--     claim_horizon touch the sequences and run as the schema's owner (SECURITY DEFINER);
--     claim_stamp only takes locks. EXECUTE stays granted to PUBLIC: locks and an epoch
--     bump cost a claimer at most a walk from the start, and a producer or worker role
--     of `pgworker sql grants` needs no new grant.
--   * The dependency trigger bumps the epoch of the queues whose dependents it unblocks.
-- No table is rewritten; the sequences and functions are new objects.
-- {schema} is replaced by the quoted schema name before this file runs.

CREATE SEQUENCE {schema}.claim_epoch_0;
CREATE SEQUENCE {schema}.claim_epoch_1;
CREATE SEQUENCE {schema}.claim_epoch_2;
CREATE SEQUENCE {schema}.claim_epoch_3;
CREATE SEQUENCE {schema}.claim_epoch_4;
CREATE SEQUENCE {schema}.claim_epoch_5;
CREATE SEQUENCE {schema}.claim_epoch_6;
CREATE SEQUENCE {schema}.claim_epoch_7;
CREATE SEQUENCE {schema}.claim_epoch_8;
CREATE SEQUENCE {schema}.claim_epoch_9;
CREATE SEQUENCE {schema}.claim_epoch_10;
CREATE SEQUENCE {schema}.claim_epoch_11;
CREATE SEQUENCE {schema}.claim_epoch_12;
CREATE SEQUENCE {schema}.claim_epoch_13;
CREATE SEQUENCE {schema}.claim_epoch_14;
CREATE SEQUENCE {schema}.claim_epoch_15;

-- The clock a statement stamps newly claimable jobs with, after taking the shared lock of
-- each queue's bucket (held until the transaction ends; re-taking one already held costs
-- a lookup in the backend's own lock table). Shared locks never wait for each other, and
-- the only exclusive holder (claim_horizon) never waits while it holds one: no deadlock.
CREATE FUNCTION {schema}.claim_stamp(queues text[]) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SET search_path = {schema}, pg_temp AS $$
DECLARE
    key integer := 'claim_epoch_0'::regclass::oid::integer;
    q text;
BEGIN
    FOREACH q IN ARRAY coalesce(queues, ARRAY[]::text[]) LOOP
        PERFORM pg_advisory_xact_lock_shared(key, hashtext(q) & 15);
    END LOOP;
    RETURN clock_timestamp();
END $$;

-- Jobs of these queues became claimable with a run_at older than this statement's clock
-- (or a claimable job was locked without being changed): bump each bucket's epoch, under
-- its shared lock (held until the transaction ends, so the bump is seen at a horizon only
-- once the jobs are committed). Returns the buckets bumped (repeats counted).
CREATE FUNCTION {schema}.claim_backdate(queues text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    key integer := 'claim_epoch_0'::regclass::oid::integer;
    q text;
    n integer := 0;
BEGIN
    FOREACH q IN ARRAY coalesce(queues, ARRAY[]::text[]) LOOP
        PERFORM pg_advisory_xact_lock_shared(key, hashtext(q) & 15);
        PERFORM nextval(('claim_epoch_' || (hashtext(q) & 15))::regclass);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- A claim's horizon for its queue's bucket: the epoch, then the time, then the exclusive
-- lock tried and released in one expression (no interrupt is served between the two
-- calls, so the session lock cannot be left behind). The epoch is read first: a bump
-- between the read and the lock shows as a change at the next horizon, one claim later,
-- never as none. granted: no writer held the lock. When writers held it (a producer's
-- open transaction that enqueued, a stream of producers), every job they stamp is
-- stamped after their transaction began: at is then the oldest such start (pg_locks,
-- pg_stat_activity), or NULL when a holder's start cannot be read (a prepared
-- transaction, or the schema's owner may not see another role's sessions: the
-- pg_read_all_stats role lets it). A horizon not granted never makes its epoch the
-- claimer's baseline (a holder may have bumped it and not committed yet).
CREATE FUNCTION {schema}.claim_horizon(queue text, OUT at timestamptz, OUT epoch bigint, OUT granted boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    key integer := 'claim_epoch_0'::regclass::oid::integer;
    bucket integer := hashtext(queue) & 15;
BEGIN
    epoch := coalesce(pg_sequence_last_value(('claim_epoch_' || bucket)::regclass), 0);
    at := clock_timestamp();
    granted := pg_try_advisory_lock(key, bucket) AND pg_advisory_unlock(key, bucket);
    IF NOT granted THEN
        SELECT CASE WHEN count(*) = 0 THEN at
                    WHEN bool_and(a.xact_start IS NOT NULL) THEN least(at, min(a.xact_start)) END,
               count(*) = 0
        INTO at, granted
        FROM pg_locks AS l
        LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.classid = key::oid AND l.objid = bucket::oid
          AND l.objsubid = 2 AND l.granted AND l.pid IS DISTINCT FROM pg_backend_pid();
    END IF;
END $$;

-- The dependency rule (migration 0011's) bumps the epoch of the queues whose dependents
-- it unblocks: they become claimable with the run_at of their enqueue.
CREATE OR REPLACE FUNCTION {schema}.job_dependencies_settle() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    channel text := 'pgworker.' || TG_TABLE_SCHEMA;
    due_queues text[];
    unblocked_queues text[];
BEGIN
    IF NEW.state = 'succeeded' THEN
        -- the children's locks in id order first (as every statement taking several):
        -- two sessions settling parents of shared children queue instead of deadlocking
        PERFORM 1 FROM jobs AS c
        WHERE c.id = ANY (ARRAY(SELECT d.child_id FROM job_dependencies AS d WHERE d.parent_id = NEW.id))
        ORDER BY c.id
        FOR NO KEY UPDATE OF c;
        WITH ready AS (
            UPDATE jobs AS c
            SET waiting_parents = c.waiting_parents - 1,
                blocked = c.waiting_parents > 1,
                unblocked_at = CASE WHEN c.waiting_parents = 1 THEN now() ELSE c.unblocked_at END,
                trace_context = CASE
                    WHEN NOT coalesce(NEW.trace_context ? 'traceparent', false)
                         OR c.trace_context->>'traceparent' = NEW.trace_context->>'traceparent'
                         OR coalesce(c.trace_context->'pgworker.parents' ? (NEW.trace_context->>'traceparent'), false)
                        THEN c.trace_context
                    WHEN coalesce(jsonb_array_length(c.trace_context->'pgworker.parents'), 0) < 127
                        THEN jsonb_set(coalesce(c.trace_context, jsonb_build_object()), ARRAY['pgworker.parents'],
                                       coalesce(c.trace_context->'pgworker.parents', '[]')
                                       || to_jsonb(NEW.trace_context->>'traceparent'))
                    ELSE jsonb_set(c.trace_context, ARRAY['pgworker.parents_dropped'],
                                   to_jsonb(coalesce((c.trace_context->>'pgworker.parents_dropped')::int, 0) + 1))
                END
            FROM job_dependencies AS d
            WHERE d.parent_id = NEW.id AND c.id = d.child_id
              AND c.state = 'pending' AND c.waiting_parents > 0
            RETURNING c.queue, c.waiting_parents = 0 AS unblocked, c.waiting_parents = 0 AND c.run_at <= now() AS due
        )
        SELECT array_agg(DISTINCT queue) FILTER (WHERE due), array_agg(DISTINCT queue) FILTER (WHERE unblocked)
        INTO due_queues, unblocked_queues
        FROM ready;
        PERFORM pg_notify(channel, q) FROM unnest(due_queues) AS q WHERE octet_length(channel) <= 63;
        PERFORM claim_backdate(unblocked_queues);
    ELSE
        WITH RECURSIVE doomed(id) AS (
            SELECT c.id FROM job_dependencies AS d JOIN jobs AS c ON c.id = d.child_id
            WHERE d.parent_id = NEW.id AND c.state = 'pending' AND c.waiting_parents > 0
              AND (NEW.state = 'cancelled' OR c.cancel_on_parent_failure)
            UNION
            SELECT c.id FROM doomed JOIN job_dependencies AS d ON d.parent_id = doomed.id
            JOIN jobs AS c ON c.id = d.child_id
            WHERE c.state = 'pending' AND c.waiting_parents > 0
        ), locked AS (
            -- every doomed descendant locked in id order before any is updated: the scan
            -- meets them level by level, and two cancels of one graph's parents met the
            -- shared ones in opposite orders (DeadlockDetected)
            SELECT c.id FROM jobs AS c
            WHERE c.id = ANY (ARRAY(SELECT id FROM doomed))
            ORDER BY c.id
            FOR NO KEY UPDATE OF c
        )
        UPDATE jobs AS c
        SET state = 'cancelled',
            finished_at = now(),
            last_error_code = 'PARENT_' || upper(NEW.state::text),
            errors = bounded_append(c.errors, jsonb_build_object(
                'attempt', c.attempts, 'at', now(), 'code', 'PARENT_' || upper(NEW.state::text),
                'message', format('job %s, which this job depends on, ended %s (%s); cancelled by the '
                                  'dependency policy', NEW.id, NEW.state, coalesce(NEW.last_error_code, 'no code')),
                'worker', NULL), 10)
        FROM locked
        WHERE c.id = locked.id AND c.state = 'pending';
    END IF;
    RETURN NULL;
END $$;
