"""JobContext: what a handler sees of its job and its lease."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Callable

from .effects.steps import run_effect, run_step
from .effects.transaction import TransactionState, job_atransaction, job_transaction
from .errors import JobCancelled, LeaseLost

if TYPE_CHECKING:
    import psycopg

    from .effects.connections import EffectResources
    from .jobs import ClaimedJob
    from .worker.slots import SlotTable

log = logging.getLogger("pgworker.job")


class JobContext:
    """Passed to handlers that take two arguments: ``def handler(payload, ctx)``.

    Attributes: ``job_id``, ``attempt`` (1-based), ``max_attempts``, ``queue``, ``task``,
    ``lease_token``, and ``idempotency_key``, which is the same for every attempt of the
    job: pass it to external systems so that a re-run after a crash is recognised.

    ``heartbeat()`` (alias ``progress()``) reports progress; it writes to shared memory
    and costs no query. ``lease_lost`` becomes True when the supervisor could not renew
    the lease (another worker may now run the job: stop, your outcome will be refused);
    ``cancel_requested`` when an operator cancelled the job; ``stopping`` when the worker
    is shutting down (the shutdown grace runs). ``check()`` raises
    :class:`LeaseLost` or :class:`JobCancelled` in those cases.

    ``transaction()`` opens a transaction on a psycopg connection in which the handler's
    own writes commit together with the job's fenced success (docs/effects.md).
    """

    __slots__ = ("job", "_table", "_slot", "progress_value", "_logger", "_effects", "_tx")

    def __init__(self, job: "ClaimedJob", table: "SlotTable | None" = None, slot: int = -1,
                 effects: "EffectResources | None" = None) -> None:
        self.job = job
        self._table = table
        self._slot = slot
        self.progress_value: Any = None
        self._logger: "logging.LoggerAdapter[logging.Logger] | None" = None
        self._effects = effects
        self._tx = TransactionState()

    @property
    def logger(self) -> "logging.LoggerAdapter[logging.Logger]":
        """A logger whose records carry the job's id, attempt, queue and task (built on
        first use: most handlers never log, and a claimer builds a context per job)."""
        if self._logger is None:
            self._logger = logging.LoggerAdapter(log, {"job_id": self.job.id, "attempt": self.job.attempt,
                                                       "queue": self.job.queue, "task": self.job.task})
        return self._logger

    job_id = property(lambda self: self.job.id)
    attempt = property(lambda self: self.job.attempt)
    max_attempts = property(lambda self: self.job.max_attempts)
    queue = property(lambda self: self.job.queue)
    task = property(lambda self: self.job.task)
    lease_token = property(lambda self: self.job.lease_token)
    idempotency_key = property(lambda self: self.job.idempotency_key)

    @property
    def is_last_attempt(self) -> bool:
        return self.job.attempt >= self.job.max_attempts

    def heartbeat(self, progress: Any = None) -> None:
        """Report progress (for ``renew='progress'`` tasks this keeps the lease alive)."""
        if progress is not None:
            self.progress_value = progress
        if self._table is not None:
            self._table.progress(self._slot, self.job.id)

    progress = heartbeat

    @property
    def lease_lost(self) -> bool:
        return self._table is not None and self._table.flags(self._slot, self.job.id)[0]

    @property
    def cancel_requested(self) -> bool:
        return self._table is not None and self._table.flags(self._slot, self.job.id)[1]

    @property
    def stopping(self) -> bool:
        """True once the worker is shutting down (SIGTERM, a drain run's deadline): the
        handler has the rest of the shutdown grace, then fails ``SHUTDOWN`` with its
        attempt counted. A long handler may save its progress and ``raise
        pgworker.Snooze(0)`` to hand the job back now without spending the attempt."""
        return self._table is not None and bool(self._table.header.stopping)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone, :class:`JobCancelled` if the job
        was cancelled; call it between units of work."""
        if self._table is None:
            return
        lost, cancel = self._table.flags(self._slot, self.job.id)
        if lost:
            raise LeaseLost(job_id=self.job.id, lease_token=self.job.lease_token, operation="heartbeat")
        if cancel:
            raise JobCancelled(f"job {self.job.id} was cancelled")

    def transaction(self) -> "contextlib.AbstractContextManager[psycopg.Connection]":
        """``with ctx.transaction() as conn:``: a psycopg connection (the claimer's handler
        connection, opened on first use) in a transaction. Leaving the block without an
        exception writes the job's success on ``conn``, fenced by the lease token, and
        commits it with the handler's writes; the worker then writes no other outcome.

        Raises :class:`LeaseLost` (everything rolled back) when the fence refuses the
        success; re-raises the block's exception after rolling back; re-raises a failed
        COMMIT's error unless the job's row, read back, shows the commit happened.
        ``RuntimeError`` for a second or nested block, or a context with no worker behind
        it. Details and crash timelines: docs/effects.md."""
        if self._effects is None:
            raise RuntimeError("ctx.transaction() needs a context given by a worker (pgworker run, "
                               "pgworker.testing.drain); this one was built by hand")
        return job_transaction(self, self._effects)

    def step(self, name: str, fn: "Callable[[], Any]") -> Any:
        """Run ``fn()`` at most once across the job's attempts and return its result.

        ``name``: 1-200 printable characters, unique within the job. The result (JSON:
        dict, list, str, number, bool, None; at most ``step_result_max_bytes``) is
        recorded against the job, fenced by the lease token; a later attempt gets the
        recorded value, decoded from JSON, without calling ``fn``. Inside
        ``ctx.transaction()`` the record commits with the handler's writes. Raises
        :class:`pgworker.errors.StepError` (permanent: ``STEP_RESULT_INVALID``,
        ``STEP_RESULT_TOO_LARGE``, ``STEP_LIMIT``, ``STEP_NAME_INVALID``) and
        :class:`LeaseLost` when the fence refuses the record. docs/effects.md."""
        return run_step(self, name, fn)

    def effect(self, name: str, fn: "Callable[[str], Any]", reconcile: "Callable[[str], Any] | None" = None) -> Any:
        """Call an external system once, with an idempotency key: ``fn(key)`` returns the
        effect's JSON result.

        A fenced ``started`` record (with ``key``, stable for the job and ``name``) commits
        before the call, ``done`` with the result after. When an earlier attempt started
        the effect and never recorded its end, ``reconcile(key)`` is asked instead of
        calling blindly: it returns the result if the effect happened, or
        ``pgworker.NOT_DONE`` (then ``fn(key)`` runs again, same key). Without
        ``reconcile``, raises :class:`pgworker.errors.EffectUncertain` (the job goes dead
        ``EFFECT_UNCERTAIN``; `pgworker effects resolve`). Not inside ``ctx.transaction()``
        (``RuntimeError``). Bounds and errors as :meth:`step`. docs/effects.md."""
        return run_effect(self, name, fn, reconcile)

    def atransaction(self) -> "contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection]":
        """:meth:`transaction` for async handlers: ``async with ctx.atransaction() as aconn:``
        gives a ``psycopg.AsyncConnection`` (one per claimer and event loop, opened on first
        use) in a transaction; the same success statement, fence and rules. ``ctx.step``
        is not available inside it (``RuntimeError``)."""
        if self._effects is None:
            raise RuntimeError("ctx.atransaction() needs a context given by a worker (pgworker run, "
                               "pgworker.testing.drain); this one was built by hand")
        return job_atransaction(self, self._effects)

    @property
    def committed(self) -> bool:
        """True once ``ctx.transaction()`` committed the job's success."""
        return self._tx.committed

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.id} task={self.job.task!r} attempt={self.job.attempt}>"
