"""The lifecycle of an attempt: the claim, renewals, and the fenced outcomes (sql/queries/claim.sql, lease.sql)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import psycopg
from psycopg.types.json import set_json_loads

from ..jobs import RESULT_LOST, ClaimedJob, ClaimResult, FailRequest, FenceReport, Lease, safe_json_loads
from .arrays import bigint_array, boolean_array, text_array
from .base import _delay, atomic
from .keyed import KeyedTransitions

# job_claim's rows: the queue's verdict and horizon in the first CLAIM_GATE_COLUMNS
# columns, then the job (ClaimedJob's fields in order; id first, lease_token eighth).
CLAIM_GATE_COLUMNS = 10
CLAIM_ID_COLUMN, CLAIM_TOKEN_COLUMN = CLAIM_GATE_COLUMNS, CLAIM_GATE_COLUMNS + 7
# The claim's floor parameters when the caller keeps none: every scan from the start.
NO_FLOORS: Mapping[str, Any] = {"floor_priorities": None, "floor_at": None, "floor_id": None,
                                "floor_default": None, "floor_aged": None}


class LifecycleStatements(KeyedTransitions):
    """An attempt's lifecycle: claim, renew, and the fenced outcomes."""

    def claim(self, conn: psycopg.Connection, *, queue: str, limit: int, owner: str,
              lease_seconds: float, aging_seconds: float | None = None) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queue`` under a lease of ``lease_seconds``,
        within the queue's policies (pause, limits, aging); see :meth:`claim_batch`."""
        return self.claim_batch(conn, queue=queue, limit=limit, owner=owner, lease_seconds=lease_seconds,
                                aging_seconds=aging_seconds).jobs

    def claim_batch(self, conn: psycopg.Connection, *, queue: str, limit: int, owner: str,
                    lease_seconds: float, aging_seconds: float | None = None,
                    limited: bool = False, floors: Mapping[str, Any] | None = None) -> ClaimResult:
        """Claim up to ``limit`` due jobs of ``queue``; returns the jobs and the queue's verdict.

        ``aging_seconds``: the priority-aging bound when the queue's row sets none (None:
        strict priority). ``limited``: the caller believes the queue has a concurrency or
        rate limit, so the claim goes straight to the locked form (queue_lock, then the
        claim as a new statement of the same transaction); otherwise the plain claim runs
        first and, if the queue turns out to be limited, the locked form follows.
        ``floors``: where each priority's scan starts, as
        :meth:`pgworker.claim_floors.ClaimFloors.params` gives them (None: every scan from
        the start of the queue's range, the exact claim any caller may run).
        """
        params = {"queue": queue, "limit": limit, "owner": owner, "lease_seconds": lease_seconds,
                  "aging_seconds": aging_seconds, "locked": False, **(floors or NO_FLOORS)}
        if not limited:
            result = self._claim_result(self._claim_cursor(conn).execute(self.queries["job_claim"], params).fetchall())
            if not (result.limited and not result.jobs and not result.paused):
                return result
        params["locked"] = True
        with atomic(conn):
            self._exec(conn, "queue_lock", {"queue": queue}).fetchall()
            return self._claim_result(self._claim_cursor(conn).execute(self.queries["job_claim"], params).fetchall())

    @staticmethod
    def _claim_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
        """A cursor that reads a claim's rows whatever their JSON: the claim has committed
        when its rows are read, so a payload (or trace context) Python cannot decode (nested
        deeper than its recursion limit; PostgreSQL stores tens of thousands of levels) must
        not fail the whole batch: its job gets an UndecodablePayload (the worker ends it dead
        with PAYLOAD_INVALID), the others run. (The timestamps it reads back cannot be out of
        psycopg's range: the table's CHECK constraints, migration 0005.) The claimer's
        connection does this for every statement; App.claim's pooled connections do not."""
        cur = conn.cursor()
        set_json_loads(safe_json_loads, cur)
        return cur

    @staticmethod
    def _claim_result(rows: list[tuple[Any, ...]]) -> ClaimResult:
        first = rows[0]
        jobs = [ClaimedJob(*row[CLAIM_GATE_COLUMNS:]) for row in rows if row[CLAIM_ID_COLUMN] is not None]
        return ClaimResult(jobs=jobs, paused=first[0], limited=first[1], allowance=first[2],
                           retry_after_seconds=first[3], horizon_at=first[4], horizon_epoch=first[5],
                           horizon_granted=first[6], aged_count=first[7], aging_seconds=first[8],
                           due_until=first[9])

    def renew(self, conn: psycopg.Connection, leases: Sequence[Lease], *,
              lease_seconds: float) -> FenceReport:
        """Extend leases by ``lease_seconds`` from now (fenced; an expired lease is not
        renewed). ``details[id]`` is (cancellation requested, new expiry in Unix seconds
        by the database clock)."""
        if not leases:
            return FenceReport("renew")
        cur = self._exec(conn, "job_renew", {**_fences(leases),
                                             "lease_seconds": lease_seconds})
        rows = [(r[0], r[1], (r[2], r[3])) for r in cur.fetchall()]
        return FenceReport.build("renew", leases, rows, detail_column=2)

    def renew_skip_locked(self, conn: psycopg.Connection, leases: Sequence[Lease], *,
                          lease_seconds: float) -> FenceReport:
        """:meth:`renew` for the pod's renewer: never waits on a row another session holds
        locked. ``skipped`` lists the leases whose rows were locked (neither renewed nor
        refused: try again); ``refused`` those the fence refused (lost)."""
        if not leases:
            return FenceReport("renew")
        cur = self._exec(conn, "job_renew_skip_locked", {**_fences(leases),
                                                          "lease_seconds": lease_seconds})
        rows = cur.fetchall()
        report = FenceReport.build("renew", leases, [(r[0], r[1], (r[2], r[3])) for r in rows if not r[4]],
                                   detail_column=2)
        skipped = {(r[0], r[1]) for r in rows if r[4]}
        if not skipped:
            return report
        return FenceReport("renew", report.accepted,
                           tuple(le.job_id for le in leases if le.job_id in report.refused
                                 and (le.job_id, le.token) not in skipped),
                           report.details, tuple(le.job_id for le in leases if (le.job_id, le.token) in skipped))

    def take_over(self, conn: psycopg.Connection, lease: Lease, *, owner: str) -> ClaimedJob | None:
        """Take over the claimed job under ``lease`` (still running under that token) for
        ``owner``, another claimer of the same pod; returns the job, or None when the
        lease was lost or has expired meanwhile. Lease, expiry and token are unchanged."""
        row = self._claim_cursor(conn).execute(self.queries["job_take_over"], {
            "id": lease.job_id, "token": lease.token, "owner": owner}).fetchone()
        return None if row is None else ClaimedJob(*row)

    def complete(self, conn: psycopg.Connection, leases: Sequence[Lease],
                 ordering_keys: Iterable[str | None] | None = None,
                 results: Sequence[str | None] | None = None) -> FenceReport:
        """Mark jobs succeeded (fenced), store what their handlers returned, and promote
        the next job of their ordering keys: the one statement every success goes through.

        ``ordering_keys``: the jobs' keys when the caller knows them (a claimer does);
        None reads them first (one statement), so that the key locks precede the row locks.
        ``results``: one per lease, each the result's JSON text (already encoded and
        bounded: :func:`pgworker.results.encode_result`), None for a handler that
        returned nothing (no row), or :data:`pgworker.jobs.RESULT_LOST`. A result is
        stored only for a lease the fence accepted, in the same statement.
        """
        if not leases:
            return FenceReport("complete")
        if results is None:
            results = [None] * len(leases)
        elif len(results) != len(leases):
            raise ValueError(f"complete: {len(results)} results for {len(leases)} leases")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self.keyed_rows(conn, "job_complete", {
            **_fences(leases), "has_result": boolean_array(r is not None for r in results),
            "results": text_array(None if r is None or r is RESULT_LOST else r for r in results),
            "results_channel": self.results_channel}, keys, lambda r: r[2])
        return FenceReport.build("complete", leases, rows)

    def fail(self, conn: psycopg.Connection, requests: Sequence[FailRequest],
             ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Record failures (fenced); ``details[id]`` is the new state: 'pending' (retry
        after the request's delay, in seconds), 'dead', or 'cancelled' when a cancellation
        was requested while the attempt ran.

        A job that dies keeps its ordering key blocked until it is replayed or discarded
        (dead-head policy 'block'); with 'skip' (``dead_blocks_key`` false) the next job
        of its key is promoted at once. ``ordering_keys`` as for :meth:`complete`.
        """
        if not requests:
            return FenceReport("fail")
        leases = [r.lease for r in requests]
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self.keyed_rows(conn, "job_fail", {
            **_fences([r.lease for r in requests]),
            "delays": [_delay(r.delay_seconds) for r in requests],
            "permanent": [bool(r.permanent) for r in requests],
            "codes": [r.code for r in requests], "messages": [r.message for r in requests],
            "tracebacks": [r.traceback or None for r in requests], "keep": self.error_history_entries},
            keys, lambda r: r[3] if r[2] == "cancelled" or (r[2] == "dead" and not r[4]) else None)
        return FenceReport.build("fail", leases, rows, detail_column=2)

    def release(self, conn: psycopg.Connection, leases: Sequence[Lease],
                ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Return running jobs to pending without spending an attempt (fenced); a job whose
        cancellation was requested ends cancelled instead (and promotes its key's next
        job). ``details[id]`` is the new state. ``ordering_keys`` as for :meth:`complete`."""
        if not leases:
            return FenceReport("release")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self.keyed_rows(conn, "job_release", _fences(leases),
                           keys, lambda r: r[3] if r[2] == "cancelled" else None)
        return FenceReport.build("release", leases, rows, detail_column=2)

    def snooze(self, conn: psycopg.Connection, leases: Sequence[Lease],
               delays_seconds: Sequence[float], ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Run jobs again after a delay (seconds) without spending an attempt (fenced); a
        job whose cancellation was requested ends cancelled instead. ``details[id]`` is
        the new state. ``ordering_keys`` as for :meth:`complete`."""
        if not leases:
            return FenceReport("snooze")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self.keyed_rows(conn, "job_snooze", {**_fences(leases),
                                                "delays": [_delay(d) for d in delays_seconds]},
                           keys, lambda r: r[3] if r[2] == "cancelled" else None)
        return FenceReport.build("snooze", leases, rows, detail_column=2)

    def finish_cancelled(self, conn: psycopg.Connection, leases: Sequence[Lease],
                         ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Record running jobs that stopped after a cancellation request (fenced), and
        promote the next job of their ordering keys (``ordering_keys`` as for :meth:`complete`)."""
        return self._finish(conn, "job_cancel_finish", "cancel", leases, ordering_keys)

    def _finish(self, conn: psycopg.Connection, statement: str, operation: str, leases: Sequence[Lease],
                ordering_keys: Iterable[str | None] | None) -> FenceReport:
        """A fenced final transition by (id, token) that promotes the next job of each
        ordering key: ``statement`` run once for all ``leases``, reported as ``operation``."""
        if not leases:
            return FenceReport(operation)
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self.keyed_rows(conn, statement, _fences(leases),
                           keys, lambda r: r[2])
        return FenceReport.build(operation, leases, rows)

    def record_progress(self, conn: psycopg.Connection, lease: Lease, progress: float,
                        message: str | None) -> tuple[bool, bool]:
        """Record a running job's progress (fenced): (written, cancel requested). Not
        written: the lease was lost (cancel requested is then False)."""
        row = self._exec(conn, "job_progress", {"id": lease.job_id, "token": lease.token, "progress": progress,
                                                "message": message}).fetchone()
        return (False, False) if row is None else (True, bool(row[1]))

    def lease_states(self, conn: psycopg.Connection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """(id, state, lease_token, last_error_code) of jobs, to settle an unknown write
        (the completer's and the settler's: did an outcome commit before its reply was lost?),
        and for `dead replay` to name the state of each id it did not replay. By primary
        key; an unknown id has no row."""
        return self._exec(conn, "job_lease_states", {"ids": list(ids)}).fetchall()


def _fences(leases: Sequence[Lease]) -> dict[str, str]:
    """The ``ids`` and ``tokens`` parameters of a fenced statement, as array literals
    (:mod:`.arrays`: psycopg's list dumper was most of a completion's client cost)."""
    return {"ids": bigint_array([le.job_id for le in leases]), "tokens": bigint_array([le.token for le in leases])}
