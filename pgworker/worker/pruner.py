"""The pruner: retention of finished jobs and of the queues' audit trail.

Every ``prune_interval`` seconds, delete finished jobs past their state's retention
(``retention_succeeded_seconds``, ``retention_cancelled_seconds``, and
``retention_dead_seconds``, off by default: dead jobs stay until replayed or discarded)
and queue events past ``retention_queue_events_seconds``, in bounded batches, each a
short transaction on an index made for it (``jobs_finished_idx``,
``queue_events_at_idx``), so a batch costs its own rows however much history is kept.
A pass stops after ``PRUNE_MAX_BATCHES`` batches; the next pass goes on. Every pod may
run one: SKIP LOCKED makes them share the work. A drain run prunes once, before claiming.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from typing import Any

import psycopg

from ..config import Settings
from ..store import Store
from .service import Service

log = logging.getLogger("pgworker.pruner")

PRUNE_BATCH = 1000
PRUNE_MAX_BATCHES = 100


@dataclass(frozen=True)
class Retention:
    """Seconds each kind of row is kept after it finished; None keeps it."""

    succeeded: float | None
    cancelled: float | None
    dead: float | None
    queue_events: float | None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Retention":
        return cls(settings.retention_succeeded_seconds, settings.retention_cancelled_seconds,
                   settings.retention_dead_seconds, settings.retention_queue_events_seconds)


def prune_pass(store: Store, conn: psycopg.Connection, retention: Retention, metrics: Any = None, *,
               batch: int = PRUNE_BATCH, max_batches: int = PRUNE_MAX_BATCHES) -> dict[str, int]:
    """Delete what is past its retention, up to ``max_batches`` batches of each kind;
    returns the counts by state (and 'queue_events')."""
    totals = {"succeeded": 0, "cancelled": 0, "dead": 0, "queue_events": 0}
    if (retention.succeeded, retention.cancelled, retention.dead) != (None, None, None):
        for _ in range(max_batches):
            counts = store.prune(conn, succeeded_seconds=retention.succeeded, cancelled_seconds=retention.cancelled,
                                 dead_seconds=retention.dead, limit=batch)
            for state, n in counts.items():
                totals[state] += n
                if metrics is not None:
                    metrics.pruned(state, n)
            if max(counts.values()) < batch:
                break
    if retention.queue_events is not None:
        for _ in range(max_batches):
            n = store.prune_queue_events(conn, older_than_seconds=retention.queue_events, limit=batch)
            totals["queue_events"] += n
            if n < batch:
                break
    if any(totals.values()):
        log.info("pruned %s", ", ".join(f"{n} {what}" for what, n in totals.items() if n),
                 extra={"action": "prune"})
    return totals


def refused_hint(schema: str, exc: psycopg.Error) -> str:
    """What to do when the role may not prune: a least-privilege worker role granted before
    schema version 5 lacks EXECUTE on the retention functions (``sql/grants.sql``)."""
    return (f"this worker's role may not delete finished jobs ({exc.diag.message_primary}). Apply the "
            f"worker's grants again as the schema's owner (`pgworker sql grants --worker ROLE --schema "
            f"{shlex.quote(schema)} --apply`: since schema version 5 they let the worker prune), or run `pgworker prune "
            f"--older-than 7d` as the owner (a CronJob) and set PGWORKER_PRUNE=false on workers")


class Pruner(Service):
    """The pruner as a service of the supervisor."""

    name = "pruner"
    action = "pruning finished jobs"
    idle_counts_as_pass = False  # has_work() is False once the role was refused: no pass prunes

    def __init__(self, *, store: Store, retention: Retention, interval: float, metrics: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.store = store
        self.retention = retention
        self.interval = interval
        self.metrics = metrics
        self.refused = False  # the role may not prune: no pass will succeed until it may

    def has_work(self) -> bool:
        return not self.refused

    def first_delay(self) -> float:
        return min(10.0, self.interval)

    def next_delay(self) -> float:
        return self.interval

    def run_once(self, conn: psycopg.Connection) -> None:
        try:
            prune_pass(self.store, conn, self.retention, self.metrics)
        except psycopg.errors.InsufficientPrivilege as exc:
            # A worker role granted before schema version 5 may not run the retention
            # functions: retrying cannot help, and a failing service would mark the pod's
            # database as failing. Say what to do once and stop pruning in this pod.
            self.refused = True
            log.error("the pruner stops: %s", refused_hint(self.store.schema, exc), extra={"action": "prune_refused"})
