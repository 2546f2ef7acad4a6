"""The reaper: recover jobs whose lease expired (their worker crashed, hung or was cut off).

Each pass reaps in bounded batches (``REAP_BATCH`` jobs per short transaction) until a
batch comes back short. Expired jobs go back to pending after their task's retry delay
(the same policy as a handler's failure), to dead with code LEASE_EXPIRED once their
attempts are spent, or to cancelled when a cancellation was pending. ``FOR UPDATE SKIP
LOCKED`` lets the reapers of several pods run at once without blocking each other or
reaping a job twice, and an ordering key whose lock another transaction holds is skipped
for this pass, never waited for (``pgworker_reap_skipped_total``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from .. import tracing
from ..errors import DatabaseReadOnly
from ..store import Store
from .service import Service

log = logging.getLogger("pgworker.reaper")

REAP_BATCH = 500
REAP_MAX_BATCHES_PER_PASS = 100

DelayFor = Callable[[str, int], float]


@dataclass(frozen=True)
class ReaperConfig:
    """Reaper settings: jobs per transaction, batches per pass, and the retry delay of a
    requeued job, ``delay_for(task, attempts)`` in seconds (drain mode: 0, the gap
    between runs is the backoff)."""

    batch: int = REAP_BATCH
    max_batches: int = REAP_MAX_BATCHES_PER_PASS
    delay_for: DelayFor = lambda task, attempts: 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= 100_000:
            raise ValueError("reaper batch must be between 1 and 100000")


_ACTION = {"pending": "requeued", "dead": "dead", "cancelled": "cancelled"}


def reap_pass(store: Store, conn: psycopg.Connection, config: ReaperConfig, metrics: Any = None) -> int:
    """Reap every expired lease (up to ``max_batches`` batches); returns how many."""
    total = 0
    for _ in range(config.max_batches):
        result = store.reap(conn, limit=config.batch, delay_for=config.delay_for)
        total += result.total
        if metrics is not None:
            metrics.reap_skipped(result.skipped)
        if result.skipped:
            log.info("reaper: %s expired lease(s) left for a later pass: their ordering key is locked by "
                     "another transaction", result.skipped, extra={"action": "reap_skipped"})
        per_queue: dict[str, dict[str, int]] = {}
        for (queue, state), n in result.by_queue.items():
            action = _ACTION.get(state, state)
            per_queue.setdefault(queue, {})[action] = n
            if metrics is not None:
                metrics.expirations(queue, action, n)
        for queue, counts in per_queue.items():
            tracing.batch_span("reap", queue, sum(counts.values()), **counts)
            log.warning("reaped %s expired lease(s) on queue %r: %s", sum(counts.values()), queue,
                        ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                        extra={"action": "reap", "queue": queue})
        if result.candidates < config.batch or not result.total:
            break  # all found, or the ones found are being settled or skipped: next pass
    return total


class Reaper(Service):
    """The reaper as a service of the supervisor: a pass every ``interval`` seconds."""

    name = "reaper"
    action = "reaping expired leases"

    def __init__(self, *, store: Store, config: ReaperConfig, interval: float, metrics: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.store = store
        self.config = config
        self.interval = interval
        self.metrics = metrics

    def first_delay(self) -> float:
        return min(5.0, self.interval)

    def next_delay(self) -> float:
        return self.interval

    def run_once(self, conn: psycopg.Connection) -> None:
        # asked first, so that /readyz names a read-only server even when nothing needs reaping
        if not self.store.server_writable(conn):
            raise DatabaseReadOnly("the server is read-only (a standby, or default_transaction_read_only is on)")
        reap_pass(self.store, conn, self.config, self.metrics)
