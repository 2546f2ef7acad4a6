"""The claimer process: claim a bounded batch, run each job, write the outcomes fenced.

Loop: wait for a wake-up from the dispatcher (a NOTIFY, the fallback poll, or a sweep
after a reconnect) -> for each queue in turn, claim up to the free capacity -> run the
jobs one at a time -> write their outcomes in one fenced statement per kind -> claim
again while claims return rows. Wake-ups are hints: the table is always asked.

The claimer never renews leases itself: the dispatcher does, from the slot table in
shared memory (see ``lease.py``), so a handler hogging the GIL cannot lose its lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import psycopg
from psycopg.types.json import set_json_loads

from . import lease as slots_mod
from . import tracing
from .config import Settings
from .context import JobContext
from .db import POOLED, OutageLog, connect
from .errors import (DatabaseUnavailable, InvalidPayload, JobCancelled, LeaseLost, Permanent, Retry,
                     Snooze)
from .podlimits import PodQueueLimits
from .jobs import ClaimedJob, FailRequest, Lease, safe_json_loads
from .names import dsn_password
from .retry import classify
from .tasks import RENEW_ON_PROGRESS, Task

log = logging.getLogger("pgworker.claimer")

# Auto batch sizing: claim about this much work at a time (seconds of handler time),
# so one claimer never hoards work that idle peers could run, and never more than half
# a lease's worth.
BATCH_TARGET_SECONDS = 1.0
INITIAL_BATCH = 10
WAIT_CHECK_SECONDS = 1.0
# How long a queue found empty is skipped while another queue keeps the claimer busy:
# also the longest a job notified on that queue waits behind a busy queue's batches.
EMPTY_QUEUE_RECHECK_SECONDS = 0.25
# An async handler's task is cancelled within this long of a cancellation request
# reaching its slot (the request itself arrives with the next lease renewal).
CANCEL_POLL_SECONDS = 0.1
HANDLER_BEAT_SECONDS = 1.0
# Reconnect backoff cap: the worst-case delay between the database's return and a
# claimer noticing it. Jitter (x0.5-1) spreads a fleet's reconnects after a restart.
RECONNECT_MAX_SECONDS = 10.0
UNKNOWN_TASK = "UNKNOWN_TASK"
WORKER_DIED = "WORKER_DIED"
TIMEOUT = "TIMEOUT"
EXIT_RECYCLE = 0


@dataclass(slots=True)
class PendingOutcome:
    """An attempt's outcome waiting for the batched, fenced write."""

    job: ClaimedJob
    slot: int
    kind: str  # complete | fail | snooze | cancel | release
    outcome: str  # metric outcome before the write decides (retried vs dead for fail)
    run_seconds: float | None
    code: str | None = None
    message: str = ""
    delay: float = 0.0
    permanent: bool = False
    span: Any = None
    decided_at: float = field(default_factory=time.monotonic)
    retries: int = 0  # writes attempted before (a connection failed: the outcome is unknown)


