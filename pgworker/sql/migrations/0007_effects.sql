-- pgworker schema: durable steps and external effects of a job (issue 20).
-- Self-contained: it adds one table and changes nothing that exists, so its number can move.
--   * job_steps: one row per named step (ctx.step) or external effect (ctx.effect) of a
--     job, across its attempts. A step is written once, 'done' with its JSON result; an
--     effect is written 'started' before its call (with its idempotency key) and 'done'
--     with its result after. Every write presents the job's lease token (the statements
--     in sql/queries/effects.sql). Rows go with their job (ON DELETE CASCADE: the
--     pruner's delete reaches them through the primary key, job_id first).
-- {schema} is replaced by the quoted schema name before this file runs.

CREATE TABLE {schema}.job_steps (
    job_id          bigint NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    kind            text NOT NULL CHECK (kind IN ('step', 'effect')),
    status          text NOT NULL CHECK (status IN ('started', 'done')),
    result          jsonb,
    idempotency_key text,
    attempt         integer NOT NULL,
    lease_token     bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    -- who marked it done when an operator resolved an uncertain effect ('worker' otherwise)
    resolved_by     text,
    PRIMARY KEY (job_id, name),
    CHECK ((status = 'done') = (finished_at IS NOT NULL))
);
