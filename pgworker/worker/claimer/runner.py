"""The claimer's runner: the claim statement and the recording of what it took, the run
of a batch (one job at a time, :mod:`.executor`; outcomes to :mod:`.completer`), and the
take-over of a job waiting unstarted in a peer's batch (:mod:`.takeover`)."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import psycopg

from ... import tracing
from ...db import describe_failure
from ...jobs import ClaimedJob
from ...tasks import RENEW_ON_PROGRESS
from ..lease import hard_limit, start_cutoff
from ..outcome import CANCEL, RELEASE, Outcome
from ..shm import layout as s
from .state import ClaimerState

log = logging.getLogger("pgworker.lease")

# What /readyz adds to a claim refused for want of a privilege (grants revoked while the
# worker runs: the start's check passed)
_GRANTS_HINT = "; the schema's owner grants what `pgworker sql grants --worker ROLE` lists"


def _privilege(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.InsufficientPrivilege)


class Runner(ClaimerState):
    """The running half of :class:`~.loop.Claimer` (its state lives there)."""

    def claim(self, queue: str, limit: int) -> list[ClaimedJob] | None:
        """One claim statement: up to ``limit`` jobs of ``queue``, recorded in the slot
        table; None when the statement failed (after the reconnect backoff).

        The claim starts each priority's scan from this claimer's floors
        (:mod:`pgworker.claim_floors`); when its horizon shows that a job may have become
        claimable below them and it took nothing, the floors are dropped and the claim
        made again at once, from the start."""
        try:
            self.completer.flush()  # outcomes still waiting are written first
            with self.db.lock, tracing.claim_span(queue, self.worker_id) as span:
                if self.db.conn is None:
                    return None
                if self.epoch_bumps:  # a claim of ours failed: the floors of others may have passed its jobs
                    self.store.claim_backdate(self.db.conn, sorted(self.epoch_bumps))
                    self.epoch_bumps.clear()
                sent = time.monotonic()  # the lease's local clock starts before the database's
                t0 = time.perf_counter()
                result = self.floors.claim(
                    self.store, self.db.conn, queue, limit=limit, owner=self.worker_id,
                    lease_seconds=self.settings.lease_seconds,
                    aging_seconds=self.settings.priority_aging_seconds,
                    limited=queue in self.limited_queues)
                claim_seconds = time.perf_counter() - t0
                jobs = result.jobs
                if span.is_recording():
                    span.set_attribute("messaging.batch.message_count", len(jobs))
        except psycopg.Error as exc:
            # connection lost, read-only server, a pooler's missing prepared statement, a
            # privilege or schema problem: reconnect with backoff, say it once per outage.
            # The failed claim's locks made other claimers skip its jobs: their floors may
            # be past them, so this queue's claim epoch is bumped once connected again.
            self.floors.drop(queue)
            self.epoch_bumps.add(queue)
            self.metrics.claim_error(queue)
            self.claims_failing.setdefault(queue, time.monotonic())
            self.table.claim_health(f"queue {queue!r}: {describe_failure(exc)}"
                                    + (_GRANTS_HINT if _privilege(exc) else ""),
                                    since=min(self.claims_failing.values()))
            self.db.failed(exc, "claim")
            return None
        self.db.ok()
        self.claims_failing.pop(queue, None)
        if not self.claims_failing:  # else another queue's claims still fail: /readyz keeps saying so
            self.table.claim_health(None)
        # Next time, a queue with a global limit goes straight to the locked claim.
        (self.limited_queues.add if result.limited else self.limited_queues.discard)(queue)
        if result.retry_after_seconds is not None and len(jobs) < limit:
            # The bucket ran dry: claim this queue again when its next token is due, with
            # a little jitter so the pod's claimers do not all ask at the same instant.
            self.retry_at[queue] = time.monotonic() + result.retry_after_seconds * (1.0 + 0.2 * random.random())
        else:
            self.retry_at.pop(queue, None)
        self.metrics.claimed(queue, len(jobs), claim_seconds, (j.wait_seconds for j in jobs), jobs)
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
            started = table.start(slot, job.id, start_cutoff(self.lease_terms, time.monotonic()))
            if started == s.STARTED:
                add(run(job, slot, traced))
                del batch[job.id]
                self.jobs_done += 1
            elif started == s.LEASE_EXPIRED:
                self._expired_unstarted(job, slot)
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

    def _expired_unstarted(self, job: ClaimedJob, slot: int) -> None:
        """The job's lease is past or about to pass by this process's clock (the lease
        contract's rule 3: the supervisor was stopped, or its renewals failed, while the
        job waited): never start it, another pod may run it now. Counted and logged as a
        lost lease, and released fenced (refused if the reaper has moved it on)."""
        self.metrics.renewals(job.queue, "lost", 1)
        log.warning("lease lost on job %s (token %s): it expired, or is about to, while the job waited unstarted "
                    "in the batch (lease %.0f s); not started, released", job.id, job.lease_token,
                    self.lease_terms.lease_seconds,
                    extra={"action": "lease_lost", "job_id": job.id, "queue": job.queue,
                           "lease_token": job.lease_token})
        self._decide_without_running(job, slot, RELEASE)

    def _decide_without_running(self, job: ClaimedJob, slot: int, kind: int) -> None:
        outcome = Outcome(job, slot, kind, "released" if kind == RELEASE else "cancelled", None,
                          code="CANCELLED" if kind == CANCEL else None)
        decided = self.table.decide(slot, job.id, kind, code=outcome.code or "")
        self.batch.pop(job.id, None)
        if decided:
            self.completer.add(outcome)
        else:  # taken meanwhile (a peer, or the supervisor handing it back): theirs to write
            self.metrics.in_flight(job.queue, -1)
