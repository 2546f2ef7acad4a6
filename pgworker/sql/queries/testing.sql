-- The test helpers (pgworker.testing): reads for assertions and drain results, and the
-- one write a drain makes besides the worker's own statements (skip_backoff).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for.
-- These run against a test's own schema: no index is designed for them (a task index
-- would cost every enqueue in production). The reads order by the primary key, newest
-- first, and stop at their LIMIT: when many rows pass the filters the planner walks
-- jobs_pkey backward and stops there; a rare task costs one pass over the table, as no
-- index holds the task (tests/integration/test_testing_helpers.py checks both plans).

-- name: testing_jobs
-- Candidates for assert_enqueued, refute_enqueued and enqueued_jobs, and a drain's final
-- states: newest first, at most %(limit)s (the caller asks one more than it keeps, to
-- know whether the read was cut). Each filter is optional (NULL: any): ids, task, queue,
-- states, the exact payload (jsonb equality) and the contained payload (jsonb @>, looser
-- than the helpers' own match for arrays: the caller checks each row again). The state
-- is compared as the enum, not as text, so that the planner estimates it from the
-- column's statistics (the text cast hid them behind a fixed guess of a few hundred rows,
-- and it chose a full scan and sort over the primary key walk).
SELECT id, task, queue, payload, state::text AS state, priority, run_at, attempts, max_attempts,
       last_error_code, errors, dedupe_key, ordering_key, created_at, finished_at
FROM {schema}.jobs
WHERE (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]::{schema}.job_state[]))
  AND (%(payload)s::jsonb IS NULL OR payload = %(payload)s::jsonb)
  AND (%(contains)s::jsonb IS NULL OR payload @> %(contains)s::jsonb)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: testing_job_counts
-- Jobs by task and state among the newest %(limit)s, for a failed assertion's "Other
-- jobs" line: the newest rows by primary key, one more read to know whether older ones
-- were left out (`beyond`: that row's group; it is not counted).
SELECT task, state::text AS state, count(*) FILTER (WHERE n <= %(limit)s) AS n, bool_or(n > %(limit)s) AS beyond
FROM (SELECT task, state, row_number() OVER (ORDER BY id DESC) AS n
      FROM {schema}.jobs ORDER BY id DESC LIMIT %(limit)s + 1) AS newest
GROUP BY task, state
ORDER BY task, state;

-- name: testing_next_job_id
-- The id after the highest one in the table: a drain without recursion runs only jobs
-- below it (those enqueued before it started).
SELECT coalesce(max(id), 0) + 1 FROM {schema}.jobs;

-- name: testing_run_now
-- skip_backoff: a retry or snooze the drain has just written becomes due now. Only the
-- row as that write left it: still pending under the same lease token (a claim would
-- have moved the token on), and only ever earlier.
UPDATE {schema}.jobs
SET run_at = {schema}.claim_stamp(ARRAY[queue])  -- as a retry's run_at (migration 0013)
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'pending' AND run_at > now()
RETURNING id;
