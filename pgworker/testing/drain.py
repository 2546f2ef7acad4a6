"""``drain``: run an App's due jobs inline, in the test's own process, until none is due.

Every step is the worker's own code, not a copy of its rules:

- the claim is the store's claim statement (``Store.claim_batch``, queue policies and
  priorities included), on a connection opened as a claimer opens its own
  (:class:`pgworker.worker.claimer.connection.ClaimerConnection`);
- the handler runs, and its outcome is decided, in the claimer's
  :class:`~pgworker.worker.claimer.executor.Executor` with a one-slot
  :class:`~pgworker.worker.shm.slots.SlotTable`;
- the outcome is written with the fenced writes
  (:func:`pgworker.worker.outcome.write_outcomes`), and counted as the claimer counts
  it (:func:`~pgworker.worker.outcome.written_outcome`).

What a drain leaves out, because nothing runs beside the test: no lease renewal (a
lease only matters to a reaper, and none runs; so ``ctx.lease_lost`` and
``ctx.cancel_requested``, which renewals bring, stay False, though a cancellation
requested while a handler runs still ends the job cancelled when its outcome is
written, as on a worker), no hard limits (an async handler's
``timeout`` still applies, inside the executor; a sync handler's does not, since the
worker enforces it by replacing the claimer process), no periodic jobs, no NOTIFY
wake-ups (the drain simply claims again).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import psycopg

from ..errors import ConfigError, DatabaseUnavailable
from ..jobs import ClaimedJob
from ..names import check_queue_name, dsn_password
from ..worker.claimer.connection import ClaimerConnection
from ..worker.claimer.executor import Executor
from ..worker.outcome import RELEASE, Outcome, Write, write_outcomes, written_outcome
from ..worker.shm.layout import RENEW_ALIVE, SlotEntry
from ..worker.shm.slots import SlotTable
from .rows import JobRow, fetch_jobs

# Enough for any test that means to stop; small enough that a job enqueueing itself
# forever fails within seconds.
DEFAULT_MAX_JOBS = 1000
OUTCOMES = ("succeeded", "retried", "dead", "cancelled", "snoozed", "lost")


class DrainLimitExceeded(AssertionError):
    """The drain ran ``max_jobs`` attempts and jobs were still due: most likely a handler
    that enqueues work every time it runs, or a job that keeps retrying or snoozing under
    ``skip_backoff``. ``result`` is the :class:`DrainResult` so far."""

    def __init__(self, message: str, result: "DrainResult") -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class DrainedAttempt:
    """One attempt the drain ran, in the order it ran.

    ``outcome``: succeeded, retried, dead, cancelled, snoozed, or lost (the fence refused
    the write: something else settled or took the job meanwhile). ``code`` and
    ``message``: the recorded error (None and '' on success). ``delay_seconds``: the
    backoff or snooze the outcome asked for, before any ``skip_backoff``.
    ``run_seconds``: the handler's wall-clock time.
    """

    job_id: int
    task: str
    queue: str
    attempt: int
    outcome: str
    state: str | None
    code: str | None
    message: str
    delay_seconds: float
    run_seconds: float | None


@dataclass
class DrainResult:
    """What :func:`drain` did.

    ``attempts``: every attempt, in order. ``jobs``: the final row of every job that ran,
    by id, read after the drain (:class:`~pgworker.testing.rows.JobRow`: state,
    attempts, ``last_error_code``, ``errors`` history, ...). ``not_run``: ids of jobs
    claimed and handed back unrun, pending again (with ``with_recursion=False``, those
    enqueued during the drain; past ``max_jobs``, the one that was still due).
    ``counts``, and the properties ``succeeded``, ``retried``, ``dead``, ``cancelled``,
    ``snoozed`` and ``lost``: attempts by outcome.
    """

    attempts: list[DrainedAttempt] = field(default_factory=list)
    jobs: dict[int, JobRow] = field(default_factory=dict)
    not_run: list[int] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(a.outcome for a in self.attempts)
        return {o: c.get(o, 0) for o in OUTCOMES}

    @property
    def succeeded(self) -> int:
        return self.counts["succeeded"]

    @property
    def retried(self) -> int:
        return self.counts["retried"]

    @property
    def dead(self) -> int:
        return self.counts["dead"]

    @property
    def cancelled(self) -> int:
        return self.counts["cancelled"]

    @property
    def snoozed(self) -> int:
        return self.counts["snoozed"]

    @property
    def lost(self) -> int:
        return self.counts["lost"]

    def error_codes(self) -> dict[int, list[str]]:
        """{job id: the error code of each failed attempt, in order} for jobs that failed."""
        out: dict[int, list[str]] = {}
        for a in self.attempts:
            if a.code is not None:
                out.setdefault(a.job_id, []).append(a.code)
        return out

    def __str__(self) -> str:
        ran = ", ".join(f"{n} {o}" for o, n in self.counts.items() if n) or "nothing"
        lines = [f"drain ran {len(self.attempts)} attempt(s): {ran}"]
        for a in self.attempts:
            error = f" {a.code}: {a.message[:120]}" if a.code else ""
            lines.append(f"  job {a.job_id} {a.task!r} attempt {a.attempt}: {a.outcome}{error}")
        return "\n".join(lines)


def drain(app: Any, queues: "str | Sequence[str] | None" = None, *, skip_backoff: bool = False,
          with_recursion: bool = True, max_jobs: int = DEFAULT_MAX_JOBS) -> DrainResult:
    """Run every due job of ``app`` in this process, one at a time, until none is due.

    ``app``: a migrated :class:`pgworker.App` with the handlers (see
    :func:`pgworker.testing.bind` to point your own App at a test schema). ``queues``:
    one name or several, default ``app.queues()`` (the configured queues, else those of
    its tasks and 'default'); they are claimed in turn, one job per claim, as on a
    worker with ``--concurrency 1 --batch-size 1``: within a queue, jobs run in claim
    order (priority, then due time), jobs enqueued by handlers included. Queue pauses
    and limits apply as on a worker (a rate-limited queue can end the drain early).

    ``skip_backoff``: False (default) leaves a retried or snoozed job scheduled for its
    backoff or snooze delay, as a worker would, and the drain ends when nothing is due.
    True makes it due at once, so the drain runs it again (until it succeeds or is dead):
    right after the fenced write, one ``UPDATE`` of that row's run_at to the clock (as a
    retry's, under its queue's claim lock: migration 0013) in the app's schema, only while
    it is still pending under the same lease token (statement ``testing_run_now``,
    pgworker/sql/queries/testing.sql).

    ``with_recursion``: True (default) also runs jobs enqueued while the drain runs (by
    handlers). False hands them back unrun: claimed, then released at the end without
    spending an attempt (listed in ``result.not_run``), for
    :func:`~pgworker.testing.assert_enqueued`. "Enqueued while the drain runs" means an id
    above every id in the table when the drain started.

    ``max_jobs``: the most attempts to run. When that many ran and a job is still due,
    raises :class:`DrainLimitExceeded` (an ``AssertionError``) naming the tasks that ran
    most. Jobs claimed and not run are released before any exception leaves the drain.

    Returns a :class:`DrainResult`. Handlers' exceptions never escape: they become the
    job's outcome, as on a worker (read ``result.attempts`` or ``result.jobs``); only a
    ``KeyboardInterrupt`` (Ctrl-C) does, after the job it stopped is handed back unspent. Raises
    ``ValueError`` (:class:`pgworker.ConfigError`) for bad arguments,
    :class:`pgworker.SchemaNotMigrated` for a schema that is not migrated,
    :class:`pgworker.DatabaseUnavailable` when PostgreSQL cannot be reached, and
    ``RuntimeError`` when called inside a running event loop while the App has async
    tasks: they run on the executor's own loop, which cannot start inside another (in
    an async test, ``await asyncio.to_thread(drain, app)``).
    """
    names = _queue_names(app, queues)
    _check_no_running_loop(app)
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
        raise ConfigError(f"max_jobs must be an integer >= 1 (the most attempts the drain runs), got {max_jobs!r}")
    app.check_schema()  # a clear SchemaNotMigrated / DatabaseUnavailable before anything runs
    result = DrainResult()
    try:
        _run(app, names, result, skip_backoff=skip_backoff, with_recursion=with_recursion, max_jobs=max_jobs)
    except DrainLimitExceeded:
        result.jobs = _final_rows(app, result)  # for the test's report
        raise
    result.jobs = _final_rows(app, result)
    return result


def _run(app: Any, queues: list[str], result: DrainResult, *, skip_backoff: bool, with_recursion: bool,
         max_jobs: int) -> None:
    """The drain's loop: claim one job, run it or hold it back, until a round finds none."""
    held: list[ClaimedJob] = []  # claimed, not to be run: released at the end
    with _claimer_session(app) as (conn, executor, table):
        try:
            first_new_id = None if with_recursion else _next_job_id(app, conn)
            owner, rotation = app.worker_id("drain"), 0
            while True:
                job, rotation = _claim_next(app, conn, queues, rotation, owner)
                if job is None:
                    return
                if first_new_id is not None and job.id >= first_new_id:
                    held.append(job)  # enqueued during the drain: left for assert_enqueued
                    continue
                if len(result.attempts) >= max_jobs:
                    held.append(job)  # due work remains past the limit: hand it back, then say so
                    raise DrainLimitExceeded(_limit_message(result, max_jobs, queues), result)
                result.attempts.append(_run_one(app, conn, executor, table, job, skip_backoff))
        finally:
            if held:  # back to pending, the attempt given back (the release statement)
                write_outcomes(app.store, conn, [Write(j.lease, RELEASE, j.ordering_key) for j in held])
            result.not_run = [j.id for j in held]


