"""Maintenance: the reaper and retention (sql/queries/maintenance.sql)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import psycopg

from ..jobs import ReapResult
from .base import StoreBase, _delay, atomic


class MaintenanceStatements(StoreBase):
    """Maintenance: reaping expired leases, retention."""

    def reap(self, conn: psycopg.Connection, *, limit: int,
             delay_for: Callable[[str, int], float] = lambda task, attempts: 0.0) -> ReapResult:
        """Recover up to ``limit`` expired leases (one short transaction).

        ``delay_for(task, attempts)`` gives the retry delay (seconds) of a job that goes
        back to pending: its task's retry policy. The candidates are read first so that
        their ordering keys can be locked before their rows; a key whose lock is held
        elsewhere (a caller's open transaction) is skipped, never waited for, and counted
        in ``skipped``. A job that ends cancelled, or dead under the 'skip' policy,
        promotes the next job of its key.
        """
        candidates = self._exec(conn, "jobs_reap_candidates", {"limit": limit}).fetchall()
        if not candidates:
            return ReapResult()
        keys = sorted({r[1] for r in candidates if r[1] is not None})
        with atomic(conn):
            skipped = 0
            if keys:
                granted = {r[0] for r in self._exec(conn, "ordering_keys_try_lock", {
                    "namespace": self._ordering_namespace, "keys": keys}).fetchall()}
                kept = [r for r in candidates if r[1] is None or r[1] in granted]
                skipped = len(candidates) - len(kept)
            else:
                kept = candidates
            rows = self._exec(conn, "jobs_reap", {
                "ids": [r[0] for r in kept], "delays": [_delay(delay_for(r[2], r[3])) for r in kept],
                "keep": self.error_history_entries}).fetchall() if kept else []
            self._promote(conn, [r[4] for r in rows if r[4] is not None
                                 and (r[3] == "cancelled" or (r[3] == "dead" and not r[6]))])
        by_queue: dict[tuple[str, str], int] = {}
        for r in rows:
            by_queue[(r[1], r[3])] = by_queue.get((r[1], r[3]), 0) + 1
        return ReapResult(
            requeued=tuple(r[0] for r in rows if r[3] == "pending"),
            dead=tuple(r[0] for r in rows if r[3] == "dead"),
            cancelled=tuple(r[0] for r in rows if r[3] == "cancelled"),
            by_queue=by_queue, candidates=len(candidates), skipped=skipped)

    def server_writable(self, conn: psycopg.Connection) -> bool:
        """False on a standby or a server set read-only (no write attempted)."""
        return bool(self._exec(conn, "server_writable").fetchone()[0])

    def lease_states(self, conn: psycopg.Connection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """(id, state, lease_token, last_error_code) of jobs, to settle an unknown write."""
        return self._exec(conn, "job_lease_states", {"ids": list(ids)}).fetchall()

    def prune(self, conn: psycopg.Connection, *, succeeded_seconds: float | None,
              cancelled_seconds: float | None, dead_seconds: float | None, limit: int) -> dict[str, int]:
        """Delete one batch of finished jobs past their state's retention (seconds since
        they finished; None keeps that state), up to ``limit`` of each state; returns how
        many of each state went. Repeat while any state's count equals ``limit``.

        One transaction: a dead job that headed its ordering key goes only under the key's
        lock (tried in jobs_prune, never waited for: a key locked elsewhere is passed over
        this time), and the key's next job is promoted in a new statement under that lock.
        """
        with atomic(conn):
            rows = self._exec(conn, "jobs_prune", {"succeeded_seconds": succeeded_seconds,
                                                   "cancelled_seconds": cancelled_seconds,
                                                   "dead_seconds": dead_seconds, "limit": limit,
                                                   "namespace": self._ordering_namespace}).fetchall()
            self._promote(conn, [key for _, key in rows if key is not None])
        counts = {"succeeded": 0, "cancelled": 0, "dead": 0}
        for state, _ in rows:
            counts[state] += 1
        return counts

    def prune_queue_events(self, conn: psycopg.Connection, *, older_than_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` queue audit events older than ``older_than_seconds``."""
        return len(self._exec(conn, "queue_events_prune", {"older_than_seconds": older_than_seconds,
                                                           "limit": limit}).fetchall())