class Claimer:
    """One claimer process. Built and run by :func:`claimer_main` in the child."""

    def __init__(self, app: Any, settings: Settings, index: int, table: slots_mod.SlotTable,
                 queues: Sequence[str], *, drain: bool, pod_limits: PodQueueLimits | None = None,
                 dispatcher_pid: int | None = None) -> None:
        self.app = app
        self.settings = settings
        self.index = index
        self.table = table
        self.queues = list(queues)
        self.queue_index = {q: i for i, q in enumerate(self.queues)}
        self.task_index = {t: i for i, t in enumerate(sorted(app.tasks))}
        self._slot_policies: dict[str, tuple[float, int, int]] = {}
        self.empty_until: dict[str, float] = {}  # queue -> when to ask again (see claim_round)
        self.drain = drain
        self.worker_id = app.worker_id(f"c{index}")
        self.store = app.store
        self.conn: psycopg.Connection | None = None
        self.pending: list[PendingOutcome] = []
        # The connection is shared by the main thread (claims) and the flusher thread
        # (outcomes of finished jobs while the next one runs): one statement sequence at a time.
        self.db_lock = threading.RLock()
        self.pending_lock = threading.Lock()
        self.flusher_stop = threading.Event()
        self.avg_run_seconds: float | None = None
        self.rotation = 0
        self.jobs_done = 0
        self.stopping = False
        self.running_job = False  # a handler runs (the flusher thread then beats for the loop)
        self.batch: dict[int, tuple[ClaimedJob, int]] = {}  # job id -> (job, slot) of the current claim
        # The dispatcher's pid as the dispatcher gave it, not getppid() now: a dispatcher
        # killed while this process was starting would otherwise never be missed (the
        # orphan's parent is already init, and stays so). Found by the chaos soak.
        self.parent_pid = dispatcher_pid or os.getppid()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metrics: Any = None
        self.secrets = (dsn_password(settings.dsn),)
        self._reconnect_delay = 0.5
        self.outage = OutageLog(log, f"claimer {index}", settings.dsn)
        # Queue policies (docs/scheduling.md): queues known to have a global limit (their
        # claims lock the queue row first), when a rate-limited queue's next token is due
        # (monotonic time), and this pod's shared per-queue counts.
        self.limited_queues: set[str] = set()
        self.retry_at: dict[str, float] = {}
        self.pod_limits = pod_limits

    # -- lifecycle ------------------------------------------------------------------

    def setup(self) -> None:
        if threading.current_thread() is threading.main_thread():  # a claimer run in a thread (tests) has none
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the dispatcher decides
            signal.signal(signal.SIGTERM, self._on_sigterm)
        from .metrics import process_metrics

        self.metrics = process_metrics(task_label=self.settings.metrics_task_label)
        tasks_by_queue: dict[str, list[str]] = {}
        for t in self.app.tasks.values():
            tasks_by_queue.setdefault(t.queue, []).append(t.name)
        self.metrics.init_queues(self.queues, tasks_by_queue)
        for q in self.queues:
            self.metrics.set_in_flight(q, 0)
        self.table.header.pid = os.getpid()
        self.table.beat(idle=False)
        threading.Thread(target=self._flusher, name="pgworker-flusher", daemon=True).start()

    def _flusher(self) -> None:
        """Write outcomes that waited longer than the flush interval, so a finished job is
        recorded promptly even while the next job of the batch runs for minutes."""
        interval = self.settings.completion_flush_seconds
        next_beat = 0.0
        while not self.flusher_stop.wait(interval):
            if self.running_job and time.monotonic() >= next_beat:
                # A long handler holds the main loop: beat for it while this process still
                # gets the GIL (a handler holding it in a C call stops the beats, as it should).
                self.metrics.loop_heartbeat()
                next_beat = time.monotonic() + HANDLER_BEAT_SECONDS
            with self.pending_lock:
                due = bool(self.pending) and time.monotonic() - self.pending[0].decided_at >= interval
            if due:
                try:
                    self.flush()
                except Exception:
                    log.exception("claimer %s: writing outcomes failed", self.index)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def should_stop(self) -> bool:
        if self.stopping or self.table.header.stopping:
            self.stopping = True
        elif os.getppid() != self.parent_pid:  # the dispatcher died: stop, leases will expire
            log.error("dispatcher is gone; claimer %s stops", self.index)
            self.stopping = True
        return self.stopping

    def run(self) -> int:
        self.setup()
        try:
            while not self.should_stop():
                self.table.beat()
                self.metrics.loop_heartbeat()
                if not self.ensure_connection():
                    continue
                found = self.claim_round()
                if self.should_stop():
                    break
                if found:
                    if self.recycle_due():
                        break
                    continue
                if found is None:
                    # The claim failed (connection lost, read-only server, a refused
                    # statement): that is not an empty queue, so never report drained on
                    # it. The failure path has already waited its backoff; claim again.
                    continue
                self.flush()
                if self.drain and not self.retry_at:  # a rate-limited queue still owes a claim
                    self.table.header.drained = 1
                self.wait_for_wakeup()
        finally:
            self.shutdown()
        return 0

    def recycle_due(self) -> bool:
        s = self.settings
        if s.max_jobs_per_child and self.jobs_done >= s.max_jobs_per_child:
            log.info("claimer %s ran %s jobs (max %s per child): recycling", self.index,
                     self.jobs_done, s.max_jobs_per_child)
            return True
        if s.max_memory_per_child_bytes and resident_bytes() > s.max_memory_per_child_bytes:
            log.info("claimer %s uses %s bytes (max %s per child): recycling", self.index,
                     resident_bytes(), s.max_memory_per_child_bytes)
            return True
        return False

    def wait_for_wakeup(self) -> None:
        self.table.beat(idle=True)
        try:
            while not self.should_stop():
                if self.table.wake.wait(self._wait_seconds()) or self._retry_due():
                    break
                self.table.beat()
                self.metrics.loop_heartbeat()
        finally:
            self.table.beat(idle=False)
            self.table.header.drained = 0

    def _wait_seconds(self) -> float:
        """Until the next wake-up check: at most WAIT_CHECK_SECONDS, less when a
        rate-limited queue gets its next token sooner."""
        if not self.retry_at:
            return WAIT_CHECK_SECONDS
        return max(0.0, min(WAIT_CHECK_SECONDS, min(self.retry_at.values()) - time.monotonic()))

    def _retry_due(self) -> bool:
        now = time.monotonic()
        return any(t <= now for t in self.retry_at.values())

    def _held(self, queue: str) -> int:
        """Jobs of ``queue`` this claimer holds (its non-empty slots)."""
        qi = self.queue_index.get(queue, -1)
        return sum(1 for v in self.table.held() if v.queue_index == qi)

    def shutdown(self) -> None:
        """Release what never started, write what finished, close."""
        self.flusher_stop.set()
        queued = {p.job.id for p in self.pending}
        for v in self.table.held():
            entry = self.batch.get(v.job_id)
            if v.state == slots_mod.CLAIMED and entry is not None and v.job_id not in queued:
                self._add(PendingOutcome(entry[0], v.index, "release", "released", None))
        for _ in range(3):
            if not self.pending:
                break
            if self.ensure_connection(block=False):
                self.flush()
        if self.loop is not None:
            self.loop.close()
        with self.db_lock:
            if self.conn is not None:
                self.conn.close()

    # -- database -------------------------------------------------------------------

    def ensure_connection(self, block: bool = True) -> bool:
        with self.db_lock:
            if self.conn is not None and not self.conn.closed and not self.conn.broken:
                return True
            return self._connect(block)

    def _connect(self, block: bool) -> bool:
        try:
            conn = connect(self.settings.dsn, application_name=f"pgworker:claimer:{self.index}",
                           prepare=self.settings.prepared_statements)
            # A payload PostgreSQL stores but Python's decoder refuses (nested deeper than
            # its recursion limit) must fail its own job, not every claim of the queue.
            set_json_loads(safe_json_loads, conn)
            self.conn = conn
            if self.settings.synchronous_commit:
                if conn in POOLED:
                    log.warning("claimer %s: synchronous_commit is a session setting, which a transaction "
                                "pooler does not keep: set it on the role instead (ALTER ROLE ... SET "
                                "synchronous_commit = ...) and unset PGWORKER_SYNCHRONOUS_COMMIT", self.index)
                else:
                    self.conn.execute("SELECT set_config('synchronous_commit', %s, false)",
                                      [self.settings.synchronous_commit])
            # the backoff is reset by the first statement that succeeds, not by the connect:
            # a read-only server accepts connections and refuses every claim
            return True
        except (DatabaseUnavailable, psycopg.Error) as exc:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            self.outage.failed(exc, "connect")
            if block:
                self._sleep(self._reconnect_delay * random.uniform(0.5, 1.0))
                self._reconnect_delay = min(RECONNECT_MAX_SECONDS, self._reconnect_delay * 2)
            return False

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.should_stop():
            time.sleep(min(0.2, end - time.monotonic()))

    def _connection_failed(self, exc: BaseException, action: str) -> None:
        self.outage.failed(exc, action)  # logged once per outage, with what to do
        with self.db_lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                except Exception:
                    pass
            self.conn = None
        self._sleep(self._reconnect_delay * random.uniform(0.5, 1.0))
        self._reconnect_delay = min(RECONNECT_MAX_SECONDS, self._reconnect_delay * 2)

    # -- claiming -------------------------------------------------------------------

    def batch_size(self) -> int:
        s = self.settings
        free = self.table.free_count()
        if s.batch_size is not None:
            n = s.batch_size
        elif self.avg_run_seconds is None:
            n = INITIAL_BATCH
        else:
            budget = min(BATCH_TARGET_SECONDS, s.lease_seconds / 2)
            # at least one: jobs longer than the budget are still claimed, one at a time
            # (0 here once stopped this claimer for good after a single slow job)
            n = max(1, int(budget / max(self.avg_run_seconds, 1e-6)))
        return max(0, min(n, s.max_batch_size, free))

    def claim_round(self) -> bool | None:
        """Claim from each queue in turn until one returns jobs; run them. True if any ran,
        False if every queue was asked and gave nothing, None if a claim failed.

        A queue whose claim found nothing is not asked again for
        EMPTY_QUEUE_RECHECK_SECONDS while another queue keeps returning jobs: otherwise
        every batch of a busy queue costs an empty claim on each idle queue (a round trip
        and about a millisecond of server time; half of all claims in a drain of one
        queue, since 'default' is always claimed from). A round that finds nothing asks
        every queue, so the idle and drain decisions stay exact.
        """
        now = time.monotonic()
        skipped: list[str] = []
        for _ in range(len(self.queues)):
            queue = self.queues[self.rotation % len(self.queues)]
            self.rotation += 1
            if self.empty_until.get(queue, 0.0) > now:
                skipped.append(queue)
                continue
            found = self._claim_and_run(queue)
            if found is not False:
                return found
        for queue in skipped:
            found = self._claim_and_run(queue)
            if found is not False:
                return found
        return False

    def _claim_and_run(self, queue: str) -> bool | None:
        """Claim from one queue and run what came: True if jobs ran (or no slot is free),
        False if the queue gave nothing (nothing due, rate limited, or the pod holds its
        share), None when the claim failed."""
        if self.retry_at.get(queue, 0.0) > time.monotonic():
            return False  # rate limited: its next token is not due yet
        limit = self.batch_size()
        if limit <= 0:
            self.flush()
            limit = self.batch_size()
            if limit <= 0:
                return True
        granted = limit
        if self.pod_limits is not None and self.pod_limits.limits(queue):
            granted = self.pod_limits.reserve(self.index, queue, limit, self._held)
            if granted <= 0:
                return False  # this pod already holds its share of the queue
        try:
            jobs = self.claim(queue, granted)
        finally:
            if self.pod_limits is not None:
                self.pod_limits.claimed(self.index, queue, granted, self._held)
        if jobs is None:
            return None
        if jobs:
            self.empty_until.pop(queue, None)
            self.run_batch(jobs)
            return True
        self.empty_until[queue] = time.monotonic() + EMPTY_QUEUE_RECHECK_SECONDS
        return False

    def claim(self, queue: str, limit: int) -> list[ClaimedJob] | None:
        try:
            self.flush()  # outcomes still waiting are written first
            t0 = time.perf_counter()  # the claim's duration, without that flush
            with self.db_lock, tracing.claim_span(queue, self.worker_id) as span:
                if self.conn is None:
                    return None
                t0 = time.perf_counter()  # the claim statement only (its metric's meaning)
                result = self.store.claim_batch(
                    self.conn, queue=queue, limit=limit, owner=self.worker_id,
                    lease_seconds=self.settings.lease_seconds,
                    aging_seconds=self.settings.priority_aging_seconds,
                    limited=queue in self.limited_queues)
                claim_seconds = time.perf_counter() - t0
                jobs = result.jobs
                if span.is_recording():
                    span.set_attribute("messaging.batch.message_count", len(jobs))
        except psycopg.Error as exc:
            # connection lost, read-only server, a pooler's missing prepared statement, a
            # privilege or schema problem: reconnect with backoff, say it once per outage
            self.metrics.claim_error(queue)
            self._connection_failed(exc, "claim")
            return None
        self.outage.ok()
        self._reconnect_delay = 0.5
        # Next time, a queue with a global limit goes straight to the locked claim.
        (self.limited_queues.add if result.limited else self.limited_queues.discard)(queue)
        if result.retry_after_seconds is not None and len(jobs) < limit:
            # The bucket ran dry: claim this queue again when its next token is due, with
            # a little jitter so the pod's claimers do not all ask at the same instant.
            self.retry_at[queue] = time.monotonic() + result.retry_after_seconds * (1.0 + 0.2 * random.random())
        else:
            self.retry_at.pop(queue, None)
        self.metrics.claimed(queue, len(jobs), claim_seconds, (j.wait_seconds for j in jobs))
        qi = self.queue_index.get(queue, 0)
        self.batch = {}
        if jobs:
            # one pass over the slot table, under one lock, for the whole claim
            slots = self.table.put_many([(job.id, job.lease_token, qi, job.attempt, *self._slot_policy(job.task))
                                         for job in jobs])
            self.batch = {job.id: (job, slot) for job, slot in zip(jobs, slots)}
            self.metrics.in_flight(queue, len(jobs))
        return jobs

    def _slot_policy(self, task_name: str) -> tuple[float, int, int]:
        """(hard limit, renew policy, task index) of a task's slots, computed once per task."""
        policy = self._slot_policies.get(task_name)
        if policy is None:
            task = self.app.tasks.get(task_name)
            renew = slots_mod.RENEW_PROGRESS if task and task.renew == RENEW_ON_PROGRESS else slots_mod.RENEW_ALIVE
            policy = (_hard_limit(task, self.settings), renew, self.task_index.get(task_name, -1))
            self._slot_policies[task_name] = policy
        return policy

    # -- running --------------------------------------------------------------------

    def run_batch(self, jobs: list[ClaimedJob]) -> None:
        for job in jobs:
            _, slot = self.batch[job.id]
            if self.should_stop():
                self._add(PendingOutcome(job, slot, "release", "released", None))
                continue
            if not self.table.start(slot, job.id):
                # Its lease was found lost before it started (or the dispatcher took the
                # slot back): never run it; the reaper or the dispatcher recovers it.
                self.metrics.in_flight(job.queue, -1)
                if self.table.flags(slot, job.id)[0]:
                    self.metrics.finished(job.queue, job.task, "lost", None)
                    self.table.count("lost")
                    self.table.clear(slot, job.id)
                continue
            if self.table.flags(slot, job.id)[1]:
                # cancelled while it waited in the batch: never started, recorded cancelled
                outcome = PendingOutcome(job, slot, "cancel", "cancelled", 0.0, code="CANCELLED")
            else:
                outcome = self.run_one(job, slot)
            self.table.set_state(slot, job.id, slots_mod.DONE)
            self._add(outcome)
            self.jobs_done += 1
            self.table.header.jobs_done = self.jobs_done
        self.flush()

    def _add(self, outcome: PendingOutcome) -> None:
        with self.pending_lock:
            self.pending.append(outcome)

    def run_one(self, job: ClaimedJob, slot: int) -> PendingOutcome:
        task: Task | None = self.app.tasks.get(job.task)
        span = tracing.start_process_span(job, self.worker_id)
        if task is None:
            known = ", ".join(sorted(self.app.tasks)) or "none"
            out = PendingOutcome(
                job, slot, "fail", "dead", 0.0, code=UNKNOWN_TASK, permanent=True,
                message=(f"no handler for task {job.task!r} in this worker (registered: {known[:300]}); "
                         f"deploy a worker that has it, then `pgworker dead replay {job.id}`"))
            tracing.record_outcome(span, "dead", LookupError(job.task), UNKNOWN_TASK)
            out.span = span
            span.end()
            return out
        ctx = JobContext(job, self.table, slot)
        token = tracing.attach(span)  # the handler's own spans (and SQL spans) become children
        self.running_job = True
        t0 = time.perf_counter()
        result: Any = None
        error: BaseException | None = None
        try:
            payload = task.decode(job.payload)
            args = (payload, ctx) if task.takes_context else (payload,)
            if task.is_async:
                result = self._run_async(task, args, ctx)
            else:
                result = task.func(*args)
        except BaseException as exc:  # noqa: BLE001 - every handler failure is recorded, even SystemExit
            error = exc
        elapsed = time.perf_counter() - t0
        self.running_job = False
        tracing.detach(token)
        self.avg_run_seconds = elapsed if self.avg_run_seconds is None else 0.8 * self.avg_run_seconds + 0.2 * elapsed
        out = self.decide(job, task, slot, ctx, result, error, elapsed)
        out.span = span
        tracing.record_outcome(span, out.outcome, error, out.code if error is not None else None)
        span.end()
        return out

    def _run_async(self, task: Task, args: tuple[Any, ...], ctx: JobContext) -> Any:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        coro = task.func(*args)
        timeout = task.timeout_seconds
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        try:
            return self.loop.run_until_complete(_cancellable(coro, ctx))
        except asyncio.TimeoutError:
            raise HandlerTimeout(f"handler exceeded its timeout of {timeout} s") from None

    def decide(self, job: ClaimedJob, task: Task, slot: int, ctx: JobContext | None, result: Any,
               error: BaseException | None, elapsed: float) -> PendingOutcome:
        """Turn a handler's return value or exception into the outcome to write."""
        lost, cancel = self.table.flags(slot, job.id)
        if isinstance(result, (Retry, Snooze)):
            error, result = result, None
        if lost or isinstance(error, LeaseLost):
            # the completion is skipped: another worker may own the job now
            log.warning("lease lost on job %s (attempt %s, token %s); its outcome is not written",
                        job.id, job.attempt, job.lease_token,
                        extra={"action": "lease_lost", "job_id": job.id, "queue": job.queue})
            return PendingOutcome(job, slot, "lost", "lost", elapsed)
        if error is None:
            return PendingOutcome(job, slot, "complete", "succeeded", elapsed)
        if isinstance(error, Snooze):
            return PendingOutcome(job, slot, "snooze", "snoozed", elapsed, delay=error.seconds)
        if cancel or isinstance(error, JobCancelled):
            return PendingOutcome(job, slot, "cancel", "cancelled", elapsed, code="CANCELLED")
        s = self.settings
        failure = classify(error, permanent_types=task.permanent_errors, classifier=self.app.classify_error,
                           max_chars=s.error_message_max_chars, secrets=self.secrets)
        if isinstance(error, HandlerTimeout):
            failure = type(failure)(TIMEOUT, failure.message, False)
        if isinstance(error, InvalidPayload):
            failure = type(failure)("PAYLOAD_INVALID", failure.message, True)
        delay = failure.retry_after if failure.retry_after is not None else task.retry.delay(job.attempt)
        dead = failure.permanent or job.attempt >= job.max_attempts
        if not isinstance(error, (Permanent, Retry)):
            log.warning("job %s (%s) attempt %s/%s failed: %s: %s", job.id, job.task, job.attempt,
                        job.max_attempts, failure.code, _one_line(failure.message[:200]),
                        extra={"action": "job_failed", "job_id": job.id, "queue": job.queue})
        return PendingOutcome(job, slot, "fail", "dead" if dead else "retried", elapsed,
                              code=failure.code, message=failure.message, delay=delay,
                              permanent=failure.permanent)

    # -- writing outcomes -----------------------------------------------------------

    def flush(self) -> None:
        """Write pending outcomes: one fenced statement per kind. On a connection error the
        outcomes stay pending and are written after the reconnect (their fences decide)."""
        with self.db_lock:
            with self.pending_lock:
                batch, self.pending = self.pending, []
            if not batch:
                return
            if self.conn is None:
                with self.pending_lock:
                    self.pending[:0] = batch
                return
            held = [(p.slot, p.job.id) for p in batch]
            self.table.set_state_many(held, slots_mod.FLUSHING)
            started = time.time_ns()
            groups: dict[str, list[PendingOutcome]] = {}
            for p in batch:
                groups.setdefault(p.kind, []).append(p)
            try:
                results = self._write(groups)
                accepted = {kind: set(report.accepted) for kind, report in results.items()}
                unsure = [p for p in batch if p.retries and p.kind != "lost"
                          and p.job.id not in accepted[p.kind]]
                if unsure:
                    for job_id in self._confirm(unsure):
                        accepted[next(p.kind for p in unsure if p.job.id == job_id)].add(job_id)
            except psycopg.Error as exc:
                for p in batch:
                    p.retries += 1
                self.table.set_state_many(held, slots_mod.DONE)
                with self.pending_lock:
                    self.pending[:0] = batch
                self._connection_failed(exc, "writing outcomes")
                return
        # Account for the whole flush at once: one pass over the slot table, one update
        # of each shared counter, gauge and histogram per label set.
        outcomes: dict[str, int] = {}
        in_flight: dict[str, int] = {}
        finished: dict[tuple[str, str, str, str | None], list[float | None]] = {}
        settled: dict[tuple[str, str], list[tuple[ClaimedJob, Any]]] = {}
        traced = tracing.enabled()
        for p in batch:
            outcome, op = self._account(p, p.job.id in accepted.get(p.kind, ()), results.get(p.kind), started)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            in_flight[p.job.queue] = in_flight.get(p.job.queue, 0) + 1
            finished.setdefault((p.job.queue, p.job.task, outcome, p.code), []).append(p.run_seconds)
            if traced and op is not None and p.span is not None:
                settled.setdefault((p.job.queue, op), []).append((p.job, p.span))
        for (queue, op), attempts in settled.items():  # accepted writes; refused ones traced in _account
            tracing.settle_spans(queue, op, attempts, worker_id=self.worker_id, start_time=started)
        self.table.clear_many(held)
        for outcome, n in outcomes.items():
            self.table.count(outcome, n)
        for queue, n in in_flight.items():
            self.metrics.in_flight(queue, -n)
        for (queue, task, outcome, code), seconds in finished.items():
            self.metrics.finished_many(queue, task, outcome, seconds, code)
        if self.pod_limits is not None:
            self.pod_limits.refresh(self.index, self._held)

    def _confirm(self, unsure: list[PendingOutcome]) -> set[int]:
        """After a connection failed mid-write, a refused row may be our own earlier write
        that committed before the reply was lost: the same token with the state (and error
        code) this outcome writes proves it. The reaper never writes these codes."""
        rows = {r[0]: r for r in self.store.lease_states(self.conn, [p.job.id for p in unsure])}
        ok = set()
        for p in unsure:
            r = rows.get(p.job.id)
            if r is None or r[2] != p.job.lease_token:
                continue
            state, code = r[1], r[3]
            if (p.kind == "complete" and state == "succeeded") or \
                    (p.kind == "fail" and state in ("pending", "dead") and code == p.code) or \
                    (p.kind == "cancel" and state == "cancelled") or \
                    (p.kind in ("release", "snooze") and state == "pending" and code != "LEASE_EXPIRED"):
                ok.add(p.job.id)
        return ok

    def _write(self, groups: dict[str, list[PendingOutcome]]) -> dict[str, Any]:
        store, conn = self.store, self.conn
        out: dict[str, Any] = {}
        for kind, items in groups.items():
            leases = [p.job.lease for p in items]
            if kind == "complete":
                out[kind] = store.complete(conn, leases, [p.job.ordering_key for p in items])
            elif kind == "fail":
                out[kind] = store.fail(conn, [FailRequest(p.job.lease, p.code or "ERROR", p.message,
                                                          p.delay, p.permanent) for p in items],
                                       [p.job.ordering_key for p in items])
            elif kind == "snooze":
                out[kind] = store.snooze(conn, leases, [p.delay for p in items])
            elif kind == "cancel":
                out[kind] = store.finish_cancelled(conn, leases, [p.job.ordering_key for p in items])
            elif kind == "release":
                out[kind] = store.release(conn, leases)
            # "lost": nothing is written
        return out

    def _account(self, p: PendingOutcome, accepted: bool, report: Any, started_ns: int) -> tuple[str, str | None]:
        """Decide the outcome counted for one written (or refused) attempt; a refused write
        is logged, counted as fenced and traced on its own. Returns (outcome, the settle
        operation when the write was accepted, for the flush's settle span)."""
        job = p.job
        outcome = p.outcome
        if p.kind == "lost":
            return "lost", None
        if not accepted:
            self.metrics.fenced(job.queue, _FENCE_OPERATION[p.kind])
            log.warning("fenced out: %s of job %s (token %s) was refused, the lease was lost",
                        p.kind, job.id, job.lease_token,
                        extra={"action": "fenced", "job_id": job.id, "queue": job.queue})
            tracing.settle_span(job, p.kind, False, parent=p.span, worker_id=self.worker_id,
                                start_time=started_ns)
            return "lost", None
        if p.kind == "fail":
            outcome = "dead" if report.details.get(job.id) == "dead" else "retried"
            if outcome == "dead":  # whatever the cause (last attempt, permanent, unknown task): say it once
                # the task name as repr: a name from a raw INSERT may hold line breaks and escapes
                log.error("job %s (task %r) is dead after attempt %s/%s: %s: %s; see `pgworker jobs show %s`, "
                          "replay with `pgworker dead replay %s`", job.id, job.task, job.attempt,
                          job.max_attempts, p.code, _one_line(p.message[:200]), job.id, job.id,
                          extra={"action": "job_dead", "job_id": job.id, "queue": job.queue})
        return outcome, {"complete": "complete", "fail": "retry" if outcome == "retried" else "fail"}.get(p.kind, p.kind)


