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


def psycopg_connection(connectable: Any) -> psycopg.Connection:
    """The ``psycopg.Connection`` under a SQLAlchemy ``Session`` or ``Connection``,
    inside the transaction they have begun (a Session begins one if none is open).
    Raises TypeError for another driver (psycopg2, asyncpg) or an async object."""
    sa_conn = connectable.connection() if callable(getattr(connectable, "connection", None)) else connectable
    raw = sa_conn.connection.driver_connection  # Connection -> pool's proxy -> the DBAPI connection
    if isinstance(raw, psycopg.AsyncConnection):
        raise TypeError("this is an asyncio SQLAlchemy connection: use await async_psycopg_connection(...) "
                        "and app.aenqueue")
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"the SQLAlchemy engine's driver connection is a {type(raw).__module__}."
                        f"{type(raw).__name__}, not psycopg's: use a postgresql+psycopg:// URL")
    return raw


async def async_psycopg_connection(connectable: Any) -> psycopg.AsyncConnection:
    """The ``psycopg.AsyncConnection`` under a SQLAlchemy ``AsyncSession`` or
    ``AsyncConnection``, inside their transaction. Raises TypeError for another driver."""
    sa_conn = await connectable.connection() if hasattr(connectable, "sync_session") else connectable
    fairy = await sa_conn.get_raw_connection()
    raw = fairy.driver_connection
    if not isinstance(raw, psycopg.AsyncConnection):
        raise TypeError(f"the SQLAlchemy engine's driver connection is a {type(raw).__module__}."
                        f"{type(raw).__name__}, not psycopg's AsyncConnection: use a postgresql+psycopg:// "
                        "URL with create_async_engine")
    return raw
