"""The lease contract: when a pod renews a lease, stops renewing it, presumes it lost,
and what an outcome that arrives late may still write.

This docstring is the contract; the functions below are its only implementation, and
the SQL that enforces the database side is in ``pgworker/sql/queries/lease.sql``.

1. **Taking a lease.** A claim (``job_claim``) sets the job running under a new fencing
   token (``lease_token + 1``) with a lease of ``lease_seconds`` from the statement's
   start, by the database clock. The pod records the claim in its slot table with the
   monotonic time *before* the statement was sent (``claimed_at``), so every local
   deadline below falls at or before the database's.

2. **Renewing.** The pod's renewer extends every live lease of the pod in one fenced
   statement every ``renew_interval`` (a third of the lease by default; the settings
   refuse a lease shorter than two intervals). A lease is renewed (:func:`renewable`)
   while all of these hold:

   - the process that holds the job is alive and not stopped (SIGSTOP, a zombie);
   - the lease is not already known lost;
   - the job waits unstarted in a batch (its clocks have not started: waiting is never
     held against it), or its outcome is decided and waits to be written or is being
     written (a split write, one lock wait per outcome, can outlast a lease), or its handler
     runs and, counted from the handler's start, (a) runs for less than its hard limit
     (the task's ``timeout``, else its ``max_runtime``, else the worker's
     ``--max-runtime``) and (b) for a task with ``renew="progress"``, reported progress
     (``ctx.heartbeat()``) within the last lease.

   A renewal is fenced by id, ``state = 'running'``, the token, and an unexpired lease:
   an expired lease is never revived, since the pod has by then told the handler it may
   be lost (rule 3). A renewal that updates no row means the lease is lost: the slot is
   marked ``lost`` at once, logged, and counted (``pgworker_fenced_writes_total`` with
   operation ``renew``). A renewal never waits on a row another session holds locked: that
   lease is skipped (neither renewed nor refused), logged, and tried again; a row locked
   for a whole lease falls under rule 3 like any lease without an accepted renewal.
   The pod's own outcome statement holds its jobs' rows too, so the renewal skips them
   while it runs: its waits are bounded (rule 5). The success statement takes its parents'
   dependents' locks in id order (``job_complete``'s ``children_locked``), so two
   claimers' writes queue instead of deadlocking.

3. **Presuming a lease lost.** When ``lease_seconds`` have passed since the last accepted
   renewal was sent (or since the claim was sent) the lease has expired in the database
   too: the pod marks it ``lost`` (:func:`presumed_lost`), tells the handler
   (``ctx.lease_lost``), logs it and counts it (``pgworker_lease_renewals_total`` with
   result ``lost``). This clock runs on the supervisor's own timer (:class:`LeaseClock`)
   and never waits on the database: a renewer stuck on a stalled connection cannot hide
   a lost lease from the handler, so the duplicate-execution window stays within one
   lease plus one supervisor tick. A job still waiting unstarted when its lease is lost
   is never started; it is released (fenced).

   The claimer applies the same rule to its own slots, on its own timer
   (``claimer/lease_watch.py``), so that a supervisor stopped (SIGSTOP) or killed cannot
   hide a lost lease from a handler either. And once its supervisor is gone (the
   sentinel pipe only the supervisor holds reads EOF) no lease of the claimer will be
   renewed again: the claimer marks every job it still holds unstarted or running
   ``lost`` at once (:func:`orphaned`), its handlers are told as above, and it exits
   after them. A sync handler that never asks (``ctx.check()``, ``ctx.lease_lost``,
   ``ctx.progress()``) cannot be stopped: it runs to its end and its outcome meets the
   fence.

   Before it starts a job that waited in its batch, the claimer checks the job's lease
   by the same clock, with a margin (:func:`start_cutoff`): a job whose last accepted
   renewal (or claim) was sent a lease less :data:`START_MARGIN_SHARE` of a renewal
   interval ago or earlier is marked lost, never started, counted
   (``pgworker_lease_renewals_total`` result ``lost``), logged, and released fenced
   (refused if the reaper has moved it on). A pod that was stopped past its leases
   once started the rest of its batch after SIGCONT, each job seconds past its
   expiry, while another pod ran it again.

4. **Stopping an attempt.** A handler running past its hard limit plus
   ``HARD_LIMIT_GRACE_SECONDS`` is stopped by the supervisor (a sync handler cannot be
   interrupted: its claimer process is killed and the attempt fails ``TIMEOUT``).

5. **Late outcomes.** Every outcome (complete, fail, snooze, cancel, release) is written
   fenced by id, ``state = 'running'`` and the token, whether or not the lease has
   expired: while the row is still running under the same token nobody else can own
   the job (claims take pending jobs only, and the reaper changes the state when it
   recovers an expired lease), so the token alone proves ownership and a late success is
   recorded rather than run again. Once the reaper has moved the job, or another claim
   took it, the write updates no row: it is refused, counted
   (``pgworker_fenced_writes_total``), logged as "fenced out", and the worker does not
   act as the owner. A lease that is ``lost`` (presumed or refused) does not stop the
   write: the fence decides.

   A claimer's outcome write holds its jobs' rows, which the renewer skips, and may wait
   on another session's lock (the dependency trigger locks a parent's children; an
   operator's open transaction may hold one). So each statement of the write waits for
   a lock and runs at most :data:`OUTCOME_STATEMENT_SHARE` of the renewal interval
   (:func:`outcome_bounds`: ``lock_timeout`` and ``statement_timeout`` set for its
   transaction only, never above the session's): a write, its split retry and its
   key promotion together hold a row for less than the renewer's in-pass retries of a
   skipped row (half an interval). A write stopped by these bounds is rolled back, its
   rows renewed as any decided outcome's, and tried again no sooner than one renewal
   interval later, so a renewal pass runs between two tries. The wait for another
   session's lock is then as long as that session holds it, and the lease lasts it out;
   once the lease is lost anyway (the pod stopped) and the job reaped, the late write
   updates no row and is counted fenced, as above.

6. **Committed by the handler.** A handler whose ``ctx.transaction()`` committed its
   job's success has no lease left to keep: from the commit (``SlotTable.mark_committed``)
   its slot is neither renewed nor presumed lost, and a claimer that dies before the
   handler returns is settled with no write (pgworker/effects/transaction.py).

Cancellation rides on renewals: a renewal returns whether an operator asked to cancel
the job; the slot's ``cancel`` flag tells the handler (``ctx.cancel_requested``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .shm import layout as s
from .shm.slots import SlotTable, SlotTableBusy
from .outcome import COMMITTED, WriteBounds

log = logging.getLogger("pgworker.lease")

HARD_LIMIT_GRACE_SECONDS = 2.0
#: The share of the renewal interval each statement of an outcome write may wait and run
#: (rule 5): the write, its split retry and the key promotion stay under half an interval.
OUTCOME_STATEMENT_SHARE = 0.1
#: The share of the renewal interval a waiting job's lease must still have left, by the
#: local clock, for the claimer to start it (rule 3, :func:`start_cutoff`).
START_MARGIN_SHARE = 0.5


@dataclass(frozen=True)
class LeaseTerms:
    """The pod's lease length and renewal interval, both in seconds."""

    lease_seconds: float
    renew_interval_seconds: float

    def __post_init__(self) -> None:
        if self.renew_interval_seconds <= 0 or self.lease_seconds < 2 * self.renew_interval_seconds:
            raise ValueError("a lease must last at least two renewal intervals")


