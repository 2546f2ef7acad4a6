-- Results: what succeeded jobs' handlers returned (table job_results; written by the
-- fenced success, job_complete in lease.sql, never here).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.

-- name: job_result_get
-- Where a job stands and what it returned, for App.result / App.wait_result and
-- `pgworker jobs show`: its state and last error code, whether a result row exists
-- (none: the handler returned nothing, or the job has not succeeded), and the result
-- (NULL with a row: the success was recorded without it). No row: no such job (never
-- enqueued, or pruned with its result). A job still waiting for parents says how many,
-- and one of them that ended dead or cancelled (it holds the job until an operator
-- replays or cancels it: a waiter is told why nothing happens), through the edges'
-- child index; read only for such a job (CASE is lazy).
SELECT j.state::text AS state, j.last_error_code, r.job_id IS NOT NULL AS has_result, r.result,
       j.waiting_parents,
       CASE WHEN j.waiting_parents > 0 THEN (
           SELECT jsonb_build_object('id', p.id, 'state', p.state::text, 'code', p.last_error_code)
           FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS p ON p.id = d.parent_id
           WHERE d.child_id = j.id AND p.state IN ('dead', 'cancelled')
           ORDER BY p.id LIMIT 1) END AS stuck_parent
FROM {schema}.jobs AS j LEFT JOIN {schema}.job_results AS r ON r.job_id = j.id
WHERE j.id = %(id)s;
