"""JobContext: what a handler sees of its job and its lease."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .effects.steps import run_effect, run_step
from .effects.transaction import TransactionState, job_atransaction, job_transaction
from .errors import JobCancelled, LeaseLost
from .names import one_line_text

if TYPE_CHECKING:
    import psycopg

    from .effects.connections import EffectResources
    from .jobs import ClaimedJob
    from .store import Store

    class JobDatabase(Protocol):
        """What a context writes and reads through (progress, the parents' results): a
        store and a connection source, the App's or its core's; not the App itself."""

        @property
        def store(self) -> Store: ...

        def connection(self, conn: Any = None) -> contextlib.AbstractContextManager[Any]: ...
    from .worker.shm.slots import SlotTable

log = logging.getLogger("pgworker.job")


class JobContext:
    """Passed to handlers that take two arguments: ``def handler(payload, ctx)``.

    Attributes: ``job_id``, ``attempt`` (1-based), ``max_attempts``, ``queue``, ``task``,
    ``lease_token``, and ``idempotency_key``, which is the same for every attempt of the
    job: pass it to external systems so that a re-run after a crash is recognised.

    ``heartbeat()`` reports progress; it writes to shared memory and costs no query.
    ``progress(value, message=None)`` also records how far the job has come on its row
    (durable, fenced, rate-limited; ``pgworker jobs show`` prints it). ``lease_lost`` becomes True when the supervisor could not renew
    the lease (another worker may now run the job: stop, your outcome will be refused);
    ``cancel_requested`` when an operator cancelled the job; ``stopping`` when the worker
    is shutting down (the shutdown grace runs). ``check()`` raises
    :class:`LeaseLost` or :class:`JobCancelled` in those cases.

    ``transaction()`` opens a transaction on a psycopg connection in which the handler's
    own writes commit together with the job's fenced success (docs/effects.md).
    """

    __slots__ = ("job", "_table", "_slot", "progress_value", "_logger", "_effects", "_tx", "_db",
                 "_progress_written_at", "_progress_pending", "_step_names")

    #: At most one progress write per job this often (seconds).
    PROGRESS_WRITE_SECONDS = 1.0
    PROGRESS_MESSAGE_MAX_CHARS = 200

    def __init__(self, job: "ClaimedJob", table: "SlotTable | None" = None, slot: int = -1,
                 effects: "EffectResources | None" = None, *, app: "JobDatabase | None" = None) -> None:
        self.job = job
        self._table = table
        self._slot = slot
        self._db = app  # keyword `app`: the worker passes its App, which is one
        self._progress_written_at = 0.0
        # the last (value, message) the throttle held back, written when the handler ends
        self._progress_pending: tuple[float, str | None] | None = None
        self.progress_value: Any = None
        self._logger: "logging.LoggerAdapter[logging.Logger] | None" = None
        self._effects = effects
        self._tx = TransactionState()
        # the step and effect names this attempt has used (a name twice is a handler bug)
        self._step_names: set[str] | None = None

    @property
    def logger(self) -> "logging.LoggerAdapter[logging.Logger]":
        """A logger whose records carry the job's id, attempt, queue and task (built on
        first use: most handlers never log, and a claimer builds a context per job)."""
        if self._logger is None:
            self._logger = logging.LoggerAdapter(log, {"job_id": self.job.id, "attempt": self.job.attempt,
                                                       "queue": self.job.queue, "task": self.job.task})
        return self._logger

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def task(self) -> str:
        """The task's name."""
        return self.job.task

    @property
    def lease_token(self) -> int:
        """This attempt's fencing token."""
        return self.job.lease_token

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt (and replay) of this job: pass it to side effects."""
        return self.job.idempotency_key

    @property
    def is_last_attempt(self) -> bool:
        return self.job.attempt >= self.job.max_attempts

    def heartbeat(self, progress: Any = None) -> None:
        """Report progress (for ``renew='progress'`` tasks this keeps the lease alive)."""
        if progress is not None:
            self.progress_value = progress
        if self._table is not None:
            self._table.progress(self._slot, self.job.id)

    def progress(self, value: float, message: str | None = None, *, force: bool = False) -> bool:
        """Record how far the job has come: ``value`` a fraction from 0.0 to 1.0, ``message``
        a short text (one line: white space folded, bidirectional controls replaced; cut
        to 200 printable characters). A heartbeat too (the lease's
        evidence of progress for ``renew='progress'`` tasks).

        Durable: written on the job's row, fenced by the lease token, at most once every
        ``PROGRESS_WRITE_SECONDS`` per job (a call in between is a heartbeat only, its value
        kept in ``progress_value``; ``force=True`` writes now). A value held back is written
        when the handler ends (success or failure), so the job keeps its last report. Returns
        whether this call wrote. Raises ``ValueError`` for a value outside 0-1 (or not a number) and
        :class:`LeaseLost` when the fence refuses the write (stop: the job is not yours).
        After ``ctx.transaction()`` committed the job's success nothing is written (the job
        has ended; its row keeps the last report before the commit).
        """
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be a fraction from 0.0 to 1.0, got {value!r}")
        text = None if message is None else one_line_text(str(message), self.PROGRESS_MESSAGE_MAX_CHARS)
        self.heartbeat(value)
        if self._db is None or self._tx.committed:  # committed: the row left 'running' (a trial: LeaseLost)
            return False
        now = time.monotonic()
        if not force and now - self._progress_written_at < self.PROGRESS_WRITE_SECONDS:
            self._progress_pending = (float(value), text)
            return False
        self._progress_written_at = now
        self._progress_pending = None
        return self._write_progress(self._db, float(value), text)

    def flush_progress(self) -> bool:
        """Write the last progress the throttle held back, if any (the worker calls it when
        the handler has ended, before the outcome is written: a job's last report, "step
        6/6", is otherwise lost). One fenced statement, only for a job that has such a
        value; returns whether it wrote. Raises :class:`LeaseLost` as :meth:`progress`."""
        pending, self._progress_pending = self._progress_pending, None
        if pending is None or self._db is None:
            return False
        return self._write_progress(self._db, *pending)

    def _write_progress(self, db: "JobDatabase", value: float, text: str | None) -> bool:
        with db.connection() as c:
            ok, cancel = db.store.record_progress(c, self.job.lease, value, text)
        if not ok:
            raise LeaseLost(job_id=self.job.id, lease_token=self.job.lease_token, operation="progress")
        if cancel:
            self._cancel_seen()
        return True

    def _cancel_seen(self) -> None:
        """An operator asked the job to stop (read by a progress write): set the cancel flag
        in shared memory, where the renewer sets it, so ``check()`` and
        ``cancel_requested`` see it now rather than at the next renewal."""
        if self._table is not None:
            self._table.try_mark_cancel(self._slot, self.job.id, self.job.lease_token)

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

        ``name``: 1-200 printable characters, unique within the job (a name used twice in
        one attempt, a loop's, say, is ``STEP_NAME_REUSED``: put the item in the name, as
        ``f"charge:{item.id}"``). The result (JSON:
        dict, list, str, number, bool, None; at most ``step_result_max_bytes``) is
        recorded against the job, fenced by the lease token; a later attempt gets the
        recorded value, decoded from JSON, without calling ``fn``. Inside
        ``ctx.transaction()`` the record commits with the handler's writes. Raises
        :class:`pgworker.errors.StepError` (permanent: ``STEP_RESULT_INVALID``,
        ``STEP_RESULT_TOO_LARGE``, ``STEP_LIMIT``, ``STEP_NAME_INVALID``,
        ``STEP_NAME_REUSED``), :class:`LeaseLost` when the fence refuses the record, and
        ``RuntimeError`` after ``ctx.transaction()`` committed the job (the step could not
        be recorded: ``fn`` is not called). docs/effects.md."""
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

    def parent_results(self, conn: Any = None) -> dict[int, Any]:
        """What this job's parents (``depends_on``) returned: {parent id: result}, each
        decoded JSON, None for a parent that returned nothing; {} for a job without
        parents. Every parent has succeeded when a child runs; a parent pruned since
        (retention) is missing. One query (``conn``, or the App's pool)."""
        if self._db is None:
            raise RuntimeError("parent_results() needs the App: this context was built without one")
        with self._db.connection(conn) as c:
            results: dict[int, Any] = self._db.store.parent_results(c, self.job.id)
        return results

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.id} task={self.job.task!r} attempt={self.job.attempt}>"
