"""The scheduler service: fire the app's periodic jobs as their slots fall due.

The slot logic (cron in a time zone, missed slots, compare-and-set so any number of
pods may run it) is :mod:`pgworker.schedules`; this is the thread that runs it: register
the schedules, fire what is due, sleep until the next slot (re-registering at least
every ``RESYNC_SECONDS``).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import psycopg

from ..schedules import RESYNC_SECONDS, Scheduler
from .service import Service


class SchedulerService(Service):
    name = "scheduler"
    action = "firing schedules"

    def __init__(self, *, scheduler: Scheduler, metrics: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.scheduler = scheduler
        self.metrics = metrics
        self.wait = 0.0
        self.registered_at: float | None = None

    def run_once(self, conn: psycopg.Connection) -> None:
        if self.registered_at is None or time.monotonic() - self.registered_at > RESYNC_SECONDS:
            self.scheduler.register(conn)
            self.registered_at = time.monotonic()
        self.wait = tick(self.scheduler, conn, self.metrics)

    def next_delay(self) -> float:
        return min(self.wait, RESYNC_SECONDS)

    def interval_seconds(self) -> float:
        return RESYNC_SECONDS  # it sleeps until the next slot, at most this long

    def on_failure(self, exc: BaseException) -> None:
        self.registered_at = None  # register again on the next connection


def tick(scheduler: Scheduler, conn: psycopg.Connection, metrics: Any) -> float:
    """One tick of ``scheduler``, counting its schedules' failures and the jobs it
    enqueued (by queue, as every enqueue is) in the metrics; returns the seconds until
    the next slot."""
    before = sum(scheduler.errors.values())
    fired = Counter(scheduler.fired_by_queue)
    try:
        return scheduler.tick(conn)
    finally:
        metrics.schedule_errors(sum(scheduler.errors.values()) - before)
        for queue, n in (scheduler.fired_by_queue - fired).items():
            metrics.enqueued(queue, n)
