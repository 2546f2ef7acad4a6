-- pgworker schema: the dependency trigger takes its dependents' locks in id order (issue 27).
--   * job_dependencies_settle's cancel and dead path cancelled a parent's waiting
--     descendants in the order its recursive scan met them, level by level: two sessions
--     cancelling (or failing dead) parents of one fan-in graph met the shared descendants
--     in opposite orders and deadlocked (tests/integration/test_dependencies.py,
--     test_two_cancels_whose_descendants_overlap_never_deadlock). It now locks every
--     doomed descendant in id order before updating any.
--   * Its success path locks the parent's children in id order first too (job_complete
--     already does so for a batch, children_locked; this covers every other success:
--     a handler's own transaction, App.complete).
--   * Several parents settled by one statement still meet their children parent by parent:
--     the statements that settle batches order them themselves (job_complete).
-- {schema} is replaced by the quoted schema name before this file runs.

CREATE OR REPLACE FUNCTION {schema}.job_dependencies_settle() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    channel text := 'pgworker.' || TG_TABLE_SCHEMA;
    n bigint;
BEGIN
    IF NEW.state = 'succeeded' THEN
        -- the children's locks in id order first (as every statement taking several):
        -- two sessions settling parents of shared children queue instead of deadlocking
        PERFORM 1 FROM jobs AS c
        WHERE c.id = ANY (ARRAY(SELECT d.child_id FROM job_dependencies AS d WHERE d.parent_id = NEW.id))
        ORDER BY c.id
        FOR NO KEY UPDATE OF c;
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
        ), locked AS (
            -- every doomed descendant locked in id order before any is updated: the scan
            -- meets them level by level, and two cancels of one graph's parents met the
            -- shared ones in opposite orders (DeadlockDetected)
            SELECT c.id FROM jobs AS c
            WHERE c.id = ANY (ARRAY(SELECT id FROM doomed))
            ORDER BY c.id
            FOR NO KEY UPDATE OF c
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
        FROM locked
        WHERE c.id = locked.id AND c.state = 'pending';
    END IF;
    RETURN NULL;
END $$;
