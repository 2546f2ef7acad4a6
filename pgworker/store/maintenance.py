"""Maintenance: the reaper and retention (sql/queries/maintenance.sql)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Collection, Sequence

import psycopg

from ..jobs import ReapCandidate, ReapFailure, ReapResult
from ..names import bounded_text, redact
from .base import _delay
from .keyed import IN_STATEMENT, TRY, KeyedScope, KeyedTransitions
from .plan import Plan, atomically, run

# SQLSTATE classes of an error caused by the values of a row, which the reaper isolates
# to the row: 22 data exception (a value out of range), 23 integrity constraint violation
# (a CHECK constraint a user added), P0 PL/pgSQL (a trigger's RAISE). Anything else (a
# lost connection, a timeout, a lock, a read-only server) is about the batch, not a row.
_ROW_ERROR_CLASSES = ("22", "23", "P0")


class MaintenanceStatements(KeyedTransitions):
    """Maintenance: reaping expired leases, retention."""

    def reap(self, conn: psycopg.Connection, *, limit: int,
             delay_for: Callable[[str, int], float] = lambda task, attempts: 0.0,
             after: tuple[datetime, int] | None = None, skip: Collection[int] = ()) -> ReapResult:
        """Recover up to ``limit`` expired leases, on an autocommit connection (pgworker's own).

        ``delay_for(task, attempts)`` gives the retry delay (seconds) of a job that goes
        back to pending: its task's retry policy. ``after``: the ``last`` of the previous
        batch of the same pass (None for the first); ``skip``: ids not to try this time
        (the reaper's recent failures). A job that ends cancelled, or dead under the 'skip'
        policy, promotes the next job of its key.

        The candidates are read first, in a statement of their own (rows other sessions
        hold locked are skipped), then reaped in one short transaction that try-locks their
        ordering keys before locking their rows; a key locked elsewhere is skipped, never
        waited for (``skipped``). A batch that fails for the value of a row (a CHECK
        constraint or a trigger a user added, a value out of range) is split in halves,
        each reaped in its own transaction, down to the rows that fail alone: those are
        in ``failed`` (noted in their error history when that can be written), and the
        rest of the batch is reaped. Other errors (a lost connection, a timeout) raise.
        """
        rows = self._exec(conn, "jobs_reap_candidates", {
            "limit": limit, "after_at": after[0] if after else None,
            "after_id": after[1] if after else None}).fetchall()
        if not rows:
            return ReapResult()
        candidates = [ReapCandidate(*r) for r in rows]
        failed: list[ReapFailure] = []
        reaped: list[tuple[Any, ...]] = []
        skipped = self._reap_isolating(conn, [c for c in candidates if c.id not in skip], delay_for, reaped, failed)
        by_queue: dict[tuple[str, str], int] = {}
        for r in reaped:
            by_queue[(r[1], r[3])] = by_queue.get((r[1], r[3]), 0) + 1
        return ReapResult(
            requeued=tuple(r[0] for r in reaped if r[3] == "pending"),
            dead=tuple(r[0] for r in reaped if r[3] == "dead"),
            cancelled=tuple(r[0] for r in reaped if r[3] == "cancelled"),
            by_queue=by_queue, candidates=len(candidates), skipped=skipped, failed=tuple(failed),
            last=(candidates[-1].lease_expires_at, candidates[-1].id))

    def _reap_isolating(self, conn: psycopg.Connection, candidates: Sequence[ReapCandidate],
                        delay_for: Callable[[str, int], float], reaped: list[tuple[Any, ...]],
                        failed: list[ReapFailure]) -> int:
        """Reap ``candidates`` in one transaction; when it fails for a row's value, split it
        in halves (each then its own transaction) down to the failing rows (about 2 log2(n)
        transactions per bad row; separate transactions rather than savepoints, which past 64
        in one transaction slow down every session's snapshots). Returns how many were skipped
        for their key's lock; appends to ``reaped`` and ``failed``."""
        if not candidates:
            return 0
        try:
            with conn.transaction():
                rows, skipped = self._reap_batch(conn, candidates, delay_for)
        except psycopg.Error as exc:
            if conn.broken or (exc.sqlstate or "")[:2] not in _ROW_ERROR_CLASSES:
                raise
            if len(candidates) > 1:
                half = len(candidates) // 2
                return (self._reap_isolating(conn, candidates[:half], delay_for, reaped, failed)
                        + self._reap_isolating(conn, candidates[half:], delay_for, reaped, failed))
            failed.append(self._note_reap_failure(conn, candidates[0], exc))
            return 0
        reaped.extend(rows)
        return skipped

    def _reap_batch(self, conn: psycopg.Connection, candidates: Sequence[ReapCandidate],
                    delay_for: Callable[[str, int], float]) -> tuple[list[tuple[Any, ...]], int]:
        """One reap transaction's statements (the caller opened it), a keyed transition
        that tries its keys' locks: jobs_reap (row locks, SKIP LOCKED, each row re-checked)
        for the candidates whose key is free, then the promotion of the keys whose head
        ended (cancelled, or dead under the 'skip' policy)."""

        def body(scope: KeyedScope) -> Plan[tuple[list[tuple[Any, ...]], int]]:
            kept = [c for c in candidates if c.ordering_key is None or c.ordering_key in scope.granted]
            if not kept:
                return [], len(candidates)
            rows: list[tuple[Any, ...]] = yield scope.step("jobs_reap", {
                "ids": [c.id for c in kept], "delays": [_delay(delay_for(c.task, c.attempts)) for c in kept],
                "keep": self.error_history_entries})
            return rows, len(candidates) - len(kept)

        return run(conn, self.keyed_plan(
            [c.ordering_key for c in candidates], body,
            lambda out: [r[4] for r in out[0] if r[3] == "cancelled" or (r[3] == "dead" and not r[6])], lock=TRY))

    def _note_reap_failure(self, conn: psycopg.Connection, candidate: ReapCandidate,
                           exc: psycopg.Error) -> ReapFailure:
        """Write why ``candidate`` could not be reaped into its error history, if that can
        be written at all (the same refusal may cover any update of the row)."""
        # the primary message only: its DETAIL can quote the whole row, payload included
        message = bounded_text(redact(f"the reaper could not write this expired lease: "
                                      f"{exc.diag.message_primary or type(exc).__name__} [SQLSTATE {exc.sqlstate}]"), 500)
        try:
            with conn.transaction():
                noted = bool(self._exec(conn, "job_reap_failure_note", {
                    "id": candidate.id, "message": message, "keep": self.error_history_entries}).fetchall())
        except psycopg.Error:
            if conn.broken:
                raise
            noted = False
        return ReapFailure(candidate.id, candidate.queue, exc.sqlstate or "", message, noted)

    def server_writable(self, conn: psycopg.Connection) -> bool:
        """False on a standby or a server set read-only (no write attempted)."""
        return bool(self._exec(conn, "server_writable").fetchone()[0])

    def prune(self, conn: psycopg.Connection, *, succeeded_seconds: float | None,
              cancelled_seconds: float | None, dead_seconds: float | None, limit: int) -> dict[str, int]:
        """Delete one batch of finished jobs past their state's retention (seconds since
        they finished; None keeps that state), up to ``limit`` of each state; returns how
        many of each state went. Repeat while any state's count equals ``limit``.

        One transaction: a dead job that headed its ordering key goes only under the key's
        lock (tried in jobs_prune, never waited for: a key locked elsewhere is passed over
        this time), and the key's next job is promoted in a new statement under that lock.
        """
        params = {"succeeded_seconds": succeeded_seconds, "cancelled_seconds": cancelled_seconds,
                  "dead_seconds": dead_seconds, "limit": limit, "namespace": self._ordering_namespace}
        rows = run(conn, atomically(self.keyed_plan(
            (), lambda scope: scope.rows("jobs_prune", params), lambda rows: [key for _, key in rows],
            lock=IN_STATEMENT)))
        counts = {"succeeded": 0, "cancelled": 0, "dead": 0}
        for state, _ in rows:
            counts[state] += 1
        return counts

    def prune_queue_events(self, conn: psycopg.Connection, *, older_than_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` queue audit events older than ``older_than_seconds``."""
        return len(self._exec(conn, "queue_events_prune", {"older_than_seconds": older_than_seconds,
                                                           "limit": limit}).fetchall())

