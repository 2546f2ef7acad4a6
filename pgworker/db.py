"""Opening connections, with errors that name the fix and never show a password."""

from __future__ import annotations

import logging
import re
import time
import weakref
from typing import Any

import psycopg

from .errors import ConfigError, DatabaseReadOnly, DatabaseRefused, DatabaseUnavailable
from .names import dsn_password, one_line, redact, redact_dsn

log = logging.getLogger("pgworker.db")

CONNECT_TIMEOUT_SECONDS = 10
# Notice a dead server or a dropped network path within about a minute instead of the
# kernel default of two hours (libpq keepalive parameters, PostgreSQL docs 34.1.2).
KEEPALIVE_KWARGS: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30,
                                    "keepalives_interval": 10, "keepalives_count": 3}


def check_dsn(dsn: str | None) -> str:
    """Return ``dsn`` if libpq can parse it; raise :class:`ConfigError` (password hidden)."""
    if dsn is None:
        raise ConfigError("no database configured: set PGWORKER_DSN (or --dsn, or App(dsn=...) in Python) to "
                          "a libpq connection string such as postgresql://user@localhost:5432/app")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(malformed_dsn(dsn, exc)) from None
    return dsn


def malformed_dsn(dsn: str, exc: Exception) -> str:
    """The one-line message for a DSN libpq cannot parse: the DSN with only its password
    masked (one without a password whole), what is wrong (libpq's words, which quote the
    DSN: masked the same way), and the two forms to use."""
    shown, password = redact_dsn(dsn), dsn_password(dsn)
    said = " ".join(str(exc).split()).replace(dsn, shown)  # libpq's message ends in a newline
    said = redact(said, password)
    head = dsn.lstrip().lower()
    driver = re.match(r"(postgres(?:ql)?)\+(\w+)://", head)
    if driver:  # SQLAlchemy's URL: libpq knows no driver suffix
        return (f"malformed DSN {shown!r}: '{driver.group(1)}+{driver.group(2)}://' is SQLAlchemy's URL form; "
                f"libpq's has no driver suffix: drop '+{driver.group(2)}' ({driver.group(1)}://...)")
    if "=" not in dsn and not head.startswith(("postgresql://", "postgres://")):
        # libpq read it as key=value pairs, found none, and says only 'missing "="'
        why = (("a URI starts postgresql:// or postgres:// (two slashes)"
                if head.startswith(("postgresql:", "postgres:")) else
                "it is neither a URI (postgresql://...) nor key=value pairs")
               + f", so libpq read it as key=value pairs: {said}")
    else:
        why = said
    return (f"malformed DSN {shown!r}: {why}; use a URI like postgresql://user@host:5432/db "
            "(the password after user:, or in PGPASSWORD) or key=value pairs like "
            "'host=localhost port=5432 dbname=app user=app'")


def connect_failure(dsn: str | None, exc: Exception) -> DatabaseUnavailable:
    """The error for a connection attempt that failed (sync or async, the same words):
    :class:`DatabaseRefused` with its fix first when the server answered and refused (no
    such database or role, a password, pg_hba.conf), else :class:`DatabaseUnavailable`;
    the DSN's password redacted, libpq's lines joined into one."""
    # one line: libpq's message spans several, and a log line or describe_failure keeps the first
    text = one_line(redact(str(exc).strip(), dsn_password(dsn), dsn))
    refused = refusal_fix(text)
    if refused:
        # the fix first: a log line or /readyz may cut the server's long text
        return DatabaseRefused(f"PostgreSQL at {redact_dsn(dsn)!r} refused the connection ({refused}): {text}")
    return DatabaseUnavailable(
        f"cannot connect to PostgreSQL at {redact_dsn(dsn)!r}: "
        f"{text}; check the DSN (--dsn or PGWORKER_DSN) and that the "
        "server is running and reachable")


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
        raise connect_failure(dsn, exc) from None
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid connection settings for {redact_dsn(dsn)!r}: "
                          f"{redact(str(exc), dsn_password(dsn), dsn)}") from None
    if detect_pooler(conn) and prepare:
        _warn_pooler_once()
    if not prepare or conn in POOLED:
        conn.prepare_threshold = None
    return conn


