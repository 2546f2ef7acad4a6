"""The renewer: every renewal interval, extend every live lease of the pod in one fenced statement.

Which leases are renewed, and what a refusal means, is the lease contract's
(:mod:`pgworker.worker.lease`, rule 2). A renewal is bounded by the renewal interval: a
statement stuck on a stalled connection is abandoned with its connection (and the
lease clock, which never waits on the database, presumes the leases lost in time).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import psycopg

from .. import tracing
from ..jobs import Lease
from . import slots as s
from .lease import LeaseTerms, renewable
from .service import Service

log = logging.getLogger("pgworker.lease")


class Renewer(Service):
    """Renews the pod's live leases. ``tables()`` gives the slot tables; ``holder_alive(table,
    view)`` whether the process holding a slot is alive and not stopped; ``queue_name(view)``
    the slot's queue."""

    name = "renewer"
    action = "renewing leases"

    def __init__(self, *, terms: LeaseTerms, tables: Callable[[], Sequence[s.SlotTable]],
                 holder_alive: Callable[[s.SlotTable, s.SlotView], bool],
                 queue_name: Callable[[s.SlotView], str], store: Any, metrics: Any, **kw: Any) -> None:
        super().__init__(pass_timeout=terms.renew_interval_seconds, **kw)
        self.terms = terms
        self.tables = tables
        self.holder_alive = holder_alive
        self.queue_name = queue_name
        self.store = store
        self.metrics = metrics

    def first_delay(self) -> float:
        return self.terms.renew_interval_seconds

    def next_delay(self) -> float:
        return self.terms.renew_interval_seconds

    def candidates(self, now: float) -> list[tuple[s.SlotTable, s.SlotView]]:
        out = []
        for table in self.tables():
            try:
                views = table.live()
            except s.SlotTableBusy:
                continue  # a table whose lock stays taken (its claimer is stopped): its leases lapse
            for v in views:
                if renewable(self.terms, v, now) and self.holder_alive(table, v):
                    out.append((table, v))
        return out

    def run_once(self, conn: psycopg.Connection) -> None:
        now = time.monotonic()
        candidates = self.candidates(now)
        if not candidates:
            return
        leases = list({(v.job_id, v.token): Lease(v.job_id, v.token) for _, v in candidates}.values())
        sent = time.monotonic()
        report = self.store.renew(conn, leases, lease_seconds=self.terms.lease_seconds)
        accepted = set(report.accepted)
        renewed: dict[int, list[tuple[int, int, int, float, bool]]] = {}
        per_queue: dict[str, dict[str, int]] = {}
        for table, v in candidates:
            q = self.queue_name(v)
            counts = per_queue.setdefault(q, {"renewed": 0, "lost": 0})
            if v.job_id in accepted:
                cancel, expires_at = report.details[v.job_id]
                renewed.setdefault(id(table), []).append((v.index, v.job_id, v.token, expires_at, bool(cancel)))
                counts["renewed"] += 1
            elif _mark_lost(table, v):
                counts["lost"] += 1
                self.metrics.fenced(q, "renew")
                log.warning("lease lost on job %s (token %s): the renewal was refused", v.job_id, v.token,
                            extra={"action": "lease_lost", "job_id": v.job_id, "queue": q, "lease_token": v.token})
        by_id = {id(t): t for t, _ in candidates}
        for key, items in renewed.items():
            try:
                by_id[key].renewed(items, sent)
            except s.SlotTableBusy:
                pass
        for q, counts in per_queue.items():
            self.metrics.renewals(q, "renewed", counts["renewed"])
            self.metrics.renewals(q, "lost", counts["lost"])
            tracing.batch_span("renew", q, counts["renewed"] + counts["lost"], lost=counts["lost"])

    def on_failure(self, exc: BaseException) -> None:
        """Count the failed renewal of every live lease (the lease clock decides when they
        are presumed lost)."""
        for table in self.tables():
            try:
                views = table.live()
            except s.SlotTableBusy:
                continue
            for v in views:
                self.metrics.renewals(self.queue_name(v), "error", 1)


def _mark_lost(table: s.SlotTable, v: s.SlotView) -> bool:
    try:
        return table.mark(v.index, v.job_id, v.token, lost=True)
    except s.SlotTableBusy:
        return False
