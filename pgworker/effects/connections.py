"""The connection a claimer lends its handlers for ``ctx.transaction()``.

One per claimer process (a claimer runs one handler at a time), opened on first use,
so a worker whose handlers never open a transaction opens nothing. It carries the
worker's session bounds (keepalives and ``tcp_user_timeout`` from the lease,
``statement_timeout``, ``lock_timeout``): the handler's statements are bounded like the
worker's own. Autocommit, so that ``ctx.transaction()`` is an explicit BEGIN ... COMMIT
whose COMMIT is pgworker's, and a handler cannot commit half of it early
(``conn.commit()`` inside the block raises). A connection found closed or broken is
replaced at the next use; one idle for longer than ``POOL_CHECK_IDLE_SECONDS`` (the
client pool's rule) is checked first with an empty statement, so that a server restart
or a terminated backend between two jobs costs a reconnect rather than the next job's
first step or effect record (which failed with AdminShutdown and spent an attempt).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from opentelemetry import trace

from .. import tracing
from ..connections import POOL_CHECK_IDLE_SECONDS
from ..db import (CONNECT_TIMEOUT_SECONDS, KEEPALIVE_KWARGS, check_dsn, close_quietly, milliseconds,
                  worker_connection, worker_params)
from ..errors import DatabaseUnavailable
from ..names import dsn_password, redact

log = logging.getLogger("pgworker.effects")


class HandlerConnections:
    """``get()``: the open connection (opening it if needed); ``fresh()``: a new one for a
    single read (after the first failed); ``close()`` at the claimer's exit."""

    def __init__(self, settings: Any, name: str) -> None:
        self.settings = settings
        self.name = name
        self.conn: psycopg.Connection | None = None
        # async handlers' (ctx.atransaction()): one per event loop, as an async connection
        # belongs to the loop it was opened in
        self.aconn: psycopg.AsyncConnection | None = None
        self.aloop: Any = None
        # time.monotonic() of the last get() / aget(): the idle time that decides a check
        self.used_at = 0.0
        self.aused_at = 0.0

    async def aget(self) -> psycopg.AsyncConnection:
        """The async handler connection of the running loop (opening it if needed)."""
        import asyncio

        loop = asyncio.get_running_loop()
        a = self.aconn
        if a is not None and self.aloop is loop and _idle_and_unchecked(a, self.aused_at):
            try:
                await a.execute("")
            except psycopg.Error:
                log.info("the async handler connection was broken while idle (a server restart, a terminated "
                         "backend): opening another", extra={"action": "handler_reconnect"})
                self._drop_async()
                a = None
        self.aused_at = time.monotonic()
        if a is None or a.closed or a.broken or self.aloop is not loop:
            self._drop_async()
            s = self.settings
            check_dsn(s.dsn)
            params = {**KEEPALIVE_KWARGS, **worker_params(s.lease_seconds),
                      "application_name": f"pgworker:handler:{self.name}",
                      "connect_timeout": CONNECT_TIMEOUT_SECONDS}
            try:
                a = await psycopg.AsyncConnection.connect(s.dsn, autocommit=True, **params)
            except psycopg.OperationalError as exc:
                raise DatabaseUnavailable(f"the handler connection could not be opened: "
                                          f"{redact(str(exc).strip(), dsn_password(s.dsn), s.dsn)}") from None
            if not s.prepared_statements:
                a.prepare_threshold = None
            await a.execute("SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
                            [milliseconds(s.statement_timeout_seconds), milliseconds(s.lock_timeout_seconds)])
            self.aconn, self.aloop = a, loop
        return a

    def discard_async(self) -> None:
        self._drop_async()

    def _drop_async(self) -> None:
        """Forget the async connection; its socket is closed here (its loop may be gone)."""
        a, self.aconn, self.aloop = self.aconn, None, None
        if a is not None and not a.closed:
            try:
                a.pgconn.finish()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def get(self) -> psycopg.Connection:
        conn = self.conn
        if conn is not None and _idle_and_unchecked(conn, self.used_at):
            try:
                conn.execute("")
            except psycopg.Error:
                log.info("the handler connection was broken while idle (a server restart, a terminated backend): "
                         "opening another", extra={"action": "handler_reconnect"})
                self.discard()
        self.used_at = time.monotonic()
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.discard()
            self.conn = self._open(f"pgworker:handler:{self.name}")
        return self.conn

    def fresh(self) -> psycopg.Connection:
        """A connection of its own (the caller closes it)."""
        return self._open(f"pgworker:read-back:{self.name}")

    def _open(self, application_name: str) -> psycopg.Connection:
        return worker_connection(self.settings, application_name)

    def discard(self) -> None:
        conn, self.conn = self.conn, None
        close_quietly(conn)

    def close(self) -> None:
        self.discard()
        self._drop_async()


