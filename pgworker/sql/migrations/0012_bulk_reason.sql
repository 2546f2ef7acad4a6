-- pgworker schema: a bulk cancel or discard keeps the operator's reason.
--   * bulk_operations.reason: why the operation was asked for (a cancel or a discard; a
--     replay keeps none, as a single job's replay keeps none), NULL for none. Each job the
--     operation changes gets it in its audit entry (job_events.detail, its key "reason"), as
--     `pgworker cancel --reason` writes it for one job: an operator cancelling 10,000 jobs
--     could not say why.
--   * Bounded as a single job's reason (pgworker.names.CANCEL_REASON_MAX_CHARS, 500
--     characters, blanks around it stripped and none for only blanks, so never empty):
--     the console and the API refuse a longer one before anything is recorded; the check
--     keeps any other writer to the same bound.
-- ADD COLUMN without a default changes no existing row (no rewrite); the CHECK reads the
-- table once to validate it (every row NULL, which passes), under the brief ACCESS
-- EXCLUSIVE lock of ALTER TABLE: the table holds one row per operation, 30 days of them.
-- {schema} is replaced by the quoted schema name before this file runs.

ALTER TABLE {schema}.bulk_operations
    ADD COLUMN reason text,
    ADD CONSTRAINT bulk_operations_reason_length CHECK (length(reason) BETWEEN 1 AND 500);
