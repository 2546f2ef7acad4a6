-- Queues as operators name them: is a name in use, and deleting a queue's settings row.
-- {schema} is the quoted schema name; values are always %(name)s parameters.

-- fragment: queue_settings_detail
-- What a queue's audit event records of its settings (queue_configure: the settings it
-- now has; queue_delete: those it had), from a row of the queues table named s.
jsonb_build_object('concurrency_limit', s.concurrency_limit, 'rate_per_second', s.rate_per_second,
                   'rate_burst', s.rate_burst, 'aging_seconds', s.aging_seconds)

-- name: queue_usage
-- Whether anything uses a queue name, for the warning on pausing or configuring one that
-- looks like a typo: claimable, running or dead jobs (each arm on its partial index:
-- jobs_due_idx, jobs_running_idx, jobs_dead_idx), a schedule that enqueues into it, its
-- settings row, and its history: an audit event (queue_events_queue_idx), or a job among
-- the %(recent)s that finished last, succeeded or cancelled (a real queue whose jobs had
-- just finished was called a typo). Finished jobs have no index by queue: each state is a
-- bounded walk of jobs_finished_idx from its newest end, never a count over the history.
SELECT EXISTS (SELECT 1 FROM {schema}.jobs WHERE queue = %(queue)s AND state = 'pending' AND NOT blocked)
       OR EXISTS (SELECT 1 FROM {schema}.jobs WHERE queue = %(queue)s AND state = 'running')
       OR EXISTS (SELECT 1 FROM {schema}.jobs WHERE queue = %(queue)s AND state = 'dead') AS has_jobs,
       EXISTS (SELECT 1 FROM {schema}.schedules WHERE queue = %(queue)s) AS scheduled,
       EXISTS (SELECT 1 FROM {schema}.queues WHERE name = %(queue)s) AS configured,
       EXISTS (SELECT 1 FROM {schema}.queue_events WHERE queue = %(queue)s) AS has_events,
       EXISTS (SELECT 1 FROM (SELECT queue FROM {schema}.jobs WHERE state = 'succeeded'
                              ORDER BY finished_at DESC LIMIT %(recent)s) AS s WHERE s.queue = %(queue)s)
       OR EXISTS (SELECT 1 FROM (SELECT queue FROM {schema}.jobs WHERE state = 'cancelled'
                                 ORDER BY finished_at DESC LIMIT %(recent)s) AS c
                  WHERE c.queue = %(queue)s) AS recently_finished;

-- name: queue_delete
-- Delete a queue's settings row (pause, concurrency and rate limits, token bucket, aging
-- bound), unless the queue is paused: deleting the row would resume it without a
-- 'resumed' event or a wake-up, so a paused queue must be resumed first. Jobs are not
-- touched: the queue's jobs run without policies, as in any queue without a row. The
-- target row is locked first, so a pause committing meanwhile is seen. Returns the row as
-- it was (deleted: whether it went; no row at all: the queue had none). Audited in
-- queue_events with the settings it had.
WITH target AS (
    SELECT q.name, q.paused_at, q.paused_by FROM {schema}.queues AS q
    WHERE q.name = %(queue)s FOR UPDATE
), deleted AS (
    DELETE FROM {schema}.queues AS q USING target AS t
    WHERE q.name = t.name AND t.paused_at IS NULL
    RETURNING q.name, q.concurrency_limit, q.rate_per_second, q.rate_burst, q.aging_seconds
), audit AS (
    INSERT INTO {schema}.queue_events (queue, kind, actor, detail)
    SELECT s.name, 'deleted', %(actor)s, {queue_settings_detail}
    FROM deleted AS s
)
SELECT t.name, t.paused_at, t.paused_by, d.name IS NOT NULL AS deleted, d.concurrency_limit,
       d.rate_per_second, d.rate_burst, d.aging_seconds
FROM target AS t LEFT JOIN deleted AS d ON true;
