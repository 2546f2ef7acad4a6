"""The claim loop of one claimer process.

Loop: claim a bounded batch from the pod's queues in turn -> run its jobs one at a time
(:mod:`.executor`) -> write their outcomes in batched, fenced statements
(:mod:`.completer`) -> claim again while claims return rows. When a claim comes back
empty, the claimer takes over a job that waits unstarted in a peer's batch (so no job
claimed by the pod waits behind another while one of its claimers is idle), and only
then sleeps until work is announced (:mod:`pgworker.worker.wakeups`). Wake-ups are
hints: the table is always asked.

The claimer never renews leases itself: the supervisor does, from the slot table in
shared memory (:mod:`pgworker.worker.slots`), so a handler hogging the GIL cannot lose
its lease; the rules are the lease contract's (:mod:`pgworker.worker.lease`).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from typing import Any, Sequence

import psycopg

from ... import tracing
from ...config import Settings
from ...jobs import ClaimedJob
from ...names import dsn_password
from ...tasks import RENEW_ON_PROGRESS
from ..shm import layout as s
from ..shm.slots import SlotTable
from ..lease import hard_limit
from ..outcome import CANCEL, RELEASE, Outcome
from ..metrics_setup import pod_metrics
from ..podlimits import PodQueueLimits
from ..shm.wakeups import PodSignals, fence
from .completer import Completer
from .connection import ClaimerConnection
from .executor import Executor
from .process import recycle_due
from .takeover import PeerJobs

log = logging.getLogger("pgworker.claimer")

# Auto batch sizing: claim about this much work at a time (seconds of handler time),
# and never more than half a lease's worth.
BATCH_TARGET_SECONDS = 1.0
INITIAL_BATCH = 10
WAIT_CHECK_SECONDS = 1.0
# How long a queue found empty is skipped while another queue keeps the claimer busy:
# also the longest a job notified on that queue waits behind a busy queue's batches.
EMPTY_QUEUE_RECHECK_SECONDS = 0.25


class Claimer:
    """One claimer process (built and run by :func:`.process.claimer_main` in the child).

    ``table`` is this claimer's slot table; ``peers`` every table of the pod, in claimer
    order (this one included at ``index``); ``signals`` the pod's wake-up state.
    """

    def __init__(self, app: Any, settings: Settings, index: int, table: SlotTable, queues: Sequence[str], *,
                 drain: bool, peers: Sequence[SlotTable] | None = None, signals: PodSignals | None = None,
                 pod_limits: PodQueueLimits | None = None, supervisor_pid: int | None = None) -> None:
        self.app = app
        self.settings = settings
        self.index = index
        self.table = table
        self.peers = list(peers) if peers is not None else [table]
        self.signals = signals
        self.queues = list(queues)
        self.queue_index = {q: i for i, q in enumerate(self.queues)}
        self.task_index = {t: i for i, t in enumerate(sorted(app.tasks))}
        self._slot_policies: dict[str, tuple[float, int, int]] = {}
        self.empty_until: dict[str, float] = {}  # queue -> when to ask again (see claim_round)
        self.retry_at: dict[str, float] = {}     # rate-limited queue -> when its next token is due
        self.limited_queues: set[str] = set()    # queues known to have a global limit
        self.drain = drain
        self.worker_id = app.worker_id(f"c{index}")
        self.store = app.store
        self.rotation = 0
        self.jobs_done = 0
        self.stopping = False
        self.batch: dict[int, tuple[ClaimedJob, int]] = {}  # job id -> (job, slot) of what this claimer holds
        # The supervisor's pid as it gave it, not getppid() now: a supervisor killed while
        # this process was starting would otherwise never be missed (the orphan's parent
        # is already init, and stays so). Found by the chaos soak.
        self.parent_pid = supervisor_pid or os.getppid()
        self.pod_limits = pod_limits
        self.metrics: Any = None
        self.db = ClaimerConnection(settings, index, self.should_stop)
        self.executor = Executor(app, table, worker_id=self.worker_id,
                                 error_message_max_chars=settings.error_message_max_chars,
                                 secrets=(dsn_password(settings.dsn),))
        self.completer: Completer | None = None
        self.peer_jobs = PeerJobs(self.peers, index, self.db, self.store, owner=self.worker_id)

    # -- lifecycle ------------------------------------------------------------------

    def setup(self) -> None:
        if threading.current_thread() is threading.main_thread():  # a claimer run in a thread (tests) has none
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.metrics = pod_metrics(self.app, self.queues, self.settings.metrics_task_label)
        self.executor.effects.metrics = self.metrics
        for q in self.queues:
            self.metrics.set_in_flight(q, 0)
        self.completer = Completer(app=self.app, db=self.db, table=self.table, metrics=self.metrics,
                                   worker_id=self.worker_id, flush_seconds=self.settings.completion_flush_seconds,
                                   error_message_max_chars=self.settings.error_message_max_chars,
                                   index=self.index, on_settled=self._refresh_pod_limits)
        self.table.beat(idle=False)
        self.completer.start(lambda: self.executor.running)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def should_stop(self) -> bool:
        if self.stopping or self.table.header.stopping:
            self.stopping = True
        elif os.getppid() != self.parent_pid:  # the supervisor died: stop, leases will expire
            log.error("the supervisor is gone; claimer %s stops", self.index)
            self.stopping = True
        return self.stopping

    def run(self) -> int:
        self.setup()
        try:
            while not self.should_stop():
                self.table.beat()
                self.metrics.loop_heartbeat()
                if not self.db.ensure():
                    continue
                seen = self.signals.generation if self.signals is not None else 0
                found = self.claim_round()
                if self.should_stop():
                    break
                if found:
                    if recycle_due(self.settings, self.index, self.jobs_done):
                        break
                    continue
                if found is None:
                    # The claim failed (connection lost, read-only server, a refused
                    # statement): that is not an empty queue, so never report drained on
                    # it. The failure path has already waited its backoff; claim again.
                    continue
                if self.take_over_one():
                    continue
                self.completer.flush()
                # retry_at holds only queues whose due jobs wait for a token (the claim says
                # so only then): that is work left, claimed when the token comes or left at
                # the deadline; an empty bucket with nothing due owes nothing
                if self.drain and not self.retry_at:
                    self.table.header.drained = 1
                self.wait_for_work(seen)
        finally:
            self.shutdown()
        return 0

    def wait_for_work(self, seen: int) -> None:
        """Sleep until work is announced, unless some was announced since the claim round
        began (``seen``, the generation then): see :mod:`pgworker.worker.wakeups`."""
        header = self.table.header
        self.table.beat(idle=True)
        fence()
        try:
            if self.signals is not None and self.signals.generation != seen:
                return
            while not self.should_stop():
                if self.table.wake.wait(self._wait_seconds()) or self._retry_due():
                    break
                self.table.beat()
                self.metrics.loop_heartbeat()
        finally:
            self.table.beat(idle=False)
            header.drained = 0
            hint = header.hint_queue
            if 0 <= hint < len(self.queues):
                self.rotation = hint  # ask the queue whose work woke us first
                self.empty_until.pop(self.queues[hint], None)
            header.hint_queue = -1

    def _wait_seconds(self) -> float:
        """Until the next wake-up check: at most WAIT_CHECK_SECONDS, less when a
        rate-limited queue gets its next token sooner."""
        if not self.retry_at:
            return WAIT_CHECK_SECONDS
        return max(0.0, min(WAIT_CHECK_SECONDS, min(self.retry_at.values()) - time.monotonic()))

    def _retry_due(self) -> bool:
        now = time.monotonic()
        return any(t <= now for t in self.retry_at.values())

    def shutdown(self) -> None:
        """Release what never started, write what finished, close."""
        self.completer.stop()
        queued = {o.job.id for o in self.completer.pending}
        for v in self.table.held():
            entry = self.batch.get(v.job_id)
            if v.state == s.CLAIMED and entry is not None and v.job_id not in queued:
                self._decide_without_running(entry[0], v.index, RELEASE)
        for _ in range(3):
            if not self.completer.pending:
                break
            if self.db.ensure(block=False):
                self.completer.flush(force=True)
        self.executor.close()
        with self.db.lock:
            self.db.close()

    # -- claiming -------------------------------------------------------------------

    def batch_size(self) -> int:
        st = self.settings
        free = self.table.free_count()
        avg = self.executor.avg_run_seconds
        if st.batch_size is not None:
            n = st.batch_size
        elif avg is None:
            n = INITIAL_BATCH
        else:
            budget = min(BATCH_TARGET_SECONDS, st.lease_seconds / 2)
            # at least one: jobs longer than the budget are still claimed, one at a time
            n = max(1, int(budget / max(avg, 1e-6)))
        return max(0, min(n, st.max_batch_size, free))

    def claim_round(self) -> bool | None:
        """Claim from each queue in turn until one returns jobs; run them. True if any ran,
        False if every queue was asked and gave nothing, None if a claim failed.

        A queue whose claim found nothing is not asked again for
        EMPTY_QUEUE_RECHECK_SECONDS while another queue keeps returning jobs: otherwise
        every batch of a busy queue costs an empty claim on each idle queue. A round that
        finds nothing asks every queue, so the idle and drain decisions stay exact.
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
            self.completer.flush()
            limit = self.batch_size()
            if limit <= 0:
                if self.completer.backing_off():  # every slot holds an outcome refused for now: no spin
                    self.db.sleep(self.completer.backing_off())
                    return None
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
        if not jobs:
            self.empty_until[queue] = time.monotonic() + EMPTY_QUEUE_RECHECK_SECONDS
            return False
        self.empty_until.pop(queue, None)
        wanted = len(jobs) - 1 + (1 if len(jobs) >= granted else 0)
        if wanted and self.signals is not None:
            # jobs wait in this batch (an idle peer takes each over), and a full claim
            # means more may be due (an idle peer claims it)
            self.signals.announce(self.peers, self.queue_index.get(queue, -1), exclude=self.index, count=wanted)
            self.metrics.wakeup("claim")
        self.run_batch(jobs)
        return True

    def claim(self, queue: str, limit: int) -> list[ClaimedJob] | None:
        """One claim statement: up to ``limit`` jobs of ``queue``, recorded in the slot
        table; None when the statement failed (after the reconnect backoff)."""
        try:
            self.completer.flush()  # outcomes still waiting are written first
            with self.db.lock, tracing.claim_span(queue, self.worker_id) as span:
                if self.db.conn is None:
                    return None
                sent = time.monotonic()  # the lease's local clock starts before the database's
                t0 = time.perf_counter()
                result = self.store.claim_batch(
                    self.db.conn, queue=queue, limit=limit, owner=self.worker_id,
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
            self.db.failed(exc, "claim")
            return None
        self.db.ok()
        # Next time, a queue with a global limit goes straight to the locked claim.
        (self.limited_queues.add if result.limited else self.limited_queues.discard)(queue)
        if result.retry_after_seconds is not None and len(jobs) < limit:
            # The bucket ran dry: claim this queue again when its next token is due, with
            # a little jitter so the pod's claimers do not all ask at the same instant.
            self.retry_at[queue] = time.monotonic() + result.retry_after_seconds * (1.0 + 0.2 * random.random())
        else:
            self.retry_at.pop(queue, None)
        self.metrics.claimed(queue, len(jobs), claim_seconds, (j.wait_seconds for j in jobs))
        if jobs:
            self._hold(jobs, claimed_at=sent)
        return jobs

    def _hold(self, jobs: list[ClaimedJob], *, claimed_at: float, renewed_at: float = 0.0) -> None:
        """Record jobs in the slot table (one pass, one lock) and in this claimer's batch."""
        expires: dict[Any, float] = {}  # a claim's jobs share one expiry: convert it once
        entries = []
        for job in jobs:
            at = expires.get(job.lease_expires_at)
            if at is None:
                at = expires[job.lease_expires_at] = job.lease_expires_at.timestamp()
            entries.append(s.SlotEntry(job.id, job.lease_token, self.queue_index.get(job.queue, 0), job.attempt,
                                       *self._slot_policy(job.task), at))
        slots = self.table.put_many(entries, claimed_at=claimed_at)
        if renewed_at:
            self.table.renewed([(slot, e.job_id, e.token, e.expires_at, False) for e, slot in zip(entries, slots)],
                               renewed_at)
        per_queue: dict[str, int] = {}
        for job, slot in zip(jobs, slots):
            self.batch[job.id] = (job, slot)
            per_queue[job.queue] = per_queue.get(job.queue, 0) + 1
        for queue, n in per_queue.items():
            self.metrics.in_flight(queue, n)

    def _slot_policy(self, task_name: str) -> tuple[float, int, int]:
        """(hard limit, renew policy, task index) of a task's slots, computed once per task."""
        policy = self._slot_policies.get(task_name)
        if policy is None:
            task = self.app.tasks.get(task_name)
            renew = s.RENEW_PROGRESS if task and task.renew == RENEW_ON_PROGRESS else s.RENEW_ALIVE
            limit = hard_limit(task.timeout_seconds if task else None, task.max_runtime_seconds if task else None,
                               self.settings.max_runtime_seconds)
            policy = (limit, renew, self.task_index.get(task_name, -1))
            self._slot_policies[task_name] = policy
        return policy

    def _held(self, queue: str) -> int:
        """Jobs of ``queue`` this claimer holds (its non-empty slots)."""
        qi = self.queue_index.get(queue, -1)
        return sum(1 for i in self.table.held_queues() if i == qi)

    def _refresh_pod_limits(self) -> None:
        if self.pod_limits is not None:
            self.pod_limits.refresh(self.index, self._held)

    # -- taking over a peer's waiting job ---------------------------------------------

    def take_over_one(self) -> bool:
        """Take over the next job that waits unstarted in a peer's batch, and run it.
        Returns whether one ran."""
        if self.table.free_count() == 0:
            return False
        taken = self.peer_jobs.take()
        if taken is None:
            return False
        job, view, peer = taken
        self._hold([job], claimed_at=view.claimed_at, renewed_at=view.renewed_at)
        # Count the job in this claimer's per-pod share before its old slot empties: the
        # peer's row counts it until then, so the pod's total never dips below what it
        # holds (it did: a peer then found room for a second job of a queue limited to one)
        self._refresh_pod_limits()
        lost, cancel = self.peer_jobs.moved(peer, view)
        if lost or cancel:  # learnt while it waited in the peer's batch: never start it then
            self.table.mark(self.batch[job.id][1], job.id, job.lease_token, lost=lost, cancel=cancel)
        self.run_batch([job])
        return True

    # -- running --------------------------------------------------------------------

    def run_batch(self, jobs: list[ClaimedJob]) -> None:
        traced = tracing.enabled()  # once per batch: with no SDK, no tracing call per job
        table, batch, run, add = self.table, self.batch, self.executor.run, self.completer.add
        for job in jobs:
            slot = batch[job.id][1]
            if self.should_stop():
                self._decide_without_running(job, slot, RELEASE)
                continue
            started = table.start(slot, job.id)
            if started == s.STARTED:
                add(run(job, slot, traced))
                del batch[job.id]
                self.jobs_done += 1
            elif started == s.CANCEL_REQUESTED:
                # cancelled while it waited in the batch: never run, recorded cancelled
                self._decide_without_running(job, slot, CANCEL)
            elif table.state_of(slot, job.id) == s.CLAIMED:
                # its lease was found lost while it waited: never start it; hand it back
                # (the fence decides whether it is still ours to hand back)
                self._decide_without_running(job, slot, RELEASE)
            else:  # a peer of the pod took it over
                batch.pop(job.id, None)
                self.metrics.in_flight(job.queue, -1)
        table.header.jobs_done = self.jobs_done
        self.completer.flush()

    def _decide_without_running(self, job: ClaimedJob, slot: int, kind: int) -> None:
        outcome = Outcome(job, slot, kind, "released" if kind == RELEASE else "cancelled", None,
                          code="CANCELLED" if kind == CANCEL else None)
        decided = self.table.decide(slot, job.id, kind, code=outcome.code or "")
        self.batch.pop(job.id, None)
        if decided:
            self.completer.add(outcome)
        else:  # taken meanwhile (a peer, or the supervisor handing it back): theirs to write
            self.metrics.in_flight(job.queue, -1)

    # -- for tests and tools --------------------------------------------------------

    def ensure_connection(self) -> bool:
        return self.db.ensure(block=False)

    @property
    def conn(self) -> psycopg.Connection | None:
        return self.db.conn
