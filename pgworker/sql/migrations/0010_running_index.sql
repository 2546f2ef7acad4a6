-- pgworker schema: one index on the running jobs, without the lease's expiry (issue 23).
--   * Before, two partial indexes on state = 'running' both held lease_expires_at:
--     jobs_lease_expiry_idx (lease_expires_at) for the reaper and jobs_running_idx
--     (queue, lease_expires_at) for the claim's count under a global concurrency limit.
--     Every claim inserted an entry into each, and every lease renewal, which moves
--     lease_expires_at, could never be a HOT update: a new row version with an entry in
--     every index whose predicate it satisfies, the primary key included.
--   * Now one index, jobs_running_idx (queue) WHERE state = 'running', serves both (and
--     every other question about running jobs: the per-queue counts, the console's and
--     `pgworker status`'s loose scan of the queues with running jobs). The reaper and the
--     concurrency count read lease_expires_at from the rows it points to: the running
--     set is bounded by the claimers times their batch, a few thousand rows however
--     large the history, so that filter costs little and runs only where it is asked
--     (the reaper's pass, a claim on a limited queue). No index holds lease_expires_at
--     or heartbeat_at any more, so a renewal, which writes only those two, is HOT when
--     its row's page has room (docs/architecture.md, "Indexes").
--   * The name jobs_running_idx is kept (the statements' comments, the KEDA query, the
--     plan tests name it); its definition is what it was at version 2.
-- DROP INDEX and CREATE INDEX (not CONCURRENTLY: migrations run in one transaction, and
-- CONCURRENTLY cannot run inside one) hold an ACCESS EXCLUSIVE lock on the jobs table
-- until the migration commits, and building the index reads the whole table (its
-- entries are the running jobs only): on a large table, migrate at a quiet moment, as
-- for migration 0004.
-- {schema} is replaced by the quoted schema name before this file runs.

DROP INDEX {schema}.jobs_lease_expiry_idx;
DROP INDEX {schema}.jobs_running_idx;

-- Running jobs per queue: the reaper (every queue, lease_expires_at read from the row),
-- the claim's count under a global concurrency limit (unexpired leases only, likewise),
-- the running counts.
CREATE INDEX jobs_running_idx ON {schema}.jobs (queue) WHERE state = 'running';

-- Fill factor 70 for the jobs table, so that renewals are HOT (issue 23, measured with
-- `python -m benchmarks.transition_costs --renewals 3`, docs/benchmarks.md): without an
-- index on the lease, a renewal can be HOT, but only on a page with room for the new
-- version. At the default (100) the claim leaves its rows on full pages and 21 % of
-- first renewals (42 % of third ones) were HOT; at 90, the same; at 70, 76 % of first
-- renewals and 96-99 % of later ones (the page's earlier versions are pruned and their
-- room reused). The claim and the completion gain too: a new version on the same page
-- needs no second tuple lock record and its WAL is prefix/suffix-compressed (claim +
-- completion 790 -> 701 WAL bytes per job). The price: pages are filled to 70 % by
-- inserts, so the pending backlog and the kept history take up to 1/0.7 the pages.
-- Only when no fill factor is set: an operator's own value stays (later migrations
-- never override an operator's storage parameters, migration 0003). It applies to pages
-- filled from now on; existing pages keep their rows until they are reused.
--
-- The schema's name may hold any character (a quote, a dollar sign): it appears here only
-- as the quoted identifier of search_path, never inside the block's string or its $$
-- quoting; search_path is put back as it was at the end (pg_temp last, so a temporary
-- table named jobs cannot stand in).
SELECT set_config('pgworker.migration_search_path', current_setting('search_path'), true);
SET LOCAL search_path = {schema}, pg_temp;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class AS c, unnest(c.reloptions) AS o
                   WHERE c.oid = 'jobs'::regclass AND o LIKE 'fillfactor=%') THEN
        ALTER TABLE jobs SET (fillfactor = 70);
    END IF;
END $$;
SELECT set_config('search_path', current_setting('pgworker.migration_search_path'), true);
