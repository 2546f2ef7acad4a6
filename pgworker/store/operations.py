"""Operator actions on jobs and queues, each audited (sql/queries/operations.sql, queues.sql)."""

from __future__ import annotations

import json
from typing import Any, Sequence

import psycopg

from ..jobs import REPLAY_LIMIT, ReplayResult
from .dependencies import DependencyStatements
from .keyed import KeyedScope, KeyedTransitions
from .plan import Atomic, Plan, run

#: The fewest dead jobs of a queue a replay reads a page (pages past held jobs).
REPLAY_PAGE_MIN = 1_000


class OperationStatements(KeyedTransitions, DependencyStatements):
    """Operator actions: cancel, replay, queue settings and their audit trail."""

    def cancel(self, conn: psycopg.Connection, job_id: int, *, actor: str | None,
               reason: str | None = None) -> str | None:
        """Cancel a job; returns the resulting state ('cancelled', or 'running' when a
        cancellation was requested from its worker), or None when nothing was cancellable.
        A job cancelled at once (pending, or a dead job discarded) promotes the next job of
        its ordering key; its key is locked first (read without a lock: it never changes).
        ``reason``: the operator's words, kept in the audit event's detail (``{"reason":
        ...}``), already bounded by the caller (:func:`pgworker.names.cancel_reason`)."""
        return run(conn, self.cancel_plan(job_id, actor=actor, reason=reason))

    def cancel_plan(self, job_id: int, *, actor: str | None, reason: str | None = None) -> Plan[str | None]:
        """:meth:`cancel` as a plan (:mod:`pgworker.store.plan`)."""
        keys = list((yield from self.ordering_keys_of_plan([job_id])).values())
        state, _ = yield Atomic(self.keyed_plan(
            keys, lambda scope: self._cancel_plan(scope, job_id, actor, reason),
            lambda out: [out[1]] if out[0] == "cancelled" else []))
        return state  # type: ignore[no-any-return]

    def _cancel_plan(self, scope: KeyedScope, job_id: int, actor: str | None,
                     reason: str | None) -> Plan[tuple[str | None, str | None]]:
        """The body of a cancel's keyed transition: (the state, the job's ordering key)."""
        rows = yield scope.step("job_cancel", {"id": job_id})
        if not rows:
            return None, None
        row = rows[0]
        yield self._step("job_event_insert", {
            "ids": [job_id], "kind": "cancel_requested" if row[1] == "running" else "cancelled",
            "actor": actor, "detail": None if reason is None else json.dumps({"reason": reason})})
        return row[1], row[2]

    def replay(self, conn: psycopg.Connection, *, ids: Sequence[int] = (), queue: str | None = None,
               limit: int = REPLAY_LIMIT, actor: str | None) -> ReplayResult:
        """Replay dead jobs by id, or up to ``limit`` dead jobs of ``queue``.

        A job with an ordering key comes back behind whatever of its key is active and
        runs before the key's later jobs; one whose dedupe key is now held by another job
        stays dead (in ``held_by``, with the holder read after the replay, so a dead job
        left behind the one of its key just replayed names that one). The keys are locked
        first, expired dedupe holds released. Ids that were not dead are in ``not_dead``.
        The jobs the replayed jobs' death cancelled (``PARENT_DEAD``, and what that
        cancelled below them) wait again for their parents, in the same transaction
        (``requeued``; see ``dependents_requeue``).
        """
        return run(conn, self.replay_plan(ids=ids, queue=queue, limit=limit, actor=actor))

    def replay_plan(self, *, ids: Sequence[int] = (), queue: str | None = None, limit: int = REPLAY_LIMIT,
                    actor: str | None) -> Plan[ReplayResult]:
        """:meth:`replay` as a plan (:mod:`pgworker.store.plan`)."""
        # ``limit`` bounds the queue's jobs only: ids asked for by name are all taken (one
        # statement took both under ``limit``, lowest ids first, and called the rest not
        # dead). By ids and a queue at once: two reads, so that neither crowds the other out.
        targets = (yield self._step("jobs_replay_targets", {"ids": list(ids), "limit": len(ids)})) if ids else []
        passed: list[Any] = []
        limit_reached = False
        if queue is not None:
            more, passed, limit_reached = yield from self._queue_targets_plan(queue, limit, {r[0] for r in targets})
            targets = sorted([*targets, *more], key=lambda r: r[0])
        replayed: list[int] = []
        left: list[Any] = []
        holders: dict[str, int] = {}
        requeued: list[int] = []
        if targets:
            keys = sorted({r[1] for r in targets if r[1] is not None})
            replayed, left, holders, requeued = yield Atomic(self.keyed_plan(
                keys, lambda scope: self._replay_plan(scope, targets, actor), lambda _: keys))
        if passed:  # who holds their keys now (read after the replay, as for the jobs left)
            holders = {**(yield from self.dedupe_holders_plan(sorted({r[2] for r in passed}))), **holders}
        done = set(replayed)
        held_by = {r[0]: holders[r[2]] for r in [*left, *passed] if r[2] in holders}
        return ReplayResult(replayed, held_by=held_by, not_dead=sorted(set(ids) - done - set(held_by)),
                            requeued=requeued, limit_reached=limit_reached)

    def _queue_targets_plan(self, queue: str, limit: int,
                            named: set[int]) -> Plan[tuple[list[Any], list[Any], bool]]:
        """Up to ``limit`` dead jobs of ``queue`` a replay could put back, lowest ids first
        (``named``: ids the caller asked for, read already), read in pages past those whose
        dedupe key another job holds now; returns them, up to ``limit`` of those passed
        over (for ``held_by``), and whether the queue holds more than ``limit``."""
        targets: list[Any] = []
        passed: list[Any] = []
        after = 0
        while True:
            # one more than the limit says whether more remain; at least REPLAY_PAGE_MIN, or a
            # walk past held jobs near the limit took a round trip per 2 rows (a review)
            want = max(limit - len(targets) + 1, REPLAY_PAGE_MIN)
            page = yield self._step("jobs_replay_queue_page", {"queue": queue, "after": after, "limit": want})
            for job_id, ordering_key, dedupe_key, held in page:
                if job_id not in named:
                    (passed if held else targets).append((job_id, ordering_key, dedupe_key))
            del passed[limit:]  # a queue of a million held jobs is walked, not kept
            if len(targets) > limit:
                return targets[:limit], passed, True
            if len(page) < want:
                return targets, passed, False
            after = page[-1][0]

    def _replay_plan(self, scope: KeyedScope, targets: list[Any],
                     actor: str | None) -> Plan[tuple[list[int], list[Any], dict[str, int], list[int]]]:
        """The body of a replay's keyed transition (every key of the targets is promoted
        after it: a replayed job comes back blocked), then the jobs their death cancelled
        wait again (jobs with dependencies carry no ordering key: no head changes)."""
        dedupe = [r[2] for r in targets if r[2] is not None]
        if dedupe:
            yield from self.dedupe_holders_plan(dedupe)  # releases expired holds first
        rows = yield scope.step("jobs_replay", {"ids": [r[0] for r in targets], "actor": actor,
                                                "channel": self.channel})
        replayed = [r[0] for r in rows]
        done = set(replayed)
        left = [r for r in targets if r[0] not in done and r[2] is not None]
        holders = (yield from self.dedupe_holders_plan([r[2] for r in left])) if left else {}
        parents = [r[0] for r in rows if r[3]]  # a job that never had children cancelled none
        requeued = (yield from self.requeue_dependents_plan(parents, actor=actor)) if parents else []
        return replayed, left, holders, requeued

    # -- queues ---------------------------------------------------------------------

    def configure_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None,
                        concurrency_limit: Any = None, rate: Any = None, burst: Any = None,
                        aging_seconds: Any = None, set_concurrency: bool = False,
                        set_rate: bool = False, set_aging: bool = False) -> dict[str, Any]:
        """Create or change a queue's settings (only those whose ``set_*`` flag is true)."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_configure"], {
            "queue": queue, "actor": actor, "concurrency_limit": concurrency_limit,
            "rate_per_second": rate, "rate_burst": burst, "aging_seconds": aging_seconds,
            "set_concurrency": set_concurrency, "set_rate": set_rate, "set_aging": set_aging}).fetchone()

    def pause_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None) -> dict[str, Any]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_pause"], {"queue": queue, "actor": actor}).fetchone()

    def resume_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None) -> bool:
        """Resume; False when the queue was not paused (it has no row)."""
        rows = self._exec(conn, "queue_resume", {"queue": queue, "actor": actor,
                                                 "channel": self.channel}).fetchall()
        return bool(rows)

    def list_queues(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queues_list"]).fetchall()

    def queue_usage(self, conn: psycopg.Connection, queue: str, *, recent: int = 1000) -> dict[str, bool]:
        """{'has_jobs': claimable, running or dead jobs, 'scheduled': a schedule enqueues
        into it, 'configured': it has a settings row, 'has_events': an audit event,
        'recently_finished': one of the ``recent`` last succeeded (or cancelled) jobs}."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_usage"], {"queue": queue, "recent": recent}).fetchone()

    def delete_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None) -> dict[str, Any] | None:
        """Delete the queue's settings row unless it is paused; returns the row as it was
        with ``deleted`` (False: it is paused), or None when the queue has no row."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_delete"], {"queue": queue, "actor": actor}).fetchone()

    def queue_events(self, conn: psycopg.Connection, queue: str, *, limit: int = 50) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_events_list"], {"queue": queue, "limit": limit}).fetchall()

    # -- retry now ------------------------------------------------------------------

    def retry_now(self, conn: psycopg.Connection, job_id: int, *, actor: str | None) -> dict[str, Any] | None:
        """Make a pending job scheduled later due now (audited 'retried_now'); returns
        {id, queue, previous_run_at}, or None when the job is not pending with a run_at
        still ahead (unknown, running, finished, or due already)."""
        row = conn.cursor(row_factory=psycopg.rows.dict_row).execute(self.queries["job_retry_now"], {
            "id": job_id, "actor": actor, "channel": self.channel}).fetchone()
        if row is None:
            return None
        return {k: row[k] for k in ("id", "queue", "previous_run_at")}