def renewable(terms: LeaseTerms, v: s.SlotView, now: float) -> bool:
    """Rule 2: whether the pod renews this slot's lease now (its process is alive: the
    caller checks that). ``now`` is ``time.monotonic()``."""
    if v.lost or v.state not in s.LIVE_STATES:
        return False
    if v.outcome == COMMITTED:
        return False  # the handler's transaction committed its success: the row is no longer running
    if v.state != s.RUNNING:
        return True  # waiting unstarted, being taken over, decided or being written: clocks not running
    runtime = now - v.started_at
    if v.hard_limit > 0 and runtime > v.hard_limit:
        return False
    if v.renew_policy == s.RENEW_PROGRESS and now - v.progress_at > terms.lease_seconds:
        return False
    return True


def presumed_lost(terms: LeaseTerms, v: s.SlotView, now: float) -> bool:
    """Rule 3: a whole lease has passed since the last accepted renewal (or the claim)
    was sent, so the database's lease has expired. Never for an outcome write in flight
    (its handler is done, and the fence decides the write)."""
    if v.lost or v.state not in s.LIVE_STATES or v.state == s.WRITING or v.outcome == COMMITTED:
        return False
    last = max(v.renewed_at, v.claimed_at)
    return now - last >= terms.lease_seconds


def start_cutoff(terms: LeaseTerms, now: float) -> float:
    """Rule 3, before a start: the monotonic time after which a waiting job's last accepted
    renewal (or its claim) must have been sent for the job to be started at ``now``
    (``time.monotonic()``). A healthy pod renews every interval, so its leases keep more
    than a lease less one interval (and the statement's time) ahead of them; the margin,
    :data:`START_MARGIN_SHARE` of an interval, refuses only a lease that is past or about
    to pass."""
    return now - (terms.lease_seconds - terms.renew_interval_seconds * START_MARGIN_SHARE)


