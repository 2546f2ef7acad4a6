-- The jobs table's health, for the pgworker_table_* gauges of the metrics collector.
-- {schema} is the quoted schema name; values are always %(name)s parameters.
-- Each block starts with `-- name: NAME` and a comment saying what it is for; the name
-- is reused as the span suffix, the metric `operation` label and the log `action`.
-- Lease arithmetic uses the database clock (now()), never the worker's.
--
-- Why: a queue table is all updates and deletes. VACUUM may only remove a dead row
-- version once no snapshot can still see it (PostgreSQL docs, "Routine Vacuuming",
-- "Recovering Disk Space"): one old snapshot anywhere in the database (a
-- session left `idle in transaction`, a long report, a replication slot, a prepared
-- transaction) holds that horizon back for every table, dead rows pile up, and each
-- claim walks more of them.

-- name: table_health
-- One row about {schema}.jobs, read at scrape time with queue_stats (same session,
-- transaction and statement timeout):
--   * live_tuples, dead_tuples: the statistics system's estimates (pg_stat_user_tables
--     n_live_tup, n_dead_tup; after a VACUUM, n_dead_tup counts the dead rows it could
--     not remove yet);
--   * last_vacuum_age_seconds, last_autovacuum_age_seconds: since the last manual and
--     automatic vacuum finished (NULL when never, since the statistics were reset);
--   * size_bytes: pg_total_relation_size (heap, indexes, TOAST);
--   * the single oldest holder of the xmin horizon that VACUUM of this table obeys, or
--     NULLs when none: holder (backend, replication_slot, prepared_transaction),
--     holder_name, holder_state, horizon_xid (text, identifies the holding), lag_transactions
--     (age() of that xid: transactions started since) and held_seconds (when PostgreSQL
--     records it: xact_start of a backend, `prepared` of a prepared transaction).
-- Which holders count, as GetOldestNonRemovableTransactionId() computes it for a plain
-- table (src/backend/storage/ipc/procarray.c):
--   * sessions of this database only (others hold back shared catalogs, not this table),
--     plus processes attached to no database (a physical walsender, whose xmin carries a
--     standby's hot_standby_feedback); the older of backend_xmin (its snapshot) and
--     backend_xid (its own transaction id: a session that wrote holds the horizon with it
--     even between statements, when it has no snapshot). A snapshot's xmin is never newer
--     than the session's own xid, so coalesce(backend_xmin, backend_xid) is the older.
--     pg_stat_activity shows backend_xmin, backend_xid and application_name to every role;
--     state and xact_start only to the session's own role and members of
--     pg_read_all_stats (NULL otherwise).
--   * not a running lazy VACUUM (pg_stat_progress_vacuum): PostgreSQL ignores its xmin.
--   * replication slots by their xmin (pg_replication_slots: "VACUUM cannot remove tuples
--     deleted by any later transaction"); a slot's catalog_xmin holds back the system
--     catalogs only, not this table, so it is left out.
--   * prepared transactions of this database (pg_prepared_xacts).
-- Not this session itself (its own statement holds a fresh snapshot).
WITH holders AS (
    SELECT 'backend' AS holder,
           coalesce(nullif(a.application_name, ''), a.backend_type, '') AS holder_name,
           coalesce(a.state, 'unknown') AS holder_state,
           coalesce(a.backend_xmin, a.backend_xid)::text AS horizon_xid,
           age(coalesce(a.backend_xmin, a.backend_xid))::bigint AS lag_transactions,
           extract(epoch FROM now() - a.xact_start)::float8 AS held_seconds
    FROM pg_stat_activity a
    WHERE a.pid <> pg_backend_pid()
      AND coalesce(a.backend_xmin, a.backend_xid) IS NOT NULL
      AND (a.datname = current_database() OR a.datid IS NULL)
      AND a.pid NOT IN (SELECT v.pid FROM pg_stat_progress_vacuum v)
    UNION ALL
    SELECT 'replication_slot', s.slot_name::text,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           s.xmin::text, age(s.xmin)::bigint, NULL::float8
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared_transaction', p.gid, 'prepared',
           p.transaction::text, age(p.transaction)::bigint,
           extract(epoch FROM now() - p.prepared)::float8
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
)
SELECT t.n_live_tup AS live_tuples,
       t.n_dead_tup AS dead_tuples,
       extract(epoch FROM now() - t.last_vacuum)::float8 AS last_vacuum_age_seconds,
       extract(epoch FROM now() - t.last_autovacuum)::float8 AS last_autovacuum_age_seconds,
       pg_total_relation_size(t.relid) AS size_bytes,
       h.holder, h.holder_name, h.holder_state, h.horizon_xid, h.lag_transactions, h.held_seconds
FROM pg_stat_user_tables t
LEFT JOIN LATERAL (
    SELECT * FROM holders ORDER BY lag_transactions DESC LIMIT 1
) h ON true
WHERE t.schemaname = %(schema)s AND t.relname = 'jobs';
