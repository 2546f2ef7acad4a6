"""Job results: what a handler returned, encoded and bounded where the success is decided,
stored by the fenced success itself, and read back (``App.result``, ``App.wait_result``).

The model (docs/results.md):

- A handler's return value is JSON-encoded when it returns (:func:`encode_result`).
  ``None`` stores nothing. A value that is not JSON (a set, an object, NaN, a string
  holding U+0000, which PostgreSQL's jsonb refuses) fails the attempt with
  ``RESULT_INVALID``; one whose encoding is longer than ``result_max_bytes`` (UTF-8)
  fails it with ``RESULT_TOO_LARGE``. Both are permanent (the same code returns the same
  value again; the job ends dead, visible, and can be replayed after the fix): the
  handler's work may have been done, which is why it is not silently retried.
- The result is written by ``job_complete``, the one statement every success goes
  through, and only for the rows that statement accepted: a stale worker (its lease
  token superseded) has its success refused by the fence, and its result with it.
- It lives in ``job_results`` and is deleted with its job (retention cascades).
- Waiting: ``job_complete`` sends one NOTIFY per statement that completed anything; a
  waiter LISTENs, and re-reads its job on each notification and at least every
  ``poll_seconds`` (a NOTIFY is a hint: failures and cancellations, which send none,
  are seen by the poll).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import warnings
from typing import TYPE_CHECKING, Any, AsyncContextManager, Callable

import psycopg
from psycopg import sql

from . import db
from .errors import (DatabaseUnavailable, JobDidNotSucceed, JobNotFound, PayloadError, ResultLost, ResultNotReady,
                     ResultTimeout)
from .jobs import UndecodablePayload
from .names import check_id, redact_dsn, schema_flag
from .store.plan import arun

if TYPE_CHECKING:
    from .core import Core

# The App's ``aconnection(conn, sync_call)``: the caller's async connection or a pooled one.
AsyncConnectionSource = Callable[[psycopg.AsyncConnection | None, str], AsyncContextManager[psycopg.AsyncConnection]]

RESULT_INVALID = "RESULT_INVALID"
RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
WAIT_POLL_SECONDS = 1.0
WAIT_APPLICATION_NAME = "pgworker-wait-result"
# A wait whose connection was lost connects again after 0.1 s, doubling up to 2 s: a
# restarting server is back within seconds, and the timeout bounds the whole wait.
RECONNECT_FIRST_SECONDS = 0.1
RECONNECT_MAX_SECONDS = 2.0

# A JSON \u0000 escape: its backslash not itself escaped (an odd run of backslashes).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class ResultRefused(ValueError):
    """A handler's return value cannot be stored; ``code`` is the attempt's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def encode_result(value: Any, max_bytes: int) -> str | None:
    """``value`` as the JSON text job_results stores, or None for ``None`` (nothing stored).

    Raises :class:`ResultRefused` with ``RESULT_INVALID`` (not JSON-serialisable: the
    reason names the type) or ``RESULT_TOO_LARGE`` (more than ``max_bytes`` bytes of
    UTF-8; the message gives both sizes and the setting).
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ResultRefused(RESULT_INVALID, f"the handler's return value is not JSON ({exc}); return "
                                            "JSON-serialisable data (dict, list, str, number, bool, None)") from None
    except RecursionError:
        raise ResultRefused(RESULT_INVALID, "the handler's return value is nested too deeply to encode") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise ResultRefused(RESULT_INVALID, "the handler's return value holds a NUL character (U+0000), "
                                            "which PostgreSQL's jsonb cannot store; remove or escape it")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not text PostgreSQL can store
        raise ResultRefused(RESULT_INVALID, "the handler's return value holds a lone surrogate character "
                                            "(not valid Unicode text), which PostgreSQL cannot store; "
                                            "return valid text") from None
    if size > max_bytes:
        raise ResultRefused(RESULT_TOO_LARGE, f"the handler's return value is {size} bytes of JSON, more than "
                                              f"result_max_bytes ({max_bytes}); store large data elsewhere and "
                                              "return a reference, or raise PGWORKER_RESULT_MAX_BYTES")
    return text


def _settled(job_id: int, row: dict[str, Any] | None, schema: str) -> tuple[bool, Any]:
    """(finished, result) of a job_result_get row; raises for a job that has none (the
    hints name ``schema``'s --schema flag, so they work as printed outside the default)."""
    if row is None:
        raise JobNotFound(f"no job {job_id} (never enqueued in this schema, or pruned with its result)")
    state = row["state"]
    if state == "succeeded":
        if row["has_result"] and row["result"] is None:
            raise ResultLost(f"job {job_id} succeeded but its result was lost (its claimer died before "
                             "writing it, and it was too large for shared memory)")
        if isinstance(row["result"], UndecodablePayload):  # written by hand: a handler's result always decodes
            raise PayloadError(f"job {job_id}'s stored result cannot be decoded: {row['result'].reason}")
        return True, row["result"] if row["has_result"] else None
    if state in ("dead", "cancelled"):
        raise JobDidNotSucceed(f"job {job_id} ended {state} ({row['last_error_code'] or 'no error code'}); "
                               f"`pgworker jobs show {job_id}{schema_flag(schema)}` has its history",
                               job_id=job_id, state=state, code=row["last_error_code"])
    return False, None


def result(core: Core, job_id: int, conn: psycopg.Connection | None = None) -> Any:
    """See :meth:`pgworker.App.result`."""
    check_id(job_id)
    with core.connection(conn) as c:
        row = core.store.job_result(c, job_id)
    return _ready(job_id, row, core.settings.schema, "App.wait_result")


def _ready(job_id: int, row: dict[str, Any] | None, schema: str, waiter: str) -> Any:
    """The result of a job_result_get row, or the error saying why there is none yet
    (``waiter``: the call that waits for it, sync or async)."""
    finished, value = _settled(job_id, row, schema)
    if not finished:
        raise ResultNotReady(f"job {job_id} is {_where(row, schema)}: it has no result yet "  # type: ignore[arg-type]
                             f"({waiter} waits for it; "
                             f"`pgworker jobs show {job_id}{schema_flag(schema)}` shows how far it is)")
    return value


def _where(row: dict[str, Any], schema: str) -> str:
    """An unfinished job's state as a waiter needs it: 'running', 'pending', 'pending,
    waiting for 2 parents; job 10 ended dead (PERMANENT) and holds it until replayed
    (`pgworker dead replay 10`) or cancelled' (a trial: a child held by a dead parent read
    "pending", and wait_result waited out its timeout without a word why)."""
    waiting = row.get("waiting_parents") or 0
    if row["state"] != "pending" or not waiting:
        return str(row["state"])
    said = f"pending, waiting for {waiting} parent{'' if waiting == 1 else 's'}"
    stuck = row.get("stuck_parent")
    if isinstance(stuck, dict):
        flag = schema_flag(schema)
        fix = f"replayed (`pgworker dead replay {stuck['id']}{flag}`)" if stuck["state"] == "dead" else \
            f"replayed with its graph (`pgworker graphs replay GRAPH_ID{flag}`)"
        said += (f"; its parent job {stuck['id']} ended {stuck['state']} ({stuck['code'] or 'no error code'}) "
                 f"and holds it until that parent is {fix} or this job is cancelled")
    return said


def _check_wait(job_id: int, timeout: float | None, poll_seconds: float) -> float:
    """The wait's arguments checked (a trial: ``timeout=None`` and ``'5'`` failed with
    "'>=' not supported"); the timeout in seconds, ``math.inf`` for None (no deadline)."""
    check_id(job_id)
    for name, value in (("timeout", timeout), ("poll_seconds", poll_seconds)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"{name} is a number of seconds{' (or None: no deadline)' if name == 'timeout' else ''}, "
                            f"got {type(value).__name__} {value!r}")
    if timeout is None:
        timeout = math.inf
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    if not poll_seconds > 0 or math.isinf(poll_seconds):
        raise ValueError(f"poll_seconds must be > 0 and finite, got {poll_seconds!r}")
    return float(timeout)


def _warn_in_event_loop() -> None:
    """Say so when a blocking wait runs in an event loop's thread: every other coroutine
    of that loop (an ASGI app's requests) stops for as long as it waits (a trial)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    warnings.warn("App.wait_result blocks this thread's running event loop while it waits: in async code use "
                  "`await app.await_result(job_id, timeout=...)`", RuntimeWarning, stacklevel=4)


def wait_result(core: Core, job_id: int, *, timeout: float | None, poll_seconds: float = WAIT_POLL_SECONDS) -> Any:
    """See :meth:`pgworker.App.wait_result`."""
    timeout = _check_wait(job_id, timeout, poll_seconds)
    _warn_in_event_loop()
    deadline = time.monotonic() + timeout
    # A connection of its own (LISTEN is a session's: PGWORKER_LISTEN_DSN when set, the
    # direct connection a pooler deployment gives the listener), autocommit so each re-read
    # sees the latest commit; the LISTEN is sent before the first read, so a completion
    # that commits in between is either read or notified, never missed. A connection lost
    # meanwhile (a server restart) is opened again, LISTEN and read again, until the deadline.
    s = core.settings
    conn: psycopg.Connection | None = None
    backoff = RECONNECT_FIRST_SECONDS
    try:
        while True:
            try:
                if conn is None:
                    conn = db.connect(s.effective_listen_dsn, application_name=WAIT_APPLICATION_NAME,
                                      prepare=s.prepared_statements,
                                      connect_timeout=_connect_timeout(deadline))
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(core.store.results_channel)))
                row = core.store.job_result(conn, job_id)
                finished, value = _settled(job_id, row, s.schema)
                if finished:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} had not finished after {timeout} s: it is "
                                        f"{_where(row, s.schema)}")  # type: ignore[arg-type]
                _wait_notify(conn, min(left, poll_seconds))
                backoff = RECONNECT_FIRST_SECONDS
            except (DatabaseUnavailable, psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if not _lost(exc, conn):
                    raise
                if conn is not None:
                    conn.close()
                    conn = None
                time.sleep(_backoff_or_give_up(core, job_id, exc, deadline, timeout, backoff))
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
    finally:
        if conn is not None:
            conn.close()


def _wait_notify(conn: psycopg.Connection, seconds: float) -> None:
    """Block until a notification arrives on ``conn`` or ``seconds`` pass; drain them."""
    for _ in conn.notifies(timeout=seconds, stop_after=1):
        pass
    for _ in conn.notifies(timeout=0.0):  # the rest already received: one re-read covers them
        pass


def _lost(exc: BaseException, conn: psycopg.Connection | psycopg.AsyncConnection | None) -> bool:
    """The wait's connection is gone (open another), rather than its statement refused."""
    return conn is None or conn.closed or conn.broken or db.failure_kind(exc) == "unreachable"


def _connect_timeout(deadline: float) -> float:
    """A connect attempt may not outlast the wait by much (libpq counts whole seconds, >= 1)."""
    return min(db.CONNECT_TIMEOUT_SECONDS, max(1.0, deadline - time.monotonic()))


def _backoff_or_give_up(core: Core, job_id: int, exc: BaseException, deadline: float, timeout: float,
                        backoff: float) -> float:
    """Seconds to sleep before connecting again; raises :class:`DatabaseUnavailable` (the
    DSN's password redacted, with the fix) when the wait's timeout has run out."""
    left = deadline - time.monotonic()
    if left <= 0:
        dsn = core.settings.effective_listen_dsn
        raise DatabaseUnavailable(
            f"waiting for job {job_id}'s result: PostgreSQL at {redact_dsn(dsn)!r} could not be reached before "
            f"the timeout ({timeout} s) ended ({db.describe_failure(exc, dsn)}); check the DSN (PGWORKER_DSN, "
            "or PGWORKER_LISTEN_DSN when set) and that the server is running, then wait again: the job "
            "itself is not affected") from None
    return min(backoff, left)


async def aresult(core: Core, aconnection: AsyncConnectionSource, job_id: int,
                  conn: psycopg.AsyncConnection | None = None) -> Any:
    """See :meth:`pgworker.App.aresult`: :func:`result` on the App's async pool (or
    ``conn``, through ``aconnection``: the App's), through the same statement plan."""
    check_id(job_id)
    async with aconnection(conn, "result") as c:
        row = await arun(c, core.store.job_result_plan(job_id))
    return _ready(job_id, row, core.settings.schema, "await App.await_result")


async def await_result(core: Core, job_id: int, *, timeout: float | None, poll_seconds: float = WAIT_POLL_SECONDS) -> Any:
    """See :meth:`pgworker.App.await_result`: :func:`wait_result` on an async connection
    of its own (LISTEN is a session's, so not a pooled one), woken by the completion's
    NOTIFY and re-reading at least every ``poll_seconds``; never blocks the event loop
    and holds no thread; a lost connection is opened again until the deadline.
    Cancelling the awaiting task closes the connection."""
    timeout = _check_wait(job_id, timeout, poll_seconds)
    deadline = time.monotonic() + timeout
    db.check_dsn(core.settings.effective_listen_dsn)
    conn: psycopg.AsyncConnection | None = None
    backoff = RECONNECT_FIRST_SECONDS
    try:
        while True:
            try:
                if conn is None:
                    conn = await _alisten(core, deadline)
                row = await arun(conn, core.store.job_result_plan(job_id))
                finished, value = _settled(job_id, row, core.settings.schema)
                if finished:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} had not finished after {timeout} s: it is "
                                        f"{_where(row, core.settings.schema)}")  # type: ignore[arg-type]
                async for _ in conn.notifies(timeout=min(left, poll_seconds), stop_after=1):
                    pass
                async for _ in conn.notifies(timeout=0.0):  # the rest already received: one re-read covers them
                    pass
                backoff = RECONNECT_FIRST_SECONDS
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                if not _lost(exc, conn):
                    raise
                if conn is not None:
                    await conn.close()
                    conn = None
                await asyncio.sleep(_backoff_or_give_up(core, job_id, exc, deadline, timeout, backoff))
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
    finally:
        if conn is not None:
            await conn.close()


async def _alisten(core: Core, deadline: float) -> psycopg.AsyncConnection:
    """The wait's async connection, LISTENing (before the first read: a completion
    committed in between is read or notified)."""
    s = core.settings
    conn = await psycopg.AsyncConnection.connect(
        s.effective_listen_dsn or "", autocommit=True, application_name=WAIT_APPLICATION_NAME,
        connect_timeout=max(1, int(_connect_timeout(deadline))), **db.KEEPALIVE_KWARGS)
    try:
        if not s.prepared_statements:
            conn.prepare_threshold = None
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(core.store.results_channel)))
    except BaseException:
        await conn.close()
        raise
    return conn


async def wait_result_async(core: Core, job_id: int, *, timeout: float | None,
                            poll_seconds: float = WAIT_POLL_SECONDS) -> Any:
    """See :meth:`pgworker.App.wait_result_async`, now :func:`await_result` (no thread)."""
    return await await_result(core, job_id, timeout=timeout, poll_seconds=poll_seconds)
