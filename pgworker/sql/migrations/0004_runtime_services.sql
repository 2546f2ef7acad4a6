-- pgworker schema, version 4: indexes for the worker's own services.
--   * a queue's global concurrency limit counts only running jobs whose lease has not
--     expired (a job whose worker died holds no slot while it waits for the reaper):
--     jobs_running_idx gains lease_expires_at, so the count is a range scan;
--   * retention (the pruner, and `pgworker prune`): finished jobs by state and finish
--     time, so each batch is a range scan of its own rows however much history is kept;
--     and the queues' audit trail by time.
-- CREATE INDEX (not CONCURRENTLY: migrations run in one transaction) blocks writes to
-- the jobs table while it builds; on a large table, migrate at a quiet moment.
-- {schema} is replaced by the quoted schema name before this file runs.

DROP INDEX {schema}.jobs_running_idx;
CREATE INDEX jobs_running_idx ON {schema}.jobs (queue, lease_expires_at) WHERE state = 'running';

CREATE INDEX jobs_finished_idx ON {schema}.jobs (state, finished_at)
    WHERE state IN ('succeeded', 'cancelled', 'dead');

CREATE INDEX queue_events_at_idx ON {schema}.queue_events (at);
