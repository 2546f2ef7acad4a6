-- pgworker schema, version 2: scheduling policies (docs/scheduling.md).
--   * per-queue settings and state: pause, a global concurrency limit, a token-bucket
--     rate limit, the priority-aging bound; and an audit trail of changes to them;
--   * deduplication that may outlive success (a hold until dedupe_until), still enforced
--     by a unique index;
--   * the dead-head policy of per-key ordering, and a unique index that makes "at most one
--     active job per ordering key" a constraint;
--   * periodic jobs: one row per schedule, one unique key per schedule slot.
-- {schema} is replaced by the quoted schema name before this file runs.

ALTER TABLE {schema}.jobs
    -- Per-key ordering: whether this job, once dead, keeps its ordering key blocked
    -- (the task's ordering_on_dead: 'block' = true, 'skip' = false).
    ADD COLUMN dead_blocks_key boolean NOT NULL DEFAULT true,
    -- Deduplication: how long after success the dedupe key stays held (NULL: released
    -- at success), and until when a succeeded job holds it.
    ADD COLUMN dedupe_window interval,
    ADD COLUMN dedupe_until timestamptz,
    -- Periodic jobs: the schedule and the slot (its cron time) this job was enqueued for.
    ADD COLUMN schedule_name text,
    ADD COLUMN schedule_slot timestamptz,
    ADD CONSTRAINT jobs_dedupe_window_positive CHECK (dedupe_window IS NULL OR dedupe_window > interval '0'),
    ADD CONSTRAINT jobs_schedule_slot_pair CHECK ((schedule_name IS NULL) = (schedule_slot IS NULL));

-- The key is held while a job is pending or running, and after success until
-- dedupe_until (set at success from dedupe_window). An expired hold is released by
-- setting dedupe_until to NULL (the enqueue conflict path) or by pruning the row. The
-- index predicate cannot mention now() (it must be immutable), hence the explicit release.
DROP INDEX {schema}.jobs_dedupe_key_idx;
CREATE UNIQUE INDEX jobs_dedupe_key_idx ON {schema}.jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL
      AND (state IN ('pending', 'running') OR (state = 'succeeded' AND dedupe_until IS NOT NULL));

-- The unfinished jobs of each ordering key in enqueue order (the head is the first): the
-- enqueue-time check and the promotion. A dead job counts only while it blocks its key.
DROP INDEX {schema}.jobs_ordering_key_idx;
CREATE INDEX jobs_ordering_key_idx ON {schema}.jobs (ordering_key, id)
    WHERE ordering_key IS NOT NULL
      AND (state IN ('pending', 'running') OR (state = 'dead' AND dead_blocks_key));

-- At most one active (claimable or running) job per ordering key, as a constraint: a
-- flaw in the promotion logic raises a unique violation instead of running two jobs of
-- a key at once. Also the promotion's "is anything of this key active?" probe.
CREATE UNIQUE INDEX jobs_ordering_active_idx ON {schema}.jobs (ordering_key)
    WHERE ordering_key IS NOT NULL AND (state = 'running' OR (state = 'pending' AND NOT blocked));

-- Running jobs per queue: the claim's count under a global concurrency limit.
CREATE INDEX jobs_running_idx ON {schema}.jobs (queue) WHERE state = 'running';

-- One key per schedule slot: a slot is enqueued at most once however many dispatchers run.
CREATE UNIQUE INDEX jobs_schedule_slot_idx ON {schema}.jobs (schedule_name, schedule_slot)
    WHERE schedule_name IS NOT NULL;

-- Settings and state of a queue; a queue without a row has none of these policies. The
-- claim reads the row by primary key; a limited queue's claims lock it (one at a time
-- across pods) so the running count and the token bucket are read after the lock.
CREATE TABLE {schema}.queues (
    name              text PRIMARY KEY,
    paused_at         timestamptz,
    paused_by         text,
    -- Most jobs of this queue running at once, across every pod.
    concurrency_limit integer,
    -- Token bucket: refills at rate_per_second up to rate_burst; each claimed job takes one.
    rate_per_second   double precision,
    rate_burst        double precision,
    tokens            double precision,
    tokens_at         timestamptz,
    -- A job due for longer than this is claimed before higher-priority jobs (priority aging).
    aging_seconds     double precision,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_name_length CHECK (length(name) BETWEEN 1 AND 128),
    CONSTRAINT queues_concurrency_limit_positive CHECK (concurrency_limit IS NULL OR concurrency_limit >= 1),
    CONSTRAINT queues_rate_positive CHECK (rate_per_second IS NULL OR rate_per_second > 0),
    CONSTRAINT queues_rate_burst CHECK ((rate_per_second IS NULL) = (rate_burst IS NULL)
                                        AND (rate_burst IS NULL OR rate_burst >= 1)),
    CONSTRAINT queues_aging_positive CHECK (aging_seconds IS NULL OR aging_seconds > 0)
);

-- Operator actions on queues (pause, resume, limit changes), who did them and when.
CREATE TABLE {schema}.queue_events (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue  text NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    kind   text NOT NULL,
    actor  text,
    detail jsonb
);
CREATE INDEX queue_events_queue_idx ON {schema}.queue_events (queue, id);

-- Periodic jobs: one row per schedule. last_slot only moves forward (compare-and-set),
-- so each slot is enqueued (or skipped) once whichever dispatcher gets there first.
CREATE TABLE {schema}.schedules (
    name          text PRIMARY KEY,
    task          text NOT NULL,
    queue         text NOT NULL,
    cron          text NOT NULL,
    timezone      text NOT NULL,
    missed        text NOT NULL DEFAULT 'latest',
    last_slot     timestamptz,
    next_slot     timestamptz,
    skipped_slots bigint NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_missed_policy CHECK (missed IN ('latest', 'skip'))
);
