"""Gauges of the pod's loops, read from the supervisor's own state when /metrics is scraped:
when each background service last completed a pass, and when each claimer's loop last
went round (``pgworker_loop_*``, ``pgworker_claimer_loop_*``, in pgworker.catalogue).

A loop stuck on a hung statement, a lock or a wedged slot table showed only through its
effects, much later (leases reaped late, jobs waiting). These say it directly, and the
``PgworkerLoopStalled`` and ``PgworkerClaimerLoopStalled`` alerts watch them.

- A service (renewer, settler, listener, reaper, pruner, scheduler) records the Unix
  time of each completed pass in ``last_success`` (its start until the first); its
  ``interval_seconds()`` is the longest it waits between two passes when healthy.
- A claimer beats in its slot table's header on every loop iteration (``loop_at``,
  monotonic: a claim round, or a wake-up check about every second while idle); it is
  converted to Unix time here. Until a replacement claimer's first beat, its start
  counts. A slot in state RUNNING means a handler runs in it: the loop waits for it.
  A slot table whose lock stays taken reads as "no handler": a claimer wedged on it
  must not look busy.

No query, no multiprocess file: the supervisor holds everything, so the values cost
nothing between scrapes, and a claimer's series is its index (0 to --concurrency - 1),
the same across its replacements.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily

from . import catalogue as cat
from .worker.shm import layout as s
from .worker.shm.slots import SlotTable, SlotTableBusy


class LoopGauges:
    """A prometheus_client collector. ``services()`` gives the pod's services (objects
    with ``name``, ``last_success`` and ``interval_seconds()``); ``pool()`` the claimer
    pool (pgworker.worker.supervisor.pool.ClaimerPool), or None before it exists."""

    def __init__(self, services: Callable[[], Sequence[Any]], pool: Callable[[], Any]) -> None:
        self._services = services
        self._pool = pool

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        d = cat.METRICS_BY_NAME

        def gauge(name: str, label: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, d[name].help, labels=[label])

        last = gauge("pgworker_loop_last_success_timestamp_seconds", "loop")
        interval = gauge("pgworker_loop_interval_seconds", "loop")
        for service in self._services():
            if service.last_success:  # 0: not started yet
                last.add_metric([service.name], service.last_success)
                interval.add_metric([service.name], service.interval_seconds())
        loop = gauge("pgworker_claimer_loop_last_success_timestamp_seconds", "claimer")
        running = gauge("pgworker_claimer_handler_running", "claimer")
        pool = self._pool()
        now_wall, now = time.time(), time.monotonic()
        for h in pool.handles if pool is not None else ():
            if h.process is None:
                continue  # gone, its replacement not started yet
            beat = max(h.table.header.loop_at, h.started_at)
            loop.add_metric([str(h.index)], now_wall - (now - beat))
            running.add_metric([str(h.index)], 1.0 if _handler_running(h.table) else 0.0)
        return [last, interval, loop, running]


def _handler_running(table: SlotTable) -> bool:
    try:
        return any(v.state == s.RUNNING for v in table.live())
    except SlotTableBusy:
        return False