# The server's refusals that no retry with the same DSN can change, and the fix each
# names. libpq reports a connection's FATAL error as text, without its SQLSTATE (3D000,
# 28000, 28P01), so the (English) message is matched; a server sending its messages in
# another language is retried as an unreachable one.
_REFUSALS = (
    # greedy: a name may hold a double quote (the server does not escape it)
    (re.compile(r'FATAL:\s+database ".*" does not exist'),
     "create that database (createdb, or CREATE DATABASE) or fix the database name in the DSN"),
    (re.compile(r'FATAL:\s+role ".*" does not exist'),
     "create that role or fix the user name in the DSN"),
    (re.compile(r"password authentication failed|authentication failed for user|no pg_hba\.conf entry"),
     "fix the user or password in the DSN, or the server's pg_hba.conf"),
)


def refusal_fix(message: str) -> str | None:
    """The fix for a connection the server refused for good (see _REFUSALS), else None."""
    for pattern, fix in _REFUSALS:
        if pattern.search(message):
            return fix
    return None


# Connections found to go through a pooler (see detect_pooler).
POOLED: "weakref.WeakSet[psycopg.Connection]" = weakref.WeakSet()
_pooler_warned = False


def detect_pooler(conn: psycopg.Connection) -> bool:
    """True when a connection pooler sits between this connection and PostgreSQL.

    The process id libpq received at connect time (BackendKeyData) is the server
    process's own on a direct connection; pgbouncer hands out cancel keys of its own, so
    it differs from ``pg_backend_pid()``. Costs one round trip; the result is remembered
    in :data:`POOLED`. On a connection outside autocommit the check is rolled back.
    """
    try:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        if not conn.autocommit:
            conn.rollback()
    except psycopg.Error:
        return False
    pooled = pid != conn.info.backend_pid
    if pooled:
        POOLED.add(conn)
    return pooled


def _warn_pooler_once() -> None:
    global _pooler_warned
    if not _pooler_warned:
        _pooler_warned = True
        log.warning("connected through a connection pooler (pgbouncer?): server-side prepared statements "
                    "are off on such connections, as a transaction-mode pooler would lose them; set "
                    "PGWORKER_PREPARED_STATEMENTS=false (--no-prepared-statements) to say so explicitly",
                    extra={"action": "pooler_detected"})


# SQLSTATEs a transaction-mode pooler causes when psycopg prepares statements: the
# statement was prepared on another server connection (26000 invalid_sql_statement_name)
# or this one already has it (42P05 duplicate_prepared_statement).
PREPARED_STATEMENT_SQLSTATES = ("26000", "42P05")
READ_ONLY_SQLSTATE = "25006"
# feature_not_supported: what PostgreSQL raises when a prepared statement's result type
# changed under it ("cached plan must not change result type": a migration altered a
# column it returns, e.g. 0015's domains) and at every later execution on that session;
# psycopg keeps re-using the statement. pgworker's own statements raise it for nothing
# else, and a new connection prepares them anew (the break-it trial of 0015: a running
# old worker's every claim failed until it was restarted).
STALE_PLAN_SQLSTATE = "0A000"
STALE_PLAN_HINT = ("the schema changed under a prepared statement of this connection (a migration altered "
                   "a column it returns): nothing was written; pgworker replaces its own connections, so "
                   "retry the call (a connection of yours needs DEALLOCATE ALL or a reconnect)")

POOLER_PREPARED_HINT = (
    "a transaction-mode pooler (pgbouncer before 1.21) runs each transaction on any server "
    "connection, so server-side prepared statements go missing: set "
    "PGWORKER_PREPARED_STATEMENTS=false (pgworker run --no-prepared-statements)")
