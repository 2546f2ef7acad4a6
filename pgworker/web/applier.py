"""The console process applies bulk operations (:mod:`pgworker.bulk`): a thread on the
runtime's service base (one reconnect backoff, an outage logged once, bounded passes),
woken at once when this process records an operation and every ``bulk_idle_seconds``
(:class:`pgworker.web.WebConfig`) otherwise (for operations another replica recorded, or one left by a console that was
killed: the batch it had in flight rolled back, and this one goes on from the cursor)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads

from .. import bulk
from ..jobs import safe_json_loads
from ..worker.service import Service, worker_connect

#: A pass applies batches for at most this long, then yields (and reports progress).
PASS_SECONDS = 5.0
#: Finished operations (and their job rows) are kept this long.
RETENTION_SECONDS = 30 * 86400.0
PRUNE_EVERY_SECONDS = 3600.0


class BulkApplier(Service):
    name = "bulk"
    action = "applying bulk operations"

    def __init__(self, *, store: Any, idle_seconds: float = 10.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.store = store
        self.idle_seconds = idle_seconds
        self.wake = threading.Event()
        self.more = False
        self.pruned_at = 0.0

    @classmethod
    def for_console(cls, console: Any) -> "BulkApplier":
        settings = console.app.settings
        return cls(store=console.store, idle_seconds=console.config.bulk_idle_seconds, connect=worker_connect(settings), stop=threading.Event(), dsn=settings.dsn,
                   pass_timeout=PASS_SECONDS + settings.statement_timeout_seconds + 5.0)

    def run(self) -> None:
        delay = 0.0
        try:
            while not self.stop.is_set():
                self.wake.wait(delay)
                self.wake.clear()
                if self.stop.is_set():
                    break
                delay = self.pass_once()
        finally:
            self.close()

    def run_once(self, conn: psycopg.Connection) -> None:
        # an operation's filter Python cannot decode (written by hand) fails that operation
        # (bulk.apply_batch), instead of failing every pass and holding up the ones after it
        set_json_loads(safe_json_loads, conn)
        deadline = time.monotonic() + PASS_SECONDS
        self.more = False
        while time.monotonic() < deadline and not self.stop.is_set():
            op = bulk.apply_batch(self.store, conn)
            if op is None:
                break
            self.more = True
        if time.monotonic() - self.pruned_at > PRUNE_EVERY_SECONDS:
            self.store.bulk_operations_prune(conn, older_than=RETENTION_SECONDS)
            self.pruned_at = time.monotonic()

    def next_delay(self) -> float:
        return 0.0 if self.more else self.idle_seconds

    def close_service(self) -> None:
        self.stop.set()
        self.wake.set()
        self.join(PASS_SECONDS + 5.0)
