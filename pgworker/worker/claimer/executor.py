"""The executor: run one handler, and turn what it returned or raised into an outcome.

Decision order (:meth:`Executor.decide`), with the reasons:

0. A handler whose ``ctx.transaction()`` committed has succeeded, whatever it did
   afterwards (``COMMITTED``: nothing more is written; a later exception is logged).
1. Success wins: the work was done (even if a cancellation arrived meanwhile, or the
   lease was presumed lost; the fence decides whether the success is recorded).
2. A cancellation beats everything else: an operator asked for the job to end, so a
   failure, a retry or a snooze of a job whose cancellation was requested (or that
   raised :class:`pgworker.JobCancelled`) ends it cancelled.
3. A snooze runs the job again later without spending an attempt.
4. A handler that stopped because it was told its lease was lost
   (:class:`pgworker.LeaseLost`) records a failure ``LEASE_LOST`` (the fence decides).
5. Any other exception is classified (:func:`pgworker.retry.classify`): retry after the
   task's backoff (or the delay it asked for), or dead when permanent or its attempts
   are spent.

Every value is bounded here (:mod:`.outcome`), never in the write.

Async handlers run on an event loop kept across jobs, each as a task that is cancelled
when a cancellation request reaches its slot. A ``SystemExit`` or ``KeyboardInterrupt``
raised inside a handler is caught inside its own task and recorded as that job's
failure, and a loop that an exception still escaped is discarded: nothing of one job
can reach another job's outcome.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from typing import Any, Callable, Iterable

from ... import tracing
from ...context import JobContext
from ...errors import InvalidPayload, JobCancelled, LeaseLost, Permanent, Retry, Snooze
from ...jobs import ClaimedJob
from ...names import bounded_text, redact
from ...retry import classify, error_code, safe_message
from ...tasks import Task
from ...effects.connections import EffectResources, HandlerConnections
from ...results import ResultRefused, encode_result
from ..shm.layout import MESSAGE_BYTES
from .tracebacks import escape_line_breaks, handler_traceback, stored_traceback
from ..shm.slots import SlotTable
from ..outcome import (CANCEL, COMMITTED, COMPLETE, FAIL, RESULT_IN_SLOT, RESULT_NOT_IN_SLOT, SNOOZE, TIMEOUT, Outcome,
                      bounded_code, bounded_delay, bounded_message)

log = logging.getLogger("pgworker.claimer")

UNKNOWN_TASK = "UNKNOWN_TASK"
LEASE_LOST = "LEASE_LOST"
# An async handler's task is cancelled within this long of a cancellation request
# reaching its slot (the request itself arrives with the next lease renewal).
CANCEL_POLL_SECONDS = 0.1


#: The registered task names an UNKNOWN_TASK message lists, in characters (the rest counted).
KNOWN_TASKS_CHARS = 160


def unknown_task_message(task: str, registered: Iterable[str]) -> str:
    """The stored error of a job whose task this worker has no handler for: the task, the
    names it has (whole names, up to KNOWN_TASKS_CHARS, then how many more) and what to do.
    The commands to inspect and replay the job are the dead-job log line's (with the
    schema), not repeated here."""
    names = sorted(registered)
    shown: list[str] = []
    for name in names:
        if shown and len(", ".join([*shown, name])) > KNOWN_TASKS_CHARS:
            break
        shown.append(name)
    more = len(names) - len(shown)
    listed = ", ".join(bounded_text(n, KNOWN_TASKS_CHARS) for n in shown) or "none"
    if more:
        listed += f" and {more} more"
    close = difflib.get_close_matches(task, names, n=1, cutoff=0.8) if isinstance(task, str) else []
    if close:
        # most likely a misspelt name enqueued without an App that knows it: replaying
        # would only die again, so the fix is a new job under the right name
        return (f"no handler for task {bounded_text(repr(task), 100)} in this worker (did you mean "
                f"{bounded_text(repr(close[0]), 100)}? then discard this job and enqueue that name; registered: "
                f"{listed}); or deploy a worker that has it, then replay the job")
    return (f"no handler for task {bounded_text(repr(task), 100)} in this worker (registered: {listed}); "
            "deploy a worker that has it, then replay the job")


class HandlerTimeout(Exception):
    """An async handler ran past its task's timeout."""

    pgworker_code = TIMEOUT


