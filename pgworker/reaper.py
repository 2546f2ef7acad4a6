"""The reaper: recover jobs whose lease expired (their worker crashed, hung or was cut off).

Each pass reaps in bounded batches (``REAP_BATCH`` jobs per short transaction) until a
batch comes back short. Expired jobs go back to pending after a backoff with jitter, to
dead with code LEASE_EXPIRED once their attempts are spent, or to cancelled when a
cancellation was pending. ``FOR UPDATE SKIP LOCKED`` in the statement lets several
reapers (one per pod) run at once without blocking each other or reaping a job twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from . import tracing
from .store import BackoffParams, Store

log = logging.getLogger("pgworker.reaper")

REAP_BATCH = 500
REAP_MAX_BATCHES_PER_PASS = 100


@dataclass(frozen=True)
class ReaperConfig:
    """Reaper settings: batch size (jobs per transaction) and the requeue backoff (seconds)."""

    batch: int = REAP_BATCH
    max_batches: int = REAP_MAX_BATCHES_PER_PASS
    backoff: BackoffParams = BackoffParams()

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= 100_000:
            raise ValueError("reaper batch must be between 1 and 100000")


_ACTION = {"pending": "requeued", "dead": "dead", "cancelled": "cancelled"}


def reap_pass(store: Store, conn: psycopg.Connection, config: ReaperConfig, metrics: Any = None) -> int:
    """Reap every expired lease (up to ``max_batches`` batches); returns how many."""
    total = 0
    for _ in range(config.max_batches):
        result = store.reap(conn, limit=config.batch, backoff=config.backoff)
        total += result.total
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
            break  # all found, or the ones found are being settled by someone else: next pass
    return total
