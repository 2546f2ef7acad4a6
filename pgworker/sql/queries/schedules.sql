-- Periodic jobs: one row per schedule, each slot enqueued once (compare-and-set).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.

-- name: schedule_register
-- Record a declared schedule, or update it when its definition changed. A new schedule
-- (or one whose cron expression or time zone changed) starts at %(initial_slot)s, the
-- latest slot before now: slots from before it was declared are not owed. Dispatchers
-- of different versions that disagree on a definition overwrite each other; the slot
-- bookkeeping (last_slot) is never moved backwards by this.
INSERT INTO {schema}.schedules AS s (name, task, queue, cron, timezone, missed, last_slot, next_slot)
VALUES (%(name)s, %(task)s, %(queue)s, %(cron)s, %(timezone)s, %(missed)s, %(initial_slot)s,
        %(next_slot)s)
ON CONFLICT (name) DO UPDATE SET
    task = EXCLUDED.task, queue = EXCLUDED.queue, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, missed = EXCLUDED.missed,
    last_slot = CASE WHEN (s.cron, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone)
                     THEN greatest(s.last_slot, EXCLUDED.last_slot) ELSE s.last_slot END,
    updated_at = now()
WHERE (s.task, s.queue, s.cron, s.timezone, s.missed)
      IS DISTINCT FROM (EXCLUDED.task, EXCLUDED.queue, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.missed);

-- name: schedules_state
-- Where these schedules stand (the last slot enqueued or skipped), and the database clock.
-- A last_slot outside the years a Python datetime holds (1-9999, a day's margin for the
-- session's time zone), such as 'infinity' written by a manual UPDATE, cannot be read:
-- it comes back as text in unusable_slot instead, so that only its schedule fails.
SELECT s.name, CASE WHEN NOT u.unusable THEN s.last_slot END AS last_slot,
       CASE WHEN u.unusable THEN s.last_slot::text END AS unusable_slot,
       statement_timestamp() AS now
FROM {schema}.schedules AS s,
     LATERAL (SELECT s.last_slot NOT BETWEEN '0001-01-02 00:00+00' AND '9999-12-30 00:00+00'
              AS unusable) AS u
WHERE s.name = ANY(%(names)s::text[]);

-- name: schedule_fire
-- Advance a schedule to %(slot)s and, when %(enqueue)s, enqueue its job, in one
-- statement. The UPDATE is a compare-and-set: last_slot only moves forward and only to a
-- slot that is due by the database clock. Concurrent supervisors firing the same slot
-- queue on the schedule row's lock; once the first commits, the others re-check the
-- condition on the new row (READ COMMITTED re-evaluates a waited-for row) and update
-- nothing, so they insert nothing. jobs_schedule_slot_idx, a unique key per slot, backs
-- this up: ON CONFLICT DO NOTHING (no target: any unique index) refuses a second job
-- for a slot even if last_slot were reset. run_at is the slot, so a late slot shows its
-- lateness in the queue's age (and ages ahead of newer work). Wakes listeners.
WITH advanced AS (
    UPDATE {schema}.schedules AS s
    SET last_slot = %(slot)s, next_slot = %(next_slot)s,
        skipped_slots = s.skipped_slots + %(skipped)s, updated_at = now()
    WHERE s.name = %(name)s AND (s.last_slot IS NULL OR s.last_slot < %(slot)s)
      AND %(slot)s <= statement_timestamp()
    RETURNING s.name
), ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, run_at, max_attempts, schedule_name,
                               schedule_slot)
    SELECT %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(slot)s, %(max_attempts)s,
           a.name, %(slot)s
    FROM advanced AS a
    WHERE %(enqueue)s
    ON CONFLICT DO NOTHING
    RETURNING id, queue
)
SELECT (SELECT count(*) FROM advanced) > 0 AS advanced, i.id,
       (CASE WHEN i.id IS NOT NULL THEN pg_notify(%(channel)s, i.queue) END) IS NULL AS notified,
       -- the slot is in the past: the queue's claim epoch is bumped (migration 0013)
       CASE WHEN i.id IS NOT NULL THEN {schema}.claim_backdate(ARRAY[i.queue]) END AS backdated
FROM (VALUES (1)) AS one (x)
LEFT JOIN ins AS i ON true;

-- name: schedules_list
-- Every recorded schedule with its last job (on jobs_schedule_slot_idx). A slot no Python
-- datetime holds ('infinity' from a manual UPDATE, see schedules_state) comes back as text
-- in unusable_last_slot / unusable_next_slot, so that the listing still reads.
SELECT s.name, s.task, s.queue, s.cron, s.timezone, s.missed,
       CASE WHEN u.last_ok THEN s.last_slot END AS last_slot,
       CASE WHEN NOT u.last_ok THEN s.last_slot::text END AS unusable_last_slot,
       CASE WHEN u.next_ok THEN s.next_slot END AS next_slot,
       CASE WHEN NOT u.next_ok THEN s.next_slot::text END AS unusable_next_slot,
       s.skipped_slots, s.updated_at, lj.id AS last_job_id, lj.state AS last_job_state
FROM {schema}.schedules AS s
CROSS JOIN LATERAL (
    SELECT s.last_slot BETWEEN '0001-01-02 00:00+00' AND '9999-12-30 00:00+00' AS last_ok,
           s.next_slot IS NULL OR s.next_slot BETWEEN '0001-01-02 00:00+00' AND '9999-12-30 00:00+00'
               AS next_ok) AS u
LEFT JOIN LATERAL (
    SELECT j.id, j.state::text AS state FROM {schema}.jobs AS j
    WHERE j.schedule_name = s.name
    ORDER BY j.schedule_slot DESC
    LIMIT 1) AS lj ON true
ORDER BY s.name;
