-- pgworker schema: job results and dependencies (issue 21).
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

-- Dependencies (issue 21): a job can wait for other jobs (its parents) to succeed.
--   * job_dependencies holds the edges. A parent must exist when its child is enqueued
--     (the enqueue locks it), so a cycle cannot be built. child_id cascades on delete;
--     parent_id has no foreign key: a parent's delete is handled by
--     job_dependencies_parent_gone (below), which needs the edges it removes.
--   * jobs.waiting_parents counts the parents that have not succeeded yet; while it is
--     above 0 the job is pending and `blocked`, the flag the claim's indexes already
--     leave out (jobs_claim_idx, jobs_due_idx: WHERE state = 'pending' AND NOT blocked),
--     so the claim needs no new condition and a job without parents no new index entry.
--     A job with parents cannot have an ordering key (the key's promotion owns `blocked`
--     for keyed jobs): the enqueue refuses the pair.
--   * jobs.has_children marks a parent, so that the triggers below fire for parents only
--     (their WHEN clause reads the row: a job without children queues no trigger event).
--   * jobs.cancel_on_parent_failure: the job's policy when a parent ends dead: false
--     (hold: it waits until the parent is replayed and succeeds), true (cancelled with
--     the parent's reason). A cancelled parent cancels its waiting children either way
--     (a cancelled job cannot be replayed: holding would hold forever).
--   * jobs.graph_id: the graph a job belongs to (the id of the graph's first job), for
--     listing, cancelling and replaying a graph as one.
ALTER TABLE {schema}.jobs
    ADD COLUMN waiting_parents integer NOT NULL DEFAULT 0,
    ADD COLUMN has_children boolean NOT NULL DEFAULT false,
    ADD COLUMN cancel_on_parent_failure boolean NOT NULL DEFAULT false,
    ADD COLUMN graph_id bigint,
    ADD CONSTRAINT jobs_waiting_parents_nonnegative CHECK (waiting_parents >= 0);

CREATE TABLE {schema}.job_dependencies (
    parent_id bigint NOT NULL,
    child_id  bigint NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_id, child_id)
);
-- a job's parents (`pgworker jobs show`, a dependent's context: its parents' results)
CREATE INDEX job_dependencies_child_idx ON {schema}.job_dependencies (child_id);
-- the jobs of a graph (listing, cancel and replay of a graph); only jobs of a graph have entries
CREATE INDEX jobs_graph_idx ON {schema}.jobs (graph_id, id) WHERE graph_id IS NOT NULL;
-- jobs waiting for parents, per queue (the blocked-jobs gauge); only waiting jobs have entries
CREATE INDEX jobs_waiting_idx ON {schema}.jobs (queue) WHERE state = 'pending' AND waiting_parents > 0;

-- A parent finished: the one place the dependency rule lives, run by every statement that
-- moves a parent to succeeded, dead or cancelled (the batched completer, a completion in
-- a handler's transaction, the reaper, a cancel), in that statement's transaction.
--   succeeded: each waiting child's counter goes down by one; the child whose counter
--     reaches 0 is unblocked (due at its run_at) and its queue is notified. The child's
--     row lock serialises parents completing at once (in two pods): each sees the
--     other's decrement (READ COMMITTED re-reads the updated row), so the child is
--     unblocked once. A parent succeeds once (no transition leaves succeeded), so it
--     counts once.
--   dead: the children whose policy is cancel, and everything waiting below them, are
--     cancelled with the parent's reason (code PARENT_DEAD); the others wait (replay).
--   cancelled: every waiting child, and everything waiting below, is cancelled
--     (PARENT_CANCELLED).
-- The cancelled descendants are found in one recursive statement, not by a trigger per
-- level (a chain of 100 would nest 100 triggers deep). SECURITY DEFINER (the schema's
-- owner): a worker role completing a parent needs no privileges on the children's
-- columns or the edges. The NOTIFY uses the channel pgworker.<schema> when that fits
-- in 63 bytes (else the fallback poll finds the child).
CREATE FUNCTION {schema}.job_dependencies_settle() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    channel text := 'pgworker.' || TG_TABLE_SCHEMA;
    n bigint;
BEGIN
    IF NEW.state = 'succeeded' THEN
        WITH ready AS (
            UPDATE jobs AS c
            SET waiting_parents = c.waiting_parents - 1,
                blocked = c.waiting_parents > 1
            FROM job_dependencies AS d
            WHERE d.parent_id = NEW.id AND c.id = d.child_id
              AND c.state = 'pending' AND c.waiting_parents > 0
            RETURNING c.queue, c.waiting_parents = 0 AND c.run_at <= now() AS due
        )
        SELECT count(CASE WHEN octet_length(channel) <= 63 THEN pg_notify(channel, q.queue) END) INTO n
        FROM (SELECT DISTINCT queue FROM ready WHERE due) AS q;
    ELSE
        WITH RECURSIVE doomed(id) AS (
            SELECT c.id FROM job_dependencies AS d JOIN jobs AS c ON c.id = d.child_id
            WHERE d.parent_id = NEW.id AND c.state = 'pending' AND c.waiting_parents > 0
              AND (NEW.state = 'cancelled' OR c.cancel_on_parent_failure)
            UNION
            SELECT c.id FROM doomed JOIN job_dependencies AS d ON d.parent_id = doomed.id
            JOIN jobs AS c ON c.id = d.child_id
            WHERE c.state = 'pending' AND c.waiting_parents > 0
        )
        UPDATE jobs AS c
        SET state = 'cancelled',
            finished_at = now(),
            last_error_code = 'PARENT_' || upper(NEW.state::text),
            errors = bounded_append(c.errors, jsonb_build_object(
                'attempt', c.attempts, 'at', now(), 'code', 'PARENT_' || upper(NEW.state::text),
                'message', format('job %s, which this job depends on, ended %s (%s); cancelled by the '
                                  'dependency policy', NEW.id, NEW.state, coalesce(NEW.last_error_code, 'no code')),
                'worker', NULL), 10)
        FROM doomed
        WHERE c.id = doomed.id AND c.state = 'pending';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_dependencies_settle
AFTER UPDATE OF state ON {schema}.jobs
FOR EACH ROW
WHEN (NEW.has_children AND NEW.state IS DISTINCT FROM OLD.state
      AND NEW.state IN ('succeeded', 'dead', 'cancelled'))
EXECUTE FUNCTION {schema}.job_dependencies_settle();

-- A parent was deleted (retention, or by hand): its edges go, and a child still waiting
-- for it (it had not succeeded) can never run: it is cancelled (PARENT_PRUNED), and what
-- waits below it follows through job_dependencies_settle. A parent that succeeded was
-- already counted: its children are not touched.
CREATE FUNCTION {schema}.job_dependencies_parent_gone() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    WITH gone AS (
        DELETE FROM job_dependencies WHERE parent_id = OLD.id RETURNING child_id
    )
    UPDATE jobs AS c
    SET state = 'cancelled',
        finished_at = now(),
        last_error_code = 'PARENT_PRUNED',
        errors = bounded_append(c.errors, jsonb_build_object(
            'attempt', c.attempts, 'at', now(), 'code', 'PARENT_PRUNED',
            'message', format('job %s, which this job depends on, was deleted while %s (retention); '
                              'the dependency can never be met', OLD.id, OLD.state),
            'worker', NULL), 10)
    FROM gone
    WHERE c.id = gone.child_id AND c.state = 'pending' AND c.waiting_parents > 0
      AND OLD.state <> 'succeeded';
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_dependencies_parent_gone
AFTER DELETE ON {schema}.jobs
FOR EACH ROW
WHEN (OLD.has_children)
EXECUTE FUNCTION {schema}.job_dependencies_parent_gone();

REVOKE ALL ON FUNCTION {schema}.job_dependencies_settle() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.job_dependencies_parent_gone() FROM PUBLIC;

-- Progress (issue 21): how far a running job has come, written by the handler
-- (ctx.progress), fenced by the lease token, rate-limited by the worker. No index holds
-- these columns, so the update is HOT when the page has room.
ALTER TABLE {schema}.jobs
    ADD COLUMN progress real,
    ADD COLUMN progress_message text,
    ADD COLUMN progress_at timestamptz,
    ADD CONSTRAINT jobs_progress_range CHECK (progress BETWEEN 0 AND 1),
    ADD CONSTRAINT jobs_progress_message_length CHECK (length(progress_message) <= 200);
