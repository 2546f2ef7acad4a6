"""The base of the supervisor's background services (renewer, reaper, pruner, scheduler,
settler, listener): a thread with its own connection that stops when asked, reconnects
with one backoff (exponential, with jitter, capped), and reports an outage once.

A service implements :meth:`Service.run_once` (one pass on an open connection) and says
when to run next (:meth:`Service.next_delay`, seconds). A pass that fails is logged once
per outage (:class:`pgworker.db.OutageLog`), retried after the backoff, and its
connection is replaced by the runtime's one rule (:func:`drop_connection`, which the
claimers' connection follows too): when it is gone, or is a session only a new one
fixes; a statement that fails on a live connection (a timeout, a refused lock) keeps it. Every worker connection bounds its statements and
lock waits (``statement_timeout``, ``lock_timeout``) and notices a dead peer within a
bound derived from the lease (:func:`pgworker.db.worker_params`), so no service waits
forever on the database.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import psycopg

from ..db import OutageLog, close_quietly, connection_lost, failure_kind
from ..errors import DatabaseUnavailable
from ..retry import RetryPolicy

log = logging.getLogger("pgworker.worker")

# The one reconnect backoff of the runtime (services, the listener, the claimers):
# 0.5 s doubling to a cap of 10 s, less up to half at random so that a fleet does not
# reconnect in step. The cap is the worst-case delay between the database's return and
# a component noticing it.
RECONNECT_MAX_SECONDS = 10.0
RECONNECT_POLICY = RetryPolicy(base_seconds=0.5, factor=2.0, max_seconds=RECONNECT_MAX_SECONDS, jitter=0.5)

Connect = Callable[[str], psycopg.Connection]


def drop_connection(exc: BaseException, conn: psycopg.Connection | None) -> bool:
    """The runtime's one rule for when a failure ends a connection (services and claimers).

    Drop it when it is gone (:func:`pgworker.db.connection_lost`), when the session sits
    in a failed transaction, or when the failure belongs to the session rather than the
    statement: a read-only server (a demoted primary, or a pooler that routed us to a
    standby: a new connection may reach the new primary), a transaction pooler's lost
    prepared statement (psycopg's cache lives with the connection), or a prepared
    statement whose result type a migration changed (refused at every execution on this
    session; a new one prepares it anew). Keep it otherwise: a
    statement that fails on a live connection (a timeout, a lock not granted, a refused
    value, a missing privilege) fails the same way on a new one, and dropping the
    connection for it (as the claim path once did on any error) only adds a handshake to
    every failure and makes a pod's claimers reconnect in step when many fail at once."""
    if connection_lost(exc, conn):
        return True
    if conn is not None and conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        return True
    return failure_kind(exc) in ("read-only", "prepared-statements", "stale-plan")


class ServiceThread:
    """The thread of a pod service (:class:`Service`, and the listener, which keeps its
    own loop: it waits on one connection's notifications rather than running passes).
    ``last_success``: Unix time of the last pass that went through (its start until then),
    read by the loop gauges (pgworker.loop_gauges)."""

    name = "service"
    thread: threading.Thread | None = None
    last_success = 0.0

    def run(self) -> None:
        raise NotImplementedError

    def start(self) -> "ServiceThread":
        self.last_success = time.time()
        self.thread = threading.Thread(target=self.run, name=f"pgworker-{self.name}", daemon=True)
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


class PassStalled(DatabaseUnavailable):
    """A pass took longer than its deadline (a stalled network path): its connection was
    abandoned and the pass will be retried on a new one."""


class Backoff:
    """The delays of one run of failures: ``next()`` gives the next one (seconds),
    ``reset()`` starts over after a success. Built on :class:`pgworker.RetryPolicy`."""

    def __init__(self, policy: RetryPolicy = RECONNECT_POLICY) -> None:
        self.policy = policy
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return self.policy.delay(self.failures)

    def reset(self) -> None:
        self.failures = 0


class Health:
    """What a service reports to the pod's /readyz (see pgworker.worker.health)."""

    def db_ok(self) -> None: ...

    def db_failed(self, kind: str, reason: str = "") -> None: ...


class Service(ServiceThread):
    """One background duty of the supervisor, in a thread of its own.

    ``connect(application_name)`` opens a worker connection; ``stop`` ends every service
    of the pod; ``health`` receives the database's state as this service sees it.
    """

    name = "service"
    action = ""  # what a failed pass was doing, for the outage log
    # Whether a pass skipped for want of work (has_work() False) is the loop going round
    # as it should (a service fed by a queue), or a loop that does nothing any more.
    idle_counts_as_pass = True

    def __init__(self, *, connect: Connect, stop: threading.Event, health: Any = None,
                 dsn: str | None = None, pass_timeout: float = 60.0) -> None:
        self.connect = connect
        self.stop = stop
        self.health = health or Health()
        self.pass_timeout = pass_timeout
        self.backoff = Backoff()
        self.outage = OutageLog(log, self.name, dsn)
        self.conn: psycopg.Connection | None = None
        self.thread: threading.Thread | None = None
        # Unix time of the last completed pass (its start until the first):
        # pgworker_loop_last_success_timestamp_seconds (pgworker.loop_gauges)
        self.last_success = 0.0

    # -- what a service defines -------------------------------------------------------

    def run_once(self, conn: psycopg.Connection) -> None:
        raise NotImplementedError

    def first_delay(self) -> float:
        """Seconds before the first pass."""
        return 0.0

    def next_delay(self) -> float:
        """Seconds from the end of a successful pass to the next one."""
        raise NotImplementedError

    def on_failure(self, exc: BaseException) -> None:
        """Called after a failed pass (besides the outage log and the backoff)."""

    def has_work(self) -> bool:
        """False skips a pass without touching the database (a service fed by a queue)."""
        return True

    def interval_seconds(self) -> float:
        """The longest a healthy service waits between two passes (the stall alert's unit)."""
        return self.next_delay()

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        delay = self.first_delay()
        try:
            while not self.stop.wait(delay):
                delay = self.pass_once()
        finally:
            self.close()

    def pass_once(self) -> float:
        """One pass with its error handling; returns the delay before the next one."""
        if not self.has_work():
            if self.idle_counts_as_pass:
                self.last_success = time.time()
            return self.next_delay()
        try:
            self.bounded(self._connect_and_run, self.pass_timeout)
        except Exception as exc:  # noqa: BLE001 - a service must outlive any failure
            self.health.db_failed(self.outage.failed(exc, self.action))
            if drop_connection(exc, self.conn):
                self.close()
            self.on_failure(exc)
            return self.backoff.next()
        self.last_success = time.time()
        self.backoff.reset()
        self.outage.ok()
        self.health.db_ok()
        return self.next_delay()

    def _connect_and_run(self) -> None:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = self.connect(f"pgworker:{self.name}")
        self.run_once(self.conn)

    def bounded(self, fn: Callable[[], Any], seconds: float) -> Any:
        """Run ``fn`` with a deadline of ``seconds``. Statements already carry a
        ``statement_timeout``, but a path that acknowledges packets and then stalls (a
        proxy, a half-open NAT) never lets the server see them: past the deadline the
        pass is abandoned with its connection (closed by the stuck call when it returns)
        and :class:`PassStalled` is raised, so the service goes on with a new one."""
        outcome: dict[str, Any] = {}
        done = threading.Event()
        abandoned = threading.Event()

        def call() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome["error"] = exc
            finally:
                done.set()
                if abandoned.is_set() and conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass

        conn = None
        worker = threading.Thread(target=call, name=f"pgworker-{self.name}-pass", daemon=True)
        worker.start()
        if not done.wait(seconds):
            conn, self.conn = self.conn, None
            abandoned.set()
            if done.is_set() and conn is not None:  # finished just now: close it here
                conn.close()
            raise PassStalled(f"{self.name}: no answer from PostgreSQL within {seconds:.1f} s "
                              "(a stalled network path?); trying again on a new connection")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def close(self) -> None:
        conn, self.conn = self.conn, None
        close_quietly(conn)


def worker_connect(settings: Any) -> Connect:
    """``connect(application_name)`` for the pod's services: a worker connection (the
    session bounds of the module docstring), autocommit, prepared statements as set."""
    from ..db import worker_connection

    def open_connection(application_name: str) -> psycopg.Connection:
        return worker_connection(settings, application_name)

    return open_connection