class _HandlerExit(Exception):
    """Carries a SystemExit or KeyboardInterrupt out of a handler's task as an ordinary
    exception, so that asyncio never sees it (it would leave the task pending)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(type(exc).__name__)
        self.exc = exc


class Executor:
    """Runs the handlers of one claimer process. ``run(job, slot)`` returns the decided
    :class:`Outcome` and records it in the slot table (for the supervisor, should this
    process die before the write)."""

    def __init__(self, app: Any, table: SlotTable, *, worker_id: str, error_message_max_chars: int,
                 secrets: tuple[str | None, ...] = ()) -> None:
        self.app = app
        self.table = table
        self.worker_id = worker_id
        self.max_chars = error_message_max_chars
        self.secrets = secrets
        self.loop: asyncio.AbstractEventLoop | None = None
        self.running = False  # a handler runs (the completer's thread then beats for the loop)
        # the last handler was stopped by Ctrl-C: a worker records it as that job's failure,
        # testing.drain hands the job back and stops (a test run must end on Ctrl-C)
        self.interrupted = False
        self.avg_run_seconds: float | None = None
        # called before and after each handler, in its thread (a Django worker closes the
        # ORM's connections that broke or outlived CONN_MAX_AGE, as a request's end would);
        # a Permanent it raises after the handler fails an attempt that would have succeeded
        # (the handler left the ORM in a transaction: its writes were rolled back)
        self.around_job: Callable[[], None] | None = None
        # the handlers' own transactions (ctx.transaction()): a connection opened on first use
        self.effects = EffectResources(app.store, app.settings, HandlerConnections(app.settings, worker_id),
                                       worker_id)

    def run(self, job: ClaimedJob, slot: int, traced: bool = True) -> Outcome:
        """Run ``job``'s handler (in slot ``slot``) and decide its outcome. ``traced``:
        whether spans are recorded (``tracing.enabled()``, asked once per batch by the
        caller: with no SDK the tracing calls are skipped altogether)."""
        task: Task | None = self.app.tasks.get(job.task)
        span = tracing.start_process_span(job, self.worker_id) if traced else tracing.INVALID_SPAN
        if task is None:
            out = Outcome(job, slot, FAIL, "dead", 0.0, code=UNKNOWN_TASK, permanent=True,
                          message=unknown_task_message(job.task, self.app.tasks))
            tracing.record_outcome(span, "dead", LookupError(job.task), UNKNOWN_TASK)
            return self._record(out, span)
        ctx = JobContext(job, self.table, slot, self.effects, app=self.app)
        around = self.around_job
        if around is not None:
            _call_quietly(around)
        token = tracing.attach(span) if traced else None  # the handler's own spans become children
        self.running = True
        t0 = time.perf_counter()
        result: Any = None
        error: BaseException | None = None
        try:
            payload = task.decode(job.payload)
            args = (payload, ctx) if task.takes_context else (payload,)
            result = self._run_async(task, args, ctx) if task.is_async else task.func(*args)
        except _HandlerExit as exc:
            error = exc.exc
        except BaseException as exc:  # noqa: BLE001 - every handler failure is recorded, even SystemExit
            error = exc
        elapsed = time.perf_counter() - t0
        self.running = False
        if around is not None:
            error = _call_after(around, error)
        self.interrupted = isinstance(error, KeyboardInterrupt)
        if not ctx.committed:
            _flush_progress(ctx)
        if traced:
            tracing.detach(token)
        avg = self.avg_run_seconds
        self.avg_run_seconds = elapsed if avg is None else 0.8 * avg + 0.2 * elapsed
        out = self.committed(job, slot, result, error, elapsed) if ctx.committed else \
            self.decide(job, task, slot, result, error, elapsed)
        if traced:
            shown = None if out.kind == COMMITTED else error  # a committed attempt succeeded
            tracing.record_outcome(span, out.outcome, shown, out.code if shown is not None else None)
            return self._record(out, span)
        return self._record(out, None)

    def _record(self, out: Outcome, span: Any) -> Outcome:
        if span is not None:
            out.span = span
            span.end()
        code, message = out.code or "", out.message
        if out.kind == COMPLETE and out.result is not None:
            # kept in the slot for the settler, should this process die before the write
            fits = len(out.result.encode("utf-8")) < MESSAGE_BYTES
            code, message = (RESULT_IN_SLOT, out.result) if fits else (RESULT_NOT_IN_SLOT, "")
        self.table.decide(out.slot, out.job.id, out.kind, delay=out.delay, permanent=out.permanent,
                          code=code, message=message)
        return out

    # -- async handlers -----------------------------------------------------------------

    def _run_async(self, task: Task, args: tuple[Any, ...], ctx: JobContext) -> Any:
        if self.loop is None or self.loop.is_closed():
            self.loop = asyncio.new_event_loop()
        coro = _guarded(task.func(*args))
        timeout = task.timeout_seconds
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        try:
            result = self.loop.run_until_complete(_cancellable(coro, ctx))
        except asyncio.TimeoutError:
            raise HandlerTimeout(f"handler exceeded its timeout of {timeout} s") from None
        except BaseException:
            self._discard_loop_if_dirty()
            raise
        if ctx.lease_lost or ctx.cancel_requested:
            # told to stop, it returned anyway: what it left running (a shielded task) must
            # not resume inside the next job
            self._discard_loop_if_dirty()
        return result

    def _discard_loop_if_dirty(self) -> None:
        """A loop with tasks left over (an exception escaped ``run_until_complete``, or a
        handler told to stop returned) would resume them inside the next job: cancel them
        and start the next job on a new loop."""
        loop = self.loop
        if loop is None or not asyncio.all_tasks(loop):
            return
        self.loop = None
        for t in asyncio.all_tasks(loop):
            t.cancel()
        try:
            loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))
        except BaseException:  # noqa: BLE001 - a handler that refuses to end; the loop goes anyway
            log.warning("an async handler did not end when cancelled; its event loop is discarded")
        finally:
            loop.close()

    def close(self) -> None:
        self.effects.close()
        if self.loop is not None and not self.loop.is_closed():
            self.loop.close()

    # -- deciding -------------------------------------------------------------------------

    def committed(self, job: ClaimedJob, slot: int, result: Any, error: BaseException | None,
                  elapsed: float) -> Outcome:
        """The outcome of a handler whose transaction committed the job's success: that
        commit was the outcome; an exception (or a Retry / Snooze) after it changes nothing."""
        after = error if error is not None else result if isinstance(result, (Retry, Snooze)) else None
        if after is not None:
            # the message too (a trial: "boom after commit" was nowhere), redacted and cut
            said = escape_line_breaks(safe_message(after, min(self.max_chars, 500), self.secrets))
            log.warning("job %s: the handler %s after its transaction committed: %s; the job stays succeeded "
                        "(put the work that may fail inside ctx.transaction())", job.id,
                        f"raised {type(after).__name__}" if error is not None else f"returned {type(after).__name__}",
                        said, extra={"action": "error_after_commit", "job_id": job.id, "queue": job.queue})
        elif result is not None:  # the success committed before the handler returned
            log.warning("job %s: the handler returned a value after its transaction committed the job's "
                        "success; it is not stored as the job's result (a job completed in ctx.transaction() "
                        "has none: docs/results.md)", job.id,
                        extra={"action": "result_after_commit", "job_id": job.id, "queue": job.queue})
        return Outcome(job, slot, COMMITTED, "succeeded", elapsed)

    def decide(self, job: ClaimedJob, task: Task, slot: int, result: Any, error: BaseException | None,
               elapsed: float) -> Outcome:
        """Turn a handler's return value or exception into the outcome to write (see the
        module's decision order)."""
        if result is not None and isinstance(result, (Retry, Snooze)):
            error, result = result, None
        if error is None:
            try:
                encoded = encode_result(result, self.app.settings.result_max_bytes)
            except ResultRefused as exc:  # the work may be done: dead and visible, not run again blindly
                log.warning("job %s (%s) attempt %s/%s returned a value that cannot be stored: %s: %s",
                            job.id, job.task, job.attempt, job.max_attempts, exc.code, exc,
                            extra={"action": "job_failed", "job_id": job.id, "queue": job.queue})
                return Outcome(job, slot, FAIL, "dead", elapsed, code=exc.code, permanent=True,
                               message=bounded_message(str(exc), self.max_chars))
            if self.table.flags(slot, job.id)[0]:
                log.warning("job %s: the handler returned after it was told its lease is lost (attempt %s, "
                            "token %s); its success is written only if the fence still accepts it", job.id,
                            job.attempt, job.lease_token,
                            extra={"action": "success_after_lost", "job_id": job.id, "queue": job.queue})
            return Outcome(job, slot, COMPLETE, "succeeded", elapsed, result=encoded)
        lost, cancel = self.table.flags(slot, job.id)
        if cancel or isinstance(error, JobCancelled):
            return Outcome(job, slot, CANCEL, "cancelled", elapsed, code="CANCELLED")
        policy_delay = task.retry.delay(job.attempt)
        if isinstance(error, Snooze):  # a value that is not a number waits the backoff, never 0 s
            delay = bounded_delay(error.seconds, job, "Snooze", policy_delay)
            return Outcome(job, slot, SNOOZE, "snoozed", elapsed, delay=delay)
        if isinstance(error, LeaseLost) or lost:
            # A handler told its lease is lost may stop by raising anything (an async one's
            # CancelledError turned into its own error, which its task's permanent_errors
            # would have made dead): the loss is why it stopped, so it is LEASE_LOST, retried.
            log.warning("job %s stopped: its lease was lost (attempt %s, token %s); the failure is written "
                        "only if the job is still ours", job.id, job.attempt, job.lease_token,
                        extra={"action": "lease_lost", "job_id": job.id, "queue": job.queue})
            said = str(error) if isinstance(error, LeaseLost) else \
                f"its lease was lost, and the handler then raised {type(error).__name__}: {error}"
            return Outcome(job, slot, FAIL, "retried" if job.attempt < job.max_attempts else "dead", elapsed,
                           code=LEASE_LOST, message=bounded_message(redact(said, *self.secrets), self.max_chars),
                           delay=policy_delay)
        failure = classify(error, permanent_types=task.permanent_errors, classifier=self.app.classify_error,
                           max_chars=self.max_chars, secrets=self.secrets)
        code = bounded_code(failure.code, job, error_code(error)[:64])
        permanent = bool(failure.permanent)
        if isinstance(error, HandlerTimeout):
            code, permanent = TIMEOUT, False
        if isinstance(error, InvalidPayload):
            code, permanent = "PAYLOAD_INVALID", True
        message = bounded_message(redact(failure.message if isinstance(failure.message, str) else
                                         repr(failure.message), *self.secrets), self.max_chars)
        delay = policy_delay if failure.retry_after is None else \
            bounded_delay(failure.retry_after, job, "retry delay", policy_delay)
        dead = permanent or job.attempt >= job.max_attempts
        trace = ""
        if not isinstance(error, (Permanent, Retry)):  # a deliberate outcome: its message says it all
            # a timeout's frames are pgworker's own: nothing to show
            trace = "" if isinstance(error, HandlerTimeout) else handler_traceback(error, self.secrets)
            log.warning("job %s (%s) attempt %s/%s failed: %s: %s", job.id, job.task, job.attempt,
                        job.max_attempts, code, escape_line_breaks(message[:200]),
                        extra={"action": "job_failed", "job_id": job.id, "queue": job.queue, "traceback": trace})
        return Outcome(job, slot, FAIL, "dead" if dead else "retried", elapsed, code=code, message=message,
                       delay=delay, permanent=permanent, traceback=stored_traceback(trace))


