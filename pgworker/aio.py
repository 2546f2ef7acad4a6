"""The asyncio producer API of :class:`pgworker.App`: ``await app.aenqueue(...)``,
``aenqueue_many`` (COPY for large batches), ``acancel``, ``areplay``, ``aget_job``, in
the caller's ``psycopg.AsyncConnection`` transaction or on the App's own async pool
(opened at the first call, closed by ``await app.aclose()``).

The same validation (:class:`pgworker.jobspec.Preparer`), statements, tracing spans,
metrics and NOTIFY as the sync calls: both run the same plans
(:mod:`pgworker.store.plan`), only the driver differs. A mixin of the App that holds the
async pool; everything else it uses is the App's :class:`pgworker.core.Core` (``core``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Self, Sequence

import psycopg
from psycopg.types.json import set_json_loads

from . import db
from .config import Settings
from .connections import (LOCK_TIMEOUT_SQL, POOL_CHECK_IDLE_SECONDS, POOL_MAX_SIZE, database_errors, discard_if_stale,
                          pgworker_schemas_hint, pooled_lock_waits_note, require_async, unreachable)
from .errors import SchemaNotMigrated
from .jobs import REPLAY_LIMIT, ReplayResult, check_replay_limit, safe_json_loads
from .names import check_id, check_ids, check_queue_name, checked_cancel_reason
from .dependencies import enqueue_graph_plan, has_dependencies
from .enqueue_options import OnConflict
from .jobspec import JobSpec, specs_from
from .operations import _actor
from .producer import check_on_conflict, enqueue_batch_plan, enqueue_one_plan
from .store.plan import arun

if TYPE_CHECKING:
    from .core import Core
    from .tasks import Task


class AsyncProducer:
    """The coroutines of :class:`pgworker.App` for asyncio services (FastAPI, Starlette,
    aiohttp): they never block the event loop. Each takes ``conn=`` (an open
    ``psycopg.AsyncConnection``: the call joins its transaction, so a rollback leaves no
    job and no wake-up) or uses the App's async pool (autocommit; up to 4 connections,
    opened lazily in the running event loop). Passing a sync ``psycopg.Connection``
    raises TypeError naming the sync call; the sync calls refuse an AsyncConnection the
    same way."""

    core: Core
    _apool: Any = None
    _apool_loop: Any = None
    _apool_lock: "asyncio.Lock | None" = None

    # -- connections ----------------------------------------------------------------

    async def _get_apool(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._apool is not None and self._apool_loop is not loop:
            # opened in an event loop that has ended (asyncio.run called again): its
            # connections belong to that loop and cannot be used or closed from this one
            self._apool = None
        if self._apool is None:
            if self._apool_lock is None or self._apool_loop is not loop:
                self._apool_lock = asyncio.Lock()
                self._apool_loop = loop
            async with self._apool_lock:  # two first calls at once open one pool
                if self._apool is None:
                    self._apool = await open_async_pool(self.core.settings, self.core.name)
        return self._apool

    @contextlib.asynccontextmanager
    async def aconnection(self, conn: psycopg.AsyncConnection | None = None,
                          sync_call: str = "connection") -> AsyncIterator[psycopg.AsyncConnection]:
        """``conn`` if given (the caller's transaction), else a pooled autocommit async
        connection. Database failures become pgworker's errors (DatabaseUnavailable, ...)."""
        require_async(conn, sync_call)
        with database_errors(self.core.settings, look_around=False):
            if conn is not None:
                yield conn
                return
            pool = await self._get_apool()
            async with pool.connection() as pooled:
                try:
                    yield pooled
                except psycopg.Error as exc:
                    discard_if_stale(pooled, exc)
                    raise
                finally:
                    pooled._pgworker_returned_at = time.monotonic()

    async def aopen(self) -> None:
        """Open the async pool now rather than at the first call, and check the schema: in
        a web app's lifespan startup, so that a wrong DSN or an unreachable server fails the
        start with :class:`DatabaseUnavailable`, and a schema never migrated (or another
        pgworker's) with :class:`SchemaNotMigrated` / :class:`SchemaTooNew`, instead of the
        first request. A role that may not read the schema's ``migrations`` table is not
        checked. A schema absent by that name gets the database's pgworker schemas named,
        as ``App.check_schema`` and the command line do. Idempotent."""
        try:
            async with self.aconnection() as conn:
                try:
                    cur = await conn.execute(self.core.store.queries["schema_version_get"])
                    row = await cur.fetchone()
                except psycopg.errors.InsufficientPrivilege:
                    return  # a producer granted less than grants.sql gives: its first call says what fails
        except SchemaNotMigrated as exc:
            # which schemas the database holds (a typo, another case: a new user's trial read
            # only 'relation "nope.migrations" does not exist'); a blocking look, so in a
            # thread, once, at start-up
            hint = await asyncio.to_thread(pgworker_schemas_hint, self.core.settings)
            raise SchemaNotMigrated(f"{exc}{hint}") from None
        problem = self.core.store.version_problem(row[0] if row else None)
        if problem is not None:
            raise problem

    async def aclose(self) -> None:
        """Close the async pool (safe to call twice, and when it was never opened). The
        sync pool is closed by :meth:`App.close`."""
        pool, self._apool = self._apool, None
        if pool is None:
            return
        if self._apool_loop is not asyncio.get_running_loop():
            # opened in another event loop, now ended: its tasks cannot be awaited from
            # here; dropping the pool lets the garbage collector close its sockets
            return
        await pool.close()

    def _drop_apool(self) -> None:
        """Forget the async pool (the settings changed: :meth:`App.configure`), closing it
        in its event loop if that still runs."""
        pool, self._apool = self._apool, None
        loop = self._apool_loop
        if pool is not None and loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(pool.close(), loop)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
        self.core.close()

    # -- producing ------------------------------------------------------------------

    async def aenqueue(self, task: "str | Task[Any]", payload: Any = None, *, queue: str | None = None,
                       priority: int | None = None, run_at: datetime | None = None,
                       delay: "float | timedelta | None" = None, max_attempts: int | None = None,
                       dedupe_key: str | None = None, ordering_key: str | None = None,
                       dedupe_window: "float | timedelta | None" = None, ordering_on_dead: str | None = None,
                       depends_on: "Sequence[int] | None" = None, on_parent_failure: str | None = None,
                       graph_id: int | None = None, any_task: bool = False, on_conflict: OnConflict = "return",
                       conn: psycopg.AsyncConnection | None = None) -> int:
        """:meth:`App.enqueue` as a coroutine: the same options (``depends_on``,
        ``on_parent_failure`` and ``graph_id`` included), checks and errors (those that
        need no database raised before any I/O), the same result (the job's id, the
        holder's on a held dedupe key, or :class:`AlreadyEnqueued` with
        ``on_conflict='raise'``). ``conn``: a ``psycopg.AsyncConnection`` whose transaction the
        insert and its NOTIFY join; without it the App's async pool commits at once."""
        require_async(conn, "enqueue")
        spec = JobSpec(task, payload, queue, priority, run_at, delay, max_attempts, dedupe_key, ordering_key,
                       dedupe_window, ordering_on_dead, depends_on=depends_on, on_parent_failure=on_parent_failure,
                       graph_id=graph_id)
        job = self.core.prepared.one(spec, any_task)
        check_on_conflict(on_conflict)
        if has_dependencies(spec) or on_parent_failure is not None:
            plan = enqueue_graph_plan(self.core.store, [spec], [job], max_parents=self.core.settings.max_parents,
                                      single=True, metrics=self.core.metrics)
            async with self.aconnection(conn, "enqueue") as c:
                return (await arun(c, plan))[0]
        async with self.aconnection(conn, "enqueue") as c:
            return await arun(c, enqueue_one_plan(self.core.store, job, self.core.metrics, on_conflict))

    async def aenqueue_many(self, jobs: Iterable["JobSpec | dict[str, Any] | tuple[Any, Any]"], *,
                            any_task: bool = False, on_conflict: OnConflict = "return",
                            conn: psycopg.AsyncConnection | None = None) -> list[int]:
        """:meth:`App.enqueue_many` as a coroutine: every item validated first (one bad
        item inserts nothing), one statement or COPY (from 1000 jobs without keys), one
        NOTIFY per queue; ids in input order; ``on_conflict`` as there."""
        require_async(conn, "enqueue_many")
        specs = specs_from(jobs)
        prepared = self.core.prepared.many(specs, any_task)
        check_on_conflict(on_conflict)
        if any(has_dependencies(s) or s.on_parent_failure is not None for s in specs):
            # JobSpec refs and depends_on: the graph enqueue's plan, as App.enqueue_many runs it
            plan = enqueue_graph_plan(self.core.store, specs, prepared, max_parents=self.core.settings.max_parents,
                                      metrics=self.core.metrics)
            async with self.aconnection(conn, "enqueue_many") as c:
                return await arun(c, plan)
        async with self.aconnection(conn, "enqueue_many") as c:
            return await arun(c, enqueue_batch_plan(self.core.store, prepared, self.core.metrics, on_conflict))

    # -- operator calls a web app needs -------------------------------------------------

    async def acancel(self, job_id: int, *, actor: str | None = None,
                      conn: psycopg.AsyncConnection | None = None, reason: str | None = None) -> str | None:
        """:meth:`App.cancel` as a coroutine: 'cancelled', 'running' (a request its worker
        sees at the next renewal), or None, raising nothing, when the job has finished or
        there is no such job (``aget_job`` tells which); ``reason`` as :meth:`App.cancel`'s
        (over 500 characters, refused: ConfigError)."""
        require_async(conn, "cancel")
        check_id(job_id)
        async with self.aconnection(conn, "cancel") as c:
            return await arun(c, self.core.store.cancel_plan(job_id, actor=actor or _actor(),
                                                             reason=checked_cancel_reason(reason)))

    async def areplay(self, job_ids: Sequence[int] = (), *, queue: str | None = None, limit: int = REPLAY_LIMIT,
                      actor: str | None = None) -> ReplayResult:
        """:meth:`App.replay` as a coroutine (a :class:`ReplayResult`)."""
        job_ids = check_ids(job_ids)
        check_replay_limit(limit)
        if queue is not None:
            check_queue_name(queue)
        async with self.aconnection(None, "replay") as c:
            return await arun(c, self.core.store.replay_plan(ids=list(job_ids), queue=queue, limit=limit,
                                                        actor=actor or _actor()))

    async def aresult(self, job_id: int, *, conn: psycopg.AsyncConnection | None = None) -> Any:
        """:meth:`App.result` as a coroutine: the decoded JSON a succeeded job returned (None
        when it returned nothing); raises :class:`ResultNotReady` (pending or running),
        :class:`JobDidNotSucceed` (dead or cancelled), :class:`JobNotFound`, :class:`ResultLost`."""
        from . import results

        return await results.aresult(self.core, self.aconnection, job_id, conn)

    async def await_result(self, job_id: int, *, timeout: float | None, poll_seconds: float = 1.0) -> Any:
        """:meth:`App.wait_result` as a coroutine: wait up to ``timeout`` seconds (None:
        without a deadline) for the job
        to finish and return its result, woken by the completion's NOTIFY (a LISTEN on a
        connection of its own, ``PGWORKER_LISTEN_DSN`` when set), re-reading at least every
        ``poll_seconds`` (failures and cancellations send no NOTIFY); a lost connection is
        opened again until the timeout. Raises :class:`ResultTimeout`,
        :class:`DatabaseUnavailable` when the server could not be reached again before the
        timeout, and the errors of :meth:`aresult` for a job that ended without one; ValueError for a negative timeout or a poll_seconds not above 0."""
        from . import results

        return await results.await_result(self.core, job_id, timeout=timeout, poll_seconds=poll_seconds)

    async def aget_job(self, job_id: int, *, conn: psycopg.AsyncConnection | None = None) -> dict[str, Any] | None:
        """:meth:`App.get_job` as a coroutine: the job's row (state, payload, attempts,
        error history, ``events``), or None when unknown."""
        check_id(job_id)
        async with self.aconnection(conn, "get_job") as c:
            return await arun(c, self.core.store.get_job_plan(job_id))


async def open_async_pool(s: Settings, name: str) -> Any:
    """An open ``psycopg_pool.AsyncConnectionPool`` of autocommit connections for the App
    called ``name``, configured as :func:`pgworker.connections.open_pool` configures the
    sync one; raises :class:`DatabaseUnavailable` when the server cannot be reached."""
    from psycopg_pool import AsyncConnectionPool

    db.check_dsn(s.dsn)

    async def configure(conn: psycopg.AsyncConnection) -> None:
        # behind a transaction-mode pooler, prepared statements would go missing (the
        # same test as db.detect_pooler: the backend pid libpq got differs from the server's)
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        pooled = row is not None and row[0] != conn.info.backend_pid
        if pooled or not s.prepared_statements:
            conn.prepare_threshold = None
        if not pooled:  # as the sync pool's (connections.bound_lock_waits)
            await conn.execute(LOCK_TIMEOUT_SQL, [db.milliseconds(s.lock_timeout_seconds)])
        else:
            pooled_lock_waits_note()
        set_json_loads(safe_json_loads, conn)  # as the sync pool: a hand-written value is shown, not a failure

    async def check(conn: psycopg.AsyncConnection) -> None:
        last = getattr(conn, "_pgworker_returned_at", 0.0)
        if time.monotonic() - last > POOL_CHECK_IDLE_SECONDS:
            await AsyncConnectionPool.check_connection(conn)

    # Fail fast with a clear message when the server is unreachable (the pool itself
    # would keep retrying until its timeout), as the sync pool does.
    try:
        probe = await psycopg.AsyncConnection.connect(
            s.dsn or "", autocommit=True, application_name=f"{name}:client",
            connect_timeout=db.CONNECT_TIMEOUT_SECONDS)
    except psycopg.Error as exc:
        raise unreachable(s, exc) from None
    await probe.close()
    pool = AsyncConnectionPool(
        conninfo=s.dsn or "", min_size=1, max_size=POOL_MAX_SIZE, open=False,
        name=f"pgworker-async-{os.getpid()}", configure=configure, check=check,
        kwargs={"autocommit": True, "application_name": f"{name}:client",
                "connect_timeout": db.CONNECT_TIMEOUT_SECONDS, **db.KEEPALIVE_KWARGS})
    try:
        await pool.open(wait=True, timeout=db.CONNECT_TIMEOUT_SECONDS + 5)
    except Exception as exc:
        await pool.close()
        raise unreachable(s, exc) from None
    return pool