def _idle_and_unchecked(conn: "psycopg.Connection | psycopg.AsyncConnection", used_at: float) -> bool:
    """Whether an open connection should be checked before use: idle past the bound, and
    outside a transaction (never replaced in the middle of one: its work would be lost
    without a word; a failure there is the transaction's to report)."""
    return (not conn.closed and not conn.broken and time.monotonic() - used_at > POOL_CHECK_IDLE_SECONDS
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


class EffectResources:
    """What a claimer lends its handlers' contexts for their own transactions, steps and
    effects: its store, settings, handler connection, worker id (for spans) and metrics
    (None outside a worker: testing.drain)."""

    __slots__ = ("store", "settings", "connections", "worker_id", "metrics")

    def __init__(self, store: Any, settings: Any, connections: HandlerConnections, worker_id: str) -> None:
        self.store = store
        self.settings = settings
        self.connections = connections
        self.worker_id = worker_id
        self.metrics: Any = None

    def count(self, what: str, queue: str, result: str | None = None) -> None:
        """Count a step skipped, an effect reconciled (``result``) or left uncertain."""
        m = self.metrics
        if m is None:
            return
        if what == "step_skipped":
            m.step_skipped(queue)
        elif what == "effect_reconciled":
            m.effect_reconciled(queue, result or "happened")
        elif what == "effect_uncertain":
            m.effect_uncertain(queue)

    def fenced(self, ctx: Any, operation: str) -> None:
        """A step or effect record the fence refused: counted, logged and traced like the
        other fenced writes."""
        if self.metrics is not None:
            self.metrics.fenced(ctx.job.queue, operation)
        log.warning("fenced out: the %s record of job %s (token %s) was refused, the lease was lost",
                    operation, ctx.job_id, ctx.lease_token,
                    extra={"action": "fenced", "job_id": ctx.job_id, "queue": ctx.job.queue,
                           "lease_token": ctx.lease_token})
        record_span(ctx.job, operation, None, False, self.worker_id)

    def traced(self, ctx: Any, operation: str, name: str) -> None:
        record_span(ctx.job, operation, name, True, self.worker_id)

    def close(self) -> None:
        self.connections.close()


def record_span(job: Any, operation: str, name: str | None, accepted: bool, worker_id: str) -> None:
    """The ``record {queue}`` span of one step or effect record, a child of the attempt's
    process span (current while the handler runs); a refusal is an error with a
    ``fence refused`` event."""
    parent = trace.get_current_span()
    if not parent.get_span_context().is_valid:
        return  # the attempt is not traced
    attrs = {"messaging.system": tracing.MESSAGING_SYSTEM, "messaging.destination.name": job.queue,
             "messaging.operation.type": "record", "messaging.operation.name": operation,
             "messaging.message.id": str(job.id), "messaging.client.id": worker_id,
             "pgworker.task": job.task, "pgworker.job.attempt": job.attempt,
             "pgworker.lease.token": job.lease_token,
             "pgworker.fence.result": "accepted" if accepted else "refused"}
    if name is not None:
        attrs["pgworker.step.name"] = name
    span = tracing.tracer().start_span(f"record {job.queue}", kind=trace.SpanKind.INTERNAL, attributes=attrs)
    if not accepted:
        span.add_event("fence refused", {"pgworker.lease.token": job.lease_token})
        span.set_attribute("error.type", tracing.LEASE_LOST)
        span.set_status(trace.Status(trace.StatusCode.ERROR, "lease lost: the record was refused by the fence"))
    span.end()
