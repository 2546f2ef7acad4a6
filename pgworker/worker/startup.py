"""The supervisor's start: wait for PostgreSQL and a schema this pgworker can use."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..config import Settings
from ..db import POOLED, connect, describe_failure
from ..errors import DatabaseRefused, DatabaseUnavailable, PoolerError
from .service import Backoff

log = logging.getLogger("pgworker.supervisor")

DRAIN_DATABASE_WAIT_SECONDS = 60.0  # a drain run without --max-duration gives up on the database after this
DATABASE_WAIT_LOG_SECONDS = 60.0    # while waiting for the database, say so again this often


def wait_for_database(settings: Settings, store: Any, health: Any, received: list[int], *, drain: bool,
                      max_duration: float | None) -> bool:
    """Connect and check the schema version, retrying while the server is away (a
    database may come up later): logged at once, then again every
    DATABASE_WAIT_LOG_SECONDS; /readyz (``health``) says why. Returns True once it
    answers; False when a signal arrives (``received`` is no longer empty), or, in drain
    mode, past its deadline (``max_duration`` seconds, else DRAIN_DATABASE_WAIT_SECONDS).
    Raises :class:`SchemaVersionError` for a schema of another version,
    :class:`PoolerError` when LISTEN would go through a pooler, and
    :class:`DatabaseRefused`, in drain mode, when the server refuses the DSN for good (no
    such database or role, credentials refused): waiting out the deadline cannot help."""
    backoff = Backoff()
    limit = max_duration if max_duration is not None else DRAIN_DATABASE_WAIT_SECONDS
    deadline = time.monotonic() + (limit if drain else float("inf"))
    next_log = 0.0
    while not received:
        try:
            with connect(settings.dsn, application_name="pgworker:supervisor",
                         prepare=settings.prepared_statements) as conn:
                store.check_schema_version(conn)
                pooled = conn in POOLED
            if pooled and health.listen_required and not settings.listen_dsn:
                raise PoolerError(
                    "PGWORKER_DSN goes through a connection pooler, and LISTEN needs a session of "
                    "its own (a transaction-mode pooler would drop its notifications): set "
                    "PGWORKER_LISTEN_DSN (--listen-dsn) to a direct connection to PostgreSQL, "
                    "or run with --no-listen to rely on the poll")
            health.db_ok()
            health.schema_ok = True
            return True
        except DatabaseUnavailable as exc:
            if drain and isinstance(exc, DatabaseRefused):
                # A drain run (a CronJob's) stops at once: waiting out its deadline cannot
                # create the database or right the password, and the next run tries again.
                # A long-running worker waits, as for an unreachable server: its database
                # may be created after it starts (/readyz names the refusal meanwhile).
                raise DatabaseRefused(f"{exc}; a drain run does not retry a refusal: fix --dsn (PGWORKER_DSN) "
                                      "and run again") from None
            reason = describe_failure(exc, settings.dsn)
            health.db_failed("unreachable", reason)
            if time.monotonic() >= next_log:
                log.error("%s; retrying with backoff (said again every %.0f s while it lasts)",
                          reason, DATABASE_WAIT_LOG_SECONDS, extra={"action": "db_unavailable"})
                next_log = time.monotonic() + DATABASE_WAIT_LOG_SECONDS
            if time.monotonic() > deadline:
                log.error("drain run gave up: PostgreSQL stayed unreachable for %.0f s", limit)
                return False
            _sleep(backoff.next(), health, received)
    return False


def _sleep(seconds: float, health: Any, received: list[int]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not received:
        health.tick()  # waiting for the database is not being stuck
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))
