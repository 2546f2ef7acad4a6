"""The reaper: recover jobs whose lease expired (their worker crashed, hung or was cut off).

Each pass reaps in bounded batches (``REAP_BATCH`` jobs per short transaction), walking
the expired leases oldest first, each batch after the last candidate of the one before,
until a batch comes back short. Expired jobs go back to pending after their task's retry
delay (the same policy as a handler's failure), to dead with code LEASE_EXPIRED once
their attempts are spent, or to cancelled when a cancellation was pending. ``FOR UPDATE
SKIP LOCKED`` lets the reapers of several pods run at once without blocking each other or
reaping a job twice, and passes over rows other sessions hold locked; an ordering key
whose lock another transaction holds is skipped for this pass, never waited for
(``pgworker_reap_skipped_total``). Neither hides the expired leases behind them.

A row that cannot be written (a CHECK constraint or trigger a user added refuses it, a
value out of range) is isolated from its batch, which is reaped without it; it is
reported (an ERROR line naming the job and the error, ``pgworker_reap_failed_total``, a
REAP_FAILED entry in its error history when that can be written) and left alone for
``RETRY_UNREAPABLE_SECONDS`` before it is tried again (once it failed every pass, and its
whole batch with it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from .. import tracing
from ..errors import DatabaseReadOnly
from ..jobs import ReapFailure
from ..store import Store
from .service import Service

log = logging.getLogger("pgworker.reaper")

REAP_BATCH = 500
REAP_MAX_BATCHES_PER_PASS = 100
# How long a row that could not be reaped is left alone before it is tried (and, still
# failing, reported) again; and how many such rows a reaper remembers.
RETRY_UNREAPABLE_SECONDS = 300.0
MAX_UNREAPABLE_REMEMBERED = 10_000
# Rows that could not be reaped logged one by one per pass; past that, one line says how
# many more (a trigger refusing every row must not write thousands of lines a pass).
MAX_UNREAPABLE_LOGGED = 10

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


def reap_pass(store: Store, conn: psycopg.Connection, config: ReaperConfig, metrics: Any = None,
              unreapable: dict[int, float] | None = None) -> int:
    """Reap every expired lease (up to ``max_batches`` batches); returns how many.

    ``unreapable``: {job id: monotonic time it last failed}, kept by the caller across
    passes; those failed less than ``RETRY_UNREAPABLE_SECONDS`` ago are not tried."""
    unreapable = {} if unreapable is None else unreapable
    now = time.monotonic()
    for job_id in [j for j, at in unreapable.items() if now - at >= RETRY_UNREAPABLE_SECONDS]:
        del unreapable[job_id]
    total = 0
    failed = 0
    after = None
    for _ in range(config.max_batches):
        result = store.reap(conn, limit=config.batch, delay_for=config.delay_for, after=after, skip=unreapable)
        total += result.total
        if metrics is not None:
            metrics.reap_skipped(result.skipped)
        if result.skipped:
            log.info("reaper: %s expired lease(s) left for a later pass: their ordering key is locked by "
                     "another transaction", result.skipped, extra={"action": "reap_skipped"})
        for failure in result.failed:
            if metrics is not None:
                metrics.reap_failed(failure.queue)
            if failed < MAX_UNREAPABLE_LOGGED:
                _report(failure)
            failed += 1
            unreapable[failure.job_id] = now
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
        if result.candidates < config.batch:
            break  # all found; the next batch would start after this one's last candidate
        after = result.last
    if failed > MAX_UNREAPABLE_LOGGED:
        log.error("reaper: %s more expired lease(s) could not be reaped, their rows refused alike "
                  "(pgworker_reap_failed_total counts them; each has REAP_FAILED in its error history "
                  "where that could be written)", failed - MAX_UNREAPABLE_LOGGED, extra={"action": "reap_failed"})
    if len(unreapable) > MAX_UNREAPABLE_REMEMBERED:  # forget the oldest failures: they are tried first
        for job_id in sorted(unreapable, key=unreapable.__getitem__)[:len(unreapable) - MAX_UNREAPABLE_REMEMBERED]:
            del unreapable[job_id]
    return total


def _report(failure: ReapFailure) -> None:
    log.error("reaper: job %s (queue %r) cannot be reaped, its row was refused: %s. The rest of its batch "
              "was reaped; this job stays running with an expired lease, tried again in %.0f s. Fix the "
              "row, or what refuses it (a CHECK constraint or trigger on the jobs table?)%s",
              failure.job_id, failure.queue, failure.message, RETRY_UNREAPABLE_SECONDS,
              "" if failure.noted else "; its error history could not be written either",
              extra={"action": "reap_failed", "queue": failure.queue, "job_id": failure.job_id})


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
        self.unreapable: dict[int, float] = {}  # job id: when its row last failed (monotonic)

    def first_delay(self) -> float:
        return min(5.0, self.interval)

    def next_delay(self) -> float:
        return self.interval

    def run_once(self, conn: psycopg.Connection) -> None:
        # asked first, so that /readyz names a read-only server even when nothing needs reaping
        if not self.store.server_writable(conn):
            raise DatabaseReadOnly("the server is read-only (a standby, or default_transaction_read_only is on)")
        reap_pass(self.store, conn, self.config, self.metrics, self.unreapable)
