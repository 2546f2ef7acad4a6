"""Enqueueing: single and bulk inserts, their wake-ups, deduplication (sql/queries/enqueue.sql)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg
from psycopg import sql

from .base import StoreBase, atomic


class EnqueueStatements(StoreBase):
    """Enqueue: inserts, bulk inserts, dedupe holders, wake-ups."""

    def insert_job(self, conn: psycopg.Connection, *, queue: str, task: str, payload_json: str,
                   priority: int, run_at: datetime | None, delay_seconds: float, max_attempts: int,
                   dedupe_key: str | None, ordering_key: str | None,
                   trace_context: str | None, dedupe_window_seconds: float | None = None,
                   dead_blocks_key: bool = True) -> int | None:
        """Insert one job (and its wake-up); returns its id, or None on a dedupe conflict."""
        if dedupe_key is None and ordering_key is None:
            return self._exec(conn, "job_insert_plain", {
                "queue": queue, "task": task, "payload": payload_json, "priority": priority, "run_at": run_at,
                "delay": delay_seconds, "max_attempts": max_attempts, "trace_context": trace_context,
                "channel": self.channel}).fetchone()[0]
        params = {
            "queue": queue, "task": task, "payload": payload_json, "priority": priority,
            "run_at": run_at, "delay": delay_seconds, "max_attempts": max_attempts,
            "dedupe_key": dedupe_key, "dedupe_window": dedupe_window_seconds,
            "ordering_key": ordering_key, "dead_blocks_key": dead_blocks_key,
            "trace_context": trace_context, "channel": self.channel, "notify_payload": queue,
        }
        if ordering_key is not None:
            with atomic(conn):
                self.lock_ordering_keys(conn, [ordering_key])
                row = self._exec(conn, "job_insert", params).fetchone()
        else:
            row = self._exec(conn, "job_insert", params).fetchone()
        return row[0] if row else None

    def allocate_ids(self, conn: psycopg.Connection, count: int) -> tuple[list[int], datetime]:
        """Reserve ``count`` job ids from the jobs sequence; also returns the database's now()."""
        rows = self._exec(conn, "job_ids_allocate", {"sequence": self._sequence, "count": count}).fetchall()
        return [r[0] for r in rows], rows[0][1]

    def insert_jobs_batch(self, conn: psycopg.Connection, rows: dict[str, list[Any]]) -> list[int]:
        """Insert jobs without dedupe or ordering keys in one statement (and one NOTIFY per
        queue with a job due now); ``rows`` holds one list per column (queues, tasks,
        payloads as JSON text, priorities, run_ats, delays in seconds, max_attempts,
        trace_contexts). Returns the new ids in input order."""
        cur = self._exec(conn, "jobs_insert_batch", {**rows, "sequence": self._sequence, "channel": self.channel})
        return [r[0] for r in cur.fetchall()]

    def insert_jobs_many(self, conn: psycopg.Connection, rows: dict[str, list[Any]]) -> dict[int, bool]:
        """Bulk insert with dedupe/ordering keys; returns {inserted id: due now}."""
        keys = sorted({k for k in rows["ordering_keys"] if k is not None})
        if keys:
            self.lock_ordering_keys(conn, keys)
        cur = self._exec(conn, "jobs_insert_many", rows)
        return {r[0]: r[1] for r in cur.fetchall()}

    def copy_jobs(self, conn: psycopg.Connection, rows: Iterable[tuple[Any, ...]]) -> None:
        """COPY jobs without dedupe or ordering keys (ids reserved by :meth:`allocate_ids`).

        Text format: payload and trace context arrive as JSON text and go in as they are
        (the server parses jsonb from text in either format), so no row needs a Python
        jsonb wrapper and psycopg formats each row in C.
        """
        stmt = sql.SQL("COPY {} (id, queue, task, payload, priority, run_at, max_attempts, trace_context) "
                       "FROM STDIN").format(self._jobs_table)
        with conn.cursor() as cur:
            with cur.copy(stmt) as copy:
                for r in rows:
                    copy.write_row(r)

    def dedupe_holders(self, conn: psycopg.Connection, keys: Sequence[str]) -> dict[str, int]:
        """{dedupe key: id of the job holding it}, after releasing expired holds; a key
        missing from the result is free (insert again)."""
        cur = self._exec(conn, "dedupe_holders", {"keys": sorted(set(keys))})
        return {r[0]: r[1] for r in cur.fetchall()}

    def notify_queues(self, conn: psycopg.Connection, queues: Iterable[str]) -> None:
        """One NOTIFY per queue (delivered when the transaction commits)."""
        payloads = sorted(set(queues))
        if payloads:
            self._exec(conn, "queues_notify", {"channel": self.channel, "payloads": payloads}).fetchall()

