"""The completer: a claimer's batched, fenced outcome writes, their confirmation and accounting.

Outcomes wait in a list and are written together, one fenced statement per kind
(:func:`pgworker.worker.outcome.write_outcomes`): before the next claim, at the end of
a batch, and from a small thread when one has waited longer than the flush interval
(a finished job is recorded promptly even while the next job of its batch runs).

What can go wrong with a write, and what happens:

- **The connection is lost** (:func:`pgworker.db.connection_lost`): the outcomes stay
  queued and are written after the reconnect, where the fence decides. A write whose
  reply was lost may have committed: a refused row is then confirmed by re-reading its
  token, state and code (``_confirm``).
- **A statement fails on a live connection.** Never taken for a lost connection. The
  batch is written again one outcome at a time, so one bad row cannot block the others.
  An outcome PostgreSQL refuses for its values (SQLSTATE class 22 or 23) is replaced by
  a failure with code ``OUTCOME_INVALID`` naming the error; one refused for the moment
  (a lock or statement timeout, a read-only server) waits for the next flush. Each
  statement waits and runs a tenth of the renewal interval at most (the lease contract's
  rule 5: the renewer skips the rows a write holds), and a write stopped so is tried
  again no sooner than a renewal interval later, after its leases were renewed.
- **Writes keep failing**: the claimer's slot table says so (``write_health``), which the
  supervisor's /readyz reports, and ``pgworker_outcome_write_errors_total`` counts each
  failure by reason. Outcomes refused for now are tried again after a backoff (the
  runtime's one, 0.5 s doubling to 10 s), not at every turn of the claim loop: a claimer
  whose slots were all full of decided outcomes once made ~700 failed flushes a second
  against a read-only server. The outage is logged once, and once when it ends. A
  read-only server (SQLSTATE 25006) refuses every write, so its batch is not split.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import psycopg

from ... import tracing
from ...db import READ_ONLY_SQLSTATE, OutageLog, connection_lost, describe_failure, sqlstate_class
from ...jobs import ClaimedJob, FenceReport
from ...names import bounded_text, schema_flag
from ..shm import layout as s
from ..shm.slots import SlotTable
from ..lease import outcome_bounds
from ..outcome import (COMMITTED, FAIL, OUTCOME_INVALID, TIMEOUT_SQLSTATES, Outcome, already_written,
                       write_outcomes, written_outcome)
from ..service import Backoff
from .connection import ClaimerConnection
from .due_later import DueLater

log = logging.getLogger("pgworker.claimer")

HANDLER_BEAT_SECONDS = 1.0
INVALID_VALUE_CLASSES = ("22", "23")  # data exception, integrity constraint violation


class Completer:
    """The outcome writes of one claimer process (see the module)."""

    def __init__(self, *, app: Any, db: ClaimerConnection, table: SlotTable, metrics: Any, worker_id: str,
                 flush_seconds: float, error_message_max_chars: int, index: int = 0,
                 on_settled: Callable[[], None] = lambda: None, due_later: DueLater | None = None) -> None:
        self.app = app
        self.store = app.store
        self.db = db
        self.table = table
        self.metrics = metrics
        self.worker_id = worker_id
        self.schema_flag = schema_flag(app.settings.schema)
        self.flush_seconds = flush_seconds
        st = app.settings
        # each statement of a write bounded below the renewal interval (the lease contract's rule 5)
        self.renew_interval = st.effective_renew_interval
        self.bounds = outcome_bounds(self.renew_interval, st.lock_timeout_seconds, st.statement_timeout_seconds)
        self.max_chars = error_message_max_chars
        self.on_settled = on_settled
        # the retries and snoozes written: when they fall due, for the claim loop's wake-ups
        self.due_later = due_later if due_later is not None else DueLater(st.poll_interval_seconds)
        self.pending: list[Outcome] = []
        self.pending_lock = threading.Lock()
        self.stop_event = threading.Event()
        # outcomes refused for now: when to try again, and the outage's one log line
        self.backoff = Backoff()
        self.retry_at = 0.0
        self.refusal: psycopg.Error | None = None
        self.outage = OutageLog(log, f"claimer {index}", app.settings.dsn)

    def add(self, outcome: Outcome) -> None:
        with self.pending_lock:
            self.pending.append(outcome)

    # -- the flusher thread ---------------------------------------------------------------

    def start(self, handler_running: Callable[[], bool], on_tick: Callable[[], Any] = lambda: None) -> None:
        """Start the flusher thread; ``on_tick()`` is called at each of its turns (every
        flush interval), a handler running or not (the claimer's lease watch)."""
        threading.Thread(target=self._flusher, args=(handler_running, on_tick), name="pgworker-flusher",
                         daemon=True).start()

    def _flusher(self, handler_running: Callable[[], bool], on_tick: Callable[[], Any]) -> None:
        next_beat = 0.0
        while not self.stop_event.wait(self.flush_seconds):
            try:
                on_tick()
            except Exception:  # noqa: BLE001 - the thread must go on
                log.exception("watching the leases failed")
            if handler_running() and time.monotonic() >= next_beat:
                # A long handler holds the main loop: beat for it while this process still
                # gets the GIL (a handler holding it in a C call stops the beats, as it should).
                self.metrics.loop_heartbeat()
                next_beat = time.monotonic() + HANDLER_BEAT_SECONDS
            with self.pending_lock:
                due = bool(self.pending) and time.monotonic() - self.pending[0].decided_at >= self.flush_seconds
            if due:
                try:
                    self.flush()
                except Exception:  # noqa: BLE001 - the thread must go on
                    log.exception("writing outcomes failed")

    def stop(self) -> None:
        self.stop_event.set()

    # -- writing --------------------------------------------------------------------------

    def backing_off(self) -> float:
        """Seconds until outcomes refused for now are tried again (0: none waits)."""
        with self.pending_lock:
            waiting = bool(self.pending)
        return max(0.0, self.retry_at - time.monotonic()) if waiting and self.retry_at else 0.0

    def flush(self, *, force: bool = False) -> None:
        """Write every queued outcome (see the module for what happens on failure); while
        refused outcomes wait for their backoff, nothing is tried unless ``force``."""
        if not force and self.retry_at and time.monotonic() < self.retry_at:
            return
        with self.db.lock:
            with self.pending_lock:
                batch, self.pending = self.pending, []
            if not batch:
                return
            conn = self.db.conn
            if conn is None:
                self._requeue(batch)
                return
            held = [(o.slot, o.job.id) for o in batch]
            self.table.set_state_many(held, s.WRITING)
            started = time.time_ns()
            try:
                reports, later = self._write(conn, batch)
                deferred = {o.job.id for o in later}
                accepted = {kind: set(r.accepted) for kind, r in reports.items()}
                unsure = [o for o in batch if o.retries and o.job.id not in deferred
                          and o.job.id not in accepted.get(o.kind, ())]
                confirmed = self._confirm(conn, unsure) if unsure else set()
                done = sum(len(a) for a in accepted.values()) + len(deferred) + len(confirmed)
                db_now = None if done >= len(batch) else self._db_now(conn)
            except psycopg.Error as exc:  # the connection is gone (statement errors are handled inside)
                self.table.set_state_many(held, s.DECIDED)
                self._requeue(batch)
                self._write_failed("connection", describe_failure(exc))
                self.db.failed(exc, "writing outcomes")
                return
        if later:
            self.table.set_state_many([(o.slot, o.job.id) for o in later], s.DECIDED)
            self._requeue(later)
            if self.refusal is not None:
                self.outage.failed(self.refusal, "writing job outcomes")
            pause = self.backoff.next()
            if self.refusal is not None and self.refusal.sqlstate in TIMEOUT_SQLSTATES:
                # stopped by its bounds: let a renewal pass renew these rows before the next try
                pause = max(pause, self.renew_interval)
            self.retry_at = time.monotonic() + pause
        else:
            self.table.write_health(None)
            if self.retry_at:
                self.outage.ok()
                self.backoff.reset()
                self.retry_at = 0.0
        self._account([o for o in batch if o.job.id not in deferred] if deferred else batch, reports, accepted,
                      confirmed, started, db_now)

    def _requeue(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            o.retries += 1
        with self.pending_lock:
            self.pending[:0] = outcomes

    def _write(self, conn: psycopg.Connection, batch: list[Outcome]) -> tuple[dict[int, FenceReport], list[Outcome]]:
        """Write the batch; returns the fence reports by kind and the outcomes to write
        later. Raises psycopg errors only when the connection is lost."""
        self.refusal = None
        try:
            return write_outcomes(self.store, conn, [o.write() for o in batch], bounds=self.bounds), []
        except psycopg.Error as exc:
            if connection_lost(exc, conn):
                raise
            if exc.sqlstate == READ_ONLY_SQLSTATE:  # the server refuses every write: no split
                self.refusal = exc
                self._write_failed("statement", describe_failure(exc))
                return {}, list(batch)
            (log.debug if self.outage.down else log.warning)(
                "an outcome write was refused (%s); writing the batch's %s outcomes one at a time",
                describe_failure(exc), len(batch), extra={"action": "outcome_write_split"})
        reports: dict[int, FenceReport] = {}
        later: list[Outcome] = []
        for o in batch:
            try:
                report = write_outcomes(self.store, conn, [o.write()], bounds=self.bounds)[o.kind]
            except psycopg.Error as exc:
                if connection_lost(exc, conn):
                    raise
                if sqlstate_class(exc) not in INVALID_VALUE_CLASSES:
                    self.refusal = exc
                    self._write_failed("statement", describe_failure(exc))
                    later.append(o)  # refused for now (a timeout, a lock): the next flush tries again
                    continue
                self._write_failed("invalid_value", describe_failure(exc))
                report = self._replace_invalid(conn, o, exc)
                if report is None:
                    continue
            _merge(reports, o.kind, report)
        return reports, later

    def _replace_invalid(self, conn: psycopg.Connection, o: Outcome, exc: psycopg.Error) -> FenceReport | None:
        """The database refused this outcome's values: record a plain failure instead, with
        a code and message that say so. None when even that is refused (the lease then
        expires and the reaper recovers the job)."""
        text = describe_failure(exc)[: self.max_chars]
        log.error("job %s: its outcome (%s) could not be stored: %s; recording a failure %s instead",
                  o.job.id, o.kind_name, text, OUTCOME_INVALID,
                  extra={"action": "outcome_invalid", "job_id": o.job.id, "queue": o.job.queue})
        task = self.app.tasks.get(o.job.task)
        o.kind, o.code, o.permanent = FAIL, OUTCOME_INVALID, False
        o.message = f"the attempt's outcome could not be stored ({text}); recorded as a failure instead"
        o.delay = task.retry.delay(o.job.attempt) if task is not None else 1.0
        try:
            return write_outcomes(self.store, conn, [o.write()], bounds=self.bounds)[FAIL]
        except psycopg.Error as again:
            if connection_lost(again, conn):
                raise
            log.error("job %s: not even a failure could be stored (%s); its lease will expire and the reaper "
                      "will recover it", o.job.id, describe_failure(again), extra={"action": "outcome_invalid"})
            return None

    def _confirm(self, conn: psycopg.Connection, unsure: list[Outcome]) -> set[int]:
        """After a connection failed mid-write, the refused rows that are our own earlier
        write, committed before the reply was lost (the shared rule: already_written)."""
        return already_written(self.store, conn, [o.write() for o in unsure])

    def _db_now(self, conn: psycopg.Connection) -> float | None:
        """The database clock (Unix seconds), read when a write of the batch was refused,
        to measure how long its attempt ran past its lease."""
        try:
            return self.store.db_now(conn).timestamp()
        except psycopg.Error as exc:
            if connection_lost(exc, conn):
                raise
            return None

    def _write_failed(self, reason: str, text: str) -> None:
        self.metrics.outcome_write_error(reason)
        self.table.write_health(f"{reason}: {text}")

    # -- accounting ---------------------------------------------------------------------

    def _account(self, written: list[Outcome], reports: dict[int, FenceReport], accepted_ids: dict[int, set[int]],
                 confirmed: set[int], started_ns: int, db_now: float | None = None) -> None:
        """Count a flush at once: one pass over the slot table, one update of each shared
        counter, gauge and histogram per label set."""
        outcomes: dict[str, int] = {}
        in_flight: dict[str, int] = {}
        finished: dict[tuple[str, str, str, str | None], list[float | None]] = {}
        settled: dict[tuple[str, str], list[tuple[ClaimedJob, Any]]] = {}
        traced = tracing.enabled()
        for o in written:
            accepted = o.job.id in accepted_ids.get(o.kind, ()) or o.job.id in confirmed
            report = reports.get(o.kind)
            outcome = written_outcome(o.kind, report.details.get(o.job.id) if report else None) if accepted else "lost"
            if accepted:
                if outcome == "dead":
                    _log_dead(o, self.schema_flag)
                elif outcome in ("retried", "snoozed"):
                    self.due_later.add(o.delay, retry=outcome == "retried")
                if traced and o.span is not None and o.kind != COMMITTED:  # traced by its transaction
                    op = {"complete": "complete", "fail": "retry" if outcome == "retried" else "fail"}.get(
                        o.kind_name, o.kind_name)
                    settled.setdefault((o.job.queue, op), []).append((o.job, o.span))
            else:
                self._fenced(o, started_ns, db_now)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            in_flight[o.job.queue] = in_flight.get(o.job.queue, 0) + 1
            finished.setdefault((o.job.queue, o.job.task, outcome, o.code), []).append(o.run_seconds)
        for (queue, op), attempts in settled.items():
            tracing.settle_spans(queue, op, attempts, worker_id=self.worker_id, start_time=started_ns)
        self.table.empty_jobs([(o.slot, o.job.id) for o in written])
        for outcome, n in outcomes.items():
            self.table.count(outcome, n)
        for queue, n in in_flight.items():
            self.metrics.in_flight(queue, -n)
        for (queue, task, outcome, code), seconds in finished.items():
            self.metrics.finished_many(queue, task, outcome, seconds, code)
        self.on_settled()

    def _fenced(self, o: Outcome, started_ns: int, db_now: float | None) -> None:
        """A write the fence refused: the lease was lost. Count it, measure how long the
        attempt ran past its lease's expiry (the duplicate-execution window: another worker
        may have run the job meanwhile), log and trace it."""
        self.metrics.fenced(o.job.queue, o.kind_name)
        expires_at = self.table.expiry(o.slot, o.job.id)
        overrun = max(0.0, db_now - expires_at) if db_now is not None and expires_at else None
        if overrun is not None:
            self.metrics.lease_overrun(o.job.queue, overrun)
        log.warning("fenced out: %s of job %s (token %s) was refused, the lease was lost%s",
                    o.kind_name, o.job.id, o.job.lease_token,
                    "" if overrun is None else f"; the attempt ran {overrun:.2f} s past its lease's expiry",
                    extra={"action": "fenced", "job_id": o.job.id, "queue": o.job.queue,
                           "lease_token": o.job.lease_token})
        tracing.settle_span(o.job, o.kind_name, False, parent=o.span, worker_id=self.worker_id,
                            start_time=started_ns, overrun_seconds=overrun)


def _merge(reports: dict[int, FenceReport], kind: int, report: FenceReport) -> None:
    old = reports.get(kind)
    if old is None:
        reports[kind] = report
        return
    reports[kind] = FenceReport(report.operation, old.accepted + report.accepted, old.refused + report.refused,
                                {**old.details, **report.details})


#: The most of a dead job's message its log line quotes: pgworker's own fit whole (an
#: UNKNOWN_TASK's; an EFFECT_UNCERTAIN's with its two commands, which 400 cut).
DEAD_LOG_MESSAGE_CHARS = 800


def _log_dead(o: Outcome, schema_flag: str) -> None:
    """Whatever the cause (last attempt, permanent, unknown task): say it once, with the
    commands to inspect and replay, ``--schema`` included when it is not the default
    (the task name as repr: a name from a raw INSERT may hold line breaks and escapes).
    A long message is cut with a visible '…' (the whole one is in `jobs show`)."""
    message = bounded_text(o.message.replace("\r", "\\r").replace("\n", "\\n"), DEAD_LOG_MESSAGE_CHARS)
    log.error("job %s (task %r) is dead after attempt %s/%s: %s: %s; see `pgworker jobs show %s%s`, "
              "replay with `pgworker dead replay %s%s`", o.job.id, o.job.task, o.job.attempt,
              o.job.max_attempts, o.code, message, o.job.id, schema_flag, o.job.id, schema_flag,
              extra={"action": "job_dead", "job_id": o.job.id, "queue": o.job.queue})