def _one_line(text: str) -> str:
    """Text for a log line: line breaks escaped, so an error message cannot forge lines."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


_FENCE_OPERATION = {"complete": "complete", "fail": "fail", "snooze": "snooze", "cancel": "cancel",
                    "release": "release"}


async def _cancellable(coro: Any, ctx: JobContext) -> Any:
    """Run an async handler as a task and cancel it when its job's cancellation is
    requested (``ctx.cancel_requested``, set by the lease renewal). The handler sees
    ``asyncio.CancelledError`` at its current await; if it lets it propagate, the job
    ends cancelled (it may catch it to clean up, and then raise or return)."""
    task = asyncio.ensure_future(coro)
    while True:
        done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_SECONDS)
        if done:
            return task.result()
        if ctx.cancel_requested:
            task.cancel()
            try:
                return await task
            except asyncio.CancelledError:
                raise JobCancelled(f"job {ctx.job_id} was cancelled; its task was cancelled") from None


class HandlerTimeout(Exception):
    """An async handler ran past its task's timeout."""

    pgworker_code = TIMEOUT


def _hard_limit(task: Task | None, settings: Settings) -> float:
    """Seconds after start at which the dispatcher stops the attempt: the task's timeout
    or its max runtime, whichever is first (0 = the worker's max runtime)."""
    limits = [settings.max_runtime_seconds]
    if task is not None:
        if task.max_runtime_seconds is not None:
            limits = [task.max_runtime_seconds]
        if task.timeout_seconds is not None:
            limits.append(task.timeout_seconds)
    return min(limits)


