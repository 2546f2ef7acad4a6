-- pgworker schema, version 3: autovacuum storage parameters for the jobs table, a
-- high-churn table (every job is inserted, then updated two to four times: claimed,
-- renewed, settled; finished jobs are deleted by `pgworker prune`). docs/deploy.md,
-- "Vacuum and the jobs table", says why each value and how to change it.
-- {schema} is replaced by the quoted schema name before this file runs.
--
-- Autovacuum vacuums a table once its dead rows exceed
--     autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor * rows
-- (PostgreSQL docs, "Routine Vacuuming", "The Autovacuum Daemon"). The server's
-- defaults (50 + 20 %) scale with the history the table keeps: with a million finished
-- jobs, 200,000 dead rows before a vacuum, all of them walked by claims in the
-- meantime. Here the trigger barely grows with the history.
--
-- ALTER TABLE ... SET (storage parameters) takes a SHARE UPDATE EXCLUSIVE lock: it does
-- not block enqueues, claims or outcomes, only waits for a running vacuum of the table.
-- Operators may change these values with ALTER TABLE ... SET (...); later migrations
-- never SET or RESET them (a test checks), so an override stays.
--
-- No fillfactor: a lower one only helps HOT updates (a new row version on the same page
-- without new index entries), and HOT is impossible when an update changes an indexed
-- column. Every transition of a job does: the claim, release, snooze, failure and every
-- outcome change `state` (in the predicate of every partial index), the claim and each
-- lease renewal change `lease_expires_at` (jobs_lease_expiry_idx), retries and snoozes
-- `run_at` (jobs_claim_idx, jobs_due_idx). Free space kept on each page would only
-- make the table, and the history it holds, bigger.
ALTER TABLE {schema}.jobs SET (
    -- dead rows: 1,000 + 1 % of the rows (10,000 at a million rows, not 200,000)
    autovacuum_vacuum_scale_factor = 0.01,
    -- a quiet queue is not vacuumed on every autovacuum round (autovacuum_naptime, 1 min)
    -- for a few dead rows; a busy one (more than ~17 dead rows a second) reaches it
    -- within a round anyway
    autovacuum_vacuum_threshold = 1000,
    -- inserts alone (a backlog building while workers are away) trigger a vacuum after
    -- 1,000 + 1 % of the rows, so that pages are marked all-visible and frozen in small
    -- steps rather than by one anti-wraparound vacuum of the whole history
    autovacuum_vacuum_insert_scale_factor = 0.01,
    -- the planner's picture of the state mix (few pending and running rows beside many
    -- finished ones) steers the claim and statistics plans: re-analyze after 50 + 2 %
    -- of the rows changed (the default is 10 %)
    autovacuum_analyze_scale_factor = 0.02
);
