"""The web console's statements (sql/queries/console.sql): its page reads, the pod
registry and the bulk operations' records, one method each."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Sequence

import psycopg
from psycopg.rows import dict_row

from .base import StoreBase


class ConsoleStatements(StoreBase):
    """Reads behind the console's pages; the pod registry; bulk operations."""

    def _rows(self, conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return conn.cursor(row_factory=dict_row).execute(self.queries[name], params).fetchall()

    # -- overview -------------------------------------------------------------------

    def console_queue_names(self, conn: psycopg.Connection, *, limit: int) -> list[str]:
        """Configured, scheduled and active queues (claimable, running or dead jobs), sorted."""
        return [r[0] for r in self._exec(conn, "console_queue_names", {"limit": limit}).fetchall()]

    def console_queue_overview(self, conn: psycopg.Connection, queues: Sequence[str], *,
                               cap: int) -> list[dict[str, Any]]:
        """Per queue: due, scheduled, running, expired_leases, dead (each at most ``cap``),
        oldest_due_age_seconds (None: nothing due), and its settings (paused_at, ...)."""
        return self._rows(conn, "console_queue_overview", {"queues": list(queues), "cap": cap})

    def console_throughput(self, conn: psycopg.Connection, *, limit: int) -> list[dict[str, Any]]:
        """Rows (state, queue, minutes_ago 0..59, jobs) of the last hour's finished jobs,
        at most ``limit`` of each final state (the newest)."""
        return self._rows(conn, "console_throughput", {"limit": limit})

    def console_jobs_estimate(self, conn: psycopg.Connection) -> int | None:
        """The planner's row estimate of the jobs table (None before its first ANALYZE)."""
        row = self._exec(conn, "console_jobs_estimate", {"schema": self.schema}).fetchone()
        return None if row is None or row[0] < 0 else row[0]

    # -- the jobs list ----------------------------------------------------------------

    def console_jobs_window(self, conn: psycopg.Connection, *, job_filter: dict[str, Any], before: int,
                            scan: int, limit: int) -> tuple[int, int, list[dict[str, Any]]]:
        """(floor, scanned, rows): the jobs matching ``job_filter`` among the ``scan``
        newest below ``before``, newest first; ``floor`` is the lowest id of that window
        and ``scanned`` how many it held. A filter with a ``graph`` windows that graph's
        jobs (jobs_graph_idx), not the table's newest."""
        graph = job_filter.get("graph")
        name = "console_jobs_window" if graph is None else "console_jobs_graph_window"
        rows = self._rows(conn, name, {
            "filter": json.dumps(job_filter), "before": before, "scan": scan, "limit": limit, "graph": graph})
        floor, scanned = (rows[0]["floor"], rows[0]["scanned"]) if rows else (0, 0)
        return floor, scanned, [_job(r) for r in rows if r["id"] is not None]

    def console_jobs_due(self, conn: psycopg.Connection, *, queue: str, after_run_at: datetime,
                         after_id: int, limit: int) -> list[dict[str, Any]]:
        return self._rows(conn, "console_jobs_due", {"queue": queue, "after_run_at": after_run_at,
                                                     "after_id": after_id, "limit": limit})

    def console_jobs_running(self, conn: psycopg.Connection, *, queue: str | None, after_at: datetime,
                             after_id: int, limit: int) -> list[dict[str, Any]]:
        return self._rows(conn, "console_jobs_running", {"queue": queue, "after_at": after_at,
                                                         "after_id": after_id, "limit": limit})

    def console_jobs_finished(self, conn: psycopg.Connection, *, state: str, before_at: datetime,
                              before_id: int, limit: int) -> list[dict[str, Any]]:
        return self._rows(conn, "console_jobs_finished", {"state": state, "before_at": before_at,
                                                          "before_id": before_id, "limit": limit})

    def console_jobs_dead_in_queue(self, conn: psycopg.Connection, *, queue: str, before_at: datetime,
                                   before_id: int, limit: int) -> list[dict[str, Any]]:
        return self._rows(conn, "console_jobs_dead_in_queue", {"queue": queue, "before_at": before_at,
                                                               "before_id": before_id, "limit": limit})

    def console_job_tail(self, conn: psycopg.Connection) -> int:
        """The newest job id (0 for an empty table)."""
        return self._exec(conn, "console_job_tail").fetchone()[0]

    # -- dead jobs --------------------------------------------------------------------

    def console_dead_groups(self, conn: psycopg.Connection, *, queue: str | None, scan: int,
                            limit: int) -> list[dict[str, Any]]:
        """Groups (task, last_error_code, jobs, first_seen, last_seen, newest_id, scanned)
        of the newest ``scan`` dead jobs, the largest first."""
        return self._rows(conn, "console_dead_groups", {"queue": queue, "scan": scan, "limit": limit})

    def console_dead_group_jobs(self, conn: psycopg.Connection, *, queue: str | None, task: str | None,
                                error_code: str | None, before_at: datetime, before_id: int, scan: int,
                                limit: int) -> list[dict[str, Any]]:
        """The group's jobs among the newest ``scan`` dead ones, the last to die first."""
        return self._rows(conn, "console_dead_group_jobs", {
            "queue": queue, "task": task, "error_code": error_code, "before_at": before_at, "before_id": before_id,
            "scan": scan, "limit": limit})

    def console_dead_count(self, conn: psycopg.Connection, *, queue: str | None, task: str | None,
                           error_code: str | None, cap: int) -> int:
        return self._exec(conn, "console_dead_count", {"queue": queue, "task": task, "error_code": error_code,
                                                       "cap": cap}).fetchone()[0]

    # -- the pod registry -------------------------------------------------------------

    def pod_heartbeat(self, conn: psycopg.Connection, *, pod_id: str, host: str, pid: int, version: str,
                      queues: Sequence[str], concurrency: int, drain: bool, claimers: list[dict[str, Any]]) -> None:
        self._exec(conn, "pod_heartbeat", {
            "id": pod_id, "host": host, "pid": pid, "version": version, "queues": list(queues),
            "concurrency": concurrency, "drain": drain, "claimers": json.dumps(claimers, separators=(",", ":"))})

    def pod_stop(self, conn: psycopg.Connection, pod_id: str) -> None:
        self._exec(conn, "pod_stop", {"id": pod_id})

    def pods_prune(self, conn: psycopg.Connection, *, older_than: float) -> int:
        return self._exec(conn, "pods_prune", {"older_than": older_than}).rowcount

    def pods_list(self, conn: psycopg.Connection, *, limit: int) -> list[dict[str, Any]]:
        return self._rows(conn, "pods_list", {"limit": limit})

    def pods_claiming(self, conn: psycopg.Connection, *, limit: int) -> list[dict[str, Any]]:
        """Per pod (up to ``limit``): ``queues`` it claims, ``stopped_at``, ``seen_seconds_ago``."""
        return self._rows(conn, "pods_claiming", {"limit": limit})

    # -- bulk operations --------------------------------------------------------------

    def bulk_operation_create(self, conn: psycopg.Connection, *, kind: str, job_filter: dict[str, Any], actor: str,
                              expected: int | None, batch_size: int, reason: str | None = None) -> dict[str, Any]:
        """The new operation's row. ``reason``: already bounded by the caller
        (:func:`pgworker.names.checked_cancel_reason`; the column's check refuses more)."""
        return self._rows(conn, "bulk_operation_create", {
            "kind": kind, "filter": json.dumps(job_filter), "actor": actor, "expected": expected,
            "batch_size": batch_size, "reason": reason})[0]

    def bulk_operation_get(self, conn: psycopg.Connection, operation_id: int) -> dict[str, Any] | None:
        rows = self._rows(conn, "bulk_operation_get", {"id": operation_id})
        return rows[0] if rows else None

    def bulk_operations_list(self, conn: psycopg.Connection, *, before: int, limit: int) -> list[dict[str, Any]]:
        return self._rows(conn, "bulk_operations_list", {"before": before, "limit": limit})

    def bulk_operation_claim(self, conn: psycopg.Connection) -> dict[str, Any] | None:
        """The oldest running operation, its row locked for the caller's transaction
        (None: none, or all held by other appliers)."""
        rows = self._rows(conn, "bulk_operation_claim")
        return rows[0] if rows else None

    def bulk_operation_candidates(self, conn: psycopg.Connection, *, job_filter: dict[str, Any], after: int,
                                  max_id: int, limit: int) -> list[tuple[int, str, bool]]:
        """(id, state, matches) of the next ``limit`` jobs by id in (after, max_id]: of
        the filter's ``graph`` only when it names one (jobs_graph_idx)."""
        graph = job_filter.get("graph")
        name = "bulk_operation_candidates" if graph is None else "bulk_operation_candidates_graph"
        return [tuple(r) for r in self._exec(conn, name, {
            "filter": json.dumps(job_filter), "after": after, "max_id": max_id, "limit": limit,
            "graph": graph}).fetchall()]

    def bulk_operation_advance(self, conn: psycopg.Connection, *, operation_id: int, cursor: int, examined: int,
                               applied_ids: Sequence[int], finished: bool) -> dict[str, Any] | None:
        rows = self._rows(conn, "bulk_operation_advance", {
            "id": operation_id, "cursor": cursor, "examined": examined, "applied_ids": list(applied_ids),
            "finished": finished})
        return rows[0] if rows else None

    def bulk_operation_fail(self, conn: psycopg.Connection, operation_id: int, error: str) -> None:
        self._exec(conn, "bulk_operation_fail", {"id": operation_id, "error": error})

    def bulk_operation_cancel(self, conn: psycopg.Connection, operation_id: int, *,
                              actor: str) -> dict[str, Any] | None:
        """The cancelled row, or None when the operation was not running."""
        rows = self._rows(conn, "bulk_operation_cancel", {"id": operation_id, "actor": actor})
        return rows[0] if rows else None

    def bulk_operation_jobs_of(self, conn: psycopg.Connection, operation_id: int, *, after: int = 0,
                               limit: int = 1000) -> list[int]:
        return [r[0] for r in self._exec(conn, "bulk_operation_jobs_of", {
            "id": operation_id, "after": after, "limit": limit}).fetchall()]

    def bulk_operations_prune(self, conn: psycopg.Connection, *, older_than: float) -> int:
        return self._exec(conn, "bulk_operations_prune", {"older_than": older_than}).rowcount


def _job(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("floor", None)
    row.pop("scanned", None)
    return row
