"""``ctx.transaction()``: a handler's own writes and its job's fenced success, one commit.

::

    with ctx.transaction() as conn:          # a psycopg connection, in a transaction
        conn.execute("INSERT INTO orders ...")
    # committed here, together with the job's success (fenced by its lease token)

On leaving the block without an exception, the job's success is written on ``conn`` in
the same transaction, by the one success statement every runner uses
(``Store.complete``: ``job_complete``, fenced by id + state + lease token, with the
ordering-key locks and promotion), then the transaction commits. What can happen:

- **The fence refuses** (the lease was lost: the job was reaped and claimed again, or
  taken over): the transaction rolls back, none of the handler's writes are committed,
  and :class:`pgworker.LeaseLost` is raised out of the ``with`` (the job's outcome is
  then the other owner's; the worker's own failure write is refused too).
- **The block raises**: the transaction rolls back and the exception goes on; the
  attempt fails as usual (retried or dead), nothing of it committed.
- **The COMMIT fails or its reply is lost** (the connection drops): whether it committed
  is read back from the job's row on a new connection (``job_commit_read_back``, which
  waits for the row's lock, so a transaction still finishing on the server is waited
  for): the job ``succeeded`` under this attempt's token means it committed, and the
  block ends normally; anything else means it did not, and the COMMIT's error is raised
  (the attempt fails and is retried, nothing of it committed). When even the read-back
  fails, its error is raised: the worker then writes a fenced failure, which the fence
  refuses if the commit did happen (the row is no longer running), so the row stays the
  single truth either way.
- **After the commit** the job is succeeded: the runner writes no second outcome (the
  attempt's outcome is ``COMMITTED``). A handler that raises (or returns ``Retry`` /
  ``Snooze``) after the block is logged at WARNING and the job stays succeeded: put
  everything that may fail inside the block. The lease is no longer renewable once the
  row has left ``running``: return soon after the block.

One transaction per attempt: a second ``ctx.transaction()`` after the first committed
raises ``RuntimeError`` (nested blocks too).

Async handlers: ``async with ctx.atransaction() as aconn:`` (a ``psycopg.AsyncConnection``),
the same rules. The success is the same ``Store.complete`` call, run through
:mod:`.async_bridge` on the async connection, in its transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

import psycopg
from opentelemetry import trace

from .. import tracing
from ..errors import LeaseLost
from .async_bridge import run_sync

if TYPE_CHECKING:
    from ..context import JobContext

log = logging.getLogger("pgworker.effects")

OPERATION = "complete_in_transaction"


class TransactionState:
    """Per attempt: whether a handler transaction is open, and whether it committed."""

    __slots__ = ("open", "committed", "conn", "is_async", "step_names")

    def __init__(self) -> None:
        self.open = False
        self.is_async = False  # the open transaction is ctx.atransaction()'s
        self.committed = False
        self.conn: psycopg.Connection | None = None  # while open
        # the steps recorded in the open block: gone with it if it rolls back (a break-it
        # trial: a retried block's step was refused as a reused name)
        self.step_names: set[str] = set()


@contextlib.contextmanager
def job_transaction(ctx: "JobContext", resources: "object") -> Iterator[psycopg.Connection]:
    """The context manager behind ``ctx.transaction()`` (see the module)."""
    state: TransactionState = ctx._tx
    _check_state(ctx, state)
    store = resources.store  # type: ignore[attr-defined]
    connections = resources.connections  # type: ignore[attr-defined]
    job = ctx.job
    conn = connections.get()
    state.open, state.conn = True, conn
    parent = trace.get_current_span()
    try:
        tx = conn.transaction()
        tx.__enter__()
        try:
            yield conn
            report = store.complete(conn, [job.lease], [job.ordering_key])
            if job.id not in report.accepted:
                _refused(job, resources, parent)
        except BaseException as exc:
            _roll_back(tx, exc, connections)
            raise
        try:
            tx.__exit__(None, None, None)  # COMMIT
        except psycopg.Error as exc:
            if not _committed(ctx, connections, store, exc):
                if conn.broken or conn.closed:
                    connections.discard()
                raise
        _committed_success(ctx, resources, parent)
    finally:
        state.open, state.conn = False, None
        state.step_names.clear()  # committed: the job has ended; rolled back: the records went


@contextlib.asynccontextmanager
async def job_atransaction(ctx: "JobContext", resources: "object") -> AsyncIterator[psycopg.AsyncConnection]:
    """The async context manager behind ``ctx.atransaction()`` (see the module)."""
    state: TransactionState = ctx._tx
    _check_state(ctx, state)
    store = resources.store  # type: ignore[attr-defined]
    connections = resources.connections  # type: ignore[attr-defined]
    job = ctx.job
    aconn = await connections.aget()
    state.open, state.is_async = True, True
    parent = trace.get_current_span()
    try:
        tx = aconn.transaction()
        await tx.__aenter__()
        try:
            yield aconn
            report = await run_sync(aconn, lambda conn: store.complete(conn, [job.lease], [job.ordering_key]))
            if job.id not in report.accepted:
                _refused(job, resources, parent)
        except BaseException as exc:
            try:
                await tx.__aexit__(type(exc), exc, exc.__traceback__)
            except psycopg.Error:
                connections.discard_async()
            raise
        try:
            await tx.__aexit__(None, None, None)  # COMMIT
        except psycopg.Error as exc:
            if not await asyncio.to_thread(_committed, ctx, connections, store, exc):
                if aconn.broken or aconn.closed:
                    connections.discard_async()
                raise
        _committed_success(ctx, resources, parent)
    finally:
        state.open, state.is_async = False, False


def _committed_success(ctx: "JobContext", resources: "object", parent: Any) -> None:
    """After the COMMIT of either kind of block: the job's success is the outcome (the
    slot says so, its settle span is recorded)."""
    ctx._tx.committed = True
    _settled(ctx)
    worker_id = resources.worker_id  # type: ignore[attr-defined]
    tracing.settle_span(ctx.job, OPERATION, True, parent=parent, worker_id=worker_id)


def _settled(ctx: "JobContext") -> None:
    """Tell the slot table the job's success is committed: its lease is not renewed any
    more, and a claimer that dies before the handler returns is settled without a write."""
    if ctx._table is not None:
        from ..worker.outcome import COMMITTED  # here: pgworker.worker imports the context, which imports this

        ctx._table.mark_committed(ctx._slot, ctx.job.id, COMMITTED)


def _check_state(ctx: "JobContext", state: TransactionState) -> None:
    if state.committed:
        raise RuntimeError(f"job {ctx.job_id}: its transaction already committed the job's success; "
                           "an attempt has one ctx.transaction(): put all its writes in that block")
    if state.open:
        raise RuntimeError(f"job {ctx.job_id}: ctx.transaction() is already open; blocks do not nest "
                           "(use conn.transaction() inside it for a savepoint)")


def _refused(job: object, resources: object, parent: object) -> None:
    """The fence refused the success: count, trace and raise LeaseLost (the caller rolls back)."""
    worker_id = resources.worker_id  # type: ignore[attr-defined]
    tracing.settle_span(job, OPERATION, False, parent=parent, worker_id=worker_id)
    if resources.metrics is not None:  # type: ignore[attr-defined]
        resources.metrics.fenced(job.queue, OPERATION)  # type: ignore[attr-defined]
    raise LeaseLost(job_id=job.id, lease_token=job.lease_token, operation=OPERATION)  # type: ignore[attr-defined]


def _roll_back(tx: psycopg.Transaction, exc: BaseException, connections: object) -> None:
    try:
        tx.__exit__(type(exc), exc, exc.__traceback__)
    except psycopg.Error:
        # the connection went while rolling back: the server aborts the transaction itself
        connections.discard()  # type: ignore[attr-defined]


def _committed(ctx: "JobContext", connections: object, store: object, error: psycopg.Error) -> bool:
    """Whether the transaction whose COMMIT raised ``error`` committed: read from the row
    on a new connection (raises when even that read fails: see the module)."""
    job = ctx.job
    log.warning("job %s: the COMMIT of its transaction failed (%s: %s); reading the job back to learn "
                "whether it committed", job.id, type(error).__name__, str(error).strip()[:200],
                extra={"action": "commit_read_back", "job_id": job.id, "queue": job.queue})
    with contextlib.closing(connections.fresh()) as fresh:  # type: ignore[attr-defined]
        row = store.commit_read_back(fresh, job.id)  # type: ignore[attr-defined]
    committed = row is not None and row[0] == "succeeded" and row[1] == job.lease_token
    log.warning("job %s: its transaction %s (the row reads %s)", job.id,
                "committed" if committed else "did not commit", row,
                extra={"action": "commit_read_back", "job_id": job.id, "queue": job.queue})
    return committed
