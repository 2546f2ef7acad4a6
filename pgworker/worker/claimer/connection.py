"""The claimer's one database connection, shared by its claim loop and its completer.

One statement sequence at a time (``lock``); opened with the worker's session bounds
(keepalives and ``tcp_user_timeout`` from the lease, ``statement_timeout``,
``lock_timeout``), its prepared statements on their generic plans
(:func:`pgworker.db.use_generic_plans`), the opt-in ``synchronous_commit``, and a JSON decoder that turns a
payload Python cannot decode into a value its job fails on, instead of failing every
claim of its queue. After a lost connection it reconnects with the runtime's one
backoff, and logs the outage once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import psycopg
from psycopg.types.json import set_json_loads

from ...config import Settings
from ...db import (POOLED, OutageLog, close_quietly, connect, describe_failure, read_timestamps_in_utc,
                   set_session_timeouts, use_generic_plans, worker_params)
from ...errors import DatabaseUnavailable
from ...jobs import safe_json_loads
from ..service import Backoff, drop_connection

log = logging.getLogger("pgworker.claimer")


class ClaimerConnection:
    """``ensure()`` before use; ``failed(exc, action)`` after a failed statement or a lost
    connection (logs once per outage, drops the connection by the runtime's rule, waits
    the backoff); ``ok()`` after a statement went through."""

    def __init__(self, settings: Settings, index: int, should_stop: Callable[[], bool],
                 on_connect_failure: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        # told why a connect failed (the slot table's claim health: /readyz names a claimer
        # that cannot connect to claim: a rotated password, too many clients, pg_hba)
        self.on_connect_failure = on_connect_failure
        self.index = index
        self.should_stop = should_stop
        self.lock = threading.RLock()
        self.conn: psycopg.Connection | None = None
        self.backoff = Backoff()
        self.outage = OutageLog(log, f"claimer {index}", settings.dsn)

    def ensure(self, block: bool = True) -> bool:
        """An open connection, reconnecting if needed; False (after the backoff when
        ``block``) when the database cannot be reached."""
        with self.lock:
            if self.conn is not None and not self.conn.closed and not self.conn.broken:
                return True
            try:
                self.conn = self._open()
                # the backoff is reset by the first statement that succeeds, not by the
                # connect: a read-only server accepts connections and refuses every claim
                return True
            except (DatabaseUnavailable, psycopg.Error) as exc:
                self.close()
                self.outage.failed(exc, "connect")
                if self.on_connect_failure is not None:
                    self.on_connect_failure(f"connect: {describe_failure(exc, self.settings.dsn)}")
        if block:
            self.sleep(self.backoff.next())
        return False

    def _open(self) -> psycopg.Connection:
        s = self.settings
        conn = connect(s.dsn, application_name=f"pgworker:claimer:{self.index}", prepare=s.prepared_statements,
                       **worker_params(s.lease_seconds))
        try:
            set_json_loads(safe_json_loads, conn)
            set_session_timeouts(conn, statement_timeout=s.statement_timeout_seconds,
                                 lock_timeout=s.lock_timeout_seconds)
            # the claim on its cached plan, never planned again at each call (about 1.3 ms)
            use_generic_plans(conn)
            read_timestamps_in_utc(conn)  # a claim's five timestamps a job, on psycopg's fast path
            if s.synchronous_commit:
                if conn in POOLED:
                    log.warning("claimer %s: synchronous_commit is a session setting, which a transaction "
                                "pooler does not keep: set it on the role instead (ALTER ROLE ... SET "
                                "synchronous_commit = ...) and unset PGWORKER_SYNCHRONOUS_COMMIT", self.index)
                else:
                    conn.execute("SELECT set_config('synchronous_commit', %s, false)", [s.synchronous_commit])
        except BaseException:
            conn.close()
            raise
        return conn

    def ok(self) -> None:
        self.outage.ok()
        self.backoff.reset()

    def failed(self, exc: BaseException, action: str) -> None:
        """A statement or the connection failed: log (once per outage), drop the
        connection when the runtime's rule says so (:func:`~pgworker.worker.service.drop_connection`),
        wait the backoff."""
        self.outage.failed(exc, action)
        with self.lock:
            if drop_connection(exc, self.conn):
                self.close()
        self.sleep(self.backoff.next())

    def close(self) -> None:
        conn, self.conn = self.conn, None
        close_quietly(conn)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.should_stop():
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