READ_ONLY_HINT = ("the server is read-only (a standby after a failover, or default_transaction_read_only "
                  "is on): waiting for a writable primary; point PGWORKER_DSN at the primary")


# Statements a live server refused for a reason of their own (psycopg classes these as
# OperationalError too): the connection still works, so they are not an outage.
STATEMENT_SQLSTATES = {"55P03": "lock timeout", "57014": "statement timeout or cancel", "40P01": "deadlock",
                       "40001": "serialization failure"}
# The server ending the session: admin_shutdown, crash_shutdown, cannot_connect_now.
SERVER_GONE_SQLSTATES = ("57P01", "57P02", "57P03")


def failure_kind(exc: BaseException) -> str:
    """'read-only', 'prepared-statements' (a pooler), 'stale-plan' (a migration changed what
    a prepared statement returns: :data:`STALE_PLAN_SQLSTATE`), 'unreachable' or 'statement'.

    By SQLSTATE where the server sent one (PostgreSQL docs, Appendix A): class 08
    (connection exception) and 57P01-57P03 (the server shutting down or starting) are
    'unreachable'; any other (a lock or statement timeout, a deadlock, a serialization
    failure, a data error) is 'statement': the server answered. Without one, a
    connection that failed (OperationalError, InterfaceError, DatabaseUnavailable) is
    'unreachable'."""
    state = getattr(exc, "sqlstate", None)
    if isinstance(exc, DatabaseReadOnly) or state == READ_ONLY_SQLSTATE:
        return "read-only"
    if state in PREPARED_STATEMENT_SQLSTATES:
        return "prepared-statements"
    if state == STALE_PLAN_SQLSTATE:
        return "stale-plan"
    if isinstance(exc, DatabaseUnavailable):
        return "unreachable"
    if isinstance(state, str):
        return "unreachable" if state.startswith("08") or state in SERVER_GONE_SQLSTATES else "statement"
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return "unreachable"
    return "statement"


#: The longest failure text describe_failure returns, in characters.
DESCRIBED_MAX_CHARS = 800


def describe_failure(exc: BaseException, dsn: str | None = None) -> str:
    """One line saying what went wrong with the database and what to do, password-free:
    e.g. "PostgreSQL is unreachable (OperationalError: ...)", "statement failed (lock
    timeout: canceling statement due to lock timeout)"."""
    kind = failure_kind(exc)
    if kind == "read-only":
        return READ_ONLY_HINT
    if kind == "prepared-statements":
        return f"prepared statement error ({getattr(exc, 'sqlstate', '')}): {POOLER_PREPARED_HINT}"
    if kind == "stale-plan":
        return f"{STALE_PLAN_HINT} ({(str(exc).strip().splitlines() or ['0A000'])[0][:200]})"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    # the password, not the whole DSN; a connection's message (the DSN, libpq's text, the
    # fix) is one line of a few hundred characters: bounded, not cut mid-fix
    text = redact(first, dsn_password(dsn))[:DESCRIBED_MAX_CHARS]
    if isinstance(exc, DatabaseUnavailable):
        return text
    if kind == "unreachable":
        return f"PostgreSQL is unreachable ({type(exc).__name__}: {text})"
    reason = STATEMENT_SQLSTATES.get(getattr(exc, "sqlstate", None) or "", type(exc).__name__)
    return f"statement failed ({reason}: {text})"