async def _guarded(coro: Any) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _HandlerExit(exc) from None


async def _cancellable(coro: Any, ctx: JobContext) -> Any:
    """Run an async handler as a task and cancel it when its lease is lost
    (``ctx.lease_lost``: the renewal's fence refused it, or the claimer's lease watch
    presumed it lost) or its job's cancellation is requested (``ctx.cancel_requested``,
    set by the lease renewal). The handler sees ``asyncio.CancelledError`` at its current
    await, as a sync handler's ``ctx.check()`` raises: an attempt whose lease is gone must
    stop before another worker's attempt of the same job runs beside it. If it lets the
    error propagate, the job ends ``LEASE_LOST`` (a failure, which the fence then refuses
    or writes) or cancelled; it may catch it to clean up, and then raise or return."""
    task = asyncio.ensure_future(coro)
    while True:
        done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_SECONDS)
        if done:
            return task.result()
        lost = ctx.lease_lost
        if lost or ctx.cancel_requested:
            task.cancel()
            try:
                return await task
            except asyncio.CancelledError:
                if lost:
                    raise LeaseLost(job_id=ctx.job_id, lease_token=ctx.lease_token, operation="heartbeat") from None
                raise JobCancelled(f"job {ctx.job_id} was cancelled; its task was cancelled") from None


