"""Enqueue inside a SQLAlchemy transaction: the psycopg connection under a SQLAlchemy
``Connection``/``Session`` (sync) or ``AsyncConnection``/``AsyncSession`` (asyncio), to
pass as ``conn=`` so that the job commits or rolls back with the ORM's work::

    with Session(engine) as session, session.begin():
        session.add(Order(item="book"))
        app.enqueue("ship_order", {"item": "book"}, conn=psycopg_connection(session))

    async with AsyncSession(async_engine) as session, session.begin():
        session.add(Order(item="book"))
        await app.aenqueue("ship_order", {...}, conn=await async_psycopg_connection(session))

The engine must use the psycopg (3) driver: ``postgresql+psycopg://...`` (its async form
is the same URL with ``create_async_engine``). SQLAlchemy is not a dependency of
pgworker: it is imported by the caller.
"""

from __future__ import annotations

from typing import Any

import psycopg


_ASYNC_KINDS = {"AsyncSession", "AsyncConnection", "async_scoped_session"}
_ENGINE_KINDS = {"Engine", "AsyncEngine"}


def _kinds(obj: Any) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def _not_a_connectable(obj: Any, wanted: str) -> TypeError:
    kinds = _kinds(obj)
    if "AsyncEngine" in kinds:
        return TypeError("an AsyncEngine holds no transaction to join: pass an AsyncSession or AsyncConnection "
                         "inside the transaction (`async with engine.begin() as conn:` ... "
                         "`conn=await async_psycopg_connection(conn)`, or an AsyncSession's)")
    if kinds & _ENGINE_KINDS:
        return TypeError("an Engine holds no transaction to join: pass a Session or Connection inside the "
                         "transaction (`with engine.begin() as conn:` ... `conn=psycopg_connection(conn)`, "
                         "or a Session's)")
    return TypeError(f"pass a SQLAlchemy {wanted} (inside its transaction), not a "
                     f"{type(obj).__module__}.{type(obj).__name__}")


def psycopg_connection(connectable: Any) -> psycopg.Connection:
    """The ``psycopg.Connection`` under a SQLAlchemy ``Session`` or ``Connection``,
    inside the transaction they have begun (a Session begins one if none is open).
    Raises TypeError naming the fix for another driver (psycopg2, asyncpg), an async
    object (``AsyncSession``: use :func:`async_psycopg_connection`), an ``Engine`` (it holds
    no transaction) or anything else."""
    if _kinds(connectable) & _ASYNC_KINDS:
        raise TypeError("this is an asyncio SQLAlchemy object: use `await async_psycopg_connection(...)` "
                        "and `await app.aenqueue(...)`")
    try:
        sa_conn = connectable.connection() if callable(getattr(connectable, "connection", None)) else connectable
        raw = sa_conn.connection.driver_connection  # Connection -> pool's proxy -> the DBAPI connection
    except AttributeError:
        raise _not_a_connectable(connectable, "Session or Connection") from None
    if isinstance(raw, psycopg.AsyncConnection):
        raise TypeError("this is an asyncio SQLAlchemy connection: use await async_psycopg_connection(...) "
                        "and app.aenqueue")
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"the SQLAlchemy engine's driver connection is a {type(raw).__module__}."
                        f"{type(raw).__name__}, not psycopg's: use a postgresql+psycopg:// URL")
    return raw


async def async_psycopg_connection(connectable: Any) -> psycopg.AsyncConnection:
    """The ``psycopg.AsyncConnection`` under a SQLAlchemy ``AsyncSession`` or
    ``AsyncConnection``, inside their transaction. Raises TypeError naming the fix for
    another driver, a sync object (use :func:`psycopg_connection`), an engine or anything
    else."""
    if not _kinds(connectable) & _ASYNC_KINDS:
        if _kinds(connectable) & {"Session", "Connection", "scoped_session"}:
            raise TypeError("this is a synchronous SQLAlchemy object: use `psycopg_connection(...)` (no await) "
                            "and `app.enqueue(...)`")
        raise _not_a_connectable(connectable, "AsyncSession or AsyncConnection")
    if "async_scoped_session" in _kinds(connectable):
        connectable = connectable()  # the registry's AsyncSession of the current scope
    sa_conn = await connectable.connection() if hasattr(connectable, "sync_session") else connectable
    fairy = await sa_conn.get_raw_connection()
    raw = fairy.driver_connection
    if not isinstance(raw, psycopg.AsyncConnection):
        raise TypeError(f"the SQLAlchemy engine's driver connection is a {type(raw).__module__}."
                        f"{type(raw).__name__}, not psycopg's AsyncConnection: use a postgresql+psycopg:// "
                        "URL with create_async_engine")
    return raw
