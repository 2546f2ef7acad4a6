-- pgworker schema: when a dependent was unblocked, and its parents' trace contexts (issue 21).
--   * jobs.unblocked_at: when the last of a job's parents succeeded (the trigger sets it in
--     the statement that unblocked the job); NULL for a job that never waited for a parent.
--     The claim reports, for a dependent's first attempt, the seconds from
--     greatest(unblocked_at, run_at) to the claim: the histogram
--     pgworker_job_unblock_wait_duration_seconds.
--   * trace_context of a waiting child gains, as each parent succeeds, that parent's W3C
--     traceparent in the array 'pgworker.parents' (at most 127, the first parents to
--     succeed; then 'pgworker.parents_dropped' counts the others), so that the child's
--     process span links to its parents' traces with no read at claim time (tracing.py).
--     A parent's own context is read here, as the schema's owner: producers have no
--     privilege on trace contexts. A parent that had already succeeded when the child was
--     enqueued is not waited for, and not linked.
-- {schema} is replaced by the quoted schema name before this file runs.

ALTER TABLE {schema}.jobs ADD COLUMN unblocked_at timestamptz;

CREATE OR REPLACE FUNCTION {schema}.job_dependencies_settle() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    channel text := 'pgworker.' || TG_TABLE_SCHEMA;
    n bigint;
BEGIN
    IF NEW.state = 'succeeded' THEN
        WITH ready AS (
            UPDATE jobs AS c
            SET waiting_parents = c.waiting_parents - 1,
                blocked = c.waiting_parents > 1,
                unblocked_at = CASE WHEN c.waiting_parents = 1 THEN now() ELSE c.unblocked_at END,
                trace_context = CASE
                    WHEN NOT coalesce(NEW.trace_context ? 'traceparent', false)
                         OR c.trace_context->>'traceparent' = NEW.trace_context->>'traceparent'
                         OR coalesce(c.trace_context->'pgworker.parents' ? (NEW.trace_context->>'traceparent'), false)
                        THEN c.trace_context
                    WHEN coalesce(jsonb_array_length(c.trace_context->'pgworker.parents'), 0) < 127
                        THEN jsonb_set(coalesce(c.trace_context, jsonb_build_object()), ARRAY['pgworker.parents'],
                                       coalesce(c.trace_context->'pgworker.parents', '[]')
                                       || to_jsonb(NEW.trace_context->>'traceparent'))
                    ELSE jsonb_set(c.trace_context, ARRAY['pgworker.parents_dropped'],
                                   to_jsonb(coalesce((c.trace_context->>'pgworker.parents_dropped')::int, 0) + 1))
                END
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
