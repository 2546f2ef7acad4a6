"""The App's client connections: a pool of autocommit connections, checked before use
after idling, and pgworker's own errors for what goes wrong while one is in use."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import inspect
import logging
import os
import re
import time
from typing import Any, Iterator

import psycopg
from psycopg.types.json import set_json_loads

from . import db
from .config import Settings
from .errors import ConfigError, DatabaseBusy, DatabaseReadOnly, DatabaseUnavailable, PoolerError, SchemaNotMigrated
from .jobs import safe_json_loads
from .names import dsn_password, redact
from .privileges import PermissionDenied

log = logging.getLogger("pgworker")

POOL_MAX_SIZE = 4
# A pooled connection idle for longer than this is checked before use, so a server
# restart costs a reconnect rather than a failed enqueue.
POOL_CHECK_IDLE_SECONDS = 1.0


def open_pool(s: Settings, name: str) -> Any:
    """An open pool for the App called ``name``; raises :class:`DatabaseUnavailable` when
    the server cannot be reached."""
    from psycopg_pool import ConnectionPool

    # the DSN's form is checked by the probe's db.connect below, before anything is opened

    def configure(conn: psycopg.Connection) -> None:
        pooled = db.detect_pooler(conn)
        # behind a transaction-mode pooler, prepared statements would go missing
        if pooled or not s.prepared_statements:
            conn.prepare_threshold = None
        if not pooled:
            bound_lock_waits(conn, s.lock_timeout_seconds)
        else:
            pooled_lock_waits_note()
        # a JSON value Python cannot decode (written by hand) is shown, not a failed read
        set_json_loads(safe_json_loads, conn)

    def check(conn: psycopg.Connection) -> None:
        last = getattr(conn, "_pgworker_returned_at", 0.0)
        if time.monotonic() - last > POOL_CHECK_IDLE_SECONDS:
            ConnectionPool.check_connection(conn)

    # Fail fast with a clear message when the server is unreachable (the pool
    # itself would keep retrying until its timeout).
    db.connect(s.dsn, application_name=f"{name}:client").close()
    pool = ConnectionPool(
        conninfo=s.dsn or "", min_size=1, max_size=POOL_MAX_SIZE, open=False,
        name=f"pgworker-{os.getpid()}", configure=configure, check=check,
        kwargs={"autocommit": True, "application_name": f"{name}:client",
                "connect_timeout": db.CONNECT_TIMEOUT_SECONDS, **db.KEEPALIVE_KWARGS})
    try:
        pool.open(wait=True, timeout=db.CONNECT_TIMEOUT_SECONDS + 5)
    except Exception as exc:
        pool.close()
        raise unreachable(s, exc) from None
    return pool


LOCK_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s, false)"  # the sync and the async pools'


def bound_lock_waits(conn: psycopg.Connection, lock_timeout_seconds: float) -> None:
    """Set the session's ``lock_timeout`` (PGWORKER_LOCK_TIMEOUT_SECONDS, 5 s by default)
    on an App's pooled connection: a producer's call, an operator
    command or a console page behind a lock it cannot get (a migration's, a ``VACUUM
    FULL``'s, a forgotten ``LOCK TABLE``) raises :class:`DatabaseBusy` naming the fix,
    instead of hanging with no word (``pgworker jobs list`` once did)."""
    conn.execute(LOCK_TIMEOUT_SQL, [db.milliseconds(lock_timeout_seconds)])


_POOLED_NOTED: list[bool] = []


def pooled_lock_waits_note() -> None:
    """Say once per process that behind a transaction pooler the App's lock waits are the
    role's to bound (a session's lock_timeout would not stick, or would leak into other
    clients' transactions)."""
    if not _POOLED_NOTED:
        _POOLED_NOTED.append(True)
        log.warning("behind a connection pooler, the App's calls wait for locks as long as the role's "
                    "lock_timeout allows (a session setting would not stick): set it on the role, e.g. "
                    "ALTER ROLE ... SET lock_timeout = '5s'", extra={"action": "pooler_lock_timeout"})


@contextlib.contextmanager
def borrow(pool: Any) -> Iterator[psycopg.Connection]:
    """A connection of ``pool`` (from :func:`open_pool`), handed back when done."""
    with pool.connection() as pooled:
        try:
            yield pooled
        except psycopg.Error as exc:
            discard_if_stale(pooled, exc)
            raise
        finally:
            # When it was last used, for the check before its next use. Set here
            # rather than in a pool `reset` callback: with one, psycopg_pool hands
            # every returned connection to a worker thread, and the next enqueue
            # waits for that thread (about 100 us a call).
            pooled._pgworker_returned_at = time.monotonic()  # type: ignore[attr-defined]


def discard_if_stale(pooled: Any, exc: BaseException) -> None:
    """Close a pooled connection (sync or async: closing is immediate for both) whose
    prepared statement a migration made stale (:data:`pgworker.db.STALE_PLAN_SQLSTATE`),
    so the pool replaces it: psycopg would re-use the statement, and the server refuse it
    at every call on that session."""
    if db.failure_kind(exc) == "stale-plan":
        pooled.pgconn.finish()  # what close() does, without awaiting (an async connection's close is a coroutine)


def require_sync(conn: object, async_call: str | None) -> None:
    """Raise TypeError when ``conn`` is a ``psycopg.AsyncConnection`` given to a sync call,
    naming the coroutine to await instead (``async_call``, e.g.
    'aenqueue'), where otherwise psycopg would fail later with "'coroutine' object has no
    attribute 'fetchone'" and a never-awaited coroutine."""
    if isinstance(conn, psycopg.AsyncConnection):
        fix = (f"await app.{async_call}(..., conn=conn)" if async_call
               else "the call's async form, its name prefixed with 'a' (app.result -> await app.aresult, "
                    "app.enqueue -> await app.aenqueue)")
        raise TypeError(f"conn is a psycopg.AsyncConnection, but this call is synchronous: use {fix}")
    _require_psycopg(conn, "psycopg_connection(session)")


def require_async(conn: object, sync_call: str) -> None:
    """Raise TypeError when ``conn`` is a sync ``psycopg.Connection`` given to a coroutine,
    naming the plain call to use instead (``sync_call``, e.g. 'enqueue')."""
    if isinstance(conn, psycopg.Connection):
        raise TypeError(f"conn is a synchronous psycopg.Connection, but this call is a coroutine: use "
                        f"app.{sync_call}(..., conn=conn) (no await), or pass a psycopg.AsyncConnection")
    _require_psycopg(conn, "await async_psycopg_connection(session)")


def _require_psycopg(conn: object, sqlalchemy_fix: str) -> None:
    """TypeError for anything but a psycopg connection (or None), where psycopg would fail
    later with "'coroutine' object has no attribute 'cursor'", naming the fix for the
    usual mistakes: a coroutine or a task (a forgotten await), a SQLAlchemy object
    (``sqlalchemy_fix``: the unwrapping call), a Django one, a pool, a cursor, a DSN."""
    if conn is None or isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        return
    if inspect.iscoroutine(conn):
        conn.close()  # never awaited: no "was never awaited" warning on top of this error
        raise TypeError("conn is a coroutine: a call to await was not awaited (conn=await ...)")
    module = type(conn).__module__ or ""
    if module.startswith("sqlalchemy"):
        raise TypeError(f"conn is a SQLAlchemy {type(conn).__name__}: pass the psycopg connection under it, "
                        f"conn={sqlalchemy_fix} (pgworker.contrib.sqlalchemy)")
    if module.startswith("django"):
        raise TypeError(f"conn is a Django {type(conn).__name__}: pass pgworker.contrib.django.connection(), or "
                        "use pgworker.contrib.django.enqueue")
    if module.startswith("psycopg_pool"):
        raise TypeError(f"conn is a {type(conn).__name__}: pass one of its connections, inside its transaction "
                        "(`with pool.connection() as conn:`, `async with` for an async pool), or no conn= to use "
                        "the App's own pool")
    if isinstance(conn, (psycopg.Cursor, psycopg.AsyncCursor)):
        raise TypeError("conn is a psycopg cursor: pass its connection, conn=cur.connection")
    if isinstance(conn, (str, bytes)):
        raise TypeError("conn is a string: pass a psycopg connection (a DSN goes to App(dsn) or PGWORKER_DSN)")
    if isinstance(conn, asyncio.Future):
        raise TypeError(f"conn is an asyncio {type(conn).__name__}: await it, and pass what it returns")
    raise TypeError(f"conn must be a psycopg connection whose transaction the call joins (or left out: the "
                    f"App's pool), got a {module}.{type(conn).__name__}")


_ROLE_MISSING = re.compile(r'role ".*" does not exist$')


def _schema_not_migrated(settings: Settings, exc: psycopg.Error, *, look_around: bool) -> SchemaNotMigrated:
    found = pgworker_schemas_hint(settings) if look_around else ""
    return SchemaNotMigrated(
        f"pgworker's schema {settings.schema!r} is missing or incomplete ({exc.diag.message_primary}){found}: "
        f"if your jobs live in another schema, name it (--schema, PGWORKER_SCHEMA); otherwise run "
        f"`pgworker migrate` (or App.migrate()) with the same DSN and schema")


# The schemas a DSN's database holds, by DSN: (monotonic time read, names). A producer
# or a console page that keeps failing on a missing schema looks once a minute.
_SCHEMAS_SEEN: dict[str, tuple[float, list[str]]] = {}
SCHEMAS_SEEN_SECONDS = 60.0


def with_schema_hint(settings: Settings, exc: SchemaNotMigrated) -> SchemaNotMigrated:
    """``exc`` with the database's pgworker schemas named (:func:`pgworker_schemas_hint`)
    when no schema of that name exists; ``exc`` itself otherwise."""
    if not exc.absent:
        return exc
    hinted = SchemaNotMigrated(f"{exc}{pgworker_schemas_hint(settings)}")
    hinted.absent = True
    return hinted


def pgworker_schemas_hint(settings: Settings) -> str:
    """'; pgworker schemas in this database: 'a', 'b' (did you mean 'a'?)' for the error
    above (a schema named in another case, or with a typo), or '' when they cannot be
    read: a best-effort look on a connection of its own (the failed one may be in the
    caller's aborted transaction), bounded by a 3 s connect and statement timeout, and
    kept for a minute per DSN."""
    from . import sql as sqlfiles

    key = settings.dsn or ""
    seen = _SCHEMAS_SEEN.get(key)
    if seen is not None and time.monotonic() - seen[0] < SCHEMAS_SEEN_SECONDS:
        names = seen[1]
    else:
        try:
            with contextlib.closing(db.connect(settings.dsn, application_name="pgworker:hint", connect_timeout=3,
                                               prepare=settings.prepared_statements)) as conn:
                conn.execute("SET statement_timeout = 3000")
                query = sqlfiles.render(sqlfiles.query_templates()["pgworker_schemas"], settings.schema)
                names = [row[0] for row in conn.execute(query)]
        except Exception:  # noqa: BLE001 - a hint, never a second failure
            return ""
        _SCHEMAS_SEEN[key] = (time.monotonic(), names)
    if not names:
        return "; this database holds no pgworker schema"
    same = [n for n in names if n.lower() == settings.schema.lower()]
    close = same or difflib.get_close_matches(settings.schema, names, n=1, cutoff=0.6)
    listed = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
    return f"; pgworker schemas in this database: {listed}" + (f" (did you mean {close[0]!r}?)" if close else "")


#: What to do about a statement the server gave up on (DatabaseBusy), by SQLSTATE.
BUSY_HINTS = {
    "55P03": "another session holds a lock this statement needs (an open transaction, say 'idle in "
             "transaction' in pg_stat_activity); retry once it ends, end that session, or raise lock_timeout "
             "(PGWORKER_LOCK_TIMEOUT_SECONDS, or the role's setting)",
    "57014": "the statement ran past statement_timeout or was cancelled; retry, or raise statement_timeout "
             "(PGWORKER_STATEMENT_TIMEOUT_SECONDS, or the role's setting)",
    "40P01": "it lost a deadlock with another session; retry",
    "40001": "it lost a serialization conflict with another session; retry",
}


@contextlib.contextmanager
def database_errors(settings: Settings, *, look_around: bool = True) -> Iterator[None]:
    """Turn the database's failures inside the block into pgworker's errors: a missing
    schema, an unreachable or read-only server, a pooler without prepared statements, a
    statement the server gave up on (a lock or statement timeout, a deadlock: DatabaseBusy,
    never DatabaseUnavailable: the server is reachable). ``look_around``: a missing
    schema's error lists the database's pgworker schemas (a blocking connection: False
    from the async API, which never blocks its event loop)."""
    try:
        yield
    except psycopg.errors.UndefinedObject as exc:
        if _ROLE_MISSING.match(exc.diag.message_primary or ""):  # GRANT ... TO a role never created
            raise ConfigError(f"{exc.diag.message_primary}: create the role first (CREATE ROLE name LOGIN), "
                              "or name an existing one") from None
        raise _schema_not_migrated(settings, exc, look_around=look_around) from None
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName,
            psycopg.errors.UndefinedFunction) as exc:
        raise _schema_not_migrated(settings, exc, look_around=look_around) from None
    except psycopg.OperationalError as exc:
        if db.failure_kind(exc) == "statement" and exc.sqlstate in BUSY_HINTS:
            # the server answered: a timeout or a conflict is not an unreachable database
            raise DatabaseBusy(f"{db.describe_failure(exc, settings.dsn)}; nothing was written: "
                               f"{BUSY_HINTS[exc.sqlstate]}", exc.sqlstate) from None
        raise DatabaseUnavailable(
            f"database error: {redact(str(exc), dsn_password(settings.dsn), settings.dsn)}; "
            "the job state is unknown only if the failure came after the statement was sent") from None
    except psycopg.Error as exc:
        if exc.sqlstate == "42501" and not isinstance(exc, PermissionDenied):
            # pgworker's error, the fix in its message (a note's was lost by a log of str(exc)),
            # and still an InsufficientPrivilege for callers that catch psycopg's
            raise PermissionDenied.of(exc) from exc
        if db.failure_kind(exc) == "read-only":
            raise DatabaseReadOnly(
                "the server is read-only (a standby after a failover, or default_transaction_read_only "
                "is on): nothing was written; point PGWORKER_DSN at the writable primary") from exc
        if db.failure_kind(exc) == "prepared-statements":
            raise PoolerError(db.describe_failure(exc)) from exc
        if db.failure_kind(exc) == "stale-plan":
            raise DatabaseBusy(db.describe_failure(exc), exc.sqlstate) from exc
        raise


def unreachable(s: Settings, exc: Exception) -> DatabaseUnavailable:
    """The error for a server that cannot be reached or refused the connection, as the
    sync calls raise it (:func:`pgworker.db.connect_failure`: a refusal is
    :class:`DatabaseRefused` with its fix; the password redacted)."""
    return db.connect_failure(s.dsn, exc)
