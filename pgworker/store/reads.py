"""Reads: jobs, statistics for /metrics and `pgworker status`, periodic jobs (sql/queries/reads.sql, health.sql, schedules.sql)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg

from .base import StoreBase
from .plan import Exec, Plan, run


class QueueStats(list):  # type: ignore[type-arg]
    """What :meth:`Store.queue_stats` returns: the per-queue rows (a list of dicts with
    the columns of the ``queue_stats`` statement, as before), plus

    - ``table``: the ``table_health`` row (a dict), or None when it could not be read;
    - ``table_error``: the exception class name of that failure, else None.

    A list, so that the callers that only want the per-queue rows see no difference; the
    metrics collector reads ``table`` too (pgworker.database_gauges.TableHealthGauges).
    """

    def __init__(self, rows: Iterable[dict[str, Any]], *, table: dict[str, Any] | None = None,
                 table_error: str | None = None) -> None:
        super().__init__(rows)
        self.table = table
        self.table_error = table_error


class ReadStatements(StoreBase):
    """Reads: jobs, statistics, table health, periodic jobs' rows."""

    def get_job(self, conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
        return run(conn, self.get_job_plan(job_id))

    def get_job_plan(self, job_id: int) -> Plan[dict[str, Any] | None]:
        """The job's row as a dict (with ``events``, its audit entries; ``steps``, its
        durable steps and effects; ``result``, ``parents``, ``children`` and the progress
        columns when it has them), or None; a plan (:mod:`pgworker.store.plan`)."""
        rows = yield Exec(self.queries["job_get"], {"id": job_id}, dict_rows=True)
        if not rows:
            return None
        row: dict[str, Any] = rows[0]
        row["events"] = yield Exec(self.queries["job_events_list"], {"id": job_id}, dict_rows=True)
        # durable steps and effects (docs/effects.md)
        row["steps"] = yield Exec(self.queries["job_steps_of"], {"id": job_id}, dict_rows=True)
        found = yield Exec(self.queries["job_result_get"], {"id": job_id}, dict_rows=True)
        if found and found[0]["has_result"]:
            row["result"] = found[0]["result"] if found[0]["result"] is not None else "(lost: see docs/results.md)"
        # dependencies (docs/graphs.md): shown only for a job that has them
        parents = yield Exec(self.queries["job_parents_list"], {"id": job_id, "limit": 100}, dict_rows=True)
        children: list[dict[str, Any]] = []
        if row.pop("has_children"):
            children = yield Exec(self.queries["job_children_list"], {"id": job_id, "limit": 100}, dict_rows=True)
        if parents:
            row["parents"] = parents
        else:
            row.pop("on_parent_failure")
        if children:
            row["children"] = children
        if row["graph_id"] is None:
            row.pop("graph_id")
        if not row["waiting_parents"]:
            row.pop("waiting_parents")
        if row["progress_at"] is None:  # never reported: not shown
            for k in ("progress", "progress_message", "progress_at"):
                row.pop(k)
        return row

    def list_jobs(self, conn: psycopg.Connection, *, queue: str | None, state: str | None,
                  limit: int, graph_id: int | None = None, task: str | None = None) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        if graph_id is not None:
            return cur.execute(self.queries["jobs_list_graph"], {"graph_id": graph_id, "state": state,
                                                                 "task": task, "limit": limit}).fetchall()
        return cur.execute(self.queries["jobs_list"], {"queue": queue, "state": state, "task": task,
                                                       "limit": limit}).fetchall()

    def queue_stats(self, conn: psycopg.Connection, queues: Sequence[str]) -> QueueStats:
        """The statistics behind /metrics: one row per queue (``queue_stats``), then the
        jobs table's health (:meth:`table_health`) in the same transaction, so that both
        run under the caller's statement timeout and are cached together.

        Returns a :class:`QueueStats`. The table statement runs in a savepoint: when it
        fails (a timeout, a lock), the per-queue rows still come back, with ``table``
        None and ``table_error`` naming the exception class. Errors of the per-queue
        statement, and a broken connection, propagate (``psycopg.Error``).
        """
        rows = self.queue_figures(conn, queues)
        try:
            with conn.transaction():  # a savepoint: a failure here keeps the rows above
                table = self.table_health(conn)
        except psycopg.Error as exc:
            if conn.broken:
                raise
            return QueueStats(rows, table_error=type(exc).__name__)
        return QueueStats(rows, table=table)

    def table_health(self, conn: psycopg.Connection) -> dict[str, Any] | None:
        """The jobs table's tuples, vacuums, size and the oldest holder of its vacuum
        horizon: the ``table_health`` row (sql/queries/health.sql documents each column
        and which holders count), or None if the table is missing."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["table_health"], {"schema": self.schema}).fetchone()

    def queue_figures(self, conn: psycopg.Connection, queues: Sequence[str]) -> list[dict[str, Any]]:
        """One row per queue of ``queues``, in their order (the ``queue_stats`` statement):
        ``queue``; the live jobs by state, ``due``, ``scheduled``, ``blocked``, ``running``,
        ``dead`` (exact counts); ``oldest_due_age_seconds`` and ``oldest_dead_age_seconds``
        (database clock, 0 when none); ``expired_leases``; ``dead_blocked_keys``; ``paused``."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_stats"], {"queues": list(queues)}).fetchall()

    def live_queues(self, conn: psycopg.Connection) -> list[str]:
        """The queues holding pending, running or dead jobs, or with a settings row, by name
        (``queues_live``: a few index descents per queue, whatever history is kept)."""
        return [r[0] for r in self._exec(conn, "queues_live").fetchall()]

    def recent_names(self, conn: psycopg.Connection, *, limit: int) -> tuple[list[str], list[str]]:
        """(queues, tasks): the distinct names among the newest ``limit`` jobs
        (``jobs_recent_names``: ``limit`` rows of the primary key at most)."""
        queues, tasks = self._exec(conn, "jobs_recent_names", {"limit": limit}).fetchone()
        return list(queues), list(tasks)

    def finished_counts(self, conn: psycopg.Connection, *, limit: int) -> list[dict[str, Any]]:
        """Finished jobs of the whole table, one row per state (succeeded, cancelled):
        ``counted``, the exact count when under ``limit`` (``limit`` means at least that
        many), and ``estimated``, the planner's estimate from the last ANALYZE (None when
        the table was never analyzed). Reads at most ``limit`` index entries per state."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["jobs_finished_counts"], {"schema": self.schema, "limit": limit}).fetchall()

    def due_count(self, conn: psycopg.Connection, queues: Sequence[str]) -> int:
        return self._exec(conn, "jobs_due_count", {"queues": list(queues)}).fetchone()[0]

    def due_locked_count(self, conn: psycopg.Connection, queues: Sequence[str], *, limit: int = 100) -> int:
        """How many of the first ``limit`` due, claimable jobs of ``queues`` another
        transaction holds locked (a claim skips them: ``FOR NO KEY UPDATE SKIP LOCKED``).
        The probe takes row locks, so it runs in a transaction of its own that is rolled
        back; ``conn`` must not be in a transaction of the caller's."""
        with conn.transaction(force_rollback=True):
            return int(self._exec(conn, "jobs_due_locked", {"queues": sorted(set(queues)),
                                                            "limit": limit}).fetchone()[0])

    def due_paused(self, conn: psycopg.Connection, queues: Sequence[str], *, limit: int = 10_000) -> dict[str, int]:
        """{queue: due jobs} for the paused queues of ``queues`` that hold due jobs, each
        counted up to ``limit`` (a drain run's exit: what no claim takes until resumed)."""
        rows = self._exec(conn, "jobs_due_paused", {"queues": list(queues), "limit": limit}).fetchall()
        return {name: int(n) for name, n in rows}

    def next_due_seconds(self, conn: psycopg.Connection, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest not-yet-due job of ``queues`` is due (paused queues
        excepted), or None when none waits."""
        return self._exec(conn, "jobs_next_due", {"queues": list(queues)}).fetchone()[0]

    def dead_blocked_keys(self, conn: psycopg.Connection, *, limit: int = 100) -> list[dict[str, Any]]:
        """Ordering keys held by a dead job, oldest first, with the jobs waiting behind each."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["ordering_keys_dead_blocked"], {"limit": limit}).fetchall()

    # -- schedules ------------------------------------------------------------------

    def db_now(self, conn: psycopg.Connection) -> datetime:
        return self._exec(conn, "db_now").fetchone()[0]

    def register_schedule(self, conn: psycopg.Connection, **params: Any) -> None:
        """Upsert a declared schedule (name, task, queue, cron, timezone, missed,
        initial_slot, next_slot)."""
        self._exec(conn, "schedule_register", params)

    def schedules_state(self, conn: psycopg.Connection,
                        names: Sequence[str]) -> tuple[dict[str, Any], datetime, dict[str, str]]:
        """({name: last slot}, database now, {name: unusable last slot as text}) for the
        recorded schedules among ``names``. A last slot no datetime can hold ('infinity',
        a year past 9999) is in the third dict only."""
        rows = self._exec(conn, "schedules_state", {"names": list(names)}).fetchall()
        now = rows[0][3] if rows else self.db_now(conn)
        unusable = {r[0]: r[2] for r in rows if r[2] is not None}
        return {r[0]: r[1] for r in rows if r[0] not in unusable}, now, unusable

    def fire_schedule(self, conn: psycopg.Connection, *, name: str, slot: datetime, next_slot: datetime | None,
                      skipped: int, enqueue: bool, task: str, queue: str, payload_json: str,
                      priority: int, max_attempts: int) -> tuple[bool, int | None]:
        """Advance a schedule to ``slot`` (compare-and-set) and enqueue its job when
        ``enqueue``; returns (advanced, job id). (False, None): another supervisor did it."""
        row = self._exec(conn, "schedule_fire", {
            "name": name, "slot": slot, "next_slot": next_slot, "skipped": skipped, "enqueue": enqueue,
            "task": task, "queue": queue, "payload": payload_json, "priority": priority,
            "max_attempts": max_attempts, "channel": self.channel}).fetchone()
        return bool(row[0]), row[1]

    def list_schedules(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["schedules_list"]).fetchall()