def orphaned(v: s.SlotView) -> bool:
    """Rule 3, the supervisor gone: whether this slot's lease, which nobody will renew
    again, is to be marked lost now (a job waiting unstarted or running; an outcome
    decided or being written, or committed by the handler, has no handler to tell)."""
    return not v.lost and v.state in (s.CLAIMED, s.RUNNING) and v.outcome != COMMITTED


def past_hard_limit(v: s.SlotView, now: float) -> bool:
    """Rule 4: the handler ran past its hard limit and the grace: stop it."""
    return v.state == s.RUNNING and v.hard_limit > 0 and \
        now - v.started_at > v.hard_limit + HARD_LIMIT_GRACE_SECONDS


def outcome_bounds(renew_interval_seconds: float, lock_timeout_seconds: float,
                   statement_timeout_seconds: float) -> WriteBounds:
    """Rule 5: how long each statement of a claimer's outcome write may wait for a lock
    and run, in seconds: :data:`OUTCOME_STATEMENT_SHARE` of the renewal interval, never
    more than the session's own ``lock_timeout`` / ``statement_timeout``."""
    cap = renew_interval_seconds * OUTCOME_STATEMENT_SHARE
    return WriteBounds(min(cap, lock_timeout_seconds), min(cap, statement_timeout_seconds))


def hard_limit(task_timeout: float | None, task_max_runtime: float | None, worker_max_runtime: float) -> float:
    """Seconds after the handler's start at which the attempt is stopped: the task's
    timeout or its max runtime (else the worker's), whichever is first."""
    limits = [task_max_runtime if task_max_runtime is not None else worker_max_runtime]
    if task_timeout is not None:
        limits.append(task_timeout)
    return min(limits)


class LeaseClock:
    """Rule 3 on the supervisor's timer: presume leases lost without waiting on the database.

    ``tables`` returns the pod's slot tables; ``queue_name(view)`` names a slot's queue
    for logs and metrics; ``metrics`` has ``renewals(queue, result, count)``.
    """

    def __init__(self, terms: LeaseTerms, tables: Callable[[], Sequence[SlotTable]],
                 queue_name: Callable[[s.SlotView], str], metrics: Any) -> None:
        self.terms = terms
        self.tables = tables
        self.queue_name = queue_name
        self.metrics = metrics

    def tick(self, now: float | None = None) -> int:
        """Mark every lease presumed lost; returns how many were newly marked."""
        now = time.monotonic() if now is None else now
        marked = 0
        for table in self.tables():
            try:
                views = table.live()
            except SlotTableBusy:
                continue  # its claimer is stopped holding the lock: its leases lapse anyway
            for v in views:
                if presumed_lost(self.terms, v, now) and table.try_mark_lost(v):
                    marked += 1
                    q = self.queue_name(v)
                    self.metrics.renewals(q, "lost", 1)
                    log.warning("lease lost on job %s (token %s): presumed, not renewed for %.1f s "
                                "(lease %.0f s); its handler is told to stop", v.job_id, v.token,
                                now - max(v.renewed_at, v.claimed_at), self.terms.lease_seconds,
                                extra={"action": "lease_lost", "job_id": v.job_id, "queue": q,
                                       "lease_token": v.token})
        return marked
