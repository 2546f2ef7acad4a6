"""The renewer: every renewal interval, extend every live lease of the pod in one fenced statement.

Which leases are renewed, and what a refusal means, is the lease contract's
(:mod:`pgworker.worker.lease`, rule 2). A renewal is bounded by the renewal interval: a
statement stuck on a stalled connection is abandoned with its connection (and the
lease clock, which never waits on the database, presumes the leases lost in time).

The statement never waits on a row (``job_renew_skip_locked``): a row that another
session holds locked (an operator's open transaction, ``App.cancel(conn=...)`` inside a
caller's transaction, the pod's own outcome write in flight) is skipped, neither renewed
nor refused, and tried again a few times within the pass, then at the next pass. One
locked row once held the whole statement until the pass timed out, and every lease of
the pod lapsed. A row locked for longer than a lease is handled by the contract like any
lease without an accepted renewal: presumed lost by the lease clock (rule 3), its late
outcome kept or fenced out (rule 5). The log says which row was locked, and when its
lease was renewed again.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import psycopg

from .. import tracing
from ..jobs import Lease
from .shm import layout as s
from .shm.slots import SlotTable, SlotTableBusy
from .lease import LeaseTerms, renewable
from .service import Service

log = logging.getLogger("pgworker.lease")

# Leases whose rows were locked are tried again within the pass, from this pause,
# doubling, for up to this share of the renewal interval (a lock held by a short
# transaction, as a cancel or an outcome write, is gone by then).
RETRY_FIRST_SECONDS = 0.05
RETRY_SHARE = 0.5


class Renewer(Service):
    """Renews the pod's live leases. ``tables()`` gives the slot tables; ``holder_alive(table,
    view)`` whether the process holding a slot is alive and not stopped; ``queue_name(view)``
    the slot's queue."""

    name = "renewer"
    action = "renewing leases"

    def __init__(self, *, terms: LeaseTerms, tables: Callable[[], Sequence[SlotTable]],
                 holder_alive: Callable[[SlotTable, s.SlotView], bool],
                 queue_name: Callable[[s.SlotView], str], store: Any, metrics: Any, **kw: Any) -> None:
        super().__init__(pass_timeout=terms.renew_interval_seconds, **kw)
        self.terms = terms
        self.tables = tables
        self.holder_alive = holder_alive
        self.queue_name = queue_name
        self.store = store
        self.metrics = metrics
        self.locked_since: dict[tuple[int, int], float] = {}  # (job id, token) -> first pass that skipped it

    def first_delay(self) -> float:
        return self.terms.renew_interval_seconds

    def next_delay(self) -> float:
        return self.terms.renew_interval_seconds

    def candidates(self, now: float) -> list[tuple[SlotTable, s.SlotView]]:
        out = []
        for table in self.tables():
            try:
                views = table.live()
            except SlotTableBusy:
                continue  # a table whose lock stays taken (its claimer is stopped): its leases lapse
            for v in views:
                if renewable(self.terms, v, now) and self.holder_alive(table, v):
                    out.append((table, v))
        return out

    def run_once(self, conn: psycopg.Connection) -> None:
        now = time.monotonic()
        candidates = self.candidates(now)
        live = {(v.job_id, v.token) for _, v in candidates}
        for lease in [k for k in self.locked_since if k not in live]:
            del self.locked_since[lease]  # settled, lost or moved on meanwhile
        if not candidates:
            return
        per_queue: dict[str, dict[str, int]] = {}
        retry_until = now + self.terms.renew_interval_seconds * RETRY_SHARE
        pause = RETRY_FIRST_SECONDS
        while True:
            candidates = self._renew(conn, candidates, per_queue)
            if not candidates or time.monotonic() + pause > retry_until or self.stop.wait(pause):
                break
            pause *= 2
        first_seen = time.monotonic()
        for _, v in candidates:  # still locked by another session: the next pass tries again
            q = self.queue_name(v)
            per_queue.setdefault(q, {"renewed": 0, "lost": 0, "skipped": 0})["skipped"] += 1
            if v.state == s.WRITING:
                continue  # locked by the pod's own outcome write, in flight
            if (v.job_id, v.token) not in self.locked_since:
                self.locked_since[(v.job_id, v.token)] = first_seen
                log.warning("lease of job %s (token %s) not renewed: its row is locked by another session (an "
                            "open transaction?); the renewer skips it rather than wait and tries again each pass. "
                            "Held locked past the lease (%.0f s), the lease is presumed lost and the job may run "
                            "again elsewhere", v.job_id, v.token, self.terms.lease_seconds,
                            extra={"action": "lease_row_locked", "job_id": v.job_id, "queue": q,
                                   "lease_token": v.token})
        for q, counts in per_queue.items():
            for result, n in counts.items():
                self.metrics.renewals(q, result, n)
            tracing.batch_span("renew", q, counts["renewed"] + counts["lost"], lost=counts["lost"])

    def _renew(self, conn: psycopg.Connection, candidates: list[tuple[SlotTable, s.SlotView]],
               per_queue: dict[str, dict[str, int]]) -> list[tuple[SlotTable, s.SlotView]]:
        """One statement for these leases: records the renewed ones in their slots, marks
        the refused ones lost; returns the candidates whose rows were locked (skipped)."""
        leases = list({(v.job_id, v.token): Lease(v.job_id, v.token) for _, v in candidates}.values())
        sent = time.monotonic()
        report = self.store.renew_skip_locked(conn, leases, lease_seconds=self.terms.lease_seconds)
        accepted, skipped = set(report.accepted), set(report.skipped)
        renewed: dict[int, list[tuple[int, int, int, float, bool]]] = {}
        left = []
        for table, v in candidates:
            q = self.queue_name(v)
            counts = per_queue.setdefault(q, {"renewed": 0, "lost": 0, "skipped": 0})
            if v.job_id in accepted:
                cancel, expires_at = report.details[v.job_id]
                renewed.setdefault(id(table), []).append((v.index, v.job_id, v.token, expires_at, bool(cancel)))
                counts["renewed"] += 1
                since = self.locked_since.pop((v.job_id, v.token), None)
                if since is not None:
                    log.info("lease of job %s (token %s) renewed again: its row was locked for %.1f s", v.job_id,
                             v.token, sent - since, extra={"action": "lease_row_unlocked", "job_id": v.job_id,
                                                           "queue": q, "lease_token": v.token})
            elif v.job_id in skipped:
                left.append((table, v))
            elif table.try_mark_lost(v):
                counts["lost"] += 1
                self.metrics.fenced(q, "renew")
                log.warning("lease lost on job %s (token %s): the renewal was refused", v.job_id, v.token,
                            extra={"action": "lease_lost", "job_id": v.job_id, "queue": q, "lease_token": v.token})
        by_id = {id(t): t for t, _ in candidates}
        for key, items in renewed.items():
            try:
                by_id[key].renewed(items, sent)
            except SlotTableBusy:
                pass
        return left

    def on_failure(self, exc: BaseException) -> None:
        """Count the failed renewal of every live lease (the lease clock decides when they
        are presumed lost)."""
        for table in self.tables():
            try:
                views = table.live()
            except SlotTableBusy:
                continue
            for v in views:
                self.metrics.renewals(self.queue_name(v), "error", 1)