class OutageLog:
    """Reports a database outage once, not once per retry.

    ``failed(exc)`` logs the first failure of an outage (and any change of its kind:
    unreachable, read-only, statement, ...) at ERROR with a reason naming the fix; repeats
    go to DEBUG. ``ok()`` logs the recovery once, with the outage's length in seconds:
    "database back" after an outage, "statements succeed again" after statements the
    server refused (a lock timeout is no outage). One per component (a claimer, the
    listener, the renewer, the maintenance thread).
    """

    def __init__(self, logger: logging.Logger, component: str, dsn: str | None = None) -> None:
        self.log = logger
        self.component = component
        self.dsn = dsn
        self.since: float | None = None
        self.kind: str | None = None
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException, action: str = "") -> str:
        """Record a failure; returns its kind (see :func:`failure_kind`)."""
        kind = failure_kind(exc)
        what = f" ({action})" if action else ""
        self.failures += 1
        if self.since is None or kind != self.kind:
            self.log.error("%s%s: %s; retrying with backoff (logged once per outage)", self.component, what,
                           describe_failure(exc, self.dsn), extra={"action": "db_unavailable"})
            if self.since is None:
                self.since = time.monotonic()
            self.kind = kind
        else:
            self.log.debug("%s%s: still failing: %s", self.component, what, type(exc).__name__)
        return kind

    def ok(self) -> None:
        if self.since is not None:
            what = "statements succeed again" if self.kind == "statement" else "database back"
            self.log.warning("%s: %s after %.1f s (%s failed attempts)", self.component, what,
                             time.monotonic() - self.since, self.failures, extra={"action": "db_recovered"})
            self.since = None
            self.kind = None
            self.failures = 0


def close_quietly(conn: psycopg.Connection | None) -> None:
    """Close a connection that may be broken already (its errors say nothing new)."""
    if conn is not None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


def connection_lost(exc: BaseException, conn: "psycopg.Connection | None") -> bool:
    """True when ``exc`` means the connection is gone (reconnect), False when only the
    statement failed and the connection still works (a data error, a timeout, a lock
    not granted, a read-only server).

    psycopg classes some statement errors as OperationalError (SQLSTATE classes 55 and
    57: ``lock_timeout``, ``statement_timeout``), so the class alone does not tell; the
    connection's own state and the presence of a SQLSTATE (sent by a live server) do.
    """
    if conn is None or conn.closed or conn.broken:
        return True
    if isinstance(exc, (DatabaseUnavailable, psycopg.InterfaceError)):
        return True
    return isinstance(exc, psycopg.OperationalError) and getattr(exc, "sqlstate", None) is None


def sqlstate_class(exc: BaseException) -> str:
    """The two-character class of the exception's SQLSTATE ('22' data exception, '23'
    integrity constraint violation, ...; PostgreSQL docs, Appendix A), '' without one."""
    state = getattr(exc, "sqlstate", None)
    return state[:2] if isinstance(state, str) else ""


TCP_KEEPALIVE_MAX = 32767  # seconds: the kernel's bound on TCP_KEEPIDLE and TCP_KEEPINTVL


def worker_params(lease_seconds: float) -> dict[str, Any]:
    """libpq parameters that bound how long a worker connection can hang on a dead peer,
    derived from the lease (PostgreSQL docs 34.1.2, "Parameter Key Words"):

    - TCP keepalives probe an idle connection after a quarter of a lease and give up
      after three unanswered probes a twelfth of a lease apart (half a lease in all);
    - ``tcp_user_timeout`` drops a connection whose sent data stays unacknowledged for
      half a lease (a network path that drops packets).

    A path that acknowledges and then stalls (a proxy that stops forwarding) is not seen
    by either: the lease clock (pgworker.worker.lease) never waits on the database for
    that reason, and the renewer gives up on a statement that takes longer than a
    renewal interval.
    """
    # Linux refuses TCP_KEEPIDLE and TCP_KEEPINTVL above 32767 s (tcp(7)), and every
    # connect would then fail with "setsockopt(TCP_KEEPIDLE) failed": a lease of days
    # gets the longest probes the kernel takes; tcp_user_timeout is an int of ms.
    return {"keepalives": 1, "keepalives_idle": min(TCP_KEEPALIVE_MAX, max(1, int(lease_seconds / 4))),
            "keepalives_interval": min(TCP_KEEPALIVE_MAX, max(1, int(lease_seconds / 12))), "keepalives_count": 3,
            "tcp_user_timeout": min(2_147_483_647, max(1000, int(lease_seconds * 500)))}


