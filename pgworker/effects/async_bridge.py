"""Run pgworker's synchronous store statements on a handler's async connection.

``ctx.atransaction()`` must write the job's success with the one success statement every
runner uses (``Store.complete``), on the async connection whose transaction holds the
handler's writes. The store is synchronous; this bridge gives it that connection: the
store call runs in a worker thread, and each statement it sends is executed on the
handler's event loop (``run_coroutine_threadsafe``), its rows read there and handed back.
The store sees a connection already in a transaction (``autocommit`` False), so its
multi-statement transitions join the handler's transaction instead of opening their own.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

import psycopg


class _Rows:
    """What the store reads of a cursor: its rows and their description."""

    __slots__ = ("rows", "description")

    def __init__(self, rows: Sequence[Any], description: Any) -> None:
        self.rows = list(rows)
        self.description = description

    def fetchall(self) -> list[Any]:
        return self.rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None


class SyncOverAsync:
    """A connection for the store's statements, executed on ``aconn`` in ``loop``."""

    autocommit = False  # the handler's transaction is open: statements join it

    def __init__(self, aconn: psycopg.AsyncConnection, loop: asyncio.AbstractEventLoop) -> None:
        self.aconn = aconn
        self.loop = loop

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None) -> _Rows:
        async def run() -> _Rows:
            cur = await self.aconn.execute(query, params, prepare=prepare)
            rows = await cur.fetchall() if cur.description is not None else []
            return _Rows(rows, cur.description)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def cursor(self, row_factory: Any = None) -> "_Cursor":
        """A cursor for the statement plans (:mod:`pgworker.store.plan`), which read rows
        through ``conn.cursor()``; ``row_factory`` as psycopg's."""
        return _Cursor(self, row_factory)


class _Cursor:
    """The part of a psycopg cursor the store uses: execute, then fetch; a context manager."""

    def __init__(self, bridge: SyncOverAsync, row_factory: Any) -> None:
        self.bridge = bridge
        self.row_factory = row_factory
        self.result: _Rows = _Rows([], None)

    def __enter__(self) -> "_Cursor":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def description(self) -> Any:
        return self.result.description

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None) -> "_Cursor":
        aconn, factory = self.bridge.aconn, self.row_factory

        async def run() -> _Rows:
            cur = aconn.cursor(row_factory=factory) if factory is not None else aconn.cursor()
            async with cur:
                await cur.execute(query, params, prepare=prepare)
                rows = await cur.fetchall() if cur.description is not None else []
                return _Rows(rows, cur.description)

        self.result = asyncio.run_coroutine_threadsafe(run(), self.bridge.loop).result()
        return self

    def fetchall(self) -> list[Any]:
        return self.result.fetchall()

    def fetchone(self) -> Any:
        return self.result.fetchone()


async def run_sync(aconn: psycopg.AsyncConnection, call: Callable[[Any], Any]) -> Any:
    """``call(conn)`` in a worker thread, its statements on ``aconn`` in this loop."""
    bridge = SyncOverAsync(aconn, asyncio.get_running_loop())
    return await asyncio.to_thread(call, bridge)
