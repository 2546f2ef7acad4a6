"""Opening connections, with errors that name the fix and never show a password."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from .errors import ConfigError, DatabaseUnavailable
from .names import dsn_password, redact, redact_dsn

log = logging.getLogger("pgworker.db")

CONNECT_TIMEOUT_SECONDS = 10
# Notice a dead server or a dropped network path within about a minute instead of the
# kernel default of two hours (libpq keepalive parameters, PostgreSQL docs 34.1.2).
KEEPALIVE_KWARGS: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30,
                                    "keepalives_interval": 10, "keepalives_count": 3}


def check_dsn(dsn: str | None) -> str:
    """Return ``dsn`` if libpq can parse it; raise :class:`ConfigError` (password hidden)."""
    if dsn is None:
        raise ConfigError("no database configured: set PGWORKER_DSN (or --dsn) to a libpq "
                          "connection string such as postgresql://user@localhost:5432/app")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"malformed DSN {redact_dsn(dsn)!r}: {redact(str(exc), dsn_password(dsn), dsn)}; "
            "use a libpq URL such as postgresql://user:password@host:5432/dbname "
            "or key=value pairs such as 'host=localhost dbname=app'") from None
    return dsn


def connect(dsn: str | None, *, application_name: str = "pgworker", autocommit: bool = True,
            prepare: bool = True, connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
            **kwargs: Any) -> psycopg.Connection:
    """Open a connection for pgworker's own statements.

    ``autocommit=True`` makes each statement its own short transaction (claims and
    outcomes commit at once). ``prepare=False`` turns server-side prepared statements off
    (needed behind pgbouncer < 1.21 in transaction mode). Raises :class:`ConfigError` for
    a malformed DSN and :class:`DatabaseUnavailable` when the server cannot be reached;
    neither message contains the password.
    """
    check_dsn(dsn)
    params = {**KEEPALIVE_KWARGS, "application_name": application_name,
              "connect_timeout": max(1, int(connect_timeout)), **kwargs}
    try:
        conn = psycopg.connect(dsn, autocommit=autocommit, **params)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)!r}: "
            f"{redact(str(exc).strip(), dsn_password(dsn), dsn)}; check PGWORKER_DSN and that the "
            "server is running and reachable") from None
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid connection settings for {redact_dsn(dsn)!r}: "
                          f"{redact(str(exc), dsn_password(dsn), dsn)}") from None
    if not prepare:
        conn.prepare_threshold = None
    return conn


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the connection (not the statement) failed: reconnect."""
    if isinstance(exc, (DatabaseUnavailable, psycopg.OperationalError, psycopg.InterfaceError)):
        return True
    return False
