"""The connection a claimer lends its handlers for ``ctx.transaction()``.

One per claimer process (a claimer runs one handler at a time), opened on first use,
so a worker whose handlers never open a transaction opens nothing. It carries the
worker's session bounds (keepalives and ``tcp_user_timeout`` from the lease,
``statement_timeout``, ``lock_timeout``): the handler's statements are bounded like the
worker's own. Autocommit, so that ``ctx.transaction()`` is an explicit BEGIN ... COMMIT
whose COMMIT is pgworker's, and a handler cannot commit half of it early
(``conn.commit()`` inside the block raises). A connection found closed or broken is
replaced at the next use.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from ..db import connect, set_session_timeouts, worker_params

log = logging.getLogger("pgworker.effects")


class HandlerConnections:
    """``get()``: the open connection (opening it if needed); ``fresh()``: a new one for a
    single read (after the first failed); ``close()`` at the claimer's exit."""

    def __init__(self, settings: Any, name: str) -> None:
        self.settings = settings
        self.name = name
        self.conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.discard()
            self.conn = self._open(f"pgworker:handler:{self.name}")
        return self.conn

    def fresh(self) -> psycopg.Connection:
        """A connection of its own (the caller closes it)."""
        return self._open(f"pgworker:read-back:{self.name}")

    def _open(self, application_name: str) -> psycopg.Connection:
        s = self.settings
        conn = connect(s.dsn, application_name=application_name, prepare=s.prepared_statements,
                       **worker_params(s.lease_seconds))
        try:
            set_session_timeouts(conn, statement_timeout=s.statement_timeout_seconds,
                                 lock_timeout=s.lock_timeout_seconds)
        except BaseException:
            conn.close()
            raise
        return conn

    def discard(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            self.conn = None

    close = discard


class EffectResources:
    """What a claimer lends its handlers' contexts for their own transactions: its store,
    its handler connection and its worker id (for spans)."""

    __slots__ = ("store", "connections", "worker_id")

    def __init__(self, store: Any, connections: HandlerConnections, worker_id: str) -> None:
        self.store = store
        self.connections = connections
        self.worker_id = worker_id

    def close(self) -> None:
        self.connections.close()
