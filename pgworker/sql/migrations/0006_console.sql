-- pgworker schema: the web console's own records (issue 24). Self-contained: it adds
-- tables and one function and changes nothing that exists, so its number can move.
--   * pods: the pod registry, one row per supervisor run, refreshed on the renewer's
--     cadence with what each claimer holds now (read from its slot table). Only the
--     console reads it; recovery never does (the reaper decides from leases alone).
--   * bulk_operations and bulk_operation_jobs: a replay, cancel or discard of every job
--     a filter matches, recorded with its filter and who asked, applied in bounded
--     batches that each advance the cursor in the transaction that changes the jobs, so a
--     crash loses no batch and repeats none; bulk_operation_jobs has one row per job an
--     operation changed (its primary key makes a second change of one job impossible).
--   * console_job_filter: the one definition of the console's job filter (the jobs list,
--     the count shown before a bulk operation, the operation's batches).
-- No index is added to jobs: each console statement reads an index that exists.
-- {schema} is replaced by the quoted schema name before this file runs.

-- The pod registry. A row is rewritten every renewal interval: no index but the primary
-- key, and fillfactor 50, so those updates stay HOT (the table holds a row per pod).
CREATE TABLE {schema}.pods (
    id          text PRIMARY KEY,
    host        text NOT NULL,
    pid         integer NOT NULL,
    version     text NOT NULL,
    queues      text[] NOT NULL,
    concurrency integer NOT NULL,
    drain       boolean NOT NULL DEFAULT false,
    -- One object per claimer: index, pid, idle, stopping, jobs_done, holding (how many
    -- jobs), holds (the first few: job_id, lease_token, slot state, seconds since claim).
    claimers    jsonb NOT NULL DEFAULT '[]'::jsonb,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    stopped_at  timestamptz,
    CONSTRAINT pods_id_length CHECK (length(id) BETWEEN 1 AND 300)
) WITH (fillfactor = 50);

-- Bulk operations on every job a filter matches (no cap), applied in batches.
CREATE TABLE {schema}.bulk_operations (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text NOT NULL,
    -- The console's job filter, normalised (console_job_filter reads it).
    filter       jsonb NOT NULL,
    actor        text NOT NULL,
    state        text NOT NULL DEFAULT 'running',
    -- The newest job id when it was asked for: jobs enqueued later are not taken.
    max_id       bigint NOT NULL,
    -- Every job id up to cursor_id has been examined (ascending, by primary key).
    cursor_id    bigint NOT NULL DEFAULT 0,
    examined     bigint NOT NULL DEFAULT 0,
    applied      bigint NOT NULL DEFAULT 0,
    -- The count shown when it was confirmed (capped: see console.sql).
    expected     bigint,
    batch_size   integer NOT NULL DEFAULT 1000,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    cancelled_by text,
    CONSTRAINT bulk_operations_kind CHECK (kind IN ('replay', 'cancel', 'discard')),
    CONSTRAINT bulk_operations_state CHECK (state IN ('running', 'done', 'cancelled', 'failed')),
    CONSTRAINT bulk_operations_batch_size CHECK (batch_size BETWEEN 1 AND 10000),
    CONSTRAINT bulk_operations_actor_length CHECK (length(actor) BETWEEN 1 AND 300)
);
-- The operations left to apply (the appliers' only question), and their retention.
CREATE INDEX bulk_operations_running_idx ON {schema}.bulk_operations (id) WHERE state = 'running';
CREATE INDEX bulk_operations_finished_idx ON {schema}.bulk_operations (finished_at)
    WHERE state <> 'running';

-- Each job a bulk operation changed, once. No foreign key to jobs: pruning a job must not
-- cost a lookup here (the rows go with their operation).
CREATE TABLE {schema}.bulk_operation_jobs (
    operation_id bigint NOT NULL REFERENCES {schema}.bulk_operations (id) ON DELETE CASCADE,
    job_id       bigint NOT NULL,
    PRIMARY KEY (operation_id, job_id)
);

-- Whether a job matches the console's filter `f` (jsonb, normalised by pgworker.web's
-- JobFilter: keys queue, state, task, ordering_key, dedupe_key, error_code,
-- created_after, created_before, payload). An absent key matches everything. Written
-- over the columns rather than the row so that the planner inlines it (a whole-row
-- argument would build a row value per job scanned).
CREATE FUNCTION {schema}.console_job_filter(f jsonb, queue text, state text, task text,
                                             ordering_key text, dedupe_key text,
                                             error_code text, created_at timestamptz,
                                             payload jsonb)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (f->>'queue' IS NULL OR queue = f->>'queue')
       AND (f->>'state' IS NULL OR state = f->>'state')
       AND (f->>'task' IS NULL OR task = f->>'task')
       AND (f->>'ordering_key' IS NULL OR ordering_key = f->>'ordering_key')
       AND (f->>'dedupe_key' IS NULL OR dedupe_key = f->>'dedupe_key')
       AND (f->>'error_code' IS NULL OR error_code = f->>'error_code')
       AND (f->>'created_after' IS NULL OR created_at >= (f->>'created_after')::timestamptz)
       AND (f->>'created_before' IS NULL OR created_at < (f->>'created_before')::timestamptz)
       AND (f->'payload' IS NULL OR payload @> (f->'payload'))
$$;
