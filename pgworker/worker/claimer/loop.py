"""The claim loop of one claimer process.

Loop: claim a bounded batch from the pod's queues in turn -> run its jobs one at a time
(:mod:`.executor`) -> write their outcomes in batched, fenced statements
(:mod:`.completer`) -> claim again while claims return rows. When a claim comes back
empty, the claimer takes over a job that waits unstarted in a peer's batch (so no job
claimed by the pod waits behind another while one of its claimers is idle), and only
then sleeps until work is announced (:mod:`pgworker.worker.shm.wakeups`). Wake-ups are
hints: the table is always asked.

The claimer never renews leases itself: the supervisor does, from the slot table in
shared memory (:mod:`pgworker.worker.shm.slots`), so a handler hogging the GIL cannot lose
its lease; the rules are the lease contract's (:mod:`pgworker.worker.lease`).

This module holds the lifecycle (set-up, the loop, the wait for work, shutdown); which
queue and how many jobs to claim is :mod:`.planner`'s, the claim, the run of a batch and
the take-over of a peer's waiting job :mod:`.runner`'s.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Sequence

import psycopg

from ...claim_floors import ClaimFloors
from ...config import Settings
from ...jobs import ClaimedJob
from ...names import dsn_password
from ..shm import layout as s
from ..shm.slots import SlotTable
from ..outcome import RELEASE
from ..lease import LeaseTerms
from ..metrics_setup import pod_metrics
from ..podlimits import PodQueueLimits
from ..shm.wakeups import PodSignals, fence
from .completer import Completer
from .connection import ClaimerConnection
from .due_later import DueLater
from .executor import Executor
from .lease_watch import LeaseWatch, SupervisorSentinel, wait_for_supervisor
from .planner import Planner
from .recycle import recycle_due
from .runner import Runner
from .takeover import PeerJobs

log = logging.getLogger("pgworker.claimer")

class Claimer(Planner, Runner):
    """One claimer process (built and run by :func:`.process.claimer_main` in the child).

    ``table`` is this claimer's slot table; ``peers`` every table of the pod, in claimer
    order (this one included at ``index``); ``signals`` the pod's wake-up state.
    """

    def __init__(self, app: Any, settings: Settings, index: int, table: SlotTable, queues: Sequence[str], *,
                 drain: bool, peers: Sequence[SlotTable] | None = None, signals: PodSignals | None = None,
                 pod_limits: PodQueueLimits | None = None, supervisor_pid: int | None = None) -> None:
        self.app = app
        self.settings = settings
        self.lease_terms = LeaseTerms(settings.lease_seconds, settings.effective_renew_interval)
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
        # queue -> when its claims began to fail (monotonic): /readyz names a run of them,
        # which another queue's claims going through must not hide
        self.claims_failing: dict[str, float] = {}
        self.limited_queues: set[str] = set()    # queues known to have a global limit
        # where each queue's claims start (pgworker.claim_floors), and the queues whose
        # claim epoch to bump before the next claim (a claim of ours failed)
        self.floors = ClaimFloors(settings.claim_floor_reset_seconds)
        self.epoch_bumps: set[str] = set()
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
        # A claimer forked from the pod's fork server has the server for its parent, not
        # the supervisor: multiprocessing's parent process is the supervisor in both start
        # methods, watched through a pipe only the supervisor holds (lease_watch). Polled
        # per job here, and by the lease watch's thread through a sentinel of its own.
        self.supervisor = SupervisorSentinel(self.parent_pid)
        self.pod_limits = pod_limits
        self.metrics: Any = None
        self.db = ClaimerConnection(settings, index, self.should_stop, on_connect_failure=table.claim_health)
        self.executor = Executor(app, table, worker_id=self.worker_id,
                                 error_message_max_chars=settings.error_message_max_chars,
                                 secrets=(dsn_password(settings.dsn),))
        self.completer: Completer | None = None
        # when the retries and snoozes this claimer writes fall due (no NOTIFY announces them)
        self.due_later = DueLater(drain_horizon_seconds=settings.poll_interval_seconds, drain=drain)
        self.peer_jobs = PeerJobs(self.peers, index, self.db, self.store, owner=self.worker_id)

    # -- lifecycle ------------------------------------------------------------------

    def setup(self) -> None:
        if threading.current_thread() is threading.main_thread():  # a claimer run in a thread (tests) has none
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # so does a terminal's hangup
            # SIG_IGN, not a no-op handler: a handler's subprocesses inherit it across exec, so a
            # terminal's Ctrl-C does not kill them mid-job either (docs/reliability.md, Known limits)
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.metrics = pod_metrics(self.app, self.queues, self.settings.metrics_task_label)
        self.executor.effects.metrics = self.metrics
        for q in self.queues:
            self.metrics.set_in_flight(q, 0)
        self.completer = Completer(app=self.app, db=self.db, table=self.table, metrics=self.metrics,
                                   worker_id=self.worker_id, flush_seconds=self.settings.completion_flush_seconds,
                                   error_message_max_chars=self.settings.error_message_max_chars,
                                   index=self.index, on_settled=self._refresh_pod_limits,
                                   due_later=self.due_later)
        self.table.beat(idle=False)
        # a thread of its own process tells the handlers when the supervisor cannot (lease_watch)
        watch = LeaseWatch(self.table, self.lease_terms, SupervisorSentinel(self.parent_pid).gone,
                           lambda v: self.queues[v.queue_index] if 0 <= v.queue_index < len(self.queues) else "?",
                           self.metrics, self.index)
        self.completer.start(lambda: self.executor.running, watch.tick)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def should_stop(self) -> bool:
        if self.stopping or self.table.header.stopping:
            self.stopping = True
        elif self._supervisor_gone():  # stop, leases will expire
            log.error("the supervisor is gone; claimer %s stops", self.index)
            self.stopping = True
        return self.stopping

    def _beat(self) -> None:
        self.table.beat()
        self.metrics.loop_heartbeat()

    def _supervisor_gone(self) -> bool:
        return self.supervisor.gone()

    def run(self) -> int:
        self.setup()
        try:
            while not self.should_stop():
                self.table.beat()
                self.metrics.loop_heartbeat()
                if not self.db.ensure():
                    continue
                if wait_for_supervisor(self.table, self.lease_terms, self.should_stop, self._beat, self.index):
                    continue  # look again: stopping, or the supervisor ticks
                seen = self.signals.generation if self.signals is not None else 0
                round_started = time.monotonic()
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
                # the deadline; an empty bucket with nothing due owes nothing. A retry this
                # claimer wrote that falls due within the poll interval is work left too
                # (due_later: retries end, at max_attempts; a later one waits for the next run).
                self.due_later.pop_due(round_started)  # due before this round: it saw them (or a peer took them)
                if self.drain and self.floors.used():
                    # a round that started from floors may have passed a job another
                    # session locked and released: drained is decided by exact claims
                    self.floors.drop()
                    continue
                if self.drain and not self.retry_at and not self.due_later.holds_drain():
                    self.table.header.drained = 1
                self.wait_for_work(seen)
        finally:
            self.shutdown()
        return 0

    def wait_for_work(self, seen: int) -> None:
        """Sleep until work is announced, unless some was announced since the claim round
        began (``seen``, the generation then): see :mod:`pgworker.worker.shm.wakeups`."""
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

    # -- for tests and tools --------------------------------------------------------

    def ensure_connection(self) -> bool:
        return self.db.ensure(block=False)

    @property
    def conn(self) -> psycopg.Connection | None:
        return self.db.conn