def _final_rows(app: Any, result: DrainResult) -> dict[int, JobRow]:
    ran = sorted({a.job_id for a in result.attempts})
    if not ran:
        return {}
    with app.connection() as c:
        return {row.id: row for row in fetch_jobs(app.store, c, ids=ran)}


@contextlib.contextmanager
def _claimer_session(app: Any) -> Iterator[tuple[psycopg.Connection, Executor, SlotTable]]:
    """A claimer's connection, executor and slot table, for this drain only."""
    settings = app.settings
    db = ClaimerConnection(settings, 0, lambda: False)
    if not db.ensure(block=False):
        raise DatabaseUnavailable("the drain could not open its connection to PostgreSQL (the error is logged "
                                  "above); check the App's DSN and that the server is running")
    table = SlotTable(1, multiprocessing.get_context("spawn"))
    executor = Executor(app, table, worker_id=app.worker_id("drain"),
                        error_message_max_chars=settings.error_message_max_chars,
                        secrets=(dsn_password(settings.dsn),))
    try:
        assert db.conn is not None
        yield db.conn, executor, table
    finally:
        executor.close()
        db.close()


def _queue_names(app: Any, queues: "str | Sequence[str] | None") -> list[str]:
    if queues is None:
        names = list(app.queues())
    elif isinstance(queues, str):
        names = [queues]
    else:
        names = list(queues)
    if not names:
        raise ConfigError("queues is empty: give a queue name, a list of them, or None for the app's queues")
    for q in names:
        check_queue_name(q)
    return names


