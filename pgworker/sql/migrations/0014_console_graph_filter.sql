-- pgworker schema: the console's job filter takes a graph (docs/graphs.md, docs/web.md).
--   * console_job_filter gains a last argument, the job's graph_id, and reads the filter's
--     key "graph" (a graph id: the jobs enqueued with depends_on share one). A trial found
--     a graph browsable only through each job page's parent and child links: the jobs
--     list (`/jobs?graph=ID`, `/api/jobs?graph=ID`) and the bulk operations (replay or
--     cancel every job of a graph that a filter matches) share this one definition, so
--     both needed it. The list and a bulk operation with a graph read jobs_graph_idx
--     (graph_id, id) directly (their own statements in console.sql); this function still
--     decides every other key for them.
--   * A new argument is a new function, created beside the old one, which stays: a console
--     of the version before, still running while its pods are replaced, calls it (a
--     break-it trial: dropped, that console's job list failed with "function does not
--     exist ... run pgworker migrate" right after the migration). A later migration may
--     drop it. The old one's EXECUTE grants are given to the new one as they were
--     (`pgworker sql grants --viewer` grants it explicitly; a database whose default
--     privileges revoke EXECUTE from PUBLIC would otherwise lock the viewer out of the jobs
--     list): a function never granted anything keeps PostgreSQL's default, EXECUTE for
--     PUBLIC.
-- The schema's name may hold any character: it appears only as the quoted identifier of
-- search_path and of the function's names, never inside a string or the block's $$
-- quoting; search_path is put back as it was at the end (pg_temp last).
-- No table is touched: a function is added and no index is added.
-- {schema} is replaced by the quoted schema name before this file runs.

SELECT set_config('pgworker.migration_search_path', current_setting('search_path'), true);
SET LOCAL search_path = {schema}, pg_temp;
SELECT set_config('pgworker.console_job_filter_acl', coalesce(p.proacl::text, ''), true)
FROM pg_proc AS p
WHERE p.oid = 'console_job_filter(jsonb, text, text, text, text, text, text, timestamptz, jsonb)'::regprocedure;

CREATE FUNCTION {schema}.console_job_filter(f jsonb, queue text, state text, task text,
                                             ordering_key text, dedupe_key text,
                                             error_code text, created_at timestamptz,
                                             payload jsonb, graph_id bigint)
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
       AND (f->>'graph' IS NULL OR graph_id = (f->>'graph')::bigint)
$$;

-- The old function's grants (its ACL, read above), given again on the new one: PUBLIC's
-- EXECUTE revoked first when the old ACL did not hold it, then each EXECUTE it held.
DO $$
DECLARE
    old aclitem[] := nullif(current_setting('pgworker.console_job_filter_acl'), '')::aclitem[];
    item record;
BEGIN
    IF old IS NULL THEN
        RETURN;  -- never granted: the new function has the same default
    END IF;
    REVOKE ALL ON FUNCTION console_job_filter(jsonb, text, text, text, text, text, text, timestamptz, jsonb, bigint)
        FROM PUBLIC;
    FOR item IN SELECT a.grantee, a.is_grantable FROM aclexplode(old) AS a
                WHERE a.privilege_type = 'EXECUTE' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION console_job_filter(jsonb, text, text, text, text, text, text, '
                       'timestamptz, jsonb, bigint) TO %s%s',
                       CASE WHEN item.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(item.grantee)) END,
                       CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
SELECT set_config('search_path', current_setting('pgworker.migration_search_path'), true);
