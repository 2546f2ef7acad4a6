-- The test helpers (pgworker.testing): reads for assertions and drain results, and the
-- one write a drain makes besides the worker's own statements (skip_backoff).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for.
-- These run against a test's own throwaway schema, on small tables: no index is
-- designed for them.

-- name: testing_jobs
-- Jobs for assert_enqueued, enqueued_jobs and a drain's final states, oldest first.
-- Each filter is optional (NULL: any): ids, task, queue, states.
SELECT id, task, queue, payload, state::text AS state, priority, run_at, attempts, max_attempts,
       last_error_code, errors, dedupe_key, ordering_key, created_at, finished_at
FROM {schema}.jobs
WHERE (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(states)s::text[] IS NULL OR state::text = ANY(%(states)s::text[]))
ORDER BY id
LIMIT %(limit)s;

-- name: testing_next_job_id
-- The id after the highest one in the table: a drain without recursion runs only jobs
-- below it (those enqueued before it started).
SELECT coalesce(max(id), 0) + 1 FROM {schema}.jobs;

-- name: testing_run_now
-- skip_backoff: a retry or snooze the drain has just written becomes due now. Only the
-- row as that write left it: still pending under the same lease token (a claim would
-- have moved the token on), and only ever earlier.
UPDATE {schema}.jobs
SET run_at = now()
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'pending' AND run_at > now()
RETURNING id;