def _call_quietly(hook: Callable[[], None]) -> None:
    """Run an ``around_job`` hook; its failure is logged and never costs the job."""
    try:
        hook()
    except Exception:  # noqa: BLE001 - housekeeping around the handler, not the job's outcome
        log.warning("the hook run around each job failed", exc_info=True)


def _call_after(hook: Callable[[], None], error: BaseException | None) -> BaseException | None:
    """Run an ``around_job`` hook after the handler: the attempt's error, or the
    ``Permanent`` the hook raised when the handler left broken state behind (and raised
    nothing itself: the handler's own error is the more telling one)."""
    try:
        hook()
    except Permanent as exc:
        log.warning("after the handler: %s", exc)
        return error if error is not None else exc
    except Exception:  # noqa: BLE001 - housekeeping around the handler, not the job's outcome
        log.warning("the hook run around each job failed", exc_info=True)
    return error


def _flush_progress(ctx: JobContext) -> None:
    """Write the handler's last progress that the throttle held back (its final "step 6/6").
    A refused write (the lease moved on) or a database error changes nothing: the outcome's
    own write decides the job, and a progress report is never a reason to fail it."""
    try:
        ctx.flush_progress()
    except LeaseLost:
        pass
    except Exception as exc:  # noqa: BLE001 - a database or pool error: the outcome's write still goes
        log.warning("job %s: its last progress report was not written: %s", ctx.job.id, exc,
                    extra={"action": "progress_flush_failed", "job_id": ctx.job.id, "queue": ctx.job.queue})
