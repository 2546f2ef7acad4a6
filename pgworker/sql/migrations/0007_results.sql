-- pgworker schema: job results (issue 21).
--   * job_results keeps what a handler returned, one row per succeeded job that returned
--     something, written by the same fenced statement that records the success
--     (job_complete), so a result is stored exactly when its success is. A side table
--     keeps the hot jobs row narrow: the claim, renewals and outcomes never read it.
--   * result is the JSON the handler returned; SQL NULL means the success was recorded
--     without it (the claimer process died after deciding the success and its result did
--     not fit in shared memory: see docs/results.md).
--   * ON DELETE CASCADE: a result follows its job's retention (the pruner deletes the job,
--     its result goes in the same statement; the primary key is the cascade's index).
-- {schema} is replaced by the quoted schema name before this file runs.

CREATE TABLE {schema}.job_results (
    job_id bigint PRIMARY KEY REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    result jsonb,
    stored_at timestamptz NOT NULL DEFAULT now()
);
