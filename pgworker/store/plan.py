"""Statement plans: a store operation written once, as a generator that yields the
statements to run and receives their rows, driven on a ``psycopg.Connection`` by
:func:`run` or on a ``psycopg.AsyncConnection`` by :func:`arun`.

Why: the async producer API (:mod:`pgworker.aio`) must run exactly the statements,
parameters, retries and transaction boundaries of the sync one. Writing the logic once,
free of I/O, and keeping only the three ways a statement is executed (a query, a COPY, a
group of steps made atomic) per driver means the two cannot drift apart.

A plan yields :class:`Exec` (answered with the statement's rows as a list, ``[]`` for a
statement without a result set), :class:`Copy` (answered with None) or :class:`Atomic`
(answered with the inner plan's return value, run inside :func:`atomic`). A failure of a
step is thrown into the plan at its ``yield``, so ``with`` blocks around it (a tracing
span) see it, and an :class:`Atomic` group is rolled back before that.
"""

from __future__ import annotations

import contextlib
from typing import Any, Generator, Iterable, Mapping, NamedTuple, TypeVar, Union

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

T = TypeVar("T")


# Named tuples rather than frozen dataclasses: a step is built for every statement of
# every enqueue, and a named tuple costs a fraction of a frozen dataclass to make.
class Exec(NamedTuple):
    """Run ``query`` with ``params``; the answer is every row (tuples, or dicts when
    ``dict_rows``)."""

    query: str
    params: Mapping[str, Any] | None = None
    prepare: bool | None = None
    dict_rows: bool = False


class Copy(NamedTuple):
    """``COPY ... FROM STDIN`` of ``rows``: tuples in the statement's column order, or the
    data already in COPY's text format as one string (written in one call)."""

    statement: sql.Composed
    rows: "Iterable[tuple[Any, ...]] | str"


class Atomic(NamedTuple):
    """Run ``plan`` atomically: a transaction of its own on an autocommit connection,
    inside the caller's transaction otherwise (as :func:`pgworker.store.base.atomic`).
    ``savepoint``: in the caller's transaction, inside a savepoint, so that a failure of
    the group (an exception the plan raises included) undoes its writes and leaves the
    caller's transaction as it was, usable."""

    plan: "Plan[Any]"
    savepoint: bool = False


# A savepoint of pgworker's own in the caller's transaction (nested groups reuse the name:
# PostgreSQL then addresses the innermost, which is what each group means).
_SAVEPOINT = "SAVEPOINT pgworker_atomic"
_UNDO = "ROLLBACK TO SAVEPOINT pgworker_atomic"
_RELEASE = "RELEASE SAVEPOINT pgworker_atomic"

Step = Union[Exec, Copy, Atomic]
Plan = Generator[Step, Any, T]


def atomically(plan: Plan[T]) -> Plan[T]:
    """``plan`` as one :class:`Atomic` group: a plan of its own, for :func:`run`."""
    result: T = yield Atomic(plan)
    return result


def run(conn: psycopg.Connection, plan: Plan[T]) -> T:
    """Drive ``plan`` on a sync connection; returns what the plan returns."""
    try:
        step = next(plan)
        while True:
            try:
                answer = _step(conn, step)
            except BaseException as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _step(conn: psycopg.Connection, step: Step) -> Any:
    if isinstance(step, Exec):
        with conn.cursor(row_factory=dict_row) if step.dict_rows else conn.cursor() as cur:
            cur.execute(step.query, step.params, prepare=step.prepare)
            return cur.fetchall() if cur.description is not None else []
    if isinstance(step, Copy):
        with conn.cursor() as cur, cur.copy(step.statement) as copy:
            if isinstance(step.rows, str):
                copy.write(step.rows)
            else:
                for row in step.rows:
                    copy.write_row(row)
        return None
    # as pgworker.store.base.atomic (not imported: base builds its steps with this module)
    if conn.autocommit or not step.savepoint:
        with conn.transaction() if conn.autocommit else contextlib.nullcontext():
            return run(conn, step.plan)
    conn.execute(_SAVEPOINT)  # opens the caller's implicit transaction first, if none is
    try:
        value = run(conn, step.plan)
    except BaseException:
        with contextlib.suppress(psycopg.Error):  # a broken connection: the original error matters
            conn.execute(_UNDO)
        raise
    conn.execute(_RELEASE)
    return value


async def arun(conn: psycopg.AsyncConnection, plan: Plan[T]) -> T:
    """Drive ``plan`` on an async connection; returns what the plan returns."""
    try:
        step = next(plan)
        while True:
            try:
                answer = await _astep(conn, step)
            except BaseException as exc:
                step = plan.throw(exc)
            else:
                step = plan.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _astep(conn: psycopg.AsyncConnection, step: Step) -> Any:
    if isinstance(step, Exec):
        async with conn.cursor(row_factory=dict_row) if step.dict_rows else conn.cursor() as cur:
            await cur.execute(step.query, step.params, prepare=step.prepare)
            return await cur.fetchall() if cur.description is not None else []
    if isinstance(step, Copy):
        async with conn.cursor() as cur, cur.copy(step.statement) as copy:
            if isinstance(step.rows, str):
                await copy.write(step.rows)
            else:
                for row in step.rows:
                    await copy.write_row(row)
        return None
    # as _step does for a sync connection
    if conn.autocommit or not step.savepoint:
        async with conn.transaction() if conn.autocommit else contextlib.nullcontext():
            return await arun(conn, step.plan)
    await conn.execute(_SAVEPOINT)
    try:
        value = await arun(conn, step.plan)
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            await conn.execute(_UNDO)
        raise
    await conn.execute(_RELEASE)
    return value