def _check_no_running_loop(app: Any) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # none: the usual case
    async_tasks = sorted(t.name for t in app.tasks.values() if t.is_async)
    if async_tasks:
        raise RuntimeError(f"drain() was called inside a running event loop, where the async handlers of "
                           f"{', '.join(map(repr, async_tasks))} cannot run (the executor runs them on a loop of "
                           f"its own); call it from a thread: `await asyncio.to_thread(drain, app)`")


def _next_job_id(app: Any, conn: psycopg.Connection) -> int:
    return conn.execute(app.store.queries["testing_next_job_id"]).fetchone()[0]


def _claim_next(app: Any, conn: psycopg.Connection, queues: list[str], rotation: int,
                owner: str) -> tuple[ClaimedJob | None, int]:
    """Claim one due job, asking the queues in turn from ``rotation``; (None, _) when a
    whole round found nothing."""
    s = app.settings
    for _ in range(len(queues)):
        queue = queues[rotation % len(queues)]
        rotation += 1
        claimed = app.store.claim_batch(conn, queue=queue, limit=1, owner=owner,
                                        lease_seconds=s.lease_seconds, aging_seconds=s.priority_aging_seconds)
        if claimed.jobs:
            return claimed.jobs[0], rotation
    return None, rotation


def _run_one(app: Any, conn: psycopg.Connection, executor: Executor, table: SlotTable, job: ClaimedJob,
             skip_backoff: bool) -> DrainedAttempt:
    """Run one claimed job in the executor and write its outcome, fenced."""
    # The slot is what the handler's ctx reads (lease_lost, cancel_requested) and where
    # the executor records its decision; nothing renews it here.
    [slot] = table.put_many([SlotEntry(job.id, job.lease_token, 0, job.attempt, 0.0, RENEW_ALIVE)],
                            claimed_at=time.monotonic())
    try:
        table.start(slot, job.id)
        out: Outcome = executor.run(job, slot)
        if executor.interrupted:  # Ctrl-C in the handler: the job back to pending, unspent; the test run stops
            write_outcomes(app.store, conn, [Write(job.lease, RELEASE, job.ordering_key)])
            raise KeyboardInterrupt
        report = write_outcomes(app.store, conn, [out.write()])[out.kind]
    finally:
        table.empty_job(slot, job.id)
    accepted = job.id in report.accepted
    state = report.details.get(job.id) if accepted else None
    outcome = written_outcome(out.kind, state) if accepted else "lost"
    if outcome in ("succeeded", "cancelled"):  # these statements report no state: it is the outcome
        state = outcome
    if skip_backoff and outcome in ("retried", "snoozed"):
        conn.execute(app.store.queries["testing_run_now"], {"id": job.id, "token": job.lease_token})
    return DrainedAttempt(job.id, job.task, job.queue, job.attempt, outcome, state, out.code, out.message,
                          out.delay, out.run_seconds)


def _limit_message(result: DrainResult, max_jobs: int, queues: list[str]) -> str:
    busiest = Counter(a.task for a in result.attempts).most_common(3)
    tasks = ", ".join(f"{task!r} {n}x" for task, n in busiest)
    return (f"drain ran max_jobs={max_jobs} attempts and jobs of queues {queues} were still due "
            f"(attempts by task: {tasks}). A handler that enqueues a job every time it runs, or a job "
            f"that always retries or snoozes with skip_backoff=True, keeps the queue from emptying; "
            f"fix that, or pass a larger max_jobs= if the work really is that large.")
