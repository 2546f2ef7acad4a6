"""The listener: one direct connection per pod LISTENing on the schema's channel.

A notification names a queue: it announces work on that queue to the pod (one idle
claimer wakes: :mod:`pgworker.worker.shm.wakeups`). On a lost connection it reconnects with
the runtime's backoff, LISTENs again and sweeps (announces work on every queue), since
notifications sent meanwhile were lost; the fallback poll keeps claiming in between.
NOTIFY is a hint, the table is the truth.

It runs on the services' thread base (:class:`~pgworker.worker.service.ServiceThread`)
with the runtime's backoff, but keeps its own loop rather than :class:`Service`'s passes:
it waits on one connection's notifications for as long as that connection lives. Any
failure ends its connection: a LISTEN session's failures are the session's (gone, or a
standby that refuses LISTEN, read-only), which :func:`~pgworker.worker.service.drop_connection`
drops too.

LISTEN needs a session of its own: never through a transaction-mode pooler
(``PGWORKER_LISTEN_DSN`` names a direct connection when ``PGWORKER_DSN`` is a pooler).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from psycopg import sql

from ..db import OutageLog, connect, worker_params
from .service import Backoff, ServiceThread

log = logging.getLogger("pgworker.listener")

NOTIFIES_WAIT_SECONDS = 1.0  # how often the loop looks at its stop flag while idle


class Listener(ServiceThread):
    """``announce(queue_index, reason)`` tells the pod; -1 means every queue.

    ``last_success``: Unix time of the last wait for notifications that ended on a live
    LISTEN connection (about every NOTIFIES_WAIT_SECONDS; its start until connected), as
    the services' (pgworker.loop_gauges)."""

    name = "listener"

    def __init__(self, *, dsn: str | None, channel: str, queues: list[str], lease_seconds: float,
                 announce: Callable[[int, str], None], health: Any, metrics: Any, stop: threading.Event) -> None:
        self.dsn = dsn
        self.channel = channel
        self.queue_index = {q: i for i, q in enumerate(queues)}
        self.lease_seconds = lease_seconds
        self.announce = announce
        self.health = health
        self.metrics = metrics
        self.stop = stop

    def interval_seconds(self) -> float:
        return NOTIFIES_WAIT_SECONDS

    def run(self) -> None:
        backoff = Backoff()
        outage = OutageLog(log, "listener", self.dsn)
        first = True
        while not self.stop.is_set():
            try:
                with connect(self.dsn, application_name="pgworker:listener", prepare=False,
                             **worker_params(self.lease_seconds)) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.health.listening = True
                    self.health.db_ok()
                    outage.ok()
                    if not first:
                        self.metrics.listener_reconnected()
                        log.warning("LISTEN connection re-established; sweeping for missed jobs")
                    self.announce(-1, "sweep" if first else "reconnect")
                    first = False
                    backoff.reset()
                    while not self.stop.is_set():
                        for note in conn.notifies(timeout=NOTIFIES_WAIT_SECONDS):
                            qi = self.queue_index.get(note.payload)
                            if qi is not None:
                                self.announce(qi, "notify")
                        self.last_success = time.time()
            except Exception as exc:  # noqa: BLE001 - the listener must outlive any failure
                self.health.listening = False
                if self.stop.is_set():
                    return
                # logged once per outage; the fallback poll keeps claiming meanwhile
                self.health.db_failed(outage.failed(exc, "LISTEN connection lost; polling continues"))
                self.stop.wait(backoff.next())
        self.health.listening = False
