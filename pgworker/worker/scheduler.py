"""The scheduler service: fire the app's periodic jobs as their slots fall due.

The slot logic (cron in a time zone, missed slots, compare-and-set so any number of
pods may run it) is :mod:`pgworker.schedules`; this is the thread that runs it: register
the schedules, fire what is due, sleep until the next slot (re-registering at least
every ``RESYNC_SECONDS``).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from ..schedules import RESYNC_SECONDS, Scheduler
from .service import Service


class SchedulerService(Service):
    name = "scheduler"
    action = "firing schedules"

    def __init__(self, *, scheduler: Scheduler, **kw: Any) -> None:
        super().__init__(**kw)
        self.scheduler = scheduler
        self.wait = 0.0
        self.registered_at: float | None = None

    def run_once(self, conn: psycopg.Connection) -> None:
        if self.registered_at is None or time.monotonic() - self.registered_at > RESYNC_SECONDS:
            self.scheduler.register(conn)
            self.registered_at = time.monotonic()
        self.wait = self.scheduler.tick(conn)

    def next_delay(self) -> float:
        return min(self.wait, RESYNC_SECONDS)

    def on_failure(self, exc: BaseException) -> None:
        self.registered_at = None  # register again on the next connection
