-- The statements of a handler's own transaction (pgworker/effects/).
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- The completion inside a handler's transaction is job_complete itself (lease.sql),
-- run on the handler's connection: there is one success statement.

-- name: job_commit_read_back
-- Where a job stands after the COMMIT of a handler's transaction failed or its reply was
-- lost: whether that transaction committed is read from the row, never guessed. FOR
-- SHARE waits for a transaction still holding the row (the handler's, if its server
-- session has not finished yet), so the version read is the one that transaction left
-- (lock_timeout bounds the wait: then the caller cannot tell and says so).
SELECT state::text, lease_token FROM {schema}.jobs WHERE id = %(id)s FOR SHARE;
