-- pgworker schema: single-column rules of the jobs table as domains (issue 23).
--   * PostgreSQL evaluates every CHECK constraint of a table at every INSERT and UPDATE
--     of a row, whichever columns the statement writes, and parses each constraint's
--     expression again for every statement that writes the table. The claim and the
--     completion, which write neither a task's name nor a progress message, paid for all
--     14 of them, twice a job (a tenth of the server's cost of a claim and a completion,
--     measured: benchmarks/claim_cost.py, t-no-checks). A domain's constraint is checked
--     only where a value is written to a column of that type: a column the statement does
--     not assign is not checked again (PostgreSQL docs, CREATE DOMAIN).
--   * Nine columns take a domain that carries their old rule word for word (the old
--     constraints are dropped): attempts, max_attempts, progress, progress_message,
--     task, dedupe_window, created_at and lease_expires_at (the last two share job_time,
--     the range migration 0005 gave each). A value out of range is refused as before
--     (CheckViolation, the constraint named job_..._range or the like), by every writer,
--     raw SQL included; psycopg and every client read the base types back (a domain's
--     column is described by its base type).
--   * Five rules stay table constraints: queue's length and run_at's range (both columns
--     are keys of the claim's indexes: a new type rebuilds those indexes, reading the
--     whole table under this migration's lock), waiting_parents (jobs_waiting_idx's
--     predicate names it: likewise), and the two rules over two columns
--     (jobs_running_has_lease, jobs_schedule_slot_pair).
--   * How, without rewriting the table: each domain is created without its rule, the
--     columns take it (a binary-compatible type change: no rewrite, no index rebuilt), and
--     the rule is then added to the domain NOT VALID: enforced for every value written
--     from then on; not re-checked against the rows already there, which the table's
--     constraints (dropped in the same ALTER TABLE) held to the same rule. schema.sql
--     declares them NOT VALID too, so that both give the same catalog. The only read of
--     the table is jobs_running_has_lease's re-check (lease_expires_at changes type;
--     about 0.15 s per million rows), under the ALTER's ACCESS EXCLUSIVE lock.
-- {schema} is replaced by the quoted schema name before this file runs.

CREATE DOMAIN {schema}.job_attempts AS integer;
CREATE DOMAIN {schema}.job_max_attempts AS integer;
CREATE DOMAIN {schema}.job_progress AS real;
CREATE DOMAIN {schema}.job_progress_message AS text;
CREATE DOMAIN {schema}.job_task AS text;
CREATE DOMAIN {schema}.job_dedupe_window AS interval;
CREATE DOMAIN {schema}.job_time AS timestamptz;

ALTER TABLE {schema}.jobs
    DROP CONSTRAINT jobs_attempts_nonnegative,
    DROP CONSTRAINT jobs_max_attempts_positive,
    DROP CONSTRAINT jobs_progress_range,
    DROP CONSTRAINT jobs_progress_message_length,
    DROP CONSTRAINT jobs_task_length,
    DROP CONSTRAINT jobs_dedupe_window_positive,
    DROP CONSTRAINT jobs_created_at_range,
    DROP CONSTRAINT jobs_lease_expires_at_range,
    ALTER COLUMN attempts TYPE {schema}.job_attempts,
    ALTER COLUMN max_attempts TYPE {schema}.job_max_attempts,
    ALTER COLUMN progress TYPE {schema}.job_progress,
    ALTER COLUMN progress_message TYPE {schema}.job_progress_message,
    ALTER COLUMN task TYPE {schema}.job_task,
    ALTER COLUMN dedupe_window TYPE {schema}.job_dedupe_window,
    ALTER COLUMN created_at TYPE {schema}.job_time,
    ALTER COLUMN lease_expires_at TYPE {schema}.job_time;

ALTER DOMAIN {schema}.job_attempts
    ADD CONSTRAINT job_attempts_nonnegative CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN {schema}.job_max_attempts
    ADD CONSTRAINT job_max_attempts_positive CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN {schema}.job_progress
    ADD CONSTRAINT job_progress_range CHECK (VALUE BETWEEN 0 AND 1) NOT VALID;
ALTER DOMAIN {schema}.job_progress_message
    ADD CONSTRAINT job_progress_message_length CHECK (length(VALUE) <= 200) NOT VALID;
ALTER DOMAIN {schema}.job_task
    ADD CONSTRAINT job_task_length CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN {schema}.job_dedupe_window
    ADD CONSTRAINT job_dedupe_window_positive CHECK (VALUE > interval '0') NOT VALID;
-- Timestamps every claim can compute with and read back in any session time zone
-- (migration 0005 says why): created_at and lease_expires_at (run_at keeps its table
-- constraint, jobs_run_at_range, the same range).
ALTER DOMAIN {schema}.job_time
    ADD CONSTRAINT job_time_range
    CHECK (VALUE BETWEEN '1970-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00') NOT VALID;