def resident_bytes() -> int:
    """Resident set size of this process (Linux /proc/self/statm), 0 if unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class ClaimerSpec:
    """Everything a claimer process needs, picklable for ``spawn``."""

    app_ref: str
    settings: Settings
    index: int
    table: slots_mod.SlotTable
    queues: tuple[str, ...]
    drain: bool
    log_level: int
    log_format: str
    pod_limits: PodQueueLimits | None = None
    dispatcher_pid: int = 0


def claimer_main(spec: ClaimerSpec) -> None:
    """Entry point of a claimer process (multiprocessing, spawn)."""
    from .loader import load_app
    from .logs import setup_logging

    setup_logging(spec.log_level, spec.log_format)
    # Each claimer sets up its own SDK (spawned processes share no exporter threads).
    provider = tracing.setup_process(spec.settings.tracing, trace_sql=spec.settings.trace_sql)
    app = load_app(spec.app_ref)
    app.configure(spec.settings)
    claimer = Claimer(app, spec.settings, spec.index, spec.table, spec.queues, drain=spec.drain,
                      pod_limits=spec.pod_limits, dispatcher_pid=spec.dispatcher_pid)
    try:
        code = claimer.run()
    finally:
        tracing.flush(provider)
    if code:
        raise SystemExit(code)

