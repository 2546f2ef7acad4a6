"""The queue statistics behind the ``pgworker_queue_*`` gauges, read when /metrics is scraped.

One connection of its own, opened with a short connect timeout, and one statement under
``statement_timeout``: an unreachable or slow server fails the scrape's statistics fast
(``pgworker_queue_stats_up`` 0) instead of stalling /metrics past Prometheus' scrape
timeout. The collector (:class:`pgworker.database_gauges.QueueStatsCollector`) caches the rows.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import psycopg

from ..config import Settings
from ..db import connect, milliseconds


class StatsSource:
    """``fetch(queues)``: the statistics rows of these queues (raises on failure)."""

    def __init__(self, store: Any, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.conn: psycopg.Connection | None = None
        self.lock = threading.Lock()

    def fetch(self, queues: Sequence[str]) -> list[dict[str, Any]]:
        timeout = self.settings.stats_timeout_seconds
        with self.lock:
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.conn = connect(self.settings.dsn, application_name="pgworker:stats",
                                        prepare=self.settings.prepared_statements, connect_timeout=timeout)
                with self.conn.transaction():
                    self.conn.execute("SELECT set_config('statement_timeout', %s, true)",
                                      [milliseconds(timeout)])
                    return self.store.queue_stats(self.conn, queues)
            except Exception:
                if self.conn is not None and (self.conn.broken or self.conn.closed):
                    self.conn = None
                raise

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
