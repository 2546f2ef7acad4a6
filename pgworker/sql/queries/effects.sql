-- The statements of a handler's own transaction (pgworker/effects/).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- The completion inside a handler's transaction is job_complete itself (lease.sql),
-- run on the handler's connection: there is one success statement.

-- name: job_commit_read_back
-- Where a job stands after the COMMIT of a handler's transaction failed or its reply was
-- lost: whether that transaction committed is read from the row, never guessed. FOR
-- SHARE waits for a transaction still holding the row (the handler's, if its server
-- session has not finished yet), so the version read is the one that transaction left
-- (lock_timeout bounds the wait: then the caller cannot tell and says so). A claim skips
-- the row while it is held: if it is claimable by then (reaped meanwhile), its queue's
-- claim epoch is bumped (migration 0013).
WITH read AS (
    SELECT state::text AS state, lease_token, queue, blocked FROM {schema}.jobs WHERE id = %(id)s FOR SHARE
), backdated AS (
    SELECT {schema}.claim_backdate(ARRAY(SELECT queue FROM read WHERE state = 'pending' AND NOT blocked)) AS n
)
SELECT state, lease_token FROM read WHERE (SELECT n FROM backdated) >= 0;

-- name: job_step_get
-- A job's recorded step or effect by name (any attempt's): what ctx.step / ctx.effect
-- find before they run anything. Primary key lookup.
SELECT kind, status, result, idempotency_key FROM {schema}.job_steps
WHERE job_id = %(id)s AND name = %(name)s;

-- name: job_step_record
-- Record a step ('done' with its result) or an effect ('started', with its idempotency
-- key), fenced: only while the job is running under %(token)s, and only below
-- %(max_steps)s records per job. FOR KEY SHARE re-checks the fence on the row's latest
-- version, and is the lock the record's foreign key takes anyway: inside a handler's
-- transaction it is held until the block commits, and the reaper and the renewer (FOR
-- NO KEY UPDATE SKIP LOCKED) do not conflict with it, so a worker stalled inside the
-- block cannot keep its expired job from being reaped (FOR SHARE did: the job stayed
-- running past its lease); the block's fenced success then refuses and rolls it back. Returns whether the fence held (owned), the job's record
-- count before this one (steps), and whether the row was written (recorded: false with
-- owned and steps below the bound means a record of that name exists already).
WITH owner AS (
    SELECT j.id, j.attempts, j.lease_token FROM {schema}.jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.lease_token = %(token)s
    FOR KEY SHARE OF j
), counted AS (
    SELECT count(*) AS n FROM {schema}.job_steps WHERE job_id = %(id)s
), inserted AS (
    INSERT INTO {schema}.job_steps (job_id, name, kind, status, result, idempotency_key, attempt,
                                    lease_token, finished_at)
    SELECT o.id, %(name)s, %(kind)s, %(status)s, %(result)s::jsonb, %(key)s, o.attempts, o.lease_token,
           CASE WHEN %(status)s = 'done' THEN now() END
    FROM owner AS o, counted AS c WHERE c.n < %(max_steps)s
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING job_id
)
SELECT EXISTS (SELECT 1 FROM owner) AS owned, (SELECT n FROM counted) AS steps,
       EXISTS (SELECT 1 FROM inserted) AS recorded;

-- name: job_effect_done
-- An effect's 'done' record with its result, fenced as job_step_record (the job running
-- under %(token)s, its row locked FOR KEY SHARE). Returns the row when it took effect.
WITH owner AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.lease_token = %(token)s
    FOR KEY SHARE OF j
)
UPDATE {schema}.job_steps AS s
SET status = 'done', result = %(result)s::jsonb, finished_at = now(), resolved_by = %(by)s
FROM owner AS o
WHERE s.job_id = o.id AND s.name = %(name)s AND s.kind = 'effect' AND s.status = 'started'
RETURNING s.job_id;

-- name: job_steps_of
-- Every step and effect of a job, in the order they were first recorded (`jobs show`).
SELECT name, kind, status, result, idempotency_key, attempt, lease_token, created_at, finished_at,
       resolved_by
FROM {schema}.job_steps WHERE job_id = %(id)s ORDER BY created_at, name;

-- name: job_effects_uncertain
-- Effects of these jobs started by an attempt that never recorded their end (what a
-- replay without `effects resolve` runs into again, unless the handler reconciles):
-- (job_id, name), at most %(limit)s, by the primary key (job_id, name).
SELECT job_id, name FROM {schema}.job_steps
WHERE job_id = ANY(%(ids)s::bigint[]) AND kind = 'effect' AND status = 'started'
ORDER BY job_id, name
LIMIT %(limit)s;

-- name: job_effect_resolve
-- An operator's answer for an effect left 'started' (EFFECT_UNCERTAIN): mark it done with
-- the result they give (%(retry)s false), or forget the record so that the next attempt
-- makes the call again, with the same idempotency key (%(retry)s true). Only while the
-- job is not running (a running attempt owns its records). Returns the job's state.
WITH target AS (
    SELECT s.job_id, s.name, j.state::text AS state FROM {schema}.job_steps AS s
    JOIN {schema}.jobs AS j ON j.id = s.job_id
    WHERE s.job_id = %(id)s AND s.name = %(name)s AND s.kind = 'effect' AND s.status = 'started'
      AND j.state::text <> 'running'
    FOR UPDATE OF s, j
), backdated AS (
    -- the job's row was locked: a claim skips it, so a claimable one bumps its queue's
    -- claim epoch (migration 0013)
    SELECT {schema}.claim_backdate(ARRAY(SELECT j.queue FROM {schema}.jobs AS j, target AS t
                                         WHERE j.id = t.job_id AND t.state = 'pending' AND NOT j.blocked)) AS n
), done AS (
    UPDATE {schema}.job_steps AS s
    SET status = 'done', result = %(result)s::jsonb, finished_at = now(), resolved_by = %(by)s
    FROM target AS t WHERE NOT %(retry)s AND s.job_id = t.job_id AND s.name = t.name
    RETURNING s.job_id
), forgotten AS (
    DELETE FROM {schema}.job_steps AS s USING target AS t
    WHERE %(retry)s AND s.job_id = t.job_id AND s.name = t.name
    RETURNING s.job_id
)
SELECT t.state, (SELECT count(*) FROM done) + (SELECT count(*) FROM forgotten) AS changed FROM target AS t
WHERE (SELECT n FROM backdated) >= 0;

-- name: job_steps_clean
-- Forget every step and effect of these jobs (a clean replay: the next attempt runs them
-- all again), audited per job that had any ('steps_forgotten': how many, and the first 20
-- names; a trial found a clean replay left no trace of what it forgot). Returns how many
-- records went.
WITH gone AS (
    DELETE FROM {schema}.job_steps WHERE job_id = ANY(%(ids)s::bigint[]) RETURNING job_id, name
), audit AS (
    INSERT INTO {schema}.job_events (job_id, kind, actor, detail)
    SELECT job_id, 'steps_forgotten', %(actor)s,
           jsonb_build_object('count', count(*), 'names', to_jsonb((array_agg(name ORDER BY name))[1:20]))
    FROM gone
    GROUP BY job_id
)
SELECT count(*) FROM gone;