_timeouts_warned = False


def milliseconds(seconds: float) -> str:
    """A timeout setting's value for ``set_config``: whole milliseconds, at least 1 (0 is
    PostgreSQL's "no timeout": ``int(0.0004 * 1000)`` once turned a 0.4 ms bound off)."""
    return f"{max(1, int(seconds * 1000))}ms"


def set_session_timeouts(conn: psycopg.Connection, *, statement_timeout: float, lock_timeout: float) -> None:
    """Bound every statement of this session (``statement_timeout``) and every lock wait
    (``lock_timeout``), in seconds (PostgreSQL docs 20.11.1). Session settings are lost
    behind a transaction-mode pooler, so there they are left to the role (``ALTER ROLE
    ... SET statement_timeout = ...``), said once in the log."""
    global _timeouts_warned
    if conn in POOLED:
        if not _timeouts_warned:
            _timeouts_warned = True
            log.warning("behind a connection pooler, session settings do not stick: set statement_timeout "
                        "and lock_timeout on the worker's role (ALTER ROLE ... SET statement_timeout = '30s'; "
                        "ALTER ROLE ... SET lock_timeout = '5s')", extra={"action": "pooler_timeouts"})
        return
    conn.execute("SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
                 [milliseconds(statement_timeout), milliseconds(lock_timeout)])


def read_timestamps_in_utc(conn: psycopg.Connection) -> bool:
    """Make this session send timestamps in UTC (``TimeZone = 'UTC'``); returns whether it
    was set. psycopg loads a ``timestamptz`` in the session's zone: for a zone name such as
    the default 'Etc/UTC' that is a ``ZoneInfo`` conversion, 0.8 µs a value, where 'UTC'
    is its fixed fast path (0.3 µs); a claim's row carries five (issue 23: 2.5 µs a job in
    the claimer). The instants are the same; the ``datetime``s a claim returns are UTC.
    No statement of the claimer's depends on the session's zone (no date_trunc, ::date or
    day intervals). Not set behind a transaction pooler (a session setting does not
    stick, and would reach other clients' sessions)."""
    if conn in POOLED:
        return False
    conn.execute("SELECT set_config('TimeZone', 'UTC', false)")
    return True


def use_generic_plans(conn: psycopg.Connection) -> bool:
    """Make this session run its prepared statements on their generic plans
    (``plan_cache_mode = force_generic_plan``); returns whether it was set. For a
    claimer's connection: its statements are written for a generic plan (arrays for id
    lists, LIMITs the planner cannot read), and left to choose (``auto``), PostgreSQL
    replans the claim at every call whenever the generic plan, costed again after an
    ANALYZE or VACUUM on a table that has grown since, estimates more than the average of
    the custom plans it made when the statement was new: in drains of 100,000 jobs, 1,261
    of 1,433 claims were planned anew (about 1.3 ms of planning each on a quiet machine;
    docs/benchmarks.md). Not set without prepared statements (every statement is
    planned anyway) or behind a transaction pooler (a session setting does not stick)."""
    if conn in POOLED or conn.prepare_threshold is None:
        return False
    conn.execute("SELECT set_config('plan_cache_mode', 'force_generic_plan', false)")
    return True


def worker_connection(settings: Any, application_name: str) -> psycopg.Connection:
    """A worker's autocommit connection (a pod service's, a handler's transaction): the
    lease-derived network bounds of :func:`worker_params`, the session's statement and
    lock timeouts (``settings``: a :class:`pgworker.Settings`), prepared statements as set.
    Raises what :func:`connect` raises; nothing is left open on a failure."""
    conn = connect(settings.dsn, application_name=application_name, prepare=settings.prepared_statements,
                   **worker_params(settings.lease_seconds))
    try:
        set_session_timeouts(conn, statement_timeout=settings.statement_timeout_seconds,
                             lock_timeout=settings.lock_timeout_seconds)
    except BaseException:
        conn.close()
        raise
    return conn
